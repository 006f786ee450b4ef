/* fake_model.c - the scripted fake model and the test driver loop. */
#include "fake_model.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"

static int
on_event(void *arg, const sched_event_t *ev)
{
    fake_env_t *env = arg;

    ck_assert_uint_lt(ev->id, FAKE_MAX_REQ);
    ck_assert_msg(env->err_status[ev->id] == 0, "event after ERROR for %llu",
                  (unsigned long long)ev->id);
    if (ev->kind == SCHED_EV_ERROR) {
        ck_assert_int_ne(ev->status, 0);
        env->err_status[ev->id] = ev->status;
        env->n_errors++;
        return ST_OK;
    }
    ck_assert_int_lt(ev->choice, FAKE_MAX_CHOICES);
    fake_out_t *o = &env->out[ev->id][ev->choice];
    ck_assert_msg(!o->finished, "event after FINISHED for %llu/%d", (unsigned long long)ev->id,
                  ev->choice);
    if (ev->kind == SCHED_EV_TOKEN) {
        if (env->fail_token_id == ev->id && env->fail_token_choice == ev->choice &&
            env->fail_token_at == o->n_tokens) {
            env->fail_token_id = 0;
            return ST_ENOMEM; /* as if its message could not be allocated */
        }
        ck_assert_int_lt(o->n_tokens, FAKE_MAX_OUT);
        if (o->n_tokens == 0) {
            o->first_token_step = env->step;
        }
        o->tokens[o->n_tokens++] = ev->tok->token;
    } else {
        o->finished = 1;
        o->reason = ev->reason;
        o->stop_token = ev->stop_token;
        o->cached_tokens = ev->cached_tokens;
        o->completion_tokens = ev->completion_tokens;
        o->finish_step = env->step;
        ck_assert_int_eq(ev->completion_tokens, o->n_tokens);
    }
    return ST_OK;
}

fake_cfg_t
fake_cfg_default(void)
{
    fake_cfg_t c;

    memset(&c, 0, sizeof(c));
    c.block_size = 4;
    c.num_blocks = 257;
    c.swap_blocks = 0;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 256;
    c.max_model_len = 128;
    c.prefix_caching = 1;
    c.watermark = 0.0f;
    c.n_tenants = 1;
    c.tenants[0].weight = 1.0;
    return c;
}

void
fake_env_init(fake_env_t *env, const fake_cfg_t *cfg)
{
    bm_config_t bc = {
        .block_size = (uint32_t)cfg->block_size,
        .num_blocks = (uint32_t)cfg->num_blocks,
        .swap_blocks = (uint32_t)cfg->swap_blocks,
        .prefix_caching = cfg->prefix_caching,
        .watermark = cfg->watermark,
    };
    sched_config_t sc;

    memset(env, 0, sizeof(*env));
    for (int i = 0; i < FAKE_MAX_REQ; i++) {
        env->script_at[i] = -1;
        for (int k = 0; k < FAKE_MAX_CHOICES; k++) {
            env->out[i][k].first_token_step = -1;
        }
    }
    env->block_size = cfg->block_size;
    env->num_blocks = cfg->num_blocks;
    env->swap_blocks = cfg->swap_blocks;
    env->dev = xcalloc((size_t)cfg->num_blocks * (size_t)cfg->block_size, sizeof(*env->dev));
    env->cpu = xcalloc((size_t)(cfg->swap_blocks + 1) * (size_t)cfg->block_size, sizeof(*env->cpu));
    ck_assert_int_eq(bm_pool_create(&bc, &env->pool), ST_OK);

    memset(&sc, 0, sizeof(sc));
    sc.max_num_seqs = cfg->max_num_seqs;
    sc.max_num_batched_tokens = cfg->max_num_batched_tokens;
    sc.max_model_len = cfg->max_model_len;
    sc.vocab_size = FAKE_VOCAB;
    sc.prefix_caching = cfg->prefix_caching;
    sc.eos_ids[0] = FAKE_EOS;
    sc.n_eos = 1;
    sc.n_tenants = cfg->n_tenants;
    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        sc.tenants[t] = cfg->tenants[t];
        if (!(sc.tenants[t].weight > 0)) {
            sc.tenants[t].weight = 1.0;
        }
    }
    sc.random_seed = 12345;
    sc.sliding_window = cfg->sliding_window;
    sc.vtc = cfg->vtc;
    sc.kv_policy_ok = 1;
    sc.full_tables = cfg->full_tables;
    sc.check_tables = 1; /* every synced table row against blockmgr's, every step */
    env->sliding_window = cfg->sliding_window;
    ck_assert_int_eq(sched_create(&sc, env->pool, on_event, env, &env->sched), ST_OK);
}

