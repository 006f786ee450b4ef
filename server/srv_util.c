/* srv_util.c - byte buffers, OpenAI error bodies, the JSON pre-check that
 * runs before cJSON, fallible cJSON building, stop-string matching, SSE
 * framing and the plain chat template. All pure; loop thread.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/utf8.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_int.h"

/* ---- buffers ----------------------------------------------------------------- */

int
srv_buf_reserve(srv_buf_t *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    char *p;

    if (need <= b->cap) {
        return 1;
    }
    if (need < extra) {
        b->oom = 1;
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        cap *= 2;
    }
    p = xrealloc_try(b->data, cap);
    if (p == NULL) {
        b->oom = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

void
srv_buf_add(srv_buf_t *b, const void *p, size_t n)
{
    if (!srv_buf_reserve(b, n)) {
        return;
    }
    if (n > 0) {
        memcpy(b->data + b->len, p, n);
    }
    b->len += n;
    b->data[b->len] = '\0';
}

void
srv_buf_adds(srv_buf_t *b, const char *s)
{
    srv_buf_add(b, s, strlen(s));
}

void
srv_buf_printf(srv_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) {
        return;
    }
    if (!srv_buf_reserve(b, (size_t)n)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void
srv_buf_consume(srv_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        if (b->data) {
            b->data[0] = '\0';
        }
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

void
srv_buf_free(srv_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

/* ---- errors ------------------------------------------------------------------ */

void
srv_err_defaults(srv_error_t *err)
{
    switch (err->status) {
    case 401:
        err->type = "authentication_error";
        err->code = "invalid_api_key";
        break;
    case 404:
        err->type = "not_found_error";
        if (err->code == NULL) {
            err->code = "not_found";
        }
        break;
    case 405:
        err->type = "invalid_request_error";
        err->code = "method_not_allowed";
        break;
    case 413:
        err->type = "invalid_request_error";
        err->code = "request_too_large";
        break;
    case 429:
        err->type = "rate_limit_error";
        err->code = "rate_limit_exceeded";
        break;
    case 503:
        err->type = "service_unavailable_error";
        err->code = "service_unavailable";
        break;
    case 500:
        err->type = "server_error";
        err->code = "internal_error";
        break;
    default:
        err->type = "invalid_request_error";
        break;
    }
}

/* Quoted client text cut by a precision ("%.100s") or by the buffer size
 * can end in half a character: replace the bytes of any broken sequence by
 * '?' so error bodies stay valid UTF-8 (tests/fuzz/regress/request). */
static void
utf8_scrub(char *s)
{
    size_t n = strlen(s);

    for (size_t i = 0; i < n;) {
        int len = utf8_decode((const uint8_t *)s + i, n - i, NULL);
        if (len > 0) {
            i += (size_t)len;
        } else {
            s[i++] = '?';
        }
    }
}

void
srv_err_set(srv_error_t *err, int status, const char *param, const char *fmt, ...)
{
    va_list ap;

    memset(err, 0, sizeof(*err));
    err->status = status;
    srv_err_defaults(err);
    if (param != NULL) {
        snprintf(err->param, sizeof(err->param), "%s", param);
        utf8_scrub(err->param);
    }
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    utf8_scrub(err->message);
}

/* Hand-built (no cJSON) so that an error body needs one allocation; same
 * bytes as cJSON_PrintUnformatted() of the same object. */
char *
srv_err_json(const srv_error_t *err)
{
    srv_buf_t b = {0};
    const char *type = err->type ? err->type : "invalid_request_error";

    srv_buf_adds(&b, "{\"error\":{\"message\":");
    srv_json_string(&b, err->message, strlen(err->message));
    srv_buf_adds(&b, ",\"type\":");
    srv_json_string(&b, type, strlen(type));
    srv_buf_adds(&b, ",\"param\":");
    if (err->param[0] != '\0') {
        srv_json_string(&b, err->param, strlen(err->param));
    } else {
        srv_buf_adds(&b, "null");
    }
    srv_buf_adds(&b, ",\"code\":");
    if (err->code != NULL) {
        srv_json_string(&b, err->code, strlen(err->code));
    } else {
        srv_buf_adds(&b, "null");
    }
    srv_buf_adds(&b, "}}");
    if (b.oom) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.data;
}

int
srv_http_status_of(int st, int engine_failed)
{
    if (st == ST_ESHUTDOWN) {
        return 503;
    }
    if (engine_failed) {
        return 500;
    }
    switch (st) {
    case ST_EQUEUE:
        return 429;
    case ST_ETOOLONG:
    case ST_EINVAL:
    case ST_ERANGE:
        return 400;
    case ST_ENOMEM:
        return 503;
    default:
        return 500;
    }
}

static void *
json_malloc(size_t n)
{
    return xmalloc_try(n);
}

void
srv_json_hooks_install(void)
{
    cJSON_Hooks h = {json_malloc, free};

    cJSON_InitHooks(&h);
}

#define OOM_MESSAGE "the server is out of memory; retry later"

const char srv_oom_json[] = "{\"error\":{\"message\":\"" OOM_MESSAGE "\","
                            "\"type\":\"service_unavailable_error\",\"param\":null,"
                            "\"code\":\"service_unavailable\"}}";

void
srv_err_oom(srv_error_t *err)
{
    srv_err_set(err, 503, NULL, "%s", OOM_MESSAGE);
}

/* ---- JSON pre-check ---------------------------------------------------------- */

/* Nonzero when some byte of w is 0. */
#define HAS_ZERO_BYTE(w) ((((w) - 0x0101010101010101ull) & ~(w) & 0x8080808080808080ull) != 0)

int
srv_json_precheck(const char *s, size_t n, int max_depth, srv_error_t *err)
{
    int depth = 0;
    int in_str = 0;

    if (!utf8_valid(s, n)) {
        srv_err_set(err, 400, NULL, "request body is not valid UTF-8");
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            /* Inside a string, skip 8 bytes at a time while none is '"',
             * '\\' or NUL (an 8 MiB prompt is checked on the loop thread). */
            while (i + 8 <= n) {
                uint64_t w;

                memcpy(&w, s + i, 8);
                if (HAS_ZERO_BYTE(w) || HAS_ZERO_BYTE(w ^ 0x2222222222222222ull) ||
                    HAS_ZERO_BYTE(w ^ 0x5C5C5C5C5C5C5C5Cull)) {
                    break;
                }
                i += 8;
            }
            if (i >= n) {
                break;
            }
        }
        unsigned char c = (unsigned char)s[i];

        if (c == 0) {
            srv_err_set(err, 400, NULL, "request body contains a NUL byte");
            return 0;
        }
        if (in_str) {
            if (c == '\\') {
                if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) {
                    srv_err_set(err, 400, NULL, "strings must not contain \\u0000");
                    return 0;
                }
                i++; /* skip the escaped character */
            } else if (c == '"') {
                in_str = 0;
            }
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max_depth) {
                srv_err_set(err, 400, NULL, "JSON nesting deeper than %d levels", max_depth);
                return 0;
            }
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return 1;
}

/* ---- stop strings ------------------------------------------------------------ */

void
srv_stop_init(srv_stop_t *s, const char *const *stop, int32_t n_stop)
{
    memset(s, 0, sizeof(*s));
    s->stop = stop;
    s->n_stop = n_stop;
}

void
srv_stop_free(srv_stop_t *s)
{
    srv_buf_free(&s->held);
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of some
 * stop string. */
static size_t
stop_hold_len(const srv_stop_t *s, const char *t, size_t n)
{
    size_t best = 0;

    for (int32_t k = 0; k < s->n_stop; k++) {
        size_t sl = strlen(s->stop[k]);
        size_t max = sl - 1 < n ? sl - 1 : n;
        for (size_t l = max; l > best; l--) {
            if (memcmp(t + n - l, s->stop[k], l) == 0) {
                best = l;
                break;
            }
        }
    }
    return best;
}

int
srv_stop_feed(srv_stop_t *s, const char *text, size_t n, srv_buf_t *out)
{
    const char *t;
    size_t tl, first = (size_t)-1;

    if (s->matched) {
        return 1;
    }
    if (s->n_stop == 0) {
        srv_buf_add(out, text, n);
        return 0;
    }
    srv_buf_add(&s->held, text, n);
    if (s->held.oom) {
        return 0; /* the text is lost: the caller sees the failed allocation */
    }
    t = s->held.data;
    tl = s->held.len;
    for (int32_t k = 0; k < s->n_stop; k++) {
        const char *hit = memmem(t, tl, s->stop[k], strlen(s->stop[k]));
        if (hit != NULL && (size_t)(hit - t) < first) {
            first = (size_t)(hit - t);
        }
    }
    if (first != (size_t)-1) {
        srv_buf_add(out, t, first);
        s->matched = 1;
        s->held.len = 0;
        return 1;
    }
    size_t hold = stop_hold_len(s, t, tl);
    srv_buf_add(out, t, tl - hold);
    srv_buf_consume(&s->held, tl - hold);
    return 0;
}

void
srv_stop_finish(srv_stop_t *s, srv_buf_t *out)
{
    if (!s->matched && s->held.len > 0) {
        srv_buf_add(out, s->held.data, s->held.len);
    }
    s->held.len = 0;
}

/* ---- JSON strings ------------------------------------------------------------ */

void
srv_json_string(srv_buf_t *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;

    srv_buf_add(out, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        srv_buf_add(out, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        default:
            u[0] = '\\';
            u[1] = 'u';
            u[2] = '0';
            u[3] = '0';
            u[4] = hex[c >> 4];
            u[5] = hex[c & 15];
            u[6] = '\0';
            esc = u;
            break;
        }
        srv_buf_adds(out, esc);
    }
    srv_buf_add(out, s + run, n - run);
    srv_buf_add(out, "\"", 1);
}

/* ---- SSE --------------------------------------------------------------------- */

void
srv_sse_data(srv_buf_t *out, const char *json)
{
    srv_buf_adds(out, "data: ");
    srv_buf_adds(out, json);
    srv_buf_adds(out, "\n\n");
}

void
srv_sse_done(srv_buf_t *out)
{
    srv_buf_adds(out, "data: [DONE]\n\n");
}

/* ---- token text -------------------------------------------------------------- */

void
srv_token_text(const char *bytes, size_t n, srv_buf_t *out)
{
    size_t i = 0;

    while (i < n) {
        size_t ok = 0;
        /* Longest valid prefix from i, one character at a time. */
        while (i + ok < n) {
            int cl = utf8_decode((const uint8_t *)bytes + i + ok, n - i - ok, NULL);
            if (cl <= 0) {
                break;
            }
            ok += (size_t)cl;
        }
        srv_buf_add(out, bytes + i, ok);
        i += ok;
        if (i < n) {
            srv_buf_adds(out, "\xEF\xBF\xBD");
            i++;
        }
    }
    if (out->data == NULL) {
        srv_buf_add(out, "", 0);
    }
}

/* ---- plain chat template ----------------------------------------------------- */

char *
srv_chat_render_plain(const srv_chat_msg_t *msgs, int32_t n, int add_generation_prompt,
                      const char *bos)
{
    srv_buf_t b = {0};

    if (bos != NULL) {
        srv_buf_adds(&b, bos);
    }
    for (int32_t i = 0; i < n; i++) {
        srv_buf_adds(&b, msgs[i].role);
        srv_buf_adds(&b, ": ");
        srv_buf_adds(&b, msgs[i].content);
        srv_buf_adds(&b, "\n");
    }
    if (add_generation_prompt) {
        srv_buf_adds(&b, "assistant:");
    }
    srv_buf_add(&b, "", 0);
    if (b.oom) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.data;
}

/* ---- fallible cJSON building ------------------------------------------------- */

unsigned long
srv_json_mark(void)
{
    return xmalloc_try_failures();
}

void
srv_json_add(cJSON *obj, const char *key, cJSON *item)
{
    if (item != NULL && !cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
    }
}

void
srv_json_push(cJSON *arr, cJSON *item)
{
    if (item != NULL && !cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
    }
}

char *
srv_json_print(cJSON *root, unsigned long mark)
{
    char *out = xmalloc_try_failures() == mark ? cJSON_PrintUnformatted(root) : NULL;

    cJSON_Delete(root);
    if (out != NULL && xmalloc_try_failures() != mark) {
        free(out);
        out = NULL;
    }
    return out;
}
