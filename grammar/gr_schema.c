/* gr_schema.c - JSON Schema (and json_object) -> GBNF text.
 *
 * DESIGN
 *   The subset OpenAI's strict mode and vLLM accept: type (or a list of
 *   types), object properties / required / additionalProperties, array
 *   items / minItems / maxItems, string enum / const / minLength /
 *   maxLength / pattern / format (date, time, date-time, uuid), integer
 *   bounds (minimum, maximum, exclusive*: an exact digit-range grammar),
 *   boolean, null, enum and const of any JSON value, anyOf, oneOf (as
 *   anyOf: exclusivity is not enforced), allOf of one schema, $ref to
 *   "#", #/$defs/x or #/definitions/x (recursion allowed). Annotations
 *   (title, description, default, examples, ...) are ignored. Any other
 *   keyword, and the combinations this cannot express, are refused with
 *   a message naming the keyword and where it is.
 *
 *   Properties come out in the schema's order. additionalProperties false,
 *   or absent when properties are given (strict mode's reading, as
 *   xgrammar does), allows only the declared keys; true or a schema adds
 *   free pairs after them. Whitespace between tokens is at most one space
 *   or a newline and 12 spaces, numbers have at most 16 integer and 16
 *   fraction digits, so a constrained output always ends in bounded
 *   length once strings are bounded. The output may start with one space
 *   (SentencePiece tokens carry it) and ends at the closing byte.
 *
 * Thread: any; cJSON with the hooks the caller installed.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "grammar/gr_int.h"

static const char k_prelude[] =
    "ws ::= ( \" \" | \"\\n\" \" \"{0,12} )?\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* "
    ")? "
    "\"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n";

typedef struct sc {
    gr_sb_t *out;
    const cJSON *root;
    char *err;
    size_t errlen;
    int failed;
    int n_rules;
    /* $ref targets already given a rule: "|path=name" entries */
    gr_sb_t refs;
} sc_t;

static void sc_err(sc_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
sc_err(sc_t *c, const char *fmt, ...)
{
    va_list ap;
    if (c->failed) {
        return;
    }
    c->failed = 1;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
}

static char *
new_name(sc_t *c)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "s%d", c->n_rules++);
    return xstrdup(buf);
}

/* JSON text of a string, quotes included. */
static void
json_string(gr_sb_t *b, const char *s)
{
    gr__sb_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            gr__sb_add(b, e, 2);
        } else if (*p < 0x20) {
            gr__sb_printf(b, "\\u%04x", *p);
        } else {
            gr__sb_add(b, (const char *)p, 1);
        }
    }
    gr__sb_add(b, "\"", 1);
}

/* Appends a GBNF literal for the JSON text of value v. */
static int
json_literal(sc_t *c, gr_sb_t *b, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (t == NULL) {
        sc_err(c, "out of memory");
        return 0;
    }
    gr__sb_literal(b, t, strlen(t));
    cJSON_free(t);
    return 1;
}

