/* test_sampler_fast.c - every fast path of sampler/ against the scalar
 * reference (smp_ref.c) and every vector width against the others.
 *
 * The sampler's fast paths (fused greedy argmax, the log-softmax skipped
 * when no logprob is read, 4 / 8 / 16-lane kernels, bitmask scans, split
 * histograms, side-by-side block sums) must not change any output for a
 * given seed: the same token, the same random stream afterwards, the same
 * top ids, logprobs within 1e-5. The cases are random rows (Gaussian,
 * rounded to force ties, with -inf and NaN entries, vocabularies that are
 * and are not multiples of the vector widths) under random temperature,
 * top-k, top-p, min-p, penalties, logit bias and logprob counts.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "sampler/sampler.h"
#include "sampler/sampler_int.h"

static const int32_t k_vocabs[] = {1, 3, 7, 16, 17, 33, 100, 1000, 1027, 4099, 32000};
#define N_VOCABS ((int)(sizeof(k_vocabs) / sizeof(k_vocabs[0])))

/* A random row: kind 0 Gaussian, 1 rounded (many ties), 2 with -inf, 3
 * with NaN, 4 peaked (one large logit). */
static void
make_row(smp_rng_t *g, float *l, int32_t v, int kind)
{
    float sc = (float)(0.1 + 6.0 * smp_rng_uniform(g));

    for (int32_t i = 0; i < v; i++) {
        double u1 = smp_rng_uniform(g) + 1e-12, u2 = smp_rng_uniform(g);
        float x = (float)(sc * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));

        if (kind == 1) {
            x = roundf(x);
        } else if (kind == 2 && smp_rng_next(g) % 5 == 0) {
            x = -INFINITY;
        } else if (kind == 3 && smp_rng_next(g) % 50 == 0) {
            x = NAN;
        }
        l[i] = x;
    }
    if (kind == 4) {
        l[smp_rng_next(g) % (uint64_t)v] = 30.0f;
    }
}

static void
make_params(smp_rng_t *g, int32_t v, smp_params_t *p, smp_bias_t *bias)
{
    static const float temps[] = {0.0f, 1e-6f, 0.3f, 0.7f, 1.0f, 1.5f};
    static const int32_t topks[] = {0, 1, 5, 50, 999, 100000};
    static const float topps[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.1f};
    static const float minps[] = {0.0f, 0.05f, 0.3f};
    static const int32_t lps[] = {0, 0, 1, 5, 20};

    memset(p, 0, sizeof(*p));
    p->temperature = temps[smp_rng_next(g) % 6];
    p->top_k = topks[smp_rng_next(g) % 6];
    p->top_p = topps[smp_rng_next(g) % 5];
    p->min_p = minps[smp_rng_next(g) % 3];
    p->repetition_penalty = smp_rng_next(g) % 3 == 0 ? 1.3f : 1.0f;
    p->presence_penalty = smp_rng_next(g) % 3 == 0 ? 0.5f : 0.0f;
    p->frequency_penalty = smp_rng_next(g) % 3 == 0 ? 0.25f : 0.0f;
    p->n_bias = (int32_t)(smp_rng_next(g) % 5);
    for (int32_t i = 0; i < p->n_bias; i++) {
        bias[i].id = (int32_t)(smp_rng_next(g) % (uint64_t)v);
        bias[i].bias = (float)(smp_rng_uniform(g) * 10.0 - 5.0);
    }
    p->bias = bias;
    p->n_logprobs = lps[smp_rng_next(g) % 5];
    p->no_logprob = (int32_t)(smp_rng_next(g) % 2);
}

/* Equal (both -inf included) or within 1e-5. */
static void
assert_lp_close(float a, float b)
{
    ck_assert_msg(a == b || fabsf(a - b) < 1e-5f, "logprob %g vs reference %g", (double)a,
                  (double)b);
}

/* One case at one width: fast and reference on copies of one row, with
 * one seed, several steps (the random stream goes on between them). */
