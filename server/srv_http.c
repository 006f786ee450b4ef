/* srv_http.c - routes, request life, and the OpenAI JSON / SSE responses.
 *
 * DESIGN
 *   The access handler is called once when the headers are in (header
 *   checks, routing, auth, body size from Content-Length), once per body
 *   chunk (accumulated up to the body limit), and once more when the whole
 *   request is in: then the request is answered at once, or (generation,
 *   /metrics) submitted to the engine and its connection suspended. Outbox
 *   messages update the request; when there is something to send the
 *   connection is resumed and the handler queues the response: a JSON body,
 *   or for "stream": true an SSE response whose content reader hands out
 *   buffered chunks and suspends the connection when it has none.
 *
 *   Stop strings are matched on detokenized text across token boundaries
 *   (srv_stop_t): the text returned ends before the stop string, and the
 *   engine is told to finish that choice with CANCEL(as_stop).
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "model/chat.h"
#include "server/srv_loop.h"

#define CT_JSON "application/json"
/* Room a stream's output buffer gets up front: chunks of a client that
 * reads along never make it grow (one allocation, not one per doubling
 * at a moment that depends on how fast the client reads). */
#define SRV_STREAM_RESERVE (16 * 1024)

/* ---- job table --------------------------------------------------------------- */

static srv_job_t **
job_slot(srv_t *s, uint64_t id)
{
    return &s->jobs[id & (SRV_JOB_BUCKETS - 1)];
}

static srv_job_t *
job_find(srv_t *s, uint64_t id)
{
    for (srv_job_t *j = *job_slot(s, id); j != NULL; j = j->hnext) {
        if (j->id == id) {
            return j;
        }
    }
    return NULL;
}

static void
job_unlink(srv_t *s, srv_job_t *job)
{
    for (srv_job_t **pp = job_slot(s, job->id); *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == job) {
            *pp = job->hnext;
            return;
        }
    }
}

static void
send_cancel(srv_t *s, uint64_t id, int as_stop, int32_t choice)
{
    eng_msg_cancel_t *m;

    if (s->engine == NULL) {
        return;
    }
    /* Without memory for the message the job runs on to its end: its
     * output is ignored, and its blocks are freed when it finishes. */
    m = xcalloc_try(1, sizeof(*m));
    if (m == NULL) {
        REQ_WARN(id, "out of memory: cancel not sent, the job runs to its end");
        return;
    }
    m->hdr.type = ENG_MSG_CANCEL;
    m->id = id;
    m->as_stop = as_stop;
    m->choice = choice;
    chan_send(engine_inbox(s->engine), &m->hdr);
}

static void
cancel_jobs(srv_req_t *r)
{
    for (int32_t i = 0; i < r->n_jobs; i++) {
        if (r->jobs[i].open) {
            send_cancel(r->s, r->jobs[i].id, 0, -1);
        }
    }
}

/* ---- request records --------------------------------------------------------- */

/* The request record, or NULL when out of memory. */
static srv_req_t *
req_new(srv_t *s, struct MHD_Connection *mc)
{
    srv_req_t *r = xcalloc_try(1, sizeof(*r));
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    if (r == NULL) {
        return NULL;
    }
    r->s = s;
    r->mc = mc;
    r->id = s->next_id++;
    r->t_arrival_ns = now_ns();
    r->created = time(NULL);
    r->conn = ci ? ci->socket_context : NULL;
    if (r->conn != NULL) {
        r->conn->req = r;
    }
    list_push_back(&s->reqs, &r->node);
    s->n_reqs++;
    return r;
}

void
srv_req_maybe_free(srv_req_t *r)
{
    srv_t *s = r->s;

    if (!r->mhd_done || r->jobs_open > 0) {
        return;
    }
    if (r->conn != NULL && r->conn->req == r) {
        r->conn->req = NULL;
    }
    for (int32_t i = 0; i < r->n_choices; i++) {
        srv_stop_free(&r->choices[i].stop);
        srv_buf_free(&r->choices[i].text);
        cJSON_Delete(r->choices[i].lp);
    }
    for (int32_t i = 0; i < r->n_jobs; i++) {
        if (r->jobs[i].open) {
            job_unlink(s, &r->jobs[i]);
        }
    }
    free(r->choices);
    free(r->jobs);
    if (r->have_params) {
        srv_params_free(&r->p);
    }
    srv_buf_free(&r->body);
    srv_buf_free(&r->out);
    srv_buf_free(&r->chunk_prefix);
    srv_buf_free(&r->tail);
    free(r->hup_mem);
    free(r->resp_body);
    list_remove(&r->node);
    s->n_reqs--;
    free(r);
    srv_loop_check_drained(s);
}

/* ---- responses --------------------------------------------------------------- */

static void
count_status(srv_req_t *r, int status)
{
    int cls = status / 100;

    if (cls >= 1 && cls <= 5) {
        r->s->metrics.http_requests[r->ep][cls]++;
    }
}

/* X-Request-Id: the id the server's log lines carry ("req=N"). */
static void
add_request_id(const srv_req_t *r, struct MHD_Response *resp)
{
    char id[24];

    snprintf(id, sizeof(id), "%llu", (unsigned long long)r->id);
    MHD_add_response_header(resp, "X-Request-Id", id);
}

/* Queues body (malloc'd, ownership passes to MHD). A NULL body (its
 * building ran out of memory) becomes the static out-of-memory error, 503. */
static enum MHD_Result
queue_body(srv_req_t *r, int status, char *body, const char *ctype, int retry_after)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;
    char ra[16];

    if (body == NULL) {
        REQ_WARN(r->id, "503 out of memory building the response");
        status = 503;
        ctype = CT_JSON;
        retry_after = 1;
        resp = MHD_create_response_from_buffer(strlen(srv_oom_json), (void *)srv_oom_json,
                                               MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    }
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    add_request_id(r, resp);
    if (retry_after > 0) {
        snprintf(ra, sizeof(ra), "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (status == 405) {
        for (const srv_route_t *rt = srv_routes; rt->path != NULL; rt++) {
            if (rt->ep == r->ep) {
                MHD_add_response_header(resp, "Allow", rt->method);
            }
        }
    }
    if (r->s->draining) {
        MHD_add_response_header(resp, "Connection", "close");
    }
    ret = MHD_queue_response(r->mc, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    r->state = SRV_REQ_RESPONDED;
    count_status(r, status);
    return ret;
}

/* Marks the start of building a cJSON tree: pass the mark to json_print. */
static unsigned long
json_mark(void)
{
    return xmalloc_try_failures();
}

/* Adds item under key; when that fails (out of memory for the key) the
 * item is deleted instead of leaked. The failure shows at json_print. */
static void
json_add(cJSON *obj, const char *key, cJSON *item)
{
    if (item != NULL && !cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
    }
}

/* Appends item to arr (which may be NULL when its own creation failed);
 * deletes the item when it cannot be appended. */
static void
json_push(cJSON *arr, cJSON *item)
{
    if (item != NULL && !cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
    }
}

/* Prints and deletes root; NULL when any allocation since mark failed (a
 * cJSON builder then silently drops the node it could not make). */
static char *
json_print(cJSON *root, unsigned long mark)
{
    char *out = xmalloc_try_failures() == mark ? cJSON_PrintUnformatted(root) : NULL;

    cJSON_Delete(root);
    if (out != NULL && xmalloc_try_failures() != mark) {
        free(out);
        out = NULL;
    }
    return out;
}

static enum MHD_Result
queue_json(srv_req_t *r, int status, cJSON *root, unsigned long mark)
{
    return queue_body(r, status, json_print(root, mark), CT_JSON, 0);
}

static enum MHD_Result
queue_error(srv_req_t *r, const srv_error_t *err)
{
    if (err->status >= 500 || err->status == 429) {
        REQ_WARN(r->id, "%d %s", err->status, err->message);
    } else {
        REQ_INFO(r->id, "%d %s", err->status, err->message);
    }
    return queue_body(r, err->status, srv_err_json(err), CT_JSON,
                      err->status == 429 || err->status == 503 ? 1 : 0);
}

static enum MHD_Result
queue_error_msg(srv_req_t *r, int status, const char *param, const char *msg)
{
    srv_error_t err;

    srv_err_set(&err, status, param, "%s", msg);
    return queue_error(r, &err);
}

/* ---- header checks ----------------------------------------------------------- */

typedef struct hdr_scan {
    int n_content_length;
    int n_transfer_encoding;
    int te_not_chunked;
} hdr_scan_t;

static enum MHD_Result
scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    hdr_scan_t *h = cls;

    (void)kind;
    if (strcasecmp(key, "Content-Length") == 0) {
        h->n_content_length++;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        h->n_transfer_encoding++;
        if (value == NULL || strcasecmp(value, "chunked") != 0) {
            h->te_not_chunked = 1;
        }
    }
    return MHD_YES;
}

static int
auth_tenant(srv_req_t *r)
{
    const cfg_t *cfg = r->s->cfg;
    const char *h;

    if (!cfg->auth_required) {
        return 0;
    }
    h = MHD_lookup_connection_value(r->mc, MHD_HEADER_KIND, "Authorization");
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0) {
        return -1;
    }
    h += 7;
    while (*h == ' ') {
        h++;
    }
    return cfg_tenant_find_by_key(cfg, h);
}

