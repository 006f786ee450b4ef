/* test_kv_quant.c - the compressed KV store (kernels/cpu/kv_quant.h):
 * element codecs, per-format quantize/dequantize error bounds on random
 * and outlier-heavy blocks, attention over compressed blocks against the
 * reference attention over their dequantized f32 copy (every dtype x
 * head_dim x block size x GQA group, random and outlier-heavy, every
 * fp8 code, shifted blocks) at every ISA level this CPU has (forced
 * through kn_cpu_set_isa), block ops (copy,
 * swap) bit for bit with their residuals, residual slot life, and the
 * shapes each format rejects.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kv_quant.h"

static const kn_kvq_fmt_t all_fmts[] = {KN_KVQ_F32, KN_KVQ_F16, KN_KVQ_BF16,
                                        KN_KVQ_FP8, KN_KVQ_INT8, KN_KVQ_INT4};
#define N_FMTS 6

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static kn_kvq_layout_t
layout(kn_kvq_fmt_t fmt, int32_t nkv, int32_t bs, int32_t hd)
{
    kn_kvq_layout_t L;
    char err[128];

    ck_assert_int_eq(kn_kvq_layout_init(&L, fmt, nkv, bs, hd, err, sizeof(err)), ST_OK);
    return L;
}

START_TEST(test_codecs)
{
    /* f16: exact values, rounding to nearest even, subnormals, saturation. */
    ck_assert_uint_eq(kn_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(kn_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(kn_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(kn_f32_to_f16(1e6f), 0x7c00);
    ck_assert_uint_eq(kn_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00); /* tie -> even */
    ck_assert_uint_eq(kn_f32_to_f16(5.9604644775390625e-8f), 0x0001);
    ck_assert(kn_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    for (int i = 0; i < 0x7c00; i++) { /* every finite positive half round-trips */
        ck_assert_uint_eq(kn_f32_to_f16(kn_f16_to_f32((uint16_t)i)), (unsigned)i);
    }
    /* bf16 */
    ck_assert_uint_eq(kn_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(kn_bf16_to_f32(0xc040) == -3.0f);
    /* e4m3: max 448, smallest subnormal 2^-9, every code round-trips. */
    ck_assert(kn_e4m3_to_f32(0x7e) == 448.0f);
    ck_assert(kn_e4m3_to_f32(0x01) == 0.001953125f);
    ck_assert_uint_eq(kn_f32_to_e4m3(1000.0f), 0x7e);
    ck_assert_uint_eq(kn_f32_to_e4m3(-1.0f), 0xb8);
    for (int i = 0; i < 256; i++) {
        if ((i & 0x7f) == 0x7f) {
            continue; /* NaN */
        }
        float x = kn_e4m3_to_f32((uint8_t)i);

        ck_assert_msg(kn_f32_to_e4m3(x) == i || (x == 0.0f && (i & 0x7f) == 0),
                      "e4m3 code %02x", i);
    }
}
END_TEST

/* Worst error of quantize + dequantize of one kind of a block, per group,
 * relative to what the format promises for that group. Returns the max of
 * |x - y| / bound over the block (must be <= 1). */
static double
block_error_ratio(kn_kvq_fmt_t fmt, int kind, const float *src, int32_t nkv, int32_t bs,
                  int32_t hd)
{
    kn_kvq_layout_t L = layout(fmt, nkv, bs, hd);
    uint8_t *blk = calloc(1, kind == 0 ? L.k_stride : L.v_stride);
    float *out = malloc(sizeof(float) * (size_t)bs * hd);
    double worst = 0.0;

    kn_kvq_quantize_block(&L, kind, src, bs, blk);
    for (int32_t h = 0; h < nkv; h++) {
        const float *x = src + (size_t)h * bs * hd;

        kn_kvq_dequant_rows(&L, kind, blk, h, 0, bs, out);
        for (int32_t r = 0; r < bs; r++) {
            for (int32_t d = 0; d < hd; d++) {
                /* The group of (r, d): channel d over rows (K) or row r (V). */
                float lo = INFINITY, hi = -INFINITY;

                for (int32_t i = 0; i < (kind == 0 ? bs : hd); i++) {
                    float v = kind == 0 ? x[(size_t)i * hd + d] : x[(size_t)r * hd + i];

                    lo = fminf(lo, v);
                    hi = fmaxf(hi, v);
                }
                double xv = x[(size_t)r * hd + d], err = fabs(xv - out[(size_t)r * hd + d]);
                double amax = fmax(fabs(lo), fabs(hi)), bound;

                switch (fmt) {
                case KN_KVQ_F32:
                    bound = 0.0;
                    break;
                case KN_KVQ_F16:
                    bound = fabs(xv) * 0x1p-11 + 0x1p-25;
                    break;
                case KN_KVQ_BF16:
                    bound = fabs(xv) * 0x1p-8;
                    break;
                case KN_KVQ_FP8: /* half an ulp of 3 mantissa bits, subnormals of the scale */
                    bound = fabs(xv) * 0x1p-4 * 1.01 + amax / 448.0 * 0x1p-10 * 1.01 + 1e-12;
                    break;
                case KN_KVQ_INT8: /* half a step, + f16 rounding of scale and zero */
                    bound = (hi - lo) / 255.0 * 0.5 * 1.01 + (hi - lo) * 0x1p-10 + amax * 0x1p-11;
                    break;
                default:
                    bound = (hi - lo) / 15.0 * 0.5 * 1.01 + (hi - lo) * 0x1p-10 + amax * 0x1p-11;
                    break;
                }
                if (bound == 0.0) {
                    ck_assert(err == 0.0);
                } else if (err / bound > worst) {
                    worst = err / bound;
                }
            }
        }
    }
    free(blk);
    free(out);
    return worst;
}

START_TEST(test_error_bounds)
{
    const int32_t nkv = 2, bs = 16, hd = 64;
    float *x = malloc(sizeof(float) * nkv * bs * hd);

    for (int f = 0; f < N_FMTS; f++) {
        for (int kind = 0; kind < 2; kind++) {
            for (int outliers = 0; outliers < 2; outliers++) {
                for (int i = 0; i < nkv * bs * hd; i++) {
                    x[i] = frand() * 2.0f;
                }
                if (outliers) {
                    /* KIVI's observation: key outliers sit in channels, value
                     * outliers in tokens. Channel 5 of every key row and
                     * token 3 of every value head are 50x larger. */
                    for (int32_t h = 0; h < nkv; h++) {
                        for (int32_t r = 0; r < bs; r++) {
                            for (int32_t d = 0; d < hd; d++) {
                                if (kind == 0 ? d == 5 : r == 3) {
                                    x[((size_t)h * bs + r) * hd + d] *= 50.0f;
                                }
                            }
                        }
                    }
                }
                double w = block_error_ratio(all_fmts[f], kind, x, nkv, bs, hd);

                ck_assert_msg(w <= 1.0, "%s kind %d outliers %d: error %.3f x bound",
                              kn_kvq_fmt_name(all_fmts[f]), kind, outliers, w);
            }
        }
    }
    free(x);
}
END_TEST

/* With channel outliers in K, per-channel groups keep the other channels
 * as precise as without outliers (per-token groups would not). */
START_TEST(test_outlier_isolation)
{
    const int32_t bs = 16, hd = 32;
    kn_kvq_layout_t L = layout(KN_KVQ_INT4, 1, bs, hd);
    float x[16 * 32], y[16 * 32];
    uint8_t *blk = calloc(1, L.k_stride);
    double worst = 0.0;

    for (int i = 0; i < bs * hd; i++) {
        x[i] = frand();
        if (i % hd == 7) {
            x[i] *= 100.0f;
        }
    }
    kn_kvq_quantize_block(&L, 0, x, bs, blk);
    kn_kvq_dequant_rows(&L, 0, blk, 0, 0, bs, y);
    for (int i = 0; i < bs * hd; i++) {
        if (i % hd != 7) {
            worst = fmax(worst, fabs(x[i] - y[i]));
        }
    }
    /* Range 2 over 15 levels: half a step is 0.067. */
    ck_assert_msg(worst < 0.075, "non-outlier channel error %.4f", worst);
    free(blk);
}
END_TEST

/* First i with |got - want| > 2e-5 (1 + |want|) (NaN included), or -1.
 * (One ck_assert per element would cost a pipe write each.) */
static int32_t
first_mismatch(const float *want, const float *got, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        if (!(fabsf(want[i] - got[i]) <= 2e-5f * (1.0f + fabsf(want[i])))) {
            return i;
        }
    }
    return -1;
}

/* K/V data of one token row (nkv * hd floats each) for check_attention:
 * mode 0 random with one 8x key channel; mode 1 outlier-heavy (KIVI:
 * key outliers in channels, value outliers in tokens): key channels 3 and
 * hd - 2 are 50x, every 7th token's values 20x, and the other values of
 * every 5th token tiny (1e-3: fp8 subnormal codes, int zero points far
 * from zero). */
static void
attn_row(int mode, int32_t j, int32_t nkv, int32_t hd, float *k, float *v)
{
    for (int32_t i = 0; i < nkv * hd; i++) {
        int32_t d = i % hd;

        k[i] = frand();
        v[i] = frand();
        if (mode == 0) {
            k[i] *= d == 3 ? 8.0f : 1.0f;
            continue;
        }
        k[i] = d == 3 || d == hd - 2 ? 50.0f * k[i] + 20.0f : k[i];
        if (j % 7 == 3) {
            v[i] *= 20.0f;
        } else if (j % 5 == 1 && d != 0) {
            v[i] *= 1e-3f;
        }
    }
}

/* A store with sequences written through kn_kvq_write (several blocks,
 * a partial tail each; decode, prefill and mixed queries), attention over
 * it at every ISA this CPU has against the reference attention over the
 * f32 copy that kn_kvq_read_rows reads. */
static void
check_attention(kn_kvq_fmt_t fmt, int32_t n_heads, int32_t nkv, int32_t hd, int32_t bs,
                int32_t window, int mode)
{
    const int32_t n_seqs = 3, ctx_len[3] = {37, 16, 70}, n_new[3] = {5, 1, 20};
    const int32_t mb = (70 + bs - 1) / bs, nb = n_seqs * mb + 1;
    kn_kvq_layout_t L = layout(fmt, nkv, bs, hd);
    kn_kvq_store_t *st;
    char err[128];
    int32_t bt[3 * 70], qs[4], n_tok = 0;

    ck_assert_int_eq(kn_kvq_store_create(&L, 2, nb, 0, 8, &st, err, sizeof(err)), ST_OK);
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t i = 0; i < mb; i++) {
            bt[s * mb + i] = 1 + s * mb + (mb - 1 - i); /* scattered ids */
        }
    }
    /* Write every token of every sequence, one token per call (decode-like)
     * for layer 0 and 1 alternately as the forward does. */
    float *k = malloc(sizeof(float) * nkv * hd), *v = malloc(sizeof(float) * nkv * hd);

    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t j = 0; j < ctx_len[s]; j++) {
            int32_t slot = bt[s * mb + j / bs] * bs + j % bs;

            for (int32_t l = 0; l < 2; l++) {
                attn_row(mode, j, nkv, hd, k, v);
                kn_kvq_write(st, l, k, v, &slot, 1);
            }
        }
    }
    kn_kvq_end_step(st); /* between steps: full blocks are codes only */
    qs[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        n_tok += n_new[s];
        qs[s + 1] = n_tok;
    }
    float *q = malloc(sizeof(float) * n_tok * n_heads * hd);
    float *o1 = malloc(sizeof(float) * n_tok * n_heads * hd);
    float *o2 = malloc(sizeof(float) * n_tok * n_heads * hd);
    size_t cache_floats = (size_t)nb * nkv * bs * hd;
    float *kc = calloc(cache_floats, sizeof(float)), *vc = calloc(cache_floats, sizeof(float));

    for (int32_t i = 0; i < n_tok * n_heads * hd; i++) {
        q[i] = frand() * (mode == 1 && i % hd == hd - 2 ? 0.2f : 1.0f);
    }
    for (int32_t l = 0; l < 2; l++) {
        for (int32_t b = 1; b < nb; b++) {
            for (int32_t h = 0; h < nkv; h++) {
                size_t off = ((size_t)b * nkv + h) * bs * hd;

                kn_kvq_read_rows(st, l, 0, b, h, 0, bs, kc + off);
                kn_kvq_read_rows(st, l, 1, b, h, 0, bs, vc + off);
            }
        }
        kn_attn_args_t a = {
            .out = o1,
            .q = q,
            .k_cache = kc,
            .v_cache = vc,
            .query_start = qs,
            .context_len = ctx_len,
            .block_tables = bt,
            .max_blocks = mb,
            .n_seqs = n_seqs,
            .n_tok = n_tok,
            .n_heads = n_heads,
            .n_kv_heads = nkv,
            .head_dim = hd,
            .block_size = bs,
            .sliding_window = window,
            .scale = 1.0f / sqrtf((float)hd),
        };
        kn_cpu_attention_ref(&a);
        a.out = o2;
        for (int isa = KN_ISA_GENERIC; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            memset(o2, 0xff, sizeof(float) * n_tok * n_heads * hd); /* NaN */
            kn_kvq_attention(st, l, &a);
            int32_t i = first_mismatch(o1, o2, n_tok * n_heads * hd);

            ck_assert_msg(i < 0, "%s %s hd %d bs %d heads %d/%d mode %d layer %d [%d]: %g vs %g",
                          kn_kvq_fmt_name(fmt), kn_isa_name((kn_isa_t)isa), hd, bs, n_heads, nkv,
                          mode, l, i, o1[i < 0 ? 0 : i], o2[i < 0 ? 0 : i]);
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
    }
    /* Tails are residual (full precision), full blocks are not. */
    ck_assert_int_eq(kn_kvq_block_is_residual(st, 0, bt[0 * mb + ctx_len[0] / bs]),
                     kn_kvq_scaled(fmt) && ctx_len[0] % bs != 0);
    ck_assert_int_eq(kn_kvq_block_is_residual(st, 0, bt[2 * mb + 0]), 0);
    free(k);
    free(v);
    free(q);
    free(o1);
    free(o2);
    free(kc);
    free(vc);
    kn_kvq_store_destroy(st);
}

