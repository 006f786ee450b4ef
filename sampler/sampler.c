/* sampler.c - logits row -> token: bias, penalties, greedy or truncated
 * random sampling, logprobs.
 *
 * DESIGN. Everything vocabulary-sized lives in the smp_ctx_t and is
 * allocated once; smp_sample() allocates nothing and works on the caller's
 * row in place (the engine hands it the runtime's logits row, no copy).
 * One call is a few linear passes over the row, each only when needed:
 *
 *   1. bias and penalties, in place on logits[] (penalty bookkeeping walks
 *      the history, never the vocabulary: a count array is incremented over
 *      the output tokens and decremented back afterwards);
 *   2. greedy: one fused max / argmax pass (ties -> lowest id), and nothing
 *      else unless a logprob is wanted. Random: one max pass;
 *   3. the log-sum-exp pass (exp in vector code) only when the caller reads
 *      a logprob (smp_params_t.no_logprob) or at T = 1, where its terms are
 *      the sampling weights; the top-n logprobs scan skips, a vector at a
 *      time, everything not above the n-th best so far;
 *   4. random: weights exp((l - max) / T) for the whole row (the best token
 *      has weight exactly 1); top-k and top-p build a log-scale histogram
 *      of the weights (count, mass), find the bucket the cut falls in, keep
 *      every bucket above it and run a quickselect only inside that bucket;
 *      so nothing is ever fully sorted. The split and min-p (a threshold:
 *      the best weight is 1) are vector scans for the few weights above a
 *      threshold. The draw sums 64-weight blocks (8 blocks at a time, each
 *      in its own serial order), then scans one block.
 *
 * The row kernels (smp_simd.c) run at the widest vector width the CPU has;
 * every width gives the same bits. smp_ref.c is the scalar reference the
 * tests hold every fast path to: same token, same random stream.
 *
 * The candidates that survive truncation are not sorted; the draw scans
 * them in the deterministic order the selection left them in, so the same
 * seed always gives the same token.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "sampler/sampler.h"
#include "sampler/sampler_int.h"

/* Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS). */
#define SMP_TEMP_EPS 1e-5f
/* Segments this small are finished by insertion sort. */
#define SMP_SMALL_SEG 16
/* Weight histogram (sampler_int.h). */
#define SMP_KEY_SHIFT SMP_KEY_SHIFT_K
#define SMP_NBUCKETS SMP_NBUCKETS_K
/* Block size of the two-level draw, and blocks summed side by side. */
#define SMP_BLOCK 64
#define SMP_BLOCK_ILP 8

struct smp_ctx {
    int32_t vocab;
    const smp_kern_t *k; /* row kernels at the widest width (smp_simd.c) */
    /* Candidates of the random path, structure of arrays so the exp pass
     * vectorizes: cand_v[vocab] holds weights exp((logit - max) / T);
     * cand_id[vocab] the token ids. */
    float *cand_v;
    int32_t *cand_id;
    float *cand2_v;    /* [vocab] the bucket a truncation cuts through */
    int32_t *cand2_id; /* [vocab] */
    uint32_t *hist_n;  /* [2][SMP_NBUCKETS] candidates per weight bucket */
    double *hist_m;    /* [2][SMP_NBUCKETS] their mass (two halves, see top-p) */
    double *blk;       /* [vocab / SMP_BLOCK + 1] block sums of the draw */
    int32_t *counts;   /* [vocab] output-token counts; all zero between calls */
    uint8_t *seen;     /* [vocab] repetition-penalty marks; all zero between calls */
};

/* ---- RNG: xoshiro256** seeded by splitmix64 ---------------------------- */

static uint64_t
smp_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t
smp_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void
smp_rng_seed(smp_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;

    for (int i = 0; i < 4; i++) {
        r->s[i] = smp_splitmix64(&x);
    }
}

uint64_t
smp_rng_next(smp_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = smp_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = smp_rotl(s[3], 45);
    return result;
}

