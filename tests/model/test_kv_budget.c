/* test_kv_budget.c - mdl_kv_blocks_for_budget(): the KV pool that
 * --gpu-memory-utilization leaves on a CUDA device after the weights, the
 * largest step's activations and the fixed reserve, computed on the CPU.
 *
 * The expected counts are worked out by hand in the comments: every
 * device allocation is counted in 2 MiB pages (MDL_DEV_ALLOC_GRAIN), the
 * reserve is 512 MiB, weights and KV are 16-bit.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/model.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* dim 64, 2 layers, 4 heads, 2 KV heads of 16, ffn 128, vocab 256: every
 * allocation fits in one 2 MiB page. */
static mdl_config_t
tiny(void)
{
    mdl_config_t c;

    memset(&c, 0, sizeof(c));
    c.vocab_size = 256;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.ffn_dim = 128;
    c.max_pos = 128;
    return c;
}

/* Llama 3 8B shapes. */
static mdl_config_t
llama8b(void)
{
    mdl_config_t c;

    memset(&c, 0, sizeof(c));
    c.vocab_size = 128256;
    c.dim = 4096;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.ffn_dim = 14336;
    c.max_pos = 8192;
    return c;
}

static mdl_runtime_config_t
rcfg(int32_t tp, int32_t tokens, int32_t seqs, int32_t max_blocks, float util)
{
    mdl_runtime_config_t rc;

    memset(&rc, 0, sizeof(rc));
    rc.device = "cuda";
    rc.tp_size = tp;
    rc.block_size = 16;
    rc.max_num_batched_tokens = tokens;
    rc.max_num_seqs = seqs;
    rc.max_blocks_per_seq = max_blocks;
    rc.gpu_memory_utilization = util;
    return rc;
}

START_TEST(tiny_single_rank)
{
    mdl_config_t c = tiny();
    mdl_runtime_config_t rc = rcfg(1, 512, 16, 8, 0.5f);
    mdl_kv_budget_t kb;
    char err[400];

    /* Weights: 6 pages per layer (2 norms, wq|wk|wv, wo, gate|up, down)
     * x 2 + embeddings, final norm, RoPE table, LM head = 16 pages; the 8
     * activation buffers (x, part, q|k|v, gate|up, h16, split-K attention
     * partials, hrows, staging, logits) one page each. 2 GiB - 32 - 18 -
     * 512 MiB = 1486 MiB of 4096-byte blocks (2 layers x K,V x 2 heads x 16
     * x 16 tokens x 2 B). */
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.budget_bytes, 2 * GIB);
    ck_assert_uint_eq(kb.weight_bytes, 32 * MIB);
    ck_assert_uint_eq(kb.act_bytes, 18 * MIB);
    ck_assert_uint_eq(kb.reserve_bytes, 512 * MIB);
    ck_assert_uint_eq(kb.block_bytes, 4096);
    ck_assert_int_eq(kb.num_blocks, 380416);

    /* Qwen2-style QKV biases: one more page (bq|bk|bv) per layer. */
    c.qkv_bias = 1;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.weight_bytes, 36 * MIB);
    ck_assert_int_eq(kb.num_blocks, (2048 - 36 - 18 - 512) * 256);

    /* What serve measured in use (context, other processes) replaces the
     * fixed reserve when it is larger, never when it is smaller. */
    rc.dev_reserve_bytes = 700 * MIB;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.reserve_bytes, 700 * MIB);
    ck_assert_int_eq(kb.num_blocks, (2048 - 36 - 18 - 700) * 256);
    rc.dev_reserve_bytes = 100 * MIB;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.reserve_bytes, 512 * MIB);
}
END_TEST

START_TEST(tiny_tensor_parallel)
{
    mdl_config_t c = tiny();
    mdl_runtime_config_t rc = rcfg(2, 512, 16, 8, 0.5f);
    mdl_kv_budget_t kb;
    char err[400];

    /* T = 2: one KV head per rank, a block is 2048 bytes; rank 0 (LM head,
     * logits) is the fuller one: 1486 MiB / 2048. */
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.block_bytes, 2048);
    ck_assert_uint_eq(kb.weight_bytes, 32 * MIB);
    ck_assert_int_eq(kb.num_blocks, 760832);

    /* T = 4 with 2 KV heads: each KV head replicated on 2 ranks, so a block
     * still holds one head per rank (not half of one). */
    rc.tp_size = 4;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.block_bytes, 2048);
    ck_assert_int_eq(kb.num_blocks, 760832);

    /* 4 query heads do not split over 3 ranks. */
    rc.tp_size = 3;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)),
                     ST_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "cannot size the KV pool"));
}
END_TEST

