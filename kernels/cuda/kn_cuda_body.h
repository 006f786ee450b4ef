/* kn_cuda_body.h - the per-thread bodies of the CUDA kernels, written once
 * and compiled twice: by nvcc as __device__ functions (kn_cuda.cu wraps
 * each in a __global__) and by the host C compiler for the emulator
 * (tests/cuda/kn_emu.c), which runs every thread of a block with
 * __syncthreads, shared memory and warp shuffles emulated. CI has no GPU,
 * so this is how the index math and the reductions of the kernels are
 * tested (tests/cuda/test_emu.c compares them with kernels/cpu references).
 *
 * DESIGN. A body sees the CUDA built-ins only through kn_thr_t (threadIdx,
 * blockIdx, blockDim, gridDim) and three macros:
 *   KN_SYNC(t)            __syncthreads()
 *   KN_SHFL_XOR(t, v, m)  __shfl_xor_sync(0xffffffff, v, m), full warps only
 *   KN_DEV                __device__ __forceinline__ / static inline
 * Dynamic shared memory arrives as the smem argument. Everything else is
 * the common subset of C11 and CUDA C++ (explicit casts from void *, no
 * compound literals). Launch shapes are part of each body's contract below
 * and kn_cuda.cu / the emulator use exactly those.
 *
 * Dtypes: activations on the residual path are f32; tensors that feed a
 * cuBLAS GEMM (normed rows, attention output, silu*up) and the KV cache
 * are 16-bit, f16 or bf16 by a run-time kn_dt_t (a uniform branch), stored
 * as uint16_t. Every accumulation is f32.
 *
 * Memory spaces: every pointer in an args struct is device memory on the
 * GPU and host memory under the emulator.
 */
#ifndef KERNELS_CUDA_KN_CUDA_BODY_H
#define KERNELS_CUDA_KN_CUDA_BODY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kn_quant.h" /* kn_wtype_t (declarations only: C++-clean) */

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define KN_DEV __device__ __forceinline__
#define KN_SYNC(t) __syncthreads()
#define KN_SHFL_XOR(t, v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#else
#define KN_DEV static inline
#define KN_SYNC(t) kn_emu_sync((t)->emu)
#define KN_SHFL_XOR(t, v, m) kn_emu_shfl_xor((t)->emu, (t)->tid, (v), (m))
/* Provided by the emulator (tests/cuda/kn_emu.c). */
void kn_emu_sync(void *emu);
float kn_emu_shfl_xor(void *emu, int tid, float v, int lane_mask);
#endif

#define KN_WARP 32
#define KN_ATTN_TILE 32      /* keys per online-softmax tile */
#define KN_ATTN_MAX_GROUP 16 /* query heads per KV head */
/* The softmax phase gives one lane per key of a tile. */
#if KN_ATTN_TILE != KN_WARP
#error "KN_ATTN_TILE must equal KN_WARP"
#endif

typedef enum kn_dt {
    KN_DT_F16 = 0,
    KN_DT_BF16 = 1,
} kn_dt_t;

/* One thread's view of the launch (threadIdx.x, blockIdx.x/y, blockDim.x,
 * gridDim.x/y). emu is the emulator's block state, NULL on the device. */
typedef struct kn_thr {
    int tid, nthr;
    int bx, by;
    int gx, gy;
    void *emu;
} kn_thr_t;

/* ---- 16-bit conversions (round to nearest even) ---------------------- */

KN_DEV uint32_t
kn_f2u(float f)
{
#if defined(__CUDACC__)
    return __float_as_uint(f);
#else
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

KN_DEV float
kn_u2f(uint32_t u)
{
#if defined(__CUDACC__)
    return __uint_as_float(u);
#else
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

KN_DEV float
kn_bf16_to_f32(uint16_t h)
{
    return kn_u2f((uint32_t)h << 16);
}

KN_DEV uint16_t
kn_f32_to_bf16(float f)
{
    uint32_t u = kn_f2u(f);

    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

KN_DEV float
kn_f16_to_f32(uint16_t h)
{
#if defined(__CUDACC__)
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    float f;

    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
        return sign ? -f : f;
    }
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

KN_DEV uint16_t
kn_f32_to_f16(float f)
{
#if defined(__CUDACC__)
    return __half_as_ushort(__float2half_rn(f));
#else
    uint32_t u, sign, a;

    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u);
    }
    if (a >= 0x477ff000u) { /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float af;

        memcpy(&af, &a, sizeof(af));
        return (uint16_t)(sign | (uint32_t)rintf(af * 16777216.0f));
    }
    a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (a >> 13));
#endif
}

/* What the CPU kernels compute alike: kn_seq_of(), kn_kvq_group_params(),
 * KN_KQ_FP8 / KN_KQ_INT8 / KN_KQ_INT4 (= KN_KVQ_* of kernels/cpu/kv_quant.h)
 * and KN_FMUL_RN / KN_FADD_RN / KN_FSUB_RN. Included here, after
 * kn_f32_to_f16() and kn_f16_to_f32(), which it calls. */
#include "kernels/kn_shared.h"

KN_DEV float
kn_ld16(const uint16_t *p, size_t i, kn_dt_t dt)
{
    return dt == KN_DT_BF16 ? kn_bf16_to_f32(p[i]) : kn_f16_to_f32(p[i]);
}

KN_DEV void
kn_st16(uint16_t *p, size_t i, float v, kn_dt_t dt)
{
    p[i] = dt == KN_DT_BF16 ? kn_f32_to_bf16(v) : kn_f32_to_f16(v);
}

/* ---- block reductions -------------------------------------------------- */

/* Sum of v over one warp, result in every lane. */
KN_DEV float
kn_warp_sum(const kn_thr_t *t, float v)
{
    for (int m = KN_WARP / 2; m > 0; m >>= 1) {
        v += KN_SHFL_XOR(t, v, m);
    }
    return v;
}

KN_DEV float
kn_warp_max(const kn_thr_t *t, float v)
{
    for (int m = KN_WARP / 2; m > 0; m >>= 1) {
        v = fmaxf(v, KN_SHFL_XOR(t, v, m));
    }
    return v;
}

/* Sum of v over the block, result in every thread. nthr is a multiple of
 * 32; red: shared scratch of nthr / 32 floats, reusable on return. */
KN_DEV float
kn_block_sum(const kn_thr_t *t, float *red, float v)
{
    int n_warps = t->nthr / KN_WARP;
    float s = 0.0f;

    v = kn_warp_sum(t, v);
    if (t->tid % KN_WARP == 0) {
        red[t->tid / KN_WARP] = v;
    }
    KN_SYNC(t);
    for (int w = 0; w < n_warps; w++) {
        s += red[w];
    }
    KN_SYNC(t);
    return s;
}

/* ---- embedding gather -------------------------------------------------
 * out[t][i] = table[tokens[t]][i].
 *   table:  (vocab, dim) 16-bit (dt)      tokens: (n_tok) int32, in range
 *   out:    (n_tok, dim) f32
 * Launch: grid (n_tok), any block size, no shared memory. */
typedef struct kn_embed_args {
    const uint16_t *table;
    const int32_t *tokens;
    float *out;
    int32_t dim;
    kn_dt_t dt;
} kn_embed_args_t;

KN_DEV void
kn_embed_body(const kn_thr_t *t, float *smem, const kn_embed_args_t *a)
{
    const uint16_t *row = a->table + (size_t)a->tokens[t->bx] * a->dim;
    float *o = a->out + (size_t)t->bx * a->dim;

    (void)smem;
    for (int32_t i = t->tid; i < a->dim; i += t->nthr) {
        o[i] = kn_ld16(row, (size_t)i, a->dt);
    }
}

/* ---- RMSNorm ------------------------------------------------------------
 * out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w.
 *   x:   (n_tok, dim) f32, row stride x_stride floats
 *   w:   (dim) 16-bit (dt)
 *   out: (n_tok, dim) 16-bit (dt), row stride dim
 * Launch: grid (n_tok), block a multiple of 32, shared nthr / 32 floats. */
typedef struct kn_rmsnorm_args {
    const float *x;
    const uint16_t *w;
    uint16_t *out;
    int32_t dim;
    int32_t x_stride;
    float eps;
    kn_dt_t dt;
} kn_rmsnorm_args_t;

KN_DEV void
kn_rmsnorm_body(const kn_thr_t *t, float *smem, const kn_rmsnorm_args_t *a)
{
    const float *xr = a->x + (size_t)t->bx * a->x_stride;
    uint16_t *yr = a->out + (size_t)t->bx * a->dim;
    float ss = 0.0f, inv;

    for (int32_t i = t->tid; i < a->dim; i += t->nthr) {
        ss += xr[i] * xr[i];
    }
    ss = kn_block_sum(t, smem, ss);
    inv = 1.0f / sqrtf(ss / (float)a->dim + a->eps);
    for (int32_t i = t->tid; i < a->dim; i += t->nthr) {
        kn_st16(yr, (size_t)i, xr[i] * inv * kn_ld16(a->w, (size_t)i, a->dt), a->dt);
    }
}

/* ---- RoPE (rotate_half / NeoX pairing, as kernels/cpu) -------------------
 * Rotates x in place: dimension i pairs with i + head_dim / 2, angle
 * positions[t] * inv_freq[i].
 *   x:         (n_tok, n_heads * head_dim) f32, row stride x_stride floats
 *   positions: (n_tok) int32            inv_freq: (head_dim / 2) f32
 * Launch: grid (n_tok), any block size, no shared memory. */
typedef struct kn_rope_args {
    float *x;
    const int32_t *positions;
    const float *inv_freq;
    int32_t n_heads;
    int32_t head_dim;
    int32_t x_stride;
} kn_rope_args_t;

KN_DEV void
kn_rope_body(const kn_thr_t *t, float *smem, const kn_rope_args_t *a)
{
    int32_t half = a->head_dim / 2;
    float *row = a->x + (size_t)t->bx * a->x_stride;
    float pos = (float)a->positions[t->bx];

    (void)smem;
    for (int32_t j = t->tid; j < a->n_heads * half; j += t->nthr) {
        int32_t h = j / half, i = j % half;
        float *v = row + (size_t)h * a->head_dim;
        float ang = pos * a->inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        float x0 = v[i], x1 = v[i + half];

        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
    }
}

/* ---- bias add -------------------------------------------------------------
 * y[t][o] += bias[o].
 *   y: (n_tok, d) f32, row stride y_stride    bias: (d) 16-bit (dt)
 * Launch: grid (n_tok), any block size. */
