/* sched.h - the scheduler: request state, queues, tenant fair share, step
 * planning, preemption and stop checks, without tensors.
 *
 * The scheduler is the policy half of the engine (vLLM's Scheduler):
 * sched_step() plans one iteration as a flattened varlen batch
 * (DESIGN.md section 3) and lists which logits rows to sample for which
 * sequence; the caller runs the queued block ops and the forward pass,
 * samples, and hands the sampled tokens to sched_commit(), which appends
 * them, checks stop conditions and reports tokens and finishes through the
 * emit callback. Nothing here touches tensors, so tests drive it with a
 * scripted fake model.
 *
 * DESIGN
 *   Every choice of a request is a sequence (sched_seq_t) with its own
 *   token buffer (prompt + generated, allocated at submit) and its own
 *   blockmgr sequence id. A request with n > 1 enters as one sequence
 *   (choice 0) that computes the prompt; when its last prompt token is
 *   planned, its logits row is sampled once per choice, and at commit the
 *   other choices are forked from it (bm_seq_fork: shared blocks, the
 *   first write into the shared tail copies it).
 *
 *   Queues: per-tenant waiting lists sorted by (priority, arrival); one
 *   running list in admission order; one swapped list sorted by
 *   (priority, arrival).
 *
 *   A step: (1) running decodes, (2) running partial prefills, both in
 *   protection order (the reverse of the victim order below, so the
 *   sequences still unplanned when blocks run out are the right victims),
 *   each reserving its blocks and preempting when
 *   blockmgr says ST_EAGAIN; (3) swapped sequences come back when nothing
 *   was preempted this step, within their tenant's max_running and KV
 *   share and keeping the watermark free (sched_policy.h); (4) unless
 *   swap-in stopped for want of blocks or slots, new or recomputed
 *   sequences are admitted by tenant fair share, from tenants with no
 *   swapped sequence. Budgets:
 *   max_num_batched_tokens tokens and max_num_seqs sequences.
 *
 *   Fair share (Virtual Token Counter, Sheng et al. OSDI 2024): each tenant
 *   has a counter of served tokens divided by its weight: the whole prompt
 *   is charged at first admission, each generated token when it is
 *   sampled, with separate weights for computed prompt tokens, prompt
 *   tokens served by the prefix cache and generated tokens
 *   (sched_policy.h). Admission takes the tenant with the least counter that has an
 *   admissible sequence, then priority, then arrival. A tenant that becomes
 *   active (first live request) has its counter lifted to the minimum of
 *   the active tenants, so idle time earns no credit.
 *
 *   Quotas per tenant: running sequences (max_running), queued requests
 *   (max_waiting: beyond it SUBMIT fails with ST_EQUEUE), device KV blocks
 *   at admission (max_kv_share), and tokens per minute: a bucket of
 *   tokens_per_minute tokens refilled continuously, debited with the
 *   prompt at first admission and each generated token; a new request is
 *   admitted only when its prompt fits the bucket (running ones go on).
 *
 *   Preemption victim: among running sequences, the tenant with the
 *   largest counter, then within it the lowest priority (largest value),
 *   then the most recently admitted. A victim already planned in this
 *   step (a decode, when a more protected prefill runs short) is taken
 *   out of the batch first: its row goes, its token budget comes back
 *   and blockmgr takes its reservation back (bm_seq_unreserve). The
 *   victim is swapped out when the CPU tier has room, otherwise its
 *   blocks are freed and its prompt plus generated tokens become a new
 *   prefill (hitting the prefix cache where possible).
 *
 * Thread: engine thread only (or a test's thread).
 */
#ifndef SCHEDULER_SCHED_H
#define SCHEDULER_SCHED_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "scheduler/proto.h"
#include "scheduler/sched_policy.h"
#include "scheduler/spec.h"

typedef struct sched sched_t;
typedef struct sched_seq sched_seq_t; /* opaque */

typedef enum sched_ev_kind {
    SCHED_EV_TOKEN = 1, /* one sampled token of a choice */
    SCHED_EV_FINISHED,  /* a choice finished */
    SCHED_EV_ERROR,     /* the whole request failed; nothing follows */
} sched_ev_kind_t;

