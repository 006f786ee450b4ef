/* kn_simd.c - the fast CPU kernels, built once per ISA.
 *
 * kn_simd_body.inc holds plain C written for the vectorizer (omp simd
 * reductions, branch-free inner loops, a polynomial exp). It is included
 * three times: without a target (baseline x86-64 / any CPU), under
 * target("avx2,fma") and under target("avx512f,avx512bw,avx512vl,fma").
 * kn_cpu.c picks one table at run time from cpuid, so the binary never
 * needs -march=native. Clang ignores "#pragma GCC target": it gets the same
 * target through "#pragma clang attribute" on every function of the region.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn_int.h"

#define KN_SFX(name) name##_generic
#define KN_TABLE kn__impl_generic
#define KN_VW 4 /* floats per vector register */
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE
#undef KN_VW

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

/* The few-row GEMM with intrinsics: a tile of 4 weight rows x NT tokens
 * keeps 4 * NT vector accumulators in registers; horizontal sums happen
 * once per tile. (Written through the vectorizer, GCC reduced the tile's
 * eight accumulators lane by lane, which cost more than the dot products.) */
static inline float
kn_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void
kn_gs_tile_avx2(const float *x, const float *w, float *y, int32_t k, int32_t d_out, int32_t t0,
                const int nt, int32_t o, int nr, int accumulate, const float *pf)
{
    __m256 acc[4][2];
    const float *wr[4], *xt[2];
    int32_t i = 0;

    for (int r = 0; r < 4; r++) {
        wr[r] = w + (size_t)(o + (r < nr ? r : 0)) * k;
        for (int t = 0; t < nt; t++) {
            acc[r][t] = _mm256_setzero_ps();
        }
    }
    for (int t = 0; t < nt; t++) {
        xt[t] = x + (size_t)(t0 + t) * k;
    }
    for (; i + 8 <= k; i += 8) {
        __m256 wv[4];

        for (int r = 0; r < 4; r++) {
            wv[r] = _mm256_loadu_ps(wr[r] + i);
        }
        if (pf != NULL && (i & 15) == 0) { /* the next tile's rows, a line per row */
            for (int r = 0; r < 4; r++) {
                _mm_prefetch((const char *)(pf + (size_t)r * k + i), _MM_HINT_T1);
            }
        }
        for (int t = 0; t < nt; t++) {
            __m256 xv = _mm256_loadu_ps(xt[t] + i);

            for (int r = 0; r < 4; r++) {
                acc[r][t] = _mm256_fmadd_ps(xv, wv[r], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int t = 0; t < nt; t++) {
            float v = kn_hsum256(acc[r][t]);
            float *yp = y + (size_t)(t0 + t) * d_out + o + r;

            for (int32_t j = i; j < k; j++) {
                v += xt[t][j] * wr[r][j];
            }
            *yp = accumulate ? *yp + v : v;
        }
    }
}

static void
kn_gemm_small_avx2_intr(const float *x, const float *w, float *y, int32_t m, int32_t k,
                        int32_t d_out, int32_t r0, int32_t r1, int accumulate)
{
    for (int32_t o = r0; o < r1; o += 4) {
        int nr = r1 - o < 4 ? r1 - o : 4;
        int32_t t = 0;
        /* The next tile's rows into L2 during the first token pair, as the
         * AVX-512 version does (see there). */
        const float *pf = o + 8 <= r1 ? w + (size_t)(o + 4) * k : NULL;

        for (; t + 2 <= m; t += 2) {
            kn_gs_tile_avx2(x, w, y, k, d_out, t, 2, o, nr, accumulate, t == 0 ? pf : NULL);
        }
        if (t < m) {
            kn_gs_tile_avx2(x, w, y, k, d_out, t, 1, o, nr, accumulate, t == 0 ? pf : NULL);
        }
    }
}

/* Eight horizontal sums at once (lane j = sum of v[j]): a transpose-and-
 * add tree, the AVX2 counterpart of kn_hsum16_avx512. */
static inline __m256
kn_hsum8_avx2(const __m256 v[8])
{
    __m256 a[4], b[2];

    for (int k = 0; k < 4; k++) {
        a[k] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                             _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    }
    for (int k = 0; k < 2; k++) {
        __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(a[2 * k]), _mm256_castps_pd(a[2 * k + 1]));
        __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(a[2 * k]), _mm256_castps_pd(a[2 * k + 1]));

        b[k] = _mm256_add_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                         _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

/* Attention scores (the few-row GEMM contract, no accumulate), eight keys
 * at a time; see kn_scores_avx512. */
static void
kn_scores_avx2(const float *x, const float *w, float *y, int32_t m, int32_t k, int32_t d_out,
               int32_t r0, int32_t r1, int accumulate)
{
    (void)accumulate;
    for (int32_t j0 = r0; j0 < r1; j0 += 8) {
        int32_t nj = r1 - j0 < 8 ? r1 - j0 : 8;
        const float *kr[8];

        for (int j = 0; j < 8; j++) {
            kr[j] = w + (size_t)(j0 + (j < nj ? j : 0)) * k; /* spare lanes reread row 0 */
        }
        for (int32_t t = 0; t < m; t++) {
            const float *q = x + (size_t)t * k;
            __m256 acc[8];
            float out[8];
            int32_t i = 0;

            for (int j = 0; j < 8; j++) {
                acc[j] = _mm256_setzero_ps();
            }
            for (; i + 8 <= k; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);

                for (int j = 0; j < 8; j++) {
                    acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[j] + i), acc[j]);
                }
            }
            _mm256_storeu_ps(out, kn_hsum8_avx2(acc));
            for (int j = 0; j < nj; j++) {
                float v = out[j];

                for (int32_t r = i; r < k; r++) {
                    v += q[r] * kr[j][r];
                }
                y[(size_t)t * d_out + j0 + j] = v;
            }
        }
    }
}

