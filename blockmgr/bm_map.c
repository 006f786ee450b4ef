/* bm_map.c - the read-only enumeration of bm_map.h: cells per block,
 * sequences and their tables, one block's detail.
 *
 * DESIGN
 *   bm_map_tier() is the hot one (it runs on the engine thread for every
 *   map snapshot): one pass over the tier's block array writing 8 bytes
 *   per block, with no allocation and no branch per tenant. A block's
 *   state is derived exactly as blockmgr_int.h defines it (ref > 0 USED,
 *   registered CACHED, else FREE). The block's tenant is its first tenant
 *   record (tref0), which blockmgr.c leaves naming the last releasing
 *   tenant once the refcount drops to 0, so a CACHED block still names
 *   whose salt keyed it.
 *
 *   The rest (holders, tokens) scans the sequence map: O(sequences x table)
 *   per call, for one hovered block at a time.
 *
 * Thread: engine thread only.
 */
#include "blockmgr/bm_map.h"

#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/status.h"
#include "common/xmalloc.h"

static int
tier_ok(int tier)
{
    return tier == BM_DEV || tier == BM_CPU;
}

static uint16_t
tenant_id16(const bm_pool_t *pool, uint32_t idx)
{
    uint32_t id = idx < pool->n_tenants ? pool->tenants[idx].id : BM_MAP_NO_TENANT;

    return id >= BM_MAP_NO_TENANT ? (uint16_t)(BM_MAP_NO_TENANT - 1) : (uint16_t)id;
}

static void
cell_of(const bm_pool_t *pool, const bm_tier_t *t, const bm_block_t *b, bm_map_cell_t *c)
{
    c->pad = 0;
    c->ref = b->ref;
    if (b->id < t->first) {
        c->state = BM_MAP_NULL;
        c->tenant = BM_MAP_NO_TENANT;
    } else if (b->ref > 0) {
        c->state = BM_MAP_USED;
        c->tenant = tenant_id16(pool, b->tref0.tenant);
    } else if (b->cached) {
        c->state = BM_MAP_CACHED;
        c->tenant = tenant_id16(pool, b->tref0.tenant);
    } else {
        c->state = BM_MAP_FREE;
        c->tenant = BM_MAP_NO_TENANT;
    }
}

uint32_t
bm_map_tier_blocks(const bm_pool_t *pool, int tier)
{
    return tier_ok(tier) ? pool->tier[tier].n_blocks : 0;
}

void
bm_map_tier(const bm_pool_t *pool, int tier, uint8_t *state, uint16_t *tenant, uint32_t *ref)
{
    if (!tier_ok(tier)) {
        return;
    }
    const bm_tier_t *t = &pool->tier[tier];
    for (uint32_t id = 0; id < t->n_blocks; id++) {
        bm_map_cell_t c;
        cell_of(pool, t, &t->blocks[id], &c);
        state[id] = c.state;
        tenant[id] = c.tenant;
        ref[id] = c.ref;
    }
}

uint32_t
bm_map_seqs_size(const bm_pool_t *pool, uint32_t max_seqs, uint32_t *n_seqs, uint32_t *n_blocks)
{
    uint32_t n = 0, nb = 0;

    for (uint32_t i = 0; i <= pool->seq_mask && n < max_seqs; i++) {
        for (const bm_seq_t *s = pool->seq_buckets[i]; s != NULL && n < max_seqs; s = s->next) {
            nb += s->n_blocks;
            n++;
        }
    }
    *n_seqs = n;
    *n_blocks = nb;
    return pool->n_seqs;
}

uint32_t
bm_map_seqs(const bm_pool_t *pool, uint32_t max_seqs, bm_map_seq_t *out, int32_t *blocks)
{
    uint32_t n = 0, nb = 0;

    for (uint32_t i = 0; i <= pool->seq_mask && n < max_seqs; i++) {
        for (const bm_seq_t *s = pool->seq_buckets[i]; s != NULL && n < max_seqs; s = s->next) {
            bm_map_seq_t *o = &out[n++];
            o->id = s->id;
            o->tenant = pool->tenants[s->tenant].id;
            o->n_tokens = s->len;
            o->n_blocks = s->n_blocks;
            o->first = nb;
            o->swapped = (uint8_t)(s->swapped != 0);
            if (s->n_blocks > 0) {
                memcpy(blocks + nb, s->table, (size_t)s->n_blocks * sizeof(*blocks));
            }
            nb += s->n_blocks;
        }
    }
    return n;
}

