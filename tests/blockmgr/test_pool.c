/* test_pool.c - block manager unit tests: pool creation, reserve / free /
 * truncate, block tables and slots, the LRU free queue, the prefix cache
 * (salts, extra keys, probe, counters), fork and copy-on-write, watermark,
 * tenant accounting, and every error path. Each fixture's teardown runs
 * bm_pool_check(). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"

static bm_pool_t *pool;

/* 8 usable device blocks of 4 tokens, 4 CPU blocks, prefix caching on. */
static void
setup(void)
{
    bm_config_t cfg = {.block_size = 4,
                       .num_blocks = 9,
                       .swap_blocks = 4,
                       .prefix_caching = 1,
                       .watermark = 0.25f};

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
}

static void
teardown(void)
{
    bm_pool_check(pool);
    bm_pool_destroy(pool);
    pool = NULL;
}

static void
seq_tokens(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++) {
        t[i] = base + (int32_t)i;
    }
}

/* Creates seq and reserves n tokens base, base+1, ...; returns rc. */
static int
make_seq(uint64_t seq, uint32_t tenant, uint32_t n, int32_t base)
{
    int32_t toks[256], slots[256];
    int rc = bm_seq_create(pool, seq, tenant);

    ck_assert_int_eq(rc, ST_OK);
    seq_tokens(toks, n, base);
    rc = bm_seq_reserve(pool, seq, toks, n, slots);
    bm_pool_check(pool);
    return rc;
}

static uint32_t
n_ops(void)
{
    uint32_t n;

    bm_pool_ops(pool, &n);
    return n;
}

START_TEST(test_create_rejects_bad_config)
{
    bm_pool_t *p = NULL;
    bm_config_t cfg = {.block_size = 16, .num_blocks = 8};

    ck_assert_int_eq(bm_pool_create(NULL, &p), ST_EINVAL);
    ck_assert_int_eq(bm_pool_create(&cfg, NULL), ST_EINVAL);
    cfg.block_size = 0;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.block_size = 16;
    cfg.num_blocks = 1;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.num_blocks = 0x10000000; /* slots would overflow int32 */
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.num_blocks = 8;
    cfg.swap_blocks = 0x80000000u;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.swap_blocks = 0;
    cfg.watermark = 1.0f;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.watermark = -0.1f;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    cfg.watermark = NAN;
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_EINVAL);
    ck_assert_ptr_null(p);
    cfg.watermark = 0.0f;
    cfg.num_blocks = 2; /* the smallest pool: one usable block */
    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    ck_assert_uint_eq(bm_pool_free_blocks(p), 1);
    ck_assert_uint_eq(bm_pool_free_swap_blocks(p), 0);
    ck_assert_uint_eq(bm_pool_block_size(p), 16);
    bm_pool_check(p);
    bm_pool_destroy(p);
    bm_pool_destroy(NULL);
}
END_TEST

START_TEST(test_reserve_slots_and_table)
{
    int32_t toks[10], slots[10];
    const int32_t *table;
    uint32_t nb;

    ck_assert_int_eq(bm_seq_create(pool, 7, 0), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 7, 0), ST_EINVAL);
    ck_assert(bm_seq_exists(pool, 7));
    ck_assert(!bm_seq_exists(pool, 8));
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 7, 10), 3);
    seq_tokens(toks, 10, 100);
    ck_assert_int_eq(bm_seq_reserve(pool, 7, toks, 6, slots), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 7, toks + 6, 4, slots + 6), ST_OK);
    ck_assert_uint_eq(bm_seq_len(pool, 7), 10);
    table = bm_seq_table(pool, 7, &nb);
    ck_assert_uint_eq(nb, 3);
    for (uint32_t i = 0; i < 10; i++) {
        ck_assert_int_ne(table[i / 4], 0); /* never the null block */
        ck_assert_int_eq(slots[i], table[i / 4] * 4 + (int32_t)(i % 4));
    }
    ck_assert_int_ne(table[0], table[1]);
    ck_assert_int_ne(table[1], table[2]);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 5);
    ck_assert_uint_eq(n_ops(), 0);
    /* n_new == 0 is a no-op; NULL arrays with tokens are errors. */
    ck_assert_int_eq(bm_seq_reserve(pool, 7, NULL, 0, NULL), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 7, NULL, 1, slots), ST_EINVAL);
    ck_assert_int_eq(bm_seq_reserve(pool, 7, toks, 1, NULL), ST_EINVAL);
    ck_assert_int_eq(bm_seq_reserve(pool, 99, toks, 1, slots), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_len(pool, 99), 0);
    ck_assert_ptr_null(bm_seq_table(pool, 99, &nb));
    ck_assert_uint_eq(nb, 0);
    ck_assert_ptr_null(bm_seq_table(pool, 99, NULL));
    ck_assert_ptr_nonnull(bm_seq_table(pool, 7, NULL));
}
END_TEST

