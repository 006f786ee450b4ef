/* test_sched_policy.c - the scheduler policy of issue 15
 * (scheduler/sched_policy.h) with the scripted fake model: un-planning a
 * planned victim (on constructed batches, and a step where a
 * high-priority prefill runs short of blocks beside a planned
 * low-priority decode), swap-in within the tenant's KV share and the
 * watermark while other tenants admit, admission stopping at the
 * watermark, and the VTC's separate weights for computed prompt, cached
 * prompt and generated tokens. Every test ends with every block FREE or
 * CACHED (fake_env_fini), and outputs are compared with runs alone. */
#include <check.h>
#include <string.h>

#include "common/status.h"
#include "fake_model.h"
#include "scheduler/sched_policy.h"

static fake_env_t env;

static void
out_eq(const fake_out_t *a, const fake_out_t *b)
{
    ck_assert(a->finished && b->finished);
    ck_assert_int_eq(a->n_tokens, b->n_tokens);
    ck_assert_int_eq(a->reason, b->reason);
    ck_assert_int_eq(memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)), 0);
}

/* ---- sp_unplan_row on a constructed batch ----------------------------- */

/* Four rows: A a decode (1 token, 1 logits row, 1 sample), B a
 * speculating decode (3 tokens, 3 logits rows, 1 sample with 2 drafts),
 * C a prefill chunk (4 tokens, no logits), D the last chunk of an n = 2
 * prompt (2 tokens, 1 logits row, 2 samples). */
struct batch {
    int32_t tokens[16], positions[16], slots[16];
    int32_t qs[5], ctx[4], rnew[4], rdraft[4];
    struct sched_seq *rseq[4];
    int32_t lrows[8];
    sched_sample_t samples[8];
    int32_t n_tok, n_rows, n_logits, n_samples, n_res, budget;
    sp_rows_t v;
};

static void
batch_build(struct batch *b)
{
    static const int32_t rlen[4] = {1, 3, 4, 2};
    int32_t t = 0;

    memset(b, 0, sizeof(*b));
    for (int32_t r = 0; r < 4; r++) {
        b->qs[r] = t;
        b->rnew[r] = rlen[r];
        b->ctx[r] = 100 * (r + 1) + rlen[r];
        b->rseq[r] = (struct sched_seq *)(uintptr_t)(0x1000 * (r + 1));
        for (int32_t j = 0; j < rlen[r]; j++, t++) {
            b->tokens[t] = 10 * (r + 1) + j; /* row r's tokens are 10(r+1) + j */
            b->positions[t] = 100 * (r + 1) + j;
            b->slots[t] = 1000 * (r + 1) + j;
        }
    }
    b->rdraft[1] = 2;
    b->n_tok = t;
    b->n_rows = 4;
    /* Logits rows: A's token 0; B's tokens 1..3; D's last token 9. */
    b->lrows[0] = 0;
    b->lrows[1] = 1;
    b->lrows[2] = 2;
    b->lrows[3] = 3;
    b->lrows[4] = 9;
    b->n_logits = 5;
    b->samples[0] = (sched_sample_t){.row = 0, .res = 0};
    b->samples[1] = (sched_sample_t){.row = 1, .res = 1, .n_draft = 2};
    b->samples[2] = (sched_sample_t){.row = 4, .res = 4};
    b->samples[3] = (sched_sample_t){.row = 4, .res = 5};
    b->n_samples = 4;
    b->n_res = 6;
    b->budget = 100 - t;
    b->v = (sp_rows_t){.tokens = b->tokens,
                       .positions = b->positions,
                       .slots = b->slots,
                       .query_start = b->qs,
                       .context_len = b->ctx,
                       .rows_new = b->rnew,
                       .rows_draft = b->rdraft,
                       .rows_seq = b->rseq,
                       .logits_rows = b->lrows,
                       .samples = b->samples,
                       .n_tok = &b->n_tok,
                       .n_rows = &b->n_rows,
                       .n_logits = &b->n_logits,
                       .n_samples = &b->n_samples,
                       .n_res = &b->n_res,
                       .budget_tokens = &b->budget};
}

