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
 *     q|k|v = h16 Wqkv_r^T (+ bias)                     one GEMM, f32 out
 *     rope(q|k); kv_write(k, v -> cache via slot_mapping)
 *     a16 = paged_attention(q, cache, block_tables)   per-token kernel when every
 *           sequence has at most 1 + spec_k new tokens (decodes, verification
 *           rows), else the query-tile (prefill) kernel
 *     x += a16 Wo_r^T                                   T = 1: the GEMM adds (beta 1);
 *                                                       T > 1: p, all-reduce(p), x += p
 *     h16 = rmsnorm(x); g|u = h16 Wgu_r^T; g16 = silu(g) * u
 *     x += g16 Wd_r^T                                   as Wo
 *   rank 0: logits = rmsnorm(x[logits_rows]) lm_head^T -> pinned host (n_logits rows)
 *   sync (the one host wait of a step)
 *
 * Launches per decode step at T = 1 (L layers, no QKV bias): 1 staging
 * copy, embed, per layer 6 kernels (2 norms, RoPE, KV write, attention,
 * SiLU x up) and 4 GEMMs (qkv, o, gate|up, down), gather + norm + LM head
 * GEMM, 1 logits copy, 1 sync: 10 L + 7 calls (a QKV bias adds one kernel
 * per layer; T > 1 adds 2 all-reduces and 2 adds per layer). With step
 * graphs (model/dev_graph.c: decode and verification steps) the kernels
 * and GEMMs are one graph launch.
 * Decode attention with few tokens is split-K (kn_attention_split_body:
 * kn_attn_n_splits() of T rounded up to a power of two, partials in
 * attn_part, one op that launches the split kernel and its combine).
 * kv_ops() enqueues its copies and does not sync.
 *
 * The q, k, v rows of a rank's shard are one matrix (wq | wk | wv rows)
 * and so are gate and up: one GEMM each, its output rows q | k | v (and
 * gate | up) side by side, read through row strides by RoPE (q and k
 * heads are adjacent), the KV write, attention and SiLU x up.
 *
 * h16 is one (T, max(dim, n_f, n_q * hd)) buffer reused as the input of
 * every GEMM: each use is complete (stream order) before the next write.
 *
 * Weights (init): each matrix travels in its file's type (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), the shard's rows (or a row-parallel
 * column slice's whole blocks) copied from the mapped file into a pinned
 * staging buffer, uploaded to a device staging buffer of the same size
 * (wstage_cap, default 64 MiB) and dequantized there to the 16-bit dt by
 * kn_wdequant_body, chunk after chunk; the staging is freed before the
 * activations are allocated. So host memory is the file plus one staging
 * buffer. The host dequantizer (kn_dequant_row + kn_st16 into the
 * staging) remains only as the fallback for column slices that cut
 * blocks; it gives the same bits.
 *
 * Quantized KV (--kv-cache-dtype fp8_e4m3 / int8 / int4): the blocks hold
 * the KIVI codes and scales of kernels/cpu/kv_quant.h byte for byte, and
 * the rank keeps the CPU store's residual discipline with the slots in
 * device memory and the bookkeeping on the host:
 *
 *   before the step  each written block gets a slot (a block that already
 *                    holds codes -- its slot was flushed -- is dequantized
 *                    into it); when none is free, the least recently
 *                    written slot not touched by this step is flushed
 *                    (its rows quantized into its block)
 *   per layer        kv_write -> kq_res_write into the slots, then
 *                    kq_quant of every block whose last row this step
 *                    wrote; attention -> kq_attention (codes, and the
 *                    query's own block from its slot)
 *   after the step   slots of the blocks filled are freed
 *
 * Copy / swap move blocks with their scales (one range per layer and
 * kind) and a partial block's slot with it; DROP frees the slot.
 *
 * KV_OP_SHIFT (attention sinks / rolling window) re-rotates a block's key
 * rows by -delta in place (kv_rotate) in a 16-bit pool and in a residual
 * slot; a quantized block without a slot keeps its codes and adds delta
 * to its pending shift, which copy / swap carry, a rewrite (taking a
 * slot: dequantized rows are rotated then) and DROP reset, and the
 * attention kernel applies by rotating the query by +shift for that
 * block, as the CPU store does. The
 * prefill-tile kernel is 16-bit only: quantized steps use the per-token
 * kernel for every token.
 *
 * tq3 / tq4 KV (kernels/kn_tq.h): every row is encoded when it is written
 * (tq_write, per layer after RoPE, before attention reads), so there are
 * no residual slots; attention (tq_attention) scores and sums in the
 * rotated domain. The rotation signs and tq4's sketches of the rank's KV
 * heads are made on the host (kn_tq_create, as the CPU store of the same
 * heads makes them) and uploaded once. Copy / swap move the rows; DROP
 * does nothing; SHIFT decodes, rotates and re-encodes a block's keys on
 * the device (tq_shift), as the CPU store does.
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
#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_tq.h"
#include "model/dev_fwd.h"
#include "model/kv_cache.h"
#include "model/model_int.h"

/* The weight staging buffers (pinned host and device) grown to at least
 * bytes; the old contents are dropped. */
static int
dev_wstage_reserve(mdl_dev_rank_t *rk, size_t bytes)
{
    int st;

    if (bytes <= rk->wstage_bytes) {
        return ST_OK;
    }
    if ((st = rk->ops->sync(rk->ctx)) != ST_OK) { /* a dequantization may read the old one */
        return st;
    }
    rk->ops->free_host(rk->ctx, rk->wst_host);
    rk->ops->free(rk->ctx, rk->wst_dev);
    rk->wst_host = rk->wst_dev = NULL;
    rk->wstage_bytes = 0;
    if ((st = rk->ops->alloc_host(rk->ctx, (void **)&rk->wst_host, bytes)) != ST_OK ||
        (st = rk->ops->alloc(rk->ctx, (void **)&rk->wst_dev, bytes)) != ST_OK) {
        return st;
    }
    rk->wstage_bytes = bytes;
    return ST_OK;
}

/* Frees the staging buffers (after the device is done with them). */
static int
dev_wstage_release(mdl_dev_rank_t *rk)
{
    int st = rk->wst_dev != NULL ? rk->ops->sync(rk->ctx) : ST_OK;

    rk->ops->free_host(rk->ctx, rk->wst_host);
    rk->ops->free(rk->ctx, rk->wst_dev);
    rk->wst_host = rk->wst_dev = NULL;
    return st;
}

/* Uploads rows [r0, r0 + nr) x columns [c0, c0 + nc) of a host weight in
 * its file's type (kernels/cpu/kn_quant.h) into the 16-bit (nr, nc) device
 * matrix out (row stride nc; it may be rows of a larger one), in chunks of rows that fit the staging buffers (wstage_cap, at
 * least one row):
 *
 *   device path  the rows' bytes -- whole rows, or the whole blocks of a
 *                column slice that starts and ends on block boundaries --
 *                gathered into pinned staging, uploaded, and dequantized
 *                on the device (wdequant) into their rows of the matrix
 *   host path    only for a column slice that cuts blocks (row-parallel
 *                wo / w_down of a K-quant whose shard is not a multiple
 *                of 256 columns), or upload_host: each row dequantized on
 *                the host (kn_dequant_row, kn_st16) into the staging, and
 *                the 16-bit rows uploaded
 *
 * Both give the same bits (kn_wdequant_body is kn_dequant_row + kn_st16).
 * No f32 or 16-bit copy of the whole weight is made on the host. */
static int
dev_upload_into(mdl_dev_rank_t *rk, const kn_weight_t *w, int32_t r0, int32_t nr, int32_t c0,
                int32_t nc, uint16_t *out)
{
    int32_t be = kn_wtype_block_elems(w->type);
    size_t bb = kn_wtype_block_bytes(w->type);
    int dev = !rk->upload_host && be > 0 && c0 % be == 0 && nc % be == 0;
    size_t row_bytes = dev ? (size_t)(nc / be) * bb : sizeof(uint16_t) * (size_t)nc;
    size_t cap = rk->wstage_cap != 0 ? rk->wstage_cap : MDL_DEV_WSTAGE, per;
    float *row = NULL;
    int st = ST_OK;

    if (nr <= 0 || nc <= 0) {
        return ST_OK;
    }
    per = cap / row_bytes;
    per = per < 1 ? 1 : per > (size_t)nr ? (size_t)nr : per;
    if ((st = dev_wstage_reserve(rk, per * row_bytes)) != ST_OK) {
        return st;
    }
    if (!dev) {
        row = xmalloc(sizeof(float) * (size_t)w->cols);
        rk->n_host_uploads++;
    }
    for (int32_t i0 = 0; i0 < nr && st == ST_OK; i0 += (int32_t)per) {
        int32_t n = nr - i0 < (int32_t)per ? nr - i0 : (int32_t)per;
        uint16_t *dst = out + (size_t)i0 * nc;

        for (int32_t i = 0; i < n; i++) {
            const char *src = (const char *)w->data + (size_t)(r0 + i0 + i) * w->row_bytes;

            if (dev) {
                memcpy(rk->wst_host + (size_t)i * row_bytes, src + (size_t)(c0 / be) * bb,
                       row_bytes);
                continue;
            }
            kn_dequant_row(w->type, src, row, w->cols);
            for (int32_t j = 0; j < nc; j++) {
                kn_st16((uint16_t *)rk->wst_host, (size_t)i * nc + j, row[c0 + j], rk->dt);
            }
        }
        if (!dev) {
            st = rk->ops->upload(rk->ctx, dst, rk->wst_host, (size_t)n * row_bytes);
            continue;
        }
        kn_wdequant_args_t a = {.src = rk->wst_dev,
                                .dst = dst,
                                .src_row_bytes = row_bytes,
                                .n_cols = nc,
                                .type = w->type,
                                .dt = rk->dt};

        /* upload() waits for the copy, and stream order keeps the next
         * chunk's copy behind this dequantization. */
        if ((st = rk->ops->upload(rk->ctx, rk->wst_dev, rk->wst_host, (size_t)n * row_bytes)) ==
            ST_OK) {
            st = rk->ops->wdequant(rk->ctx, &a, n);
        }
    }
    free(row);
    return st;
}

/* dev_upload_into() a new (nr, nc) device matrix, in *out. */
static int
dev_upload(mdl_dev_rank_t *rk, const kn_weight_t *w, int32_t r0, int32_t nr, int32_t c0,
           int32_t nc, uint16_t **out)
{
    int st = rk->ops->alloc(rk->ctx, (void **)out, sizeof(uint16_t) * (size_t)nr * nc);

    return st != ST_OK ? st : dev_upload_into(rk, w, r0, nr, c0, nc, *out);
}

/* Elements [c0, c0 + nc) of an f32 vector of n, as dev_upload_into(). */
static int
dev_upload_vec_into(mdl_dev_rank_t *rk, const float *v, int32_t n, int32_t c0, int32_t nc,
                    uint16_t *out)
{
    kn_weight_t w = mdl_weight_f32(v, 1, n);

    return dev_upload_into(rk, &w, 0, 1, c0, nc, out);
}

static int
dev_upload_vec(mdl_dev_rank_t *rk, const float *v, int32_t n, int32_t c0, int32_t nc,
               uint16_t **out)
{
    int st = rk->ops->alloc(rk->ctx, (void **)out, sizeof(uint16_t) * (size_t)nc);

    return st != ST_OK ? st : dev_upload_vec_into(rk, v, n, c0, nc, *out);
}

static int
dev_alloc(mdl_dev_rank_t *rk, void *pp, size_t bytes)
{
    return rk->ops->alloc(rk->ctx, (void **)pp, bytes);
}

/* KN_KQ_* format of a KV dtype; 0 for the 16-bit ones. */
static int32_t
dev_kq_fmt(mdl_kv_dtype_t d)
{
    return d == MDL_KV_FP8_E4M3 ? KN_KQ_FP8
           : d == MDL_KV_INT8   ? KN_KQ_INT8
           : d == MDL_KV_INT4   ? KN_KQ_INT4
                                : 0;
}

/* Bits of a tq KV dtype; 0 for the others. */
static int
dev_tq_bits(mdl_kv_dtype_t d)
{
    return d == MDL_KV_TQ3 ? 3 : d == MDL_KV_TQ4 ? 4 : 0;
}

/* The CPU store's tq block strides for n_kv heads (ST_OK or its error). */
static int
dev_tq_strides(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t d, int32_t n_kv,
               size_t *ks, size_t *vs, char *err, size_t errlen)
{
    mdl_config_t part = *c;
    kn_kvq_layout_t L;
    int st;

    part.n_kv_heads = n_kv;
    st = mdl__kv_layout(&part, block_size, d, &L, err, errlen);
    if (st == ST_OK) {
        *ks = L.k_stride;
        *vs = L.v_stride;
    }
    return st;
}

/* Floats of the rotation signs and (tq4) sketches of n_kv heads. */
static void
dev_tq_floats(const mdl_config_t *c, int bits, int32_t n_kv, size_t *sg, size_t *S)
{
    size_t lh = (size_t)c->n_layers * (size_t)n_kv, hd = (size_t)c->head_dim;

    *sg = lh * hd;
    *S = bits == 4 ? lh * hd * hd : 0;
}

/* Residual slots per tier: the CPU store's count (model/kv_cache.c, read
 * back from mdl_kv_residual_bytes), at most the tier's blocks, at least 1. */
static int32_t
dev_kq_slots(const mdl_config_t *c, const mdl_runtime_config_t *rc, int32_t n_blocks)
{
    size_t per = 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)rc->block_size *
                 (size_t)c->head_dim * sizeof(float);
    size_t all = mdl_kv_residual_bytes(c, rc->block_size, rc->kv_dtype, rc->max_num_seqs,
                                       rc->max_num_batched_tokens);
    int32_t n = (int32_t)(all / per);

    n = n < n_blocks ? n : n_blocks;
    return n < 1 ? 1 : n;
}

/* Bytes of one residual slot on a rank with n_kv KV heads. */
static size_t
dev_kq_slot_bytes(const mdl_config_t *c, int32_t block_size, int32_t n_kv)
{
    return 2 * (size_t)c->n_layers * (size_t)n_kv * (size_t)block_size * (size_t)c->head_dim *
           sizeof(float);
}

int
mdl_dev_rank_init(mdl_dev_rank_t *rk, const mdl_dev_ops_t *ops, void *ctx, const mdl_model_t *m,
                  const mdl_runtime_config_t *rc, int32_t rank, kn_dt_t dt)
{
    const mdl_config_t *c = &m->cfg;
    int32_t hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, dim = c->dim;
    size_t T = (size_t)rc->max_num_batched_tokens, S = (size_t)rc->max_num_seqs;
    size_t lq, lkv, lqkv, h16_cols, n_part;
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
    lqkv = lq + 2 * lkv;

    /* Weights: column-parallel rows, row-parallel columns (model/tp.h). */
    rk->layers = xcalloc((size_t)c->n_layers, sizeof(*rk->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        mdl_dev_layer_t *D = &rk->layers[l];
        int32_t q0 = sh->q0 * hd, kv0 = sh->kv0 * hd;

        /* q, k, v rows in one matrix and gate, up rows in another: one
         * GEMM each (dev_fwd_run); wq .. w_up are views into them. */
        if ((st = dev_alloc(rk, &D->wqkv, sizeof(uint16_t) * lqkv * dim)) != ST_OK ||
            (st = dev_alloc(rk, &D->w_gu, sizeof(uint16_t) * 2 * (size_t)sh->n_f * dim)) !=
                ST_OK) {
            return st;
        }
        D->wq = D->wqkv;
        D->wk = D->wq + lq * dim;
        D->wv = D->wk + lkv * dim;
        D->w_gate = D->w_gu;
        D->w_up = D->w_gu + (size_t)sh->n_f * dim;
        if ((st = dev_upload_vec(rk, L->attn_norm, dim, 0, dim, &D->attn_norm)) != ST_OK ||
            (st = dev_upload_vec(rk, L->ffn_norm, dim, 0, dim, &D->ffn_norm)) != ST_OK ||
            (st = dev_upload_into(rk, &L->wq, q0, (int32_t)lq, 0, dim, D->wq)) != ST_OK ||
            (st = dev_upload_into(rk, &L->wk, kv0, (int32_t)lkv, 0, dim, D->wk)) != ST_OK ||
            (st = dev_upload_into(rk, &L->wv, kv0, (int32_t)lkv, 0, dim, D->wv)) != ST_OK ||
            (st = dev_upload(rk, &L->wo, 0, dim, q0, (int32_t)lq, &D->wo)) != ST_OK ||
            (st = dev_upload_into(rk, &L->w_gate, sh->f0, sh->n_f, 0, dim, D->w_gate)) !=
                ST_OK ||
            (st = dev_upload_into(rk, &L->w_up, sh->f0, sh->n_f, 0, dim, D->w_up)) != ST_OK ||
            (st = dev_upload(rk, &L->w_down, 0, dim, sh->f0, sh->n_f, &D->w_down)) !=
                ST_OK) {
            return st;
        }
        if (L->bq != NULL) {
            if ((st = dev_alloc(rk, &D->bqkv, sizeof(uint16_t) * lqkv)) != ST_OK) {
                return st;
            }
            D->bq = D->bqkv;
            D->bk = D->bq + lq;
            D->bv = D->bk + lkv;
            if ((st = dev_upload_vec_into(rk, L->bq, qd, q0, (int32_t)lq, D->bq)) != ST_OK ||
                (st = dev_upload_vec_into(rk, L->bk, kvd, kv0, (int32_t)lkv, D->bk)) != ST_OK ||
                (st = dev_upload_vec_into(rk, L->bv, kvd, kv0, (int32_t)lkv, D->bv)) != ST_OK) {
                return st;
            }
        }
    }
    if ((st = dev_upload(rk, &m->tok_embd, 0, c->vocab_size, 0, dim, &rk->embd)) != ST_OK ||
        (st = dev_upload_vec(rk, m->out_norm, dim, 0, dim, &rk->out_norm)) != ST_OK) {
        return st;
    }
    if (rank == 0 &&
        (st = dev_upload(rk, &m->lm_head, 0, c->vocab_size, 0, dim, &rk->lm_head)) != ST_OK) {
        return st;
    }
    if ((st = dev_wstage_release(rk)) != ST_OK) {
        return st;
    }
    LOG_DEBUG("rank %d: weights uploaded through %zu KiB of staging (%d matrices dequantized "
              "on the host)",
              rk->rank, rk->wstage_bytes >> 10, rk->n_host_uploads);

    /* RoPE frequencies: the CPU table. */
    {
        float inv[KN_ATTN_MAX_HEAD_DIM / 2];

        mdl_rope_inv_freq(c, inv);
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
    n_part = kn_attn_split_floats(sh->n_q, sh->n_kv, hd, rc->max_num_batched_tokens);
    if (dev_kq_fmt(rc->kv_dtype) != 0) {
        if (kn_kq_geom_init(&rk->kq, dev_kq_fmt(rc->kv_dtype), sh->n_kv, rc->block_size, hd) != 0) {
            LOG_ERROR("--kv-cache-dtype %s cannot group head_dim %d (int4 needs a multiple of 8)",
                      mdl_kv_dtype_name(rc->kv_dtype), hd);
            return ST_EUNSUPPORTED;
        }
        rk->stage_len += 5 * T; /* residual slot and own slot per token, fill jobs */
        rk->kq_filled = xmalloc(sizeof(int32_t) * T);
    }
    if (dev_tq_bits(rc->kv_dtype) != 0) {
        size_t n_sg, n_S;
        kn_tq_t *tq;

        if (dev_tq_strides(c, rc->block_size, rc->kv_dtype, sh->n_kv, &rk->tq_kstride,
                           &rk->tq_vstride, err, sizeof(err)) != ST_OK) {
            LOG_ERROR("--kv-cache-dtype %s: %s", mdl_kv_dtype_name(rc->kv_dtype), err);
            return ST_EUNSUPPORTED;
        }
        rk->tq_bits = dev_tq_bits(rc->kv_dtype);
        dev_tq_floats(c, rk->tq_bits, sh->n_kv, &n_sg, &n_S);
        tq = kn_tq_create_at(rk->tq_bits, c->n_layers, sh->n_kv, sh->kv0, hd);
        st = dev_alloc(rk, &rk->tq_sg, sizeof(float) * n_sg);
        if (st == ST_OK) {
            st = ops->upload(ctx, rk->tq_sg, kn_tq_layer_signs(tq, 0), sizeof(float) * n_sg);
        }
        if (st == ST_OK && n_S > 0 &&
            (st = dev_alloc(rk, &rk->tq_S, sizeof(float) * n_S)) == ST_OK) {
            st = ops->upload(ctx, rk->tq_S, kn_tq_layer_sketch(tq, 0), sizeof(float) * n_S);
        }
        kn_tq_destroy(tq);
        if (st != ST_OK) {
            return st;
        }
    }
    if ((st = mdl__dev_mass_init(rk)) != ST_OK) { /* h2o / snapkv: checks, stage rows */
        return st;
    }
    if ((st = dev_alloc(rk, &rk->x, sizeof(float) * T * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->part, sizeof(float) * T * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->qkv, sizeof(float) * T * lqkv)) != ST_OK ||
        (st = dev_alloc(rk, &rk->gu, sizeof(float) * T * 2 * (size_t)sh->n_f)) != ST_OK ||
        (st = dev_alloc(rk, &rk->h16, sizeof(uint16_t) * T * h16_cols)) != ST_OK ||
        (n_part > 0 && (st = dev_alloc(rk, &rk->attn_part, sizeof(float) * n_part)) != ST_OK) ||
        (st = dev_alloc(rk, &rk->hrows, sizeof(float) * S * dim)) != ST_OK ||
        (st = dev_alloc(rk, &rk->stage_dev, sizeof(int32_t) * rk->stage_len)) != ST_OK ||
        (st = ops->alloc_host(ctx, (void **)&rk->stage_host, sizeof(int32_t) * rk->stage_len)) !=
            ST_OK) {
        return st;
    }
    rk->q = rk->qkv;
    rk->k = rk->q + lq;
    rk->v = rk->k + lkv;
    rk->gate = rk->gu;
    rk->up = rk->gu + sh->n_f;
    if (rank == 0 &&
        ((st = dev_alloc(rk, &rk->logits_dev, sizeof(float) * S * c->vocab_size)) != ST_OK ||
         (st = ops->alloc_host(ctx, (void **)&rk->logits_host,
                               sizeof(float) * S * c->vocab_size)) != ST_OK)) {
        return st;
    }
    rk->blk_bytes = sizeof(uint16_t) * lkv * (size_t)rc->block_size;
    mdl__dev_graph_init(rk);
    rk->plan = xmalloc(sizeof(*rk->plan) * 2 * (size_t)c->n_layers *
                       (size_t)(rc->num_blocks + rc->swap_blocks));
    return ST_OK;
}

/* Bytes of one tier's blocks (all layers, K and V). */
static size_t
dev_tier_bytes(const mdl_dev_rank_t *rk, int32_t n_blocks)
{
    size_t per = rk->kq.fmt != 0 ? rk->kq.k_stride + rk->kq.v_stride
                 : rk->tq_bits != 0 ? rk->tq_kstride + rk->tq_vstride
                                    : 2 * rk->blk_bytes;

    return (size_t)rk->m->cfg.n_layers * (size_t)n_blocks * per;
}

size_t
mdl_dev_rank_kv_bytes(const mdl_dev_rank_t *rk)
{
    size_t b = dev_tier_bytes(rk, rk->rc.num_blocks);

    if (rk->kq.fmt != 0) {
        b += (size_t)dev_kq_slots(&rk->m->cfg, &rk->rc, rk->rc.num_blocks) *
             dev_kq_slot_bytes(&rk->m->cfg, rk->rc.block_size, rk->sh.n_kv);
        b += sizeof(int32_t) * (size_t)rk->rc.num_blocks; /* pending SHIFT per block */
    }
    return b + mdl__dev_mass_bytes(&rk->m->cfg, &rk->rc, rk->sh.n_kv, rk->rc.num_blocks);
}

/* A tier's residual slots (device or pinned) and bookkeeping. */
static int
dev_kq_tier_init(mdl_dev_rank_t *rk, int tier, int32_t n_blocks)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[tier];
    int32_t n_slots;
    size_t bytes;
    int st;

    t->n_blocks = n_blocks;
    if (n_blocks == 0) {
        return ST_OK;
    }
    n_slots = dev_kq_slots(&rk->m->cfg, &rk->rc, n_blocks);
    bytes = (size_t)n_slots * dev_kq_slot_bytes(&rk->m->cfg, rk->rc.block_size, rk->sh.n_kv);
    st = tier == 0 ? dev_alloc(rk, &t->res, bytes)
                   : rk->ops->alloc_host(rk->ctx, (void **)&t->res, bytes);
    if (st != ST_OK) {
        return st;
    }
    kn_kvslots_init(&t->sl, n_blocks, n_slots);
    t->qv = xcalloc((size_t)n_blocks, 1);
    t->shift = xcalloc((size_t)n_blocks, sizeof(int32_t));
    if (tier == 0) {
        size_t sb = sizeof(int32_t) * (size_t)n_blocks;

        if ((st = dev_alloc(rk, &t->shift_dev, sb)) != ST_OK ||
            (st = rk->ops->alloc_host(rk->ctx, (void **)&t->shift_pin, sb)) != ST_OK) {
            return st;
        }
    }
    return ST_OK;
}

static void
dev_kq_tier_fini(mdl_dev_rank_t *rk, int tier)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[tier];

    if (tier == 0) {
        rk->ops->free(rk->ctx, t->res);
    } else {
        rk->ops->free_host(rk->ctx, t->res);
    }
    rk->ops->free(rk->ctx, t->shift_dev);
    rk->ops->free_host(rk->ctx, t->shift_pin);
    free(t->shift);
    kn_kvslots_fini(&t->sl);
    free(t->qv);
    memset(t, 0, sizeof(*t));
}

int
mdl_dev_rank_alloc_kv(mdl_dev_rank_t *rk)
{
    int st = dev_alloc(rk, &rk->kv, dev_tier_bytes(rk, rk->rc.num_blocks));

    if (st == ST_OK && rk->rc.swap_blocks > 0) {
        st = rk->ops->alloc_host(rk->ctx, (void **)&rk->swap,
                                 dev_tier_bytes(rk, rk->rc.swap_blocks));
    }
    if (st == ST_OK && rk->kq.fmt != 0) {
        st = dev_kq_tier_init(rk, 0, rk->rc.num_blocks);
        if (st == ST_OK) {
            st = dev_kq_tier_init(rk, 1, rk->rc.swap_blocks);
        }
        if (st == ST_OK) {
            size_t res_bytes = (size_t)rk->kqt[0].sl.n_slots *
                               dev_kq_slot_bytes(&rk->m->cfg, rk->rc.block_size, rk->sh.n_kv);

            LOG_DEBUG("rank %d: %s KV, %zu + %zu bytes per block and layer, %d residual slots "
                      "(%zu MiB)",
                      rk->rank, mdl_kv_dtype_name(rk->rc.kv_dtype), rk->kq.k_stride,
                      rk->kq.v_stride, rk->kqt[0].sl.n_slots, res_bytes >> 20);
        }
    }
    if (st == ST_OK) {
        st = mdl__dev_mass_alloc(rk);
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
    mdl__dev_graph_fini(rk);
    if (rk->layers != NULL) {
        for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
            mdl_dev_layer_t *L = &rk->layers[l];
            void *ps[] = {L->attn_norm, L->ffn_norm, L->wqkv, L->bqkv,
                          L->wo,        L->w_gu,     L->w_down};

            for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
                o->free(rk->ctx, ps[i]);
            }
        }
    }
    free(rk->layers);
    void *dev[] = {rk->embd, rk->out_norm, rk->lm_head,    rk->inv_freq, rk->kv,   rk->x,
                   rk->part, rk->qkv,      rk->gu,
                   rk->h16,  rk->hrows,    rk->logits_dev, rk->stage_dev, rk->attn_part,
                   rk->tq_sg, rk->tq_S};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
        o->free(rk->ctx, dev[i]);
    }
    o->free_host(rk->ctx, rk->swap);
    o->free_host(rk->ctx, rk->wst_host);
    o->free(rk->ctx, rk->wst_dev);
    dev_kq_tier_fini(rk, 0);
    dev_kq_tier_fini(rk, 1);
    mdl__dev_mass_fini(rk);
    free(rk->kq_filled);
    o->free_host(rk->ctx, rk->logits_host);
    o->free_host(rk->ctx, rk->stage_host);
    free(rk->plan);
    memset(rk, 0, sizeof(*rk));
}

