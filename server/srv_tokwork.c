/* srv_tokwork.c - POST /tokenize, /detokenize and /apply-template, each
 * prepared on libuv's thread pool like a generation (issue 15).
 *
 * DESIGN
 *   These endpoints are nothing but preparation: parse a JSON body, render
 *   a chat template, tokenize or detokenize. A large body or prompt took
 *   the loop thread as long as a generation's preparation used to (an
 *   8 MiB prompt: tens of milliseconds), stalling every stream. So the
 *   whole answer is made on a pool thread (srv_work.h): tokw_run parses,
 *   works and prints the JSON answer (or fills an error) from the
 *   borrowed body and the server's read-only state (limits, tokenizer,
 *   template, model name); tokw_done, back on the loop thread, only hands
 *   that text to the request. A client that went away meanwhile gets
 *   nothing (srv_work.h drops the result). Like any non-streamed request,
 *   a FIN before the answer is a hang-up.
 *
 *   /tokenize: {"prompt": text, "add_special_tokens": bool} or
 *   {"messages": [...], "add_generation_prompt": bool} (the conversation
 *   rendered as /v1/chat/completions would) -> {"count", "max_model_len",
 *   "tokens"}. /detokenize: {"tokens": [ids]} -> {"prompt": text}.
 *   /apply-template: {"messages": [...]} -> {"prompt": text}. A "model"
 *   other than the served one is 404.
 *
 * Thread: srv_tok_* on the loop thread; tokw_run on a pool thread.
 */
#define LOG_MODULE "http"

#include "server/srv_tokwork.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "server/srv_int.h"
#include "server/srv_openai.h"
#include "server/srv_work.h"

typedef enum tokw_kind {
    TOKW_TOKENIZE = 0,
    TOKW_DETOKENIZE,
    TOKW_TEMPLATE,
} tokw_kind_t;

/* One request's work item: its input (borrowed), then its answer. */
typedef struct tokw {
    const srv_t *s;
    tokw_kind_t kind;
    const char *body; /* the request's, borrowed while the item is in flight */
    size_t len;
    char *out;        /* the 200 answer's JSON text, or NULL */
    int oom;          /* out of memory: the static 503 */
    srv_error_t err;  /* the error answer when out is NULL and oom is 0 */
} tokw_t;

/* Parses the small JSON body of w, checking its "model". NULL with w's
 * error (or oom) on failure. */
static cJSON *
tokw_parse(tokw_t *w)
{
    const srv_t *s = w->s;
    cJSON *root, *model;

    if (!srv_json_precheck(w->body, w->len, s->lim.max_depth, &w->err)) {
        return NULL;
    }
    unsigned long mark = srv_json_mark();
    root = cJSON_ParseWithLength(w->body, w->len);
    if (xmalloc_try_failures() != mark) {
        cJSON_Delete(root);
        w->oom = 1;
        return NULL;
    }
    if (root == NULL || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_err_set(&w->err, 400, NULL, "request body must be a JSON object");
        return NULL;
    }
    model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(model) && strcmp(model->valuestring, s->model_name) != 0) {
        /* The message quotes the name: format it before the tree goes. */
        srv_err_set(&w->err, 404, "model", "The model '%.100s' does not exist",
                    model->valuestring);
        w->err.code = "model_not_found";
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* The text that "messages" render to through the chat template, as
 * /v1/chat/completions would feed it to the model, or NULL with w's error
 * (or oom). */
static char *
tokw_chat_text(tokw_t *w, cJSON *root, cJSON *msgs)
{
    const srv_t *s = w->s;
    srv_params_t p;
    srv_buf_t body = {0};
    char *mj = cJSON_PrintUnformatted(msgs);

    /* Reuse the chat parser through a minimal chat body. */
    srv_buf_adds(&body, "{\"model\":");
    srv_json_string(&body, s->model_name, strlen(s->model_name));
    srv_buf_adds(&body, ",\"messages\":");
    srv_buf_adds(&body, mj != NULL ? mj : "");
    srv_buf_adds(&body, "}");
    free(mj);
    if (mj == NULL || body.oom) {
        srv_buf_free(&body);
        w->oom = 1;
        return NULL;
    }
    int ok = srv_params_parse(SRV_KIND_CHAT, body.data, body.len, &s->lim, &p, &w->err);
    srv_buf_free(&body);
    if (!ok) {
        w->oom = w->err.status == 0;
        return NULL;
    }
    cJSON *agp = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
    char *text =
        srv_chat_render(s, p.messages, p.n_messages, agp == NULL || cJSON_IsTrue(agp), &w->err);
    srv_params_free(&p);
    if (text == NULL) {
        w->oom = w->err.status == 0;
    }
    return text;
}

/* Prints root (taken) as w's 200 answer. */
static void
tokw_answer(tokw_t *w, cJSON *root, unsigned long mark)
{
    w->out = srv_json_print(root, mark);
    w->oom = w->out == NULL;
}

static void
tokw_tokenize(tokw_t *w, cJSON *root)
{
    const srv_t *s = w->s;
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    cJSON *ast = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    int flags = TOK_PARSE_SPECIAL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc;

    if (cJSON_IsString(prompt)) {
        if (ast == NULL || cJSON_IsTrue(ast)) {
            flags |= TOK_ADD_SPECIAL;
        }
        rc = tok_encode(s->tok, prompt->valuestring, strlen(prompt->valuestring), flags, &ids,
                        &n_ids);
    } else if (cJSON_IsArray(msgs)) {
        char *text = tokw_chat_text(w, root, msgs);
        if (text == NULL) {
            return;
        }
        rc = tok_encode(s->tok, text, strlen(text), TOK_PARSE_SPECIAL, &ids, &n_ids);
        free(text);
    } else {
        srv_err_set(&w->err, 400, "prompt", "'prompt' (a string) or 'messages' is required");
        return;
    }
    if (rc == ST_ENOMEM) {
        w->oom = 1;
        return;
    }
    if (rc != ST_OK) {
        srv_err_set(&w->err, 400, "prompt", "the text could not be tokenized");
        return;
    }
    unsigned long mark = srv_json_mark();
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", (double)n_ids);
    cJSON_AddNumberToObject(out, "max_model_len", s->max_model_len);
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n_ids; i++) {
        srv_json_push(arr, cJSON_CreateNumber(ids[i]));
    }
    free(ids);
    tokw_answer(w, out, mark);
}

