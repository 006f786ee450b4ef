/* forward_cpu.c - the CPU backend: the one Llama layer of the CPU, at any
 * tensor-parallel size T >= 1 (DESIGN.md sections 3, 4, 6; model/tp.h).
 *
 * DESIGN. One step runs every new token of every sequence through each
 * layer together, so each weight matrix is read once per step whatever
 * the mix of prefill chunks and decodes (GEMMs over all n_tokens rows).
 * Rank r of T holds its shard of the heads and of the FFN (model/tp.h);
 * at T = 1 the shard is the whole model and rank 0 is the engine thread:
 *
 *   x = embed(tokens)                                   (T, dim), every rank
 *   per layer:
 *     h = rmsnorm(x)
 *     q, k, v = h Wq_r^T (+bq), h Wk_r^T (+bk), h Wv_r^T (+bv)   its heads
 *     rope(q, k);  K/V cache_r[slot_mapping[t]] = k[t], v[t]  (write first)
 *     a = paged_attention(q, cache_r, block_tables)      (T, n_q * hd)
 *     x += sum over ranks of a Wo_r^T                    (row-parallel)
 *     h = rmsnorm(x);  g = silu(h Wg_r^T) * h Wu_r^T      (T, n_f)
 *     x += sum over ranks of g Wd_r^T
 *   (the last layer past its K/V write runs only on the logits rows)
 *   rank 0: logits = rmsnorm(x[logits_rows]) lm_head^T   (n_logits, vocab)
 *   rank 0: hidden = rmsnorm(x[hidden_rows])  (n_hidden, dim; embeddings: the
 *           last layer then runs on every row)
 *
 * "x += sum over ranks" is one GEMM accumulating into x at T = 1 (fused
 * residual add); at T > 1 each rank's partial product is summed by the
 * shared-memory all-reduce (kernels/comm.h), whose result is bitwise the
 * same on every rank, so the replicated parts stay in step. Column-parallel
 * shards point into the model's weights (their rows are contiguous);
 * row-parallel shards (wo, w_down) are the model's own at T = 1 and column
 * copies made once at creation at T > 1.
 *
 * KV pool (the device tier is host memory): each rank owns a
 * model/host_kv.h store of its KV heads, f32 regions
 * [num_blocks][n_kv][block_size][head_dim] per layer and kind, or the
 * compressed KIVI store of kernels/cpu/kv_quant.h for the other dtypes (a
 * quantization group never spans KV heads, so rank r keeps its heads'
 * codes, scales and residual slots). kv_ops run on every rank's slice of a
 * block. Both tiers are anonymous mmaps, populated when mapped (so the
 * memory is committed before the server reports ready). Activations are sized for max_num_batched_tokens rows and logits
 * for max_num_seqs rows at creation; forward() allocates nothing.
 *
 * Thread: the engine thread; at T > 1 ranks 1 .. T-1 run on the rank
 * threads of kn_ranks_run() while the engine thread runs rank 0.
 */
#define LOG_MODULE "cpu"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_fused.h"
#include "kernels/cpu/kn_quant.h"
#include "model/backend.h"
#include "model/cpu_repack.h"
#include "model/host_kv.h"
#include "model/model_int.h"
#include "model/tp.h"

/* One rank's view of one layer's weights, in their file's types
 * (kernels/cpu/kn_quant.h). */
typedef struct cpu_layer {
    kn_weight_t wq, wk, wv;     /* rows of the model's weights */
    const float *bq, *bk, *bv;  /* or NULL */
    kn_weight_t wo;             /* [dim][n_q * hd] */
    kn_weight_t w_gate, w_up;   /* rows [f0, f0 + n_f) */
    kn_weight_t w_down;         /* [dim][n_f] */
    void *own_wo, *own_down;    /* column copies at T > 1, else NULL */
    void *own_r8[7];            /* repacked q4_K / q6_K / q8_0 (model/cpu_repack.h), or NULL */
} cpu_layer_t;