START_TEST(test_reserve_exhausted_returns_eagain)
{
    int32_t toks[64], slots[64];
    bm_stats_t before, after;
    const int32_t *t0;
    uint32_t nb;

    seq_tokens(toks, 64, 1);
    ck_assert_int_eq(make_seq(1, 0, 30, 1), ST_OK); /* 8 blocks, 2 free slots in the tail */
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 0);
    bm_pool_stats(pool, &before);
    t0 = bm_seq_table(pool, 1, &nb);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 3, slots), ST_EAGAIN);
    bm_pool_stats(pool, &after);
    ck_assert_mem_eq(&before, &after, sizeof(before));
    ck_assert_uint_eq(bm_seq_len(pool, 1), 30);
    ck_assert_ptr_eq(bm_seq_table(pool, 1, &nb), t0);
    ck_assert_uint_eq(nb, 8);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 2, slots), ST_OK); /* fits the tail */
    ck_assert_int_eq(make_seq(2, 0, 1, 1), ST_EAGAIN);
    ck_assert_uint_eq(bm_seq_len(pool, 2), 0);
    bm_seq_free(pool, 1);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 8);
    ck_assert_int_eq(bm_seq_reserve(pool, 2, toks, 32, slots), ST_OK);
}
END_TEST

START_TEST(test_free_keeps_full_blocks_cached)
{
    bm_stats_t st;

    ck_assert_int_eq(make_seq(1, 0, 10, 1), ST_OK);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_total, 8);
    ck_assert_uint_eq(st.dev_used, 3);
    ck_assert_uint_eq(st.dev_free, 5);
    ck_assert_uint_eq(st.dev_cached, 0);
    bm_seq_free(pool, 1);
    bm_seq_free(pool, 1); /* unknown: no-op */
    ck_assert(!bm_seq_exists(pool, 1));
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_used, 0);
    ck_assert_uint_eq(st.dev_cached, 2); /* two full hashed blocks */
    ck_assert_uint_eq(st.dev_free, 6);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 8);
    bm_pool_reset_prefix_cache(pool);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_cached, 0);
    ck_assert_uint_eq(st.dev_free, 8);
    ck_assert_uint_eq(st.n_evicted, 2);
}
END_TEST

START_TEST(test_lru_prefers_free_then_oldest_cached)
{
    const int32_t *t;
    int32_t a0, a1, b0, b1, c0;
    uint32_t nb, nc;
    int32_t toks[16];
    bm_stats_t st;

    ck_assert_int_eq(make_seq(1, 0, 8, 100), ST_OK);
    t = bm_seq_table(pool, 1, &nb);
    a0 = t[0];
    a1 = t[1];
    ck_assert_int_eq(make_seq(2, 0, 8, 200), ST_OK);
    t = bm_seq_table(pool, 2, &nb);
    b0 = t[0];
    b1 = t[1];
    bm_seq_free(pool, 1); /* cached, older */
    bm_seq_free(pool, 2); /* cached, newer */
    /* 4 FREE blocks are handed out before any cached one is evicted. */
    ck_assert_int_eq(make_seq(3, 0, 16, 300), ST_OK);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_cached, 4);
    ck_assert_uint_eq(st.n_evicted, 0);
    /* Next: the oldest, seq 1's tail before its head. */
    ck_assert_int_eq(make_seq(4, 0, 1, 400), ST_OK);
    t = bm_seq_table(pool, 4, &nb);
    c0 = t[0];
    ck_assert_int_eq(c0, a1);
    ck_assert_int_eq(make_seq(5, 0, 1, 500), ST_OK);
    ck_assert_int_eq(bm_seq_table(pool, 5, &nb)[0], a0);
    /* Seq 2's blocks are still cached and revive on a hit, in O(1). */
    seq_tokens(toks, 9, 200);
    ck_assert_int_eq(bm_seq_create(pool, 6, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 6, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    t = bm_seq_table(pool, 6, &nb);
    ck_assert_uint_eq(nb, 2);
    ck_assert_int_eq(t[0], b0);
    ck_assert_int_eq(t[1], b1);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_cached, 0);
    ck_assert_uint_eq(st.dev_used, 8);
    ck_assert_uint_eq(st.n_evicted, 0); /* both went to the CPU tier */
    ck_assert_uint_eq(st.n_demoted, 2);
}
END_TEST

