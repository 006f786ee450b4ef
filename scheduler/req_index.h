/* req_index.h - the scheduler's request ids -> live request map.
 *
 * DESIGN. sched_submit checks that an id is not already open and
 * sched_cancel finds the request by id; a list walk made both O(live
 * requests), so a burst of submits cost O(n^2) (issue 15). This is an
 * open-addressing table (linear probing, backward-shift deletion, no
 * tombstones) kept at most half full. Growing is the only allocation and
 * is split out (ridx_reserve) so a caller can fail before it changes
 * anything; ridx_put after a successful reserve cannot fail.
 *
 * Thread: the engine thread (whoever owns the scheduler).
 */
#ifndef SCHEDULER_REQ_INDEX_H
#define SCHEDULER_REQ_INDEX_H

#include <stdint.h>

typedef struct ridx_slot {
    uint64_t id;
    void *val; /* NULL: empty */
} ridx_slot_t;

typedef struct ridx {
    ridx_slot_t *slots; /* [mask + 1], or NULL while empty */
    uint32_t mask;
    uint32_t n;
} ridx_t;

/* An empty index. */
void ridx_init(ridx_t *x);
/* An empty index with room for n entries, allocated at start-up (the
 * infallible xcalloc: a start-up failure is fatal anyway, and the
 * request path's allocation-failure injection must not hit it). */
void ridx_init_cap(ridx_t *x, uint32_t n);
/* Frees the table (not the values). NULL-safe for x->slots. */
void ridx_fini(ridx_t *x);
/* Makes room for n entries in all. ST_OK or ST_ENOMEM (nothing changed). */
int ridx_reserve(ridx_t *x, uint32_t n);
/* Adds id -> val (val != NULL, id not present). Needs room from
 * ridx_reserve(x, x->n + 1); never fails then. */
void ridx_put(ridx_t *x, uint64_t id, void *val);
/* The value for id, or NULL. */
void *ridx_get(const ridx_t *x, uint64_t id);
/* Removes id if present. */
void ridx_del(ridx_t *x, uint64_t id);

#endif /* SCHEDULER_REQ_INDEX_H */
