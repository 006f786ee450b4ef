/* synth_model.h - small synthetic Llama models in memory for the tensor
 * parallel and emulated-device tests (test_tp.c, test_devemu.c): f32
 * weights drawn uniformly from [-scale, scale] by a seeded xorshift, laid
 * out with model_int.h's structures, 2 layers, vocabulary 97, context 128.
 *
 * The generator's state (synth_rs) is the tests' own random source too:
 * synth_init_shape() seeds it, and a test that draws token ids after it
 * continues the same sequence, so each test's inputs are reproducible.
 *
 * Thread: tests only, one thread.
 */
#ifndef TESTS_CUDA_SYNTH_MODEL_H
#define TESTS_CUDA_SYNTH_MODEL_H

#include <stdint.h>

#include "model/model_int.h"

typedef struct synth {
    mdl_model_t m;
    float *buf; /* every weight, one allocation */
} synth_t;

extern uint64_t synth_rs; /* the xorshift state; tests may reseed it */

/* The next 32 random bits of synth_rs. */
uint32_t synth_rnd(void);

/* s = a model with n_heads query heads, n_kv KV heads of head_dim, hidden
 * dim, FFN ffn_dim, QKV biases when bias; reseeds synth_rs with seed first.
 * Free with synth_fini(). */
void synth_init_shape(synth_t *s, int32_t n_heads, int32_t n_kv, int bias, int32_t head_dim,
                      int32_t dim, int32_t ffn_dim, uint64_t seed);
void synth_fini(synth_t *s);

#endif /* TESTS_CUDA_SYNTH_MODEL_H */
