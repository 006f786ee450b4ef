/* backend_cuda.c - the CUDA backend: weights in bf16/f16 on one or more
 * GPUs, the paged KV pool in device memory, the swap tier in pinned host
 * memory, kernels from kernels/cuda/, GEMMs through cuBLAS (16-bit inputs,
 * f32 accumulation and output) and tensor parallelism over NCCL
 * (DESIGN.md section 6, the split of model/tp.h). Built only with
 * -Dcuda=enabled; registered in runtime.c under KVSERVE_HAVE_CUDA.
 *
 * The rank's forward pass, weight upload and KV copy plan live in
 * model/dev_fwd.c, written against a table of device operations; this
 * file supplies that table with CUDA, cuBLAS and NCCL (and CI runs the
 * same dev_fwd.c with emulated operations, tests/cuda/test_devemu.c).
 *
 * DESIGN. One rank per device, one thread per rank (kn_ranks_t from
 * kernels/comm.h: the engine thread is rank 0 and drives device 0; each
 * other rank's thread owns its device, so only the owning thread calls
 * CUDA on a device). A step is broadcast by handing the batch (host
 * memory) to every rank; each rank uploads it with one cudaMemcpyAsync
 * from its pinned staging buffer and runs the layer loop of dev_fwd.c on
 * its stream, with ncclAllReduce after the row-parallel projections. At
 * T = 1 the one rank runs on the calling (engine) thread: kn_ranks_run
 * calls it directly, no handoff; each call sets the device first.
 *
 * Step graphs of decode and verification steps (rc.cuda_graphs, serve
 * --no-enforce-eager; rc.spec_k; 16-bit KV): the graph operations of
 * dev_fwd.h are stream capture (cudaStreamBeginCapture in ThreadLocal
 * mode, cudaStreamEndCapture,
 * cudaGraphInstantiateWithFlags, cudaGraphUpload) and cudaGraphLaunch;
 * model/dev_graph.c decides what is recorded and when. cuBLAS GEMMs are
 * captured like kernels: the handle's workspace is set at init.
 *
 * KV dtypes: bf16 / f16 blocks, or fp8_e4m3 / int8 / int4 blocks in the
 * KIVI layout of kernels/cpu/kv_quant.h with f32 residual slots for blocks
 * being filled (model/dev_fwd.c). --kv-policy works as on the cpu backend
 * (kv_shift_ops): KV_OP_SHIFT re-rotates 16-bit blocks and residual slots
 * in place (kn_cuda_kv_rotate) and records a pending shift for quantized
 * blocks, applied to the query by the attention kernel. H2O / SnapKV
 * (kv_mass, f16 / bf16 KV): the attention mass beside the pool, a mass
 * kernel after each layer's attention for the rows that accumulate, the
 * mass read back in one gather per call, KV_OP_COPY_SLOT as a move kernel
 * (model/dev_mass.c, kernels/cuda/kn_mass_body.h).
 *
 * Memory, per device, all allocated in create(): weights (bf16, or f16
 * with --kv-cache-dtype f16; uploaded in their file's type through a
 * pinned and a device staging buffer of at most 64 MiB each, freed once
 * the weights are dequantized on the device (kn_cuda_wdequant), so host
 * memory stays the mapped file), activations for max_num_batched_tokens rows,
 * the cuBLAS workspace, then the KV pool of num_blocks blocks, which must
 * fit in gpu_memory_utilization * total minus what is already in use
 * (cudaMemGetInfo after the other allocations): ST_ENOMEM with the number
 * of blocks that would fit otherwise. (`kvserve serve` without a block
 * count sizes the pool beforehand with mdl_kv_blocks_for_budget() from the
 * total of mdl_cuda_device_memory() below.) forward() and kv_ops() allocate
 * nothing. Every CUDA, cuBLAS and NCCL call is checked and a failure is
 * logged with the error's name and the call.
 *
 * Without a device (cudaGetDeviceCount fails or returns 0) create()
 * returns ST_ENODEV with the reason, so `--device cuda` on a machine
 * without GPUs fails with a clear message.
 */
#define LOG_MODULE "cuda"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cuda/kn_cuda.h"
#include "model/backend.h"
#include "model/dev_fwd.h"
#include "model/model_int.h"
#include "model/tp.h"

