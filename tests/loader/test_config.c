/* test_config.c - config.json + generation_config.json parsing: defaults,
 * head_dim, rope scaling (linear, llama3, refused kinds), tied
 * embeddings, Qwen2 biases, sliding windows, eos as int or list, and
 * malformed configs. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "common/status.h"
#include "loader_test.h"
#include "model/loader_int.h"

#define BASE                                                                                       \
    "\"vocab_size\": 1000, \"hidden_size\": 256, \"num_hidden_layers\": 2, "                       \
    "\"num_attention_heads\": 8, \"intermediate_size\": 512"

static int
parse(const char *cfg_json, const char *gen_json, mdl_config_t *c, char *err, size_t errlen)
{
    err[0] = '\0';
    return mdl__config_parse_hf(cfg_json, strlen(cfg_json), gen_json,
                                gen_json != NULL ? strlen(gen_json) : 0, c, err, errlen);
}

START_TEST(test_defaults)
{
    mdl_config_t c;
    char err[256];

    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE "}", NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_str_eq(c.arch, "llama");
    ck_assert_int_eq(c.n_kv_heads, 8);
    ck_assert_int_eq(c.head_dim, 32);
    ck_assert_int_eq(c.max_pos, 2048);
    ck_assert(c.rope_theta == 10000.0f);
    ck_assert(fabsf(c.norm_eps - 1e-6f) < 1e-12f);
    ck_assert_int_eq(c.rope_scaling, MDL_ROPE_NONE);
    ck_assert_int_eq(c.tie_embeddings, 0);
    ck_assert_int_eq(c.qkv_bias, 0);
    ck_assert_int_eq(c.sliding_window, 0);
    ck_assert_int_eq(c.bos_id, -1);
    ck_assert_int_eq(c.n_eos, 0);
}
END_TEST

START_TEST(test_fields_and_eos_lists)
{
    mdl_config_t c;
    char err[256];
    const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                      ", \"num_key_value_heads\": 2, \"head_dim\": 64, \"rope_theta\": 500000.0,"
                      " \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 8192,"
                      " \"tie_word_embeddings\": true, \"attention_bias\": true,"
                      " \"bos_token_id\": 7, \"eos_token_id\": [9, 10]}";
    const char *gen = "{\"bos_token_id\": 7, \"eos_token_id\": [10, 11, 12]}";

    ck_assert_int_eq(parse(cfg, gen, &c, err, sizeof(err)), ST_OK);
    ck_assert_str_eq(c.arch, "llama");
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert(c.rope_theta == 500000.0f);
    ck_assert_int_eq(c.max_pos, 8192);
    ck_assert_int_eq(c.tie_embeddings, 1);
    ck_assert_int_eq(c.qkv_bias, 1);
    ck_assert_int_eq(c.bos_id, 7);
    ck_assert_int_eq(c.n_eos, 4);
    ck_assert_int_eq(c.eos_ids[0], 9);
    ck_assert_int_eq(c.eos_ids[1], 10);
    ck_assert_int_eq(c.eos_ids[2], 11);
    ck_assert_int_eq(c.eos_ids[3], 12);
    /* an int in generation_config.json, none in config.json */
    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": null}",
                           "{\"eos_token_id\": 5, \"bos_token_id\": 4}", &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.n_eos, 1);
    ck_assert_int_eq(c.eos_ids[0], 5);
    ck_assert_int_eq(c.bos_id, 4);
}
END_TEST

