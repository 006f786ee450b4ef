/* blockmgr.c - pools, block tables, refcounts, prefix cache, copy-on-write
 * and the CPU swap tier. See blockmgr.h for the contract and DESIGN.
 *
 * Invariants kept by every function here (bm_pool_check() verifies them):
 *   - block.ref == number of block-table entries naming the block, over
 *     all sequences (resident ones name device ids, swapped ones CPU ids);
 *   - ref == 0 <=> the block is on its tier's LRU queue; FREE blocks (not
 *     registered, no hash) precede CACHED ones (registered);
 *   - a tier's hash table holds each hash at most once;
 *   - with prefix caching, every block a sequence holds as full is hashed
 *     and its hash chains from the previous block's hash;
 *   - twin links are symmetric, between USED blocks of different tiers;
 *   - the per-tenant counts equal the distinct blocks each tenant holds.
 *
 * Every function that can return ST_EAGAIN decides it before changing
 * anything: it first counts what it needs from the tier's queue, then
 * mutates, and its mutations can no longer fail.
 *
 * Memory (issue 9: out of memory ends one request, never the engine).
 * What has a bound known at create is allocated there: the hash tables
 * (twice each tier's blocks), the swap planning scratch (a sequence holds
 * at most one tier's usable blocks) and the op queue's usual need (see
 * ops_prealloc). What grows with a request is allocated with the fallible
 * family before anything changes, and the call returns ST_ENOMEM with
 * nothing changed: the sequence record and its tenant's first entry, the block
 * table and token array, a block's extra tenant records and the op queue
 * room a call may use. The sequence map grows with the fallible family
 * too, and simply keeps its size (longer chains) when it cannot. Calls
 * that only give blocks back (free, truncate, release, evict) cannot
 * fail; the few ops they queue past the preallocated room use the
 * aborting allocator.
 *
 * Thread: engine thread only.
 */
#define LOG_MODULE "blockmgr"

#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"

/* ---------------------------------------------------------------- helpers */

static uint32_t
div_up(uint32_t a, uint32_t b)
{
    return (uint32_t)(((uint64_t)a + b - 1) / b);
}

static uint32_t
seq_bucket(const bm_pool_t *pool, uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (uint32_t)id & pool->seq_mask;
}

bm_seq_t *
bm__seq_find(const bm_pool_t *pool, uint64_t id)
{
    bm_seq_t *s = pool->seq_buckets[seq_bucket(pool, id)];

    while (s != NULL && s->id != id) {
        s = s->next;
    }
    return s;
}

/* Doubles the sequence map. Without memory the map keeps its size: only
 * its chains get longer, so this never fails a call. */
static void
seq_map_grow(bm_pool_t *pool)
{
    uint32_t old_n = pool->seq_mask + 1;
    bm_seq_t **old = pool->seq_buckets;
    bm_seq_t **nb = xcalloc_try(2 * (size_t)old_n, sizeof(*pool->seq_buckets));

    if (nb == NULL) {
        return;
    }
    pool->seq_mask = 2 * old_n - 1;
    pool->seq_buckets = nb;
    for (uint32_t i = 0; i < old_n; i++) {
        bm_seq_t *s = old[i];
        while (s != NULL) {
            bm_seq_t *next = s->next;
            uint32_t k = seq_bucket(pool, s->id);
            s->next = pool->seq_buckets[k];
            pool->seq_buckets[k] = s;
            s = next;
        }
    }
    free(old);
}

static void
seq_map_remove(bm_pool_t *pool, bm_seq_t *s)
{
    bm_seq_t **link = &pool->seq_buckets[seq_bucket(pool, s->id)];

    while (*link != s) {
        link = &(*link)->next;
    }
    *link = s->next;
    pool->n_seqs--;
}

/* Room for n_blocks table entries and n_toks token ids. ST_ENOMEM leaves
 * the contents and lengths as they were (a capacity may have grown). */
static int
seq_reserve_cap(bm_seq_t *s, uint32_t n_blocks, uint32_t n_toks)
{
    if (n_blocks > s->cap_blocks) {
        uint32_t cap = s->cap_blocks ? s->cap_blocks : 4;
        int32_t *p;
        while (cap < n_blocks) {
            cap = cap > UINT32_MAX / 2 ? n_blocks : 2 * cap;
        }
        p = xrealloc_try(s->table, (size_t)cap * sizeof(*s->table));
        if (p == NULL) {
            return ST_ENOMEM;
        }
        s->table = p;
        s->cap_blocks = cap;
    }
    if (n_toks > s->cap_toks) {
        uint32_t cap = s->cap_toks ? s->cap_toks : 64;
        int32_t *p;
        while (cap < n_toks) {
            cap = cap > UINT32_MAX / 2 ? n_toks : 2 * cap;
        }
        p = xrealloc_try(s->toks, (size_t)cap * sizeof(*s->toks));
        if (p == NULL) {
            return ST_ENOMEM;
        }
        s->toks = p;
        s->cap_toks = cap;
    }
    return ST_OK;
}

/* Room for n more queued ops. ST_ENOMEM changes nothing. */
static int
ops_reserve(bm_pool_t *pool, uint64_t n)
{
    uint64_t want = (uint64_t)pool->n_ops + n;
    uint32_t cap = pool->cap_ops;
    kv_op_t *p;

    if (want <= cap) {
        return ST_OK;
    }
    if (want > UINT32_MAX / 2) {
        return ST_ENOMEM;
    }
    while (cap < want) {
        cap *= 2;
    }
    p = xrealloc_try(pool->ops, (size_t)cap * sizeof(*pool->ops));
    if (p == NULL) {
        return ST_ENOMEM;
    }
    pool->ops = p;
    pool->cap_ops = cap;
    return ST_OK;
}

static void
op_push(bm_pool_t *pool, kv_op_kind_t kind, uint32_t src, uint32_t dst)
{
    if (pool->n_ops == pool->cap_ops) {
        /* Only the calls that cannot fail get here (the others reserved
         * their worst case), past the preallocated room. */
        pool->cap_ops *= 2;
        pool->ops = xrealloc(pool->ops, (size_t)pool->cap_ops * sizeof(*pool->ops));
    }
    pool->ops[pool->n_ops].kind = kind;
    pool->ops[pool->n_ops].src = (int32_t)src;
    pool->ops[pool->n_ops].dst = (int32_t)dst;
    pool->n_ops++;
}

