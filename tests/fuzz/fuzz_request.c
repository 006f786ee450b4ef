/* fuzz_request.c - fuzz target: a request body (raw bytes) through the
 * server's parser and validator, srv_params_parse(), as a completion and as
 * a chat completion, then srv_params_check_context().
 *
 * Properties: the result is either a request struct whose every number is
 * inside the OpenAI / server bounds and whose every string is valid UTF-8,
 * or a 4xx error with a non-empty message that renders as a JSON error body.
 * Parsing is linear in the body size (fuzz_linear_cases).
 */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/srv_int.h"
#include "tests/fuzz/fuzz_common.h"

static const srv_limits_t k_lim = {
    .max_n = 16,
    .max_tokens_cap = 0,
    .max_model_len = 2048,
    .vocab_size = 1024,
    .max_prompts = SRV_MAX_PROMPTS,
    .max_logprobs = SMP_MAX_LOGPROBS,
    .max_depth = 32,
    .model_name = "austen-2.7m",
};

static void
check_error(const srv_error_t *err)
{
    FUZZ_CHECK(err->status >= 400 && err->status < 500, "status %d", err->status);
    FUZZ_CHECK(err->message[0] != '\0', "empty error message");
    FUZZ_CHECK(fuzz_utf8_valid(err->message, strlen(err->message)), "message not UTF-8: %s",
               err->message);
    FUZZ_CHECK(fuzz_utf8_valid(err->param, strlen(err->param)), "param not UTF-8");
    char *body = srv_err_json(err);
    cJSON *j = cJSON_Parse(body);
    FUZZ_CHECK(j != NULL && cJSON_IsObject(cJSON_GetObjectItem(j, "error")),
               "error body is not JSON: %s", body);
    cJSON_Delete(j);
    free(body);
}

