/* forward_cpu.c - the CPU backend: KV pool, swap tier and the Llama
 * forward pass over a flattened varlen batch (DESIGN.md sections 3, 4, 6).
 *
 * DESIGN. One step runs every new token of every sequence through each
 * layer together, so each weight matrix is read once per step whatever
 * the mix of prefill chunks and decodes (GEMMs over all n_tokens rows):
 *
 *   x = embed(tokens)                                   (T, dim)
 *   per layer:
 *     h = rmsnorm(x);  q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
 *     rope(q, k);  K/V cache[slot_mapping[t]] = k[t], v[t]   (write first)
 *     a = paged_attention(q, cache, block_tables)        (T, n_heads*hd)
 *     x += a Wo^T                                        (fused: GEMM beta 1)
 *     h = rmsnorm(x);  x += (silu(h Wg^T) * h Wu^T) Wd^T
 *   (the last layer past its K/V write runs only on the logits rows)
 *   logits = rmsnorm(x[logits_rows]) lm_head^T           (n_logits, vocab)
 *
 * KV pool (device tier here is host memory): model/host_kv.h, f32 regions
 * [num_blocks][n_kv_heads][block_size][head_dim] per layer and kind, or
 * the compressed store of kernels/cpu/kv_quant.h for the other dtypes.
 * Both tiers are anonymous mmaps (zero pages, committed on first write).
 * Activations are sized for max_num_batched_tokens rows and logits for
 * max_num_seqs rows at creation; forward() allocates nothing.
 */
#define LOG_MODULE "cpu"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "model/backend.h"
#include "model/host_kv.h"
#include "model/model_int.h"

typedef struct cpu_state {
    const mdl_model_t *m;
    mdl_config_t c;
    mdl_runtime_config_t rc;
    host_kv_t kv; /* pool and swap tier of every KV head (model/host_kv.h) */
    /* Scratch, rows = max_num_batched_tokens (T). */
    float *x;         /* (T, dim) residual stream */
    float *h;         /* (T, dim) normed */
    float *q;         /* (T, n_heads * hd) */
    float *k;         /* (T, n_kv * hd) */
    float *v;         /* (T, n_kv * hd) */
    float *att;       /* (T, n_heads * hd) */
    float *gate;      /* (T, ffn) */
    float *up;        /* (T, ffn) */
    float *cos_t;     /* (T, hd / 2) */
    float *sin_t;     /* (T, hd / 2) */
    float *inv_freq;  /* (hd / 2) */
    float *hrows;     /* (max_num_seqs, dim) residual rows that need logits */
    float *sub_h;     /* (max_num_seqs, dim) their normed rows, last layer */
    float *sub_q;     /* (max_num_seqs, n_heads * hd) */
    float *sub_att;   /* (max_num_seqs, n_heads * hd) */
    int32_t *sub_qs;  /* (max_num_seqs + 1) the last layer's sub-batch */
    int32_t *sub_ctx; /* (max_num_seqs) */
    int32_t *sub_bt;  /* (max_num_seqs, max_blocks_per_seq) */
    float *logits;    /* (max_num_seqs, vocab) */
    void *scratch;    /* the one allocation behind every scratch pointer */
} cpu_state_t;

static void
cpu_destroy(void *state)
{
    cpu_state_t *s = state;

    if (s == NULL) {
        return;
    }
    host_kv_destroy(&s->kv);
    free(s->scratch);
    free(s->sub_qs);
    free(s->sub_ctx);
    free(s->sub_bt);
    free(s);
}

