/* bm_memo.h - a token prefix's block hashes, computed once and reused by
 * every sequence that holds that prefix (issue 15).
 *
 * DESIGN
 *   A prompt's full blocks used to be hashed (SHA-256) by the admission
 *   probe, again by the lookup, again when a prefill chunk sealed them,
 *   and all over again each time the request was retried or recomputed
 *   after a preemption. A memo keeps those hashes for the caller (the
 *   scheduler: one per request, shared by its n choices) and blockmgr
 *   fills it in order, the first time each block's hash is needed:
 *
 *     bm_prefix_probe_memo    hashes a block only past memo->n, then keeps it
 *     bm_seq_set_memo         the sequence's lookup and seals of blocks
 *                             0 .. cap-1 read the memo (or fill it)
 *
 *   The hashes depend on the tokens, the tenant's salt and the extra key:
 *   the memo records the salt and key it was filled under and starts over
 *   (n = 0) when used under others. The tokens are the caller's promise:
 *   a sequence with a memo holds the memo's prefix in its blocks
 *   0 .. cap-1 (prompt blocks never change; a truncate or token change
 *   below that detaches the memo from the sequence). A fork inherits the
 *   memo; bm_seq_free forgets it; the memo must outlive its sequences.
 *
 * Memory: one allocation per memo (bm_memo_create: the record and 32
 * bytes per full block of the prefix), fallible; none for a prefix
 * without a full block. Out of the caller's record, so that a request
 * record stays small (the scheduler walks thousands per step).
 *
 * Thread: engine thread only (like every blockmgr call).
 */
#ifndef BLOCKMGR_BM_MEMO_H
#define BLOCKMGR_BM_MEMO_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"

typedef struct bm_hash_memo {
    uint32_t cap; /* full blocks of the prefix */
    uint32_t n;   /* hashes known, filled in order */
    /* What they were computed under (blockmgr's, set on first fill). */
    int keyed;
    uint32_t salt_len, extra_len;
    uint8_t salt[64], extra[64];
    uint8_t hash[][32]; /* [cap]: block i's hash for i < n */
} bm_hash_memo_t;

/* A memo for the hashes of the full blocks of an n_tokens prefix in
 * blocks of block_size tokens: ST_OK and *out (NULL when the prefix has
 * no full block: nothing to keep), or ST_ENOMEM. */
int bm_memo_create(uint32_t n_tokens, uint32_t block_size, bm_hash_memo_t **out);
/* NULL is a no-op. */
void bm_memo_destroy(bm_hash_memo_t *m);

/* Attaches memo to seq (NULL detaches): see DESIGN. ST_EINVAL for an
 * unknown seq. */
int bm_seq_set_memo(bm_pool_t *pool, uint64_t seq, bm_hash_memo_t *memo);

/* bm_prefix_probe() that takes the hashes of blocks below memo->n from
 * memo and keeps the ones it computes in order (memo NULL: the probe). */
uint32_t bm_prefix_probe_memo(const bm_pool_t *pool, uint32_t tenant, const int32_t *tokens,
                              uint32_t n, bm_hash_memo_t *memo);

/* Test hook: block hashes computed by the pool since its creation. */
uint64_t bm_pool_hash_calls(const bm_pool_t *pool);

#endif /* BLOCKMGR_BM_MEMO_H */
