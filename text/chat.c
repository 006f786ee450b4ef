/* chat.c - a Jinja subset interpreter for chat templates.
 *
 * DESIGN. Three stages, each in its own section below:
 *
 *   lexer    source -> tokens. Text between tags becomes TEXT tokens with
 *            jinja2's whitespace rules already applied: "-" strips all
 *            whitespace on that side, trim_blocks drops the newline after a
 *            block or comment tag, lstrip_blocks drops spaces and tabs
 *            before a block or comment tag that starts its line, "+" keeps
 *            both. A single trailing newline of the source is dropped
 *            (keep_trailing_newline=False).
 *   parser   tokens -> a tree of cnode_t (statements and expressions) with
 *            jinja2's precedence: if-else < or < and < not < comparisons <
 *            + - < ~ < * / // % < ** < unary < postfix / filters / tests.
 *   render   walks the tree with Python semantics for the values (none,
 *            bool, int, float, str, list / tuple, dict, namespace, macro,
 *            builtin function, bound method, loop).
 *
 * Memory: the tree lives in the template's arena; a render allocates every
 * value in its own arena, freed when the render ends, so values are shared
 * freely and never freed one by one. Errors unwind with longjmp to the
 * compile or render entry point, which frees the arena: no code path
 * between them owns anything else.
 *
 * Limits (untrusted templates): parser nesting depth, macro call depth,
 * total loop iterations, arena bytes and output bytes are bounded.
 */
#define LOG_MODULE "chat"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "common/utf8.h"
#include "common/xmalloc.h"
#include "text/chat.h"

#define CHAT_MAX_DEPTH 200           /* parser nesting (expressions, blocks) */
#define CHAT_MAX_CALL_DEPTH 64       /* nested macro calls */
#define CHAT_MAX_EVAL_DEPTH 500      /* nested eval / render frames: bounds the C stack */
#define CHAT_MAX_ITERATIONS 1000000L /* loop iterations per render */
#define CHAT_MAX_SOURCE ((size_t)1 << 20)
#define CHAT_ARENA_BASE ((size_t)64 << 20)
#define CHAT_MAX_WORK 200000000L /* about a second of scanning and comparing */

/* ==== errors and arenas ================================================== */

typedef struct ablk {
    struct ablk *next;
    size_t used, cap;
    max_align_t data[];
} ablk_t;

typedef struct arena {
    ablk_t *head;
    size_t total, limit;
    int fallible; /* rendering (a request): blocks come from xmalloc_try */
} arena_t;

/* Compile and render context: the error exit and the arena in use. */
typedef struct cx {
    jmp_buf jb;
    int status;
    char msg[256];
    arena_t *ar;
    size_t max_out; /* bound on every string built */
    long work;      /* units of work done by a render (CHAT_MAX_WORK) */
    int line;       /* line of the node being rendered or the token being parsed */
} cx_t;

static _Noreturn void cx_fail(cx_t *cx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static _Noreturn void
cx_fail(cx_t *cx, int status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cx->msg, sizeof(cx->msg), fmt, ap);
    va_end(ap);
    cx->status = status;
    longjmp(cx->jb, 1);
}

/* The render running on this thread, for the work budget of helpers that
 * do not take the context (string search, comparisons). NULL while
 * compiling. */
static _Thread_local cx_t *tl_cx;

/* Counts n units of work; a render that scans or compares more than
 * CHAT_MAX_WORK units in total (quadratic loops over big inputs) fails
 * with ST_ETOOLONG instead of hanging the thread. */
static void
charge(size_t n)
{
    cx_t *cx = tl_cx;

    if (cx != NULL && (cx->work += (long)(n + 1)) > CHAT_MAX_WORK) {
        cx_fail(cx, ST_ETOOLONG, "line %d: template work limit exceeded", cx->line);
    }
}

static void
arena_free(arena_t *a)
{
    ablk_t *b = a->head;

    while (b != NULL) {
        ablk_t *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->total = 0;
}

static void *
ar_alloc(cx_t *cx, size_t n)
{
    arena_t *a = cx->ar;
    ablk_t *b = a->head;

    n = (n + 15) & ~(size_t)15;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;

        if (a->total + cap > a->limit) {
            cx_fail(cx, ST_ETOOLONG, "template memory limit exceeded");
        }
        b = a->fallible ? xmalloc_try(sizeof(*b) + cap) : malloc(sizeof(*b) + cap);
        if (b == NULL) {
            cx_fail(cx, ST_ENOMEM, "out of memory");
        }
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        a->total += cap;
    }
    b->used += n;
    return (char *)b->data + b->used - n;
}

static char *
ar_strndup(cx_t *cx, const char *s, size_t n)
{
    char *p = ar_alloc(cx, n + 1);

    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ==== values ============================================================= */

enum {
    V_UNDEF,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_NS,
    V_MACRO,
    V_FUNC,
    V_METHOD,
    V_LOOP,
};

typedef struct val val_t;
typedef struct vlist vlist_t;
typedef struct vdict vdict_t;
typedef struct cnode cnode_t;

struct val {
    int t;
    bool safe; /* V_STR: jinja2 Markup (from |safe or |escape) */
    union {
        int64_t i; /* V_BOOL, V_INT, V_FUNC id */
        double f;
        struct {
            const char *p; /* V_STR bytes; V_UNDEF: the missing name or NULL */
            size_t n;
        } s;
        vlist_t *l;
        vdict_t *d; /* V_DICT, V_NS */
        const cnode_t *macro;
        struct vmethod *m;
        struct vloop *loop;
    } u;
};

struct vlist {
    size_t n, cap;
    val_t *v;
    bool tuple;
    bool gen;        /* a jinja2 generator (map / select ...): always true, no len */
    const char *err; /* a generator whose input was bad: fails when iterated */
    char view;       /* 'k', 'v', 'i': a dict.keys() / values() / items() view */
};

struct vdict {
    size_t n, cap;
    val_t *k, *v;
    /* Open-addressing index of hashable keys (str, int, float, bool, none)
     * once the dict has more than DICT_INDEX_MIN entries: big JSON objects
     * from requests must not make every insertion a linear scan. */
    uint32_t *idx; /* [idx_cap] entry number or UINT32_MAX */
    size_t idx_cap;
};

#define DICT_INDEX_MIN 16

typedef struct vmethod {
    val_t self;
    const char *name;
} vmethod_t;

typedef struct vloop {
    vlist_t *items;
    size_t idx;
    int depth;
} vloop_t;

enum { FN_RANGE, FN_NAMESPACE, FN_RAISE, FN_STRFTIME, FN_DICT };

static const val_t v_undef = {.t = V_UNDEF};
static const val_t v_none = {.t = V_NONE};

static val_t
v_bool(bool b)
{
    val_t v = {.t = V_BOOL, .u.i = b};
    return v;
}

static val_t
v_int(int64_t i)
{
    val_t v = {.t = V_INT, .u.i = i};
    return v;
}

static val_t
v_float(double f)
{
    val_t v = {.t = V_FLOAT, .u.f = f};
    return v;
}

static val_t
v_strn(const char *p, size_t n)
{
    val_t v = {.t = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

static val_t
v_cstr(const char *p)
{
    return v_strn(p, strlen(p));
}

static val_t
v_undef_named(const char *name)
{
    val_t v = {.t = V_UNDEF};
    v.u.s.p = name;
    return v;
}

static vlist_t *
list_new(cx_t *cx, size_t cap)
{
    vlist_t *l = ar_alloc(cx, sizeof(*l));

    l->n = 0;
    l->cap = cap;
    l->tuple = false;
    l->gen = false;
    l->err = NULL;
    l->view = 0;
    l->v = cap ? ar_alloc(cx, cap * sizeof(val_t)) : NULL;
    return l;
}

static void
list_push(cx_t *cx, vlist_t *l, val_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        val_t *nv = ar_alloc(cx, cap * sizeof(val_t));

        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof(val_t));
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static val_t
v_list(vlist_t *l)
{
    val_t v = {.t = V_LIST, .u.l = l};
    return v;
}

static vdict_t *
dict_new(cx_t *cx)
{
    vdict_t *d = ar_alloc(cx, sizeof(*d));

    memset(d, 0, sizeof(*d));
    return d;
}

static val_t
v_dict(vdict_t *d)
{
    val_t v = {.t = V_DICT, .u.d = d};
    return v;
}

static bool
str_eq(val_t a, const char *s, size_t n)
{
    return a.t == V_STR && a.u.s.n == n && memcmp(a.u.s.p, s, n) == 0;
}

static bool val_eq(val_t a, val_t b);

/* Hash consistent with val_eq: 1 == 1.0 == true hash alike. false when the
 * key is not indexed (tuples and unhashables: found by a linear scan). */
static bool
val_hash(val_t v, uint64_t *h)
{
    uint64_t x;

    switch (v.t) {
    case V_STR:
        x = 1469598103934665603ULL;
        for (size_t i = 0; i < v.u.s.n; i++) {
            x = (x ^ (unsigned char)v.u.s.p[i]) * 1099511628211ULL;
        }
        break;
    case V_BOOL:
    case V_INT:
        x = (uint64_t)v.u.i * 0x9e3779b97f4a7c15ULL;
        break;
    case V_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9e18) {
            x = (uint64_t)(int64_t)v.u.f * 0x9e3779b97f4a7c15ULL;
        } else {
            memcpy(&x, &v.u.f, sizeof(x));
            x *= 0xbf58476d1ce4e5b9ULL;
        }
        break;
    case V_NONE:
        x = 0x51ed270b27ULL;
        break;
    default:
        return false;
    }
    *h = x ^ (x >> 29);
    return true;
}

static val_t *
dict_find(const vdict_t *d, val_t key)
{
    uint64_t h;

    if (d->idx != NULL && val_hash(key, &h)) {
        for (size_t j = h & (d->idx_cap - 1);; j = (j + 1) & (d->idx_cap - 1)) {
            uint32_t e = d->idx[j];

            if (e == UINT32_MAX) {
                return NULL;
            }
            if (val_eq(d->k[e], key)) {
                return &d->v[e];
            }
        }
    }
    charge(d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (val_eq(d->k[i], key)) {
            return &d->v[i];
        }
    }
    return NULL;
}

static void
dict_index_put(vdict_t *d, uint32_t e)
{
    uint64_t h;

    if (!val_hash(d->k[e], &h)) {
        return;
    }
    for (size_t j = h & (d->idx_cap - 1);; j = (j + 1) & (d->idx_cap - 1)) {
        if (d->idx[j] == UINT32_MAX) {
            d->idx[j] = e;
            return;
        }
    }
}

static val_t *
dict_find_str(const vdict_t *d, const char *s)
{
    return dict_find(d, v_strn(s, strlen(s)));
}

static void
dict_set(cx_t *cx, vdict_t *d, val_t key, val_t v)
{
    val_t *slot = dict_find(d, key);

    if (slot != NULL) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        val_t *nk = ar_alloc(cx, cap * sizeof(val_t));
        val_t *nv = ar_alloc(cx, cap * sizeof(val_t));

        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(val_t));
            memcpy(nv, d->v, d->n * sizeof(val_t));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = v;
    d->n++;
    if (d->n > DICT_INDEX_MIN) {
        if (d->idx == NULL || d->n * 2 > d->idx_cap) {
            size_t cap = 64;

            while (cap < d->n * 4) {
                cap *= 2;
            }
            d->idx = ar_alloc(cx, cap * sizeof(uint32_t));
            memset(d->idx, 0xff, cap * sizeof(uint32_t));
            d->idx_cap = cap;
            for (size_t i = 0; i < d->n; i++) {
                dict_index_put(d, (uint32_t)i);
            }
        } else {
            dict_index_put(d, (uint32_t)(d->n - 1));
        }
    }
}

/* ---- string buffers (arena-backed, bounded by cx->max_out) ---------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf_t;

static void
sb_reserve(cx_t *cx, sbuf_t *b, size_t extra)
{
    if (b->n + extra > cx->max_out) {
        cx_fail(cx, ST_ETOOLONG, "template output limit exceeded");
    }
    if (b->n + extra + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        char *np;

        while (cap < b->n + extra + 1) {
            cap *= 2;
        }
        np = ar_alloc(cx, cap);
        if (b->n) {
            memcpy(np, b->p, b->n);
        }
        b->p = np;
        b->cap = cap;
    }
}

static void
sb_add(cx_t *cx, sbuf_t *b, const char *s, size_t n)
{
    if (n == 0) {
        return;
    }
    sb_reserve(cx, b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void
sb_puts(cx_t *cx, sbuf_t *b, const char *s)
{
    sb_add(cx, b, s, strlen(s));
}

static void
sb_putc(cx_t *cx, sbuf_t *b, char c)
{
    sb_add(cx, b, &c, 1);
}

static val_t
sb_val(sbuf_t *b)
{
    return v_strn(b->n ? b->p : "", b->n);
}

/* ==== lexer ============================================================== */

enum {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
};

typedef struct tok {
    int t;
    const char *p; /* TEXT, NAME, STRING (decoded), OP text */
    size_t n;
    int64_t i;
    double f;
    int line;
} tok_t;

typedef struct lexer {
    cx_t *cx;
    const char *src;
    size_t len, pos;
    int line;
    tok_t *toks;
    size_t n, cap;
} lexer_t;

static bool
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

static void
lex_emit(lexer_t *lx, int t, const char *p, size_t n)
{
    tok_t *k;

    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        tok_t *nt = ar_alloc(lx->cx, cap * sizeof(tok_t));

        if (lx->n) {
            memcpy(nt, lx->toks, lx->n * sizeof(tok_t));
        }
        lx->toks = nt;
        lx->cap = cap;
    }
    k = &lx->toks[lx->n++];
    memset(k, 0, sizeof(*k));
    k->t = t;
    k->p = p;
    k->n = n;
    k->line = lx->line;
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

static void
utf8_put(cx_t *cx, sbuf_t *b, uint32_t cp)
{
    char u[4];

    sb_add(cx, b, u, (size_t)utf8_encode(cp, u));
}

/* A string literal at lx->pos (quote included); Python unicode-escape
 * rules, as jinja2 decodes them. */
static void
lex_string(lexer_t *lx)
{
    char q = lx->src[lx->pos];
    size_t i = lx->pos + 1;
    sbuf_t b = {0};
    int line = lx->line;

    while (i < lx->len && lx->src[i] != q) {
        char c = lx->src[i];

        if (c == '\n') {
            lx->line++;
        }
        if (c != '\\' || i + 1 >= lx->len) {
            sb_putc(lx->cx, &b, c);
            i++;
            continue;
        }
        c = lx->src[i + 1];
        i += 2;
        switch (c) {
        case '\n':
            break;
        case '\\':
            sb_putc(lx->cx, &b, '\\');
            break;
        case '\'':
            sb_putc(lx->cx, &b, '\'');
            break;
        case '"':
            sb_putc(lx->cx, &b, '"');
            break;
        case 'n':
            sb_putc(lx->cx, &b, '\n');
            break;
        case 't':
            sb_putc(lx->cx, &b, '\t');
            break;
        case 'r':
            sb_putc(lx->cx, &b, '\r');
            break;
        case 'a':
            sb_putc(lx->cx, &b, '\a');
            break;
        case 'b':
            sb_putc(lx->cx, &b, '\b');
            break;
        case 'f':
            sb_putc(lx->cx, &b, '\f');
            break;
        case 'v':
            sb_putc(lx->cx, &b, '\v');
            break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = c == 'x' ? 2 : (c == 'u' ? 4 : 8);
            uint32_t cp = 0;

            for (int k = 0; k < nd; k++) {
                int h = i + (size_t)k < lx->len ? hexval(lx->src[i + (size_t)k]) : -1;
                if (h < 0) {
                    cx_fail(lx->cx, ST_EFORMAT, "line %d: bad \\%c escape", lx->line, c);
                }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff) {
                cx_fail(lx->cx, ST_EFORMAT, "line %d: bad \\%c escape", lx->line, c);
            }
            i += (size_t)nd;
            utf8_put(lx->cx, &b, cp);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = (uint32_t)(c - '0');

                for (int k = 0; k < 2 && i < lx->len && lx->src[i] >= '0' && lx->src[i] <= '7';
                     k++) {
                    cp = cp * 8 + (uint32_t)(lx->src[i++] - '0');
                }
                utf8_put(lx->cx, &b, cp);
            } else {
                sb_putc(lx->cx, &b, '\\');
                sb_putc(lx->cx, &b, c);
            }
        }
    }
    if (i >= lx->len) {
        lx->line = line;
        cx_fail(lx->cx, ST_EFORMAT, "line %d: unterminated string", line);
    }
    lex_emit(lx, T_STRING, b.n ? b.p : "", b.n);
    lx->toks[lx->n - 1].line = line;
    lx->pos = i + 1;
}

static void
lex_number(lexer_t *lx)
{
    const char *s = lx->src;
    size_t i = lx->pos, start = i;
    bool is_float = false;
    char buf[128];
    size_t bn = 0;

    while (i < lx->len && (isdigit((unsigned char)s[i]) || s[i] == '_')) {
        i++;
    }
    if (i + 1 < lx->len && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        is_float = true;
        i++;
        while (i < lx->len && (isdigit((unsigned char)s[i]) || s[i] == '_')) {
            i++;
        }
    }
    if (i < lx->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;

        if (j < lx->len && (s[j] == '+' || s[j] == '-')) {
            j++;
        }
        if (j < lx->len && isdigit((unsigned char)s[j])) {
            is_float = true;
            i = j;
            while (i < lx->len && (isdigit((unsigned char)s[i]) || s[i] == '_')) {
                i++;
            }
        }
    }
    for (size_t k = start; k < i && bn + 1 < sizeof(buf); k++) {
        if (s[k] != '_') {
            buf[bn++] = s[k];
        }
    }
    buf[bn] = '\0';
    lex_emit(lx, is_float ? T_FLOAT : T_INT, s + start, i - start);
    if (is_float) {
        lx->toks[lx->n - 1].f = strtod(buf, NULL);
    } else {
        errno = 0;
        lx->toks[lx->n - 1].i = strtoll(buf, NULL, 10);
        if (errno != 0) {
            cx_fail(lx->cx, ST_EFORMAT, "line %d: integer literal too large", lx->line);
        }
    }
    lx->pos = i;
}

/* Tokens inside {{ }} or {% %} up to the closing tag. Returns true when
 * the closing tag had "-" (strip the following whitespace). */