typedef struct cpu_rank {
    mdl_tp_shard_t sh;
    cpu_layer_t *layers; /* [n_layers] */
    host_kv_t kv;        /* this rank's KV heads, both tiers */
    /* Scratch, rows = max_num_batched_tokens (T). */
    float *x, *h;         /* (T, dim) residual stream, normed */
    float *q, *att;       /* (T, n_q * hd) */
    float *k, *v;         /* (T, n_kv * hd) */
    float *gate, *up;     /* (T, n_f) */
    float *part;          /* (T, dim) row-parallel partial product (T > 1) */
    float *cos_t, *sin_t; /* (T, hd / 2) */
    /* The last layer's sub-batch, rows = max_num_seqs (S). */
    float *hrows;   /* (S, dim) residual rows that need logits */
    float *sub_h;   /* (S, dim) their normed rows */
    float *sub_q;   /* (S, n_q * hd) */
    float *sub_att; /* (S, n_q * hd) */
    void *scratch;  /* the one allocation behind every scratch pointer */
    kn_act_t act;   /* the input of the weights being applied */
    size_t r8_bytes; /* q4_K / q6_K / q8_0 bytes repacked (model/cpu_repack.h) */
    int32_t r8_n;    /* and matrices */
    void *act_buf;  /* its quantized forms: kn_act_bytes(max(T, S), widest input) */
    int bf16_medium; /* act.bf16_medium of every input (--matmul-precision medium) */
} cpu_rank_t;

typedef struct cpu_state {
    const mdl_model_t *m;
    mdl_config_t c;
    mdl_runtime_config_t rc;
    int32_t tp;
    cpu_rank_t *ranks;   /* [tp] */
    kn_comm_t *comm;     /* T > 1 */
    kn_ranks_t *threads; /* T > 1 */
    float *inv_freq;     /* (hd / 2) */
    /* lm_head (rank 0) and the embedding table as the kernels read them:
     * the model's, or lm_head repacked (model/cpu_repack.h) in own_head,
     * the embedding too when it is tied to lm_head. */
    kn_weight_t head, embd;
    void *own_head;
    float *logits;       /* (S, vocab), rank 0 */
    float *hidden;       /* (max_num_batched_tokens, dim), rank 0: b->hidden_rows */
    /* The last layer's sub-batch, the same on every rank (cpu_sub_batch). */
    int32_t *sub_qs;  /* (S + 1) */
    int32_t *sub_ctx; /* (S) */
    int32_t *sub_bt;  /* (S, max_blocks_per_seq) */
    int32_t *sub_rows; /* (S) persistent table rows (mdl_batch_t.table_rows) */
    /* The current call, read by every rank. */
    const mdl_batch_t *b;
    int sub; /* the last layer runs on the logits rows only */
    const kv_op_t *ops;
    int32_t n_ops;
} cpu_state_t;

static void
cpu_destroy(void *state)
{
    cpu_state_t *s = state;

    if (s == NULL) {
        return;
    }
    kn_ranks_destroy(s->threads);
    kn_comm_destroy(s->comm);
    for (int32_t r = 0; s->ranks != NULL && r < s->tp; r++) {
        cpu_rank_t *rk = &s->ranks[r];

        for (int32_t l = 0; rk->layers != NULL && l < s->c.n_layers; l++) {
            free(rk->layers[l].own_wo);
            free(rk->layers[l].own_down);
            for (int i = 0; i < 7; i++) {
                free(rk->layers[l].own_r8[i]);
            }
        }
        free(rk->layers);
        host_kv_destroy(&rk->kv);
        free(rk->scratch);
        free(rk->act_buf);
    }
    free(s->ranks);
    free(s->own_head);
    free(s->inv_freq);
    free(s->logits);
    free(s->hidden);
    free(s->sub_qs);
    free(s->sub_ctx);
    free(s->sub_bt);
    free(s->sub_rows);
    free(s);
}

/* Rows [r0, r0 + n) of w: a view into the same bytes. */
static kn_weight_t
cpu_rows(const kn_weight_t *w, int32_t r0, int32_t n)
{
    kn_weight_t v = *w;

    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.rows = n;
    return v;
}

/* Columns [c0, c0 + n) of w, copied into *own (freed by the caller): the
 * same type when the slice is made of whole blocks, else dequantized to
 * f32. */
