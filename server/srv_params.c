/* srv_params.c - parsing and validation of /v1/completions and
 * /v1/chat/completions bodies into srv_params_t.
 *
 * Bounds follow the OpenAI API reference (temperature 0..2, top_p 0..1,
 * penalties -2..2, logit_bias -100..100, at most 4 stop strings, n >= 1,
 * completions logprobs 0..5, chat top_logprobs 0..20) plus vLLM's extra
 * sampling fields and the server's caps. Unknown fields are ignored.
 * Loop thread (pure: no I/O).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "server/srv_int.h"
#include "server/srv_structured.h"

void
srv_params_free(srv_params_t *p)
{
    for (int32_t i = 0; i < p->n_prompts; i++) {
        free(p->prompts[i].text);
        free(p->prompts[i].ids);
    }
    free(p->prompts);
    for (int32_t i = 0; i < p->n_messages; i++) {
        free(p->messages[i].role);
        free(p->messages[i].content);
    }
    free(p->messages);
    free(p->bias);
    for (int32_t i = 0; i < p->n_stop; i++) {
        free(p->stop[i]);
    }
    free(p->constraint.spec);
    srv_chat_ext_free(&p->ext);
    memset(p, 0, sizeof(*p));
}

/* A JSON number that is an integer within [lo, hi]. */
static int
get_int(const cJSON *j, const char *name, int64_t lo, int64_t hi, int64_t *out, srv_error_t *err)
{
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) ||
        fabs(j->valuedouble) > 9.0e15) {
        srv_err_set(err, 400, name, "'%s' must be an integer", name);
        return 0;
    }
    if (j->valuedouble < (double)lo || j->valuedouble > (double)hi) {
        srv_err_set(err, 400, name, "'%s' must be in %lld..%lld, got %.0f", name, (long long)lo,
                    (long long)hi, j->valuedouble);
        return 0;
    }
    *out = (int64_t)j->valuedouble;
    return 1;
}

static int
get_num(const cJSON *j, const char *name, double lo, double hi, int lo_open, float *out,
        srv_error_t *err)
{
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        srv_err_set(err, 400, name, "'%s' must be a number", name);
        return 0;
    }
    double v = j->valuedouble;
    if (v < lo || v > hi || (lo_open && v <= lo)) {
        srv_err_set(err, 400, name, "'%s' must be in %s%g, %g], got %g", name, lo_open ? "(" : "[",
                    lo, hi, v);
        return 0;
    }
    *out = (float)v;
    return 1;
}

static int
get_bool(const cJSON *j, const char *name, int *out, srv_error_t *err)
{
    if (!cJSON_IsBool(j)) {
        srv_err_set(err, 400, name, "'%s' must be a boolean", name);
        return 0;
    }
    *out = cJSON_IsTrue(j);
    return 1;
}

/* Field present and not null. */
static const cJSON *
field(const cJSON *root, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    return (j == NULL || cJSON_IsNull(j)) ? NULL : j;
}

static int
parse_token_array(const cJSON *arr, const srv_limits_t *lim, srv_prompt_t *pr, srv_error_t *err)
{
    int32_t n = cJSON_GetArraySize(arr);
    int32_t i = 0;
    const cJSON *it;

    if (n == 0) {
        srv_err_set(err, 400, "prompt", "'prompt' must not be an empty token array");
        return 0;
    }
    pr->ids = xcalloc_try((size_t)n, sizeof(int32_t));
    if (pr->ids == NULL) {
        srv_err_oom(err);
        return 0;
    }
    cJSON_ArrayForEach(it, arr)
    {
        int64_t v;
        if (!get_int(it, "prompt", 0, lim->vocab_size - 1, &v, err)) {
            return 0;
        }
        pr->ids[i++] = (int32_t)v;
    }
    pr->n_ids = n;
    return 1;
}

