/* srv_openai.c - the OpenAI response and chunk builders, one set per
 * generation endpoint (/v1/completions, /v1/chat/completions), and the
 * shared assembly of whole responses, stream chunks and usage.
 *
 * DESIGN
 *   Everything that differs between the endpoints is a field or a
 *   function of its srv_api_t (srv_openai.h): ids and object names,
 *   tokenizer flags, turning a conversation into a prompt, the logprobs
 *   format, and a choice's content in a chunk and in a whole response.
 *   The assembly around it (the chunk's head, logprobs and finish_reason,
 *   the choices array, usage) is written once here.
 *
 *   Stream chunks are built by hand: one chunk per token and choice is the
 *   hot path of the loop thread, and cJSON would allocate a node per
 *   field. Their layout is exactly what the cJSON objects of a whole
 *   response print.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "server/srv_limits.h"
#include "server/srv_openai.h"
#include "server/srv_state.h"
#include "server/srv_tools.h"

/* ---- shared pieces ----------------------------------------------------------- */

static void
id_string(const srv_resp_t *rs, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s-%016" PRIx64, rs->api->id_prefix, rs->id);
}

static cJSON *
base_object(const srv_resp_t *rs, int chunk)
{
    cJSON *o = cJSON_CreateObject();
    char id[48];

    id_string(rs, id, sizeof(id));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", chunk ? rs->api->chunk_object : rs->api->object);
    cJSON_AddNumberToObject(o, "created", (double)rs->created);
    cJSON_AddStringToObject(o, "model", rs->model);
    return o;
}

static cJSON *
usage_object(const srv_usage_t *u)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddNumberToObject(o, "prompt_tokens", (double)u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)(u->prompt_tokens + u->completion_tokens));
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)u->cached_tokens);
    return o;
}

/* The text of one token as it stands in the output (special tokens
 * included): a SentencePiece token keeps its leading space, so the tokens
 * of a choice joined are its text, and a byte-fallback token is its byte
 * (OpenAI's and vLLM's logprobs). raw receives the bytes, txt the same with
 * invalid UTF-8 replaced. Out of memory shows as a failed fallible
 * allocation on this thread (the caller's mark). */
static void
token_piece(const srv_resp_t *rs, int32_t id, srv_buf_t *raw, srv_buf_t *txt)
{
    size_t n = 0;
    const char *t = tok_token_bytes(rs->tok, id, &n);

    raw->len = 0;
    txt->len = 0;
    srv_buf_add(raw, t ? t : "", n);
    srv_token_text(t ? t : "", n, txt);
}

static cJSON *
bytes_array(const srv_buf_t *raw)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < raw->len; i++) {
        srv_json_push(a, cJSON_CreateNumber((unsigned char)raw->data[i]));
    }
    return a;
}

static double
finite_lp(float v)
{
    return v < -9999.0f || v != v ? -9999.0 : (double)v;
}

/* Calls add(into, raw, txt, logprob) for each alternative of t the
 * request asked for (top_logprobs), in the sampler's order. */
static void
lp_each_top(const srv_resp_t *rs, const smp_result_t *t, cJSON *into,
            void (*add)(cJSON *into, const srv_buf_t *raw, const srv_buf_t *txt, double logprob))
{
    int32_t ntop = t->n_top < rs->p->top_logprobs ? t->n_top : rs->p->top_logprobs;

    for (int32_t k = 0; k < ntop; k++) {
        srv_buf_t raw = {0}, txt = {0};
        token_piece(rs, t->top_ids[k], &raw, &txt);
        add(into, &raw, &txt, finite_lp(t->top_logprobs[k]));
        srv_buf_free(&raw);
        srv_buf_free(&txt);
    }
}

/* The prompt of choice ci as text (echo): as given, or decoded from ids. */
static void
prompt_text(const srv_resp_t *rs, int32_t ci, srv_buf_t *out)
{
    const srv_prompt_t *pr = &rs->p->prompts[ci / rs->p->n];

    if (pr->text != NULL) {
        srv_buf_add(out, pr->text, pr->text_len);
    } else {
        char *dec = NULL;
        size_t dl = 0;
        if (tok_decode(rs->tok, pr->ids, (size_t)pr->n_ids, 1, &dec, &dl) == ST_OK) {
            srv_token_text(dec, dl, out);
        }
        free(dec);
    }
    srv_buf_add(out, "", 0);
}

/* ---- /v1/completions ---------------------------------------------------------- */

