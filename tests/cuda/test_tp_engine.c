/* test_tp_engine.c - tensor parallelism under the engine: the scheduler and
 * the block manager drive a T = 2 CPU runtime with one shared block id
 * space (model/tp.h). Twelve greedy requests under KV pressure (a pool too
 * small for all of them, so sequences are preempted and swapped out and
 * back in, every rank moving its slice of each block) must produce the
 * same tokens as a T = 1 engine with room for everything, and every block
 * must be free at the end.
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

typedef struct out {
    int32_t tok[N_GEN];
    int32_t n;
    int finished;
} out_t;

static void
collect(chan_t *outbox, out_t *res)
{
    for (msg_t *m = chan_take_all(outbox); m != NULL;) {
        msg_t *next = m->next;

        if (m->type == ENG_MSG_DELTA) {
            eng_msg_delta_t *d = (eng_msg_delta_t *)m;
            out_t *r = &res[d->id - 1];

            for (int32_t i = 0; i < d->n_tokens; i++) {
                ck_assert_int_lt(r->n, N_GEN);
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
run(const mdl_model_t *model, int32_t tp, int32_t num_blocks, int32_t swap_blocks, out_t *res,
    eng_stats_t *st)
{
    eng_config_t c;
    engine_t *eng;
    chan_t outbox;
    char err[256] = "";
    bm_stats_t bs;

    memset(&c, 0, sizeof(c));
    c.rt.device = "cpu";
    c.rt.tp_size = tp;
    c.rt.n_threads = 1;
    c.rt.block_size = 16;
    c.rt.num_blocks = num_blocks;
    c.rt.swap_blocks = swap_blocks;
    c.max_num_seqs = N_REQ;
    c.max_num_batched_tokens = 256;
    c.max_model_len = 256;
    c.prefix_caching = 1;
    c.n_tenants = 1;
    c.tenants[0].weight = 1.0;
    snprintf(c.tenants[0].name, sizeof(c.tenants[0].name), "default");

    memset(res, 0, sizeof(out_t) * N_REQ);
    chan_init(&outbox, NULL, NULL);
    ck_assert_msg(engine_create(&c, model, &outbox, &eng, err, sizeof(err)) == ST_OK, "%s", err);
    for (int i = 0; i < N_REQ; i++) {
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
        m->req.max_tokens = N_GEN;
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

START_TEST(test_tp_engine_swap_matches_tp1)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    static out_t ref[N_REQ], tp2[N_REQ];
    mdl_model_t *model;
    eng_stats_t st;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "%s", err);
    run(model, 1, 512, 0, ref, &st);
    ck_assert_uint_eq(st.preempt_swap + st.preempt_recompute, 0);
    run(model, 2, 21, 256, tp2, &st);
    ck_assert_uint_gt(st.preempt_swap, 0); /* the pool was too small: swaps happened */
    printf("T=2 engine: %llu swap preemptions, %llu steps\n", (unsigned long long)st.preempt_swap,
           (unsigned long long)st.steps);
    for (int i = 0; i < N_REQ; i++) {
        ck_assert(ref[i].finished && tp2[i].finished);
        ck_assert_int_eq(ref[i].n, N_GEN);
        ck_assert_msg(tp2[i].n == ref[i].n &&
                          memcmp(tp2[i].tok, ref[i].tok, sizeof(int32_t) * N_GEN) == 0,
                      "request %d: T=2 greedy tokens differ from T=1", i);
    }
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
    suite_add_tcase(s, tc);
    return s;
}
