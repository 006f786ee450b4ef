/* smp_simd.c - the sampler's row kernels (max, argmax, exp pass, threshold
 * scan) at 4, 8 and 16 floats per vector, and the choice among them.
 *
 * DESIGN. One body (smp_simd.inc) is compiled three times: plain (the
 * x86-64 / aarch64 baseline, 4 lanes), under target("avx2") (8 lanes) and
 * under target("avx512f") (16 lanes), as kernels/cpu does for the forward
 * (target attributes and cpuid, never -march=native). Every width returns
 * the same bits (see smp_simd.inc), so which one runs never changes a
 * sampled token. FMA is deliberately not enabled: a fused multiply-add
 * would round differently from the 4-lane code.
 *
 * Thread: pure functions; smp__kern_best() chooses once (pthread_once).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"
#include "sampler/sampler_int.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SMP_HAVE_X86 1
#include <immintrin.h>
#endif

/* SMP_GE_MASK(x, t): bit k set when lane k of x is >= t (false for NaN). */
#ifdef SMP_HAVE_X86
#define SMP_GE_MASK(x, t) ((unsigned)_mm_movemask_ps((__m128)((x) >= (t))))
#else
static inline unsigned
smp_ge_mask_generic(smp_v4f x, float t)
{
    unsigned m = 0;

    for (int k = 0; k < 4; k++) {
        m |= (unsigned)(x[k] >= t) << k;
    }
    return m;
}
#define SMP_GE_MASK(x, t) smp_ge_mask_generic((x), (t))
#endif

#define SMP_W 4
#define SMP_SUF generic
#define SMP_NAME "generic"
#include "sampler/smp_simd.inc"
#undef SMP_W
#undef SMP_SUF
#undef SMP_NAME

#ifdef SMP_HAVE_X86
#undef SMP_GE_MASK
#define SMP_GE_MASK(x, t) ((unsigned)_mm256_movemask_ps((__m256)((x) >= (t))))

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define SMP_W 8
#define SMP_SUF avx2
#define SMP_NAME "avx2"
#include "sampler/smp_simd.inc"
#undef SMP_W
#undef SMP_SUF
#undef SMP_NAME
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#undef SMP_GE_MASK
#define SMP_GE_MASK(x, t) ((unsigned)_mm512_cmp_ps_mask((__m512)(x), _mm512_set1_ps(t), _CMP_GE_OQ))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2")
#endif
#define SMP_W 16
#define SMP_SUF avx512
#define SMP_NAME "avx512"
#include "sampler/smp_simd.inc"
#undef SMP_W
#undef SMP_SUF
#undef SMP_NAME
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* x86-64 */

const smp_kern_t *
smp__kern(smp_isa_t isa)
{
    switch (isa) {
    case SMP_ISA_GENERIC:
        return &smp_kern_generic;
#ifdef SMP_HAVE_X86
    case SMP_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") ? &smp_kern_avx2 : NULL;
    case SMP_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") ? &smp_kern_avx512 : NULL;
#endif
    default:
        return NULL;
    }
}

static const smp_kern_t *smp_best;
static pthread_once_t smp_best_once = PTHREAD_ONCE_INIT;

static void
smp_choose(void)
{
    smp_best = &smp_kern_generic;
    for (int isa = SMP_ISA_COUNT - 1; isa > SMP_ISA_GENERIC; isa--) {
        const smp_kern_t *k = smp__kern((smp_isa_t)isa);

        if (k != NULL) {
            smp_best = k;
            break;
        }
    }
}

const smp_kern_t *
smp__kern_best(void)
{
    pthread_once(&smp_best_once, smp_choose);
    return smp_best;
}
