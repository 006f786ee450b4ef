/* test_params.c - request parsing and validation (OpenAI bounds, server caps,
 * JSON pre-checks, the context limit). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_int.h"

static srv_limits_t lim = {
    .max_n = 8,
    .max_tokens_cap = 0,
    .max_model_len = 256,
    .vocab_size = 1024,
    .max_prompts = 4,
    .max_logprobs = 20,
    .max_depth = 8,
    .model_name = "austen",
};

static int
parse(int kind, const char *body, srv_params_t *p, srv_error_t *err)
{
    return srv_params_parse(kind, body, strlen(body), &lim, p, err);
}

/* Expects a 4xx with the given param ("" for null). */
static void
expect_fail(int kind, const char *body, int status, const char *param)
{
    srv_params_t p;
    srv_error_t err;

    ck_assert_msg(!parse(kind, body, &p, &err), "accepted: %s", body);
    ck_assert_int_eq(err.status, status);
    ck_assert_str_eq(err.param, param);
    ck_assert(err.message[0] != '\0');
}

START_TEST(test_completion_defaults)
{
    srv_params_t p;
    srv_error_t err;

    ck_assert(parse(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":\"Emma\"}", &p, &err));
    ck_assert_int_eq(p.n_prompts, 1);
    ck_assert_str_eq(p.prompts[0].text, "Emma");
    ck_assert_int_eq(p.n, 1);
    ck_assert_int_eq(p.max_tokens, -1);
    ck_assert(p.sampling.temperature == 1.0f);
    ck_assert(p.sampling.top_p == 1.0f);
    ck_assert_int_eq(p.stream, 0);
    ck_assert_int_eq(p.skip_special_tokens, 1);
    ck_assert_int_eq(p.speculative, 1);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_completion_all_fields)
{
    srv_params_t p;
    srv_error_t err;
    const char *body =
        "{\"model\":\"austen\",\"prompt\":[[1,2,3],[4,5]],\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":1.5,"
        "\"frequency_penalty\":-1,\"repetition_penalty\":1.1,\"logit_bias\":{\"5\":-100,\"7\":3},"
        "\"seed\":42,\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[2,9],\"n\":3,\"logprobs\":2,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,"
        "\"speculative\":false,"
        "\"min_tokens\":2,\"user\":\"u\",\"priority\":-3,\"unknown_field\":{\"x\":[1]}}";

    ck_assert_msg(parse(SRV_KIND_COMPLETION, body, &p, &err), "%s", err.message);
    ck_assert_int_eq(p.n_prompts, 2);
    ck_assert_int_eq(p.prompts[0].n_ids, 3);
    ck_assert_int_eq(p.prompts[1].ids[1], 5);
    ck_assert_int_eq(p.max_tokens, 7);
    ck_assert(p.sampling.temperature == 0.5f);
    ck_assert_int_eq(p.sampling.top_k, 40);
    ck_assert_int_eq(p.sampling.n_bias, 2);
    ck_assert_int_eq(p.sampling.bias[0].id, 5);
    ck_assert(p.sampling.bias[0].bias == -100.0f);
    ck_assert_int_eq(p.has_seed, 1);
    ck_assert_uint_eq(p.seed, 42);
    ck_assert_int_eq(p.n_stop, 2);
    ck_assert_str_eq(p.stop[1], "bc");
    ck_assert_int_eq(p.n_stop_ids, 2);
    ck_assert_int_eq(p.n, 3);
    ck_assert_int_eq(p.logprobs, 1);
    ck_assert_int_eq(p.top_logprobs, 2);
    ck_assert_int_eq(p.sampling.n_logprobs, 2);
    ck_assert_int_eq(p.stream, 1);
    ck_assert_int_eq(p.include_usage, 1);
    ck_assert_int_eq(p.ignore_eos, 1);
    ck_assert_int_eq(p.speculative, 0);
    ck_assert_int_eq(p.min_tokens, 2);
    ck_assert_int_eq(p.priority, -3);
    srv_params_free(&p);
}
END_TEST

