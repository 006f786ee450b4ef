/* kn_quant.c - weight formats (kn_quant.h): block layouts, dequantization,
 * ggml's reference quantizers, the activation forms, the scalar reference
 * product, and the dispatch of kn_matmul_w() over ISA levels and threads.
 *
 * DESIGN. Built without FMA contraction (kernels/meson.build): the
 * dequantizers must round each product as ggml's C code is written
 * ((d * sc) * q - dmin * m), and the quantizers' searches compare sums
 * whose order decides ties. The block layouts (ggml-common.h):
 *   q8_0  {f16 d; int8 qs[32]}                          34 bytes / 32
 *   q4_0  {f16 d; u8 qs[16]}  lo nibbles 0..15, hi 16..31, value d(q-8)
 *   q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}     144 bytes / 256
 *   q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}  176
 *   q6_K  {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}      210
 * q4_K / q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in
 * scales[12]; value d * sc * q - dmin * m. q6_K: 16 groups of 16 with an
 * int8 scale; value d * sc * (q - 32).
 *
 * Thread: no state but what callers pass; kn_matmul_w() runs regions on
 * the kernel team (kn_pool.c).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_int.h"
#include "kernels/cpu/kn_quant_int.h"
#include "kernels/cpu/kv_quant.h"

/* ---- types --------------------------------------------------------------- */

static const struct {
    const char *name;
    int32_t elems;
    size_t bytes;
} kn_wtypes[KN_W_NTYPES] = {
    [KN_W_F32] = {"f32", 1, 4},       [KN_W_F16] = {"f16", 1, 2},
    [KN_W_BF16] = {"bf16", 1, 2},     [KN_W_Q8_0] = {"q8_0", 32, 34},
    [KN_W_Q4_0] = {"q4_0", 32, 18},   [KN_W_Q4_K] = {"q4_k", 256, 144},
    [KN_W_Q5_K] = {"q5_k", 256, 176}, [KN_W_Q6_K] = {"q6_k", 256, 210},
};

/* Whether t is a repacked type (read with the Q8_K activations). */
static int
wtype_is_r8(kn_wtype_t t)
{
    return t == KN_W_Q4_K_R8 || t == KN_W_Q6_K_R8;
}

const char *
kn_wtype_name(kn_wtype_t t)
{
    if (t == KN_W_Q8_0_R16) {
        return "q8_0_r16";
    }
    if (wtype_is_r8(t)) {
        return t == KN_W_Q4_K_R8 ? "q4_k_r8" : "q6_k_r8";
    }
    return (unsigned)t < KN_W_NTYPES ? kn_wtypes[t].name : "?";
}

int32_t
kn_wtype_block_elems(kn_wtype_t t)
{
    if (t == KN_W_Q8_0_R16) {
        return 32;
    }
    return wtype_is_r8(t) ? 256 : (unsigned)t < KN_W_NTYPES ? kn_wtypes[t].elems : 0;
}

size_t
kn_wtype_block_bytes(kn_wtype_t t)
{
    if (t == KN_W_Q8_0_R16) {
        return KN_Q8R16_BLK / 16;
    }
    if (wtype_is_r8(t)) {
        return t == KN_W_Q4_K_R8 ? KN_R8_BLK / 8 : KN_Q6R8_BLK / 8;
    }
    return (unsigned)t < KN_W_NTYPES ? kn_wtypes[t].bytes : 0;
}

size_t
kn_wtype_row_bytes(kn_wtype_t t, int64_t cols)
{
    int32_t be = kn_wtype_block_elems(t);

    if (be == 0 || cols < 0 || cols % be != 0) {
        return 0;
    }
    return (size_t)(cols / be) * kn_wtype_block_bytes(t);
}