#define DEV_TRY(call)                                                                              \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        if (st_ != ST_OK) {                                                                        \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- quantized KV: residual slots --------------------------------------------- */

/* The (layer, kind) region of a tier: [n_blocks][stride of the kind]. */
static uint8_t *
dev_kq_region(const mdl_dev_rank_t *rk, int tier, int32_t layer, int kind)
{
    int32_t nb = rk->kqt[tier].n_blocks;
    uint8_t *base = tier == 0 ? rk->kv : rk->swap;

    return base + (size_t)layer * (size_t)nb * (rk->kq.k_stride + rk->kq.v_stride) +
           (size_t)kind * (size_t)nb * rk->kq.k_stride;
}

/* Rotates the key rows [0, n_rows) of every head and layer of residual
 * slot s of tier 0 by -delta in place. */
static int
dev_kq_rotate_slot(mdl_dev_rank_t *rk, int32_t s, int32_t n_rows, int32_t delta)
{
    const int32_t n_layers = rk->m->cfg.n_layers;
    const kn_kq_geom_t *g = &rk->kq;
    kn_kv_rotate_args_t ra = {rk->kqt[0].res + kn_kq_res_off(g, s, n_layers, 0, 0, 0),
                              NULL,
                              rk->inv_freq,
                              2 * kn_kq_lk(g),
                              (size_t)g->bs * (size_t)g->hd,
                              n_rows,
                              g->hd,
                              delta,
                              rk->dt};

    if (delta == 0 || n_rows <= 0) {
        return ST_OK;
    }
    return rk->ops->kv_rotate(rk->ctx, &ra, g->n_kv, n_layers);
}

