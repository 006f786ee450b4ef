/* test_oom.c - block manager out of host memory (issue 9): every
 * allocation a request makes is failed in turn through the xmalloc hook
 * (default domain, the tests' thread) and the call must return ST_ENOMEM
 * with nothing changed (stats, queued ops, every sequence's table, length
 * and swap state, per-tenant counts), bm_pool_check() must pass, and the
 * same call must then succeed. Sites: sequence record and tenant entry,
 * block table and token array (reserve, lookup, fork), a shared block's
 * extra tenant record (swap out / in; a lookup stops its run there), op
 * queue growth past the preallocation (reserve).
 * The sequence map failing to grow keeps its size and the call succeeds. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"

#define BS 4
#define MAX_SEQ 80
#define MAX_TAB 64
#define MAX_OPS 512

typedef struct snap {
    bm_stats_t st;
    uint32_t n_ops;
    kv_op_t ops[MAX_OPS];
    int exists[MAX_SEQ];
    int swapped[MAX_SEQ];
    uint32_t len[MAX_SEQ];
    uint32_t nb[MAX_SEQ];
    int32_t tab[MAX_SEQ][MAX_TAB];
    uint32_t tenant_blocks[4][2];
} snap_t;

static bm_pool_t *pool;

static void
make_pool(uint32_t dev_usable, uint32_t cpu, int drop_ops)
{
    bm_config_t cfg = {.block_size = BS,
                       .num_blocks = dev_usable + 1,
                       .swap_blocks = cpu,
                       .prefix_caching = 1,
                       .drop_ops = drop_ops};

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
}

static void
drop_pool(void)
{
    xmalloc_fail_after(0);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
    pool = NULL;
}

static void
take(snap_t *s)
{
    const kv_op_t *ops;

    memset(s, 0, sizeof(*s));
    bm_pool_stats(pool, &s->st);
    ops = bm_pool_ops(pool, &s->n_ops);
    ck_assert_uint_le(s->n_ops, MAX_OPS);
    memcpy(s->ops, ops, (size_t)s->n_ops * sizeof(*ops));
    for (uint64_t q = 0; q < MAX_SEQ; q++) {
        const int32_t *t;
        s->exists[q] = bm_seq_exists(pool, q);
        s->swapped[q] = bm_seq_is_swapped(pool, q);
        s->len[q] = bm_seq_len(pool, q);
        t = bm_seq_table(pool, q, &s->nb[q]);
        ck_assert_uint_le(s->nb[q], MAX_TAB);
        if (s->nb[q] > 0) {
            memcpy(s->tab[q], t, (size_t)s->nb[q] * sizeof(*t));
        }
    }
    for (uint32_t u = 0; u < 4; u++) {
        s->tenant_blocks[u][0] = bm_tenant_blocks(pool, u);
        s->tenant_blocks[u][1] = bm_tenant_swap_blocks(pool, u);
    }
}

static void
assert_unchanged(const snap_t *before)
{
    static snap_t now;

    bm_pool_check(pool);
    take(&now);
    ck_assert_mem_eq(&now.st, &before->st, sizeof(now.st));
    ck_assert_uint_eq(now.n_ops, before->n_ops);
    ck_assert(memcmp(now.ops, before->ops, (size_t)now.n_ops * sizeof(kv_op_t)) == 0);
    ck_assert_mem_eq(now.exists, before->exists, sizeof(now.exists));
    ck_assert_mem_eq(now.swapped, before->swapped, sizeof(now.swapped));
    ck_assert_mem_eq(now.len, before->len, sizeof(now.len));
    ck_assert_mem_eq(now.nb, before->nb, sizeof(now.nb));
    ck_assert_mem_eq(now.tab, before->tab, sizeof(now.tab));
    ck_assert_mem_eq(now.tenant_blocks, before->tenant_blocks, sizeof(now.tenant_blocks));
}

static void
fill(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++) {
        t[i] = base + (int32_t)i;
    }
}

static void
seq_with(uint64_t seq, uint32_t tenant, uint32_t n, int32_t base)
{
    int32_t toks[64], slots[64];

    ck_assert_int_eq(bm_seq_create(pool, seq, tenant), ST_OK);
    fill(toks, n, base);
    ck_assert_int_eq(bm_seq_reserve(pool, seq, toks, n, slots), ST_OK);
}

/* Creates seq for tenant and looks up the prefix of n tokens from base:
 * expects got tokens found in the cache. */
