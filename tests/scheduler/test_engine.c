/* test_engine.c - the engine with the real default model
 * (models/austen-2.7m, found through KVSERVE_MODEL_DIR): batch invariance,
 * preemption by swap and by recompute, prefix cache, chunked prefill,
 * seeded n = 2, cancel, tenant fair share, and the thread with its
 * channels. Tests drive the engine with eng__iterate() so that every
 * step is deterministic, except the thread test. After every test every
 * block is FREE or CACHED. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "scheduler/engine.h"
#include "scheduler/engine_int.h"

#define MAX_ID 256
#define MAX_CH 2
#define MAX_OUT 1024 /* test_kv_policy_past_context generates 600 */

typedef struct res {
    int32_t tok[MAX_OUT];
    int32_t n;
    int finished;
    eng_finish_t reason;
    int32_t cached;
    int64_t first_step; /* engine step count at the first token, -1 before */
} res_t;

static mdl_model_t *model;
static chan_t outbox;
static engine_t *eng;
static res_t res[MAX_ID][MAX_CH];
static int errors[MAX_ID];

static void
load_model(void)
{
    const char *dir = getenv("KVSERVE_MODEL_DIR");
    char err[256] = "";

    if (dir == NULL) {
        dir = KVSERVE_SOURCE_ROOT "/models/austen-2.7m"; /* run outside meson test */
    }
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "load %s: %s", dir, err);
}

/* KV cache dtype of cfg_default() (test_quantized_kv_consistent). */
static mdl_kv_dtype_t cfg_kv_dtype = MDL_KV_AUTO;

static eng_config_t
cfg_default(void)
{
    eng_config_t c;

    memset(&c, 0, sizeof(c));
    c.rt.device = "cpu";
    c.rt.kv_dtype = cfg_kv_dtype;
    c.rt.n_threads = 1;
    c.rt.block_size = 16;
    c.rt.num_blocks = 512;
    c.rt.swap_blocks = 0;
    c.max_num_seqs = 32;
    c.max_num_batched_tokens = 1024;
    c.max_model_len = 256;
    c.prefix_caching = 1;
    c.n_tenants = 1;
    c.tenants[0].weight = 1.0;
    snprintf(c.tenants[0].name, sizeof(c.tenants[0].name), "default");
    return c;
}

static void
reset_results(void)
{
    memset(res, 0, sizeof(res));
    memset(errors, 0, sizeof(errors));
    for (int i = 0; i < MAX_ID; i++) {
        for (int k = 0; k < MAX_CH; k++) {
            res[i][k].first_step = -1;
        }
    }
}

static void
start(const eng_config_t *c)
{
    char err[256] = "";

    if (model == NULL) {
        load_model();
    }
    chan_init(&outbox, NULL, NULL);
    ck_assert_msg(engine_create(c, model, &outbox, &eng, err, sizeof(err)) == ST_OK, "%s", err);
    reset_results();
}

static void
drain(void)
{
    msg_t *m = chan_take_all(&outbox);
    eng_stats_t st;

    eng__stats(eng, &st);
    while (m != NULL) {
        msg_t *next = m->next;
        switch (m->type) {
        case ENG_MSG_DELTA: {
            eng_msg_delta_t *d = (eng_msg_delta_t *)m;
            res_t *r = &res[d->id][d->choice];
            ck_assert(!r->finished);
            if (r->n == 0) {
                r->first_step = (int64_t)st.steps;
            }
            for (int32_t i = 0; i < d->n_tokens; i++) {
                ck_assert_int_lt(r->n, MAX_OUT);
                r->tok[r->n++] = d->tok[i].token;
            }
            break;
        }
        case ENG_MSG_FINISHED: {
            eng_msg_finished_t *f = (eng_msg_finished_t *)m;
            res_t *r = &res[f->id][f->choice];
            ck_assert(!r->finished);
            r->finished = 1;
            r->reason = f->reason;
            r->cached = f->cached_tokens;
            ck_assert_int_eq(f->completion_tokens, r->n);
            break;
        }
        case ENG_MSG_ERROR: {
            eng_msg_error_t *e = (eng_msg_error_t *)m;
            ck_assert_int_eq(errors[e->id], 0); /* one ERROR, nothing after it */
            errors[e->id] = e->status;
            if (e->status == ST_ENOMEM) {
                ck_assert_str_eq(e->message, "out of memory");
            }
            break;
        }
        default:
            break;
        }
        eng_msg_free(m);
        m = next;
    }
}

