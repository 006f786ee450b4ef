/* chat.c - the chat template API (text/chat.h): compiles a template and
 * renders it over a conversation, a Jinja subset interpreter.
 *
 * DESIGN. Three stages, each in its own file, sharing text/jinja_int.h:
 *
 *   lexer    (jinja_lex.c) source -> tokens. Text between tags becomes TEXT
 *            tokens with jinja2's whitespace rules already applied: "-"
 *            strips all whitespace on that side, trim_blocks drops the
 *            newline after a block or comment tag, lstrip_blocks drops
 *            spaces and tabs before a block or comment tag that starts its
 *            line, "+" keeps both. A single trailing newline of the source
 *            is dropped (keep_trailing_newline=False), here.
 *   parser   (jinja_parse.c) tokens -> a tree of cnode_t (statements and
 *            expressions) with jinja2's precedence: if-else < or < and <
 *            not < comparisons < + - < ~ < * / // % < ** < unary < postfix /
 *            filters / tests.
 *   render   (jinja_eval.c) walks the tree with Python semantics for the
 *            values (jinja_value.c: none, bool, int, float, str, list /
 *            tuple, dict, namespace, macro, builtin function, bound method,
 *            loop); the built-ins are in jinja_filters.c (filters, tests,
 *            tojson) and jinja_methods.c (methods, globals).
 *
 * This file holds the entry points: chat_template_compile (newline
 * normalization, then lexer and parser), chat_template_render (the
 * messages, the options and extra_json become the template's globals)
 * and chat_template_destroy.
 *
 * Memory: the tree lives in the template's arena; a render allocates every
 * value in its own arena, freed when the render ends, so values are shared
 * freely and never freed one by one. Errors unwind with longjmp to the
 * compile or render entry point, which frees the arena: no code path
 * between them owns anything else.
 *
 * Limits (untrusted templates): parser nesting depth, macro call depth,
 * total loop iterations, arena bytes and output bytes are bounded.
 *
 * Thread: any; a compiled template is immutable, and each render uses its
 * own arena and context.
 */
#define LOG_MODULE "chat"

#include <cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "text/chat.h"
#include "text/jinja_int.h"

/* ==== public API ========================================================== */

struct chat_template {
    arena_t ar;
    cnode_t **body;
    int nbody;
};

static void
set_err(char *err, size_t errlen, const char *msg)
{
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen, "%s", msg);
    }
}

/* Lexes and parses src[0..len) into t; errors longjmp to compile_run. */
static void
compile_inner(cx_t *cx, chat_template_t *t, const char *src, size_t len)
{
    lexer_t lx;
    parser_t ps;
    nvec_t body = {0};
    char *norm = chat__ar_alloc(cx, len + 1);
    size_t n = 0;

    /* newlines normalized to \n, one trailing newline dropped */
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') {
                i++;
            }
        } else {
            norm[n++] = src[i];
        }
    }
    if (n > 0 && norm[n - 1] == '\n') {
        n--;
    }
    norm[n] = '\0';

    memset(&lx, 0, sizeof(lx));
    lx.cx = cx;
    lx.src = norm;
    lx.len = n;
    lx.line = 1;
    chat__lex_all(&lx);

    memset(&ps, 0, sizeof(ps));
    ps.cx = cx;
    ps.toks = lx.toks;
    chat__parse_body(&ps, &body, NULL);
    t->body = body.v;
    t->nbody = body.n;
}

static int
compile_run(cx_t *cx, chat_template_t *t, const char *src, size_t len)
{
    if (setjmp(cx->jb) != 0) {
        return cx->status;
    }
    compile_inner(cx, t, src, len);
    return ST_OK;
}

int
chat_template_compile(const char *src, chat_template_t **out, char *err, size_t errlen)
{
    chat_template_t *t;
    cx_t *cx;
    size_t len;
    int rc;

    if (src == NULL || out == NULL) {
        set_err(err, errlen, "no template");
        return ST_EINVAL;
    }
    len = strlen(src);
    if (len > CHAT_MAX_SOURCE) {
        set_err(err, errlen, "template too large");
        return ST_ETOOLONG;
    }
    t = calloc(1, sizeof(*t));
    cx = calloc(1, sizeof(*cx));
    if (t == NULL || cx == NULL) {
        free(t);
        free(cx);
        return ST_ENOMEM;
    }
    t->ar.limit = CHAT_ARENA_BASE;
    cx->ar = &t->ar;
    cx->max_out = CHAT_MAX_SOURCE;
    rc = compile_run(cx, t, src, len);
    if (rc != ST_OK) {
        set_err(err, errlen, cx->msg);
        chat_template_destroy(t);
    } else {
        *out = t;
    }
    free(cx);
    return rc;
}

void
chat_template_destroy(chat_template_t *t)
{
    if (t == NULL) {
        return;
    }
    chat__arena_free(&t->ar);
    free(t);
}