static int
parse_prompt(const cJSON *pj, const srv_limits_t *lim, srv_params_t *p, srv_error_t *err)
{
    const cJSON *it;
    int32_t n;

    if (pj == NULL) {
        srv_err_set(err, 400, "prompt", "'prompt' is required");
        return 0;
    }
    if (cJSON_IsString(pj)) {
        p->prompts = xcalloc_try(1, sizeof(srv_prompt_t));
        if (p->prompts == NULL) {
            srv_err_oom(err);
            return 0;
        }
        p->n_prompts = 1;
        p->prompts[0].text = xstrdup_try(pj->valuestring);
        if (p->prompts[0].text == NULL) {
            srv_err_oom(err);
            return 0;
        }
        p->prompts[0].text_len = strlen(pj->valuestring);
        return 1;
    }
    if (!cJSON_IsArray(pj) || (n = cJSON_GetArraySize(pj)) == 0) {
        srv_err_set(err, 400, "prompt",
                    "'prompt' must be a string, an array of strings, an array of token ids or "
                    "an array of token id arrays");
        return 0;
    }
    const cJSON *first = cJSON_GetArrayItem(pj, 0);
    if (cJSON_IsNumber(first)) {
        p->prompts = xcalloc_try(1, sizeof(srv_prompt_t));
        if (p->prompts == NULL) {
            srv_err_oom(err);
            return 0;
        }
        p->n_prompts = 1;
        return parse_token_array(pj, lim, &p->prompts[0], err);
    }
    if (n > lim->max_prompts) {
        srv_err_set(err, 400, "prompt", "at most %d prompts per request", lim->max_prompts);
        return 0;
    }
    p->prompts = xcalloc_try((size_t)n, sizeof(srv_prompt_t));
    if (p->prompts == NULL) {
        srv_err_oom(err);
        return 0;
    }
    p->n_prompts = n;
    int32_t i = 0;
    cJSON_ArrayForEach(it, pj)
    {
        srv_prompt_t *pr = &p->prompts[i++];
        if (cJSON_IsString(it) && cJSON_IsString(first)) {
            pr->text = xstrdup_try(it->valuestring);
            if (pr->text == NULL) {
                srv_err_oom(err);
                return 0;
            }
            pr->text_len = strlen(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_IsArray(first)) {
            if (!parse_token_array(it, lim, pr, err)) {
                return 0;
            }
        } else {
            srv_err_set(err, 400, "prompt",
                        "'prompt' array items must all be strings or all be token id arrays");
            return 0;
        }
    }
    return 1;
}

static int
parse_messages(const cJSON *mj, srv_params_t *p, srv_error_t *err)
{
    const cJSON *m;
    int32_t n, i = 0;

    if (mj == NULL || !cJSON_IsArray(mj) || (n = cJSON_GetArraySize(mj)) == 0) {
        srv_err_set(err, 400, "messages", "'messages' must be a non-empty array");
        return 0;
    }
    p->messages = xcalloc_try((size_t)n, sizeof(srv_chat_msg_t));
    if (p->messages == NULL) {
        srv_err_oom(err);
        return 0;
    }
    cJSON_ArrayForEach(m, mj)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        srv_chat_msg_t *out = &p->messages[i];

        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            srv_err_set(err, 400, "messages", "messages[%d] needs a string 'role'", i);
            return 0;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "developer") == 0) {
            r = "system";
        }
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
            strcmp(r, "tool") != 0) {
            srv_err_set(err, 400, "messages",
                        "messages[%d]: role '%.40s' is not supported (system, user, assistant, "
                        "tool)",
                        i, role->valuestring);
            return 0;
        }
        srv_buf_t text = {0};
        if (cJSON_IsString(content)) {
            srv_buf_adds(&text, content->valuestring);
        } else if (cJSON_IsArray(content)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, content)
            {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (cJSON_IsString(type) && strcmp(type->valuestring, "text") != 0) {
                    /* image_url, input_audio, file, ...: refused by name. */
                    srv_buf_free(&text);
                    srv_err_set(err, 400, "messages",
                                "messages[%d]: content parts of type '%.40s' are not supported: "
                                "the model is text-only (send 'text' parts)",
                                i, type->valuestring);
                    err->code = "unsupported_content_type";
                    return 0;
                }
                if (!cJSON_IsString(type) ||
                    !cJSON_IsString(t)) {
                    srv_buf_free(&text);
                    srv_err_set(err, 400, "messages",
                                "messages[%d]: only content parts of type 'text' are supported", i);
                    return 0;
                }
                srv_buf_adds(&text, t->valuestring);
            }
        } else if (content == NULL || cJSON_IsNull(content)) {
            if (strcmp(r, "assistant") != 0) {
                srv_err_set(err, 400, "messages", "messages[%d] needs 'content'", i);
                return 0;
            }
        } else {
            srv_err_set(err, 400, "messages",
                        "messages[%d]: 'content' must be a string or an array of text parts", i);
            return 0;
        }
        srv_buf_add(&text, "", 0);
        out->role = text.oom ? NULL : xstrdup_try(r);
        out->content = text.data;
        p->n_messages = ++i;
        if (out->role == NULL) {
            srv_err_oom(err);
            return 0;
        }
    }
    return 1;
}

