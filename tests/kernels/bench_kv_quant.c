/* bench_kv_quant.c - micro-benchmark of paged decode attention over the
 * compressed KV store (kn_kvq_attention) against the f32 kernel
 * (kn_cpu_attention), not run by `meson test`.
 *
 *   bench_kv_quant [CTX] [ROUNDS] [SEQS]
 *
 * Shape of the 135M-class model (SmolLM-135M): 30 layers, 9 query heads,
 * 3 KV heads x 64, block 16. SEQS sequences (default 1) of CTX tokens
 * (default 2000) are written into one store per dtype; one "token" is a
 * decode query per sequence through every layer, so the KV comes from
 * memory as in a real decode step (30 layers of 2,000 tokens are 92 MB in
 * f32). Single thread. Prints, per ISA this CPU has and per dtype, the
 * best and median thread CPU time per token over ROUNDS rounds (steadier
 * than wall time on a shared host), the best wall time, and the CPU time
 * ratio of f32 attention (kn_cpu_attention) at the same ISA to it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kv_quant.h"

#define B_LAYERS 30
#define B_HEADS 9
#define B_KV 3
#define B_HD 64
#define B_BS 16

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static double
now_s(clockid_t clk)
{
    struct timespec ts;

    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

typedef struct bench {
    int32_t ctx, n_seqs, max_blocks, n_blocks;
    int32_t *bt, *qs, *cl;
    float *q, *out;
    float *kc, *vc; /* f32 pools: [layer][block][kv][bs][hd] */
} bench_t;

/* Random K/V of token j of sequence s at layer l, channel 5 an outlier
 * channel in the keys (as real keys have). */
static void
kv_row(float *k, float *v)
{
    for (int32_t i = 0; i < B_KV * B_HD; i++) {
        k[i] = frand() * (i % B_HD == 5 ? 6.0f : 1.0f);
        v[i] = frand();
    }
}

/* Times `rounds` decode tokens (every layer, every sequence); st NULL
 * runs kn_cpu_attention on the f32 pools. Returns the best and median
 * thread CPU time and the best wall time, in s. */
static void
run(const bench_t *b, const kn_kvq_store_t *st, int rounds, double *best, double *med,
    double *wall)
{
    double *t = malloc(sizeof(double) * (size_t)rounds);
    kn_attn_args_t a = {
        .out = b->out,
        .q = b->q,
        .query_start = b->qs,
        .context_len = b->cl,
        .block_tables = b->bt,
        .max_blocks = b->max_blocks,
        .n_seqs = b->n_seqs,
        .n_tok = b->n_seqs,
        .n_heads = B_HEADS,
        .n_kv_heads = B_KV,
        .head_dim = B_HD,
        .block_size = B_BS,
        .scale = 0.125f,
    };
    size_t layer_floats = (size_t)b->n_blocks * B_KV * B_BS * B_HD;

    *wall = INFINITY;
    for (int r = -1; r < rounds; r++) { /* round -1 warms up */
        double t0 = now_s(CLOCK_THREAD_CPUTIME_ID), w0 = now_s(CLOCK_MONOTONIC);

        for (int32_t l = 0; l < B_LAYERS; l++) {
            if (st == NULL) {
                a.k_cache = b->kc + (size_t)l * layer_floats;
                a.v_cache = b->vc + (size_t)l * layer_floats;
                kn_cpu_attention(&a);
            } else {
                kn_kvq_attention(st, l, &a);
            }
        }
        if (r >= 0) {
            t[r] = now_s(CLOCK_THREAD_CPUTIME_ID) - t0;
            w0 = now_s(CLOCK_MONOTONIC) - w0;
            *wall = w0 < *wall ? w0 : *wall;
        }
    }
    qsort(t, (size_t)rounds, sizeof(double), cmp_double);
    *best = t[0];
    *med = t[rounds / 2];
    free(t);
}