START_TEST(test_attention_vs_dequantized)
{
    for (int f = 0; f < N_FMTS; f++) {
        check_attention(all_fmts[f], 4, 2, 32, 16, 0, 0);
        check_attention(all_fmts[f], 6, 2, 64, 8, 0, 0);
        check_attention(all_fmts[f], 9, 1, 40, 16, 19, 0);
    }
}
END_TEST

/* Every dtype x head_dim (tails below one vector at each ISA: 40, 72;
 * int4 needs head_dim % 8 == 0) x block size (8, 16, and 32: two chunks
 * per block) x GQA group (1, 3, 9: more query heads per KV head than one
 * pass holds), on random and outlier-heavy data, at every ISA. */
START_TEST(test_attention_matrix)
{
    static const int32_t hds[] = {32, 40, 64, 72, 128};
    static const int32_t groups[][2] = {{2, 2}, {9, 3}, {9, 1}};
    static const int32_t bss[] = {8, 16, 32};
    int n = 0;

    for (int f = 0; f < N_FMTS; f++) {
        for (int h = 0; h < 5; h++) {
            for (int mode = 0; mode < 2; mode++) {
                int g = (h + mode + f) % 3, b = (h + 2 * mode + f) % 3;

                check_attention(all_fmts[f], groups[g][0], groups[g][1], hds[h], bss[b],
                                h == 3 ? 21 : 0, mode);
                n++;
            }
        }
        /* Every group and block size at the model's head_dim, both modes. */
        for (int g = 0; g < 3; g++) {
            for (int b = 0; b < 3; b++) {
                check_attention(all_fmts[f], groups[g][0], groups[g][1], 64, bss[b], 0,
                                (g + b) % 2);
                n++;
            }
        }
    }
    ck_assert_int_eq(n, N_FMTS * 19);
}
END_TEST

