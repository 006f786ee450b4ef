/* fuzz_grammar.c - fuzz target: the constrained-decoding engine
 * (grammar/grammar.h) on fuzzed grammars and documents.
 *
 * Input: byte 0 picks the source kind (JSON Schema, json_object, GBNF,
 * regex, choice: value % 5), then the spec up to the first NUL, then the
 * document. Seeds: every case of tests/grammar/corpus.json with each of
 * its documents (make_seeds.py).
 * Properties: compile fails only with ST_EINVAL and a message; fed the
 * document in tokens of a small vocabulary (every byte and a few
 * multi-byte tokens), at every step the mask's bit for the next token
 * equals whether the matcher accepts it, EOS is in the mask exactly when
 * the matcher accepts, a refused token changes nothing, a copy agrees
 * with its original, and rolling back then re-feeding the same tokens
 * gives the same mask. Compiling and matching are linear in the document
 * (a repetition runs in constant stack depth).
 */
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "tests/fuzz/fuzz_common.h"

#define MAX_SPEC 4096
#define MAX_DOC 1024

static gr_vocab_t *g_vocab;
static int32_t g_nv;

static const char *const k_multi[] = {
    "{\"", "\":", "\",", "true", "null", " {", "  ", "\n", "12", "ab", "\xc3\xa9", "\xc3", ", ",
};

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static char single[256];
    int32_t n_multi = (int32_t)(sizeof(k_multi) / sizeof(k_multi[0]));
    const char *bytes[257 + sizeof(k_multi) / sizeof(k_multi[0])];
    uint32_t lens[257 + sizeof(k_multi) / sizeof(k_multi[0])];
    int32_t eos = 0;

    (void)argc;
    (void)argv;
    bytes[0] = NULL;
    lens[0] = 0;
    for (int b = 0; b < 256; b++) {
        single[b] = (char)b;
        bytes[b + 1] = &single[b];
        lens[b + 1] = 1;
    }
    for (int32_t i = 0; i < n_multi; i++) {
        bytes[257 + i] = k_multi[i];
        lens[257 + i] = (uint32_t)strlen(k_multi[i]);
    }
    g_nv = 257 + n_multi;
    if (gr_vocab_create(g_nv, bytes, lens, &eos, 1, &g_vocab) != ST_OK) {
        abort();
    }
    return 0;
}

static int
bit(const uint32_t *m, int32_t id)
{
    return (m[id >> 5] >> (id & 31)) & 1;
}

/* The token that covers doc[i..]: the longest multi-byte token that is a
 * prefix, else the byte. */