void
fake_env_fini(fake_env_t *env)
{
    bm_stats_t st;

    sched_check(env->sched);
    bm_pool_check(env->pool);
    bm_pool_stats(env->pool, &st);
    ck_assert_msg(st.dev_used == 0 && st.cpu_used == 0, "blocks still in use: %u device, %u cpu",
                  st.dev_used, st.cpu_used);
    sched_destroy(env->sched);
    bm_pool_destroy(env->pool);
    free(env->dev);
    free(env->cpu);
}

void
fake_req_fill(eng_request_t *r, uint64_t id, uint32_t tenant, int32_t n_prompt, uint32_t pseed,
              int32_t max_tokens)
{
    uint32_t x = pseed * 2654435761u + 17;

    memset(r, 0, sizeof(*r));
    r->id = id;
    r->tenant = tenant;
    r->prompt = xmalloc((size_t)n_prompt * sizeof(int32_t));
    for (int32_t i = 0; i < n_prompt; i++) {
        x = x * 1103515245u + 12345u;
        r->prompt[i] = 3 + (int32_t)((x >> 16) % (FAKE_VOCAB - 3));
    }
    r->n_prompt = n_prompt;
    r->sampling.top_p = 1.0f;
    r->sampling.repetition_penalty = 1.0f;
    r->n = 1;
    r->max_tokens = max_tokens;
}

int
fake_submit_req(fake_env_t *env, eng_request_t *r)
{
    int rc = sched_submit(env->sched, r, NULL);
    if (rc != ST_OK) {
        free(r->prompt);
        r->prompt = NULL;
    }
    return rc;
}

int
fake_submit(fake_env_t *env, uint64_t id, uint32_t tenant, int32_t n_prompt, uint32_t pseed,
            int32_t max_tokens)
{
    eng_request_t r;

    fake_req_fill(&r, id, tenant, n_prompt, pseed, max_tokens);
    return fake_submit_req(env, &r);
}

static void
run_ops(fake_env_t *env)
{
    uint32_t n = 0;
    const kv_op_t *ops = bm_pool_ops(env->pool, &n);
    size_t bs = (size_t)env->block_size;

    for (uint32_t i = 0; i < n; i++) {
        if (ops[i].kind == KV_OP_SHIFT) {
            /* Re-rotation: the block's cached positions move earlier. */
            for (size_t j = 0; j < bs; j++) {
                env->dev[(size_t)ops[i].src * bs + j][1] -= ops[i].dst;
            }
            env->n_shifts++;
            continue;
        }
        int32_t(*src)[2] = ops[i].kind == KV_OP_SWAP_IN ? env->cpu : env->dev;
        int32_t(*dst)[2] = ops[i].kind == KV_OP_SWAP_OUT ? env->cpu : env->dev;
        memmove(dst + (size_t)ops[i].dst * bs, src + (size_t)ops[i].src * bs,
                bs * sizeof(*env->dev));
    }
    bm_pool_ops_clear(env->pool);
}

/* The fake forward: write K/V, then hash each logits row's context (the
 * tokens read back through its block table, positions [row_p0, row_ctx)). */
static void
forward(fake_env_t *env, const mdl_batch_t *b, uint64_t *hash, int32_t *row_ctx, int32_t *row_p0)
{
    int32_t bs = env->block_size;
    int32_t li = 0;

    ck_assert_int_gt(b->n_tokens, 0);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t slot = b->slot_mapping[i];
        ck_assert_int_ge(slot, bs); /* never the null block */
        ck_assert_int_lt(slot, env->num_blocks * bs);
        env->dev[slot][0] = b->tokens[i];
        env->dev[slot][1] = b->positions[i];
    }
    for (int32_t r = 0; r < b->n_seqs; r++) {
        int32_t last = b->query_start[r + 1] - 1;
        ck_assert_int_eq(b->positions[last], b->context_len[r] - 1);
        if (li >= b->n_logits || b->logits_rows[li] != last) {
            continue;
        }
        const int32_t *tab = mdl_batch_table(b, r);
        uint64_t h = 1469598103934665603ull;
        int32_t p0 = env->sliding_window > 0 && b->context_len[r] > env->sliding_window
                         ? b->context_len[r] - env->sliding_window
                         : 0;
        for (int32_t p = p0; p < b->context_len[r]; p++) {
            int32_t slot = tab[p / bs] * bs + p % bs;
            ck_assert_msg(env->dev[slot][1] == p, "row %d position %d reads KV of position %d", r,
                          p, env->dev[slot][1]);
            h = (h ^ (uint64_t)env->dev[slot][0]) * 1099511628211ull;
        }
        row_ctx[li] = b->context_len[r];
        row_p0[li] = p0;
        hash[li++] = h;
    }
    ck_assert_int_eq(li, b->n_logits);
}

