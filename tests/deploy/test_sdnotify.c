/* test_sdnotify.c - the sd_notify messages kvserve sends, observed through a
 * NOTIFY_SOCKET (unix datagram socket) the test creates, as systemd would.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "common/status.h"
#include "server/sdnotify.h"

static int sock = -1;
static char sock_path[108];

static void
setup(void)
{
    struct sockaddr_un sa;

    snprintf(sock_path, sizeof(sock_path), "/tmp/kvs-notify-%ld", (long)getpid());
    unlink(sock_path);
    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(sock, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    strcpy(sa.sun_path, sock_path);
    ck_assert_int_eq(bind(sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setenv("NOTIFY_SOCKET", sock_path, 1);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

static void
teardown(void)
{
    close(sock);
    unlink(sock_path);
    unsetenv("NOTIFY_SOCKET");
}

/* Next datagram into buf (NUL-terminated); blocking unless nonblock. Returns
 * its length or -1 when none is waiting (nonblock). */
static ssize_t
recv_msg(char *buf, size_t len, int nonblock)
{
    ssize_t n = recv(sock, buf, len - 1, nonblock ? MSG_DONTWAIT : 0);

    if (n < 0) {
        return -1;
    }
    buf[n] = '\0';
    return n;
}

START_TEST(test_ready_status_stopping)
{
    char buf[1024];
    char want[64];

    ck_assert_int_eq(sdn_ready(), 1);
    ck_assert_int_gt(recv_msg(buf, sizeof(buf), 0), 0);
    snprintf(want, sizeof(want), "READY=1\nMAINPID=%ld", (long)getpid());
    ck_assert_str_eq(buf, want);

    ck_assert_int_eq(sdn_status("running 1\nwaiting 2"), 1);
    recv_msg(buf, sizeof(buf), 0);
    ck_assert_str_eq(buf, "STATUS=running 1 waiting 2");

    ck_assert_int_eq(sdn_watchdog_ping(), 1);
    recv_msg(buf, sizeof(buf), 0);
    ck_assert_str_eq(buf, "WATCHDOG=1");

    ck_assert_int_eq(sdn_stopping(), 1);
    recv_msg(buf, sizeof(buf), 0);
    ck_assert_str_eq(buf, "STOPPING=1");
    ck_assert_int_eq(recv_msg(buf, sizeof(buf), 1), -1);
}
END_TEST

START_TEST(test_no_socket_is_noop)
{
    char buf[64];
    sdn_watchdog_t w;

    unsetenv("NOTIFY_SOCKET");
    ck_assert_int_eq(sdn_ready(), 0);
    ck_assert_int_eq(sdn_status("x"), 0);
    ck_assert_int_eq(sdn_stopping(), 0);
    ck_assert_int_eq(sdn_watchdog_start(uv_default_loop(), &w, NULL, NULL, NULL, 0), ST_OK);
    ck_assert_int_eq(w.period_ms, 0);
    sdn_watchdog_stop(&w);
    ck_assert_int_eq(recv_msg(buf, sizeof(buf), 1), -1);
}
END_TEST

START_TEST(test_format_status)
{
    char buf[128];

    sdn_format_status(buf, sizeof(buf), 3, 1, 0, 50, 200);
    ck_assert_str_eq(buf, "running 3, waiting 1, swapped 0, KV 25.0% (50/200 blocks)");
    sdn_format_status(buf, sizeof(buf), 0, 0, 0, 0, 0);
    ck_assert_str_eq(buf, "running 0, waiting 0, swapped 0, KV 0.0% (0/0 blocks)");
}
END_TEST

START_TEST(test_watchdog_usec)
{
    char pid[32];

    ck_assert_int_eq(sdn_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "4000000", 1);
    ck_assert_int_eq(sdn_watchdog_usec(), 4000000);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1); /* meant for another process */
    ck_assert_int_eq(sdn_watchdog_usec(), 0);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    ck_assert_int_eq(sdn_watchdog_usec(), 4000000);
}
END_TEST

typedef struct wd_test {
    sdn_watchdog_t w;
    int healthy;
    int calls;
    int stop_after;
    uint32_t running;
} wd_test_t;