static void
lex_tag(lexer_t *lx, bool block, bool *line_starting)
{
    static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
    const char *s = lx->src;
    int depth = 0;

    for (;;) {
        char c;

        while (lx->pos < lx->len && is_space((unsigned char)s[lx->pos])) {
            if (s[lx->pos] == '\n') {
                lx->line++;
            }
            lx->pos++;
        }
        if (lx->pos >= lx->len) {
            cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected end of template in tag", lx->line);
        }
        c = s[lx->pos];
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t p = lx->pos;
            int sign = 0;

            if ((c == '-' || c == '+') && p + 2 < lx->len + 0 && strncmp(s + p + 1, end, 2) == 0) {
                sign = c;
                p++;
            }
            if (p + 1 < lx->len + 1 && strncmp(s + p, end, 2) == 0 && (sign != '+' || block)) {
                lex_emit(lx, block ? T_BLOCK_END : T_VAR_END, s + p, 2);
                p += 2;
                if (sign == '-') {
                    while (p < lx->len && is_space((unsigned char)s[p])) {
                        if (s[p] == '\n') {
                            lx->line++;
                        }
                        p++;
                    }
                } else if (sign == 0 && block && p < lx->len && s[p] == '\n') {
                    p++; /* trim_blocks */
                    lx->line++;
                }
                *line_starting = p > 0 && s[p - 1] == '\n';
                lx->pos = p;
                return;
            }
        }
        if (c == '\'' || c == '"') {
            lex_string(lx);
            continue;
        }
        if (isdigit((unsigned char)c)) {
            lex_number(lx);
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t st = lx->pos;

            while (lx->pos < lx->len && (isalnum((unsigned char)s[lx->pos]) || s[lx->pos] == '_')) {
                lx->pos++;
            }
            lex_emit(lx, T_NAME, s + st, lx->pos - st);
            continue;
        }
        {
            bool two = false;

            for (size_t k = 0; k < sizeof(ops2) / sizeof(ops2[0]); k++) {
                if (lx->pos + 1 < lx->len && strncmp(s + lx->pos, ops2[k], 2) == 0) {
                    two = true;
                }
            }
            if (two) {
                lex_emit(lx, T_OP, s + lx->pos, 2);
                lx->pos += 2;
                continue;
            }
        }
        if (strchr("+-*/%~<>=.,:|()[]{}", c) == NULL || c == '\0') {
            cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected character '%c'", lx->line, c);
        }
        if (c == '(' || c == '[' || c == '{') {
            depth++;
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0) {
                cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected '%c'", lx->line, c);
            }
            depth--;
        }
        lex_emit(lx, T_OP, s + lx->pos, 1);
        lx->pos++;
    }
}

static size_t
count_nl(const char *p, size_t n)
{
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        k += p[i] == '\n';
    }
    return k;
}

/* Splits the whole source into tokens, applying the whitespace rules. */
static void
lex_all(lexer_t *lx)
{
    const char *s = lx->src;
    bool line_starting = true;

    while (lx->pos < lx->len) {
        size_t i = lx->pos, tag = lx->len, text_end;
        int kind = 0, sign = 0;

        while (i + 1 < lx->len) {
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                tag = i;
                kind = s[i + 1];
                break;
            }
            i++;
        }
        text_end = tag;
        if (tag < lx->len && tag + 2 < lx->len && (s[tag + 2] == '-' || s[tag + 2] == '+')) {
            sign = s[tag + 2];
        }
        if (tag < lx->len) {
            if (sign == '-') {
                while (text_end > lx->pos && is_space((unsigned char)s[text_end - 1])) {
                    text_end--;
                }
            } else if (sign != '+' && kind != '{') {
                /* lstrip_blocks: only blanks between the line start and the tag */
                size_t l = text_end;

                while (l > lx->pos && s[l - 1] != '\n' && is_space((unsigned char)s[l - 1])) {
                    l--;
                }
                if ((l > lx->pos && s[l - 1] == '\n') || (l == lx->pos && line_starting)) {
                    text_end = l;
                }
            }
        }
        if (text_end > lx->pos) {
            lex_emit(lx, T_TEXT, s + lx->pos, text_end - lx->pos);
        }
        lx->line += (int)count_nl(s + lx->pos, tag - lx->pos);
        if (tag >= lx->len) {
            lx->pos = lx->len;
            break;
        }
        lx->pos = tag + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = strstr(s + lx->pos, "#}");
            size_t p;

            if (e == NULL) {
                cx_fail(lx->cx, ST_EFORMAT, "line %d: missing end of comment tag", lx->line);
            }
            p = (size_t)(e - s);
            lx->line += (int)count_nl(s + lx->pos, p - lx->pos);
            if (p > lx->pos && s[p - 1] == '-') {
                p += 2;
                while (p < lx->len && is_space((unsigned char)s[p])) {
                    lx->line += s[p] == '\n';
                    p++;
                }
            } else if (p > lx->pos && s[p - 1] == '+') {
                p += 2;
            } else {
                p += 2;
                if (p < lx->len && s[p] == '\n') {
                    p++;
                    lx->line++;
                }
            }
            line_starting = s[p - 1] == '\n';
            lx->pos = p;
            continue;
        }
        lex_emit(lx, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, s + tag, 2);
        /* {% raw %} ... {% endraw %}: text up to the end tag, untouched */
        if (kind == '%') {
            size_t p = lx->pos;

            while (p < lx->len && is_space((unsigned char)s[p])) {
                p++;
            }
            if (strncmp(s + p, "raw", 3) == 0 && !isalnum((unsigned char)s[p + 3]) &&
                s[p + 3] != '_') {
                const char *e;
                size_t body, bend;

                lx->n--; /* drop the BLOCK_BEGIN */
                p += 3;
                while (p < lx->len && is_space((unsigned char)s[p])) {
                    p++;
                }
                if (p < lx->len && s[p] == '-') {
                    p++;
                }
                if (strncmp(s + p, "%}", 2) != 0) {
                    cx_fail(lx->cx, ST_EFORMAT, "line %d: bad raw tag", lx->line);
                }
                body = p + 2;
                if (s[p - 1] == '-') {
                    while (body < lx->len && is_space((unsigned char)s[body])) {
                        body++;
                    }
                }
                e = body < lx->len ? strstr(s + body, "endraw") : NULL;
                if (e == NULL) {
                    cx_fail(lx->cx, ST_EFORMAT, "line %d: missing endraw", lx->line);
                }
                /* back to the "{%" before endraw */
                bend = (size_t)(e - s);
                while (bend > body && s[bend - 1] != '{') {
                    bend--;
                }
                if (bend == body) {
                    cx_fail(lx->cx, ST_EFORMAT, "line %d: bad endraw", lx->line);
                }
                bend--;
                {
                    size_t te = bend;

                    if (s[bend + 2] == '-') {
                        while (te > body && is_space((unsigned char)s[te - 1])) {
                            te--;
                        }
                    }
                    if (te > body) {
                        lex_emit(lx, T_TEXT, s + body, te - body);
                    }
                }
                p = (size_t)(e - s) + 6;
                while (p < lx->len && is_space((unsigned char)s[p])) {
                    p++;
                }
                {
                    bool strip = p < lx->len && s[p] == '-';

                    p += strip ? 1 : 0;
                    if (strncmp(s + p, "%}", 2) != 0) {
                        cx_fail(lx->cx, ST_EFORMAT, "line %d: bad endraw tag", lx->line);
                    }
                    p += 2;
                    if (strip) {
                        while (p < lx->len && is_space((unsigned char)s[p])) {
                            p++;
                        }
                    } else if (p < lx->len && s[p] == '\n') {
                        p++;
                    }
                }
                lx->line += (int)count_nl(s + lx->pos, p - lx->pos);
                line_starting = s[p - 1] == '\n';
                lx->pos = p;
                continue;
            }
        }
        lex_tag(lx, kind == '%', &line_starting);
    }
    lex_emit(lx, T_EOF, "", 0);
}

/* ==== parser ============================================================= */

enum {
    /* statements */
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETNS,
    N_SETBLOCK,
    N_MACRO,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_BODY, /* {% generation %}: its body, rendered as is */
    /* expressions */
    E_CONST,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_BIN,
    E_AND,
    E_OR,
    E_CONCAT,
    E_CMP,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
};

enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

/* One tree node. Field use by kind:
 *   N_TEXT val; N_OUT a; N_IF a=cond kids=body kids2=else;
 *   N_FOR names=targets a=iter b=filter kids=body kids2=else;
 *   N_SET names=targets a; N_SETNS name=ns names[0]=attr a;
 *   N_SETBLOCK names=targets b=filter chain kids=body;
 *   N_MACRO name names=params kids2=defaults (NULL entries) kids=body;
 *   N_FILTERBLOCK b=filter chain kids=body; N_BODY kids;
 *   E_CONST val; E_NAME name; E_ATTR a name; E_ITEM a b; E_SLICE a kids[3];
 *   E_CALL a kids=args names=kw names kids2=kw values;
 *   E_FILTER / E_TEST a name kids/names/kids2 as E_CALL (a NULL: block input);
 *   E_NEG / E_POS / E_NOT a; E_BIN op a b; E_AND / E_OR a b; E_CONCAT kids;
 *   E_CMP a kids ops; E_COND a=cond b=then c=else; E_LIST / E_TUPLE kids;
 *   E_DICT kids=keys kids2=values. */
struct cnode {
    int kind, op, line;
    const char *name;
    val_t val;
    cnode_t *a, *b, *c;
    cnode_t **kids, **kids2;
    int nkids, nkids2;
    const char **names;
    int nnames;
    int *ops;
};

typedef struct nvec {
    cnode_t **v;
    int n, cap;
} nvec_t;

typedef struct parser {
    cx_t *cx;
    tok_t *toks;
    size_t pos;
    int depth;
} parser_t;

static void
nv_push(cx_t *cx, nvec_t *v, cnode_t *n)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        cnode_t **nv = ar_alloc(cx, (size_t)cap * sizeof(*nv));

        if (v->n) {
            memcpy(nv, v->v, (size_t)v->n * sizeof(*nv));
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
}

typedef struct svec {
    const char **v;
    int n, cap;
} svec_t;

static void
sv_push(cx_t *cx, svec_t *v, const char *s)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        const char **nv = ar_alloc(cx, (size_t)cap * sizeof(*nv));

        if (v->n) {
            memcpy(nv, v->v, (size_t)v->n * sizeof(*nv));
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = s;
}

static tok_t *
cur(parser_t *ps)
{
    return &ps->toks[ps->pos];
}

static tok_t *
peek(parser_t *ps, size_t k)
{
    size_t i = ps->pos;

    while (k > 0 && ps->toks[i].t != T_EOF) {
        i++;
        k--;
    }
    return &ps->toks[i];
}

static tok_t *
advance(parser_t *ps)
{
    tok_t *t = &ps->toks[ps->pos];

    if (t->t != T_EOF) {
        ps->pos++;
    }
    return t;
}

static bool
tok_is(const tok_t *t, int type, const char *s)
{
    return t->t == type && strlen(s) == t->n && memcmp(t->p, s, t->n) == 0;
}

static bool
is_op(parser_t *ps, const char *s)
{
    return tok_is(cur(ps), T_OP, s);
}

static bool
is_name(parser_t *ps, const char *s)
{
    return tok_is(cur(ps), T_NAME, s);
}

static _Noreturn void
ps_fail(parser_t *ps, const char *what)
{
    tok_t *t = cur(ps);
    const char *got =
        t->t == T_EOF ? "end of template" : (t->t == T_BLOCK_END ? "end of tag" : NULL);

    if (got != NULL) {
        cx_fail(ps->cx, ST_EFORMAT, "line %d: %s, got %s", t->line, what, got);
    }
    cx_fail(ps->cx, ST_EFORMAT, "line %d: %s, got '%.*s'", t->line, what,
            (int)(t->n > 40 ? 40 : t->n), t->p);
}

static void
expect_op(parser_t *ps, const char *s)
{
    char what[32];

    if (!is_op(ps, s)) {
        snprintf(what, sizeof(what), "expected '%s'", s);
        ps_fail(ps, what);
    }
    advance(ps);
}

static const char *
expect_name(parser_t *ps)
{
    tok_t *t = cur(ps);

    if (t->t != T_NAME) {
        ps_fail(ps, "expected a name");
    }
    advance(ps);
    return ar_strndup(ps->cx, t->p, t->n);
}

static void
expect_block_end(parser_t *ps)
{
    if (cur(ps)->t != T_BLOCK_END) {
        ps_fail(ps, "expected end of tag");
    }
    advance(ps);
}

static cnode_t *
node_new(parser_t *ps, int kind)
{
    cnode_t *n = ar_alloc(ps->cx, sizeof(*n));

    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = cur(ps)->line;
    return n;
}

static void
enter(parser_t *ps)
{
    if (++ps->depth > CHAT_MAX_DEPTH) {
        cx_fail(ps->cx, ST_ETOOLONG, "line %d: template nested too deeply", cur(ps)->line);
    }
}

static cnode_t *parse_expr(parser_t *ps, bool with_cond);
static cnode_t *parse_tuple(parser_t *ps, bool with_cond, bool explicit_paren);
static cnode_t *parse_unary(parser_t *ps, bool with_filter);
static cnode_t *parse_primary(parser_t *ps);
static cnode_t *parse_postfix(parser_t *ps, cnode_t *n);

/* (args, kw=args) after the '(' has been seen */
static void
parse_call_args(parser_t *ps, cnode_t *n)
{
    nvec_t args = {0}, kwv = {0};
    svec_t kwn = {0};

    expect_op(ps, "(");
    while (!is_op(ps, ")")) {
        if (args.n + kwv.n > 0) {
            expect_op(ps, ",");
            if (is_op(ps, ")")) {
                break;
            }
        }
        if (cur(ps)->t == T_NAME && tok_is(peek(ps, 1), T_OP, "=")) {
            sv_push(ps->cx, &kwn, expect_name(ps));
            advance(ps);
            nv_push(ps->cx, &kwv, parse_expr(ps, true));
        } else {
            if (kwv.n > 0) {
                ps_fail(ps, "positional argument after keyword argument");
            }
            nv_push(ps->cx, &args, parse_expr(ps, true));
        }
    }
    advance(ps);
    n->kids = args.v;
    n->nkids = args.n;
    n->kids2 = kwv.v;
    n->nkids2 = kwv.n;
    n->names = kwn.v;
    n->nnames = kwn.n;
}

/* name(.name)* then optional call args */
static cnode_t *
parse_filter_one(parser_t *ps, cnode_t *input)
{
    cnode_t *n = node_new(ps, E_FILTER);

    n->a = input;
    n->name = expect_name(ps);
    if (is_op(ps, "(")) {
        parse_call_args(ps, n);
    }
    return n;
}

static cnode_t *
parse_test(parser_t *ps, cnode_t *input)
{
    cnode_t *n = node_new(ps, E_TEST);
    bool neg = false;
    tok_t *t;

    advance(ps); /* is */
    if (is_name(ps, "not")) {
        advance(ps);
        neg = true;
    }
    n->a = input;
    n->name = expect_name(ps);
    t = cur(ps);
    if (is_op(ps, "(")) {
        parse_call_args(ps, n);
    } else if ((t->t == T_NAME || t->t == T_STRING || t->t == T_INT || t->t == T_FLOAT ||
                tok_is(t, T_OP, "[") || tok_is(t, T_OP, "{")) &&
               !is_name(ps, "else") && !is_name(ps, "or") && !is_name(ps, "and") &&
               !is_name(ps, "is")) {
        cnode_t **args = ar_alloc(ps->cx, sizeof(*args));

        args[0] = parse_postfix(ps, parse_primary(ps));
        n->kids = args;
        n->nkids = 1;
    }
    if (neg) {
        cnode_t *m = node_new(ps, E_NOT);

        m->a = n;
        return m;
    }
    return n;
}

static cnode_t *
parse_filter_expr(parser_t *ps, cnode_t *n)
{
    for (;;) {
        if (is_op(ps, "|")) {
            advance(ps);
            n = parse_filter_one(ps, n);
        } else if (is_name(ps, "is")) {
            n = parse_test(ps, n);
        } else if (is_op(ps, "(")) {
            cnode_t *c = node_new(ps, E_CALL);

            c->a = n;
            parse_call_args(ps, c);
            n = c;
        } else {
            return n;
        }
    }
}

static cnode_t *
parse_subscribed(parser_t *ps)
{
    cnode_t *parts[3] = {NULL, NULL, NULL};
    cnode_t *s;

    if (!is_op(ps, ":")) {
        cnode_t *e = parse_expr(ps, true);

        if (!is_op(ps, ":")) {
            return e;
        }
        parts[0] = e;
    }
    advance(ps); /* : */
    if (!is_op(ps, "]") && !is_op(ps, ",") && !is_op(ps, ":")) {
        parts[1] = parse_expr(ps, true);
    }
    if (is_op(ps, ":")) {
        advance(ps);
        if (!is_op(ps, "]") && !is_op(ps, ",")) {
            parts[2] = parse_expr(ps, true);
        }
    }
    s = node_new(ps, E_SLICE);
    s->kids = ar_alloc(ps->cx, 3 * sizeof(cnode_t *));
    memcpy(s->kids, parts, sizeof(parts));
    s->nkids = 3;
    return s;
}

static cnode_t *
parse_postfix(parser_t *ps, cnode_t *n)
{
    enter(ps);
    for (;;) {
        if (is_op(ps, ".")) {
            tok_t *t;

            advance(ps);
            t = cur(ps);
            if (t->t == T_NAME) {
                cnode_t *a = node_new(ps, E_ATTR);

                a->a = n;
                a->name = expect_name(ps);
                n = a;
            } else if (t->t == T_INT) {
                cnode_t *g = node_new(ps, E_ITEM), *k = node_new(ps, E_CONST);

                k->val = v_int(t->i);
                advance(ps);
                g->a = n;
                g->b = k;
                n = g;
            } else {
                ps_fail(ps, "expected name or number");
            }
        } else if (is_op(ps, "[")) {
            cnode_t *g = node_new(ps, E_ITEM), *sub;

            advance(ps);
            sub = parse_subscribed(ps);
            if (is_op(ps, ",")) {
                ps_fail(ps, "tuple subscripts are not supported");
            }
            expect_op(ps, "]");
            if (sub->kind == E_SLICE) {
                sub->a = n;
                n = sub;
            } else {
                g->a = n;
                g->b = sub;
                n = g;
            }
        } else if (is_op(ps, "(")) {
            cnode_t *c = node_new(ps, E_CALL);

            c->a = n;
            parse_call_args(ps, c);
            n = c;
        } else {
            break;
        }
    }
    ps->depth--;
    return n;
}

static cnode_t *
parse_primary(parser_t *ps)
{
    tok_t *t = cur(ps);
    cnode_t *n;

    enter(ps);
    if (t->t == T_NAME) {
        n = node_new(ps, E_CONST);
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) {
            n->val = v_bool(true);
        } else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) {
            n->val = v_bool(false);
        } else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) {
            n->val = v_none;
        } else {
            n->kind = E_NAME;
            n->name = ar_strndup(ps->cx, t->p, t->n);
        }
        advance(ps);
    } else if (t->t == T_STRING) {
        sbuf_t b = {0};

        n = node_new(ps, E_CONST);
        while (cur(ps)->t == T_STRING) { /* adjacent literals concatenate */
            sb_add(ps->cx, &b, cur(ps)->p, cur(ps)->n);
            advance(ps);
        }
        n->val = sb_val(&b);
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        n = node_new(ps, E_CONST);
        n->val = t->t == T_INT ? v_int(t->i) : v_float(t->f);
        advance(ps);
    } else if (tok_is(t, T_OP, "(")) {
        advance(ps);
        n = parse_tuple(ps, true, true);
        expect_op(ps, ")");
    } else if (tok_is(t, T_OP, "[")) {
        nvec_t items = {0};

        n = node_new(ps, E_LIST);
        advance(ps);
        while (!is_op(ps, "]")) {
            if (items.n > 0) {
                expect_op(ps, ",");
                if (is_op(ps, "]")) {
                    break;
                }
            }
            nv_push(ps->cx, &items, parse_expr(ps, true));
        }
        advance(ps);
        n->kids = items.v;
        n->nkids = items.n;
    } else if (tok_is(t, T_OP, "{")) {
        nvec_t keys = {0}, vals = {0};

        n = node_new(ps, E_DICT);
        advance(ps);
        while (!is_op(ps, "}")) {
            if (keys.n > 0) {
                expect_op(ps, ",");
                if (is_op(ps, "}")) {
                    break;
                }
            }
            nv_push(ps->cx, &keys, parse_expr(ps, true));
            expect_op(ps, ":");
            nv_push(ps->cx, &vals, parse_expr(ps, true));
        }
        advance(ps);
        n->kids = keys.v;
        n->kids2 = vals.v;
        n->nkids = keys.n;
        n->nkids2 = vals.n;
    } else {
        ps_fail(ps, "unexpected token");
    }
    ps->depth--;
    return n;
}

