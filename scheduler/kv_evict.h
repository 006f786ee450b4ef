/* kv_evict.h - the decisions of attention-score eviction (H2O heavy
 * hitters, SnapKV prompt compression; model/kv_policy.h): which tokens of
 * a sequence stay, from the per-token attention mass the model's forward
 * accumulated (mdl_runtime_kv_mass, plain numbers like the logits), and
 * the compaction that frees the rest (bm_seq_compact). No tensor is
 * touched here: the block manager queues KV_OP_COPY_SLOT ops and the
 * backend moves the bytes before the next forward.
 *
 * DESIGN
 *   A paged block holds every layer and head of its tokens, so one set of
 *   tokens is kept per sequence. Each (layer, KV head) scores the
 *   candidates (all but the `recent` newest tokens), max-pooled over
 *   `pool` neighbours (SnapKV; 1 for H2O), and votes for its top n_keep -
 *   recent; the candidates with the most votes are kept, ties broken by
 *   the sum over heads of each head's normalized score, then the older
 *   index. With one head this is plain top-k; with many it keeps what
 *   most heads need (SnapKV's per-head selection, as a paged cache can
 *   hold it).
 *
 * Thread: the engine thread (or the owner of a kv_stream).
 */
#ifndef SCHEDULER_KV_EVICT_H
#define SCHEDULER_KV_EVICT_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"
#include "model/kv_policy.h"

/* keep[0..n_keep) = ascending token indices to keep out of n: the last
 * min(recent, n_keep) always, the rest by the vote above over mass
 * ([n][n_heads] floats). n_keep >= n keeps everything. Returns the number
 * written, or -1 when scratch memory cannot be allocated (keep nothing
 * out: skip the eviction this time). */
int32_t sched_kv_select(const float *mass, int32_t n, int32_t n_heads, int32_t n_keep,
                        int32_t recent, int32_t pool, uint32_t *keep);

/* H2O: the tokens to keep after a step that left the sequence with n_kv
 * tokens, or 0 when it stays (below the budget). */
int32_t sched_kv_h2o_target(const mdl_kv_policy_t *p, int32_t n_kv, int32_t block_size);

/* Compacts sequence seq of pool (length n_kv, its slots from its block
 * table) to n_keep tokens chosen by sched_kv_select over mass ([n_kv]
 * rows of n_heads, in token order), with the policy's recent window and
 * pool. Writes the kept indices to keep (room for n_keep), and returns
 * how many tokens were dropped (0: nothing changed: no memory, or
 * bm_seq_compact's EAGAIN / EINVAL, e.g. no free block for a private
 * copy of a shared prefix block; the caller may retry after a later
 * step). */
int32_t sched_kv_compact(bm_pool_t *pool, uint64_t seq, const mdl_kv_policy_t *p,
                         const float *mass, int32_t n_kv, int32_t n_heads, int32_t n_keep,
                         uint32_t *keep);

/* The device slots of tokens [0, n) of a resident sequence (slots[i] =
 * table[i / bs] * bs + i % bs), for mdl_runtime_kv_mass. */
void sched_kv_slots(const bm_pool_t *pool, uint64_t seq, int32_t n, int32_t *slots);

#endif /* SCHEDULER_KV_EVICT_H */