typedef struct sched_event {
    sched_ev_kind_t kind;
    uint64_t id;
    int32_t choice;
    const smp_result_t *tok;   /* TOKEN: borrowed for the call */
    eng_finish_t reason;       /* FINISHED */
    int32_t stop_token;        /* FINISHED with STOP on a token: its id, else -1 */
    int32_t prompt_tokens;     /* FINISHED */
    int32_t completion_tokens; /* FINISHED */
    int32_t cached_tokens;     /* FINISHED */
    int status;                /* ERROR */
    uint64_t t_arrival_ns;     /* as submitted */
    void *udata;               /* as given to sched_submit */
} sched_event_t;

/* Called synchronously from sched_* functions for every event. Returns
 * ST_OK, or for a TOKEN event ST_ENOMEM when it could not report the token
 * (its message could not be allocated): the scheduler then ends that
 * request alone with an ERROR event carrying ST_ENOMEM (no further events
 * for it, its blocks freed) at the end of the same sched_commit. FINISHED
 * and ERROR events must not fail (their return is ignored): the caller
 * preallocates what they need per request (udata). */
typedef int (*sched_emit_cb)(void *arg, const sched_event_t *ev);

typedef struct sched_config {
    int32_t max_num_seqs;           /* >= 1 */
    int32_t max_num_batched_tokens; /* >= 1 */
    int32_t max_model_len;          /* >= 2: context length */
    int32_t vocab_size;             /* token ids must be < this */
    int prefix_caching;
    int32_t eos_ids[MDL_MAX_EOS];
    int32_t n_eos;
    int32_t n_tenants; /* 1..ENG_MAX_TENANTS */
    eng_tenant_t tenants[ENG_MAX_TENANTS];
    uint64_t random_seed; /* seeds unseeded requests' streams; 0: from the clock */
    /* The model's sliding_window (0: none): after each step, blocks no later
     * query can attend to are given back (bm_seq_release_front), so a
     * sequence holds about window / block_size + 2 blocks (issue 8). */
    int32_t sliding_window;
    /* Default attention-sink policy (eng_request_t.kv_sink / kv_window). */
    int32_t kv_sink, kv_window;
    int kv_policy_ok; /* the backend re-rotates KV (cpu, any tensor-parallel size) */
    /* H2O / SnapKV (scheduler/kv_evict.h): the default policy of requests
     * (kind FULL: none), and the runtime's accumulated attention mass,
     * plain numbers read after a step (mdl_runtime_kv_mass through the
     * engine; NULL: the runtime keeps none and such requests fail with
     * ST_EUNSUPPORTED), kv_mass_heads floats per token. */
    mdl_kv_policy_t kv_score;
    int (*kv_mass)(void *arg, const int32_t *slots, int32_t n, float *out);
    void *kv_mass_arg;
    int32_t kv_mass_heads;
    /* Frees a request's udata when the scheduler frees the request (after
     * its last event, or in sched_destroy); NULL: udata is not owned. */
    void (*udata_free)(void *udata);
    /* Speculative decoding (scheduler/spec.h); method SPEC_OFF: none. */
    spec_config_t spec;
    /* VTC charge per token kind (scheduler/sched_policy.h); all 0: the
     * defaults (input 1, cached 0.25, output 2). */
    sp_vtc_weights_t vtc;
    /* Block tables (scheduler/sched_tabs.h): 0, persistent rows sent as
     * their changes (batch.table_rows); 1, rebuilt whole for every row
     * each step (the layout before issue 15). check_tables (test hook):
     * compare every synced row with blockmgr's table each step. */
    int full_tables;
    int check_tables;
} sched_config_t;

/* One logits row to sample for one sequence (choice); a speculating
 * sequence (n_draft > 0) has rows row .. row + n_draft, verified with
 * spec_verify_sample() into results[res .. res + n_draft]. */
typedef struct sched_sample {
    int32_t row; /* index into the step's logits rows */
    sched_seq_t *seq;
    int32_t res;          /* index of its first result in sched_commit's results */
    int32_t n_draft;      /* draft tokens verified by rows row + 1 .. row + n_draft */
    const int32_t *draft; /* [n_draft], borrowed like the plan */
} sched_sample_t;

