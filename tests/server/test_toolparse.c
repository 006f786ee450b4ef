/* test_toolparse.c - the tool-call and reasoning output parsers
 * (server/srv_toolparse.h) on fixed model texts: each text parsed whole,
 * split in two at every byte, and fed byte by byte must give the same
 * content, reasoning and calls, and the stream events joined must give
 * them too. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_toolparse.h"

typedef struct tp_case {
    const char *name;
    int format, mode, reason, parallel;
    const char *named;
    const char *text;
    const char *content;   /* expected */
    const char *reasoning; /* expected */
    int n_calls;
    const char *calls[3][2]; /* name, arguments */
} tp_case_t;

static const tp_case_t cases[] = {
    {"hermes one call", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>",
     "Let me check.", "", 1, {{"get_weather", "{\"city\":\"Paris\"}"}}},
    {"hermes two calls", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":1}}</tool_call>\n<tool_call>{\"name\":"
     "\"b\",\"arguments\":{}}</tool_call>\n",
     "", "", 2, {{"a", "{\"x\":1}"}, {"b", "{}"}}},
    {"hermes parallel off", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 0, NULL,
     "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":1}}</tool_call>\n<tool_call>{\"name\":"
     "\"b\",\"arguments\":{}}</tool_call>",
     "", "", 1, {{"a", "{\"x\":1}"}}},
    {"hermes bad json is content", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "<tool_call>{bad json}</tool_call> after", "<tool_call>{bad json}</tool_call> after", "", 0,
     {{0}}},
    {"hermes text with a marker prefix", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "a < b and <tool", "a < b and <tool", "", 0, {{0}}},
    {"hermes unclosed call at the end", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "<tool_call>{\"name\":\"f\",\"arguments\":{\"k\":[1,2]}}", "", "", 1,
     {{"f", "{\"k\":[1,2]}"}}},
    {"hermes arguments as a string", SRV_TP_FMT_HERMES, SRV_TP_AUTO, 0, 1, NULL,
     "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":true}\"}</tool_call>", "", "", 1,
     {{"f", "{\"a\":true}"}}},
    {"llama3 python tag", SRV_TP_FMT_LLAMA3, SRV_TP_AUTO, 0, 1, NULL,
     "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}", "", "", 1,
     {{"f", "{\"x\":1}"}}},
    {"llama3 two calls", SRV_TP_FMT_LLAMA3, SRV_TP_AUTO, 0, 1, NULL,
     " {\"name\":\"f\",\"parameters\":{}}; {\"name\":\"g\",\"arguments\":{\"a\":\"b\"}}", "", "",
     2, {{"f", "{}"}, {"g", "{\"a\":\"b\"}"}}},
    {"llama3 text", SRV_TP_FMT_LLAMA3, SRV_TP_AUTO, 0, 1, NULL, "Hello {world}",
     "Hello {world}", "", 0, {{0}}},
    {"llama3 truncated json", SRV_TP_FMT_LLAMA3, SRV_TP_AUTO, 0, 1, NULL,
     "{\"name\": \"f\", \"param", "{\"name\": \"f\", \"param", "", 0, {{0}}},
    {"llama3 object without name", SRV_TP_FMT_LLAMA3, SRV_TP_AUTO, 0, 1, NULL, "{\"a\": 1}",
     "{\"a\": 1}", "", 0, {{0}}},
    {"mistral marker", SRV_TP_FMT_MISTRAL, SRV_TP_AUTO, 0, 1, NULL,
     "[TOOL_CALLS][{\"name\":\"f\",\"arguments\":{\"a\":1}},{\"name\":\"g\",\"arguments\":{}}]",
     "", "", 2, {{"f", "{\"a\":1}"}, {"g", "{}"}}},
    {"mistral after text", SRV_TP_FMT_MISTRAL, SRV_TP_AUTO, 0, 1, NULL,
     "Sure. [TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{\"a\":1}}]", "Sure.", "", 1,
     {{"f", "{\"a\":1}"}}},
    {"mistral marker skipped by the detokenizer", SRV_TP_FMT_MISTRAL, SRV_TP_AUTO, 0, 1, NULL,
     "[{\"name\":\"f\",\"arguments\":{}}]", "", "", 1, {{"f", "{}"}}},
    {"mistral list text", SRV_TP_FMT_MISTRAL, SRV_TP_AUTO, 0, 1, NULL, "[1, 2] is a list",
     "[1, 2] is a list", "", 0, {{0}}},
    {"generic calls", SRV_TP_FMT_GENERIC, SRV_TP_AUTO, 0, 1, NULL,
     "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]}", "", "", 1,
     {{"f", "{\"q\":\"x\"}"}}},
    {"generic response", SRV_TP_FMT_GENERIC, SRV_TP_AUTO, 0, 1, NULL,
     "{\"response\": \"Hello there\"}", "Hello there", "", 0, {{0}}},
    {"generic plain text", SRV_TP_FMT_GENERIC, SRV_TP_AUTO, 0, 1, NULL, " Just text",
     " Just text", "", 0, {{0}}},
    {"generic unknown object", SRV_TP_FMT_GENERIC, SRV_TP_AUTO, 0, 1, NULL, "{\"x\": 2}",
     "{\"x\": 2}", "", 0, {{0}}},
    {"required array", SRV_TP_FMT_HERMES, SRV_TP_REQUIRED, 0, 1, NULL,
     "[{\"name\":\"f\",\"parameters\":{\"a\":1}},{\"name\":\"g\",\"parameters\":{}}]", "", "", 2,
     {{"f", "{\"a\":1}"}, {"g", "{}"}}},
    {"required, parallel off", SRV_TP_FMT_GENERIC, SRV_TP_REQUIRED, 0, 0, NULL,
     "[{\"name\":\"f\",\"parameters\":{\"a\":1}},{\"name\":\"g\",\"parameters\":{}}]", "", "", 1,
     {{"f", "{\"a\":1}"}}},
    {"required garbage", SRV_TP_FMT_LLAMA3, SRV_TP_REQUIRED, 0, 1, NULL, "no idea [",
     "no idea [", "", 0, {{0}}},
    {"named", SRV_TP_FMT_HERMES, SRV_TP_NAMED, 0, 1, "get_weather",
     "{\"city\": \"Paris\", \"days\": 3}", "", "", 1,
     {{"get_weather", "{\"city\":\"Paris\",\"days\":3}"}}},
    {"named garbage", SRV_TP_FMT_GENERIC, SRV_TP_NAMED, 0, 1, "get_weather", "{\"city\": ",
     "{\"city\": ", "", 0, {{0}}},
    {"off keeps markers", SRV_TP_FMT_HERMES, SRV_TP_OFF, 0, 1, NULL,
     "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>",
     "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>", "", 0, {{0}}},
    {"qwen3 think", SRV_TP_FMT_NONE, SRV_TP_OFF, SRV_TP_REASON_QWEN3, 1, NULL,
     "<think>\nI think.\n</think>\n\nAnswer.", "Answer.", "\nI think.\n", 0, {{0}}},
    {"qwen3 without think", SRV_TP_FMT_NONE, SRV_TP_OFF, SRV_TP_REASON_QWEN3, 1, NULL,
     "Plain </think> answer", "Plain </think> answer", "", 0, {{0}}},
    {"deepseek_r1 open tag written by the template", SRV_TP_FMT_NONE, SRV_TP_OFF,
     SRV_TP_REASON_DEEPSEEK_R1, 1, NULL, "Reasoning <here></think>Answer", "Answer",
     "Reasoning <here>", 0, {{0}}},
    {"deepseek_r1 with open tag", SRV_TP_FMT_NONE, SRV_TP_OFF, SRV_TP_REASON_DEEPSEEK_R1, 1,
     NULL, "<think>a</think>b", "b", "a", 0, {{0}}},
    {"deepseek_r1 never closed", SRV_TP_FMT_NONE, SRV_TP_OFF, SRV_TP_REASON_DEEPSEEK_R1, 1, NULL,
     "just thinking", "", "just thinking", 0, {{0}}},
    {"think then hermes call", SRV_TP_FMT_HERMES, SRV_TP_AUTO, SRV_TP_REASON_QWEN3, 1, NULL,
     "<think>need weather</think>\n<tool_call>\n{\"name\":\"w\",\"arguments\":{}}\n</tool_call>",
     "", "need weather", 1, {{"w", "{}"}}},
};