static void
check_case(smp_isa_t isa, smp_rng_t *g, int cse)
{
    int32_t v = k_vocabs[smp_rng_next(g) % N_VOCABS];
    int kind = (int)(smp_rng_next(g) % 5);
    float *row = malloc((size_t)v * sizeof(float));
    float *a = malloc((size_t)v * sizeof(float)), *b = malloc((size_t)v * sizeof(float));
    int32_t hist[64], n_hist = (int32_t)(smp_rng_next(g) % 64), n_prompt;
    smp_bias_t bias[4];
    smp_params_t p;
    smp_ctx_t *c;
    smp_rng_t rf, rr;

    ck_assert_ptr_nonnull(row);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    make_row(g, row, v, kind);
    make_params(g, v, &p, bias);
    n_prompt = n_hist > 0 ? (int32_t)(smp_rng_next(g) % (uint64_t)(n_hist + 1)) : 0;
    for (int32_t i = 0; i < n_hist; i++) {
        hist[i] = (int32_t)(smp_rng_next(g) % (uint64_t)v);
    }
    ck_assert_int_eq(smp_ctx_create(v, &c), ST_OK);
    ck_assert_int_eq(smp__ctx_set_isa(c, isa), ST_OK);
    smp_rng_seed(&rf, (uint64_t)cse);
    smp_rng_seed(&rr, (uint64_t)cse);
    for (int step = 0; step < 3; step++) {
        smp_result_t fr, rs;
        int rc_f, rc_r;
        int want_lp = !p.no_logprob || p.n_logprobs > 0;

        memcpy(a, row, (size_t)v * sizeof(float));
        memcpy(b, row, (size_t)v * sizeof(float));
        memset(&fr, 0, sizeof(fr));
        memset(&rs, 0, sizeof(rs));
        rc_f = smp_sample(c, &p, &rf, a, hist, n_hist, n_prompt, &fr);
        rc_r = smp__sample_ref(c, &p, &rr, b, hist, n_hist, n_prompt, &rs);
        ck_assert_msg(rc_f == rc_r, "case %d isa %d: rc %d vs %d", cse, isa, rc_f, rc_r);
        if (rc_f != ST_OK) {
            break;
        }
        ck_assert_msg(fr.token == rs.token,
                      "case %d isa %d step %d (vocab %d kind %d T %g k %d p %g min_p %g): "
                      "token %d vs reference %d",
                      cse, isa, step, v, kind, (double)p.temperature, p.top_k, (double)p.top_p,
                      (double)p.min_p, fr.token, rs.token);
        ck_assert(memcmp(&rf, &rr, sizeof(rf)) == 0); /* same draws consumed */
        ck_assert(memcmp(a, b, (size_t)v * sizeof(float)) == 0); /* same in-place edits */
        if (want_lp) {
            assert_lp_close(fr.logprob, rs.logprob);
        } else {
            ck_assert(isnan(fr.logprob));
        }
        ck_assert_int_eq(fr.n_top, rs.n_top);
        for (int32_t i = 0; i < fr.n_top; i++) {
            ck_assert_int_eq(fr.top_ids[i], rs.top_ids[i]);
            assert_lp_close(fr.top_logprobs[i], rs.top_logprobs[i]);
        }
    }
    smp_ctx_destroy(c);
    free(row);
    free(a);
    free(b);
}

START_TEST(test_fast_matches_reference)
{
    int n_isa = 0;

    for (int isa = 0; isa < SMP_ISA_COUNT; isa++) {
        smp_rng_t g;

        if (smp__kern((smp_isa_t)isa) == NULL) {
            continue; /* this CPU lacks it */
        }
        n_isa++;
        smp_rng_seed(&g, 777);
        for (int cse = 0; cse < 1500; cse++) {
            check_case((smp_isa_t)isa, &g, cse);
        }
    }
    ck_assert_int_ge(n_isa, 1);
}
END_TEST

/* Greedy ties at every lane position and in the tail: the lowest id wins
 * at every width, as in the reference. */
START_TEST(test_greedy_ties_lowest_id)
{
    const int32_t v = 77;
    float *row = malloc(v * sizeof(float));
    smp_params_t p = {.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                      .no_logprob = 1};

    ck_assert_ptr_nonnull(row);
    for (int isa = 0; isa < SMP_ISA_COUNT; isa++) {
        smp_ctx_t *c;

        if (smp__kern((smp_isa_t)isa) == NULL) {
            continue;
        }
        ck_assert_int_eq(smp_ctx_create(v, &c), ST_OK);
        ck_assert_int_eq(smp__ctx_set_isa(c, (smp_isa_t)isa), ST_OK);
        for (int32_t first = 0; first < v; first++) {
            for (int32_t second = first; second < v; second += 5) {
                smp_result_t res;

                for (int32_t i = 0; i < v; i++) {
                    row[i] = (float)(i % 7) - 10.0f;
                }
                row[second] = 3.0f;
                row[first] = 3.0f;
                if (first > 0) {
                    row[first - 1] = NAN; /* NaN never wins, nor hides the max */
                }
                ck_assert_int_eq(smp_sample(c, &p, NULL, row, NULL, 0, 0, &res), ST_OK);
                ck_assert_int_eq(res.token, first);
                ck_assert(isnan(res.logprob));
            }
        }
        smp_ctx_destroy(c);
    }
    free(row);
}
END_TEST

/* The kernels give the same bits at every width, and the sum is the
 * reference order (checked through smp_sample's logprob in the test above;
 * here directly against the 4-lane kernel). */
