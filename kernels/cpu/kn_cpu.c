/* kn_cpu.c - CPU kernel dispatch: ISA selection, threading, GEMMs.
 *
 * DESIGN. One thread team: OpenBLAS is put in single-threaded mode and
 * every parallel kernel runs a region on the kernel team (kn_pool.c: spin
 * briefly, yield, then sleep; see there why not OpenMP's) of
 * kn_cpu_threads() threads, each working on its own slice (GEMMs split
 * their output rows; a slice is the GEMV of kn_gemv_f32.c up to
 * KN_GEMV_MAX_M tokens, the few-row GEMM up to KN_SMALL_M, else one
 * single-threaded cblas call). A region is started only when the work is
 * large enough to amortize it (the KN_PAR_* thresholds): a decode step of
 * a small model runs entirely on the calling thread, where fork and join
 * costs would exceed the arithmetic. Steps that feed a weight product
 * (rmsnorm, silu * up) make its 8-bit activations in the same region
 * (kn_fused.c).
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/kn_gemv_f32.h"
#include "kernels/cpu/kn_int.h"
#include "kernels/kn_shared.h"

/* Work (multiply-adds or elements) below which a kernel stays serial. */
#define KN_PAR_GEMM (1L << 19)
/* Weight elements from which the GEMV (kn_gemv_f32.c, up to KN_GEMV_MAX_M
 * tokens) splits a matrix whatever the token count: one core streams
 * 1 MB well below the memory's bandwidth (the 135M shape's q and o
 * projections, 576 x 576, ran on one thread at one token). */
#define KN_PAR_GEMV (1L << 18)
#define KN_PAR_ELEM (1L << 16)
#define KN_PAR_ATTN (1L << 16)
/* Up to this many token rows, GEMMs use the kernel's own few-row GEMM:
 * OpenBLAS sgemm at 2..8 rows runs slower than the same number of gemv
 * calls (it packs the whole weight matrix for a handful of rows), and the
 * register-tiled kernel stays ahead of it up to a few dozen rows. */
#define KN_SMALL_M 32
/* A region is split into this many chunks per thread, so that a member
 * that is slow to wake (a busy host) leaves its share to the others. */
#define KN_CHUNKS 4

static const kn_impl_t *kn_impl = &kn__impl_generic;
static kn_isa_t kn_isa_cur = KN_ISA_GENERIC;
static kn_isa_t kn_isa_max = KN_ISA_GENERIC;
static int kn_nthreads = 1;
static int kn_inited;

static kn_isa_t
kn_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16")) {
            return KN_ISA_AVX512_VNNI;
        }
        return KN_ISA_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return KN_ISA_AVX2;
    }
#endif
    return KN_ISA_GENERIC;
}

void
kn_cpu_init(int n_threads)
{
    if (!kn_inited) {
        kn_isa_max = kn_detect();
        kn_cpu_set_isa(kn_isa_max);
        kn_inited = 1;
    }
    if (n_threads <= 0) {
        n_threads = kn_cpu_default_threads();
    }
    kn_nthreads = n_threads;
    openblas_set_num_threads(1);
}

int
kn_cpu_threads(void)
{
    return kn_nthreads;
}

kn_isa_t
kn_cpu_isa_best(void)
{
    if (!kn_inited) {
        kn_cpu_init(0);
    }
    return kn_isa_max;
}

kn_isa_t
kn_cpu_isa(void)
{
    return kn_isa_cur;
}

int
kn_cpu_set_isa(kn_isa_t isa)
{
    const kn_impl_t *impl;

    if (kn_inited && isa > kn_isa_max) {
        return ST_EUNSUPPORTED;
    }
    if (!kn_inited && isa > kn_detect()) {
        return ST_EUNSUPPORTED;
    }
    switch (isa) {
    case KN_ISA_GENERIC:
        impl = &kn__impl_generic;
        break;
    case KN_ISA_AVX2:
        impl = &kn__impl_avx2;
        break;
    case KN_ISA_AVX512:
    case KN_ISA_AVX512_VNNI: /* the f32 kernels have no VNNI variant */
        impl = &kn__impl_avx512;
        break;
    default:
        return ST_EINVAL;
    }
    kn_impl = impl;
    kn_isa_cur = isa;
    return ST_OK;
}

const kn_impl_t *
kn__impl_cur(void)
{
    return kn_impl;
}

const char *
kn_isa_name(kn_isa_t isa)
{
    switch (isa) {
    case KN_ISA_AVX2:
        return "avx2";
    case KN_ISA_AVX512:
        return "avx512";
    case KN_ISA_AVX512_VNNI:
        return "avx512_vnni";
    default:
        return "generic";
    }
}

