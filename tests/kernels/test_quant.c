/* test_quant.c - weights in their file format (kernels/cpu/kn_quant.h):
 * block sizes, dequantization of hand-built blocks against hand-computed
 * values (negative scales and mins, the 6-bit packed K-quant scales, q5_K
 * high bits, q6_K's split nibbles), quantize -> dequantize error bounds on
 * random and outlier-heavy data, and kn_matmul_w at every ISA level this
 * CPU has x thread counts 1 and 2 x every type x n_tok in {1, 2, 3, 4, 5,
 * 8, 17, 64} x shapes whose rows are not multiples of the 4-row tile and
 * whose columns are 256, 512 and 1280 (and 576, 96, 37 for the types
 * whose blocks divide them), against kn_matmul_w_ref and
 * against an f32 product over the dequantized weights; bias and
 * accumulate; one activation shared by every type; the embedding lookup.
 * The tiled GEMM (n_tok >= 4) at odd row counts, n_tok 33, 40, 70 against
 * the reference and every n_tok 1 .. 40 bit for bit against the GEMV
 * (batch independence); kn_matmul_w_n bit for bit against kn_matmul_w;
 * q8_0 codes over the whole int8 range (-128 included) at every level.
 *
 * KVSERVE_TEST_SCALE < 1 (the sanitizer runs) drops n_tok 17 and 64.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Uniform [-1, 1), or (outliers) a heavier-tailed mix: mostly small values
 * with about 2% of them 30 to 60 times larger. */
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

static void
put16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

START_TEST(test_sizes)
{
    static const int32_t elems[] = {1, 1, 1, 32, 32, 256, 256, 256};
    static const size_t bytes[] = {4, 2, 2, 34, 18, 144, 176, 210};
    static const char *names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};

    for (int t = 0; t < KN_W_NTYPES; t++) {
        ck_assert_int_eq(kn_wtype_block_elems((kn_wtype_t)t), elems[t]);
        ck_assert_uint_eq(kn_wtype_block_bytes((kn_wtype_t)t), bytes[t]);
        ck_assert_str_eq(kn_wtype_name((kn_wtype_t)t), names[t]);
        ck_assert_uint_eq(kn_wtype_row_bytes((kn_wtype_t)t, 512), 512 / elems[t] * bytes[t]);
    }
    ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_Q4_K, 300), 0);
    ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_Q8_0, 48), 0);
    ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_Q8_0, 96), 3 * 34);
    ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_F16, 7), 14);
    ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_NTYPES, 256), 0);
}
END_TEST