static cnode_t *
parse_unary(parser_t *ps, bool with_filter)
{
    cnode_t *n;

    enter(ps);
    if (is_op(ps, "-") || is_op(ps, "+")) {
        n = node_new(ps, is_op(ps, "-") ? E_NEG : E_POS);
        advance(ps);
        n->a = parse_unary(ps, false);
    } else {
        n = parse_primary(ps);
    }
    n = parse_postfix(ps, n);
    if (with_filter) {
        n = parse_filter_expr(ps, n);
    }
    ps->depth--;
    return n;
}

static cnode_t *
bin_node(parser_t *ps, int kind, int op, cnode_t *a, cnode_t *b)
{
    cnode_t *n = node_new(ps, kind);

    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static cnode_t *
parse_pow(parser_t *ps)
{
    cnode_t *n = parse_unary(ps, true);

    while (is_op(ps, "**")) {
        advance(ps);
        n = bin_node(ps, E_BIN, 'P', n, parse_unary(ps, true));
    }
    return n;
}

static cnode_t *
parse_math2(parser_t *ps)
{
    cnode_t *n = parse_pow(ps);

    for (;;) {
        int op = is_op(ps, "*")    ? '*'
                 : is_op(ps, "/")  ? '/'
                 : is_op(ps, "//") ? 'F'
                 : is_op(ps, "%")  ? '%'
                                   : 0;
        if (op == 0) {
            return n;
        }
        advance(ps);
        n = bin_node(ps, E_BIN, op, n, parse_pow(ps));
    }
}

static cnode_t *
parse_concat(parser_t *ps)
{
    cnode_t *first = parse_math2(ps), *n;
    nvec_t parts = {0};

    if (!is_op(ps, "~")) {
        return first;
    }
    n = node_new(ps, E_CONCAT);
    nv_push(ps->cx, &parts, first);
    while (is_op(ps, "~")) {
        advance(ps);
        nv_push(ps->cx, &parts, parse_math2(ps));
    }
    n->kids = parts.v;
    n->nkids = parts.n;
    return n;
}

static cnode_t *
parse_math1(parser_t *ps)
{
    cnode_t *n = parse_concat(ps);

    while (is_op(ps, "+") || is_op(ps, "-")) {
        int op = is_op(ps, "+") ? '+' : '-';

        advance(ps);
        n = bin_node(ps, E_BIN, op, n, parse_concat(ps));
    }
    return n;
}

static cnode_t *
parse_compare(parser_t *ps)
{
    cnode_t *left = parse_math1(ps), *n = NULL;
    nvec_t rights = {0};
    int ops[64], nops = 0;

    for (;;) {
        int op;

        if (is_op(ps, "==")) {
            op = CMP_EQ;
        } else if (is_op(ps, "!=")) {
            op = CMP_NE;
        } else if (is_op(ps, "<")) {
            op = CMP_LT;
        } else if (is_op(ps, "<=")) {
            op = CMP_LE;
        } else if (is_op(ps, ">")) {
            op = CMP_GT;
        } else if (is_op(ps, ">=")) {
            op = CMP_GE;
        } else if (is_name(ps, "in")) {
            op = CMP_IN;
        } else if (is_name(ps, "not") && tok_is(peek(ps, 1), T_NAME, "in")) {
            advance(ps);
            op = CMP_NOTIN;
        } else {
            break;
        }
        advance(ps);
        if (nops == 64) {
            ps_fail(ps, "comparison chain too long");
        }
        ops[nops++] = op;
        nv_push(ps->cx, &rights, parse_math1(ps));
    }
    if (nops == 0) {
        return left;
    }
    n = node_new(ps, E_CMP);
    n->a = left;
    n->kids = rights.v;
    n->nkids = rights.n;
    n->ops = ar_alloc(ps->cx, (size_t)nops * sizeof(int));
    memcpy(n->ops, ops, (size_t)nops * sizeof(int));
    return n;
}

static cnode_t *
parse_not(parser_t *ps)
{
    if (is_name(ps, "not")) {
        cnode_t *n = node_new(ps, E_NOT);

        enter(ps);
        advance(ps);
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

static cnode_t *
parse_and(parser_t *ps)
{
    cnode_t *n = parse_not(ps);

    while (is_name(ps, "and")) {
        advance(ps);
        n = bin_node(ps, E_AND, 0, n, parse_not(ps));
    }
    return n;
}

static cnode_t *
parse_or(parser_t *ps)
{
    cnode_t *n = parse_and(ps);

    while (is_name(ps, "or")) {
        advance(ps);
        n = bin_node(ps, E_OR, 0, n, parse_and(ps));
    }
    return n;
}

static cnode_t *
parse_expr(parser_t *ps, bool with_cond)
{
    cnode_t *n;

    enter(ps);
    n = parse_or(ps);
    while (with_cond && is_name(ps, "if")) {
        cnode_t *c = node_new(ps, E_COND);

        advance(ps);
        c->a = parse_or(ps);
        c->b = n;
        if (is_name(ps, "else")) {
            advance(ps);
            c->c = parse_expr(ps, true);
        }
        n = c;
    }
    ps->depth--;
    return n;
}

static bool
tuple_end(parser_t *ps)
{
    tok_t *t = cur(ps);

    return t->t == T_VAR_END || t->t == T_BLOCK_END || t->t == T_EOF || tok_is(t, T_OP, ")") ||
           tok_is(t, T_OP, "]") || tok_is(t, T_OP, "}") || tok_is(t, T_OP, "=") ||
           tok_is(t, T_NAME, "in") || tok_is(t, T_NAME, "recursive") ||
           (t->t == T_NAME && tok_is(t, T_NAME, "if"));
}

static cnode_t *
parse_tuple(parser_t *ps, bool with_cond, bool explicit_paren)
{
    nvec_t items = {0};
    bool is_tuple = false;
    cnode_t *n;

    for (;;) {
        if (items.n > 0) {
            if (!is_op(ps, ",")) {
                break;
            }
            advance(ps);
            is_tuple = true;
        }
        if (tuple_end(ps)) {
            break;
        }
        nv_push(ps->cx, &items, parse_expr(ps, with_cond));
    }
    if (!is_tuple) {
        if (items.n == 1) {
            return items.v[0];
        }
        if (!explicit_paren) {
            ps_fail(ps, "expected an expression");
        }
    }
    n = node_new(ps, E_TUPLE);
    n->kids = items.v;
    n->nkids = items.n;
    return n;
}

/* Assignment targets: name or name, name, ... */
static void
parse_targets(parser_t *ps, svec_t *out)
{
    bool paren = false;

    if (is_op(ps, "(")) {
        advance(ps);
        paren = true;
    }
    sv_push(ps->cx, out, expect_name(ps));
    while (is_op(ps, ",")) {
        advance(ps);
        if (cur(ps)->t != T_NAME) {
            break;
        }
        sv_push(ps->cx, out, expect_name(ps));
    }
    if (paren) {
        expect_op(ps, ")");
    }
}

static void parse_body(parser_t *ps, nvec_t *body, const char *const *ends);

static bool
at_end_tag(parser_t *ps, const char *const *ends)
{
    tok_t *t = cur(ps), *k = peek(ps, 1);

    if (t->t != T_BLOCK_BEGIN || k->t != T_NAME) {
        return false;
    }
    for (int i = 0; ends != NULL && ends[i] != NULL; i++) {
        if (tok_is(k, T_NAME, ends[i])) {
            return true;
        }
    }
    return false;
}

/* After parse_body stopped at one of its end tags: consume "{%" and the
 * name, return the name token. */
static tok_t *
take_end_tag(parser_t *ps)
{
    advance(ps);
    return advance(ps);
}

static cnode_t *
parse_if(parser_t *ps)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    cnode_t *n = node_new(ps, N_IF);
    nvec_t body = {0};
    tok_t *t;

    n->a = parse_tuple(ps, false, false);
    expect_block_end(ps);
    parse_body(ps, &body, ends);
    n->kids = body.v;
    n->nkids = body.n;
    t = take_end_tag(ps);
    if (tok_is(t, T_NAME, "elif")) {
        cnode_t **e = ar_alloc(ps->cx, sizeof(*e));

        enter(ps);
        e[0] = parse_if(ps);
        ps->depth--;
        n->kids2 = e;
        n->nkids2 = 1;
        return n; /* the nested if consumed endif */
    }
    if (tok_is(t, T_NAME, "else")) {
        nvec_t els = {0};

        expect_block_end(ps);
        parse_body(ps, &els, end_only);
        n->kids2 = els.v;
        n->nkids2 = els.n;
        take_end_tag(ps);
    }
    expect_block_end(ps);
    return n;
}

static cnode_t *
parse_for(parser_t *ps)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    cnode_t *n = node_new(ps, N_FOR);
    svec_t targets = {0};
    nvec_t body = {0};
    tok_t *t;

    parse_targets(ps, &targets);
    n->names = targets.v;
    n->nnames = targets.n;
    if (!is_name(ps, "in")) {
        ps_fail(ps, "expected 'in'");
    }
    advance(ps);
    n->a = parse_tuple(ps, false, false);
    if (is_name(ps, "if")) {
        advance(ps);
        n->b = parse_expr(ps, true);
    }
    if (is_name(ps, "recursive")) {
        ps_fail(ps, "recursive loops are not supported");
    }
    expect_block_end(ps);
    parse_body(ps, &body, ends);
    n->kids = body.v;
    n->nkids = body.n;
    t = take_end_tag(ps);
    if (tok_is(t, T_NAME, "else")) {
        nvec_t els = {0};

        expect_block_end(ps);
        parse_body(ps, &els, end_only);
        n->kids2 = els.v;
        n->nkids2 = els.n;
        take_end_tag(ps);
    }
    expect_block_end(ps);
    return n;
}

static cnode_t *
parse_filter_chain(parser_t *ps)
{
    cnode_t *n = parse_filter_one(ps, NULL);

    while (is_op(ps, "|")) {
        advance(ps);
        n = parse_filter_one(ps, n);
    }
    return n;
}

static cnode_t *
parse_set(parser_t *ps)
{
    static const char *const ends[] = {"endset", NULL};
    cnode_t *n;
    svec_t targets = {0};

    if (cur(ps)->t == T_NAME && tok_is(peek(ps, 1), T_OP, ".")) {
        n = node_new(ps, N_SETNS);
        n->name = expect_name(ps);
        advance(ps);
        n->names = ar_alloc(ps->cx, sizeof(char *));
        n->names[0] = expect_name(ps);
        n->nnames = 1;
        expect_op(ps, "=");
        n->a = parse_tuple(ps, true, false);
        expect_block_end(ps);
        return n;
    }
    parse_targets(ps, &targets);
    if (is_op(ps, "=")) {
        n = node_new(ps, N_SET);
        advance(ps);
        n->a = parse_tuple(ps, true, false);
        expect_block_end(ps);
    } else {
        nvec_t body = {0};

        n = node_new(ps, N_SETBLOCK);
        if (is_op(ps, "|")) {
            advance(ps);
            n->b = parse_filter_chain(ps);
        }
        expect_block_end(ps);
        parse_body(ps, &body, ends);
        take_end_tag(ps);
        expect_block_end(ps);
        n->kids = body.v;
        n->nkids = body.n;
    }
    n->names = targets.v;
    n->nnames = targets.n;
    return n;
}

static cnode_t *
parse_macro(parser_t *ps)
{
    static const char *const ends[] = {"endmacro", NULL};
    cnode_t *n = node_new(ps, N_MACRO);
    svec_t params = {0};
    nvec_t defs = {0}, body = {0};

    n->name = expect_name(ps);
    expect_op(ps, "(");
    while (!is_op(ps, ")")) {
        if (params.n > 0) {
            expect_op(ps, ",");
        }
        sv_push(ps->cx, &params, expect_name(ps));
        if (is_op(ps, "=")) {
            advance(ps);
            nv_push(ps->cx, &defs, parse_expr(ps, true));
        } else {
            nv_push(ps->cx, &defs, NULL);
        }
    }
    advance(ps);
    expect_block_end(ps);
    parse_body(ps, &body, ends);
    take_end_tag(ps);
    if (cur(ps)->t == T_NAME) {
        advance(ps); /* {% endmacro name %} */
    }
    expect_block_end(ps);
    n->names = params.v;
    n->nnames = params.n;
    n->kids2 = defs.v;
    n->nkids2 = defs.n;
    n->kids = body.v;
    n->nkids = body.n;
    return n;
}

static cnode_t *
parse_statement(parser_t *ps)
{
    tok_t *kw;
    cnode_t *n;

    advance(ps); /* {% */
    kw = cur(ps);
    if (kw->t != T_NAME) {
        ps_fail(ps, "expected a statement name");
    }
    enter(ps);
    advance(ps);
    if (tok_is(kw, T_NAME, "if")) {
        n = parse_if(ps);
    } else if (tok_is(kw, T_NAME, "for")) {
        n = parse_for(ps);
    } else if (tok_is(kw, T_NAME, "set")) {
        n = parse_set(ps);
    } else if (tok_is(kw, T_NAME, "macro")) {
        n = parse_macro(ps);
    } else if (tok_is(kw, T_NAME, "break") || tok_is(kw, T_NAME, "continue")) {
        n = node_new(ps, tok_is(kw, T_NAME, "break") ? N_BREAK : N_CONTINUE);
        expect_block_end(ps);
    } else if (tok_is(kw, T_NAME, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        nvec_t body = {0};

        n = node_new(ps, N_FILTERBLOCK);
        n->b = parse_filter_chain(ps);
        expect_block_end(ps);
        parse_body(ps, &body, ends);
        take_end_tag(ps);
        expect_block_end(ps);
        n->kids = body.v;
        n->nkids = body.n;
    } else if (tok_is(kw, T_NAME, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        nvec_t body = {0};

        n = node_new(ps, N_BODY);
        expect_block_end(ps);
        parse_body(ps, &body, ends);
        take_end_tag(ps);
        expect_block_end(ps);
        n->kids = body.v;
        n->nkids = body.n;
    } else {
        cx_fail(ps->cx, ST_EFORMAT, "line %d: unknown tag '%.*s'", kw->line, (int)kw->n, kw->p);
    }
    ps->depth--;
    return n;
}

/* Statements until one of the end tags (left unconsumed) or the end of
 * the template (an error when end tags were expected). */
static void
parse_body(parser_t *ps, nvec_t *body, const char *const *ends)
{
    for (;;) {
        tok_t *t = cur(ps);

        if (t->t == T_EOF) {
            if (ends != NULL) {
                const char *want = ends[0];

                for (int i = 0; ends[i] != NULL; i++) {
                    want = strncmp(ends[i], "end", 3) == 0 ? ends[i] : want;
                }
                cx_fail(ps->cx, ST_EFORMAT, "line %d: unexpected end of template, expected '%s'",
                        t->line, want);
            }
            return;
        }
        if (t->t == T_TEXT) {
            cnode_t *n = node_new(ps, N_TEXT);

            n->val = v_strn(t->p, t->n);
            advance(ps);
            nv_push(ps->cx, body, n);
        } else if (t->t == T_VAR_BEGIN) {
            cnode_t *n = node_new(ps, N_OUT);

            advance(ps);
            n->a = parse_tuple(ps, true, false);
            if (cur(ps)->t != T_VAR_END) {
                ps_fail(ps, "expected '}}'");
            }
            advance(ps);
            nv_push(ps->cx, body, n);
        } else if (t->t == T_BLOCK_BEGIN) {
            if (at_end_tag(ps, ends)) {
                return;
            }
            nv_push(ps->cx, body, parse_statement(ps));
        } else {
            ps_fail(ps, "unexpected token");
        }
    }
}

/* ==== render: value helpers =============================================== */

typedef struct rstate rstate_t;

typedef struct scope {
    struct scope *parent;
    const char **names;
    val_t *vals;
    int n, cap;
} scope_t;

struct rstate {
    cx_t *cx;
    scope_t *root, *cur;
    long iterations;
    int call_depth, loop_depth, eval_depth;
    time_t now;
};

static const char *
type_name(val_t v)
{
    static const char *names[] = {"undefined", "NoneType", "bool",       "int",       "float",
                                  "str",       "list",     "dict",       "Namespace", "macro",
                                  "function",  "method",   "LoopContext"};
    if (v.t == V_LIST && v.u.l->tuple) {
        return "tuple";
    }
    if (v.t == V_LIST && v.u.l->gen) {
        return "generator";
    }
    return names[v.t];
}

static _Noreturn void r_fail(rstate_t *rs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static _Noreturn void
r_fail(rstate_t *rs, const char *fmt, ...)
{
    va_list ap;
    char msg[200];

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cx_fail(rs->cx, ST_EFORMAT, "line %d: %s", rs->cx->line, msg);
}

static _Noreturn void
r_undefined(rstate_t *rs, val_t v)
{
    if (v.u.s.p != NULL) {
        r_fail(rs, "'%s' is undefined", v.u.s.p);
    }
    r_fail(rs, "value is undefined");
}

static bool
truthy(val_t v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NONE:
        return false;
    case V_BOOL:
    case V_INT:
        return v.u.i != 0;
    case V_FLOAT:
        return v.u.f != 0.0;
    case V_STR:
        return v.u.s.n > 0;
    case V_LIST:
        return v.u.l->gen || v.u.l->n > 0;
    case V_DICT:
        return v.u.d->n > 0;
    default:
        return true;
    }
}

static bool
is_num(val_t v)
{
    return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT;
}

static double
num_f(val_t v)
{
    return v.t == V_FLOAT ? v.u.f : (double)v.u.i;
}

/* Python's repr() of a float: the shortest string that reads back. */
static void
fmt_float(cx_t *cx, sbuf_t *b, double f)
{
    char buf[64], digits[32];
    int prec, exp10, nd = 0;
    char *e;

    if (isnan(f)) {
        sb_puts(cx, b, "nan");
        return;
    }
    if (isinf(f)) {
        sb_puts(cx, b, f > 0 ? "inf" : "-inf");
        return;
    }
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) {
            break;
        }
    }
    /* buf: [-]d.ddde[+-]xx */
    e = strchr(buf, 'e');
    exp10 = atoi(e + 1);
    for (char *p = buf; p < e; p++) {
        if (isdigit((unsigned char)*p)) {
            digits[nd++] = *p;
        }
    }
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--;
    }
    digits[nd] = '\0';
    if (f < 0 || (f == 0 && signbit(f))) {
        sb_putc(cx, b, '-');
    }
    if (exp10 >= 16 || exp10 < -4) {
        sb_putc(cx, b, digits[0]);
        if (nd > 1) {
            sb_putc(cx, b, '.');
            sb_add(cx, b, digits + 1, (size_t)nd - 1);
        }
        snprintf(buf, sizeof(buf), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        sb_puts(cx, b, buf);
    } else if (exp10 < 0) {
        sb_puts(cx, b, "0.");
        for (int k = 0; k < -exp10 - 1; k++) {
            sb_putc(cx, b, '0');
        }
        sb_add(cx, b, digits, (size_t)nd);
    } else {
        for (int k = 0; k <= exp10; k++) {
            sb_putc(cx, b, k < nd ? digits[k] : '0');
        }
        sb_putc(cx, b, '.');
        if (nd > exp10 + 1) {
            sb_add(cx, b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        } else {
            sb_putc(cx, b, '0');
        }
    }
}

static void put_str(rstate_t *rs, sbuf_t *b, val_t v);

static void
put_repr_str(cx_t *cx, sbuf_t *b, const char *p, size_t n)
{
    char q = '\'';

    if (memchr(p, '\'', n) != NULL && memchr(p, '"', n) == NULL) {
        q = '"';
    }
    sb_putc(cx, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[8];

        if (c == (unsigned char)q || c == '\\') {
            sb_putc(cx, b, '\\');
            sb_putc(cx, b, (char)c);
        } else if (c == '\n') {
            sb_puts(cx, b, "\\n");
        } else if (c == '\r') {
            sb_puts(cx, b, "\\r");
        } else if (c == '\t') {
            sb_puts(cx, b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            sb_puts(cx, b, esc);
        } else {
            sb_putc(cx, b, (char)c);
        }
    }
    sb_putc(cx, b, q);
}

/* Python repr(), as str() of a container shows its items. */
static void
put_repr(rstate_t *rs, sbuf_t *b, val_t v)
{
    cx_t *cx = rs->cx;

    charge(0);
    if (++rs->call_depth > CHAT_MAX_DEPTH) {
        r_fail(rs, "value nested too deeply");
    }
    switch (v.t) {
    case V_UNDEF:
        sb_puts(cx, b, "Undefined");
        break;
    case V_STR:
        put_repr_str(cx, b, v.u.s.p, v.u.s.n);
        break;
    case V_LIST:
        if (v.u.l->gen) {
            sb_puts(cx, b, "<generator object>");
            break;
        }
        if (v.u.l->view) {
            sb_puts(cx, b,
                    v.u.l->view == 'k'   ? "dict_keys("
                    : v.u.l->view == 'v' ? "dict_values("
                                         : "dict_items(");
        }
        sb_putc(cx, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) {
                sb_puts(cx, b, ", ");
            }
            put_repr(rs, b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) {
            sb_putc(cx, b, ',');
        }
        sb_putc(cx, b, v.u.l->tuple ? ')' : ']');
        if (v.u.l->view) {
            sb_putc(cx, b, ')');
        }
        break;
    case V_DICT:
    case V_NS:
        if (v.t == V_NS) {
            sb_puts(cx, b, "<Namespace ");
        }
        sb_putc(cx, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) {
                sb_puts(cx, b, ", ");
            }
            put_repr(rs, b, v.u.d->k[i]);
            sb_puts(cx, b, ": ");
            put_repr(rs, b, v.u.d->v[i]);
        }
        sb_putc(cx, b, '}');
        if (v.t == V_NS) {
            sb_putc(cx, b, '>');
        }
        break;
    default:
        put_str(rs, b, v);
    }
    rs->call_depth--;
}

/* Python str() */
static void
put_str(rstate_t *rs, sbuf_t *b, val_t v)
{
    cx_t *cx = rs->cx;
    char buf[32];

    switch (v.t) {
    case V_UNDEF:
        break;
    case V_NONE:
        sb_puts(cx, b, "None");
        break;
    case V_BOOL:
        sb_puts(cx, b, v.u.i ? "True" : "False");
        break;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v.u.i);
        sb_puts(cx, b, buf);
        break;
    case V_FLOAT:
        fmt_float(cx, b, v.u.f);
        break;
    case V_STR:
        sb_add(cx, b, v.u.s.p, v.u.s.n);
        break;
    case V_LIST:
    case V_DICT:
    case V_NS:
        put_repr(rs, b, v);
        break;
    case V_MACRO:
        sb_puts(cx, b, "<Macro>");
        break;
    case V_LOOP:
        sb_puts(cx, b, "<LoopContext>");
        break;
    default:
        sb_puts(cx, b, "<function>");
        break;
    }
}

static val_t
to_str(rstate_t *rs, val_t v)
{
    sbuf_t b = {0};

    if (v.t == V_STR) {
        return v;
    }
    put_str(rs, &b, v);
    return sb_val(&b);
}

static bool
val_eq(val_t a, val_t b)
{
    charge(0);
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) {
            return num_f(a) == num_f(b);
        }
        return a.u.i == b.u.i;
    }
    if (a.t != b.t) {
        return false;
    }
    switch (a.t) {
    case V_UNDEF:
    case V_NONE:
        return true;
    case V_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) {
            return false;
        }
        for (size_t i = 0; i < a.u.l->n; i++) {
            if (!val_eq(a.u.l->v[i], b.u.l->v[i])) {
                return false;
            }
        }
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) {
            return false;
        }
        for (size_t i = 0; i < a.u.d->n; i++) {
            val_t *o = dict_find(b.u.d, a.u.d->k[i]);
            if (o == NULL || !val_eq(a.u.d->v[i], *o)) {
                return false;
            }
        }
        return true;
    case V_NS:
        return a.u.d == b.u.d;
    case V_MACRO:
        return a.u.macro == b.u.macro;
    case V_FUNC:
        return a.u.i == b.u.i;
    default:
        return false;
    }
}