static void
seq_lookup(uint64_t seq, uint32_t tenant, uint32_t n, int32_t base, uint32_t expect)
{
    int32_t toks[64];
    uint32_t got;

    ck_assert_int_eq(bm_seq_create(pool, seq, tenant), ST_OK);
    fill(toks, n, base);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, seq, toks, n, &got), ST_OK);
    ck_assert_uint_eq(got, expect);
}

/* Scenarios: build a fresh pool, then the call under test. */
enum { SC_CREATE, SC_RESERVE, SC_LOOKUP, SC_FORK, SC_SWAP_OUT, SC_SWAP_IN, SC_N };

static void
build(int sc)
{
    make_pool(32, 8, 1);
    /* Tenants 1 and 2 share a salt: their sequences share cached blocks.
     * Four tenants fill the tenant array's first allocation. */
    ck_assert_int_eq(bm_tenant_set_salt(pool, 1, "s", 1), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 2, "s", 1), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 10, "a", 1), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 11, "b", 1), ST_OK);
    seq_with(1, 1, 10, 100); /* two full blocks and a partial one */
    switch (sc) {
    case SC_SWAP_OUT:
        /* Seq 2 (tenant 2) shares seq 1's full blocks; seq 1 swaps out
         * first, so seq 2 re-shares its CPU twins: a second tenant on
         * them. */
        seq_lookup(2, 2, 10, 100, 8);
        ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
        break;
    case SC_SWAP_IN:
        /* Seq 2 (tenant 2) swaps out; seq 3 (tenant 1) then revives its
         * cached device blocks, which seq 2's swap-in re-shares: a second
         * tenant on them. */
        seq_with(2, 2, 10, 300);
        ck_assert_int_eq(bm_seq_swap_out(pool, 2), ST_OK);
        seq_lookup(3, 1, 10, 300, 8);
        break;
    case SC_LOOKUP:
        ck_assert_int_eq(bm_seq_create(pool, 2, 1), ST_OK);
        break;
    default:
        break;
    }
    bm_pool_ops_clear(pool);
    bm_pool_check(pool);
}

static int
call(int sc)
{
    int32_t toks[64], slots[64];
    uint32_t got = 0;
    int rc;

    switch (sc) {
    case SC_CREATE:
        return bm_seq_create(pool, 5, 3); /* new tenant: record and entry */
    case SC_RESERVE:
        fill(toks, 56, 500);
        return bm_seq_reserve(pool, 1, toks, 56, slots); /* table and tokens grow */
    case SC_LOOKUP:
        fill(toks, 10, 100);
        rc = bm_seq_lookup_prefix(pool, 2, toks, 10, &got);
        ck_assert(rc != ST_OK || got == 8);
        return rc;
    case SC_FORK:
        return bm_seq_fork(pool, 1, 7);
    case SC_SWAP_OUT:
        return bm_seq_swap_out(pool, 2);
    case SC_SWAP_IN:
        return bm_seq_swap_in(pool, 2);
    }
    return ST_EINVAL;
}

/* Fails the 1st, 2nd, ... fallible allocation of the call until the call
 * makes no more; each failure: ST_ENOMEM, nothing changed, the retry
 * succeeds. Returns how many sites failed. */
static int
fail_each_site(int sc)
{
    static snap_t before;
    int sites = 0;

    for (long n = 1;; n++) {
        int rc;

        build(sc);
        take(&before);
        xmalloc_fail_after(n);
        rc = call(sc);
        if (xmalloc_fail_pending() != 0) {
            xmalloc_fail_after(0);
            ck_assert_int_eq(rc, ST_OK); /* fewer than n sites: the plain call */
            drop_pool();
            return sites;
        }
        ck_assert_msg(rc == ST_ENOMEM, "scenario %d site %ld: rc %d", sc, n, rc);
        assert_unchanged(&before);
        ck_assert_int_eq(call(sc), ST_OK);
        drop_pool();
        sites++;
    }
}

START_TEST(test_each_site_fails_cleanly)
{
    static const int min_sites[SC_N] = {
        [SC_CREATE] = 2, [SC_RESERVE] = 2, [SC_LOOKUP] = 2, [SC_FORK] = 3,
        [SC_SWAP_OUT] = 2, [SC_SWAP_IN] = 2,
    };

    for (int sc = 0; sc < SC_N; sc++) {
        int sites = fail_each_site(sc);
        ck_assert_msg(sites >= min_sites[sc], "scenario %d: %d sites", sc, sites);
    }
}
END_TEST