static enum MHD_Result do_debug(srv_req_t *r, const char *url, const char *method);

static enum MHD_Result
first_call(srv_req_t *r, const char *url, const char *method)
{
    srv_t *s = r->s;
    const srv_route_t *rt;
    hdr_scan_t hs = {0};
    const char *cl;

    r->ep = SRV_EP_OTHER;
    if (s->test_hooks && strncmp(url, "/debug/", 7) == 0) {
        return do_debug(r, url, method);
    }
    rt = srv_route_find(url, method, &r->ep);
    MHD_get_connection_values(r->mc, MHD_HEADER_KIND, scan_header, &hs);
    if (hs.n_content_length > 1) {
        return queue_error_msg(r, 400, NULL, "duplicate Content-Length header");
    }
    if (hs.n_content_length > 0 && hs.n_transfer_encoding > 0) {
        return queue_error_msg(r, 400, NULL,
                               "both Content-Length and Transfer-Encoding are present");
    }
    if (hs.n_transfer_encoding > 1 || hs.te_not_chunked) {
        return queue_error_msg(r, 400, NULL, "unsupported Transfer-Encoding");
    }
    if (s->draining) {
        return queue_error_msg(r, 503, NULL, "the server is shutting down");
    }
    if (r->ep == SRV_EP_OTHER) {
        srv_error_t err;
        srv_err_set(&err, 404, NULL, "no route for %.200s %.200s", method, url);
        err.code = "unknown_url";
        return queue_error(r, &err);
    }
    if (rt == NULL) {
        return queue_error_msg(r, 405, NULL, "method not allowed");
    }
    cl = MHD_lookup_connection_value(r->mc, MHD_HEADER_KIND, "Content-Length");
    if (cl != NULL) {
        char *end;
        unsigned long long v = strtoull(cl, &end, 10);
        if (end == cl || *end != '\0') {
            return queue_error_msg(r, 400, NULL, "malformed Content-Length");
        }
        if (v > (unsigned long long)s->cfg->max_body_bytes) {
            srv_error_t err;
            srv_err_set(&err, 413, NULL, "request body of %llu bytes exceeds the limit of %lld", v,
                        (long long)s->cfg->max_body_bytes);
            return queue_error(r, &err);
        }
        r->content_length = (size_t)v;
    }
    if (!((rt->access == SRV_ACCESS_PUBLIC_HEALTH && s->cfg->public_health) ||
          (rt->access == SRV_ACCESS_PUBLIC_METRICS && s->cfg->public_metrics))) {
        r->tenant = auth_tenant(r);
        if (r->tenant < 0) {
            r->tenant = 0;
            return queue_error_msg(r, 401, NULL, "invalid or missing API key");
        }
    }
    return MHD_YES;
}

/* ---- simple routes ----------------------------------------------------------- */

static enum MHD_Result
do_models(srv_req_t *r)
{
    unsigned long mark = json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();

    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddStringToObject(m, "id", r->s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)r->s->started);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    cJSON_AddNumberToObject(m, "max_model_len", r->s->max_model_len);
    json_push(data, m);
    return queue_json(r, 200, root, mark);
}

static enum MHD_Result
do_health(srv_req_t *r)
{
    if (r->s->engine == NULL || !engine_alive(r->s->engine)) {
        return queue_error_msg(r, 503, NULL, "the engine is not running");
    }
    unsigned long mark = json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", "ok");
    return queue_json(r, 200, root, mark);
}

static enum MHD_Result
do_version(srv_req_t *r)
{
    unsigned long mark = json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", KVSERVE_VERSION);
    return queue_json(r, 200, root, mark);
}

static enum MHD_Result
queue_metrics(srv_req_t *r, const eng_stats_t *st)
{
    srv_buf_t b = {0};

    srv_metrics_format(&r->s->metrics, st, r->s->model_name, &b);
    srv_buf_add(&b, "", 0);
    if (b.oom) {
        srv_buf_free(&b);
    }
    return queue_body(r, 200, b.data, "text/plain; version=0.0.4; charset=utf-8", 0);
}

static enum MHD_Result
do_metrics(srv_req_t *r)
{
    eng_msg_stats_t *m;

    if (r->s->engine == NULL || !engine_alive(r->s->engine)) {
        return queue_metrics(r, NULL);
    }
    m = xcalloc_try(1, sizeof(*m));
    r->hup_mem = m != NULL ? xmalloc_try(sizeof(*r->hup_mem)) : NULL;
    if (r->hup_mem == NULL) {
        free(m);
        return queue_body(r, 503, NULL, CT_JSON, 1);
    }
    m->hdr.type = ENG_MSG_STATS;
    m->cookie = r->id;
    chan_send(engine_inbox(r->s->engine), &m->hdr);
    r->stats_wait = 1;
    r->state = SRV_REQ_WAITING;
    srv_loop_suspend(r);
    return MHD_YES;
}

