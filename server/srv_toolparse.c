/* srv_toolparse.c - tool-call and reasoning output parsers (srv_toolparse.h).
 *
 * Every stage keeps what it cannot yet classify in a hold buffer and looks
 * at the whole held text again after each feed, so a marker split across
 * tokens (or fed byte by byte) is found exactly as in one piece.
 *
 * Thread: loop thread (pure).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "server/srv_toolparse.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_MARK "[TOOL_CALLS]"
#define PYTHON_TAG "<|python_tag|>"

/* Tool stage states. */
enum {
    TS_START = 0, /* only whitespace so far */
    TS_TEXT,      /* content; hermes / mistral look for their marker */
    TS_CALL,      /* hermes: inside <tool_call> */
    TS_WHOLE,     /* the rest of the output is one tool-call document */
};

int
srv_tp_format_by_name(const char *name)
{
    if (name == NULL) {
        return SRV_TP_FMT_NONE;
    }
    if (strcmp(name, "hermes") == 0) {
        return SRV_TP_FMT_HERMES;
    }
    if (strcmp(name, "llama3_json") == 0) {
        return SRV_TP_FMT_LLAMA3;
    }
    if (strcmp(name, "mistral") == 0) {
        return SRV_TP_FMT_MISTRAL;
    }
    if (strcmp(name, "generic") == 0) {
        return SRV_TP_FMT_GENERIC;
    }
    return SRV_TP_FMT_NONE;
}

const char *
srv_tp_format_name(int format)
{
    switch (format) {
    case SRV_TP_FMT_HERMES:
        return "hermes";
    case SRV_TP_FMT_LLAMA3:
        return "llama3_json";
    case SRV_TP_FMT_MISTRAL:
        return "mistral";
    case SRV_TP_FMT_GENERIC:
        return "generic";
    default:
        return "none";
    }
}

int
srv_tp_format_of_template(const char *tmpl)
{
    if (tmpl == NULL) {
        return SRV_TP_FMT_GENERIC;
    }
    if (strstr(tmpl, HERMES_OPEN) != NULL) {
        return SRV_TP_FMT_HERMES;
    }
    if (strstr(tmpl, MISTRAL_MARK) != NULL) {
        return SRV_TP_FMT_MISTRAL;
    }
    if (strstr(tmpl, PYTHON_TAG) != NULL || strstr(tmpl, "ipython") != NULL) {
        return SRV_TP_FMT_LLAMA3;
    }
    return SRV_TP_FMT_GENERIC;
}

int
srv_tp_reasoning_by_name(const char *name)
{
    if (name != NULL && strcmp(name, "deepseek_r1") == 0) {
        return SRV_TP_REASON_DEEPSEEK_R1;
    }
    if (name != NULL && strcmp(name, "qwen3") == 0) {
        return SRV_TP_REASON_QWEN3;
    }
    return SRV_TP_REASON_NONE;
}

int
srv_tp_init(srv_tp_t *tp, const srv_tp_cfg_t *cfg)
{
    memset(tp, 0, sizeof(*tp));
    tp->cfg = *cfg;
    tp->cfg.named = NULL;
    if (cfg->mode == SRV_TP_NAMED) {
        tp->named = xstrdup_try(cfg->named != NULL ? cfg->named : "");
        if (tp->named == NULL) {
            return 0;
        }
    }
    /* Text of a family without a marker of its own is all content. */
    if (tp->cfg.mode == SRV_TP_AUTO && tp->cfg.format == SRV_TP_FMT_NONE) {
        tp->cfg.mode = SRV_TP_OFF;
    }
    return 1;
}

void
srv_tp_fini(srv_tp_t *tp)
{
    for (int32_t i = 0; i < tp->n_calls; i++) {
        free(tp->calls[i].name);
        free(tp->calls[i].args);
    }
    free(tp->calls);
    free(tp->named);
    srv_buf_free(&tp->rhold);
    srv_buf_free(&tp->thold);
    srv_buf_free(&tp->content);
    srv_buf_free(&tp->reasoning);
    memset(tp, 0, sizeof(*tp));
}