/* Hand-built blocks; expected values written from the layouts, not the code. */
START_TEST(test_dequant_hand)
{
    uint8_t b[256];
    float y[256];

    /* q8_0, d = -0.5 (f16 0xb800): value = -0.5 * q. */
    memset(b, 0, sizeof(b));
    put16(b, 0xb800);
    b[2] = (uint8_t)(int8_t)-128;
    b[3] = 127;
    b[4] = 3;
    b[33] = (uint8_t)(int8_t)-1;
    kn_dequant_row(KN_W_Q8_0, b, y, 32);
    ck_assert(y[0] == 64.0f && y[1] == -63.5f && y[2] == -1.5f && y[31] == 0.5f && y[5] == -0.0f);

    /* q4_0, d = 2: byte l holds element l (low nibble) and l + 16 (high). */
    memset(b, 0, sizeof(b));
    put16(b, 0x4000);
    b[2] = 0xF0;  /* element 0: q 0 -> -16; element 16: q 15 -> 14 */
    b[17] = 0x89; /* element 15: q 9 -> 2; element 31: q 8 -> 0 */
    kn_dequant_row(KN_W_Q4_0, b, y, 32);
    ck_assert(y[0] == -16.0f && y[16] == 14.0f && y[15] == 2.0f && y[31] == 0.0f && y[1] == -16.0f);

    /* q4_K, d = -0.25 (0xb400), dmin = -2 (0xc000): value = d * sc * q - dmin * m.
     * Sub-block 0: sc 3, m 5 in scales[0] / scales[4] (low 6 bits).
     * Sub-block 5: sc 42 = 0b10'1010: low 4 bits in scales[9] & 0xF, high 2
     * in scales[1] >> 6; m 49 = 0b11'0001: low 4 in scales[9] >> 4, high 2
     * in scales[5] >> 6. Sub-block 5 = elements 160..191: the high nibbles
     * of qs[64..95]. */
    memset(b, 0, sizeof(b));
    put16(b, 0xb400);
    put16(b + 2, 0xc000);
    b[4 + 0] = 3;
    b[4 + 4] = 5;
    b[4 + 1] = (uint8_t)(2 << 6);
    b[4 + 5] = (uint8_t)(3 << 6);
    b[4 + 9] = (uint8_t)(0xA | (1 << 4));
    b[16 + 0] = 0x07;      /* element 0: q 7; element 32: q 0 */
    b[16 + 64 + 3] = 0xB0; /* element 128 + 3: q 0 (sub 4); element 160 + 3: q 11 */
    kn_dequant_row(KN_W_Q4_K, b, y, 256);
    ck_assert(y[0] == -0.25f * 3 * 7 + 2.0f * 5);
    ck_assert(y[1] == 2.0f * 5);
    ck_assert(y[163] == -0.25f * 42 * 11 + 2.0f * 49);
    ck_assert(y[164] == 2.0f * 49);
    /* Sub-block 1: sc = scales[1] & 63 = 0 and m = scales[5] & 63 = 0. */
    ck_assert(y[32] == 0.0f);

    /* q5_K, d = 0.5, dmin = 1: as q4_K plus bit 4 of element 64g + l (+32)
     * in bit 2g (2g + 1) of qh[l]. Element 97 = g 1, second half, l 1:
     * qh[1] bit 3; element 2: qh[2] bit 0. */
    memset(b, 0, sizeof(b));
    put16(b, 0x3800);
    put16(b + 2, 0x3c00);
    b[4 + 0] = 10;         /* sub 0: sc 10 */
    b[4 + 4] = 63;         /* sub 0: m 63 */
    b[4 + 3] = 7;          /* sub 3: sc 7 */
    b[4 + 7] = 1;          /* sub 3: m 1 */
    b[16 + 2] = 0x01;      /* qh[2] bit 0 */
    b[16 + 1] = 0x08;      /* qh[1] bit 3 */
    b[48 + 2] = 0x05;      /* element 2 low nibble 5 */
    b[48 + 32 + 1] = 0x90; /* element 97: high nibble 9 */
    kn_dequant_row(KN_W_Q5_K, b, y, 256);
    ck_assert(y[2] == 0.5f * 10 * (5 + 16) - 63.0f);
    ck_assert(y[97] == 0.5f * 7 * (9 + 16) - 1.0f);
    ck_assert(y[96] == -1.0f);

    /* q6_K, d = 0.5 at offset 208, int8 scales at 192. Element 48 + 1 =
     * half 0, quadrant 1, l 17: low nibble of ql[17 + 32], bits 2..3 of
     * qh[17], scale[3]. Element 128 + 64 + 5: half 1, quadrant 2, l 5: high
     * nibble of ql[64 + 5], bits 4..5 of qh[32 + 5], scale[8 + 4]. */
    memset(b, 0, sizeof(b));
    put16(b + 208, 0x3800);
    b[192 + 3] = (uint8_t)(int8_t)-7;
    b[192 + 12] = 100;
    b[17 + 32] = 0x0C;                   /* low 12 */
    b[128 + 17] = (uint8_t)(2 << 2);     /* high 2 -> q = 12 + 32 = 44 */
    b[64 + 5] = 0x30;                    /* high nibble 3 */
    b[128 + 32 + 5] = (uint8_t)(3 << 4); /* q = 3 + 48 = 51 */
    kn_dequant_row(KN_W_Q6_K, b, y, 256);
    ck_assert(y[49] == 0.5f * -7 * (44 - 32));
    ck_assert(y[197] == 0.5f * 100 * (51 - 32));
    ck_assert(y[48] == 0.5f * -7 * (0 - 32));
    ck_assert(y[0] == 0.0f * -32);

    /* f16 / bf16 */
    put16(b, 0xc100); /* f16 -2.5 */
    put16(b + 2, 0x0001);
    kn_dequant_row(KN_W_F16, b, y, 2);
    ck_assert(y[0] == -2.5f && y[1] == 5.9604644775390625e-8f);
    put16(b, 0xc020); /* bf16 -2.5 */
    kn_dequant_row(KN_W_BF16, b, y, 1);
    ck_assert(y[0] == -2.5f);
}
END_TEST

