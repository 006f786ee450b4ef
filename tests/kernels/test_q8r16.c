/* test_q8r16.c - q8_0 weights repacked 16 rows at a time (KN_W_Q8_0_R16,
 * kernels/cpu/kn_quant.h): the repack round trip (every row of the
 * repacked form dequantizes to the bits of kn_dequant_row of the file's
 * row), the shapes it refuses, the embedding lookup through it, and the
 * product at every ISA level this CPU has x 1 and 2 threads, bit for bit
 * against the scalar reference (the integer sums are exact and the f32
 * steps the same), on random, outlier-heavy and wild weights (every code,
 * -128 included) and activations, rows 16 .. 128, cols 32 .. 8192 (odd
 * multiples of 32 too), n_tok 1 .. 40 (every tile width), bias and
 * accumulate; the reference within the Q8_0 rounding bound of an f64
 * product over the dequantized weights; a token alone against the same
 * token in a batch; a row split that does not fall on a group of 16
 * (kn_matmul_w_n after a 24-row weight) against kn_matmul_w.
 *
 * KVSERVE_TEST_SCALE < 1 (the sanitizer runs) drops the 8192 columns.
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

/* A q8_0 matrix: ggml's quantizer over random data, or (wild) random
 * code bytes (-128 included) with sane f16 scales. */
static void *
make_q8(int32_t rows, int32_t cols, int wild, int outliers)
{
    size_t rb = kn_wtype_row_bytes(KN_W_Q8_0, cols);
    uint8_t *p = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);

    for (int32_t r = 0; r < rows; r++) {
        if (!wild) {
            fill(row, (size_t)cols, outliers);
            kn_quant_row(KN_W_Q8_0, row, p + (size_t)r * rb, cols);
            continue;
        }
        for (size_t i = 0; i < rb; i++) {
            p[(size_t)r * rb + i] = (uint8_t)urand();
        }
        for (int32_t b = 0; b < cols / 32; b++) {
            uint8_t *q = p + (size_t)r * rb + 34 * b;
            uint16_t d = kn_f32_to_f16(0.001f + 0.01f * fabsf(frand()));

            q[0] = (uint8_t)d;
            q[1] = (uint8_t)(d >> 8);
            if (b % 5 == 0) {
                q[2 + urand() % 32] = 0x80; /* -128: |q| = 128 in the sign path */
            }
        }
    }
    free(row);
    return p;
}

static kn_weight_t
q8_view(const void *p, int32_t rows, int32_t cols)
{
    return (kn_weight_t){KN_W_Q8_0, p, kn_wtype_row_bytes(KN_W_Q8_0, cols), rows, cols};
}

START_TEST(test_repack_roundtrip)
{
    static const int32_t shapes[][2] = {{16, 32}, {48, 576}, {16, 1312}, {32, 4096}};

    for (int s = 0; s < 4; s++) {
        for (int wild = 0; wild < 2; wild++) {
            int32_t rows = shapes[s][0], cols = shapes[s][1];
            void *src = make_q8(rows, cols, wild, 1);
            kn_weight_t w = q8_view(src, rows, cols), rp;
            void *dst = malloc(kn_q8r16_bytes(rows, cols));
            float *a = malloc(sizeof(float) * (size_t)cols), *b = malloc(sizeof(float) * cols);

            ck_assert_uint_eq(kn_q8r16_bytes(rows, cols), (size_t)rows * cols / 32 * 34);
            ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_OK);
            ck_assert_int_eq(rp.type, KN_W_Q8_0_R16);
            ck_assert_int_eq(rp.rows, rows);
            ck_assert_int_eq(rp.cols, cols);
            ck_assert_uint_eq(rp.row_bytes, w.row_bytes);
            ck_assert_str_eq(kn_wtype_name(rp.type), "q8_0_r16");
            for (int32_t r = 0; r < rows; r++) {
                kn_dequant_row(KN_W_Q8_0, (const char *)src + (size_t)r * w.row_bytes, a, cols);
                kn_weight_row(&rp, r, b);
                ck_assert_msg(memcmp(a, b, sizeof(float) * (size_t)cols) == 0,
                              "row %d of %d x %d (wild %d) dequantizes differently", r, rows, cols,
                              wild);
            }
            /* The lookup of an embedding table reads the repacked rows too. */
            int32_t tok[3] = {rows - 1, 0, 17 % rows};
            float *out = malloc(sizeof(float) * 3 * (size_t)cols);

            kn_embed_w(&rp, tok, 3, out);
            for (int i = 0; i < 3; i++) {
                kn_dequant_row(KN_W_Q8_0, (const char *)src + (size_t)tok[i] * w.row_bytes, a,
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
    void *src = make_q8(24, 64, 0, 0);
    kn_weight_t w = q8_view(src, 24, 64), rp = {0};
    uint8_t dst[4 * 544];

    ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_EINVAL); /* 24 rows */
    ck_assert_int_eq(rp.type, KN_W_F32);
    w.rows = 16;
    w.type = KN_W_Q4_0;
    ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_EINVAL);
    w.type = KN_W_Q8_0;
    w.cols = 48;
    ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_EINVAL); /* 48 columns */
    free(src);
}
END_TEST

/* One shape: every level x threads 1, 2 bit for bit against the
 * reference; the reference against f64 over the dequantized weights. */