/* Sets a block's pending shift (tier 0 marks the device copy stale). */
static void
dev_kq_set_shift(mdl_dev_rank_t *rk, int tier, int32_t blk, int32_t shift)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[tier];

    if (t->shift[blk] != shift) {
        t->shift[blk] = shift;
        t->shift_dirty |= tier == 0;
    }
}

/* Quantizes the rows written so far of slot s into its block (every
 * layer) and frees the slot. */
static int
dev_kq_flush(mdl_dev_rank_t *rk, int tier, int32_t s)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[tier];
    int32_t blk = t->sl.slot_blk[s];

    for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
        kn_kq_quant_args_t qa = {dev_kq_region(rk, tier, l, 0),
                                 dev_kq_region(rk, tier, l, 1),
                                 t->res,
                                 NULL,
                                 blk,
                                 s,
                                 t->sl.slot_fill[s],
                                 rk->m->cfg.n_layers,
                                 l,
                                 rk->kq};

        DEV_TRY(rk->ops->kq_quant(rk->ctx, &qa, 1));
    }
    t->qv[blk] = 1;
    dev_kq_set_shift(rk, tier, blk, 0); /* the slot's rows were rotated in place */
    kn_kvslots_release(&t->sl, blk);
    return ST_OK;
}

/* A slot for blk in *out (its contents undefined); when none is free,
 * flushes the least recently written slot other than `avoid` and not
 * written after stamp `guard` (slots of the running step are never
 * flushed). ST_ENOMEM when every slot is the running step's. */
