/* test_kernels.c - every fast CPU kernel against its naive reference, at
 * every ISA level this CPU supports, with several thread counts and with
 * shapes on both sides of the parallel thresholds. */
#include <check.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static float
frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *
rand_buf(size_t n, float scale)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));

    for (size_t i = 0; i < n; i++) {
        p[i] = frand() * scale;
    }
    return p;
}

/* max |a - b| / max |b|: a norm-relative error that ignores tiny entries. */
static double
rel_err(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 1e-12;

    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);

        ck_assert_msg(isfinite(a[i]), "non-finite output at %zu", i);
        num = d > num ? d : num;
        den = fabs(b[i]) > den ? fabs(b[i]) : den;
    }
    return num / den;
}

/* Runs body once per supported ISA and thread count (1 and 2). */
#define FOR_EACH_ISA(body)                                                                         \
    do {                                                                                           \
        kn_cpu_init(0);                                                                            \
        for (int isa_ = 0; isa_ <= (int)kn_cpu_isa_best(); isa_++) {                               \
            ck_assert_int_eq(kn_cpu_set_isa((kn_isa_t)isa_), ST_OK);                               \
            for (int nt_ = 1; nt_ <= 2; nt_++) {                                                   \
                kn_cpu_init(nt_);                                                                  \
                body;                                                                              \
            }                                                                                      \
        }                                                                                          \
        kn_cpu_set_isa(kn_cpu_isa_best());                                                         \
    } while (0)

START_TEST(test_isa_detect)
{
    kn_cpu_init(0);
    ck_assert_int_ge(kn_cpu_threads(), 1);
    ck_assert_int_eq(kn_cpu_isa(), kn_cpu_isa_best());
    ck_assert_str_eq(kn_isa_name(KN_ISA_GENERIC), "generic");
    if (kn_cpu_isa_best() < KN_ISA_AVX512) {
        ck_assert_int_eq(kn_cpu_set_isa(KN_ISA_AVX512), ST_EUNSUPPORTED);
        ck_assert_int_eq(kn_cpu_isa(), kn_cpu_isa_best());
    }
}
END_TEST

static void
check_matmul(int32_t n_tok, int32_t d_in, int32_t d_out, int with_bias, int accumulate)
{
    float *x = rand_buf((size_t)n_tok * d_in, 1.0f);
    float *w = rand_buf((size_t)d_out * d_in, 0.1f);
    float *bias = with_bias ? rand_buf((size_t)d_out, 1.0f) : NULL;
    float *y0 = rand_buf((size_t)n_tok * d_out, 1.0f);
    float *y1 = malloc(sizeof(float) * (size_t)n_tok * d_out);
    float *y2 = malloc(sizeof(float) * (size_t)n_tok * d_out);

    memcpy(y1, y0, sizeof(float) * (size_t)n_tok * d_out);
    kn_cpu_matmul_ref(x, w, bias, y1, n_tok, d_in, d_out, accumulate);
    FOR_EACH_ISA({
        memcpy(y2, y0, sizeof(float) * (size_t)n_tok * d_out);
        kn_cpu_matmul(x, w, bias, y2, n_tok, d_in, d_out, accumulate);
        double e = rel_err(y2, y1, (size_t)n_tok * d_out);
        ck_assert_msg(e < 1e-5, "matmul %dx%dx%d bias %d acc %d: err %g", n_tok, d_in, d_out,
                      with_bias, accumulate, e);
    });
    free(x);
    free(w);
    free(bias);
    free(y0);
    free(y1);
    free(y2);
}

/* The lowest SMT sibling of cpu, from sysfs (cpu itself when unknown). */
static int
sibling0(int cpu)
{
    char path[96];
    FILE *f;
    int s = cpu;

    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
             cpu);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &s) != 1) {
            s = cpu;
        }
        fclose(f);
    }
    return s;
}

/* The default thread count follows the affinity mask, one per core: one
 * CPU gives 1, two CPUs of different cores give 2, the whole mask at most
 * its CPU count. */
START_TEST(test_default_threads)
{
    cpu_set_t all, one;
    int first = -1, other = -1;

    ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
    kn_cpu_init(0);
    ck_assert_int_ge(kn_cpu_threads(), 1);
    ck_assert_int_le(kn_cpu_threads(), CPU_COUNT(&all));
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &all)) {
            continue;
        }
        if (first < 0) {
            first = c;
        } else if (other < 0 && sibling0(c) != sibling0(first)) {
            other = c;
        }
    }
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
    kn_cpu_init(0);
    ck_assert_int_eq(kn_cpu_threads(), 1);
    if (other >= 0) {
        CPU_SET(other, &one);
        ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
        kn_cpu_init(0);
        ck_assert_int_eq(kn_cpu_threads(), 2);
    }
    ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
    kn_cpu_init(2);
    ck_assert_int_eq(kn_cpu_threads(), 2);
}
END_TEST

