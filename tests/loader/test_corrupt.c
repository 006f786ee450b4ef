/* test_corrupt.c - corrupted Hugging Face directories and GGUF files,
 * made from the default model inside the test: each load fails with a
 * negative status and a message naming the problem, never a crash.
 * Plus a seeded mutation sweep over the safetensors header. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"
#include "loader_test.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

static char *tmp;
static unsigned char *sft_bytes; /* the default model's model.safetensors */
static size_t sft_len;
static uint64_t sft_hlen;

static void
corrupt_setup(void)
{
    tmp = lt_mkdtemp("loader-corrupt");
    sft_bytes = lt_read(lt_src("models/austen-2.7m/model.safetensors"), &sft_len);
    memcpy(&sft_hlen, sft_bytes, 8);
}

static void
corrupt_teardown(void)
{
    lt_rmtree(tmp);
    free(tmp);
    free(sft_bytes);
}

/* tmp/name/ with links to the default model's tokenizer and configs;
 * returns the directory (static buffer). */
static const char *
variant_dir(const char *name, int link_config)
{
    static char dir[4096];
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "config.json"};
    char dst[4200], src[4096];

    snprintf(dir, sizeof(dir), "%s/%s", tmp, name);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (i == 3 && !link_config) {
            continue;
        }
        snprintf(dst, sizeof(dst), "%s/%s", dir, files[i]);
        snprintf(src, sizeof(src), "models/austen-2.7m/%s", files[i]);
        ck_assert_int_eq(symlink(lt_src(src), dst), 0);
    }
    return dir;
}

/* The default model's safetensors with its header replaced by hdr's JSON. */
static void
write_st_header(const char *dir, const char *fname, const char *json)
{
    char path[4096];
    size_t jl = strlen(json), pad = (8 - jl % 8) % 8;
    uint64_t hl = jl + pad;
    size_t data_len = sft_len - 8 - sft_hlen;
    unsigned char *buf = malloc(8 + hl + data_len);

    memcpy(buf, &hl, 8);
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', pad);
    memcpy(buf + 8 + hl, sft_bytes + 8 + sft_hlen, data_len);
    snprintf(path, sizeof(path), "%s/%s", dir, fname);
    lt_write(path, buf, 8 + hl + data_len);
    free(buf);
}

static cJSON *
sft_header(void)
{
    cJSON *h = cJSON_ParseWithLength((const char *)sft_bytes + 8, sft_hlen);

    ck_assert_ptr_nonnull(h);
    return h;
}

static void
write_header_json(const char *dir, cJSON *h)
{
    char *s = cJSON_PrintUnformatted(h);

    write_st_header(dir, "model.safetensors", s);
    free(s);
    cJSON_Delete(h);
}

static void
set_dtype(cJSON *h, const char *tensor, const char *dtype)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(h, tensor);

    cJSON_ReplaceItemInObjectCaseSensitive(t, "dtype", cJSON_CreateString(dtype));
}

static void
set_shape(cJSON *h, const char *tensor, int a, int b)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(h, tensor);
    int dims[2] = {a, b};

    cJSON_ReplaceItemInObjectCaseSensitive(t, "shape", cJSON_CreateIntArray(dims, 2));
}

static void
set_offsets(cJSON *h, const char *tensor, double a, double b)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(h, tensor);
    double o[2] = {a, b};

    cJSON_ReplaceItemInObjectCaseSensitive(t, "data_offsets", cJSON_CreateDoubleArray(o, 2));
}

static const char *
offsets_of(cJSON *h, const char *tensor, double *a, double *b)
{
    cJSON *o = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, tensor),
                                                "data_offsets");

    *a = cJSON_GetArrayItem(o, 0)->valuedouble;
    *b = cJSON_GetArrayItem(o, 1)->valuedouble;
    return tensor;
}

#define QP "model.layers.0.self_attn.q_proj.weight"
#define KP "model.layers.0.self_attn.k_proj.weight"
#define VP "model.layers.0.self_attn.v_proj.weight"
#define UP "model.layers.3.mlp.up_proj.weight"

START_TEST(test_st_wrong_dtype)
{
    const char *d = variant_dir("dtype", 1);
    cJSON *h = sft_header();

    set_dtype(h, QP, "I32"); /* same size, wrong kind */
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "dtype I32", QP), ST_EFORMAT);
}
END_TEST