#define CU_WORKSPACE (32u << 20) /* cuBLAS workspace per device */

/* Error checks: log the failing call with the library's error name. */
#define CU_CHECK(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            LOG_ERROR("%s: %s (%s)", #call, cudaGetErrorName(e_), cudaGetErrorString(e_));         \
            return ST_ECUDA;                                                                       \
        }                                                                                          \
    } while (0)

#define BLAS_CHECK(call)                                                                           \
    do {                                                                                           \
        cublasStatus_t e_ = (call);                                                                \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            LOG_ERROR("%s: %s", #call, cublasGetStatusName(e_));                                   \
            return ST_ECUDA;                                                                       \
        }                                                                                          \
    } while (0)

#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t e_ = (call);                                                                  \
        if (e_ != ncclSuccess) {                                                                   \
            LOG_ERROR("%s: %s", #call, ncclGetErrorString(e_));                                    \
            return ST_ENCCL;                                                                       \
        }                                                                                          \
    } while (0)

typedef struct cu_rank {
    int dev;
    cudaStream_t stream;
    cublasHandle_t blas;
    ncclComm_t nccl;   /* NULL at T = 1 */
    void *workspace;   /* cuBLAS, CU_WORKSPACE bytes */
    mdl_dev_rank_t fw; /* weights, activations, KV pool (dev_fwd.h) */
} cu_rank_t;

typedef struct cu_state {
    const mdl_model_t *m;
    mdl_config_t c;
    mdl_runtime_config_t rc;
    kn_dt_t dt; /* weights, KV cache and GEMM inputs */
    int32_t tp;
    cu_rank_t *ranks; /* [tp] */
    kn_ranks_t *threads;
    /* The current call, read by every rank. */
    const mdl_batch_t *b;
    const kv_op_t *ops;
    int32_t n_ops;
    const struct cu_mass_job *mass_job; /* kv_mass */
    char *err; /* create() only */
    size_t errlen;
} cu_state_t;

/* ---- the device operations of dev_fwd.h, with CUDA ------------------------ */

static int
cu_op_alloc(void *ctx, void **p, size_t bytes)
{
    cu_rank_t *rk = ctx;

    *p = NULL;
    CU_CHECK(cudaMalloc(p, bytes));
    CU_CHECK(cudaMemsetAsync(*p, 0, bytes, rk->stream));
    return ST_OK;
}

static void
cu_op_free(void *ctx, void *p)
{
    (void)ctx;
    if (p != NULL) {
        cudaFree(p);
    }
}

static int
cu_op_alloc_host(void *ctx, void **p, size_t bytes)
{
    (void)ctx;
    *p = NULL;
    CU_CHECK(cudaHostAlloc(p, bytes, cudaHostAllocDefault));
    memset(*p, 0, bytes);
    return ST_OK;
}

static void
cu_op_free_host(void *ctx, void *p)
{
    (void)ctx;
    if (p != NULL) {
        cudaFreeHost(p);
    }
}

static int
cu_op_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, rk->stream));
    CU_CHECK(cudaStreamSynchronize(rk->stream)); /* src is pageable and freed after */
    return ST_OK;
}

static int
cu_op_copy(void *ctx, void *dst, const void *src, size_t bytes, kv_op_kind_t kind)
{
    cu_rank_t *rk = ctx;
    enum cudaMemcpyKind k = kind == KV_OP_COPY       ? cudaMemcpyDeviceToDevice
                            : kind == KV_OP_SWAP_OUT ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyHostToDevice;

    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, k, rk->stream));
    return ST_OK;
}

static int
cu_op_sync(void *ctx)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(cudaStreamSynchronize(rk->stream));
    return ST_OK;
}

