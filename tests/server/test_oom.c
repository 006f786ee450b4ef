/* test_oom.c - the fallible allocator's hooks (count, re-armable failure,
 * per-thread failure count), buffers and error bodies under allocation
 * failure, request parsing failing cleanly at every allocation site, and
 * the HTTP status of engine errors (client refusals 4xx, engine failures
 * 5xx). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "server/srv_int.h"

START_TEST(test_hook_count_and_rearm)
{
    unsigned long c0 = xmalloc_try_count(), f0 = xmalloc_try_failures();
    void *p, *q;

    xmalloc_fail_after(0);
    p = xmalloc_try(8);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(xmalloc_try_count(), c0 + 1);
    /* Re-armed any number of times; each fires once. */
    for (int round = 0; round < 3; round++) {
        xmalloc_fail_after(2);
        ck_assert_int_eq(xmalloc_fail_pending(), 2);
        q = xstrdup_try("abc");
        ck_assert_str_eq(q, "abc");
        free(q);
        ck_assert_int_eq(xmalloc_fail_pending(), 1);
        /* A failed realloc leaves the block as it was. */
        ck_assert_ptr_null(xrealloc_try(p, 64));
        ck_assert_int_eq(xmalloc_fail_pending(), 0);
        ck_assert_uint_eq(xmalloc_try_failures(), f0 + (unsigned long)round + 1);
        memset(p, 7, 8);
    }
    q = xcalloc_try(4, 4);
    ck_assert_ptr_nonnull(q);
    ck_assert_int_eq(((int *)q)[3], 0);
    free(q);
    ck_assert_ptr_null(xcalloc_try((size_t)-1 / 2, 4)); /* overflow */
    ck_assert_uint_eq(xmalloc_try_count(), c0 + 1 + 3 * 2 + 2);
    free(p);
}
END_TEST

START_TEST(test_buf_oom)
{
    srv_buf_t b = {0};

    srv_buf_adds(&b, "kept");
    xmalloc_fail_after(1);
    srv_buf_add(&b, "x", 300); /* needs to grow: fails */
    ck_assert(b.oom);
    ck_assert_uint_eq(b.len, 4);
    ck_assert_str_eq(b.data, "kept");
    srv_buf_adds(&b, "!"); /* fits: still appended, oom stays set */
    ck_assert_str_eq(b.data, "kept!");
    ck_assert(b.oom);
    srv_buf_free(&b);
    ck_assert(!b.oom);
}
END_TEST

START_TEST(test_error_bodies)
{
    srv_error_t err;
    char *j;
    cJSON *root;

    srv_err_set(&err, 400, "stop", "bad \"quote\"\n\x01 ok");
    j = srv_err_json(&err);
    root = cJSON_Parse(j);
    ck_assert_ptr_nonnull(root);
    char *again = cJSON_PrintUnformatted(root);
    ck_assert_str_eq(j, again); /* the bytes cJSON would print */
    free(again);
    cJSON_Delete(root);
    free(j);

    xmalloc_fail_after(1);
    ck_assert_ptr_null(srv_err_json(&err));

    srv_err_oom(&err);
    ck_assert_int_eq(err.status, 503);
    j = srv_err_json(&err);
    ck_assert_str_eq(j, srv_oom_json); /* the static body is the same error */
    free(j);
}
END_TEST

static const srv_limits_t lim = {
    .max_n = 8,
    .max_model_len = 256,
    .vocab_size = 1024,
    .max_prompts = 4,
    .max_logprobs = 20,
    .max_depth = 8,
    .model_name = "austen",
};

/* Fails every allocation site of one parse in turn: each gives the 503
 * and leaves nothing allocated (LeakSanitizer), one past the last
 * succeeds. Returns the number of sites. */
