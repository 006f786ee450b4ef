/* sdnotify.c - sd_notify wrappers and the loop-thread watchdog timer.
 *
 * libsystemd does the protocol (NOTIFY_SOCKET, abstract sockets, MAINPID
 * checks); this file keeps the message texts in one place and turns the
 * watchdog interval into a uv_timer_t at half the period, as sd_watchdog_
 * enabled(3) recommends.
 */
#define LOG_MODULE "sdnotify"

#include "server/sdnotify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

static int
have_socket(void)
{
    const char *s = getenv("NOTIFY_SOCKET");

    return s != NULL && *s != '\0';
}

static int
notify(const char *msg)
{
    int rc;

    if (!have_socket()) {
        return 0;
    }
    rc = sd_notify(0, msg);
    if (rc < 0) {
        LOG_WARN("sd_notify: %s", st_str(rc));
    }
    return rc;
}

int
sdn_ready(void)
{
    char msg[64];

    snprintf(msg, sizeof(msg), "READY=1\nMAINPID=%ld", (long)getpid());
    return notify(msg);
}

int
sdn_stopping(void)
{
    return notify("STOPPING=1");
}

int
sdn_watchdog_ping(void)
{
    return notify("WATCHDOG=1");
}

int
sdn_status(const char *text)
{
    char msg[512];
    size_t n = 7;

    memcpy(msg, "STATUS=", 7);
    /* One line only: a newline would start a new assignment. */
    for (const char *p = text; *p != '\0' && n + 1 < sizeof(msg); p++) {
        msg[n++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
    }
    msg[n] = '\0';
    return notify(msg);
}

void
sdn_format_status(char *buf, size_t len, uint32_t running, uint32_t waiting, uint32_t swapped,
                  uint32_t kv_used, uint32_t kv_total)
{
    double pct = kv_total > 0 ? 100.0 * kv_used / kv_total : 0.0;

    snprintf(buf, len, "running %u, waiting %u, swapped %u, KV %.1f%% (%u/%u blocks)", running,
             waiting, swapped, pct, kv_used, kv_total);
}

uint64_t
sdn_watchdog_usec(void)
{
    uint64_t usec = 0;

    if (sd_watchdog_enabled(0, &usec) <= 0) {
        return 0;
    }
    return usec;
}

static void
watchdog_tick(uv_timer_t *t)
{
    sdn_watchdog_t *w = t->data;
    char text[sizeof(w->last_status)];

    w->ticks++;
    if (w->watchdog_on && (w->healthy == NULL || w->healthy(w->arg))) {
        if (sdn_watchdog_ping() > 0) {
            w->pings++;
        }
    }
    if (w->status != NULL) {
        text[0] = '\0';
        w->status(w->arg, text, sizeof(text));
        if (text[0] != '\0' && strcmp(text, w->last_status) != 0) {
            sdn_status(text);
            memcpy(w->last_status, text, sizeof(text));
        }
    }
}

int
sdn_watchdog_start(uv_loop_t *loop, sdn_watchdog_t *w, int (*healthy)(void *arg),
                   void (*status)(void *arg, char *buf, size_t len), void *arg,
                   uint64_t status_period_ms)
{
    uint64_t usec;
    int rc;

    memset(w, 0, sizeof(*w));
    w->healthy = healthy;
    w->status = status;
    w->arg = arg;
    if (!have_socket()) {
        return ST_OK;
    }
    usec = sdn_watchdog_usec();
    if (usec > 0) {
        w->watchdog_on = 1;
        w->period_ms = usec / 2000;
        if (w->period_ms == 0) {
            w->period_ms = 1;
        }
        LOG_INFO("systemd watchdog %llu ms: pinging every %llu ms",
                 (unsigned long long)(usec / 1000), (unsigned long long)w->period_ms);
    } else if (status != NULL) {
        w->period_ms = status_period_ms > 0 ? status_period_ms : 2000;
    } else {
        return ST_OK;
    }
    rc = uv_timer_init(loop, &w->timer);
    if (rc < 0) {
        w->period_ms = 0;
        return rc;
    }
    w->timer.data = w;
    /* First tick at once: systemd counts from READY=1. */
    rc = uv_timer_start(&w->timer, watchdog_tick, 0, w->period_ms);
    if (rc < 0) {
        uv_close((uv_handle_t *)&w->timer, NULL);
        w->period_ms = 0;
        return rc;
    }
    /* The timer alone must not keep the loop running. */
    uv_unref((uv_handle_t *)&w->timer);
    return ST_OK;
}

void
sdn_watchdog_stop(sdn_watchdog_t *w)
{
    if (w->period_ms == 0) {
        return;
    }
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, NULL);
    w->period_ms = 0;
}
