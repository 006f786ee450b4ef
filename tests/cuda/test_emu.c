/* test_emu.c - the CUDA kernel bodies (kernels/cuda/kn_cuda_body.h), run
 * under the thread-block emulator (kn_emu.c), against the CPU reference
 * kernels (kernels/cpu/kn_ref.c) on random inputs and random block tables.
 *
 * Inputs are drawn in f32, rounded to the kernel's 16-bit dtype, and the
 * reference sees the rounded values, so the remaining error is the f32
 * accumulation order plus the final rounding of 16-bit outputs. Each test
 * holds the normalized mean squared error
 *   NMSE = sum (out - ref)^2 / sum ref^2
 * under a bound (as llama.cpp's test-backend-ops does): 1e-4 for bf16
 * outputs (8 mantissa bits: ~1e-5 observed), 1e-6 for f16 outputs and
 * 1e-9 for f32 outputs. A wrong index or a broken reduction lands near 1.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cuda/kn_kvcopy.h"
#include "tests/cuda/kn_emu.h"
#include "tests/cuda/kvq_ref.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

static uint32_t
rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static int32_t
rng_int(int32_t lo, int32_t hi) /* [lo, hi] */
{
    return lo + (int32_t)(rng_u32() % (uint32_t)(hi - lo + 1));
}

static float
rng_f(float scale)
{
    return ((float)(rng_u32() & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * scale;
}

/* KVSERVE_TEST_SCALE (tools/test sets 0.25 under the sanitizers, where
 * every emulated context switch costs far more) scales the repetitions. */
static int
reps(int full)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");
    double f = e != NULL ? atof(e) : 1.0;
    int n = (int)(full * (f > 0.0 && f < 1.0 ? f : 1.0) + 0.5);

    return n < 1 ? 1 : n;
}

static void
setup(void)
{
    rng_state = 0x9e3779b97f4a7c15ULL;
}

static double
nmse(const float *out, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - ref[i];

        if (isnan(out[i])) {
            return INFINITY;
        }
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

static double
bound16(kn_dt_t dt)
{
    return dt == KN_DT_BF16 ? 1e-4 : 1e-6;
}

/* Random 16-bit tensor and its f32 values. */
static void
rand16(uint16_t *h, float *f, size_t n, float scale, kn_dt_t dt)
{
    for (size_t i = 0; i < n; i++) {
        kn_st16(h, i, rng_f(scale), dt);
        f[i] = kn_ld16(h, i, dt);
    }
}

static float
round16(float v, kn_dt_t dt)
{
    uint16_t h;

    kn_st16(&h, 0, v, dt);
    return kn_ld16(&h, 0, dt);
}

static void
to_f32(const uint16_t *h, float *f, size_t n, kn_dt_t dt)
{
    for (size_t i = 0; i < n; i++) {
        f[i] = kn_ld16(h, i, dt);
    }
}

/* Body adapters with the emulator's signature. */
static void
run_embed(const kn_thr_t *t, float *smem, const void *a)
{
    kn_embed_body(t, smem, a);
}
static void
run_rmsnorm(const kn_thr_t *t, float *smem, const void *a)
{
    kn_rmsnorm_body(t, smem, a);
}
static void
run_rope(const kn_thr_t *t, float *smem, const void *a)
{
    kn_rope_body(t, smem, a);
}
static void
run_bias(const kn_thr_t *t, float *smem, const void *a)
{
    kn_bias_body(t, smem, a);
}
static void
run_kv_write(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kv_write_body(t, smem, a);
}
static void
run_silu_mul(const kn_thr_t *t, float *smem, const void *a)
{
    kn_silu_mul_body(t, smem, a);
}
static void
run_add(const kn_thr_t *t, float *smem, const void *a)
{
    kn_add_body(t, smem, a);
}
static void
run_gather(const kn_thr_t *t, float *smem, const void *a)
{
    kn_gather_body(t, smem, a);
}
static void
run_attention(const kn_thr_t *t, float *smem, const void *a)
{
    kn_attention_body(t, smem, a);
}
static void
run_attention_prefill(const kn_thr_t *t, float *smem, const void *a)
{
    kn_attention_prefill_body(t, smem, a);
}
static void
run_attention_split(const kn_thr_t *t, float *smem, const void *a)
{
    kn_attention_split_body(t, smem, a);
}
static void
run_attention_combine(const kn_thr_t *t, float *smem, const void *a)
{
    kn_attention_combine_body(t, smem, a);
}

/* ---- conversions ---------------------------------------------------------- */

START_TEST(test_convert)
{
    ck_assert_uint_eq(kn_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(kn_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(kn_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(kn_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(kn_f32_to_f16(5.9604645e-8f), 0x0001);         /* smallest subnormal */
    ck_assert_uint_eq(kn_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00); /* tie to even */
    ck_assert_uint_eq(kn_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);
    ck_assert_uint_eq(kn_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(kn_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80); /* tie to even */
    ck_assert_uint_eq(kn_f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
    ck_assert(isnan(kn_bf16_to_f32(kn_f32_to_bf16(NAN))));
    ck_assert(isnan(kn_f16_to_f32(kn_f32_to_f16(NAN))));
    /* Every f16 value survives the round trip through f32. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
            continue; /* NaN payloads */
        }
        ck_assert_uint_eq(kn_f32_to_f16(kn_f16_to_f32((uint16_t)h)), h);
    }
}
END_TEST

/* ---- elementwise kernels ----------------------------------------------------- */

START_TEST(test_embed)
{
    kn_dt_t dt = (kn_dt_t)_i;
    int32_t vocab = 50, dim = 72, n_tok = 9;
    uint16_t *tab = xmalloc(sizeof(uint16_t) * vocab * dim);
    float *tabf = xmalloc(sizeof(float) * vocab * dim);
    float *out = xmalloc(sizeof(float) * n_tok * dim), *ref = xmalloc(sizeof(float) * n_tok * dim);
    int32_t tok[9];
    kn_embed_args_t a = {tab, tok, out, dim, dt};

    rand16(tab, tabf, (size_t)vocab * dim, 1.0f, dt);
    for (int i = 0; i < n_tok; i++) {
        tok[i] = rng_int(0, vocab - 1);
    }
    ck_assert_int_eq(kn_emu_launch(run_embed, &a, n_tok, 1, 32, 0), 0);
    kn_cpu_embed_ref(tabf, tok, n_tok, dim, ref);
    ck_assert(memcmp(out, ref, sizeof(float) * n_tok * dim) == 0);
    free(tab);
    free(tabf);
    free(out);
    free(ref);
}
END_TEST

START_TEST(test_rmsnorm)
{
    kn_dt_t dt = (kn_dt_t)_i;
    int32_t n_tok = 7, dim = 200, stride = 232;
    float *x = xmalloc(sizeof(float) * n_tok * stride), *xc = xmalloc(sizeof(float) * n_tok * dim);
    uint16_t *w = xmalloc(sizeof(uint16_t) * dim), *o = xmalloc(sizeof(uint16_t) * n_tok * dim);
    float *wf = xmalloc(sizeof(float) * dim), *of = xmalloc(sizeof(float) * n_tok * dim);
    float *ref = xmalloc(sizeof(float) * n_tok * dim);
    kn_rmsnorm_args_t a = {x, w, o, dim, stride, 1e-5f, dt};

    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t i = 0; i < stride; i++) {
            x[t * stride + i] = rng_f(3.0f);
            if (i < dim) {
                xc[t * dim + i] = x[t * stride + i];
            }
        }
    }
    rand16(w, wf, (size_t)dim, 2.0f, dt);
    ck_assert_int_eq(kn_emu_launch(run_rmsnorm, &a, n_tok, 1, 64, 64 / 32), 0);
    to_f32(o, of, (size_t)n_tok * dim, dt);
    kn_cpu_rmsnorm_ref(xc, wf, ref, n_tok, dim, 1e-5f);
    ck_assert_double_lt(nmse(of, ref, (size_t)n_tok * dim), bound16(dt));
    free(x);
    free(xc);
    free(w);
    free(o);
    free(wf);
    free(of);
    free(ref);
}
END_TEST

START_TEST(test_rope)
{
    int32_t n_tok = 11, n_heads = 3, hd = 40, stride = n_heads * hd + 8;
    float *x = xmalloc(sizeof(float) * n_tok * stride);
    float *ref = xmalloc(sizeof(float) * n_tok * n_heads * hd);
    float *got = xmalloc(sizeof(float) * n_tok * n_heads * hd);
    float inv_freq[20];
    int32_t pos[11];
    kn_rope_params_t rp = {.head_dim = hd, .theta = 10000.0f};
    kn_rope_args_t a = {x, pos, inv_freq, n_heads, hd, stride};

    kn_cpu_rope_inv_freq(&rp, inv_freq);
    for (int32_t t = 0; t < n_tok; t++) {
        pos[t] = rng_int(0, 300);
        for (int32_t i = 0; i < stride; i++) {
            x[t * stride + i] = rng_f(1.0f);
            if (i < n_heads * hd) {
                ref[t * n_heads * hd + i] = x[t * stride + i];
            }
        }
    }
    ck_assert_int_eq(kn_emu_launch(run_rope, &a, n_tok, 1, 32, 0), 0);
    kn_cpu_rope_ref(ref, pos, n_tok, n_heads, hd, inv_freq);
    for (int32_t t = 0; t < n_tok; t++) {
        memcpy(got + t * n_heads * hd, x + t * stride, sizeof(float) * n_heads * hd);
        /* The padding after the heads is left alone. */
        for (int32_t i = n_heads * hd; i < stride; i++) {
            ck_assert(fabsf(x[t * stride + i]) <= 1.0f);
        }
    }
    ck_assert_double_lt(nmse(got, ref, (size_t)n_tok * n_heads * hd), 1e-9);
    free(x);
    free(ref);
    free(got);
}
END_TEST

START_TEST(test_bias_silu_add_gather)
{
    kn_dt_t dt = (kn_dt_t)_i;
    int32_t n_tok = 5, n = 130, stride = 140;
    size_t sz = (size_t)n_tok * stride;
    float *g = xmalloc(sizeof(float) * sz), *u = xmalloc(sizeof(float) * sz);
    float *gc = xmalloc(sizeof(float) * n_tok * n), *uc = xmalloc(sizeof(float) * n_tok * n);
    float *ref = xmalloc(sizeof(float) * n_tok * n), *of = xmalloc(sizeof(float) * n_tok * n);
    uint16_t *o = xmalloc(sizeof(uint16_t) * n_tok * n), *b = xmalloc(sizeof(uint16_t) * n);
    float *bf = xmalloc(sizeof(float) * n);

    for (size_t i = 0; i < sz; i++) {
        g[i] = rng_f(4.0f);
        u[i] = rng_f(2.0f);
    }
    rand16(b, bf, (size_t)n, 1.0f, dt);

    /* bias: gate[t][o] += b[o] */
    kn_bias_args_t ba = {g, b, n, stride, dt};
    ck_assert_int_eq(kn_emu_launch(run_bias, &ba, n_tok, 1, 64, 0), 0);
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t i = 0; i < n; i++) {
            gc[t * n + i] = g[t * stride + i];
            uc[t * n + i] = u[t * stride + i];
        }
    }

    /* silu(gate) * up -> 16-bit */
    kn_silu_mul_args_t sa = {g, u, o, n, stride, dt};
    ck_assert_int_eq(kn_emu_launch(run_silu_mul, &sa, n_tok, 1, 32, 0), 0);
    to_f32(o, of, (size_t)n_tok * n, dt);
    kn_cpu_silu_mul_ref(gc, uc, ref, (size_t)n_tok * n);
    ck_assert_double_lt(nmse(of, ref, (size_t)n_tok * n), bound16(dt));

    /* x += y over a length that is not a multiple of the block. */
    size_t len = sz - 3;
    float *xr = xmalloc(sizeof(float) * len);
    memcpy(xr, g, sizeof(float) * len);
    kn_add_args_t aa = {g, u, (int64_t)len};
    ck_assert_int_eq(kn_emu_launch(run_add, &aa, (int)((len + 127) / 128), 1, 32, 0), 0);
    kn_cpu_add_ref(xr, u, len);
    ck_assert(memcmp(xr, g, sizeof(float) * len) == 0);

    /* rows gather */
    int32_t rows[3] = {4, 0, 2};
    float *gout = xmalloc(sizeof(float) * 3 * stride);
    kn_gather_args_t ga = {g, rows, gout, stride};
    ck_assert_int_eq(kn_emu_launch(run_gather, &ga, 3, 1, 32, 0), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert(memcmp(gout + i * stride, g + rows[i] * stride, sizeof(float) * stride) == 0);
    }

    free(g);
    free(u);
    free(gc);
    free(uc);
    free(ref);
    free(of);
    free(o);
    free(b);
    free(bf);
    free(xr);
    free(gout);
}
END_TEST

START_TEST(test_bias_matches_reference)
{
    /* bias add alone, checked element by element against f32 math */
    kn_dt_t dt = KN_DT_BF16;
    int32_t n_tok = 3, n = 70;
    float y[3 * 70], y0[3 * 70], bf[70];
    uint16_t b[70];
    kn_bias_args_t ba = {y, b, n, n, dt};

    for (int i = 0; i < n_tok * n; i++) {
        y[i] = y0[i] = rng_f(1.0f);
    }
    rand16(b, bf, (size_t)n, 1.0f, dt);
    ck_assert_int_eq(kn_emu_launch(run_bias, &ba, n_tok, 1, 32, 0), 0);
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < n; i++) {
            ck_assert_float_eq(y[t * n + i], y0[t * n + i] + bf[i]);
        }
    }
}
END_TEST

