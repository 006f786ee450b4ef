/* sampler.h - turns a row of logits into a token.
 *
 * Order: logit bias, repetition / presence / frequency penalties, then
 * greedy (temperature 0) or temperature, top-k, top-p, min-p, and a draw
 * from the request's own seeded RNG (same seed, same output). Reports the
 * sampled token's logprob and the top-n logprobs, computed from the
 * distribution after bias and penalties and before temperature and
 * truncation (as vLLM does by default). A caller that reads no logprob
 * says so (no_logprob) and saves the log-softmax pass: greedy is then one
 * max / argmax pass over the row.
 *
 * Thread: a smp_ctx_t belongs to one thread (the engine's).
 */
#ifndef SAMPLER_SAMPLER_H
#define SAMPLER_SAMPLER_H

#include <stdint.h>

#define SMP_MAX_LOGPROBS 20

typedef struct smp_bias {
    int32_t id;
    float bias;
} smp_bias_t;

typedef struct smp_params {
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int32_t top_k;            /* <= 0: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off; applied over prompt and output */
    float presence_penalty;   /* 0: off; output tokens only */
    float frequency_penalty;  /* 0: off; output tokens only */
    const smp_bias_t *bias;   /* borrowed; n_bias entries */
    int32_t n_bias;
    int32_t n_logprobs;       /* top logprobs to report, 0..SMP_MAX_LOGPROBS */
    int32_t no_logprob;       /* 1: the caller does not read smp_result_t.logprob
                               * (it is NaN then, unless n_logprobs > 0) */
} smp_params_t;

/* Per-stream random state (xoshiro256** seeded with splitmix64). */
typedef struct smp_rng {
    uint64_t s[4];
} smp_rng_t;

void smp_rng_seed(smp_rng_t *r, uint64_t seed);
uint64_t smp_rng_next(smp_rng_t *r);
double smp_rng_uniform(smp_rng_t *r); /* [0, 1) */

typedef struct smp_result {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[SMP_MAX_LOGPROBS];
    float top_logprobs[SMP_MAX_LOGPROBS];
} smp_result_t;

typedef struct smp_ctx smp_ctx_t;

/* Preallocates every buffer for a vocabulary: sampling allocates nothing. */
int smp_ctx_create(int32_t vocab, smp_ctx_t **out);
void smp_ctx_destroy(smp_ctx_t *c);

/* Samples from logits[vocab] (modified in place: bias and penalties; the
 * caller may hand its own row, nothing is copied). history[0..n_hist) is
 * the sequence so far, of which the first n_prompt are the prompt. The
 * result depends only on the inputs and the RNG state, never on the CPU's
 * vector width. */
int smp_sample(smp_ctx_t *c, const smp_params_t *p, smp_rng_t *rng, float *logits,
               const int32_t *history, int32_t n_hist, int32_t n_prompt, smp_result_t *out);

/* Speculative decoding with a draft model (scheduler/spec_draft.h) needs
 * the distribution itself. smp_probs applies what smp_sample applies
 * (bias and penalties in place on logits, then temperature, top-k, top-p
 * and min-p) and writes the distribution smp_sample draws from into
 * probs[vocab]: 0 outside the kept set, summing to 1; greedy
 * (temperature 0) is a point mass on the argmax. Draws nothing. Errors as
 * smp_sample. */
int smp_probs(smp_ctx_t *c, const smp_params_t *p, float *logits, const int32_t *history,
              int32_t n_hist, int32_t n_prompt, float *probs);
/* The result smp_sample would report for token, from logits as smp_probs
 * left them (bias and penalties applied): its logprob and the top-n. */
void smp_result_of(smp_ctx_t *c, const smp_params_t *p, const float *logits, int32_t token,
                   smp_result_t *out);
/* Index drawn from weights w[0..vocab) (any positive scale) with u in
 * [0, 1); never a weight-0 entry; -1 when every weight is 0. */
int32_t smp_pick_probs(const float *w, int32_t vocab, double u);

#endif /* SAMPLER_SAMPLER_H */