static kn_weight_t
cpu_cols(const kn_weight_t *w, int32_t c0, int32_t n, void **own)
{
    int32_t blk = kn_wtype_block_elems(w->type);
    kn_weight_t v = *w;

    v.cols = n;
    if (c0 % blk == 0 && n % blk == 0) {
        size_t off = (size_t)(c0 / blk) * kn_wtype_block_bytes(w->type);

        v.row_bytes = kn_wtype_row_bytes(w->type, n);
        *own = xmalloc(v.row_bytes * (size_t)w->rows);
        for (int32_t i = 0; i < w->rows; i++) {
            memcpy((char *)*own + (size_t)i * v.row_bytes,
                   (const char *)w->data + (size_t)i * w->row_bytes + off, v.row_bytes);
        }
    } else {
        float *row = xmalloc(sizeof(float) * (size_t)w->cols);
        float *out = xmalloc(sizeof(float) * (size_t)w->rows * (size_t)n);

        LOG_DEBUG("%s columns [%d, %d) are not whole blocks: the shard is f32",
                  kn_wtype_name(w->type), c0, c0 + n);
        for (int32_t i = 0; i < w->rows; i++) {
            kn_dequant_row(w->type, (const char *)w->data + (size_t)i * w->row_bytes, row,
                           w->cols);
            memcpy(out + (size_t)i * n, row + c0, sizeof(float) * (size_t)n);
        }
        free(row);
        *own = out;
        v.type = KN_W_F32;
        v.row_bytes = sizeof(float) * (size_t)n;
    }
    v.data = *own;
    return v;
}

