/* backend_cuda.c - the CUDA backend: weights in bf16/f16 on one or more
 * GPUs, the paged KV pool in device memory, the swap tier in pinned host
 * memory, kernels from kernels/cuda/, GEMMs through cuBLAS (16-bit inputs,
 * f32 accumulation and output) and tensor parallelism over NCCL
 * (DESIGN.md section 6, the split of model/tp.h). Built only with
 * -Dcuda=enabled; registered in runtime.c under KVSERVE_HAVE_CUDA.
 *
 * DESIGN. One rank per device, one thread per rank (kn_ranks_t from
 * kernels/comm.h: the engine thread is rank 0 and drives device 0; each
 * other rank's thread owns its device, so only the owning thread calls
 * CUDA on a device). A step is broadcast by handing the batch (host
 * memory) to every rank; each rank uploads it with one cudaMemcpyAsync
 * from its pinned staging buffer and runs the same layer loop as
 * model/forward_tp.c on its stream:
 *
 *   x = embed(tokens)                                   (T, dim) f32
 *   per layer:
 *     h16 = rmsnorm(x)
 *     q, k, v = h16 Wq_r^T, h16 Wk_r^T, h16 Wv_r^T      cuBLAS, f32 out (+ bias)
 *     rope(q, k); kv_write(k, v -> cache via slot_mapping)
 *     a16 = paged_attention(q, cache, block_tables)
 *     p = a16 Wo_r^T; ncclAllReduce(p, sum); x += p
 *     h16 = rmsnorm(x); g16 = silu(h16 Wg_r^T) * h16 Wu_r^T
 *     p = g16 Wd_r^T; ncclAllReduce(p, sum); x += p
 *   rank 0: logits = rmsnorm(x[logits_rows]) lm_head^T -> pinned host
 *
 * Memory, per device, all allocated in create(): weights (bf16, or f16
 * with --kv-cache-dtype f16), activations for max_num_batched_tokens rows,
 * the cuBLAS workspace, then the KV pool of num_blocks blocks, which must
 * fit in gpu_memory_utilization * total minus what is already in use
 * (cudaMemGetInfo after the other allocations): ST_ENOMEM with the number
 * of blocks that would fit otherwise. forward() and kv_ops() allocate
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
#include "kernels/cuda/kn_kvcopy.h"
#include "model/backend.h"
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

typedef struct cu_layer {
    uint16_t *attn_norm, *ffn_norm; /* (dim) */
    uint16_t *wq;                   /* (n_q * hd, dim) */
    uint16_t *wk, *wv;              /* (n_kv * hd, dim) */
    uint16_t *bq, *bk, *bv;         /* or NULL */
    uint16_t *wo;                   /* (dim, n_q * hd) columns of this rank */
    uint16_t *w_gate, *w_up;        /* (n_f, dim) */
    uint16_t *w_down;               /* (dim, n_f) columns of this rank */
} cu_layer_t;

typedef struct cu_rank {
    int dev;
    mdl_tp_shard_t sh;
    cudaStream_t stream;
    cublasHandle_t blas;
    ncclComm_t nccl;    /* NULL at T = 1 */
    cu_layer_t *layers; /* [n_layers], device pointers */
    uint16_t *embd;     /* (vocab, dim) */
    uint16_t *out_norm; /* (dim) */
    uint16_t *lm_head;  /* (vocab, dim), rank 0 only */
    float *inv_freq;    /* (hd / 2) */
    void *workspace;    /* cuBLAS, CU_WORKSPACE bytes */
    /* KV: [n_layers][2][num_blocks][blk_bytes] device, same shape with
     * swap_blocks in pinned host memory. */
    size_t blk_bytes;
    uint8_t *kv;
    uint8_t *swap;
    kn_kvcopy_t *plan; /* kv_ops scratch, host */
    /* Activations, device, rows = max_num_batched_tokens (T). */
    float *x, *part;    /* (T, dim) */
    float *q;           /* (T, n_q * hd) */
    float *k, *v;       /* (T, n_kv * hd) */
    float *gate, *up;   /* (T, n_f) */
    uint16_t *h16;      /* (T, max(dim, n_f, n_q * hd)) GEMM input */
    float *hrows;       /* (S, dim) */
    float *logits_dev;  /* (S, vocab), rank 0 */
    float *logits_host; /* (S, vocab), pinned, rank 0 */
    /* Batch staging: pinned host and its device twin, int32 each. */
    int32_t *stage_host, *stage_dev;
    size_t stage_len; /* int32 entries */
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
    char *err; /* create() only */
    size_t errlen;
} cu_state_t;

