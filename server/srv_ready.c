/* srv_ready.c - readiness: the port opens at once, the model loads on a
 * loader thread, and the server turns ready after one warm-up step.
 *
 * DESIGN
 *   srv_run opens the port first (srv_loop.c), then srv_ready_begin starts
 *   the loader thread. It runs the caller's load function (cmd_serve.c:
 *   read the model, size the KV cache, check host memory), then creates
 *   the engine on the server's outbox, locks memory for --mlock and starts
 *   the engine thread: the work the main thread did before the port
 *   opened. The loader touches no socket, no MHD and nothing of srv_t but
 *   the outbox (chan_t is thread-safe) and its own record; it wakes the
 *   loop with a uv_async_t, and the loop joins it before reading what it
 *   made (the join orders the memory).
 *
 *   On the loop thread the server then adopts the model (tokenizer, chat
 *   template, limits) and the engine, and submits a warm-up step: a greedy
 *   one-token generation of the BOS token, as the deep health check does.
 *   When the engine finishes it, s->ready turns 1, the "listening on" line
 *   is logged and READY=1 goes to systemd. Until then /health answers 503
 *   {"status":"loading"}, every API route 503 with an OpenAI error and
 *   Retry-After, and /metrics and /version answer as usual (/metrics with
 *   the front end's counters only until the engine exists).
 *
 *   A failure (load, engine, warm-up error, or an engine that dies during
 *   the warm-up) has logged its line; the loop stops and srv_run returns
 *   the status, so `kvserve serve` exits non-zero as before. SIGTERM while
 *   loading stops the loop at once; srv_ready_fini then cancels the loader
 *   (the test delay ends at once, a model being read is read to the end)
 *   and joins it.
 *
 *   Test hook: KVSERVE_TEST_LOAD_DELAY_MS=N sleeps N ms before the load
 *   (tests/integration/readiness.test.mjs).
 *
 * Thread: loop thread, except loader_main (the loader thread).
 */
#define LOG_MODULE "server"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_grammar.h"
#include "server/srv_ready.h"
#include "server/srv_state.h"

struct srv_loader {
    srv_setup_t su;   /* the loader fills the model's part */
    engine_t *engine; /* made by the loader */
    int rc;           /* the loader's status */
    atomic_int cancel;
    uv_thread_t thread;
    uv_async_t done;
    int joined;
    uint64_t warm_id; /* the warm-up job, 0 when none runs */
    uint64_t warm_t0;
};

/* ---- the loader thread ------------------------------------------------------- */

static void
loader_main(void *arg)
{
    srv_t *s = arg;
    struct srv_loader *l = s->loader;
    const char *delay = getenv("KVSERVE_TEST_LOAD_DELAY_MS");
    char err[256] = "";

    if (delay != NULL && atol(delay) > 0) {
        LOG_WARN("KVSERVE_TEST_LOAD_DELAY_MS=%ld: the model loads after a delay (tests only)",
                 atol(delay));
        for (long ms = atol(delay); ms > 0 && !atomic_load(&l->cancel); ms -= 10) {
            usleep(10000);
        }
    }
    if (atomic_load(&l->cancel)) {
        l->rc = ST_ECANCELED;
        goto done;
    }
    l->rc = l->su.load(l->su.load_arg, &l->su);
    if (l->rc != ST_OK) {
        goto done;
    }
    if (atomic_load(&l->cancel)) {
        l->rc = ST_ECANCELED;
        goto done;
    }
    l->rc = engine_create(&l->su.eng, l->su.model, &s->outbox, &l->engine, err, sizeof(err));
    if (l->rc != ST_OK) {
        LOG_ERROR("engine: %s", err[0] ? err : st_str(l->rc));
        goto done;
    }
    if (s->cfg->mlock) {
        /* Weights, KV pool, swap tier and scratch exist now: pin them. */
        l->rc = sysmem_lock_all(err, sizeof(err));
        if (l->rc != ST_OK) {
            LOG_ERROR("%s", err);
            goto done;
        }
        LOG_INFO("--mlock: %lld MiB locked", (long long)(sysmem_self_field("VmLck") >> 20));
    }
    l->rc = engine_start(l->engine);
    if (l->rc != ST_OK) {
        LOG_ERROR("engine start: %s", st_str(l->rc));
    }
done:
    uv_async_send(&l->done);
}

/* ---- the loop side ----------------------------------------------------------- */

static void
fail(srv_t *s, int rc)
{
    s->start_rc = rc != ST_OK ? rc : ST_EINVAL;
    srv_loop_stop(s);
}

/* Joins the loader once; its engine becomes s->engine (to serve, or to be
 * stopped by srv_run). */
static void
join(srv_t *s)
{
    struct srv_loader *l = s->loader;

    if (l == NULL || l->joined) {
        return;
    }
    uv_thread_join(&l->thread);
    l->joined = 1;
    s->engine = l->engine;
    l->engine = NULL;
}