START_TEST(test_st_unknown_dtype)
{
    const char *d = variant_dir("dtype2", 1);
    cJSON *h = sft_header();

    set_dtype(h, QP, "F7");
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "unknown dtype 'F7'", "model.safetensors"),
                     ST_EFORMAT);
}
END_TEST

START_TEST(test_st_wrong_shape)
{
    const char *d = variant_dir("shape", 1);
    cJSON *h = sft_header();

    set_shape(h, QP, 96, 384); /* same bytes, wrong shape */
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "shape [96, 384], expected [192, 192]", QP),
                     ST_EFORMAT);
}
END_TEST

START_TEST(test_st_shape_size_mismatch)
{
    const char *d = variant_dir("shape2", 1);
    cJSON *h = sft_header();

    set_shape(h, QP, 192, 191);
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "shape does not match", QP), ST_EFORMAT);
}
END_TEST

START_TEST(test_st_missing_tensor)
{
    const char *d = variant_dir("missing", 1);
    cJSON *h = sft_header();
    cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(h, UP);

    cJSON_AddItemToObject(h, "renamed.weight", t);
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "missing tensor", UP), ST_EFORMAT);
}
END_TEST

START_TEST(test_st_offsets_out_of_bounds)
{
    const char *d = variant_dir("oob", 1);
    cJSON *h = sft_header();
    double data_len = (double)(sft_len - 8 - sft_hlen), a, b;

    offsets_of(h, KP, &a, &b);
    set_offsets(h, KP, data_len - (b - a) + 4, data_len + 4);
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "outside the data section", KP), ST_EFORMAT);
}
END_TEST

START_TEST(test_st_offsets_reversed_or_fractional)
{
    const char *d = variant_dir("rev", 1);
    const char *d2;
    cJSON *h = sft_header();
    double a, b;

    offsets_of(h, KP, &a, &b);
    set_offsets(h, KP, b, a);
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "outside the data section", KP), ST_EFORMAT);

    d2 = variant_dir("frac", 1);
    h = sft_header();
    set_offsets(h, KP, a + 0.5, b + 0.5);
    write_header_json(d2, h);
    ck_assert_int_eq(lt_expect_load_error(d2, "data_offsets must be two integers", KP), ST_EFORMAT);
}
END_TEST

START_TEST(test_st_overlap)
{
    const char *d = variant_dir("overlap", 1);
    cJSON *h = sft_header();
    double a, b;

    offsets_of(h, KP, &a, &b);
    set_offsets(h, VP, a, b); /* v_proj and k_proj have the same size */
    write_header_json(d, h);
    ck_assert_int_eq(lt_expect_load_error(d, "overlap", NULL), ST_EFORMAT);
}
END_TEST

/* Not corrupt: a header whose length leaves the F32 data 2 bytes off
 * alignment still loads, through copies instead of in-place pointers. */
