/* sdnotify.h - systemd service notifications (sd_notify from libsystemd).
 *
 * kvserve runs as a Type=notify unit: READY=1 once the model is loaded and
 * the port is open, STATUS= lines with the load, WATCHDOG=1 from the loop
 * thread while the engine is alive, STOPPING=1 when the drain begins.
 * Outside systemd (no NOTIFY_SOCKET) every call is a cheap no-op that
 * returns 0.
 *
 * Thread: sdn_ready/sdn_status/sdn_stopping from any thread (each is one
 * datagram); the sdn_watchdog_* functions on the loop thread that owns the
 * uv_loop_t.
 */
#ifndef SERVER_SDNOTIFY_H
#define SERVER_SDNOTIFY_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Each returns 1 when a message was sent, 0 when there is no notification
 * socket, or a negative errno from sd_notify. They never fail the caller's
 * work: log and carry on. */
int sdn_ready(void);                    /* "READY=1\nMAINPID=<pid>" */
int sdn_stopping(void);                 /* "STOPPING=1" */
int sdn_status(const char *text);       /* "STATUS=<text>" (newlines dropped) */
int sdn_watchdog_ping(void);            /* "WATCHDOG=1" */

/* Formats the STATUS= text kvserve sends:
 * "running R, waiting W, swapped S, KV U% (used/total blocks)". */
void sdn_format_status(char *buf, size_t len, uint32_t running, uint32_t waiting,
                       uint32_t swapped, uint32_t kv_used, uint32_t kv_total);

/* WatchdogSec= of this process in microseconds (sd_watchdog_enabled), or 0
 * when the watchdog is off or meant for another pid. */
uint64_t sdn_watchdog_usec(void);

/* Loop-thread timer that keeps systemd informed. Every period it calls
 * healthy(arg) and, when that returns non-zero, sends WATCHDOG=1; a wedged
 * engine therefore stops the pings and systemd restarts the service. If
 * status is set it is called on the same tick and its text is sent as
 * STATUS= when it changed. The period is half of WatchdogSec, or
 * status_period_ms when the watchdog is off (then no WATCHDOG=1 is sent).
 * The caller owns w (zeroed or not) and keeps it alive until the close
 * callback of sdn_watchdog_stop. */
typedef struct sdn_watchdog {
    uv_timer_t timer;
    uint64_t period_ms;               /* 0 when not running */
    int watchdog_on;
    int (*healthy)(void *arg);        /* NULL: always healthy */
    void (*status)(void *arg, char *buf, size_t len); /* NULL: no STATUS= */
    void *arg;
    char last_status[256];
    uint64_t ticks;                   /* timer callbacks so far (tests) */
    uint64_t pings;                   /* WATCHDOG=1 sent */
} sdn_watchdog_t;

/* Starts the timer on loop. Returns ST_OK (also when there is nothing to do:
 * no NOTIFY_SOCKET and so no timer; period_ms stays 0), or a negative uv
 * error code. status_period_ms 0 means 2000. */
int sdn_watchdog_start(uv_loop_t *loop, sdn_watchdog_t *w, int (*healthy)(void *arg),
                       void (*status)(void *arg, char *buf, size_t len), void *arg,
                       uint64_t status_period_ms);
/* Stops and closes the timer (uv_close); safe if it never started. */
void sdn_watchdog_stop(sdn_watchdog_t *w);

#endif /* SERVER_SDNOTIFY_H */