static int
is_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "default",    "examples", "$schema",
                                      "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                      "$defs", "definitions", "strict",     "name",     NULL};
    for (int i = 0; ann[i] != NULL; i++) {
        if (strcmp(k, ann[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static int
keyword_known(const char *k)
{
    static const char *const kw[] = {"type",
                                     "properties",
                                     "required",
                                     "additionalProperties",
                                     "items",
                                     "minItems",
                                     "maxItems",
                                     "enum",
                                     "const",
                                     "minLength",
                                     "maxLength",
                                     "pattern",
                                     "format",
                                     "minimum",
                                     "maximum",
                                     "exclusiveMinimum",
                                     "exclusiveMaximum",
                                     "anyOf",
                                     "oneOf",
                                     "allOf",
                                     "$ref",
                                     "uniqueItems",
                                     NULL};
    for (int i = 0; kw[i] != NULL; i++) {
        if (strcmp(k, kw[i]) == 0) {
            return 1;
        }
    }
    return is_annotation(k);
}

static char *gen(sc_t *c, const cJSON *s, const char *path);

/* A non-negative integer keyword, or -1 when absent. */
static long
get_count(sc_t *c, const cJSON *s, const char *key, const char *path)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, key);
    if (j == NULL) {
        return -1;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble != floor(j->valuedouble) ||
        j->valuedouble > GR_MAX_REPEAT) {
        sc_err(c, "'%s' at %s must be an integer in 0..%d", key, path, GR_MAX_REPEAT);
        return -1;
    }
    return (long)j->valuedouble;
}

static void
repeat_suffix(gr_sb_t *b, long min, long max)
{
    if (max < 0) {
        if (min == 0) {
            gr__sb_puts(b, "*");
        } else {
            gr__sb_printf(b, "{%ld,}", min);
        }
    } else {
        gr__sb_printf(b, "{%ld,%ld}", min, max);
    }
}

/* ---- integers -------------------------------------------------------------- */

/* Digit strings of exactly n digits (leading zeros allowed) in [x, y]. */
static void
fixed_range(gr_sb_t *b, int64_t x, int64_t y, int n)
{
    if (n == 0) {
        gr__sb_puts(b, "\"\"");
        return;
    }
    int64_t p = 1;
    for (int i = 1; i < n; i++) {
        p *= 10;
    }
    int xd = (int)(x / p), yd = (int)(y / p);
    int64_t xr = x % p, yr = y % p;
    if (xd == yd) {
        gr__sb_printf(b, "\"%d\" ", xd);
        if (n > 1) {
            gr__sb_puts(b, "( ");
            fixed_range(b, xr, yr, n - 1);
            gr__sb_puts(b, " )");
        }
        return;
    }
    gr__sb_puts(b, "( ");
    int lo = xd, hi = yd;
    int first = 1;
    if (xr != 0) {
        gr__sb_printf(b, "\"%d\" ( ", xd);
        fixed_range(b, xr, p - 1, n - 1);
        gr__sb_puts(b, " )");
        first = 0;
        lo = xd + 1;
    }
    if (yr != p - 1) {
        hi = yd - 1;
    }
    if (lo <= hi) {
        gr__sb_printf(b, "%s[%d-%d]", first ? "" : " | ", lo, hi);
        if (n > 1) {
            gr__sb_printf(b, " [0-9]{%d}", n - 1);
        }
        first = 0;
    }
    if (yr != p - 1) {
        gr__sb_printf(b, "%s\"%d\" ( ", first ? "" : " | ", yd);
        fixed_range(b, 0, yr, n - 1);
        gr__sb_puts(b, " )");
    }
    gr__sb_puts(b, " )");
}

static int
n_digits(int64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Decimal forms (no sign, no leading zeros) of [a, b], b < 0: no upper
 * bound (at most 16 digits, as the plain integer rule). */
static void
uint_range(gr_sb_t *b, int64_t a, int64_t hi)
{
    int first = 1;
    int la = n_digits(a), lb = hi < 0 ? 16 : n_digits(hi);
    gr__sb_puts(b, "( ");
    for (int len = la; len <= lb; len++) {
        int64_t lo_len = 1, hi_len = 9;
        for (int i = 1; i < len; i++) {
            lo_len *= 10;
            hi_len = hi_len * 10 + 9;
        }
        if (len == 1) {
            lo_len = 0;
        }
        int64_t x = a > lo_len ? a : lo_len;
        int64_t y = hi >= 0 && hi < hi_len ? hi : hi_len;
        if (x > y) {
            continue;
        }
        if (hi < 0 && x == lo_len && len > 1) {
            /* Every longer length is whole: one rule for the rest. */
            gr__sb_printf(b, "%s[1-9] [0-9]{%d,15}", first ? "" : " | ", len - 1);
            first = 0;
            break;
        }
        gr__sb_puts(b, first ? "" : " | ");
        fixed_range(b, x, y, len);
        first = 0;
    }
    if (first) {
        gr__sb_puts(b, "[^\\x00-\\U0010FFFF]"); /* empty: nothing matches */
    }
    gr__sb_puts(b, " )");
}

static int
get_bound(sc_t *c, const cJSON *s, const char *key, double *v, const char *path)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, key);
    if (j == NULL) {
        return 0;
    }
    if (!cJSON_IsNumber(j)) {
        sc_err(c, "'%s' at %s must be a number", key, path);
        return 0;
    }
    *v = j->valuedouble;
    return 1;
}

static void
gen_integer(sc_t *c, gr_sb_t *b, const cJSON *s, const char *path)
{
    double v;
    int has_lo = 0, has_hi = 0;
    int64_t lo = 0, hi = 0;
    const double lim = 1e15;

    if (get_bound(c, s, "minimum", &v, path)) {
        has_lo = 1;
        lo = (int64_t)ceil(v < -lim ? -lim : v > lim ? lim : v);
    }
    if (get_bound(c, s, "exclusiveMinimum", &v, path)) {
        int64_t x = (int64_t)floor(v < -lim ? -lim : v > lim ? lim : v) + 1;
        if (!has_lo || x > lo) {
            lo = x;
        }
        has_lo = 1;
    }
    if (get_bound(c, s, "maximum", &v, path)) {
        has_hi = 1;
        hi = (int64_t)floor(v < -lim ? -lim : v > lim ? lim : v);
    }
    if (get_bound(c, s, "exclusiveMaximum", &v, path)) {
        int64_t x = (int64_t)ceil(v < -lim ? -lim : v > lim ? lim : v) - 1;
        if (!has_hi || x < hi) {
            hi = x;
        }
        has_hi = 1;
    }
    if (c->failed) {
        return;
    }
    if (!has_lo && !has_hi) {
        gr__sb_puts(b, "integer");
        return;
    }
    if (has_lo && has_hi && lo > hi) {
        sc_err(c, "integer bounds at %s admit no value", path);
        return;
    }
    int first = 1;
    gr__sb_puts(b, "( ");
    /* negative part: "-" followed by magnitudes in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        int64_t mag_lo = has_hi && hi < 0 ? -hi : 1;
        int64_t mag_hi = has_lo ? -lo : -1;
        gr__sb_puts(b, "\"-\" ");
        uint_range(b, mag_lo, mag_hi);
        first = 0;
    }
    /* non-negative part: [max(0, lo), hi] */
    if (!has_hi || hi >= 0) {
        gr__sb_puts(b, first ? "" : " | ");
        uint_range(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    gr__sb_puts(b, " )");
}

/* ---- strings --------------------------------------------------------------- */

static void
gen_string(sc_t *c, gr_sb_t *b, const cJSON *s, const char *path)
{
    long min = get_count(c, s, "minLength", path);
    long max = get_count(c, s, "maxLength", path);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");

    if (c->failed) {
        return;
    }
    if (max >= 0 && min > max) {
        sc_err(c, "minLength > maxLength at %s", path);
        return;
    }
    if ((pat != NULL || fmt != NULL) && (min >= 0 || max >= 0)) {
        sc_err(c, "unsupported JSON Schema: minLength/maxLength together with %s at %s",
               pat != NULL ? "pattern" : "format", path);
        return;
    }
    if (pat != NULL && fmt != NULL) {
        sc_err(c, "unsupported JSON Schema: pattern together with format at %s", path);
        return;
    }
    if (pat != NULL) {
        if (!cJSON_IsString(pat)) {
            sc_err(c, "'pattern' at %s must be a string", path);
            return;
        }
        char e[200];
        gr__sb_puts(b, "\"\\\"\" ");
        if (gr__regex_expr(pat->valuestring, 1, b, e, sizeof(e)) != ST_OK) {
            sc_err(c, "pattern at %s: %s", path, e);
            return;
        }
        gr__sb_puts(b, " \"\\\"\"");
        return;
    }
    if (fmt != NULL) {
        static const char date[] =
            "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | "
            "\"3\" [01] )";
        static const char time[] =
            "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} "
            ")? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
        gr__sb_puts(b, "\"\\\"\" ( ");
        if (strcmp(f, "date") == 0) {
            gr__sb_puts(b, date);
        } else if (strcmp(f, "time") == 0) {
            gr__sb_puts(b, time);
        } else if (strcmp(f, "date-time") == 0) {
            gr__sb_printf(b, "%s \"T\" %s", date, time);
        } else if (strcmp(f, "uuid") == 0) {
            gr__sb_puts(b, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                           "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
        } else {
            sc_err(c,
                   "unsupported JSON Schema: format '%s' at %s (date, time, date-time and "
                   "uuid are supported)",
                   f, path);
            return;
        }
        gr__sb_puts(b, " ) \"\\\"\"");
        return;
    }
    gr__sb_puts(b, "\"\\\"\" char");
    repeat_suffix(b, min < 0 ? 0 : min, max);
    gr__sb_puts(b, " \"\\\"\"");
}

/* ---- arrays and objects ---------------------------------------------------- */

static void
gen_array(sc_t *c, gr_sb_t *b, const cJSON *s, const char *path)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long min = get_count(c, s, "minItems", path);
    long max = get_count(c, s, "maxItems", path);
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    char *item;

    if (c->failed) {
        return;
    }
    if (uniq != NULL && cJSON_IsTrue(uniq)) {
        sc_err(c, "unsupported JSON Schema keyword 'uniqueItems' at %s", path);
        return;
    }
    if (max >= 0 && min > max) {
        sc_err(c, "minItems > maxItems at %s", path);
        return;
    }
    if (items != NULL && !cJSON_IsObject(items) && !cJSON_IsBool(items)) {
        sc_err(c, "unsupported JSON Schema: 'items' at %s must be a schema", path);
        return;
    }
    if (items == NULL || cJSON_IsTrue(items)) {
        item = xstrdup("value");
    } else if (cJSON_IsFalse(items)) {
        item = NULL;
    } else {
        gr_sb_t p = {0};
        gr__sb_printf(&p, "%s/items", path);
        item = gen(c, items, p.p);
        free(p.p);
        if (item == NULL) {
            return;
        }
    }
    if (item == NULL || max == 0) {
        if (min > 0) {
            sc_err(c, "array at %s admits no value", path);
        }
        gr__sb_puts(b, "\"[\" ws \"]\"");
        free(item);
        return;
    }
    if (min <= 0) {
        gr__sb_printf(b, "\"[\" ws ( %s ws ( \",\" ws %s ws )", item, item);
        repeat_suffix(b, 0, max < 0 ? -1 : max - 1);
        gr__sb_puts(b, " )? \"]\"");
    } else {
        gr__sb_printf(b, "\"[\" ws %s ws ( \",\" ws %s ws )", item, item);
        repeat_suffix(b, min - 1, max < 0 ? -1 : max - 1);
        gr__sb_puts(b, " \"]\"");
    }
    free(item);
}

static void
gen_object(sc_t *c, gr_sb_t *b, const cJSON *s, const char *path)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char *add = NULL; /* value rule of free pairs, or NULL */
    int n = 0;

    if (props != NULL && !cJSON_IsObject(props)) {
        sc_err(c, "'properties' at %s must be an object", path);
        return;
    }
    if (req != NULL && !cJSON_IsArray(req)) {
        sc_err(c, "'required' at %s must be an array", path);
        return;
    }
    for (const cJSON *r = req ? req->child : NULL; r != NULL; r = r->next) {
        if (!cJSON_IsString(r)) {
            sc_err(c, "'required' at %s must list property names", path);
            return;
        }
        if (props == NULL || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            sc_err(c,
                   "unsupported JSON Schema: required property '%s' at %s is not in "
                   "'properties'",
                   r->valuestring, path);
            return;
        }
    }
    if (addl == NULL) {
        add = props == NULL ? xstrdup("value") : NULL;
    } else if (cJSON_IsTrue(addl)) {
        add = xstrdup("value");
    } else if (cJSON_IsObject(addl)) {
        gr_sb_t p = {0};
        gr__sb_printf(&p, "%s/additionalProperties", path);
        add = gen(c, addl, p.p);
        free(p.p);
        if (add == NULL) {
            return;
        }
    } else if (!cJSON_IsFalse(addl)) {
        sc_err(c, "'additionalProperties' at %s must be a boolean or a schema", path);
        return;
    }
    for (const cJSON *p = props ? props->child : NULL; p != NULL; p = p->next) {
        n++;
    }
    /* Rules T<i>f (no pair written yet) and T<i>r (after a pair), i = 0..n. */
    char *base = new_name(c);
    char **val = xcalloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    int *is_req = xcalloc((size_t)(n > 0 ? n : 1), sizeof(int));
    gr_sb_t keys = {0};
    size_t *key_off = xcalloc((size_t)(n + 1), sizeof(size_t));
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p != NULL && !c->failed; p = p->next, i++) {
        gr_sb_t pp = {0};
        gr__sb_printf(&pp, "%s/properties/%s", path, p->string);
        val[i] = gen(c, p, pp.p);
        free(pp.p);
        for (const cJSON *r = req ? req->child : NULL; r != NULL; r = r->next) {
            if (strcmp(r->valuestring, p->string) == 0) {
                is_req[i] = 1;
            }
        }
        gr_sb_t js = {0};
        json_string(&js, p->string);
        key_off[i] = keys.n;
        gr__sb_literal(&keys, js.p, js.n);
        gr__sb_add(&keys, "", 0);
        free(js.p);
        key_off[i + 1] = keys.n;
    }
    if (!c->failed) {
        gr_sb_t *o = c->out;
        for (i = n; i >= 0; i--) {
            for (int rest = 0; rest < 2; rest++) {
                gr__sb_printf(o, "%s-%d%c ::= ", base, i, rest ? 'r' : 'f');
                const char *sep = rest ? "\",\" ws " : "";
                if (i == n) {
                    if (add != NULL) {
                        gr__sb_printf(o,
                                      "( %sstring ws \":\" ws %s ws ( \",\" ws string ws \":\" "
                                      "ws %s ws )* )?\n",
                                      sep, add, add);
                    } else {
                        gr__sb_puts(o, "\"\"\n");
                    }
                    continue;
                }
                gr__sb_printf(o, "%s", sep);
                gr__sb_add(o, keys.p + key_off[i], key_off[i + 1] - key_off[i]);
                gr__sb_printf(o, " ws \":\" ws %s ws %s-%dr", val[i], base, i + 1);
                if (!is_req[i]) {
                    gr__sb_printf(o, " | %s-%d%c", base, i + 1, rest ? 'r' : 'f');
                }
                gr__sb_puts(o, "\n");
            }
        }
        gr__sb_printf(b, "\"{\" ws %s-0f \"}\"", base);
    }
    for (i = 0; i < n; i++) {
        free(val[i]);
    }
    free(val);
    free(is_req);
    free(keys.p);
    free(key_off);
    free(base);
    free(add);
}

/* ---- dispatch -------------------------------------------------------------- */

static const cJSON *
resolve_ref(sc_t *c, const char *ref, const char *path)
{
    if (strcmp(ref, "#") == 0) {
        return c->root;
    }
    const char *name = NULL;
    const cJSON *defs = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) {
        name = ref + 8;
        defs = cJSON_GetObjectItemCaseSensitive(c->root, "$defs");
    } else if (strncmp(ref, "#/definitions/", 14) == 0) {
        name = ref + 14;
        defs = cJSON_GetObjectItemCaseSensitive(c->root, "definitions");
    }
    if (name == NULL || strchr(name, '/') != NULL) {
        sc_err(c,
               "unsupported JSON Schema: $ref '%s' at %s (only '#', '#/$defs/NAME' and "
               "'#/definitions/NAME')",
               ref, path);
        return NULL;
    }
    const cJSON *t = defs ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
    if (t == NULL) {
        sc_err(c, "$ref '%s' at %s: no such definition", ref, path);
    }
    return t;
}