static int
dev_kq_take(mdl_dev_rank_t *rk, int tier, int32_t blk, int32_t avoid, uint64_t guard,
            int32_t *out)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[tier];
    int32_t s;

    if (t->sl.n_free == 0) {
        int32_t victim = kn_kvslots_lru(&t->sl, avoid, guard);

        if (victim < 0) {
            LOG_ERROR("rank %d: all %d KV residual slots are in use by this step", rk->rank,
                      t->sl.n_slots);
            return ST_ENOMEM;
        }
        LOG_DEBUG("residual slots full: block %d quantized early", t->sl.slot_blk[victim]);
        DEV_TRY(dev_kq_flush(rk, tier, victim));
    }
    s = kn_kvslots_take(&t->sl, blk, ++rk->kq_stamp);
    *out = s;
    return ST_OK;
}

/* Whether taking a slot on this tier would flush one. */
static int
dev_kq_take_flushes(const mdl_dev_rank_t *rk, int tier)
{
    return rk->kqt[tier].sl.n_free == 0;
}

/* Before a step: residual slots for every written block (res_slot per
 * token), the fill jobs (block, slot, block_size) of blocks whose last
 * row the step writes, and each token's own-block slot (own_slot). */
static int
dev_kq_prepare(mdl_dev_rank_t *rk, const mdl_batch_t *b, int32_t *res_slot, int32_t *own_slot,
               int32_t *jobs, int32_t *n_jobs)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[0];
    const int32_t bs = rk->rc.block_size, n_layers = rk->m->cfg.n_layers;
    const uint64_t guard = rk->kq_stamp;

    *n_jobs = 0;
    rk->kq_n_filled = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t sl = b->slot_mapping[i], blk, off, s;

        res_slot[i] = -1;
        if (sl < 0) {
            continue;
        }
        blk = sl / bs;
        off = sl % bs;
        s = t->sl.slot_of[blk];
        if (s < 0) {
            DEV_TRY(dev_kq_take(rk, 0, blk, -1, guard, &s));
            if (t->qv[blk] && off > 0) {
                /* Its slot was flushed: continue from the codes. */
                for (int32_t l = 0; l < n_layers; l++) {
                    kn_kq_dequant_args_t da = {dev_kq_region(rk, 0, l, 0),
                                               dev_kq_region(rk, 0, l, 1),
                                               t->res,
                                               blk,
                                               s,
                                               n_layers,
                                               l,
                                               rk->kq};

                    DEV_TRY(rk->ops->kq_dequant(rk->ctx, &da, 1));
                }
                /* Codes of a shifted block: its rows take the rotation. */
                DEV_TRY(dev_kq_rotate_slot(rk, s, bs, t->shift[blk]));
                t->sl.slot_fill[s] = off;
            }
            t->qv[blk] = 0;
            dev_kq_set_shift(rk, 0, blk, 0);
        }
        res_slot[i] = s;
        t->sl.slot_fill[s] = off + 1 > t->sl.slot_fill[s] ? off + 1 : t->sl.slot_fill[s];
        t->sl.slot_used[s] = ++rk->kq_stamp;
        if (off == bs - 1) {
            jobs[3 * *n_jobs] = blk;
            jobs[3 * *n_jobs + 1] = s;
            jobs[3 * *n_jobs + 2] = bs;
            ++*n_jobs;
            rk->kq_filled[rk->kq_n_filled++] = blk;
        }
    }
    for (int32_t q = 0; q < b->n_seqs; q++) {
        const int32_t *bt = mdl_batch_table(b, q);

        for (int32_t i = b->query_start[q]; i < b->query_start[q + 1]; i++) {
            int32_t ctx = b->context_len[q] - (b->query_start[q + 1] - i);

            own_slot[i] = t->sl.slot_of[bt[ctx / bs]];
        }
    }
    return ST_OK;
}

