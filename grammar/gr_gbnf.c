/* gr_gbnf.c - llama.cpp GBNF text -> the byte-level program (gr_int.h).
 *
 * DESIGN
 *   Syntax as llama.cpp's grammar-parser accepts it: `name ::= alt | alt`,
 *   "literals" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [classes]
 *   with ranges and ^, `.` (any character), ( groups ), postfix * + ? {m}
 *   {m,} {m,n}, # comments. A rule ends where the next `name ::=` starts
 *   (newlines are ordinary space), which accepts everything llama.cpp
 *   accepts and also alternatives continued on a new line.
 *
 *   Repetition becomes right recursion (x* -> R ::= x R | ""), which the
 *   matcher runs in constant stack depth (tail calls do not push).
 *   Characters are code points; a class of non-ASCII code points becomes a
 *   rule whose alternatives are UTF-8 byte-range sequences (split at the
 *   encoding-length and continuation-byte boundaries), surrogates
 *   excluded. Left recursion, undefined rules and a missing root are
 *   refused.
 *
 * Thread: any; no shared state.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "grammar/gr_int.h"

/* ---- string builder ------------------------------------------------------ */

void
gr__sb_add(gr_sb_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            cap *= 2;
        }
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n > 0) {
        memcpy(b->p + b->n, s, n);
    }
    b->n += n;
    b->p[b->n] = '\0';
}

void
gr__sb_puts(gr_sb_t *b, const char *s)
{
    gr__sb_add(b, s, strlen(s));
}

void
gr__sb_printf(gr_sb_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n < sizeof(tmp)) {
        gr__sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gr__sb_add(b, big, (size_t)n);
    free(big);
}

void
gr__sb_literal(gr_sb_t *b, const char *s, size_t n)
{
    gr__sb_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            gr__sb_add(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            gr__sb_printf(b, "\\x%02X", c);
        } else {
            gr__sb_add(b, (const char *)&s[i], 1);
        }
    }
    gr__sb_add(b, "\"", 1);
}

/* ---- builder --------------------------------------------------------------- */

typedef struct seq {
    uint32_t *el;
    int32_t n, cap;
} seq_t;

typedef struct brule {
    char *name; /* NULL: anonymous */
    seq_t *alts;
    int32_t n_alts, cap_alts;
    int defined;
    int32_t first_line; /* where it was first referenced */
} brule_t;

typedef struct parser {
    const char *src;
    const char *p;
    brule_t *rules;
    int32_t n_rules, cap_rules;
    uint32_t (*cls)[8];
    int32_t n_cls, cap_cls;
    int32_t n_code; /* elements so far, for GR_MAX_CODE */
    char *err;
    size_t errlen;
    int failed;
    /* Non-ASCII class rules already built, keyed by their range list. */
    gr_sb_t class_keys; /* "lo-hi,lo-hi;" per entry, rule id after '=' */
} parser_t;

static void perr(parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int
line_of(const parser_t *ps)
{
    int line = 1;
    for (const char *q = ps->src; q < ps->p && *q; q++) {
        line += *q == '\n';
    }
    return line;
}

static void
perr(parser_t *ps, const char *fmt, ...)
{
    char msg[200];
    va_list ap;

    if (ps->failed) {
        return;
    }
    ps->failed = 1;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->errlen, "grammar line %d: %s", line_of(ps), msg);
}

static void
seq_push(parser_t *ps, seq_t *s, uint32_t e)
{
    if (++ps->n_code > GR_MAX_CODE) {
        perr(ps, "grammar too large");
        return;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->el = xrealloc(s->el, (size_t)s->cap * sizeof(uint32_t));
    }
    s->el[s->n++] = e;
}

static int32_t
rule_new(parser_t *ps, const char *name, size_t len)
{
    if (ps->n_rules == ps->cap_rules) {
        ps->cap_rules = ps->cap_rules ? ps->cap_rules * 2 : 32;
        ps->rules = xrealloc(ps->rules, (size_t)ps->cap_rules * sizeof(brule_t));
    }
    brule_t *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof(*r));
    r->name = name != NULL ? xstrndup(name, len) : NULL;
    r->first_line = line_of(ps);
    return ps->n_rules++;
}