/* <0, 0, >0 for orderable pairs; fails on others (Python TypeError). */
static int
val_cmp(rstate_t *rs, val_t a, val_t b)
{
    charge(0);
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        return a.u.i < b.u.i ? -1 : (a.u.i > b.u.i ? 1 : 0);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);

        if (c != 0) {
            return c;
        }
        return a.u.s.n < b.u.s.n ? -1 : (a.u.s.n > b.u.s.n ? 1 : 0);
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!val_eq(a.u.l->v[i], b.u.l->v[i])) {
                return val_cmp(rs, a.u.l->v[i], b.u.l->v[i]);
            }
        }
        return a.u.l->n < b.u.l->n ? -1 : (a.u.l->n > b.u.l->n ? 1 : 0);
    }
    r_fail(rs, "'<' not supported between '%s' and '%s'", type_name(a), type_name(b));
}

/* ---- UTF-8 code point helpers (Python indexes strings by code point) ---- */

static size_t
u8_len(const char *p, size_t n)
{
    charge(n / 8);
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        k += ((unsigned char)p[i] & 0xc0) != 0x80;
    }
    return k;
}

/* byte offset of code point idx (idx <= length) */
static size_t
u8_off(const char *p, size_t n, size_t idx)
{
    charge(idx / 8);
    size_t i = 0;

    while (i < n && idx > 0) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xc0) == 0x80) {
            i++;
        }
        idx--;
    }
    return i;
}

/* Python sequence as a list of items (strings: one item per code point). */
static vlist_t *
as_items(rstate_t *rs, val_t v, bool undef_ok)
{
    cx_t *cx = rs->cx;

    charge(v.t == V_LIST ? v.u.l->n : (v.t == V_DICT ? v.u.d->n : 0));
    switch (v.t) {
    case V_LIST:
        if (v.u.l->err != NULL) {
            r_fail(rs, "%s", v.u.l->err);
        }
        return v.u.l;
    case V_DICT: {
        vlist_t *l = list_new(cx, v.u.d->n);

        for (size_t i = 0; i < v.u.d->n; i++) {
            list_push(cx, l, v.u.d->k[i]);
        }
        return l;
    }
    case V_STR: {
        vlist_t *l = list_new(cx, v.u.s.n);
        size_t i = 0;

        while (i < v.u.s.n) {
            size_t j = i + 1;

            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xc0) == 0x80) {
                j++;
            }
            list_push(cx, l, v_strn(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    case V_UNDEF:
        if (undef_ok) {
            return list_new(cx, 0);
        }
        r_undefined(rs, v);
    default:
        r_fail(rs, "'%s' object is not iterable", type_name(v));
    }
}

/* Input of a filter that jinja2 runs as a generator: a value that cannot be
 * iterated only fails when the generator is consumed, so the error is
 * deferred into a poisoned generator (*poison set, NULL returned). */
static vlist_t *
gen_input(rstate_t *rs, val_t v, val_t *poison)
{
    vlist_t *l;
    char *msg;

    if (v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF) {
        if (v.t == V_LIST && v.u.l->err != NULL) {
            *poison = v;
            return NULL;
        }
        return as_items(rs, v, true);
    }
    l = list_new(rs->cx, 0);
    msg = ar_alloc(rs->cx, 64);
    snprintf(msg, 64, "'%s' object is not iterable", type_name(v));
    l->gen = true;
    l->err = msg;
    *poison = v_list(l);
    return NULL;
}

static int64_t
py_len(rstate_t *rs, val_t v)
{
    switch (v.t) {
    case V_STR:
        return (int64_t)u8_len(v.u.s.p, v.u.s.n);
    case V_LIST:
        if (v.u.l->gen) {
            r_fail(rs, "object of type 'generator' has no len()");
        }
        return (int64_t)v.u.l->n;
    case V_DICT:
        return (int64_t)v.u.d->n;
    case V_UNDEF:
        return 0;
    default:
        r_fail(rs, "object of type '%s' has no len()", type_name(v));
    }
}

/* Python slice bounds for length n */
static void
slice_bounds(rstate_t *rs, int64_t n, val_t *sv, int64_t *start, int64_t *stop, int64_t *step)
{
    int64_t st = 1, lo, hi;

    if (sv[2].t != V_NONE) {
        if (sv[2].t != V_INT && sv[2].t != V_BOOL) {
            r_fail(rs, "slice indices must be integers");
        }
        st = sv[2].u.i;
        if (st == 0) {
            r_fail(rs, "slice step cannot be zero");
        }
    }
    for (int k = 0; k < 2; k++) {
        if (sv[k].t != V_NONE && sv[k].t != V_INT && sv[k].t != V_BOOL) {
            r_fail(rs, "slice indices must be integers");
        }
    }
    if (st > 0) {
        lo = sv[0].t == V_NONE ? 0 : sv[0].u.i;
        hi = sv[1].t == V_NONE ? n : sv[1].u.i;
        lo = lo < 0 ? (lo + n < 0 ? 0 : lo + n) : (lo > n ? n : lo);
        hi = hi < 0 ? (hi + n < 0 ? 0 : hi + n) : (hi > n ? n : hi);
    } else {
        lo = sv[0].t == V_NONE ? n - 1 : sv[0].u.i;
        hi = sv[1].t == V_NONE ? -1 : sv[1].u.i;
        if (sv[0].t != V_NONE) {
            lo = lo < 0 ? (lo + n < 0 ? -1 : lo + n) : (lo >= n ? n - 1 : lo);
        }
        if (sv[1].t != V_NONE) {
            hi = hi < 0 ? (hi + n < 0 ? -1 : hi + n) : (hi >= n ? n - 1 : hi);
        }
    }
    *start = lo;
    *stop = hi;
    *step = st;
}

static val_t
do_slice(rstate_t *rs, val_t obj, val_t *sv)
{
    cx_t *cx = rs->cx;
    int64_t start, stop, step;

    if (obj.t == V_UNDEF) {
        r_undefined(rs, obj);
    }
    if (obj.t == V_LIST && (obj.u.l->gen || obj.u.l->view)) {
        return v_undef_named(NULL); /* not subscriptable: jinja2 gives undefined */
    }
    if (obj.t == V_STR) {
        vlist_t *cps = as_items(rs, obj, false);
        sbuf_t b = {0};

        slice_bounds(rs, (int64_t)cps->n, sv, &start, &stop, &step);
        if (step == 1) {
            size_t o1, o2;

            if (stop <= start) {
                return v_strn("", 0);
            }
            o1 = u8_off(obj.u.s.p, obj.u.s.n, (size_t)start);
            o2 = u8_off(obj.u.s.p, obj.u.s.n, (size_t)stop);
            return v_strn(obj.u.s.p + o1, o2 - o1);
        }
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            sb_add(cx, &b, cps->v[i].u.s.p, cps->v[i].u.s.n);
        }
        return sb_val(&b);
    }
    if (obj.t == V_LIST) {
        vlist_t *l = list_new(cx, 0);

        slice_bounds(rs, (int64_t)obj.u.l->n, sv, &start, &stop, &step);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            list_push(cx, l, obj.u.l->v[i]);
        }
        l->tuple = obj.u.l->tuple;
        return v_list(l);
    }
    r_fail(rs, "'%s' object is not subscriptable", type_name(obj));
}

/* ==== render: scopes, attributes, items ==================================== */

static scope_t *
scope_new(rstate_t *rs, scope_t *parent)
{
    scope_t *s = ar_alloc(rs->cx, sizeof(*s));

    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

static void
scope_set(rstate_t *rs, scope_t *s, const char *name, val_t v)
{
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = ar_alloc(rs->cx, (size_t)cap * sizeof(*nn));
        val_t *nv = ar_alloc(rs->cx, (size_t)cap * sizeof(*nv));

        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof(*nn));
            memcpy(nv, s->vals, (size_t)s->n * sizeof(*nv));
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
}

static val_t
lookup(rstate_t *rs, const char *name)
{
    for (scope_t *s = rs->cur; s != NULL; s = s->parent) {
        for (int i = s->n - 1; i >= 0; i--) {
            if (strcmp(s->names[i], name) == 0) {
                return s->vals[i];
            }
        }
    }
    return v_undef_named(name);
}

static bool
name_in(const char *name, const char *const *list)
{
    for (int i = 0; list[i] != NULL; i++) {
        if (strcmp(name, list[i]) == 0) {
            return true;
        }
    }
    return false;
}

static const char *const str_methods[] = {
    "strip",        "lstrip",       "rstrip",     "split",    "rsplit",  "splitlines",
    "startswith",   "endswith",     "upper",      "lower",    "title",   "capitalize",
    "replace",      "find",         "rfind",      "index",    "count",   "join",
    "format",       "isdigit",      "isalpha",    "isalnum",  "isspace", "isupper",
    "islower",      "partition",    "rpartition", "swapcase", "zfill",   "casefold",
    "removeprefix", "removesuffix", NULL,
};
static const char *const dict_methods[] = {
    "get",        "items", "keys",  "values",  "pop", "update",
    "setdefault", "copy",  "clear", "popitem", NULL,
};
static const char *const list_methods[] = {
    "index",  "count",   "append", "pop",  "insert", "extend",
    "remove", "reverse", "sort",   "copy", "clear",  NULL,
};

static val_t
v_method(rstate_t *rs, val_t self, const char *name)
{
    vmethod_t *m = ar_alloc(rs->cx, sizeof(*m));
    val_t v = {.t = V_METHOD};

    m->self = self;
    m->name = name;
    v.u.m = m;
    return v;
}

static val_t
loop_attr(rstate_t *rs, vloop_t *lp, const char *name)
{
    int64_t n = (int64_t)lp->items->n, i = (int64_t)lp->idx;

    if (strcmp(name, "index") == 0) {
        return v_int(i + 1);
    }
    if (strcmp(name, "index0") == 0) {
        return v_int(i);
    }
    if (strcmp(name, "revindex") == 0) {
        return v_int(n - i);
    }
    if (strcmp(name, "revindex0") == 0) {
        return v_int(n - i - 1);
    }
    if (strcmp(name, "first") == 0) {
        return v_bool(i == 0);
    }
    if (strcmp(name, "last") == 0) {
        return v_bool(i == n - 1);
    }
    if (strcmp(name, "length") == 0) {
        return v_int(n);
    }
    if (strcmp(name, "depth") == 0) {
        return v_int(lp->depth);
    }
    if (strcmp(name, "depth0") == 0) {
        return v_int(lp->depth - 1);
    }
    if (strcmp(name, "previtem") == 0) {
        return i > 0 ? lp->items->v[i - 1] : v_undef_named("previtem");
    }
    if (strcmp(name, "nextitem") == 0) {
        return i + 1 < n ? lp->items->v[i + 1] : v_undef_named("nextitem");
    }
    if (strcmp(name, "cycle") == 0) {
        val_t self = {.t = V_LOOP, .u.loop = lp};
        return v_method(rs, self, "cycle");
    }
    (void)rs;
    return v_undef_named(name);
}

static val_t
get_attr(rstate_t *rs, val_t obj, const char *name)
{
    switch (obj.t) {
    case V_UNDEF:
        r_undefined(rs, obj);
    case V_DICT: {
        val_t *p;

        if (name_in(name, dict_methods)) {
            return v_method(rs, obj, name);
        }
        p = dict_find_str(obj.u.d, name);
        return p ? *p : v_undef_named(name);
    }
    case V_NS: {
        val_t *p = dict_find_str(obj.u.d, name);
        return p ? *p : v_undef_named(name);
    }
    case V_STR:
        return name_in(name, str_methods) ? v_method(rs, obj, name) : v_undef_named(name);
    case V_LIST:
        if (obj.u.l->gen || obj.u.l->view) {
            return v_undef_named(name); /* generators and views: no list methods */
        }
        return name_in(name, list_methods) ? v_method(rs, obj, name) : v_undef_named(name);
    case V_LOOP:
        return loop_attr(rs, obj.u.loop, name);
    default:
        return v_undef_named(name);
    }
}

static val_t
get_item(rstate_t *rs, val_t obj, val_t key)
{
    switch (obj.t) {
    case V_UNDEF:
        r_undefined(rs, obj);
    case V_DICT:
    case V_NS: {
        val_t *p = dict_find(obj.u.d, key);

        if (p != NULL) {
            return *p;
        }
        break;
    }
    case V_LIST:
    case V_STR:
        if (obj.t == V_LIST && (obj.u.l->gen || obj.u.l->view)) {
            return v_undef_named(NULL); /* generators are not subscriptable */
        }
        if (key.t == V_INT || key.t == V_BOOL) {
            int64_t n = py_len(rs, obj), i = key.u.i;

            if (i < 0) {
                i += n;
            }
            if (i < 0 || i >= n) {
                return v_undef_named(NULL);
            }
            if (obj.t == V_LIST) {
                return obj.u.l->v[i];
            }
            {
                size_t o1 = u8_off(obj.u.s.p, obj.u.s.n, (size_t)i);
                size_t o2 = u8_off(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
                return v_strn(obj.u.s.p + o1, o2 - o1);
            }
        }
        break;
    default:
        break;
    }
    if (key.t == V_STR && obj.t != V_NS) {
        return get_attr(rs, obj, ar_strndup(rs->cx, key.u.s.p, key.u.s.n));
    }
    return v_undef_named(NULL);
}

/* ==== render: tojson (Python json.dumps, as HF's tojson filter) =========== */

typedef struct jopts {
    int indent; /* < 0: none */
    const char *indent_str;
    const char *item_sep, *key_sep;
    bool sort_keys, ensure_ascii;
} jopts_t;

static void
json_str(cx_t *cx, sbuf_t *b, const char *p, size_t n, bool ascii)
{
    sb_putc(cx, b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[16];

        switch (c) {
        case '"':
            sb_puts(cx, b, "\\\"");
            continue;
        case '\\':
            sb_puts(cx, b, "\\\\");
            continue;
        case '\n':
            sb_puts(cx, b, "\\n");
            continue;
        case '\r':
            sb_puts(cx, b, "\\r");
            continue;
        case '\t':
            sb_puts(cx, b, "\\t");
            continue;
        case '\b':
            sb_puts(cx, b, "\\b");
            continue;
        case '\f':
            sb_puts(cx, b, "\\f");
            continue;
        default:
            break;
        }
        if (c < 0x20 || (ascii && c == 0x7f)) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            sb_puts(cx, b, esc);
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            size_t extra = c >= 0xf0 ? 3 : (c >= 0xe0 ? 2 : 1);

            cp = c & (0x3f >> extra);
            for (size_t k = 1; k <= extra && i + k < n; k++) {
                cp = (cp << 6) | ((unsigned char)p[i + k] & 0x3f);
            }
            i += extra;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                         0xdc00 + (cp & 0x3ff));
            } else {
                snprintf(esc, sizeof(esc), "\\u%04x", cp);
            }
            sb_puts(cx, b, esc);
        } else {
            sb_putc(cx, b, (char)c);
        }
    }
    sb_putc(cx, b, '"');
}

