/* kn_gemv_f32.c - the f32 GEMV on F32 weights (kn_gemv_f32.h), built per
 * ISA level: generic C, AVX2 + FMA and AVX-512 F/BW/VL under target
 * pragmas (clang: "#pragma clang attribute"), never -march; kn_cpu.c picks
 * one from kn_cpu_isa() at each call.
 *
 * DESIGN. A pass takes KN_GEMV_ROWS consecutive weight rows and walks
 * their columns one vector at a time: one load of x, one load and one FMA
 * per row. The rows of a pass are adjacent in memory, so the next pass's
 * rows start right after this pass's last row: each step also prefetches
 * the line of the next pass that sits KN_GEMV_ROWS lines further on, and
 * the whole next pass is in flight before this one ends (the generic
 * level does not prefetch). With m > 1 tokens, every token walks the
 * pass's rows (from L1 / L2 after the first). Rows past r1 in the last
 * pass read the pass's first row again (cache-hot) and their sums are
 * dropped, so every row takes the same path.
 *
 * Thread: no state.
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn_gemv_f32.h"

/* Rows per pass: 8 vector accumulators plus x fit in AVX2's 16 registers,
 * 16 in AVX-512's 32. On one Zen 4 core (CPU time, a 135M-shape decode
 * step's matrices from memory) AVX-512 ran 1.5-1.65x OpenBLAS's sgemv
 * with 16 or 8 rows, 1.45x with 4; one row at a time with the same
 * prefetch was as fast as 16: the prefetch matters more than the rows. */
#ifndef KN_GEMV_ROWS
#define KN_GEMV_ROWS 8
#endif
#ifndef KN_GEMV_ROWS_512
#define KN_GEMV_ROWS_512 16
#endif
/* Prefetch of the next pass into L2 (T1): one pass ahead is 16 rows of k
 * floats, up to ~100 KB for the 135M shape's FFN, too far for L1. In L1
 * (T0) it measured slower than in L2, and slower still without it. */
#ifndef KN_GEMV_PF
#define KN_GEMV_PF 1
#endif
#ifndef KN_GEMV_HINT
#define KN_GEMV_HINT _MM_HINT_T1
#endif

/* y[t][o] for one token row t: the stored value (plus y when accumulate). */
static inline void
kn_gemv_put(float *y, int accumulate, float v)
{
    *y = accumulate ? *y + v : v;
}

/* ---- generic C ----------------------------------------------------------- */

/* Eight lanes per row, summed pairwise at the end; the vectorizer turns a
 * lane array into SSE registers at any x86-64 level. */
