/* sched.c - request state, queues, tenant fair share, step planning,
 * preemption and stop checks (see sched.h for the design).
 *
 * Sequence states and the lists that hold them:
 *
 *   UNBORN   choice k > 0 of an n > 1 request before the fork: on no list
 *   WAITING  on its tenant's waiting list, sorted (priority, arrival)
 *   RUNNING  on s->running, in admission order; holds device blocks
 *   SWAPPED  on s->swapped, sorted (priority, arrival); holds CPU blocks
 *   DONE     finished (FINISHED emitted) and detached from everything
 *
 * Token ranges of a sequence (its buffer holds prompt + generated):
 *
 *   tokens: |p0 p1 ... p(P-1) g0 g1 ... |
 *           |<-- n_computed -->|<-- new this step -->|
 *           |<------------------ n_tokens ---------------->|
 *
 * n_computed tokens have K/V in blocks; a decode has exactly one token
 * left (the last sampled one), a prefill more. After a recompute
 * preemption n_computed is 0 again and the whole buffer is the prefill.
 *
 * Slot accounting: a running (or swapped) sequence takes one of the
 * max_num_seqs slots, except choice 0 of an n > 1 request before its fork,
 * which takes n, so the fork never overflows the budget.
 *
 * Requests that finish while a plan may still point at them are parked on
 * s->dead and freed at the next safe point (start of sched_step, end of
 * sched_commit and sched_cancel).
 */
#define LOG_MODULE "sched"

#include "scheduler/sched.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blockmgr/bm_memo.h"
#include "common/list.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "scheduler/kv_evict.h"
#include "scheduler/req_index.h"
#include "scheduler/sched_tabs.h"

typedef enum seq_state {
    SEQ_UNBORN = 0,
    SEQ_WAITING,
    SEQ_RUNNING,
    SEQ_SWAPPED,
    SEQ_DONE,
} seq_state_t;

typedef struct sched_req sched_req_t;

struct sched_seq {
    list_node_t node; /* in a waiting, running or swapped list */
    sched_req_t *req;
    uint64_t bm_id; /* blockmgr sequence id */
    int32_t choice;
    seq_state_t state;
    int in_pool;     /* registered with blockmgr */
    int done;        /* FINISHED emitted */
    int32_t *tokens; /* [req->cap]: prompt then generated */
    int32_t n_tokens;
    int32_t n_computed;
    int32_t n_generated;
    int32_t n_evicted; /* tokens evicted after the sinks (kv policy) */
    /* H2O / SnapKV: tokens dropped by compactions (the next position is
     * n_computed + pos_gap), the prompt tokens still kept (-1: all), and
     * whether SnapKV compressed the prompt already. */
    int32_t pos_gap;
    int32_t score_prompt;
    int snap_done;
    uint64_t admit_no; /* admission order, for victim choice */
    uint64_t step_no;  /* last step that planned it */
    smp_rng_t rng;
    gr_matcher_t *gm; /* the choice's grammar matcher (r.grammar), or NULL */
    spec_seq_t spec; /* speculative decoding's adaptive state (spec.h) */
    int32_t tab_slot; /* its block-table row + 1 while it holds one (sched_tabs.h) */
};

struct sched_req {
    list_node_t node;      /* s->reqs or s->dead */
    eng_request_t r;       /* owns r.prompt and r.sampling.bias */
    uint64_t arrival;      /* submit order */
    int32_t cap;           /* token buffer capacity per choice */
    int32_t kv_sink;       /* attention sinks + rolling window; window 0: off */
    int32_t kv_window;
    mdl_kv_policy_t kv_score; /* H2O / SnapKV (kind FULL: none) */
    int32_t n_live;        /* choices without FINISHED */
    int fork_pending;      /* choice 0 still computes the prompt for all */
    int admitted;          /* left the waiting queue once (charged) */
    int32_t cached_tokens; /* prompt tokens hit at first admission */
    bm_hash_memo_t *memo;  /* the prompt's block hashes (bm_memo.h), or NULL */
    sched_seq_t *seqs;     /* [r.n] */
    void *udata;           /* the submitter's, freed with cfg.udata_free */
    int failed;            /* out of memory (a TOKEN event, a blockmgr record):
                            * ERROR at the end of this commit */
};

typedef struct sched_tenant {
    eng_tenant_t cfg;
    list_node_t waiting; /* sched_seq_t, sorted (priority, arrival) */
    double vtc;          /* served tokens / weight */
    uint32_t n_live_reqs;
    uint32_t n_waiting_fresh; /* requests not yet admitted */
    uint32_t n_waiting;       /* sequences */
    uint32_t n_running;       /* sequences */
    uint32_t run_slots;
    uint32_t n_swapped;
    uint32_t kv_limit;     /* device blocks allowed; 0 = all */
    uint64_t blocked_step; /* not admissible again in this step */
    double tpm_budget;     /* tokens left this minute (tokens_per_minute > 0) */
    uint64_t tpm_t_ns;     /* last refill */
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t requests_finished;
    uint64_t requests_rejected;
} sched_tenant_t;

/* victim_cmp's fields copied out of the sequence, request and tenant, so
 * the sort compares contiguous keys instead of chasing three pointers per
 * comparison. */
struct sort_key {
    double vtc;
    int32_t priority;
    int32_t choice;
    uint64_t admit_no;
    sched_seq_t *q;
};

struct sched {
    sched_config_t cfg;
    bm_pool_t *pool;
    sched_emit_cb emit;
    void *emit_arg;
    uint32_t block_size;
    uint32_t dev_total;

    sched_tenant_t tenants[ENG_MAX_TENANTS];
    list_node_t reqs; /* live requests */
    ridx_t req_ids;   /* id -> live request (req_index.h) */
    list_node_t dead; /* finished, to free at a safe point */
    list_node_t running;
    list_node_t swapped;
    uint32_t n_reqs;
    uint32_t n_running; /* sequences */
    uint32_t run_slots;
    uint32_t n_swapped;
    uint32_t n_waiting;
    uint64_t arrival_no;
    uint32_t n_failed; /* requests marked failed in this commit */
    uint64_t admit_no;
    uint64_t next_bm_id;
    uint64_t step_no;
    uint64_t now_ns;    /* sched_set_clock() */
    smp_rng_t seed_rng; /* seeds for unseeded requests */
    char err[200];      /* why the last submit failed */

    uint64_t preempt_swap, preempt_recompute;
    uint32_t *gr_mask; /* [(vocab_size + 31) / 32] grammar mask scratch */
    uint64_t prompt_tokens, generation_tokens;

    /* Per-step arrays, allocated at creation (the step never grows them). */
    int32_t max_blocks_per_seq;
    int32_t *b_tokens;       /* [max_num_batched_tokens] */
    int32_t *b_positions;    /* [max_num_batched_tokens] */
    uint8_t *b_mass;         /* [max_num_batched_tokens] H2O / SnapKV mass rows */
    int b_mass_any;          /* some row of this step is one */
    float *kv_mass;          /* [max_model_len][kv_mass_heads], with cfg.kv_mass */
    int32_t *kv_slots;       /* [max_model_len] */
    uint32_t *kv_keep;       /* [max_model_len] */
    uint64_t kv_dropped;     /* tokens dropped by H2O / SnapKV */
    int32_t *b_slots;        /* [max_num_batched_tokens] */
    int32_t *b_query_start;  /* [max_num_seqs + 1] */
    int32_t *b_context_len;  /* [max_num_seqs] */
    int32_t *b_tables;       /* [max_num_seqs][max_blocks_per_seq], full_tables only */
    sched_tabs_t tabs;       /* persistent rows (sched_tabs.h), unless full_tables */
    int32_t *b_table_rows;   /* [max_num_seqs] each batch row's table row */
    int32_t *b_logits_rows;  /* [max_num_seqs] */
    sched_seq_t **rows_seq;  /* [max_num_seqs] sequence of each batch row */
    int32_t *rows_new;       /* [max_num_seqs] tokens planned per row */
    sched_sample_t *samples; /* [max_num_seqs] */
    sched_seq_t **snap;      /* [max_num_seqs] running list snapshot */
    struct sort_key *keys;   /* [max_num_seqs] sort_running's keys */
    int32_t *rows_draft;     /* [max_num_seqs] draft tokens among rows_new (spec.h) */
    int32_t n_res, n_decodes;
    spec_stats_t spec_stats;
    int32_t n_tok, n_rows, n_logits, n_samples;
    int32_t budget_tokens;
    uint32_t step_swap, step_recompute, step_swap_in, step_admitted;
};

/* ---- small helpers --------------------------------------------------- */

static int32_t
min_i32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

static sched_tenant_t *
seq_tenant(sched_t *s, const sched_seq_t *q)
{
    return &s->tenants[q->req->r.tenant];
}

/* Slots a running sequence takes from max_num_seqs. */
static uint32_t
seq_slots(const sched_seq_t *q)
{
    return (q->req->fork_pending && q->choice == 0) ? (uint32_t)q->req->r.n : 1;
}

/* (priority, arrival, choice) order: negative when a comes first. */
static int
seq_cmp(const sched_seq_t *a, const sched_seq_t *b)
{
    if (a->req->r.priority != b->req->r.priority) {
        return a->req->r.priority < b->req->r.priority ? -1 : 1;
    }
    if (a->req->arrival != b->req->arrival) {
        return a->req->arrival < b->req->arrival ? -1 : 1;
    }
    return a->choice < b->choice ? -1 : (a->choice > b->choice);
}

static void
list_insert_sorted(list_node_t *head, sched_seq_t *q)
{
    list_node_t *it;

    /* Walk from the back: recomputed sequences are rare, fresh ones sort
     * last within their priority. */
    for (it = head->prev; it != head; it = it->prev) {
        if (seq_cmp(LIST_ENTRY(it, sched_seq_t, node), q) <= 0) {
            break;
        }
    }
    list_insert_before(it->next, &q->node);
}

static void
run_account(sched_t *s, sched_seq_t *q, int add)
{
    sched_tenant_t *t = seq_tenant(s, q);
    uint32_t slots = seq_slots(q);

    if (add) {
        s->n_running++;
        s->run_slots += slots;
        t->n_running++;
        t->run_slots += slots;
    } else {
        CHECK(s->n_running > 0 && s->run_slots >= slots);
        CHECK(t->n_running > 0 && t->run_slots >= slots);
        s->n_running--;
        s->run_slots -= slots;
        t->n_running--;
        t->run_slots -= slots;
    }
}