/* Every row left has its own tokens, positions and slots from its
 * query_start, and its own sequence pointer and counts. */
static void
batch_rows_intact(const struct batch *b, const int32_t *orig_rows, int32_t n)
{
    ck_assert_int_eq(b->n_rows, n);
    for (int32_t r = 0; r < n; r++) {
        int32_t o = orig_rows[r];
        ck_assert_ptr_eq(b->rseq[r], (struct sched_seq *)(uintptr_t)(0x1000 * (o + 1)));
        ck_assert_int_eq(b->ctx[r] % 100, b->rnew[r]);
        ck_assert_int_eq(b->ctx[r] / 100, o + 1);
        for (int32_t j = 0; j < b->rnew[r]; j++) {
            ck_assert_int_eq(b->tokens[b->qs[r] + j], 10 * (o + 1) + j);
            ck_assert_int_eq(b->positions[b->qs[r] + j], 100 * (o + 1) + j);
            ck_assert_int_eq(b->slots[b->qs[r] + j], 1000 * (o + 1) + j);
        }
        if (r + 1 < n) {
            ck_assert_int_eq(b->qs[r + 1], b->qs[r] + b->rnew[r]);
        } else {
            ck_assert_int_eq(b->n_tok, b->qs[r] + b->rnew[r]);
        }
    }
}

START_TEST(test_unplan_row_constructed)
{
    struct batch b;

    /* Out goes B, the speculating row: its 3 tokens, 3 logits rows and
     * its sample with 3 results; D's logits row and samples move down. */
    batch_build(&b);
    sp_unplan_row(&b.v, 1);
    batch_rows_intact(&b, (const int32_t[]){0, 2, 3}, 3);
    ck_assert_int_eq(b.budget, 100 - 10 + 3);
    ck_assert_int_eq(b.rdraft[0], 0);
    ck_assert_int_eq(b.rdraft[1], 0);
    ck_assert_int_eq(b.n_logits, 2);
    ck_assert_int_eq(b.lrows[0], 0);
    ck_assert_int_eq(b.lrows[1], 6); /* D's last token, 3 earlier */
    ck_assert_int_eq(b.tokens[b.lrows[1]], 41);
    ck_assert_int_eq(b.n_samples, 3);
    ck_assert_int_eq(b.n_res, 3);
    ck_assert_int_eq(b.samples[0].row, 0);
    ck_assert_int_eq(b.samples[0].res, 0);
    ck_assert_int_eq(b.samples[1].row, 1);
    ck_assert_int_eq(b.samples[1].res, 1);
    ck_assert_int_eq(b.samples[2].row, 1);
    ck_assert_int_eq(b.samples[2].res, 2);

    /* Out goes C, a chunk without logits: only tokens and rows move. */
    batch_build(&b);
    sp_unplan_row(&b.v, 2);
    batch_rows_intact(&b, (const int32_t[]){0, 1, 3}, 3);
    ck_assert_int_eq(b.rdraft[1], 2);
    ck_assert_int_eq(b.n_logits, 5);
    ck_assert_int_eq(b.lrows[4], 5);
    ck_assert_int_eq(b.tokens[b.lrows[4]], 41);
    ck_assert_int_eq(b.n_samples, 4);
    ck_assert_int_eq(b.n_res, 6);
    ck_assert_int_eq(b.samples[3].row, 4);

    /* Out go D (last row, two samples of one logits row), then A (first). */
    batch_build(&b);
    sp_unplan_row(&b.v, 3);
    batch_rows_intact(&b, (const int32_t[]){0, 1, 2}, 3);
    ck_assert_int_eq(b.n_logits, 4);
    ck_assert_int_eq(b.n_samples, 2);
    ck_assert_int_eq(b.n_res, 4);
    sp_unplan_row(&b.v, 0);
    batch_rows_intact(&b, (const int32_t[]){1, 2}, 2);
    ck_assert_int_eq(b.n_logits, 3);
    ck_assert_int_eq(b.lrows[0], 0);
    ck_assert_int_eq(b.lrows[2], 2);
    ck_assert_int_eq(b.n_samples, 1);
    ck_assert_int_eq(b.samples[0].row, 0);
    ck_assert_int_eq(b.samples[0].res, 0);
    ck_assert_int_eq(b.samples[0].n_draft, 2);
    ck_assert_int_eq(b.n_res, 3);
    ck_assert_int_eq(b.budget, 100 - 10 + 3);
}
END_TEST

