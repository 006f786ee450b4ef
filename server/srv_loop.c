/* srv_loop.c - the loop thread: libuv drives libmicrohttpd in external-epoll
 * mode, receives the engine's outbox, and runs the lifecycle.
 *
 * DESIGN
 *   MHD runs with MHD_USE_EPOLL and no thread of its own. Its epoll fd sits
 *   on a uv_poll_t; after every event MHD_run() is called and the timer is
 *   re-armed from MHD_get_timeout(): a uv_timer_t for a positive timeout, a
 *   uv_idle_t when it is 0 (a 0 ms timer re-armed from its own callback
 *   would starve the loop). The engine's outbox wakes the loop with
 *   uv_async_send only on empty -> non-empty; the async callback detaches the
 *   whole list.
 *
 *   A request waiting for the engine is a suspended connection (srv_loop.h:
 *   the loop knows it only by its srv_hold_t). MHD does not watch a
 *   suspended socket, so a uv_poll_t with UV_DISCONNECT watches it for
 *   hang-up; when the client goes away the request's on_hangup cancels its
 *   jobs at once.
 *
 *   The port opens before the model loads; srv_ready.c loads it on a
 *   loader thread and runs a warm-up step, answering 503 loading until then.
 *
 *   SIGTERM / SIGINT: MHD_quiesce_daemon() stops accepting, new requests on
 *   kept-alive connections get 503, and in-flight requests finish. When none
 *   is left (or the drain timeout passes, or a second signal comes, which
 *   end the rest with an error), the loop stops and the engine is stopped.
 *
 * Thread: the loop thread.
 */
#define LOG_MODULE "server"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/thread.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_grammar.h"
#include "server/srv_endpoints.h"
#include "server/srv_ready.h"
#include "server/srv_state.h"
#include "server/srv_work.h"

#define SRV_SOCKET_SNDBUF (64 * 1024)
/* After the drain timeout: time for the final error events to reach clients. */
#define SRV_DRAIN_GRACE_MS 5000

static void
on_mhd_timer(uv_timer_t *t)
{
    srv_loop_run_mhd(t->data);
}

static void
on_mhd_idle(uv_idle_t *h)
{
    srv_loop_run_mhd(h->data);
}

static void
on_mhd_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    srv_loop_run_mhd(h->data);
}

void
srv_loop_run_mhd(srv_t *s)
{
    MHD_UNSIGNED_LONG_LONG to = 0;

    if (s->mhd == NULL) {
        return;
    }
    MHD_run(s->mhd);
    while (!list_empty(&s->suspend_later)) {
        srv_hold_t *h = LIST_ENTRY(s->suspend_later.next, srv_hold_t, node);
        int resume = h->resume_later;
        list_remove(&h->node);
        h->suspend_later = 0;
        h->resume_later = 0;
        srv_loop_suspend(h); /* the hang-up watch starts here */
        if (resume) {
            srv_loop_resume(h);
        }
    }
    if (MHD_get_timeout(s->mhd, &to) == MHD_YES) {
        if (to == 0) {
            uv_timer_stop(&s->mhd_timer);
            uv_idle_start(&s->mhd_idle, on_mhd_idle);
        } else {
            uv_idle_stop(&s->mhd_idle);
            uv_timer_start(&s->mhd_timer, on_mhd_timer, to, 0);
        }
    } else {
        uv_idle_stop(&s->mhd_idle);
        uv_timer_stop(&s->mhd_timer);
    }
}

/* ---- suspend / resume with a hang-up watch ----------------------------------- */

void
srv_hold_init(srv_hold_t *h, srv_t *s, struct MHD_Connection *mc, void (*on_hangup)(void *arg),
              void *arg)
{
    memset(h, 0, sizeof(*h));
    h->fd = -1;
    h->s = s;
    h->mc = mc;
    h->on_hangup = on_hangup;
    h->arg = arg;
}

int
srv_hold_reserve(srv_hold_t *h)
{
    if (h->hup != NULL) {
        return 1; /* the watch runs already */
    }
    if (h->hup_mem == NULL) {
        h->hup_mem = xmalloc_try(sizeof(*h->hup_mem));
    }
    return h->hup_mem != NULL;
}

void
srv_hold_fini(srv_hold_t *h)
{
    free(h->hup_mem);
    h->hup_mem = NULL;
}

static void
on_hup_closed(uv_handle_t *h)
{
    free(h);
}

