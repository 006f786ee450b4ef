/* bench_sched.c - scheduler + block manager time per step at scale.
 *
 * A scripted model (no forward: every sample is a fixed non-EOS token)
 * drives sched_step + sched_commit with N running sequences spread over 4
 * tenants, for N = 256, 1024 and 4096 (or the sizes given). After the
 * prompts are in (prefill steps), it times decode steps only and prints
 * microseconds per step, per sequence, and the growth against the first
 * size next to n and n log n. Each step is timed alone and the median is
 * reported (the machine is shared: a mean would report the neighbours). Figures only, no assertions beyond the calls
 * succeeding: timings are never tested (DESIGN.md 7).
 *
 * Usage: bench_sched [N ...]; KVSERVE_BENCH_FULL_TABLES=1 rebuilds the
 * block tables whole every step instead of sending their changes.
 *
 * Thread: single-threaded (it is the engine thread).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "scheduler/sched.h"

#define BS 16
#define PROMPT 48
#define STEPS 64
#define TENANTS 4

static int
on_event(void *arg, const sched_event_t *ev)
{
    (void)arg;
    (void)ev;
    return ST_OK;
}

static void
must(int rc, const char *what)
{
    if (rc != ST_OK) {
        fprintf(stderr, "bench_sched: %s: %s\n", what, st_str(rc));
        exit(1);
    }
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* Runs N sequences; returns the median microseconds per decode step and
 * the mean in *mean_us. */
static double
run(int32_t n, double *mean_us)
{
    int32_t ctx = PROMPT + 2 * STEPS + 64;
    bm_config_t bc = {.block_size = BS,
                      .num_blocks = (uint32_t)(n * ((ctx + BS - 1) / BS) + 1),
                      .prefix_caching = 1,
                      .watermark = 0.01f};
    sched_config_t sc;
    bm_pool_t *pool;
    sched_t *s;
    sched_plan_t plan;
    smp_result_t *res = xcalloc((size_t)n, sizeof(*res));
    uint64_t t0, dt[STEPS];
    double us;

    must(bm_pool_create(&bc, &pool), "pool");
    memset(&sc, 0, sizeof(sc));
    sc.max_num_seqs = n;
    sc.max_num_batched_tokens = n * 4 > 8192 ? n * 4 : 8192;
    sc.max_model_len = ctx;
    sc.vocab_size = 32000;
    sc.prefix_caching = 1;
    sc.eos_ids[0] = 2;
    sc.n_eos = 1;
    sc.n_tenants = TENANTS;
    for (int t = 0; t < TENANTS; t++) {
        snprintf(sc.tenants[t].name, sizeof(sc.tenants[t].name), "t%d", t);
        sc.tenants[t].weight = 1.0 + t;
        sc.tenants[t].max_kv_share = 1.0;
    }
    sc.random_seed = 1;
    /* Block tables rebuilt whole each step (the layout before issue 15's
     * persistent rows), for a side-by-side figure. */
    sc.full_tables = getenv("KVSERVE_BENCH_FULL_TABLES") != NULL;
    must(sched_create(&sc, pool, on_event, NULL, &s), "sched");
    for (int32_t i = 0; i < n; i++) {
        eng_request_t r;

        memset(&r, 0, sizeof(r));
        r.id = (uint64_t)i + 1;
        r.tenant = (uint32_t)(i % TENANTS); /* interleaved tenants */
        r.prompt = xmalloc(PROMPT * sizeof(int32_t));
        for (int32_t k = 0; k < PROMPT; k++) {
            r.prompt[k] = 3 + (int32_t)((uint32_t)(i * 7919 + k * 104729) % 30000);
        }
        r.n_prompt = PROMPT;
        r.n = 1;
        r.max_tokens = 4 * STEPS;
        r.ignore_eos = 1;
        r.priority = i % 3;
        r.sampling.top_p = 1.0f;
        r.sampling.repetition_penalty = 1.0f;
        must(sched_submit(s, &r, NULL), "submit");
    }
    /* Prefill until every sequence decodes. */
    for (int guard = 0; guard < 1000; guard++) {
        sched_stats_t st;

        sched_step(s, &plan);
        bm_pool_ops_clear(pool);
        for (int32_t i = 0; i < plan.n_samples; i++) {
            res[i].token = 3 + i % 1000;
        }
        sched_commit(s, &plan, res);
        sched_get_stats(s, &st);
        if (st.waiting == 0 && plan.batch.n_tokens == plan.batch.n_seqs) {
            break;
        }
    }
    for (int step = 0; step < STEPS; step++) {
        t0 = now_ns();
        sched_step(s, &plan);
        bm_pool_ops_clear(pool);
        if (plan.batch.n_seqs != n) {
            fprintf(stderr, "bench_sched: step %d ran %d of %d sequences\n", step,
                    plan.batch.n_seqs, n);
            exit(1);
        }
        for (int32_t i = 0; i < plan.n_samples; i++) {
            res[i].token = 3 + (step * 31 + i) % 1000;
        }
        sched_commit(s, &plan, res);
        dt[step] = now_ns() - t0;
    }
    *mean_us = 0;
    for (int step = 0; step < STEPS; step++) {
        *mean_us += (double)dt[step] / 1e3 / STEPS;
    }
    qsort(dt, STEPS, sizeof(dt[0]), cmp_u64);
    us = (double)dt[STEPS / 2] / 1e3;
    sched_abort_all(s, ST_ECANCELED);
    sched_destroy(s);
    bm_pool_destroy(pool);
    free(res);
    return us;
}

int
main(int argc, char **argv)
{
    int32_t sizes[16] = {256, 1024, 4096};
    int n_sizes = 3;
    double base_us = 0;

    if (argc > 1) {
        n_sizes = 0;
        for (int i = 1; i < argc && n_sizes < 16; i++) {
            sizes[n_sizes++] = atoi(argv[i]);
        }
    }
    printf("scheduler + blockmgr per decode step (median of %d), %d tenants, scripted model\n",
           STEPS, TENANTS);
    printf("%8s %12s %12s %10s %10s %10s %12s\n", "running", "us/step", "mean us", "us/seq",
           "growth", "n", "n log n");
    for (int i = 0; i < n_sizes; i++) {
        double mean;
        double us = run(sizes[i], &mean);
        double r = (double)sizes[i] / sizes[0];

        if (i == 0) {
            base_us = us;
        }
        printf("%8d %12.1f %12.1f %10.3f %9.2fx %9.2fx %11.2fx\n", sizes[i], us, mean, us / sizes[i],
               us / base_us, r, r * log((double)sizes[i]) / log((double)sizes[0]));
        fflush(stdout);
    }
    return 0;
}
