/* fuzz_tokenizer.c - fuzz target: tokenizer encode and decode on arbitrary
 * bytes (invalid UTF-8 included), over three vocabularies: the default
 * model's SentencePiece-style BPE (tokenizer.json), llama.cpp's llama-spm
 * and gpt-2 (byte-level BPE with a PCRE2 pre-tokenizer) GGUF vocabularies.
 *
 * The first input byte picks the tokenizer and the flags; the rest is text.
 * Properties:
 *   - encode succeeds and every id is in [0, vocab);
 *   - decode(encode(x)) == x when x is valid UTF-8, no added token came out
 *     and (SentencePiece) x has no U+2581, which the decoder maps to a space
 *     (tokenizer.h: lossless otherwise);
 *   - decode(ids) is the concatenation of the incremental decoder's chunks,
 *     and every chunk is valid UTF-8, with and without skip_special (the
 *     skipping pass only when a special id came out, or in the replay
 *     build: without special ids both passes take the same path);
 *   - the input read as int32 ids decodes without error once reduced into
 *     the vocabulary, and out-of-range ids give ST_EINVAL.
 * Encoding is linear in the text size (long words, long runs of one
 * character, invalid bytes, long whitespace runs).
 */
#include <string.h>

#include "common/status.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"
#include "tests/fuzz/fuzz_common.h"

#define N_TOK 3

static tok_tokenizer_t *g_tok[N_TOK];
static int g_spm[N_TOK] = {1, 1, 0};

static tok_tokenizer_t *
load_gguf_vocab(const char *name)
{
    char path[1024], err[256];
    gguf_file_t *g = NULL;
    tok_tokenizer_t *t = NULL;

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf", fuzz_source_root(),
             name);
    if (gguf_open(path, &g, err, sizeof(err)) != ST_OK ||
        tok_load_gguf(g, &t, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        exit(1);
    }
    gguf_close(g);
    return t;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char tj[1024], tc[1024], err[256];

    (void)argc;
    (void)argv;
    snprintf(tj, sizeof(tj), "%s/models/austen-2.7m/tokenizer.json", fuzz_source_root());
    snprintf(tc, sizeof(tc), "%s/models/austen-2.7m/tokenizer_config.json", fuzz_source_root());
    if (tok_load_hf(tj, tc, &g_tok[0], err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        exit(1);
    }
    g_tok[1] = load_gguf_vocab("llama-spm");
    g_tok[2] = load_gguf_vocab("gpt-2");
    return 0;
}

static char *
stream_all(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip, size_t *len)
{
    tok_stream_t s;
    size_t cap = 256, used = 0;
    char *all = malloc(cap);
    char chunk[512];

    tok_stream_init(&s, t, skip);
    for (size_t i = 0; i <= n; i++) {
        int k = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof(chunk))
                      : tok_stream_flush(&s, chunk, sizeof(chunk));
        FUZZ_CHECK(k >= 0, "stream push %d", k);
        FUZZ_CHECK(fuzz_utf8_valid(chunk, (size_t)k), "stream chunk not UTF-8");
        if (used + (size_t)k + 1 > cap) {
            cap = (used + (size_t)k + 1) * 2;
            all = realloc(all, cap);
        }
        memcpy(all + used, chunk, (size_t)k);
        used += (size_t)k;
    }
    *len = used;
    return all;
}

static int
is_added(const tok_tokenizer_t *t, int32_t id)
{
    /* Added tokens decode to their literal text (and SentencePiece puts a
     * U+2581 after them): not lossless by design. */
    return id >= 0 && id < t->n_vocab && t->tokens[id].added;
}

/* Decodes ids, checks the stream against it and returns the text (the
 * caller frees it) and its length in *dlen. */
