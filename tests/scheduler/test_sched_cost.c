/* test_sched_cost.c - the scheduler's per-step costs made proportional to
 * what changed (issue 15), checked for the same behaviour:
 *
 *   - a prompt's block hashes are computed once per request
 *     (blockmgr/bm_memo.h): under recompute pressure with chunked
 *     prefill, every request is admitted, preempted and admitted again,
 *     yet the pool hashes each prompt block exactly once, and the outputs
 *     equal a run without pressure (the fake model reads every context
 *     back through the block tables).
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

Suite *
scheduler_cost_suite(void)
{
    Suite *s = suite_create("scheduler_cost");
    TCase *tc = tcase_create("cost");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prompt_hashed_once_through_recomputes);
    suite_add_tcase(s, tc);
    return s;
}
