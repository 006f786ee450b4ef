/* kn_peak.h - the compute roofline of this CPU: the rate one thread
 * sustains for the multiply-add instructions the weight kernels use.
 *
 * DESIGN. A benchmark's yardstick, not a kernel: `kvserve bench-forward`
 * relates batched decode (compute-bound, not bandwidth-bound) to it, as it
 * relates batch-1 decode to the measured read bandwidth. Each op runs
 * independent accumulator chains (enough to cover the instruction's
 * latency) on registers only, so the figure is the issue rate of the
 * instruction on one core. Operations are counted as a multiply plus an
 * add, 2 per product:
 *   KN_PEAK_F32_FMA  vfmadd (f32 and f16 weights, after conversion)
 *   KN_PEAK_BF16_DP  vdpbf16ps (bf16 weights; AVX512-BF16 only)
 *   KN_PEAK_INT8_DP  vpdpbusd on VNNI, vpmaddubsw + vpmaddwd + vpaddd
 *                    below it (the q-format kernels' int8 products)
 *
 * Thread: no state; call it from each thread to be measured at once.
 */
#ifndef KERNELS_CPU_KN_PEAK_H
#define KERNELS_CPU_KN_PEAK_H

#include "kernels/cpu/kn_cpu.h"

typedef enum kn_peak_op {
    KN_PEAK_F32_FMA = 0,
    KN_PEAK_BF16_DP,
    KN_PEAK_INT8_DP,
    KN_PEAK_NOPS,
} kn_peak_op_t;

/* Operations per second (2 per product) the calling thread sustains for
 * op at ISA level isa, timed over about `seconds` (the best of a few
 * slices). 0 when isa has no such instruction (bf16 below AVX512-BF16,
 * int8 on the generic level) or isa exceeds the CPU's (kn_cpu_isa_best). */
double kn_peak_ops(kn_peak_op_t op, kn_isa_t isa, double seconds);

/* "f32 FMA", "bf16 dp" or "int8 dp". */
const char *kn_peak_name(kn_peak_op_t op);

#endif
