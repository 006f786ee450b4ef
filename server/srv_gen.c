/* srv_gen.c - generation: a completions or chat completions request from
 * its parsed body to the engine's jobs, and the engine's outbox messages
 * back to a JSON body or an SSE stream.
 *
 * DESIGN
 *   srv_gen_start() hands the costly part to the thread pool (srv_work.h):
 *   parse and validate the body, let the endpoint turn it into prompts
 *   (srv_api_t.prepare: the chat template), tokenize, check the context.
 *   Back on the loop thread, gen_submit() allocates everything the
 *   generation will need, then registers one job per prompt (found by id
 *   in s->jobs) and sends their SUBMITs. Outbox
 *   messages update the choices: DELTA tokens are detokenized
 *   incrementally and run through the stop-string matcher (srv_stop_t;
 *   the text returned ends before a stop string, and the engine is told to
 *   finish that choice with CANCEL(as_stop)); the released text is either
 *   kept for the body or framed into an SSE chunk at once. When every job
 *   has said its last word (FINISHED per choice, or ERROR) the request is
 *   answered: the body, the error, or the stream's usage chunk and [DONE].
 *
 *   Out of memory while the request runs ends it alone with a 503 (a
 *   plain response before a stream's headers, an error event and [DONE]
 *   after) once its jobs, cancelled, have finished.
 *
 * Thread: loop thread, except gen_prep_run (a pool thread).
 */
#define LOG_MODULE "http"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_gen.h"
#include "server/srv_tools.h"
#include "server/srv_grammar.h"
#include "server/srv_outq.h"
#include "server/srv_work.h"

/* Room a stream's output buffer gets up front: chunks of a client that
 * reads along never make it grow (one allocation, not one per doubling
 * at a moment that depends on how fast the client reads). */
#define SRV_STREAM_RESERVE (16 * 1024)

/* One engine submission: one prompt of a request, n choices. */
typedef struct srv_job {
    struct srv_job *hnext; /* s->jobs bucket chain */
    uint64_t id;
    srv_gen_t *gen;
    int32_t prompt_idx;
    int32_t n_open; /* choices without FINISHED yet */
    int open;       /* the engine still owes messages */
    int32_t prompt_tokens;
    int32_t cached_tokens;
} srv_job_t;

struct srv_gen {
    srv_req_t *r; /* the request this generation answers; owns it */
    srv_t *s;
    uint64_t id; /* the request's id (and its first job's) */
    int tenant;
    uint64_t t_arrival_ns;
    uint64_t t_first_ns;
    srv_params_t p;
    int have_params;
    srv_resp_t rs; /* the builders' view of this request */

    int32_t n_jobs;
    srv_job_t *jobs;
    int32_t jobs_open;
    int32_t n_choices;
    srv_choice_t *choices;

    /* Streaming. */
    srv_outq_t out; /* appended at out.buf, read from out.off */
    srv_buf_t chunk_prefix; /* 'data: {"id":...,"choices":[{"index":' */
    int out_eos;
    int stream_error;        /* an error event was sent */
    srv_buf_t tail;          /* the error event and [DONE], sent after out */
    const char *tail_static; /* ... or this, when tail could not be built */
    size_t tail_off;         /* bytes of the tail already sent */

    srv_error_t err; /* err.status != 0: the request failed */
};

/* ---- job table --------------------------------------------------------------- */

static srv_job_t **
job_slot(srv_t *s, uint64_t id)
{
    return &s->jobs[id & (SRV_JOB_BUCKETS - 1)];
}

static srv_job_t *
job_find(srv_t *s, uint64_t id)
{
    for (srv_job_t *j = *job_slot(s, id); j != NULL; j = j->hnext) {
        if (j->id == id) {
            return j;
        }
    }
    return NULL;
}

static void
job_unlink(srv_t *s, srv_job_t *job)
{
    for (srv_job_t **pp = job_slot(s, job->id); *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == job) {
            *pp = job->hnext;
            return;
        }
    }
}

static void
send_cancel(srv_t *s, uint64_t id, int as_stop, int32_t choice)
{
    eng_msg_cancel_t *m;

    if (s->engine == NULL) {
        return;
    }
    /* Without memory for the message the job runs on to its end: its
     * output is ignored, and its blocks are freed when it finishes. */
    m = xcalloc_try(1, sizeof(*m));
    if (m == NULL) {
        REQ_WARN(id, "out of memory: cancel not sent, the job runs to its end");
        return;
    }
    m->hdr.type = ENG_MSG_CANCEL;
    m->id = id;
    m->as_stop = as_stop;
    m->choice = choice;
    chan_send(engine_inbox(s->engine), &m->hdr);
}

