/* kn_tq.h - the row codec of the tq3 / tq4 KV dtypes (TurboQuant-style:
 * random rotation, Lloyd-Max scalar codes, QJL residual sketch for keys),
 * written once for the CPU store (kernels/cpu/kv_tq.c) and any device body.
 *
 * DESIGN. Per layer and KV head a fixed random orthogonal rotation
 *   R x = H (D x) / sqrt(d)
 * (D: random +-1 signs, H: the unnormalized Walsh-Hadamard transform,
 * O(d log d), d = head_dim a power of two in 16 .. 256). For x with norm
 * n, z = H D x / n has unit-variance coordinates of a known density
 * (tools/tq_codebook.py), so one fixed Lloyd-Max codebook per width fits
 * every token. A row of one token and KV head stores
 *
 *   keys   (b - 1)-bit codes of z, the 1-bit QJL sketch sign(S e) of the
 *          residual e = z - cb[code] (S = sqrt(d) Q, Q a fixed Haar random
 *          orthogonal d x d matrix per layer and KV head), n as f16,
 *          |e| / sqrt(d) as u8 (/255)
 *   values b-bit codes of z, n as an 8-bit log code (2^(1/12) steps)
 *
 * as bit planes: plane p holds bit p of each coordinate's code, byte
 * c / 8, bit c % 8; keys add the sign plane after their code planes, so
 * both kinds hold b planes of d / 8 bytes:
 *
 *   key row   [b planes][n f16 (2 bytes, little endian)][|e| u8]
 *   value row [b planes][n log8]
 *
 * Inner products never decode a key (qz = H D q, once per query head):
 *   q . k = n / d * (qz . cb[code] + |e| / (d c_d) * (S qz) . sgn)
 * where the second term is the QJL estimate of qz . e, unbiased over S:
 * each row s of S is uniform on the sphere of radius sqrt(d), so
 * E[sign(s . e) (s . y)] = c_d (e . y) / |e| with c_d = E|s . u| for unit
 * u (KN_TQ_QJL holds 1 / (d c_d)). QJL proper uses i.i.d. Gaussian rows
 * (c = sqrt(2/pi)); orthogonal rows keep the estimate unbiased and, at d
 * rows, cut its variance by about (pi/2) / (pi/2 - 1) = 2.75x.
 * Values: x = n / d * D H cb[code], so attention sums p_t n_t cb[code_t]
 * in the rotated domain and rotates the sum back once.
 *
 * KN_SHARED_FN (kernels/kn_shared.h) makes these __device__ inline under
 * nvcc and static inline in C; loops are serial and in a fixed order.
 *
 * Thread: any (pure functions).
 */
#ifndef KERNELS_KN_TQ_H
#define KERNELS_KN_TQ_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn_shared.h"

#if defined(__CUDACC__)
#define KN_TQ_TABLE_QUAL static __device__ const
#else
#define KN_TQ_TABLE_QUAL static const
#endif
#include "kernels/kn_tq_table.h"

#define KN_TQ_MAX_DIM 256
#define KN_TQ_VN_STEPS 12                   /* log8 value norm: codes per octave */
#define KN_TQ_VN_BIAS 120                   /* log8 code of a norm of 1 */

/* Index of head_dim in the codebook table, or -1 (not 16 << i, i < 5). */
KN_SHARED_FN int
kn_tq_dim_index(int32_t hd)
{
    for (int i = 0; i < KN_TQ_N_DIMS; i++) {
        if ((16 << i) == hd) {
            return i;
        }
    }
    return -1;
}

/* Bytes of one row (one token, one KV head) of kind (0 K, 1 V). */
KN_SHARED_FN int32_t
kn_tq_row_bytes(int bits, int kind, int32_t hd)
{
    return bits * (hd / 8) + (kind == 0 ? 3 : 1);
}

/* In-place unnormalized Walsh-Hadamard transform of n (a power of 2). */
KN_SHARED_FN void
kn_tq_fwht(float *x, int32_t n)
{
    for (int32_t len = 1; len < n; len <<= 1) {
        for (int32_t i = 0; i < n; i += 2 * len) {
            for (int32_t j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];

                x[j] = KN_FADD_RN(a, b);
                x[j + len] = KN_FSUB_RN(a, b);
            }
        }
    }
}

/* Code of coordinate c from b bit planes of pb bytes. */
KN_SHARED_FN int
kn_tq_code(const uint8_t *row, int planes, int32_t pb, int32_t c)
{
    int code = 0;

    for (int p = 0; p < planes; p++) {
        code |= ((row[p * pb + c / 8] >> (c % 8)) & 1) << p;
    }
    return code;
}

KN_SHARED_FN float
kn_tq_vnorm(uint8_t code)
{
    return code == 0 ? 0.0f : exp2f((float)((int)code - KN_TQ_VN_BIAS) / (float)KN_TQ_VN_STEPS);
}

