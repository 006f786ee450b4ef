/* srv_embed.c - POST /v1/embeddings: the request from its body to one
 * engine job per input, and the pooled hidden states back to OpenAI's
 * CreateEmbeddingResponse.
 *
 * DESIGN
 *   Inputs: a string, an array of strings, an array of token ids, or an
 *   array of token-id arrays (up to SRV_EMBED_MAX_INPUTS). Strings are
 *   tokenized as completion prompts (BOS added). Each input becomes an
 *   engine request with pooling (--pooling: last token or mean,
 *   scheduler/embed.h): prefill-only work batched with every other
 *   request, one sampled token that is never reported, blocks freed at
 *   its end (full ones stay in the prefix cache). The engine answers each
 *   job with EMBED (the pooled, unnormalized final hidden state) then
 *   FINISHED, or with ERROR.
 *
 *   The vector is cut to `dimensions` when asked (Matryoshka-style; 400
 *   beyond the hidden size), then L2-normalized, so every vector returned
 *   has unit norm. encoding_format "float" gives JSON numbers printed with
 *   9 significant digits (an f32 round trip); "base64" gives the
 *   little-endian f32 bytes in base64, as the OpenAI SDK decodes them.
 *
 *   The open requests are a list on the server (s->embeds); outbox
 *   messages with one of their job ids are applied here
 *   (srv_embed_on_msg), the others go to srv_gen.c. The request record is
 *   held (srv_req_busy) until every job has said its last word; a client
 *   that went away gets nothing, and its jobs, being short prefills, run
 *   to their end. The body's parse and the inputs' tokenizing run on the
 *   thread pool (srv_work.h), before any job exists.
 *
 * Thread: loop thread, except embed_prep_run (a pool thread).
 */
#define LOG_MODULE "http"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_embed.h"
#include "server/srv_work.h"
#include "server/srv_req.h"

/* Inputs per request: each is one engine request. */
#define SRV_EMBED_MAX_INPUTS 256

typedef struct embed_job {
    uint64_t id;
    int32_t *ids; /* the input's tokens (owned until submitted) */
    int32_t n_ids;
    float *vec; /* [dim] from EMBED, owned */
    int open;   /* the engine still owes FINISHED or ERROR */
} embed_job_t;

typedef struct srv_embed {
    struct srv_embed *next; /* s->embeds */
    srv_t *s;
    srv_req_t *r;
    int32_t n_jobs;
    embed_job_t *jobs;
    int32_t n_open;
    int32_t dim;        /* the model's hidden size */
    int32_t dimensions; /* what the client asked for (<= dim) */
    int base64;
    srv_error_t err; /* err.status != 0: the request failed */
} srv_embed_t;

/* ---- the list ---------------------------------------------------------------- */

static void
embed_free(srv_embed_t *em)
{
    if (em == NULL) {
        return;
    }
    for (int32_t i = 0; i < em->n_jobs; i++) {
        free(em->jobs[i].ids);
        free(em->jobs[i].vec);
    }
    free(em->jobs);
    free(em);
}

static void
embed_unlink(srv_embed_t *em)
{
    for (srv_embed_t **pp = &em->s->embeds; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == em) {
            *pp = em->next;
            return;
        }
    }
}

static embed_job_t *
job_find(srv_t *s, uint64_t id, srv_embed_t **owner)
{
    for (srv_embed_t *em = s->embeds; em != NULL; em = em->next) {
        for (int32_t i = 0; i < em->n_jobs; i++) {
            if (em->jobs[i].id == id && em->jobs[i].open) {
                *owner = em;
                return &em->jobs[i];
            }
        }
    }
    return NULL;
}

/* ---- parsing ----------------------------------------------------------------- */

/* Token ids of a JSON array into job (ids checked against the vocabulary).
 * 1, or 0 with err. */
static int
parse_ids(const cJSON *arr, int32_t idx, int32_t vocab, embed_job_t *job, srv_error_t *err)
{
    int32_t n = cJSON_GetArraySize(arr), k = 0;
    const cJSON *it;

    if (n == 0) {
        srv_err_set(err, 400, "input", "input[%d]: an empty token array", idx);
        return 0;
    }
    job->ids = xmalloc_try(sizeof(int32_t) * (size_t)n);
    if (job->ids == NULL) {
        srv_err_oom(err);
        return 0;
    }
    cJSON_ArrayForEach(it, arr)
    {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1.0;
        if (v != (double)(int32_t)v || v < 0 || v >= vocab) {
            srv_err_set(err, 400, "input", "input[%d]: token ids must be integers in 0..%d", idx,
                        vocab - 1);
            return 0;
        }
        job->ids[k++] = (int32_t)v;
    }
    job->n_ids = n;
    return 1;
}