#define CU_OP_KERNEL(name, args_t)                                                                 \
    static int cu_op_##name(void *ctx, const args_t *a, int32_t n)                                 \
    {                                                                                              \
        cu_rank_t *rk = ctx;                                                                       \
        CU_CHECK(kn_cuda_##name(rk->stream, a, n));                                                \
        return ST_OK;                                                                              \
    }

CU_OP_KERNEL(embed, kn_embed_args_t)
CU_OP_KERNEL(rmsnorm, kn_rmsnorm_args_t)
CU_OP_KERNEL(rope, kn_rope_args_t)
CU_OP_KERNEL(bias, kn_bias_args_t)
CU_OP_KERNEL(kv_write, kn_kv_write_args_t)
CU_OP_KERNEL(silu_mul, kn_silu_mul_args_t)
CU_OP_KERNEL(gather, kn_gather_args_t)
CU_OP_KERNEL(attention, kn_attn_cuda_args_t)
CU_OP_KERNEL(attention_prefill, kn_attn_prefill_args_t)
CU_OP_KERNEL(kq_res_write, kn_kq_res_write_args_t)
CU_OP_KERNEL(kq_quant, kn_kq_quant_args_t)
CU_OP_KERNEL(kq_dequant, kn_kq_dequant_args_t)
CU_OP_KERNEL(kq_attention, kn_kq_attn_args_t)
CU_OP_KERNEL(wdequant, kn_wdequant_args_t)
CU_OP_KERNEL(tq_write, kn_tq_write_args_t)
CU_OP_KERNEL(tq_attention, kn_tq_attn_args_t)
CU_OP_KERNEL(tq_shift, kn_tq_shift_args_t)
CU_OP_KERNEL(attn_mass, kn_attn_mass_args_t)
CU_OP_KERNEL(mass_gather, kn_mass_gather_args_t)
CU_OP_KERNEL(kv_move, kn_kv_move_args_t)

static int
cu_op_kv_rotate(void *ctx, const kn_kv_rotate_args_t *a, int32_t n_heads, int32_t n_layers)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(kn_cuda_kv_rotate(rk->stream, a, n_heads, n_layers));
    return ST_OK;
}

static int
cu_op_add(void *ctx, const kn_add_args_t *a)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(kn_cuda_add(rk->stream, a));
    return ST_OK;
}

/* y^T = w x^T (+ y^T with acc: beta 1) in cuBLAS's column-major terms: w
 * is (d_in, d_out) column major, transposed; x is (d_in, n_tok) column
 * major. */
static int
cu_op_gemm(void *ctx, kn_dt_t dt, const uint16_t *x, const uint16_t *w, float *y, int32_t n_tok,
           int32_t d_in, int32_t d_out, int acc)
{
    cu_rank_t *rk = ctx;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    cudaDataType_t t = dt == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;

    BLAS_CHECK(cublasGemmEx(rk->blas, CUBLAS_OP_T, CUBLAS_OP_N, d_out, n_tok, d_in, &alpha, w, t,
                            d_in, x, t, d_in, &beta, y, CUDA_R_32F, d_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    return ST_OK;
}

static int
cu_op_allreduce(void *ctx, float *buf, size_t n)
{
    cu_rank_t *rk = ctx;

    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, rk->nccl, rk->stream));
    return ST_OK;
}

/* Graphs: stream capture of the rank's stream. ThreadLocal mode: only
 * this thread's unsafe calls (a sync, an allocation) break the capture,
 * other ranks' threads are free. cuBLAS records its GEMMs like kernels
 * (its workspace is set, so it allocates nothing). */
static int
cu_op_graph_begin(void *ctx)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(cudaStreamBeginCapture(rk->stream, cudaStreamCaptureModeThreadLocal));
    return ST_OK;
}

static int
cu_op_graph_end(void *ctx, void **graph)
{
    cu_rank_t *rk = ctx;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaError_t e;

    *graph = NULL;
    e = cudaStreamEndCapture(rk->stream, &g);
    if (e == cudaSuccess) {
        e = cudaGraphInstantiateWithFlags(&ex, g, 0);
    }
    if (g != NULL) {
        cudaGraphDestroy(g);
    }
    if (e == cudaSuccess) {
        e = cudaGraphUpload(ex, rk->stream); /* the first launch does not pay for it */
    }
    if (e != cudaSuccess) {
        LOG_ERROR("graph capture: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        if (ex != NULL) {
            cudaGraphExecDestroy(ex);
        }
        (void)cudaGetLastError(); /* a capture error is not sticky: clear it */
        return ST_ECUDA;
    }
    *graph = ex;
    return ST_OK;
}

static int
cu_op_graph_launch(void *ctx, void *graph)
{
    cu_rank_t *rk = ctx;

    CU_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, rk->stream));
    return ST_OK;
}