START_TEST(test_prefix_lookup_rules)
{
    int32_t toks[32], slots[32];
    uint32_t nc;
    bm_stats_t st;

    seq_tokens(toks, 32, 10);
    ck_assert_int_eq(make_seq(1, 0, 12, 10), ST_OK); /* 3 full blocks */
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    /* 12 tokens: the last one must be computed, so only 2 blocks. */
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 12), 8);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 13), 12);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 1), 0);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 0), 0);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 12, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    ck_assert_uint_eq(bm_seq_len(pool, 2), 8);
    ck_assert_int_eq(bm_seq_table(pool, 2, NULL)[1], bm_seq_table(pool, 1, NULL)[1]);
    /* Only an empty sequence may look up. */
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 12, &nc), ST_EINVAL);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 99, toks, 12, &nc), ST_EINVAL);
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, NULL, 12, &nc), ST_EINVAL);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 12, NULL), ST_EINVAL);
    /* Stops at the first miss even if later blocks would match. */
    toks[5] = -1;
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 20, &nc), ST_OK);
    ck_assert_uint_eq(nc, 4);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 20), 4);
    /* The continuation writes after the cached part. */
    ck_assert_int_eq(bm_seq_reserve(pool, 3, toks + 4, 4, slots), ST_OK);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.prefix_queries, 32);
    ck_assert_uint_eq(st.prefix_hits, 12);
    /* An empty prompt finds nothing. */
    ck_assert_int_eq(bm_seq_create(pool, 4, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 4, toks, 0, &nc), ST_OK);
    ck_assert_uint_eq(nc, 0);
}
END_TEST

START_TEST(test_prefix_tenant_salts_and_extra_keys)
{
    int32_t toks[16];
    uint32_t nc;

    seq_tokens(toks, 16, 50);
    ck_assert_int_eq(make_seq(1, 1, 8, 50), ST_OK);
    /* Tenant 2 has its own default salt: no sharing. */
    ck_assert_uint_eq(bm_prefix_probe(pool, 2, toks, 9), 0);
    ck_assert_uint_eq(bm_prefix_probe(pool, 1, toks, 9), 8);
    ck_assert_uint_eq(bm_prefix_probe(pool, 77, toks, 9), 0); /* never seen */
    ck_assert_int_eq(bm_seq_create(pool, 2, 2), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 0);
    bm_seq_free(pool, 2);
    /* Same salt: tenants share, and each counts the blocks. */
    ck_assert_int_eq(bm_tenant_set_salt(pool, 1, "shared", 6), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 2, "shared", 6), ST_OK);
    ck_assert_int_eq(make_seq(3, 1, 8, 50), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 4, 2), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 4, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    ck_assert_int_eq(bm_seq_table(pool, 4, NULL)[0], bm_seq_table(pool, 3, NULL)[0]);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 1), 4); /* seq 1 and seq 3 */
    ck_assert_uint_eq(bm_tenant_blocks(pool, 2), 2);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 3), 0);
    bm_pool_check(pool);
    /* A third tenant with the same salt: three tenant records per block. */
    ck_assert_int_eq(bm_tenant_set_salt(pool, 5, "shared", 6), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 5, 5), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 5, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    ck_assert_int_eq(bm_seq_create(pool, 6, 2), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 6, toks, 9, &nc), ST_OK);
    bm_pool_check(pool);
    bm_seq_free(pool, 4);
    bm_seq_free(pool, 3);
    bm_pool_check(pool);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 2), 2);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 5), 2);
    /* Empty salt is allowed; bad salts are not. */
    ck_assert_int_eq(bm_tenant_set_salt(pool, 9, NULL, 0), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 9, NULL, 3), ST_EINVAL);
    {
        char big[65] = {0};
        ck_assert_int_eq(bm_tenant_set_salt(pool, 9, big, 65), ST_EINVAL);
        ck_assert_int_eq(bm_seq_set_extra_key(pool, 5, big, 65), ST_EINVAL);
    }
    /* Extra keys separate sequences of the same tenant. */
    ck_assert_int_eq(bm_seq_create(pool, 7, 1), ST_OK);
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 7, "lora-a", 6), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 7, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 0);
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 99, "x", 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 5, "x", 1), ST_EINVAL); /* not empty */
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 7, NULL, 1), ST_EINVAL);
    {
        int32_t slots[9];
        ck_assert_int_eq(bm_seq_reserve(pool, 7, toks, 9, slots), ST_OK);
        ck_assert_int_eq(bm_seq_fork(pool, 7, 8), ST_OK);
    }
    bm_seq_free(pool, 1);
    bm_seq_free(pool, 5);
    bm_seq_free(pool, 6);
    ck_assert_int_eq(bm_seq_create(pool, 9, 1), ST_OK);
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 9, "lora-a", 6), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 9, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    ck_assert_int_eq(bm_seq_table(pool, 9, NULL)[1], bm_seq_table(pool, 8, NULL)[1]);
    ck_assert_int_eq(bm_seq_set_extra_key(pool, 9, NULL, 0), ST_EINVAL);
}
END_TEST