/* The vector E4M3 decode of the attention (normals, subnormals, signs)
 * against the scalar codec: one fp8 block whose value codes are every
 * code once (unit scale), read with one-hot softmax weights. */
START_TEST(test_fp8_every_code)
{
    const int32_t bs = 16, hd = 16;
    kn_kvq_layout_t L = layout(KN_KVQ_FP8, 1, bs, hd);
    kn_kvq_store_t *st;
    char err[128];
    float k[16], v[16], q[16], o[16];
    int32_t bt[2] = {1, 2}, qs[2] = {0, 1}, ctx = bs + 1;

    ck_assert_int_eq(kn_kvq_store_create(&L, 1, 3, 0, 4, &st, err, sizeof(err)), ST_OK);
    /* Row r of block 1: values are codes 16 r .. 16 r + 15 times 448 / max
     * so that the row scale is exactly 1 (f16 1.0); keys 0 except row
     * `hot` (then one-hot attention). */
    for (int32_t hot = 0; hot < bs; hot++) {
        for (int32_t r = 0; r <= bs; r++) {
            int32_t slot = (r < bs ? 1 : 2) * bs + r % bs;
            float amax = 0.0f;

            for (int32_t d = 0; d < hd; d++) {
                int c = (r % bs) * 16 + d;

                v[d] = (c & 0x7f) == 0x7f ? 0.0f : kn_e4m3_to_f32((uint8_t)c);
                amax = fmaxf(amax, fabsf(v[d]));
                k[d] = r == hot ? 40.0f : 0.0f;
                q[d] = 1.0f;
            }
            if (amax < 448.0f) {
                v[0] = 448.0f; /* channel 0 pins the scale to 1 */
            }
            kn_kvq_write(st, 0, k, v, &slot, 1);
        }
        kn_kvq_end_step(st);
        kn_attn_args_t a = {
            .out = o,
            .q = q,
            .query_start = qs,
            .context_len = &ctx,
            .block_tables = bt,
            .max_blocks = 2,
            .n_seqs = 1,
            .n_tok = 1,
            .n_heads = 1,
            .n_kv_heads = 1,
            .head_dim = hd,
            .block_size = bs,
            .scale = 1.0f,
        };
        for (int isa = KN_ISA_GENERIC; isa <= (int)kn_cpu_isa_best(); isa++) {
            float want[16];

            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            kn_kvq_attention(st, 0, &a);
            kn_kvq_read_rows(st, 0, 1, 1, 0, hot, 1, want);
            for (int32_t d = 1; d < hd; d++) {
                /* e^-640 of every other row underflows: exactly one-hot */
                ck_assert_msg(o[d] == want[d] || fabsf(o[d] - want[d]) <= 1e-6f * fabsf(want[d]),
                              "%s code %d: %g vs %g", kn_isa_name((kn_isa_t)isa), hot * 16 + d,
                              o[d], want[d]);
                if ((((hot * 16 + d) & 0x7f) != 0x7f)) {
                    ck_assert_float_eq(want[d], kn_e4m3_to_f32((uint8_t)(hot * 16 + d)));
                }
            }
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
    }
    kn_kvq_store_destroy(st);
}
END_TEST

/* A quantized block with a pending SHIFT: attention rotates the query
 * (R(d) q . k) instead of the keys; it matches the reference over the
 * rotated dequantized rows that kn_kvq_read_rows returns. */
START_TEST(test_attention_shifted)
{
    const int32_t nkv = 2, bs = 16, hd = 64, nh = 6, ctx = 40;
    float inv_freq[32], k[2 * 64], v[2 * 64], q[6 * 64], o1[6 * 64], o2[6 * 64];
    int32_t bt[3] = {3, 1, 2}, qs[2] = {0, 1};
    static float kc[4 * 2 * 16 * 64], vc[4 * 2 * 16 * 64];

    for (int32_t i = 0; i < hd / 2; i++) {
        inv_freq[i] = (float)pow(10000.0, -2.0 * i / hd);
    }
    for (int f = 3; f < N_FMTS; f++) { /* the scaled formats keep a shift */
        kn_kvq_layout_t L = layout(all_fmts[f], nkv, bs, hd);
        kn_kvq_store_t *st;
        char err[128];

        ck_assert_int_eq(kn_kvq_store_create(&L, 1, 4, 0, 4, &st, err, sizeof(err)), ST_OK);
        kn_kvq_store_set_rope(st, inv_freq);
        for (int32_t j = 0; j < ctx; j++) {
            int32_t slot = bt[j / bs] * bs + j % bs;

            attn_row(1, j, nkv, hd, k, v);
            kn_kvq_write(st, 0, k, v, &slot, 1);
            kn_kvq_end_step(st);
        }
        kv_op_t ops[] = {{KV_OP_SHIFT, 3, 37}, {KV_OP_SHIFT, 1, 5}};

        ck_assert_int_eq(kn_kvq_ops(st, ops, 2), ST_OK);
        for (int32_t i = 0; i < nh * hd; i++) {
            q[i] = frand();
        }
        for (int32_t b = 1; b < 4; b++) {
            for (int32_t h = 0; h < nkv; h++) {
                size_t off = ((size_t)b * nkv + h) * bs * hd;

                kn_kvq_read_rows(st, 0, 0, b, h, 0, bs, kc + off);
                kn_kvq_read_rows(st, 0, 1, b, h, 0, bs, vc + off);
            }
        }
        int32_t cl = ctx;
        kn_attn_args_t a = {
            .out = o1,
            .q = q,
            .k_cache = kc,
            .v_cache = vc,
            .query_start = qs,
            .context_len = &cl,
            .block_tables = bt,
            .max_blocks = 3,
            .n_seqs = 1,
            .n_tok = 1,
            .n_heads = nh,
            .n_kv_heads = nkv,
            .head_dim = hd,
            .block_size = bs,
            .scale = 0.125f,
        };
        kn_cpu_attention_ref(&a);
        a.out = o2;
        for (int isa = KN_ISA_GENERIC; isa <= (int)kn_cpu_isa_best(); isa++) {
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa), ST_OK);
            kn_kvq_attention(st, 0, &a);
            int32_t i = first_mismatch(o1, o2, nh * hd);

            ck_assert_msg(i < 0, "%s %s [%d]: %g vs %g", kn_kvq_fmt_name(all_fmts[f]),
                          kn_isa_name((kn_isa_t)isa), i, o1[i < 0 ? 0 : i], o2[i < 0 ? 0 : i]);
        }
        kn_cpu_set_isa(kn_cpu_isa_best());
        kn_kvq_store_destroy(st);
    }
}
END_TEST

