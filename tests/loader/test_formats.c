/* test_formats.c - good files load and agree: the default model as
 * safetensors F32, BF16 and GGUF F32; random models written by
 * tools/make_random_model.py as F16, BF16 in shards, GGUF F16 and Q8_0,
 * a tied Qwen2 with q/k/v biases and a byte-level BPE vocabulary, and a
 * model whose head_dim is not hidden / heads. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "loader_test.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "text/tokenizer.h"

static mdl_model_t *
load_ok(const char *path)
{
    mdl_model_t *m = NULL;
    char err[512] = "";
    int rc = mdl_model_load(path, &m, err, sizeof(err));

    ck_assert_msg(rc == ST_OK, "load %s: %s (%s)", path, err, st_str(rc));
    ck_assert_ptr_nonnull(m);
    return m;
}

START_TEST(test_austen_safetensors_config)
{
    mdl_model_t *m = load_ok(lt_src("models/austen-2.7m"));
    const mdl_config_t *c = mdl_model_config(m);

    ck_assert_str_eq(c->arch, "llama");
    ck_assert_int_eq(c->vocab_size, 1024);
    ck_assert_int_eq(c->dim, 192);
    ck_assert_int_eq(c->n_layers, 6);
    ck_assert_int_eq(c->n_heads, 6);
    ck_assert_int_eq(c->n_kv_heads, 2);
    ck_assert_int_eq(c->head_dim, 32);
    ck_assert_int_eq(c->ffn_dim, 512);
    ck_assert_int_eq(c->max_pos, 256);
    ck_assert(fabsf(c->norm_eps - 1e-5f) < 1e-12f);
    ck_assert(c->rope_theta == 10000.0f);
    ck_assert_int_eq(c->rope_scaling, MDL_ROPE_NONE);
    ck_assert_int_eq(c->tie_embeddings, 0);
    ck_assert_int_eq(c->qkv_bias, 0);
    ck_assert_int_eq(c->sliding_window, 0);
    ck_assert_int_eq(c->bos_id, 1);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], 2);
    ck_assert_ptr_nonnull(mdl_model_tokenizer(m));
    ck_assert_int_eq(tok_vocab_size(mdl_model_tokenizer(m)), 1024);
    {
        /* the template is tokenizer_config.json's, if it has one */
        size_t n;
        unsigned char *txt = lt_read(lt_src("models/austen-2.7m/tokenizer_config.json"), &n);
        cJSON *j = cJSON_ParseWithLength((const char *)txt, n);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");

        ck_assert_ptr_nonnull(j);
        if (cJSON_IsString(ct)) {
            ck_assert_str_eq(mdl_model_chat_template(m), ct->valuestring);
        } else {
            ck_assert_ptr_null(mdl_model_chat_template(m));
        }
        cJSON_Delete(j);
        free(txt);
    }
    ck_assert(m->lm_head.data != m->tok_embd.data);
    /* per layer: 2 norms + q,k,v,o + gate, up, down; plus final norm and
     * lm_head (the embedding is a lookup, not read per token). */
    ck_assert_uint_eq(mdl_model_weight_bytes(m),
                      4u * (6u * (2u * 192 + (192 + 64 + 64) * 192 + 192 * 192 + 3 * 512 * 192) +
                            192 + 1024 * 192));
    mdl_model_destroy(m);
}
END_TEST