static cJSON *
cmpl_lp_new(void)
{
    cJSON *lp = cJSON_CreateObject();

    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

/* Completions' top_logprobs are an object keyed by token text: the first
 * (most likely) of tokens with the same text wins. */
static void
cmpl_top_add(cJSON *tops, const srv_buf_t *raw, const srv_buf_t *txt, double logprob)
{
    const char *key = txt->data ? txt->data : "";

    (void)raw;
    if (cJSON_GetObjectItemCaseSensitive(tops, key) == NULL) {
        cJSON_AddNumberToObject(tops, key, logprob);
    }
}

static void
cmpl_lp_add(const srv_resp_t *rs, srv_choice_t *ch, cJSON *lp, const smp_result_t *t)
{
    srv_buf_t raw = {0}, txt = {0};

    token_piece(rs, t->token, &raw, &txt);
    srv_json_push(cJSON_GetObjectItemCaseSensitive(lp, "tokens"),
                  cJSON_CreateString(txt.data ? txt.data : ""));
    srv_json_push(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"),
                  cJSON_CreateNumber(finite_lp(t->logprob)));
    cJSON *tops = cJSON_CreateObject();
    lp_each_top(rs, t, tops, cmpl_top_add);
    srv_json_push(cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs"), tops);
    srv_json_push(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"),
                  cJSON_CreateNumber(ch->text_offset));
    ch->text_offset += (int32_t)txt.len;
    srv_buf_free(&raw);
    srv_buf_free(&txt);
}

static int
cmpl_chunk_owed(const srv_resp_t *rs, const srv_choice_t *ch)
{
    return rs->p->echo && !ch->echo_sent;
}

static void
cmpl_chunk_content(const srv_resp_t *rs, int32_t ci, srv_choice_t *ch, const srv_buf_t *piece,
                   const char *finish, srv_buf_t *out)
{
    (void)finish;
    srv_buf_adds(out, "\"text\":");
    if (rs->p->echo && !ch->echo_sent) {
        srv_buf_t t = {0};
        prompt_text(rs, ci, &t);
        srv_buf_add(&t, piece->data ? piece->data : "", piece->len);
        srv_json_string(out, t.data, t.len);
        srv_buf_free(&t);
    } else {
        srv_json_string(out, piece->data ? piece->data : "", piece->len);
    }
    ch->echo_sent = 1;
    srv_buf_adds(out, ",");
}

static void
cmpl_body_content(const srv_resp_t *rs, int32_t ci, const srv_choice_t *ch, cJSON *c)
{
    const char *text = ch->text.data ? ch->text.data : "";

    if (rs->p->echo) {
        srv_buf_t t = {0};
        prompt_text(rs, ci, &t);
        srv_buf_adds(&t, text);
        cJSON_AddStringToObject(c, "text", t.data ? t.data : "");
        srv_buf_free(&t);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
}

const srv_api_t srv_api_completions = {
    .kind = SRV_KIND_COMPLETION,
    .name = "completion",
    .id_prefix = "cmpl",
    .object = "text_completion",
    .chunk_object = "text_completion",
    .tok_flags = TOK_PARSE_SPECIAL | TOK_ADD_SPECIAL,
    .prepare = NULL, /* the prompts are text or ids already */
    .lp_new = cmpl_lp_new,
    .lp_add = cmpl_lp_add,
    .chunk_owed = cmpl_chunk_owed,
    .chunk_content = cmpl_chunk_content,
    .body_content = cmpl_body_content,
};

/* ---- /v1/chat/completions ----------------------------------------------------- */

/* The conversation rendered by the chat template is the one prompt. */
static int
chat_prepare(const srv_t *s, srv_params_t *p, srv_error_t *err)
{
    /* Tools, tool history, kwargs and the output parser: srv_tools.h. */
    srv_tools_opts_t o = {s->chat != NULL ? s->chat_template : NULL, s->cfg->tool_call_parser,
                          s->cfg->reasoning_parser, 0};
    char *extra = NULL, *text;

    if (!srv_tools_prepare(p, &o, &extra, err)) {
        return 0;
    }
    text = srv_chat_render_extra(s, p->messages, p->n_messages, p->add_generation_prompt, extra,
                                 err);
    free(extra);
    if (text == NULL) {
        return 0;
    }
    p->prompts = xcalloc_try(1, sizeof(srv_prompt_t));
    if (p->prompts == NULL) {
        free(text);
        srv_err_oom(err);
        return 0;
    }
    p->n_prompts = 1;
    p->prompts[0].text = text;
    p->prompts[0].text_len = strlen(text);
    return 1;
}

static cJSON *
chat_lp_new(void)
{
    cJSON *lp = cJSON_CreateObject();

    cJSON_AddArrayToObject(lp, "content");
    cJSON_AddNullToObject(lp, "refusal");
    return lp;
}

/* A chat logprobs entry: {"token","logprob","bytes"}. */
static cJSON *
chat_lp_entry(const srv_buf_t *raw, const srv_buf_t *txt, double logprob)
{
    cJSON *e = cJSON_CreateObject();

    cJSON_AddStringToObject(e, "token", txt->data ? txt->data : "");
    cJSON_AddNumberToObject(e, "logprob", logprob);
    srv_json_add(e, "bytes", bytes_array(raw));
    return e;
}

static void
chat_top_add(cJSON *tops, const srv_buf_t *raw, const srv_buf_t *txt, double logprob)
{
    srv_json_push(tops, chat_lp_entry(raw, txt, logprob));
}

static void
chat_lp_add(const srv_resp_t *rs, srv_choice_t *ch, cJSON *lp, const smp_result_t *t)
{
    srv_buf_t raw = {0}, txt = {0};

    (void)ch;
    token_piece(rs, t->token, &raw, &txt);
    cJSON *e = chat_lp_entry(&raw, &txt, finite_lp(t->logprob));
    cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
    lp_each_top(rs, t, tops, chat_top_add);
    srv_json_push(cJSON_GetObjectItemCaseSensitive(lp, "content"), e);
    srv_buf_free(&raw);
    srv_buf_free(&txt);
}

static int
chat_chunk_owed(const srv_resp_t *rs, const srv_choice_t *ch)
{
    (void)rs;
    return !ch->role_sent || (ch->tp != NULL && srv_tp_pending(ch->tp));
}

/* A chunk's delta from the output parser: its next event. */
static void
chat_chunk_tp(srv_choice_t *ch, srv_buf_t *out)
{
    srv_tp_event_t ev;
    int has = srv_tp_next(ch->tp, &ev);

    srv_buf_adds(out, "\"delta\":{");
    if (!ch->role_sent) {
        srv_buf_adds(out, has ? "\"role\":\"assistant\"," : "\"role\":\"assistant\"");
        ch->role_sent = 1;
    }
    if (has) {
        srv_tp_chat_delta(ch->tp, &ev, out);
    }
    srv_buf_adds(out, "},");
}

static void
chat_chunk_content(const srv_resp_t *rs, int32_t ci, srv_choice_t *ch, const srv_buf_t *piece,
                   const char *finish, srv_buf_t *out)
{
    (void)rs;
    (void)ci;
    if (ch->tp != NULL) {
        chat_chunk_tp(ch, out);
        return;
    }
    srv_buf_adds(out, "\"delta\":{");
    if (!ch->role_sent) {
        srv_buf_adds(out, "\"role\":\"assistant\"");
        ch->role_sent = 1;
        if (piece->len > 0 || finish == NULL) {
            srv_buf_adds(out, ",");
        }
    }
    if (piece->len > 0 || finish == NULL) {
        srv_buf_adds(out, "\"content\":");
        srv_json_string(out, piece->data ? piece->data : "", piece->len);
    }
    srv_buf_adds(out, "},");
}

static void
chat_body_content(const srv_resp_t *rs, int32_t ci, const srv_choice_t *ch, cJSON *c)
{
    (void)rs;
    (void)ci;
    cJSON *m = cJSON_AddObjectToObject(c, "message");
    const srv_tp_t *tp = ch->tp;
    cJSON_AddStringToObject(m, "role", "assistant");
    if (tp == NULL) {
        cJSON_AddStringToObject(m, "content", ch->text.data ? ch->text.data : "");
    } else if (tp->n_calls > 0 && tp->content.len == 0) {
        cJSON_AddNullToObject(m, "content");
    } else {
        cJSON_AddStringToObject(m, "content", tp->content.data ? tp->content.data : "");
    }
    if (tp != NULL && tp->reasoning.len > 0) {
        cJSON_AddStringToObject(m, "reasoning_content", tp->reasoning.data);
    }
    if (tp != NULL && tp->n_calls > 0) {
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (int32_t i = 0; i < tp->n_calls; i++) {
            cJSON *tc = cJSON_CreateObject(), *fn;
            cJSON_AddStringToObject(tc, "id", tp->calls[i].id);
            cJSON_AddStringToObject(tc, "type", "function");
            fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", tp->calls[i].name);
            cJSON_AddStringToObject(fn, "arguments", tp->calls[i].args);
            srv_json_push(calls, tc);
        }
    }
    cJSON_AddNullToObject(m, "refusal");
}

const srv_api_t srv_api_chat = {
    .kind = SRV_KIND_CHAT,
    .name = "chat",
    .id_prefix = "chatcmpl",
    .object = "chat.completion",
    .chunk_object = "chat.completion.chunk",
    .tok_flags = TOK_PARSE_SPECIAL, /* the template wrote the special tokens */
    .prepare = chat_prepare,
    .lp_new = chat_lp_new,
    .lp_add = chat_lp_add,
    .chunk_owed = chat_chunk_owed,
    .chunk_content = chat_chunk_content,
    .body_content = chat_body_content,
};

/* ---- assembly ---------------------------------------------------------------- */

int
srv_api_prompts(const srv_t *s, const srv_api_t *api, srv_params_t *p, srv_error_t *err)
{
    if (api->prepare != NULL && !api->prepare(s, p, err)) {
        return 0;
    }
    for (int32_t i = 0; i < p->n_prompts; i++) {
        srv_prompt_t *pr = &p->prompts[i];
        size_t n = 0;
        if (pr->ids != NULL) {
            continue;
        }
        if (pr->text_len > srv_prompt_byte_cap(s->tok, s->max_model_len)) {
            /* Refused on its length, before any tokenizing (srv_limits.h). */
            srv_err_set(err, 400, "prompt",
                        "the prompt is %zu bytes: more than %d tokens of context can hold",
                        pr->text_len, s->max_model_len);
            return 0;
        }
        int rc = tok_encode(s->tok, pr->text, pr->text_len, api->tok_flags, &pr->ids, &n);
        if (rc == ST_ENOMEM) {
            srv_err_oom(err);
            return 0;
        }
        if (rc != ST_OK) {
            srv_err_set(err, 400, "prompt", "the prompt could not be tokenized");
            return 0;
        }
        if (n == 0) {
            srv_err_set(err, 400, "prompt", "the prompt is empty");
            return 0;
        }
        pr->n_ids = (int32_t)n;
    }
    return 1;
}

void
srv_api_chunk(const srv_resp_t *rs, srv_buf_t *prefix, int32_t ci, srv_choice_t *ch,
              const srv_buf_t *piece, cJSON *lp, const char *finish, srv_buf_t *out)
{
    if (rs->api->chunk != NULL) {
        cJSON_Delete(lp);
        rs->api->chunk(rs, ch, finish, out);
        return;
    }
    if (prefix->len == 0) {
        char id[48];
        id_string(rs, id, sizeof(id));
        srv_buf_printf(prefix,
                       "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,"
                       "\"model\":",
                       id, rs->api->chunk_object, (long long)rs->created);
        srv_json_string(prefix, rs->model, strlen(rs->model));
        srv_buf_adds(prefix, ",\"choices\":[{\"index\":");
    }
    srv_buf_add(out, prefix->data, prefix->len);
    srv_buf_printf(out, "%d,", ci);
    rs->api->chunk_content(rs, ci, ch, piece, finish, out);
    srv_buf_adds(out, "\"logprobs\":");
    if (lp != NULL) {
        char *lpj = cJSON_PrintUnformatted(lp);
        if (lpj != NULL) {
            srv_buf_adds(out, lpj);
            free(lpj);
        }
        cJSON_Delete(lp);
    } else {
        srv_buf_adds(out, "null");
    }
    srv_buf_adds(out, ",\"finish_reason\":");
    if (finish != NULL) {
        srv_json_string(out, finish, strlen(finish));
    } else {
        srv_buf_adds(out, "null");
    }
    /* Chat chunks carry "usage": null until the usage chunk (the spec's
     * CreateChatCompletionStreamResponse); CreateCompletionResponse has
     * no null usage, so completion chunks leave it out. */
    srv_buf_adds(out, rs->p->include_usage && rs->api->kind == SRV_KIND_CHAT
                          ? "}],\"usage\":null}\n\n"
                          : "}]}\n\n");
}

void
srv_api_usage_chunk(const srv_resp_t *rs, const srv_usage_t *u, srv_buf_t *out)
{
    unsigned long mark = srv_json_mark();
    cJSON *chunk = base_object(rs, 1);

    cJSON_AddArrayToObject(chunk, "choices");
    srv_json_add(chunk, "usage", usage_object(u));
    char *json = srv_json_print(chunk, mark);
    if (json != NULL) {
        srv_sse_data(out, json);
        free(json);
    }
}

char *
srv_api_body(const srv_resp_t *rs, srv_choice_t *choices, int32_t n_choices, const srv_usage_t *u)
{
    if (rs->api->body != NULL) {
        return rs->api->body(rs, choices, u);
    }
    unsigned long mark = srv_json_mark();
    cJSON *root = base_object(rs, 0);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");

    for (int32_t ci = 0; ci < n_choices; ci++) {
        srv_choice_t *ch = &choices[ci];
        cJSON *c = cJSON_CreateObject();

        cJSON_AddNumberToObject(c, "index", ci);
        rs->api->body_content(rs, ci, ch, c);
        if (ch->lp != NULL) {
            srv_json_add(c, "logprobs", ch->lp);
            ch->lp = NULL;
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", ch->finish ? ch->finish : "stop");
        srv_json_push(arr, c);
    }
    srv_json_add(root, "usage", usage_object(u));
    return srv_json_print(root, mark);
}
