/* dev_fwd.c - one tensor-parallel rank of the GPU forward pass over a
 * table of device operations (see dev_fwd.h; the sharding is model/tp.h).
 *
 * DESIGN. Per rank and step, everything on the rank's one stream:
 *
 *   stage = tokens | positions | slots | query_start | context_len |
 *           logits_rows | block_tables | query tiles   one pinned buffer, one copy
 *   x = embed(tokens)                                   (T, dim) f32
 *   per layer:
 *     h16 = rmsnorm(x)
 *     q, k, v = h16 Wq_r^T, h16 Wk_r^T, h16 Wv_r^T      GEMMs, f32 out (+ bias)
 *     rope(q, k); kv_write(k, v -> cache via slot_mapping)
 *     a16 = paged_attention(q, cache, block_tables)   decode kernel when every
 *           sequence has one new token, else the query-tile (prefill) kernel
 *     p = a16 Wo_r^T; all-reduce(p); x += p
 *     h16 = rmsnorm(x); g16 = silu(h16 Wg_r^T) * h16 Wu_r^T
 *     p = g16 Wd_r^T; all-reduce(p); x += p
 *   rank 0: logits = rmsnorm(x[logits_rows]) lm_head^T -> pinned host
 *
 * h16 is one (T, max(dim, n_f, n_q * hd)) buffer reused as the input of
 * every GEMM: each use is complete (stream order) before the next write.
 */
#define LOG_MODULE "devfwd"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "model/dev_fwd.h"
#include "model/model_int.h"

/* Uploads rows [r0, r0 + nr) x columns [c0, c0 + nc) of a host f32
 * (rows, cols) matrix as a 16-bit (nr, nc) device matrix. */
static int
dev_upload(mdl_dev_rank_t *rk, const float *w, int32_t cols, int32_t r0, int32_t nr, int32_t c0,
           int32_t nc, uint16_t **out)
{
    size_t n = (size_t)nr * nc;
    uint16_t *tmp = xmalloc(sizeof(uint16_t) * n);
    int rc;

    for (int32_t i = 0; i < nr; i++) {
        for (int32_t j = 0; j < nc; j++) {
            kn_st16(tmp, (size_t)i * nc + j, w[(size_t)(r0 + i) * cols + c0 + j], rk->dt);
        }
    }
    rc = rk->ops->alloc(rk->ctx, (void **)out, sizeof(uint16_t) * n);
    if (rc == ST_OK) {
        rc = rk->ops->upload(rk->ctx, *out, tmp, sizeof(uint16_t) * n);
    }
    free(tmp);
    return rc;
}

static int
dev_alloc(mdl_dev_rank_t *rk, void *pp, size_t bytes)
{
    return rk->ops->alloc(rk->ctx, (void **)pp, bytes);
}

