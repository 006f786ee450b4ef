/* fuzz_gguf.c - fuzz target: gguf_parse() on a GGUF file held in memory,
 * then every accessor on what it parsed.
 *
 * Properties: a parsed file has version 2 or 3, a power-of-two alignment,
 * keys whose names are found again by gguf_find_key(), string values and
 * string array elements lying inside the buffer, tensors with n_dims <= 4,
 * unused dims 1 and data inside the buffer; a failure is ST_EFORMAT with a
 * reason. Parsing is linear in the number of keys and tensors.
 */
#include <string.h>

#include "common/status.h"
#include "formats/gguf.h"
#include "tests/fuzz/fuzz_common.h"

static int
inside(const void *p, size_t n, const uint8_t *data, size_t size)
{
    const uint8_t *b = p;

    return n == 0 || (b >= data && n <= size && (size_t)(b - data) <= size - n);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file_t *g = NULL;
    char err[256] = "";
    int rc = gguf_parse(data, size, &g, err, sizeof(err));

    if (rc != ST_OK) {
        FUZZ_CHECK(rc == ST_EFORMAT, "rc %d", rc);
        FUZZ_CHECK(err[0] != '\0', "no reason");
        return 0;
    }
    uint64_t al = gguf_alignment(g);
    FUZZ_CHECK(gguf_version(g) >= 2 && gguf_version(g) <= 3, "version %u", gguf_version(g));
    FUZZ_CHECK(al > 0 && (al & (al - 1)) == 0, "alignment %llu", (unsigned long long)al);
    int64_t nk = gguf_n_keys(g);
    FUZZ_CHECK(nk >= 0, "n_keys");
    for (int64_t i = 0; i < nk; i++) {
        const char *name = gguf_key_name(g, i);
        FUZZ_CHECK(name != NULL, "key %lld has no name", (long long)i);
        int64_t found = gguf_find_key(g, name);
        /* Duplicate keys: the first one wins, so found <= i. */
        FUZZ_CHECK(found >= 0 && found <= i, "find_key %s: %lld", name, (long long)found);
        gguf_type_t ty = gguf_key_type(g, i);
        int64_t iv;
        uint32_t u;
        float fv;
        int bv;
        const char *s;
        size_t sl;
        gguf_type_t et;
        uint64_t n;
        const void *arr;
        (void)gguf_get_i64(g, name, &iv);
        (void)gguf_get_u32(g, name, &u);
        (void)gguf_get_f32(g, name, &fv);
        (void)gguf_get_bool(g, name, &bv);
        if (found != i) {
            continue;
        }
        if (ty == GGUF_TYPE_STRING) {
            FUZZ_CHECK(gguf_get_str(g, name, &s, &sl) == ST_OK, "get_str %s", name);
            FUZZ_CHECK(inside(s, sl, data, size), "string outside the buffer");
        } else if (ty == GGUF_TYPE_ARRAY) {
            FUZZ_CHECK(gguf_get_arr(g, name, &et, &n, &arr) == ST_OK, "get_arr %s", name);
            if (et == GGUF_TYPE_STRING) {
                uint64_t lim = n < 64 ? n : 64;
                for (uint64_t k = 0; k < lim; k++) {
                    FUZZ_CHECK(gguf_get_arr_str(g, name, k, &s, &sl) == ST_OK, "arr_str");
                    FUZZ_CHECK(inside(s, sl, data, size), "array string outside the buffer");
                }
                if (n > 0) {
                    FUZZ_CHECK(gguf_get_arr_str(g, name, n - 1, &s, &sl) == ST_OK, "last");
                    FUZZ_CHECK(inside(s, sl, data, size), "array string outside the buffer");
                }
                FUZZ_CHECK(gguf_get_arr_str(g, name, n, &s, &sl) == ST_ERANGE, "past the end");
            }
        }
    }
    int64_t nt = gguf_n_tensors(g);
    FUZZ_CHECK(nt >= 0, "n_tensors");
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        FUZZ_CHECK(t != NULL && t->name != NULL, "tensor %lld", (long long)i);
        FUZZ_CHECK(t->n_dims <= 4, "n_dims %u", t->n_dims);
        for (uint32_t d = t->n_dims; d < 4; d++) {
            FUZZ_CHECK(t->dims[d] == 1, "unused dim %u is %llu", d,
                       (unsigned long long)t->dims[d]);
        }
        FUZZ_CHECK(inside(t->data, t->nbytes, data, size), "tensor data outside the buffer");
        FUZZ_CHECK(gguf_find_tensor(g, t->name) != NULL, "find_tensor %s", t->name);
        /* Convert small tensors: reads exactly nbytes. */
        unsigned __int128 ne = 1;
        for (int d = 0; d < 4; d++) {
            ne *= t->dims[d];
        }
        if (gguf_tensor_convertible(t->type) && ne <= 4096) {
            float *dst = malloc((size_t)ne * sizeof(float) + 1);
            int crc = gguf_tensor_to_f32(t, dst);
            FUZZ_CHECK(crc == ST_OK || crc == ST_EFORMAT, "to_f32 %d", crc);
            free(dst);
        }
    }
    FUZZ_CHECK(gguf_tensor(g, nt) == NULL && gguf_tensor(g, -1) == NULL, "out of range");
    gguf_close(g);
    return 0;
}

