/* blockmgr_int.h - internal structures of the block manager, shared by
 * blockmgr.c (operations), bm_hash.c (content hashes and hash tables) and
 * bm_check.c (the invariant walker).
 *
 * Layout:
 *
 *   pool
 *    |- tier[BM_DEV]  blocks[num_blocks]   block 0 = null block
 *    |                lru: FREE ... FREE | CACHED (oldest) ... CACHED (newest)
 *    |                ht:  hash -> block id, for registered (cached) blocks
 *    |- tier[BM_CPU]  blocks[swap_blocks]  same structure, no null block
 *    |- seqs          seq id -> bm_seq_t (chained hash map)
 *    |- tenants       small array, looked up by id at create time only
 *    '- ops           queued kv_op_t, in execution order
 *
 * A block's "registered" flag (cached) means the tier's hash table maps its
 * hash to it. State is derived: ref > 0 is USED; ref == 0 and registered is
 * CACHED; ref == 0 and not registered is FREE (and then it holds no hash).
 *
 * Thread: engine thread only.
 */
#ifndef BLOCKMGR_INT_H
#define BLOCKMGR_INT_H

#include <stdint.h>

#include <openssl/evp.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_events.h"
#include "blockmgr/bm_memo.h"
#include "common/list.h"

#define BM_NONE UINT32_MAX
#define BM_HASH_LEN 32
#define BM_KEY_MAX 64 /* salt and extra key bytes */

enum { BM_DEV = 0, BM_CPU = 1 };

/* Number of references a tenant's sequences hold on one block. */
typedef struct bm_tref {
    uint32_t tenant; /* index into pool->tenants */
    uint32_t n;
} bm_tref_t;

typedef struct bm_block {
    list_node_t lru; /* on the tier's queue iff ref == 0 (self-linked otherwise) */
    uint32_t id;
    uint32_t ref;   /* block-table entries (over all sequences) naming the block */
    uint32_t hnext; /* next block id in the same hash bucket, BM_NONE ends */
    /* Block of the other tier holding the same bytes, BM_NONE if none. Kept
     * only while both blocks are USED and neither was written since the
     * copy; lets sharers swap out / in without a second copy. */
    uint32_t twin;
    uint8_t hashed; /* hash[] is the content hash of this full block */
    uint8_t cached; /* registered in the tier's hash table */
    /* Tenants referencing the block: tref0 inline (the common case), any
     * further tenants (same salt) in tref_more[0..n_more). At ref 0,
     * tref0.tenant (n 0) still names the last releasing tenant, and a
     * demoted copy gets it: the owner of a CACHED block (bm_map.h). */
    bm_tref_t tref0;
    bm_tref_t *tref_more;
    uint32_t n_more;
    uint32_t cap_more;
    uint8_t hash[BM_HASH_LEN];
} bm_block_t;

typedef struct bm_tier {
    bm_block_t *blocks; /* [n_blocks] */
    uint32_t n_blocks;  /* including the device null block */
    uint32_t first;     /* first usable id: 1 on the device tier, 0 on CPU */
    /* Eviction order: FREE blocks at the front (taken first), CACHED blocks
     * behind them from least to most recently used. */
    list_node_t lru;
    uint32_t n_free;
    uint32_t n_cached;
    uint32_t n_used;
    uint32_t *buckets; /* [mask + 1] heads of hash chains, BM_NONE empty */
    uint32_t mask;
    uint32_t n_registered;
    struct bm_pool *ev_pool; /* the pool while an event hook is set (bm_events.c), else NULL */
} bm_tier_t;

/* bm_events.c: what a block's STORED event carries, per tier, kept only
 * while an event hook is set. */
typedef struct bm_ev_tier {
    int32_t *toks;       /* [n_blocks * bs] token ids of each hashed block */
    uint8_t *parent;     /* [n_blocks * BM_HASH_LEN] parent hash */
    uint8_t *has_parent; /* [n_blocks] 0: a first block */
} bm_ev_tier_t;

typedef struct bm_tenant {
    uint32_t id;
    uint32_t salt_len;
    uint8_t salt[BM_KEY_MAX];
    uint32_t blocks[2]; /* distinct blocks referenced, per tier */
} bm_tenant_t;

typedef struct bm_seq {
    struct bm_seq *next; /* hash-map chain */
    uint64_t id;
    uint32_t tenant; /* index into pool->tenants */
    uint32_t len;    /* tokens */
    uint32_t n_blocks;
    uint32_t cap_blocks;
    /* Leading table entries given back by bm_seq_release_front (sliding
     * window): table[0 .. n_released) are 0 and hold no reference. */
    uint32_t n_released;
    int32_t *table; /* [n_blocks] device ids, or CPU ids while swapped */
    int32_t *toks;  /* [len] token ids (hash input when a block fills) */
    uint32_t cap_toks;
    int swapped;
    uint32_t extra_len;
    uint8_t extra[BM_KEY_MAX];
    /* Never hashed nor looked up (bm_seq_set_nohash): its blocks may be
     * evicted from the middle and re-rotated (attention sinks). */
    uint8_t nohash;
    /* Step epochs (bm_step.c): the pool epoch of its last reserve or fork
     * (wrote) and of its last reserve, fork, lookup or swap-in (taint). */
    uint64_t wrote_epoch, taint_epoch;
    /* bm_seq_unreserve: the epoch of its last reserve and its length
     * before that epoch's first reserve; the epoch of its last fork,
     * lookup or swap-in (anything a reserve cannot undo). */
    uint64_t resv_epoch, other_epoch;
    uint32_t resv_len0;
    /* The caller's hashes of its prefix blocks (bm_memo.h), or NULL. */
    bm_hash_memo_t *memo;
    /* Table entries [0, tab_clean) unchanged since the last
     * bm_seq_table_delta() (appends need no mark: they land past it). */
    uint32_t tab_clean;
} bm_seq_t;