START_TEST(test_matmul)
{
    check_matmul(1, 64, 48, 0, 0);
    check_matmul(1, 192, 1024, 1, 0);
    check_matmul(3, 37, 29, 1, 1);
    check_matmul(16, 192, 512, 0, 1);
    check_matmul(1, 576, 1536, 1, 1); /* above the parallel threshold, gemv */
    check_matmul(40, 256, 300, 1, 0); /* parallel gemm, ragged rows */
    /* The few-row GEMM (2..8 rows): odd tokens, ragged row tiles, parallel. */
    check_matmul(2, 576, 1536, 1, 1);
    check_matmul(5, 64, 37, 0, 0);
    check_matmul(7, 33, 130, 1, 1);
    check_matmul(8, 192, 1024, 1, 0);
}
END_TEST

START_TEST(test_rmsnorm)
{
    int32_t shapes[][2] = {{1, 192}, {7, 33}, {64, 576}, {300, 256}};

    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int32_t n = shapes[k][0], d = shapes[k][1];
        float *x = rand_buf((size_t)n * d, 3.0f), *w = rand_buf((size_t)d, 1.0f);
        float *y1 = malloc(sizeof(float) * (size_t)n * d),
              *y2 = malloc(sizeof(float) * (size_t)n * d);

        kn_cpu_rmsnorm_ref(x, w, y1, n, d, 1e-5f);
        FOR_EACH_ISA({
            kn_cpu_rmsnorm(x, w, y2, n, d, 1e-5f);
            ck_assert_msg(rel_err(y2, y1, (size_t)n * d) < 1e-5, "rmsnorm %dx%d", n, d);
            /* in place */
            memcpy(y2, x, sizeof(float) * (size_t)n * d);
            kn_cpu_rmsnorm(y2, w, y2, n, d, 1e-5f);
            ck_assert(rel_err(y2, y1, (size_t)n * d) < 1e-5);
        });
        free(x);
        free(w);
        free(y1);
        free(y2);
    }
}
END_TEST

START_TEST(test_rope)
{
    int32_t cases[][3] = {{1, 6, 32}, {5, 9, 64}, {200, 4, 128}, {3, 2, 18}};
    kn_rope_params_t p = {.theta = 10000.0f};

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int32_t n = cases[k][0], nh = cases[k][1], hd = cases[k][2], half = hd / 2;
        size_t len = (size_t)n * nh * hd;
        float *x = rand_buf(len, 1.0f), *x1 = malloc(sizeof(float) * len);
        float *x2 = malloc(sizeof(float) * len), *inv = malloc(sizeof(float) * (size_t)half);
        float *c = malloc(sizeof(float) * (size_t)n * half),
              *s = malloc(sizeof(float) * (size_t)n * half);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);

        p.head_dim = hd;
        p.theta = k == 2 ? 500000.0f : 10000.0f;
        kn_cpu_rope_inv_freq(&p, inv);
        for (int32_t t = 0; t < n; t++) {
            pos[t] = (t * 37 + 5) % 4000;
        }
        memcpy(x1, x, sizeof(float) * len);
        kn_cpu_rope_ref(x1, pos, n, nh, hd, inv);
        FOR_EACH_ISA({
            memcpy(x2, x, sizeof(float) * len);
            kn_cpu_rope_table(pos, n, inv, half, c, s);
            kn_cpu_rope(x2, n, nh, hd, c, s);
            ck_assert_msg(rel_err(x2, x1, len) < 1e-5, "rope case %zu", k);
        });
        free(x);
        free(x1);
        free(x2);
        free(inv);
        free(c);
        free(s);
        free(pos);
    }
}
END_TEST