START_TEST(test_prompt_forms)
{
    srv_params_t p;
    srv_error_t err;

    ck_assert(
        parse(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[\"a\",\"b\"]}", &p, &err));
    ck_assert_int_eq(p.n_prompts, 2);
    ck_assert_str_eq(p.prompts[1].text, "b");
    srv_params_free(&p);
    ck_assert(parse(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[1,2]}", &p, &err));
    ck_assert_int_eq(p.n_prompts, 1);
    ck_assert_int_eq(p.prompts[0].n_ids, 2);
    srv_params_free(&p);
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[]}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[1,\"a\"]}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[\"a\",[1]]}", 400,
                "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[1024]}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[-1]}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":[1.5]}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":5}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\"}", 400, "prompt");
    expect_fail(SRV_KIND_COMPLETION,
                "{\"model\":\"austen\",\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "prompt");
}
END_TEST

START_TEST(test_bounds)
{
    static const struct {
        const char *field;
        const char *param;
    } bad[] = {
        {"\"temperature\":2.5", "temperature"},
        {"\"temperature\":-0.1", "temperature"},
        {"\"temperature\":\"hot\"", "temperature"},
        {"\"top_p\":0", "top_p"},
        {"\"top_p\":1.01", "top_p"},
        {"\"top_k\":-2", "top_k"},
        {"\"min_p\":1.5", "min_p"},
        {"\"presence_penalty\":2.1", "presence_penalty"},
        {"\"frequency_penalty\":-3", "frequency_penalty"},
        {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"logit_bias\":{\"5\":101}", "logit_bias"},
        {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"4096\":1}", "logit_bias"},
        {"\"logit_bias\":[1]", "logit_bias"},
        {"\"seed\":1.5", "seed"},
        {"\"speculative\":3", "speculative"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop"},
        {"\"stop\":\"\"", "stop"},
        {"\"stop\":[1]", "stop"},
        {"\"stop_token_ids\":[5000]", "stop_token_ids"},
        {"\"n\":0", "n"},
        {"\"n\":9", "n"},
        {"\"n\":129", "n"},
        {"\"logprobs\":6", "logprobs"},
        {"\"max_tokens\":0", "max_tokens"},
        {"\"max_tokens\":-5", "max_tokens"},
        {"\"stream\":1", "stream"},
        {"\"stream_options\":{\"include_usage\":true}", "stream_options"},
        {"\"echo\":\"yes\"", "echo"},
        {"\"suffix\":\"x\"", "suffix"},
        {"\"best_of\":3", "best_of"},
        {"\"min_tokens\":-1", "min_tokens"},
        {"\"user\":5", "user"},
    };
    char body[512];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body), "{\"model\":\"austen\",\"prompt\":\"x\",%s}", bad[i].field);
        expect_fail(SRV_KIND_COMPLETION, body, 400, bad[i].param);
    }
}
END_TEST

START_TEST(test_model_errors)
{
    srv_params_t p;
    srv_error_t err;

    expect_fail(SRV_KIND_COMPLETION, "{\"prompt\":\"x\"}", 400, "model");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":3,\"prompt\":\"x\"}", 400, "model");
    ck_assert(!parse(SRV_KIND_COMPLETION, "{\"model\":\"gpt-9\",\"prompt\":\"x\"}", &p, &err));
    ck_assert_int_eq(err.status, 404);
    ck_assert_str_eq(err.code, "model_not_found");
}
END_TEST