/* Worst per-block error of quantize -> dequantize against the bound the
 * format promises for that block, and the relative RMS error. */
static void
roundtrip(kn_wtype_t t, int outliers, double *worst_ratio, double *rel_rms)
{
    enum { N = 256 * 64 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *q = malloc(kn_wtype_row_bytes(t, N));
    double se = 0, sx = 0;

    fill(x, N, outliers);
    kn_quant_row(t, x, q, N);
    kn_dequant_row(t, q, y, N);
    *worst_ratio = 0;
    for (int b = 0; b < N / 256; b++) {
        const float *xb = x + 256 * b, *yb = y + 256 * b;

        for (int g = 0; g < 256; g += 32) {
            double amax = 0, mn = 0, mx = 0, sb_amax = 0, sb_min = 0, sb_max = 0;

            for (int i = 0; i < 256; i++) {
                sb_amax = fmax(sb_amax, fabs(xb[i]));
                sb_min = fmin(sb_min, xb[i]);
                sb_max = fmax(sb_max, xb[i]);
            }
            for (int i = g; i < g + 32; i++) {
                amax = fmax(amax, fabs(xb[i]));
                mn = fmin(mn, xb[i]);
                mx = fmax(mx, xb[i]);
            }
            /* Bounds (per element):
             *   q8_0  half a step of absmax / 127, plus the f16 scale's
             *         rounding (2^-11 relative, times |q| <= 127): 0.6 step
             *   q4_0  the absmax element maps to -8 exactly; the opposite
             *         sign clamps at +7, one step of absmax / 8 at most
             *   q6_K  one step of the super-block's largest scale (absmax / 32):
             *         an 8-bit group scale may round small groups' scales down
             *   q4_K / q5_K  a sub-block whose scale rounds to 0 among the
             *         super-block's 6-bit scales keeps only its min: bounded
             *         by a quarter of the super-block's range
             *   f16 / bf16  2^-11 / 2^-8 relative (and f16 subnormals) */
            double bound;

            switch (t) {
            case KN_W_Q8_0:
                bound = 0.6 * amax / 127;
                break;
            case KN_W_Q4_0:
                bound = 1.01 * amax / 8;
                break;
            case KN_W_Q6_K:
                bound = sb_amax / 32;
                break;
            case KN_W_Q4_K:
            case KN_W_Q5_K:
                bound = (sb_max - sb_min) / 4;
                break;
            case KN_W_F16:
                bound = amax / 1024 + 1e-7;
                break;
            case KN_W_BF16:
                bound = amax / 128;
                break;
            default:
                bound = 1e-30;
            }
            (void)mn;
            (void)mx;
            for (int i = g; i < g + 32; i++) {
                double e = fabs((double)xb[i] - yb[i]);

                *worst_ratio = fmax(*worst_ratio, e / bound);
                se += e * e;
                sx += (double)xb[i] * xb[i];
            }
        }
    }
    *rel_rms = sqrt(se / sx);
    free(x);
    free(y);
    free(q);
}

START_TEST(test_roundtrip)
{
    /* Relative RMS limits on uniform data: 1.3 x the ideal uniform-grid
     * error (step / sqrt(12) over the data's RMS 1 / sqrt(3)): q8_0 step
     * 2/254, q4_0 2/16 (one side clamps), q4_K 2/15, q5_K 2/31, q6_K
     * 2/64 (-32..31 over absmax); f16 / bf16 half-ulp relative. Outlier
     * data: only the per-block bounds (its RMS is dominated by outliers). */
    static const double rms_max[KN_W_NTYPES] = {
        0,
        1.3 * 2.0 / 2048 / 1.7,
        1.3 * 2.0 / 256 / 1.7,
        1.3 * 0.00787 * 1.0,
        1.3 * 0.0625 * 1.0,
        1.3 * 0.0667,
        1.3 * 0.0323,
        1.3 * 0.0156,
    };

    for (int t = KN_W_F16; t < KN_W_NTYPES; t++) {
        for (int outl = 0; outl <= 1; outl++) {
            double ratio, rel;

            roundtrip((kn_wtype_t)t, outl, &ratio, &rel);
            ck_assert_msg(ratio <= 1.0, "%s outliers %d: error %.3g x the bound",
                          kn_wtype_name((kn_wtype_t)t), outl, ratio);
            if (!outl) {
                ck_assert_msg(rel <= rms_max[t], "%s: relative RMS %.4g > %.4g",
                              kn_wtype_name((kn_wtype_t)t), rel, rms_max[t]);
            }
        }
    }
}
END_TEST

/* A weight of type t quantized from random data: w->data is malloc'd. */
static kn_weight_t
make_weight(kn_wtype_t t, int32_t rows, int32_t cols, int outliers, float *deq)
{
    kn_weight_t w = {t, NULL, kn_wtype_row_bytes(t, cols), rows, cols};
    float *src = malloc(sizeof(float) * (size_t)rows * cols);
    uint8_t *data = malloc(w.row_bytes * (size_t)rows);

    fill(src, (size_t)rows * cols, outliers);
    for (int32_t r = 0; r < rows; r++) {
        kn_quant_row(t, src + (size_t)r * cols, data + w.row_bytes * r, cols);
        kn_dequant_row(t, data + w.row_bytes * r, deq + (size_t)r * cols, cols);
    }
    w.data = data;
    free(src);
    return w;
}

/* One shape x n_tok: every type, every ISA level and thread count 1, 2. */
static void
check_matmul_case(int32_t rows, int32_t cols, int32_t n_tok, int outliers, int mode)
{
    size_t ny = (size_t)n_tok * rows;
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols);
    float *deq = malloc(sizeof(float) * (size_t)rows * cols);
    float *bias = malloc(sizeof(float) * rows), *y0 = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    float *yf = malloc(sizeof(float) * ny);
    double *tol_ref = malloc(sizeof(double) * ny), *tol_f32 = malloc(sizeof(double) * ny);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));
    kn_act_t act;
    const float *bp = mode >= 1 ? bias : NULL;
    int accumulate = mode == 2;

    float *xam = malloc(sizeof(float) * (size_t)n_tok * cols);

    fill(x, (size_t)n_tok * cols, outliers);
    for (int32_t tk = 0; tk < n_tok; tk++) { /* each 32-block's absmax */
        const float *xt = x + (size_t)tk * cols;

        for (int32_t i = 0; i < cols; i += 32) {
            int32_t e = i + 32 < cols ? i + 32 : cols;
            float m = 0;

            for (int32_t l = i; l < e; l++) {
                m = fmaxf(m, fabsf(xt[l]));
            }
            for (int32_t l = i; l < e; l++) {
                xam[(size_t)tk * cols + l] = m;
            }
        }
    }
    fill(bias, (size_t)rows, 0);
    fill(y0, ny, 0);
    /* One activation for all types: its 8-bit and bf16 forms are made on
     * first use and shared. */
    kn_act_init(&act, x, n_tok, cols, abuf);
    for (int t = 0; t < KN_W_NTYPES; t++) {
        if (cols % kn_wtype_block_elems((kn_wtype_t)t) != 0) {
            continue; /* K-quants need a multiple of 256 */
        }
        kn_weight_t w = make_weight((kn_wtype_t)t, rows, cols, 0, deq);

        memcpy(yr, y0, sizeof(float) * ny);
        kn_matmul_w_ref(x, n_tok, &w, bp, yr, accumulate);
        memcpy(yf, y0, sizeof(float) * ny);
        kn_cpu_matmul_ref(x, deq, bp, yf, n_tok, cols, rows, accumulate);
        for (int32_t tk = 0; tk < n_tok; tk++) {
            for (int32_t o = 0; o < rows; o++) {
                double s = 0, sq = 0;

                for (int32_t i = 0; i < cols; i++) {
                    double wv = fabs(deq[(size_t)o * cols + i]);
                    double xv = x[(size_t)tk * cols + i], amax = xam[(size_t)tk * cols + i];
                    s += wv * fabs(xv);
                    sq += wv * amax / 254.0;
                }
                double base =
                    fabs(y0[(size_t)tk * rows + o]) * accumulate + (bp != NULL ? fabs(bias[o]) : 0);
                size_t k = (size_t)tk * rows + o;

                /* vs the reference: both take exact integer dots and the same
                 * f32 scale products; the fast path sums them in f32 in
                 * another order: at most ~30 roundings of 2^-24 (20 products
                 * per lane at 1280 columns, a 16-lane tree, slice partials,
                 * the base) on sums bounded by the terms' magnitudes. Those
                 * exceed |w x| where the SIMD decoders split a value into a
                 * code and an offset (q8_0 q + 128, q4_0 q - 8, q6_K q - 32,
                 * the K-quant mins; kn_quant_body.inc): by about 2 to 4x on
                 * these weights, 10x allowed: 30 * 6e-8 * 10 = 2e-5, and
                 * 1e-4 leaves 5x margin. A wrong block scale or code is off
                 * by a whole term, far above this. */
                tol_ref[k] = 1e-4 * (s + base) + 1e-6;
                /* vs f32 over the dequantized weights: the activation's
                 * 8-bit rounding moves each x by at most half its block's
                 * step (absmax / 254), so |dy| <= sum |w| absmax / 254;
                 * f16 / bf16 / f32 read x as is (a bf16 rounding of x, up to
                 * 2^-9 relative, would fail here; the AVX512-BF16 level's
                 * two-term bh + bl is within 2^-18). Plus the f32 summation
                 * allowance above. */
                double act_err = t >= KN_W_Q8_0 ? sq : 0;

                tol_f32[k] = 1.001 * act_err + 1e-4 * (s + base) + 1e-6;
            }
        }
        for (int32_t i = 0; i < (int32_t)ny; i++) {
            ck_assert_msg(fabs((double)yr[i] - yf[i]) <= tol_f32[i],
                          "%s ref vs f32 (%d x %d, n_tok %d) at %d: %g vs %g (tol %g)",
                          kn_wtype_name((kn_wtype_t)t), rows, cols, n_tok, i, yr[i], yf[i],
                          tol_f32[i]);
        }
        kn_cpu_init(0);
        for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            for (int nt = 1; nt <= 2; nt++) {
                kn_cpu_init(nt);
                memcpy(y, y0, sizeof(float) * ny);
                kn_matmul_w(&act, &w, bp, y, accumulate);
                for (size_t i = 0; i < ny; i++) {
                    ck_assert_msg(fabs((double)y[i] - yr[i]) <= tol_ref[i],
                                  "%s %s nt %d (%d x %d, n_tok %d, mode %d) at %zu: %.9g vs "
                                  "ref %.9g (tol %g)",
                                  kn_wtype_name((kn_wtype_t)t), kn_isa_name((kn_isa_t)isa), nt,
                                  rows, cols, n_tok, mode, i, y[i], yr[i], tol_ref[i]);
                    ck_assert_msg(fabs((double)y[i] - yf[i]) <= tol_f32[i],
                                  "%s %s vs f32 at %zu: %g vs %g", kn_wtype_name((kn_wtype_t)t),
                                  kn_isa_name((kn_isa_t)isa), i, y[i], yf[i]);
                }
            }
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
        free((void *)w.data);
    }
    free(x);
    free(xam);
    free(deq);
    free(bias);
    free(y0);
    free(y);
    free(yr);
    free(yf);
    free(tol_ref);
    free(tol_f32);
    free(abuf);
}

