/* bm_check.c - bm_pool_check(): walks every structure of the pool and
 * aborts with a message on the first violated invariant.
 *
 * Checked, per tier:
 *   - refcount of every block == block-table entries naming it, and the
 *     per-tenant reference records sum to it (one record per tenant);
 *   - ref == 0 <=> on the queue, exactly once; FREE (unregistered, no hash)
 *     entries all precede CACHED (registered) ones; USED blocks are off it;
 *   - FREE / CACHED / USED counters match the blocks;
 *   - hash table: every registered block sits in the chain of its hash,
 *     is flagged registered and hashed, and its hash is unique in the table;
 *   - twin links are symmetric and join USED blocks of different tiers;
 *   - the device null block is never referenced, queued or registered.
 * Per sequence: table length == ceil(len / block_size), ids in the tier it
 * lives in, full blocks hashed when prefix caching is on. Per tenant: the
 * distinct-block counts. Ops: ids in range for their kind.
 *
 * O(blocks * tenants + table entries); meant for tests and debug builds.
 *
 * Thread: engine thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/xmalloc.h"

#define VERIFY(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "bm_pool_check: ");                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " [%s] at %s:%d\n", #c, __FILE__, __LINE__);                           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void
check_tier(const bm_pool_t *pool, int tier, const uint32_t *refs, const uint32_t *trefs)
{
    const bm_tier_t *t = &pool->tier[tier];
    uint32_t n_t = pool->n_tenants;
    uint32_t n_free = 0, n_cached = 0, n_used = 0, n_reg = 0, n_queue = 0;
    uint32_t *tenant_blocks = xcalloc(n_t + 1, sizeof(*tenant_blocks));
    uint8_t *seen = xcalloc(t->n_blocks + 1, 1);
    const list_node_t *it;
    int in_cached_part = 0;

    for (uint32_t id = 0; id < t->n_blocks; id++) {
        const bm_block_t *b = &t->blocks[id];
        uint32_t sum = 0;

        VERIFY(b->id == id, "tier %d block %u has id %u", tier, id, b->id);
        if (id < t->first) {
            VERIFY(b->ref == 0 && !b->cached && !b->hashed && b->lru.next == &b->lru &&
                       b->twin == BM_NONE,
                   "null block touched");
            continue;
        }
        VERIFY(b->ref == refs[id], "tier %d block %u ref %u but %u table entries", tier, id, b->ref,
               refs[id]);
        /* Tenant records: each tenant at most once, counts match. */
        if (b->tref0.n > 0) {
            VERIFY(b->tref0.tenant < n_t &&
                       b->tref0.n == trefs[(size_t)b->tref0.tenant * t->n_blocks + id],
                   "tier %d block %u tenant record", tier, id);
            sum += b->tref0.n;
        } else {
            VERIFY(b->n_more == 0, "tier %d block %u empty first tenant record", tier, id);
        }
        for (uint32_t k = 0; k < b->n_more; k++) {
            const bm_tref_t *e = &b->tref_more[k];
            VERIFY(e->n > 0 && e->tenant < n_t && e->tenant != b->tref0.tenant &&
                       e->n == trefs[(size_t)e->tenant * t->n_blocks + id],
                   "tier %d block %u extra tenant record", tier, id);
            for (uint32_t j = 0; j < k; j++) {
                VERIFY(b->tref_more[j].tenant != e->tenant, "duplicate tenant record");
            }
            sum += e->n;
        }
        VERIFY(sum == b->ref, "tier %d block %u tenant refs %u != ref %u", tier, id, sum, b->ref);
        for (uint32_t k = 0; k < n_t; k++) {
            tenant_blocks[k] += trefs[(size_t)k * t->n_blocks + id] > 0;
        }

        if (b->ref == 0) {
            VERIFY(b->lru.next != &b->lru, "tier %d block %u ref 0 but not queued", tier, id);
            VERIFY(b->twin == BM_NONE, "tier %d block %u unreferenced with a twin", tier, id);
            if (b->cached) {
                n_cached++;
            } else {
                VERIFY(!b->hashed, "tier %d FREE block %u keeps a hash", tier, id);
                n_free++;
            }
        } else {
            VERIFY(b->lru.next == &b->lru && b->lru.prev == &b->lru,
                   "tier %d USED block %u is queued", tier, id);
            n_used++;
        }
        if (b->cached) {
            VERIFY(b->hashed, "tier %d block %u registered without hash", tier, id);
            VERIFY(bm__ht_find(t, b->hash) == id,
                   "tier %d block %u: hash registered twice or off its chain", tier, id);
            n_reg++;
        }
        if (b->twin != BM_NONE) {
            const bm_tier_t *o = &pool->tier[!tier];
            VERIFY(b->twin < o->n_blocks && b->twin >= o->first, "twin id out of range");
            VERIFY(o->blocks[b->twin].twin == id, "tier %d block %u twin not mutual", tier, id);
            VERIFY(b->ref > 0 && o->blocks[b->twin].ref > 0, "twin of an unused block");
        }
    }

    /* The queue: FREE part, then CACHED part, each block once. */
    LIST_FOREACH(it, &t->lru)
    {
        const bm_block_t *b = LIST_ENTRY(it, bm_block_t, lru);
        VERIFY(b >= t->blocks && b < t->blocks + t->n_blocks && b->id >= t->first,
               "foreign node on tier %d queue", tier);
        VERIFY(!seen[b->id], "tier %d block %u queued twice", tier, b->id);
        seen[b->id] = 1;
        VERIFY(b->ref == 0, "tier %d queued block %u has ref %u", tier, b->id, b->ref);
        VERIFY(it->next->prev == it, "tier %d queue links broken", tier);
        if (b->cached) {
            in_cached_part = 1;
        } else {
            VERIFY(!in_cached_part, "tier %d FREE block %u behind CACHED ones", tier, b->id);
        }
        n_queue++;
    }
    VERIFY(n_queue == n_free + n_cached, "tier %d queue length %u != %u free + %u cached", tier,
           n_queue, n_free, n_cached);
    VERIFY(t->n_free == n_free && t->n_cached == n_cached && t->n_used == n_used,
           "tier %d counters %u/%u/%u, blocks say %u/%u/%u", tier, t->n_free, t->n_cached,
           t->n_used, n_free, n_cached, n_used);

    /* Hash table: every chain entry registered, the count matches. */
    {
        uint32_t n_chain = 0;
        for (uint32_t k = 0; k <= t->mask; k++) {
            for (uint32_t id = t->buckets[k]; id != BM_NONE; id = t->blocks[id].hnext) {
                VERIFY(id < t->n_blocks && id >= t->first, "bad id in tier %d table", tier);
                VERIFY(t->blocks[id].cached, "tier %d table holds unregistered %u", tier, id);
                VERIFY(++n_chain <= n_reg, "tier %d hash chain loops", tier);
            }
        }
        VERIFY(n_chain == n_reg && t->n_registered == n_reg,
               "tier %d table has %u entries, %u registered blocks", tier, n_chain, n_reg);
    }
    for (uint32_t k = 0; k < n_t; k++) {
        VERIFY(pool->tenants[k].blocks[tier] == tenant_blocks[k],
               "tenant %u tier %d counts %u blocks, tables say %u", pool->tenants[k].id, tier,
               pool->tenants[k].blocks[tier], tenant_blocks[k]);
    }
    free(seen);
    free(tenant_blocks);
}