START_TEST(test_st_misaligned_data_is_copied)
{
    const char *d = variant_dir("misaligned", 1);
    char *s, dir[4096];
    size_t jl, data_len = sft_len - 8 - sft_hlen;
    uint64_t hl;
    unsigned char *buf;
    char path[4200], err[512];
    mdl_model_t *a = NULL, *b = NULL;
    cJSON *h = sft_header();

    snprintf(dir, sizeof(dir), "%s", d);
    s = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    jl = strlen(s);
    hl = jl + (8 - jl % 8) % 8 + 2; /* 8 + hl == 2 (mod 4) */
    buf = malloc(8 + hl + data_len);
    memcpy(buf, &hl, 8);
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, s, jl);
    memcpy(buf + 8 + hl, sft_bytes + 8 + sft_hlen, data_len);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    lt_write(path, buf, 8 + hl + data_len);
    free(buf);
    free(s);

    ck_assert_msg(mdl_model_load(dir, &b, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(mdl_model_load(lt_src("models/austen-2.7m"), &a, err, sizeof(err)) == ST_OK, "%s",
                  err);
    ck_assert_int_eq(a->n_owned, 0);
    ck_assert_int_eq(b->n_owned, 3 + 9 * b->cfg.n_layers); /* every tensor copied */
    ck_assert_ptr_null(b->maps[0]);                        /* and the mapping dropped */
    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_st_bad_json_header)
{
    const char *d = variant_dir("badjson", 1);

    write_st_header(d, "model.safetensors", "{\"a\": [1, 2,");
    ck_assert_int_eq(lt_expect_load_error(d, "not valid JSON", "model.safetensors"), ST_EFORMAT);
}
END_TEST

/* In memory, through the fuzzing entry point. */
START_TEST(test_st_parse_in_memory)
{
    static const char *const cases[][2] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         "duplicate tensor 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[2,6]}}",
         "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
         "more than 8 dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "bad shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
         "\"data_offsets\":[0,4]}}",
         "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "needs dtype, shape and data_offsets"},
        {"{\"a\":[1]}", "not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", "two integers"},
        {"[]", "not a JSON object"},
    };
    unsigned char buf[512];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t jl = strlen(cases[i][0]);
        uint64_t hl = jl;
        sft_file_t *f = NULL;
        char err[256] = "";

        memcpy(buf, &hl, 8);
        memcpy(buf + 8, cases[i][0], jl);
        memset(buf + 8 + jl, 0, 8);
        ck_assert_int_eq(sft_parse_header(buf, 8 + jl + 8, &f, err, sizeof(err)), ST_EFORMAT);
        ck_assert_ptr_null(f);
        ck_assert_msg(strstr(err, cases[i][1]) != NULL, "case %zu: '%s' lacks '%s'", i, err,
                      cases[i][1]);
    }
    {
        /* a good two-tensor file, F16 data at an odd offset */
        const char *j = "{\"__metadata__\":{\"format\":\"pt\"},"
                        "\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                        "\"y\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[2,4]}}";
        uint64_t hl = strlen(j);
        sft_file_t *f = NULL;
        char err[256];
        float v;

        memcpy(buf, &hl, 8);
        memcpy(buf + 8, j, hl);
        memcpy(buf + 8 + hl, "\x00\x3c\x80\xbf", 4); /* f16 1.0, bf16 -1.0 */
        ck_assert_int_eq(sft_parse_header(buf, 8 + hl + 4, &f, err, sizeof(err)), ST_OK);
        ck_assert_int_eq(sft_n_tensors(f), 2);
        ck_assert_ptr_null(sft_find(f, "__metadata__"));
        ck_assert_int_eq(sft_to_f32(sft_find(f, "x")->dtype, sft_find(f, "x")->data, 1, &v), ST_OK);
        ck_assert(v == 1.0f);
        ck_assert_int_eq(sft_to_f32(sft_find(f, "y")->dtype, sft_find(f, "y")->data, 1, &v), ST_OK);
        ck_assert(v == -1.0f);
        ck_assert_uint_eq(sft_find(f, "y")->n_dims, 2);
        ck_assert_ptr_null(sft_tensor(f, 2));
        sft_close(f);
        sft_close(NULL);
    }
}
END_TEST

static void
write_raw(const char *dir, const void *data, size_t len)
{
    char path[4096];

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    lt_write(path, data, len);
}

START_TEST(test_st_header_length_overflow)
{
    static const uint64_t lens[] = {UINT64_MAX, UINT64_MAX - 7, 1ull << 40, 1ull << 62};
    unsigned char *buf = malloc(sft_len);
    char name[64];

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        const char *d;

        snprintf(name, sizeof(name), "hlen%zu", i);
        d = variant_dir(name, 1);
        memcpy(buf, sft_bytes, sft_len);
        memcpy(buf, &lens[i], 8);
        write_raw(d, buf, sft_len);
        ck_assert_int_eq(lt_expect_load_error(d, "header length", "model.safetensors"), ST_EFORMAT);
    }
    free(buf);
}
END_TEST

START_TEST(test_st_truncated)
{
    const char *d;
    size_t cuts[] = {0,          4,         8, 100, 8 + (size_t)sft_hlen - 1, 8 + (size_t)sft_hlen,
                     sft_len / 2, sft_len - 1};
    const char *needles[] = {"empty file",
                             "truncated",
                             "truncated",
                             "truncated",
                             "truncated",
                             "outside the data section",
                             "outside the data section",
                             "outside the data section"};
    char name[64];

    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        snprintf(name, sizeof(name), "trunc%zu", i);
        d = variant_dir(name, 1);
        write_raw(d, sft_bytes, cuts[i]);
        ck_assert_int_eq(lt_expect_load_error(d, needles[i], "model.safetensors"), ST_EFORMAT);
    }
}
END_TEST