static cudaDataType_t
cu_dtype(kn_dt_t dt)
{
    return dt == KN_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* Uploads rows [r0, r0 + nr) x columns [c0, c0 + nc) of a host f32
 * (rows, cols) matrix as a 16-bit (nr, nc) device matrix. */
static int
cu_upload(const float *w, int32_t cols, int32_t r0, int32_t nr, int32_t c0, int32_t nc, kn_dt_t dt,
          uint16_t **out)
{
    size_t n = (size_t)nr * nc;
    uint16_t *tmp = xmalloc(sizeof(uint16_t) * n);
    cudaError_t e;

    for (int32_t i = 0; i < nr; i++) {
        for (int32_t j = 0; j < nc; j++) {
            kn_st16(tmp, (size_t)i * nc + j, w[(size_t)(r0 + i) * cols + c0 + j], dt);
        }
    }
    e = cudaMalloc((void **)out, sizeof(uint16_t) * n);
    if (e == cudaSuccess) {
        e = cudaMemcpy(*out, tmp, sizeof(uint16_t) * n, cudaMemcpyHostToDevice);
    }
    free(tmp);
    if (e != cudaSuccess) {
        LOG_ERROR("uploading a %dx%d weight: %s (%s)", nr, nc, cudaGetErrorName(e),
                  cudaGetErrorString(e));
        return ST_ECUDA;
    }
    return ST_OK;
}

/* y (n_tok, d_out) f32 = x (n_tok, d_in) 16-bit @ w^T, w (d_out, d_in)
 * 16-bit, all row-major device memory; beta 0 or 1 (accumulate). In
 * cuBLAS's column-major terms: y^T = w x^T. */
static int
cu_gemm(cu_state_t *s, cu_rank_t *rk, const uint16_t *x, const uint16_t *w, float *y, int32_t n_tok,
        int32_t d_in, int32_t d_out, float beta)
{
    const float alpha = 1.0f;
    cudaDataType_t t = cu_dtype(s->dt);

    BLAS_CHECK(cublasGemmEx(rk->blas, CUBLAS_OP_T, CUBLAS_OP_N, d_out, n_tok, d_in, &alpha, w, t,
                            d_in, x, t, d_in, &beta, y, CUDA_R_32F, d_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    return ST_OK;
}

static int
cu_rank_free(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];

    if (cudaSetDevice(rk->dev) != cudaSuccess) {
        return ST_OK;
    }
    if (rk->layers != NULL) {
        for (int32_t l = 0; l < s->c.n_layers; l++) {
            cu_layer_t *L = &rk->layers[l];
            void *ps[] = {L->attn_norm, L->ffn_norm, L->wq, L->wk,     L->wv,   L->bq,
                          L->bk,        L->bv,       L->wo, L->w_gate, L->w_up, L->w_down};

            for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
                cudaFree(ps[i]);
            }
        }
    }
    free(rk->layers);
    void *dev[] = {rk->embd, rk->out_norm, rk->lm_head, rk->inv_freq,   rk->workspace, rk->kv,
                   rk->x,    rk->part,     rk->q,       rk->k,          rk->v,         rk->gate,
                   rk->up,   rk->h16,      rk->hrows,   rk->logits_dev, rk->stage_dev};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
        cudaFree(dev[i]);
    }
    cudaFreeHost(rk->swap);
    cudaFreeHost(rk->logits_host);
    cudaFreeHost(rk->stage_host);
    free(rk->plan);
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

/* Everything of one rank but NCCL, on the rank's own thread. */
static int
cu_rank_init(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    const mdl_runtime_config_t *rc = &s->rc;
    const mdl_tp_shard_t *sh = &rk->sh;
    int32_t hd = c->head_dim, qd = c->n_heads * hd, dim = c->dim;
    size_t T = (size_t)rc->max_num_batched_tokens, S = (size_t)rc->max_num_seqs;
    size_t lq = (size_t)sh->n_q * hd, lkv = (size_t)sh->n_kv * hd;
    size_t free_b, total_b, kv_bytes, budget, in_use;
    int st;

    CU_CHECK(cudaSetDevice(rk->dev));
    CU_CHECK(cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking));
    BLAS_CHECK(cublasCreate(&rk->blas));
    BLAS_CHECK(cublasSetStream(rk->blas, rk->stream));
    CU_CHECK(cudaMalloc(&rk->workspace, CU_WORKSPACE));
    BLAS_CHECK(cublasSetWorkspace(rk->blas, rk->workspace, CU_WORKSPACE));

    /* Weights. */
    rk->layers = xcalloc((size_t)c->n_layers, sizeof(*rk->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        cu_layer_t *D = &rk->layers[l];
        int32_t q0 = sh->q0 * hd, kv0 = sh->kv0 * hd;

        if ((st = cu_upload(L->attn_norm, dim, 0, 1, 0, dim, s->dt, &D->attn_norm)) != ST_OK ||
            (st = cu_upload(L->ffn_norm, dim, 0, 1, 0, dim, s->dt, &D->ffn_norm)) != ST_OK ||
            (st = cu_upload(L->wq, dim, q0, (int32_t)lq, 0, dim, s->dt, &D->wq)) != ST_OK ||
            (st = cu_upload(L->wk, dim, kv0, (int32_t)lkv, 0, dim, s->dt, &D->wk)) != ST_OK ||
            (st = cu_upload(L->wv, dim, kv0, (int32_t)lkv, 0, dim, s->dt, &D->wv)) != ST_OK ||
            (st = cu_upload(L->wo, qd, 0, dim, q0, (int32_t)lq, s->dt, &D->wo)) != ST_OK ||
            (st = cu_upload(L->w_gate, dim, sh->f0, sh->n_f, 0, dim, s->dt, &D->w_gate)) != ST_OK ||
            (st = cu_upload(L->w_up, dim, sh->f0, sh->n_f, 0, dim, s->dt, &D->w_up)) != ST_OK ||
            (st = cu_upload(L->w_down, c->ffn_dim, 0, dim, sh->f0, sh->n_f, s->dt, &D->w_down)) !=
                ST_OK) {
            return st;
        }
        if (L->bq != NULL &&
            ((st = cu_upload(L->bq, 0, 0, 1, q0, (int32_t)lq, s->dt, &D->bq)) != ST_OK ||
             (st = cu_upload(L->bk, 0, 0, 1, kv0, (int32_t)lkv, s->dt, &D->bk)) != ST_OK ||
             (st = cu_upload(L->bv, 0, 0, 1, kv0, (int32_t)lkv, s->dt, &D->bv)) != ST_OK)) {
            return st;
        }
    }
    if ((st = cu_upload(m->tok_embd, dim, 0, c->vocab_size, 0, dim, s->dt, &rk->embd)) != ST_OK ||
        (st = cu_upload(m->out_norm, dim, 0, 1, 0, dim, s->dt, &rk->out_norm)) != ST_OK) {
        return st;
    }
    if (r == 0 &&
        (st = cu_upload(m->lm_head, dim, 0, c->vocab_size, 0, dim, s->dt, &rk->lm_head)) != ST_OK) {
        return st;
    }

    /* RoPE frequencies (the CPU table, uploaded). */
    {
        float inv[KN_ATTN_MAX_HEAD_DIM / 2];
        kn_rope_params_t rp = {
            .head_dim = hd,
            .theta = c->rope_theta > 0.0f ? c->rope_theta : 10000.0f,
            .scaling = c->rope_scaling == MDL_ROPE_LINEAR   ? KN_ROPE_LINEAR
                       : c->rope_scaling == MDL_ROPE_LLAMA3 ? KN_ROPE_LLAMA3
                                                            : KN_ROPE_NONE,
            .factor = c->rope_factor,
            .low_freq_factor = c->rope_low_freq_factor,
            .high_freq_factor = c->rope_high_freq_factor,
            .orig_max_pos = c->rope_orig_max_pos,
        };

        kn_cpu_rope_inv_freq(&rp, inv);
        CU_CHECK(cudaMalloc((void **)&rk->inv_freq, sizeof(float) * (size_t)(hd / 2)));
        CU_CHECK(cudaMemcpy(rk->inv_freq, inv, sizeof(float) * (size_t)(hd / 2),
                            cudaMemcpyHostToDevice));
    }

    /* Activations for the largest step. */
    size_t h16_cols = (size_t)dim;
    if ((size_t)sh->n_f > h16_cols) {
        h16_cols = (size_t)sh->n_f;
    }
    if (lq > h16_cols) {
        h16_cols = lq;
    }
    CU_CHECK(cudaMalloc((void **)&rk->x, sizeof(float) * T * dim));
    CU_CHECK(cudaMalloc((void **)&rk->part, sizeof(float) * T * dim));
    CU_CHECK(cudaMalloc((void **)&rk->q, sizeof(float) * T * lq));
    CU_CHECK(cudaMalloc((void **)&rk->k, sizeof(float) * T * lkv));
    CU_CHECK(cudaMalloc((void **)&rk->v, sizeof(float) * T * lkv));
    CU_CHECK(cudaMalloc((void **)&rk->gate, sizeof(float) * T * (size_t)sh->n_f));
    CU_CHECK(cudaMalloc((void **)&rk->up, sizeof(float) * T * (size_t)sh->n_f));
    CU_CHECK(cudaMalloc((void **)&rk->h16, sizeof(uint16_t) * T * h16_cols));
    CU_CHECK(cudaMalloc((void **)&rk->hrows, sizeof(float) * S * dim));
    rk->stage_len = 4 * T + 3 * S + 1 + S * (size_t)rc->max_blocks_per_seq;
    CU_CHECK(cudaMalloc((void **)&rk->stage_dev, sizeof(int32_t) * rk->stage_len));
    CU_CHECK(cudaHostAlloc((void **)&rk->stage_host, sizeof(int32_t) * rk->stage_len,
                           cudaHostAllocDefault));
    if (r == 0) {
        CU_CHECK(cudaMalloc((void **)&rk->logits_dev, sizeof(float) * S * c->vocab_size));
        CU_CHECK(cudaHostAlloc((void **)&rk->logits_host, sizeof(float) * S * c->vocab_size,
                               cudaHostAllocDefault));
    }

    /* The KV pool from what --gpu-memory-utilization leaves. */
    rk->blk_bytes = sizeof(uint16_t) * lkv * (size_t)rc->block_size;
    kv_bytes = 2 * (size_t)c->n_layers * (size_t)rc->num_blocks * rk->blk_bytes;
    CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
    in_use = total_b - free_b;
    budget = (size_t)((double)total_b * rc->gpu_memory_utilization);
    budget = budget > in_use ? budget - in_use : 0;
    if (kv_bytes > budget) {
        size_t per_block = 2 * (size_t)c->n_layers * rk->blk_bytes;

        if (r != 0) { /* rank 0 writes err; the others only log */
            LOG_ERROR("device %d: a KV pool of %d blocks does not fit (%zu of %zu MiB)", rk->dev,
                      rc->num_blocks, kv_bytes >> 20, budget >> 20);
            return ST_ENOMEM;
        }
        snprintf(s->err, s->errlen,
                 "device %d: a KV pool of %d blocks needs %zu MiB but --gpu-memory-utilization "
                 "%.2f leaves %zu MiB after weights and activations (%zu blocks)",
                 rk->dev, rc->num_blocks, kv_bytes >> 20, (double)rc->gpu_memory_utilization,
                 budget >> 20, budget / per_block);
        return ST_ENOMEM;
    }
    CU_CHECK(cudaMalloc((void **)&rk->kv, kv_bytes));
    CU_CHECK(cudaMemsetAsync(rk->kv, 0, kv_bytes, rk->stream));
    if (rc->swap_blocks > 0) {
        CU_CHECK(cudaHostAlloc((void **)&rk->swap,
                               2 * (size_t)c->n_layers * (size_t)rc->swap_blocks * rk->blk_bytes,
                               cudaHostAllocDefault));
    }
    rk->plan = xmalloc(sizeof(*rk->plan) * 2 * (size_t)c->n_layers *
                       (size_t)(rc->num_blocks + rc->swap_blocks));
    CU_CHECK(cudaStreamSynchronize(rk->stream));
    LOG_INFO("device %d: rank %d of %d, %d query heads, %d KV heads, KV pool %zu MiB, "
             "%zu MiB in use before it",
             rk->dev, r, s->tp, sh->n_q, sh->n_kv, kv_bytes >> 20, in_use >> 20);
    return ST_OK;
}

static int
cu_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, void **state, char *err,
          size_t errlen)
{
    const mdl_config_t *c = &m->cfg;
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
    if (rc->kv_dtype != MDL_KV_BF16 && rc->kv_dtype != MDL_KV_F16) {
        snprintf(err, errlen, "cuda: the KV cache is bf16 or f16");
        return ST_EUNSUPPORTED;
    }
    if (c->head_dim > KN_ATTN_MAX_HEAD_DIM || c->n_heads / c->n_kv_heads > KN_ATTN_MAX_GROUP) {
        snprintf(err, errlen, "cuda: head_dim %d / GQA group %d beyond the kernels' %d / %d",
                 c->head_dim, c->n_heads / c->n_kv_heads, KN_ATTN_MAX_HEAD_DIM, KN_ATTN_MAX_GROUP);
        return ST_EUNSUPPORTED;
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
        st = mdl_tp_shard(c, s->tp, r, &s->ranks[r].sh, err, errlen);
        if (st != ST_OK) {
            goto fail;
        }
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
    int32_t n = kn_kvcopy_plan(s->ops, s->n_ops, s->c.n_layers, s->rc.num_blocks, s->rc.swap_blocks,
                               rk->blk_bytes, rk->plan);

    CU_CHECK(cudaSetDevice(rk->dev));
    for (int32_t i = 0; i < n; i++) {
        const kn_kvcopy_t *p = &rk->plan[i];
        uint8_t *src = p->kind == KV_OP_SWAP_IN ? rk->swap : rk->kv;
        uint8_t *dst = p->kind == KV_OP_SWAP_OUT ? rk->swap : rk->kv;
        enum cudaMemcpyKind k = p->kind == KV_OP_COPY       ? cudaMemcpyDeviceToDevice
                                : p->kind == KV_OP_SWAP_OUT ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyHostToDevice;

        if (src == NULL || dst == NULL) {
            return ST_EINVAL; /* swap op without a swap tier */
        }
        CU_CHECK(cudaMemcpyAsync(dst + p->dst_off, src + p->src_off, p->bytes, k, rk->stream));
    }
    CU_CHECK(cudaStreamSynchronize(rk->stream));
    return ST_OK;
}

static int
cu_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    cu_state_t *s = state;

    if (ops != NULL && n_ops > s->rc.num_blocks + s->rc.swap_blocks) {
        /* The plan buffer holds one range per op, layer and kind; split. */
        int32_t half = n_ops / 2;
        int rc = cu_kv_ops(state, ops, half);

        return rc != ST_OK ? rc : cu_kv_ops(state, ops + half, n_ops - half);
    }
    s->ops = ops;
    s->n_ops = n_ops;
    return kn_ranks_run(s->threads, cu_rank_kv_ops, s);
}

