/* spec.c - speculative decoding: configuration, n-gram proposer, adaptive
 * rule and verification (see spec.h for the design).
 *
 * Thread: engine thread (spec_config_parse: any).
 */
#define LOG_MODULE "spec"

#include "scheduler/spec.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/status.h"

/* Defaults of the adaptive rule (README "Speculative decoding"). */
#define SPEC_DEF_MAX_BATCH 8
#define SPEC_DEF_MIN_ACCEPT 0.2f
#define SPEC_DEF_BACKOFF 16
#define SPEC_EWMA_ALPHA 0.25f

static int
get_int(const cJSON *o, const char *key, int32_t lo, int32_t hi, int32_t *v, char *err,
        size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);

    if (j == NULL) {
        return ST_OK;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo ||
        j->valuedouble > hi) {
        snprintf(err, errlen, "speculative config: \"%s\" must be an integer in %d..%d", key, lo,
                 hi);
        return ST_EINVAL;
    }
    *v = (int32_t)j->valuedouble;
    return ST_OK;
}

int
spec_config_parse(const char *json, spec_config_t *out, char *err, size_t errlen)
{
    static const char *const known[] = {
        "method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
        "max_batch", "min_acceptance", "backoff_steps",
    };
    spec_config_t c;
    cJSON *root;
    const cJSON *j;
    int rc = ST_EINVAL;

    memset(&c, 0, sizeof(c));
    if (json == NULL || json[0] == '\0') {
        *out = c;
        return ST_OK;
    }
    root = cJSON_Parse(json);
    if (root == NULL || !cJSON_IsObject(root)) {
        snprintf(err, errlen, "speculative config: not a JSON object");
        goto done;
    }
    cJSON_ArrayForEach(j, root)
    {
        size_t i = 0;
        while (i < sizeof(known) / sizeof(known[0]) && strcmp(known[i], j->string) != 0) {
            i++;
        }
        if (i == sizeof(known) / sizeof(known[0])) {
            snprintf(err, errlen, "speculative config: unknown key \"%.64s\"", j->string);
            goto done;
        }
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "method");
    if (!cJSON_IsString(j)) {
        snprintf(err, errlen, "speculative config: \"method\" (\"ngram\" or \"draft_model\") "
                              "is required");
        goto done;
    }
    if (strcmp(j->valuestring, "ngram") == 0) {
        c.method = SPEC_NGRAM;
    } else if (strcmp(j->valuestring, "draft_model") == 0) {
        c.method = SPEC_DRAFT_MODEL;
    } else {
        snprintf(err, errlen, "speculative config: unknown method \"%.64s\" (ngram, draft_model)",
                 j->valuestring);
        goto done;
    }
    c.k = 0;
    c.lookup_min = 1;
    c.lookup_max = 3;
    c.max_batch = SPEC_DEF_MAX_BATCH;
    c.min_accept = SPEC_DEF_MIN_ACCEPT;
    c.backoff_steps = SPEC_DEF_BACKOFF;
    if (get_int(root, "num_speculative_tokens", 1, SPEC_MAX_K, &c.k, err, errlen) != ST_OK ||
        get_int(root, "prompt_lookup_min", 1, 64, &c.lookup_min, err, errlen) != ST_OK ||
        get_int(root, "prompt_lookup_max", 1, 64, &c.lookup_max, err, errlen) != ST_OK ||
        get_int(root, "max_batch", 0, 1 << 20, &c.max_batch, err, errlen) != ST_OK ||
        get_int(root, "backoff_steps", 0, 1 << 20, &c.backoff_steps, err, errlen) != ST_OK) {
        goto done;
    }
    if (c.k == 0) {
        snprintf(err, errlen, "speculative config: \"num_speculative_tokens\" is required");
        goto done;
    }
    if (c.lookup_max < c.lookup_min) {
        snprintf(err, errlen,
                 "speculative config: prompt_lookup_max (%d) < prompt_lookup_min (%d)",
                 c.lookup_max, c.lookup_min);
        goto done;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "min_acceptance");
    if (j != NULL) {
        if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= 1)) {
            snprintf(err, errlen, "speculative config: \"min_acceptance\" must be in [0, 1]");
            goto done;
        }
        c.min_accept = (float)j->valuedouble;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (c.method == SPEC_DRAFT_MODEL) {
        if (!cJSON_IsString(j) || j->valuestring[0] == '\0' ||
            strlen(j->valuestring) >= sizeof(c.model)) {
            snprintf(err, errlen, "speculative config: draft_model needs \"model\": PATH");
            goto done;
        }
        snprintf(c.model, sizeof(c.model), "%s", j->valuestring);
    } else if (j != NULL) {
        snprintf(err, errlen, "speculative config: \"model\" is only for draft_model");
        goto done;
    }
    *out = c;
    rc = ST_OK;
