/* srv_endpoints.h - what each endpoint of the route table does: the small
 * endpoints (models, health, version, metrics, tokenize, detokenize) and
 * the binding of the generation endpoints to their srv_api_t.
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_ENDPOINTS_H
#define SERVER_SRV_ENDPOINTS_H

#include "server/srv_req.h"

/* Runs the endpoint ep for r, whose body is in (404 for SRV_EP_OTHER).
 * The access handler's return value. */
enum MHD_Result srv_ep_dispatch(srv_req_t *r, int ep);
/* A STATS_REPLY from the engine: kept as the latest stats, and the answer
 * of the /metrics request that asked for it (cookie), if still waiting. */
void srv_ep_stats_reply(srv_t *s, const eng_msg_stats_t *st);

#endif /* SERVER_SRV_ENDPOINTS_H */