/* Index of the tenant's entry, added on first use. fallible: a request's
 * call (BM_NONE without memory, nothing changed); otherwise configuration
 * at start-up, which aborts without memory. */
static uint32_t
tenant_index(bm_pool_t *pool, uint32_t tenant, int fallible)
{
    bm_tenant_t *t;

    for (uint32_t i = 0; i < pool->n_tenants; i++) {
        if (pool->tenants[i].id == tenant) {
            return i;
        }
    }
    if (pool->n_tenants == pool->cap_tenants) {
        uint32_t cap = pool->cap_tenants ? 2 * pool->cap_tenants : 4;
        bm_tenant_t *p = fallible
                             ? xrealloc_try(pool->tenants, (size_t)cap * sizeof(*pool->tenants))
                             : xrealloc(pool->tenants, (size_t)cap * sizeof(*pool->tenants));
        if (p == NULL) {
            return BM_NONE;
        }
        pool->tenants = p;
        pool->cap_tenants = cap;
    }
    t = &pool->tenants[pool->n_tenants];
    memset(t, 0, sizeof(*t));
    t->id = tenant;
    /* Default salt: the tenant id, so tenants never share unless told. */
    t->salt_len = 4;
    for (int i = 0; i < 4; i++) {
        t->salt[i] = (uint8_t)(tenant >> (8 * i));
    }
    return pool->n_tenants++;
}