/* ---- un-planning a victim in a real step ------------------------------- */

/* A low-priority decode L (prompt 4) runs; a high-priority 40-token
 * prompt H arrives and is prefilled in chunks of 8 (9-token budget, one
 * for L's decode) in 12 blocks of 4. At step 6 L's decode takes its
 * third block in pass 0 and H's last chunk finds one block where it needs
 * two: L, the least protected, is un-planned and preempted; H is not. */
static void
run_unplan(int swap, fake_out_t out[3], sched_stats_t *st, int64_t *preempt_step,
           int32_t *preempt_rows)
{
    fake_cfg_t c = fake_cfg_default();
    eng_request_t r;
    sched_plan_t plan;

    c.num_blocks = 13;
    c.swap_blocks = swap ? 64 : 0;
    c.max_num_batched_tokens = 9;
    fake_env_init(&env, &c);
    fake_req_fill(&r, 1, 0, 4, 1, 30);
    r.priority = 10;
    ck_assert_int_eq(fake_submit_req(&env, &r), ST_OK);
    fake_step(&env, NULL);
    fake_req_fill(&r, 2, 0, 40, 2, 4);
    r.priority = 0;
    ck_assert_int_eq(fake_submit_req(&env, &r), ST_OK);
    *preempt_step = -1;
    while (!sched_idle(env.sched) && env.step < 500) {
        fake_step(&env, &plan);
        if (*preempt_step < 0 && plan.n_preempt_swap + plan.n_preempt_recompute > 0) {
            *preempt_step = env.step;
            *preempt_rows = plan.batch.n_seqs;
        }
    }
    sched_get_stats(env.sched, st);
    out[1] = env.out[1][0];
    out[2] = env.out[2][0];
    fake_env_fini(&env);
}

static void
run_alone(uint64_t id, int32_t n_prompt, int32_t max_tokens, fake_out_t *out)
{
    fake_cfg_t c = fake_cfg_default();

    fake_env_init(&env, &c);
    ck_assert_int_eq(fake_submit(&env, id, 0, n_prompt, (uint32_t)id, max_tokens), ST_OK);
    fake_run(&env, 500);
    *out = env.out[id][0];
    fake_env_fini(&env);
}

START_TEST(test_unplan_decode_for_priority_prefill)
{
    fake_out_t out[3], alone_l, alone_h;
    sched_stats_t st;
    int64_t at = -1;
    int32_t rows = -1;

    run_alone(1, 4, 30, &alone_l);
    run_alone(2, 40, 4, &alone_h);
    run_unplan(_i, out, &st, &at, &rows);
    /* One preemption, at step 6, of L: the plan holds H's row alone (no
     * stale row of L), and H's prompt completes in that very step. */
    ck_assert_uint_eq(st.preempt_swap + st.preempt_recompute, 1);
    ck_assert_uint_eq(_i ? st.preempt_swap : st.preempt_recompute, 1);
    ck_assert_int_eq(at, 6);
    ck_assert_int_eq(rows, 1);
    ck_assert_int_eq(out[2].first_token_step, 6);
    ck_assert_int_gt(out[1].finish_step, out[2].finish_step);
    /* Both outputs as alone: the fake model reads every context back
     * through the block tables, so a reservation taken back wrongly (a
     * block kept, freed twice or left registered) shows here. */
    out_eq(&out[1], &alone_l);
    out_eq(&out[2], &alone_h);
}
END_TEST

/* ---- swap-in within the tenant's KV share ------------------------------ */

