/* test_q6r8.c - q6_K weights repacked 8 rows at a time (KN_W_Q6_K_R8,
 * kernels/cpu/kn_quant.h), as test_q4r8.c does for q4_K: the repack round
 * trip (every row of the repacked form dequantizes to the bits of
 * kn_dequant_row of the file's row), the shapes it refuses, the embedding lookup through it, and
 * the product at every ISA level this CPU has x 1 and 2 threads, bit for bit against the scalar
 * reference (the integer sums are exact and the f32 steps the same), on random and outlier-heavy
 * weights and activations, rows 8 .. 128, cols 256 .. 4096, n_tok 1 .. 40 (GEMV and tiles of 8),
 * bias and accumulate; the reference within the Q8_K rounding bound of
 * an f64 product over the dequantized weights (wild blocks: every int8
 * scale and code, -128 and 63 included); a token alone against the
 * same token in a batch; a row split that does not fall on a group of 8
 * (kn_matmul_w_n after a 12-row weight) against kn_matmul_w.
 *
 * KVSERVE_TEST_SCALE < 1 (the sanitizer runs) drops the 4096 columns.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"

static uint64_t rng_state = 0x9b05688c2b3e6c1full;

static uint32_t
urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float
frand(void)
{
    return (float)(urand() / (double)(1u << 31)) * 2.0f - 1.0f;
}

/* Uniform [-1, 1), or (outliers) mostly small values with about 2% of
 * them 30 to 60 times larger. */
static void
fill(float *x, size_t n, int outliers)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = frand();
        if (outliers && frand() > 0.96f) {
            x[i] = (frand() > 0 ? 1.0f : -1.0f) * (3.0f + 3.0f * fabsf(frand()));
        } else if (outliers) {
            x[i] *= 0.1f;
        }
    }
}

/* A q6_K matrix: ggml's quantizer over random data, or (wild) random
 * bytes with a sane f16 d: every int8 scale (-128 included) and code. */
static void *
make_q6k(int32_t rows, int32_t cols, int wild, int outliers)
{
    size_t rb = kn_wtype_row_bytes(KN_W_Q6_K, cols);
    uint8_t *p = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);

    for (int32_t r = 0; r < rows; r++) {
        if (!wild) {
            fill(row, (size_t)cols, outliers);
            kn_quant_row(KN_W_Q6_K, row, p + (size_t)r * rb, cols);
            continue;
        }
        for (size_t i = 0; i < rb; i++) {
            p[(size_t)r * rb + i] = (uint8_t)urand();
        }
        for (int32_t k = 0; k < cols / 256; k++) {
            uint8_t *b = p + (size_t)r * rb + 210 * k;
            uint16_t d =
                kn_f32_to_f16((frand() > 0 ? 1 : -1) * (0.0001f + 0.001f * fabsf(frand())));

            b[208] = (uint8_t)d;
            b[209] = (uint8_t)(d >> 8);
            if (k == 0 && r == 0) { /* the extreme scales and codes */
                memset(b + 192, 0x80, 16);
                memset(b, 0xFF, 192);
            }
        }
    }
    free(row);
    return p;
}

static kn_weight_t
q6k_view(const void *p, int32_t rows, int32_t cols)
{
    return (kn_weight_t){KN_W_Q6_K, p, kn_wtype_row_bytes(KN_W_Q6_K, cols), rows, cols};
}

START_TEST(test_repack_roundtrip)
{
    static const int32_t shapes[][2] = {{8, 256}, {24, 512}, {16, 1280}, {8, 4096}};

    for (int s = 0; s < 4; s++) {
        for (int wild = 0; wild < 2; wild++) {
            int32_t rows = shapes[s][0], cols = shapes[s][1];
            void *src = make_q6k(rows, cols, wild, 1);
            kn_weight_t w = q6k_view(src, rows, cols), r8;
            void *dst = malloc(kn_q6r8_bytes(rows, cols));
            float *a = malloc(sizeof(float) * (size_t)cols), *b = malloc(sizeof(float) * cols);

            ck_assert_uint_eq(kn_q6r8_bytes(rows, cols), (size_t)rows / 8 * (cols / 256) * 1680);
            ck_assert_int_eq(kn_q6r8_repack(&w, dst, &r8), ST_OK);
            ck_assert_int_eq(r8.type, KN_W_Q6_K_R8);
            ck_assert_int_eq(r8.rows, rows);
            ck_assert_int_eq(r8.cols, cols);
            ck_assert_str_eq(kn_wtype_name(r8.type), "q6_k_r8");
            for (int32_t r = 0; r < rows; r++) {
                kn_dequant_row(KN_W_Q6_K, (const char *)src + (size_t)r * w.row_bytes, a, cols);
                kn_weight_row(&r8, r, b);
                ck_assert_msg(memcmp(a, b, sizeof(float) * (size_t)cols) == 0,
                              "row %d of %d x %d (wild %d) dequantizes differently", r, rows, cols,
                              wild);
            }
            /* The lookup of an embedding table reads the repacked rows too. */
            int32_t tok[3] = {rows - 1, 0, 5 % rows};
            float *out = malloc(sizeof(float) * 3 * (size_t)cols);

            kn_embed_w(&r8, tok, 3, out);
            for (int i = 0; i < 3; i++) {
                kn_dequant_row(KN_W_Q6_K, (const char *)src + (size_t)tok[i] * w.row_bytes, a,
                               cols);
                ck_assert(memcmp(out + (size_t)i * cols, a, sizeof(float) * cols) == 0);
            }
            free(out);
            free(a);
            free(b);
            free(dst);
            free(src);
        }
    }
}
END_TEST