/* One planned step. Every pointer is borrowed from the scheduler and valid
 * until the next sched_* call that changes state. */
typedef struct sched_plan {
    mdl_batch_t batch;
    int32_t n_samples;
    const sched_sample_t *samples;
    uint32_t n_preempt_swap;      /* this step */
    uint32_t n_preempt_recompute; /* this step */
    uint32_t n_swap_in;           /* this step */
    uint32_t n_admitted;          /* this step */
    int32_t n_results; /* results sched_commit reads at most: sum of 1 + n_draft */
} sched_plan_t;

/* What a sampler needs for one sample of a plan. */
typedef struct sched_sample_view {
    uint64_t id;
    int32_t choice;
    const smp_params_t *params; /* borrowed */
    smp_rng_t *rng;             /* the choice's own stream, advanced by sampling */
    const int32_t *history;     /* prompt + generated so far */
    int32_t n_hist;
    int32_t n_prompt;
    int32_t n_generated;
} sched_sample_view_t;

typedef struct sched_tenant_stats {
    uint32_t running; /* sequences */
    uint32_t waiting; /* sequences */
    uint32_t swapped; /* sequences */
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t requests_finished;
    uint64_t requests_rejected;
    double vtc;
    double tpm_budget; /* tokens left in the per-minute budget (may be < 0) */
} sched_tenant_stats_t;

typedef struct sched_stats {
    uint32_t running, waiting, swapped; /* sequences */
    uint32_t requests;                  /* live requests */
    uint64_t preempt_swap, preempt_recompute;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t steps;
} sched_stats_t;

/* Creates a scheduler over pool (borrowed; it must outlive the scheduler
 * and is only mutated through this scheduler while it lives). Allocates
 * every per-step array here. ST_EINVAL on a bad config. */
int sched_create(const sched_config_t *cfg, bm_pool_t *pool, sched_emit_cb emit, void *emit_arg,
                 sched_t **out);
/* Frees every request without events and releases their blocks. NULL is
 * a no-op. */
void sched_destroy(sched_t *s);

/* Queues a request. Takes ownership of req->prompt and
 * req->sampling.bias on ST_OK (the fields are set to NULL), and of udata
 * (passed back in every event of the request, freed with
 * cfg.udata_free); on error all three stay with the caller and nothing
 * changed (no block, no queue entry, no counter, no random stream drawn).
 * Allocates the request record, its sequences and their token buffers
 * (prompt + max_tokens, capped at the context) with the fallible family.
 * Errors: ST_EINVAL (bad fields, unknown tenant, duplicate id),
 * ST_ETOOLONG (prompt does not fit the context or the KV pool), ST_EQUEUE
 * (the tenant's waiting queue is full), ST_ENOMEM. */
int sched_submit(sched_t *s, eng_request_t *req, void *udata);
/* One line on why the last sched_submit failed; borrowed until the next
 * submit. */
const char *sched_last_error(const sched_t *s);

/* Finishes choice (or every choice when choice < 0) of request id at
 * once: its blocks are freed and FINISHED events are emitted with reason
 * STOP when as_stop, else ABORT. ST_ENOENT when id is unknown or already
 * finished (nothing emitted). Never call between sched_step and
 * sched_commit. */
int sched_cancel(sched_t *s, uint64_t id, int32_t choice, int as_stop);

/* Fails every open request with an ERROR event carrying status and frees
 * everything. */
void sched_abort_all(sched_t *s, int status);

/* The scheduler's notion of now, for tokens-per-minute budgets. The
 * engine calls it before every step; without calls time stands still. */
void sched_set_clock(sched_t *s, uint64_t now_ns);

/* 1 when there is no live request. */
int sched_idle(const sched_t *s);

