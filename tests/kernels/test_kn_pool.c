/* test_kn_pool.c - the kernels' fork-join team under forced interleavings.
 *
 * Includes kernels/cpu/kn_pool.c itself with its test points defined: a
 * worker that has just read the claim word, and the caller between the
 * steps of opening a region, yield the CPU at random. With more members
 * than cores this makes stragglers of one region meet the opening of the
 * next. Each region alternates between few and many chunks (a stale claim
 * of a small region is a valid chunk number of a large one) and checks
 * that every chunk ran exactly once, with the right n_chunks, before the
 * call returned; a lost wake-up or an overshooting done counter hangs,
 * which Check's timeout reports as a failure.
 */
#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

static _Atomic uint64_t tp_rng = 0x9E3779B97F4A7C15ull;

/* 1 in 8 calls yields: cheap, and often enough to lose the CPU mid-step. */
static void
tp_maybe_yield(void)
{
    uint64_t x = atomic_fetch_add_explicit(&tp_rng, 0x9E3779B97F4A7C15ull, memory_order_relaxed);

    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    if ((x & 7) == 0) {
        sched_yield();
    }
}

#define KN_POOL_TEST_POINT_CLAIM() tp_maybe_yield()
#define KN_POOL_TEST_POINT_OPEN() tp_maybe_yield()
#include "kernels/cpu/kn_pool.c"

#define TP_MAX_CHUNKS 64

typedef struct tp_region {
    int n_chunks;
    _Atomic int runs[TP_MAX_CHUNKS];
    _Atomic int bad_n; /* chunks called with another region's n_chunks */
    _Atomic int out_of_range;
} tp_region_t;

static void
tp_chunk(void *arg, int c, int n)
{
    tp_region_t *r = arg;

    if (n != r->n_chunks) {
        atomic_fetch_add(&r->bad_n, 1);
    }
    if (c < 0 || c >= r->n_chunks) {
        atomic_fetch_add(&r->out_of_range, 1);
        return;
    }
    atomic_fetch_add(&r->runs[c], 1);
}

static void
tp_run_regions(int team, int n_regions)
{
    static const int sizes[] = {2, 64, 3, 17, 1, 40, 5, 64, 2, 9};
    /* Two regions alternate so a straggler of the previous one touches
     * memory that is not being checked or reset under it. */
    static tp_region_t regs[2];

    for (int i = 0; i < n_regions; i++) {
        tp_region_t *r = &regs[i & 1];

        r->n_chunks = sizes[i % (int)(sizeof(sizes) / sizeof(sizes[0]))];
        for (int c = 0; c < TP_MAX_CHUNKS; c++) {
            atomic_store(&r->runs[c], 0);
        }
        atomic_store(&r->bad_n, 0);
        atomic_store(&r->out_of_range, 0);
        kn__pool_run(team, r->n_chunks, tp_chunk, r);
        for (int c = 0; c < TP_MAX_CHUNKS; c++) {
            ck_assert_msg(atomic_load(&r->runs[c]) == (c < r->n_chunks ? 1 : 0),
                          "region %d (%d chunks): chunk %d ran %d times", i, r->n_chunks, c,
                          atomic_load(&r->runs[c]));
        }
        ck_assert_int_eq(atomic_load(&r->bad_n), 0);
        ck_assert_int_eq(atomic_load(&r->out_of_range), 0);
    }
}

START_TEST(test_pool_every_chunk_once_team2)
{
    tp_run_regions(2, 20000);
}
END_TEST

START_TEST(test_pool_every_chunk_once_team4)
{
    tp_run_regions(4, 20000);
}
END_TEST

START_TEST(test_pool_team_of_one_and_single_chunk)
{
    tp_region_t r = {.n_chunks = 7};

    kn__pool_run(1, 7, tp_chunk, &r);
    for (int c = 0; c < 7; c++) {
        ck_assert_int_eq(atomic_load(&r.runs[c]), 1);
    }
    kn__pool_run(4, 0, tp_chunk, &r); /* no chunks: fn never runs */
    for (int c = 0; c < 7; c++) {
        ck_assert_int_eq(atomic_load(&r.runs[c]), 1);
    }
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("kn_pool");
    TCase *tc = tcase_create("pool");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_pool_team_of_one_and_single_chunk);
    tcase_add_test(tc, test_pool_every_chunk_once_team2);
    tcase_add_test(tc, test_pool_every_chunk_once_team4);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
