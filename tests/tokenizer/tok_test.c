/* tok_test.c - helpers shared by the tokenizer test suites. */
#include "tests/tokenizer/tok_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"
#include "kvserve_config.h"
#include "text/tokenizer_int.h"

const char *
tt_root(void)
{
    const char *r = getenv("KVS_SOURCE_ROOT");

    return r != NULL && r[0] != '\0' ? r : KVSERVE_SOURCE_ROOT;
}

char *
tt_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    ck_assert_int_ge(n, 0);
    rewind(f);
    buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

int
tt_is_added(const tok_tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->tokens[id].added;
}

char *
tt_stream_all(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip_special, size_t *len)
{
    tok_stream_t s;
    size_t cap = 64, used = 0;
    char *all = malloc(cap);
    char chunk[256];

    tok_stream_init(&s, t, skip_special);
    for (size_t i = 0; i <= n; i++) {
        int k = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof(chunk))
                      : tok_stream_flush(&s, chunk, sizeof(chunk));
        ck_assert_int_ge(k, 0);
        /* Never half a character: every chunk is valid UTF-8 by itself. */
        ck_assert_msg(utf8_valid(chunk, (size_t)k), "chunk %zu is not valid UTF-8", i);
        if (used + (size_t)k + 1 > cap) {
            cap = (used + (size_t)k + 1) * 2;
            all = realloc(all, cap);
        }
        memcpy(all + used, chunk, (size_t)k);
        used += (size_t)k;
    }
    all[used] = '\0';
    if (len != NULL) {
        *len = used;
    }
    return all;
}

void
tt_assert_roundtrip(const tok_tokenizer_t *t, const char *text, size_t len, const int32_t *ids,
                    size_t n)
{
    char *dec = NULL, *streamed;
    size_t dlen = 0;

    ck_assert_int_eq(tok_decode(t, ids, n, 0, &dec, &dlen), ST_OK);
    ck_assert_msg(dlen == len && memcmp(dec, text, len) == 0,
                  "round trip: \"%.*s\" decoded as \"%s\"", (int)len, text, dec);
    size_t slen;
    streamed = tt_stream_all(t, ids, n, 0, &slen);
    ck_assert_uint_eq(slen, dlen);
    ck_assert_mem_eq(streamed, dec, dlen);
    free(streamed);
    free(dec);
}