START_TEST(test_config_unknown_architecture)
{
    const char *d = variant_dir("arch", 0);
    char path[4096];
    size_t n;
    unsigned char *cfg = lt_read(lt_src("models/austen-2.7m/config.json"), &n);
    char *p = strstr((char *)cfg, "\"llama\"");

    ck_assert_ptr_nonnull(p);
    memcpy(p, "\"bloom\"", 7);
    snprintf(path, sizeof(path), "%s/config.json", d);
    lt_write(path, cfg, n);
    free(cfg);
    ck_assert_int_eq(lt_expect_load_error(d, "unknown architecture 'bloom'", "config.json"),
                     ST_EUNSUPPORTED);
}
END_TEST

START_TEST(test_config_bad_json_and_missing)
{
    const char *d = variant_dir("cfgjson", 0);
    char path[4096];

    snprintf(path, sizeof(path), "%s/config.json", d);
    lt_write(path, "{\"model_type\": \"llama\",", 23);
    ck_assert_int_eq(lt_expect_load_error(d, "not valid JSON", "config.json"), ST_EFORMAT);

    d = variant_dir("nocfg", 0);
    ck_assert_int_eq(lt_expect_load_error(d, "config.json", NULL), ST_ENOENT);
}
END_TEST

START_TEST(test_config_vocab_disagrees_with_weights)
{
    const char *d = variant_dir("vocab", 0);
    char path[4096];
    size_t n;
    unsigned char *cfg = lt_read(lt_src("models/austen-2.7m/config.json"), &n);
    char *p = strstr((char *)cfg, "\"vocab_size\": 1024");

    ck_assert_ptr_nonnull(p);
    memcpy(p, "\"vocab_size\": 2048", 18);
    snprintf(path, sizeof(path), "%s/config.json", d);
    lt_write(path, cfg, n);
    free(cfg);
    snprintf(path, sizeof(path), "%s/model.safetensors", d);
    ck_assert_int_eq(symlink(lt_src("models/austen-2.7m/model.safetensors"), path), 0);
    ck_assert_int_eq(lt_expect_load_error(d, "expected [2048, 192]", NULL), ST_EFORMAT);
}
END_TEST

START_TEST(test_no_weights_and_bad_index)
{
    const char *d = variant_dir("noweights", 1);
    char path[4096];
    const char *idx;

    ck_assert_int_eq(lt_expect_load_error(d, "no model.safetensors", NULL), ST_ENOENT);

    d = variant_dir("badindex", 1);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", d);
    idx = "{\"weight_map\": {\"lm_head.weight\": \"../../etc/passwd.safetensors\"}}";
    lt_write(path, idx, strlen(idx));
    ck_assert_int_eq(lt_expect_load_error(d, "bad shard file name", NULL), ST_EFORMAT);

    d = variant_dir("absentshard", 1);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", d);
    idx = "{\"weight_map\": {\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}";
    lt_write(path, idx, strlen(idx));
    ck_assert_int_eq(lt_expect_load_error(d, "model-00001-of-00002.safetensors", NULL), ST_ENOENT);

    d = variant_dir("indexjson", 1);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", d);
    lt_write(path, "{\"weight_map\": [", 16);
    ck_assert_int_eq(lt_expect_load_error(d, "weight_map", NULL), ST_EFORMAT);
}
END_TEST

/* Seeded random mutations of the header bytes: never a crash; a parse
 * that succeeds still yields tensors inside the buffer. */
