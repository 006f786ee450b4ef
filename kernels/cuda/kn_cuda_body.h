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
} kn_attn_cuda_args_t;

/* Shared floats: q (group x hd), acc (group x hd), p (group x tile),
 * m, l, alpha (group each). */
static inline size_t
kn_attn_smem_floats(int32_t group, int32_t head_dim)
{
    return (size_t)group * (2 * (size_t)head_dim + KN_ATTN_TILE + 3);
}

KN_DEV void
kn_attention_body(const kn_thr_t *t, float *smem, const kn_attn_cuda_args_t *a)
{
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int32_t kvh = t->bx, tok = t->by, h0 = kvh * group;
    const int32_t lane = t->tid % KN_WARP, warp = t->tid / KN_WARP, n_warps = t->nthr / KN_WARP;
    float *q_s = smem;                             /* [group][hd], pre-scaled */
    float *acc = q_s + (size_t)group * hd;         /* [group][hd] */
    float *p = acc + (size_t)group * hd;           /* [group][tile] */
    float *m_s = p + (size_t)group * KN_ATTN_TILE; /* [group] */
    float *l_s = m_s + group;                      /* [group] */
    float *al_s = l_s + group;                     /* [group] */
    int32_t s = 0, lo, hi;

    /* The sequence of this token: the last s with query_start[s] <= tok. */
    {
        int32_t a0 = 0, a1 = a->n_seqs - 1;

        while (a0 < a1) {
            int32_t mid = (a0 + a1 + 1) / 2;

            if (a->query_start[mid] <= tok) {
                a0 = mid;
            } else {
                a1 = mid - 1;
            }
        }
        s = a0;
    }
    hi = a->context_len[s] - (a->query_start[s + 1] - tok); /* ctx index of tok */
    lo = 0;
    if (a->sliding_window > 0 && hi - a->sliding_window + 1 > 0) {
        lo = hi - a->sliding_window + 1;
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
    KN_SYNC(t);

    const int32_t *bt = a->block_tables + (size_t)s * a->max_blocks;

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

    for (int32_t j = t->tid; j < group * hd; j += t->nthr) {
        int32_t g = j / hd, d = j % hd;

        kn_st16(a->out, (size_t)tok * a->n_heads * hd + (size_t)(h0 + g) * hd + d, acc[j] / l_s[g],
                a->dt);
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
    int32_t s = 0, n_q, rows, first, lo0, hi1;

    {
        int32_t a0 = 0, a1 = a->n_seqs - 1;

        while (a0 < a1) {
            int32_t mid = (a0 + a1 + 1) / 2;

            if (a->query_start[mid] <= t0) {
                a0 = mid;
            } else {
                a1 = mid - 1;
            }
        }
        s = a0;
    }
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

#endif /* KERNELS_CUDA_KN_CUDA_BODY_H */