/* The peer sent its FIN and the socket can still send (CLOSE_WAIT): a
 * half-close, or a close that only a write will tell. */
static int
peer_half_closed(int fd)
{
    struct tcp_info ti;
    socklen_t n = sizeof(ti);

    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0) {
        return 0;
    }
    return ti.tcpi_state == TCP_CLOSE_WAIT;
}

/* The client is gone: on_hangup once, then the connection is resumed. */
static void
hang_up(srv_hold_t *h)
{
    if (h->hup != NULL) {
        uv_poll_stop(h->hup);
    }
    if (!h->hung_up) {
        h->hung_up = 1;
        h->on_hangup(h->arg);
        /* libmicrohttpd 0.9.75 (Debian 12) leaves a connection whose
         * content reader ended it with an error in the CLOSED state
         * without moving it to its cleanup list; with the peer gone no
         * further event comes, so its socket stays open until every
         * older connection in the default-timeout list has gone (seconds,
         * up to the idle timeout), counting against the per-IP limit.
         * Connections with their own timeout are visited on every
         * MHD_run(): a 1 s timeout gets this one closed on the next run. */
        if (h->mc != NULL) {
            MHD_set_connection_option(h->mc, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
        }
    }
    /* Resuming lets MHD notice the dead socket and complete the request. */
    srv_loop_resume(h);
    srv_loop_run_mhd(h->s);
}

static void
on_hup(uv_poll_t *p, int status, int events)
{
    srv_hold_t *h = p->data;

    if (status >= 0 && !(events & (UV_DISCONNECT | UV_PRIORITIZED))) {
        return;
    }
    if (status >= 0 && h->half_close_ok && peer_half_closed(h->fd)) {
        if (!h->half_closed) {
            /* Level-triggered: stop asking for the FIN; a reset still
             * comes as EPOLLERR / EPOLLHUP. */
            h->half_closed = 1;
            uv_poll_start(p, UV_PRIORITIZED, on_hup);
        } else {
            /* An event that is no reset (our own shutdown's EPOLLHUP):
             * stop rather than spin; a failing send still tells. */
            uv_poll_stop(p);
        }
        return;
    }
    hang_up(h);
}

int
srv_loop_hold_settle(srv_hold_t *h, int allow)
{
    h->half_close_ok = allow;
    if (!allow && h->half_closed && !h->hung_up) {
        hang_up(h);
    }
    return h->hung_up;
}

void
srv_loop_suspend(srv_hold_t *h)
{
    const union MHD_ConnectionInfo *ci;

    if (h->suspended || h->suspend_later) {
        return; /* a pending srv_loop_suspend_later suspends it */
    }
    MHD_suspend_connection(h->mc);
    h->suspended = 1;
    list_push_back(&h->s->suspended, &h->node);
    if (h->hup != NULL || h->hung_up) {
        return;
    }
    ci = MHD_get_connection_info(h->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL) {
        return;
    }
    /* Reserved (fallibly) by the request before it first suspends. */
    h->hup = h->hup_mem;
    h->hup_mem = NULL;
    if (h->hup == NULL) {
        return;
    }
    if (uv_poll_init_socket(&h->s->loop, h->hup, ci->connect_fd) != 0) {
        free(h->hup);
        h->hup = NULL;
        return;
    }
    h->fd = ci->connect_fd;
    h->hup->data = h;
    uv_poll_start(h->hup, UV_DISCONNECT, on_hup);
}

void
srv_loop_suspend_later(srv_hold_t *h)
{
    if (h->suspended || h->suspend_later) {
        return;
    }
    h->suspend_later = 1;
    list_push_back(&h->s->suspend_later, &h->node);
}

void
srv_loop_resume(srv_hold_t *h)
{
    if (h->suspend_later) {
        h->resume_later = 1; /* MHD calls back once it is suspended and resumed */
        return;
    }
    if (h->suspended) {
        h->suspended = 0;
        list_remove(&h->node);
        MHD_resume_connection(h->mc);
    }
}

void
srv_loop_release(srv_hold_t *h)
{
    if (h->hup != NULL) {
        uv_poll_stop(h->hup);
        uv_close((uv_handle_t *)h->hup, on_hup_closed);
        h->hup = NULL;
    }
    if (h->suspended || h->suspend_later) {
        h->suspended = 0;
        h->suspend_later = 0;
        list_remove(&h->node);
    }
    h->mc = NULL;
}

/* ---- outbox ------------------------------------------------------------------ */

static void
outbox_wake(chan_t *ch, void *arg)
{
    srv_t *s = arg;

    (void)ch;
    uv_async_send(&s->outbox_async);
}

static void
on_outbox(uv_async_t *a)
{
    srv_t *s = a->data;
    msg_t *m = chan_take_all(&s->outbox);

    while (m != NULL) {
        msg_t *next = m->next;
        srv_http_on_msg(s, m);
        eng_msg_free(m);
        m = next;
    }
    srv_loop_run_mhd(s);
}

/* ---- connections ------------------------------------------------------------- */

static void
on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
              enum MHD_ConnectionNotificationCode toe)
{
    srv_t *s = cls;
    srv_conn_t *c = *socket_context;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = xcalloc(1, sizeof(*c));
        c->s = s;
        c->mc = mc;
        c->fd = ci ? ci->connect_fd : -1;
        if (c->fd >= 0) {
            /* Bound the kernel's share of what a slow reader can make us
             * buffer (autotuning on loopback grows it to megabytes); the
             * rest is capped by --max-sse-buffer-bytes. */
            int sndbuf = SRV_SOCKET_SNDBUF;
            setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
        }
        c->phase_start_ns = now_ns();
        list_push_back(&s->conns, &c->node);
        *socket_context = c;
        s->metrics.open_connections++;
    } else if (c != NULL) {
        list_remove(&c->node);
        free(c);
        *socket_context = NULL;
        s->metrics.open_connections--;
    }
}

