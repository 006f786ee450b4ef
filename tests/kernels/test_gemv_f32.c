/* test_gemv_f32.c - the f32 GEMV on F32 weights (kernels/cpu/kn_gemv_f32.c)
 * at every ISA level this CPU has, forced with kn_cpu_set_isa(), against a
 * scalar double-precision reference written here: random and
 * outlier-heavy data, ragged shapes (rows and k not multiples of any
 * vector width or of the rows of a pass), row slices that start and end
 * inside a pass, bias and accumulate, 1 and 2 threads. Also: the result
 * does not depend on the thread count, and on AVX2 / AVX-512 a token alone
 * gives bit for bit what the few-row GEMM gives it inside a batch.
 *
 * Tolerance: |y - ref| <= (k + 8) * FLT_EPSILON * (sum |x_i w_i| + |bias|
 * + |y0|), the classic bound for a float sum of k + 2 terms in any order
 * (gamma_n, with the FMA's single rounding inside it). A kernel that drops
 * or repeats one column, or reads a neighbour row, misses it by orders of
 * magnitude on these data.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_gemv_f32.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static double
urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* n values: uniform in [-1, 1], or (outliers) mostly small with one in 16
 * up to +-1e4 and one in 64 a tiny 1e-6-scale value: the dynamic range of
 * real activations and weights with outlier channels. */
static float *
make_data(size_t n, int outliers)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));

    for (size_t i = 0; i < n; i++) {
        double v = urand() * 2.0 - 1.0;

        if (outliers) {
            double u = urand();

            v *= u < 1.0 / 16 ? 1e4 : (u < 1.0 / 16 + 1.0 / 64 ? 1e-6 : 0.05);
        }
        p[i] = (float)v;
    }
    return p;
}

/* Reference and its error bound for rows [r0, r1) of every token. */
static void
ref_gemv(const float *x, const float *w, const float *bias, const float *y0, double *ref,
         double *bound, int32_t m, int32_t k, int32_t d_out, int accumulate)
{
    for (int32_t t = 0; t < m; t++) {
        for (int32_t o = 0; o < d_out; o++) {
            double s = 0.0, a = 0.0;
            size_t yi = (size_t)t * d_out + o;

            for (int32_t i = 0; i < k; i++) {
                double p = (double)x[(size_t)t * k + i] * (double)w[(size_t)o * k + i];

                s += p;
                a += fabs(p);
            }
            if (bias != NULL) {
                s += bias[o];
                a += fabs(bias[o]);
            }
            if (accumulate) {
                s += y0[yi];
                a += fabs(y0[yi]);
            }
            ref[yi] = s;
            bound[yi] = (double)(k + 8) * FLT_EPSILON * a + 1e-30;
        }
    }
}

static void
check_close(const float *y, const double *ref, const double *bound, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)y[i] - ref[i]);

        ck_assert_msg(isfinite(y[i]) && e <= bound[i],
                      "%s: y[%zu] = %.9g, reference %.9g (error %.3g > bound %.3g) isa %s "
                      "threads %d",
                      what, i, (double)y[i], ref[i], e, bound[i], kn_isa_name(kn_cpu_isa()),
                      kn_cpu_threads());
    }
}

/* Every shape through kn_cpu_matmul (1 and 3 tokens: the GEMV path and
 * its split over the team) and through the kernel directly on a row slice
 * (rows outside the slice must stay untouched). */
static void
check_shape(int32_t d_out, int32_t k, int outliers)
{
    float *x = make_data((size_t)3 * k, outliers);
    float *w = make_data((size_t)d_out * k, outliers);
    float *bias = make_data((size_t)d_out, outliers);
    float *y0 = make_data((size_t)3 * d_out, outliers);
    float *y = malloc(sizeof(float) * 3 * (size_t)d_out);
    double *ref = malloc(sizeof(double) * 3 * (size_t)d_out);
    double *bound = malloc(sizeof(double) * 3 * (size_t)d_out);
    char what[96];

    kn_cpu_init(0);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            for (int mode = 0; mode < 4; mode++) { /* plain, bias, + accumulate, 3 tokens */
                const float *b = mode >= 1 ? bias : NULL;
                int acc = mode >= 2, m = mode == 3 ? 3 : 1;

                snprintf(what, sizeof(what), "matmul %dx%d outliers %d mode %d", d_out, k, outliers,
                         mode);
                memcpy(y, y0, sizeof(float) * (size_t)m * d_out);
                ref_gemv(x, w, b, y0, ref, bound, m, k, d_out, acc);
                kn_cpu_matmul(x, w, b, y, m, k, d_out, acc);
                check_close(y, ref, bound, (size_t)m * d_out, what);
            }
            /* A slice [r0, r1) that starts and ends inside a pass. */
            {
                int32_t r0 = d_out / 3, r1 = d_out - d_out / 5;
                kn_gemv_f32_fn fn = kn__gemv_f32_for((kn_isa_t)isa);

                snprintf(what, sizeof(what), "slice [%d, %d) of %dx%d outliers %d", r0, r1, d_out,
                         k, outliers);
                memcpy(y, y0, sizeof(float) * (size_t)d_out);
                ref_gemv(x, w, NULL, y0, ref, bound, 1, k, d_out, 1);
                fn(x, w, y, 1, k, d_out, r0, r1, 1);
                for (int32_t o = 0; o < d_out; o++) {
                    if (o < r0 || o >= r1) {
                        ck_assert_msg(memcmp(&y[o], &y0[o], sizeof(float)) == 0,
                                      "%s: row %d outside the slice changed", what, o);
                    }
                }
                check_close(y + r0, ref + r0, bound + r0, (size_t)(r1 - r0), what);
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    free(x);
    free(w);
    free(bias);
    free(y0);
    free(y);
    free(ref);
    free(bound);
}

START_TEST(test_gemv_ragged)
{
    /* rows x k: below and above one vector (8, 16 floats) and one pass (8,
     * 16 rows), primes, and the 135M shapes (q, k/v, FFN up, FFN down). */
    static const int32_t shapes[][2] = {
        {1, 1},    {1, 7},    {3, 5},     {7, 16},    {8, 17},   {15, 31},  {16, 33},
        {17, 8},   {31, 15},  {33, 191},  {47, 64},   {100, 63}, {129, 97}, {192, 576},
        {576, 576}, {1536, 576}, {576, 1536}, {1031, 577},
    };

    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        check_shape(shapes[s][0], shapes[s][1], 0);
        check_shape(shapes[s][0], shapes[s][1], 1);
    }
}
END_TEST

