/* srv_embed.h - POST /v1/embeddings (srv_embed.c): the endpoint, and the
 * outbox messages of its engine jobs.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_EMBED_H
#define SERVER_SRV_EMBED_H

#include <microhttpd.h>

#include "server/srv_req.h"

/* Parses, validates and submits the request's inputs (one engine job
 * each), or answers it with an OpenAI-style error. */
enum MHD_Result srv_embed_start(srv_req_t *r);

/* Applies an outbox message (EMBED, FINISHED, ERROR, DELTA) when its id
 * is a job of an open embedding request: returns 1; 0 when it is not (a
 * generation's: srv_gen_on_msg). Does not free m. */
int srv_embed_on_msg(srv_t *s, const msg_t *m);

#endif /* SERVER_SRV_EMBED_H */