static void
waiting_add(sched_t *s, sched_seq_t *q)
{
    sched_tenant_t *t = seq_tenant(s, q);

    q->state = SEQ_WAITING;
    list_insert_sorted(&t->waiting, q);
    t->n_waiting++;
    s->n_waiting++;
}

static void
waiting_del(sched_t *s, sched_seq_t *q)
{
    sched_tenant_t *t = seq_tenant(s, q);

    list_remove(&q->node);
    CHECK(t->n_waiting > 0 && s->n_waiting > 0);
    t->n_waiting--;
    s->n_waiting--;
    if (!q->req->admitted) {
        CHECK(t->n_waiting_fresh > 0);
        t->n_waiting_fresh--;
    }
}

/* Removes q from whatever holds it and releases its blocks. */
static void
seq_detach(sched_t *s, sched_seq_t *q)
{
    sched_tenant_t *t = seq_tenant(s, q);

    switch (q->state) {
    case SEQ_WAITING:
        waiting_del(s, q);
        break;
    case SEQ_RUNNING:
        list_remove(&q->node);
        run_account(s, q, 0);
        sched_tabs_release(&s->tabs, &q->tab_slot);
        break;
    case SEQ_SWAPPED:
        list_remove(&q->node);
        CHECK(t->n_swapped > 0 && s->n_swapped > 0);
        t->n_swapped--;
        s->n_swapped--;
        break;
    case SEQ_UNBORN:
    case SEQ_DONE:
        break;
    }
    if (q->in_pool) {
        bm_seq_free(s->pool, q->bm_id);
        q->in_pool = 0;
    }
    q->state = SEQ_DONE;
}

static void
req_free(sched_t *s, sched_req_t *rq)
{
    if (rq == NULL) {
        return;
    }
    for (int32_t k = 0; k < rq->r.n; k++) {
        free(rq->seqs[k].tokens);
        gr_matcher_destroy(rq->seqs[k].gm);
    }
    free(rq->seqs);
    bm_memo_destroy(rq->memo);
    gr_grammar_destroy(rq->r.grammar);
    free(rq->r.prompt);
    free((void *)rq->r.sampling.bias);
    if (rq->udata != NULL && s->cfg.udata_free != NULL) {
        s->cfg.udata_free(rq->udata);
    }
    free(rq);
}

static void
reap_dead(sched_t *s)
{
    while (!list_empty(&s->dead)) {
        list_node_t *n = s->dead.next;
        list_remove(n);
        req_free(s, LIST_ENTRY(n, sched_req_t, node));
    }
}

/* The request has no live choice left: detach everything, park it. */
static void
req_retire(sched_t *s, sched_req_t *rq)
{
    sched_tenant_t *t = &s->tenants[rq->r.tenant];

    for (int32_t k = 0; k < rq->r.n; k++) {
        seq_detach(s, &rq->seqs[k]);
    }
    list_remove(&rq->node);
    list_push_back(&s->dead, &rq->node);
    ridx_del(&s->req_ids, rq->r.id);
    CHECK(s->n_reqs > 0 && t->n_live_reqs > 0);
    s->n_reqs--;
    t->n_live_reqs--;
}

static void
emit_finished(sched_t *s, sched_seq_t *q, eng_finish_t reason, int32_t stop_token)
{
    sched_event_t ev = {
        .kind = SCHED_EV_FINISHED,
        .id = q->req->r.id,
        .choice = q->choice,
        .reason = reason,
        .stop_token = stop_token,
        .prompt_tokens = q->req->r.n_prompt,
        .completion_tokens = q->n_generated,
        .cached_tokens = q->req->cached_tokens,
        .t_arrival_ns = q->req->r.t_arrival_ns,
        .udata = q->req->udata,
    };

    (void)s->emit(s->emit_arg, &ev);
}

/* Marks a choice finished, emits FINISHED and frees what it holds. Choice
 * 0 of a request still computing its prompt for other live choices stays
 * in place as their carrier until the fork. */
static void
seq_finish(sched_t *s, sched_seq_t *q, eng_finish_t reason, int32_t stop_token)
{
    sched_req_t *rq = q->req;

    CHECK(!q->done);
    q->done = 1;
    rq->n_live--;
    emit_finished(s, q, reason, stop_token);
    if (rq->n_live == 0) {
        s->tenants[rq->r.tenant].requests_finished++;
        req_retire(s, rq);
        return;
    }
    if (rq->fork_pending && q->choice == 0) {
        return; /* carrier */
    }
    seq_detach(s, q);
}

/* Finishes every live choice of rq (the request retires with the last). */
static void
req_finish_all(sched_t *s, sched_req_t *rq, eng_finish_t reason)
{
    for (int32_t k = 0; k < rq->r.n && rq->n_live > 0; k++) {
        if (!rq->seqs[k].done) {
            seq_finish(s, &rq->seqs[k], reason, -1);
        }
    }
}

static void
tenant_lift(sched_t *s, uint32_t tid)
{
    double lo = INFINITY;

    for (int32_t u = 0; u < s->cfg.n_tenants; u++) {
        if ((uint32_t)u != tid && s->tenants[u].n_live_reqs > 0 && s->tenants[u].vtc < lo) {
            lo = s->tenants[u].vtc;
        }
    }
    if (lo != INFINITY && s->tenants[tid].vtc < lo) {
        s->tenants[tid].vtc = lo;
    }
}

/* ---- create / destroy ------------------------------------------------ */

int
sched_create(const sched_config_t *cfg, bm_pool_t *pool, sched_emit_cb emit, void *emit_arg,
             sched_t **out)
{
    sched_t *s;
    bm_stats_t bst;
    int32_t mns, mnbt;

    if (cfg == NULL || pool == NULL || emit == NULL || cfg->max_num_seqs < 1 ||
        cfg->max_num_batched_tokens < 1 || cfg->max_model_len < 2 || cfg->vocab_size < 1 ||
        cfg->n_tenants < 1 || cfg->n_tenants > ENG_MAX_TENANTS || cfg->n_eos < 0 ||
        cfg->n_eos > MDL_MAX_EOS || cfg->spec.k < 0 || cfg->spec.k > SPEC_MAX_K ||
        (cfg->spec.method != SPEC_OFF && cfg->spec.k == 0)) {
        return ST_EINVAL;
    }
    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        if (!(cfg->tenants[t].weight > 0) || cfg->tenants[t].max_kv_share < 0 ||
            cfg->tenants[t].max_kv_share > 1 || cfg->tenants[t].max_running < 0 ||
            cfg->tenants[t].max_waiting < 0 || cfg->tenants[t].tokens_per_minute < 0) {
            return ST_EINVAL;
        }
    }

    sp_vtc_weights_t vtc;
    if (sp_vtc_resolve(&cfg->vtc, &vtc) != ST_OK) {
        return ST_EINVAL;
    }
    s = xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    s->cfg.vtc = vtc;
    s->pool = pool;
    s->emit = emit;
    s->emit_arg = emit_arg;
    s->block_size = bm_pool_block_size(pool);
    bm_pool_stats(pool, &bst);
    s->dev_total = bst.dev_total;
    list_init(&s->reqs);
    list_init(&s->dead);
    list_init(&s->running);
    list_init(&s->swapped);
    s->next_bm_id = 1;
    smp_rng_seed(&s->seed_rng,
                 cfg->random_seed != 0 ? cfg->random_seed : now_ns() ^ (uint64_t)time(NULL));

    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        sched_tenant_t *tn = &s->tenants[t];
        tn->cfg = cfg->tenants[t];
        list_init(&tn->waiting);
        tn->tpm_budget = (double)tn->cfg.tokens_per_minute;
        if (tn->cfg.max_kv_share > 0 && tn->cfg.max_kv_share < 1) {
            tn->kv_limit = (uint32_t)floor(tn->cfg.max_kv_share * s->dev_total);
            if (tn->kv_limit == 0) {
                tn->kv_limit = 1;
            }
        }
    }

    mns = cfg->max_num_seqs;
    mnbt = cfg->max_num_batched_tokens;
    s->max_blocks_per_seq = (int32_t)((cfg->max_model_len + s->block_size - 1) / s->block_size);
    s->b_tokens = xcalloc((size_t)mnbt, sizeof(int32_t));
    s->b_positions = xcalloc((size_t)mnbt, sizeof(int32_t));
    s->b_mass = xcalloc((size_t)mnbt, 1);
    if (cfg->kv_mass != NULL) {
        s->kv_mass = xcalloc((size_t)cfg->max_model_len * (size_t)cfg->kv_mass_heads,
                             sizeof(float));
        s->kv_slots = xcalloc((size_t)cfg->max_model_len, sizeof(int32_t));
        s->kv_keep = xcalloc((size_t)cfg->max_model_len, sizeof(uint32_t));
    }
    s->b_slots = xcalloc((size_t)mnbt, sizeof(int32_t));
    s->b_query_start = xcalloc((size_t)mns + 1, sizeof(int32_t));
    s->b_context_len = xcalloc((size_t)mns, sizeof(int32_t));
    if (cfg->full_tables) {
        s->b_tables = xcalloc((size_t)mns * (size_t)s->max_blocks_per_seq, sizeof(int32_t));
    } else {
        const char *chk = getenv("KVSERVE_TEST_CHECK_TABLES"); /* test hook */
        sched_tabs_init(&s->tabs, mns, s->max_blocks_per_seq,
                        cfg->check_tables || (chk != NULL && atoi(chk) > 0));
    }
    s->b_table_rows = xcalloc((size_t)mns, sizeof(int32_t));
    /* A speculating sequence has 1 + k logits rows. */
    s->b_logits_rows = xcalloc((size_t)mns * (size_t)(1 + cfg->spec.k), sizeof(int32_t));
    s->rows_draft = xcalloc((size_t)mns, sizeof(int32_t));
    s->rows_seq = xcalloc((size_t)mns, sizeof(*s->rows_seq));
    s->rows_new = xcalloc((size_t)mns, sizeof(int32_t));
    s->samples = xcalloc((size_t)mns, sizeof(*s->samples));
    s->gr_mask = xcalloc((size_t)(cfg->vocab_size + 31) / 32, sizeof(uint32_t));
    s->snap = xcalloc((size_t)mns, sizeof(*s->snap));
    s->keys = xcalloc((size_t)mns, sizeof(*s->keys));
    /* Room for 2 * max_num_seqs live requests (at least 64) up front: a
     * submit allocates for the index only past that. */
    ridx_init_cap(&s->req_ids, (uint32_t)(2 * mns > 64 ? 2 * mns : 64));
    *out = s;
    return ST_OK;
}

