/* srv_req.h - one HTTP request, as the endpoints and the generation side
 * see it: an opaque record (private to srv_req.c) with accessors, the ways
 * to answer it at once, and the ways to make it wait for the engine and
 * answer it later.
 *
 * DESIGN
 *   A request is answered exactly once. srv_req_reply*() queue the answer
 *   now (the request is being handled: the access handler called its
 *   endpoint). A request that needs the engine calls srv_req_wait(): its
 *   connection is suspended (srv_loop.h) until srv_req_answer() (a whole
 *   body, e.g. /metrics or a finished generation) or, for a stream, until
 *   its generation has data (srv_gen_stream_ready); srv_req_kick() wakes
 *   it after new data. The record is freed when MHD has completed the
 *   request AND its generation, if any, has heard the engine's last word.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_REQ_H
#define SERVER_SRV_REQ_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/srv_state.h"

typedef struct srv_gen srv_gen_t;   /* private to srv_gen.c */
typedef struct srv_work srv_work_t; /* private to srv_work.c */

#define SRV_CT_JSON "application/json"

/* ---- accessors --------------------------------------------------------------- */

srv_t *srv_req_server(const srv_req_t *r);
uint64_t srv_req_id(const srv_req_t *r);
int srv_req_tenant(const srv_req_t *r);
uint64_t srv_req_arrival_ns(const srv_req_t *r);
time_t srv_req_created(const srv_req_t *r);
/* The request body; never NULL ("" when empty). Borrowed from r. */
const char *srv_req_body(const srv_req_t *r, size_t *len);
/* The request's path (MHD's, unescaped), valid while the request is. */
const char *srv_req_url(const srv_req_t *r);
/* 0 once the client is gone or MHD is done with the request: nothing
 * more reaches the client. */
int srv_req_live(const srv_req_t *r);
/* 1 once the client is known to be gone (hang-up, early close). */
int srv_req_gone(const srv_req_t *r);
/* 1 while the request waits and no response has been queued yet. */
int srv_req_waiting(const srv_req_t *r);
/* The value of the query argument key, or NULL. Borrowed from MHD. */
const char *srv_req_arg(const srv_req_t *r, const char *key);
/* The value of the request header key (case-insensitive), or NULL.
 * Borrowed from MHD. */
const char *srv_req_header(const srv_req_t *r, const char *key);
/* The live request with that id, or NULL. */
srv_req_t *srv_req_find(srv_t *s, uint64_t id);

/* ---- answering now ----------------------------------------------------------- */

/* Queues body (malloc'd; ownership passes to MHD). A NULL body (its
 * building ran out of memory) becomes the static out-of-memory error,
 * 503. ctype NULL: JSON. */
enum MHD_Result srv_req_reply(srv_req_t *r, int status, char *body, const char *ctype,
                              int retry_after);
/* Queues len bytes of static data (not copied), with a Location header
 * unless location is NULL (the web console's files and redirect). */
enum MHD_Result srv_req_reply_static(srv_req_t *r, int status, const void *data, size_t len,
                                     const char *ctype, const char *location);
/* Prints and deletes root (srv_json_print with mark), then replies. */
enum MHD_Result srv_req_reply_json(srv_req_t *r, int status, cJSON *root, unsigned long mark);
/* The OpenAI error body of err (logged), with Retry-After on 429 / 503. */
enum MHD_Result srv_req_reply_error(srv_req_t *r, const srv_error_t *err);
enum MHD_Result srv_req_reply_errmsg(srv_req_t *r, int status, const char *param,
                                     const char *msg);

/* ---- waiting for the engine -------------------------------------------------- */

/* Reserves the hang-up watch's memory; call before srv_req_wait(). 1, or 0
 * when out of memory. srv_req_unreserve() gives it back unused. */
int srv_req_reserve(srv_req_t *r);
void srv_req_unreserve(srv_req_t *r);
/* Suspends the request until there is something to send. */
void srv_req_wait(srv_req_t *r);
/* The same from the access handler's last call, suspending once MHD_run
 * returns (srv_loop_suspend_later): a client that half-closed can still
 * be answered. */
void srv_req_wait_later(srv_req_t *r);
/* Work other than a generation (embeddings) that the engine still owes
 * messages for r: +1 while it does, -1 when its last word came (the
 * record may then be freed, so r is not to be used after). */
void srv_req_busy(srv_req_t *r, int delta);
/* Whether a half-close of the client (a FIN after the request) is allowed
 * from now on (srv_loop.h): while r is prepared, and for a stream. Not
 * allowing it when the client half-closed already is a hang-up now.
 * Returns 1 when the client is gone. */
int srv_req_half_close(srv_req_t *r, int allow);
/* The preparation of r in flight on the thread pool (srv_work.c), or
 * NULL: a hang-up or an early close cancels it. */
void srv_req_set_work(srv_req_t *r, srv_work_t *w);
/* The generation that answers r; freed with r. */
void srv_req_set_gen(srv_req_t *r, srv_gen_t *g);
/* The later answer of a waiting request: as srv_req_reply(), queued once
 * the connection is resumed (it is kicked here). */
void srv_req_answer(srv_req_t *r, int status, char *body, const char *ctype, int retry_after);
/* srv_req_answer with err's OpenAI error body (logged as
 * srv_req_reply_error does), Retry-After on 429 / 503. */
void srv_req_answer_error(srv_req_t *r, const srv_error_t *err);
/* Makes buffered data reach the client: resumes a waiting or streaming
 * request. No-op once the request is not live. */
void srv_req_kick(srv_req_t *r);
/* Frees the record if MHD and the engine are both done with it. */
void srv_req_maybe_free(srv_req_t *r);

#endif /* SERVER_SRV_REQ_H */