typedef struct kn_bias_args {
    float *y;
    const uint16_t *bias;
    int32_t d;
    int32_t y_stride;
    kn_dt_t dt;
} kn_bias_args_t;

KN_DEV void
kn_bias_body(const kn_thr_t *t, float *smem, const kn_bias_args_t *a)
{
    float *row = a->y + (size_t)t->bx * a->y_stride;

    (void)smem;
    for (int32_t o = t->tid; o < a->d; o += t->nthr) {
        row[o] += kn_ld16(a->bias, (size_t)o, a->dt);
    }
}

/* ---- KV cache write through slot_mapping ---------------------------------
 * k_cache[blk][h][off][:] = k[t][h][:] (and V), slot = blk * bs + off;
 * a negative slot is skipped.
 *   k, v:     (n_tok, n_kv_heads * head_dim) f32, row stride kv_stride
 *   slot:     (n_tok) int32
 *   caches:   [num_blocks][n_kv_heads][block_size][head_dim] 16-bit (dt)
 * Launch: grid (n_tok), any block size. */
typedef struct kn_kv_write_args {
    uint16_t *k_cache;
    uint16_t *v_cache;
    const float *k;
    const float *v;
    const int32_t *slot;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size;
    int32_t kv_stride;
    kn_dt_t dt;
    /* H2O / SnapKV (kn_mass_body.h): the layer's mass accumulator
     * [slot][n_kv_heads], whose cells of a written slot are zeroed (a new
     * token has no mass yet); NULL: none. */
    float *mass;
} kn_kv_write_args_t;

KN_DEV void
kn_kv_write_body(const kn_thr_t *t, float *smem, const kn_kv_write_args_t *a)
{
    int32_t s = a->slot[t->bx];
    int32_t n = a->n_kv_heads * a->head_dim;

    (void)smem;
    if (s < 0) {
        return;
    }
    int32_t blk = s / a->block_size, off = s % a->block_size;

    for (int32_t j = t->tid; j < n; j += t->nthr) {
        int32_t h = j / a->head_dim, d = j % a->head_dim;
        size_t dst = (((size_t)blk * a->n_kv_heads + h) * a->block_size + off) * a->head_dim + d;
        size_t src = (size_t)t->bx * a->kv_stride + j;

        kn_st16(a->k_cache, dst, a->k[src], a->dt);
        kn_st16(a->v_cache, dst, a->v[src], a->dt);
    }
    for (int32_t h = t->tid; a->mass != NULL && h < a->n_kv_heads; h += t->nthr) {
        a->mass[(size_t)s * a->n_kv_heads + h] = 0.0f;
    }
}

/* ---- SiLU x mul -------------------------------------------------------------
 * out[t][i] = silu(gate[t][i]) * up[t][i].
 *   gate, up: (n_tok, n) f32, row stride in_stride
 *   out:      (n_tok, n) 16-bit (dt)
 * Launch: grid (n_tok), any block size. */
typedef struct kn_silu_mul_args {
    const float *gate;
    const float *up;
    uint16_t *out;
    int32_t n;
    int32_t in_stride;
    kn_dt_t dt;
} kn_silu_mul_args_t;

KN_DEV void
kn_silu_mul_body(const kn_thr_t *t, float *smem, const kn_silu_mul_args_t *a)
{
    const float *g = a->gate + (size_t)t->bx * a->in_stride;
    const float *u = a->up + (size_t)t->bx * a->in_stride;
    uint16_t *o = a->out + (size_t)t->bx * a->n;

    (void)smem;
    for (int32_t i = t->tid; i < a->n; i += t->nthr) {
        kn_st16(o, (size_t)i, g[i] / (1.0f + expf(-g[i])) * u[i], a->dt);
    }
}

/* ---- residual add -----------------------------------------------------------
 * x[i] += y[i] over n.   x, y: (n) f32.
 * Launch: grid (ceil(n / (nthr * 4))), any block size. */
typedef struct kn_add_args {
    float *x;
    const float *y;
    int64_t n;
} kn_add_args_t;

KN_DEV void
kn_add_body(const kn_thr_t *t, float *smem, const kn_add_args_t *a)
{
    int64_t base = (int64_t)t->bx * t->nthr * 4 + t->tid;

    (void)smem;
    for (int r = 0; r < 4; r++) {
        int64_t i = base + (int64_t)r * t->nthr;

        if (i < a->n) {
            a->x[i] += a->y[i];
        }
    }
}

/* ---- row gather -----------------------------------------------------------
 * out[i] = x[rows[i]]:  x (n_tok, dim) f32, rows (n_rows) int32, out
 * (n_rows, dim) f32. Launch: grid (n_rows), any block size. */
typedef struct kn_gather_args {
    const float *x;
    const int32_t *rows;
    float *out;
    int32_t dim;
} kn_gather_args_t;

KN_DEV void
kn_gather_body(const kn_thr_t *t, float *smem, const kn_gather_args_t *a)
{
    const float *src = a->x + (size_t)a->rows[t->bx] * a->dim;

    (void)smem;
    for (int32_t i = t->tid; i < a->dim; i += t->nthr) {
        a->out[(size_t)t->bx * a->dim + i] = src[i];
    }
}

/* ---- weight dequantization (file type -> 16-bit) ----------------------------
 * dst row r <- the n_cols elements of src row r in type (the block layouts
 * of kernels/cpu/kn_quant.h, ggml's), rounded to dt: bit for bit
 * kn_dequant_row() then kn_st16(). Each element is decoded alone with
 * kn_quant.c's arithmetic, products rounded as written (KN_FMUL_RN /
 * KN_FADD_RN: never an FMA):
 *   f32 / f16 / bf16  the value
 *   q8_0, q4_0        d * q                 (q4_0: q = nibble - 8)
 *   q4_K, q5_K        (d * sc) * q + -(dmin * m), 6-bit sc, m per 32
 *   q6_K              (d * sc) * (q - 32), int8 sc per 16
 *   src:  (n_rows) rows of src_row_bytes bytes: n_cols / block_elems whole
 *         blocks each (any alignment: read by bytes)
 *   dst:  (n_rows, n_cols) 16-bit (dt), row stride n_cols
 * Launch: grid (n_rows), any block size, no shared memory. */
typedef struct kn_wdequant_args {
    const uint8_t *src;
    uint16_t *dst;
    size_t src_row_bytes;
    int32_t n_cols;
    kn_wtype_t type;
    kn_dt_t dt;
} kn_wdequant_args_t;

