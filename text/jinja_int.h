/* jinja_int.h - internals shared by the files of the chat template
 * interpreter (text/chat.h): chat.c (compile and render entry points),
 * jinja_lex.c (lexer), jinja_parse.c (parser), jinja_eval.c (evaluator),
 * jinja_value.c (arenas, values and their Python semantics),
 * jinja_filters.c (filters, tests, tojson) and jinja_methods.c (str / dict /
 * list methods and the global functions).
 *
 * DESIGN
 *   The limits, the compile / render context (cx_t: error exit, arena,
 *   work budget), the value model (val_t), the tokens, the tree (cnode_t)
 *   and the render state (rstate_t) are defined here once. A function one
 *   file defines and another calls is named chat__*; small value
 *   constructors are static inline below. Every function that can fail
 *   unwinds with longjmp (chat__cx_fail, chat__r_fail) to the compile or
 *   render entry point in chat.c, which frees the arena: callers check no
 *   return codes and own nothing but arena memory.
 *
 * Thread: a compiled tree is immutable and shared; everything else belongs
 * to one compile or render on one thread (chat__tl_cx is per thread).
 */
#ifndef TEXT_JINJA_INT_H
#define TEXT_JINJA_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define CHAT_MAX_DEPTH 200           /* parser nesting (expressions, blocks) */
#define CHAT_MAX_CALL_DEPTH 64       /* nested macro calls */
#define CHAT_MAX_EVAL_DEPTH 500      /* nested eval / render frames: bounds the C stack */
#define CHAT_MAX_ITERATIONS 1000000L /* loop iterations per render */
#define CHAT_MAX_SOURCE ((size_t)1 << 20)
#define CHAT_ARENA_BASE ((size_t)64 << 20)
#define CHAT_MAX_WORK 200000000L /* about a second of scanning and comparing */

/* ==== errors and arenas (jinja_value.c) ================================== */

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

/* The render running on this thread, for the work budget of helpers that
 * do not take the context (string search, comparisons). NULL while
 * compiling. */
extern _Thread_local cx_t *chat__tl_cx;

/* Records status and the formatted message in cx, then longjmps to the
 * compile or render entry point. Every error of every stage ends here. */
