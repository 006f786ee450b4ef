/* smp_ref.c - the scalar reference sampler the tests hold smp_sample to.
 *
 * DESIGN. The same contract and the same numbers as smp_sample, computed
 * the plain way: scalar code, every pass over the whole row whether or not
 * its result is used (max, first index of the max, log-sum-exp, weights),
 * the histogram split as a branch-free pass over every candidate, the
 * top-n logprobs by a scan of every logit, and the draw's block sums one
 * block after another. What the fast path may not change it shares with
 * it or restates exactly: the exp is the kernels' Cephes polynomial, one
 * float operation at a time (no FMA, so each value is bit-identical to a
 * vector lane); the log-sum-exp adds the terms into four float
 * accumulators by index mod 4, flushed into a double every 1024 terms,
 * the order the 4-lane code has always used; the truncation keeps its
 * candidates in the order the histogram and quickselect leave them, which
 * the draw depends on. So for one seed the reference and every fast path
 * must give the same token.
 *
 * Thread: as sampler.h; allocates its scratch per call (tests only).
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "sampler/sampler_int.h"

#define REF_TEMP_EPS 1e-5f
#define REF_KEY_SHIFT 19
#define REF_NBUCKETS 2048
#define REF_BLOCK 64

typedef struct ref_scratch {
    float *v, *v2;
    int32_t *id, *id2;
    uint32_t hist_n[REF_NBUCKETS];
    double hist_m[REF_NBUCKETS];
    double *blk;
} ref_scratch_t;

/* exp(x) for x <= 0: smp__exp4's operations on one float. */
static float
ref_exp(float x)
{
    float t, nf, r, y, scale;
    int32_t n;
    uint32_t bits;

    if (!(x >= -87.0f)) {
        return 0.0f; /* underflow, -inf, NaN */
    }
    t = x * 1.44269504088896341f - 0.5f;
    n = (int32_t)t;
    nf = (float)n;
    r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    bits = (uint32_t)(n + 127) << 23;
    memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
}

/* sum exp((x[i] - max) * inv_t), terms stored in out when not NULL. */
static double
ref_exp_sum(const float *x, float *out, int32_t n, float max, float inv_t)
{
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    double total = 0.0;
    int32_t blocks = 0;

    for (int32_t i = 0; i < n; i++) {
        float e = ref_exp((x[i] - max) * inv_t);

        if (out != NULL) {
            out[i] = e;
        }
        acc[i & 3] += e;
        if ((i & 3) == 3 && ++blocks == 256) {
            for (int k = 0; k < 4; k++) {
                total += acc[k];
                acc[k] = 0.0f;
            }
            blocks = 0;
        }
    }
    for (int k = 0; k < 4; k++) {
        total += acc[k];
    }
    return total;
}

static inline uint32_t
ref_wkey(float w)
{
    uint32_t bits;

    memcpy(&bits, &w, sizeof(bits));
    return bits >> REF_KEY_SHIFT;
}

/* Keys above b compacted to the front of (v, id) (returned count), keys
 * equal to b copied to (v2, id2) (*n_eq), both in index order. */
static int32_t
ref_split(ref_scratch_t *s, int32_t n, uint32_t b, int32_t *n_eq)
{
    int32_t na = 0, ne = 0;

    for (int32_t i = 0; i < n; i++) {
        float w = s->v[i];
        int32_t t = s->id[i];
        uint32_t k = ref_wkey(w);

        s->v[na] = w;
        s->id[na] = t;
        na += k > b;
        s->v2[ne] = w;
        s->id2[ne] = t;
        ne += k == b;
    }
    *n_eq = ne;
    return na;
}