/* Writes n tokens of random K/V for every layer into blk from offset 0. */
static void
fill_block(kn_kvq_store_t *st, int32_t n_layers, int32_t nkv, int32_t hd, int32_t bs, int32_t blk,
           int32_t n)
{
    float k[4 * 64], v[4 * 64];

    for (int32_t j = 0; j < n; j++) {
        int32_t slot = blk * bs + j;

        for (int32_t l = 0; l < n_layers; l++) {
            for (int32_t i = 0; i < nkv * hd; i++) {
                k[i] = frand();
                v[i] = frand();
            }
            kn_kvq_write(st, l, k, v, &slot, 1);
        }
    }
}

static void
assert_same_rows(const kn_kvq_store_t *a, int32_t ba, const kn_kvq_store_t *b, int32_t bb,
                 int32_t n_layers, int32_t nkv, int32_t bs, int32_t hd)
{
    float x[16 * 64], y[16 * 64];

    for (int32_t l = 0; l < n_layers; l++) {
        for (int kind = 0; kind < 2; kind++) {
            for (int32_t h = 0; h < nkv; h++) {
                kn_kvq_read_rows(a, l, kind, ba, h, 0, bs, x);
                kn_kvq_read_rows(b, l, kind, bb, h, 0, bs, y);
                ck_assert(memcmp(x, y, sizeof(float) * (size_t)bs * hd) == 0);
            }
        }
    }
}