/* After a step: blocks filled in it hold codes only. */
static void
dev_kq_end_step(mdl_dev_rank_t *rk)
{
    mdl_dev_kq_tier_t *t = &rk->kqt[0];

    for (int32_t i = 0; i < rk->kq_n_filled; i++) {
        int32_t blk = rk->kq_filled[i];

        t->qv[blk] = 1;
        kn_kvslots_release(&t->sl, blk);
    }
    rk->kq_n_filled = 0;
}

/* ---- copy / swap ------------------------------------------------------------------ */

static int
dev_is_copy(kv_op_kind_t k)
{
    return k == KV_OP_COPY || k == KV_OP_SWAP_OUT || k == KV_OP_SWAP_IN;
}

/* Enqueues the block ranges of the copy / swap ops among ops[0, n_ops)
 * (others skipped), in order. */
static int
dev_emit_copies(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    int32_t cap = rk->rc.num_blocks + rk->rc.swap_blocks;
    size_t kb = rk->kq.fmt != 0    ? rk->kq.k_stride
                : rk->tq_bits != 0 ? rk->tq_kstride
                                   : rk->blk_bytes;
    size_t vb = rk->kq.fmt != 0    ? rk->kq.v_stride
                : rk->tq_bits != 0 ? rk->tq_vstride
                                   : rk->blk_bytes;

    for (int32_t i0 = 0; i0 < n_ops;) {
        int32_t k = 0, n;

        if (!dev_is_copy(ops[i0].kind)) {
            i0++;
            continue;
        }
        /* A run of copy ops; the plan buffer holds `cap` ops' ranges. */
        while (i0 + k < n_ops && k < cap && dev_is_copy(ops[i0 + k].kind)) {
            k++;
        }
        n = kn_kvcopy_plan_kv(ops + i0, k, rk->m->cfg.n_layers, rk->rc.num_blocks,
                              rk->rc.swap_blocks, kb, vb, rk->plan);
        for (int32_t i = 0; i < n; i++) {
            const kn_kvcopy_t *p = &rk->plan[i];
            uint8_t *src = p->kind == KV_OP_SWAP_IN ? rk->swap : rk->kv;
            uint8_t *dst = p->kind == KV_OP_SWAP_OUT ? rk->swap : rk->kv;

            if (src == NULL || dst == NULL) {
                return ST_EINVAL; /* swap op without a swap tier */
            }
            DEV_TRY(rk->ops->copy(rk->ctx, dst + p->dst_off, src + p->src_off, p->bytes, p->kind));
        }
        i0 += k;
    }
    return ST_OK;
}

/* Quantized KV: the slots follow their blocks (the CPU store's copy_block).
 * Slot copies go on the stream at once; block copies are batched and
 * enqueued before any flush (which writes codes) and at the end. */
static int
dev_kq_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    const size_t slot_bytes = dev_kq_slot_bytes(&rk->m->cfg, rk->rc.block_size, rk->sh.n_kv);
    int32_t p0 = 0;

    for (int32_t i = 0; i < n_ops; i++) {
        const kv_op_t *o = &ops[i];
        int ts = o->kind == KV_OP_SWAP_IN ? 1 : 0, td = o->kind == KV_OP_SWAP_OUT ? 1 : 0;

        switch (o->kind) {
        case KV_OP_COPY:
        case KV_OP_SWAP_OUT:
        case KV_OP_SWAP_IN: {
            mdl_dev_kq_tier_t *S = &rk->kqt[ts], *D = &rk->kqt[td];
            int32_t ss, ds;

            if (S->n_blocks == 0 || D->n_blocks == 0) {
                return ST_EINVAL;
            }
            D->qv[o->dst] = S->qv[o->src];
            dev_kq_set_shift(rk, td, o->dst, S->shift[o->src]);
            ss = S->sl.slot_of[o->src];
            if (ss < 0) {
                kn_kvslots_release(&D->sl, o->dst);
                break;
            }
            ds = D->sl.slot_of[o->dst];
            if (ds < 0) {
                if (dev_kq_take_flushes(rk, td)) {
                    DEV_TRY(dev_emit_copies(rk, ops + p0, i + 1 - p0));
                    p0 = i + 1;
                }
                DEV_TRY(dev_kq_take(rk, td, o->dst, td == ts ? ss : -1, UINT64_MAX, &ds));
                ss = S->sl.slot_of[o->src];
            }
            DEV_TRY(rk->ops->copy(rk->ctx, (uint8_t *)D->res + (size_t)ds * slot_bytes,
                                  (uint8_t *)S->res + (size_t)ss * slot_bytes, slot_bytes,
                                  o->kind));
            D->sl.slot_fill[ds] = S->sl.slot_fill[ss];
            break;
        }
        case KV_OP_DROP:
        case KV_OP_DROP_SWAP: {
            mdl_dev_kq_tier_t *t = &rk->kqt[o->kind == KV_OP_DROP ? 0 : 1];

            if (t->n_blocks == 0) {
                return ST_EINVAL;
            }
            kn_kvslots_release(&t->sl, o->src);
            t->qv[o->src] = 0;
            dev_kq_set_shift(rk, o->kind == KV_OP_DROP ? 0 : 1, o->src, 0);
            break;
        }
        case KV_OP_SHIFT: {
            mdl_dev_kq_tier_t *t = &rk->kqt[0];
            int32_t s = t->sl.slot_of[o->src];

            if (o->dst < 0) {
                return ST_EINVAL;
            }
            if (s >= 0) { /* a partial block: its f32 rows rotate */
                DEV_TRY(dev_kq_rotate_slot(rk, s, t->sl.slot_fill[s], o->dst));
            } else if (o->dst != 0) { /* codes stay; attention rotates the query */
                dev_kq_set_shift(rk, 0, o->src, t->shift[o->src] + o->dst);
            }
            break;
        }
        default:
            return ST_EINVAL;
        }
    }
    return dev_emit_copies(rk, ops + p0, n_ops - p0);
}

