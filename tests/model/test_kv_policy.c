/* test_kv_policy.c - attention sinks with a rolling window
 * (model/kv_policy.h) and compressed KV dtypes on the default model:
 * policy parsing and the scheduler's evictions in blockmgr
 * (sched_kv_window_evict), generation streaming far past the model's
 * context with bounded KV (f32 and int4) through scheduler/kv_stream.h,
 * and dtype errors.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "model/kv_policy.h"
#include "model/model.h"
#include "scheduler/kv_stream.h"
#include "scheduler/sched.h"
#include "text/tokenizer.h"

static mdl_model_t *model;

static void
setup(void)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    char err[256];

    ck_assert_ptr_nonnull(dir);
    ck_assert_int_eq(mdl_model_load(dir, &model, err, sizeof(err)), ST_OK);
}

static void
teardown(void)
{
    mdl_model_destroy(model);
    model = NULL;
}

START_TEST(test_parse)
{
    mdl_kv_policy_t p;
    char err[160];

    ck_assert_int_eq(mdl_kv_policy_parse("full", 16, &p, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(p.window, 0);
    ck_assert_int_eq(mdl_kv_policy_parse("sink=16,window=64", 16, &p, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(p.sink, 16);
    ck_assert_int_eq(p.window, 64);
    ck_assert_int_eq(mdl_kv_policy_parse("sink=4,window=64", 16, &p, err, sizeof(err)), ST_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "whole blocks"));
    ck_assert_int_eq(mdl_kv_policy_parse("sink=16,window=0", 16, &p, err, sizeof(err)), ST_EINVAL);
    ck_assert_int_eq(mdl_kv_policy_parse("sink=16", 16, &p, err, sizeof(err)), ST_EINVAL);
    ck_assert_int_eq(mdl_kv_policy_parse("sink=16,window=32x", 16, &p, err, sizeof(err)),
                     ST_EINVAL);
}
END_TEST

/* A pool of block_size bs holding one nohash sequence of n tokens in
 * n_blocks blocks; its table before any eviction goes to before[]. */
static bm_pool_t *
evict_pool(uint32_t bs, uint32_t n, uint32_t n_blocks, int32_t *before)
{
    bm_config_t cfg = {.block_size = bs, .num_blocks = n_blocks + 1, .drop_ops = 1};
    int32_t toks[64] = {0}, slots[64];
    const int32_t *t;
    uint32_t nb = 0;
    bm_pool_t *pool;

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_set_nohash(pool, 1), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, n, slots), ST_OK);
    t = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, n_blocks);
    memcpy(before, t, sizeof(int32_t) * nb);
    bm_pool_ops_clear(pool);
    return pool;
}

START_TEST(test_evict_plan)
{
    mdl_kv_policy_t p = {.sink = 8, .window = 16};
    int32_t table[8], tbl4[14], e;
    const int32_t *t;
    const kv_op_t *ops;
    uint32_t nb4 = 0, n_blocks = 0, n_ops = 0;
    bm_pool_t *pool;

    /* 50 tokens in blocks of 4 (13 blocks, the last with 2): keep 8 sinks
     * (2 blocks) and at least 16 recent tokens: (50 - 8 - 16) / 4 = 6
     * whole blocks after the sinks go, the window and tail follow. */
    pool = evict_pool(4, 50, 13, tbl4);
    e = sched_kv_window_evict(pool, 1, 50, p.sink, p.window);
    ck_assert_int_eq(e, 6); /* (50 - 8 - 16) / 4 */
    ck_assert_uint_eq(bm_seq_len(pool, 1), 26);
    t = bm_seq_table(pool, 1, &nb4);
    ck_assert_uint_eq(nb4, 7);
    ops = bm_pool_ops(pool, &n_ops);
    ck_assert_uint_eq(n_ops, 6 + 5); /* the evicted blocks dropped, then */
    ck_assert_int_eq(ops[0].kind, KV_OP_DROP);
    ck_assert_int_eq(ops[0].src, tbl4[2]); /* the first after the sinks */
    ck_assert_int_eq(ops[5].src, tbl4[7]);
    ck_assert_int_eq(t[2], tbl4[8]); /* the window follows the sinks */
    /* ... blocks 9 .. 13 re-rotated by 24 */
    ck_assert_int_eq(ops[6].kind, KV_OP_SHIFT);
    ck_assert_int_eq(ops[6].src, tbl4[8]);
    ck_assert_int_eq(ops[6].dst, 24);
    ck_assert_int_eq(ops[10].src, tbl4[12]);
    bm_pool_ops_clear(pool);
    /* Nothing due: no change. */
    ck_assert_int_eq(sched_kv_window_evict(pool, 1, 26, p.sink, p.window), 0);
    (void)bm_pool_ops(pool, &n_ops);
    ck_assert_uint_eq(n_ops, 0);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 26);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
    /* Blocks of 8, 50 tokens: (50 - 24) / 8 = 3 of the 6 non-sink blocks. */
    pool = evict_pool(8, 50, 7, table);
    e = sched_kv_window_evict(pool, 1, 50, p.sink, p.window);
    ck_assert_int_eq(e, 3);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 26);
    t = bm_seq_table(pool, 1, &n_blocks);
    ck_assert_uint_eq(n_blocks, 4);
    ck_assert_int_eq(t[1], table[4]);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
}
END_TEST

