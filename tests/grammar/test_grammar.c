/* test_grammar.c - the constrained-decoding engine (grammar/grammar.h):
 * the corpus (tests/grammar/corpus.json: JSON Schema, json_object, GBNF,
 * regex and choice cases, each with documents the matcher must accept and
 * documents it must refuse), the token mask against a brute-force check of
 * every token, copy and rollback, EOS and completion, and compile errors
 * that name what is unsupported.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"

#define EOS_ID 0

/* A small vocabulary: EOS (id 0, no bytes), every single byte (ids 1..256:
 * byte b is id b + 1), and multi-byte tokens in the shapes real
 * vocabularies have (JSON punctuation runs, words with a leading space,
 * whole and partial UTF-8 characters, digit runs). */
static const char *const k_multi[] = {
    "{\"",      "\":",          "\",",   "\"}",         "\": \"", "true", "false", "null",
    " {",       "}\n",          "  ",    "\n  ",        " \"",    "na",   "name",  "\"name\"",
    "age",      "12",           "123",   "2024",        "-0",     "0.",   ".5",    "e+",
    "\xc3\xa9", "\xc3",         "\xa9x", "caf\xc3\xa9", "yes",    "yes,", " sir",  "no",
    "ab",       "abc",          "]}",    "[{",          "},{",    "\\\"", "\\u00", "<a",
    ">",        "\xe4\xb8\xad", ", ",    "),",          "((",     "1+",
};

static gr_vocab_t *
small_vocab(int32_t *n_out)
{
    int32_t n_multi = (int32_t)(sizeof(k_multi) / sizeof(k_multi[0]));
    int32_t n = 257 + n_multi;
    const char **bytes = calloc((size_t)n, sizeof(char *));
    uint32_t *lens = calloc((size_t)n, sizeof(uint32_t));
    static char single[256];
    gr_vocab_t *v;
    int32_t eos = EOS_ID;

    for (int b = 0; b < 256; b++) {
        single[b] = (char)b;
        bytes[b + 1] = &single[b];
        lens[b + 1] = 1;
    }
    for (int32_t i = 0; i < n_multi; i++) {
        bytes[257 + i] = k_multi[i];
        lens[257 + i] = (uint32_t)strlen(k_multi[i]);
    }
    ck_assert_int_eq(gr_vocab_create(n, bytes, lens, &eos, 1, &v), ST_OK);
    free(bytes);
    free(lens);
    *n_out = n;
    return v;
}

static cJSON *
load_corpus(void)
{
    FILE *f = fopen(GR_CORPUS, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", GR_CORPUS);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    cJSON *c = cJSON_Parse(buf);
    free(buf);
    ck_assert(c != NULL && cJSON_IsArray(c));
    return c;
}

static gr_kind_t
case_kind(const cJSON *c)
{
    const char *k = cJSON_GetObjectItem(c, "kind")->valuestring;
    return strcmp(k, "json_schema") == 0   ? GR_KIND_JSON_SCHEMA
           : strcmp(k, "json_object") == 0 ? GR_KIND_JSON_OBJECT
           : strcmp(k, "gbnf") == 0        ? GR_KIND_GBNF
           : strcmp(k, "regex") == 0       ? GR_KIND_REGEX
                                           : GR_KIND_CHOICE;
}

/* The case's spec as the text gr_compile takes (schemas and choice lists
 * as JSON text, GBNF and regex as the string). Owned by the caller. */
static char *
case_spec(const cJSON *c)
{
    const cJSON *s = cJSON_GetObjectItem(c, "spec");
    if (cJSON_IsString(s)) {
        return strdup(s->valuestring);
    }
    if (cJSON_IsNull(s)) {
        return NULL;
    }
    return cJSON_PrintUnformatted(s);
}

static gr_grammar_t *
case_compile(const cJSON *c, const gr_vocab_t *v)
{
    char err[256] = "";
    char *spec = case_spec(c);
    gr_grammar_t *g = NULL;
    int rc = gr_compile(case_kind(c), spec, v, &g, err, sizeof(err));
    ck_assert_msg(rc == ST_OK, "case %s: %s", cJSON_GetObjectItem(c, "name")->valuestring, err);
    free(spec);
    return g;
}

/* 1 when the whole text is a sentence of g (fed one byte per step). */
static int
matches(gr_grammar_t *g, const char *text)
{
    gr_matcher_t *m = gr_matcher_create(g);
    int ok = 1;
    for (size_t i = 0; text[i] != '\0' && ok; i++) {
        ok = gr_matcher_accept_bytes(m, text + i, 1) == ST_OK;
    }
    ok = ok && gr_matcher_accepting(m);
    gr_matcher_destroy(m);
    return ok;
}

START_TEST(test_corpus_accepts_exactly_the_valid)
{
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    cJSON *corpus = load_corpus();
    int n_docs = 0;

    for (const cJSON *c = corpus->child; c != NULL; c = c->next) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        gr_grammar_t *g = case_compile(c, v);
        const cJSON *d;
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(c, "valid"))
        {
            ck_assert_msg(matches(g, d->valuestring), "case %s: valid %s refused (grammar:\n%s)",
                          name, d->valuestring, gr_grammar_gbnf(g));
            /* In one step too. */
            gr_matcher_t *m = gr_matcher_create(g);
            ck_assert_int_eq(gr_matcher_accept_bytes(m, d->valuestring, strlen(d->valuestring)),
                             ST_OK);
            ck_assert(gr_matcher_accepting(m));
            gr_matcher_destroy(m);
            n_docs++;
        }
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(c, "invalid"))
        {
            ck_assert_msg(!matches(g, d->valuestring), "case %s: invalid %s accepted", name,
                          d->valuestring);
            n_docs++;
        }
        gr_grammar_destroy(g);
    }
    ck_assert_int_gt(n_docs, 150);
    cJSON_Delete(corpus);
    gr_vocab_destroy(v);
}
END_TEST

