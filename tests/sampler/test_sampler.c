/* test_sampler.c - greedy, seeding, sampling statistics, truncation,
 * penalties, bias and logprobs of sampler/.
 *
 * The statistical tests draw 100k tokens with a fixed seed, so they are
 * deterministic; their bound is still the one a chi-square test would use:
 * the statistic is compared with the chi-square quantile at p = 1e-6 for its
 * degrees of freedom (Wilson-Hilferty approximation), which a correct
 * sampler exceeds with probability 1e-6 for a random seed, while a wrong
 * distribution (an off-by-one in truncation, a missing temperature) gives a
 * statistic in the thousands.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "sampler/sampler.h"

#define N_DRAWS 100000

static smp_params_t
params_default(void)
{
    smp_params_t p = {
        .temperature = 1.0f,
        .top_p = 1.0f,
        .top_k = 0,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
    };
    return p;
}

/* Deterministic pseudo-random logits, N(0, scale)-ish, from a fixed seed. */
static void
fill_logits(float *l, int32_t n, uint64_t seed, float scale)
{
    smp_rng_t r;

    smp_rng_seed(&r, seed);
    for (int32_t i = 0; i < n; i++) {
        double u1 = smp_rng_uniform(&r) + 1e-12, u2 = smp_rng_uniform(&r);
        l[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

typedef struct ref_item {
    double v;
    int32_t id;
} ref_item_t;

static int
ref_cmp(const void *a, const void *b)
{
    const ref_item_t *x = a, *y = b;

    if (x->v != y->v) {
        return x->v > y->v ? -1 : 1;
    }
    return x->id - y->id;
}

/* The textbook pipeline with a full sort: softmax(l / T) restricted by
 * top-k, then top-p (keep while the mass before a token is < p), then
 * min-p (prob >= min_p * max prob), renormalized. probs[n] out. */
static void
ref_probs(const float *l, int32_t n, const smp_params_t *p, double *probs)
{
    ref_item_t *it = malloc((size_t)n * sizeof(*it));
    int32_t keep = n;
    double z = 0.0, cum = 0.0, maxp;

    for (int32_t i = 0; i < n; i++) {
        it[i].v = l[i];
        it[i].id = i;
        probs[i] = 0.0;
    }
    qsort(it, (size_t)n, sizeof(*it), ref_cmp);
    if (p->top_k > 0 && p->top_k < n) {
        keep = p->top_k;
        while (keep < n && it[keep].v == it[keep - 1].v) {
            keep++; /* ties with the k-th stay, as in HF and vLLM */
        }
    }
    maxp = it[0].v;
    for (int32_t i = 0; i < keep; i++) {
        it[i].v = exp((it[i].v - maxp) / p->temperature);
        z += it[i].v;
    }
    for (int32_t i = 0; i < keep; i++) {
        it[i].v /= z;
    }
    if (p->top_p < 1.0f) {
        int32_t k = 0;
        while (k < keep && cum < p->top_p) {
            cum += it[k].v;
            k++;
        }
        keep = k;
    }
    maxp = it[0].v;
    z = 0.0;
    for (int32_t i = 0; i < keep; i++) {
        if (it[i].v >= p->min_p * maxp) {
            probs[it[i].id] = it[i].v;
            z += it[i].v;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        probs[i] /= z;
    }
    free(it);
}

/* Chi-square quantile at upper tail 1e-6 (z = 4.753) by Wilson-Hilferty. */
static double
chi2_crit(int dof)
{
    double k = dof, z = 4.753, a = 2.0 / (9.0 * k);

    return k * pow(1.0 - a + z * sqrt(a), 3.0);
}

/* Draws N_DRAWS tokens and checks them against ref_probs(): no token with
 * probability 0 ever comes out, and the chi-square statistic (bins with an
 * expected count below 5 pooled into one) stays under the 1e-6 quantile. */
static void
check_distribution(const float *logits, int32_t n, const smp_params_t *p, uint64_t seed)
{
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_result_t res;
    double *probs = malloc((size_t)n * sizeof(double));
    long *counts = calloc((size_t)n, sizeof(long));
    float *work = malloc((size_t)n * sizeof(float));
    double chi2 = 0.0, pooled_e = 0.0;
    long pooled_o = 0;
    int bins = 0;

    ref_probs(logits, n, p, probs);
    ck_assert_int_eq(smp_ctx_create(n, &c), ST_OK);
    smp_rng_seed(&rng, seed);
    for (int i = 0; i < N_DRAWS; i++) {
        memcpy(work, logits, (size_t)n * sizeof(float));
        ck_assert_int_eq(smp_sample(c, p, &rng, work, NULL, 0, 0, &res), ST_OK);
        ck_assert_int_ge(res.token, 0);
        ck_assert_int_lt(res.token, n);
        counts[res.token]++;
    }
    for (int32_t i = 0; i < n; i++) {
        double e = probs[i] * N_DRAWS;

        if (probs[i] == 0.0) {
            ck_assert_msg(counts[i] == 0, "token %d has probability 0 but was drawn %ld times", i,
                          counts[i]);
            continue;
        }
        if (e < 5.0) {
            pooled_e += e;
            pooled_o += counts[i];
            continue;
        }
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (pooled_e > 0.0) {
        chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        bins++;
    }
    if (bins > 1) {
        ck_assert_msg(chi2 < chi2_crit(bins - 1), "chi2 %.1f over %d bins, bound %.1f", chi2, bins,
                      chi2_crit(bins - 1));
    }
    smp_ctx_destroy(c);
    free(probs);
    free(counts);
    free(work);
}

START_TEST(test_greedy_picks_argmax)
{
    smp_ctx_t *c;
    smp_params_t p = params_default();
    smp_result_t res;
    float l[1000];

    p.temperature = 0.0f;
    ck_assert_int_eq(smp_ctx_create(1000, &c), ST_OK);
    for (int trial = 0; trial < 20; trial++) {
        int32_t best = 0;

        fill_logits(l, 1000, 100 + trial, 3.0f);
        for (int32_t i = 1; i < 1000; i++) {
            if (l[i] > l[best]) {
                best = i;
            }
        }
        ck_assert_int_eq(smp_sample(c, &p, NULL, l, NULL, 0, 0, &res), ST_OK);
        ck_assert_int_eq(res.token, best);
    }
    /* Ties go to the lowest id. */
    for (int32_t i = 0; i < 1000; i++) {
        l[i] = (i == 17 || i == 400 || i == 999) ? 5.0f : 1.0f;
    }
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.token, 17);
    /* A tiny temperature is greedy too, and draws nothing from the RNG. */
    p.temperature = 1e-7f;
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.token, 17);
    smp_ctx_destroy(c);
}
END_TEST

static void
run_sequence(uint64_t seed, int32_t *out, int n_steps, const smp_params_t *p)
{
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_result_t res;
    float l[512];

    ck_assert_int_eq(smp_ctx_create(512, &c), ST_OK);
    smp_rng_seed(&rng, seed);
    for (int s = 0; s < n_steps; s++) {
        fill_logits(l, 512, 7 + (uint64_t)s, 1.0f);
        ck_assert_int_eq(smp_sample(c, p, &rng, l, out, s, 0, &res), ST_OK);
        out[s] = res.token;
    }
    smp_ctx_destroy(c);
}

START_TEST(test_seed_reproducible)
{
    smp_params_t p = params_default();
    int32_t a[64], b[64], d[64];
    int differ = 0;

    p.top_p = 0.95f;
    p.top_k = 100;
    p.frequency_penalty = 0.3f;
    run_sequence(1234, a, 64, &p);
    run_sequence(1234, b, 64, &p);
    run_sequence(1235, d, 64, &p);
    ck_assert_mem_eq(a, b, sizeof(a));
    for (int i = 0; i < 64; i++) {
        differ += a[i] != d[i];
    }
    ck_assert_int_gt(differ, 10);
}
END_TEST

START_TEST(test_rng_known_values)
{
    smp_rng_t r, r2;
    int same = 0;

    /* splitmix64(0) first output is 0xe220a8397b1dcdaf (Vigna's reference). */
    smp_rng_seed(&r, 0);
    ck_assert_uint_eq(r.s[0], 0xe220a8397b1dcdafULL);
    for (int i = 0; i < 1000; i++) {
        double u = smp_rng_uniform(&r);
        ck_assert(u >= 0.0 && u < 1.0);
    }
    smp_rng_seed(&r, 42);
    smp_rng_seed(&r2, 43);
    for (int i = 0; i < 100; i++) {
        same += smp_rng_next(&r) == smp_rng_next(&r2);
    }
    ck_assert_int_eq(same, 0);
}
END_TEST

START_TEST(test_chi2_plain_softmax)
{
    float l[16] = {2.0f, 1.5f, 1.0f,  0.5f, 0.0f, -0.5f, -1.0f, 3.0f,
                   2.5f, 0.2f, -2.0f, 1.1f, 0.9f, 0.1f,  -0.3f, 1.7f};
    smp_params_t p = params_default();

    check_distribution(l, 16, &p, 99);
    p.temperature = 0.6f;
    check_distribution(l, 16, &p, 100);
    p.temperature = 1.8f;
    check_distribution(l, 16, &p, 101);
}
END_TEST

START_TEST(test_chi2_truncations)
{
    float l[3000];
    smp_params_t p = params_default();

    fill_logits(l, 3000, 5, 2.0f);
    p.top_k = 40;
    check_distribution(l, 3000, &p, 1);
    p = params_default();
    p.top_p = 0.6f;
    p.temperature = 0.8f;
    check_distribution(l, 3000, &p, 2);
    p = params_default();
    p.min_p = 0.05f;
    check_distribution(l, 3000, &p, 3);
    p = params_default();
    p.top_k = 200;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.temperature = 1.3f;
    check_distribution(l, 3000, &p, 4);
}
END_TEST

/* Many tokens with the same logit exercise the equal runs of the
 * partitions (top-k and top-p cut inside a run of ties). */
START_TEST(test_chi2_ties)
{
    float l[2000];
    smp_params_t p = params_default();

    for (int32_t i = 0; i < 2000; i++) {
        l[i] = (float)(i % 5);
    }
    p.top_k = 500; /* the 500th is a three: ties keep all 400 threes (HF, vLLM) */
    {
        smp_ctx_t *c;
        smp_rng_t rng;
        smp_result_t res;
        float w[2000];
        int n_four = 0;

        ck_assert_int_eq(smp_ctx_create(2000, &c), ST_OK);
        smp_rng_seed(&rng, 8);
        for (int i = 0; i < 20000; i++) {
            memcpy(w, l, sizeof(w));
            ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
            ck_assert(res.token % 5 >= 3);
            n_four += res.token % 5 == 4;
        }
        /* P(four) = 400e / (400e + 400) = 0.7311; sd over 20000 = 0.0031. */
        ck_assert_msg(fabs(n_four / 20000.0 - 0.73106) < 0.02, "P(four) %.4f", n_four / 20000.0);
        smp_ctx_destroy(c);
    }
    /* top_p = 0.5 needs part of the run of fours only: which of the tied
     * tokens are kept is arbitrary, how many is not (the smallest k with
     * k / Z >= 0.5), and they are drawn uniformly. */
    p = params_default();
    p.top_p = 0.5f;
    {
        smp_ctx_t *c;
        smp_rng_t rng;
        smp_result_t res;
        float w[2000];
        int seen[2000] = {0};
        int distinct = 0, expect;
        double z = 400.0 * (1.0 + exp(-1.0) + exp(-2.0) + exp(-3.0) + exp(-4.0));

        expect = (int)ceil(0.5 * z);
        ck_assert_int_eq(smp_ctx_create(2000, &c), ST_OK);
        smp_rng_seed(&rng, 9);
        for (int i = 0; i < 30000; i++) {
            memcpy(w, l, sizeof(w));
            ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
            ck_assert_int_eq(res.token % 5, 4);
            distinct += seen[res.token]++ == 0;
        }
        ck_assert_int_ge(distinct, expect - 1);
        ck_assert_int_le(distinct, expect + 1);
        smp_ctx_destroy(c);
    }
}
END_TEST

/* Truncation never lets through a token it must exclude, over a 128k
 * vocabulary (the partial-selection paths with big segments). */
START_TEST(test_truncation_excludes)
{
    const int32_t n = 128000;
    float *l = malloc((size_t)n * sizeof(float));
    float *w = malloc((size_t)n * sizeof(float));
    double *probs = malloc((size_t)n * sizeof(double));
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_result_t res;
    smp_params_t cases[4];

    for (int k = 0; k < 4; k++) {
        cases[k] = params_default();
    }
    cases[0].top_k = 50;
    cases[1].top_p = 0.3f;
    cases[1].temperature = 0.5f;
    cases[2].min_p = 0.1f;
    cases[3].top_k = 1000;
    cases[3].top_p = 0.8f;
    cases[3].min_p = 0.01f;
    fill_logits(l, n, 77, 4.0f);
    ck_assert_int_eq(smp_ctx_create(n, &c), ST_OK);
    smp_rng_seed(&rng, 3);
    for (int k = 0; k < 4; k++) {
        int32_t allowed = 0;

        ref_probs(l, n, &cases[k], probs);
        for (int32_t i = 0; i < n; i++) {
            allowed += probs[i] > 0.0;
        }
        ck_assert_int_lt(allowed, n / 10);
        for (int i = 0; i < 300; i++) {
            memcpy(w, l, (size_t)n * sizeof(float));
            ck_assert_int_eq(smp_sample(c, &cases[k], &rng, w, NULL, 0, 0, &res), ST_OK);
            ck_assert_msg(probs[res.token] > 0.0, "case %d drew excluded token %d", k, res.token);
        }
    }
    smp_ctx_destroy(c);
    free(l);
    free(w);
    free(probs);
}
END_TEST

START_TEST(test_top_k_one_is_greedy)
{
    float l[300];
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_result_t res;
    smp_params_t p = params_default();
    int32_t best = 0;

    fill_logits(l, 300, 11, 1.0f);
    for (int32_t i = 1; i < 300; i++) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    p.top_k = 1;
    p.temperature = 5.0f;
    ck_assert_int_eq(smp_ctx_create(300, &c), ST_OK);
    smp_rng_seed(&rng, 1);
    for (int i = 0; i < 100; i++) {
        float w[300];
        memcpy(w, l, sizeof(w));
        ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
        ck_assert_int_eq(res.token, best);
    }
    /* top_p tiny keeps only the best token as well. */
    p = params_default();
    p.top_p = 1e-6f;
    for (int i = 0; i < 100; i++) {
        float w[300];
        memcpy(w, l, sizeof(w));
        ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
        ck_assert_int_eq(res.token, best);
    }
    smp_ctx_destroy(c);
}
END_TEST

START_TEST(test_penalties_and_bias)
{
    smp_ctx_t *c;
    smp_params_t p = params_default();
    smp_result_t res;
    smp_bias_t bias[2] = {{3, 100.0f}, {5, -2.5f}};
    /* prompt: 1 2 2 ; output: 4 4 6 1 */
    int32_t hist[7] = {1, 2, 2, 4, 4, 6, 1};
    float l[8] = {1.0f, 2.0f, -1.0f, 0.5f, 3.0f, 1.0f, -2.0f, 0.25f};
    float orig[8];

    memcpy(orig, l, sizeof(l));
    ck_assert_int_eq(smp_ctx_create(8, &c), ST_OK);

    /* Repetition penalty over prompt and output, once per distinct token. */
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, hist, 7, 3, &res), ST_OK);
    ck_assert_float_eq_tol(l[0], orig[0], 1e-6);
    ck_assert_float_eq_tol(l[1], 1.0f, 1e-6);  /* 2.0 / 2 (seen twice, applied once) */
    ck_assert_float_eq_tol(l[2], -2.0f, 1e-6); /* -1.0 * 2 */
    ck_assert_float_eq_tol(l[4], 1.5f, 1e-6);  /* output token 3.0 / 2 */
    ck_assert_float_eq_tol(l[6], -4.0f, 1e-6);
    ck_assert_float_eq_tol(l[7], orig[7], 1e-6);
    ck_assert_int_eq(res.token, 4);

    /* Presence and frequency: output tokens only (1 counts once: its
     * prompt occurrence is not counted). */
    memcpy(l, orig, sizeof(l));
    p = params_default();
    p.temperature = 0.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, hist, 7, 3, &res), ST_OK);
    ck_assert_float_eq_tol(l[0], orig[0], 1e-6);
    ck_assert_float_eq_tol(l[1], orig[1] - 0.75f, 1e-6);
    ck_assert_float_eq_tol(l[2], orig[2], 1e-6); /* prompt only */
    ck_assert_float_eq_tol(l[4], orig[4] - 1.0f, 1e-6);
    ck_assert_float_eq_tol(l[6], orig[6] - 0.75f, 1e-6);
    ck_assert_float_eq_tol(l[7], orig[7], 1e-6);

    /* The bookkeeping arrays are restored: the same call again with no
     * history changes nothing. */
    memcpy(l, orig, sizeof(l));
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, hist, 0, 0, &res), ST_OK);
    ck_assert_mem_eq(l, orig, sizeof(l));

    /* Logit bias. */
    p = params_default();
    p.temperature = 0.0f;
    p.bias = bias;
    p.n_bias = 2;
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.token, 3);
    ck_assert_float_eq_tol(l[3], 100.5f, 1e-4);
    ck_assert_float_eq_tol(l[5], -1.5f, 1e-6);
    smp_ctx_destroy(c);
}
END_TEST