/* Parses a small JSON body for /tokenize and /detokenize. */
static cJSON *
parse_small_body(srv_req_t *r, srv_error_t *err)
{
    cJSON *root, *model;

    if (!srv_json_precheck(r->body.data ? r->body.data : "", r->body.len, r->s->lim.max_depth,
                           err)) {
        return NULL;
    }
    unsigned long mark = json_mark();
    root = cJSON_ParseWithLength(r->body.data ? r->body.data : "", r->body.len);
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
    if (cJSON_IsString(model) && strcmp(model->valuestring, r->s->model_name) != 0) {
        /* The message quotes the name: format it before the tree goes. */
        srv_err_set(err, 404, "model", "The model '%.100s' does not exist", model->valuestring);
        err->code = "model_not_found";
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static char *render_chat(srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp,
                         srv_error_t *err);

static enum MHD_Result
do_tokenize(srv_req_t *r)
{
    srv_error_t err;
    cJSON *root = parse_small_body(r, &err), *prompt, *msgs, *ast, *out, *arr;
    int flags = TOK_PARSE_SPECIAL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc;

    if (root == NULL) {
        return queue_error(r, &err);
    }
    prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    ast = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    if (cJSON_IsString(prompt)) {
        if (ast == NULL || cJSON_IsTrue(ast)) {
            flags |= TOK_ADD_SPECIAL;
        }
        rc = tok_encode(r->s->tok, prompt->valuestring, strlen(prompt->valuestring), flags, &ids,
                        &n_ids);
    } else if (cJSON_IsArray(msgs)) {
        /* Reuse the chat parser through a minimal chat body. */
        srv_params_t p;
        srv_buf_t body = {0};
        char *mj = cJSON_PrintUnformatted(msgs);
        srv_buf_adds(&body, "{\"model\":");
        srv_json_string(&body, r->s->model_name, strlen(r->s->model_name));
        srv_buf_adds(&body, ",\"messages\":");
        srv_buf_adds(&body, mj != NULL ? mj : "");
        srv_buf_adds(&body, "}");
        free(mj);
        if (mj == NULL || body.oom) {
            srv_buf_free(&body);
            cJSON_Delete(root);
            return queue_body(r, 503, NULL, CT_JSON, 1);
        }
        int ok = srv_params_parse(SRV_KIND_CHAT, body.data, body.len, &r->s->lim, &p, &err);
        srv_buf_free(&body);
        if (!ok) {
            cJSON_Delete(root);
            return queue_error(r, &err);
        }
        cJSON *agp = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
        char *text =
            render_chat(r->s, p.messages, p.n_messages, agp == NULL || cJSON_IsTrue(agp), &err);
        srv_params_free(&p);
        if (text == NULL) {
            cJSON_Delete(root);
            return queue_error(r, &err);
        }
        rc = tok_encode(r->s->tok, text, strlen(text), TOK_PARSE_SPECIAL, &ids, &n_ids);
        free(text);
    } else {
        cJSON_Delete(root);
        return queue_error_msg(r, 400, "prompt", "'prompt' (a string) or 'messages' is required");
    }
    cJSON_Delete(root);
    if (rc == ST_ENOMEM) {
        return queue_body(r, 503, NULL, CT_JSON, 1);
    }
    if (rc != ST_OK) {
        return queue_error_msg(r, 400, "prompt", "the text could not be tokenized");
    }
    unsigned long mark = json_mark();
    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", (double)n_ids);
    cJSON_AddNumberToObject(out, "max_model_len", r->s->max_model_len);
    arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n_ids; i++) {
        json_push(arr, cJSON_CreateNumber(ids[i]));
    }
    free(ids);
    return queue_json(r, 200, out, mark);
}

static enum MHD_Result
do_detokenize(srv_req_t *r)
{
    srv_error_t err;
    cJSON *root = parse_small_body(r, &err), *toks, *it, *out;
    int32_t *ids;
    int32_t n = 0, vocab = tok_vocab_size(r->s->tok);
    char *text = NULL;
    size_t len = 0;

    if (root == NULL) {
        return queue_error(r, &err);
    }
    toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        return queue_error_msg(r, 400, "tokens", "'tokens' must be an array of token ids");
    }
    ids = xcalloc_try((size_t)cJSON_GetArraySize(toks) + 1, sizeof(int32_t));
    if (ids == NULL) {
        cJSON_Delete(root);
        return queue_body(r, 503, NULL, CT_JSON, 1);
    }
    cJSON_ArrayForEach(it, toks)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble ||
            it->valuedouble < 0 || it->valuedouble >= vocab) {
            free(ids);
            cJSON_Delete(root);
            srv_err_set(&err, 400, "tokens", "'tokens' items must be token ids in 0..%d",
                        vocab - 1);
            return queue_error(r, &err);
        }
        ids[n++] = (int32_t)it->valuedouble;
    }
    cJSON_Delete(root);
    int rc = tok_decode(r->s->tok, ids, (size_t)n, 0, &text, &len);
    free(ids);
    if (rc == ST_ENOMEM) {
        return queue_body(r, 503, NULL, CT_JSON, 1);
    }
    if (rc != ST_OK) {
        return queue_error_msg(r, 400, "tokens", "the tokens could not be decoded");
    }
    srv_buf_t clean = {0};
    srv_token_text(text, len, &clean);
    free(text);
    if (clean.oom) {
        srv_buf_free(&clean);
        return queue_body(r, 503, NULL, CT_JSON, 1);
    }
    unsigned long mark = json_mark();
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", clean.data);
    srv_buf_free(&clean);
    return queue_json(r, 200, out, mark);
}

/* ---- chat templates ---------------------------------------------------------- */

int
srv_http_chat_init(srv_t *s)
{
    char err[256] = "";
    chat_template_t *t = NULL;
    int rc;

    s->chat = NULL;
    if (s->chat_template == NULL) {
        LOG_INFO("the model has no chat template: using the plain one");
        return ST_OK;
    }
    rc = chat_template_compile(s->chat_template, &t, err, sizeof(err));
    if (rc != ST_OK) {
        LOG_ERROR("chat template: %s", err[0] ? err : st_str(rc));
        return rc;
    }
    s->chat = t;
    return ST_OK;
}

void
srv_http_chat_fini(srv_t *s)
{
    chat_template_destroy(s->chat);
    s->chat = NULL;
}

/* Renders the conversation; NULL with err (400) when the template refuses
 * it (raise_exception) or exceeds its limits, (503) when out of memory.
 * The result is malloc'd. */
static char *
render_chat(srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp, srv_error_t *err)
{
    int32_t bos = tok_bos_id(s->tok), eos = tok_eos_id(s->tok);
    const char *bos_s = bos >= 0 ? tok_token_str(s->tok, bos) : NULL;
    chat_render_opts_t opts;
    chat_message_t *cm;
    char *out = NULL, msg[256] = "";
    int rc;

    if (s->chat == NULL) {
        out = srv_chat_render_plain(msgs, n, agp, bos_s);
        if (out == NULL) {
            srv_err_oom(err);
        }
        return out;
    }
    memset(&opts, 0, sizeof(opts));
    opts.bos_token = bos_s;
    opts.eos_token = eos >= 0 ? tok_token_str(s->tok, eos) : NULL;
    opts.add_generation_prompt = agp;
    opts.max_output = 4u << 20;
    cm = xcalloc_try((size_t)n + 1, sizeof(*cm));
    if (cm == NULL) {
        srv_err_oom(err);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    rc = chat_template_render(s->chat, cm, (size_t)n, &opts, &out, msg, sizeof(msg));
    free(cm);
    if (rc == ST_ENOMEM) {
        srv_err_oom(err);
        return NULL;
    }
    if (rc != ST_OK) {
        srv_err_set(err, 400, "messages", "the chat template rejected the conversation: %s",
                    msg[0] ? msg : st_str(rc));
        return NULL;
    }
    return out;
}

/* ---- generation: JSON pieces ------------------------------------------------- */

static void
id_string(const srv_req_t *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s-%016" PRIx64, r->ep == SRV_EP_CHAT ? "chatcmpl" : "cmpl", r->id);
}

static cJSON *
base_object(const srv_req_t *r, int chunk)
{
    cJSON *o = cJSON_CreateObject();
    char id[48];

    id_string(r, id, sizeof(id));
    cJSON_AddStringToObject(o, "id", id);
    if (r->ep == SRV_EP_CHAT) {
        cJSON_AddStringToObject(o, "object", chunk ? "chat.completion.chunk" : "chat.completion");
    } else {
        cJSON_AddStringToObject(o, "object", "text_completion");
    }
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->s->model_name);
    return o;
}

static cJSON *
usage_object(const srv_req_t *r)
{
    cJSON *u = cJSON_CreateObject();
    int64_t prompt = 0, completion = 0, cached = 0;

    for (int32_t j = 0; j < r->n_jobs; j++) {
        prompt += r->p.prompts[r->jobs[j].prompt_idx].n_ids;
        cached += r->jobs[j].cached_tokens;
    }
    for (int32_t c = 0; c < r->n_choices; c++) {
        completion += r->choices[c].n_tokens;
    }
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

/* Decoded text of one token (special tokens included). raw receives the
 * bytes, txt the same with invalid UTF-8 replaced. Out of memory shows as
 * a failed fallible allocation on this thread (the caller's mark). */
static void
token_piece(const srv_t *s, int32_t id, srv_buf_t *raw, srv_buf_t *txt)
{
    char *t = NULL;
    size_t n = 0;

    raw->len = 0;
    txt->len = 0;
    if (tok_decode(s->tok, &id, 1, 0, &t, &n) != ST_OK) {
        t = NULL;
        n = 0;
    }
    srv_buf_add(raw, t ? t : "", n);
    srv_token_text(t ? t : "", n, txt);
    free(t);
}

static cJSON *
bytes_array(const srv_buf_t *raw)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < raw->len; i++) {
        json_push(a, cJSON_CreateNumber((unsigned char)raw->data[i]));
    }
    return a;
}

