/* test_map.c - the read-only enumeration of blockmgr/bm_map.h (the web
 * console's KV map): per-block state, tenant and refcount on both tiers
 * against bm_pool_stats and the tables, the sequence listing and its cap,
 * one block's holders and token ids, the tenant of cached and demoted
 * blocks, and salts. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_map.h"
#include "common/status.h"

#define BS 4

static bm_pool_t *pool;

static void
make_pool(uint32_t dev_usable, uint32_t cpu)
{
    bm_config_t cfg = {.block_size = BS,
                       .num_blocks = dev_usable + 1,
                       .swap_blocks = cpu,
                       .prefix_caching = 1};

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
}

static void
teardown(void)
{
    if (pool != NULL) {
        bm_pool_check(pool);
        bm_pool_destroy(pool);
        pool = NULL;
    }
}

typedef struct map {
    uint32_t n;
    uint8_t state[64];
    uint16_t tenant[64];
    uint32_t ref[64];
} map_t;

static void
take(int tier, map_t *m)
{
    m->n = bm_map_tier_blocks(pool, tier);
    ck_assert_uint_le(m->n, 64);
    memset(m->state, 0, sizeof(m->state));
    bm_map_tier(pool, tier, m->state, m->tenant, m->ref);
}

static uint32_t
count(const map_t *m, uint8_t state)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < m->n; i++) {
        n += m->state[i] == state;
    }
    return n;
}

/* Counts per state equal bm_pool_stats, free and null blocks have no
 * tenant, refcounts are 0 unless used. */
static void
check_against_stats(void)
{
    bm_stats_t st;
    map_t d, c;

    bm_pool_stats(pool, &st);
    take(BM_MAP_DEVICE, &d);
    take(BM_MAP_CPU, &c);
    ck_assert_uint_eq(d.state[0], BM_MAP_NULL);
    ck_assert_uint_eq(count(&d, BM_MAP_USED), st.dev_used);
    ck_assert_uint_eq(count(&d, BM_MAP_CACHED), st.dev_cached);
    ck_assert_uint_eq(count(&d, BM_MAP_FREE), st.dev_free);
    ck_assert_uint_eq(count(&c, BM_MAP_USED), st.cpu_used);
    ck_assert_uint_eq(count(&c, BM_MAP_CACHED), st.cpu_cached);
    ck_assert_uint_eq(count(&c, BM_MAP_FREE), st.cpu_free);
    for (int t = 0; t < 2; t++) {
        const map_t *m = t == 0 ? &d : &c;
        for (uint32_t i = 0; i < m->n; i++) {
            if (m->state[i] == BM_MAP_FREE || m->state[i] == BM_MAP_NULL) {
                ck_assert_uint_eq(m->tenant[i], BM_MAP_NO_TENANT);
            } else {
                ck_assert_uint_ne(m->tenant[i], BM_MAP_NO_TENANT);
            }
            ck_assert_int_eq(m->ref[i] > 0, m->state[i] == BM_MAP_USED);
        }
    }
}

static void
seq_put(uint64_t seq, uint32_t tenant, const int32_t *toks, uint32_t n)
{
    int32_t slots[64];

    ck_assert_int_eq(bm_seq_create(pool, seq, tenant), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, seq, toks, n, slots), ST_OK);
    bm_pool_ops_clear(pool);
}