static void
cu_op_graph_free(void *ctx, void *graph)
{
    (void)ctx;
    if (graph != NULL) {
        cudaGraphExecDestroy((cudaGraphExec_t)graph);
    }
}

#define CU_OPS_COMMON                                                                              \
    .alloc = cu_op_alloc, .free = cu_op_free, .alloc_host = cu_op_alloc_host,                      \
    .free_host = cu_op_free_host, .upload = cu_op_upload, .copy = cu_op_copy, .sync = cu_op_sync,  \
    .embed = cu_op_embed, .rmsnorm = cu_op_rmsnorm, .rope = cu_op_rope, .bias = cu_op_bias,        \
    .kv_write = cu_op_kv_write, .silu_mul = cu_op_silu_mul, .add = cu_op_add,                      \
    .gather = cu_op_gather, .attention = cu_op_attention,                                          \
    .attention_prefill = cu_op_attention_prefill, .kq_res_write = cu_op_kq_res_write,           \
    .kq_quant = cu_op_kq_quant, .kq_dequant = cu_op_kq_dequant,                                    \
    .kq_attention = cu_op_kq_attention, .kv_rotate = cu_op_kv_rotate,                          \
    .tq_write = cu_op_tq_write, .tq_attention = cu_op_tq_attention, .tq_shift = cu_op_tq_shift,    \
    .wdequant = cu_op_wdequant, .gemm = cu_op_gemm, .attn_mass = cu_op_attn_mass,                \
    .mass_gather = cu_op_mass_gather, .kv_move = cu_op_kv_move

/* Graphs at T = 1 only: NCCL can be captured too, but that is not
 * checked on a device yet (the dev_fwd.c side is: tests/cuda at T = 2). */
static const mdl_dev_ops_t cu_ops_tp1 = {CU_OPS_COMMON,
                                         .allreduce = NULL,
                                         .graph_begin = cu_op_graph_begin,
                                         .graph_end = cu_op_graph_end,
                                         .graph_launch = cu_op_graph_launch,
                                         .graph_free = cu_op_graph_free};
static const mdl_dev_ops_t cu_ops_tp = {CU_OPS_COMMON, .allreduce = cu_op_allreduce};

/* ---- backend -------------------------------------------------------------------- */

static int
cu_rank_free(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];

    if (cudaSetDevice(rk->dev) != cudaSuccess) {
        return ST_OK;
    }
    if (rk->stream != NULL) {
        cudaStreamSynchronize(rk->stream);
    }
    if (rk->fw.ops != NULL && !rk->fw.graphs_off) {
        LOG_INFO("device %d: %lld step graphs recorded, %lld steps replayed, %lld run eagerly%s",
                 rk->dev, (long long)rk->fw.n_graph_captures, (long long)rk->fw.n_graph_steps,
                 (long long)rk->fw.n_eager_steps,
                 rk->fw.graph_failed ? " (a recording failed: replays off)" : "");
    }
    mdl_dev_rank_fini(&rk->fw);
    cudaFree(rk->workspace);
    if (rk->nccl != NULL) {
        ncclCommDestroy(rk->nccl);
    }
    if (rk->blas != NULL) {
        cublasDestroy(rk->blas);
    }
    if (rk->stream != NULL) {
        cudaStreamDestroy(rk->stream);
    }
    return ST_OK;
}

static void
cu_destroy(void *state)
{
    cu_state_t *s = state;

    if (s == NULL) {
        return;
    }
    if (s->ranks != NULL) {
        if (s->threads != NULL) {
            kn_ranks_run(s->threads, cu_rank_free, s);
        } else {
            for (int32_t r = 0; r < s->tp; r++) {
                cu_rank_free(s, r);
            }
        }
    }
    kn_ranks_destroy(s->threads);
    free(s->ranks);
    free(s);
}

/* One rank's device, stream, cuBLAS, weights, activations and KV pool, on
 * the rank's own thread. */
