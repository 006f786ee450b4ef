/* srv_http.c - HTTP plumbing: admitting a request (framing headers,
 * routing through the route table, body size, API key) and queueing
 * responses on an MHD connection, plus the test-only /debug/ routes.
 *
 * DESIGN
 *   Nothing here holds a request record: srv_req.c calls in with the
 *   connection, the request id and the endpoint, and keeps its own state.
 *   Every queued response carries X-Request-Id (the id the server's log
 *   lines carry, "req=N"), is counted per route and status class for
 *   /metrics, and asks for Connection: close while the server drains.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/xmalloc.h"
#include "server/srv_console.h"
#include "server/srv_cors.h"
#include "server/srv_http.h"

#define CT_JSON "application/json"

/* ---- admission --------------------------------------------------------------- */

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

/* Whether a Content-Type names JSON: application/json or application/...+json,
 * any case, parameters (charset) allowed. */
static int
ctype_is_json(const char *v)
{
    const char *end;
    size_t n;

    while (*v == ' ' || *v == '\t') {
        v++;
    }
    end = strchr(v, ';');
    n = end != NULL ? (size_t)(end - v) : strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) {
        n--;
    }
    if (n < 12 || strncasecmp(v, "application/", 12) != 0) {
        return 0;
    }
    return (n == 16 && strncasecmp(v + 12, "json", 4) == 0) ||
           (n > 17 && strncasecmp(v + n - 5, "+json", 5) == 0);
}

/* The tenant of the request's API key: 0 without auth, -1 when missing or
 * unknown. */
static int
auth_tenant(const srv_t *s, struct MHD_Connection *mc)
{
    const cfg_t *cfg = s->cfg;
    const char *h;

    if (!cfg->auth_required) {
        return 0;
    }
    h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0) {
        return -1;
    }
    h += 7;
    while (*h == ' ') {
        h++;
    }
    return cfg_tenant_find_by_key(cfg, h);
}

int
srv_http_admit(const srv_t *s, struct MHD_Connection *mc, const char *url, const char *method,
               srv_admit_t *a, srv_error_t *err)
{
    const srv_route_t *rt = srv_route_find(url, method, &a->ep);
    hdr_scan_t hs = {0};
    const char *cl;

    a->tenant = 0;
    a->content_length = 0;
    MHD_get_connection_values(mc, MHD_HEADER_KIND, scan_header, &hs);
    if (hs.n_content_length > 1) {
        srv_err_set(err, 400, NULL, "duplicate Content-Length header");
        return 0;
    }
    if (hs.n_content_length > 0 && hs.n_transfer_encoding > 0) {
        srv_err_set(err, 400, NULL, "both Content-Length and Transfer-Encoding are present");
        return 0;
    }
    if (hs.n_transfer_encoding > 1 || hs.te_not_chunked) {
        srv_err_set(err, 400, NULL, "unsupported Transfer-Encoding");
        return 0;
    }
    if (s->draining) {
        srv_err_set(err, 503, NULL, "the server is shutting down");
        return 0;
    }
    if (a->ep == SRV_EP_OTHER) {
        srv_err_set(err, 404, NULL, "no route for %.200s %.200s", method, url);
        err->code = "unknown_url";
        return 0;
    }
    if (rt == NULL) {
        srv_err_set(err, 405, NULL, "method not allowed");
        return 0;
    }
    cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
    if (cl != NULL) {
        char *end;
        unsigned long long v = strtoull(cl, &end, 10);
        if (end == cl || *end != '\0') {
            srv_err_set(err, 400, NULL, "malformed Content-Length");
            return 0;
        }
        if (v > (unsigned long long)s->cfg->max_body_bytes) {
            srv_err_set(err, 413, NULL, "request body of %llu bytes exceeds the limit of %lld", v,
                        (long long)s->cfg->max_body_bytes);
            return 0;
        }
        a->content_length = (size_t)v;
    }
    if (rt->access == SRV_ACCESS_ADMIN) {
        if (!srv_admin_authorized(s, mc, err)) {
            return 0;
        }
    } else if (!(rt->access == SRV_ACCESS_PUBLIC ||
                 (rt->access == SRV_ACCESS_PUBLIC_HEALTH && s->cfg->public_health) ||
                 (rt->access == SRV_ACCESS_PUBLIC_METRICS && s->cfg->public_metrics))) {
        a->tenant = auth_tenant(s, mc);
        if (a->tenant < 0) {
            a->tenant = 0;
            srv_err_set(err, 401, NULL, "invalid or missing API key");
            return 0;
        }
    }
    /* A POST body is JSON. A declared other type (text/plain, curl -d's
     * default application/x-www-form-urlencoded) is refused with 415, as
     * vLLM's FastAPI does; no Content-Type at all is read as JSON (FastAPI
     * too), so a bare client that sends none keeps working. */
    const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Type");
    if (strcmp(rt->method, "POST") == 0 && ct != NULL && !ctype_is_json(ct)) {
        srv_err_set(err, 415, NULL,
                    "unsupported Content-Type '%.100s': send the body as JSON with "
                    "'Content-Type: application/json'",
                    ct);
        err->code = "unsupported_media_type";
        return 0;
    }
    return 1;
}

