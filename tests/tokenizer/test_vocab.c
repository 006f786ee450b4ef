/* test_vocab.c - llama.cpp's tokenizer test vectors: every GGUF vocabulary
 * in tests/fixtures/vocab must reproduce the expected ids of its .inp/.out
 * pair (no BOS, special-token text not parsed).
 *
 * Format: the .inp file holds the texts, each followed by the marker line
 * "\n__ggml_vocab_test__\n"; line i of the .out file holds the ids of text
 * i separated by spaces (an empty line for an empty text).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"
#include "tests/tokenizer/tok_test.h"

static const char *const k_vocabs[] = {
    "gpt-2", "llama-spm", "phi-3", "deepseek-llm", "falcon", "starcoder",
};
#define N_VOCABS (sizeof(k_vocabs) / sizeof(k_vocabs[0]))

static const char k_marker[] = "\n__ggml_vocab_test__\n";

static void
check_vocab(const char *name, int *n_pass, int *n_total)
{
    char path[1024], err[512] = "";
    char *inp, *outp;
    size_t inp_len, out_len;
    gguf_file_t *g = NULL;
    tok_tokenizer_t *t = NULL;
    int pass = 0, total = 0;

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf", tt_root(), name);
    ck_assert_msg(gguf_open(path, &g, err, sizeof(err)) == ST_OK, "%s: %s", path, err);
    ck_assert_msg(tok_load_gguf(g, &t, err, sizeof(err)) == ST_OK, "%s: %s", path, err);
    gguf_close(g); /* the tokenizer keeps copies of everything */

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf.inp", tt_root(), name);
    inp = tt_read_file(path, &inp_len);
    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf.out", tt_root(), name);
    outp = tt_read_file(path, &out_len);

    const char *in_cur = inp, *out_cur = outp;
    for (;;) {
        const char *mark = strstr(in_cur, k_marker);
        if (mark == NULL) {
            break;
        }
        const char *eol = strchr(out_cur, '\n');
        ck_assert_msg(eol != NULL, "%s: fewer output lines than inputs", name);

        int32_t *ids = NULL;
        size_t n = 0;
        ck_assert_int_eq(tok_encode(t, in_cur, (size_t)(mark - in_cur), 0, &ids, &n), ST_OK);

        /* Parse the expected ids. */
        int32_t want[1024];
        size_t n_want = 0;
        const char *p = out_cur;
        while (p < eol) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) {
                p++;
                continue;
            }
            ck_assert(n_want < 1024);
            want[n_want++] = (int32_t)v;
            p = end;
        }
        total++;
        int ok = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof(int32_t)) == 0);
        if (ok) {
            pass++;
        } else {
            fprintf(stderr, "%s: text %d \"%.*s\"\n  want:", name, total, (int)(mark - in_cur),
                    in_cur);
            for (size_t i = 0; i < n_want; i++) {
                fprintf(stderr, " %d", want[i]);
            }
            fprintf(stderr, "\n  got: ");
            for (size_t i = 0; i < n; i++) {
                fprintf(stderr, " %d", ids[i]);
            }
            fprintf(stderr, "\n");
        }
        free(ids);
        in_cur = mark + strlen(k_marker);
        out_cur = eol + 1;
    }
    printf("vocab %-14s %d/%d vectors pass\n", name, pass, total);
    fflush(stdout);
    free(inp);
    free(outp);
    tok_destroy(t);
    *n_pass = pass;
    *n_total = total;
}

START_TEST(test_vocab_vectors)
{
    int pass, total;

    check_vocab(k_vocabs[_i], &pass, &total);
    ck_assert_int_ge(total, 40);
    ck_assert_int_eq(pass, total);
}
END_TEST

/* Every vocabulary also round-trips its own test texts through the decoder
 * where the tokenization is lossless (valid UTF-8, no added-token text). */
START_TEST(test_vocab_roundtrip)
{
    char path[1024], err[512] = "";
    gguf_file_t *g = NULL;
    tok_tokenizer_t *t = NULL;
    char *inp;
    size_t inp_len;

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf", tt_root(),
             k_vocabs[_i]);
    ck_assert_msg(gguf_open(path, &g, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(tok_load_gguf(g, &t, err, sizeof(err)) == ST_OK, "%s", err);
    gguf_close(g);
    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-%s.gguf.inp", tt_root(),
             k_vocabs[_i]);
    inp = tt_read_file(path, &inp_len);

    int checked = 0;
    const char *cur = inp;
    for (const char *mark; (mark = strstr(cur, k_marker)) != NULL; cur = mark + strlen(k_marker)) {
        size_t len = (size_t)(mark - cur);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tok_encode(t, cur, len, 0, &ids, &n), ST_OK);
        int has_added = 0;
        for (size_t i = 0; i < n; i++) {
            /* Added tokens decode to their literal text, and SentencePiece
             * puts a "\u2581" after them: not lossless by design. */
            has_added |= tt_is_added(t, ids[i]);
        }
        if (!has_added) {
            tt_assert_roundtrip(t, cur, len, ids, n);
            checked++;
        }
        free(ids);
    }
    ck_assert_int_ge(checked, 30);
    free(inp);
    tok_destroy(t);
}
END_TEST

/* Special tokens under TOK_PARSE_SPECIAL / TOK_ADD_SPECIAL, llama.cpp
 * style: SentencePiece puts "\u2581" after a special token, and Phi-3's
 * added tokens swallow the whitespace that follows them. */
START_TEST(test_vocab_special)
{
    char path[1024], err[512] = "";
    gguf_file_t *g = NULL;
    tok_tokenizer_t *t = NULL;
    int32_t *ids;
    size_t n;
    const char *text = "<|user|>\nHello<|end|>\n<|assistant|>";

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab/ggml-vocab-phi-3.gguf", tt_root());
    ck_assert_msg(gguf_open(path, &g, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(tok_load_gguf(g, &t, err, sizeof(err)) == ST_OK, "%s", err);
    gguf_close(g);
    ck_assert_int_eq(tok_bos_id(t), 1);
    ck_assert_int_eq(tok_eos_id(t), 32000);
    ck_assert_int_eq(
        tok_encode(t, text, strlen(text), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &ids, &n), ST_OK);
    ck_assert_uint_eq(n, 5);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], tok_find(t, "<|user|>"));
    ck_assert_int_eq(ids[2], tok_find(t, "\xe2\x96\x81Hello"));
    ck_assert_int_eq(ids[3], tok_find(t, "<|end|>"));
    ck_assert_int_eq(ids[4], tok_find(t, "<|assistant|>"));
    free(ids);
    /* Without parsing, the same text is plain text. */
    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, &ids, &n), ST_OK);
    ck_assert_uint_gt(n, 10);
    for (size_t i = 0; i < n; i++) {
        ck_assert(!tok_is_special(t, ids[i]));
    }
    free(ids);
    tok_destroy(t);
}
END_TEST

Suite *
tokenizer_vocab_suite(void)
{
    Suite *s = suite_create("tokenizer_vocab");
    TCase *tc = tcase_create("vectors");

    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_vocab_vectors, 0, (int)N_VOCABS);
    tcase_add_loop_test(tc, test_vocab_roundtrip, 0, (int)N_VOCABS);
    tcase_add_test(tc, test_vocab_special);
    suite_add_tcase(s, tc);
    return s;
}