static const bm_tenant_t *
tenant_find(const bm_pool_t *pool, uint32_t tenant)
{
    for (uint32_t i = 0; i < pool->n_tenants; i++) {
        if (pool->tenants[i].id == tenant) {
            return &pool->tenants[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------ tenant references */

/* Room for one more tenant record on b if tenant has none there yet, so
 * that a later blk_get() by tenant allocates nothing. ST_ENOMEM changes
 * nothing. */
static int
tref_reserve(bm_block_t *b, uint32_t tenant)
{
    bm_tref_t *p;
    uint32_t cap;

    if (b->tref0.n == 0 || b->tref0.tenant == tenant || b->n_more < b->cap_more) {
        return ST_OK;
    }
    for (uint32_t i = 0; i < b->n_more; i++) {
        if (b->tref_more[i].tenant == tenant) {
            return ST_OK;
        }
    }
    cap = b->cap_more ? 2 * b->cap_more : 2;
    p = xrealloc_try(b->tref_more, (size_t)cap * sizeof(*b->tref_more));
    if (p == NULL) {
        return ST_ENOMEM;
    }
    b->tref_more = p;
    b->cap_more = cap;
    return ST_OK;
}

static void
tref_add(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant)
{
    if (b->tref0.n == 0) {
        b->tref0.tenant = tenant;
        b->tref0.n = 1;
        pool->tenants[tenant].blocks[tier]++;
        return;
    }
    if (b->tref0.tenant == tenant) {
        b->tref0.n++;
        return;
    }
    for (uint32_t i = 0; i < b->n_more; i++) {
        if (b->tref_more[i].tenant == tenant) {
            b->tref_more[i].n++;
            return;
        }
    }
    /* Every caller that can bring a second tenant to b reserved the
     * record with tref_reserve() first. */
    CHECK(b->n_more < b->cap_more);
    b->tref_more[b->n_more].tenant = tenant;
    b->tref_more[b->n_more].n = 1;
    b->n_more++;
    pool->tenants[tenant].blocks[tier]++;
}

static void
tref_del(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant)
{
    bm_tref_t *e = NULL;

    if (b->tref0.n > 0 && b->tref0.tenant == tenant) {
        e = &b->tref0;
    } else {
        for (uint32_t i = 0; i < b->n_more; i++) {
            if (b->tref_more[i].tenant == tenant) {
                e = &b->tref_more[i];
                break;
            }
        }
    }
    CHECK(e != NULL && e->n > 0);
    if (--e->n > 0) {
        return;
    }
    pool->tenants[tenant].blocks[tier]--;
    if (b->n_more > 0) {
        *e = b->tref_more[--b->n_more]; /* keeps tref0 filled while any remain */
    }
}

/* ------------------------------------------------------- block life cycle */

static void
twin_break(bm_pool_t *pool, int tier, bm_block_t *b)
{
    if (b->twin != BM_NONE) {
        bm_block_t *o = bm__blk(pool, !tier, b->twin);
        CHECK(o->twin == b->id);
        o->twin = BM_NONE;
        b->twin = BM_NONE;
    }
}

static void
twin_link(bm_block_t *dev, bm_block_t *cpu)
{
    CHECK(dev->twin == BM_NONE && cpu->twin == BM_NONE);
    dev->twin = cpu->id;
    cpu->twin = dev->id;
}

/* One more reference by a sequence of tenant. A FREE or CACHED block leaves
 * the queue in O(1) (this is the revival of a cached block on a hit). */
static void
blk_get(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant)
{
    bm_tier_t *t = &pool->tier[tier];

    if (b->ref == 0) {
        list_remove(&b->lru);
        if (b->cached) {
            t->n_cached--;
        } else {
            t->n_free--;
        }
        t->n_used++;
    }
    b->ref++;
    tref_add(pool, tier, b, tenant);
}

/* Drops one reference. At zero the block joins the queue: CACHED at the
 * back when registered (or registrable: a hashed duplicate whose original
 * is gone), FREE at the front otherwise. */
static void
blk_put(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant)
{
    bm_tier_t *t = &pool->tier[tier];

    CHECK(b->ref > 0); /* underflow would be a double free */
    tref_del(pool, tier, b, tenant);
    if (--b->ref > 0) {
        return;
    }
    twin_break(pool, tier, b);
    t->n_used--;
    if (b->hashed && !b->cached && bm__ht_find(t, b->hash) == BM_NONE) {
        bm__ht_insert(t, b);
    }
    if (b->cached) {
        list_push_back(&t->lru, &b->lru);
        t->n_cached++;
    } else {
        b->hashed = 0;
        list_push_front(&t->lru, &b->lru);
        t->n_free++;
        if (pool->cfg.drop_ops) {
            op_push(pool, tier == BM_DEV ? KV_OP_DROP : KV_OP_DROP_SWAP, b->id, b->id);
        }
    }
}

/* A CACHED block (on the queue) loses its registration and becomes FREE. */
static void
blk_uncache(bm_pool_t *pool, int tier, bm_block_t *b)
{
    bm_tier_t *t = &pool->tier[tier];

    CHECK(b->ref == 0 && b->cached);
    bm__ht_remove(t, b);
    b->hashed = 0;
    t->n_cached--;
    t->n_free++;
}

/* The device block x (CACHED, being evicted) moves to the CPU prefix cache
 * when that tier has a FREE or CACHED block; the SWAP_OUT is queued before
 * whatever op will overwrite x. */
static void
demote(bm_pool_t *pool, bm_block_t *x)
{
    bm_tier_t *cpu = &pool->tier[BM_CPU];
    bm_block_t *c;
    uint32_t id;

    id = cpu->n_blocks > 0 ? bm__ht_find(cpu, x->hash) : BM_NONE;
    if (id != BM_NONE) {
        /* Already there (a swapped copy or an earlier demotion): refresh. */
        c = bm__blk(pool, BM_CPU, id);
        if (c->ref == 0) {
            list_remove(&c->lru);
            list_push_back(&cpu->lru, &c->lru);
        }
        return;
    }
    if (list_empty(&cpu->lru)) {
        pool->st.n_evicted++;
        return;
    }
    c = LIST_ENTRY(cpu->lru.next, bm_block_t, lru);
    if (c->cached) {
        blk_uncache(pool, BM_CPU, c);
        pool->st.n_evicted++;
    }
    op_push(pool, KV_OP_SWAP_OUT, x->id, c->id);
    bm__ev_copy(pool, BM_CPU, c, BM_DEV, x);
    c->tref0.tenant = x->tref0.tenant; /* no record (n 0): whose cached block (bm_map.h) */
    memcpy(c->hash, x->hash, BM_HASH_LEN);
    c->hashed = 1;
    bm__ht_insert(cpu, c);
    list_remove(&c->lru);
    list_push_back(&cpu->lru, &c->lru);
    cpu->n_free--;
    cpu->n_cached++;
    pool->st.n_demoted++;
}

/* Hands out the queue's front block with one reference for tenant, ready
 * for new bytes. Evicts it if CACHED (device blocks are demoted first).
 * The caller checked that the queue is not empty. */
static bm_block_t *
blk_alloc(bm_pool_t *pool, int tier, uint32_t tenant)
{
    bm_tier_t *t = &pool->tier[tier];
    bm_block_t *b;

    CHECK(!list_empty(&t->lru));
    b = LIST_ENTRY(t->lru.next, bm_block_t, lru);
    if (b->cached) {
        if (tier == BM_DEV) {
            demote(pool, b);
        } else {
            pool->st.n_evicted++;
        }
        blk_uncache(pool, tier, b);
    }
    CHECK(b->twin == BM_NONE && !b->hashed);
    blk_get(pool, tier, b, tenant);
    return b;
}

static uint32_t
tier_avail(const bm_pool_t *pool, int tier)
{
    return pool->tier[tier].n_free + pool->tier[tier].n_cached;
}

/* ------------------------------------------------------------------ pool */

/* Op queue room at create: a step that swaps every block of both tiers
 * once each way and drops as many (the engine clears the queue every
 * step), so a step normally never grows it. */
static uint32_t
ops_prealloc(const bm_config_t *cfg)
{
    uint64_t n = 2 * ((uint64_t)cfg->num_blocks + cfg->swap_blocks) + 64;

    return n > UINT32_MAX / 4 ? UINT32_MAX / 4 : (uint32_t)n;
}

static void
tier_init(bm_tier_t *t, uint32_t n_blocks, uint32_t first)
{
    t->n_blocks = n_blocks;
    t->first = first;
    list_init(&t->lru);
    t->blocks = xcalloc(n_blocks ? n_blocks : 1, sizeof(*t->blocks));
    for (uint32_t i = 0; i < n_blocks; i++) {
        bm_block_t *b = &t->blocks[i];
        b->id = i;
        b->hnext = BM_NONE;
        b->twin = BM_NONE;
        list_init(&b->lru);
        if (i >= first) {
            list_push_back(&t->lru, &b->lru);
            t->n_free++;
        }
    }
    bm__ht_init(t, n_blocks);
}

int
bm_pool_create(const bm_config_t *cfg, bm_pool_t **out)
{
    bm_pool_t *pool;

    if (cfg == NULL || out == NULL || cfg->block_size == 0 || cfg->num_blocks < 2 ||
        (uint64_t)cfg->num_blocks * cfg->block_size > INT32_MAX || cfg->swap_blocks > INT32_MAX ||
        !(cfg->watermark >= 0.0f && cfg->watermark < 1.0f)) {
        return ST_EINVAL;
    }

    pool = xcalloc(1, sizeof(*pool));
    pool->cfg = *cfg;
    pool->bs = cfg->block_size;
    pool->watermark_blocks = (uint32_t)(cfg->watermark * (float)(cfg->num_blocks - 1));
    tier_init(&pool->tier[BM_DEV], cfg->num_blocks, 1);
    tier_init(&pool->tier[BM_CPU], cfg->swap_blocks, 0);
    pool->seq_mask = 63;
    pool->seq_buckets = xcalloc(pool->seq_mask + 1, sizeof(*pool->seq_buckets));
    /* A sequence holds at most every usable block of the tier it lives in
     * (released entries are not planned), so this scratch never grows. */
    pool->cap_scratch = cfg->num_blocks > cfg->swap_blocks ? cfg->num_blocks : cfg->swap_blocks;
    pool->scratch = xcalloc(pool->cap_scratch, sizeof(*pool->scratch));
    pool->cap_ops = ops_prealloc(cfg);
    pool->ops = xcalloc(pool->cap_ops, sizeof(*pool->ops));
    pool->md_ctx = EVP_MD_CTX_new();
    pool->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    pool->n_hashed = xcalloc(1, sizeof(*pool->n_hashed));
    if (pool->md_ctx == NULL || pool->md == NULL) {
        LOG_ERROR("OpenSSL SHA-256 unavailable");
        bm_pool_destroy(pool);
        return ST_ENOMEM;
    }
    LOG_DEBUG("pool: %u device blocks, %u CPU blocks of %u tokens, watermark %u", cfg->num_blocks,
              cfg->swap_blocks, cfg->block_size, pool->watermark_blocks);
    *out = pool;
    return ST_OK;
}

static void
seq_destroy(bm_seq_t *s)
{
    free(s->table);
    free(s->toks);
    free(s);
}

void
bm_pool_destroy(bm_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    for (uint32_t i = 0; pool->seq_buckets != NULL && i <= pool->seq_mask; i++) {
        bm_seq_t *s = pool->seq_buckets[i];
        while (s != NULL) {
            bm_seq_t *next = s->next;
            seq_destroy(s);
            s = next;
        }
    }
    free(pool->seq_buckets);
    for (int t = 0; t < 2; t++) {
        for (uint32_t i = 0; pool->tier[t].blocks != NULL && i < pool->tier[t].n_blocks; i++) {
            free(pool->tier[t].blocks[i].tref_more);
        }
        free(pool->tier[t].blocks);
        bm__ht_fini(&pool->tier[t]);
    }
    bm__ev_fini(pool);
    free(pool->tenants);
    free(pool->ops);
    free(pool->scratch);
    EVP_MD_free(pool->md);
    EVP_MD_CTX_free(pool->md_ctx);
    free(pool->n_hashed);
    free(pool);
}

int
bm_tenant_set_salt(bm_pool_t *pool, uint32_t tenant, const void *salt, size_t len)
{
    bm_tenant_t *t;
    uint32_t k;

    if (len > BM_KEY_MAX || (len > 0 && salt == NULL)) {
        return ST_EINVAL;
    }
    k = tenant_index(pool, tenant, 0); /* may move pool->tenants */
    t = &pool->tenants[k];
    if (len > 0) {
        memcpy(t->salt, salt, len);
    }
    t->salt_len = (uint32_t)len;
    return ST_OK;
}

/* ------------------------------------------------------------- sequences */

int
bm_seq_create(bm_pool_t *pool, uint64_t seq, uint32_t tenant)
{
    bm_seq_t *s;
    uint32_t k;

    if (bm__seq_find(pool, seq) != NULL) {
        return ST_EINVAL;
    }
    if (pool->n_seqs >= pool->seq_mask + 1) {
        seq_map_grow(pool);
    }
    s = xcalloc_try(1, sizeof(*s));
    if (s == NULL) {
        return ST_ENOMEM;
    }
    s->id = seq;
    s->tenant = tenant_index(pool, tenant, 1); /* the last thing that can fail */
    if (s->tenant == BM_NONE) {
        free(s);
        return ST_ENOMEM;
    }
    k = seq_bucket(pool, seq);
    s->next = pool->seq_buckets[k];
    pool->seq_buckets[k] = s;
    pool->n_seqs++;
    return ST_OK;
}

int
bm_seq_set_extra_key(bm_pool_t *pool, uint64_t seq, const void *key, size_t len)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL || s->len != 0 || len > BM_KEY_MAX || (len > 0 && key == NULL)) {
        return ST_EINVAL;
    }
    if (len > 0) {
        memcpy(s->extra, key, len);
    }
    s->extra_len = (uint32_t)len;
    return ST_OK;
}

/* The block at table index idx just became full in s: hash it and, if no
 * other block of the tier holds that hash, register it. A duplicate stays
 * hashed (its hash chains the next block) but unregistered; it registers
 * later if the original is gone when it is released. */
static void
seal_block(bm_pool_t *pool, bm_seq_t *s, uint32_t idx)
{
    bm_tier_t *dev = &pool->tier[BM_DEV];
    bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[idx]);
    const uint8_t *parent = NULL;

    if (!pool->cfg.prefix_caching || s->nohash) {
        return;
    }
    if (idx > 0) {
        bm_block_t *p = bm__blk(pool, BM_DEV, (uint32_t)s->table[idx - 1]);
        CHECK(p->hashed);
        parent = p->hash;
    }
    bm__memo_hash(pool, s->memo, idx, parent, &pool->tenants[s->tenant], s->extra, s->extra_len,
                  s->toks + (size_t)idx * pool->bs, b->hash);
    bm__ev_seal(pool, b, parent, s->toks + (size_t)idx * pool->bs);
    b->hashed = 1;
    if (bm__ht_find(dev, b->hash) == BM_NONE) {
        bm__ht_insert(dev, b);
    }
}

static uint32_t
reserve_needed(const bm_pool_t *pool, const bm_seq_t *s, uint32_t n_new)
{
    uint32_t need;

    if (n_new == 0) {
        return 0;
    }
    need = div_up(s->len + n_new, pool->bs) - div_up(s->len, pool->bs);
    if (s->len % pool->bs != 0) {
        const bm_block_t *tail = bm__blk(pool, BM_DEV, (uint32_t)s->table[s->n_blocks - 1]);
        if (tail->ref > 1) {
            need++; /* copy-on-write of the shared partial tail */
        }
    }
    return need;
}

static uint32_t
swap_in_needed(const bm_pool_t *pool, const bm_seq_t *s)
{
    const bm_tier_t *dev = &pool->tier[BM_DEV];
    uint32_t need = 0;

    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *c = bm__blk(pool, BM_CPU, (uint32_t)s->table[i]);
        uint32_t id;
        if (c->twin != BM_NONE) {
            continue; /* twin is USED on the device: shared, no queue entry */
        }
        id = c->hashed ? bm__ht_find(dev, c->hash) : BM_NONE;
        if (id != BM_NONE) {
            need += bm__blk(pool, BM_DEV, id)->ref == 0; /* revived from the queue */
            continue;
        }
        need++;
    }
    return need;
}

