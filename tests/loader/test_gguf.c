/* test_gguf.c - the GGUF parser on buffers built here: every metadata
 * type and its conversions, string arrays, tensor infos and data (F32,
 * F16, Q8_0), each structural fault, a seeded mutation sweep, and the
 * llama.cpp vocabulary files in tests/fixtures/vocab. */
#include <check.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "loader_test.h"
#include "formats/gguf.h"

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf_t;

static void
put(buf_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void
put_u32(buf_t *b, uint32_t v)
{
    put(b, &v, 4);
}

static void
put_u64(buf_t *b, uint64_t v)
{
    put(b, &v, 8);
}

static void
put_str(buf_t *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void
put_key(buf_t *b, const char *k, uint32_t type)
{
    put_str(b, k);
    put_u32(b, type);
}

/* Faults the builder can inject. */
enum fault {
    F_NONE = 0,
    F_KV_COUNT_HUGE,
    F_KEY_LEN_HUGE,
    F_VALUE_TYPE_UNKNOWN,
    F_NESTED_ARRAY,
    F_ARRAY_COUNT_HUGE,
    F_STRING_ARRAY_COUNT_HUGE,
    F_DUP_KEY,
    F_DUP_TENSOR,
    F_ALIGNMENT_3,
    F_N_DIMS_5,
    F_DIM_ZERO,
    F_DIM_HUGE,
    F_Q8_ROW_32X,
    F_MISALIGNED_OFFSET,
    F_OFFSET_PAST_END,
    F_TYPE_UNKNOWN,
    F_EMPTY_KEY,
};

/* The synthetic file: 12 keys of every type, 3 tensors:
 * "a" F32 dims {4, 2} = 0..7, "b" Q8_0 dims {32} scale 0.5 q = i - 16,
 * "c" F16 dims {3} = {1, -2, 0.5}. Alignment 64. */
static unsigned char *
build(enum fault f, size_t *len)
{
    buf_t b = {0};
    uint64_t n_kv = 13;
    uint64_t data_start, offs[3];
    const char *names[3] = {"a", "b", f == F_DUP_TENSOR ? "a" : "c"};
    float a[8];
    unsigned char q8[34];
    uint16_t f16[3] = {0x3c00, 0xc000, 0x3800};
    uint16_t half = 0x3800;
    int8_t i8v = -5;
    int16_t i16v = -300;
    int32_t i32v = -70000;
    int64_t i64v = -5000000000LL;
    float f32v = 2.5f;
    double f64v = -0.125;
    uint8_t boolv = 1;

    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 3);
    put_u64(&b, f == F_KV_COUNT_HUGE ? (1ull << 60) : n_kv);

    if (f == F_KEY_LEN_HUGE) {
        put_u64(&b, 1ull << 40);
    } else if (f == F_EMPTY_KEY) {
        put_str(&b, "");
        put_u32(&b, GGUF_TYPE_STRING);
        put_str(&b, "x");
    } else {
        put_key(&b, "general.architecture", GGUF_TYPE_STRING);
        put_str(&b, "llama");
    }
    put_key(&b, "general.alignment", GGUF_TYPE_UINT32);
    put_u32(&b, f == F_ALIGNMENT_3 ? 3 : 64);
    put_key(&b, "t.u8", f == F_VALUE_TYPE_UNKNOWN ? 13 : GGUF_TYPE_UINT8);
    put(&b, "\xfa", 1); /* 250 */
    put_key(&b, "t.i8", GGUF_TYPE_INT8);
    put(&b, &i8v, 1);
    put_key(&b, "t.i16", GGUF_TYPE_INT16);
    put(&b, &i16v, 2);
    put_key(&b, "t.i32", GGUF_TYPE_INT32);
    put(&b, &i32v, 4);
    put_key(&b, f == F_DUP_KEY ? "t.i32" : "t.i64", GGUF_TYPE_INT64);
    put(&b, &i64v, 8);
    put_key(&b, "t.u64", GGUF_TYPE_UINT64);
    put_u64(&b, 1ull << 63);
    put_key(&b, "t.f32", GGUF_TYPE_FLOAT32);
    put(&b, &f32v, 4);
    put_key(&b, "t.f64", GGUF_TYPE_FLOAT64);
    put(&b, &f64v, 8);
    put_key(&b, "t.bool", GGUF_TYPE_BOOL);
    put(&b, &boolv, 1);
    put_key(&b, "t.strs", GGUF_TYPE_ARRAY);
    put_u32(&b, f == F_NESTED_ARRAY ? GGUF_TYPE_ARRAY : GGUF_TYPE_STRING);
    put_u64(&b, f == F_STRING_ARRAY_COUNT_HUGE ? (1ull << 59) : 3);
    put_str(&b, "zero");
    put_str(&b, "");
    put_str(&b, "two\xe2\x96\x81");
    put_key(&b, "t.ints", GGUF_TYPE_ARRAY);
    put_u32(&b, GGUF_TYPE_INT32);
    put_u64(&b, f == F_ARRAY_COUNT_HUGE ? (1ull << 62) : 4);
    for (int32_t i = 0; i < 4; i++) {
        int32_t v = i * 10 - 5;

        put(&b, &v, 4);
    }

    /* tensor infos */
    offs[0] = 0;
    offs[1] = 64;
    offs[2] = 128;
    if (f == F_MISALIGNED_OFFSET) {
        offs[1] = 36;
    }
    if (f == F_OFFSET_PAST_END) {
        offs[2] = 1u << 20;
    }
    for (int t = 0; t < 3; t++) {
        put_str(&b, names[t]);
        if (t == 0) {
            put_u32(&b, f == F_N_DIMS_5 ? 5 : 2);
            put_u64(&b, f == F_DIM_ZERO ? 0 : 4);
            put_u64(&b, f == F_DIM_HUGE ? (1ull << 62) : 2);
            put_u32(&b, f == F_TYPE_UNKNOWN ? 99 : GGUF_TENSOR_F32);
        } else if (t == 1) {
            put_u32(&b, 1);
            put_u64(&b, f == F_Q8_ROW_32X ? 48 : 32);
            put_u32(&b, GGUF_TENSOR_Q8_0);
        } else {
            put_u32(&b, 1);
            put_u64(&b, 3);
            put_u32(&b, GGUF_TENSOR_F16);
        }
        put_u64(&b, offs[t]);
    }
    data_start = (b.n + 63) / 64 * 64;
    while (b.n < data_start) {
        put(&b, "", 1);
    }
    for (int i = 0; i < 8; i++) {
        a[i] = (float)i;
    }
    put(&b, a, sizeof(a));
    while (b.n < data_start + 64) {
        put(&b, "", 1);
    }
    memcpy(q8, &half, 2);
    for (int i = 0; i < 32; i++) {
        q8[2 + i] = (unsigned char)(int8_t)(i - 16);
    }
    put(&b, q8, sizeof(q8));
    while (b.n < data_start + 128) {
        put(&b, "", 1);
    }
    put(&b, f16, sizeof(f16));
    *len = b.n;
    return b.p;
}

START_TEST(test_synthetic_metadata)
{
    size_t len, sl;
    unsigned char *d = build(F_NONE, &len);
    gguf_file_t *g = NULL;
    char err[256];
    int64_t i64;
    uint32_t u32;
    float f;
    int bl;
    const char *s;
    gguf_type_t et;
    uint64_t n;
    const void *arr;
    int32_t ints[4];

    ck_assert_msg(gguf_parse(d, len, &g, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_uint_eq(gguf_version(g), 3);
    ck_assert_uint_eq(gguf_alignment(g), 64);
    ck_assert_int_eq(gguf_n_keys(g), 13);
    ck_assert_int_eq(gguf_find_key(g, "t.i16"), 4);
    ck_assert_str_eq(gguf_key_name(g, 4), "t.i16");
    ck_assert_int_eq(gguf_key_type(g, 4), GGUF_TYPE_INT16);
    ck_assert_int_eq(gguf_find_key(g, "nope"), -1);

    ck_assert_int_eq(gguf_get_i64(g, "t.u8", &i64), ST_OK);
    ck_assert_int_eq(i64, 250);
    ck_assert_int_eq(gguf_get_i64(g, "t.i8", &i64), ST_OK);
    ck_assert_int_eq(i64, -5);
    ck_assert_int_eq(gguf_get_i64(g, "t.i16", &i64), ST_OK);
    ck_assert_int_eq(i64, -300);
    ck_assert_int_eq(gguf_get_i64(g, "t.i32", &i64), ST_OK);
    ck_assert_int_eq(i64, -70000);
    ck_assert_int_eq(gguf_get_i64(g, "t.i64", &i64), ST_OK);
    ck_assert(i64 == -5000000000LL);
    ck_assert_int_eq(gguf_get_i64(g, "t.u64", &i64), ST_EFORMAT); /* 2^63 does not fit */
    ck_assert_int_eq(gguf_get_u32(g, "t.u8", &u32), ST_OK);
    ck_assert_uint_eq(u32, 250);
    ck_assert_int_eq(gguf_get_u32(g, "t.i8", &u32), ST_EFORMAT); /* negative */
    ck_assert_int_eq(gguf_get_u32(g, "t.i64", &u32), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_u32(g, "general.alignment", &u32), ST_OK);
    ck_assert_uint_eq(u32, 64);
    ck_assert_int_eq(gguf_get_u32(g, "absent", &u32), ST_ENOENT);
    ck_assert_int_eq(gguf_get_f32(g, "t.f32", &f), ST_OK);
    ck_assert(f == 2.5f);
    ck_assert_int_eq(gguf_get_f32(g, "t.f64", &f), ST_OK);
    ck_assert(f == -0.125f);
    ck_assert_int_eq(gguf_get_f32(g, "t.i16", &f), ST_OK);
    ck_assert(f == -300.0f);
    ck_assert_int_eq(gguf_get_f32(g, "general.architecture", &f), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_bool(g, "t.bool", &bl), ST_OK);
    ck_assert_int_eq(bl, 1);
    ck_assert_int_eq(gguf_get_bool(g, "t.f32", &bl), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_str(g, "general.architecture", &s, &sl), ST_OK);
    ck_assert_uint_eq(sl, 5);
    ck_assert(memcmp(s, "llama", 5) == 0);
    ck_assert_int_eq(gguf_get_str(g, "t.u8", &s, &sl), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_i64(g, "t.strs", &i64), ST_EFORMAT);

    ck_assert_int_eq(gguf_get_arr(g, "t.ints", &et, &n, &arr), ST_OK);
    ck_assert_int_eq(et, GGUF_TYPE_INT32);
    ck_assert_uint_eq(n, 4);
    memcpy(ints, arr, sizeof(ints));
    ck_assert_int_eq(ints[0], -5);
    ck_assert_int_eq(ints[3], 25);
    ck_assert_int_eq(gguf_get_arr(g, "t.strs", &et, &n, &arr), ST_OK);
    ck_assert_int_eq(et, GGUF_TYPE_STRING);
    ck_assert_uint_eq(n, 3);
    ck_assert_ptr_null(arr);
    ck_assert_int_eq(gguf_get_arr(g, "t.f32", &et, &n, &arr), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_arr_str(g, "t.strs", 2, &s, &sl), ST_OK);
    ck_assert_uint_eq(sl, 6);
    ck_assert(memcmp(s, "two\xe2\x96\x81", 6) == 0);
    ck_assert_int_eq(gguf_get_arr_str(g, "t.strs", 1, &s, &sl), ST_OK);
    ck_assert_uint_eq(sl, 0);
    ck_assert_int_eq(gguf_get_arr_str(g, "t.strs", 0, &s, &sl), ST_OK);
    ck_assert(sl == 4 && memcmp(s, "zero", 4) == 0);
    ck_assert_int_eq(gguf_get_arr_str(g, "t.strs", 3, &s, &sl), ST_ERANGE);
    ck_assert_int_eq(gguf_get_arr_str(g, "t.ints", 0, &s, &sl), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_arr_str(g, "nope", 0, &s, &sl), ST_ENOENT);
    gguf_close(g);
    free(d);
}
END_TEST

START_TEST(test_synthetic_tensors)
{
    size_t len;
    unsigned char *d = build(F_NONE, &len);
    gguf_file_t *g = NULL;
    char err[256];
    const gguf_tensor_t *t;
    float out[32];

    ck_assert_int_eq(gguf_parse(d, len, &g, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_n_tensors(g), 3);
    ck_assert_ptr_null(gguf_tensor(g, 3));
    ck_assert_ptr_null(gguf_tensor(g, -1));
    ck_assert_ptr_null(gguf_find_tensor(g, "zz"));

    t = gguf_find_tensor(g, "a");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_uint_eq(t->dims[0], 4);
    ck_assert_uint_eq(t->dims[1], 2);
    ck_assert_uint_eq(t->dims[2], 1);
    ck_assert_uint_eq(t->nbytes, 32);
    ck_assert_uint_eq(((uintptr_t)t->data - (uintptr_t)d) % 64, 0);
    ck_assert_int_eq(gguf_tensor_to_f32(t, out), ST_OK);
    for (int i = 0; i < 8; i++) {
        ck_assert(out[i] == (float)i);
    }
    t = gguf_tensor(g, 1);
    ck_assert_str_eq(t->name, "b");
    ck_assert_uint_eq(t->type, GGUF_TENSOR_Q8_0);
    ck_assert_uint_eq(t->nbytes, 34);
    ck_assert_int_eq(gguf_tensor_to_f32(t, out), ST_OK);
    for (int i = 0; i < 32; i++) {
        ck_assert(out[i] == 0.5f * (float)(i - 16));
    }
    t = gguf_find_tensor(g, "c");
    ck_assert_uint_eq(t->nbytes, 6);
    ck_assert_int_eq(gguf_tensor_to_f32(t, out), ST_OK);
    ck_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f);
    ck_assert_str_eq(gguf_tensor_type_name(GGUF_TENSOR_Q8_0), "Q8_0");
    ck_assert_str_eq(gguf_tensor_type_name(1000), "unknown");
    gguf_close(g);
    gguf_close(NULL);
    free(d);
}
END_TEST

START_TEST(test_synthetic_faults)
{
    static const struct {
        enum fault f;
        const char *needle;
    } cases[] = {
        {F_KV_COUNT_HUGE, "more than the file holds"},
        {F_KEY_LEN_HUGE, "truncated key/value 0"},
        {F_EMPTY_KEY, "bad key"},
        {F_VALUE_TYPE_UNKNOWN, "unknown value type 13"},
        {F_NESTED_ARRAY, "unsupported array element type 9"},
        {F_ARRAY_COUNT_HUGE, "runs past the end"},
        {F_STRING_ARRAY_COUNT_HUGE, "do not fit"},
        {F_DUP_KEY, "duplicate key 't.i32'"},
        {F_DUP_TENSOR, "duplicate tensor 'a'"},
        {F_ALIGNMENT_3, "power of two"},
        {F_N_DIMS_5, "5 dimensions"},
        {F_DIM_ZERO, "bad dimension 0"},
        {F_DIM_HUGE, "bad dimension"},
        {F_Q8_ROW_32X, "not a multiple of the Q8_0 block"},
        {F_MISALIGNED_OFFSET, "not aligned"},
        {F_OFFSET_PAST_END, "outside the file"},
        {F_TYPE_UNKNOWN, "unknown ggml type 99"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len;
        unsigned char *d = build(cases[i].f, &len);
        gguf_file_t *g = NULL;
        char err[256] = "";
        int rc = gguf_parse(d, len, &g, err, sizeof(err));

        ck_assert_msg(rc == ST_EFORMAT, "fault %d parsed (%s)", (int)cases[i].f, err);
        ck_assert_ptr_null(g);
        ck_assert_msg(strstr(err, cases[i].needle) != NULL, "fault %d: '%s' lacks '%s'",
                      (int)cases[i].f, err, cases[i].needle);
        free(d);
    }
}
END_TEST

START_TEST(test_synthetic_truncations_and_mutations)
{
    size_t len;
    unsigned char *d = build(F_NONE, &len);
    unsigned char *m = malloc(len);
    uint64_t x = 0x2545f4914f6cdd1dull;
    char err[256];
    int ok = 0;

    for (size_t cut = 0; cut < len; cut++) {
        gguf_file_t *g = NULL;
        unsigned char *c = malloc(cut + 1);

        memcpy(c, d, cut);
        if (gguf_parse(c, cut, &g, err, sizeof(err)) != ST_EFORMAT) {
            ck_abort_msg("cut at %zu parsed", cut);
        }
        free(c);
    }
    for (int it = 0; it < 20000; it++) {
        gguf_file_t *g = NULL;
        int rc;

        memcpy(m, d, len);
        for (int k = 0; k < 1 + it % 3; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            m[x % len] ^= (unsigned char)(1u << ((x >> 40) % 8));
        }
        rc = gguf_parse(m, len, &g, err, sizeof(err));
        if (rc != ST_OK && rc != ST_EFORMAT) {
            ck_abort_msg("iteration %d: status %d", it, rc);
        }
        if (rc == ST_OK) {
            ok++;
            for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
                const gguf_tensor_t *t = gguf_tensor(g, i);
                const unsigned char *p = t->data;

                if (!(p >= m && p + t->nbytes <= m + len)) {
                    ck_abort_msg("iteration %d: tensor outside the buffer", it);
                }
            }
            for (int64_t i = 0; i < gguf_n_keys(g); i++) {
                const char *s;
                size_t sl;
                const char *k = gguf_key_name(g, i);

                if (gguf_get_str(g, k, &s, &sl) == ST_OK &&
                    !((const unsigned char *)s >= m && (const unsigned char *)s + sl <= m + len)) {
                    ck_abort_msg("iteration %d: string outside the buffer", it);
                }
            }
            gguf_close(g);
        }
    }
    ck_assert_int_gt(ok, 0);
    free(m);
    free(d);
}
END_TEST

/* Values that end exactly at the end of the buffer (no tensors): an empty
 * string and an empty array, asked for as the wrong types. Under ASan this
 * catches any read past the end. */
START_TEST(test_values_at_buffer_end)
{
    buf_t b = {0};
    unsigned char *exact;
    gguf_file_t *g = NULL;
    char err[256];
    int64_t i64;
    uint32_t u32;
    float f;
    int bl;
    gguf_type_t et;
    uint64_t n;
    const void *arr;

    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 2);
    put_key(&b, "e.arr", GGUF_TYPE_ARRAY);
    put_u32(&b, GGUF_TYPE_UINT8);
    put_u64(&b, 0);
    put_key(&b, "e.str", GGUF_TYPE_STRING);
    put_u64(&b, 0);
    exact = malloc(b.n);
    memcpy(exact, b.p, b.n);
    ck_assert_int_eq(gguf_parse(exact, b.n, &g, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_n_tensors(g), 0);
    ck_assert_int_eq(gguf_get_i64(g, "e.str", &i64), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_u32(g, "e.arr", &u32), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_f32(g, "e.str", &f), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_bool(g, "e.arr", &bl), ST_EFORMAT);
    ck_assert_int_eq(gguf_get_arr(g, "e.arr", &et, &n, &arr), ST_OK);
    ck_assert_uint_eq(n, 0);
    gguf_close(g);
    free(exact);
    free(b.p);
}
END_TEST

/* Every llama.cpp vocabulary fixture parses, with a token list that
 * matches its declared count and a tokenizer model name. */
START_TEST(test_vocab_fixtures_parse)
{
    glob_t gl;
    char pattern[4096];

    snprintf(pattern, sizeof(pattern), "%s", lt_src("tests/fixtures/vocab/*.gguf"));
    ck_assert_int_eq(glob(pattern, 0, NULL, &gl), 0);
    ck_assert_uint_ge(gl.gl_pathc, 3);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        gguf_file_t *g = NULL;
        char err[512];
        gguf_type_t et;
        uint64_t n, j;
        const void *arr;
        const char *s;
        size_t sl;

        ck_assert_msg(gguf_open(gl.gl_pathv[i], &g, err, sizeof(err)) == ST_OK, "%s", err);
        ck_assert_int_eq(gguf_get_str(g, "tokenizer.ggml.model", &s, &sl), ST_OK);
        ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &arr), ST_OK);
        ck_assert_int_eq(et, GGUF_TYPE_STRING);
        ck_assert_uint_gt(n, 1000);
        for (j = 0; j < n; j++) {
            if (gguf_get_arr_str(g, "tokenizer.ggml.tokens", j, &s, &sl) != ST_OK) {
                ck_abort_msg("%s: token %llu", gl.gl_pathv[i], (unsigned long long)j);
            }
        }
        ck_assert_int_eq(gguf_get_arr_str(g, "tokenizer.ggml.tokens", n, &s, &sl), ST_ERANGE);
        gguf_close(g);
    }
    globfree(&gl);
}
END_TEST

START_TEST(test_open_errors)
{
    gguf_file_t *g = NULL;
    char err[512] = "";

    ck_assert_int_eq(gguf_open(lt_src("no/such.gguf"), &g, err, sizeof(err)), ST_ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "no/such.gguf"));
    ck_assert_int_eq(gguf_open(lt_src("models/austen-2.7m/config.json"), &g, err, sizeof(err)),
                     ST_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    ck_assert_ptr_nonnull(strstr(err, "config.json"));
    ck_assert_int_eq(gguf_open(lt_src("models"), &g, err, sizeof(err)), ST_EFORMAT);
    ck_assert_ptr_null(g);
}
END_TEST

Suite *
loader_gguf_suite(void)
{
    Suite *s = suite_create("loader_gguf");
    TCase *tc = tcase_create("gguf");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_synthetic_metadata);
    tcase_add_test(tc, test_synthetic_tensors);
    tcase_add_test(tc, test_synthetic_faults);
    tcase_add_test(tc, test_synthetic_truncations_and_mutations);
    tcase_add_test(tc, test_values_at_buffer_end);
    tcase_add_test(tc, test_vocab_fixtures_parse);
    tcase_add_test(tc, test_open_errors);
    suite_add_tcase(s, tc);
    return s;
}
