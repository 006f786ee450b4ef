/* forward_tp.c - tensor parallelism on the CPU backend: T ranks, one
 * thread each, over weight shards, meeting in a shared-memory all-reduce
 * (kernels/comm.h). The runtime picks this backend for --device cpu with
 * --tensor-parallel-size > 1. The split is described in model/tp.h.
 *
 * DESIGN. Per rank and step (same kernels as forward_cpu.c):
 *
 *   x = embed(tokens)                                  (T, dim), every rank
 *   per layer:
 *     h = rmsnorm(x)
 *     q, k, v = h Wq_r^T, h Wk_r^T, h Wv_r^T           this rank's heads
 *     rope; KV cache_r[slot_mapping] = k, v            this rank's KV heads
 *     a = paged_attention(q, cache_r, block_tables)    (T, n_q * hd)
 *     p = a Wo_r^T;  all-reduce(p);  x += p            row-parallel + sum
 *     h = rmsnorm(x);  g = silu(h Wg_r^T) * h Wu_r^T   (T, n_f)
 *     p = g Wd_r^T;  all-reduce(p);  x += p
 *   rank 0: logits = rmsnorm(x[logits_rows]) lm_head^T
 *
 * Every rank ends each layer with the same x (the all-reduce result is
 * bitwise identical everywhere), so the replicated parts stay in step.
 * Column-parallel shards point into the model's weights (their rows are
 * contiguous); row-parallel shards (wo, w_down) are copied once at
 * creation. Each rank owns its KV pool and swap tier, holding its KV
 * heads' slice of every block (model/tp.h); kv_ops run on every rank.
 * The engine thread is rank 0; it broadcasts the step by handing the
 * batch (read-only host memory) to kn_ranks_run(). Nothing is allocated
 * in forward() or kv_ops().
 *
 * KV dtypes: the pool of a rank is model/host_kv.h for its n_kv heads, in
 * f32 or in the compressed KIVI layout (kernels/cpu/kv_quant.h). A
 * quantization group never spans KV heads (keys per channel over a block's
 * tokens, values per token over head_dim), so rank r's store holds the
 * codes and f16 scales of its heads, with its own residual slots (every
 * rank sees the same writes, so the slots follow the same blocks), and
 * COPY / SWAP / DROP / SHIFT (the sink + rolling-window policy's
 * re-rotation, model/kv_policy.h) run on every rank's slice of a block.
 */
#define LOG_MODULE "cpu-tp"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "kernels/cpu/kn_cpu.h"
#include "model/backend.h"
#include "model/host_kv.h"
#include "model/model_int.h"
#include "model/tp.h"

int
mdl_tp_shard(const mdl_config_t *c, int32_t tp, int32_t rank, mdl_tp_shard_t *out, char *err,
             size_t errlen)
{
    int32_t group;

    if (tp < 1 || rank < 0 || rank >= tp) {
        snprintf(err, errlen, "bad tensor-parallel rank %d of %d", rank, tp);
        return ST_EINVAL;
    }
    if (c->n_heads % tp != 0 || c->ffn_dim % tp != 0 ||
        (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0)) {
        snprintf(err, errlen,
                 "tensor parallel size %d does not divide the model (%d heads, %d KV heads, "
                 "FFN %d)",
                 tp, c->n_heads, c->n_kv_heads, c->ffn_dim);
        return ST_EUNSUPPORTED;
    }
    group = c->n_heads / c->n_kv_heads;
    out->n_q = c->n_heads / tp;
    out->q0 = rank * out->n_q;
    if (c->n_kv_heads >= tp) {
        out->n_kv = c->n_kv_heads / tp;
        out->kv0 = rank * out->n_kv;
    } else {
        out->n_kv = 1; /* replicated: the KV head of this rank's query heads */
        out->kv0 = out->q0 / group;
    }
    out->n_f = c->ffn_dim / tp;
    out->f0 = rank * out->n_f;
    return ST_OK;
}

typedef struct tp_layer {
    const float *wq, *wk, *wv;  /* rows of the model's weights */
    const float *bq, *bk, *bv;  /* or NULL */
    float *wo;                  /* [dim][n_q * hd] owned copy */
    const float *w_gate, *w_up; /* rows [f0, f0 + n_f) */
    float *w_down;              /* [dim][n_f] owned copy */
} tp_layer_t;