static int
parse_every_site(int kind, const char *body)
{
    srv_params_t p;
    srv_error_t err;
    int n;

    srv_json_hooks_install();
    for (n = 1;; n++) {
        xmalloc_fail_after(n);
        int ok = srv_params_parse(kind, body, strlen(body), &lim, &p, &err);
        if (xmalloc_fail_pending() != 0) {
            ck_assert_msg(ok, "site %d: %s", n, err.message);
            xmalloc_fail_after(0);
            srv_params_free(&p);
            break;
        }
        ck_assert_msg(!ok, "site %d of %s: parsed despite the failure", n, body);
        ck_assert_int_eq(err.status, 503);
        ck_assert_str_eq(err.type, "service_unavailable_error");
    }
    cJSON_InitHooks(NULL);
    return n - 1;
}

START_TEST(test_parse_every_site)
{
    int c = parse_every_site(SRV_KIND_COMPLETION,
                             "{\"model\":\"austen\",\"prompt\":[\"a b\",\"c\"],\"stop\":[\"x\",\"y\"],"
                             "\"logit_bias\":{\"5\":1,\"6\":-2},\"max_tokens\":4}");
    int t = parse_every_site(SRV_KIND_COMPLETION,
                             "{\"model\":\"austen\",\"prompt\":[[1,2,3],[4]],\"stop\":\"z\"}");
    int m = parse_every_site(SRV_KIND_CHAT,
                             "{\"model\":\"austen\",\"messages\":[{\"role\":\"system\","
                             "\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":"
                             "\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}");

    /* cJSON nodes and the parser's own copies. */
    ck_assert_int_ge(c, 20);
    ck_assert_int_ge(t, 10);
    ck_assert_int_ge(m, 15);
}
END_TEST

START_TEST(test_plain_chat_oom)
{
    srv_chat_msg_t msgs[2] = {{"system", "s"}, {"user", "u"}};
    char *out;

    xmalloc_fail_after(1);
    ck_assert_ptr_null(srv_chat_render_plain(msgs, 2, 1, "<s>"));
    out = srv_chat_render_plain(msgs, 2, 1, "<s>");
    ck_assert_ptr_nonnull(out);
    free(out);
}
END_TEST

START_TEST(test_engine_error_status)
{
    /* Refusals of the client's request. */
    ck_assert_int_eq(srv_http_status_of(ST_EINVAL, 0), 400);
    ck_assert_int_eq(srv_http_status_of(ST_ETOOLONG, 0), 400);
    ck_assert_int_eq(srv_http_status_of(ST_ERANGE, 0), 400);
    ck_assert_int_eq(srv_http_status_of(ST_EQUEUE, 0), 429);
    ck_assert_int_eq(srv_http_status_of(ST_ESHUTDOWN, 0), 503);
    ck_assert_int_eq(srv_http_status_of(ST_ENOMEM, 0), 503);
    ck_assert_int_eq(srv_http_status_of(ST_ECUDA, 0), 500);
    /* The engine failed (a forward returning ST_EINVAL, a device error):
     * never the client's fault. */
    ck_assert_int_eq(srv_http_status_of(ST_EINVAL, 1), 500);
    ck_assert_int_eq(srv_http_status_of(ST_ERANGE, 1), 500);
    ck_assert_int_eq(srv_http_status_of(ST_ETOOLONG, 1), 500);
    ck_assert_int_eq(srv_http_status_of(ST_EQUEUE, 1), 500);
    ck_assert_int_eq(srv_http_status_of(ST_ECUDA, 1), 500);
    ck_assert_int_eq(srv_http_status_of(ST_ESHUTDOWN, 1), 503);
}
END_TEST

Suite *
server_oom_suite(void)
{
    Suite *s = suite_create("server_oom");
    TCase *tc = tcase_create("oom");

    tcase_add_test(tc, test_hook_count_and_rearm);
    tcase_add_test(tc, test_buf_oom);
    tcase_add_test(tc, test_error_bodies);
    tcase_add_test(tc, test_parse_every_site);
    tcase_add_test(tc, test_plain_chat_oom);
    tcase_add_test(tc, test_engine_error_status);
    suite_add_tcase(s, tc);
    return s;
}