/* Rank r's weight shards, KV store and scratch. */
static int
cpu_rank_init(cpu_state_t *s, int32_t r, char *err, size_t errlen)
{
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    cpu_rank_t *rk = &s->ranks[r];
    int32_t hd = c->head_dim;
    size_t T = (size_t)s->rc.max_num_batched_tokens, S = (size_t)s->rc.max_num_seqs;
    int st = mdl_tp_shard(c, s->tp, r, &rk->sh, err, errlen);

    if (st != ST_OK) {
        return st;
    }
    const mdl_tp_shard_t *sh = &rk->sh;

    rk->layers = xcalloc((size_t)c->n_layers, sizeof(*rk->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        cpu_layer_t *cl = &rk->layers[l];
        size_t qoff = (size_t)sh->q0 * hd, kvoff = (size_t)sh->kv0 * hd;

        cl->wq = cpu_rows(&L->wq, (int32_t)qoff, sh->n_q * hd);
        cl->wk = cpu_rows(&L->wk, (int32_t)kvoff, sh->n_kv * hd);
        cl->wv = cpu_rows(&L->wv, (int32_t)kvoff, sh->n_kv * hd);
        cl->bq = L->bq != NULL ? L->bq + qoff : NULL;
        cl->bk = L->bk != NULL ? L->bk + kvoff : NULL;
        cl->bv = L->bv != NULL ? L->bv + kvoff : NULL;
        cl->w_gate = cpu_rows(&L->w_gate, sh->f0, sh->n_f);
        cl->w_up = cpu_rows(&L->w_up, sh->f0, sh->n_f);
        if (s->tp == 1) {
            cl->wo = L->wo;
            cl->w_down = L->w_down;
        } else {
            cl->wo = cpu_cols(&L->wo, sh->q0 * hd, sh->n_q * hd, &cl->own_wo);
            cl->w_down = cpu_cols(&L->w_down, sh->f0, sh->n_f, &cl->own_down);
        }
        kn_weight_t *ws[7] = {&cl->wq, &cl->wk, &cl->wv, &cl->w_gate, &cl->w_up, &cl->wo,
                              &cl->w_down};
        void **srcs[7] = {NULL, NULL, NULL, NULL, NULL, s->tp > 1 ? &cl->own_wo : NULL,
                          s->tp > 1 ? &cl->own_down : NULL};

        for (int i = 0; i < 7; i++) {
            size_t n = mdl__cpu_repack(m, ws[i], &cl->own_r8[i], srcs[i]);

            rk->r8_bytes += n;
            rk->r8_n += n > 0;
        }
    }

    char why[256];

    st = host_kv_create(&rk->kv, c, sh->kv0, sh->n_kv, &s->rc, why, sizeof(why));
    if (st != ST_OK) {
        if (s->tp == 1) {
            snprintf(err, errlen, "%s", why);
        } else {
            snprintf(err, errlen, "rank %d: %s", r, why);
        }
        return st;
    }

    /* Carve every scratch buffer out of one 64-byte aligned block. */
    size_t lq = (size_t)sh->n_q * hd, lkv = (size_t)sh->n_kv * hd, half = (size_t)hd / 2;
    size_t part = s->tp > 1 ? T * c->dim : 0;
    size_t sizes[] = {
        T * c->dim, T * c->dim, T * lq,     T * lq,     T * lkv, T * lkv, T * sh->n_f,
        T * sh->n_f, part,      T * half,   T * half,   S * c->dim, S * c->dim, S * lq,
        S * lq,
    };
    float **ptrs[] = {
        &rk->x,  &rk->h,    &rk->q,     &rk->att,   &rk->k,     &rk->v,     &rk->gate,
        &rk->up, &rk->part, &rk->cos_t, &rk->sin_t, &rk->hrows, &rk->sub_h, &rk->sub_q,
        &rk->sub_att,
    };
    size_t total = 0;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    if (posix_memalign(&rk->scratch, 64, total * sizeof(float)) != 0) {
        rk->scratch = NULL;
        if (s->tp == 1) {
            snprintf(err, errlen, "cannot allocate %zu MiB of activations",
                     (total * sizeof(float)) >> 20);
        } else {
            snprintf(err, errlen, "rank %d: cannot allocate %zu MiB of activations", r,
                     (total * sizeof(float)) >> 20);
        }
        return ST_ENOMEM;
    }
    memset(rk->scratch, 0, total * sizeof(float));
    float *p = rk->scratch;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *ptrs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    /* One input is live at a time: h (q, k, v; gate, up), att (wo), gate
     * (w_down), or the logits rows (lm_head). */
    size_t widest = (size_t)c->dim > lq ? (size_t)c->dim : lq;

    widest = (size_t)sh->n_f > widest ? (size_t)sh->n_f : widest;
    int32_t act_tok = (int32_t)(T > S ? T : S);
    size_t act_bytes = kn_act_bytes(act_tok, (int32_t)widest);

    rk->act_buf = xmalloc(act_bytes);
    /* Commit the pages now (a stable peak RSS), but not the bf16 form's
     * when no matrix is BF16: nothing would read or write them. */
    if (m->type_bytes[KN_W_BF16] == 0) {
        act_bytes -= kn_act_bytes_bf16(act_tok, (int32_t)widest);
    }
    memset(rk->act_buf, 0, act_bytes);
    rk->bf16_medium = s->rc.matmul_precision == MDL_MATMUL_MEDIUM;
    return ST_OK;
}

static int
cpu_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, void **state, char *err,
           size_t errlen)
{
    const mdl_config_t *c = &m->cfg;
    size_t S = (size_t)rc->max_num_seqs;
    cpu_state_t *s;
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
    size_t r8_bytes = 0;
    int32_t r8_n = 0;

    /* lm_head first: while it is repacked the resident set holds its file
     * pages and the copy, and little else yet. */
    s->head = m->lm_head;
    s->embd = m->tok_embd;
    {
        int tied = m->lm_head.data == m->tok_embd.data;
        size_t n = mdl__cpu_repack(m, &s->head, &s->own_head, NULL);

        if (n > 0 && tied) { /* the lookup reads the repacked rows (kn_embed_w) */
            s->embd = s->head;
        }
        r8_bytes += n;
        r8_n += n > 0;
    }
    for (int32_t r = 0; r < s->tp; r++) {
        st = cpu_rank_init(s, r, err, errlen);
        if (st != ST_OK) {
            goto fail;
        }
        r8_bytes += s->ranks[r].r8_bytes;
        r8_n += s->ranks[r].r8_n;
    }
    if (r8_n > 0) {
        LOG_INFO("repacked %d matrices (%.1f MiB) for the CPU kernels (q4_k, q6_k 8, q8_0 16 "
                 "rows at a time)",
                 r8_n, (double)r8_bytes / (1024.0 * 1024.0));
    }
    s->inv_freq = xmalloc(sizeof(float) * (size_t)(c->head_dim / 2));
    s->logits = xcalloc(S * (size_t)c->vocab_size, sizeof(float));
    memset(s->logits, 0, sizeof(float) * S * (size_t)c->vocab_size); /* commit the pages */
    s->hidden = xcalloc((size_t)rc->max_num_batched_tokens * (size_t)c->dim, sizeof(float));
    memset(s->hidden, 0, sizeof(float) * (size_t)rc->max_num_batched_tokens * (size_t)c->dim);
    s->sub_qs = xcalloc(S + 1, sizeof(int32_t));
    s->sub_ctx = xcalloc(S, sizeof(int32_t));
    s->sub_bt = xcalloc(S * (size_t)rc->max_blocks_per_seq, sizeof(int32_t));
    s->sub_rows = xcalloc(S, sizeof(int32_t));

    mdl_rope_inv_freq(c, s->inv_freq);
    for (int32_t r = 0; r < s->tp; r++) {
        host_kv_set_rope(&s->ranks[r].kv, s->inv_freq);
    }
    kn_cpu_init(rc->n_threads);
    if (s->tp > 1) {
        st = kn_comm_create(s->tp, &s->comm);
        if (st == ST_OK) {
            st = kn_ranks_create(s->tp, &s->threads);
        }
        if (st != ST_OK) {
            snprintf(err, errlen, "cannot start %d rank threads: %s", s->tp, st_str(st));
            goto fail;
        }
    }
    if (rc->matmul_precision == MDL_MATMUL_MEDIUM) {
        LOG_INFO("matmul precision medium: BF16 weights (%.1f MiB) multiply activations rounded "
                 "to one bf16 term (up to 2^-9 relative; high keeps f32 accuracy)%s",
                 (double)m->type_bytes[KN_W_BF16] / (1024.0 * 1024.0),
                 m->type_bytes[KN_W_BF16] == 0 ? ": no BF16 weight here, no effect" : "");
    }
    LOG_DEBUG("cpu backend: %s kernels, %d threads, tensor parallel %d (%d query heads, %d KV "
              "heads, FFN %d per rank), KV cache %s, %zu MiB per rank",
              kn_isa_name(kn_cpu_isa()), kn_cpu_threads(), s->tp, sh.n_q, sh.n_kv, sh.n_f,
              mdl_kv_dtype_name(rc->kv_dtype), s->ranks[0].kv.kv_len >> 20);
    *state = s;
    return ST_OK;

fail:
    cpu_destroy(s);
    return st;
}