/* The body of schema s as a GBNF expression restricted to one type. */
static void
gen_type(sc_t *c, gr_sb_t *b, const cJSON *s, const char *type, const char *path)
{
    if (strcmp(type, "string") == 0) {
        gen_string(c, b, s, path);
    } else if (strcmp(type, "integer") == 0) {
        gen_integer(c, b, s, path);
    } else if (strcmp(type, "number") == 0) {
        double v;
        if (get_bound(c, s, "minimum", &v, path) || get_bound(c, s, "maximum", &v, path) ||
            get_bound(c, s, "exclusiveMinimum", &v, path) ||
            get_bound(c, s, "exclusiveMaximum", &v, path)) {
            sc_err(c,
                   "unsupported JSON Schema: bounds on type 'number' at %s (bounds are "
                   "supported on 'integer')",
                   path);
            return;
        }
        gr__sb_puts(b, "number");
    } else if (strcmp(type, "boolean") == 0) {
        gr__sb_puts(b, "boolean");
    } else if (strcmp(type, "null") == 0) {
        gr__sb_puts(b, "null");
    } else if (strcmp(type, "object") == 0) {
        gen_object(c, b, s, path);
    } else if (strcmp(type, "array") == 0) {
        gen_array(c, b, s, path);
    } else {
        sc_err(c, "unknown JSON Schema type '%s' at %s", type, path);
    }
}

