/* bm_events.h - what the prefix cache gains and loses, as a callback.
 *
 * A router that scores replicas by the prefix blocks they hold (llm-d's
 * precise prefix-cache scorer) follows each replica's cache through
 * vLLM-style KV-cache events. blockmgr reports them here and knows
 * nothing more: the engine's hook copies each event into a bounded queue
 * and a publisher thread (scheduler/kv_events.h) puts it on the wire.
 *
 * DESIGN
 *   An event follows the registration of a hash in a tier's hash table
 *   (blockmgr_int.h): STORED when a full block's hash becomes registered
 *   on a medium (a block filled and sealed, a re-registration on release,
 *   a promotion, a demotion or swap-out copy to the CPU tier, a swap-in),
 *   REMOVED when it stops being registered (eviction, reset, a block made
 *   mutable again by truncation). So the set of (hash, medium) pairs a
 *   subscriber builds from the events is exactly the set of registered
 *   hashes, which at rest (no request running) is the set of CACHED blocks
 *   that /metrics counts per tier. CLEARED follows
 *   bm_pool_reset_prefix_cache() when no hash is left registered on any
 *   tier (it then comes after that reset's REMOVED events).
 *
 *   STORED carries the block's parent hash (NULL for a sequence's first
 *   block) and its block_size token ids, so a router can recompute its own
 *   keys; the hash itself is bm_hash.c's chain (see there and README
 *   "Scaling out"). With a hook set, the pool keeps each block's token ids
 *   and parent hash beside it (allocated by the setter) for the events of
 *   re-registrations.
 *
 * Thread: engine thread only (the callback runs on it, inside blockmgr
 * calls: it must not call back into blockmgr nor block).
 */
#ifndef BLOCKMGR_BM_EVENTS_H
#define BLOCKMGR_BM_EVENTS_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"

typedef enum bm_event_kind {
    BM_EVENT_STORED = 1,
    BM_EVENT_REMOVED,
    BM_EVENT_CLEARED,
} bm_event_kind_t;

typedef enum bm_medium {
    BM_MEDIUM_DEVICE = 0, /* "GPU" on the wire (vLLM's name for the device tier) */
    BM_MEDIUM_CPU = 1,    /* "CPU": the swap / demotion tier */
} bm_medium_t;

#define BM_EVENT_HASH_LEN 32

typedef struct bm_event {
    int kind;              /* bm_event_kind_t */
    int medium;            /* bm_medium_t; unused for CLEARED */
    const uint8_t *hash;   /* [BM_EVENT_HASH_LEN]; NULL for CLEARED */
    const uint8_t *parent; /* STORED: the parent block's hash, NULL for a first block */
    const int32_t *tokens; /* STORED: [n_tokens] token ids of the block */
    uint32_t n_tokens;     /* STORED: the block size */
} bm_event_t;

/* Every pointer in ev is borrowed for the duration of the call. */
typedef void (*bm_event_cb)(void *arg, const bm_event_t *ev);

/* Sets (cb not NULL) or clears the pool's event hook. Set it before the
 * first sequence is created: events are reported for registrations made
 * from then on. Allocates the per-block token and parent records (the
 * aborting family, once). Engine thread. */
void bm_pool_set_event_hook(bm_pool_t *pool, bm_event_cb cb, void *arg);

#endif /* BLOCKMGR_BM_EVENTS_H */
