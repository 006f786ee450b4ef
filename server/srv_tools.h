/* srv_tools.h - the request side of tool calling: how a chat request's
 * tools, tool_choice, tool history and chat_template_kwargs reach the chat
 * template and the constraint, and which output parser reads the answer.
 *
 * DESIGN
 *   srv_chat_ext_parse() (srv_int.h) validates the fields into p->ext when
 *   the body is parsed. srv_tools_prepare() runs before the template: it
 *   picks the output format (--tool-call-parser, or the template's tool
 *   syntax), builds the template's extra variables (messages with their
 *   tool_calls / tool_call_id, tools, the kwargs) and sets the constraint
 *   for tool_choice "required" or a named function (vLLM's schemas). For
 *   templates without tool syntax (the generic format) it describes the
 *   tools in a system message instead and writes the tool history as text
 *   (llama.cpp's approach): assistant calls as {"tool_calls": [...]} and
 *   tool results as user messages {"tool_response": {...}}.
 *
 * Thread: loop thread (pure).
 */
#ifndef SERVER_SRV_TOOLS_H
#define SERVER_SRV_TOOLS_H

#include "server/srv_int.h"
#include "server/srv_toolparse.h"

typedef struct srv_tools_opts {
    const char *tmpl;            /* the chat template's source; NULL: the plain one */
    const char *parser;          /* --tool-call-parser: "auto" or a format name */
    const char *reasoning;       /* --reasoning-parser: "none" or a parser name */
    int force_output;            /* 1: parse the output even without tools (Responses) */
} srv_tools_opts_t;

/* Prepares p for rendering (see DESIGN). *extra receives the template's
 * extra variables as a JSON object text (malloc'd) or NULL. 1, or 0 with
 * err (400: tool_choice "required" / named together with another
 * constraint; 503 out of memory). p->messages may be rewritten. */
int srv_tools_prepare(srv_params_t *p, const srv_tools_opts_t *o, char **extra, srv_error_t *err);

/* The parser configuration of p's output (after srv_tools_prepare). */
void srv_tools_tp_cfg(const srv_params_t *p, uint64_t seed, srv_tp_cfg_t *cfg);

#endif /* SERVER_SRV_TOOLS_H */