static int
wd_healthy(void *arg)
{
    wd_test_t *t = arg;

    return t->healthy;
}

/* Status callback doubles as the loop's stop condition. */
static void
wd_status(void *arg, char *buf, size_t len)
{
    wd_test_t *t = arg;

    sdn_format_status(buf, len, t->running, 0, 0, t->running * 10, 100);
    if (++t->calls == 2) {
        t->running = 2;
    }
    if (t->calls >= t->stop_after) {
        sdn_watchdog_stop(&t->w);
    }
}

/* Runs the watchdog timer for t->stop_after ticks. */
static void
run_watchdog(wd_test_t *t)
{
    uv_loop_t loop;

    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(sdn_watchdog_start(&loop, &t->w, wd_healthy, wd_status, t, 0), ST_OK);
    ck_assert_int_gt(t->w.period_ms, 0);
    uv_ref((uv_handle_t *)&t->w.timer); /* nothing else keeps this loop alive */
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

START_TEST(test_watchdog_pings_when_healthy)
{
    wd_test_t t = {.healthy = 1, .stop_after = 4, .running = 1};
    char buf[256];
    int pings = 0, statuses = 0;

    setenv("WATCHDOG_USEC", "20000", 1); /* 20 ms: ping every 10 ms */
    run_watchdog(&t);
    ck_assert_int_eq(t.w.ticks, 4);
    ck_assert_int_eq(t.w.pings, 4);
    while (recv_msg(buf, sizeof(buf), 1) > 0) {
        if (strcmp(buf, "WATCHDOG=1") == 0) {
            pings++;
        } else {
            ck_assert_msg(strncmp(buf, "STATUS=running ", 15) == 0, "%s", buf);
            statuses++;
        }
    }
    ck_assert_int_eq(pings, 4);
    /* Sent only when the text changed: "running 1" then "running 2". */
    ck_assert_int_eq(statuses, 2);
}
END_TEST

START_TEST(test_watchdog_silent_when_unhealthy)
{
    wd_test_t t = {.healthy = 0, .stop_after = 3};
    char buf[256];

    setenv("WATCHDOG_USEC", "20000", 1);
    run_watchdog(&t);
    ck_assert_int_eq(t.w.ticks, 3);
    ck_assert_int_eq(t.w.pings, 0);
    while (recv_msg(buf, sizeof(buf), 1) > 0) {
        ck_assert_msg(strcmp(buf, "WATCHDOG=1") != 0, "pinged while unhealthy");
    }
}
END_TEST

START_TEST(test_status_timer_without_watchdog)
{
    wd_test_t t = {.healthy = 1, .stop_after = 2, .running = 0};
    uv_loop_t loop;
    char buf[256];

    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(sdn_watchdog_start(&loop, &t.w, wd_healthy, wd_status, &t, 5), ST_OK);
    ck_assert_int_eq(t.w.period_ms, 5);
    ck_assert_int_eq(t.w.watchdog_on, 0);
    uv_ref((uv_handle_t *)&t.w.timer);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    ck_assert_int_eq(t.w.pings, 0);
    recv_msg(buf, sizeof(buf), 0);
    ck_assert_str_eq(buf, "STATUS=running 0, waiting 0, swapped 0, KV 0.0% (0/100 blocks)");
    ck_assert_int_eq(recv_msg(buf, sizeof(buf), 1), -1); /* unchanged: not resent */
}
END_TEST

Suite *
deploy_sdnotify_suite(void)
{
    Suite *s = suite_create("sdnotify");
    TCase *tc = tcase_create("notify");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_ready_status_stopping);
    tcase_add_test(tc, test_no_socket_is_noop);
    tcase_add_test(tc, test_format_status);
    tcase_add_test(tc, test_watchdog_usec);
    tcase_add_test(tc, test_watchdog_pings_when_healthy);
    tcase_add_test(tc, test_watchdog_silent_when_unhealthy);
    tcase_add_test(tc, test_status_timer_without_watchdog);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(deploy_sdnotify_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
