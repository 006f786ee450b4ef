/* srv_loop.h - the server state shared by srv_loop.c (libuv + MHD, the
 * outbox, lifecycle) and srv_http.c (routes, requests, responses).
 *
 * DESIGN
 *   srv_t       one per process; owned by the loop thread.
 *   srv_conn_t  one per TCP connection (MHD_OPTION_NOTIFY_CONNECTION); keeps
 *               the time the current request started arriving, for the
 *               slow-client sweep.
 *   srv_req_t   one per HTTP request (the access handler's req_cls). Freed
 *               when MHD has completed the request AND the engine has said
 *               its last word for every job (FINISHED per choice or ERROR).
 *   srv_job_t   one engine submission (one prompt of a request, n choices),
 *               found by id in a hash table when outbox messages arrive.
 *
 * A request waiting for the engine is a suspended MHD connection; its socket
 * is then watched with a uv_poll_t for hang-up (MHD does not see a suspended
 * socket), so a vanished client is cancelled at once.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_LOOP_H
#define SERVER_SRV_LOOP_H

#include <microhttpd.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#include "common/chan.h"
#include "common/list.h"
#include "text/tokenizer.h"
#include "server/sdnotify.h"
#include "server/srv.h"
#include "server/srv_int.h"

typedef struct srv srv_t;
typedef struct srv_req srv_req_t;
typedef struct srv_job srv_job_t;

typedef struct srv_conn {
    srv_t *s;
    struct MHD_Connection *mc;
    int fd;
    uint64_t phase_start_ns; /* when the current request began to arrive */
    srv_req_t *req;          /* the request being handled, or NULL */
    list_node_t node;        /* s->conns */
} srv_conn_t;

typedef struct srv_choice {
    tok_stream_t ds;
    srv_stop_t stop;
    srv_buf_t text;      /* released text not yet sent (stream) or all (JSON) */
    cJSON *lp;           /* logprobs being built (JSON responses) */
    int32_t n_tokens;    /* tokens counted in usage */
    int32_t text_offset; /* completions logprobs text_offset */
    const char *finish;  /* NULL while running */
    int engine_done;     /* FINISHED received */
    int role_sent;       /* chat stream: role delta sent */
    int echo_sent;       /* completions stream: prompt echoed */
    uint64_t t_last_ns;
} srv_choice_t;

struct srv_job {
    srv_job_t *hnext;
    uint64_t id;
    srv_req_t *req;
    int32_t prompt_idx;
    int32_t n_open; /* choices without FINISHED yet */
    int open;       /* the engine still owes messages */
    int32_t prompt_tokens;
    int32_t cached_tokens;
};

enum srv_req_state {
    SRV_REQ_READING = 0, /* headers / body arriving */
    SRV_REQ_WAITING,     /* suspended until the engine answers */
    SRV_REQ_STREAMING,   /* SSE response queued */
    SRV_REQ_RESPONDED,   /* a complete response was queued */
};

struct srv_req {
    srv_t *s;
    srv_conn_t *conn;
    struct MHD_Connection *mc;
    uint64_t id;
    int ep;
    int tenant;
    int state;
    srv_buf_t body;
    size_t content_length; /* from the header; 0 when absent */
    int body_too_big;
    srv_params_t p;
    int have_params;
    int32_t n_jobs;
    srv_job_t *jobs;
    int32_t jobs_open;
    int32_t n_choices;
    srv_choice_t *choices;

    int suspended;
    uv_poll_t *hup;     /* hang-up watch while suspended */
    uv_poll_t *hup_mem; /* its memory, allocated before the first suspension */
    int client_gone;
    int mhd_done;

    /* A finished non-streaming response (or an error before streaming). */
    int ready;
    int resp_status;
    char *resp_body;
    const char *resp_type;
    int retry_after; /* seconds, 0: none */

    /* Streaming. */
    srv_buf_t out;
    srv_buf_t chunk_prefix; /* 'data: {"id":...,"choices":[{"index":' */
    int out_eos;
    int stream_error; /* an error event was sent */
    int stats_wait;   /* /metrics waiting for STATS_REPLY */
    srv_buf_t tail;   /* the error event and [DONE], sent after out */
    const char *tail_static; /* ... or this, when tail could not be built */
    size_t tail_off;  /* bytes of the tail already sent */

    srv_error_t err; /* err.status != 0: the request failed */
    uint64_t t_arrival_ns;
    uint64_t t_first_ns;
    time_t created;
    list_node_t node; /* s->reqs */
};

#define SRV_JOB_BUCKETS 1024

struct srv {
    const cfg_t *cfg;
    const mdl_model_t *model;
    const tok_tokenizer_t *tok;
    const char *chat_template;
    struct chat_template *chat; /* compiled chat template, or NULL: plain */
    engine_t *engine;
    int32_t max_model_len;
    int32_t block_size;
    int32_t kv_blocks; /* usable device blocks */
    char model_name[CFG_NAME_MAX];
    srv_limits_t lim;
    time_t started;

    uv_loop_t loop;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    uv_idle_t mhd_idle;
    uv_async_t outbox_async;
    uv_signal_t sig_term, sig_int;
    uv_timer_t sweep_timer;
    uv_timer_t drain_timer;
    chan_t outbox;
    struct MHD_Daemon *mhd;
    uint16_t port;

    srv_job_t *jobs[SRV_JOB_BUCKETS];
    list_node_t conns;
    list_node_t reqs;
    uint32_t n_reqs;
    uint32_t n_gen; /* generation requests in flight */
    uint64_t next_id;
    int draining;
    int drain_expired;
    int stopping;
    int stop_queued;
    srv_metrics_t metrics;
    sdn_watchdog_t watchdog;
    eng_stats_t last_stats; /* from the latest periodic STATS reply */
    int have_stats;
    int test_hooks; /* KVSERVE_TEST_HOOKS=1: the /debug/ routes answer */
};

/* srv_http.c */
enum MHD_Result srv_http_access(void *cls, struct MHD_Connection *mc, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_size, void **req_cls);
void srv_http_completed(void *cls, struct MHD_Connection *mc, void **req_cls,
                        enum MHD_RequestTerminationCode toe);
/* Applies one outbox message (does not free it). */
void srv_http_on_msg(srv_t *s, msg_t *m);
/* Cancels every job and ends every open response with an error (drain
 * timeout, second signal). */
void srv_http_abort_all(srv_t *s, const char *why);
/* The client of a suspended request hung up: cancel its jobs. */
void srv_http_client_gone(srv_req_t *r);
/* Compiles the chat template (or selects the plain one); ST_EFORMAT. */
int srv_http_chat_init(srv_t *s);
void srv_http_chat_fini(srv_t *s);
/* Request-time limit sweep (called every second). */
void srv_http_sweep(srv_t *s, uint64_t now);
/* Frees the request if both MHD and the engine are done with it. */
void srv_req_maybe_free(srv_req_t *r);

/* srv_loop.c */
/* Runs MHD and re-arms its timer / idle handle. */
void srv_loop_run_mhd(srv_t *s);
/* Suspends r's connection and starts the hang-up watch. */
void srv_loop_suspend(srv_req_t *r);
/* Resumes r's connection if suspended (the watch stays). */
void srv_loop_resume(srv_req_t *r);
/* Ends the hang-up watch (before MHD may close the socket). */
void srv_loop_unwatch(srv_req_t *r);
/* Called when a request finished; completes a drain when nothing is left. */
void srv_loop_check_drained(srv_t *s);

#endif /* SERVER_SRV_LOOP_H */
