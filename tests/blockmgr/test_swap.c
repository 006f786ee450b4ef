/* test_swap.c - block manager unit tests of the CPU swap tier: swap out /
 * in, room checks (ST_EAGAIN changes nothing), blocks shared by several
 * sequences when only some of them are swapped, demotion of evicted cached
 * blocks and promotion on a hit, and the order of queued ops when a block
 * is reused in the same step. A small shadow store (token ids per physical
 * slot) replays the ops to check what each sequence would read. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"

#define BS 4

static bm_pool_t *pool;
static int32_t dev_store[64 * BS];
static int32_t cpu_store[64 * BS];

static void
make_pool(uint32_t dev_usable, uint32_t cpu, int prefix)
{
    bm_config_t cfg = {.block_size = BS,
                       .num_blocks = dev_usable + 1,
                       .swap_blocks = cpu,
                       .prefix_caching = prefix};

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    memset(dev_store, 0xff, sizeof(dev_store));
    memset(cpu_store, 0xff, sizeof(cpu_store));
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

/* Runs the queued ops on the shadow store, in order, and clears them. */
static void
run_ops(void)
{
    uint32_t n;
    const kv_op_t *ops = bm_pool_ops(pool, &n);

    bm_pool_check(pool);
    for (uint32_t i = 0; i < n; i++) {
        const int32_t *src = ops[i].kind == KV_OP_SWAP_IN ? cpu_store : dev_store;
        int32_t *dst = ops[i].kind == KV_OP_SWAP_OUT ? cpu_store : dev_store;
        memmove(dst + ops[i].dst * BS, src + ops[i].src * BS, BS * sizeof(int32_t));
    }
    bm_pool_ops_clear(pool);
}

/* Reserve + the forward's writes (after the step's ops). */
static int
put(uint64_t seq, const int32_t *toks, uint32_t n)
{
    int32_t slots[64];
    int rc = bm_seq_reserve(pool, seq, toks, n, slots);

    if (rc == ST_OK) {
        run_ops();
        for (uint32_t i = 0; i < n; i++) {
            dev_store[slots[i]] = toks[i];
        }
    }
    bm_pool_check(pool);
    return rc;
}

static void
expect_content(uint64_t seq, const int32_t *toks, uint32_t n)
{
    uint32_t nb;
    const int32_t *t = bm_seq_table(pool, seq, &nb);
    const int32_t *store = bm_seq_is_swapped(pool, seq) ? cpu_store : dev_store;

    ck_assert_uint_eq(bm_seq_len(pool, seq), n);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_int_eq(store[t[i / BS] * BS + i % BS], toks[i]);
    }
}

static uint32_t
count_ops(kv_op_kind_t kind)
{
    uint32_t n, k = 0;
    const kv_op_t *ops = bm_pool_ops(pool, &n);

    for (uint32_t i = 0; i < n; i++) {
        k += ops[i].kind == kind;
    }
    return k;
}

static const int32_t T[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const int32_t U[16] = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36};

START_TEST(test_swap_out_in_roundtrip)
{
    int32_t slots[4];
    uint32_t nc, nb;
    bm_stats_t st;

    make_pool(8, 4, 1);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 6), ST_OK); /* full block + 2 tokens */
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 0);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    ck_assert(bm_seq_is_swapped(pool, 1));
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_OUT), 2);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.cpu_used, 2);
    ck_assert_uint_eq(st.dev_used, 0);
    ck_assert_uint_eq(st.dev_cached, 1); /* the full block stays cached on the device */
    ck_assert_uint_eq(st.n_swap_out, 2);
    ck_assert_uint_eq(bm_tenant_blocks(pool, 0), 0);
    ck_assert_uint_eq(bm_tenant_swap_blocks(pool, 0), 2);
    ck_assert_uint_eq(bm_tenant_swap_blocks(pool, 1), 0);
    ck_assert_uint_eq(bm_pool_free_swap_blocks(pool), 2);
    run_ops();
    expect_content(1, T, 6);
    /* A swapped sequence only swaps in or is freed. */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, T, 1, slots), ST_EINVAL);
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_EINVAL);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 1, T, 6, &nc), ST_EINVAL);
    ck_assert_int_eq(bm_seq_swap_out(pool, 9), ST_EINVAL);
    ck_assert_int_eq(bm_seq_swap_in(pool, 9), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 9), 0);
    ck_assert(!bm_seq_is_swapped(pool, 9));
    /* Swap-in: the full block is still cached on the device (revived, no
     * copy), the partial one comes back with a SWAP_IN. */
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 2);
    ck_assert_uint_eq(bm_seq_blocks_needed(pool, 1, 3), 4); /* swap-in + 1 new + tail */
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), 1);
    run_ops();
    ck_assert(!bm_seq_is_swapped(pool, 1));
    expect_content(1, T, 6);
    bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 2);
    ck_assert_int_eq(put(1, T + 6, 3), ST_OK);
    expect_content(1, T, 9);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.cpu_used, 0);
    ck_assert_uint_eq(st.cpu_cached, 1); /* the hashed CPU copy stays cached */
    ck_assert_uint_eq(st.n_swap_in, 1);
}
END_TEST