static int32_t
rule_named(parser_t *ps, const char *name, size_t len)
{
    for (int32_t i = 0; i < ps->n_rules; i++) {
        const char *n = ps->rules[i].name;
        if (n != NULL && strlen(n) == len && memcmp(n, name, len) == 0) {
            return i;
        }
    }
    return rule_new(ps, name, len);
}

/* Appends a new empty alternative to rule r and returns it. The pointer
 * is valid until the next alternative of any rule is added. */
static seq_t *
alt_new(parser_t *ps, int32_t r)
{
    brule_t *br = &ps->rules[r];
    if (br->n_alts == br->cap_alts) {
        br->cap_alts = br->cap_alts ? br->cap_alts * 2 : 4;
        br->alts = xrealloc(br->alts, (size_t)br->cap_alts * sizeof(seq_t));
    }
    seq_t *s = &br->alts[br->n_alts++];
    memset(s, 0, sizeof(*s));
    return s;
}

static void
alt_add(parser_t *ps, int32_t r, const uint32_t *el, int32_t n)
{
    seq_t *s = alt_new(ps, r);
    for (int32_t i = 0; i < n; i++) {
        seq_push(ps, s, el[i]);
    }
}

static uint32_t
class_el(parser_t *ps, const uint32_t bits[8])
{
    for (int32_t i = 0; i < ps->n_cls; i++) {
        if (memcmp(ps->cls[i], bits, 32) == 0) {
            return GR_EL(GR_EL_CLASS, i);
        }
    }
    if (ps->n_cls == ps->cap_cls) {
        ps->cap_cls = ps->cap_cls ? ps->cap_cls * 2 : 32;
        ps->cls = xrealloc(ps->cls, (size_t)ps->cap_cls * 32);
    }
    memcpy(ps->cls[ps->n_cls], bits, 32);
    return GR_EL(GR_EL_CLASS, ps->n_cls++);
}

static uint32_t
byte_range_el(parser_t *ps, unsigned lo, unsigned hi)
{
    uint32_t bits[8] = {0};
    for (unsigned b = lo; b <= hi && b < 256; b++) {
        bits[b >> 5] |= 1u << (b & 31);
    }
    return class_el(ps, bits);
}

/* ---- code-point sets -------------------------------------------------------- */

/* Sorts, merges, optionally complements, and removes surrogates. */
static void
cpset_normalize(gr_cpset_t *s, int negate)
{
    if (negate) {
        gr_cpset_complement(s);
    } else {
        gr_cpset_norm(s);
    }
    gr_cpset_remove(s, 0xD800, 0xDFFF);       /* surrogates: not encodable in UTF-8 */
    gr_cpset_remove(s, 0x110000, 0xFFFFFFFFu); /* past Unicode */
}

static int
utf8_encode(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Adds to rule r the alternatives (byte-range sequences) that encode
 * exactly the code points a..b, all of encoded length n. */
static void
utf8_split(parser_t *ps, int32_t r, uint32_t a, uint32_t b, int n)
{
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((a & ~m) != (b & ~m)) {
            if ((a & m) != 0) {
                utf8_split(ps, r, a, a | m, n);
                utf8_split(ps, r, (a | m) + 1, b, n);
                return;
            }
            if ((b & m) != m) {
                utf8_split(ps, r, a, (b & ~m) - 1, n);
                utf8_split(ps, r, b & ~m, b, n);
                return;
            }
        }
    }
    unsigned char ea[4], eb[4];
    uint32_t el[4];
    utf8_encode(a, ea);
    utf8_encode(b, eb);
    for (int k = 0; k < n; k++) {
        el[k] = byte_range_el(ps, ea[k], eb[k]);
    }
    alt_add(ps, r, el, n);
}

/* The element for a normalized code-point set: one byte class when it is
 * all ASCII, else a reference to a (shared) rule of UTF-8 alternatives. */
