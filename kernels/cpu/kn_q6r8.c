/* kn_q6r8.c - q6_K weights repacked 8 rows at a time (KN_W_Q6_K_R8,
 * kernels/cpu/kn_quant.h): the load-time repack, its dequantizer and the
 * scalar reference of its product (the C level's kernel; the SIMD levels
 * run kn_q6r8_body.inc and give the same bits).
 *
 * DESIGN. The file's q6_K rows spread each code over a nibble of ql and
 * two bits of qh at strides that differ by column; the repack puts, per
 * 256 columns, the 8 rows' d, their 16 int8 scales side by side, and
 * their codes split into low nibbles and top bits so that one 64-byte
 * vector of 8 columns x 8 rows comes out of a load of each with masks and
 * shifts (kn_quant.h has the layout). It reads the Q8_K activations of
 * KN_W_Q4_K_R8 (kn_q4r8.c) plus their sums per 16 (kc16), which remove
 * the codes' offset of 32 exactly. Built without FMA contraction
 * (kernels/meson.build): the one fmaf per 256 columns is explicit, like
 * the SIMD kernels' vfmadd.
 *
 * Thread: no state.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kn_int.h"
#include "kernels/cpu/kn_quant_int.h"
#include "kernels/cpu/kv_quant.h"

static inline float
q6r8_f16(const uint8_t *p)
{
    return kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* The 6-bit code (0..63) of column c (0..255) of a file q6_K block b
 * (ggml's dequantize_row_q6_K order). */
static inline int
q6_file_code(const uint8_t *b, int c)
{
    int n = c / 128, qd = (c % 128) / 32, l = c % 32;
    const uint8_t *ql = b + 64 * n + (qd & 1) * 32, *qh = b + 128 + 32 * n;
    int lo = (qd & 2) ? ql[l] >> 4 : ql[l] & 0xF;

    return lo | ((qh[l] >> (2 * qd)) & 3) << 4;
}

/* ---- repack -------------------------------------------------------------- */

size_t
kn_q6r8_bytes(int32_t rows, int32_t cols)
{
    return (size_t)(rows / 8) * (size_t)(cols / 256) * KN_Q6R8_BLK;
}

/* One block of 8 rows x 256 columns from the rows' q6_K blocks (kn_repack_t). */
static void
q6r8_pack(const uint8_t *src, size_t stride, uint8_t *o)
{
    memset(o + KN_Q6R8_QS, 0, KN_Q6R8_BLK - KN_Q6R8_QS);
    for (int r = 0; r < 8; r++) {
        const uint8_t *b = src + (size_t)r * stride;

        memcpy(o + KN_Q6R8_D + 2 * r, b + 208, 2);
        for (int g = 0; g < 16; g++) {
            o[KN_Q6R8_SC + 8 * g + r] = b[192 + g];
        }
        for (int c = 0; c < 256; c++) {
            int q = q6_file_code(b, c), qq = c / 64, p = (c % 64) / 8, i = c % 8;
            uint8_t *qs = o + KN_Q6R8_QS + KN_Q6R8_QQ * qq;

            qs[64 * (p % 4) + 8 * r + i] |= (uint8_t)((q & 0xF) << (4 * (p / 4)));
            qs[256 + 64 * (p / 4) + 8 * r + i] |= (uint8_t)((q >> 4) << (2 * (p % 4)));
        }
    }
}

int
kn_q6r8_repack(const kn_weight_t *w, void *dst, kn_weight_t *out)
{
    static const kn_repack_t rp = {KN_W_Q6_K, KN_W_Q6_K_R8, 8, 256, KN_Q6R8_BLK, q6r8_pack};

    return kn__repack(w, &rp, dst, out);
}

/* Block k of row r's group. */
static inline const uint8_t *
q6r8_block(const kn_weight_t *w, int32_t r, int32_t k)
{
    return (const uint8_t *)w->data + ((size_t)(r / 8) * (size_t)(w->cols / 256) + k) * KN_Q6R8_BLK;
}

/* Code (0..63) of column c (0..255) of row rr (0..7) in block o. */
static inline int
q6r8_code(const uint8_t *o, int rr, int c)
{
    int qq = c / 64, p = (c % 64) / 8, i = c % 8;
    const uint8_t *qs = o + KN_Q6R8_QS + KN_Q6R8_QQ * qq;
    int lo = (qs[64 * (p % 4) + 8 * rr + i] >> (4 * (p / 4))) & 0xF;
    int hi = (qs[256 + 64 * (p / 4) + 8 * rr + i] >> (2 * (p % 4))) & 3;

    return lo | hi << 4;
}

void
kn__q6r8_row(const kn_weight_t *w, int32_t r, float *dst)
{
    int rr = r % 8;

    for (int32_t k = 0; k < w->cols / 256; k++) {
        const uint8_t *o = q6r8_block(w, r, k);
        float d = q6r8_f16(o + KN_Q6R8_D + 2 * rr);

        for (int g = 0; g < 16; g++) {
            float a = d * (float)(int8_t)o[KN_Q6R8_SC + 8 * g + rr];

            for (int l = 0; l < 16; l++) { /* ggml: d * sc * q, q signed */
                dst[256 * k + 16 * g + l] = a * (float)(q6r8_code(o, rr, 16 * g + l) - 32);
            }
        }
    }
}

/* ---- reference product --------------------------------------------------- */

void
kn__q6r8_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                  int accumulate, int32_t r0, int32_t r1)
{
    int32_t nk = w->cols / 256;

    for (int32_t r = r0; r < r1; r++) {
        int rr = r % 8;

        for (int32_t t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->kq + (size_t)t * a->d_pad;
            float acc = 0.0f;

            for (int32_t k = 0; k < nk; k++) {
                const uint8_t *o = q6r8_block(w, r, k);
                int32_t s = 0;

                for (int g = 0; g < 16; g++) {
                    int32_t isum = 0, xs = 0;

                    for (int l = 0; l < 16; l++) {
                        int x = xq[256 * k + 16 * g + l];

                        isum += q6r8_code(o, rr, 16 * g + l) * x;
                        xs += x;
                    }
                    s += (int8_t)o[KN_Q6R8_SC + 8 * g + rr] * (isum - 32 * xs);
                }
                float dd =
                    q6r8_f16(o + KN_Q6R8_D + 2 * rr) * a->kd[(size_t)t * (a->d_pad / 256) + k];

                acc = fmaf(dd, (float)s, acc);
            }
            kn__ref_store(y + (size_t)t * w->rows + r, acc, bias, r, accumulate);
        }
    }
}
