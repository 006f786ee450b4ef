/* engine.h - the engine thread: creation, start, stop and its inbox.
 *
 * The loop thread (server/) talks to the engine only through two channels
 * (common/chan.h): the engine's inbox and an outbox the caller provides.
 * The messages, and what the engine promises to send for each request,
 * are the thread protocol in scheduler/proto.h. The engine owns the
 * scheduler (scheduler/sched.h), the block manager, the model runtime and
 * the sampler, and runs them on its own thread.
 *
 * Thread: engine_* on the thread that created the engine, messages from
 * any thread.
 */
#ifndef SCHEDULER_ENGINE_H
#define SCHEDULER_ENGINE_H

#include <stdint.h>

#include "common/chan.h"
#include "model/model.h"
#include "scheduler/proto.h"
#include "scheduler/sched_policy.h"
#include "scheduler/spec.h"

typedef struct eng_config {
    mdl_runtime_config_t rt; /* device, blocks, budgets */
    int32_t max_num_seqs;
    int32_t max_num_batched_tokens;
    int32_t max_model_len; /* <= the model's context */
    int prefix_caching;
    float watermark;
    int32_t kv_sink, kv_window; /* default KV policy of requests (window 0: full) */
    mdl_kv_policy_t kv_score;   /* default H2O / SnapKV policy (kind FULL: none) */
    int32_t n_tenants; /* >= 1; tenant 0 is the default */
    eng_tenant_t tenants[ENG_MAX_TENANTS];
    int log_every_steps; /* INFO summary period; 0 off */
    /* --kv-events-config JSON (scheduler/kv_events.h); NULL or "": off. */
    const char *kv_events_config;
    /* The web console's KV map (kv_map.h) may show cached blocks' token
     * ids: the pool keeps them (bm_pool_keep_tokens). 0: off. */
    int kv_map_tokens;
    /* Test hook: the n-th forward pass fails as if the device had, which
     * ends the engine (engine_alive() turns 0). 0: off. */
    int32_t test_fail_forward_at;
    /* Test hook: each step with tokens sleeps this many ms after its
     * forward pass, so that a browser test's 300 ms polls see a short
     * generation on the tiny default model. 0: off. */
    int32_t test_step_delay_ms;
    /* Speculative decoding (--speculative-config, scheduler/spec.h). */
    spec_config_t spec;
    /* VTC charges (--vtc-*-weight, scheduler/sched_policy.h); all 0: defaults. */
    sp_vtc_weights_t vtc;
} eng_config_t;

typedef struct engine engine_t;

/* Creates the runtime (KV pool) and the scheduler; does not start the
 * thread. outbox receives every reply. Errors: negative ST_* with a reason
 * in err. */
int engine_create(const eng_config_t *cfg, const mdl_model_t *model, chan_t *outbox, engine_t **out,
                  char *err, size_t errlen);
int engine_start(engine_t *e);
/* The inbox: chan_send() SUBMIT / CANCEL / SHUTDOWN / STATS here. */
chan_t *engine_inbox(engine_t *e);
/* Sends SHUTDOWN (every open request gets ERROR ST_ESHUTDOWN) and joins. */
void engine_stop(engine_t *e);
void engine_destroy(engine_t *e);
/* 1 while the engine thread runs and has not failed. Any thread. */
int engine_alive(const engine_t *e);

#endif /* SCHEDULER_ENGINE_H */