START_TEST(test_swap_eagain_changes_nothing)
{
    bm_stats_t before, after;
    uint32_t n;

    make_pool(8, 2, 0);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 12), ST_OK); /* 3 blocks > 2 CPU blocks */
    bm_pool_stats(pool, &before);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_EAGAIN);
    bm_pool_stats(pool, &after);
    ck_assert_mem_eq(&before, &after, sizeof(before));
    bm_pool_ops(pool, &n);
    ck_assert_uint_eq(n, 0);
    ck_assert(!bm_seq_is_swapped(pool, 1));
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 4), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    run_ops();
    /* The device fills up: swap-in must wait, unchanged. */
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(put(2, T, 16), ST_OK);
    ck_assert_int_eq(put(2, U, 12), ST_OK);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 1);
    bm_pool_stats(pool, &before);
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 2);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_EAGAIN);
    bm_pool_stats(pool, &after);
    ck_assert_mem_eq(&before, &after, sizeof(before));
    ck_assert(bm_seq_is_swapped(pool, 1));
    ck_assert_int_eq(bm_seq_truncate(pool, 2, 4), ST_OK);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    run_ops();
    expect_content(1, T, 8);
    /* Empty sequences swap trivially. */
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 3), ST_OK);
    ck_assert(bm_seq_is_swapped(pool, 3));
    ck_assert_int_eq(bm_seq_swap_in(pool, 3), ST_OK);
    bm_seq_free(pool, 3);
}
END_TEST

/* Semantics when sharers swap separately (documented in blockmgr.h):
 * the first sharer's swap-out copies, the second reuses that CPU copy,
 * swap-ins re-share device copies that are still intact. */
static void
shared_swap_case(int prefix)
{
    const int32_t *ta, *tb;
    uint32_t nb;
    bm_stats_t st;

    make_pool(8, 4, prefix);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 6), ST_OK);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);

    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_OUT), 2);
    run_ops();
    expect_content(1, T, 6);
    expect_content(2, T, 6); /* the other sharer keeps its device blocks */
    ck_assert_int_eq(bm_seq_swap_out(pool, 2), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_OUT), 0); /* moved once, stays shared */
    ta = bm_seq_table(pool, 1, &nb);
    tb = bm_seq_table(pool, 2, &nb);
    ck_assert_int_eq(ta[0], tb[0]);
    ck_assert_int_eq(ta[1], tb[1]);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.cpu_used, 2);
    ck_assert_uint_eq(st.dev_used, 0);

    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), prefix ? 1 : 2); /* full block: cached copy */
    run_ops();
    ck_assert_int_eq(bm_seq_swap_in(pool, 2), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), 0); /* re-shares 1's device blocks */
    ta = bm_seq_table(pool, 1, &nb);
    tb = bm_seq_table(pool, 2, &nb);
    ck_assert_int_eq(ta[0], tb[0]);
    ck_assert_int_eq(ta[1], tb[1]);
    expect_content(1, T, 6);
    expect_content(2, T, 6);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.dev_used, 2);
    ck_assert_uint_eq(st.cpu_used, 0);

    /* Both write: copy-on-write splits the shared tail as usual. */
    ck_assert_int_eq(put(1, U, 3), ST_OK);
    ck_assert_int_eq(put(2, T + 6, 1), ST_OK);
    {
        int32_t e1[9], e2[7];
        memcpy(e1, T, 6 * sizeof(int32_t));
        memcpy(e1 + 6, U, 3 * sizeof(int32_t));
        memcpy(e2, T, 7 * sizeof(int32_t));
        expect_content(1, e1, 9);
        expect_content(2, e2, 7);
    }
}