START_TEST(test_chat)
{
    srv_params_t p;
    srv_error_t err;
    const char *body = "{\"model\":\"austen\",\"messages\":[{\"role\":\"system\",\"content\":\"Be "
                       "brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi "
                       "\"},{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\","
                       "\"content\":null}],\"max_completion_tokens\":5,\"logprobs\":true,"
                       "\"top_logprobs\":3}";

    ck_assert_msg(parse(SRV_KIND_CHAT, body, &p, &err), "%s", err.message);
    ck_assert_int_eq(p.n_messages, 3);
    ck_assert_str_eq(p.messages[0].role, "system");
    ck_assert_str_eq(p.messages[1].content, "Hi there");
    ck_assert_str_eq(p.messages[2].content, "");
    ck_assert_int_eq(p.max_tokens, 5);
    ck_assert_int_eq(p.top_logprobs, 3);
    srv_params_free(&p);

    expect_fail(SRV_KIND_CHAT, "{\"model\":\"austen\",\"messages\":[]}", 400, "messages");
    expect_fail(SRV_KIND_CHAT, "{\"model\":\"austen\"}", 400, "messages");
    expect_fail(SRV_KIND_CHAT,
                "{\"model\":\"austen\",\"messages\":[{\"role\":\"tool\","
                "\"content\":\"x\"}]}",
                400, "messages");
    expect_fail(SRV_KIND_CHAT,
                "{\"model\":\"austen\",\"messages\":[{\"role\":\"user\","
                "\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
                400, "messages");
    expect_fail(SRV_KIND_CHAT, "{\"model\":\"austen\",\"messages\":[{\"role\":\"user\"}]}", 400,
                "messages");
    expect_fail(SRV_KIND_CHAT,
                "{\"model\":\"austen\",\"messages\":[{\"role\":\"user\","
                "\"content\":\"x\"}],\"top_logprobs\":2}",
                400, "top_logprobs");
    expect_fail(SRV_KIND_CHAT,
                "{\"model\":\"austen\",\"messages\":[{\"role\":\"user\","
                "\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
                400, "top_logprobs");
}
END_TEST

START_TEST(test_precheck)
{
    srv_error_t err;
    char deep[64];

    ck_assert(srv_json_precheck("{\"a\":[[1]]}", 11, 8, &err));
    memset(deep, '[', 9);
    memset(deep + 9, ']', 9);
    ck_assert(!srv_json_precheck(deep, 18, 8, &err));
    ck_assert_int_eq(err.status, 400);
    memset(deep, '[', 8);
    memset(deep + 8, ']', 8);
    ck_assert(srv_json_precheck(deep, 16, 8, &err)); /* 8 deep: fine */
    /* Brackets inside strings do not count. */
    ck_assert(srv_json_precheck("{\"a\":\"[[[[[[[[[[[[\"}", 20, 2, &err));
    ck_assert(!srv_json_precheck("{\"a\":\"x\\u0000y\"}", 16, 8, &err));
    ck_assert(srv_json_precheck("{\"a\":\"x\\\\u0000y\"}", 17, 8, &err)); /* escaped backslash */
    ck_assert(!srv_json_precheck("{\"a\":\"\xff\"}", 9, 8, &err));
    ck_assert(!srv_json_precheck("{\"a\":\"\xc0\xaf\"}", 10, 8, &err)); /* overlong */
    ck_assert(!srv_json_precheck("{\"a\":\"x\0\"}", 9, 8, &err));
    /* The 8-byte fast paths (issue 15): a NUL, a \u0000, a closing quote,
     * a bad byte at every offset of a long string is still seen. */
    for (int off = 0; off < 24; off++) {
        char b[96];
        size_t n;

        memset(b, 0, sizeof(b));
        memcpy(b, "{\"a\":\"", 6);
        memset(b + 6, 'x', 40);
        memcpy(b + 46, "\"}", 2);
        n = 48;
        ck_assert(srv_json_precheck(b, n, 1, &err));
        b[6 + off] = '\0';
        ck_assert_msg(!srv_json_precheck(b, n, 1, &err), "NUL at %d", off);
        b[6 + off] = '\xff';
        ck_assert_msg(!srv_json_precheck(b, n, 1, &err), "0xff at %d", off);
        memcpy(b + 6 + off, "\\u0000", 6);
        ck_assert_msg(!srv_json_precheck(b, n, 1, &err), "\\u0000 at %d", off);
        memset(b + 6, 'x', 40);
        memcpy(b + 6 + off, "\"[[\"", 4); /* a string ends, brackets outside */
        ck_assert_msg(!srv_json_precheck(b, n, 1, &err), "depth at %d", off);
    }
}
END_TEST