static int
parse_stop(const cJSON *sj, srv_params_t *p, srv_error_t *err)
{
    if (sj == NULL) {
        return 1;
    }
    if (cJSON_IsString(sj)) {
        if (sj->valuestring[0] == '\0') {
            srv_err_set(err, 400, "stop", "'stop' strings must not be empty");
            return 0;
        }
        if (strlen(sj->valuestring) > SRV_MAX_STOP_BYTES) {
            srv_err_set(err, 400, "stop", "'stop' strings must be at most %d bytes",
                        SRV_MAX_STOP_BYTES);
            return 0;
        }
        if ((p->stop[p->n_stop] = xstrdup_try(sj->valuestring)) == NULL) {
            srv_err_oom(err);
            return 0;
        }
        p->n_stop++;
        return 1;
    }
    if (!cJSON_IsArray(sj) || cJSON_GetArraySize(sj) > SRV_MAX_STOP) {
        srv_err_set(err, 400, "stop", "'stop' must be a string or an array of up to %d strings",
                    SRV_MAX_STOP);
        return 0;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, sj)
    {
        if (!cJSON_IsString(it) || it->valuestring[0] == '\0') {
            srv_err_set(err, 400, "stop", "'stop' items must be non-empty strings");
            return 0;
        }
        if (strlen(it->valuestring) > SRV_MAX_STOP_BYTES) {
            srv_err_set(err, 400, "stop", "'stop' strings must be at most %d bytes",
                        SRV_MAX_STOP_BYTES);
            return 0;
        }
        if ((p->stop[p->n_stop] = xstrdup_try(it->valuestring)) == NULL) {
            srv_err_oom(err);
            return 0;
        }
        p->n_stop++;
    }
    return 1;
}

static int
parse_logit_bias(const cJSON *bj, const srv_limits_t *lim, srv_params_t *p, srv_error_t *err)
{
    const cJSON *it;
    int32_t n, i = 0;

    if (bj == NULL) {
        return 1;
    }
    if (!cJSON_IsObject(bj)) {
        srv_err_set(err, 400, "logit_bias", "'logit_bias' must be an object");
        return 0;
    }
    n = cJSON_GetArraySize(bj);
    if (n > 1024) {
        srv_err_set(err, 400, "logit_bias", "'logit_bias' has more than 1024 entries");
        return 0;
    }
    p->bias = xcalloc_try((size_t)(n > 0 ? n : 1), sizeof(smp_bias_t));
    if (p->bias == NULL) {
        srv_err_oom(err);
        return 0;
    }
    cJSON_ArrayForEach(it, bj)
    {
        char *end;
        long id = strtol(it->string, &end, 10);
        float v;
        if (it->string[0] == '\0' || *end != '\0' || id < 0 || id >= lim->vocab_size) {
            srv_err_set(err, 400, "logit_bias",
                        "'logit_bias' key '%.32s' is not a token id in 0..%d", it->string,
                        lim->vocab_size - 1);
            return 0;
        }
        if (!get_num(it, "logit_bias", -100, 100, 0, &v, err)) {
            return 0;
        }
        p->bias[i].id = (int32_t)id;
        p->bias[i].bias = v;
        i++;
    }
    p->sampling.bias = p->bias;
    p->sampling.n_bias = i;
    return 1;
}

