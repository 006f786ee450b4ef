/* dev_emu.c - the CUDA backend's forward pass on emulated device operations
 * (see dev_emu.h).
 *
 * Thread: the test's thread (rank threads inside kn_ranks_run).
 */
#include "tests/cuda/dev_emu.h"

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "model/kv_policy.h"
#include "model/model_int.h"
#include "tests/cuda/kn_emu.h"

const char *
emu_model_dir(void)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");

    return dir != NULL ? dir : KVSERVE_SOURCE_ROOT "/models/austen-2.7m";
}

mdl_model_t *
emu_load_model(void)
{
    mdl_model_t *m = NULL;
    char err[256] = "";

    ck_assert_msg(mdl_model_load(emu_model_dir(), &m, err, sizeof(err)) == ST_OK, "%s", err);
    return m;
}

/* ---- emulated device operations ------------------------------------------------ */

/* The emulated device counts what a step asks of it (host-side launches,
 * copies, syncs) and, between graph_begin and graph_end, records every
 * operation with a copy of its arguments instead of running it -- what
 * CUDA stream capture does -- so graph_launch replays exactly the
 * recorded arguments: a replayed step sees new inputs only through the
 * device memory the recorded pointers name. alloc, upload and sync while
 * recording fail, as they break a CUDA capture. */

/* Appends op (fn, args, n) to the recording; ST_OK. */
static int
emu_rec_push(emu_ctx_t *c, emu_exec_fn fn, const void *args, size_t size, int32_t n)
{
    emu_graph_t *g = c->rec;

    ck_assert_uint_le(size, sizeof(((emu_rec_op_t *)0)->args.b));
    if (g->n == g->cap) {
        g->cap = g->cap == 0 ? 64 : 2 * g->cap;
        g->ops = xrealloc(g->ops, sizeof(*g->ops) * g->cap);
    }
    g->ops[g->n].fn = fn;
    g->ops[g->n].n = n;
    memcpy(g->ops[g->n].args.b, args, size);
    g->n++;
    return ST_OK;
}

/* Runs op now, or records it; *counter counts eager host-side calls. */
static int
emu_op(void *ctx, emu_exec_fn fn, const void *args, size_t size, int32_t n, int64_t *counter)
{
    emu_ctx_t *c = ctx;

    if (c->rec != NULL) {
        return emu_rec_push(c, fn, args, size, n);
    }
    if (!c->replaying) {
        (*counter)++;
    }
    return fn(ctx, args, n);
}

static int
eo_alloc(void *ctx, void **p, size_t bytes)
{
    emu_ctx_t *c = ctx;

    if (c != NULL && c->rec != NULL) {
        c->n_unsafe++;
        return ST_EINVAL;
    }
    *p = xcalloc(1, bytes);
    return ST_OK;
}

static void
eo_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static int
eo_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    emu_ctx_t *c = ctx;

    if (c != NULL && c->rec != NULL) {
        c->n_unsafe++;
        return ST_EINVAL;
    }
    memcpy(dst, src, bytes);
    return ST_OK;
}

typedef struct eo_copy_args {
    void *dst;
    const void *src;
    size_t bytes;
} eo_copy_args_t;

static int
ex_copy(void *ctx, const void *av, int32_t n)
{
    const eo_copy_args_t *a = av;

    (void)ctx;
    (void)n;
    memcpy(a->dst, a->src, a->bytes); /* the plan never overlaps a range with itself */
    return ST_OK;
}

static int
eo_copy(void *ctx, void *dst, const void *src, size_t bytes, kv_op_kind_t kind)
{
    eo_copy_args_t a = {dst, src, bytes};
    emu_ctx_t *c = ctx;

    (void)kind;
    return emu_op(ctx, ex_copy, &a, sizeof(a), 0, &c->cnt.copies);
}

static int
eo_sync(void *ctx)
{
    emu_ctx_t *c = ctx;

    if (c->rec != NULL) {
        c->n_unsafe++;
        return ST_EINVAL;
    }
    c->cnt.syncs++;
    return ST_OK;
}