/* Threads for a job of the given size: 1 below the threshold. */
static int
kn_team(long work, long threshold)
{
    return work >= threshold ? kn_nthreads : 1;
}

/* One slice of rows [r0, r1) of the output: a single-threaded cblas call. */
static void
kn_matmul_rows(const float *x, const float *w, const float *bias, float *y, int32_t n_tok,
               int32_t d_in, int32_t d_out, int accumulate, int32_t r0, int32_t r1)
{
    int32_t rows = r1 - r0;
    float beta = accumulate ? 1.0f : 0.0f;

    if (rows <= 0) {
        return;
    }
    if (bias != NULL) {
        for (int32_t t = 0; t < n_tok; t++) {
            float *yr = y + (size_t)t * d_out + r0;

            if (accumulate) {
                for (int32_t o = 0; o < rows; o++) {
                    yr[o] += bias[r0 + o];
                }
            } else {
                memcpy(yr, bias + r0, sizeof(float) * (size_t)rows);
            }
        }
        beta = 1.0f;
    }
    if (n_tok <= KN_GEMV_MAX_M) {
        kn__gemv_f32_for(kn_isa_cur)(x, w, y, n_tok, d_in, d_out, r0, r1, beta != 0.0f);
    } else if (n_tok <= KN_SMALL_M) {
        kn_impl->gemm_small(x, w, y, n_tok, d_in, d_out, r0, r1, beta != 0.0f);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tok, rows, d_in, 1.0f, x, d_in,
                    w + (size_t)r0 * d_in, d_in, beta, y + r0, d_out);
    }
}

/* Chunks for a region over n items: KN_CHUNKS per thread, at most n. */
static int
kn_chunks_for(int nt, long n)
{
    long c = (long)nt * KN_CHUNKS;

    return (int)(c < n ? c : (n > 1 ? n : 1));
}