static const int32_t n_toks[] = {1, 2, 3, 4, 5, 8, 17, 64};
static const int32_t shapes[][2] = {{13, 256}, {38, 512}, {22, 1280}};

START_TEST(test_matmul_matrix)
{
    int n_nt = scale_env() < 1.0 ? 6 : 8, c = 0;

    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < n_nt; i++, c++) {
            check_matmul_case(shapes[s][0], shapes[s][1], n_toks[i], c % 2, c % 3);
        }
    }
}
END_TEST

/* Large enough to run on two threads (>= 2^19 multiply-adds): the row
 * split of a decode-shaped GEMV and of a batch. */
/* Rows of q8_0 / q4_0 / f16 / bf16 that end inside a 256-column slice
 * (SmolLM's 576, a 96) and a 16-bit row of an odd length. */
START_TEST(test_matmul_partial_slices)
{
    static const int32_t nts[] = {1, 3, 8};

    for (int i = 0; i < 3; i++) {
        check_matmul_case(9, 576, nts[i], i % 2, i);
        check_matmul_case(6, 96, nts[i], 1, 2 - i);
        check_matmul_case(7, 37, nts[i], 0, 1);
    }
}
END_TEST

START_TEST(test_matmul_threads)
{
    check_matmul_case(300, 2048, 1, 0, 1);
    check_matmul_case(70, 1024, 8, 1, 2);
}
END_TEST

