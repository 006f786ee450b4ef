/* repack_check.c - the cases every interleaved weight type shares
 * (repack_check.h), on the format rc_add_tests was given:
 *
 * - test_repack_roundtrip: the repacked size, type, shape and name, every
 *   row of the repacked form dequantizing to the bits of kn_dequant_row of
 *   the file's row, and the embedding lookup through it; quantized and
 *   wild blocks, the format's four shapes.
 * - test_repack_refuses: rows not a multiple of the group, another file
 *   type, columns not a multiple of a block, no rows; out untouched; the
 *   same weight accepted once its shape is right.
 * - test_product_levels: four shapes x n_tok 1, 2, 3, 5, 8, 13, random and
 *   wild, plain and outlier-heavy, with and without bias / accumulate.
 * - test_product_wide: the widest rows (int32 sums near their largest),
 *   40 tokens (tiles of 8 and a rest), 128 rows split over 2 threads.
 * - test_batch_independent: each token alone against the same token in a
 *   batch of 1 .. 24, every level x 1 and 2 threads, the same bits.
 * - test_split_off_group: kn_matmul_w_n after a weight of 1.5 groups, so
 *   the repacked weight's 16-row shares start inside a group, against
 *   kn_matmul_w's bits at every level.
 *
 * Every product check runs each ISA level this CPU has (kn_cpu_set_isa)
 * x 1 and 2 threads bit for bit against the scalar reference (the integer
 * sums are exact and the f32 steps the same).
 *
 * KVSERVE_TEST_SCALE < 1 (the sanitizer runs) cuts the widest rows to 1024.
 *
 * Thread: one; check forks each test from a parent that set F.
 */
#include "tests/kernels/repack_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kv_quant.h"

static uint64_t rng_state = 0x9b05688c2b3e6c1full;
static const rc_format_t *F; /* the format under test (rc_add_tests) */

uint32_t
rc_urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

float
rc_frand(void)
{
    return (float)(rc_urand() / (double)(1u << 31)) * 2.0f - 1.0f;
}

void
rc_fill(float *x, size_t n, int outliers)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = rc_frand();
        if (outliers && rc_frand() > 0.96f) {
            x[i] = (rc_frand() > 0 ? 1.0f : -1.0f) * (3.0f + 3.0f * fabsf(rc_frand()));
        } else if (outliers) {
            x[i] *= 0.1f;
        }
    }
}

void *
rc_make(kn_wtype_t t, int32_t rows, int32_t cols, int wild, int outliers,
        void (*wild_fix)(uint8_t *row, int32_t r, int32_t cols))
{
    size_t rb = kn_wtype_row_bytes(t, cols);
    uint8_t *p = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);

    for (int32_t r = 0; r < rows; r++) {
        if (!wild) {
            rc_fill(row, (size_t)cols, outliers);
            kn_quant_row(t, row, p + (size_t)r * rb, cols);
            continue;
        }
        for (size_t i = 0; i < rb; i++) {
            p[(size_t)r * rb + i] = (uint8_t)rc_urand();
        }
        wild_fix(p + (size_t)r * rb, r, cols);
    }
    free(row);
    return p;
}

START_TEST(test_repack_roundtrip)
{
    for (int s = 0; s < 4; s++) {
        for (int wild = 0; wild < 2; wild++) {
            int32_t rows = F->roundtrip[s][0], cols = F->roundtrip[s][1];
            void *src = F->make(rows, cols, wild, 1);
            kn_weight_t w = F->view(src, rows, cols), rp;
            void *dst = malloc(F->bytes(rows, cols));
            float *a = malloc(sizeof(float) * (size_t)cols), *b = malloc(sizeof(float) * cols);

            ck_assert_uint_eq(F->bytes(rows, cols),
                              (size_t)(rows / F->group) * (size_t)(cols / F->blk_cols) *
                                  F->blk_bytes);
            ck_assert_int_eq(F->repack(&w, dst, &rp), ST_OK);
            ck_assert_int_eq(rp.type, F->packed);
            ck_assert_int_eq(rp.rows, rows);
            ck_assert_int_eq(rp.cols, cols);
            ck_assert_uint_eq(rp.row_bytes, kn_wtype_row_bytes(F->packed, cols));
            ck_assert_str_eq(kn_wtype_name(rp.type), F->name);
            for (int32_t r = 0; r < rows; r++) {
                kn_dequant_row(F->file, (const char *)src + (size_t)r * w.row_bytes, a, cols);
                kn_weight_row(&rp, r, b);
                ck_assert_msg(memcmp(a, b, sizeof(float) * (size_t)cols) == 0,
                              "row %d of %d x %d (wild %d) dequantizes differently", r, rows, cols,
                              wild);
            }
            /* The lookup of an embedding table reads the repacked rows too. */
            int32_t tok[3] = {rows - 1, 0, F->embed_tok % rows};
            float *out = malloc(sizeof(float) * 3 * (size_t)cols);

            kn_embed_w(&rp, tok, 3, out);
            for (int i = 0; i < 3; i++) {
                kn_dequant_row(F->file, (const char *)src + (size_t)tok[i] * w.row_bytes, a, cols);
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
    int32_t rows = F->group * 3 / 2, cols = 2 * F->blk_cols;
    void *src = F->make(rows, cols, 0, 0);
    kn_weight_t w = F->view(src, rows, cols), rp = {0};
    void *dst = malloc(F->bytes(2 * F->group, cols));

    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_EINVAL); /* 1.5 groups */
    ck_assert_int_eq(rp.type, KN_W_F32);                  /* untouched */
    w.rows = F->group;
    w.type = F->other;
    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_EINVAL);
    w.type = F->file;
    w.cols = F->blk_cols * 3 / 2;
    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_EINVAL); /* 1.5 blocks */
    w.cols = cols;
    w.rows = 0;
    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_EINVAL);
    ck_assert_int_eq(rp.type, KN_W_F32);
    w.rows = F->group; /* the refusals were the shapes': one group passes */
    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_OK);
    ck_assert_int_eq(rp.type, F->packed);
    free(dst);
    free(src);
}
END_TEST