/* Checks the pool, then destroys the engine. */
static void
finish(void)
{
    bm_stats_t bs;

    drain();
    ck_assert(sched_idle(eng__sched(eng)));
    bm_pool_check(eng__pool(eng));
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_msg(bs.dev_used == 0 && bs.cpu_used == 0, "blocks in use: %u device, %u cpu",
                  bs.dev_used, bs.cpu_used);
    engine_stop(eng);
    engine_destroy(eng);
    eng = NULL;
    for (msg_t *m = chan_take_all(&outbox); m != NULL;) {
        msg_t *next = m->next;
        eng_msg_free(m);
        m = next;
    }
    chan_fini(&outbox);
}

static void
teardown(void)
{
    mdl_model_destroy(model);
    model = NULL;
}

typedef struct sub {
    uint64_t id;
    uint32_t tenant;
    int32_t n_prompt;
    uint32_t pseed;
    int32_t max_tokens;
    int32_t n;
    float temperature;
    uint64_t seed;
    int has_seed;
    mdl_kv_policy_t kv_score; /* H2O / SnapKV (kind FULL: the engine's) */
} sub_t;

static void
submit(const sub_t *s)
{
    eng_msg_submit_t *m = xcalloc(1, sizeof(*m));
    uint32_t x = s->pseed * 2654435761u + 7;

    m->hdr.type = ENG_MSG_SUBMIT;
    m->req.id = s->id;
    m->req.tenant = s->tenant;
    m->req.prompt = xmalloc((size_t)s->n_prompt * sizeof(int32_t));
    m->req.prompt[0] = 1; /* BOS */
    for (int32_t i = 1; i < s->n_prompt; i++) {
        x = x * 1103515245u + 12345u;
        m->req.prompt[i] = 3 + (int32_t)((x >> 8) % 1000);
    }
    m->req.n_prompt = s->n_prompt;
    m->req.sampling.temperature = s->temperature;
    m->req.sampling.top_p = 1.0f;
    m->req.sampling.repetition_penalty = 1.0f;
    m->req.n = s->n > 0 ? s->n : 1;
    m->req.max_tokens = s->max_tokens;
    m->req.ignore_eos = 1;
    m->req.seed = s->seed;
    m->req.has_seed = s->has_seed;
    m->req.kv_score = s->kv_score;
    chan_send(engine_inbox(eng), &m->hdr);
}

static void
submit_simple(uint64_t id, uint32_t tenant, int32_t n_prompt, uint32_t pseed, int32_t max_tokens)
{
    sub_t s = {.id = id,
               .tenant = tenant,
               .n_prompt = n_prompt,
               .pseed = pseed,
               .max_tokens = max_tokens,
               .n = 1};
    submit(&s);
}

static void
cancel(uint64_t id, int32_t choice, int as_stop)
{
    eng_msg_cancel_t *m = xcalloc(1, sizeof(*m));

    m->hdr.type = ENG_MSG_CANCEL;
    m->id = id;
    m->choice = choice;
    m->as_stop = as_stop;
    chan_send(engine_inbox(eng), &m->hdr);
}

static void
iterate(void)
{
    ck_assert_int_ge(eng__iterate(eng, 0), 0);
    drain();
}

static void
run_idle(void)
{
    int guard = 0;

    do {
        iterate();
        ck_assert_int_lt(++guard, 100000);
    } while (!sched_idle(eng__sched(eng)));
}

static void
res_eq(const res_t *a, const res_t *b, const char *what, int i)
{
    ck_assert_msg(a->finished && b->finished, "%s %d: not finished", what, i);
    ck_assert_msg(a->n == b->n && memcmp(a->tok, b->tok, (size_t)a->n * sizeof(int32_t)) == 0,
                  "%s %d: greedy tokens differ (%d vs %d tokens)", what, i, a->n, b->n);
}

/* ---- numerics under scheduling --------------------------------------- */

#define N_BI 32

