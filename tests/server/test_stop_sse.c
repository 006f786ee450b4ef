/* test_stop_sse.c - stop strings across token boundaries, SSE framing, token
 * text sanitizing and the plain chat template. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_int.h"

/* Feeds pieces one by one; returns the released text and whether it hit. */
static int
run(const char *const *stop, int n_stop, const char *const *pieces, int n_pieces, srv_buf_t *out)
{
    srv_stop_t s;
    int hit = 0;

    srv_stop_init(&s, stop, n_stop);
    for (int i = 0; i < n_pieces && !hit; i++) {
        hit = srv_stop_feed(&s, pieces[i], strlen(pieces[i]), out);
    }
    if (!hit) {
        srv_stop_finish(&s, out);
    }
    srv_stop_free(&s);
    srv_buf_add(out, "", 0);
    return hit;
}

START_TEST(test_stop_across_tokens)
{
    const char *stop[] = {"END"};
    const char *pieces[] = {"hello E", "N", "D and more"};
    srv_buf_t out = {0};

    ck_assert(run(stop, 1, pieces, 3, &out));
    ck_assert_str_eq(out.data, "hello ");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_stop_false_prefix_released)
{
    const char *stop[] = {"END"};
    const char *pieces[] = {"an E", "NTRY", " here"};
    srv_buf_t out = {0};
    srv_stop_t s;

    ck_assert(!run(stop, 1, pieces, 3, &out));
    ck_assert_str_eq(out.data, "an ENTRY here");
    srv_buf_free(&out);

    /* The held part is released as soon as it cannot be a stop string. */
    srv_stop_init(&s, stop, 1);
    ck_assert(!srv_stop_feed(&s, "xE", 2, &out));
    srv_buf_add(&out, "", 0);
    ck_assert_str_eq(out.data, "x");
    ck_assert(!srv_stop_feed(&s, "Nz", 2, &out));
    ck_assert_str_eq(out.data, "xENz");
    srv_stop_free(&s);
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_stop_earliest_of_several)
{
    const char *stop[] = {"world", "lo w", "\n\n"};
    const char *pieces[] = {"hel", "lo wor", "ld"};
    srv_buf_t out = {0};

    ck_assert(run(stop, 3, pieces, 3, &out));
    ck_assert_str_eq(out.data, "hel");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_stop_in_one_piece_and_at_start)
{
    const char *stop[] = {"."};
    const char *pieces[] = {"Yes. No."};
    const char *pieces2[] = {".", "x"};
    srv_buf_t out = {0};

    ck_assert(run(stop, 1, pieces, 1, &out));
    ck_assert_str_eq(out.data, "Yes");
    srv_buf_free(&out);
    ck_assert(run(stop, 1, pieces2, 2, &out));
    ck_assert_str_eq(out.data, "");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_stop_utf8)
{
    const char *stop[] = {"\xC3\xA9t\xC3\xA9"}; /* "ete" with accents */
    const char *pieces[] = {"l'\xC3\xA9", "t", "\xC3\xA9 fini"};
    srv_buf_t out = {0};

    ck_assert(run(stop, 1, pieces, 3, &out));
    ck_assert_str_eq(out.data, "l'");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_no_stop_passthrough)
{
    const char *pieces[] = {"a", "b", "c"};
    srv_buf_t out = {0};

    ck_assert(!run(NULL, 0, pieces, 3, &out));
    ck_assert_str_eq(out.data, "abc");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_held_text_released_at_finish)
{
    const char *stop[] = {"STOP"};
    const char *pieces[] = {"to ST", "O"};
    srv_buf_t out = {0};

    ck_assert(!run(stop, 1, pieces, 2, &out));
    ck_assert_str_eq(out.data, "to STO");
    srv_buf_free(&out);
}
END_TEST

START_TEST(test_sse_framing)
{
    srv_buf_t b = {0};

    srv_sse_data(&b, "{\"a\":1}");
    srv_sse_done(&b);
    ck_assert_str_eq(b.data, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    srv_buf_consume(&b, 6);
    ck_assert_str_eq(b.data, "{\"a\":1}\n\ndata: [DONE]\n\n");
    srv_buf_consume(&b, 1000);
    ck_assert_uint_eq(b.len, 0);
    srv_buf_free(&b);
}
END_TEST

START_TEST(test_json_string_matches_cjson)
{
    static const char *cases[] = {"",
                                  "plain",
                                  "q\"uote\\back",
                                  "nl\ntab\tcr\rbs\bff\f",
                                  "ctl\x01\x1f end",
                                  "utf8 \xC3\xA9\xE2\x82\xAC \xF0\x9F\x98\x80"};

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        srv_buf_t b = {0};
        cJSON *j = cJSON_CreateString(cases[i]);
        char *ref = cJSON_PrintUnformatted(j);

        srv_json_string(&b, cases[i], strlen(cases[i]));
        ck_assert_str_eq(b.data, ref);
        free(ref);
        cJSON_Delete(j);
        srv_buf_free(&b);
    }
}
END_TEST

START_TEST(test_token_text)
{
    srv_buf_t b = {0};

    srv_token_text("ab\xE2\x82", 4, &b); /* truncated euro sign */
    ck_assert_str_eq(b.data, "ab\xEF\xBF\xBD\xEF\xBF\xBD");
    srv_buf_free(&b);
    srv_token_text("\xE2\x82\xAC", 3, &b);
    ck_assert_str_eq(b.data, "\xE2\x82\xAC");
    srv_buf_free(&b);
    srv_token_text("", 0, &b);
    ck_assert_str_eq(b.data, "");
    srv_buf_free(&b);
}
END_TEST

START_TEST(test_plain_chat_template)
{
    srv_chat_msg_t m[2] = {{"system", "Be kind."}, {"user", "Hello"}};
    char *t = srv_chat_render_plain(m, 2, 1, "<s>");

    ck_assert_str_eq(t, "<s>system: Be kind.\nuser: Hello\nassistant:");
    free(t);
    t = srv_chat_render_plain(m, 2, 0, NULL);
    ck_assert_str_eq(t, "system: Be kind.\nuser: Hello\n");
    free(t);
}
END_TEST

Suite *
server_stop_sse_suite(void)
{
    Suite *s = suite_create("server_stop_sse");
    TCase *tc = tcase_create("stop");

    tcase_add_test(tc, test_stop_across_tokens);
    tcase_add_test(tc, test_stop_false_prefix_released);
    tcase_add_test(tc, test_stop_earliest_of_several);
    tcase_add_test(tc, test_stop_in_one_piece_and_at_start);
    tcase_add_test(tc, test_stop_utf8);
    tcase_add_test(tc, test_no_stop_passthrough);
    tcase_add_test(tc, test_held_text_released_at_finish);
    tcase_add_test(tc, test_sse_framing);
    tcase_add_test(tc, test_json_string_matches_cjson);
    tcase_add_test(tc, test_token_text);
    tcase_add_test(tc, test_plain_chat_template);
    suite_add_tcase(s, tc);
    return s;
}