/* ---- lifecycle --------------------------------------------------------------- */

static void
close_cb_noop(uv_handle_t *h)
{
    (void)h;
}

static void
stop_everything(srv_t *s)
{
    if (s->stopping) {
        return;
    }
    s->stopping = 1;
    LOG_INFO("stopping: %u connections open", s->metrics.open_connections);
    /* MHD must not be stopped with suspended connections. */
    while (!list_empty(&s->suspended)) {
        srv_loop_resume(LIST_ENTRY(s->suspended.next, srv_hold_t, node));
    }
    if (s->mhd != NULL) {
        uv_poll_stop(&s->mhd_poll);
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
    }
    uv_close((uv_handle_t *)&s->mhd_poll, close_cb_noop);
    uv_close((uv_handle_t *)&s->mhd_timer, close_cb_noop);
    uv_close((uv_handle_t *)&s->mhd_idle, close_cb_noop);
    uv_close((uv_handle_t *)&s->sweep_timer, close_cb_noop);
    uv_close((uv_handle_t *)&s->drain_timer, close_cb_noop);
    uv_close((uv_handle_t *)&s->sig_term, close_cb_noop);
    uv_close((uv_handle_t *)&s->sig_int, close_cb_noop);
    sdn_watchdog_stop(&s->watchdog);
    /* The outbox async stays open until the engine has stopped. */
    uv_stop(&s->loop);
}

void
srv_loop_stop(srv_t *s)
{
    stop_everything(s);
}

static void
on_stop_now(uv_timer_t *t)
{
    stop_everything(t->data);
}

/* May run inside an MHD callback, where MHD_stop_daemon must not be called:
 * the stop itself runs from a timer on the next loop iteration. */
void
srv_loop_check_drained(srv_t *s)
{
    if (s->draining && !s->stopping && !s->stop_queued && s->n_reqs == 0) {
        LOG_INFO("drained: no request in flight");
        s->stop_queued = 1;
        uv_timer_stop(&s->drain_timer);
        uv_timer_start(&s->drain_timer, on_stop_now, 0, 0);
    }
}

static void
on_drain_timeout(uv_timer_t *t)
{
    srv_t *s = t->data;

    if (!s->drain_expired) {
        s->drain_expired = 1;
        LOG_WARN("drain timeout: ending %u open requests with an error", s->n_reqs);
        srv_http_abort_all(s, "the server is shutting down");
        srv_loop_run_mhd(s);
        /* Give the error events a moment to be written, then stop. */
        uv_timer_start(&s->drain_timer, on_drain_timeout, SRV_DRAIN_GRACE_MS, 0);
        srv_loop_check_drained(s);
    } else {
        LOG_WARN("drain grace over: closing %u requests", s->n_reqs);
        stop_everything(s);
    }
}