START_TEST(test_st_mutation_sweep)
{
    size_t n = (size_t)(8 + sft_hlen);
    unsigned char *buf = malloc(sft_len);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char err[256];
    int ok = 0;

    for (int it = 0; it < 3000; it++) {
        sft_file_t *f = NULL;
        int flips = 1 + it % 4, rc;

        memcpy(buf, sft_bytes, sft_len);
        for (int k = 0; k < flips; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[x % n] = (unsigned char)(x >> 32);
        }
        rc = sft_parse_header(buf, sft_len, &f, err, sizeof(err));
        if (rc != ST_OK && rc != ST_EFORMAT) {
            ck_abort_msg("iteration %d: status %d", it, rc);
        }
        if (rc == ST_OK) {
            ok++;
            for (int64_t i = 0; i < sft_n_tensors(f); i++) {
                const sft_tensor_t *t = sft_tensor(f, i);
                const unsigned char *p = t->data;

                if (!(p >= buf && p + t->nbytes <= buf + sft_len)) {
                    ck_abort_msg("iteration %d: tensor %s outside the buffer", it, t->name);
                }
            }
            sft_close(f);
        } else if (err[0] == '\0') {
            ck_abort_msg("iteration %d: failure without a message", it);
        }
    }
    free(buf);
    ck_assert_int_gt(ok, 0); /* some flips land in harmless places */
}
END_TEST

/* ---- GGUF: the default model's file, patched ---- */

static unsigned char *
gguf_bytes(size_t *len)
{
    return lt_read(lt_src("models/austen-2.7m/model-f32.gguf"), len);
}

static unsigned char *
find_bytes(unsigned char *hay, size_t n, const void *needle, size_t nl)
{
    unsigned char *p = memmem(hay, n, needle, nl);

    ck_assert_ptr_nonnull(p);
    return p;
}

static const char *
write_gguf_variant(const char *name, const unsigned char *data, size_t len)
{
    static char path[4096];

    snprintf(path, sizeof(path), "%s/%s.gguf", tmp, name);
    lt_write(path, data, len);
    return path;
}

START_TEST(test_gguf_bad_magic_and_version)
{
    size_t n;
    unsigned char *b = gguf_bytes(&n);
    uint32_t v = 4;

    b[3] = 'X';
    lt_expect_load_error(write_gguf_variant("magic", b, n), "bad magic", NULL);
    b[3] = 'F';
    memcpy(b + 4, &v, 4);
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("version", b, n),
                                          "unsupported GGUF version 4", "version.gguf"),
                     ST_EFORMAT);
    v = 1;
    memcpy(b + 4, &v, 4);
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("version1", b, n),
                                          "unsupported GGUF version 1", NULL),
                     ST_EFORMAT);
    free(b);
}
END_TEST

START_TEST(test_gguf_unknown_architecture)
{
    size_t n;
    unsigned char *b = gguf_bytes(&n);
    unsigned char *p = find_bytes(b, n, "general.architecture", 20);

    p = find_bytes(p, 64, "llama", 5);
    memcpy(p, "bloom", 5);
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("arch", b, n),
                                          "unknown architecture 'bloom'", "arch.gguf"),
                     ST_EUNSUPPORTED);
    free(b);
}
END_TEST

START_TEST(test_gguf_missing_tensor)
{
    size_t n;
    unsigned char *b = gguf_bytes(&n);
    unsigned char *p = find_bytes(b, n, "blk.5.ffn_up.weight", 19);

    p[18] = 'X';
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("missing", b, n),
                                          "missing tensor 'blk.5.ffn_up.weight'", NULL),
                     ST_EFORMAT);
    free(b);
}
END_TEST

/* The tensor info after a name: u32 n_dims, u64 dims[n], u32 type, u64 offset. */
static unsigned char *
tensor_info(unsigned char *b, size_t n, const char *name)
{
    unsigned char *p = find_bytes(b, n, name, strlen(name));

    return p + strlen(name);
}

START_TEST(test_gguf_wrong_shape_and_type)
{
    size_t n;
    unsigned char *b = gguf_bytes(&n);
    unsigned char *p = tensor_info(b, n, "blk.0.attn_q.weight");
    uint64_t dims[2] = {384, 96}, orig[2];
    uint32_t type = 26; /* I32: same size as F32 */

    memcpy(orig, p + 4, 16);
    memcpy(p + 4, dims, 16);
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("shape", b, n),
                                          "shape [96, 384], expected [192, 192]",
                                          "blk.0.attn_q.weight"),
                     ST_EFORMAT);
    memcpy(p + 4, orig, 16);
    memcpy(p + 20, &type, 4);
    ck_assert_int_eq(
        lt_expect_load_error(write_gguf_variant("type", b, n), "type I32", "blk.0.attn_q.weight"),
        ST_EFORMAT);
    type = 77;
    memcpy(p + 20, &type, 4);
    ck_assert_int_eq(
        lt_expect_load_error(write_gguf_variant("type2", b, n), "unknown ggml type 77", NULL),
        ST_EFORMAT);
    free(b);
}
END_TEST