static char *
check_decode(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip, size_t *dlen_out)
{
    char *dec = NULL, *st;
    size_t dlen = 0, slen;

    FUZZ_CHECK(tok_decode(t, ids, n, skip, &dec, &dlen) == ST_OK, "decode");
    FUZZ_CHECK(strlen(dec) <= dlen, "decode length");
    st = stream_all(t, ids, n, skip, &slen);
    /* The stream replaces invalid sequences by U+FFFD: equal when valid. */
    if (fuzz_utf8_valid(dec, dlen)) {
        FUZZ_CHECK(slen == dlen && memcmp(st, dec, dlen) == 0, "stream != decode");
    }
    free(st);
    *dlen_out = dlen;
    return dec;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    int which = data[0] % N_TOK;
    int flags = (data[0] >> 2) & (TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL);
    const tok_tokenizer_t *t = g_tok[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t nv = tok_vocab_size(t);
    int32_t *ids = NULL;
    size_t n = 0;

    FUZZ_CHECK(tok_encode(t, text, len, flags, &ids, &n) == ST_OK, "encode");
    int added = 0, special = 0;
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d out of range", ids[i]);
        added |= is_added(t, ids[i]);
        special |= t->tokens[ids[i]].special;
    }
    size_t dlen;
    char *dec = check_decode(t, ids, n, 0, &dlen);
    if (flags == 0 && !added && fuzz_utf8_valid(text, len) &&
        !(g_spm[which] && memmem(text, len, "\xe2\x96\x81", 3) != NULL) &&
        memchr(text, '\0', len) == NULL) {
        FUZZ_CHECK(dlen == len && memcmp(dec, text, len) == 0,
                   "round trip (tokenizer %d): %zu bytes in, %zu out", which, len, dlen);
    }
    free(dec);
    if (special || fuzz_replay) {
        free(check_decode(t, ids, n, 1, &dlen));
    }
    free(ids);

    /* The bytes as token ids. */
    size_t m = len / 4;
    int32_t *raw = malloc((m + 1) * sizeof(int32_t));
    for (size_t i = 0; i < m; i++) {
        uint32_t v;
        memcpy(&v, text + 4 * i, 4);
        raw[i] = (int32_t)(v % (uint32_t)nv);
    }
    free(check_decode(t, raw, m, data[0] & 1, &dlen));
    raw[m] = nv;
    dec = NULL;
    FUZZ_CHECK(tok_decode(t, raw, m + 1, 0, &dec, &dlen) == ST_EINVAL, "bad id accepted");
    free(dec);
    free(raw);
    return 0;
}

/* ---- linearity: inputs are a selector byte and a text ------------------- */

static uint8_t *
gen_text(uint8_t sel, const char *unit, size_t unit_len, size_t k, size_t *len)
{
    uint8_t *b = malloc(1 + k * unit_len);

    b[0] = sel;
    for (size_t i = 0; i < k; i++) {
        memcpy(b + 1 + i * unit_len, unit, unit_len);
    }
    *len = 1 + k * unit_len;
    return b;
}

static uint8_t *
gen_prose_spm(size_t k, size_t *len)
{
    static const char u[] = "It is a truth universally acknowledged, caf\xc3\xa9. ";
    return gen_text(0, u, sizeof(u) - 1, k, len);
}

static uint8_t *
gen_word_spm(size_t k, size_t *len)
{
    return gen_text(0, "abcdefgh", 8, k, len);
}

static uint8_t *
gen_run_spm(size_t k, size_t *len)
{
    return gen_text(1, "aaaaaaaa", 8, k, len);
}

static uint8_t *
gen_invalid_spm(size_t k, size_t *len)
{
    return gen_text(1, "\xff\xc3\x28\xe2\x82", 5, k, len);
}

static uint8_t *
gen_word_bytelevel(size_t k, size_t *len)
{
    return gen_text(2, "abcdefgh", 8, k, len);
}

static uint8_t *
gen_spaces_bytelevel(size_t k, size_t *len)
{
    return gen_text(2, "        ", 8, k, len);
}

static uint8_t *
gen_invalid_bytelevel(size_t k, size_t *len)
{
    return gen_text(2, "\xff\xc3\x28\xe2\x82", 5, k, len);
}

static void
run_encode(const uint8_t *data, size_t len)
{
    int32_t *ids = NULL;
    size_t n;

    FUZZ_CHECK(tok_encode(g_tok[data[0] % N_TOK], (const char *)data + 1, len - 1, 0, &ids, &n) ==
                   ST_OK,
               "encode");
    free(ids);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"spm prose", gen_prose_spm, run_encode, 256},
    {"spm one long word", gen_word_spm, run_encode, 512},
    {"spm run of one letter", gen_run_spm, run_encode, 512},
    {"spm invalid UTF-8", gen_invalid_spm, run_encode, 512},
    {"byte-level one long word", gen_word_bytelevel, run_encode, 512},
    {"byte-level long spaces", gen_spaces_bytelevel, run_encode, 512},
    {"byte-level invalid UTF-8", gen_invalid_bytelevel, run_encode, 512},
    {NULL, NULL, NULL, 0},
};