static void
cancel_jobs(srv_gen_t *g)
{
    for (int32_t i = 0; i < g->n_jobs; i++) {
        if (g->jobs[i].open) {
            send_cancel(g->s, g->jobs[i].id, 0, -1);
        }
    }
}

void
srv_gen_free(srv_gen_t *g)
{
    if (g == NULL) {
        return;
    }
    for (int32_t i = 0; g->choices != NULL && i < g->n_choices; i++) {
        if (g->choices[i].tp != NULL) {
            srv_tp_fini(g->choices[i].tp);
            free(g->choices[i].tp);
        }
    }
    for (int32_t i = 0; i < g->n_choices; i++) {
        srv_stop_free(&g->choices[i].stop);
        srv_buf_free(&g->choices[i].text);
        cJSON_Delete(g->choices[i].lp);
    }
    for (int32_t i = 0; i < g->n_jobs; i++) {
        if (g->jobs[i].open) {
            job_unlink(g->s, &g->jobs[i]);
        }
    }
    free(g->choices);
    free(g->jobs);
    if (g->have_params) {
        srv_params_free(&g->p);
    }
    srv_outq_free(&g->out);
    srv_buf_free(&g->chunk_prefix);
    srv_buf_free(&g->tail);
    free(g);
}

int
srv_gen_open(const srv_gen_t *g)
{
    return g->jobs_open > 0;
}

static srv_usage_t
usage_of(const srv_gen_t *g)
{
    srv_usage_t u = {0, 0, 0};

    for (int32_t j = 0; j < g->n_jobs; j++) {
        u.prompt_tokens += g->p.prompts[g->jobs[j].prompt_idx].n_ids;
        u.cached_tokens += g->jobs[j].cached_tokens;
    }
    for (int32_t c = 0; c < g->n_choices; c++) {
        u.completion_tokens += g->choices[c].n_tokens;
    }
    return u;
}

/* ---- streaming --------------------------------------------------------------- */

/* The last words of a stream that failed: an error event and [DONE], sent
 * after what out holds. They go to their own buffer, so that a stream that
 * failed for lack of memory can still end cleanly (a static event when even
 * that buffer cannot be had). */
static void
stream_error_event(srv_gen_t *g)
{
    static const char oom_event[] = "data: {\"error\":{\"message\":\"the server is out of "
                                    "memory; retry later\",\"type\":\"service_unavailable_"
                                    "error\",\"param\":null,\"code\":\"service_unavailable\"}}"
                                    "\n\ndata: [DONE]\n\n";
    char *e = srv_err_json(&g->err);

    srv_buf_free(&g->tail);
    if (e != NULL) {
        srv_sse_data(&g->tail, e);
        srv_sse_done(&g->tail);
        free(e);
    }
    if (e == NULL || g->tail.oom) {
        srv_buf_free(&g->tail);
        g->tail_static = oom_event;
    }
    g->tail_off = 0;
    g->stream_error = 1;
    g->out_eos = 1;
}

/* Out of memory while the request runs: it ends with the 503 error (a plain
 * response before a stream's headers, an error event and [DONE] after)
 * once its jobs, cancelled here, have finished. */
static void
fail_oom(srv_gen_t *g)
{
    if (g->err.status) {
        return;
    }
    srv_err_oom(&g->err);
    REQ_WARN(g->id, "out of memory: cancelling");
    cancel_jobs(g);
}

/* Drops what out received after out_len (a torn chunk). */
static void
out_truncate(srv_gen_t *g, size_t out_len)
{
    g->out.buf.len = out_len;
    g->out.buf.oom = 0;
    if (g->out.buf.data != NULL) {
        g->out.buf.data[out_len] = '\0';
    }
}

static void
stream_emit(srv_gen_t *g, int32_t ci, srv_choice_t *ch, const srv_buf_t *piece, cJSON *lp,
            const char *finish)
{
    unsigned long mark = srv_json_mark();
    size_t out_len = g->out.buf.len;

    if (g->stream_error || srv_req_gone(g->r) || g->err.status) {
        cJSON_Delete(lp);
        return;
    }
    if (piece->len == 0 && lp == NULL && finish == NULL && !g->rs.api->chunk_owed(&g->rs, ch)) {
        return;
    }
    srv_api_chunk(&g->rs, &g->chunk_prefix, ci, ch, piece, lp, finish, &g->out.buf);
    if (xmalloc_try_failures() != mark) {
        /* Drop the torn chunk: the stream ends after the last whole one. */
        out_truncate(g, out_len);
        srv_buf_free(&g->chunk_prefix);
        fail_oom(g);
        return;
    }

    if ((int64_t)srv_outq_pending(&g->out) > g->s->cfg->max_sse_buffer_bytes) {
        srv_err_set(&g->err, 400, NULL,
                    "the client does not read the stream fast enough (%lld bytes unsent)",
                    (long long)srv_outq_pending(&g->out));
        g->err.code = "slow_consumer";
        REQ_WARN(g->id, "%s: cancelling", g->err.message);
        cancel_jobs(g);
        stream_error_event(g);
    }
    srv_req_kick(g->r);
}