static void
tokw_detokenize(tokw_t *w, cJSON *root)
{
    const srv_t *s = w->s;
    cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens"), *it;
    int32_t n = 0, vocab = tok_vocab_size(s->tok);
    char *text = NULL;
    size_t len = 0;

    if (!cJSON_IsArray(toks)) {
        srv_err_set(&w->err, 400, "tokens", "'tokens' must be an array of token ids");
        return;
    }
    int32_t *ids = xcalloc_try((size_t)cJSON_GetArraySize(toks) + 1, sizeof(int32_t));
    if (ids == NULL) {
        w->oom = 1;
        return;
    }
    cJSON_ArrayForEach(it, toks)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble ||
            it->valuedouble < 0 || it->valuedouble >= vocab) {
            free(ids);
            srv_err_set(&w->err, 400, "tokens", "'tokens' items must be token ids in 0..%d",
                        vocab - 1);
            return;
        }
        ids[n++] = (int32_t)it->valuedouble;
    }
    int rc = tok_decode(s->tok, ids, (size_t)n, 0, &text, &len);
    free(ids);
    if (rc == ST_ENOMEM) {
        w->oom = 1;
        return;
    }
    if (rc != ST_OK) {
        srv_err_set(&w->err, 400, "tokens", "the tokens could not be decoded");
        return;
    }
    srv_buf_t clean = {0};
    srv_token_text(text, len, &clean);
    free(text);
    if (clean.oom) {
        srv_buf_free(&clean);
        w->oom = 1;
        return;
    }
    unsigned long mark = srv_json_mark();
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", clean.data);
    srv_buf_free(&clean);
    tokw_answer(w, out, mark);
}

static void
tokw_template(tokw_t *w, cJSON *root)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");

    if (!cJSON_IsArray(msgs)) {
        srv_err_set(&w->err, 400, "messages", "'messages' (an array) is required");
        return;
    }
    char *text = tokw_chat_text(w, root, msgs);
    if (text == NULL) {
        return;
    }
    unsigned long mark = srv_json_mark();
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", text);
    free(text);
    tokw_answer(w, out, mark);
}

/* On a pool thread: the whole answer of w. Touches w, its borrowed body
 * and the server's read-only state only. */
static void
tokw_run(void *arg)
{
    tokw_t *w = arg;
    cJSON *root = tokw_parse(w);

    if (root == NULL) {
        return;
    }
    switch (w->kind) {
    case TOKW_TOKENIZE:
        tokw_tokenize(w, root);
        break;
    case TOKW_DETOKENIZE:
        tokw_detokenize(w, root);
        break;
    case TOKW_TEMPLATE:
        tokw_template(w, root);
        break;
    }
    cJSON_Delete(root);
}

/* Back on the loop thread: hands w's answer to r (live), then frees w. */
static void
tokw_done(srv_req_t *r, void *arg, int live)
{
    tokw_t *w = arg;

    /* Nothing is written before the answer: a FIN meanwhile is a hang-up. */
    if (live && !srv_req_half_close(r, 0)) {
        if (w->out != NULL) {
            srv_req_answer(r, 200, w->out, SRV_CT_JSON, 0);
            w->out = NULL; /* the request's now */
        } else if (w->oom) {
            srv_req_answer(r, 503, NULL, NULL, 1);
        } else {
            srv_req_answer_error(r, &w->err);
        }
    }
    free(w->out);
    free(w);
}

static enum MHD_Result
tokw_start(srv_req_t *r, tokw_kind_t kind)
{
    tokw_t *w = xcalloc_try(1, sizeof(*w));

    if (w == NULL) {
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    w->s = srv_req_server(r);
    w->kind = kind;
    w->body = srv_req_body(r, &w->len);
    if (!srv_work_queue(r, tokw_run, tokw_done, w)) {
        free(w);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    return MHD_YES;
}

enum MHD_Result
srv_tok_tokenize(srv_req_t *r)
{
    return tokw_start(r, TOKW_TOKENIZE);
}

enum MHD_Result
srv_tok_detokenize(srv_req_t *r)
{
    return tokw_start(r, TOKW_DETOKENIZE);
}

enum MHD_Result
srv_tok_apply_template(srv_req_t *r)
{
    return tokw_start(r, TOKW_TEMPLATE);
}