/* A fresh logprobs container in the endpoint's format. */
static cJSON *
lp_new(const srv_req_t *r)
{
    cJSON *lp = cJSON_CreateObject();

    if (r->ep == SRV_EP_CHAT) {
        cJSON_AddArrayToObject(lp, "content");
        cJSON_AddNullToObject(lp, "refusal");
    } else {
        cJSON_AddArrayToObject(lp, "tokens");
        cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON_AddArrayToObject(lp, "text_offset");
    }
    return lp;
}

static double
finite_lp(float v)
{
    return v < -9999.0f || v != v ? -9999.0 : (double)v;
}

static void
lp_add(const srv_req_t *r, srv_choice_t *ch, cJSON *lp, const smp_result_t *t)
{
    srv_buf_t raw = {0}, txt = {0};
    int32_t ntop = t->n_top < r->p.top_logprobs ? t->n_top : r->p.top_logprobs;

    token_piece(r->s, t->token, &raw, &txt);
    if (r->ep == SRV_EP_CHAT) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "token", txt.data ? txt.data : "");
        cJSON_AddNumberToObject(e, "logprob", finite_lp(t->logprob));
        json_add(e, "bytes", bytes_array(&raw));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int32_t k = 0; k < ntop; k++) {
            srv_buf_t r2 = {0}, t2 = {0};
            token_piece(r->s, t->top_ids[k], &r2, &t2);
            cJSON *te = cJSON_CreateObject();
            cJSON_AddStringToObject(te, "token", t2.data ? t2.data : "");
            cJSON_AddNumberToObject(te, "logprob", finite_lp(t->top_logprobs[k]));
            json_add(te, "bytes", bytes_array(&r2));
            json_push(tops, te);
            srv_buf_free(&r2);
            srv_buf_free(&t2);
        }
        json_push(cJSON_GetObjectItemCaseSensitive(lp, "content"), e);
    } else {
        json_push(cJSON_GetObjectItemCaseSensitive(lp, "tokens"),
                             cJSON_CreateString(txt.data ? txt.data : ""));
        json_push(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"),
                             cJSON_CreateNumber(finite_lp(t->logprob)));
        cJSON *tops = cJSON_CreateObject();
        for (int32_t k = 0; k < ntop; k++) {
            srv_buf_t r2 = {0}, t2 = {0};
            token_piece(r->s, t->top_ids[k], &r2, &t2);
            const char *key = t2.data ? t2.data : "";
            if (cJSON_GetObjectItemCaseSensitive(tops, key) == NULL) {
                cJSON_AddNumberToObject(tops, key, finite_lp(t->top_logprobs[k]));
            }
            srv_buf_free(&r2);
            srv_buf_free(&t2);
        }
        json_push(cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs"), tops);
        json_push(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"),
                             cJSON_CreateNumber(ch->text_offset));
        ch->text_offset += (int32_t)txt.len;
    }
    srv_buf_free(&raw);
    srv_buf_free(&txt);
}

/* The prompt of choice ci as text (echo): as given, or decoded from ids. */
static void
prompt_text(const srv_req_t *r, int32_t ci, srv_buf_t *out)
{
    const srv_prompt_t *pr = &r->p.prompts[ci / r->p.n];

    if (pr->text != NULL) {
        srv_buf_add(out, pr->text, pr->text_len);
    } else {
        char *dec = NULL;
        size_t dl = 0;
        if (tok_decode(r->s->tok, pr->ids, (size_t)pr->n_ids, 1, &dec, &dl) == ST_OK) {
            srv_token_text(dec, dl, out);
        }
        free(dec);
    }
    srv_buf_add(out, "", 0);
}

/* ---- generation: streaming --------------------------------------------------- */

/* The last words of a stream that failed: an error event and [DONE], sent
 * after what out holds. They go to their own buffer, so that a stream that
 * failed for lack of memory can still end cleanly (a static event when even
 * that buffer cannot be had). */
static void
stream_error_event(srv_req_t *r)
{
    static const char oom_event[] = "data: {\"error\":{\"message\":\"the server is out of "
                                    "memory; retry later\",\"type\":\"service_unavailable_"
                                    "error\",\"param\":null,\"code\":\"service_unavailable\"}}"
                                    "\n\ndata: [DONE]\n\n";
    char *e = srv_err_json(&r->err);

    srv_buf_free(&r->tail);
    if (e != NULL) {
        srv_sse_data(&r->tail, e);
        srv_sse_done(&r->tail);
        free(e);
    }
    if (e == NULL || r->tail.oom) {
        srv_buf_free(&r->tail);
        r->tail_static = oom_event;
    }
    r->tail_off = 0;
    r->stream_error = 1;
    r->out_eos = 1;
}

/* Out of memory while the request runs: it ends with the 503 error (a plain
 * response before a stream's headers, an error event and [DONE] after)
 * once its jobs, cancelled here, have finished. */
static void
req_fail_oom(srv_req_t *r)
{
    if (r->err.status) {
        return;
    }
    srv_err_oom(&r->err);
    REQ_WARN(r->id, "out of memory: cancelling");
    cancel_jobs(r);
}

/* Makes the buffered data reach the client. */
static void
kick(srv_req_t *r)
{
    if (r->mhd_done || r->client_gone) {
        return;
    }
    if (r->state == SRV_REQ_WAITING || r->state == SRV_REQ_STREAMING) {
        srv_loop_resume(r);
    }
}

static void
stream_emit(srv_req_t *r, int32_t ci, srv_choice_t *ch, const srv_buf_t *piece, cJSON *lp,
            const char *finish)
{
    unsigned long mark = json_mark();
    size_t out_len = r->out.len;

    if (r->stream_error || r->client_gone || r->err.status) {
        cJSON_Delete(lp);
        return;
    }
    if (piece->len == 0 && lp == NULL && finish == NULL &&
        (r->ep != SRV_EP_CHAT || ch->role_sent) && (!r->p.echo || ch->echo_sent)) {
        return;
    }
    /* Hand-built: one chunk per token and choice is the hot path of the
     * loop thread, and cJSON would allocate a node per field. The layout
     * is what base_object() + cJSON_PrintUnformatted() give. */
    if (r->chunk_prefix.len == 0) {
        char id[48];
        id_string(r, id, sizeof(id));
        srv_buf_printf(&r->chunk_prefix,
                       "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,"
                       "\"model\":",
                       id, r->ep == SRV_EP_CHAT ? "chat.completion.chunk" : "text_completion",
                       (long long)r->created);
        srv_json_string(&r->chunk_prefix, r->s->model_name, strlen(r->s->model_name));
        srv_buf_adds(&r->chunk_prefix, ",\"choices\":[{\"index\":");
    }
    srv_buf_add(&r->out, r->chunk_prefix.data, r->chunk_prefix.len);
    srv_buf_printf(&r->out, "%d,", ci);
    if (r->ep == SRV_EP_CHAT) {
        srv_buf_adds(&r->out, "\"delta\":{");
        if (!ch->role_sent) {
            srv_buf_adds(&r->out, "\"role\":\"assistant\"");
            ch->role_sent = 1;
            if (piece->len > 0 || finish == NULL) {
                srv_buf_adds(&r->out, ",");
            }
        }
        if (piece->len > 0 || finish == NULL) {
            srv_buf_adds(&r->out, "\"content\":");
            srv_json_string(&r->out, piece->data ? piece->data : "", piece->len);
        }
        srv_buf_adds(&r->out, "},");
    } else {
        srv_buf_adds(&r->out, "\"text\":");
        if (r->p.echo && !ch->echo_sent) {
            srv_buf_t t = {0};
            prompt_text(r, ci, &t);
            srv_buf_add(&t, piece->data ? piece->data : "", piece->len);
            srv_json_string(&r->out, t.data, t.len);
            srv_buf_free(&t);
        } else {
            srv_json_string(&r->out, piece->data ? piece->data : "", piece->len);
        }
        ch->echo_sent = 1;
        srv_buf_adds(&r->out, ",");
    }
    srv_buf_adds(&r->out, "\"logprobs\":");
    if (lp != NULL) {
        char *lpj = cJSON_PrintUnformatted(lp);
        if (lpj != NULL) {
            srv_buf_adds(&r->out, lpj);
            free(lpj);
        }
        cJSON_Delete(lp);
    } else {
        srv_buf_adds(&r->out, "null");
    }
    srv_buf_adds(&r->out, ",\"finish_reason\":");
    if (finish != NULL) {
        srv_json_string(&r->out, finish, strlen(finish));
    } else {
        srv_buf_adds(&r->out, "null");
    }
    srv_buf_adds(&r->out, r->p.include_usage ? "}],\"usage\":null}\n\n" : "}]}\n\n");
    if (xmalloc_try_failures() != mark) {
        /* Drop the torn chunk: the stream ends after the last whole one. */
        r->out.len = out_len;
        r->out.oom = 0;
        if (r->out.data != NULL) {
            r->out.data[out_len] = '\0';
        }
        srv_buf_free(&r->chunk_prefix);
        req_fail_oom(r);
        return;
    }

    if ((int64_t)r->out.len > r->s->cfg->max_sse_buffer_bytes) {
        srv_err_set(&r->err, 400, NULL,
                    "the client does not read the stream fast enough (%lld bytes unsent)",
                    (long long)r->out.len);
        r->err.code = "slow_consumer";
        REQ_WARN(r->id, "%s: cancelling", r->err.message);
        cancel_jobs(r);
        stream_error_event(r);
    }
    kick(r);
}