/* A run of copy / swap ops over a 16-bit pool: the blocks, then their
 * attention mass (h2o / snapkv, model/dev_mass.c). */
static int
dev_emit_copies16(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    DEV_TRY(dev_emit_copies(rk, ops, n_ops));
    return mdl__dev_mass_block_ops(rk, ops, n_ops);
}

/* 16-bit pool: copies in runs, SHIFT rotates the block's key rows of
 * every layer in place, KV_OP_COPY_SLOT runs move single tokens (with
 * their mass), in op order. */
static int
dev_ops16(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    const size_t region_el = (size_t)rk->rc.num_blocks * rk->blk_bytes / sizeof(uint16_t);
    const size_t blk_el = rk->blk_bytes / sizeof(uint16_t);
    const int32_t bs = rk->rc.block_size, hd = rk->m->cfg.head_dim;
    int32_t p0 = 0;

    for (int32_t i = 0; i < n_ops; i++) {
        const kv_op_t *o = &ops[i];

        if (o->kind == KV_OP_COPY_SLOT) { /* h2o / snapkv compaction: a run of moves */
            int32_t k = 1;

            while (i + k < n_ops && ops[i + k].kind == KV_OP_COPY_SLOT) {
                k++;
            }
            DEV_TRY(dev_emit_copies16(rk, ops + p0, i - p0));
            DEV_TRY(mdl__dev_mass_moves(rk, ops + i, k));
            i += k - 1;
            p0 = i + 1;
            continue;
        }
        if (o->kind != KV_OP_SHIFT) {
            continue;
        }
        if (o->dst < 0) {
            return ST_EINVAL;
        }
        DEV_TRY(dev_emit_copies16(rk, ops + p0, i - p0));
        p0 = i + 1;
        if (o->dst != 0) {
            kn_kv_rotate_args_t ra = {NULL,
                                      (uint16_t *)rk->kv + (size_t)o->src * blk_el,
                                      rk->inv_freq,
                                      2 * region_el,
                                      (size_t)bs * (size_t)hd,
                                      bs,
                                      hd,
                                      o->dst,
                                      rk->dt};

            DEV_TRY(rk->ops->kv_rotate(rk->ctx, &ra, rk->sh.n_kv, rk->m->cfg.n_layers));
        }
    }
    return dev_emit_copies16(rk, ops + p0, n_ops - p0);
}

/* The (layer, kind) region of the device pool of a tq rank. */
static uint8_t *
dev_tq_region(const mdl_dev_rank_t *rk, int32_t layer, int kind)
{
    size_t nb = (size_t)rk->rc.num_blocks;

    return rk->kv + (size_t)layer * nb * (rk->tq_kstride + rk->tq_vstride) +
           (size_t)kind * nb * rk->tq_kstride;
}

/* tq pool: copies in runs; SHIFT re-encodes the block's keys of every
 * layer rotated (tq_shift), in op order; DROP has nothing to free. */
static int
dev_tq_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    int32_t p0 = 0;

    for (int32_t i = 0; i < n_ops; i++) {
        const kv_op_t *o = &ops[i];

        if (o->kind != KV_OP_SHIFT) {
            continue;
        }
        if (o->dst < 0 || o->src < 0 || o->src >= rk->rc.num_blocks) {
            return ST_EINVAL;
        }
        DEV_TRY(dev_emit_copies(rk, ops + p0, i - p0));
        p0 = i + 1;
        if (o->dst != 0) {
            kn_tq_shift_args_t sa = {
                .kc = dev_tq_region(rk, 0, 0),
                .layer_stride = (size_t)rk->rc.num_blocks * (rk->tq_kstride + rk->tq_vstride),
                .k_stride = rk->tq_kstride,
                .sg = rk->tq_sg,
                .S = rk->tq_S,
                .inv_freq = rk->inv_freq,
                .blk = o->src,
                .n_kv = rk->sh.n_kv,
                .hd = rk->m->cfg.head_dim,
                .bs = rk->rc.block_size,
                .bits = rk->tq_bits,
                .delta = o->dst,
            };

            DEV_TRY(rk->ops->tq_shift(rk->ctx, &sa, rk->m->cfg.n_layers));
        }
    }
    return dev_emit_copies(rk, ops + p0, n_ops - p0);
}

int
mdl_dev_rank_kv_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    if (rk->kq.fmt != 0) {
        DEV_TRY(dev_kq_ops(rk, ops, n_ops));
    } else if (rk->tq_bits != 0) {
        DEV_TRY(dev_tq_ops(rk, ops, n_ops));
    } else {
        DEV_TRY(dev_ops16(rk, ops, n_ops));
    }
    /* No sync: the host never reads or writes block bytes, and the next
     * forward's kernels run behind these copies on the same stream. */
    return ST_OK;
}

