/* srv_tools.c - tools, tool_choice, tool history and chat_template_kwargs
 * of chat requests: validation (srv_chat_ext_parse) and preparation for
 * the template and the constraint (srv_tools_prepare). See srv_tools.h.
 *
 * Thread: loop thread (pure).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "server/srv_tools.h"

#define SRV_MAX_TOOLS 128

void
srv_chat_ext_free(srv_chat_ext_t *x)
{
    free(x->tools);
    free(x->tool_name);
    free(x->kwargs);
    free(x->messages);
    free(x->echo);
    memset(x, 0, sizeof(*x));
}

static const cJSON *
field(const cJSON *o, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return (j == NULL || cJSON_IsNull(j)) ? NULL : j;
}

/* OpenAI's function names: a-z, A-Z, 0-9, '_', '-' (and '.'), 1..64. */
static int
valid_fn_name(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 64) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.')) {
            return 0;
        }
    }
    return 1;
}

static int
parse_tools(const cJSON *tj, srv_chat_ext_t *x, srv_error_t *err)
{
    const cJSON *t;
    int32_t i = 0;

    if (!cJSON_IsArray(tj)) {
        srv_err_set(err, 400, "tools", "'tools' must be an array of function tools");
        return 0;
    }
    if (cJSON_GetArraySize(tj) > SRV_MAX_TOOLS) {
        srv_err_set(err, 400, "tools", "at most %d tools per request", SRV_MAX_TOOLS);
        return 0;
    }
    cJSON_ArrayForEach(t, tj)
    {
        const cJSON *type = field(t, "type"), *fn = field(t, "function");
        const cJSON *name = field(fn, "name"), *params = field(fn, "parameters");
        const cJSON *desc = field(fn, "description"), *strict = field(fn, "strict");

        if (!cJSON_IsObject(t) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0) {
            srv_err_set(err, 400, "tools", "tools[%d]: 'type' must be \"function\"", i);
            return 0;
        }
        if (!cJSON_IsObject(fn)) {
            srv_err_set(err, 400, "tools", "tools[%d]: 'function' must be an object", i);
            return 0;
        }
        if (!cJSON_IsString(name) || !valid_fn_name(name->valuestring)) {
            srv_err_set(err, 400, "tools",
                        "tools[%d]: 'function.name' must be 1 to 64 of a-z, A-Z, 0-9, '_', "
                        "'-', '.'",
                        i);
            return 0;
        }
        if (params != NULL && !cJSON_IsObject(params)) {
            srv_err_set(err, 400, "tools",
                        "tools[%d] (%.64s): 'function.parameters' must be a JSON Schema object",
                        i, name->valuestring);
            return 0;
        }
        if (desc != NULL && !cJSON_IsString(desc)) {
            srv_err_set(err, 400, "tools", "tools[%d]: 'function.description' must be a string",
                        i);
            return 0;
        }
        if (strict != NULL && !cJSON_IsBool(strict)) {
            srv_err_set(err, 400, "tools", "tools[%d]: 'function.strict' must be a boolean", i);
            return 0;
        }
        for (const cJSON *u = tj->child; u != t; u = u->next) {
            const cJSON *un = field(field(u, "function"), "name");
            if (strcmp(un->valuestring, name->valuestring) == 0) {
                srv_err_set(err, 400, "tools", "tools[%d]: the function name '%.64s' is repeated",
                            i, name->valuestring);
                return 0;
            }
        }
        i++;
    }
    x->n_tools = i;
    if (i == 0) {
        return 1;
    }
    /* As templates see them: a function without parameters takes none,
     * one without a description has an empty one (templates read both
     * unguarded). */
    unsigned long mark = srv_json_mark();
    cJSON *norm = cJSON_Duplicate(tj, 1);
    cJSON_ArrayForEach(t, norm)
    {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (field(fn, "parameters") == NULL) {
            cJSON *pj = cJSON_CreateObject();
            cJSON_AddStringToObject(pj, "type", "object");
            cJSON_AddObjectToObject(pj, "properties");
            cJSON_DeleteItemFromObjectCaseSensitive(fn, "parameters");
            srv_json_add(fn, "parameters", pj);
        }
        if (field(fn, "description") == NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(fn, "description");
            cJSON_AddStringToObject(fn, "description", "");
        }
    }
    if ((x->tools = srv_json_print(norm, mark)) == NULL) {
        srv_err_oom(err);
        return 0;
    }
    return 1;
}