void
bm_pool_check(const bm_pool_t *pool)
{
    uint32_t n_t = pool->n_tenants;
    uint32_t *refs[2];
    uint32_t *trefs[2];
    uint32_t n_seqs = 0;

    for (int tier = 0; tier < 2; tier++) {
        size_t n = pool->tier[tier].n_blocks + 1;
        refs[tier] = xcalloc(n, sizeof(uint32_t));
        trefs[tier] = xcalloc(n * (n_t + 1), sizeof(uint32_t));
    }
    for (uint32_t k = 0; k <= pool->seq_mask; k++) {
        for (const bm_seq_t *s = pool->seq_buckets[k]; s != NULL; s = s->next) {
            int tier = s->swapped ? BM_CPU : BM_DEV;
            const bm_tier_t *t = &pool->tier[tier];
            uint32_t n_full = s->len / pool->bs;

            n_seqs++;
            VERIFY(bm__seq_find(pool, s->id) == s, "seq %llu not findable",
                   (unsigned long long)s->id);
            VERIFY(s->tenant < n_t, "seq %llu tenant index", (unsigned long long)s->id);
            VERIFY(s->n_blocks == (s->len + pool->bs - 1) / pool->bs,
                   "seq %llu has %u blocks for %u tokens", (unsigned long long)s->id, s->n_blocks,
                   s->len);
            VERIFY(s->n_released < s->n_blocks || s->n_blocks == 0,
                   "seq %llu released all %u blocks", (unsigned long long)s->id, s->n_blocks);
            for (uint32_t i = 0; i < s->n_released && i < s->n_blocks; i++) {
                VERIFY(s->table[i] == 0, "seq %llu released block %u is %d",
                       (unsigned long long)s->id, i, s->table[i]);
            }
            for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
                uint32_t id = (uint32_t)s->table[i];
                VERIFY(s->table[i] >= (int32_t)t->first && id < t->n_blocks,
                       "seq %llu block %u id %d out of tier %d", (unsigned long long)s->id, i,
                       s->table[i], tier);
                refs[tier][id]++;
                trefs[tier][(size_t)s->tenant * t->n_blocks + id]++;
                if (pool->cfg.prefix_caching && !s->nohash && i < n_full) {
                    VERIFY(t->blocks[id].hashed, "seq %llu full block %u (id %u) unhashed",
                           (unsigned long long)s->id, i, id);
                }
                for (uint32_t j = s->n_released; j < i && s->n_blocks <= 64; j++) {
                    VERIFY(s->table[j] != s->table[i], "seq %llu holds block %u twice",
                           (unsigned long long)s->id, id);
                }
            }
        }
    }
    VERIFY(n_seqs == pool->n_seqs, "%u sequences reachable, %u counted", n_seqs, pool->n_seqs);
    check_tier(pool, BM_DEV, refs[BM_DEV], trefs[BM_DEV]);
    check_tier(pool, BM_CPU, refs[BM_CPU], trefs[BM_CPU]);

    for (uint32_t i = 0; i < pool->n_ops; i++) {
        const kv_op_t *op = &pool->ops[i];
        int src_tier = op->kind == KV_OP_SWAP_IN || op->kind == KV_OP_DROP_SWAP ? BM_CPU : BM_DEV;
        int dst_tier =
            op->kind == KV_OP_SWAP_OUT || op->kind == KV_OP_DROP_SWAP ? BM_CPU : BM_DEV;
        VERIFY(op->kind == KV_OP_COPY || op->kind == KV_OP_SWAP_OUT || op->kind == KV_OP_SWAP_IN ||
                   (pool->cfg.drop_ops && (op->kind == KV_OP_DROP || op->kind == KV_OP_DROP_SWAP) &&
                    op->src == op->dst) ||
                   (op->kind == KV_OP_SHIFT && op->dst > 0) || op->kind == KV_OP_COPY_SLOT,
               "op %u kind", i);
        if (op->kind == KV_OP_COPY_SLOT) { /* device slots, never the null block's */
            uint32_t n_slots = pool->tier[BM_DEV].n_blocks * pool->bs;
            VERIFY(op->src >= (int32_t)pool->bs && (uint32_t)op->src < n_slots &&
                       op->dst >= (int32_t)pool->bs && (uint32_t)op->dst < n_slots,
                   "op %u slot copy %d -> %d", i, op->src, op->dst);
            continue;
        }
        if (op->kind == KV_OP_SHIFT) {
            VERIFY(op->src >= 1 && (uint32_t)op->src < pool->tier[BM_DEV].n_blocks,
                   "op %u shift block %d", i, op->src);
            continue;
        }
        VERIFY(op->src >= (int32_t)pool->tier[src_tier].first &&
                   (uint32_t)op->src < pool->tier[src_tier].n_blocks,
               "op %u src %d", i, op->src);
        VERIFY(op->dst >= (int32_t)pool->tier[dst_tier].first &&
                   (uint32_t)op->dst < pool->tier[dst_tier].n_blocks,
               "op %u dst %d", i, op->dst);
    }
    for (int tier = 0; tier < 2; tier++) {
        free(refs[tier]);
        free(trefs[tier]);
    }
}
