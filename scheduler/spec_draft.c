/* spec_draft.c - the draft-model proposer and its rejection-sampling
 * verification (see spec_draft.h for the design).
 *
 * Thread: engine thread.
 */
#define LOG_MODULE "spec"

#include "scheduler/spec_draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"

struct spec_draft {
    mdl_model_t *model;
    mdl_runtime_t *rt;
    int32_t vocab;
    int32_t k;
    int32_t cap;        /* speculating samples per step at most */
    int32_t max_tokens; /* batch tokens at most */
    int32_t max_blocks; /* block-table width at most */
    /* batch being built */
    int32_t *tokens, *positions, *slots; /* [max_tokens] */
    int32_t *qstart;                     /* [max_seqs + 1] */
    int32_t *ctx;                        /* [max_seqs] */
    int32_t *tables;                     /* [cap][max_blocks] */
    int32_t *lrows;                      /* [max_seqs] */
    /* this step's speculating samples, e = 0 .. n_spec - 1 */
    int32_t n_spec;
    int32_t *e_of;   /* [max_seqs] sample -> e, or -1 */
    int32_t *sample; /* [cap] e -> sample */
    int32_t *prow;   /* [cap] plan batch row */
    int32_t *first;  /* [cap] plan token index of the pending token */
    int32_t *drafts; /* [cap][k] */
    int32_t *which;  /* [cap] e of each row of a one-token forward */
    float *q;        /* [cap][k][vocab] the draft's distributions */
    float *row;      /* [vocab] */
    float *p;        /* [vocab] */
    int32_t max_seqs;
    int32_t bs; /* block size */
    /* What the draft's KV holds (spec_draft.h, DESIGN): per block, the
     * leading slots [0, valid) hold the draft's KV of the tokens the
     * target's KV holds there. Device tier and swap tier. */
    int32_t n_blocks, n_swap;
    int32_t *valid;      /* [n_blocks] */
    int32_t *valid_swap; /* [n_swap] */
    /* per speculating sample e: the next position its catch-up writes,
     * the pending token's position */
    int32_t *from, *pend; /* [cap] */
    int64_t n_catchup;    /* tokens written by catch-ups (log, tests) */
    int64_t n_forwards;   /* the draft's forwards (log, tests) */
};

void
spec_draft_destroy(spec_draft_t *d)
{
    if (d == NULL) {
        return;
    }
    LOG_DEBUG("draft model: %lld forwards, %lld tokens written by catch-ups",
              (long long)d->n_forwards, (long long)d->n_catchup);
    mdl_runtime_destroy(d->rt);
    mdl_model_destroy(d->model);
    free(d->tokens);
    free(d->positions);
    free(d->slots);
    free(d->qstart);
    free(d->ctx);
    free(d->tables);
    free(d->lrows);
    free(d->e_of);
    free(d->sample);
    free(d->prow);
    free(d->first);
    free(d->drafts);
    free(d->which);
    free(d->q);
    free(d->row);
    free(d->p);
    free(d->valid);
    free(d->valid_swap);
    free(d->from);
    free(d->pend);
    free(d);
}