static int
tokenize_text(const srv_t *s, const cJSON *str, int32_t idx, embed_job_t *job, srv_error_t *err)
{
    size_t n = 0;
    int rc;

    if (str->valuestring[0] == '\0') {
        srv_err_set(err, 400, "input", "input[%d]: an empty string cannot be embedded", idx);
        return 0;
    }
    rc = tok_encode(s->tok, str->valuestring, strlen(str->valuestring),
                    TOK_PARSE_SPECIAL | TOK_ADD_SPECIAL, &job->ids, &n);
    if (rc == ST_ENOMEM) {
        srv_err_oom(err);
        return 0;
    }
    if (rc != ST_OK || n == 0) {
        srv_err_set(err, 400, "input", "input[%d] could not be tokenized", idx);
        return 0;
    }
    job->n_ids = (int32_t)n;
    return 1;
}

/* The inputs of root["input"] into em->jobs. 1, or 0 with err. */
static int
parse_inputs(const srv_t *s, const cJSON *input, srv_embed_t *em, srv_error_t *err)
{
    int32_t vocab = tok_vocab_size(s->tok);
    int32_t n;
    const cJSON *it, *first;

    if (cJSON_IsString(input)) {
        n = 1;
    } else if (cJSON_IsArray(input) && (n = cJSON_GetArraySize(input)) > 0) {
        first = cJSON_GetArrayItem(input, 0);
        if (cJSON_IsNumber(first)) {
            n = 1; /* one input given as token ids */
        }
    } else {
        srv_err_set(err, 400, "input",
                    "'input' must be a non-empty string, array of strings, array of token ids "
                    "or array of token-id arrays");
        return 0;
    }
    if (n > SRV_EMBED_MAX_INPUTS) {
        srv_err_set(err, 400, "input", "at most %d inputs per request (got %d)",
                    SRV_EMBED_MAX_INPUTS, n);
        return 0;
    }
    em->jobs = xcalloc_try((size_t)n, sizeof(embed_job_t));
    if (em->jobs == NULL) {
        srv_err_oom(err);
        return 0;
    }
    em->n_jobs = n;
    if (cJSON_IsString(input)) {
        return tokenize_text(s, input, 0, &em->jobs[0], err);
    }
    if (n == 1 && cJSON_IsNumber(cJSON_GetArrayItem(input, 0))) {
        return parse_ids(input, 0, vocab, &em->jobs[0], err);
    }
    int32_t i = 0;
    first = cJSON_GetArrayItem(input, 0);
    cJSON_ArrayForEach(it, input)
    {
        /* One kind per array, as the spec's oneOf has it. */
        if (cJSON_IsString(first) && cJSON_IsString(it)) {
            if (!tokenize_text(s, it, i, &em->jobs[i], err)) {
                return 0;
            }
        } else if (cJSON_IsArray(first) && cJSON_IsArray(it)) {
            if (!parse_ids(it, i, vocab, &em->jobs[i], err)) {
                return 0;
            }
        } else {
            srv_err_set(err, 400, "input",
                        "input[%d]: an array of inputs holds strings or token-id arrays, all "
                        "of one kind",
                        i);
            return 0;
        }
        i++;
    }
    return 1;
}