static void
check_product(int32_t rows, int32_t cols, int32_t n_tok, int wild, int outliers, int mode)
{
    void *src = make_q8(rows, cols, wild, outliers);
    kn_weight_t w = q8_view(src, rows, cols), rp;
    void *dst = malloc(kn_q8r16_bytes(rows, cols));
    size_t ny = (size_t)n_tok * rows;
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols), *bias = malloc(sizeof(float) * rows);
    float *y0 = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *deq = malloc(sizeof(float) * (size_t)cols);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));
    const float *bp = (mode & 1) ? bias : NULL;
    int accumulate = (mode & 2) != 0;
    kn_act_t act;

    ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_OK);
    fill(x, (size_t)n_tok * cols, outliers);
    fill(bias, (size_t)rows, 0);
    fill(y0, ny, 0);
    memcpy(yr, y0, sizeof(float) * ny);
    kn_matmul_w_ref(x, n_tok, &rp, bp, yr, accumulate);

    /* The reference against f64: each code moves x by at most d / 2 per
     * block of 32 (plus the f32 rounding of the sums). */
    kn_act_init(&act, x, n_tok, cols, abuf);
    kn_act_quantize_q8(&act);
    for (int32_t r = 0; r < rows; r++) {
        kn_weight_row(&rp, r, deq);
        for (int32_t t = 0; t < n_tok; t++) {
            double e = (accumulate ? y0[(size_t)t * rows + r] : 0.0) + (bp ? bias[r] : 0.0);
            double bound = 0, mag = fabs(e);

            for (int32_t b = 0; b < cols / 32; b++) {
                double sw = 0;

                for (int l = 0; l < 32; l++) {
                    double p = (double)deq[32 * b + l] * x[(size_t)t * cols + 32 * b + l];

                    e += p;
                    mag += fabs(p);
                    sw += fabs(deq[32 * b + l]);
                }
                bound += sw * act.d32[(size_t)t * (act.d_pad / 32) + b] * 0.5;
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
            kn_matmul_w(&act, &rp, bp, y, accumulate);
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
    static const int32_t shapes[][2] = {{16, 32}, {48, 224}, {16, 576}, {80, 2080}};
    int c = 0;

    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 6; i++, c++) {
            check_product(shapes[s][0], shapes[s][1], nts[i], c % 2, (c / 2) % 2, c % 4);
        }
    }
}
END_TEST

/* Wide rows (the FFN's 8192 inputs), a two-thread row split, batches past
 * a tile of 8 tokens, every tile width 1 .. 8 after whole tiles. */
START_TEST(test_product_wide)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");
    int full = e == NULL || atof(e) >= 1.0;

    check_product(64, full ? 8192 : 1024, 1, 1, 1, 0);
    check_product(32, 1024, 40, 0, 1, 3);
    for (int32_t n = 9; n <= 16; n++) {
        check_product(48, 96, n, (int)n % 2, 1, (int)n % 4);
    }
    check_product(128, 2048, 7, 1, 0, 1);
}
END_TEST

/* Token rows alone against the same rows in a batch of 1 .. 24, at
 * every level and 1 / 2 threads: the same bits. */
START_TEST(test_batch_independent)
{
    enum { R = 48, C = 1024, N = 24 };
    void *src = make_q8(R, C, 0, 1);
    kn_weight_t w = q8_view(src, R, C), rp;
    void *dst = malloc(kn_q8r16_bytes(R, C));
    float *x = malloc(sizeof(float) * N * C), *yb = malloc(sizeof(float) * N * R);
    float *y1 = malloc(sizeof(float) * R);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(kn_q8r16_repack(&w, dst, &rp), ST_OK);
    fill(x, (size_t)N * C, 1);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            for (int32_t n = 1; n <= N; n += (n < 10 ? 1 : 7)) {
                kn_act_init(&act, x, n, C, abuf);
                kn_matmul_w(&act, &rp, NULL, yb, 0);
                for (int32_t t = 0; t < n; t++) {
                    kn_act_init(&act, x + (size_t)t * C, 1, C, abuf);
                    kn_matmul_w(&act, &rp, NULL, y1, 0);
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
 * shares: after a 24-row q8_0 weight the repacked weight's shares start
 * at row 8 of a group. Each y[i] must equal kn_matmul_w's bits. */
START_TEST(test_split_off_group)
{
    enum { C = 2048, N = 8 };
    void *s0 = make_q8(24, C, 0, 0), *s1 = make_q8(64, C, 1, 0);
    kn_weight_t w0 = q8_view(s0, 24, C), w1 = q8_view(s1, 64, C), rp;
    void *dst = malloc(kn_q8r16_bytes(64, C));
    float *x = malloc(sizeof(float) * N * C), *ya = malloc(sizeof(float) * N * 64);
    float *yb = malloc(sizeof(float) * N * 64), *y0 = malloc(sizeof(float) * N * 24);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(kn_q8r16_repack(&w1, dst, &rp), ST_OK);
    fill(x, (size_t)N * C, 0);
    kn_cpu_init(2);
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        const kn_weight_t *ws[2] = {&w0, &rp};
        float *ys[2] = {y0, yb};

        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        kn_act_init(&act, x, N, C, abuf);
        kn_matmul_w(&act, &rp, NULL, ya, 0);
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
q8r16_suite(void)
{
    Suite *s = suite_create("kn_q8r16");
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
    SRunner *sr = srunner_create(q8r16_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