static int
cpu_rank_kv_ops(void *arg, int r)
{
    cpu_state_t *s = arg;

    return host_kv_ops(&s->ranks[r].kv, s->ops, s->n_ops);
}

static int
cpu_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    cpu_state_t *s = state;

    if (s->tp == 1) {
        return host_kv_ops(&s->ranks[0].kv, ops, n_ops);
    }
    s->ops = ops;
    s->n_ops = n_ops;
    return kn_ranks_run(s->threads, cpu_rank_kv_ops, s);
}

/* in (n, d_in) becomes the input of the next weights: their products
 * share its quantized forms (kn_quant.h). */
static kn_act_t *
cpu_input(cpu_rank_t *rk, const float *in, int32_t n, int32_t d_in)
{
    kn_act_init(&rk->act, in, n, d_in, rk->act_buf);
    rk->act.bf16_medium = rk->bf16_medium;
    return &rk->act;
}

/* The act to quantize along with the op that makes the input of weights
 * w[0 .. n): a when one of them is a Q type, else NULL (the 8-bit form is
 * then never read). Making it there, in the op's region, rather than
 * lazily in the product's, saves a region (kn_fused.h); the bits are the
 * same. */
static kn_act_t *
cpu_q8_for(kn_act_t *a, int n, const kn_weight_t *const w[])
{
    for (int i = 0; i < n; i++) {
        if ((w[i]->type >= KN_W_Q8_0 && w[i]->type < KN_W_NTYPES) ||
            w[i]->type == KN_W_Q8_0_R16) {
            return a;
        }
    }
    return NULL;
}

