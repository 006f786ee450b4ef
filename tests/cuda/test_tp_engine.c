/* test_tp_engine.c - tensor parallelism under the engine: the scheduler and
 * the block manager drive a T = 2 CPU runtime with one shared block id
 * space (model/tp.h). Twelve greedy requests under KV pressure (a pool too
 * small for all of them, so sequences are preempted and swapped out and
 * back in, every rank moving its slice of each block) must produce the
 * same tokens as a T = 1 engine with room for everything, and every block
 * must be free at the end; in f32 and with int4 KV (codes and scales move
 * with the blocks on every rank).
 *
 * Sinks + rolling window under T = 2: greedy requests with int4 KV and
 * sink=16,window=160 generate past the model's 256-token context (blocks
 * after the sinks evicted, kept keys re-rotated by KV_OP_SHIFT on every
 * rank) and must match a T = 1 engine with the same dtype and policy token
 * for token, with the KV cache bounded.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "scheduler/engine.h"
#include "scheduler/engine_int.h"

#define N_REQ 12
#define N_GEN 40
#define N_GEN_MAX 320 /* past the 256-token context (sink + window runs) */

typedef struct out {
    int32_t tok[N_GEN_MAX];
    int32_t n;
    int finished;
} out_t;

/* One engine run: n_req greedy requests of n_gen tokens each. */
typedef struct run_opts {
    int32_t tp, num_blocks, swap_blocks;
    mdl_kv_dtype_t dtype;
    int32_t kv_sink, kv_window; /* window 0: full attention */
    int32_t n_req, n_gen;
} run_opts_t;

static void
collect(chan_t *outbox, out_t *res)
{
    for (msg_t *m = chan_take_all(outbox); m != NULL;) {
        msg_t *next = m->next;

        if (m->type == ENG_MSG_DELTA) {
            eng_msg_delta_t *d = (eng_msg_delta_t *)m;
            out_t *r = &res[d->id - 1];

            for (int32_t i = 0; i < d->n_tokens; i++) {
                ck_assert_int_lt(r->n, N_GEN_MAX);
                r->tok[r->n++] = d->tok[i].token;
            }
        } else if (m->type == ENG_MSG_FINISHED) {
            res[((eng_msg_finished_t *)m)->id - 1].finished = 1;
        } else {
            ck_assert_msg(m->type != ENG_MSG_ERROR, "engine error: %s",
                          ((eng_msg_error_t *)m)->message);
        }
        eng_msg_free(m);
        m = next;
    }
}

static void
run(const mdl_model_t *model, const run_opts_t *o, out_t *res, eng_stats_t *st)
{
    eng_config_t c;
    engine_t *eng;
    chan_t outbox;
    char err[256] = "";
    bm_stats_t bs;

    memset(&c, 0, sizeof(c));
    c.rt.device = "cpu";
    c.rt.tp_size = o->tp;
    c.rt.n_threads = 1;
    c.rt.block_size = 16;
    c.rt.num_blocks = o->num_blocks;
    c.rt.swap_blocks = o->swap_blocks;
    c.rt.kv_dtype = o->dtype;
    c.kv_sink = o->kv_sink;
    c.kv_window = o->kv_window;
    c.max_num_seqs = N_REQ;
    c.max_num_batched_tokens = 256;
    c.max_model_len = 256;
    c.prefix_caching = 1;
    c.n_tenants = 1;
    c.tenants[0].weight = 1.0;
    snprintf(c.tenants[0].name, sizeof(c.tenants[0].name), "default");

    memset(res, 0, sizeof(out_t) * (size_t)o->n_req);
    chan_init(&outbox, NULL, NULL);
    ck_assert_msg(engine_create(&c, model, &outbox, &eng, err, sizeof(err)) == ST_OK, "%s", err);
    for (int i = 0; i < o->n_req; i++) {
        eng_msg_submit_t *m = xcalloc(1, sizeof(*m));
        uint32_t x = (uint32_t)(i + 1) * 2654435761u;

        m->hdr.type = ENG_MSG_SUBMIT;
        m->req.id = (uint64_t)i + 1;
        m->req.n_prompt = 20 + 4 * i;
        m->req.prompt = xmalloc(sizeof(int32_t) * (size_t)m->req.n_prompt);
        m->req.prompt[0] = 1;
        for (int32_t k = 1; k < m->req.n_prompt; k++) {
            x = x * 1103515245u + 12345u;
            m->req.prompt[k] = 3 + (int32_t)((x >> 8) % 1000);
        }
        m->req.sampling.temperature = 0.0f; /* greedy */
        m->req.sampling.top_p = 1.0f;
        m->req.sampling.repetition_penalty = 1.0f;
        m->req.n = 1;
        m->req.max_tokens = o->n_gen;
        m->req.ignore_eos = 1;
        chan_send(engine_inbox(eng), &m->hdr);
    }
    for (int guard = 0;; guard++) {
        ck_assert_int_ge(eng__iterate(eng, 0), 0);
        collect(&outbox, res);
        if (sched_idle(eng__sched(eng))) {
            break;
        }
        ck_assert_int_lt(guard, 100000);
    }
    eng__stats(eng, st);
    bm_pool_check(eng__pool(eng));
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_msg(bs.dev_used == 0 && bs.cpu_used == 0, "blocks in use: %u device, %u cpu",
                  bs.dev_used, bs.cpu_used);
    engine_stop(eng);
    engine_destroy(eng);
    collect(&outbox, res);
    chan_fini(&outbox);
}