static void
on_signal(uv_signal_t *h, int signum)
{
    srv_t *s = h->data;

    if (s->draining) {
        LOG_INFO("signal %d again: ending the drain now", signum);
        if (!s->drain_expired) {
            uv_timer_stop(&s->drain_timer);
            on_drain_timeout(&s->drain_timer);
        }
        return;
    }
    s->draining = 1;
    LOG_INFO("signal %d: draining %u requests (timeout %.1f s)", signum, s->n_reqs,
             s->cfg->drain_timeout_s);
    sdn_stopping();
    if (s->mhd != NULL) {
        MHD_socket lfd = MHD_quiesce_daemon(s->mhd);
        if (lfd != MHD_INVALID_SOCKET) {
            close(lfd);
        }
    }
    uv_timer_start(&s->drain_timer, on_drain_timeout,
                   (uint64_t)(s->cfg->drain_timeout_s * 1000.0 + 0.5), 0);
    srv_loop_check_drained(s);
}

static void
on_sweep(uv_timer_t *t)
{
    srv_t *s = t->data;

    srv_http_sweep(s, now_ns());
    srv_health_sweep(s, now_ns());
    srv_ready_sweep(s);
    if (s->engine != NULL && engine_alive(s->engine)) {
        eng_msg_stats_t *m = xcalloc(1, sizeof(*m));
        m->hdr.type = ENG_MSG_STATS;
        m->cookie = 0; /* periodic: kept as last_stats */
        chan_send(engine_inbox(s->engine), &m->hdr);
    }
    srv_loop_run_mhd(s);
}

/* ---- systemd ----------------------------------------------------------------- */

static int
wd_healthy(void *arg)
{
    srv_t *s = arg;

    return s->engine != NULL && engine_alive(s->engine);
}

static void
wd_status(void *arg, char *buf, size_t len)
{
    srv_t *s = arg;
    const eng_stats_t *st = &s->last_stats;

    if (s->draining) {
        snprintf(buf, len, "draining %u requests", s->n_reqs);
        return;
    }
    sdn_format_status(buf, len, st->running, st->waiting, st->swapped, st->kv_used, st->kv_total);
}

void
srv_loop_on_ready(srv_t *s)
{
    LOG_INFO("listening on http://%s:%u model=%s max_model_len=%d kv_blocks=%d tenants=%d",
             s->cfg->host, s->port, s->model_name, s->max_model_len, s->kv_blocks,
             s->cfg->n_tenants);
    sdn_ready();
    if (sdn_watchdog_start(&s->loop, &s->watchdog, wd_healthy, wd_status, s, 2000) != ST_OK) {
        LOG_WARN("systemd watchdog timer not started");
    }
}

/* ---- start-up ---------------------------------------------------------------- */

static int
resolve_host(const char *host, uint16_t port, struct sockaddr_storage *ss, int *v6)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portstr, sizeof(portstr), "%u", port);
    rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0 || res == NULL) {
        LOG_ERROR("--host %s: %s", host, gai_strerror(rc));
        return ST_EINVAL;
    }
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return ST_OK;
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) {
        line[--n] = '\0';
    }
    LOG_DEBUG("mhd: %s", line);
}

static int
start_mhd(srv_t *s)
{
    const cfg_t *cfg = s->cfg;
    struct sockaddr_storage ss;
    int v6 = 0;
    unsigned int flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const union MHD_DaemonInfo *di;
    size_t mem = (size_t)cfg->max_header_bytes + 16 * 1024;

    if (resolve_host(cfg->host, (uint16_t)cfg->port, &ss, &v6) != ST_OK) {
        return ST_EINVAL;
    }
    if (v6) {
        flags |= MHD_USE_IPv6;
    }
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, srv_http_access, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)cfg->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)cfg->max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)(cfg->idle_timeout_s + 0.999),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem, MHD_OPTION_NOTIFY_COMPLETED, srv_http_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, MHD_OPTION_END);
    if (s->mhd == NULL) {
        LOG_ERROR("cannot listen on %s:%d (address in use or not available)", cfg->host, cfg->port);
        return ST_EINVAL;
    }
    di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : (uint16_t)cfg->port;
    di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    CHECK(di != NULL);
    uv_poll_init(&s->loop, &s->mhd_poll, di->epoll_fd);
    s->mhd_poll.data = s;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    return ST_OK;
}