/* Text released for a choice: streamed at once or kept for the body. */
static void
choice_emit(srv_gen_t *g, int32_t ci, srv_choice_t *ch, srv_buf_t *piece, cJSON *lp,
            const char *finish)
{
    if (ch->tp != NULL) {
        /* Tool calls and reasoning (srv_toolparse.h): the parser keeps the
         * results for the body; a stream sends its events one chunk each,
         * then the finish in a chunk of its own. */
        srv_buf_t none = {0};
        srv_tp_feed(ch->tp, piece->data ? piece->data : "", piece->len, finish != NULL);
        if (ch->tp->oom) {
            cJSON_Delete(g->p.stream ? lp : NULL);
            fail_oom(g);
            return;
        }
        if (finish != NULL) {
            ch->finish = finish = srv_tp_finish_reason(ch->tp, finish);
        }
        while (g->p.stream && srv_tp_pending(ch->tp) && !g->err.status && !g->stream_error) {
            stream_emit(g, ci, ch, &none, lp, NULL);
            lp = NULL;
        }
        if (g->p.stream && (finish != NULL || lp != NULL)) {
            stream_emit(g, ci, ch, &none, lp, finish);
        }
        return;
    }
    if (g->p.stream) {
        stream_emit(g, ci, ch, piece, lp, finish);
    } else if (piece->len > 0) {
        srv_buf_add(&ch->text, piece->data, piece->len);
    }
}

int
srv_gen_stream_ready(const srv_gen_t *g)
{
    return g->p.stream && (srv_outq_pending(&g->out) > 0 || g->out_eos);
}

ssize_t
srv_gen_read(srv_gen_t *g, char *buf, size_t max)
{
    size_t n;

    if (srv_outq_pending(&g->out) > 0) {
        return (ssize_t)srv_outq_read(&g->out, buf, max);
    }
    if (g->out_eos) {
        const char *t = g->tail_static != NULL ? g->tail_static : g->tail.data;
        size_t tl = g->tail_static != NULL ? strlen(g->tail_static) : g->tail.len;
        if (t != NULL && g->tail_off < tl) {
            n = tl - g->tail_off < max ? tl - g->tail_off : max;
            memcpy(buf, t + g->tail_off, n);
            g->tail_off += n;
            return (ssize_t)n;
        }
        return -1;
    }
    return 0;
}

/* ---- the end ----------------------------------------------------------------- */

/* The end of a stream that went well: the usage chunk if asked for, then
 * [DONE]. */
static void
stream_end(srv_gen_t *g)
{
    size_t out_len = g->out.buf.len;
    unsigned long mark = srv_json_mark();

    if (g->rs.api->stream_end != NULL) {
        srv_usage_t u = usage_of(g);
        g->rs.api->stream_end(&g->rs, &g->choices[0], &u, &g->out.buf);
    } else {
        if (g->p.include_usage) {
            srv_usage_t u = usage_of(g);
            srv_api_usage_chunk(&g->rs, &u, &g->out.buf);
        }
        srv_sse_done(&g->out.buf);
    }
    if (xmalloc_try_failures() != mark) {
        out_truncate(g, out_len);
        srv_err_oom(&g->err);
        REQ_WARN(g->id, "out of memory ending the stream");
        stream_error_event(g);
    } else {
        g->out_eos = 1;
    }
}

/* Every job has said its last word. */
static void
request_done(srv_gen_t *g)
{
    srv_t *s = g->s;
    srv_req_t *r = g->r;
    uint64_t now = now_ns();
    srv_tenant_metrics_t *tm = &s->metrics.tenant[g->tenant];
    int64_t completion = 0;

    s->n_gen--;
    s->metrics.in_flight = s->n_gen;
    for (int32_t c = 0; c < g->n_choices; c++) {
        completion += g->choices[c].n_tokens;
    }
    srv_hist_observe(&tm->e2e, (double)(now - g->t_arrival_ns) / 1e9);
    for (int32_t j = 0; j < g->n_jobs; j++) {
        tm->prompt_tokens += (uint64_t)g->p.prompts[g->jobs[j].prompt_idx].n_ids;
    }
    REQ_INFO(g->id, "done %s completion_tokens=%lld ttft_ms=%.1f e2e_ms=%.1f%s",
             g->err.status ? "error" : "ok", (long long)completion,
             g->t_first_ns ? (double)(g->t_first_ns - g->t_arrival_ns) / 1e6 : -1.0,
             (double)(now - g->t_arrival_ns) / 1e6, srv_req_gone(r) ? " (client gone)" : "");
    if (!srv_req_live(r)) {
        return;
    }
    if (g->p.stream && !(g->err.status && srv_outq_pending(&g->out) == 0 && srv_req_waiting(r))) {
        if (!g->stream_error) {
            if (g->err.status) {
                stream_error_event(g);
            } else {
                stream_end(g);
            }
        }
        srv_req_kick(r);
    } else if (g->err.status) {
        /* A NULL body is the static 503. */
        srv_req_answer(r, g->err.status, srv_err_json(&g->err), NULL,
                       g->err.status == 429 || g->err.status == 503 ? 1 : 0);
    } else {
        srv_usage_t u = usage_of(g);
        srv_req_answer(r, 200, srv_api_body(&g->rs, g->choices, g->n_choices, &u), NULL, 0);
    }
}

