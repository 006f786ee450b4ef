/* kn_fused.c - rmsnorm / silu * up with the activation quantization after
 * them, and rope of q and k, each one region over the tokens (kn_fused.h).
 *
 * DESIGN. Chunks are runs of whole tokens; a chunk runs the ISA table's
 * per-token kernel (the one kn_cpu.c calls) on its tokens, then
 * kn_act_quantize_q8_rows() on the same tokens, so no member waits for
 * another inside the region and every bit is what the separate calls give.
 * Thresholds: the activation quantizer's (2^15 elements, kn_quant.c), below
 * which a region's wake-up costs more than the work.
 *
 * Thread: any caller; the team as kn_pool.c.
 */
#include <stddef.h>

#include "kernels/cpu/kn_fused.h"
#include "kernels/cpu/kn_int.h"

#define KN_FUSED_PAR (1L << 15)
#define KN_FUSED_CHUNKS 4 /* chunks per thread, at most one token each */

typedef struct kn_fused_job {
    const kn_impl_t *impl;
    const float *x, *w; /* rmsnorm: input, weight; silu: up */
    float *y;           /* rmsnorm: output; silu: gate (in place) */
    float *k;           /* rope: k (y is q) */
    const float *cos_t, *sin_t;
    int32_t n_tok, dim; /* dim: rmsnorm's dim, silu's n_f, rope's n_q */
    int32_t n_kv, head_dim;
    float eps;
    kn_act_t *a;
} kn_fused_job_t;

/* Tokens [*t0, *t1) of chunk c of n. */
static void
kn_fused_share(int32_t n_tok, int c, int n, int32_t *t0, int32_t *t1)
{
    int32_t per = (n_tok + n - 1) / n;

    *t0 = c * per < n_tok ? c * per : n_tok;
    *t1 = *t0 + per < n_tok ? *t0 + per : n_tok;
}

/* The team size and chunks for work over n_tok tokens, or 0 chunks when
 * it stays on the caller. */
static int
kn_fused_split(int32_t n_tok, long work, int *team)
{
    int nt = work >= KN_FUSED_PAR ? kn_cpu_threads() : 1;

    *team = nt;
    if (nt <= 1 || n_tok < 2) {
        return 0;
    }
    return n_tok < nt * KN_FUSED_CHUNKS ? n_tok : nt * KN_FUSED_CHUNKS;
}

static void
kn_rmsnorm_act_rows(const kn_fused_job_t *j, int32_t t0, int32_t t1)
{
    size_t o = (size_t)t0 * (size_t)j->dim;

    if (t0 >= t1) {
        return;
    }
    j->impl->rmsnorm(j->x + o, j->w, j->y + o, t1 - t0, j->dim, j->eps);
    if (j->a != NULL) {
        kn_act_quantize_q8_rows(j->a, t0, t1);
    }
}

static void
kn_rmsnorm_act_region(void *arg, int c, int n)
{
    const kn_fused_job_t *j = arg;
    int32_t t0, t1;

    kn_fused_share(j->n_tok, c, n, &t0, &t1);
    kn_rmsnorm_act_rows(j, t0, t1);
}

void
kn_cpu_rmsnorm_act(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim,
                   float eps, kn_act_t *a)
{
    kn_fused_job_t j = {
        .impl = kn__impl_cur(), .x = x, .w = w, .y = y, .n_tok = n_tok, .dim = dim, .eps = eps,
        .a = a,
    };
    int team, n_chunks = kn_fused_split(n_tok, (long)n_tok * dim, &team);

    if (n_chunks == 0) {
        kn_rmsnorm_act_rows(&j, 0, n_tok);
    } else {
        kn__pool_run(team, n_chunks, kn_rmsnorm_act_region, &j);
    }
    if (a != NULL) {
        a->have_q8 = 1;
    }
}

static void
kn_silu_act_rows(const kn_fused_job_t *j, int32_t t0, int32_t t1)
{
    size_t o = (size_t)t0 * (size_t)j->dim;

    if (t0 >= t1) {
        return;
    }
    j->impl->silu_mul(j->y + o, j->w + o, j->y + o, (size_t)(t1 - t0) * (size_t)j->dim);
    if (j->a != NULL) {
        kn_act_quantize_q8_rows(j->a, t0, t1);
    }
}

static void
kn_silu_act_region(void *arg, int c, int n)
{
    const kn_fused_job_t *j = arg;
    int32_t t0, t1;

    kn_fused_share(j->n_tok, c, n, &t0, &t1);
    kn_silu_act_rows(j, t0, t1);
}

void
kn_cpu_silu_mul_act(float *gate, const float *up, int32_t n_tok, int32_t n_f, kn_act_t *a)
{
    kn_fused_job_t j = {
        .impl = kn__impl_cur(), .w = up, .y = gate, .n_tok = n_tok, .dim = n_f, .a = a,
    };
    int team, n_chunks = kn_fused_split(n_tok, (long)n_tok * n_f, &team);

    if (n_chunks == 0) {
        kn_silu_act_rows(&j, 0, n_tok);
    } else {
        kn__pool_run(team, n_chunks, kn_silu_act_region, &j);
    }
    if (a != NULL) {
        a->have_q8 = 1;
    }
}

static void
kn_rope_qk_rows(const kn_fused_job_t *j, int32_t t0, int32_t t1)
{
    size_t half = (size_t)j->head_dim / 2;
    size_t qrow = (size_t)j->dim * (size_t)j->head_dim, krow = (size_t)j->n_kv * j->head_dim;

    if (t0 >= t1) {
        return;
    }
    if (j->y != NULL) {
        j->impl->rope(j->y + (size_t)t0 * qrow, t1 - t0, j->dim, j->head_dim,
                      j->cos_t + (size_t)t0 * half, j->sin_t + (size_t)t0 * half);
    }
    j->impl->rope(j->k + (size_t)t0 * krow, t1 - t0, j->n_kv, j->head_dim,
                  j->cos_t + (size_t)t0 * half, j->sin_t + (size_t)t0 * half);
}

static void
kn_rope_qk_region(void *arg, int c, int n)
{
    const kn_fused_job_t *j = arg;
    int32_t t0, t1;

    kn_fused_share(j->n_tok, c, n, &t0, &t1);
    kn_rope_qk_rows(j, t0, t1);
}

void
kn_cpu_rope_qk(float *q, int32_t n_q, float *k, int32_t n_kv, int32_t n_tok, int32_t head_dim,
               const float *cos_t, const float *sin_t)
{
    kn_fused_job_t j = {
        .impl = kn__impl_cur(),
        .y = q,
        .k = k,
        .cos_t = cos_t,
        .sin_t = sin_t,
        .n_tok = n_tok,
        .dim = n_q,
        .n_kv = n_kv,
        .head_dim = head_dim,
    };
    /* rope is lighter per element than the quantizer: kn_cpu_rope's 2^16 */
    int team, n_chunks = kn_fused_split(n_tok, (long)n_tok * (n_q + n_kv) * head_dim / 2, &team);

    if (n_chunks == 0) {
        kn_rope_qk_rows(&j, 0, n_tok);
    } else {
        kn__pool_run(team, n_chunks, kn_rope_qk_region, &j);
    }
}