/* Parses and validates the body into em. 1, or 0 with err. */
static int
parse_body(const srv_t *s, const char *body, size_t len, srv_embed_t *em, srv_error_t *err)
{
    cJSON *root, *j;
    int ok = 0;

    if (!srv_json_precheck(body, len, s->lim.max_depth, err)) {
        return 0;
    }
    unsigned long mark = srv_json_mark();
    root = cJSON_ParseWithLength(body, len);
    if (xmalloc_try_failures() != mark) {
        cJSON_Delete(root);
        srv_err_oom(err);
        return 0;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_err_set(err, 400, NULL, "request body must be a JSON object");
        return 0;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsString(j)) {
        srv_err_set(err, 400, "model", "'model' is required and must be a string");
        goto done;
    }
    if (strcmp(j->valuestring, s->model_name) != 0) {
        srv_err_set(err, 404, "model", "The model '%.100s' does not exist", j->valuestring);
        err->code = "model_not_found";
        goto done;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    if (j != NULL && !cJSON_IsNull(j)) {
        if (!cJSON_IsString(j) ||
            (strcmp(j->valuestring, "float") != 0 && strcmp(j->valuestring, "base64") != 0)) {
            srv_err_set(err, 400, "encoding_format", "'encoding_format' must be float or base64");
            goto done;
        }
        em->base64 = strcmp(j->valuestring, "base64") == 0;
    }
    em->dimensions = em->dim;
    j = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    if (j != NULL && !cJSON_IsNull(j)) {
        if (!cJSON_IsNumber(j) || j->valuedouble != (double)(int32_t)j->valuedouble ||
            j->valuedouble < 1 || j->valuedouble > em->dim) {
            srv_err_set(err, 400, "dimensions",
                        "'dimensions' must be an integer in 1..%d (the model's hidden size)",
                        em->dim);
            goto done;
        }
        em->dimensions = (int32_t)j->valuedouble;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (j != NULL && !cJSON_IsNull(j) && !cJSON_IsString(j)) {
        srv_err_set(err, 400, "user", "'user' must be a string");
        goto done;
    }
    ok = parse_inputs(s, cJSON_GetObjectItemCaseSensitive(root, "input"), em, err);
done:
    cJSON_Delete(root);
    return ok;
}

/* ---- the answer -------------------------------------------------------------- */

/* Cuts v to d values and L2-normalizes them in place. */
static void
normalize(float *v, int32_t d)
{
    double ss = 0.0;

    for (int32_t i = 0; i < d; i++) {
        ss += (double)v[i] * v[i];
    }
    if (ss > 0.0) {
        float inv = (float)(1.0 / sqrt(ss));
        for (int32_t i = 0; i < d; i++) {
            v[i] *= inv;
        }
    }
}

static void
add_base64(srv_buf_t *out, const float *v, int32_t d)
{
    size_t nb = sizeof(float) * (size_t)d;
    unsigned char *le = xmalloc_try(nb);
    size_t cap = 4 * ((nb + 2) / 3) + 1;

    if (le == NULL || !srv_buf_reserve(out, cap + 2)) {
        free(le);
        out->oom = 1;
        return;
    }
    for (int32_t i = 0; i < d; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof(u));
        for (int k = 0; k < 4; k++) {
            le[(size_t)i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k)); /* little-endian */
        }
    }
    out->data[out->len++] = '"';
    int n = EVP_EncodeBlock((unsigned char *)out->data + out->len, le, (int)nb);
    out->len += (size_t)n;
    out->data[out->len++] = '"';
    out->data[out->len] = '\0';
    free(le);
}

/* The CreateEmbeddingResponse body (malloc'd), or NULL when out of memory. */
static char *
build_body(srv_embed_t *em)
{
    srv_buf_t b = {0};
    int64_t prompt_tokens = 0;

    srv_buf_adds(&b, "{\"object\":\"list\",\"data\":[");
    for (int32_t i = 0; i < em->n_jobs; i++) {
        embed_job_t *job = &em->jobs[i];
        normalize(job->vec, em->dimensions);
        srv_buf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":",
                       i ? "," : "", i);
        if (em->base64) {
            add_base64(&b, job->vec, em->dimensions);
        } else {
            srv_buf_adds(&b, "[");
            for (int32_t k = 0; k < em->dimensions; k++) {
                srv_buf_printf(&b, k ? ",%.9g" : "%.9g", (double)job->vec[k]);
            }
            srv_buf_adds(&b, "]");
        }
        srv_buf_adds(&b, "}");
        prompt_tokens += job->n_ids;
    }
    srv_buf_adds(&b, "],\"model\":");
    srv_json_string(&b, em->s->model_name, strlen(em->s->model_name));
    srv_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                   (long long)prompt_tokens, (long long)prompt_tokens);
    if (b.oom) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.data;
}

