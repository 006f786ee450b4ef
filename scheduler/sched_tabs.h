/* sched_tabs.h - the step's block tables as persistent rows, sent as the
 * entries that changed (issue 15; vLLM v1 keeps its block table the same
 * way).
 *
 * DESIGN
 *   Rebuilding every running sequence's whole table into the batch each
 *   step (and zero-padding it to the step's widest) cost O(sum of table
 *   lengths) per step, growing with context and batch. Instead each
 *   running sequence holds one row of a persistent [max_num_seqs]
 *   [max_blocks_per_seq] array from the step it is first planned until it
 *   stops running (finished, preempted, swapped out); sched_tabs_sync
 *   copies into its row only the entries blockmgr says changed since the
 *   last sync (blockmgr/bm_delta.h: appends, and on the rare rewrites --
 *   copy-on-write, swap, window release, eviction, compaction, truncation
 *   -- from the first rewritten entry), and records them as one dirty run.
 *   A row newly taken is sent whole. The batch (model.h, table_rows) then
 *   names each sequence's row; the runtime checks the dirty runs only, and
 *   a device backend may mirror the rows the same way.
 *
 *   Cost per step: O(rows planned + entries changed). Test hook: with
 *   check set (sched_config_t.check_tables, or KVSERVE_TEST_CHECK_TABLES
 *   in the environment), every planned row is compared with blockmgr's
 *   table each step (CHECK).
 *
 * Thread: engine thread (the scheduler's).
 */
#ifndef SCHEDULER_SCHED_TABS_H
#define SCHEDULER_SCHED_TABS_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"
#include "model/model.h"

typedef struct sched_tabs {
    int32_t n_rows, stride;
    int32_t *tab;           /* [n_rows][stride] */
    int32_t *free_rows;     /* [n_rows] stack of rows no sequence holds */
    int32_t n_free;
    mdl_table_run_t *dirty; /* [n_rows] this step's runs, one per row at most */
    int32_t n_dirty;
    int check;              /* compare each synced row with blockmgr's table */
} sched_tabs_t;

/* n_rows rows of stride entries, every row free. Aborts without memory
 * (scheduler creation). */
void sched_tabs_init(sched_tabs_t *t, int32_t n_rows, int32_t stride, int check);
void sched_tabs_fini(sched_tabs_t *t);
/* The start of a step's batch: no dirty run yet. */
void sched_tabs_begin(sched_tabs_t *t);
/* Brings the row of blockmgr sequence seq up to date for this step's
 * batch and returns it: *slot is the sequence's row + 1 (0: none yet, then
 * a free row is taken and sent whole). */
int32_t sched_tabs_sync(sched_tabs_t *t, bm_pool_t *pool, uint64_t seq, int32_t *slot);
/* The sequence of *slot stopped running: its row is free again. */
void sched_tabs_release(sched_tabs_t *t, int32_t *slot);

#endif /* SCHEDULER_SCHED_TABS_H */
