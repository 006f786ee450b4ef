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
 * every token. Rows of one token and KV head, by dtype (kn_tq_fmt):
 *
 *   tq4 keys    3-bit codes of z, the 1-bit QJL sketch sign(S e) of the
 *               residual e = z - cb[code] (S = sqrt(d) Q, Q a fixed Haar
 *               random orthogonal d x d matrix per layer and KV head), n
 *               as f16, |e| / sqrt(d) as u8 (/255): TurboQuant_prod
 *   tq4 values  4-bit codes, scale as an 8-bit log code (2^(1/12) steps)
 *   tq3 keys    4-bit codes on coordinates [0, d/2), 3-bit on the rest
 *               (3.5 bits), scale as f16; no sketch (TurboQuant_mse)
 *   tq3 values  3-bit codes on [0, nx), nx = 3d/4 rounded down to 8,
 *               2-bit on the rest (2.75 bits at d >= 32), log8 scale
 *
 * tq3 moves bits from values to keys: on the default model keys carry
 * almost all of the perplexity cost (3-bit keys alone +2.1%, 3-bit values
 * alone +0.1%), and at 3 bits the sketch's variance costs more than the
 * codes' bias saves. After the rotation every coordinate has the same
 * density, so which ones get the extra bit does not matter. The scale of
 * unsketched rows is the least-squares sigma = n (u . c) / (c . c) of the
 * codes c for the unit-variance row u (sketched keys keep n).
 *
 * Bit planes: plane p holds bit p of each coordinate's code, byte c / 8,
 * bit c % 8; the extra plane of coordinates [0, nx) (nx / 8 bytes) and
 * the sketch's sign plane follow, then the scale bytes:
 *
 *   row  [nfull planes][extra plane][sign plane][scale: f16 (+ |e| u8) | log8]
 *
 * Inner products never decode a key (qz = H D q, once per query head):
 *   q . k = sigma / d * (qz . cb[code] + |e| / (d c_d) * (S qz) . sgn)
 * where the second term (tq4) is the QJL estimate of qz . e, unbiased over S:
 * each row s of S is uniform on the sphere of radius sqrt(d), so
 * E[sign(s . e) (s . y)] = c_d (e . y) / |e| with c_d = E|s . u| for unit
 * u (KN_TQ_QJL holds 1 / (d c_d)). QJL proper uses i.i.d. Gaussian rows
 * (c = sqrt(2/pi)); orthogonal rows keep the estimate unbiased and, at d
 * rows, cut its variance by about (pi/2) / (pi/2 - 1) = 2.75x.
 * Values: x = sigma / d * D H cb[code], so attention sums
 * p_t sigma_t cb[code_t] in the rotated domain and rotates the sum back once.
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
#include <string.h>

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

/* The layout of one row of kind (0 K, 1 V) for (bits, hd): nfull bit
 * planes over every coordinate, coordinates [0, nx) one more bit (an
 * extra plane of nx / 8 bytes after the full ones), for tq4 keys the
 * sketch's sign plane, then the scale bytes at offset side. */
typedef struct kn_tq_fmt {
    int nfull;
    int32_t nx;
    int sketch;
    int32_t pb;   /* bytes of a full plane: hd / 8 */
    int32_t side; /* offset of the scale bytes */
    int32_t bytes;
} kn_tq_fmt_t;

KN_SHARED_FN kn_tq_fmt_t
kn_tq_fmt(int bits, int kind, int32_t hd)
{
    kn_tq_fmt_t f;

    f.pb = hd / 8;
    f.nx = 0;
    f.sketch = 0;
    if (bits == 3) { /* keys 3.5 bits, values 2.75 (2.5 at hd 16), no sketch */
        f.nfull = kind == 0 ? 3 : 2;
        f.nx = kind == 0 ? hd / 2 : (3 * hd / 4) / 8 * 8;
    } else { /* keys bits - 1 code bits and the sketch, values bits */
        f.nfull = kind == 0 ? bits - 1 : bits;
        f.sketch = kind == 0;
    }
    f.side = f.nfull * f.pb + f.nx / 8 + (f.sketch ? f.pb : 0);
    f.bytes = f.side + (kind != 0 ? 1 : f.sketch ? 3 : 2);
    return f;
}