/* x (n, dim) += sum over the ranks of a's input (n, d_in) w^T, w a
 * row-parallel shard (dim, d_in): fused into the GEMM at T = 1, else each
 * rank's partial product is all-reduced first. */
static void
cpu_row_parallel(cpu_state_t *s, cpu_rank_t *rk, int r, kn_act_t *a, const kn_weight_t *w,
                 float *x, int32_t n)
{
    const int32_t dim = s->c.dim;

    if (s->tp == 1) {
        kn_matmul_w(a, w, NULL, x, 1);
        return;
    }
    kn_matmul_w(a, w, NULL, rk->part, 0);
    kn_comm_allreduce_sum(s->comm, r, rk->part, (size_t)n * dim);
    kn_cpu_add(x, rk->part, (size_t)n * dim);
}

/* The MLP block on n rows: x += down(silu(rmsnorm(x) Wg^T) * rmsnorm(x) Wu^T),
 * with h (n, dim) as the normed rows' scratch. */
static void
cpu_mlp(cpu_state_t *s, cpu_rank_t *rk, int r, const mdl_layer_t *L, const cpu_layer_t *cl,
        float *x, float *h, int32_t n)
{
    const mdl_config_t *c = &s->c;
    const int32_t n_f = rk->sh.n_f;
    /* gate and up in one parallel region over their shared input */
    const kn_weight_t *const ws[2] = {&cl->w_gate, &cl->w_up};
    float *const ys[2] = {rk->gate, rk->up};
    const kn_weight_t *const wd[1] = {&cl->w_down};
    kn_act_t *a = cpu_input(rk, h, n, c->dim);

    kn_cpu_rmsnorm_act(x, L->ffn_norm, h, n, c->dim, c->norm_eps, cpu_q8_for(a, 2, ws));
    kn_matmul_w_n(a, 2, ws, NULL, ys, 0);
    a = cpu_input(rk, rk->gate, n, n_f);
    kn_cpu_silu_mul_act(rk->gate, rk->up, n, n_f, cpu_q8_for(a, 1, wd));
    cpu_row_parallel(s, rk, r, a, &cl->w_down, x, n);
}

/* The last layer's sub-batch, before the ranks run: each row that needs
 * logits becomes a one-token sequence with its own sequence's block table:
 *
 *   rows  r0 .. r(n-1)  ->  sub_q (n, qd), sub_qs = 0, 1, .., n,
 *                           sub_ctx[i] = context index of r_i + 1
 */
static void
cpu_sub_batch(cpu_state_t *s, const mdl_batch_t *b)
{
    const int32_t mb = b->max_blocks;

    s->sub_qs[0] = 0;
    for (int32_t i = 0; i < b->n_logits; i++) {
        int32_t r = b->logits_rows[i];
        int32_t seq = 0;

        /* logits_rows need not be sorted: find r's sequence. */
        while (b->query_start[seq + 1] <= r) {
            seq++;
        }
        int32_t n_new = b->query_start[seq + 1] - b->query_start[seq];

        s->sub_qs[i + 1] = i + 1;
        s->sub_ctx[i] = b->context_len[seq] - n_new + (r - b->query_start[seq]) + 1;
        if (b->table_rows != NULL) {
            s->sub_rows[i] = b->table_rows[seq]; /* persistent rows: no copy */
        } else {
            memcpy(s->sub_bt + (size_t)i * mb, b->block_tables + (size_t)seq * mb,
                   sizeof(int32_t) * (size_t)mb);
        }
    }
}

/* The rest of the last layer for the n_logits rows that need logits, after
 * every row's K/V is in the cache (sub-batch from cpu_sub_batch()). Leaves
 * the residual rows in rk->hrows. A prefill chunk of T tokens thus skips
 * (T - n) / T of the last layer's attention, output projection and MLP. */