int
mdl_dev_rank_init(mdl_dev_rank_t *rk, const mdl_dev_ops_t *ops, void *ctx, const mdl_model_t *m,
                  const mdl_runtime_config_t *rc, int32_t rank, kn_dt_t dt)
{
    const mdl_config_t *c = &m->cfg;
    int32_t hd = c->head_dim, qd = c->n_heads * hd, dim = c->dim;
    size_t T = (size_t)rc->max_num_batched_tokens, S = (size_t)rc->max_num_seqs;
    size_t lq, lkv, h16_cols;
    char err[160];
    int st;

    rk->ops = ops;
    rk->ctx = ctx;
    rk->m = m;
    rk->rc = *rc;
    rk->dt = dt;
    rk->rank = rank;
    st = mdl_tp_shard(c, rc->tp_size, rank, &rk->sh, err, sizeof(err));
    if (st != ST_OK) {
        LOG_ERROR("%s", err);
        return st;
    }
    const mdl_tp_shard_t *sh = &rk->sh;
    lq = (size_t)sh->n_q * hd;
    lkv = (size_t)sh->n_kv * hd;

    /* Weights: column-parallel rows, row-parallel columns (model/tp.h). */
    rk->layers = xcalloc((size_t)c->n_layers, sizeof(*rk->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        mdl_dev_layer_t *D = &rk->layers[l];
        int32_t q0 = sh->q0 * hd, kv0 = sh->kv0 * hd;

        if ((st = dev_upload(rk, L->attn_norm, dim, 0, 1, 0, dim, &D->attn_norm)) != ST_OK ||
            (st = dev_upload(rk, L->ffn_norm, dim, 0, 1, 0, dim, &D->ffn_norm)) != ST_OK ||
            (st = dev_upload(rk, L->wq, dim, q0, (int32_t)lq, 0, dim, &D->wq)) != ST_OK ||
            (st = dev_upload(rk, L->wk, dim, kv0, (int32_t)lkv, 0, dim, &D->wk)) != ST_OK ||
            (st = dev_upload(rk, L->wv, dim, kv0, (int32_t)lkv, 0, dim, &D->wv)) != ST_OK ||
            (st = dev_upload(rk, L->wo, qd, 0, dim, q0, (int32_t)lq, &D->wo)) != ST_OK ||
            (st = dev_upload(rk, L->w_gate, dim, sh->f0, sh->n_f, 0, dim, &D->w_gate)) != ST_OK ||
            (st = dev_upload(rk, L->w_up, dim, sh->f0, sh->n_f, 0, dim, &D->w_up)) != ST_OK ||
            (st = dev_upload(rk, L->w_down, c->ffn_dim, 0, dim, sh->f0, sh->n_f, &D->w_down)) !=
                ST_OK) {
            return st;
        }
        if (L->bq != NULL &&
            ((st = dev_upload(rk, L->bq, 0, 0, 1, q0, (int32_t)lq, &D->bq)) != ST_OK ||
             (st = dev_upload(rk, L->bk, 0, 0, 1, kv0, (int32_t)lkv, &D->bk)) != ST_OK ||
             (st = dev_upload(rk, L->bv, 0, 0, 1, kv0, (int32_t)lkv, &D->bv)) != ST_OK)) {
            return st;
        }
    }
    if ((st = dev_upload(rk, m->tok_embd, dim, 0, c->vocab_size, 0, dim, &rk->embd)) != ST_OK ||
        (st = dev_upload(rk, m->out_norm, dim, 0, 1, 0, dim, &rk->out_norm)) != ST_OK) {
        return st;
    }
    if (rank == 0 &&
        (st = dev_upload(rk, m->lm_head, dim, 0, c->vocab_size, 0, dim, &rk->lm_head)) != ST_OK) {
        return st;
    }

    /* RoPE frequencies: the CPU table. */
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
        if ((st = dev_alloc(rk, &rk->inv_freq, sizeof(float) * (size_t)(hd / 2))) != ST_OK ||
            (st = ops->upload(ctx, rk->inv_freq, inv, sizeof(float) * (size_t)(hd / 2))) != ST_OK) {
            return st;
        }
    }

    /* Activations for the largest step. */
    h16_cols = (size_t)dim;
    if ((size_t)sh->n_f > h16_cols) {
        h16_cols = (size_t)sh->n_f;
    }
    if (lq > h16_cols) {
        h16_cols = lq;
    }
    rk->stage_len = 5 * T + 3 * S + 1 + S * (size_t)rc->max_blocks_per_seq;
    if ((st = dev_alloc(rk, &rk->x, sizeof(float) * T * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->part, sizeof(float) * T * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->q, sizeof(float) * T * lq)) != ST_OK ||
        (st = dev_alloc(rk, &rk->k, sizeof(float) * T * lkv)) != ST_OK ||
        (st = dev_alloc(rk, &rk->v, sizeof(float) * T * lkv)) != ST_OK ||
        (st = dev_alloc(rk, &rk->gate, sizeof(float) * T * (size_t)sh->n_f)) != ST_OK ||
        (st = dev_alloc(rk, &rk->up, sizeof(float) * T * (size_t)sh->n_f)) != ST_OK ||
        (st = dev_alloc(rk, &rk->h16, sizeof(uint16_t) * T * h16_cols)) != ST_OK ||
        (st = dev_alloc(rk, &rk->hrows, sizeof(float) * S * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->stage_dev, sizeof(int32_t) * rk->stage_len)) != ST_OK ||
        (st = ops->alloc_host(ctx, (void **)&rk->stage_host, sizeof(int32_t) * rk->stage_len)) !=
            ST_OK) {
        return st;
    }
    if (rank == 0 &&
        ((st = dev_alloc(rk, &rk->logits_dev, sizeof(float) * S * c->vocab_size)) != ST_OK ||
         (st = ops->alloc_host(ctx, (void **)&rk->logits_host,
                               sizeof(float) * S * c->vocab_size)) != ST_OK)) {
        return st;
    }
    rk->blk_bytes = sizeof(uint16_t) * lkv * (size_t)rc->block_size;
    rk->plan = xmalloc(sizeof(*rk->plan) * 2 * (size_t)c->n_layers *
                       (size_t)(rc->num_blocks + rc->swap_blocks));
    return ST_OK;
}