START_TEST(test_swap_in_respects_tenant_kv_share)
{
    fake_cfg_t c = fake_cfg_default();
    sched_tenant_stats_t a, b;
    int64_t swapped_from = -1, b_first = -1;
    uint32_t peak_in = 0;

    /* 24 usable blocks; tenant 0 may hold 12. Tenant 0 runs two 8-token
     * prompts growing to 48 tokens (12 blocks each); tenant 1 one growing
     * to 64 (16 blocks): around step 17 the pool is full and tenant 0's
     * later sequence (tenant 0 is the most served) is swapped out with 7
     * blocks. When tenant 1's request ends, its freed blocks would take
     * it back in beside tenant 0's running one (10 blocks by then), past
     * tenant 0's share. */
    c.n_tenants = 2;
    c.num_blocks = 25;
    c.swap_blocks = 64;
    c.tenants[0].weight = 1.0;
    c.tenants[0].max_kv_share = 0.5;
    c.tenants[1].weight = 1.0;
    fake_env_init(&env, &c);
    ck_assert_int_eq(fake_submit(&env, 1, 0, 8, 1, 40), ST_OK);
    ck_assert_int_eq(fake_submit(&env, 2, 0, 8, 2, 40), ST_OK);
    ck_assert_int_eq(fake_submit(&env, 3, 1, 32, 3, 32), ST_OK);
    while (!sched_idle(env.sched) && env.step < 1000) {
        sched_get_tenant_stats(env.sched, 0, &a);
        uint32_t before = a.swapped;
        uint32_t blocks_before = bm_tenant_blocks(env.pool, 0);
        fake_step(&env, NULL);
        sched_get_tenant_stats(env.sched, 0, &a);
        sched_get_tenant_stats(env.sched, 1, &b);
        if (swapped_from < 0 && a.swapped > 0) {
            swapped_from = env.step;
            /* Tenant 1 comes back with a new request while tenant 0's
             * sequence is still swapped. */
            ck_assert_int_eq(fake_submit(&env, 4, 1, 8, 4, 4), ST_OK);
        }
        if (a.swapped < before) {
            /* A swap-in: tenant 0 stays within its 12 blocks (what it held
             * before plus what came back, before this step's growth). */
            uint32_t in = bm_tenant_blocks(env.pool, 0) - blocks_before;
            peak_in = blocks_before + in > peak_in ? blocks_before + in : peak_in;
        }
        if (b_first < 0 && env.out[4][0].first_token_step >= 0) {
            b_first = env.out[4][0].first_token_step;
            /* Tenant 1 admitted while tenant 0 still had a swapped one. */
            ck_assert_uint_eq(a.swapped, 1);
        }
    }
    ck_assert_int_gt(swapped_from, 0);
    ck_assert_int_gt(b_first, 0);
    ck_assert_msg(peak_in <= 12 + 2, "tenant 0 held %u blocks after a swap-in", peak_in);
    for (uint64_t id = 1; id <= 2; id++) {
        ck_assert_int_eq(env.out[id][0].n_tokens, 40);
    }
    ck_assert_int_eq(env.out[3][0].n_tokens, 32);
    ck_assert_int_eq(env.out[4][0].n_tokens, 4);
    fake_env_fini(&env);
}
END_TEST

/* ---- the watermark ------------------------------------------------------ */

/* 40 usable blocks; 16 requests of 12 tokens (3 blocks at admission, a
 * 4th for the first generated token). Returns the preemptions of the
 * whole run; *admitted: sequences running after the first step. */
static uint64_t
burst(float watermark, uint32_t *admitted, uint32_t *free_after)
{
    fake_cfg_t c = fake_cfg_default();
    sched_stats_t st;

    c.num_blocks = 41;
    c.watermark = watermark;
    fake_env_init(&env, &c);
    for (uint64_t id = 1; id <= 16; id++) {
        ck_assert_int_eq(fake_submit(&env, id, 0, 12, (uint32_t)id, 8), ST_OK);
    }
    fake_step(&env, NULL);
    sched_get_stats(env.sched, &st);
    *admitted = st.running;
    *free_after = bm_pool_free_blocks(env.pool);
    fake_run(&env, 1000);
    for (uint64_t id = 1; id <= 16; id++) {
        ck_assert_int_eq(env.out[id][0].n_tokens, 8);
    }
    sched_get_stats(env.sched, &st);
    fake_env_fini(&env);
    return st.preempt_swap + st.preempt_recompute;
}

