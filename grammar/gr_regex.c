/* gr_regex.c - a regular-expression subset and choice lists -> GBNF text.
 *
 * DESIGN
 *   The regex subset: literals, escapes (\d \w \s and their negations, \n
 *   \r \t \f \v, \xHH, \uHHHH, escaped punctuation), classes [...] with
 *   ranges and ^, `.` (any character but newline), groups (...) and
 *   (?:...), alternation, quantifiers * + ? {m} {m,} {m,n} (a lazy `?`
 *   after one is accepted: it does not change the language), and ^ / $
 *   at the ends (the whole output always matches). Backreferences,
 *   lookaround, \b and named groups are refused with a message.
 *
 *   Inside a JSON string (a schema's pattern), the pattern describes the
 *   decoded string: '"' and '\' come out as their JSON escapes, control
 *   characters as \n \t \r \b \f or \u00XX, and classes and `.` never
 *   produce those characters raw.
 *
 * Thread: any; no shared state.
 */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "grammar/gr_int.h"

typedef struct rx {
    const char *p;
    int json;
    gr_sb_t *out;
    char *err;
    size_t errlen;
    int failed;
    int depth;
} rx_t;

static void rx_err(rx_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
rx_err(rx_t *x, const char *fmt, ...)
{
    va_list ap;
    if (x->failed) {
        return;
    }
    x->failed = 1;
    va_start(ap, fmt);
    vsnprintf(x->err, x->errlen, fmt, ap);
    va_end(ap);
}

static void
emit_set(rx_t *x, gr_cpset_t *s)
{
    gr_cpset_norm(s);
    if (x->json) {
        gr_cpset_remove(s, 0, 0x1F);
        gr_cpset_remove(s, '"', '"');
        gr_cpset_remove(s, '\\', '\\');
    }
    if (s->n == 0) {
        gr__sb_puts(x->out, "[^\\x00-\\U0010FFFF]");
        return;
    }
    gr__sb_puts(x->out, "[");
    for (int i = 0; i < s->n; i++) {
        gr__sb_printf(x->out, "\\U%08X", s->r[i].lo);
        if (s->r[i].hi != s->r[i].lo) {
            gr__sb_printf(x->out, "-\\U%08X", s->r[i].hi);
        }
    }
    gr__sb_puts(x->out, "]");
}

static void
utf8_put(gr_sb_t *b, uint32_t cp)
{
    char o[4];
    int n;
    if (cp < 0x80) {
        o[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    gr__sb_add(b, o, (size_t)n);
}

static void
emit_char(rx_t *x, uint32_t cp)
{
    gr_sb_t t = {0};
    if (x->json && (cp == '"' || cp == '\\')) {
        char e[2] = {'\\', (char)cp};
        gr__sb_add(&t, e, 2);
    } else if (x->json && cp < 0x20) {
        const char *sh = cp == '\n'   ? "\\n"
                         : cp == '\t' ? "\\t"
                         : cp == '\r' ? "\\r"
                         : cp == '\b' ? "\\b"
                         : cp == '\f' ? "\\f"
                                      : NULL;
        if (sh != NULL) {
            gr__sb_puts(&t, sh);
        } else {
            gr__sb_printf(&t, "\\u%04x", cp);
        }
    } else {
        utf8_put(&t, cp);
    }
    gr__sb_literal(x->out, t.p, t.n);
    free(t.p);
}

static int
hexv(char c)
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

static int
decode_cp(rx_t *x, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)x->p;
    int n = s[0] < 0x80             ? 1
            : (s[0] & 0xE0) == 0xC0 ? 2
            : (s[0] & 0xF0) == 0xE0 ? 3
            : (s[0] & 0xF8) == 0xF0 ? 4
                                    : 0;
    if (n == 0) {
        rx_err(x, "invalid UTF-8 in the regex");
        return 0;
    }
    *cp = n == 1 ? s[0] : (uint32_t)(s[0] & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            rx_err(x, "invalid UTF-8 in the regex");
            return 0;
        }
        *cp = (*cp << 6) | (s[i] & 0x3F);
    }
    x->p += n;
    return 1;
}

/* A predefined class letter (d w s D W S) into s; 0 if c is not one. */
static int
class_escape(char c, gr_cpset_t *s, int *negate)
{
    *negate = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd':
    case 'D':
        gr_cpset_add(s, '0', '9');
        return 1;
    case 'w':
    case 'W':
        gr_cpset_add(s, 'a', 'z');
        gr_cpset_add(s, 'A', 'Z');
        gr_cpset_add(s, '0', '9');
        gr_cpset_add(s, '_', '_');
        return 1;
    case 's':
    case 'S':
        gr_cpset_add(s, ' ', ' ');
        gr_cpset_add(s, '\t', '\r'); /* \t \n \v \f \r */
        return 1;
    default:
        return 0;
    }
}