START_TEST(test_logprobs)
{
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_params_t p = params_default();
    smp_result_t res, res2;
    float l[20], w[20];
    double sum = 0.0;

    fill_logits(l, 20, 21, 2.0f);
    ck_assert_int_eq(smp_ctx_create(20, &c), ST_OK);
    smp_rng_seed(&rng, 5);
    p.n_logprobs = 20;
    memcpy(w, l, sizeof(l));
    ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.n_top, 20);
    for (int i = 0; i < 20; i++) {
        sum += exp(res.top_logprobs[i]);
        ck_assert(res.top_logprobs[i] <= 0.0f);
        if (i > 0) {
            ck_assert(res.top_logprobs[i] <= res.top_logprobs[i - 1]);
        }
        if (res.top_ids[i] == res.token) {
            ck_assert_float_eq_tol(res.top_logprobs[i], res.logprob, 1e-6);
        }
    }
    ck_assert_double_eq_tol(sum, 1.0, 1e-5);
    /* Log-softmax is exact: differences of logprobs are differences of logits. */
    ck_assert_float_eq_tol(res.top_logprobs[0] - res.top_logprobs[5],
                           l[res.top_ids[0]] - l[res.top_ids[5]], 1e-5);

    /* Logprobs come before temperature and truncation. */
    p.n_logprobs = 5;
    p.temperature = 0.3f;
    p.top_k = 2;
    memcpy(w, l, sizeof(l));
    ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res2), ST_OK);
    ck_assert_int_eq(res2.n_top, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(res2.top_ids[i], res.top_ids[i]);
        ck_assert_float_eq_tol(res2.top_logprobs[i], res.top_logprobs[i], 1e-6);
    }
    /* ... but after bias: biasing token 0 to the top shows in the list. */
    {
        smp_bias_t b = {0, 50.0f};
        p.bias = &b;
        p.n_bias = 1;
        p.temperature = 0.0f;
        memcpy(w, l, sizeof(l));
        ck_assert_int_eq(smp_sample(c, &p, NULL, w, NULL, 0, 0, &res2), ST_OK);
        ck_assert_int_eq(res2.token, 0);
        ck_assert_int_eq(res2.top_ids[0], 0);
        ck_assert(res2.logprob > -1e-6f);
    }
    p = params_default();
    p.n_logprobs = 0;
    memcpy(w, l, sizeof(l));
    ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.n_top, 0);
    smp_ctx_destroy(c);
}
END_TEST