/* ---- KV write and paged attention -------------------------------------------- */

typedef struct attn_case {
    int32_t n_heads, n_kv, hd, bs, window, nthr;
} attn_case_t;

static const attn_case_t attn_cases[] = {
    {6, 2, 32, 16, 0, 64},  /* the default model's shape */
    {4, 1, 64, 4, 0, 128},  /* MQA, small blocks */
    {4, 4, 40, 8, 0, 32},   /* MHA, head_dim not a multiple of 32 */
    {8, 2, 16, 16, 0, 64},  /* group of 4 over 2 warps */
    {6, 2, 32, 16, 23, 64}, /* sliding window */
    {16, 1, 16, 4, 9, 32},  /* group 16: one query token per prefill tile, short window */
};

/* A random varlen batch: decodes (1 new token), prefill chunks with a
 * cached prefix and whole prompts, over random distinct physical blocks. */
static void
check_attention(const attn_case_t *c, kn_dt_t dt)
{
    int32_t n_seqs = rng_int(1, 4), num_blocks = 64, max_blocks = 12;
    int32_t qs[5], ctx[4], *bt = xcalloc((size_t)n_seqs * max_blocks, sizeof(int32_t));
    int32_t perm[64];
    int32_t n_tok = 0, used = 1; /* block 0 is the null block */
    int32_t qd = c->n_heads * c->hd, kvd = c->n_kv * c->hd;

    for (int32_t i = 0; i < num_blocks; i++) {
        perm[i] = i;
    }
    for (int32_t i = num_blocks - 1; i > 1; i--) {
        int32_t j = rng_int(1, i), tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    qs[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t kind = rng_int(0, 2), n_new;

        ctx[s] = rng_int(1, max_blocks * c->bs < 90 ? max_blocks * c->bs : 90);
        n_new = kind == 0 ? 1 : kind == 1 ? rng_int(1, ctx[s]) : ctx[s];
        qs[s + 1] = qs[s] + n_new;
        for (int32_t b = 0; b < (ctx[s] + c->bs - 1) / c->bs; b++) {
            bt[s * max_blocks + b] = perm[used++];
        }
    }
    n_tok = qs[n_seqs];

    size_t cache_n = (size_t)num_blocks * kvd * c->bs;
    uint16_t *kc = xmalloc(sizeof(uint16_t) * cache_n), *vc = xmalloc(sizeof(uint16_t) * cache_n);
    float *kcf = xmalloc(sizeof(float) * cache_n), *vcf = xmalloc(sizeof(float) * cache_n);
    float *q = xmalloc(sizeof(float) * n_tok * qd);
    uint16_t *out = xmalloc(sizeof(uint16_t) * n_tok * qd);
    float *outf = xmalloc(sizeof(float) * n_tok * qd), *ref = xmalloc(sizeof(float) * n_tok * qd);

    rand16(kc, kcf, cache_n, 1.5f, dt);
    rand16(vc, vcf, cache_n, 1.0f, dt);
    for (int32_t i = 0; i < n_tok * qd; i++) {
        q[i] = rng_f(1.5f);
    }

    kn_attn_cuda_args_t a = {
        out,    q,          kc,      vc,    qs,    ctx,       bt, max_blocks,
        n_seqs, c->n_heads, c->n_kv, c->hd, c->bs, c->window, qd, 1.0f / sqrtf((float)c->hd),
        dt,     NULL,       1,
    };
    kn_attn_args_t r = {
        .out = ref,
        .q = q,
        .k_cache = kcf,
        .v_cache = vcf,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = max_blocks,
        .n_seqs = n_seqs,
        .n_tok = n_tok,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv,
        .head_dim = c->hd,
        .block_size = c->bs,
        .sliding_window = c->window,
        .scale = 1.0f / sqrtf((float)c->hd),
    };
    size_t smem = kn_attn_smem_floats(c->n_heads / c->n_kv, c->hd);

    ck_assert_int_eq(kn_emu_launch(run_attention, &a, c->n_kv, n_tok, c->nthr, smem), 0);
    to_f32(out, outf, (size_t)n_tok * qd, dt);
    kn_cpu_attention_ref(&r);
    double e = nmse(outf, ref, (size_t)n_tok * qd);
    if (!(e < bound16(dt))) {
        fprintf(stderr, "attention %dx%d hd %d bs %d window %d dt %d: NMSE %g\n", c->n_heads,
                c->n_kv, c->hd, c->bs, c->window, dt, e);
    }
    ck_assert_double_lt(e, bound16(dt));

    /* The prefill kernel on the same batch: query tiles within sequences. */
    int32_t tiles[512], n_tiles = 0, q_tile = kn_attn_prefill_q_tile(c->n_heads / c->n_kv);

    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t t0 = qs[s]; t0 < qs[s + 1]; t0 += q_tile) {
            tiles[n_tiles++] = t0;
        }
    }
    memset(out, 0xff, sizeof(uint16_t) * n_tok * qd);
    kn_attn_prefill_args_t pa = {a, tiles, q_tile};
    smem = kn_attn_prefill_smem_floats(q_tile, c->n_heads / c->n_kv, c->hd);
    ck_assert_int_eq(kn_emu_launch(run_attention_prefill, &pa, c->n_kv, n_tiles, c->nthr, smem), 0);
    to_f32(out, outf, (size_t)n_tok * qd, dt);
    e = nmse(outf, ref, (size_t)n_tok * qd);
    if (!(e < bound16(dt))) {
        fprintf(stderr, "prefill attention %dx%d hd %d bs %d window %d dt %d: NMSE %g\n",
                c->n_heads, c->n_kv, c->hd, c->bs, c->window, dt, e);
    }
    ck_assert_double_lt(e, bound16(dt));

    free(bt);
    free(kc);
    free(vc);
    free(kcf);
    free(vcf);
    free(q);
    free(out);
    free(outf);
    free(ref);
}

