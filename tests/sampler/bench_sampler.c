/* bench_sampler.c - prints sampler throughput (samples/s), not a test.
 *
 * Vocabularies 1024, 32000 (Llama 2) and 128256 (Llama 3), logits
 * ~ N(0, 2), with the parameter sets a server sees: greedy, plain
 * temperature, top_p = 0.9, top_k = 50 + top_p = 0.9, min_p = 0.05, and
 * top_p with penalties and 20 logprobs; "no lp" rows are requests that ask
 * for no logprob (what the server and `kvserve bench` send). Each call gets
 * a fresh copy of the logits (the copy is timed too, as in the engine where
 * the forward writes a new row each step). Times are thread CPU time. Every
 * row is timed with each vector width this CPU has (smp_simd.c), widest
 * first; the sampler uses the widest.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "sampler/sampler.h"
#include "sampler/sampler_int.h"

static double
now_s(void)
{
    struct timespec ts;

    /* CPU time of this thread: the machine may be shared, and the figure
     * wanted is the sampler's cost per call, not the scheduler's. */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double
bench1(int32_t vocab, smp_isa_t isa, const smp_params_t *p, const float *logits, float *work,
       const int32_t *hist, int32_t n_hist)
{
    smp_ctx_t *c;
    smp_rng_t rng;
    smp_result_t res;
    double t0, dt;
    int n = 0;
    long sink = 0;

    if (smp_ctx_create(vocab, &c) != ST_OK) {
        fprintf(stderr, "smp_ctx_create failed\n");
        exit(1);
    }
    if (smp__ctx_set_isa(c, isa) != ST_OK) {
        smp_ctx_destroy(c);
        return -1.0;
    }
    smp_rng_seed(&rng, 1);
    t0 = now_s();
    do {
        for (int i = 0; i < 20; i++, n++) {
            memcpy(work, logits, (size_t)vocab * sizeof(float));
            if (smp_sample(c, p, &rng, work, hist, n_hist, n_hist / 2, &res) != ST_OK) {
                fprintf(stderr, "smp_sample failed\n");
                exit(1);
            }
            sink += res.token;
        }
        dt = now_s() - t0;
    } while (dt < 0.3);
    smp_ctx_destroy(c);
    (void)sink;
    return dt / n * 1e6;
}

static void
bench(int32_t vocab, const char *name, const smp_params_t *p, const float *logits, float *work,
      const int32_t *hist, int32_t n_hist)
{
    printf("vocab %6d  %-36s", vocab, name);
    for (int isa = SMP_ISA_COUNT - 1; isa >= 0; isa--) {
        double us = bench1(vocab, (smp_isa_t)isa, p, logits, work, hist, n_hist);

        if (us >= 0.0) {
            printf("  %s %7.1f us", smp__kern((smp_isa_t)isa)->name, us);
        }
    }
    printf("\n");
    fflush(stdout);
}

int
main(void)
{
    const int32_t vocabs[3] = {1024, 32000, 128256};
    int32_t hist[256];

    for (int i = 0; i < 256; i++) {
        hist[i] = (i * 7919) % 1024;
    }
    for (int v = 0; v < 3; v++) {
        int32_t n = vocabs[v];
        float *l = malloc((size_t)n * sizeof(float));
        float *w = malloc((size_t)n * sizeof(float));
        smp_rng_t r;
        smp_params_t base = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
        smp_params_t p;

        smp_rng_seed(&r, 42);
        for (int32_t i = 0; i < n; i++) {
            double u1 = smp_rng_uniform(&r) + 1e-12, u2 = smp_rng_uniform(&r);
            l[i] = (float)(2.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
        p = base;
        p.temperature = 0.0f;
        bench(n, "greedy", &p, l, w, NULL, 0);
        p.no_logprob = 1;
        bench(n, "greedy, no lp", &p, l, w, NULL, 0);
        p = base;
        bench(n, "temperature 1", &p, l, w, NULL, 0);
        p.no_logprob = 1;
        bench(n, "temperature 1, no lp", &p, l, w, NULL, 0);
        p.temperature = 0.7f;
        bench(n, "temperature 0.7, no lp", &p, l, w, NULL, 0);
        p = base;
        p.top_p = 0.9f;
        bench(n, "top_p 0.9", &p, l, w, NULL, 0);
        p.temperature = 0.7f;
        bench(n, "temperature 0.7 top_p 0.9", &p, l, w, NULL, 0);
        p.no_logprob = 1;
        bench(n, "temperature 0.7 top_p 0.9, no lp", &p, l, w, NULL, 0);
        p = base;
        p.top_k = 50;
        p.top_p = 0.9f;
        bench(n, "top_k 50 top_p 0.9", &p, l, w, NULL, 0);
        p = base;
        p.min_p = 0.05f;
        bench(n, "min_p 0.05", &p, l, w, NULL, 0);
        p = base;
        p.top_p = 0.9f;
        p.repetition_penalty = 1.1f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.5f;
        p.n_logprobs = 20;
        bench(n, "top_p 0.9 + penalties + 20 lp", &p, l, w, hist, 256);
        free(l);
        free(w);
    }
    return 0;
}
