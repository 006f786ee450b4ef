/* kv_tq.h - the tq3 / tq4 KV dtypes of the compressed CPU store
 * (kernels/cpu/kv_quant.h): TurboQuant-style rows (kernels/kn_tq.h), the
 * seeded rotation and QJL sketch of each layer and KV head, and paged
 * attention that scores keys in the rotated domain.
 *
 * DESIGN. A tq block holds, per kind, [n_kv][block_size][row] with the
 * rows of kernels/kn_tq.h and no meta: every token is encoded on its own
 * when it is written (no residual slot), so COPY / SWAP / prefix caching
 * move self-contained bytes and stay bit-exact. The rotation signs D and
 * the sketch S are a function of (layer, KV head) only (seeded splitmix64;
 * S = sqrt(d) x a Haar orthogonal matrix, Gram-Schmidt of a Box-Muller
 * Gaussian one), the same in every store. SHIFT (attention
 * sinks) decodes a block's keys, re-rotates them and encodes them again
 * (the one place tq re-quantizes; kv_quant.c counts it).
 *
 * Attention, per query token and KV head: each query head of the group is
 * rotated once (qz = H D q, sq = S qz); a key row then costs one pass over
 * its codes and signs (kn_tq_key_dot math, with the codebook values
 * decoded once per row for all the group's heads); values are summed as
 * p_t n_t cb[code_t] in the rotated domain and the sum rotated back once
 * (D H acc / d). The online softmax is kn_cpu_attention's.
 *
 * Thread: the state is immutable after kn_tq_create(); any thread may use
 * it. kn__tq_attn_task() runs on the kernel team's threads.
 */
#ifndef KERNELS_CPU_KV_TQ_H
#define KERNELS_CPU_KV_TQ_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn_cpu.h"

typedef struct kn_tq kn_tq_t;

/* Row bytes of kind for (bits, head_dim); 0 with a reason in err when
 * head_dim is not a power of two in 16 .. 256. */
int32_t kn_tq_row_size(int bits, int kind, int32_t head_dim, char *err, size_t errlen);

/* The rotations and sketches of n_layers x n_kv heads (seeded, fixed: a
 * function of the layer and the global KV head index, so a tensor-parallel
 * rank holding heads [head0, head0 + n_kv) uses the rotations of a single
 * store's). bits: 3 or 4 (kernels/kn_tq.h's row layouts). kn_tq_create:
 * head0 0. */
kn_tq_t *kn_tq_create(int bits, int32_t n_layers, int32_t n_kv, int32_t head_dim);
kn_tq_t *kn_tq_create_at(int bits, int32_t n_layers, int32_t n_kv, int32_t head0,
                         int32_t head_dim);
void kn_tq_destroy(kn_tq_t *tq); /* NULL is a no-op */
/* Borrowed views of one layer's signs (n_kv, hd) and sketch (n_kv, hd, hd),
 * valid for the state's life: what a device backend uploads. */
const float *kn_tq_layer_signs(const kn_tq_t *tq, int32_t layer);
const float *kn_tq_layer_sketch(const kn_tq_t *tq, int32_t layer);

/* out = R x = H D x / sqrt(d) for (layer, head); in and out may alias.
 * kn_tq_unrotate is its inverse (transpose). For the tests. */
void kn_tq_rotate(const kn_tq_t *tq, int32_t layer, int32_t h, const float *x, float *out);
void kn_tq_unrotate(const kn_tq_t *tq, int32_t layer, int32_t h, const float *x, float *out);

/* One row of kind (0 K, 1 V) for (layer, head): encode hd floats, decode
 * them back (keys: the unbiased reconstruction with the sketch term). */
void kn_tq_encode(const kn_tq_t *tq, int32_t layer, int32_t h, int kind, const float *x,
                  uint8_t *row);
void kn_tq_decode(const kn_tq_t *tq, int32_t layer, int32_t h, int kind, const uint8_t *row,
                  float *out);
/* The attention kernel's estimate of q . k for a key row (q not rotated). */
float kn_tq_key_score(const kn_tq_t *tq, int32_t layer, int32_t h, const float *q,
                      const uint8_t *row);

/* Attention of query token t (sequence s) against KV head kh at layer:
 * kbase / vbase are the layer's block 0 of K / V, kstride / vstride the
 * bytes between blocks (kv_quant.c's layout); a as kn_cpu_attention. */
void kn__tq_attn_task(const kn_tq_t *tq, int32_t layer, const uint8_t *kbase, size_t kstride,
                      const uint8_t *vbase, size_t vstride, const kn_attn_args_t *a, int32_t t,
                      int32_t s, int32_t kh);

#endif /* KERNELS_CPU_KV_TQ_H */
