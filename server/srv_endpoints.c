/* srv_endpoints.c - the endpoints of the route table (srv_route.c): the
 * small ones (/v1/models, /health, /version, /metrics) written here,
 * /tokenize, /detokenize and /apply-template bound to srv_tokwork.c, and
 * the generation ones bound to their response shapes (srv_openai.h) and
 * run by srv_gen.c.
 *
 * DESIGN
 *   Each endpoint answers its request at once through srv_req.h, except
 *   /metrics with a running engine: it asks the engine for its STATS and
 *   waits for the reply (srv_ep_stats_reply); generation, which waits for
 *   its jobs; and /tokenize, /detokenize and /apply-template, made on the
 *   thread pool (srv_tokwork.h).
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "server/srv_admin.h"
#include "server/srv_console.h"
#include "server/srv_endpoints.h"
#include "server/srv_embed.h"
#include "server/srv_gen.h"
#include "server/srv_ready.h"
#include "server/srv_tokwork.h"

#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result
do_models(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    unsigned long mark = srv_json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();

    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    cJSON_AddNumberToObject(m, "max_model_len", s->max_model_len);
    srv_json_push(data, m);
    return srv_req_reply_json(r, 200, root, mark);
}

/* GET /v1/models/{model}: the served model's object, or 404 as OpenAI
 * answers an unknown id. */
static enum MHD_Result
do_model(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    const char *id = NULL;
    srv_error_t err;

    for (const srv_route_t *rt = srv_routes; rt->path != NULL && id == NULL; rt++) {
        if (rt->ep == SRV_EP_MODEL) {
            id = srv_route_param(rt, srv_req_url(r));
        }
    }
    if (id == NULL || strcmp(id, s->model_name) != 0) {
        srv_err_set(&err, 404, "model", "The model '%.100s' does not exist",
                    id != NULL ? id : "");
        err.code = "model_not_found";
        return srv_req_reply_error(r, &err);
    }
    unsigned long mark = srv_json_mark();
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    cJSON_AddNumberToObject(m, "max_model_len", s->max_model_len);
    return srv_req_reply_json(r, 200, m, mark);
}

static enum MHD_Result
do_health(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);

    if (s->engine == NULL || !engine_alive(s->engine)) {
        return srv_req_reply_errmsg(r, 503, NULL, "the engine is not running");
    }
    const char *gen = srv_req_arg(r, "generate");
    if (gen != NULL && strcmp(gen, "0") != 0) {
        return srv_health_deep(r);
    }
    unsigned long mark = srv_json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", "ok");
    return srv_req_reply_json(r, 200, root, mark);
}

static enum MHD_Result
do_version(srv_req_t *r)
{
    unsigned long mark = srv_json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", KVSERVE_VERSION);
    return srv_req_reply_json(r, 200, root, mark);
}

/* The metrics text with the engine's stats st (NULL: the loop's only), or
 * NULL when out of memory. */
static char *
metrics_text(const srv_t *s, const eng_stats_t *st)
{
    srv_buf_t b = {0};

    srv_metrics_format(&s->metrics, st, s->model_name, &b);
    srv_buf_add(&b, "", 0);
    if (b.oom) {
        srv_buf_free(&b);
    }
    return b.data;
}

static enum MHD_Result
do_metrics(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    eng_msg_stats_t *m;

    if (s->engine == NULL || !engine_alive(s->engine)) {
        return srv_req_reply(r, 200, metrics_text(s, NULL), CT_METRICS, 0);
    }
    m = xcalloc_try(1, sizeof(*m));
    if (m == NULL || !srv_req_reserve(r)) {
        free(m);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    m->hdr.type = ENG_MSG_STATS;
    m->cookie = srv_req_id(r);
    chan_send(engine_inbox(s->engine), &m->hdr);
    srv_req_wait(r);
    return MHD_YES;
}

void
srv_ep_stats_reply(srv_t *s, const eng_msg_stats_t *st)
{
    srv_req_t *r;

    s->last_stats = st->stats;
    s->have_stats = 1;
    if (st->cookie == 0) {
        return; /* periodic: kept as last_stats */
    }
    r = srv_req_find(s, st->cookie);
    if (r != NULL && srv_req_waiting(r)) {
        /* A NULL body is the static 503. */
        srv_req_answer(r, 200, metrics_text(s, &st->stats), CT_METRICS, 0);
    }
}

static enum MHD_Result
do_completions(srv_req_t *r)
{
    return srv_gen_start(r, &srv_api_completions);
}

static enum MHD_Result
do_chat(srv_req_t *r)
{
    return srv_gen_start(r, &srv_api_chat);
}

static enum MHD_Result
do_responses(srv_req_t *r)
{
    return srv_gen_start(r, &srv_api_responses);
}

/* The route table names the endpoint; this binds it to what it does. */
static enum MHD_Result (*const handlers[SRV_EP_COUNT])(srv_req_t *r) = {
    [SRV_EP_COMPLETIONS] = do_completions,
    [SRV_EP_CHAT] = do_chat,
    [SRV_EP_MODELS] = do_models,
    [SRV_EP_HEALTH] = do_health,
    [SRV_EP_METRICS] = do_metrics,
    [SRV_EP_TOKENIZE] = srv_tok_tokenize,
    [SRV_EP_DETOKENIZE] = srv_tok_detokenize,
    [SRV_EP_VERSION] = do_version,
    [SRV_EP_MODEL] = do_model,
    [SRV_EP_EMBEDDINGS] = srv_embed_start,
    [SRV_EP_RESPONSES] = do_responses,
    [SRV_EP_ADMIN_KV] = srv_admin_kv,
    [SRV_EP_ADMIN_BLOCK] = srv_admin_block,
    [SRV_EP_ADMIN_STATS] = srv_admin_stats,
    [SRV_EP_RESET_PREFIX] = srv_admin_reset,
    [SRV_EP_APPLY_TEMPLATE] = srv_tok_apply_template,
    [SRV_EP_CONSOLE_ROOT] = srv_console_serve,
    [SRV_EP_CONSOLE] = srv_console_serve,
};

enum MHD_Result
srv_ep_dispatch(srv_req_t *r, int ep)
{
    enum MHD_Result ret;

    if (ep < 0 || ep >= SRV_EP_COUNT || handlers[ep] == NULL) {
        return srv_req_reply_errmsg(r, 404, NULL, "not found");
    }
    if (srv_ready_gate(r, ep, &ret)) {
        return ret; /* 503 while the model loads */
    }
    return handlers[ep](r);
}