double
smp_rng_uniform(smp_rng_t *r)
{
    return (double)(smp_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- context ------------------------------------------------------------ */

int
smp_ctx_create(int32_t vocab, smp_ctx_t **out)
{
    smp_ctx_t *c;

    if (vocab <= 0 || out == NULL) {
        return ST_EINVAL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return ST_ENOMEM;
    }
    c->vocab = vocab;
    c->k = smp__kern_best();
    c->cand_v = malloc((size_t)vocab * sizeof(*c->cand_v));
    c->cand_id = malloc((size_t)vocab * sizeof(*c->cand_id));
    c->cand2_v = malloc((size_t)vocab * sizeof(*c->cand2_v));
    c->cand2_id = malloc((size_t)vocab * sizeof(*c->cand2_id));
    c->hist_n = malloc(2 * SMP_NBUCKETS * sizeof(*c->hist_n));
    c->hist_m = malloc(2 * SMP_NBUCKETS * sizeof(*c->hist_m));
    c->blk = malloc(((size_t)vocab / SMP_BLOCK + 1) * sizeof(*c->blk));
    c->counts = calloc((size_t)vocab, sizeof(*c->counts));
    c->seen = calloc((size_t)vocab, sizeof(*c->seen));
    if (c->cand_v == NULL || c->cand_id == NULL || c->cand2_v == NULL || c->cand2_id == NULL ||
        c->hist_n == NULL || c->hist_m == NULL || c->blk == NULL || c->counts == NULL ||
        c->seen == NULL) {
        smp_ctx_destroy(c);
        return ST_ENOMEM;
    }
    *out = c;
    return ST_OK;
}

void
smp_ctx_destroy(smp_ctx_t *c)
{
    if (c == NULL) {
        return;
    }
    free(c->cand_v);
    free(c->cand_id);
    free(c->cand2_v);
    free(c->cand2_id);
    free(c->hist_n);
    free(c->hist_m);
    free(c->blk);
    free(c->counts);
    free(c->seen);
    free(c);
}

int
smp__ctx_set_isa(smp_ctx_t *c, smp_isa_t isa)
{
    const smp_kern_t *k = smp__kern(isa);

    if (k == NULL) {
        return ST_EUNSUPPORTED;
    }
    c->k = k;
    return ST_OK;
}

int32_t
smp__ctx_vocab(const smp_ctx_t *c)
{
    return c->vocab;
}

/* ---- validation, bias and penalties --------------------------------------- */

int
smp__check_params(const smp_ctx_t *c, const smp_params_t *p, const int32_t *history,
                  int32_t n_hist, int32_t n_prompt)
{
    if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !(p->repetition_penalty > 0.0f) ||
        !isfinite(p->repetition_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || !isfinite(p->temperature)) {
        return ST_EINVAL;
    }
    if (p->n_logprobs < 0 || p->n_logprobs > SMP_MAX_LOGPROBS) {
        return ST_EINVAL;
    }
    if (p->n_bias < 0 || (p->n_bias > 0 && p->bias == NULL)) {
        return ST_EINVAL;
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias[i].id < 0 || p->bias[i].id >= c->vocab || isnan(p->bias[i].bias)) {
            return ST_EINVAL;
        }
    }
    if (n_hist < 0 || n_prompt < 0 || n_prompt > n_hist || (n_hist > 0 && history == NULL)) {
        return ST_EINVAL;
    }
    for (int32_t i = 0; i < n_hist; i++) {
        if (history[i] < 0 || history[i] >= c->vocab) {
            return ST_EINVAL;
        }
    }
    return ST_OK;
}

void
smp__apply_bias_penalties(smp_ctx_t *c, const smp_params_t *p, float *logits,
                          const int32_t *history, int32_t n_hist, int32_t n_prompt)
{
    for (int32_t i = 0; i < p->n_bias; i++) {
        logits[p->bias[i].id] += p->bias[i].bias;
    }

    /* Repetition penalty (HF / vLLM): once per distinct token of prompt and
     * output; positive logits are divided, negative ones multiplied. */
    if (p->repetition_penalty != 1.0f) {
        float rp = p->repetition_penalty;

        for (int32_t i = 0; i < n_hist; i++) {
            int32_t t = history[i];

            if (c->seen[t]) {
                continue;
            }
            c->seen[t] = 1;
            logits[t] = logits[t] > 0.0f ? logits[t] / rp : logits[t] * rp;
        }
        for (int32_t i = 0; i < n_hist; i++) {
            c->seen[history[i]] = 0;
        }
    }

    /* Presence and frequency penalties (OpenAI): output tokens only,
     * logit -= count * frequency + (count > 0) * presence. */
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int32_t i = n_prompt; i < n_hist; i++) {
            c->counts[history[i]]++;
        }
        for (int32_t i = n_prompt; i < n_hist; i++) {
            int32_t t = history[i];
            int32_t n = c->counts[t];

            if (n == 0) {
                continue; /* already applied for this token */
            }
            logits[t] -= (float)n * p->frequency_penalty + p->presence_penalty;
            c->counts[t] = 0;
        }
    }
}