START_TEST(test_prefix_caching_disabled)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 9, .swap_blocks = 4, .prefix_caching = 0};
    bm_pool_t *p;
    int32_t toks[12], slots[12];
    uint32_t nc;
    bm_stats_t st;

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    seq_tokens(toks, 12, 1);
    ck_assert_int_eq(bm_seq_create(p, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks, 12, slots), ST_OK);
    bm_seq_free(p, 1);
    ck_assert_int_eq(bm_seq_create(p, 2, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(p, 2, toks, 12, &nc), ST_OK);
    ck_assert_uint_eq(nc, 0);
    ck_assert_uint_eq(bm_prefix_probe(p, 0, toks, 12), 0);
    bm_pool_stats(p, &st);
    ck_assert_uint_eq(st.dev_cached, 0);
    ck_assert_uint_eq(st.prefix_queries, 12);
    /* Swapping works without hashes (twins only). */
    ck_assert_int_eq(bm_seq_reserve(p, 2, toks, 6, slots), ST_OK);
    ck_assert_int_eq(bm_seq_fork(p, 2, 3), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(p, 2), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(p, 3), ST_OK);
    bm_pool_stats(p, &st);
    ck_assert_uint_eq(st.n_swap_out, 2);
    ck_assert_uint_eq(st.cpu_used, 2);
    bm_pool_check(p);
    bm_pool_destroy(p);
}
END_TEST

START_TEST(test_duplicate_full_block_registers_later)
{
    int32_t toks[8], slots[8];
    uint32_t nc;
    bm_stats_t st;
    int32_t dup;

    /* Two sequences compute the same block independently. */
    ck_assert_int_eq(make_seq(1, 0, 4, 7), ST_OK);
    ck_assert_int_eq(make_seq(2, 0, 4, 7), ST_OK);
    dup = bm_seq_table(pool, 2, NULL)[0];
    ck_assert_int_ne(dup, bm_seq_table(pool, 1, NULL)[0]);
    /* The duplicate chains its successor's hash even unregistered. */
    seq_tokens(toks, 8, 11);
    ck_assert_int_eq(bm_seq_reserve(pool, 2, toks, 4, slots), ST_OK);
    bm_seq_free(pool, 1); /* the registered original: CACHED */
    bm_pool_reset_prefix_cache(pool);
    bm_seq_free(pool, 2); /* now the duplicate registers */
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_cached, 2);
    seq_tokens(toks, 4, 7);
    seq_tokens(toks + 4, 4, 11);
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 8, &nc), ST_OK);
    ck_assert_uint_eq(nc, 4);
    ck_assert_int_eq(bm_seq_table(pool, 3, NULL)[0], dup);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, (int32_t[]){7, 8, 9, 10, 11, 12, 13, 14, 0}, 9), 8);
}
END_TEST