int32_t
fake_step(fake_env_t *env, sched_plan_t *plan_out)
{
    sched_plan_t plan;
    sched_stats_t before, after;
    sched_tenant_stats_t tb[4], ta;
    uint64_t hash[256];
    int32_t row_ctx[256], row_p0[256];
    smp_result_t res[256];
    float logits[FAKE_VOCAB];

    sched_get_stats(env->sched, &before);
    for (uint32_t u = 0; u < 4; u++) {
        if (sched_get_tenant_stats(env->sched, u, &tb[u]) != ST_OK) {
            memset(&tb[u], 0, sizeof(tb[u]));
        }
    }
    sched_step(env->sched, &plan);
    sched_get_stats(env->sched, &after);
    env->step++;
    /* A tenant's swapped sequences come back before its new admissions
     * (other tenants may admit meanwhile, sched_policy.h). Admission
     * steps preempt nothing, so only admission takes from waiting. */
    for (uint32_t u = 0; u < 4 && plan.n_admitted > 0; u++) {
        if (sched_get_tenant_stats(env->sched, u, &ta) == ST_OK && ta.swapped > 0) {
            ck_assert_uint_eq(ta.waiting, tb[u].waiting);
        }
    }
    if (plan_out != NULL) {
        *plan_out = plan;
    }
    run_ops(env);
    if (plan.batch.n_tokens == 0) {
        ck_assert_int_eq(plan.n_samples, 0);
        return 0;
    }
    ck_assert_int_le(plan.batch.n_seqs, 256);
    if ((uint64_t)plan.batch.n_seqs > env->max_rows_seen) {
        env->max_rows_seen = (uint64_t)plan.batch.n_seqs;
    }
    forward(env, &plan.batch, hash, row_ctx, row_p0);
    for (int32_t i = 0; i < plan.n_samples; i++) {
        sched_sample_view_t v;
        sched_sample_view(env->sched, &plan, i, &v);
        uint64_t h = hash[plan.samples[i].row];
        int32_t ctx = row_ctx[plan.samples[i].row];

        /* The KV the row read is the sequence's own tokens (a wrong share
         * between choices, a stale swap-in or a wrong block table reads
         * someone else's). A rolling window evicted the middle: skip. */
        ck_assert_int_le(ctx, v.n_hist);
        if (ctx == v.n_hist) {
            uint64_t own = 1469598103934665603ull;

            for (int32_t p = row_p0[plan.samples[i].row]; p < ctx; p++) {
                own = (own ^ (uint64_t)v.history[p]) * 1099511628211ull;
            }
            ck_assert_msg(own == h, "req %llu choice %d read KV that is not its own tokens",
                          (unsigned long long)v.id, v.choice);
        }
        int32_t top = 3 + (int32_t)(h % (FAKE_VOCAB - 3));
        int32_t alt = 3 + (int32_t)((h / 7 + 1) % (FAKE_VOCAB - 3));
        if (alt == top) {
            alt = 3 + (top - 3 + 1) % (FAKE_VOCAB - 3);
        }
        for (int32_t k = 0; k < FAKE_VOCAB; k++) {
            logits[k] = 0.0f;
        }
        logits[top] = 10.0f;
        logits[alt] = 5.0f;
        if (v.id < FAKE_MAX_REQ && env->script_at[v.id] == v.n_generated) {
            logits[env->script_tok[v.id]] = 20.0f;
        }
        sched_sample_mask(env->sched, &plan, i, logits);
        int32_t best = 0;
        for (int32_t k = 1; k < FAKE_VOCAB; k++) {
            if (logits[k] > logits[best]) {
                best = k;
            }
        }
        if (env->sample_random) {
            /* A stand-in for a temperature draw: the choice's own stream. */
            best = 3 + (int32_t)((h ^ smp_rng_next(v.rng)) % (FAKE_VOCAB - 3));
        }
        memset(&res[i], 0, sizeof(res[i]));
        res[i].token = best;
        res[i].logprob = isinf(logits[best]) ? -INFINITY : -0.5f;
    }
    sched_commit(env->sched, &plan, res);
    sched_check(env->sched);
    bm_pool_check(env->pool);
    return plan.batch.n_tokens;
}

int64_t
fake_run(fake_env_t *env, int64_t max_steps)
{
    int64_t n = 0;

    while (!sched_idle(env->sched) && n < max_steps) {
        fake_step(env, NULL);
        n++;
    }
    if (!sched_idle(env->sched)) {
        sched_stats_t st;
        bm_stats_t bs;
        sched_get_stats(env->sched, &st);
        bm_pool_stats(env->pool, &bs);
        ck_abort_msg("not idle after %lld steps: running %u waiting %u swapped %u; device "
                     "free %u cached %u used %u of %u; cpu free %u used %u",
                     (long long)n, st.running, st.waiting, st.swapped, bs.dev_free, bs.dev_cached,
                     bs.dev_used, bs.dev_total, bs.cpu_free, bs.cpu_used);
    }
    return n;
}
