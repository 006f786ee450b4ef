/* engine.c - the engine thread: inbox, step loop, outbox.
 *
 * DESIGN
 *   One thread owns the scheduler, the block manager, the model runtime
 *   and the sampler. Each iteration (llama.cpp start_loop, vLLM step):
 *
 *     take the inbox (block only when there is nothing to run)
 *     apply SUBMIT / CANCEL / STATS / SHUTDOWN      -> ERROR, FINISHED, STATS_REPLY
 *     sched_step: plan one varlen batch              (admit, reserve, preempt, swap)
 *     mdl_runtime_kv_ops: run queued copies / swaps  (before the forward)
 *     mdl_forward                                    -> one logits row per sampled seq
 *     smp_sample per choice (own seeded stream)
 *     sched_commit: append, stop checks, fork n > 1  -> DELTA, FINISHED
 *
 *   A CANCEL is applied at the iteration boundary: the choice's blocks are
 *   freed before the next plan. A failed forward fails every open request
 *   with ERROR and leaves the engine answering ERROR until SHUTDOWN.
 *
 * Thread: engine_* on the owner's thread; the loop on the engine thread.
 */
#define LOG_MODULE "engine"

#include "scheduler/engine.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_map.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "scheduler/embed.h"
#include "scheduler/engine_int.h"
#include "scheduler/kv_events.h"
#include "scheduler/kv_map.h"
#include "scheduler/sched.h"
#include "scheduler/spec.h"
#include "scheduler/spec_draft.h"

struct engine {
    eng_config_t cfg;
    const mdl_model_t *model;
    int32_t vocab;
    mdl_runtime_t *rt;
    bm_pool_t *pool;
    sched_t *sched;
    smp_ctx_t *smp;
    eng_embed_t *emb; /* embedding requests' hidden rows (embed.h) */
    spec_draft_t *draft; /* draft-model speculation (spec_draft.h), or NULL */
    chan_t inbox;
    chan_t *outbox;
    pthread_t thread;
    int started;
    atomic_int alive;
    int failed; /* status of the failure, 0 while healthy */
    int shutdown;
    int stalled;           /* the last plan ran nothing while work is queued */
    float *row;            /* [vocab] logits copy for a row that another sample reads too */
    int32_t *row_last;     /* [n_row_last] the last sample that reads each logits row */
    int32_t n_row_last;    /* max_num_seqs * (1 + spec k); rows past it are copied */
    smp_result_t *results; /* [max_num_seqs * (1 + spec k)] */
    uint32_t kv_used_peak;
    uint64_t requests_finished;
    uint64_t ns_plan, ns_forward, ns_sample, ns_commit;
    kve_t *kve;     /* KV-cache event publisher (kv_events.h), or NULL */
    msg_t *pending; /* outbox messages of this iteration, in order */
    msg_t **pending_tail;
    /* periodic summary */
    uint64_t log_steps;
    uint64_t n_forwards; /* forward passes run, for the test hook */
    uint64_t log_t0;
    uint64_t log_gen0, log_prompt0;
};

/* ---- messages -------------------------------------------------------- */

/* Outbox messages are collected during an iteration and sent together at
 * its end, so the loop thread wakes once per step rather than once per
 * token. */
static void
out_push(engine_t *e, msg_t *m)
{
    m->next = NULL;
    *e->pending_tail = m;
    e->pending_tail = &m->next;
}

static void
out_flush(engine_t *e)
{
    msg_t *m = e->pending;

    kve_flush(e->kve); /* this iteration's KV-cache events, as one batch */

    e->pending = NULL;
    e->pending_tail = &e->pending;
    /* One lock and at most one wake-up per step, not one per message. */
    chan_send_list(e->outbox, m);
}

/* Turns a SUBMIT message (its prompt and bias already released or handed
 * on) into the ERROR for its request and queues it: answering never
 * allocates (proto.h). */
