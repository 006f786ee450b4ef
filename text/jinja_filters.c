/* jinja_filters.c - the chat template built-ins applied with | and is:
 * the filters (trim, length, join, default, map, selectattr, dictsort,
 * tojson, ...) and the tests (defined, string, mapping, ...), plus tojson's
 * serializer (Python's json.dumps as HF's tojson filter calls it).
 *
 * DESIGN
 *   Each filter or test is a case of one dispatch on its name; jinja2's
 *   quirks are kept (map / select / unique give generators: errors deferred
 *   until iterated, not JSON serializable). An unknown name is a template
 *   error.
 *
 * Thread: the rendering thread.
 */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

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
        val_t s = chat__to_str(rs, k);
        json_str(cx, b, s.u.s.p, s.u.s.n, false);
        break;
    }
    default:
        chat__r_fail(rs, "keys must be str, int, float, bool or None, not %s", chat__type_name(k));
    }
}

static int
key_order(rstate_t *rs, val_t a, val_t b)
{
    return chat__val_cmp(rs, a, b);
}

static void
json_dump(rstate_t *rs, sbuf_t *b, val_t v, const jopts_t *o, int level)
{
    chat__charge(0);
    cx_t *cx = rs->cx;

    if (level > CHAT_MAX_DEPTH) {
        chat__r_fail(rs, "value nested too deeply for tojson");
    }
    switch (v.t) {
    case V_NONE:
        sb_puts(cx, b, "null");
        break;
    case V_BOOL:
        sb_puts(cx, b, v.u.i ? "true" : "false");
        break;
    case V_INT:
        chat__put_str(rs, b, v);
        break;
    case V_FLOAT:
        if (isnan(v.u.f)) {
            sb_puts(cx, b, "NaN");
        } else if (isinf(v.u.f)) {
            sb_puts(cx, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        } else {
            chat__fmt_float(cx, b, v.u.f);
        }
        break;
    case V_STR:
        json_str(cx, b, v.u.s.p, v.u.s.n, o->ensure_ascii);
        break;
    case V_LIST:
        if (v.u.l->gen || v.u.l->view) {
            chat__r_fail(rs, "Object of type %s is not JSON serializable",
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
        ord = chat__ar_alloc(cx, n * sizeof(size_t));
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
        chat__r_fail(rs, "Object of type %s is not JSON serializable", chat__type_name(v));
    }
}

/* ==== render: filters and tests ========================================== */

/* attribute path "a.b.0" of a value, jinja's make_attrgetter */
static val_t
attr_path(rstate_t *rs, val_t v, val_t path)
{
    const char *p, *end;

    if (path.t == V_INT) {
        return chat__get_item(rs, v, path);
    }
    chat__need_str(rs, path, "attribute");
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
        v = chat__get_item(rs, v, key);
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
        a = chat__str_case(rs, a, 'L');
        b = chat__str_case(rs, b, 'L');
    }
    return chat__val_cmp(rs, a, b);
}

/* Stable sort of items by keys (insertion sort into a merge: n log n). */
static void
sort_vals(rstate_t *rs, val_t *items, val_t *keys, size_t n, bool ci, bool reverse)
{
    val_t *ti, *tk;

    if (n < 2) {
        return;
    }
    ti = chat__ar_alloc(rs->cx, n * sizeof(val_t));
    tk = chat__ar_alloc(rs->cx, n * sizeof(val_t));
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
    vlist_t *l = chat__list_new(rs->cx, src->n);

    if (src->n) {
        memcpy(l->v, src->v, src->n * sizeof(val_t));
    }
    l->n = src->n;
    return v_list(l);
}

val_t
chat__html_escape(rstate_t *rs, val_t s)
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

/* select / reject / selectattr / rejectattr */
static val_t
filter_select(rstate_t *rs, val_t v, const cargs_t *a, bool by_attr, bool keep)
{
    /* jinja2 yields nothing for a falsy input (none included) */
    val_t poison;
    vlist_t *in = chat__truthy(v) ? chat__gen_input(rs, v, &poison) : chat__list_new(rs->cx, 0);
    vlist_t *out;
    int first = by_attr ? 1 : 0;

    if (in == NULL) {
        return poison;
    }
    out = chat__list_new(rs->cx, in->n);
    cargs_t ta = *a;
    val_t tname = arg(a, first, NULL, v_none);

    ta.pos = a->npos > first + 1 ? a->pos + first + 1 : NULL;
    ta.npos = a->npos > first + 1 ? a->npos - first - 1 : 0;
    for (size_t i = 0; i < in->n; i++) {
        val_t x = by_attr ? attr_path(rs, in->v[i], arg(a, 0, NULL, v_undef)) : in->v[i];
        bool ok;

        if (tname.t == V_NONE) {
            ok = chat__truthy(x);
        } else {
            char *tn =
                chat__ar_strndup(rs->cx, chat__need_str(rs, tname, "test name").u.s.p, tname.u.s.n);
            ok = chat__apply_test(rs, tn, x, &ta);
        }
        if (ok == keep) {
            chat__list_push(rs->cx, out, in->v[i]);
        }
    }
    out->gen = true;
    return v_list(out);
}

static val_t
filter_indent(rstate_t *rs, val_t s, const cargs_t *a)
{
    val_t w = arg(a, 0, "width", v_int(4));
    bool first = chat__truthy(arg(a, 1, "first", v_bool(false)));
    bool blank = chat__truthy(arg(a, 2, "blank", v_bool(false)));
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
        chat__r_fail(rs, "bad indent width");
    }
    {
        sbuf_t t = {0};

        chat__sb_add(rs->cx, &t, s.u.s.p, s.u.s.n);
        sb_putc(rs->cx, &t, '\n');
        lines = chat__call_str_method(rs, sb_val(&t), "splitlines", &none).u.l;
    }
    if (first) {
        chat__sb_add(rs->cx, &b, ind.p, ind.n);
    }
    for (size_t i = 0; i < lines->n; i++) {
        val_t ln = lines->v[i];

        if (i > 0) {
            sb_putc(rs->cx, &b, '\n');
            if (blank || ln.u.s.n > 0) {
                chat__sb_add(rs->cx, &b, ind.p, ind.n);
            }
        }
        chat__sb_add(rs->cx, &b, ln.u.s.p, ln.u.s.n);
    }
    return sb_val(&b);
}

val_t
chat__apply_filter(rstate_t *rs, const char *name, val_t v, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        bool boolean = chat__truthy(arg(a, 1, "boolean", v_bool(false)));

        if (v.t == V_UNDEF || (boolean && !chat__truthy(v))) {
            return arg(a, 0, "default_value", v_strn("", 0));
        }
        return v;
    }
    if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        return v_int(chat__py_len(rs, v));
    }
    if (strcmp(name, "string") == 0) {
        return chat__to_str(rs, v);
    }
    if (strcmp(name, "safe") == 0) {
        v = chat__to_str(rs, v);
        v.safe = true;
        return v;
    }
    if (strcmp(name, "tojson") == 0) {
        jopts_t o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        val_t ind = arg(a, 0, "indent", v_none), sep = arg(a, -1, "separators", v_none);
        sbuf_t b = {0}, is = {0};

        o.ensure_ascii = chat__truthy(arg(a, -1, "ensure_ascii", v_bool(false)));
        o.sort_keys = chat__truthy(arg(a, -1, "sort_keys", v_bool(false)));
        if (ind.t == V_INT) {
            if (ind.u.i > 1000) {
                chat__r_fail(rs, "indent too large");
            }
            for (int64_t k = 0; k < ind.u.i; k++) {
                sb_putc(cx, &is, ' ');
            }
            o.indent = (int)(ind.u.i < 0 ? 0 : ind.u.i);
        } else if (ind.t == V_STR) {
            chat__sb_add(cx, &is, ind.u.s.p, ind.u.s.n);
            o.indent = (int)ind.u.s.n;
        } else if (ind.t != V_NONE) {
            chat__r_fail(rs, "bad tojson indent");
        }
        o.indent_str = is.n ? is.p : "";
        if (o.indent >= 0) {
            o.item_sep = ",";
        }
        if (sep.t == V_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == V_STR &&
            sep.u.l->v[1].t == V_STR) {
            o.item_sep = chat__ar_strndup(cx, sep.u.l->v[0].u.s.p, sep.u.l->v[0].u.s.n);
            o.key_sep = chat__ar_strndup(cx, sep.u.l->v[1].u.s.p, sep.u.l->v[1].u.s.n);
        } else if (sep.t != V_NONE) {
            chat__r_fail(rs, "bad tojson separators");
        }
        json_dump(rs, &b, v, &o, 0);
        return sb_val(&b);
    }
    if (strcmp(name, "trim") == 0) {
        val_t ch = arg(a, 0, "chars", v_none);

        val_t r;

        v = chat__to_str(rs, v);
        if (ch.t != V_NONE) {
            chat__need_str(rs, ch, "trim chars");
        }
        r = chat__str_strip(v, ch.t == V_NONE ? NULL : &ch, true, true);
        r.safe = v.safe;
        return r;
    }
    if (strcmp(name, "upper") == 0 || strcmp(name, "lower") == 0 ||
        strcmp(name, "capitalize") == 0 || strcmp(name, "title") == 0) {
        int mode = name[0] == 'u' ? 'U' : name[0] == 'l' ? 'L' : name[0] == 'c' ? 'C' : 'T';
        return chat__str_case(rs, chat__to_str(rs, v), mode);
    }
    if (strcmp(name, "replace") == 0) {
        val_t c = arg(a, 2, "count", v_none);

        return chat__str_replace(
            rs, chat__to_str(rs, v), chat__to_str(rs, arg(a, 0, "old", v_undef)),
            chat__to_str(rs, arg(a, 1, "new", v_undef)), c.t == V_INT ? c.u.i : -1);
    }
    if (strcmp(name, "join") == 0) {
        val_t sep = chat__to_str(rs, arg(a, 0, "d", v_strn("", 0)));
        val_t at = arg(a, 1, "attribute", v_none);
        vlist_t *items = chat__as_items(rs, v, true);

        if (at.t != V_NONE) {
            vlist_t *m = chat__list_new(cx, items->n);

            for (size_t i = 0; i < items->n; i++) {
                chat__list_push(cx, m, attr_path(rs, items->v[i], at));
            }
            items = m;
        }
        return chat__str_join(rs, sep, items, true);
    }
    if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        vlist_t *items = chat__as_items(rs, v, true);

        if (name[0] == 'l' && v.t == V_LIST && v.u.l->gen) {
            chat__r_fail(rs, "'generator' object is not reversible");
        }
        if (items->n == 0) {
            return v_undef_named(NULL);
        }
        return name[0] == 'f' ? items->v[0] : items->v[items->n - 1];
    }
    if (strcmp(name, "list") == 0) {
        return list_copy(rs, chat__as_items(rs, v, true));
    }
    if (strcmp(name, "reverse") == 0) {
        if (v.t == V_STR) {
            val_t sl[3] = {v_none, v_none, v_int(-1)};
            return chat__do_slice(rs, v, sl);
        } else {
            vlist_t *in = chat__as_items(rs, v, true), *out = chat__list_new(cx, in->n);

            for (size_t i = in->n; i-- > 0;) {
                chat__list_push(cx, out, in->v[i]);
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
            char *s = chat__ar_strndup(cx, v.u.s.p, v.u.s.n), *end;
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
                chat__r_fail(rs, "integer overflow");
            }
            return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == V_FLOAT) {
            return v_float(fabs(v.u.f));
        }
        chat__r_fail(rs, "bad operand type for abs()");
    }
    if (strcmp(name, "items") == 0) {
        if (v.t == V_UNDEF) {
            vlist_t *e = chat__list_new(cx, 0);

            e->gen = true;
            return v_list(e);
        }
        if (v.t != V_DICT) {
            vlist_t *e = chat__list_new(cx, 0);

            e->gen = true;
            e->err = "items filter needs a mapping";
            return v_list(e);
        }
        {
            val_t r = chat__dict_items(rs, v.u.d, 'i');

            r.u.l->gen = true; /* jinja2's items filter is a generator */
            return r;
        }
    }
    if (strcmp(name, "dictsort") == 0) {
        bool cs = chat__truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t by = arg(a, 1, "by", v_cstr("key"));
        bool rev = chat__truthy(arg(a, 2, "reverse", v_bool(false)));
        val_t items;
        val_t *keys;
        int pos = str_eq(by, "value", 5) ? 1 : 0;

        if (v.t != V_DICT) {
            chat__r_fail(rs, "dictsort needs a mapping");
        }
        items = chat__dict_items(rs, v.u.d, 'i');
        keys = chat__ar_alloc(cx, (items.u.l->n + 1) * sizeof(val_t));
        for (size_t i = 0; i < items.u.l->n; i++) {
            keys[i] = items.u.l->v[i].u.l->v[pos];
        }
        sort_vals(rs, items.u.l->v, keys, items.u.l->n, !cs, rev);
        return items;
    }
    if (strcmp(name, "sort") == 0) {
        bool rev = chat__truthy(arg(a, 0, "reverse", v_bool(false)));
        bool cs = chat__truthy(arg(a, 1, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 2, "attribute", v_none);
        val_t out = list_copy(rs, chat__as_items(rs, v, true));
        val_t *keys = chat__ar_alloc(cx, (out.u.l->n + 1) * sizeof(val_t));

        for (size_t i = 0; i < out.u.l->n; i++) {
            keys[i] = at.t == V_NONE ? out.u.l->v[i] : attr_path(rs, out.u.l->v[i], at);
        }
        sort_vals(rs, out.u.l->v, keys, out.u.l->n, !cs, rev);
        return out;
    }
    if (strcmp(name, "unique") == 0) {
        bool cs = chat__truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 1, "attribute", v_none);
        val_t poison;
        vlist_t *in = chat__gen_input(rs, v, &poison), *out, *seen;

        if (in == NULL) {
            return poison;
        }
        out = chat__list_new(cx, in->n);
        seen = chat__list_new(cx, 8);

        for (size_t i = 0; i < in->n; i++) {
            val_t k = at.t == V_NONE ? in->v[i] : attr_path(rs, in->v[i], at);
            bool dup = false;

            if (!cs && k.t == V_STR) {
                k = chat__str_case(rs, k, 'L');
            }
            for (size_t j = 0; j < seen->n && !dup; j++) {
                dup = chat__val_eq(seen->v[j], k);
            }
            if (!dup) {
                chat__list_push(cx, seen, k);
                chat__list_push(cx, out, in->v[i]);
            }
        }
        out->gen = true;
        return v_list(out);
    }
    if (strcmp(name, "min") == 0 || strcmp(name, "max") == 0) {
        bool cs = chat__truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val_t at = arg(a, 1, "attribute", v_none);
        vlist_t *in = chat__as_items(rs, v, true);
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
        vlist_t *in = chat__as_items(rs, v, true);

        for (size_t i = 0; i < in->n; i++) {
            val_t x = at.t == V_NONE ? in->v[i] : attr_path(rs, in->v[i], at);

            if (!is_num(x) || !is_num(acc)) {
                chat__r_fail(rs, "sum needs numbers");
            }
            if (x.t == V_FLOAT || acc.t == V_FLOAT) {
                acc = v_float(num_f(acc) + num_f(x));
            } else if (__builtin_add_overflow(acc.u.i, x.u.i, &acc.u.i)) {
                chat__r_fail(rs, "integer overflow");
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
            chat__r_fail(rs, "bad round arguments");
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
        vlist_t *in = chat__truthy(v) ? chat__gen_input(rs, v, &poison) : chat__list_new(cx, 0);
        vlist_t *out;
        val_t at = arg(a, -1, "attribute", v_none);

        if (in == NULL) {
            return poison;
        }
        out = chat__list_new(cx, in->n);

        if (at.t != V_NONE) {
            val_t def = arg(a, -1, "default", v_undef);

            for (size_t i = 0; i < in->n; i++) {
                val_t x = attr_path(rs, in->v[i], at);
                chat__list_push(cx, out, x.t == V_UNDEF && def.t != V_UNDEF ? def : x);
            }
        } else {
            val_t fname = chat__need_str(rs, arg(a, 0, NULL, v_undef), "map filter name");
            char *fn = chat__ar_strndup(cx, fname.u.s.p, fname.u.s.n);
            cargs_t fa = *a;

            fa.pos = a->npos > 1 ? a->pos + 1 : NULL;
            fa.npos = a->npos > 1 ? a->npos - 1 : 0;
            for (size_t i = 0; i < in->n; i++) {
                chat__list_push(cx, out, chat__apply_filter(rs, fn, in->v[i], &fa));
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
        return filter_indent(rs, chat__need_str(rs, v, "indent input"),
                             a); /* s += "\n" in jinja2 */
    }
    if (strcmp(name, "escape") == 0 || strcmp(name, "e") == 0 || strcmp(name, "forceescape") == 0) {
        if (v.t == V_STR && v.safe && name[0] != 'f') {
            return v;
        }
        v = chat__html_escape(rs, chat__to_str(rs, v));
        v.safe = true;
        return v;
    }
    if (strcmp(name, "attr") == 0) {
        val_t at = chat__need_str(rs, arg(a, 0, NULL, v_undef), "attribute name");
        return chat__get_attr(rs, v, chat__ar_strndup(cx, at.u.s.p, at.u.s.n));
    }
    if (strcmp(name, "wordcount") == 0) {
        /* runs of \w (letters, digits, _; any non-ASCII byte counts as one) */
        val_t s = chat__to_str(rs, v);
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
        int64_t len = chat__py_len(rs, v = chat__to_str(rs, v)), pad, left;
        sbuf_t b = {0};

        if (w.t != V_INT || w.u.i > 10000) {
            chat__r_fail(rs, "bad center width");
        }
        pad = w.u.i - len;
        if (pad <= 0) {
            return v;
        }
        left = pad / 2 + (pad & w.u.i & 1);
        for (int64_t k = 0; k < left; k++) {
            sb_putc(cx, &b, ' ');
        }
        chat__sb_add(cx, &b, v.u.s.p, v.u.s.n);
        for (int64_t k = 0; k < pad - left; k++) {
            sb_putc(cx, &b, ' ');
        }
        return sb_val(&b);
    }
    chat__r_fail(rs, "no filter named '%s'", name);
}

bool
chat__apply_test(rstate_t *rs, const char *name, val_t v, const cargs_t *a)
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
        return chat__val_eq(v, x);
    }
    if (strcmp(name, "ne") == 0 || strcmp(name, "!=") == 0) {
        return !chat__val_eq(v, x);
    }
    if (strcmp(name, "lt") == 0 || strcmp(name, "lessthan") == 0) {
        return chat__val_cmp(rs, v, x) < 0;
    }
    if (strcmp(name, "le") == 0) {
        return chat__val_cmp(rs, v, x) <= 0;
    }
    if (strcmp(name, "gt") == 0 || strcmp(name, "greaterthan") == 0) {
        return chat__val_cmp(rs, v, x) > 0;
    }
    if (strcmp(name, "ge") == 0) {
        return chat__val_cmp(rs, v, x) >= 0;
    }
    if (strcmp(name, "in") == 0) {
        if (x.t == V_STR && v.t == V_STR) {
            return chat__memfind(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (x.t == V_LIST || x.t == V_DICT) {
            vlist_t *l = chat__as_items(rs, x, false);

            for (size_t i = 0; i < l->n; i++) {
                if (chat__val_eq(l->v[i], v)) {
                    return true;
                }
            }
            return false;
        }
        chat__r_fail(rs, "'in' test needs a container");
    }
    if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0) {
        /* value % 2 == 1 (or 0), Python modulo, floats included */
        return chat__val_eq(chat__arith(rs, '%', v, v_int(2)), v_int(name[0] == 'o' ? 1 : 0));
    }
    if (strcmp(name, "divisibleby") == 0) {
        return chat__val_eq(chat__arith(rs, '%', v, x), v_int(0));
    }
    if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        val_t s = chat__to_str(rs, v);
        cargs_t none = {0};

        return chat__truthy(
            chat__call_str_method(rs, s, name[0] == 'l' ? "islower" : "isupper", &none));
    }
    if (strcmp(name, "escaped") == 0) {
        return false;
    }
    chat__r_fail(rs, "no test named '%s'", name);
}
