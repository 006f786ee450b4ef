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
 *   prefix caching and swap apply to the draft's KV unchanged.
 *
 *   The draft runs only in steps where a row speculates, and only over
 *   the speculating rows, so decode steps of a batch past max_batch (and
 *   prefill-only steps) cost no draft forward. So its KV lags the
 *   target's, and a per-block count says how far it is right: valid[b]
 *   leading slots of block b hold the draft's KV of the tokens the
 *   target's KV holds there. Every slot the target writes lowers its
 *   block's count to the slot's offset unless the draft wrote the same
 *   token there (then it extends it); copy / swap carry the count with
 *   the bytes, drop and shift clear it. Per step with k drafts:
 *
 *     1. mirror: per speculating row, its catch-up -- the positions from
 *        the first one (walking its block table) whose draft KV is not
 *        the target's up to its pending token, the tokens from its
 *        history -- and the pending token, in chunks of at most
 *        max_num_batched_tokens; logits at the pending token -> q_1. A
 *        row that decoded without speculating, was prefilled, swapped
 *        or took blocks from the prefix cache catches up here;
 *     2. forwards 2 .. k: one token per speculating row (draft j - 1 at
 *        its reserved slot) -> q_j;
 *     3. after the step (spec_draft_finish), the counts of every slot the
 *        target wrote: the pending token and drafts 1 .. k - 1 of a
 *        speculating row are the draft's too, its last draft and every
 *        other row's tokens are not (a row that accepts all k catches its
 *        last draft up the next time it speculates).
 *
 *   A catch-up may write into blocks shared with other sequences (the
 *   prefix cache, n > 1 forks): it writes the same tokens at the same
 *   positions they hold, so readers see KV of their own tokens. The
 *   draft's KV only shapes the proposals: verification is exact whatever
 *   the drafts (below), so a lagging or rounded draft KV costs acceptance,
 *   never correctness.
 *
 *   Rejected drafts' slots are given back with the target's
 *   (bm_seq_truncate in sched.c); they lie past the sequence's context,
 *   and the target writes them again before anything reads them.
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

/* After sched_step, every step (also one without tokens): runs the
 * step's block copy / swap / drop / shift ops on the draft's KV and its
 * per-block counts (call with the same ops as the target's
 * mdl_runtime_kv_ops). s and plan are unused. */
int spec_draft_kv_ops(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, const kv_op_t *ops,
                      int32_t n_ops);

/* Steps 1 and 2 of DESIGN for the plan: for each speculating row, its
 * catch-up, pending token and drafts but the last; samples the drafts
 * (sched_set_draft) and keeps their distributions for spec_draft_verify.
 * Runs no forward when no row speculates. Before the target's forward. */
int spec_draft_propose(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, smp_ctx_t *smp);

/* Verifies speculating sample i of the plan (n_draft > 0) against the
 * target's logits ([n_logits][vocab], the plan's row order): writes
 * 1 .. n_draft + 1 results at out (the accepted drafts, then the
 * correction or bonus token), as spec_verify_sample does. scratch:
 * [vocab]. */
int spec_draft_verify(spec_draft_t *d, sched_t *s, const sched_plan_t *plan, int32_t i,
                      const float *logits, smp_ctx_t *smp, float *scratch, smp_result_t *out);

/* Step 3 of DESIGN: after the target's forward, before sched_commit:
 * the per-block counts of the slots the target wrote this step (no
 * forward here; s and results are unused). */
int spec_draft_finish(spec_draft_t *d, sched_t *s, const sched_plan_t *plan,
                      const smp_result_t *results);

/* Counters for the log and the tests: the draft's forwards so far, and
 * the tokens its catch-ups wrote (DESIGN). */
void spec_draft_counts(const spec_draft_t *d, int64_t *forwards, int64_t *catchup_tokens);

#endif /* SCHEDULER_SPEC_DRAFT_H */