/* One escaped character after '\' (x->p at the letter). */
static int
escape_char(rx_t *x, uint32_t *cp)
{
    char c = *x->p++;
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
    case 'f':
        *cp = '\f';
        return 1;
    case 'v':
        *cp = '\v';
        return 1;
    case '0':
        *cp = 0;
        return 1;
    case 'x':
        digits = 2;
        break;
    case 'u':
        digits = 4;
        break;
    case '\0':
        rx_err(x, "regex ends with '\\'");
        return 0;
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
            rx_err(x, "unsupported regex escape '\\%c'", c);
            return 0;
        }
        x->p--;
        return decode_cp(x, cp);
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexv(*x->p);
        if (h < 0) {
            rx_err(x, "bad '\\%c' escape in the regex", c);
            return 0;
        }
        v = v * 16 + (uint32_t)h;
        x->p++;
    }
    *cp = v;
    return 1;
}

static void
parse_class(rx_t *x)
{
    gr_cpset_t s = {0};
    int negate = 0;

    x->p++; /* [ */
    if (*x->p == '^') {
        negate = 1;
        x->p++;
    }
    int first = 1;
    while (!x->failed && (*x->p != ']' || first)) {
        uint32_t lo, hi;
        first = 0;
        if (*x->p == '\0') {
            rx_err(x, "unterminated class in the regex");
            break;
        }
        if (*x->p == '\\') {
            int neg;
            gr_cpset_t t = {0};
            if (class_escape(x->p[1], &t, &neg)) {
                x->p += 2;
                if (neg) {
                    gr_cpset_complement(&t);
                }
                for (int i = 0; i < t.n; i++) {
                    gr_cpset_add(&s, t.r[i].lo, t.r[i].hi);
                }
                free(t.r);
                continue;
            }
            x->p++;
            if (!escape_char(x, &lo)) {
                break;
            }
        } else if (!decode_cp(x, &lo)) {
            break;
        }
        hi = lo;
        if (x->p[0] == '-' && x->p[1] != ']' && x->p[1] != '\0') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                if (!escape_char(x, &hi)) {
                    break;
                }
            } else if (!decode_cp(x, &hi)) {
                break;
            }
            if (hi < lo) {
                rx_err(x, "bad range in a regex class");
                break;
            }
        }
        gr_cpset_add(&s, lo, hi);
    }
    if (!x->failed) {
        x->p++; /* ] */
        if (negate) {
            gr_cpset_complement(&s);
        }
        emit_set(x, &s);
    }
    free(s.r);
}

static void parse_alt(rx_t *x);

static long
parse_num(rx_t *x)
{
    long v = 0;
    if (*x->p < '0' || *x->p > '9') {
        return -1;
    }
    while (*x->p >= '0' && *x->p <= '9') {
        v = v * 10 + (*x->p++ - '0');
        if (v > GR_MAX_REPEAT) {
            rx_err(x, "regex repetition bound over %d", GR_MAX_REPEAT);
            return -1;
        }
    }
    return v;
}