static int
cpu_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, void **state, char *err,
           size_t errlen)
{
    const mdl_config_t *c = &m->cfg;
    size_t T = (size_t)rc->max_num_batched_tokens, S = (size_t)rc->max_num_seqs;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t half = (size_t)c->head_dim / 2;
    cpu_state_t *s;
    int rc_st;

    if (c->head_dim > KN_ATTN_MAX_HEAD_DIM) {
        snprintf(err, errlen, "head_dim %d exceeds %d", c->head_dim, KN_ATTN_MAX_HEAD_DIM);
        return ST_EUNSUPPORTED;
    }

    s = xcalloc(1, sizeof(*s));
    s->m = m;
    s->c = *c;
    s->rc = *rc;
    rc_st = host_kv_create(&s->kv, c, c->n_kv_heads, rc, err, errlen);
    if (rc_st != ST_OK) {
        goto fail;
    }

    /* Carve every scratch buffer out of one 64-byte aligned block. */
    size_t sizes[] = {
        T * c->dim,        T * c->dim,     T * qd,   T * kvd,  T * kvd, T * qd,
        T * c->ffn_dim,    T * c->ffn_dim, T * half, T * half, half,    S * c->dim,
        S * c->vocab_size, S * c->dim,     S * qd,   S * qd,
    };
    float **ptrs[] = {
        &s->x,      &s->h,     &s->q,     &s->k,       &s->v,        &s->att,
        &s->gate,   &s->up,    &s->cos_t, &s->sin_t,   &s->inv_freq, &s->hrows,
        &s->logits, &s->sub_h, &s->sub_q, &s->sub_att,
    };
    size_t total = 0;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    if (posix_memalign(&s->scratch, 64, total * sizeof(float)) != 0) {
        s->scratch = NULL;
        snprintf(err, errlen, "cannot allocate %zu MiB of activations",
                 (total * sizeof(float)) >> 20);
        rc_st = ST_ENOMEM;
        goto fail;
    }
    memset(s->scratch, 0, total * sizeof(float));
    s->sub_qs = xcalloc(S + 1, sizeof(int32_t));
    s->sub_ctx = xcalloc(S, sizeof(int32_t));
    s->sub_bt = xcalloc(S * (size_t)rc->max_blocks_per_seq, sizeof(int32_t));
    float *p = s->scratch;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *ptrs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }

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
    host_kv_set_rope(&s->kv, s->inv_freq);
    kn_cpu_init(rc->n_threads);
    LOG_DEBUG("cpu backend: %s kernels, %d threads, KV pool %zu MiB, scratch %zu MiB",
              kn_isa_name(kn_cpu_isa()), kn_cpu_threads(), s->kv.kv_len >> 20,
              (total * sizeof(float)) >> 20);
    *state = s;
    return ST_OK;

fail:
    cpu_destroy(s);
    return rc_st;
}

static int
cpu_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    cpu_state_t *s = state;

    return host_kv_ops(&s->kv, ops, n_ops);
}

/* The rest of the last layer for the n_logits rows that need logits, after
 * every row's K/V is in the cache. Each such row becomes a one-token
 * sequence of a sub-batch with its own sequence's block table:
 *
 *   rows  r0 .. r(n-1)  ->  sub_q (n, qd), sub_qs = 0, 1, .., n,
 *                           sub_ctx[i] = context index of r_i + 1
 *
 * Leaves the residual rows in s->hrows. A prefill chunk of T tokens thus
 * skips (T - n) / T of the last layer's attention, output projection and
 * MLP. */
static void
cpu_last_layer(cpu_state_t *s, const mdl_batch_t *b, const mdl_layer_t *L)
{
    const mdl_config_t *c = &s->c;
    const int32_t dim = c->dim, hd = c->head_dim, qd = c->n_heads * hd, half = hd / 2;
    const int32_t n = b->n_logits, mb = b->max_blocks;
    int32_t seq = 0;

    if (n == 0) {
        return;
    }
    s->sub_qs[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = b->logits_rows[i];

        /* logits_rows need not be sorted: find r's sequence. */
        seq = 0;
        while (b->query_start[seq + 1] <= r) {
            seq++;
        }
        int32_t n_new = b->query_start[seq + 1] - b->query_start[seq];

        s->sub_qs[i + 1] = i + 1;
        s->sub_ctx[i] = b->context_len[seq] - n_new + (r - b->query_start[seq]) + 1;
        memcpy(s->sub_bt + (size_t)i * mb, b->block_tables + (size_t)seq * mb,
               sizeof(int32_t) * (size_t)mb);
        memcpy(s->hrows + (size_t)i * dim, s->x + (size_t)r * dim, sizeof(float) * (size_t)dim);
        memcpy(s->sub_h + (size_t)i * dim, s->h + (size_t)r * dim, sizeof(float) * (size_t)dim);
    }
    kn_cpu_matmul(s->sub_h, L->wq, L->bq, s->sub_q, n, dim, qd, 0);
    for (int32_t i = 0; i < n; i++) {
        int32_t r = b->logits_rows[i];

        kn_cpu_rope(s->sub_q + (size_t)i * qd, 1, c->n_heads, hd, s->cos_t + (size_t)r * half,
                    s->sin_t + (size_t)r * half);
    }
    kn_attn_args_t aa = {
        .out = s->sub_att,
        .q = s->sub_q,
        .query_start = s->sub_qs,
        .context_len = s->sub_ctx,
        .block_tables = s->sub_bt,
        .max_blocks = mb,
        .n_seqs = n,
        .n_tok = n,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = hd,
        .block_size = s->rc.block_size,
        .sliding_window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)hd),
    };
    host_kv_attend(&s->kv, c->n_layers - 1, &aa);
    kn_cpu_matmul(s->sub_att, L->wo, NULL, s->hrows, n, qd, dim, 1);

    kn_cpu_rmsnorm(s->hrows, L->ffn_norm, s->sub_h, n, dim, c->norm_eps);
    kn_cpu_matmul(s->sub_h, L->w_gate, NULL, s->gate, n, dim, c->ffn_dim, 0);
    kn_cpu_matmul(s->sub_h, L->w_up, NULL, s->up, n, dim, c->ffn_dim, 0);
    kn_cpu_silu_mul(s->gate, s->up, s->gate, (size_t)n * c->ffn_dim);
    kn_cpu_matmul(s->gate, L->w_down, NULL, s->hrows, n, c->ffn_dim, dim, 1);
}