START_TEST(test_map_states_and_sharing)
{
    const int32_t toks[10] = {11, 12, 13, 14, 21, 22, 23, 24, 31, 32};
    const int32_t *tab;
    uint32_t nb;
    map_t d;

    make_pool(8, 0);
    check_against_stats();
    take(BM_MAP_DEVICE, &d);
    ck_assert_uint_eq(d.n, 9);
    ck_assert_uint_eq(count(&d, BM_MAP_FREE), 8);

    seq_put(1, 3, toks, 10); /* 3 blocks: two full, one with 2 tokens */
    tab = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 3);
    take(BM_MAP_DEVICE, &d);
    for (uint32_t k = 0; k < nb; k++) {
        ck_assert_uint_eq(d.state[tab[k]], BM_MAP_USED);
        ck_assert_uint_eq(d.tenant[tab[k]], 3);
        ck_assert_uint_eq(d.ref[tab[k]], 1);
    }
    check_against_stats();

    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK); /* refcount 2 everywhere */
    take(BM_MAP_DEVICE, &d);
    for (uint32_t k = 0; k < nb; k++) {
        ck_assert_uint_eq(d.ref[tab[k]], 2);
    }
    int32_t b0 = tab[0], b1 = tab[1], b2 = tab[2];
    bm_seq_free(pool, 2);
    bm_seq_free(pool, 1);
    /* Full hashed blocks stay cached, still naming their tenant; the
     * partial one is free. */
    take(BM_MAP_DEVICE, &d);
    ck_assert_uint_eq(d.state[b0], BM_MAP_CACHED);
    ck_assert_uint_eq(d.state[b1], BM_MAP_CACHED);
    ck_assert_uint_eq(d.state[b2], BM_MAP_FREE);
    ck_assert_uint_eq(d.tenant[b0], 3);
    ck_assert_uint_eq(d.ref[b0], 0);
    check_against_stats();

    bm_pool_reset_prefix_cache(pool);
    take(BM_MAP_DEVICE, &d);
    ck_assert_uint_eq(count(&d, BM_MAP_CACHED), 0);
    check_against_stats();
}
END_TEST

START_TEST(test_map_seqs_and_cap)
{
    int32_t toks[12];
    bm_map_seq_t seqs[8];
    int32_t blocks[64];
    uint32_t n_seqs, n_tab, total;

    for (int i = 0; i < 12; i++) {
        toks[i] = 100 + i;
    }
    make_pool(30, 0);
    for (uint64_t s = 1; s <= 5; s++) {
        seq_put(s, (uint32_t)s % 2, toks, (uint32_t)(2 * s + 1)); /* 1, 2, 2, 3, 3 blocks */
    }
    total = bm_map_seqs_size(pool, 8, &n_seqs, &n_tab);
    ck_assert_uint_eq(total, 5);
    ck_assert_uint_eq(n_seqs, 5);
    ck_assert_uint_eq(n_tab, 11);
    ck_assert_uint_eq(bm_map_seqs(pool, 8, seqs, blocks), 5);
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t nb;
        const int32_t *tab = bm_seq_table(pool, seqs[i].id, &nb);
        ck_assert_uint_eq(seqs[i].n_blocks, nb);
        ck_assert_uint_eq(seqs[i].n_tokens, bm_seq_len(pool, seqs[i].id));
        ck_assert_uint_eq(seqs[i].tenant, seqs[i].id % 2);
        ck_assert_int_eq(seqs[i].swapped, 0);
        ck_assert_int_eq(memcmp(blocks + seqs[i].first, tab, nb * sizeof(int32_t)), 0);
    }
    /* The cap: 3 of the 5, with exactly their tables. */
    total = bm_map_seqs_size(pool, 3, &n_seqs, &n_tab);
    ck_assert_uint_eq(total, 5);
    ck_assert_uint_eq(n_seqs, 3);
    ck_assert_uint_eq(bm_map_seqs(pool, 3, seqs, blocks), 3);
    ck_assert_uint_eq(seqs[2].first + seqs[2].n_blocks, n_tab);
}
END_TEST