static void
job_done(srv_gen_t *g, srv_job_t *job)
{
    job->open = 0;
    job_unlink(g->s, job);
    if (--g->jobs_open == 0) {
        request_done(g);
    }
}

/* ---- outbox messages --------------------------------------------------------- */

/* A token that may end its choice: EOS (unless ignore_eos) or one of
 * stop_token_ids, once min_tokens are out (n_generated counts it). As in
 * vLLM, the token that stops a choice is not part of its text, whatever
 * skip_special_tokens says; the engine names it in FINISHED.stop_token,
 * which arrives with its DELTA (one outbox batch), so on_delta holds such
 * a token back and on_finished (or the next DELTA) settles it. */
static int
maybe_stop(const srv_gen_t *g, int32_t token, int32_t n_generated)
{
    const srv_params_t *p = &g->p;

    if (n_generated < p->min_tokens) {
        return 0;
    }
    for (int32_t i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] == token) {
            return 1;
        }
    }
    if (p->ignore_eos) {
        return 0;
    }
    if (g->s->model != NULL) {
        const mdl_config_t *mc = mdl_model_config(g->s->model);
        for (int32_t i = 0; i < mc->n_eos; i++) {
            if (mc->eos_ids[i] == token) {
                return 1;
            }
        }
    }
    return tok_eos_id(g->s->tok) == token;
}

/* Detokenizes token into the choice's stream and its stop matcher, which
 * appends what it releases to piece. Returns 1 when a stop string matched.
 * A token's text is not bounded (an added token may be long): a piece too
 * long for the stack buffer is decoded into a heap one. Out of memory
 * shows as a failed fallible allocation (the caller's mark). */
static int
choice_push(srv_gen_t *g, srv_choice_t *ch, int32_t token, srv_buf_t *piece)
{
    char tb[256], *big = NULL;
    const char *text = tb;
    int n = tok_stream_push(&ch->ds, token, tb, sizeof(tb));
    int matched;

    if (n == ST_ERANGE) {
        size_t len = 0;
        (void)tok_token_bytes(g->s->tok, token, &len);
        size_t cap = len + sizeof(ch->ds.pending) + 1;
        big = xmalloc_try(cap);
        n = big != NULL ? tok_stream_push(&ch->ds, token, big, cap) : ST_ENOMEM;
        text = big;
    }
    matched = srv_stop_feed(&ch->stop, text, n > 0 ? (size_t)n : 0, piece);
    free(big);
    return matched;
}