done:
    cJSON_Delete(root);
    return rc;
}

int32_t
spec_ngram_propose(const int32_t *toks, int32_t n, int32_t lookup_min, int32_t lookup_max,
                   int32_t k, int32_t *out)
{
    if (k <= 0 || n < 2) {
        return 0;
    }
    for (int32_t g = lookup_max < n - 1 ? lookup_max : n - 1; g >= lookup_min; g--) {
        const int32_t *tail = toks + n - g;
        /* Most recent earlier occurrence first: the freshest context. */
        for (int32_t s = n - g - 1; s >= 0; s--) {
            if (toks[s] != tail[0] || memcmp(toks + s, tail, sizeof(int32_t) * (size_t)g) != 0) {
                continue;
            }
            int32_t from = s + g, m = n - from < k ? n - from : k;
            memcpy(out, toks + from, sizeof(int32_t) * (size_t)m);
            return m;
        }
    }
    return 0;
}

int32_t
spec_logits_rows(const spec_config_t *c, int32_t max_num_seqs)
{
    int32_t n_spec = max_num_seqs;

    if (c->method == SPEC_OFF || c->k <= 0) {
        return max_num_seqs;
    }
    if (c->max_batch > 0 && c->max_batch < n_spec) {
        n_spec = c->max_batch;
    }
    return max_num_seqs + n_spec * c->k;
}

int32_t
spec_seq_want(const spec_config_t *c, spec_seq_t *q, int32_t n_decodes)
{
    if (c->method == SPEC_OFF || c->k <= 0) {
        return 0;
    }
    if (q->pause > 0) {
        q->pause--;
        return 0;
    }
    if (c->max_batch > 0 && n_decodes > c->max_batch) {
        return 0;
    }
    return c->k;
}

void
spec_seq_record(const spec_config_t *c, spec_seq_t *q, int32_t n_draft, int32_t n_accepted)
{
    float r = n_draft > 0 ? (float)n_accepted / (float)n_draft : 0.0f;

    q->accept_ewma = q->n_runs == 0 ? r : q->accept_ewma + SPEC_EWMA_ALPHA * (r - q->accept_ewma);
    q->n_runs++;
    if (q->n_runs >= 4 && q->accept_ewma < c->min_accept) {
        /* Low acceptance: pause, then probe again from a neutral estimate. */
        q->pause = c->backoff_steps;
        q->n_runs = 0;
    }
}

int32_t
spec_verify_sample(const float *logits, int32_t vocab, const int32_t *draft, int32_t n_draft,
                   float *scratch, spec_sample_cb sample_row, void *arg, smp_result_t *out)
{
    for (int32_t j = 0; j <= n_draft; j++) {
        int rc;

        memcpy(scratch, logits + (size_t)j * (size_t)vocab, sizeof(float) * (size_t)vocab);
        rc = sample_row(arg, j, scratch, &out[j]);
        if (rc != ST_OK) {
            return rc;
        }
        if (j == n_draft || out[j].token != draft[j]) {
            return j + 1;
        }
    }
    return n_draft + 1; /* not reached */
}

int32_t
spec_reject_sample(const float *p, const float *q, int32_t vocab, int32_t d, smp_rng_t *rng,
                   float *residual)
{
    if (smp_rng_uniform(rng) * (double)q[d] < (double)p[d]) {
        return d;
    }
    for (int32_t x = 0; x < vocab; x++) {
        float r = p[x] - q[x];
        residual[x] = r > 0.0f ? r : 0.0f;
    }
    residual[d] = 0.0f; /* p(d) < q(d) here; rounding aside, it is 0 already */
    return smp_pick_probs(residual, vocab, smp_rng_uniform(rng));
}
