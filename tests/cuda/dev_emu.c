/* dev_emu.c - the CUDA backend's forward pass on emulated device operations
 * (see dev_emu.h).
 *
 * Thread: the test's thread (rank threads inside kn_ranks_run).
 */
#include "tests/cuda/dev_emu.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "model/model_int.h"
#include "tests/cuda/kn_emu.h"

/* ---- emulated device operations ------------------------------------------------ */

static int
eo_alloc(void *ctx, void **p, size_t bytes)
{
    (void)ctx;
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
    (void)ctx;
    memcpy(dst, src, bytes);
    return ST_OK;
}

static int
eo_copy(void *ctx, void *dst, const void *src, size_t bytes, kv_op_kind_t kind)
{
    (void)ctx;
    (void)kind;
    memcpy(dst, src, bytes); /* the plan never overlaps a range with itself */
    return ST_OK;
}

static int
eo_sync(void *ctx)
{
    (void)ctx;
    return ST_OK;
}

#define EO_KERNEL(name, args_t, gx, gy, nthr, smem)                                                \
    static void run_##name(const kn_thr_t *t, float *sm, const void *a)                            \
    {                                                                                              \
        kn_##name##_body(t, sm, a);                                                                \
    }                                                                                              \
    static int eo_##name(void *ctx, const args_t *a, int32_t n)                                    \
    {                                                                                              \
        (void)ctx;                                                                                 \
        return kn_emu_launch(run_##name, a, (gx), (gy), (nthr), (smem)) == 0 ? ST_OK : ST_EINVAL;  \
    }

EO_KERNEL(embed, kn_embed_args_t, n, 1, 32, 0)
EO_KERNEL(rmsnorm, kn_rmsnorm_args_t, n, 1, 64, 2)
EO_KERNEL(rope, kn_rope_args_t, n, 1, 32, 0)
EO_KERNEL(bias, kn_bias_args_t, n, 1, 32, 0)
EO_KERNEL(kv_write, kn_kv_write_args_t, n, 1, 32, 0)
EO_KERNEL(silu_mul, kn_silu_mul_args_t, n, 1, 32, 0)
EO_KERNEL(gather, kn_gather_args_t, n, 1, 32, 0)
EO_KERNEL(attention, kn_attn_cuda_args_t, a->n_kv_heads, n, 64,
          kn_attn_smem_floats(a->n_heads / a->n_kv_heads, a->head_dim))
EO_KERNEL(attention_prefill, kn_attn_prefill_args_t, a->a.n_kv_heads, n, 64,
          kn_attn_prefill_smem_floats(a->q_tile, a->a.n_heads / a->a.n_kv_heads, a->a.head_dim))
EO_KERNEL(kq_res_write, kn_kq_res_write_args_t, n, 1, 32, 0)
EO_KERNEL(kq_quant, kn_kq_quant_args_t, n, 2 * a->g.n_kv, 32, 0)
EO_KERNEL(kq_dequant, kn_kq_dequant_args_t, a->g.n_kv, 2 + 0 * n, 32, 0)
EO_KERNEL(kq_attention, kn_kq_attn_args_t, a->a.n_kv_heads, n, 64,
          kn_kq_attn_smem_floats(a->a.n_heads / a->a.n_kv_heads, a->a.head_dim))
EO_KERNEL(wdequant, kn_wdequant_args_t, n, 1, 32, 0)

static void
run_kv_rotate(const kn_thr_t *t, float *sm, const void *a)
{
    kn_kv_rotate_body(t, sm, a);
}

static int
eo_kv_rotate(void *ctx, const kn_kv_rotate_args_t *a, int32_t n_heads, int32_t n_layers)
{
    (void)ctx;
    return kn_emu_launch(run_kv_rotate, a, n_heads, n_layers, 32, 0) == 0 ? ST_OK : ST_EINVAL;
}

static void
run_add(const kn_thr_t *t, float *sm, const void *a)
{
    kn_add_body(t, sm, a);
}

static int
eo_add(void *ctx, const kn_add_args_t *a)
{
    (void)ctx;
    return kn_emu_launch(run_add, a, (int)((a->n + 127) / 128), 1, 32, 0) == 0 ? ST_OK : ST_EINVAL;
}

static int
eo_gemm(void *ctx, kn_dt_t dt, const uint16_t *x, const uint16_t *w, float *y, int32_t n_tok,
        int32_t d_in, int32_t d_out)
{
    float *xf = xmalloc(sizeof(float) * (size_t)d_in);

    (void)ctx;
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t i = 0; i < d_in; i++) {
            xf[i] = kn_ld16(x, (size_t)t * d_in + i, dt);
        }
        for (int32_t o = 0; o < d_out; o++) {
            float acc = 0.0f;

            for (int32_t i = 0; i < d_in; i++) {
                acc += xf[i] * kn_ld16(w, (size_t)o * d_in + i, dt);
            }
            y[(size_t)t * d_out + o] = acc;
        }
    }
    free(xf);
    return ST_OK;
}

static int
eo_allreduce(void *ctx, float *buf, size_t n)
{
    emu_ctx_t *c = ctx;

    kn_comm_allreduce_sum(c->comm, c->rank, buf, n);
    return ST_OK;
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
    .wdequant = eo_wdequant,
    .gemm = eo_gemm,
    .allreduce = eo_allreduce,
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
        ck_assert_msg(gbest == best || a[best] - a[second] < 0.1f,
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

static int
eb_forward(void *state, const mdl_batch_t *b, const float **logits)
{
    emu_dev_t *e = state;
    int rc;

    e->b = b;
    rc = kn_ranks_run(e->threads, emu_rank_forward, e);
    e->b = NULL;
    if (rc != ST_OK) {
        return rc;
    }
    *logits = e->fw[0].logits_host;
    return ST_OK;
}

const mdl_backend_t emu_backend = {
    .name = "cuda-emu",
    .create = eb_create,
    .destroy = eb_destroy,
    .kv_ops = eb_kv_ops,
    .forward = eb_forward,
    .kv_drop_ops = 1,
    .kv_shift_ops = 1,
};