static int
cpu_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    cpu_state_t *s = state;
    const mdl_config_t *c = &s->c;
    const mdl_model_t *m = s->m;
    const int32_t T = b->n_tokens, dim = c->dim, hd = c->head_dim;
    const int32_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    kn_attn_args_t aa = {
        .out = s->att,
        .q = s->q,
        .query_start = b->query_start,
        .context_len = b->context_len,
        .block_tables = b->block_tables,
        .max_blocks = b->max_blocks,
        .n_seqs = b->n_seqs,
        .n_tok = T,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = hd,
        .block_size = s->rc.block_size,
        .sliding_window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)hd),
    };

    kn_cpu_embed(m->tok_embd, b->tokens, T, dim, s->x);
    kn_cpu_rope_table(b->positions, T, s->inv_freq, hd / 2, s->cos_t, s->sin_t);

    /* The last layer only needs K/V for every row; the rest of it runs on
     * the rows that want logits (cpu_last_layer), unless that is all of them. */
    int sub = b->n_logits < T;

    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        int last = l == c->n_layers - 1 && sub;

        kn_cpu_rmsnorm(s->x, L->attn_norm, s->h, T, dim, c->norm_eps);
        if (!last) {
            kn_cpu_matmul(s->h, L->wq, L->bq, s->q, T, dim, qd, 0);
        }
        kn_cpu_matmul(s->h, L->wk, L->bk, s->k, T, dim, kvd, 0);
        kn_cpu_matmul(s->h, L->wv, L->bv, s->v, T, dim, kvd, 0);
        kn_cpu_rope(s->k, T, c->n_kv_heads, hd, s->cos_t, s->sin_t);
        /* All new K/V of this layer land before any attention reads. */
        host_kv_write(&s->kv, l, s->k, s->v, b->slot_mapping, T);
        if (last) {
            cpu_last_layer(s, b, L);
            break;
        }
        kn_cpu_rope(s->q, T, c->n_heads, hd, s->cos_t, s->sin_t);
        host_kv_attend(&s->kv, l, &aa);
        kn_cpu_matmul(s->att, L->wo, NULL, s->x, T, qd, dim, 1);

        kn_cpu_rmsnorm(s->x, L->ffn_norm, s->h, T, dim, c->norm_eps);
        kn_cpu_matmul(s->h, L->w_gate, NULL, s->gate, T, dim, c->ffn_dim, 0);
        kn_cpu_matmul(s->h, L->w_up, NULL, s->up, T, dim, c->ffn_dim, 0);
        kn_cpu_silu_mul(s->gate, s->up, s->gate, (size_t)T * c->ffn_dim);
        kn_cpu_matmul(s->gate, L->w_down, NULL, s->x, T, c->ffn_dim, dim, 1);
    }

    if (!sub) {
        for (int32_t i = 0; i < b->n_logits; i++) {
            memcpy(s->hrows + (size_t)i * dim, s->x + (size_t)b->logits_rows[i] * dim,
                   sizeof(float) * (size_t)dim);
        }
    }
    if (b->n_logits > 0) {
        kn_cpu_rmsnorm(s->hrows, m->out_norm, s->hrows, b->n_logits, dim, c->norm_eps);
        kn_cpu_matmul(s->hrows, m->lm_head, NULL, s->logits, b->n_logits, dim, c->vocab_size, 0);
    }
    host_kv_end_step(&s->kv);
    *logits = s->logits;
    return ST_OK;
}

const mdl_backend_t mdl_backend_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .kv_ops = cpu_kv_ops,
    .forward = cpu_forward,
    .kv_drop_ops = 1,
    .kv_shift_ops = 1,
};