/* A token's row of y is bit for bit the same whether it is computed
 * alone or in a batch (every type but F32, every ISA level, 1 and 2
 * threads): kvserve's logits for a sequence must not depend on what it
 * is batched with (the model-types test holds batched against alone to
 * far less than one 8-bit activation step, which a rounding difference
 * anywhere upstream of an activation quantizer can flip). */
static void
check_batch_independent(int32_t rows, int32_t cols, int32_t n_tok)
{
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols);
    float *deq = malloc(sizeof(float) * (size_t)rows * cols);
    float *bias = malloc(sizeof(float) * rows), *yb = malloc(sizeof(float) * n_tok * rows);
    float *y1 = malloc(sizeof(float) * rows);
    void *abuf = malloc(kn_act_bytes(n_tok, cols));

    fill(x, (size_t)n_tok * cols, 1);
    fill(bias, (size_t)rows, 0);
    for (int t = KN_W_F16; t < KN_W_NTYPES; t++) {
        if (cols % kn_wtype_block_elems((kn_wtype_t)t) != 0) {
            continue;
        }
        kn_weight_t w = make_weight((kn_wtype_t)t, rows, cols, 0, deq);

        for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            for (int nt = 1; nt <= 2; nt++) {
                kn_act_t act;

                kn_cpu_init(nt);
                kn_act_init(&act, x, n_tok, cols, abuf);
                kn_matmul_w(&act, &w, bias, yb, 0);
                for (int32_t tk = 0; tk < n_tok; tk++) {
                    kn_act_init(&act, x + (size_t)tk * cols, 1, cols, abuf);
                    kn_matmul_w(&act, &w, bias, y1, 0);
                    ck_assert_msg(memcmp(y1, yb + (size_t)tk * rows, sizeof(float) * rows) == 0,
                                  "%s %s nt %d (%d x %d): token %d of %d differs alone",
                                  kn_wtype_name((kn_wtype_t)t), kn_isa_name((kn_isa_t)isa), nt,
                                  rows, cols, tk, n_tok);
                }
            }
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
        free((void *)w.data);
    }
    free(x);
    free(deq);
    free(bias);
    free(yb);
    free(y1);
    free(abuf);
}

