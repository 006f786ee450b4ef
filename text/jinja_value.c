/* jinja_value.c - the chat template interpreter's memory and values:
 * arenas and the error exit, lists and dicts, bounded string buffers, and
 * the Python semantics every other stage shares (truthiness, str() and
 * repr(), equality and ordering, len(), code-point indexing and slicing,
 * iteration).
 *
 * DESIGN
 *   Every value lives in the arena of the compile or render that made it
 *   and is never freed on its own, so values are shared freely. Each bound
 *   (arena bytes, string length, work units) fails through chat__cx_fail
 *   with ST_ETOOLONG instead of crashing or hanging on a hostile template.
 *
 * Thread: one compile or render per thread; chat__tl_cx names it.
 */

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "text/jinja_int.h"

/* ==== errors and arenas ================================================== */

_Noreturn void
chat__cx_fail(cx_t *cx, int status, const char *fmt, ...)
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
_Thread_local cx_t *chat__tl_cx;

/* Counts n units of work; a render that scans or compares more than
 * CHAT_MAX_WORK units in total (quadratic loops over big inputs) fails
 * with ST_ETOOLONG instead of hanging the thread. */
void
chat__charge(size_t n)
{
    cx_t *cx = chat__tl_cx;

    if (cx != NULL && (cx->work += (long)(n + 1)) > CHAT_MAX_WORK) {
        chat__cx_fail(cx, ST_ETOOLONG, "line %d: template work limit exceeded", cx->line);
    }
}

void
chat__arena_free(arena_t *a)
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

void *
chat__ar_alloc(cx_t *cx, size_t n)
{
    arena_t *a = cx->ar;
    ablk_t *b = a->head;

    n = (n + 15) & ~(size_t)15;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;

        if (a->total + cap > a->limit) {
            chat__cx_fail(cx, ST_ETOOLONG, "template memory limit exceeded");
        }
        b = a->fallible ? xmalloc_try(sizeof(*b) + cap) : malloc(sizeof(*b) + cap);
        if (b == NULL) {
            chat__cx_fail(cx, ST_ENOMEM, "out of memory");
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

char *
chat__ar_strndup(cx_t *cx, const char *s, size_t n)
{
    char *p = chat__ar_alloc(cx, n + 1);

    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ==== values ============================================================= */

vlist_t *
chat__list_new(cx_t *cx, size_t cap)
{
    vlist_t *l = chat__ar_alloc(cx, sizeof(*l));

    l->n = 0;
    l->cap = cap;
    l->tuple = false;
    l->gen = false;
    l->err = NULL;
    l->view = 0;
    l->v = cap ? chat__ar_alloc(cx, cap * sizeof(val_t)) : NULL;
    return l;
}

void
chat__list_push(cx_t *cx, vlist_t *l, val_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        val_t *nv = chat__ar_alloc(cx, cap * sizeof(val_t));

        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof(val_t));
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

vdict_t *
chat__dict_new(cx_t *cx)
{
    vdict_t *d = chat__ar_alloc(cx, sizeof(*d));

    memset(d, 0, sizeof(*d));
    return d;
}

/* Hash consistent with chat__val_eq: 1 == 1.0 == true hash alike. false when the
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

val_t *
chat__dict_find(const vdict_t *d, val_t key)
{
    uint64_t h;

    if (d->idx != NULL && val_hash(key, &h)) {
        for (size_t j = h & (d->idx_cap - 1);; j = (j + 1) & (d->idx_cap - 1)) {
            uint32_t e = d->idx[j];

            if (e == UINT32_MAX) {
                return NULL;
            }
            if (chat__val_eq(d->k[e], key)) {
                return &d->v[e];
            }
        }
    }
    chat__charge(d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (chat__val_eq(d->k[i], key)) {
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

val_t *
chat__dict_find_str(const vdict_t *d, const char *s)
{
    return chat__dict_find(d, v_strn(s, strlen(s)));
}

void
chat__dict_set(cx_t *cx, vdict_t *d, val_t key, val_t v)
{
    val_t *slot = chat__dict_find(d, key);

    if (slot != NULL) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        val_t *nk = chat__ar_alloc(cx, cap * sizeof(val_t));
        val_t *nv = chat__ar_alloc(cx, cap * sizeof(val_t));

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
            d->idx = chat__ar_alloc(cx, cap * sizeof(uint32_t));
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

static void
sb_reserve(cx_t *cx, sbuf_t *b, size_t extra)
{
    if (b->n + extra > cx->max_out) {
        chat__cx_fail(cx, ST_ETOOLONG, "template output limit exceeded");
    }
    if (b->n + extra + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        char *np;

        while (cap < b->n + extra + 1) {
            cap *= 2;
        }
        np = chat__ar_alloc(cx, cap);
        if (b->n) {
            memcpy(np, b->p, b->n);
        }
        b->p = np;
        b->cap = cap;
    }
}

void
chat__sb_add(cx_t *cx, sbuf_t *b, const char *s, size_t n)
{
    if (n == 0) {
        return;
    }
    sb_reserve(cx, b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* ==== render: value helpers =============================================== */

const char *
chat__type_name(val_t v)
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

_Noreturn void
chat__r_fail(rstate_t *rs, const char *fmt, ...)
{
    va_list ap;
    char msg[200];

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    chat__cx_fail(rs->cx, ST_EFORMAT, "line %d: %s", rs->cx->line, msg);
}

_Noreturn void
chat__r_undefined(rstate_t *rs, val_t v)
{
    if (v.u.s.p != NULL) {
        chat__r_fail(rs, "'%s' is undefined", v.u.s.p);
    }
    chat__r_fail(rs, "value is undefined");
}

bool
chat__truthy(val_t v)
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

/* Python's repr() of a float: the shortest string that reads back. */
void
chat__fmt_float(cx_t *cx, sbuf_t *b, double f)
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
            chat__sb_add(cx, b, digits + 1, (size_t)nd - 1);
        }
        snprintf(buf, sizeof(buf), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        sb_puts(cx, b, buf);
    } else if (exp10 < 0) {
        sb_puts(cx, b, "0.");
        for (int k = 0; k < -exp10 - 1; k++) {
            sb_putc(cx, b, '0');
        }
        chat__sb_add(cx, b, digits, (size_t)nd);
    } else {
        for (int k = 0; k <= exp10; k++) {
            sb_putc(cx, b, k < nd ? digits[k] : '0');
        }
        sb_putc(cx, b, '.');
        if (nd > exp10 + 1) {
            chat__sb_add(cx, b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        } else {
            sb_putc(cx, b, '0');
        }
    }
}

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
void
chat__put_repr(rstate_t *rs, sbuf_t *b, val_t v)
{
    cx_t *cx = rs->cx;

    chat__charge(0);
    if (++rs->call_depth > CHAT_MAX_DEPTH) {
        chat__r_fail(rs, "value nested too deeply");
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
                                         : "chat__dict_items(");
        }
        sb_putc(cx, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) {
                sb_puts(cx, b, ", ");
            }
            chat__put_repr(rs, b, v.u.l->v[i]);
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
            chat__put_repr(rs, b, v.u.d->k[i]);
            sb_puts(cx, b, ": ");
            chat__put_repr(rs, b, v.u.d->v[i]);
        }
        sb_putc(cx, b, '}');
        if (v.t == V_NS) {
            sb_putc(cx, b, '>');
        }
        break;
    default:
        chat__put_str(rs, b, v);
    }
    rs->call_depth--;
}