static void
json_newline(cx_t *cx, sbuf_t *b, const jopts_t *o, int level)
{
    sb_putc(cx, b, '\n');
    for (int i = 0; i < level; i++) {
        sb_puts(cx, b, o->indent_str);
    }
}

static void
json_key(rstate_t *rs, sbuf_t *b, val_t k, const jopts_t *o)
{
    cx_t *cx = rs->cx;

    switch (k.t) {
    case V_STR:
        json_str(cx, b, k.u.s.p, k.u.s.n, o->ensure_ascii);
        break;
    case V_BOOL:
        sb_puts(cx, b, k.u.i ? "\"true\"" : "\"false\"");
        break;
    case V_NONE:
        sb_puts(cx, b, "\"null\"");
        break;
    case V_INT:
    case V_FLOAT: {
        val_t s = to_str(rs, k);
        json_str(cx, b, s.u.s.p, s.u.s.n, false);
        break;
    }
    default:
        r_fail(rs, "keys must be str, int, float, bool or None, not %s", type_name(k));
    }
}

static int
key_order(rstate_t *rs, val_t a, val_t b)
{
    return val_cmp(rs, a, b);
}

static void
json_dump(rstate_t *rs, sbuf_t *b, val_t v, const jopts_t *o, int level)
{
    charge(0);
    cx_t *cx = rs->cx;

    if (level > CHAT_MAX_DEPTH) {
        r_fail(rs, "value nested too deeply for tojson");
    }
    switch (v.t) {
    case V_NONE:
        sb_puts(cx, b, "null");
        break;
    case V_BOOL:
        sb_puts(cx, b, v.u.i ? "true" : "false");
        break;
    case V_INT:
        put_str(rs, b, v);
        break;
    case V_FLOAT:
        if (isnan(v.u.f)) {
            sb_puts(cx, b, "NaN");
        } else if (isinf(v.u.f)) {
            sb_puts(cx, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        } else {
            fmt_float(cx, b, v.u.f);
        }
        break;
    case V_STR:
        json_str(cx, b, v.u.s.p, v.u.s.n, o->ensure_ascii);
        break;
    case V_LIST:
        if (v.u.l->gen || v.u.l->view) {
            r_fail(rs, "Object of type %s is not JSON serializable",
                   v.u.l->gen ? "generator" : "dict view");
        }
        if (v.u.l->n == 0) {
            sb_puts(cx, b, "[]");
            break;
        }
        sb_putc(cx, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) {
                sb_puts(cx, b, o->item_sep);
            }
            if (o->indent >= 0) {
                json_newline(cx, b, o, level + 1);
            }
            json_dump(rs, b, v.u.l->v[i], o, level + 1);
        }
        if (o->indent >= 0) {
            json_newline(cx, b, o, level);
        }
        sb_putc(cx, b, ']');
        break;
    case V_DICT: {
        size_t n = v.u.d->n;
        size_t *ord;

        if (n == 0) {
            sb_puts(cx, b, "{}");
            break;
        }
        ord = ar_alloc(cx, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) {
            ord[i] = i;
        }
        if (o->sort_keys) { /* insertion sort: stable, small dicts */
            for (size_t i = 1; i < n; i++) {
                size_t x = ord[i], j = i;

                while (j > 0 && key_order(rs, v.u.d->k[ord[j - 1]], v.u.d->k[x]) > 0) {
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
        }
        sb_putc(cx, b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) {
                sb_puts(cx, b, o->item_sep);
            }
            if (o->indent >= 0) {
                json_newline(cx, b, o, level + 1);
            }
            json_key(rs, b, v.u.d->k[ord[i]], o);
            sb_puts(cx, b, o->key_sep);
            json_dump(rs, b, v.u.d->v[ord[i]], o, level + 1);
        }
        if (o->indent >= 0) {
            json_newline(cx, b, o, level);
        }
        sb_putc(cx, b, '}');
        break;
    }
    default:
        r_fail(rs, "Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ==== render: calls, filters, tests, methods ================================ */

typedef struct cargs {
    val_t *pos;
    int npos;
    const char **kwn;
    val_t *kwv;
    int nkw;
} cargs_t;

/* Argument i (positional) or named `name`; `def` when absent. */
static val_t
arg(const cargs_t *a, int i, const char *name, val_t def)
{
    if (i >= 0 && i < a->npos) {
        return a->pos[i];
    }
    for (int k = 0; name != NULL && k < a->nkw; k++) {
        if (strcmp(a->kwn[k], name) == 0) {
            return a->kwv[k];
        }
    }
    return def;
}

static val_t eval(rstate_t *rs, const cnode_t *n);
static int render_body(rstate_t *rs, cnode_t **body, int n, sbuf_t *out);

static val_t
need_str(rstate_t *rs, val_t v, const char *what)
{
    if (v.t != V_STR) {
        r_fail(rs, "%s must be a string, not %s", what, type_name(v));
    }
    return v;
}

static bool
u8_space_at(const char *p, size_t n, size_t i, size_t *len)
{
    unsigned char c = (unsigned char)p[i];

    if (is_space(c)) {
        *len = 1;
        return true;
    }
    if (c == 0xc2 && i + 1 < n &&
        ((unsigned char)p[i + 1] == 0x85 || (unsigned char)p[i + 1] == 0xa0)) {
        *len = 2;
        return true;
    }
    return false;
}

/* strip / lstrip / rstrip; chars NULL: whitespace */
static val_t
str_strip(val_t s, const val_t *chars, bool left, bool right)
{
    const char *p = s.u.s.p;
    size_t lo = 0, hi = s.u.s.n, k;

    if (chars == NULL) {
        while (left && lo < hi && u8_space_at(p, hi, lo, &k)) {
            lo += k;
        }
        while (right && hi > lo) {
            if (is_space((unsigned char)p[hi - 1])) {
                hi--;
            } else if (hi - lo >= 2 && (unsigned char)p[hi - 2] == 0xc2 &&
                       ((unsigned char)p[hi - 1] == 0x85 || (unsigned char)p[hi - 1] == 0xa0)) {
                hi -= 2;
            } else {
                break;
            }
        }
        return v_strn(p + lo, hi - lo);
    }
    /* chars: a set of code points (ASCII bytes or whole UTF-8 sequences) */
    for (;;) {
        bool moved = false;

        for (size_t i = 0; i < chars->u.s.n;) {
            size_t cl = 1;

            while (i + cl < chars->u.s.n && ((unsigned char)chars->u.s.p[i + cl] & 0xc0) == 0x80) {
                cl++;
            }
            if (left && hi - lo >= cl && memcmp(p + lo, chars->u.s.p + i, cl) == 0) {
                lo += cl;
                moved = true;
            }
            if (right && hi - lo >= cl && memcmp(p + hi - cl, chars->u.s.p + i, cl) == 0) {
                hi -= cl;
                moved = true;
            }
            i += cl;
        }
        if (!moved) {
            break;
        }
    }
    return v_strn(p + lo, hi - lo);
}

static const char *
memfind(const char *h, size_t hn, const char *nd, size_t nn)
{
    /* Charges what was scanned, up to the match: replace / count / split
     * call this once per match, and charging the whole rest each time made
     * a linear loop look quadratic. */
    if (nn == 0) {
        charge(0);
        return h;
    }
    for (size_t i = 0; i + nn <= hn; i++) {
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) {
            charge(i + nn);
            return h + i;
        }
    }
    charge(hn);
    return NULL;
}

static const char *
memrfind(const char *h, size_t hn, const char *nd, size_t nn)
{
    charge(hn);
    if (nn > hn) {
        return NULL;
    }
    for (size_t i = hn - nn + 1; i-- > 0;) {
        if (memcmp(h + i, nd, nn) == 0) {
            return h + i;
        }
    }
    return NULL;
}

static val_t
str_replace(rstate_t *rs, val_t s, val_t old, val_t new, int64_t count)
{
    sbuf_t b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;

    if (old.u.s.n == 0) {
        r_fail(rs, "replace with an empty pattern is not supported");
    }
    while (p < end && count != 0) {
        const char *f = memfind(p, (size_t)(end - p), old.u.s.p, old.u.s.n);

        if (f == NULL) {
            break;
        }
        sb_add(rs->cx, &b, p, (size_t)(f - p));
        sb_add(rs->cx, &b, new.u.s.p, new.u.s.n);
        p = f + old.u.s.n;
        if (count > 0) {
            count--;
        }
    }
    sb_add(rs->cx, &b, p, (size_t)(end - p));
    return sb_val(&b);
}

static val_t
str_split(rstate_t *rs, val_t s, val_t sep, int64_t maxsplit, bool from_right)
{
    cx_t *cx = rs->cx;
    vlist_t *l = list_new(cx, 4);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;

    if (sep.t == V_NONE || sep.t == V_UNDEF) {
        /* runs of whitespace, no empty items */
        size_t i = 0, k;

        if (!from_right) {
            while (i < n) {
                size_t st;

                while (i < n && u8_space_at(p, n, i, &k)) {
                    i += k;
                }
                if (i >= n) {
                    break;
                }
                if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
                    size_t e = n;

                    while (e > i && is_space((unsigned char)p[e - 1])) {
                        e--;
                    }
                    list_push(cx, l, v_strn(p + i, e - i));
                    break;
                }
                st = i;
                while (i < n && !u8_space_at(p, n, i, &k)) {
                    i++;
                }
                list_push(cx, l, v_strn(p + st, i - st));
            }
            return v_list(l);
        }
        /* rsplit(): split all, then merge the leftmost items back */
        {
            val_t all = str_split(rs, s, v_none, -1, false);

            if (maxsplit < 0 || (int64_t)all.u.l->n <= maxsplit + 1) {
                return all;
            }
            {
                size_t keep = all.u.l->n - (size_t)maxsplit;
                const char *st = all.u.l->v[0].u.s.p;
                const char *en = all.u.l->v[keep - 1].u.s.p + all.u.l->v[keep - 1].u.s.n;

                list_push(cx, l, v_strn(st, (size_t)(en - st)));
                for (size_t j = keep; j < all.u.l->n; j++) {
                    list_push(cx, l, all.u.l->v[j]);
                }
                return v_list(l);
            }
        }
    }
    need_str(rs, sep, "separator");
    if (sep.u.s.n == 0) {
        r_fail(rs, "empty separator");
    }
    if (!from_right) {
        size_t i = 0;

        for (;;) {
            const char *f = (maxsplit >= 0 && (int64_t)l->n >= maxsplit)
                                ? NULL
                                : memfind(p + i, n - i, sep.u.s.p, sep.u.s.n);
            if (f == NULL) {
                list_push(cx, l, v_strn(p + i, n - i));
                break;
            }
            list_push(cx, l, v_strn(p + i, (size_t)(f - (p + i))));
            i = (size_t)(f - p) + sep.u.s.n;
        }
        return v_list(l);
    }
    {
        size_t hi = n;
        vlist_t *rev = list_new(cx, 4);

        for (;;) {
            const char *f = (maxsplit >= 0 && (int64_t)rev->n >= maxsplit)
                                ? NULL
                                : memrfind(p, hi, sep.u.s.p, sep.u.s.n);
            if (f == NULL) {
                list_push(cx, rev, v_strn(p, hi));
                break;
            }
            list_push(cx, rev, v_strn(f + sep.u.s.n, hi - (size_t)(f - p) - sep.u.s.n));
            hi = (size_t)(f - p);
        }
        for (size_t j = rev->n; j-- > 0;) {
            list_push(cx, l, rev->v[j]);
        }
        return v_list(l);
    }
}

static val_t
str_case(rstate_t *rs, val_t s, int mode)
{
    char *o = ar_alloc(rs->cx, s.u.s.n + 1);
    bool start = true;

    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];

        switch (mode) {
        case 'U':
            c = (char)toupper((unsigned char)c);
            break;
        case 'L':
            c = (char)tolower((unsigned char)c);
            break;
        case 'C':
            c = (char)(i == 0 ? toupper((unsigned char)c) : tolower((unsigned char)c));
            break;
        case 'S':
            c = (char)(isupper((unsigned char)c) ? tolower((unsigned char)c)
                                                 : toupper((unsigned char)c));
            break;
        case 'T':
            if (isalpha((unsigned char)c)) {
                c = (char)(start ? toupper((unsigned char)c) : tolower((unsigned char)c));
                start = false;
            } else {
                start = !((unsigned char)c & 0x80) && !isalnum((unsigned char)c);
            }
            break;
        default:
            break;
        }
        o[i] = c;
    }
    o[s.u.s.n] = '\0';
    return v_strn(o, s.u.s.n);
}

static bool
str_prefix_test(rstate_t *rs, val_t s, val_t pre, bool suffix)
{
    if (pre.t == V_LIST) {
        for (size_t i = 0; i < pre.u.l->n; i++) {
            if (str_prefix_test(rs, s, pre.u.l->v[i], suffix)) {
                return true;
            }
        }
        return false;
    }
    need_str(rs, pre, suffix ? "endswith argument" : "startswith argument");
    if (pre.u.s.n > s.u.s.n) {
        return false;
    }
    return memcmp(suffix ? s.u.s.p + s.u.s.n - pre.u.s.n : s.u.s.p, pre.u.s.p, pre.u.s.n) == 0;
}

static val_t
str_join(rstate_t *rs, val_t sep, vlist_t *items, bool stringify)
{
    sbuf_t b = {0};

    for (size_t i = 0; i < items->n; i++) {
        val_t it = items->v[i];

        if (i) {
            sb_add(rs->cx, &b, sep.u.s.p, sep.u.s.n);
        }
        if (!stringify && it.t != V_STR) {
            r_fail(rs, "sequence item %zu: expected str instance, %s found", i, type_name(it));
        }
        put_str(rs, &b, it);
    }
    return sb_val(&b);
}

/* str.format: {}, {0}, {name}, {{ and }}; !r / !s; no format specs. */
static val_t
str_format(rstate_t *rs, val_t fmt, const cargs_t *a)
{
    sbuf_t b = {0};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    int auto_idx = 0;

    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') {
            sb_putc(rs->cx, &b, '{');
            p += 2;
        } else if (*p == '}' && p + 1 < end && p[1] == '}') {
            sb_putc(rs->cx, &b, '}');
            p += 2;
        } else if (*p == '{') {
            const char *q = memchr(p, '}', (size_t)(end - p));
            const char *f = p + 1, *fe, *conv;
            val_t v = v_undef;

            if (q == NULL) {
                r_fail(rs, "single '{' encountered in format string");
            }
            fe = q;
            conv = memchr(f, '!', (size_t)(q - f));
            if (memchr(f, ':', (size_t)(q - f)) != NULL) {
                r_fail(rs, "format specs are not supported");
            }
            if (conv != NULL) {
                fe = conv;
            }
            if (fe == f) {
                v = arg(a, auto_idx++, NULL, v_undef);
                if (auto_idx > a->npos) {
                    r_fail(rs, "format: not enough positional arguments");
                }
            } else if (isdigit((unsigned char)*f)) {
                int idx = atoi(f);

                if (idx >= a->npos) {
                    r_fail(rs, "format: positional argument %d missing", idx);
                }
                v = a->pos[idx];
            } else {
                char *name = ar_strndup(rs->cx, f, (size_t)(fe - f));

                v = arg(a, -1, name, v_undef);
                if (v.t == V_UNDEF) {
                    r_fail(rs, "format: keyword argument '%s' missing", name);
                }
            }
            if (conv != NULL && conv + 1 < q && conv[1] == 'r') {
                put_repr(rs, &b, v);
            } else {
                put_str(rs, &b, v);
            }
            p = q + 1;
        } else if (*p == '}') {
            r_fail(rs, "single '}' encountered in format string");
        } else {
            sb_putc(rs->cx, &b, *p++);
        }
    }
    return sb_val(&b);
}

static bool
str_all(val_t s, int (*pred)(int))
{
    if (s.u.s.n == 0) {
        return false;
    }
    for (size_t i = 0; i < s.u.s.n; i++) {
        if (!pred((unsigned char)s.u.s.p[i])) {
            return false;
        }
    }
    return true;
}

static int
is_space_int(int c)
{
    return is_space((unsigned char)c);
}

