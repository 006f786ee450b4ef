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

/* One catch-up: token at position pos of a sequence (the choice id /
 * choice of sched seq) whose slot then was slot. */
typedef struct spec_catchup {
    const sched_seq_t *seq;
    uint64_t id;
    int32_t choice;
    int32_t pos, token, slot;
} spec_catchup_t;

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
    int32_t *row_draft;                  /* [max_seqs] drafts of each plan row */
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
    /* Catch-ups (spec_draft.h, step 3): the last draft of each row that
     * accepted all k, recorded by spec_draft_finish, written by the next
     * step's mirror (row_catch) or before its KV ops. */
    int32_t n_def;
    spec_catchup_t *def; /* [cap] */
    int32_t *def_tables; /* [cap][max_blocks] each one's block table then */
    int32_t *row_catch;  /* [max_seqs] plan batch row -> its catch-up in def, or -1 */
};

void
spec_draft_destroy(spec_draft_t *d)
{
    if (d == NULL) {
        return;
    }
    mdl_runtime_destroy(d->rt);
    mdl_model_destroy(d->model);
    free(d->tokens);
    free(d->positions);
    free(d->slots);
    free(d->qstart);
    free(d->ctx);
    free(d->tables);
    free(d->lrows);
    free(d->row_draft);
    free(d->e_of);
    free(d->sample);
    free(d->prow);
    free(d->first);
    free(d->drafts);
    free(d->which);
    free(d->q);
    free(d->row);
    free(d->p);
    free(d->def);
    free(d->def_tables);
    free(d->row_catch);
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
    d->row_draft = xmalloc((size_t)d->max_seqs * sizeof(int32_t));
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
    d->def = xcalloc((size_t)d->cap, sizeof(*d->def));
    d->def_tables = xcalloc((size_t)d->cap * (size_t)d->max_blocks, sizeof(int32_t));
    d->row_catch = xmalloc((size_t)d->max_seqs * sizeof(int32_t));
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
    return mdl_forward(d->rt, &b, logits);
}

/* The plan batch row in which catch-up f's sequence decodes right after
 * it (its first token, the pending one, at f->pos + 1), or -1. */
static int32_t
catchup_row(sched_t *s, const sched_plan_t *plan, const spec_catchup_t *f)
{
    const mdl_batch_t *pb = &plan->batch;

    for (int32_t i = 0; i < plan->n_samples; i++) {
        const sched_sample_t *sm = &plan->samples[i];
        sched_sample_view_t v;
        int32_t first, r;

        if (sm->seq != f->seq) {
            continue;
        }
        sched_sample_view(s, plan, i, &v);
        first = pb->logits_rows[sm->row];
        r = row_of(pb, first);
        if (v.id != f->id || v.choice != f->choice || pb->query_start[r] != first ||
            pb->positions[first] != f->pos + 1) {
            return -1;
        }
        return r;
    }
    return -1;
}

int
spec_draft_kv_ops(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, const kv_op_t *ops,
                  int32_t n_ops)
{
    const mdl_batch_t *pb = &plan->batch;
    const float *logits = NULL;
    int32_t n = 0, room = d->max_tokens - pb->n_tokens;

    for (int32_t r = 0; r < pb->n_seqs; r++) {
        d->row_catch[r] = -1;
    }
    for (int32_t i = 0; i < plan->n_samples; i++) {
        room += plan->samples[i].n_draft; /* the mirror leaves the drafts out */
    }
    for (int32_t e = 0; e < d->n_def; e++) {
        const spec_catchup_t *f = &d->def[e];
        int32_t r = room > 0 ? catchup_row(s, plan, f) : -1;

        if (r >= 0) {
            d->row_catch[r] = e; /* the mirror writes it, in front of the row */
            room--;
            continue;
        }
        /* The sequence does not decode on this step (finished, cancelled,
         * preempted, swapped out): its slot now, before the ops copy,
         * swap or drop the block. */
        d->tokens[n] = f->token;
        d->positions[n] = f->pos;
        d->slots[n] = f->slot;
        d->ctx[n] = f->pos + 1;
        memcpy(d->tables + (size_t)n * (size_t)d->max_blocks,
               d->def_tables + (size_t)e * (size_t)d->max_blocks,
               (size_t)d->max_blocks * sizeof(int32_t));
        n++;
    }
    d->n_def = 0;
    if (n > 0) {
        int rc = forward_singles(d, d->max_blocks, n, 0, &logits);

        if (rc != ST_OK) {
            return rc;
        }
    }
    return n_ops > 0 ? mdl_runtime_kv_ops(d->rt, ops, n_ops) : ST_OK;
}

