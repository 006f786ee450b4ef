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
} kn_impl_t;

/* A fork-join region body: member idx of a team of `team` threads. */
typedef void (*kn_region_fn)(void *arg, int idx, int team);

/* Runs fn(arg, idx, team) for idx 0..team-1 on the kernel thread team
 * (kn_pool.c), the caller being member 0; returns when all are done.
 * team <= 1, or another region already running, runs fn(arg, 0, 1) alone. */
void kn__pool_run(int team, kn_region_fn fn, void *arg);

extern const kn_impl_t kn__impl_generic;
extern const kn_impl_t kn__impl_avx2;
extern const kn_impl_t kn__impl_avx512;

#endif /* KERNELS_CPU_KN_INT_H */