static int
mask_bit(const uint32_t *mask, int32_t id)
{
    return (mask[id >> 5] >> (id & 31)) & 1;
}

/* The mask of m equals, token by token, whether a copy of m accepts it. */
static void
check_mask(gr_matcher_t *m, int32_t nv, const char *where)
{
    uint32_t *mask = calloc((size_t)(nv + 31) / 32, 4);
    gr_matcher_fill_mask(m, mask);
    for (int32_t id = 0; id < nv; id++) {
        gr_matcher_t *c = gr_matcher_copy(m);
        int ok = gr_matcher_accept_token(c, id) == ST_OK;
        ck_assert_msg(ok == mask_bit(mask, id), "%s: token %d: mask %d, accept %d", where, id,
                      mask_bit(mask, id), ok);
        gr_matcher_destroy(c);
    }
    /* Again, from the per-state cache: the same bits. */
    uint32_t *again = calloc((size_t)(nv + 31) / 32, 4);
    gr_matcher_fill_mask(m, again);
    ck_assert(memcmp(mask, again, (size_t)(nv + 31) / 32 * 4) == 0);
    free(again);
    free(mask);
}

START_TEST(test_mask_equals_brute_force)
{
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    cJSON *corpus = load_corpus();
    int n_checked = 0;

    for (const cJSON *c = corpus->child; c != NULL; c = c->next) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        gr_grammar_t *g = case_compile(c, v);
        const cJSON *d = cJSON_GetObjectItem(c, "valid")->child;
        gr_matcher_t *m = gr_matcher_create(g);
        char where[160];
        /* Every prefix of the first valid document. */
        for (size_t i = 0;; i++) {
            snprintf(where, sizeof(where), "%s at byte %zu", name, i);
            check_mask(m, nv, where);
            n_checked++;
            if (d->valuestring[i] == '\0') {
                break;
            }
            ck_assert_int_eq(gr_matcher_accept_bytes(m, d->valuestring + i, 1), ST_OK);
        }
        /* At the end, EOS is allowed: the document is complete. */
        uint32_t mask[64];
        ck_assert_int_le((nv + 31) / 32, 64);
        gr_matcher_fill_mask(m, mask);
        ck_assert(mask_bit(mask, EOS_ID));
        gr_matcher_destroy(m);
        uint64_t walks, hits;
        gr_grammar_stats(g, &walks, &hits);
        ck_assert_uint_gt(hits, 0);
        gr_grammar_destroy(g);
    }
    ck_assert_int_gt(n_checked, 250);
    cJSON_Delete(corpus);
    gr_vocab_destroy(v);
}
END_TEST