START_TEST(test_fork_and_copy_on_write)
{
    int32_t toks[8], slots[8];
    const int32_t *tp, *tc;
    const kv_op_t *ops;
    uint32_t nb, n;
    int32_t tail;
    bm_stats_t st;

    ck_assert_int_eq(make_seq(1, 3, 6, 1), ST_OK); /* one full block + 2 in the tail */
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_EINVAL); /* child exists */
    ck_assert_int_eq(bm_seq_fork(pool, 9, 10), ST_EINVAL);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 1), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_len(pool, 2), 6);
    tp = bm_seq_table(pool, 1, &nb);
    tc = bm_seq_table(pool, 2, &nb);
    ck_assert_int_eq(tp[0], tc[0]);
    ck_assert_int_eq(tp[1], tc[1]);
    tail = tp[1];
    ck_assert_uint_eq(bm_tenant_blocks(pool, 3), 2);
    /* Writing into the shared tail costs one block: the copy. */
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 2, 1), 1);
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 2, 3), 2);
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 2, 0), 0);
    seq_tokens(toks, 8, 90);
    ck_assert_int_eq(bm_seq_reserve(pool, 2, toks, 1, slots), ST_OK);
    ops = bm_pool_ops(pool, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ops[0].kind, KV_OP_COPY);
    ck_assert_int_eq(ops[0].src, tail);
    tc = bm_seq_table(pool, 2, &nb);
    ck_assert_int_eq(ops[0].dst, tc[1]);
    ck_assert_int_ne(tc[1], tail);
    ck_assert_int_eq(tc[0], bm_seq_table(pool, 1, NULL)[0]); /* full block stays shared */
    ck_assert_int_eq(slots[0], tc[1] * 4 + 2);
    /* The parent is the only holder now: it writes in place. */
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 1, 2), 0);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 2, slots), ST_OK);
    ck_assert_int_eq(slots[0], tail * 4 + 2);
    ck_assert_uint_eq(n_ops(), 1);
    bm_pool_ops_clear(pool);
    ck_assert_uint_eq(n_ops(), 0);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_copies, 1);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 3), 3);
    /* Fork at a block boundary: no copy on the next write. */
    ck_assert_int_eq(bm_seq_fork(pool, 1, 3), ST_OK);
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 3, 1), 1);
    ck_assert_int_eq(bm_seq_reserve(pool, 3, toks, 1, slots), ST_OK);
    ck_assert_uint_eq(n_ops(), 0);
    /* Copy-on-write needs a block too: EAGAIN leaves everything as is. */
    ck_assert_int_eq(bm_seq_fork(pool, 3, 4), ST_OK);
    ck_assert_int_eq(make_seq(5, 0, 15, 500), ST_OK); /* the last 4 blocks, tail partial */
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 0);
    ck_assert_int_eq(bm_seq_reserve(pool, 4, toks, 1, slots), ST_EAGAIN);
    ck_assert_uint_eq(n_ops(), 0);
    bm_seq_free(pool, 5);
    ck_assert_int_eq(bm_seq_reserve(pool, 4, toks, 1, slots), ST_OK);
    ck_assert_uint_eq(n_ops(), 1);
}
END_TEST

START_TEST(test_truncate)
{
    int32_t toks[16], slots[16];
    uint32_t nb, nc;
    bm_stats_t st;

    ck_assert_int_eq(make_seq(1, 0, 10, 1), ST_OK);
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 11), ST_EINVAL);
    ck_assert_int_eq(bm_seq_truncate(pool, 9, 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 2), ST_OK); /* 8: the tail block goes */
    bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 2);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 6);
    /* Into a full registered block: it stays cached until written. */
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 1), ST_OK);
    seq_tokens(toks, 16, 1);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 9), 8);
    toks[0] = 555;
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 1, slots), ST_OK); /* rewrites pos 7 */
    ck_assert_uint_eq(n_ops(), 0);
    seq_tokens(toks, 16, 1);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 9), 4);
    toks[7] = 555;
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 9), 8); /* rehashed with the new token */
    /* Truncating a shared full block then writing: copy-on-write. */
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    ck_assert_int_eq(bm_seq_truncate(pool, 2, 1), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 2, toks, 1, slots), ST_OK);
    ck_assert_uint_eq(n_ops(), 1);
    ck_assert_int_ne(bm_seq_table(pool, 2, NULL)[1], bm_seq_table(pool, 1, NULL)[1]);
    /* Truncate to zero: empty again, lookup allowed. */
    ck_assert_int_eq(bm_seq_truncate(pool, 2, 8), ST_OK);
    ck_assert_uint_eq(bm_seq_len(pool, 2), 0);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_used, 2);
}
END_TEST