START_TEST(test_ops_bit_exact)
{
    const int32_t nl = 3, nkv = 2, bs = 16, hd = 32;

    for (int f = 0; f < N_FMTS; f++) {
        kn_kvq_layout_t L = layout(all_fmts[f], nkv, bs, hd);
        kn_kvq_store_t *st;
        char err[128];

        ck_assert_int_eq(kn_kvq_store_create(&L, nl, 10, 6, 4, &st, err, sizeof(err)), ST_OK);
        fill_block(st, nl, nkv, hd, bs, 1, bs); /* full: quantized */
        fill_block(st, nl, nkv, hd, bs, 2, 7);  /* partial: residual */
        kv_op_t ops[] = {
            {KV_OP_COPY, 1, 3},     /* copy-on-write of a full block */
            {KV_OP_COPY, 2, 4},     /* ... and of a partial one */
            {KV_OP_SWAP_OUT, 1, 0}, /* swap both out */
            {KV_OP_SWAP_OUT, 2, 1},
            {KV_OP_SWAP_IN, 0, 5}, /* and back into other blocks */
            {KV_OP_SWAP_IN, 1, 6},
        };
        ck_assert_int_eq(kn_kvq_ops(st, ops, 6), ST_OK);
        for (int32_t l = 0; l < nl; l++) {
            for (int kind = 0; kind < 2; kind++) {
                size_t n = kind == 0 ? L.k_stride : L.v_stride;
                const uint8_t *b1 = kn_kvq_block_ptr(st, 0, l, kind, 1);

                /* Codes and scales bit for bit, on both tiers. */
                ck_assert(memcmp(b1, kn_kvq_block_ptr(st, 0, l, kind, 3), n) == 0);
                ck_assert(memcmp(b1, kn_kvq_block_ptr(st, 1, l, kind, 0), n) == 0);
                ck_assert(memcmp(b1, kn_kvq_block_ptr(st, 0, l, kind, 5), n) == 0);
            }
        }
        assert_same_rows(st, 1, st, 3, nl, nkv, bs, hd);
        assert_same_rows(st, 1, st, 5, nl, nkv, bs, hd);
        assert_same_rows(st, 2, st, 4, nl, nkv, bs, hd); /* residual rows too */
        assert_same_rows(st, 2, st, 6, nl, nkv, bs, hd);
        ck_assert_int_eq(kn_kvq_block_is_residual(st, 0, 4), kn_kvq_scaled(all_fmts[f]));
        ck_assert_int_eq(kn_kvq_block_is_residual(st, 1, 1), kn_kvq_scaled(all_fmts[f]));

        /* Finishing the copied partial block quantizes it like the original. */
        float k[2 * 32], v[2 * 32];
        kn_kvq_stats_t s0, s1;

        kn_kvq_store_stats(st, &s0);
        for (int32_t j = 7; j < bs; j++) {
            for (int32_t l = 0; l < nl; l++) {
                int32_t sa = 2 * bs + j, sb = 4 * bs + j;

                for (int32_t i = 0; i < nkv * hd; i++) {
                    k[i] = frand();
                    v[i] = frand();
                }
                kn_kvq_write(st, l, k, v, &sa, 1);
                kn_kvq_write(st, l, k, v, &sb, 1);
            }
        }
        kn_kvq_store_stats(st, &s1);
        ck_assert_uint_eq(s1.requantized, s0.requantized); /* never re-quantized */
        for (int32_t l = 0; l < nl; l++) {
            ck_assert(memcmp(kn_kvq_block_ptr(st, 0, l, 0, 2), kn_kvq_block_ptr(st, 0, l, 0, 4),
                             L.k_stride) == 0);
        }
        ck_assert_int_eq(kn_kvq_block_is_residual(st, 0, 4), 0);

        /* Drops give residual slots back. */
        kv_op_t drops[] = {{KV_OP_DROP, 6, 6}, {KV_OP_DROP_SWAP, 1, 1}};

        ck_assert_int_eq(kn_kvq_ops(st, drops, 2), ST_OK);
        kn_kvq_end_step(st); /* filled blocks' slots go at the step's end */
        kn_kvq_store_stats(st, &s1);
        ck_assert_int_eq(s1.slots_dev_used, 0);
        ck_assert_int_eq(s1.slots_swap_used, 0);
        kn_kvq_store_destroy(st);
    }
}
END_TEST