void
sched_destroy(sched_t *s)
{
    if (s == NULL) {
        return;
    }
    while (!list_empty(&s->reqs)) {
        sched_req_t *rq = LIST_ENTRY(s->reqs.next, sched_req_t, node);
        for (int32_t k = 0; k < rq->r.n; k++) {
            seq_detach(s, &rq->seqs[k]);
        }
        list_remove(&rq->node);
        req_free(s, rq);
    }
    reap_dead(s);
    ridx_fini(&s->req_ids);
    free(s->b_tokens);
    free(s->b_positions);
    free(s->b_mass);
    free(s->kv_mass);
    free(s->kv_slots);
    free(s->kv_keep);
    free(s->b_slots);
    free(s->b_query_start);
    free(s->b_context_len);
    free(s->b_tables);
    sched_tabs_fini(&s->tabs);
    free(s->b_table_rows);
    free(s->b_logits_rows);
    free(s->rows_seq);
    free(s->rows_new);
    free(s->samples);
    free(s->snap);
    free(s->keys);
    free(s->gr_mask);
    free(s->rows_draft);
    free(s);
}

/* ---- submit / cancel ------------------------------------------------- */

static sched_req_t *
req_find(sched_t *s, uint64_t id)
{
    return ridx_get(&s->req_ids, id);
}