START_TEST(test_rope_scaling)
{
    mdl_config_t c;
    char err[256];

    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.rope_scaling, MDL_ROPE_LINEAR);
    ck_assert(c.rope_factor == 4.0f);

    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                           " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                           " \"original_max_position_embeddings\": 8192}}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.rope_scaling, MDL_ROPE_LLAMA3);
    ck_assert(c.rope_factor == 8.0f);
    ck_assert(c.rope_low_freq_factor == 1.0f);
    ck_assert(c.rope_high_freq_factor == 4.0f);
    ck_assert_int_eq(c.rope_orig_max_pos, 8192);

    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"rope_type\": \"default\"}}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.rope_scaling, MDL_ROPE_NONE);

    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}",
                           NULL, &c, err, sizeof(err)),
                     ST_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "yarn"));
    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0}}",
                           NULL, &c, err, sizeof(err)),
                     ST_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "low_freq_factor"));
    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE
                           ", \"rope_scaling\": {\"type\": \"linear\"}}",
                           NULL, &c, err, sizeof(err)),
                     ST_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "factor"));
}
END_TEST

START_TEST(test_qwen2_and_mistral)
{
    mdl_config_t c;
    char err[256];

    ck_assert_int_eq(parse("{\"model_type\": \"qwen2\", " BASE
                           ", \"use_sliding_window\": false, \"sliding_window\": 4096}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.qkv_bias, 1);
    ck_assert_int_eq(c.sliding_window, 0);
    ck_assert_int_eq(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": 4096}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_str_eq(c.arch, "mistral");
    ck_assert_int_eq(c.qkv_bias, 0);
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert_int_eq(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": null}",
                           NULL, &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.sliding_window, 0);
}
END_TEST

START_TEST(test_bad_configs)
{
    static const struct {
        const char *json;
        int rc;
        const char *needle;
    } cases[] = {
        {"{\"model_type\": \"gpt2\", " BASE "}", ST_EUNSUPPORTED, "unknown architecture 'gpt2'"},
        {"{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "}", ST_EUNSUPPORTED,
         "GPT2LMHeadModel"},
        {"{\"model_type\": \"llama\", " BASE, ST_EFORMAT, "not valid JSON"},
        {"[1, 2]", ST_EFORMAT, "not valid JSON"},
        {"", ST_EFORMAT, "not valid JSON"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 1000}", ST_EFORMAT, "hidden_size"},
        {"{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", ST_EFORMAT,
         "must divide"},
        {"{\"model_type\": \"llama\", " BASE ", \"head_dim\": 33}", ST_EFORMAT, "head_dim"},
        {"{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": \"x\"}", ST_EFORMAT,
         "rms_norm_eps"},
        {"{\"model_type\": \"llama\", " BASE ", \"tie_word_embeddings\": 1}", ST_EFORMAT,
         "tie_word_embeddings"},
        {"{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": \"x\"}", ST_EFORMAT,
         "eos_token_id"},
        {"{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": 5000}", ST_EFORMAT,
         "outside the vocabulary"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 1e12, \"hidden_size\": 256, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"intermediate_size\": 512}",
         ST_EFORMAT, "vocab_size"},
        {"{\"model_type\": \"llama\", \"vocab_size\": -5, \"hidden_size\": 256, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"intermediate_size\": 512}",
         ST_EFORMAT, "vocab_size"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 256, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 0, \"intermediate_size\": 512}",
         ST_EFORMAT, "num_attention_heads"},
        {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": 3}", ST_EFORMAT, "rope_scaling"},
    };
    mdl_config_t c;
    char err[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse(cases[i].json, NULL, &c, err, sizeof(err));

        ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d, want %d (%s)", i, rc, cases[i].rc, err);
        ck_assert_msg(strstr(err, cases[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, err,
                      cases[i].needle);
    }
    ck_assert_int_eq(parse("{\"model_type\": \"llama\", " BASE "}", "{oops", &c, err, sizeof(err)),
                     ST_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "generation_config.json"));
}
END_TEST

Suite *
loader_config_suite(void)
{
    Suite *s = suite_create("loader_config");
    TCase *tc = tcase_create("config");

    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_fields_and_eos_lists);
    tcase_add_test(tc, test_rope_scaling);
    tcase_add_test(tc, test_qwen2_and_mistral);
    tcase_add_test(tc, test_bad_configs);
    suite_add_tcase(s, tc);
    return s;
}