START_TEST(test_map_block_detail)
{
    const int32_t toks[6] = {5, 6, 7, 8, 9, 10};
    bm_map_block_t b;
    uint64_t holders[4];
    uint32_t tenants[4];
    int32_t out[BS];
    const int32_t *tab;
    uint32_t nb;

    make_pool(8, 0);
    bm_pool_keep_tokens(pool);
    ck_assert_int_eq(bm_map_block(pool, 2, 1, &b), ST_EINVAL);
    ck_assert_int_eq(bm_map_block(pool, BM_MAP_DEVICE, 9, &b), ST_EINVAL);
    ck_assert_int_eq(bm_map_block(pool, BM_MAP_CPU, 0, &b), ST_EINVAL); /* no cpu tier */

    seq_put(1, 0, toks, 6);
    ck_assert_int_eq(bm_seq_create(pool, 2, 1), ST_OK);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 3), ST_OK);
    tab = bm_seq_table(pool, 1, &nb);
    ck_assert_int_eq(bm_map_block(pool, BM_MAP_DEVICE, (uint32_t)tab[0], &b), ST_OK);
    ck_assert_uint_eq(b.cell.state, BM_MAP_USED);
    ck_assert_uint_eq(b.cell.ref, 2);
    ck_assert_int_eq(b.hashed, 1);
    ck_assert_int_eq(bm_map_block(pool, BM_MAP_DEVICE, (uint32_t)tab[1], &b), ST_OK);
    ck_assert_int_eq(b.hashed, 0); /* two tokens: not full */

    ck_assert_uint_eq(bm_map_block_holders(pool, BM_MAP_DEVICE, (uint32_t)tab[0], holders,
                                           tenants, 4),
                      2);
    ck_assert(holders[0] + holders[1] == 4 && tenants[0] == 0 && tenants[1] == 0);
    ck_assert_uint_eq(bm_map_block_holders(pool, BM_MAP_DEVICE, (uint32_t)tab[0], holders,
                                           tenants, 1),
                      2); /* counted in all, one listed */

    /* Token ids: a holder's, the partial tail too; not a non-holder's. */
    ck_assert_uint_eq(bm_map_block_tokens_of_seq(pool, 1, BM_MAP_DEVICE, (uint32_t)tab[0], out),
                      4);
    ck_assert_int_eq(memcmp(out, toks, 4 * sizeof(int32_t)), 0);
    ck_assert_uint_eq(bm_map_block_tokens_of_seq(pool, 3, BM_MAP_DEVICE, (uint32_t)tab[1], out),
                      2);
    ck_assert(out[0] == 9 && out[1] == 10);
    ck_assert_uint_eq(bm_map_block_tokens_of_seq(pool, 2, BM_MAP_DEVICE, (uint32_t)tab[0], out),
                      0);
    ck_assert_uint_eq(bm_map_block_tokens_of_seq(pool, 1, BM_MAP_CPU, (uint32_t)tab[0], out), 0);

    /* Once released, the cached block's ids come from the records. */
    int32_t first = tab[0];
    bm_seq_free(pool, 3);
    bm_seq_free(pool, 1);
    ck_assert_uint_eq(bm_map_block_holders(pool, BM_MAP_DEVICE, (uint32_t)first, holders,
                                           tenants, 4),
                      0);
    memset(out, 0, sizeof(out));
    ck_assert_uint_eq(bm_map_block_tokens_cached(pool, BM_MAP_DEVICE, (uint32_t)first, out), BS);
    ck_assert_int_eq(memcmp(out, toks, 4 * sizeof(int32_t)), 0);
    bm_seq_free(pool, 2);
}
END_TEST

START_TEST(test_map_no_records_without_keep)
{
    const int32_t toks[5] = {1, 2, 3, 4, 5};
    int32_t out[BS];
    const int32_t *tab;
    uint32_t nb;

    make_pool(4, 0);
    seq_put(1, 0, toks, 5);
    tab = bm_seq_table(pool, 1, &nb);
    int32_t first = tab[0];
    bm_seq_free(pool, 1);
    ck_assert_uint_eq(bm_map_block_tokens_cached(pool, BM_MAP_DEVICE, (uint32_t)first, out), 0);
}
END_TEST

