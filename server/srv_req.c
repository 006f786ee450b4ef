/* srv_req.c - one HTTP request: its record (private to this file), MHD's
 * access handler and completion callback, and the ways to answer it.
 *
 * DESIGN
 *   The access handler is called once when the headers are in (admission:
 *   header checks, routing, auth, body size; srv_http.c), once per body
 *   chunk (accumulated up to the body limit), and once more when the whole
 *   request is in: then its endpoint runs (srv_endpoints.c) and answers at
 *   once, or (generation, /metrics) makes it wait for the engine with its
 *   connection suspended. When there is something to send the connection
 *   is resumed and the handler queues the response: a whole body, or for a
 *   stream an SSE response whose content reader hands out what the
 *   generation buffered and suspends the connection when it has nothing.
 *
 *   Request states:
 *     READING    headers / body arriving
 *     WAITING    suspended until the engine answers
 *     STREAMING  SSE response queued
 *     RESPONDED  a complete response was queued
 *
 *   The record is freed when MHD has completed the request AND its
 *   generation, if any, has heard the engine's last word for every job.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_cors.h"
#include "server/srv_embed.h"
#include "server/srv_endpoints.h"
#include "server/srv_gen.h"
#include "server/srv_ready.h"
#include "server/srv_http.h"
#include "server/srv_req.h"
#include "server/srv_work.h"

enum srv_req_state {
    SRV_REQ_READING = 0,
    SRV_REQ_WAITING,
    SRV_REQ_STREAMING,
    SRV_REQ_RESPONDED,
};

struct srv_req {
    srv_t *s;
    srv_hold_t hold; /* the connection: suspension and hang-up watch */
    uint64_t id;
    int ep;
    const char *url; /* MHD's, valid until the request completes */
    int tenant;
    int state; /* enum srv_req_state */
    srv_buf_t body;
    size_t content_length; /* from the header; 0 when absent */
    int body_too_big;
    int client_gone;
    int mhd_done;

    /* The later answer of a waiting request (srv_req_answer). */
    int ready;
    int resp_status;
    char *resp_body;
    const char *resp_type;
    int retry_after; /* seconds, 0: none */

    srv_gen_t *gen; /* generation endpoints: what answers the request */
    int32_t busy;   /* other engine work still owing it messages (srv_req_busy) */
    srv_work_t *work; /* its preparation in flight on the thread pool, or NULL */
    uint64_t t_arrival_ns;
    time_t created;
    list_node_t node; /* s->reqs */
};

/* ---- records ----------------------------------------------------------------- */

static void
on_hangup(void *arg)
{
    srv_req_t *r = arg;

    if (r->client_gone) {
        return;
    }
    r->client_gone = 1;
    r->s->metrics.disconnects++;
    REQ_INFO(r->id, "client disconnected, cancelling");
    if (r->work != NULL) {
        srv_work_cancel(r->work);
    }
    if (r->gen != NULL) {
        srv_gen_cancel(r->gen);
    }
}

/* The request record, or NULL when out of memory. */
static srv_req_t *
req_new(srv_t *s, struct MHD_Connection *mc)
{
    srv_req_t *r = xcalloc_try(1, sizeof(*r));
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conn_t *conn = ci ? ci->socket_context : NULL;

    if (r == NULL) {
        return NULL;
    }
    r->s = s;
    srv_hold_init(&r->hold, s, mc, on_hangup, r);
    r->id = s->next_id++;
    r->t_arrival_ns = now_ns();
    r->created = time(NULL);
    if (conn != NULL) {
        conn->req = r;
    }
    list_push_back(&s->reqs, &r->node);
    s->n_reqs++;
    return r;
}

void
srv_req_maybe_free(srv_req_t *r)
{
    srv_t *s = r->s;

    if (!r->mhd_done || r->busy > 0 || (r->gen != NULL && srv_gen_open(r->gen))) {
        return;
    }
    srv_gen_free(r->gen);
    srv_buf_free(&r->body);
    srv_hold_fini(&r->hold);
    free(r->resp_body);
    list_remove(&r->node);
    s->n_reqs--;
    free(r);
    srv_loop_check_drained(s);
}

