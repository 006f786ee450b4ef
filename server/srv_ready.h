/* srv_ready.h - readiness: the port opens before the model loads, and the
 * server answers only /health (503 loading), /metrics and /version until
 * the model is loaded and the engine has run a warm-up step.
 *
 * Thread: loop thread, except where a function says otherwise.
 */
#ifndef SERVER_SRV_READY_H
#define SERVER_SRV_READY_H

#include "server/srv_req.h"

/* Starts the loader thread: setup->load, then the engine (created on the
 * outbox s->outbox, locked with --mlock, started). When it is done the
 * loop adopts the model and the engine and submits the warm-up step; its
 * finish makes s->ready 1, logs the "listening on" line and sends
 * READY=1. A failure logs its line, sets s->start_rc and stops the loop.
 * Returns ST_OK, or ST_ENOMEM when the thread cannot start. */
int srv_ready_begin(srv_t *s, const srv_setup_t *setup);
/* Shutdown: cancels a load in progress (a test delay ends at once; a model
 * being read is finished first), joins the loader thread and hands any
 * engine it made to s->engine, so that srv_run stops and destroys it.
 * Safe when srv_ready_begin did not run or the loader was joined. */
void srv_ready_fini(srv_t *s);
/* Frees the loader's record (after srv_ready_fini and the loop's close). */
void srv_ready_free(srv_t *s);
/* Before the endpoint ep runs: while not ready, answers r (503 loading for
 * /health and the API routes; /metrics, /version and the console's static
 * files are served) and returns 1; 0 to run the endpoint. */
int srv_ready_gate(srv_req_t *r, int ep, enum MHD_Result *ret);
/* The warm-up job's outbox messages (1: taken, 0: not its). */
int srv_ready_on_msg(srv_t *s, const msg_t *m);
/* The one-second sweep: an engine that died during the warm-up fails the
 * start-up. */
void srv_ready_sweep(srv_t *s);

#endif /* SERVER_SRV_READY_H */