START_TEST(test_map_salts)
{
    make_pool(4, 0);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 2, 1), ST_OK);
    ck_assert_int_eq(bm_map_same_salt(pool, 0, 0), 1);
    ck_assert_int_eq(bm_map_same_salt(pool, 0, 1), 0); /* default salts: the ids */
    ck_assert_int_eq(bm_map_same_salt(pool, 0, 7), 0); /* unknown tenant */
    ck_assert_int_eq(bm_tenant_set_salt(pool, 0, "shared", 6), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 1, "shared", 6), ST_OK);
    ck_assert_int_eq(bm_map_same_salt(pool, 0, 1), 1);
    bm_seq_free(pool, 1);
    bm_seq_free(pool, 2);
}
END_TEST

/* The CPU tier: a swapped sequence's blocks are used there and listed as
 * swapped; a demoted cached block keeps its tenant and token ids. */
START_TEST(test_map_cpu_tier)
{
    int32_t toks[16];
    bm_map_seq_t seqs[4];
    int32_t blocks[16], out[BS];
    uint32_t n_seqs, n_tab;
    map_t c;

    for (int i = 0; i < 16; i++) {
        toks[i] = 40 + i;
    }
    make_pool(4, 4);
    bm_pool_keep_tokens(pool);
    seq_put(1, 2, toks, 8); /* two full blocks */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    bm_pool_ops_clear(pool);
    take(BM_MAP_CPU, &c);
    ck_assert_uint_eq(count(&c, BM_MAP_USED), 2);
    bm_map_seqs_size(pool, 4, &n_seqs, &n_tab);
    ck_assert_uint_eq(bm_map_seqs(pool, 4, seqs, blocks), 1);
    ck_assert_int_eq(seqs[0].swapped, 1);
    for (uint32_t k = 0; k < 2; k++) {
        ck_assert_uint_eq(c.state[blocks[k]], BM_MAP_USED);
        ck_assert_uint_eq(c.tenant[blocks[k]], 2);
        ck_assert_uint_eq(bm_map_block_holders(pool, BM_MAP_CPU, (uint32_t)blocks[k], NULL, NULL,
                                               0),
                          1);
    }
    ck_assert_uint_eq(bm_map_block_tokens_of_seq(pool, 1, BM_MAP_CPU, (uint32_t)blocks[1], out),
                      4);
    ck_assert_int_eq(memcmp(out, toks + 4, 4 * sizeof(int32_t)), 0);
    check_against_stats();
    bm_seq_free(pool, 1);
    check_against_stats();

    /* Demotion: tenant 3's cached device blocks are evicted by tenant 0. */
    bm_pool_reset_prefix_cache(pool);
    seq_put(2, 3, toks + 8, 8);
    bm_seq_free(pool, 2);
    seq_put(3, 0, toks, 16); /* takes all 4 device blocks: the cached two demote */
    take(BM_MAP_CPU, &c);
    ck_assert_uint_eq(count(&c, BM_MAP_CACHED), 2);
    for (uint32_t i = 0; i < c.n; i++) {
        if (c.state[i] == BM_MAP_CACHED) {
            ck_assert_uint_eq(c.tenant[i], 3);
            ck_assert_uint_eq(bm_map_block_tokens_cached(pool, BM_MAP_CPU, i, out), BS);
            ck_assert(memcmp(out, toks + 8, sizeof(out)) == 0 ||
                      memcmp(out, toks + 12, sizeof(out)) == 0);
        }
    }
    check_against_stats();
    bm_seq_free(pool, 3);
}
END_TEST

Suite *
blockmgr_map_suite(void)
{
    Suite *s = suite_create("blockmgr_map");
    TCase *tc = tcase_create("map");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_map_states_and_sharing);
    tcase_add_test(tc, test_map_seqs_and_cap);
    tcase_add_test(tc, test_map_block_detail);
    tcase_add_test(tc, test_map_no_records_without_keep);
    tcase_add_test(tc, test_map_salts);
    tcase_add_test(tc, test_map_cpu_tier);
    suite_add_tcase(s, tc);
    return s;
}
