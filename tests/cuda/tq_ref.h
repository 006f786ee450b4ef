/* tq_ref.h - the CPU store with a tq3 / tq4 layout (kernels/cpu/kv_quant.h)
 * behind a plain interface, for test_emu_tq.c: that file includes the CUDA
 * bodies, whose static 16-bit converters clash with kv_quant.h's (as
 * kvq_ref.h does for the KIVI formats).
 *
 * Thread: one test thread.
 */
#ifndef TESTS_CUDA_TQ_REF_H
#define TESTS_CUDA_TQ_REF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn_cpu.h"

typedef struct tq_ref tq_ref_t;

/* A store of nb blocks, n_layers, bits 3 or 4; the block strides in
 * *k_stride / *v_stride. Aborts the test (NULL) on a refused shape. */
tq_ref_t *tq_ref_create(int bits, int32_t n_layers, int32_t n_kv, int32_t bs, int32_t hd,
                        int32_t nb, size_t *k_stride, size_t *v_stride);
void tq_ref_destroy(tq_ref_t *r);
/* kn_kvq_write / kn_kvq_attention / kn_kvq_block_ptr (device tier). */
void tq_ref_write(tq_ref_t *r, int32_t layer, const float *k, const float *v,
                  const int32_t *slot, int32_t n_tok);
void tq_ref_attention(tq_ref_t *r, int32_t layer, const kn_attn_args_t *a);
const uint8_t *tq_ref_block(const tq_ref_t *r, int32_t layer, int kind, int32_t block);
/* KV_OP_SHIFT of block by delta with the rope table inv_freq (hd / 2,
 * borrowed); ST_OK or the store's error. */
int tq_ref_shift(tq_ref_t *r, const float *inv_freq, int32_t block, int32_t delta);

#endif /* TESTS_CUDA_TQ_REF_H */