static void answer_error(engine_t *e, eng_msg_submit_t *sm, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
answer_error(engine_t *e, eng_msg_submit_t *sm, int status, const char *fmt, ...)
{
    eng_msg_error_t *m = &sm->as_error;
    uint64_t id = sm->req.id;
    va_list ap;

    free(sm->req.prompt);
    free((void *)sm->req.sampling.bias);
    gr_grammar_destroy(sm->req.grammar);
    memset(m, 0, sizeof(*m));
    m->hdr.type = ENG_MSG_ERROR;
    m->id = id;
    m->status = status;
    va_start(ap, fmt);
    vsnprintf(m->message, sizeof(m->message), fmt, ap);
    va_end(ap);
    out_push(e, &m->hdr);
}

/* What an accepted request's last words need, allocated at submit (the
 * scheduler's udata for it): one FINISHED per choice, and its own SUBMIT
 * message as the spare for an ERROR. Taken as they are used; the rest is
 * freed with the request (reserve_free). */
typedef struct eng_reserve {
    eng_msg_submit_t *spare;
    eng_msg_embed_t *embed; /* an embedding request's answer (embed.h), or NULL */
    int32_t pooling;        /* eng_request_t.pooling */
    int32_t n;
    eng_msg_finished_t *fin[]; /* [n] */
} eng_reserve_t;

static void
reserve_free(void *udata)
{
    eng_reserve_t *rs = udata;

    if (rs == NULL) {
        return;
    }
    for (int32_t k = 0; k < rs->n; k++) {
        free(rs->fin[k]);
    }
    if (rs->spare != NULL) {
        eng_msg_free(&rs->spare->hdr);
    }
    free(rs->embed);
    free(rs);
}

/* NULL when an allocation fails (nothing left allocated; the SUBMIT
 * message stays with the caller). */
static eng_reserve_t *
reserve_new(eng_msg_submit_t *sm)
{
    int32_t n = sm->req.n;
    eng_reserve_t *rs = xmalloc_try(sizeof(*rs) + (size_t)n * sizeof(rs->fin[0]));

    if (rs == NULL) {
        return NULL;
    }
    rs->spare = NULL;
    rs->embed = NULL;
    rs->pooling = sm->req.pooling;
    rs->n = 0;
    for (int32_t k = 0; k < n; k++) {
        rs->fin[k] = xcalloc_try(1, sizeof(*rs->fin[k]));
        if (rs->fin[k] == NULL) {
            reserve_free(rs);
            return NULL;
        }
        rs->n = k + 1;
    }
    return rs;
}

/* The EMBED message of a request's reserve (eng__embed_plan's view). */
static eng_msg_embed_t *
reserve_embed(void *udata)
{
    return udata != NULL ? ((eng_reserve_t *)udata)->embed : NULL;
}

/* Scheduler events become outbox messages. Only a DELTA allocates; when
 * it cannot, the scheduler ends that request with ERROR ST_ENOMEM. */
static int
engine_emit(void *arg, const sched_event_t *ev)
{
    engine_t *e = arg;
    eng_reserve_t *rs = ev->udata;

    switch (ev->kind) {
    case SCHED_EV_TOKEN: {
        if (rs != NULL && rs->pooling != ENG_POOL_NONE) {
            break; /* an embedding request's one sampled token is not said */
        }
        eng_msg_delta_t *m = xmalloc_try(sizeof(*m));
        if (m == NULL) {
            return ST_ENOMEM;
        }
        m->hdr.type = ENG_MSG_DELTA;
        m->id = ev->id;
        m->choice = ev->choice;
        m->n_tokens = 1;
        m->tok[0] = *ev->tok;
        out_push(e, &m->hdr);
        break;
    }
    case SCHED_EV_FINISHED: {
        eng_msg_finished_t *m;
        CHECK(rs != NULL && ev->choice >= 0 && ev->choice < rs->n && rs->fin[ev->choice] != NULL);
        if (rs->embed != NULL) {
            eng__embed_finish(rs->embed, rs->pooling);
            out_push(e, &rs->embed->hdr);
            rs->embed = NULL;
        }
        m = rs->fin[ev->choice];
        rs->fin[ev->choice] = NULL;
        m->hdr.type = ENG_MSG_FINISHED;
        m->id = ev->id;
        m->choice = ev->choice;
        m->reason = ev->reason;
        m->prompt_tokens = ev->prompt_tokens;
        m->completion_tokens = ev->completion_tokens;
        m->cached_tokens = ev->cached_tokens;
        m->stop_token = ev->stop_token;
        e->requests_finished++;
        out_push(e, &m->hdr);
        break;
    }
    case SCHED_EV_ERROR:
        CHECK(rs != NULL && rs->spare != NULL);
        answer_error(e, rs->spare, ev->status, "%s",
                     ev->status == ST_ENOMEM ? "out of memory" : st_str(ev->status));
        rs->spare = NULL;
        break;
    }
    return ST_OK;
}

void
eng__stats(engine_t *e, eng_stats_t *st)
{
    sched_stats_t ss;
    bm_stats_t bs;

    memset(st, 0, sizeof(*st));
    sched_get_stats(e->sched, &ss);
    bm_pool_stats(e->pool, &bs);
    st->running = ss.running;
    st->waiting = ss.waiting;
    st->swapped = ss.swapped;
    st->kv_total = bs.dev_total;
    st->kv_used = bs.dev_used;
    st->kv_cached = bs.dev_cached;
    st->swap_total = bs.cpu_total;
    st->swap_used = bs.cpu_used;
    st->swap_cached = bs.cpu_cached;
    st->prefix_queries = bs.prefix_queries;
    st->prefix_hits = bs.prefix_hits;
    st->preempt_swap = ss.preempt_swap;
    st->preempt_recompute = ss.preempt_recompute;
    st->prompt_tokens = ss.prompt_tokens;
    st->generation_tokens = ss.generation_tokens;
    st->steps = ss.steps;
    st->n_tenants = (uint32_t)e->cfg.n_tenants;
    {
        const mdl_config_t *mc = mdl_model_config(e->model);
        mdl_kv_dtype_t dt = e->cfg.rt.kv_dtype;

        if (dt == MDL_KV_AUTO) {
            dt = e->cfg.rt.device != NULL && strcmp(e->cfg.rt.device, "cuda") == 0 ? MDL_KV_BF16
                                                                                   : MDL_KV_F32;
        }
        snprintf(st->kv_dtype, sizeof(st->kv_dtype), "%s", mdl_kv_dtype_name(dt));
        st->kv_block_tokens = (uint32_t)e->cfg.rt.block_size;
        st->kv_block_bytes = mdl_kv_block_bytes(mc, e->cfg.rt.block_size, dt);
        st->kv_block_bytes_f32 = mdl_kv_block_bytes(mc, e->cfg.rt.block_size, MDL_KV_F32);
    }
    for (int32_t t = 0; t < e->cfg.n_tenants; t++) {
        sched_tenant_stats_t ts;
        eng_tenant_stats_t *o = &st->tenant[t];
        sched_get_tenant_stats(e->sched, (uint32_t)t, &ts);
        o->running = ts.running;
        o->waiting = ts.waiting;
        o->swapped = ts.swapped;
        o->kv_blocks = bm_tenant_blocks(e->pool, (uint32_t)t);
        o->prompt_tokens = ts.prompt_tokens;
        o->generation_tokens = ts.generation_tokens;
        o->requests_finished = ts.requests_finished;
        o->requests_rejected = ts.requests_rejected;
        o->vtc = ts.vtc;
    }
    st->kv_used_peak = e->kv_used_peak;
    st->requests_finished = e->requests_finished;
    st->ns_plan = e->ns_plan;
    st->ns_forward = e->ns_forward;
    st->ns_sample = e->ns_sample;
    st->ns_commit = e->ns_commit;
    kve_counters(e->kve, &st->kv_events_published, &st->kv_events_dropped);
    st->kv_events_on = e->kve != NULL;
    st->spec_k = e->cfg.spec.method != SPEC_OFF ? e->cfg.spec.k : 0;
    sched_get_spec_stats(e->sched, &st->spec);
}

/* spec_verify_sample's row sampler: row j of sample i as a plain decode
 * after drafts 0 .. j - 1. */
typedef struct spec_arg {
    engine_t *e;
    const sched_plan_t *plan;
    int32_t i;
} spec_arg_t;

static int
spec_row(void *arg, int32_t j, float *logits_row, smp_result_t *out)
{
    spec_arg_t *a = arg;
    sched_sample_view_t v;

    sched_sample_view_at(a->e->sched, a->plan, a->i, j, &v);
    sched_sample_mask_at(a->e->sched, a->plan, a->i, j, logits_row);
    return smp_sample(a->e->smp, v.params, v.rng, logits_row, v.history, v.n_hist, v.n_prompt,
                      out);
}

static int
spec_sample_rows(engine_t *e, const sched_plan_t *plan, int32_t i, const float *logits)
{
    const sched_sample_t *sm = &plan->samples[i];
    spec_arg_t a = {.e = e, .plan = plan, .i = i};
    int32_t n = spec_verify_sample(logits + (size_t)sm->row * (size_t)e->vocab, e->vocab,
                                   sm->draft, sm->n_draft, e->row, spec_row, &a,
                                   e->results + sm->res);

    return n < 0 ? n : ST_OK;
}

/* Checks what the sampler would otherwise reject mid-step. */
static int
check_sampling(const engine_t *e, const eng_request_t *r)
{
    const smp_params_t *p = &r->sampling;

    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0) ||
        !(p->min_p <= 1) || !(p->repetition_penalty > 0) || p->n_logprobs < 0 ||
        p->n_logprobs > SMP_MAX_LOGPROBS || p->n_bias < 0) {
        return ST_EINVAL;
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias == NULL || p->bias[i].id < 0 || p->bias[i].id >= e->vocab) {
            return ST_EINVAL;
        }
    }
    return ST_OK;
}

