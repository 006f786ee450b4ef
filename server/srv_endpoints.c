/* srv_endpoints.c - the endpoints of the route table (srv_route.c): the
 * small ones (/v1/models, /health, /version, /metrics, /tokenize,
 * /detokenize, /apply-template) written here, and the generation ones bound to their
 * response shapes (srv_openai.h) and run by srv_gen.c.
 *
 * DESIGN
 *   Each endpoint answers its request at once through srv_req.h, except
 *   /metrics with a running engine: it asks the engine for its STATS and
 *   waits for the reply (srv_ep_stats_reply), and generation, which
 *   waits for its jobs.
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

/* Parses a small JSON body for /tokenize and /detokenize. */
static cJSON *
parse_small_body(srv_req_t *r, srv_error_t *err)
{
    const srv_t *s = srv_req_server(r);
    size_t len;
    const char *body = srv_req_body(r, &len);
    cJSON *root, *model;

    if (!srv_json_precheck(body, len, s->lim.max_depth, err)) {
        return NULL;
    }
    unsigned long mark = srv_json_mark();
    root = cJSON_ParseWithLength(body, len);
    if (xmalloc_try_failures() != mark) {
        cJSON_Delete(root);
        srv_err_oom(err);
        return NULL;
    }
    if (root == NULL || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_err_set(err, 400, NULL, "request body must be a JSON object");
        return NULL;
    }
    model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(model) && strcmp(model->valuestring, s->model_name) != 0) {
        /* The message quotes the name: format it before the tree goes. */
        srv_err_set(err, 404, "model", "The model '%.100s' does not exist", model->valuestring);
        err->code = "model_not_found";
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* The text /tokenize encodes for "messages": the conversation rendered as
 * /v1/chat/completions would, or NULL with err (err->status 0: out of
 * memory, answered with the static 503). */
static char *
tokenize_chat_text(srv_req_t *r, cJSON *root, cJSON *msgs, srv_error_t *err)
{
    const srv_t *s = srv_req_server(r);
    srv_params_t p;
    srv_buf_t body = {0};
    char *mj = cJSON_PrintUnformatted(msgs);

    /* Reuse the chat parser through a minimal chat body. */
    srv_buf_adds(&body, "{\"model\":");
    srv_json_string(&body, s->model_name, strlen(s->model_name));
    srv_buf_adds(&body, ",\"messages\":");
    srv_buf_adds(&body, mj != NULL ? mj : "");
    srv_buf_adds(&body, "}");
    free(mj);
    if (mj == NULL || body.oom) {
        srv_buf_free(&body);
        err->status = 0; /* out of memory: the static 503 */
        return NULL;
    }
    int ok = srv_params_parse(SRV_KIND_CHAT, body.data, body.len, &s->lim, &p, err);
    srv_buf_free(&body);
    if (!ok) {
        return NULL;
    }
    cJSON *agp = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
    char *text =
        srv_chat_render(s, p.messages, p.n_messages, agp == NULL || cJSON_IsTrue(agp), err);
    srv_params_free(&p);
    return text;
}

static enum MHD_Result
do_tokenize(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    srv_error_t err;
    cJSON *root = parse_small_body(r, &err), *prompt, *msgs, *ast, *out, *arr;
    int flags = TOK_PARSE_SPECIAL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc;

    if (root == NULL) {
        return srv_req_reply_error(r, &err);
    }
    prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    ast = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    if (cJSON_IsString(prompt)) {
        if (ast == NULL || cJSON_IsTrue(ast)) {
            flags |= TOK_ADD_SPECIAL;
        }
        rc = tok_encode(s->tok, prompt->valuestring, strlen(prompt->valuestring), flags, &ids,
                        &n_ids);
    } else if (cJSON_IsArray(msgs)) {
        char *text = tokenize_chat_text(r, root, msgs, &err);
        if (text == NULL) {
            cJSON_Delete(root);
            return err.status ? srv_req_reply_error(r, &err) : srv_req_reply(r, 503, NULL, NULL, 1);
        }
        rc = tok_encode(s->tok, text, strlen(text), TOK_PARSE_SPECIAL, &ids, &n_ids);
        free(text);
    } else {
        cJSON_Delete(root);
        return srv_req_reply_errmsg(r, 400, "prompt",
                                    "'prompt' (a string) or 'messages' is required");
    }
    cJSON_Delete(root);
    if (rc == ST_ENOMEM) {
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    if (rc != ST_OK) {
        return srv_req_reply_errmsg(r, 400, "prompt", "the text could not be tokenized");
    }
    unsigned long mark = srv_json_mark();
    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", (double)n_ids);
    cJSON_AddNumberToObject(out, "max_model_len", s->max_model_len);
    arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n_ids; i++) {
        srv_json_push(arr, cJSON_CreateNumber(ids[i]));
    }
    free(ids);
    return srv_req_reply_json(r, 200, out, mark);
}

static enum MHD_Result
do_detokenize(srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    srv_error_t err;
    cJSON *root = parse_small_body(r, &err), *toks, *it, *out;
    int32_t *ids;
    int32_t n = 0, vocab = tok_vocab_size(s->tok);
    char *text = NULL;
    size_t len = 0;

    if (root == NULL) {
        return srv_req_reply_error(r, &err);
    }
    toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        return srv_req_reply_errmsg(r, 400, "tokens", "'tokens' must be an array of token ids");
    }
    ids = xcalloc_try((size_t)cJSON_GetArraySize(toks) + 1, sizeof(int32_t));
    if (ids == NULL) {
        cJSON_Delete(root);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    cJSON_ArrayForEach(it, toks)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble ||
            it->valuedouble < 0 || it->valuedouble >= vocab) {
            free(ids);
            cJSON_Delete(root);
            srv_err_set(&err, 400, "tokens", "'tokens' items must be token ids in 0..%d",
                        vocab - 1);
            return srv_req_reply_error(r, &err);
        }
        ids[n++] = (int32_t)it->valuedouble;
    }
    cJSON_Delete(root);
    int rc = tok_decode(s->tok, ids, (size_t)n, 0, &text, &len);
    free(ids);
    if (rc == ST_ENOMEM) {
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    if (rc != ST_OK) {
        return srv_req_reply_errmsg(r, 400, "tokens", "the tokens could not be decoded");
    }
    srv_buf_t clean = {0};
    srv_token_text(text, len, &clean);
    free(text);
    if (clean.oom) {
        srv_buf_free(&clean);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    unsigned long mark = srv_json_mark();
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", clean.data);
    srv_buf_free(&clean);
    return srv_req_reply_json(r, 200, out, mark);
}

/* POST /apply-template (llama.cpp's route): the prompt text a chat body's
 * "messages" render to through the chat template, as
 * /v1/chat/completions would feed it to the model: {"prompt": text}. */
static enum MHD_Result
do_apply_template(srv_req_t *r)
{
    srv_error_t err;
    cJSON *root = parse_small_body(r, &err), *msgs, *out;
    char *text;

    if (root == NULL) {
        return srv_req_reply_error(r, &err);
    }
    msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(root);
        return srv_req_reply_errmsg(r, 400, "messages", "'messages' (an array) is required");
    }
    text = tokenize_chat_text(r, root, msgs, &err);
    cJSON_Delete(root);
    if (text == NULL) {
        return err.status ? srv_req_reply_error(r, &err) : srv_req_reply(r, 503, NULL, NULL, 1);
    }
    unsigned long mark = srv_json_mark();
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
    free(text);
    return srv_req_reply_json(r, 200, out, mark);
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
    [SRV_EP_TOKENIZE] = do_tokenize,
    [SRV_EP_DETOKENIZE] = do_detokenize,
    [SRV_EP_VERSION] = do_version,
    [SRV_EP_MODEL] = do_model,
    [SRV_EP_EMBEDDINGS] = srv_embed_start,
    [SRV_EP_RESPONSES] = do_responses,
    [SRV_EP_ADMIN_KV] = srv_admin_kv,
    [SRV_EP_ADMIN_BLOCK] = srv_admin_block,
    [SRV_EP_ADMIN_STATS] = srv_admin_stats,
    [SRV_EP_RESET_PREFIX] = srv_admin_reset,
    [SRV_EP_APPLY_TEMPLATE] = do_apply_template,
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