int
main(int argc, char **argv)
{
    static const kn_kvq_fmt_t fmts[] = {KN_KVQ_F32,  KN_KVQ_F16,  KN_KVQ_BF16,
                                        KN_KVQ_FP8,  KN_KVQ_INT8, KN_KVQ_INT4};
    bench_t b;
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    char err[160];

    memset(&b, 0, sizeof(b));
    b.ctx = argc > 1 ? atoi(argv[1]) : 2000;
    b.n_seqs = argc > 3 ? atoi(argv[3]) : 1;
    if (b.ctx < 1 || rounds < 1 || b.n_seqs < 1 || b.n_seqs > 64) {
        fprintf(stderr, "usage: bench_kv_quant [CTX] [ROUNDS] [SEQS]\n");
        return 2;
    }
    kn_cpu_init(1);
    b.max_blocks = (b.ctx + B_BS - 1) / B_BS;
    b.n_blocks = 1 + b.n_seqs * b.max_blocks;
    b.bt = malloc(sizeof(int32_t) * (size_t)b.n_seqs * b.max_blocks);
    b.qs = malloc(sizeof(int32_t) * (size_t)(b.n_seqs + 1));
    b.cl = malloc(sizeof(int32_t) * (size_t)b.n_seqs);
    for (int32_t s = 0; s < b.n_seqs; s++) {
        for (int32_t i = 0; i < b.max_blocks; i++) { /* interleaved, as a pool hands out */
            b.bt[s * b.max_blocks + i] = 1 + i * b.n_seqs + s;
        }
        b.qs[s] = s;
        b.cl[s] = b.ctx;
    }
    b.qs[b.n_seqs] = b.n_seqs;
    b.q = malloc(sizeof(float) * (size_t)b.n_seqs * B_HEADS * B_HD);
    b.out = malloc(sizeof(float) * (size_t)b.n_seqs * B_HEADS * B_HD);
    for (int32_t i = 0; i < b.n_seqs * B_HEADS * B_HD; i++) {
        b.q[i] = frand();
    }
    printf("decode attention, %d layers x %d heads (%d KV x %d), %d seq(s) x %d tokens, "
           "block %d, 1 thread, %d rounds\n",
           B_LAYERS, B_HEADS, B_KV, B_HD, b.n_seqs, b.ctx, B_BS, rounds);
    printf("(CPU ms per decoded token: thread CPU time, best and median of the rounds; wall: best)\n");
    printf("%-8s %-9s %9s %8s %8s %8s %7s\n", "isa", "kv", "MB/token", "cpu best", "cpu med",
           "wall", "vs f32");
    for (int isa = KN_ISA_GENERIC; isa <= (int)kn_cpu_isa_best(); isa++) {
        double f32_best = 0.0;

        kn_cpu_set_isa((kn_isa_t)isa);
        for (int f = -1; f < 6; f++) {
            kn_kvq_store_t *st = NULL;
            double best, med, wall, mb;
            float k[B_KV * B_HD], v[B_KV * B_HD];
            size_t layer_floats = (size_t)b.n_blocks * B_KV * B_BS * B_HD;

            rng_state = 0x9e3779b97f4a7c15ull;
            if (f < 0) { /* kn_cpu_attention over f32 pools */
                b.kc = malloc(sizeof(float) * layer_floats * B_LAYERS);
                b.vc = malloc(sizeof(float) * layer_floats * B_LAYERS);
                for (int32_t j = 0; j < b.ctx; j++) {
                    for (int32_t s = 0; s < b.n_seqs; s++) {
                        int32_t blk = b.bt[s * b.max_blocks + j / B_BS];

                        for (int32_t l = 0; l < B_LAYERS; l++) {
                            kv_row(k, v);
                            for (int32_t h = 0; h < B_KV; h++) {
                                size_t o = (size_t)l * layer_floats +
                                           (((size_t)blk * B_KV + h) * B_BS + j % B_BS) * B_HD;

                                memcpy(b.kc + o, k + h * B_HD, sizeof(float) * B_HD);
                                memcpy(b.vc + o, v + h * B_HD, sizeof(float) * B_HD);
                            }
                        }
                    }
                }
                mb = 2.0 * B_LAYERS * b.n_seqs * b.ctx * B_KV * B_HD * 4 / 1e6;
            } else {
                kn_kvq_layout_t L;

                if (kn_kvq_layout_init(&L, fmts[f], B_KV, B_BS, B_HD, err, sizeof(err)) != ST_OK ||
                    kn_kvq_store_create(&L, B_LAYERS, b.n_blocks, 0, 2 * b.n_seqs + 2, &st, err,
                                        sizeof(err)) != ST_OK) {
                    fprintf(stderr, "bench_kv_quant: %s\n", err);
                    return 1;
                }
                /* One token per sequence per step, every layer, as decode writes. */
                for (int32_t j = 0; j < b.ctx; j++) {
                    for (int32_t l = 0; l < B_LAYERS; l++) {
                        for (int32_t s = 0; s < b.n_seqs; s++) {
                            int32_t slot = b.bt[s * b.max_blocks + j / B_BS] * B_BS + j % B_BS;

                            kv_row(k, v);
                            kn_kvq_write(st, l, k, v, &slot, 1);
                        }
                    }
                    kn_kvq_end_step(st);
                }
                mb = (double)B_LAYERS * b.n_seqs * b.ctx * (double)(L.k_stride + L.v_stride) /
                     B_BS / 1e6;
            }
            run(&b, st, rounds, &best, &med, &wall);
            if (f < 0) {
                f32_best = best;
            }
            printf("%-8s %-9s %9.1f %8.2f %8.2f %8.2f %6.2fx\n", kn_isa_name((kn_isa_t)isa),
                   f < 0 ? "f32-attn" : kn_kvq_fmt_name(fmts[f]), mb, best * 1e3, med * 1e3,
                   wall * 1e3, f32_best / best);
            fflush(stdout);
            if (f < 0) {
                free(b.kc);
                free(b.vc);
            }
            kn_kvq_store_destroy(st);
        }
    }
    free(b.bt);
    free(b.qs);
    free(b.cl);
    free(b.q);
    free(b.out);
    return 0;
}
