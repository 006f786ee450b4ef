/* bm_hash.c - content hashes of full blocks and the per-tier hash tables.
 *
 * A block hash is SHA-256 (OpenSSL EVP) over
 *
 *   first block:  "kvs-bm1" | salt_len (1 byte) | salt | tokens | extra
 *   later blocks: parent hash (32 bytes)                | tokens | extra
 *
 * with tokens as little-endian int32 and extra as extra_len (1 byte) plus
 * the bytes. The parent hash chains the whole prefix into every block, and
 * the salt in the first block keeps tenants with different salts apart for
 * the entire chain.
 *
 * Each tier has its own table mapping a hash to the one block registered
 * with it (chained through bm_block_t.hnext, buckets indexed by the first
 * hash bytes, which SHA-256 spreads uniformly). Sizes are fixed at create:
 * at least twice the tier's block count, so chains stay O(1).
 *
 * Thread: engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/status.h"
#include "common/xmalloc.h"

int
bm__ht_init(bm_tier_t *t, uint32_t n_blocks)
{
    uint32_t n = 16;

    while (n < 2 * (uint64_t)n_blocks && n < (1u << 31)) {
        n <<= 1;
    }
    t->buckets = xmalloc((size_t)n * sizeof(*t->buckets));
    memset(t->buckets, 0xff, (size_t)n * sizeof(*t->buckets));
    t->mask = n - 1;
    t->n_registered = 0;
    return ST_OK;
}

void
bm__ht_fini(bm_tier_t *t)
{
    free(t->buckets);
    t->buckets = NULL;
}

static uint32_t
bucket_of(const bm_tier_t *t, const uint8_t *hash)
{
    uint32_t h;

    memcpy(&h, hash, sizeof(h));
    return h & t->mask;
}

uint32_t
bm__ht_find(const bm_tier_t *t, const uint8_t *hash)
{
    uint32_t id = t->buckets[bucket_of(t, hash)];

    while (id != BM_NONE) {
        const bm_block_t *b = &t->blocks[id];
        if (memcmp(b->hash, hash, BM_HASH_LEN) == 0) {
            return id;
        }
        id = b->hnext;
    }
    return BM_NONE;
}

void
bm__ht_insert(bm_tier_t *t, bm_block_t *b)
{
    uint32_t k = bucket_of(t, b->hash);

    CHECK(b->hashed && !b->cached);
    b->hnext = t->buckets[k];
    t->buckets[k] = b->id;
    b->cached = 1;
    t->n_registered++;
    bm__ev_registered(t, b, 1);
}

void
bm__ht_remove(bm_tier_t *t, bm_block_t *b)
{
    uint32_t *link = &t->buckets[bucket_of(t, b->hash)];

    CHECK(b->cached);
    while (*link != b->id) {
        CHECK(*link != BM_NONE); /* a registered block is on its chain */
        link = &t->blocks[*link].hnext;
    }
    *link = b->hnext;
    b->hnext = BM_NONE;
    b->cached = 0;
    t->n_registered--;
    bm__ev_registered(t, b, 0);
}

void
bm__hash_block(const bm_pool_t *pool, const uint8_t *parent, const bm_tenant_t *tenant,
               const uint8_t *extra, uint32_t extra_len, const int32_t *toks,
               uint8_t out[BM_HASH_LEN])
{
    static const char tag[] = "kvs-bm1";
    uint8_t buf[256];
    uint8_t len8;
    unsigned int out_len = 0;
    EVP_MD_CTX *ctx = pool->md_ctx;

    ++*pool->n_hashed;
    CHECK(EVP_DigestInit_ex(ctx, pool->md, NULL) == 1);
    if (parent != NULL) {
        EVP_DigestUpdate(ctx, parent, BM_HASH_LEN);
    } else {
        len8 = (uint8_t)tenant->salt_len;
        EVP_DigestUpdate(ctx, tag, sizeof(tag) - 1);
        EVP_DigestUpdate(ctx, &len8, 1);
        EVP_DigestUpdate(ctx, tenant->salt, tenant->salt_len);
    }
    /* Token ids as little-endian bytes, in chunks of the local buffer. */
    for (uint32_t i = 0; i < pool->bs;) {
        size_t n = 0;
        for (; i < pool->bs && n + 4 <= sizeof(buf); i++) {
            uint32_t v = (uint32_t)toks[i];
            buf[n++] = (uint8_t)v;
            buf[n++] = (uint8_t)(v >> 8);
            buf[n++] = (uint8_t)(v >> 16);
            buf[n++] = (uint8_t)(v >> 24);
        }
        EVP_DigestUpdate(ctx, buf, n);
    }
    len8 = (uint8_t)extra_len;
    EVP_DigestUpdate(ctx, &len8, 1);
    if (extra_len > 0) {
        EVP_DigestUpdate(ctx, extra, extra_len);
    }
    CHECK(EVP_DigestFinal_ex(ctx, out, &out_len) == 1 && out_len == BM_HASH_LEN);
}