START_TEST(test_attention)
{
    const attn_case_t *c = &attn_cases[_i % 6];
    kn_dt_t dt = (kn_dt_t)(_i / 6);

    for (int rep = 0; rep < reps(4); rep++) {
        check_attention(c, dt);
    }
}
END_TEST

/* Split-K decode attention (kn_attention_split_body + combine) against
 * the CPU reference: decodes and short chunks over contexts of 1 to 400
 * tokens (sliding window and GQA shapes of attn_cases), every split count
 * of splits[] (most leave splits empty at short contexts), the scratch
 * poisoned with NaN so a partial row no split wrote shows. n_splits 1
 * gives the one-pass kernel's bits. */
static void
check_attention_split(const attn_case_t *c, kn_dt_t dt)
{
    static const int32_t splits[] = {1, 2, 3, 5, 8, 13, 32};
    int32_t n_seqs = rng_int(1, 3), max_blocks = (400 + c->bs - 1) / c->bs;
    int32_t num_blocks = 3 * max_blocks + 1, used = 1;
    int32_t qs[4], ctx[3], *bt = xcalloc((size_t)n_seqs * max_blocks, sizeof(int32_t));
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)num_blocks);
    int32_t qd = c->n_heads * c->hd, kvd = c->n_kv * c->hd, n_tok;

    for (int32_t i = 0; i < num_blocks; i++) {
        perm[i] = i;
    }
    for (int32_t i = num_blocks - 1; i > 1; i--) {
        int32_t j = rng_int(1, i), tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    qs[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t kind = rng_int(0, 3);

        ctx[s] = kind == 0 ? rng_int(1, 33) : rng_int(1, 400);
        qs[s + 1] = qs[s] + (kind == 3 ? rng_int(1, ctx[s] < 4 ? ctx[s] : 4) : 1);
        for (int32_t b = 0; b < (ctx[s] + c->bs - 1) / c->bs; b++) {
            bt[s * max_blocks + b] = perm[used++];
        }
    }
    n_tok = qs[n_seqs];

    size_t cache_n = (size_t)num_blocks * kvd * c->bs, out_n = (size_t)n_tok * qd;
    size_t part_n = out_n / (size_t)c->hd * (size_t)(c->hd + 2) * KN_ATTN_MAX_SPLITS;
    uint16_t *kc = xmalloc(sizeof(uint16_t) * cache_n), *vc = xmalloc(sizeof(uint16_t) * cache_n);
    float *kcf = xmalloc(sizeof(float) * cache_n), *vcf = xmalloc(sizeof(float) * cache_n);
    float *q = xmalloc(sizeof(float) * out_n), *part = xmalloc(sizeof(float) * part_n);
    uint16_t *out = xmalloc(sizeof(uint16_t) * out_n), *one = xmalloc(sizeof(uint16_t) * out_n);
    float *outf = xmalloc(sizeof(float) * out_n), *ref = xmalloc(sizeof(float) * out_n);

    rand16(kc, kcf, cache_n, 1.5f, dt);
    rand16(vc, vcf, cache_n, 1.0f, dt);
    for (size_t i = 0; i < out_n; i++) {
        q[i] = rng_f(1.5f);
    }
    kn_attn_cuda_args_t a = {
        out,    q,          kc,      vc,    qs,    ctx,       bt, max_blocks,
        n_seqs, c->n_heads, c->n_kv, c->hd, c->bs, c->window, qd, 1.0f / sqrtf((float)c->hd),
        dt,     part,       1,
    };
    kn_attn_args_t r = {
        .out = ref,
        .q = q,
        .k_cache = kcf,
        .v_cache = vcf,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = max_blocks,
        .n_seqs = n_seqs,
        .n_tok = n_tok,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv,
        .head_dim = c->hd,
        .block_size = c->bs,
        .sliding_window = c->window,
        .scale = 1.0f / sqrtf((float)c->hd),
    };
    size_t smem = kn_attn_smem_floats(c->n_heads / c->n_kv, c->hd);

    kn_cpu_attention_ref(&r);
    a.out = one;
    ck_assert_int_eq(kn_emu_launch(run_attention, &a, c->n_kv, n_tok, c->nthr, smem), 0);
    a.out = out;
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
        a.n_splits = splits[k];
        for (size_t i = 0; i < part_n; i++) {
            part[i] = NAN;
        }
        memset(out, 0xff, sizeof(uint16_t) * out_n);
        ck_assert_int_eq(kn_emu_launch(run_attention_split, &a, c->n_kv * a.n_splits, n_tok,
                                       c->nthr, smem),
                         0);
        ck_assert_int_eq(kn_emu_launch(run_attention_combine, &a, c->n_heads, n_tok, 32, 0), 0);
        to_f32(out, outf, out_n, dt);
        double e = nmse(outf, ref, out_n);
        if (!(e < bound16(dt))) {
            fprintf(stderr,
                    "split attention %dx%d hd %d bs %d window %d dt %d splits %d ctx %d/%d/%d: "
                    "NMSE %g\n",
                    c->n_heads, c->n_kv, c->hd, c->bs, c->window, dt, a.n_splits, ctx[0],
                    n_seqs > 1 ? ctx[1] : 0, n_seqs > 2 ? ctx[2] : 0, e);
        }
        ck_assert_double_lt(e, bound16(dt));
        if (a.n_splits == 1) {
            ck_assert_mem_eq(out, one, sizeof(uint16_t) * out_n);
        }
    }

    free(bt);
    free(perm);
    free(kc);
    free(vc);
    free(kcf);
    free(vcf);
    free(q);
    free(part);
    free(out);
    free(one);
    free(outf);
    free(ref);
}

START_TEST(test_attention_split)
{
    const attn_case_t *c = &attn_cases[_i % 6];
    kn_dt_t dt = (kn_dt_t)(_i / 6);

    for (int rep = 0; rep < reps(3); rep++) {
        check_attention_split(c, dt);
    }
}
END_TEST

/* The host's split count: about KN_ATTN_SPLIT_BLOCKS blocks, clamped, and
 * the scratch it needs (the largest tokens x splits that still split). */
START_TEST(test_attention_split_count)
{
    ck_assert_int_eq(kn_attn_n_splits(8, 1), 32);  /* 264 / 8 = 33, clamped */
    ck_assert_int_eq(kn_attn_n_splits(8, 2), 17);  /* ceil(264 / 16) */
    ck_assert_int_eq(kn_attn_n_splits(8, 16), 3);  /* ceil(264 / 128) */
    ck_assert_int_eq(kn_attn_n_splits(8, 33), 1);  /* 264 blocks already */
    ck_assert_int_eq(kn_attn_n_splits(32, 4), 3);  /* ceil(264 / 128) */
    ck_assert_int_eq(kn_attn_n_splits(1, 300), 1);
    ck_assert_int_eq(kn_attn_n_splits(0, 0), 1);
    /* 8 KV heads: n_tok x splits peaks at 1 x 32, 2 x 17 = 34, 3 x 11 = 33,
     * 4 x 9 = 36, ..., 32 x 2 = 64 (the last that splits). */
    ck_assert_uint_eq(kn_attn_split_floats(32, 8, 64, 1), 32 * 32 * 66);
    ck_assert_uint_eq(kn_attn_split_floats(32, 8, 64, 2048), 64 * 32 * 66);
    ck_assert_uint_eq(kn_attn_split_floats(32, 8, 64, 4), 36 * 32 * 66);
    ck_assert_uint_eq(kn_attn_split_floats(32, 300, 64, 4), 0);
}
END_TEST