START_TEST(test_admission_stops_at_watermark)
{
    uint32_t adm0, adm25, free0, free25;
    uint64_t pre0 = burst(0.0f, &adm0, &free0);
    uint64_t pre25 = burst(0.25f, &adm25, &free25);

    /* Without a watermark the burst takes 13 x 3 of the 40 blocks, and
     * the next step's 13 first tokens preempt; with 0.25 (10 blocks)
     * admission stops at 10 with 10 blocks free, enough for their growth. */
    ck_assert_uint_eq(adm0, 13);
    ck_assert_uint_eq(free0, 1);
    ck_assert_uint_eq(adm25, 10);
    ck_assert_uint_eq(free25, 10);
    ck_assert_msg(pre0 > 0 && pre25 < pre0, "preemptions: %llu without, %llu with the watermark",
                  (unsigned long long)pre0, (unsigned long long)pre25);
}
END_TEST

START_TEST(test_swap_in_keeps_watermark)
{
    sp_swap_in_req_t g = {.slots = 1,
                          .run_slots = 3,
                          .max_slots = 8,
                          .tenant_slots = 1,
                          .need = 5,
                          .free_blocks = 8,
                          .watermark = 4,
                          .others_running = 1};

    /* 5 + watermark 4 > 8 free: wait. */
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_STOP);
    g.free_blocks = 9;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_OK);
    /* No watermark: still one block for the running ones' next token. */
    g.watermark = 0;
    g.free_blocks = 5;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_STOP);
    g.free_blocks = 6;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_OK);
    /* Alone on the device: no headroom. */
    g.others_running = 0;
    g.watermark = 4;
    g.free_blocks = 5;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_OK);
    /* Tenant limits skip (others may go), the step's slots stop. */
    g.others_running = 1;
    g.free_blocks = 100;
    g.tenant_max = 1;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_SKIP);
    g.tenant_max = 2;
    g.tenant_kv = 10;
    g.tenant_running = 1;
    g.tenant_blocks = 6;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_SKIP);
    g.tenant_running = 0; /* nothing of its own runs: it comes back */
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_OK);
    g.run_slots = 8;
    ck_assert_int_eq(sp_swap_in_gate(&g), SP_SWAP_IN_STOP);
}
END_TEST

/* ---- VTC weights ---------------------------------------------------------- */

/* Two tenants of weight 1 flooded with 32-token prompts and 4 output
 * tokens: tenant 0 repeats one prompt (28 of its tokens come from the
 * prefix cache), tenant 1 sends unique ones. Returns the requests tenant
 * 0 finished over tenant 1's, counted while both still queue work. */
static double
vtc_split(sp_vtc_weights_t w)
{
    fake_cfg_t c = fake_cfg_default();
    sched_tenant_stats_t a0, b0, a1, b1;
    uint64_t id = 1;

    c.n_tenants = 2;
    c.tenants[0].weight = 1.0;
    c.tenants[1].weight = 1.0;
    c.max_num_seqs = 4;
    c.vtc = w;
    fake_env_init(&env, &c);
    for (int i = 0; i < 120; i++) {
        ck_assert_int_eq(fake_submit(&env, id++, 0, 32, 7, 4), ST_OK);
        ck_assert_int_eq(fake_submit(&env, id++, 1, 32, (uint32_t)i + 1000, 4), ST_OK);
    }
    for (int s = 0; s < 10; s++) {
        fake_step(&env, NULL);
    }
    sched_get_tenant_stats(env.sched, 0, &a0);
    sched_get_tenant_stats(env.sched, 1, &b0);
    do {
        fake_step(&env, NULL);
        sched_get_tenant_stats(env.sched, 0, &a1);
        sched_get_tenant_stats(env.sched, 1, &b1);
    } while (a1.waiting > 0 && b1.waiting > 0);
    double fa = (double)(a1.requests_finished - a0.requests_finished);
    double fb = (double)(b1.requests_finished - b0.requests_finished);
    ck_assert_msg(fa > 20 && fb > 20, "finished %.0f / %.0f", fa, fb);
    for (uint64_t i = 1; i < id; i++) {
        sched_cancel(env.sched, i, -1, 0);
    }
    fake_env_fini(&env);
    return fa / fb;
}