srv_t *
srv_req_server(const srv_req_t *r)
{
    return r->s;
}

uint64_t
srv_req_id(const srv_req_t *r)
{
    return r->id;
}

int
srv_req_tenant(const srv_req_t *r)
{
    return r->tenant;
}

uint64_t
srv_req_arrival_ns(const srv_req_t *r)
{
    return r->t_arrival_ns;
}

time_t
srv_req_created(const srv_req_t *r)
{
    return r->created;
}

const char *
srv_req_url(const srv_req_t *r)
{
    return r->url != NULL ? r->url : "";
}

const char *
srv_req_body(const srv_req_t *r, size_t *len)
{
    *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

const char *
srv_req_arg(const srv_req_t *r, const char *key)
{
    return r->hold.mc != NULL ? MHD_lookup_connection_value(r->hold.mc, MHD_GET_ARGUMENT_KIND, key)
                              : NULL;
}

const char *
srv_req_header(const srv_req_t *r, const char *key)
{
    return r->hold.mc != NULL ? MHD_lookup_connection_value(r->hold.mc, MHD_HEADER_KIND, key)
                              : NULL;
}

int
srv_req_live(const srv_req_t *r)
{
    return !r->client_gone && !r->mhd_done;
}

int
srv_req_gone(const srv_req_t *r)
{
    return r->client_gone;
}

int
srv_req_waiting(const srv_req_t *r)
{
    return r->state == SRV_REQ_WAITING && !r->ready;
}

srv_req_t *
srv_req_find(srv_t *s, uint64_t id)
{
    list_node_t *it;

    LIST_FOREACH(it, &s->reqs)
    {
        srv_req_t *r = LIST_ENTRY(it, srv_req_t, node);
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

/* ---- answering now ----------------------------------------------------------- */

enum MHD_Result
srv_req_reply(srv_req_t *r, int status, char *body, const char *ctype, int retry_after)
{
    enum MHD_Result ret;

    if (srv_http_queue(r->s, r->hold.mc, r->id, r->ep, status, body,
                       ctype != NULL ? ctype : SRV_CT_JSON, retry_after, &ret)) {
        r->state = SRV_REQ_RESPONDED;
    }
    return ret;
}

enum MHD_Result
srv_req_reply_static(srv_req_t *r, int status, const void *data, size_t len, const char *ctype,
                     const char *location)
{
    enum MHD_Result ret;

    if (srv_http_queue_static(r->s, r->hold.mc, r->id, r->ep, status, data, len, ctype, location,
                              &ret)) {
        r->state = SRV_REQ_RESPONDED;
    }
    return ret;
}

enum MHD_Result
srv_req_reply_json(srv_req_t *r, int status, cJSON *root, unsigned long mark)
{
    return srv_req_reply(r, status, srv_json_print(root, mark), SRV_CT_JSON, 0);
}

enum MHD_Result
srv_req_reply_error(srv_req_t *r, const srv_error_t *err)
{
    if (err->status >= 500 || err->status == 429) {
        REQ_WARN(r->id, "%d %s", err->status, err->message);
    } else {
        REQ_INFO(r->id, "%d %s", err->status, err->message);
    }
    return srv_req_reply(r, err->status, srv_err_json(err), SRV_CT_JSON,
                         err->status == 429 || err->status == 503 ? 1 : 0);
}

enum MHD_Result
srv_req_reply_errmsg(srv_req_t *r, int status, const char *param, const char *msg)
{
    srv_error_t err;

    srv_err_set(&err, status, param, "%s", msg);
    return srv_req_reply_error(r, &err);
}

/* ---- waiting ----------------------------------------------------------------- */

int
srv_req_reserve(srv_req_t *r)
{
    return srv_hold_reserve(&r->hold);
}

void
srv_req_unreserve(srv_req_t *r)
{
    srv_hold_fini(&r->hold);
}

void
srv_req_wait(srv_req_t *r)
{
    r->state = SRV_REQ_WAITING;
    srv_loop_suspend(&r->hold);
}

void
srv_req_wait_later(srv_req_t *r)
{
    r->state = SRV_REQ_WAITING;
    srv_loop_suspend_later(&r->hold);
}

void
srv_req_busy(srv_req_t *r, int delta)
{
    r->busy += delta;
    if (r->busy == 0) {
        srv_req_maybe_free(r);
    }
}

int
srv_req_half_close(srv_req_t *r, int allow)
{
    return srv_loop_hold_settle(&r->hold, allow) || r->client_gone;
}

void
srv_req_set_work(srv_req_t *r, srv_work_t *w)
{
    r->work = w;
}

void
srv_req_set_gen(srv_req_t *r, srv_gen_t *g)
{
    r->gen = g;
}

void
srv_req_answer(srv_req_t *r, int status, char *body, const char *ctype, int retry_after)
{
    r->ready = 1;
    r->resp_status = status;
    r->resp_body = body;
    r->resp_type = ctype;
    r->retry_after = retry_after;
    srv_req_kick(r);
}

void
srv_req_answer_error(srv_req_t *r, const srv_error_t *err)
{
    if (err->status >= 500 || err->status == 429) {
        REQ_WARN(r->id, "%d %s", err->status, err->message);
    } else {
        REQ_INFO(r->id, "%d %s", err->status, err->message);
    }
    /* A NULL body is the static 503. */
    srv_req_answer(r, err->status, srv_err_json(err), NULL,
                   err->status == 429 || err->status == 503 ? 1 : 0);
}

void
srv_req_kick(srv_req_t *r)
{
    if (r->mhd_done || r->client_gone) {
        return;
    }
    if (r->state == SRV_REQ_WAITING || r->state == SRV_REQ_STREAMING) {
        srv_loop_resume(&r->hold);
    }
}

/* ---- the SSE content reader -------------------------------------------------- */

static ssize_t
sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_req_t *r = cls;
    ssize_t n;

    (void)pos;
    if (r->client_gone) {
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    n = srv_gen_read(r->gen, buf, max);
    if (n > 0) {
        return n;
    }
    if (n < 0) {
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    srv_loop_suspend(&r->hold);
    return 0;
}

/* ---- the access handler ------------------------------------------------------ */

/* Stands for the record of a request that could not get one. */
static srv_req_t oom_req;

/* The headers are in. */
static enum MHD_Result
first_call(srv_req_t *r, const char *url, const char *method)
{
    srv_admit_t a;
    srv_error_t err;
    enum MHD_Result ret;

    r->ep = SRV_EP_OTHER;
    if (r->s->test_hooks && strncmp(url, "/debug/", 7) == 0) {
        if (srv_http_debug(r->hold.mc, url, method, &ret)) {
            r->state = SRV_REQ_RESPONDED;
        }
        return ret;
    }
    if (srv_cors_preflight(r->s, r->hold.mc, r->id, url, method, &r->ep, &ret)) {
        r->state = SRV_REQ_RESPONDED;
        return ret;
    }
    r->url = url;
    int ok = srv_http_admit(r->s, r->hold.mc, url, method, &a, &err);
    r->ep = a.ep;
    r->tenant = a.tenant;
    r->content_length = a.content_length;
    return ok ? MHD_YES : srv_req_reply_error(r, &err);
}

/* A body chunk, or (upload_size 0) the end of the request. */
static enum MHD_Result
on_reading(srv_req_t *r, const char *upload, size_t *upload_size)
{
    const srv_t *s = r->s;

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
        return srv_req_reply_error(r, &err);
    }
    if (r->body.oom) {
        return srv_req_reply(r, 503, NULL, SRV_CT_JSON, 1);
    }
    return srv_ep_dispatch(r, r->ep);
}

/* Woken while waiting: queue what is ready, or wait on. */
static enum MHD_Result
on_waiting(srv_req_t *r)
{
    enum MHD_Result ret;

    if (r->ready) {
        char *body = r->resp_body;
        r->resp_body = NULL;
        if (r->resp_type != NULL) {
            return srv_req_reply(r, r->resp_status, body, r->resp_type, 0);
        }
        return srv_req_reply(r, r->resp_status, body, SRV_CT_JSON, r->retry_after);
    }
    if (r->gen != NULL && srv_gen_stream_ready(r->gen)) {
        if (srv_http_queue_stream(r->s, r->hold.mc, r->id, r->ep, sse_reader, r, &ret)) {
            r->state = SRV_REQ_STREAMING;
        }
        return ret;
    }
    /* Woken with nothing to send yet. */
    srv_loop_suspend(&r->hold);
    return MHD_YES;
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
            return srv_http_queue_oom(s, mc, url);
        }
        *req_cls = r;
        return first_call(r, url, method);
    }
    if (r->client_gone) {
        return MHD_NO;
    }
    switch (r->state) {
    case SRV_REQ_READING:
        return on_reading(r, upload, upload_size);
    case SRV_REQ_WAITING:
        return on_waiting(r);
    default:
        return MHD_YES;
    }
}

void
srv_http_completed(void *cls, struct MHD_Connection *mc, void **req_cls,
                   enum MHD_RequestTerminationCode toe)
{
    srv_req_t *r = *req_cls;
    const union MHD_ConnectionInfo *ci;

    (void)cls;
    if (r == NULL || r == &oom_req) {
        *req_cls = NULL;
        return;
    }
    *req_cls = NULL;
    srv_loop_release(&r->hold);
    r->mhd_done = 1;
    if (r->work != NULL) {
        srv_work_cancel(r->work); /* the record waits for its done callback */
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->gen != NULL && srv_gen_open(r->gen) &&
        !r->client_gone) {
        r->client_gone = 1;
        r->s->metrics.disconnects++;
        REQ_INFO(r->id, "connection closed early, cancelling");
        srv_gen_cancel(r->gen);
    }
    /* The connection's next request starts arriving now. */
    ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conn_t *conn = ci ? ci->socket_context : NULL;
    if (conn != NULL && conn->req == r) {
        conn->req = NULL;
        conn->phase_start_ns = now_ns();
    }
    srv_req_maybe_free(r);
}

/* ---- the outbox, shutdown and time limits ------------------------------------ */

void
srv_http_on_msg(srv_t *s, msg_t *m)
{
    switch (m->type) {
    case ENG_MSG_DELTA:
    case ENG_MSG_FINISHED:
    case ENG_MSG_ERROR:
    case ENG_MSG_EMBED:
        if (srv_health_on_msg(s, m) || srv_ready_on_msg(s, m)) {
            break; /* a deep health check's or the warm-up's job */
        }
        if (!srv_embed_on_msg(s, m)) {
            srv_gen_on_msg(s, m);
        }
        break;
    case ENG_MSG_STATS_REPLY:
        srv_ep_stats_reply(s, (const eng_msg_stats_t *)m);
        break;
    case ENG_MSG_ADMIN_REPLY:
        srv_admin_on_reply(s, m);
        break;
    default:
        break;
    }
}

void
srv_http_abort_all(srv_t *s, const char *why)
{
    list_node_t *it;

    LIST_FOREACH(it, &s->reqs)
    {
        srv_req_t *r = LIST_ENTRY(it, srv_req_t, node);
        if (r->gen != NULL) {
            srv_gen_abort(r->gen, why);
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
        if (r->gen != NULL) {
            srv_gen_sweep(r->gen, now, total_limit);
        }
    }
}