size_t
mdl_dev_rank_kv_bytes(const mdl_dev_rank_t *rk)
{
    return 2 * (size_t)rk->m->cfg.n_layers * (size_t)rk->rc.num_blocks * rk->blk_bytes;
}

int
mdl_dev_rank_alloc_kv(mdl_dev_rank_t *rk)
{
    int st = dev_alloc(rk, &rk->kv, mdl_dev_rank_kv_bytes(rk));

    if (st == ST_OK && rk->rc.swap_blocks > 0) {
        st = rk->ops->alloc_host(rk->ctx, (void **)&rk->swap,
                                 2 * (size_t)rk->m->cfg.n_layers * (size_t)rk->rc.swap_blocks *
                                     rk->blk_bytes);
    }
    return st;
}

void
mdl_dev_rank_fini(mdl_dev_rank_t *rk)
{
    const mdl_dev_ops_t *o = rk->ops;

    if (o == NULL) {
        return;
    }
    if (rk->layers != NULL) {
        for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
            mdl_dev_layer_t *L = &rk->layers[l];
            void *ps[] = {L->attn_norm, L->ffn_norm, L->wq, L->wk,     L->wv,   L->bq,
                          L->bk,        L->bv,       L->wo, L->w_gate, L->w_up, L->w_down};

            for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
                o->free(rk->ctx, ps[i]);
            }
        }
    }
    free(rk->layers);
    void *dev[] = {rk->embd, rk->out_norm, rk->lm_head,    rk->inv_freq, rk->kv,   rk->x,
                   rk->part, rk->q,        rk->k,          rk->v,        rk->gate, rk->up,
                   rk->h16,  rk->hrows,    rk->logits_dev, rk->stage_dev};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
        o->free(rk->ctx, dev[i]);
    }
    o->free_host(rk->ctx, rk->swap);
    o->free_host(rk->ctx, rk->logits_host);
    o->free_host(rk->ctx, rk->stage_host);
    free(rk->plan);
    memset(rk, 0, sizeof(*rk));
}

int
mdl_dev_rank_kv_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    int32_t cap = rk->rc.num_blocks + rk->rc.swap_blocks, n;
    int st;

    /* The plan buffer holds up to `cap` operations' ranges at a time. */
    for (int32_t i0 = 0; i0 < n_ops; i0 += cap) {
        int32_t k = n_ops - i0 < cap ? n_ops - i0 : cap;

        n = kn_kvcopy_plan(ops + i0, k, rk->m->cfg.n_layers, rk->rc.num_blocks, rk->rc.swap_blocks,
                           rk->blk_bytes, rk->plan);
        for (int32_t i = 0; i < n; i++) {
            const kn_kvcopy_t *p = &rk->plan[i];
            uint8_t *src = p->kind == KV_OP_SWAP_IN ? rk->swap : rk->kv;
            uint8_t *dst = p->kind == KV_OP_SWAP_OUT ? rk->swap : rk->kv;

            if (src == NULL || dst == NULL) {
                return ST_EINVAL; /* swap op without a swap tier */
            }
            st = rk->ops->copy(rk->ctx, dst + p->dst_off, src + p->src_off, p->bytes, p->kind);
            if (st != ST_OK) {
                return st;
            }
        }
    }
    return rk->ops->sync(rk->ctx);
}

#define DEV_TRY(call)                                                                              \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        if (st_ != ST_OK) {                                                                        \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