#define N_CASES ((int)(sizeof(cases) / sizeof(cases[0])))

typedef struct result {
    srv_buf_t content, reasoning; /* joined from the stream events */
    int n_heads, n_args;
    char ev_names[4][64];
    char ev_args[4][128];
} result_t;

static void
setup_tp(const tp_case_t *c, srv_tp_t *tp)
{
    srv_tp_cfg_t cfg = {c->format, c->mode, c->reason, c->parallel, c->named, 42};

    ck_assert_int_eq(srv_tp_init(tp, &cfg), 1);
}

/* Drains the stream events into r; checks each call's head comes before
 * its arguments, in index order. */
static void
drain(srv_tp_t *tp, result_t *r)
{
    srv_tp_event_t ev;

    while (srv_tp_next(tp, &ev)) {
        switch (ev.kind) {
        case SRV_TP_EV_TEXT:
            srv_buf_add(&r->content, ev.content, ev.content_len);
            srv_buf_add(&r->reasoning, ev.reasoning, ev.reasoning_len);
            break;
        case SRV_TP_EV_CALL_HEAD:
            ck_assert_int_eq(ev.call, r->n_heads);
            ck_assert_int_eq(r->n_heads, r->n_args);
            snprintf(r->ev_names[r->n_heads % 4], 64, "%s", tp->calls[ev.call].name);
            r->n_heads++;
            break;
        case SRV_TP_EV_CALL_ARGS:
            ck_assert_int_eq(ev.call, r->n_args);
            snprintf(r->ev_args[r->n_args % 4], 128, "%s", tp->calls[ev.call].args);
            r->n_args++;
            break;
        default:
            ck_abort_msg("unknown event");
        }
    }
}