int
mdl__dev_fwd_run(mdl_dev_rank_t *rk, const mdl_dev_step_t *p)
{
    const mdl_dev_ops_t *o = rk->ops;
    void *cx = rk->ctx;
    const mdl_config_t *c = &rk->m->cfg;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t T = p->T, dim = c->dim, hd = c->head_dim, S = p->S;
    const int32_t lq = sh->n_q * hd, lkv = sh->n_kv * hd, lqkv = lq + 2 * lkv;
    const int32_t bs = rk->rc.block_size;
    const size_t region = (size_t)rk->rc.num_blocks * rk->blk_bytes;
    const kn_dt_t dt = rk->dt;
    const int kq = p->kq, tq = p->tq;
    const int32_t *d = rk->stage_dev;
    /* Split-K decode attention: the count follows T rounded up to a power
     * of two, never the contexts, so a graph records one and a step padded
     * to its bucket splits as it does eagerly (same bits). Never more
     * partials than T * kn_attn_n_splits(n_kv, T), what attn_part holds. */
    int32_t t2 = 1;

    while (t2 < T && t2 < KN_ATTN_SPLIT_BLOCKS) {
        t2 *= 2;
    }
    const int32_t n_splits = rk->attn_part != NULL && T <= rk->rc.max_num_batched_tokens
                                 ? kn_attn_n_splits(sh->n_kv, t2)
                                 : 1;

    kn_embed_args_t ea = {rk->embd, d, rk->x, dim, dt};
    DEV_TRY(o->embed(cx, &ea, T));

    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_dev_layer_t *L = &rk->layers[l];
        uint16_t *kc = kq || tq ? NULL : (uint16_t *)(rk->kv + ((size_t)l * 2 + 0) * region);
        uint16_t *vc = kq || tq ? NULL : (uint16_t *)(rk->kv + ((size_t)l * 2 + 1) * region);
        kn_rmsnorm_args_t na = {rk->x, L->attn_norm, rk->h16, dim, dim, c->norm_eps, dt};
        /* q and k heads are adjacent in a qkv row: one rotation for both. */
        kn_rope_args_t ra = {rk->q, d + p->o_pos, rk->inv_freq, sh->n_q + sh->n_kv, hd, lqkv};
        kn_kv_write_args_t kw = {kc, vc, rk->k, rk->v, d + p->o_slot, sh->n_kv, hd, bs, lqkv, dt,
                                 rk->mass != NULL ? rk->mass + (size_t)l * rk->mass_cells : NULL};
        kn_attn_cuda_args_t aa = {
            rk->h16,     rk->q,
            kc,          vc,
            d + p->o_qs, d + p->o_ctx,
            d + p->o_bt, p->max_blocks,
            S,           sh->n_q,
            sh->n_kv,    hd,
            bs,          c->sliding_window,
            lqkv,        1.0f / sqrtf((float)hd),
            dt,          rk->attn_part,
            n_splits,
        };
        kn_add_args_t ad = {rk->x, rk->part, (int64_t)T * dim};
        kn_rmsnorm_args_t fa = {rk->x, L->ffn_norm, rk->h16, dim, dim, c->norm_eps, dt};
        kn_silu_mul_args_t sm = {rk->gate, rk->up, rk->h16, sh->n_f, 2 * sh->n_f, dt};

        DEV_TRY(o->rmsnorm(cx, &na, T));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->wqkv, rk->qkv, T, dim, lqkv, 0));
        if (L->bqkv != NULL) {
            kn_bias_args_t ba = {rk->qkv, L->bqkv, lqkv, lqkv, dt};

            DEV_TRY(o->bias(cx, &ba, T));
        }
        DEV_TRY(o->rope(cx, &ra, T));
        if (kq) {
            /* New rows into the residual slots, then the blocks they fill
             * are quantized, all before attention reads. */
            uint8_t *kb = dev_kq_region(rk, 0, l, 0), *vb = dev_kq_region(rk, 0, l, 1);
            kn_kq_res_write_args_t rw = {rk->kqt[0].res, rk->k, rk->v, d + p->o_slot, d + p->o_rs,
                                         c->n_layers,    l,     lqkv,  rk->kq};
            kn_kq_quant_args_t qa = {kb,          vb, rk->kqt[0].res, d + p->o_jobs, 0, 0, 0,
                                     c->n_layers, l,  rk->kq};
            kn_kq_attn_args_t ka = {aa,          kb, vb,     rk->kqt[0].res,       d + p->o_own,
                                    c->n_layers, l,  rk->kq, rk->kqt[0].shift_dev, rk->inv_freq};

            DEV_TRY(o->kq_res_write(cx, &rw, T));
            if (p->n_jobs > 0) {
                DEV_TRY(o->kq_quant(cx, &qa, p->n_jobs));
            }
            DEV_TRY(o->kq_attention(cx, &ka, T));
        } else if (tq) {
            /* New rows encoded into their blocks, then attention reads;
             * q, k and v are columns of the qkv rows (stride lqkv). */
            const size_t lh = (size_t)l * (size_t)sh->n_kv;
            kn_tq_write_args_t tw = {
                .k = rk->k, .v = rk->v, .slot = d + p->o_slot,
                .kc = dev_tq_region(rk, l, 0), .vc = dev_tq_region(rk, l, 1),
                .sg = rk->tq_sg + lh * hd,
                .S = rk->tq_S != NULL ? rk->tq_S + lh * hd * hd : NULL,
                .k_stride = rk->tq_kstride, .v_stride = rk->tq_vstride,
                .n_kv = sh->n_kv, .hd = hd, .bs = bs, .bits = rk->tq_bits, .x_stride = lqkv,
            };
            kn_tq_attn_args_t ta = {
                .out = NULL, .q = rk->q, .kc = tw.kc, .vc = tw.vc, .sg = tw.sg, .S = tw.S,
                .query_start = d + p->o_qs, .context_len = d + p->o_ctx,
                .block_tables = d + p->o_bt, .k_stride = rk->tq_kstride,
                .v_stride = rk->tq_vstride, .max_blocks = p->max_blocks, .n_seqs = S,
                .n_heads = sh->n_q, .n_kv = sh->n_kv, .hd = hd, .bs = bs, .bits = rk->tq_bits,
                .sliding_window = c->sliding_window, .scale = 1.0f / sqrtf((float)hd),
                .out16 = rk->h16, .dt = dt, .q_stride = lqkv,
            };

            DEV_TRY(o->tq_write(cx, &tw, T));
            DEV_TRY(o->tq_attention(cx, &ta, T));
        } else if (p->n_tiles > 0) {
            DEV_TRY(o->kv_write(cx, &kw, T)); /* every new K/V lands before attention reads */
            kn_attn_prefill_args_t pa = {aa, d + p->o_tiles, p->q_tile};

            DEV_TRY(o->attention_prefill(cx, &pa, p->n_tiles));
        } else {
            DEV_TRY(o->kv_write(cx, &kw, T));
            DEV_TRY(o->attention(cx, &aa, T)); /* decode and verification steps */
        }
        if (p->mass) { /* h2o / snapkv: the rows' probabilities into the mass (dev_mass.c) */
            DEV_TRY(mdl__dev_mass_layer(rk, p, &aa, l));
        }
        /* Row-parallel projections: at T = 1 the GEMM adds into x itself;
         * at T > 1 the partial is all-reduced first. */
        if (o->allreduce == NULL) {
            DEV_TRY(o->gemm(cx, dt, rk->h16, L->wo, rk->x, T, lq, dim, 1));
        } else {
            DEV_TRY(o->gemm(cx, dt, rk->h16, L->wo, rk->part, T, lq, dim, 0));
            DEV_TRY(o->allreduce(cx, rk->part, (size_t)T * dim));
            DEV_TRY(o->add(cx, &ad));
        }

        DEV_TRY(o->rmsnorm(cx, &fa, T));
        DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_gu, rk->gu, T, dim, 2 * sh->n_f, 0));
        DEV_TRY(o->silu_mul(cx, &sm, T));
        if (o->allreduce == NULL) {
            DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_down, rk->x, T, sh->n_f, dim, 1));
        } else {
            DEV_TRY(o->gemm(cx, dt, rk->h16, L->w_down, rk->part, T, sh->n_f, dim, 0));
            DEV_TRY(o->allreduce(cx, rk->part, (size_t)T * dim));
            DEV_TRY(o->add(cx, &ad));
        }
    }

    if (rk->rank == 0 && p->n_logits > 0) {
        kn_gather_args_t ga = {rk->x, d + p->o_rows, rk->hrows, dim};
        kn_rmsnorm_args_t on = {rk->hrows, rk->out_norm, rk->h16, dim, dim, c->norm_eps, dt};

        DEV_TRY(o->gather(cx, &ga, p->n_logits));
        DEV_TRY(o->rmsnorm(cx, &on, p->n_logits));
        DEV_TRY(o->gemm(cx, dt, rk->h16, rk->lm_head, rk->logits_dev, p->n_logits, dim,
                        c->vocab_size, 0));
    }
    return ST_OK;
}