/* More partial blocks than slots: the least recently written is quantized
 * early (flushed) and reads stay within the format's error. */
START_TEST(test_slot_exhaustion)
{
    const int32_t nkv = 1, bs = 16, hd = 32;
    kn_kvq_layout_t L = layout(KN_KVQ_INT8, nkv, bs, hd);
    kn_kvq_store_t *st;
    kn_kvq_stats_t s;
    char err[128];
    float ref[6][4][32], out[5 * 32];

    ck_assert_int_eq(kn_kvq_store_create(&L, 1, 8, 0, 2, &st, err, sizeof(err)), ST_OK);
    for (int32_t b = 1; b <= 5; b++) {
        for (int32_t j = 0; j < 4; j++) {
            int32_t slot = b * bs + j;
            float v[32];

            for (int32_t i = 0; i < hd; i++) {
                ref[b][j][i] = frand();
                v[i] = frand();
            }
            kn_kvq_write(st, 0, ref[b][j], v, &slot, 1);
        }
    }
    kn_kvq_store_stats(st, &s);
    ck_assert_int_eq(s.slots_dev, 2);
    ck_assert_uint_eq(s.flushed, 3);
    for (int32_t b = 1; b <= 5; b++) {
        kn_kvq_read_rows(st, 0, 0, b, 0, 0, 4, out);
        for (int32_t i = 0; i < 4 * hd; i++) {
            ck_assert(fabsf(out[i] - ref[b][i / hd][i % hd]) < 2.0f / 255.0f);
        }
    }
    /* Writing on into a flushed block starts from its dequantized rows. */
    int32_t slot = 1 * bs + 4;
    float k[32], v[32];

    for (int32_t i = 0; i < hd; i++) {
        k[i] = v[i] = 0.5f;
    }
    kn_kvq_write(st, 0, k, v, &slot, 1);
    kn_kvq_store_stats(st, &s);
    ck_assert_uint_eq(s.requantized, 1);
    kn_kvq_read_rows(st, 0, 0, 1, 0, 0, 5, out);
    ck_assert(fabsf(out[0] - ref[1][0][0]) < 2.0f / 255.0f);
    ck_assert(out[4 * hd] == 0.5f);
    kn_kvq_store_destroy(st);
}
END_TEST

/* RoPE (rotate_half form) of x at position pos, in double. */
static void
rope_at(const float *x, float *y, int32_t hd, const float *inv_freq, int32_t pos)
{
    for (int32_t i = 0; i < hd / 2; i++) {
        double a = (double)pos * inv_freq[i], c = cos(a), sn = sin(a);

        y[i] = (float)(x[i] * c - x[i + hd / 2] * sn);
        y[i + hd / 2] = (float)(x[i + hd / 2] * c + x[i] * sn);
    }
}