static int
warm_up(srv_t *s)
{
    struct srv_loader *l = s->loader;
    eng_msg_submit_t *m = xcalloc(1, sizeof(*m));
    int32_t *prompt = xmalloc(sizeof(int32_t));
    int32_t bos = tok_bos_id(s->tok);

    prompt[0] = bos >= 0 ? bos : 0;
    l->warm_id = s->next_id++;
    l->warm_t0 = now_ns();
    m->hdr.type = ENG_MSG_SUBMIT;
    m->req.id = l->warm_id;
    m->req.prompt = prompt;
    m->req.n_prompt = 1;
    m->req.sampling.top_p = 1.0f;
    m->req.sampling.repetition_penalty = 1.0f;
    m->req.n = 1;
    m->req.max_tokens = 1;
    m->req.ignore_eos = 1;
    m->req.kv_window = -1;
    m->req.t_arrival_ns = l->warm_t0;
    chan_send(engine_inbox(s->engine), &m->hdr);
    return ST_OK;
}

static void
on_loaded(uv_async_t *a)
{
    srv_t *s = a->data;
    struct srv_loader *l = s->loader;
    const srv_setup_t *su = &l->su;
    int rc;

    if (l->joined) {
        return;
    }
    join(s);
    if (s->draining || s->stopping) {
        return; /* srv_run stops the engine */
    }
    if (l->rc != ST_OK) {
        fail(s, l->rc);
        return;
    }
    s->model = su->model;
    s->tok = mdl_model_tokenizer(su->model);
    {
        const mdl_config_t *mc = mdl_model_config(su->model);
        s->gr_vocab = srv_grammar_vocab(s->tok, mc->eos_ids, mc->n_eos);
    }
    s->chat_template = su->chat_template;
    s->max_model_len = su->max_model_len;
    s->block_size = su->eng.rt.block_size;
    s->kv_blocks = su->eng.rt.num_blocks > 1 ? su->eng.rt.num_blocks - 1 : 0;
    s->lim.max_model_len = s->max_model_len;
    s->lim.vocab_size = tok_vocab_size(s->tok);
    rc = srv_chat_init(s);
    if (rc != ST_OK) {
        fail(s, rc);
        return;
    }
    LOG_INFO("model loaded: warming up the engine");
    warm_up(s);
}

int
srv_ready_begin(srv_t *s, const srv_setup_t *setup)
{
    struct srv_loader *l = xcalloc(1, sizeof(*l));

    l->su = *setup;
    atomic_init(&l->cancel, 0);
    uv_async_init(&s->loop, &l->done, on_loaded);
    l->done.data = s;
    s->loader = l;
    if (uv_thread_create(&l->thread, loader_main, s) != 0) {
        LOG_ERROR("cannot start the loader thread");
        l->joined = 1;
        return ST_ENOMEM;
    }
    return ST_OK;
}

void
srv_ready_fini(srv_t *s)
{
    if (s->loader == NULL) {
        return;
    }
    atomic_store(&s->loader->cancel, 1);
    join(s);
}

void
srv_ready_free(srv_t *s)
{
    free(s->loader);
    s->loader = NULL;
}

int
srv_ready_gate(srv_req_t *r, int ep, enum MHD_Result *ret)
{
    const srv_t *s = srv_req_server(r);

    /* The console's static files need no model: an operator can open the
     * page while the model loads (its API calls get the 503 below). */
    if (s->ready || ep == SRV_EP_METRICS || ep == SRV_EP_VERSION || ep == SRV_EP_CONSOLE ||
        ep == SRV_EP_CONSOLE_ROOT) {
        return 0;
    }
    if (ep == SRV_EP_HEALTH) {
        *ret = srv_req_reply(r, 503, xstrdup_try("{\"status\":\"loading\"}"), SRV_CT_JSON, 1);
    } else {
        *ret = srv_req_reply_errmsg(r, 503, NULL, "the model is loading");
    }
    return 1;
}

int
srv_ready_on_msg(srv_t *s, const msg_t *m)
{
    struct srv_loader *l = s->loader;
    uint64_t id;

    if (l == NULL || l->warm_id == 0) {
        return 0;
    }
    switch (m->type) {
    case ENG_MSG_DELTA:
        return ((const eng_msg_delta_t *)m)->id == l->warm_id;
    case ENG_MSG_FINISHED:
        id = ((const eng_msg_finished_t *)m)->id;
        break;
    case ENG_MSG_ERROR:
        id = ((const eng_msg_error_t *)m)->id;
        break;
    default:
        return 0;
    }
    if (id != l->warm_id) {
        return 0;
    }
    l->warm_id = 0;
    if (m->type == ENG_MSG_ERROR) {
        LOG_ERROR("warm-up: the engine failed its first step");
        fail(s, ST_EINVAL);
        return 1;
    }
    if (s->draining || s->stopping) {
        return 1;
    }
    s->ready = 1;
    LOG_INFO("warm-up step done in %.1f ms", (double)(now_ns() - l->warm_t0) / 1e6);
    srv_loop_on_ready(s);
    return 1;
}

void
srv_ready_sweep(srv_t *s)
{
    struct srv_loader *l = s->loader;

    if (l != NULL && l->warm_id != 0 && s->engine != NULL && !engine_alive(s->engine)) {
        l->warm_id = 0;
        LOG_ERROR("warm-up: the engine stopped during its first step");
        fail(s, ST_EINVAL);
    }
}