int
mdl_dev_rank_forward(mdl_dev_rank_t *rk, const mdl_batch_t *b)
{
    const mdl_dev_ops_t *o = rk->ops;
    void *cx = rk->ctx;
    const mdl_config_t *c = &rk->m->cfg;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t T = b->n_tokens, dim = c->dim, hd = c->head_dim, S = b->n_seqs;
    const int32_t lq = sh->n_q * hd, lkv = sh->n_kv * hd, bs = rk->rc.block_size;
    const size_t region = (size_t)rk->rc.num_blocks * rk->blk_bytes;
    const kn_dt_t dt = rk->dt;

    /* Stage the batch: one pinned buffer, one copy. */
    int32_t *h = rk->stage_host;
    size_t o_pos = (size_t)T, o_slot = o_pos + T, o_qs = o_slot + T, o_ctx = o_qs + S + 1;
    size_t o_rows = o_ctx + S, o_bt = o_rows + (size_t)b->n_logits;
    size_t o_tiles = o_bt + (size_t)S * b->max_blocks, n_int = o_tiles;
    const int32_t group = c->n_heads / c->n_kv_heads;
    const int32_t q_tile = kn_attn_prefill_q_tile(group);
    int32_t n_tiles = 0;

    memcpy(h, b->tokens, sizeof(int32_t) * T);
    memcpy(h + o_pos, b->positions, sizeof(int32_t) * T);
    memcpy(h + o_slot, b->slot_mapping, sizeof(int32_t) * T);
    memcpy(h + o_qs, b->query_start, sizeof(int32_t) * (S + 1));
    memcpy(h + o_ctx, b->context_len, sizeof(int32_t) * S);
    if (b->n_logits > 0) {
        memcpy(h + o_rows, b->logits_rows, sizeof(int32_t) * b->n_logits);
    }
    memcpy(h + o_bt, b->block_tables, sizeof(int32_t) * (size_t)S * b->max_blocks);
    if (T > S) { /* prefill chunks present: query tiles for the prefill kernel */
        for (int32_t s = 0; s < S; s++) {
            for (int32_t t0 = b->query_start[s]; t0 < b->query_start[s + 1]; t0 += q_tile) {
                h[o_tiles + (size_t)n_tiles++] = t0;
            }
        }
        n_int += (size_t)n_tiles;
    }
    DEV_TRY(o->copy(cx, rk->stage_dev, h, sizeof(int32_t) * n_int, KV_OP_SWAP_IN));
    const int32_t *d = rk->stage_dev;

    kn_embed_args_t ea = {rk->embd, d, rk->x, dim, dt};
    DEV_TRY(o->embed(cx, &ea, T));

    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_dev_layer_t *L = &rk->layers[l];
        uint16_t *kc = (uint16_t *)(rk->kv + ((size_t)l * 2 + 0) * region);
        uint16_t *vc = (uint16_t *)(rk->kv + ((size_t)l * 2 + 1) * region);
        kn_rmsnorm_args_t na = {rk->x, L->attn_norm, rk->h16, dim, dim, c->norm_eps, dt};
        kn_rope_args_t rq = {rk->q, d + o_pos, rk->inv_freq, sh->n_q, hd, lq};
        kn_rope_args_t rkk = {rk->k, d + o_pos, rk->inv_freq, sh->n_kv, hd, lkv};
        kn_kv_write_args_t kw = {kc, vc, rk->k, rk->v, d + o_slot, sh->n_kv, hd, bs, lkv, dt};
        kn_attn_cuda_args_t aa = {
            rk->h16,  rk->q,
            kc,       vc,
            d + o_qs, d + o_ctx,
            d + o_bt, b->max_blocks,
            S,        sh->n_q,
            sh->n_kv, hd,
            bs,       c->sliding_window,
            lq,       1.0f / sqrtf((float)hd),
            dt,
        };
        kn_add_args_t ad = {rk->x, rk->part, (int64_t)T * dim};
        kn_rmsnorm_args_t fa = {rk->x, L->ffn_norm, rk->h16, dim, dim, c->norm_eps, dt};
        kn_silu_mul_args_t sm = {rk->gate, rk->up, rk->h16, sh->n_f, sh->n_f, dt};

        DEV_TRY(o->rmsnorm(cx, &na, T));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->wq, rk->q, T, dim, lq));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->wk, rk->k, T, dim, lkv));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->wv, rk->v, T, dim, lkv));
        if (L->bq != NULL) {
            kn_bias_args_t bq = {rk->q, L->bq, lq, lq, dt};
            kn_bias_args_t bk = {rk->k, L->bk, lkv, lkv, dt};
            kn_bias_args_t bv = {rk->v, L->bv, lkv, lkv, dt};

            DEV_TRY(o->bias(cx, &bq, T));
            DEV_TRY(o->bias(cx, &bk, T));
            DEV_TRY(o->bias(cx, &bv, T));
        }
        DEV_TRY(o->rope(cx, &rq, T));
        DEV_TRY(o->rope(cx, &rkk, T));
        DEV_TRY(o->kv_write(cx, &kw, T)); /* every new K/V lands before attention reads */
        if (n_tiles > 0) {
            kn_attn_prefill_args_t pa = {aa, d + o_tiles, q_tile};

            DEV_TRY(o->attention_prefill(cx, &pa, n_tiles));
        } else {
            DEV_TRY(o->attention(cx, &aa, T)); /* decodes only */
        }
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->wo, rk->part, T, lq, dim));
        if (o->allreduce != NULL) {
            DEV_TRY(o->allreduce(cx, rk->part, (size_t)T * dim));
        }
        DEV_TRY(o->add(cx, &ad));

        DEV_TRY(o->rmsnorm(cx, &fa, T));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_gate, rk->gate, T, dim, sh->n_f));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_up, rk->up, T, dim, sh->n_f));
        DEV_TRY(o->silu_mul(cx, &sm, T));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_down, rk->part, T, sh->n_f, dim));
        if (o->allreduce != NULL) {
            DEV_TRY(o->allreduce(cx, rk->part, (size_t)T * dim));
        }
        DEV_TRY(o->add(cx, &ad));
    }

    if (rk->rank == 0 && b->n_logits > 0) {
        kn_gather_args_t ga = {rk->x, d + o_rows, rk->hrows, dim};
        kn_rmsnorm_args_t on = {rk->hrows, rk->out_norm, rk->h16, dim, dim, c->norm_eps, dt};

        DEV_TRY(o->gather(cx, &ga, b->n_logits));
        DEV_TRY(o->rmsnorm(cx, &on, b->n_logits));
        DEV_TRY(
            o->gemm(cx, dt, rk->h16, rk->lm_head, rk->logits_dev, b->n_logits, dim, c->vocab_size));
        DEV_TRY(o->copy(cx, rk->logits_host, rk->logits_dev,
                        sizeof(float) * (size_t)b->n_logits * c->vocab_size, KV_OP_SWAP_OUT));
    }
    return o->sync(cx);
}

