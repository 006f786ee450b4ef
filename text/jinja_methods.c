/* jinja_methods.c - the chat template built-ins called as functions: the
 * str, dict and list methods (strip, split, replace, format, startswith,
 * items, get, ...) and the global functions (range, namespace, dict,
 * raise_exception, strftime_now).
 *
 * DESIGN
 *   Strings are UTF-8 and Python semantics count code points; every scan
 *   charges the render's work budget (chat__charge) up to where it
 *   stopped, so a loop over a long message stays linear. Upper / lower /
 *   title change ASCII letters only.
 *
 * Thread: the rendering thread.
 */

#include <ctype.h>
#include <stdlib.h>

#include "common/status.h"
#include "text/jinja_int.h"

/* ==== render: methods and global functions ================================= */

val_t
chat__need_str(rstate_t *rs, val_t v, const char *what)
{
    if (v.t != V_STR) {
        chat__r_fail(rs, "%s must be a string, not %s", what, chat__type_name(v));
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
val_t
chat__str_strip(val_t s, const val_t *chars, bool left, bool right)
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

const char *
chat__memfind(const char *h, size_t hn, const char *nd, size_t nn)
{
    /* Charges what was scanned, up to the match: replace / count / split
     * call this once per match, and charging the whole rest each time made
     * a linear loop look quadratic. */
    if (nn == 0) {
        chat__charge(0);
        return h;
    }
    for (size_t i = 0; i + nn <= hn; i++) {
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) {
            chat__charge(i + nn);
            return h + i;
        }
    }
    chat__charge(hn);
    return NULL;
}

static const char *
memrfind(const char *h, size_t hn, const char *nd, size_t nn)
{
    chat__charge(hn);
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

val_t
chat__str_replace(rstate_t *rs, val_t s, val_t old, val_t new, int64_t count)
{
    sbuf_t b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;

    if (old.u.s.n == 0) {
        chat__r_fail(rs, "replace with an empty pattern is not supported");
    }
    while (p < end && count != 0) {
        const char *f = chat__memfind(p, (size_t)(end - p), old.u.s.p, old.u.s.n);

        if (f == NULL) {
            break;
        }
        chat__sb_add(rs->cx, &b, p, (size_t)(f - p));
        chat__sb_add(rs->cx, &b, new.u.s.p, new.u.s.n);
        p = f + old.u.s.n;
        if (count > 0) {
            count--;
        }
    }
    chat__sb_add(rs->cx, &b, p, (size_t)(end - p));
    return sb_val(&b);
}

static val_t
str_split(rstate_t *rs, val_t s, val_t sep, int64_t maxsplit, bool from_right)
{
    cx_t *cx = rs->cx;
    vlist_t *l = chat__list_new(cx, 4);
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
                    chat__list_push(cx, l, v_strn(p + i, e - i));
                    break;
                }
                st = i;
                while (i < n && !u8_space_at(p, n, i, &k)) {
                    i++;
                }
                chat__list_push(cx, l, v_strn(p + st, i - st));
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

                chat__list_push(cx, l, v_strn(st, (size_t)(en - st)));
                for (size_t j = keep; j < all.u.l->n; j++) {
                    chat__list_push(cx, l, all.u.l->v[j]);
                }
                return v_list(l);
            }
        }
    }
    chat__need_str(rs, sep, "separator");
    if (sep.u.s.n == 0) {
        chat__r_fail(rs, "empty separator");
    }
    if (!from_right) {
        size_t i = 0;

        for (;;) {
            const char *f = (maxsplit >= 0 && (int64_t)l->n >= maxsplit)
                                ? NULL
                                : chat__memfind(p + i, n - i, sep.u.s.p, sep.u.s.n);
            if (f == NULL) {
                chat__list_push(cx, l, v_strn(p + i, n - i));
                break;
            }
            chat__list_push(cx, l, v_strn(p + i, (size_t)(f - (p + i))));
            i = (size_t)(f - p) + sep.u.s.n;
        }
        return v_list(l);
    }
    {
        size_t hi = n;
        vlist_t *rev = chat__list_new(cx, 4);

        for (;;) {
            const char *f = (maxsplit >= 0 && (int64_t)rev->n >= maxsplit)
                                ? NULL
                                : memrfind(p, hi, sep.u.s.p, sep.u.s.n);
            if (f == NULL) {
                chat__list_push(cx, rev, v_strn(p, hi));
                break;
            }
            chat__list_push(cx, rev, v_strn(f + sep.u.s.n, hi - (size_t)(f - p) - sep.u.s.n));
            hi = (size_t)(f - p);
        }
        for (size_t j = rev->n; j-- > 0;) {
            chat__list_push(cx, l, rev->v[j]);
        }
        return v_list(l);
    }
}

