/* blockmgr.h - the PagedAttention KV block manager.
 *
 * Owns the device-tier and CPU-tier (swap) block pools, per-sequence block
 * tables, refcounts, the prefix cache (content-hashed full blocks) and
 * copy-on-write. It never touches block contents: it hands out block ids
 * and queues kv_op_t copy/swap operations that the engine gives to the
 * backend before the next forward pass, in queue order.
 *
 * DESIGN
 *   Block states (device and CPU tier alike):
 *     FREE    ref 0, no hash, on the tier's LRU queue
 *     CACHED  ref 0, hash,    on the tier's LRU queue (revivable in O(1))
 *     USED    ref >= 1,       off the queue
 *   Device block 0 is the null block: never handed out, never freed.
 *   A full block is hashed (SHA-256 over parent hash, its token ids and
 *   extra keys; the first block mixes in the tenant's salt) and immutable.
 *   bm_seq_reserve() takes the token ids the step will write, so a block is
 *   hashed as soon as the step that fills it is planned: the forward writes
 *   every new token's K/V of a layer before any attention of that layer,
 *   so another sequence hitting that block in the same step reads valid KV.
 *
 *   The step contract (what makes the queued ops correct):
 *     1. The scheduler plans: reserve / lookup / fork / swap / free ...
 *     2. The engine runs bm_pool_ops() in queue order, then calls
 *        bm_pool_ops_clear().
 *     3. The forward writes the K/V of every token reserved in step 1.
 *   Ops therefore see the bytes as they were before this step's forward.
 *   Ops that reuse a block always come after the ops that read its old
 *   bytes (e.g. a SWAP_OUT of block 5 precedes a SWAP_IN or COPY into 5).
 *   So, within one step: a sequence that reserved tokens must stay in the
 *   batch (do not swap it out, truncate or free it), and a fork of it must
 *   not write before the next step. A sequence that got blocks by lookup,
 *   fork or swap-in must not be swapped out or truncated in that step (it
 *   may hold a block another sequence fills in this forward); freeing it
 *   is fine. The scheduler preempts only sequences it has not planned yet
 *   this step, and forks after the forward.
 *
 *   A block filled while an equal one is already registered (computed
 *   twice) stays unregistered; it keeps its hash only to chain the next
 *   block, and registers when released if the original is gone by then.
 *
 *   Free queue: one intrusive list per tier. FREE blocks sit at the front
 *   and are handed out first; CACHED blocks follow from least to most
 *   recently released, so a FREE block is always preferred over evicting
 *   a CACHED one. A sequence releases its blocks last to first, so its
 *   tail (least likely to be shared) is evicted before its head.
 *
 *   Swap tier and sharing: a device block shared by several sequences is
 *   copied to the CPU tier when the first sharer swaps out; the device
 *   block stays in place for the remaining sharers, and both copies are
 *   linked as twins while neither changes. A second sharer swapping out
 *   reuses the CPU twin (no second copy); a swapped sharer swapping in
 *   while its twin is still on the device re-shares it (no copy either).
 *   Full hashed blocks are also matched by hash in the target tier's
 *   prefix cache, so swapping never duplicates cached content. Writing a
 *   block, or its last reference going away, dissolves the twin link.
 *
 *   Demotion: when a CACHED device block is evicted and the CPU tier has
 *   a FREE or CACHED block (the CPU tier's own LRU evicts its oldest), a
 *   SWAP_OUT is queued and the CPU block joins the CPU prefix cache. A
 *   lookup hitting it there promotes it back with a SWAP_IN.
 *
 * Errors: ST_EINVAL for bad arguments (unknown sequence, wrong state),
 * ST_EAGAIN when a pool cannot satisfy the request, ST_ENOMEM when host
 * memory for the request's bookkeeping cannot be allocated; on ST_EAGAIN
 * and ST_ENOMEM nothing changed (the same call may succeed later).
 *
 * Memory: bm_pool_create() allocates what has a bound (hash tables, swap
 * planning, the op queue a step usually needs) with the aborting family;
 * what a request grows (its sequence record, tenant entry, block table,
 * token array, a block's extra tenant records, op queue room past the
 * preallocation) uses the fallible family (common/xmalloc.h, counted in
 * the calling thread's domain). Calls that only give blocks back
 * (bm_seq_free, bm_seq_truncate, bm_seq_release_front, bm_seq_evict)
 * never fail for memory.
 *
 * Thread: engine thread only.
 */
#ifndef BLOCKMGR_H
#define BLOCKMGR_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"

typedef struct bm_pool bm_pool_t; /* opaque */

