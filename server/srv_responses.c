/* srv_responses.c - POST /v1/responses, OpenAI's Responses API, stateless:
 * the request becomes a chat request, and the chat generation's output
 * parser (srv_toolparse.h) feeds a Response object or its event stream.
 *
 * DESIGN
 *   rsp_parse() translates the body into a chat completions body (input
 *   items into messages: function_call items into an assistant message's
 *   tool_calls, function_call_output items into tool messages;
 *   instructions into a system message; function tools and tool_choice
 *   into their chat shapes; max_output_tokens) and parses that with
 *   srv_params_parse, then sets the constraint from text.format. Error
 *   params name the Responses fields. store: true is refused (nothing is
 *   stored); absent store is taken as false. previous_response_id,
 *   conversation and background need state and are refused too.
 *
 *   The stream is the Responses event sequence: response.created,
 *   response.in_progress, then per output item output_item.added, for a
 *   message content_part.added, output_text.delta..., output_text.done,
 *   content_part.done, for a function call function_call_arguments.delta
 *   and .done, then output_item.done; at the end response.completed (or
 *   response.incomplete when max_output_tokens ran out). One choice.
 *   Reasoning text (--reasoning-parser) is not part of the output.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "server/srv_openai.h"
#include "server/srv_state.h"
#include "server/srv_toolparse.h"

static const cJSON *
field(const cJSON *o, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return (j == NULL || cJSON_IsNull(j)) ? NULL : j;
}

/* ---- the request ------------------------------------------------------------- */

/* A message item's content: a string, or input_text / output_text parts. */
static int
item_text(const cJSON *c, int32_t i, srv_buf_t *out, srv_error_t *err)
{
    const cJSON *part;

    if (cJSON_IsString(c)) {
        srv_buf_adds(out, c->valuestring);
        return 1;
    }
    if (!cJSON_IsArray(c)) {
        srv_err_set(err, 400, "input", "input[%d]: 'content' must be a string or an array", i);
        return 0;
    }
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = field(part, "type"), *text = field(part, "text");
        if (!cJSON_IsString(type) ||
            (strcmp(type->valuestring, "input_text") != 0 &&
             strcmp(type->valuestring, "output_text") != 0 &&
             strcmp(type->valuestring, "text") != 0) ||
            !cJSON_IsString(text)) {
            srv_err_set(err, 400, "input",
                        "input[%d]: content parts of type '%.32s' are not supported (the model "
                        "is text-only: input_text, output_text)",
                        i, cJSON_IsString(type) ? type->valuestring : "?");
            return 0;
        }
        srv_buf_adds(out, text->valuestring);
    }
    return 1;
}

