/* test_unreserve.c - bm_seq_unreserve: a step's reservations taken back
 * (length, blocks, hashes registered at plan time), after which the
 * sequence may be freed or swapped out in the same step; refusals
 * (outside a step, nothing reserved, also forked / looked up / swapped
 * in, a taken-back block shared) change nothing. */
#include <check.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"

static int32_t toks[64];

static bm_pool_t *
pool_new(uint32_t swap_blocks)
{
    bm_config_t cfg = {.block_size = 4, .num_blocks = 33, .swap_blocks = swap_blocks,
                       .prefix_caching = 1};
    bm_pool_t *pool;

    for (uint32_t i = 0; i < 64; i++) {
        toks[i] = (int32_t)i + 3;
    }
    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    return pool;
}

static void
reserve(bm_pool_t *pool, uint64_t id, uint32_t from, uint32_t n)
{
    int32_t slots[64];

    ck_assert_int_eq(bm_seq_reserve(pool, id, toks + from, n, slots), ST_OK);
}

START_TEST(test_unreserve_takes_back_blocks_and_hashes)
{
    bm_pool_t *pool = pool_new(16);
    uint32_t free0, nb = 0;
    const int32_t *tab;
    int32_t before[4];

    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    reserve(pool, 1, 0, 6); /* one full block, two tokens into the second */
    bm_pool_ops_clear(pool);
    tab = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 2);
    before[0] = tab[0];
    before[1] = tab[1];
    free0 = bm_pool_free_blocks(pool);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 13), 4);

    bm_pool_step_begin(pool);
    /* Two reserves in the step: 6 -> 9 -> 11 tokens; the second block
     * fills and is registered, a third is opened. */
    reserve(pool, 1, 6, 3);
    reserve(pool, 1, 9, 2);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 11);
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 13), 8);
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_OK);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 6);
    tab = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 2);
    ck_assert_int_eq(tab[0], before[0]);
    ck_assert_int_eq(tab[1], before[1]);
    ck_assert_uint_eq(bm_pool_free_blocks(pool), free0);
    /* The second block's hash (made for bytes never written) is gone. */
    ck_assert_uint_eq(bm_prefix_probe(pool, 0, toks, 13), 4);
    bm_pool_check(pool);
    /* Taken back, the sequence may leave in the same step. */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    bm_pool_step_end(pool);
    bm_pool_check(pool);
    bm_seq_free(pool, 1);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

START_TEST(test_unreserve_then_free_and_reuse)
{
    bm_pool_t *pool = pool_new(0);

    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    reserve(pool, 1, 0, 4);
    bm_pool_step_begin(pool);
    reserve(pool, 1, 4, 4); /* block 2 sealed and registered at plan time */
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_OK);
    bm_seq_free(pool, 1); /* would abort without the take-back */
    /* A new sequence with the same tokens gets only the first block. */
    uint32_t got = 0;
    ck_assert_int_eq(bm_seq_create(pool, 2, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 2, toks, 9, &got), ST_OK);
    ck_assert_uint_eq(got, 4);
    bm_pool_step_end(pool);
    bm_seq_free(pool, 2);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

START_TEST(test_unreserve_copy_on_write_tail)
{
    bm_pool_t *pool = pool_new(0);
    uint32_t nb = 0;

    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    reserve(pool, 1, 0, 6);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    bm_pool_ops_clear(pool);
    bm_pool_step_begin(pool);
    reserve(pool, 2, 6, 1); /* copy of the shared partial tail */
    ck_assert_int_eq(bm_seq_unreserve(pool, 2), ST_OK);
    ck_assert_uint_eq(bm_seq_len(pool, 2), 6);
    (void)bm_seq_table(pool, 2, &nb);
    ck_assert_uint_eq(nb, 2);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 6);
    bm_pool_check(pool);
    bm_seq_free(pool, 2);
    bm_pool_step_end(pool);
    bm_seq_free(pool, 1);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

START_TEST(test_unreserve_refusals)
{
    bm_pool_t *pool = pool_new(16);
    uint32_t got = 0;

    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    reserve(pool, 1, 0, 6);
    /* Outside a step. */
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_EINVAL);
    bm_pool_step_begin(pool);
    /* Nothing reserved in this step; unknown sequence. */
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_EINVAL);
    ck_assert_int_eq(bm_seq_unreserve(pool, 99), ST_EINVAL);
    /* Reserved, then forked: the child shares its blocks. */
    reserve(pool, 1, 6, 2);
    ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 8);
    bm_pool_step_end(pool);
    bm_seq_free(pool, 2);

    /* Reserved, then another sequence's lookup hit the block it sealed. */
    bm_pool_step_begin(pool);
    reserve(pool, 1, 8, 4);
    ck_assert_int_eq(bm_seq_create(pool, 3, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(pool, 3, toks, 13, &got), ST_OK);
    ck_assert_uint_eq(got, 12);
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_EINVAL);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 12);
    bm_pool_step_end(pool);
    bm_seq_free(pool, 3);

    /* Swapped in, then reserved. */
    ck_assert_int_eq(bm_seq_swap_out(pool, 1), ST_OK);
    bm_pool_step_begin(pool);
    ck_assert_int_eq(bm_seq_swap_in(pool, 1), ST_OK);
    reserve(pool, 1, 12, 1);
    ck_assert_int_eq(bm_seq_unreserve(pool, 1), ST_EINVAL);
    bm_pool_step_end(pool);
    bm_pool_check(pool);
    bm_seq_free(pool, 1);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

Suite *
blockmgr_unreserve_suite(void)
{
    Suite *s = suite_create("blockmgr_unreserve");
    TCase *tc = tcase_create("unreserve");

    tcase_add_test(tc, test_unreserve_takes_back_blocks_and_hashes);
    tcase_add_test(tc, test_unreserve_then_free_and_reuse);
    tcase_add_test(tc, test_unreserve_copy_on_write_tail);
    tcase_add_test(tc, test_unreserve_refusals);
    suite_add_tcase(s, tc);
    return s;
}
