/* kn_cuda.cu - the CUDA kernels: __global__ wrappers around the bodies of
 * kn_cuda_body.h (shared with the CPU emulator that tests them in CI) and
 * their launchers (kn_cuda.h). Built for sm_80 and sm_90.
 *
 * Each wrapper fills a kn_thr_t from the built-ins and passes the dynamic
 * shared memory; the args struct travels by value in the kernel
 * parameters. Block sizes: 256 threads for row kernels (rmsnorm reduces
 * over the row with them), 128 for attention (4 warps share a (token, KV
 * head) block, also per split of split-K decode attention), 64 for the
 * split-K combine (a thread per head_dim element), 256 elsewhere; 128 for
 * the quantized-KV block quantizer (a thread per key channel pair or
 * value row); a warp for the tq3 / tq4 row writer (two threads work: K
 * and V), the tq block shift (a thread per row) and the tq attention (a
 * thread per query head of the group); 128 for the H2O / SnapKV mass
 * (threads over a sequence's keys) and the slot moves (over a row's K and
 * V elements), 64 for the mass gather.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/kn_cuda.h"

#define KN_ROW_THREADS 256
#define KN_ATTN_THREADS 128
#define KN_COMBINE_THREADS 64

static __device__ __forceinline__ kn_thr_t
kn_thr_here(void)
{
    kn_thr_t t;

    t.tid = (int)threadIdx.x;
    t.nthr = (int)blockDim.x;
    t.bx = (int)blockIdx.x;
    t.by = (int)blockIdx.y;
    t.gx = (int)gridDim.x;
    t.gy = (int)gridDim.y;
    t.emu = NULL;
    return t;
}

#define KN_KERNEL(name, args_t)                                                                    \
    static __global__ void k_##name(args_t a)                                                      \
    {                                                                                              \
        extern __shared__ float kn_smem[];                                                         \
        kn_thr_t t = kn_thr_here();                                                                \
        kn_##name##_body(&t, kn_smem, &a);                                                         \
    }

KN_KERNEL(embed, kn_embed_args_t)
KN_KERNEL(rmsnorm, kn_rmsnorm_args_t)
KN_KERNEL(rope, kn_rope_args_t)
KN_KERNEL(bias, kn_bias_args_t)
KN_KERNEL(kv_write, kn_kv_write_args_t)
KN_KERNEL(silu_mul, kn_silu_mul_args_t)
KN_KERNEL(add, kn_add_args_t)
KN_KERNEL(gather, kn_gather_args_t)
KN_KERNEL(attention, kn_attn_cuda_args_t)
KN_KERNEL(attention_split, kn_attn_cuda_args_t)
KN_KERNEL(attention_combine, kn_attn_cuda_args_t)
KN_KERNEL(attention_prefill, kn_attn_prefill_args_t)
KN_KERNEL(kq_res_write, kn_kq_res_write_args_t)
KN_KERNEL(kq_quant, kn_kq_quant_args_t)
KN_KERNEL(kq_dequant, kn_kq_dequant_args_t)
KN_KERNEL(kq_attention, kn_kq_attn_args_t)
KN_KERNEL(kv_rotate, kn_kv_rotate_args_t)
KN_KERNEL(wdequant, kn_wdequant_args_t)
KN_KERNEL(tq_write, kn_tq_write_args_t)
KN_KERNEL(tq_attn, kn_tq_attn_args_t)
KN_KERNEL(tq_shift, kn_tq_shift_args_t)
KN_KERNEL(attn_mass, kn_attn_mass_args_t)
KN_KERNEL(mass_gather, kn_mass_gather_args_t)
KN_KERNEL(kv_move, kn_kv_move_args_t)

extern "C" cudaError_t
kn_cuda_attn_mass(cudaStream_t s, const kn_attn_mass_args_t *a, int32_t n_seqs)
{
    dim3 grid((unsigned)a->a.n_kv_heads, (unsigned)n_seqs);

    if (n_seqs <= 0) {
        return cudaSuccess;
    }
    k_attn_mass<<<grid, KN_ATTN_THREADS, sizeof(float) * kn_mass_smem_floats(a->a.head_dim), s>>>(
        *a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_mass_gather(cudaStream_t s, const kn_mass_gather_args_t *a, int32_t n)
{
    if (n <= 0) {
        return cudaSuccess;
    }
    k_mass_gather<<<n, KN_COMBINE_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kv_move(cudaStream_t s, const kn_kv_move_args_t *a, int32_t n_layers)
{
    dim3 grid((unsigned)a->n_kv, (unsigned)n_layers);

    if (a->n_moves <= 0 || n_layers <= 0) {
        return cudaSuccess;
    }
    k_kv_move<<<grid, KN_ATTN_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_embed(cudaStream_t s, const kn_embed_args_t *a, int32_t n_tok)
{
    k_embed<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_rmsnorm(cudaStream_t s, const kn_rmsnorm_args_t *a, int32_t n_tok)
{
    k_rmsnorm<<<n_tok, KN_ROW_THREADS, sizeof(float) * (KN_ROW_THREADS / KN_WARP), s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_rope(cudaStream_t s, const kn_rope_args_t *a, int32_t n_tok)
{
    k_rope<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_bias(cudaStream_t s, const kn_bias_args_t *a, int32_t n_tok)
{
    k_bias<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kv_write(cudaStream_t s, const kn_kv_write_args_t *a, int32_t n_tok)
{
    k_kv_write<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_silu_mul(cudaStream_t s, const kn_silu_mul_args_t *a, int32_t n_tok)
{
    k_silu_mul<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_add(cudaStream_t s, const kn_add_args_t *a)
{
    int64_t per_block = (int64_t)KN_ROW_THREADS * 4;
    unsigned grid = (unsigned)((a->n + per_block - 1) / per_block);

    if (grid == 0) {
        return cudaSuccess;
    }
    k_add<<<grid, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_gather(cudaStream_t s, const kn_gather_args_t *a, int32_t n_rows)
{
    k_gather<<<n_rows, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_attention(cudaStream_t s, const kn_attn_cuda_args_t *a, int32_t n_tok)
{
    int32_t group = a->n_heads / a->n_kv_heads;
    size_t smem = sizeof(float) * kn_attn_smem_floats(group, a->head_dim);
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)n_tok);

    if (group > KN_ATTN_MAX_GROUP || a->head_dim > 256 || a->n_splits > KN_ATTN_MAX_SPLITS ||
        (a->n_splits > 1 && a->part == NULL)) {
        return cudaErrorInvalidValue;
    }
    if (a->n_splits > 1) {
        dim3 sgrid((unsigned)(a->n_kv_heads * a->n_splits), (unsigned)n_tok);
        dim3 cgrid((unsigned)a->n_heads, (unsigned)n_tok);
        cudaError_t e;

        k_attention_split<<<sgrid, KN_ATTN_THREADS, smem, s>>>(*a);
        if ((e = cudaGetLastError()) != cudaSuccess) {
            return e;
        }
        k_attention_combine<<<cgrid, KN_COMBINE_THREADS, 0, s>>>(*a);
        return cudaGetLastError();
    }
    k_attention<<<grid, KN_ATTN_THREADS, smem, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_attention_prefill(cudaStream_t s, const kn_attn_prefill_args_t *a, int32_t n_tiles)
{
    int32_t group = a->a.n_heads / a->a.n_kv_heads;
    size_t smem = sizeof(float) * kn_attn_prefill_smem_floats(a->q_tile, group, a->a.head_dim);
    dim3 grid((unsigned)a->a.n_kv_heads, (unsigned)n_tiles);

    if (group > KN_ATTN_MAX_GROUP || a->a.head_dim > 256) {
        return cudaErrorInvalidValue;
    }
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(
            k_attention_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            return e;
        }
    }
    k_attention_prefill<<<grid, KN_ATTN_THREADS, smem, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kq_res_write(cudaStream_t s, const kn_kq_res_write_args_t *a, int32_t n_tok)
{
    k_kq_res_write<<<n_tok, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kq_quant(cudaStream_t s, const kn_kq_quant_args_t *a, int32_t n_jobs)
{
    dim3 grid((unsigned)n_jobs, 2u * (unsigned)a->g.n_kv);

    if (n_jobs <= 0) {
        return cudaSuccess;
    }
    k_kq_quant<<<grid, KN_ATTN_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kq_dequant(cudaStream_t s, const kn_kq_dequant_args_t *a, int32_t n)
{
    dim3 grid((unsigned)a->g.n_kv, 2u);

    (void)n;
    k_kq_dequant<<<grid, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kq_attention(cudaStream_t s, const kn_kq_attn_args_t *a, int32_t n_tok)
{
    int32_t group = a->a.n_heads / a->a.n_kv_heads;
    size_t smem = sizeof(float) * kn_kq_attn_smem_floats(group, a->a.head_dim);
    dim3 grid((unsigned)a->a.n_kv_heads, (unsigned)n_tok);

    if (group > KN_ATTN_MAX_GROUP || a->a.head_dim > 256) {
        return cudaErrorInvalidValue;
    }
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(
            k_kq_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            return e;
        }
    }
    k_kq_attention<<<grid, KN_ATTN_THREADS, smem, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_kv_rotate(cudaStream_t s, const kn_kv_rotate_args_t *a, int32_t n_heads, int32_t n_layers)
{
    dim3 grid((unsigned)n_heads, (unsigned)n_layers);

    if (n_heads <= 0 || n_layers <= 0 || a->n_rows <= 0 || a->delta == 0) {
        return cudaSuccess;
    }
    k_kv_rotate<<<grid, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_wdequant(cudaStream_t s, const kn_wdequant_args_t *a, int32_t n_rows)
{
    if (n_rows <= 0) {
        return cudaSuccess;
    }
    k_wdequant<<<(unsigned)n_rows, KN_ROW_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_tq_write(cudaStream_t s, const kn_tq_write_args_t *a, int32_t n_tok)
{
    dim3 grid((unsigned)n_tok, (unsigned)a->n_kv);

    if (n_tok <= 0) {
        return cudaSuccess;
    }
    k_tq_write<<<grid, KN_WARP, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_tq_attention(cudaStream_t s, const kn_tq_attn_args_t *a, int32_t n_tok)
{
    dim3 grid((unsigned)n_tok, (unsigned)a->n_kv);
    int32_t group = a->n_heads / a->n_kv;

    if (n_tok <= 0) {
        return cudaSuccess;
    }
    k_tq_attn<<<grid, (unsigned)((group + KN_WARP - 1) / KN_WARP * KN_WARP), 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t
kn_cuda_tq_shift(cudaStream_t s, const kn_tq_shift_args_t *a, int32_t n_layers)
{
    dim3 grid((unsigned)a->n_kv, (unsigned)n_layers);

    if (a->delta == 0 || n_layers <= 0) {
        return cudaSuccess;
    }
    k_tq_shift<<<grid, KN_WARP, 0, s>>>(*a);
    return cudaGetLastError();
}
