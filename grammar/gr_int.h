/* gr_int.h - grammar/ internals shared by its files: the compiled program
 * (the byte-level CFG every source ends up as), the GBNF compiler, the
 * text sources that produce GBNF, and a string builder.
 *
 * Program layout: code[] holds every alternative as a run of elements
 * ended by GR_EL_END; rule r's alternatives start at
 * alt_start[rule_alts[r] .. rule_alts[r + 1]). An element is a 32-bit
 * word: type in the top 2 bits, argument below (byte-class index or rule
 * id).
 *
 * Thread: plain data and functions without shared state.
 */
#ifndef GRAMMAR_GR_INT_H
#define GRAMMAR_GR_INT_H

#include <stddef.h>
#include <stdint.h>

enum { GR_EL_END = 0, GR_EL_CLASS = 1, GR_EL_REF = 2 };

#define GR_EL(type, arg) (((uint32_t)(type) << 30) | (uint32_t)(arg))
#define GR_EL_TYPE(e) ((e) >> 30)
#define GR_EL_ARG(e) ((e)&0x3fffffffu)

/* Limits that keep a hostile grammar from exhausting memory. */
#define GR_MAX_CODE (1 << 22) /* elements */
#define GR_MAX_REPEAT 10000   /* x{m,n} bounds */
#define GR_MAX_SPEC (1 << 20) /* source text bytes */

typedef struct gr_prog {
    uint32_t *code;
    int32_t n_code;
    uint32_t *alt_start; /* [n_alts] positions in code */
    int32_t *rule_alts;  /* [n_rules + 1] offsets into alt_start */
    int32_t n_rules;
    uint32_t (*cls)[8]; /* [n_cls] 256-bit byte sets */
    int32_t n_cls;
    int32_t root;
    char **rule_names; /* [n_rules], for messages */
} gr_prog_t;

/* Growable NUL-terminated string; abort on out of memory (xmalloc). */
typedef struct gr_sb {
    char *p;
    size_t n, cap;
} gr_sb_t;

void gr__sb_add(gr_sb_t *b, const char *s, size_t n);
void gr__sb_puts(gr_sb_t *b, const char *s);
void gr__sb_printf(gr_sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as a GBNF string literal (quotes included). */
void gr__sb_literal(gr_sb_t *b, const char *s, size_t n);

/* Compiles GBNF text into p (zeroed first). ST_OK, or ST_EINVAL with a
 * message in err (line numbers are 1-based). */
int gr__gbnf_compile(const char *text, gr_prog_t *p, char *err, size_t errlen);
void gr__prog_fini(gr_prog_t *p);

/* JSON Schema text (NULL: any JSON object) -> GBNF into out. */
int gr__schema_to_gbnf(const char *schema, gr_sb_t *out, char *err, size_t errlen);
/* A regular expression matching the whole output -> GBNF into out. */
int gr__regex_to_gbnf(const char *re, gr_sb_t *out, char *err, size_t errlen);
/* Appends re as one parenthesized GBNF expression. json_string: the text
 * sits inside a JSON string, so '"', '\' and control characters are
 * written as JSON escapes and never matched raw. */
int gr__regex_expr(const char *re, int json_string, gr_sb_t *out, char *err, size_t errlen);
/* A JSON array of strings -> GBNF into out. */
int gr__choice_to_gbnf(const char *json, gr_sb_t *out, char *err, size_t errlen);

/* ---- code-point sets (gr_cpset.c): the classes of the GBNF and regex parsers */

typedef struct gr_cprange {
    uint32_t lo, hi;
} gr_cprange_t;

typedef struct gr_cpset {
    gr_cprange_t *r; /* owned (free(r)); unsorted until gr_cpset_norm */
    int32_t n, cap;
} gr_cpset_t;

/* Appends [lo, hi]. */
void gr_cpset_add(gr_cpset_t *s, uint32_t lo, uint32_t hi);
/* Sorts and merges overlapping and adjacent ranges, in place. */
void gr_cpset_norm(gr_cpset_t *s);
/* Normalizes, then replaces the set by its complement in 0..0x10FFFF. */
void gr_cpset_complement(gr_cpset_t *s);
/* Removes [lo, hi] from a normalized set. */
void gr_cpset_remove(gr_cpset_t *s, uint32_t lo, uint32_t hi);

#endif /* GRAMMAR_GR_INT_H */