static void
check_result(const tp_case_t *c, const srv_tp_t *tp, result_t *r, const char *how)
{
    const char *content = tp->content.data ? tp->content.data : "";
    const char *reasoning = tp->reasoning.data ? tp->reasoning.data : "";

    ck_assert_msg(strcmp(content, c->content) == 0, "%s (%s): content '%s', want '%s'", c->name,
                  how, content, c->content);
    ck_assert_msg(strcmp(reasoning, c->reasoning) == 0, "%s (%s): reasoning '%s', want '%s'",
                  c->name, how, reasoning, c->reasoning);
    ck_assert_msg(tp->n_calls == c->n_calls, "%s (%s): %d calls, want %d", c->name, how,
                  tp->n_calls, c->n_calls);
    for (int i = 0; i < c->n_calls; i++) {
        ck_assert_str_eq(tp->calls[i].name, c->calls[i][0]);
        ck_assert_str_eq(tp->calls[i].args, c->calls[i][1]);
        ck_assert_str_eq(r->ev_names[i], c->calls[i][0]);
        ck_assert_str_eq(r->ev_args[i], c->calls[i][1]);
        if (c->format == SRV_TP_FMT_MISTRAL) {
            ck_assert_uint_eq(strlen(tp->calls[i].id), 9);
        } else {
            ck_assert_int_eq(strncmp(tp->calls[i].id, "call_", 5), 0);
            ck_assert_uint_eq(strlen(tp->calls[i].id), 29);
        }
        for (int k = 0; k < i; k++) {
            ck_assert_str_ne(tp->calls[i].id, tp->calls[k].id);
        }
    }
    ck_assert_int_eq(r->n_heads, c->n_calls);
    ck_assert_int_eq(r->n_args, c->n_calls);
    ck_assert_msg(strcmp(r->content.data ? r->content.data : "", content) == 0,
                  "%s (%s): streamed content '%s'", c->name, how,
                  r->content.data ? r->content.data : "");
    ck_assert_str_eq(r->reasoning.data ? r->reasoning.data : "", reasoning);
    ck_assert_str_eq(srv_tp_finish_reason(tp, "stop"), c->n_calls > 0 ? "tool_calls" : "stop");
    ck_assert_str_eq(srv_tp_finish_reason(tp, "length"), "length");
    ck_assert_int_eq(tp->oom, 0);
}

static void
result_free(result_t *r)
{
    srv_buf_free(&r->content);
    srv_buf_free(&r->reasoning);
}

START_TEST(test_whole)
{
    const tp_case_t *c = &cases[_i];
    srv_tp_t tp;
    result_t r;

    memset(&r, 0, sizeof(r));
    setup_tp(c, &tp);
    srv_tp_feed(&tp, c->text, strlen(c->text), 1);
    drain(&tp, &r);
    check_result(c, &tp, &r, "whole");
    result_free(&r);
    srv_tp_fini(&tp);
}
END_TEST

START_TEST(test_split_everywhere)
{
    const tp_case_t *c = &cases[_i];
    size_t n = strlen(c->text);

    for (size_t at = 0; at <= n; at++) {
        srv_tp_t tp;
        result_t r;
        char how[32];

        memset(&r, 0, sizeof(r));
        setup_tp(c, &tp);
        srv_tp_feed(&tp, c->text, at, 0);
        drain(&tp, &r);
        srv_tp_feed(&tp, c->text + at, n - at, 0);
        drain(&tp, &r);
        srv_tp_feed(&tp, "", 0, 1);
        drain(&tp, &r);
        snprintf(how, sizeof(how), "split at %zu", at);
        check_result(c, &tp, &r, how);
        result_free(&r);
        srv_tp_fini(&tp);
    }
}
END_TEST

