/* kn_peak.c - the compute roofline of this CPU (kernels/cpu/kn_peak.h).
 *
 * DESIGN. Hand-written intrinsics, not a library: the figure must be the
 * issue rate of the very instructions the weight kernels use, at each ISA
 * level (target attributes, never -march). KN_PEAK_CHAINS independent
 * accumulators cover the latency (4 to 6 cycles) of two issue ports. The
 * operands never change, so the loop is all multiply-adds; the sums are
 * stored through a volatile so the compiler keeps them.
 *
 * Thread: no state.
 */
#include <time.h>

#include "kernels/cpu/kn_peak.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KN_PEAK_CHAINS 12
#define KN_PEAK_I8_CHAINS 6 /* the pre-VNNI int8 path: 6 accumulators + 6 operands fit 16 ymm */

static volatile float kn_peak_sink_f;
static volatile int kn_peak_sink_i;

static double
peak_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Each runner does `iters` rounds of KN_PEAK_CHAINS instructions and
 * returns the operations done. */
typedef double (*peak_fn_t)(long iters);

static double
f32_generic(long iters)
{
    float a[KN_PEAK_CHAINS], x = 1.0001f, y = 0.9999f, s = 0.0f;

    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        a[i] = (float)i;
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_CHAINS; i++) {
            a[i] = a[i] * x + y;
        }
    }
    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        s += a[i];
    }
    kn_peak_sink_f = s;
    return 2.0 * (double)iters * KN_PEAK_CHAINS;
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static double
f32_avx2(long iters)
{
    __m256 a[KN_PEAK_CHAINS], x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
    __m256 s = _mm256_setzero_ps();

    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        a[i] = _mm256_set1_ps((float)i);
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_CHAINS; i++) {
            a[i] = _mm256_fmadd_ps(a[i], x, y);
        }
    }
    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        s = _mm256_add_ps(s, a[i]);
    }
    kn_peak_sink_f = _mm256_cvtss_f32(s);
    return 2.0 * 8.0 * (double)iters * KN_PEAK_CHAINS;
}

/* vpmaddubsw + vpmaddwd + vpaddd: 32 byte products per 256-bit step. Each
 * chain has its own operand, which an empty asm "changes" every round so
 * that the products cannot be hoisted or shared between chains. */
static double
int8_avx2(long iters)
{
    __m256i a[KN_PEAK_I8_CHAINS], x[KN_PEAK_I8_CHAINS], y = _mm256_set1_epi8(5);
    __m256i one = _mm256_set1_epi16(1), s = _mm256_setzero_si256();

    for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
        a[i] = _mm256_set1_epi32(i);
        x[i] = _mm256_set1_epi8((char)(i + 1));
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x[i], y), one));
            __asm__ volatile("" : "+x"(x[i]));
        }
    }
    for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
        s = _mm256_add_epi32(s, a[i]);
    }
    kn_peak_sink_i = _mm256_cvtsi256_si32(s);
    return 2.0 * 32.0 * (double)iters * KN_PEAK_I8_CHAINS;
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
static double
f32_avx512(long iters)
{
    __m512 a[KN_PEAK_CHAINS], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    __m512 s = _mm512_setzero_ps();

    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        a[i] = _mm512_set1_ps((float)i);
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_CHAINS; i++) {
            a[i] = _mm512_fmadd_ps(a[i], x, y);
        }
    }
    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        s = _mm512_add_ps(s, a[i]);
    }
    kn_peak_sink_f = _mm512_reduce_add_ps(s);
    return 2.0 * 16.0 * (double)iters * KN_PEAK_CHAINS;
}