/* Python str() */
void
chat__put_str(rstate_t *rs, sbuf_t *b, val_t v)
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
        chat__fmt_float(cx, b, v.u.f);
        break;
    case V_STR:
        chat__sb_add(cx, b, v.u.s.p, v.u.s.n);
        break;
    case V_LIST:
    case V_DICT:
    case V_NS:
        chat__put_repr(rs, b, v);
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

val_t
chat__to_str(rstate_t *rs, val_t v)
{
    sbuf_t b = {0};

    if (v.t == V_STR) {
        return v;
    }
    chat__put_str(rs, &b, v);
    return sb_val(&b);
}

bool
chat__val_eq(val_t a, val_t b)
{
    chat__charge(0);
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
            if (!chat__val_eq(a.u.l->v[i], b.u.l->v[i])) {
                return false;
            }
        }
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) {
            return false;
        }
        for (size_t i = 0; i < a.u.d->n; i++) {
            val_t *o = chat__dict_find(b.u.d, a.u.d->k[i]);
            if (o == NULL || !chat__val_eq(a.u.d->v[i], *o)) {
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
int
chat__val_cmp(rstate_t *rs, val_t a, val_t b)
{
    chat__charge(0);
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
            if (!chat__val_eq(a.u.l->v[i], b.u.l->v[i])) {
                return chat__val_cmp(rs, a.u.l->v[i], b.u.l->v[i]);
            }
        }
        return a.u.l->n < b.u.l->n ? -1 : (a.u.l->n > b.u.l->n ? 1 : 0);
    }
    chat__r_fail(rs, "'<' not supported between '%s' and '%s'", chat__type_name(a),
                 chat__type_name(b));
}

/* ---- UTF-8 code point helpers (Python indexes strings by code point) ---- */

size_t
chat__u8_len(const char *p, size_t n)
{
    chat__charge(n / 8);
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        k += ((unsigned char)p[i] & 0xc0) != 0x80;
    }
    return k;
}