static int
input_messages(const cJSON *in, cJSON *msgs, srv_error_t *err)
{
    const cJSON *it;
    cJSON *calls = NULL; /* the open assistant message's tool_calls */
    int32_t i = 0;

    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        srv_json_push(msgs, m);
        return 1;
    }
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) == 0) {
        srv_err_set(err, 400, "input", "'input' must be a string or a non-empty array of items");
        return 0;
    }
    cJSON_ArrayForEach(it, in)
    {
        const cJSON *type = field(it, "type"), *role = field(it, "role");
        const char *t = cJSON_IsString(type) ? type->valuestring : "message";
        cJSON *m;

        if (!cJSON_IsObject(it)) {
            srv_err_set(err, 400, "input", "input[%d] must be an object", i);
            return 0;
        }
        if (strcmp(t, "message") == 0) {
            srv_buf_t text = {0};
            if (!cJSON_IsString(role)) {
                srv_err_set(err, 400, "input", "input[%d]: a message needs a string 'role'", i);
                return 0;
            }
            if (!item_text(field(it, "content"), i, &text, err)) {
                srv_buf_free(&text);
                return 0;
            }
            m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", role->valuestring);
            cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
            srv_buf_free(&text);
            srv_json_push(msgs, m);
            calls = NULL;
        } else if (strcmp(t, "function_call") == 0) {
            const cJSON *id = field(it, "call_id"), *name = field(it, "name");
            const cJSON *args = field(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args)) {
                srv_err_set(err, 400, "input",
                            "input[%d]: a function_call needs string 'call_id', 'name' and "
                            "'arguments'",
                            i);
                return 0;
            }
            if (calls == NULL) {
                m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddNullToObject(m, "content");
                calls = cJSON_AddArrayToObject(m, "tool_calls");
                srv_json_push(msgs, m);
            }
            cJSON *c = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            f = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            cJSON_AddStringToObject(f, "arguments", args->valuestring);
            srv_json_push(calls, c);
        } else if (strcmp(t, "function_call_output") == 0) {
            const cJSON *id = field(it, "call_id"), *out = field(it, "output");
            srv_buf_t text = {0};
            if (!cJSON_IsString(id) || out == NULL) {
                srv_err_set(err, 400, "input",
                            "input[%d]: a function_call_output needs 'call_id' and 'output'", i);
                return 0;
            }
            if (!item_text(out, i, &text, err)) {
                srv_buf_free(&text);
                return 0;
            }
            m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
            srv_buf_free(&text);
            srv_json_push(msgs, m);
            calls = NULL;
        } else if (strcmp(t, "reasoning") == 0) {
            /* A previous answer's reasoning: not shown to the model again. */
        } else {
            srv_err_set(err, 400, "input", "input[%d]: items of type '%.40s' are not supported", i,
                        t);
            return 0;
        }
        i++;
    }
    return 1;
}

/* Function tools into the chat shape; *echo gets the Response's copy. */
static int
convert_tools(const cJSON *tj, cJSON *chat, cJSON *echo, srv_error_t *err)
{
    const cJSON *t;
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    cJSON *eo = cJSON_AddArrayToObject(echo, "tools");
    int32_t i = 0;

    if (tj == NULL) {
        return 1;
    }
    if (!cJSON_IsArray(tj)) {
        srv_err_set(err, 400, "tools", "'tools' must be an array");
        return 0;
    }
    cJSON_ArrayForEach(t, tj)
    {
        const cJSON *type = field(t, "type"), *name = field(t, "name");
        const cJSON *desc = field(t, "description"), *params = field(t, "parameters");
        const cJSON *strict = field(t, "strict");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0) {
            srv_err_set(err, 400, "tools",
                        "tools[%d]: only tools of type \"function\" are supported", i);
            return 0;
        }
        if (!cJSON_IsString(name)) {
            srv_err_set(err, 400, "tools", "tools[%d]: a function tool needs a string 'name'", i);
            return 0;
        }
        cJSON *c = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(c, "function");
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(e, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(e, "name", name->valuestring);
        if (desc != NULL) {
            srv_json_add(f, "description", cJSON_Duplicate(desc, 1));
            srv_json_add(e, "description", cJSON_Duplicate(desc, 1));
        }
        if (params != NULL) {
            srv_json_add(f, "parameters", cJSON_Duplicate(params, 1));
            srv_json_add(e, "parameters", cJSON_Duplicate(params, 1));
        } else {
            cJSON_AddNullToObject(e, "parameters");
        }
        if (strict != NULL) {
            srv_json_add(f, "strict", cJSON_Duplicate(strict, 1));
        }
        cJSON_AddBoolToObject(e, "strict", cJSON_IsTrue(strict));
        srv_json_push(out, c);
        srv_json_push(eo, e);
        i++;
    }
    if (i == 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(chat, "tools");
    }
    return 1;
}

static int
convert_tool_choice(const cJSON *cj, cJSON *chat, cJSON *echo, srv_error_t *err)
{
    if (cj == NULL) {
        cJSON_AddStringToObject(echo, "tool_choice", "auto");
        return 1;
    }
    if (cJSON_IsString(cj)) {
        srv_json_add(chat, "tool_choice", cJSON_Duplicate(cj, 1));
        srv_json_add(echo, "tool_choice", cJSON_Duplicate(cj, 1));
        return 1;
    }
    const cJSON *type = field(cj, "type"), *name = field(cj, "name");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0 &&
        cJSON_IsString(name)) {
        cJSON *c = cJSON_CreateObject(), *f;
        cJSON_AddStringToObject(c, "type", "function");
        f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        srv_json_add(chat, "tool_choice", c);
        srv_json_add(echo, "tool_choice", cJSON_Duplicate(cj, 1));
        return 1;
    }
    srv_err_set(err, 400, "tool_choice",
                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                "{\"type\": \"function\", \"name\": ...}");
    return 0;
}