START_TEST(test_shared_swap_with_hashes)
{
    shared_swap_case(1);
}
END_TEST

START_TEST(test_shared_swap_without_hashes)
{
    shared_swap_case(0);
}
END_TEST

START_TEST(test_one_sharer_swapped_other_writes)
{
    const int32_t *ta, *tb;
    uint32_t nb;
    int32_t e2[8];

    make_pool(8, 4, 0);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 6), ST_OK);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    run_ops();
    /* Untouched: swapping 1 back in re-shares 2's blocks, no copy. */
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 0);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), 0);
    ck_assert_int_eq(bm_seq_table(pool, 1, &nb)[1], bm_seq_table(pool, 2, &nb)[1]);
    /* Again, but 2 (now the sole device holder) writes its tail in place:
     * the CPU copy no longer matches, so 1 must get its own copy back. */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    /* The first CPU copy was released at the swap-in: copied again. */
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_OUT), 2);
    run_ops();
    ck_assert_int_eq(put(2, U, 2), ST_OK);
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 1);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), 1);
    run_ops();
    ta = bm_seq_table(pool, 1, &nb);
    tb = bm_seq_table(pool, 2, &nb);
    ck_assert_int_eq(ta[0], tb[0]);
    ck_assert_int_ne(ta[1], tb[1]);
    expect_content(1, T, 6);
    memcpy(e2, T, 6 * sizeof(int32_t));
    memcpy(e2 + 6, U, 2 * sizeof(int32_t));
    expect_content(2, e2, 8);
    /* Freeing a swapped sharer releases the CPU references. */
    ck_assert_int_eq(bm_seq_swap_out(pool, 2), ST_OK);
    run_ops();
    expect_content(2, e2, 8);
    bm_seq_free(pool, 2);
    bm_seq_free(pool, 1);
    {
        bm_stats_t st;
        bm_pool_stats(pool, &st);
        ck_assert_uint_eq(st.cpu_used + st.dev_used, 0);
    }
}
END_TEST

START_TEST(test_demote_and_promote)
{
    uint32_t n, nc;
    const kv_op_t *ops;
    bm_stats_t st;

    make_pool(4, 4, 1);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 8), ST_OK);
    bm_seq_free(pool, 1); /* two CACHED device blocks */
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 2, U, 16, (int32_t[16]){0}), ST_OK);
    ops = bm_pool_ops(pool, &n);
    ck_assert_uint_eq(n, 2); /* both evicted blocks were demoted */
    ck_assert_int_eq(ops[0].kind, KV_OP_SWAP_OUT);
    ck_assert_int_eq(ops[1].kind, KV_OP_SWAP_OUT);
    run_ops();
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_demoted, 2);
    ck_assert_uint_eq(st.cpu_cached, 2);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, T, 9), 8);
    /* No device room: the lookup stops before promoting. */
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, T, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 0);
    /* Room again: promotion, each SWAP_IN after the demotion of the block
     * it overwrites. */
    bm_seq_free(pool, 2);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, T, 9, &nc), ST_OK);
    ck_assert_uint_eq(nc, 8);
    ops = bm_pool_ops(pool, &n);
    ck_assert_uint_eq(n, 4);
    for (uint32_t i = 0; i < 4; i += 2) {
        ck_assert_int_eq(ops[i].kind, KV_OP_SWAP_OUT);
        ck_assert_int_eq(ops[i + 1].kind, KV_OP_SWAP_IN);
        ck_assert_int_eq(ops[i + 1].dst, ops[i].src);
        ck_assert_int_ne(ops[i + 1].src, ops[i].dst); /* the promoted block was pinned */
    }
    run_ops();
    expect_content(3, T, 8);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_promoted, 2);
    ck_assert_uint_eq(st.n_demoted, 4);
    ck_assert_uint_eq(st.prefix_hits, 8);
    /* Reset drops both tiers' cached blocks. */
    bm_seq_free(pool, 3);
    bm_pool_reset_prefix_cache(pool);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.cpu_cached + st.dev_cached, 0);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, T, 9), 0);
}
END_TEST