static uint32_t
cpset_el(parser_t *ps, const gr_cpset_t *s)
{
    uint32_t bits[8] = {0};
    int ascii_only = 1;
    gr_sb_t key = {0};

    for (int32_t i = 0; i < s->n; i++) {
        if (s->r[i].hi >= 0x80) {
            ascii_only = 0;
        }
        for (uint32_t c = s->r[i].lo; c <= s->r[i].hi && c < 0x80; c++) {
            bits[c >> 5] |= 1u << (c & 31);
        }
        gr__sb_printf(&key, "%X-%X,", s->r[i].lo, s->r[i].hi);
    }
    if (ascii_only) {
        free(key.p);
        return class_el(ps, bits);
    }
    gr__sb_add(&key, ";", 1);
    if (ps->class_keys.p != NULL) {
        const char *hit = strstr(ps->class_keys.p, key.p);
        /* Keys are "|key=id" entries: match only at an entry start. */
        while (hit != NULL && hit[-1] != '|') {
            hit = strstr(hit + 1, key.p);
        }
        if (hit != NULL) {
            int32_t id = (int32_t)strtol(hit + key.n + 1, NULL, 10);
            free(key.p);
            return GR_EL(GR_EL_REF, id);
        }
    }
    int32_t r = rule_new(ps, NULL, 0);
    ps->rules[r].defined = 1;
    int any_ascii = 0;
    for (int k = 0; k < 4; k++) {
        any_ascii |= bits[k] != 0;
    }
    if (any_ascii) {
        uint32_t e = class_el(ps, bits);
        alt_add(ps, r, &e, 1);
    }
    static const uint32_t lim[4][2] = {
        {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (int32_t i = 0; i < s->n; i++) {
        for (int n = 2; n <= 4; n++) {
            uint32_t lo = s->r[i].lo > lim[n - 1][0] ? s->r[i].lo : lim[n - 1][0];
            uint32_t hi = s->r[i].hi < lim[n - 1][1] ? s->r[i].hi : lim[n - 1][1];
            if (lo <= hi) {
                utf8_split(ps, r, lo, hi, n);
            }
        }
    }
    if (ps->rules[r].n_alts == 0) {
        /* An empty set: a class that matches no byte. */
        uint32_t none[8] = {0};
        uint32_t e = class_el(ps, none);
        alt_add(ps, r, &e, 1);
    }
    gr__sb_add(&ps->class_keys, "|", 1);
    gr__sb_add(&ps->class_keys, key.p, key.n);
    gr__sb_printf(&ps->class_keys, "=%d", r);
    free(key.p);
    return GR_EL(GR_EL_REF, r);
}

/* ---- lexing ----------------------------------------------------------------- */

static void
skip_space(parser_t *ps)
{
    for (;;) {
        while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') {
            ps->p++;
        }
        if (*ps->p == '#') {
            while (*ps->p != '\0' && *ps->p != '\n') {
                ps->p++;
            }
            continue;
        }
        return;
    }
}

static int
is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* 1 when p starts `name ::=`. */
static int
at_rule_def(const char *p)
{
    const char *q = p;
    while (is_name_char(*q)) {
        q++;
    }
    if (q == p) {
        return 0;
    }
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') {
        q++;
    }
    return q[0] == ':' && q[1] == ':' && q[2] == '=';
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

/* Decodes one UTF-8 code point at *pp (invalid bytes stand for themselves
 * as code points 0x80..0xFF would not: they are refused). */
static int
decode_utf8(parser_t *ps, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)ps->p;
    int n;

    if (s[0] < 0x80) {
        *cp = s[0];
        n = 1;
    } else if ((s[0] & 0xE0) == 0xC0) {
        *cp = s[0] & 0x1F;
        n = 2;
    } else if ((s[0] & 0xF0) == 0xE0) {
        *cp = s[0] & 0x0F;
        n = 3;
    } else if ((s[0] & 0xF8) == 0xF0) {
        *cp = s[0] & 0x07;
        n = 4;
    } else {
        perr(ps, "invalid UTF-8");
        return 0;
    }
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            perr(ps, "invalid UTF-8");
            return 0;
        }
        *cp = (*cp << 6) | (s[i] & 0x3F);
    }
    ps->p += n;
    return 1;
}

/* One (possibly escaped) character of a literal or class. *raw_byte is
 * set for \xHH, which stands for a byte, not a code point. */