/* Takes m: it becomes the request's spare (accepted) or its ERROR. */
static void
apply_submit(engine_t *e, eng_msg_submit_t *m)
{
    eng_request_t *r = &m->req;
    eng_reserve_t *rs;
    int rc;

    if (e->failed != 0 || e->shutdown) {
        answer_error(e, m, e->failed != 0 ? e->failed : ST_ESHUTDOWN, "engine %s",
                     e->failed != 0 ? "failed" : "shutting down");
        return;
    }
    rc = check_sampling(e, r);
    if (rc != ST_OK) {
        answer_error(e, m, rc, "invalid sampling parameters");
        return;
    }
    if (r->n < 1 || r->n > e->cfg.max_num_seqs) {
        /* Checked before the reserve is sized by it (sched_submit would
         * refuse it too). */
        answer_error(e, m, ST_EINVAL, "n = %d is outside 1..max_num_seqs = %d", r->n,
                     e->cfg.max_num_seqs);
        return;
    }
    if (r->t_arrival_ns == 0) {
        r->t_arrival_ns = now_ns();
    }
    rs = reserve_new(m);
    if (rs == NULL) {
        REQ_DEBUG(r->id, "refused: out of memory");
        answer_error(e, m, ST_ENOMEM, "out of memory");
        return;
    }
    rc = eng__embed_submit(e->emb, r, &rs->embed);
    if (rc != ST_OK) {
        reserve_free(rs);
        answer_error(e, m, rc, "%s",
                     rc == ST_EUNSUPPORTED ? "embeddings need the model's hidden states, which "
                                             "this backend does not give"
                                           : "invalid embedding request");
        return;
    }
    rc = sched_submit(e->sched, r, rs);
    if (rc != ST_OK) {
        REQ_DEBUG(r->id, "refused: %s: %s", st_str(rc), sched_last_error(e->sched));
        reserve_free(rs); /* spare still NULL: m stays here */
        answer_error(e, m, rc, "%s", sched_last_error(e->sched));
        return;
    }
    rs->spare = m; /* prompt and bias now belong to the scheduler */
}