/* The little-endian f16 at p as f32. */
KN_DEV float
kn_wq_f16(const uint8_t *p)
{
    return kn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* Element e of a row of blocks of type t (kn_quant.c's q_block32 and
 * kn_dequant_row, one element at a time). */
KN_DEV float
kn_wq_elem(kn_wtype_t t, const uint8_t *row, int32_t e)
{
    int32_t l = e % 32;

    switch (t) {
    case KN_W_F32:
        return kn_u2f((uint32_t)row[4 * e] | ((uint32_t)row[4 * e + 1] << 8) |
                      ((uint32_t)row[4 * e + 2] << 16) | ((uint32_t)row[4 * e + 3] << 24));
    case KN_W_F16:
        return kn_wq_f16(row + 2 * e);
    case KN_W_BF16:
        return kn_bf16_to_f32((uint16_t)(row[2 * e] | (row[2 * e + 1] << 8)));
    case KN_W_Q8_0: {
        const uint8_t *b = row + 34 * (e / 32);

        return KN_FMUL_RN(kn_wq_f16(b), (float)(int8_t)b[2 + l]);
    }
    case KN_W_Q4_0: {
        const uint8_t *b = row + 18 * (e / 32);
        int32_t q = l < 16 ? (b[2 + l] & 0xF) - 8 : (b[2 + l - 16] >> 4) - 8;

        return KN_FMUL_RN(kn_wq_f16(b), (float)q);
    }
    case KN_W_Q4_K:
    case KN_W_Q5_K: {
        int32_t k5 = t == KN_W_Q5_K, sub = (e % 256) / 32, sc, m, q;
        const uint8_t *b = row + (k5 ? 176 : 144) * (e / 256), *s6 = b + 4;
        const uint8_t *qs = b + (k5 ? 48 : 16) + 32 * (sub / 2);

        if (sub < 4) {
            sc = s6[sub] & 63;
            m = s6[sub + 4] & 63;
        } else {
            sc = (s6[sub + 4] & 0xF) | ((s6[sub - 4] >> 6) << 4);
            m = (s6[sub + 4] >> 4) | ((s6[sub] >> 6) << 4);
        }
        q = (sub & 1) ? qs[l] >> 4 : qs[l] & 0xF;
        if (k5) {
            q |= ((b[16 + l] >> sub) & 1) << 4;
        }
        float a = KN_FMUL_RN(kn_wq_f16(b), (float)sc);
        float c = -KN_FMUL_RN(kn_wq_f16(b + 2), (float)m);

        return KN_FADD_RN(KN_FMUL_RN(a, (float)q), c);
    }
    case KN_W_Q6_K: {
        const uint8_t *b = row + 210 * (e / 256);
        int32_t e0 = (e % 256) / 32 * 32, n = e0 / 128, qd = (e0 % 128) / 32;
        const uint8_t *ql = b + 64 * n + (qd & 1) * 32, *qh = b + 128 + 32 * n;
        int32_t lo = (qd & 2) ? ql[l] >> 4 : ql[l] & 0xF, hi = (qh[l] >> (2 * qd)) & 3;
        float a = KN_FMUL_RN(kn_wq_f16(b + 208), (float)(int8_t)b[192 + e0 / 16 + l / 16]);

        return KN_FMUL_RN(a, (float)((lo | (hi << 4)) - 32));
    }
    default:
        return 0.0f;
    }
}

KN_DEV void
kn_wdequant_body(const kn_thr_t *t, float *smem, const kn_wdequant_args_t *a)
{
    const uint8_t *row = a->src + (size_t)t->bx * a->src_row_bytes;
    uint16_t *o = a->dst + (size_t)t->bx * a->n_cols;

    (void)smem;
    for (int32_t e = t->tid; e < a->n_cols; e += t->nthr) {
        kn_st16(o, (size_t)e, kn_wq_elem(a->type, row, e), a->dt);
    }
}

/* ---- paged attention (decode tokens and prefill chunks) ----------------------
 * The varlen batch of DESIGN.md section 3: sequence s owns query rows
 * [query_start[s], query_start[s+1]); its new tokens sit at context
 * indices context_len[s] - n_new .. context_len[s] - 1, and query row t
 * attends causally to context indices lo(t)..ctx(t) (lo > 0 only with a
 * sliding window). Context index j lives in physical block
 * block_tables[s][j / block_size] at offset j % block_size.
 *
 * One thread block per (query token, KV head): it serves the whole GQA
 * group of query heads that read this KV head, so each K/V row is loaded
 * once per group. Keys go in tiles of KN_ATTN_TILE with an online softmax
 * (running max m, running sum l, rescaled f32 accumulators):
 *
 *   per tile:  scores   one warp per key, lanes split head_dim, shuffle sum
 *              softmax  one warp per query head: tile max, p = exp(s - m'),
 *                       alpha = exp(m - m'), l = l * alpha + sum(p)
 *              values   one thread per (head, dim): acc = acc * alpha + p V
 *
 * A decode token is the n_new == 1 case of a prefill chunk, so one kernel
 * serves both.
 *   q:            (n_tok, n_heads * head_dim) f32, RoPE applied, row stride q_stride
 *   k/v_cache:    one layer, [num_blocks][n_kv_heads][block_size][head_dim] 16-bit (dt)
 *   query_start:  (n_seqs + 1) int32    context_len: (n_seqs) int32
 *   block_tables: (n_seqs, max_blocks) int32
 *   out:          (n_tok, n_heads * head_dim) 16-bit (dt)
 * n_heads / n_kv_heads <= KN_ATTN_MAX_GROUP, head_dim <= 256.
 * Launch: grid (n_kv_heads, n_tok), block a multiple of 32,
 * shared kn_attn_smem_floats() floats. */
typedef struct kn_attn_cuda_args {
    uint16_t *out;
    const float *q;
    const uint16_t *k_cache;
    const uint16_t *v_cache;
    const int32_t *query_start;
    const int32_t *context_len;
    const int32_t *block_tables;
    int32_t max_blocks;
    int32_t n_seqs;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size;
    int32_t sliding_window;
    int32_t q_stride;
    float scale;
    kn_dt_t dt;
    /* Split-K (kn_attention_split_body): n_splits > 1 splits each token's
     * key range and part is the scratch of the partials; 0 or 1 (part
     * unused, may be NULL): one pass (kn_attention_body). */
    float *part;
    int32_t n_splits;
} kn_attn_cuda_args_t;

/* Shared floats: q (group x hd), acc (group x hd), p (group x tile),
 * m, l, alpha (group each). */
static inline size_t
kn_attn_smem_floats(int32_t group, int32_t head_dim)
{
    return (size_t)group * (2 * (size_t)head_dim + KN_ATTN_TILE + 3);
}

/* The start both attention bodies share: finds the sequence of token tok
 * (the last s with query_start[s] <= tok; returned), its key range
 * [*lo, *hi] (hi the context index of tok, lo from the sliding window),
 * loads the group's pre-scaled queries of heads h0 .. h0 + group - 1 into
 * q_s and zeroes acc, m_s = -inf, l_s = 0. The caller syncs after it. */
KN_DEV int32_t
kn_attn_begin(const kn_thr_t *t, const kn_attn_cuda_args_t *a, int32_t tok, int32_t h0,
              float *q_s, float *acc, float *m_s, float *l_s, int32_t *lo, int32_t *hi)
{
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    int32_t a0 = kn_seq_of(a->query_start, a->n_seqs, tok);

    *hi = a->context_len[a0] - (a->query_start[a0 + 1] - tok);
    *lo = 0;
    if (a->sliding_window > 0 && *hi - a->sliding_window + 1 > 0) {
        *lo = *hi - a->sliding_window + 1;
    }
    for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
        int32_t g = j / hd, d = j % hd;

        q_s[j] = a->q[(size_t)tok * a->q_stride + (size_t)(h0 + g) * hd + d] * a->scale;
        acc[j] = 0.0f;
    }
    for (int32_t g = t->tid; g < group; g += t->nthr) {
        m_s[g] = -INFINITY;
        l_s[g] = 0.0f;
    }
    return a0;
}

/* The online-softmax tile loop both decode bodies share: keys lo .. hi
 * (none when lo > hi) of KV head kvh through block table bt, into the
 * group's acc, m_s, l_s (kn_attn_begin's state; p, al_s scratch). Ends
 * synced. */
KN_DEV void
kn_attn_tiles(const kn_thr_t *t, const kn_attn_cuda_args_t *a, const int32_t *bt, int32_t kvh,
              int32_t lo, int32_t hi, const float *q_s, float *acc, float *p, float *m_s,
              float *l_s, float *al_s)
{
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int32_t lane = t->tid % KN_WARP, warp = t->tid / KN_WARP, n_warps = t->nthr / KN_WARP;

    for (int32_t j0 = lo; j0 <= hi; j0 += KN_ATTN_TILE) {
        int32_t n_keys = hi - j0 + 1 < KN_ATTN_TILE ? hi - j0 + 1 : KN_ATTN_TILE;

        /* Scores: warp w takes keys w, w + n_warps, ... */
        for (int32_t jj = warp; jj < n_keys; jj += n_warps) {
            int32_t j = j0 + jj;
            size_t base = (((size_t)bt[j / a->block_size] * a->n_kv_heads + kvh) * a->block_size +
                           (size_t)(j % a->block_size)) *
                          hd;

            for (int32_t g = 0; g < group; g++) {
                float d = 0.0f;

                for (int32_t i = lane; i < hd; i += KN_WARP) {
                    d += q_s[(size_t)g * hd + i] * kn_ld16(a->k_cache, base + i, a->dt);
                }
                d = kn_warp_sum(t, d);
                if (lane == 0) {
                    p[(size_t)g * KN_ATTN_TILE + jj] = d;
                }
            }
        }
        KN_SYNC(t);

        /* Online softmax: warp w takes query heads w, w + n_warps, ... */
        for (int32_t g = warp; g < group; g += n_warps) {
            float *pg = p + (size_t)g * KN_ATTN_TILE;
            float v = lane < n_keys ? pg[lane] : -INFINITY;
            float m_new = fmaxf(m_s[g], kn_warp_max(t, v));
            float e = lane < n_keys ? expf(v - m_new) : 0.0f;
            float sum = kn_warp_sum(t, e);

            if (lane < n_keys) {
                pg[lane] = e;
            }
            if (lane == 0) {
                float alpha = expf(m_s[g] - m_new);

                al_s[g] = alpha;
                l_s[g] = l_s[g] * alpha + sum;
                m_s[g] = m_new;
            }
        }
        KN_SYNC(t);

        /* Values: thread per (head, dim). */
        for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
            int32_t g = j / hd, d = j % hd;
            const float *pg = p + (size_t)g * KN_ATTN_TILE;
            float o = acc[j] * al_s[g];

            for (int32_t jj = 0; jj < n_keys; jj++) {
                int32_t c = j0 + jj;
                size_t vi = (((size_t)bt[c / a->block_size] * a->n_kv_heads + kvh) * a->block_size +
                             (size_t)(c % a->block_size)) *
                                hd +
                            d;

                o += pg[jj] * kn_ld16(a->v_cache, vi, a->dt);
            }
            acc[j] = o;
        }
        KN_SYNC(t);
    }
}

KN_DEV void
kn_attention_body(const kn_thr_t *t, float *smem, const kn_attn_cuda_args_t *a)
{
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int32_t kvh = t->bx, tok = t->by, h0 = kvh * group;
    float *q_s = smem;                             /* [group][hd], pre-scaled */
    float *acc = q_s + (size_t)group * hd;         /* [group][hd] */
    float *p = acc + (size_t)group * hd;           /* [group][tile] */
    float *m_s = p + (size_t)group * KN_ATTN_TILE; /* [group] */
    float *l_s = m_s + group;                      /* [group] */
    float *al_s = l_s + group;                     /* [group] */
    int32_t s = 0, lo, hi;

    s = kn_attn_begin(t, a, tok, h0, q_s, acc, m_s, l_s, &lo, &hi);
    KN_SYNC(t);

    kn_attn_tiles(t, a, a->block_tables + (size_t)s * a->max_blocks, kvh, lo, hi, q_s, acc, p, m_s,
                  l_s, al_s);
    for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
        int32_t g = j / hd, d = j % hd;

        kn_st16(a->out, (size_t)tok * a->n_heads * hd + (size_t)(h0 + g) * hd + d, acc[j] / l_s[g],
                a->dt);
    }
}

/* ---- split-K decode attention ("flash-decoding") -----------------------------
 * At a few decode tokens the one-pass kernel runs n_kv_heads x n_tok
 * blocks, each walking its whole context: a handful of SMs busy. The
 * split kernel cuts every token's key range lo .. hi into n_splits equal
 * shares (rounded up to whole tiles; the last ones may be empty) and runs
 * one block per (KV head, split, token); each writes its group's partial
 * softmax state, and the combine kernel merges a token's partials:
 *
 *   split s:  m_s, l_s, acc_s  over keys [lo + s * per, lo + (s + 1) * per)
 *   combine:  M = max m_s, w_s = exp(m_s - M),
 *             out = sum w_s acc_s / sum w_s l_s        (empty split: w_s = 0)
 *
 * The shares come from context_len in the kernel, so a recorded graph
 * (fixed n_splits) stays right as the contexts grow.
 *   part: [n_tok][n_heads][n_splits][2 + head_dim] f32: m, l, acc
 *         (unnormalized); kn_attn_split_floats() floats cover a rank.
 * Split launch: grid (n_kv_heads * n_splits, n_tok) (bx = kvh + n_kv_heads
 * * split), block a multiple of 32, shared kn_attn_smem_floats() floats.
 * Combine launch: grid (n_heads, n_tok), any block size, no shared memory. */
#define KN_ATTN_MAX_SPLITS 32
#define KN_ATTN_SPLIT_BLOCKS 264 /* about 2 blocks per SM on 132 SMs */

/* Splits for n_tok decode tokens over n_kv_heads: enough blocks to fill
 * the GPU (about KN_ATTN_SPLIT_BLOCKS), 1 .. KN_ATTN_MAX_SPLITS; 1 means
 * the one-pass kernel. Depends on the batch shape only, never on the
 * context lengths. */