/* Text released for a choice: streamed at once or kept for the body. */
static void
choice_emit(srv_req_t *r, int32_t ci, srv_choice_t *ch, srv_buf_t *piece, cJSON *lp,
            const char *finish)
{
    if (r->p.stream) {
        stream_emit(r, ci, ch, piece, lp, finish);
    } else if (piece->len > 0) {
        srv_buf_add(&ch->text, piece->data, piece->len);
    }
}

/* ---- generation: the finished body ------------------------------------------- */

/* The JSON body, or NULL when out of memory. */
static char *
build_body(srv_req_t *r)
{
    unsigned long mark = json_mark();
    cJSON *root = base_object(r, 0);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    char *out;

    for (int32_t ci = 0; ci < r->n_choices; ci++) {
        srv_choice_t *ch = &r->choices[ci];
        cJSON *c = cJSON_CreateObject();
        const char *text = ch->text.data ? ch->text.data : "";

        cJSON_AddNumberToObject(c, "index", ci);
        if (r->ep == SRV_EP_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text);
            cJSON_AddNullToObject(m, "refusal");
        } else if (r->p.echo) {
            srv_buf_t t = {0};
            prompt_text(r, ci, &t);
            srv_buf_adds(&t, text);
            cJSON_AddStringToObject(c, "text", t.data ? t.data : "");
            srv_buf_free(&t);
        } else {
            cJSON_AddStringToObject(c, "text", text);
        }
        if (ch->lp != NULL) {
            json_add(c, "logprobs", ch->lp);
            ch->lp = NULL;
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", ch->finish ? ch->finish : "stop");
        json_push(choices, c);
    }
    json_add(root, "usage", usage_object(r));
    out = json_print(root, mark);
    return out;
}

/* Every job has said its last word. */
static void
request_done(srv_req_t *r)
{
    srv_t *s = r->s;
    uint64_t now = now_ns();
    srv_tenant_metrics_t *tm = &s->metrics.tenant[r->tenant];
    int64_t completion = 0;

    s->n_gen--;
    s->metrics.in_flight = s->n_gen;
    for (int32_t c = 0; c < r->n_choices; c++) {
        completion += r->choices[c].n_tokens;
    }
    tm->e2e.count += 0;
    srv_hist_observe(&tm->e2e, (double)(now - r->t_arrival_ns) / 1e9);
    for (int32_t j = 0; j < r->n_jobs; j++) {
        tm->prompt_tokens += (uint64_t)r->p.prompts[r->jobs[j].prompt_idx].n_ids;
    }
    REQ_INFO(r->id, "done %s completion_tokens=%lld ttft_ms=%.1f e2e_ms=%.1f%s",
             r->err.status ? "error" : "ok", (long long)completion,
             r->t_first_ns ? (double)(r->t_first_ns - r->t_arrival_ns) / 1e6 : -1.0,
             (double)(now - r->t_arrival_ns) / 1e6, r->client_gone ? " (client gone)" : "");
    if (r->client_gone || r->mhd_done) {
        return;
    }
    if (r->p.stream && !(r->err.status && r->out.len == 0 && r->state == SRV_REQ_WAITING)) {
        if (!r->stream_error) {
            if (r->err.status) {
                stream_error_event(r);
            } else {
                size_t out_len = r->out.len;
                unsigned long mark = json_mark();
                if (r->p.include_usage) {
                    cJSON *chunk = base_object(r, 1);
                    cJSON_AddArrayToObject(chunk, "choices");
                    json_add(chunk, "usage", usage_object(r));
                    char *json = json_print(chunk, mark);
                    if (json != NULL) {
                        srv_sse_data(&r->out, json);
                        free(json);
                    }
                }
                srv_sse_done(&r->out);
                if (xmalloc_try_failures() != mark) {
                    r->out.len = out_len;
                    r->out.oom = 0;
                    if (r->out.data != NULL) {
                        r->out.data[out_len] = '\0';
                    }
                    srv_err_oom(&r->err);
                    REQ_WARN(r->id, "out of memory ending the stream");
                    stream_error_event(r);
                } else {
                    r->out_eos = 1;
                }
            }
        }
    } else if (r->err.status) {
        r->ready = 1;
        r->resp_status = r->err.status;
        r->resp_body = srv_err_json(&r->err); /* NULL: the static 503 */
        r->retry_after = r->err.status == 429 || r->err.status == 503 ? 1 : 0;
    } else {
        r->ready = 1;
        r->resp_status = 200;
        r->resp_body = build_body(r); /* NULL: the static 503 */
    }
    kick(r);
}

static void
job_done(srv_req_t *r, srv_job_t *job)
{
    job->open = 0;
    job_unlink(r->s, job);
    if (--r->jobs_open == 0) {
        request_done(r);
    }
}

/* ---- generation: outbox messages --------------------------------------------- */

/* A token of stop_token_ids ends its choice and, as in vLLM, is not part of
 * the text (EOS is special and skipped by the detokenizer anyway). */
static int
is_stop_id(const srv_params_t *p, int32_t token)
{
    for (int32_t i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] == token) {
            return 1;
        }
    }
    return 0;
}

static void
on_delta(srv_req_t *r, srv_job_t *job, const eng_msg_delta_t *d)
{
    srv_t *s = r->s;
    int32_t ci = job->prompt_idx * r->p.n + d->choice;
    srv_choice_t *ch;
    srv_tenant_metrics_t *tm = &s->metrics.tenant[r->tenant];
    uint64_t now = now_ns();
    srv_buf_t piece = {0};
    cJSON *lp = NULL;
    char tb[256];
    unsigned long mark = json_mark();

    if (d->choice < 0 || d->choice >= r->p.n || d->n_tokens <= 0) {
        return;
    }
    ch = &r->choices[ci];
    if (ch->finish != NULL || r->err.status) {
        return;
    }
    if (r->t_first_ns == 0) {
        r->t_first_ns = now;
        srv_hist_observe(&tm->ttft, (double)(now - r->t_arrival_ns) / 1e9);
    } else if (ch->t_last_ns != 0) {
        double gap = (double)(now - ch->t_last_ns) / 1e9 / d->n_tokens;
        for (int32_t i = 0; i < d->n_tokens; i++) {
            srv_hist_observe(&tm->itl, gap);
        }
    }
    ch->t_last_ns = now;
    if (r->p.logprobs) {
        lp = r->p.stream ? lp_new(r) : (ch->lp ? ch->lp : (ch->lp = lp_new(r)));
    }
    for (int32_t i = 0; i < d->n_tokens && i < ENG_DELTA_MAX; i++) {
        const smp_result_t *t = &d->tok[i];
        int n =
            is_stop_id(&r->p, t->token) ? 0 : tok_stream_push(&ch->ds, t->token, tb, sizeof(tb));
        ch->n_tokens++;
        tm->generation_tokens++;
        if (lp != NULL) {
            lp_add(r, ch, lp, t);
        }
        if (srv_stop_feed(&ch->stop, tb, n > 0 ? (size_t)n : 0, &piece)) {
            ch->finish = "stop";
            send_cancel(s, job->id, 1, d->choice);
            break;
        }
    }
    if (xmalloc_try_failures() != mark) {
        /* Text or logprobs of this token were lost: the request fails. */
        if (r->p.stream) {
            cJSON_Delete(lp);
        }
        srv_buf_free(&piece);
        req_fail_oom(r);
        return;
    }
    choice_emit(r, ci, ch, &piece, r->p.stream ? lp : NULL, ch->finish);
    srv_buf_free(&piece);
    if (xmalloc_try_failures() != mark) {
        req_fail_oom(r); /* ch->text could not hold the piece */
    }
}