/* "h2o=B,recent=W" or "snapkv=B,window=W[,pool=K]" (model/kv_policy.h,
 * the same grammar as mdl_kv_policy_parse, which the server core does
 * not link): 1 and *out, or 0 with the reason in why. */
static int
parse_score_policy(const char *s, mdl_kv_policy_t *out, char *why, size_t whylen)
{
    int b = -1, w = -1, k = 1, used = 0, n;

    memset(out, 0, sizeof(*out));
    if (strncmp(s, "h2o=", 4) == 0) {
        if (sscanf(s, "h2o=%d,recent=%d%n", &b, &w, &used) != 2 || s[used] != '\0' || w < 1 ||
            b <= w) {
            snprintf(why, whylen, "'%.40s': expected \"h2o=B,recent=W\" in tokens with "
                                  "1 <= W < B", s);
            return 0;
        }
        out->kind = MDL_KVP_H2O;
    } else {
        n = sscanf(s, "snapkv=%d,window=%d%n,pool=%d%n", &b, &w, &used, &k, &used);
        if ((n != 2 && n != 3) || s[used] != '\0' || w < 1 || b <= w || k < 1) {
            snprintf(why, whylen, "'%.40s': expected \"snapkv=B,window=W,pool=K\" in tokens "
                                  "with 1 <= W < B and K >= 1", s);
            return 0;
        }
        out->kind = MDL_KVP_SNAPKV;
    }
    out->budget = b;
    out->recent = w;
    out->pool = k;
    return 1;
}