/* text.format: text, json_object, or json_schema (name, schema, strict). */
static int
text_format(const cJSON *tj, srv_constraint_t *c, cJSON *echo, srv_error_t *err)
{
    const cJSON *fmt = field(tj, "format"), *type = field(fmt, "type");
    cJSON *text = cJSON_AddObjectToObject(echo, "text");

    if (tj != NULL && !cJSON_IsObject(tj)) {
        srv_err_set(err, 400, "text", "'text' must be an object");
        return 0;
    }
    if (fmt == NULL) {
        cJSON *f = cJSON_AddObjectToObject(text, "format");
        cJSON_AddStringToObject(f, "type", "text");
        return 1;
    }
    if (!cJSON_IsString(type)) {
        srv_err_set(err, 400, "text.format", "'text.format' needs a string 'type'");
        return 0;
    }
    if (strcmp(type->valuestring, "text") == 0) {
        srv_json_add(text, "format", cJSON_Duplicate(fmt, 1));
        return 1;
    }
    if (strcmp(type->valuestring, "json_object") == 0) {
        c->kind = SRV_CONSTRAINT_JSON_OBJECT;
        srv_json_add(text, "format", cJSON_Duplicate(fmt, 1));
        return 1;
    }
    if (strcmp(type->valuestring, "json_schema") == 0) {
        const cJSON *schema = field(fmt, "schema"), *name = field(fmt, "name");
        if (!cJSON_IsObject(schema) || !cJSON_IsString(name)) {
            srv_err_set(err, 400, "text.format",
                        "'text.format' json_schema needs a string 'name' and an object 'schema'");
            return 0;
        }
        if ((c->spec = cJSON_PrintUnformatted(schema)) == NULL) {
            srv_err_oom(err);
            return 0;
        }
        c->kind = SRV_CONSTRAINT_JSON_SCHEMA;
        srv_json_add(text, "format", cJSON_Duplicate(fmt, 1));
        return 1;
    }
    srv_err_set(err, 400, "text.format",
                "'text.format' type '%.32s' is not supported (text, json_object, json_schema)",
                type->valuestring);
    return 0;
}

/* Copies the sampling fields that keep their name and meaning. */
static void
copy_fields(const cJSON *root, cJSON *chat, cJSON *echo)
{
    static const char *same[] = {"model", "temperature", "top_p", "stream", "user",
                                 "parallel_tool_calls", "seed", "top_k", "min_p",
                                 "repetition_penalty", "stop", "kv_policy", "priority"};

    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, same[i]);
        if (j != NULL) {
            srv_json_add(chat, same[i], cJSON_Duplicate(j, 1));
        }
    }
    const cJSON *j = field(root, "max_output_tokens");
    if (j != NULL) {
        srv_json_add(chat, "max_completion_tokens", cJSON_Duplicate(j, 1));
    }
    const char *echoed[] = {"temperature", "top_p", "max_output_tokens", "instructions"};
    for (size_t i = 0; i < sizeof(echoed) / sizeof(echoed[0]); i++) {
        j = field(root, echoed[i]);
        srv_json_add(echo, echoed[i], j != NULL ? cJSON_Duplicate(j, 1) : cJSON_CreateNull());
    }
    j = field(root, "parallel_tool_calls");
    cJSON_AddBoolToObject(echo, "parallel_tool_calls", j == NULL || cJSON_IsTrue(j));
    if (field(echo, "temperature") == NULL) {
        cJSON_DeleteItemFromObjectCaseSensitive(echo, "temperature");
        cJSON_AddNumberToObject(echo, "temperature", 1);
    }
    if (field(echo, "top_p") == NULL) {
        cJSON_DeleteItemFromObjectCaseSensitive(echo, "top_p");
        cJSON_AddNumberToObject(echo, "top_p", 1);
    }
}