static int
srv_init(srv_t *s, const srv_setup_t *setup)
{
    const cfg_t *cfg = setup->cfg;
    static const char *names[ENG_MAX_TENANTS];
    const char *slash;

    memset(s, 0, sizeof(*s));
    s->cfg = cfg;
    /* The model's part (tokenizer, template, limits) comes when it has
     * loaded (srv_ready.c). */
    s->next_id = 1;
    s->started = time(NULL);
    list_init(&s->conns);
    list_init(&s->reqs);
    list_init(&s->suspended);
    list_init(&s->suspend_later);
    if (cfg->served_model_name[0] != '\0') {
        snprintf(s->model_name, sizeof(s->model_name), "%s", cfg->served_model_name);
    } else {
        size_t n = strlen(cfg->model);
        while (n > 1 && cfg->model[n - 1] == '/') {
            n--;
        }
        char tmp[CFG_PATH_MAX];
        snprintf(tmp, sizeof(tmp), "%.*s", (int)n, cfg->model);
        slash = strrchr(tmp, '/');
        snprintf(s->model_name, sizeof(s->model_name), "%.*s", (int)sizeof(s->model_name) - 1,
                 slash ? slash + 1 : tmp);
    }
    s->lim.max_n = cfg->max_n;
    s->lim.max_tokens_cap = cfg->max_tokens_cap;
    s->lim.kv_window = cfg->kv_policy_window;
    s->lim.max_prompts = SRV_MAX_PROMPTS;
    s->lim.max_logprobs = SMP_MAX_LOGPROBS;
    s->lim.max_depth = 32;
    s->lim.model_name = s->model_name;
    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        names[t] = cfg->tenants[t].name;
    }
    srv_metrics_init(&s->metrics, cfg->n_tenants, names);
    return ST_OK;
}

static void
walk_close(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

int
srv_run(const srv_setup_t *setup)
{
    srv_t *s = xcalloc(1, sizeof(*s));
    int rc;

    thread_set_role(THREAD_LOOP);
    signal(SIGPIPE, SIG_IGN);
    srv_init(s, setup);
    uv_loop_init(&s->loop);
    uv_async_init(&s->loop, &s->outbox_async, on_outbox);
    s->outbox_async.data = s;
    chan_init(&s->outbox, outbox_wake, s);
    uv_timer_init(&s->loop, &s->mhd_timer);
    s->mhd_timer.data = s;
    uv_idle_init(&s->loop, &s->mhd_idle);
    s->mhd_idle.data = s;
    uv_timer_init(&s->loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_timer_init(&s->loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_signal_init(&s->loop, &s->sig_term);
    s->sig_term.data = s;
    uv_signal_init(&s->loop, &s->sig_int);
    s->sig_int.data = s;

    srv_json_hooks_install();
    /* Test hook (tests/soak/faults.test.mjs): the /debug/ routes that count
     * fallible allocations and arm an allocation failure. */
    const char *hooks = getenv("KVSERVE_TEST_HOOKS");
    if (hooks != NULL && strcmp(hooks, "1") == 0) {
        LOG_WARN("KVSERVE_TEST_HOOKS=1: the /debug/ routes are enabled (tests only)");
        s->test_hooks = 1;
    }
    rc = start_mhd(s);
    if (rc != ST_OK) {
        goto out;
    }
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_timer_start(&s->sweep_timer, on_sweep, 1000, 1000);
    /* Not the "listening on" line: that one says the server is ready. */
    LOG_INFO("port open on http://%s:%u: loading the model", s->cfg->host, s->port);
    rc = srv_ready_begin(s, setup);
    if (rc != ST_OK) {
        goto out;
    }
    srv_loop_run_mhd(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = s->start_rc;

out:
    if (s->mhd != NULL) {
        stop_everything(s);
    }
    srv_work_drain(s); /* before the engine and grammar vocabulary they may use go */
    srv_ready_fini(s); /* a loader still running hands its engine over */
    if (s->engine != NULL) {
        engine_stop(s->engine);
        /* Late replies (ERROR on shutdown) still sit in the outbox: they
         * release the records of requests that never drained. */
        msg_t *m = chan_take_all(&s->outbox);
        while (m != NULL) {
            msg_t *next = m->next;
            srv_http_on_msg(s, m);
            eng_msg_free(m);
            m = next;
        }
        engine_destroy(s->engine);
        s->engine = NULL;
    }
    gr_vocab_destroy(s->gr_vocab); /* after the engine: its grammars borrow it */
    uv_walk(&s->loop, walk_close, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    chan_fini(&s->outbox);
    srv_chat_fini(s);
    srv_ready_free(s);
    LOG_INFO("stopped");
    free(s);
    return rc;
}