/* Applies a list of inbox messages in order; frees every one. */
static void
engine_apply(engine_t *e, msg_t *list)
{
    while (list != NULL) {
        msg_t *m = list;
        list = m->next;
        m->next = NULL;

        switch (m->type) {
        case ENG_MSG_SUBMIT:
            apply_submit(e, (eng_msg_submit_t *)m);
            continue; /* ownership passed on */
        case ENG_MSG_CANCEL: {
            eng_msg_cancel_t *c = (eng_msg_cancel_t *)m;
            (void)sched_cancel(e->sched, c->id, c->choice, c->as_stop);
            break;
        }
        case ENG_MSG_STATS: {
            eng_msg_stats_t *sm = (eng_msg_stats_t *)m;
            eng__stats(e, &sm->stats);
            sm->hdr.type = ENG_MSG_STATS_REPLY;
            out_push(e, &sm->hdr);
            continue; /* ownership passed to the outbox */
        }
        case ENG_MSG_ADMIN: { /* the web console (kv_map.h), between steps */
            eng_msg_admin_t *am = (eng_msg_admin_t *)m;
            eng__stats(e, &am->stats);
            am->step = am->stats.steps;
            if (am->op == ENG_ADMIN_STATS) {
                am->buf = NULL;
                am->status = ST_OK;
            } else {
                eng_kv_admin(am, e->pool);
            }
            am->hdr.type = ENG_MSG_ADMIN_REPLY;
            out_push(e, &am->hdr);
            continue;
        }
        case ENG_MSG_SHUTDOWN:
            e->shutdown = 1;
            break;
        default:
            LOG_WARN("unexpected message type %d in the inbox", m->type);
            break;
        }
        eng_msg_free(m);
    }
}

static void
engine_fail(engine_t *e, int status, const char *what)
{
    LOG_ERROR("%s failed: %s; failing every open request", what, st_str(status));
    e->failed = status;
    atomic_store(&e->alive, 0);
    sched_abort_all(e->sched, status);
    bm_pool_ops_clear(e->pool);
}