START_TEST(test_rope_scaling)
{
    float base[64], lin[64], l3[64];
    kn_rope_params_t p = {.head_dim = 128, .theta = 500000.0f};

    kn_cpu_rope_inv_freq(&p, base);
    ck_assert(fabsf(base[0] - 1.0f) < 1e-7f);
    ck_assert(fabs(base[1] - pow(500000.0, -2.0 / 128.0)) < 1e-7);
    p.scaling = KN_ROPE_LINEAR;
    p.factor = 4.0f;
    kn_cpu_rope_inv_freq(&p, lin);
    for (int i = 0; i < 64; i++) {
        ck_assert(fabsf(lin[i] - base[i] / 4.0f) <= 1e-6f * base[i]);
    }
    /* Llama 3.1: factor 8, low 1, high 4, original context 8192. */
    p.scaling = KN_ROPE_LLAMA3;
    p.factor = 8.0f;
    p.low_freq_factor = 1.0f;
    p.high_freq_factor = 4.0f;
    p.orig_max_pos = 8192;
    kn_cpu_rope_inv_freq(&p, l3);
    for (int i = 0; i < 64; i++) {
        double wl = 2.0 * 3.14159265358979323846 / base[i];

        if (wl < 8192.0 / 4.0) {
            ck_assert(l3[i] == base[i]); /* high frequency */
        } else if (wl > 8192.0) {
            ck_assert(fabsf(l3[i] - base[i] / 8.0f) <= 1e-6f * base[i]); /* low frequency */
        } else {
            ck_assert(l3[i] < base[i] && l3[i] > base[i] / 8.0f); /* smoothed band */
        }
    }
}
END_TEST

START_TEST(test_kv_write)
{
    const int32_t nkv = 3, bs = 5, hd = 16, nblk = 9, n = 11;
    size_t csz = (size_t)nblk * nkv * bs * hd;
    float *k = rand_buf((size_t)n * nkv * hd, 1.0f), *v = rand_buf((size_t)n * nkv * hd, 1.0f);
    float *kc1 = calloc(csz, sizeof(float)), *vc1 = calloc(csz, sizeof(float));
    float *kc2 = calloc(csz, sizeof(float)), *vc2 = calloc(csz, sizeof(float));
    int32_t slot[11] = {7, 8, 9, 40, 41, 3, -1, 44, 12, 0, 21};

    kn_cpu_kv_write_ref(kc1, vc1, k, v, slot, n, nkv, bs, hd);
    kn_cpu_kv_write(kc2, vc2, k, v, slot, n, nkv, bs, hd);
    ck_assert(memcmp(kc1, kc2, csz * sizeof(float)) == 0);
    ck_assert(memcmp(vc1, vc2, csz * sizeof(float)) == 0);
    /* Slot 41 = block 8, offset 1; token 4, KV head 2. */
    ck_assert(kc1[((8 * nkv + 2) * bs + 1) * hd + 3] == k[(4 * nkv + 2) * hd + 3]);
    free(k);
    free(v);
    free(kc1);
    free(vc1);
    free(kc2);
    free(vc2);
}
END_TEST

/* A batch of sequences with random non-contiguous block tables. */
static void
check_attention(int32_t n_seqs, const int32_t *n_new, const int32_t *ctx, int32_t nh, int32_t nkv,
                int32_t hd, int32_t bs, int32_t window)
{
    int32_t max_blocks = 0, n_tok = 0, nblk;
    int32_t qs[17], *bt;

    qs[0] = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t nb = (ctx[s] + bs - 1) / bs;

        max_blocks = nb > max_blocks ? nb : max_blocks;
        n_tok += n_new[s];
        qs[s + 1] = n_tok;
    }
    nblk = n_seqs * max_blocks + 1;
    bt = malloc(sizeof(int32_t) * (size_t)n_seqs * max_blocks);
    /* A random permutation of blocks 1..nblk-1 shared out to the seqs. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nblk);
    for (int32_t i = 0; i < nblk; i++) {
        perm[i] = i;
    }
    for (int32_t i = nblk - 1; i > 1; i--) {
        int32_t j = 1 + (int32_t)((frand() + 1.0f) * 0.5f * (float)i) % i;
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int32_t i = 0; i < n_seqs * max_blocks; i++) {
        bt[i] = perm[1 + i];
    }
    size_t csz = (size_t)nblk * nkv * bs * hd, qsz = (size_t)n_tok * nh * hd;
    float *kc = rand_buf(csz, 1.0f), *vc = rand_buf(csz, 1.0f), *q = rand_buf(qsz, 1.0f);
    float *o1 = malloc(sizeof(float) * qsz), *o2 = malloc(sizeof(float) * qsz);
    kn_attn_args_t a = {
        .q = q,
        .k_cache = kc,
        .v_cache = vc,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = max_blocks,
        .n_seqs = n_seqs,
        .n_tok = n_tok,
        .n_heads = nh,
        .n_kv_heads = nkv,
        .head_dim = hd,
        .block_size = bs,
        .sliding_window = window,
        .scale = 1.0f / sqrtf((float)hd),
    };

    a.out = o1;
    kn_cpu_attention_ref(&a);
    a.out = o2;
    FOR_EACH_ISA({
        memset(o2, 0xff, sizeof(float) * qsz);
        kn_cpu_attention(&a);
        double e = rel_err(o2, o1, qsz);
        ck_assert_msg(e < 1e-5, "attention nh %d nkv %d hd %d bs %d: err %g", nh, nkv, hd, bs, e);
    });
    free(bt);
    free(perm);
    free(kc);
    free(vc);
    free(q);
    free(o1);
    free(o2);
}

START_TEST(test_attention_decode)
{
    int32_t n_new[] = {1}, ctx[] = {77};

    check_attention(1, n_new, ctx, 6, 2, 32, 16, 0);
    check_attention(1, n_new, ctx, 8, 1, 64, 16, 0); /* MQA */
    check_attention(1, n_new, ctx, 4, 4, 128, 7, 0); /* MHA, odd block size */
    check_attention(1, n_new, ctx, 4, 2, 40, 32, 0); /* head_dim not a multiple of 16 */
}
END_TEST