uint32_t
bm_seq_blocks_needed(const bm_pool_t *pool, uint64_t seq, uint32_t n_new)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);
    uint32_t need;

    if (s == NULL) {
        return div_up(n_new, pool->bs);
    }
    if (!s->swapped) {
        return reserve_needed(pool, s, n_new);
    }
    need = swap_in_needed(pool, s);
    if (n_new > 0) {
        need += div_up(s->len + n_new, pool->bs) - div_up(s->len, pool->bs);
        need += s->len % pool->bs != 0;
    }
    return need;
}

int
bm_pool_can_admit(const bm_pool_t *pool, uint32_t n_blocks)
{
    return (uint64_t)n_blocks + pool->watermark_blocks <= tier_avail(pool, BM_DEV);
}

int
bm_seq_reserve(bm_pool_t *pool, uint64_t seq, const int32_t *tokens, uint32_t n_new, int32_t *slots)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    uint32_t bs = pool->bs;
    uint32_t need;

    if (s == NULL || s->swapped || (n_new > 0 && (tokens == NULL || slots == NULL)) ||
        (uint64_t)s->len + n_new > INT32_MAX) {
        return ST_EINVAL;
    }
    if (n_new == 0) {
        return ST_OK;
    }
    need = reserve_needed(pool, s, n_new);
    if (need > tier_avail(pool, BM_DEV)) {
        return ST_EAGAIN;
    }
    /* Ops: a copy-on-write and a demotion per block taken. */
    if (seq_reserve_cap(s, div_up(s->len + n_new, bs), s->len + n_new) != ST_OK ||
        ops_reserve(pool, 2 * (uint64_t)need + 1) != ST_OK) {
        return ST_ENOMEM;
    }
    /* From here on nothing fails. */

    if (s->len % bs != 0) {
        bm_block_t *tail = bm__blk(pool, BM_DEV, (uint32_t)s->table[s->n_blocks - 1]);
        if (tail->ref > 1) {
            /* Shared partly filled tail: copy it, write into the copy. */
            bm_block_t *copy = blk_alloc(pool, BM_DEV, s->tenant);
            op_push(pool, KV_OP_COPY, tail->id, copy->id);
            pool->st.n_copies++;
            s->table[s->n_blocks - 1] = (int32_t)copy->id;
            bm__tab_changed(s, s->n_blocks - 1);
            blk_put(pool, BM_DEV, tail, s->tenant);
        } else {
            /* Sole holder: the block becomes mutable again. It may still be
             * registered after a truncation into a full block. */
            if (tail->cached) {
                bm__ht_remove(&pool->tier[BM_DEV], tail);
            }
            tail->hashed = 0;
            twin_break(pool, BM_DEV, tail);
        }
    }

    for (uint32_t i = 0; i < n_new; i++) {
        uint32_t pos = s->len;
        uint32_t off = pos % bs;
        if (off == 0) {
            bm_block_t *b = blk_alloc(pool, BM_DEV, s->tenant);
            s->table[s->n_blocks++] = (int32_t)b->id;
        }
        slots[i] = s->table[s->n_blocks - 1] * (int32_t)bs + (int32_t)off;
        s->toks[pos] = tokens[i];
        s->len++;
        if (off == bs - 1) {
            seal_block(pool, s, s->n_blocks - 1);
        }
    }
    bm__step_reserved(pool, s, n_new);
    return ST_OK;
}

