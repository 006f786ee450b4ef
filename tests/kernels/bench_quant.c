/* bench_quant.c - micro-benchmark of the weight kernels (kn_matmul_w),
 * not run by `meson test`.
 *
 *   bench_quant [THREADS...] [isa=N] [ms=M] [type=NAME] [ntok=N] [shape=RxC] [hot] [thp]
 *               [medium]
 *
 * For each thread count (default 1 and 2): the machine's streaming read
 * bandwidth (a vectorized sum over 512 MB), then per weight type the
 * Llama-1B-ish shapes 2048 x 2048 (attention projections), 8192 x 2048
 * (FFN up / gate) and 2048 x 8192 (FFN down) at n_tok 1, 8 and 32. Each call reads a different copy
 * of the weight out of enough copies to fill 256 MB, so GEMV streams from
 * memory as in a decode step, not from the last-level cache. Prints the
 * time per call of the best pass over all copies (after a warm-up pass),
 * GB/s of weight bytes, and GFLOP/s (2 * rows * cols * n_tok); then the
 * same from the process CPU time per thread (cpu-ms, cGB/s, cGFLOP/s):
 * on a shared host, where the wall clock includes other processes' turns,
 * the CPU-time rates are what the kernel does when it runs (they count
 * the team's spin-waits as busy, so they never flatter a parallel run).
 * isa=N forces a kn_isa_t level; type= picks one type and ntok= one batch
 * size (any, not only 1 / 8 / 32); hot reuses one copy (weights from cache: the compute rate);
 * medium sets kn_act_t bf16_medium (BF16 weights read one bf16 term).
 * shape=RxC runs that one shape (C a multiple of 2048, e.g. 512x2048 for k / v);
 * thp puts the weights on transparent huge pages (MADV_HUGEPAGE), as the
 * model's repacked matrices are (model/cpu_repack.c).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_quant.h"

#define POOL_BYTES (256u << 20)
#define READ_BYTES (512u << 20)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static double
clock_s(clockid_t clk)
{
    struct timespec ts;

    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double
now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

typedef struct rd_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} rd_job_t;

static void *
rd_run(void *arg)
{
    rd_job_t *j = arg;
    uint64_t s[8] = {0};

    for (size_t i = 0; i + 8 <= j->n; i += 8) {
        for (int k = 0; k < 8; k++) {
            s[k] += j->p[i + k];
        }
    }
    j->sum = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    return NULL;
}

/* Best of 5 passes over READ_BYTES split among nt threads, in GB/s. */
static double
read_bw(const uint64_t *buf, int nt)
{
    double best = 0;

    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[16];
        rd_job_t j[16];
        size_t per = READ_BYTES / 8 / (size_t)nt;
        double t0 = now_s();

        for (int i = 0; i < nt; i++) {
            j[i] = (rd_job_t){buf + (size_t)i * per, per, 0};
            pthread_create(&th[i], NULL, rd_run, &j[i]);
        }
        for (int i = 0; i < nt; i++) {
            pthread_join(th[i], NULL);
        }
        double gb = READ_BYTES / (now_s() - t0) / 1e9;

        best = gb > best ? gb : best;
        if (j[0].sum == 42) {
            printf(" ");
        }
    }
    return best;
}

