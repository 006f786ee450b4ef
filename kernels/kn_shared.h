/* kn_shared.h - computations the CPU kernels and the CUDA bodies must do
 * identically, written once: the sequence a batch row belongs to (the CPU
 * attention in kernels/cpu/kn_cpu.c and kv_quant.c, the CUDA attention
 * bodies) and the scale and zero point of one KIVI group of int8, int4 or
 * fp8 codes (the CPU quantizer kernels/cpu/kv_quant.c, the reference, and
 * the CUDA quantization body). The CUDA bodies (kernels/cuda/kn_cuda_body.h)
 * are compiled by nvcc and, as host C, by the kernel emulator, whose test
 * compares the two quantizers' blocks bit for bit.
 *
 * DESIGN. Header-only: KN_SHARED_FN makes a function a __device__ inline
 * under nvcc (only device code calls these there: the host side of the
 * CUDA backend is compiled by the C compiler) and a static inline in C.
 * The group parameters round through kn_f32_to_f16() / kn_f16_to_f32(): in
 * C the CPU's (kernels/cpu/kv_quant.c) or, when kn_cuda_body.h includes
 * this header after defining its own static inline ones, those (the
 * declarations below then keep their internal linkage); under nvcc the
 * body's device functions, defined before the include. Sums and products
 * that a compiler could contract into an FMA go through KN_FMUL_RN /
 * KN_FADD_RN / KN_FSUB_RN: round-to-nearest intrinsics under nvcc (which
 * contracts by default), plain operators in C (the kernels library
 * contracts only inside its target("fma") regions, and this code is
 * outside them).
 *
 * Thread: any (pure functions).
 */
#ifndef KERNELS_KN_SHARED_H
#define KERNELS_KN_SHARED_H

#include <math.h>
#include <stdint.h>

#if !defined(__CUDACC__)
uint16_t kn_f32_to_f16(float x); /* round to nearest even, saturating to inf */
float kn_f16_to_f32(uint16_t h);
#endif

#if defined(__CUDACC__)
#define KN_SHARED_FN __device__ __forceinline__
#define KN_FMUL_RN(a, b) __fmul_rn((a), (b))
#define KN_FADD_RN(a, b) __fadd_rn((a), (b))
#define KN_FSUB_RN(a, b) __fsub_rn((a), (b))
#else
#define KN_SHARED_FN static inline
#define KN_FMUL_RN(a, b) ((a) * (b))
#define KN_FADD_RN(a, b) ((a) + (b))
#define KN_FSUB_RN(a, b) ((a) - (b))
#endif

/* The sequence that owns row tok of a batch: the last s in [0, n_seqs)
 * with query_start[s] <= tok (query_start non-decreasing, n_seqs >= 1). */
KN_SHARED_FN int32_t
kn_seq_of(const int32_t *query_start, int32_t n_seqs, int32_t tok)
{
    int32_t lo = 0, hi = n_seqs - 1;

    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;

        if (query_start[mid] <= tok) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* Scaled formats by number: the values of KN_KVQ_FP8 / KN_KVQ_INT8 /
 * KN_KVQ_INT4 of kernels/cpu/kv_quant.h (kv_quant.c asserts it). */
#define KN_KQ_FP8 3
#define KN_KQ_INT8 4
#define KN_KQ_INT4 5

/* Scale and zero point of a group whose values span [lo, hi], for format
 * fmt (KN_KQ_*), rounded to the f16 values stored in the block's meta so
 * that quantize and dequantize use the same numbers:
 *   int8 / int4  *z_h = f16 zero point <= lo, *sc_h = f16 scale with
 *                zero + scale * levels >= hi (levels 255 / 15);
 *                *zero, *inv = their f32 value and 1 / scale (0 if 0)
 *   fp8          *sc_h = f16 scale with amax / scale <= 448, *z_h = 0,
 *                *zero = 0, *inv = 1 / scale (0 if 0)
 * A code is then (x - zero) * inv, rounded (fp8: x * inv, encoded). */
KN_SHARED_FN void
kn_kvq_group_params(int32_t fmt, float lo, float hi, uint16_t *sc_h, uint16_t *z_h, float *inv,
                    float *zero)
{
    float levels = fmt == KN_KQ_INT4 ? 15.0f : 255.0f;
    float sc;

    if (fmt == KN_KQ_FP8) {
        float amax = fmaxf(fabsf(lo), fabsf(hi));

        *sc_h = kn_f32_to_f16(amax / 448.0f);
        sc = kn_f16_to_f32(*sc_h);
        if (sc > 0.0f && amax / sc > 448.0f) { /* f16 rounded the scale down */
            *sc_h = (uint16_t)(*sc_h + 1);
            sc = kn_f16_to_f32(*sc_h);
        }
        *z_h = 0;
        *inv = sc > 0.0f ? 1.0f / sc : 0.0f;
        *zero = 0.0f;
        return;
    }
    *z_h = kn_f32_to_f16(lo);
    *zero = kn_f16_to_f32(*z_h);
    if (*zero > lo) { /* keep lo representable: zero <= lo */
        *z_h = (uint16_t)(*z_h + ((*z_h & 0x8000u) ? 1 : -1));
        if ((*z_h & 0x7fffu) == 0x7fffu || *z_h == 0xffffu) {
            *z_h = kn_f32_to_f16(lo);
        }
        *zero = kn_f16_to_f32(*z_h);
    }
    *sc_h = kn_f32_to_f16(KN_FSUB_RN(hi, *zero) / levels);
    sc = kn_f16_to_f32(*sc_h);
    if (sc > 0.0f && KN_FADD_RN(*zero, KN_FMUL_RN(sc, levels)) < hi) { /* round the scale up */
        *sc_h = (uint16_t)(*sc_h + 1);
        sc = kn_f16_to_f32(*sc_h);
    }
    *inv = sc > 0.0f ? 1.0f / sc : 0.0f;
}

#endif /* KERNELS_KN_SHARED_H */