static void
kn_gemv_f32_generic(const float *x, const float *w, float *y, int32_t m, int32_t k, int32_t d_out,
                    int32_t r0, int32_t r1, int accumulate)
{
    for (int32_t o = r0; o < r1; o += KN_GEMV_ROWS) {
        int nr = r1 - o < KN_GEMV_ROWS ? (int)(r1 - o) : KN_GEMV_ROWS;
        const float *wr[KN_GEMV_ROWS];

        for (int r = 0; r < KN_GEMV_ROWS; r++) {
            wr[r] = w + (size_t)(o + (r < nr ? r : 0)) * (size_t)k;
        }
        for (int32_t t = 0; t < m; t++) {
            const float *xt = x + (size_t)t * (size_t)k;

            for (int r = 0; r < nr; r++) {
                float acc[8] = {0};
                int32_t i = 0;

                for (; i + 8 <= k; i += 8) {
                    for (int l = 0; l < 8; l++) {
                        acc[l] += xt[i + l] * wr[r][i + l];
                    }
                }
                for (int l = 0; i + l < k; l++) {
                    acc[l] += xt[i + l] * wr[r][i + l];
                }
                kn_gemv_put(y + (size_t)t * d_out + o + r, accumulate,
                            ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
                                ((acc[2] + acc[6]) + (acc[3] + acc[7])));
            }
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

/* ---- AVX2 + FMA ---------------------------------------------------------- */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

/* The few-row GEMM's horizontal sum (kn_simd.c kn_hsum256), same order. */
static inline float
kn_gemv_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void
kn_gemv_f32_avx2(const float *x, const float *w, float *y, int32_t m, int32_t k, int32_t d_out,
                 int32_t r0, int32_t r1, int accumulate)
{
    /* The next pass's rows start KN_GEMV_ROWS rows on: prefetch the line
     * that far ahead of row 0's cursor, one line per row per 8 floats. */
    const size_t ahead = (size_t)KN_GEMV_ROWS * (size_t)k;

    for (int32_t o = r0; o < r1; o += KN_GEMV_ROWS) {
        int nr = r1 - o < KN_GEMV_ROWS ? (int)(r1 - o) : KN_GEMV_ROWS;
        const float *wr[KN_GEMV_ROWS];
        const char *pf = (const char *)(w + (size_t)o * (size_t)k + ahead);
        int pf_on = KN_GEMV_PF && o + KN_GEMV_ROWS < r1;

        for (int r = 0; r < KN_GEMV_ROWS; r++) {
            wr[r] = w + (size_t)(o + (r < nr ? r : 0)) * (size_t)k;
        }
        for (int32_t t = 0; t < m; t++) {
            const float *xt = x + (size_t)t * (size_t)k;
            __m256 acc[KN_GEMV_ROWS];
            int32_t i = 0;

            for (int r = 0; r < KN_GEMV_ROWS; r++) {
                acc[r] = _mm256_setzero_ps();
            }
            for (; i + 8 <= k; i += 8) {
                __m256 xv = _mm256_loadu_ps(xt + i);

                if (pf_on && t == 0 && (i & 15) == 0) {
                    /* Two steps per 64-byte line: one line of the next
                     * pass for each line this pass consumes. */
                    for (int r = 0; r < KN_GEMV_ROWS; r++) {
                        _mm_prefetch(pf + ((size_t)i * KN_GEMV_ROWS + (size_t)r * 16) * 4,
                                     KN_GEMV_HINT);
                    }
                }
                for (int r = 0; r < KN_GEMV_ROWS; r++) {
                    acc[r] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr[r] + i), acc[r]);
                }
            }
            for (int r = 0; r < nr; r++) {
                float v = kn_gemv_hsum256(acc[r]);

                for (int32_t j = i; j < k; j++) {
                    v += xt[j] * wr[r][j];
                }
                kn_gemv_put(y + (size_t)t * d_out + o + r, accumulate, v);
            }
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ---- AVX-512 ------------------------------------------------------------- */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))),      \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#endif

static void
kn_gemv_f32_avx512(const float *x, const float *w, float *y, int32_t m, int32_t k, int32_t d_out,
                   int32_t r0, int32_t r1, int accumulate)
{
    const size_t ahead = (size_t)KN_GEMV_ROWS_512 * (size_t)k;

    for (int32_t o = r0; o < r1; o += KN_GEMV_ROWS_512) {
        int nr = r1 - o < KN_GEMV_ROWS_512 ? (int)(r1 - o) : KN_GEMV_ROWS_512;
        const float *wr[KN_GEMV_ROWS_512];
        const char *pf = (const char *)(w + (size_t)o * (size_t)k + ahead);
        int pf_on = KN_GEMV_PF && o + KN_GEMV_ROWS_512 < r1;

        for (int r = 0; r < KN_GEMV_ROWS_512; r++) {
            wr[r] = w + (size_t)(o + (r < nr ? r : 0)) * (size_t)k;
        }
        for (int32_t t = 0; t < m; t++) {
            const float *xt = x + (size_t)t * (size_t)k;
            __m512 acc[KN_GEMV_ROWS_512];
            int32_t i = 0;

            for (int r = 0; r < KN_GEMV_ROWS_512; r++) {
                acc[r] = _mm512_setzero_ps();
            }
            for (; i + 16 <= k; i += 16) {
                __m512 xv = _mm512_loadu_ps(xt + i);

                if (pf_on && t == 0) {
                    for (int r = 0; r < KN_GEMV_ROWS_512; r++) {
                        _mm_prefetch(pf + ((size_t)i * KN_GEMV_ROWS_512 + (size_t)r * 16) * 4,
                                     KN_GEMV_HINT);
                    }
                }
                for (int r = 0; r < KN_GEMV_ROWS_512; r++) {
                    acc[r] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(wr[r] + i), acc[r]);
                }
            }
            if (i < k) {
                __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
                __m512 xv = _mm512_maskz_loadu_ps(mk, xt + i);

                for (int r = 0; r < KN_GEMV_ROWS_512; r++) {
                    acc[r] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mk, wr[r] + i), acc[r]);
                }
            }
            for (int r = 0; r < nr; r++) {
                kn_gemv_put(y + (size_t)t * d_out + o + r, accumulate,
                            _mm512_reduce_add_ps(acc[r]));
            }
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* x86 */

kn_gemv_f32_fn
kn__gemv_f32_for(kn_isa_t isa)
{
#if defined(__x86_64__) || defined(__i386__)
    switch (isa) {
    case KN_ISA_AVX2:
        return kn_gemv_f32_avx2;
    case KN_ISA_AVX512:
    case KN_ISA_AVX512_VNNI:
        return kn_gemv_f32_avx512;
    default:
        break;
    }
#else
    (void)isa;
#endif
    return kn_gemv_f32_generic;
}