/* ---- helpers ----------------------------------------------------------------- */

/* Length of the longest suffix of s[0..n) that is a proper prefix of mark. */
static size_t
partial_suffix(const char *s, size_t n, const char *mark)
{
    size_t ml = strlen(mark);

    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--) {
        if (memcmp(s + n - k, mark, k) == 0) {
            return k;
        }
    }
    return 0;
}

static const char *
find_mem(const char *s, size_t n, const char *mark)
{
    size_t ml = strlen(mark);

    for (size_t i = 0; i + ml <= n; i++) {
        if (memcmp(s + i, mark, ml) == 0) {
            return s + i;
        }
    }
    return NULL;
}

static size_t
skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && isspace((unsigned char)s[i])) {
        i++;
    }
    return i;
}

static int
all_ws(const char *s, size_t n)
{
    return skip_ws(s, n, 0) == n;
}

static void
emit_content(srv_tp_t *tp, const char *s, size_t n)
{
    srv_buf_add(&tp->content, s, n);
}

static uint64_t
splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void
make_id(srv_tp_t *tp, char *id)
{
    static const char an[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = tp->cfg.seed ^ ((uint64_t)(tp->n_calls + tp->dropped + 1) << 48);
    int mistral = tp->cfg.format == SRV_TP_FMT_MISTRAL;
    int n = mistral ? 9 : 24, o = 0;

    if (!mistral) {
        memcpy(id, "call_", 5);
        o = 5;
    }
    for (int i = 0; i < n; i++) {
        id[o + i] = an[splitmix(&x) % 62];
    }
    id[o + n] = '\0';
}

/* Adds a call; takes name and args (malloc'd, NULL on allocation failure). */
static void
add_call(srv_tp_t *tp, char *name, char *args)
{
    if (name == NULL || args == NULL) {
        free(name);
        free(args);
        tp->oom = 1;
        return;
    }
    if (!tp->cfg.parallel && tp->n_calls >= 1) {
        tp->dropped++;
        free(name);
        free(args);
        return;
    }
    if (tp->n_calls == tp->cap_calls) {
        int32_t cap = tp->cap_calls ? tp->cap_calls * 2 : 4;
        srv_tp_call_t *c = xrealloc_try(tp->calls, sizeof(*c) * (size_t)cap);
        if (c == NULL) {
            free(name);
            free(args);
            tp->oom = 1;
            return;
        }
        tp->calls = c;
        tp->cap_calls = cap;
    }
    srv_tp_call_t *c = &tp->calls[tp->n_calls];
    make_id(tp, c->id);
    c->name = name;
    c->args = args;
    tp->n_calls++;
}

/* The arguments of a call object: an object (or other JSON) printed
 * compactly, a string kept as it is (some models write the arguments as
 * a JSON string), absent: "{}". NULL when out of memory. */
static char *
args_text(const cJSON *a)
{
    if (a == NULL) {
        return xstrdup_try("{}");
    }
    if (cJSON_IsString(a)) {
        return xstrdup_try(a->valuestring);
    }
    return cJSON_PrintUnformatted(a);
}

/* One call object {"name": s, "arguments"|"parameters": ...}: 1 when it
 * has that shape. */
static int
call_shape(const cJSON *o)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");

    return cJSON_IsObject(o) && cJSON_IsString(name) && name->valuestring[0] != '\0';
}

static const cJSON *
call_args(const cJSON *o)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");

    return a != NULL ? a : cJSON_GetObjectItemCaseSensitive(o, "parameters");
}

static void
add_call_json(srv_tp_t *tp, const cJSON *o)
{
    add_call(tp, xstrdup_try(cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring),
             args_text(call_args(o)));
}

/* An array of call objects (or one): 1 when every item has the shape, and
 * then they are added. */