START_TEST(test_gguf_tensor_data_out_of_bounds)
{
    size_t n;
    unsigned char *b = gguf_bytes(&n);
    unsigned char *p = tensor_info(b, n, "blk.5.ffn_down.weight");
    uint64_t off = (uint64_t)n, huge = UINT64_MAX - 31;

    off = (off + 31) / 32 * 32;
    memcpy(p + 4 + 16 + 4, &off, 8);
    ck_assert_int_eq(lt_expect_load_error(write_gguf_variant("oob", b, n), "outside the file",
                                          "blk.5.ffn_down.weight"),
                     ST_EFORMAT);
    memcpy(p + 4 + 16 + 4, &huge, 8);
    ck_assert_int_eq(
        lt_expect_load_error(write_gguf_variant("oob2", b, n), "outside the file", NULL),
        ST_EFORMAT);
    free(b);
}
END_TEST

START_TEST(test_gguf_truncations)
{
    size_t n, len;
    unsigned char *b = gguf_bytes(&n);
    gguf_file_t *g;
    char err[256];

    /* every length through the metadata and tensor infos, then a sample */
    for (len = 0; len < n; len += len < 26000 ? 1 : 997) {
        unsigned char *copy = malloc(len + 1); /* exact size: ASan sees overreads */
        int rc;

        memcpy(copy, b, len);
        g = NULL;
        err[0] = '\0';
        rc = gguf_parse(copy, len, &g, err, sizeof(err));
        if (rc != ST_EFORMAT || g != NULL || err[0] == '\0') {
            ck_abort_msg("length %zu: status %d, no clean failure", len, rc);
        }
        free(copy);
    }
    ck_assert_int_eq(gguf_parse(b, n, &g, err, sizeof(err)), ST_OK);
    gguf_close(g);
    ck_assert_int_eq(
        lt_expect_load_error(write_gguf_variant("trunc", b, n - 1), "outside the file", NULL),
        ST_EFORMAT);
    free(b);
}
END_TEST

Suite *
loader_corrupt_suite(void)
{
    Suite *s = suite_create("loader_corrupt");
    TCase *tc = tcase_create("safetensors");
    TCase *tg = tcase_create("gguf");

    tcase_add_unchecked_fixture(tc, corrupt_setup, corrupt_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_st_wrong_dtype);
    tcase_add_test(tc, test_st_unknown_dtype);
    tcase_add_test(tc, test_st_wrong_shape);
    tcase_add_test(tc, test_st_shape_size_mismatch);
    tcase_add_test(tc, test_st_missing_tensor);
    tcase_add_test(tc, test_st_offsets_out_of_bounds);
    tcase_add_test(tc, test_st_offsets_reversed_or_fractional);
    tcase_add_test(tc, test_st_overlap);
    tcase_add_test(tc, test_st_misaligned_data_is_copied);
    tcase_add_test(tc, test_st_bad_json_header);
    tcase_add_test(tc, test_st_parse_in_memory);
    tcase_add_test(tc, test_st_header_length_overflow);
    tcase_add_test(tc, test_st_truncated);
    tcase_add_test(tc, test_config_unknown_architecture);
    tcase_add_test(tc, test_config_bad_json_and_missing);
    tcase_add_test(tc, test_config_vocab_disagrees_with_weights);
    tcase_add_test(tc, test_no_weights_and_bad_index);
    tcase_add_test(tc, test_st_mutation_sweep);
    suite_add_tcase(s, tc);

    tcase_add_unchecked_fixture(tg, corrupt_setup, corrupt_teardown);
    tcase_set_timeout(tg, 60);
    tcase_add_test(tg, test_gguf_bad_magic_and_version);
    tcase_add_test(tg, test_gguf_unknown_architecture);
    tcase_add_test(tg, test_gguf_missing_tensor);
    tcase_add_test(tg, test_gguf_wrong_shape_and_type);
    tcase_add_test(tg, test_gguf_tensor_data_out_of_bounds);
    tcase_add_test(tg, test_gguf_truncations);
    suite_add_tcase(s, tg);
    return s;
}
