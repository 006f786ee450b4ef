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

typedef struct mdl_kv_policy {
    int32_t sink;   /* tokens kept at the start */
    int32_t window; /* recent tokens kept; 0: full attention (no policy) */
} mdl_kv_policy_t;

/* "full" or "sink=S,window=W" with S >= 0, W > 0, both multiples of
 * block_size. ST_EINVAL with a reason in err otherwise. */
int mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                        size_t errlen);

#endif /* MODEL_KV_POLICY_H */
