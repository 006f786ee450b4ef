/* embed.h - embedding requests in the engine (issue 14): prefill-only
 * work batched with everything else, whose answer is the pooled final
 * hidden state of the prompt.
 *
 * An embedding request (eng_request_t.pooling) is scheduled like any other
 * (one choice, max_tokens 1): the scheduler plans its prompt in chunks
 * among the other sequences; before each forward, eng__embed_plan() asks
 * the model for the final hidden state (mdl_batch_t.hidden_rows) of its
 * rows: every prompt row for mean pooling, the last prompt row for
 * last-token pooling; after the forward, eng__embed_collect() adds them
 * into the request's preallocated EMBED message (a running sum over the
 * chunks for mean pooling, counted by position so a recompute after
 * preemption adds nothing twice). The one token sampled after the prompt
 * is not reported; the request then finishes (max_tokens 1), its EMBED
 * goes out right before its FINISHED, and its blocks are freed (full
 * blocks stay in the prefix cache). Mean pooling takes no prompt blocks
 * from the prefix cache (sched.h: every row must be computed); last-token
 * pooling may, since a lookup never reuses the last prompt token.
 *
 * Thread: engine thread.
 */
#ifndef SCHEDULER_EMBED_H
#define SCHEDULER_EMBED_H

#include <stdint.h>

#include "model/model.h"
#include "scheduler/proto.h"
#include "scheduler/sched.h"

typedef struct eng_embed eng_embed_t;

/* The per-step arrays, for steps of up to max_tokens rows of a model of
 * hidden size dim. has_hidden: the backend gives hidden states (else every
 * embedding request is refused). Aborts when out of memory (start-up). */
eng_embed_t *eng__embed_create(int32_t max_tokens, int32_t dim, int has_hidden);
void eng__embed_destroy(eng_embed_t *em); /* NULL is a no-op */

/* At submit, for a request with pooling != ENG_POOL_NONE: checks it and
 * allocates (fallibly) its EMBED message into *out. ST_EUNSUPPORTED when
 * the backend gives no hidden states, ST_EINVAL for a bad pooling, n or
 * max_tokens, ST_ENOMEM. A generation request: *out = NULL, ST_OK. */
int eng__embed_submit(const eng_embed_t *em, const eng_request_t *r, eng_msg_embed_t **out);

/* Before the forward: adds to plan->batch the hidden rows its embedding
 * sequences need. embed_of(udata) is the EMBED message of a request's
 * scheduler udata (NULL for a generation request). */
void eng__embed_plan(eng_embed_t *em, const sched_t *s, sched_plan_t *plan,
                     eng_msg_embed_t *(*embed_of)(void *udata));

/* After an ST_OK forward: pools hidden ([n_hidden][dim], mdl_runtime_hidden)
 * into the messages eng__embed_plan named. */
void eng__embed_collect(eng_embed_t *em, const float *hidden);

/* At the request's FINISHED: the mean of the sum (mean pooling). */
void eng__embed_finish(eng_msg_embed_t *m, int32_t pooling);

#endif /* SCHEDULER_EMBED_H */