START_TEST(test_batch_invariance_32)
{
    eng_config_t c = cfg_default();
    static res_t alone[N_BI];

    c.max_num_batched_tokens = 4096; /* every prompt in the first step */

    start(&c);
    for (int i = 0; i < N_BI; i++) {
        submit_simple((uint64_t)i + 1, 0, 4 + 5 * i % 90, (uint32_t)i, 20);
        run_idle();
        alone[i] = res[i + 1][0];
    }
    finish();

    start(&c);
    for (int i = 0; i < N_BI; i++) {
        submit_simple((uint64_t)i + 1, 0, 4 + 5 * i % 90, (uint32_t)i, 20);
    }
    iterate();
    {
        eng_stats_t st;
        eng__stats(eng, &st);
        ck_assert_uint_eq(st.running, N_BI); /* all 32 in one batch */
    }
    run_idle();
    for (int i = 0; i < N_BI; i++) {
        res_eq(&alone[i], &res[i + 1][0], "request", i);
        ck_assert_int_eq(res[i + 1][0].n, 20);
    }
    finish();
}
END_TEST

#define N_PR 12

static void
run_pressured(int num_blocks, int swap_blocks, res_t *out, eng_stats_t *st)
{
    eng_config_t c = cfg_default();

    c.rt.num_blocks = num_blocks;
    c.rt.swap_blocks = swap_blocks;
    c.max_num_seqs = N_PR;
    start(&c);
    for (int i = 0; i < N_PR; i++) {
        submit_simple((uint64_t)i + 1, 0, 20 + 3 * i, (uint32_t)(50 + i), 48);
    }
    run_idle();
    eng__stats(eng, st);
    for (int i = 0; i < N_PR; i++) {
        out[i] = res[i + 1][0];
        ck_assert_int_eq(out[i].n, 48);
    }
    finish();
}

START_TEST(test_preemption_swap_and_recompute_match)
{
    static res_t free_run[N_PR], swapped[N_PR], recomputed[N_PR];
    eng_stats_t st;

    run_pressured(512, 0, free_run, &st);
    ck_assert_uint_eq(st.preempt_swap + st.preempt_recompute, 0);

    /* 12 sequences growing to 85..118 tokens (6..8 blocks) in 20 blocks. */
    run_pressured(21, 256, swapped, &st);
    ck_assert_uint_gt(st.preempt_swap, 0);
    ck_assert_uint_eq(st.preempt_recompute, 0);
    for (int i = 0; i < N_PR; i++) {
        res_eq(&free_run[i], &swapped[i], "swap", i);
    }

    run_pressured(21, 0, recomputed, &st);
    ck_assert_uint_gt(st.preempt_recompute, 0);
    ck_assert_uint_eq(st.preempt_swap, 0);
    for (int i = 0; i < N_PR; i++) {
        res_eq(&free_run[i], &recomputed[i], "recompute", i);
    }
}
END_TEST

/* 200 concurrent requests, KV for about 50 of them at a time: every one
 * gets the answer it gets with room to spare. */
START_TEST(test_200_requests_pool_of_50)
{
    static res_t roomy[200];
    eng_config_t c = cfg_default();
    eng_stats_t st;

    c.max_num_seqs = 256;
    c.max_num_batched_tokens = 2048;
    c.rt.num_blocks = 1024;
    start(&c);
    for (int i = 0; i < 200; i++) {
        submit_simple((uint64_t)i + 1, 0, 8 + i % 13, (uint32_t)(900 + i), 4 + i % 9);
    }
    run_idle();
    for (int i = 0; i < 200; i++) {
        roomy[i] = res[i + 1][0];
    }
    finish();

    for (int swap = 0; swap < 2; swap++) {
        c.rt.num_blocks = 101; /* 2 blocks (32 tokens) for each of 50 */
        c.rt.swap_blocks = swap ? 64 : 0;
        c.watermark = 0.01f;
        start(&c);
        for (int i = 0; i < 200; i++) {
            submit_simple((uint64_t)i + 1, 0, 8 + i % 13, (uint32_t)(900 + i), 4 + i % 9);
        }
        run_idle();
        eng__stats(eng, &st);
        ck_assert_uint_le(st.kv_used_peak, 100);
        for (int i = 0; i < 200; i++) {
            res_eq(&roomy[i], &res[i + 1][0], swap ? "pool of 50, swap" : "pool of 50", i);
        }
        finish();
    }
}
END_TEST

START_TEST(test_prefix_hit_equals_miss)
{
    eng_config_t c = cfg_default();
    res_t miss, hit, nocache;

    start(&c);
    submit_simple(1, 0, 70, 3, 24);
    run_idle();
    submit_simple(2, 0, 70, 3, 24);
    run_idle();
    miss = res[1][0];
    hit = res[2][0];
    finish();
    ck_assert_int_eq(miss.cached, 0);
    ck_assert_int_eq(hit.cached, 64);
    res_eq(&miss, &hit, "prefix", 0);

    c.prefix_caching = 0;
    start(&c);
    submit_simple(1, 0, 70, 3, 24);
    run_idle();
    nocache = res[1][0];
    finish();
    res_eq(&miss, &nocache, "no cache", 0);
}
END_TEST

