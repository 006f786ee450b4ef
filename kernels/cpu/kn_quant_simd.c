/* kn_quant_simd.c - the weight kernels (kn_quant_int.h), built once per
 * ISA level from kn_quant_body.inc: generic C, AVX2 + FMA + F16C,
 * AVX-512 F/BW/VL, and AVX-512 VNNI + BF16. kn_quant.c picks one from
 * kn_cpu_isa() at each call, so the binary never needs -march. As in
 * kn_simd.c, clang gets the targets through "#pragma clang attribute".
 *
 * Thread: no state; see kn_quant_int.h.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn_quant_int.h"

#define KN_QSFX(name) kn_q_##name##_generic
#define KN_QROWS kn__qrows_generic
#define KN_QLEVEL 0
#include "kernels/cpu/kn_quant_body.inc"
#undef KN_QSFX
#undef KN_QROWS
#undef KN_QLEVEL

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define KN_QSFX(name) kn_q_##name##_avx2
#define KN_QROWS kn__qrows_avx2
#define KN_QLEVEL 1
#include "kernels/cpu/kn_quant_body.inc"
#undef KN_QSFX
#undef KN_QROWS
#undef KN_QLEVEL
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))),   \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif
#define KN_QSFX(name) kn_q_##name##_avx512
#define KN_QROWS kn__qrows_avx512
#define KN_QLEVEL 2
#include "kernels/cpu/kn_quant_body.inc"
#undef KN_QSFX
#undef KN_QROWS
#undef KN_QLEVEL
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,avx2,fma,f16c"))),      \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,avx2,fma,f16c")
#endif
#define KN_QSFX(name) kn_q_##name##_vnni
#define KN_QROWS kn__qrows_vnni
#define KN_QLEVEL 3
#include "kernels/cpu/kn_quant_body.inc"
#undef KN_QSFX
#undef KN_QROWS
#undef KN_QLEVEL
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
