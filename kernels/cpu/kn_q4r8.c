/* kn_q4r8.c - q4_K weights repacked 8 rows at a time (KN_W_Q4_K_R8,
 * kernels/cpu/kn_quant.h): the load-time repack, its dequantizer, the
 * Q8_K activation form it multiplies, and the scalar reference of its
 * product (the C and AVX2 levels' kernel; the AVX-512 levels run
 * kn_q4r8_body.inc and give the same bits).
 *
 * DESIGN. The file's q4_K rows keep each row's 6-bit scales packed in 12
 * bytes and its 256 codes in 128 bytes; a kernel that reads 8 rows side
 * by side from that layout pays gathers or transposes (see the measured
 * attempt in kn_quant_body.inc). The repack puts, per 256 columns, the
 * 8 rows' d / dmin, their scales and mins as bytes, and their code bytes
 * interleaved 8 at a time, so one vector load serves 8 rows with one
 * lane pair per row. Built without FMA contraction (kernels/meson.build):
 * the reference's two fmaf per 256 columns are explicit, like the SIMD
 * kernels' vfmadd / vfnmadd, and nothing else may fuse.
 *
 * Thread: no state; kn_act_quantize_q8k splits tokens over the team.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_int.h"
#include "kernels/cpu/kn_quant_int.h"
#include "kernels/cpu/kv_quant.h"

static inline float
r8_f16(const uint8_t *p)
{
    return kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* ---- repack -------------------------------------------------------------- */

size_t
kn_q4r8_bytes(int32_t rows, int32_t cols)
{
    return (size_t)(rows / 8) * (size_t)(cols / 256) * KN_R8_BLK;
}

/* One block of 8 rows x 256 columns from the rows' q4_K blocks (kn_repack_t). */
static void
q4r8_pack(const uint8_t *src, size_t stride, uint8_t *o)
{
    memset(o + KN_R8_SM, 0, KN_R8_QS - KN_R8_SM);
    for (int r = 0; r < 8; r++) {
        const uint8_t *b = src + (size_t)r * stride;

        memcpy(o + KN_R8_D + 2 * r, b, 2);
        memcpy(o + KN_R8_DMIN + 2 * r, b + 2, 2);
        for (int j = 0; j < 8; j++) {
            int sc, m, i = 2 * r + (j & 1);
            uint8_t *sm = o + KN_R8_SM + 24 * (j / 2);

            kn__k4_scale_min(j, b + 4, &sc, &m);
            sm[i] = (uint8_t)((sc & 0xF) | (m & 0xF) << 4);
            sm[16 + i / 2] |= (uint8_t)(((sc >> 4) | (m >> 4) << 4) << (2 * (i & 1)));
        }
        for (int g = 0; g < 4; g++) {
            for (int p = 0; p < 4; p++) {
                memcpy(o + KN_R8_QS + 256 * g + 64 * p + 8 * r, b + 16 + 32 * g + 8 * p, 8);
            }
        }
    }
}

int
kn_q4r8_repack(const kn_weight_t *w, void *dst, kn_weight_t *out)
{
    static const kn_repack_t rp = {KN_W_Q4_K, KN_W_Q4_K_R8, 8, 256, KN_R8_BLK, q4r8_pack};

    return kn__repack(w, &rp, dst, out);
}

/* Block k of row r's group and r's place in it. */
static inline const uint8_t *
r8_block(const kn_weight_t *w, int32_t r, int32_t k)
{
    return (const uint8_t *)w->data + ((size_t)(r / 8) * (size_t)(w->cols / 256) + k) * KN_R8_BLK;
}

/* The 6-bit scale and min of sub-block j of row rr in block o. */
static inline void
r8_scale_min(const uint8_t *o, int rr, int j, int *sc, int *m)
{
    const uint8_t *sm = o + KN_R8_SM + 24 * (j / 2);
    int i = 2 * rr + (j & 1), hi = sm[16 + i / 2] >> (2 * (i & 1));

    *sc = (sm[i] & 0xF) | (hi & 3) << 4;
    *m = (sm[i] >> 4) | (hi & 0x30);
}

/* Code of column c (0..255) of row rr (0..7) in block o. */
static inline int
r8_code(const uint8_t *o, int rr, int c)
{
    int g = c / 64, h = (c % 64) / 32, l = c % 32;
    uint8_t b = o[KN_R8_QS + 256 * g + 64 * (l / 8) + 8 * rr + l % 8];

    return h ? b >> 4 : b & 0xF;
}