/* ---- sizing the KV pool from --gpu-memory-utilization ---------------------- */

/* One device allocation as the allocator pays for it. */
static size_t
dev_grain(size_t bytes)
{
    return (bytes + MDL_DEV_ALLOC_GRAIN - 1) / MDL_DEV_ALLOC_GRAIN * MDL_DEV_ALLOC_GRAIN;
}

/* Device bytes mdl_dev_rank_init() allocates on a rank with shard sh:
 * weights (16-bit) into *w, activations into *a. Keep in step with it. */
static void
dev_rank_bytes(const mdl_config_t *c, const mdl_runtime_config_t *rc, const mdl_tp_shard_t *sh,
               int32_t rank, size_t *w, size_t *a)
{
    const size_t e = sizeof(uint16_t), f = sizeof(float), dim = (size_t)c->dim;
    const size_t hd = (size_t)c->head_dim, lq = (size_t)sh->n_q * hd, lkv = (size_t)sh->n_kv * hd;
    const size_t nf = (size_t)sh->n_f, vocab = (size_t)c->vocab_size;
    const size_t T = (size_t)rc->max_num_batched_tokens, S = (size_t)rc->max_num_seqs;
    size_t layer, h16_cols = dim, stage_len;

    layer = 2 * dev_grain(e * dim) + dev_grain(e * lq * dim) + 2 * dev_grain(e * lkv * dim) +
            dev_grain(e * dim * lq) + 3 * dev_grain(e * nf * dim);
    if (c->qkv_bias) {
        layer += dev_grain(e * lq) + 2 * dev_grain(e * lkv);
    }
    *w = layer * (size_t)c->n_layers + dev_grain(e * vocab * dim) + dev_grain(e * dim) +
         dev_grain(f * (hd / 2)) + (rank == 0 ? dev_grain(e * vocab * dim) : 0);

    if (nf > h16_cols) {
        h16_cols = nf;
    }
    if (lq > h16_cols) {
        h16_cols = lq;
    }
    stage_len = 5 * T + 3 * S + 1 + S * (size_t)rc->max_blocks_per_seq;
    *a = 2 * dev_grain(f * T * dim) + dev_grain(f * T * lq) + 2 * dev_grain(f * T * lkv) +
         2 * dev_grain(f * T * nf) + dev_grain(e * T * h16_cols) + dev_grain(f * S * dim) +
         dev_grain(sizeof(int32_t) * stage_len) + (rank == 0 ? dev_grain(f * S * vocab) : 0);
}