/* Chunk `chunk`'s share [*lo, *hi) of n items, in multiples of `align`. */
static void
kn_share(size_t n, size_t align, int chunk, int n_chunks, size_t *lo, size_t *hi)
{
    size_t per = ((n + (size_t)n_chunks - 1) / (size_t)n_chunks + align - 1) / align * align;

    *lo = (size_t)chunk * per < n ? (size_t)chunk * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

typedef struct kn_matmul_job {
    const float *x, *w, *bias;
    float *y;
    int32_t n_tok, d_in, d_out;
    int accumulate;
} kn_matmul_job_t;

static void
kn_matmul_region(void *arg, int chunk, int n_chunks)
{
    const kn_matmul_job_t *j = arg;
    size_t r0, r1;

    /* Slices of 16-row multiples, so each chunk's rows start on a cache line. */
    kn_share((size_t)j->d_out, 16, chunk, n_chunks, &r0, &r1);
    kn_matmul_rows(j->x, j->w, j->bias, j->y, j->n_tok, j->d_in, j->d_out, j->accumulate,
                   (int32_t)r0, (int32_t)r1);
}

void
kn_cpu_matmul(const float *x, const float *w, const float *bias, float *y, int32_t n_tok,
              int32_t d_in, int32_t d_out, int accumulate)
{
    int nt = kn_team((long)n_tok * d_in * d_out, KN_PAR_GEMM);
    kn_matmul_job_t j = {x, w, bias, y, n_tok, d_in, d_out, accumulate};

    if (n_tok <= KN_GEMV_MAX_M && (long)d_in * d_out >= KN_PAR_GEMV) {
        nt = kn_nthreads; /* the GEMV streams the weights: split by their size */
    }
    if (nt <= 1 || d_out < 32) {
        kn_matmul_rows(x, w, bias, y, n_tok, d_in, d_out, accumulate, 0, d_out);
        return;
    }
    {
        int n_chunks = nt * KN_CHUNKS;

        if (n_chunks > d_out / 64) {
            n_chunks = d_out / 64 > 1 ? d_out / 64 : 2;
        }
        kn__pool_run(nt, n_chunks, kn_matmul_region, &j);
    }
}

typedef struct kn_rows_job {
    const float *x, *w;
    float *y;
    int32_t n_tok, dim;
    float eps;
} kn_rows_job_t;

static void
kn_rmsnorm_region(void *arg, int chunk, int n_chunks)
{
    const kn_rows_job_t *j = arg;
    size_t lo, hi;

    kn_share((size_t)j->n_tok, 1, chunk, n_chunks, &lo, &hi);
    if (lo < hi) {
        kn_impl->rmsnorm(j->x + lo * j->dim, j->w, j->y + lo * j->dim, (int32_t)(hi - lo), j->dim,
                         j->eps);
    }
}

void
kn_cpu_rmsnorm(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim, float eps)
{
    int nt = kn_team((long)n_tok * dim, KN_PAR_ELEM);
    kn_rows_job_t j = {x, w, y, n_tok, dim, eps};

    if (nt <= 1 || n_tok < 2) {
        kn_impl->rmsnorm(x, w, y, n_tok, dim, eps);
        return;
    }
    kn__pool_run(nt, kn_chunks_for(nt, n_tok), kn_rmsnorm_region, &j);
}

void
kn_cpu_rope_inv_freq(const kn_rope_params_t *p, float *inv_freq)
{
    int32_t half = p->head_dim / 2;
    const double pi = 3.14159265358979323846;

    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow((double)p->theta, (double)(2 * i) / (double)p->head_dim);

        if (p->scaling == KN_ROPE_LINEAR && p->factor > 0.0f) {
            f /= p->factor;
        } else if (p->scaling == KN_ROPE_LLAMA3 && p->factor > 0.0f) {
            double low_wl = (double)p->orig_max_pos / p->low_freq_factor;
            double high_wl = (double)p->orig_max_pos / p->high_freq_factor;
            double wl = 2.0 * pi / f;

            if (wl > low_wl) {
                f /= p->factor;
            } else if (wl >= high_wl) {
                double smooth = ((double)p->orig_max_pos / wl - p->low_freq_factor) /
                                (p->high_freq_factor - p->low_freq_factor);

                f = (1.0 - smooth) * f / p->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

typedef struct kn_rope_job {
    const int32_t *pos;
    const float *inv_freq;
    float *x, *cos_t, *sin_t;
    int32_t n_tok, half, n_heads, head_dim;
} kn_rope_job_t;

static void
kn_rope_table_region(void *arg, int chunk, int n_chunks)
{
    const kn_rope_job_t *j = arg;
    size_t lo, hi;

    kn_share((size_t)j->n_tok, 1, chunk, n_chunks, &lo, &hi);
    /* Angles in double: positions up to 10^6 times inv_freq near 1 lose
     * too many bits in f32 for the 1e-4 reference tolerance. */
    for (size_t t = lo; t < hi; t++) {
        for (int32_t i = 0; i < j->half; i++) {
            double ang = (double)j->pos[t] * (double)j->inv_freq[i];

            j->cos_t[t * j->half + i] = (float)cos(ang);
            j->sin_t[t * j->half + i] = (float)sin(ang);
        }
    }
}

void
kn_cpu_rope_table(const int32_t *pos, int32_t n_tok, const float *inv_freq, int32_t half,
                  float *cos_t, float *sin_t)
{
    kn_rope_job_t j = {.pos = pos,
                       .inv_freq = inv_freq,
                       .cos_t = cos_t,
                       .sin_t = sin_t,
                       .n_tok = n_tok,
                       .half = half};

    int nt = kn_team((long)n_tok * half * 16, KN_PAR_ELEM);

    kn__pool_run(nt, kn_chunks_for(nt, n_tok), kn_rope_table_region, &j);
}

static void
kn_rope_region(void *arg, int chunk, int n_chunks)
{
    const kn_rope_job_t *j = arg;
    size_t lo, hi, row = (size_t)j->n_heads * j->head_dim, half = (size_t)j->head_dim / 2;

    kn_share((size_t)j->n_tok, 1, chunk, n_chunks, &lo, &hi);
    if (lo < hi) {
        kn_impl->rope(j->x + lo * row, (int32_t)(hi - lo), j->n_heads, j->head_dim,
                      j->cos_t + lo * half, j->sin_t + lo * half);
    }
}

void
kn_cpu_rope(float *x, int32_t n_tok, int32_t n_heads, int32_t head_dim, const float *cos_t,
            const float *sin_t)
{
    int nt = kn_team((long)n_tok * n_heads * head_dim, KN_PAR_ELEM);
    kn_rope_job_t j = {.x = x,
                       .cos_t = (float *)cos_t,
                       .sin_t = (float *)sin_t,
                       .n_tok = n_tok,
                       .n_heads = n_heads,
                       .head_dim = head_dim};

    if (nt <= 1 || n_tok < 2) {
        kn_impl->rope(x, n_tok, n_heads, head_dim, cos_t, sin_t);
        return;
    }
    kn__pool_run(nt, kn_chunks_for(nt, n_tok), kn_rope_region, &j);
}

void
kn_cpu_kv_write(float *k_cache, float *v_cache, const float *k, const float *v, const int32_t *slot,
                int32_t n_tok, int32_t n_kv_heads, int32_t block_size, int32_t head_dim)
{
    size_t hb = sizeof(float) * (size_t)head_dim;

    for (int32_t t = 0; t < n_tok; t++) {
        if (slot[t] < 0) {
            continue;
        }
        int32_t blk = slot[t] / block_size, off = slot[t] % block_size;

        for (int32_t h = 0; h < n_kv_heads; h++) {
            size_t dst = (((size_t)blk * n_kv_heads + h) * block_size + off) * head_dim;
            size_t src = ((size_t)t * n_kv_heads + h) * head_dim;

            memcpy(k_cache + dst, k + src, hb);
            memcpy(v_cache + dst, v + src, hb);
        }
    }
}

/* One (token, KV head) task. Later tokens of a prefill chunk see more
 * context, so tasks are numbered latest token first: the long ones are
 * claimed early and the short ones fill in at the end. */
static void
kn_attn_chunk(void *arg, int i, int n_tasks)
{
    const kn_attn_args_t *a = arg;
    int32_t t = a->n_tok - 1 - i / a->n_kv_heads;

    (void)n_tasks;
    kn_impl->attn_task(a, t, kn_seq_of(a->query_start, a->n_seqs, t), i % a->n_kv_heads);
}

void
kn_cpu_attention(const kn_attn_args_t *a)
{
    const kn_impl_t *impl = kn_impl;
    long work = 0;
    int32_t n_tasks = a->n_tok * a->n_kv_heads;

    for (int32_t s = 0; s < a->n_seqs; s++) {
        work += (long)(a->query_start[s + 1] - a->query_start[s]) * a->context_len[s];
    }
    work *= (long)a->n_heads * a->head_dim;

    int nt = kn_team(work, KN_PAR_ATTN);

    if (nt <= 1 || n_tasks < 2) {
        int32_t s = 0;

        for (int32_t t = 0; t < a->n_tok; t++) {
            while (a->query_start[s + 1] <= t) {
                s++;
            }
            for (int32_t kh = 0; kh < a->n_kv_heads; kh++) {
                impl->attn_task(a, t, s, kh);
            }
        }
        return;
    }
    kn__pool_run(nt, n_tasks, kn_attn_chunk, (void *)a);
}

typedef struct kn_elem_job {
    const float *a, *b;
    float *out;
    size_t n;
} kn_elem_job_t;

static void
kn_silu_region(void *arg, int chunk, int n_chunks)
{
    const kn_elem_job_t *j = arg;
    size_t lo, hi;

    kn_share(j->n, 16, chunk, n_chunks, &lo, &hi);
    if (lo < hi) {
        kn_impl->silu_mul(j->a + lo, j->b + lo, j->out + lo, hi - lo);
    }
}

static void
kn_add_region(void *arg, int chunk, int n_chunks)
{
    const kn_elem_job_t *j = arg;
    size_t lo, hi;

    kn_share(j->n, 16, chunk, n_chunks, &lo, &hi);
    if (lo < hi) {
        kn_impl->add(j->out + lo, j->b + lo, hi - lo);
    }
}

void
kn_cpu_silu_mul(const float *gate, const float *up, float *out, size_t n)
{
    int nt = kn_team((long)n, KN_PAR_ELEM);
    kn_elem_job_t j = {.a = gate, .b = up, .out = out, .n = n};

    if (nt <= 1) {
        kn_impl->silu_mul(gate, up, out, n);
        return;
    }
    kn__pool_run(nt, kn_chunks_for(nt, (long)(n / 256)), kn_silu_region, &j);
}

void
kn_cpu_embed(const float *table, const int32_t *tokens, int32_t n_tok, int32_t dim, float *out)
{
    for (int32_t t = 0; t < n_tok; t++) {
        memcpy(out + (size_t)t * dim, table + (size_t)tokens[t] * dim, sizeof(float) * (size_t)dim);
    }
}

void
kn_cpu_add(float *x, const float *y, size_t n)
{
    int nt = kn_team((long)n, KN_PAR_ELEM);
    kn_elem_job_t j = {.b = y, .out = x, .n = n};

    if (nt <= 1) {
        kn_impl->add(x, y, n);
        return;
    }
    kn__pool_run(nt, kn_chunks_for(nt, (long)(n / 256)), kn_add_region, &j);
}
