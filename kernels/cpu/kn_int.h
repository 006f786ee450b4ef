/* kn_int.h - internals shared by the CPU kernel files: the per-ISA
 * implementation tables that kn_cpu.c dispatches through.
 *
 * kn_simd.c compiles kn_simd_body.inc once per ISA (generic, AVX2+FMA,
 * AVX-512) under GCC target pragmas; each copy fills one kn_impl_t.
 * Every function works on a slice the caller chose, single-threaded; the
 * split over the thread team (kn_pool.c) happens in kn_cpu.c.
 *
 * Thread: the tables are constant.
 */
#ifndef KERNELS_CPU_KN_INT_H
#define KERNELS_CPU_KN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn_cpu.h"

typedef struct kn_impl {
    /* rows [0, n_tok) of x, y: (n_tok, dim) */
    void (*rmsnorm)(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim,
                    float eps);
    /* x: (n_tok, n_heads * head_dim); cos, sin: (n_tok, head_dim / 2) */
    void (*rope)(float *x, int32_t n_tok, int32_t n_heads, int32_t head_dim, const float *cos_t,
                 const float *sin_t);
    /* One query token t of seq s against KV head kh: writes the outputs of
     * the n_heads / n_kv_heads query heads that share kh. */
    void (*attn_task)(const kn_attn_args_t *a, int32_t t, int32_t s, int32_t kh);
    void (*silu_mul)(const float *gate, const float *up, float *out, size_t n);
    void (*add)(float *x, const float *y, size_t n);
    /* Rows [r0, r1) of y (m, d_out) = x (m, k) @ w (d_out, k)^T, plus y
     * when accumulate: the few-token GEMM. */
    void (*gemm_small)(const float *x, const float *w, float *y, int32_t m, int32_t k,
                       int32_t d_out, int32_t r0, int32_t r1, int accumulate);
} kn_impl_t;

/* The table of the ISA in use (kn_cpu_set_isa). */
const kn_impl_t *kn__impl_cur(void);

/* One chunk of a fork-join region: chunk c of n_chunks. */
typedef void (*kn_chunk_fn)(void *arg, int chunk, int n_chunks);

/* Runs fn(arg, c, n_chunks) for every c in [0, n_chunks) on the kernel
 * thread team (kn_pool.c): the caller and up to team - 1 workers claim
 * chunks in any order; returns when every chunk is done. team <= 1, or
 * another region already running, runs every chunk on the caller. */
void kn__pool_run(int team, int n_chunks, kn_chunk_fn fn, void *arg);

/* Threads a default run uses: one per physical core of the affinity mask
 * (kn_cpus.c). */
int kn_cpu_default_threads(void);

extern const kn_impl_t kn__impl_generic;
extern const kn_impl_t kn__impl_avx2;
extern const kn_impl_t kn__impl_avx512;

#endif /* KERNELS_CPU_KN_INT_H */