static int
parse_char(parser_t *ps, uint32_t *cp, int *raw_byte)
{
    *raw_byte = 0;
    if (*ps->p == '\0') {
        perr(ps, "unexpected end of grammar");
        return 0;
    }
    if (*ps->p != '\\') {
        return decode_utf8(ps, cp);
    }
    ps->p++;
    char c = *ps->p++;
    int digits = 0;
    switch (c) {
    case 'n':
        *cp = '\n';
        return 1;
    case 'r':
        *cp = '\r';
        return 1;
    case 't':
        *cp = '\t';
        return 1;
    case 'x':
        digits = 2;
        break;
    case 'u':
        digits = 4;
        break;
    case 'U':
        digits = 8;
        break;
    case '\0':
        perr(ps, "unexpected end of grammar");
        return 0;
    default:
        if ((unsigned char)c < 0x80) {
            *cp = (unsigned char)c; /* \\ \" \[ \] \- \^ \/ and the like */
            return 1;
        }
        perr(ps, "bad escape");
        return 0;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexval(*ps->p);
        if (h < 0) {
            perr(ps, "bad \\%c escape", c);
            return 0;
        }
        v = v * 16 + (uint32_t)h;
        ps->p++;
    }
    if (v > 0x10FFFF) {
        perr(ps, "code point out of range");
        return 0;
    }
    *cp = v;
    *raw_byte = c == 'x';
    return 1;
}

/* ---- parsing ---------------------------------------------------------------- */

static void parse_alternates(parser_t *ps, int32_t rule, int nested);

/* Makes the item el[start..end) of s one element (a new rule when it has
 * more than one) and truncates s to start. */
static uint32_t
item_take(parser_t *ps, seq_t *s, int32_t start)
{
    if (s->n - start == 1) {
        s->n = start;
        return s->el[start];
    }
    int32_t r = rule_new(ps, NULL, 0);
    ps->rules[r].defined = 1;
    /* s may move when alt_new grows another rule's alts: copy first. */
    int32_t n = s->n - start;
    uint32_t *tmp = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    memcpy(tmp, s->el + start, (size_t)n * sizeof(uint32_t));
    s->n = start;
    alt_add(ps, r, tmp, n);
    free(tmp);
    return GR_EL(GR_EL_REF, r);
}

/* R ::= x R | ""  (x*) */
static uint32_t
rule_star(parser_t *ps, uint32_t x)
{
    int32_t r = rule_new(ps, NULL, 0);
    ps->rules[r].defined = 1;
    uint32_t el[2] = {x, GR_EL(GR_EL_REF, r)};
    alt_add(ps, r, el, 2);
    alt_add(ps, r, NULL, 0);
    return GR_EL(GR_EL_REF, r);
}

/* Appends the repetition x{min,max} (max < 0: unbounded) to rule ri's
 * alternative ai. */
static void
push_repeat(parser_t *ps, int32_t ri, int32_t ai, uint32_t x, long min, long max)
{
    for (long i = 0; i < min && !ps->failed; i++) {
        seq_push(ps, &ps->rules[ri].alts[ai], x);
    }
    if (max < 0) {
        uint32_t st = rule_star(ps, x);
        seq_push(ps, &ps->rules[ri].alts[ai], st);
        return;
    }
    if (max == min) {
        return;
    }
    /* O_1 ::= x | "" ; O_k ::= x O_{k-1} | "" */
    uint32_t prev = 0;
    for (long k = 1; k <= max - min && !ps->failed; k++) {
        int32_t r = rule_new(ps, NULL, 0);
        ps->rules[r].defined = 1;
        uint32_t el[2] = {x, prev};
        alt_add(ps, r, el, k == 1 ? 1 : 2);
        alt_add(ps, r, NULL, 0);
        prev = GR_EL(GR_EL_REF, r);
    }
    seq_push(ps, &ps->rules[ri].alts[ai], prev);
}

static long
parse_uint(parser_t *ps)
{
    long v = 0;
    if (*ps->p < '0' || *ps->p > '9') {
        perr(ps, "expected a number");
        return -1;
    }
    while (*ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > GR_MAX_REPEAT) {
            perr(ps, "repetition bound over %d", GR_MAX_REPEAT);
            return -1;
        }
    }
    return v;
}

