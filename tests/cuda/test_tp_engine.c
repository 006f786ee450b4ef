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
#include "tests/cuda/eng_run.h"

#define N_REQ 12
#define N_GEN 40

/* One engine run: n_req greedy requests of n_gen tokens each. */
typedef struct run_opts {
    int32_t tp, num_blocks, swap_blocks;
    mdl_kv_dtype_t dtype;
    int32_t kv_sink, kv_window; /* window 0: full attention */
    int32_t n_req, n_gen;
} run_opts_t;

static void
run(const mdl_model_t *model, const run_opts_t *o, er_out_t *res, eng_stats_t *st)
{
    eng_config_t c;
    eng_msg_submit_t *reqs[N_REQ];

    er_config(&c, "cpu", 16, o->num_blocks, N_REQ, 256);
    c.rt.tp_size = o->tp;
    c.rt.swap_blocks = o->swap_blocks;
    c.rt.kv_dtype = o->dtype;
    c.kv_sink = o->kv_sink;
    c.kv_window = o->kv_window;
    ck_assert_int_le(o->n_req, N_REQ);
    for (int i = 0; i < o->n_req; i++) {
        int32_t prompt[20 + 4 * N_REQ];
        uint32_t x = (uint32_t)(i + 1) * 2654435761u;

        prompt[0] = 1;
        for (int32_t k = 1; k < 20 + 4 * i; k++) {
            x = x * 1103515245u + 12345u;
            prompt[k] = 3 + (int32_t)((x >> 8) % 1000);
        }
        reqs[i] = er_request((uint64_t)i + 1, prompt, 20 + 4 * i, o->n_gen);
    }
    er_run(&c, model, reqs, o->n_req, 0, 0, res, st);
}

static void
expect_same(const er_out_t *ref, const er_out_t *got, int32_t n_req, int32_t n_gen, const char *what)
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
    static er_out_t ref[N_REQ], tp2[N_REQ];
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
    static er_out_t ref[NR], tp2[NR];
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