START_TEST(test_watermark_admission)
{
    /* 8 usable blocks, watermark 0.25 -> 2 blocks kept for growth. */
    ck_assert(bm_pool_can_admit(pool, 6));
    ck_assert(!bm_pool_can_admit(pool, 7));
    ck_assert_int_eq(make_seq(1, 0, 16, 1), ST_OK);
    ck_assert(bm_pool_can_admit(pool, 2));
    ck_assert(!bm_pool_can_admit(pool, 3));
    /* Running sequences may still use the reserve. */
    ck_assert_int_eq(make_seq(2, 0, 16, 100), ST_OK);
    ck_assert(bm_pool_can_admit(pool, 0) == 0);
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 77, 17), 5); /* unknown: as new */
}
END_TEST

START_TEST(test_large_tables_and_many_sequences)
{
    bm_config_t cfg = {.block_size = 1, .num_blocks = 4097, .prefix_caching = 1};
    bm_pool_t *p;
    int32_t toks[300], slots[300];

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    for (int32_t i = 0; i < 300; i++) {
        toks[i] = i;
    }
    for (uint64_t s = 0; s < 200; s++) { /* grows the sequence map */
        ck_assert_int_eq(bm_seq_create(p, s * 1000003, (uint32_t)(s % 7)), ST_OK);
        ck_assert_int_eq(bm_seq_reserve(p, s * 1000003, toks, 10, slots), ST_OK);
    }
    ck_assert_int_eq(bm_seq_create(p, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks, 300, slots), ST_OK); /* table > 64 */
    ck_assert_int_eq(bm_seq_swap_out(p, 1), ST_EAGAIN);              /* no CPU tier */
    bm_pool_check(p);
    for (uint64_t s = 0; s < 200; s += 2) {
        bm_seq_free(p, s * 1000003);
    }
    bm_pool_check(p);
    bm_pool_destroy(p); /* with live sequences */
}
END_TEST

/* drop_ops: a block freed while partly filled (or unhashed) is announced
 * with a DROP after every op that reads it; cached full blocks are not. */
START_TEST(test_drop_ops)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 9, .swap_blocks = 4, .prefix_caching = 1,
                       .drop_ops = 1};
    bm_pool_t *p;
    int32_t toks[16], slots[16];
    const kv_op_t *ops;
    uint32_t n, nb;

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    seq_tokens(toks, 6, 100);
    ck_assert_int_eq(bm_seq_create(p, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks, 6, slots), ST_OK);
    const int32_t *tab = bm_seq_table(p, 1, &nb);
    int32_t full = tab[0], tail = tab[1];

    /* Swap out: both blocks move, then the device tail is dropped (the full
     * block stays cached). */
    ck_assert_int_eq(bm_seq_swap_out(p, 1), ST_OK);
    ops = bm_pool_ops(p, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ops[0].kind, KV_OP_SWAP_OUT);
    ck_assert_int_eq(ops[1].kind, KV_OP_SWAP_OUT);
    ck_assert_int_eq(ops[2].kind, KV_OP_DROP);
    ck_assert_int_eq(ops[2].src, tail);
    ck_assert_int_eq(ops[2].dst, tail);
    ck_assert_int_ne(ops[2].src, full);
    int32_t cpu_tail = ops[1].dst;

    bm_pool_ops_clear(p);
    /* Swap in: the CPU tail is dropped after the SWAP_IN that reads it. */
    ck_assert_int_eq(bm_seq_swap_in(p, 1), ST_OK);
    ops = bm_pool_ops(p, &n);
    ck_assert_uint_ge(n, 2);
    ck_assert_int_eq(ops[n - 1].kind, KV_OP_DROP_SWAP);
    ck_assert_int_eq(ops[n - 1].src, cpu_tail);
    for (uint32_t i = 0; i + 1 < n; i++) {
        ck_assert_int_ne(ops[i].kind, KV_OP_DROP_SWAP);
    }
    bm_pool_ops_clear(p);
    /* Free: only the partial tail is dropped. */
    tab = bm_seq_table(p, 1, &nb);
    tail = tab[1];
    bm_seq_free(p, 1);
    ops = bm_pool_ops(p, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ops[0].kind, KV_OP_DROP);
    ck_assert_int_eq(ops[0].src, tail);
    bm_pool_ops_clear(p);
    bm_pool_check(p);
    bm_pool_destroy(p);
}
END_TEST

