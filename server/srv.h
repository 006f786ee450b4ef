/* srv.h - the HTTP front end: an OpenAI-compatible REST API over the engine.
 *
 * srv_run() owns the loop thread: a libuv loop that drives libmicrohttpd in
 * external-epoll mode (DESIGN.md section 2). It parses and validates
 * requests, authenticates them to a tenant, tokenizes, renders chat
 * templates, submits to the engine's inbox and turns the engine's outbox
 * messages into JSON bodies or SSE streams. It returns after SIGTERM or
 * SIGINT once in-flight requests have drained (or the drain timeout passed).
 *
 * Thread: srv_run() on the thread that becomes the loop thread.
 */
#ifndef SERVER_SRV_H
#define SERVER_SRV_H

#include <stdint.h>

#include "config/config.h"
#include "model/model.h"
#include "scheduler/engine.h"

typedef struct srv_setup {
    const cfg_t *cfg;          /* borrowed, immutable */
    const mdl_model_t *model;  /* borrowed, immutable */
    const char *chat_template; /* template source, or NULL for the built-in one */
    eng_config_t eng;          /* the engine to create (copied) */
    int32_t max_model_len;     /* effective context length */
} srv_setup_t;

/* Creates the outbox and the engine, binds the listening socket, runs the
 * loop until a signal has drained the server, then stops the engine.
 * Returns ST_OK on a clean shutdown, or a negative ST_* (bind failure,
 * engine creation failure) with a line logged. Thread: becomes the loop
 * thread; blocks. */
int srv_run(const srv_setup_t *setup);

#endif /* SERVER_SRV_H */
