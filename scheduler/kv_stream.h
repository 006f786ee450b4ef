/* kv_stream.h - one sequence streamed through a model runtime outside the
 * engine, its KV blocks owned by the block manager: the driver of
 * `kvserve generate`, `kvserve perplexity` and the tests that need the
 * logits of every row of a long text.
 *
 * DESIGN
 *   The stream owns a blockmgr pool of its own (prefix caching off, drop
 *   ops on) holding one sequence. Each chunk of at most `chunk` tokens is
 *   one step as the engine runs it: evict (below), bm_seq_reserve for the
 *   chunk's slots, the pool's queued ops through mdl_runtime_kv_ops, then
 *   one forward over the block table blockmgr keeps. No block id is made
 *   up here.
 *
 *   Under attention sinks + a rolling window (model/kv_policy.h) the
 *   sequence is nohash and, before each chunk, loses whole blocks after the
 *   sinks through sched_kv_window_evict(), the call the scheduler makes
 *   after a step (evicting before the next chunk is the same thing: no
 *   forward runs between the two). Positions stay contiguous 0 .. kv_len-1.
 *
 *   Under H2O or SnapKV (model/kv_policy.h) the runtime must have been
 *   created with kv_mass; the batch flags the rows whose attention counts
 *   (every row for H2O, the last W prompt rows for SnapKV, the prompt
 *   being announced with sched_stream_set_prompt), and after the forward
 *   the stream reads the mass of its tokens and compacts them through
 *   scheduler/kv_evict.h, as the scheduler does after a step. Positions
 *   then run past the cache: each new token takes the next position
 *   after every token fed since the reset, while kept keys keep theirs.
 *
 *   The runtime must have block size block_size, at least
 *   sched_stream_blocks(block_size, max_ctx) + 1 blocks and as many
 *   max_blocks_per_seq, max_num_batched_tokens >= chunk, and
 *   max_num_seqs >= chunk for sched_stream_feed (a logits row per token).
 *
 * Thread: the runtime's (engine) thread, like mdl_runtime_*.
 */
#ifndef SCHEDULER_KV_STREAM_H
#define SCHEDULER_KV_STREAM_H

#include <stdint.h>

#include "model/kv_policy.h"
#include "model/model.h"

typedef struct sched_stream sched_stream_t;

/* Row callback: logits ([vocab] f32) of fed token i (0-based over all
 * tokens fed since the last reset). */
typedef void (*sched_stream_cb)(void *arg, int64_t i, const float *logits);

/* Block-table width of a stream of at most max_ctx tokens. */
int32_t sched_stream_blocks(int32_t block_size, int32_t max_ctx);

/* max_ctx: the most tokens the cache may hold (sink + window + block +
 * chunk for a policy, the context without one). p NULL or window 0: no
 * policy. ST_EINVAL for a bad size; ST_ENOMEM if the pool's sequence
 * cannot be registered (host memory otherwise aborts, as xmalloc). */
int sched_stream_create(mdl_runtime_t *rt, const mdl_kv_policy_t *p, int32_t block_size,
                        int32_t max_ctx, int32_t chunk, int32_t vocab, sched_stream_t **out);
/* NULL is a no-op. Does not touch the runtime's KV. */
void sched_stream_destroy(sched_stream_t *s);
/* Gives every block back (KV_OP_DROP on the runtime): the stream starts
 * over at position 0 and row 0. */
int sched_stream_reset(sched_stream_t *s);
/* Appends toks[0..n), chunk tokens per forward, evicting first when the
 * policy says so; cb (may be NULL) gets every row's logits. ST_ETOOLONG
 * when the cache would hold more than max_ctx tokens (no policy). */
int sched_stream_feed(sched_stream_t *s, const int32_t *toks, int32_t n, sched_stream_cb cb,
                      void *arg);
/* As sched_stream_feed, but each forward computes the logits of its last
 * token only, and cb (may be NULL) gets those rows. */
int sched_stream_feed_last(sched_stream_t *s, const int32_t *toks, int32_t n, sched_stream_cb cb,
                           void *arg);
/* SnapKV: the next n_prompt tokens fed are the prompt; its last W rows
 * accumulate mass, and the forward that completes it is followed by the
 * compression. No effect under other policies. */
void sched_stream_set_prompt(sched_stream_t *s, int32_t n_prompt);
/* Tokens dropped by H2O / SnapKV compactions so far (over resets too). */
int64_t sched_stream_compacted(const sched_stream_t *s);
/* Tokens in the cache now, and the most it ever held. */
int32_t sched_stream_kv_len(const sched_stream_t *s);
int32_t sched_stream_kv_peak(const sched_stream_t *s);
/* Blocks evicted so far (over resets too). */
int64_t sched_stream_evicted(const sched_stream_t *s);

#endif /* SCHEDULER_KV_STREAM_H */