START_TEST(test_kv_write)
{
    kn_dt_t dt = (kn_dt_t)_i;
    int32_t n_tok = 13, n_kv = 2, hd = 24, bs = 4, nb = 10, stride = n_kv * hd + 5;
    size_t cache_n = (size_t)nb * n_kv * bs * hd;
    uint16_t *kc = xcalloc(cache_n, sizeof(uint16_t)), *vc = xcalloc(cache_n, sizeof(uint16_t));
    float *kcf = xcalloc(cache_n, sizeof(float)), *vcf = xcalloc(cache_n, sizeof(float));
    float *kref = xcalloc(cache_n, sizeof(float)), *vref = xcalloc(cache_n, sizeof(float));
    float *k = xmalloc(sizeof(float) * n_tok * stride),
          *v = xmalloc(sizeof(float) * n_tok * stride);
    float *kk = xmalloc(sizeof(float) * n_tok * n_kv * hd);
    float *vv = xmalloc(sizeof(float) * n_tok * n_kv * hd);
    int32_t slot[13], perm[40];

    for (int32_t i = 0; i < nb * bs; i++) {
        perm[i] = i;
    }
    for (int32_t i = nb * bs - 1; i > 0; i--) {
        int32_t j = rng_int(0, i), tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int32_t t = 0; t < n_tok; t++) {
        slot[t] = t % 5 == 4 ? -1 : perm[t];
        for (int32_t i = 0; i < stride; i++) {
            k[t * stride + i] = rng_f(1.0f);
            v[t * stride + i] = rng_f(1.0f);
        }
        for (int32_t i = 0; i < n_kv * hd; i++) {
            /* the reference gets the values rounded as the cache holds them */
            kk[t * n_kv * hd + i] = round16(k[t * stride + i], dt);
            vv[t * n_kv * hd + i] = round16(v[t * stride + i], dt);
        }
    }
    kn_kv_write_args_t a = {kc, vc, k, v, slot, n_kv, hd, bs, stride, dt, NULL};

    ck_assert_int_eq(kn_emu_launch(run_kv_write, &a, n_tok, 1, 32, 0), 0);
    to_f32(kc, kcf, cache_n, dt);
    to_f32(vc, vcf, cache_n, dt);
    kn_cpu_kv_write_ref(kref, vref, kk, vv, slot, n_tok, n_kv, bs, hd);
    ck_assert(memcmp(kcf, kref, sizeof(float) * cache_n) == 0);
    ck_assert(memcmp(vcf, vref, sizeof(float) * cache_n) == 0);
    free(kc);
    free(vc);
    free(kcf);
    free(vcf);
    free(kref);
    free(vref);
    free(k);
    free(v);
    free(kk);
    free(vv);
}
END_TEST

/* ---- the emulator catches misuse ---------------------------------------------- */

static void
body_divergent_sync(const kn_thr_t *t, float *smem, const void *a)
{
    (void)a;
    if (t->tid == 3) {
        return; /* never reaches the barrier */
    }
    smem[t->tid] = 1.0f;
    KN_SYNC(t);
}

static void
body_missing_sync(const kn_thr_t *t, float *smem, const void *a)
{
    float *out = (float *)(uintptr_t)a;

    smem[t->tid] = (float)t->tid;
    /* no KN_SYNC here: a neighbour's slot may still be unwritten (NaN) */
    out[t->tid] = smem[(t->tid + 1) % t->nthr];
}

START_TEST(test_emulator_catches_misuse)
{
    float out[64];

    ck_assert_int_eq(kn_emu_launch(body_divergent_sync, NULL, 1, 1, 32, 32), -1);
    ck_assert_int_eq(kn_emu_launch(body_missing_sync, out, 1, 1, 64, 64), 0);
    ck_assert(isnan(out[0]) || isnan(out[63])); /* stale shared memory is visible */
}
END_TEST

/* ---- KV copy/swap planning ------------------------------------------------------- */

/* Byte offset of block b of region r (layer r / 2, kind r % 2) in a tier
 * of n blocks whose K and V blocks are kb and vb bytes. */
static size_t
plan_off(int32_t r, int32_t n, int32_t b, size_t kb, size_t vb)
{
    return (size_t)(r / 2) * n * (kb + vb) + (size_t)(r % 2) * n * kb +
           (size_t)b * (r % 2 ? vb : kb);
}

/* _i = 0: kn_kvcopy_plan (16-bit pools); 1: kn_kvcopy_plan_kv with K and
 * V blocks of different sizes (quantized pools: the scales differ). */
START_TEST(test_kvcopy_plan)
{
    int32_t n_layers = 3, nb = 20, ns = 12;
    size_t blk = 8, kb = 8, vb = _i == 0 ? 8 : 6; /* bytes */
    size_t dev_n = (size_t)n_layers * nb * (kb + vb), host_n = (size_t)n_layers * ns * (kb + vb);
    uint8_t *dev = xmalloc(dev_n), *host = xmalloc(host_n);
    uint8_t *dev_ref = xmalloc(dev_n), *host_ref = xmalloc(host_n);
    kv_op_t ops[40];
    kn_kvcopy_t *plan = xmalloc(sizeof(*plan) * 40 * 2 * n_layers);

    for (int rep = 0; rep < reps(200); rep++) {
        int32_t n_ops = rng_int(1, 40), n_plan;

        for (size_t i = 0; i < dev_n; i++) {
            dev[i] = dev_ref[i] = (uint8_t)rng_u32();
        }
        for (size_t i = 0; i < host_n; i++) {
            host[i] = host_ref[i] = (uint8_t)rng_u32();
        }
        /* Runs of consecutive blocks, overlapping copies among them. */
        for (int32_t i = 0; i < n_ops; i++) {
            kv_op_kind_t kind = (kv_op_kind_t)rng_int(0, 2);
            int32_t smax = kind == KV_OP_SWAP_IN ? ns : nb, dmax = kind == KV_OP_SWAP_OUT ? ns : nb;

            if (i > 0 && rng_int(0, 2) > 0) {
                kind = ops[i - 1].kind;
                smax = kind == KV_OP_SWAP_IN ? ns : nb;
                dmax = kind == KV_OP_SWAP_OUT ? ns : nb;
            }
            if (i > 0 && kind == ops[i - 1].kind && ops[i - 1].src + 1 < smax &&
                ops[i - 1].dst + 1 < dmax) {
                ops[i] = ops[i - 1];
                ops[i].src++;
                ops[i].dst++;
                continue;
            }
            ops[i].kind = kind;
            ops[i].src = rng_int(0, smax - 1);
            ops[i].dst = rng_int(0, dmax - 1);
        }
        /* Reference: op by op, block by block. */
        for (int32_t i = 0; i < n_ops; i++) {
            for (int32_t r = 0; r < 2 * n_layers; r++) {
                const kv_op_t *o = &ops[i];
                uint8_t *sb = o->kind == KV_OP_SWAP_IN ? host_ref : dev_ref;
                uint8_t *db = o->kind == KV_OP_SWAP_OUT ? host_ref : dev_ref;
                int32_t sn = o->kind == KV_OP_SWAP_IN ? ns : nb;
                int32_t dn = o->kind == KV_OP_SWAP_OUT ? ns : nb;

                memmove(db + plan_off(r, dn, o->dst, kb, vb), sb + plan_off(r, sn, o->src, kb, vb),
                        r % 2 ? vb : kb);
            }
        }
        n_plan = _i == 0 ? kn_kvcopy_plan(ops, n_ops, n_layers, nb, ns, blk, plan)
                         : kn_kvcopy_plan_kv(ops, n_ops, n_layers, nb, ns, kb, vb, plan);
        ck_assert_int_le(n_plan, n_ops * 2 * n_layers);
        for (int32_t i = 0; i < n_plan; i++) {
            uint8_t *sb = plan[i].kind == KV_OP_SWAP_IN ? host : dev;
            uint8_t *db = plan[i].kind == KV_OP_SWAP_OUT ? host : dev;

            /* cudaMemcpyAsync semantics: the ranges of one copy never overlap */
            ck_assert(sb != db || plan[i].src_off + plan[i].bytes <= plan[i].dst_off ||
                      plan[i].dst_off + plan[i].bytes <= plan[i].src_off ||
                      plan[i].src_off == plan[i].dst_off);
            memcpy(db + plan[i].dst_off, sb + plan[i].src_off, plan[i].bytes);
        }
        ck_assert(memcmp(dev, dev_ref, dev_n) == 0);
        ck_assert(memcmp(host, host_ref, host_n) == 0);
    }
    /* A 150-block swap-out run is one range per layer and kind. */
    kv_op_t big[150];
    kn_kvcopy_t *bp = xmalloc(sizeof(*bp) * 150 * 2 * n_layers);
    for (int32_t i = 0; i < 150; i++) {
        big[i] = (kv_op_t){KV_OP_SWAP_OUT, 10 + i, 20 + i};
    }
    ck_assert_int_eq(kn_kvcopy_plan(big, 150, n_layers, 200, 200, blk, bp), 2 * n_layers);
    ck_assert_uint_eq(bp[0].bytes, 150 * blk);
    free(bp);
    free(dev);
    free(host);
    free(dev_ref);
    free(host_ref);
    free(plan);
}
END_TEST