/* Quantized KV (issue 8): swap, recompute and prefix-cache hits reproduce
 * the unpressured run's tokens exactly. Blocks and their scales move bit
 * for bit, and a query reads its own block in full precision and earlier
 * blocks as codes however the tokens were split into steps (KIVI). */
START_TEST(test_quantized_kv_consistent)
{
    static const mdl_kv_dtype_t dts[] = {MDL_KV_INT8, MDL_KV_INT4, MDL_KV_FP8_E4M3, MDL_KV_TQ3,
                                         MDL_KV_TQ4};
    static res_t free_run[N_PR], pressured[N_PR];
    eng_stats_t st;

    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        cfg_kv_dtype = dts[d];
        run_pressured(512, 0, free_run, &st);
        run_pressured(21, 256, pressured, &st);
        ck_assert_uint_gt(st.preempt_swap, 0);
        for (int i = 0; i < N_PR; i++) {
            res_eq(&free_run[i], &pressured[i], "quantized swap", i);
        }
        run_pressured(21, 0, pressured, &st);
        ck_assert_uint_gt(st.preempt_recompute, 0);
        for (int i = 0; i < N_PR; i++) {
            res_eq(&free_run[i], &pressured[i], "quantized recompute", i);
        }

        eng_config_t c = cfg_default();
        res_t miss, hit;

        start(&c);
        submit_simple(1, 0, 70, 3, 24);
        run_idle();
        submit_simple(2, 0, 70, 3, 24);
        run_idle();
        miss = res[1][0];
        hit = res[2][0];
        finish();
        ck_assert_int_eq(hit.cached, 64);
        res_eq(&miss, &hit, "quantized prefix", 0);
    }
    cfg_kv_dtype = MDL_KV_AUTO;
}
END_TEST

/* Attention sinks + rolling window on the real model (context 256) with
 * int8 KV: 600 tokens stream past the context without error while the
 * KV cache stays within sink + window + a few blocks. */
START_TEST(test_kv_policy_past_context)
{
    eng_config_t c;
    eng_stats_t st;

    cfg_kv_dtype = MDL_KV_INT8;
    c = cfg_default();
    c.kv_sink = 16;
    c.kv_window = 160;
    start(&c);
    submit_simple(1, 0, 20, 7, 600);
    run_idle();
    eng__stats(eng, &st);
    ck_assert_int_eq(res[1][0].n, 600);
    ck_assert(res[1][0].finished);
    ck_assert_uint_le(st.kv_used_peak, (16 + 160) / 16 + 3);
    finish();
    cfg_kv_dtype = MDL_KV_AUTO;
}
END_TEST

/* H2O / SnapKV through the scheduler (issue 18): with a budget above the
 * sequence nothing is evicted and the greedy tokens equal those without
 * a policy, per request and as the engine's default; below it the KV
 * stays within the budget while generation runs on; a policy with n > 1
 * or a budget past the context is refused. */