static inline int32_t
kn_attn_n_splits(int32_t n_kv_heads, int32_t n_tok)
{
    int64_t blocks = (int64_t)n_kv_heads * n_tok, n;

    if (blocks <= 0) {
        return 1;
    }
    n = (KN_ATTN_SPLIT_BLOCKS + blocks - 1) / blocks;
    return n < 1 ? 1 : n > KN_ATTN_MAX_SPLITS ? KN_ATTN_MAX_SPLITS : (int32_t)n;
}

/* Floats of part that any step of 1 .. t_max tokens needs (the largest
 * n_tok * n_splits with n_splits > 1, times n_heads * (2 + head_dim));
 * 0 when no such step splits. */
static inline size_t
kn_attn_split_floats(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t t_max)
{
    size_t rows = 0;

    for (int32_t n = 1; n <= t_max && n <= KN_ATTN_SPLIT_BLOCKS; n++) {
        int32_t ns = kn_attn_n_splits(n_kv_heads, n);

        if (ns > 1 && (size_t)n * (size_t)ns > rows) {
            rows = (size_t)n * (size_t)ns;
        }
    }
    return rows * (size_t)n_heads * (2 + (size_t)head_dim);
}

/* Keys of split `split` of n_splits over lo .. hi: [*s_lo, *s_hi], empty
 * (s_lo > s_hi) past the end. Shares are whole tiles. */
KN_DEV void
kn_attn_split_range(int32_t lo, int32_t hi, int32_t split, int32_t n_splits, int32_t *s_lo,
                    int32_t *s_hi)
{
    int32_t n = hi - lo + 1, per = (n + n_splits - 1) / n_splits;

    per = (per + KN_ATTN_TILE - 1) / KN_ATTN_TILE * KN_ATTN_TILE;
    *s_lo = lo + split * per;
    *s_hi = *s_lo + per - 1 < hi ? *s_lo + per - 1 : hi;
}

KN_DEV void
kn_attention_split_body(const kn_thr_t *t, float *smem, const kn_attn_cuda_args_t *a)
{
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads, ns = a->n_splits;
    const int32_t kvh = t->bx % a->n_kv_heads, split = t->bx / a->n_kv_heads, tok = t->by;
    const int32_t h0 = kvh * group;
    float *q_s = smem;                             /* [group][hd], pre-scaled */
    float *acc = q_s + (size_t)group * hd;         /* [group][hd] */
    float *p = acc + (size_t)group * hd;           /* [group][tile] */
    float *m_s = p + (size_t)group * KN_ATTN_TILE; /* [group] */
    float *l_s = m_s + group;                      /* [group] */
    float *al_s = l_s + group;                     /* [group] */
    int32_t s, lo, hi, s_lo, s_hi;

    s = kn_attn_begin(t, a, tok, h0, q_s, acc, m_s, l_s, &lo, &hi);
    KN_SYNC(t);
    kn_attn_split_range(lo, hi, split, ns, &s_lo, &s_hi);
    kn_attn_tiles(t, a, a->block_tables + (size_t)s * a->max_blocks, kvh, s_lo, s_hi, q_s, acc, p,
                  m_s, l_s, al_s);
    for (int32_t j = t->tid; j < group * (hd + 2); j += t->nthr) {
        int32_t g = j / (hd + 2), i = j % (hd + 2);
        float *row = a->part + (((size_t)tok * a->n_heads + (size_t)(h0 + g)) * (size_t)ns +
                                (size_t)split) *
                                   (size_t)(hd + 2);

        row[i] = i == 0 ? m_s[g] : i == 1 ? l_s[g] : acc[(size_t)g * hd + (i - 2)];
    }
}

KN_DEV void
kn_attention_combine_body(const kn_thr_t *t, float *smem, const kn_attn_cuda_args_t *a)
{
    const int32_t hd = a->head_dim, ns = a->n_splits, h = t->bx, tok = t->by;
    const size_t stride = 2 + (size_t)hd;
    const float *rows = a->part + ((size_t)tok * a->n_heads + (size_t)h) * (size_t)ns * stride;
    float mx = -INFINITY, den = 0.0f;

    (void)smem;
    for (int32_t s = 0; s < ns; s++) {
        mx = fmaxf(mx, rows[(size_t)s * stride]);
    }
    for (int32_t s = 0; s < ns; s++) {
        float m = rows[(size_t)s * stride];

        den += m == -INFINITY ? 0.0f : expf(m - mx) * rows[(size_t)s * stride + 1];
    }
    for (int32_t d = t->tid; d < hd; d += t->nthr) {
        float o = 0.0f;

        for (int32_t s = 0; s < ns; s++) {
            float m = rows[(size_t)s * stride];

            o += m == -INFINITY ? 0.0f : expf(m - mx) * rows[(size_t)s * stride + 2 + d];
        }
        kn_st16(a->out, (size_t)tok * a->n_heads * hd + (size_t)h * hd + d,
                den > 0.0f ? o / den : 0.0f, a->dt);
    }
}

/* ---- paged attention for prefill chunks ----------------------------------------
 * Same batch and contract as kn_attention_body, but one thread block per
 * (KV head, query tile): up to q_tile consecutive query tokens of one
 * sequence (tile t starts at token tile_start[t] and ends at q_tile
 * tokens or at the sequence's end). Every K/V tile is loaded into shared
 * memory once and serves q_tile * group query rows, instead of being
 * read again for every token as the decode kernel does. Keys run from the
 * first token's lo to the last token's hi; per row, keys past its causal
 * bound or before its window get probability 0:
 *
 *   per key tile:  load      K, V rows of the tile (16-bit) to shared memory
 *                  scores    thread per (row, key): dot over head_dim
 *                  softmax   warp per row, lane per key (masked: -inf)
 *                  values    thread per (row, dim): acc = acc * alpha + p V
 *
 *   tile_start: (n_tiles) int32, token index of each tile's first token
 * Launch: grid (n_kv_heads, n_tiles), block a multiple of 32, shared
 * kn_attn_prefill_smem_floats() floats. Host memory note: the launcher
 * raises the kernel's dynamic shared memory limit when above 48 KiB. */
typedef struct kn_attn_prefill_args {
    kn_attn_cuda_args_t a; /* the decode kernel's arguments */
    const int32_t *tile_start;
    int32_t q_tile;
} kn_attn_prefill_args_t;

/* Shared floats: q, acc (rows x hd), p (rows x tile), m, l, alpha (rows),
 * K and V tiles (tile x hd 16-bit each, i.e. tile x hd floats for both). */
static inline size_t
kn_attn_prefill_smem_floats(int32_t q_tile, int32_t group, int32_t head_dim)
{
    size_t rows = (size_t)q_tile * (size_t)group;

    return rows * (2 * (size_t)head_dim + KN_ATTN_TILE + 3) +
           (size_t)KN_ATTN_TILE * (size_t)head_dim;
}

/* Query tokens per tile: about 32 query rows per block. */
static inline int32_t
kn_attn_prefill_q_tile(int32_t group)
{
    int32_t q = 32 / group;

    return q < 1 ? 1 : q > 16 ? 16 : q;
}

KN_DEV void
kn_attention_prefill_body(const kn_thr_t *t, float *smem, const kn_attn_prefill_args_t *pa)
{
    const kn_attn_cuda_args_t *a = &pa->a;
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int32_t kvh = t->bx, h0 = kvh * group, t0 = pa->tile_start[t->by];
    const int32_t lane = t->tid % KN_WARP, warp = t->tid / KN_WARP, n_warps = t->nthr / KN_WARP;
    const int32_t s = kn_seq_of(a->query_start, a->n_seqs, t0);
    int32_t n_q, rows, first, lo0, hi1;

    n_q = a->query_start[s + 1] - t0 < pa->q_tile ? a->query_start[s + 1] - t0 : pa->q_tile;
    rows = n_q * group;
    /* Context index of token t0 + i is first + i. */
    first = a->context_len[s] - (a->query_start[s + 1] - t0);
    lo0 = 0;
    if (a->sliding_window > 0 && first - a->sliding_window + 1 > 0) {
        lo0 = first - a->sliding_window + 1;
    }
    hi1 = first + n_q - 1;

    const size_t R = (size_t)pa->q_tile * group; /* shared arrays sized for a full tile */
    float *q_s = smem;                           /* [R][hd], row = i * group + g */
    float *acc = q_s + R * hd;                   /* [R][hd] */
    float *p = acc + R * hd;                     /* [R][tile] */
    float *m_s = p + R * KN_ATTN_TILE;           /* [R] */
    float *l_s = m_s + R;                        /* [R] */
    float *al_s = l_s + R;                       /* [R] */
    uint16_t *k_s = (uint16_t *)(al_s + R);      /* [tile][hd] */
    uint16_t *v_s = k_s + (size_t)KN_ATTN_TILE * hd;
    const int32_t *bt = a->block_tables + (size_t)s * a->max_blocks;

    for (int32_t j = t->tid; j < rows * hd; j += t->nthr) {
        int32_t row = j / hd, d = j % hd, i = row / group, g = row % group;

        q_s[j] = a->q[(size_t)(t0 + i) * a->q_stride + (size_t)(h0 + g) * hd + d] * a->scale;
        acc[j] = 0.0f;
    }
    for (int32_t row = t->tid; row < rows; row += t->nthr) {
        m_s[row] = -INFINITY;
        l_s[row] = 0.0f;
    }
    KN_SYNC(t);

    for (int32_t j0 = lo0; j0 <= hi1; j0 += KN_ATTN_TILE) {
        int32_t n_keys = hi1 - j0 + 1 < KN_ATTN_TILE ? hi1 - j0 + 1 : KN_ATTN_TILE;

        /* Load the K/V tile once for every row. */
        for (int32_t e = t->tid; e < n_keys * hd; e += t->nthr) {
            int32_t jj = e / hd, d = e % hd, j = j0 + jj;
            size_t src = (((size_t)bt[j / a->block_size] * a->n_kv_heads + kvh) * a->block_size +
                          (size_t)(j % a->block_size)) *
                             hd +
                         d;

            k_s[e] = a->k_cache[src];
            v_s[e] = a->v_cache[src];
        }
        KN_SYNC(t);

        /* Scores, masked per row to [lo(i), hi(i)]. */
        for (int32_t e = t->tid; e < rows * KN_ATTN_TILE; e += t->nthr) {
            int32_t row = e / KN_ATTN_TILE, jj = e % KN_ATTN_TILE, j = j0 + jj;
            int32_t hi = first + row / group;
            int32_t lo = a->sliding_window > 0 && hi - a->sliding_window + 1 > 0
                             ? hi - a->sliding_window + 1
                             : 0;
            float d = -INFINITY;

            if (jj < n_keys && j <= hi && j >= lo) {
                const float *qr = q_s + (size_t)row * hd;
                const uint16_t *kr = k_s + (size_t)jj * hd;

                d = 0.0f;
                for (int32_t i = 0; i < hd; i++) {
                    d += qr[i] * kn_ld16(kr, (size_t)i, a->dt);
                }
            }
            p[e] = d;
        }
        KN_SYNC(t);

        /* Online softmax, warp per row. A row may have no key in this tile
         * (all masked): its max stays, its p are 0. */
        for (int32_t row = warp; row < rows; row += n_warps) {
            float *pr = p + (size_t)row * KN_ATTN_TILE;
            float v = pr[lane];
            float m_old = m_s[row];
            float m_new = fmaxf(m_old, kn_warp_max(t, v));
            float e = m_new == -INFINITY || v == -INFINITY ? 0.0f : expf(v - m_new);
            float sum = kn_warp_sum(t, e);

            pr[lane] = e;
            if (lane == 0) {
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);

                al_s[row] = alpha;
                l_s[row] = l_s[row] * alpha + sum;
                m_s[row] = m_new;
            }
        }
        KN_SYNC(t);

        /* Values: thread per (row, dim). */
        for (int32_t e = t->tid; e < rows * hd; e += t->nthr) {
            int32_t row = e / hd, d = e % hd;
            const float *pr = p + (size_t)row * KN_ATTN_TILE;
            float o = acc[e] * al_s[row];

            for (int32_t jj = 0; jj < n_keys; jj++) {
                o += pr[jj] * kn_ld16(v_s, (size_t)jj * hd + d, a->dt);
            }
            acc[e] = o;
        }
        KN_SYNC(t);
    }

    for (int32_t e = t->tid; e < rows * hd; e += t->nthr) {
        int32_t row = e / hd, d = e % hd, i = row / group, g = row % group;

        kn_st16(a->out, (size_t)(t0 + i) * a->n_heads * hd + (size_t)(h0 + g) * hd + d,
                acc[e] / l_s[row], a->dt);
    }
}