static val_t
call_str_method(rstate_t *rs, val_t s, const char *m, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    if (strcmp(m, "strip") == 0 || strcmp(m, "lstrip") == 0 || strcmp(m, "rstrip") == 0) {
        val_t ch = arg(a, 0, "chars", v_none);

        if (ch.t != V_NONE) {
            need_str(rs, ch, "strip argument");
        }
        return str_strip(s, ch.t == V_NONE ? NULL : &ch, m[0] != 'r', m[0] != 'l');
    }
    if (strcmp(m, "split") == 0 || strcmp(m, "rsplit") == 0) {
        val_t mx = arg(a, 1, "maxsplit", v_int(-1));

        if (mx.t != V_INT) {
            r_fail(rs, "maxsplit must be an integer");
        }
        return str_split(rs, s, arg(a, 0, "sep", v_none), mx.u.i, m[0] == 'r');
    }
    if (strcmp(m, "splitlines") == 0) {
        vlist_t *l = list_new(cx, 4);
        bool keep = truthy(arg(a, 0, "keepends", v_bool(false)));
        size_t i = 0, st = 0;

        while (i < s.u.s.n) {
            char c = s.u.s.p[i];

            if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
                size_t e = i + 1;

                if (c == '\r' && e < s.u.s.n && s.u.s.p[e] == '\n') {
                    e++;
                }
                list_push(cx, l, v_strn(s.u.s.p + st, (keep ? e : i) - st));
                st = i = e;
            } else {
                i++;
            }
        }
        if (st < s.u.s.n) {
            list_push(cx, l, v_strn(s.u.s.p + st, s.u.s.n - st));
        }
        return v_list(l);
    }
    if (strcmp(m, "startswith") == 0 || strcmp(m, "endswith") == 0) {
        return v_bool(str_prefix_test(rs, s, arg(a, 0, NULL, v_undef), m[0] == 'e'));
    }
    if (strcmp(m, "upper") == 0 || strcmp(m, "casefold") == 0 || strcmp(m, "lower") == 0 ||
        strcmp(m, "title") == 0 || strcmp(m, "capitalize") == 0 || strcmp(m, "swapcase") == 0) {
        int mode = m[0] == 'u'                    ? 'U'
                   : m[0] == 't'                  ? 'T'
                   : m[0] == 's'                  ? 'S'
                   : strcmp(m, "capitalize") == 0 ? 'C'
                                                  : 'L';
        return str_case(rs, s, mode);
    }
    if (strcmp(m, "replace") == 0) {
        val_t c = arg(a, 2, "count", v_int(-1));

        return str_replace(rs, s, need_str(rs, arg(a, 0, "old", v_undef), "old"),
                           need_str(rs, arg(a, 1, "new", v_undef), "new"),
                           c.t == V_INT ? c.u.i : -1);
    }
    if (strcmp(m, "find") == 0 || strcmp(m, "rfind") == 0 || strcmp(m, "index") == 0 ||
        strcmp(m, "count") == 0) {
        val_t sub = need_str(rs, arg(a, 0, NULL, v_undef), "substring");
        const char *f;

        if (m[0] == 'c') {
            int64_t k = 0;
            const char *p = s.u.s.p, *end = p + s.u.s.n;

            if (sub.u.s.n == 0) {
                return v_int((int64_t)u8_len(s.u.s.p, s.u.s.n) + 1);
            }
            while ((f = memfind(p, (size_t)(end - p), sub.u.s.p, sub.u.s.n)) != NULL) {
                k++;
                p = f + sub.u.s.n;
            }
            return v_int(k);
        }
        f = m[0] == 'r' ? memrfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n)
                        : memfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
        if (f == NULL) {
            if (m[0] == 'i') {
                r_fail(rs, "substring not found");
            }
            return v_int(-1);
        }
        return v_int((int64_t)u8_len(s.u.s.p, (size_t)(f - s.u.s.p)));
    }
    if (strcmp(m, "join") == 0) {
        return str_join(rs, s, as_items(rs, arg(a, 0, NULL, v_undef), false), false);
    }
    if (strcmp(m, "format") == 0) {
        return str_format(rs, s, a);
    }
    if (strcmp(m, "isdigit") == 0) {
        return v_bool(str_all(s, isdigit));
    }
    if (strcmp(m, "isalpha") == 0) {
        return v_bool(str_all(s, isalpha));
    }
    if (strcmp(m, "isalnum") == 0) {
        return v_bool(str_all(s, isalnum));
    }
    if (strcmp(m, "isspace") == 0) {
        return v_bool(str_all(s, is_space_int));
    }
    if (strcmp(m, "isupper") == 0 || strcmp(m, "islower") == 0) {
        bool cased = false;

        for (size_t i = 0; i < s.u.s.n; i++) {
            int c = (unsigned char)s.u.s.p[i];

            if (m[2] == 'u' ? islower(c) : isupper(c)) {
                return v_bool(false);
            }
            cased |= isalpha(c) != 0;
        }
        return v_bool(cased);
    }
    if (strcmp(m, "partition") == 0 || strcmp(m, "rpartition") == 0) {
        val_t sep = need_str(rs, arg(a, 0, NULL, v_undef), "separator");
        const char *f = m[0] == 'r' ? memrfind(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n)
                                    : memfind(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n);
        vlist_t *l = list_new(cx, 3);

        l->tuple = true;
        if (sep.u.s.n == 0) {
            r_fail(rs, "empty separator");
        }
        if (f == NULL) {
            val_t e = v_strn("", 0);

            list_push(cx, l, m[0] == 'r' ? e : s);
            list_push(cx, l, e);
            list_push(cx, l, m[0] == 'r' ? s : e);
        } else {
            list_push(cx, l, v_strn(s.u.s.p, (size_t)(f - s.u.s.p)));
            list_push(cx, l, sep);
            list_push(cx, l, v_strn(f + sep.u.s.n, s.u.s.n - (size_t)(f - s.u.s.p) - sep.u.s.n));
        }
        return v_list(l);
    }
    if (strcmp(m, "removeprefix") == 0 || strcmp(m, "removesuffix") == 0) {
        val_t x = need_str(rs, arg(a, 0, NULL, v_undef), "argument");
        bool suf = m[6] == 's';

        if (str_prefix_test(rs, s, x, suf)) {
            return v_strn(s.u.s.p + (suf ? 0 : x.u.s.n), s.u.s.n - x.u.s.n);
        }
        return s;
    }
    if (strcmp(m, "zfill") == 0) {
        val_t w = arg(a, 0, NULL, v_int(0));
        int64_t len = (int64_t)u8_len(s.u.s.p, s.u.s.n);
        sbuf_t b = {0};
        size_t st = 0;

        if (w.t != V_INT || w.u.i > (int64_t)rs->cx->max_out) {
            r_fail(rs, "bad zfill width");
        }
        if (s.u.s.n > 0 && (s.u.s.p[0] == '-' || s.u.s.p[0] == '+')) {
            sb_putc(cx, &b, s.u.s.p[0]);
            st = 1;
        }
        for (int64_t k = len; k < w.u.i; k++) {
            sb_putc(cx, &b, '0');
        }
        sb_add(cx, &b, s.u.s.p + st, s.u.s.n - st);
        return sb_val(&b);
    }
    r_fail(rs, "str has no method '%s'", m);
}

static val_t
dict_items(rstate_t *rs, vdict_t *d, int what)
{
    vlist_t *l = list_new(rs->cx, d->n);

    for (size_t i = 0; i < d->n; i++) {
        if (what == 'k') {
            list_push(rs->cx, l, d->k[i]);
        } else if (what == 'v') {
            list_push(rs->cx, l, d->v[i]);
        } else {
            vlist_t *t = list_new(rs->cx, 2);

            t->tuple = true;
            list_push(rs->cx, t, d->k[i]);
            list_push(rs->cx, t, d->v[i]);
            list_push(rs->cx, l, v_list(t));
        }
    }
    return v_list(l);
}

/* dict.keys() / values() / items(): views print as dict_keys([...]), are
 * not subscriptable and not JSON serializable, as in Python */
static val_t
dict_view(rstate_t *rs, vdict_t *d, int what)
{
    val_t v = dict_items(rs, d, what);

    v.u.l->view = (char)what;
    return v;
}

static val_t
call_method(rstate_t *rs, vmethod_t *m, const cargs_t *a)
{
    val_t self = m->self;

    if (self.t == V_STR) {
        return call_str_method(rs, self, m->name, a);
    }
    if (self.t == V_DICT) {
        if (strcmp(m->name, "get") == 0) {
            val_t *p = dict_find(self.u.d, arg(a, 0, "key", v_undef));
            return p ? *p : arg(a, 1, "default", v_none);
        }
        if (strcmp(m->name, "items") == 0) {
            return dict_view(rs, self.u.d, 'i');
        }
        if (strcmp(m->name, "keys") == 0) {
            return dict_view(rs, self.u.d, 'k');
        }
        if (strcmp(m->name, "values") == 0) {
            return dict_view(rs, self.u.d, 'v');
        }
        if (strcmp(m->name, "copy") == 0) {
            return self;
        }
        r_fail(rs, "access to method '%s' of dict is unsafe (immutable sandbox)", m->name);
    }
    if (self.t == V_LIST) {
        if (strcmp(m->name, "index") == 0 || strcmp(m->name, "count") == 0) {
            val_t x = arg(a, 0, NULL, v_undef);
            int64_t k = 0;

            for (size_t i = 0; i < self.u.l->n; i++) {
                if (val_eq(self.u.l->v[i], x)) {
                    if (m->name[0] == 'i') {
                        return v_int((int64_t)i);
                    }
                    k++;
                }
            }
            if (m->name[0] == 'i') {
                r_fail(rs, "value is not in list");
            }
            return v_int(k);
        }
        if (strcmp(m->name, "copy") == 0) {
            return self;
        }
        r_fail(rs, "access to method '%s' of list is unsafe (immutable sandbox)", m->name);
    }
    if (self.t == V_LOOP && strcmp(m->name, "cycle") == 0) {
        if (a->npos == 0) {
            r_fail(rs, "no items for cycling given");
        }
        return a->pos[self.u.loop->idx % (size_t)a->npos];
    }
    r_fail(rs, "'%s' object has no method '%s'", type_name(self), m->name);
}

static val_t
call_builtin(rstate_t *rs, int fn, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    switch (fn) {
    case FN_RANGE: {
        int64_t start = 0, stop, step = 1;
        vlist_t *l;

        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_INT && a->pos[i].t != V_BOOL) {
                r_fail(rs, "range() arguments must be integers");
            }
        }
        if (a->npos == 1) {
            stop = a->pos[0].u.i;
        } else if (a->npos == 2 || a->npos == 3) {
            start = a->pos[0].u.i;
            stop = a->pos[1].u.i;
            step = a->npos == 3 ? a->pos[2].u.i : 1;
        } else {
            r_fail(rs, "range() takes 1 to 3 arguments");
        }
        if (step == 0) {
            r_fail(rs, "range() step must not be zero");
        }
        l = list_new(cx, 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l->n >= 100000) {
                cx_fail(cx, ST_ETOOLONG, "line %d: range too large", cx->line);
            }
            list_push(cx, l, v_int(i));
        }
        return v_list(l);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        vdict_t *d = dict_new(cx);
        val_t v = {.t = fn == FN_NAMESPACE ? V_NS : V_DICT, .u.d = d};

        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_DICT && a->pos[i].t != V_NS) {
                r_fail(rs, "%s() positional arguments must be mappings",
                       fn == FN_DICT ? "dict" : "namespace");
            }
            for (size_t k = 0; k < a->pos[i].u.d->n; k++) {
                dict_set(cx, d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
            }
        }
        for (int i = 0; i < a->nkw; i++) {
            dict_set(cx, d, v_cstr(a->kwn[i]), a->kwv[i]);
        }
        return v;
    }
    case FN_RAISE: {
        val_t m = to_str(rs, arg(a, 0, NULL, v_strn("", 0)));

        cx_fail(cx, ST_EFORMAT, "%.*s", (int)(m.u.s.n > 200 ? 200 : m.u.s.n), m.u.s.p);
    }
    case FN_STRFTIME: {
        val_t f = need_str(rs, arg(a, 0, NULL, v_undef), "strftime_now format");
        char buf[256];
        struct tm tm;
        size_t n;

        if (localtime_r(&rs->now, &tm) == NULL) {
            r_fail(rs, "bad time");
        }
        n = strftime(buf, sizeof(buf), ar_strndup(cx, f.u.s.p, f.u.s.n), &tm);
        return v_strn(ar_strndup(cx, buf, n), n);
    }
    default:
        r_fail(rs, "unknown function");
    }
}

static val_t
call_macro(rstate_t *rs, const cnode_t *mac, const cargs_t *a)
{
    scope_t *saved = rs->cur, *sc;
    sbuf_t out = {0};
    int saved_loops = rs->loop_depth;

    if (a->npos > mac->nnames) {
        r_fail(rs, "macro '%s' takes not more than %d argument(s)", mac->name, mac->nnames);
    }
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;

        for (int i = 0; i < mac->nnames; i++) {
            known |= strcmp(a->kwn[k], mac->names[i]) == 0;
        }
        if (!known) {
            r_fail(rs, "macro '%s' takes no keyword argument '%s'", mac->name, a->kwn[k]);
        }
    }
    if (++rs->call_depth > CHAT_MAX_CALL_DEPTH) {
        cx_fail(rs->cx, ST_ETOOLONG, "line %d: macro calls nested too deeply", rs->cx->line);
    }
    sc = scope_new(rs, rs->root);
    rs->cur = sc;
    for (int i = 0; i < mac->nnames; i++) {
        val_t v = arg(a, i, mac->names[i], v_undef_named(mac->names[i]));

        if (v.t == V_UNDEF && i >= a->npos && mac->kids2[i] != NULL) {
            bool given = false;

            for (int k = 0; k < a->nkw; k++) {
                given |= strcmp(a->kwn[k], mac->names[i]) == 0;
            }
            if (!given) {
                v = eval(rs, mac->kids2[i]);
            }
        }
        scope_set(rs, sc, mac->names[i], v);
    }
    rs->loop_depth = 0;
    render_body(rs, mac->kids, mac->nkids, &out);
    rs->loop_depth = saved_loops;
    rs->cur = saved;
    rs->call_depth--;
    return sb_val(&out);
}

static val_t
call_value(rstate_t *rs, val_t f, const cargs_t *a)
{
    switch (f.t) {
    case V_MACRO:
        return call_macro(rs, f.u.macro, a);
    case V_FUNC:
        return call_builtin(rs, (int)f.u.i, a);
    case V_METHOD:
        return call_method(rs, f.u.m, a);
    case V_UNDEF:
        r_undefined(rs, f);
    default:
        r_fail(rs, "'%s' object is not callable", type_name(f));
    }
}

/* Evaluates a call-like node's arguments (kids, names/kids2). */
static void
eval_args(rstate_t *rs, const cnode_t *n, cargs_t *a)
{
    a->npos = n->nkids;
    a->nkw = n->nkids2;
    a->pos = n->nkids ? ar_alloc(rs->cx, (size_t)n->nkids * sizeof(val_t)) : NULL;
    a->kwv = n->nkids2 ? ar_alloc(rs->cx, (size_t)n->nkids2 * sizeof(val_t)) : NULL;
    a->kwn = n->names;
    for (int i = 0; i < n->nkids; i++) {
        a->pos[i] = eval(rs, n->kids[i]);
    }
    for (int i = 0; i < n->nkids2; i++) {
        a->kwv[i] = eval(rs, n->kids2[i]);
    }
}

static bool apply_test(rstate_t *rs, const char *name, val_t v, const cargs_t *a);
static val_t arith(rstate_t *rs, int op, val_t a, val_t b);

/* attribute path "a.b.0" of a value, jinja's make_attrgetter */
static val_t
attr_path(rstate_t *rs, val_t v, val_t path)
{
    const char *p, *end;

    if (path.t == V_INT) {
        return get_item(rs, v, path);
    }
    need_str(rs, path, "attribute");
    p = path.u.s.p;
    end = p + path.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        val_t key = v_strn(p, (size_t)(e - p));

        if (e > p && isdigit((unsigned char)*p)) {
            key = v_int(strtoll(p, NULL, 10));
        }
        if (v.t == V_UNDEF) {
            return v;
        }
        v = get_item(rs, v, key);
        if (dot == NULL) {
            break;
        }
        p = dot + 1;
    }
    return v;
}

static int
sort_cmp_ci(rstate_t *rs, val_t a, val_t b, bool ci)
{
    if (ci && a.t == V_STR && b.t == V_STR) {
        a = str_case(rs, a, 'L');
        b = str_case(rs, b, 'L');
    }
    return val_cmp(rs, a, b);
}

/* Stable sort of items by keys (insertion sort into a merge: n log n). */
static void
sort_vals(rstate_t *rs, val_t *items, val_t *keys, size_t n, bool ci, bool reverse)
{
    val_t *ti, *tk;

    if (n < 2) {
        return;
    }
    ti = ar_alloc(rs->cx, n * sizeof(val_t));
    tk = ar_alloc(rs->cx, n * sizeof(val_t));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;

            while (i < mid || j < hi) {
                bool take_left;

                if (i >= mid) {
                    take_left = false;
                } else if (j >= hi) {
                    take_left = true;
                } else {
                    int c = sort_cmp_ci(rs, keys[i], keys[j], ci);
                    take_left = reverse ? c >= 0 : c <= 0;
                }
                if (take_left) {
                    ti[k] = items[i];
                    tk[k++] = keys[i++];
                } else {
                    ti[k] = items[j];
                    tk[k++] = keys[j++];
                }
            }
        }
        memcpy(items, ti, n * sizeof(val_t));
        memcpy(keys, tk, n * sizeof(val_t));
    }
}

static val_t
list_copy(rstate_t *rs, vlist_t *src)
{
    vlist_t *l = list_new(rs->cx, src->n);

    if (src->n) {
        memcpy(l->v, src->v, src->n * sizeof(val_t));
    }
    l->n = src->n;
    return v_list(l);
}

static val_t
html_escape(rstate_t *rs, val_t s)
{
    sbuf_t b = {0};

    for (size_t i = 0; i < s.u.s.n; i++) {
        switch (s.u.s.p[i]) {
        case '&':
            sb_puts(rs->cx, &b, "&amp;");
            break;
        case '<':
            sb_puts(rs->cx, &b, "&lt;");
            break;
        case '>':
            sb_puts(rs->cx, &b, "&gt;");
            break;
        case '"':
            sb_puts(rs->cx, &b, "&#34;");
            break;
        case '\'':
            sb_puts(rs->cx, &b, "&#39;");
            break;
        default:
            sb_putc(rs->cx, &b, s.u.s.p[i]);
        }
    }
    return sb_val(&b);
}

static val_t apply_filter(rstate_t *rs, const char *name, val_t v, const cargs_t *a);

/* select / reject / selectattr / rejectattr */
static val_t
filter_select(rstate_t *rs, val_t v, const cargs_t *a, bool by_attr, bool keep)
{
    /* jinja2 yields nothing for a falsy input (none included) */
    val_t poison;
    vlist_t *in = truthy(v) ? gen_input(rs, v, &poison) : list_new(rs->cx, 0);
    vlist_t *out;
    int first = by_attr ? 1 : 0;

    if (in == NULL) {
        return poison;
    }
    out = list_new(rs->cx, in->n);
    cargs_t ta = *a;
    val_t tname = arg(a, first, NULL, v_none);

    ta.pos = a->npos > first + 1 ? a->pos + first + 1 : NULL;
    ta.npos = a->npos > first + 1 ? a->npos - first - 1 : 0;
    for (size_t i = 0; i < in->n; i++) {
        val_t x = by_attr ? attr_path(rs, in->v[i], arg(a, 0, NULL, v_undef)) : in->v[i];
        bool ok;

        if (tname.t == V_NONE) {
            ok = truthy(x);
        } else {
            char *tn = ar_strndup(rs->cx, need_str(rs, tname, "test name").u.s.p, tname.u.s.n);
            ok = apply_test(rs, tn, x, &ta);
        }
        if (ok == keep) {
            list_push(rs->cx, out, in->v[i]);
        }
    }
    out->gen = true;
    return v_list(out);
}

static val_t
filter_indent(rstate_t *rs, val_t s, const cargs_t *a)
{
    val_t w = arg(a, 0, "width", v_int(4));
    bool first = truthy(arg(a, 1, "first", v_bool(false)));
    bool blank = truthy(arg(a, 2, "blank", v_bool(false)));
    sbuf_t ind = {0}, b = {0};
    cargs_t none = {0};
    vlist_t *lines;

    if (w.t == V_STR) {
        ind.p = (char *)w.u.s.p;
        ind.n = w.u.s.n;
    } else if (w.t == V_INT && w.u.i >= 0 && w.u.i <= 1000) {
        for (int64_t k = 0; k < w.u.i; k++) {
            sb_putc(rs->cx, &ind, ' ');
        }
    } else {
        r_fail(rs, "bad indent width");
    }
    {
        sbuf_t t = {0};

        sb_add(rs->cx, &t, s.u.s.p, s.u.s.n);
        sb_putc(rs->cx, &t, '\n');
        lines = call_str_method(rs, sb_val(&t), "splitlines", &none).u.l;
    }
    if (first) {
        sb_add(rs->cx, &b, ind.p, ind.n);
    }
    for (size_t i = 0; i < lines->n; i++) {
        val_t ln = lines->v[i];

        if (i > 0) {
            sb_putc(rs->cx, &b, '\n');
            if (blank || ln.u.s.n > 0) {
                sb_add(rs->cx, &b, ind.p, ind.n);
            }
        }
        sb_add(rs->cx, &b, ln.u.s.p, ln.u.s.n);
    }
    return sb_val(&b);
}