/* ---- top-n logprobs ------------------------------------------------------ */

/* Keeps (tv, ti)[0..*n) sorted by value descending, equal values by id
 * ascending. Ids arrive in ascending order, so an equal value goes after
 * the entries already there. */
static inline void
smp_top_insert(float *tv, int32_t *ti, int32_t *n, int32_t cap, float v, int32_t id)
{
    int32_t pos = *n < cap ? *n : cap - 1;

    while (pos > 0 && tv[pos - 1] < v) {
        tv[pos] = tv[pos - 1];
        ti[pos] = ti[pos - 1];
        pos--;
    }
    tv[pos] = v;
    ti[pos] = id;
    if (*n < cap) {
        (*n)++;
    }
}

/* The cap largest of x[0..n) (NaN skipped; equal values: lowest id first)
 * into (tv, ti), sorted; returns how many. After the first cap entries
 * only values above the current cap-th can enter, so the scan jumps with
 * find_ge from one such value to the next. */
static int32_t
smp_top_n(const smp_kern_t *k, const float *x, int32_t n, int32_t cap, float *tv, int32_t *ti)
{
    int32_t n_top = 0, i = 0;

    if (cap <= 0) {
        return 0;
    }
    for (; i < n && n_top < cap; i++) {
        if (x[i] >= -INFINITY) {
            smp_top_insert(tv, ti, &n_top, cap, x[i], i);
        }
    }
    /* x > v is x >= the next float above v (v is never +inf: +inf logits
     * are refused before). */
    while ((i = k->find_ge(x, i, n, nextafterf(tv[n_top - 1], INFINITY))) < n) {
        smp_top_insert(tv, ti, &n_top, cap, x[i], i);
        i++;
    }
    return n_top;
}

/* ---- selection over (v, id) arrays ---------------------------------------- */

static inline void
smp_swap(float *v, int32_t *id, int32_t a, int32_t b)
{
    float tv = v[a];
    int32_t ti = id[a];

    v[a] = v[b];
    id[a] = id[b];
    v[b] = tv;
    id[b] = ti;
}

/* Sorts (v, id)[lo..hi) by v descending (insertion sort, short runs only). */
static void
smp_sort_small(float *v, int32_t *id, int32_t lo, int32_t hi)
{
    for (int32_t i = lo + 1; i < hi; i++) {
        float x = v[i];
        int32_t xi = id[i];
        int32_t j = i;

        while (j > lo && v[j - 1] < x) {
            v[j] = v[j - 1];
            id[j] = id[j - 1];
            j--;
        }
        v[j] = x;
        id[j] = xi;
    }
}

static inline float
smp_median3(float a, float b, float c)
{
    if (a < b) {
        return b < c ? b : (a < c ? c : a);
    }
    return a < c ? a : (b < c ? c : b);
}

/* Three-way partition of (v, id)[lo..hi) around pivot:
 * [> pivot | == pivot | < pivot]; sets *gt_end and *eq_end. No NaN. */
