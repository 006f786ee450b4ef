/* proto.h - the thread protocol: the contract between the loop thread
 * (server/) and the engine thread (scheduler/engine.c).
 *
 * These are the only types that cross between the two threads: the
 * request a client asked for (eng_request_t), how a choice finished
 * (eng_finish_t), the tenants and the statistics, and the messages of the
 * two channels (common/chan.h): the engine's inbox (SUBMIT, CANCEL,
 * SHUTDOWN, STATS) and an outbox the loop thread provides (DELTA,
 * FINISHED, ERROR, STATS_REPLY). The scheduler (sched.h) plans with the
 * same request, finish and tenant types without knowing about threads.
 *
 * Every message is malloc'd by its sender and freed by its receiver with
 * eng_msg_free(). Only request ids cross threads; the engine owns the
 * scheduler, the block manager, the model runtime and the sampler.
 *
 * For every SUBMIT the engine sends zero or more DELTA messages per choice,
 * then exactly one FINISHED per choice, or one ERROR for the request (after
 * which nothing more comes for that id; at shutdown or on a device failure
 * an ERROR also ends a request midway, standing in for the FINISHED of the
 * choices still open). A CANCEL for an unknown or finished id is ignored;
 * a cancelled request still gets its FINISHED messages (reason
 * ENG_FINISH_ABORT, or ENG_FINISH_STOP with as_stop), and its blocks are
 * free before the next step, so the loop thread can free its record on
 * the engine's last word. Outbox messages of one engine iteration are sent
 * together at its end. The token that stops a choice on EOS
 * or a stop id comes in a DELTA like any other (it counts in
 * completion_tokens) and again as FINISHED.stop_token, so the front end
 * can leave it out of the text.
 *
 * Thread: plain data; a message belongs to whoever holds it, and
 * eng_msg_free() runs on any thread.
 */
#ifndef SCHEDULER_PROTO_H
#define SCHEDULER_PROTO_H

#include <stdint.h>

#include "common/chan.h"
#include "grammar/grammar.h"
#include "model/kv_policy.h"
#include "sampler/sampler.h"
#include "scheduler/spec.h"

enum eng_msg_type {
    /* inbox */
    ENG_MSG_SUBMIT = 1,
    ENG_MSG_CANCEL,
    ENG_MSG_SHUTDOWN,
    ENG_MSG_STATS,
    ENG_MSG_ADMIN, /* the web console's queries (scheduler/kv_map.h) */
    /* outbox */
    ENG_MSG_DELTA = 16,
    ENG_MSG_FINISHED,
    ENG_MSG_ERROR,
    ENG_MSG_STATS_REPLY,
    ENG_MSG_EMBED, /* an embedding request's pooled hidden state, before its FINISHED */
    ENG_MSG_ADMIN_REPLY, /* the ADMIN message answered in place (kv_map.h) */
};

/* Embedding requests (eng_request_t.pooling): prefill-only work whose
 * answer is the pooled final hidden state of the prompt (scheduler/embed.h). */
typedef enum eng_pooling {
    ENG_POOL_NONE = 0, /* a generation request */
    ENG_POOL_LAST,     /* the last prompt token's hidden state */
    ENG_POOL_MEAN,     /* the mean over every prompt token */
} eng_pooling_t;

typedef enum eng_finish {
    ENG_FINISH_NONE = 0,
    ENG_FINISH_STOP,   /* EOS or a stop token id, or CANCEL by a stop string */
    ENG_FINISH_LENGTH, /* max_tokens or the context length */
    ENG_FINISH_ABORT,  /* cancelled */
} eng_finish_t;

#define ENG_MAX_STOP_IDS 16

typedef struct eng_request {
    uint64_t id;
    uint32_t tenant;  /* index into eng_config_t.tenants */
    int32_t priority; /* lower value = served first (vLLM) */
    int32_t *prompt;  /* owned by the message, malloc'd */
    int32_t n_prompt;
    smp_params_t sampling; /* .bias owned by the message, malloc'd */
    uint64_t seed;
    int has_seed;
    int32_t n;          /* choices, >= 1 */
    /* Attention sinks + rolling window (model/kv_policy.h), in tokens,
     * whole blocks: kv_window > 0 keeps the first kv_sink tokens and at
     * least the last kv_window of the KV cache, so generation may run past
     * the context; 0 takes the engine's default, < 0 forces full KV. */
    int32_t kv_sink;
    int32_t kv_window;
    /* H2O / SnapKV (model/kv_policy.h, kind != MDL_KVP_FULL): this request's
     * attention-score eviction; kind FULL takes the engine's default, and
     * kv_window < 0 (full KV) turns both off. */
    mdl_kv_policy_t kv_score;
    int32_t max_tokens; /* >= 1 */
    int32_t min_tokens;
    int ignore_eos;
    int32_t stop_ids[ENG_MAX_STOP_IDS];
    int32_t n_stop_ids;
    uint64_t t_arrival_ns; /* now_ns() when the loop thread received it */
    /* ENG_POOL_LAST / MEAN: an embedding request (n 1, max_tokens 1; its
     * one sampled token is not reported). It gets one EMBED message, then
     * its FINISHED. */
    int32_t pooling;
    /* Structured output (grammar/grammar.h): owned by the message, then by
     * the scheduler, which gives every choice its own matcher, masks its
     * logits each step, advances it on the committed token and finishes
     * the choice when the grammar is complete. NULL: unconstrained. */
    gr_grammar_t *grammar;
    int no_speculative;    /* "speculative": false: never speculate for it */
} eng_request_t;

