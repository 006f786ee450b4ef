/* loadtest.c - kvs-loadtest: a light load generator for OpenAI-compatible
 * servers (kvserve, vLLM, llama.cpp's llama-server), on libuv.
 *
 * DESIGN. One thread, one libuv loop, its own HTTP/1.1 client over uv_tcp
 * (lt_proto.c parses responses and SSE). Closed loop (--concurrency N): N
 * requests in flight, a new one as each finishes. Open loop (--rate R):
 * Poisson arrivals at R per second, optionally capped by --concurrency.
 * Connections are kept alive and pooled; a request whose pooled connection
 * turns out to be closed by the server before any byte came back is retried
 * once on a fresh connection. Per request it records time to first token
 * (first content chunk), inter-token latencies (gaps between content
 * chunks), time per output token ((e2e - ttft) / (tokens - 1)) and the
 * end-to-end latency; token counts come from "usage" when the server sends
 * it (stream_options.include_usage), else from the content chunks.
 * Timestamps are taken in the read callback, so the client's own overhead
 * stays out of the figures as far as one thread allows.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/xmalloc.h"
#include "loadtest/lt.h"

#define MAX_ERR_KINDS 32
#define READ_BUF 65536

/* ------------------------------------------------------------------ */
/* Options.                                                            */

typedef struct opts {
    char host[256];
    char port[16];
    char path[256];
    int chat;
    char model[256];
    char api_key[512];
    int concurrency;
    double rate;
    long max_requests;
    double duration_s;
    int stream;
    const char *prompts_file;
    lt_dist_t input_len, output_len;
    int32_t tok_lo, tok_hi;
    int ignore_eos;
    double temperature;
    uint64_t seed;
    double timeout_s;
    int json;
    int progress;   /* -1 auto (TTY), 0 off, 1 on */
    int quiet;
} opts_t;

/* ------------------------------------------------------------------ */
/* Prompts.                                                            */

typedef struct prompt {
    char *field;       /* "prompt": ... or "messages": ... JSON member text */
    int32_t max_tokens;  /* 0: draw from --output-len */
    int32_t input_len;   /* known prompt tokens, 0 unknown */
} prompt_t;

typedef struct prompts {
    prompt_t *v;
    size_t n;
    size_t next;
} prompts_t;

/* ------------------------------------------------------------------ */
/* Requests and connections.                                           */

typedef struct conn conn_t;

typedef struct req {
    uint64_t id;
    char *wire;
    size_t wire_len;
    uint64_t t_start, t_first, t_last;
    int32_t n_content;
    int32_t usage_prompt, usage_completion; /* -1 unknown */
    int32_t expect_prompt;
    int stream_error;
    char *body;
    size_t body_len, body_cap;
    int retries;
    conn_t *conn;
    struct req *prev, *next; /* in-flight list */
} req_t;

struct conn {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t write_req;
    lt_http_t http;
    lt_sse_t sse;
    req_t *req;
    int reused;        /* carried an earlier response */
    int got_bytes;     /* any byte of the current response arrived */
    int closing;
    conn_t *next_idle;
    char rbuf[READ_BUF];
};

typedef struct err_count {
    char kind[24];
    long n;
} err_count_t;

typedef struct lt {
    opts_t o;
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    prompts_t prompts;
    uint64_t rng;
    uv_timer_t tick, arrival;
    uv_signal_t sigint;
    int arrival_on;
    uint64_t t0, t_end, next_arrival;
    long issued, completed, ok, failed, retried;
    long pending_arrivals;   /* open loop: arrived but over the concurrency cap */
    int inflight, peak_inflight;
    int stopping, shut;
    req_t *inflight_head;
    conn_t *idle;
    int n_conns, conns_opened;
    err_count_t errs[MAX_ERR_KINDS];
    int n_errs;
    int64_t prompt_tokens, output_tokens;
    lt_vec_t ttft, tpot, itl, e2e;
    double last_progress;
    uint64_t next_id;
} lt_t;

static void start_request(lt_t *lt, req_t *r, int fresh);
static void issue(lt_t *lt);
static void maybe_shutdown(lt_t *lt);

static lt_t *g_lt; /* for callbacks that get only a handle without data */

static double
since_s(uint64_t t0)
{
    return (double)(uv_hrtime() - t0) / 1e9;
}

/* ------------------------------------------------------------------ */
/* Growing string.                                                     */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf_t;