#define KN_ATT_SCORES kn_scores_avx2
#define KN_GEMM_SMALL kn_gemm_small_avx2_intr
#define KN_SFX(name) name##_avx2
#define KN_TABLE kn__impl_avx2
#define KN_VW 8
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE
#undef KN_VW
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#undef KN_GEMM_SMALL
#undef KN_ATT_SCORES

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#endif

static inline __attribute__((always_inline)) void
kn_gs_tile_avx512(const float *x, const float *w, float *y, int32_t k, int32_t d_out, int32_t t0,
                  const int nt, int32_t o, int nr, int accumulate, const float *pf)
{
    __m512 acc[4][4];
    const float *wr[4], *xt[4];
    int32_t i = 0;

    for (int r = 0; r < 4; r++) {
        wr[r] = w + (size_t)(o + (r < nr ? r : 0)) * k;
        for (int t = 0; t < nt; t++) {
            acc[r][t] = _mm512_setzero_ps();
        }
    }
    for (int t = 0; t < nt; t++) {
        xt[t] = x + (size_t)(t0 + t) * k;
    }
    for (; i + 16 <= k; i += 16) {
        __m512 wv[4];

        for (int r = 0; r < 4; r++) {
            wv[r] = _mm512_loadu_ps(wr[r] + i);
        }
        if (pf != NULL) { /* the next tile's rows, one line each per step */
            for (int r = 0; r < 4; r++) {
                _mm_prefetch((const char *)(pf + (size_t)r * k + i), _MM_HINT_T1);
            }
        }
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_loadu_ps(xt[t] + i);

            for (int r = 0; r < 4; r++) {
                acc[r][t] = _mm512_fmadd_ps(xv, wv[r], acc[r][t]);
            }
        }
    }
    if (i < k) {
        __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
        __m512 wv[4];

        for (int r = 0; r < 4; r++) {
            wv[r] = _mm512_maskz_loadu_ps(mk, wr[r] + i);
        }
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, xt[t] + i);

            for (int r = 0; r < 4; r++) {
                acc[r][t] = _mm512_fmadd_ps(xv, wv[r], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int t = 0; t < nt; t++) {
            float v = _mm512_reduce_add_ps(acc[r][t]);
            float *yp = y + (size_t)(t0 + t) * d_out + o + r;

            *yp = accumulate ? *yp + v : v;
        }
    }
}