#define GIB(x) ((double)(x) / (double)(1u << 30))

int
mdl_kv_blocks_for_budget(const mdl_config_t *c, const mdl_runtime_config_t *rc,
                         size_t device_bytes, mdl_kv_budget_t *out, char *err, size_t errlen)
{
    /* The float 0.9f is 0.89999998: rounded to 6 decimals it means 0.9. */
    const double util = floor((double)rc->gpu_memory_utilization * 1e6 + 0.5) / 1e6;
    int64_t best = INT32_MAX;
    char why[160];

    memset(out, 0, sizeof(*out));
    out->reserve_bytes = MDL_DEV_RESERVE_BYTES;
    if (!(util > 0.0 && util <= 1.0) || device_bytes == 0 || rc->tp_size <= 0 ||
        rc->block_size <= 0 || rc->max_num_batched_tokens <= 0 || rc->max_num_seqs <= 0 ||
        rc->max_blocks_per_seq <= 0) {
        snprintf(err, errlen,
                 "cannot size the KV pool: utilization %.3f, %zu device bytes, %d ranks, block "
                 "size %d, %d tokens / %d sequences per step",
                 util, device_bytes, rc->tp_size, rc->block_size, rc->max_num_batched_tokens,
                 rc->max_num_seqs);
        return ST_EINVAL;
    }
    out->budget_bytes = (size_t)((double)device_bytes * util);
    for (int32_t r = 0; r < rc->tp_size; r++) {
        mdl_tp_shard_t sh;
        size_t w, a, need;
        int64_t n;
        int st = mdl_tp_shard(c, rc->tp_size, r, &sh, why, sizeof(why));

        if (st != ST_OK) {
            snprintf(err, errlen, "cannot size the KV pool: %s", why);
            return st;
        }
        dev_rank_bytes(c, rc, &sh, r, &w, &a);
        out->block_bytes = 2 * (size_t)c->n_layers * sizeof(uint16_t) * (size_t)sh.n_kv *
                           (size_t)c->head_dim * (size_t)rc->block_size;
        need = w + a + out->reserve_bytes;
        n = need < out->budget_bytes ? (int64_t)((out->budget_bytes - need) / out->block_bytes) : 0;
        if (r == 0 || n < best) {
            best = n > INT32_MAX ? INT32_MAX : n;
            out->weight_bytes = w;
            out->act_bytes = a;
        }
    }
    out->num_blocks = (int32_t)best;
    if (best < 2) {
        snprintf(err, errlen,
                 "--gpu-memory-utilization %.2f of %.2f GiB per device leaves room for %lld KV "
                 "blocks of %.2f MiB (at least 2 needed) after weights %.2f GiB, activations "
                 "%.2f GiB for %d tokens / %d sequences and a reserve of %.2f GiB",
                 util, GIB(device_bytes), (long long)best,
                 (double)out->block_bytes / (double)(1u << 20), GIB(out->weight_bytes),
                 GIB(out->act_bytes), rc->max_num_batched_tokens, rc->max_num_seqs,
                 GIB(out->reserve_bytes));
        return ST_ENOMEM;
    }
    return ST_OK;
}