static void
sb_add(sbuf_t *s, const char *fmt, ...)
{
    va_list ap;
    int need;

    va_start(ap, fmt);
    need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (s->n + (size_t)need + 1 > s->cap) {
        s->cap = (s->n + (size_t)need + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)need;
}

/* ------------------------------------------------------------------ */
/* Request bodies.                                                     */

static const char *const words[] = {
    "the", "of", "and", "to", "a", "in", "was", "her", "it", "that", "she", "not", "be",
    "as", "he", "had", "for", "with", "his", "you", "but", "have", "at", "is", "my", "could",
    "very", "which", "would", "all", "no", "so", "been", "by", "said", "they", "on", "this",
    "were", "sister", "mother", "house", "letter", "morning", "friend", "happy", "little",
};

/* Synthetic prompt of n tokens: token ids for completions (exact length),
 * n words for chat (about n tokens). */
static void
synthetic_field(lt_t *lt, int32_t n, sbuf_t *sb)
{
    if (!lt->o.chat) {
        sb_add(sb, "\"prompt\":[");
        for (int32_t i = 0; i < n; i++) {
            int32_t id = lt->o.tok_lo +
                         (int32_t)(lt_rand01(&lt->rng) * (lt->o.tok_hi - lt->o.tok_lo + 1));
            sb_add(sb, i > 0 ? ",%d" : "%d", id);
        }
        sb_add(sb, "]");
        return;
    }
    sb_add(sb, "\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int32_t i = 0; i < n; i++) {
        size_t w = (size_t)(lt_rand01(&lt->rng) * (sizeof(words) / sizeof(words[0])));
        sb_add(sb, i > 0 ? " %s" : "%s", words[w]);
    }
    sb_add(sb, "\"}]");
}

static req_t *
make_request(lt_t *lt)
{
    req_t *r = xcalloc(1, sizeof(*r));
    sbuf_t body = {0}, wire = {0};
    int32_t max_tokens;
    char *model_json;

    r->id = ++lt->next_id;
    r->usage_prompt = -1;
    r->usage_completion = -1;
    {
        cJSON *s = cJSON_CreateString(lt->o.model);
        model_json = cJSON_PrintUnformatted(s);
        cJSON_Delete(s);
    }
    sb_add(&body, "{\"model\":%s,", model_json);
    free(model_json);
    if (lt->prompts.n > 0) {
        prompt_t *p = &lt->prompts.v[lt->prompts.next++ % lt->prompts.n];
        sb_add(&body, "%s", p->field);
        max_tokens = p->max_tokens > 0 ? p->max_tokens : lt_dist_draw(&lt->o.output_len, &lt->rng);
        r->expect_prompt = p->input_len;
    } else {
        int32_t n = lt_dist_draw(&lt->o.input_len, &lt->rng);
        synthetic_field(lt, n, &body);
        max_tokens = lt_dist_draw(&lt->o.output_len, &lt->rng);
        r->expect_prompt = lt->o.chat ? 0 : n;
    }
    sb_add(&body, ",\"max_tokens\":%d,\"temperature\":%g", max_tokens, lt->o.temperature);
    if (lt->o.ignore_eos) {
        sb_add(&body, ",\"ignore_eos\":true");
    }
    if (lt->o.stream) {
        sb_add(&body, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    }
    sb_add(&body, "}");

    sb_add(&wire,
           "POST %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kvs-loadtest\r\n"
           "Content-Type: application/json\r\nAccept: %s\r\nContent-Length: %zu\r\n",
           lt->o.path, lt->o.host, lt->o.port,
           lt->o.stream ? "text/event-stream" : "application/json", body.n);
    if (lt->o.api_key[0] != '\0') {
        sb_add(&wire, "Authorization: Bearer %s\r\n", lt->o.api_key);
    }
    sb_add(&wire, "\r\n%s", body.p);
    free(body.p);
    r->wire = wire.p;
    r->wire_len = wire.n;
    return r;
}

static void
req_free(req_t *r)
{
    if (r != NULL) {
        free(r->wire);
        free(r->body);
        free(r);
    }
}

/* ------------------------------------------------------------------ */
/* Results.                                                            */

static void
count_error(lt_t *lt, const char *kind)
{
    for (int i = 0; i < lt->n_errs; i++) {
        if (strcmp(lt->errs[i].kind, kind) == 0) {
            lt->errs[i].n++;
            return;
        }
    }
    if (lt->n_errs < MAX_ERR_KINDS) {
        snprintf(lt->errs[lt->n_errs].kind, sizeof(lt->errs[0].kind), "%s", kind);
        lt->errs[lt->n_errs++].n = 1;
    }
}

static void
inflight_remove(lt_t *lt, req_t *r)
{
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        lt->inflight_head = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    r->prev = r->next = NULL;
    lt->inflight--;
}

/* Reads usage and counts from a complete non-streaming body. */
static void
parse_full_body(req_t *r)
{
    cJSON *root = r->body != NULL ? cJSON_ParseWithLength(r->body, r->body_len) : NULL;
    cJSON *usage;

    if (root == NULL) {
        r->stream_error = 1;
        return;
    }
    usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (cJSON_IsObject(usage)) {
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        if (cJSON_IsNumber(pt)) {
            r->usage_prompt = pt->valueint;
        }
        if (cJSON_IsNumber(ct)) {
            r->usage_completion = ct->valueint;
        }
    }
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "choices"))) {
        r->stream_error = 1;
    }
    cJSON_Delete(root);
}

/* Records a finished request (status 0: transport error named by kind). */
static void
finish_request(lt_t *lt, req_t *r, int status, const char *kind)
{
    uint64_t now = uv_hrtime();
    char key[24];

    inflight_remove(lt, r);
    lt->completed++;
    lt->t_end = now;
    if (status == 200 && !lt->o.stream) {
        parse_full_body(r);
    }
    if (status == 200 && !r->stream_error) {
        double e2e = (double)(now - r->t_start) / 1e6;
        int32_t out = r->usage_completion >= 0 ? r->usage_completion : r->n_content;
        int32_t in = r->usage_prompt >= 0 ? r->usage_prompt : r->expect_prompt;
        lt->ok++;
        lt->output_tokens += out;
        lt->prompt_tokens += in;
        lt_vec_push(&lt->e2e, e2e);
        if (lt->o.stream && r->t_first != 0) {
            double ttft = (double)(r->t_first - r->t_start) / 1e6;
            lt_vec_push(&lt->ttft, ttft);
            if (out > 1) {
                lt_vec_push(&lt->tpot, (e2e - ttft) / (out - 1));
            }
        } else if (!lt->o.stream && out > 0) {
            lt_vec_push(&lt->tpot, e2e / out);
        }
    } else {
        lt->failed++;
        if (status == 0) {
            count_error(lt, kind);
        } else if (status == 200) {
            count_error(lt, "stream_error");
        } else {
            snprintf(key, sizeof(key), "%d", status);
            count_error(lt, key);
        }
    }
    req_free(r);
    issue(lt);
    maybe_shutdown(lt);
}

/* ------------------------------------------------------------------ */
/* Response bodies.                                                    */

