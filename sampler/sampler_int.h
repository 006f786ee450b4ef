/* sampler_int.h - sampler/'s own interface between its files: the row
 * kernels chosen per ISA (smp_simd.c), the scalar reference sampler
 * (smp_ref.c) and the pieces of sampler.c both use. Not for other modules;
 * the tests include it to compare every kernel and fast path with the
 * reference.
 *
 * Thread: the kernels are pure; the rest as sampler.h.
 */
#ifndef SAMPLER_SAMPLER_INT_H
#define SAMPLER_SAMPLER_INT_H

#include <stdint.h>

#include "sampler/sampler.h"

/* 4 floats: GCC / Clang vector extensions, one SSE2 / NEON register (the
 * x86-64 and aarch64 baselines, so no target flags are needed). */
typedef float smp_v4f __attribute__((vector_size(16)));
typedef int32_t smp_v4i __attribute__((vector_size(16)));

/* Weight histogram keys: float bits >> 19 (exponent and 4 mantissa bits);
 * a weight <= 1.0f (0x3f800000) has a key below 2048. */
#define SMP_KEY_SHIFT_K 19
#define SMP_NBUCKETS_K 2048

/* The row kernels at one vector width. Every width returns the same bits. */
typedef struct smp_kern {
    const char *name; /* "generic", "avx2", "avx512" */
    int width;        /* floats per vector */
    /* Max over x[0..n), NaN ignored; -inf when nothing is larger. */
    float (*max)(const float *x, int32_t n);
    /* The same max, and in *arg the lowest index holding it (0 when no
     * element is larger than -inf). */
    float (*argmax)(const float *x, int32_t n, int32_t *arg);
    /* e[i] = exp((x[i] - max) * inv_t), stored in out[i] when out is not
     * NULL (out may equal x); returns sum e[i] when want_sum (else 0),
     * summed in the one order the reference uses (four float lanes by
     * index mod 4, flushed to a double every 1024 terms). With hist, also
     * hist[bits(e[i]) >> SMP_KEY_SHIFT_K] += e[i] (a zeroed
     * [SMP_NBUCKETS_K] array). */
    double (*exp_pass)(const float *x, float *out, int32_t n, float max, float inv_t,
                       int want_sum, double *hist);
    /* The first i in [from, n) with v[i] >= t, or n. */
    int32_t (*find_ge)(const float *v, int32_t from, int32_t n, float t);
    /* Bit i set when v[i] >= t, for v[0..n), n <= 64. */
    uint64_t (*mask_ge)(const float *v, int32_t n, float t);
} smp_kern_t;

typedef enum smp_isa {
    SMP_ISA_GENERIC = 0, /* 4 lanes, the x86-64 / aarch64 baseline */
    SMP_ISA_AVX2,        /* 8 lanes */
    SMP_ISA_AVX512,      /* 16 lanes (AVX-512 F) */
    SMP_ISA_COUNT
} smp_isa_t;

/* The kernels for isa, or NULL when this CPU (or build) lacks it. */
const smp_kern_t *smp__kern(smp_isa_t isa);
/* The widest kernels this CPU runs (chosen once, from cpuid). */
const smp_kern_t *smp__kern_best(void);
/* Makes c use isa's kernels (tests). ST_EUNSUPPORTED when unavailable. */
int smp__ctx_set_isa(smp_ctx_t *c, smp_isa_t isa);

/* exp(x) for x <= 0, 4 lanes: the Cephes expf the kernels use (about
 * 1 ulp); lanes below -87, -inf and NaN give exactly 0. */
static inline smp_v4f
smp__exp4(smp_v4f x)
{
    smp_v4i keep = x >= -87.0f;
    smp_v4f t, nf, r, y;
    smp_v4i n;

    x = (smp_v4f)((smp_v4i)x & keep); /* dropped lanes compute exp(0) */
    t = x * 1.44269504088896341f - 0.5f;
    n = __builtin_convertvector(t, smp_v4i); /* truncation: round(x log2 e) */
    nf = __builtin_convertvector(n, smp_v4f);
    r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    y = y * (smp_v4f)((n + 127) << 23); /* n >= -126: a normal power of two */
    return (smp_v4f)((smp_v4i)y & keep);
}

/* ---- shared by sampler.c and the reference (smp_ref.c) ---------------- */

int smp__check_params(const smp_ctx_t *c, const smp_params_t *p, const int32_t *history,
                      int32_t n_hist, int32_t n_prompt);
/* Bias, then repetition / presence / frequency penalties, in place. */
void smp__apply_bias_penalties(smp_ctx_t *c, const smp_params_t *p, float *logits,
                               const int32_t *history, int32_t n_hist, int32_t n_prompt);
/* Moves the k largest of (v, id)[0..n) to [0..k) (unordered), 0 < k < n. */
void smp__select_top_k(float *v, int32_t *id, int32_t n, int32_t k);
/* Reorders (v, id)[0..n) and returns the length of the shortest prefix of
 * largest weights whose mass reaches need (the crossing one kept). */
int32_t smp__select_mass(float *v, int32_t *id, int32_t n, double need);
/* Vocabulary size and the candidate scratch of c, for the reference. */
int32_t smp__ctx_vocab(const smp_ctx_t *c);

/* The reference: smp_sample's contract, written as plainly as possible
 * (scalar exp, every pass over the whole row, log-softmax always, one
 * full serial running sum for the draw), with results the fast path must
 * reproduce exactly: same token and random stream, same top ids, logprobs
 * within 1e-5. Uses its own scratch (allocates; tests only). */
int smp__sample_ref(smp_ctx_t *c, const smp_params_t *p, smp_rng_t *rng, float *logits,
                    const int32_t *history, int32_t n_hist, int32_t n_prompt, smp_result_t *out);

#endif /* SAMPLER_SAMPLER_INT_H */