static void
log_summary(engine_t *e)
{
    eng_stats_t st;
    uint64_t now = now_ns();
    double dt = (double)(now - e->log_t0) * 1e-9;

    eng__stats(e, &st);
    if (dt > 0) {
        LOG_INFO("steps=%llu running=%u waiting=%u swapped=%u prompt_tok/s=%.1f gen_tok/s=%.1f "
                 "kv=%u/%u (cached %u) swap=%u/%u preempt swap=%llu recompute=%llu",
                 (unsigned long long)st.steps, st.running, st.waiting, st.swapped,
                 (double)(st.prompt_tokens - e->log_prompt0) / dt,
                 (double)(st.generation_tokens - e->log_gen0) / dt, st.kv_used, st.kv_total,
                 st.kv_cached, st.swap_used, st.swap_total, (unsigned long long)st.preempt_swap,
                 (unsigned long long)st.preempt_recompute);
    }
    e->log_t0 = now;
    e->log_gen0 = st.generation_tokens;
    e->log_prompt0 = st.prompt_tokens;
}

/* Plans and runs one step. 1 when a forward ran. */
static int
engine_step(engine_t *e)
{
    sched_plan_t plan;
    const kv_op_t *ops;
    const float *logits = NULL;
    uint32_t n_ops = 0;
    uint64_t t0 = now_ns(), t1, t2, t3;
    int rc;

    sched_set_clock(e->sched, t0);
    sched_step(e->sched, &plan);
    ops = bm_pool_ops(e->pool, &n_ops);
    rc = n_ops > 0 ? mdl_runtime_kv_ops(e->rt, ops, (int32_t)n_ops) : ST_OK;
    if (rc == ST_OK && e->draft != NULL) {
        rc = spec_draft_kv_ops(e->draft, e->sched, &plan, ops, (int32_t)n_ops); /* same ids */
    }
    bm_pool_ops_clear(e->pool); /* every step (blockmgr's step contract) */
    if (rc != ST_OK) {
        engine_fail(e, rc, "KV block copy");
        return 0;
    }
    t1 = now_ns();
    e->ns_plan += t1 - t0;
    if (plan.batch.n_tokens == 0) {
        e->stalled = !sched_idle(e->sched);
        return 0;
    }
    e->stalled = 0;

    eng__embed_plan(e->emb, e->sched, &plan, reserve_embed);
    rc = e->draft != NULL ? spec_draft_propose(e->draft, e->sched, &plan, e->smp) : ST_OK;
    if (rc == ST_OK) {
        rc = mdl_forward(e->rt, &plan.batch, &logits);
    }
    if (e->cfg.test_fail_forward_at > 0 &&
        ++e->n_forwards == (uint64_t)e->cfg.test_fail_forward_at) {
        rc = -EIO; /* injected by the test hook: a device failure */
    }
    if (rc != ST_OK) {
        engine_fail(e, rc, "forward");
        return 0;
    }
    if (e->cfg.test_step_delay_ms > 0) {
        usleep((useconds_t)e->cfg.test_step_delay_ms * 1000); /* test hook */
    }
    if (plan.batch.n_hidden > 0) {
        eng__embed_collect(e->emb, mdl_runtime_hidden(e->rt));
    }
    t2 = now_ns();
    e->ns_forward += t2 - t1;
    for (int32_t i = 0; i < plan.n_samples; i++) { /* rows read by sample i: row .. + n_draft */
        for (int32_t j = 0; j <= plan.samples[i].n_draft; j++) {
            if (plan.samples[i].row + j < e->n_row_last) {
                e->row_last[plan.samples[i].row + j] = i;
            }
        }
    }
    for (int32_t i = 0; i < plan.n_samples; i++) {
        sched_sample_view_t v;
        if (plan.samples[i].n_draft > 0) {
            rc = e->draft != NULL ? spec_draft_verify(e->draft, e->sched, &plan, i, logits, e->smp,
                                                      e->row, e->results + plan.samples[i].res)
                                  : spec_sample_rows(e, &plan, i, logits);
            rc = rc < 0 ? rc : ST_OK;
            if (rc != ST_OK) {
                engine_fail(e, rc, "sampling");
                return 0;
            }
            continue;
        }
        /* In place on the runtime's row (mdl_forward lets the caller
         * overwrite its rows) unless a later sample reads it too: the
         * n > 1 choices' first samples share their prompt's row. */
        float *row = (float *)logits + (size_t)plan.samples[i].row * (size_t)e->vocab;
        if (plan.samples[i].row >= e->n_row_last || e->row_last[plan.samples[i].row] != i) {
            memcpy(e->row, row, (size_t)e->vocab * sizeof(float));
            row = e->row;
        }
        sched_sample_view(e->sched, &plan, i, &v);
        sched_sample_mask(e->sched, &plan, i, row);
        rc = smp_sample(e->smp, v.params, v.rng, row, v.history, v.n_hist, v.n_prompt,
                        &e->results[plan.samples[i].res]);
        if (rc != ST_OK) {
            engine_fail(e, rc, "sampling");
            return 0;
        }
    }
    if (e->draft != NULL) {
        rc = spec_draft_finish(e->draft, e->sched, &plan, e->results);
        if (rc != ST_OK) {
            engine_fail(e, rc, "draft forward");
            return 0;
        }
    }
    t3 = now_ns();
    e->ns_sample += t3 - t2;
    sched_commit(e->sched, &plan, e->results);
    e->ns_commit += now_ns() - t3;

    {
        bm_stats_t bs;
        bm_pool_stats(e->pool, &bs);
        if (bs.dev_used > e->kv_used_peak) {
            e->kv_used_peak = bs.dev_used;
        }
    }
    if (e->cfg.log_every_steps > 0 && ++e->log_steps % (uint64_t)e->cfg.log_every_steps == 0) {
        log_summary(e);
    }
    return 1;
}