/* Sliding window: leading blocks released while the sequence goes on;
 * fork, swap out / in, truncate and free skip them, counts stay exact. */
START_TEST(test_release_front)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 17, .swap_blocks = 8, .prefix_caching = 1,
                       .drop_ops = 1};
    bm_pool_t *p;
    int32_t toks[64], slots[64];
    const int32_t *tab;
    uint32_t n, nb;
    bm_stats_t st;

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    seq_tokens(toks, 64, 7);
    ck_assert_int_eq(bm_seq_create(p, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks, 18, slots), ST_OK); /* 5 blocks */
    ck_assert_int_eq(bm_seq_release_front(p, 1, 4), ST_EINVAL);     /* 2 must stay */
    ck_assert_int_eq(bm_seq_release_front(p, 2, 1), ST_EINVAL);     /* unknown */
    ck_assert_int_eq(bm_seq_release_front(p, 1, 3), ST_OK);
    ck_assert_int_eq(bm_seq_release_front(p, 1, 2), ST_OK); /* already done */
    ck_assert_uint_eq(bm_seq_released(p, 1), 3);
    ck_assert_uint_eq(bm_seq_released(p, 9), 0);
    tab = bm_seq_table(p, 1, &nb);
    ck_assert_uint_eq(nb, 5);
    ck_assert_int_eq(tab[0], 0);
    ck_assert_int_eq(tab[2], 0);
    ck_assert_int_gt(tab[3], 0);
    bm_pool_stats(p, &st);
    ck_assert_uint_eq(st.dev_used, 2);
    ck_assert_uint_eq(st.dev_cached, 3); /* full hashed blocks stay cached */
    ck_assert_uint_eq(bm_seq_len(p, 1), 18);
    bm_pool_check(p);
    /* Growing on: new blocks chain their hashes to live parents. */
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks + 18, 10, slots), ST_OK);
    ck_assert_int_eq(slots[0], tab[4] * 4 + 2);
    bm_pool_check(p);
    /* Fork shares only live blocks. */
    ck_assert_int_eq(bm_seq_fork(p, 1, 2), ST_OK);
    ck_assert_uint_eq(bm_seq_released(p, 2), 3);
    bm_pool_check(p);
    /* Swap out and back in: released entries stay 0, no op names them. */
    bm_pool_ops_clear(p);
    ck_assert_int_eq(bm_seq_swap_out(p, 2), ST_OK);
    bm_pool_check(p);
    ck_assert_int_eq(bm_seq_swap_in(p, 2), ST_OK);
    bm_pool_check(p);
    const kv_op_t *ops = bm_pool_ops(p, &n);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_int_ne(ops[i].src, 0);
    }
    tab = bm_seq_table(p, 2, &nb);
    ck_assert_int_eq(tab[1], 0);
    ck_assert_int_gt(tab[3], 0);
    /* Truncate may not reach into released blocks. */
    ck_assert_int_eq(bm_seq_truncate(p, 2, 28), ST_EINVAL);
    ck_assert_int_eq(bm_seq_truncate(p, 2, 2), ST_OK);
    bm_pool_check(p);
    bm_seq_free(p, 1);
    bm_seq_free(p, 2);
    bm_pool_stats(p, &st);
    ck_assert_uint_eq(st.dev_used, 0);
    bm_pool_check(p);
    bm_pool_destroy(p);
}
END_TEST