static int
in_range(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static void
check_params(const srv_params_t *p, int kind)
{
    const smp_params_t *s = &p->sampling;

    FUZZ_CHECK(p->kind == kind, "kind");
    FUZZ_CHECK(in_range(s->temperature, 0, 2), "temperature %g", s->temperature);
    FUZZ_CHECK(in_range(s->top_p, 0, 1), "top_p %g", s->top_p);
    FUZZ_CHECK(s->top_k >= 0, "top_k %d", s->top_k);
    FUZZ_CHECK(in_range(s->min_p, 0, 1), "min_p %g", s->min_p);
    FUZZ_CHECK(in_range(s->presence_penalty, -2, 2), "presence_penalty");
    FUZZ_CHECK(in_range(s->frequency_penalty, -2, 2), "frequency_penalty");
    FUZZ_CHECK(in_range(s->repetition_penalty, 0, 2) && s->repetition_penalty > 0,
               "repetition_penalty %g", s->repetition_penalty);
    FUZZ_CHECK(s->n_bias >= 0 && s->n_bias <= 1024, "n_bias %d", s->n_bias);
    for (int32_t i = 0; i < s->n_bias; i++) {
        FUZZ_CHECK(s->bias[i].id >= 0 && s->bias[i].id < k_lim.vocab_size, "bias id");
        FUZZ_CHECK(in_range(s->bias[i].bias, -100, 100), "bias value");
    }
    FUZZ_CHECK(s->n_logprobs >= 0 && s->n_logprobs <= k_lim.max_logprobs, "n_logprobs");
    FUZZ_CHECK(p->top_logprobs >= 0 && p->top_logprobs <= k_lim.max_logprobs, "top_logprobs");
    FUZZ_CHECK(p->n >= 1 && p->n <= k_lim.max_n, "n %d", p->n);
    FUZZ_CHECK(p->max_tokens == -1 || p->max_tokens >= 1, "max_tokens %d", p->max_tokens);
    FUZZ_CHECK(p->min_tokens >= 0, "min_tokens %d", p->min_tokens);
    FUZZ_CHECK(p->n_stop >= 0 && p->n_stop <= SRV_MAX_STOP, "n_stop %d", p->n_stop);
    for (int32_t i = 0; i < p->n_stop; i++) {
        FUZZ_CHECK(p->stop[i] != NULL && p->stop[i][0] != '\0', "empty stop string");
        FUZZ_CHECK(fuzz_utf8_valid(p->stop[i], strlen(p->stop[i])), "stop not UTF-8");
    }
    FUZZ_CHECK(p->n_stop_ids >= 0 && p->n_stop_ids <= ENG_MAX_STOP_IDS, "n_stop_ids");
    for (int32_t i = 0; i < p->n_stop_ids; i++) {
        FUZZ_CHECK(p->stop_ids[i] >= 0 && p->stop_ids[i] < k_lim.vocab_size, "stop id");
    }
    FUZZ_CHECK(p->n_prompts >= 0 && p->n_prompts <= k_lim.max_prompts, "n_prompts %d",
               p->n_prompts);
    if (kind == SRV_KIND_COMPLETION) {
        FUZZ_CHECK(p->n_prompts >= 1, "completion without a prompt");
    }
    for (int32_t i = 0; i < p->n_prompts; i++) {
        const srv_prompt_t *pr = &p->prompts[i];
        if (pr->text != NULL) {
            FUZZ_CHECK(fuzz_utf8_valid(pr->text, pr->text_len), "prompt not UTF-8");
            FUZZ_CHECK(strlen(pr->text) == pr->text_len, "prompt length or NUL inside");
        }
        FUZZ_CHECK(pr->n_ids >= 0, "n_ids");
        for (int32_t k = 0; k < pr->n_ids; k++) {
            FUZZ_CHECK(pr->ids[k] >= 0 && pr->ids[k] < k_lim.vocab_size, "prompt id %d",
                       pr->ids[k]);
        }
    }
    if (kind == SRV_KIND_CHAT) {
        FUZZ_CHECK(p->n_messages >= 1, "chat without messages");
        for (int32_t i = 0; i < p->n_messages; i++) {
            const srv_chat_msg_t *m = &p->messages[i];
            FUZZ_CHECK(m->role != NULL && fuzz_utf8_valid(m->role, strlen(m->role)), "role");
            FUZZ_CHECK(m->content == NULL || fuzz_utf8_valid(m->content, strlen(m->content)),
                       "content not UTF-8");
        }
    }
    FUZZ_CHECK(p->stream == 0 || p->stream == 1, "stream %d", p->stream);
    FUZZ_CHECK(p->include_usage == 0 || p->stream == 1, "include_usage without stream");
    FUZZ_CHECK(p->echo == 0 || p->echo == 1, "echo");
}

static void
one_kind(int kind, const uint8_t *data, size_t size)
{
    srv_params_t p;
    srv_error_t err;

    memset(&err, 0, sizeof(err));
    if (!srv_params_parse(kind, (const char *)data, size, &k_lim, &p, &err)) {
        check_error(&err);
        return;
    }
    check_params(&p, kind);
    /* Stand-in for tokenization: a text prompt gets one id per 3 bytes. */
    for (int32_t i = 0; i < p.n_prompts; i++) {
        srv_prompt_t *pr = &p.prompts[i];
        if (pr->ids == NULL && pr->n_ids == 0) {
            pr->n_ids = (int32_t)(pr->text_len / 3 + 1);
            pr->ids = calloc((size_t)pr->n_ids, sizeof(int32_t));
        }
    }
    if (kind == SRV_KIND_CHAT && p.n_prompts == 0) {
        srv_params_free(&p);
        return;
    }
    memset(&err, 0, sizeof(err));
    if (srv_params_check_context(&p, &k_lim, 16, 256, &err)) {
        FUZZ_CHECK(p.max_tokens >= 1 && p.max_tokens <= k_lim.max_model_len, "max_tokens %d",
                   p.max_tokens);
        FUZZ_CHECK(p.min_tokens <= p.max_tokens, "min_tokens > max_tokens");
    } else {
        check_error(&err);
    }
    srv_params_free(&p);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one_kind(SRV_KIND_COMPLETION, data, size);
    one_kind(SRV_KIND_CHAT, data, size);
    return 0;
}

/* ---- linearity ----------------------------------------------------------- */

static uint8_t *
gen_long_prompt(size_t k, size_t *len)
{
    const char *head = "{\"model\":\"m\",\"prompt\":\"";
    const char *tail = "\",\"max_tokens\":4}";
    size_t n = strlen(head) + k * 6 + strlen(tail);
    uint8_t *b = malloc(n);
    size_t o = 0;

    memcpy(b, head, strlen(head));
    o = strlen(head);
    for (size_t i = 0; i < k; i++) {
        memcpy(b + o, "ab\\n\xc3\xa9", 6);
        o += 6;
    }
    memcpy(b + o, tail, strlen(tail));
    *len = n;
    return b;
}

static uint8_t *
gen_many_messages(size_t k, size_t *len)
{
    const char *head = "{\"model\":\"m\",\"messages\":[";
    const char *msg = "{\"role\":\"user\",\"content\":\"hi there\"},";
    size_t n = strlen(head) + k * strlen(msg) + 2;
    uint8_t *b = malloc(n);
    size_t o = strlen(head);

    memcpy(b, head, o);
    for (size_t i = 0; i < k; i++) {
        memcpy(b + o, msg, strlen(msg));
        o += strlen(msg);
    }
    b[o - 1] = ']';
    b[o] = '}';
    *len = o + 1;
    return b;
}

static uint8_t *
gen_many_fields(size_t k, size_t *len)
{
    /* Many unknown members: each lookup of a known field walks them. */
    size_t n = 32 + k * 16;
    uint8_t *b = malloc(n);
    size_t o = 0;

    o += (size_t)sprintf((char *)b, "{\"prompt\":\"x\"");
    for (size_t i = 0; i < k; i++) {
        o += (size_t)sprintf((char *)b + o, ",\"f%08zu\":1", i % 100000000);
    }
    b[o++] = '}';
    *len = o;
    return b;
}

static void
run_request(const uint8_t *data, size_t len)
{
    LLVMFuzzerTestOneInput(data, len);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"request long prompt", gen_long_prompt, run_request, 4096},
    {"request many messages", gen_many_messages, run_request, 512},
    {"request many fields", gen_many_fields, run_request, 512},
    {NULL, NULL, NULL, 0},
};
