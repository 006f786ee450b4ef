/* kn_fused.h - elementwise steps of the forward pass fused with the
 * activation quantization that follows them, one fork-join region each.
 *
 * DESIGN. Between two weight products a layer runs rmsnorm (or silu * up)
 * and then the 8-bit form of the result (kn_quant.h kn_act_t); q and k
 * are both rotated. Each of these works token by token, so one region over
 * the tokens does both steps (a token's quantization needs only that
 * token's normed row), where separate calls cost a region each (at batch
 * 32, two or three more wake-ups and joins per layer). Every token's bits
 * are those of the separate kernels (kn_cpu_rmsnorm, kn_cpu_silu_mul,
 * kn_cpu_rope, kn_act_quantize_q8): the same per-token functions run, only
 * grouped differently. Small jobs run on the calling thread.
 *
 * Thread: as kn_cpu.h (one caller at a time per output buffer).
 */
#ifndef KERNELS_CPU_KN_FUSED_H
#define KERNELS_CPU_KN_FUSED_H

#include <stdint.h>

#include "kernels/cpu/kn_quant.h"

/* y = rmsnorm(x) * w as kn_cpu_rmsnorm; then, when a != NULL, the 8-bit
 * form of y in a (a must be kn_act_init'ed on y, n_tok, dim) and
 * a->have_q8 set.  x, y: (n_tok, dim), y may equal x. */
void kn_cpu_rmsnorm_act(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim,
                        float eps, kn_act_t *a);

/* gate = silu(gate) * up as kn_cpu_silu_mul (in place); then, when a !=
 * NULL, the 8-bit form of gate in a (kn_act_init'ed on gate, n_tok, n_f).
 *   gate, up: (n_tok, n_f) */
void kn_cpu_silu_mul_act(float *gate, const float *up, int32_t n_tok, int32_t n_f, kn_act_t *a);

/* kn_cpu_rope() of q (n_tok, n_q * head_dim) and of k (n_tok, n_kv *
 * head_dim) with the same table, in one region. */
void kn_cpu_rope_qk(float *q, int32_t n_q, float *k, int32_t n_kv, int32_t n_tok,
                    int32_t head_dim, const float *cos_t, const float *sin_t);

#endif /* KERNELS_CPU_KN_FUSED_H */
