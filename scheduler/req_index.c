/* req_index.c - request id map of the scheduler (scheduler/req_index.h).
 *
 * Thread: the engine thread.
 */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "scheduler/req_index.h"

static uint32_t
ridx_hash(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (uint32_t)id;
}

void
ridx_init(ridx_t *x)
{
    memset(x, 0, sizeof(*x));
}

void
ridx_init_cap(ridx_t *x, uint32_t n)
{
    uint32_t want = 16;

    memset(x, 0, sizeof(*x));
    while (want < n * 2) {
        want *= 2;
    }
    x->slots = xcalloc(want, sizeof(*x->slots));
    x->mask = want - 1;
}

void
ridx_fini(ridx_t *x)
{
    free(x->slots);
    memset(x, 0, sizeof(*x));
}

static void
ridx_insert(ridx_slot_t *slots, uint32_t mask, uint64_t id, void *val)
{
    uint32_t i = ridx_hash(id) & mask;

    while (slots[i].val != NULL) {
        i = (i + 1) & mask;
    }
    slots[i].id = id;
    slots[i].val = val;
}

int
ridx_reserve(ridx_t *x, uint32_t n)
{
    uint32_t cap = x->slots != NULL ? x->mask + 1 : 0;
    uint32_t want = 16;
    ridx_slot_t *ns;

    if ((uint64_t)n * 2 <= cap) {
        return ST_OK;
    }
    while ((uint64_t)want < (uint64_t)n * 2) {
        if (want > (1u << 30)) {
            return ST_ENOMEM;
        }
        want *= 2;
    }
    ns = xcalloc_try(want, sizeof(*ns));
    if (ns == NULL) {
        return ST_ENOMEM;
    }
    for (uint32_t i = 0; i < cap; i++) {
        if (x->slots[i].val != NULL) {
            ridx_insert(ns, want - 1, x->slots[i].id, x->slots[i].val);
        }
    }
    free(x->slots);
    x->slots = ns;
    x->mask = want - 1;
    return ST_OK;
}

void
ridx_put(ridx_t *x, uint64_t id, void *val)
{
    CHECK(val != NULL && x->slots != NULL && (uint64_t)(x->n + 1) * 2 <= (uint64_t)x->mask + 1);
    ridx_insert(x->slots, x->mask, id, val);
    x->n++;
}

void *
ridx_get(const ridx_t *x, uint64_t id)
{
    if (x->slots == NULL) {
        return NULL;
    }
    for (uint32_t i = ridx_hash(id) & x->mask;; i = (i + 1) & x->mask) {
        if (x->slots[i].val == NULL) {
            return NULL;
        }
        if (x->slots[i].id == id) {
            return x->slots[i].val;
        }
    }
}

void
ridx_del(ridx_t *x, uint64_t id)
{
    uint32_t i, j;

    if (x->slots == NULL) {
        return;
    }
    for (i = ridx_hash(id) & x->mask;; i = (i + 1) & x->mask) {
        if (x->slots[i].val == NULL) {
            return;
        }
        if (x->slots[i].id == id) {
            break;
        }
    }
    /* Backward shift: move later entries of the run into the hole when
     * their home slot does not lie cyclically in (i, j]. */
    j = i;
    for (;;) {
        j = (j + 1) & x->mask;
        if (x->slots[j].val == NULL) {
            break;
        }
        uint32_t home = ridx_hash(x->slots[j].id) & x->mask;
        int in_between = i <= j ? (home > i && home <= j) : (home > i || home <= j);

        if (!in_between) {
            x->slots[i] = x->slots[j];
            i = j;
        }
    }
    x->slots[i].val = NULL;
    x->slots[i].id = 0;
    x->n--;
}