static void
on_finished(srv_req_t *r, srv_job_t *job, const eng_msg_finished_t *f)
{
    srv_tenant_metrics_t *tm = &r->s->metrics.tenant[r->tenant];
    int32_t ci = job->prompt_idx * r->p.n + f->choice;
    srv_choice_t *ch;
    char tb[64];

    if (f->choice < 0 || f->choice >= r->p.n) {
        return;
    }
    ch = &r->choices[ci];
    if (ch->engine_done) {
        return;
    }
    ch->engine_done = 1;
    job->prompt_tokens = f->prompt_tokens;
    job->cached_tokens = f->cached_tokens;
    switch (f->reason) {
    case ENG_FINISH_LENGTH:
        tm->finished_length++;
        break;
    case ENG_FINISH_ABORT:
        tm->finished_abort++;
        break;
    default:
        tm->finished_stop++;
        break;
    }
    if (ch->finish == NULL && !r->err.status) {
        srv_buf_t piece = {0};
        unsigned long mark = json_mark();
        int n = tok_stream_flush(&ch->ds, tb, sizeof(tb));
        if (srv_stop_feed(&ch->stop, tb, n > 0 ? (size_t)n : 0, &piece)) {
            ch->finish = "stop";
        } else {
            srv_stop_finish(&ch->stop, &piece);
            ch->finish = f->reason == ENG_FINISH_LENGTH ? "length" : "stop";
        }
        if (xmalloc_try_failures() == mark) {
            choice_emit(r, ci, ch, &piece, NULL, ch->finish);
        }
        srv_buf_free(&piece);
        if (xmalloc_try_failures() != mark) {
            req_fail_oom(r);
        }
    }
    if (--job->n_open == 0) {
        job_done(r, job);
    }
}

static void
on_error(srv_req_t *r, srv_job_t *job, const eng_msg_error_t *e)
{
    srv_tenant_metrics_t *tm = &r->s->metrics.tenant[r->tenant];

    tm->finished_error++;
    if (!r->err.status) {
        /* The engine marks itself dead before it fails the open requests,
         * so a dead engine here means the error is its own, whatever the
         * status (a forward can fail with ST_EINVAL). */
        int failed = r->s->engine != NULL && !engine_alive(r->s->engine);
        int status = srv_http_status_of(e->status, failed);
        srv_err_set(&r->err, status, NULL, "%s", e->message[0] ? e->message : st_str(e->status));
        if (status == 429) {
            r->s->metrics.tenant[r->tenant].rejected++;
        }
        job->open = 0; /* do not cancel the job that failed */
        cancel_jobs(r);
        job->open = 1;
    }
    job_done(r, job);
}

void
srv_http_on_msg(srv_t *s, msg_t *m)
{
    srv_job_t *job;

    switch (m->type) {
    case ENG_MSG_DELTA: {
        const eng_msg_delta_t *d = (const eng_msg_delta_t *)m;
        if ((job = job_find(s, d->id)) != NULL) {
            on_delta(job->req, job, d);
        }
        break;
    }
    case ENG_MSG_FINISHED: {
        const eng_msg_finished_t *f = (const eng_msg_finished_t *)m;
        if ((job = job_find(s, f->id)) != NULL) {
            srv_req_t *r = job->req;
            on_finished(r, job, f);
            srv_req_maybe_free(r);
        }
        break;
    }
    case ENG_MSG_ERROR: {
        const eng_msg_error_t *e = (const eng_msg_error_t *)m;
        if ((job = job_find(s, e->id)) != NULL) {
            srv_req_t *r = job->req;
            on_error(r, job, e);
            srv_req_maybe_free(r);
        }
        break;
    }
    case ENG_MSG_STATS_REPLY: {
        const eng_msg_stats_t *st = (const eng_msg_stats_t *)m;
        list_node_t *it;
        s->last_stats = st->stats;
        s->have_stats = 1;
        if (st->cookie == 0) {
            break;
        }
        LIST_FOREACH(it, &s->reqs)
        {
            srv_req_t *r = LIST_ENTRY(it, srv_req_t, node);
            if (r->id == st->cookie && r->stats_wait) {
                srv_buf_t b = {0};
                r->stats_wait = 0;
                srv_metrics_format(&s->metrics, &st->stats, s->model_name, &b);
                srv_buf_add(&b, "", 0);
                if (b.oom) {
                    srv_buf_free(&b); /* NULL body: the static 503 */
                }
                r->ready = 1;
                r->resp_status = 200;
                r->resp_body = b.data;
                r->resp_type = "text/plain; version=0.0.4; charset=utf-8";
                kick(r);
                break;
            }
        }
        break;
    }
    default:
        break;
    }
}

/* ---- generation: start ------------------------------------------------------- */

static int
tokenize_prompts(srv_req_t *r, srv_error_t *err)
{
    for (int32_t i = 0; i < r->p.n_prompts; i++) {
        srv_prompt_t *pr = &r->p.prompts[i];
        size_t n = 0;
        int flags = r->ep == SRV_EP_CHAT ? TOK_PARSE_SPECIAL : TOK_PARSE_SPECIAL | TOK_ADD_SPECIAL;
        if (pr->ids != NULL) {
            continue;
        }
        int rc = tok_encode(r->s->tok, pr->text, pr->text_len, flags, &pr->ids, &n);
        if (rc == ST_ENOMEM) {
            srv_err_oom(err);
            return 0;
        }
        if (rc != ST_OK) {
            srv_err_set(err, 400, "prompt", "the prompt could not be tokenized");
            return 0;
        }
        if (n == 0) {
            srv_err_set(err, 400, "prompt", "the prompt is empty");
            return 0;
        }
        pr->n_ids = (int32_t)n;
    }
    return 1;
}

/* Builds the SUBMIT message of one job, or NULL when out of memory (nothing
 * is left allocated then). */
static eng_msg_submit_t *
make_submit(srv_req_t *r, srv_job_t *job)
{
    const srv_params_t *p = &r->p;
    const srv_prompt_t *pr = &p->prompts[job->prompt_idx];
    eng_msg_submit_t *m = xcalloc_try(1, sizeof(*m));
    eng_request_t *q;

    if (m == NULL) {
        return NULL;
    }
    q = &m->req;
    m->hdr.type = ENG_MSG_SUBMIT;
    q->id = job->id;
    q->tenant = (uint32_t)r->tenant;
    q->priority = p->priority;
    q->kv_sink = p->kv_sink;
    q->kv_window = p->kv_window;
    q->prompt = xmalloc_try(sizeof(int32_t) * (size_t)pr->n_ids);
    if (q->prompt == NULL) {
        free(m);
        return NULL;
    }
    memcpy(q->prompt, pr->ids, sizeof(int32_t) * (size_t)pr->n_ids);
    q->n_prompt = pr->n_ids;
    q->sampling = p->sampling;
    if (p->sampling.n_bias > 0) {
        smp_bias_t *b = xmalloc_try(sizeof(smp_bias_t) * (size_t)p->sampling.n_bias);
        if (b == NULL) {
            free(q->prompt);
            free(m);
            return NULL;
        }
        memcpy(b, p->bias, sizeof(smp_bias_t) * (size_t)p->sampling.n_bias);
        q->sampling.bias = b;
    } else {
        q->sampling.bias = NULL;
        q->sampling.n_bias = 0;
    }
    q->seed = p->seed;
    q->has_seed = p->has_seed;
    q->n = p->n;
    q->max_tokens = p->max_tokens;
    q->min_tokens = p->min_tokens;
    q->ignore_eos = p->ignore_eos;
    memcpy(q->stop_ids, p->stop_ids, sizeof(q->stop_ids));
    q->n_stop_ids = p->n_stop_ids;
    q->t_arrival_ns = r->t_arrival_ns;
    return m;
}