/* ==== quantized KV blocks (KIVI; the byte layout of kernels/cpu/kv_quant.h) ====
 *
 * A block of block_size tokens is the quantization group. Per layer and
 * kind the pool region is [num_blocks][stride]; one block of one kind is
 *
 *   [ codes: [n_kv][block_size][head_dim] | meta | pad to 16 bytes ]
 *   K meta: [n_kv][head_dim] f16 scales, then (int8 / int4) as many f16 zero points
 *   V meta: [n_kv][block_size] f16 scales (+ zero points)
 *
 * Keys are quantized per channel over the block's rows, values per row
 * over head_dim; int4 packs channel i (low nibble) with channel
 * i + head_dim / 2 (high nibble). Codes: fp8 E4M3 x = code * scale; int8 /
 * int4 x = code * scale + zero.
 *
 * The block being filled lives in an f32 residual slot,
 *   slots: [n_slots][n_layers][2 (K, V)][n_kv][block_size][head_dim] f32,
 * and is quantized from it (kn_kq_quant_body) when its last row is written,
 * with the same arithmetic as kn_kvq_quantize_block() on the CPU, so codes,
 * scales and zero points are bit-identical: every rounding step is spelled
 * out with round-to-nearest-even intrinsics on the device (no FMA
 * contraction can move a scale by one ulp). The staging is f32 because the
 * CPU quantizer reads the f32 residual: a 16-bit staging would round the
 * keys before the ranges are taken.
 *
 * Attention reads codes in place (kn_kq_attention_body): the per-channel
 * key scale is folded into the query once per block (q' = q * s_k, plus
 * the constant sum q . z_k), the per-row value scale into the softmax
 * weight (p' = p * s_v, plus sum p * z_v added to every output channel). A
 * query reads its own block from the residual slot (KIVI: the rows of the
 * block being filled stay full precision) and every earlier block as codes. */

/* The byte geometry of one block of one layer (kn_kvq_layout_t's numbers). */
typedef struct kn_kq_geom {
    int32_t fmt; /* KN_KQ_* */
    int32_t n_kv;
    int32_t bs;
    int32_t hd;
    size_t data_bytes; /* codes */
    size_t k_stride;   /* codes + K meta, rounded up to 16 */
    size_t v_stride;
} kn_kq_geom_t;

/* Fills *g; returns 0, or -1 for a shape the format cannot group (odd
 * head_dim, int4 with head_dim % 8 != 0, non-positive sizes). */
static inline int
kn_kq_geom_init(kn_kq_geom_t *g, int32_t fmt, int32_t n_kv, int32_t bs, int32_t hd)
{
    size_t elems, mg;

    if (n_kv <= 0 || bs <= 0 || hd <= 0 || hd % 2 != 0 || (fmt == KN_KQ_INT4 && hd % 8 != 0) ||
        (fmt != KN_KQ_FP8 && fmt != KN_KQ_INT8 && fmt != KN_KQ_INT4)) {
        return -1;
    }
    elems = (size_t)n_kv * (size_t)bs * (size_t)hd;
    mg = fmt == KN_KQ_FP8 ? 1 : 2;
    g->fmt = fmt;
    g->n_kv = n_kv;
    g->bs = bs;
    g->hd = hd;
    g->data_bytes = fmt == KN_KQ_INT4 ? elems / 2 : elems;
    g->k_stride = (g->data_bytes + 2 * mg * (size_t)n_kv * (size_t)hd + 15) & ~(size_t)15;
    g->v_stride = (g->data_bytes + 2 * mg * (size_t)n_kv * (size_t)bs + 15) & ~(size_t)15;
    return 0;
}

/* Floats of one residual slot's (layer, kind): n_kv * bs * hd. */
KN_DEV size_t
kn_kq_lk(const kn_kq_geom_t *g)
{
    return (size_t)g->n_kv * (size_t)g->bs * (size_t)g->hd;
}

/* Rows of (slot, layer, kind, head) in the residual slots. */
KN_DEV size_t
kn_kq_res_off(const kn_kq_geom_t *g, int32_t slot, int32_t n_layers, int32_t layer, int kind,
              int32_t h)
{
    return (((size_t)slot * (size_t)n_layers + (size_t)layer) * 2 + (size_t)kind) * kn_kq_lk(g) +
           (size_t)h * (size_t)g->bs * (size_t)g->hd;
}

/* E4M3 (OCP "fn": no infinities, max 448), round to nearest even,
 * saturating; the CPU's kn_f32_to_e4m3 step for step. */
KN_DEV uint8_t
kn_kq_e4m3_enc(float x)
{
    uint32_t u = kn_f2u(x), au = u & 0x7fffffffu;
    uint8_t sign = (u >> 31) != 0 ? 0x80 : 0;
    float a = kn_u2f(au);
    int e, m, code;

    if (au > 0x7f800000u) {
        return 0x7f;
    }
    if (a >= 448.0f) {
        return (uint8_t)(sign | 0x7e);
    }
    if (a < 0.015625f) { /* below 2^-6: subnormal steps of 2^-9 */
        return (uint8_t)(sign | (uint8_t)rintf(KN_FMUL_RN(a, 512.0f)));
    }
    e = (int)((au >> 23) & 0xffu) - 127;                          /* a = f * 2^e, f in [1, 2) */
    m = (int)rintf(KN_FMUL_RN(kn_u2f((au & 0x7fffffu) | 0x3f800000u) - 1.0f, 8.0f));
    if (m == 8) {
        m = 0;
        e++;
    }
    code = ((e + 7) << 3) | m;
    return (uint8_t)(sign | (uint8_t)(code > 0x7e ? 0x7e : code));
}

/* E4M3 -> f32, branch-free: the 7 magnitude bits shifted into an f32 and
 * scaled by 2^120 (covers subnormals); NaN codes are never written. */
KN_DEV float
kn_kq_e4m3_dec(uint8_t v)
{
    float f = kn_u2f((uint32_t)(v & 0x7fu) << 20) * kn_u2f(0x7b800000u);

    return kn_u2f(kn_f2u(f) | ((uint32_t)(v & 0x80u) << 24));
}

/* One code (int8 / fp8 byte, or int4 nibble value 0..15) of x. */
KN_DEV uint8_t
kn_kq_encode(int32_t fmt, float x, float inv, float zero)
{
    float q;

    if (fmt == KN_KQ_FP8) {
        return kn_kq_e4m3_enc(KN_FMUL_RN(x, inv));
    }
    q = rintf(KN_FMUL_RN(KN_FSUB_RN(x, zero), inv));
    if (fmt == KN_KQ_INT4) {
        return (uint8_t)(q < 0.0f ? 0.0f : q > 15.0f ? 15.0f : q);
    }
    return (uint8_t)(q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q);
}

/* Channel d of the row whose first element index is row_el, as a float
 * code (before scale and zero point). */
KN_DEV float
kn_kq_code(const kn_kq_geom_t *g, const uint8_t *data, size_t row_el, int32_t d)
{
    if (g->fmt == KN_KQ_INT4) {
        int32_t half = g->hd / 2;
        uint8_t b = data[row_el / 2 + (size_t)(d < half ? d : d - half)];

        return (float)(d < half ? (b & 15) : (b >> 4));
    }
    if (g->fmt == KN_KQ_FP8) {
        return kn_kq_e4m3_dec(data[row_el + (size_t)d]);
    }
    return (float)data[row_el + (size_t)d];
}

/* ---- residual write through slot_mapping -----------------------------------
 * slots[res_slot[t]][layer][K|V][h][off][:] = k[t][h][:], v[t][h][:] with
 * off = slot[t] % block_size; a negative slot (or res_slot) is skipped.
 *   k, v: (n_tok, n_kv * hd) f32, row stride kv_stride
 * Launch: grid (n_tok), any block size. */
typedef struct kn_kq_res_write_args {
    float *res;
    const float *k;
    const float *v;
    const int32_t *slot;
    const int32_t *res_slot;
    int32_t n_layers;
    int32_t layer;
    int32_t kv_stride;
    kn_kq_geom_t g;
} kn_kq_res_write_args_t;