static void
on_event(void *arg, const char *data, size_t n)
{
    conn_t *c = arg;
    req_t *r = c->req;
    cJSON *root, *choices, *usage;

    if (r == NULL) {
        return;
    }
    if (n == 6 && memcmp(data, "[DONE]", 6) == 0) {
        return;
    }
    root = cJSON_ParseWithLength(data, n);
    if (root == NULL) {
        r->stream_error = 1;
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(root, "error") != NULL) {
        r->stream_error = 1;
    }
    choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    if (cJSON_IsArray(choices) && cJSON_GetArraySize(choices) > 0) {
        cJSON *ch = cJSON_GetArrayItem(choices, 0);
        cJSON *text = cJSON_GetObjectItemCaseSensitive(ch, "text");
        cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        if (text == NULL && cJSON_IsObject(delta)) {
            text = cJSON_GetObjectItemCaseSensitive(delta, "content");
        }
        if (cJSON_IsString(text) && text->valuestring[0] != '\0') {
            uint64_t now = uv_hrtime();
            if (r->t_first == 0) {
                r->t_first = now;
            } else {
                lt_vec_push(&g_lt->itl, (double)(now - r->t_last) / 1e6);
            }
            r->t_last = now;
            r->n_content++;
        }
    }
    usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (cJSON_IsObject(usage)) {
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        if (cJSON_IsNumber(pt)) {
            r->usage_prompt = pt->valueint;
        }
        if (cJSON_IsNumber(ct)) {
            r->usage_completion = ct->valueint;
        }
    }
    cJSON_Delete(root);
}

static void
on_body(void *arg, const char *data, size_t n)
{
    conn_t *c = arg;
    req_t *r = c->req;

    if (r == NULL) {
        return;
    }
    if (c->http.event_stream) {
        if (lt_sse_feed(&c->sse, data, n, on_event, c) != 0) {
            r->stream_error = 1;
        }
        return;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        r->body_cap = (r->body_len + n + 1) * 2;
        r->body = xrealloc(r->body, r->body_cap);
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
}

/* ------------------------------------------------------------------ */
/* Connections.                                                        */

static void
on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;

    lt_sse_free(&c->sse);
    free(c);
    g_lt->n_conns--;
}

static void
conn_close(lt_t *lt, conn_t *c)
{
    if (c->closing) {
        return;
    }
    c->closing = 1;
    /* Drop it from the idle pool if it is there. */
    for (conn_t **pp = &lt->idle; *pp != NULL; pp = &(*pp)->next_idle) {
        if (*pp == c) {
            *pp = c->next_idle;
            break;
        }
    }
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* The connection failed while r was on it: retry once if it was a pooled
 * connection the server had already closed, else record the error. */
static void
conn_failed(lt_t *lt, conn_t *c, const char *kind)
{
    req_t *r = c->req;

    c->req = NULL;
    conn_close(lt, c);
    if (r == NULL) {
        return;
    }
    r->conn = NULL;
    if (c->reused && !c->got_bytes && r->retries == 0) {
        r->retries++;
        lt->retried++;
        r->t_start = uv_hrtime();
        start_request(lt, r, 1); /* pooled peers of c may be stale too */
        return;
    }
    finish_request(lt, r, 0, kind);
}

static void
on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;

    (void)suggested;
    buf->base = c->rbuf;
    buf->len = sizeof(c->rbuf);
}

static void
on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    lt_t *lt = g_lt;
    req_t *r = c->req;

    if (nread == 0) {
        return;
    }
    if (nread < 0) {
        if (r != NULL && nread == UV_EOF && lt_http_eof(&c->http) && c->got_bytes) {
            c->req = NULL;
            r->conn = NULL;
            conn_close(lt, c);
            finish_request(lt, r, c->http.status, NULL);
            return;
        }
        conn_failed(lt, c, nread == UV_EOF ? "closed" : "conn_error");
        return;
    }
    if (r == NULL) {
        conn_close(lt, c); /* bytes on an idle connection: drop it */
        return;
    }
    c->got_bytes = 1;
    lt_http_feed(&c->http, buf->base, (size_t)nread, on_body, c);
    if (c->http.state == LT_HTTP_ERROR) {
        conn_failed(lt, c, "bad_response");
        return;
    }
    if (c->http.state == LT_HTTP_DONE) {
        int status = c->http.status;
        c->req = NULL;
        r->conn = NULL;
        if (c->http.keep_alive && !lt->stopping) {
            c->reused = 1;
            c->next_idle = lt->idle;
            lt->idle = c;
        } else {
            conn_close(lt, c);
        }
        finish_request(lt, r, status, NULL);
    }
}

static void
on_write(uv_write_t *w, int status)
{
    conn_t *c = w->data;

    if (status < 0 && !c->closing) {
        conn_failed(g_lt, c, "write_error");
    }
}

static void
conn_send(lt_t *lt, conn_t *c, req_t *r)
{
    uv_buf_t b = uv_buf_init(r->wire, (unsigned)r->wire_len);

    c->req = r;
    r->conn = c;
    c->got_bytes = 0;
    lt_http_init(&c->http);
    lt_sse_free(&c->sse);
    lt_sse_init(&c->sse, 16 << 20);
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        conn_failed(lt, c, "write_error");
    }
}

static void
on_connect(uv_connect_t *cr, int status)
{
    conn_t *c = cr->data;
    lt_t *lt = g_lt;

    if (c->closing) {
        return;
    }
    if (status < 0) {
        conn_failed(lt, c, "connect");
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) {
        conn_failed(lt, c, "conn_error");
        return;
    }
    conn_send(lt, c, c->req);
}

