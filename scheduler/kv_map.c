/* kv_map.c - the engine side of the web console's admin queries
 * (kv_map.h): copies blockmgr's read-only view (blockmgr/bm_map.h) into
 * the reply, applies the token visibility rule, resets the prefix cache.
 *
 * DESIGN
 *   One fallible allocation per reply holds every array (the loop thread
 *   frees it with the message), sized from the pool before copying: a map
 *   is n_blocks * 7 bytes per tier plus at most ENG_KV_MAX_SEQS sequences
 *   and their tables. Nothing here formats text.
 *
 * Thread: engine thread only.
 */
#include "scheduler/kv_map.h"

#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_map.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"

#define ALIGN8(n) (((n) + 7u) & ~(size_t)7u)

static void
admin_map(eng_msg_admin_t *m, bm_pool_t *pool)
{
    bm_map_seq_t seqs[ENG_KV_MAX_SEQS];
    uint32_t n_seqs, n_tab, nb[2];
    size_t size = 0, off = 0;
    char *buf;

    nb[0] = bm_map_tier_blocks(pool, BM_MAP_DEVICE);
    nb[1] = bm_map_tier_blocks(pool, BM_MAP_CPU);
    m->n_seqs_total = bm_map_seqs_size(pool, ENG_KV_MAX_SEQS, &n_seqs, &n_tab);
    for (int t = 0; t < 2; t++) {
        size += ALIGN8((size_t)nb[t] * sizeof(uint32_t)) +
                ALIGN8((size_t)nb[t] * sizeof(uint16_t)) + ALIGN8(nb[t]);
    }
    size += (size_t)n_seqs * sizeof(eng_kv_seq_t) + ALIGN8((size_t)n_tab * sizeof(int32_t));
    buf = xmalloc_try(size > 0 ? size : 1);
    if (buf == NULL) {
        m->status = ST_ENOMEM;
        return;
    }
    m->buf = buf;
    /* Widest first, so every array stays aligned. */
    m->seqs = (eng_kv_seq_t *)buf;
    off += (size_t)n_seqs * sizeof(eng_kv_seq_t);
    for (int t = 0; t < 2; t++) {
        eng_kv_tier_t *o = &m->tiers[t];
        o->n_blocks = nb[t];
        o->ref = (uint32_t *)(buf + off);
        off += ALIGN8((size_t)nb[t] * sizeof(uint32_t));
    }
    m->seq_blocks = (int32_t *)(buf + off);
    off += ALIGN8((size_t)n_tab * sizeof(int32_t));
    for (int t = 0; t < 2; t++) {
        m->tiers[t].tenant = (uint16_t *)(buf + off);
        off += ALIGN8((size_t)nb[t] * sizeof(uint16_t));
    }
    for (int t = 0; t < 2; t++) {
        m->tiers[t].state = (uint8_t *)(buf + off);
        off += ALIGN8(nb[t]);
    }
    for (int t = 0; t < 2; t++) {
        bm_map_tier(pool, t, m->tiers[t].state, m->tiers[t].tenant, m->tiers[t].ref);
    }
    m->n_seqs = bm_map_seqs(pool, ENG_KV_MAX_SEQS, seqs, m->seq_blocks);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        m->seqs[i] = (eng_kv_seq_t){
            .id = seqs[i].id,
            .tenant = seqs[i].tenant,
            .n_tokens = seqs[i].n_tokens,
            .n_blocks = seqs[i].n_blocks,
            .first = seqs[i].first,
            .swapped = seqs[i].swapped,
        };
    }
    m->status = ST_OK;
}

static void
admin_block(eng_msg_admin_t *m, bm_pool_t *pool)
{
    eng_kv_block_t *o = &m->blk;
    bm_map_block_t b;
    uint32_t tenants[ENG_KV_MAX_HOLDERS];
    uint32_t bs = bm_pool_block_size(pool);
    uint32_t n_list;
    int64_t from = -1; /* the viewer's holder to take tokens from */

    if (bm_map_block(pool, m->tier, m->block, &b) != ST_OK) {
        m->status = ST_EINVAL;
        return;
    }
    memset(o, 0, sizeof(*o));
    o->state = b.cell.state;
    o->tenant = b.cell.tenant;
    o->ref = b.cell.ref;
    o->hashed = b.hashed;
    memcpy(o->hash, b.hash, sizeof(o->hash));
    o->n_holders = bm_map_block_holders(pool, m->tier, m->block, o->holders, tenants,
                                        ENG_KV_MAX_HOLDERS);
    n_list = o->n_holders < ENG_KV_MAX_HOLDERS ? o->n_holders : ENG_KV_MAX_HOLDERS;
    for (uint32_t i = 0; i < n_list && m->viewer >= 0; i++) {
        if (tenants[i] == (uint32_t)m->viewer) {
            from = (int64_t)i;
            break;
        }
    }
    m->status = ST_OK;
    if (o->state != BM_MAP_USED && o->state != BM_MAP_CACHED) {
        o->hidden = ENG_KV_NOTHING;
        return;
    }
    if (m->viewer < 0) {
        o->hidden = ENG_KV_NO_VIEWER;
        return;
    }
    if (o->state == BM_MAP_USED && from < 0) {
        o->hidden = ENG_KV_OTHER_TENANT;
        return;
    }
    if (o->state == BM_MAP_CACHED && !bm_map_same_salt(pool, o->tenant, (uint32_t)m->viewer)) {
        o->hidden = ENG_KV_OTHER_TENANT;
        return;
    }
    o->tokens = xmalloc_try((size_t)bs * sizeof(int32_t));
    if (o->tokens == NULL) {
        m->status = ST_ENOMEM;
        return;
    }
    m->buf = o->tokens;
    if (from >= 0) {
        o->n_tokens = (int32_t)bm_map_block_tokens_of_seq(pool, o->holders[from], m->tier,
                                                          m->block, o->tokens);
    } else {
        o->n_tokens = (int32_t)bm_map_block_tokens_cached(pool, m->tier, m->block, o->tokens);
    }
    o->hidden = o->n_tokens > 0 || from >= 0 ? ENG_KV_SHOWN : ENG_KV_NOT_KEPT;
}

static void
admin_reset(eng_msg_admin_t *m, bm_pool_t *pool)
{
    bm_stats_t before, after;

    bm_pool_stats(pool, &before);
    bm_pool_reset_prefix_cache(pool); /* with KV events on: REMOVED..., CLEARED */
    bm_pool_stats(pool, &after);
    m->blocks_freed =
        (before.dev_cached - after.dev_cached) + (before.cpu_cached - after.cpu_cached);
    m->status = ST_OK;
}

void
eng_kv_admin(eng_msg_admin_t *m, bm_pool_t *pool)
{
    uint64_t t0 = now_ns();

    m->buf = NULL;
    switch (m->op) {
    case ENG_ADMIN_MAP:
        admin_map(m, pool);
        break;
    case ENG_ADMIN_BLOCK:
        admin_block(m, pool);
        break;
    case ENG_ADMIN_RESET:
        admin_reset(m, pool);
        break;
    default:
        m->status = ST_EINVAL;
        break;
    }
    m->ns = now_ns() - t0;
}