typedef struct bm_config {
    uint32_t block_size;  /* tokens per block (default 16) */
    uint32_t num_blocks;  /* device tier, including the null block 0 */
    uint32_t swap_blocks; /* CPU tier; 0 disables swapping and demotion */
    int prefix_caching;   /* 0 disables hashing and lookups */
    float watermark;      /* fraction of device blocks kept for running growth */
    /* Queue KV_OP_DROP (device) / KV_OP_DROP_SWAP (CPU tier) when a block
     * that is not cached (partly filled, or unhashed) loses its last
     * reference, after any op reading it: lets a backend free state kept
     * beside the block (the residual of a quantized KV cache). */
    int drop_ops;
} bm_config_t;

typedef struct bm_stats {
    uint32_t dev_total; /* usable device blocks (num_blocks - 1) */
    uint32_t dev_free;  /* FREE */
    uint32_t dev_cached;
    uint32_t dev_used;
    uint32_t cpu_total;
    uint32_t cpu_free;
    uint32_t cpu_cached;
    uint32_t cpu_used;
    uint64_t prefix_queries; /* tokens looked up */
    uint64_t prefix_hits;    /* tokens found cached */
    uint64_t n_copies;       /* copy-on-write copies queued */
    uint64_t n_swap_out;     /* blocks queued device -> CPU by bm_seq_swap_out */
    uint64_t n_swap_in;      /* blocks queued CPU -> device by bm_seq_swap_in */
    uint64_t n_demoted;      /* cached blocks demoted to the CPU tier */
    uint64_t n_promoted;     /* cached blocks promoted back on a hit */
    uint64_t n_evicted;      /* cached blocks dropped */
} bm_stats_t;

/* ST_OK and *out, or ST_EINVAL (block_size 0, num_blocks < 2). */
int bm_pool_create(const bm_config_t *cfg, bm_pool_t **out);
/* NULL is a no-op. */
void bm_pool_destroy(bm_pool_t *pool);

/* Prefix-cache salt for a tenant (copied; len <= 64). Tenants with the
 * same salt share cached blocks; the default salt is the tenant id.
 * Configuration (start-up): aborts without memory. */
int bm_tenant_set_salt(bm_pool_t *pool, uint32_t tenant, const void *salt, size_t len);

/* Registers an empty, resident sequence owned by tenant. ST_EINVAL if seq
 * already exists; ST_ENOMEM (nothing registered) if its record or the
 * tenant's first entry cannot be allocated. */
int bm_seq_create(bm_pool_t *pool, uint64_t seq, uint32_t tenant);

/* Extra hash key (copied; len <= 64) mixed into every block hash of an
 * empty sequence, e.g. an adapter or model revision: sequences share
 * cached blocks only with equal keys. Set it before the lookup. ST_EINVAL
 * if seq is unknown or not empty, or len > 64. Forks inherit it. */
int bm_seq_set_extra_key(bm_pool_t *pool, uint64_t seq, const void *key, size_t len);

/* For an empty sequence: attach the longest run of cached full blocks that
 * match tokens[0..n), never covering tokens[n-1]. Blocks found in the CPU
 * tier are promoted (queued SWAP_IN), which needs free device blocks; the
 * run stops where it cannot. *n_cached = tokens now covered (a multiple of
 * block_size). Counts queries and hits. ST_ENOMEM (nothing changed, not
 * counted) if the table and token room cannot be allocated; a shared
 * block whose tenant record cannot be allocated ends the run as a miss
 * would (ST_OK with fewer tokens). */
int bm_seq_lookup_prefix(bm_pool_t *pool, uint64_t seq, const int32_t *tokens, uint32_t n,
                         uint32_t *n_cached);

/* Tokens that a lookup would find, without attaching or counting (no
 * extra key; ignores whether promotions would find room). */
uint32_t bm_prefix_probe(const bm_pool_t *pool, uint32_t tenant, const int32_t *tokens, uint32_t n);

/* Device blocks that reserving n_new more tokens of seq would take
 * (new blocks plus a copy-on-write of a shared tail). For an unknown seq:
 * what a new, empty sequence would take; for a swapped one: an upper
 * bound including its swap-in. */
uint32_t bm_seq_blocks_needed(const bm_pool_t *pool, uint64_t seq, uint32_t n_new);

/* Whether n_blocks more can be given to a NEW sequence while keeping the
 * watermark for running ones. */
int bm_pool_can_admit(const bm_pool_t *pool, uint32_t n_blocks);
/* The device blocks that watermark keeps: floor(watermark x usable blocks). */
uint32_t bm_pool_watermark_blocks(const bm_pool_t *pool);