static void
smp_partition3(float *v, int32_t *id, int32_t lo, int32_t hi, float pivot, int32_t *gt_end,
               int32_t *eq_end)
{
    int32_t lt = lo, i = lo, gt = hi;

    while (i < gt) {
        if (v[i] > pivot) {
            smp_swap(v, id, lt++, i++);
        } else if (v[i] < pivot) {
            smp_swap(v, id, i, --gt);
        } else {
            i++;
        }
    }
    *gt_end = lt;
    *eq_end = gt;
}

/* Expected linear (quickselect, median-of-3 pivots). */
void
smp__select_top_k(float *v, int32_t *id, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n;

    while (hi - lo > SMP_SMALL_SEG) {
        int32_t g, e;
        float pivot = smp_median3(v[lo], v[lo + (hi - lo) / 2], v[hi - 1]);

        smp_partition3(v, id, lo, hi, pivot, &g, &e);
        if (k <= g) {
            hi = g;
        } else if (k <= e) {
            return; /* [g..e) all equal: any of them completes the set */
        } else {
            lo = e;
        }
    }
    smp_sort_small(v, id, lo, hi);
}

/* The token that crosses the threshold is kept, as in HF and vLLM. The
 * prefix is unordered. Expected linear: each round partitions around a
 * pivot and keeps the heavy side or banks it and goes on in the light one. */
int32_t
smp__select_mass(float *v, int32_t *id, int32_t n, double need)
{
    int32_t lo = 0, hi = n;

    while (hi - lo > SMP_SMALL_SEG) {
        int32_t g, e, take;
        float pivot = smp_median3(v[lo], v[lo + (hi - lo) / 2], v[hi - 1]);
        double mass_g = 0.0, mass_e;

        smp_partition3(v, id, lo, hi, pivot, &g, &e);
        for (int32_t i = lo; i < g; i++) {
            mass_g += v[i];
        }
        if (mass_g >= need && g > lo) {
            hi = g;
            continue;
        }
        mass_e = (double)(e - g) * pivot;
        if (mass_g + mass_e < need && e < hi) {
            need -= mass_g + mass_e;
            lo = e;
            continue;
        }
        /* Part of the run equal to the pivot completes the set. */
        take = pivot > 0.0f ? (int32_t)ceil((need - mass_g) / pivot) : e - g;
        take = take < 1 ? 1 : (take > e - g ? e - g : take);
        return g + take;
    }
    smp_sort_small(v, id, lo, hi);
    for (int32_t i = lo; i < hi; i++) {
        need -= v[i];
        if (need <= 0.0) {
            return i + 1;
        }
    }
    return hi; /* rounding: everything is kept */
}

/* ---- truncation by histogram -------------------------------------------- */

/* Bucket of a weight in [0, 1]: its float exponent and 4 mantissa bits, a
 * log-scale histogram with 6% wide buckets. Monotonic in w. */
static inline uint32_t
smp_wkey(float w)
{
    uint32_t bits;

    memcpy(&bits, &w, sizeof(bits));
    return bits >> SMP_KEY_SHIFT;
}

/* The smallest weight with key b: weights are >= 0 and not NaN, so
 * key(w) >= b exactly when w >= smp_key_floor(b). */
static inline float
smp_key_floor(uint32_t b)
{
    uint32_t bits = b << SMP_KEY_SHIFT;
    float w;

    memcpy(&w, &bits, sizeof(w));
    return w;
}

/* Splits (v, id)[0..n) by bucket: keys above `b` are compacted in place to
 * the front (returned count), keys equal to `b` go to (v2, id2) (*n_eq),
 * both in index order; the rest is dropped. 64 weights at a time, a
 * bitmask of those with key >= b (few, usually) says which to look at.
 * With ident set, id[] is not read: the ids are the indices. */