START_TEST(test_kernels_same_bits)
{
    const smp_kern_t *g = smp__kern(SMP_ISA_GENERIC);
    smp_rng_t r;

    smp_rng_seed(&r, 5);
    for (int t = 0; t < 200; t++) {
        int32_t n = 1 + (int32_t)(smp_rng_next(&r) % 5000);
        float *x = malloc((size_t)n * sizeof(float)), *e0 = malloc((size_t)n * sizeof(float));
        float *e1 = malloc((size_t)n * sizeof(float));
        float inv_t = (float)(0.2 + 3.0 * smp_rng_uniform(&r));

        ck_assert_ptr_nonnull(x);
        ck_assert_ptr_nonnull(e0);
        ck_assert_ptr_nonnull(e1);
        make_row(&r, x, n, (int)(smp_rng_next(&r) % 5));
        for (int isa = 1; isa < SMP_ISA_COUNT; isa++) {
            const smp_kern_t *k = smp__kern((smp_isa_t)isa);
            int32_t a0, a1;
            float m0, m1, th = (float)(smp_rng_uniform(&r) * 4.0 - 2.0);
            double s0, s1;

            if (k == NULL) {
                continue;
            }
            m0 = g->argmax(x, n, &a0);
            m1 = k->argmax(x, n, &a1);
            ck_assert(m0 == m1 || (isinf(m0) && isinf(m1)));
            ck_assert_int_eq(a0, a1);
            ck_assert(g->max(x, n) == k->max(x, n) || !isfinite(m0));
            if (!isfinite(m0)) {
                continue;
            }
            s0 = g->exp_pass(x, e0, n, m0, inv_t, 1, NULL);
            s1 = k->exp_pass(x, e1, n, m0, inv_t, 1, NULL);
            ck_assert(s0 == s1);
            ck_assert(memcmp(e0, e1, (size_t)n * sizeof(float)) == 0);
            for (int32_t from = 0; from < n; from += 1 + n / 7) {
                int32_t want = from;

                while (want < n && !(x[want] >= th)) {
                    want++;
                }
                ck_assert_int_eq(k->find_ge(x, from, n, th), want);
                ck_assert_int_eq(g->find_ge(x, from, n, th), want);
            }
            for (int32_t base = 0; base < n; base += 64) {
                int32_t len = n - base < 64 ? n - base : 64;
                uint64_t want = 0;

                for (int32_t i = 0; i < len; i++) {
                    want |= (uint64_t)(x[base + i] >= th) << i;
                }
                ck_assert(k->mask_ge(x + base, len, th) == want);
                ck_assert(g->mask_ge(x + base, len, th) == want);
            }
        }
        free(x);
        free(e0);
        free(e1);
    }
}
END_TEST

/* no_logprob only drops the sampled token's logprob: with top logprobs
 * asked it is still reported, and the token never changes. */
START_TEST(test_no_logprob_same_token)
{
    const int32_t v = 5000;
    float *row = malloc(v * sizeof(float)), *w = malloc(v * sizeof(float));
    smp_ctx_t *c;
    smp_rng_t g;

    ck_assert_ptr_nonnull(row);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(smp_ctx_create(v, &c), ST_OK);
    smp_rng_seed(&g, 9);
    make_row(&g, row, v, 0);
    for (int t = 0; t < 4; t++) {
        smp_params_t p = {.temperature = t < 2 ? 0.0f : 0.8f, .top_p = 0.9f,
                          .repetition_penalty = 1.0f, .n_logprobs = t % 2 ? 3 : 0};
        smp_result_t r0, r1;
        smp_rng_t a, b;

        smp_rng_seed(&a, 3);
        smp_rng_seed(&b, 3);
        memcpy(w, row, v * sizeof(float));
        ck_assert_int_eq(smp_sample(c, &p, &a, w, NULL, 0, 0, &r0), ST_OK);
        p.no_logprob = 1;
        memcpy(w, row, v * sizeof(float));
        ck_assert_int_eq(smp_sample(c, &p, &b, w, NULL, 0, 0, &r1), ST_OK);
        ck_assert_int_eq(r0.token, r1.token);
        ck_assert(isfinite(r0.logprob));
        if (p.n_logprobs > 0) {
            ck_assert_float_eq(r0.logprob, r1.logprob);
            ck_assert_int_eq(r1.n_top, 3);
        } else {
            ck_assert(isnan(r1.logprob));
        }
    }
    smp_ctx_destroy(c);
    free(row);
    free(w);
}
END_TEST

Suite *
sampler_fast_suite(void)
{
    Suite *s = suite_create("sampler_fast");
    TCase *tc = tcase_create("fast");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_fast_matches_reference);
    tcase_add_test(tc, test_greedy_ties_lowest_id);
    tcase_add_test(tc, test_kernels_same_bits);
    tcase_add_test(tc, test_no_logprob_same_token);
    suite_add_tcase(s, tc);
    return s;
}