static void
parse_class(parser_t *ps, seq_t **sp, int32_t ri, int32_t ai)
{
    gr_cpset_t set = {0};
    int negate = 0;
    uint32_t raw[8] = {0};
    int n_raw = 0;

    ps->p++; /* [ */
    if (*ps->p == '^') {
        negate = 1;
        ps->p++;
    }
    while (!ps->failed && *ps->p != ']') {
        uint32_t lo, hi;
        int rb, rb2;
        if (!parse_char(ps, &lo, &rb)) {
            break;
        }
        hi = lo;
        if (ps->p[0] == '-' && ps->p[1] != ']' && ps->p[1] != '\0') {
            ps->p++;
            if (!parse_char(ps, &hi, &rb2)) {
                break;
            }
            rb = rb && rb2;
            if (hi < lo) {
                perr(ps, "bad class range");
                break;
            }
        }
        if (rb && hi >= 0x80) {
            /* \x80-\xFF: raw bytes (llama.cpp treats \xHH as a code point;
             * bytes are what a byte-level grammar can mean here). */
            for (uint32_t b = lo; b <= hi; b++) {
                raw[b >> 5] |= 1u << (b & 31);
            }
            n_raw++;
            if (lo < 0x80) {
                gr_cpset_add(&set, lo, 0x7F);
            }
        } else {
            gr_cpset_add(&set, lo, hi);
        }
    }
    if (!ps->failed && *ps->p != ']') {
        perr(ps, "unterminated character class");
    }
    if (ps->failed) {
        free(set.r);
        return;
    }
    ps->p++;
    if (n_raw > 0 && negate) {
        perr(ps, "negated class with raw bytes \\x80-\\xFF is not supported");
        free(set.r);
        return;
    }
    cpset_normalize(&set, negate);
    uint32_t e = cpset_el(ps, &set);
    free(set.r);
    if (n_raw > 0) {
        /* Union of the code-point element and the raw byte class. */
        int32_t r = rule_new(ps, NULL, 0);
        ps->rules[r].defined = 1;
        uint32_t rbe = class_el(ps, raw);
        alt_add(ps, r, &e, 1);
        alt_add(ps, r, &rbe, 1);
        e = GR_EL(GR_EL_REF, r);
    }
    *sp = &ps->rules[ri].alts[ai];
    seq_push(ps, *sp, e);
}

/* Parses one sequence into rule ri's alternative ai. */
static void
parse_sequence(parser_t *ps, int32_t ri, int32_t ai, int nested)
{
    seq_t *s = &ps->rules[ri].alts[ai];
    int32_t last = -1; /* start of the last item */

    for (;;) {
        skip_space(ps);
        if (ps->failed) {
            return;
        }
        s = &ps->rules[ri].alts[ai];
        char c = *ps->p;
        if (c == '\0' || c == '|' || c == ')' || (!nested && at_rule_def(ps->p))) {
            return;
        }
        if (c == '"') {
            ps->p++;
            last = s->n;
            while (!ps->failed && *ps->p != '"') {
                uint32_t cp;
                int rb;
                if (!parse_char(ps, &cp, &rb)) {
                    return;
                }
                unsigned char enc[4];
                int n = rb ? 1 : utf8_encode(cp, enc);
                if (rb) {
                    enc[0] = (unsigned char)cp;
                }
                for (int k = 0; k < n; k++) {
                    seq_push(ps, s, byte_range_el(ps, enc[k], enc[k]));
                }
            }
            if (ps->failed) {
                return;
            }
            ps->p++;
            if (s->n == last) {
                last = -1; /* "" adds nothing */
            }
        } else if (c == '[') {
            last = s->n;
            parse_class(ps, &s, ri, ai);
        } else if (c == '.') {
            ps->p++;
            gr_cpset_t set = {0};
            gr_cpset_add(&set, 0, 0x10FFFF);
            cpset_normalize(&set, 0);
            uint32_t e = cpset_el(ps, &set);
            free(set.r);
            s = &ps->rules[ri].alts[ai];
            last = s->n;
            seq_push(ps, s, e);
        } else if (c == '(') {
            ps->p++;
            int32_t r = rule_new(ps, NULL, 0);
            ps->rules[r].defined = 1;
            parse_alternates(ps, r, 1);
            if (ps->failed) {
                return;
            }
            if (*ps->p != ')') {
                perr(ps, "expected ')'");
                return;
            }
            ps->p++;
            s = &ps->rules[ri].alts[ai];
            last = s->n;
            seq_push(ps, s, GR_EL(GR_EL_REF, r));
        } else if (is_name_char(c)) {
            const char *n0 = ps->p;
            while (is_name_char(*ps->p)) {
                ps->p++;
            }
            int32_t r = rule_named(ps, n0, (size_t)(ps->p - n0));
            s = &ps->rules[ri].alts[ai];
            last = s->n;
            seq_push(ps, s, GR_EL(GR_EL_REF, r));
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) {
                perr(ps, "'%c' without an item before it", c);
                return;
            }
            long min = 0, max = -1;
            ps->p++;
            if (c == '+') {
                min = 1;
            } else if (c == '?') {
                max = 1;
            } else if (c == '{') {
                skip_space(ps);
                min = parse_uint(ps);
                skip_space(ps);
                if (*ps->p == ',') {
                    ps->p++;
                    skip_space(ps);
                    max = *ps->p == '}' ? -1 : parse_uint(ps);
                    skip_space(ps);
                } else {
                    max = min;
                }
                if (ps->failed) {
                    return;
                }
                if (*ps->p != '}') {
                    perr(ps, "expected '}'");
                    return;
                }
                ps->p++;
                if (max >= 0 && max < min) {
                    perr(ps, "repetition {%ld,%ld} has max < min", min, max);
                    return;
                }
            }
            uint32_t x = item_take(ps, &ps->rules[ri].alts[ai], last);
            push_repeat(ps, ri, ai, x, min, max);
            last = -1;
        } else {
            perr(ps, "unexpected character '%c'", c);
            return;
        }
    }
}