/* Every job has said its last word: answer, unlink, release the record. */
static void
embed_done(srv_embed_t *em)
{
    srv_req_t *r = em->r;

    for (int32_t i = 0; i < em->n_jobs && !em->err.status; i++) {
        if (em->jobs[i].vec == NULL) {
            srv_err_set(&em->err, 500, NULL, "input[%d]: the engine gave no embedding", i);
        }
    }
    REQ_INFO(srv_req_id(r), "embeddings done %s inputs=%d", em->err.status ? "error" : "ok",
             em->n_jobs);
    if (srv_req_live(r)) {
        if (em->err.status) {
            /* A NULL body is the static 503. */
            srv_req_answer(r, em->err.status, srv_err_json(&em->err), NULL,
                           em->err.status == 429 || em->err.status == 503 ? 1 : 0);
        } else {
            srv_req_answer(r, 200, build_body(em), NULL, 0);
        }
    }
    embed_unlink(em);
    embed_free(em);
    srv_req_busy(r, -1);
}

int
srv_embed_on_msg(srv_t *s, const msg_t *m)
{
    srv_embed_t *em = NULL;
    embed_job_t *job;

    switch (m->type) {
    case ENG_MSG_EMBED: {
        const eng_msg_embed_t *e = (const eng_msg_embed_t *)m;
        if ((job = job_find(s, e->id, &em)) == NULL) {
            return 0;
        }
        if (e->dim != em->dim || job->vec != NULL) {
            return 1;
        }
        job->vec = xmalloc_try(sizeof(float) * (size_t)em->dim);
        if (job->vec == NULL) {
            if (!em->err.status) {
                srv_err_oom(&em->err);
            }
            return 1;
        }
        memcpy(job->vec, e->vec, sizeof(float) * (size_t)em->dim);
        return 1;
    }
    case ENG_MSG_FINISHED: {
        const eng_msg_finished_t *f = (const eng_msg_finished_t *)m;
        if ((job = job_find(s, f->id, &em)) == NULL) {
            return 0;
        }
        break;
    }
    case ENG_MSG_ERROR: {
        const eng_msg_error_t *e = (const eng_msg_error_t *)m;
        if ((job = job_find(s, e->id, &em)) == NULL) {
            return 0;
        }
        if (!em->err.status) {
            int failed = s->engine != NULL && !engine_alive(s->engine);
            srv_err_set(&em->err, srv_http_status_of(e->status, failed), NULL, "%s",
                        e->message[0] ? e->message : st_str(e->status));
        }
        break;
    }
    case ENG_MSG_DELTA: {
        const eng_msg_delta_t *d = (const eng_msg_delta_t *)m;
        return job_find(s, d->id, &em) != NULL; /* never sent for embeddings */
    }
    default:
        return 0;
    }
    job->open = 0;
    if (--em->n_open == 0) {
        embed_done(em);
    }
    return 1;
}

/* ---- start ------------------------------------------------------------------- */

/* The SUBMIT of one input (its tokens move into it), or NULL when out of
 * memory. */
static eng_msg_submit_t *
make_submit(const srv_t *s, embed_job_t *job, int tenant, uint64_t t0)
{
    eng_msg_submit_t *m = xcalloc_try(1, sizeof(*m));
    eng_request_t *q;

    if (m == NULL) {
        return NULL;
    }
    q = &m->req;
    m->hdr.type = ENG_MSG_SUBMIT;
    q->id = job->id;
    q->tenant = (uint32_t)tenant;
    q->prompt = job->ids; /* ownership passes with the message */
    q->n_prompt = job->n_ids;
    q->sampling.temperature = 0.0f;
    q->sampling.top_p = 1.0f;
    q->sampling.repetition_penalty = 1.0f;
    q->n = 1;
    q->max_tokens = 1;
    q->kv_window = -1; /* the whole prompt is read: full KV */
    q->t_arrival_ns = t0;
    q->pooling = strcmp(s->cfg->pooling, "mean") == 0 ? ENG_POOL_MEAN : ENG_POOL_LAST;
    return m;
}

/* The costly part, on the thread pool (srv_work.h): parse the body and
 * tokenize the inputs into em, and check their lengths. Touches only
 * this record, em, the body (borrowed) and the server's read-only state. */
typedef struct embed_prep {
    srv_embed_t *em;
    const char *body;
    size_t len;
    int ok;
    srv_error_t err;
} embed_prep_t;

static void
embed_prep_run(void *arg)
{
    embed_prep_t *w = arg;
    srv_embed_t *em = w->em;
    const srv_t *s = em->s;

    if (!parse_body(s, w->body, w->len, em, &w->err)) {
        return;
    }
    for (int32_t i = 0; i < em->n_jobs; i++) {
        embed_job_t *job = &em->jobs[i];
        /* One more slot for the token sampled after the prompt. */
        if (job->n_ids > s->max_model_len - 1 ||
            (s->kv_blocks > 0 && (job->n_ids + s->block_size) / s->block_size > s->kv_blocks)) {
            srv_err_set(&w->err, 400, "input",
                        "input[%d] has %d tokens; at most %d fit this model's context", i,
                        job->n_ids, s->max_model_len - 1);
            return;
        }
    }
    w->ok = 1;
}

