/* bench_burst.c - preemptions under a bursty load, by admission watermark.
 *
 * A scripted model (no forward: every sample is a fixed non-EOS token)
 * drives sched_step + sched_commit through bursts of requests (random
 * prompt and output lengths, 4 tenants) arriving every BURST_EVERY steps
 * into a KV pool smaller than the bursts' peak need, once per watermark
 * (--kv-watermark) and swap tier size. It prints, per run, the
 * preemptions by swap and by recompute, the steps to drain everything and
 * the mean running batch: counts only, nothing timed, nothing asserted
 * beyond every request finishing (DESIGN.md 7).
 *
 * Usage: bench_burst [WATERMARK ...]   (default 0 0.01 0.02 0.05)
 *
 * Thread: single-threaded (it is the engine thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "scheduler/sched.h"

#define BS 16
#define BLOCKS 1024 /* 16K tokens of KV */
#define SEQS 128
#define BURSTS 8
#define BURST_SIZE 96
#define BURST_EVERY 40
#define TENANTS 4

static uint32_t rng_state;

static uint32_t
rnd(uint32_t n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

static uint64_t n_finished;

static int
on_event(void *arg, const sched_event_t *ev)
{
    (void)arg;
    n_finished += ev->kind == SCHED_EV_FINISHED || ev->kind == SCHED_EV_ERROR;
    return ST_OK;
}

static void
must(int rc, const char *what)
{
    if (rc != ST_OK) {
        fprintf(stderr, "bench_burst: %s: %s\n", what, st_str(rc));
        exit(1);
    }
}

static void
run(float watermark, uint32_t swap_blocks)
{
    bm_config_t bc = {.block_size = BS,
                      .num_blocks = BLOCKS + 1,
                      .swap_blocks = swap_blocks,
                      .prefix_caching = 1,
                      .watermark = watermark};
    sched_config_t sc;
    bm_pool_t *pool;
    sched_t *s;
    sched_plan_t plan;
    sched_stats_t st;
    smp_result_t res[SEQS];
    uint64_t id = 0, steps = 0, rows = 0;

    must(bm_pool_create(&bc, &pool), "pool");
    memset(&sc, 0, sizeof(sc));
    sc.max_num_seqs = SEQS;
    sc.max_num_batched_tokens = 2048;
    sc.max_model_len = 1024;
    sc.vocab_size = 32000;
    sc.prefix_caching = 1;
    sc.eos_ids[0] = 2;
    sc.n_eos = 1;
    sc.n_tenants = TENANTS;
    for (int t = 0; t < TENANTS; t++) {
        snprintf(sc.tenants[t].name, sizeof(sc.tenants[t].name), "t%d", t);
        sc.tenants[t].weight = 1.0;
        sc.tenants[t].max_kv_share = 1.0;
    }
    sc.random_seed = 1;
    must(sched_create(&sc, pool, on_event, NULL, &s), "sched");
    rng_state = 42;
    n_finished = 0;
    memset(res, 0, sizeof(res));
    for (;;) {
        if (steps % BURST_EVERY == 0 && steps / BURST_EVERY < BURSTS) {
            for (int i = 0; i < BURST_SIZE; i++) {
                eng_request_t r;

                memset(&r, 0, sizeof(r));
                r.id = ++id;
                r.tenant = (uint32_t)(id % TENANTS);
                r.n_prompt = 32 + (int32_t)rnd(480);
                r.prompt = xmalloc((size_t)r.n_prompt * sizeof(int32_t));
                for (int32_t k = 0; k < r.n_prompt; k++) {
                    r.prompt[k] = 3 + (int32_t)rnd(30000);
                }
                r.n = 1;
                r.max_tokens = 16 + (int32_t)rnd(240);
                r.ignore_eos = 1;
                r.sampling.top_p = 1.0f;
                r.sampling.repetition_penalty = 1.0f;
                must(sched_submit(s, &r, NULL), "submit");
            }
        }
        if (sched_idle(s) && steps / BURST_EVERY >= BURSTS) {
            break;
        }
        sched_step(s, &plan);
        bm_pool_ops_clear(pool);
        for (int32_t i = 0; i < plan.n_samples; i++) {
            res[i].token = 3 + (int32_t)((steps * 31 + (uint64_t)i) % 1000);
        }
        sched_commit(s, &plan, res);
        rows += (uint64_t)plan.batch.n_seqs;
        steps++;
    }
    sched_get_stats(s, &st);
    if (n_finished != id) {
        fprintf(stderr, "bench_burst: %llu of %llu requests finished\n",
                (unsigned long long)n_finished, (unsigned long long)id);
        exit(1);
    }
    printf("%9.3f %6u %10llu %10llu %10llu %8llu %10.1f\n", watermark,
           (unsigned)(watermark * BLOCKS), (unsigned long long)st.preempt_swap,
           (unsigned long long)st.preempt_recompute,
           (unsigned long long)(st.preempt_swap + st.preempt_recompute),
           (unsigned long long)steps, (double)rows / (double)steps);
    fflush(stdout);
    sched_destroy(s);
    bm_pool_destroy(pool);
}

int
main(int argc, char **argv)
{
    float marks[16] = {0.0f, 0.01f, 0.02f, 0.05f};
    int n_marks = 4;
    static const uint32_t swaps[2] = {0, 512};

    if (argc > 1) {
        n_marks = 0;
        for (int i = 1; i < argc && n_marks < 16; i++) {
            marks[n_marks++] = (float)atof(argv[i]);
        }
    }
    for (int k = 0; k < 2; k++) {
        printf("bursts of %d requests every %d steps (x%d), %d KV blocks of %d, swap tier %u "
               "blocks, max_num_seqs %d, scripted model\n",
               BURST_SIZE, BURST_EVERY, BURSTS, BLOCKS, BS, swaps[k], SEQS);
        printf("%9s %6s %10s %10s %10s %8s %10s\n", "watermark", "blocks", "swap", "recompute",
               "preempted", "steps", "mean rows");
        for (int i = 0; i < n_marks; i++) {
            run(marks[i], swaps[k]);
        }
    }
    return 0;
}