START_TEST(test_kv_score_policies)
{
    eng_config_t c = cfg_default();
    static res_t plain[4];
    eng_stats_t st;
    const mdl_kv_policy_t h2o_big = {.kind = MDL_KVP_H2O, .budget = 256, .recent = 16};
    const mdl_kv_policy_t snap_big = {.kind = MDL_KVP_SNAPKV, .budget = 250, .recent = 16,
                                      .pool = 7};
    const mdl_kv_policy_t h2o_small = {.kind = MDL_KVP_H2O, .budget = 64, .recent = 16};
    const mdl_kv_policy_t snap_small = {.kind = MDL_KVP_SNAPKV, .budget = 48, .recent = 8,
                                        .pool = 5};

    start(&c);
    for (int i = 0; i < 4; i++) {
        submit_simple((uint64_t)i + 1, 0, 40 + 30 * i, (uint32_t)(300 + i), 60);
    }
    run_idle();
    for (int i = 0; i < 4; i++) {
        plain[i] = res[i + 1][0];
    }
    finish();

    start(&c);
    for (int i = 0; i < 4; i++) {
        sub_t s = {.id = (uint64_t)i + 1, .n_prompt = 40 + 30 * i, .pseed = (uint32_t)(300 + i),
                   .max_tokens = 60, .n = 1, .kv_score = i % 2 ? snap_big : h2o_big};
        submit(&s);
    }
    run_idle();
    for (int i = 0; i < 4; i++) {
        res_eq(&plain[i], &res[i + 1][0], "budget above the sequence", i);
    }
    finish();

    c.kv_score = h2o_big; /* the engine's default */
    start(&c);
    for (int i = 0; i < 4; i++) {
        submit_simple((uint64_t)i + 1, 0, 40 + 30 * i, (uint32_t)(300 + i), 60);
    }
    run_idle();
    for (int i = 0; i < 4; i++) {
        res_eq(&plain[i], &res[i + 1][0], "default budget above the sequence", i);
    }
    finish();

    c.kv_score = (mdl_kv_policy_t){0};
    start(&c);
    {
        sub_t a = {.id = 1, .n_prompt = 120, .pseed = 11, .max_tokens = 120, .n = 1,
                   .kv_score = h2o_small};
        sub_t b = {.id = 2, .n_prompt = 120, .pseed = 12, .max_tokens = 120, .n = 1,
                   .kv_score = snap_small};
        sub_t bad_n = {.id = 3, .n_prompt = 20, .pseed = 13, .max_tokens = 4, .n = 2,
                       .kv_score = h2o_small};
        sub_t bad_budget = {.id = 4, .n_prompt = 20, .pseed = 14, .max_tokens = 4, .n = 1,
                            .kv_score = {.kind = MDL_KVP_H2O, .budget = 999, .recent = 16}};
        submit(&a);
        run_idle();
        eng__stats(eng, &st);
        /* the prompt's 8 blocks, then at most 4 while decoding (+1 for a
         * private copy of a cached prompt block) */
        ck_assert_uint_le(st.kv_used_peak, 120 / 16 + 1);
        submit(&b);
        submit(&bad_n);
        submit(&bad_budget);
        run_idle();
    }
    ck_assert_int_eq(res[1][0].n, 120);
    ck_assert(res[1][0].finished);
    ck_assert_int_eq(res[2][0].n, 120);
    ck_assert(res[2][0].finished);
    ck_assert_int_eq(errors[3], ST_EINVAL);
    ck_assert_int_eq(errors[4], ST_EINVAL);
    finish();
}
END_TEST

START_TEST(test_chunked_equals_unchunked)
{
    eng_config_t c = cfg_default();
    static res_t whole[8];

    start(&c);
    for (int i = 0; i < 8; i++) {
        submit_simple((uint64_t)i + 1, 0, 30 + 17 * i, (uint32_t)(200 + i), 16);
    }
    run_idle();
    for (int i = 0; i < 8; i++) {
        whole[i] = res[i + 1][0];
    }
    finish();

    c.max_num_batched_tokens = 16;
    start(&c);
    for (int i = 0; i < 8; i++) {
        submit_simple((uint64_t)i + 1, 0, 30 + 17 * i, (uint32_t)(200 + i), 16);
    }
    run_idle();
    for (int i = 0; i < 8; i++) {
        res_eq(&whole[i], &res[i + 1][0], "chunked", i);
    }
    finish();
}
END_TEST

START_TEST(test_n2_seeded_reproducible)
{
    eng_config_t c = cfg_default();
    sub_t s = {.id = 1,
               .n_prompt = 12,
               .pseed = 9,
               .max_tokens = 24,
               .n = 2,
               .temperature = 1.0f,
               .seed = 1234,
               .has_seed = 1};
    res_t first[2];

    start(&c);
    submit(&s);
    run_idle();
    first[0] = res[1][0];
    first[1] = res[1][1];
    finish();
    ck_assert_int_eq(first[0].n, 24);
    ck_assert_int_eq(first[1].n, 24);
    ck_assert_msg(memcmp(first[0].tok, first[1].tok, 24 * sizeof(int32_t)) != 0,
                  "the two choices drew the same 24 tokens");

    /* Same seed, other traffic around it: same two outputs. */
    start(&c);
    submit_simple(5, 0, 40, 77, 30);
    submit(&s);
    run_idle();
    res_eq(&first[0], &res[1][0], "seeded choice", 0);
    res_eq(&first[1], &res[1][1], "seeded choice", 1);
    finish();
}
END_TEST