int
bm_seq_truncate(bm_pool_t *pool, uint64_t seq, uint32_t n)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    uint32_t keep;

    if (s == NULL || s->swapped || n > s->len ||
        div_up(s->len - n, pool->bs) < s->n_released + (s->len - n > 0)) {
        return ST_EINVAL;
    }
    bm__step_check_move(pool, s, "truncate");
    s->len -= n;
    if (s->memo != NULL && s->len < s->memo->cap * pool->bs) {
        s->memo = NULL; /* its tokens may differ from the memo's prefix from here */
    }
    keep = div_up(s->len, pool->bs);
    /* A tail block left partly filled keeps its hash until it is written:
     * its bytes are unchanged, so it stays a valid cache entry. */
    while (s->n_blocks > keep) {
        s->n_blocks--;
        blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)s->table[s->n_blocks]), s->tenant);
    }
    bm__tab_changed(s, s->n_blocks);
    return ST_OK;
}

int
bm_seq_fork(bm_pool_t *pool, uint64_t parent, uint64_t child)
{
    bm_seq_t *p = bm__seq_find(pool, parent);
    bm_seq_t *c;
    int rc;

    if (p == NULL || p->swapped || parent == child || bm__seq_find(pool, child) != NULL) {
        return ST_EINVAL;
    }
    rc = bm_seq_create(pool, child, pool->tenants[p->tenant].id);
    if (rc != ST_OK) {
        return rc;
    }
    c = bm__seq_find(pool, child);
    if (p->len > 0) {
        if (seq_reserve_cap(c, p->n_blocks, p->len) != ST_OK) {
            seq_map_remove(pool, c);
            seq_destroy(c);
            return ST_ENOMEM;
        }
        memcpy(c->table, p->table, (size_t)p->n_blocks * sizeof(*c->table));
        memcpy(c->toks, p->toks, (size_t)p->len * sizeof(*c->toks));
    }
    c->n_blocks = p->n_blocks;
    c->n_released = p->n_released;
    c->nohash = p->nohash;
    c->len = p->len;
    c->extra_len = p->extra_len;
    memcpy(c->extra, p->extra, p->extra_len);
    c->memo = p->memo;
    for (uint32_t i = c->n_released; i < c->n_blocks; i++) {
        blk_get(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)c->table[i]), c->tenant);
    }
    bm__step_wrote(pool, p);
    bm__step_wrote(pool, c);
    return ST_OK;
}

void
bm_seq_free(bm_pool_t *pool, uint64_t seq)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    int tier;

    if (s == NULL) {
        return;
    }
    bm__step_check_free(pool, s);
    tier = s->swapped ? BM_CPU : BM_DEV;
    /* Last to first: the tail reaches the queue first and is evicted first. */
    for (uint32_t i = s->n_blocks; i-- > s->n_released;) {
        blk_put(pool, tier, bm__blk(pool, tier, (uint32_t)s->table[i]), s->tenant);
    }
    seq_map_remove(pool, s);
    seq_destroy(s);
}