static int
parse_common(const cJSON *root, const srv_limits_t *lim, srv_params_t *p, srv_error_t *err)
{
    const cJSON *j;
    int64_t v;

    j = field(root, "model");
    if (j == NULL || !cJSON_IsString(j)) {
        srv_err_set(err, 400, "model", "'model' is required and must be a string");
        return 0;
    }
    if (lim->model_name != NULL && strcmp(j->valuestring, lim->model_name) != 0) {
        srv_err_set(err, 404, "model", "The model '%.100s' does not exist", j->valuestring);
        err->code = "model_not_found";
        return 0;
    }

    p->sampling.temperature = 1.0f;
    p->sampling.top_p = 1.0f;
    p->sampling.top_k = 0;
    p->sampling.repetition_penalty = 1.0f;
    p->n = 1;
    p->max_tokens = -1;
    p->skip_special_tokens = 1;
    p->speculative = 1;
    p->add_generation_prompt = 1;

    if ((j = field(root, "temperature")) &&
        !get_num(j, "temperature", 0, 2, 0, &p->sampling.temperature, err)) {
        return 0;
    }
    if ((j = field(root, "top_p")) && !get_num(j, "top_p", 0, 1, 1, &p->sampling.top_p, err)) {
        return 0;
    }
    if ((j = field(root, "top_k"))) {
        if (!get_int(j, "top_k", -1, 1 << 30, &v, err)) {
            return 0;
        }
        p->sampling.top_k = v <= 0 ? 0 : (int32_t)v;
    }
    if ((j = field(root, "min_p")) && !get_num(j, "min_p", 0, 1, 0, &p->sampling.min_p, err)) {
        return 0;
    }
    if ((j = field(root, "presence_penalty")) &&
        !get_num(j, "presence_penalty", -2, 2, 0, &p->sampling.presence_penalty, err)) {
        return 0;
    }
    if ((j = field(root, "frequency_penalty")) &&
        !get_num(j, "frequency_penalty", -2, 2, 0, &p->sampling.frequency_penalty, err)) {
        return 0;
    }
    if ((j = field(root, "repetition_penalty")) &&
        !get_num(j, "repetition_penalty", 0, 2, 1, &p->sampling.repetition_penalty, err)) {
        return 0;
    }
    if (!parse_logit_bias(field(root, "logit_bias"), lim, p, err)) {
        return 0;
    }
    if ((j = field(root, "seed"))) {
        if (!get_int(j, "seed", INT64_MIN / 2, INT64_MAX / 2, &v, err)) {
            return 0;
        }
        p->seed = (uint64_t)v;
        p->has_seed = 1;
    }
    if (!parse_stop(field(root, "stop"), p, err)) {
        return 0;
    }
    if ((j = field(root, "stop_token_ids"))) {
        const cJSON *it;
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) > ENG_MAX_STOP_IDS) {
            srv_err_set(err, 400, "stop_token_ids",
                        "'stop_token_ids' must be an array of up to %d token ids",
                        ENG_MAX_STOP_IDS);
            return 0;
        }
        cJSON_ArrayForEach(it, j)
        {
            if (!get_int(it, "stop_token_ids", 0, lim->vocab_size - 1, &v, err)) {
                return 0;
            }
            p->stop_ids[p->n_stop_ids++] = (int32_t)v;
        }
    }
    if ((j = field(root, "n"))) {
        if (!get_int(j, "n", 1, 128, &v, err)) {
            return 0;
        }
        if (v > lim->max_n) {
            srv_err_set(err, 400, "n", "'n' is limited to %d on this server", lim->max_n);
            return 0;
        }
        p->n = (int32_t)v;
    }
    if ((j = field(root, "stream")) && !get_bool(j, "stream", &p->stream, err)) {
        return 0;
    }
    if ((j = field(root, "stream_options"))) {
        const cJSON *iu;
        if (!cJSON_IsObject(j)) {
            srv_err_set(err, 400, "stream_options", "'stream_options' must be an object");
            return 0;
        }
        if (!p->stream) {
            srv_err_set(err, 400, "stream_options",
                        "'stream_options' is only allowed when 'stream' is true");
            return 0;
        }
        if ((iu = field(j, "include_usage")) &&
            !get_bool(iu, "stream_options.include_usage", &p->include_usage, err)) {
            return 0;
        }
    }
    if ((j = field(root, "ignore_eos")) && !get_bool(j, "ignore_eos", &p->ignore_eos, err)) {
        return 0;
    }
    if ((j = field(root, "speculative")) && !get_bool(j, "speculative", &p->speculative, err)) {
        return 0;
    }
    if ((j = field(root, "skip_special_tokens")) &&
        !get_bool(j, "skip_special_tokens", &p->skip_special_tokens, err)) {
        return 0;
    }
    if ((j = field(root, "min_tokens"))) {
        if (!get_int(j, "min_tokens", 0, 1 << 30, &v, err)) {
            return 0;
        }
        p->min_tokens = (int32_t)v;
    }
    if ((j = field(root, "priority"))) {
        if (!get_int(j, "priority", -1000000, 1000000, &v, err)) {
            return 0;
        }
        p->priority = (int32_t)v;
    }
    if ((j = field(root, "user")) && !cJSON_IsString(j)) {
        srv_err_set(err, 400, "user", "'user' must be a string");
        return 0;
    }
    if ((j = field(root, "kv_policy"))) {
        int sink = -1, window = -1, used = 0;
        char why[200] = "";

        if (cJSON_IsString(j) && (strncmp(j->valuestring, "h2o", 3) == 0 ||
                                  strncmp(j->valuestring, "snapkv", 6) == 0)) {
            /* Attention-score eviction (model/kv_policy.h); the scheduler
             * checks the budget against the context. */
            if (!parse_score_policy(j->valuestring, &p->kv_score, why, sizeof(why))) {
                srv_err_set(err, 400, "kv_policy", "'kv_policy': %s", why);
                return 0;
            }
        } else if (cJSON_IsString(j) && strcmp(j->valuestring, "full") == 0) {
            p->kv_window = -1;
        } else if (cJSON_IsString(j) &&
                   sscanf(j->valuestring, "sink=%d,window=%d%n", &sink, &window, &used) == 2 &&
                   j->valuestring[used] == '\0' && sink >= 0 && window > 0) {
            p->kv_sink = sink;
            p->kv_window = window;
        } else {
            srv_err_set(err, 400, "kv_policy",
                        "'kv_policy' must be \"full\", \"sink=S,window=W\", \"h2o=B,recent=W\" "
                        "or \"snapkv=B,window=W,pool=K\" (tokens)");
            return 0;
        }
    }
    return 1;
}