START_TEST(test_cancel_mid_generation_frees_blocks)
{
    eng_config_t c = cfg_default();
    bm_stats_t bs;

    c.prefix_caching = 0;
    start(&c);
    submit_simple(1, 0, 40, 1, 200);
    submit_simple(2, 0, 40, 2, 200);
    for (int i = 0; i < 6; i++) {
        iterate();
    }
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_uint_eq(bs.dev_used, 2 * 3); /* 45 tokens: 3 blocks each */
    cancel(1, -1, 0);
    iterate(); /* applied at the step boundary, before the next plan */
    ck_assert(res[1][0].finished);
    ck_assert_int_eq(res[1][0].reason, ENG_FINISH_ABORT);
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_uint_eq(bs.dev_used, 3);
    cancel(2, -1, 1); /* a stop string matched */
    cancel(2, -1, 0); /* the second is ignored */
    iterate();
    ck_assert_int_eq(res[2][0].reason, ENG_FINISH_STOP);
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_uint_eq(bs.dev_used, 0);
    finish();
}
END_TEST

/* ---- out of memory -------------------------------------------------- */

/* Request 1 (greedy) runs two steps, then request 2 (n = 2, seeded,
 * temperature 1) arrives; fail > 0 arms the fail-th fallible call from
 * request 2's submit on (on this thread, which drives the engine: one
 * deterministic order). Returns the fallible calls made from there. */
static unsigned long
oom_engine_run(long fail)
{
    sub_t s2 = {.id = 2,
                .n_prompt = 10,
                .pseed = 4,
                .max_tokens = 6,
                .n = 2,
                .temperature = 1.0f,
                .seed = 99,
                .has_seed = 1};
    unsigned long n0;

    submit_simple(1, 0, 12, 3, 8);
    iterate();
    iterate();
    n0 = xmalloc_try_count();
    xmalloc_fail_after(fail);
    submit(&s2);
    run_idle();
    return xmalloc_try_count() - n0;
}

/* Every engine allocation from a submit on (the reserve, the FINISHED
 * messages, the scheduler's record, sequences and token buffers, each
 * DELTA of either request) fails in turn: the request it belongs to ends
 * with one ERROR "out of memory" (a refusal at submit, or midway with its
 * blocks freed), the other request is the reference's, the tokens the
 * failed one did get are the reference's, and no block stays in use. */
START_TEST(test_oom_each_engine_site)
{
    eng_config_t c = cfg_default();
    res_t ref[3][MAX_CH];
    unsigned long sites;

    start(&c);
    sites = oom_engine_run(0);
    memcpy(ref, res, sizeof(ref));
    finish();
    ck_assert(ref[1][0].finished && ref[2][0].finished && ref[2][1].finished);
    /* 2 + 1 + 2 + 2 at submit, 12 DELTAs of request 2, some of request 1. */
    ck_assert_uint_ge(sites, 19);
    for (unsigned long f = 1; f <= sites + 1; f++) {
        int failed = 0;

        start(&c);
        /* A failed request allocates nothing more: fewer calls then. */
        unsigned long got = oom_engine_run((long)f);
        ck_assert_uint_le(got, sites);
        ck_assert_uint_ge(got, f <= sites ? f : sites);
        ck_assert_int_eq(xmalloc_fail_pending(), f <= sites ? 0 : 1);
        xmalloc_fail_after(0);
        for (uint64_t id = 1; id <= 2; id++) {
            int n = id == 2 ? 2 : 1;
            if (errors[id] == 0) {
                for (int k = 0; k < n; k++) {
                    res_eq(&ref[id][k], &res[id][k], "untouched request", (int)id);
                }
                continue;
            }
            ck_assert_int_eq(errors[id], ST_ENOMEM);
            failed++;
            for (int k = 0; k < n; k++) {
                ck_assert_int_le(res[id][k].n, ref[id][k].n);
                ck_assert(memcmp(res[id][k].tok, ref[id][k].tok,
                                 (size_t)res[id][k].n * sizeof(int32_t)) == 0);
            }
        }
        ck_assert_int_eq(failed, f <= sites ? 1 : 0);
        finish();
    }
}
END_TEST

/* ---- tenants ----------------------------------------------------------- */

