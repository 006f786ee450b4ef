/* test_lt_proto.c - kvs-loadtest's HTTP response parser, SSE splitter,
 * length distributions and percentiles. Responses are fed whole and cut at
 * every byte position, so reads that split lines or chunks are covered.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/lt.h"

typedef struct collect {
    char body[8192];
    size_t n;
    char events[16][256];
    int n_events;
} collect_t;

static void
on_body(void *arg, const char *data, size_t n)
{
    collect_t *c = arg;

    ck_assert_uint_lt(c->n + n, sizeof(c->body));
    memcpy(c->body + c->n, data, n);
    c->n += n;
    c->body[c->n] = '\0';
}

static void
on_event(void *arg, const char *data, size_t n)
{
    collect_t *c = arg;

    ck_assert_int_lt(c->n_events, 16);
    ck_assert_uint_lt(n, 256);
    memcpy(c->events[c->n_events], data, n);
    c->events[c->n_events][n] = '\0';
    c->n_events++;
}

/* Parses resp in two pieces cut at split; returns consumed bytes in total. */
static size_t
parse_split(lt_http_t *h, collect_t *c, const char *resp, size_t split)
{
    size_t len = strlen(resp), used;

    lt_http_init(h);
    memset(c, 0, sizeof(*c));
    used = lt_http_feed(h, resp, split, on_body, c);
    if (used == split && h->state != LT_HTTP_DONE) {
        used += lt_http_feed(h, resp + split, len - split, on_body, c);
    }
    return used;
}

START_TEST(test_content_length_every_split)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               "content-length: 11\r\nRetry-After: 3\r\n\r\n{\"a\":\"xyz\"}";
    lt_http_t h;
    collect_t c;

    for (size_t s = 0; s <= strlen(resp); s++) {
        ck_assert_uint_eq(parse_split(&h, &c, resp, s), strlen(resp));
        ck_assert_int_eq(h.state, LT_HTTP_DONE);
        ck_assert_int_eq(h.status, 200);
        ck_assert_int_eq(h.keep_alive, 1);
        ck_assert_int_eq(h.event_stream, 0);
        ck_assert_str_eq(c.body, "{\"a\":\"xyz\"}");
        ck_assert_str_eq(h.retry_after, "3");
    }
}
END_TEST

START_TEST(test_chunked_sse_every_split)
{
    static const char resp[] = "HTTP/1.1 200 OK\r\n"
                               "Content-Type: text/event-stream; charset=utf-8\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n"
                               "d\r\ndata: {\"a\":1}\r\n"
                               "4;ext=1\r\n\n\nda\r\n"
                               "14\r\nta: x\ndata: y\r\n\r\n: c\r\n"
                               "e\r\n\ndata: [DONE]\r\n"
                               "2\r\n\n\n\r\n"
                               "0\r\nX-Trailer: 1\r\n\r\n";
    lt_http_t h;
    collect_t c, ev;
    lt_sse_t sse;

    for (size_t s = 0; s <= strlen(resp); s++) {
        ck_assert_uint_eq(parse_split(&h, &c, resp, s), strlen(resp));
        ck_assert_int_eq(h.state, LT_HTTP_DONE);
        ck_assert_int_eq(h.event_stream, 1);
        ck_assert_int_eq(h.chunked, 1);
        /* The de-chunked body, fed to SSE one byte at a time. */
        memset(&ev, 0, sizeof(ev));
        lt_sse_init(&sse, 1024);
        for (size_t i = 0; i < c.n; i++) {
            ck_assert_int_eq(lt_sse_feed(&sse, c.body + i, 1, on_event, &ev), 0);
        }
        lt_sse_free(&sse);
        ck_assert_int_eq(ev.n_events, 3);
        ck_assert_str_eq(ev.events[0], "{\"a\":1}");
        ck_assert_str_eq(ev.events[1], "x\ny");
        ck_assert_str_eq(ev.events[2], "[DONE]");
    }
}
END_TEST

START_TEST(test_pipelined_rest_not_consumed)
{
    static const char two[] = "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n";
    lt_http_t h;
    size_t used;

    lt_http_init(&h);
    used = lt_http_feed(&h, two, strlen(two), NULL, NULL);
    ck_assert_int_eq(h.state, LT_HTTP_DONE);
    ck_assert_int_eq(h.status, 204);
    ck_assert_uint_eq(used, strlen("HTTP/1.1 204 No Content\r\n\r\n"));
}
END_TEST

