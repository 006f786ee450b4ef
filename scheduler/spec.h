/* spec.h - speculative decoding: its configuration, the n-gram (prompt
 * lookup) proposer, the adaptive rule and the verification of one
 * speculating sequence's logits rows.
 *
 * DESIGN
 *   A speculating sequence contributes 1 + k query tokens to the step's
 *   varlen batch (its pending token, then k draft tokens) and 1 + k
 *   logits rows; nothing else in the batch format changes (DESIGN.md
 *   section 3), so every backend verifies by computing more logits rows.
 *   The scheduler (sched.c) reserves the k lookahead slots with the
 *   pending token, keeps the drafts past the end of the sequence's token
 *   buffer, and at commit appends the accepted prefix plus the bonus (or
 *   correction) token and gives the rejected slots back (bm_seq_truncate).
 *
 *   Lossless verification (spec_verify_sample): row j is sampled exactly
 *   as a plain decode would sample it after the pending token and drafts
 *   d1..dj (same history, same min_tokens mask, same penalties, the
 *   choice's own random stream), and draft d(j+1) is accepted iff the
 *   sample equals it. An n-gram draft is a point mass q = 1[d], so this is
 *   exact rejection sampling (Leviathan et al. 2023): accept d with
 *   probability p(d) = min(1, p(d) / q(d)); on rejection the sample is
 *   distributed as p restricted to tokens != d, renormalized, which is
 *   norm(max(0, p - q)). Greedy decoding accepts iff d is the argmax. Each
 *   emitted token consumes one draw of the stream, as without speculation,
 *   so a seeded request returns the same tokens either way (up to the
 *   floating-point difference of a batched row).
 *
 *   Draft slots never include a block's last slot: the step that writes a
 *   block's last token seals (hashes) it in the prefix cache and quantizes
 *   it in a compressed KV cache, so no rejected token is ever hashed or
 *   quantized into a block; blocks holding only rejected tokens go back
 *   to the pool at truncation. Near the end of a block k shrinks (on
 *   average by k (k + 1) / (2 block_size) tokens).
 *
 *   Adaptive rule (spec_seq_want): speculation is for the memory-bound
 *   regime. A step speculates only while at most max_batch sequences
 *   decode in it (past that, the extra query rows cost compute the batch
 *   would otherwise use; measured, see README "Speculative decoding"),
 *   and a sequence whose acceptance EWMA drops below min_accept pauses
 *   for backoff_steps decode steps before it tries again.
 *
 * Thread: engine thread (parse: any).
 */
#ifndef SCHEDULER_SPEC_H
#define SCHEDULER_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "sampler/sampler.h"

#define SPEC_MAX_K 16

typedef enum spec_method {
    SPEC_OFF = 0,
    SPEC_NGRAM,
    SPEC_DRAFT_MODEL,
} spec_method_t;

typedef struct spec_config {
    spec_method_t method;
    int32_t k;          /* num_speculative_tokens, 1..SPEC_MAX_K */
    int32_t lookup_min; /* prompt_lookup_min, >= 1 */
    int32_t lookup_max; /* prompt_lookup_max, >= lookup_min */
    int32_t max_batch;  /* speculate while at most this many decodes (0: default) */
    float min_accept;   /* acceptance EWMA below which a sequence pauses */
    int32_t backoff_steps;
    char model[512]; /* draft_model: path */
} spec_config_t;

/* Parses vLLM's --speculative-config JSON object:
 *   {"method": "ngram", "num_speculative_tokens": K,
 *    "prompt_lookup_min": N1, "prompt_lookup_max": N2}
 *   {"method": "draft_model", "model": PATH, "num_speculative_tokens": K}
 * plus kvserve's optional "max_batch", "min_acceptance", "backoff_steps".
 * NULL or "" is SPEC_OFF. ST_EINVAL with a reason in err on a bad value
 * or an unknown key; *out is written only on success. */
int spec_config_parse(const char *json, spec_config_t *out, char *err, size_t errlen);

/* The longest n-gram (lookup_max down to lookup_min tokens) ending at
 * toks[n - 1] that also occurs earlier in toks[0..n-1): copies up to k
 * tokens that followed its most recent earlier occurrence into out.
 * Returns their count (0: no match). */
int32_t spec_ngram_propose(const int32_t *toks, int32_t n, int32_t lookup_min,
                           int32_t lookup_max, int32_t k, int32_t *out);

/* Logits rows a step may ask for at most with max_num_seqs sequences:
 * one per sequence, plus k per speculating one, and at most max_batch
 * (all of them when 0) speculate in a step (spec_seq_want). What the
 * engine sizes the runtime's max_num_seqs to (max_num_seqs when off). */
int32_t spec_logits_rows(const spec_config_t *c, int32_t max_num_seqs);

/* Per-sequence adaptive state (zeroed at submit). */
typedef struct spec_seq {
    float accept_ewma; /* accepted / proposed, exponentially weighted */
    int32_t n_runs;    /* verifications so far */
    int32_t pause;     /* decode steps left before speculating again */
} spec_seq_t;

/* How many draft tokens the sequence may propose this step (0: decode
 * normally) given the decodes in the step; advances its pause. */
int32_t spec_seq_want(const spec_config_t *c, spec_seq_t *q, int32_t n_decodes);
/* Records a verification of n_draft tokens with n_accepted accepted. */
void spec_seq_record(const spec_config_t *c, spec_seq_t *q, int32_t n_draft, int32_t n_accepted);

/* Counters, vLLM's names: spec_decode_num_drafts, _num_draft_tokens,
 * _num_accepted_tokens, _num_accepted_tokens_per_pos{position}. */
typedef struct spec_stats {
    uint64_t drafts;
    uint64_t draft_tokens;
    uint64_t accepted_tokens;
    uint64_t accepted_per_pos[SPEC_MAX_K];
} spec_stats_t;

/* One speculating sample's rows: logits[(row + j) * vocab] for
 * j = 0..n_draft. sample_row(arg, j, logits_row, out) samples row j (the
 * caller sets the history, mask and stream for position j; logits_row is
 * a scratch copy it may modify). Stops at the first j < n_draft whose
 * sample differs from draft[j]. Returns the number of results written,
 * 1..n_draft + 1, or a negative ST_* from sample_row. */
typedef int (*spec_sample_cb)(void *arg, int32_t j, float *logits_row, smp_result_t *out);
int32_t spec_verify_sample(const float *logits, int32_t vocab, const int32_t *draft,
                           int32_t n_draft, float *scratch, spec_sample_cb sample_row, void *arg,
                           smp_result_t *out);

/* One position of rejection sampling against a draft model (Leviathan et
 * al. 2023; scheduler/spec_draft.h): draft d was drawn from q. Accepts d
 * with probability min(1, p(d) / q(d)) (one draw of rng); otherwise
 * returns a draw (a second one) from norm(max(0, p - q)), which never is
 * d, built in residual[vocab] (which may be p itself). So the result is
 * distributed as p. p and q sum to 1. Returns -1 when the residual is empty: p equals q up to
 * rounding, so the rejection had probability 0 (the caller draws from p
 * without d). */
int32_t spec_reject_sample(const float *p, const float *q, int32_t vocab, int32_t d,
                           smp_rng_t *rng, float *residual);

#endif /* SCHEDULER_SPEC_H */
