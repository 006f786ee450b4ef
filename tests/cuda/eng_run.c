/* eng_run.c - whole engine runs for the token-for-token tests
 * (tests/cuda/eng_run.h).
 *
 * Thread: tests only, one thread.
 */
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "scheduler/engine_int.h"
#include "tests/cuda/eng_run.h"

void
er_config(eng_config_t *c, const char *device, int32_t block_size, int32_t num_blocks,
          int32_t max_num_seqs, int32_t max_num_batched_tokens)
{
    memset(c, 0, sizeof(*c));
    c->rt.device = device;
    c->rt.n_threads = 1;
    c->rt.block_size = block_size;
    c->rt.num_blocks = num_blocks;
    c->max_num_seqs = max_num_seqs;
    c->max_num_batched_tokens = max_num_batched_tokens;
    c->max_model_len = 256;
    c->prefix_caching = 1;
    c->n_tenants = 1;
    c->tenants[0].weight = 1.0;
    snprintf(c->tenants[0].name, sizeof(c->tenants[0].name), "default");
}

eng_msg_submit_t *
er_request(uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t max_tokens)
{
    eng_msg_submit_t *sm = xcalloc(1, sizeof(*sm));

    sm->hdr.type = ENG_MSG_SUBMIT;
    sm->req.id = id;
    sm->req.n_prompt = n_prompt;
    sm->req.prompt = xmalloc(sizeof(int32_t) * (size_t)n_prompt);
    memcpy(sm->req.prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    sm->req.sampling.temperature = 0.0f;
    sm->req.sampling.top_p = 1.0f;
    sm->req.sampling.repetition_penalty = 1.0f;
    sm->req.n = 1;
    sm->req.max_tokens = max_tokens;
    sm->req.ignore_eos = 1;
    return sm;
}

/* Every message of the outbox into res[id - 1]. */
static void
collect(chan_t *outbox, int errors_ok, er_out_t *res)
{
    for (msg_t *m = chan_take_all(outbox); m != NULL;) {
        msg_t *next = m->next;

        if (m->type == ENG_MSG_DELTA) {
            eng_msg_delta_t *d = (eng_msg_delta_t *)m;
            er_out_t *r = &res[d->id - 1];

            for (int32_t i = 0; i < d->n_tokens; i++) {
                ck_assert_int_lt(r->n, ER_MAX_GEN);
                r->tok[r->n++] = d->tok[i].token;
            }
        } else if (m->type == ENG_MSG_FINISHED) {
            res[((eng_msg_finished_t *)m)->id - 1].finished = 1;
        } else if (m->type == ENG_MSG_ERROR) {
            eng_msg_error_t *e = (eng_msg_error_t *)m;

            ck_assert_msg(errors_ok, "engine error: %s", e->message);
            snprintf(res[e->id - 1].error, sizeof(res[0].error), "%s", e->message);
            res[e->id - 1].finished = 1;
        }
        eng_msg_free(m);
        m = next;
    }
}

void
er_run(const eng_config_t *c, const mdl_model_t *m, eng_msg_submit_t *const reqs[], int n,
       int per_step, int errors_ok, er_out_t *res, eng_stats_t *st)
{
    engine_t *eng;
    chan_t outbox;
    char err[256] = "";
    bm_stats_t bs;
    int next = 0;

    memset(res, 0, sizeof(er_out_t) * (size_t)n);
    chan_init(&outbox, NULL, NULL);
    ck_assert_msg(engine_create(c, m, &outbox, &eng, err, sizeof(err)) == ST_OK, "%s", err);
    for (int guard = 0; next < n || !sched_idle(eng__sched(eng)); guard++) {
        do {
            if (next < n) {
                chan_send(engine_inbox(eng), &reqs[next++]->hdr);
            }
        } while (!per_step && next < n);
        ck_assert_int_ge(eng__iterate(eng, 0), 0);
        collect(&outbox, errors_ok, res);
        ck_assert_int_lt(guard, 100000);
    }
    collect(&outbox, errors_ok, res);
    bm_pool_check(eng__pool(eng));
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_msg(bs.dev_used == 0 && bs.cpu_used == 0, "blocks in use: %u device, %u cpu",
                  bs.dev_used, bs.cpu_used);
    if (st != NULL) {
        eng__stats(eng, st);
    }
    engine_stop(eng);
    engine_destroy(eng);
    collect(&outbox, errors_ok, res);
    chan_fini(&outbox);
}