KN_DEV void
kn_kq_res_write_body(const kn_thr_t *t, float *smem, const kn_kq_res_write_args_t *a)
{
    const kn_kq_geom_t *g = &a->g;
    int32_t s = a->slot[t->bx], rs = a->res_slot[t->bx];

    (void)smem;
    if (s < 0 || rs < 0) {
        return;
    }
    int32_t off = s % g->bs, n = g->n_kv * g->hd;

    for (int32_t j = t->tid; j < n; j += t->nthr) {
        int32_t h = j / g->hd, d = j % g->hd;
        size_t src = (size_t)t->bx * a->kv_stride + (size_t)j;
        size_t row = (size_t)off * g->hd + (size_t)d;

        a->res[kn_kq_res_off(g, rs, a->n_layers, a->layer, 0, h) + row] = a->k[src];
        a->res[kn_kq_res_off(g, rs, a->n_layers, a->layer, 1, h) + row] = a->v[src];
    }
}

/* ---- block quantization from a residual slot -------------------------------
 * For job i (jobs[3i] = block, jobs[3i + 1] = slot, jobs[3i + 2] = rows),
 * quantizes rows [0, rows) of the slot's (layer, kind) into the block's
 * codes and meta; rows >= rows are written as zero codes (meta of an empty
 * group for V), exactly as kn_kvq_quantize_block(). jobs == NULL means the
 * one job (blk0, slot0, rows0).
 *   k_blocks / v_blocks: the layer's K / V regions [num_blocks][stride]
 * Launch: grid (n_jobs, 2 * n_kv): y = kind * n_kv + head; any block
 * size; K: a thread per channel pair (i, i + hd / 2), V: a thread per row. */
typedef struct kn_kq_quant_args {
    uint8_t *k_blocks;
    uint8_t *v_blocks;
    const float *res;
    const int32_t *jobs;
    int32_t blk0, slot0, rows0;
    int32_t n_layers;
    int32_t layer;
    kn_kq_geom_t g;
} kn_kq_quant_args_t;

KN_DEV void
kn_kq_quant_body(const kn_thr_t *t, float *smem, const kn_kq_quant_args_t *a)
{
    const kn_kq_geom_t *g = &a->g;
    const int32_t bs = g->bs, hd = g->hd, half = hd / 2, nkv = g->n_kv;
    const int kind = t->by / nkv;
    const int32_t h = t->by % nkv;
    int32_t blk = a->blk0, slot = a->slot0, rows = a->rows0;
    uint8_t *dst;
    uint16_t *meta;
    const float *src;

    (void)smem;
    if (a->jobs != NULL) {
        blk = a->jobs[3 * t->bx];
        slot = a->jobs[3 * t->bx + 1];
        rows = a->jobs[3 * t->bx + 2];
    }
    rows = rows > bs ? bs : rows;
    dst = kind == 0 ? a->k_blocks + (size_t)blk * g->k_stride
                    : a->v_blocks + (size_t)blk * g->v_stride;
    meta = (uint16_t *)(dst + g->data_bytes);
    src = a->res + kn_kq_res_off(g, slot, a->n_layers, a->layer, kind, h);

    if (kind == 0) {
        /* Keys: a group per (head, channel) over the rows. */
        size_t ng = (size_t)nkv * hd;

        for (int32_t i = t->tid; i < half; i += t->nthr) {
            float inv[2], zero[2];

            for (int c = 0; c < 2; c++) {
                int32_t d = i + c * half;
                float lo = INFINITY, hi = -INFINITY;
                uint16_t sc_h, z_h;

                for (int32_t r = 0; r < rows; r++) {
                    lo = fminf(lo, src[(size_t)r * hd + d]);
                    hi = fmaxf(hi, src[(size_t)r * hd + d]);
                }
                if (rows == 0) {
                    lo = hi = 0.0f;
                }
                kn_kvq_group_params(g->fmt, lo, hi, &sc_h, &z_h, &inv[c], &zero[c]);
                meta[(size_t)h * hd + d] = sc_h;
                if (g->fmt != KN_KQ_FP8) {
                    meta[ng + (size_t)h * hd + d] = z_h;
                }
            }
            for (int32_t r = 0; r < bs; r++) {
                size_t row_el = ((size_t)h * bs + (size_t)r) * hd;

                if (g->fmt == KN_KQ_INT4) {
                    uint8_t b = 0;

                    if (r < rows) {
                        b = (uint8_t)(kn_kq_encode(g->fmt, src[(size_t)r * hd + i], inv[0],
                                                   zero[0]) |
                                      (kn_kq_encode(g->fmt, src[(size_t)r * hd + i + half], inv[1],
                                                    zero[1])
                                       << 4));
                    }
                    dst[row_el / 2 + (size_t)i] = b;
                } else {
                    for (int c = 0; c < 2; c++) {
                        int32_t d = i + c * half;

                        float x = r < rows ? src[(size_t)r * hd + d] : 0.0f;

                        dst[row_el + (size_t)d] =
                            r < rows ? kn_kq_encode(g->fmt, x, inv[c], zero[c]) : (uint8_t)0;
                    }
                }
            }
        }
        return;
    }
    /* Values: a group per (head, row) over head_dim. */
    size_t ng = (size_t)nkv * bs;

    for (int32_t r = t->tid; r < bs; r += t->nthr) {
        const float *row = src + (size_t)r * hd;
        size_t row_el = ((size_t)h * bs + (size_t)r) * hd;
        float lo = INFINITY, hi = -INFINITY, inv, zero;
        uint16_t sc_h, z_h;

        if (r < rows) {
            for (int32_t d = 0; d < hd; d++) {
                lo = fminf(lo, row[d]);
                hi = fmaxf(hi, row[d]);
            }
        } else {
            lo = hi = 0.0f;
        }
        kn_kvq_group_params(g->fmt, lo, hi, &sc_h, &z_h, &inv, &zero);
        meta[(size_t)h * bs + r] = sc_h;
        if (g->fmt != KN_KQ_FP8) {
            meta[ng + (size_t)h * bs + r] = z_h;
        }
        if (g->fmt == KN_KQ_INT4) {
            for (int32_t j = 0; j < half; j++) {
                dst[row_el / 2 + (size_t)j] =
                    r < rows ? (uint8_t)(kn_kq_encode(g->fmt, row[j], inv, zero) |
                                         (kn_kq_encode(g->fmt, row[j + half], inv, zero) << 4))
                             : (uint8_t)0;
            }
        } else {
            for (int32_t d = 0; d < hd; d++) {
                dst[row_el + (size_t)d] =
                    r < rows ? kn_kq_encode(g->fmt, row[d], inv, zero) : (uint8_t)0;
            }
        }
    }
}

/* ---- block dequantization into a residual slot --------------------------------
 * slot's (layer, K|V) rows [0, bs) <- the block's codes * scale (+ zero):
 * a write into a block that already holds codes (its residual slot was
 * flushed) continues from them, as the CPU store does.
 * Launch: grid (n_kv, 2): y = kind; any block size. */
typedef struct kn_kq_dequant_args {
    const uint8_t *k_blocks;
    const uint8_t *v_blocks;
    float *res;
    int32_t blk;
    int32_t slot;
    int32_t n_layers;
    int32_t layer;
    kn_kq_geom_t g;
} kn_kq_dequant_args_t;

KN_DEV void
kn_kq_dequant_body(const kn_thr_t *t, float *smem, const kn_kq_dequant_args_t *a)
{
    const kn_kq_geom_t *g = &a->g;
    const int32_t bs = g->bs, hd = g->hd, h = t->bx, kind = t->by;
    const uint8_t *blk = kind == 0 ? a->k_blocks + (size_t)a->blk * g->k_stride
                                   : a->v_blocks + (size_t)a->blk * g->v_stride;
    const uint16_t *meta = (const uint16_t *)(blk + g->data_bytes);
    float *dst = a->res + kn_kq_res_off(g, a->slot, a->n_layers, a->layer, kind, h);
    size_t ng = (size_t)g->n_kv * (kind == 0 ? hd : bs);

    (void)smem;
    for (int32_t e = t->tid; e < bs * hd; e += t->nthr) {
        int32_t r = e / hd, d = e % hd;
        size_t mi = kind == 0 ? (size_t)h * hd + (size_t)d : (size_t)h * bs + (size_t)r;
        float sc = kn_f16_to_f32(meta[mi]);
        float z = g->fmt == KN_KQ_FP8 ? 0.0f : kn_f16_to_f32(meta[ng + mi]);

        dst[e] = kn_kq_code(g, blk, ((size_t)h * bs + (size_t)r) * hd, d) * sc + z;
    }
}

/* ---- KV_OP_SHIFT: re-rotating key rows ----------------------------------------
 * Rotates rows of head_dim values in place by -delta positions (RoPE
 * "rotate_half" pairs i, i + head_dim / 2; rotations compose), the CPU's
 * kn_kvq_rotate_rows step for step: cos / sin of -delta * inv_freq[i] in
 * double rounded to f32, then x0 c - x1 s and x1 c + x0 s rounded once per
 * operation (no FMA contraction), stored back as the rows' dtype (f32, or
 * 16-bit dt rounded to nearest even).
 *   rows of (layer y, head x): base + y * layer_stride + x * head_stride,
 *   n_rows rows of head_dim elements each (element strides)
 *   k32: f32 rows (a residual slot's keys), or NULL and k16: 16-bit rows
 *   inv_freq: (head_dim / 2) f32, the model's (rope scaling included)
 * Launch: grid (n_heads, n_layers), any block size, no shared memory. */
typedef struct kn_kv_rotate_args {
    float *k32;
    uint16_t *k16;
    const float *inv_freq;
    size_t layer_stride;
    size_t head_stride;
    int32_t n_rows;
    int32_t head_dim;
    int32_t delta;
    kn_dt_t dt;
} kn_kv_rotate_args_t;

/* cos and sin of the angle that rotates a row by -delta positions. */
KN_DEV void
kn_rot_cs(const float *inv_freq, int32_t i, int32_t delta, float *c, float *s)
{
    double ang = -(double)delta * (double)inv_freq[i];

    *c = (float)cos(ang);
    *s = (float)sin(ang);
}