static void
on_delta(srv_gen_t *g, srv_job_t *job, const eng_msg_delta_t *d)
{
    srv_t *s = g->s;
    const srv_api_t *api = g->rs.api;
    int32_t ci = job->prompt_idx * g->p.n + d->choice;
    srv_choice_t *ch;
    srv_tenant_metrics_t *tm = &s->metrics.tenant[g->tenant];
    uint64_t now = now_ns();
    srv_buf_t piece = {0};
    cJSON *lp = NULL;
    unsigned long mark = srv_json_mark();

    if (d->choice < 0 || d->choice >= g->p.n || d->n_tokens <= 0) {
        return;
    }
    ch = &g->choices[ci];
    if (ch->finish != NULL || g->err.status) {
        return;
    }
    if (g->t_first_ns == 0) {
        g->t_first_ns = now;
        srv_hist_observe(&tm->ttft, (double)(now - g->t_arrival_ns) / 1e9);
        srv_lat_add(&s->lat.ttft, now, (double)(now - g->t_arrival_ns) / 1e9);
    } else if (ch->t_last_ns != 0) {
        double gap = (double)(now - ch->t_last_ns) / 1e9 / d->n_tokens;
        for (int32_t i = 0; i < d->n_tokens; i++) {
            srv_hist_observe(&tm->itl, gap);
            srv_lat_add(&s->lat.itl, now, gap);
        }
    }
    ch->t_last_ns = now;
    if (g->p.logprobs) {
        lp = g->p.stream ? api->lp_new() : (ch->lp ? ch->lp : (ch->lp = api->lp_new()));
    }
    /* A held token followed by more tokens did not stop the choice. */
    if (ch->held_tok >= 0) {
        int32_t h = ch->held_tok;
        ch->held_tok = -1;
        if (choice_push(g, ch, h, &piece)) {
            ch->finish = "stop";
            send_cancel(s, job->id, 1, d->choice);
        }
    }
    for (int32_t i = 0; ch->finish == NULL && i < d->n_tokens && i < ENG_DELTA_MAX; i++) {
        const smp_result_t *t = &d->tok[i];
        ch->n_tokens++;
        tm->generation_tokens++;
        if (lp != NULL) {
            api->lp_add(&g->rs, ch, lp, t);
        }
        if (i == d->n_tokens - 1 && maybe_stop(g, t->token, ch->n_tokens)) {
            ch->held_tok = t->token;
            break;
        }
        if (choice_push(g, ch, t->token, &piece)) {
            ch->finish = "stop";
            send_cancel(s, job->id, 1, d->choice);
            break;
        }
    }
    if (xmalloc_try_failures() != mark) {
        /* Text or logprobs of this token were lost: the request fails. */
        if (g->p.stream) {
            cJSON_Delete(lp);
        }
        srv_buf_free(&piece);
        fail_oom(g);
        return;
    }
    choice_emit(g, ci, ch, &piece, g->p.stream ? lp : NULL, ch->finish);
    srv_buf_free(&piece);
    if (xmalloc_try_failures() != mark) {
        fail_oom(g); /* ch->text could not hold the piece */
    }
}

static void
on_finished(srv_gen_t *g, srv_job_t *job, const eng_msg_finished_t *f)
{
    srv_tenant_metrics_t *tm = &g->s->metrics.tenant[g->tenant];
    int32_t ci = job->prompt_idx * g->p.n + f->choice;
    srv_choice_t *ch;
    char tb[64];

    if (f->choice < 0 || f->choice >= g->p.n) {
        return;
    }
    ch = &g->choices[ci];
    if (ch->engine_done) {
        return;
    }
    ch->engine_done = 1;
    job->prompt_tokens = f->prompt_tokens;
    job->cached_tokens = f->cached_tokens;
    switch (f->reason) {
    case ENG_FINISH_LENGTH:
        tm->finished_length++;
        break;
    case ENG_FINISH_ABORT:
        tm->finished_abort++;
        break;
    default:
        tm->finished_stop++;
        break;
    }
    if (ch->finish == NULL && !g->err.status) {
        srv_buf_t piece = {0};
        unsigned long mark = srv_json_mark();
        int32_t h = ch->held_tok;
        ch->held_tok = -1;
        /* The held token is text unless it is the one that stopped. */
        int stopped = h >= 0 && h != f->stop_token && choice_push(g, ch, h, &piece);
        int n = stopped ? 0 : tok_stream_flush(&ch->ds, tb, sizeof(tb));
        if (stopped || srv_stop_feed(&ch->stop, tb, n > 0 ? (size_t)n : 0, &piece)) {
            ch->finish = "stop";
        } else {
            srv_stop_finish(&ch->stop, &piece);
            ch->finish = f->reason == ENG_FINISH_LENGTH ? "length" : "stop";
        }
        if (xmalloc_try_failures() == mark) {
            choice_emit(g, ci, ch, &piece, NULL, ch->finish);
        }
        srv_buf_free(&piece);
        if (xmalloc_try_failures() != mark) {
            fail_oom(g);
        }
    }
    if (--job->n_open == 0) {
        job_done(g, job);
    }
}

static void
on_error(srv_gen_t *g, srv_job_t *job, const eng_msg_error_t *e)
{
    srv_t *s = g->s;
    srv_tenant_metrics_t *tm = &s->metrics.tenant[g->tenant];

    tm->finished_error++;
    if (!g->err.status) {
        /* The engine marks itself dead before it fails the open requests,
         * so a dead engine here means the error is its own, whatever the
         * status (a forward can fail with ST_EINVAL). */
        int failed = s->engine != NULL && !engine_alive(s->engine);
        int status = srv_http_status_of(e->status, failed);
        srv_err_set(&g->err, status, NULL, "%s", e->message[0] ? e->message : st_str(e->status));
        if (status == 429) {
            tm->rejected++;
        }
        job->open = 0; /* do not cancel the job that failed */
        cancel_jobs(g);
        job->open = 1;
    }
    job_done(g, job);
}