/* SHIFT re-rotates kept keys: a block written at positions p, shifted by
 * delta, reads (up to the format's error) as the same keys written from
 * scratch at p - delta; for f32 and for residual (partial) blocks exactly
 * so (float rounding). Attention over the shifted store equals attention
 * over a from-scratch f32 cache. Quantized codes never change. */
START_TEST(test_shift)
{
    const int32_t nkv = 2, bs = 16, hd = 32, delta = 48, pos0 = 80;
    float inv_freq[16];

    for (int32_t i = 0; i < hd / 2; i++) {
        inv_freq[i] = (float)pow(10000.0, -2.0 * i / hd);
    }
    for (int f = 0; f < N_FMTS; f++) {
        kn_kvq_layout_t L = layout(all_fmts[f], nkv, bs, hd);
        kn_kvq_store_t *st;
        char err[128];
        static float raw[2][32][2][32]; /* [block][row][head][dim] pre-RoPE */
        float k[2 * 32], v[2 * 32], got[32 * 32], want[32];
        uint8_t *codes = malloc(L.k_stride);

        ck_assert_int_eq(kn_kvq_store_create(&L, 1, 4, 0, 4, &st, err, sizeof(err)), ST_OK);
        kn_kvq_store_set_rope(st, inv_freq);
        /* Block 1 full (quantized), block 2 with 5 rows (residual). */
        for (int32_t b = 0; b < 2; b++) {
            for (int32_t r = 0; r < (b == 0 ? bs : 5); r++) {
                int32_t slot = (b + 1) * bs + r;

                for (int32_t h = 0; h < nkv; h++) {
                    for (int32_t d = 0; d < hd; d++) {
                        raw[b][r][h][d] = frand();
                        v[h * hd + d] = frand();
                    }
                    rope_at(raw[b][r][h], k + h * hd, hd, inv_freq, pos0 + b * bs + r);
                }
                kn_kvq_write(st, 0, k, v, &slot, 1);
            }
        }
        memcpy(codes, kn_kvq_block_ptr(st, 0, 0, 0, 1), L.k_stride);
        kv_op_t ops[] = {{KV_OP_SHIFT, 1, delta}, {KV_OP_SHIFT, 2, delta}};

        ck_assert_int_eq(kn_kvq_ops(st, ops, 2), ST_OK);
        if (kn_kvq_scaled(all_fmts[f])) {
            ck_assert(memcmp(codes, kn_kvq_block_ptr(st, 0, 0, 0, 1), L.k_stride) == 0);
        }
        for (int32_t b = 0; b < 2; b++) {
            int32_t n = b == 0 ? bs : 5;
            /* Exact for f32 storage and for the f32 residual rows. */
            int exact = all_fmts[f] == KN_KVQ_F32 || (b == 1 && kn_kvq_scaled(all_fmts[f]));
            double tol = exact                                 ? 2e-5
                         : all_fmts[f] == KN_KVQ_INT4          ? 0.2
                         : all_fmts[f] == KN_KVQ_FP8           ? 0.1
                         : all_fmts[f] == KN_KVQ_INT8          ? 0.02
                                                               : 0.01;

            for (int32_t h = 0; h < nkv; h++) {
                kn_kvq_read_rows(st, 0, 0, b + 1, h, 0, n, got);
                for (int32_t r = 0; r < n; r++) {
                    rope_at(raw[b][r][h], want, hd, inv_freq, pos0 + b * bs + r - delta);
                    for (int32_t d = 0; d < hd; d++) {
                        ck_assert_msg(fabs(got[r * hd + d] - want[d]) <= tol,
                                      "%s block %d row %d: %g vs %g", kn_kvq_fmt_name(all_fmts[f]),
                                      b, r, got[r * hd + d], want[d]);
                    }
                }
            }
        }
        /* The shift travels with a copy; a drop forgets it. */
        kv_op_t cp = {KV_OP_COPY, 1, 3};

        ck_assert_int_eq(kn_kvq_ops(st, &cp, 1), ST_OK);
        assert_same_rows(st, 1, st, 3, 1, nkv, bs, hd);
        /* A write past the residual rows of the shifted block lands at its
         * new position unrotated. */
        int32_t slot = 2 * bs + 5;

        for (int32_t i = 0; i < nkv * hd; i++) {
            k[i] = 0.25f;
        }
        kn_kvq_write(st, 0, k, v, &slot, 1);
        kn_kvq_read_rows(st, 0, 0, 2, 0, 5, 1, got);
        for (int32_t d = 0; d < hd; d++) {
            ck_assert(fabsf(got[d] - 0.25f) <= (kn_kvq_scaled(all_fmts[f]) ? 0.0f : 1e-3f));
        }
        free(codes);
        kn_kvq_store_destroy(st);
    }
}
END_TEST

/* KIVI's residual rule makes results independent of the step split: a
 * query reads its own block in full precision, earlier blocks as codes.
 * Query 20 (block 1) attends identically when decoded one token per step
 * (block 1 still partial) and inside a 32-token prefill (block 1 filled
 * and quantized in the same step). */