/* The Responses field an error about the translated chat body is about. */
static void
rename_param(srv_error_t *err)
{
    if (strcmp(err->param, "messages") == 0) {
        snprintf(err->param, sizeof(err->param), "input");
    } else if (strcmp(err->param, "max_completion_tokens") == 0) {
        snprintf(err->param, sizeof(err->param), "max_output_tokens");
    }
}

static int
rsp_parse(const srv_t *s, const char *body, size_t len, srv_params_t *p, srv_error_t *err)
{
    cJSON *root = NULL, *chat = NULL, *echo = NULL, *msgs;
    const cJSON *j;
    srv_constraint_t c = {SRV_CONSTRAINT_NONE, NULL};
    char *text = NULL;
    int ok = 0;

    memset(p, 0, sizeof(*p));
    if (!srv_json_precheck(body, len, s->lim.max_depth, err)) {
        return 0;
    }
    unsigned long mark = srv_json_mark();
    root = cJSON_ParseWithLength(body, len);
    if (xmalloc_try_failures() != mark) {
        goto oom;
    }
    if (!cJSON_IsObject(root)) {
        srv_err_set(err, 400, NULL, "request body must be a JSON object");
        goto done;
    }
    if ((j = field(root, "store")) != NULL && !cJSON_IsBool(j)) {
        srv_err_set(err, 400, "store", "'store' must be a boolean");
        goto done;
    }
    if (cJSON_IsTrue(j)) {
        srv_err_set(err, 400, "store",
                    "'store': true is not supported: this server keeps no responses (leave "
                    "'store' out or set it to false)");
        goto done;
    }
    if (field(root, "previous_response_id") != NULL || field(root, "conversation") != NULL) {
        srv_err_set(err, 400,
                    field(root, "conversation") != NULL ? "conversation" : "previous_response_id",
                    "this server keeps no responses: send the whole conversation in 'input'");
        goto done;
    }
    if (cJSON_IsTrue(field(root, "background"))) {
        srv_err_set(err, 400, "background", "'background': true is not supported");
        goto done;
    }
    if ((j = field(root, "max_output_tokens")) != NULL &&
        (!cJSON_IsNumber(j) || j->valuedouble < 1 || j->valuedouble > (double)(1 << 30) ||
         j->valuedouble != (double)(int64_t)j->valuedouble)) {
        srv_err_set(err, 400, "max_output_tokens",
                    "'max_output_tokens' must be an integer in 1..%d", 1 << 30);
        goto done;
    }
    chat = cJSON_CreateObject();
    echo = cJSON_CreateObject();
    msgs = cJSON_AddArrayToObject(chat, "messages");
    if ((j = field(root, "instructions")) != NULL) {
        if (!cJSON_IsString(j)) {
            srv_err_set(err, 400, "instructions", "'instructions' must be a string");
            goto done;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", j->valuestring);
        srv_json_push(msgs, m);
    }
    if ((j = field(root, "input")) == NULL) {
        srv_err_set(err, 400, "input", "'input' is required");
        goto done;
    }
    if (!input_messages(j, msgs, err) ||
        !convert_tools(field(root, "tools"), chat, echo, err) ||
        !convert_tool_choice(field(root, "tool_choice"), chat, echo, err) ||
        !text_format(field(root, "text"), &c, echo, err)) {
        goto done;
    }
    copy_fields(root, chat, echo);
    cJSON_AddObjectToObject(echo, "metadata");
    text = srv_json_print(chat, mark);
    chat = NULL;
    p->ext.echo = NULL;
    if (text == NULL) {
        goto oom;
    }
    if (!srv_params_parse(SRV_KIND_CHAT, text, strlen(text), &s->lim, p, err)) {
        rename_param(err);
        goto done;
    }
    if ((p->ext.echo = srv_json_print(echo, mark)) == NULL) {
        echo = NULL;
        srv_params_free(p);
        goto oom;
    }
    echo = NULL;
    if (c.kind != SRV_CONSTRAINT_NONE) {
        free(p->constraint.spec);
        p->constraint = c;
        c.spec = NULL;
    }
    p->ext.output = 1;
    ok = 1;
    goto done;
oom:
    srv_err_oom(err);
done:
    free(text);
    free(c.spec);
    cJSON_Delete(root);
    cJSON_Delete(chat);
    cJSON_Delete(echo);
    return ok;
}

static int
rsp_prepare(const srv_t *s, srv_params_t *p, srv_error_t *err)
{
    int ok = srv_api_chat.prepare(s, p, err);

    if (!ok) {
        rename_param(err);
    }
    return ok;
}

/* ---- the Response object ------------------------------------------------------ */

static void
rsp_id(const srv_resp_t *rs, const char *prefix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s_%016" PRIx64, prefix, rs->id);
}

static cJSON *
text_part(const char *text)
{
    cJSON *part = cJSON_CreateObject();

    cJSON_AddStringToObject(part, "type", "output_text");
    cJSON_AddStringToObject(part, "text", text);
    cJSON_AddArrayToObject(part, "annotations");
    cJSON_AddArrayToObject(part, "logprobs");
    return part;
}

static cJSON *
message_item(const srv_resp_t *rs, const srv_tp_t *tp, int done)
{
    cJSON *m = cJSON_CreateObject(), *content;
    char id[48];

    rsp_id(rs, "msg", id, sizeof(id));
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(m, "role", "assistant");
    content = cJSON_AddArrayToObject(m, "content");
    if (done) {
        srv_json_push(content, text_part(tp->content.data ? tp->content.data : ""));
    }
    return m;
}

static cJSON *
call_item(const srv_tp_t *tp, int32_t i, int done)
{
    const srv_tp_call_t *c = &tp->calls[i];
    cJSON *o = cJSON_CreateObject();
    char id[48];

    snprintf(id, sizeof(id), "fc_%s", c->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function_call");
    cJSON_AddStringToObject(o, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(o, "call_id", c->id);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "arguments", done ? c->args : "");
    return o;
}

static cJSON *
usage_json(const srv_usage_t *u)
{
    cJSON *o = cJSON_CreateObject(), *d;

    cJSON_AddNumberToObject(o, "input_tokens", (double)u->prompt_tokens);
    d = cJSON_AddObjectToObject(o, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)u->cached_tokens);
    cJSON_AddNumberToObject(d, "cache_write_tokens", 0);
    cJSON_AddNumberToObject(o, "output_tokens", (double)u->completion_tokens);
    d = cJSON_AddObjectToObject(o, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens", 0);
    cJSON_AddNumberToObject(o, "total_tokens", (double)(u->prompt_tokens + u->completion_tokens));
    return o;
}

/* The Response: in progress (u NULL, no output yet) or final. */
static cJSON *
response_json(const srv_resp_t *rs, const srv_choice_t *ch, const srv_usage_t *u)
{
    const srv_tp_t *tp = ch->tp;
    cJSON *o = cJSON_CreateObject(), *out, *echo;
    int incomplete = u != NULL && ch->finish != NULL && strcmp(ch->finish, "length") == 0;
    char id[48];

    rsp_id(rs, "resp", id, sizeof(id));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)rs->created);
    cJSON_AddStringToObject(o, "status",
                            u == NULL ? "in_progress" : incomplete ? "incomplete" : "completed");
    cJSON_AddNullToObject(o, "error");
    if (incomplete) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    cJSON_AddStringToObject(o, "model", rs->model);
    out = cJSON_AddArrayToObject(o, "output");
    if (u != NULL && tp != NULL) {
        if (tp->content.len > 0 || tp->n_calls == 0) {
            srv_json_push(out, message_item(rs, tp, 1));
        }
        for (int32_t i = 0; i < tp->n_calls; i++) {
            srv_json_push(out, call_item(tp, i, 1));
        }
    }
    echo = rs->p->ext.echo != NULL ? cJSON_Parse(rs->p->ext.echo) : NULL;
    for (cJSON *e = echo != NULL ? echo->child : NULL; e != NULL; e = e->next) {
        srv_json_add(o, e->string, cJSON_Duplicate(e, 1));
    }
    cJSON_Delete(echo);
    cJSON_AddFalseToObject(o, "store");
    if (u != NULL) {
        srv_json_add(o, "usage", usage_json(u));
    }
    return o;
}