static int32_t
smp_split(smp_ctx_t *c, int ident, int32_t n, uint32_t b, int32_t *n_eq)
{
    float *v = c->cand_v, *v2 = c->cand2_v;
    int32_t *id = c->cand_id, *id2 = c->cand2_id;
    float lo = smp_key_floor(b), hi = smp_key_floor(b + 1);
    int32_t na = 0, ne = 0;

    for (int32_t base = 0; base < n; base += 64) {
        uint64_t m = c->k->mask_ge(v + base, n - base < 64 ? n - base : 64, lo);

        for (; m != 0; m &= m - 1) {
            int32_t i = base + __builtin_ctzll(m);
            float w = v[i];
            int32_t t = ident ? i : id[i];

            if (w >= hi) {
                v[na] = w; /* na <= i: nothing still to be read is overwritten */
                id[na] = t;
                na++;
            } else {
                v2[ne] = w;
                id2[ne] = t;
                ne++;
            }
        }
    }
    *n_eq = ne;
    return na;
}

/* Keeps the k largest weights of the n candidates (0 < k < n) and every
 * candidate tied with the k-th (HF's TopKLogitsWarper and vLLM mask only
 * what is below the k-th value): a count histogram finds the bucket holding
 * the k-th, everything above it is in, and a quickselect inside that one
 * bucket picks the rest. Returns the new count (>= k). */
static int32_t
smp_trunc_top_k(smp_ctx_t *c, int ident, int32_t n, int32_t k)
{
    uint32_t *hn = c->hist_n, *hn1 = c->hist_n + SMP_NBUCKETS;
    float *v2 = c->cand2_v;
    int32_t *id2 = c->cand2_id;
    int32_t above = 0, n_eq, na, r, i;
    uint32_t b;

    /* Two half histograms, as in smp_trunc_top_p. */
    memset(hn, 0, 2 * SMP_NBUCKETS * sizeof(*hn));
    for (i = 0; i + 2 <= n; i += 2) {
        hn[smp_wkey(c->cand_v[i])]++;
        hn1[smp_wkey(c->cand_v[i + 1])]++;
    }
    if (i < n) {
        hn[smp_wkey(c->cand_v[i])]++;
    }
    for (b = SMP_NBUCKETS - 1; b > 0; b--) {
        hn[b] += hn1[b];
        if (above + (int32_t)hn[b] >= k) {
            break;
        }
        above += (int32_t)hn[b];
    }
    na = smp_split(c, ident, n, b, &n_eq);
    r = k - na;
    if (r < n_eq) {
        float kth = INFINITY;

        smp__select_top_k(v2, id2, n_eq, r);
        for (i = 0; i < r; i++) {
            kth = v2[i] < kth ? v2[i] : kth;
        }
        for (i = r; i < n_eq; i++) {
            if (v2[i] == kth) {
                smp_swap(v2, id2, r, i);
                r++;
            }
        }
    }
    memcpy(c->cand_v + na, v2, (size_t)r * sizeof(float));
    memcpy(c->cand_id + na, id2, (size_t)r * sizeof(int32_t));
    return na + r;
}

/* Top-p: keeps the shortest set of largest weights whose mass reaches
 * `need`. A mass histogram finds the bucket where the running mass crosses
 * `need`; buckets above are in, and the mass quickselect runs inside that
 * bucket only. Returns the new count.
 *
 * A bucket's mass is exact whatever the order of its terms: its weights
 * share one binade, so each is a multiple of that binade's ulp and fewer
 * than 2^29 of them sum without rounding in a double. */
