/* kn_quant_int.h - internals shared by kn_quant.c (formats, reference,
 * dispatch) and kn_quant_simd.c (the per-ISA weight kernels).
 *
 * The C kernels read a weight row through 256-column slices decoded
 * into kn_qdec_t: value = a4[i / 4] * s[i] + c16[i / 16] for column i of
 * the slice (a4 holds each 16-group's scale four times, one per 4 codes),
 * s the signed codes of the reference. The SIMD kernels decode in
 * registers instead (kn_quant_body.inc).
 *
 * Thread: constant tables; the row functions work on the rows they are
 * given, single-threaded.
 */
#ifndef KERNELS_CPU_KN_QUANT_INT_H
#define KERNELS_CPU_KN_QUANT_INT_H

#include <stdint.h>

#include "kernels/cpu/kn_quant.h"

#define KN_QK 256 /* columns of one decoded slice (a K-quant super-block) */

typedef struct kn_qdec {
    int8_t s[KN_QK];
    float a4[KN_QK / 4];
    float c16[KN_QK / 16];
} kn_qdec_t;

/* Rows [r0, r1) of y (a->n_tok, w->rows) = x W^T, plus bias, plus y when
 * accumulate, for every type but F32. The 8-bit form of a must be made
 * for the Q types. One per ISA level. */
typedef void (*kn_qrows_fn)(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                            int accumulate, int32_t r0, int32_t r1);

void kn__qrows_generic(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                       int accumulate, int32_t r0, int32_t r1);
void kn__qrows_avx2(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                    int accumulate, int32_t r0, int32_t r1);
void kn__qrows_avx512(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                      int accumulate, int32_t r0, int32_t r1);
void kn__qrows_vnni(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                    int accumulate, int32_t r0, int32_t r1);

#endif /* KERNELS_CPU_KN_QUANT_INT_H */