static int32_t
ref_top_k(ref_scratch_t *s, int32_t n, int32_t k)
{
    int32_t above = 0, n_eq, na, r;
    uint32_t b;

    memset(s->hist_n, 0, sizeof(s->hist_n));
    for (int32_t i = 0; i < n; i++) {
        s->hist_n[ref_wkey(s->v[i])]++;
    }
    for (b = REF_NBUCKETS - 1; b > 0; b--) {
        if (above + (int32_t)s->hist_n[b] >= k) {
            break;
        }
        above += (int32_t)s->hist_n[b];
    }
    na = ref_split(s, n, b, &n_eq);
    r = k - na;
    if (r < n_eq) {
        float kth = INFINITY;

        smp__select_top_k(s->v2, s->id2, n_eq, r);
        for (int32_t i = 0; i < r; i++) {
            kth = s->v2[i] < kth ? s->v2[i] : kth;
        }
        for (int32_t i = r; i < n_eq; i++) {
            if (s->v2[i] == kth) {
                float tv = s->v2[r];
                int32_t ti = s->id2[r];

                s->v2[r] = s->v2[i];
                s->id2[r] = s->id2[i];
                s->v2[i] = tv;
                s->id2[i] = ti;
                r++;
            }
        }
    }
    memcpy(s->v + na, s->v2, (size_t)r * sizeof(float));
    memcpy(s->id + na, s->id2, (size_t)r * sizeof(int32_t));
    return na + r;
}

static int32_t
ref_top_p(ref_scratch_t *s, int32_t n, double need)
{
    double mass_above = 0.0;
    int32_t na, n_eq, r;
    uint32_t b;

    memset(s->hist_n, 0, sizeof(s->hist_n));
    memset(s->hist_m, 0, sizeof(s->hist_m));
    for (int32_t i = 0; i < n; i++) {
        uint32_t k = ref_wkey(s->v[i]);

        s->hist_n[k]++;
        s->hist_m[k] += s->v[i];
    }
    for (b = REF_NBUCKETS - 1; b > 0; b--) {
        if (s->hist_n[b] > 0 && mass_above + s->hist_m[b] >= need) {
            break;
        }
        mass_above += s->hist_m[b];
    }
    if (b == 0 && mass_above + s->hist_m[0] < need) {
        return n;
    }
    na = ref_split(s, n, b, &n_eq);
    r = smp__select_mass(s->v2, s->id2, n_eq, need - mass_above);
    memcpy(s->v + na, s->v2, (size_t)r * sizeof(float));
    memcpy(s->id + na, s->id2, (size_t)r * sizeof(int32_t));
    return na + r;
}

static int32_t
ref_pick(ref_scratch_t *s, int32_t n, double u)
{
    int32_t nb = (n + REF_BLOCK - 1) / REF_BLOCK, b, end;
    double total = 0.0, acc = 0.0;

    for (b = 0; b < nb; b++) {
        int32_t lo = b * REF_BLOCK, hi = lo + REF_BLOCK < n ? lo + REF_BLOCK : n;
        float sum = 0.0f;

        for (int32_t i = lo; i < hi; i++) {
            sum += s->v[i];
        }
        s->blk[b] = sum;
        total += sum;
    }
    u *= total;
    for (b = 0; b < nb - 1; b++) {
        if (u < acc + s->blk[b]) {
            break;
        }
        acc += s->blk[b];
    }
    end = b * REF_BLOCK + REF_BLOCK < n ? b * REF_BLOCK + REF_BLOCK : n;
    for (int32_t i = b * REF_BLOCK; i < end; i++) {
        acc += s->v[i];
        if (u < acc && s->v[i] > 0.0f) {
            return i;
        }
    }
    for (int32_t i = end - 1; i > 0; i--) {
        if (s->v[i] > 0.0f) {
            return i;
        }
    }
    return 0;
}

