/* srv_toolparse.h - the output side of tool calling and reasoning models:
 * one parser per choice turns the generated text into content, reasoning
 * content and tool calls, whole (a JSON body) or as it streams.
 *
 * DESIGN
 *   Two stages. The reasoning stage (--reasoning-parser) splits
 *   <think>...</think> off into reasoning: qwen3 only when the output opens
 *   with <think>, deepseek_r1 also when it starts inside the think block
 *   without the open tag (its template wrote it) and then takes everything
 *   up to </think> as reasoning. The tool stage reads what is left by
 *   family:
 *     hermes       <tool_call>{"name":..., "arguments":{...}}</tool_call>, anywhere
 *     llama3_json  the output is {"name":..., "parameters"|"arguments":...}
 *                  (optionally after <|python_tag|>, several joined by ';')
 *     mistral      [TOOL_CALLS][{"name":..., "arguments":...}, ...]
 *     generic      the output is {"tool_calls":[{"name","arguments"}]} or
 *                  {"response":"..."} (the server described the tools)
 *   and, whatever the family, tool_choice "required" (the output is a JSON
 *   array of {"name","parameters"}) and a named function (the output is
 *   the arguments object): what the constraint (srv_constraint_t) makes
 *   the model write.
 *
 *   A tool call is held back until it is complete and parses; text that
 *   may be the start of a marker is held until it is known not to be.
 *   Anything that does not parse is plain content: arbitrary model text
 *   never fails a request. Whitespace around tool calls is dropped.
 *
 *   Results accumulate in the parser (content, reasoning, calls); a stream
 *   drains them as events (srv_tp_next): text, then each call's head
 *   (index, id, name) and its arguments. Feeding the text whole or in any
 *   split gives the same results and the same events joined.
 *
 * Thread: loop thread (pure, no I/O).
 */
#ifndef SERVER_SRV_TOOLPARSE_H
#define SERVER_SRV_TOOLPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "server/srv_int.h"

/* Tool-call output formats (--tool-call-parser). */
enum srv_tp_format {
    SRV_TP_FMT_NONE = 0,
    SRV_TP_FMT_HERMES,
    SRV_TP_FMT_LLAMA3,
    SRV_TP_FMT_MISTRAL,
    SRV_TP_FMT_GENERIC,
};

/* What the request's tool_choice asks of the output. */
enum srv_tp_mode {
    SRV_TP_OFF = 0,   /* no tools, or tool_choice "none": all content */
    SRV_TP_AUTO,      /* the family's format, or content */
    SRV_TP_REQUIRED,  /* a JSON array of {"name","parameters"} */
    SRV_TP_NAMED,     /* the named function's arguments object */
};

/* --reasoning-parser. */
enum srv_tp_reasoning {
    SRV_TP_REASON_NONE = 0,
    SRV_TP_REASON_DEEPSEEK_R1,
    SRV_TP_REASON_QWEN3,
};

/* The format named by --tool-call-parser NAME (hermes, llama3_json,
 * mistral, generic), or SRV_TP_FMT_NONE for anything else ("auto"). */
int srv_tp_format_by_name(const char *name);
/* The format a chat template's tool syntax implies: hermes when it writes
 * <tool_call>, mistral for [TOOL_CALLS], llama3_json for <|python_tag|> or
 * the ipython role, else generic (also for tmpl NULL). */
int srv_tp_format_of_template(const char *tmpl);
/* The reasoning parser named NAME (deepseek_r1, qwen3), else NONE. */
int srv_tp_reasoning_by_name(const char *name);
/* The flag value of a format ("hermes", ...; "none"). */
const char *srv_tp_format_name(int format);

typedef struct srv_tp_call {
    char id[40];  /* "call_..." (mistral: 9 alphanumerics, what its template wants) */
    char *name;   /* owned */
    char *args;   /* owned: the arguments as compact JSON text */
} srv_tp_call_t;

typedef struct srv_tp_cfg {
    int format;      /* enum srv_tp_format */
    int mode;        /* enum srv_tp_mode */
    int reasoning;   /* enum srv_tp_reasoning */
    int parallel;    /* 0: keep only the first call */
    const char *named; /* SRV_TP_NAMED: the function (copied) */
    uint64_t seed;   /* tool call ids are drawn from it */
} srv_tp_cfg_t;

typedef struct srv_tp {
    srv_tp_cfg_t cfg;
    char *named;
    /* reasoning stage */
    int think;         /* inside the think block */
    int think_decided; /* the start of the output was looked at */
    int think_closed;  /* </think> seen: no more tags */
    int think_ws;      /* skipping the whitespace that follows </think> */
    srv_buf_t rhold;
    /* tool stage */
    int tstate;        /* private to srv_toolparse.c */
    srv_buf_t thold;
    int dropped;       /* calls dropped (parallel_tool_calls false) */
    /* results */
    srv_buf_t content;
    srv_buf_t reasoning;
    srv_tp_call_t *calls;
    int32_t n_calls, cap_calls;
    int finished;
    int oom;           /* an allocation failed: results are incomplete */
    /* stream cursors (srv_tp_next) */
    size_t content_sent, reasoning_sent;
    int32_t calls_sent;  /* calls whose arguments were sent */
    int head_sent;       /* the head of calls[calls_sent] was sent */
    /* the Responses API stream's state (srv_responses.c) */
    int32_t rsp_seq;     /* next sequence_number */
    int32_t rsp_items;   /* output items opened */
    int rsp_msg_open;    /* a message item is open (its output index: rsp_msg_item) */
    int32_t rsp_msg_item;
    int rsp_started;
} srv_tp_t;

/* Sets tp up for cfg. 1, or 0 when out of memory (tp then needs no fini). */
int srv_tp_init(srv_tp_t *tp, const srv_tp_cfg_t *cfg);
void srv_tp_fini(srv_tp_t *tp);
/* Feeds generated text; final: the choice has ended (the rest is
 * released, pending calls parsed). Nothing more may be fed after final. */
void srv_tp_feed(srv_tp_t *tp, const char *text, size_t n, int final);
/* The finish_reason once final: "tool_calls" when calls were made (unless
 * the choice ran out of tokens), else finish. */
const char *srv_tp_finish_reason(const srv_tp_t *tp, const char *finish);

enum srv_tp_ev_kind {
    SRV_TP_EV_TEXT = 1,   /* content and/or reasoning released */
    SRV_TP_EV_CALL_HEAD,  /* call: index, id, name */
    SRV_TP_EV_CALL_ARGS,  /* call: its arguments */
};

typedef struct srv_tp_event {
    int kind;
    const char *content; /* borrowed; valid until the next feed */
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    int32_t call;        /* index into calls */
} srv_tp_event_t;

/* The next stream event; 1 and advances, or 0 when nothing is pending. */
int srv_tp_next(srv_tp_t *tp, srv_tp_event_t *ev);
/* 1 when srv_tp_next has an event. */
int srv_tp_pending(const srv_tp_t *tp);
/* Appends a chat delta's fields for ev (no braces): "content",
 * "reasoning_content", or "tool_calls":[...] per OpenAI's stream. */
void srv_tp_chat_delta(const srv_tp_t *tp, const srv_tp_event_t *ev, srv_buf_t *out);

#endif /* SERVER_SRV_TOOLPARSE_H */