/* ---- quantized KV blocks (KIVI) ------------------------------------------------ */

static void
run_kq_quant(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kq_quant_body(t, smem, a);
}

static void
run_kq_dequant(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kq_dequant_body(t, smem, a);
}

static void
run_kq_res_write(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kq_res_write_body(t, smem, a);
}

static void
run_kq_attention(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kq_attention_body(t, smem, a);
}

static const int kq_fmts[3] = {KN_KQ_FP8, KN_KQ_INT8, KN_KQ_INT4};

/* The device geometry is the CPU layout, for every format and shape. */
START_TEST(test_kq_geometry)
{
    static const int32_t shapes[][3] = {{1, 16, 64}, {2, 16, 32}, {8, 4, 128}, {3, 32, 40},
                                        {1, 1, 8},   {2, 16, 12}, {4, 8, 256}, {1, 16, 6}};

    ck_assert(kvq_ref_fmt_values_match());
    for (int f = 0; f < 3; f++) {
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            kn_kq_geom_t g;
            size_t data = 0, ks = 0, vs = 0;
            int dev = kn_kq_geom_init(&g, kq_fmts[f], shapes[i][0], shapes[i][1], shapes[i][2]);
            int ref = kvq_ref_layout(kq_fmts[f], shapes[i][0], shapes[i][1], shapes[i][2], &data,
                                     &ks, &vs);

            ck_assert_int_eq(dev == 0, ref == 0);
            if (dev == 0) {
                ck_assert_uint_eq(g.data_bytes, data);
                ck_assert_uint_eq(g.k_stride, ks);
                ck_assert_uint_eq(g.v_stride, vs);
            }
        }
    }
    ck_assert_int_ne(kn_kq_geom_init(&(kn_kq_geom_t){0}, KN_KQ_INT4, 1, 16, 12), 0);
}
END_TEST

/* Outlier-heavy K/V rows [n_kv][bs][hd]: a few channels 20-40x larger
 * (keys), a few rows 50x larger (values), constant and all-zero groups,
 * one-sided ranges, tiny values near the f16 / e4m3 subnormals. */
static void
kq_fill(float *x, int32_t n_kv, int32_t bs, int32_t hd, int kind)
{
    int32_t out_ch = rng_int(0, hd - 1), out_row = rng_int(0, bs - 1);
    int style = rng_int(0, 4);

    for (int32_t h = 0; h < n_kv; h++) {
        for (int32_t r = 0; r < bs; r++) {
            for (int32_t d = 0; d < hd; d++) {
                float v = rng_f(1.0f);

                if (kind == 0 && (d == out_ch || d % 13 == 5)) {
                    v *= 20.0f + (float)(d % 3) * 10.0f;
                }
                if (kind == 1 && r == out_row) {
                    v *= 50.0f;
                }
                if (style == 1 && d % 7 == 0) {
                    v = 0.75f; /* constant channel */
                }
                if (style == 2 && r % 5 == 1) {
                    v = 0.0f; /* zero rows */
                }
                if (style == 3) {
                    v = fabsf(v) + 3.0f; /* one-sided, offset */
                }
                if (style == 4 && h == 0) {
                    v *= 1e-5f; /* tiny */
                }
                x[((size_t)h * bs + r) * hd + d] = v;
            }
        }
    }
}

/* The quantize body against kn_kvq_quantize_block, bit for bit (codes,
 * scales, zero points, the untouched pad), full and partial blocks; and
 * the dequantize body against kn_kvq_dequant_rows, float for float. */
START_TEST(test_kq_quantize)
{
    static const int32_t shapes[][3] = {{1, 16, 64}, {2, 16, 32}, {2, 4, 128}, {3, 8, 40},
                                        {1, 1, 8},   {2, 32, 16}, {1, 16, 256}};
    const int fmt = kq_fmts[_i];
    const int32_t n_layers = 2, layer = 1, n_slots = 3, slot = 2, nblk = 4, blk = 3;

    for (int rep = 0; rep < reps(3); rep++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            const int32_t n_kv = shapes[si][0], bs = shapes[si][1], hd = shapes[si][2];
            kn_kq_geom_t g;

            if (kn_kq_geom_init(&g, fmt, n_kv, bs, hd) != 0) {
                continue;
            }
            size_t lk = kn_kq_lk(&g);
            float *res = xmalloc(sizeof(float) * lk * 2 * n_layers * n_slots);
            uint8_t *kp = xmalloc(g.k_stride * nblk), *vp = xmalloc(g.v_stride * nblk);
            uint8_t *ref = xmalloc(g.k_stride > g.v_stride ? g.k_stride : g.v_stride);
            float *deq = xmalloc(sizeof(float) * lk * 2 * n_layers * n_slots);
            float *rows = xmalloc(sizeof(float) * (size_t)bs * hd);
            int32_t n_rows = rep == 0 ? bs : rng_int(0, bs);
            int32_t jobs[3] = {blk, slot, n_rows};

            for (size_t i = 0; i < lk * 2 * n_layers * n_slots; i++) {
                res[i] = NAN; /* only the job's slot layer may be read */
            }
            for (int kind = 0; kind < 2; kind++) {
                kq_fill(res + kn_kq_res_off(&g, slot, n_layers, layer, kind, 0), n_kv, bs, hd,
                        kind);
            }
            memset(kp, 0xa5, g.k_stride * nblk);
            memset(vp, 0xa5, g.v_stride * nblk);
            kn_kq_quant_args_t qa = {kp, vp, res, jobs, 0, 0, 0, n_layers, layer, g};

            ck_assert_int_eq(kn_emu_launch(run_kq_quant, &qa, 1, 2 * n_kv, 32, 0), 0);
            for (int kind = 0; kind < 2; kind++) {
                size_t stride = kind == 0 ? g.k_stride : g.v_stride;
                const uint8_t *got = (kind == 0 ? kp : vp) + (size_t)blk * stride;

                memset(ref, 0xa5, stride);
                kvq_ref_quantize(fmt, n_kv, bs, hd, kind,
                                 res + kn_kq_res_off(&g, slot, n_layers, layer, kind, 0), n_rows,
                                 ref);
                for (size_t i = 0; i < stride; i++) {
                    ck_assert_msg(got[i] == ref[i],
                                  "fmt %d kind %d n_kv %d bs %d hd %d rows %d: byte %zu of %zu "
                                  "(data %zu) is %02x, cpu %02x",
                                  fmt, kind, n_kv, bs, hd, n_rows, i, stride, g.data_bytes,
                                  got[i], ref[i]);
                }
                for (int32_t b = 0; b < blk; b++) { /* other blocks untouched */
                    ck_assert_uint_eq((kind == 0 ? kp : vp)[(size_t)b * stride + stride / 2], 0xa5);
                }
            }
            /* Dequantize into slot 0 of layer 0 and compare with the CPU. */
            kn_kq_dequant_args_t da = {kp, vp, deq, blk, 0, n_layers, 0, g};

            ck_assert_int_eq(kn_emu_launch(run_kq_dequant, &da, n_kv, 2, 32, 0), 0);
            for (int kind = 0; kind < 2; kind++) {
                for (int32_t h = 0; h < n_kv; h++) {
                    const float *got = deq + kn_kq_res_off(&g, 0, n_layers, 0, kind, h);

                    kvq_ref_dequant(fmt, n_kv, bs, hd, kind,
                                    (kind == 0 ? kp + (size_t)blk * g.k_stride
                                               : vp + (size_t)blk * g.v_stride),
                                    h, rows);
                    for (int32_t i = 0; i < bs * hd; i++) {
                        ck_assert_msg(got[i] == rows[i], "dequant fmt %d kind %d: %g vs %g", fmt,
                                      kind, got[i], rows[i]);
                    }
                }
            }
            free(res);
            free(kp);
            free(vp);
            free(ref);
            free(deq);
            free(rows);
        }
    }
    /* The e4m3 codec matches the CPU's on every code and around the
     * rounding boundaries (through the quantizer: scale 1 needs amax 448). */
    for (int c = 0; c < 256; c++) {
        float v = kn_kq_e4m3_dec((uint8_t)c);

        if ((c & 0x7f) != 0x7f) {
            ck_assert_int_eq(kn_kq_e4m3_enc(v), c == 0x80 ? 0x80 : c);
        }
    }
}
END_TEST

/* Quantized paged attention against a naive reference over the
 * dequantized blocks (the CPU dequantizer), with the own block read from
 * the residual rows where the token has a slot: random varlen batches
 * (decodes, chunks with a cached prefix, whole prompts), GQA groups, a
 * sliding window, partial tail blocks, blocks longer than a key tile. */