/* Attention sinks: a nohash sequence loses blocks from its middle; later
 * blocks are queued for re-rotation; refusals. */
START_TEST(test_evict)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 17, .swap_blocks = 0, .prefix_caching = 1,
                       .drop_ops = 1};
    bm_pool_t *p;
    int32_t toks[64], slots[64], before[16];
    const int32_t *tab;
    const kv_op_t *ops;
    uint32_t n, nb, got = 7;

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    seq_tokens(toks, 64, 3);
    ck_assert_int_eq(bm_seq_create(p, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_set_nohash(p, 1), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(p, 1, toks, 30, &got), ST_OK);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks, 30, slots), ST_OK); /* 8 blocks */
    ck_assert_int_eq(bm_seq_set_nohash(p, 1), ST_EINVAL);           /* not empty */
    tab = bm_seq_table(p, 1, &nb);
    memcpy(before, tab, sizeof(int32_t) * nb);
    bm_pool_ops_clear(p);
    ck_assert_int_eq(bm_seq_evict(p, 1, 1, 0), ST_EINVAL);
    ck_assert_int_eq(bm_seq_evict(p, 1, 1, 7), ST_EINVAL); /* would take the tail */
    ck_assert_int_eq(bm_seq_evict(p, 1, 1, 3), ST_OK);
    ck_assert_uint_eq(bm_seq_len(p, 1), 18);
    tab = bm_seq_table(p, 1, &nb);
    ck_assert_uint_eq(nb, 5);
    ck_assert_int_eq(tab[0], before[0]);
    ck_assert_int_eq(tab[1], before[4]);
    ck_assert_int_eq(tab[4], before[7]);
    ops = bm_pool_ops(p, &n);
    ck_assert_uint_eq(n, 3 + 4); /* three drops, four shifts */
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_int_eq(ops[i].kind, KV_OP_DROP);
    }
    for (uint32_t i = 3; i < 7; i++) {
        ck_assert_int_eq(ops[i].kind, KV_OP_SHIFT);
        ck_assert_int_eq(ops[i].dst, 12);
    }
    ck_assert_int_eq(ops[3].src, before[4]);
    bm_pool_check(p);
    /* The sequence grows on: its new blocks are not hashed either. */
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks + 30, 10, slots), ST_OK);
    bm_pool_check(p);
    /* A shared later block cannot be re-rotated in place. */
    ck_assert_int_eq(bm_seq_fork(p, 1, 2), ST_OK);
    ck_assert_int_eq(bm_seq_evict(p, 1, 1, 1), ST_EINVAL);
    bm_seq_free(p, 2);
    /* A hashed sequence cannot be evicted from. */
    ck_assert_int_eq(bm_seq_create(p, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 3, toks, 12, slots), ST_OK);
    ck_assert_int_eq(bm_seq_evict(p, 3, 0, 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_evict(p, 9, 0, 1), ST_EINVAL);
    bm_seq_free(p, 3);
    bm_seq_free(p, 1);
    bm_pool_check(p);
    bm_pool_destroy(p);
}
END_TEST

Suite *
blockmgr_pool_suite(void)
{
    Suite *s = suite_create("blockmgr_pool");
    TCase *tc = tcase_create("pool");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_create_rejects_bad_config);
    tcase_add_test(tc, test_reserve_slots_and_table);
    tcase_add_test(tc, test_reserve_exhausted_returns_eagain);
    tcase_add_test(tc, test_free_keeps_full_blocks_cached);
    tcase_add_test(tc, test_lru_prefers_free_then_oldest_cached);
    tcase_add_test(tc, test_prefix_lookup_rules);
    tcase_add_test(tc, test_prefix_tenant_salts_and_extra_keys);
    tcase_add_test(tc, test_prefix_caching_disabled);
    tcase_add_test(tc, test_duplicate_full_block_registers_later);
    tcase_add_test(tc, test_fork_and_copy_on_write);
    tcase_add_test(tc, test_truncate);
    tcase_add_test(tc, test_watermark_admission);
    tcase_add_test(tc, test_large_tables_and_many_sequences);
    tcase_add_test(tc, test_drop_ops);
    tcase_add_test(tc, test_release_front);
    tcase_add_test(tc, test_evict);
    suite_add_tcase(s, tc);
    return s;
}