int
bm_map_block(const bm_pool_t *pool, int tier, uint32_t id, bm_map_block_t *out)
{
    if (!tier_ok(tier) || id >= pool->tier[tier].n_blocks) {
        return ST_EINVAL;
    }
    const bm_tier_t *t = &pool->tier[tier];
    const bm_block_t *b = &t->blocks[id];

    memset(out, 0, sizeof(*out));
    cell_of(pool, t, b, &out->cell);
    out->hashed = b->hashed;
    if (b->hashed) {
        memcpy(out->hash, b->hash, BM_HASH_LEN);
    }
    return ST_OK;
}

/* The index in s's table of block id of the tier, or -1. Released leading
 * entries (block 0) never match. */
static int64_t
seq_index_of(const bm_seq_t *s, int tier, uint32_t id)
{
    if ((tier == BM_CPU) != (s->swapped != 0)) {
        return -1;
    }
    for (uint32_t k = s->n_released; k < s->n_blocks; k++) {
        if ((uint32_t)s->table[k] == id) {
            return k;
        }
    }
    return -1;
}

uint32_t
bm_map_block_holders(const bm_pool_t *pool, int tier, uint32_t id, uint64_t *seqs,
                     uint32_t *tenants, uint32_t max)
{
    uint32_t n = 0;

    if (!tier_ok(tier) || id >= pool->tier[tier].n_blocks ||
        pool->tier[tier].blocks[id].ref == 0) {
        return 0;
    }
    for (uint32_t i = 0; i <= pool->seq_mask; i++) {
        for (const bm_seq_t *s = pool->seq_buckets[i]; s != NULL; s = s->next) {
            if (seq_index_of(s, tier, id) < 0) {
                continue;
            }
            if (n < max) {
                seqs[n] = s->id;
                if (tenants != NULL) {
                    tenants[n] = pool->tenants[s->tenant].id;
                }
            }
            n++;
        }
    }
    return n;
}

uint32_t
bm_map_block_tokens_of_seq(const bm_pool_t *pool, uint64_t seq, int tier, uint32_t id,
                           int32_t *out)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);
    int64_t k;
    uint64_t start, end;

    if (s == NULL || !tier_ok(tier) || (k = seq_index_of(s, tier, id)) < 0) {
        return 0;
    }
    start = (uint64_t)k * pool->bs;
    end = start + pool->bs < s->len ? start + pool->bs : s->len;
    if (end <= start) {
        return 0;
    }
    memcpy(out, s->toks + start, (size_t)(end - start) * sizeof(*out));
    return (uint32_t)(end - start);
}

uint32_t
bm_map_block_tokens_cached(const bm_pool_t *pool, int tier, uint32_t id, int32_t *out)
{
    if (!tier_ok(tier) || id >= pool->tier[tier].n_blocks || pool->ev[tier].toks == NULL ||
        !pool->tier[tier].blocks[id].hashed) {
        return 0;
    }
    memcpy(out, pool->ev[tier].toks + (size_t)id * pool->bs, (size_t)pool->bs * sizeof(*out));
    return pool->bs;
}

int
bm_map_same_salt(const bm_pool_t *pool, uint32_t a, uint32_t b)
{
    const bm_tenant_t *ta = NULL, *tb = NULL;

    for (uint32_t i = 0; i < pool->n_tenants; i++) {
        if (pool->tenants[i].id == a) {
            ta = &pool->tenants[i];
        }
        if (pool->tenants[i].id == b) {
            tb = &pool->tenants[i];
        }
    }
    return ta != NULL && tb != NULL && ta->salt_len == tb->salt_len &&
           memcmp(ta->salt, tb->salt, ta->salt_len) == 0;
}

void
bm_pool_keep_tokens(bm_pool_t *pool)
{
    for (int t = 0; t < 2; t++) {
        bm_ev_tier_t *e = &pool->ev[t];
        uint32_t n = pool->tier[t].n_blocks;

        if (e->toks == NULL && n > 0) {
            e->toks = xcalloc((size_t)n * pool->bs, sizeof(*e->toks));
            e->parent = xcalloc((size_t)n, BM_HASH_LEN);
            e->has_parent = xcalloc((size_t)n, 1);
        }
    }
}
