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
    s->wrote_epoch = s->taint_epoch = pool->epoch;
}

void
bm__step_taint(const bm_pool_t *pool, bm_seq_t *s)
{
    s->taint_epoch = pool->epoch;
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
