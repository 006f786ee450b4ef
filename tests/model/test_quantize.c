/* test_quantize.c - mdl_quantize (`kvserve quantize`) and the GGUF writer.
 *
 *   writer:     every key/value type, string arrays, tensors of sizes that
 *               need padding, written by gguf_write and read back by the
 *               GGUF reader; a short write is refused and leaves no file.
 *   round trip: for every output type, the default model's GGUF file and
 *               its Hugging Face directory are quantized, the output loaded
 *               with mdl_model_load and (1) every matrix has the type the
 *               recipe gives it (mdl__quant_tensor_type: the _m mixes and
 *               the row-length fallbacks) and its bytes equal kn_quant_row
 *               of the source's row, so its dequantized weights are exactly
 *               kn_dequant(kn_quant(source)) and the forward pass reads
 *               nothing else; norms equal the source's; (2) quantizing the
 *               output again to the same type is byte-identical; (3) the
 *               GGUF and HF sources give the same tensor bytes.
 *
 * The model is in KVSERVE_TEST_MODEL (models/austen-2.7m).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/kn_quant.h"
#include "model/model.h"
#include "model/model_int.h"

static char tmpdir[256];

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvserve-quant-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void
teardown(void)
{
    char cmd[512];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *
model_dir(void)
{
    const char *d = getenv("KVSERVE_TEST_MODEL");

    return d != NULL ? d : "models/austen-2.7m";
}

static unsigned char *
read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *p;
    long n;

    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    p = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

START_TEST(test_writer_round_trip)
{
    char path[512], err[256] = "";
    gguf_writer_t *w;
    gguf_file_t *g;
    const char *strs[] = {"a", "", "\xe2\x96\x81the"};
    int32_t ints[] = {1, -2, 3};
    uint64_t d1[] = {3}, d2[] = {5, 2};
    float v[3] = {1.5f, -2.0f, 3.25f};
    unsigned char raw[10];
    const char *s;
    size_t sl;
    gguf_type_t et;
    uint64_t n;
    const void *data;
    int64_t i64;
    float f;
    int b;
    uint32_t u;
    const gguf_tensor_t *t;

    snprintf(path, sizeof(path), "%s/w.gguf", tmpdir);
    ck_assert_int_eq(gguf_w_create(path, &w, err, sizeof(err)), ST_OK);
    gguf_w_set_str(w, "general.architecture", "llama", 5);
    gguf_w_set_u32(w, "k.u32", 7);
    gguf_w_set_i32(w, "k.i32", -9);
    gguf_w_set_f32(w, "k.f32", 0.25f);
    gguf_w_set_bool(w, "k.bool", 1);
    gguf_w_set_arr(w, "k.arr", GGUF_TYPE_INT32, ints, 3);
    gguf_w_set_arr_str(w, "k.strs", strs, NULL, 3);
    gguf_w_set_u32(w, "k.u32", 8); /* replaces, keeps its place */
    {
        uint64_t x = 1ull << 40;

        gguf_w_set_raw(w, "k.u64", GGUF_TYPE_UINT64, &x, 8);
    }
    ck_assert_int_eq(gguf_w_add_tensor(w, "v", GGUF_TENSOR_F32, 1, d1, 12, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_add_tensor(w, "v", GGUF_TENSOR_F32, 1, d1, 12, err, sizeof(err)),
                     ST_EINVAL);
    ck_assert_int_eq(gguf_w_add_tensor(w, "m", GGUF_TENSOR_F16, 2, d2, 20, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_write_header(w, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, v, 8, err, sizeof(err)), ST_OK);
    memset(raw, 0x3c, sizeof(raw));
    /* The piece spans the end of "v" and the start of "m". */
    ck_assert_int_eq(gguf_w_write_data(w, (const char *)v + 8, 4, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 10, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 10, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 1, err, sizeof(err)), ST_ERANGE);
    gguf_w_destroy(w);
    ck_assert_int_ne(access(path, F_OK), 0); /* failed: no file left */

    ck_assert_int_eq(gguf_w_create(path, &w, err, sizeof(err)), ST_OK);
    gguf_w_set_str(w, "general.architecture", "llama", 5);
    gguf_w_set_u32(w, "k.u32", 7);
    gguf_w_set_i32(w, "k.i32", -9);
    gguf_w_set_f32(w, "k.f32", 0.25f);
    gguf_w_set_bool(w, "k.bool", 1);
    gguf_w_set_arr(w, "k.arr", GGUF_TYPE_INT32, ints, 3);
    gguf_w_set_arr_str(w, "k.strs", strs, NULL, 3);
    gguf_w_set_u32(w, "k.u32", 8);
    ck_assert_int_eq(gguf_w_add_tensor(w, "v", GGUF_TENSOR_F32, 1, d1, 12, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_add_tensor(w, "m", GGUF_TENSOR_F16, 2, d2, 20, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_write_header(w, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, v, 12, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 10, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_finish(w, err, sizeof(err)), ST_EINVAL);
    gguf_w_destroy(w);
    ck_assert_int_ne(access(path, F_OK), 0);

    ck_assert_int_eq(gguf_w_create(path, &w, err, sizeof(err)), ST_OK);
    gguf_w_set_str(w, "general.architecture", "llama", 5);
    gguf_w_set_u32(w, "k.u32", 7);
    gguf_w_set_i32(w, "k.i32", -9);
    gguf_w_set_f32(w, "k.f32", 0.25f);
    gguf_w_set_bool(w, "k.bool", 1);
    gguf_w_set_arr(w, "k.arr", GGUF_TYPE_INT32, ints, 3);
    gguf_w_set_arr_str(w, "k.strs", strs, NULL, 3);
    gguf_w_set_u32(w, "k.u32", 8);
    ck_assert_int_eq(gguf_w_add_tensor(w, "v", GGUF_TENSOR_F32, 1, d1, 12, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_add_tensor(w, "m", GGUF_TENSOR_F16, 2, d2, 20, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(gguf_w_write_header(w, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, v, 12, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 10, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_write_data(w, raw, 10, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(gguf_w_finish(w, err, sizeof(err)), ST_OK);
    gguf_w_destroy(w);

    ck_assert_int_eq(gguf_open(path, &g, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(gguf_version(g), 3);
    ck_assert_int_eq(gguf_n_keys(g), 7);
    ck_assert_str_eq(gguf_key_name(g, 1), "k.u32");
    ck_assert_int_eq(gguf_key_type(g, 1), GGUF_TYPE_UINT32);
    ck_assert_int_eq(gguf_get_u32(g, "k.u32", &u), ST_OK);
    ck_assert_uint_eq(u, 8);
    ck_assert_int_eq(gguf_get_i64(g, "k.i32", &i64), ST_OK);
    ck_assert_int_eq(i64, -9);
    ck_assert_int_eq(gguf_get_f32(g, "k.f32", &f), ST_OK);
    ck_assert(f == 0.25f);
    ck_assert_int_eq(gguf_get_bool(g, "k.bool", &b), ST_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(gguf_get_arr(g, "k.arr", &et, &n, &data), ST_OK);
    ck_assert_int_eq(et, GGUF_TYPE_INT32);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(memcmp(data, ints, sizeof(ints)), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(gguf_get_arr_str(g, "k.strs", (uint64_t)i, &s, &sl), ST_OK);
        ck_assert_uint_eq(sl, strlen(strs[i]));
        ck_assert_int_eq(memcmp(s, strs[i], sl), 0);
    }
    ck_assert_int_eq(gguf_n_tensors(g), 2);
    t = gguf_find_tensor(g, "v");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, v, 12), 0);
    t = gguf_find_tensor(g, "m");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_uint_eq(t->dims[0], 5);
    ck_assert_uint_eq(t->dims[1], 2);
    ck_assert_uint_eq(t->type, GGUF_TENSOR_F16);
    ck_assert_uint_eq((uintptr_t)t->data % GGUF_W_ALIGNMENT, 0);
    ck_assert_int_eq(memcmp(t->data, raw, 10), 0);
    ck_assert_int_eq(memcmp((const char *)t->data + 10, raw, 10), 0);
    gguf_close(g);
}
END_TEST

/* Every matrix of out has the recipe's type and kn_quant_row's bytes of
 * the same row of src (both loaded in Hugging Face row order). */
static void
check_matrix(const kn_weight_t *src, const kn_weight_t *out, mdl_quant_t q, const char *name,
             int64_t n_layers, int has_output)
{
    kn_wtype_t wanted, t = mdl__quant_tensor_type(q, name, src->cols, n_layers, has_output,
                                                  &wanted);
    size_t rb = kn_wtype_row_bytes(t, src->cols);
    float *row = malloc(sizeof(float) * (size_t)src->cols);
    unsigned char *qr = malloc(rb);

    ck_assert_msg(out->type == t, "%s %s: type %s, expected %s", mdl_quant_name(q), name,
                  kn_wtype_name(out->type), kn_wtype_name(t));
    ck_assert_int_eq(out->rows, src->rows);
    ck_assert_int_eq(out->cols, src->cols);
    ck_assert_uint_eq(out->row_bytes, rb);
    for (int32_t r = 0; r < src->rows; r++) {
        kn_dequant_row(src->type, (const char *)src->data + (size_t)r * src->row_bytes, row,
                       src->cols);
        kn_quant_row(t, row, qr, src->cols);
        ck_assert_msg(memcmp(qr, (const char *)out->data + (size_t)r * rb, rb) == 0,
                      "%s %s row %d differs from kn_quant_row", mdl_quant_name(q), name, r);
    }
    free(row);
    free(qr);
}

static void
check_model(const mdl_model_t *src, const mdl_model_t *out, mdl_quant_t q)
{
    const mdl_config_t *c = &src->cfg;
    char nm[64];

    ck_assert_int_eq(out->cfg.n_layers, c->n_layers);
    ck_assert_int_eq(out->cfg.vocab_size, c->vocab_size);
    ck_assert_int_eq(memcmp(out->out_norm, src->out_norm, sizeof(float) * (size_t)c->dim), 0);
    check_matrix(&src->tok_embd, &out->tok_embd, q, "token_embd.weight", c->n_layers,
                 !c->tie_embeddings);
    check_matrix(&src->lm_head, &out->lm_head, q, "output.weight", c->n_layers,
                 !c->tie_embeddings);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *a = &src->layers[l], *b = &out->layers[l];

#define CM(f, s)                                                                                   \
    do {                                                                                           \
        snprintf(nm, sizeof(nm), "blk.%d.%s", (int)l, (s));                                        \
        check_matrix(&a->f, &b->f, q, nm, c->n_layers, !c->tie_embeddings);                        \
    } while (0)
        CM(wq, "attn_q.weight");
        CM(wk, "attn_k.weight");
        CM(wv, "attn_v.weight");
        CM(wo, "attn_output.weight");
        CM(w_gate, "ffn_gate.weight");
        CM(w_up, "ffn_up.weight");
        CM(w_down, "ffn_down.weight");
#undef CM
        ck_assert_int_eq(memcmp(a->attn_norm, b->attn_norm, sizeof(float) * (size_t)c->dim), 0);
        ck_assert_int_eq(memcmp(a->ffn_norm, b->ffn_norm, sizeof(float) * (size_t)c->dim), 0);
    }
}

/* Offset of the data section of a GGUF file written with 32-byte
 * alignment: the last tensor info ends the header. */
static size_t
data_offset(const char *path, size_t file_len)
{
    gguf_file_t *g;
    char err[256];
    const gguf_tensor_t *t;
    size_t off;
    unsigned char *base;
    size_t len;

    base = read_all(path, &len);
    ck_assert_int_eq(gguf_parse(base, len, &g, err, sizeof(err)), ST_OK);
    t = gguf_tensor(g, 0);
    off = (size_t)((const unsigned char *)t->data - base);
    gguf_close(g);
    free(base);
    ck_assert_uint_le(off, file_len);
    return off;
}

START_TEST(test_round_trip)
{
    mdl_quant_t q = (mdl_quant_t)_i;
    char gg[512], hf[512], again[512], src_gguf[512], err[512] = "";
    mdl_model_t *src, *out;
    unsigned char *a, *b;
    size_t la, lb, oa, ob;

    snprintf(src_gguf, sizeof(src_gguf), "%s/model-f32.gguf", model_dir());
    snprintf(gg, sizeof(gg), "%s/gg-%s.gguf", tmpdir, mdl_quant_name(q));
    snprintf(hf, sizeof(hf), "%s/hf-%s.gguf", tmpdir, mdl_quant_name(q));
    snprintf(again, sizeof(again), "%s/again-%s.gguf", tmpdir, mdl_quant_name(q));

    ck_assert_msg(mdl_quantize(src_gguf, gg, q, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(mdl_quantize(model_dir(), hf, q, err, sizeof(err)) == ST_OK, "%s", err);

    ck_assert_msg(mdl_model_load(src_gguf, &src, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(mdl_model_load(gg, &out, err, sizeof(err)) == ST_OK, "%s", err);
    check_model(src, out, q);
    mdl_model_destroy(out);
    ck_assert_msg(mdl_model_load(hf, &out, err, sizeof(err)) == ST_OK, "%s", err);
    check_model(src, out, q);
    mdl_model_destroy(out);
    mdl_model_destroy(src);

    /* The two sources give the same tensor bytes (the headers differ by
     * general.name and the HF chat template). */
    a = read_all(gg, &la);
    b = read_all(hf, &lb);
    oa = data_offset(gg, la);
    ob = data_offset(hf, lb);
    ck_assert_uint_eq(la - oa, lb - ob);
    ck_assert_int_eq(memcmp(a + oa, b + ob, la - oa), 0);
    free(b);

    /* Quantizing the output again to its type changes nothing. */
    ck_assert_msg(mdl_quantize(gg, again, q, err, sizeof(err)) == ST_OK, "%s", err);
    b = read_all(again, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_msg(memcmp(a, b, la) == 0, "%s: quantizing twice is not byte-identical",
                  mdl_quant_name(q));
    free(a);
    free(b);
}
END_TEST

/* The mix recipe on a 32-layer shape with 4096-wide rows. */
START_TEST(test_recipe)
{
    kn_wtype_t wanted;
    int n6 = 0;

    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q4_K_M, "output.weight", 4096, 32, 1,
                                            &wanted),
                     KN_W_Q6_K);
    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q4_K_M, "token_embd.weight", 4096, 32, 1,
                                            &wanted),
                     KN_W_Q4_K);
    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q4_K_M, "token_embd.weight", 4096, 32, 0,
                                            &wanted),
                     KN_W_Q6_K);
    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q5_K_M, "blk.0.attn_q.weight", 4096, 32, 1,
                                            &wanted),
                     KN_W_Q5_K);
    for (int l = 0; l < 32; l++) {
        char nm[64];

        snprintf(nm, sizeof(nm), "blk.%d.ffn_down.weight", l);
        n6 += mdl__quant_tensor_type(MDL_QUANT_Q4_K_M, nm, 14336, 32, 1, &wanted) == KN_W_Q6_K;
        snprintf(nm, sizeof(nm), "blk.%d.attn_v.weight", l);
        ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q4_K_M, nm, 4096, 32, 1, &wanted),
                         l < 4 || l >= 28 || (l - 4) % 3 == 2 ? KN_W_Q6_K : KN_W_Q4_K);
    }
    ck_assert_int_eq(n6, 16); /* 0-3, 28-31 and 6, 9, ..., 27 */
    /* Row-length fallbacks. */
    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q6_K, "blk.0.attn_q.weight", 192, 6, 1,
                                            &wanted),
                     KN_W_Q8_0);
    ck_assert_int_eq(wanted, KN_W_Q6_K);
    ck_assert_int_eq(mdl__quant_tensor_type(MDL_QUANT_Q4_0, "blk.0.attn_q.weight", 200, 6, 1,
                                            &wanted),
                     KN_W_F16);
}
END_TEST

Suite *
model_quantize_suite(void)
{
    Suite *s = suite_create("model_quantize");
    TCase *tc = tcase_create("quantize");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_writer_round_trip);
    tcase_add_test(tc, test_recipe);
    tcase_add_loop_test(tc, test_round_trip, MDL_QUANT_F32, MDL_QUANT_Q5_K_M + 1);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(model_quantize_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
