/* jinja_parse.c - the chat template parser: tokens to a tree of cnode_t
 * (statements and expressions).
 *
 * DESIGN
 *   Recursive descent with jinja2's precedence: if-else < or < and < not <
 *   comparisons < + - < ~ < * / // % < ** < unary < postfix / filters /
 *   tests. Nesting is bounded (CHAT_MAX_DEPTH) so a hostile template
 *   cannot exhaust the C stack; unsupported tags are a syntax error with
 *   the line number. Nodes live in the template's arena and are immutable
 *   once compiled.
 *
 * Thread: the compiling thread.
 */

#include <stdio.h>

#include "common/status.h"
#include "text/jinja_int.h"

/* ==== parser ============================================================= */

static void
nv_push(cx_t *cx, nvec_t *v, cnode_t *n)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        cnode_t **nv = chat__ar_alloc(cx, (size_t)cap * sizeof(*nv));

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
        const char **nv = chat__ar_alloc(cx, (size_t)cap * sizeof(*nv));

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
        chat__cx_fail(ps->cx, ST_EFORMAT, "line %d: %s, got %s", t->line, what, got);
    }
    chat__cx_fail(ps->cx, ST_EFORMAT, "line %d: %s, got '%.*s'", t->line, what,
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
    return chat__ar_strndup(ps->cx, t->p, t->n);
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
    cnode_t *n = chat__ar_alloc(ps->cx, sizeof(*n));

    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = cur(ps)->line;
    return n;
}

static void
enter(parser_t *ps)
{
    if (++ps->depth > CHAT_MAX_DEPTH) {
        chat__cx_fail(ps->cx, ST_ETOOLONG, "line %d: template nested too deeply", cur(ps)->line);
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
        cnode_t **args = chat__ar_alloc(ps->cx, sizeof(*args));

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
    s->kids = chat__ar_alloc(ps->cx, 3 * sizeof(cnode_t *));
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
            n->name = chat__ar_strndup(ps->cx, t->p, t->n);
        }
        advance(ps);
    } else if (t->t == T_STRING) {
        sbuf_t b = {0};

        n = node_new(ps, E_CONST);
        while (cur(ps)->t == T_STRING) { /* adjacent literals concatenate */
            chat__sb_add(ps->cx, &b, cur(ps)->p, cur(ps)->n);
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
    n->ops = chat__ar_alloc(ps->cx, (size_t)nops * sizeof(int));
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

/* After chat__parse_body stopped at one of its end tags: consume "{%" and the
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
    chat__parse_body(ps, &body, ends);
    n->kids = body.v;
    n->nkids = body.n;
    t = take_end_tag(ps);
    if (tok_is(t, T_NAME, "elif")) {
        cnode_t **e = chat__ar_alloc(ps->cx, sizeof(*e));

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
        chat__parse_body(ps, &els, end_only);
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
    chat__parse_body(ps, &body, ends);
    n->kids = body.v;
    n->nkids = body.n;
    t = take_end_tag(ps);
    if (tok_is(t, T_NAME, "else")) {
        nvec_t els = {0};

        expect_block_end(ps);
        chat__parse_body(ps, &els, end_only);
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
        n->names = chat__ar_alloc(ps->cx, sizeof(char *));
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
        chat__parse_body(ps, &body, ends);
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
    chat__parse_body(ps, &body, ends);
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
        chat__parse_body(ps, &body, ends);
        take_end_tag(ps);
        expect_block_end(ps);
        n->kids = body.v;
        n->nkids = body.n;
    } else if (tok_is(kw, T_NAME, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        nvec_t body = {0};

        n = node_new(ps, N_BODY);
        expect_block_end(ps);
        chat__parse_body(ps, &body, ends);
        take_end_tag(ps);
        expect_block_end(ps);
        n->kids = body.v;
        n->nkids = body.n;
    } else {
        chat__cx_fail(ps->cx, ST_EFORMAT, "line %d: unknown tag '%.*s'", kw->line, (int)kw->n,
                      kw->p);
    }
    ps->depth--;
    return n;
}

/* Statements until one of the end tags (left unconsumed) or the end of
 * the template (an error when end tags were expected). */
void
chat__parse_body(parser_t *ps, nvec_t *body, const char *const *ends)
{
    for (;;) {
        tok_t *t = cur(ps);

        if (t->t == T_EOF) {
            if (ends != NULL) {
                const char *want = ends[0];

                for (int i = 0; ends[i] != NULL; i++) {
                    want = strncmp(ends[i], "end", 3) == 0 ? ends[i] : want;
                }
                chat__cx_fail(ps->cx, ST_EFORMAT,
                              "line %d: unexpected end of template, expected '%s'", t->line, want);
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
