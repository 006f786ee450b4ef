/* tok_test.h - helpers shared by the tokenizer test suites. */
#ifndef TESTS_TOKENIZER_TOK_TEST_H
#define TESTS_TOKENIZER_TOK_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* The source root: $KVS_SOURCE_ROOT (set by meson test), else the build's. */
const char *tt_root(void);
/* Whole file, NUL-terminated; fails the test when unreadable. */
char *tt_read_file(const char *path, size_t *len);
/* 1 if id is an added token (split out of the text before the model). */
int tt_is_added(const tok_tokenizer_t *t, int32_t id);
/* decode(ids) == text[0..len), and the incremental decoder gives the same
 * bytes when fed one id at a time. */
void tt_assert_roundtrip(const tok_tokenizer_t *t, const char *text, size_t len, const int32_t *ids,
                         size_t n);
/* Streams ids through tok_stream_* and returns the concatenated text. */
char *tt_stream_all(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                    size_t *len);

Suite *tokenizer_vocab_suite(void);
Suite *tokenizer_hf_suite(void);

#endif /* TESTS_TOKENIZER_TOK_TEST_H */