static int
parse_max_tokens(const cJSON *root, const char *name, srv_params_t *p, srv_error_t *err)
{
    const cJSON *j = field(root, name);
    int64_t v;

    if (j == NULL) {
        return 1;
    }
    if (!get_int(j, name, 1, 1 << 30, &v, err)) {
        return 0;
    }
    p->max_tokens = (int32_t)v;
    return 1;
}

int
srv_params_parse(int kind, const char *body, size_t len, const srv_limits_t *lim, srv_params_t *p,
                 srv_error_t *err)
{
    cJSON *root;
    const cJSON *j;
    int ok = 0;
    int64_t v;

    memset(p, 0, sizeof(*p));
    p->kind = kind;
    if (!srv_json_precheck(body, len, lim->max_depth, err)) {
        return 0;
    }
    unsigned long failures = xmalloc_try_failures();
    root = cJSON_ParseWithLength(body, len);
    if (xmalloc_try_failures() != failures) {
        /* cJSON allocates through xmalloc_try (srv_json_hooks): a failed
         * allocation is not the client's fault. */
        cJSON_Delete(root);
        srv_err_oom(err);
        return 0;
    }
    if (root == NULL) {
        srv_err_set(err, 400, NULL, "request body is not valid JSON");
        return 0;
    }
    if (!cJSON_IsObject(root)) {
        srv_err_set(err, 400, NULL, "request body must be a JSON object");
        goto done;
    }
    if (!parse_common(root, lim, p, err)) {
        goto done;
    }
    if (kind == SRV_KIND_COMPLETION) {
        if (!parse_prompt(field(root, "prompt"), lim, p, err)) {
            goto done;
        }
        if ((int64_t)p->n_prompts * p->n > lim->max_prompts * (int64_t)lim->max_n) {
            srv_err_set(err, 400, "n", "too many choices in one request");
            goto done;
        }
        if (!parse_max_tokens(root, "max_tokens", p, err)) {
            goto done;
        }
        if ((j = field(root, "echo")) && !get_bool(j, "echo", &p->echo, err)) {
            goto done;
        }
        if ((j = field(root, "logprobs"))) {
            if (!get_int(j, "logprobs", 0, 5, &v, err)) {
                goto done;
            }
            p->logprobs = 1;
            p->top_logprobs = (int32_t)v;
        }
        if ((j = field(root, "suffix")) && (!cJSON_IsString(j) || j->valuestring[0] != '\0')) {
            srv_err_set(err, 400, "suffix", "'suffix' is not supported");
            goto done;
        }
        if ((j = field(root, "best_of"))) {
            if (!get_int(j, "best_of", 1, 128, &v, err)) {
                goto done;
            }
            if (v != p->n) {
                srv_err_set(err, 400, "best_of", "'best_of' other than 'n' is not supported");
                goto done;
            }
        }
        if (p->echo && p->logprobs) {
            srv_err_set(err, 400, "echo", "'echo' together with 'logprobs' is not supported");
            goto done;
        }
    } else {
        if (!parse_messages(field(root, "messages"), p, err)) {
            goto done;
        }
        if (!parse_max_tokens(root, "max_tokens", p, err) ||
            !parse_max_tokens(root, "max_completion_tokens", p, err)) {
            goto done;
        }
        if ((j = field(root, "logprobs")) && !get_bool(j, "logprobs", &p->logprobs, err)) {
            goto done;
        }
        if ((j = field(root, "top_logprobs"))) {
            if (!get_int(j, "top_logprobs", 0, 20, &v, err)) {
                goto done;
            }
            if (!p->logprobs) {
                srv_err_set(err, 400, "top_logprobs",
                            "'top_logprobs' requires 'logprobs' to be true");
                goto done;
            }
            p->top_logprobs = (int32_t)v;
        }
        if ((j = field(root, "add_generation_prompt")) &&
            !get_bool(j, "add_generation_prompt", &p->add_generation_prompt, err)) {
            goto done;
        }
        if (!srv_chat_ext_parse(root, p, err)) {
            goto done;
        }
    }
    /* Structured output (srv_structured.c), on both kinds. */
    if (!srv_constraint_parse(root, p, err)) {
        goto done;
    }
    if (p->top_logprobs > lim->max_logprobs) {
        srv_err_set(err, 400, kind == SRV_KIND_CHAT ? "top_logprobs" : "logprobs",
                    "at most %d top logprobs on this server", lim->max_logprobs);
        goto done;
    }
    p->sampling.n_logprobs = p->logprobs ? p->top_logprobs : 0;
    p->sampling.no_logprob = !p->logprobs; /* the sampler skips its log-softmax then */
    ok = 1;
done:
    cJSON_Delete(root);
    if (!ok) {
        srv_params_free(p);
    }
    return ok;
}