val_t
chat__str_case(rstate_t *rs, val_t s, int mode)
{
    char *o = chat__ar_alloc(rs->cx, s.u.s.n + 1);
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
    chat__need_str(rs, pre, suffix ? "endswith argument" : "startswith argument");
    if (pre.u.s.n > s.u.s.n) {
        return false;
    }
    return memcmp(suffix ? s.u.s.p + s.u.s.n - pre.u.s.n : s.u.s.p, pre.u.s.p, pre.u.s.n) == 0;
}

val_t
chat__str_join(rstate_t *rs, val_t sep, vlist_t *items, bool stringify)
{
    sbuf_t b = {0};

    for (size_t i = 0; i < items->n; i++) {
        val_t it = items->v[i];

        if (i) {
            chat__sb_add(rs->cx, &b, sep.u.s.p, sep.u.s.n);
        }
        if (!stringify && it.t != V_STR) {
            chat__r_fail(rs, "sequence item %zu: expected str instance, %s found", i,
                         chat__type_name(it));
        }
        chat__put_str(rs, &b, it);
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
                chat__r_fail(rs, "single '{' encountered in format string");
            }
            fe = q;
            conv = memchr(f, '!', (size_t)(q - f));
            if (memchr(f, ':', (size_t)(q - f)) != NULL) {
                chat__r_fail(rs, "format specs are not supported");
            }
            if (conv != NULL) {
                fe = conv;
            }
            if (fe == f) {
                v = arg(a, auto_idx++, NULL, v_undef);
                if (auto_idx > a->npos) {
                    chat__r_fail(rs, "format: not enough positional arguments");
                }
            } else if (isdigit((unsigned char)*f)) {
                int idx = atoi(f);

                if (idx >= a->npos) {
                    chat__r_fail(rs, "format: positional argument %d missing", idx);
                }
                v = a->pos[idx];
            } else {
                char *name = chat__ar_strndup(rs->cx, f, (size_t)(fe - f));

                v = arg(a, -1, name, v_undef);
                if (v.t == V_UNDEF) {
                    chat__r_fail(rs, "format: keyword argument '%s' missing", name);
                }
            }
            if (conv != NULL && conv + 1 < q && conv[1] == 'r') {
                chat__put_repr(rs, &b, v);
            } else {
                chat__put_str(rs, &b, v);
            }
            p = q + 1;
        } else if (*p == '}') {
            chat__r_fail(rs, "single '}' encountered in format string");
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

val_t
chat__call_str_method(rstate_t *rs, val_t s, const char *m, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    if (strcmp(m, "strip") == 0 || strcmp(m, "lstrip") == 0 || strcmp(m, "rstrip") == 0) {
        val_t ch = arg(a, 0, "chars", v_none);

        if (ch.t != V_NONE) {
            chat__need_str(rs, ch, "strip argument");
        }
        return chat__str_strip(s, ch.t == V_NONE ? NULL : &ch, m[0] != 'r', m[0] != 'l');
    }
    if (strcmp(m, "split") == 0 || strcmp(m, "rsplit") == 0) {
        val_t mx = arg(a, 1, "maxsplit", v_int(-1));

        if (mx.t != V_INT) {
            chat__r_fail(rs, "maxsplit must be an integer");
        }
        return str_split(rs, s, arg(a, 0, "sep", v_none), mx.u.i, m[0] == 'r');
    }
    if (strcmp(m, "splitlines") == 0) {
        vlist_t *l = chat__list_new(cx, 4);
        bool keep = chat__truthy(arg(a, 0, "keepends", v_bool(false)));
        size_t i = 0, st = 0;

        while (i < s.u.s.n) {
            char c = s.u.s.p[i];

            if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
                size_t e = i + 1;

                if (c == '\r' && e < s.u.s.n && s.u.s.p[e] == '\n') {
                    e++;
                }
                chat__list_push(cx, l, v_strn(s.u.s.p + st, (keep ? e : i) - st));
                st = i = e;
            } else {
                i++;
            }
        }
        if (st < s.u.s.n) {
            chat__list_push(cx, l, v_strn(s.u.s.p + st, s.u.s.n - st));
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
        return chat__str_case(rs, s, mode);
    }
    if (strcmp(m, "replace") == 0) {
        val_t c = arg(a, 2, "count", v_int(-1));

        return chat__str_replace(rs, s, chat__need_str(rs, arg(a, 0, "old", v_undef), "old"),
                                 chat__need_str(rs, arg(a, 1, "new", v_undef), "new"),
                                 c.t == V_INT ? c.u.i : -1);
    }
    if (strcmp(m, "find") == 0 || strcmp(m, "rfind") == 0 || strcmp(m, "index") == 0 ||
        strcmp(m, "count") == 0) {
        val_t sub = chat__need_str(rs, arg(a, 0, NULL, v_undef), "substring");
        const char *f;

        if (m[0] == 'c') {
            int64_t k = 0;
            const char *p = s.u.s.p, *end = p + s.u.s.n;

            if (sub.u.s.n == 0) {
                return v_int((int64_t)chat__u8_len(s.u.s.p, s.u.s.n) + 1);
            }
            while ((f = chat__memfind(p, (size_t)(end - p), sub.u.s.p, sub.u.s.n)) != NULL) {
                k++;
                p = f + sub.u.s.n;
            }
            return v_int(k);
        }
        f = m[0] == 'r' ? memrfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n)
                        : chat__memfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
        if (f == NULL) {
            if (m[0] == 'i') {
                chat__r_fail(rs, "substring not found");
            }
            return v_int(-1);
        }
        return v_int((int64_t)chat__u8_len(s.u.s.p, (size_t)(f - s.u.s.p)));
    }
    if (strcmp(m, "join") == 0) {
        return chat__str_join(rs, s, chat__as_items(rs, arg(a, 0, NULL, v_undef), false), false);
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
        val_t sep = chat__need_str(rs, arg(a, 0, NULL, v_undef), "separator");
        const char *f = m[0] == 'r' ? memrfind(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n)
                                    : chat__memfind(s.u.s.p, s.u.s.n, sep.u.s.p, sep.u.s.n);
        vlist_t *l = chat__list_new(cx, 3);

        l->tuple = true;
        if (sep.u.s.n == 0) {
            chat__r_fail(rs, "empty separator");
        }
        if (f == NULL) {
            val_t e = v_strn("", 0);

            chat__list_push(cx, l, m[0] == 'r' ? e : s);
            chat__list_push(cx, l, e);
            chat__list_push(cx, l, m[0] == 'r' ? s : e);
        } else {
            chat__list_push(cx, l, v_strn(s.u.s.p, (size_t)(f - s.u.s.p)));
            chat__list_push(cx, l, sep);
            chat__list_push(cx, l,
                            v_strn(f + sep.u.s.n, s.u.s.n - (size_t)(f - s.u.s.p) - sep.u.s.n));
        }
        return v_list(l);
    }
    if (strcmp(m, "removeprefix") == 0 || strcmp(m, "removesuffix") == 0) {
        val_t x = chat__need_str(rs, arg(a, 0, NULL, v_undef), "argument");
        bool suf = m[6] == 's';

        if (str_prefix_test(rs, s, x, suf)) {
            return v_strn(s.u.s.p + (suf ? 0 : x.u.s.n), s.u.s.n - x.u.s.n);
        }
        return s;
    }
    if (strcmp(m, "zfill") == 0) {
        val_t w = arg(a, 0, NULL, v_int(0));
        int64_t len = (int64_t)chat__u8_len(s.u.s.p, s.u.s.n);
        sbuf_t b = {0};
        size_t st = 0;

        if (w.t != V_INT || w.u.i > (int64_t)rs->cx->max_out) {
            chat__r_fail(rs, "bad zfill width");
        }
        if (s.u.s.n > 0 && (s.u.s.p[0] == '-' || s.u.s.p[0] == '+')) {
            sb_putc(cx, &b, s.u.s.p[0]);
            st = 1;
        }
        for (int64_t k = len; k < w.u.i; k++) {
            sb_putc(cx, &b, '0');
        }
        chat__sb_add(cx, &b, s.u.s.p + st, s.u.s.n - st);
        return sb_val(&b);
    }
    chat__r_fail(rs, "str has no method '%s'", m);
}