START_TEST(test_split_invariance)
{
    const int32_t nkv = 1, bs = 16, hd = 32, n = 32, nh = 2, qt = 20;
    static float k[32][32], v[32][32], q[32][2 * 32], o2[32][2 * 32];
    float o1[2 * 32];
    int32_t bt[2] = {1, 2};

    for (int32_t t = 0; t < n; t++) {
        for (int32_t d = 0; d < hd; d++) {
            k[t][d] = frand();
            v[t][d] = frand();
        }
        for (int32_t i = 0; i < nh * hd; i++) {
            q[t][i] = frand();
        }
    }
    for (int f = 3; f < N_FMTS; f++) { /* the scaled formats */
        kn_kvq_layout_t L = layout(all_fmts[f], nkv, bs, hd);
        kn_kvq_store_t *a, *b;
        char err[128];
        int32_t slots[32], qs1[2] = {0, 1}, ctx1 = qt + 1, qs2[2] = {0, n}, ctx2 = n;

        ck_assert_int_eq(kn_kvq_store_create(&L, 1, 4, 0, 8, &a, err, sizeof(err)), ST_OK);
        ck_assert_int_eq(kn_kvq_store_create(&L, 1, 4, 0, 8, &b, err, sizeof(err)), ST_OK);
        kn_attn_args_t args = {
            .max_blocks = 2,
            .block_tables = bt,
            .n_seqs = 1,
            .n_heads = nh,
            .n_kv_heads = nkv,
            .head_dim = hd,
            .block_size = bs,
            .scale = 0.2f,
        };
        for (int32_t t = 0; t <= qt; t++) { /* decode, one token per step */
            slots[t] = bt[t / bs] * bs + t % bs;
            kn_kvq_write(a, 0, k[t], v[t], &slots[t], 1);
            if (t == qt) {
                args.out = o1;
                args.q = q[qt];
                args.query_start = qs1;
                args.context_len = &ctx1;
                args.n_tok = 1;
                kn_kvq_attention(a, 0, &args);
            }
            kn_kvq_end_step(a);
        }
        for (int32_t t = 0; t < n; t++) {
            slots[t] = bt[t / bs] * bs + t % bs;
        }
        kn_kvq_write(b, 0, &k[0][0], &v[0][0], slots, n); /* one prefill step */
        args.out = &o2[0][0];
        args.q = &q[0][0];
        args.query_start = qs2;
        args.context_len = &ctx2;
        args.n_tok = n;
        kn_kvq_attention(b, 0, &args);
        ck_assert_msg(memcmp(o1, o2[qt], sizeof(o1)) == 0, "%s: %g vs %g",
                      kn_kvq_fmt_name(all_fmts[f]), o1[0], o2[qt][0]);
        kn_kvq_end_step(b);
        kn_kvq_store_destroy(a);
        kn_kvq_store_destroy(b);
    }
}
END_TEST

START_TEST(test_rejects)
{
    kn_kvq_layout_t L;
    char err[160] = "";

    ck_assert_int_eq(kn_kvq_layout_init(&L, KN_KVQ_INT4, 2, 16, 36, err, sizeof(err)),
                     ST_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "int4"));
    ck_assert_int_eq(kn_kvq_layout_init(&L, KN_KVQ_INT8, 2, 16, 33, err, sizeof(err)),
                     ST_EUNSUPPORTED);
    ck_assert_int_eq(kn_kvq_layout_init(&L, KN_KVQ_INT8, 2, 16, 512, err, sizeof(err)),
                     ST_EUNSUPPORTED);
    ck_assert_int_eq(kn_kvq_layout_init(&L, KN_KVQ_INT8, 0, 16, 32, err, sizeof(err)), ST_EINVAL);
    ck_assert_int_eq(kn_kvq_layout_init(&L, KN_KVQ_INT4, 2, 16, 40, err, sizeof(err)), ST_OK);
    /* Sizes: 16 x 40 x 2 heads; int4 K: 640 bytes of codes + 2 x 80 f16. */
    ck_assert_uint_eq(L.data_bytes, 640);
    ck_assert_uint_eq(L.k_stride, 640 + 320);
    ck_assert_uint_eq(L.v_stride, 640 + 128);
}
END_TEST

static Suite *
kv_quant_suite(void)
{
    Suite *s = suite_create("kv_quant");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_codecs);
    tcase_add_test(tc, test_error_bounds);
    tcase_add_test(tc, test_outlier_isolation);
    tcase_add_test(tc, test_attention_vs_dequantized);
    tcase_add_test(tc, test_attention_matrix);
    tcase_add_test(tc, test_fp8_every_code);
    tcase_add_test(tc, test_attention_shifted);
    tcase_add_test(tc, test_ops_bit_exact);
    tcase_add_test(tc, test_slot_exhaustion);
    tcase_add_test(tc, test_shift);
    tcase_add_test(tc, test_split_invariance);
    tcase_add_test(tc, test_rejects);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr;
    int failed;

    /* One kernel thread, as before the ISA loops called kn_cpu_isa_best()
     * (which would otherwise start a team of every core); the attention's
     * split over the team is covered by tests/kernels/test_kernels.c. */
    kn_cpu_init(1);
    sr = srunner_create(kv_quant_suite());

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