/* Records why a submit failed (sched_last_error) and returns rc. */
static int submit_fail(sched_t *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
submit_fail(sched_t *s, int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return rc;
}

const char *
sched_last_error(const sched_t *s)
{
    return s->err;
}

/* The request record, its sequences and their token buffers, or NULL
 * (nothing left allocated) when an allocation fails. */
static sched_req_t *
req_alloc(int32_t n, int32_t cap)
{
    sched_req_t *rq = xcalloc_try(1, sizeof(*rq));

    if (rq == NULL) {
        return NULL;
    }
    rq->seqs = xcalloc_try((size_t)n, sizeof(*rq->seqs));
    if (rq->seqs == NULL) {
        free(rq);
        return NULL;
    }
    for (int32_t k = 0; k < n; k++) {
        rq->seqs[k].tokens = xmalloc_try((size_t)cap * sizeof(int32_t));
        if (rq->seqs[k].tokens == NULL) {
            for (int32_t j = 0; j < k; j++) {
                free(rq->seqs[j].tokens);
            }
            free(rq->seqs);
            free(rq);
            return NULL;
        }
    }
    return rq;
}

/* Structured output: every choice gets its own matcher at the grammar's
 * start (copies of choice 0's, as n > 1 forks of one prompt). The matcher
 * follows the choice's generated tokens only, which preemption (swap or
 * recompute) and the KV window never change, so it is kept as it is
 * through both. 0 when out of memory (no matcher left). */
static int
grammar_attach(sched_req_t *rq, const eng_request_t *req)
{
    rq->seqs[0].gm = gr_matcher_create(req->grammar);
    for (int32_t k = 1; k < req->n && rq->seqs[0].gm != NULL; k++) {
        rq->seqs[k].gm = gr_matcher_copy(rq->seqs[0].gm);
        if (rq->seqs[k].gm == NULL) {
            break;
        }
    }
    for (int32_t k = 0; k < req->n; k++) {
        if (rq->seqs[k].gm == NULL) {
            for (int32_t j = 0; j < req->n; j++) {
                gr_matcher_destroy(rq->seqs[j].gm);
                rq->seqs[j].gm = NULL;
            }
            return 0;
        }
    }
    return 1;
}

int
sched_submit(sched_t *s, eng_request_t *req, void *udata)
{
    sched_tenant_t *t;
    sched_req_t *rq;
    uint32_t bs = s->block_size;
    uint32_t need;
    int32_t cap;

    ASSERT_THREAD(ENGINE);
    if (req->tenant >= (uint32_t)s->cfg.n_tenants) {
        return submit_fail(s, ST_EINVAL, "unknown tenant %u", req->tenant);
    }
    if (req->n_prompt < 1 || req->prompt == NULL) {
        return submit_fail(s, ST_EINVAL, "empty prompt");
    }
    if (req->n < 1 || req->max_tokens < 1 || req->min_tokens < 0 || req->n_stop_ids < 0 ||
        req->n_stop_ids > ENG_MAX_STOP_IDS ||
        (req->sampling.n_bias > 0 && req->sampling.bias == NULL)) {
        return submit_fail(s, ST_EINVAL, "invalid n, max_tokens, min_tokens or stop ids");
    }
    if (req->n > s->cfg.max_num_seqs) {
        return submit_fail(s, ST_EINVAL, "n = %d exceeds max_num_seqs = %d", req->n,
                           s->cfg.max_num_seqs);
    }
    for (int32_t i = 0; i < req->n_prompt; i++) {
        if (req->prompt[i] < 0 || req->prompt[i] >= s->cfg.vocab_size) {
            return submit_fail(s, ST_EINVAL,
                               "prompt token %d at %d is outside the vocabulary "
                               "of %d",
                               req->prompt[i], i, s->cfg.vocab_size);
        }
    }
    if (req_find(s, req->id) != NULL) {
        return submit_fail(s, ST_EINVAL, "request id %llu is already open",
                           (unsigned long long)req->id);
    }
    t = &s->tenants[req->tenant];
    if (t->cfg.max_running > 0 && req->n > t->cfg.max_running) {
        /* Its choices could never run together. */
        return submit_fail(s, ST_EINVAL, "n = %d exceeds the tenant's max_running = %d", req->n,
                           t->cfg.max_running);
    }
    /* The prompt plus its first sampled token must fit the context, the
     * pool and the tenant's KV share, or the request could never run. */
    need = ((uint32_t)req->n_prompt + 1 + bs - 1) / bs;
    if (req->n_prompt >= s->cfg.max_model_len) {
        return submit_fail(s, ST_ETOOLONG, "the prompt has %d tokens; the context length is %d",
                           req->n_prompt, s->cfg.max_model_len);
    }
    if (need > s->dev_total || (t->kv_limit > 0 && need > t->kv_limit)) {
        return submit_fail(s, ST_ETOOLONG, "the prompt needs %u KV blocks; %u are available%s",
                           need, t->kv_limit > 0 ? t->kv_limit : s->dev_total,
                           t->kv_limit > 0 ? " to the tenant" : "");
    }
    if (t->cfg.max_waiting > 0 && t->n_waiting_fresh >= (uint32_t)t->cfg.max_waiting) {
        t->requests_rejected++;
        return submit_fail(s, ST_EQUEUE, "tenant '%s' already has %u requests queued", t->cfg.name,
                           t->n_waiting_fresh);
    }

    int32_t sink = req->kv_window != 0 ? req->kv_sink : s->cfg.kv_sink;
    int32_t window = req->kv_window != 0 ? req->kv_window : s->cfg.kv_window;
    /* H2O / SnapKV: the request's, else the default; full KV turns it off. */
    mdl_kv_policy_t score = {0};

    if (req->kv_window >= 0) {
        score = req->kv_score.kind != MDL_KVP_FULL ? req->kv_score : s->cfg.kv_score;
    }
    if (req->kv_score.kind != MDL_KVP_FULL) {
        window = 0; /* the request chose attention-score eviction over the default sinks */
    } else if (window > 0) {
        score.kind = MDL_KVP_FULL; /* the request chose sinks */
    }
    if (score.kind != MDL_KVP_FULL) {
        if (score.budget > s->cfg.max_model_len || score.recent < 1 || score.budget <= score.recent) {
            return submit_fail(s, ST_EINVAL, "kv policy %s: budget %d must exceed its window %d "
                               "and be within the context of %d",
                               score.kind == MDL_KVP_H2O ? "h2o" : "snapkv", score.budget,
                               score.recent, s->cfg.max_model_len);
        }
        if (req->n != 1) {
            return submit_fail(s, ST_EINVAL, "a kv policy needs n = 1");
        }
        if (s->cfg.kv_mass == NULL) {
            return submit_fail(s, ST_EUNSUPPORTED,
                               "kv policies h2o and snapkv need the cpu backend with an f32 KV "
                               "cache or cuda with f16 / bf16");
        }
    }

    if (window > 0) {
        if (sink < 0 || sink % (int32_t)bs != 0 || window % (int32_t)bs != 0 ||
            sink + window + 2 * (int32_t)bs > s->cfg.max_model_len) {
            return submit_fail(s, ST_EINVAL,
                               "kv policy sink=%d,window=%d: whole blocks of %u tokens, and "
                               "sink + window + 2 blocks within the context of %d",
                               sink, window, bs, s->cfg.max_model_len);
        }
        if (req->n != 1) {
            return submit_fail(s, ST_EINVAL, "a kv policy needs n = 1");
        }
        if (!s->cfg.kv_policy_ok) {
            return submit_fail(s, ST_EUNSUPPORTED,
                               "a kv policy needs the cpu or cuda backend");
        }
    }
    /* 64-bit sum: max_tokens may be as large as INT32_MAX. */
    cap = (int64_t)req->n_prompt + req->max_tokens < s->cfg.max_model_len
              ? req->n_prompt + req->max_tokens
              : s->cfg.max_model_len;
    /* Everything is allocated before anything changes, so a failure
     * leaves the scheduler exactly as it was. */
    if (ridx_reserve(&s->req_ids, s->req_ids.n + 1) != ST_OK) {
        return submit_fail(s, ST_ENOMEM, "out of memory");
    }
    rq = req_alloc(req->n, cap);
    if (rq == NULL) {
        return submit_fail(s, ST_ENOMEM, "out of memory");
    }
    rq->r = *req;
    rq->udata = udata;
    rq->cap = cap;
    /* The prompt's block hashes, computed once for every admission try,
     * lookup, seal and recompute (blockmgr/bm_memo.h); not with a kv
     * policy (its sequences rewrite their history and are never hashed)
     * nor mean pooling (no lookup). */
    int memo_failed = s->cfg.prefix_caching && window <= 0 && score.kind == MDL_KVP_FULL &&
                      req->pooling != ENG_POOL_MEAN &&
                      bm_memo_create((uint32_t)req->n_prompt, bs, &rq->memo) != ST_OK;
    if (memo_failed || (req->grammar != NULL && !grammar_attach(rq, req))) {
        /* What req owns stays with the caller. */
        rq->r.prompt = NULL;
        rq->r.sampling.bias = NULL;
        rq->r.grammar = NULL;
        rq->udata = NULL;
        req_free(s, rq);
        return submit_fail(s, ST_ENOMEM, "out of memory");
    }
    rq->kv_sink = window > 0 ? sink : 0;
    rq->kv_window = window > 0 ? window : 0;
    rq->kv_score = score;
    req->prompt = NULL;
    req->sampling.bias = NULL;
    req->grammar = NULL;
    rq->arrival = ++s->arrival_no;
    rq->n_live = req->n;
    rq->fork_pending = req->n > 1;
    for (int32_t k = 0; k < req->n; k++) {
        sched_seq_t *q = &rq->seqs[k];
        list_init(&q->node);
        q->req = rq;
        q->choice = k;
        q->score_prompt = -1;
        q->bm_id = s->next_bm_id++;
        q->state = SEQ_UNBORN;
        memcpy(q->tokens, rq->r.prompt, (size_t)req->n_prompt * sizeof(int32_t));
        q->n_tokens = req->n_prompt;
        smp_rng_seed(&q->rng, req->has_seed ? req->seed + (uint64_t)k : smp_rng_next(&s->seed_rng));
    }

    if (t->n_live_reqs == 0) {
        tenant_lift(s, req->tenant);
    }
    t->n_live_reqs++;
    s->n_reqs++;
    list_push_back(&s->reqs, &rq->node);
    ridx_put(&s->req_ids, rq->r.id, rq);
    t->n_waiting_fresh++;
    waiting_add(s, &rq->seqs[0]);
    return ST_OK;
}

int
sched_cancel(sched_t *s, uint64_t id, int32_t choice, int as_stop)
{
    sched_req_t *rq = req_find(s, id);
    eng_finish_t reason = as_stop ? ENG_FINISH_STOP : ENG_FINISH_ABORT;
    int found = 0;

    ASSERT_THREAD(ENGINE);
    if (rq == NULL || choice >= rq->r.n) {
        return ST_ENOENT;
    }
    for (int32_t k = 0; k < rq->r.n && rq->n_live > 0; k++) {
        if ((choice < 0 || k == choice) && !rq->seqs[k].done) {
            seq_finish(s, &rq->seqs[k], reason, -1);
            found = 1;
        }
    }
    reap_dead(s);
    return found ? ST_OK : ST_ENOENT;
}

/* Ends rq at once with one ERROR event of status (standing in for the
 * FINISHED of its open choices): retires it, then emits. */
static void
req_end_error(sched_t *s, sched_req_t *rq, int status)
{
    sched_event_t ev = {
        .kind = SCHED_EV_ERROR,
        .id = rq->r.id,
        .choice = -1,
        .status = status,
        .t_arrival_ns = rq->r.t_arrival_ns,
        .udata = rq->udata,
    };

    rq->n_live = 0;
    req_retire(s, rq);
    (void)s->emit(s->emit_arg, &ev);
}

void
sched_abort_all(sched_t *s, int status)
{
    bm_pool_step_end(s->pool); /* no forward follows the plan */
    while (!list_empty(&s->reqs)) {
        req_end_error(s, LIST_ENTRY(s->reqs.next, sched_req_t, node), status);
    }
    reap_dead(s);
}

void
sched_set_clock(sched_t *s, uint64_t now)
{
    if (now > s->now_ns) {
        s->now_ns = now;
    }
}

/* Refills a tenant's tokens-per-minute bucket up to one minute's worth. */
static void
tenant_refill(sched_t *s, sched_tenant_t *t)
{
    double cap = (double)t->cfg.tokens_per_minute;

    if (cap <= 0) {
        return;
    }
    if (s->now_ns > t->tpm_t_ns) {
        t->tpm_budget += (double)(s->now_ns - t->tpm_t_ns) * cap / 60e9;
        if (t->tpm_budget > cap) {
            t->tpm_budget = cap;
        }
    }
    t->tpm_t_ns = s->now_ns;
}

int
sched_idle(const sched_t *s)
{
    return s->n_reqs == 0;
}

/* ---- step planning --------------------------------------------------- */

/* Appends one batch row for q: n_new tokens from q->n_computed, whose
 * slots bm_seq_reserve() already wrote at b_slots[n_tok]. */
/* Whether token i of q's history, computed this step, adds its attention
 * to the mass of the keys it reads: every row under H2O, the last W
 * prompt rows under SnapKV until it compressed. */
static uint8_t
score_mass_row(const sched_seq_t *q, int32_t i)
{
    const mdl_kv_policy_t *p = &q->req->kv_score;
    int32_t n = q->req->r.n_prompt;

    if (p->kind == MDL_KVP_H2O) {
        return 1;
    }
    return p->kind == MDL_KVP_SNAPKV && !q->snap_done && i < n && i >= n - p->recent;
}

static void
plan_add_row(sched_t *s, sched_seq_t *q, int32_t n_new)
{
    int32_t row = s->n_rows++;
    int32_t base = s->n_tok;
    sched_req_t *rq = q->req;

    s->b_query_start[row] = base;
    for (int32_t j = 0; j < n_new; j++) {
        s->b_tokens[base + j] = q->tokens[q->n_computed + j];
        s->b_positions[base + j] = q->n_computed + q->pos_gap + j;
        s->b_mass[base + j] = score_mass_row(q, q->n_computed + j);
        s->b_mass_any |= s->b_mass[base + j];
    }
    s->b_context_len[row] = q->n_computed + n_new;
    s->rows_seq[row] = q;
    s->rows_new[row] = n_new;
    s->rows_draft[row] = 0;
    s->n_tok += n_new;
    s->budget_tokens -= n_new;
    q->step_no = s->step_no;

    if (q->n_computed + n_new < q->n_tokens) {
        return; /* a prefill chunk that does not reach the end: no logits */
    }
    int32_t lrow = s->n_logits++;
    s->b_logits_rows[lrow] = s->n_tok - 1;
    if (rq->fork_pending) {
        /* The prompt's last token: one sample per live choice. */
        for (int32_t k = 0; k < rq->r.n; k++) {
            if (!rq->seqs[k].done) {
                s->samples[s->n_samples++] =
                    (sched_sample_t){.row = lrow, .seq = &rq->seqs[k], .res = s->n_res++};
            }
        }
    } else {
        s->samples[s->n_samples++] = (sched_sample_t){.row = lrow, .seq = q, .res = s->n_res++};
    }
}

/* Speculative decode (spec.h) of running decode q: proposes up to k
 * drafts past its token buffer's end and reserves the pending token plus
 * the drafts in one row with 1 + k logits rows. Never preempts: when the
 * lookahead does not fit, returns 0 and q decodes normally. No draft
 * takes a block's last slot (no rejected token is hashed or quantized). */
static int
plan_spec(sched_t *s, sched_seq_t *q)
{
    sched_req_t *rq = q->req;
    const int32_t bs = (int32_t)s->block_size;
    int32_t k, off, n;

    if (rq->r.no_speculative || rq->fork_pending || rq->failed || rq->kv_window > 0 ||
        rq->kv_score.kind != MDL_KVP_FULL ||
        s->cfg.sliding_window > 0) {
        return 0;
    }
    k = spec_seq_want(&s->cfg.spec, &q->spec, s->n_decodes);
    /* Room for the accepted drafts plus the bonus token. */
    k = min_i32(k, rq->cap - q->n_tokens - 1);
    k = min_i32(k, rq->r.max_tokens - q->n_generated - 1);
    k = min_i32(k, s->budget_tokens - 1);
    off = (q->n_tokens - 1) % bs; /* the pending token's slot */
    k = min_i32(k, off == bs - 1 ? bs - 1 : bs - 2 - off);
    if (k <= 0) {
        return 0;
    }
    if (s->cfg.spec.method == SPEC_DRAFT_MODEL) {
        /* The draft model writes its k tokens before the forward
         * (sched_set_draft); until then they repeat the pending token. */
        for (n = 0; n < k; n++) {
            q->tokens[q->n_tokens + n] = q->tokens[q->n_tokens - 1];
        }
    } else {
        n = spec_ngram_propose(q->tokens, q->n_tokens, s->cfg.spec.lookup_min,
                               s->cfg.spec.lookup_max, k, q->tokens + q->n_tokens);
    }
    /* Lookahead only from spare blocks: one per other decode stays free. */
    if (n > 0 && bm_seq_blocks_needed(s->pool, q->bm_id, (uint32_t)(1 + n)) +
                         (uint32_t)s->n_decodes >
                     bm_pool_free_blocks(s->pool)) {
        n = 0;
    }
    if (n <= 0 || bm_seq_reserve(s->pool, q->bm_id, q->tokens + q->n_computed, (uint32_t)(1 + n),
                                 s->b_slots + s->n_tok) != ST_OK) {
        return 0;
    }
    plan_add_row(s, q, 1 + n);
    /* plan_add_row gave the row's last token the logits row: move it to
     * the pending token and add one per draft after it. */
    int32_t lrow = s->n_logits - 1, first = s->n_tok - 1 - n;
    s->b_logits_rows[lrow] = first;
    for (int32_t j = 1; j <= n; j++) {
        s->b_logits_rows[s->n_logits++] = first + j;
    }
    sched_sample_t *sm = &s->samples[s->n_samples - 1];
    sm->n_draft = n;
    sm->draft = q->tokens + q->n_tokens;
    s->n_res += n;
    s->rows_draft[s->n_rows - 1] = n;
    return 1;
}

/* Preemption order: > 0 when a should be preempted before b. The tenant
 * with the most weighted service first, then the lowest priority (largest
 * value), then the most recently admitted. */
static int
victim_cmp(sched_t *s, const sched_seq_t *a, const sched_seq_t *b)
{
    double va = seq_tenant(s, a)->vtc, vb = seq_tenant(s, b)->vtc;

    if (va != vb) {
        return va > vb ? 1 : -1;
    }
    if (a->req->r.priority != b->req->r.priority) {
        return a->req->r.priority > b->req->r.priority ? 1 : -1;
    }
    if (a->admit_no != b->admit_no) {
        return a->admit_no > b->admit_no ? 1 : -1;
    }
    return (a->choice > b->choice) - (a->choice < b->choice);
}

/* Victim for preemption among the running sequences, planned or not. The
 * step plans in the opposite order (sort_running) within each pass, so a
 * planned victim is a decode met by a more protected prefill (pass 1);
 * plan_running takes it out of the batch before preempting it. */
static sched_seq_t *
pick_victim(sched_t *s)
{
    sched_seq_t *best = NULL;
    list_node_t *it;

    LIST_FOREACH(it, &s->running)
    {
        sched_seq_t *q = LIST_ENTRY(it, sched_seq_t, node);
        if (best == NULL || victim_cmp(s, q, best) > 0) {
            best = q;
        }
    }
    return best;
}

/* Takes planned running sequence q back out of this step's batch
 * (sched_policy.h, bm_seq_unreserve). 0 when blockmgr refuses (q took
 * blocks some other way this step): q stays planned. */
static int
unplan(sched_t *s, sched_seq_t *q)
{
    int32_t row = s->n_rows - 1;

    while (row >= 0 && s->rows_seq[row] != q) {
        row--;
    }
    if (row < 0 || bm_seq_unreserve(s->pool, q->bm_id) != ST_OK) {
        return 0;
    }
    sp_rows_t b = {
        .tokens = s->b_tokens,
        .positions = s->b_positions,
        .slots = s->b_slots,
        .query_start = s->b_query_start,
        .context_len = s->b_context_len,
        .rows_new = s->rows_new,
        .rows_draft = s->rows_draft,
        .rows_seq = s->rows_seq,
        .logits_rows = s->b_logits_rows,
        .samples = s->samples,
        .n_tok = &s->n_tok,
        .n_rows = &s->n_rows,
        .n_logits = &s->n_logits,
        .n_samples = &s->n_samples,
        .n_res = &s->n_res,
        .budget_tokens = &s->budget_tokens,
    };
    sp_unplan_row(&b, row);
    q->step_no = 0;
    return 1;
}

static int
key_cmp(const struct sort_key *a, const struct sort_key *b)
{
    if (a->vtc != b->vtc) {
        return a->vtc > b->vtc ? 1 : -1;
    }
    if (a->priority != b->priority) {
        return a->priority > b->priority ? 1 : -1;
    }
    if (a->admit_no != b->admit_no) {
        return a->admit_no > b->admit_no ? 1 : -1;
    }
    return (a->choice > b->choice) - (a->choice < b->choice);
}

static void
sift_down(struct sort_key *v, int32_t root, int32_t n)
{
    for (;;) {
        int32_t c = 2 * root + 1;

        if (c >= n) {
            return;
        }
        if (c + 1 < n && key_cmp(&v[c + 1], &v[c]) > 0) {
            c++;
        }
        if (key_cmp(&v[c], &v[root]) <= 0) {
            return;
        }
        struct sort_key tmp = v[c];
        v[c] = v[root];
        v[root] = tmp;
        root = c;
    }
}

/* Sorts v[0..n) most protected first, in victim_cmp's order: heapsort
 * over copied keys, O(n log n) with no allocation (an insertion sort was
 * O(n^2) once interleaved tenants' service reorders the running set each
 * step; issue 15). */
static void
sort_running(sched_t *s, sched_seq_t **v, int32_t n)
{
    struct sort_key *k = s->keys;

    for (int32_t i = 0; i < n; i++) {
        k[i] = (struct sort_key){.vtc = seq_tenant(s, v[i])->vtc,
                                 .priority = v[i]->req->r.priority,
                                 .choice = v[i]->choice,
                                 .admit_no = v[i]->admit_no,
                                 .q = v[i]};
    }
    for (int32_t i = n / 2 - 1; i >= 0; i--) {
        sift_down(k, i, n);
    }
    for (int32_t end = n - 1; end > 0; end--) {
        struct sort_key tmp = k[0];
        k[0] = k[end];
        k[end] = tmp;
        sift_down(k, 0, end);
    }
    for (int32_t i = 0; i < n; i++) {
        v[i] = k[i].q;
    }
}

static void
preempt(sched_t *s, sched_seq_t *q)
{
    sched_tenant_t *t = seq_tenant(s, q);

    list_remove(&q->node);
    run_account(s, q, 0);
    sched_tabs_release(&s->tabs, &q->tab_slot);
    if (q->in_pool && bm_pool_free_swap_blocks(s->pool) > 0 &&
        bm_seq_swap_out(s->pool, q->bm_id) == ST_OK) {
        q->state = SEQ_SWAPPED;
        list_insert_sorted(&s->swapped, q);
        t->n_swapped++;
        s->n_swapped++;
        s->preempt_swap++;
        s->step_swap++;
        REQ_DEBUG(q->req->r.id, "choice %d swapped out at %d tokens", q->choice, q->n_tokens);
        return;
    }
    if (q->in_pool) {
        bm_seq_free(s->pool, q->bm_id);
        q->in_pool = 0;
    }
    q->n_computed = 0;
    q->pos_gap = 0; /* a compacted history is re-prefilled at contiguous positions */
    waiting_add(s, q);
    s->preempt_recompute++;
    s->step_recompute++;
    REQ_DEBUG(q->req->r.id, "choice %d preempted for recompute at %d tokens", q->choice,
              q->n_tokens);
}

enum { PLAN_OK, PLAN_PREEMPTED, PLAN_FINISHED };

/* The block manager ran out of host memory for one of rq's sequences
 * (ST_ENOMEM, nothing changed in the pool): the request ends with ERROR
 * ST_ENOMEM and nothing else does. Right away when none of its choices
 * has a row in this step's batch; otherwise it is marked and ends at the
 * end of sched_commit (fail_marked), after the forward that writes its
 * reserved KV. Returns whether it ended now. */
static int
req_fail_nomem(sched_t *s, sched_req_t *rq)
{
    if (rq->failed) {
        return 0;
    }
    for (int32_t k = 0; k < rq->r.n; k++) {
        if (rq->seqs[k].step_no == s->step_no) {
            rq->failed = 1;
            s->n_failed++;
            return 0;
        }
    }
    REQ_DEBUG(rq->r.id, "out of memory for its KV bookkeeping: request ends");
    req_end_error(s, rq, ST_ENOMEM);
    return 1;
}

/* Reserves n_new tokens for running q, preempting others (or q itself)
 * until it fits. */
static int
plan_running(sched_t *s, sched_seq_t *q, int32_t n_new)
{
    if (q->req->failed) {
        return PLAN_FINISHED; /* ends at the end of this step's commit */
    }
    for (;;) {
        int rc = bm_seq_reserve(s->pool, q->bm_id, q->tokens + q->n_computed, (uint32_t)n_new,
                                s->b_slots + s->n_tok);
        if (rc == ST_OK) {
            plan_add_row(s, q, n_new);
            return PLAN_OK;
        }
        if (rc == ST_ENOMEM) {
            (void)req_fail_nomem(s, q->req);
            return PLAN_FINISHED;
        }
        CHECK(rc == ST_EAGAIN);
        sched_seq_t *v = pick_victim(s);
        CHECK(v != NULL);
        if (v != q && v->step_no == s->step_no && !unplan(s, v)) {
            v = q; /* blockmgr would not take its blocks back: q yields */
        }
        if (v == q && s->n_running == 1) {
            /* Alone on the device and still out of blocks: the pool cannot
             * hold this sequence any longer. */
            REQ_WARN(q->req->r.id, "choice %d outgrew the KV pool at %d tokens", q->choice,
                     q->n_tokens);
            seq_finish(s, q, ENG_FINISH_LENGTH, -1);
            return PLAN_FINISHED;
        }
        preempt(s, v);
        if (v == q) {
            return PLAN_PREEMPTED;
        }
    }
}

/* Brings swapped sequences back in (priority, arrival) order through
 * sp_swap_in_gate. Returns 1 when it stopped short of the pool's blocks
 * or the step's slots (nothing is admitted then), 0 when every swapped
 * sequence left is held by its own tenant's limits. */
static int
plan_swap_in(sched_t *s)
{
    list_node_t *it = s->swapped.next;

    while (it != &s->swapped) {
        sched_seq_t *q = LIST_ENTRY(it, sched_seq_t, node);
        sched_tenant_t *t = seq_tenant(s, q);
        sp_swap_in_req_t g = {
            .slots = seq_slots(q),
            .run_slots = s->run_slots,
            .max_slots = (uint32_t)s->cfg.max_num_seqs,
            .tenant_slots = t->run_slots,
            .tenant_max = (uint32_t)t->cfg.max_running,
            .tenant_running = t->n_running,
            .tenant_blocks = bm_tenant_blocks(s->pool, q->req->r.tenant),
            .tenant_kv = t->kv_limit,
            .need = bm_seq_swap_in_needed(s->pool, q->bm_id),
            .free_blocks = bm_pool_free_blocks(s->pool),
            .watermark = bm_pool_watermark_blocks(s->pool),
            .others_running = s->n_running > 0,
        };
        sp_swap_in_t verdict = sp_swap_in_gate(&g);

        it = it->next;
        if (verdict == SP_SWAP_IN_SKIP) {
            continue;
        }
        if (verdict == SP_SWAP_IN_STOP || bm_seq_swap_in(s->pool, q->bm_id) != ST_OK) {
            return 1;
        }
        list_remove(&q->node);
        t->n_swapped--;
        s->n_swapped--;
        q->state = SEQ_RUNNING;
        list_push_back(&s->running, &q->node);
        run_account(s, q, 1);
        s->step_swap_in++;

        if (s->budget_tokens > 0 && s->n_rows < s->cfg.max_num_seqs) {
            int32_t n_new = min_i32(q->n_tokens - q->n_computed, s->budget_tokens);
            if (bm_seq_reserve(s->pool, q->bm_id, q->tokens + q->n_computed, (uint32_t)n_new,
                               s->b_slots + s->n_tok) == ST_OK) {
                plan_add_row(s, q, n_new);
            }
        }
    }
    return 0;
}

/* The tenant to admit from: least weighted service among tenants with an
 * admissible head, ties to the earlier head. */
static sched_tenant_t *
pick_tenant(sched_t *s)
{
    sched_tenant_t *best = NULL;
    sched_seq_t *best_head = NULL;

    for (int32_t u = 0; u < s->cfg.n_tenants; u++) {
        sched_tenant_t *t = &s->tenants[u];
        /* A tenant's swapped sequences come back before its new work. */
        if (list_empty(&t->waiting) || t->blocked_step == s->step_no || t->n_swapped > 0) {
            continue;
        }
        sched_seq_t *h = LIST_ENTRY(t->waiting.next, sched_seq_t, node);
        if (t->cfg.max_running > 0 && t->run_slots + seq_slots(h) > (uint32_t)t->cfg.max_running) {
            continue;
        }
        if (t->cfg.tokens_per_minute > 0 && !h->req->admitted &&
            t->tpm_budget < (double)h->req->r.n_prompt &&
            t->tpm_budget < (double)t->cfg.tokens_per_minute) {
            /* Out of tokens this minute: the prompt must fit the budget
             * (or, for a prompt larger than a minute's worth, the budget
             * be full). Recomputed sequences still come back. */
            continue;
        }
        if (best == NULL || t->vtc < best->vtc ||
            (t->vtc == best->vtc && seq_cmp(h, best_head) < 0)) {
            best = t;
            best_head = h;
        }
    }
    return best;
}

static void
plan_admit(sched_t *s)
{
    uint32_t bs = s->block_size;

    while (s->budget_tokens > 0 && s->n_rows < s->cfg.max_num_seqs) {
        sched_tenant_t *t = pick_tenant(s);
        if (t == NULL) {
            break;
        }
        sched_seq_t *q = LIST_ENTRY(t->waiting.next, sched_seq_t, node);
        sched_req_t *rq = q->req;
        uint32_t tid = rq->r.tenant;

        if (s->run_slots + seq_slots(q) > (uint32_t)s->cfg.max_num_seqs) {
            break;
        }
        /* Estimate the blocks with a probe before touching the pool. */
        /* Mean pooling needs every prompt row computed: no cache hits. */
        int reuse = s->cfg.prefix_caching && rq->r.pooling != ENG_POOL_MEAN;
        uint32_t cached = reuse ? bm_prefix_probe_memo(s->pool, tid, q->tokens,
                                                       (uint32_t)q->n_tokens, rq->memo)
                                : 0;
        int32_t n_new = min_i32(q->n_tokens - (int32_t)cached, s->budget_tokens);
        uint32_t blocks = (cached + (uint32_t)n_new + bs - 1) / bs - cached / bs;
        if (t->kv_limit > 0 && bm_tenant_blocks(s->pool, tid) + blocks > t->kv_limit) {
            if (t->n_running == 0 && blocks > t->kv_limit) {
                /* A recomputed sequence that outgrew its tenant's share. */
                req_finish_all(s, rq, ENG_FINISH_LENGTH);
                continue;
            }
            t->blocked_step = s->step_no;
            continue;
        }
        /* The watermark keeps room for running sequences to grow; with
         * nothing running there is nothing to keep it for. */
        if (s->n_running > 0 && !bm_pool_can_admit(s->pool, blocks)) {
            break;
        }

        int rc = bm_seq_create(s->pool, q->bm_id, tid);
        if (rc == ST_OK) {
            q->in_pool = 1;
            q->n_computed = 0;
            if (q->req->kv_window > 0) {
                /* Its blocks get evicted and re-rotated: never shared. */
                CHECK(bm_seq_set_nohash(s->pool, q->bm_id) == ST_OK);
            }
            if (rq->memo != NULL) {
                CHECK(bm_seq_set_memo(s->pool, q->bm_id, rq->memo) == ST_OK);
            }
            if (reuse) {
                uint32_t got = 0;
                rc = bm_seq_lookup_prefix(s->pool, q->bm_id, q->tokens, (uint32_t)q->n_tokens,
                                          &got);
                q->n_computed = (int32_t)got;
            }
        }
        if (rc == ST_OK) {
            n_new = min_i32(q->n_tokens - q->n_computed, s->budget_tokens);
            rc = bm_seq_reserve(s->pool, q->bm_id, q->tokens + q->n_computed, (uint32_t)n_new,
                                s->b_slots + s->n_tok);
        }
        if (rc == ST_ENOMEM) {
            /* Out of host memory for its records: that request ends (or,
             * with a choice in this batch, is skipped until the commit
             * ends it). */
            if (q->in_pool) {
                bm_seq_free(s->pool, q->bm_id);
                q->in_pool = 0;
                q->n_computed = 0;
            }
            if (!req_fail_nomem(s, rq)) {
                t->blocked_step = s->step_no;
            }
            continue;
        }
        if (rc != ST_OK) {
            CHECK(rc == ST_EAGAIN);
            bm_seq_free(s->pool, q->bm_id);
            q->in_pool = 0;
            q->n_computed = 0;
            if (s->n_running == 0) {
                /* The whole pool cannot hold it: a recomputed sequence
                 * that outgrew the pool (fresh prompts are checked at
                 * submit). */
                req_finish_all(s, rq, ENG_FINISH_LENGTH);
                continue;
            }
            break;
        }

        waiting_del(s, q);
        if (!rq->admitted) {
            rq->admitted = 1;
            rq->cached_tokens = q->n_computed;
            t->vtc += sp_vtc_prompt_charge(&s->cfg.vtc, rq->r.n_prompt, q->n_computed) /
                      t->cfg.weight;
            t->tpm_budget -= (double)rq->r.n_prompt;
            t->prompt_tokens += (uint64_t)rq->r.n_prompt;
            s->prompt_tokens += (uint64_t)rq->r.n_prompt;
        }
        q->state = SEQ_RUNNING;
        q->admit_no = ++s->admit_no;
        list_push_back(&s->running, &q->node);
        run_account(s, q, 1);
        s->step_admitted++;
        plan_add_row(s, q, n_new);
    }
}

/* The batch's block tables: each row's persistent row brought up to date
 * (sched_tabs.h), or, with full_tables, every table laid out anew with the
 * step's widest table as the stride. */
static void
plan_tables(sched_t *s, sched_plan_t *plan)
{
    int32_t max_blocks = 1;

    if (!s->cfg.full_tables) {
        sched_tabs_begin(&s->tabs);
        for (int32_t r = 0; r < s->n_rows; r++) {
            sched_seq_t *q = s->rows_seq[r];
            s->b_table_rows[r] = sched_tabs_sync(&s->tabs, s->pool, q->bm_id, &q->tab_slot);
        }
        plan->batch.block_tables = s->tabs.tab;
        plan->batch.max_blocks = s->tabs.stride;
        plan->batch.table_rows = s->b_table_rows;
        plan->batch.table_dirty = s->tabs.dirty;
        plan->batch.n_table_dirty = s->tabs.n_dirty;
        return;
    }
    for (int32_t r = 0; r < s->n_rows; r++) {
        uint32_t nb = 0;
        (void)bm_seq_table(s->pool, s->rows_seq[r]->bm_id, &nb);
        if ((int32_t)nb > max_blocks) {
            max_blocks = (int32_t)nb;
        }
    }
    CHECK(max_blocks <= s->max_blocks_per_seq);
    for (int32_t r = 0; r < s->n_rows; r++) {
        uint32_t nb = 0;
        const int32_t *tab = bm_seq_table(s->pool, s->rows_seq[r]->bm_id, &nb);
        int32_t *dst = s->b_tables + (size_t)r * (size_t)max_blocks;
        memcpy(dst, tab, (size_t)nb * sizeof(int32_t));
        for (int32_t j = (int32_t)nb; j < max_blocks; j++) {
            dst[j] = 0; /* the null block */
        }
    }
    plan->batch.block_tables = s->b_tables;
    plan->batch.max_blocks = max_blocks;
}

static void
plan_finalize(sched_t *s, sched_plan_t *plan)
{
    s->b_query_start[s->n_rows] = s->n_tok;

    memset(plan, 0, sizeof(*plan));
    plan_tables(s, plan);
    plan->batch.n_tokens = s->n_tok;
    plan->batch.tokens = s->b_tokens;
    plan->batch.positions = s->b_positions;
    plan->batch.slot_mapping = s->b_slots;
    plan->batch.n_seqs = s->n_rows;
    plan->batch.query_start = s->b_query_start;
    plan->batch.context_len = s->b_context_len;
    plan->batch.logits_rows = s->b_logits_rows;
    plan->batch.n_logits = s->n_logits;
    plan->batch.mass_rows = s->b_mass_any ? s->b_mass : NULL; /* H2O / SnapKV */
    s->b_mass_any = 0;
    plan->n_samples = s->n_samples;
    plan->samples = s->samples;
    plan->n_preempt_swap = s->step_swap;
    plan->n_preempt_recompute = s->step_recompute;
    plan->n_swap_in = s->step_swap_in;
    plan->n_admitted = s->step_admitted;
    plan->n_results = s->n_res;
}

int
sched_step(sched_t *s, sched_plan_t *plan)
{
    int32_t n_snap = 0;
    list_node_t *it;

    ASSERT_THREAD(ENGINE);
    bm_pool_step_begin(s->pool); /* blockmgr checks the step contract */
    reap_dead(s);
    s->step_no++;
    for (int32_t u = 0; u < s->cfg.n_tenants; u++) {
        tenant_refill(s, &s->tenants[u]);
    }
    s->n_tok = s->n_rows = s->n_logits = s->n_samples = s->n_res = 0;
    s->budget_tokens = s->cfg.max_num_batched_tokens;
    s->step_swap = s->step_recompute = s->step_swap_in = s->step_admitted = 0;

    LIST_FOREACH(it, &s->running)
    {
        CHECK(n_snap < s->cfg.max_num_seqs);
        s->snap[n_snap++] = LIST_ENTRY(it, sched_seq_t, node);
    }
    sort_running(s, s->snap, n_snap);
    s->n_decodes = 0;
    for (int32_t i = 0; i < n_snap; i++) {
        s->n_decodes += s->snap[i]->n_tokens - s->snap[i]->n_computed == 1;
    }
    /* Pass 0: decodes; pass 1: partial prefills. Both in protection order
     * (least served tenant, highest priority, oldest first): when blocks
     * run out, the ones still unplanned are the ones to preempt.
     * A sequence preempted or finished meanwhile is no longer RUNNING;
     * nothing is freed during the step (see reap_dead), so the snapshot
     * stays valid. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < n_snap; i++) {
            sched_seq_t *q = s->snap[i];
            if (q->state != SEQ_RUNNING || q->step_no == s->step_no) {
                continue;
            }
            int32_t remaining = q->n_tokens - q->n_computed;
            if ((pass == 0) != (remaining == 1)) {
                continue;
            }
            if (s->budget_tokens == 0 || s->n_rows == s->cfg.max_num_seqs) {
                break;
            }
            if (pass == 0 && s->cfg.spec.method != SPEC_OFF && plan_spec(s, q)) {
                continue;
            }
            (void)plan_running(s, q, min_i32(remaining, s->budget_tokens));
        }
    }
    if (s->step_swap == 0 && s->step_recompute == 0 && !plan_swap_in(s)) {
        plan_admit(s);
    }
    plan_finalize(s, plan);
    return ST_OK;
}

/* ---- sampling view and commit ---------------------------------------- */

void
sched_sample_view(const sched_t *s, const sched_plan_t *plan, int32_t i, sched_sample_view_t *v)
{
    sched_sample_view_at(s, plan, i, 0, v);
}

void
sched_sample_view_at(const sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j,
                     sched_sample_view_t *v)
{
    const sched_seq_t *q = plan->samples[i].seq;

    (void)s;
    v->id = q->req->r.id;
    v->choice = q->choice;
    v->params = &q->req->r.sampling;
    v->rng = &((sched_seq_t *)q)->rng;
    v->history = q->tokens; /* drafts follow n_tokens (plan_spec) */
    v->n_hist = q->n_tokens + j;
    v->n_prompt = q->req->r.n_prompt;
    if (q->score_prompt >= 0) { /* H2O / SnapKV: the prompt tokens kept */
        v->n_prompt = q->score_prompt;
    }
    if (q->n_evicted > 0) { /* where the prompt ends in the kept history */
        int32_t sink = q->req->kv_sink;

        v->n_prompt = v->n_prompt <= sink                  ? v->n_prompt
                      : v->n_prompt - q->n_evicted >= sink ? v->n_prompt - q->n_evicted
                                                           : sink;
    }
    v->n_generated = q->n_generated + j;
}

/* The grammar's mask: -INFINITY before any sampling step, so bias,
 * penalties, temperature and truncation see only allowed tokens, and the
 * reported logprobs are those of the constrained distribution (vLLM
 * applies its grammar bitmask to the logits before its sampler computes
 * logprobs the same way). A dead end (no token allowed; it cannot happen
 * with a vocabulary that has every single byte) allows EOS instead so
 * the choice ends. */
static void
grammar_mask(const sched_t *s, const sched_seq_t *q, float *logits)
{
    uint32_t *mask = s->gr_mask;
    int32_t words = (s->cfg.vocab_size + 31) / 32;
    uint32_t any = 0;

    gr_matcher_fill_mask(q->gm, mask);
    for (int32_t w = 0; w < words; w++) {
        any |= mask[w];
    }
    if (any == 0) {
        for (int32_t k = 0; k < s->cfg.n_eos; k++) {
            int32_t id = s->cfg.eos_ids[k];
            if (id >= 0 && id < s->cfg.vocab_size) {
                mask[id >> 5] |= 1u << (id & 31);
            }
        }
    }
    gr_mask_apply(mask, logits, s->cfg.vocab_size);
}

void
sched_set_draft(sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j, int32_t token)
{
    const sched_sample_t *sm = &plan->samples[i];
    sched_seq_t *q = sm->seq;

    CHECK(j >= 0 && j < sm->n_draft && token >= 0 && token < s->cfg.vocab_size);
    q->tokens[q->n_tokens + j] = token;
    s->b_tokens[s->b_logits_rows[sm->row] + 1 + j] = token;
    /* The block manager's copy: the hash input if the draft is accepted. */
    CHECK(bm_seq_set_token(s->pool, q->bm_id, (uint32_t)(q->n_tokens + j), token) == ST_OK);
}

void
sched_row_info(const sched_t *s, int32_t row, void **udata, int32_t *n_prompt, int32_t *pooling)
{
    const sched_req_t *rq = s->rows_seq[row]->req;

    *udata = rq->udata;
    *n_prompt = rq->r.n_prompt;
    *pooling = rq->r.pooling;
}

void
sched_sample_mask(const sched_t *s, const sched_plan_t *plan, int32_t i, float *logits)
{
    sched_sample_mask_at(s, plan, i, 0, logits);
}

void
sched_sample_mask_at(const sched_t *s, const sched_plan_t *plan, int32_t i, int32_t j,
                     float *logits)
{
    const sched_seq_t *q = plan->samples[i].seq;
    const eng_request_t *r = &q->req->r;

    if (q->gm != NULL) {
        /* Row j of a speculating choice: the matcher stands after the
         * pending token; advance it over drafts 0 .. j - 1 (they sit past
         * the end of the token buffer), take the mask, roll back. A draft
         * the grammar refuses is rejected at its own row (that row's
         * sample is masked and cannot equal it), so rows after it are
         * never used and keep their logits unmasked. */
        int32_t adv = 0;
        while (adv < j &&
               gr_matcher_accept_token(q->gm, q->tokens[q->n_tokens + adv]) == ST_OK) {
            adv++;
        }
        if (adv == j) {
            grammar_mask(s, q, logits);
        }
        if (adv > 0) {
            CHECK(gr_matcher_rollback(q->gm, adv) == ST_OK);
        }
    }
    if (q->n_generated + j >= r->min_tokens) {
        return;
    }
    if (!r->ignore_eos) {
        for (int32_t k = 0; k < s->cfg.n_eos; k++) {
            int32_t id = s->cfg.eos_ids[k];
            if (id >= 0 && id < s->cfg.vocab_size) {
                logits[id] = -INFINITY;
            }
        }
    }
    for (int32_t k = 0; k < r->n_stop_ids; k++) {
        int32_t id = r->stop_ids[k];
        if (id >= 0 && id < s->cfg.vocab_size) {
            logits[id] = -INFINITY;
        }
    }
}

static void
commit_fork(sched_t *s, sched_seq_t *parent)
{
    sched_req_t *rq = parent->req;
    list_node_t *after = &parent->node;

    run_account(s, parent, 0); /* n slots */
    rq->fork_pending = 0;
    for (int32_t k = 1; k < rq->r.n; k++) {
        sched_seq_t *c = &rq->seqs[k];
        if (c->done) {
            continue;
        }
        int rc = bm_seq_fork(s->pool, parent->bm_id, c->bm_id);
        if (rc != ST_OK) {
            /* Out of memory for the child's record: the request ends with
             * ERROR at the end of this commit (fail_marked). */
            CHECK(rc == ST_ENOMEM);
            if (!rq->failed) {
                rq->failed = 1;
                s->n_failed++;
            }
            break;
        }
        c->in_pool = 1;
        c->n_computed = parent->n_computed;
        c->state = SEQ_RUNNING;
        c->admit_no = parent->admit_no;
        c->step_no = parent->step_no;
        list_insert_before(after->next, &c->node);
        after = &c->node;
        run_account(s, c, 1);
    }
    run_account(s, parent, 1); /* now one slot */
    if (parent->done) {
        seq_detach(s, parent); /* the carrier's job is over */
    }
}

static int
is_eos(const sched_t *s, int32_t tok)
{
    for (int32_t k = 0; k < s->cfg.n_eos; k++) {
        if (s->cfg.eos_ids[k] == tok) {
            return 1;
        }
    }
    return 0;
}

static void
commit_token(sched_t *s, sched_seq_t *q, const smp_result_t *res)
{
    sched_req_t *rq = q->req;
    sched_tenant_t *t = seq_tenant(s, q);
    int32_t tok = res->token;
    sched_event_t ev = {
        .kind = SCHED_EV_TOKEN,
        .id = rq->r.id,
        .choice = q->choice,
        .tok = res,
        .t_arrival_ns = rq->r.t_arrival_ns,
        .udata = rq->udata,
    };

    CHECK(q->state == SEQ_RUNNING && q->n_computed == q->n_tokens && q->n_tokens < rq->cap);
    q->tokens[q->n_tokens++] = tok;
    q->n_generated++;
    t->generation_tokens++;
    s->generation_tokens++;
    t->vtc += s->cfg.vtc.output / t->cfg.weight;
    t->tpm_budget -= 1.0;
    if (s->emit(s->emit_arg, &ev) != ST_OK) {
        /* The token could not be reported: the request ends with ERROR at
         * the end of this commit, and nothing else is said about it. */
        rq->failed = 1;
        s->n_failed++;
        return;
    }

    /* Structured output: the matcher follows the committed token; a
     * complete grammar (nothing may follow) ends the choice with STOP, its
     * last token part of the text. A token the grammar refuses (only a
     * dead end's EOS can be one) ends it too. */
    if (q->gm != NULL && !is_eos(s, tok)) {
        if (gr_matcher_accept_token(q->gm, tok) != ST_OK || gr_matcher_done(q->gm)) {
            seq_finish(s, q, ENG_FINISH_STOP, -1);
            return;
        }
    }

    /* EOS and stop ids do not stop a choice before min_tokens (the mask
     * keeps a real sampler from producing them). */
    if (q->n_generated >= rq->r.min_tokens) {
        if (!rq->r.ignore_eos && is_eos(s, tok)) {
            seq_finish(s, q, ENG_FINISH_STOP, tok);
            return;
        }
        for (int32_t k = 0; k < rq->r.n_stop_ids; k++) {
            if (rq->r.stop_ids[k] == tok) {
                seq_finish(s, q, ENG_FINISH_STOP, tok);
                return;
            }
        }
    }
    if (q->n_generated >= rq->r.max_tokens || q->n_tokens >= s->cfg.max_model_len) {
        seq_finish(s, q, ENG_FINISH_LENGTH, -1);
    }
}

/* A speculating sample (plan_spec): res[j] was sampled after the pending
 * token and drafts 0 .. j - 1; drafts are accepted up to the first res[j]
 * that differs (spec_verify_sample stopped there), then that result or,
 * with every draft accepted, the bonus res[n_draft] is the last token.
 * Tokens are committed one at a time, so stop ids, EOS, min_tokens,
 * max_tokens and a failed TOKEN event end the run exactly where a plain
 * decode would have; the KV of what is not kept is given back. */
static void
commit_spec(sched_t *s, sched_seq_t *q, const sched_sample_t *sm, const smp_result_t *res)
{
    const int32_t k = sm->n_draft;
    int32_t acc = 0;

    while (acc < k && res[acc].token == sm->draft[acc]) {
        acc++;
    }
    s->spec_stats.drafts++;
    s->spec_stats.draft_tokens += (uint64_t)k;
    s->spec_stats.accepted_tokens += (uint64_t)acc;
    for (int32_t j = 0; j < acc; j++) {
        s->spec_stats.accepted_per_pos[j]++;
    }
    spec_seq_record(&s->cfg.spec, &q->spec, k, acc);
    /* The row wrote KV for the pending token and k drafts. */
    const int32_t kv_len = q->n_computed + k;
    for (int32_t j = 0; j <= acc && !q->done && !q->req->failed; j++) {
        if (j > 0) {
            q->n_computed++; /* draft j - 1 was accepted: its KV stays */
        }
        commit_token(s, q, &res[j]);
    }
    if (q->in_pool && q->state == SEQ_RUNNING && kv_len > q->n_computed) {
        CHECK(bm_seq_truncate(s->pool, q->bm_id, (uint32_t)(kv_len - q->n_computed)) == ST_OK);
    }
}

/* Attention sinks + rolling window: after its step, a sequence whose KV
 * outgrew sink + window loses whole blocks after the sinks (blockmgr
 * queues their drops and the re-rotation of the kept blocks for the next
 * step), and its token history closes the same gap, so KV index, token
 * index and position stay equal (a recompute re-prefills the kept tokens
 * at the same contiguous positions):
 *
 *   tokens | sinks S | evicted e*bs | kept ... n_computed | pending |
 *   after  | sinks S | kept ... n_computed - e*bs | pending |
 */
int32_t
sched_kv_window_evict(bm_pool_t *pool, uint64_t seq, int32_t n_kv, int32_t sink, int32_t window)
{
    const int32_t bs = (int32_t)bm_pool_block_size(pool);
    /* The fewest whole blocks that keep at least window recent tokens. */
    int32_t e = window > 0 ? (n_kv - sink - window) / bs : 0;

    if (e <= 0 || bm_seq_evict(pool, seq, (uint32_t)(sink / bs), (uint32_t)e) != ST_OK) {
        return 0;
    }
    return e;
}

static void
evict_window(sched_t *s, sched_seq_t *q)
{
    const int32_t bs = (int32_t)s->block_size, sink = q->req->kv_sink;
    int32_t e = sched_kv_window_evict(s->pool, q->bm_id, q->n_computed, sink, q->req->kv_window);

    if (e == 0) {
        return;
    }
    memmove(q->tokens + sink, q->tokens + sink + e * bs,
            sizeof(int32_t) * (size_t)(q->n_tokens - sink - e * bs));
    q->n_tokens -= e * bs;
    q->n_computed -= e * bs;
    q->n_evicted += e * bs;
}

/* H2O / SnapKV after a step (scheduler/kv_evict.h): H2O keeps the
 * sequence under its budget, SnapKV compresses the prompt once it is
 * computed. The mass comes from the runtime as plain numbers; blockmgr
 * queues the moves for the next step. The token history closes the same
 * gaps (tokens[i] = tokens[keep[i]]), and positions run on past every
 * token ever computed (pos_gap): kept keys keep their rotation.
 *
 *   tokens | t0 t1 t2 t3 t4 t5 | pending |   keep t0 t2 t4 t5
 *   after  | t0 t2 t4 t5 | pending |          pos_gap += 2
 */
static void
score_evict(sched_t *s, sched_seq_t *q)
{
    const mdl_kv_policy_t *p = &q->req->kv_score;
    int32_t n_kv = q->n_computed, n_keep = 0, dropped, pe, kept_prompt = 0;

    if (s->cfg.kv_mass == NULL) {
        return;
    }
    if (p->kind == MDL_KVP_H2O) {
        n_keep = sched_kv_h2o_target(p, n_kv, (int32_t)s->block_size);
    } else if (!q->snap_done && q->n_computed >= q->req->r.n_prompt) {
        q->snap_done = 1;
        n_keep = n_kv > p->budget ? p->budget : 0;
    }
    if (n_keep <= 0 || n_keep >= n_kv) {
        return;
    }
    sched_kv_slots(s->pool, q->bm_id, n_kv, s->kv_slots);
    if (s->cfg.kv_mass(s->cfg.kv_mass_arg, s->kv_slots, n_kv, s->kv_mass) != ST_OK) {
        return;
    }
    dropped = sched_kv_compact(s->pool, q->bm_id, p, s->kv_mass, n_kv, s->cfg.kv_mass_heads,
                               n_keep, s->kv_keep);
    if (dropped == 0) {
        return; /* no room for private copies now: the next step tries again */
    }
    pe = q->score_prompt >= 0 ? q->score_prompt : q->req->r.n_prompt;
    for (int32_t i = 0; i < n_keep; i++) {
        q->tokens[i] = q->tokens[s->kv_keep[i]];
        kept_prompt += (int32_t)s->kv_keep[i] < pe;
    }
    memmove(q->tokens + n_keep, q->tokens + n_kv, sizeof(int32_t) * (size_t)(q->n_tokens - n_kv));
    q->n_tokens -= dropped;
    q->n_computed -= dropped;
    q->pos_gap += dropped;
    q->score_prompt = kept_prompt;
    s->kv_dropped += (uint64_t)dropped;
}

/* Ends with ERROR ST_ENOMEM every request whose TOKEN event failed in
 * this commit (still live: commit_token returns before any finish check
 * when the event fails, and skips the request's later samples), or that
 * the block manager could not serve for memory in this step or its fork.
 * The ERROR stands in for the FINISHED of its open choices. */
static void
fail_marked(sched_t *s)
{
    list_node_t *it = s->reqs.next;

    while (it != &s->reqs && s->n_failed > 0) {
        sched_req_t *rq = LIST_ENTRY(it, sched_req_t, node);
        it = it->next;
        if (rq->failed) {
            REQ_DEBUG(rq->r.id, "out of memory for a token message: request ends");
            req_end_error(s, rq, ST_ENOMEM);
            s->n_failed--;
        }
    }
    s->n_failed = 0;
}

void
sched_commit(sched_t *s, const sched_plan_t *plan, const smp_result_t *results)
{
    ASSERT_THREAD(ENGINE);
    bm_pool_step_end(s->pool); /* the forward has written the planned slots */
    for (int32_t r = 0; r < s->n_rows; r++) {
        sched_seq_t *q = s->rows_seq[r];
        /* A speculating row's drafts count once accepted (commit_spec). */
        q->n_computed += s->rows_new[r] - s->rows_draft[r];
        CHECK(q->n_computed <= q->n_tokens);
        if (s->cfg.sliding_window > 0) {
            /* The next query sits at context index n_computed and attends
             * to [n_computed - w + 1, n_computed]: blocks ending before
             * that are out of every later window. */
            int32_t out = (q->n_computed - s->cfg.sliding_window + 1) / (int32_t)s->block_size;
            uint32_t nb = 0;

            (void)bm_seq_table(s->pool, q->bm_id, &nb);
            if (out > (int32_t)nb - 2) {
                out = (int32_t)nb - 2;
            }
            if (out > (int32_t)bm_seq_released(s->pool, q->bm_id)) {
                CHECK(bm_seq_release_front(s->pool, q->bm_id, (uint32_t)out) == ST_OK);
            }
        }
        if (q->req->kv_window > 0 && q->n_computed > q->req->kv_sink + q->req->kv_window) {
            evict_window(s, q);
        }
        if (q->req->kv_score.kind != MDL_KVP_FULL) {
            score_evict(s, q);
        }
    }
    for (int32_t r = 0; r < s->n_rows; r++) {
        sched_seq_t *q = s->rows_seq[r];
        if (q->req->fork_pending && !q->req->failed && q->n_computed == q->n_tokens) {
            commit_fork(s, q);
        }
    }
    for (int32_t i = 0; i < plan->n_samples; i++) {
        sched_seq_t *q = plan->samples[i].seq;
        if (plan->samples[i].n_draft > 0) {
            commit_spec(s, q, &plan->samples[i], results + plan->samples[i].res);
        } else if (!q->done && !q->req->failed) {
            commit_token(s, q, &results[plan->samples[i].res]);
        }
    }
    if (s->n_failed > 0) {
        fail_marked(s);
    }
    reap_dead(s);
}

/* ---- stats and check ------------------------------------------------- */

void
sched_get_stats(const sched_t *s, sched_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->swapped = s->n_swapped;
    out->requests = s->n_reqs;
    out->preempt_swap = s->preempt_swap;
    out->preempt_recompute = s->preempt_recompute;
    out->prompt_tokens = s->prompt_tokens;
    out->generation_tokens = s->generation_tokens;
    out->steps = s->step_no;
}

void
sched_get_spec_stats(const sched_t *s, spec_stats_t *out)
{
    *out = s->spec_stats;
}

int
sched_get_tenant_stats(const sched_t *s, uint32_t tenant, sched_tenant_stats_t *out)
{
    const sched_tenant_t *t;

    if (tenant >= (uint32_t)s->cfg.n_tenants) {
        return ST_EINVAL;
    }
    t = &s->tenants[tenant];
    out->running = t->n_running;
    out->waiting = t->n_waiting;
    out->swapped = t->n_swapped;
    out->prompt_tokens = t->prompt_tokens;
    out->generation_tokens = t->generation_tokens;
    out->requests_finished = t->requests_finished;
    out->requests_rejected = t->requests_rejected;
    out->vtc = t->vtc;
    out->tpm_budget = t->tpm_budget;
    return ST_OK;
}

void
sched_check(const sched_t *s)
{
    uint32_t n_run = 0, slots = 0, n_swp = 0, n_wait = 0, n_reqs = 0;
    const list_node_t *it;

    LIST_FOREACH(it, &s->running)
    {
        const sched_seq_t *q = LIST_ENTRY(it, sched_seq_t, node);
        CHECK(q->state == SEQ_RUNNING && q->in_pool);
        CHECK(!bm_seq_is_swapped(s->pool, q->bm_id));
        CHECK((int32_t)bm_seq_len(s->pool, q->bm_id) == q->n_computed);
        n_run++;
        slots += seq_slots(q);
    }
    CHECK(n_run == s->n_running && slots == s->run_slots);
    CHECK(s->run_slots <= (uint32_t)s->cfg.max_num_seqs);
    LIST_FOREACH(it, &s->swapped)
    {
        const sched_seq_t *q = LIST_ENTRY(it, sched_seq_t, node);
        CHECK(q->state == SEQ_SWAPPED && q->in_pool && bm_seq_is_swapped(s->pool, q->bm_id));
        n_swp++;
    }
    CHECK(n_swp == s->n_swapped);
    for (int32_t u = 0; u < s->cfg.n_tenants; u++) {
        const sched_tenant_t *t = &s->tenants[u];
        uint32_t n = 0;
        LIST_FOREACH(it, &t->waiting)
        {
            const sched_seq_t *q = LIST_ENTRY(it, sched_seq_t, node);
            CHECK(q->state == SEQ_WAITING && !q->in_pool && q->n_computed == 0);
            CHECK(q->req->r.tenant == (uint32_t)u);
            if (it->next != &t->waiting) {
                CHECK(seq_cmp(q, LIST_ENTRY(it->next, sched_seq_t, node)) <= 0);
            }
            n++;
        }
        CHECK(n == t->n_waiting);
        n_wait += n;
    }
    CHECK(n_wait == s->n_waiting);
    LIST_FOREACH(it, &s->reqs)
    {
        const sched_req_t *rq = LIST_ENTRY(it, sched_req_t, node);
        int32_t live = 0;
        for (int32_t k = 0; k < rq->r.n; k++) {
            live += !rq->seqs[k].done;
        }
        CHECK(live == rq->n_live && live > 0);
        CHECK(ridx_get(&s->req_ids, rq->r.id) == rq);
        n_reqs++;
    }
    CHECK(n_reqs == s->n_reqs);
    CHECK(s->req_ids.n == s->n_reqs);
}