#define EO_KERNEL(name, args_t, gx, gy, nthr, smem)                                                \
    static void run_##name(const kn_thr_t *t, float *sm, const void *a)                            \
    {                                                                                              \
        kn_##name##_body(t, sm, a);                                                                \
    }                                                                                              \
    static int ex_##name(void *ctx, const void *av, int32_t n)                                     \
    {                                                                                              \
        const args_t *a = av;                                                                      \
        (void)ctx;                                                                                 \
        return kn_emu_launch(run_##name, a, (gx), (gy), (nthr), (smem)) == 0 ? ST_OK : ST_EINVAL;  \
    }                                                                                              \
    static int eo_##name(void *ctx, const args_t *a, int32_t n)                                    \
    {                                                                                              \
        emu_ctx_t *c = ctx;                                                                        \
        return emu_op(ctx, ex_##name, a, sizeof(*a), n, &c->cnt.kernels);                          \
    }

EO_KERNEL(embed, kn_embed_args_t, n, 1, 32, 0)
EO_KERNEL(rmsnorm, kn_rmsnorm_args_t, n, 1, 64, 2)
EO_KERNEL(rope, kn_rope_args_t, n, 1, 32, 0)
EO_KERNEL(bias, kn_bias_args_t, n, 1, 32, 0)
EO_KERNEL(kv_write, kn_kv_write_args_t, n, 1, 32, 0)
EO_KERNEL(silu_mul, kn_silu_mul_args_t, n, 1, 32, 0)
EO_KERNEL(gather, kn_gather_args_t, n, 1, 32, 0)
EO_KERNEL(attention_prefill, kn_attn_prefill_args_t, a->a.n_kv_heads, n, 64,
          kn_attn_prefill_smem_floats(a->q_tile, a->a.n_heads / a->a.n_kv_heads, a->a.head_dim))
EO_KERNEL(kq_res_write, kn_kq_res_write_args_t, n, 1, 32, 0)
EO_KERNEL(kq_quant, kn_kq_quant_args_t, n, 2 * a->g.n_kv, 32, 0)
EO_KERNEL(kq_dequant, kn_kq_dequant_args_t, a->g.n_kv, 2 + 0 * n, 32, 0)
EO_KERNEL(kq_attention, kn_kq_attn_args_t, a->a.n_kv_heads, n, 64,
          kn_kq_attn_smem_floats(a->a.n_heads / a->a.n_kv_heads, a->a.head_dim))
EO_KERNEL(wdequant, kn_wdequant_args_t, n, 1, 32, 0)
EO_KERNEL(tq_write, kn_tq_write_args_t, n, a->n_kv, 32, 0)
EO_KERNEL(tq_shift, kn_tq_shift_args_t, a->n_kv, n, 32, 0)
EO_KERNEL(attn_mass, kn_attn_mass_args_t, a->a.n_kv_heads, n, 64,
          kn_mass_smem_floats(a->a.head_dim))
EO_KERNEL(mass_gather, kn_mass_gather_args_t, n, 1, 32, 0)
EO_KERNEL(kv_move, kn_kv_move_args_t, a->n_kv, n, 32, 0)

static void
run_tq_attention(const kn_thr_t *t, float *sm, const void *a)
{
    kn_tq_attn_body(t, sm, a);
}

static int
eo_tq_attention(void *ctx, const kn_tq_attn_args_t *a, int32_t n)
{
    int32_t group = a->n_heads / a->n_kv;

    (void)ctx;
    return kn_emu_launch(run_tq_attention, a, n, a->n_kv, (group + 31) / 32 * 32, 0) == 0
               ? ST_OK
               : ST_EINVAL;
}

/* Decode attention as kn_cuda_attention() launches it: one pass, or with
 * n_splits > 1 the split kernel and then the combine. */
static void
run_attention(const kn_thr_t *t, float *sm, const void *a)
{
    kn_attention_body(t, sm, a);
}

static void
run_attention_split(const kn_thr_t *t, float *sm, const void *a)
{
    kn_attention_split_body(t, sm, a);
}

static void
run_attention_combine(const kn_thr_t *t, float *sm, const void *a)
{
    kn_attention_combine_body(t, sm, a);
}

static int
ex_attention(void *ctx, const void *av, int32_t n)
{
    const kn_attn_cuda_args_t *a = av;
    size_t smem = kn_attn_smem_floats(a->n_heads / a->n_kv_heads, a->head_dim);

    if (a->n_splits > 1) {
        ((emu_ctx_t *)ctx)->n_split_attn++;
        if (a->part == NULL || a->n_splits > KN_ATTN_MAX_SPLITS) {
            return ST_EINVAL;
        }
        return kn_emu_launch(run_attention_split, a, a->n_kv_heads * a->n_splits, n, 64, smem) ==
                           0 &&
                       kn_emu_launch(run_attention_combine, a, a->n_heads, n, 32, 0) == 0
                   ? ST_OK
                   : ST_EINVAL;
    }
    return kn_emu_launch(run_attention, a, a->n_kv_heads, n, 64, smem) == 0 ? ST_OK : ST_EINVAL;
}

static int
eo_attention(void *ctx, const kn_attn_cuda_args_t *a, int32_t n)
{
    emu_ctx_t *c = ctx;
    return emu_op(ctx, ex_attention, a, sizeof(*a), n, &c->cnt.kernels);
}

static void
run_kv_rotate(const kn_thr_t *t, float *sm, const void *a)
{
    kn_kv_rotate_body(t, sm, a);
}

typedef struct eo_rotate_args {
    kn_kv_rotate_args_t a;
    int32_t n_heads, n_layers;
} eo_rotate_args_t;

static int
ex_kv_rotate(void *ctx, const void *av, int32_t n)
{
    const eo_rotate_args_t *r = av;

    (void)ctx;
    (void)n;
    return kn_emu_launch(run_kv_rotate, &r->a, r->n_heads, r->n_layers, 32, 0) == 0 ? ST_OK
                                                                                    : ST_EINVAL;
}

static int
eo_kv_rotate(void *ctx, const kn_kv_rotate_args_t *a, int32_t n_heads, int32_t n_layers)
{
    eo_rotate_args_t r = {*a, n_heads, n_layers};
    emu_ctx_t *c = ctx;

    return emu_op(ctx, ex_kv_rotate, &r, sizeof(r), 0, &c->cnt.kernels);
}

static void
run_add(const kn_thr_t *t, float *sm, const void *a)
{
    kn_add_body(t, sm, a);
}

static int
ex_add(void *ctx, const void *av, int32_t n)
{
    const kn_add_args_t *a = av;

    (void)ctx;
    (void)n;
    return kn_emu_launch(run_add, a, (int)((a->n + 127) / 128), 1, 32, 0) == 0 ? ST_OK : ST_EINVAL;
}

static int
eo_add(void *ctx, const kn_add_args_t *a)
{
    emu_ctx_t *c = ctx;

    return emu_op(ctx, ex_add, a, sizeof(*a), 0, &c->cnt.kernels);
}

typedef struct eo_gemm_args {
    kn_dt_t dt;
    const uint16_t *x, *w;
    float *y;
    int32_t n_tok, d_in, d_out, acc;
} eo_gemm_args_t;

static int
ex_gemm(void *ctx, const void *av, int32_t n)
{
    const eo_gemm_args_t *a = av;
    float *xf = xmalloc(sizeof(float) * (size_t)a->d_in);

    (void)ctx;
    (void)n;
    for (int32_t t = 0; t < a->n_tok; t++) {
        for (int32_t i = 0; i < a->d_in; i++) {
            xf[i] = kn_ld16(a->x, (size_t)t * a->d_in + i, a->dt);
        }
        for (int32_t o = 0; o < a->d_out; o++) {
            float acc = 0.0f;

            for (int32_t i = 0; i < a->d_in; i++) {
                acc += xf[i] * kn_ld16(a->w, (size_t)o * a->d_in + i, a->dt);
            }
            /* acc: the sum first, then y added, as the add kernel did */
            a->y[(size_t)t * a->d_out + o] = a->acc ? a->y[(size_t)t * a->d_out + o] + acc : acc;
        }
    }
    free(xf);
    return ST_OK;
}

static int
eo_gemm(void *ctx, kn_dt_t dt, const uint16_t *x, const uint16_t *w, float *y, int32_t n_tok,
        int32_t d_in, int32_t d_out, int acc)
{
    eo_gemm_args_t a = {dt, x, w, y, n_tok, d_in, d_out, acc};
    emu_ctx_t *c = ctx;

    return emu_op(ctx, ex_gemm, &a, sizeof(a), 0, &c->cnt.gemms);
}

typedef struct eo_allreduce_args {
    float *buf;
    size_t n;
} eo_allreduce_args_t;

static int
ex_allreduce(void *ctx, const void *av, int32_t n)
{
    const eo_allreduce_args_t *a = av;
    emu_ctx_t *c = ctx;

    (void)n;
    kn_comm_allreduce_sum(c->comm, c->rank, a->buf, a->n);
    return ST_OK;
}

static int
eo_allreduce(void *ctx, float *buf, size_t n)
{
    eo_allreduce_args_t a = {buf, n};
    emu_ctx_t *c = ctx;

    return emu_op(ctx, ex_allreduce, &a, sizeof(a), 0, &c->cnt.allreduces);
}

static int
eo_graph_begin(void *ctx)
{
    emu_ctx_t *c = ctx;

    ck_assert_ptr_null(c->rec);
    c->rec = xcalloc(1, sizeof(*c->rec));
    return ST_OK;
}

static void
eo_graph_free(void *ctx, void *graph)
{
    emu_graph_t *g = graph;

    (void)ctx;
    if (g != NULL) {
        free(g->ops);
        free(g);
    }
}

static int
eo_graph_end(void *ctx, void **graph)
{
    emu_ctx_t *c = ctx;
    emu_graph_t *g = c->rec;

    c->rec = NULL;
    *graph = NULL;
    if (c->fail_record) {
        eo_graph_free(ctx, g);
        return ST_EINVAL;
    }
    *graph = g;
    return ST_OK;
}

static int
eo_graph_launch(void *ctx, void *graph)
{
    emu_ctx_t *c = ctx;
    emu_graph_t *g = graph;
    int st = ST_OK;

    c->cnt.graph_launches++;
    c->replaying = 1;
    for (size_t i = 0; i < g->n && st == ST_OK; i++) {
        st = g->ops[i].fn(ctx, g->ops[i].args.b, g->ops[i].n);
    }
    c->replaying = 0;
    return st;
}

const mdl_dev_ops_t emu_ops = {
    .alloc = eo_alloc,
    .free = eo_free,
    .alloc_host = eo_alloc,
    .free_host = eo_free,
    .upload = eo_upload,
    .copy = eo_copy,
    .sync = eo_sync,
    .embed = eo_embed,
    .rmsnorm = eo_rmsnorm,
    .rope = eo_rope,
    .bias = eo_bias,
    .kv_write = eo_kv_write,
    .silu_mul = eo_silu_mul,
    .add = eo_add,
    .gather = eo_gather,
    .attention = eo_attention,
    .attention_prefill = eo_attention_prefill,
    .kq_res_write = eo_kq_res_write,
    .kq_quant = eo_kq_quant,
    .kq_dequant = eo_kq_dequant,
    .kq_attention = eo_kq_attention,
    .kv_rotate = eo_kv_rotate,
    .tq_write = eo_tq_write,
    .tq_attention = eo_tq_attention,
    .tq_shift = eo_tq_shift,
    .wdequant = eo_wdequant,
    .attn_mass = eo_attn_mass,
    .mass_gather = eo_mass_gather,
    .kv_move = eo_kv_move,
    .gemm = eo_gemm,
    .allreduce = eo_allreduce,
    .graph_begin = eo_graph_begin,
    .graph_end = eo_graph_end,
    .graph_launch = eo_graph_launch,
    .graph_free = eo_graph_free,
};

/* ---- an emulated device "runtime": T ranks on rank threads ---------------------- */


static int
emu_rank_forward(void *arg, int r)
{
    emu_dev_t *e = arg;

    return mdl_dev_rank_forward(&e->fw[r], e->b);
}

static int
emu_rank_kv(void *arg, int r)
{
    emu_dev_t *e = arg;

    return mdl_dev_rank_kv_ops(&e->fw[r], e->kv, e->n_kv);
}

/* T = rc->tp_size emulated ranks; wstage_cap and upload_host as
 * mdl_dev_rank_t's (0: the defaults). */
emu_dev_t *
emu_dev_create_opt(const mdl_model_t *m, const mdl_runtime_config_t *rc, kn_dt_t dt,
                   size_t wstage_cap, int upload_host)
{
    emu_dev_t *e = xcalloc(1, sizeof(*e));

    e->tp = rc->tp_size;
    e->ops = emu_ops;
    if (e->tp == 1) {
        e->ops.allreduce = NULL; /* as the CUDA backend at T = 1 */
    }
    ck_assert_int_eq(kn_comm_create(e->tp, &e->comm), ST_OK);
    ck_assert_int_eq(kn_ranks_create(e->tp, &e->threads), ST_OK);
    for (int32_t r = 0; r < e->tp; r++) {
        e->ctx[r].comm = e->comm;
        e->ctx[r].rank = r;
        e->fw[r].wstage_cap = wstage_cap;
        e->fw[r].upload_host = upload_host;
        ck_assert_int_eq(mdl_dev_rank_init(&e->fw[r], &e->ops, &e->ctx[r], m, rc, r, dt), ST_OK);
        ck_assert_int_eq(mdl_dev_rank_alloc_kv(&e->fw[r]), ST_OK);
    }
    return e;
}

emu_dev_t *
emu_dev_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, kn_dt_t dt)
{
    return emu_dev_create_opt(m, rc, dt, 0, 0);
}

void
emu_dev_destroy(emu_dev_t *e)
{
    for (int32_t r = 0; r < e->tp; r++) {
        mdl_dev_rank_fini(&e->fw[r]);
    }
    kn_ranks_destroy(e->threads);
    kn_comm_destroy(e->comm);
    free(e);
}

/* ---- step by step --------------------------------------------------------------- */

const float *
emu_side_forward(emu_side_t *s, const mdl_batch_t *b)
{
    const float *l = NULL;

    if (s->cpu != NULL) {
        ck_assert_int_eq(mdl_forward(s->cpu, b, &l), ST_OK);
        return l;
    }
    s->dev->b = b;
    ck_assert_int_eq(kn_ranks_run(s->dev->threads, emu_rank_forward, s->dev), ST_OK);
    return s->dev->fw[0].logits_host;
}

void
emu_side_kv(emu_side_t *s, const kv_op_t *ops, int32_t n)
{
    if (s->cpu != NULL) {
        ck_assert_int_eq(mdl_runtime_kv_ops(s->cpu, ops, n), ST_OK);
        return;
    }
    s->dev->kv = ops;
    s->dev->n_kv = n;
    ck_assert_int_eq(kn_ranks_run(s->dev->threads, emu_rank_kv, s->dev), ST_OK);
}

void
emu_compare(emu_cmp_t *c, const float *ref, const float *got, int32_t rows)
{
    for (int32_t r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * c->vocab, *g = got + (size_t)r * c->vocab;
        double num = 0.0, den = 0.0;
        int32_t best = 0, second = -1, gbest = 0;

        for (int32_t i = 0; i < c->vocab; i++) {
            num += ((double)g[i] - a[i]) * ((double)g[i] - a[i]);
            den += (double)a[i] * a[i];
            if (a[i] > a[best]) {
                second = best;
                best = i;
            } else if (i > 0 && (second < 0 || a[i] > a[second])) {
                second = i;
            }
            if (g[i] > g[gbest]) {
                gbest = i;
            }
        }
        if (num / den > c->worst) {
            c->worst = num / den;
        }
        ck_assert_msg(num / den < c->nmse_bound, "row %d: logits NMSE %g", r, num / den);
        ck_assert_msg(gbest == best || a[best] - a[second] < (c->margin > 0.0f ? c->margin : 0.1f),
                      "row %d: argmax %d, reference %d (margin %g)", r, gbest, best,
                      a[best] - a[second]);
    }
}

/* ---- "cuda-emu": the backend ---------------------------------------------------- */

/* As model/backend_cuda.c's cu_create: its KV dtypes, weights in f16 with
 * an f16 cache and bf16 otherwise, the KV pool allocated at once. */
static int
eb_create(const mdl_model_t *m, const mdl_runtime_config_t *cfg, void **state, char *err,
          size_t errlen)
{
    if (cfg->kv_dtype != MDL_KV_BF16 && cfg->kv_dtype != MDL_KV_F16 &&
        cfg->kv_dtype != MDL_KV_FP8_E4M3 && cfg->kv_dtype != MDL_KV_INT8 &&
        cfg->kv_dtype != MDL_KV_INT4) {
        snprintf(err, errlen, "cuda-emu: the KV cache is bf16, f16, fp8_e4m3, int8 or int4");
        return ST_EUNSUPPORTED;
    }
    if (cfg->tp_size > 4) {
        snprintf(err, errlen, "cuda-emu: at most 4 ranks");
        return ST_EUNSUPPORTED;
    }
    if (cfg->kv_mass && cfg->kv_dtype != MDL_KV_BF16 && cfg->kv_dtype != MDL_KV_F16) {
        snprintf(err, errlen, "cuda-emu: attention-score eviction (h2o, snapkv) needs an f16 or "
                 "bf16 KV cache");
        return ST_EUNSUPPORTED;
    }
    *state = emu_dev_create(m, cfg, cfg->kv_dtype == MDL_KV_F16 ? KN_DT_F16 : KN_DT_BF16);
    return ST_OK;
}

static void
eb_destroy(void *state)
{
    if (state != NULL) {
        emu_dev_destroy(state);
    }
}

static int
eb_kv_ops(void *state, const kv_op_t *ops, int32_t n_ops)
{
    emu_dev_t *e = state;

    e->kv = ops;
    e->n_kv = n_ops;
    return kn_ranks_run(e->threads, emu_rank_kv, e);
}

int64_t emu_backend_verify_replays;

static int
eb_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    emu_dev_t *e = state;
    int64_t replays = e->fw[0].n_graph_steps;
    int rc;

    e->b = b;
    rc = kn_ranks_run(e->threads, emu_rank_forward, e);
    e->b = NULL;
    if (rc != ST_OK) {
        return rc;
    }
    if (b->n_tokens > b->n_seqs && e->fw[0].n_graph_steps > replays) {
        emu_backend_verify_replays++;
    }
    *logits = e->fw[0].logits_host;
    return ST_OK;
}

typedef struct eb_mass_job {
    emu_dev_t *e;
    const int32_t *slots;
    int32_t n;
    float *out;
} eb_mass_job_t;

static int
emu_rank_kv_mass(void *arg, int r)
{
    eb_mass_job_t *j = arg;

    return mdl_dev_rank_kv_mass(&j->e->fw[r], j->slots, j->n, j->out,
                                j->e->fw[0].m->cfg.n_kv_heads);
}

/* As model/backend_cuda.c's cu_kv_mass: every rank its heads' columns. */
static int
eb_kv_mass(void *state, const int32_t *slots, int32_t n, float *out)
{
    eb_mass_job_t j = {state, slots, n, out};

    return kn_ranks_run(((emu_dev_t *)state)->threads, emu_rank_kv_mass, &j);
}

const mdl_backend_t emu_backend = {
    .name = "cuda-emu",
    .create = eb_create,
    .destroy = eb_destroy,
    .kv_ops = eb_kv_ops,
    .forward = eb_forward,
    .kv_drop_ops = 1,
    .kv_shift_ops = 1,
    .kv_mass = eb_kv_mass,
};
