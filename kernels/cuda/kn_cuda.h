/* kn_cuda.h - host-side launchers of the CUDA kernels (kn_cuda.cu), callable
 * from C. Each launcher enqueues one kernel on stream s with the launch
 * shape its body documents in kn_cuda_body.h and never synchronizes; it
 * returns cudaSuccess or the launch error (the caller reports it by name
 * with cudaGetErrorName). Shapes, dtypes and memory spaces are those of
 * the args structs in kn_cuda_body.h: every pointer is device memory of
 * the current device.
 *
 * GEMMs are not here: the backend calls cuBLAS (cublasGemmEx, 16-bit
 * inputs, f32 output, CUBLAS_COMPUTE_32F) directly.
 *
 * Thread: the thread that owns the current device (one per rank).
 */
#ifndef KERNELS_CUDA_KN_CUDA_H
#define KERNELS_CUDA_KN_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda/kn_cuda_body.h"
#include "kernels/cuda/kn_mass_body.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (n_tok, dim) f32 <- table rows; grid n_tok. */
cudaError_t kn_cuda_embed(cudaStream_t s, const kn_embed_args_t *a, int32_t n_tok);
/* out (n_tok, dim) 16-bit <- rmsnorm(x) * w; grid n_tok. */
cudaError_t kn_cuda_rmsnorm(cudaStream_t s, const kn_rmsnorm_args_t *a, int32_t n_tok);
/* x (n_tok, n_heads * head_dim) f32 rotated in place; grid n_tok. */
cudaError_t kn_cuda_rope(cudaStream_t s, const kn_rope_args_t *a, int32_t n_tok);
/* y (n_tok, d) f32 += bias; grid n_tok. */
cudaError_t kn_cuda_bias(cudaStream_t s, const kn_bias_args_t *a, int32_t n_tok);
/* K/V cache slots <- k, v (n_tok rows); grid n_tok. */
cudaError_t kn_cuda_kv_write(cudaStream_t s, const kn_kv_write_args_t *a, int32_t n_tok);
/* out (n_tok, n) 16-bit <- silu(gate) * up; grid n_tok. */
cudaError_t kn_cuda_silu_mul(cudaStream_t s, const kn_silu_mul_args_t *a, int32_t n_tok);
/* x (n) f32 += y (n). */
cudaError_t kn_cuda_add(cudaStream_t s, const kn_add_args_t *a);
/* out (n_rows, dim) f32 <- x rows; grid n_rows. */
cudaError_t kn_cuda_gather(cudaStream_t s, const kn_gather_args_t *a, int32_t n_rows);
/* Paged attention over the varlen batch; grid (n_kv_heads, n_tok), or
 * with a->n_splits > 1 the split-K pair: split kernel, grid (n_kv_heads *
 * n_splits, n_tok), into a->part, then the combine, grid (n_heads, n_tok). */
cudaError_t kn_cuda_attention(cudaStream_t s, const kn_attn_cuda_args_t *a, int32_t n_tok);
/* Paged attention by query tiles (prefill chunks); grid (n_kv_heads, n_tiles). */
cudaError_t kn_cuda_attention_prefill(cudaStream_t s, const kn_attn_prefill_args_t *a,
                                      int32_t n_tiles);
/* Quantized KV (KIVI blocks, kn_cuda_body.h): residual slot rows <- k, v;
 * grid n_tok. */
cudaError_t kn_cuda_kq_res_write(cudaStream_t s, const kn_kq_res_write_args_t *a, int32_t n_tok);
/* Blocks <- codes of residual slots, one layer; grid (n_jobs, 2 * n_kv);
 * n_jobs 1 with a->jobs NULL for the one job in the args. */
cudaError_t kn_cuda_kq_quant(cudaStream_t s, const kn_kq_quant_args_t *a, int32_t n_jobs);
/* One residual slot layer <- a block's dequantized codes; grid (n_kv, 2); n unused. */
cudaError_t kn_cuda_kq_dequant(cudaStream_t s, const kn_kq_dequant_args_t *a, int32_t n);
/* Paged attention over quantized blocks; grid (n_kv_heads, n_tok). */
cudaError_t kn_cuda_kq_attention(cudaStream_t s, const kn_kq_attn_args_t *a, int32_t n_tok);
/* KV_OP_SHIFT: key rows rotated by -a->delta in place (16-bit pool or f32
 * residual slot); grid (n_heads, n_layers); nothing for delta 0. */
cudaError_t kn_cuda_kv_rotate(cudaStream_t s, const kn_kv_rotate_args_t *a, int32_t n_heads,
                              int32_t n_layers);
/* tq3 / tq4 KV (kn_cuda_body.h): the new tokens' rows of one layer, grid
 * (n_tok, n_kv); attention over tq blocks, grid (n_tok, n_kv); KV_OP_SHIFT
 * of one block's keys in every layer, grid (n_kv, n_layers), nothing for
 * delta 0. */
cudaError_t kn_cuda_tq_write(cudaStream_t s, const kn_tq_write_args_t *a, int32_t n_tok);
cudaError_t kn_cuda_tq_attention(cudaStream_t s, const kn_tq_attn_args_t *a, int32_t n_tok);
cudaError_t kn_cuda_tq_shift(cudaStream_t s, const kn_tq_shift_args_t *a, int32_t n_layers);
/* H2O / SnapKV (kn_mass_body.h): the attention mass of the rows that
 * accumulate, one layer, grid (n_kv_heads, n_seqs); the mass of n slots,
 * grid n; KV_OP_COPY_SLOT moves over a 16-bit pool, grid (n_kv, n_layers),
 * nothing for 0 moves. */
cudaError_t kn_cuda_attn_mass(cudaStream_t s, const kn_attn_mass_args_t *a, int32_t n_seqs);
cudaError_t kn_cuda_mass_gather(cudaStream_t s, const kn_mass_gather_args_t *a, int32_t n);
cudaError_t kn_cuda_kv_move(cudaStream_t s, const kn_kv_move_args_t *a, int32_t n_layers);
/* dst (n_rows, n_cols) 16-bit <- rows of weight blocks in their file type;
 * grid n_rows. */
cudaError_t kn_cuda_wdequant(cudaStream_t s, const kn_wdequant_args_t *a, int32_t n_rows);

#ifdef __cplusplus
}
#endif

#endif /* KERNELS_CUDA_KN_CUDA_H */