void
srv_gen_on_msg(srv_t *s, const msg_t *m)
{
    srv_job_t *job;

    switch (m->type) {
    case ENG_MSG_DELTA: {
        const eng_msg_delta_t *d = (const eng_msg_delta_t *)m;
        if ((job = job_find(s, d->id)) != NULL) {
            on_delta(job->gen, job, d);
        }
        break;
    }
    case ENG_MSG_FINISHED: {
        const eng_msg_finished_t *f = (const eng_msg_finished_t *)m;
        if ((job = job_find(s, f->id)) != NULL) {
            srv_gen_t *g = job->gen;
            on_finished(g, job, f);
            srv_req_maybe_free(g->r);
        }
        break;
    }
    case ENG_MSG_ERROR: {
        const eng_msg_error_t *e = (const eng_msg_error_t *)m;
        if ((job = job_find(s, e->id)) != NULL) {
            srv_gen_t *g = job->gen;
            on_error(g, job, e);
            srv_req_maybe_free(g->r);
        }
        break;
    }
    default:
        break;
    }
}

void
srv_gen_cancel(srv_gen_t *g)
{
    cancel_jobs(g);
}

void
srv_gen_abort(srv_gen_t *g, const char *why)
{
    if (g->jobs_open > 0 && !g->err.status) {
        srv_err_set(&g->err, 503, NULL, "%s", why);
        cancel_jobs(g);
    }
}

void
srv_gen_sweep(srv_gen_t *g, uint64_t now, uint64_t limit_ns)
{
    if (g->jobs_open > 0 && !g->err.status && now - g->t_arrival_ns > limit_ns) {
        srv_err_set(&g->err, 503, NULL, "the request took longer than %.0f s",
                    g->s->cfg->request_timeout_s);
        g->err.code = "timeout";
        REQ_WARN(g->id, "%s: cancelling", g->err.message);
        cancel_jobs(g);
    }
}

/* ---- start ------------------------------------------------------------------- */

/* Builds the SUBMIT message of one job, or NULL when out of memory (nothing
 * is left allocated then). */
static eng_msg_submit_t *
make_submit(const srv_gen_t *g, const srv_job_t *job)
{
    const srv_params_t *p = &g->p;
    const srv_prompt_t *pr = &p->prompts[job->prompt_idx];
    eng_msg_submit_t *m = xcalloc_try(1, sizeof(*m));
    eng_request_t *q;

    if (m == NULL) {
        return NULL;
    }
    q = &m->req;
    m->hdr.type = ENG_MSG_SUBMIT;
    q->id = job->id;
    q->tenant = (uint32_t)g->tenant;
    q->priority = p->priority;
    q->kv_sink = p->kv_sink;
    q->kv_window = p->kv_window;
    q->kv_score = p->kv_score;
    q->prompt = xmalloc_try(sizeof(int32_t) * (size_t)pr->n_ids);
    if (q->prompt == NULL) {
        free(m);
        return NULL;
    }
    memcpy(q->prompt, pr->ids, sizeof(int32_t) * (size_t)pr->n_ids);
    q->n_prompt = pr->n_ids;
    q->sampling = p->sampling;
    if (p->sampling.n_bias > 0) {
        smp_bias_t *b = xmalloc_try(sizeof(smp_bias_t) * (size_t)p->sampling.n_bias);
        if (b == NULL) {
            free(q->prompt);
            free(m);
            return NULL;
        }
        memcpy(b, p->bias, sizeof(smp_bias_t) * (size_t)p->sampling.n_bias);
        q->sampling.bias = b;
    } else {
        q->sampling.bias = NULL;
        q->sampling.n_bias = 0;
    }
    q->seed = p->seed;
    q->has_seed = p->has_seed;
    q->n = p->n;
    q->max_tokens = p->max_tokens;
    q->min_tokens = p->min_tokens;
    q->ignore_eos = p->ignore_eos;
    q->no_speculative = !p->speculative;
    memcpy(q->stop_ids, p->stop_ids, sizeof(q->stop_ids));
    q->n_stop_ids = p->n_stop_ids;
    q->t_arrival_ns = g->t_arrival_ns;
    if (p->constraint.kind != SRV_CONSTRAINT_NONE) {
        /* Each job's own grammar (its matchers and mask cache live on the
         * engine thread); the spec compiled once already in srv_gen_start. */
        srv_error_t e;
        if (!srv_grammar_compile(g->s->gr_vocab, &p->constraint, &q->grammar, &e)) {
            free((void *)q->sampling.bias);
            free(q->prompt);
            free(m);
            return NULL;
        }
    }
    return m;
}

static void
free_tp(srv_gen_t *g, int32_t n)
{
    for (int32_t c = 0; c < n; c++) {
        if (g->choices[c].tp != NULL) {
            srv_tp_fini(g->choices[c].tp);
            free(g->choices[c].tp);
            g->choices[c].tp = NULL;
        }
    }
}