/* Make room for tokens[0..n_new) after the sequence's current length,
 * all-or-nothing. Writes slots[i] = block * block_size + offset for each
 * new token. Copy-on-write of a shared partly filled tail is queued here.
 * Blocks that become full are hashed and enter the prefix cache.
 * ST_EAGAIN: not enough device blocks; ST_ENOMEM: the table, token or
 * op room cannot be allocated; nothing changed on either. */
int bm_seq_reserve(bm_pool_t *pool, uint64_t seq, const int32_t *tokens, uint32_t n_new,
                   int32_t *slots);

/* Changes the token id of reserved position pos (the hash input when its
 * block fills) to token: a draft model's speculative tokens, reserved
 * before they are drawn (scheduler/spec_draft.h). Only positions of a
 * partly filled tail block; ST_EINVAL otherwise (unknown or swapped seq,
 * pos past the length, a full block). blockmgr/bm_draft.c. */
int bm_seq_set_token(bm_pool_t *pool, uint64_t seq, uint32_t pos, int32_t token);

/* Give up the last n tokens of the sequence (speculative or aborted
 * writes); blocks left empty are released. */
int bm_seq_truncate(bm_pool_t *pool, uint64_t seq, uint32_t n);

/* child becomes a new sequence sharing every block of parent (refcounts
 * up), with the same tenant and length. ST_EINVAL if child exists or
 * parent is swapped; ST_ENOMEM (no child, nothing changed) if its record
 * or table cannot be allocated. */
int bm_seq_fork(bm_pool_t *pool, uint64_t parent, uint64_t child);

/* Releases the sequence: blocks go back to the LRU queue, full hashed
 * ones stay CACHED. Unknown seq is a no-op. */
void bm_seq_free(bm_pool_t *pool, uint64_t seq);

/* Sliding window: gives back the sequence's first n_blocks blocks (those
 * no query can attend to any more), last reference first to the LRU queue
 * (hashed ones stay CACHED). Their table entries become 0, the null block,
 * and stay in place so indices still map context positions; the length is
 * unchanged. Fork, swap and free skip them. Idempotent for n_blocks at or
 * below what is already released. ST_EINVAL for an unknown or swapped
 * sequence, or when fewer than two live blocks would remain (the next
 * block to fill chains its hash to the one before it). */
int bm_seq_release_front(bm_pool_t *pool, uint64_t seq, uint32_t n_blocks);
/* Attention sinks (model/kv_policy.h): an empty sequence that will have
 * blocks evicted from its middle is never hashed, registered or looked up
 * (its kept blocks change bytes when re-rotated). Forks inherit it.
 * ST_EINVAL if seq is unknown or not empty. */
int bm_seq_set_nohash(bm_pool_t *pool, uint64_t seq);
/* Evicts blocks [first, first + n) of a resident nohash sequence: they are
 * released (KV_OP_DROP with drop_ops), the table and length close the gap
 * (len -= n * block_size), and every later block gets a KV_OP_SHIFT by
 * n * block_size so the backend re-rotates its keys. ST_EINVAL if the
 * sequence is unknown, swapped or hashed, the range is empty, starts in
 * released blocks or reaches the last block, or a later block is shared.
 * The one implementation of the policy's eviction: the scheduler calls
 * it through sched_kv_window_evict (scheduler/sched.h), in the engine and
 * in scheduler/kv_stream.h. */
int bm_seq_evict(bm_pool_t *pool, uint64_t seq, uint32_t first, uint32_t n);
/* Heavy-hitter / SnapKV compaction (blockmgr/bm_compact.c): the sequence
 * keeps only its tokens keep[0..n_keep) (strictly increasing indices below
 * its length), moved to indices 0 .. n_keep - 1 by queued KV_OP_COPY_SLOT
 * ops; blocks left empty are released (KV_OP_DROP with drop_ops). Blocks
 * before the first moved token stay as they are (still shared / cached);
 * from there on a block is written in place only when the sequence holds
 * it alone and it is not in the prefix cache, otherwise it gets a private
 * copy (a shared prefix is never compacted in place). The sequence turns
 * nohash: compacted blocks are never hashed or registered. ST_EINVAL for
 * an unknown or swapped sequence, released front blocks or a bad keep
 * list; ST_EAGAIN when the private copies find too few free blocks;
 * ST_ENOMEM when op room cannot be allocated (nothing changed on any). */
int bm_seq_compact(bm_pool_t *pool, uint64_t seq, const uint32_t *keep, uint32_t n_keep);
/* Device blocks bm_seq_compact would take for its private copies (0 for an
 * unknown sequence). */
uint32_t bm_seq_compact_needed(const bm_pool_t *pool, uint64_t seq, const uint32_t *keep,
                               uint32_t n_keep);
/* Leading blocks released so far (0 for an unknown sequence). */
uint32_t bm_seq_released(const bm_pool_t *pool, uint64_t seq);