KN_SHARED_FN uint8_t
kn_tq_vnorm_code(float n)
{
    float c;

    if (!(n > 0.0f)) {
        return 0;
    }
    c = nearbyintf(log2f(n) * (float)KN_TQ_VN_STEPS) + (float)KN_TQ_VN_BIAS;
    return (uint8_t)(c < 1.0f ? 1.0f : c > 255.0f ? 255.0f : c);
}

/* Key norm n and residual norm |e| of a key row. */
KN_SHARED_FN float
kn_tq_knorm(const uint8_t *row, int bits, int32_t hd)
{
    const uint8_t *p = row + bits * (hd / 8);

    return kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

KN_SHARED_FN float
kn_tq_kres(const uint8_t *row, int bits, int32_t hd)
{
    return (float)row[bits * (hd / 8) + 2] * (1.0f / 255.0f) * sqrtf((float)hd);
}

/* Encodes x (hd floats) into row (kn_tq_row_bytes long) for the layer's
 * and head's signs sg (hd, +-1) and, for keys, sketch matrix S (hd x hd,
 * row-major). bits: the dtype's width (3 or 4; 1 .. 4 work). */
KN_SHARED_FN void
kn_tq_encode_row(int32_t hd, int bits, int kind, const float *sg, const float *S, const float *x,
                 uint8_t *row)
{
    float z[KN_TQ_MAX_DIM], e[KN_TQ_MAX_DIM];
    const int mb = kind == 0 ? bits - 1 : bits, nl = 1 << mb;
    const float *cb = KN_TQ_CB[kn_tq_dim_index(hd)][mb - 1];
    const int32_t pb = hd / 8;
    float n2 = 0.0f, e2 = 0.0f, n, inv;

    for (int32_t i = 0; i < kn_tq_row_bytes(bits, kind, hd); i++) {
        row[i] = 0;
    }
    for (int32_t c = 0; c < hd; c++) {
        n2 = KN_FADD_RN(n2, KN_FMUL_RN(x[c], x[c]));
        z[c] = x[c] * sg[c];
    }
    n = sqrtf(n2);
    inv = n > 0.0f ? 1.0f / n : 0.0f;
    kn_tq_fwht(z, hd);
    for (int32_t c = 0; c < hd; c++) {
        float zc = KN_FMUL_RN(z[c], inv);
        int code = 0;

        for (int k = 0; k + 1 < nl; k++) {
            code += zc > KN_FMUL_RN(KN_FADD_RN(cb[k], cb[k + 1]), 0.5f);
        }
        for (int p = 0; p < mb; p++) {
            row[p * pb + c / 8] |= (uint8_t)(((code >> p) & 1) << (c % 8));
        }
        e[c] = KN_FSUB_RN(zc, cb[code]);
        e2 = KN_FADD_RN(e2, KN_FMUL_RN(e[c], e[c]));
    }
    if (kind != 0) {
        row[bits * pb] = kn_tq_vnorm_code(n);
        return;
    }
    for (int32_t i = 0; i < hd; i++) {
        float d = 0.0f;

        for (int32_t c = 0; c < hd; c++) {
            d = KN_FADD_RN(d, KN_FMUL_RN(S[(size_t)i * hd + c], e[c]));
        }
        row[mb * pb + i / 8] |= (uint8_t)((d >= 0.0f) << (i % 8));
    }
    {
        uint16_t h = kn_f32_to_f16(n);
        float r = sqrtf(e2 / (float)hd) * 255.0f;

        row[bits * pb] = (uint8_t)(h & 0xff);
        row[bits * pb + 1] = (uint8_t)(h >> 8);
        row[bits * pb + 2] = (uint8_t)(r > 255.0f ? 255.0f : nearbyintf(r));
    }
}

/* q . k for a key row, given the query's qz = H D q and sq = S qz. */
KN_SHARED_FN float
kn_tq_key_dot(int32_t hd, int bits, const uint8_t *row, const float *qz, const float *sq)
{
    const int mb = bits - 1;
    const float *cb = KN_TQ_CB[kn_tq_dim_index(hd)][mb - 1];
    const int32_t pb = hd / 8;
    float a = 0.0f, b = 0.0f;

    for (int32_t c = 0; c < hd; c++) {
        a = KN_FADD_RN(a, KN_FMUL_RN(qz[c], cb[kn_tq_code(row, mb, pb, c)]));
        b = (row[mb * pb + c / 8] >> (c % 8)) & 1 ? KN_FADD_RN(b, sq[c]) : KN_FSUB_RN(b, sq[c]);
    }
    a = KN_FADD_RN(a, KN_FMUL_RN(KN_TQ_QJL[kn_tq_dim_index(hd)] * kn_tq_kres(row, bits, hd), b));
    return KN_FMUL_RN(kn_tq_knorm(row, bits, hd) / (float)hd, a);
}

#endif /* KERNELS_KN_TQ_H */