/* The output parser of each choice, when the request needs one
 * (srv_tools.h). 1, or 0 with none left allocated. */
static int
alloc_tp(srv_gen_t *g, int32_t n)
{
    srv_tp_cfg_t cfg;

    if (!g->p.ext.output) {
        return 1;
    }
    for (int32_t c = 0; c < n; c++) {
        srv_tools_tp_cfg(&g->p, g->id * 1000003u + (uint64_t)g->rs.created + (uint64_t)c, &cfg);
        g->choices[c].tp = xcalloc_try(1, sizeof(srv_tp_t));
        if (g->choices[c].tp == NULL || !srv_tp_init(g->choices[c].tp, &cfg)) {
            free(g->choices[c].tp);
            g->choices[c].tp = NULL;
            free_tp(g, c);
            return 0;
        }
    }
    return 1;
}

/* Allocates, fallibly, everything the generation needs (jobs, choices, the
 * hang-up watch, the stream's room) and the SUBMIT messages into msgs.
 * Returns 1, or 0 with nothing left allocated. */
static int
alloc_jobs(srv_gen_t *g, int32_t n_jobs, eng_msg_submit_t **msgs)
{
    srv_req_t *r = g->r;

    g->jobs = xcalloc_try((size_t)n_jobs, sizeof(srv_job_t));
    g->choices = g->jobs ? xcalloc_try((size_t)(n_jobs * g->p.n), sizeof(srv_choice_t)) : NULL;
    if (g->choices != NULL && !alloc_tp(g, n_jobs * g->p.n)) {
        free(g->choices);
        g->choices = NULL;
    }
    if (g->choices != NULL &&
        (!srv_req_reserve(r) ||
         (g->p.stream && !srv_buf_reserve(&g->out.buf, SRV_STREAM_RESERVE)))) {
        free_tp(g, n_jobs * g->p.n);
        free(g->choices);
        g->choices = NULL;
    }
    for (int32_t j = 0; g->choices != NULL && j < n_jobs; j++) {
        g->jobs[j].id = j == 0 ? g->id : g->s->next_id++;
        g->jobs[j].prompt_idx = j;
        msgs[j] = make_submit(g, &g->jobs[j]);
        if (msgs[j] == NULL) {
            for (int32_t k = 0; k < j; k++) {
                eng_msg_free(&msgs[k]->hdr);
            }
            free_tp(g, n_jobs * g->p.n);
            free(g->choices);
            g->choices = NULL;
        }
    }
    if (g->choices == NULL) {
        free(g->jobs);
        g->jobs = NULL;
        srv_outq_free(&g->out);
        srv_req_unreserve(r);
        return 0;
    }
    return 1;
}

/* The preparation of a request, run on the thread pool (srv_work.h):
 * parse and validate the body, let the endpoint turn it into prompts
 * (chat template), tokenize, check the context, and compile the
 * constraint once for its 400. Touches only this record, the request's
 * body (borrowed) and the server's read-only state. */
typedef struct gen_prep {
    const srv_t *s;
    const srv_api_t *api;
    const char *body; /* the request's, kept while the item is in flight */
    size_t len;
    srv_params_t p;
    int have_params;
    int ok;
    srv_error_t err;
} gen_prep_t;

static void
gen_prep_run(void *arg)
{
    gen_prep_t *w = arg;
    const srv_t *s = w->s;
    const srv_api_t *api = w->api;

    if (api->parse != NULL ? !api->parse(s, w->body, w->len, &w->p, &w->err)
                           : !srv_params_parse(api->kind, w->body, w->len, &s->lim, &w->p,
                                               &w->err)) {
        return;
    }
    w->have_params = 1;
    if (!srv_api_prompts(s, api, &w->p, &w->err) ||
        !srv_params_check_context(&w->p, &s->lim, s->block_size, s->kv_blocks, &w->err)) {
        return;
    }
    /* Structured output: any caller that filled p.constraint gets the
     * compile and its 400 here, before anything is queued. */
    gr_grammar_t *check = NULL;
    if (!srv_grammar_compile(s->gr_vocab, &w->p.constraint, &check, &w->err)) {
        return;
    }
    gr_grammar_destroy(check);
    w->ok = 1;
}

static void
gen_prep_free(gen_prep_t *w)
{
    if (w->have_params) {
        srv_params_free(&w->p);
    }
    free(w);
}

static void gen_submit(srv_req_t *r, gen_prep_t *w);