int
spec_draft_create(const mdl_model_t *target, const spec_config_t *sc,
                  const mdl_runtime_config_t *rc, int32_t max_num_seqs, int32_t max_model_len,
                  spec_draft_t **out, char *err, size_t errlen)
{
    spec_draft_t *d = xcalloc(1, sizeof(*d));
    mdl_runtime_config_t drc = *rc;
    char lerr[400] = "";
    int rc2;

    rc2 = mdl_model_load(sc->model, &d->model, lerr, sizeof(lerr));
    if (rc2 != ST_OK) {
        snprintf(err, errlen, "speculative config: draft model: %s", lerr);
        goto fail;
    }
    rc2 = mdl_model_vocab_match(target, d->model, lerr, sizeof(lerr));
    if (rc2 != ST_OK) {
        snprintf(err, errlen,
                 "speculative config: draft model %s: %s (a draft model needs the target's "
                 "tokenizer)",
                 sc->model, lerr);
        goto fail;
    }
    if (mdl_model_config(d->model)->max_pos < max_model_len) {
        snprintf(err, errlen,
                 "speculative config: draft model %s has a context of %d tokens, less than "
                 "max_model_len %d",
                 sc->model, mdl_model_config(d->model)->max_pos, max_model_len);
        rc2 = ST_EINVAL;
        goto fail;
    }
    /* Same blocks, swap tier and dtype: the target's block ids index it. */
    drc.tp_size = 1;
    rc2 = mdl_runtime_create(d->model, &drc, &d->rt, lerr, sizeof(lerr));
    if (rc2 != ST_OK) {
        snprintf(err, errlen, "speculative config: draft model %s: %s", sc->model, lerr);
        goto fail;
    }
    d->vocab = mdl_model_config(target)->vocab_size;
    d->k = sc->k;
    d->max_seqs = drc.max_num_seqs;
    d->cap = sc->max_batch > 0 && sc->max_batch < max_num_seqs ? sc->max_batch : max_num_seqs;
    d->max_tokens = drc.max_num_batched_tokens;
    d->max_blocks = drc.max_blocks_per_seq;
    d->tokens = xmalloc((size_t)d->max_tokens * sizeof(int32_t));
    d->positions = xmalloc((size_t)d->max_tokens * sizeof(int32_t));
    d->slots = xmalloc((size_t)d->max_tokens * sizeof(int32_t));
    d->qstart = xmalloc(((size_t)d->max_seqs + 1) * sizeof(int32_t));
    d->ctx = xmalloc((size_t)d->max_seqs * sizeof(int32_t));
    d->tables = xmalloc((size_t)d->cap * (size_t)d->max_blocks * sizeof(int32_t));
    d->lrows = xmalloc((size_t)d->max_seqs * sizeof(int32_t));
    d->e_of = xmalloc((size_t)d->max_seqs * sizeof(int32_t));
    d->sample = xmalloc((size_t)d->cap * sizeof(int32_t));
    d->prow = xmalloc((size_t)d->cap * sizeof(int32_t));
    d->first = xmalloc((size_t)d->cap * sizeof(int32_t));
    d->drafts = xmalloc((size_t)d->cap * (size_t)d->k * sizeof(int32_t));
    d->which = xmalloc((size_t)d->cap * sizeof(int32_t));
    d->q = xmalloc((size_t)d->cap * (size_t)d->k * (size_t)d->vocab * sizeof(float));
    d->row = xmalloc((size_t)d->vocab * sizeof(float));
    d->p = xmalloc((size_t)d->vocab * sizeof(float));
    d->bs = drc.block_size;
    d->n_blocks = drc.num_blocks;
    d->n_swap = drc.swap_blocks;
    d->valid = xcalloc((size_t)d->n_blocks, sizeof(int32_t));
    d->valid_swap = xcalloc((size_t)(d->n_swap > 0 ? d->n_swap : 1), sizeof(int32_t));
    d->from = xmalloc((size_t)d->cap * sizeof(int32_t));
    d->pend = xmalloc((size_t)d->cap * sizeof(int32_t));
    LOG_INFO("speculative decoding: draft model %s (%d layers, dim %d), k %d", sc->model,
             mdl_model_config(d->model)->n_layers, mdl_model_config(d->model)->dim, d->k);
    *out = d;
    return ST_OK;

fail:
    spec_draft_destroy(d);
    return rc2;
}