static int
cu_rank_init(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];
    const mdl_runtime_config_t *rc = &s->rc;
    size_t free_b, total_b, kv_bytes, budget, in_use, per_block;
    int st;

    CU_CHECK(cudaSetDevice(rk->dev));
    CU_CHECK(cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking));
    BLAS_CHECK(cublasCreate(&rk->blas));
    BLAS_CHECK(cublasSetStream(rk->blas, rk->stream));
    CU_CHECK(cudaMalloc(&rk->workspace, CU_WORKSPACE));
    BLAS_CHECK(cublasSetWorkspace(rk->blas, rk->workspace, CU_WORKSPACE));

    st = mdl_dev_rank_init(&rk->fw, s->tp > 1 ? &cu_ops_tp : &cu_ops_tp1, rk, s->m, rc, r, s->dt);
    if (st != ST_OK) {
        return st;
    }
    CU_CHECK(cudaStreamSynchronize(rk->stream));

    /* The KV pool from what --gpu-memory-utilization leaves. */
    kv_bytes = mdl_dev_rank_kv_bytes(&rk->fw);
    per_block = kv_bytes / (size_t)rc->num_blocks;
    CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
    in_use = total_b - free_b;
    budget = (size_t)((double)total_b * rc->gpu_memory_utilization);
    budget = budget > in_use ? budget - in_use : 0;
    if (kv_bytes > budget) {
        LOG_ERROR("device %d: a KV pool of %d blocks needs %zu MiB; --gpu-memory-utilization "
                  "%.2f leaves %zu MiB after weights and activations (%zu blocks)",
                  rk->dev, rc->num_blocks, kv_bytes >> 20, (double)rc->gpu_memory_utilization,
                  budget >> 20, budget / per_block);
        if (r == 0) { /* rank 0 writes err; the others only log */
            snprintf(s->err, s->errlen,
                     "cuda: a KV pool of %d blocks needs %zu MiB per device but "
                     "--gpu-memory-utilization %.2f leaves %zu MiB (%zu blocks)",
                     rc->num_blocks, kv_bytes >> 20, (double)rc->gpu_memory_utilization,
                     budget >> 20, budget / per_block);
        }
        return ST_ENOMEM;
    }
    st = mdl_dev_rank_alloc_kv(&rk->fw);
    if (st != ST_OK) {
        return st;
    }
    CU_CHECK(cudaStreamSynchronize(rk->stream));
    LOG_INFO("device %d: rank %d of %d, %d query heads, %d KV heads, KV pool %zu MiB "
             "(%d blocks, %s), %zu MiB in use before it",
             rk->dev, r, s->tp, rk->fw.sh.n_q, rk->fw.sh.n_kv, kv_bytes >> 20, rc->num_blocks,
             mdl_kv_dtype_name(rc->kv_dtype), in_use >> 20);
    if (!rk->fw.graphs_off) {
        LOG_INFO("device %d: decode and verification steps of up to %d tokens run as CUDA "
                 "graphs (%d token-count buckets, each recorded after its first step)",
                 rk->dev, rk->fw.graph_rows[rk->fw.n_buckets - 1], rk->fw.n_buckets);
    } else if (rc->cuda_graphs) {
        LOG_INFO("device %d: CUDA graphs need a 16-bit KV cache and one device: every step eager",
                 rk->dev);
    }
    if (rk->fw.kq.fmt != 0) {
        /* As the CPU backend reports a compressed pool: bytes per token with
         * the scales, and the residual of blocks being filled. */
        size_t blk = (size_t)s->c.n_layers * (rk->fw.kq.k_stride + rk->fw.kq.v_stride);

        LOG_INFO("device %d: KV %s %.1f bytes/token with scales (%zu per block), %d residual "
                 "slots of blocks being filled (%zu MiB)",
                 rk->dev, mdl_kv_dtype_name(rc->kv_dtype), (double)blk / rc->block_size, blk,
                 rk->fw.kqt[0].sl.n_slots, (kv_bytes - blk * (size_t)rc->num_blocks) >> 20);
    }
    if (rk->fw.tq_bits != 0) {
        size_t blk = (size_t)s->c.n_layers * (rk->fw.tq_kstride + rk->fw.tq_vstride);

        LOG_INFO("device %d: KV %s %.1f bytes/token (%zu per block), rows encoded when written",
                 rk->dev, mdl_kv_dtype_name(rc->kv_dtype), (double)blk / rc->block_size, blk);
    }
    return ST_OK;
}