static void
cpu_last_layer(cpu_state_t *s, cpu_rank_t *rk, int r, const mdl_layer_t *L,
               const cpu_layer_t *cl)
{
    const mdl_batch_t *b = s->b;
    const mdl_config_t *c = &s->c;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t dim = c->dim, hd = c->head_dim, lq = sh->n_q * hd, half = hd / 2;
    const int32_t n = b->n_logits;

    if (n == 0) {
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t row = b->logits_rows[i];

        memcpy(rk->hrows + (size_t)i * dim, rk->x + (size_t)row * dim,
               sizeof(float) * (size_t)dim);
        memcpy(rk->sub_h + (size_t)i * dim, rk->h + (size_t)row * dim,
               sizeof(float) * (size_t)dim);
    }
    kn_matmul_w(cpu_input(rk, rk->sub_h, n, dim), &cl->wq, cl->bq, rk->sub_q, 0);
    for (int32_t i = 0; i < n; i++) {
        int32_t row = b->logits_rows[i];

        kn_cpu_rope(rk->sub_q + (size_t)i * lq, 1, sh->n_q, hd, rk->cos_t + (size_t)row * half,
                    rk->sin_t + (size_t)row * half);
    }
    kn_attn_args_t aa = {
        .out = rk->sub_att,
        .q = rk->sub_q,
        .query_start = s->sub_qs,
        .context_len = s->sub_ctx,
        .block_tables = b->table_rows != NULL ? b->block_tables : s->sub_bt,
        .max_blocks = b->max_blocks,
        .table_rows = b->table_rows != NULL ? s->sub_rows : NULL,
        .n_seqs = n,
        .n_tok = n,
        .n_heads = sh->n_q,
        .n_kv_heads = sh->n_kv,
        .head_dim = hd,
        .block_size = s->rc.block_size,
        .sliding_window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)hd),
    };
    host_kv_attend(&rk->kv, c->n_layers - 1, &aa);
    cpu_row_parallel(s, rk, r, cpu_input(rk, rk->sub_att, n, lq), &cl->wo, rk->hrows, n);
    cpu_mlp(s, rk, r, L, cl, rk->hrows, rk->sub_h, n);
}