val_t
chat__dict_items(rstate_t *rs, vdict_t *d, int what)
{
    vlist_t *l = chat__list_new(rs->cx, d->n);

    for (size_t i = 0; i < d->n; i++) {
        if (what == 'k') {
            chat__list_push(rs->cx, l, d->k[i]);
        } else if (what == 'v') {
            chat__list_push(rs->cx, l, d->v[i]);
        } else {
            vlist_t *t = chat__list_new(rs->cx, 2);

            t->tuple = true;
            chat__list_push(rs->cx, t, d->k[i]);
            chat__list_push(rs->cx, t, d->v[i]);
            chat__list_push(rs->cx, l, v_list(t));
        }
    }
    return v_list(l);
}

/* dict.keys() / values() / items(): views print as dict_keys([...]), are
 * not subscriptable and not JSON serializable, as in Python */
static val_t
dict_view(rstate_t *rs, vdict_t *d, int what)
{
    val_t v = chat__dict_items(rs, d, what);

    v.u.l->view = (char)what;
    return v;
}

val_t
chat__call_method(rstate_t *rs, vmethod_t *m, const cargs_t *a)
{
    val_t self = m->self;

    if (self.t == V_STR) {
        return chat__call_str_method(rs, self, m->name, a);
    }
    if (self.t == V_DICT) {
        if (strcmp(m->name, "get") == 0) {
            val_t *p = chat__dict_find(self.u.d, arg(a, 0, "key", v_undef));
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
        chat__r_fail(rs, "access to method '%s' of dict is unsafe (immutable sandbox)", m->name);
    }
    if (self.t == V_LIST) {
        if (strcmp(m->name, "index") == 0 || strcmp(m->name, "count") == 0) {
            val_t x = arg(a, 0, NULL, v_undef);
            int64_t k = 0;

            for (size_t i = 0; i < self.u.l->n; i++) {
                if (chat__val_eq(self.u.l->v[i], x)) {
                    if (m->name[0] == 'i') {
                        return v_int((int64_t)i);
                    }
                    k++;
                }
            }
            if (m->name[0] == 'i') {
                chat__r_fail(rs, "value is not in list");
            }
            return v_int(k);
        }
        if (strcmp(m->name, "copy") == 0) {
            return self;
        }
        chat__r_fail(rs, "access to method '%s' of list is unsafe (immutable sandbox)", m->name);
    }
    if (self.t == V_LOOP && strcmp(m->name, "cycle") == 0) {
        if (a->npos == 0) {
            chat__r_fail(rs, "no items for cycling given");
        }
        return a->pos[self.u.loop->idx % (size_t)a->npos];
    }
    chat__r_fail(rs, "'%s' object has no method '%s'", chat__type_name(self), m->name);
}

val_t
chat__call_builtin(rstate_t *rs, int fn, const cargs_t *a)
{
    cx_t *cx = rs->cx;

    switch (fn) {
    case FN_RANGE: {
        int64_t start = 0, stop, step = 1;
        vlist_t *l;

        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_INT && a->pos[i].t != V_BOOL) {
                chat__r_fail(rs, "range() arguments must be integers");
            }
        }
        if (a->npos == 1) {
            stop = a->pos[0].u.i;
        } else if (a->npos == 2 || a->npos == 3) {
            start = a->pos[0].u.i;
            stop = a->pos[1].u.i;
            step = a->npos == 3 ? a->pos[2].u.i : 1;
        } else {
            chat__r_fail(rs, "range() takes 1 to 3 arguments");
        }
        if (step == 0) {
            chat__r_fail(rs, "range() step must not be zero");
        }
        l = chat__list_new(cx, 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l->n >= 100000) {
                chat__cx_fail(cx, ST_ETOOLONG, "line %d: range too large", cx->line);
            }
            chat__list_push(cx, l, v_int(i));
        }
        return v_list(l);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        vdict_t *d = chat__dict_new(cx);
        val_t v = {.t = fn == FN_NAMESPACE ? V_NS : V_DICT, .u.d = d};

        for (int i = 0; i < a->npos; i++) {
            if (a->pos[i].t != V_DICT && a->pos[i].t != V_NS) {
                chat__r_fail(rs, "%s() positional arguments must be mappings",
                             fn == FN_DICT ? "dict" : "namespace");
            }
            for (size_t k = 0; k < a->pos[i].u.d->n; k++) {
                chat__dict_set(cx, d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
            }
        }
        for (int i = 0; i < a->nkw; i++) {
            chat__dict_set(cx, d, v_cstr(a->kwn[i]), a->kwv[i]);
        }
        return v;
    }
    case FN_RAISE: {
        val_t m = chat__to_str(rs, arg(a, 0, NULL, v_strn("", 0)));

        chat__cx_fail(cx, ST_EFORMAT, "%.*s", (int)(m.u.s.n > 200 ? 200 : m.u.s.n), m.u.s.p);
    }
    case FN_STRFTIME: {
        val_t f = chat__need_str(rs, arg(a, 0, NULL, v_undef), "strftime_now format");
        char buf[256];
        struct tm tm;
        size_t n;

        if (localtime_r(&rs->now, &tm) == NULL) {
            chat__r_fail(rs, "bad time");
        }
        n = strftime(buf, sizeof(buf), chat__ar_strndup(cx, f.u.s.p, f.u.s.n), &tm);
        return v_strn(chat__ar_strndup(cx, buf, n), n);
    }
    default:
        chat__r_fail(rs, "unknown function");
    }
}
