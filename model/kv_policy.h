/* kv_policy.h - KV cache policies that bound a sequence's KV memory:
 * attention sinks with a rolling window (StreamingLLM, Xiao et al. 2023).
 *
 * A sequence under sink=S,window=W (tokens, whole blocks) keeps its first
 * S tokens (the attention sinks) and its most recent W tokens. When it
 * outgrows S + W, whole blocks after the sinks are evicted and every kept
 * block after them is re-rotated by -delta (KV_OP_SHIFT; RoPE rotations
 * compose), so cached positions stay contiguous 0 .. kv_len - 1 and new
 * tokens continue at kv_len. The model never sees a position beyond
 * S + W + (tokens added per step), so a stream can run past the model's
 * context with bounded KV memory.
 *
 *   before:  | S0 S1 | B2 B3 B4 | B5 B6 B7 B8 | tail |     (blocks)
 *              sinks    evicted    kept window
 *   after:   | S0 S1 | B5 B6 B7 B8 | tail |   B5.. shifted by 3 blocks
 *
 * This header holds the policy and its parse only. The block manager does
 * the eviction (bm_seq_evict: drops, table, KV_OP_SHIFT ops), the
 * scheduler decides when (sched_kv_window_evict after a step), the
 * backends re-rotate (mdl_runtime_kv_ops), and scheduler/kv_stream.h
 * drives one sequence that way for `kvserve perplexity --kv-policy` and
 * the tests.
 *
 * Thread: any (pure functions).
 */
#ifndef MODEL_KV_POLICY_H
#define MODEL_KV_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* Attention-score eviction (issue 18), selected by kind:
 *
 *   h2o=B,recent=W  Heavy hitters (H2O, arXiv:2306.14048). Every row's
 *       attention probabilities add to the mass of the keys it reads
 *       (per layer and KV head, kernels/cpu/kn_mass.h). After a step that
 *       leaves the cache at B tokens or more, it keeps the W most recent
 *       tokens and the heaviest older ones, B - slack in all (slack =
 *       max(1, block_size / 4): the copies of a compaction are paid once
 *       per slack steps), and frees the rest.
 *   snapkv=B,window=W,pool=K  SnapKV (arXiv:2404.14469). Only the last W
 *       prompt rows accumulate. After the prefill of a prompt longer than
 *       B, the older prompt positions are scored by that mass, max-pooled
 *       over K neighbours, and the best B - W of them plus the W window
 *       are kept; decode then runs on the compressed cache, which grows.
 *
 * Both keep one set of tokens per sequence, all layers and heads alike (a
 * paged block holds every head of its tokens): each (layer, KV head)
 * votes for its own top B - W positions, and the positions with the most
 * votes (ties: the larger normalized mass) are kept
 * (scheduler/kv_evict.h). Kept keys are moved, not re-rotated: a key keeps
 * the position it was written at, and new tokens continue at increasing
 * positions past every token ever written. Compacted blocks are never
 * hashed (blockmgr/blockmgr.h, bm_seq_compact). */
typedef enum mdl_kv_policy_kind {
    MDL_KVP_FULL = 0, /* or sinks + window when window > 0 */
    MDL_KVP_H2O = 1,
    MDL_KVP_SNAPKV = 2,
} mdl_kv_policy_kind_t;

typedef struct mdl_kv_policy {
    int32_t sink;   /* tokens kept at the start */
    int32_t window; /* recent tokens kept; 0: full attention (no policy) */
    int32_t kind;   /* mdl_kv_policy_kind_t; sink and window are 0 unless FULL */
    int32_t budget; /* h2o / snapkv: B tokens */
    int32_t recent; /* h2o: W recent tokens; snapkv: the observation window W */
    int32_t pool;   /* snapkv: max-pool width K (1: none) */
} mdl_kv_policy_t;

/* Tokens an H2O compaction keeps below the budget (the slack above). */
int32_t mdl_kv_policy_slack(int32_t block_size);

/* "full", "sink=S,window=W" with S >= 0, W > 0, both multiples of
 * block_size, "h2o=B,recent=W" with 1 <= W and W + slack < B, or
 * "snapkv=B,window=W,pool=K" with 1 <= W < B and K >= 1 (pool may be
 * left out: 1). ST_EINVAL with a reason in err otherwise. */
int mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                        size_t errlen);

#endif /* MODEL_KV_POLICY_H */