static int
has_tool(const cJSON *tj, const char *name)
{
    const cJSON *t;

    cJSON_ArrayForEach(t, tj)
    {
        const cJSON *n = field(field(t, "function"), "name");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0) {
            return 1;
        }
    }
    return 0;
}

static int
parse_tool_choice(const cJSON *cj, const cJSON *tj, srv_chat_ext_t *x, srv_error_t *err)
{
    x->tool_choice = x->n_tools > 0 ? SRV_TOOL_CHOICE_AUTO : SRV_TOOL_CHOICE_NONE;
    if (cj == NULL) {
        return 1;
    }
    if (cJSON_IsString(cj)) {
        const char *v = cj->valuestring;
        if (strcmp(v, "none") == 0) {
            x->tool_choice = SRV_TOOL_CHOICE_NONE;
            return 1;
        }
        if (strcmp(v, "auto") == 0 || strcmp(v, "required") == 0) {
            if (x->n_tools == 0) {
                srv_err_set(err, 400, "tool_choice",
                            "'tool_choice' \"%s\" needs a non-empty 'tools'", v);
                return 0;
            }
            x->tool_choice = v[0] == 'a' ? SRV_TOOL_CHOICE_AUTO : SRV_TOOL_CHOICE_REQUIRED;
            return 1;
        }
    } else if (cJSON_IsObject(cj)) {
        const cJSON *type = field(cj, "type"), *name = field(field(cj, "function"), "name");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0 &&
            cJSON_IsString(name)) {
            if (!has_tool(tj, name->valuestring)) {
                srv_err_set(err, 400, "tool_choice",
                            "'tool_choice' names the function '%.64s', which is not in 'tools'",
                            name->valuestring);
                return 0;
            }
            x->tool_choice = SRV_TOOL_CHOICE_NAMED;
            if ((x->tool_name = xstrdup_try(name->valuestring)) == NULL) {
                srv_err_oom(err);
                return 0;
            }
            return 1;
        }
    }
    srv_err_set(err, 400, "tool_choice",
                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    return 0;
}

/* The assistant's tool_calls as templates want them: arguments as the
 * object they encode (HF templates apply tojson to them). */
static cJSON *
norm_tool_calls(const cJSON *tc, int32_t mi, srv_error_t *err)
{
    cJSON *out = cJSON_CreateArray();
    const cJSON *c;
    int32_t k = 0;

    if (!cJSON_IsArray(tc)) {
        cJSON_Delete(out);
        srv_err_set(err, 400, "messages", "messages[%d]: 'tool_calls' must be an array", mi);
        return NULL;
    }
    cJSON_ArrayForEach(c, tc)
    {
        const cJSON *id = field(c, "id"), *type = field(c, "type"), *fn = field(c, "function");
        const cJSON *name = field(fn, "name"), *args = field(fn, "arguments");

        if (!cJSON_IsObject(c) || !cJSON_IsString(id) || !cJSON_IsString(name) ||
            (type != NULL && (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))) ||
            (args != NULL && !cJSON_IsString(args))) {
            cJSON_Delete(out);
            srv_err_set(err, 400, "messages",
                        "messages[%d].tool_calls[%d] needs 'id', 'type' \"function\" and "
                        "'function' {'name', 'arguments' (a JSON string)}",
                        mi, k);
            return NULL;
        }
        cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON *parsed = args != NULL ? cJSON_Parse(args->valuestring) : cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id->valuestring);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        if (cJSON_IsObject(parsed)) {
            srv_json_add(f, "arguments", parsed);
        } else {
            cJSON_Delete(parsed);
            cJSON_AddStringToObject(f, "arguments", args->valuestring);
        }
        srv_json_add(o, "function", f);
        srv_json_push(out, o);
        k++;
    }
    return out;
}

/* The messages with their tool fields, or NULL (and *any 0) when none has
 * such a field. */