KN_DEV void
kn_kv_rotate_body(const kn_thr_t *t, float *smem, const kn_kv_rotate_args_t *a)
{
    const int32_t half = a->head_dim / 2;
    size_t base = (size_t)t->by * a->layer_stride + (size_t)t->bx * a->head_stride;

    (void)smem;
    for (int32_t j = t->tid; j < a->n_rows * half; j += t->nthr) {
        int32_t r = j / half, i = j % half;
        size_t e0 = base + (size_t)r * a->head_dim + (size_t)i, e1 = e0 + (size_t)half;
        float c, s, x0, x1;

        kn_rot_cs(a->inv_freq, i, a->delta, &c, &s);
        x0 = a->k32 != NULL ? a->k32[e0] : kn_ld16(a->k16, e0, a->dt);
        x1 = a->k32 != NULL ? a->k32[e1] : kn_ld16(a->k16, e1, a->dt);
        float y0 = KN_FSUB_RN(KN_FMUL_RN(x0, c), KN_FMUL_RN(x1, s));
        float y1 = KN_FADD_RN(KN_FMUL_RN(x1, c), KN_FMUL_RN(x0, s));

        if (a->k32 != NULL) {
            a->k32[e0] = y0;
            a->k32[e1] = y1;
        } else {
            kn_st16(a->k16, e0, y0, a->dt);
            kn_st16(a->k16, e1, y1, a->dt);
        }
    }
}

/* ---- paged attention over quantized blocks ---------------------------------------
 * The batch contract of kn_attention_body (a.k_cache / a.v_cache unused);
 * K and V come from the layer's quantized regions, and a query's own block
 * (the block of its context index) from residual slot own_slot[token] when
 * that is >= 0. One thread block per (KV head, query token), serving the
 * GQA group; keys in tiles that never cross a block (at most KN_ATTN_TILE
 * keys), each with the block's scales folded in once:
 *
 *   fold     warp per head: q' = q * s_k (channel), qz = sum q * z_k
 *   scores   warp per key: q' . code + qz
 *   softmax  warp per head, lane per key: p = exp(s - m'); l += sum p;
 *            p' = p * s_v (row), pz = sum p * z_v
 *   values   thread per (head, dim): acc = acc * alpha + pz + sum p' code
 *
 * A block with a pending SHIFT (shift[block] != 0: its codes predate a
 * re-rotation by -shift) is read with the query rotated by +shift instead
 * (q . R(-d) k = (R(d) q) . k), folded in with the scales; a query's own
 * block (the residual slot, rotated in place) never is.
 *
 * Launch: grid (n_kv_heads, n_tok), block a multiple of 32, shared
 * kn_kq_attn_smem_floats() floats. */
typedef struct kn_kq_attn_args {
    kn_attn_cuda_args_t a;
    const uint8_t *k_blocks;
    const uint8_t *v_blocks;
    const float *res;
    const int32_t *own_slot; /* (n_tok) */
    int32_t n_layers;
    int32_t layer;
    kn_kq_geom_t g;
    const int32_t *shift;  /* [num_blocks] pending key shift per block, or NULL (none) */
    const float *inv_freq; /* (head_dim / 2), read when a shift is pending */
} kn_kq_attn_args_t;

/* Shared floats: q, q', acc (group x hd), p (group x tile), m, l, alpha,
 * qz, pz (group each), cos / sin of a block's shift (hd / 2 each). */
static inline size_t
kn_kq_attn_smem_floats(int32_t group, int32_t head_dim)
{
    return (size_t)group * (3 * (size_t)head_dim + KN_ATTN_TILE + 5) + (size_t)head_dim;
}

KN_DEV void
kn_kq_attention_body(const kn_thr_t *t, float *smem, const kn_kq_attn_args_t *qa)
{
    const kn_attn_cuda_args_t *a = &qa->a;
    const kn_kq_geom_t *g = &qa->g;
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads, bs = a->block_size;
    const int32_t kvh = t->bx, tok = t->by, h0 = kvh * group;
    const int32_t lane = t->tid % KN_WARP, warp = t->tid / KN_WARP, n_warps = t->nthr / KN_WARP;
    const int zp = g->fmt != KN_KQ_FP8;
    float *q_s = smem;                             /* [group][hd], pre-scaled */
    float *qf = q_s + (size_t)group * hd;          /* [group][hd], q * key scale */
    float *acc = qf + (size_t)group * hd;          /* [group][hd] */
    float *p = acc + (size_t)group * hd;           /* [group][tile] */
    float *m_s = p + (size_t)group * KN_ATTN_TILE; /* [group] */
    float *l_s = m_s + group;
    float *al_s = l_s + group;
    float *qz_s = al_s + group;
    float *pz_s = qz_s + group;
    float *cs_s = pz_s + group; /* [hd / 2] */
    float *sn_s = cs_s + hd / 2;
    int32_t s = 0, lo, hi, own_slot = qa->own_slot[tok];

    s = kn_attn_begin(t, a, tok, h0, q_s, acc, m_s, l_s, &lo, &hi);
    KN_SYNC(t);

    const int32_t *bt = a->block_tables + (size_t)s * a->max_blocks;

    for (int32_t j0 = lo; j0 <= hi;) {
        int32_t bi = j0 / bs, off0 = j0 % bs;
        int32_t n_keys = bs - off0;
        int own = bi == hi / bs && own_slot >= 0;
        const uint8_t *kb = qa->k_blocks + (size_t)bt[bi] * g->k_stride;
        const uint8_t *vb = qa->v_blocks + (size_t)bt[bi] * g->v_stride;
        const uint16_t *km = (const uint16_t *)(kb + g->data_bytes);
        const uint16_t *vm = (const uint16_t *)(vb + g->data_bytes);
        const float *kr = qa->res + kn_kq_res_off(g, own ? own_slot : 0, qa->n_layers, qa->layer, 0,
                                                  kvh);
        const float *vr = qa->res + kn_kq_res_off(g, own ? own_slot : 0, qa->n_layers, qa->layer, 1,
                                                  kvh);
        const size_t row0 = (size_t)kvh * bs * hd; /* element index of (kvh, 0, 0) */
        const int32_t shift = !own && qa->shift != NULL ? qa->shift[bt[bi]] : 0;

        n_keys = n_keys < KN_ATTN_TILE ? n_keys : KN_ATTN_TILE;
        n_keys = n_keys < hi - j0 + 1 ? n_keys : hi - j0 + 1;

        if (shift != 0) { /* uniform over the thread block */
            for (int32_t i = t->tid; i < hd / 2; i += t->nthr) {
                kn_rot_cs(qa->inv_freq, i, -shift, &cs_s[i], &sn_s[i]);
            }
            KN_SYNC(t);
        }
        /* Fold the block's key scales (and zero points) into the query. */
        for (int32_t gg = warp; gg < group; gg += n_warps) {
            float zs = 0.0f;

            for (int32_t i = lane; i < hd; i += KN_WARP) {
                float qv = q_s[(size_t)gg * hd + i], sc = 1.0f, z = 0.0f;

                if (shift != 0) { /* R(shift) q, pair (i, i + hd/2) */
                    const int32_t half = hd / 2, k = i < half ? i : i - half;
                    const float *qg = q_s + (size_t)gg * hd;
                    float c = cs_s[k], sn = sn_s[k];

                    qv = i < half ? KN_FSUB_RN(KN_FMUL_RN(qv, c), KN_FMUL_RN(qg[i + half], sn))
                                  : KN_FADD_RN(KN_FMUL_RN(qv, c), KN_FMUL_RN(qg[i - half], sn));
                }
                if (!own) {
                    sc = kn_f16_to_f32(km[(size_t)kvh * hd + i]);
                    z = zp ? kn_f16_to_f32(km[(size_t)g->n_kv * hd + (size_t)kvh * hd + i]) : 0.0f;
                }
                qf[(size_t)gg * hd + i] = qv * sc;
                zs += qv * z;
            }
            zs = kn_warp_sum(t, zs);
            if (lane == 0) {
                qz_s[gg] = zs;
            }
        }
        KN_SYNC(t);

        /* Scores: warp w takes keys w, w + n_warps, ... */
        for (int32_t jj = warp; jj < n_keys; jj += n_warps) {
            int32_t r = off0 + jj;
            size_t row_el = row0 + (size_t)r * hd;

            for (int32_t gg = 0; gg < group; gg++) {
                float d = 0.0f;

                for (int32_t i = lane; i < hd; i += KN_WARP) {
                    float kv = own ? kr[(size_t)r * hd + i] : kn_kq_code(g, kb, row_el, i);

                    d += qf[(size_t)gg * hd + i] * kv;
                }
                d = kn_warp_sum(t, d);
                if (lane == 0) {
                    p[(size_t)gg * KN_ATTN_TILE + jj] = d + qz_s[gg];
                }
            }
        }
        KN_SYNC(t);

        /* Online softmax; the value scale folds into the weight. */
        for (int32_t gg = warp; gg < group; gg += n_warps) {
            float *pg = p + (size_t)gg * KN_ATTN_TILE;
            float v = lane < n_keys ? pg[lane] : -INFINITY;
            float m_new = fmaxf(m_s[gg], kn_warp_max(t, v));
            float e = lane < n_keys ? expf(v - m_new) : 0.0f;
            float vs = 1.0f, vz = 0.0f, sum, ez;

            if (lane < n_keys && !own) {
                size_t mi = (size_t)kvh * bs + (size_t)(off0 + lane);

                vs = kn_f16_to_f32(vm[mi]);
                vz = zp ? kn_f16_to_f32(vm[(size_t)g->n_kv * bs + mi]) : 0.0f;
            }
            sum = kn_warp_sum(t, e);
            ez = kn_warp_sum(t, e * vz);
            if (lane < n_keys) {
                pg[lane] = e * vs;
            }
            if (lane == 0) {
                float alpha = expf(m_s[gg] - m_new);

                al_s[gg] = alpha;
                l_s[gg] = l_s[gg] * alpha + sum;
                m_s[gg] = m_new;
                pz_s[gg] = ez;
            }
        }
        KN_SYNC(t);

        /* Values: thread per (head, dim). */
        for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
            int32_t gg = j / hd, d = j % hd;
            const float *pg = p + (size_t)gg * KN_ATTN_TILE;
            float o = acc[j] * al_s[gg] + pz_s[gg];

            for (int32_t jj = 0; jj < n_keys; jj++) {
                int32_t r = off0 + jj;
                float vv = own ? vr[(size_t)r * hd + d]
                               : kn_kq_code(g, vb, row0 + (size_t)r * hd, d);

                o += pg[jj] * vv;
            }
            acc[j] = o;
        }
        KN_SYNC(t);
        j0 += n_keys;
    }

    for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
        int32_t gg = j / hd, d = j % hd;

        kn_st16(a->out, (size_t)tok * a->n_heads * hd + (size_t)(h0 + gg) * hd + d,
                acc[j] / l_s[gg], a->dt);
    }
}