static val_t
apply_filter(rstate_t *rs, const char *name, val_t v, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        bool boolean = truthy(arg(a, 1, "boolean", v_bool(false)));

        if (v.t == V_UNDEF || (boolean && !truthy(v))) {
            return arg(a, 0, "default_value", v_strn("", 0));
        }
        return v;
    }
    if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        return v_int(py_len(rs, v));
    }
    if (strcmp(name, "string") == 0) {
        return to_str(rs, v);
    }
    if (strcmp(name, "safe") == 0) {
        v = to_str(rs, v);
        v.safe = true;
        return v;
    }
    if (strcmp(name, "tojson") == 0) {
        jopts_t o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        val_t ind = arg(a, 0, "indent", v_none), sep = arg(a, -1, "separators", v_none);
        sbuf_t b = {0}, is = {0};

        o.ensure_ascii = truthy(arg(a, -1, "ensure_ascii", v_bool(false)));
        o.sort_keys = truthy(arg(a, -1, "sort_keys", v_bool(false)));
        if (ind.t == V_INT) {
            if (ind.u.i > 1000) {
                r_fail(rs, "indent too large");
            }
            for (int64_t k = 0; k < ind.u.i; k++) {
                sb_putc(cx, &is, ' ');
            }
            o.indent = (int)(ind.u.i < 0 ? 0 : ind.u.i);
        } else if (ind.t == V_STR) {
            sb_add(cx, &is, ind.u.s.p, ind.u.s.n);
            o.indent = (int)ind.u.s.n;
        } else if (ind.t != V_NONE) {
            r_fail(rs, "bad tojson indent");
        }
        o.indent_str = is.n ? is.p : "";
        if (o.indent >= 0) {
            o.item_sep = ",";
        }
        if (sep.t == V_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == V_STR &&
            sep.u.l->v[1].t == V_STR) {
            o.item_sep = ar_strndup(cx, sep.u.l->v[0].u.s.p, sep.u.l->v[0].u.s.n);
            o.key_sep = ar_strndup(cx, sep.u.l->v[1].u.s.p, sep.u.l->v[1].u.s.n);
        } else if (sep.t != V_NONE) {
            r_fail(rs, "bad tojson separators");
        }
        json_dump(rs, &b, v, &o, 0);
        return sb_val(&b);
    }
    if (strcmp(name, "trim") == 0) {
        val_t ch = arg(a, 0, "chars", v_none);

        val_t r;

        v = to_str(rs, v);
        if (ch.t != V_NONE) {
            need_str(rs, ch, "trim chars");
        }
        r = str_strip(v, ch.t == V_NONE ? NULL : &ch, true, true);
        r.safe = v.safe;
        return r;
    }
    if (strcmp(name, "upper") == 0 || strcmp(name, "lower") == 0 ||
        strcmp(name, "capitalize") == 0 || strcmp(name, "title") == 0) {
        int mode = name[0] == 'u' ? 'U' : name[0] == 'l' ? 'L' : name[0] == 'c' ? 'C' : 'T';
        return str_case(rs, to_str(rs, v), mode);
    }
    if (strcmp(name, "replace") == 0) {
        val_t c = arg(a, 2, "count", v_none);

        return str_replace(rs, to_str(rs, v), to_str(rs, arg(a, 0, "old", v_undef)),
                           to_str(rs, arg(a, 1, "new", v_undef)), c.t == V_INT ? c.u.i : -1);
    }
    if (strcmp(name, "join") == 0) {
        val_t sep = to_str(rs, arg(a, 0, "d", v_strn("", 0)));
        val_t at = arg(a, 1, "attribute", v_none);
        vlist_t *items = as_items(rs, v, true);

        if (at.t != V_NONE) {
            vlist_t *m = list_new(cx, items->n);

            for (size_t i = 0; i < items->n; i++) {
                list_push(cx, m, attr_path(rs, items->v[i], at));
            }
            items = m;
        }
        return str_join(rs, sep, items, true);
    }
    if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        vlist_t *items = as_items(rs, v, true);

        if (name[0] == 'l' && v.t == V_LIST && v.u.l->gen) {
            r_fail(rs, "'generator' object is not reversible");
        }
        if (items->n == 0) {
            return v_undef_named(NULL);
        }
        return name[0] == 'f' ? items->v[0] : items->v[items->n - 1];
    }
    if (strcmp(name, "list") == 0) {
        return list_copy(rs, as_items(rs, v, true));
    }
    if (strcmp(name, "reverse") == 0) {
        if (v.t == V_STR) {
            val_t sl[3] = {v_none, v_none, v_int(-1)};
            return do_slice(rs, v, sl);
        } else {
            vlist_t *in = as_items(rs, v, true), *out = list_new(cx, in->n);

            for (size_t i = in->n; i-- > 0;) {
                list_push(cx, out, in->v[i]);
            }
            out->gen = true; /* reversed(): an iterator */
            return v_list(out);
        }
    }
    if (strcmp(name, "int") == 0 || strcmp(name, "float") == 0) {
        bool is_int = name[0] == 'i';
        val_t def = arg(a, 0, "default", is_int ? v_int(0) : v_float(0.0));

        if (v.t == V_INT || v.t == V_BOOL) {
            return is_int ? v_int(v.u.i) : v_float((double)v.u.i);
        }
        if (v.t == V_FLOAT) {
            if (!is_int) {
                return v;
            }
            if (!isfinite(v.u.f) || fabs(v.u.f) > 9e18) {
                return def;
            }
            return v_int((int64_t)v.u.f);
        }
        if (v.t == V_STR) {
            char *s = ar_strndup(cx, v.u.s.p, v.u.s.n), *end;
            long long iv;
            double fv;

            errno = 0;
            iv = strtoll(s, &end, 10);
            if (is_int && end != s && errno == 0) {
                while (is_space((unsigned char)*end)) {
                    end++;
                }
                if (*end == '\0') {
                    return v_int(iv);
                }
            }
            fv = strtod(s, &end);
            if (end != s) {
                while (is_space((unsigned char)*end)) {
                    end++;
                }
                if (*end == '\0') {
                    if (!is_int) {
                        return v_float(fv);
                    }
                    if (isfinite(fv) && fabs(fv) < 9e18) {
                        return v_int((int64_t)fv);
                    }
                }
            }
        }
        return def;
    }
    if (strcmp(name, "abs") == 0) {
        if (v.t == V_INT || v.t == V_BOOL) {
            if (v.u.i == INT64_MIN) {
                r_fail(rs, "integer overflow");
            }
            return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == V_FLOAT) {
            return v_float(fabs(v.u.f));
        }
        r_fail(rs, "bad operand type for abs()");
    }
    if (strcmp(name, "items") == 0) {
        if (v.t == V_UNDEF) {
            vlist_t *e = list_new(cx, 0);

            e->gen = true;
            return v_list(e);
        }
        if (v.t != V_DICT) {
            vlist_t *e = list_new(cx, 0);

            e->gen = true;
            e->err = "items filter needs a mapping";
            return v_list(e);
        }
        {
            val_t r = dict_items(rs, v.u.d, 'i');

            r.u.l->gen = true; /* jinja2's items filter is a generator */
            return r;
        }
    }
    if (strcmp(name, "dictsort") == 0) {
        bool cs = truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t by = arg(a, 1, "by", v_cstr("key"));
        bool rev = truthy(arg(a, 2, "reverse", v_bool(false)));
        val_t items;
        val_t *keys;
        int pos = str_eq(by, "value", 5) ? 1 : 0;

        if (v.t != V_DICT) {
            r_fail(rs, "dictsort needs a mapping");
        }
        items = dict_items(rs, v.u.d, 'i');
        keys = ar_alloc(cx, (items.u.l->n + 1) * sizeof(val_t));
        for (size_t i = 0; i < items.u.l->n; i++) {
            keys[i] = items.u.l->v[i].u.l->v[pos];
        }
        sort_vals(rs, items.u.l->v, keys, items.u.l->n, !cs, rev);
        return items;
    }
    if (strcmp(name, "sort") == 0) {
        bool rev = truthy(arg(a, 0, "reverse", v_bool(false)));
        bool cs = truthy(arg(a, 1, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 2, "attribute", v_none);
        val_t out = list_copy(rs, as_items(rs, v, true));
        val_t *keys = ar_alloc(cx, (out.u.l->n + 1) * sizeof(val_t));

        for (size_t i = 0; i < out.u.l->n; i++) {
            keys[i] = at.t == V_NONE ? out.u.l->v[i] : attr_path(rs, out.u.l->v[i], at);
        }
        sort_vals(rs, out.u.l->v, keys, out.u.l->n, !cs, rev);
        return out;
    }
    if (strcmp(name, "unique") == 0) {
        bool cs = truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 1, "attribute", v_none);
        val_t poison;
        vlist_t *in = gen_input(rs, v, &poison), *out, *seen;

        if (in == NULL) {
            return poison;
        }
        out = list_new(cx, in->n);
        seen = list_new(cx, 8);

        for (size_t i = 0; i < in->n; i++) {
            val_t k = at.t == V_NONE ? in->v[i] : attr_path(rs, in->v[i], at);
            bool dup = false;

            if (!cs && k.t == V_STR) {
                k = str_case(rs, k, 'L');
            }
            for (size_t j = 0; j < seen->n && !dup; j++) {
                dup = val_eq(seen->v[j], k);
            }
            if (!dup) {
                list_push(cx, seen, k);
                list_push(cx, out, in->v[i]);
            }
        }
        out->gen = true;
        return v_list(out);
    }
    if (strcmp(name, "min") == 0 || strcmp(name, "max") == 0) {
        bool cs = truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 1, "attribute", v_none);
        vlist_t *in = as_items(rs, v, true);
        size_t best = 0;

        if (in->n == 0) {
            return v_undef_named(NULL);
        }
        for (size_t i = 1; i < in->n; i++) {
            val_t x = at.t == V_NONE ? in->v[i] : attr_path(rs, in->v[i], at);
            val_t y = at.t == V_NONE ? in->v[best] : attr_path(rs, in->v[best], at);
            int c = sort_cmp_ci(rs, x, y, !cs);

            if (name[1] == 'i' ? c < 0 : c > 0) {
                best = i;
            }
        }
        return in->v[best];
    }
    if (strcmp(name, "sum") == 0) {
        val_t at = arg(a, 0, "attribute", v_none), acc = arg(a, 1, "start", v_int(0));
        vlist_t *in = as_items(rs, v, true);

        for (size_t i = 0; i < in->n; i++) {
            val_t x = at.t == V_NONE ? in->v[i] : attr_path(rs, in->v[i], at);

            if (!is_num(x) || !is_num(acc)) {
                r_fail(rs, "sum needs numbers");
            }
            if (x.t == V_FLOAT || acc.t == V_FLOAT) {
                acc = v_float(num_f(acc) + num_f(x));
            } else if (__builtin_add_overflow(acc.u.i, x.u.i, &acc.u.i)) {
                r_fail(rs, "integer overflow");
            } else {
                acc.t = V_INT;
            }
        }
        return acc;
    }
    if (strcmp(name, "round") == 0) {
        val_t pr = arg(a, 0, "precision", v_int(0));
        val_t me = arg(a, 1, "method", v_cstr("common"));
        double f = num_f(v), m;

        if (!is_num(v) || pr.t != V_INT || pr.u.i < 0 || pr.u.i > 15) {
            r_fail(rs, "bad round arguments");
        }
        m = pow(10.0, (double)pr.u.i);
        if (str_eq(me, "floor", 5)) {
            return v_float(floor(f * m) / m);
        }
        if (str_eq(me, "ceil", 4)) {
            return v_float(ceil(f * m) / m);
        }
        return v_float(round(f * m) / m);
    }
    if (strcmp(name, "map") == 0) {
        val_t poison;
        vlist_t *in = truthy(v) ? gen_input(rs, v, &poison) : list_new(cx, 0);
        vlist_t *out;
        val_t at = arg(a, -1, "attribute", v_none);

        if (in == NULL) {
            return poison;
        }
        out = list_new(cx, in->n);

        if (at.t != V_NONE) {
            val_t def = arg(a, -1, "default", v_undef);

            for (size_t i = 0; i < in->n; i++) {
                val_t x = attr_path(rs, in->v[i], at);
                list_push(cx, out, x.t == V_UNDEF && def.t != V_UNDEF ? def : x);
            }
        } else {
            val_t fname = need_str(rs, arg(a, 0, NULL, v_undef), "map filter name");
            char *fn = ar_strndup(cx, fname.u.s.p, fname.u.s.n);
            cargs_t fa = *a;

            fa.pos = a->npos > 1 ? a->pos + 1 : NULL;
            fa.npos = a->npos > 1 ? a->npos - 1 : 0;
            for (size_t i = 0; i < in->n; i++) {
                list_push(cx, out, apply_filter(rs, fn, in->v[i], &fa));
            }
        }
        out->gen = true;
        return v_list(out);
    }
    if (strcmp(name, "select") == 0 || strcmp(name, "reject") == 0) {
        return filter_select(rs, v, a, false, name[0] == 's');
    }
    if (strcmp(name, "selectattr") == 0 || strcmp(name, "rejectattr") == 0) {
        return filter_select(rs, v, a, true, name[0] == 's');
    }
    if (strcmp(name, "indent") == 0) {
        return filter_indent(rs, need_str(rs, v, "indent input"), a); /* s += "\n" in jinja2 */
    }
    if (strcmp(name, "escape") == 0 || strcmp(name, "e") == 0 || strcmp(name, "forceescape") == 0) {
        if (v.t == V_STR && v.safe && name[0] != 'f') {
            return v;
        }
        v = html_escape(rs, to_str(rs, v));
        v.safe = true;
        return v;
    }
    if (strcmp(name, "attr") == 0) {
        val_t at = need_str(rs, arg(a, 0, NULL, v_undef), "attribute name");
        return get_attr(rs, v, ar_strndup(cx, at.u.s.p, at.u.s.n));
    }
    if (strcmp(name, "wordcount") == 0) {
        /* runs of \w (letters, digits, _; any non-ASCII byte counts as one) */
        val_t s = to_str(rs, v);
        int64_t words = 0;
        bool in_word = false;

        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char c = (unsigned char)s.u.s.p[i];
            bool w = isalnum(c) || c == '_' || c >= 0x80;

            words += w && !in_word;
            in_word = w;
        }
        return v_int(words);
    }
    if (strcmp(name, "center") == 0) {
        val_t w = arg(a, 0, "width", v_int(80));
        int64_t len = py_len(rs, v = to_str(rs, v)), pad, left;
        sbuf_t b = {0};

        if (w.t != V_INT || w.u.i > 10000) {
            r_fail(rs, "bad center width");
        }
        pad = w.u.i - len;
        if (pad <= 0) {
            return v;
        }
        left = pad / 2 + (pad & w.u.i & 1);
        for (int64_t k = 0; k < left; k++) {
            sb_putc(cx, &b, ' ');
        }
        sb_add(cx, &b, v.u.s.p, v.u.s.n);
        for (int64_t k = 0; k < pad - left; k++) {
            sb_putc(cx, &b, ' ');
        }
        return sb_val(&b);
    }
    r_fail(rs, "no filter named '%s'", name);
}

static bool
apply_test(rstate_t *rs, const char *name, val_t v, const cargs_t *a)
{
    val_t x = arg(a, 0, NULL, v_undef);

    if (strcmp(name, "defined") == 0) {
        return v.t != V_UNDEF;
    }
    if (strcmp(name, "undefined") == 0) {
        return v.t == V_UNDEF;
    }
    if (strcmp(name, "none") == 0) {
        return v.t == V_NONE;
    }
    if (strcmp(name, "string") == 0) {
        return v.t == V_STR;
    }
    if (strcmp(name, "mapping") == 0) {
        return v.t == V_DICT;
    }
    if (strcmp(name, "iterable") == 0) {
        return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    }
    if (strcmp(name, "sequence") == 0) {
        return v.t == V_STR || (v.t == V_LIST && !v.u.l->gen) || v.t == V_DICT || v.t == V_UNDEF;
    }
    if (strcmp(name, "boolean") == 0) {
        return v.t == V_BOOL;
    }
    if (strcmp(name, "true") == 0) {
        return v.t == V_BOOL && v.u.i;
    }
    if (strcmp(name, "false") == 0) {
        return v.t == V_BOOL && !v.u.i;
    }
    if (strcmp(name, "number") == 0) {
        return is_num(v);
    }
    if (strcmp(name, "integer") == 0) {
        return v.t == V_INT;
    }
    if (strcmp(name, "float") == 0) {
        return v.t == V_FLOAT;
    }
    if (strcmp(name, "callable") == 0) {
        return v.t == V_MACRO || v.t == V_FUNC || v.t == V_METHOD;
    }
    if (strcmp(name, "sameas") == 0) {
        if (v.t != x.t) {
            return false;
        }
        return v.t == V_NONE || v.t == V_UNDEF || ((v.t == V_BOOL) && v.u.i == x.u.i) ||
               (v.t == V_LIST && v.u.l == x.u.l) ||
               ((v.t == V_DICT || v.t == V_NS) && v.u.d == x.u.d);
    }
    if (strcmp(name, "eq") == 0 || strcmp(name, "equalto") == 0 || strcmp(name, "==") == 0) {
        return val_eq(v, x);
    }
    if (strcmp(name, "ne") == 0 || strcmp(name, "!=") == 0) {
        return !val_eq(v, x);
    }
    if (strcmp(name, "lt") == 0 || strcmp(name, "lessthan") == 0) {
        return val_cmp(rs, v, x) < 0;
    }
    if (strcmp(name, "le") == 0) {
        return val_cmp(rs, v, x) <= 0;
    }
    if (strcmp(name, "gt") == 0 || strcmp(name, "greaterthan") == 0) {
        return val_cmp(rs, v, x) > 0;
    }
    if (strcmp(name, "ge") == 0) {
        return val_cmp(rs, v, x) >= 0;
    }
    if (strcmp(name, "in") == 0) {
        if (x.t == V_STR && v.t == V_STR) {
            return memfind(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (x.t == V_LIST || x.t == V_DICT) {
            vlist_t *l = as_items(rs, x, false);

            for (size_t i = 0; i < l->n; i++) {
                if (val_eq(l->v[i], v)) {
                    return true;
                }
            }
            return false;
        }
        r_fail(rs, "'in' test needs a container");
    }
    if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0) {
        /* value % 2 == 1 (or 0), Python modulo, floats included */
        return val_eq(arith(rs, '%', v, v_int(2)), v_int(name[0] == 'o' ? 1 : 0));
    }
    if (strcmp(name, "divisibleby") == 0) {
        return val_eq(arith(rs, '%', v, x), v_int(0));
    }
    if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        val_t s = to_str(rs, v);
        cargs_t none = {0};

        return truthy(call_str_method(rs, s, name[0] == 'l' ? "islower" : "isupper", &none));
    }
    if (strcmp(name, "escaped") == 0) {
        return false;
    }
    r_fail(rs, "no test named '%s'", name);
}

/* ==== render: expressions ================================================= */