static void
parse_alternates(parser_t *ps, int32_t rule, int nested)
{
    for (;;) {
        alt_new(ps, rule);
        parse_sequence(ps, rule, ps->rules[rule].n_alts - 1, nested);
        if (ps->failed) {
            return;
        }
        skip_space(ps);
        if (*ps->p != '|') {
            return;
        }
        ps->p++;
    }
}

/* ---- checks and flattening --------------------------------------------------- */

static const char *
rule_label(const parser_t *ps, int32_t r)
{
    return ps->rules[r].name != NULL ? ps->rules[r].name : "(group)";
}

static int
check_left_recursion(parser_t *ps)
{
    int32_t n = ps->n_rules;
    char *nullable = xcalloc((size_t)n, 1);
    int changed = 1;

    while (changed) {
        changed = 0;
        for (int32_t r = 0; r < n; r++) {
            if (nullable[r]) {
                continue;
            }
            for (int32_t a = 0; a < ps->rules[r].n_alts && !nullable[r]; a++) {
                const seq_t *s = &ps->rules[r].alts[a];
                int all = 1;
                for (int32_t i = 0; i < s->n && all; i++) {
                    all = GR_EL_TYPE(s->el[i]) == GR_EL_REF && nullable[GR_EL_ARG(s->el[i])];
                }
                if (all) {
                    nullable[r] = 1;
                    changed = 1;
                }
            }
        }
    }
    /* DFS over left edges: 0 white, 1 on the path, 2 done. */
    char *color = xcalloc((size_t)n, 1);
    int32_t *stack = xmalloc((size_t)n * 2 * sizeof(int32_t) + 8);
    int bad = -1;
    for (int32_t r0 = 0; r0 < n && bad < 0; r0++) {
        if (color[r0] != 0) {
            continue;
        }
        /* Iterative DFS: stack of (rule, next edge index). Edges of r are
         * enumerated as (alt, element) pairs flattened into an index. */
        int32_t sp = 0;
        stack[sp++] = r0;
        stack[sp++] = 0;
        color[r0] = 1;
        while (sp > 0 && bad < 0) {
            int32_t r = stack[sp - 2];
            int32_t k = stack[sp - 1];
            int32_t next = -1;
            /* Find the k-th left edge of r. */
            int32_t idx = 0;
            for (int32_t a = 0; a < ps->rules[r].n_alts && next < 0; a++) {
                const seq_t *s = &ps->rules[r].alts[a];
                for (int32_t i = 0; i < s->n; i++) {
                    if (GR_EL_TYPE(s->el[i]) != GR_EL_REF) {
                        break;
                    }
                    if (idx++ == k) {
                        next = (int32_t)GR_EL_ARG(s->el[i]);
                        break;
                    }
                    if (!nullable[GR_EL_ARG(s->el[i])]) {
                        break;
                    }
                }
            }
            if (next < 0) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            stack[sp - 1] = k + 1;
            if (color[next] == 1) {
                bad = next;
            } else if (color[next] == 0) {
                color[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
            }
        }
    }
    if (bad >= 0) {
        snprintf(ps->err, ps->errlen, "grammar: left recursion through rule '%s'",
                 rule_label(ps, bad));
        ps->failed = 1;
    }
    free(stack);
    free(color);
    free(nullable);
    return bad < 0;
}

static void
flatten(parser_t *ps, gr_prog_t *p)
{
    int32_t n_alts = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_alts += ps->rules[r].n_alts;
    }
    p->n_rules = ps->n_rules;
    p->rule_alts = xmalloc((size_t)(p->n_rules + 1) * sizeof(int32_t));
    p->alt_start = xmalloc((size_t)(n_alts > 0 ? n_alts : 1) * sizeof(uint32_t));
    p->code = xmalloc((size_t)(ps->n_code + n_alts + 1) * sizeof(uint32_t));
    p->rule_names = xcalloc((size_t)p->n_rules, sizeof(char *));
    int32_t ai = 0, pc = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        p->rule_alts[r] = ai;
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) {
            const seq_t *s = &ps->rules[r].alts[a];
            p->alt_start[ai++] = (uint32_t)pc;
            if (s->n > 0) {
                memcpy(p->code + pc, s->el, (size_t)s->n * sizeof(uint32_t));
            }
            pc += s->n;
            p->code[pc++] = GR_EL(GR_EL_END, 0);
        }
        p->rule_names[r] = ps->rules[r].name;
        ps->rules[r].name = NULL;
    }
    p->rule_alts[p->n_rules] = ai;
    p->n_code = pc;
    p->cls = ps->cls;
    p->n_cls = ps->n_cls;
    ps->cls = NULL;
}