/* The pooled hidden state of an embedding request, not normalized: the
 * last prompt token's row, or the mean of every prompt row. Preallocated
 * at submit, sent right before the request's FINISHED. */
typedef struct eng_msg_embed {
    msg_t hdr;
    uint64_t id;
    int32_t dim;
    int32_t n_pooled; /* prompt tokens pooled so far (engine side) */
    float vec[];      /* [dim] */
} eng_msg_embed_t;

typedef struct eng_msg_error {
    msg_t hdr;
    uint64_t id;
    int status; /* ST_EQUEUE -> 429, ST_ETOOLONG -> 400, ... */
    char message[200];
} eng_msg_error_t;

/* Out of memory (common/xmalloc.h): the engine allocates per request with
 * the fallible family. A refused SUBMIT (validation, queue full, no memory
 * to register it: ST_ENOMEM) is answered with the SUBMIT message itself,
 * turned into the ERROR (hence the union below), so a refusal never
 * allocates. An accepted request gets its FINISHED messages allocated at
 * submit and keeps its SUBMIT message as the spare for its ERROR, so
 * every last word is preallocated; only a DELTA is allocated per token,
 * and when that fails the request alone ends with ERROR ST_ENOMEM (its
 * blocks freed) while every other request goes on. */
typedef struct eng_msg_submit {
    union {
        struct {
            msg_t hdr;
            eng_request_t req;
        };
        struct eng_msg_error as_error; /* room to answer in place */
    };
} eng_msg_submit_t;

typedef struct eng_msg_cancel {
    msg_t hdr;
    uint64_t id;
    int as_stop;    /* a stop string matched: finish with STOP, not ABORT */
    int32_t choice; /* -1: every choice */
} eng_msg_cancel_t;

#define ENG_DELTA_MAX 8

typedef struct eng_msg_delta {
    msg_t hdr;
    uint64_t id;
    int32_t choice;
    int32_t n_tokens;
    smp_result_t tok[ENG_DELTA_MAX]; /* token, logprob, top logprobs */
} eng_msg_delta_t;

typedef struct eng_msg_finished {
    msg_t hdr;
    uint64_t id;
    int32_t choice;
    eng_finish_t reason;
    int32_t prompt_tokens;
    int32_t completion_tokens; /* this choice */
    int32_t cached_tokens;     /* prompt tokens served from the prefix cache */
    int32_t stop_token;        /* STOP on EOS or a stop id: that token (also the
                                * last DELTA token), else -1 */
} eng_msg_finished_t;


#define ENG_MAX_TENANTS 64

typedef struct eng_tenant_stats {
    uint32_t running;
    uint32_t waiting;
    uint32_t swapped;
    uint32_t kv_blocks;
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t requests_finished;
    uint64_t requests_rejected;
    double vtc; /* virtual token counter (weighted service) */
} eng_tenant_stats_t;

typedef struct eng_stats {
    uint32_t running;
    uint32_t waiting;
    uint32_t swapped;
    uint32_t kv_total, kv_used, kv_cached;       /* device tier blocks */
    uint32_t swap_total, swap_used, swap_cached; /* CPU tier blocks */
    uint64_t prefix_queries, prefix_hits;        /* tokens */
    uint64_t preempt_swap, preempt_recompute;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t steps;
    uint32_t n_tenants;
    eng_tenant_stats_t tenant[ENG_MAX_TENANTS];
    uint32_t kv_used_peak; /* most device blocks USED after a step */
    uint64_t requests_finished;
    /* Engine thread time by phase, nanoseconds since creation. */
    uint64_t ns_plan;    /* sched_step + block ops */
    uint64_t ns_forward; /* mdl_forward */
    uint64_t ns_sample;  /* smp_sample over every choice */
    uint64_t ns_commit;  /* sched_commit + outbox messages */
    /* KV cache format (issue 8): dtype name, block size, and the bytes of
     * one block over all layers in that dtype (scales included) and in f32,
     * so capacity = kv_total * kv_block_tokens tokens and the compression
     * ratio is kv_block_bytes_f32 / kv_block_bytes. */
    char kv_dtype[12];
    uint32_t kv_block_tokens;
    uint64_t kv_block_bytes;
    uint64_t kv_block_bytes_f32;
    /* KV-cache events (scheduler/kv_events.h): on, events queued, dropped. */
    int kv_events_on;
    uint64_t kv_events_published, kv_events_dropped;
    /* Speculative decoding (scheduler/spec.h): k (0: off) and counters. */
    int32_t spec_k;
    spec_stats_t spec;
} eng_stats_t;

typedef struct eng_msg_stats {
    msg_t hdr;
    uint64_t cookie;   /* echoed in the reply */
    eng_stats_t stats; /* filled in the reply */
} eng_msg_stats_t;

typedef struct eng_tenant {
    char name[64];
    double weight;             /* fair-share weight, > 0 */
    int32_t max_running;       /* 0: unlimited */
    int32_t max_waiting;       /* 0: unlimited */
    double max_kv_share;       /* 0 < share <= 1 of device blocks */
    char salt[65];             /* prefix-cache salt; "" = the tenant's name */
    int64_t tokens_per_minute; /* prompt + generated tokens; 0 = unlimited. Over
                                * it, the tenant's new requests wait (queued,
                                * not refused) until its budget refills */
} eng_tenant_t;

/* Frees any engine message and what it owns. NULL is a no-op. */
void eng_msg_free(msg_t *m);

#endif /* SCHEDULER_PROTO_H */