START_TEST(test_vtc_cached_and_output_weights)
{
    /* Cached tokens charged like computed ones: an equal split. */
    double same = vtc_split((sp_vtc_weights_t){.input = 1, .cached = 1, .output = 2});
    /* Cached at 0.25: tenant 0 pays 4 + 28 x 0.25 + 4 x 2 = 19 per request,
     * tenant 1 32 + 8 = 40, so tenant 0 finishes about 40 / 19 = 2.1 times
     * as many. */
    double cheap = vtc_split((sp_vtc_weights_t){.input = 1, .cached = 0.25, .output = 2});
    /* Output at 20: both pay mostly for output (80), tenant 0 11 + 80,
     * tenant 1 32 + 80: 112 / 91 = 1.23. */
    double out = vtc_split((sp_vtc_weights_t){.input = 1, .cached = 0.25, .output = 20});
    /* The defaults are (1, 0.25, 2). */
    double def = vtc_split((sp_vtc_weights_t){0});

    ck_assert_msg(same > 0.85 && same < 1.15, "split with cached = input: %.3f", same);
    ck_assert_msg(cheap > 1.8 && cheap < 2.4, "split with cached = 0.25: %.3f", cheap);
    ck_assert_msg(out > 1.1 && out < 1.4, "split with output = 20: %.3f", out);
    ck_assert_msg(def == cheap, "defaults %.3f, (1, 0.25, 2) %.3f", def, cheap);
}
END_TEST

START_TEST(test_vtc_weights_resolve)
{
    sp_vtc_weights_t w;

    ck_assert_int_eq(sp_vtc_resolve(&(sp_vtc_weights_t){0}, &w), ST_OK);
    ck_assert(w.input == SP_VTC_INPUT_DEFAULT && w.cached == SP_VTC_CACHED_DEFAULT &&
              w.output == SP_VTC_OUTPUT_DEFAULT);
    ck_assert_int_eq(sp_vtc_resolve(&(sp_vtc_weights_t){.input = 1}, &w), ST_OK);
    ck_assert(w.input == 1 && w.cached == 0 && w.output == 0);
    ck_assert_int_eq(sp_vtc_resolve(&(sp_vtc_weights_t){.cached = 1}, &w), ST_EINVAL);
    ck_assert_int_eq(sp_vtc_resolve(&(sp_vtc_weights_t){.input = -1, .output = 1}, &w),
                     ST_EINVAL);
    ck_assert_int_eq(sp_vtc_resolve(&(sp_vtc_weights_t){.input = 1, .output = 1e7}, &w),
                     ST_EINVAL);
    ck_assert(sp_vtc_prompt_charge(&(sp_vtc_weights_t){.input = 1, .cached = 0.25}, 32, 28) ==
              4 + 7);
}
END_TEST

Suite *
scheduler_policy_suite(void)
{
    Suite *s = suite_create("scheduler_policy");
    TCase *tc;

    tc = tcase_create("unplan");
    tcase_add_test(tc, test_unplan_row_constructed);
    tcase_add_loop_test(tc, test_unplan_decode_for_priority_prefill, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("swap_in_watermark");
    tcase_add_test(tc, test_swap_in_respects_tenant_kv_share);
    tcase_add_test(tc, test_admission_stops_at_watermark);
    tcase_add_test(tc, test_swap_in_keeps_watermark);
    suite_add_tcase(s, tc);

    tc = tcase_create("vtc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_vtc_cached_and_output_weights);
    tcase_add_test(tc, test_vtc_weights_resolve);
    suite_add_tcase(s, tc);
    return s;
}