int
srv_params_check_context(srv_params_t *p, const srv_limits_t *lim, int32_t block_size,
                         int32_t kv_blocks, srv_error_t *err)
{
    int32_t longest = 0;
    int32_t ctx = lim->max_model_len;
    const char *mt = p->kind == SRV_KIND_CHAT ? "max_completion_tokens" : "max_tokens";

    for (int32_t i = 0; i < p->n_prompts; i++) {
        if (p->prompts[i].n_ids > longest) {
            longest = p->prompts[i].n_ids;
        }
    }
    if (longest >= ctx) {
        srv_err_set(err, 400, p->kind == SRV_KIND_CHAT ? "messages" : "prompt",
                    "This model's maximum context length is %d tokens. However, your prompt has "
                    "%d tokens, which leaves no room for a completion.",
                    ctx, longest);
        return 0;
    }
    if (p->max_tokens < 0) {
        int32_t rest = ctx - longest;
        p->max_tokens = p->kind == SRV_KIND_COMPLETION ? (rest < 16 ? rest : 16) : rest;
        if (lim->max_tokens_cap > 0 && p->max_tokens > lim->max_tokens_cap) {
            p->max_tokens = lim->max_tokens_cap;
        }
    }
    if (lim->max_tokens_cap > 0 && p->max_tokens > lim->max_tokens_cap) {
        srv_err_set(err, 400, mt, "'%s' is limited to %d on this server", mt, lim->max_tokens_cap);
        return 0;
    }
    /* Attention sinks + rolling window: the KV cache never outgrows the
     * context, so the completion may. */
    int rolling = p->kv_window > 0 || (p->kv_window == 0 && lim->kv_window > 0);

    if (!rolling && (int64_t)longest + p->max_tokens > ctx) {
        srv_err_set(err, 400, mt,
                    "This model's maximum context length is %d tokens. However, you requested "
                    "%lld tokens (%d in the prompt, %d for the completion).",
                    ctx, (long long)longest + p->max_tokens, longest, p->max_tokens);
        return 0;
    }
    if (p->min_tokens > p->max_tokens) {
        srv_err_set(err, 400, "min_tokens", "'min_tokens' (%d) exceeds '%s' (%d)", p->min_tokens,
                    mt, p->max_tokens);
        return 0;
    }
    if (kv_blocks > 0 && block_size > 0) {
        /* Worst case for one prompt's n choices: the prompt's full blocks are
         * shared, every choice owns the rest of its sequence. */
        int64_t full = longest / block_size;
        int64_t len = (int64_t)longest + p->max_tokens;
        int64_t per_seq = ((rolling && len > ctx ? ctx : len) + block_size - 1) / block_size;
        int64_t need = full + (int64_t)p->n * (per_seq - full);
        if (need > kv_blocks) {
            srv_err_set(err, 400, p->n > 1 ? "n" : mt,
                        "This request needs up to %lld KV cache blocks (%d choices of %lld "
                        "tokens) but the KV cache holds %d blocks of %d tokens.",
                        (long long)need, p->n, (long long)longest + p->max_tokens, kv_blocks,
                        block_size);
            return 0;
        }
    }
    return 1;
}
