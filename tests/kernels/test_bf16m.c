/* test_bf16m.c - BF16 weights with kn_act_t bf16_medium (--matmul-precision
 * medium, kernels/cpu/kn_bf16m.c): kn_matmul_w at every ISA level this CPU
 * has (forced with kn_cpu_set_isa) x 1 and 2 threads against the scalar
 * reference kn_matmul_w_ref_medium, on random and outlier-heavy data,
 * shapes whose rows are not multiples of the 4-row tile and whose columns
 * end inside a 32-column step (37, 96, 576) or pass KN_BF16_DP_COLS
 * (4352), n_tok 1 .. 40; every level against every other; bias and
 * accumulate; a token alone bit for bit as in its batch; kn_matmul_w_n
 * bit for bit as kn_matmul_w; one activation read at high and medium in
 * turn and at every level (its bf16 bytes change form); and activations
 * that bf16 rounds down by 0.29% each, so that a kernel ignoring medium
 * (or high rounding) is off by far more than the tolerance.
 *
 * KVSERVE_TEST_SCALE < 1 (the sanitizer runs) takes every third n_tok.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"

static uint64_t rng_state = 0x853c49e6748fea9bull;

static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Uniform [-1, 1), or (outliers) mostly small values with about 2% of them
 * 30 to 60 times larger, and some near 2^-100 and 2^60 (a wide range of
 * exponents, all normal in bf16). */
static void
fill(float *x, size_t n, int outliers)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = frand();
        if (outliers) {
            float u = frand();

            x[i] *= 0.1f;
            if (u > 0.96f) {
                x[i] = (frand() > 0 ? 1.0f : -1.0f) * (3.0f + 3.0f * fabsf(frand()));
            } else if (u < -0.995f) {
                x[i] = ldexpf(x[i], frand() > 0 ? 60 : -100);
            }
        }
    }
}

static double
scale_env(void)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");

    return e != NULL ? atof(e) : 1.0;
}

/* A rows x cols BF16 weight rounded from data (random when data is NULL);
 * deq gets its values. w->data is malloc'd. */
static kn_weight_t
make_bf16(int32_t rows, int32_t cols, int outliers, const float *data, float *deq)
{
    kn_weight_t w = {KN_W_BF16, NULL, kn_wtype_row_bytes(KN_W_BF16, cols), rows, cols};
    float *src = malloc(sizeof(float) * (size_t)rows * cols);
    uint8_t *bytes = malloc(w.row_bytes * (size_t)rows);

    if (data != NULL) {
        memcpy(src, data, sizeof(float) * (size_t)rows * cols);
    } else {
        fill(src, (size_t)rows * cols, outliers);
    }
    for (int32_t r = 0; r < rows; r++) {
        kn_quant_row(KN_W_BF16, src + (size_t)r * cols, bytes + w.row_bytes * r, cols);
        kn_dequant_row(KN_W_BF16, bytes + w.row_bytes * r, deq + (size_t)r * cols, cols);
    }
    w.data = bytes;
    free(src);
    return w;
}

/* The tolerance of a kernel's y against kn_matmul_w_ref_medium, per
 * output: every product bf16(w) bf16(x) is exact in f32 at every level
 * (8-bit significands), so a kernel differs from the double-accumulated
 * reference only by the f32 rounding of its sums. However it orders them
 * (vdpbf16ps 16 lanes, the FMA tiles 16 or 8 lanes, the C level one
 * running sum over all columns), a sum of n terms in f32 is within
 * (n - 1) 2^-24 sum |term| of the exact one (recursive summation's bound),
 * n <= cols + 3 (the columns, bias, y, the lane tree): hence
 * (cols + 16) 2^-24 (sum |w bf16(x)| + |bias| + |y0|), + 1e-30 for
 * subnormal products that vdpbf16ps flushes and the FMA levels keep (none
 * in this data: its products are all normal). Two levels then agree
 * within twice that. */
static void
tolerances(const float *x, const float *deq, const float *bias, const float *y0, int accumulate,
           int32_t rows, int32_t cols, int32_t n_tok, double *tol)
{
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t o = 0; o < rows; o++) {
            double s = 0;

            for (int32_t i = 0; i < cols; i++) {
                float xr = kn_bf16_to_f32(kn_f32_to_bf16(x[(size_t)t * cols + i]));

                s += fabs((double)deq[(size_t)o * cols + i] * xr);
            }
            s += (bias != NULL ? fabs(bias[o]) : 0) +
                 (accumulate ? fabs(y0[(size_t)t * rows + o]) : 0);
            tol[(size_t)t * rows + o] = (cols + 16) * ldexp(1.0, -24) * s + 1e-30;
        }
    }
}

/* One shape x n_tok x data: every ISA level and thread count 1, 2 against
 * the reference and against level 0; mode 0 plain, 1 bias, 2 bias +
 * accumulate. One activation serves every level (its form is remade as
 * the level changes), and a high-precision product on it in between. */