START_TEST(test_attention_mixed_batch)
{
    /* Two prefill chunks (one continuing a cached prefix) and three decodes. */
    int32_t n_new[] = {20, 1, 13, 1, 1}, ctx[] = {20, 50, 45, 3, 200};

    check_attention(5, n_new, ctx, 9, 3, 64, 16, 0);
    check_attention(5, n_new, ctx, 32, 2, 32, 5, 0);  /* group of 16 query heads */
    check_attention(5, n_new, ctx, 6, 2, 32, 16, 17); /* sliding window */
}
END_TEST

START_TEST(test_attention_long_prefill)
{
    int32_t n_new[] = {300}, ctx[] = {300};

    check_attention(1, n_new, ctx, 6, 2, 32, 16, 0);
}
END_TEST

START_TEST(test_elementwise)
{
    size_t sizes[] = {1, 17, 512, 100003};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *g = rand_buf(n, 12.0f), *u = rand_buf(n, 2.0f);
        float *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);

        if (n > 2) {
            g[0] = -100.0f; /* exp clamp */
            g[1] = 95.0f;
        }
        kn_cpu_silu_mul_ref(g, u, o1, n);
        FOR_EACH_ISA({
            kn_cpu_silu_mul(g, u, o2, n);
            ck_assert_msg(rel_err(o2, o1, n) < 1e-6, "silu_mul %zu", n);
            memcpy(o2, g, sizeof(float) * n);
            kn_cpu_silu_mul(o2, u, o2, n); /* out == gate */
            ck_assert(rel_err(o2, o1, n) < 1e-6);
        });
        memcpy(o1, g, sizeof(float) * n);
        kn_cpu_add_ref(o1, u, n);
        FOR_EACH_ISA({
            memcpy(o2, g, sizeof(float) * n);
            kn_cpu_add(o2, u, n);
            ck_assert(memcmp(o1, o2, sizeof(float) * n) == 0);
        });
        free(g);
        free(u);
        free(o1);
        free(o2);
    }
}
END_TEST

START_TEST(test_embed)
{
    float *table = rand_buf(50 * 24, 1.0f), o1[5 * 24], o2[5 * 24];
    int32_t toks[5] = {0, 49, 7, 7, 23};

    kn_cpu_embed_ref(table, toks, 5, 24, o1);
    kn_cpu_embed(table, toks, 5, 24, o2);
    ck_assert(memcmp(o1, o2, sizeof(o1)) == 0);
    ck_assert(o1[24 + 3] == table[49 * 24 + 3]);
    free(table);
}
END_TEST

Suite *
kernels_cpu_suite(void)
{
    Suite *s = suite_create("kernels_cpu");
    TCase *tc = tcase_create("cpu");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_isa_detect);
    tcase_add_test(tc, test_default_threads);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rope_scaling);
    tcase_add_test(tc, test_kv_write);
    tcase_add_test(tc, test_attention_decode);
    tcase_add_test(tc, test_attention_mixed_batch);
    tcase_add_test(tc, test_attention_long_prefill);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_embed);
    suite_add_tcase(s, tc);
    return s;
}