/* Sends r on a pooled connection, or on a new one (always when fresh). */
static void
start_request(lt_t *lt, req_t *r, int fresh)
{
    conn_t *c = fresh ? NULL : lt->idle;

    if (c != NULL) {
        lt->idle = c->next_idle;
        c->next_idle = NULL;
        conn_send(lt, c, r);
        return;
    }
    c = xcalloc(1, sizeof(*c));
    uv_tcp_init(lt->loop, &c->tcp);
    c->tcp.data = c;
    c->connect_req.data = c;
    c->req = r;
    r->conn = c;
    lt->n_conns++;
    lt->conns_opened++;
    if (uv_tcp_connect(&c->connect_req, &c->tcp, (struct sockaddr *)&lt->addr, on_connect) < 0) {
        conn_failed(lt, c, "connect");
    }
}

/* ------------------------------------------------------------------ */
/* Issuing and stopping.                                               */

static int
can_issue(lt_t *lt)
{
    if (lt->stopping) {
        return 0;
    }
    if (lt->o.max_requests > 0 && lt->issued >= lt->o.max_requests) {
        return 0;
    }
    if (lt->o.duration_s > 0 && since_s(lt->t0) >= lt->o.duration_s) {
        return 0;
    }
    return 1;
}

static void
launch_one(lt_t *lt)
{
    req_t *r = make_request(lt);

    lt->issued++;
    r->t_start = uv_hrtime();
    r->next = lt->inflight_head;
    if (lt->inflight_head != NULL) {
        lt->inflight_head->prev = r;
    }
    lt->inflight_head = r;
    lt->inflight++;
    if (lt->inflight > lt->peak_inflight) {
        lt->peak_inflight = lt->inflight;
    }
    start_request(lt, r, 0);
}

/* Starts what the mode allows now. */
static void
issue(lt_t *lt)
{
    if (lt->o.rate > 0) {
        while (lt->pending_arrivals > 0 && can_issue(lt) &&
               (lt->o.concurrency <= 0 || lt->inflight < lt->o.concurrency)) {
            lt->pending_arrivals--;
            launch_one(lt);
        }
        return;
    }
    while (can_issue(lt) && lt->inflight < lt->o.concurrency) {
        launch_one(lt);
    }
}

static void
on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

static void
maybe_shutdown(lt_t *lt)
{
    /* Arrivals still waiting for a slot once issuing has ended are dropped. */
    if (lt->shut || lt->inflight > 0 || can_issue(lt)) {
        return;
    }
    lt->shut = 1;
    while (lt->idle != NULL) {
        conn_close(lt, lt->idle);
    }
    uv_close((uv_handle_t *)&lt->tick, on_handle_closed);
    uv_close((uv_handle_t *)&lt->arrival, on_handle_closed);
    uv_close((uv_handle_t *)&lt->sigint, on_handle_closed);
}

static void
on_arrival(uv_timer_t *t)
{
    lt_t *lt = t->data;
    uint64_t now = uv_hrtime();

    /* Every arrival whose time has come (timers are ms-grained). */
    while (lt->next_arrival <= now) {
        if (!can_issue(lt) ||
            (lt->o.max_requests > 0 && lt->issued + lt->pending_arrivals >= lt->o.max_requests)) {
            issue(lt);
            maybe_shutdown(lt);
            return;
        }
        lt->pending_arrivals++;
        lt->next_arrival += (uint64_t)(lt_rand_exp(&lt->rng, 1.0 / lt->o.rate) * 1e9);
    }
    issue(lt);
    uv_timer_start(&lt->arrival, on_arrival, (lt->next_arrival - now + 999999) / 1000000, 0);
}

static void
print_progress(lt_t *lt, int final)
{
    double el = since_s(lt->t0);
    double tps = el > 0 ? (double)lt->output_tokens / el : 0;

    fprintf(stderr, "\r\033[K[%6.1fs] done %ld", el, lt->completed);
    if (lt->o.max_requests > 0) {
        fprintf(stderr, "/%ld", lt->o.max_requests);
    }
    fprintf(stderr, "  ok %ld  err %ld  in-flight %d  |  %.1f out tok/s  %.2f req/s", lt->ok,
            lt->failed, lt->inflight, tps, el > 0 ? (double)lt->ok / el : 0);
    if (final) {
        fputc('\n', stderr);
    }
}

static void
on_tick(uv_timer_t *t)
{
    lt_t *lt = t->data;
    uint64_t now = uv_hrtime();

    /* Per-request timeouts. */
    if (lt->o.timeout_s > 0) {
        req_t *r = lt->inflight_head;
        while (r != NULL) {
            req_t *next = r->next;
            if ((double)(now - r->t_start) / 1e9 > lt->o.timeout_s && r->conn != NULL) {
                conn_t *c = r->conn;
                c->req = NULL;
                r->conn = NULL;
                conn_close(lt, c);
                finish_request(lt, r, 0, "timeout");
            }
            r = next;
        }
    }
    issue(lt);
    maybe_shutdown(lt);
    if (!lt->shut && lt->o.progress && since_s(lt->t0) - lt->last_progress >= 0.5) {
        lt->last_progress = since_s(lt->t0);
        print_progress(lt, 0);
    }
}

static void
on_sigint(uv_signal_t *s, int signum)
{
    lt_t *lt = s->data;

    (void)signum;
    if (lt->stopping) {
        /* Second ^C: give up on in-flight requests. */
        while (lt->inflight_head != NULL) {
            req_t *r = lt->inflight_head;
            if (r->conn != NULL) {
                conn_t *c = r->conn;
                c->req = NULL;
                r->conn = NULL;
                conn_close(lt, c);
            }
            finish_request(lt, r, 0, "interrupted");
        }
    }
    lt->stopping = 1;
    maybe_shutdown(lt);
}

/* ------------------------------------------------------------------ */
/* Prompts file.                                                       */

/* JSONL: one object per line with "prompt" (string, array of strings or
 * token ids) or "messages" (chat), and optionally "max_tokens" (or
 * "output_len") and "input_len". Blank lines are skipped. */
