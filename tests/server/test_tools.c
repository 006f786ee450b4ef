/* test_tools.c - the request side of tool calling (server/srv_tools.h):
 * validation of tools / tool_choice / tool history, the constraint each
 * tool_choice sets, and the rendering of a tool round trip through the
 * real chat templates of tests/fixtures/chat-templates (Llama 3.1,
 * Qwen2.5 / Hermes, Mistral Nemo, Qwen3 with chat_template_kwargs) and
 * through a template without tool syntax (the generic format). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "text/chat.h"
#include "server/srv_tools.h"

static const srv_limits_t lim = {
    .max_n = 4, .max_tokens_cap = 0, .max_model_len = 4096, .vocab_size = 1000,
    .max_prompts = 8, .max_logprobs = 5, .max_depth = 64, .model_name = "m",
};

#define TOOLS                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"   \
    "\"Current weather in a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":" \
    "{\"type\":\"string\"}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{"     \
    "\"name\":\"get_time\"}}]"

/* A round trip: the user asks, the assistant called get_weather, the tool
 * answered. The id has 9 alphanumerics, which Mistral's template wants. */
#define ROUND_TRIP                                                                                 \
    "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":"             \
    "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"abcDEF123\",\"type\":\"function\"," \
    "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"  \
    "{\"role\":\"tool\",\"tool_call_id\":\"abcDEF123\",\"content\":\"sunny, 21C\"}]"

static char *
read_template(const char *name)
{
    const char *src = getenv("KVSERVE_SOURCE_DIR");
    char path[1024];
    FILE *f;
    long n;
    char *buf;

    ck_assert_ptr_nonnull(src);
    snprintf(path, sizeof(path), "%s/tests/fixtures/chat-templates/%s", src, name);
    f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void
parse_ok(const char *body, srv_params_t *p)
{
    srv_error_t err;

    memset(&err, 0, sizeof(err));
    ck_assert_msg(srv_params_parse(SRV_KIND_CHAT, body, strlen(body), &lim, p, &err), "%s",
                  err.message);
}

static void
parse_fails(const char *body, const char *param, const char *needle)
{
    srv_params_t p;
    srv_error_t err;

    memset(&err, 0, sizeof(err));
    ck_assert_msg(!srv_params_parse(SRV_KIND_CHAT, body, strlen(body), &lim, &p, &err),
                  "accepted: %s", body);
    ck_assert_int_eq(err.status, 400);
    ck_assert_str_eq(err.param, param);
    ck_assert_msg(strstr(err.message, needle) != NULL, "message '%s' lacks '%s'", err.message,
                  needle);
}

/* Renders p with tmpl (source) after srv_tools_prepare. */
static char *
render(srv_params_t *p, const char *tmpl, const char *parser)
{
    srv_tools_opts_t o = {tmpl, parser, "none", 0};
    srv_error_t err;
    char *extra = NULL, *out = NULL, msg[256] = "";
    chat_template_t *t = NULL;
    chat_message_t cm[16];
    chat_render_opts_t ro;

    ck_assert_msg(srv_tools_prepare(p, &o, &extra, &err), "%s", err.message);
    ck_assert_int_eq(chat_template_compile(tmpl, &t, msg, sizeof(msg)), ST_OK);
    ck_assert_int_le(p->n_messages, 16);
    for (int32_t i = 0; i < p->n_messages; i++) {
        cm[i].role = p->messages[i].role;
        cm[i].content = p->messages[i].content;
    }
    memset(&ro, 0, sizeof(ro));
    ro.bos_token = "<s>";
    ro.eos_token = "</s>";
    ro.add_generation_prompt = 1;
    ro.extra_json = extra;
    ro.now = 1700000000;
    int rc = chat_template_render(t, cm, (size_t)p->n_messages, &ro, &out, msg, sizeof(msg));
    ck_assert_msg(rc == ST_OK, "render: %s", msg);
    free(extra);
    chat_template_destroy(t);
    return out;
}

static void
assert_has(const char *text, const char *needle)
{
    ck_assert_msg(strstr(text, needle) != NULL, "'%s' not in:\n%s", needle, text);
}

/* ---- validation ---------------------------------------------------------------- */

START_TEST(test_bad_tools)
{
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":{}}",
                "tools", "array");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"code\"}]}",
                "tools", "tools[0]: 'type'");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
                "tools", "function.name");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                "[]}}]}",
                "tools", "parameters");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":"
                "\"function\",\"function\":{\"name\":\"f\"}}]}",
                "tools", "repeated");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
                ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
                "tool_choice", "nope");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
                ",\"tool_choice\":\"sometimes\"}",
                "tool_choice", "must be");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tool_choice\":\"required\"}",
                "tool_choice", "needs a non-empty 'tools'");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
                ",\"parallel_tool_calls\":1}",
                "parallel_tool_calls", "boolean");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"chat_template_kwargs\":[1]}",
                "chat_template_kwargs", "object");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
                "messages", "tool_call_id");
    parse_fails("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,"
                "\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":"
                "\"f\",\"arguments\":{}}}]}]}",
                "messages", "tool_calls[0]");
}
END_TEST