static int
cu_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, void **state, char *err,
          size_t errlen)
{
    const mdl_config_t *c = &m->cfg;
    mdl_tp_shard_t sh;
    int n_dev = 0;
    cudaError_t e;
    cu_state_t *s;
    int st;

    e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        snprintf(err, errlen, "cuda: no CUDA device (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorName(e) : "0 devices");
        return ST_ENODEV;
    }
    if (rc->tp_size > n_dev) {
        snprintf(err, errlen, "cuda: tensor parallel size %d needs %d devices, found %d",
                 rc->tp_size, rc->tp_size, n_dev);
        return ST_ENODEV;
    }
    if (rc->kv_dtype != MDL_KV_BF16 && rc->kv_dtype != MDL_KV_F16 &&
        rc->kv_dtype != MDL_KV_FP8_E4M3 && rc->kv_dtype != MDL_KV_INT8 &&
        rc->kv_dtype != MDL_KV_INT4 && rc->kv_dtype != MDL_KV_TQ3 && rc->kv_dtype != MDL_KV_TQ4) {
        snprintf(err, errlen,
                 "cuda: the KV cache is bf16, f16, fp8_e4m3, int8, int4, tq3 or tq4 (not %s)",
                 mdl_kv_dtype_name(rc->kv_dtype));
        return ST_EUNSUPPORTED;
    }
    if (mdl_kv_block_bytes(c, rc->block_size, rc->kv_dtype) == 0) {
        snprintf(err, errlen, "cuda: --kv-cache-dtype %s cannot group head_dim %d (int4 needs a "
                 "multiple of 8, tq3 / tq4 a power of two in 16 .. 256)",
                 mdl_kv_dtype_name(rc->kv_dtype), c->head_dim);
        return ST_EUNSUPPORTED;
    }
    if (c->head_dim > KN_ATTN_MAX_HEAD_DIM || c->n_heads / c->n_kv_heads > KN_ATTN_MAX_GROUP) {
        snprintf(err, errlen, "cuda: head_dim %d / GQA group %d beyond the kernels' %d / %d",
                 c->head_dim, c->n_heads / c->n_kv_heads, KN_ATTN_MAX_HEAD_DIM, KN_ATTN_MAX_GROUP);
        return ST_EUNSUPPORTED;
    }
    if (rc->kv_mass && rc->kv_dtype != MDL_KV_BF16 && rc->kv_dtype != MDL_KV_F16) {
        snprintf(err, errlen, "cuda: attention-score eviction (h2o, snapkv) needs an f16 or bf16 "
                 "KV cache, not %s (a compaction moves single tokens; quantized blocks share "
                 "their scales)", mdl_kv_dtype_name(rc->kv_dtype));
        return ST_EUNSUPPORTED;
    }
    st = mdl_tp_shard(c, rc->tp_size, 0, &sh, err, errlen);
    if (st != ST_OK) {
        return st;
    }

    s = xcalloc(1, sizeof(*s));
    s->m = m;
    s->c = *c;
    s->rc = *rc;
    s->tp = rc->tp_size;
    s->dt = rc->kv_dtype == MDL_KV_F16 ? KN_DT_F16 : KN_DT_BF16;
    s->err = err;
    s->errlen = errlen;
    s->ranks = xcalloc((size_t)s->tp, sizeof(*s->ranks));
    for (int32_t r = 0; r < s->tp; r++) {
        s->ranks[r].dev = r;
    }
    if (s->tp > 1) {
        ncclComm_t *comms = xcalloc((size_t)s->tp, sizeof(*comms));
        int *devs = xcalloc((size_t)s->tp, sizeof(int));
        ncclResult_t ne;

        for (int32_t r = 0; r < s->tp; r++) {
            devs[r] = r;
        }
        ne = ncclCommInitAll(comms, s->tp, devs);
        if (ne == ncclSuccess) {
            for (int32_t r = 0; r < s->tp; r++) {
                s->ranks[r].nccl = comms[r];
            }
        }
        free(comms);
        free(devs);
        if (ne != ncclSuccess) {
            snprintf(err, errlen, "cuda: ncclCommInitAll over %d devices: %s", s->tp,
                     ncclGetErrorString(ne));
            st = ST_ENCCL;
            goto fail;
        }
    }
    st = kn_ranks_create(s->tp, &s->threads);
    if (st != ST_OK) {
        snprintf(err, errlen, "cuda: cannot start %d rank threads: %s", s->tp, st_str(st));
        goto fail;
    }
    err[0] = '\0';
    st = kn_ranks_run(s->threads, cu_rank_init, s);
    if (st != ST_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "cuda: device setup failed: %s (see the log)", st_str(st));
        }
        goto fail;
    }
    s->err = NULL;
    *state = s;
    return ST_OK;