static int32_t
smp_trunc_top_p(smp_ctx_t *c, int ident, int32_t n, double need)
{
    double *hm = c->hist_m, *hm1 = c->hist_m + SMP_NBUCKETS, mass_above = 0.0;
    const float *v = c->cand_v;
    int32_t na, n_eq, r, i;
    uint32_t b;

    /* Two half histograms (even and odd index) so that neighbours landing
     * in one bucket do not wait on each other's store; merged exactly. */
    memset(hm, 0, 2 * SMP_NBUCKETS * sizeof(*hm));
    for (i = 0; i + 2 <= n; i += 2) {
        hm[smp_wkey(v[i])] += v[i];
        hm1[smp_wkey(v[i + 1])] += v[i + 1];
    }
    if (i < n) {
        hm[smp_wkey(v[i])] += v[i];
    }
    /* Above bucket 0 every weight is > 0: a bucket is empty exactly when
     * its mass is 0. */
    for (b = SMP_NBUCKETS - 1; b > 0; b--) {
        hm[b] += hm1[b];
        if (hm[b] > 0.0 && mass_above + hm[b] >= need) {
            break;
        }
        mass_above += hm[b];
    }
    hm[0] += hm1[0];
    if (b == 0 && mass_above + hm[0] < need) {
        return n; /* rounding: everything is kept */
    }
    na = smp_split(c, ident, n, b, &n_eq);
    r = smp__select_mass(c->cand2_v, c->cand2_id, n_eq, need - mass_above);
    memcpy(c->cand_v + na, c->cand2_v, (size_t)r * sizeof(float));
    memcpy(c->cand_id + na, c->cand2_id, (size_t)r * sizeof(int32_t));
    return na + r;
}

/* Draws index i of v[0..n) with probability v[i] / sum(v), u in [0, 1).
 * Two levels (sums of 64-weight blocks, then one block) so the serial
 * running sum covers n / 64 + 64 terms. Each block sum is a serial float
 * sum in index order; SMP_BLOCK_ILP blocks are summed side by side so
 * their adds overlap. Never returns a weight-0 entry unless every weight
 * is 0. */
static int32_t
smp_pick(smp_ctx_t *c, const float *v, int32_t n, double u)
{
    int32_t nb = (n + SMP_BLOCK - 1) / SMP_BLOCK, nfull = n / SMP_BLOCK, b = 0, end;
    double total = 0.0, acc = 0.0;

    for (; b + SMP_BLOCK_ILP <= nfull; b += SMP_BLOCK_ILP) {
        const float *x = v + (size_t)b * SMP_BLOCK;
        /* Eight chains in registers: s_j is block b + j's serial sum. */
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f,
              s7 = 0.0f;

        for (int32_t i = 0; i < SMP_BLOCK; i++) {
            s0 += x[i];
            s1 += x[SMP_BLOCK + i];
            s2 += x[2 * SMP_BLOCK + i];
            s3 += x[3 * SMP_BLOCK + i];
            s4 += x[4 * SMP_BLOCK + i];
            s5 += x[5 * SMP_BLOCK + i];
            s6 += x[6 * SMP_BLOCK + i];
            s7 += x[7 * SMP_BLOCK + i];
        }
        c->blk[b] = s0;
        c->blk[b + 1] = s1;
        c->blk[b + 2] = s2;
        c->blk[b + 3] = s3;
        c->blk[b + 4] = s4;
        c->blk[b + 5] = s5;
        c->blk[b + 6] = s6;
        c->blk[b + 7] = s7;
        for (int j = 0; j < SMP_BLOCK_ILP; j++) {
            total += c->blk[b + j];
        }
    }
    for (; b < nb; b++) {
        int32_t lo = b * SMP_BLOCK, hi = lo + SMP_BLOCK < n ? lo + SMP_BLOCK : n;
        float s = 0.0f;

        for (int32_t i = lo; i < hi; i++) {
            s += v[i];
        }
        c->blk[b] = s;
        total += s;
    }
    u *= total;
    for (b = 0; b < nb - 1; b++) {
        if (u < acc + c->blk[b]) {
            break;
        }
        acc += c->blk[b];
    }
    end = b * SMP_BLOCK + SMP_BLOCK < n ? b * SMP_BLOCK + SMP_BLOCK : n;
    for (int32_t i = b * SMP_BLOCK; i < end; i++) {
        acc += v[i];
        if (u < acc && v[i] > 0.0f) {
            return i;
        }
    }
    for (int32_t i = end - 1; i > 0; i--) { /* rounding put u at the end */
        if (v[i] > 0.0f) {
            return i;
        }
    }
    return 0;
}

/* ---- sampling ------------------------------------------------------------ */