/* Weights, truncation and the draw; returns the token. */
static int32_t
ref_draw(ref_scratch_t *s, const smp_params_t *p, smp_rng_t *rng, const float *logits,
         int32_t vocab, float max)
{
    int32_t n = vocab;
    double total = ref_exp_sum(logits, s->v, n, max, 1.0f / p->temperature);

    for (int32_t i = 0; i < n; i++) {
        s->id[i] = i;
    }
    if (p->top_k > 0 && p->top_k < n) {
        n = ref_top_k(s, n, p->top_k);
        total = 0.0;
        for (int32_t i = 0; i < n; i++) {
            total += s->v[i];
        }
    }
    if (p->top_p < 1.0f) {
        n = ref_top_p(s, n, (double)p->top_p * total);
    }
    if (p->min_p > 0.0f) {
        int32_t kept = 0;

        for (int32_t i = 0; i < n; i++) {
            float w = s->v[i];
            int32_t t = s->id[i];

            s->v[kept] = w;
            s->id[kept] = t;
            kept += w >= p->min_p;
        }
        n = kept;
    }
    return s->id[ref_pick(s, n, smp_rng_uniform(rng))];
}

int
smp__sample_ref(smp_ctx_t *c, const smp_params_t *p, smp_rng_t *rng, float *logits,
                const int32_t *history, int32_t n_hist, int32_t n_prompt, smp_result_t *out)
{
    ref_scratch_t *s;
    int32_t vocab, argmax = 0, n_top = 0, token, top_i[SMP_MAX_LOGPROBS];
    float max = -INFINITY, top_v[SMP_MAX_LOGPROBS];
    double lse;
    bool random;
    int rc;

    if (c == NULL || p == NULL || logits == NULL || out == NULL) {
        return ST_EINVAL;
    }
    rc = smp__check_params(c, p, history, n_hist, n_prompt);
    if (rc != ST_OK) {
        return rc;
    }
    random = p->temperature >= REF_TEMP_EPS;
    if (random && rng == NULL) {
        return ST_EINVAL;
    }
    vocab = smp__ctx_vocab(c);
    smp__apply_bias_penalties(c, p, logits, history, n_hist, n_prompt);

    for (int32_t i = 0; i < vocab; i++) {
        max = logits[i] > max ? logits[i] : max; /* NaN never wins */
    }
    if (!isfinite(max)) {
        return ST_EINVAL;
    }
    while (logits[argmax] != max) {
        argmax++;
    }
    lse = (double)max + log(ref_exp_sum(logits, NULL, vocab, max, 1.0f));
    for (int32_t i = 0; i < vocab && p->n_logprobs > 0; i++) {
        float x = logits[i];
        int32_t pos;

        if (n_top < p->n_logprobs ? !(x >= -INFINITY) : !(x > top_v[n_top - 1])) {
            continue;
        }
        /* Sorted insert: value descending, equal values by id ascending. */
        pos = n_top < p->n_logprobs ? n_top++ : n_top - 1;
        while (pos > 0 && top_v[pos - 1] < x) {
            top_v[pos] = top_v[pos - 1];
            top_i[pos] = top_i[pos - 1];
            pos--;
        }
        top_v[pos] = x;
        top_i[pos] = i;
    }

    token = argmax;
    if (random) {
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            return ST_ENOMEM;
        }
        s->v = malloc((size_t)vocab * sizeof(float));
        s->v2 = malloc((size_t)vocab * sizeof(float));
        s->id = malloc((size_t)vocab * sizeof(int32_t));
        s->id2 = malloc((size_t)vocab * sizeof(int32_t));
        s->blk = malloc(((size_t)vocab / REF_BLOCK + 1) * sizeof(double));
        rc = s->v == NULL || s->v2 == NULL || s->id == NULL || s->id2 == NULL || s->blk == NULL
                 ? ST_ENOMEM
                 : ST_OK;
        if (rc == ST_OK) {
            token = ref_draw(s, p, rng, logits, vocab, max);
        }
        free(s->v);
        free(s->v2);
        free(s->id);
        free(s->id2);
        free(s->blk);
        free(s);
        if (rc != ST_OK) {
            return rc;
        }
    }

    out->token = token;
    out->logprob = (float)((double)logits[token] - lse);
    out->n_top = n_top;
    for (int32_t i = 0; i < n_top; i++) {
        out->top_ids[i] = top_i[i];
        out->top_logprobs[i] = (float)((double)top_v[i] - lse);
    }
    return ST_OK;
}