static int
load_prompts(lt_t *lt, const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;

    if (f == NULL) {
        fprintf(stderr, "kvs-loadtest: %s: %s\n", path, strerror(errno));
        return -1;
    }
    while ((n = getline(&line, &cap, f)) >= 0) {
        cJSON *root, *item, *mt, *il;
        const char *key = lt->o.chat ? "messages" : "prompt";
        char *txt;
        sbuf_t sb = {0};
        prompt_t *p;

        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) {
            line[--n] = '\0';
        }
        if (n == 0) {
            continue;
        }
        root = cJSON_Parse(line);
        item = root != NULL ? cJSON_GetObjectItemCaseSensitive(root, key) : NULL;
        if (item == NULL && root != NULL && lt->o.chat) {
            /* A plain prompt used against the chat endpoint: one user turn. */
            cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
            if (cJSON_IsString(pr)) {
                cJSON *msgs = cJSON_CreateArray(), *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "user");
                cJSON_AddStringToObject(m, "content", pr->valuestring);
                cJSON_AddItemToArray(msgs, m);
                cJSON_AddItemToObject(root, "messages", msgs);
                item = msgs;
            }
        }
        if (item == NULL) {
            fprintf(stderr, "kvs-loadtest: %s:%ld: expected a JSON object with \"%s\"\n", path,
                    lineno, key);
            cJSON_Delete(root);
            free(line);
            fclose(f);
            return -1;
        }
        txt = cJSON_PrintUnformatted(item);
        sb_add(&sb, "\"%s\":%s", key, txt);
        free(txt);
        if (lt->prompts.n % 64 == 0) {
            lt->prompts.v = xrealloc(lt->prompts.v, (lt->prompts.n + 64) * sizeof(prompt_t));
        }
        p = &lt->prompts.v[lt->prompts.n++];
        memset(p, 0, sizeof(*p));
        p->field = sb.p;
        mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
        if (!cJSON_IsNumber(mt)) {
            mt = cJSON_GetObjectItemCaseSensitive(root, "output_len");
        }
        if (cJSON_IsNumber(mt) && mt->valueint > 0) {
            p->max_tokens = mt->valueint;
        }
        il = cJSON_GetObjectItemCaseSensitive(root, "input_len");
        if (cJSON_IsNumber(il)) {
            p->input_len = il->valueint;
        } else if (cJSON_IsArray(item) && !lt->o.chat && cJSON_GetArraySize(item) > 0 &&
                   cJSON_IsNumber(cJSON_GetArrayItem(item, 0))) {
            p->input_len = cJSON_GetArraySize(item);
        }
        cJSON_Delete(root);
    }
    free(line);
    fclose(f);
    if (lt->prompts.n == 0) {
        fprintf(stderr, "kvs-loadtest: %s: no prompts\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Blocking GET for /v1/models before the run.                         */

typedef struct fetch_body {
    char *p;
    size_t n;
} fetch_body_t;

static void
fetch_on_body(void *arg, const char *data, size_t n)
{
    fetch_body_t *b = arg;

    if (b->n + n > (1 << 20)) {
        return;
    }
    b->p = xrealloc(b->p, b->n + n + 1);
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static int
fetch_get(lt_t *lt, const char *path, int *status, char **body)
{
    int fd = socket(lt->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t alen = lt->addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                    : sizeof(struct sockaddr_in);
    struct timeval tv = {.tv_sec = 10};
    char req[1024], buf[8192];
    lt_http_t h;
    fetch_body_t b = {0};
    int n;

    if (fd < 0) {
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&lt->addr, alen) < 0) {
        close(fd);
        return -1;
    }
    n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n%s%s%s\r\n",
                 path, lt->o.host, lt->o.port, lt->o.api_key[0] ? "Authorization: Bearer " : "",
                 lt->o.api_key, lt->o.api_key[0] ? "\r\n" : "");
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    lt_http_init(&h);
    while (h.state != LT_HTTP_DONE && h.state != LT_HTTP_ERROR) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r <= 0) {
            lt_http_eof(&h);
            break;
        }
        lt_http_feed(&h, buf, (size_t)r, fetch_on_body, &b);
    }
    close(fd);
    if (h.state != LT_HTTP_DONE) {
        free(b.p);
        return -1;
    }
    *status = h.status;
    *body = b.p;
    return 0;
}