void
rc_check_product(const rc_format_t *f, int32_t rows, int32_t cols, int32_t n_tok, int wild,
                 int outliers, int mode)
{
    void *src = f->make(rows, cols, wild, outliers);
    kn_weight_t w = f->view(src, rows, cols), rp;
    void *dst = malloc(f->bytes(rows, cols));
    size_t ny = (size_t)n_tok * rows;
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols), *bias = malloc(sizeof(float) * rows);
    float *y0 = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *deq = malloc(sizeof(float) * (size_t)cols);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));
    const float *bp = (mode & 1) ? bias : NULL;
    int accumulate = (mode & 2) != 0;
    kn_act_t act;

    ck_assert_int_eq(f->repack(&w, dst, &rp), ST_OK);
    rc_fill(x, (size_t)n_tok * cols, outliers);
    rc_fill(bias, (size_t)rows, 0);
    rc_fill(y0, ny, 0);
    memcpy(yr, y0, sizeof(float) * ny);
    kn_matmul_w_ref(x, n_tok, &rp, bp, yr, accumulate);

    /* The reference against f64: each code moves x by at most d / 2 per
     * block of the activation form (kd per 256 columns for Q8_K, d per 32
     * for Q8_0), plus the f32 rounding of a few sums. */
    int32_t bw = f->act == RC_ACT_Q8_K ? 256 : 32;
    const float *ad;

    kn_act_init(&act, x, n_tok, cols, abuf);
    if (f->act == RC_ACT_Q8_K) {
        kn_act_quantize_q8k(&act);
        ad = act.kd;
    } else {
        kn_act_quantize_q8(&act);
        ad = act.d32;
    }
    for (int32_t r = 0; r < rows; r++) {
        kn_weight_row(&rp, r, deq);
        for (int32_t t = 0; t < n_tok; t++) {
            double e = (accumulate ? y0[(size_t)t * rows + r] : 0.0) + (bp ? bias[r] : 0.0);
            double bound = 0, mag = fabs(e);

            for (int32_t k = 0; k < cols / bw; k++) {
                double sw = 0;

                for (int32_t l = 0; l < bw; l++) {
                    double p = (double)deq[bw * k + l] * x[(size_t)t * cols + bw * k + l];

                    e += p;
                    mag += fabs(p);
                    sw += fabs(deq[bw * k + l]);
                }
                bound += sw * ad[(size_t)t * (act.d_pad / bw) + k] * 0.5;
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
    int c = 0;

    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 6; i++, c++) {
            rc_check_product(F, F->levels[s][0], F->levels[s][1], nts[i], c % 2, (c / 2) % 2,
                             c % 4);
        }
    }
}
END_TEST

START_TEST(test_product_wide)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");
    int full = e == NULL || atof(e) >= 1.0;

    rc_check_product(F, 64, full ? F->wide_cols : 1024, 1, 1, 1, 0);
    rc_check_product(F, 32, 1024, 40, 0, 1, 3);
    rc_check_product(F, 128, 2048, F->wide_tok, 1, 0, 1);
}
END_TEST

START_TEST(test_batch_independent)
{
    enum { R = 48, C = 1024, N = 24 };
    void *src = F->make(R, C, 0, 1);
    kn_weight_t w = F->view(src, R, C), rp;
    void *dst = malloc(F->bytes(R, C));
    float *x = malloc(sizeof(float) * N * C), *yb = malloc(sizeof(float) * N * R);
    float *y1 = malloc(sizeof(float) * R);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(F->repack(&w, dst, &rp), ST_OK);
    rc_fill(x, (size_t)N * C, 1);
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
 * shares: after a weight of 1.5 groups (12 rows for a group of 8, 24 for
 * 16) the repacked weight's shares start half a group in. */
START_TEST(test_split_off_group)
{
    enum { C = 2048, N = 8 };
    int32_t r0 = F->group * 3 / 2;
    void *s0 = F->make(r0, C, 0, 0), *s1 = F->make(64, C, 1, 0);
    kn_weight_t w0 = F->view(s0, r0, C), w1 = F->view(s1, 64, C), rp;
    void *dst = malloc(F->bytes(64, C));
    float *x = malloc(sizeof(float) * N * C), *ya = malloc(sizeof(float) * N * 64);
    float *yb = malloc(sizeof(float) * N * 64), *y0 = malloc(sizeof(float) * N * (size_t)r0);
    void *abuf = malloc(kn_act_bytes(N, C));
    kn_act_t act;

    ck_assert_int_eq(F->repack(&w1, dst, &rp), ST_OK);
    rc_fill(x, (size_t)N * C, 0);
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

void
rc_add_tests(TCase *tc, const rc_format_t *f)
{
    F = f;
    tcase_add_test(tc, test_repack_roundtrip);
    tcase_add_test(tc, test_repack_refuses);
    tcase_add_test(tc, test_product_levels);
    tcase_add_test(tc, test_product_wide);
    tcase_add_test(tc, test_batch_independent);
    tcase_add_test(tc, test_split_off_group);
}