static void
check_case(int32_t rows, int32_t cols, int32_t n_tok, int outliers, int mode)
{
    size_t ny = (size_t)n_tok * rows;
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols);
    float *deq = malloc(sizeof(float) * (size_t)rows * cols);
    float *bias = malloc(sizeof(float) * (size_t)rows), *y0 = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    float *yh = malloc(sizeof(float) * ny), *yl0 = malloc(sizeof(float) * ny);
    double *tol = malloc(sizeof(double) * ny);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));
    const float *bp = mode >= 1 ? bias : NULL;
    int accumulate = mode == 2;
    kn_act_t act;

    fill(x, (size_t)n_tok * cols, outliers);
    fill(bias, (size_t)rows, 0);
    fill(y0, ny, 0);
    kn_weight_t w = make_bf16(rows, cols, outliers, NULL, deq);

    memcpy(yr, y0, sizeof(float) * ny);
    kn_matmul_w_ref_medium(x, n_tok, &w, bp, yr, accumulate);
    tolerances(x, deq, bp, y0, accumulate, rows, cols, n_tok, tol);
    kn_act_init(&act, x, n_tok, cols, abuf);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            act.bf16_medium = 1;
            memcpy(y, y0, sizeof(float) * ny);
            kn_matmul_w(&act, &w, bp, y, accumulate);
            for (size_t i = 0; i < ny; i++) {
                ck_assert_msg(fabs((double)y[i] - yr[i]) <= tol[i],
                              "%s nt %d (%d x %d, n_tok %d, outliers %d, mode %d) at %zu: %.9g "
                              "vs ref %.9g (tol %g)",
                              kn_isa_name((kn_isa_t)isa), nt, rows, cols, n_tok, outliers, mode, i,
                              y[i], yr[i], tol[i]);
            }
            if (isa == 0 && nt == 1) {
                memcpy(yl0, y, sizeof(float) * ny);
            }
            for (size_t i = 0; i < ny; i++) {
                ck_assert_msg(fabs((double)y[i] - yl0[i]) <= 2 * tol[i],
                              "%s nt %d vs %s at %zu: %.9g vs %.9g", kn_isa_name((kn_isa_t)isa), nt,
                              kn_isa_name((kn_isa_t)0), i, y[i], yl0[i]);
            }
            /* The same activation at high precision in between: its own
             * reference and tolerance (kn_quant.h: 1e-4 sum |w x|) hold. */
            act.bf16_medium = 0;
            memcpy(yh, y0, sizeof(float) * ny);
            kn_matmul_w(&act, &w, bp, yh, accumulate);
            memcpy(y, y0, sizeof(float) * ny);
            kn_matmul_w_ref(x, n_tok, &w, bp, y, accumulate);
            for (size_t i = 0; i < ny; i++) {
                double s = 0;
                int32_t t = (int32_t)(i / (size_t)rows), o = (int32_t)(i % (size_t)rows);

                for (int32_t c = 0; c < cols; c++) {
                    s += fabs((double)deq[(size_t)o * cols + c] * x[(size_t)t * cols + c]);
                }
                s += (bp != NULL ? fabs(bias[o]) : 0) + (accumulate ? fabs(y0[i]) : 0);
                ck_assert_msg(fabs((double)yh[i] - y[i]) <= 1e-4 * s + 1e-6,
                              "high %s nt %d after medium at %zu: %.9g vs ref %.9g",
                              kn_isa_name((kn_isa_t)isa), nt, i, yh[i], y[i]);
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    free((void *)w.data);
    free(x);
    free(deq);
    free(bias);
    free(y0);
    free(y);
    free(yr);
    free(yh);
    free(yl0);
    free(tol);
    free(abuf);
}

START_TEST(test_medium_ntok)
{
    int step = scale_env() < 1.0 ? 3 : 1;

    for (int32_t n = 1; n <= 40; n += step) {
        check_case(13, 256, n, n % 2, n % 3);
        check_case(7, 37, n, (n + 1) % 2, (n + 1) % 3);
    }
}
END_TEST

START_TEST(test_medium_shapes)
{
    static const int32_t shapes[][2] = {{38, 512}, {22, 1280}, {9, 576}, {6, 96}, {5, 4352}};
    static const int32_t nts[] = {1, 3, 8, 17};

    for (int s = 0; s < 5; s++) {
        for (int i = 0; i < 4; i++) {
            check_case(shapes[s][0], shapes[s][1], nts[i], (s + i) % 2, (s + i) % 3);
        }
    }
}
END_TEST

/* Large enough to split over two threads (>= 2^19 multiply-adds). */
START_TEST(test_medium_threads)
{
    check_case(300, 2048, 1, 0, 1);
    check_case(70, 1024, 8, 1, 2);
}
END_TEST