/* ---- responses --------------------------------------------------------------- */

static void
count_status(srv_t *s, int ep, int status)
{
    int cls = status / 100;

    if (cls >= 1 && cls <= 5) {
        s->metrics.http_requests[ep][cls]++;
    }
}

/* X-Request-Id: the id the server's log lines carry ("req=N"). */
static void
add_request_id(uint64_t id, struct MHD_Response *resp)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)id);
    MHD_add_response_header(resp, "X-Request-Id", buf);
}

/* The headers every queued response shares (CORS, the console's, a drain's
 * Connection: close), then queues resp, drops our reference and counts the
 * status. Returns 1. */
static int
queue_finish(srv_t *s, struct MHD_Connection *mc, int ep, int status, struct MHD_Response *resp,
             enum MHD_Result *ret)
{
    srv_cors_add_headers(s, mc, ep, resp);
    srv_console_add_headers(ep, resp);
    if (s->draining) {
        MHD_add_response_header(resp, "Connection", "close");
    }
    *ret = MHD_queue_response(mc, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    count_status(s, ep, status);
    return 1;
}

int
srv_http_queue(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep, int status, char *body,
               const char *ctype, int retry_after, enum MHD_Result *ret)
{
    struct MHD_Response *resp;
    char ra[16];

    if (body == NULL) {
        REQ_WARN(id, "503 out of memory building the response");
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
        *ret = MHD_NO;
        return 0;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    add_request_id(id, resp);
    if (retry_after > 0) {
        snprintf(ra, sizeof(ra), "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (status == 405) {
        for (const srv_route_t *rt = srv_routes; rt->path != NULL; rt++) {
            if (rt->ep == ep) {
                MHD_add_response_header(resp, "Allow", rt->method);
            }
        }
    }
    return queue_finish(s, mc, ep, status, resp, ret);
}

int
srv_http_queue_static(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep, int status,
                      const void *data, size_t len, const char *ctype, const char *location,
                      enum MHD_Result *ret)
{
    struct MHD_Response *resp;

    resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        *ret = MHD_NO;
        return 0;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    add_request_id(id, resp);
    if (location != NULL) {
        MHD_add_response_header(resp, "Location", location);
    }
    return queue_finish(s, mc, ep, status, resp, ret);
}

int
srv_http_queue_stream(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep,
                      MHD_ContentReaderCallback reader, void *cls, enum MHD_Result *ret)
{
    struct MHD_Response *resp;

    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, cls, NULL);
    if (resp == NULL) {
        *ret = MHD_NO;
        return 0;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    add_request_id(id, resp);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    return queue_finish(s, mc, ep, 200, resp, ret);
}

enum MHD_Result
srv_http_queue_oom(srv_t *s, struct MHD_Connection *mc, const char *url)
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
    srv_cors_add_headers(s, mc, ep, resp);
    ret = MHD_queue_response(mc, 503, resp);
    MHD_destroy_response(resp);
    count_status(s, ep, 503);
    return ret;
}

/* ---- test hooks -------------------------------------------------------------- */

/* Answered only when KVSERVE_TEST_HOOKS=1 (s->test_hooks):
 *   GET  /debug/allocs            {"count":C,"pending":P,"engine_count":EC,
 *        "engine_pending":EP}: fallible allocations made so far by the
 *        loop side (the default domain of common/xmalloc.h) and by the
 *        engine thread, calls left before an armed failure fires (0: none);
 *   POST /debug/fail-alloc?after=N[&domain=engine]  arms the failure of the
 *        N-th following fallible allocation of the default domain, or of
 *        the engine thread (0 disarms); answers {"armed":N}.
 * After reading or arming they allocate nothing through xmalloc_try (the
 * body is copied by MHD), so the count moves only with other requests. */
int
srv_http_debug(struct MHD_Connection *mc, const char *url, const char *method,
               enum MHD_Result *ret)
{
    char body[192];
    struct MHD_Response *resp;
    int status = 200;

    if (strcmp(url, "/debug/allocs") == 0 && strcmp(method, "GET") == 0) {
        snprintf(body, sizeof(body),
                 "{\"count\":%lu,\"pending\":%ld,\"engine_count\":%lu,\"engine_pending\":%ld}",
                 xmalloc_try_count(), xmalloc_fail_pending(),
                 xmalloc_try_count_in(XMALLOC_DOMAIN_ENGINE),
                 xmalloc_fail_pending_in(XMALLOC_DOMAIN_ENGINE));
    } else if (strcmp(url, "/debug/fail-alloc") == 0 && strcmp(method, "POST") == 0) {
        const char *a = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "after");
        const char *d = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "domain");
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
        *ret = MHD_NO;
        return 0;
    }
    MHD_add_response_header(resp, "Content-Type", CT_JSON);
    *ret = MHD_queue_response(mc, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return 1;
}