static int
add_calls_json(srv_tp_t *tp, const cJSON *j)
{
    const cJSON *it;

    if (call_shape(j)) {
        add_call_json(tp, j);
        return 1;
    }
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) == 0) {
        return 0;
    }
    cJSON_ArrayForEach(it, j)
    {
        if (!call_shape(it)) {
            return 0;
        }
    }
    cJSON_ArrayForEach(it, j)
    {
        add_call_json(tp, it);
    }
    return 1;
}

/* Parses s[0..n) as one JSON document (trailing whitespace allowed). */
static cJSON *
parse_doc(const char *s, size_t n)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);

    if (j != NULL && !all_ws(end, n - (size_t)(end - s))) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* ---- whole-document formats ---------------------------------------------------- */

/* llama3_json: objects separated by ';' (whitespace around). */
static int
parse_llama3(srv_tp_t *tp, const char *s, size_t n)
{
    size_t i = skip_ws(s, n, 0);
    int32_t first = tp->n_calls;
    cJSON *objs[64];
    int32_t k = 0;
    int ok = 1;

    if (n - i >= strlen(PYTHON_TAG) && memcmp(s + i, PYTHON_TAG, strlen(PYTHON_TAG)) == 0) {
        i += strlen(PYTHON_TAG);
    }
    (void)first;
    while (ok) {
        const char *end = NULL;
        i = skip_ws(s, n, i);
        if (i == n || k == 64) {
            ok = k > 0 && i == n;
            break;
        }
        cJSON *j = cJSON_ParseWithLengthOpts(s + i, n - i, &end, 0);
        if (j == NULL || !call_shape(j)) {
            cJSON_Delete(j);
            ok = 0;
            break;
        }
        objs[k++] = j;
        i = skip_ws(s, n, (size_t)(end - s));
        if (i < n && s[i] == ';') {
            i++;
        } else if (i < n) {
            ok = 0;
        }
    }
    for (int32_t q = 0; q < k; q++) {
        if (ok) {
            add_call_json(tp, objs[q]);
        }
        cJSON_Delete(objs[q]);
    }
    return ok;
}

/* The held document of TS_WHOLE at the end of the output. */
static void
parse_whole(srv_tp_t *tp)
{
    const char *s = tp->thold.data ? tp->thold.data : "";
    size_t n = tp->thold.len;
    cJSON *j = NULL;
    int ok = 0;

    switch (tp->cfg.mode) {
    case SRV_TP_NAMED:
        j = parse_doc(s, n);
        if (cJSON_IsObject(j)) {
            add_call(tp, xstrdup_try(tp->named), cJSON_PrintUnformatted(j));
            ok = 1;
        }
        break;
    case SRV_TP_REQUIRED:
        j = parse_doc(s, n);
        ok = j != NULL && add_calls_json(tp, j);
        break;
    default:
        if (tp->cfg.format == SRV_TP_FMT_LLAMA3) {
            ok = parse_llama3(tp, s, n);
        } else if (tp->cfg.format == SRV_TP_FMT_MISTRAL) {
            size_t i = skip_ws(s, n, 0);
            size_t ml = strlen(MISTRAL_MARK);
            if (n - i >= ml && memcmp(s + i, MISTRAL_MARK, ml) == 0) {
                i += ml;
            }
            j = parse_doc(s + i, n - i);
            ok = j != NULL && add_calls_json(tp, j);
        } else if (tp->cfg.format == SRV_TP_FMT_GENERIC) {
            j = parse_doc(s, n);
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
            const cJSON *resp = cJSON_GetObjectItemCaseSensitive(j, "response");
            if (cJSON_IsObject(j) && cJSON_IsArray(tc)) {
                ok = add_calls_json(tp, tc);
            } else if (cJSON_IsObject(j) && cJSON_IsString(resp)) {
                emit_content(tp, resp->valuestring, strlen(resp->valuestring));
                ok = 1;
            }
        }
        break;
    }
    cJSON_Delete(j);
    if (!ok) {
        emit_content(tp, s, n);
    }
    tp->thold.len = 0;
}

