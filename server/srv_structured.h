/* srv_structured.h - structured-output request fields -> srv_constraint_t
 * (parsing, in srv_core), and the constraint -> a compiled grammar for the
 * engine (srv_grammar.c, in srv).
 *
 * Thread: loop thread.
 */
#ifndef SERVER_SRV_STRUCTURED_H
#define SERVER_SRV_STRUCTURED_H

#include <cjson/cJSON.h>

#include "server/srv_int.h"

/* Reads response_format {type: text | json_object | json_schema {name,
 * schema, strict}}, vLLM's structured_outputs {json, regex, choice,
 * grammar, json_object} and guided_json / guided_regex / guided_choice /
 * guided_grammar, and llama.cpp's grammar and json_schema, into
 * p->constraint. At most one may ask for a constraint. Returns 1, or 0
 * with err set (400 naming the field). */
int srv_constraint_parse(const cJSON *root, srv_params_t *p, srv_error_t *err);

#endif /* SERVER_SRV_STRUCTURED_H */