static void
argmax_cb(void *arg, int64_t i, const float *logits)
{
    int32_t *out = arg, best = 0;

    (void)i;
    for (int32_t v = 1; v < 1024; v++) {
        best = logits[v] > logits[best] ? v : best;
    }
    *out = best;
}

/* Greedy generation of 3x the model's context, one token per step, under
 * sink=16,window=160: no error and the cache never exceeds its bound.
 * (This tiny model's greedy text loops within its context already; the
 * coherence past the context is measured on real text in test_stream_text.) */
static void
stream_past_context(mdl_kv_dtype_t dtype)
{
    const mdl_config_t *c = mdl_model_config(model);
    mdl_kv_policy_t p = {.sink = 16, .window = 160};
    int32_t bound = p.sink + p.window + 16 + 1;
    mdl_runtime_config_t rc = {.block_size = 16,
                               .num_blocks = bound / 16 + 3,
                               .max_num_batched_tokens = 32,
                               .max_num_seqs = 32,
                               .max_blocks_per_seq = bound / 16 + 2,
                               .n_threads = 1,
                               .kv_dtype = dtype};
    mdl_runtime_t *rt;
    sched_stream_t *ks;
    char err[256];
    const int32_t n_gen = 3 * c->max_pos;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_gen + 1)), next = 0;
    int seen[1024] = {0}, distinct = 0;

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(sched_stream_create(rt, &p, 16, bound, 1, c->vocab_size, &ks), ST_OK);
    ids[0] = c->bos_id;
    for (int32_t i = 0; i < n_gen; i++) {
        ck_assert_int_eq(sched_stream_feed(ks, ids + i, 1, argmax_cb, &next), ST_OK);
        ids[i + 1] = next;
        ck_assert_int_le(sched_stream_kv_len(ks), p.sink + p.window + 16);
    }
    ck_assert_int_gt(sched_stream_evicted(ks), 20);
    ck_assert_int_le(sched_stream_kv_peak(ks), p.sink + p.window + 16);
    for (int32_t i = n_gen - 200; i <= n_gen; i++) {
        distinct += !seen[ids[i]];
        seen[ids[i]] = 1;
    }
    ck_assert_int_ge(distinct, 3);
    /* Without a policy the same stream stops at the context. */
    mdl_kv_policy_t full = {0};
    sched_stream_t *ks2;

    ck_assert_int_eq(sched_stream_create(rt, &full, 16, bound, 1, c->vocab_size, &ks2), ST_OK);
    ck_assert_int_eq(sched_stream_reset(ks), ST_OK);
    ck_assert_int_eq(sched_stream_feed(ks2, ids, bound, NULL, NULL), ST_OK);
    ck_assert_int_eq(sched_stream_feed(ks2, ids, 1, NULL, NULL), ST_ETOOLONG);
    sched_stream_destroy(ks2);
    sched_stream_destroy(ks);
    mdl_runtime_destroy(rt);
    free(ids);
}