static double
int8_avx512(long iters)
{
    __m512i a[KN_PEAK_I8_CHAINS], x[KN_PEAK_I8_CHAINS], y = _mm512_set1_epi8(5);
    __m512i one = _mm512_set1_epi16(1), s = _mm512_setzero_si512();

    for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
        a[i] = _mm512_set1_epi32(i);
        x[i] = _mm512_set1_epi8((char)(i + 1));
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
            a[i] = _mm512_add_epi32(a[i], _mm512_madd_epi16(_mm512_maddubs_epi16(x[i], y), one));
            __asm__ volatile("" : "+v"(x[i]));
        }
    }
    for (int i = 0; i < KN_PEAK_I8_CHAINS; i++) {
        s = _mm512_add_epi32(s, a[i]);
    }
    kn_peak_sink_i = _mm512_reduce_add_epi32(s);
    return 2.0 * 64.0 * (double)iters * KN_PEAK_I8_CHAINS;
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,avx2,fma")
static double
bf16_vnni(long iters)
{
    __m512 a[KN_PEAK_CHAINS], s = _mm512_setzero_ps();
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f81);

    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        a[i] = _mm512_set1_ps((float)i);
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_CHAINS; i++) {
            a[i] = _mm512_dpbf16_ps(a[i], x, y);
        }
    }
    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        s = _mm512_add_ps(s, a[i]);
    }
    kn_peak_sink_f = _mm512_reduce_add_ps(s);
    return 2.0 * 32.0 * (double)iters * KN_PEAK_CHAINS;
}

static double
int8_vnni(long iters)
{
    __m512i a[KN_PEAK_CHAINS], x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
    __m512i s = _mm512_setzero_si512();

    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        a[i] = _mm512_set1_epi32(i);
    }
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < KN_PEAK_CHAINS; i++) {
            a[i] = _mm512_dpbusd_epi32(a[i], x, y);
        }
    }
    for (int i = 0; i < KN_PEAK_CHAINS; i++) {
        s = _mm512_add_epi32(s, a[i]);
    }
    kn_peak_sink_i = _mm512_reduce_add_epi32(s);
    return 2.0 * 64.0 * (double)iters * KN_PEAK_CHAINS;
}
#pragma GCC pop_options
#endif

/* The runner of op at level isa, or NULL. */
static peak_fn_t
peak_fn(kn_peak_op_t op, kn_isa_t isa)
{
#if defined(__x86_64__)
    static const peak_fn_t table[KN_PEAK_NOPS][4] = {
        [KN_PEAK_F32_FMA] = {f32_generic, f32_avx2, f32_avx512, f32_avx512},
        [KN_PEAK_BF16_DP] = {NULL, NULL, NULL, bf16_vnni},
        [KN_PEAK_INT8_DP] = {NULL, int8_avx2, int8_avx512, int8_vnni},
    };

    if ((unsigned)op >= KN_PEAK_NOPS || isa < KN_ISA_GENERIC || isa > KN_ISA_AVX512_VNNI) {
        return NULL;
    }
    return table[op][isa];
#else
    return op == KN_PEAK_F32_FMA && isa == KN_ISA_GENERIC ? f32_generic : NULL;
#endif
}

double
kn_peak_ops(kn_peak_op_t op, kn_isa_t isa, double seconds)
{
    peak_fn_t fn = peak_fn(op, isa);
    double best = 0.0, t_end, ops, dt;
    long iters = 1 << 12;

    if (fn == NULL || isa > kn_cpu_isa_best()) {
        return 0.0;
    }
    /* Grow a slice to about a millisecond, then keep the best slice. */
    for (;;) {
        double t0 = peak_now();

        ops = fn(iters);
        dt = peak_now() - t0;
        if (dt > 1e-3 || iters > (1L << 40)) {
            break;
        }
        iters *= 2;
    }
    t_end = peak_now() + seconds;
    do {
        double t0 = peak_now();

        ops = fn(iters);
        dt = peak_now() - t0;
        if (dt > 0.0 && ops / dt > best) {
            best = ops / dt;
        }
    } while (peak_now() < t_end);
    return best;
}

const char *
kn_peak_name(kn_peak_op_t op)
{
    static const char *const names[KN_PEAK_NOPS] = {"f32 FMA", "bf16 dp", "int8 dp"};

    return (unsigned)op < KN_PEAK_NOPS ? names[op] : "?";
}