static val_t
from_json(rstate_t *rs, const cJSON *j, int depth)
{
    cx_t *cx = rs->cx;

    if (depth > CHAT_MAX_DEPTH) {
        chat__cx_fail(cx, ST_EINVAL, "extra_json nested too deeply");
    }
    if (cJSON_IsString(j)) {
        return v_cstr(chat__ar_strndup(cx, j->valuestring, strlen(j->valuestring)));
    }
    if (cJSON_IsBool(j)) {
        return v_bool(cJSON_IsTrue(j));
    }
    if (cJSON_IsNull(j)) {
        return v_none;
    }
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;

        if (d == floor(d) && fabs(d) < 9007199254740992.0) {
            return v_int((int64_t)d);
        }
        return v_float(d);
    }
    if (cJSON_IsArray(j)) {
        vlist_t *l = chat__list_new(cx, 4);

        for (const cJSON *c = j->child; c != NULL; c = c->next) {
            chat__list_push(cx, l, from_json(rs, c, depth + 1));
        }
        return v_list(l);
    }
    if (cJSON_IsObject(j)) {
        vdict_t *d = chat__dict_new(cx);

        for (const cJSON *c = j->child; c != NULL; c = c->next) {
            chat__dict_set(cx, d, v_cstr(chat__ar_strndup(cx, c->string, strlen(c->string))),
                           from_json(rs, c, depth + 1));
        }
        return v_dict(d);
    }
    return v_none;
}

/* Everything one render needs, reached through one pointer so that nothing
 * lives in a register across setjmp. */
typedef struct rjob {
    cx_t cx;
    rstate_t rs;
    arena_t ar;
    const chat_template_t *t;
    const chat_message_t *msgs;
    size_t n;
    const chat_render_opts_t *opts;
    cJSON *extra;
    sbuf_t buf;
} rjob_t;

static void
render_globals(rjob_t *j)
{
    static const struct {
        const char *name;
        int fn;
    } fns[] = {
        {"range", FN_RANGE},           {"namespace", FN_NAMESPACE}, {"raise_exception", FN_RAISE},
        {"strftime_now", FN_STRFTIME}, {"dict", FN_DICT},
    };
    rstate_t *rs = &j->rs;
    cx_t *cx = &j->cx;
    const chat_render_opts_t *opts = j->opts;
    vlist_t *ml;

    rs->root = chat__scope_new(rs, NULL);
    rs->cur = rs->root;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        val_t f = {.t = V_FUNC, .u.i = fns[i].fn};
        chat__scope_set(rs, rs->root, fns[i].name, f);
    }
    ml = chat__list_new(cx, j->n);
    for (size_t i = 0; i < j->n; i++) {
        vdict_t *d = chat__dict_new(cx);
        const chat_message_t *m = &j->msgs[i];

        chat__dict_set(cx, d, v_cstr("role"), m->role ? v_cstr(m->role) : v_none);
        chat__dict_set(cx, d, v_cstr("content"), m->content ? v_cstr(m->content) : v_none);
        chat__list_push(cx, ml, v_dict(d));
    }
    chat__scope_set(rs, rs->root, "messages", v_list(ml));
    if (opts->bos_token != NULL) {
        chat__scope_set(rs, rs->root, "bos_token", v_cstr(opts->bos_token));
    }
    if (opts->eos_token != NULL) {
        chat__scope_set(rs, rs->root, "eos_token", v_cstr(opts->eos_token));
    }
    chat__scope_set(rs, rs->root, "add_generation_prompt",
                    v_bool(opts->add_generation_prompt != 0));
    if (opts->extra_json != NULL) {
        j->extra = cJSON_Parse(opts->extra_json);
        if (j->extra == NULL || !cJSON_IsObject(j->extra)) {
            chat__cx_fail(cx, ST_EINVAL, "extra_json is not a JSON object");
        }
        for (const cJSON *c = j->extra->child; c != NULL; c = c->next) {
            chat__scope_set(rs, rs->root, chat__ar_strndup(cx, c->string, strlen(c->string)),
                            from_json(rs, c, 0));
        }
    }
}

static int
render_run(rjob_t *j)
{
    if (setjmp(j->cx.jb) != 0) {
        chat__tl_cx = NULL;
        return j->cx.status;
    }
    chat__tl_cx = &j->cx;
    render_globals(j);
    chat__render_body(&j->rs, j->t->body, j->t->nbody, &j->buf);
    chat__tl_cx = NULL;
    return ST_OK;
}

int
chat_template_render(const chat_template_t *t, const chat_message_t *msgs, size_t n,
                     const chat_render_opts_t *opts, char **out, char *err, size_t errlen)
{
    static const chat_render_opts_t defaults = {0};
    rjob_t *j;
    char *res = NULL;
    int rc;

    if (t == NULL || out == NULL || (n > 0 && msgs == NULL)) {
        set_err(err, errlen, "bad arguments");
        return ST_EINVAL;
    }
    j = xcalloc_try(1, sizeof(*j));
    if (j == NULL) {
        set_err(err, errlen, "out of memory");
        return ST_ENOMEM;
    }
    j->ar.fallible = 1;
    j->t = t;
    j->msgs = msgs;
    j->n = n;
    j->opts = opts != NULL ? opts : &defaults;
    j->cx.ar = &j->ar;
    j->cx.max_out = j->opts->max_output ? j->opts->max_output : CHAT_DEFAULT_MAX_OUTPUT;
    j->ar.limit = CHAT_ARENA_BASE + 4 * j->cx.max_out;
    j->rs.cx = &j->cx;
    j->rs.now = j->opts->now ? j->opts->now : time(NULL);
    rc = render_run(j);
    if (rc == ST_OK) {
        res = xmalloc_try(j->buf.n + 1);
        if (res == NULL) {
            rc = ST_ENOMEM;
            set_err(err, errlen, "out of memory");
        } else {
            if (j->buf.n) {
                memcpy(res, j->buf.p, j->buf.n);
            }
            res[j->buf.n] = '\0';
            *out = res;
        }
    } else {
        set_err(err, errlen, j->cx.msg);
    }
    cJSON_Delete(j->extra);
    chat__arena_free(&j->ar);
    free(j);
    return rc;
}