/* ---- the tool stage ------------------------------------------------------------ */

/* Whether the output, whose first non-whitespace text is s[0..n), is a
 * whole tool-call document: 1 yes, 0 no, -1 not known yet. */
static int
starts_document(const srv_tp_t *tp, const char *s, size_t n)
{
    static const char *marks[2] = {PYTHON_TAG, MISTRAL_MARK};

    switch (tp->cfg.mode) {
    case SRV_TP_NAMED:
        return s[0] == '{';
    case SRV_TP_REQUIRED:
        return s[0] == '{' || s[0] == '[';
    default:
        break;
    }
    if (tp->cfg.format == SRV_TP_FMT_GENERIC) {
        return s[0] == '{';
    }
    if (tp->cfg.format == SRV_TP_FMT_LLAMA3 || tp->cfg.format == SRV_TP_FMT_MISTRAL) {
        const char *mark = marks[tp->cfg.format == SRV_TP_FMT_MISTRAL];
        size_t ml = strlen(mark);
        if (memcmp(s, mark, n < ml ? n : ml) == 0) {
            return n >= ml ? 1 : -1;
        }
        /* A bare JSON start: the marker may be a special token that the
         * detokenizer skipped. */
        return s[0] == (tp->cfg.format == SRV_TP_FMT_LLAMA3 ? '{' : '[');
    }
    return 0;
}

/* TS_TEXT: releases content up to a marker or to what may start one. */
static void
text_scan(srv_tp_t *tp, int final)
{
    const char *mark = tp->cfg.mode != SRV_TP_AUTO          ? NULL
                       : tp->cfg.format == SRV_TP_FMT_HERMES  ? HERMES_OPEN
                       : tp->cfg.format == SRV_TP_FMT_MISTRAL ? MISTRAL_MARK
                                                              : NULL;
    const char *s = tp->thold.data;
    size_t n = tp->thold.len;
    const char *at = mark != NULL ? find_mem(s, n, mark) : NULL;

    if (at != NULL) {
        size_t pre = (size_t)(at - s), keep = pre;
        while (keep > 0 && isspace((unsigned char)s[keep - 1])) {
            keep--;
        }
        emit_content(tp, s, keep);
        if (tp->cfg.format == SRV_TP_FMT_HERMES) {
            srv_buf_consume(&tp->thold, pre + strlen(HERMES_OPEN));
            tp->tstate = TS_CALL;
        } else {
            srv_buf_consume(&tp->thold, pre);
            tp->tstate = TS_WHOLE;
        }
        return;
    }
    if (final) {
        if (tp->n_calls == 0 || !all_ws(s, n)) {
            emit_content(tp, s, n);
        }
        tp->thold.len = 0;
        return;
    }
    /* Hold a possible marker start and trailing whitespace (dropped if a
     * call follows). */
    size_t rel = n - (mark != NULL ? partial_suffix(s, n, mark) : 0);
    while (rel > 0 && isspace((unsigned char)s[rel - 1])) {
        rel--;
    }
    emit_content(tp, s, rel);
    srv_buf_consume(&tp->thold, rel);
}

/* TS_CALL (hermes): a whole <tool_call> body. */
static void
call_scan(srv_tp_t *tp, int final)
{
    const char *s = tp->thold.data;
    size_t n = tp->thold.len;
    const char *end = find_mem(s, n, HERMES_CLOSE);
    size_t body = end != NULL ? (size_t)(end - s) : n;

    if (end == NULL && !final) {
        return;
    }
    cJSON *j = parse_doc(s, body);
    int call = j != NULL && call_shape(j);
    if (call) {
        add_call_json(tp, j);
    } else {
        /* Not a call after all: the text as the model wrote it. */
        emit_content(tp, HERMES_OPEN, strlen(HERMES_OPEN));
        emit_content(tp, s, end != NULL ? body + strlen(HERMES_CLOSE) : n);
    }
    cJSON_Delete(j);
    srv_buf_consume(&tp->thold, end != NULL ? body + strlen(HERMES_CLOSE) : n);
    if (call) {
        /* Whitespace after a call is not content. */
        srv_buf_consume(&tp->thold, skip_ws(tp->thold.data, tp->thold.len, 0));
    }
    tp->tstate = TS_TEXT;
}

