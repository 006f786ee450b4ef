/* engine_int.h - engine internals for tests and the offline benchmark.
 *
 * eng__iterate() runs one iteration of the engine loop on the calling
 * thread (instead of engine_start), so tests can drive the engine step by
 * step and look at the scheduler and block manager in between.
 *
 * Thread: the thread that drives the engine; never together with
 * engine_start().
 */
#ifndef SCHEDULER_ENGINE_INT_H
#define SCHEDULER_ENGINE_INT_H

#include "blockmgr/blockmgr.h"
#include "scheduler/engine.h"
#include "scheduler/sched.h"

/* One loop iteration: take the inbox (waiting up to wait_ms when there is
 * nothing to run; < 0 forever), apply the messages, then plan, run the
 * queued block ops, forward, sample and commit. Returns 1 when a step ran
 * a forward pass, 0 when it did not, ST_ESHUTDOWN after SHUTDOWN. */
int eng__iterate(engine_t *e, int wait_ms);

/* Borrowed views of the engine's scheduler and pool, and its draft
 * model (scheduler/spec_draft.h; NULL without one). */
sched_t *eng__sched(engine_t *e);
bm_pool_t *eng__pool(engine_t *e);
struct spec_draft *eng__draft(engine_t *e);
/* Fills st as a STATS message would. */
void eng__stats(engine_t *e, eng_stats_t *st);

#endif /* SCHEDULER_ENGINE_INT_H */