static void embed_submit(srv_req_t *r, srv_embed_t *em);

static void
embed_prep_done(srv_req_t *r, void *arg, int live)
{
    embed_prep_t *w = arg;
    srv_embed_t *em = w->em;

    if (live && !w->ok) {
        srv_req_answer_error(r, &w->err);
    }
    if (live && w->ok && !srv_req_half_close(r, 0)) {
        embed_submit(r, em);
    } else {
        embed_free(em);
    }
    free(w);
}

enum MHD_Result
srv_embed_start(srv_req_t *r)
{
    srv_t *s = srv_req_server(r);
    srv_embed_t *em;
    embed_prep_t *w;

    if (s->cfg->device[0] != '\0' && strcmp(s->cfg->device, "cpu") != 0) {
        return srv_req_reply_errmsg(r, 400, NULL,
                                    "embeddings are served by the cpu backend only (the "
                                    "cuda backend does not give hidden states yet)");
    }
    em = xcalloc_try(1, sizeof(*em));
    w = em != NULL ? xcalloc_try(1, sizeof(*w)) : NULL;
    if (w == NULL) {
        free(em);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    em->s = s;
    em->r = r;
    em->dim = s->model != NULL ? mdl_model_config(s->model)->dim : 0;
    w->em = em;
    w->body = srv_req_body(r, &w->len);
    if (!srv_work_queue(r, embed_prep_run, embed_prep_done, w)) {
        free(w);
        free(em);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    return MHD_YES;
}

/* The inputs tokenized (on the loop thread again, r waiting): the jobs'
 * SUBMITs. Answers r on any error. Takes em. */
static void
embed_submit(srv_req_t *r, srv_embed_t *em)
{
    srv_t *s = srv_req_server(r);
    eng_msg_submit_t **msgs = NULL;

    if (s->engine == NULL || !engine_alive(s->engine)) {
        srv_error_t err;
        embed_free(em);
        srv_err_set(&err, 503, NULL, "the engine is not running");
        srv_req_answer_error(r, &err);
        return;
    }
    /* Everything is allocated before any job is registered or sent. */
    msgs = xcalloc_try((size_t)em->n_jobs, sizeof(*msgs));
    if (msgs == NULL || !srv_req_reserve(r)) {
        free(msgs);
        embed_free(em);
        srv_req_answer(r, 503, NULL, NULL, 1);
        return;
    }
    for (int32_t i = 0; i < em->n_jobs; i++) {
        em->jobs[i].id = i == 0 ? srv_req_id(r) : s->next_id++;
        msgs[i] = make_submit(s, &em->jobs[i], srv_req_tenant(r), srv_req_arrival_ns(r));
        if (msgs[i] == NULL) {
            for (int32_t k = 0; k < i; k++) {
                em->jobs[k].ids = msgs[k]->req.prompt; /* back to the job */
                msgs[k]->req.prompt = NULL;
                eng_msg_free(&msgs[k]->hdr);
            }
            free(msgs);
            srv_req_unreserve(r);
            embed_free(em);
            srv_req_answer(r, 503, NULL, NULL, 1);
            return;
        }
    }
    int64_t total = 0;
    for (int32_t i = 0; i < em->n_jobs; i++) {
        em->jobs[i].ids = NULL; /* the message owns the tokens now */
        em->jobs[i].open = 1;
        total += msgs[i]->req.n_prompt;
    }
    em->n_open = em->n_jobs;
    em->next = s->embeds;
    s->embeds = em;
    srv_req_busy(r, 1);
    REQ_INFO(srv_req_id(r), "embeddings tenant=%s inputs=%d prompt_tokens=%lld pooling=%s",
             s->cfg->tenants[srv_req_tenant(r)].name, em->n_jobs, (long long)total,
             s->cfg->pooling);
    for (int32_t i = 0; i < em->n_jobs; i++) {
        chan_send(engine_inbox(s->engine), &msgs[i]->hdr);
    }
    free(msgs);
    /* r waits on (srv_work_queue suspended it) for the engine's answer. */
}