START_TEST(test_repack_refuses)
{
    void *src = make_q6k(12, 256, 0, 0);
    kn_weight_t w = q6k_view(src, 12, 256), r8 = {0};
    uint8_t dst[4 * 1680];

    ck_assert_int_eq(kn_q6r8_repack(&w, dst, &r8), ST_EINVAL); /* 12 rows */
    ck_assert_int_eq(r8.type, KN_W_F32);                       /* untouched */
    w.rows = 8;
    w.type = KN_W_Q4_K;
    ck_assert_int_eq(kn_q6r8_repack(&w, dst, &r8), ST_EINVAL);
    free(src);
}
END_TEST

/* One shape: every level x threads 1, 2 bit for bit against the
 * reference; the reference against f64 over the dequantized weights. */
static void
check_product(int32_t rows, int32_t cols, int32_t n_tok, int wild, int outliers, int mode)
{
    void *src = make_q6k(rows, cols, wild, outliers);
    kn_weight_t w = q6k_view(src, rows, cols), r8;
    void *dst = malloc(kn_q6r8_bytes(rows, cols));
    size_t ny = (size_t)n_tok * rows;
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols), *bias = malloc(sizeof(float) * rows);
    float *y0 = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *deq = malloc(sizeof(float) * (size_t)cols);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));
    const float *bp = (mode & 1) ? bias : NULL;
    int accumulate = (mode & 2) != 0;
    kn_act_t act;

    ck_assert_int_eq(kn_q6r8_repack(&w, dst, &r8), ST_OK);
    fill(x, (size_t)n_tok * cols, outliers);
    fill(bias, (size_t)rows, 0);
    fill(y0, ny, 0);
    memcpy(yr, y0, sizeof(float) * ny);
    kn_matmul_w_ref(x, n_tok, &r8, bp, yr, accumulate);

    /* The reference against f64: each code moves x by at most kd / 2 per
     * 256 columns (plus the f32 rounding of a few sums). */
    kn_act_init(&act, x, n_tok, cols, abuf);
    kn_act_quantize_q8k(&act);
    for (int32_t r = 0; r < rows; r++) {
        kn_weight_row(&r8, r, deq);
        for (int32_t t = 0; t < n_tok; t++) {
            double e = (accumulate ? y0[(size_t)t * rows + r] : 0.0) + (bp ? bias[r] : 0.0);
            double bound = 0, mag = fabs(e);

            for (int32_t k = 0; k < cols / 256; k++) {
                double sw = 0;

                for (int l = 0; l < 256; l++) {
                    double p = (double)deq[256 * k + l] * x[(size_t)t * cols + 256 * k + l];

                    e += p;
                    mag += fabs(p);
                    sw += fabs(deq[256 * k + l]);
                }
                bound += sw * act.kd[(size_t)t * (act.d_pad / 256) + k] * 0.5;
            }
            double got = yr[(size_t)t * rows + r];

            ck_assert_msg(fabs(got - e) <= 1.0001 * bound + 1e-5 * mag + 1e-6,
                          "ref vs f64 (%d x %d, tok %d, row %d): %.9g vs %.9g (bound %g)", rows,
                          cols, t, r, got, e, bound);
        }
    }
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            kn_act_init(&act, x, n_tok, cols, abuf);
            memcpy(y, y0, sizeof(float) * ny);
            kn_matmul_w(&act, &r8, bp, y, accumulate);
            for (size_t i = 0; i < ny; i++) {
                ck_assert_msg(memcmp(&y[i], &yr[i], sizeof(float)) == 0,
                              "%s nt %d (%d x %d, n_tok %d, wild %d, mode %d) at %zu: %.9g vs "
                              "ref %.9g",
                              kn_isa_name((kn_isa_t)isa), nt, rows, cols, n_tok, wild, mode, i,
                              y[i], yr[i]);
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    kn_cpu_init(0);
    free(src);
    free(dst);
    free(x);
    free(bias);
    free(y0);
    free(yr);
    free(y);
    free(deq);
    free(abuf);
}