static char *
gen_alts(sc_t *c, const cJSON *list, const char *kw, const char *path)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        sc_err(c, "'%s' at %s must be a non-empty array", kw, path);
        return NULL;
    }
    gr_sb_t b = {0};
    int i = 0;
    for (const cJSON *x = list->child; x != NULL && !c->failed; x = x->next, i++) {
        gr_sb_t p = {0};
        gr__sb_printf(&p, "%s/%s/%d", path, kw, i);
        char *r = gen(c, x, p.p);
        free(p.p);
        if (r != NULL) {
            gr__sb_printf(&b, "%s%s", i ? " | " : "", r);
            free(r);
        }
    }
    if (c->failed) {
        free(b.p);
        return NULL;
    }
    char *name = new_name(c);
    gr__sb_printf(c->out, "%s ::= %s\n", name, b.p);
    free(b.p);
    return name;
}

/* Emits the rules of schema s and returns the name of its rule (owned by
 * the caller), or NULL on error. */
static char *
gen(sc_t *c, const cJSON *s, const char *path)
{
    if (c->failed) {
        return NULL;
    }
    if (cJSON_IsTrue(s)) {
        return xstrdup("value");
    }
    if (!cJSON_IsObject(s)) {
        sc_err(c, "the schema at %s must be an object", path);
        return NULL;
    }
    for (const cJSON *k = s->child; k != NULL; k = k->next) {
        if (!keyword_known(k->string)) {
            sc_err(c, "unsupported JSON Schema keyword '%s' at %s", k->string, path);
            return NULL;
        }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref != NULL) {
        if (!cJSON_IsString(ref)) {
            sc_err(c, "'$ref' at %s must be a string", path);
            return NULL;
        }
        for (const cJSON *k = s->child; k != NULL; k = k->next) {
            if (strcmp(k->string, "$ref") != 0 && !is_annotation(k->string)) {
                sc_err(c, "unsupported JSON Schema: '%s' beside '$ref' at %s", k->string, path);
                return NULL;
            }
        }
        gr_sb_t key = {0};
        gr__sb_printf(&key, "|%s=", ref->valuestring);
        const char *hit = c->refs.p ? strstr(c->refs.p, key.p) : NULL;
        if (hit != NULL) {
            const char *nm = hit + key.n;
            size_t len = strcspn(nm, "|");
            free(key.p);
            return xstrndup(nm, len);
        }
        const cJSON *t = resolve_ref(c, ref->valuestring, path);
        if (t == NULL) {
            free(key.p);
            return NULL;
        }
        char *name = new_name(c);
        gr__sb_add(&c->refs, key.p, key.n);
        gr__sb_puts(&c->refs, name);
        free(key.p);
        char *body = gen(c, t, ref->valuestring);
        if (body == NULL) {
            free(name);
            return NULL;
        }
        gr__sb_printf(c->out, "%s ::= %s\n", name, body);
        free(body);
        return name;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (any != NULL || one != NULL || all != NULL) {
        int n_comb = (any != NULL) + (one != NULL) + (all != NULL);
        const char *kw = any ? "anyOf" : one ? "oneOf" : "allOf";
        for (const cJSON *k = s->child; k != NULL; k = k->next) {
            if (strcmp(k->string, kw) != 0 && !is_annotation(k->string) && n_comb == 1) {
                sc_err(c, "unsupported JSON Schema: '%s' beside '%s' at %s", k->string, kw, path);
                return NULL;
            }
        }
        if (n_comb > 1) {
            sc_err(c, "unsupported JSON Schema: more than one of anyOf/oneOf/allOf at %s", path);
            return NULL;
        }
        if (all != NULL) {
            if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
                sc_err(c, "unsupported JSON Schema: 'allOf' at %s with other than one schema",
                       path);
                return NULL;
            }
            gr_sb_t p = {0};
            gr__sb_printf(&p, "%s/allOf/0", path);
            char *r = gen(c, all->child, p.p);
            free(p.p);
            return r;
        }
        return gen_alts(c, any ? any : one, kw, path);
    }
    gr_sb_t b = {0};
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (en != NULL || cn != NULL) {
        if (cn != NULL) {
            json_literal(c, &b, cn);
        } else if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0) {
            sc_err(c, "'enum' at %s must be a non-empty array", path);
        } else {
            int i = 0;
            gr__sb_puts(&b, "( ");
            for (const cJSON *x = en->child; x != NULL; x = x->next, i++) {
                gr__sb_puts(&b, i ? " | " : "");
                json_literal(c, &b, x);
            }
            gr__sb_puts(&b, " )");
        }
    } else if (type == NULL) {
        int has_obj = cJSON_GetObjectItemCaseSensitive(s, "properties") != NULL;
        int has_arr = cJSON_GetObjectItemCaseSensitive(s, "items") != NULL;
        if (has_obj) {
            gen_object(c, &b, s, path);
        } else if (has_arr) {
            gen_array(c, &b, s, path);
        } else {
            gr__sb_puts(&b, "value");
        }
    } else if (cJSON_IsString(type)) {
        gen_type(c, &b, s, type->valuestring, path);
    } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) {
        int i = 0;
        gr__sb_puts(&b, "( ");
        for (const cJSON *t = type->child; t != NULL && !c->failed; t = t->next, i++) {
            if (!cJSON_IsString(t)) {
                sc_err(c, "'type' at %s must list type names", path);
                break;
            }
            gr__sb_puts(&b, i ? " | " : "");
            gr__sb_puts(&b, "( ");
            gen_type(c, &b, s, t->valuestring, path);
            gr__sb_puts(&b, " )");
        }
        gr__sb_puts(&b, " )");
    } else {
        sc_err(c, "'type' at %s must be a string or an array of strings", path);
    }
    if (c->failed) {
        free(b.p);
        return NULL;
    }
    char *name = new_name(c);
    gr__sb_printf(c->out, "%s ::= %s\n", name, b.p);
    free(b.p);
    return name;
}

int
gr__schema_to_gbnf(const char *schema, gr_sb_t *out, char *err, size_t errlen)
{
    sc_t c;
    cJSON *root = NULL;

    memset(&c, 0, sizeof(c));
    c.out = out;
    c.err = err;
    c.errlen = errlen;
    gr__sb_puts(out, k_prelude);
    if (schema == NULL) {
        gr__sb_puts(out, "root ::= \" \"? object\n");
        return ST_OK;
    }
    root = cJSON_Parse(schema);
    if (root == NULL) {
        snprintf(err, errlen, "the JSON schema is not valid JSON");
        return ST_EINVAL;
    }
    c.root = root;
    char *top = gen(&c, root, "#");
    if (top != NULL && !c.failed) {
        gr__sb_printf(out, "root ::= \" \"? %s\n", top);
    }
    free(top);
    free(c.refs.p);
    cJSON_Delete(root);
    return c.failed ? ST_EINVAL : ST_OK;
}