static void
kn_gemm_small_avx512_intr(const float *x, const float *w, float *y, int32_t m, int32_t k,
                          int32_t d_out, int32_t r0, int32_t r1, int accumulate)
{
    for (int32_t o = r0; o < r1; o += 4) {
        int nr = r1 - o < 4 ? r1 - o : 4;
        int32_t t = 0;
        /* The first token group of a tile prefetches the next tile's four
         * rows into L2. The weights come from memory once per step; without
         * it each tile's first group waited on them (perf, 135M F32 decode
         * at 32 tokens: the weight loads held most of the kernel's samples;
         * with it, decode per CPU-second +33% at 6 and 8 tokens, +8-25% at
         * 32). */
        const float *pf = o + 8 <= r1 ? w + (size_t)(o + 4) * k : NULL;

        for (; t + 4 <= m; t += 4) {
            kn_gs_tile_avx512(x, w, y, k, d_out, t, 4, o, nr, accumulate, t == 0 ? pf : NULL);
        }
        if (m - t >= 2) {
            kn_gs_tile_avx512(x, w, y, k, d_out, t, 2, o, nr, accumulate, t == 0 ? pf : NULL);
            t += 2;
        }
        if (t < m) {
            kn_gs_tile_avx512(x, w, y, k, d_out, t, 1, o, nr, accumulate, NULL);
        }
    }
}

/* Sixteen horizontal sums at once: lane j of the result is the sum of
 * v[j]'s lanes. A transpose-and-add tree: 45 operations for 16 sums where
 * 16 separate reductions take about 150. */
static inline __m512
kn_hsum16_avx512(const __m512 v[16])
{
    __m512 a[8], b[4], c[2], x, y;

    for (int k = 0; k < 8; k++) {
        /* Per 128-bit lane: [v2k, v2k+1, v2k, v2k+1] partial sums. */
        a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                             _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    }
    for (int k = 0; k < 4; k++) {
        /* Per 128-bit lane: [v4k, v4k+1, v4k+2, v4k+3] partial sums. */
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(a[2 * k]), _mm512_castps_pd(a[2 * k + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(a[2 * k]), _mm512_castps_pd(a[2 * k + 1]));

        b[k] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    for (int k = 0; k < 2; k++) {
        /* Fold the four 128-bit lanes pairwise. */
        x = _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0));
        y = _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1));
        c[k] = _mm512_add_ps(x, y);
    }
    x = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0));
    y = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1));
    return _mm512_add_ps(x, y);
}

/* Attention scores, same contract as the few-row GEMM (y = x w^T over
 * rows [r0, r1) of w, no accumulate): x is the group's query heads (m, k),
 * w the chunk's keys (r1 - r0 <= 32 rows of k). Keys go sixteen at a time,
 * one vector accumulator each, summed by kn_hsum16_avx512. */
static void
kn_scores_avx512(const float *x, const float *w, float *y, int32_t m, int32_t k, int32_t d_out,
                 int32_t r0, int32_t r1, int accumulate)
{
    (void)accumulate;
    for (int32_t j0 = r0; j0 < r1; j0 += 16) {
        int32_t nj = r1 - j0 < 16 ? r1 - j0 : 16;
        const float *kr[16];

        for (int j = 0; j < 16; j++) {
            kr[j] = w + (size_t)(j0 + (j < nj ? j : 0)) * k; /* spare lanes reread row 0 */
        }
        for (int32_t t = 0; t < m; t++) {
            const float *q = x + (size_t)t * k;
            __m512 acc[16];
            int32_t i = 0;

            for (int j = 0; j < 16; j++) {
                acc[j] = _mm512_setzero_ps();
            }
            for (; i + 16 <= k; i += 16) {
                __m512 qv = _mm512_loadu_ps(q + i);

                for (int j = 0; j < 16; j++) {
                    acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kr[j] + i), acc[j]);
                }
            }
            if (i < k) {
                __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
                __m512 qv = _mm512_maskz_loadu_ps(mk, q + i);

                for (int j = 0; j < 16; j++) {
                    acc[j] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, kr[j] + i), acc[j]);
                }
            }
            _mm512_mask_storeu_ps(y + (size_t)t * d_out + j0, (__mmask16)((1u << nj) - 1u),
                                  kn_hsum16_avx512(acc));
        }
    }
}

#define KN_ATT_SCORES kn_scores_avx512
#define KN_GEMM_SMALL kn_gemm_small_avx512_intr
#define KN_SFX(name) name##_avx512
#define KN_TABLE kn__impl_avx512
#define KN_VW 16
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE
#undef KN_VW
#undef KN_GEMM_SMALL
#undef KN_ATT_SCORES
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else

/* Other architectures: the generic build serves every level. */
const kn_impl_t kn__impl_avx2 = {0};
const kn_impl_t kn__impl_avx512 = {0};

#endif