static int
build_messages(const cJSON *mj, srv_params_t *p, srv_error_t *err)
{
    const cJSON *m;
    int32_t i = 0;
    int any = 0;
    unsigned long mark = srv_json_mark();
    cJSON *arr;

    /* Most conversations have no tool fields: nothing to build. */
    cJSON_ArrayForEach(m, mj)
    {
        if (field(m, "tool_calls") != NULL || field(m, "tool_call_id") != NULL ||
            field(m, "reasoning_content") != NULL || strcmp(p->messages[i].role, "tool") == 0) {
            any = 1;
        }
        i++;
    }
    if (!any) {
        return 1;
    }
    i = 0;
    arr = cJSON_CreateArray();
    cJSON_ArrayForEach(m, mj)
    {
        const srv_chat_msg_t *pm = &p->messages[i];
        const cJSON *content = field(m, "content"), *tc = field(m, "tool_calls");
        const cJSON *tcid = field(m, "tool_call_id"), *name = field(m, "name");
        const cJSON *rc = field(m, "reasoning_content");
        cJSON *o = cJSON_CreateObject();

        cJSON_AddStringToObject(o, "role", pm->role);
        if (content != NULL) {
            cJSON_AddStringToObject(o, "content", pm->content ? pm->content : "");
        } else {
            cJSON_AddNullToObject(o, "content");
        }
        if (tc != NULL && strcmp(pm->role, "assistant") == 0) {
            cJSON *n = norm_tool_calls(tc, i, err);
            if (n == NULL) {
                cJSON_Delete(o);
                cJSON_Delete(arr);
                return 0;
            }
            srv_json_add(o, "tool_calls", n);
            any = 1;
        }
        if (strcmp(pm->role, "tool") == 0) {
            if (!cJSON_IsString(tcid)) {
                cJSON_Delete(o);
                cJSON_Delete(arr);
                srv_err_set(err, 400, "messages",
                            "messages[%d]: a 'tool' message needs a string 'tool_call_id'", i);
                return 0;
            }
            cJSON_AddStringToObject(o, "tool_call_id", tcid->valuestring);
            any = 1;
        }
        if (cJSON_IsString(name)) {
            cJSON_AddStringToObject(o, "name", name->valuestring);
        }
        if (cJSON_IsString(rc) && strcmp(pm->role, "assistant") == 0) {
            cJSON_AddStringToObject(o, "reasoning_content", rc->valuestring);
            any = 1;
        }
        srv_json_push(arr, o);
        i++;
    }
    p->ext.messages = srv_json_print(arr, mark);
    if (p->ext.messages == NULL) {
        srv_err_oom(err);
        return 0;
    }
    return 1;
}

