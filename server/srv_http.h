/* srv_http.h - the HTTP plumbing that needs no request record: admitting a
 * request (header checks, routing, auth, body size), queueing responses
 * on an MHD connection, and the test-only /debug/ routes.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_HTTP_H
#define SERVER_SRV_HTTP_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>

#include "server/srv_state.h"

/* What admission learnt about a request. */
typedef struct srv_admit {
    int ep;                /* SRV_EP_*; SRV_EP_OTHER for an unknown path */
    int tenant;            /* index into cfg->tenants */
    size_t content_length; /* from the header; 0 when absent */
} srv_admit_t;

/* Checks a request whose headers are in: framing headers, drain, route
 * (404, 405), Content-Length against the body limit (413) and the API key
 * (401). Returns 1, or 0 with err filled. a->ep is set either way (an
 * error counts under it). */
int srv_http_admit(const srv_t *s, struct MHD_Connection *mc, const char *url,
                   const char *method, srv_admit_t *a, srv_error_t *err);

/* Queues body (malloc'd, ownership passes to MHD; NULL: the static
 * out-of-memory error, 503) with the X-Request-Id of id, an Allow header
 * on 405 and Connection: close while draining, and counts it under ep.
 * Returns 1 when a response was queued (*ret: MHD's answer), 0 when none
 * could be created (*ret: MHD_NO). */
int srv_http_queue(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep, int status,
                   char *body, const char *ctype, int retry_after, enum MHD_Result *ret);
/* Queues len bytes of static data (not copied: they outlive the
 * response), with a Location header unless location is NULL. As
 * srv_http_queue. */
int srv_http_queue_static(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep, int status,
                          const void *data, size_t len, const char *ctype, const char *location,
                          enum MHD_Result *ret);
/* Queues a 200 SSE response whose bytes come from reader(cls); as
 * srv_http_queue otherwise. */
int srv_http_queue_stream(srv_t *s, struct MHD_Connection *mc, uint64_t id, int ep,
                          MHD_ContentReaderCallback reader, void *cls, enum MHD_Result *ret);
/* Out of memory for the request record itself: the static 503, counted
 * under the route the URL names. */
enum MHD_Result srv_http_queue_oom(srv_t *s, struct MHD_Connection *mc, const char *url);

/* Test hooks, answered only when KVSERVE_TEST_HOOKS=1 (s->test_hooks), for
 * URLs under /debug/ (see srv_http.c). As srv_http_queue. */
int srv_http_debug(struct MHD_Connection *mc, const char *url, const char *method,
                   enum MHD_Result *ret);

#endif /* SERVER_SRV_HTTP_H */