static val_t
arith(rstate_t *rs, int op, val_t a, val_t b)
{
    cx_t *cx = rs->cx;

    if (a.t == V_UNDEF) {
        r_undefined(rs, a);
    }
    if (b.t == V_UNDEF) {
        r_undefined(rs, b);
    }
    if (op == '+' && a.t == V_STR && b.t == V_STR) {
        sbuf_t s = {0};
        val_t r;
        bool safe = a.safe || b.safe;

        /* Markup + str escapes the str (markupsafe), the result is Markup */
        if (safe && !a.safe) {
            a = html_escape(rs, a);
        }
        if (safe && !b.safe) {
            b = html_escape(rs, b);
        }
        sb_add(cx, &s, a.u.s.p, a.u.s.n);
        sb_add(cx, &s, b.u.s.p, b.u.s.n);
        r = sb_val(&s);
        r.safe = safe;
        return r;
    }
    if (op == '+' && a.t == V_LIST && b.t == V_LIST) {
        vlist_t *l = list_new(cx, a.u.l->n + b.u.l->n);

        for (size_t i = 0; i < a.u.l->n; i++) {
            list_push(cx, l, a.u.l->v[i]);
        }
        for (size_t i = 0; i < b.u.l->n; i++) {
            list_push(cx, l, b.u.l->v[i]);
        }
        l->tuple = a.u.l->tuple;
        return v_list(l);
    }
    if (op == '*' && ((a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL))) {
        int64_t k = b.u.i < 0 ? 0 : b.u.i;

        if (a.t == V_STR) {
            sbuf_t s = {0};

            if (a.u.s.n > 0 && (uint64_t)k > cx->max_out / a.u.s.n) {
                cx_fail(cx, ST_ETOOLONG, "line %d: string repetition too large", cx->line);
            }
            for (int64_t i = 0; i < k; i++) {
                sb_add(cx, &s, a.u.s.p, a.u.s.n);
            }
            return sb_val(&s);
        } else {
            vlist_t *l = list_new(cx, 0);

            if (a.u.l->n > 0 && (uint64_t)k > 100000 / a.u.l->n) {
                cx_fail(cx, ST_ETOOLONG, "line %d: list repetition too large", cx->line);
            }
            for (int64_t i = 0; i < k; i++) {
                for (size_t j = 0; j < a.u.l->n; j++) {
                    list_push(cx, l, a.u.l->v[j]);
                }
            }
            return v_list(l);
        }
    }
    if (op == '*' && (b.t == V_STR || b.t == V_LIST) && (a.t == V_INT || a.t == V_BOOL)) {
        return arith(rs, op, b, a);
    }
    if (!is_num(a) || !is_num(b)) {
        r_fail(rs, "unsupported operand types for %c: '%s' and '%s'", op == 'F' ? '/' : op,
               type_name(a), type_name(b));
    }
    if (a.t != V_FLOAT && b.t != V_FLOAT && op != '/') {
        int64_t x = a.u.i, y = b.u.i, r;

        switch (op) {
        case '+':
            if (__builtin_add_overflow(x, y, &r)) {
                r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case '-':
            if (__builtin_sub_overflow(x, y, &r)) {
                r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case '*':
            if (__builtin_mul_overflow(x, y, &r)) {
                r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case 'F':
        case '%':
            if (y == 0) {
                r_fail(rs, "integer division or modulo by zero");
            }
            if (x == INT64_MIN && y == -1) {
                r_fail(rs, "integer overflow");
            }
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) {
                r--;
            }
            return op == 'F' ? v_int(r) : v_int(x - r * y);
        case 'P':
            if (y < 0) {
                return v_float(pow((double)x, (double)y));
            }
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r)) {
                    r_fail(rs, "integer overflow");
                }
                if (r == 0 || r == 1) {
                    break;
                }
            }
            return v_int(r);
        default:
            break;
        }
    }
    {
        double x = num_f(a), y = num_f(b);

        switch (op) {
        case '+':
            return v_float(x + y);
        case '-':
            return v_float(x - y);
        case '*':
            return v_float(x * y);
        case '/':
            if (y == 0) {
                r_fail(rs, "division by zero");
            }
            return v_float(x / y);
        case 'F':
            if (y == 0) {
                r_fail(rs, "float floor division by zero");
            }
            return v_float(floor(x / y));
        case '%': {
            double m;

            if (y == 0) {
                r_fail(rs, "float modulo");
            }
            m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) {
                m += y;
            }
            return v_float(m);
        }
        case 'P':
            return v_float(pow(x, y));
        default:
            r_fail(rs, "bad operator");
        }
    }
}

static bool
contains(rstate_t *rs, val_t needle, val_t hay)
{
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) {
            r_fail(rs, "'in <string>' requires string as left operand, not %s", type_name(needle));
        }
        return memfind(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++) {
            if (val_eq(hay.u.l->v[i], needle)) {
                return true;
            }
        }
        return false;
    case V_DICT:
        if ((needle.t == V_LIST && !needle.u.l->tuple) || needle.t == V_DICT || needle.t == V_NS) {
            r_fail(rs, "unhashable type: '%s'", type_name(needle));
        }
        return dict_find(hay.u.d, needle) != NULL;
    case V_UNDEF:
        return false;
    default:
        r_fail(rs, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static val_t
apply_filter_node(rstate_t *rs, const cnode_t *n, val_t input)
{
    /* a chain: the innermost filter (a == NULL) takes the block's text */
    val_t v = n->a == NULL ? input : apply_filter_node(rs, n->a, input);
    cargs_t a;

    eval_args(rs, n, &a);
    rs->cx->line = n->line;
    return apply_filter(rs, n->name, v, &a);
}

static val_t eval_node(rstate_t *rs, const cnode_t *n);

/* Every expression and statement level goes through here or render_body:
 * the depth bound keeps a hostile template (deep nesting inside recursive
 * macros) well inside the C stack, about 1 KiB per level. */
static val_t
eval(rstate_t *rs, const cnode_t *n)
{
    val_t v;

    if (++rs->eval_depth > CHAT_MAX_EVAL_DEPTH) {
        cx_fail(rs->cx, ST_ETOOLONG, "line %d: template evaluation nested too deeply", n->line);
    }
    charge(0);
    v = eval_node(rs, n);
    rs->eval_depth--;
    return v;
}

static val_t
eval_node(rstate_t *rs, const cnode_t *n)
{
    cx_t *cx = rs->cx;

    cx->line = n->line;
    switch (n->kind) {
    case E_CONST:
        return n->val;
    case E_NAME:
        return lookup(rs, n->name);
    case E_ATTR: {
        val_t o = eval(rs, n->a);

        cx->line = n->line;
        return get_attr(rs, o, n->name);
    }
    case E_ITEM: {
        val_t o = eval(rs, n->a), k = eval(rs, n->b);

        cx->line = n->line;
        return get_item(rs, o, k);
    }
    case E_SLICE: {
        val_t o = eval(rs, n->a), sv[3];

        for (int i = 0; i < 3; i++) {
            sv[i] = n->kids[i] ? eval(rs, n->kids[i]) : v_none;
        }
        cx->line = n->line;
        return do_slice(rs, o, sv);
    }
    case E_CALL: {
        val_t f = eval(rs, n->a);
        cargs_t a;

        eval_args(rs, n, &a);
        cx->line = n->line;
        return call_value(rs, f, &a);
    }
    case E_FILTER: {
        val_t v = eval(rs, n->a);
        cargs_t a;

        eval_args(rs, n, &a);
        cx->line = n->line;
        return apply_filter(rs, n->name, v, &a);
    }
    case E_TEST: {
        val_t v = eval(rs, n->a);
        cargs_t a;

        eval_args(rs, n, &a);
        cx->line = n->line;
        return v_bool(apply_test(rs, n->name, v, &a));
    }
    case E_NEG:
    case E_POS: {
        val_t v = eval(rs, n->a);

        if (v.t == V_INT || v.t == V_BOOL) {
            if (n->kind == E_NEG && v.u.i == INT64_MIN) {
                r_fail(rs, "integer overflow");
            }
            return v_int(n->kind == E_NEG ? -v.u.i : v.u.i);
        }
        if (v.t == V_FLOAT) {
            return v_float(n->kind == E_NEG ? -v.u.f : v.u.f);
        }
        if (v.t == V_UNDEF) {
            r_undefined(rs, v);
        }
        r_fail(rs, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
               type_name(v));
    }
    case E_NOT:
        return v_bool(!truthy(eval(rs, n->a)));
    case E_AND: {
        val_t l = eval(rs, n->a);
        return truthy(l) ? eval(rs, n->b) : l;
    }
    case E_OR: {
        val_t l = eval(rs, n->a);
        return truthy(l) ? l : eval(rs, n->b);
    }
    case E_BIN: {
        val_t l = eval(rs, n->a), r = eval(rs, n->b);

        cx->line = n->line;
        return arith(rs, n->op, l, r);
    }
    case E_CONCAT: {
        sbuf_t b = {0};

        for (int i = 0; i < n->nkids; i++) {
            put_str(rs, &b, eval(rs, n->kids[i]));
        }
        return sb_val(&b);
    }
    case E_CMP: {
        val_t l = eval(rs, n->a);

        for (int i = 0; i < n->nkids; i++) {
            val_t r = eval(rs, n->kids[i]);
            bool ok;

            cx->line = n->line;
            switch (n->ops[i]) {
            case CMP_EQ:
                ok = val_eq(l, r);
                break;
            case CMP_NE:
                ok = !val_eq(l, r);
                break;
            case CMP_LT:
                ok = val_cmp(rs, l, r) < 0;
                break;
            case CMP_LE:
                ok = val_cmp(rs, l, r) <= 0;
                break;
            case CMP_GT:
                ok = val_cmp(rs, l, r) > 0;
                break;
            case CMP_GE:
                ok = val_cmp(rs, l, r) >= 0;
                break;
            case CMP_IN:
                ok = contains(rs, l, r);
                break;
            default:
                ok = !contains(rs, l, r);
                break;
            }
            if (!ok) {
                return v_bool(false);
            }
            l = r;
        }
        return v_bool(true);
    }
    case E_COND:
        if (truthy(eval(rs, n->a))) {
            return eval(rs, n->b);
        }
        return n->c ? eval(rs, n->c) : v_undef;
    case E_LIST:
    case E_TUPLE: {
        vlist_t *l = list_new(cx, (size_t)n->nkids);

        for (int i = 0; i < n->nkids; i++) {
            list_push(cx, l, eval(rs, n->kids[i]));
        }
        l->tuple = n->kind == E_TUPLE;
        return v_list(l);
    }
    case E_DICT: {
        vdict_t *d = dict_new(cx);

        for (int i = 0; i < n->nkids; i++) {
            val_t k = eval(rs, n->kids[i]);

            if (k.t == V_LIST && !k.u.l->tuple) {
                r_fail(rs, "unhashable type: 'list'");
            }
            if (k.t == V_DICT || k.t == V_NS) {
                r_fail(rs, "unhashable type: 'dict'");
            }
            dict_set(cx, d, k, eval(rs, n->kids2[i]));
        }
        return v_dict(d);
    }
    default:
        r_fail(rs, "bad expression node");
    }
}

/* ==== render: statements ================================================== */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void
assign_targets(rstate_t *rs, scope_t *sc, const char **names, int n, val_t v)
{
    vlist_t *items;

    if (n == 1) {
        scope_set(rs, sc, names[0], v);
        return;
    }
    items = as_items(rs, v, false);
    if ((int)items->n != n) {
        r_fail(rs, "cannot unpack %zu values into %d names", items->n, n);
    }
    for (int i = 0; i < n; i++) {
        scope_set(rs, sc, names[i], items->v[i]);
    }
}

static int
render_for(rstate_t *rs, const cnode_t *n, sbuf_t *out)
{
    val_t seq = eval(rs, n->a);
    vlist_t *items;
    scope_t *saved = rs->cur, *sc = scope_new(rs, saved);
    vloop_t *lp;
    val_t lv = {.t = V_LOOP};

    rs->cx->line = n->line;
    if (seq.t == V_NONE || seq.t == V_INT || seq.t == V_FLOAT || seq.t == V_BOOL) {
        r_fail(rs, "'%s' object is not iterable", type_name(seq));
    }
    items = as_items(rs, seq, true);
    if (n->b != NULL) { /* {% for x in xs if cond %}: filter first, loop.length counts kept */
        vlist_t *kept = list_new(rs->cx, items->n);

        rs->cur = sc;
        for (size_t i = 0; i < items->n; i++) {
            sc->n = 0;
            assign_targets(rs, sc, n->names, n->nnames, items->v[i]);
            if (truthy(eval(rs, n->b))) {
                list_push(rs->cx, kept, items->v[i]);
            }
        }
        rs->cur = saved;
        items = kept;
    }
    if (items->n == 0) {
        int fl;

        rs->cur = sc;
        sc->n = 0;
        fl = render_body(rs, n->kids2, n->nkids2, out);
        rs->cur = saved;
        return fl;
    }
    lp = ar_alloc(rs->cx, sizeof(*lp));
    lp->items = items;
    lp->depth = rs->loop_depth + 1;
    lv.u.loop = lp;
    rs->loop_depth++;
    rs->cur = sc;
    for (size_t i = 0; i < items->n; i++) {
        int fl;

        if (++rs->iterations > CHAT_MAX_ITERATIONS) {
            cx_fail(rs->cx, ST_ETOOLONG, "line %d: loop iteration limit exceeded", n->line);
        }
        lp->idx = i;
        sc->n = 0; /* every iteration starts from the enclosing scope */
        scope_set(rs, sc, "loop", lv);
        assign_targets(rs, sc, n->names, n->nnames, items->v[i]);
        fl = render_body(rs, n->kids, n->nkids, out);
        if (fl == FLOW_BREAK) {
            break;
        }
    }
    rs->loop_depth--;
    rs->cur = saved;
    return FLOW_NEXT;
}

static int render_stmts(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out);

static int
render_body(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out)
{
    int fl;

    if (++rs->eval_depth > CHAT_MAX_EVAL_DEPTH) {
        cx_fail(rs->cx, ST_ETOOLONG, "line %d: template evaluation nested too deeply",
                rs->cx->line);
    }
    fl = render_stmts(rs, body, nb, out);
    rs->eval_depth--;
    return fl;
}

static int
render_stmts(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out)
{
    for (int i = 0; i < nb; i++) {
        const cnode_t *n = body[i];
        int fl;

        rs->cx->line = n->line;
        switch (n->kind) {
        case N_TEXT:
            sb_add(rs->cx, out, n->val.u.s.p, n->val.u.s.n);
            break;
        case N_OUT:
            put_str(rs, out, eval(rs, n->a));
            break;
        case N_IF:
            if (truthy(eval(rs, n->a))) {
                fl = render_body(rs, n->kids, n->nkids, out);
            } else {
                fl = render_body(rs, n->kids2, n->nkids2, out);
            }
            if (fl != FLOW_NEXT) {
                return fl;
            }
            break;
        case N_FOR:
            render_for(rs, n, out);
            break;
        case N_SET:
            assign_targets(rs, rs->cur, n->names, n->nnames, eval(rs, n->a));
            break;
        case N_SETNS: {
            val_t ns = lookup(rs, n->name), v = eval(rs, n->a);

            rs->cx->line = n->line;
            if (ns.t != V_NS) {
                r_fail(rs, "cannot assign attribute on non-namespace object");
            }
            dict_set(rs->cx, ns.u.d, v_cstr(n->names[0]), v);
            break;
        }
        case N_SETBLOCK:
        case N_FILTERBLOCK: {
            sbuf_t b = {0};
            val_t v;

            render_body(rs, n->kids, n->nkids, &b);
            v = sb_val(&b);
            if (n->b != NULL) {
                v = apply_filter_node(rs, n->b, v);
            }
            if (n->kind == N_SETBLOCK) {
                assign_targets(rs, rs->cur, n->names, n->nnames, v);
            } else {
                put_str(rs, out, v);
            }
            break;
        }
        case N_MACRO: {
            val_t m = {.t = V_MACRO, .u.macro = n};

            scope_set(rs, rs->cur, n->name, m);
            break;
        }
        case N_BREAK:
        case N_CONTINUE:
            if (rs->loop_depth == 0) {
                r_fail(rs, "break or continue outside a loop");
            }
            return n->kind == N_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
        case N_BODY:
            fl = render_body(rs, n->kids, n->nkids, out);
            if (fl != FLOW_NEXT) {
                return fl;
            }
            break;
        default:
            r_fail(rs, "bad statement node");
        }
    }
    return FLOW_NEXT;
}

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
    char *norm = ar_alloc(cx, len + 1);
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
    lex_all(&lx);

    memset(&ps, 0, sizeof(ps));
    ps.cx = cx;
    ps.toks = lx.toks;
    parse_body(&ps, &body, NULL);
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
    arena_free(&t->ar);
    free(t);
}

static val_t
from_json(rstate_t *rs, const cJSON *j, int depth)
{
    cx_t *cx = rs->cx;

    if (depth > CHAT_MAX_DEPTH) {
        cx_fail(cx, ST_EINVAL, "extra_json nested too deeply");
    }
    if (cJSON_IsString(j)) {
        return v_cstr(ar_strndup(cx, j->valuestring, strlen(j->valuestring)));
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
        vlist_t *l = list_new(cx, 4);

        for (const cJSON *c = j->child; c != NULL; c = c->next) {
            list_push(cx, l, from_json(rs, c, depth + 1));
        }
        return v_list(l);
    }
    if (cJSON_IsObject(j)) {
        vdict_t *d = dict_new(cx);

        for (const cJSON *c = j->child; c != NULL; c = c->next) {
            dict_set(cx, d, v_cstr(ar_strndup(cx, c->string, strlen(c->string))),
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

    rs->root = scope_new(rs, NULL);
    rs->cur = rs->root;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        val_t f = {.t = V_FUNC, .u.i = fns[i].fn};
        scope_set(rs, rs->root, fns[i].name, f);
    }
    ml = list_new(cx, j->n);
    for (size_t i = 0; i < j->n; i++) {
        vdict_t *d = dict_new(cx);
        const chat_message_t *m = &j->msgs[i];

        dict_set(cx, d, v_cstr("role"), m->role ? v_cstr(m->role) : v_none);
        dict_set(cx, d, v_cstr("content"), m->content ? v_cstr(m->content) : v_none);
        list_push(cx, ml, v_dict(d));
    }
    scope_set(rs, rs->root, "messages", v_list(ml));
    if (opts->bos_token != NULL) {
        scope_set(rs, rs->root, "bos_token", v_cstr(opts->bos_token));
    }
    if (opts->eos_token != NULL) {
        scope_set(rs, rs->root, "eos_token", v_cstr(opts->eos_token));
    }
    scope_set(rs, rs->root, "add_generation_prompt", v_bool(opts->add_generation_prompt != 0));
    if (opts->extra_json != NULL) {
        j->extra = cJSON_Parse(opts->extra_json);
        if (j->extra == NULL || !cJSON_IsObject(j->extra)) {
            cx_fail(cx, ST_EINVAL, "extra_json is not a JSON object");
        }
        for (const cJSON *c = j->extra->child; c != NULL; c = c->next) {
            scope_set(rs, rs->root, ar_strndup(cx, c->string, strlen(c->string)),
                      from_json(rs, c, 0));
        }
    }
}

static int
render_run(rjob_t *j)
{
    if (setjmp(j->cx.jb) != 0) {
        tl_cx = NULL;
        return j->cx.status;
    }
    tl_cx = &j->cx;
    render_globals(j);
    render_body(&j->rs, j->t->body, j->t->nbody, &j->buf);
    tl_cx = NULL;
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
    arena_free(&j->ar);
    free(j);
    return rc;
}
