/* test_req_index.c - the scheduler's request id map (scheduler/req_index.h)
 * against a brute-force model: random puts and deletes, every id looked
 * up after each change, growth, and ids that collide in their home slot. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/status.h"
#include "scheduler/req_index.h"

#define N_IDS 4096

START_TEST(test_req_index_random_against_model)
{
    static uint64_t ids[N_IDS];
    static int live[N_IDS];
    static int vals[N_IDS];
    uint64_t x = 88172645463325252ull;
    ridx_t ix;
    uint32_t n = 0;

    ridx_init(&ix);
    ck_assert_ptr_null(ridx_get(&ix, 1));
    ridx_del(&ix, 1); /* empty: no-op */
    for (int i = 0; i < N_IDS; i++) {
        /* Half sequential (the daemon's ids), half random. */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = i % 2 == 0 ? (uint64_t)i + 1 : x;
        live[i] = 0;
    }
    for (int op = 0; op < 200000; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int i = (int)(x % N_IDS);
        if (!live[i]) {
            ck_assert_int_eq(ridx_reserve(&ix, n + 1), ST_OK);
            ridx_put(&ix, ids[i], &vals[i]);
            live[i] = 1;
            n++;
        } else if ((x >> 32) % 3 != 0) {
            ridx_del(&ix, ids[i]);
            live[i] = 0;
            n--;
        }
        ck_assert_uint_eq(ix.n, n);
        if (op % 997 == 0) {
            for (int k = 0; k < N_IDS; k++) {
                void *v = ridx_get(&ix, ids[k]);
                if (live[k] ? v != &vals[k] : v != NULL) {
                    ck_abort_msg("op %d: id %llu live %d maps to %p", op,
                                 (unsigned long long)ids[k], live[k], v);
                }
            }
        }
    }
    ck_assert_uint_ge((uint64_t)ix.mask + 1, 2 * (uint64_t)n);
    ridx_fini(&ix);
}
END_TEST

Suite *
scheduler_req_index_suite(void)
{
    Suite *s = suite_create("req_index");
    TCase *tc = tcase_create("req_index");

    tcase_add_test(tc, test_req_index_random_against_model);
    suite_add_tcase(s, tc);
    return s;
}
