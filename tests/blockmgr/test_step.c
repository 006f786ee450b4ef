/* test_step.c - the step epoch (bm_pool_step_begin / _end): inside a step,
 * freeing a sequence that reserved or was forked, and truncating or
 * swapping out one that reserved, was forked, looked up or swapped in,
 * abort; the same calls outside a step, or on other sequences, are fine.
 * Each breach runs in its own forked test process and must die of SIGABRT. */
#include <check.h>
#include <signal.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"

static bm_pool_t *
pool_with_seq(uint64_t id, uint32_t n_tokens)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 33, .swap_blocks = 16, .prefix_caching = 1};
    bm_pool_t *pool;
    int32_t toks[64], slots[64];

    for (uint32_t i = 0; i < 64; i++) {
        toks[i] = (int32_t)i + 3;
    }
    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, id, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, id, toks, n_tokens, slots), ST_OK);
    bm_pool_ops_clear(pool);
    return pool;
}

static void
reserve_one(bm_pool_t *pool, uint64_t id)
{
    int32_t tok = 7, slot;

    ck_assert_int_eq(bm_seq_reserve(pool, id, &tok, 1, &slot), ST_OK);
}

START_TEST(test_step_allows_what_the_contract_allows)
{
    bm_pool_t *pool = pool_with_seq(1, 10);
    int32_t toks[8] = {3, 4, 5, 6, 7, 8, 9, 10};
    uint32_t got;

    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    reserve_one(pool, 2);
    /* Outside a step: anything goes (unit tests, kv_stream). */
    bm_seq_free(pool, 2);
    bm_pool_step_begin(pool);
    reserve_one(pool, 1);
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 8, &got), ST_OK);
    bm_seq_free(pool, 3); /* a lookup alone may be undone (failed admission) */
    bm_pool_step_end(pool);
    /* After the step: the same sequence may go. */
    ck_assert_int_eq(bm_seq_truncate(pool, 1, 1), ST_OK);
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    bm_pool_step_begin(pool);
    bm_seq_free(pool, 1); /* swapped: took nothing this step */
    bm_pool_step_end(pool);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

START_TEST(test_step_free_after_reserve_aborts)
{
    bm_pool_t *pool = pool_with_seq(1, 10);

    bm_pool_step_begin(pool);
    reserve_one(pool, 1);
    bm_seq_free(pool, 1);
}
END_TEST

START_TEST(test_step_free_after_fork_aborts)
{
    bm_pool_t *pool = pool_with_seq(1, 10);

    bm_pool_step_begin(pool);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    bm_seq_free(pool, 2);
}
END_TEST

START_TEST(test_step_swap_out_after_reserve_aborts)
{
    bm_pool_t *pool = pool_with_seq(1, 10);

    bm_pool_step_begin(pool);
    reserve_one(pool, 1);
    (void)bm_seq_swap_out(pool, 1);
}
END_TEST

START_TEST(test_step_truncate_after_lookup_aborts)
{
    bm_pool_t *pool = pool_with_seq(1, 12);
    int32_t toks[12] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    uint32_t got;

    bm_pool_step_begin(pool);
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 12, &got), ST_OK);
    ck_assert_uint_eq(got, 8);
    (void)bm_seq_truncate(pool, 2, 1);
}
END_TEST

START_TEST(test_step_swap_out_after_swap_in_aborts)
{
    bm_pool_t *pool = pool_with_seq(1, 10);

    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    bm_pool_step_begin(pool);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    (void)bm_seq_swap_out(pool, 1);
}
END_TEST

Suite *
blockmgr_step_suite(void)
{
    Suite *s = suite_create("blockmgr_step");
    TCase *tc = tcase_create("step");

    tcase_add_test(tc, test_step_allows_what_the_contract_allows);
    tcase_add_test_raise_signal(tc, test_step_free_after_reserve_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_step_free_after_fork_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_step_swap_out_after_reserve_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_step_truncate_after_lookup_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_step_swap_out_after_swap_in_aborts, SIGABRT);
    suite_add_tcase(s, tc);
    return s;
}
