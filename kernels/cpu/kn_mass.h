/* kn_mass.h - accumulated attention mass per cached token, layer and KV
 * head: the score of heavy-hitter eviction (H2O, arXiv:2306.14048) and of
 * SnapKV prompt compression (arXiv:2404.14469), model/kv_policy.h.
 *
 * acc is one layer's accumulator, [slot][n_kv_heads] floats (slot = block
 * * block_size + offset, as the KV cache). For every query row t with
 * row_on[t] != 0, and every query head h of KV head kh, the softmax
 * probabilities p_j of the attention of kn_cpu_attention() (same scale,
 * causal range and sliding window) are added: acc[slot(j)][kh] += p_j.
 * A KV head's mass per row is thus the sum over its query heads (GQA).
 *
 * The pass is separate from kn_cpu_attention (it recomputes q . k for the
 * rows that accumulate, twice: max and normalizer, then the adds), so the
 * attention kernels stay untouched and a policy costs nothing to rows and
 * runtimes without one; model/host_kv.c calls it right after the layer's
 * attention, while the keys are in cache.
 *
 * Thread: the caller's; KV heads run on the kernel pool (disjoint cells of
 * acc), so one call is safe while nothing else writes acc.
 */
#ifndef KERNELS_CPU_KN_MASS_H
#define KERNELS_CPU_KN_MASS_H

#include <stdint.h>

#include "kernels/cpu/kn_cpu.h"

/* a as for kn_cpu_attention (its out is not written); row_on [n_tok]. */
void kn_cpu_attn_mass(const kn_attn_args_t *a, const uint8_t *row_on, float *acc);
/* The scalar reference in double (test use). */
void kn_cpu_attn_mass_ref(const kn_attn_args_t *a, const uint8_t *row_on, float *acc);

#endif /* KERNELS_CPU_KN_MASS_H */
