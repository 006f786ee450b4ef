/* bm_step.c - the step epoch of the block manager (blockmgr/blockmgr.h,
 * bm_pool_step_begin).
 *
 * DESIGN. The scheduler plans a step (reserve, lookup, fork, swap-in),
 * the forward writes and reads the planned slots, then the step commits.
 * Blocks are hashed at plan time, which is safe only while nothing frees,
 * truncates or swaps out a sequence that took blocks in the same step. Each
 * sequence carries the epoch of its last such call; bm_pool_step_begin
 * starts a new epoch, and the calls that would break the plan compare. Cost:
 * two stores per reserve, one compare per free, truncate or swap-out.
 *
 * bm_seq_unreserve takes a reservation back within its step (the
 * scheduler un-plans a preemption victim it had already planned): it
 * needs the length before the step's first reserve, and that nothing but
 * reserves touched the sequence in the step (a fork, lookup or swap-in
 * cannot be undone), so a reserve also records both.
 *
 * Thread: the pool's owner (the engine thread).
 */
#include <stdio.h>

#include "blockmgr/blockmgr_int.h"
#include "common/log.h"
#include "common/status.h"

void
bm_pool_step_begin(bm_pool_t *pool)
{
    pool->epoch++;
    pool->in_step = 1;
}

void
bm_pool_step_end(bm_pool_t *pool)
{
    pool->in_step = 0;
}

void
bm__step_wrote(const bm_pool_t *pool, bm_seq_t *s)
{
    s->wrote_epoch = s->taint_epoch = s->other_epoch = pool->epoch;
}

void
bm__step_taint(const bm_pool_t *pool, bm_seq_t *s)
{
    s->taint_epoch = s->other_epoch = pool->epoch;
}

void
bm__step_reserved(const bm_pool_t *pool, bm_seq_t *s, uint32_t n_new)
{
    if (s->resv_epoch != pool->epoch) {
        s->resv_epoch = pool->epoch;
        s->resv_len0 = s->len - n_new;
    }
    s->wrote_epoch = s->taint_epoch = pool->epoch;
}

int
bm_seq_unreserve(bm_pool_t *pool, uint64_t seq)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    bm_tier_t *dev = &pool->tier[BM_DEV];
    uint32_t bs = pool->bs, first, keep;

    if (s == NULL || s->swapped || !pool->in_step || s->resv_epoch != pool->epoch ||
        s->other_epoch == pool->epoch) {
        return ST_EINVAL;
    }
    first = s->resv_len0 / bs;
    keep = (s->resv_len0 + bs - 1) / bs;
    if (keep < s->n_released || (s->resv_len0 > 0 && keep == s->n_released)) {
        return ST_EINVAL; /* it would reach blocks the window gave back */
    }
    for (uint32_t i = first; i < s->n_blocks; i++) {
        if (bm__blk(pool, BM_DEV, (uint32_t)s->table[i])->ref != 1) {
            return ST_EINVAL; /* another sequence took it this step */
        }
    }
    /* Every block from `first` on got its last slot from this step's
     * reservation, so a hash it carries was made at plan time for bytes
     * that will now never be written: unregister it before anyone
     * looks it up. */
    for (uint32_t i = first; i < s->n_blocks; i++) {
        bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);
        if (b->cached) {
            bm__ht_remove(dev, b);
        }
        b->hashed = 0;
    }
    s->len = s->resv_len0;
    while (s->n_blocks > keep) {
        s->n_blocks--;
        bm__blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)s->table[s->n_blocks]),
                    s->tenant);
    }
    bm__tab_changed(s, s->n_blocks);
    s->wrote_epoch = s->taint_epoch = s->resv_epoch = 0;
    return ST_OK;
}

void
bm__step_check_free(const bm_pool_t *pool, const bm_seq_t *s)
{
    if (pool->in_step && s->wrote_epoch == pool->epoch) {
        fprintf(stderr, "blockmgr: sequence %llu freed in the step that reserved its blocks\n",
                (unsigned long long)s->id);
        CHECK(!"free of a sequence that reserved this step");
    }
}

void
bm__step_check_move(const bm_pool_t *pool, const bm_seq_t *s, const char *what)
{
    if (pool->in_step && s->taint_epoch == pool->epoch) {
        fprintf(stderr, "blockmgr: %s of sequence %llu in the step that wrote or read its blocks\n",
                what, (unsigned long long)s->id);
        CHECK(!"swap-out or truncate of a sequence that took blocks this step");
    }
}
