/* srv_openai.h - the OpenAI shapes of the generation endpoints: one
 * srv_api_t per endpoint (completions, chat completions) holds what differs
 * between them, and shared builders assemble whole responses and stream
 * chunks from it.
 *
 * DESIGN
 *   The generation request (srv_gen.c) owns its choices and hands the
 *   builders a borrowed srv_resp_t view; a builder never sees a request or
 *   a job. Everything is built through the fallible allocator: a builder
 *   that runs out of memory leaves a failed allocation on this thread's
 *   count, which the caller checks against its srv_json_mark().
 *
 * Thread: loop thread.
 */
#ifndef SERVER_SRV_OPENAI_H
#define SERVER_SRV_OPENAI_H

#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "text/tokenizer.h"
#include "server/srv_int.h"

typedef struct srv srv_t;

/* One choice of a generation request, as it is being answered. */
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
    struct srv_tp *tp;   /* tool-call / reasoning parser (srv_toolparse.h), or NULL */
    int echo_sent;       /* completions stream: prompt echoed */
    int32_t held_tok;    /* a possible stop token whose text waits for the
                          * engine's verdict (srv_gen.c), or -1 */
    uint64_t t_last_ns;
} srv_choice_t;

typedef struct srv_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens;
} srv_usage_t;

typedef struct srv_api srv_api_t;

/* What a builder knows of the request it answers; every pointer borrowed. */
typedef struct srv_resp {
    const srv_api_t *api;
    const tok_tokenizer_t *tok;
    const char *model; /* the served model name */
    uint64_t id;
    time_t created;
    const srv_params_t *p;
} srv_resp_t;

/* What differs between the generation endpoints. */
struct srv_api {
    int kind;                 /* SRV_KIND_* of the request body */
    const char *name;         /* in log lines */
    const char *id_prefix;    /* "cmpl", "chatcmpl" */
    const char *object;       /* "object" of a whole response */
    const char *chunk_object; /* "object" of a stream chunk */
    int tok_flags;            /* tok_encode() flags for a text prompt */
    /* Turns the request into text prompts where it is not one yet (chat:
     * renders the conversation into prompt 0). 1, or 0 with err. */
    int (*prepare)(const srv_t *s, srv_params_t *p, srv_error_t *err);
    /* A fresh logprobs container, and one sampled token added to it. */
    cJSON *(*lp_new)(void);
    void (*lp_add)(const srv_resp_t *rs, srv_choice_t *ch, cJSON *lp, const smp_result_t *t);
    /* 1 when the choice still owes the client a chunk even with no text,
     * logprobs or finish (chat: the role; completions: the echo). */
    int (*chunk_owed)(const srv_resp_t *rs, const srv_choice_t *ch);
    /* Appends the choice's content fields of a chunk, each followed by a
     * comma (chat: "delta":{...}, completions: "text":"..."). */
    void (*chunk_content)(const srv_resp_t *rs, int32_t ci, srv_choice_t *ch,
                          const srv_buf_t *piece, const char *finish, srv_buf_t *out);
    /* Adds the choice's content to its object in a whole response. */
    void (*body_content)(const srv_resp_t *rs, int32_t ci, const srv_choice_t *ch, cJSON *c);
    /* Optional, for endpoints of another shape (the Responses API; NULL:
     * the shared assembly): the body's parser (instead of
     * srv_params_parse), a stream's chunk for choice 0 (instead of
     * srv_api_chunk's; it drains ch->tp), the stream's end (instead of
     * the usage chunk and [DONE]) and the whole body. */
    int (*parse)(const srv_t *s, const char *body, size_t len, srv_params_t *p,
                 srv_error_t *err);
    void (*chunk)(const srv_resp_t *rs, srv_choice_t *ch, const char *finish, srv_buf_t *out);
    void (*stream_end)(const srv_resp_t *rs, srv_choice_t *ch, const srv_usage_t *u,
                       srv_buf_t *out);
    char *(*body)(const srv_resp_t *rs, srv_choice_t *ch, const srv_usage_t *u);
};

extern const srv_api_t srv_api_completions;
extern const srv_api_t srv_api_chat;
extern const srv_api_t srv_api_responses; /* srv_responses.c */

/* Prepares and tokenizes the prompts of p (those given as text). 1, or 0
 * with err (400, or 503 when out of memory). */
int srv_api_prompts(const srv_t *s, const srv_api_t *api, srv_params_t *p, srv_error_t *err);

/* Appends one SSE chunk for choice ci: text piece, logprobs lp (taken and
 * deleted; NULL: none) and finish (NULL while running). prefix caches the
 * chunk's constant head across calls (free it with the request). */
void srv_api_chunk(const srv_resp_t *rs, srv_buf_t *prefix, int32_t ci, srv_choice_t *ch,
                   const srv_buf_t *piece, cJSON *lp, const char *finish, srv_buf_t *out);
/* Appends the final usage chunk (stream_options.include_usage). */
void srv_api_usage_chunk(const srv_resp_t *rs, const srv_usage_t *u, srv_buf_t *out);
/* The whole JSON response, or NULL when out of memory. Takes each
 * choice's logprobs (ch->lp is NULL afterwards). */
char *srv_api_body(const srv_resp_t *rs, srv_choice_t *choices, int32_t n_choices,
                   const srv_usage_t *u);

/* srv_chat.c: renders the conversation with the model's chat template (or
 * the plain one); malloc'd, or NULL with err (400 when the template
 * refuses it or exceeds its limits, 503 when out of memory). */
char *srv_chat_render(const srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp,
                      srv_error_t *err);
/* The same with the template's extra variables (a JSON object's text, or
 * NULL; text/chat.h extra_json): tools, messages with tool fields, kwargs. */
char *srv_chat_render_extra(const srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp,
                            const char *extra_json, srv_error_t *err);

#endif /* SERVER_SRV_OPENAI_H */