static void
put_u32(uint8_t *b, size_t *o, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        b[(*o)++] = (uint8_t)(v >> (8 * i));
    }
}

static void
put_u64(uint8_t *b, size_t *o, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        b[(*o)++] = (uint8_t)(v >> (8 * i));
    }
}

static void
put_str(uint8_t *b, size_t *o, const char *s)
{
    put_u64(b, o, strlen(s));
    memcpy(b + *o, s, strlen(s));
    *o += strlen(s);
}

/* k string keys, a string array of k elements and k F32 tensors [1]. */
static uint8_t *
gen_gguf(size_t k, size_t *len)
{
    size_t cap = 256 + k * 128 + 32 * k + 64;
    uint8_t *b = calloc(1, cap);
    size_t o = 0;
    char name[64];

    memcpy(b, "GGUF", 4);
    o = 4;
    put_u32(b, &o, 3);
    put_u64(b, &o, k);     /* tensors */
    put_u64(b, &o, k + 1); /* keys */
    for (size_t i = 0; i < k; i++) {
        snprintf(name, sizeof(name), "general.key%zu", i);
        put_str(b, &o, name);
        put_u32(b, &o, GGUF_TYPE_STRING);
        put_str(b, &o, "value");
    }
    put_str(b, &o, "tokenizer.ggml.tokens");
    put_u32(b, &o, GGUF_TYPE_ARRAY);
    put_u32(b, &o, GGUF_TYPE_STRING);
    put_u64(b, &o, k);
    for (size_t i = 0; i < k; i++) {
        put_str(b, &o, "tok");
    }
    for (size_t i = 0; i < k; i++) {
        snprintf(name, sizeof(name), "blk.%zu.w", i);
        put_str(b, &o, name);
        put_u32(b, &o, 1);
        put_u64(b, &o, 1);
        put_u32(b, &o, GGUF_TENSOR_F32);
        put_u64(b, &o, i * 32);
    }
    o = (o + 31) / 32 * 32;
    o += k * 32;
    *len = o;
    return b;
}

static void
run_gguf(const uint8_t *data, size_t len)
{
    gguf_file_t *g = NULL;
    char err[256];

    FUZZ_CHECK(gguf_parse(data, len, &g, err, sizeof(err)) == ST_OK, "%s", err);
    gguf_close(g);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"gguf keys and tensors", gen_gguf, run_gguf, 2048},
    {NULL, NULL, NULL, 0},
};