START_TEST(test_logprobs_large_vocab_sorted)
{
    const int32_t n = 50000;
    float *l = malloc((size_t)n * sizeof(float));
    smp_ctx_t *c;
    smp_params_t p = params_default();
    smp_result_t res;
    double lse, sum = 0.0, m = -INFINITY;

    fill_logits(l, n, 31, 3.0f);
    l[100] = l[200] = 20.0f; /* a tie at the top: lower id first */
    for (int32_t i = 0; i < n; i++) {
        m = l[i] > m ? l[i] : m;
    }
    for (int32_t i = 0; i < n; i++) {
        sum += exp(l[i] - m);
    }
    lse = m + log(sum);
    ck_assert_int_eq(smp_ctx_create(n, &c), ST_OK);
    p.temperature = 0.0f;
    p.n_logprobs = SMP_MAX_LOGPROBS;
    ck_assert_int_eq(smp_sample(c, &p, NULL, l, NULL, 0, 0, &res), ST_OK);
    ck_assert_int_eq(res.n_top, SMP_MAX_LOGPROBS);
    ck_assert_int_eq(res.token, 100);
    ck_assert_int_eq(res.top_ids[0], 100);
    ck_assert_int_eq(res.top_ids[1], 200);
    for (int i = 0; i < SMP_MAX_LOGPROBS; i++) {
        ck_assert_double_eq_tol(res.top_logprobs[i], l[res.top_ids[i]] - lse, 1e-4);
        if (i > 0) {
            ck_assert(res.top_logprobs[i] <= res.top_logprobs[i - 1]);
        }
    }
    /* No token outside the list beats its last entry. */
    for (int32_t i = 0; i < n; i++) {
        int listed = 0;
        for (int k = 0; k < SMP_MAX_LOGPROBS; k++) {
            listed |= res.top_ids[k] == i;
        }
        if (!listed) {
            ck_assert(l[i] - lse <= res.top_logprobs[SMP_MAX_LOGPROBS - 1] + 1e-6);
        }
    }
    smp_ctx_destroy(c);
    free(l);
}
END_TEST

