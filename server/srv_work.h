/* srv_work.h - a request's costly preparation (parsing its JSON body,
 * rendering the chat template, tokenizing, compiling a grammar) run on
 * libuv's thread pool, so that the loop thread keeps streaming other
 * requests' tokens meanwhile (issue 15: an 8 MiB body took the loop
 * ~85 ms).
 *
 * DESIGN
 *   srv_work_queue() suspends the request (as srv_req_wait does, with its
 *   hang-up watch, a half-close allowed: done settles it with
 *   srv_req_half_close) and queues fn(arg) with uv_queue_work. fn runs on a
 *   pool thread and touches only arg, the request's body and what of the
 *   server is read-only once it is ready (configuration, limits,
 *   tokenizer, chat template, grammar vocabulary): no socket, no MHD, no
 *   request record, no metrics. Then done(r, arg, live) runs on the loop
 *   thread: live 1, the request goes on (it answers with
 *   srv_req_answer_error / srv_req_answer, or submits its jobs and waits
 *   on); live 0, the client went away, the item was cancelled or the
 *   server is stopping, and done only frees arg.
 *
 *   The request's record stays allocated while an item is in flight (it
 *   counts as busy, srv_req_busy), whatever MHD does with the connection,
 *   so fn's borrowed body and done's r are never freed under them. A
 *   hang-up or an early close cancels an item that has not started
 *   (uv_cancel: done then runs with live 0 without fn having run); one
 *   that runs is let finish and its result dropped. At shutdown
 *   srv_work_drain() waits for the items in flight before the engine and
 *   the grammar vocabulary they may use are destroyed.
 *
 *   The pool is libuv's: UV_THREADPOOL_SIZE threads (default 4). Each
 *   thread's fallible allocations count in the default domain of
 *   common/xmalloc.h, as the loop's do: one request's calls still come in
 *   one fixed order (loop, then pool, then loop).
 *
 * Thread: loop thread, except fn (a pool thread).
 */
#ifndef SERVER_SRV_WORK_H
#define SERVER_SRV_WORK_H

#include "server/srv_req.h"

typedef struct srv_work srv_work_t; /* private to srv_work.c */

/* Runs on a pool thread: must not touch r, MHD, sockets or mutable
 * server state. */
typedef void (*srv_work_fn)(void *arg);
/* Runs on the loop thread once fn has run or was cancelled; owns arg. */
typedef void (*srv_work_done_fn)(srv_req_t *r, void *arg, int live);

/* Queues fn(arg) for r, which must be in its access handler's last call
 * (its body is in). Returns 1: r waits, and done(r, arg, live) will run
 * exactly once. Returns 0 when out of memory: nothing was queued, arg is
 * still the caller's and r is to be answered (503). */
int srv_work_queue(srv_req_t *r, srv_work_fn fn, srv_work_done_fn done, void *arg);
/* Cancels w if it has not started (its done then runs with live 0);
 * else no-op. */
void srv_work_cancel(srv_work_t *w);
/* Shutdown, after MHD has stopped: runs the loop until no item is in
 * flight. */
void srv_work_drain(srv_t *s);

#endif /* SERVER_SRV_WORK_H */