START_TEST(test_fair_share_1_3_real)
{
    eng_config_t c = cfg_default();
    eng_stats_t s0, s1;
    uint64_t id = 1;

    c.n_tenants = 2;
    c.tenants[0].weight = 1.0;
    c.tenants[1].weight = 3.0;
    c.max_num_seqs = 8;
    start(&c);
    for (int i = 0; i < 60; i++) {
        submit_simple(id++, 0, 16, (uint32_t)i, 16);
        submit_simple(id++, 1, 16, (uint32_t)(i + 500), 16);
    }
    for (int i = 0; i < 20; i++) {
        iterate();
    }
    eng__stats(eng, &s0);
    do {
        iterate();
        eng__stats(eng, &s1);
    } while (s1.tenant[0].waiting > 0 && s1.tenant[1].waiting > 0);
    double a = (double)(s1.tenant[0].prompt_tokens + s1.tenant[0].generation_tokens -
                        s0.tenant[0].prompt_tokens - s0.tenant[0].generation_tokens);
    double b = (double)(s1.tenant[1].prompt_tokens + s1.tenant[1].generation_tokens -
                        s0.tenant[1].prompt_tokens - s0.tenant[1].generation_tokens);
    ck_assert_msg(a > 200, "tenant 0 served %.0f tokens", a);
    ck_assert_msg(b / a > 2.7 && b / a < 3.3, "token split 1:%.3f", b / a);
    for (uint64_t i = 1; i < id; i++) {
        cancel(i, -1, 0);
    }
    run_idle();
    finish();
}
END_TEST

/* Steps from the light tenant's submit to its first token. */
static int64_t
light_ttft(int flood, uint32_t light_tenant)
{
    eng_config_t c = cfg_default();
    eng_stats_t st;
    uint64_t id = 1;
    int64_t t0, ttft;

    c.n_tenants = 2;
    c.tenants[0].weight = 1.0;
    c.tenants[1].weight = 1.0;
    c.max_num_seqs = 4;
    start(&c);
    if (flood) {
        for (int i = 0; i < 60; i++) {
            submit_simple(id++, 0, 16, (uint32_t)i, 24);
        }
        for (int i = 0; i < 30; i++) {
            iterate();
        }
    }
    submit_simple(200, light_tenant, 16, 999, 4);
    eng__stats(eng, &st);
    t0 = (int64_t)st.steps;
    while (res[200][0].first_step < 0) {
        iterate();
    }
    ttft = res[200][0].first_step - t0;
    for (uint64_t i = 1; i < id; i++) {
        cancel(i, -1, 0);
    }
    run_idle();
    finish();
    return ttft;
}

START_TEST(test_flooding_tenant_bounded_ttft)
{
    int64_t alone = light_ttft(0, 1);
    int64_t fair = light_ttft(1, 1);
    int64_t fifo = light_ttft(1, 0);

    ck_assert_int_eq(alone, 1);
    /* Its fair share: the next free slot, i.e. at most one flooder
     * request's 24 decode steps. Behind the flood in its own queue it
     * would wait for ~50 requests. */
    ck_assert_msg(fair <= 25, "TTFT %lld steps under a flood", (long long)fair);
    ck_assert_msg(fifo > 10 * fair, "fifo %lld, fair %lld", (long long)fifo, (long long)fair);
}
END_TEST

START_TEST(test_queue_full_is_error)
{
    eng_config_t c = cfg_default();

    c.tenants[0].max_waiting = 2;
    start(&c);
    submit_simple(1, 0, 8, 1, 4);
    submit_simple(2, 0, 8, 2, 4);
    submit_simple(3, 0, 8, 3, 4);
    submit_simple(4, 0, 300, 3, 4); /* longer than the context */
    iterate();
    ck_assert_int_eq(errors[3], ST_EQUEUE);
    ck_assert_int_eq(errors[4], ST_ETOOLONG);
    run_idle();
    ck_assert(res[1][0].finished && res[2][0].finished);
    ck_assert(!res[3][0].finished);
    finish();
}
END_TEST

START_TEST(test_create_errors)
{
    eng_config_t c = cfg_default();
    engine_t *e = NULL;
    char err[256] = "";

    load_model();
    chan_init(&outbox, NULL, NULL);
    c.rt.num_blocks = 1;
    ck_assert_int_ne(engine_create(&c, model, &outbox, &e, err, sizeof(err)), ST_OK);
    ck_assert(e == NULL && err[0] != '\0');
    c = cfg_default();
    c.rt.device = "cuda";
    err[0] = '\0';
    ck_assert_int_ne(engine_create(&c, model, &outbox, &e, err, sizeof(err)), ST_OK);
    ck_assert(e == NULL && strstr(err, "cuda") != NULL);
    chan_fini(&outbox);
}
END_TEST

