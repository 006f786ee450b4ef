/* spec_draft.h - speculative decoding with a draft model: a second, smaller
 * model with the target's vocabulary proposes the k drafts of each
 * speculating sequence, and verification is rejection sampling against
 * the draft's own distributions.
 *
 * DESIGN
 *   KV. The draft has its own runtime (its own KV buffer), created with
 *   the target's block count, block size, swap tier and KV dtype, so the
 *   target's block ids index it too: blockmgr stays the only owner of
 *   block ids, and every copy, swap, drop and shift the engine runs
 *   (spec_draft_kv_ops) runs on both buffers; paging, copy-on-write,
 *   prefix caching and swap apply to the draft's KV unchanged. Invariant:
 *   wherever a forward reads or a KV op copies, swaps or drops the
 *   target's KV, the draft's KV holds the same tokens. It holds because
 *   the draft writes every slot the target writes:
 *
 *     1. mirror forward: the step's batch with each speculating row's k
 *        draft slots left out (prefill chunks and plain decodes as they
 *        are), logits at each speculating row's pending token -> q_1;
 *     2. forwards 2 .. k: one token per speculating row (draft j - 1 at
 *        its reserved slot) -> q_j;
 *     3. draft k of a row that accepted all k drafts (the only accepted
 *        token the mirror and forwards 2 .. k did not write) is written
 *        by the next step: as the first token of the sequence's row in
 *        that step's mirror when it decodes there (its pending token is
 *        the next position), so that no forward of its own runs; else
 *        (finished, cancelled, preempted, swapped out, or no token room)
 *        by a one-token forward at its old slot before the step's KV ops
 *        copy, swap or drop the block. The slot is never a block's last
 *        (spec.h), so the block is not sealed, hashed or quantized before
 *        the draft's row is in it; the block is the sequence's own (a
 *        shared block is copied before any write), so no op of a step in
 *        which the sequence decodes moves it; and when the sequence is
 *        gone the write lands in a block no one reads before rewriting it.
 *
 *   Forwards of the draft per step with k drafts: k (the mirror and
 *   k - 1 one-token forwards); before the catch-up joined the mirror, a
 *   step in which a row accepted all k ran k + 1.
 *
 *   Rejected drafts' slots are given back with the target's
 *   (bm_seq_truncate in sched.c); no draft ever takes a block's last slot
 *   (spec.h), so a sealed block never holds a draft's KV of a rejected
 *   token either.
 *
 *   Sampling. The draft's row j is turned into q_(j+1) by smp_probs with
 *   the request's own parameters (bias, penalties over the history with
 *   drafts 1 .. j, min_tokens and grammar masks as the target's row j:
 *   sched_sample_view_at / sched_sample_mask_at), and d_(j+1) is drawn
 *   from it with the choice's random stream. Verification (Leviathan et
 *   al. 2023, Chen et al. 2023): row j's target distribution p_j is
 *   built the same way; d_(j+1) is accepted with probability
 *   min(1, p_j(d) / q_(j+1)(d)); at the first rejection the token is
 *   drawn from norm(max(0, p_j - q_(j+1))) and the run ends; when all are
 *   accepted the bonus token is sampled from p_k as a plain decode. So
 *   every emitted token is distributed as plain sampling would give it.
 *   Greedy (temperature 0): both are point masses, i.e. accept iff the
 *   draft is the target's argmax, else emit the argmax.
 *
 * Thread: engine thread.
 */
#ifndef SCHEDULER_SPEC_DRAFT_H
#define SCHEDULER_SPEC_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "sampler/sampler.h"
#include "scheduler/sched.h"
#include "scheduler/spec.h"

typedef struct spec_draft spec_draft_t;

/* Loads the draft model at sc->model and binds it to a runtime with rc's
 * blocks, swap tier, dtype and budgets (rc as the target's runtime was
 * given: max_num_seqs counting 1 + k logits rows). max_num_seqs is the
 * engine's (speculating rows per step at most). The draft must have the
 * target's vocabulary: the same vocab_size and the same bytes for every
 * token id, and a context of at least max_model_len. Errors: the model's
 * load error, ST_EINVAL on a vocabulary or context mismatch, the
 * runtime's error; each with one line in err naming the
 * file. */
int spec_draft_create(const mdl_model_t *target, const spec_config_t *sc,
                      const mdl_runtime_config_t *rc, int32_t max_num_seqs, int32_t max_model_len,
                      spec_draft_t **out, char *err, size_t errlen);
void spec_draft_destroy(spec_draft_t *d);

/* After sched_step, every step (also one without tokens): picks the
 * catch-ups (DESIGN step 3) that this plan's mirror writes, writes the
 * others, then runs the step's block copy / swap / drop / shift ops on the
 * draft's KV (call with the same ops as the target's
 * mdl_runtime_kv_ops). */
int spec_draft_kv_ops(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, const kv_op_t *ops,
                      int32_t n_ops);

/* Steps 1 and 2 of DESIGN for the plan: writes the draft's KV of every
 * token the target writes this step except the last draft of each
 * speculating row, and the catch-ups spec_draft_kv_ops picked; samples
 * the drafts (sched_set_draft) and keeps their distributions for
 * spec_draft_verify. Before the target's forward. */
int spec_draft_propose(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, smp_ctx_t *smp);

/* Verifies speculating sample i of the plan (n_draft > 0) against the
 * target's logits ([n_logits][vocab], the plan's row order): writes
 * 1 .. n_draft + 1 results at out (the accepted drafts, then the
 * correction or bonus token), as spec_verify_sample does. scratch:
 * [vocab]. */
int spec_draft_verify(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, int32_t i,
                      const float *logits, smp_ctx_t *smp, float *scratch, smp_result_t *out);

/* Step 3 of DESIGN: after every sample's results are written (results as
 * given to sched_commit), before sched_commit: records the catch-ups of
 * the rows that accepted all their drafts (no forward here). */
int spec_draft_finish(spec_draft_t *d, sched_t *s, const sched_plan_t *plan,
                      const smp_result_t *results);

#endif /* SCHEDULER_SPEC_DRAFT_H */