START_TEST(test_matmul_batch_independent)
{
    check_batch_independent(40, 1280, 11);
    check_batch_independent(9, 576, 6);
    check_batch_independent(300, 2048, 5); /* large enough for two threads */
}
END_TEST

/* The tiled GEMM (n_tok >= 4 on the SIMD levels) against the reference
 * and against the GEMV: odd row counts (a last pass of one row after
 * two-row passes), every batch size 1 .. 40 across the GEMV / GEMM switch,
 * and 70 tokens (a second 64-token tile). */
START_TEST(test_matmul_gemm_tiles)
{
    int full = scale_env() >= 1.0;

    check_matmul_case(13, 512, 40, 1, 0);
    check_matmul_case(7, 576, 33, 0, 1);
    if (full) {
        check_matmul_case(5, 1280, 70, 1, 2);
    }
    for (int32_t n = 1; n <= (full ? 40 : 12); n++) {
        check_batch_independent(5, 512, n);
    }
    check_batch_independent(3, 576, 70);
    check_batch_independent(130, 2048, 40); /* two threads, 16-row shares */
}
END_TEST

/* kn_matmul_w_n (one region for weights sharing an input) gives each
 * output bit for bit what kn_matmul_w gives it alone: mixed types and
 * row counts, biases present and absent, accumulate, 1 and 2 threads,
 * every ISA level. */