/* The plan batch row holding token index t. */
static int32_t
row_of(const mdl_batch_t *b, int32_t t)
{
    int32_t lo = 0, hi = b->n_seqs - 1;

    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (b->query_start[mid] <= t) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

static float *
q_at(spec_draft_t *d, int32_t e, int32_t j)
{
    return d->q + ((size_t)e * (size_t)d->k + (size_t)j) * (size_t)d->vocab;
}

/* Draws draft j (0-based) of speculating sample e from the draft's row,
 * processed as the target's row j will be. */
static int
draft_sample(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, smp_ctx_t *smp, int32_t e,
             int32_t j, const float *logits_row)
{
    int32_t i = d->sample[e], t;
    float *q = q_at(d, e, j);
    sched_sample_view_t v;
    int rc;

    memcpy(d->row, logits_row, (size_t)d->vocab * sizeof(float));
    sched_sample_view_at(s, plan, i, j, &v);
    sched_sample_mask_at(s, plan, i, j, d->row);
    rc = smp_probs(smp, v.params, d->row, v.history, v.n_hist, v.n_prompt, q);
    if (rc != ST_OK) {
        return rc;
    }
    t = smp_pick_probs(q, d->vocab, smp_rng_uniform(v.rng));
    if (t < 0) {
        return ST_EINVAL;
    }
    d->drafts[(size_t)e * (size_t)d->k + (size_t)j] = t;
    sched_set_draft(s, plan, i, j, t);
    return ST_OK;
}

/* Copies plan row r's block table into the draft's table row e. */
static void
copy_table(spec_draft_t *d, const mdl_batch_t *b, int32_t r, int32_t e)
{
    memcpy(d->tables + (size_t)e * (size_t)b->max_blocks, mdl_batch_table(b, r),
           (size_t)b->max_blocks * sizeof(int32_t));
}

/* A forward of n rows of one token each (tokens, positions, slots and
 * ctx filled by the caller; tables rows 0 .. n - 1, max_blocks apart),
 * with n_logits logits rows 0 .. n_logits - 1. */
static int
forward_singles(spec_draft_t *d, int32_t max_blocks, int32_t n, int32_t n_logits,
                const float **logits)
{
    mdl_batch_t b;

    for (int32_t r = 0; r <= n; r++) {
        d->qstart[r] = r;
    }
    for (int32_t r = 0; r < n_logits; r++) {
        d->lrows[r] = r;
    }
    memset(&b, 0, sizeof(b));
    b.n_tokens = n;
    b.tokens = d->tokens;
    b.positions = d->positions;
    b.slot_mapping = d->slots;
    b.n_seqs = n;
    b.query_start = d->qstart;
    b.context_len = d->ctx;
    b.block_tables = d->tables;
    b.max_blocks = max_blocks;
    b.logits_rows = d->lrows;
    b.n_logits = n_logits;
    d->n_forwards++;
    return mdl_forward(d->rt, &b, logits);
}

/* A write the target made (or makes this step) at slot `slot`: the
 * draft's KV there now holds the same token (mirrored) or not. Slots
 * after it in its block may hold anything (a sequence reads positions
 * below its context only, and every later one is written again first). */
static void
valid_write(spec_draft_t *d, int32_t slot, int mirrored)
{
    int32_t blk = slot / d->bs, off = slot % d->bs;

    if (slot < 0 || blk >= d->n_blocks) {
        return;
    }
    if (d->valid[blk] > off) {
        d->valid[blk] = off;
    }
    if (mirrored && d->valid[blk] == off) {
        d->valid[blk] = off + 1;
    }
}

int
spec_draft_kv_ops(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, const kv_op_t *ops,
                  int32_t n_ops)
{
    (void)s;
    (void)plan;
    /* The draft's bookkeeping follows the blocks' bytes. */
    for (int32_t i = 0; i < n_ops; i++) {
        const kv_op_t *o = &ops[i];

        switch (o->kind) {
        case KV_OP_COPY:
            d->valid[o->dst] = d->valid[o->src];
            break;
        case KV_OP_SWAP_OUT:
            d->valid_swap[o->dst] = d->valid[o->src];
            break;
        case KV_OP_SWAP_IN:
            d->valid[o->dst] = d->valid_swap[o->src];
            break;
        case KV_OP_DROP:
        case KV_OP_SHIFT:
            d->valid[o->src] = 0;
            break;
        case KV_OP_DROP_SWAP:
            d->valid_swap[o->src] = 0;
            break;
        case KV_OP_COPY_SLOT:
            valid_write(d, o->dst, 0);
            break;
        }
    }
    return n_ops > 0 ? mdl_runtime_kv_ops(d->rt, ops, n_ops) : ST_OK;
}

/* The first position below pend whose draft KV is not the target's,
 * walking the table (pend when there is none). */
static int32_t
catchup_from(const spec_draft_t *d, const int32_t *table, int32_t pend)
{
    for (int32_t p = 0; p < pend; p += d->bs) {
        int32_t v = d->valid[table[p / d->bs]];

        if (v < d->bs) {
            return p + v < pend ? p + v : pend;
        }
    }
    return pend;
}

int
spec_draft_propose(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, smp_ctx_t *smp)
{
    const mdl_batch_t *pb = &plan->batch;
    const float *logits = NULL;
    int32_t kmax = 0, n_left;
    int rc;

    d->n_spec = 0;
    for (int32_t i = 0; i < plan->n_samples; i++) {
        const sched_sample_t *sm = &plan->samples[i];

        d->e_of[i] = -1;
        if (sm->n_draft == 0) {
            continue;
        }
        CHECK(d->n_spec < d->cap && sm->n_draft <= d->k);
        int32_t e = d->n_spec++;
        d->e_of[i] = e;
        d->sample[e] = i;
        d->first[e] = pb->logits_rows[sm->row];
        d->prow[e] = row_of(pb, d->first[e]);
        /* A speculating row is its pending token, then its drafts. */
        CHECK(pb->query_start[d->prow[e]] == d->first[e] &&
              pb->query_start[d->prow[e] + 1] == d->first[e] + 1 + sm->n_draft);
        d->pend[e] = pb->positions[d->first[e]];
        d->from[e] = catchup_from(d, mdl_batch_table(pb, d->prow[e]), d->pend[e]);
        kmax = sm->n_draft > kmax ? sm->n_draft : kmax;
    }

    /* 1. The mirror, only of the speculating rows: each row's catch-up
     * (the positions from the first one whose draft KV is not the
     * target's, tokens from its history) and its pending token; chunks of
     * at most max_tokens, the rows that end in a chunk sampled after it. */
    n_left = d->n_spec;
    while (n_left > 0) {
        int32_t nt = 0, nr = 0, nl = 0;
        mdl_batch_t b;

        for (int32_t e = 0; e < d->n_spec && nt < d->max_tokens; e++) {
            const int32_t *table = mdl_batch_table(pb, d->prow[e]);
            sched_sample_view_t v;
            int32_t take;

            if (d->from[e] > d->pend[e]) {
                continue; /* done */
            }
            sched_sample_view(s, plan, d->sample[e], &v);
            CHECK(v.n_hist == d->pend[e] + 1); /* history index = position */
            take = d->pend[e] + 1 - d->from[e];
            take = take < d->max_tokens - nt ? take : d->max_tokens - nt;
            d->qstart[nr] = nt;
            for (int32_t p = d->from[e]; p < d->from[e] + take; p++) {
                d->tokens[nt] = v.history[p];
                d->positions[nt] = p;
                d->slots[nt] = table[p / d->bs] * d->bs + p % d->bs;
                nt++;
            }
            d->from[e] += take;
            d->ctx[nr] = d->from[e];
            copy_table(d, pb, d->prow[e], nr);
            if (d->from[e] > d->pend[e]) {
                d->which[nl] = e;
                d->lrows[nl++] = nt - 1; /* the pending token */
                n_left--;
            }
            nr++;
        }
        d->qstart[nr] = nt;
        memset(&b, 0, sizeof(b));
        b.n_tokens = nt;
        b.tokens = d->tokens;
        b.positions = d->positions;
        b.slot_mapping = d->slots;
        b.n_seqs = nr;
        b.query_start = d->qstart;
        b.context_len = d->ctx;
        b.block_tables = d->tables;
        b.max_blocks = pb->max_blocks;
        b.logits_rows = d->lrows;
        b.n_logits = nl;
        d->n_forwards++;
        rc = mdl_forward(d->rt, &b, &logits);
        if (rc != ST_OK) {
            return rc;
        }
        /* Catch-up rows: the draft's KV now holds the target's tokens;
         * the pending tokens count with the target's writes. */
        for (int32_t t = 0; t < nt; t++) {
            int32_t blk = d->slots[t] / d->bs, off = d->slots[t] % d->bs;

            if (d->valid[blk] == off) {
                d->valid[blk] = off + 1;
            }
        }
        d->n_catchup += nt - nl;
        for (int32_t r = 0; r < nl; r++) {
            rc = draft_sample(d, s, plan, smp, d->which[r], 0,
                              logits + (size_t)r * (size_t)d->vocab);
            if (rc != ST_OK) {
                return rc;
            }
        }
    }

    /* 2. Forwards 2 .. k: draft j - 1 of each row that has draft j. */
    for (int32_t j = 1; j < kmax; j++) {
        int32_t n = 0;

        for (int32_t e = 0; e < d->n_spec; e++) {
            const sched_sample_t *sm = &plan->samples[d->sample[e]];
            int32_t pos = pb->positions[d->first[e]];

            if (sm->n_draft <= j) {
                continue;
            }
            d->tokens[n] = d->drafts[(size_t)e * (size_t)d->k + (size_t)j - 1];
            d->positions[n] = pos + j;
            d->slots[n] = pb->slot_mapping[d->first[e] + j];
            d->ctx[n] = pos + j + 1;
            copy_table(d, pb, d->prow[e], n);
            d->which[n++] = e;
        }
        rc = forward_singles(d, pb->max_blocks, n, n, &logits);
        if (rc != ST_OK) {
            return rc;
        }
        for (int32_t r = 0; r < n; r++) {
            rc = draft_sample(d, s, plan, smp, d->which[r], j,
                              logits + (size_t)r * (size_t)d->vocab);
            if (rc != ST_OK) {
                return rc;
            }
        }
    }
    return ST_OK;
}

int
spec_draft_verify(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, int32_t i,
                  const float *logits, smp_ctx_t *smp, float *scratch, smp_result_t *out)
{
    const sched_sample_t *sm = &plan->samples[i];
    int32_t e = d->e_of[i];
    sched_sample_view_t v;
    int rc;

    CHECK(e >= 0);
    for (int32_t j = 0; j <= sm->n_draft; j++) {
        memcpy(scratch, logits + (size_t)(sm->row + j) * (size_t)d->vocab,
               (size_t)d->vocab * sizeof(float));
        sched_sample_view_at(s, plan, i, j, &v);
        sched_sample_mask_at(s, plan, i, j, scratch);
        if (j == sm->n_draft) {
            /* Every draft accepted: the bonus token, a plain sample. */
            rc = smp_sample(smp, v.params, v.rng, scratch, v.history, v.n_hist, v.n_prompt,
                            &out[j]);
            return rc != ST_OK ? rc : j + 1;
        }
        rc = smp_probs(smp, v.params, scratch, v.history, v.n_hist, v.n_prompt, d->p);
        if (rc != ST_OK) {
            return rc;
        }
        const float *q = q_at(d, e, j);
        int32_t t = d->drafts[(size_t)e * (size_t)d->k + (size_t)j];

        /* d->p becomes the residual when t is rejected. */
        int32_t c = spec_reject_sample(d->p, q, d->vocab, t, v.rng, d->p);
        if (c == t) {
            smp_result_of(smp, v.params, scratch, t, &out[j]);
            continue;
        }
        if (c < 0) {
            /* p == q up to rounding, so the rejection had probability 0:
             * anything but t from p (recomputed). */
            memcpy(scratch, logits + (size_t)(sm->row + j) * (size_t)d->vocab,
                   (size_t)d->vocab * sizeof(float));
            sched_sample_mask_at(s, plan, i, j, scratch);
            rc = smp_probs(smp, v.params, scratch, v.history, v.n_hist, v.n_prompt, d->p);
            if (rc != ST_OK) {
                return rc;
            }
            d->p[t] = 0.0f;
            c = smp_pick_probs(d->p, d->vocab, smp_rng_uniform(v.rng));
            if (c < 0) {
                return ST_EINVAL;
            }
        }
        smp_result_of(smp, v.params, scratch, c, &out[j]);
        return j + 1;
    }
    return sm->n_draft + 1; /* not reached */
}

int
spec_draft_finish(spec_draft_t *d, sched_t *s, const sched_plan_t *plan,
                  const smp_result_t *results)
{
    const mdl_batch_t *pb = &plan->batch;

    (void)s;
    (void)results;
    /* Every slot the target wrote: a speculating row's pending token and
     * drafts 1 .. n - 1 were written by the draft too, its last draft and
     * every other row's tokens were not. Rejected drafts' slots lie past
     * their sequence's context: nothing reads them before the target
     * writes them again. */
    for (int32_t t = 0; t < pb->n_tokens; t++) {
        valid_write(d, pb->slot_mapping[t], 0);
    }
    for (int32_t e = 0; e < d->n_spec; e++) {
        const sched_sample_t *sm = &plan->samples[d->sample[e]];

        for (int32_t j = 0; j < sm->n_draft; j++) {
            valid_write(d, pb->slot_mapping[d->first[e] + j], 1);
        }
    }
    return ST_OK;
}

void
spec_draft_counts(const spec_draft_t *d, int64_t *forwards, int64_t *catchup_tokens)
{
    *forwards = d->n_forwards;
    *catchup_tokens = d->n_catchup;
}
