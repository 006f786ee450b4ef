/* jinja_lex.c - the chat template lexer: source text to tokens.
 *
 * DESIGN
 *   Text between tags becomes TEXT tokens with jinja2's whitespace rules
 *   already applied: "-" strips all whitespace on that side, trim_blocks
 *   drops the newline after a block or comment tag, lstrip_blocks drops
 *   spaces and tabs before a block or comment tag that starts its line, "+"
 *   keeps both. Inside tags: names, string and number literals (strings
 *   decoded), operators. Tokens live in the template's arena.
 *
 * Thread: the compiling thread.
 */

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "common/status.h"
#include "common/utf8.h"
#include "text/jinja_int.h"

/* ==== lexer ============================================================== */

static void
lex_emit(lexer_t *lx, int t, const char *p, size_t n)
{
    tok_t *k;

    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        tok_t *nt = chat__ar_alloc(lx->cx, cap * sizeof(tok_t));

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

    chat__sb_add(cx, b, u, (size_t)utf8_encode(cp, u));
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
                    chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: bad \\%c escape", lx->line, c);
                }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff) {
                chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: bad \\%c escape", lx->line, c);
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
        chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: unterminated string", line);
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
            chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: integer literal too large", lx->line);
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
            chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected end of template in tag",
                          lx->line);
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
            chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected character '%c'", lx->line, c);
        }
        if (c == '(' || c == '[' || c == '{') {
            depth++;
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0) {
                chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: unexpected '%c'", lx->line, c);
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
void
chat__lex_all(lexer_t *lx)
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
                chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: missing end of comment tag", lx->line);
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
                    chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: bad raw tag", lx->line);
                }
                body = p + 2;
                if (s[p - 1] == '-') {
                    while (body < lx->len && is_space((unsigned char)s[body])) {
                        body++;
                    }
                }
                e = body < lx->len ? strstr(s + body, "endraw") : NULL;
                if (e == NULL) {
                    chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: missing endraw", lx->line);
                }
                /* back to the "{%" before endraw */
                bend = (size_t)(e - s);
                while (bend > body && s[bend - 1] != '{') {
                    bend--;
                }
                if (bend == body) {
                    chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: bad endraw", lx->line);
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
                        chat__cx_fail(lx->cx, ST_EFORMAT, "line %d: bad endraw tag", lx->line);
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