/* Whether top-p runs first, on the whole row: then it needs the sum of all
 * weights (top-k, when it cuts, sums its survivors itself). */
static bool
smp_needs_total(const smp_params_t *p, int32_t vocab)
{
    return p->top_p < 1.0f && !(p->top_k > 0 && p->top_k < vocab);
}

/* The random path's candidates: weights exp((l - max) / T) in cand_v,
 * truncated by top-k, top-p and min-p. Returns their count; *ident says
 * the ids are the indices (cand_id not materialized). logits[] has had
 * bias and penalties applied; max is its finite maximum. With `ready` the
 * weights are already in cand_v (T = 1) and, when smp_needs_total(), total
 * is their sum. */
static int32_t
smp_truncate(smp_ctx_t *c, const smp_params_t *p, const float *logits, float max, bool ready,
             double total, int *ident_out)
{
    float *v = c->cand_v;
    int32_t *id = c->cand_id;
    int32_t n = c->vocab, i;
    int ident = 1; /* id[i] == i, not materialized yet */

    /* Weights exp((l - max) / T) in (0, 1]; the best token has weight 1
     * and survives every truncation; -inf and NaN logits get 0. */
    if (!ready) {
        total = c->k->exp_pass(logits, v, n, max, 1.0f / p->temperature,
                               smp_needs_total(p, c->vocab), NULL);
    }
    if (p->top_k > 0 && p->top_k < n) {
        n = smp_trunc_top_k(c, ident, n, p->top_k);
        ident = 0;
        total = 0.0;
        for (i = 0; i < n; i++) {
            total += v[i];
        }
    }
    if (p->top_p < 1.0f) {
        n = smp_trunc_top_p(c, ident, n, (double)p->top_p * total);
        ident = 0;
    }
    if (p->min_p > 0.0f) {
        /* Relative to the most likely token, whose weight is 1. */
        int32_t kept = 0;

        for (int32_t base = 0; base < n; base += 64) {
            uint64_t m = c->k->mask_ge(v + base, n - base < 64 ? n - base : 64, p->min_p);

            for (; m != 0; m &= m - 1) {
                i = base + __builtin_ctzll(m);
                v[kept] = v[i]; /* kept <= i */
                id[kept] = ident ? i : id[i];
                kept++;
            }
        }
        n = kept;
        ident = 0;
    }
    *ident_out = ident;
    return n;
}

/* The random path: weights, truncation and one draw. */
static int32_t
smp_draw(smp_ctx_t *c, const smp_params_t *p, smp_rng_t *rng, const float *logits, float max,
         bool ready, double total)
{
    int ident;
    int32_t n = smp_truncate(c, p, logits, max, ready, total, &ident);
    int32_t i = smp_pick(c, c->cand_v, n, smp_rng_uniform(rng));

    return ident ? i : c->cand_id[i];
}

int
smp_sample(smp_ctx_t *c, const smp_params_t *p, smp_rng_t *rng, float *logits,
           const int32_t *history, int32_t n_hist, int32_t n_prompt, smp_result_t *out)
{
    int32_t vocab, argmax = 0, n_top, token;
    float max, top_v[SMP_MAX_LOGPROBS];
    int32_t top_i[SMP_MAX_LOGPROBS];
    double lse = 0.0, sum = 0.0;
    bool random, want_lp, ready;
    int rc;

    if (c == NULL || p == NULL || logits == NULL || out == NULL) {
        return ST_EINVAL;
    }
    rc = smp__check_params(c, p, history, n_hist, n_prompt);
    if (rc != ST_OK) {
        return rc;
    }
    random = p->temperature >= SMP_TEMP_EPS;
    if (random && rng == NULL) {
        return ST_EINVAL;
    }
    vocab = c->vocab;
    want_lp = !p->no_logprob || p->n_logprobs > 0;

    smp__apply_bias_penalties(c, p, logits, history, n_hist, n_prompt);

    /* Greedy needs the argmax (the lowest id wins ties); random only the max. */
    max = random ? c->k->max(logits, vocab) : c->k->argmax(logits, vocab, &argmax);
    if (!isfinite(max)) {
        return ST_EINVAL; /* no token left with a finite logit */
    }

    /* Log-softmax after bias and penalties, before temperature; at T = 1
     * its terms are the sampling weights, kept in cand_v for smp_draw. */
    ready = random && p->temperature == 1.0f;
    if (want_lp || ready) {
        sum = c->k->exp_pass(logits, ready ? c->cand_v : NULL, vocab, max, 1.0f,
                             want_lp || smp_needs_total(p, vocab), NULL);
        lse = (double)max + log(sum);
    }
    n_top = smp_top_n(c->k, logits, vocab, p->n_logprobs, top_v, top_i);

    token = random ? smp_draw(c, p, rng, logits, max, ready, sum) : argmax;

    out->token = token;
    out->logprob = want_lp ? (float)((double)logits[token] - lse) : NAN;
    out->n_top = n_top;
    for (int32_t i = 0; i < n_top; i++) {
        out->top_ids[i] = top_i[i];
        out->top_logprobs[i] = (float)((double)top_v[i] - lse);
    }
    return ST_OK;
}