static void
gen_prep_done(srv_req_t *r, void *arg, int live)
{
    gen_prep_t *w = arg;

    if (!live) {
        gen_prep_free(w);
        return;
    }
    if (!w->ok) {
        srv_req_answer_error(r, &w->err);
        gen_prep_free(w);
        return;
    }
    /* A stream keeps a half-closed client (it is written to at every
     * token, so a closed one is found at once); a body waits silently,
     * and a FIN before it is a hang-up, as it always was. */
    if (srv_req_half_close(r, w->p.stream)) {
        gen_prep_free(w);
        return;
    }
    gen_submit(r, w);
}

enum MHD_Result
srv_gen_start(srv_req_t *r, const srv_api_t *api)
{
    gen_prep_t *w = xcalloc_try(1, sizeof(*w));

    if (w == NULL) {
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    w->s = srv_req_server(r);
    w->api = api;
    w->body = srv_req_body(r, &w->len);
    if (!srv_work_queue(r, gen_prep_run, gen_prep_done, w)) {
        free(w);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    return MHD_YES;
}

/* The request prepared (on the loop thread again, r waiting): its
 * generation record, the engine's admission checks, everything the jobs
 * need, and the SUBMITs. Answers r on any error. Takes w. */
static void
gen_submit(srv_req_t *r, gen_prep_t *w)
{
    srv_t *s = srv_req_server(r);
    const srv_api_t *api = w->api;
    srv_gen_t *g;
    srv_error_t err;
    int64_t prompt_total = 0;

    g = xcalloc_try(1, sizeof(*g));
    if (g == NULL) {
        gen_prep_free(w);
        srv_err_oom(&err);
        srv_req_answer_error(r, &err);
        return;
    }
    g->r = r;
    g->s = s;
    g->id = srv_req_id(r);
    g->tenant = srv_req_tenant(r);
    g->t_arrival_ns = srv_req_arrival_ns(r);
    g->rs.api = api;
    g->rs.tok = s->tok;
    g->rs.model = s->model_name;
    g->rs.id = g->id;
    g->rs.created = srv_req_created(r);
    g->rs.p = &g->p;
    g->p = w->p; /* the parameters move to g */
    g->have_params = 1;
    free(w);
    srv_req_set_gen(r, g); /* freed with the request from here on */

    if (s->engine == NULL || !engine_alive(s->engine)) {
        srv_err_set(&err, 503, NULL, "the engine is not running");
        srv_req_answer_error(r, &err);
        return;
    }
    if ((int64_t)s->n_gen >= (int64_t)s->cfg->max_num_seqs + s->cfg->max_waiting_requests) {
        srv_error_t e429;
        srv_err_set(&e429, 429, NULL, "the server has %u requests in flight; retry later",
                    s->n_gen);
        s->metrics.tenant[g->tenant].rejected++;
        srv_req_answer_error(r, &e429);
        return;
    }
    /* Everything the generation needs is allocated, fallibly, before any
     * job is registered or sent: out of memory is a 503 for this request
     * and nothing else (KVSERVE_FAIL_ALLOC_AFTER injects it in tests). */
    int32_t n_jobs = g->p.n_prompts;
    eng_msg_submit_t **msgs = xcalloc_try((size_t)n_jobs, sizeof(*msgs));
    if (msgs == NULL || !alloc_jobs(g, n_jobs, msgs)) {
        free(msgs);
        srv_err_oom(&err);
        srv_req_answer_error(r, &err);
        return;
    }
    g->n_jobs = n_jobs;
    g->n_choices = g->p.n_prompts * g->p.n;
    for (int32_t c = 0; c < g->n_choices; c++) {
        tok_stream_init(&g->choices[c].ds, s->tok, g->p.skip_special_tokens);
        g->choices[c].held_tok = -1;
        /* The output continues the prompt: keep its leading space. */
        g->choices[c].ds.at_start = 0;
        srv_stop_init(&g->choices[c].stop, (const char *const *)g->p.stop, g->p.n_stop);
    }
    for (int32_t j = 0; j < g->n_jobs; j++) {
        srv_job_t *job = &g->jobs[j];
        job->gen = g;
        job->n_open = g->p.n;
        job->open = 1;
        job->hnext = *job_slot(s, job->id);
        *job_slot(s, job->id) = job;
        prompt_total += g->p.prompts[j].n_ids;
    }
    g->jobs_open = g->n_jobs;
    s->n_gen++;
    s->metrics.in_flight = s->n_gen;
    REQ_INFO(g->id, "%s tenant=%s prompts=%d prompt_tokens=%lld max_tokens=%d n=%d stream=%d",
             api->name, s->cfg->tenants[g->tenant].name, g->n_jobs, (long long)prompt_total,
             g->p.max_tokens, g->p.n, g->p.stream);
    for (int32_t j = 0; j < g->n_jobs; j++) {
        chan_send(engine_inbox(s->engine), &msgs[j]->hdr);
    }
    free(msgs);
    /* r waits on (srv_work_queue suspended it) for its first data. */
}