_Noreturn void chat__cx_fail(cx_t *cx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Counts n units of work against chat__tl_cx (no-op while compiling); fails
 * with ST_ETOOLONG past CHAT_MAX_WORK. */
void chat__charge(size_t n);
/* Frees every block of a; the arena can be reused (empty). */
void chat__arena_free(arena_t *a);
/* n bytes (16-aligned) from cx's arena, never NULL: fails with
 * ST_ETOOLONG past the arena's limit or ST_ENOMEM. */
void *chat__ar_alloc(cx_t *cx, size_t n);
/* NUL-terminated copy of s[0..n) in the arena. */
char *chat__ar_strndup(cx_t *cx, const char *s, size_t n);

/* ==== values (jinja_value.c) ============================================= */

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

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf_t;

/* An empty list with room for cap items, in the arena. */
vlist_t *chat__list_new(cx_t *cx, size_t cap);
/* Appends v to l, growing it in the arena. */
void chat__list_push(cx_t *cx, vlist_t *l, val_t v);
/* An empty dict in the arena. */
vdict_t *chat__dict_new(cx_t *cx);
/* The value stored under key (Python equality), or NULL. */
val_t *chat__dict_find(const vdict_t *d, val_t key);
/* The value stored under the string key s, or NULL. */
val_t *chat__dict_find_str(const vdict_t *d, const char *s);
/* Stores v under key, replacing an equal key's value in place (insertion
 * order kept, as Python dicts). */
void chat__dict_set(cx_t *cx, vdict_t *d, val_t key, val_t v);
/* Appends s[0..n) to b; fails with ST_ETOOLONG past cx->max_out. */
void chat__sb_add(cx_t *cx, sbuf_t *b, const char *s, size_t n);

static inline val_t
v_bool(bool b)
{
    val_t v = {.t = V_BOOL, .u.i = b};
    return v;
}

static inline val_t
v_int(int64_t i)
{
    val_t v = {.t = V_INT, .u.i = i};
    return v;
}

static inline val_t
v_float(double f)
{
    val_t v = {.t = V_FLOAT, .u.f = f};
    return v;
}

static inline val_t
v_strn(const char *p, size_t n)
{
    val_t v = {.t = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

static inline val_t
v_cstr(const char *p)
{
    return v_strn(p, strlen(p));
}

static inline val_t
v_undef_named(const char *name)
{
    val_t v = {.t = V_UNDEF};
    v.u.s.p = name;
    return v;
}

static inline val_t
v_list(vlist_t *l)
{
    val_t v = {.t = V_LIST, .u.l = l};
    return v;
}

static inline val_t
v_dict(vdict_t *d)
{
    val_t v = {.t = V_DICT, .u.d = d};
    return v;
}

static inline bool
str_eq(val_t a, const char *s, size_t n)
{
    return a.t == V_STR && a.u.s.n == n && memcmp(a.u.s.p, s, n) == 0;
}

static inline void
sb_puts(cx_t *cx, sbuf_t *b, const char *s)
{
    chat__sb_add(cx, b, s, strlen(s));
}

static inline void
sb_putc(cx_t *cx, sbuf_t *b, char c)
{
    chat__sb_add(cx, b, &c, 1);
}

static inline val_t
sb_val(sbuf_t *b)
{
    return v_strn(b->n ? b->p : "", b->n);
}

/* ==== lexer (jinja_lex.c) ================================================ */

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

static inline bool
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

/* Splits lx->src into lx->toks (ending with T_EOF), applying the
 * whitespace rules; syntax errors fail through chat__cx_fail. */
void chat__lex_all(lexer_t *lx);

/* ==== parser (jinja_parse.c) ============================================= */

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

/* Statements until one of the end tags (left unconsumed) or the end of
 * the template (an error when end tags were expected; ends NULL: the top
 * level). Appends the nodes to body. */
void chat__parse_body(parser_t *ps, nvec_t *body, const char *const *ends);

/* ==== render state and value helpers (jinja_value.c) ===================== */

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

static inline bool
is_num(val_t v)
{
    return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT;
}

static inline double
num_f(val_t v)
{
    return v.t == V_FLOAT ? v.u.f : (double)v.u.i;
}

/* Python's type name of v, for error messages. */
const char *chat__type_name(val_t v);
/* chat__cx_fail with ST_EFORMAT and "line N: " (the node being rendered). */
_Noreturn void chat__r_fail(rstate_t *rs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Fails with "'name' is undefined" (or a plain undefined value message). */
_Noreturn void chat__r_undefined(rstate_t *rs, val_t v);
/* Python's bool(v). */
bool chat__truthy(val_t v);
/* Python's repr() of a float: the shortest string that reads back. */
void chat__fmt_float(cx_t *cx, sbuf_t *b, double f);
/* Appends Python repr(v) to b. */
void chat__put_repr(rstate_t *rs, sbuf_t *b, val_t v);
/* Appends Python str(v) to b (none as None, Markup as is). */
void chat__put_str(rstate_t *rs, sbuf_t *b, val_t v);
/* Python str(v) as a string value (v itself when it is one). */
val_t chat__to_str(rstate_t *rs, val_t v);
/* Python ==, across int / float / bool and recursively into containers. */
bool chat__val_eq(val_t a, val_t b);
/* <0, 0, >0 for orderable pairs; fails on others (Python TypeError). */
int chat__val_cmp(rstate_t *rs, val_t a, val_t b);
/* Code points in the UTF-8 string p[0..n). */
size_t chat__u8_len(const char *p, size_t n);
/* Byte offset of code point idx (idx <= length). */
size_t chat__u8_off(const char *p, size_t n, size_t idx);
/* Python sequence as a list of items (strings: one item per code point;
 * dicts: their keys). undef_ok: an undefined value iterates as empty. */
vlist_t *chat__as_items(rstate_t *rs, val_t v, bool undef_ok);
/* Items for a generator filter (map, select, ...); bad input is deferred
 * into a poisoned generator (*poison set, NULL returned). */
vlist_t *chat__gen_input(rstate_t *rs, val_t v, val_t *poison);
/* Python len(v); fails for values without one. */
int64_t chat__py_len(rstate_t *rs, val_t v);
/* obj[start:stop:step] for a str, list or tuple; sv holds the three
 * bounds. Generators and views give undefined. */
val_t chat__do_slice(rstate_t *rs, val_t obj, val_t *sv);

/* ==== evaluator (jinja_eval.c) =========================================== */

/* A new empty scope whose lookups fall back to parent. */
scope_t *chat__scope_new(rstate_t *rs, scope_t *parent);
/* Binds name to v in s (replacing a previous binding in s). */
void chat__scope_set(rstate_t *rs, scope_t *s, const char *name, val_t v);
/* obj.name: a str / dict / list method bound to obj, a dict or namespace
 * member, a loop.* attribute; anything else is a named undefined. */
val_t chat__get_attr(rstate_t *rs, val_t obj, const char *name);
/* obj[key]: a dict or namespace member, a list item or a str code point
 * (negative indexes count from the end); a str key falls back to
 * chat__get_attr; anything else is undefined. */
val_t chat__get_item(rstate_t *rs, val_t obj, val_t key);
/* a op b for the binary arithmetic operators, with Python semantics. */
val_t chat__arith(rstate_t *rs, int op, val_t a, val_t b);
/* Renders the statements body[0..nb) into out; returns jinja_eval.c's FLOW_NEXT, or
 * FLOW_BREAK / FLOW_CONTINUE from a loop control statement. */
int chat__render_body(rstate_t *rs, cnode_t **body, int nb, sbuf_t *out);

/* ==== calls: arguments, methods and globals (jinja_methods.c) ============ */

typedef struct cargs {
    val_t *pos;
    int npos;
    const char **kwn;
    val_t *kwv;
    int nkw;
} cargs_t;

/* Argument i (positional) or named `name`; `def` when absent. */
static inline val_t
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

/* v when it is a string; fails naming what otherwise. */
val_t chat__need_str(rstate_t *rs, val_t v, const char *what);
/* strip / lstrip / rstrip; chars NULL: whitespace. */
val_t chat__str_strip(val_t s, const val_t *chars, bool left, bool right);
/* First occurrence of nd[0..nn) in h[0..hn), or NULL; charges the scan. */
const char *chat__memfind(const char *h, size_t hn, const char *nd, size_t nn);
/* str.replace(old, new, count); count < 0: all. */
val_t chat__str_replace(rstate_t *rs, val_t s, val_t old, val_t new, int64_t count);
/* s with ASCII letters changed by mode: 'U' upper, 'L' lower, 'C'
 * capitalize, 'S' swapcase, 'T' title. */
val_t chat__str_case(rstate_t *rs, val_t s, int mode);
/* sep.join(items); stringify: str() of each item (the join filter),
 * else non-strings fail (str.join). */
val_t chat__str_join(rstate_t *rs, val_t sep, vlist_t *items, bool stringify);
/* Calls str method m of s with arguments a. */
val_t chat__call_str_method(rstate_t *rs, val_t s, const char *m, const cargs_t *a);
/* A dict's keys ('k'), values ('v') or (key, value) tuples ('i') as a list. */
val_t chat__dict_items(rstate_t *rs, vdict_t *d, int what);
/* Calls the bound method m (str, dict or list) with arguments a. */
val_t chat__call_method(rstate_t *rs, vmethod_t *m, const cargs_t *a);
/* Calls global function fn (FN_*) with arguments a. */
val_t chat__call_builtin(rstate_t *rs, int fn, const cargs_t *a);

/* ==== filters and tests (jinja_filters.c) ================================ */

/* s with &, <, >, " and ' as HTML entities (the escape filter). */
val_t chat__html_escape(rstate_t *rs, val_t s);
/* v|name(a...); an unknown filter fails ("no filter named"). */
val_t chat__apply_filter(rstate_t *rs, const char *name, val_t v, const cargs_t *a);
/* v is name(a...); an unknown test fails ("no test named"). */
bool chat__apply_test(rstate_t *rs, const char *name, val_t v, const cargs_t *a);

#endif /* TEXT_JINJA_INT_H */