int
srv_chat_ext_parse(const cJSON *root, srv_params_t *p, srv_error_t *err)
{
    srv_chat_ext_t *x = &p->ext;
    const cJSON *tj = field(root, "tools"), *j;

    x->parallel_tool_calls = 1;
    if (tj != NULL && !parse_tools(tj, x, err)) {
        return 0;
    }
    if (!parse_tool_choice(field(root, "tool_choice"), tj, x, err)) {
        return 0;
    }
    if ((j = field(root, "parallel_tool_calls")) != NULL) {
        if (!cJSON_IsBool(j)) {
            srv_err_set(err, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
            return 0;
        }
        x->parallel_tool_calls = cJSON_IsTrue(j);
    }
    if ((j = field(root, "chat_template_kwargs")) != NULL) {
        if (!cJSON_IsObject(j)) {
            srv_err_set(err, 400, "chat_template_kwargs",
                        "'chat_template_kwargs' must be an object");
            return 0;
        }
        if ((x->kwargs = cJSON_PrintUnformatted(j)) == NULL) {
            srv_err_oom(err);
            return 0;
        }
    }
    return build_messages(field(root, "messages"), p, err);
}

/* ---- preparation --------------------------------------------------------------- */

/* The "parameters" schema of tool t (an empty object schema when absent). */
static cJSON *
tool_params(const cJSON *t)
{
    const cJSON *pj = field(field(t, "function"), "parameters");

    if (pj != NULL) {
        return cJSON_Duplicate(pj, 1);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "object");
    return o;
}

/* {"type":"object","properties":{"name":{"type":"string","enum":[n]},
 *  argkey: params},"required":["name",argkey],"additionalProperties":false}
 * for each tool, in an anyOf. */
static cJSON *
calls_items(const cJSON *tools, const char *argkey)
{
    cJSON *items = cJSON_CreateObject();
    cJSON *any = cJSON_AddArrayToObject(items, "anyOf");
    const cJSON *t;

    cJSON_ArrayForEach(t, tools)
    {
        cJSON *o = cJSON_CreateObject(), *props, *name, *en, *req;
        cJSON_AddStringToObject(o, "type", "object");
        props = cJSON_AddObjectToObject(o, "properties");
        name = cJSON_AddObjectToObject(props, "name");
        cJSON_AddStringToObject(name, "type", "string");
        en = cJSON_AddArrayToObject(name, "enum");
        srv_json_push(en, cJSON_CreateString(field(field(t, "function"), "name")->valuestring));
        srv_json_add(props, argkey, tool_params(t));
        req = cJSON_AddArrayToObject(o, "required");
        srv_json_push(req, cJSON_CreateString("name"));
        srv_json_push(req, cJSON_CreateString(argkey));
        cJSON_AddFalseToObject(o, "additionalProperties");
        srv_json_push(any, o);
    }
    return items;
}

static cJSON *
calls_array(const cJSON *tools, const char *argkey, int parallel)
{
    cJSON *a = cJSON_CreateObject();

    cJSON_AddStringToObject(a, "type", "array");
    cJSON_AddNumberToObject(a, "minItems", 1);
    if (!parallel) {
        cJSON_AddNumberToObject(a, "maxItems", 1);
    }
    srv_json_add(a, "items", calls_items(tools, argkey));
    return a;
}

/* The schema of the output srv_toolparse.c reads for p's mode. */
static cJSON *
output_schema(const srv_params_t *p, const cJSON *tools)
{
    const srv_chat_ext_t *x = &p->ext;

    if (x->mode == SRV_TP_NAMED) {
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            if (strcmp(field(field(t, "function"), "name")->valuestring, x->tool_name) == 0) {
                return tool_params(t);
            }
        }
        return NULL;
    }
    if (x->mode == SRV_TP_REQUIRED) {
        return calls_array(tools, "parameters", x->parallel_tool_calls);
    }
    /* generic, auto: {"tool_calls":[...]} or {"response":"..."} */
    cJSON *s = cJSON_CreateObject();
    cJSON *any = cJSON_AddArrayToObject(s, "anyOf");
    cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject(), *props, *req, *r;
    cJSON_AddStringToObject(a, "type", "object");
    props = cJSON_AddObjectToObject(a, "properties");
    srv_json_add(props, "tool_calls", calls_array(tools, "arguments", x->parallel_tool_calls));
    req = cJSON_AddArrayToObject(a, "required");
    srv_json_push(req, cJSON_CreateString("tool_calls"));
    cJSON_AddFalseToObject(a, "additionalProperties");
    cJSON_AddStringToObject(b, "type", "object");
    props = cJSON_AddObjectToObject(b, "properties");
    r = cJSON_AddObjectToObject(props, "response");
    cJSON_AddStringToObject(r, "type", "string");
    req = cJSON_AddArrayToObject(b, "required");
    srv_json_push(req, cJSON_CreateString("response"));
    cJSON_AddFalseToObject(b, "additionalProperties");
    srv_json_push(any, a);
    srv_json_push(any, b);
    return s;
}