static int32_t
next_token(const uint8_t *doc, size_t n, size_t i, size_t *len)
{
    int32_t n_multi = (int32_t)(sizeof(k_multi) / sizeof(k_multi[0]));
    int32_t best = doc[i] + 1;
    *len = 1;
    for (int32_t k = 0; k < n_multi; k++) {
        size_t l = strlen(k_multi[k]);
        if (l > *len && i + l <= n && memcmp(doc + i, k_multi[k], l) == 0) {
            best = 257 + k;
            *len = l;
        }
    }
    return best;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const gr_kind_t kinds[] = {GR_KIND_JSON_SCHEMA, GR_KIND_JSON_OBJECT, GR_KIND_GBNF,
                                      GR_KIND_REGEX, GR_KIND_CHOICE};
    char spec[MAX_SPEC + 1];
    char err[256];
    /* Compared over the vocabulary's words only (mask_bytes). */
    uint32_t mask[(300 + 31) / 32] = {0}, mask2[(300 + 31) / 32] = {0};
    gr_grammar_t *g = NULL;

    if (g_vocab == NULL) {
        LLVMFuzzerInitialize(NULL, NULL);
    }
    if (size < 1) {
        return 0;
    }
    const size_t mask_bytes = (size_t)gr_vocab_mask_words(g_vocab) * 4;
    gr_kind_t kind = kinds[data[0] % 5];
    const uint8_t *p = data + 1, *end = data + size;
    const uint8_t *nul = memchr(p, 0, (size_t)(end - p));
    size_t spec_len = (size_t)((nul ? nul : end) - p);
    if (spec_len > MAX_SPEC) {
        return 0;
    }
    memcpy(spec, p, spec_len);
    spec[spec_len] = '\0';
    const uint8_t *doc = nul ? nul + 1 : end;
    size_t doc_len = (size_t)(end - doc);
    if (doc_len > MAX_DOC) {
        doc_len = MAX_DOC;
    }
    err[0] = '\0';
    int rc = gr_compile(kind, spec, g_vocab, &g, err, sizeof(err));
    if (rc != ST_OK) {
        FUZZ_CHECK(rc == ST_EINVAL && err[0] != '\0' && g == NULL, "rc %d err '%s'", rc, err);
        return 0;
    }
    gr_matcher_t *m = gr_matcher_create(g);
    FUZZ_CHECK(m != NULL, "matcher");
    size_t i = 0;
    int32_t steps = 0;
    while (i < doc_len) {
        size_t len;
        int32_t tok = next_token(doc, doc_len, i, &len);
        gr_matcher_fill_mask(m, mask);
        FUZZ_CHECK(bit(mask, 0) == gr_matcher_accepting(m), "EOS bit vs accepting at %zu", i);
        gr_matcher_t *c = gr_matcher_copy(m);
        int ok = gr_matcher_accept_token(m, tok) == ST_OK;
        FUZZ_CHECK(ok == bit(mask, tok), "mask bit %d vs accept %d for token %d at %zu",
                   bit(mask, tok), ok, tok, i);
        if (!ok) {
            /* Refused: unchanged, and the same as its copy. */
            FUZZ_CHECK(gr_matcher_steps(m) == steps, "steps moved on a refusal");
            gr_matcher_fill_mask(c, mask2);
            FUZZ_CHECK(memcmp(mask, mask2, mask_bytes) == 0, "copy differs");
            gr_matcher_destroy(c);
            break;
        }
        steps++;
        /* Rollback one step and re-feed: the same state. */
        if ((i & 3) == 0) {
            gr_matcher_fill_mask(m, mask);
            FUZZ_CHECK(gr_matcher_rollback(m, 1) == ST_OK, "rollback");
            gr_matcher_fill_mask(m, mask2);
            uint32_t mc[(300 + 31) / 32] = {0};
            gr_matcher_fill_mask(c, mc);
            FUZZ_CHECK(memcmp(mask2, mc, mask_bytes) == 0, "rollback differs from the copy");
            FUZZ_CHECK(gr_matcher_accept_token(m, tok) == ST_OK, "re-feed refused");
            gr_matcher_fill_mask(m, mask2);
            FUZZ_CHECK(memcmp(mask, mask2, mask_bytes) == 0, "re-feed differs");
        }
        gr_matcher_destroy(c);
        i += len;
    }
    if (gr_matcher_done(m)) {
        gr_matcher_fill_mask(m, mask);
        for (int32_t t = 1; t < g_nv; t++) {
            FUZZ_CHECK(!bit(mask, t), "token %d allowed after the end", t);
        }
    }
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
    return 0;
}

/* Linearity: a long array against json_object, a long repetition. */
static uint8_t *
gen_array(size_t k, size_t *len)
{
    const char head[] = "\1\0{\"a\":[";
    uint8_t *b = malloc(sizeof(head) + 2 * k + 4);
    memcpy(b, head, sizeof(head) - 1);
    size_t n = sizeof(head) - 1;
    for (size_t i = 0; i < k; i++) {
        b[n++] = '1';
        b[n++] = ',';
    }
    b[n++] = '1';
    b[n++] = ']';
    b[n++] = '}';
    *len = n;
    return b;
}

static void
run_one(const uint8_t *data, size_t len)
{
    /* Past MAX_DOC the target truncates: feed the whole input directly. */
    char err[256];
    gr_grammar_t *g = NULL;
    if (gr_compile(GR_KIND_JSON_OBJECT, NULL, g_vocab, &g, err, sizeof(err)) != ST_OK) {
        abort();
    }
    gr_matcher_t *m = gr_matcher_create(g);
    const uint8_t *doc = data + 2;
    for (size_t i = 0; i + 2 < len; i++) {
        FUZZ_CHECK(gr_matcher_accept_bytes(m, (const char *)doc + i, 1) == ST_OK, "byte %zu", i);
    }
    FUZZ_CHECK(gr_matcher_done(m), "not done");
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"grammar long array", gen_array, run_one, 2000},
    {NULL, NULL, NULL, 0},
};
