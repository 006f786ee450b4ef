/* jinja_eval.c - the chat template evaluator: walks the tree, evaluating
 * expressions and rendering statements into the output buffer.
 *
 * DESIGN
 *   Scopes are a chain of small name -> value tables (a macro call or a
 *   for loop pushes one; namespace() objects are the only mutable values).
 *   Attribute and item access follow jinja2's sandbox (getattr falls back
 *   to getitem and back; a missing one is undefined, which fails only when
 *   used). Evaluation depth, macro call depth and loop iterations are
 *   bounded (CHAT_MAX_EVAL_DEPTH, CHAT_MAX_CALL_DEPTH, CHAT_MAX_ITERATIONS).
 *
 * Thread: the rendering thread; the tree is read-only.
 */

#include <ctype.h>
#include <math.h>

#include "common/status.h"
#include "text/jinja_int.h"

static val_t eval(rstate_t *rs, const cnode_t *n);

/* ==== render: scopes, attributes, items ==================================== */

scope_t *
chat__scope_new(rstate_t *rs, scope_t *parent)
{
    scope_t *s = chat__ar_alloc(rs->cx, sizeof(*s));

    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

void
chat__scope_set(rstate_t *rs, scope_t *s, const char *name, val_t v)
{
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = chat__ar_alloc(rs->cx, (size_t)cap * sizeof(*nn));
        val_t *nv = chat__ar_alloc(rs->cx, (size_t)cap * sizeof(*nv));

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
    vmethod_t *m = chat__ar_alloc(rs->cx, sizeof(*m));
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

val_t
chat__get_attr(rstate_t *rs, val_t obj, const char *name)
{
    switch (obj.t) {
    case V_UNDEF:
        chat__r_undefined(rs, obj);
    case V_DICT: {
        val_t *p;

        if (name_in(name, dict_methods)) {
            return v_method(rs, obj, name);
        }
        p = chat__dict_find_str(obj.u.d, name);
        return p ? *p : v_undef_named(name);
    }
    case V_NS: {
        val_t *p = chat__dict_find_str(obj.u.d, name);
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

val_t
chat__get_item(rstate_t *rs, val_t obj, val_t key)
{
    switch (obj.t) {
    case V_UNDEF:
        chat__r_undefined(rs, obj);
    case V_DICT:
    case V_NS: {
        val_t *p = chat__dict_find(obj.u.d, key);

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
            int64_t n = chat__py_len(rs, obj), i = key.u.i;

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
                size_t o1 = chat__u8_off(obj.u.s.p, obj.u.s.n, (size_t)i);
                size_t o2 = chat__u8_off(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
                return v_strn(obj.u.s.p + o1, o2 - o1);
            }
        }
        break;
    default:
        break;
    }
    if (key.t == V_STR && obj.t != V_NS) {
        return chat__get_attr(rs, obj, chat__ar_strndup(rs->cx, key.u.s.p, key.u.s.n));
    }
    return v_undef_named(NULL);
}

/* ==== render: calls (macros, callable values, arguments) ================== */

static val_t
call_macro(rstate_t *rs, const cnode_t *mac, const cargs_t *a)
{
    scope_t *saved = rs->cur, *sc;
    sbuf_t out = {0};
    int saved_loops = rs->loop_depth;

    if (a->npos > mac->nnames) {
        chat__r_fail(rs, "macro '%s' takes not more than %d argument(s)", mac->name, mac->nnames);
    }
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;

        for (int i = 0; i < mac->nnames; i++) {
            known |= strcmp(a->kwn[k], mac->names[i]) == 0;
        }
        if (!known) {
            chat__r_fail(rs, "macro '%s' takes no keyword argument '%s'", mac->name, a->kwn[k]);
        }
    }
    if (++rs->call_depth > CHAT_MAX_CALL_DEPTH) {
        chat__cx_fail(rs->cx, ST_ETOOLONG, "line %d: macro calls nested too deeply", rs->cx->line);
    }
    sc = chat__scope_new(rs, rs->root);
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
        chat__scope_set(rs, sc, mac->names[i], v);
    }
    rs->loop_depth = 0;
    chat__render_body(rs, mac->kids, mac->nkids, &out);
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
        return chat__call_builtin(rs, (int)f.u.i, a);
    case V_METHOD:
        return chat__call_method(rs, f.u.m, a);
    case V_UNDEF:
        chat__r_undefined(rs, f);
    default:
        chat__r_fail(rs, "'%s' object is not callable", chat__type_name(f));
    }
}

/* Evaluates a call-like node's arguments (kids, names/kids2). */
static void
eval_args(rstate_t *rs, const cnode_t *n, cargs_t *a)
{
    a->npos = n->nkids;
    a->nkw = n->nkids2;
    a->pos = n->nkids ? chat__ar_alloc(rs->cx, (size_t)n->nkids * sizeof(val_t)) : NULL;
    a->kwv = n->nkids2 ? chat__ar_alloc(rs->cx, (size_t)n->nkids2 * sizeof(val_t)) : NULL;
    a->kwn = n->names;
    for (int i = 0; i < n->nkids; i++) {
        a->pos[i] = eval(rs, n->kids[i]);
    }
    for (int i = 0; i < n->nkids2; i++) {
        a->kwv[i] = eval(rs, n->kids2[i]);
    }
}

/* ==== render: expressions ================================================= */

val_t
chat__arith(rstate_t *rs, int op, val_t a, val_t b)
{
    cx_t *cx = rs->cx;

    if (a.t == V_UNDEF) {
        chat__r_undefined(rs, a);
    }
    if (b.t == V_UNDEF) {
        chat__r_undefined(rs, b);
    }
    if (op == '+' && a.t == V_STR && b.t == V_STR) {
        sbuf_t s = {0};
        val_t r;
        bool safe = a.safe || b.safe;

        /* Markup + str escapes the str (markupsafe), the result is Markup */
        if (safe && !a.safe) {
            a = chat__html_escape(rs, a);
        }
        if (safe && !b.safe) {
            b = chat__html_escape(rs, b);
        }
        chat__sb_add(cx, &s, a.u.s.p, a.u.s.n);
        chat__sb_add(cx, &s, b.u.s.p, b.u.s.n);
        r = sb_val(&s);
        r.safe = safe;
        return r;
    }
    if (op == '+' && a.t == V_LIST && b.t == V_LIST) {
        vlist_t *l = chat__list_new(cx, a.u.l->n + b.u.l->n);

        for (size_t i = 0; i < a.u.l->n; i++) {
            chat__list_push(cx, l, a.u.l->v[i]);
        }
        for (size_t i = 0; i < b.u.l->n; i++) {
            chat__list_push(cx, l, b.u.l->v[i]);
        }
        l->tuple = a.u.l->tuple;
        return v_list(l);
    }
    if (op == '*' && ((a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL))) {
        int64_t k = b.u.i < 0 ? 0 : b.u.i;

        if (a.t == V_STR) {
            sbuf_t s = {0};

            if (a.u.s.n > 0 && (uint64_t)k > cx->max_out / a.u.s.n) {
                chat__cx_fail(cx, ST_ETOOLONG, "line %d: string repetition too large", cx->line);
            }
            for (int64_t i = 0; i < k; i++) {
                chat__sb_add(cx, &s, a.u.s.p, a.u.s.n);
            }
            return sb_val(&s);
        } else {
            vlist_t *l = chat__list_new(cx, 0);

            if (a.u.l->n > 0 && (uint64_t)k > 100000 / a.u.l->n) {
                chat__cx_fail(cx, ST_ETOOLONG, "line %d: list repetition too large", cx->line);
            }
            for (int64_t i = 0; i < k; i++) {
                for (size_t j = 0; j < a.u.l->n; j++) {
                    chat__list_push(cx, l, a.u.l->v[j]);
                }
            }
            return v_list(l);
        }
    }
    if (op == '*' && (b.t == V_STR || b.t == V_LIST) && (a.t == V_INT || a.t == V_BOOL)) {
        return chat__arith(rs, op, b, a);
    }
    if (!is_num(a) || !is_num(b)) {
        chat__r_fail(rs, "unsupported operand types for %c: '%s' and '%s'", op == 'F' ? '/' : op,
                     chat__type_name(a), chat__type_name(b));
    }
    if (a.t != V_FLOAT && b.t != V_FLOAT && op != '/') {
        int64_t x = a.u.i, y = b.u.i, r;

        switch (op) {
        case '+':
            if (__builtin_add_overflow(x, y, &r)) {
                chat__r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case '-':
            if (__builtin_sub_overflow(x, y, &r)) {
                chat__r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case '*':
            if (__builtin_mul_overflow(x, y, &r)) {
                chat__r_fail(rs, "integer overflow");
            }
            return v_int(r);
        case 'F':
        case '%':
            if (y == 0) {
                chat__r_fail(rs, "integer division or modulo by zero");
            }
            if (x == INT64_MIN && y == -1) {
                chat__r_fail(rs, "integer overflow");
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
                    chat__r_fail(rs, "integer overflow");
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
                chat__r_fail(rs, "division by zero");
            }
            return v_float(x / y);
        case 'F':
            if (y == 0) {
                chat__r_fail(rs, "float floor division by zero");
            }
            return v_float(floor(x / y));
        case '%': {
            double m;

            if (y == 0) {
                chat__r_fail(rs, "float modulo");
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
            chat__r_fail(rs, "bad operator");
        }
    }
}

static bool
contains(rstate_t *rs, val_t needle, val_t hay)
{
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) {
            chat__r_fail(rs, "'in <string>' requires string as left operand, not %s",
                         chat__type_name(needle));
        }
        return chat__memfind(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++) {
            if (chat__val_eq(hay.u.l->v[i], needle)) {
                return true;
            }
        }
        return false;
    case V_DICT:
        if ((needle.t == V_LIST && !needle.u.l->tuple) || needle.t == V_DICT || needle.t == V_NS) {
            chat__r_fail(rs, "unhashable type: '%s'", chat__type_name(needle));
        }
        return chat__dict_find(hay.u.d, needle) != NULL;
    case V_UNDEF:
        return false;
    default:
        chat__r_fail(rs, "argument of type '%s' is not iterable", chat__type_name(hay));
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
    return chat__apply_filter(rs, n->name, v, &a);
}

static val_t eval_node(rstate_t *rs, const cnode_t *n);

/* Every expression and statement level goes through here or chat__render_body:
 * the depth bound keeps a hostile template (deep nesting inside recursive
 * macros) well inside the C stack, about 1 KiB per level. */
static val_t
eval(rstate_t *rs, const cnode_t *n)
{
    val_t v;

    if (++rs->eval_depth > CHAT_MAX_EVAL_DEPTH) {
        chat__cx_fail(rs->cx, ST_ETOOLONG, "line %d: template evaluation nested too deeply",
                      n->line);
    }
    chat__charge(0);
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
        return chat__get_attr(rs, o, n->name);
    }
    case E_ITEM: {
        val_t o = eval(rs, n->a), k = eval(rs, n->b);

        cx->line = n->line;
        return chat__get_item(rs, o, k);
    }
    case E_SLICE: {
        val_t o = eval(rs, n->a), sv[3];

        for (int i = 0; i < 3; i++) {
            sv[i] = n->kids[i] ? eval(rs, n->kids[i]) : v_none;
        }
        cx->line = n->line;
        return chat__do_slice(rs, o, sv);
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
        return chat__apply_filter(rs, n->name, v, &a);
    }
    case E_TEST: {
        val_t v = eval(rs, n->a);
        cargs_t a;

        eval_args(rs, n, &a);
        cx->line = n->line;
        return v_bool(chat__apply_test(rs, n->name, v, &a));
    }
    case E_NEG:
    case E_POS: {
        val_t v = eval(rs, n->a);

        if (v.t == V_INT || v.t == V_BOOL) {
            if (n->kind == E_NEG && v.u.i == INT64_MIN) {
                chat__r_fail(rs, "integer overflow");
            }
            return v_int(n->kind == E_NEG ? -v.u.i : v.u.i);
        }
        if (v.t == V_FLOAT) {
            return v_float(n->kind == E_NEG ? -v.u.f : v.u.f);
        }
        if (v.t == V_UNDEF) {
            chat__r_undefined(rs, v);
        }
        chat__r_fail(rs, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
                     chat__type_name(v));
    }
    case E_NOT:
        return v_bool(!chat__truthy(eval(rs, n->a)));
    case E_AND: {
        val_t l = eval(rs, n->a);
        return chat__truthy(l) ? eval(rs, n->b) : l;
    }
    case E_OR: {
        val_t l = eval(rs, n->a);
        return chat__truthy(l) ? l : eval(rs, n->b);
    }
    case E_BIN: {
        val_t l = eval(rs, n->a), r = eval(rs, n->b);

        cx->line = n->line;
        return chat__arith(rs, n->op, l, r);
    }
    case E_CONCAT: {
        sbuf_t b = {0};

        for (int i = 0; i < n->nkids; i++) {
            chat__put_str(rs, &b, eval(rs, n->kids[i]));
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
                ok = chat__val_eq(l, r);
                break;
            case CMP_NE:
                ok = !chat__val_eq(l, r);
                break;
            case CMP_LT:
                ok = chat__val_cmp(rs, l, r) < 0;
                break;
            case CMP_LE:
                ok = chat__val_cmp(rs, l, r) <= 0;
                break;
            case CMP_GT:
                ok = chat__val_cmp(rs, l, r) > 0;
                break;
            case CMP_GE:
                ok = chat__val_cmp(rs, l, r) >= 0;
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
        if (chat__truthy(eval(rs, n->a))) {
            return eval(rs, n->b);
        }
        return n->c ? eval(rs, n->c) : v_undef;
    case E_LIST:
    case E_TUPLE: {
        vlist_t *l = chat__list_new(cx, (size_t)n->nkids);

        for (int i = 0; i < n->nkids; i++) {
            chat__list_push(cx, l, eval(rs, n->kids[i]));
        }
        l->tuple = n->kind == E_TUPLE;
        return v_list(l);
    }
    case E_DICT: {
        vdict_t *d = chat__dict_new(cx);

        for (int i = 0; i < n->nkids; i++) {
            val_t k = eval(rs, n->kids[i]);

            if (k.t == V_LIST && !k.u.l->tuple) {
                chat__r_fail(rs, "unhashable type: 'list'");
            }
            if (k.t == V_DICT || k.t == V_NS) {
                chat__r_fail(rs, "unhashable type: 'dict'");
            }
            chat__dict_set(cx, d, k, eval(rs, n->kids2[i]));
        }
        return v_dict(d);
    }
    default:
        chat__r_fail(rs, "bad expression node");
    }
}

/* ==== render: statements ================================================== */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void
assign_targets(rstate_t *rs, scope_t *sc, const char **names, int n, val_t v)
{
    vlist_t *items;

    if (n == 1) {
        chat__scope_set(rs, sc, names[0], v);
        return;
    }
    items = chat__as_items(rs, v, false);
    if ((int)items->n != n) {
        chat__r_fail(rs, "cannot unpack %zu values into %d names", items->n, n);
    }
    for (int i = 0; i < n; i++) {
        chat__scope_set(rs, sc, names[i], items->v[i]);
    }
}

static int
render_for(rstate_t *rs, const cnode_t *n, sbuf_t *out)
{
    val_t seq = eval(rs, n->a);
    vlist_t *items;
    scope_t *saved = rs->cur, *sc = chat__scope_new(rs, saved);
    vloop_t *lp;
    val_t lv = {.t = V_LOOP};

    rs->cx->line = n->line;
    if (seq.t == V_NONE || seq.t == V_INT || seq.t == V_FLOAT || seq.t == V_BOOL) {
        chat__r_fail(rs, "'%s' object is not iterable", chat__type_name(seq));
    }
    items = chat__as_items(rs, seq, true);
    if (n->b != NULL) { /* {% for x in xs if cond %}: filter first, loop.length counts kept */
        vlist_t *kept = chat__list_new(rs->cx, items->n);

        rs->cur = sc;
        for (size_t i = 0; i < items->n; i++) {
            sc->n = 0;
            assign_targets(rs, sc, n->names, n->nnames, items->v[i]);
            if (chat__truthy(eval(rs, n->b))) {
                chat__list_push(rs->cx, kept, items->v[i]);
            }
        }
        rs->cur = saved;
        items = kept;
    }
    if (items->n == 0) {
        int fl;

        rs->cur = sc;
        sc->n = 0;
        fl = chat__render_body(rs, n->kids2, n->nkids2, out);
        rs->cur = saved;
        return fl;
    }
    lp = chat__ar_alloc(rs->cx, sizeof(*lp));
    lp->items = items;
    lp->depth = rs->loop_depth + 1;
    lv.u.loop = lp;
    rs->loop_depth++;
    rs->cur = sc;
    for (size_t i = 0; i < items->n; i++) {
        int fl;

        if (++rs->iterations > CHAT_MAX_ITERATIONS) {
            chat__cx_fail(rs->cx, ST_ETOOLONG, "line %d: loop iteration limit exceeded", n->line);
        }
        lp->idx = i;
        sc->n = 0; /* every iteration starts from the enclosing scope */
        chat__scope_set(rs, sc, "loop", lv);
        assign_targets(rs, sc, n->names, n->nnames, items->v[i]);
        fl = chat__render_body(rs, n->kids, n->nkids, out);
        if (fl == FLOW_BREAK) {
            break;
        }
    }
    rs->loop_depth--;
    rs->cur = saved;
    return FLOW_NEXT;
}

static int render_stmts(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out);

int
chat__render_body(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out)
{
    int fl;

    if (++rs->eval_depth > CHAT_MAX_EVAL_DEPTH) {
        chat__cx_fail(rs->cx, ST_ETOOLONG, "line %d: template evaluation nested too deeply",
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
            chat__sb_add(rs->cx, out, n->val.u.s.p, n->val.u.s.n);
            break;
        case N_OUT:
            chat__put_str(rs, out, eval(rs, n->a));
            break;
        case N_IF:
            if (chat__truthy(eval(rs, n->a))) {
                fl = chat__render_body(rs, n->kids, n->nkids, out);
            } else {
                fl = chat__render_body(rs, n->kids2, n->nkids2, out);
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
                chat__r_fail(rs, "cannot assign attribute on non-namespace object");
            }
            chat__dict_set(rs->cx, ns.u.d, v_cstr(n->names[0]), v);
            break;
        }
        case N_SETBLOCK:
        case N_FILTERBLOCK: {
            sbuf_t b = {0};
            val_t v;

            chat__render_body(rs, n->kids, n->nkids, &b);
            v = sb_val(&b);
            if (n->b != NULL) {
                v = apply_filter_node(rs, n->b, v);
            }
            if (n->kind == N_SETBLOCK) {
                assign_targets(rs, rs->cur, n->names, n->nnames, v);
            } else {
                chat__put_str(rs, out, v);
            }
            break;
        }
        case N_MACRO: {
            val_t m = {.t = V_MACRO, .u.macro = n};

            chat__scope_set(rs, rs->cur, n->name, m);
            break;
        }
        case N_BREAK:
        case N_CONTINUE:
            if (rs->loop_depth == 0) {
                chat__r_fail(rs, "break or continue outside a loop");
            }
            return n->kind == N_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
        case N_BODY:
            fl = chat__render_body(rs, n->kids, n->nkids, out);
            if (fl != FLOW_NEXT) {
                return fl;
            }
            break;
        default:
            chat__r_fail(rs, "bad statement node");
        }
    }
    return FLOW_NEXT;
}