static char *
rsp_body(const srv_resp_t *rs, srv_choice_t *ch, const srv_usage_t *u)
{
    unsigned long mark = srv_json_mark();

    return srv_json_print(response_json(rs, ch, u), mark);
}

/* ---- the stream ---------------------------------------------------------------- */

/* Appends one event: "event: <type>\ndata: <o with type and sequence_number>". */
static void
event(srv_tp_t *tp, const char *type, cJSON *o, srv_buf_t *out)
{
    unsigned long mark = srv_json_mark();
    cJSON *e = cJSON_CreateObject();

    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "sequence_number", tp->rsp_seq++);
    for (cJSON *c = o->child; c != NULL;) {
        cJSON *next = c->next;
        srv_json_add(e, c->string, cJSON_DetachItemViaPointer(o, c));
        c = next;
    }
    cJSON_Delete(o);
    char *json = srv_json_print(e, mark);
    if (json == NULL) {
        out->oom = 1;
        return;
    }
    srv_buf_printf(out, "event: %s\ndata: %s\n\n", type, json);
    free(json);
}

static void
item_event(srv_tp_t *tp, const char *type, int32_t index, cJSON *item, srv_buf_t *out)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddNumberToObject(o, "output_index", index);
    srv_json_add(o, "item", item);
    event(tp, type, o, out);
}