START_TEST(test_eos_only_when_accepting_and_done)
{
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    gr_grammar_t *g = NULL;
    char err[200];
    uint32_t mask[64];

    ck_assert_int_eq(
        gr_compile(GR_KIND_CHOICE, "[\"yes\",\"yes, sir\",\"no\"]", v, &g, err, sizeof(err)),
        ST_OK);
    gr_matcher_t *m = gr_matcher_create(g);
    gr_matcher_fill_mask(m, mask);
    ck_assert(!mask_bit(mask, EOS_ID));
    ck_assert_int_eq(gr_matcher_accept_token(m, EOS_ID), ST_EINVAL);
    ck_assert_int_eq(gr_matcher_accept_bytes(m, "yes", 3), ST_OK);
    ck_assert(gr_matcher_accepting(m));
    ck_assert(!gr_matcher_done(m)); /* ", sir" may follow */
    gr_matcher_fill_mask(m, mask);
    ck_assert(mask_bit(mask, EOS_ID));
    ck_assert(mask_bit(mask, ',' + 1));
    ck_assert(!mask_bit(mask, 'x' + 1));
    ck_assert_int_eq(gr_matcher_accept_token(m, EOS_ID), ST_OK);
    gr_matcher_destroy(m);

    m = gr_matcher_create(g);
    ck_assert_int_eq(gr_matcher_accept_bytes(m, "no", 2), ST_OK);
    ck_assert(gr_matcher_done(m));
    gr_matcher_fill_mask(m, mask);
    for (int32_t id = 1; id < nv; id++) {
        ck_assert(!mask_bit(mask, id));
    }
    ck_assert(mask_bit(mask, EOS_ID));
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
    gr_vocab_destroy(v);
}
END_TEST

START_TEST(test_copy_and_rollback)
{
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    char err[200];
    gr_grammar_t *g = NULL;
    const char *doc = "{\"a\":[1,{\"b\":\"xy\"},true],\"c\":null}";
    int32_t words = (nv + 31) / 32;
    uint32_t m1[64], m2[64];

    ck_assert_int_eq(gr_compile(GR_KIND_JSON_OBJECT, NULL, v, &g, err, sizeof(err)), ST_OK);
    gr_matcher_t *m = gr_matcher_create(g);
    size_t n = strlen(doc);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(gr_matcher_accept_bytes(m, doc + i, 1), ST_OK);
    }
    ck_assert_int_eq(gr_matcher_steps(m), (int32_t)n);
    ck_assert(gr_matcher_done(m));
    ck_assert_int_eq(gr_matcher_rollback(m, (int32_t)n + 1), ST_EINVAL);
    for (int32_t k = 0; k <= (int32_t)n; k += 3) {
        gr_matcher_t *c = gr_matcher_copy(m);
        ck_assert_int_eq(gr_matcher_rollback(c, k), ST_OK);
        /* A fresh matcher fed the same prefix has the same mask and the same
         * future. */
        gr_matcher_t *f = gr_matcher_create(g);
        if (n - (size_t)k > 0) {
            ck_assert_int_eq(gr_matcher_accept_bytes(f, doc, n - (size_t)k), ST_OK);
        }
        gr_matcher_fill_mask(c, m1);
        gr_matcher_fill_mask(f, m2);
        ck_assert(memcmp(m1, m2, (size_t)words * 4) == 0);
        ck_assert_int_eq(gr_matcher_accept_bytes(c, doc + n - k, (size_t)k), ST_OK);
        ck_assert(gr_matcher_done(c));
        gr_matcher_destroy(c);
        gr_matcher_destroy(f);
    }
    /* The original is untouched by its copies. */
    ck_assert(gr_matcher_done(m));
    ck_assert_int_eq(gr_matcher_steps(m), (int32_t)n);
    /* A refused token changes nothing. */
    ck_assert_int_eq(gr_matcher_rollback(m, 2), ST_OK);
    ck_assert_int_eq(gr_matcher_accept_bytes(m, "x", 1), ST_EINVAL);
    ck_assert_int_eq(gr_matcher_steps(m), (int32_t)n - 2);
    ck_assert_int_eq(gr_matcher_accept_bytes(m, "l}", 2), ST_OK);
    ck_assert(gr_matcher_done(m));
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
    gr_vocab_destroy(v);
}
END_TEST