START_TEST(test_austen_gguf_equals_safetensors)
{
    mdl_model_t *a = load_ok(lt_src("models/austen-2.7m"));
    mdl_model_t *b = load_ok(lt_src("models/austen-2.7m/model-f32.gguf"));

    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    ck_assert_int_eq(b->cfg.bos_id, 1);
    ck_assert_int_eq(b->cfg.n_eos, 1);
    ck_assert_int_eq(b->cfg.eos_ids[0], 2);
    ck_assert_int_eq(tok_vocab_size(mdl_model_tokenizer(b)), 1024);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_austen_bf16_within_rounding)
{
    mdl_model_t *a = load_ok(lt_src("models/austen-2.7m"));
    mdl_model_t *b = load_ok(lt_src("models/austen-2.7m/bf16"));

    lt_compare_models(a, b, LT_BF16, LT_BF16);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

/* The GGUF really stores q/k permuted (so the un-permute is exercised):
 * within a head, HF row j (j < hd/2) is GGUF row 2j, HF row hd/2 + j is
 * GGUF row 2j + 1. */
START_TEST(test_austen_gguf_rows_are_permuted)
{
    gguf_file_t *g = NULL;
    sft_file_t *s = NULL;
    char err[512];
    const gguf_tensor_t *gq;
    const sft_tensor_t *sq;
    const float *gr, *sr;
    const int hd = 32, dim = 192;

    ck_assert_int_eq(gguf_open(lt_src("models/austen-2.7m/model-f32.gguf"), &g, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(sft_open(lt_src("models/austen-2.7m/model.safetensors"), &s, err, sizeof(err)),
                     ST_OK);
    gq = gguf_find_tensor(g, "blk.0.attn_q.weight");
    sq = sft_find(s, "model.layers.0.self_attn.q_proj.weight");
    ck_assert_ptr_nonnull(gq);
    ck_assert_ptr_nonnull(sq);
    ck_assert_uint_eq(gq->type, GGUF_TENSOR_F32);
    gr = gq->data;
    sr = sq->data;
    for (int h = 0; h < 6; h++) {
        for (int j = 0; j < hd / 2; j++) {
            if (memcmp(gr + (h * hd + 2 * j) * dim, sr + (h * hd + j) * dim, dim * sizeof(float)) !=
                    0 ||
                memcmp(gr + (h * hd + 2 * j + 1) * dim, sr + (h * hd + hd / 2 + j) * dim,
                       dim * sizeof(float)) != 0) {
                ck_abort_msg("head %d pair %d is not permuted as llama.cpp does", h, j);
            }
        }
    }
    /* and row 1 is not row 1 */
    ck_assert(memcmp(gr + dim, sr + dim, dim * sizeof(float)) != 0);
    gguf_close(g);
    sft_close(s);
}
END_TEST

/* A directory of links to the default model plus the given
 * tokenizer_config.json text and, when not NULL, chat_template.jinja. */
static char *
template_dir(const char *tokcfg, const char *jinja)
{
    static const char *const files[] = {"config.json", "generation_config.json",
                                        "model.safetensors", "tokenizer.json"};
    char *dir = lt_mkdtemp("loader-tpl");
    char src[4096], dst[4200];

    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(src, sizeof(src), "models/austen-2.7m/%s", files[i]);
        snprintf(dst, sizeof(dst), "%s/%s", dir, files[i]);
        ck_assert_int_eq(symlink(lt_src(src), dst), 0);
    }
    snprintf(dst, sizeof(dst), "%s/tokenizer_config.json", dir);
    lt_write(dst, tokcfg, strlen(tokcfg));
    if (jinja != NULL) {
        snprintf(dst, sizeof(dst), "%s/chat_template.jinja", dir);
        lt_write(dst, jinja, strlen(jinja));
    }
    return dir;
}

START_TEST(test_chat_template_sources)
{
    char *d1 = template_dir("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                            " {\"name\": \"default\", \"template\": \"D{{x}}\"}]}",
                            NULL);
    char *d2 = template_dir("{\"add_bos_token\": true}", "J{{ messages }}\n");
    char *d3 = template_dir("{\"chat_template\": \"S\"}", "J");
    mdl_model_t *m;

    m = load_ok(d1);
    ck_assert_str_eq(mdl_model_chat_template(m), "D{{x}}");
    mdl_model_destroy(m);
    m = load_ok(d2);
    ck_assert_str_eq(mdl_model_chat_template(m), "J{{ messages }}\n");
    mdl_model_destroy(m);
    m = load_ok(d3);
    ck_assert_str_eq(mdl_model_chat_template(m), "S");
    mdl_model_destroy(m);
    lt_rmtree(d1);
    lt_rmtree(d2);
    lt_rmtree(d3);
    free(d1);
    free(d2);
    free(d3);
}
END_TEST

START_TEST(test_missing_path_is_enoent)
{
    lt_expect_load_error(lt_src("models/no-such-model"), "no-such-model", NULL);
}
END_TEST

/* ---- random models from tools/make_random_model.py ---- */

static char *gen_dir;

static const char *
gen(const char *rel)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];

    snprintf(b, sizeof(bufs[0]), "%s/%s", gen_dir, rel);
    return b;
}

static void
gen_setup(void)
{
    char args[4096];
    static const char *const runs[] = {
        "--hf-dir {D}/f32 --gguf {D}/f32.gguf",
        "--hf-dir {D}/f16 --dtype f16 --gguf {D}/f16.gguf --gguf-type f16",
        "--hf-dir {D}/bf16s --dtype bf16 --shards 3 --gguf {D}/q8.gguf --gguf-type q8_0",
        "--hf-dir {D}/f32s --shards 4",
        "--arch qwen2 --tie --vocab 1100 --hf-dir {D}/qwen --gguf {D}/qwen.gguf "
        "--gguf-type q8_0",
        "--arch mistral --head-dim 24 --layers 3 --hf-dir {D}/hd --gguf {D}/hd.gguf",
        "--dim 128 --hf-dir {D}/l3 --gguf {D}/l3.gguf --rope-llama3 8,1,4,2048 --rope-theta 50000",
        "--hf-dir {D}/lin --gguf {D}/lin.gguf --gguf-type bf16 --rope-linear 4",
        /* rows of 256 and 512 for the 256-element super-blocks of K-quants */
        "--dim 256 --ffn 512 --hf-dir {D}/wide --gguf {D}/q4_k.gguf --gguf-type q4_k",
        "--dim 256 --ffn 512 --gguf {D}/q5_k.gguf --gguf-type q5_k",
        "--dim 256 --ffn 512 --gguf {D}/q6_k.gguf --gguf-type q6_k",
        "--dim 256 --ffn 512 --gguf {D}/q4_0.gguf --gguf-type q4_0",
        "--dim 256 --ffn 512 --gguf {D}/q4_1.gguf --gguf-type q4_1",
        "--dim 256 --ffn 512 --gguf {D}/q5_0.gguf --gguf-type q5_0",
        "--dim 256 --ffn 512 --gguf {D}/q5_1.gguf --gguf-type q5_1",
        /* rows of 64 do not fit a K-quant block: Q8_0 fallback */
        "--gguf {D}/q6_k-fallback.gguf --gguf-type q6_k",
    };

    gen_dir = lt_mkdtemp("loader-gen");
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        const char *r = runs[i];
        size_t o = 0;

        while (*r != '\0' && o + 1 < sizeof(args)) {
            if (strncmp(r, "{D}", 3) == 0) {
                o += (size_t)snprintf(args + o, sizeof(args) - o, "'%s'", gen_dir);
                r += 3;
            } else {
                args[o++] = *r++;
            }
            args[o] = '\0';
        }
        if (lt_make_model(args) != 0) {
            fprintf(stderr, "make_random_model.py %s failed\n", args);
            abort();
        }
    }
}