/* Bytes of one row (one token, one KV head) of kind (0 K, 1 V). */
KN_SHARED_FN int32_t
kn_tq_row_bytes(int bits, int kind, int32_t hd)
{
    return kn_tq_fmt(bits, kind, hd).bytes;
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

/* The codebook of coordinate c (head_dim index di). */
KN_SHARED_FN const float *
kn_tq_cb(const kn_tq_fmt_t *f, int di, int32_t c)
{
    return KN_TQ_CB[di][c < f->nx ? f->nfull : f->nfull - 1];
}

/* Code of coordinate c of a row. */
KN_SHARED_FN int
kn_tq_code(const uint8_t *row, const kn_tq_fmt_t *f, int32_t c)
{
    int code = 0;

    for (int p = 0; p < f->nfull; p++) {
        code |= ((row[p * f->pb + c / 8] >> (c % 8)) & 1) << p;
    }
    if (c < f->nx) {
        code |= ((row[f->nfull * f->pb + c / 8] >> (c % 8)) & 1) << f->nfull;
    }
    return code;
}

/* Codebook value of coordinate c of a row. */
KN_SHARED_FN float
kn_tq_val(const uint8_t *row, const kn_tq_fmt_t *f, int di, int32_t c)
{
    return kn_tq_cb(f, di, c)[kn_tq_code(row, f, c)];
}

/* The log8 value scale: code c means 2^((c - 120) / 12) (0: zero). Both
 * directions use exact operations only (frexpf / ldexpf and a table of
 * the twelve steps of an octave and the edges between them), so host and
 * device give the same bytes and values. */
KN_SHARED_FN float
kn_tq_vnorm(uint8_t code)
{
    const float step[KN_TQ_VN_STEPS] = {
        1.000000000e+00f, 1.059463143e+00f, 1.122462034e+00f, 1.189207077e+00f,
        1.259921074e+00f, 1.334839821e+00f, 1.414213538e+00f, 1.498307109e+00f,
        1.587401032e+00f, 1.681792855e+00f, 1.781797409e+00f, 1.887748599e+00f};
    int k = (int)code - KN_TQ_VN_BIAS;
    int oct = k >= 0 ? k / KN_TQ_VN_STEPS : -((-k + KN_TQ_VN_STEPS - 1) / KN_TQ_VN_STEPS);

    return code == 0 ? 0.0f : ldexpf(step[k - oct * KN_TQ_VN_STEPS], oct);
}

/* The nearest log8 code of n > 0 (in the log domain), clamped to 1 .. 255. */
KN_SHARED_FN uint8_t
kn_tq_vnorm_code(float n)
{
    const float edge[KN_TQ_VN_STEPS] = {
        1.029302239e+00f, 1.090507746e+00f, 1.155352712e+00f, 1.224053502e+00f,
        1.296839595e+00f, 1.373953700e+00f, 1.455653191e+00f, 1.542210817e+00f,
        1.633915424e+00f, 1.731073141e+00f, 1.834008098e+00f, 1.943063855e+00f};
    int e, j = 0, c;
    float m;

    if (!(n > 0.0f)) {
        return 0;
    }
    if (n > 1e30f) {
        return 255;
    }
    m = 2.0f * frexpf(n, &e); /* n = m 2^(e - 1), m in [1, 2) */
    while (j < KN_TQ_VN_STEPS && m >= edge[j]) {
        j++;
    }
    c = (e - 1) * KN_TQ_VN_STEPS + j + KN_TQ_VN_BIAS;
    return (uint8_t)(c < 1 ? 1 : c > 255 ? 255 : c);
}

/* The scale sigma of a row (x = sigma / d * D H cb[code] (+ sketch)). */
KN_SHARED_FN float
kn_tq_scale(const uint8_t *row, const kn_tq_fmt_t *f, int kind)
{
    const uint8_t *p = row + f->side;

    return kind != 0 ? kn_tq_vnorm(p[0]) : kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* |e| of a sketched key row. */
KN_SHARED_FN float
kn_tq_kres(const uint8_t *row, const kn_tq_fmt_t *f, int32_t hd)
{
    return (float)row[f->side + 2] * (1.0f / 255.0f) * sqrtf((float)hd);
}

/* f32 -> f16 bits, rounded to nearest even, in integer operations only:
 * the same bits as the CPU's kn_f32_to_f16(). The row encoder stores its
 * f16 scales through this and not the device's __float2half_rn: nvcc 13
 * for sm_90 stored the low byte of that conversion's result as a value
 * conversion of the float (saturated, truncated), on every tq3 key row,
 * while -G builds and every intermediate were right (found on an H200;
 * the PTX was correct, so it is ptxas). */
KN_SHARED_FN uint16_t
kn_tq_f16_bits(float x)
{
    uint32_t u, sign, a;

#if defined(__CUDACC__)
    u = __float_as_uint(x);
#else
    memcpy(&u, &x, sizeof(u));
#endif
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    }
    if (a >= 0x477ff000u) { /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half (units of 2^-24) or zero */
        const uint32_t e = a >> 23;
        uint32_t m, sh, r, rem, half;

        if (e < 102u) { /* below 2^-25: rounds to zero */
            return (uint16_t)sign;
        }
        m = (a & 0x7fffffu) | 0x800000u;
        sh = 126u - e; /* 14 .. 24 */
        r = m >> sh;
        rem = m & ((1u << sh) - 1u);
        half = 1u << (sh - 1u);
        r += rem > half || (rem == half && (r & 1u));
        return (uint16_t)(sign | r);
    }
    a += 0xc8000fffu + ((a >> 13) & 1u); /* rebias the exponent, round to nearest even */
    return (uint16_t)(sign | (a >> 13));
}

/* Encodes x (hd floats) into row (kn_tq_row_bytes long) for the layer's
 * and head's signs sg (hd, +-1) and, for sketched keys, sketch matrix S
 * (hd x hd, row-major; unused otherwise). bits: the dtype's width, 3 or 4.
 * Unsketched rows store the least-squares scale sigma = n (u . c) / (c . c)
 * of the codes c for the unit-variance rotated row u; sketched keys store
 * sigma = n (the sketch corrects the residual). */
KN_SHARED_FN void
kn_tq_encode_row(int32_t hd, int bits, int kind, const float *sg, const float *S, const float *x,
                 uint8_t *row)
{
    float z[KN_TQ_MAX_DIM], e[KN_TQ_MAX_DIM];
    const kn_tq_fmt_t f = kn_tq_fmt(bits, kind, hd);
    const int di = kn_tq_dim_index(hd);
    const int32_t pb = f.pb;
    float n2 = 0.0f, e2 = 0.0f, uc = 0.0f, cc = 0.0f, n, inv, sigma;

    for (int32_t i = 0; i < f.bytes; i++) {
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
        const float *cb = kn_tq_cb(&f, di, c);
        const int hi = c < f.nx, nl = 1 << (f.nfull + hi);
        float zc = KN_FMUL_RN(z[c], inv);
        int code = 0;

        for (int k = 0; k + 1 < nl; k++) {
            code += zc > KN_FMUL_RN(KN_FADD_RN(cb[k], cb[k + 1]), 0.5f);
        }
        for (int p = 0; p < f.nfull; p++) {
            row[p * pb + c / 8] |= (uint8_t)(((code >> p) & 1) << (c % 8));
        }
        if (hi) {
            row[f.nfull * pb + c / 8] |= (uint8_t)(((code >> f.nfull) & 1) << (c % 8));
        }
        e[c] = KN_FSUB_RN(zc, cb[code]);
        e2 = KN_FADD_RN(e2, KN_FMUL_RN(e[c], e[c]));
        uc = KN_FADD_RN(uc, KN_FMUL_RN(zc, cb[code]));
        cc = KN_FADD_RN(cc, KN_FMUL_RN(cb[code], cb[code]));
    }
    sigma = cc > 0.0f ? KN_FMUL_RN(n, uc) / cc : 0.0f;
    if (kind != 0) {
        row[f.side] = kn_tq_vnorm_code(sigma);
        return;
    }
    if (!f.sketch) {
        uint16_t h = kn_tq_f16_bits(sigma);

        row[f.side] = (uint8_t)(h & 0xff);
        row[f.side + 1] = (uint8_t)(h >> 8);
        return;
    }
    for (int32_t i = 0; i < hd; i++) {
        float d = 0.0f;

        for (int32_t c = 0; c < hd; c++) {
            d = KN_FADD_RN(d, KN_FMUL_RN(S[(size_t)i * hd + c], e[c]));
        }
        row[f.nfull * pb + i / 8] |= (uint8_t)((d >= 0.0f) << (i % 8));
    }
    {
        uint16_t h = kn_tq_f16_bits(n);
        float r = sqrtf(e2 / (float)hd) * 255.0f;

        row[f.side] = (uint8_t)(h & 0xff);
        row[f.side + 1] = (uint8_t)(h >> 8);
        row[f.side + 2] = (uint8_t)(r > 255.0f ? 255.0f : nearbyintf(r));
    }
}

/* Decodes a row of kind into out (hd floats): sigma / d * D H (cb[code]
 * (+ the sketch term S^T sgn |e| / (d c_d) for tq4 keys: the unbiased
 * reconstruction)). S is unused for unsketched rows. */
KN_SHARED_FN void
kn_tq_decode_row(int32_t hd, int bits, int kind, const float *sg, const float *S,
                 const uint8_t *row, float *out)
{
    const kn_tq_fmt_t f = kn_tq_fmt(bits, kind, hd);
    const int di = kn_tq_dim_index(hd);
    const float k = kn_tq_scale(row, &f, kind) / (float)hd;

    for (int32_t c = 0; c < hd; c++) {
        out[c] = kn_tq_val(row, &f, di, c);
    }
    if (f.sketch) {
        const float r = KN_FMUL_RN(KN_TQ_QJL[di], kn_tq_kres(row, &f, hd));

        for (int32_t i = 0; i < hd; i++) { /* + r * S^T sgn */
            const float w = (row[f.nfull * f.pb + i / 8] >> (i % 8)) & 1 ? r : -r;

            for (int32_t c = 0; c < hd; c++) {
                out[c] = KN_FADD_RN(out[c], KN_FMUL_RN(w, S[(size_t)i * hd + c]));
            }
        }
    }
    kn_tq_fwht(out, hd);
    for (int32_t c = 0; c < hd; c++) {
        out[c] = KN_FMUL_RN(out[c], KN_FMUL_RN(k, sg[c]));
    }
}

/* q . k for a key row, given the query's qz = H D q and (sketched keys)
 * sq = S qz. */
KN_SHARED_FN float
kn_tq_key_dot(int32_t hd, int bits, const uint8_t *row, const float *qz, const float *sq)
{
    const kn_tq_fmt_t f = kn_tq_fmt(bits, 0, hd);
    const int di = kn_tq_dim_index(hd);
    float a = 0.0f, b = 0.0f;

    for (int32_t c = 0; c < hd; c++) {
        a = KN_FADD_RN(a, KN_FMUL_RN(qz[c], kn_tq_val(row, &f, di, c)));
    }
    if (f.sketch) {
        for (int32_t c = 0; c < hd; c++) {
            b = (row[f.nfull * f.pb + c / 8] >> (c % 8)) & 1 ? KN_FADD_RN(b, sq[c])
                                                              : KN_FSUB_RN(b, sq[c]);
        }
        a = KN_FADD_RN(a, KN_FMUL_RN(KN_TQ_QJL[di] * kn_tq_kres(row, &f, hd), b));
    }
    return KN_FMUL_RN(kn_tq_scale(row, &f, 0) / (float)hd, a);
}

#endif /* KERNELS_KN_TQ_H */