START_TEST(test_demotion_limits)
{
    bm_stats_t st;

    /* CPU tier already holds the hash: eviction needs no copy. */
    make_pool(3, 3, 1);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 8), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK); /* device copies stay CACHED */
    run_ops();
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(put(2, U, 12), ST_OK);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_demoted, 0);
    ck_assert_uint_eq(st.n_evicted, 0);
    ck_assert_uint_eq(bm_seq_swap_in_needed(pool, 1), 2);
    bm_seq_free(pool, 2);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    run_ops();
    expect_content(1, T, 8);
    bm_seq_free(pool, 1);
    teardown();

    /* CPU tier full of USED blocks: the evicted block is dropped; CPU tier
     * with only CACHED blocks: its oldest is evicted to make room. */
    make_pool(3, 1, 1);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 4), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK); /* uses the only CPU block */
    run_ops();
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(put(2, U, 8), ST_OK);
    bm_seq_free(pool, 2); /* 2 cached device blocks (+1 from seq 1) */
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(put(3, T + 4, 12), ST_OK);
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_demoted, 0);
    ck_assert_uint_eq(st.n_evicted, 2); /* seq 1's block was already on the CPU */
    bm_seq_free(pool, 1);               /* its CPU block becomes CACHED */
    bm_seq_free(pool, 3);
    ck_assert_int_eq(bm_seq_create(pool, 4, 0), ST_OK);
    ck_assert_int_eq(put(4, U, 4), ST_OK); /* 2 FREE-less: evicts seq 3's tail */
    bm_pool_stats(pool, &st);
    ck_assert_uint_eq(st.n_demoted, 1);
    ck_assert_uint_eq(st.n_evicted, 3); /* seq 1's CPU copy made room */
}
END_TEST

START_TEST(test_op_order_on_block_reuse)
{
    const kv_op_t *ops;
    uint32_t n;
    int32_t b5;

    /* Block p is swapped out, then reused in the same step by a swap-in
     * and by a copy-on-write: the SWAP_OUT reading p comes first. */
    make_pool(3, 4, 0);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(put(1, T, 2), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(put(2, U, 2), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 2), ST_OK);
    run_ops();
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(put(3, U + 4, 2), ST_OK);
    ck_assert_int_eq(bm_seq_fork(pool, 3, 4), ST_OK);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), 1);
    b5 = bm_seq_table(pool, 1, &n)[0];
    /* One step: swap 1 out, swap 2 in (takes a block), then seq 4 writes
     * its shared tail (copy into another freed block). */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    ck_assert_int_eq(bm_seq_swap_in(pool, 2), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 4, T, 1, (int32_t[1]){0}), ST_OK);
    ops = bm_pool_ops(pool, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ops[0].kind, KV_OP_SWAP_OUT);
    ck_assert_int_eq(ops[0].src, b5);
    ck_assert_int_eq(ops[1].kind, KV_OP_SWAP_IN);
    ck_assert_int_eq(ops[2].kind, KV_OP_COPY);
    ck_assert(ops[1].dst == b5 || ops[2].dst == b5); /* p was reused */
    run_ops();
    expect_content(1, T, 2);
    expect_content(2, U, 2);
    expect_content(3, U + 4, 2);
}
END_TEST

START_TEST(test_swap_long_sequence)
{
    bm_config_t cfg = {.block_size = 1, .num_blocks = 201, .swap_blocks = 200};
    int32_t toks[150], slots[150];
    const int32_t *t;
    uint32_t nb;

    /* 150 blocks: the planning buffer grows past its first size. */
    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    for (int32_t i = 0; i < 150; i++) {
        toks[i] = i;
    }
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 150, slots), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_OUT), 150);
    bm_pool_ops_clear(pool);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    ck_assert_uint_eq(count_ops(KV_OP_SWAP_IN), 150);
    t = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 150);
    for (uint32_t i = 0; i < nb; i++) {
        ck_assert_int_gt(t[i], 0);
    }
}
END_TEST

Suite *
blockmgr_swap_suite(void)
{
    Suite *s = suite_create("blockmgr_swap");
    TCase *tc = tcase_create("swap");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_swap_out_in_roundtrip);
    tcase_add_test(tc, test_swap_eagain_changes_nothing);
    tcase_add_test(tc, test_shared_swap_with_hashes);
    tcase_add_test(tc, test_shared_swap_without_hashes);
    tcase_add_test(tc, test_one_sharer_swapped_other_writes);
    tcase_add_test(tc, test_demote_and_promote);
    tcase_add_test(tc, test_demotion_limits);
    tcase_add_test(tc, test_op_order_on_block_reuse);
    tcase_add_test(tc, test_swap_long_sequence);
    suite_add_tcase(s, tc);
    return s;
}
