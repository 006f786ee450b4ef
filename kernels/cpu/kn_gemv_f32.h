/* kn_gemv_f32.h - the f32 GEMV for decode (one token, or a few) on F32
 * weights: internal to kernels/cpu (kn_cpu.c dispatches to it).
 *
 * DESIGN. At batch 1 a product is bound by reading the weight matrix once,
 * so the kernel streams KN_GEMV_ROWS rows at a time (each x vector load
 * serves every row of the pass, and the hardware sees that many sequential
 * streams), with a software prefetch of the next pass's rows. The per-row
 * arithmetic is that of the few-row GEMM (kn_simd.c) at the same ISA level
 * on AVX2 and AVX-512: one vector accumulator per row, the k-tail in the
 * same order, the same horizontal sum; so a row's result does not depend
 * on which rows share its pass (nor on how kn_cpu.c splits rows over the
 * thread team), and a token alone gives what it gives in a batch. The
 * generic level sums 8 lanes per row in C.
 *
 * Thread: no state; a call works on the rows the caller gave it.
 */
#ifndef KERNELS_CPU_KN_GEMV_F32_H
#define KERNELS_CPU_KN_GEMV_F32_H

#include <stdint.h>

#include "kernels/cpu/kn_cpu.h"

/* Rows [r0, r1) of y (m, d_out) = x (m, k) @ w (d_out, k)^T, plus y when
 * accumulate; one token (m == 1) or a few (m <= KN_GEMV_MAX_M) token rows.
 * Single-threaded; allocates nothing. */
typedef void (*kn_gemv_f32_fn)(const float *x, const float *w, float *y, int32_t m, int32_t k,
                               int32_t d_out, int32_t r0, int32_t r1, int accumulate);

/* Up to this many tokens the GEMV runs each token over the pass's rows
 * (from L1 / L2 after the first) and beats the few-row GEMM's 4 x 4 tiles,
 * which have no prefetch: on one Zen 4 core, 1.36x at 2 tokens, 1.27x at
 * 4, even at 8, 0.85x at 16 (CPU time, 135M-shape matrices from memory). */
#define KN_GEMV_MAX_M 4

/* The kernel of an ISA level (any level: the best one the build has at or
 * below it). */
kn_gemv_f32_fn kn__gemv_f32_for(kn_isa_t isa);

#endif /* KERNELS_CPU_KN_GEMV_F32_H */