START_TEST(test_body_until_eof_and_close)
{
    static const char resp[] = "HTTP/1.0 503 Service Unavailable\r\n\r\nbye";
    lt_http_t h;
    collect_t c;

    parse_split(&h, &c, resp, 10);
    ck_assert_int_eq(h.state, LT_HTTP_BODY_EOF);
    ck_assert_int_eq(h.keep_alive, 0);
    ck_assert_int_eq(lt_http_eof(&h), 1);
    ck_assert_int_eq(h.status, 503);
    ck_assert_str_eq(c.body, "bye");

    parse_split(&h, &c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nab", 5);
    ck_assert_int_eq(h.keep_alive, 0);
    ck_assert_int_eq(lt_http_eof(&h), 0); /* cut short */
}
END_TEST

START_TEST(test_interim_100)
{
    static const char resp[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 401 Unauthorized\r\n"
                               "Content-Length: 2\r\n\r\n{}";
    lt_http_t h;
    collect_t c;

    for (size_t s = 0; s <= strlen(resp); s++) {
        parse_split(&h, &c, resp, s);
        ck_assert_int_eq(h.state, LT_HTTP_DONE);
        ck_assert_int_eq(h.status, 401);
        ck_assert_str_eq(c.body, "{}");
    }
}
END_TEST

START_TEST(test_malformed)
{
    static const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "garbage\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
    };
    lt_http_t h;
    char big[9000];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lt_http_init(&h);
        lt_http_feed(&h, bad[i], strlen(bad[i]), NULL, NULL);
        ck_assert_msg(h.state == LT_HTTP_ERROR, "accepted: %s", bad[i]);
    }
    memset(big, 'a', sizeof(big));
    lt_http_init(&h);
    lt_http_feed(&h, "HTTP/1.1 200 OK\r\nX: ", 21, NULL, NULL);
    lt_http_feed(&h, big, sizeof(big), NULL, NULL);
    ck_assert_int_eq(h.state, LT_HTTP_ERROR);
}
END_TEST

START_TEST(test_sse_limits_and_crlf)
{
    lt_sse_t s;
    collect_t ev;
    static const char crlf[] = "event: x\r\ndata:no-space\r\nid: 1\r\n\r\n:comment\r\n\r\n";
    char big[300];

    memset(&ev, 0, sizeof(ev));
    lt_sse_init(&s, 100);
    ck_assert_int_eq(lt_sse_feed(&s, crlf, strlen(crlf), on_event, &ev), 0);
    ck_assert_int_eq(ev.n_events, 1); /* the comment-only event carries no data */
    ck_assert_str_eq(ev.events[0], "no-space");
    memset(big, 'x', sizeof(big));
    ck_assert_int_eq(lt_sse_feed(&s, big, sizeof(big), on_event, &ev), -1);
    lt_sse_free(&s);
}
END_TEST

START_TEST(test_dist)
{
    lt_dist_t d;
    uint64_t rng = 12345;
    double sum = 0;

    ck_assert_int_eq(lt_dist_parse("128", &d), 0);
    ck_assert_int_eq(lt_dist_draw(&d, &rng), 128);
    ck_assert_int_eq(lt_dist_parse("10-12", &d), 0);
    for (int i = 0; i < 1000; i++) {
        int32_t v = lt_dist_draw(&d, &rng);
        ck_assert(v >= 10 && v <= 12);
    }
    ck_assert_int_eq(lt_dist_parse("normal:100:10", &d), 0);
    for (int i = 0; i < 4000; i++) {
        sum += lt_dist_draw(&d, &rng);
    }
    ck_assert_double_eq_tol(sum / 4000, 100, 1.5);
    ck_assert_int_eq(lt_dist_parse("exp:50", &d), 0);
    sum = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t v = lt_dist_draw(&d, &rng);
        ck_assert_int_ge(v, 1);
        sum += v;
    }
    ck_assert_double_eq_tol(sum / 4000, 50, 4);
    ck_assert_int_eq(lt_dist_parse("0", &d), -1);
    ck_assert_int_eq(lt_dist_parse("1.5", &d), -1);
    ck_assert_int_eq(lt_dist_parse("12-10", &d), -1);
    ck_assert_int_eq(lt_dist_parse("10-", &d), -1);
    ck_assert_int_eq(lt_dist_parse("normal:5", &d), -1);
    ck_assert_int_eq(lt_dist_parse("exp:", &d), -1);
    ck_assert_int_eq(lt_dist_parse("x", &d), -1);
}
END_TEST

START_TEST(test_quantiles)
{
    lt_vec_t v = {0};
    lt_summary_t s;

    lt_summarize(&v, &s);
    ck_assert_uint_eq(s.n, 0);
    for (int i = 10; i >= 1; i--) {
        lt_vec_push(&v, i);
    }
    lt_summarize(&v, &s);
    /* numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91 */
    ck_assert_double_eq_tol(s.p50, 5.5, 1e-12);
    ck_assert_double_eq_tol(s.p90, 9.1, 1e-12);
    ck_assert_double_eq_tol(s.p99, 9.91, 1e-12);
    ck_assert_double_eq(s.min, 1);
    ck_assert_double_eq(s.max, 10);
    ck_assert_double_eq_tol(s.mean, 5.5, 1e-12);
    ck_assert_double_eq(lt_quantile(v.v, 1, 0.99), 1);
    lt_vec_free(&v);
}
END_TEST

Suite *
loadtest_proto_suite(void)
{
    Suite *s = suite_create("lt_proto");
    TCase *tc = tcase_create("proto");

    tcase_add_test(tc, test_content_length_every_split);
    tcase_add_test(tc, test_chunked_sse_every_split);
    tcase_add_test(tc, test_pipelined_rest_not_consumed);
    tcase_add_test(tc, test_body_until_eof_and_close);
    tcase_add_test(tc, test_interim_100);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_sse_limits_and_crlf);
    tcase_add_test(tc, test_dist);
    tcase_add_test(tc, test_quantiles);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(loadtest_proto_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