static void
check_kq_attention(const attn_case_t *c, int fmt)
{
    const int32_t n_layers = 2, layer = 1, max_blocks = 12, num_blocks = 64;
    const int32_t bs = c->bs, hd = c->hd, group = c->n_heads / c->n_kv;
    int32_t n_seqs = rng_int(1, 4), qs[5], ctx[4], perm[64], used = 1, n_tok;
    int32_t *bt = xcalloc((size_t)n_seqs * max_blocks, sizeof(int32_t));
    int32_t *blk_slot = xmalloc(sizeof(int32_t) * num_blocks), n_slots = 0;
    int32_t qd = c->n_heads * hd;
    kn_kq_geom_t g;

    ck_assert_int_eq(kn_kq_geom_init(&g, fmt, c->n_kv, bs, hd), 0);
    for (int32_t i = 0; i < num_blocks; i++) {
        perm[i] = i;
        blk_slot[i] = -1;
    }
    for (int32_t i = num_blocks - 1; i > 1; i--) {
        int32_t j = rng_int(1, i), tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    qs[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t kind = rng_int(0, 2), n_new;

        ctx[s] = rng_int(1, max_blocks * bs < 90 ? max_blocks * bs : 90);
        n_new = kind == 0 ? 1 : kind == 1 ? rng_int(1, ctx[s]) : ctx[s];
        qs[s + 1] = qs[s] + n_new;
        for (int32_t b = 0; b < (ctx[s] + bs - 1) / bs; b++) {
            bt[s * max_blocks + b] = perm[used++];
        }
        /* Blocks the new tokens write hold a residual slot (a decode's
         * block sometimes not: its slot was flushed). */
        for (int32_t b = (ctx[s] - n_new) / bs; b <= (ctx[s] - 1) / bs; b++) {
            if (kind != 0 || rng_int(0, 2) > 0) {
                blk_slot[bt[s * max_blocks + b]] = n_slots++;
            }
        }
    }
    n_tok = qs[n_seqs];

    /* Truth: f32 rows per block; codes quantized from them (rows written
     * so far for a tail block); slots hold the f32 rows. */
    size_t lk = kn_kq_lk(&g), rows_n = (size_t)num_blocks * lk;
    float *kf = xmalloc(sizeof(float) * rows_n), *vf = xmalloc(sizeof(float) * rows_n);
    float *res = xmalloc(sizeof(float) * lk * 2 * n_layers * (size_t)(n_slots > 0 ? n_slots : 1));
    uint8_t *kp = xcalloc((size_t)num_blocks, g.k_stride);
    uint8_t *vp = xcalloc((size_t)num_blocks, g.v_stride);
    float *kdq = xmalloc(sizeof(float) * rows_n), *vdq = xmalloc(sizeof(float) * rows_n);
    float *q = xmalloc(sizeof(float) * (size_t)n_tok * qd);
    uint16_t *out = xmalloc(sizeof(uint16_t) * (size_t)n_tok * qd);
    int32_t *own = xmalloc(sizeof(int32_t) * (size_t)n_tok);

    for (int32_t b = 0; b < num_blocks; b++) {
        kq_fill(kf + (size_t)b * lk, c->n_kv, bs, hd, 0);
        kq_fill(vf + (size_t)b * lk, c->n_kv, bs, hd, 1);
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t bi = 0; bi <= (ctx[s] - 1) / bs; bi++) {
            int32_t b = bt[s * max_blocks + bi];
            int32_t rows = ctx[s] - bi * bs < bs ? ctx[s] - bi * bs : bs;

            kvq_ref_quantize(fmt, c->n_kv, bs, hd, 0, kf + (size_t)b * lk, rows,
                             kp + (size_t)b * g.k_stride);
            kvq_ref_quantize(fmt, c->n_kv, bs, hd, 1, vf + (size_t)b * lk, rows,
                             vp + (size_t)b * g.v_stride);
            for (int32_t h = 0; h < c->n_kv; h++) {
                size_t o = (size_t)b * lk + (size_t)h * bs * hd;

                kvq_ref_dequant(fmt, c->n_kv, bs, hd, 0, kp + (size_t)b * g.k_stride, h, kdq + o);
                kvq_ref_dequant(fmt, c->n_kv, bs, hd, 1, vp + (size_t)b * g.v_stride, h, vdq + o);
            }
            if (blk_slot[b] >= 0) {
                memcpy(res + kn_kq_res_off(&g, blk_slot[b], n_layers, layer, 0, 0),
                       kf + (size_t)b * lk, sizeof(float) * lk);
                memcpy(res + kn_kq_res_off(&g, blk_slot[b], n_layers, layer, 1, 0),
                       vf + (size_t)b * lk, sizeof(float) * lk);
            }
        }
        for (int32_t t = qs[s]; t < qs[s + 1]; t++) {
            int32_t cx = ctx[s] - (qs[s + 1] - t);

            own[t] = blk_slot[bt[s * max_blocks + cx / bs]];
        }
    }
    for (int32_t i = 0; i < n_tok * qd; i++) {
        q[i] = rng_f(1.5f);
    }

    kn_attn_cuda_args_t a = {
        out,    q,          NULL,    NULL, qs, ctx,       bt, max_blocks,
        n_seqs, c->n_heads, c->n_kv, hd,   bs, c->window, qd, 1.0f / sqrtf((float)hd),
        KN_DT_F16, NULL, 1,
    };
    kn_kq_attn_args_t ka = {a, kp, vp, res, own, n_layers, layer, g, NULL, NULL};

    ck_assert_int_eq(kn_emu_launch(run_kq_attention, &ka, c->n_kv, n_tok, c->nthr,
                                   kn_kq_attn_smem_floats(group, hd)),
                     0);

    /* Reference in double: own block from the f32 rows when it has a slot. */
    double num = 0.0, den = 0.0;

    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t t = qs[s]; t < qs[s + 1]; t++) {
            int32_t hi = ctx[s] - (qs[s + 1] - t), lo = 0;

            if (c->window > 0 && hi - c->window + 1 > 0) {
                lo = hi - c->window + 1;
            }
            for (int32_t hq = 0; hq < c->n_heads; hq++) {
                int32_t kh = hq / group;
                double sc[128], mx = -INFINITY, l = 0.0, o[256] = {0};
                const float *qv = q + (size_t)t * qd + (size_t)hq * hd;

                for (int32_t j = lo; j <= hi; j++) {
                    int32_t b = bt[s * max_blocks + j / bs];
                    int use_res = j / bs == hi / bs && own[t] >= 0;
                    const float *kr = (use_res ? kf : kdq) + (size_t)b * lk +
                                      ((size_t)kh * bs + (size_t)(j % bs)) * hd;
                    double d = 0.0;

                    for (int32_t i = 0; i < hd; i++) {
                        d += (double)qv[i] * kr[i];
                    }
                    sc[j - lo] = d / sqrt((double)hd);
                    mx = sc[j - lo] > mx ? sc[j - lo] : mx;
                }
                for (int32_t j = lo; j <= hi; j++) {
                    int32_t b = bt[s * max_blocks + j / bs];
                    int use_res = j / bs == hi / bs && own[t] >= 0;
                    const float *vr = (use_res ? vf : vdq) + (size_t)b * lk +
                                      ((size_t)kh * bs + (size_t)(j % bs)) * hd;
                    double p = exp(sc[j - lo] - mx);

                    l += p;
                    for (int32_t i = 0; i < hd; i++) {
                        o[i] += p * vr[i];
                    }
                }
                for (int32_t i = 0; i < hd; i++) {
                    double r = o[i] / l;
                    double gv = kn_f16_to_f32(out[(size_t)t * qd + (size_t)hq * hd + i]);

                    ck_assert_msg(!isnan(gv), "NaN output");
                    num += (gv - r) * (gv - r);
                    den += r * r;
                }
            }
        }
    }
    if (!(num / den < 1e-6)) {
        fprintf(stderr, "kq attention fmt %d %dx%d hd %d bs %d window %d: NMSE %g\n", fmt,
                c->n_heads, c->n_kv, hd, bs, c->window, num / den);
    }
    ck_assert_double_lt(num / den, 1e-6);

    free(bt);
    free(blk_slot);
    free(kf);
    free(vf);
    free(res);
    free(kp);
    free(vp);
    free(kdq);
    free(vdq);
    free(q);
    free(out);
    free(own);
}

START_TEST(test_kq_attention)
{
    static const attn_case_t cases[] = {
        {6, 2, 32, 16, 0, 64},  /* the default model's shape */
        {4, 1, 64, 4, 0, 128},  /* MQA, small blocks */
        {4, 4, 40, 8, 0, 32},   /* MHA, head_dim not a multiple of 32 */
        {8, 2, 16, 16, 0, 64},  /* group of 4 over 2 warps */
        {6, 2, 32, 16, 23, 64}, /* sliding window */
        {16, 1, 16, 4, 9, 32},  /* group 16, short window */
        {4, 2, 32, 64, 0, 64},  /* blocks of 64: two key tiles per block */
    };

    for (int rep = 0; rep < reps(1); rep++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            check_kq_attention(&cases[i], kq_fmts[_i]);
        }
    }
}
END_TEST