int
mdl_dev_rank_forward(mdl_dev_rank_t *rk, const mdl_batch_t *b)
{
    const mdl_dev_ops_t *o = rk->ops;
    void *cx = rk->ctx;
    const mdl_config_t *c = &rk->m->cfg;
    const int32_t T = b->n_tokens, S = b->n_seqs, bs = rk->rc.block_size;

    if (mdl__dev_graph_takes(rk, b)) {
        return mdl__dev_graph_forward(rk, b);
    }
    rk->n_eager_steps++;

    /* Stage the batch: one pinned buffer, one copy. */
    int32_t *h = rk->stage_host;
    /* Block tables go up as [S][mbw]: the batch's own layout, or, from
     * persistent rows (mdl_batch_t.table_rows), each sequence's row cut to
     * the widest table the step reads. */
    int32_t mbw = b->max_blocks;
    if (b->table_rows != NULL) {
        mbw = 1;
        for (int32_t s = 0; s < S; s++) {
            int32_t nb = (b->context_len[s] + bs - 1) / bs;
            mbw = nb > mbw ? nb : mbw;
        }
    }
    mdl_dev_step_t p = {.T = T, .S = S, .n_logits = b->n_logits, .max_blocks = mbw};

    p.o_pos = (size_t)T;
    p.o_slot = p.o_pos + T;
    p.o_qs = p.o_slot + T;
    p.o_ctx = p.o_qs + S + 1;
    p.o_rows = p.o_ctx + S;
    p.o_bt = p.o_rows + (size_t)b->n_logits;
    p.o_tiles = p.o_bt + (size_t)S * mbw;
    p.q_tile = kn_attn_prefill_q_tile(c->n_heads / c->n_kv_heads);
    p.kq = rk->kq.fmt != 0;
    p.tq = rk->tq_bits != 0;
    size_t n_int = p.o_tiles;

    memcpy(h, b->tokens, sizeof(int32_t) * T);
    memcpy(h + p.o_pos, b->positions, sizeof(int32_t) * T);
    memcpy(h + p.o_slot, b->slot_mapping, sizeof(int32_t) * T);
    memcpy(h + p.o_qs, b->query_start, sizeof(int32_t) * (S + 1));
    memcpy(h + p.o_ctx, b->context_len, sizeof(int32_t) * S);
    if (b->n_logits > 0) {
        memcpy(h + p.o_rows, b->logits_rows, sizeof(int32_t) * b->n_logits);
    }
    if (b->table_rows != NULL) {
        for (int32_t s = 0; s < S; s++) {
            memcpy(h + p.o_bt + (size_t)s * mbw, mdl_batch_table(b, s), sizeof(int32_t) * mbw);
        }
    } else {
        memcpy(h + p.o_bt, b->block_tables, sizeof(int32_t) * (size_t)S * mbw);
    }
    if (T > S && !p.kq && !p.tq && !mdl__dev_step_short(rk, b)) {
        /* Prefill chunks present: query tiles for the prefill kernel. A
         * verification step (rows of at most 1 + spec_k tokens) keeps the
         * per-token kernel, as its graph (model/dev_graph.c) does. */
        for (int32_t s = 0; s < S; s++) {
            for (int32_t t0 = b->query_start[s]; t0 < b->query_start[s + 1]; t0 += p.q_tile) {
                h[p.o_tiles + (size_t)p.n_tiles++] = t0;
            }
        }
        n_int += (size_t)p.n_tiles;
    }
    /* Quantized KV: residual slot and own-block slot per token, fill jobs. */
    p.o_rs = n_int;
    p.o_own = p.o_rs + T;
    p.o_jobs = p.o_own + T;
    if (p.kq) {
        DEV_TRY(dev_kq_prepare(rk, b, h + p.o_rs, h + p.o_own, h + p.o_jobs, &p.n_jobs));
        n_int = p.o_jobs + 3 * (size_t)p.n_jobs;
        if (rk->kqt[0].shift_dirty) { /* pending shifts changed since the last step */
            mdl_dev_kq_tier_t *t0 = &rk->kqt[0];

            memcpy(t0->shift_pin, t0->shift, sizeof(int32_t) * (size_t)t0->n_blocks);
            DEV_TRY(o->copy(cx, t0->shift_dev, t0->shift_pin,
                            sizeof(int32_t) * (size_t)t0->n_blocks, KV_OP_SWAP_IN));
            t0->shift_dirty = 0;
        }
    }
    p.o_mass = n_int;
    p.mass = rk->mass != NULL && b->mass_rows != NULL;
    if (p.mass) { /* h2o / snapkv: which rows accumulate attention mass */
        for (int32_t t = 0; t < T; t++) {
            h[p.o_mass + (size_t)t] = b->mass_rows[t] != 0;
        }
        n_int += (size_t)T;
        rk->n_mass_steps++;
    }
    DEV_TRY(o->copy(cx, rk->stage_dev, h, sizeof(int32_t) * n_int, KV_OP_SWAP_IN));
    DEV_TRY(mdl__dev_fwd_run(rk, &p));
    if (rk->rank == 0 && b->n_logits > 0) {
        DEV_TRY(o->copy(cx, rk->logits_host, rk->logits_dev,
                        sizeof(float) * (size_t)b->n_logits * c->vocab_size, KV_OP_SWAP_OUT));
    }
    DEV_TRY(o->sync(cx));
    if (p.kq) {
        dev_kq_end_step(rk);
    }
    return ST_OK;
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
    size_t layer, h16_cols = dim, stage_len, res = 0;

    /* norms, wqkv, wo, w_gate|w_up, w_down (+ bq|bk|bv) */
    layer = 2 * dev_grain(e * dim) + dev_grain(e * (lq + 2 * lkv) * dim) + dev_grain(e * dim * lq) +
            dev_grain(e * 2 * nf * dim) + dev_grain(e * dim * nf);
    if (c->qkv_bias) {
        layer += dev_grain(e * (lq + 2 * lkv));
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
    if (dev_kq_fmt(rc->kv_dtype) != 0) {
        /* Quantized KV: the staging's slot columns and the residual slots. */
        stage_len += 5 * T;
        int32_t nb = rc->num_blocks > 0 ? rc->num_blocks : INT32_MAX;

        res = dev_grain((size_t)dev_kq_slots(c, rc, nb) *
                        dev_kq_slot_bytes(c, rc->block_size, sh->n_kv));
    }
    if (dev_tq_bits(rc->kv_dtype) != 0) { /* rotation signs and sketches */
        size_t n_sg, n_S;

        dev_tq_floats(c, dev_tq_bits(rc->kv_dtype), sh->n_kv, &n_sg, &n_S);
        res = dev_grain(f * n_sg) + (n_S > 0 ? dev_grain(f * n_S) : 0);
    }
    if (rc->kv_mass) { /* h2o / snapkv: mass rows, a mass read's and the moves' staging */
        size_t cap = (size_t)rc->max_blocks_per_seq * (size_t)rc->block_size;

        stage_len += T;
        res += 2 * dev_grain(sizeof(int32_t) * cap) +
               dev_grain(f * cap * (size_t)c->n_layers * (size_t)sh->n_kv) +
               dev_grain(f * (size_t)rc->block_size * (size_t)sh->n_kv);
    }
    /* x, part, qkv, gate|up, h16, split-K partials, hrows, staging, logits */
    *a = res + dev_grain(f * kn_attn_split_floats(sh->n_q, sh->n_kv, c->head_dim, (int32_t)T)) +
         2 * dev_grain(f * T * dim) + dev_grain(f * T * (lq + 2 * lkv)) +
         dev_grain(f * T * 2 * nf) + dev_grain(e * T * h16_cols) + dev_grain(f * S * dim) +
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
    out->reserve_bytes = rc->dev_reserve_bytes > MDL_DEV_RESERVE_BYTES ? rc->dev_reserve_bytes
                                                                       : MDL_DEV_RESERVE_BYTES;
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
        if (dev_kq_fmt(rc->kv_dtype) != 0) {
            kn_kq_geom_t g;

            if (kn_kq_geom_init(&g, dev_kq_fmt(rc->kv_dtype), sh.n_kv, rc->block_size,
                                c->head_dim) != 0) {
                snprintf(err, errlen, "cannot size the KV pool: --kv-cache-dtype %s cannot group "
                                      "head_dim %d",
                         mdl_kv_dtype_name(rc->kv_dtype), c->head_dim);
                return ST_EUNSUPPORTED;
            }
            out->block_bytes = (size_t)c->n_layers * (g.k_stride + g.v_stride);
        }
        if (dev_tq_bits(rc->kv_dtype) != 0) {
            size_t ks, vs;

            if (dev_tq_strides(c, rc->block_size, rc->kv_dtype, sh.n_kv, &ks, &vs, why,
                               sizeof(why)) != ST_OK) {
                snprintf(err, errlen, "cannot size the KV pool: --kv-cache-dtype %s: %s",
                         mdl_kv_dtype_name(rc->kv_dtype), why);
                return ST_EUNSUPPORTED;
            }
            out->block_bytes = (size_t)c->n_layers * (ks + vs);
        }
        out->block_bytes += mdl__dev_mass_bytes(c, rc, sh.n_kv, 1); /* h2o / snapkv */
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