/* Move every block of a resident sequence to the CPU tier (queued
 * SWAP_OUT ops; a block shared by several sequences moves once and stays
 * shared). ST_EAGAIN when the CPU tier lacks room; ST_ENOMEM when op
 * room or a shared block's tenant record cannot be allocated (nothing
 * changed on either). */
int bm_seq_swap_out(bm_pool_t *pool, uint64_t seq);
/* Bring a swapped sequence back (queued SWAP_IN ops). ST_EAGAIN when the
 * device tier lacks room (respecting nothing but free blocks); ST_ENOMEM
 * as for bm_seq_swap_out (nothing changed on either). */
int bm_seq_swap_in(bm_pool_t *pool, uint64_t seq);
/* Device blocks a swap-in of seq would need. */
uint32_t bm_seq_swap_in_needed(const bm_pool_t *pool, uint64_t seq);

int bm_seq_exists(const bm_pool_t *pool, uint64_t seq);
int bm_seq_is_swapped(const bm_pool_t *pool, uint64_t seq);
uint32_t bm_seq_len(const bm_pool_t *pool, uint64_t seq);
/* Borrowed view of the block table; valid until the next call that
 * mutates seq. Device block ids while resident. */
const int32_t *bm_seq_table(const bm_pool_t *pool, uint64_t seq, uint32_t *n_blocks);

/* Queued copy/swap operations since the last clear, in the order they must
 * run. Borrowed; valid until bm_pool_ops_clear(). */
const kv_op_t *bm_pool_ops(const bm_pool_t *pool, uint32_t *n_ops);
void bm_pool_ops_clear(bm_pool_t *pool);

uint32_t bm_pool_block_size(const bm_pool_t *pool);
/* Device blocks that can be handed out now: FREE plus CACHED (evictable). */
uint32_t bm_pool_free_blocks(const bm_pool_t *pool);
/* CPU-tier blocks that can be handed out now. */
uint32_t bm_pool_free_swap_blocks(const bm_pool_t *pool);
void bm_pool_stats(const bm_pool_t *pool, bm_stats_t *out);
/* Device blocks referenced by a tenant's sequences (shared blocks count
 * once per tenant). */
uint32_t bm_tenant_blocks(const bm_pool_t *pool, uint32_t tenant);
/* CPU-tier blocks referenced by a tenant's swapped sequences (same rule). */
uint32_t bm_tenant_swap_blocks(const bm_pool_t *pool, uint32_t tenant);

/* Drops every CACHED block (device and CPU tier) from the prefix cache. */
void bm_pool_reset_prefix_cache(bm_pool_t *pool);

/* The step contract, checked instead of assumed (issue 15). Block hashes
 * and slots are fixed at plan time, so between bm_pool_step_begin() and
 * bm_pool_step_end() (the planner's step, up to the forward that writes
 * its slots) a sequence that reserved or was forked in the step is not
 * freed, and one that reserved, was forked, looked up a prefix or swapped
 * in is not truncated or swapped out: any of those would let another
 * sequence take blocks the forward is about to write or read. A breach
 * aborts (CHECK) naming the call. Outside a step nothing is checked (unit
 * tests and kv_stream drive the pool directly). Cannot fail. */
void bm_pool_step_begin(bm_pool_t *pool);
void bm_pool_step_end(bm_pool_t *pool);

/* Takes back, within the step that made them, every bm_seq_reserve of
 * seq since bm_pool_step_begin (vLLM v1 un-schedules a preemption victim
 * this way): the length returns to what it was, blocks left empty go
 * back to the queue, and hashes registered for the taken-back slots are
 * unregistered (their bytes will never be written). Afterwards the
 * sequence counts as untouched in this step, so it may be swapped out or
 * freed. ST_EINVAL (nothing changed) outside a step, for an unknown or
 * swapped sequence, one that did not reserve in this step or was also
 * forked, looked up or swapped in during it, one whose taken-back blocks
 * another sequence references, or one whose length would fall into
 * blocks the sliding window released. Cannot fail otherwise. */
int bm_seq_unreserve(bm_pool_t *pool, uint64_t seq);

/* Walks every structure; aborts with a message on any violation:
 * refcount == table entries naming the block, every block in exactly one
 * state (USED off the queue; FREE then CACHED on it, once), each tier's
 * prefix cache holding a hash at most once (the same content may be
 * cached on both tiers), tiers disjoint (tables name only their tier's
 * ids, twins join different tiers), counters and per-tenant counts equal
 * to what the tables say. O(blocks x tenants); for tests and debugging. */
void bm_pool_check(const bm_pool_t *pool);

#endif /* BLOCKMGR_H */