static int
discover_model(lt_t *lt)
{
    int status = 0;
    char *body = NULL;
    cJSON *root, *data, *first, *id;

    if (fetch_get(lt, "/v1/models", &status, &body) != 0 || status != 200) {
        fprintf(stderr, "kvs-loadtest: GET /v1/models failed (status %d); pass --model\n",
                status);
        free(body);
        return -1;
    }
    root = cJSON_Parse(body != NULL ? body : "");
    data = cJSON_GetObjectItemCaseSensitive(root, "data");
    first = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    id = first != NULL ? cJSON_GetObjectItemCaseSensitive(first, "id") : NULL;
    if (!cJSON_IsString(id)) {
        fprintf(stderr, "kvs-loadtest: no model id in /v1/models; pass --model\n");
        cJSON_Delete(root);
        free(body);
        return -1;
    }
    snprintf(lt->o.model, sizeof(lt->o.model), "%s", id->valuestring);
    cJSON_Delete(root);
    free(body);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Report.                                                             */

static void
json_summary(cJSON *parent, const char *name, lt_vec_t *v)
{
    lt_summary_t s;
    cJSON *o;

    lt_summarize(v, &s);
    if (s.n == 0) {
        cJSON_AddNullToObject(parent, name);
        return;
    }
    o = cJSON_AddObjectToObject(parent, name);
    cJSON_AddNumberToObject(o, "n", (double)s.n);
    cJSON_AddNumberToObject(o, "mean", s.mean);
    cJSON_AddNumberToObject(o, "min", s.min);
    cJSON_AddNumberToObject(o, "p50", s.p50);
    cJSON_AddNumberToObject(o, "p90", s.p90);
    cJSON_AddNumberToObject(o, "p99", s.p99);
    cJSON_AddNumberToObject(o, "max", s.max);
}

static void
text_summary(const char *name, lt_vec_t *v)
{
    lt_summary_t s;

    lt_summarize(v, &s);
    if (s.n == 0) {
        printf("  %-10s %8s\n", name, "-");
        return;
    }
    printf("  %-10s %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, s.mean, s.p50, s.p90, s.p99, s.max);
}

static void
report(lt_t *lt)
{
    double dur = lt->t_end > lt->t0 ? (double)(lt->t_end - lt->t0) / 1e9 : 0;
    double rps = dur > 0 ? lt->ok / dur : 0;
    double otps = dur > 0 ? (double)lt->output_tokens / dur : 0;
    double ttps = dur > 0 ? (double)(lt->output_tokens + lt->prompt_tokens) / dur : 0;

    struct rusage ru;
    double cpu_s;

    /* The generator's own CPU time: it shares the cores with the server. */
    getrusage(RUSAGE_SELF, &ru);
    cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
            ru.ru_stime.tv_usec / 1e6;
    if (lt->o.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON *req, *errs, *tok, *thr;
        char url[600], *txt;

        snprintf(url, sizeof(url), "http://%s:%s%s", lt->o.host, lt->o.port, lt->o.path);
        cJSON_AddStringToObject(root, "url", url);
        cJSON_AddStringToObject(root, "model", lt->o.model);
        cJSON_AddBoolToObject(root, "stream", lt->o.stream);
        cJSON_AddStringToObject(root, "mode", lt->o.rate > 0 ? "open" : "closed");
        cJSON_AddNumberToObject(root, "concurrency", lt->o.concurrency);
        cJSON_AddNumberToObject(root, "rate", lt->o.rate);
        cJSON_AddNumberToObject(root, "duration_s", dur);
        req = cJSON_AddObjectToObject(root, "requests");
        cJSON_AddNumberToObject(req, "issued", (double)lt->issued);
        cJSON_AddNumberToObject(req, "completed", (double)lt->completed);
        cJSON_AddNumberToObject(req, "ok", (double)lt->ok);
        cJSON_AddNumberToObject(req, "failed", (double)lt->failed);
        cJSON_AddNumberToObject(req, "retried", (double)lt->retried);
        cJSON_AddNumberToObject(req, "peak_in_flight", lt->peak_inflight);
        cJSON_AddNumberToObject(req, "connections_opened", lt->conns_opened);
        errs = cJSON_AddObjectToObject(root, "errors");
        for (int i = 0; i < lt->n_errs; i++) {
            cJSON_AddNumberToObject(errs, lt->errs[i].kind, (double)lt->errs[i].n);
        }
        tok = cJSON_AddObjectToObject(root, "tokens");
        cJSON_AddNumberToObject(tok, "prompt", (double)lt->prompt_tokens);
        cJSON_AddNumberToObject(tok, "output", (double)lt->output_tokens);
        thr = cJSON_AddObjectToObject(root, "throughput");
        cJSON_AddNumberToObject(thr, "requests_per_s", rps);
        cJSON_AddNumberToObject(thr, "output_tokens_per_s", otps);
        cJSON_AddNumberToObject(thr, "total_tokens_per_s", ttps);
        cJSON_AddNumberToObject(root, "client_cpu_s", cpu_s);
        json_summary(root, "ttft_ms", &lt->ttft);
        json_summary(root, "tpot_ms", &lt->tpot);
        json_summary(root, "itl_ms", &lt->itl);
        json_summary(root, "e2e_ms", &lt->e2e);
        txt = cJSON_Print(root);
        printf("%s\n", txt);
        free(txt);
        cJSON_Delete(root);
        return;
    }
    printf("target      http://%s:%s%s  model %s  %s\n", lt->o.host, lt->o.port, lt->o.path,
           lt->o.model, lt->o.stream ? "streaming" : "non-streaming");
    if (lt->o.rate > 0) {
        printf("load        open loop, Poisson %.3g req/s", lt->o.rate);
        if (lt->o.concurrency > 0) {
            printf(", at most %d in flight", lt->o.concurrency);
        }
        printf("\n");
    } else {
        printf("load        closed loop, %d concurrent\n", lt->o.concurrency);
    }
    printf("requests    %ld ok, %ld failed, %.2f s, peak %d in flight, %d connections, "
           "%ld retried on a fresh one\n",
           lt->ok, lt->failed, dur, lt->peak_inflight, lt->conns_opened, lt->retried);
    for (int i = 0; i < lt->n_errs; i++) {
        printf("  error %-12s %ld\n", lt->errs[i].kind, lt->errs[i].n);
    }
    printf("tokens      %lld prompt, %lld output\n", (long long)lt->prompt_tokens,
           (long long)lt->output_tokens);
    printf("throughput  %.2f req/s, %.1f output tok/s, %.1f total tok/s\n", rps, otps, ttps);
    printf("client CPU  %.2f s (%.1f%% of one core)\n", cpu_s, dur > 0 ? 100.0 * cpu_s / dur : 0);
    printf("latency ms  %9s %9s %9s %9s %9s\n", "mean", "p50", "p90", "p99", "max");
    text_summary("TTFT", &lt->ttft);
    text_summary("TPOT", &lt->tpot);
    text_summary("ITL", &lt->itl);
    text_summary("E2E", &lt->e2e);
}

/* ------------------------------------------------------------------ */
/* Command line.                                                       */

static void
usage(FILE *f)
{
    fprintf(f,
        "usage: kvs-loadtest [OPTIONS]\n\n"
        "Load generator for OpenAI-compatible servers (kvserve, vLLM, llama-server).\n\n"
        "target:\n"
        "  --url URL              server base URL [http://127.0.0.1:8000]\n"
        "  --endpoint E           completions | chat, or a path [completions]\n"
        "  --model NAME           model id (default: the first of GET /v1/models)\n"
        "  --api-key KEY          bearer key (or env KVSERVE_API_KEY / OPENAI_API_KEY)\n"
        "load (one of):\n"
        "  --concurrency N        closed loop: N requests in flight [1]\n"
        "  --rate R               open loop: Poisson arrivals, R req/s (with --concurrency:\n"
        "                         at most N in flight, later arrivals wait)\n"
        "bounds (at least one; the run ends when either is reached):\n"
        "  --max-requests N       requests to issue [100 when no --duration]\n"
        "  --duration S           seconds to keep issuing\n"
        "requests:\n"
        "  --stream / --no-stream SSE streaming (TTFT, ITL) or whole responses [stream]\n"
        "  --prompts FILE.jsonl   {\"prompt\": ...} or {\"messages\": ...} per line, optional\n"
        "                         \"max_tokens\"; cycled through in order\n"
        "  --input-len SPEC       synthetic prompt tokens: N, A-B, normal:M:SD, exp:M [128]\n"
        "  --output-len SPEC      max_tokens, same forms [128]\n"
        "  --token-range A-B      token ids of synthetic prompts [100-999]\n"
        "  --ignore-eos           ask the server to generate exactly max_tokens\n"
        "  --temperature T        [0]\n"
        "  --seed N               for prompts and arrivals [1]\n"
        "  --timeout S            per request, 0 = none [600]\n"
        "output:\n"
        "  --json                 JSON report on stdout\n"
        "  --progress / --no-progress  live line on stderr [on when stderr is a TTY]\n");
}

static int
parse_url(opts_t *o, const char *url)
{
    const char *p = url, *hs, *he, *colon;

    if (strncmp(p, "http://", 7) != 0) {
        return -1;
    }
    p += 7;
    hs = p;
    if (*p == '[') {
        he = strchr(p, ']');
        if (he == NULL) {
            return -1;
        }
        hs = p + 1;
        p = he + 1;
    } else {
        while (*p != '\0' && *p != ':' && *p != '/') {
            p++;
        }
        he = p;
    }
    if ((size_t)(he - hs) >= sizeof(o->host) || he == hs) {
        return -1;
    }
    memcpy(o->host, hs, (size_t)(he - hs));
    o->host[he - hs] = '\0';
    strcpy(o->port, "80");
    if (*p == ':') {
        colon = ++p;
        while (*p >= '0' && *p <= '9') {
            p++;
        }
        if (p == colon || (size_t)(p - colon) >= sizeof(o->port)) {
            return -1;
        }
        memcpy(o->port, colon, (size_t)(p - colon));
        o->port[p - colon] = '\0';
    }
    /* A base path such as /v1 is dropped: endpoints are absolute. */
    return 0;
}

enum {
    O_URL = 256, O_ENDPOINT, O_MODEL, O_API_KEY, O_CONC, O_RATE, O_MAXREQ, O_DUR, O_STREAM,
    O_NOSTREAM, O_PROMPTS, O_INLEN, O_OUTLEN, O_TOKRANGE, O_IGNEOS, O_TEMP, O_SEED, O_TIMEOUT,
    O_JSON, O_PROGRESS, O_NOPROGRESS, O_HELP,
};

static int
parse_args(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        {"url", required_argument, 0, O_URL},
        {"endpoint", required_argument, 0, O_ENDPOINT},
        {"model", required_argument, 0, O_MODEL},
        {"api-key", required_argument, 0, O_API_KEY},
        {"concurrency", required_argument, 0, O_CONC},
        {"rate", required_argument, 0, O_RATE},
        {"max-requests", required_argument, 0, O_MAXREQ},
        {"duration", required_argument, 0, O_DUR},
        {"stream", no_argument, 0, O_STREAM},
        {"no-stream", no_argument, 0, O_NOSTREAM},
        {"prompts", required_argument, 0, O_PROMPTS},
        {"input-len", required_argument, 0, O_INLEN},
        {"output-len", required_argument, 0, O_OUTLEN},
        {"token-range", required_argument, 0, O_TOKRANGE},
        {"ignore-eos", no_argument, 0, O_IGNEOS},
        {"temperature", required_argument, 0, O_TEMP},
        {"seed", required_argument, 0, O_SEED},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"json", no_argument, 0, O_JSON},
        {"progress", no_argument, 0, O_PROGRESS},
        {"no-progress", no_argument, 0, O_NOPROGRESS},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *env;
    char *end;
    int c;

    memset(o, 0, sizeof(*o));
    parse_url(o, "http://127.0.0.1:8000");
    strcpy(o->path, "/v1/completions");
    o->stream = 1;
    o->progress = -1;
    o->tok_lo = 100;
    o->tok_hi = 999;
    o->seed = 1;
    o->timeout_s = 600;
    lt_dist_parse("128", &o->input_len);
    lt_dist_parse("128", &o->output_len);
    env = getenv("KVSERVE_API_KEY");
    if (env == NULL) {
        env = getenv("OPENAI_API_KEY");
    }
    if (env != NULL) {
        snprintf(o->api_key, sizeof(o->api_key), "%s", env);
    }

#define BAD(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "kvs-loadtest: " __VA_ARGS__);                                             \
        fputc('\n', stderr);                                                                       \
        return 2;                                                                                  \
    } while (0)

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_URL:
            if (parse_url(o, optarg) != 0) {
                BAD("--url: expected http://HOST[:PORT], got '%s'", optarg);
            }
            break;
        case O_ENDPOINT:
            if (strcmp(optarg, "completions") == 0) {
                strcpy(o->path, "/v1/completions");
                o->chat = 0;
            } else if (strcmp(optarg, "chat") == 0) {
                strcpy(o->path, "/v1/chat/completions");
                o->chat = 1;
            } else if (optarg[0] == '/' && strlen(optarg) < sizeof(o->path)) {
                strcpy(o->path, optarg);
                o->chat = strstr(optarg, "chat") != NULL;
            } else {
                BAD("--endpoint: completions, chat or a /path");
            }
            break;
        case O_MODEL:
            snprintf(o->model, sizeof(o->model), "%s", optarg);
            break;
        case O_API_KEY:
            snprintf(o->api_key, sizeof(o->api_key), "%s", optarg);
            break;
        case O_CONC:
            o->concurrency = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || o->concurrency < 1 || o->concurrency > 100000) {
                BAD("--concurrency: expected 1..100000");
            }
            break;
        case O_RATE:
            o->rate = strtod(optarg, &end);
            if (*end != '\0' || !(o->rate > 0) || o->rate > 1e6) {
                BAD("--rate: expected a positive number of requests per second");
            }
            break;
        case O_MAXREQ:
            o->max_requests = strtol(optarg, &end, 10);
            if (*end != '\0' || o->max_requests < 1) {
                BAD("--max-requests: expected a positive integer");
            }
            break;
        case O_DUR:
            o->duration_s = strtod(optarg, &end);
            if (*end != '\0' || !(o->duration_s > 0)) {
                BAD("--duration: expected positive seconds");
            }
            break;
        case O_STREAM:
            o->stream = 1;
            break;
        case O_NOSTREAM:
            o->stream = 0;
            break;
        case O_PROMPTS:
            o->prompts_file = optarg;
            break;
        case O_INLEN:
            if (lt_dist_parse(optarg, &o->input_len) != 0) {
                BAD("--input-len: expected N, A-B, normal:MEAN:SD or exp:MEAN");
            }
            break;
        case O_OUTLEN:
            if (lt_dist_parse(optarg, &o->output_len) != 0) {
                BAD("--output-len: expected N, A-B, normal:MEAN:SD or exp:MEAN");
            }
            break;
        case O_TOKRANGE: {
            lt_dist_t d;
            if (lt_dist_parse(optarg, &d) != 0 || d.kind != 1) {
                BAD("--token-range: expected A-B");
            }
            o->tok_lo = (int32_t)d.a;
            o->tok_hi = (int32_t)d.b;
            break;
        }
        case O_IGNEOS:
            o->ignore_eos = 1;
            break;
        case O_TEMP:
            o->temperature = strtod(optarg, &end);
            if (*end != '\0' || o->temperature < 0 || o->temperature > 2) {
                BAD("--temperature: expected 0..2");
            }
            break;
        case O_SEED:
            o->seed = strtoull(optarg, &end, 10);
            if (*end != '\0') {
                BAD("--seed: expected an integer");
            }
            break;
        case O_TIMEOUT:
            o->timeout_s = strtod(optarg, &end);
            if (*end != '\0' || o->timeout_s < 0) {
                BAD("--timeout: expected seconds");
            }
            break;
        case O_JSON:
            o->json = 1;
            break;
        case O_PROGRESS:
            o->progress = 1;
            break;
        case O_NOPROGRESS:
            o->progress = 0;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        BAD("unexpected argument '%s'", argv[optind]);
    }