static enum MHD_Result
start_generation(srv_req_t *r)
{
    srv_t *s = r->s;
    srv_error_t err;
    int kind = r->ep == SRV_EP_CHAT ? SRV_KIND_CHAT : SRV_KIND_COMPLETION;
    int64_t prompt_total = 0;

    if (!srv_params_parse(kind, r->body.data ? r->body.data : "", r->body.len, &s->lim, &r->p,
                          &err)) {
        return queue_error(r, &err);
    }
    r->have_params = 1;
    if (kind == SRV_KIND_CHAT) {
        char *text =
            render_chat(s, r->p.messages, r->p.n_messages, r->p.add_generation_prompt, &err);
        if (text == NULL) {
            return queue_error(r, &err);
        }
        r->p.prompts = xcalloc_try(1, sizeof(srv_prompt_t));
        if (r->p.prompts == NULL) {
            free(text);
            srv_err_oom(&err);
            return queue_error(r, &err);
        }
        r->p.n_prompts = 1;
        r->p.prompts[0].text = text;
        r->p.prompts[0].text_len = strlen(text);
    }
    if (!tokenize_prompts(r, &err) ||
        !srv_params_check_context(&r->p, &s->lim, s->block_size, s->kv_blocks, &err)) {
        return queue_error(r, &err);
    }
    if (s->engine == NULL || !engine_alive(s->engine)) {
        return queue_error_msg(r, 503, NULL, "the engine is not running");
    }
    if ((int64_t)s->n_gen >= (int64_t)s->cfg->max_num_seqs + s->cfg->max_waiting_requests) {
        srv_error_t e429;
        srv_err_set(&e429, 429, NULL, "the server has %u requests in flight; retry later",
                    s->n_gen);
        s->metrics.tenant[r->tenant].rejected++;
        return queue_error(r, &e429);
    }
    /* Everything the generation needs is allocated, fallibly, before any
     * job is registered or sent: out of memory is a 503 for this request
     * and nothing else (KVSERVE_FAIL_ALLOC_AFTER injects it in tests). */
    int32_t n_jobs = r->p.n_prompts;
    eng_msg_submit_t **msgs = xcalloc_try((size_t)n_jobs, sizeof(*msgs));
    r->jobs = msgs ? xcalloc_try((size_t)n_jobs, sizeof(srv_job_t)) : NULL;
    r->choices = r->jobs ? xcalloc_try((size_t)(n_jobs * r->p.n), sizeof(srv_choice_t)) : NULL;
    r->hup_mem = r->choices ? xmalloc_try(sizeof(*r->hup_mem)) : NULL;
    if (r->hup_mem == NULL || (r->p.stream && !srv_buf_reserve(&r->out, SRV_STREAM_RESERVE))) {
        free(r->choices);
        r->choices = NULL;
    }
    for (int32_t j = 0; r->choices != NULL && j < n_jobs; j++) {
        r->jobs[j].id = j == 0 ? r->id : s->next_id++;
        r->jobs[j].prompt_idx = j;
        msgs[j] = make_submit(r, &r->jobs[j]);
        if (msgs[j] == NULL) {
            for (int32_t k = 0; k < j; k++) {
                eng_msg_free(&msgs[k]->hdr);
            }
            free(r->choices);
            r->choices = NULL;
        }
    }
    if (r->choices == NULL) {
        free(r->jobs);
        r->jobs = NULL;
        free(msgs);
        srv_buf_free(&r->out);
        free(r->hup_mem);
        r->hup_mem = NULL;
        srv_err_oom(&err);
        return queue_error(r, &err);
    }
    r->n_jobs = n_jobs;
    r->n_choices = r->p.n_prompts * r->p.n;
    for (int32_t c = 0; c < r->n_choices; c++) {
        tok_stream_init(&r->choices[c].ds, s->tok, r->p.skip_special_tokens);
        /* The output continues the prompt: keep its leading space. */
        r->choices[c].ds.at_start = 0;
        srv_stop_init(&r->choices[c].stop, (const char *const *)r->p.stop, r->p.n_stop);
    }
    for (int32_t j = 0; j < r->n_jobs; j++) {
        srv_job_t *job = &r->jobs[j];
        job->req = r;
        job->n_open = r->p.n;
        job->open = 1;
        job->hnext = *job_slot(s, job->id);
        *job_slot(s, job->id) = job;
        prompt_total += r->p.prompts[j].n_ids;
    }
    r->jobs_open = r->n_jobs;
    s->n_gen++;
    s->metrics.in_flight = s->n_gen;
    REQ_INFO(r->id, "%s tenant=%s prompts=%d prompt_tokens=%lld max_tokens=%d n=%d stream=%d",
             kind == SRV_KIND_CHAT ? "chat" : "completion", s->cfg->tenants[r->tenant].name,
             r->n_jobs, (long long)prompt_total, r->p.max_tokens, r->p.n, r->p.stream);
    for (int32_t j = 0; j < r->n_jobs; j++) {
        chan_send(engine_inbox(s->engine), &msgs[j]->hdr);
    }
    free(msgs);
    r->state = SRV_REQ_WAITING;
    srv_loop_suspend(r);
    return MHD_YES;
}

/* ---- SSE content reader ------------------------------------------------------ */

static ssize_t
sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_req_t *r = cls;
    size_t n;

    (void)pos;
    if (r->client_gone) {
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r->out.len > 0) {
        n = r->out.len < max ? r->out.len : max;
        memcpy(buf, r->out.data, n);
        srv_buf_consume(&r->out, n);
        return (ssize_t)n;
    }
    if (r->out_eos) {
        const char *t = r->tail_static != NULL ? r->tail_static : r->tail.data;
        size_t tl = r->tail_static != NULL ? strlen(r->tail_static) : r->tail.len;
        if (t != NULL && r->tail_off < tl) {
            n = tl - r->tail_off < max ? tl - r->tail_off : max;
            memcpy(buf, t + r->tail_off, n);
            r->tail_off += n;
            return (ssize_t)n;
        }
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    srv_loop_suspend(r);
    return 0;
}

static enum MHD_Result
queue_stream(srv_req_t *r)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, r, NULL);
    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    add_request_id(r, resp);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    if (r->s->draining) {
        MHD_add_response_header(resp, "Connection", "close");
    }
    ret = MHD_queue_response(r->mc, 200, resp);
    MHD_destroy_response(resp);
    r->state = SRV_REQ_STREAMING;
    count_status(r, 200);
    return ret;
}

/* ---- the access handler ------------------------------------------------------ */

/* Stands for the record of a request that could not get one. */
static srv_req_t oom_req;

/* Out of memory for the request record itself: the static 503, counted
 * under the route the URL names. */
static enum MHD_Result
queue_oom_norecord(srv_t *s, struct MHD_Connection *mc, const char *url)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;
    int ep;

    (void)srv_route_find(url, NULL, &ep);
    LOG_WARN("503 out of memory for a request record (%.100s)", url);
    resp = MHD_create_response_from_buffer(strlen(srv_oom_json), (void *)srv_oom_json,
                                           MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", CT_JSON);
    MHD_add_response_header(resp, "Retry-After", "1");
    ret = MHD_queue_response(mc, 503, resp);
    MHD_destroy_response(resp);
    s->metrics.http_requests[ep][5]++;
    return ret;
}

/* Test hooks, answered only when KVSERVE_TEST_HOOKS=1 (s->test_hooks):
 *   GET  /debug/allocs            {"count":C,"pending":P,"engine_count":EC,
 *        "engine_pending":EP}: fallible allocations made so far by the
 *        loop side (the default domain of common/xmalloc.h) and by the
 *        engine thread, calls left before an armed failure fires (0: none);
 *   POST /debug/fail-alloc?after=N[&domain=engine]  arms the failure of the
 *        N-th following fallible allocation of the default domain, or of
 *        the engine thread (0 disarms); answers {"armed":N}.
 * After reading or arming they allocate nothing through xmalloc_try (the
 * body is copied by MHD), so the count moves only with other requests. */