/* x = (1 + 3 / 1024) 2^k: bf16 (7 stored bits) rounds it down to 2^k, so
 * with positive weights medium's y is 1 / 1.0029 of high's: 2.9e-3
 * relative, 20x or more the tolerances, at every level, so a level that
 * ignores bf16_medium fails here (and one that rounds at high, too). */
START_TEST(test_medium_rounds)
{
    const int32_t rows = 9, cols = 300, n_tok = 5;
    size_t ny = (size_t)n_tok * rows;
    float x[5 * 300], src[9 * 300], deq[9 * 300], y[5 * 9], yr[5 * 9], yh[5 * 9];
    double tol[5 * 9];
    void *abuf = malloc(kn_act_bytes(n_tok, cols));

    for (int i = 0; i < n_tok * cols; i++) {
        x[i] = ldexpf(1.0f + 3.0f / 1024.0f, (int)(frand() * 3.5f));
    }
    for (int i = 0; i < rows * cols; i++) {
        src[i] = 0.75f + 0.25f * frand();
    }
    kn_weight_t w = make_bf16(rows, cols, 0, src, deq);

    kn_matmul_w_ref_medium(x, n_tok, &w, NULL, yr, 0);
    kn_matmul_w_ref(x, n_tok, &w, NULL, yh, 0);
    tolerances(x, deq, NULL, NULL, 0, rows, cols, n_tok, tol);
    for (size_t i = 0; i < ny; i++) {
        ck_assert(fabs(yh[i] / yr[i] - (1.0 + 3.0 / 1024.0)) < 1e-6);
        ck_assert(fabs((double)yh[i] - yr[i]) > 20 * tol[i]);
    }
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int medium = 0; medium <= 1; medium++) {
            kn_act_t act;
            const float *want = medium ? yr : yh;

            kn_act_init(&act, x, n_tok, cols, abuf);
            act.bf16_medium = medium;
            kn_matmul_w(&act, &w, NULL, y, 0);
            for (size_t i = 0; i < ny; i++) {
                ck_assert_msg(fabs((double)y[i] - want[i]) <=
                                  tol[i] + 1e-4 * fabs(want[i]) * !medium,
                              "%s medium %d at %zu: %.9g vs %.9g", kn_isa_name((kn_isa_t)isa),
                              medium, i, y[i], want[i]);
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    free((void *)w.data);
    free(abuf);
}
END_TEST

/* A token alone gives the same bits as in its batch, and kn_matmul_w_n
 * the same bits as kn_matmul_w, at every level and 1 and 2 threads. */
START_TEST(test_medium_batch_independent)
{
    const int32_t rows = 70, cols = 1024, n_tok = 23;
    float *x = malloc(sizeof(float) * n_tok * cols), *deq = malloc(sizeof(float) * rows * cols);
    float *yb = malloc(sizeof(float) * n_tok * rows), *y1 = malloc(sizeof(float) * rows);
    float *yn[2] = {malloc(sizeof(float) * n_tok * rows), malloc(sizeof(float) * n_tok * rows)};
    void *abuf = malloc(kn_act_bytes(n_tok, cols));

    fill(x, (size_t)n_tok * cols, 1);
    kn_weight_t w = make_bf16(rows, cols, 0, NULL, deq);
    kn_weight_t w2 = make_bf16(rows, cols, 1, NULL, deq);

    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            const kn_weight_t *ws[2] = {&w, &w2};
            float *const ys[2] = {yn[0], yn[1]};
            kn_act_t act;

            kn_cpu_init(nt);
            kn_act_init(&act, x, n_tok, cols, abuf);
            act.bf16_medium = 1;
            kn_matmul_w(&act, &w, NULL, yb, 0);
            kn_matmul_w_n(&act, 2, ws, NULL, ys, 0);
            ck_assert(memcmp(yn[0], yb, sizeof(float) * n_tok * rows) == 0);
            for (int32_t t = 0; t < n_tok; t++) {
                kn_act_init(&act, x + (size_t)t * cols, 1, cols, abuf);
                act.bf16_medium = 1;
                kn_matmul_w(&act, &w, NULL, y1, 0);
                ck_assert_msg(memcmp(y1, yb + (size_t)t * rows, sizeof(float) * rows) == 0,
                              "%s nt %d: token %d differs alone", kn_isa_name((kn_isa_t)isa), nt,
                              t);
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    kn_cpu_init(0);
    free((void *)w.data);
    free((void *)w2.data);
    free(x);
    free(deq);
    free(yb);
    free(y1);
    free(yn[0]);
    free(yn[1]);
    free(abuf);
}
END_TEST

static Suite *
bf16m_suite(void)
{
    Suite *s = suite_create("kn_bf16m");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_medium_rounds);
    tcase_add_test(tc, test_medium_ntok);
    tcase_add_test(tc, test_medium_shapes);
    tcase_add_test(tc, test_medium_threads);
    tcase_add_test(tc, test_medium_batch_independent);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(bf16m_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