static void
gen_teardown(void)
{
    lt_rmtree(gen_dir);
    free(gen_dir);
}

START_TEST(test_gen_gguf_f32_equals_safetensors)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("f32.gguf"));

    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_f16_safetensors_and_gguf)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("f16"));
    mdl_model_t *c = load_ok(gen("f16.gguf"));

    lt_compare_models(a, b, LT_F16, LT_F16);
    lt_compare_models(a, c, LT_F16, LT_EXACT); /* GGUF keeps norms in F32 */
    mdl_model_destroy(a);
    mdl_model_destroy(b);
    mdl_model_destroy(c);
}
END_TEST

START_TEST(test_gen_bf16_sharded)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("bf16s"));

    lt_compare_models(a, b, LT_BF16, LT_BF16);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_f32_sharded_in_place)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("f32s"));

    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    ck_assert_int_eq(b->n_maps, 4);
    ck_assert_int_eq(b->n_owned, 0); /* F32 is used from the mappings */
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_q8_0_gguf)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("q8.gguf"));

    lt_compare_models(a, b, LT_Q8_0, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_qwen2_tied_bias_bpe)
{
    mdl_model_t *a = load_ok(gen("qwen"));
    mdl_model_t *b = load_ok(gen("qwen.gguf"));
    const mdl_config_t *c = mdl_model_config(a);

    ck_assert_str_eq(c->arch, "qwen2");
    ck_assert_int_eq(c->tie_embeddings, 1);
    ck_assert_int_eq(c->qkv_bias, 1);
    ck_assert_int_eq(c->vocab_size, 1100);
    ck_assert(a->lm_head.data == a->tok_embd.data);
    ck_assert(b->lm_head.data == b->tok_embd.data);
    ck_assert_ptr_nonnull(a->layers[1].bq);
    ck_assert_ptr_nonnull(b->layers[1].bv);
    /* eos from config.json and the generation_config.json list, merged */
    ck_assert_int_eq(c->n_eos, 2);
    ck_assert_int_eq(c->eos_ids[0], 0);
    ck_assert_int_eq(c->eos_ids[1], 2);
    ck_assert_int_eq(tok_vocab_size(mdl_model_tokenizer(a)), 1100);
    ck_assert_int_eq(tok_vocab_size(mdl_model_tokenizer(b)), 1100);
    ck_assert_ptr_nonnull(mdl_model_chat_template(a));
    ck_assert_ptr_nonnull(strstr(mdl_model_chat_template(a), "<|im_start|>"));
    ck_assert_ptr_nonnull(mdl_model_chat_template(b));
    ck_assert_str_eq(mdl_model_chat_template(a), mdl_model_chat_template(b));
    lt_compare_models(a, b, LT_Q8_0, LT_EXACT); /* qwen2 q/k are not permuted */
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_head_dim_override)
{
    mdl_model_t *a = load_ok(gen("hd"));
    mdl_model_t *b = load_ok(gen("hd.gguf"));

    ck_assert_str_eq(a->cfg.arch, "mistral");
    ck_assert_int_eq(a->cfg.head_dim, 24);
    ck_assert_int_eq(b->cfg.head_dim, 24);
    ck_assert_int_eq(a->cfg.n_layers, 3);
    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

/* RoPE inverse frequencies as the llama3 recipe defines them (an
 * independent restatement, not the kernel's code). */
static void
inv_freqs(const mdl_config_t *c, double *out)
{
    const double pi = 3.14159265358979323846;

    for (int i = 0; i < c->head_dim / 2; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / c->head_dim), wl = 2 * pi / f;
        double lo_wl = c->rope_orig_max_pos / (double)c->rope_low_freq_factor;
        double hi_wl = c->rope_orig_max_pos / (double)c->rope_high_freq_factor;

        if (c->rope_scaling == MDL_ROPE_LLAMA3) {
            if (wl > lo_wl) {
                f /= c->rope_factor;
            } else if (wl >= hi_wl) {
                double sm = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - sm) * f / c->rope_factor + sm * f;
            }
        }
        out[i] = f;
    }
}

