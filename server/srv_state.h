/* srv_state.h - the server's state (srv_t), its connections, and what the
 * request side (srv_req.c and the files behind it) offers the loop.
 *
 * DESIGN
 *   srv_t       one per process, owned by the loop thread (srv_loop.c
 *               creates it); the request side reads its configuration and
 *               counts into its metrics.
 *   srv_conn_t  one per TCP connection (MHD_OPTION_NOTIFY_CONNECTION);
 *               keeps the time the current request started arriving, for
 *               the slow-client sweep.
 *   requests    one record per HTTP request, private to srv_req.c; the
 *               loop sees only its srv_hold_t (srv_loop.h).
 *   jobs        one engine submission per prompt, private to srv_gen.c,
 *               found by id in s->jobs when outbox messages arrive.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_STATE_H
#define SERVER_SRV_STATE_H

#include <microhttpd.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#include "common/chan.h"
#include "common/list.h"
#include "text/tokenizer.h"
#include "server/sdnotify.h"
#include "server/srv_admin.h"
#include "server/srv.h"
#include "server/srv_int.h"
#include "server/srv_loop.h"

typedef struct srv_req srv_req_t; /* private to srv_req.c */
struct srv_job;                   /* private to srv_gen.c */

typedef struct srv_conn {
    srv_t *s;
    struct MHD_Connection *mc;
    int fd;
    uint64_t phase_start_ns; /* when the current request began to arrive */
    const srv_req_t *req;    /* the request being handled, or NULL */
    list_node_t node;        /* s->conns */
} srv_conn_t;

#define SRV_JOB_BUCKETS 1024

struct srv {
    const cfg_t *cfg;
    const mdl_model_t *model;
    const tok_tokenizer_t *tok;
    struct gr_vocab *gr_vocab; /* token bytes for structured output (srv_grammar.h) */
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

    struct srv_job *jobs[SRV_JOB_BUCKETS];
    struct srv_embed *embeds; /* open embedding requests (srv_embed.c), a list */
    list_node_t conns;
    list_node_t reqs;      /* srv_req.c's records */
    list_node_t suspended; /* srv_hold_t of suspended connections */
    list_node_t suspend_later; /* ... to suspend when MHD_run returns (srv_loop.h) */
    uint32_t n_reqs;
    uint32_t n_gen; /* generation requests in flight */
    uint32_t n_work; /* request preparations on the thread pool (srv_work.c) */
    uint64_t next_id;
    int draining;
    int drain_expired;
    int stopping;
    int stop_queued;
    srv_metrics_t metrics;
    sdn_watchdog_t watchdog;
    eng_stats_t last_stats; /* from the latest periodic STATS reply */
    int have_stats;
    srv_admin_lat_t lat; /* recent TTFT / ITL samples for /admin/stats (srv_admin.h) */
    int test_hooks; /* KVSERVE_TEST_HOOKS=1: the /debug/ routes answer */
    int ready;                /* model loaded and warm-up step done (srv_ready.c) */
    int start_rc;             /* a start-up failure after the port opened */
    struct srv_loader *loader; /* srv_ready.c's */
};

/* srv_req.c: MHD's access handler and completion callback (cls is s). */
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
/* Request-time limit sweep (called every second). */
void srv_http_sweep(srv_t *s, uint64_t now);

/* srv_chat.c: compiles the chat template (or selects the plain one);
 * ST_EFORMAT. */
int srv_chat_init(srv_t *s);
void srv_chat_fini(srv_t *s);

#endif /* SERVER_SRV_STATE_H */
