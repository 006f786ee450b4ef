/* srv_gen.h - generation: a completions or chat completions request from
 * its parsed body to the engine and back, as a JSON body or an SSE stream.
 *
 * DESIGN
 *   A generation submits one engine job per prompt (n choices each) and
 *   turns the outbox messages into text: incremental detokenization, stop
 *   strings (srv_stop_t; a match is told to the engine as CANCEL(as_stop)),
 *   logprobs, usage and metrics. The response shapes come from the
 *   endpoint's srv_api_t (srv_openai.h). Its record is private to
 *   srv_gen.c and belongs to its request (srv_req.h), which frees it.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_GEN_H
#define SERVER_SRV_GEN_H

#include <stdint.h>
#include <sys/types.h>

#include "server/srv_openai.h"
#include "server/srv_req.h"

/* Parses r's body for api and tokenizes (on the thread pool, srv_work.h),
 * then submits; answers r on any error. r waits from here on. The access
 * handler's return value. */
enum MHD_Result srv_gen_start(srv_req_t *r, const srv_api_t *api);
/* Frees g (and unlinks its open jobs). NULL is a no-op. */
void srv_gen_free(srv_gen_t *g);

/* 1 while the engine still owes g messages. */
int srv_gen_open(const srv_gen_t *g);
/* 1 when g streams and has something to send (data or its end). */
int srv_gen_stream_ready(const srv_gen_t *g);
/* The stream's next bytes: > 0 copied to buf, 0 nothing yet, -1 the end. */
ssize_t srv_gen_read(srv_gen_t *g, char *buf, size_t max);

/* Applies an outbox DELTA, FINISHED or ERROR message. */
void srv_gen_on_msg(srv_t *s, const msg_t *m);
/* The client went away: cancels g's open jobs. */
void srv_gen_cancel(srv_gen_t *g);
/* Ends g with a 503 carrying why (drain timeout, second signal). */
void srv_gen_abort(srv_gen_t *g, const char *why);
/* Ends g with a 503 when it has run longer than limit_ns. */
void srv_gen_sweep(srv_gen_t *g, uint64_t now, uint64_t limit_ns);

#endif /* SERVER_SRV_GEN_H */
