/* srv_loop.h - what the loop (srv_loop.c) offers a request: suspending and
 * resuming its connection, and a hang-up watch while it is suspended.
 *
 * DESIGN
 *   A request waiting for the engine is a suspended MHD connection. MHD
 *   does not watch a suspended socket, so the loop watches it with a
 *   uv_poll_t for hang-up, and calls the request's on_hangup once when the
 *   client goes away, so a vanished client is cancelled at once. The watch
 *   starts with the first suspension and lasts until srv_loop_release(),
 *   so a stream that suspends once per token does not re-register it.
 *
 *   Half-close (issue 15). UV_DISCONNECT fires on the peer's FIN, which a
 *   client that shut down its sending side after the request also sends.
 *   A hold that allows it (half_close_ok: a stream, or a request whose
 *   preparation runs, srv_work.h) takes a FIN that leaves the socket in
 *   CLOSE_WAIT (TCP_INFO) as a half-close: it is remembered (half_closed)
 *   and the watch goes on for a reset only (EPOLLERR / EPOLLHUP, which
 *   epoll reports whatever the mask). A client that really closed is
 *   found by the next write, which its kernel answers with a reset (and
 *   MHD's own send fails). srv_loop_hold_settle() ends the allowance: a
 *   hold that half-closed then hangs up at once (a non-streamed request
 *   keeps the old rule, a FIN is a hang-up: nothing is written to it
 *   before its answer).
 *
 *   The loop knows a request only by the srv_hold_t embedded in it (the
 *   request record itself is private to srv_req.c). At shutdown the loop
 *   resumes every suspended hold, since MHD must not be stopped with
 *   suspended connections.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_LOOP_H
#define SERVER_SRV_LOOP_H

#include <microhttpd.h>
#include <uv.h>

#include "common/list.h"

typedef struct srv srv_t;

/* A request's hold on its connection. Fields are the loop's; the request
 * reads suspended and hung_up. */
typedef struct srv_hold {
    srv_t *s;
    struct MHD_Connection *mc; /* NULL after srv_loop_release() */
    int suspended;
    int hung_up;                  /* the watch saw the client go */
    int fd;                       /* the socket, once the watch started; -1 before */
    int half_close_ok;            /* a FIN alone is not a hang-up (see above) */
    int half_closed;              /* the peer sent its FIN and may still read */
    int suspend_later;            /* srv_loop_suspend_later: on s->suspend_later */
    int resume_later;             /* resumed while suspend_later was set */
    uv_poll_t *hup;               /* the watch, while it runs */
    uv_poll_t *hup_mem;           /* its memory, reserved before the first suspension */
    void (*on_hangup)(void *arg); /* called once, from the watch */
    void *arg;
    list_node_t node; /* s->suspended while suspended, s->suspend_later before */
} srv_hold_t;

/* Initialises h for the connection mc; on_hangup(arg) runs when the watch
 * sees the client hang up (before the connection is resumed). */
void srv_hold_init(srv_hold_t *h, srv_t *s, struct MHD_Connection *mc,
                   void (*on_hangup)(void *arg), void *arg);
/* Reserves (fallibly) the memory of the hang-up watch; call before the
 * first suspension. Returns 1, or 0 when out of memory. Without it a
 * suspension has no watch. */
int srv_hold_reserve(srv_hold_t *h);
/* Frees the reserved memory if unused. */
void srv_hold_fini(srv_hold_t *h);

/* Sets whether a half-close is allowed from now on. When it is not and the
 * peer half-closed already, the hang-up happens now (on_hangup runs, the
 * connection is resumed). Returns 1 when h has hung up. */
int srv_loop_hold_settle(srv_hold_t *h, int allow);

/* Suspends the connection (no-op when suspended) and starts the hang-up
 * watch if it does not run yet. */
void srv_loop_suspend(srv_hold_t *h);
/* As srv_loop_suspend, but once the running MHD_run() returns: from the
 * access handler's last call, MHD then has seen it return without a
 * response, and waits (MHD_EVENT_LOOP_INFO_BLOCK) instead of reading.
 * Suspended inside that call, libmicrohttpd 0.9.75 keeps the connection
 * in its reading state, so the resume reads first, and a recv of 0 (the
 * client's FIN after a half-close) closes the connection before the
 * answer can be queued. */
void srv_loop_suspend_later(srv_hold_t *h);
/* Resumes the connection if suspended (the watch stays). */
void srv_loop_resume(srv_hold_t *h);
/* MHD is done with the connection: ends the watch (before MHD may close
 * the socket) and forgets the suspension. */
void srv_loop_release(srv_hold_t *h);

/* Runs MHD and re-arms its timer / idle handle. */
void srv_loop_run_mhd(srv_t *s);
/* Called when a request finished; completes a drain when nothing is left. */
void srv_loop_check_drained(srv_t *s);
/* Readiness (srv_ready.c): the server turned ready (logs the "listening
 * on" line, sends READY=1, starts the watchdog); a start-up failure stops
 * the loop (srv_run then returns s->start_rc). */
void srv_loop_on_ready(srv_t *s);
void srv_loop_stop(srv_t *s);

#endif /* SERVER_SRV_LOOP_H */
