/* srv_work.c - a request's preparation on libuv's thread pool
 * (server/srv_work.h).
 *
 * Test hook: KVSERVE_TEST_PREP_DELAY_MS=N makes each preparation sleep N ms
 * on its pool thread first, so a test can hang up while one is in flight
 * whatever the machine's speed.
 *
 * Thread: loop thread, except on_work (a pool thread).
 */
#define LOG_MODULE "http"

#include <stdlib.h>
#include <unistd.h>

#include "common/log.h"
#include "common/xmalloc.h"
#include "server/srv_state.h"
#include "server/srv_work.h"

struct srv_work {
    uv_work_t req; /* req.data: this record */
    srv_req_t *r;
    srv_work_fn fn;
    srv_work_done_fn done;
    void *arg;
    long delay_ms; /* the test hook's sleep, 0 without it */
};

static void
on_work(uv_work_t *req)
{
    srv_work_t *w = req->data;

    if (w->delay_ms > 0) {
        usleep((useconds_t)w->delay_ms * 1000);
    }
    w->fn(w->arg);
}

static void
on_after_work(uv_work_t *req, int status)
{
    srv_work_t *w = req->data;
    srv_req_t *r = w->r;
    srv_t *s = srv_req_server(r);
    int live;

    s->n_work--;
    srv_req_set_work(r, NULL);
    live = status == 0 && srv_req_live(r) && !s->stopping;
    if (!live) {
        REQ_INFO(srv_req_id(r), "dropped while being prepared (%s)",
                 status != 0    ? "cancelled before it ran"
                 : s->stopping ? "stopping"
                               : "client gone");
    }
    w->done(r, w->arg, live);
    free(w);
    srv_req_busy(r, -1); /* may free r */
    srv_loop_run_mhd(s);
}

int
srv_work_queue(srv_req_t *r, srv_work_fn fn, srv_work_done_fn done, void *arg)
{
    srv_t *s = srv_req_server(r);
    srv_work_t *w = xcalloc_try(1, sizeof(*w));
    int rc;

    if (w == NULL || !srv_req_reserve(r)) {
        free(w);
        return 0;
    }
    w->req.data = w;
    w->r = r;
    w->fn = fn;
    w->done = done;
    w->arg = arg;
    const char *delay = getenv("KVSERVE_TEST_PREP_DELAY_MS");
    w->delay_ms = delay != NULL && atol(delay) > 0 ? atol(delay) : 0;
    rc = uv_queue_work(&s->loop, &w->req, on_work, on_after_work);
    if (rc != 0) {
        REQ_WARN(srv_req_id(r), "uv_queue_work: %s", uv_strerror(rc));
        srv_req_unreserve(r);
        free(w);
        return 0;
    }
    s->n_work++;
    srv_req_busy(r, 1);
    srv_req_set_work(r, w);
    (void)srv_req_half_close(r, 1); /* done decides what a FIN meant */
    srv_req_wait_later(r);
    return 1;
}

void
srv_work_cancel(srv_work_t *w)
{
    /* Fails with UV_EBUSY once the item runs: its result is dropped then. */
    (void)uv_cancel((uv_req_t *)&w->req);
}

void
srv_work_drain(srv_t *s)
{
    while (s->n_work > 0) {
        uv_run(&s->loop, UV_RUN_ONCE);
    }
}