/* ---- the thread -------------------------------------------------------- */

START_TEST(test_thread_and_channels)
{
    eng_config_t c = cfg_default();
    static res_t sync_res[6];
    int n_fin = 0, got_stats = 0;

    start(&c);
    for (int i = 0; i < 6; i++) {
        submit_simple((uint64_t)i + 1, 0, 10 + i, (uint32_t)i, 12);
    }
    run_idle();
    for (int i = 0; i < 6; i++) {
        sync_res[i] = res[i + 1][0];
    }
    finish();

    start(&c);
    ck_assert_int_eq(engine_start(eng), ST_OK);
    ck_assert(engine_alive(eng));
    for (int i = 0; i < 6; i++) {
        submit_simple((uint64_t)i + 1, 0, 10 + i, (uint32_t)i, 12);
    }
    while (n_fin < 6) {
        msg_t *m = chan_wait_all(&outbox, 10000);
        ck_assert_msg(m != NULL, "no message from the engine thread in 10 s");
        while (m != NULL) {
            msg_t *next = m->next;
            if (m->type == ENG_MSG_DELTA) {
                eng_msg_delta_t *d = (eng_msg_delta_t *)m;
                res[d->id][0].tok[res[d->id][0].n++] = d->tok[0].token;
            } else if (m->type == ENG_MSG_FINISHED) {
                eng_msg_finished_t *f = (eng_msg_finished_t *)m;
                res[f->id][0].finished = 1;
                n_fin++;
            }
            eng_msg_free(m);
            m = next;
        }
    }
    for (int i = 0; i < 6; i++) {
        res_eq(&sync_res[i], &res[i + 1][0], "thread", i);
    }
    /* STATS round trip. */
    eng_msg_stats_t *sm = xcalloc(1, sizeof(*sm));
    sm->hdr.type = ENG_MSG_STATS;
    sm->cookie = 77;
    chan_send(engine_inbox(eng), &sm->hdr);
    while (!got_stats) {
        msg_t *m = chan_wait_all(&outbox, 10000);
        ck_assert(m != NULL);
        while (m != NULL) {
            msg_t *next = m->next;
            if (m->type == ENG_MSG_STATS_REPLY) {
                eng_msg_stats_t *r = (eng_msg_stats_t *)m;
                ck_assert_uint_eq(r->cookie, 77);
                ck_assert_uint_eq(r->stats.generation_tokens, 6 * 12);
                ck_assert_uint_eq(r->stats.kv_used, 0);
                ck_assert_uint_gt(r->stats.kv_used_peak, 0);
                got_stats = 1;
            }
            eng_msg_free(m);
            m = next;
        }
    }
    /* Open requests at shutdown get ERROR ST_ESHUTDOWN. */
    submit_simple(50, 0, 10, 5, 200);
    submit_simple(51, 0, 10, 6, 200);
    engine_stop(eng);
    ck_assert(!engine_alive(eng));
    drain();
    ck_assert_int_eq(errors[50], ST_ESHUTDOWN);
    ck_assert_int_eq(errors[51], ST_ESHUTDOWN);
    finish();
}
END_TEST

Suite *
scheduler_engine_suite(void)
{
    Suite *s = suite_create("scheduler_engine");
    TCase *tc = tcase_create("real_model");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_batch_invariance_32);
    tcase_add_test(tc, test_preemption_swap_and_recompute_match);
    tcase_add_test(tc, test_200_requests_pool_of_50);
    tcase_add_test(tc, test_prefix_hit_equals_miss);
    tcase_add_test(tc, test_quantized_kv_consistent);
    tcase_add_test(tc, test_kv_policy_past_context);
    tcase_add_test(tc, test_kv_score_policies);
    tcase_add_test(tc, test_chunked_equals_unchunked);
    tcase_add_test(tc, test_n2_seeded_reproducible);
    tcase_add_test(tc, test_cancel_mid_generation_frees_blocks);
    tcase_add_test(tc, test_oom_each_engine_site);
    tcase_add_test(tc, test_fair_share_1_3_real);
    tcase_add_test(tc, test_flooding_tenant_bounded_ttft);
    tcase_add_test(tc, test_queue_full_is_error);
    tcase_add_test(tc, test_thread_and_channels);
    tcase_add_test(tc, test_create_errors);
    suite_add_tcase(s, tc);
    return s;
}