START_TEST(test_gen_rope_llama3_from_rope_freqs)
{
    mdl_model_t *a = load_ok(gen("l3"));
    mdl_model_t *b = load_ok(gen("l3.gguf"));
    const mdl_config_t *c = &a->cfg, *d = &b->cfg;
    double fa[64], fb[64];
    int n_scaled = 0;

    ck_assert_int_eq(c->rope_scaling, MDL_ROPE_LLAMA3);
    ck_assert(c->rope_factor == 8.0f && c->rope_low_freq_factor == 1.0f);
    ck_assert(c->rope_high_freq_factor == 4.0f && c->rope_orig_max_pos == 2048);
    ck_assert(c->rope_theta == 50000.0f);
    ck_assert_int_eq(d->rope_scaling, MDL_ROPE_LLAMA3);
    ck_assert(d->rope_factor == 8.0f);
    ck_assert(d->rope_theta == 50000.0f);
    ck_assert_int_eq(d->rope_orig_max_pos, 2048);
    ck_assert(fabsf(d->rope_low_freq_factor - 1.0f) < 1e-3f);
    ck_assert(fabsf(d->rope_high_freq_factor - 4.0f) < 4e-3f);
    inv_freqs(c, fa);
    inv_freqs(d, fb);
    for (int i = 0; i < c->head_dim / 2; i++) {
        double base = pow((double)c->rope_theta, -2.0 * i / c->head_dim);

        ck_assert_msg(fabs(fa[i] - fb[i]) <= 1e-5 * fa[i], "freq %d: %g vs %g", i, fa[i], fb[i]);
        n_scaled += fa[i] < base * 0.999;
    }
    ck_assert_int_ge(n_scaled, 3); /* the test model does exercise the scaling */
    lt_compare_models(a, b, LT_EXACT, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_rope_linear_bf16_gguf)
{
    mdl_model_t *a = load_ok(gen("lin"));
    mdl_model_t *b = load_ok(gen("lin.gguf"));

    ck_assert_int_eq(a->cfg.rope_scaling, MDL_ROPE_LINEAR);
    ck_assert_int_eq(b->cfg.rope_scaling, MDL_ROPE_LINEAR);
    ck_assert(a->cfg.rope_factor == 4.0f && b->cfg.rope_factor == 4.0f);
    lt_compare_models(a, b, LT_BF16, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

START_TEST(test_gen_quantized_gguf)
{
    static const struct {
        const char *file;
        uint32_t type;
        lt_tol_t tol;
    } cases[] = {
        {"q4_k.gguf", GGUF_TENSOR_Q4_K, LT_Q4}, {"q5_k.gguf", GGUF_TENSOR_Q5_K, LT_Q5},
        {"q6_k.gguf", GGUF_TENSOR_Q6_K, LT_Q6}, {"q4_0.gguf", GGUF_TENSOR_Q4_0, LT_Q4},
        {"q4_1.gguf", GGUF_TENSOR_Q4_1, LT_Q4}, {"q5_0.gguf", GGUF_TENSOR_Q5_0, LT_Q5},
        {"q5_1.gguf", GGUF_TENSOR_Q5_1, LT_Q5},
    };
    mdl_model_t *a = load_ok(gen("wide"));

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gguf_file_t *g = NULL;
        char err[512];
        mdl_model_t *b;

        /* the file really holds that type */
        ck_assert_int_eq(gguf_open(gen(cases[i].file), &g, err, sizeof(err)), ST_OK);
        ck_assert_uint_eq(gguf_find_tensor(g, "blk.1.ffn_down.weight")->type, cases[i].type);
        gguf_close(g);
        b = load_ok(gen(cases[i].file));
        lt_compare_models(a, b, cases[i].tol, LT_EXACT);
        mdl_model_destroy(b);
    }
    mdl_model_destroy(a);
}
END_TEST

START_TEST(test_gen_k_quant_fallback)
{
    mdl_model_t *a = load_ok(gen("f32"));
    mdl_model_t *b = load_ok(gen("q6_k-fallback.gguf"));

    lt_compare_models(a, b, LT_Q8_0, LT_EXACT);
    mdl_model_destroy(a);
    mdl_model_destroy(b);
}
END_TEST

Suite *
loader_formats_suite(void)
{
    Suite *s = suite_create("loader_formats");
    TCase *tc = tcase_create("austen");
    TCase *tg = tcase_create("generated");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_austen_safetensors_config);
    tcase_add_test(tc, test_austen_gguf_equals_safetensors);
    tcase_add_test(tc, test_austen_bf16_within_rounding);
    tcase_add_test(tc, test_austen_gguf_rows_are_permuted);
    tcase_add_test(tc, test_chat_template_sources);
    tcase_add_test(tc, test_missing_path_is_enoent);
    suite_add_tcase(s, tc);

    tcase_add_unchecked_fixture(tg, gen_setup, gen_teardown);
    tcase_set_timeout(tg, 60);
    tcase_add_test(tg, test_gen_gguf_f32_equals_safetensors);
    tcase_add_test(tg, test_gen_f16_safetensors_and_gguf);
    tcase_add_test(tg, test_gen_bf16_sharded);
    tcase_add_test(tg, test_gen_f32_sharded_in_place);
    tcase_add_test(tg, test_gen_q8_0_gguf);
    tcase_add_test(tg, test_gen_qwen2_tied_bias_bpe);
    tcase_add_test(tg, test_gen_head_dim_override);
    tcase_add_test(tg, test_gen_rope_llama3_from_rope_freqs);
    tcase_add_test(tg, test_gen_rope_linear_bf16_gguf);
    tcase_add_test(tg, test_gen_quantized_gguf);
    tcase_add_test(tg, test_gen_k_quant_fallback);
    suite_add_tcase(s, tg);
    return s;
}