/* The residual write lands each token's K/V row in its slot's layer. */
START_TEST(test_kq_res_write)
{
    kn_kq_geom_t g;
    const int32_t n_layers = 3, layer = 2, n_tok = 5, kvd = 2 * 16;
    int32_t slot[5] = {3 * 8 + 7, -1, 1 * 8 + 0, 5 * 8 + 3, 9 * 8 + 2};
    int32_t res_slot[5] = {1, 0, 0, 2, -1};
    float k[5 * 32], v[5 * 32];

    ck_assert_int_eq(kn_kq_geom_init(&g, KN_KQ_INT8, 2, 8, 16), 0);
    size_t n = kn_kq_lk(&g) * 2 * n_layers * 3;
    float *res = xmalloc(sizeof(float) * n);

    for (size_t i = 0; i < n; i++) {
        res[i] = -7.0f;
    }
    for (int32_t i = 0; i < n_tok * kvd; i++) {
        k[i] = rng_f(1.0f);
        v[i] = rng_f(1.0f);
    }
    kn_kq_res_write_args_t a = {res, k, v, slot, res_slot, n_layers, layer, kvd, g};

    ck_assert_int_eq(kn_emu_launch(run_kq_res_write, &a, n_tok, 1, 32, 0), 0);
    size_t written = 0;

    for (int32_t t = 0; t < n_tok; t++) {
        if (slot[t] < 0 || res_slot[t] < 0) {
            continue;
        }
        for (int32_t h = 0; h < 2; h++) {
            for (int32_t d = 0; d < 16; d++) {
                size_t o = (size_t)(slot[t] % 8) * 16 + d;

                ck_assert(res[kn_kq_res_off(&g, res_slot[t], n_layers, layer, 0, h) + o] ==
                          k[t * kvd + h * 16 + d]);
                ck_assert(res[kn_kq_res_off(&g, res_slot[t], n_layers, layer, 1, h) + o] ==
                          v[t * kvd + h * 16 + d]);
                written += 2;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        written -= res[i] != -7.0f;
    }
    ck_assert_uint_eq(written, 0); /* nothing else was written */
    free(res);
}
END_TEST

/* ---- KV_OP_SHIFT ------------------------------------------------------------------ */

static void
run_kv_rotate(const kn_thr_t *t, float *smem, const void *a)
{
    kn_kv_rotate_body(t, smem, a);
}

/* inv_freq of RoPE theta 10000 with linear scaling by 2 (as a scaled model's). */
static void
shift_inv_freq(float *inv, int32_t hd)
{
    for (int32_t i = 0; i < hd / 2; i++) {
        inv[i] = (float)(pow(10000.0, -2.0 * i / hd) / 2.0);
    }
}

/* The rotate body against the CPU's kn_kvq_rotate_rows, bit for bit: f32
 * rows (a residual slot's keys: n_rows < block) and 16-bit blocks (f16,
 * bf16: the CPU rotation of the decoded rows, rounded to nearest even),
 * over 2 layers with padding between them; nothing else is written. */
START_TEST(test_kv_rotate)
{
    static const int32_t shapes[][4] = {{2, 16, 32, 16}, {1, 4, 64, 3}, {4, 8, 40, 8},
                                        {2, 16, 128, 16}, {3, 32, 8, 17}};
    static const int32_t deltas[] = {1, 7, 64, 1000, 123457};

    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int32_t n_kv = shapes[si][0], bs = shapes[si][1], hd = shapes[si][2];
        const int32_t n_rows = shapes[si][3], n_layers = 2;
        const size_t head_stride = (size_t)bs * hd, layer_stride = n_kv * head_stride + 24;
        const size_t n = layer_stride * n_layers;
        float inv[128], *x = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n);
        uint16_t *x16 = xmalloc(sizeof(uint16_t) * n), *ref16 = xmalloc(sizeof(uint16_t) * n);

        shift_inv_freq(inv, hd);
        for (size_t di = 0; di < sizeof(deltas) / sizeof(deltas[0]); di++) {
            for (int kind = 0; kind < 3; kind++) { /* f32, f16, bf16 */
                kn_dt_t dt = kind == 2 ? KN_DT_BF16 : KN_DT_F16;
                int32_t nr = kind == 0 ? n_rows : bs;
                kn_kv_rotate_args_t a = {kind == 0 ? x : NULL, kind == 0 ? NULL : x16, inv,
                                         layer_stride, head_stride, nr, hd, deltas[di], dt};

                for (size_t i = 0; i < n; i++) {
                    x[i] = rng_f(3.0f);
                    kn_st16(x16, i, x[i], dt);
                    ref16[i] = x16[i];
                    ref[i] = kind == 0 ? x[i] : kn_ld16(x16, i, dt);
                }
                for (int32_t l = 0; l < n_layers; l++) {
                    for (int32_t h = 0; h < n_kv; h++) {
                        float *r = ref + l * layer_stride + h * head_stride;

                        kvq_ref_rotate_rows(r, nr, hd, inv, deltas[di]);
                        for (size_t e = 0; kind != 0 && e < (size_t)nr * hd; e++) {
                            kn_st16(ref16, (size_t)(r - ref) + e, r[e], dt);
                        }
                    }
                }
                ck_assert_int_eq(kn_emu_launch(run_kv_rotate, &a, n_kv, n_layers, 32, 0), 0);
                if (kind == 0) {
                    ck_assert_int_eq(memcmp(x, ref, sizeof(float) * n), 0);
                } else {
                    ck_assert_int_eq(memcmp(x16, ref16, sizeof(uint16_t) * n), 0);
                }
            }
        }
        free(x);
        free(ref);
        free(x16);
        free(ref16);
    }
}
END_TEST

/* Quantized attention over blocks with pending shifts (the query rotated
 * by +shift per block) against the CPU store's attention after the same
 * SHIFT ops: a sequence written in one step, every block after the sink
 * block shifted, all but the first two twice; the tail block partial (its
 * residual rows rotated in place, read as the queries' own block) or full
 * (codes with a pending shift); 1 to 3 query tokens. */
static void
check_kq_shift_attention(const attn_case_t *c, int fmt)
{
    const int32_t bs = c->bs, hd = c->hd, group = c->n_heads / c->n_kv, num_blocks = 40;
    const int32_t n_q = rng_int(1, 3), tail = rng_int(n_q < bs ? n_q : bs, bs);
    const int32_t nb = rng_int(3, 8), ctx = (nb - 1) * bs + tail, qd = c->n_heads * hd;
    const int32_t kvd = c->n_kv * hd, d1 = rng_int(1, 5) * bs, d2 = rng_int(1, 300);
    int32_t table[8], perm[40], *shift = xcalloc(num_blocks, sizeof(int32_t));
    int32_t own[3], n_ops = 0;
    kv_op_t ops[16];
    float inv[128];
    kn_kq_geom_t g;

    ck_assert_int_eq(kn_kq_geom_init(&g, fmt, c->n_kv, bs, hd), 0);
    shift_inv_freq(inv, hd);
    for (int32_t i = 0; i < num_blocks; i++) {
        perm[i] = i;
    }
    for (int32_t i = num_blocks - 1; i > 1; i--) {
        int32_t j = rng_int(1, i), tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int32_t b = 0; b < nb; b++) {
        table[b] = perm[1 + b];
    }
    for (int32_t b = 1; b < nb; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SHIFT, table[b], d1};
    }
    for (int32_t b = 2; b < nb; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SHIFT, table[b], d2};
    }
    float *k = xmalloc(sizeof(float) * (size_t)ctx * kvd), *v = xmalloc(sizeof(float) * ctx * kvd);
    float *q = xmalloc(sizeof(float) * (size_t)n_q * qd), *ref = xmalloc(sizeof(float) * n_q * qd);
    uint8_t *kp = xcalloc(num_blocks, g.k_stride), *vp = xcalloc(num_blocks, g.v_stride);
    float *res = xcalloc(2 * kn_kq_lk(&g), sizeof(float));
    uint16_t *out = xmalloc(sizeof(uint16_t) * (size_t)n_q * qd);

    for (int32_t i = 0; i < ctx * kvd; i++) {
        k[i] = rng_f(2.0f) + (i % hd == 3 ? 4.0f : 0.0f); /* an outlier channel */
        v[i] = rng_f(1.0f);
    }
    for (int32_t i = 0; i < n_q * qd; i++) {
        q[i] = rng_f(1.5f);
    }
    kvq_ref_shift_t rc = {fmt,  c->n_kv, bs,  hd,  c->n_heads, num_blocks,
                          table, ctx,    k,   v,   inv,        q,
                          n_q,   1.0f / sqrtf((float)hd)};
    int residual = kvq_ref_shift_attention(&rc, ops, n_ops, ref, kp, vp, res,
                                           res + kn_kq_lk(&g));

    ck_assert_int_ge(residual, 0);
    ck_assert_int_eq(residual, tail < bs);
    /* The device's pending shifts: blocks holding codes keep theirs. */
    for (int32_t b = 1; b < nb; b++) {
        if (b < nb - 1 || !residual) {
            shift[table[b]] = d1 + (b >= 2 ? d2 : 0);
        }
    }
    for (int32_t t = 0; t < n_q; t++) {
        int32_t cx = ctx - (n_q - t);

        own[t] = residual && cx / bs == nb - 1 ? 0 : -1;
    }
    int32_t qs[2] = {0, n_q};
    kn_attn_cuda_args_t a = {
        out, q,  NULL, NULL, qs,     &ctx,      table,         nb,
        1,   c->n_heads, c->n_kv, hd, bs, 0, qd, 1.0f / sqrtf((float)hd),
        KN_DT_F16, NULL, 1,
    };
    kn_kq_attn_args_t ka = {a, kp, vp, res, own, 1, 0, g, shift, inv};

    ck_assert_int_eq(kn_emu_launch(run_kq_attention, &ka, c->n_kv, n_q, c->nthr,
                                   kn_kq_attn_smem_floats(group, hd)),
                     0);
    double num = 0.0, den = 0.0;

    for (int32_t i = 0; i < n_q * qd; i++) {
        double gv = kn_f16_to_f32(out[i]);

        ck_assert_msg(!isnan(gv), "NaN output");
        num += (gv - ref[i]) * (gv - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    if (!(num / den < 1e-6)) {
        fprintf(stderr, "shifted kq attention fmt %d %dx%d hd %d bs %d: NMSE %g\n", fmt,
                c->n_heads, c->n_kv, hd, bs, num / den);
    }
    ck_assert_double_lt(num / den, 1e-6);
    free(shift);
    free(k);
    free(v);
    free(q);
    free(ref);
    free(kp);
    free(vp);
    free(res);
    free(out);
}

START_TEST(test_kq_shift_attention)
{
    static const attn_case_t cases[] = {
        {6, 2, 32, 16, 0, 64}, /* the default model's shape */
        {4, 1, 64, 4, 0, 128}, /* MQA, small blocks */
        {4, 4, 40, 8, 0, 32},  /* MHA, head_dim not a multiple of 32 */
        {8, 2, 16, 16, 0, 64}, /* group of 4 over 2 warps */
        {4, 2, 32, 64, 0, 64}, /* blocks of 64: two key tiles per block */
    };

    for (int rep = 0; rep < reps(2); rep++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            check_kq_shift_attention(&cases[i], kq_fmts[_i]);
        }
    }
}
END_TEST