/* A shared block whose tenant record cannot be allocated ends a lookup's
 * run as a miss would: ST_OK with fewer tokens, a valid pool, and the next
 * lookup of a fresh sequence finds the whole prefix. */
START_TEST(test_lookup_tenant_record_ends_the_run)
{
    int32_t toks[10];
    uint32_t got = 99;
    bm_stats_t st;

    make_pool(16, 8, 1);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 1, "s", 1), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 2, "s", 1), ST_OK);
    seq_with(1, 1, 10, 100);
    ck_assert_int_eq(bm_seq_create(pool, 2, 2), ST_OK);
    fill(toks, 10, 100);
    /* Site 1: the table, 2: the tokens, 3: tenant 2's record on block 0. */
    xmalloc_fail_after(3);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 10, &got), ST_OK);
    ck_assert_int_eq(xmalloc_fail_pending(), 0);
    ck_assert_uint_eq(got, 0);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 2), 0);
    bm_pool_check(pool);
    bm_seq_free(pool, 2);
    ck_assert_int_eq(bm_seq_create(pool, 3, 2), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 10, &got), ST_OK);
    ck_assert_uint_eq(got, 8);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 2), 2);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.prefix_hits, 8);
    drop_pool();
}
END_TEST

/* With 64 sequences the map grows on the next create; without memory it
 * keeps its size and every sequence stays reachable. */
START_TEST(test_seq_map_growth_failure_keeps_the_map)
{
    make_pool(16, 0, 0);
    for (uint64_t q = 0; q < 64; q++) {
        ck_assert_int_eq(bm_seq_create(pool, q, 0), ST_OK);
    }
    xmalloc_fail_after(1); /* the growth; the record is the 2nd call */
    ck_assert_int_eq(bm_seq_create(pool, 64, 0), ST_OK);
    ck_assert_int_eq(xmalloc_fail_pending(), 0);
    for (uint64_t q = 0; q < 70; q++) {
        if (q > 64) {
            ck_assert_int_eq(bm_seq_create(pool, q, 0), ST_OK);
        }
        ck_assert(bm_seq_exists(pool, q));
    }
    bm_pool_check(pool);
    for (uint64_t q = 0; q < 70; q++) {
        bm_seq_free(pool, q);
    }
    drop_pool();
}
END_TEST

/* The op queue grows past its preallocation only when a step queues that
 * many ops without a clear; a reserve that would need it fails before
 * changing anything. DROP ops (queued by truncations, which cannot fail)
 * fill the queue one by one; at each length a reserve is tried with its
 * first fallible allocation failing. */
START_TEST(test_op_queue_growth_fails_cleanly)
{
    static snap_t before;
    int32_t tok = 7, slot;
    int fired = 0;

    make_pool(4, 0, 1);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, &tok, 1, &slot), ST_OK); /* table, tokens */
    for (int i = 0; i < 300; i++) {
        int rc;

        ck_assert_int_eq(bm_seq_truncate(pool, 1, 1), ST_OK); /* one DROP */
        take(&before);
        xmalloc_fail_after(1);
        rc = bm_seq_reserve(pool, 1, &tok, 1, &slot);
        if (xmalloc_fail_pending() == 0) {
            ck_assert_int_eq(rc, ST_ENOMEM);
            assert_unchanged(&before);
            fired++;
            rc = bm_seq_reserve(pool, 1, &tok, 1, &slot);
        }
        xmalloc_fail_after(0);
        ck_assert_int_eq(rc, ST_OK);
        if (before.n_ops + 8 >= MAX_OPS) {
            break;
        }
    }
    ck_assert_int_ge(fired, 1);
    drop_pool();
}
END_TEST

Suite *
blockmgr_oom_suite(void)
{
    Suite *s = suite_create("blockmgr_oom");
    TCase *tc = tcase_create("oom");

    tcase_add_test(tc, test_each_site_fails_cleanly);
    tcase_add_test(tc, test_lookup_tenant_record_ends_the_run);
    tcase_add_test(tc, test_seq_map_growth_failure_keeps_the_map);
    tcase_add_test(tc, test_op_queue_growth_fails_cleanly);
    suite_add_tcase(s, tc);
    return s;
}