START_TEST(test_stream_f32)
{
    stream_past_context(MDL_KV_F32);
}
END_TEST

START_TEST(test_stream_int4)
{
    stream_past_context(MDL_KV_INT4);
}
END_TEST

/* tq3 re-encodes a shifted block's keys (kernels/cpu/kv_tq.h). */
START_TEST(test_stream_tq3)
{
    stream_past_context(MDL_KV_TQ3);
}
END_TEST

typedef struct nll_acc {
    const int32_t *toks;
    int64_t from; /* score predictions of tokens >= from */
    int64_t base; /* index of row 0 in toks */
    double nll;
    int64_t n;
} nll_acc_t;

static void
nll_cb(void *arg, int64_t i, const float *logits)
{
    nll_acc_t *a = arg;
    int64_t tgt = a->base + i + 1;
    double mx = logits[0], sum = 0.0;

    if (tgt < a->from) {
        return;
    }
    for (int32_t v = 1; v < 1024; v++) {
        mx = logits[v] > mx ? logits[v] : mx;
    }
    for (int32_t v = 0; v < 1024; v++) {
        sum += exp((double)logits[v] - mx);
    }
    a->nll += mx + log(sum) - logits[a->toks[tgt]];
    a->n++;
}

/* Coherence past the context: the Austen fixture (about 13 contexts long)
 * streamed through sink=16,window=160 predicts its tokens after position
 * 1024 as well as fresh windows of the model's context (every token with at
 * least 128 tokens of context) do, for f32 and int8 KV. */
START_TEST(test_stream_text)
{
    const char *path = getenv("KVSERVE_TEST_TEXT");
    const mdl_config_t *c = mdl_model_config(model);
    FILE *f;
    char *text = malloc(1 << 16);
    size_t len;
    int32_t *toks;
    size_t n;

    ck_assert_ptr_nonnull(path);
    f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    ck_assert_int_eq(tok_encode(mdl_model_tokenizer(model), text, len, TOK_ADD_SPECIAL, &toks, &n),
                     ST_OK);
    ck_assert_uint_gt(n, 2048);
    for (int d = 0; d < 2; d++) {
        mdl_kv_policy_t p = {.sink = 16, .window = 160}, full = {0};
        mdl_runtime_config_t rc = {.block_size = 16,
                                   .num_blocks = 24,
                                   .max_num_batched_tokens = 16,
                                   .max_num_seqs = 16,
                                   .max_blocks_per_seq = 20,
                                   .n_threads = 1,
                                   .kv_dtype = d == 0 ? MDL_KV_F32 : MDL_KV_INT8};
        mdl_runtime_t *rt;
        sched_stream_t *ks;
        char err[256];
        nll_acc_t st = {.toks = toks, .from = 1024}, win = {.toks = toks, .from = 1024};

        ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
        ck_assert_int_eq(sched_stream_create(rt, &p, 16, 16 + 160 + 32, 16, 1024, &ks), ST_OK);
        ck_assert_int_eq(sched_stream_feed(ks, toks, (int32_t)n - 1, nll_cb, &st), ST_OK);
        ck_assert_int_le(sched_stream_kv_peak(ks), 16 + 160 + 32);
        sched_stream_destroy(ks);
        /* Fresh windows of 256 starting every 128 tokens. */
        ck_assert_int_eq(sched_stream_create(rt, &full, 16, c->max_pos, 16, 1024, &ks), ST_OK);
        for (int64_t b = 1024 - 128; b + 1 < (int64_t)n; b += 128) {
            int64_t end = b + c->max_pos < (int64_t)n ? b + c->max_pos : (int64_t)n;

            win.from = b == 1024 - 128 ? 1024 : b + 128;
            win.base = b;
            ck_assert_int_eq(sched_stream_reset(ks), ST_OK);
            ck_assert_int_eq(sched_stream_feed(ks, toks + b, (int32_t)(end - 1 - b), nll_cb, &win),
                             ST_OK);
        }
        sched_stream_destroy(ks);
        mdl_runtime_destroy(rt);
        ck_assert_int_eq(st.n, (int64_t)n - 1024);
        ck_assert_int_eq(win.n, st.n);
        ck_assert_msg(st.nll / st.n <= win.nll / win.n * 1.02, "stream NLL %.4f vs windows %.4f",
                      st.nll / st.n, win.nll / win.n);
    }
    free(toks);
    free(text);
}
END_TEST