START_TEST(test_parse_rejects_bad_json)
{
    srv_params_t p;
    srv_error_t err;

    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",", 400, "");
    expect_fail(SRV_KIND_COMPLETION, "[1,2]", 400, "");
    expect_fail(SRV_KIND_COMPLETION, "{\"model\":\"austen\",\"prompt\":\"a\\u0000b\"}", 400, "");
    ck_assert(!srv_params_parse(SRV_KIND_COMPLETION, "", 0, &lim, &p, &err));
    ck_assert_int_eq(err.status, 400);
}
END_TEST

static srv_params_t
with_prompt(int kind, int32_t n_ids, int32_t max_tokens, int32_t n)
{
    srv_params_t p;

    memset(&p, 0, sizeof(p));
    p.kind = kind;
    p.n_prompts = 1;
    p.prompts = calloc(1, sizeof(srv_prompt_t));
    p.prompts[0].ids = calloc((size_t)n_ids, sizeof(int32_t));
    p.prompts[0].n_ids = n_ids;
    p.max_tokens = max_tokens;
    p.n = n;
    return p;
}

START_TEST(test_context)
{
    srv_error_t err;
    srv_params_t p;

    p = with_prompt(SRV_KIND_COMPLETION, 10, -1, 1);
    ck_assert(srv_params_check_context(&p, &lim, 16, 0, &err));
    ck_assert_int_eq(p.max_tokens, 16); /* the completions default */
    srv_params_free(&p);

    p = with_prompt(SRV_KIND_CHAT, 10, -1, 1);
    ck_assert(srv_params_check_context(&p, &lim, 16, 0, &err));
    ck_assert_int_eq(p.max_tokens, 246); /* the rest of the context */
    srv_params_free(&p);

    p = with_prompt(SRV_KIND_COMPLETION, 200, 100, 1);
    ck_assert(!srv_params_check_context(&p, &lim, 16, 0, &err));
    ck_assert_int_eq(err.status, 400);
    ck_assert_str_eq(err.param, "max_tokens");
    ck_assert(strstr(err.message, "256") != NULL);
    srv_params_free(&p);

    p = with_prompt(SRV_KIND_COMPLETION, 256, 1, 1);
    ck_assert(!srv_params_check_context(&p, &lim, 16, 0, &err));
    ck_assert_str_eq(err.param, "prompt");
    srv_params_free(&p);

    /* KV demand: 4 choices of 64 + 64 tokens share the prompt's 4 full
     * blocks and own 4 blocks each: 4 + 4 * 4 = 20 blocks. */
    p = with_prompt(SRV_KIND_COMPLETION, 64, 64, 4);
    ck_assert(srv_params_check_context(&p, &lim, 16, 20, &err));
    srv_params_free(&p);
    p = with_prompt(SRV_KIND_COMPLETION, 64, 64, 4);
    ck_assert(!srv_params_check_context(&p, &lim, 16, 19, &err));
    ck_assert(strstr(err.message, "KV cache") != NULL);
    srv_params_free(&p);

    p = with_prompt(SRV_KIND_COMPLETION, 10, 5, 1);
    p.min_tokens = 6;
    ck_assert(!srv_params_check_context(&p, &lim, 16, 0, &err));
    ck_assert_str_eq(err.param, "min_tokens");
    srv_params_free(&p);
}
END_TEST

/* Extension field kv_policy: parsed, refused when malformed; a rolling
 * window (per request or the server's) lets a completion pass the
 * context, "full" does not. */
