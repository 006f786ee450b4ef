/* test_kv_slots.c - kernels/cpu/kv_slots.h: binding, release, LRU choice,
 * and a randomized sequence with the invariant walk after every step. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cpu/kv_slots.h"

static kn_kvslots_t t;

static void
setup(void)
{
    kn_kvslots_init(&t, 8, 3);
}

static void
teardown(void)
{
    kn_kvslots_check(&t);
    kn_kvslots_fini(&t);
}

START_TEST(test_fresh_table_hands_out_slots_in_order)
{
    ck_assert_int_eq(t.n_free, 3);
    for (int32_t b = 0; b < 8; b++) {
        ck_assert_int_eq(t.slot_of[b], -1);
    }
    ck_assert_int_eq(kn_kvslots_take(&t, 5, 1), 0);
    ck_assert_int_eq(kn_kvslots_take(&t, 2, 2), 1);
    ck_assert_int_eq(t.slot_of[5], 0);
    ck_assert_int_eq(t.slot_blk[1], 2);
    ck_assert_int_eq(t.slot_fill[1], 0);
    ck_assert_uint_eq(t.slot_used[1], 2);
    ck_assert_int_eq(t.n_free, 1);
    kn_kvslots_check(&t);
}
END_TEST

START_TEST(test_release_frees_and_reuses_last_freed)
{
    kn_kvslots_take(&t, 0, 1);
    kn_kvslots_take(&t, 1, 2);
    t.slot_fill[1] = 7;
    kn_kvslots_release(&t, 1);
    ck_assert_int_eq(t.slot_of[1], -1);
    ck_assert_int_eq(t.slot_blk[1], -1);
    ck_assert_int_eq(t.n_free, 2);
    kn_kvslots_release(&t, 1); /* no slot: no-op */
    kn_kvslots_release(&t, 6);
    ck_assert_int_eq(t.n_free, 2);
    /* Freed slot 1 is on top of the stack, and a new owner starts empty. */
    ck_assert_int_eq(kn_kvslots_take(&t, 4, 3), 1);
    ck_assert_int_eq(t.slot_fill[1], 0);
}
END_TEST

START_TEST(test_lru_skips_avoid_guard_and_free)
{
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, UINT64_MAX), -1); /* nothing bound */
    kn_kvslots_take(&t, 0, 10); /* slot 0 */
    kn_kvslots_take(&t, 1, 20); /* slot 1 */
    kn_kvslots_take(&t, 2, 30); /* slot 2 */
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, UINT64_MAX), 0);
    ck_assert_int_eq(kn_kvslots_lru(&t, 0, UINT64_MAX), 1);
    t.slot_used[0] = 40; /* written again: now the newest */
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, UINT64_MAX), 1);
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, 15), -1); /* all written after 15 */
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, 30), 1);
    ck_assert_int_eq(kn_kvslots_lru(&t, 1, 30), 2);
    kn_kvslots_release(&t, 1);
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, UINT64_MAX), 2);
    t.slot_used[0] = 30; /* a tie goes to the lower slot */
    ck_assert_int_eq(kn_kvslots_lru(&t, -1, UINT64_MAX), 0);
}
END_TEST

/* Random take / release / flush-the-LRU against a shadow map. */
START_TEST(test_random_sequence_keeps_invariants)
{
    int32_t owner[3] = {-1, -1, -1};
    uint64_t stamp = 0;

    srand(12345);
    for (int step = 0; step < 5000; step++) {
        int32_t blk = rand() % 8;

        if (rand() % 3 == 0) {
            int32_t s = t.slot_of[blk];

            kn_kvslots_release(&t, blk);
            if (s >= 0) {
                owner[s] = -1;
            }
        } else if (t.slot_of[blk] >= 0) {
            t.slot_used[t.slot_of[blk]] = ++stamp; /* another write */
        } else {
            if (t.n_free == 0) {
                int32_t v = kn_kvslots_lru(&t, -1, UINT64_MAX);

                ck_assert_int_ge(v, 0);
                for (int32_t i = 0; i < 3; i++) {
                    ck_assert(t.slot_used[v] <= t.slot_used[i]);
                }
                kn_kvslots_release(&t, t.slot_blk[v]);
                owner[v] = -1;
            }
            owner[kn_kvslots_take(&t, blk, ++stamp)] = blk;
        }
        kn_kvslots_check(&t);
        for (int32_t s = 0; s < 3; s++) {
            ck_assert_int_eq(t.slot_blk[s], owner[s]);
        }
    }
}
END_TEST

START_TEST(test_no_slots_table)
{
    kn_kvslots_t z;

    kn_kvslots_init(&z, 4, 0);
    ck_assert_int_eq(z.n_free, 0);
    ck_assert_int_eq(z.slot_of[3], -1);
    ck_assert_int_eq(kn_kvslots_lru(&z, -1, UINT64_MAX), -1);
    kn_kvslots_release(&z, 3);
    kn_kvslots_check(&z);
    kn_kvslots_fini(&z);
    kn_kvslots_fini(&z); /* zeroed: no-op */
}
END_TEST

Suite *
kernels_kv_slots_suite(void)
{
    Suite *s = suite_create("kernels_kv_slots");
    TCase *tc = tcase_create("slots");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_fresh_table_hands_out_slots_in_order);
    tcase_add_test(tc, test_release_frees_and_reuses_last_freed);
    tcase_add_test(tc, test_lru_skips_avoid_guard_and_free);
    tcase_add_test(tc, test_random_sequence_keeps_invariants);
    tcase_add_test(tc, test_no_slots_table);
    suite_add_tcase(s, tc);
    return s;
}
