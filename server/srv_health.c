/* srv_health.c - the deep health check: GET /health?generate=1 runs a
 * one-token generation through the engine under a timeout.
 *
 * DESIGN
 *   A process check (the port answers, /health says the engine thread is
 *   alive) misses an engine that is wedged: stuck in a forward pass, or
 *   looping without finishing requests. The deep check submits a greedy
 *   one-token request (the model's BOS token as the prompt, tenant 0,
 *   priority -1000 so it goes ahead of queued work) and answers 200 with
 *   the time it took when the engine finishes it, 503 on an engine error
 *   or when it has not finished within the timeout (query timeout_ms,
 *   default 10000, at most 60000; checked by the one-second sweep). A timed
 *   out job is cancelled. Checks in flight are a small fixed table: when it
 *   is full, the check answers 503 at once (something is already slow).
 *   The request is found again by its id, so a client that went away
 *   meanwhile is simply not answered.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "server/srv_endpoints.h"

#define HEALTH_MAX 8
#define HEALTH_TIMEOUT_MS 10000
#define HEALTH_TIMEOUT_MAX_MS 60000

typedef struct health_check {
    srv_t *s;        /* NULL: free slot */
    uint64_t job;    /* engine request id */
    uint64_t req;    /* HTTP request id */
    uint64_t t0, deadline;
    int tokens;
    int answered;    /* timed out: waiting only for the engine's last word */
} health_check_t;

static health_check_t checks[HEALTH_MAX];

static void
answer(health_check_t *c, int status, const char *state, const char *why)
{
    srv_req_t *r = srv_req_find(c->s, c->req);
    char body[256];

    c->answered = 1;
    if (r == NULL || !srv_req_waiting(r)) {
        return;
    }
    if (status == 200) {
        snprintf(body, sizeof(body), "{\"status\":\"%s\",\"generate\":{\"tokens\":%d,\"ms\":%.1f}}",
                 state, c->tokens, (double)(now_ns() - c->t0) / 1e6);
    } else {
        snprintf(body, sizeof(body), "{\"status\":\"%s\",\"reason\":\"%s\"}", state, why);
    }
    srv_req_answer(r, status, xstrdup_try(body), SRV_CT_JSON, status == 503 ? 1 : 0);
}

enum MHD_Result
srv_health_deep(srv_req_t *r)
{
    srv_t *s = srv_req_server(r);
    const char *to = srv_req_arg(r, "timeout_ms");
    long timeout_ms = to != NULL ? strtol(to, NULL, 10) : HEALTH_TIMEOUT_MS;
    health_check_t *c = NULL;
    eng_msg_submit_t *m;

    if (timeout_ms <= 0 || timeout_ms > HEALTH_TIMEOUT_MAX_MS) {
        return srv_req_reply_errmsg(r, 400, "timeout_ms", "timeout_ms must be in 1..60000");
    }
    for (int i = 0; i < HEALTH_MAX; i++) {
        if (checks[i].s == NULL) {
            c = &checks[i];
            break;
        }
    }
    if (c == NULL) {
        return srv_req_reply(r, 503, xstrdup_try("{\"status\":\"unhealthy\",\"reason\":"
                                                 "\"too many deep checks in flight\"}"),
                             SRV_CT_JSON, 1);
    }
    m = xcalloc_try(1, sizeof(*m));
    int32_t *prompt = xmalloc_try(sizeof(int32_t));
    if (m == NULL || prompt == NULL || !srv_req_reserve(r)) {
        free(m);
        free(prompt);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    int32_t bos = tok_bos_id(s->tok);
    prompt[0] = bos >= 0 ? bos : 0;
    memset(c, 0, sizeof(*c));
    c->s = s;
    c->job = s->next_id++;
    c->req = srv_req_id(r);
    c->t0 = now_ns();
    c->deadline = c->t0 + (uint64_t)timeout_ms * 1000000u;
    m->hdr.type = ENG_MSG_SUBMIT;
    m->req.id = c->job;
    m->req.tenant = 0;
    m->req.priority = -1000;
    m->req.prompt = prompt;
    m->req.n_prompt = 1;
    m->req.sampling.top_p = 1.0f;
    m->req.sampling.repetition_penalty = 1.0f;
    m->req.n = 1;
    m->req.max_tokens = 1;
    m->req.ignore_eos = 1;
    m->req.kv_window = -1;
    m->req.t_arrival_ns = c->t0;
    chan_send(engine_inbox(s->engine), &m->hdr);
    srv_req_wait(r);
    return MHD_YES;
}

static health_check_t *
find(const srv_t *s, uint64_t job)
{
    for (int i = 0; i < HEALTH_MAX; i++) {
        if (checks[i].s == s && checks[i].job == job) {
            return &checks[i];
        }
    }
    return NULL;
}

int
srv_health_on_msg(srv_t *s, const msg_t *m)
{
    health_check_t *c;

    switch (m->type) {
    case ENG_MSG_DELTA:
        if ((c = find(s, ((const eng_msg_delta_t *)m)->id)) == NULL) {
            return 0;
        }
        c->tokens += ((const eng_msg_delta_t *)m)->n_tokens;
        return 1;
    case ENG_MSG_FINISHED:
        if ((c = find(s, ((const eng_msg_finished_t *)m)->id)) == NULL) {
            return 0;
        }
        if (!c->answered) {
            answer(c, c->tokens == 1 ? 200 : 503, c->tokens == 1 ? "ok" : "unhealthy",
                   "the engine finished without a token");
        }
        c->s = NULL;
        return 1;
    case ENG_MSG_ERROR:
        if ((c = find(s, ((const eng_msg_error_t *)m)->id)) == NULL) {
            return 0;
        }
        if (!c->answered) {
            answer(c, 503, "unhealthy", "the engine refused or failed the generation");
        }
        c->s = NULL;
        return 1;
    default:
        return 0;
    }
}

void
srv_health_sweep(srv_t *s, uint64_t now)
{
    for (int i = 0; i < HEALTH_MAX; i++) {
        health_check_t *c = &checks[i];
        if (c->s != s) {
            continue;
        }
        if (c->answered && !engine_alive(s->engine)) {
            c->s = NULL; /* a dead engine sends no last word */
            continue;
        }
        if (c->answered || now < c->deadline) {
            continue;
        }
        LOG_WARN("deep health check: no token within the timeout");
        answer(c, 503, "unhealthy", "no token within the timeout");
        eng_msg_cancel_t *cm = xcalloc_try(1, sizeof(*cm));
        if (cm != NULL) {
            cm->hdr.type = ENG_MSG_CANCEL;
            cm->id = c->job;
            cm->choice = -1;
            chan_send(engine_inbox(s->engine), &cm->hdr);
        }
    }
}
