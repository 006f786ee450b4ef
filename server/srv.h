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

typedef struct srv_setup srv_setup_t;

struct srv_setup {
    const cfg_t *cfg;          /* borrowed, immutable */
    /* Loads the model and fills the fields below (model, chat_template,
     * eng, max_model_len); logs its error line. Runs on the loader thread
     * after the port opened; arg is load_arg. */
    int (*load)(void *arg, srv_setup_t *su);
    void *load_arg;
    const mdl_model_t *model;  /* borrowed, immutable */
    const char *chat_template; /* template source, or NULL for the built-in one */
    eng_config_t eng;          /* the engine to create (copied) */
    int32_t max_model_len;     /* effective context length */
};

/* Creates the outbox, binds the listening socket, then loads the model
 * (setup->load) and creates the engine on a loader thread while the port
 * answers 503 loading (srv_ready.h); runs the loop until a signal has
 * drained the server, then stops the engine. Returns ST_OK on a clean
 * shutdown, or a negative ST_* (bind failure, load or engine failure) with
 * a line logged. Thread: becomes the loop thread; blocks. */
int srv_run(const srv_setup_t *setup);

#endif /* SERVER_SRV_H */
