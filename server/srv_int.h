/* srv_int.h - internals of the HTTP front end shared by server/srv_*.c and
 * the unit tests in tests/server/.
 *
 * The pure parts (request parsing and validation, stop-string matching,
 * SSE framing, the route table, metrics formatting, error bodies, fallible
 * JSON building) take no locks and touch no sockets, so they are tested
 * directly. Everything here runs on the loop thread.
 */
#ifndef SERVER_SRV_INT_H
#define SERVER_SRV_INT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "sampler/sampler.h"
#include "scheduler/proto.h"

/* ---- growable byte buffer ---------------------------------------------------- */

/* Growth goes through the fallible allocator: when it fails, the buffer
 * keeps what it had, the failed append adds nothing, and oom stays set
 * (until srv_buf_free) for the caller to check once after a series of
 * appends. */
typedef struct srv_buf {
    char *data; /* NUL-terminated when len > 0 or after srv_buf_add */
    size_t len;
    size_t cap;
    int oom; /* an append failed for lack of memory */
} srv_buf_t;

/* Makes room for extra more bytes; 0 (and oom set) when out of memory. */
int srv_buf_reserve(srv_buf_t *b, size_t extra);
void srv_buf_add(srv_buf_t *b, const void *p, size_t n);
void srv_buf_adds(srv_buf_t *b, const char *s);
void srv_buf_printf(srv_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void srv_buf_consume(srv_buf_t *b, size_t n);
void srv_buf_free(srv_buf_t *b);

/* ---- errors ------------------------------------------------------------------ */

typedef struct srv_error {
    int status;       /* HTTP status; 0 = no error */
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL -> JSON null */
    char param[64];   /* "" -> JSON null */
    char message[320];
} srv_error_t;

/* Fills err (status 400 unless set otherwise by the _status variant). */
void srv_err_set(srv_error_t *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error":{"message","type","param","code"}} as a malloc'd string, or
 * NULL when out of memory. */
char *srv_err_json(const srv_error_t *err);
/* Routes cJSON's allocations through xmalloc_try (cJSON_InitHooks), so a
 * request's JSON parsing and building can fail cleanly and the fault hook
 * reaches them. Process-wide; call once before serving. */
void srv_json_hooks_install(void);
/* The HTTP status of an engine ERROR message. Refusals of what the client
 * asked for are 4xx (ST_EINVAL, ST_ETOOLONG, ST_ERANGE: 400; ST_EQUEUE:
 * 429); ST_ESHUTDOWN and ST_ENOMEM are 503; anything else is 500. When the
 * engine itself failed (engine_failed != 0) nothing is the client's fault:
 * 500, or 503 for ST_ESHUTDOWN. */
int srv_http_status_of(int st, int engine_failed);
/* Fills err with the request's out-of-memory error: 503, retryable. */
void srv_err_oom(srv_error_t *err);
/* The body of srv_err_oom as a static string (needs no allocation). */
extern const char srv_oom_json[];
/* Default type and code for an HTTP status. */
void srv_err_defaults(srv_error_t *err);

/* ---- JSON pre-checks --------------------------------------------------------- */

/* Checks raw body bytes before cJSON sees them: valid UTF-8, no NUL byte,
 * nesting depth <= max_depth, no \u0000 escape inside strings. Returns 1 when
 * acceptable, else 0 with err filled (400). */
int srv_json_precheck(const char *s, size_t n, int max_depth, srv_error_t *err);

/* ---- requests ---------------------------------------------------------------- */

enum srv_kind {
    SRV_KIND_COMPLETION = 1,
    SRV_KIND_CHAT,
};

#define SRV_MAX_STOP 4
#define SRV_MAX_STOP_BYTES 1024 /* per stop string: the hold-back check is O(len^2) */
#define SRV_MAX_PROMPTS 64

typedef struct srv_prompt {
    char *text; /* NULL when given as token ids */
    size_t text_len;
    int32_t *ids; /* token ids (given, or filled by tokenization) */
    int32_t n_ids;
} srv_prompt_t;

typedef struct srv_chat_msg {
    char *role;    /* "system", "user", "assistant" */
    char *content; /* text parts concatenated */
} srv_chat_msg_t;

/* Server-side caps used by validation. */
typedef struct srv_limits {
    int32_t max_n;
    int32_t max_tokens_cap; /* cap on max_tokens */
    int32_t max_model_len;
    int32_t vocab_size;
    int32_t max_prompts;
    int32_t max_logprobs;   /* <= SMP_MAX_LOGPROBS */
    int max_depth;          /* JSON nesting */
    const char *model_name; /* served model name */
    int32_t kv_window;      /* --kv-policy window (0: full): requests may pass the context */
} srv_limits_t;

/* Structured output: what a request's output must follow. The request
 * parser sets it from response_format / structured_outputs / grammar /
 * json_schema; tool calling sets it to the schema of its call format
 * (tool_choice "required" or a named function); the Responses API from
 * text.format. The constrained-decoding engine compiles it. */
typedef enum srv_constraint_kind {
    SRV_CONSTRAINT_NONE = 0,
    SRV_CONSTRAINT_JSON_OBJECT, /* any JSON object; spec NULL */
    SRV_CONSTRAINT_JSON_SCHEMA, /* spec: the JSON Schema, as JSON text */
    SRV_CONSTRAINT_GBNF,        /* spec: a llama.cpp GBNF grammar */
    SRV_CONSTRAINT_REGEX,       /* spec: a regular expression */
    SRV_CONSTRAINT_CHOICE,      /* spec: a JSON array of strings */
} srv_constraint_kind_t;

typedef struct srv_constraint {
    int kind;   /* srv_constraint_kind_t */
    char *spec; /* owned, NUL-terminated; NULL for NONE and JSON_OBJECT */
} srv_constraint_t;

/* Tool calling and chat template extras of a chat request (srv_tools.c
 * parses them; srv_tools_prepare() fills the rest before rendering). */
enum srv_tool_choice {
    SRV_TOOL_CHOICE_AUTO = 0,
    SRV_TOOL_CHOICE_NONE,
    SRV_TOOL_CHOICE_REQUIRED,
    SRV_TOOL_CHOICE_NAMED,
};

typedef struct srv_chat_ext {
    char *tools;         /* the "tools" array as JSON text; NULL: none */
    int32_t n_tools;
    int tool_choice;     /* enum srv_tool_choice */
    char *tool_name;     /* SRV_TOOL_CHOICE_NAMED: the function */
    int parallel_tool_calls; /* default 1 */
    char *kwargs;        /* chat_template_kwargs, a JSON object's text; NULL: none */
    char *messages;      /* the messages with their tool fields (JSON array text), as
                          * templates see them; NULL when none has such fields */
    int output;          /* 1: the output goes through the tool / reasoning parser */
    int format;          /* srv_toolparse.h: enum srv_tp_format (set by prepare) */
    int mode;            /* enum srv_tp_mode */
    int reasoning;       /* enum srv_tp_reasoning */
    char *echo;          /* the Responses API: request fields its response repeats (JSON) */
} srv_chat_ext_t;

typedef struct srv_params {
    int kind;
    int32_t n_prompts;
    srv_prompt_t *prompts; /* [n_prompts]; chat: one, filled after rendering */
    int32_t n_messages;
    srv_chat_msg_t *messages;  /* chat only */
    int add_generation_prompt; /* chat, default 1 */

    int32_t max_tokens;    /* -1: not given */
    smp_params_t sampling; /* .bias points into bias below */
    smp_bias_t *bias;
    uint64_t seed;
    int has_seed;
    char *stop[SRV_MAX_STOP];
    int32_t n_stop;
    int32_t stop_ids[ENG_MAX_STOP_IDS];
    int32_t n_stop_ids;
    int32_t n;
    int logprobs;         /* 1 when logprobs were asked for */
    int32_t top_logprobs; /* number of alternatives per token */
    int echo;
    int stream;
    int include_usage;
    int ignore_eos;
    int speculative; /* extension "speculative": false turns it off (default 1) */
    int32_t min_tokens;
    int32_t priority;
    int skip_special_tokens; /* default 1 */
    /* Extension "kv_policy": "full" (kv_window -1) or "sink=S,window=W";
     * absent: 0, the server's --kv-policy. "h2o=B,recent=W" or
     * "snapkv=B,window=W,pool=K" (model/kv_policy.h) go to kv_score. */
    int32_t kv_sink, kv_window;
    mdl_kv_policy_t kv_score;
    srv_constraint_t constraint; /* SRV_CONSTRAINT_NONE unless asked for */
    srv_chat_ext_t ext;          /* chat: tools, tool history, template kwargs */
} srv_params_t;

/* Parses and validates a request body of the given kind against the
 * OpenAI bounds and lim. Runs srv_json_precheck first. On success returns 1
 * and fills *p (free with srv_params_free); on failure returns 0, fills err
 * and leaves *p freed. Token ids in prompts and logit_bias are checked
 * against lim->vocab_size; the context check needs the token count and is
 * srv_params_check_context(). */
int srv_params_parse(int kind, const char *body, size_t len, const srv_limits_t *lim,
                     srv_params_t *p, srv_error_t *err);
void srv_params_free(srv_params_t *p);

/* After tokenization: resolves the default max_tokens (16 for completions,
 * the rest of the context for chat), then checks prompt + max_tokens
 * against the context, max_tokens_cap, and the KV blocks one request may
 * need (kv_blocks 0: unchecked). Returns 1 or 0 with err naming the limit. */
int srv_params_check_context(srv_params_t *p, const srv_limits_t *lim, int32_t block_size,
                             int32_t kv_blocks, srv_error_t *err);

/* srv_tools.c: parses tools, tool_choice, parallel_tool_calls,
 * chat_template_kwargs and the messages' tool fields of a chat body (after
 * its messages were parsed) into p->ext. 1, or 0 with err (400 naming the
 * problem, 503 out of memory). */
int srv_chat_ext_parse(const cJSON *root, srv_params_t *p, srv_error_t *err);
void srv_chat_ext_free(srv_chat_ext_t *x);

/* ---- stop strings ------------------------------------------------------------ */

/* Matches stop strings on the detokenized text of one choice, across token
 * boundaries. Text that might be the start of a stop string is held back
 * until it is known not to be. */
typedef struct srv_stop {
    const char *const *stop; /* borrowed */
    int32_t n_stop;
    srv_buf_t held;
    int matched;
} srv_stop_t;

void srv_stop_init(srv_stop_t *s, const char *const *stop, int32_t n_stop);
void srv_stop_free(srv_stop_t *s);
/* Feeds new text; appends what can be released to out. Returns 1 when a
 * stop string matched (out then ends right before it and the matcher
 * releases nothing more), else 0. Out of memory: held.oom or out->oom is
 * set and text may be lost (the request has failed). */
int srv_stop_feed(srv_stop_t *s, const char *text, size_t n, srv_buf_t *out);
/* End of generation: releases whatever is held. */
void srv_stop_finish(srv_stop_t *s, srv_buf_t *out);

/* Appends s[0..n) as a JSON string literal (quotes included): '"' and '\\'
 * escaped, control characters as \n, \t, ... or \u00XX, other bytes as
 * they are (the text is valid UTF-8). Same output as cJSON's printer. */
void srv_json_string(srv_buf_t *out, const char *s, size_t n);

/* ---- SSE --------------------------------------------------------------------- */

/* Appends "data: <json>\n\n". */
void srv_sse_data(srv_buf_t *out, const char *json);
/* Appends "data: [DONE]\n\n". */
void srv_sse_done(srv_buf_t *out);

/* ---- routes ------------------------------------------------------------------ */

/* Endpoints: what the route table (srv_route.c) maps a path to, and what
 * the per-endpoint metrics count under. */
enum {
    SRV_EP_COMPLETIONS = 0,
    SRV_EP_CHAT,
    SRV_EP_MODELS,
    SRV_EP_HEALTH,
    SRV_EP_METRICS,
    SRV_EP_TOKENIZE,
    SRV_EP_DETOKENIZE,
    SRV_EP_VERSION,
    SRV_EP_MODEL,      /* GET /v1/models/{model} */
    SRV_EP_EMBEDDINGS, /* POST /v1/embeddings */
    SRV_EP_RESPONSES, /* POST /v1/responses */
    SRV_EP_ADMIN_KV,     /* GET /admin/kv: the web console's KV map (srv_admin.h) */
    SRV_EP_ADMIN_BLOCK,  /* GET /admin/kv/blocks/{tier}/{id} */
    SRV_EP_ADMIN_STATS,  /* GET /admin/stats */
    SRV_EP_RESET_PREFIX, /* POST /reset_prefix_cache */
    SRV_EP_APPLY_TEMPLATE, /* POST /apply-template */
    SRV_EP_CONSOLE_ROOT,   /* GET /: 302 to the web console */
    SRV_EP_CONSOLE,        /* GET /console, /console/{file} (srv_console.h) */
    SRV_EP_OTHER, /* no route: 404 */
    SRV_EP_COUNT,
};

/* Who may call a route. */
enum srv_access {
    SRV_ACCESS_KEY = 0,        /* a tenant's API key (when auth is required) */
    SRV_ACCESS_PUBLIC_HEALTH,  /* anyone when the config sets public_health */
    SRV_ACCESS_PUBLIC_METRICS, /* anyone when the config sets public_metrics */
    SRV_ACCESS_ADMIN,          /* the --admin-api-key key only (srv_admin.h) */
    SRV_ACCESS_PUBLIC,         /* anyone (the web console's static files) */
};

typedef struct srv_route {
    const char *path; /* a segment "{name}" matches one non-empty segment, or
                       * as the last segment the non-empty rest of the path */
    const char *method; /* HEAD is answered wherever GET is */
    int ep;             /* SRV_EP_* */
    int access;         /* enum srv_access */
} srv_route_t;

/* The route table, ended by a NULL path: every route the server serves,
 * written once (api/openapi.yaml lists the same routes, and the openapi
 * integration test reads this table to check it). */
extern const srv_route_t srv_routes[];

/* The route that serves method on path (HEAD matches GET), or NULL. *ep
 * receives the endpoint of path whatever the method (a 405 counts under
 * it), or SRV_EP_OTHER when no route has that path (404). method NULL:
 * only *ep. */
const srv_route_t *srv_route_find(const char *path, const char *method, int *ep);
/* The value of the route's one "{name}" segment in path (borrowed from
 * path: to its end when the pattern ends with it), or NULL when the route
 * has none or path does not match. */
const char *srv_route_param(const srv_route_t *rt, const char *path);
/* The endpoint's label in metrics: its path, or "other". Never NULL. */
const char *srv_route_label(int ep);

/* ---- metrics ----------------------------------------------------------------- */

#define SRV_HIST_MAX_BUCKETS 24

typedef struct srv_hist {
    int32_t n_buckets;
    const double *bounds;                  /* upper bounds, ascending */
    uint64_t counts[SRV_HIST_MAX_BUCKETS]; /* non-cumulative per bucket */
    uint64_t count;
    double sum;
} srv_hist_t;

void srv_hist_init(srv_hist_t *h, const double *bounds, int32_t n_buckets);
void srv_hist_observe(srv_hist_t *h, double v);
/* Prometheus text: name_bucket{labels,le=...} cumulative, _sum, _count.
 * labels is "" or 'tenant="x"' (no braces). */
void srv_hist_format(const srv_hist_t *h, const char *name, const char *labels, srv_buf_t *out);

typedef struct srv_tenant_metrics {
    srv_hist_t ttft;
    srv_hist_t itl;
    srv_hist_t e2e;
    uint64_t finished_stop, finished_length, finished_abort, finished_error;
    uint64_t rejected; /* 429: queue full */
    uint64_t prompt_tokens, generation_tokens;
} srv_tenant_metrics_t;

typedef struct srv_metrics {
    int32_t n_tenants;
    const char *tenant_names[ENG_MAX_TENANTS];
    srv_tenant_metrics_t tenant[ENG_MAX_TENANTS];
    uint64_t http_requests[SRV_EP_COUNT][6]; /* by status class 1xx..5xx, [0] unused */
    uint64_t disconnects;
    uint32_t open_connections;
    uint32_t in_flight;
} srv_metrics_t;

void srv_metrics_init(srv_metrics_t *m, int32_t n_tenants, const char *const *names);
/* Appends s as a Prometheus label value (without the quotes): backslash,
 * double quote and line feed escaped; out is NUL-terminated after. */
void srv_prom_label_escape(srv_buf_t *out, const char *s);
/* Formats loop-side metrics and, when st is not NULL, the engine's. */
void srv_metrics_format(const srv_metrics_t *m, const eng_stats_t *st, const char *model_name,
                        srv_buf_t *out);
/* srv_metrics_vllm.c: the vllm: series (names, types and labels of vLLM's
 * v1 engine) from the same counters; srv_metrics_format appends them. */
void srv_metrics_format_vllm(const srv_metrics_t *m, const eng_stats_t *st,
                             const char *model_name, srv_buf_t *out);

/* ---- chat template fallback -------------------------------------------------- */

/* Plain template for models without one:
 *   <bos>system: ...\nuser: ...\nassistant: ...\nassistant:
 * Returns a malloc'd string, or NULL when out of memory. */
char *srv_chat_render_plain(const srv_chat_msg_t *msgs, int32_t n, int add_generation_prompt,
                            const char *bos);

/* ---- JSON building helpers --------------------------------------------------- */

/* Building a cJSON tree fallibly: take a mark before, add nodes with
 * srv_json_add / srv_json_push (which delete what they cannot attach),
 * and print with srv_json_print, which answers NULL when any fallible
 * allocation failed since the mark (a cJSON builder then silently drops
 * the node it could not make). */
unsigned long srv_json_mark(void);
/* Adds item under key; deletes it when that fails. item NULL: no-op. */
void srv_json_add(cJSON *obj, const char *key, cJSON *item);
/* Appends item to arr (which may be NULL when its own creation failed);
 * deletes it when that fails. item NULL: no-op. */
void srv_json_push(cJSON *arr, cJSON *item);
/* Prints and deletes root (malloc'd), or NULL when any allocation since
 * mark failed. */
char *srv_json_print(cJSON *root, unsigned long mark);

/* Token text for logprobs: the token's bytes with invalid UTF-8 replaced
 * by U+FFFD (written to out, NUL-terminated; out->oom when it could not). */
void srv_token_text(const char *bytes, size_t n, srv_buf_t *out);

#endif /* SERVER_SRV_INT_H */