int
bm_seq_release_front(bm_pool_t *pool, uint64_t seq, uint32_t n_blocks)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    /* Two live blocks stay: the next block to fill hashes its parent. */
    if (s == NULL || s->swapped || n_blocks + 2 > s->n_blocks) {
        return ST_EINVAL;
    }
    /* First to last: the oldest block reaches the queue first. */
    for (uint32_t i = s->n_released; i < n_blocks; i++) {
        blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)s->table[i]), s->tenant);
        s->table[i] = 0;
        bm__tab_changed(s, i);
    }
    if (n_blocks > s->n_released) {
        s->n_released = n_blocks;
    }
    return ST_OK;
}

int
bm_seq_set_nohash(bm_pool_t *pool, uint64_t seq)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL || s->len != 0) {
        return ST_EINVAL;
    }
    s->nohash = 1;
    return ST_OK;
}

int
bm_seq_evict(bm_pool_t *pool, uint64_t seq, uint32_t first, uint32_t n)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    uint32_t bs = pool->bs;

    if (s == NULL || s->swapped || !s->nohash || n == 0 || first < s->n_released ||
        first + n >= s->n_blocks) {
        return ST_EINVAL;
    }
    for (uint32_t i = first + n; i < s->n_blocks; i++) {
        if (bm__blk(pool, BM_DEV, (uint32_t)s->table[i])->ref != 1) {
            return ST_EINVAL; /* shared: cannot be re-rotated in place */
        }
    }
    for (uint32_t i = first; i < first + n; i++) {
        blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)s->table[i]), s->tenant);
    }
    memmove(s->table + first, s->table + first + n,
            (size_t)(s->n_blocks - first - n) * sizeof(*s->table));
    bm__tab_changed(s, first);
    memmove(s->toks + (size_t)first * bs, s->toks + (size_t)(first + n) * bs,
            (size_t)(s->len - (first + n) * bs) * sizeof(*s->toks));
    s->n_blocks -= n;
    s->len -= n * bs;
    for (uint32_t i = first; i < s->n_blocks; i++) {
        bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);

        twin_break(pool, BM_DEV, b); /* its bytes change */
        op_push(pool, KV_OP_SHIFT, b->id, n * bs);
    }
    return ST_OK;
}

uint32_t
bm_seq_released(const bm_pool_t *pool, uint64_t seq)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    return s == NULL ? 0 : s->n_released;
}

/* ---------------------------------------------------------- prefix cache */

int
bm_seq_lookup_prefix(bm_pool_t *pool, uint64_t seq, const int32_t *tokens, uint32_t n,
                     uint32_t *n_cached)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    bm_tier_t *dev = &pool->tier[BM_DEV];
    bm_tier_t *cpu = &pool->tier[BM_CPU];
    const uint8_t *parent = NULL;
    uint32_t bs = pool->bs;
    uint32_t max_blocks;
    uint32_t i;

    if (s == NULL || s->swapped || s->len != 0 || (n > 0 && tokens == NULL) || n_cached == NULL) {
        return ST_EINVAL;
    }
    if (s->nohash) {
        *n_cached = 0;
        return ST_OK;
    }
    if (!pool->cfg.prefix_caching || n == 0) {
        pool->st.prefix_queries += n;
        *n_cached = 0;
        return ST_OK;
    }
    max_blocks = (n - 1) / bs; /* never covers tokens[n - 1] */
    /* Ops: a promotion and a demotion per block. */
    if (seq_reserve_cap(s, max_blocks, max_blocks * bs) != ST_OK ||
        ops_reserve(pool, 2 * (uint64_t)max_blocks) != ST_OK) {
        return ST_ENOMEM;
    }
    pool->st.prefix_queries += n;
    for (i = 0; i < max_blocks; i++) {
        uint8_t h[BM_HASH_LEN];
        bm_block_t *b;
        uint32_t id;

        bm__memo_hash(pool, s->memo, i, parent, &pool->tenants[s->tenant], s->extra,
                      s->extra_len, tokens + (size_t)i * bs, h);
        id = bm__ht_find(dev, h);
        if (id != BM_NONE) {
            b = bm__blk(pool, BM_DEV, id);
            if (tref_reserve(b, s->tenant) != ST_OK) {
                break; /* no memory for the tenant record: the run ends as on a miss */
            }
            blk_get(pool, BM_DEV, b, s->tenant);
        } else {
            bm_block_t *c;
            id = cpu->n_blocks > 0 ? bm__ht_find(cpu, h) : BM_NONE;
            if (id == BM_NONE || tier_avail(pool, BM_DEV) == 0) {
                break;
            }
            /* Promote: pin the CPU block so that a demotion made by the
             * allocation below cannot take it, copy it up, unpin. */
            c = bm__blk(pool, BM_CPU, id);
            if (tref_reserve(c, s->tenant) != ST_OK) {
                break;
            }
            blk_get(pool, BM_CPU, c, s->tenant);
            b = blk_alloc(pool, BM_DEV, s->tenant);
            op_push(pool, KV_OP_SWAP_IN, c->id, b->id);
            bm__ev_copy(pool, BM_DEV, b, BM_CPU, c);
            memcpy(b->hash, h, BM_HASH_LEN);
            b->hashed = 1;
            bm__ht_insert(dev, b);
            blk_put(pool, BM_CPU, c, s->tenant);
            pool->st.n_promoted++;
        }
        s->table[i] = (int32_t)b->id;
        memcpy(s->toks + (size_t)i * bs, tokens + (size_t)i * bs, (size_t)bs * sizeof(*tokens));
        parent = b->hash;
    }
    s->n_blocks = i;
    s->len = i * bs;
    pool->st.prefix_hits += s->len;
    *n_cached = s->len;
    bm__step_taint(pool, s);
    return ST_OK;
}

uint32_t
bm_prefix_probe(const bm_pool_t *pool, uint32_t tenant, const int32_t *tokens, uint32_t n)
{
    return bm_prefix_probe_memo(pool, tenant, tokens, n, NULL);
}