/* byte offset of code point idx (idx <= length) */
size_t
chat__u8_off(const char *p, size_t n, size_t idx)
{
    chat__charge(idx / 8);
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
vlist_t *
chat__as_items(rstate_t *rs, val_t v, bool undef_ok)
{
    cx_t *cx = rs->cx;

    chat__charge(v.t == V_LIST ? v.u.l->n : (v.t == V_DICT ? v.u.d->n : 0));
    switch (v.t) {
    case V_LIST:
        if (v.u.l->err != NULL) {
            chat__r_fail(rs, "%s", v.u.l->err);
        }
        return v.u.l;
    case V_DICT: {
        vlist_t *l = chat__list_new(cx, v.u.d->n);

        for (size_t i = 0; i < v.u.d->n; i++) {
            chat__list_push(cx, l, v.u.d->k[i]);
        }
        return l;
    }
    case V_STR: {
        vlist_t *l = chat__list_new(cx, v.u.s.n);
        size_t i = 0;

        while (i < v.u.s.n) {
            size_t j = i + 1;

            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xc0) == 0x80) {
                j++;
            }
            chat__list_push(cx, l, v_strn(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    case V_UNDEF:
        if (undef_ok) {
            return chat__list_new(cx, 0);
        }
        chat__r_undefined(rs, v);
    default:
        chat__r_fail(rs, "'%s' object is not iterable", chat__type_name(v));
    }
}

/* Input of a filter that jinja2 runs as a generator: a value that cannot be
 * iterated only fails when the generator is consumed, so the error is
 * deferred into a poisoned generator (*poison set, NULL returned). */
vlist_t *
chat__gen_input(rstate_t *rs, val_t v, val_t *poison)
{
    vlist_t *l;
    char *msg;

    if (v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF) {
        if (v.t == V_LIST && v.u.l->err != NULL) {
            *poison = v;
            return NULL;
        }
        return chat__as_items(rs, v, true);
    }
    l = chat__list_new(rs->cx, 0);
    msg = chat__ar_alloc(rs->cx, 64);
    snprintf(msg, 64, "'%s' object is not iterable", chat__type_name(v));
    l->gen = true;
    l->err = msg;
    *poison = v_list(l);
    return NULL;
}

int64_t
chat__py_len(rstate_t *rs, val_t v)
{
    switch (v.t) {
    case V_STR:
        return (int64_t)chat__u8_len(v.u.s.p, v.u.s.n);
    case V_LIST:
        if (v.u.l->gen) {
            chat__r_fail(rs, "object of type 'generator' has no len()");
        }
        return (int64_t)v.u.l->n;
    case V_DICT:
        return (int64_t)v.u.d->n;
    case V_UNDEF:
        return 0;
    default:
        chat__r_fail(rs, "object of type '%s' has no len()", chat__type_name(v));
    }
}

/* Python slice bounds for length n */
static void
slice_bounds(rstate_t *rs, int64_t n, val_t *sv, int64_t *start, int64_t *stop, int64_t *step)
{
    int64_t st = 1, lo, hi;

    if (sv[2].t != V_NONE) {
        if (sv[2].t != V_INT && sv[2].t != V_BOOL) {
            chat__r_fail(rs, "slice indices must be integers");
        }
        st = sv[2].u.i;
        if (st == 0) {
            chat__r_fail(rs, "slice step cannot be zero");
        }
    }
    for (int k = 0; k < 2; k++) {
        if (sv[k].t != V_NONE && sv[k].t != V_INT && sv[k].t != V_BOOL) {
            chat__r_fail(rs, "slice indices must be integers");
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

val_t
chat__do_slice(rstate_t *rs, val_t obj, val_t *sv)
{
    cx_t *cx = rs->cx;
    int64_t start, stop, step;

    if (obj.t == V_UNDEF) {
        chat__r_undefined(rs, obj);
    }
    if (obj.t == V_LIST && (obj.u.l->gen || obj.u.l->view)) {
        return v_undef_named(NULL); /* not subscriptable: jinja2 gives undefined */
    }
    if (obj.t == V_STR) {
        vlist_t *cps = chat__as_items(rs, obj, false);
        sbuf_t b = {0};

        slice_bounds(rs, (int64_t)cps->n, sv, &start, &stop, &step);
        if (step == 1) {
            size_t o1, o2;

            if (stop <= start) {
                return v_strn("", 0);
            }
            o1 = chat__u8_off(obj.u.s.p, obj.u.s.n, (size_t)start);
            o2 = chat__u8_off(obj.u.s.p, obj.u.s.n, (size_t)stop);
            return v_strn(obj.u.s.p + o1, o2 - o1);
        }
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            chat__sb_add(cx, &b, cps->v[i].u.s.p, cps->v[i].u.s.n);
        }
        return sb_val(&b);
    }
    if (obj.t == V_LIST) {
        vlist_t *l = chat__list_new(cx, 0);

        slice_bounds(rs, (int64_t)obj.u.l->n, sv, &start, &stop, &step);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            chat__list_push(cx, l, obj.u.l->v[i]);
        }
        l->tuple = obj.u.l->tuple;
        return v_list(l);
    }
    chat__r_fail(rs, "'%s' object is not subscriptable", chat__type_name(obj));
}
