/* kn_q8r16.c - q8_0 weights repacked 16 rows at a time (KN_W_Q8_0_R16,
 * kernels/cpu/kn_quant.h): the load-time repack, its dequantizer and the
 * scalar reference of its product (the C level's kernel; the SIMD levels
 * run kn_q8r16_body.inc and give the same bits).
 *
 * DESIGN. The file's q8_0 rows keep each block of 32 codes after its own
 * f16 scale, so a kernel that reads a row against a token sums 32
 * products across the lanes of a vector and reduces them. The repack puts
 * the 16 rows of a group side by side, 4 codes of a row per dword lane,
 * so one 64-byte load serves 16 rows x 4 columns and a vpdpbusd with the
 * token's 4 codes broadcast (an embedded {1to16} operand) leaves each
 * row's partial sum in its own lane: no reductions, one f32 FMA per block
 * of 32 for 16 rows. The codes are stored as q + 128 (the unsigned
 * operand of vpdpbusd; the activation's exact c32 = -128 sum(xq) takes
 * the offset off). Built without FMA contraction (kernels/meson.build):
 * the reference's fmaf per block is explicit, like the kernels' vfmadd.
 *
 * Thread: no state.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kn_quant_int.h"
#include "kernels/cpu/kv_quant.h"

size_t
kn_q8r16_bytes(int32_t rows, int32_t cols)
{
    return (size_t)(rows / 16) * (size_t)(cols / 32) * KN_Q8R16_BLK;
}

/* One block of 16 rows x 32 columns from the rows' q8_0 blocks (kn_repack_t). */
static void
q8r16_pack(const uint8_t *src, size_t stride, uint8_t *o)
{
    for (int r = 0; r < 16; r++) {
        const uint8_t *s = src + (size_t)r * stride;

        memcpy(o + 2 * r, s, 2);
        for (int i = 0; i < 8; i++) {
            for (int l = 0; l < 4; l++) {
                o[KN_Q8R16_QS + 64 * i + 4 * r + l] = (uint8_t)(s[2 + 4 * i + l] ^ 0x80);
            }
        }
    }
}

int
kn_q8r16_repack(const kn_weight_t *w, void *dst, kn_weight_t *out)
{
    static const kn_repack_t rp = {KN_W_Q8_0, KN_W_Q8_0_R16, 16, 32, KN_Q8R16_BLK, q8r16_pack};

    return kn__repack(w, &rp, dst, out);
}

/* Block b of row r's group. */
static inline const uint8_t *
r16_block(const kn_weight_t *w, int32_t r, int32_t b)
{
    return (const uint8_t *)w->data +
           ((size_t)(r / 16) * (size_t)(w->cols / 32) + (size_t)b) * KN_Q8R16_BLK;
}

/* The signed code of column l (0..31) of row rr (0..15) in block o. */
static inline int
r16_code(const uint8_t *o, int rr, int l)
{
    return (int8_t)(o[KN_Q8R16_QS + 64 * (l / 4) + 4 * rr + l % 4] ^ 0x80);
}

void
kn__q8r16_row(const kn_weight_t *w, int32_t r, float *dst)
{
    uint8_t blk[34]; /* the file's block, rebuilt: kn_dequant_row's bits */

    for (int32_t b = 0; b < w->cols / 32; b++) {
        const uint8_t *o = r16_block(w, r, b);

        memcpy(blk, o + 2 * (r % 16), 2);
        for (int l = 0; l < 32; l++) {
            blk[2 + l] = (uint8_t)r16_code(o, r % 16, l);
        }
        kn_dequant_row(KN_W_Q8_0, blk, dst + 32 * b, 32);
    }
}

void
kn__q8r16_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                   int accumulate, int32_t r0, int32_t r1)
{
    int32_t nb = w->cols / 32;

    for (int32_t r = r0; r < r1; r++) {
        int rr = r % 16;

        for (int32_t t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->q + (size_t)t * a->d_pad;
            const float *dx = a->d32 + (size_t)t * (a->d_pad / 32);
            float acc = 0.0f;

            for (int32_t b = 0; b < nb; b++) {
                const uint8_t *o = r16_block(w, r, b);
                int32_t isum = 0;

                for (int l = 0; l < 32; l++) {
                    isum += r16_code(o, rr, l) * xq[32 * b + l];
                }
                float dw = kn_f16_to_f32((uint16_t)(o[2 * rr] | (o[2 * rr + 1] << 8)));

                acc = fmaf(dw * dx[b], (float)isum, acc);
            }
            kn__ref_store(y + (size_t)t * w->rows + r, acc, bias, r, accumulate);
        }
    }
}
