/* bm_events.c - KV-cache events: the hook of bm_events.h and the records
 * (token ids, parent hash) that STORED events carry.
 *
 * DESIGN
 *   bm_hash.c's bm__ht_insert / bm__ht_remove are the only places a hash
 *   becomes or stops being registered, and they call bm__ev_registered,
 *   so no path that changes the prefix cache can skip its event. A block
 *   gets its content either by sealing (bm__ev_seal, from the sequence's
 *   tokens) or as a copy of another block (bm__ev_copy: demotion,
 *   promotion, swap out / in); blockmgr.c calls these before registering,
 *   so the record is in place when the STORED event reads it.
 *
 * Thread: engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/xmalloc.h"

static int
tier_of(const bm_pool_t *pool, const bm_tier_t *t)
{
    return t == &pool->tier[BM_CPU] ? BM_CPU : BM_DEV;
}

void
bm_pool_set_event_hook(bm_pool_t *pool, bm_event_cb cb, void *arg)
{
    pool->ev_cb = cb;
    pool->ev_arg = arg;
    for (int t = 0; t < 2; t++) {
        bm_ev_tier_t *e = &pool->ev[t];
        uint32_t n = pool->tier[t].n_blocks;

        if (cb != NULL && e->toks == NULL && n > 0) {
            e->toks = xcalloc((size_t)n * pool->bs, sizeof(*e->toks));
            e->parent = xcalloc((size_t)n, BM_HASH_LEN);
            e->has_parent = xcalloc((size_t)n, 1);
        }
        pool->tier[t].ev_pool = cb != NULL ? pool : NULL;
    }
}

void
bm__ev_fini(bm_pool_t *pool)
{
    for (int t = 0; t < 2; t++) {
        free(pool->ev[t].toks);
        free(pool->ev[t].parent);
        free(pool->ev[t].has_parent);
        memset(&pool->ev[t], 0, sizeof(pool->ev[t]));
    }
}

void
bm__ev_seal(bm_pool_t *pool, const bm_block_t *b, const uint8_t *parent, const int32_t *toks)
{
    bm_ev_tier_t *e = &pool->ev[BM_DEV];

    if (e->toks == NULL) {
        return; /* records kept only with a hook or bm_pool_keep_tokens (bm_map.h) */
    }
    memcpy(e->toks + (size_t)b->id * pool->bs, toks, (size_t)pool->bs * sizeof(*toks));
    e->has_parent[b->id] = parent != NULL;
    if (parent != NULL) {
        memcpy(e->parent + (size_t)b->id * BM_HASH_LEN, parent, BM_HASH_LEN);
    }
}

void
bm__ev_copy(bm_pool_t *pool, int dtier, const bm_block_t *dst, int stier, const bm_block_t *src)
{
    bm_ev_tier_t *d = &pool->ev[dtier];
    const bm_ev_tier_t *s = &pool->ev[stier];

    if (d->toks == NULL || s->toks == NULL) {
        return;
    }
    memcpy(d->toks + (size_t)dst->id * pool->bs, s->toks + (size_t)src->id * pool->bs,
           (size_t)pool->bs * sizeof(*d->toks));
    d->has_parent[dst->id] = s->has_parent[src->id];
    memcpy(d->parent + (size_t)dst->id * BM_HASH_LEN, s->parent + (size_t)src->id * BM_HASH_LEN,
           BM_HASH_LEN);
}

void
bm__ev_registered(bm_tier_t *t, const bm_block_t *b, int stored)
{
    bm_pool_t *pool = t->ev_pool;
    bm_event_t ev;

    if (pool == NULL || pool->ev_cb == NULL) {
        return;
    }
    int tier = tier_of(pool, t);
    const bm_ev_tier_t *e = &pool->ev[tier];

    memset(&ev, 0, sizeof(ev));
    ev.kind = stored ? BM_EVENT_STORED : BM_EVENT_REMOVED;
    ev.medium = tier == BM_CPU ? BM_MEDIUM_CPU : BM_MEDIUM_DEVICE;
    ev.hash = b->hash;
    if (stored) {
        ev.parent = e->has_parent[b->id] ? e->parent + (size_t)b->id * BM_HASH_LEN : NULL;
        ev.tokens = e->toks + (size_t)b->id * pool->bs;
        ev.n_tokens = pool->bs;
    }
    pool->ev_cb(pool->ev_arg, &ev);
}

void
bm__ev_reset(bm_pool_t *pool)
{
    bm_event_t ev;

    if (pool->ev_cb == NULL || pool->tier[BM_DEV].n_registered != 0 ||
        pool->tier[BM_CPU].n_registered != 0) {
        return;
    }
    memset(&ev, 0, sizeof(ev));
    ev.kind = BM_EVENT_CLEARED;
    pool->ev_cb(pool->ev_arg, &ev);
}