static void
parser_fini(parser_t *ps)
{
    for (int32_t r = 0; r < ps->n_rules; r++) {
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++) {
            free(ps->rules[r].alts[a].el);
        }
        free(ps->rules[r].alts);
        free(ps->rules[r].name);
    }
    free(ps->rules);
    free(ps->cls);
    free(ps->class_keys.p);
}

int
gr__gbnf_compile(const char *text, gr_prog_t *p, char *err, size_t errlen)
{
    parser_t ps;
    int rc = ST_EINVAL;

    memset(p, 0, sizeof(*p));
    memset(&ps, 0, sizeof(ps));
    ps.src = text;
    ps.p = text;
    ps.err = err;
    ps.errlen = errlen;
    if (strlen(text) > GR_MAX_SPEC) {
        snprintf(err, errlen, "grammar longer than %d bytes", GR_MAX_SPEC);
        return ST_EINVAL;
    }
    for (;;) {
        skip_space(&ps);
        if (*ps.p == '\0') {
            break;
        }
        const char *n0 = ps.p;
        while (is_name_char(*ps.p)) {
            ps.p++;
        }
        if (ps.p == n0) {
            perr(&ps, "expected a rule name");
            goto done;
        }
        int32_t r = rule_named(&ps, n0, (size_t)(ps.p - n0));
        skip_space(&ps);
        if (strncmp(ps.p, "::=", 3) != 0) {
            perr(&ps, "expected '::=' after '%s'", ps.rules[r].name);
            goto done;
        }
        ps.p += 3;
        if (ps.rules[r].defined) {
            perr(&ps, "rule '%s' defined twice", ps.rules[r].name);
            goto done;
        }
        ps.rules[r].defined = 1;
        parse_alternates(&ps, r, 0);
        if (ps.failed) {
            goto done;
        }
        if (*ps.p == ')') {
            perr(&ps, "unbalanced ')'");
            goto done;
        }
    }
    p->root = -1;
    for (int32_t r = 0; r < ps.n_rules; r++) {
        if (!ps.rules[r].defined) {
            snprintf(err, errlen, "grammar: rule '%s' is used but not defined", ps.rules[r].name);
            goto done;
        }
        if (ps.rules[r].name != NULL && strcmp(ps.rules[r].name, "root") == 0) {
            p->root = r;
        }
    }
    if (p->root < 0) {
        snprintf(err, errlen, "grammar: no 'root' rule");
        goto done;
    }
    if (!check_left_recursion(&ps)) {
        goto done;
    }
    flatten(&ps, p);
    rc = ST_OK;
done:
    parser_fini(&ps);
    if (rc != ST_OK) {
        gr__prog_fini(p);
    }
    return rc;
}

void
gr__prog_fini(gr_prog_t *p)
{
    if (p->rule_names != NULL) {
        for (int32_t r = 0; r < p->n_rules; r++) {
            free(p->rule_names[r]);
        }
    }
    free(p->rule_names);
    free(p->code);
    free(p->alt_start);
    free(p->rule_alts);
    free(p->cls);
    memset(p, 0, sizeof(*p));
}
