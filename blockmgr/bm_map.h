/* bm_map.h - a read-only view of the block pools, for the web console's KV
 * map (issue 19): every block's state, first tenant and refcount on both
 * tiers, the sequences and their block tables, and one block's holders,
 * hash and token ids.
 *
 * DESIGN
 *   blockmgr stays the only owner of block ids and never touches tensors:
 *   these calls only read its records and copy them into caller memory,
 *   one small fixed-size record per block (state, tenant, refcount: 7 bytes), so a
 *   snapshot of 100,000 blocks is one linear pass with no allocation
 *   (blockmgr/bench_blockmgr.c measures it). The caller (the engine
 *   thread, at a step boundary: scheduler/kv_map.h) sizes the buffers.
 *
 *   Tenant of a block: the first tenant record of a USED block (a tenant
 *   that holds it now); for a CACHED block, the tenant whose sequence last
 *   released it (a demoted block keeps it), since the prefix cache keys a
 *   block by that tenant's salt; none for FREE blocks.
 *
 *   Token ids: a sequence's own tokens cover every block of its table
 *   (partly filled ones too). A CACHED block no sequence holds has token
 *   ids only when the pool keeps per-block records: with an event hook
 *   (bm_events.h) or after bm_pool_keep_tokens(). Whether a viewer may see
 *   them is the caller's policy; blockmgr only answers bm_map_same_salt().
 *
 * Thread: engine thread only (like every blockmgr call).
 */
#ifndef BLOCKMGR_BM_MAP_H
#define BLOCKMGR_BM_MAP_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"

enum { BM_MAP_DEVICE = 0, BM_MAP_CPU = 1 };

/* Block states as one character each (what the map's JSON prints). */
#define BM_MAP_FREE 'f'
#define BM_MAP_CACHED 'c'
#define BM_MAP_USED 'u'
#define BM_MAP_NULL 'n' /* device block 0: never handed out */

#define BM_MAP_NO_TENANT 0xffffu /* FREE and null blocks; ids >= 0xffff read 0xfffe */

typedef struct bm_map_cell {
    uint8_t state;   /* BM_MAP_* */
    uint8_t pad;
    uint16_t tenant; /* blockmgr tenant id (the engine's tenant index), or BM_MAP_NO_TENANT */
    uint32_t ref;    /* block-table entries naming the block */
} bm_map_cell_t;

typedef struct bm_map_seq {
    uint64_t id;       /* blockmgr sequence id */
    uint32_t tenant;   /* tenant id */
    uint32_t n_tokens; /* tokens with KV */
    uint32_t n_blocks; /* table entries, released ones (block 0) included */
    uint32_t first;    /* offset of its table in the caller's block array */
    uint8_t swapped;   /* its table names CPU-tier blocks */
} bm_map_seq_t;

typedef struct bm_map_block {
    bm_map_cell_t cell;
    uint8_t hashed; /* hash[] holds the content hash of this full block */
    uint8_t hash[32];
} bm_map_block_t;

/* Blocks of a tier (device: including the null block 0), 0 for an
 * unknown tier. */
uint32_t bm_map_tier_blocks(const bm_pool_t *pool, int tier);

/* Writes every block of the tier, index = block id in [0,
 * bm_map_tier_blocks): its state character, tenant and refcount (the
 * fields of bm_map_cell_t, as three arrays so the state array is the
 * map's state string as it is). Cannot fail; an unknown tier writes
 * nothing. */
void bm_map_tier(const bm_pool_t *pool, int tier, uint8_t *state, uint16_t *tenant,
                 uint32_t *ref);

/* How much the first max_seqs sequences (in the pool's internal order)
 * need: *n_seqs of them (<= max_seqs) with *n_blocks table entries in all.
 * Returns the total number of sequences. */
uint32_t bm_map_seqs_size(const bm_pool_t *pool, uint32_t max_seqs, uint32_t *n_seqs,
                          uint32_t *n_blocks);
/* Fills out[0..n) and their tables into blocks, for the sequences that
 * bm_map_seqs_size counted with the same max_seqs (the pool unchanged in
 * between); blocks has room for its *n_blocks. Returns n. */
uint32_t bm_map_seqs(const bm_pool_t *pool, uint32_t max_seqs, bm_map_seq_t *out,
                     int32_t *blocks);

/* One block: ST_OK and *out, or ST_EINVAL for an unknown tier or an id out
 * of range. */
int bm_map_block(const bm_pool_t *pool, int tier, uint32_t id, bm_map_block_t *out);

/* The sequences holding block id of the tier (their tables name it; a
 * swapped sequence holds CPU-tier blocks): up to max ids and their tenants
 * (tenants may be NULL). Returns how many there are in all. */
uint32_t bm_map_block_holders(const bm_pool_t *pool, int tier, uint32_t id, uint64_t *seqs,
                              uint32_t *tenants, uint32_t max);

/* Token ids of block id (of the tier) in sequence seq's table: writes up to
 * block_size ids to out and returns how many (the last block may be part
 * filled); 0 when seq does not hold the block. */
uint32_t bm_map_block_tokens_of_seq(const bm_pool_t *pool, uint64_t seq, int tier, uint32_t id,
                                    int32_t *out);

/* Token ids of a hashed block from the pool's per-block records (a CACHED
 * block no sequence holds): block_size ids into out, or 0 when the block
 * is not hashed or the pool keeps no records. */
uint32_t bm_map_block_tokens_cached(const bm_pool_t *pool, int tier, uint32_t id, int32_t *out);

/* 1 when tenants a and b have the same prefix-cache salt (so they share
 * cached blocks), else 0 (also for a tenant the pool has not seen). */
int bm_map_same_salt(const bm_pool_t *pool, uint32_t a, uint32_t b);

/* Keeps each hashed block's token ids (and parent hash) beside it from now
 * on, as an event hook does, so bm_map_block_tokens_cached() can answer.
 * Costs block_size * 4 + 33 bytes per block of both tiers, allocated here
 * (the aborting family, once; start-up). */
void bm_pool_keep_tokens(bm_pool_t *pool);

#endif /* BLOCKMGR_BM_MAP_H */