uint32_t
bm_prefix_probe_memo(const bm_pool_t *pool, uint32_t tenant, const int32_t *tokens, uint32_t n,
                     bm_hash_memo_t *memo)
{
    const bm_tenant_t *t = tenant_find(pool, tenant);
    bm_tenant_t dflt;
    uint8_t h[2][BM_HASH_LEN];
    uint32_t i;

    if (!pool->cfg.prefix_caching || n == 0 || tokens == NULL) {
        return 0;
    }
    if (t == NULL) {
        /* Unknown tenant: its default salt, as bm_seq_create would set. */
        memset(&dflt, 0, sizeof(dflt));
        dflt.salt_len = 4;
        for (int k = 0; k < 4; k++) {
            dflt.salt[k] = (uint8_t)(tenant >> (8 * k));
        }
        t = &dflt;
    }
    for (i = 0; i < (n - 1) / pool->bs; i++) {
        bm__memo_hash(pool, memo, i, i > 0 ? h[(i - 1) & 1] : NULL, t, NULL, 0,
                      tokens + (size_t)i * pool->bs, h[i & 1]);
        if (bm__ht_find(&pool->tier[BM_DEV], h[i & 1]) == BM_NONE &&
            (pool->tier[BM_CPU].n_blocks == 0 ||
             bm__ht_find(&pool->tier[BM_CPU], h[i & 1]) == BM_NONE)) {
            break;
        }
    }
    return i * pool->bs;
}

void
bm_pool_reset_prefix_cache(bm_pool_t *pool)
{
    for (int tier = 0; tier < 2; tier++) {
        bm_tier_t *t = &pool->tier[tier];
        list_node_t *it, *tmp;
        LIST_FOREACH_SAFE(it, tmp, &t->lru)
        {
            bm_block_t *b = LIST_ENTRY(it, bm_block_t, lru);
            if (b->cached) {
                blk_uncache(pool, tier, b);
                list_remove(&b->lru);
                list_push_front(&t->lru, &b->lru);
                pool->st.n_evicted++;
            }
        }
    }
    bm__ev_reset(pool);
}

/* ------------------------------------------------------------- swap tier */

int
bm_seq_swap_out(bm_pool_t *pool, uint64_t seq)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    bm_tier_t *cpu = &pool->tier[BM_CPU];
    uint32_t need = 0;
    int32_t *plan;

    if (s == NULL || s->swapped) {
        return ST_EINVAL;
    }
    bm__step_check_move(pool, s, "swap-out");
    /* Count the CPU queue entries this takes: new copies plus revived
     * cached CPU blocks. Twins and USED hash matches are free. */
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);
        uint32_t id;
        if (b->twin != BM_NONE) {
            continue;
        }
        id = b->hashed && cpu->n_blocks > 0 ? bm__ht_find(cpu, b->hash) : BM_NONE;
        if (id != BM_NONE) {
            need += bm__blk(pool, BM_CPU, id)->ref == 0;
            continue;
        }
        need++;
    }
    if (need > tier_avail(pool, BM_CPU)) {
        return ST_EAGAIN;
    }
    /* Memory: a SWAP_OUT and a DROP per block, and the tenant records of
     * the CPU blocks pass 1 will share. */
    if (ops_reserve(pool, 2 * (uint64_t)(s->n_blocks - s->n_released)) != ST_OK) {
        return ST_ENOMEM;
    }
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);
        uint32_t id = b->twin;
        if (id == BM_NONE && b->hashed && cpu->n_blocks > 0) {
            id = bm__ht_find(cpu, b->hash);
        }
        if (id != BM_NONE && tref_reserve(bm__blk(pool, BM_CPU, id), s->tenant) != ST_OK) {
            return ST_ENOMEM;
        }
    }

    /* plan[i - n_released]; released entries stay 0 on either tier. */
    CHECK(s->n_blocks - s->n_released <= pool->cap_scratch);
    plan = pool->scratch;
    /* Pass 1: share what already exists on the CPU tier, before any
     * allocation could evict a cached match. */
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);
        uint32_t id = b->twin;
        if (id == BM_NONE && b->hashed && cpu->n_blocks > 0) {
            id = bm__ht_find(cpu, b->hash);
        }
        if (id != BM_NONE) {
            blk_get(pool, BM_CPU, bm__blk(pool, BM_CPU, id), s->tenant);
        }
        plan[i - s->n_released] = id == BM_NONE ? -1 : (int32_t)id;
    }
    /* Pass 2: copy the rest. A block other resident sequences still hold
     * gets a twin link, so their own swap-outs reuse this copy. */
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)s->table[i]);
        bm_block_t *c;
        if (plan[i - s->n_released] >= 0) {
            continue;
        }
        c = blk_alloc(pool, BM_CPU, s->tenant);
        op_push(pool, KV_OP_SWAP_OUT, b->id, c->id);
        pool->st.n_swap_out++;
        if (b->hashed) {
            bm__ev_copy(pool, BM_CPU, c, BM_DEV, b);
            memcpy(c->hash, b->hash, BM_HASH_LEN);
            c->hashed = 1;
            if (bm__ht_find(cpu, c->hash) == BM_NONE) {
                bm__ht_insert(cpu, c);
            }
        }
        if (b->ref > 1) {
            twin_link(b, c);
        }
        plan[i - s->n_released] = (int32_t)c->id;
    }
    /* Pass 3: release the device blocks, last to first. Sole-held hashed
     * blocks stay CACHED on the device until they are needed. */
    for (uint32_t i = s->n_blocks; i-- > s->n_released;) {
        blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)s->table[i]), s->tenant);
        s->table[i] = plan[i - s->n_released];
    }
    bm__tab_changed(s, 0);
    s->swapped = 1;
    return ST_OK;
}