static void
expect_error(gr_kind_t kind, const char *spec, const char *needle)
{
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    gr_grammar_t *g = NULL;
    char err[256] = "";
    ck_assert_int_eq(gr_compile(kind, spec, v, &g, err, sizeof(err)), ST_EINVAL);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' does not name '%s'", err, needle);
    gr_vocab_destroy(v);
}

START_TEST(test_errors_name_the_feature)
{
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}",
                 "'not' at #/properties/a");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}",
                 "format 'email'");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":0.5}",
                 "bounds on type 'number'");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"$ref\":\"http://x/y\"}", "$ref");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"patternProperties\":{}}", "patternProperties");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":", "not valid JSON");
    expect_error(GR_KIND_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}",
                 "no value");
    expect_error(GR_KIND_GBNF, "root ::= root \"a\" | \"b\"", "left recursion");
    expect_error(GR_KIND_GBNF, "root ::= x? root2\nroot2 ::= root \"a\"\nx ::= \"\"",
                 "left recursion");
    expect_error(GR_KIND_GBNF, "root ::= foo", "'foo' is used but not defined");
    expect_error(GR_KIND_GBNF, "start ::= \"a\"", "no 'root'");
    expect_error(GR_KIND_GBNF, "root ::= \"a", "end of grammar");
    expect_error(GR_KIND_GBNF, "root ::= [a-", "end of grammar");
    expect_error(GR_KIND_GBNF, "root ::= \"a\"{3,2}", "max < min");
    expect_error(GR_KIND_REGEX, "(a)\\1", "escape '\\1'");
    expect_error(GR_KIND_REGEX, "(?=a)", "(?=");
    expect_error(GR_KIND_REGEX, "a\\b", "\\b");
    expect_error(GR_KIND_REGEX, "(ab", "missing ')'");
    expect_error(GR_KIND_CHOICE, "[1,2]", "array of strings");
}
END_TEST

START_TEST(test_long_repetition_stays_flat)
{
    /* x* is right recursion: 5000 steps must neither fail nor grow the
     * state (tail calls do not push). */
    int32_t nv;
    gr_vocab_t *v = small_vocab(&nv);
    gr_grammar_t *g = NULL;
    char err[200];
    ck_assert_int_eq(gr_compile(GR_KIND_REGEX, "(ab)*c", v, &g, err, sizeof(err)), ST_OK);
    gr_matcher_t *m = gr_matcher_create(g);
    for (int i = 0; i < 5000; i++) {
        ck_assert_int_eq(gr_matcher_accept_bytes(m, "ab", 2), ST_OK);
    }
    uint32_t mask[64];
    gr_matcher_fill_mask(m, mask);
    ck_assert(mask_bit(mask, 'a' + 1) && mask_bit(mask, 'c' + 1) && !mask_bit(mask, 'b' + 1));
    uint64_t walks, hits;
    gr_grammar_stats(g, &walks, &hits);
    ck_assert_uint_eq(walks, 1);
    ck_assert_int_eq(gr_matcher_accept_bytes(m, "c", 1), ST_OK);
    ck_assert(gr_matcher_done(m));
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
    gr_vocab_destroy(v);
}
END_TEST

START_TEST(test_mask_apply)
{
    float logits[40];
    uint32_t mask[2] = {0x5u, 0x80u}; /* tokens 0, 2 and 39 */
    for (int i = 0; i < 40; i++) {
        logits[i] = (float)i;
    }
    gr_mask_apply(mask, logits, 40);
    for (int i = 0; i < 40; i++) {
        if (i == 0 || i == 2 || i == 39) {
            ck_assert(logits[i] == (float)i);
        } else {
            ck_assert(isinf(logits[i]) && logits[i] < 0);
        }
    }
}
END_TEST

Suite *
grammar_grammar_suite(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("grammar");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_corpus_accepts_exactly_the_valid);
    tcase_add_test(tc, test_mask_equals_brute_force);
    tcase_add_test(tc, test_eos_only_when_accepting_and_done);
    tcase_add_test(tc, test_copy_and_rollback);
    tcase_add_test(tc, test_errors_name_the_feature);
    tcase_add_test(tc, test_long_repetition_stays_flat);
    tcase_add_test(tc, test_mask_apply);
    suite_add_tcase(s, tc);
    return s;
}