typedef struct tp_rank {
    mdl_tp_shard_t sh;
    tp_layer_t *layers; /* [n_layers] */
    host_kv_t kv;       /* this rank's KV heads, both tiers */
    /* Scratch, rows = max_num_batched_tokens (T). */
    float *x, *h;         /* (T, dim) */
    float *q, *att;       /* (T, n_q * hd) */
    float *k, *v;         /* (T, n_kv * hd) */
    float *gate, *up;     /* (T, n_f) */
    float *part;          /* (T, dim) row-parallel partial product */
    float *cos_t, *sin_t; /* (T, hd / 2) */
    void *scratch;
} tp_rank_t;

typedef struct tp_state {
    const mdl_model_t *m;
    mdl_config_t c;
    mdl_runtime_config_t rc;
    int32_t tp;
    tp_rank_t *ranks; /* [tp] */
    kn_comm_t *comm;
    kn_ranks_t *threads;
    float *inv_freq; /* (hd / 2) */
    float *hrows;    /* (max_num_seqs, dim), rank 0 */
    float *logits;   /* (max_num_seqs, vocab), rank 0 */
    /* The current call, read by every rank. */
    const mdl_batch_t *b;
    const kv_op_t *ops;
    int32_t n_ops;
} tp_state_t;

static void
tp_destroy(void *state)
{
    tp_state_t *s = state;

    if (s == NULL) {
        return;
    }
    kn_ranks_destroy(s->threads);
    kn_comm_destroy(s->comm);
    for (int32_t r = 0; s->ranks != NULL && r < s->tp; r++) {
        tp_rank_t *rk = &s->ranks[r];

        for (int32_t l = 0; rk->layers != NULL && l < s->c.n_layers; l++) {
            free(rk->layers[l].wo);
            free(rk->layers[l].w_down);
        }
        free(rk->layers);
        host_kv_destroy(&rk->kv);
        free(rk->scratch);
    }
    free(s->ranks);
    free(s->inv_freq);
    free(s->hrows);
    free(s->logits);
    free(s);
}

/* Columns [c0, c0 + n) of a row-major (rows, cols) matrix, copied. */
static float *
tp_cols(const float *w, int32_t rows, int32_t cols, int32_t c0, int32_t n)
{
    float *out = xmalloc(sizeof(float) * (size_t)rows * (size_t)n);

    for (int32_t i = 0; i < rows; i++) {
        memcpy(out + (size_t)i * n, w + (size_t)i * cols + c0, sizeof(float) * (size_t)n);
    }
    return out;
}