/* Plans the next step (see DESIGN above). Queued blockmgr ops (copies,
 * swaps) must run before the forward pass. plan->batch.n_tokens may be 0
 * when nothing can run (all waiting for blocks), but then the step still
 * changed nothing. The batch arrays were allocated by sched_create, but
 * what grows with a sequence is allocated in blockmgr during the step,
 * fallibly: its record at admission (bm_seq_create), its block table,
 * token array and op-queue room (bm_seq_reserve), and for a swap the op
 * room and shared blocks' tenant records. When an admission or a reserve
 * fails for lack of memory, that request alone ends with an ERROR event
 * carrying ST_ENOMEM (at once, or at the end of this step's sched_commit
 * when a choice of it is already in the batch); a failed swap-out falls
 * back to recompute and a failed swap-in is retried in a later step.
 * Always ST_OK today. */
int sched_step(sched_t *s, sched_plan_t *plan);

/* Fills v for plan->samples[i]. */
void sched_sample_view(const sched_t *s, const sched_plan_t *plan, int32_t i,
                       sched_sample_view_t *v);
/* Sets to -INFINITY the logits of tokens that must not be sampled yet for
 * plan->samples[i]: EOS (unless ignore_eos) and stop_token_ids while fewer
 * than min_tokens have been generated. logits: [vocab_size]. */
void sched_sample_mask(const sched_t *s, const sched_plan_t *plan, int32_t i, float *logits);
/* The same for row j of a speculating sample (j = 0 is the plain row):
 * the history and counts as if drafts 0 .. j - 1 were accepted. */
void sched_sample_view_at(const sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j,
                          sched_sample_view_t *v);
void sched_sample_mask_at(const sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j,
                          float *logits);

/* Draft-model speculation (scheduler/spec_draft.h): sets draft j of
 * speculating sample i to token, in its sequence (the history rows j + 1
 * .. see) and in the batch, before the forward. plan_spec fills the k
 * slots with the pending token until then. */
void sched_set_draft(sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j, int32_t token);

/* For embeddings (scheduler/embed.h): the request of row `row` of the
 * plan just made (0 .. batch.n_seqs-1): its udata, prompt length and
 * eng_request_t.pooling. A request with pooling ENG_POOL_MEAN never takes
 * prompt blocks from the prefix cache (every prompt row must be computed). */
void sched_row_info(const sched_t *s, int32_t row, void **udata, int32_t *n_prompt,
                    int32_t *pooling);

/* Consumes the step: advances computed lengths, forks n > 1 requests whose
 * prompt completed, appends results[samples[i].res] (one per plan sample;
 * a speculating sample's accepted drafts and bonus token from
 * results[res ..], up to the first result that differs from its draft,
 * after which the rejected slots are truncated) and emits
 * TOKEN events, then FINISHED for every choice that hit EOS, a stop token,
 * max_tokens or the context length (its blocks are freed here). A request
 * whose TOKEN event failed (see sched_emit_cb) gets no more events in this
 * call but one ERROR ST_ENOMEM at its end, and is freed. The only
 * allocations are the forks' (bm_seq_fork: each child's blockmgr record
 * and block table, fallibly); a fork that fails ends its request the same
 * way, with ERROR ST_ENOMEM at the end of this call. */
void sched_commit(sched_t *s, const sched_plan_t *plan, const smp_result_t *results);

void sched_get_stats(const sched_t *s, sched_stats_t *out);
/* Speculative decoding counters since creation. */
void sched_get_spec_stats(const sched_t *s, spec_stats_t *out);
/* ST_EINVAL for an unknown tenant. */
int sched_get_tenant_stats(const sched_t *s, uint32_t tenant, sched_tenant_stats_t *out);

/* Attention sinks + rolling window (model/kv_policy.h), the eviction
 * sched_commit makes after a step: once the nohash sequence seq holds
 * n_kv > sink + window tokens of KV, evicts the fewest whole blocks after
 * the sinks that bring it to at most sink + window (bm_seq_evict: drops,
 * closes the gap, queues the kept blocks' KV_OP_SHIFT). Returns the
 * blocks evicted: 0 when none is due or blockmgr refuses (nothing
 * changed then). sink and window are whole blocks of the pool's size. */
int32_t sched_kv_window_evict(bm_pool_t *pool, uint64_t seq, int32_t n_kv, int32_t sink,
                              int32_t window);

/* Aborts on an inconsistent queue or counter (debug walker). */
void sched_check(const sched_t *s);

#endif /* SCHEDULER_SCHED_H */
