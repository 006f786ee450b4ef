/* srv_tokwork.h - POST /tokenize, /detokenize and /apply-template, made on
 * libuv's thread pool (srv_work.h) so that a large body or prompt never
 * stalls the loop thread (issue 15). srv_tokwork.c says what each takes
 * and answers.
 *
 * Thread: loop thread (the work itself runs on a pool thread).
 */
#ifndef SERVER_SRV_TOKWORK_H
#define SERVER_SRV_TOKWORK_H

#include "server/srv_req.h"

/* Each is the access handler's last call for r (its body is in): queues
 * the work and returns MHD_YES, r answered when it is done (503 at once
 * when out of memory). */
enum MHD_Result srv_tok_tokenize(srv_req_t *r);
enum MHD_Result srv_tok_detokenize(srv_req_t *r);
enum MHD_Result srv_tok_apply_template(srv_req_t *r);

#endif /* SERVER_SRV_TOKWORK_H */