int
eng__iterate(engine_t *e, int wait_ms)
{
    msg_t *in;
    int rc;

    ASSERT_THREAD(ENGINE);
    if (e->failed != 0 || sched_idle(e->sched)) {
        in = chan_wait_all(&e->inbox, wait_ms);
    } else if (e->stalled) {
        in = chan_wait_all(&e->inbox, 1); /* waiting on nothing but time */
    } else {
        in = chan_take_all(&e->inbox);
    }
    engine_apply(e, in);
    if (e->shutdown) {
        sched_abort_all(e->sched, ST_ESHUTDOWN);
        out_flush(e);
        return ST_ESHUTDOWN;
    }
    if (e->failed != 0 || sched_idle(e->sched)) {
        out_flush(e);
        return 0;
    }
    rc = engine_step(e);
    out_flush(e);
    return rc;
}

static void *
engine_main(void *arg)
{
    engine_t *e = arg;

    thread_set_role(THREAD_ENGINE);
    /* Its own fault-injection domain (common/xmalloc.h): deterministic
     * site counts while the loop allocates for the same request. */
    xmalloc_set_thread_domain(XMALLOC_DOMAIN_ENGINE);
    e->log_t0 = now_ns();
    while (eng__iterate(e, -1) != ST_ESHUTDOWN) {
    }
    atomic_store(&e->alive, 0);
    return NULL;
}

sched_t *
eng__sched(engine_t *e)
{
    return e->sched;
}

bm_pool_t *
eng__pool(engine_t *e)
{
    return e->pool;
}

struct spec_draft *
eng__draft(engine_t *e)
{
    return e->draft;
}

/* ---- lifecycle ------------------------------------------------------- */

/* The scheduler's view of the runtime's attention mass (H2O / SnapKV):
 * plain numbers, as the logits. */
static int
eng_kv_mass(void *arg, const int32_t *slots, int32_t n, float *out)
{
    return mdl_runtime_kv_mass(arg, slots, n, out);
}