int
spec_draft_propose(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, smp_ctx_t *smp)
{
    const mdl_batch_t *pb = &plan->batch;
    const float *logits = NULL;
    mdl_batch_t b;
    int32_t nt = 0, kmax = 0;
    int rc;

    d->n_spec = 0;
    memset(d->row_draft, 0, (size_t)pb->n_seqs * sizeof(int32_t));
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
        d->row_draft[d->prow[e]] = sm->n_draft;
        kmax = sm->n_draft > kmax ? sm->n_draft : kmax;
    }

    /* 1. The mirror: every row without its drafts, after its catch-up. */
    for (int32_t r = 0; r < pb->n_seqs; r++) {
        int32_t qs = pb->query_start[r], n = pb->query_start[r + 1] - qs - d->row_draft[r];

        d->qstart[r] = nt;
        if (d->row_catch[r] >= 0) {
            const spec_catchup_t *f = &d->def[d->row_catch[r]];
            int32_t blk = mdl_batch_table(pb, r)[f->pos / d->bs];

            d->tokens[nt] = f->token;
            d->positions[nt] = f->pos;
            d->slots[nt] = blk * d->bs + f->pos % d->bs; /* its block now (a copy moves it) */
            nt++;
        }
        memcpy(d->tokens + nt, pb->tokens + qs, (size_t)n * sizeof(int32_t));
        memcpy(d->positions + nt, pb->positions + qs, (size_t)n * sizeof(int32_t));
        memcpy(d->slots + nt, pb->slot_mapping + qs, (size_t)n * sizeof(int32_t));
        d->ctx[r] = pb->context_len[r] - d->row_draft[r];
        nt += n;
    }
    d->qstart[pb->n_seqs] = nt;
    for (int32_t e = 0; e < d->n_spec; e++) {
        d->lrows[e] = d->qstart[d->prow[e] + 1] - 1; /* the pending token, the row's last */
    }
    memset(&b, 0, sizeof(b));
    b.n_tokens = nt;
    b.tokens = d->tokens;
    b.positions = d->positions;
    b.slot_mapping = d->slots;
    b.n_seqs = pb->n_seqs;
    b.query_start = d->qstart;
    b.context_len = d->ctx;
    b.block_tables = pb->block_tables;
    b.max_blocks = pb->max_blocks;
    b.table_rows = pb->table_rows; /* persistent rows, as the target's batch */
    b.table_dirty = pb->table_dirty;
    b.n_table_dirty = pb->n_table_dirty;
    b.logits_rows = d->lrows;
    b.n_logits = d->n_spec;
    rc = mdl_forward(d->rt, &b, &logits);
    if (rc != ST_OK) {
        return rc;
    }
    for (int32_t e = 0; e < d->n_spec; e++) {
        rc = draft_sample(d, s, plan, smp, e, 0, logits + (size_t)e * (size_t)d->vocab);
        if (rc != ST_OK) {
            return rc;
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

    d->n_def = 0;
    for (int32_t e = 0; e < d->n_spec; e++) {
        const sched_sample_t *sm = &plan->samples[d->sample[e]];
        const smp_result_t *res = results + sm->res;
        const int32_t *dr = d->drafts + (size_t)e * (size_t)d->k;
        spec_catchup_t *f = &d->def[d->n_def];
        sched_sample_view_t v;
        int32_t acc = 0;

        while (acc < sm->n_draft && res[acc].token == dr[acc]) {
            acc++;
        }
        if (acc < sm->n_draft) {
            continue;
        }
        /* All accepted: the last draft's KV, which no forward wrote; the
         * next step writes it (spec_draft_kv_ops, spec_draft_propose). */
        sched_sample_view(s, plan, d->sample[e], &v);
        f->seq = sm->seq;
        f->id = v.id;
        f->choice = v.choice;
        f->pos = pb->positions[d->first[e]] + sm->n_draft;
        f->token = dr[sm->n_draft - 1];
        f->slot = pb->slot_mapping[d->first[e] + sm->n_draft];
        memset(d->def_tables + (size_t)d->n_def * (size_t)d->max_blocks, 0,
               (size_t)d->max_blocks * sizeof(int32_t));
        memcpy(d->def_tables + (size_t)d->n_def * (size_t)d->max_blocks,
               mdl_batch_table(pb, d->prow[e]),
               (size_t)pb->max_blocks * sizeof(int32_t));
        d->n_def++;
    }
    return ST_OK;
}