START_TEST(test_byte_by_byte)
{
    const tp_case_t *c = &cases[_i];
    size_t n = strlen(c->text);
    srv_tp_t tp;
    result_t r;

    memset(&r, 0, sizeof(r));
    setup_tp(c, &tp);
    for (size_t i = 0; i < n; i++) {
        srv_tp_feed(&tp, c->text + i, 1, i + 1 == n);
        drain(&tp, &r);
    }
    if (n == 0) {
        srv_tp_feed(&tp, "", 0, 1);
    }
    check_result(c, &tp, &r, "byte by byte");
    result_free(&r);
    srv_tp_fini(&tp);
}
END_TEST

/* Text is held back only while it may start a marker: plain text streams
 * at once, a possible tool-call start waits. */
START_TEST(test_holds_only_marker_prefixes)
{
    tp_case_t c = cases[0];
    srv_tp_t tp;
    result_t r;

    memset(&r, 0, sizeof(r));
    setup_tp(&c, &tp);
    srv_tp_feed(&tp, "Hello world <tool_", strlen("Hello world <tool_"), 0);
    drain(&tp, &r);
    ck_assert_str_eq(r.content.data, "Hello world");
    srv_tp_feed(&tp, "x>", 2, 0);
    drain(&tp, &r);
    ck_assert_str_eq(r.content.data, "Hello world <tool_x>");
    result_free(&r);
    srv_tp_fini(&tp);
}
END_TEST

START_TEST(test_chat_delta_json)
{
    tp_case_t c = cases[0];
    srv_tp_t tp;
    srv_tp_event_t ev;
    srv_buf_t out = {0};

    setup_tp(&c, &tp);
    srv_tp_feed(&tp, c.text, strlen(c.text), 1);
    ck_assert_int_eq(srv_tp_next(&tp, &ev), 1);
    srv_tp_chat_delta(&tp, &ev, &out);
    ck_assert_str_eq(out.data, "\"content\":\"Let me check.\"");
    out.len = 0;
    ck_assert_int_eq(srv_tp_next(&tp, &ev), 1);
    srv_tp_chat_delta(&tp, &ev, &out);
    srv_buf_add(&out, "", 0);
    char want[256];
    snprintf(want, sizeof(want),
             "\"tool_calls\":[{\"index\":0,\"id\":\"%s\",\"type\":\"function\",\"function\":{"
             "\"name\":\"get_weather\",\"arguments\":\"\"}}]",
             tp.calls[0].id);
    ck_assert_str_eq(out.data, want);
    out.len = 0;
    ck_assert_int_eq(srv_tp_next(&tp, &ev), 1);
    srv_tp_chat_delta(&tp, &ev, &out);
    srv_buf_add(&out, "", 0);
    ck_assert_str_eq(out.data, "\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":"
                               "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]");
    ck_assert_int_eq(srv_tp_next(&tp, &ev), 0);
    srv_buf_free(&out);
    srv_tp_fini(&tp);
}
END_TEST

START_TEST(test_format_names)
{
    ck_assert_int_eq(srv_tp_format_by_name("hermes"), SRV_TP_FMT_HERMES);
    ck_assert_int_eq(srv_tp_format_by_name("llama3_json"), SRV_TP_FMT_LLAMA3);
    ck_assert_int_eq(srv_tp_format_by_name("mistral"), SRV_TP_FMT_MISTRAL);
    ck_assert_int_eq(srv_tp_format_by_name("generic"), SRV_TP_FMT_GENERIC);
    ck_assert_int_eq(srv_tp_format_by_name("auto"), SRV_TP_FMT_NONE);
    ck_assert_int_eq(srv_tp_reasoning_by_name("qwen3"), SRV_TP_REASON_QWEN3);
    ck_assert_int_eq(srv_tp_reasoning_by_name("deepseek_r1"), SRV_TP_REASON_DEEPSEEK_R1);
    ck_assert_int_eq(srv_tp_reasoning_by_name("none"), SRV_TP_REASON_NONE);
    ck_assert_int_eq(srv_tp_format_of_template(NULL), SRV_TP_FMT_GENERIC);
    ck_assert_int_eq(srv_tp_format_of_template("{{ messages }}"), SRV_TP_FMT_GENERIC);
}
END_TEST

Suite *
server_toolparse_suite(void)
{
    Suite *s = suite_create("server_toolparse");
    TCase *tc = tcase_create("parsers");

    tcase_add_loop_test(tc, test_whole, 0, N_CASES);
    tcase_add_loop_test(tc, test_split_everywhere, 0, N_CASES);
    tcase_add_loop_test(tc, test_byte_by_byte, 0, N_CASES);
    tcase_add_test(tc, test_holds_only_marker_prefixes);
    tcase_add_test(tc, test_chat_delta_json);
    tcase_add_test(tc, test_format_names);
    suite_add_tcase(s, tc);
    return s;
}
