/* sched_tabs.c - the step's block tables as persistent rows sent as their
 * changes (sched_tabs.h).
 *
 * Thread: engine thread.
 */
#include "scheduler/sched_tabs.h"

#include <stdlib.h>
#include <string.h>

#include "blockmgr/bm_delta.h"
#include "common/status.h"
#include "common/xmalloc.h"

void
sched_tabs_init(sched_tabs_t *t, int32_t n_rows, int32_t stride, int check)
{
    memset(t, 0, sizeof(*t));
    t->n_rows = n_rows;
    t->stride = stride;
    t->tab = xcalloc((size_t)n_rows * (size_t)stride, sizeof(int32_t));
    t->free_rows = xcalloc((size_t)n_rows, sizeof(int32_t));
    t->dirty = xcalloc((size_t)n_rows, sizeof(*t->dirty));
    /* Lowest rows on top: a small batch keeps to the first rows. */
    for (int32_t r = 0; r < n_rows; r++) {
        t->free_rows[r] = n_rows - 1 - r;
    }
    t->n_free = n_rows;
    t->check = check;
}

void
sched_tabs_fini(sched_tabs_t *t)
{
    free(t->tab);
    free(t->free_rows);
    free(t->dirty);
    memset(t, 0, sizeof(*t));
}

void
sched_tabs_begin(sched_tabs_t *t)
{
    t->n_dirty = 0;
}

int32_t
sched_tabs_sync(sched_tabs_t *t, bm_pool_t *pool, uint64_t seq, int32_t *slot)
{
    uint32_t nb = 0, from = 0;
    const int32_t *src = bm_seq_table_delta(pool, seq, &nb, &from);
    int32_t row;

    CHECK(src != NULL && (int32_t)nb <= t->stride);
    if (*slot == 0) {
        CHECK(t->n_free > 0); /* a running sequence per row at most */
        row = t->free_rows[--t->n_free];
        *slot = row + 1;
        from = 0; /* whatever the row held was another sequence's */
    } else {
        row = *slot - 1;
    }
    int32_t *dst = t->tab + (size_t)row * (size_t)t->stride;
    if (from < nb) {
        memcpy(dst + from, src + from, (size_t)(nb - from) * sizeof(int32_t));
        CHECK(t->n_dirty < t->n_rows);
        t->dirty[t->n_dirty++] =
            (mdl_table_run_t){.row = row, .first = (int32_t)from, .count = (int32_t)(nb - from)};
    }
    if (t->check) {
        /* Test hook: the delta-built row equals the table rebuilt whole. */
        const int32_t *full = bm_seq_table(pool, seq, &nb);
        CHECK(memcmp(dst, full, (size_t)nb * sizeof(int32_t)) == 0);
    }
    return row;
}

void
sched_tabs_release(sched_tabs_t *t, int32_t *slot)
{
    if (*slot == 0) {
        return;
    }
    CHECK(t->n_free < t->n_rows);
    t->free_rows[t->n_free++] = *slot - 1;
    *slot = 0;
}