void
kn_weight_row(const kn_weight_t *w, int32_t r, float *dst)
{
    if (w->type == KN_W_Q6_K_R8) {
        kn__q6r8_row(w, r, dst);
        return;
    }
    if (w->type == KN_W_Q8_0_R16) { /* kn_q8r16.c */
        kn__q8r16_row(w, r, dst);
        return;
    }
    if (w->type != KN_W_Q4_K_R8) {
        kn_dequant_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, dst, w->cols);
        return;
    }
    int rr = r % 8;

    for (int32_t k = 0; k < w->cols / 256; k++) {
        const uint8_t *o = r8_block(w, r, k);
        float d = r8_f16(o + KN_R8_D + 2 * rr), dm = r8_f16(o + KN_R8_DMIN + 2 * rr);

        for (int j = 0; j < 8; j++) {
            int sc, m;

            r8_scale_min(o, rr, j, &sc, &m);
            float d1 = d * (float)sc, m1 = dm * (float)m;

            for (int l = 0; l < 32; l++) { /* ggml: d1 * q - m1 */
                dst[256 * k + 32 * j + l] = d1 * (float)r8_code(o, rr, 32 * j + l) - m1;
            }
        }
    }
}

/* ---- Q8_K activations ---------------------------------------------------- */

/* Token t's Q8_K form: per 256 columns kd = absmax / 127, codes
 * round-half-even(x * (1 / kd)) clamped to +-127, exact sums per 32 and
 * (as -16 times) per 16. */
static void
q8k_tok(kn_act_t *a, int32_t t)
{
    const float *x = a->x + (size_t)t * a->d_in;
    int32_t nk = a->d_pad / 256;
    int8_t *q = a->kq + (size_t)t * a->d_pad;

    for (int32_t k = 0; k < nk; k++) {
        int32_t n = a->d_in - 256 * k < 256 ? a->d_in - 256 * k : 256;
        float amax = 0.0f;

        for (int32_t l = 0; l < n; l++) {
            float v = fabsf(x[256 * k + l]);

            amax = v > amax ? v : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;

        for (int32_t l = 0; l < 256; l++) {
            int v = l < n ? kn__nearest_int(x[256 * k + l] * id) : 0;

            q[256 * k + l] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        a->kd[(size_t)t * nk + k] = d;
        for (int j = 0; j < 8; j++) {
            int s = 0;

            for (int l = 0; l < 32; l++) {
                s += q[256 * k + 32 * j + l];
            }
            a->kbs[(size_t)t * (a->d_pad / 32) + 8 * k + j] = (int16_t)s;
        }
        for (int j = 0; j < 16; j++) { /* KN_W_Q6_K_R8's offsets (kn_q6r8.c) */
            int s = 0;

            for (int l = 0; l < 16; l++) {
                s += q[256 * k + 16 * j + l];
            }
            a->kc16[(size_t)t * (a->d_pad / 16) + 16 * k + j] = -16 * s;
        }
    }
}

void
kn_act_quantize_q8k(kn_act_t *a)
{
    if (a->have_q8k) {
        return;
    }
    kn__act_tokens(a, q8k_tok);
    a->have_q8k = 1;
}

/* ---- reference product --------------------------------------------------- */

void
kn__q4r8_rows_ref(const kn_act_t *a, const kn_weight_t *w, const float *bias, float *y,
                  int accumulate, int32_t r0, int32_t r1)
{
    int32_t nk = w->cols / 256;

    for (int32_t r = r0; r < r1; r++) {
        int rr = r % 8;

        for (int32_t t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->kq + (size_t)t * a->d_pad;
            const int16_t *bs = a->kbs + (size_t)t * (a->d_pad / 32);
            float acc = 0.0f;

            for (int32_t k = 0; k < nk; k++) {
                const uint8_t *o = r8_block(w, r, k);
                int32_t s1 = 0, s2 = 0;

                for (int j = 0; j < 8; j++) {
                    int32_t isum = 0;
                    int sc, m;

                    r8_scale_min(o, rr, j, &sc, &m);
                    for (int l = 0; l < 32; l++) {
                        isum += r8_code(o, rr, 32 * j + l) * xq[256 * k + 32 * j + l];
                    }
                    s1 += sc * isum;
                    s2 += m * bs[8 * k + j];
                }
                float dx = a->kd[(size_t)t * (a->d_pad / 256) + k];
                float dd = r8_f16(o + KN_R8_D + 2 * rr) * dx;
                float dm = r8_f16(o + KN_R8_DMIN + 2 * rr) * dx;

                acc = fmaf(dd, (float)s1, acc);
                acc = fmaf(-dm, (float)s2, acc);
            }
            kn__ref_store(y + (size_t)t * w->rows + r, acc, bias, r, accumulate);
        }
    }
}