START_TEST(test_kv_policy_field)
{
    srv_params_t p;
    srv_error_t err;
    srv_limits_t l2 = lim;

    ck_assert(parse(SRV_KIND_COMPLETION,
                    "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"sink=16,window=64\"}",
                    &p, &err));
    ck_assert_int_eq(p.kv_sink, 16);
    ck_assert_int_eq(p.kv_window, 64);
    srv_params_free(&p);
    ck_assert(parse(SRV_KIND_CHAT,
                    "{\"model\":\"austen\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                    "\"kv_policy\":\"full\"}",
                    &p, &err));
    ck_assert_int_eq(p.kv_window, -1);
    srv_params_free(&p);
    ck_assert(!parse(SRV_KIND_COMPLETION,
                     "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"sink=16\"}", &p,
                     &err));
    ck_assert_str_eq(err.param, "kv_policy");
    ck_assert(!parse(SRV_KIND_COMPLETION,
                     "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":7}", &p, &err));
    ck_assert_int_eq(err.status, 400);
    /* H2O / SnapKV (issue 18) */
    ck_assert(parse(SRV_KIND_COMPLETION,
                    "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"h2o=128,recent=32\"}",
                    &p, &err));
    ck_assert_int_eq(p.kv_score.kind, MDL_KVP_H2O);
    ck_assert_int_eq(p.kv_score.budget, 128);
    ck_assert_int_eq(p.kv_score.recent, 32);
    ck_assert_int_eq(p.kv_window, 0);
    srv_params_free(&p);
    ck_assert(parse(SRV_KIND_COMPLETION,
                    "{\"model\":\"austen\",\"prompt\":\"a\","
                    "\"kv_policy\":\"snapkv=96,window=16,pool=7\"}",
                    &p, &err));
    ck_assert_int_eq(p.kv_score.kind, MDL_KVP_SNAPKV);
    ck_assert_int_eq(p.kv_score.pool, 7);
    srv_params_free(&p);
    static const char *const bad[] = {
        "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"h2o=32,recent=32\"}",
        "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"h2o=64\"}",
        "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"snapkv=64,window=8,pool=0\"}",
        "{\"model\":\"austen\",\"prompt\":\"a\",\"kv_policy\":\"snapkv=64,window=8,x=1\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert(!parse(SRV_KIND_COMPLETION, bad[i], &p, &err));
        ck_assert_int_eq(err.status, 400);
        ck_assert_str_eq(err.param, "kv_policy");
        ck_assert_ptr_nonnull(strstr(err.message, "expected"));
    }

    p = with_prompt(SRV_KIND_COMPLETION, 200, 600, 1);
    p.kv_sink = 16;
    p.kv_window = 64;
    ck_assert(srv_params_check_context(&p, &lim, 16, 20, &err)); /* KV capped at the context */
    srv_params_free(&p);
    p = with_prompt(SRV_KIND_COMPLETION, 200, 600, 1);
    ck_assert(!srv_params_check_context(&p, &lim, 16, 0, &err));
    srv_params_free(&p);
    l2.kv_window = 64;
    p = with_prompt(SRV_KIND_COMPLETION, 200, 600, 1);
    ck_assert(srv_params_check_context(&p, &l2, 16, 0, &err));
    srv_params_free(&p);
    p = with_prompt(SRV_KIND_COMPLETION, 200, 600, 1);
    p.kv_window = -1; /* "full" overrides the server's policy */
    ck_assert(!srv_params_check_context(&p, &l2, 16, 0, &err));
    srv_params_free(&p);
}
END_TEST

START_TEST(test_error_json)
{
    srv_error_t err;
    char *j;

    srv_err_set(&err, 429, NULL, "queue \"full\"");
    j = srv_err_json(&err);
    ck_assert_str_eq(j,
                     "{\"error\":{\"message\":\"queue \\\"full\\\"\",\"type\":\"rate_limit_error\","
                     "\"param\":null,\"code\":\"rate_limit_exceeded\"}}");
    free(j);
    srv_err_set(&err, 400, "n", "bad");
    j = srv_err_json(&err);
    ck_assert_str_eq(j, "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\","
                        "\"param\":\"n\",\"code\":null}}");
    free(j);
}
END_TEST

Suite *
server_params_suite(void)
{
    Suite *s = suite_create("server_params");
    TCase *tc = tcase_create("params");

    tcase_add_test(tc, test_completion_defaults);
    tcase_add_test(tc, test_completion_all_fields);
    tcase_add_test(tc, test_prompt_forms);
    tcase_add_test(tc, test_bounds);
    tcase_add_test(tc, test_model_errors);
    tcase_add_test(tc, test_chat);
    tcase_add_test(tc, test_precheck);
    tcase_add_test(tc, test_parse_rejects_bad_json);
    tcase_add_test(tc, test_context);
    tcase_add_test(tc, test_kv_policy_field);
    tcase_add_test(tc, test_error_json);
    suite_add_tcase(s, tc);
    return s;
}