/* ---- the distribution, for speculative decoding ---------------------- */

int
smp_probs(smp_ctx_t *c, const smp_params_t *p, float *logits, const int32_t *history,
          int32_t n_hist, int32_t n_prompt, float *probs)
{
    int32_t vocab, argmax = 0, n;
    float max;
    double sum = 0.0;
    int ident, rc;

    if (c == NULL || p == NULL || logits == NULL || probs == NULL) {
        return ST_EINVAL;
    }
    rc = smp__check_params(c, p, history, n_hist, n_prompt);
    if (rc != ST_OK) {
        return rc;
    }
    vocab = c->vocab;
    smp__apply_bias_penalties(c, p, logits, history, n_hist, n_prompt);
    max = c->k->argmax(logits, vocab, &argmax);
    if (!isfinite(max)) {
        return ST_EINVAL;
    }
    memset(probs, 0, (size_t)vocab * sizeof(float));
    if (p->temperature < SMP_TEMP_EPS) {
        probs[argmax] = 1.0f; /* the lowest id wins ties, as smp_sample */
        return ST_OK;
    }
    n = smp_truncate(c, p, logits, max, false, 0.0, &ident);
    for (int32_t i = 0; i < n; i++) {
        sum += c->cand_v[i];
    }
    for (int32_t i = 0; i < n; i++) {
        probs[ident ? i : c->cand_id[i]] = (float)(c->cand_v[i] / sum);
    }
    return ST_OK;
}

void
smp_result_of(smp_ctx_t *c, const smp_params_t *p, const float *logits, int32_t token,
              smp_result_t *out)
{
    int32_t n_top, top_i[SMP_MAX_LOGPROBS];
    float top_v[SMP_MAX_LOGPROBS], max = c->k->max(logits, c->vocab);
    double lse = (double)max + log(c->k->exp_pass(logits, NULL, c->vocab, max, 1.0f, 1, NULL));

    n_top = smp_top_n(c->k, logits, c->vocab, p->n_logprobs, top_v, top_i);
    out->token = token;
    out->logprob = (float)((double)logits[token] - lse);
    out->n_top = n_top;
    for (int32_t i = 0; i < n_top; i++) {
        out->top_ids[i] = top_i[i];
        out->top_logprobs[i] = (float)((double)top_v[i] - lse);
    }
}

int32_t
smp_pick_probs(const float *probs, int32_t vocab, double u)
{
    double total = 0.0, acc = 0.0;
    int32_t last = -1;

    for (int32_t i = 0; i < vocab; i++) {
        total += probs[i];
    }
    u *= total;
    for (int32_t i = 0; i < vocab; i++) {
        if (probs[i] > 0.0f) {
            acc += probs[i];
            last = i;
            if (u < acc) {
                return i;
            }
        }
    }
    return last; /* rounding put u at the end (-1: every weight is 0) */
}