/* Sizes and refusals of the dtypes on this model (2 KV heads x 32). */
START_TEST(test_dtypes)
{
    const mdl_config_t *c = mdl_model_config(model);
    mdl_config_t odd = *c;
    mdl_kv_dtype_t d;
    mdl_runtime_t *rt = NULL;
    char err[256];

    ck_assert_uint_eq(mdl_kv_block_bytes(c, 16, MDL_KV_INT8),
                      6 * ((2 * 16 * 32 + 2 * 2 * 2 * 32) + (2 * 16 * 32 + 2 * 2 * 2 * 16)));
    ck_assert_uint_eq(mdl_kv_block_bytes(c, 16, MDL_KV_INT4),
                      6 * ((2 * 16 * 16 + 2 * 2 * 2 * 32) + (2 * 16 * 16 + 2 * 2 * 2 * 16)));
    /* tq3: 3 bit planes of 4 bytes per row, + f16 norm + u8 residual norm
     * for keys, + log8 norm for values; no meta. */
    ck_assert_uint_eq(mdl_kv_block_bytes(c, 16, MDL_KV_TQ3), 6 * (2 * 16 * 16 + 2 * 16 * 12));
    ck_assert_uint_eq(mdl_kv_block_bytes(c, 16, MDL_KV_TQ4), 6 * (2 * 16 * 19 + 2 * 16 * 17));
    ck_assert_int_eq(mdl_kv_dtype_parse("tq3", &d), ST_OK);
    ck_assert_int_eq(d, MDL_KV_TQ3);
    ck_assert_str_eq(mdl_kv_dtype_name(MDL_KV_TQ4), "tq4");
    odd.head_dim = 36;
    ck_assert_uint_eq(mdl_kv_block_bytes(&odd, 16, MDL_KV_INT4), 0);
    ck_assert_uint_eq(mdl_kv_block_bytes(&odd, 16, MDL_KV_TQ3), 0);
    ck_assert_uint_gt(mdl_kv_block_bytes(&odd, 16, MDL_KV_INT8), 0);
    ck_assert_int_eq(mdl_kv_dtype_parse("fp8_e4m3", &d), ST_OK);
    ck_assert_int_eq(d, MDL_KV_FP8_E4M3);
    ck_assert_int_eq(mdl_kv_dtype_parse("int3", &d), ST_EINVAL);
    ck_assert_str_eq(mdl_kv_dtype_name(MDL_KV_INT4), "int4");
    /* Bad shifts are refused; the tensor-parallel backend shifts as well. */
    mdl_runtime_config_t rc = {.num_blocks = 4, .kv_dtype = MDL_KV_INT8};
    kv_op_t bad = {KV_OP_SHIFT, 0, 16};

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, &bad, 1), ST_EINVAL);
    bad.src = 1;
    bad.dst = -1;
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, &bad, 1), ST_EINVAL);
    mdl_runtime_destroy(rt);
    rc.tp_size = 2; /* the tensor-parallel cpu backend shifts too (tests/cuda/test_tp.c) */
    rc.kv_dtype = MDL_KV_F32;
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
    bad.dst = 16;
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, &bad, 1), ST_OK);
    mdl_runtime_destroy(rt);
}
END_TEST

static Suite *
kv_policy_suite(void)
{
    Suite *s = suite_create("kv_policy");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_evict_plan);
    tcase_add_test(tc, test_stream_f32);
    tcase_add_test(tc, test_stream_int4);
    tcase_add_test(tc, test_stream_tq3);
    tcase_add_test(tc, test_stream_text);
    tcase_add_test(tc, test_dtypes);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(kv_policy_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