static enum MHD_Result
do_debug(srv_req_t *r, const char *url, const char *method)
{
    char body[192];
    struct MHD_Response *resp;
    enum MHD_Result ret;
    int status = 200;

    if (strcmp(url, "/debug/allocs") == 0 && strcmp(method, "GET") == 0) {
        snprintf(body, sizeof(body),
                 "{\"count\":%lu,\"pending\":%ld,\"engine_count\":%lu,\"engine_pending\":%ld}",
                 xmalloc_try_count(), xmalloc_fail_pending(),
                 xmalloc_try_count_in(XMALLOC_DOMAIN_ENGINE),
                 xmalloc_fail_pending_in(XMALLOC_DOMAIN_ENGINE));
    } else if (strcmp(url, "/debug/fail-alloc") == 0 && strcmp(method, "POST") == 0) {
        const char *a = MHD_lookup_connection_value(r->mc, MHD_GET_ARGUMENT_KIND, "after");
        const char *d = MHD_lookup_connection_value(r->mc, MHD_GET_ARGUMENT_KIND, "domain");
        char *end = NULL;
        long n = a != NULL ? strtol(a, &end, 10) : -1;
        if (a == NULL || *end != '\0' || n < 0 ||
            (d != NULL && strcmp(d, "engine") != 0 && strcmp(d, "loop") != 0)) {
            status = 400;
            snprintf(body, sizeof(body),
                     "{\"error\":\"after=N (N >= 0) is required; domain=loop|engine\"}");
        } else {
            xmalloc_fail_after_in(d != NULL && strcmp(d, "engine") == 0 ? XMALLOC_DOMAIN_ENGINE
                                                                         : XMALLOC_DOMAIN_DEFAULT,
                                  n);
            snprintf(body, sizeof(body), "{\"armed\":%ld}", n);
        }
    } else {
        status = 404;
        snprintf(body, sizeof(body), "{\"error\":\"no such debug route\"}");
    }
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", CT_JSON);
    ret = MHD_queue_response(r->mc, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    r->state = SRV_REQ_RESPONDED;
    return ret;
}

static enum MHD_Result
dispatch(srv_req_t *r)
{
    switch (r->ep) {
    case SRV_EP_COMPLETIONS:
    case SRV_EP_CHAT:
        return start_generation(r);
    case SRV_EP_MODELS:
        return do_models(r);
    case SRV_EP_HEALTH:
        return do_health(r);
    case SRV_EP_METRICS:
        return do_metrics(r);
    case SRV_EP_TOKENIZE:
        return do_tokenize(r);
    case SRV_EP_DETOKENIZE:
        return do_detokenize(r);
    case SRV_EP_VERSION:
        return do_version(r);
    default:
        return queue_error_msg(r, 404, NULL, "not found");
    }
}

enum MHD_Result
srv_http_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                const char *version, const char *upload, size_t *upload_size, void **req_cls)
{
    srv_t *s = cls;
    srv_req_t *r = *req_cls;

    (void)version;
    if (r == &oom_req) {
        *upload_size = 0; /* the 503 is queued; the body is not wanted */
        return MHD_YES;
    }
    if (r == NULL) {
        r = req_new(s, mc);
        if (r == NULL) {
            *req_cls = &oom_req;
            return queue_oom_norecord(s, mc, url);
        }
        *req_cls = r;
        return first_call(r, url, method);
    }
    if (r->client_gone) {
        return MHD_NO;
    }
    switch (r->state) {
    case SRV_REQ_READING:
        if (*upload_size > 0) {
            if (r->body.len + *upload_size > (size_t)s->cfg->max_body_bytes) {
                r->body_too_big = 1;
            } else if (!r->body.oom) {
                /* One allocation for a body of known length, however it
                 * arrives in pieces. */
                if (r->body.cap == 0 && r->content_length > *upload_size) {
                    srv_buf_reserve(&r->body, r->content_length);
                }
                srv_buf_add(&r->body, upload, *upload_size);
            }
            *upload_size = 0;
            return MHD_YES;
        }
        if (r->body_too_big) {
            srv_error_t err;
            srv_err_set(&err, 413, NULL, "request body exceeds the limit of %lld bytes",
                        (long long)s->cfg->max_body_bytes);
            return queue_error(r, &err);
        }
        if (r->body.oom) {
            return queue_body(r, 503, NULL, CT_JSON, 1);
        }
        return dispatch(r);
    case SRV_REQ_WAITING:
        if (r->ready) {
            char *body = r->resp_body;
            r->resp_body = NULL;
            if (r->resp_type != NULL) {
                return queue_body(r, r->resp_status, body, r->resp_type, 0);
            }
            return queue_body(r, r->resp_status, body, CT_JSON, r->retry_after);
        }
        if (r->p.stream && (r->out.len > 0 || r->out_eos)) {
            return queue_stream(r);
        }
        /* Woken with nothing to send yet. */
        srv_loop_suspend(r);
        return MHD_YES;
    default:
        return MHD_YES;
    }
}

void
srv_http_completed(void *cls, struct MHD_Connection *mc, void **req_cls,
                   enum MHD_RequestTerminationCode toe)
{
    srv_req_t *r = *req_cls;

    (void)cls;
    (void)mc;
    if (r == NULL || r == &oom_req) {
        *req_cls = NULL;
        return;
    }
    *req_cls = NULL;
    srv_loop_unwatch(r);
    r->suspended = 0;
    r->mhd_done = 1;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->jobs_open > 0 && !r->client_gone) {
        r->client_gone = 1;
        r->s->metrics.disconnects++;
        REQ_INFO(r->id, "connection closed early, cancelling");
        cancel_jobs(r);
    }
    if (r->conn != NULL) {
        r->conn->req = NULL;
        r->conn->phase_start_ns = now_ns();
        r->conn = NULL;
    }
    r->mc = NULL;
    srv_req_maybe_free(r);
}

void
srv_http_client_gone(srv_req_t *r)
{
    cancel_jobs(r);
}

void
srv_http_abort_all(srv_t *s, const char *why)
{
    list_node_t *it;

    LIST_FOREACH(it, &s->reqs)
    {
        srv_req_t *r = LIST_ENTRY(it, srv_req_t, node);
        if (r->jobs_open > 0 && !r->err.status) {
            srv_err_set(&r->err, 503, NULL, "%s", why);
            cancel_jobs(r);
        }
    }
}

void
srv_http_sweep(srv_t *s, uint64_t now)
{
    list_node_t *it;
    uint64_t read_limit = (uint64_t)(s->cfg->idle_timeout_s * 1e9);
    uint64_t total_limit = (uint64_t)(s->cfg->request_timeout_s * 1e9);

    LIST_FOREACH(it, &s->conns)
    {
        srv_conn_t *c = LIST_ENTRY(it, srv_conn_t, node);
        int reading = c->req == NULL || c->req->state == SRV_REQ_READING;
        if (reading && c->fd >= 0 && now - c->phase_start_ns > read_limit) {
            LOG_INFO("closing a connection that took %.0f s to send its request",
                     (double)(now - c->phase_start_ns) / 1e9);
            shutdown(c->fd, SHUT_RDWR);
            c->phase_start_ns = now; /* once */
        }
    }
    if (total_limit == 0) {
        return;
    }
    LIST_FOREACH(it, &s->reqs)
    {
        srv_req_t *r = LIST_ENTRY(it, srv_req_t, node);
        if (r->jobs_open > 0 && !r->err.status && now - r->t_arrival_ns > total_limit) {
            srv_err_set(&r->err, 503, NULL, "the request took longer than %.0f s",
                        s->cfg->request_timeout_s);
            r->err.code = "timeout";
            REQ_WARN(r->id, "%s: cancelling", r->err.message);
            cancel_jobs(r);
        }
    }
}