/* ---- tq3 / tq4 KV rows (kernels/kn_tq.h, kernels/cpu/kv_tq.h) ------------
 * The same row bytes as the CPU store: [n_kv][bs][row] per block and kind,
 * block b of the layer's region at b * k_stride / v_stride. sg (n_kv, hd)
 * and S (n_kv, hd, hd) are the layer's signs and sketch as kn_tq_create()
 * makes them (the host uploads them once). Both bodies call the shared
 * row codec, so a write is bit-identical to kn_kvq_write() (the emulator
 * test checks it; on a GPU log2f of the value norm may differ in the last
 * place at a rounding boundary of its 8-bit code).
 *
 * kn_tq_write_body: the new tokens' K (thread 0) and V (thread 1) rows of
 * one layer. k, v: (n_tok, n_kv * hd) f32; slot: (n_tok), negative
 * skipped. Launch: grid (n_tok, n_kv), block >= 1 thread, no shared memory.
 *
 * kn_tq_attn_body: paged attention over tq blocks, as kn_kvq_attention():
 * each thread takes one query head of KV head blockIdx.y's group, rotates
 * it once (qz = H D q, sq = S qz), scores every key row in the rotated
 * domain (kn_tq_key_dot), sums p_t n_t cb[code_t] and rotates the sum back
 * once. A first, serial-per-head version: correct and checked, not tuned
 * (a warp per head with the rows split over lanes is the next step). S is
 * read only for sketched keys (tq4) and may be NULL for tq3.
 * q, out: (n_tok, n_heads * hd) f32 (or out16, 16-bit dt: the device
 * forward's GEMM input). Launch: grid (n_tok, n_kv), block >=
 * n_heads / n_kv threads (more idle), no shared memory. */
#include "kernels/kn_tq.h"

typedef struct kn_tq_write_args {
    const float *k, *v;
    const int32_t *slot;
    uint8_t *kc, *vc;
    const float *sg, *S;
    size_t k_stride, v_stride;
    int32_t n_kv, hd, bs, bits;
    int32_t x_stride; /* floats between tokens' k (and v) rows; 0: n_kv * hd */
} kn_tq_write_args_t;

KN_DEV void
kn_tq_write_body(const kn_thr_t *t, float *smem, const kn_tq_write_args_t *a)
{
    const int32_t tok = t->bx, h = t->by, hd = a->hd;
    const int32_t sl = a->slot[tok];

    (void)smem;
    if (sl < 0) {
        return;
    }
    for (int kind = t->tid; kind < 2; kind += t->nthr) {
        const size_t xs = a->x_stride > 0 ? (size_t)a->x_stride : (size_t)a->n_kv * hd;
        const float *x = (kind == 0 ? a->k : a->v) + (size_t)tok * xs + (size_t)h * hd;
        uint8_t *base = kind == 0 ? a->kc + (size_t)(sl / a->bs) * a->k_stride
                                  : a->vc + (size_t)(sl / a->bs) * a->v_stride;
        size_t row = (size_t)kn_tq_row_bytes(a->bits, kind, hd);

        kn_tq_encode_row(hd, a->bits, kind, a->sg + (size_t)h * hd,
                         a->S != NULL ? a->S + (size_t)h * hd * hd : NULL, x,
                         base + ((size_t)h * a->bs + sl % a->bs) * row);
    }
}

typedef struct kn_tq_attn_args {
    float *out;
    const float *q;
    const uint8_t *kc, *vc;
    const float *sg, *S;
    const int32_t *query_start, *context_len, *block_tables;
    size_t k_stride, v_stride;
    int32_t max_blocks, n_seqs, n_heads, n_kv, hd, bs, bits, sliding_window;
    float scale;
    uint16_t *out16; /* non-NULL: the output goes here as 16-bit dt instead of out */
    kn_dt_t dt;
    int32_t q_stride; /* floats between tokens' q rows; 0: n_heads * hd (out keeps that) */
} kn_tq_attn_args_t;

KN_DEV void
kn_tq_attn_body(const kn_thr_t *t, float *smem, const kn_tq_attn_args_t *a)
{
    const int32_t tok = t->bx, kh = t->by, hd = a->hd, bs = a->bs, bits = a->bits;
    const int32_t group = a->n_heads / a->n_kv;
    const int32_t s = kn_seq_of(a->query_start, a->n_seqs, tok);
    const int32_t n_new = a->query_start[s + 1] - a->query_start[s];
    const int32_t ctx = a->context_len[s] - n_new + (tok - a->query_start[s]);
    const int32_t *bt = a->block_tables + (size_t)s * a->max_blocks;
    const size_t krow = (size_t)kn_tq_row_bytes(bits, 0, hd);
    const size_t vrow = (size_t)kn_tq_row_bytes(bits, 1, hd);
    const kn_tq_fmt_t vf = kn_tq_fmt(bits, 1, hd);
    const int di = kn_tq_dim_index(hd), sketch = kn_tq_fmt(bits, 0, hd).sketch;
    const float *sg = a->sg + (size_t)kh * hd;
    int32_t lo = 0;

    (void)smem;
    if (a->sliding_window > 0 && ctx - a->sliding_window + 1 > 0) {
        lo = ctx - a->sliding_window + 1;
    }
    for (int32_t g = t->tid; g < group; g += t->nthr) {
        float qz[KN_TQ_MAX_DIM], sq[KN_TQ_MAX_DIM], acc[KN_TQ_MAX_DIM];
        const size_t qo = ((size_t)tok * a->n_heads + (size_t)kh * group + g) * hd;
        const size_t qi = (size_t)tok * (a->q_stride > 0 ? (size_t)a->q_stride
                                                         : (size_t)a->n_heads * hd) +
                          ((size_t)kh * group + g) * hd;
        float m = -INFINITY, l = 0.0f;

        for (int32_t c = 0; c < hd; c++) {
            qz[c] = KN_FMUL_RN(a->q[qi + c], sg[c]);
            acc[c] = 0.0f;
        }
        kn_tq_fwht(qz, hd);
        for (int32_t i = 0; i < hd && sketch; i++) {
            const float *S = a->S + (size_t)kh * hd * hd;
            float d = 0.0f;

            for (int32_t c = 0; c < hd; c++) {
                d = KN_FADD_RN(d, KN_FMUL_RN(S[(size_t)i * hd + c], qz[c]));
            }
            sq[i] = d;
        }
        for (int32_t j = lo; j <= ctx; j++) {
            const size_t blk = (size_t)bt[j / bs], r = (size_t)kh * bs + j % bs;
            const uint8_t *kr = a->kc + blk * a->k_stride + r * krow;
            const uint8_t *vr = a->vc + blk * a->v_stride + r * vrow;
            float sc = KN_FMUL_RN(kn_tq_key_dot(hd, bits, kr, qz, sq), a->scale), w;

            if (sc > m) {
                float corr = expf(m - sc);

                l = KN_FMUL_RN(l, corr);
                for (int32_t c = 0; c < hd; c++) {
                    acc[c] = KN_FMUL_RN(acc[c], corr);
                }
                m = sc;
            }
            w = expf(sc - m);
            l = KN_FADD_RN(l, w);
            w = KN_FMUL_RN(w, kn_tq_scale(vr, &vf, 1));
            for (int32_t c = 0; c < hd; c++) {
                acc[c] = KN_FADD_RN(acc[c], KN_FMUL_RN(w, kn_tq_val(vr, &vf, di, c)));
            }
        }
        kn_tq_fwht(acc, hd);
        for (int32_t c = 0; c < hd; c++) {
            float o = acc[c] / (l * (float)hd) * sg[c];

            if (a->out16 != NULL) {
                kn_st16(a->out16, qo + (size_t)c, o, a->dt);
            } else {
                a->out[qo + c] = o;
            }
        }
    }
}

/* kn_tq_shift_body: KV_OP_SHIFT of one tq block (attention sinks): each
 * key row of (head blockIdx.x, layer blockIdx.y) decoded (kn_tq_decode_row),
 * rotated by -delta (kn_kv_rotate_body's arithmetic: the CPU's
 * kn_kvq_rotate_rows step for step) and encoded again, as the CPU store's
 * SHIFT does (tq re-quantizes there). Every row of the block, written or
 * not, as on the CPU. kc: layer 0's K region, layer_stride bytes to the
 * next layer's; sg (n_layers, n_kv, hd), S (n_layers, n_kv, hd, hd) or
 * NULL (tq3: no sketch). Launch: grid (n_kv, n_layers), any block size (a
 * thread per row), no shared memory. */
typedef struct kn_tq_shift_args {
    uint8_t *kc;
    size_t layer_stride, k_stride;
    const float *sg, *S, *inv_freq;
    int32_t blk, n_kv, hd, bs, bits, delta;
} kn_tq_shift_args_t;

KN_DEV void
kn_tq_shift_body(const kn_thr_t *t, float *smem, const kn_tq_shift_args_t *a)
{
    const int32_t h = t->bx, layer = t->by, hd = a->hd, half = hd / 2;
    const size_t lh = (size_t)layer * (size_t)a->n_kv + (size_t)h;
    const float *sg = a->sg + lh * (size_t)hd;
    const float *S = a->S != NULL ? a->S + lh * (size_t)hd * (size_t)hd : NULL;
    const size_t krow = (size_t)kn_tq_row_bytes(a->bits, 0, hd);

    (void)smem;
    for (int32_t r = t->tid; r < a->bs; r += t->nthr) {
        uint8_t *row = a->kc + (size_t)layer * a->layer_stride + (size_t)a->blk * a->k_stride +
                       ((size_t)h * a->bs + (size_t)r) * krow;
        float x[KN_TQ_MAX_DIM];

        kn_tq_decode_row(hd, a->bits, 0, sg, S, row, x);
        for (int32_t i = 0; i < half; i++) {
            float c, sn, x0 = x[i], x1 = x[i + half];

            kn_rot_cs(a->inv_freq, i, a->delta, &c, &sn);
            x[i] = KN_FSUB_RN(KN_FMUL_RN(x0, c), KN_FMUL_RN(x1, sn));
            x[i + half] = KN_FADD_RN(KN_FMUL_RN(x1, c), KN_FMUL_RN(x0, sn));
        }
        kn_tq_encode_row(hd, a->bits, 0, sg, S, x, row);
    }
}

#endif /* KERNELS_CUDA_KN_CUDA_BODY_H */