static int
tp_rank_init(tp_state_t *s, int32_t r, char *err, size_t errlen)
{
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    tp_rank_t *rk = &s->ranks[r];
    int32_t hd = c->head_dim, qd = c->n_heads * hd;
    size_t T = (size_t)s->rc.max_num_batched_tokens;
    int rc = mdl_tp_shard(c, s->tp, r, &rk->sh, err, errlen);

    if (rc != ST_OK) {
        return rc;
    }
    const mdl_tp_shard_t *sh = &rk->sh;

    rk->layers = xcalloc((size_t)c->n_layers, sizeof(*rk->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        tp_layer_t *tl = &rk->layers[l];
        size_t qoff = (size_t)sh->q0 * hd, kvoff = (size_t)sh->kv0 * hd;

        tl->wq = L->wq + qoff * c->dim;
        tl->wk = L->wk + kvoff * c->dim;
        tl->wv = L->wv + kvoff * c->dim;
        tl->bq = L->bq != NULL ? L->bq + qoff : NULL;
        tl->bk = L->bk != NULL ? L->bk + kvoff : NULL;
        tl->bv = L->bv != NULL ? L->bv + kvoff : NULL;
        tl->wo = tp_cols(L->wo, c->dim, qd, sh->q0 * hd, sh->n_q * hd);
        tl->w_gate = L->w_gate + (size_t)sh->f0 * c->dim;
        tl->w_up = L->w_up + (size_t)sh->f0 * c->dim;
        tl->w_down = tp_cols(L->w_down, c->dim, c->ffn_dim, sh->f0, sh->n_f);
    }

    char why[256];

    rc = host_kv_create(&rk->kv, c, sh->n_kv, &s->rc, why, sizeof(why));
    if (rc != ST_OK) {
        snprintf(err, errlen, "rank %d: %s", r, why);
        return rc;
    }

    size_t lq = (size_t)sh->n_q * hd, lkv = (size_t)sh->n_kv * hd, half = (size_t)hd / 2;
    size_t sizes[] = {T * c->dim,  T * c->dim,  T * lq,     T * lq,   T * lkv, T * lkv,
                      T * sh->n_f, T * sh->n_f, T * c->dim, T * half, T * half};
    float **ptrs[] = {&rk->x,    &rk->h,  &rk->q,    &rk->att,   &rk->k,    &rk->v,
                      &rk->gate, &rk->up, &rk->part, &rk->cos_t, &rk->sin_t};
    size_t total = 0;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    if (posix_memalign(&rk->scratch, 64, total * sizeof(float)) != 0) {
        rk->scratch = NULL;
        snprintf(err, errlen, "rank %d: cannot allocate %zu MiB of activations", r,
                 (total * sizeof(float)) >> 20);
        return ST_ENOMEM;
    }
    memset(rk->scratch, 0, total * sizeof(float));
    float *p = rk->scratch;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *ptrs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    return ST_OK;
}

static int
tp_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, void **state, char *err,
          size_t errlen)
{
    const mdl_config_t *c = &m->cfg;
    tp_state_t *s;
    mdl_tp_shard_t sh;
    int st;

    if (c->head_dim > KN_ATTN_MAX_HEAD_DIM) {
        snprintf(err, errlen, "head_dim %d exceeds %d", c->head_dim, KN_ATTN_MAX_HEAD_DIM);
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
    s->ranks = xcalloc((size_t)s->tp, sizeof(*s->ranks));
    for (int32_t r = 0; r < s->tp; r++) {
        st = tp_rank_init(s, r, err, errlen);
        if (st != ST_OK) {
            goto fail;
        }
    }
    s->inv_freq = xmalloc(sizeof(float) * (size_t)(c->head_dim / 2));
    s->hrows = xmalloc(sizeof(float) * (size_t)rc->max_num_seqs * c->dim);
    s->logits = xmalloc(sizeof(float) * (size_t)rc->max_num_seqs * c->vocab_size);

    kn_rope_params_t rp = {
        .head_dim = c->head_dim,
        .theta = c->rope_theta > 0.0f ? c->rope_theta : 10000.0f,
        .scaling = c->rope_scaling == MDL_ROPE_LINEAR   ? KN_ROPE_LINEAR
                   : c->rope_scaling == MDL_ROPE_LLAMA3 ? KN_ROPE_LLAMA3
                                                        : KN_ROPE_NONE,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .orig_max_pos = c->rope_orig_max_pos,
    };
    kn_cpu_rope_inv_freq(&rp, s->inv_freq);
    for (int32_t r = 0; r < s->tp; r++) {
        host_kv_set_rope(&s->ranks[r].kv, s->inv_freq);
    }
    kn_cpu_init(rc->n_threads);

    st = kn_comm_create(s->tp, &s->comm);
    if (st == ST_OK) {
        st = kn_ranks_create(s->tp, &s->threads);
    }
    if (st != ST_OK) {
        snprintf(err, errlen, "cannot start %d rank threads: %s", s->tp, st_str(st));
        goto fail;
    }
    LOG_DEBUG("cpu backend, tensor parallel %d: %d query heads, %d KV heads, FFN %d per rank, "
              "KV cache %s",
              s->tp, sh.n_q, sh.n_kv, sh.n_f, mdl_kv_dtype_name(rc->kv_dtype));
    *state = s;
    return ST_OK;

fail:
    tp_destroy(s);
    return st;
}

static int
tp_rank_kv_ops(void *arg, int r)
{
    tp_state_t *s = arg;

    return host_kv_ops(&s->ranks[r].kv, s->ops, s->n_ops);
}

static int
tp_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    tp_state_t *s = state;

    s->ops = ops;
    s->n_ops = n_ops;
    return kn_ranks_run(s->threads, tp_rank_kv_ops, s);
}

