/* fake_model.h - a scripted stand-in for the model, for scheduler tests.
 *
 * The fake keeps a "KV cache" of (token, position) pairs per slot in a
 * device tier and a CPU tier, runs blockmgr's copy/swap ops on it, writes
 * each batch token through slot_mapping, and for every logits row reads
 * the sequence's whole context back through its block table. The next
 * token is a hash of that context, so any mistake in slots, tables,
 * copy-on-write or swapping changes the output (and a position mismatch
 * fails the test at once). Token ids 0..2 are never produced unless a
 * test scripts them (2 is the fake EOS).
 *
 * Thread: the test's.
 */
#ifndef TESTS_SCHEDULER_FAKE_MODEL_H
#define TESTS_SCHEDULER_FAKE_MODEL_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"
#include "scheduler/sched.h"

#define FAKE_VOCAB 64
#define FAKE_EOS 2
#define FAKE_MAX_REQ 512
#define FAKE_MAX_CHOICES 4
#define FAKE_MAX_OUT 256

/* What a test saw for one choice of one request. */
typedef struct fake_out {
    int32_t tokens[FAKE_MAX_OUT];
    int32_t n_tokens;
    int finished;
    eng_finish_t reason;
    int32_t stop_token;
    int32_t cached_tokens;
    int32_t completion_tokens;
    int64_t first_token_step; /* -1 until the first token */
    int64_t finish_step;
} fake_out_t;

typedef struct fake_env {
    bm_pool_t *pool;
    sched_t *sched;
    int32_t block_size, num_blocks, swap_blocks;
    int32_t sliding_window; /* rows read only the last w positions */
    int64_t n_shifts;       /* KV_OP_SHIFT ops run */
    int32_t (*dev)[2]; /* [num_blocks * block_size] (token, position) */
    int32_t (*cpu)[2]; /* [swap_blocks * block_size] */
    int sample_random; /* draw from the choice's rng instead of argmax */
    /* script[id]: at generated index script_at, force token script_tok */
    int32_t script_at[FAKE_MAX_REQ];
    int32_t script_tok[FAKE_MAX_REQ];
    fake_out_t out[FAKE_MAX_REQ][FAKE_MAX_CHOICES];
    int n_errors;
    int err_status[FAKE_MAX_REQ]; /* status of the ERROR event per id, 0: none */
    /* The TOKEN event of (fail_token_id, fail_token_choice) at generated
     * index fail_token_at fails (ST_ENOMEM), once; id 0: off. */
    uint64_t fail_token_id;
    int32_t fail_token_choice, fail_token_at;
    int64_t step;
    uint64_t max_rows_seen;
    /* per-step observers */
    uint64_t gen_by_tenant[4];
} fake_env_t;

typedef struct fake_cfg {
    int32_t block_size, num_blocks, swap_blocks;
    int32_t max_num_seqs, max_num_batched_tokens, max_model_len;
    int prefix_caching;
    float watermark;
    int32_t n_tenants;
    eng_tenant_t tenants[4];
    int32_t sliding_window; /* 0: full attention */
    sp_vtc_weights_t vtc;   /* all 0: the scheduler's defaults */
    int full_tables;        /* sched_config_t.full_tables (block tables rebuilt whole) */
} fake_cfg_t;

/* A config with small defaults; tests change fields. */
fake_cfg_t fake_cfg_default(void);
void fake_env_init(fake_env_t *env, const fake_cfg_t *cfg);
/* Checks that every block is FREE or CACHED, then frees everything. */
void fake_env_fini(fake_env_t *env);

/* Submits a request with prompt tokens derived from pseed (length n). */
int fake_submit(fake_env_t *env, uint64_t id, uint32_t tenant, int32_t n_prompt, uint32_t pseed,
                int32_t max_tokens);
int fake_submit_req(fake_env_t *env, eng_request_t *r);
/* Fills a request like fake_submit would (prompt malloc'd). */
void fake_req_fill(eng_request_t *r, uint64_t id, uint32_t tenant, int32_t n_prompt, uint32_t pseed,
                   int32_t max_tokens);

/* One step: plan, ops, fake forward, sample, commit, invariant checks.
 * Returns the plan's batch n_tokens. */
int32_t fake_step(fake_env_t *env, sched_plan_t *plan_out);
/* Steps until idle (or max_steps); returns steps taken. */
int64_t fake_run(fake_env_t *env, int64_t max_steps);

#endif /* TESTS_SCHEDULER_FAKE_MODEL_H */