START_TEST(test_defaults)
{
    srv_params_t p;

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &p);
    ck_assert_ptr_null(p.ext.tools);
    ck_assert_int_eq(p.ext.tool_choice, SRV_TOOL_CHOICE_NONE);
    ck_assert_int_eq(p.ext.parallel_tool_calls, 1);
    ck_assert_ptr_null(p.ext.messages);
    srv_params_free(&p);
    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS "}",
             &p);
    ck_assert_int_eq(p.ext.n_tools, 2);
    ck_assert_int_eq(p.ext.tool_choice, SRV_TOOL_CHOICE_AUTO);
    srv_params_free(&p);
}
END_TEST

/* ---- constraints --------------------------------------------------------------- */

START_TEST(test_constraint_named)
{
    srv_params_t p;
    srv_tools_opts_t o = {"{{ messages }}", "hermes", "none", 0};
    srv_error_t err;
    char *extra = NULL;

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
             ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
             &p);
    ck_assert_int_eq(srv_tools_prepare(&p, &o, &extra, &err), 1);
    ck_assert_int_eq(p.ext.mode, SRV_TP_NAMED);
    ck_assert_int_eq(p.ext.format, SRV_TP_FMT_HERMES);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_JSON_SCHEMA);
    ck_assert_str_eq(p.constraint.spec, "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                                        "\"string\"}},\"required\":[\"city\"]}");
    assert_has(extra, "\"tools\":[");
    free(extra);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_constraint_required)
{
    srv_params_t p;
    srv_tools_opts_t o = {NULL, "llama3_json", "none", 0};
    srv_error_t err;
    char *extra = NULL;

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
             ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
             &p);
    ck_assert_int_eq(srv_tools_prepare(&p, &o, &extra, &err), 1);
    ck_assert_int_eq(p.ext.mode, SRV_TP_REQUIRED);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_JSON_SCHEMA);
    cJSON *s = cJSON_Parse(p.constraint.spec);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(cJSON_GetObjectItem(s, "type")->valuestring, "array");
    ck_assert_int_eq(cJSON_GetObjectItem(s, "maxItems")->valueint, 1);
    cJSON *any = cJSON_GetObjectItem(cJSON_GetObjectItem(s, "items"), "anyOf");
    ck_assert_int_eq(cJSON_GetArraySize(any), 2);
    cJSON *first = cJSON_GetArrayItem(any, 0);
    cJSON *props = cJSON_GetObjectItem(first, "properties");
    ck_assert_str_eq(
        cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(props, "name"), "enum"), 0)
            ->valuestring,
        "get_weather");
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(cJSON_GetObjectItem(props, "parameters"),
                                              "properties"));
    cJSON_Delete(s);
    free(extra);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_constraint_conflict)
{
    srv_params_t p;
    srv_tools_opts_t o = {NULL, "auto", "none", 0};
    srv_error_t err;
    char *extra = NULL;

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
             ",\"tool_choice\":\"required\"}",
             &p);
    p.constraint.kind = SRV_CONSTRAINT_JSON_OBJECT; /* as response_format json_object sets it */
    ck_assert_int_eq(srv_tools_prepare(&p, &o, &extra, &err), 0);
    ck_assert_int_eq(err.status, 400);
    ck_assert_str_eq(err.param, "tool_choice");
    srv_params_free(&p);

    /* auto with the generic format: the client's constraint stays. */
    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS "}",
             &p);
    p.constraint.kind = SRV_CONSTRAINT_JSON_OBJECT;
    ck_assert_int_eq(srv_tools_prepare(&p, &o, &extra, &err), 1);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_JSON_OBJECT);
    ck_assert_ptr_null(p.constraint.spec);
    free(extra);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_none_leaves_output_alone)
{
    srv_params_t p;
    srv_tools_opts_t o = {NULL, "auto", "none", 0};
    srv_error_t err;
    char *extra = NULL;

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
             ",\"tool_choice\":\"none\"}",
             &p);
    ck_assert_int_eq(srv_tools_prepare(&p, &o, &extra, &err), 1);
    ck_assert_int_eq(p.ext.mode, SRV_TP_OFF);
    ck_assert_int_eq(p.ext.output, 0);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_NONE);
    ck_assert_int_eq(p.n_messages, 1); /* no tool description added */
    free(extra);
    srv_params_free(&p);
}
END_TEST

/* ---- rendering ------------------------------------------------------------------- */

static void
round_trip(const char *file, int want_format, const char *const *needles)
{
    srv_params_t p;
    char *tmpl = read_template(file);

    parse_ok("{\"model\":\"m\"," ROUND_TRIP "," TOOLS "}", &p);
    char *out = render(&p, tmpl, "auto");
    ck_assert_int_eq(p.ext.format, want_format);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_NONE);
    assert_has(out, "get_weather");
    assert_has(out, "Current weather in a city"); /* the tool's definition */
    assert_has(out, "Paris");
    assert_has(out, "sunny, 21C");
    for (int i = 0; needles[i] != NULL; i++) {
        assert_has(out, needles[i]);
    }
    free(out);
    free(tmpl);
    srv_params_free(&p);
}