START_TEST(test_invalid_params)
{
    smp_ctx_t *c;
    smp_params_t p;
    smp_rng_t rng;
    smp_result_t res;
    float l[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    int32_t bad_hist[2] = {1, 4};
    smp_bias_t bad_bias = {9, 1.0f};

    ck_assert_int_eq(smp_ctx_create(0, &c), ST_EINVAL);
    ck_assert_int_eq(smp_ctx_create(4, &c), ST_OK);
    smp_rng_seed(&rng, 1);

    p = params_default();
    p.temperature = -1.0f;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    p = params_default();
    p.top_p = 0.0f;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    p = params_default();
    p.min_p = 1.5f;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    p = params_default();
    p.repetition_penalty = 0.0f;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    p = params_default();
    p.n_logprobs = SMP_MAX_LOGPROBS + 1;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    p = params_default();
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, bad_hist, 2, 0, &res), ST_EINVAL);
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, bad_hist, 1, 2, &res), ST_EINVAL);
    p.bias = &bad_bias;
    p.n_bias = 1;
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    /* Nothing was modified by the refused calls. */
    ck_assert_float_eq(l[3], 3.0f);
    /* Every logit -inf: nothing to sample. */
    p = params_default();
    for (int i = 0; i < 4; i++) {
        l[i] = -INFINITY;
    }
    ck_assert_int_eq(smp_sample(c, &p, &rng, l, NULL, 0, 0, &res), ST_EINVAL);
    /* -inf logits are never drawn; NaN counts as -inf. */
    l[2] = 0.0f;
    l[1] = NAN;
    for (int i = 0; i < 50; i++) {
        float w[4] = {-INFINITY, NAN, 0.0f, -INFINITY};
        ck_assert_int_eq(smp_sample(c, &p, &rng, w, NULL, 0, 0, &res), ST_OK);
        ck_assert_int_eq(res.token, 2);
        ck_assert_float_eq_tol(res.logprob, 0.0f, 1e-6);
    }
    smp_ctx_destroy(c);
    smp_ctx_destroy(NULL);
}
END_TEST

Suite *
sampler_sampler_suite(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    TCase *stat = tcase_create("statistics");

    tcase_add_test(tc, test_greedy_picks_argmax);
    tcase_add_test(tc, test_seed_reproducible);
    tcase_add_test(tc, test_rng_known_values);
    tcase_add_test(tc, test_top_k_one_is_greedy);
    tcase_add_test(tc, test_penalties_and_bias);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_logprobs_large_vocab_sorted);
    tcase_add_test(tc, test_invalid_params);
    suite_add_tcase(s, tc);
    tcase_set_timeout(stat, 120);
    tcase_add_test(stat, test_chi2_plain_softmax);
    tcase_add_test(stat, test_chi2_truncations);
    tcase_add_test(stat, test_chi2_ties);
    tcase_add_test(stat, test_truncation_excludes);
    suite_add_tcase(s, stat);
    return s;
}