fail:
    s->err = NULL;
    cu_destroy(s);
    return st;
}

static int
cu_rank_kv_ops(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];

    CU_CHECK(cudaSetDevice(rk->dev));
    return mdl_dev_rank_kv_ops(&rk->fw, s->ops, s->n_ops);
}

static int
cu_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    cu_state_t *s = state;

    s->ops = ops;
    s->n_ops = n_ops;
    return kn_ranks_run(s->threads, cu_rank_kv_ops, s);
}

static int
cu_rank_forward(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];

    CU_CHECK(cudaSetDevice(rk->dev));
    return mdl_dev_rank_forward(&rk->fw, s->b);
}

static int
cu_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    cu_state_t *s = state;
    int rc;

    s->b = b;
    rc = kn_ranks_run(s->threads, cu_rank_forward, s);
    s->b = NULL;
    if (rc != ST_OK) {
        return rc;
    }
    *logits = s->ranks[0].fw.logits_host;
    return ST_OK;
}

typedef struct cu_mass_job {
    const int32_t *slots;
    int32_t n;
    float *out;
} cu_mass_job_t;

static int
cu_rank_kv_mass(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];
    const cu_mass_job_t *j = s->mass_job;

    CU_CHECK(cudaSetDevice(rk->dev));
    return mdl_dev_rank_kv_mass(&rk->fw, j->slots, j->n, j->out, s->c.n_kv_heads);
}

/* Every rank writes its KV heads' columns (model/dev_mass.c). */
static int
cu_kv_mass(void *state, const int32_t *slots, int32_t n, float *out)
{
    cu_state_t *s = state;
    cu_mass_job_t j = {slots, n, out};
    int rc;

    s->mass_job = &j;
    rc = kn_ranks_run(s->threads, cu_rank_kv_mass, s);
    s->mass_job = NULL;
    return rc;
}

int
mdl_cuda_device_memory(int32_t n_devices, size_t *total_bytes, size_t *in_use_bytes, char *err,
                       size_t errlen)
{
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);

    *total_bytes = 0;
    if (e != cudaSuccess || n_dev == 0) {
        snprintf(err, errlen, "cuda: no CUDA device (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorName(e) : "0 devices");
        return ST_ENODEV;
    }
    if (n_dev < n_devices) {
        snprintf(err, errlen, "cuda: tensor parallel size %d needs %d devices, found %d",
                 n_devices, n_devices, n_dev);
        return ST_ENODEV;
    }
    for (int32_t d = 0; d < n_devices; d++) {
        size_t free_b = 0, total_b = 0;

        e = cudaSetDevice(d);
        if (e == cudaSuccess) {
            e = cudaMemGetInfo(&free_b, &total_b);
        }
        if (e != cudaSuccess) {
            snprintf(err, errlen, "cuda: device %d: cudaMemGetInfo: %s", d, cudaGetErrorName(e));
            return ST_ENODEV;
        }
        LOG_INFO("device %d: %zu MiB total, %zu MiB free", d, total_b >> 20, free_b >> 20);
        if (d == 0 || total_b < *total_bytes) {
            *total_bytes = total_b;
        }
        /* cudaMemGetInfo made this process's context on d: what is in use
         * now is that context and whatever other processes hold. */
        if (in_use_bytes != NULL && total_b - free_b > *in_use_bytes) {
            *in_use_bytes = total_b - free_b;
        }
    }
    if (cudaSetDevice(0) != cudaSuccess) {
        snprintf(err, errlen, "cuda: cudaSetDevice(0) failed");
        return ST_ENODEV;
    }
    return ST_OK;
}

const mdl_backend_t mdl_backend_cuda = {
    .name = "cuda",
    .create = cu_create,
    .destroy = cu_destroy,
    .kv_ops = cu_kv_ops,
    .forward = cu_forward,
    .kv_drop_ops = 1, /* quantized KV: a dropped partial block gives its residual slot back */
    .kv_shift_ops = 1,
    .kv_mass = cu_kv_mass,
};