START_TEST(test_matmul_fused)
{
    enum { COLS = 1024, NW = 4 };
    static const kn_wtype_t types[NW] = {KN_W_Q4_K, KN_W_Q6_K, KN_W_Q8_0, KN_W_BF16};
    static const int32_t rows[NW] = {300, 48, 130, 17};
    static const int32_t n_toks[] = {1, 3, 9};
    float *deq = malloc(sizeof(float) * 300 * COLS), *x = malloc(sizeof(float) * 9 * COLS);
    void *abuf = malloc(kn_act_bytes(9, COLS));
    kn_weight_t w[NW];
    float *bias[NW], *y[NW], *y1[NW];

    fill(x, (size_t)9 * COLS, 1);
    for (int i = 0; i < NW; i++) {
        w[i] = make_weight(types[i], rows[i], COLS, i % 2, deq);
        bias[i] = i == 1 ? NULL : malloc(sizeof(float) * (size_t)rows[i]);
        if (bias[i] != NULL) {
            fill(bias[i], (size_t)rows[i], 0);
        }
        y[i] = malloc(sizeof(float) * 9 * (size_t)rows[i]);
        y1[i] = malloc(sizeof(float) * 9 * (size_t)rows[i]);
    }
    for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
        ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
        for (int nt = 1; nt <= 2; nt++) {
            kn_cpu_init(nt);
            for (int ti = 0; ti < 3; ti++) {
                for (int accumulate = 0; accumulate <= 1; accumulate++) {
                    int32_t n_tok = n_toks[ti];
                    const kn_weight_t *ws[NW] = {&w[0], &w[1], &w[2], &w[3]};
                    kn_act_t act;

                    for (int i = 0; i < NW; i++) {
                        fill(y[i], (size_t)n_tok * rows[i], 0);
                        memcpy(y1[i], y[i], sizeof(float) * (size_t)n_tok * rows[i]);
                    }
                    kn_act_init(&act, x, n_tok, COLS, abuf);
                    kn_matmul_w_n(&act, NW, ws, (const float *const *)bias, y, accumulate);
                    for (int i = 0; i < NW; i++) {
                        kn_act_init(&act, x, n_tok, COLS, abuf);
                        kn_matmul_w(&act, &w[i], bias[i], y1[i], accumulate);
                        ck_assert_msg(memcmp(y[i], y1[i],
                                             sizeof(float) * (size_t)n_tok * rows[i]) == 0,
                                      "%s %s nt %d n_tok %d acc %d: fused differs",
                                      kn_wtype_name(types[i]), kn_isa_name((kn_isa_t)isa), nt,
                                      n_tok, accumulate);
                    }
                }
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    for (int i = 0; i < NW; i++) {
        free((void *)w[i].data);
        free(bias[i]);
        free(y[i]);
        free(y1[i]);
    }
    free(deq);
    free(x);
    free(abuf);
}
END_TEST

/* q8_0 codes over the whole int8 range, -128 included (ggml's quantizer
 * never writes it; a file may), against activations whose codes sit at
 * +-127: the VNNI kernels read each code as the unsigned q + 128 and
 * subtract 128 * sum(xq) per block, the others split q into |q| and its
 * sign. Every ISA level, 1 and 2 threads, the GEMV and the tiled GEMM,
 * against the reference and bit for bit against each token alone. */
START_TEST(test_q8_0_extreme_codes)
{
    enum { ROWS = 37, COLS = 512, NT = 9 };
    static const int32_t n_toks[] = {1, 2, 5, NT};
    size_t rb = kn_wtype_row_bytes(KN_W_Q8_0, COLS);
    uint8_t *data = malloc(rb * ROWS);
    float *deq = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * NT * COLS);
    float *y = malloc(sizeof(float) * NT * ROWS), *yr = malloc(sizeof(float) * NT * ROWS);
    float *y1 = malloc(sizeof(float) * ROWS);
    double *tol = malloc(sizeof(double) * NT * ROWS);
    void *abuf = malloc(kn_act_bytes(NT, COLS));
    kn_weight_t w = {KN_W_Q8_0, data, rb, ROWS, COLS};

    for (size_t b = 0; b < rb * ROWS / 34; b++) {
        uint8_t *blk = data + 34 * b;

        put16(blk, (uint16_t)(0x2000 + (b * 977) % 0x1800)); /* f16 2^-7 .. ~2^-1 */
        for (int l = 0; l < 32; l++) {
            float u = frand();

            /* a third -128, a third 127, the rest anything */
            blk[2 + l] = u < -0.33f ? 0x80 : u > 0.33f ? 0x7f : (uint8_t)(frand() * 128.0f);
        }
    }
    for (int32_t r = 0; r < ROWS; r++) {
        kn_dequant_row(KN_W_Q8_0, data + rb * r, deq + (size_t)r * COLS, COLS);
    }
    for (size_t i = 0; i < (size_t)NT * COLS; i++) { /* +-1: every code +-127 */
        x[i] = frand() > 0.2f ? -1.0f : 1.0f;
    }
    for (int ti = 0; ti < 4; ti++) {
        int32_t n_tok = n_toks[ti];
        kn_act_t act;

        kn_matmul_w_ref(x, n_tok, &w, NULL, yr, 0);
        for (int32_t tk = 0; tk < n_tok; tk++) {
            for (int32_t o = 0; o < ROWS; o++) {
                double s = 0;

                for (int32_t i = 0; i < COLS; i++) {
                    s += fabs(deq[(size_t)o * COLS + i]);
                }
                tol[(size_t)tk * ROWS + o] = 1e-5 * s + 1e-6; /* |x| = 1: f32 sums of s */
            }
        }
        for (int isa = 0; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            for (int nt = 1; nt <= 2; nt++) {
                kn_cpu_init(nt);
                kn_act_init(&act, x, n_tok, COLS, abuf);
                kn_matmul_w(&act, &w, NULL, y, 0);
                for (int32_t i = 0; i < n_tok * ROWS; i++) {
                    ck_assert_msg(fabs((double)y[i] - yr[i]) <= tol[i],
                                  "%s nt %d n_tok %d at %d: %.9g vs ref %.9g",
                                  kn_isa_name((kn_isa_t)isa), nt, n_tok, i, y[i], yr[i]);
                }
                for (int32_t tk = 0; tk < n_tok; tk++) {
                    kn_act_init(&act, x + (size_t)tk * COLS, 1, COLS, abuf);
                    kn_matmul_w(&act, &w, NULL, y1, 0);
                    ck_assert_msg(memcmp(y1, y + (size_t)tk * ROWS, sizeof(float) * ROWS) == 0,
                                  "%s nt %d n_tok %d: token %d differs alone",
                                  kn_isa_name((kn_isa_t)isa), nt, n_tok, tk);
                }
            }
        }
    }
    kn_cpu_set_isa(kn_cpu_isa_best());
    free(data);
    free(deq);
    free(x);
    free(y);
    free(yr);
    free(y1);
    free(tol);
    free(abuf);
}
END_TEST

START_TEST(test_embed)
{
    enum { V = 10, D = 512 };
    float deq[V * D], out[3 * D];
    int32_t tok[3] = {7, 0, 7};

    for (int t = 0; t < KN_W_NTYPES; t++) {
        kn_weight_t w = make_weight((kn_wtype_t)t, V, D, 1, deq);

        kn_embed_w(&w, tok, 3, out);
        for (int i = 0; i < 3; i++) {
            ck_assert(memcmp(out + i * D, deq + tok[i] * D, sizeof(float) * D) == 0);
        }
        free((void *)w.data);
    }
}
END_TEST

static Suite *
quant_suite(void)
{
    Suite *s = suite_create("kn_quant");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_dequant_hand);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_matmul_matrix);
    tcase_add_test(tc, test_matmul_partial_slices);
    tcase_add_test(tc, test_matmul_threads);
    tcase_add_test(tc, test_matmul_batch_independent);
    tcase_add_test(tc, test_matmul_gemm_tiles);
    tcase_add_test(tc, test_matmul_fused);
    tcase_add_test(tc, test_q8_0_extreme_codes);
    tcase_add_test(tc, test_embed);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(quant_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