/* The generic format's system text: the tools and the answer's shape. */
static void
generic_prompt(const srv_params_t *p, const cJSON *tools, srv_buf_t *out)
{
    const srv_chat_ext_t *x = &p->ext;
    cJSON *list = cJSON_CreateArray();
    const cJSON *t;

    if (x->mode == SRV_TP_NAMED) {
        /* Only the function to call, and only its schema. */
        cJSON_ArrayForEach(t, tools)
        {
            if (strcmp(field(field(t, "function"), "name")->valuestring, x->tool_name) == 0) {
                cJSON *pj = tool_params(t);
                char *pt = cJSON_PrintUnformatted(pj);
                cJSON_Delete(pj);
                srv_buf_printf(out, "Call the tool %s: reply with its arguments, a JSON object "
                                    "of this JSON Schema:\n%s",
                               x->tool_name, pt != NULL ? pt : "{}");
                out->oom |= pt == NULL;
                free(pt);
            }
        }
        cJSON_Delete(list);
        return;
    }
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = field(t, "function");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", field(fn, "name")->valuestring);
        if (cJSON_IsString(field(fn, "description")) &&
            field(fn, "description")->valuestring[0] != '\0') {
            cJSON_AddStringToObject(o, "description", field(fn, "description")->valuestring);
        }
        srv_json_add(o, "parameters", tool_params(t));
        srv_json_push(list, o);
    }
    char *lj = cJSON_PrintUnformatted(list);
    cJSON_Delete(list);
    srv_buf_adds(out, "Tools (JSON Schema of the arguments):\n");
    srv_buf_adds(out, lj != NULL ? lj : "[]");
    if (lj == NULL) {
        out->oom = 1;
    }
    free(lj);
    if (x->mode == SRV_TP_REQUIRED) {
        srv_buf_adds(out, "\nReply with a JSON array of calls: [{\"name\": ..., "
                          "\"parameters\": {...}}]");
    } else {
        srv_buf_adds(out, "\nReply with JSON: {\"tool_calls\": [{\"name\": ..., "
                          "\"arguments\": {...}}]} or {\"response\": \"...\"}");
    }
}

static int
set_msg(srv_chat_msg_t *m, const char *role, const char *content)
{
    m->role = xstrdup_try(role);
    m->content = xstrdup_try(content);
    return m->role != NULL && m->content != NULL;
}

/* Generic format: the tool history as text, the tools in the system
 * message; rewrites p->messages. */
static int
generic_messages(srv_params_t *p, const cJSON *tools, const cJSON *msgs)
{
    int32_t n = p->n_messages, k = 0;
    int describe = tools != NULL && p->ext.mode != SRV_TP_OFF;
    int merge = describe && strcmp(p->messages[0].role, "system") == 0;
    srv_chat_msg_t *nm = xcalloc_try((size_t)n + 1, sizeof(*nm));
    int ok = nm != NULL;

    if (ok && describe) {
        srv_buf_t b = {0};
        if (merge) {
            srv_buf_adds(&b, p->messages[0].content ? p->messages[0].content : "");
            srv_buf_adds(&b, "\n\n");
        }
        generic_prompt(p, tools, &b);
        srv_buf_add(&b, "", 0);
        ok = !b.oom && set_msg(&nm[k], "system", b.data);
        k++;
        srv_buf_free(&b);
    }
    for (int32_t i = merge ? 1 : 0; ok && i < n; i++, k++) {
        const srv_chat_msg_t *m = &p->messages[i];
        const cJSON *mj = msgs != NULL ? cJSON_GetArrayItem(msgs, i) : NULL;
        const cJSON *tc = field(mj, "tool_calls");
        unsigned long mark = srv_json_mark();

        if (tc != NULL) {
            cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tool_calls");
            const cJSON *c;
            cJSON_ArrayForEach(c, tc)
            {
                const cJSON *fn = field(c, "function");
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "name", field(fn, "name")->valuestring);
                srv_json_add(e, "arguments", cJSON_Duplicate(field(fn, "arguments"), 1));
                srv_json_push(arr, e);
            }
            char *t = srv_json_print(o, mark);
            ok = t != NULL && set_msg(&nm[k], "assistant", t);
            free(t);
        } else if (strcmp(m->role, "tool") == 0) {
            cJSON *o = cJSON_CreateObject(), *r = cJSON_AddObjectToObject(o, "tool_response");
            const cJSON *id = field(mj, "tool_call_id"), *name = field(mj, "name");
            if (cJSON_IsString(name)) {
                cJSON_AddStringToObject(r, "name", name->valuestring);
            }
            if (cJSON_IsString(id)) {
                cJSON_AddStringToObject(r, "tool_call_id", id->valuestring);
            }
            cJSON_AddStringToObject(r, "content", m->content ? m->content : "");
            char *t = srv_json_print(o, mark);
            ok = t != NULL && set_msg(&nm[k], "user", t);
            free(t);
        } else {
            ok = set_msg(&nm[k], m->role, m->content ? m->content : "");
        }
    }
    if (!ok) {
        for (int32_t i = 0; nm != NULL && i <= k && i <= n; i++) {
            free(nm[i].role);
            free(nm[i].content);
        }
        free(nm);
        return 0;
    }
    for (int32_t i = 0; i < n; i++) {
        free(p->messages[i].role);
        free(p->messages[i].content);
    }
    free(p->messages);
    p->messages = nm;
    p->n_messages = k;
    return 1;
}

