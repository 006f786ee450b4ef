/* test_sched_cost.c - the scheduler's per-step costs made proportional to
 * what changed (issue 15), checked for the same behaviour:
 *
 *   - a prompt's block hashes are computed once per request
 *     (blockmgr/bm_memo.h): under recompute pressure with chunked
 *     prefill, every request is admitted, preempted and admitted again,
 *     yet the pool hashes each prompt block exactly once, and the outputs
 *     equal a run without pressure (the fake model reads every context
 *     back through the block tables);
 *   - block tables are persistent rows sent as their changes
 *     (scheduler/sched_tabs.h): every test of this binary compares each
 *     synced row with blockmgr's whole table every step (check_tables);
 *     here, a calm run sends each table entry exactly once, and runs
 *     under swap and recompute pressure, with n > 1 forks (copy-on-write)
 *     and prefix hits, give the same outputs as tables rebuilt whole.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/bm_memo.h"
#include "common/status.h"
#include "fake_model.h"

static fake_env_t env;

/* 8 requests of 40-token prompts (10 full blocks of 4) generating 3
 * tokens, so that no block past the prompt ever fills. */
static uint64_t
run_prompts(int32_t num_blocks, int32_t mnbt, fake_out_t *outs, sched_stats_t *st)
{
    fake_cfg_t c = fake_cfg_default();

    c.num_blocks = num_blocks;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = mnbt;
    fake_env_init(&env, &c);
    uint64_t h0 = bm_pool_hash_calls(env.pool);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(fake_submit(&env, (uint64_t)i + 1, 0, 40, (uint32_t)(300 + i), 3),
                         ST_OK);
    }
    fake_run(&env, 100000);
    sched_get_stats(env.sched, st);
    uint64_t hashes = bm_pool_hash_calls(env.pool) - h0;
    for (int i = 0; i < 8; i++) {
        outs[i] = env.out[i + 1][0];
        ck_assert(outs[i].finished);
        ck_assert_int_eq(outs[i].n_tokens, 3);
    }
    fake_env_fini(&env);
    return hashes;
}

START_TEST(test_prompt_hashed_once_through_recomputes)
{
    static fake_out_t calm[8], pressed[8];
    sched_stats_t st;

    ck_assert_uint_eq(run_prompts(257, 256, calm, &st), 8 * 10);
    ck_assert_uint_eq(st.preempt_recompute, 0);
    /* 16-token chunks admit more than 17 blocks can grow into. */
    ck_assert_uint_eq(run_prompts(18, 16, pressed, &st), 8 * 10);
    ck_assert_uint_gt(st.preempt_recompute, 0);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(memcmp(calm[i].tokens, pressed[i].tokens, 3 * sizeof(int32_t)), 0);
    }
}
END_TEST

/* Steps until idle, adding up the batches' dirty table entries and the
 * entries a whole rebuild would have sent. */
static void
run_counting(int64_t *dirty, int64_t *whole)
{
    sched_plan_t plan;

    *dirty = *whole = 0;
    for (int guard = 0; guard < 100000 && !sched_idle(env.sched); guard++) {
        if (fake_step(&env, &plan) == 0) {
            continue;
        }
        for (int32_t k = 0; k < plan.batch.n_table_dirty; k++) {
            *dirty += plan.batch.table_dirty[k].count;
        }
        for (int32_t r = 0; r < plan.batch.n_seqs; r++) {
            *whole += (plan.batch.context_len[r] + env.block_size - 1) / env.block_size;
        }
    }
}

START_TEST(test_calm_run_sends_each_entry_once)
{
    fake_cfg_t c = fake_cfg_default();
    int64_t dirty, whole, blocks = 0;

    c.max_num_batched_tokens = 32; /* chunked prefills too */
    fake_env_init(&env, &c);
    for (int i = 0; i < 8; i++) {
        int32_t n_prompt = 13 + 5 * i, n_out = 20;
        ck_assert_int_eq(fake_submit(&env, (uint64_t)i + 1, 0, n_prompt, (uint32_t)(40 + i), n_out),
                         ST_OK);
        /* The last forward's context: the prompt and all but the last token. */
        blocks += (n_prompt + n_out - 1 + c.block_size - 1) / c.block_size;
    }
    run_counting(&dirty, &whole);
    ck_assert_int_eq(dirty, blocks);
    ck_assert_int_gt(whole, 5 * dirty);
    fake_env_fini(&env);
}
END_TEST

/* Swap, recompute, forks and prefix hits, with tables sent as changes and
 * rebuilt whole: the same tokens for every choice. */
static void
run_mixed(int full, int swap_blocks, fake_out_t (*outs)[FAKE_MAX_CHOICES], int64_t *dirty,
          int64_t *whole, sched_stats_t *st)
{
    fake_cfg_t c = fake_cfg_default();

    c.num_blocks = 30;
    c.swap_blocks = swap_blocks;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 24;
    c.full_tables = full;
    fake_env_init(&env, &c);
    for (int i = 0; i < 10; i++) {
        eng_request_t r;
        /* Pairs share their prompt (prefix hits); every third forks. */
        fake_req_fill(&r, (uint64_t)i + 1, 0, 18 + 3 * (i / 2), (uint32_t)(7 + i / 2), 24);
        r.n = i % 3 == 0 ? 2 : 1;
        ck_assert_int_eq(fake_submit_req(&env, &r), ST_OK);
    }
    run_counting(dirty, whole);
    sched_get_stats(env.sched, st);
    for (int i = 0; i < 10; i++) {
        for (int k = 0; k < FAKE_MAX_CHOICES; k++) {
            outs[i][k] = env.out[i + 1][k];
        }
    }
    fake_env_fini(&env);
}

START_TEST(test_delta_tables_same_as_whole)
{
    static fake_out_t a[10][FAKE_MAX_CHOICES], b[10][FAKE_MAX_CHOICES];
    int64_t da, wa, db, wb;
    sched_stats_t sa, sb;

    for (int swap = 0; swap <= 200; swap += 200) {
        run_mixed(1, swap, a, &da, &wa, &sa);
        run_mixed(0, swap, b, &db, &wb, &sb);
        ck_assert_uint_gt(sb.preempt_swap + sb.preempt_recompute, 0);
        ck_assert_uint_eq(sa.preempt_swap, sb.preempt_swap);
        ck_assert_uint_eq(sa.preempt_recompute, sb.preempt_recompute);
        ck_assert_int_eq(da, 0); /* whole tables: no runs */
        ck_assert_int_eq(wa, wb);
        ck_assert_int_lt(db, wb);
        for (int i = 0; i < 10; i++) {
            for (int k = 0; k < (i % 3 == 0 ? 2 : 1); k++) {
                ck_assert(a[i][k].finished && b[i][k].finished);
                ck_assert_int_eq(a[i][k].n_tokens, b[i][k].n_tokens);
                ck_assert_int_eq(memcmp(a[i][k].tokens, b[i][k].tokens,
                                        (size_t)a[i][k].n_tokens * sizeof(int32_t)),
                                 0);
            }
        }
    }
}
END_TEST

Suite *
scheduler_cost_suite(void)
{
    Suite *s = suite_create("scheduler_cost");
    TCase *tc = tcase_create("cost");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prompt_hashed_once_through_recomputes);
    tcase_add_test(tc, test_calm_run_sends_each_entry_once);
    tcase_add_test(tc, test_delta_tables_same_as_whole);
    suite_add_tcase(s, tc);
    return s;
}