static int
cu_rank_forward(void *arg, int r)
{
    cu_state_t *s = arg;
    cu_rank_t *rk = &s->ranks[r];
    const mdl_batch_t *b = s->b;
    const mdl_config_t *c = &s->c;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t T = b->n_tokens, dim = c->dim, hd = c->head_dim, S = b->n_seqs;
    const int32_t lq = sh->n_q * hd, lkv = sh->n_kv * hd;
    const kn_dt_t dt = s->dt;
    cudaStream_t st = rk->stream;
    int rc;

    CU_CHECK(cudaSetDevice(rk->dev));

    /* Upload the batch: one pinned copy. */
    int32_t *h = rk->stage_host;
    size_t o_tok = 0, o_pos = o_tok + T, o_slot = o_pos + T, o_qs = o_slot + T,
           o_ctx = o_qs + S + 1, o_rows = o_ctx + S,
           o_bt = o_rows + (b->n_logits > 0 ? b->n_logits : 0),
           n_int = o_bt + (size_t)S * b->max_blocks;
    memcpy(h + o_tok, b->tokens, sizeof(int32_t) * T);
    memcpy(h + o_pos, b->positions, sizeof(int32_t) * T);
    memcpy(h + o_slot, b->slot_mapping, sizeof(int32_t) * T);
    memcpy(h + o_qs, b->query_start, sizeof(int32_t) * (S + 1));
    memcpy(h + o_ctx, b->context_len, sizeof(int32_t) * S);
    if (b->n_logits > 0) {
        memcpy(h + o_rows, b->logits_rows, sizeof(int32_t) * b->n_logits);
    }
    memcpy(h + o_bt, b->block_tables, sizeof(int32_t) * (size_t)S * b->max_blocks);
    CU_CHECK(
        cudaMemcpyAsync(rk->stage_dev, h, sizeof(int32_t) * n_int, cudaMemcpyHostToDevice, st));
    const int32_t *d = rk->stage_dev;

    kn_embed_args_t ea = {rk->embd, d + o_tok, rk->x, dim, dt};
    CU_CHECK(kn_cuda_embed(st, &ea, T));

    for (int32_t l = 0; l < c->n_layers; l++) {
        const cu_layer_t *L = &rk->layers[l];
        uint8_t *kc = rk->kv + ((size_t)l * 2 + 0) * (size_t)s->rc.num_blocks * rk->blk_bytes;
        uint8_t *vc = rk->kv + ((size_t)l * 2 + 1) * (size_t)s->rc.num_blocks * rk->blk_bytes;
        kn_rmsnorm_args_t na = {rk->x, L->attn_norm, rk->h16, dim, dim, c->norm_eps, dt};

        CU_CHECK(kn_cuda_rmsnorm(st, &na, T));
        if ((rc = cu_gemm(s, rk, rk->h16, L->wq, rk->q, T, dim, lq, 0.0f)) != ST_OK ||
            (rc = cu_gemm(s, rk, rk->h16, L->wk, rk->k, T, dim, lkv, 0.0f)) != ST_OK ||
            (rc = cu_gemm(s, rk, rk->h16, L->wv, rk->v, T, dim, lkv, 0.0f)) != ST_OK) {
            return rc;
        }
        if (L->bq != NULL) {
            kn_bias_args_t bq = {rk->q, L->bq, lq, lq, dt}, bk = {rk->k, L->bk, lkv, lkv, dt},
                           bv = {rk->v, L->bv, lkv, lkv, dt};

            CU_CHECK(kn_cuda_bias(st, &bq, T));
            CU_CHECK(kn_cuda_bias(st, &bk, T));
            CU_CHECK(kn_cuda_bias(st, &bv, T));
        }
        kn_rope_args_t rq = {rk->q, d + o_pos, rk->inv_freq, sh->n_q, hd, lq};
        kn_rope_args_t rkk = {rk->k, d + o_pos, rk->inv_freq, sh->n_kv, hd, lkv};
        CU_CHECK(kn_cuda_rope(st, &rq, T));
        CU_CHECK(kn_cuda_rope(st, &rkk, T));
        kn_kv_write_args_t kw = {(uint16_t *)kc,
                                 (uint16_t *)vc,
                                 rk->k,
                                 rk->v,
                                 d + o_slot,
                                 sh->n_kv,
                                 hd,
                                 s->rc.block_size,
                                 lkv,
                                 dt};
        CU_CHECK(kn_cuda_kv_write(st, &kw, T));
        kn_attn_cuda_args_t aa = {
            rk->h16,
            rk->q,
            (const uint16_t *)kc,
            (const uint16_t *)vc,
            d + o_qs,
            d + o_ctx,
            d + o_bt,
            b->max_blocks,
            S,
            sh->n_q,
            sh->n_kv,
            hd,
            s->rc.block_size,
            c->sliding_window,
            lq,
            1.0f / sqrtf((float)hd),
            dt,
        };
        CU_CHECK(kn_cuda_attention(st, &aa, T));
        if ((rc = cu_gemm(s, rk, rk->h16, L->wo, rk->part, T, lq, dim, 0.0f)) != ST_OK) {
            return rc;
        }
        if (rk->nccl != NULL) {
            NCCL_CHECK(ncclAllReduce(rk->part, rk->part, (size_t)T * dim, ncclFloat, ncclSum,
                                     rk->nccl, st));
        }
        kn_add_args_t ad = {rk->x, rk->part, (int64_t)T * dim};
        CU_CHECK(kn_cuda_add(st, &ad));

        kn_rmsnorm_args_t fa = {rk->x, L->ffn_norm, rk->h16, dim, dim, c->norm_eps, dt};
        CU_CHECK(kn_cuda_rmsnorm(st, &fa, T));
        if ((rc = cu_gemm(s, rk, rk->h16, L->w_gate, rk->gate, T, dim, sh->n_f, 0.0f)) != ST_OK ||
            (rc = cu_gemm(s, rk, rk->h16, L->w_up, rk->up, T, dim, sh->n_f, 0.0f)) != ST_OK) {
            return rc;
        }
        kn_silu_mul_args_t sm = {rk->gate, rk->up, rk->h16, sh->n_f, sh->n_f, dt};
        CU_CHECK(kn_cuda_silu_mul(st, &sm, T));
        if ((rc = cu_gemm(s, rk, rk->h16, L->w_down, rk->part, T, sh->n_f, dim, 0.0f)) != ST_OK) {
            return rc;
        }
        if (rk->nccl != NULL) {
            NCCL_CHECK(ncclAllReduce(rk->part, rk->part, (size_t)T * dim, ncclFloat, ncclSum,
                                     rk->nccl, st));
        }
        CU_CHECK(kn_cuda_add(st, &ad));
    }

    if (r == 0 && b->n_logits > 0) {
        kn_gather_args_t ga = {rk->x, d + o_rows, rk->hrows, dim};
        kn_rmsnorm_args_t on = {rk->hrows, rk->out_norm, rk->h16, dim, dim, c->norm_eps, dt};

        CU_CHECK(kn_cuda_gather(st, &ga, b->n_logits));
        CU_CHECK(kn_cuda_rmsnorm(st, &on, b->n_logits));
        if ((rc = cu_gemm(s, rk, rk->h16, rk->lm_head, rk->logits_dev, b->n_logits, dim,
                          c->vocab_size, 0.0f)) != ST_OK) {
            return rc;
        }
        CU_CHECK(cudaMemcpyAsync(rk->logits_host, rk->logits_dev,
                                 sizeof(float) * (size_t)b->n_logits * c->vocab_size,
                                 cudaMemcpyDeviceToHost, st));
    }
    CU_CHECK(cudaStreamSynchronize(st));
    return ST_OK;
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
    *logits = s->ranks[0].logits_host;
    return ST_OK;
}

const mdl_backend_t mdl_backend_cuda = {
    .name = "cuda",
    .create = cu_create,
    .destroy = cu_destroy,
    .kv_ops = cu_kv_ops,
    .forward = cu_forward,
};