static void
tool_feed(srv_tp_t *tp, const char *text, size_t n, int final)
{
    if (tp->cfg.mode == SRV_TP_OFF) {
        emit_content(tp, text, n);
        return;
    }
    srv_buf_add(&tp->thold, text, n);
    for (;;) {
        int before = tp->tstate;
        size_t len = tp->thold.len;

        if (tp->thold.oom) {
            tp->oom = 1;
            return;
        }
        switch (tp->tstate) {
        case TS_START: {
            size_t i = skip_ws(tp->thold.data, tp->thold.len, 0);
            if (i == tp->thold.len) {
                if (final) {
                    emit_content(tp, tp->thold.data, tp->thold.len);
                    tp->thold.len = 0;
                }
                return;
            }
            int d = starts_document(tp, tp->thold.data + i, tp->thold.len - i);
            if (d < 0 && !final) {
                return;
            }
            if (d > 0) {
                srv_buf_consume(&tp->thold, i);
                tp->tstate = TS_WHOLE;
            } else {
                tp->tstate = TS_TEXT;
            }
            break;
        }
        case TS_TEXT:
            text_scan(tp, final);
            break;
        case TS_CALL:
            call_scan(tp, final);
            break;
        case TS_WHOLE:
            if (final) {
                parse_whole(tp);
            }
            return;
        }
        if (tp->tstate == before && tp->thold.len == len) {
            return;
        }
        if (tp->thold.len == 0 && !final) {
            return;
        }
    }
}

/* ---- the reasoning stage ------------------------------------------------------- */

void
srv_tp_feed(srv_tp_t *tp, const char *text, size_t n, int final)
{
    if (tp->finished) {
        return;
    }
    if (tp->think_ws) {
        /* The answer's leading whitespace belongs to neither. */
        size_t ws = skip_ws(text, n, 0);
        text += ws;
        n -= ws;
        tp->think_ws = n == 0;
    }
    if (tp->cfg.reasoning == SRV_TP_REASON_NONE || tp->think_closed) {
        tool_feed(tp, text, n, final);
        goto out;
    }
    srv_buf_add(&tp->rhold, text, n);
    if (tp->rhold.oom) {
        tp->oom = 1;
        goto out;
    }
    if (!tp->think_decided) {
        size_t i = skip_ws(tp->rhold.data, tp->rhold.len, 0);
        size_t rest = tp->rhold.len - i, ol = strlen(THINK_OPEN);
        if (rest < ol && memcmp(tp->rhold.data + i, THINK_OPEN, rest) == 0 && !final) {
            return; /* may still become <think> */
        }
        tp->think_decided = 1;
        if (rest >= ol && memcmp(tp->rhold.data + i, THINK_OPEN, ol) == 0) {
            srv_buf_consume(&tp->rhold, i + ol);
            tp->think = 1;
        } else {
            tp->think = tp->cfg.reasoning == SRV_TP_REASON_DEEPSEEK_R1;
        }
    }
    if (tp->think) {
        const char *s = tp->rhold.data ? tp->rhold.data : "";
        const char *end = find_mem(s, tp->rhold.len, THINK_CLOSE);
        if (end == NULL) {
            size_t rel = final ? tp->rhold.len
                               : tp->rhold.len - partial_suffix(s, tp->rhold.len, THINK_CLOSE);
            srv_buf_add(&tp->reasoning, s, rel);
            srv_buf_consume(&tp->rhold, rel);
            goto out;
        }
        srv_buf_add(&tp->reasoning, s, (size_t)(end - s));
        srv_buf_consume(&tp->rhold, (size_t)(end - s) + strlen(THINK_CLOSE));
        /* The answer's leading whitespace belongs to neither. */
        srv_buf_consume(&tp->rhold, skip_ws(tp->rhold.data, tp->rhold.len, 0));
        tp->think_ws = tp->rhold.len == 0;
        tp->think = 0;
    }
    tp->think_closed = 1;
    srv_buf_t rest = tp->rhold;
    memset(&tp->rhold, 0, sizeof(tp->rhold));
    tool_feed(tp, rest.data ? rest.data : "", rest.len, final);
    srv_buf_free(&rest);
out:
    if (tp->content.oom || tp->reasoning.oom || tp->thold.oom) {
        tp->oom = 1;
    }
    if (final) {
        tp->finished = 1;
    }
}