static int
tp_rank_forward(void *arg, int r)
{
    tp_state_t *s = arg;
    tp_rank_t *rk = &s->ranks[r];
    const mdl_batch_t *b = s->b;
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t T = b->n_tokens, dim = c->dim, hd = c->head_dim;
    const int32_t lq = sh->n_q * hd, lkv = sh->n_kv * hd;
    kn_attn_args_t aa = {
        .out = rk->att,
        .q = rk->q,
        .query_start = b->query_start,
        .context_len = b->context_len,
        .block_tables = b->block_tables,
        .max_blocks = b->max_blocks,
        .n_seqs = b->n_seqs,
        .n_tok = T,
        .n_heads = sh->n_q,
        .n_kv_heads = sh->n_kv,
        .head_dim = hd,
        .block_size = s->rc.block_size,
        .sliding_window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)hd),
    };

    kn_cpu_embed(m->tok_embd, b->tokens, T, dim, rk->x);
    kn_cpu_rope_table(b->positions, T, s->inv_freq, hd / 2, rk->cos_t, rk->sin_t);

    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        const tp_layer_t *tl = &rk->layers[l];

        kn_cpu_rmsnorm(rk->x, L->attn_norm, rk->h, T, dim, c->norm_eps);
        kn_cpu_matmul(rk->h, tl->wq, tl->bq, rk->q, T, dim, lq, 0);
        kn_cpu_matmul(rk->h, tl->wk, tl->bk, rk->k, T, dim, lkv, 0);
        kn_cpu_matmul(rk->h, tl->wv, tl->bv, rk->v, T, dim, lkv, 0);
        kn_cpu_rope(rk->q, T, sh->n_q, hd, rk->cos_t, rk->sin_t);
        kn_cpu_rope(rk->k, T, sh->n_kv, hd, rk->cos_t, rk->sin_t);
        host_kv_write(&rk->kv, l, rk->k, rk->v, b->slot_mapping, T);
        host_kv_attend(&rk->kv, l, &aa);
        kn_cpu_matmul(rk->att, tl->wo, NULL, rk->part, T, lq, dim, 0);
        kn_comm_allreduce_sum(s->comm, r, rk->part, (size_t)T * dim);
        kn_cpu_add(rk->x, rk->part, (size_t)T * dim);

        kn_cpu_rmsnorm(rk->x, L->ffn_norm, rk->h, T, dim, c->norm_eps);
        kn_cpu_matmul(rk->h, tl->w_gate, NULL, rk->gate, T, dim, sh->n_f, 0);
        kn_cpu_matmul(rk->h, tl->w_up, NULL, rk->up, T, dim, sh->n_f, 0);
        kn_cpu_silu_mul(rk->gate, rk->up, rk->gate, (size_t)T * sh->n_f);
        kn_cpu_matmul(rk->gate, tl->w_down, NULL, rk->part, T, sh->n_f, dim, 0);
        kn_comm_allreduce_sum(s->comm, r, rk->part, (size_t)T * dim);
        kn_cpu_add(rk->x, rk->part, (size_t)T * dim);
    }
    host_kv_end_step(&rk->kv);

    if (r != 0 || b->n_logits == 0) {
        return ST_OK;
    }
    for (int32_t i = 0; i < b->n_logits; i++) {
        memcpy(s->hrows + (size_t)i * dim, rk->x + (size_t)b->logits_rows[i] * dim,
               sizeof(float) * (size_t)dim);
    }
    kn_cpu_rmsnorm(s->hrows, m->out_norm, s->hrows, b->n_logits, dim, c->norm_eps);
    kn_cpu_matmul(s->hrows, m->lm_head, NULL, s->logits, b->n_logits, dim, c->vocab_size, 0);
    return ST_OK;
}

static int
tp_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    tp_state_t *s = state;
    int rc;

    s->b = b;
    rc = kn_ranks_run(s->threads, tp_rank_forward, s);
    s->b = NULL;
    if (rc != ST_OK) {
        return rc;
    }
    *logits = s->logits;
    return ST_OK;
}

const mdl_backend_t mdl_backend_cpu_tp = {
    .name = "cpu",
    .create = tp_create,
    .destroy = tp_destroy,
    .kv_ops = tp_kv_ops,
    .forward = tp_forward,
    .kv_drop_ops = 1,
    .kv_shift_ops = 1,
};