struct bm_pool {
    bm_config_t cfg;
    uint64_t epoch; /* bm_pool_step_begin count */
    int in_step;    /* between bm_pool_step_begin and _end */
    uint32_t bs;
    uint32_t watermark_blocks;
    bm_tier_t tier[2];

    bm_seq_t **seq_buckets; /* [seq_mask + 1] */
    uint32_t seq_mask;
    uint32_t n_seqs;

    bm_tenant_t *tenants;
    uint32_t n_tenants;
    uint32_t cap_tenants;

    kv_op_t *ops;
    uint32_t n_ops;
    uint32_t cap_ops;

    int32_t *scratch; /* swap planning, [cap_scratch] */
    uint32_t cap_scratch;

    EVP_MD_CTX *md_ctx;
    EVP_MD *md;
    uint64_t *n_hashed; /* [1] block hashes computed (bm_pool_hash_calls), through const pools */

    bm_stats_t st; /* event counters; block counts come from the tiers */

    bm_event_cb ev_cb; /* bm_events.h hook, or NULL */
    void *ev_arg;
    bm_ev_tier_t ev[2];
};

static inline bm_block_t *
bm__blk(const bm_pool_t *pool, int tier, uint32_t id)
{
    return &pool->tier[tier].blocks[id];
}

/* bm_events.c: no-ops without a hook. A hash was registered (stored 1) or
 * unregistered (0) in tier t; b's record says what it holds. */
void bm__ev_registered(bm_tier_t *t, const bm_block_t *b, int stored);
/* Device block b was sealed with this parent (NULL: first) and tokens. */
void bm__ev_seal(bm_pool_t *pool, const bm_block_t *b, const uint8_t *parent,
                 const int32_t *toks);
/* Block dst of dtier now holds the bytes (and hash) of src of stier. */
void bm__ev_copy(bm_pool_t *pool, int dtier, const bm_block_t *dst, int stier,
                 const bm_block_t *src);
/* After bm_pool_reset_prefix_cache: CLEARED when nothing stays registered. */
void bm__ev_reset(bm_pool_t *pool);
void bm__ev_fini(bm_pool_t *pool);

/* bm_hash.c */
int bm__ht_init(bm_tier_t *t, uint32_t n_blocks);
void bm__ht_fini(bm_tier_t *t);
/* Registered block with this hash, or BM_NONE. */
uint32_t bm__ht_find(const bm_tier_t *t, const uint8_t *hash);
/* Registers b (its hash must be absent from the table). */
void bm__ht_insert(bm_tier_t *t, bm_block_t *b);
void bm__ht_remove(bm_tier_t *t, bm_block_t *b);
/* SHA-256 of a full block: parent hash (or, for the first block, the
 * tenant salt), the block's bs token ids, then the extra key. */
void bm__hash_block(const bm_pool_t *pool, const uint8_t *parent, const bm_tenant_t *tenant,
                    const uint8_t *extra, uint32_t extra_len, const int32_t *toks,
                    uint8_t out[BM_HASH_LEN]);

/* bm_memo.c: the hash of block idx of a sequence with memo (NULL: none),
 * taken from the memo or computed (and kept there when it is the next). */
void bm__memo_hash(const bm_pool_t *pool, bm_hash_memo_t *memo, uint32_t idx, const uint8_t *parent,
                   const bm_tenant_t *tenant, const uint8_t *extra, uint32_t extra_len,
                   const int32_t *toks, uint8_t out[BM_HASH_LEN]);

/* Table entry idx of s was overwritten, or the table shrank to idx
 * entries (bm_delta.h). */
static inline void
bm__tab_changed(bm_seq_t *s, uint32_t idx)
{
    if (idx < s->tab_clean) {
        s->tab_clean = idx;
    }
}

/* blockmgr.c, for bm_check.c */
bm_seq_t *bm__seq_find(const bm_pool_t *pool, uint64_t id);

/* Step epochs (bm_step.c). The sequence reserved or was forked this step;
 * it read or will read blocks written this step; a free (wrote) or a
 * swap-out / truncate (taint) of it is checked against the step. */
void bm__step_wrote(const bm_pool_t *pool, bm_seq_t *s);
void bm__step_taint(const bm_pool_t *pool, bm_seq_t *s);
void bm__step_check_free(const bm_pool_t *pool, const bm_seq_t *s);
void bm__step_check_move(const bm_pool_t *pool, const bm_seq_t *s, const char *what);
/* The sequence reserved n_new tokens (its length already counts them). */
void bm__step_reserved(const bm_pool_t *pool, bm_seq_t *s, uint32_t n_new);
/* blockmgr.c's reference drop, for bm_step.c's bm_seq_unreserve and bm_compact.c. */
void bm__blk_put(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant);

/* blockmgr.c, for bm_compact.c: the device-tier operations of the same
 * names (ops_reserve, op_push, blk_alloc, twin_break, tier_avail). */
int bm__ops_reserve(bm_pool_t *pool, uint64_t n);
void bm__op_push(bm_pool_t *pool, kv_op_kind_t kind, uint32_t src, uint32_t dst);
bm_block_t *bm__blk_alloc(bm_pool_t *pool, uint32_t tenant);
void bm__twin_break(bm_pool_t *pool, bm_block_t *b);
uint32_t bm__dev_avail(const bm_pool_t *pool);

#endif /* BLOCKMGR_INT_H */