START_TEST(test_product_levels)
{
    static const int32_t nts[] = {1, 2, 3, 5, 8, 13};
    static const int32_t shapes[][2] = {{8, 256}, {40, 512}, {16, 1280}, {72, 2048}};
    int c = 0;

    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 6; i++, c++) {
            check_product(shapes[s][0], shapes[s][1], nts[i], c % 2, (c / 2) % 2, c % 4);
        }
    }
}
END_TEST

/* Wide rows (the FFN's 8192 inputs: int32 sums near their largest), a
 * two-thread row split, and batches past a tile of 8 tokens. */
START_TEST(test_product_wide)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");
    int full = e == NULL || atof(e) >= 1.0;

    check_product(64, full ? 4096 : 1024, 1, 1, 1, 0);
    check_product(32, 1024, 40, 0, 1, 3);
    check_product(128, 2048, 9, 1, 0, 1);
}
END_TEST

/* Token rows alone against the same rows in a batch of 1 .. 24, at
 * every level and 1 / 2 threads: the same bits. */
START_TEST(test_batch_independent)
{
    enum { R = 48, C = 1024, N = 24 };
    void *src = make_q6k(R, C, 0, 1);
    kn_weight_t w = q6k_view(src, R, C), r8;
    void *dst = malloc(kn_q6r8_bytes(R, C));
    float *x = malloc(sizeof(float) * N * C), *yb = malloc(sizeof(float) * N * R);
    float *y1 = malloc(sizeof(float) * R);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(kn_q6r8_repack(&w, dst, &r8), ST_OK);
    fill(x, (size_t)N * C, 1);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            for (int32_t n = 1; n <= N; n += (n < 10 ? 1 : 7)) {
                kn_act_init(&act, x, n, C, abuf);
                kn_matmul_w(&act, &r8, NULL, yb, 0);
                for (int32_t t = 0; t < n; t++) {
                    kn_act_init(&act, x + (size_t)t * C, 1, C, abuf);
                    kn_matmul_w(&act, &r8, NULL, y1, 0);
                    ck_assert_msg(memcmp(y1, yb + (size_t)t * R, sizeof(float) * R) == 0,
                                  "%s nt %d: token %d of %d differs alone",
                                  kn_isa_name((kn_isa_t)isa), nt, t, n);
                }
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    kn_cpu_init(0);
    free(src);
    free(dst);
    free(x);
    free(yb);
    free(y1);
    free(abuf);
}
END_TEST

/* kn_matmul_w_n cuts the rows of its weights end to end into 16-row
 * shares: after a 12-row q6_K weight the repacked weight's shares start
 * at row 4 of a group. Each y[i] must equal kn_matmul_w's bits. */
START_TEST(test_split_off_group)
{
    enum { C = 2048, N = 8 };
    void *s0 = make_q6k(12, C, 0, 0), *s1 = make_q6k(64, C, 1, 0);
    kn_weight_t w0 = q6k_view(s0, 12, C), w1 = q6k_view(s1, 64, C), r8;
    void *dst = malloc(kn_q6r8_bytes(64, C));
    float *x = malloc(sizeof(float) * N * C), *ya = malloc(sizeof(float) * N * 64);
    float *yb = malloc(sizeof(float) * N * 64), *y0 = malloc(sizeof(float) * N * 12);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(kn_q6r8_repack(&w1, dst, &r8), ST_OK);
    fill(x, (size_t)N * C, 0);
    kn_cpu_init(2);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        const kn_weight_t *ws[2] = {&w0, &r8};
        float *ys[2] = {y0, yb};

        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        kn_act_init(&act, x, N, C, abuf);
        kn_matmul_w(&act, &r8, NULL, ya, 0);
        kn_act_init(&act, x, N, C, abuf);
        kn_matmul_w_n(&act, 2, ws, NULL, ys, 0);
        ck_assert_msg(memcmp(ya, yb, sizeof(float) * N * 64) == 0, "%s: split differs",
                      kn_isa_name((kn_isa_t)isa));
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    kn_cpu_init(0);
    free(s0);
    free(s1);
    free(dst);
    free(x);
    free(ya);
    free(yb);
    free(y0);
    free(abuf);
}
END_TEST

static Suite *
q6r8_suite(void)
{
    Suite *s = suite_create("kn_q6r8");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_repack_roundtrip);
    tcase_add_test(tc, test_repack_refuses);
    tcase_add_test(tc, test_product_levels);
    tcase_add_test(tc, test_product_wide);
    tcase_add_test(tc, test_batch_independent);
    tcase_add_test(tc, test_split_off_group);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(q6r8_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