/* ---- weight dequantization --------------------------------------------------- */

static void
run_wdequant(const kn_thr_t *t, float *smem, const void *a)
{
    kn_wdequant_body(t, smem, a);
}

/* A random finite f16 (every exponent: zeros, subnormals, outliers up to
 * 65504, either sign), little-endian at p. */
static void
wq_put_f16(uint8_t *p)
{
    uint16_t h = (uint16_t)(rng_u32() & 0xffff);

    if ((h & 0x7c00) == 0x7c00) {
        h = (uint16_t)(h & ~0x4000); /* exponent 31 (inf / NaN) -> 15 */
    }
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Block k of a row of type t: random codes, random finite scales, and
 * scale fields that walk every pattern as k goes: q4_K / q5_K give sub-
 * block j the 6-bit scale (k + 7j) % 64 and min (5k + 3j + 1) % 64 (both
 * halves of the packing), q6_K gives group g the int8 scale k + 16g
 * (every byte at every position over 256 blocks). */
static void
wq_fill_block(kn_wtype_t t, uint8_t *b, int32_t k)
{
    size_t bb = kn_wtype_block_bytes(t);

    for (size_t i = 0; i < bb; i++) {
        b[i] = (uint8_t)rng_u32();
    }
    switch (t) {
    case KN_W_F32: {
        uint32_t u = rng_u32() ^ (rng_u32() << 16);

        if ((u & 0x7f800000u) == 0x7f800000u) {
            u &= ~0x40000000u; /* no inf / NaN */
        }
        memcpy(b, &u, 4);
        break;
    }
    case KN_W_F16:
        wq_put_f16(b);
        break;
    case KN_W_BF16:
        if ((b[1] & 0x7f) == 0x7f && (b[0] & 0x80)) {
            b[1] = (uint8_t)(b[1] & ~0x40);
        }
        break;
    case KN_W_Q8_0:
    case KN_W_Q4_0:
        wq_put_f16(b);
        break;
    case KN_W_Q4_K:
    case KN_W_Q5_K: {
        uint8_t *sc = b + 4;

        wq_put_f16(b);
        wq_put_f16(b + 2);
        memset(sc, 0, 12);
        for (int j = 0; j < 8; j++) {
            int ls = (k + 7 * j) % 64, lm = (5 * k + 3 * j + 1) % 64;

            if (j < 4) {
                sc[j] = (uint8_t)ls;
                sc[j + 4] = (uint8_t)lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        break;
    }
    case KN_W_Q6_K:
        for (int g = 0; g < 16; g++) {
            b[192 + g] = (uint8_t)(k + 16 * g);
        }
        wq_put_f16(b + 208);
        break;
    default:
        break;
    }
}

/* Every weight type, random blocks with every scale pattern, f16 and bf16
 * out: the emulated kernel's 16-bit rows equal kn_dequant_row() then
 * kn_st16() bit for bit, for whole rows and for a column slice of whole
 * blocks read through the full row stride (the upload's two shapes). */
START_TEST(test_wdequant)
{
    kn_wtype_t t = (kn_wtype_t)_i;
    int32_t be = kn_wtype_block_elems(t), nb = 16, rows = 16, cols = nb * be;
    size_t bb = kn_wtype_block_bytes(t), row_bytes = kn_wtype_row_bytes(t, cols);
    uint8_t *w = xmalloc(row_bytes * (size_t)rows);
    float *f = xmalloc(sizeof(float) * (size_t)cols);
    uint16_t *ref = xmalloc(sizeof(uint16_t) * (size_t)rows * cols);
    uint16_t *out = xmalloc(sizeof(uint16_t) * (size_t)rows * cols);

    ck_assert_uint_eq(row_bytes, (size_t)nb * bb);
    for (int32_t k = 0; k < rows * nb; k++) {
        wq_fill_block(t, w + (size_t)k * bb, k);
    }
    for (int dti = 0; dti < 2; dti++) {
        kn_dt_t dt = dti == 0 ? KN_DT_F16 : KN_DT_BF16;
        /* (first block, blocks): whole rows, then a slice */
        static const int32_t shapes[][2] = {{0, 16}, {5, 7}};

        for (int sh = 0; sh < 2; sh++) {
            int32_t b0 = shapes[sh][0], c0 = b0 * be, nc = shapes[sh][1] * be;
            kn_wdequant_args_t a = {.src = w + (size_t)b0 * bb,
                                    .dst = out,
                                    .src_row_bytes = row_bytes,
                                    .n_cols = nc,
                                    .type = t,
                                    .dt = dt};
            size_t n_nonzero = 0;

            for (int32_t r = 0; r < rows; r++) {
                kn_dequant_row(t, w + (size_t)r * row_bytes, f, cols);
                for (int32_t j = 0; j < nc; j++) {
                    kn_st16(ref, (size_t)r * nc + j, f[c0 + j], dt);
                    n_nonzero += (ref[(size_t)r * nc + j] & 0x7fff) != 0;
                }
            }
            memset(out, 0xa5, sizeof(uint16_t) * (size_t)rows * cols);
            ck_assert_int_eq(kn_emu_launch(run_wdequant, &a, rows, 1, 32, 0), 0);
            for (size_t i = 0; i < (size_t)rows * nc; i++) {
                ck_assert_msg(out[i] == ref[i], "%s -> %s, shape %d: element %zu: 0x%04x, want "
                              "0x%04x", kn_wtype_name(t), dt == KN_DT_F16 ? "f16" : "bf16", sh, i,
                              out[i], ref[i]);
            }
            ck_assert_uint_gt(n_nonzero, (size_t)rows * nc / 2); /* not a vacuous test */
        }
    }
    free(w);
    free(f);
    free(ref);
    free(out);
}
END_TEST

Suite *
cuda_emu_suite(void)
{
    Suite *s = suite_create("cuda_emu");
    TCase *tc = tcase_create("kernels");

    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_convert);
    tcase_add_loop_test(tc, test_embed, 0, 2);
    tcase_add_loop_test(tc, test_rmsnorm, 0, 2);
    tcase_add_test(tc, test_rope);
    tcase_add_loop_test(tc, test_bias_silu_add_gather, 0, 2);
    tcase_add_test(tc, test_bias_matches_reference);
    tcase_add_loop_test(tc, test_kv_write, 0, 2);
    tcase_add_loop_test(tc, test_attention, 0, 12);
    tcase_add_loop_test(tc, test_attention_split, 0, 12);
    tcase_add_test(tc, test_attention_split_count);
    tcase_add_test(tc, test_emulator_catches_misuse);
    tcase_add_loop_test(tc, test_kvcopy_plan, 0, 2);
    tcase_add_test(tc, test_kq_geometry);
    tcase_add_test(tc, test_kq_res_write);
    tcase_add_loop_test(tc, test_kq_quantize, 0, 3);
    tcase_add_loop_test(tc, test_kq_attention, 0, 3);
    tcase_add_test(tc, test_kv_rotate);
    tcase_add_loop_test(tc, test_kq_shift_attention, 0, 3);
    tcase_add_loop_test(tc, test_wdequant, 0, KN_W_NTYPES);
    suite_add_tcase(s, tc);
    return s;
}