static inline float
f16_at(const uint8_t *p)
{
    return kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline void
f16_put(uint8_t *p, float x)
{
    uint16_t h = kn_f32_to_f16(x);

    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Block j (of 32 elements) of a Q row in the decoded form: element i is
 * a[i / 16] * s[i] + c[i / 16] (c only for q4_K / q5_K: -dmin * m). Written
 * apart from the SIMD decoders (kn_quant_body.inc) so the reference checks
 * them. */
static void
q_block32(kn_wtype_t t, const uint8_t *row, int64_t j, int8_t s[32], float a[2], float c[2])
{
    c[0] = c[1] = 0.0f;
    switch (t) {
    case KN_W_Q8_0: {
        const uint8_t *b = row + 34 * j;

        a[0] = a[1] = f16_at(b);
        memcpy(s, b + 2, 32);
        break;
    }
    case KN_W_Q4_0: {
        const uint8_t *b = row + 18 * j;

        a[0] = a[1] = f16_at(b);
        for (int l = 0; l < 16; l++) {
            s[l] = (int8_t)((b[2 + l] & 0xF) - 8);
            s[l + 16] = (int8_t)((b[2 + l] >> 4) - 8);
        }
        break;
    }
    case KN_W_Q4_K:
    case KN_W_Q5_K: {
        int k5 = t == KN_W_Q5_K, sub = (int)(j % 8), g = sub / 2, sc, m;
        const uint8_t *b = row + (k5 ? 176 : 144) * (j / 8);
        const uint8_t *qs = b + (k5 ? 48 : 16) + 32 * g, *qh = b + 16;

        kn__k4_scale_min(sub, b + 4, &sc, &m);
        a[0] = a[1] = f16_at(b) * (float)sc;
        c[0] = c[1] = -(f16_at(b + 2) * (float)m);
        for (int l = 0; l < 32; l++) {
            int q = (sub & 1) ? qs[l] >> 4 : qs[l] & 0xF;

            if (k5) {
                q |= ((qh[l] >> sub) & 1) << 4;
            }
            s[l] = (int8_t)q;
        }
        break;
    }
    case KN_W_Q6_K: {
        const uint8_t *b = row + 210 * (j / 8);
        int e0 = (int)(j % 8) * 32, n = e0 / 128, qd = (e0 % 128) / 32;
        const uint8_t *ql = b + 64 * n + (qd & 1) * 32, *qh = b + 128 + 32 * n;
        const int8_t *scl = (const int8_t *)(b + 192);
        float d = f16_at(b + 208);

        for (int l = 0; l < 32; l++) {
            int lo = (qd & 2) ? ql[l] >> 4 : ql[l] & 0xF;
            int hi = (qh[l] >> (2 * qd)) & 3;

            s[l] = (int8_t)((lo | (hi << 4)) - 32);
        }
        a[0] = d * (float)scl[e0 / 16];
        a[1] = d * (float)scl[e0 / 16 + 1];
        break;
    }
    default:
        memset(s, 0, 32);
        a[0] = a[1] = 0.0f;
        break;
    }
}

/* ---- dequantization ------------------------------------------------------ */

void
kn_dequant_row(kn_wtype_t t, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;

    switch (t) {
    case KN_W_F32:
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    case KN_W_F16:
        for (int64_t i = 0; i < n; i++) {
            dst[i] = f16_at(p + 2 * i);
        }
        return;
    case KN_W_BF16:
        for (int64_t i = 0; i < n; i++) {
            dst[i] = kn_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        }
        return;
    case KN_W_Q4_K:
    case KN_W_Q5_K:
        for (int64_t j = 0; j < n / 32; j++) {
            int8_t s[32];
            float a[2], c[2];

            q_block32(t, p, j, s, a, c);
            for (int l = 0; l < 32; l++) {
                dst[32 * j + l] = a[l / 16] * (float)s[l] + c[l / 16]; /* d1 * q - m1 */
            }
        }
        return;
    case KN_W_Q8_0:
    case KN_W_Q4_0:
    case KN_W_Q6_K:
        for (int64_t j = 0; j < n / 32; j++) {
            int8_t s[32];
            float a[2], c[2];

            q_block32(t, p, j, s, a, c);
            for (int l = 0; l < 32; l++) {
                dst[32 * j + l] = a[l / 16] * (float)s[l]; /* q * d, (d * sc) * q */
            }
        }
        return;
    default:
        return;
    }
}

/* ---- quantization (ggml's reference algorithms) -------------------------- */

#define Q_GROUP_MAX_EPS 1e-15f

static inline int
q_clamp(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

static void
quant_q8_0(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, y += 34) {
        float amax = 0.0f;

        for (int l = 0; l < 32; l++) {
            amax = fmaxf(amax, fabsf(x[l]));
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;

        f16_put(y, d);
        for (int l = 0; l < 32; l++) {
            y[2 + l] = (uint8_t)(int8_t)roundf(x[l] * id);
        }
    }
}

static void
quant_q4_0(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, y += 18) {
        float amax = 0.0f, max = 0.0f;

        for (int l = 0; l < 32; l++) {
            if (amax < fabsf(x[l])) {
                amax = fabsf(x[l]);
                max = x[l];
            }
        }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;

        f16_put(y, d);
        for (int l = 0; l < 16; l++) {
            int q0 = (int8_t)(x[l] * id + 8.5f), q1 = (int8_t)(x[l + 16] * id + 8.5f);

            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[2 + l] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Scale and min of a group with the least weighted squared error over a
 * few candidate grids (ggml's make_qkx2_quants, use_mad false). L gets the
 * codes, *the_min the (positive) min; returns the scale. */
static float
q_make_qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
            uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];

    for (int i = 1; i < n; i++) {
        min = x[i] < min ? x[i] : min;
        max = x[i] > max ? x[i] : max;
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) {
        min = 0;
    }
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;

    for (int i = 0; i < n; i++) {
        int l = q_clamp(kn__nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * l + min - x[i];

        L[i] = (uint8_t)l;
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;

        iscale = (rmin + rdelta * is + nmax) / (max - min);
        for (int i = 0; i < n; i++) {
            int l = q_clamp(kn__nearest_int(iscale * (x[i] - min)), 0, nmax);

            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;

        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            float err = 0;

            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];

                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* q4_K (nmax 15) and q5_K (nmax 31) share the scale search and packing of
 * the scales; they differ in the code packing. */
static void
quant_k45(const float *x, uint8_t *y, int64_t nb, int k5)
{
    int nmax = k5 ? 31 : 15;
    size_t bb = k5 ? 176 : 144;

    for (int64_t i = 0; i < nb; i++, x += 256, y += bb) {
        uint8_t L[256], Laux[32], *sc = y + 4;
        float w[32], mins[8], scales[8], max_scale = 0, max_min = 0;

        for (int j = 0; j < 8; j++) {
            float sum_x2 = 0;

            for (int l = 0; l < 32; l++) {
                sum_x2 += x[32 * j + l] * x[32 * j + l];
            }
            float av_x = sqrtf(sum_x2 / 32);

            for (int l = 0; l < 32; l++) {
                w[l] = av_x + fabsf(x[32 * j + l]);
            }
            scales[j] = q_make_qkx2(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux,
                                    k5 ? -0.5f : -1.f, 0.1f, k5 ? 15 : 20);
            max_scale = scales[j] > max_scale ? scales[j] : max_scale;
            max_min = mins[j] > max_min ? mins[j] : max_min;
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        float inv_min = max_min > 0 ? 63.f / max_min : 0.f;

        memset(sc, 0, 12);
        for (int j = 0; j < 8; j++) {
            uint8_t ls = (uint8_t)kn__nearest_int(inv_scale * scales[j]);
            uint8_t lm = (uint8_t)kn__nearest_int(inv_min * mins[j]);

            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
            if (j < 4) {
                sc[j] = ls;
                sc[j + 4] = lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        f16_put(y, max_scale / 63.f);
        f16_put(y + 2, max_min / 63.f);
        for (int j = 0; j < 8; j++) {
            int ls, lm;

            kn__k4_scale_min(j, sc, &ls, &lm);
            float d = f16_at(y) * ls;

            if (d == 0.0f) {
                continue;
            }
            float dm = f16_at(y + 2) * lm;

            for (int l = 0; l < 32; l++) {
                L[32 * j + l] =
                    (uint8_t)q_clamp(kn__nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
            }
        }
        if (!k5) {
            uint8_t *q = y + 16;

            for (int j = 0; j < 256; j += 64, q += 32) {
                for (int l = 0; l < 32; l++) {
                    q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
                }
            }
        } else {
            uint8_t *qh = y + 16, *ql = y + 48, m1 = 1, m2 = 2;

            memset(qh, 0, 32);
            for (int n = 0; n < 256; n += 64, ql += 32) {
                for (int j = 0; j < 32; j++) {
                    int l1 = L[n + j], l2 = L[n + j + 32];

                    if (l1 > 15) {
                        l1 -= 16;
                        qh[j] |= m1;
                    }
                    if (l2 > 15) {
                        l2 -= 16;
                        qh[j] |= m2;
                    }
                    ql[j] = (uint8_t)(l1 | (l2 << 4));
                }
                m1 = (uint8_t)(m1 << 2);
                m2 = (uint8_t)(m2 << 2);
            }
        }
    }
}

/* Symmetric scale search (ggml's make_qx_quants, rmse_type 1: weights
 * x^2): L gets codes + nmax; returns the scale. */
static float
q_make_qx(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;

    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < Q_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;

    for (int i = 0; i < n; i++) {
        int l = q_clamp(kn__nearest_int(iscale * x[i]), -nmax, nmax - 1);
        float w = x[i] * x[i];

        L[i] = (int8_t)(l + nmax);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;

    for (int is = -9; is <= 9; is++) {
        if (is == 0) {
            continue;
        }
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = q_clamp(kn__nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];

            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                L[i] = (int8_t)(nmax + q_clamp(kn__nearest_int(iscale * x[i]), -nmax, nmax - 1));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void
quant_q6_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 256, y += 210) {
        int8_t L[256], *scl = (int8_t *)(y + 192);
        float scales[16], max_scale = 0, max_abs = 0;

        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = q_make_qx(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs) {
                max_abs = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs < Q_GROUP_MAX_EPS) {
            memset(y, 0, 210);
            continue;
        }
        float iscale = -128.f / max_scale;

        f16_put(y + 208, 1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            int v = kn__nearest_int(iscale * scales[ib]);

            scl[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            float d = f16_at(y + 208) * scl[j];

            if (d == 0.0f) {
                continue;
            }
            for (int l = 0; l < 16; l++) {
                L[16 * j + l] = (int8_t)(q_clamp(kn__nearest_int(x[16 * j + l] / d), -32, 31) + 32);
            }
        }
        uint8_t *ql = y, *qh = y + 128;

        for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;

                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

void
kn_quant_row(kn_wtype_t t, const float *src, void *dst, int64_t n)
{
    uint8_t *y = dst;

    switch (t) {
    case KN_W_F32:
        memcpy(dst, src, sizeof(float) * (size_t)n);
        break;
    case KN_W_F16:
        for (int64_t i = 0; i < n; i++) {
            f16_put(y + 2 * i, src[i]);
        }
        break;
    case KN_W_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kn_f32_to_bf16(src[i]);

            y[2 * i] = (uint8_t)h;
            y[2 * i + 1] = (uint8_t)(h >> 8);
        }
        break;
    case KN_W_Q8_0:
        quant_q8_0(src, y, n / 32);
        break;
    case KN_W_Q4_0:
        quant_q4_0(src, y, n / 32);
        break;
    case KN_W_Q4_K:
        quant_k45(src, y, n / 256, 0);
        break;
    case KN_W_Q5_K:
        quant_k45(src, y, n / 256, 1);
        break;
    case KN_W_Q6_K:
        quant_q6_k(src, y, n / 256);
        break;
    default:
        break;
    }
}

/* ---- activations --------------------------------------------------------- */

static int32_t
act_pad(int32_t d_in)
{
    return (d_in + KN_QK - 1) / KN_QK * KN_QK;
}

size_t
kn_act_bytes(int32_t n_tok, int32_t d_in)
{
    /* codes 1 + dl 1 + s16 1/4 + d32 1/8 + s32 1/8 + c32 1/8 + transposed codes 1 bytes
     * per column */
    size_t per = (size_t)act_pad(d_in);

    /* + the Q8_K form: codes 1, kd 1/64, kbs 1/16, kc16 1/4; + the bf16 form: 2 + 2 */
    return (size_t)n_tok * (per + per + per / 4 + per / 4 + per / 8 + per + per + per / 64 +
                            per / 16 + per / 4 + 4 * per) +
           13 * 64;
}

size_t
kn_act_bytes_bf16(int32_t n_tok, int32_t d_in)
{
    return (size_t)n_tok * 4 * (size_t)act_pad(d_in) + 2 * 64;
}

static void *
act_carve(uintptr_t *p, size_t bytes)
{
    uintptr_t at = (*p + 63) & ~(uintptr_t)63;

    *p = at + bytes;
    return (void *)at;
}

void
kn_act_init(kn_act_t *a, const float *x, int32_t n_tok, int32_t d_in, void *buf)
{
    uintptr_t p = (uintptr_t)buf;
    size_t n = (size_t)n_tok * (size_t)act_pad(d_in);

    a->x = x;
    a->n_tok = n_tok;
    a->d_in = d_in;
    a->d_pad = act_pad(d_in);
    a->q = act_carve(&p, n);
    a->dl = act_carve(&p, n);
    a->s16 = act_carve(&p, n / 4);
    a->d32 = act_carve(&p, n / 8);
    a->s32 = act_carve(&p, n / 8);
    a->c32 = act_carve(&p, n / 8);
    a->qt = act_carve(&p, n);
    a->have_q8 = 0;
    a->kq = act_carve(&p, n);
    a->kd = act_carve(&p, n / 64);
    a->kbs = act_carve(&p, n / 16);
    a->kc16 = act_carve(&p, n / 4);
    a->have_q8k = 0;
    a->bh = act_carve(&p, 2 * n);
    a->bl = act_carve(&p, 2 * n);
    a->br = (float *)(void *)a->bh; /* bl follows bh: 2n is a multiple of 64 */
    a->have_bf16 = 0;
    a->bf16_medium = 0;
}

/* One token's 8-bit form: per block of 32, d = absmax / 127 and
 * q = round-half-even(x / d) (x * (1 / d), as ggml's q8 quantizers). */
static void
act_q8_row(const float *x, int32_t d_in, int32_t d_pad, int8_t *q, float *dl, float *s16,
           float *d32, float *s32, int32_t *c32)
{
    for (int32_t b = 0; b < d_pad / 32; b++) {
        int32_t n = d_in - 32 * b < 32 ? d_in - 32 * b : 32;
        float amax = 0.0f;

        n = n > 0 ? n : 0;
        /* fmaxf's result (NaN ignored) as a compare the compiler vectorizes */
        for (int32_t l = 0; l < n; l++) {
            float v = fabsf(x[32 * b + l]);

            amax = v > amax ? v : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum[2] = {0, 0};

        if (n == 32) { /* fixed trip counts: vectorized */
            for (int h = 0; h < 2; h++) {
                int sh = 0;

                for (int32_t l = 16 * h; l < 16 * h + 16; l++) {
                    int v = kn__nearest_int(x[32 * b + l] * id);

                    q[32 * b + l] = (int8_t)v;
                    sh += v;
                }
                sum[h] = sh;
            }
        } else {
            for (int32_t l = 0; l < 32; l++) {
                int v = l < n ? kn__nearest_int(x[32 * b + l] * id) : 0;

                q[32 * b + l] = (int8_t)v;
                sum[l / 16] += v;
            }
        }
        for (int l = 0; l < 8; l++) {
            dl[8 * b + l] = d;
        }
        s16[2 * b] = d * (float)sum[0];
        s16[2 * b + 1] = d * (float)sum[1];
        d32[b] = d;
        s32[b] = d * (float)(sum[0] + sum[1]);
        c32[b] = -128 * (sum[0] + sum[1]);
    }
}

/* Token t's 8-bit forms (act_q8_row, then the transposed copy qt). */
static void
act_q8_tok(kn_act_t *a, int32_t t)
{
    size_t o = (size_t)t * a->d_pad;

    act_q8_row(a->x + (size_t)t * a->d_in, a->d_in, a->d_pad, a->q + o, a->dl + o / 4,
               a->s16 + o / 16, a->d32 + o / 32, a->s32 + o / 32, a->c32 + o / 32);
    for (size_t s = 0; s < (size_t)a->d_pad; s += KN_QK) {
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 8; j++) {
                memcpy(a->qt + o + s + 32 * i + 4 * j, a->q + o + s + 32 * j + 4 * i, 4);
            }
        }
    }
}

/* kn__act_tokens' region: a share of the tokens. */
typedef struct act_job {
    kn_act_t *a;
    void (*tok)(kn_act_t *a, int32_t t);
} act_job_t;

static void
act_region(void *arg, int chunk, int n_chunks)
{
    const act_job_t *j = arg;
    int32_t n = j->a->n_tok, per = (n + n_chunks - 1) / n_chunks;
    int32_t t0 = chunk * per < n ? chunk * per : n;
    int32_t t1 = t0 + per < n ? t0 + per : n;

    for (int32_t t = t0; t < t1; t++) {
        j->tok(j->a, t);
    }
}

/* Elements from which the activation quantizers split their tokens over
 * the team (a batch-32 step spent 2% of its time there, serial). */
#define KN_QACT_PAR (1L << 15)

void
kn__act_tokens(kn_act_t *a, void (*tok)(kn_act_t *a, int32_t t))
{
    int nt = (long)a->n_tok * a->d_pad >= KN_QACT_PAR ? kn_cpu_threads() : 1;
    act_job_t j = {a, tok};

    if (nt > 1 && a->n_tok > 1) {
        /* Each token's codes depend on that token alone: the split changes no bit. */
        kn__pool_run(nt, a->n_tok < nt * 4 ? a->n_tok : nt * 4, act_region, &j);
    } else {
        for (int32_t t = 0; t < a->n_tok; t++) {
            tok(a, t);
        }
    }
}

void
kn_act_quantize_q8_rows(kn_act_t *a, int32_t t0, int32_t t1)
{
    for (int32_t t = t0; t < t1; t++) {
        act_q8_tok(a, t);
    }
}

void
kn_act_quantize_q8(kn_act_t *a)
{
    if (a->have_q8) {
        return;
    }
    kn__act_tokens(a, act_q8_tok);
    a->have_q8 = 1;
}

/* ---- reference ----------------------------------------------------------- */

/* v with a subnormal made zero: vdpbf16ps reads its inputs so (DAZ). */
static inline double
bf16_daz(float v)
{
    return fabsf(v) < FLT_MIN ? 0.0 : (double)v;
}

static int
wtype_is_q(kn_wtype_t t)
{
    return t >= KN_W_Q8_0 && t < KN_W_NTYPES;
}

void
kn_matmul_w_ref(const float *x, int32_t n_tok, const kn_weight_t *w, const float *bias, float *y,
                int accumulate)
{
    int32_t d_in = w->cols, d_out = w->rows;

    if (w->type == KN_W_F32) {
        kn_cpu_matmul_ref(x, w->data, bias, y, n_tok, d_in, d_out, accumulate);
        return;
    }
    kn_act_t a;

    if (wtype_is_r8(w->type)) { /* its own reference, exact to its kernels */
        void *kb = xmalloc(kn_act_bytes(n_tok, d_in));

        kn_act_init(&a, x, n_tok, d_in, kb);
        kn_act_quantize_q8k(&a);
        if (w->type == KN_W_Q4_K_R8) {
            kn__q4r8_rows_ref(&a, w, bias, y, accumulate, 0, d_out);
        } else {
            kn__q6r8_rows_ref(&a, w, bias, y, accumulate, 0, d_out);
        }
        free(kb);
        return;
    }
    if (w->type == KN_W_Q8_0_R16) { /* its own reference, exact to its kernels */
        void *qb = xmalloc(kn_act_bytes(n_tok, d_in));

        kn_act_init(&a, x, n_tok, d_in, qb);
        kn_act_quantize_q8(&a);
        kn__q8r16_rows_ref(&a, w, bias, y, accumulate, 0, d_out);
        free(qb);
        return;
    }
    void *buf = xmalloc(kn_act_bytes(n_tok, d_in));
    float *wrow = xmalloc(sizeof(float) * (size_t)d_in);

    kn_act_init(&a, x, n_tok, d_in, buf);
    if (wtype_is_q(w->type)) {
        kn_act_quantize_q8(&a);
    }
    for (int32_t o = 0; o < d_out; o++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;

        if (!wtype_is_q(w->type)) {
            kn_dequant_row(w->type, row, wrow, d_in);
        }
        for (int32_t t = 0; t < n_tok; t++) {
            size_t xo = (size_t)t * a.d_pad;
            double acc = 0.0;

            if (w->type == KN_W_BF16) {
                /* w * (bh + bl), the bf16 form's two terms (kn_quant.h),
                 * subnormals as zero, each product exact in double. */
                for (int32_t i = 0; i < d_in; i++) {
                    float xv = x[(size_t)t * d_in + i];
                    uint16_t h = kn_f32_to_bf16(xv);
                    float hf = kn_bf16_to_f32(h);
                    float lf = isfinite(hf) ? kn_bf16_to_f32(kn_f32_to_bf16(xv - hf)) : 0.0f;

                    acc += bf16_daz(wrow[i]) * (bf16_daz(hf) + bf16_daz(lf));
                }
            } else if (!wtype_is_q(w->type)) { /* f16: w * x, exact in double */
                for (int32_t i = 0; i < d_in; i++) {
                    acc += (double)wrow[i] * x[(size_t)t * d_in + i];
                }
            } else {
                for (int32_t j = 0; j < d_in / 32; j++) {
                    int8_t s[32];
                    float aw[2], c[2];

                    q_block32(w->type, row, j, s, aw, c);
                    for (int h = 0; h < 2; h++) {
                        int isum = 0;

                        for (int l = 0; l < 16; l++) {
                            isum += s[16 * h + l] * a.q[xo + 32 * j + 16 * h + l];
                        }
                        /* The fast path's f32 products of the scales. */
                        acc += (double)isum * (double)(aw[h] * a.dl[(xo + 32 * j) / 4]);
                        acc += (double)(c[h] * a.s16[(xo + 32 * j) / 16 + h]);
                    }
                }
            }
            float *yp = y + (size_t)t * d_out + o;
            double base = (accumulate ? (double)*yp : 0.0) + (bias != NULL ? bias[o] : 0.0);

            *yp = (float)(base + acc);
        }
    }
    free(wrow);
    free(buf);
}

/* ---- embedding ----------------------------------------------------------- */

void
kn_embed_w(const kn_weight_t *w, const int32_t *tokens, int32_t n_tok, float *out)
{
    for (int32_t t = 0; t < n_tok; t++) {
        kn_weight_row(w, tokens[t], out + (size_t)t * w->cols);
    }
}

/* ---- dispatch ------------------------------------------------------------ */

/* Multiply-adds below which a product stays on the calling thread (as
 * kn_cpu_matmul's KN_PAR_GEMM), and chunks per thread of a region. */
#define KN_QPAR (1L << 19)
#define KN_QCHUNKS 16

typedef struct kn_qjob {
    kn_qrows_fn fn;
    const kn_act_t *a;
    const kn_weight_t *w;
    const float *bias;
    float *y;
    int accumulate;
} kn_qjob_t;

static void
kn_qregion(void *arg, int chunk, int n_chunks)
{
    const kn_qjob_t *j = arg;
    int32_t rows = j->w->rows;
    /* Shares of 16-row multiples: whole 4-row tiles, each on its own cache lines. */
    int32_t per = ((rows + n_chunks - 1) / n_chunks + 15) / 16 * 16;
    int32_t r0 = chunk * per < rows ? chunk * per : rows;
    int32_t r1 = r0 + per < rows ? r0 + per : rows;

    if (r0 < r1) {
        j->fn(j->a, j->w, j->bias, j->y, j->accumulate, r0, r1);
    }
}

static kn_qrows_fn
kn_qrows_for_isa(kn_isa_t isa)
{
#if defined(__x86_64__) || defined(__i386__)
    static int f16c = -1;

    /* The SIMD decoders convert f16 scales with F16C, which every AVX2 CPU
     * shipped has; checked anyway, since the ISA levels do not name it. */
    if (f16c < 0) { /* cpuid leaf 1, ecx bit 29 (clang 14 has no "f16c" builtin name) */
        unsigned int eax, ebx, ecx = 0, edx;

        f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    }
    if (!f16c) {
        return kn__qrows_generic;
    }
    switch (isa) {
    case KN_ISA_AVX2:
        return kn__qrows_avx2;
    case KN_ISA_AVX512:
        return kn__qrows_avx512;
    case KN_ISA_AVX512_VNNI:
        return kn__qrows_vnni;
    default:
        break;
    }
#else
    (void)isa;
#endif
    return kn__qrows_generic;
}

void
kn_matmul_w(kn_act_t *a, const kn_weight_t *w, const float *bias, float *y, int accumulate)
{
    kn_qjob_t j = {kn_qrows_for_isa(kn_cpu_isa()), a, w, bias, y, accumulate};
    long work = (long)a->n_tok * w->rows * w->cols;
    int nt = work >= KN_QPAR ? kn_cpu_threads() : 1;

    if (w->type == KN_W_F32) {
        kn_cpu_matmul(a->x, w->data, bias, y, a->n_tok, w->cols, w->rows, accumulate);
        return;
    }
    if (wtype_is_q(w->type) || w->type == KN_W_Q8_0_R16) {
        kn_act_quantize_q8(a);
    } else if (wtype_is_r8(w->type)) {
        kn_act_quantize_q8k(a);
    } else if (w->type == KN_W_BF16) {
        kn__act_bf16_for(a, j.fn == kn__qrows_vnni);
    }
    if (nt <= 1 || w->rows < 32) {
        j.fn(a, w, bias, y, accumulate, 0, w->rows);
        return;
    }
    int n_chunks = nt * KN_QCHUNKS;

    if (n_chunks > w->rows / 16) {
        n_chunks = w->rows / 16;
    }
    kn__pool_run(nt, n_chunks, kn_qregion, &j);
}

/* kn_matmul_w_n's region: the rows of every weight, end to end, cut into
 * shares of 16-row multiples. */
typedef struct kn_qjobs {
    kn_qrows_fn fn;
    const kn_act_t *a;
    int n;
    const kn_weight_t *const *w;
    const float *const *bias;
    float *const *y;
    int accumulate;
    int32_t rows; /* sum of w[i]->rows */
} kn_qjobs_t;

static void
kn_qregion_n(void *arg, int chunk, int n_chunks)
{
    const kn_qjobs_t *j = arg;
    int32_t per = ((j->rows + n_chunks - 1) / n_chunks + 15) / 16 * 16;
    int32_t c0 = chunk * per < j->rows ? chunk * per : j->rows;
    int32_t c1 = c0 + per < j->rows ? c0 + per : j->rows, base = 0;

    for (int i = 0; i < j->n && base < c1; i++) {
        int32_t r0 = c0 - base > 0 ? c0 - base : 0;
        int32_t r1 = c1 - base < j->w[i]->rows ? c1 - base : j->w[i]->rows;

        if (r0 < r1) {
            j->fn(j->a, j->w[i], j->bias != NULL ? j->bias[i] : NULL, j->y[i], j->accumulate, r0,
                  r1);
        }
        base += j->w[i]->rows;
    }
}

void
kn_matmul_w_n(kn_act_t *a, int n, const kn_weight_t *const w[], const float *const bias[],
              float *const y[], int accumulate)
{
    kn_qjobs_t j = {kn_qrows_for_isa(kn_cpu_isa()), a, n, w, bias, y, accumulate, 0};
    long work = 0;
    int any_q = 0, any_r8 = 0, any_bf16 = 0, nt;

    for (int i = 0; i < n; i++) {
        if (w[i]->type == KN_W_F32) { /* kn_cpu_matmul splits its own rows */
            for (int k = 0; k < n; k++) {
                kn_matmul_w(a, w[k], bias != NULL ? bias[k] : NULL, y[k], accumulate);
            }
            return;
        }
        any_q |= wtype_is_q(w[i]->type) || w[i]->type == KN_W_Q8_0_R16;
        any_r8 |= wtype_is_r8(w[i]->type);
        any_bf16 |= w[i]->type == KN_W_BF16;
        j.rows += w[i]->rows;
        work += (long)a->n_tok * w[i]->rows * w[i]->cols;
    }
    if (any_q) {
        kn_act_quantize_q8(a);
    }
    if (any_r8) {
        kn_act_quantize_q8k(a);
    }
    if (any_bf16) {
        kn__act_bf16_for(a, j.fn == kn__qrows_vnni);
    }
    nt = work >= KN_QPAR ? kn_cpu_threads() : 1;
    if (nt <= 1 || j.rows < 32) {
        kn_qregion_n(&j, 0, 1);
        return;
    }
    int n_chunks = nt * KN_QCHUNKS;

    if (n_chunks > j.rows / 16) {
        n_chunks = j.rows / 16;
    }
    kn__pool_run(nt, n_chunks, kn_qregion_n, &j);
}
