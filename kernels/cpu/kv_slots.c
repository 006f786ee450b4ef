/* kv_slots.c - residual slot bookkeeping of quantized KV blocks (kv_slots.h). */
#include "kernels/cpu/kv_slots.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"

void
kn_kvslots_init(kn_kvslots_t *t, int32_t n_blocks, int32_t n_slots)
{
    CHECK(n_blocks >= 0 && n_slots >= 0);
    t->n_blocks = n_blocks;
    t->n_slots = n_slots;
    t->slot_of = xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    t->slot_blk = xmalloc(sizeof(int32_t) * (size_t)n_slots);
    t->slot_fill = xcalloc((size_t)n_slots, sizeof(int32_t));
    t->slot_used = xcalloc((size_t)n_slots, sizeof(uint64_t));
    t->free_slots = xmalloc(sizeof(int32_t) * (size_t)n_slots);
    for (int32_t i = 0; i < n_blocks; i++) {
        t->slot_of[i] = -1;
    }
    /* Stack top is slot 0: a fresh table hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < n_slots; i++) {
        t->slot_blk[i] = -1;
        t->free_slots[i] = n_slots - 1 - i;
    }
    t->n_free = n_slots;
}

void
kn_kvslots_fini(kn_kvslots_t *t)
{
    free(t->slot_of);
    free(t->slot_blk);
    free(t->slot_fill);
    free(t->slot_used);
    free(t->free_slots);
    memset(t, 0, sizeof(*t));
}

int32_t
kn_kvslots_take(kn_kvslots_t *t, int32_t blk, uint64_t stamp)
{
    int32_t s;

    CHECK(t->n_free > 0 && t->slot_of[blk] < 0);
    s = t->free_slots[--t->n_free];
    t->slot_of[blk] = s;
    t->slot_blk[s] = blk;
    t->slot_fill[s] = 0;
    t->slot_used[s] = stamp;
    return s;
}

void
kn_kvslots_release(kn_kvslots_t *t, int32_t blk)
{
    int32_t s = t->slot_of[blk];

    if (s < 0) {
        return;
    }
    t->slot_of[blk] = -1;
    t->slot_blk[s] = -1;
    t->free_slots[t->n_free++] = s;
}

int32_t
kn_kvslots_lru(const kn_kvslots_t *t, int32_t avoid, uint64_t guard)
{
    int32_t victim = -1;

    for (int32_t i = 0; i < t->n_slots; i++) {
        if (i != avoid && t->slot_blk[i] >= 0 && t->slot_used[i] <= guard &&
            (victim < 0 || t->slot_used[i] < t->slot_used[victim])) {
            victim = i;
        }
    }
    return victim;
}

void
kn_kvslots_check(const kn_kvslots_t *t)
{
    int32_t bound = 0;
    uint8_t *seen = xcalloc((size_t)t->n_slots, 1);

    CHECK(t->n_free >= 0 && t->n_free <= t->n_slots);
    for (int32_t b = 0; b < t->n_blocks; b++) {
        int32_t s = t->slot_of[b];

        if (s >= 0) {
            CHECK(s < t->n_slots && t->slot_blk[s] == b);
            bound++;
        }
    }
    for (int32_t s = 0; s < t->n_slots; s++) {
        int32_t b = t->slot_blk[s];

        CHECK(b < t->n_blocks && (b < 0 || t->slot_of[b] == s));
    }
    CHECK(bound + t->n_free == t->n_slots);
    for (int32_t i = 0; i < t->n_free; i++) {
        int32_t s = t->free_slots[i];

        CHECK(s >= 0 && s < t->n_slots && t->slot_blk[s] < 0 && !seen[s]);
        seen[s] = 1;
    }
    free(seen);
}