const char *
srv_tp_finish_reason(const srv_tp_t *tp, const char *finish)
{
    if (tp->n_calls > 0 && (finish == NULL || strcmp(finish, "length") != 0)) {
        return "tool_calls";
    }
    return finish;
}

/* ---- stream events ------------------------------------------------------------- */

int
srv_tp_pending(const srv_tp_t *tp)
{
    return tp->content_sent < tp->content.len || tp->reasoning_sent < tp->reasoning.len ||
           tp->calls_sent < tp->n_calls;
}

int
srv_tp_next(srv_tp_t *tp, srv_tp_event_t *ev)
{
    memset(ev, 0, sizeof(*ev));
    if (tp->content_sent < tp->content.len || tp->reasoning_sent < tp->reasoning.len) {
        ev->kind = SRV_TP_EV_TEXT;
        ev->content = tp->content.data ? tp->content.data + tp->content_sent : "";
        ev->content_len = tp->content.len - tp->content_sent;
        ev->reasoning = tp->reasoning.data ? tp->reasoning.data + tp->reasoning_sent : "";
        ev->reasoning_len = tp->reasoning.len - tp->reasoning_sent;
        tp->content_sent = tp->content.len;
        tp->reasoning_sent = tp->reasoning.len;
        return 1;
    }
    if (tp->calls_sent < tp->n_calls) {
        ev->call = tp->calls_sent;
        if (!tp->head_sent) {
            ev->kind = SRV_TP_EV_CALL_HEAD;
            tp->head_sent = 1;
        } else {
            ev->kind = SRV_TP_EV_CALL_ARGS;
            tp->head_sent = 0;
            tp->calls_sent++;
        }
        return 1;
    }
    return 0;
}

void
srv_tp_chat_delta(const srv_tp_t *tp, const srv_tp_event_t *ev, srv_buf_t *out)
{
    const srv_tp_call_t *c;

    switch (ev->kind) {
    case SRV_TP_EV_TEXT:
        if (ev->content_len > 0 || ev->reasoning_len == 0) {
            srv_buf_adds(out, "\"content\":");
            srv_json_string(out, ev->content, ev->content_len);
        }
        if (ev->reasoning_len > 0) {
            srv_buf_adds(out, ev->content_len > 0 ? ",\"reasoning_content\":"
                                                  : "\"reasoning_content\":");
            srv_json_string(out, ev->reasoning, ev->reasoning_len);
        }
        break;
    case SRV_TP_EV_CALL_HEAD:
        c = &tp->calls[ev->call];
        srv_buf_printf(out, "\"tool_calls\":[{\"index\":%d,\"id\":\"%s\",\"type\":\"function\","
                            "\"function\":{\"name\":",
                       ev->call, c->id);
        srv_json_string(out, c->name, strlen(c->name));
        srv_buf_adds(out, ",\"arguments\":\"\"}}]");
        break;
    case SRV_TP_EV_CALL_ARGS:
        c = &tp->calls[ev->call];
        srv_buf_printf(out, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", ev->call);
        srv_json_string(out, c->args, strlen(c->args));
        srv_buf_adds(out, "}}]");
        break;
    default:
        break;
    }
}