int
main(int argc, char **argv)
{
    int threads[8], n_threads = 0, isa = -1, only_ntok = 0, hot = 0, thp = 0, medium = 0;
    const char *only_type = NULL;
    double ms_budget = 300;
    int32_t shapes[3][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
    int n_shapes = 3;
    static const int32_t n_toks[3] = {1, 8, 32};

    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "isa=", 4) == 0) {
            isa = atoi(argv[i] + 4);
        } else if (strncmp(argv[i], "type=", 5) == 0) {
            only_type = argv[i] + 5;
        } else if (strncmp(argv[i], "ntok=", 5) == 0) {
            only_ntok = atoi(argv[i] + 5);
            only_ntok = only_ntok > 32 ? 32 : only_ntok; /* the buffers hold 32 tokens */
        } else if (strcmp(argv[i], "medium") == 0) {
            medium = 1;
        } else if (strncmp(argv[i], "shape=", 6) == 0) {
            if (sscanf(argv[i] + 6, "%dx%d", &shapes[0][0], &shapes[0][1]) != 2 ||
                shapes[0][0] <= 0 || shapes[0][0] % 16 != 0 || shapes[0][1] <= 0 ||
                shapes[0][1] % 2048 != 0 || shapes[0][1] > 8192) {
                fprintf(stderr, "shape=RxC: R a multiple of 16, C of 2048, C <= 8192\n");
                return 1;
            }
            n_shapes = 1;
        } else if (strcmp(argv[i], "thp") == 0) {
            thp = 1;
        } else if (strcmp(argv[i], "hot") == 0) {
            hot = 1;
        } else if (strncmp(argv[i], "ms=", 3) == 0) {
            ms_budget = atof(argv[i] + 3);
        } else if (n_threads < 8) {
            threads[n_threads++] = atoi(argv[i]);
        }
    }
    if (n_threads == 0) {
        threads[n_threads++] = 1;
        threads[n_threads++] = 2;
    }
    kn_cpu_init(1);
    if (isa >= 0 && kn_cpu_set_isa((kn_isa_t)isa) != 0) {
        fprintf(stderr, "isa %d not supported here\n", isa);
        return 1;
    }
    printf("kernels: %s\n", kn_isa_name(kn_cpu_isa()));

    uint64_t *rbuf = malloc(READ_BYTES);
    uint8_t *pool = aligned_alloc(2u << 20, POOL_BYTES);

    if (thp) { /* as model/cpu_repack.c's buffers */
        (void)madvise(pool, POOL_BYTES, MADV_HUGEPAGE);
    }
    float *src = malloc(sizeof(float) * 2048 * 2048);
    float *x = malloc(sizeof(float) * 32 * 8192), *y = malloc(sizeof(float) * 32 * 8192);
    void *abuf = malloc(kn_act_bytes(32, 8192));

    memset(rbuf, 1, READ_BYTES);
    for (size_t i = 0; i < 2048 * 2048; i++) {
        src[i] = frand();
    }
    for (size_t i = 0; i < 32 * 8192; i++) {
        x[i] = frand();
    }
    for (int ti = 0; ti < n_threads; ti++) {
        int nt = threads[ti];

        kn_cpu_init(nt);
        printf("\nthreads %d: streaming read %.1f GB/s\n", nt, read_bw(rbuf, nt));
        printf("%-5s %-11s %5s %9s %8s %9s %9s %8s %9s\n", "type", "shape", "n_tok", "ms/call",
               "GB/s", "GFLOP/s", "cpu-ms", "cGB/s", "cGFLOP/s");
        /* after the file types: q4_k_r8, q6_k_r8, q8_0_r16 */
        for (int ti8 = 0; ti8 <= KN_W_NTYPES + 2; ti8++) {
            kn_wtype_t t = ti8 == KN_W_NTYPES       ? KN_W_Q4_K_R8
                           : ti8 == KN_W_NTYPES + 1 ? KN_W_Q6_K_R8
                           : ti8 == KN_W_NTYPES + 2 ? KN_W_Q8_0_R16
                                                    : (kn_wtype_t)ti8;
            int r8 = t == KN_W_Q4_K_R8 || t == KN_W_Q6_K_R8;
            size_t rb = kn_wtype_row_bytes(t, 2048);

            if (only_type != NULL && strcmp(only_type, kn_wtype_name(t)) != 0) {
                continue;
            }

            /* 2048 distinct quantized rows; larger matrices repeat them. */
            if (r8) { /* q4_K / q6_K rows, repacked */
                kn_wtype_t ft = t == KN_W_Q4_K_R8 ? KN_W_Q4_K : KN_W_Q6_K;
                size_t rb4 = kn_wtype_row_bytes(ft, 2048);
                uint8_t *q4 = malloc(rb4 * 2048);
                kn_weight_t w4 = {ft, q4, rb4, 2048, 2048}, wr;

                for (int32_t r = 0; r < 2048; r++) {
                    kn_quant_row(ft, src + (size_t)r * 2048, q4 + rb4 * r, 2048);
                }
                if (ft == KN_W_Q4_K) {
                    kn_q4r8_repack(&w4, pool, &wr);
                } else {
                    kn_q6r8_repack(&w4, pool, &wr);
                }
                free(q4);
            }
            if (t == KN_W_Q8_0_R16) { /* q8_0 rows, repacked */
                uint8_t *q8 = malloc(rb * 2048);
                kn_weight_t w8 = {KN_W_Q8_0, q8, rb, 2048, 2048}, rp;

                for (int32_t r = 0; r < 2048; r++) {
                    kn_quant_row(KN_W_Q8_0, src + (size_t)r * 2048, q8 + rb * r, 2048);
                }
                kn_q8r16_repack(&w8, pool, &rp);
                free(q8);
            }
            for (int32_t r = 0; r < 2048 && !r8 && t != KN_W_Q8_0_R16; r++) {
                kn_quant_row(t, src + (size_t)r * 2048, pool + rb * r, 2048);
            }
            for (int s = 0; s < n_shapes; s++) {
                int32_t rows = shapes[s][0], cols = shapes[s][1];
                /* wider rows: consecutive 2048-column rows end to end */
                size_t rbm = rb * (size_t)(cols / 2048), mat = rbm * (size_t)rows;
                int copies = hot ? 1 : (int)(POOL_BYTES / mat);

                for (size_t off = rb * 2048; off + rb * 2048 <= (size_t)copies * mat;
                     off += rb * 2048) {
                    memcpy(pool + off, pool, rb * 2048);
                }
                for (int ni = 0; ni < (only_ntok > 0 ? 1 : 3); ni++) {
                    int32_t n_tok = only_ntok > 0 ? only_ntok : n_toks[ni];
                    kn_act_t act;

                    double best = 1e30, spent = 0, best_cpu = 1e30;

                    /* Passes over every copy (the first one warms up); each call
                     * quantizes its activations anew (no sharing: the worst case). */
                    for (int pass = 0;
                         pass < (hot ? 1000000 : 6) && (pass < 2 || spent < ms_budget * 1e-3);
                         pass++) {
                        double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), dt, dc;

                        for (int c = 0; c < copies; c++) {
                            kn_weight_t w = {t, pool + (size_t)c * mat, rbm, rows, cols};

                            kn_act_init(&act, x, n_tok, cols, abuf);
                            act.bf16_medium = medium;
                            kn_matmul_w(&act, &w, NULL, y, 0);
                        }
                        dt = (now_s() - t0) / copies;
                        dc = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / copies / nt;
                        if (pass > 0) {
                            spent += dt * copies;
                            best = dt < best ? dt : best;
                            best_cpu = dc < best_cpu ? dc : best_cpu;
                        }
                    }
                    printf("%-5s %5dx%-5d %5d %9.3f %8.1f %9.1f %9.3f %8.1f %9.1f\n",
                           kn_wtype_name(t), rows, cols, n_tok, best * 1e3,
                           (double)mat / best / 1e9, 2.0 * rows * cols * n_tok / best / 1e9,
                           best_cpu * 1e3, (double)mat / best_cpu / 1e9,
                           2.0 * rows * cols * n_tok / best_cpu / 1e9);
                }
            }
        }
    }
    free(rbuf);
    free(pool);
    free(src);
    free(x);
    free(y);
    free(abuf);
    return 0;
}