/* One rank's share of the step (rank 0 also computes the logits). */
static int
cpu_rank_forward(void *arg, int r)
{
    cpu_state_t *s = arg;
    cpu_rank_t *rk = &s->ranks[r];
    const mdl_batch_t *b = s->b;
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    const mdl_tp_shard_t *sh = &rk->sh;
    const int32_t T = b->n_tokens, dim = c->dim, hd = c->head_dim;
    kn_attn_args_t aa = {
        .out = rk->att,
        .q = rk->q,
        .query_start = b->query_start,
        .context_len = b->context_len,
        .block_tables = b->block_tables,
        .max_blocks = b->max_blocks,
        .table_rows = b->table_rows,
        .n_seqs = b->n_seqs,
        .n_tok = T,
        .n_heads = sh->n_q,
        .n_kv_heads = sh->n_kv,
        .head_dim = hd,
        .block_size = s->rc.block_size,
        .sliding_window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)hd),
    };

    kn_embed_w(&s->embd, b->tokens, T, rk->x);
    kn_cpu_rope_table(b->positions, T, s->inv_freq, hd / 2, rk->cos_t, rk->sin_t);

    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        const cpu_layer_t *cl = &rk->layers[l];
        int last = l == c->n_layers - 1 && s->sub;

        /* q (not on the last layer of a sub-batch), k and v: one parallel region */
        const kn_weight_t *const ws[3] = {&cl->wk, &cl->wv, &cl->wq};
        const float *const bs[3] = {cl->bk, cl->bv, cl->bq};
        float *const ys[3] = {rk->k, rk->v, rk->q};
        kn_act_t *a = cpu_input(rk, rk->h, T, dim);

        kn_cpu_rmsnorm_act(rk->x, L->attn_norm, rk->h, T, dim, c->norm_eps,
                           cpu_q8_for(a, last ? 2 : 3, ws));
        kn_matmul_w_n(a, last ? 2 : 3, ws, bs, ys, 0);
        /* q's rotation (the last layer's sub-batch rotates its own rows) with k's */
        kn_cpu_rope_qk(last ? NULL : rk->q, sh->n_q, rk->k, sh->n_kv, T, hd, rk->cos_t,
                       rk->sin_t);
        /* All new K/V of this layer land before any attention reads. */
        host_kv_write(&rk->kv, l, rk->k, rk->v, b->slot_mapping, T);
        if (last) {
            cpu_last_layer(s, rk, r, L, cl);
            break;
        }
        host_kv_attend(&rk->kv, l, &aa);
        host_kv_mass_attend(&rk->kv, l, &aa, b->mass_rows); /* H2O / SnapKV, else nothing */
        cpu_row_parallel(s, rk, r, cpu_input(rk, rk->att, T, sh->n_q * hd), &cl->wo, rk->x, T);
        cpu_mlp(s, rk, r, L, cl, rk->x, rk->h, T);
    }
    host_kv_end_step(&rk->kv);

    if (r == 0 && b->n_hidden > 0) {
        /* Every row went through the last layer (s->sub is off). */
        for (int32_t i = 0; i < b->n_hidden; i++) {
            memcpy(s->hidden + (size_t)i * dim, rk->x + (size_t)b->hidden_rows[i] * dim,
                   sizeof(float) * (size_t)dim);
        }
        kn_cpu_rmsnorm(s->hidden, m->out_norm, s->hidden, b->n_hidden, dim, c->norm_eps);
    }
    if (r != 0 || b->n_logits == 0) {
        return ST_OK;
    }
    if (!s->sub) {
        for (int32_t i = 0; i < b->n_logits; i++) {
            memcpy(rk->hrows + (size_t)i * dim, rk->x + (size_t)b->logits_rows[i] * dim,
                   sizeof(float) * (size_t)dim);
        }
    }
    const kn_weight_t *const wl[1] = {&s->head};
    kn_act_t *a = cpu_input(rk, rk->hrows, b->n_logits, dim);

    kn_cpu_rmsnorm_act(rk->hrows, m->out_norm, rk->hrows, b->n_logits, dim, c->norm_eps,
                       cpu_q8_for(a, 1, wl));
    kn_matmul_w(a, &s->head, NULL, s->logits, 0);
    return ST_OK;
}

static int
cpu_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    cpu_state_t *s = state;
    int rc;

    /* The last layer only needs K/V for every row; the rest of it runs on
     * the rows that want logits, unless that is all of them or hidden rows
     * are wanted. */
    s->sub = b->n_logits < b->n_tokens && b->n_hidden == 0 && b->mass_rows == NULL;
    if (s->sub) {
        cpu_sub_batch(s, b);
    }
    s->b = b;
    rc = s->tp == 1 ? cpu_rank_forward(s, 0) : kn_ranks_run(s->threads, cpu_rank_forward, s);
    s->b = NULL;
    if (rc != ST_OK) {
        return rc;
    }
    *logits = s->logits;
    return ST_OK;
}

/* Every rank's share of the mass of slots (model/host_kv_mass.c). */
static int
cpu_kv_mass(void *state, const int32_t *slots, int32_t n, float *out)
{
    cpu_state_t *s = state;

    memset(out, 0, sizeof(float) * (size_t)n * (size_t)s->c.n_layers * (size_t)s->c.n_kv_heads);
    for (int32_t r = 0; r < s->tp; r++) {
        if (s->ranks[r].kv.mass == NULL) {
            return ST_EUNSUPPORTED;
        }
        host_kv_mass_read(&s->ranks[r].kv, slots, n, s->ranks[r].sh.kv0, s->c.n_kv_heads, out);
    }
    return ST_OK;
}

static const float *
cpu_hidden(void *state)
{
    return ((cpu_state_t *)state)->hidden;
}

const mdl_backend_t mdl_backend_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .kv_ops = cpu_kv_ops,
    .forward = cpu_forward,
    .hidden = cpu_hidden,
    .kv_drop_ops = 1,
    .kv_shift_ops = 1,
    .kv_mass = cpu_kv_mass,
};