static void
expect_same(const out_t *ref, const out_t *got, int32_t n_req, int32_t n_gen, const char *what)
{
    for (int i = 0; i < n_req; i++) {
        ck_assert(ref[i].finished && got[i].finished);
        ck_assert_int_eq(ref[i].n, n_gen);
        ck_assert_msg(got[i].n == ref[i].n &&
                          memcmp(got[i].tok, ref[i].tok, sizeof(int32_t) * (size_t)n_gen) == 0,
                      "%s, request %d: T=2 greedy tokens differ from T=1", what, i);
    }
}

/* Swap preemption at T = 2 (pool too small) against T = 1 with room. */
static void
swap_matches_tp1(mdl_kv_dtype_t dtype)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    static out_t ref[N_REQ], tp2[N_REQ];
    run_opts_t o = {.tp = 1, .num_blocks = 512, .dtype = dtype, .n_req = N_REQ, .n_gen = N_GEN};
    mdl_model_t *model;
    eng_stats_t st;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "%s", err);
    run(model, &o, ref, &st);
    ck_assert_uint_eq(st.preempt_swap + st.preempt_recompute, 0);
    o.tp = 2;
    o.num_blocks = 21;
    o.swap_blocks = 256;
    run(model, &o, tp2, &st);
    ck_assert_uint_gt(st.preempt_swap, 0); /* the pool was too small: swaps happened */
    printf("T=2 engine, %s KV: %llu swap preemptions, %llu steps\n", mdl_kv_dtype_name(dtype),
           (unsigned long long)st.preempt_swap, (unsigned long long)st.steps);
    expect_same(ref, tp2, N_REQ, N_GEN, mdl_kv_dtype_name(dtype));
    mdl_model_destroy(model);
}

START_TEST(test_tp_engine_swap_matches_tp1)
{
    swap_matches_tp1(MDL_KV_F32);
}
END_TEST

START_TEST(test_tp_engine_int4_swap_matches_tp1)
{
    swap_matches_tp1(MDL_KV_INT4);
}
END_TEST

/* int4 KV + sink=16,window=160 past the 256-token context, T = 2 against
 * T = 1: the same tokens, the KV cache bounded. */
START_TEST(test_tp_engine_int4_kv_policy_past_context)
{
    enum { SINK = 16, WINDOW = 160, NR = 3, GEN = 300 };
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    static out_t ref[NR], tp2[NR];
    run_opts_t o = {.tp = 1,
                    .num_blocks = 128,
                    .dtype = MDL_KV_INT4,
                    .kv_sink = SINK,
                    .kv_window = WINDOW,
                    .n_req = NR,
                    .n_gen = GEN};
    mdl_model_t *model;
    eng_stats_t st;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_int_eq(mdl_model_config(model)->max_pos, 256);
    run(model, &o, ref, &st);
    o.tp = 2;
    run(model, &o, tp2, &st);
    /* Prompts of 20..28 tokens + 300 generated: every request ran past the
     * context, and no sequence ever held more than sink + window + a few
     * blocks. */
    ck_assert_uint_le(st.kv_used_peak, NR * ((SINK + WINDOW) / 16 + 3));
    printf("T=2 engine, int4 KV, sink=%d,window=%d: %d requests x %d tokens past the context, "
           "peak %u blocks\n",
           SINK, WINDOW, NR, GEN, st.kv_used_peak);
    expect_same(ref, tp2, NR, GEN, "int4 + sink/window");
    mdl_model_destroy(model);
}
END_TEST

Suite *
cuda_tp_engine_suite(void)
{
    Suite *s = suite_create("tp_engine");
    TCase *tc = tcase_create("engine");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_tp_engine_swap_matches_tp1);
    tcase_add_test(tc, test_tp_engine_int4_swap_matches_tp1);
    tcase_add_test(tc, test_tp_engine_int4_kv_policy_past_context);
    suite_add_tcase(s, tc);
    return s;
}
