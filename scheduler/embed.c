/* embed.c - embedding requests in the engine: which hidden rows a step
 * asks for, and their pooling (embed.h says how the request flows).
 *
 * Thread: engine thread.
 */
#define LOG_MODULE "engine"

#include "scheduler/embed.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"

/* One hidden row of the current step: whose it is and which prompt
 * position it holds. */
typedef struct embed_row {
    eng_msg_embed_t *m;
    int32_t pos;
    int32_t pooling;
} embed_row_t;

struct eng_embed {
    int32_t max_tokens;
    int32_t dim;
    int has_hidden;
    int32_t *rows;     /* [max_tokens] batch rows asked for (mdl_batch_t.hidden_rows) */
    embed_row_t *what; /* [max_tokens] */
    int32_t n;
};

eng_embed_t *
eng__embed_create(int32_t max_tokens, int32_t dim, int has_hidden)
{
    eng_embed_t *em = xcalloc(1, sizeof(*em));

    em->max_tokens = max_tokens;
    em->dim = dim;
    em->has_hidden = has_hidden;
    em->rows = xcalloc((size_t)max_tokens, sizeof(*em->rows));
    em->what = xcalloc((size_t)max_tokens, sizeof(*em->what));
    return em;
}

void
eng__embed_destroy(eng_embed_t *em)
{
    if (em == NULL) {
        return;
    }
    free(em->rows);
    free(em->what);
    free(em);
}

int
eng__embed_submit(const eng_embed_t *em, const eng_request_t *r, eng_msg_embed_t **out)
{
    eng_msg_embed_t *m;

    *out = NULL;
    if (r->pooling == ENG_POOL_NONE) {
        return ST_OK;
    }
    if (r->pooling != ENG_POOL_LAST && r->pooling != ENG_POOL_MEAN) {
        return ST_EINVAL;
    }
    if (!em->has_hidden) {
        return ST_EUNSUPPORTED;
    }
    if (r->n != 1 || r->max_tokens != 1) {
        return ST_EINVAL;
    }
    m = xcalloc_try(1, sizeof(*m) + sizeof(float) * (size_t)em->dim);
    if (m == NULL) {
        return ST_ENOMEM;
    }
    m->hdr.type = ENG_MSG_EMBED;
    m->id = r->id;
    m->dim = em->dim;
    *out = m;
    return ST_OK;
}

void
eng__embed_plan(eng_embed_t *em, const sched_t *s, sched_plan_t *plan,
                eng_msg_embed_t *(*embed_of)(void *udata))
{
    mdl_batch_t *b = &plan->batch;

    em->n = 0;
    for (int32_t r = 0; r < b->n_seqs; r++) {
        void *udata;
        int32_t n_prompt, pooling;
        eng_msg_embed_t *m;

        sched_row_info(s, r, &udata, &n_prompt, &pooling);
        if (pooling == ENG_POOL_NONE || (m = embed_of(udata)) == NULL) {
            continue;
        }
        for (int32_t t = b->query_start[r]; t < b->query_start[r + 1]; t++) {
            int32_t pos = b->positions[t];
            int want = pooling == ENG_POOL_MEAN ? pos < n_prompt && pos >= m->n_pooled
                                                : pos == n_prompt - 1;
            if (want && em->n < em->max_tokens) {
                em->rows[em->n] = t;
                em->what[em->n] = (embed_row_t){.m = m, .pos = pos, .pooling = pooling};
                em->n++;
            }
        }
    }
    b->hidden_rows = em->n > 0 ? em->rows : NULL;
    b->n_hidden = em->n;
}

void
eng__embed_collect(eng_embed_t *em, const float *hidden)
{
    for (int32_t i = 0; i < em->n; i++) {
        const embed_row_t *w = &em->what[i];
        const float *h = hidden + (size_t)i * (size_t)em->dim;
        eng_msg_embed_t *m = w->m;

        if (w->pooling == ENG_POOL_LAST) {
            memcpy(m->vec, h, sizeof(float) * (size_t)em->dim);
            m->n_pooled = w->pos + 1;
        } else if (w->pos == m->n_pooled) {
            /* Rows come in position order within a step and across steps;
             * a recomputed position was counted already. */
            for (int32_t j = 0; j < em->dim; j++) {
                m->vec[j] += h[j];
            }
            m->n_pooled++;
        }
    }
    em->n = 0;
}

void
eng__embed_finish(eng_msg_embed_t *m, int32_t pooling)
{
    if (pooling == ENG_POOL_MEAN && m->n_pooled > 0) {
        float inv = 1.0f / (float)m->n_pooled;
        for (int32_t j = 0; j < m->dim; j++) {
            m->vec[j] *= inv;
        }
    }
}