int
engine_create(const eng_config_t *cfg, const mdl_model_t *model, chan_t *outbox, engine_t **out,
              char *err, size_t errlen)
{
    const mdl_config_t *mc = mdl_model_config(model);
    engine_t *e;
    sched_config_t sc;
    bm_config_t bc;
    int rc;

    e = xcalloc(1, sizeof(*e));
    e->cfg = *cfg;
    e->model = model;
    e->outbox = outbox;
    e->pending_tail = &e->pending;
    e->vocab = mc->vocab_size;
    chan_init(&e->inbox, NULL, NULL);

    /* Defaults for zeros, and the model's limits. */
    eng_config_t *c = &e->cfg;
    if (c->rt.block_size <= 0) {
        c->rt.block_size = 16;
    }
    if (c->max_model_len <= 0 || c->max_model_len > mc->max_pos) {
        c->max_model_len = mc->max_pos;
    }
    if (c->max_num_seqs <= 0) {
        c->max_num_seqs = 256;
    }
    if (c->max_num_batched_tokens <= 0) {
        c->max_num_batched_tokens = c->max_model_len > 2048 ? c->max_model_len : 2048;
    }
    c->rt.max_num_seqs = c->max_num_seqs;
    if (c->spec.method != SPEC_OFF) {
        /* The runtime sizes its logits rows by max_num_seqs: a
         * speculating sequence has 1 + k of them, and at most max_batch
         * sequences speculate in a step. */
        c->rt.max_num_seqs = spec_logits_rows(&c->spec, c->max_num_seqs);
        c->rt.spec_k = c->spec.k; /* verification steps: graphs on cuda */
    }
    c->rt.max_num_batched_tokens = c->max_num_batched_tokens;
    c->rt.max_blocks_per_seq = (c->max_model_len + c->rt.block_size - 1) / c->rt.block_size;
    if (c->rt.num_blocks <= 0) {
        c->rt.num_blocks = c->max_num_seqs * c->rt.max_blocks_per_seq + 1;
    }
    if (c->rt.swap_blocks < 0) {
        c->rt.swap_blocks = 0;
    }
    if (c->rt.tp_size <= 0) {
        c->rt.tp_size = 1;
    }
    if (c->n_tenants <= 0) {
        c->n_tenants = 1;
        memset(&c->tenants[0], 0, sizeof(c->tenants[0]));
        snprintf(c->tenants[0].name, sizeof(c->tenants[0].name), "default");
    }
    if (c->n_tenants > ENG_MAX_TENANTS) {
        snprintf(err, errlen, "too many tenants (%d > %d)", c->n_tenants, ENG_MAX_TENANTS);
        rc = ST_EINVAL;
        goto fail;
    }
    for (int32_t t = 0; t < c->n_tenants; t++) {
        if (!(c->tenants[t].weight > 0)) {
            c->tenants[t].weight = 1.0;
        }
        if (!(c->tenants[t].max_kv_share > 0) || c->tenants[t].max_kv_share > 1) {
            c->tenants[t].max_kv_share = 1.0;
        }
        if (c->tenants[t].tokens_per_minute < 0) {
            c->tenants[t].tokens_per_minute = 0;
        }
    }

    /* H2O / SnapKV requests need the attention mass beside the KV: the
     * cpu backend keeps it for an f32 cache, cuda for f16 / bf16 (1 float
     * per token, layer and KV head), so any request may choose them. */
    c->rt.kv_mass = mdl_kv_mass_fits(c->rt.device, c->rt.kv_dtype);
    rc = mdl_runtime_create(model, &c->rt, &e->rt, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    if (c->spec.method == SPEC_DRAFT_MODEL) {
        rc = spec_draft_create(model, &c->spec, &c->rt, c->max_num_seqs, c->max_model_len,
                               &e->draft, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
    }

    memset(&bc, 0, sizeof(bc));
    bc.block_size = (uint32_t)c->rt.block_size;
    bc.num_blocks = (uint32_t)c->rt.num_blocks;
    bc.swap_blocks = (uint32_t)c->rt.swap_blocks;
    bc.prefix_caching = c->prefix_caching;
    bc.watermark = c->watermark;
    bc.drop_ops = 1; /* quantized KV caches free a dropped block's residual */
    rc = bm_pool_create(&bc, &e->pool);
    if (rc != ST_OK) {
        snprintf(err, errlen, "KV block pool: %s (num_blocks %d, block_size %d)", st_str(rc),
                 c->rt.num_blocks, c->rt.block_size);
        goto fail;
    }
    if (c->kv_events_config != NULL && c->kv_events_config[0] != '\0') {
        rc = kve_create(c->kv_events_config, bc.block_size, &e->kve, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
        if (e->kve != NULL) {
            bm_pool_set_event_hook(e->pool, kve_on_event, e->kve);
        }
    }
    if (c->kv_map_tokens) {
        bm_pool_keep_tokens(e->pool);
    }
    for (int32_t t = 0; t < c->n_tenants; t++) {
        const char *salt = c->tenants[t].salt[0] != '\0' ? c->tenants[t].salt : c->tenants[t].name;
        if (salt[0] != '\0') {
            rc = bm_tenant_set_salt(e->pool, (uint32_t)t, salt, strnlen(salt, 64));
            if (rc != ST_OK) {
                snprintf(err, errlen, "tenant %d salt: %s", t, st_str(rc));
                goto fail;
            }
        }
    }

    memset(&sc, 0, sizeof(sc));
    sc.max_num_seqs = c->max_num_seqs;
    sc.max_num_batched_tokens = c->max_num_batched_tokens;
    sc.max_model_len = c->max_model_len;
    sc.vocab_size = mc->vocab_size;
    sc.prefix_caching = c->prefix_caching;
    sc.sliding_window = mc->sliding_window;
    sc.kv_sink = c->kv_sink;
    sc.kv_window = c->kv_window;
    sc.kv_policy_ok = c->rt.device == NULL || strcmp(c->rt.device, "cpu") == 0 ||
                      strcmp(c->rt.device, "cuda") == 0; /* any tp: both re-rotate KV */
    sc.kv_score = c->kv_score;
    if (c->rt.kv_mass) {
        sc.kv_mass = eng_kv_mass;
        sc.kv_mass_arg = e->rt;
        sc.kv_mass_heads = mdl_runtime_kv_mass_heads(e->rt);
    }
    sc.n_eos = mc->n_eos;
    memcpy(sc.eos_ids, mc->eos_ids, sizeof(sc.eos_ids));
    sc.n_tenants = c->n_tenants;
    sc.udata_free = reserve_free;
    sc.spec = c->spec;
    sc.vtc = c->vtc;
    memcpy(sc.tenants, c->tenants, sizeof(sc.tenants));
    rc = sched_create(&sc, e->pool, engine_emit, e, &e->sched);
    if (rc != ST_OK) {
        snprintf(err, errlen, "scheduler: %s", st_str(rc));
        goto fail;
    }
    rc = smp_ctx_create(mc->vocab_size, &e->smp);
    if (rc != ST_OK) {
        snprintf(err, errlen, "sampler: %s", st_str(rc));
        goto fail;
    }
    e->row = xmalloc((size_t)mc->vocab_size * sizeof(float));
    e->emb = eng__embed_create(c->max_num_batched_tokens, mc->dim, mdl_runtime_has_hidden(e->rt));
    e->results = xcalloc((size_t)c->max_num_seqs * (size_t)(1 + c->spec.k), sizeof(*e->results));
    e->n_row_last = c->max_num_seqs * (1 + c->spec.k);
    e->row_last = xcalloc((size_t)e->n_row_last, sizeof(*e->row_last));
    e->log_t0 = now_ns();
    atomic_store(&e->alive, 1);
    LOG_INFO("engine: %d KV blocks of %d tokens, %d swap blocks, max_num_seqs %d, "
             "max_num_batched_tokens %d, max_model_len %d, prefix caching %s, %d tenant(s)",
             c->rt.num_blocks, c->rt.block_size, c->rt.swap_blocks, c->max_num_seqs,
             c->max_num_batched_tokens, c->max_model_len, c->prefix_caching ? "on" : "off",
             c->n_tenants);
    *out = e;
    return ST_OK;

fail:
    engine_destroy(e);
    return rc;
}

int
engine_start(engine_t *e)
{
    int rc;

    if (e->started) {
        return ST_EINVAL;
    }
    rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc != 0) {
        return -rc;
    }
    e->started = 1;
    return ST_OK;
}

chan_t *
engine_inbox(engine_t *e)
{
    return &e->inbox;
}

void
engine_stop(engine_t *e)
{
    msg_t *m;

    if (e == NULL) {
        return;
    }
    if (e->started) {
        m = xcalloc(1, sizeof(*m));
        m->type = ENG_MSG_SHUTDOWN;
        chan_send(&e->inbox, m);
        pthread_join(e->thread, NULL);
        e->started = 0;
    } else if (e->sched != NULL && !e->shutdown) {
        /* Never started (or driven by eng__iterate): answer what is queued. */
        engine_apply(e, chan_take_all(&e->inbox));
        e->shutdown = 1;
        sched_abort_all(e->sched, ST_ESHUTDOWN);
        out_flush(e);
    }
    atomic_store(&e->alive, 0);
}

void
engine_destroy(engine_t *e)
{
    msg_t *m;

    if (e == NULL) {
        return;
    }
    if (e->started) {
        engine_stop(e);
    }
    while (e->pending != NULL) {
        m = e->pending;
        e->pending = m->next;
        eng_msg_free(m);
    }
    m = chan_take_all(&e->inbox);
    while (m != NULL) {
        msg_t *next = m->next;
        eng_msg_free(m);
        m = next;
    }
    sched_destroy(e->sched);
    kve_flush(e->kve);
    bm_pool_destroy(e->pool);
    kve_destroy(e->kve);
    spec_draft_destroy(e->draft);
    mdl_runtime_destroy(e->rt);
    smp_ctx_destroy(e->smp);
    eng__embed_destroy(e->emb);
    free(e->row);
    free(e->row_last);
    free(e->results);
    chan_fini(&e->inbox);
    free(e);
}

int
engine_alive(const engine_t *e)
{
    return atomic_load(&((engine_t *)e)->alive);
}