int
bm_seq_swap_in(bm_pool_t *pool, uint64_t seq)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    bm_tier_t *dev = &pool->tier[BM_DEV];
    int32_t *plan;

    if (s == NULL || !s->swapped) {
        return ST_EINVAL;
    }
    if (swap_in_needed(pool, s) > tier_avail(pool, BM_DEV)) {
        return ST_EAGAIN;
    }
    /* Memory: a SWAP_IN, a demotion and a DROP_SWAP per block, and the
     * tenant records of the device blocks pass 1 will share. */
    if (ops_reserve(pool, 3 * (uint64_t)(s->n_blocks - s->n_released)) != ST_OK) {
        return ST_ENOMEM;
    }
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *c = bm__blk(pool, BM_CPU, (uint32_t)s->table[i]);
        uint32_t id = c->twin;
        if (id == BM_NONE && c->hashed) {
            id = bm__ht_find(dev, c->hash);
        }
        if (id != BM_NONE && tref_reserve(bm__blk(pool, BM_DEV, id), s->tenant) != ST_OK) {
            return ST_ENOMEM;
        }
    }
    CHECK(s->n_blocks - s->n_released <= pool->cap_scratch);
    plan = pool->scratch; /* plan[i - n_released] */
    /* Pass 1: re-share device twins and cached device copies. */
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        const bm_block_t *c = bm__blk(pool, BM_CPU, (uint32_t)s->table[i]);
        uint32_t id = c->twin;
        if (id == BM_NONE && c->hashed) {
            id = bm__ht_find(dev, c->hash);
        }
        if (id != BM_NONE) {
            blk_get(pool, BM_DEV, bm__blk(pool, BM_DEV, id), s->tenant);
        }
        plan[i - s->n_released] = id == BM_NONE ? -1 : (int32_t)id;
    }
    /* Pass 2: copy the rest back. The CPU blocks stay referenced until
     * pass 3, so demotions triggered here cannot overwrite them first. */
    for (uint32_t i = s->n_released; i < s->n_blocks; i++) {
        bm_block_t *c = bm__blk(pool, BM_CPU, (uint32_t)s->table[i]);
        bm_block_t *b;
        if (plan[i - s->n_released] >= 0) {
            continue;
        }
        b = blk_alloc(pool, BM_DEV, s->tenant);
        op_push(pool, KV_OP_SWAP_IN, c->id, b->id);
        pool->st.n_swap_in++;
        if (c->hashed) {
            bm__ev_copy(pool, BM_DEV, b, BM_CPU, c);
            memcpy(b->hash, c->hash, BM_HASH_LEN);
            b->hashed = 1;
            if (bm__ht_find(dev, b->hash) == BM_NONE) {
                bm__ht_insert(dev, b);
            }
        }
        if (c->ref > 1) {
            twin_link(b, c);
        }
        plan[i - s->n_released] = (int32_t)b->id;
    }
    for (uint32_t i = s->n_blocks; i-- > s->n_released;) {
        blk_put(pool, BM_CPU, bm__blk(pool, BM_CPU, (uint32_t)s->table[i]), s->tenant);
        s->table[i] = plan[i - s->n_released];
    }
    bm__tab_changed(s, 0);
    s->swapped = 0;
    bm__step_taint(pool, s);
    return ST_OK;
}

uint32_t
bm_seq_swap_in_needed(const bm_pool_t *pool, uint64_t seq)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    return s != NULL && s->swapped ? swap_in_needed(pool, s) : 0;
}

/* ------------------------------------------------------------- accessors */

int
bm_seq_exists(const bm_pool_t *pool, uint64_t seq)
{
    return bm__seq_find(pool, seq) != NULL;
}

int
bm_seq_is_swapped(const bm_pool_t *pool, uint64_t seq)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    return s != NULL && s->swapped;
}

uint32_t
bm_seq_len(const bm_pool_t *pool, uint64_t seq)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    return s != NULL ? s->len : 0;
}

const int32_t *
bm_seq_table(const bm_pool_t *pool, uint64_t seq, uint32_t *n_blocks)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL) {
        if (n_blocks != NULL) {
            *n_blocks = 0;
        }
        return NULL;
    }
    if (n_blocks != NULL) {
        *n_blocks = s->n_blocks;
    }
    return s->table;
}

const kv_op_t *
bm_pool_ops(const bm_pool_t *pool, uint32_t *n_ops)
{
    *n_ops = pool->n_ops;
    return pool->ops;
}

void
bm_pool_ops_clear(bm_pool_t *pool)
{
    pool->n_ops = 0;
}

uint32_t
bm_pool_block_size(const bm_pool_t *pool)
{
    return pool->bs;
}

uint32_t
bm_pool_free_blocks(const bm_pool_t *pool)
{
    return tier_avail(pool, BM_DEV);
}

uint32_t
bm_pool_free_swap_blocks(const bm_pool_t *pool)
{
    return tier_avail(pool, BM_CPU);
}

void
bm_pool_stats(const bm_pool_t *pool, bm_stats_t *out)
{
    *out = pool->st;
    out->dev_total = pool->tier[BM_DEV].n_blocks - 1;
    out->dev_free = pool->tier[BM_DEV].n_free;
    out->dev_cached = pool->tier[BM_DEV].n_cached;
    out->dev_used = pool->tier[BM_DEV].n_used;
    out->cpu_total = pool->tier[BM_CPU].n_blocks;
    out->cpu_free = pool->tier[BM_CPU].n_free;
    out->cpu_cached = pool->tier[BM_CPU].n_cached;
    out->cpu_used = pool->tier[BM_CPU].n_used;
}

uint32_t
bm_tenant_blocks(const bm_pool_t *pool, uint32_t tenant)
{
    const bm_tenant_t *t = tenant_find(pool, tenant);

    return t != NULL ? t->blocks[BM_DEV] : 0;
}

uint32_t
bm_tenant_swap_blocks(const bm_pool_t *pool, uint32_t tenant)
{
    const bm_tenant_t *t = tenant_find(pool, tenant);

    return t != NULL ? t->blocks[BM_CPU] : 0;
}

void
bm__blk_put(bm_pool_t *pool, int tier, bm_block_t *b, uint32_t tenant)
{
    blk_put(pool, tier, b, tenant);
}

uint32_t
bm_pool_watermark_blocks(const bm_pool_t *pool)
{
    return pool->watermark_blocks;
}

/* Helpers of bm_compact.c (blockmgr_int.h): the static operations above. */
int
bm__ops_reserve(bm_pool_t *pool, uint64_t n)
{
    return ops_reserve(pool, n);
}

void
bm__op_push(bm_pool_t *pool, kv_op_kind_t kind, uint32_t src, uint32_t dst)
{
    op_push(pool, kind, src, dst);
}

bm_block_t *
bm__blk_alloc(bm_pool_t *pool, uint32_t tenant)
{
    return blk_alloc(pool, BM_DEV, tenant);
}

void
bm__twin_break(bm_pool_t *pool, bm_block_t *b)
{
    twin_break(pool, BM_DEV, b);
}

uint32_t
bm__dev_avail(const bm_pool_t *pool)
{
    return tier_avail(pool, BM_DEV);
}