START_TEST(test_render_llama31)
{
    static const char *const n[] = {"<|start_header_id|>ipython<|end_header_id|>",
                                    "\"parameters\": {\"city\": \"Paris\"}", NULL};
    round_trip("meta-llama-Llama-3.1-8B-Instruct.jinja", SRV_TP_FMT_LLAMA3, n);
}
END_TEST

START_TEST(test_render_qwen25)
{
    static const char *const n[] = {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                    "{\"city\": \"Paris\"}}\n</tool_call>",
                                    "<tool_response>\nsunny, 21C\n</tool_response>", "<tools>",
                                    NULL};
    round_trip("Qwen-Qwen2.5-7B-Instruct.jinja", SRV_TP_FMT_HERMES, n);
}
END_TEST

START_TEST(test_render_hermes2pro)
{
    static const char *const n[] = {"<tool_call>", "<tool_response>", NULL};
    round_trip("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", SRV_TP_FMT_HERMES, n);
}
END_TEST

START_TEST(test_render_mistral)
{
    static const char *const n[] = {"[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "abcDEF123",
                                    "[TOOL_RESULTS]", NULL};
    round_trip("mistralai-Mistral-Nemo-Instruct-2407.jinja", SRV_TP_FMT_MISTRAL, n);
}
END_TEST

START_TEST(test_render_generic)
{
    srv_params_t p;
    const char *tmpl = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";

    parse_ok("{\"model\":\"m\"," ROUND_TRIP "," TOOLS "}", &p);
    char *out = render(&p, tmpl, "auto");
    ck_assert_int_eq(p.ext.format, SRV_TP_FMT_GENERIC);
    ck_assert_int_eq(p.ext.mode, SRV_TP_AUTO);
    ck_assert_int_eq(p.constraint.kind, SRV_CONSTRAINT_JSON_SCHEMA);
    assert_has(p.constraint.spec, "\"tool_calls\"");
    assert_has(p.constraint.spec, "\"response\"");
    assert_has(out, "system: Tools (JSON Schema of the arguments):\n[{\"name\":"
                    "\"get_weather\",\"description\":\"Current weather in a city\"");
    assert_has(out, "user: Weather in Paris?\n");
    assert_has(out, "assistant: {\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{"
                    "\"city\":\"Paris\"}}]}\n");
    assert_has(out, "user: {\"tool_response\":{\"tool_call_id\":\"abcDEF123\",\"content\":"
                    "\"sunny, 21C\"}}\n");
    free(out);
    srv_params_free(&p);
}
END_TEST

/* A system message of the client's stays first, with the tools after it. */
START_TEST(test_render_generic_merges_system)
{
    srv_params_t p;
    const char *tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"x\"}]," TOOLS ",\"tool_choice\":\"required\"}",
             &p);
    char *out = render(&p, tmpl, "generic");
    ck_assert_int_eq(p.n_messages, 2);
    assert_has(out, "[system] Be brief.\n\nTools");
    assert_has(out, "Reply with a JSON array of calls");
    free(out);
    srv_params_free(&p);
}
END_TEST

/* A named function: only it is described, by its schema. */
START_TEST(test_render_generic_named)
{
    srv_params_t p;
    const char *tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS
             ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}}",
             &p);
    char *out = render(&p, tmpl, "auto");
    ck_assert_str_eq(out, "[system] Call the tool get_time: reply with its arguments, a JSON "
                          "object of this JSON Schema:\n{\"type\":\"object\",\"properties\":{}}\n"
                          "[user] x\n");
    ck_assert_str_eq(p.constraint.spec, "{\"type\":\"object\",\"properties\":{}}");
    free(out);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_render_kwargs)
{
    srv_params_t p;
    char *tmpl = read_template("Qwen-Qwen3-0.6B.jinja");

    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
             &p);
    char *out = render(&p, tmpl, "auto");
    assert_has(out, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    srv_params_free(&p);
    parse_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &p);
    out = render(&p, tmpl, "auto");
    ck_assert_ptr_null(strstr(out, "<think>"));
    free(out);
    free(tmpl);
    srv_params_free(&p);
}
END_TEST

Suite *
server_tools_suite(void)
{
    Suite *s = suite_create("server_tools");
    TCase *tc = tcase_create("tools");

    tcase_add_test(tc, test_bad_tools);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_constraint_named);
    tcase_add_test(tc, test_constraint_required);
    tcase_add_test(tc, test_constraint_conflict);
    tcase_add_test(tc, test_none_leaves_output_alone);
    tcase_add_test(tc, test_render_llama31);
    tcase_add_test(tc, test_render_qwen25);
    tcase_add_test(tc, test_render_hermes2pro);
    tcase_add_test(tc, test_render_mistral);
    tcase_add_test(tc, test_render_generic);
    tcase_add_test(tc, test_render_generic_merges_system);
    tcase_add_test(tc, test_render_generic_named);
    tcase_add_test(tc, test_render_kwargs);
    suite_add_tcase(s, tc);
    return s;
}