static cJSON *
text_ids(const srv_resp_t *rs, const srv_tp_t *tp)
{
    cJSON *o = cJSON_CreateObject();
    char id[48];

    rsp_id(rs, "msg", id, sizeof(id));
    cJSON_AddStringToObject(o, "item_id", id);
    cJSON_AddNumberToObject(o, "output_index", tp->rsp_msg_item);
    cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static void
close_message(const srv_resp_t *rs, srv_tp_t *tp, srv_buf_t *out)
{
    const char *text = tp->content.data ? tp->content.data : "";
    cJSON *o;

    if (!tp->rsp_msg_open) {
        return;
    }
    o = text_ids(rs, tp);
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddArrayToObject(o, "logprobs");
    event(tp, "response.output_text.done", o, out);
    o = text_ids(rs, tp);
    srv_json_add(o, "part", text_part(text));
    event(tp, "response.content_part.done", o, out);
    item_event(tp, "response.output_item.done", tp->rsp_msg_item, message_item(rs, tp, 1), out);
    tp->rsp_msg_open = 0;
}

static void
rsp_chunk(const srv_resp_t *rs, srv_choice_t *ch, const char *finish, srv_buf_t *out)
{
    srv_tp_t *tp = ch->tp;
    srv_tp_event_t ev;
    cJSON *o;
    char id[56];

    if (!tp->rsp_started) {
        tp->rsp_started = 1;
        o = cJSON_CreateObject();
        srv_json_add(o, "response", response_json(rs, ch, NULL));
        event(tp, "response.created", o, out);
        o = cJSON_CreateObject();
        srv_json_add(o, "response", response_json(rs, ch, NULL));
        event(tp, "response.in_progress", o, out);
    }
    while (srv_tp_next(tp, &ev)) {
        if (ev.kind == SRV_TP_EV_TEXT && ev.content_len > 0) {
            if (!tp->rsp_msg_open) {
                tp->rsp_msg_open = 1;
                tp->rsp_msg_item = tp->rsp_items++;
                item_event(tp, "response.output_item.added", tp->rsp_msg_item,
                           message_item(rs, tp, 0), out);
                o = text_ids(rs, tp);
                srv_json_add(o, "part", text_part(""));
                event(tp, "response.content_part.added", o, out);
            }
            o = text_ids(rs, tp);
            srv_buf_t d = {0};
            srv_buf_add(&d, ev.content, ev.content_len);
            cJSON_AddStringToObject(o, "delta", d.data ? d.data : "");
            srv_buf_free(&d);
            cJSON_AddArrayToObject(o, "logprobs");
            event(tp, "response.output_text.delta", o, out);
        } else if (ev.kind == SRV_TP_EV_CALL_HEAD) {
            close_message(rs, tp, out);
            item_event(tp, "response.output_item.added", tp->rsp_items++,
                       call_item(tp, ev.call, 0), out);
        } else if (ev.kind == SRV_TP_EV_CALL_ARGS) {
            const srv_tp_call_t *c = &tp->calls[ev.call];
            int32_t index = tp->rsp_items - 1;
            snprintf(id, sizeof(id), "fc_%s", c->id);
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "item_id", id);
            cJSON_AddNumberToObject(o, "output_index", index);
            cJSON_AddStringToObject(o, "delta", c->args);
            event(tp, "response.function_call_arguments.delta", o, out);
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "item_id", id);
            cJSON_AddNumberToObject(o, "output_index", index);
            cJSON_AddStringToObject(o, "name", c->name);
            cJSON_AddStringToObject(o, "arguments", c->args);
            event(tp, "response.function_call_arguments.done", o, out);
            item_event(tp, "response.output_item.done", index, call_item(tp, ev.call, 1), out);
        }
    }
    if (finish != NULL) {
        close_message(rs, tp, out);
    }
}

