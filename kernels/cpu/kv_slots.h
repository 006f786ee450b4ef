/* kv_slots.h - which residual slot holds which KV block: the bookkeeping
 * of the blocks being filled under a quantized KV cache, shared by the
 * CPU store (kernels/cpu/kv_quant.c) and the CUDA backend's host side
 * (model/dev_fwd.c), which must assign, reuse and flush slots alike.
 *
 * DESIGN. A block of a scaled format (int8, int4, fp8) keeps its rows in
 * full precision in a residual slot until it is full, then is quantized
 * (KIVI). There are fewer slots than blocks. This module maps blocks to
 * slots and back, keeps the free slots on a stack (the lowest slot number
 * is taken first from a fresh table) and picks the least recently written
 * slot when the owner must free one by flushing it. What a slot holds and
 * how a flush quantizes it is the owner's business:
 *
 *   kn_kvslots_take(blk)        free slot -> bound to blk, fill 0, stamped
 *   kn_kvslots_release(blk)     bound -> free (no-op when blk has none)
 *   kn_kvslots_lru(avoid, g)    the slot a full table should flush
 *
 * The owner reads every field, and updates slot_fill and slot_used of a
 * bound slot itself (rows written, last-write stamp from its own counter);
 * binding and freeing go through the functions.
 *
 * Thread: the owner's (the engine thread, or a tensor-parallel rank's).
 */
#ifndef KERNELS_CPU_KV_SLOTS_H
#define KERNELS_CPU_KV_SLOTS_H

#include <stdint.h>

typedef struct kn_kvslots {
    int32_t n_blocks;
    int32_t n_slots;
    int32_t *slot_of;    /* [n_blocks] bound slot or -1 */
    int32_t *slot_blk;   /* [n_slots] owner block or -1 */
    int32_t *slot_fill;  /* [n_slots] rows written (max offset + 1) */
    uint64_t *slot_used; /* [n_slots] stamp of the last write (LRU flush order) */
    int32_t *free_slots; /* [n_slots] stack of free slots, n_free deep */
    int32_t n_free;
} kn_kvslots_t;

/* n_blocks blocks (>= 0), none bound, and n_slots free slots (>= 0).
 * Aborts when out of memory (xmalloc). */
void kn_kvslots_init(kn_kvslots_t *t, int32_t n_blocks, int32_t n_slots);
/* Frees the arrays and zeroes *t; a zeroed *t is a no-op. */
void kn_kvslots_fini(kn_kvslots_t *t);

/* Binds a free slot to blk, which has none (CHECKed, as is n_free > 0),
 * with fill 0 and last write `stamp`; returns it. */
int32_t kn_kvslots_take(kn_kvslots_t *t, int32_t blk, uint64_t stamp);
/* Frees blk's slot; blk without one is a no-op. */
void kn_kvslots_release(kn_kvslots_t *t, int32_t blk);
/* The bound slot, other than `avoid`, with the lowest stamp not above
 * `guard` (the first such slot on ties); -1 if none. */
int32_t kn_kvslots_lru(const kn_kvslots_t *t, int32_t avoid, uint64_t guard);

/* Aborts unless slot_of and slot_blk are inverse and the free stack holds
 * exactly the unbound slots. O(n_blocks + n_slots). */
void kn_kvslots_check(const kn_kvslots_t *t);

#endif /* KERNELS_CPU_KV_SLOTS_H */
