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
 * mdl_kvstream_t drives one sequence over a runtime with such a policy
 * (used by `kvserve perplexity --kv-policy` and the tests).
 *
 * Thread: engine thread (like mdl_runtime_*).
 */
#ifndef MODEL_KV_POLICY_H
#define MODEL_KV_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"
#include "model/model.h"

typedef struct mdl_kv_policy {
    int32_t sink;   /* tokens kept at the start */
    int32_t window; /* recent tokens kept; 0: full attention (no policy) */
} mdl_kv_policy_t;

/* "full" or "sink=S,window=W" with S >= 0, W > 0, both multiples of
 * block_size. ST_EINVAL with a reason in err otherwise. */
int mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                        size_t errlen);

/* Plans the eviction before n_incoming tokens are appended to a sequence
 * of *kv_len tokens whose block table is table[0 .. *n_blocks): when
 * *kv_len + n_incoming would exceed sink + window + n_incoming rounded up to
 * a block (i.e. *kv_len > sink + window), evicts the fewest whole blocks
 * after the sinks that bring *kv_len to <= sink + window. Writes the
 * evicted block ids to evicted[] (their count is the result), queues one
 * KV_OP_SHIFT per kept block after them into ops[] (*n_ops += count; room
 * for *n_blocks ops needed), compacts table and updates *n_blocks and
 * *kv_len. Returns 0 and changes nothing when no eviction is due. */
int32_t mdl_kv_policy_evict(const mdl_kv_policy_t *p, int32_t block_size, int32_t *table,
                            int32_t *n_blocks, int32_t *kv_len, int32_t *evicted, kv_op_t *ops,
                            int32_t *n_ops);

/* One sequence streamed through a runtime under a policy. The runtime
 * must have block_size bs, at least max_blocks + 1 blocks and
 * max_num_batched_tokens / max_num_seqs >= chunk. */
typedef struct mdl_kvstream mdl_kvstream_t;

/* Row callback: logits ([vocab] f32) of fed token i (0-based over all
 * tokens ever fed). */
typedef void (*mdl_kvstream_cb)(void *arg, int64_t i, const float *logits);

/* max_ctx: the most tokens the cache may hold (sink + window + chunk for a
 * policy, the model context without one). */
int mdl_kvstream_create(mdl_runtime_t *rt, const mdl_kv_policy_t *p, int32_t block_size,
                        int32_t max_ctx, int32_t chunk, int32_t vocab, mdl_kvstream_t **out);
void mdl_kvstream_destroy(mdl_kvstream_t *s);
/* Drops every block: the stream starts over at position 0 and row 0. */
int mdl_kvstream_reset(mdl_kvstream_t *s);
/* Appends toks[0..n), chunk tokens per forward, evicting first when the
 * policy says so; cb (may be NULL) gets each row's logits. ST_ETOOLONG
 * when there is no policy and the context would overflow. */
int mdl_kvstream_feed(mdl_kvstream_t *s, const int32_t *toks, int32_t n, mdl_kvstream_cb cb,
                      void *arg);
/* Tokens in the cache now, and the most it ever held. */
int32_t mdl_kvstream_kv_len(const mdl_kvstream_t *s);
int32_t mdl_kvstream_kv_peak(const mdl_kvstream_t *s);
/* Blocks evicted so far. */
int64_t mdl_kvstream_evicted(const mdl_kvstream_t *s);

#endif /* MODEL_KV_POLICY_H */
