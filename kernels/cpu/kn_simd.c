/* kn_simd.c - the fast CPU kernels, built once per ISA.
 *
 * kn_simd_body.inc holds plain C written for the vectorizer (omp simd
 * reductions, branch-free inner loops, a polynomial exp). It is included
 * three times: without a target (baseline x86-64 / any CPU), under
 * target("avx2,fma") and under target("avx512f,avx512bw,avx512vl,fma").
 * kn_cpu.c picks one table at run time from cpuid, so the binary never
 * needs -march=native.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn_int.h"

#define KN_SFX(name) name##_generic
#define KN_TABLE kn__impl_generic
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE

#if defined(__x86_64__) || defined(__i386__)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define KN_SFX(name) name##_avx2
#define KN_TABLE kn__impl_avx2
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#define KN_SFX(name) name##_avx512
#define KN_TABLE kn__impl_avx512
#include "kernels/cpu/kn_simd_body.inc"
#undef KN_SFX
#undef KN_TABLE
#pragma GCC pop_options

#else

/* Other architectures: the generic build serves every level. */
const kn_impl_t kn__impl_avx2 = {0};
const kn_impl_t kn__impl_avx512 = {0};

#endif
