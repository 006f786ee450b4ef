/* test_kv_evict.c - attention-score eviction (model/kv_policy.h: H2O
 * heavy hitters, SnapKV) on the default model: the policy strings and
 * their errors, the scheduler's selection (scheduler/kv_evict.h) on hand
 * computed masses, the compaction through blockmgr and the runtime
 * (KV_OP_COPY_SLOT moves K, V and mass: the next token's logits equal
 * those of a block table that simply leaves the evicted block out, with
 * the sequence alone or sharing its blocks with a fork), greedy output
 * with a budget above the sequence equal to no policy, and the bounds
 * the policies keep while streaming.
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
#include "scheduler/kv_evict.h"
#include "scheduler/kv_stream.h"
#include "text/tokenizer.h"

#define BS 16
#define VOCAB 1024

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
    char err[256];

    ck_assert_int_eq(mdl_kv_policy_parse("h2o=128,recent=32", BS, &p, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(p.kind, MDL_KVP_H2O);
    ck_assert_int_eq(p.budget, 128);
    ck_assert_int_eq(p.recent, 32);
    ck_assert_int_eq(p.window, 0); /* not the sinks' rolling window */
    ck_assert_int_eq(mdl_kv_policy_parse("snapkv=100,window=8,pool=5", BS, &p, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(p.kind, MDL_KVP_SNAPKV);
    ck_assert_int_eq(p.budget, 100);
    ck_assert_int_eq(p.recent, 8);
    ck_assert_int_eq(p.pool, 5);
    ck_assert_int_eq(mdl_kv_policy_parse("snapkv=100,window=8", BS, &p, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(p.pool, 1);
    ck_assert_int_eq(mdl_kv_policy_parse("full", BS, &p, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(p.kind, MDL_KVP_FULL);

    static const char *const bad[] = {
        "h2o=128",          "h2o=128,recent=0",       "h2o=36,recent=32", /* B <= W + slack 4 */
        "h2o=128,recent=8x", "h2o=-1,recent=8",       "snapkv=64,window=64,pool=3",
        "snapkv=64,window=8,pool=0", "snapkv=64,pool=3", "snapkv=64,window=8,pool=3,x=1",
        "h2o",              "lru=64",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(mdl_kv_policy_parse(bad[i], BS, &p, err, sizeof(err)) == ST_EINVAL,
                      "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(err, bad[i]) != NULL && strstr(err, "expected") != NULL,
                      "'%s': unclear error '%s'", bad[i], err);
    }
}
END_TEST

START_TEST(test_select)
{
    /* One head: candidates 0..3 (the last 2 are recent), top 2 by mass. */
    const float m1[6] = {5, 1, 9, 3, 7, 2};
    uint32_t keep[6];

    ck_assert_int_eq(sched_kv_select(m1, 6, 1, 4, 2, 1, keep), 4);
    ck_assert_uint_eq(keep[0], 0);
    ck_assert_uint_eq(keep[1], 2);
    ck_assert_uint_eq(keep[2], 4);
    ck_assert_uint_eq(keep[3], 5);
    /* Max-pooled over 3: 5 9 9 9 -> the older of the tied ones. */
    ck_assert_int_eq(sched_kv_select(m1, 6, 1, 4, 2, 3, keep), 4);
    ck_assert_uint_eq(keep[0], 1);
    ck_assert_uint_eq(keep[1], 2);
    /* Budget above the length keeps everything; recent above the budget
     * keeps the newest. */
    ck_assert_int_eq(sched_kv_select(m1, 6, 1, 9, 2, 1, keep), 6);
    ck_assert_uint_eq(keep[5], 5);
    ck_assert_int_eq(sched_kv_select(m1, 6, 1, 3, 5, 1, keep), 3);
    ck_assert_uint_eq(keep[0], 3);
    /* Three heads vote: head 0 wants {0, 1}, heads 1 and 2 want {1, 2}:
     * 1 has three votes, 2 two, 0 one. */
    const float m3[5 * 3] = {
        9, 0, 0, /* token 0 */
        8, 5, 6, /* token 1 */
        0, 7, 9, /* token 2 */
        1, 1, 1, /* token 3 */
        0, 0, 0, /* token 4 (recent) */
    };
    ck_assert_int_eq(sched_kv_select(m3, 5, 3, 3, 1, 1, keep), 3);
    ck_assert_uint_eq(keep[0], 1);
    ck_assert_uint_eq(keep[1], 2);
    ck_assert_uint_eq(keep[2], 4);
}
END_TEST

static mdl_runtime_t *
runtime(int32_t num_blocks, int kv_mass)
{
    mdl_runtime_config_t rc = {
        .device = "cpu",
        .block_size = BS,
        .num_blocks = num_blocks,
        .max_num_batched_tokens = 128,
        .max_num_seqs = 4,
        .max_blocks_per_seq = 16,
        .kv_mass = kv_mass,
    };
    mdl_runtime_t *rt = NULL;
    char err[256];

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
    return rt;
}

static void
run_ops(mdl_runtime_t *rt, bm_pool_t *pool)
{
    uint32_t n = 0;
    const kv_op_t *ops = bm_pool_ops(pool, &n);

    ck_assert_int_eq(mdl_runtime_kv_ops(rt, ops, (int32_t)n), ST_OK);
    bm_pool_ops_clear(pool);
}

/* One forward of toks[0..n) at positions pos, slots, over block table bt
 * (context ctx); logits of the last row to out[VOCAB]. mass: rows on. */
static void
forward(mdl_runtime_t *rt, const int32_t *toks, const int32_t *pos, const int32_t *slots,
        int32_t n, const int32_t *bt, int32_t ctx, int mass, float *out)
{
    int32_t qs[2] = {0, n}, row = n - 1;
    uint8_t on[128];
    const float *logits;

    memset(on, 1, sizeof(on));
    int32_t table[16] = {0};
    memcpy(table, bt, sizeof(int32_t) * (size_t)((ctx + BS - 1) / BS));
    mdl_batch_t b = {
        .n_tokens = n,
        .tokens = toks,
        .positions = pos,
        .slot_mapping = slots,
        .n_seqs = 1,
        .query_start = qs,
        .context_len = &ctx,
        .block_tables = table,
        .max_blocks = 16,
        .logits_rows = &row,
        .n_logits = 1,
        .mass_rows = mass ? on : NULL,
    };
    ck_assert_int_eq(mdl_forward(rt, &b, &logits), ST_OK);
    memcpy(out, logits, sizeof(float) * VOCAB);
}

/* 80 tokens (5 blocks); the compaction keeps all but block 2 (tokens
 * 32..47), so tokens 48..79 move down by one block, slot by slot; the
 * next token, at position 80, must see exactly what a block table without
 * block 2 shows. With fork, a second sequence shares every block first:
 * the moved tokens go to private copies and the fork still reads its own. */
static void
compact_vs_table(int fork)
{
    mdl_runtime_t *rt = runtime(24, 1);
    bm_config_t bc = {.block_size = BS, .num_blocks = 24, .drop_ops = 1};
    bm_pool_t *pool;
    int32_t toks[81], pos[81], slots[81], before[5], kslots[80], old_slots[80];
    uint32_t keep[64], nb = 0;
    const int32_t *t;
    float *la = malloc(sizeof(float) * VOCAB), *lb = malloc(sizeof(float) * VOCAB);
    float *m_before = malloc(sizeof(float) * 80 * 12), *m_after = malloc(sizeof(float) * 64 * 12);
    int32_t heads = mdl_runtime_kv_mass_heads(rt);

    ck_assert_int_eq(heads, 6 * 2);
    for (int32_t i = 0; i < 81; i++) {
        toks[i] = 3 + (i * 37) % 900;
        pos[i] = i;
    }
    ck_assert_int_eq(bm_pool_create(&bc, &pool), ST_OK);
    ck_assert_int_eq(bm_seq_create(pool, 1, 0), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks, 80, slots), ST_OK);
    run_ops(rt, pool);
    t = bm_seq_table(pool, 1, &nb);
    memcpy(before, t, sizeof(before));
    forward(rt, toks, pos, slots, 80, before, 80, 1, la);
    if (fork) {
        ck_assert_int_eq(bm_seq_fork(pool, 1, 2), ST_OK);
    }
    sched_kv_slots(pool, 1, 80, old_slots);
    ck_assert_int_eq(mdl_runtime_kv_mass(rt, old_slots, 80, m_before), ST_OK);
    /* Every row's probabilities: the masses over all tokens sum to
     * 80 rows x 3 query heads per KV head, per layer and KV head. */
    for (int32_t h = 0; h < heads; h++) {
        double sum = 0.0;
        for (int32_t i = 0; i < 80; i++) {
            sum += m_before[i * heads + h];
        }
        ck_assert_msg(fabs(sum - 240.0) < 1e-2, "head %d: mass %.4f", h, sum);
    }
    for (int32_t i = 0, k = 0; i < 80; i++) {
        if (i / BS != 2) {
            keep[k++] = (uint32_t)i;
        }
    }
    ck_assert_int_eq(bm_seq_compact(pool, 1, keep, 64), ST_OK);
    run_ops(rt, pool);
    bm_pool_check(pool);
    ck_assert_uint_eq(bm_seq_len(pool, 1), 64);
    /* The mass moved with its tokens. */
    sched_kv_slots(pool, 1, 64, kslots);
    ck_assert_int_eq(mdl_runtime_kv_mass(rt, kslots, 64, m_after), ST_OK);
    for (int32_t i = 0; i < 64; i++) {
        for (int32_t h = 0; h < heads; h++) {
            ck_assert_float_eq(m_after[i * heads + h], m_before[keep[i] * heads + h]);
        }
    }
    /* The next token at position 80 after the compacted cache ... */
    int32_t slot_a, slot_b;
    ck_assert_int_eq(bm_seq_reserve(pool, 1, toks + 80, 1, &slot_a), ST_OK);
    run_ops(rt, pool);
    t = bm_seq_table(pool, 1, &nb);
    ck_assert_uint_eq(nb, 5);
    if (!fork) {
        ck_assert_int_eq(t[0], before[0]); /* untouched before the first moved token */
        ck_assert_int_eq(t[2], before[2]); /* written in place */
    } else {
        ck_assert_int_ne(t[2], before[2]); /* a private copy */
        ck_assert_int_ne(t[3], before[3]);
    }
    int32_t ta[5];
    memcpy(ta, t, sizeof(ta));
    forward(rt, toks + 80, pos + 80, &slot_a, 1, ta, 65, 0, la);
    /* ... equals it over the old blocks without block 2: a fresh block for
     * the new token (the fork, if any, still holds the old ones). */
    if (!fork) {
        /* The old blocks were rewritten in place: rebuild them from the
         * same history in a second runtime instead. */
        mdl_runtime_t *rt2 = runtime(24, 0);
        int32_t tb[6] = {1, 2, 3, 4, 5, 6}, sl[81], tb2[5] = {1, 2, 4, 5, 6};
        float *scratch = malloc(sizeof(float) * VOCAB);

        for (int32_t i = 0; i < 81; i++) {
            sl[i] = tb[i / BS] * BS + i % BS;
        }
        forward(rt2, toks, pos, sl, 80, tb, 80, 0, scratch);
        slot_b = 6 * BS; /* block 6, offset 0 */
        tb2[4] = 6;
        tb2[0] = 1;
        tb2[1] = 2;
        tb2[2] = 4;
        tb2[3] = 5;
        forward(rt2, toks + 80, pos + 80, &slot_b, 1, tb2, 65, 0, lb);
        (void)tb2;
        free(scratch);
        mdl_runtime_destroy(rt2);
    } else {
        /* The fork holds the original blocks: read them directly. */
        int32_t tb2[5];
        int32_t fresh = 23; /* an unused block of the runtime */
        tb2[0] = before[0];
        tb2[1] = before[1];
        tb2[2] = before[3];
        tb2[3] = before[4];
        tb2[4] = fresh;
        slot_b = fresh * BS;
        for (uint32_t b = 0; b < 5; b++) {
            ck_assert_int_ne(ta[b], fresh);
        }
        forward(rt, toks + 80, pos + 80, &slot_b, 1, tb2, 65, 0, lb);
        /* and the fork still reads its own 80 tokens */
        const int32_t *tf = bm_seq_table(pool, 2, &nb);
        ck_assert_uint_eq(nb, 5);
        ck_assert_int_eq(memcmp(tf, before, sizeof(before)), 0);
    }
    for (int32_t v = 0; v < VOCAB; v++) {
        ck_assert_msg(la[v] == lb[v], "logit %d: %.7f vs %.7f", v, la[v], lb[v]);
    }
    bm_pool_destroy(pool);
    mdl_runtime_destroy(rt);
    free(la);
    free(lb);
    free(m_before);
    free(m_after);
}

START_TEST(test_compact_in_place)
{
    compact_vs_table(0);
}
END_TEST

START_TEST(test_compact_shared)
{
    compact_vs_table(1);
}
END_TEST

static void
argmax_cb(void *arg, int64_t i, const float *logits)
{
    int32_t *out = arg, best = 0;

    (void)i;
    for (int32_t v = 1; v < VOCAB; v++) {
        best = logits[v] > logits[best] ? v : best;
    }
    *out = best;
}

static int32_t *
text_tokens(size_t *n)
{
    const char *path = getenv("KVSERVE_TEST_TEXT");
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 16);
    size_t len;
    int32_t *toks = NULL;

    ck_assert_ptr_nonnull(f);
    len = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    ck_assert_int_eq(tok_encode(mdl_model_tokenizer(model), buf, len, TOK_ADD_SPECIAL, &toks, n),
                     ST_OK);
    free(buf);
    return toks;
}

/* Greedy generation: prompt of n_prompt text tokens, then gen tokens one
 * per step; ids to out. Checks the policy's bound on the way. */
static void
greedy(const mdl_kv_policy_t *p, const int32_t *prompt, int32_t n_prompt, int32_t gen,
       int32_t *out, int32_t *kv_max)
{
    int scored = p->kind != MDL_KVP_FULL;
    mdl_runtime_config_t rc = {
        .device = "cpu",
        .block_size = BS,
        .num_blocks = sched_stream_blocks(BS, 256) + 1,
        .max_num_batched_tokens = 64,
        .max_num_seqs = 64,
        .max_blocks_per_seq = sched_stream_blocks(BS, 256),
        .kv_mass = scored,
    };
    mdl_runtime_t *rt = NULL;
    sched_stream_t *s = NULL;
    char err[256];
    int32_t next = 0;

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(sched_stream_create(rt, p, BS, 256, 64, VOCAB, &s), ST_OK);
    sched_stream_set_prompt(s, n_prompt);
    ck_assert_int_eq(sched_stream_feed_last(s, prompt, n_prompt, argmax_cb, &next), ST_OK);
    if (p->kind == MDL_KVP_SNAPKV && n_prompt > p->budget) {
        ck_assert_int_eq(sched_stream_kv_len(s), p->budget); /* compressed once */
    }
    *kv_max = 0;
    for (int32_t g = 0; g < gen; g++) {
        int32_t tok = next;
        int32_t kv = sched_stream_kv_len(s) + 1;

        *kv_max = kv > *kv_max ? kv : *kv_max;
        out[g] = tok;
        ck_assert_int_eq(sched_stream_feed(s, &tok, 1, argmax_cb, &next), ST_OK);
        if (p->kind == MDL_KVP_H2O) {
            ck_assert_int_lt(sched_stream_kv_len(s), p->budget);
        }
    }
    sched_stream_destroy(s);
    mdl_runtime_destroy(rt);
}

START_TEST(test_greedy_budget_above)
{
    size_t n = 0;
    int32_t *toks = text_tokens(&n);
    int32_t ref[96], got[96], kv_max;
    mdl_kv_policy_t full = {0}, h2o = {0}, snap = {0};
    char err[128];

    ck_assert_int_ge(n, 160);
    ck_assert_int_eq(mdl_kv_policy_parse("h2o=256,recent=16", BS, &h2o, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(mdl_kv_policy_parse("snapkv=200,window=16,pool=7", BS, &snap, err,
                                         sizeof(err)), ST_OK);
    greedy(&full, toks, 150, 96, ref, &kv_max);
    greedy(&h2o, toks, 150, 96, got, &kv_max);
    ck_assert_int_eq(memcmp(ref, got, sizeof(ref)), 0);
    greedy(&snap, toks, 150, 96, got, &kv_max);
    ck_assert_int_eq(memcmp(ref, got, sizeof(ref)), 0);
    free(toks);
}
END_TEST

/* Budgets below the sequence: the bounds hold and generation goes on
 * past what the cache holds. */
START_TEST(test_bounded)
{
    size_t n = 0;
    int32_t *toks = text_tokens(&n);
    int32_t got[100], kv_max;
    mdl_kv_policy_t h2o = {0}, snap = {0};
    char err[128];

    ck_assert_int_eq(mdl_kv_policy_parse("h2o=64,recent=16", BS, &h2o, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(mdl_kv_policy_parse("snapkv=48,window=8,pool=5", BS, &snap, err,
                                         sizeof(err)), ST_OK);
    greedy(&h2o, toks, 120, 100, got, &kv_max);
    ck_assert_int_le(kv_max, 64);
    greedy(&snap, toks, 120, 100, got, &kv_max);
    ck_assert_int_eq(kv_max, 48 + 100);
    free(toks);
}
END_TEST

/* A compressed KV dtype has no slot moves: a clear error at creation. */
START_TEST(test_errors)
{
    mdl_runtime_config_t rc = {
        .device = "cpu", .block_size = BS, .num_blocks = 8, .kv_dtype = MDL_KV_INT8, .kv_mass = 1};
    mdl_runtime_t *rt = NULL;
    char err[256] = "";
    kv_op_t op = {.kind = KV_OP_COPY_SLOT, .src = 3, .dst = BS};

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)), ST_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "f32 KV cache"));
    rt = runtime(8, 0);
    int32_t slot = BS;
    float m;
    ck_assert_int_eq(mdl_runtime_kv_mass(rt, &slot, 1, &m), ST_EUNSUPPORTED);
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, &op, 1), ST_EINVAL); /* slot 3: the null block */
    mdl_runtime_destroy(rt);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("kv_evict");
    TCase *tc = tcase_create("evict");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_select);
    tcase_add_test(tc, test_compact_in_place);
    tcase_add_test(tc, test_compact_shared);
    tcase_add_test(tc, test_greedy_budget_above);
    tcase_add_test(tc, test_bounded);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
