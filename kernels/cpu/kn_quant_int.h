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
#include <string.h>

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

/* The widest BF16 rows read by the AVX512-BF16 kernel (vdpbf16ps against
 * the activations' bf16 form, kn_quant.h); wider ones (a Llama's
 * ffn_down) keep the f32 FMA tile, which ran 1.2x its rate at 8192
 * columns and 32 tokens (bench_quant, one thread, Zen 4). The form is
 * made only for inputs such a weight reads. */
#define KN_BF16_DP_COLS 4096
/* The same limit with bf16_medium (one bf16 term, kn_bf16m.c): none, the
 * single-term vdpbf16ps tile ran faster than the FMA tile at every width
 * measured (kn_bf16m.c has the figures). */
#define KN_BF16M_DP_COLS INT32_MAX

/* Makes the bf16 form that BF16 weights reading a need (kn_bf16m.c), on
 * the AVX512-BF16 level when dp: two terms (KN_BF16_TWO) for rows up to
 * KN_BF16_DP_COLS, one (KN_BF16_ONE) with a->bf16_medium up to
 * KN_BF16M_DP_COLS; else with bf16_medium the f32 rounded values
 * (KN_BF16_F32); else nothing. Idempotent; remakes the bytes when they
 * hold another form (one activation read at several ISA levels). */
void kn__act_bf16_for(kn_act_t *a, int dp);

/* Runs tok(a, t) for every token of a, split over the kernel team from
 * 2^15 elements (each token's activation forms depend on it alone). */
void kn__act_tokens(kn_act_t *a, void (*tok)(kn_act_t *a, int32_t t));

/* One interleaved type's repack (kn_repack.c): a weight of type `from`
 * becomes type `to`, `group` rows at a time, in blocks of blk_cols columns
 * and blk_bytes bytes. pack writes one such block whole: src is the first
 * row's file block (row r's at src + r * stride, stride the file's row
 * bytes), o the group's block. */
typedef struct kn_repack {
    kn_wtype_t from, to;
    int32_t group, blk_cols;
    size_t blk_bytes;
    void (*pack)(const uint8_t *src, size_t stride, uint8_t *o);
} kn_repack_t;

/* Repacks w into dst (its type's kn_*_bytes) as rp says and sets *out to
 * the repacked view: ST_EINVAL, *out untouched, unless w is of rp->from
 * with rows a positive multiple of rp->group and cols of rp->blk_cols. */
int kn__repack(const kn_weight_t *w, const kn_repack_t *rp, void *dst, kn_weight_t *out);

/* KN_W_Q4_K_R8 (kn_quant.h): the offsets in a block of 8 rows x 256 columns. */
#define KN_R8_BLK 1152
#define KN_R8_D 0
#define KN_R8_DMIN 16
#define KN_R8_SM 32 /* 4 x 24 bytes of 6-bit scales and mins */
#define KN_R8_QS 128

/* The scalar reference of KN_W_Q4_K_R8 rows [r0, r1) (kn_q4r8.c): a kn_qrows_fn
 * that needs the Q8_K form of a; the C and AVX2 levels run it. */
void kn__q4r8_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                       int accumulate, int32_t r0, int32_t r1);

/* KN_W_Q6_K_R8 (kn_quant.h): the offsets in a block of 8 rows x 256 columns. */
#define KN_Q6R8_BLK 1680
#define KN_Q6R8_D 0
#define KN_Q6R8_SC 16  /* int8 [16][8] */
#define KN_Q6R8_QS 144 /* 4 quarters of 384 bytes: ql[4][64], then qh[2][64] */
#define KN_Q6R8_QQ 384

/* The scalar reference of KN_W_Q6_K_R8 rows [r0, r1) (kn_q6r8.c), as
 * kn__q4r8_rows_ref; and row r dequantized (kn_weight_row). */
void kn__q6r8_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                       int accumulate, int32_t r0, int32_t r1);
void kn__q6r8_row(const kn_weight_t *w, int32_t r, float *dst);

/* KN_W_Q8_0_R16 (kn_quant.h): a block of 16 rows x 32 columns, its codes' offset. */
#define KN_Q8R16_BLK 544
#define KN_Q8R16_QS 32

/* The scalar reference of KN_W_Q8_0_R16 rows [r0, r1) (kn_q8r16.c): a
 * kn_qrows_fn that needs the 8-bit form of a; the C level runs it. */
void kn__q8r16_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                        int accumulate, int32_t r0, int32_t r1);
/* Row r of a KN_W_Q8_0_R16 weight dequantized into dst (w->cols floats). */
void kn__q8r16_row(const kn_weight_t *w, int32_t r, float *dst);

/* The last step of the repacked types' scalar references: y at yp (row
 * r of a token) becomes acc, plus bias[r] if bias, plus its old value if
 * accumulate, added in that order as the SIMD kernels add them. */
static inline void
kn__ref_store(float *yp, float acc, const float *bias, int32_t r, int accumulate)
{
    float v = acc;

    if (bias != NULL) {
        v = v + bias[r];
    }
    if (accumulate) {
        v = v + *yp;
    }
    *yp = v;
}

/* The 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block's
 * scales[12] (ggml's get_scale_min_k4). */
static inline void
kn__k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Round to nearest, ties to even, for |f| < 2^22: ggml's nearest_int. */
static inline int
kn__nearest_int(float f)
{
    float v = f + 12582912.f;
    int32_t i;

    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

#endif /* KERNELS_CPU_KN_QUANT_INT_H */