START_TEST(llama8b_80gib)
{
    mdl_config_t c = llama8b();
    mdl_runtime_config_t rc = rcfg(1, 2048, 256, 512, 0.9f);
    mdl_kv_budget_t kb;
    char err[400];

    /* Per layer: norms 2 x 2 MiB, wq|wk|wv 48, wo 32, gate|up 224, down
     * 112 = 420 MiB; x 32 = 13440; embeddings and LM head 1002 each,
     * final norm 2, RoPE table 2: 15448 MiB. Activations for 2048 tokens /
     * 256 sequences: x 32, part 32, q|k|v 48, gate|up 224, h16 56,
     * split-K partials 2 (64 x 32 x 130 floats), hrows 4, staging 2, logits
     * 126 (125.25 rounded up) = 526 MiB.
     * 0.9 x 80 GiB = 73728 MiB; 73728 - 15448 - 526 - 512 = 57242 MiB of
     * 2 MiB blocks (32 layers x K,V x 8 heads x 128 x 16 x 2 B). */
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 80 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.weight_bytes, 15448 * MIB);
    ck_assert_uint_eq(kb.act_bytes, 526 * MIB);
    ck_assert_uint_eq(kb.block_bytes, 2 * MIB);
    ck_assert_int_eq(kb.num_blocks, 28621);

    /* T = 2 on two 80 GiB devices: per layer 4 + 24 + 16 + 112 + 56 = 212
     * MiB, x 32 = 6784, + 2004 + 4 = 8792 MiB; activations 32 + 32 + 24 +
     * 112 + 28 + 2 + 4 + 2 + 126 = 362 MiB; blocks of 1 MiB:
     * 73728 - 8792 - 362 - 512 = 64062. */
    rc.tp_size = 2;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 80 * GIB, &kb, err, sizeof(err)), ST_OK);
    ck_assert_uint_eq(kb.weight_bytes, 8792 * MIB);
    ck_assert_uint_eq(kb.act_bytes, 362 * MIB);
    ck_assert_uint_eq(kb.block_bytes, 1 * MIB);
    ck_assert_int_eq(kb.num_blocks, 64062);
}
END_TEST

START_TEST(too_small)
{
    mdl_config_t c = llama8b();
    mdl_config_t t = tiny();
    mdl_runtime_config_t rc = rcfg(1, 2048, 256, 512, 0.9f);
    mdl_kv_budget_t kb;
    char err[400];

    /* 0.9 x 16 GiB = 14.4 GiB < 15448 + 526 + 512 MiB. */
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 16 * GIB, &kb, err, sizeof(err)),
                     ST_ENOMEM);
    ck_assert_int_eq(kb.num_blocks, 0);
    ck_assert_ptr_nonnull(strstr(err, "--gpu-memory-utilization 0.90 of 16.00 GiB"));
    ck_assert_ptr_nonnull(strstr(err, "room for 0 KV blocks of 2.00 MiB"));
    ck_assert_ptr_nonnull(strstr(err, "weights 15.09 GiB"));
    ck_assert_ptr_nonnull(strstr(err, "activations 0.51 GiB for 2048 tokens / 256 sequences"));

    /* The edge: 562 MiB + 2 blocks fit exactly; one byte less leaves 1. */
    rc = rcfg(1, 512, 16, 8, 1.0f);
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&t, &rc, 562 * MIB + 8192, &kb, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(kb.num_blocks, 2);
    ck_assert_int_eq(
        mdl_kv_blocks_for_budget(&t, &rc, 562 * MIB + 8191, &kb, err, sizeof(err)), ST_ENOMEM);
    ck_assert_int_eq(kb.num_blocks, 1);
    ck_assert_ptr_nonnull(strstr(err, "room for 1 KV blocks"));
}
END_TEST

START_TEST(bad_input)
{
    mdl_config_t c = tiny();
    mdl_runtime_config_t rc = rcfg(1, 512, 16, 8, 0.0f);
    mdl_kv_budget_t kb;
    char err[400];

    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "utilization 0.000"));
    rc.gpu_memory_utilization = 1.5f;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_EINVAL);
    rc.gpu_memory_utilization = 0.9f;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 0, &kb, err, sizeof(err)), ST_EINVAL);
    rc.max_num_batched_tokens = 0;
    ck_assert_int_eq(mdl_kv_blocks_for_budget(&c, &rc, 4 * GIB, &kb, err, sizeof(err)), ST_EINVAL);
}
END_TEST

START_TEST(device_memory_query)
{
    size_t total = 1;
    char err[200];

    /* cpu has no device memory to size; cuda without a build or device is
     * ST_ENODEV with a reason. */
    size_t in_use = 1;

    ck_assert_int_eq(mdl_device_memory("cpu", 1, &total, &in_use, err, sizeof(err)), ST_EINVAL);
    ck_assert_uint_eq(total, 0);
    ck_assert_uint_eq(in_use, 0);
    int st = mdl_device_memory("cuda", 1, &total, NULL, err, sizeof(err));
    if (st == ST_OK) {
        ck_assert_uint_gt(total, 0);
    } else {
        ck_assert_int_eq(st, ST_ENODEV);
        ck_assert_uint_eq(total, 0);
        ck_assert_ptr_nonnull(strstr(err, "cuda"));
    }
}
END_TEST

static Suite *
kv_budget_suite(void)
{
    Suite *s = suite_create("kv_budget");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, tiny_single_rank);
    tcase_add_test(tc, tiny_tensor_parallel);
    tcase_add_test(tc, llama8b_80gib);
    tcase_add_test(tc, too_small);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, device_memory_query);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(kv_budget_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