static void
rsp_stream_end(const srv_resp_t *rs, srv_choice_t *ch, const srv_usage_t *u, srv_buf_t *out)
{
    cJSON *o = cJSON_CreateObject();
    int incomplete = ch->finish != NULL && strcmp(ch->finish, "length") == 0;

    if (!ch->tp->rsp_started) {
        rsp_chunk(rs, ch, ch->finish, out);
    }
    srv_json_add(o, "response", response_json(rs, ch, u));
    event(ch->tp, incomplete ? "response.incomplete" : "response.completed", o, out);
}

/* ---- the endpoint -------------------------------------------------------------- */

static cJSON *
rsp_lp_new(void)
{
    return srv_api_chat.lp_new();
}

static void
rsp_lp_add(const srv_resp_t *rs, srv_choice_t *ch, cJSON *lp, const smp_result_t *t)
{
    srv_api_chat.lp_add(rs, ch, lp, t);
}

static int
rsp_chunk_owed(const srv_resp_t *rs, const srv_choice_t *ch)
{
    (void)rs;
    return !ch->tp->rsp_started || srv_tp_pending(ch->tp);
}

static void
rsp_chunk_content(const srv_resp_t *rs, int32_t ci, srv_choice_t *ch, const srv_buf_t *piece,
                  const char *finish, srv_buf_t *out)
{
    (void)ci;
    (void)piece;
    rsp_chunk(rs, ch, finish, out);
}

static void
rsp_body_content(const srv_resp_t *rs, int32_t ci, const srv_choice_t *ch, cJSON *c)
{
    (void)rs;
    (void)ci;
    (void)ch;
    (void)c;
}

const srv_api_t srv_api_responses = {
    .kind = SRV_KIND_CHAT,
    .name = "responses",
    .id_prefix = "resp",
    .object = "response",
    .chunk_object = "response",
    .tok_flags = TOK_PARSE_SPECIAL,
    .prepare = rsp_prepare,
    .lp_new = rsp_lp_new,
    .lp_add = rsp_lp_add,
    .chunk_owed = rsp_chunk_owed,
    .chunk_content = rsp_chunk_content,
    .body_content = rsp_body_content,
    .parse = rsp_parse,
    .chunk = rsp_chunk,
    .stream_end = rsp_stream_end,
    .body = rsp_body,
};