#undef BAD
    if (o->rate <= 0 && o->concurrency == 0) {
        o->concurrency = 1;
    }
    if (o->max_requests == 0 && o->duration_s == 0) {
        o->max_requests = 100;
    }
    if (o->progress < 0) {
        o->progress = isatty(STDERR_FILENO);
    }
    return 0;
}

static int
resolve(lt_t *lt)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(lt->o.host, lt->o.port, &hints, &res);

    if (rc != 0 || res == NULL) {
        fprintf(stderr, "kvs-loadtest: %s:%s: %s\n", lt->o.host, lt->o.port, gai_strerror(rc));
        return -1;
    }
    memcpy(&lt->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

int
main(int argc, char **argv)
{
    static lt_t lt_storage;
    lt_t *lt = &lt_storage;
    int rc;

    rc = parse_args(argc, argv, &lt->o);
    if (rc != 0) {
        return rc == 1 ? 0 : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    g_lt = lt;
    lt->rng = lt->o.seed * 0x9E3779B97F4A7C15ULL + 1;
    if (resolve(lt) != 0) {
        return 1;
    }
    if (lt->o.prompts_file != NULL && load_prompts(lt, lt->o.prompts_file) != 0) {
        return 1;
    }
    if (lt->o.model[0] == '\0' && discover_model(lt) != 0) {
        return 1;
    }

    lt->loop = uv_default_loop();
    uv_timer_init(lt->loop, &lt->tick);
    uv_timer_init(lt->loop, &lt->arrival);
    uv_signal_init(lt->loop, &lt->sigint);
    lt->tick.data = lt;
    lt->arrival.data = lt;
    lt->sigint.data = lt;
    uv_signal_start(&lt->sigint, on_sigint, SIGINT);
    lt->t0 = uv_hrtime();
    lt->t_end = lt->t0;
    uv_timer_start(&lt->tick, on_tick, 100, 100);
    if (lt->o.rate > 0) {
        lt->next_arrival = lt->t0;
        lt->pending_arrivals = 0;
        uv_timer_start(&lt->arrival, on_arrival, 0, 0);
    } else {
        issue(lt);
    }
    uv_run(lt->loop, UV_RUN_DEFAULT);
    if (lt->o.progress) {
        print_progress(lt, 1);
    }
    report(lt);
    uv_loop_close(lt->loop);
    for (size_t i = 0; i < lt->prompts.n; i++) {
        free(lt->prompts.v[i].field);
    }
    free(lt->prompts.v);
    lt_vec_free(&lt->ttft);
    lt_vec_free(&lt->tpot);
    lt_vec_free(&lt->itl);
    lt_vec_free(&lt->e2e);
    return lt->ok > 0 && lt->failed == 0 ? 0 : (lt->ok > 0 ? 3 : 1);
}