/* The split over the team changes nothing: 1 and 2 threads give the same
 * bits, on shapes large enough to run a region (1031 x 577 is past the
 * GEMV's parallel threshold, 3 x 5 is not). */
START_TEST(test_gemv_threads)
{
    static const int32_t shapes[][2] = {{3, 5}, {1031, 577}, {4099, 300}};

    kn_cpu_init(0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int32_t d_out = shapes[s][0], k = shapes[s][1];
        float *x = make_data((size_t)k, 1), *w = make_data((size_t)d_out * k, 1);
        float *y1 = malloc(sizeof(float) * (size_t)d_out), *y2 = malloc(sizeof(float) * d_out);

        for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            kn_cpu_init(1);
            kn_cpu_matmul(x, w, NULL, y1, 1, k, d_out, 0);
            kn_cpu_init(2);
            kn_cpu_matmul(x, w, NULL, y2, 1, k, d_out, 0);
            ck_assert_msg(memcmp(y1, y2, sizeof(float) * (size_t)d_out) == 0,
                          "%dx%d isa %s: 1 and 2 threads differ", d_out, k, kn_isa_name(isa));
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
        free(x);
        free(w);
        free(y1);
        free(y2);
    }
}
END_TEST

/* A token alone (the GEMV) against the same token in a batch (the GEMV up
 * to KN_GEMV_MAX_M tokens, then the few-row GEMM up to 32): bit for bit on
 * AVX2 and AVX-512, whose kernels share the per-row arithmetic; within the
 * bound on the generic level. */
START_TEST(test_gemv_alone_vs_batch)
{
    static const int32_t shapes[][3] = {{37, 53, 3}, {576, 576, 8}, {130, 1539, 5}, {1031, 577, 4}};

    kn_cpu_init(0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int32_t d_out = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
        float *x = make_data((size_t)m * k, 1), *w = make_data((size_t)d_out * k, 0);
        float *yb = malloc(sizeof(float) * (size_t)m * d_out), *ya = malloc(sizeof(float) * d_out);
        double *ref = malloc(sizeof(double) * (size_t)d_out);
        double *bound = malloc(sizeof(double) * (size_t)d_out);

        for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            for (int nt = 1; nt <= 2; nt++) {
                kn_cpu_init(nt);
                kn_cpu_matmul(x, w, NULL, yb, m, k, d_out, 0);
                for (int32_t t = 0; t < m; t++) {
                    const float *xt = x + (size_t)t * k;

                    kn_cpu_matmul(xt, w, NULL, ya, 1, k, d_out, 0);
                    if (isa >= KN_ISA_AVX2) {
                        ck_assert_msg(memcmp(ya, yb + (size_t)t * d_out,
                                             sizeof(float) * (size_t)d_out) == 0,
                                      "%dx%d token %d of %d isa %s: alone != in the batch", d_out,
                                      k, t, m, kn_isa_name(isa));
                    } else {
                        ref_gemv(xt, w, NULL, NULL, ref, bound, 1, k, d_out, 0);
                        check_close(ya, ref, bound, (size_t)d_out, "alone (generic)");
                        check_close(yb + (size_t)t * d_out, ref, bound, (size_t)d_out,
                                    "in the batch (generic)");
                    }
                }
            }
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
        free(x);
        free(w);
        free(yb);
        free(ya);
        free(ref);
        free(bound);
    }
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("kn_gemv_f32");
    TCase *tc = tcase_create("gemv");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gemv_ragged);
    tcase_add_test(tc, test_gemv_threads);
    tcase_add_test(tc, test_gemv_alone_vs_batch);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