static void
parse_seq(rx_t *x)
{
    int empty = 1;
    for (;;) {
        if (x->failed) {
            return;
        }
        char c = *x->p;
        if (c == '\0' || c == '|' || c == ')') {
            break;
        }
        if (c == '$' && (x->p[1] == '\0' || x->p[1] == '|' || x->p[1] == ')')) {
            x->p++; /* the output ends here anyway */
            continue;
        }
        if (c == '^') {
            x->p++;
            continue;
        }
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            rx_err(x, "regex quantifier '%c' without an item", c);
            return;
        }
        gr__sb_puts(x->out, empty ? "( " : " ( ");
        empty = 0;
        if (c == '(') {
            x->p++;
            if (x->p[0] == '?') {
                if (x->p[1] != ':') {
                    rx_err(x, "unsupported regex group '(?%c'", x->p[1]);
                    return;
                }
                x->p += 2;
            }
            if (++x->depth > 100) {
                rx_err(x, "regex nested too deeply");
                return;
            }
            parse_alt(x);
            x->depth--;
            if (x->failed) {
                return;
            }
            if (*x->p != ')') {
                rx_err(x, "missing ')' in the regex");
                return;
            }
            x->p++;
        } else if (c == '[') {
            parse_class(x);
        } else if (c == '.') {
            x->p++;
            gr_cpset_t s = {0};
            gr_cpset_add(&s, '\n', '\n');
            gr_cpset_complement(&s);
            emit_set(x, &s);
            free(s.r);
        } else if (c == '\\') {
            gr_cpset_t s = {0};
            int neg;
            if (class_escape(x->p[1], &s, &neg)) {
                x->p += 2;
                if (neg) {
                    gr_cpset_complement(&s);
                }
                emit_set(x, &s);
            } else if (x->p[1] == 'b' || x->p[1] == 'B') {
                rx_err(x, "unsupported regex assertion '\\%c'", x->p[1]);
            } else {
                uint32_t cp;
                x->p++;
                if (escape_char(x, &cp)) {
                    emit_char(x, cp);
                }
            }
            free(s.r);
        } else {
            uint32_t cp;
            if (decode_cp(x, &cp)) {
                emit_char(x, cp);
            }
        }
        gr__sb_puts(x->out, " )");
        if (x->failed) {
            return;
        }
        /* quantifier */
        c = *x->p;
        if (c == '*' || c == '+' || c == '?') {
            gr__sb_add(x->out, &c, 1);
            x->p++;
        } else if (c == '{' && x->p[1] >= '0' && x->p[1] <= '9') {
            x->p++;
            long min = parse_num(x), max = min;
            if (*x->p == ',') {
                x->p++;
                max = *x->p == '}' ? -1 : parse_num(x);
            }
            if (x->failed || min < 0 || *x->p != '}' || (max >= 0 && max < min)) {
                rx_err(x, "bad regex repetition");
                return;
            }
            x->p++;
            if (max < 0) {
                gr__sb_printf(x->out, "{%ld,}", min);
            } else {
                gr__sb_printf(x->out, "{%ld,%ld}", min, max);
            }
        } else {
            continue;
        }
        if (*x->p == '?') {
            x->p++; /* lazy: same language */
        } else if (*x->p == '+') {
            rx_err(x, "unsupported possessive quantifier in the regex");
            return;
        }
        if (*x->p == '*' || *x->p == '+' || *x->p == '?' ||
            (*x->p == '{' && x->p[1] >= '0' && x->p[1] <= '9')) {
            rx_err(x, "regex quantifier after a quantifier");
            return;
        }
    }
    if (empty) {
        gr__sb_puts(x->out, "\"\"");
    }
}

static void
parse_alt(rx_t *x)
{
    gr__sb_puts(x->out, "( ");
    for (;;) {
        parse_seq(x);
        if (x->failed || *x->p != '|') {
            break;
        }
        x->p++;
        gr__sb_puts(x->out, " | ");
    }
    gr__sb_puts(x->out, " )");
}

int
gr__regex_expr(const char *re, int json_string, gr_sb_t *out, char *err, size_t errlen)
{
    rx_t x = {.p = re, .json = json_string, .out = out, .err = err, .errlen = errlen};

    parse_alt(&x);
    if (!x.failed && *x.p != '\0') {
        rx_err(&x, "unbalanced ')' in the regex");
    }
    return x.failed ? ST_EINVAL : ST_OK;
}

int
gr__regex_to_gbnf(const char *re, gr_sb_t *out, char *err, size_t errlen)
{
    gr__sb_puts(out, "root ::= ");
    int rc = gr__regex_expr(re, 0, out, err, errlen);
    gr__sb_puts(out, "\n");
    return rc;
}

int
gr__choice_to_gbnf(const char *json, gr_sb_t *out, char *err, size_t errlen)
{
    cJSON *a = cJSON_Parse(json);
    int i = 0;

    if (a == NULL || !cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0) {
        cJSON_Delete(a);
        snprintf(err, errlen, "choice must be a non-empty array of strings");
        return ST_EINVAL;
    }
    gr__sb_puts(out, "root ::= ");
    for (const cJSON *c = a->child; c != NULL; c = c->next, i++) {
        if (!cJSON_IsString(c)) {
            cJSON_Delete(a);
            snprintf(err, errlen, "choice must be a non-empty array of strings");
            return ST_EINVAL;
        }
        gr__sb_puts(out, i ? " | " : "");
        gr__sb_literal(out, c->valuestring, strlen(c->valuestring));
    }
    gr__sb_puts(out, "\n");
    cJSON_Delete(a);
    return ST_OK;
}