int
srv_tools_prepare(srv_params_t *p, const srv_tools_opts_t *o, char **extra, srv_error_t *err)
{
    srv_chat_ext_t *x = &p->ext;
    cJSON *tools = NULL, *msgs = NULL, *ex = NULL;
    int ok = 0;
    unsigned long mark = srv_json_mark();

    *extra = NULL;
    x->format = srv_tp_format_by_name(o->parser);
    if (x->format == SRV_TP_FMT_NONE) {
        x->format = srv_tp_format_of_template(o->tmpl);
    }
    x->reasoning = srv_tp_reasoning_by_name(o->reasoning);
    switch (x->tool_choice) {
    case SRV_TOOL_CHOICE_AUTO:
        x->mode = x->n_tools > 0 ? SRV_TP_AUTO : SRV_TP_OFF;
        break;
    case SRV_TOOL_CHOICE_REQUIRED:
        x->mode = SRV_TP_REQUIRED;
        break;
    case SRV_TOOL_CHOICE_NAMED:
        x->mode = SRV_TP_NAMED;
        break;
    default:
        x->mode = SRV_TP_OFF;
        break;
    }
    x->output = x->output || x->mode != SRV_TP_OFF || x->reasoning != SRV_TP_REASON_NONE ||
                o->force_output;
    tools = x->tools != NULL ? cJSON_Parse(x->tools) : NULL;
    msgs = x->messages != NULL ? cJSON_Parse(x->messages) : NULL;
    if ((x->tools != NULL && tools == NULL) || (x->messages != NULL && msgs == NULL)) {
        goto oom;
    }

    /* The constraint: what the output parser of this mode reads. */
    int want = x->mode == SRV_TP_NAMED || x->mode == SRV_TP_REQUIRED ||
               (x->mode == SRV_TP_AUTO && x->format == SRV_TP_FMT_GENERIC);
    if (want && p->constraint.kind != SRV_CONSTRAINT_NONE) {
        if (x->mode != SRV_TP_AUTO) {
            srv_err_set(err, 400, "tool_choice",
                        "tool_choice \"required\" or a named function cannot be combined with "
                        "response_format or another output constraint");
            goto fail;
        }
        want = 0; /* the client's format wins; calls are parsed if they come */
    }
    if (want) {
        cJSON *schema = output_schema(p, tools);
        if (schema == NULL || (p->constraint.spec = cJSON_PrintUnformatted(schema)) == NULL) {
            cJSON_Delete(schema);
            goto oom;
        }
        cJSON_Delete(schema);
        p->constraint.kind = SRV_CONSTRAINT_JSON_SCHEMA;
    }

    ex = x->kwargs != NULL ? cJSON_Parse(x->kwargs) : cJSON_CreateObject();
    if (ex == NULL) {
        goto oom;
    }
    if (x->format == SRV_TP_FMT_GENERIC) {
        if ((tools != NULL && x->mode != SRV_TP_OFF) || msgs != NULL) {
            if (!generic_messages(p, tools, msgs)) {
                goto oom;
            }
        }
    } else {
        if (msgs != NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(ex, "messages");
            srv_json_add(ex, "messages", msgs);
            msgs = NULL;
        }
        if (tools != NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(ex, "tools");
            srv_json_add(ex, "tools", tools);
            tools = NULL;
        }
    }
    if (ex->child != NULL) {
        *extra = srv_json_print(ex, mark);
        ex = NULL;
        if (*extra == NULL) {
            goto oom;
        }
    }
    ok = 1;
    goto fail;
oom:
    srv_err_oom(err);
fail:
    cJSON_Delete(ex);
    cJSON_Delete(tools);
    cJSON_Delete(msgs);
    return ok;
}

void
srv_tools_tp_cfg(const srv_params_t *p, uint64_t seed, srv_tp_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->format = p->ext.format;
    cfg->mode = p->ext.mode;
    cfg->reasoning = p->ext.reasoning;
    cfg->parallel = p->ext.parallel_tool_calls;
    cfg->named = p->ext.tool_name;
    cfg->seed = seed;
}
