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

/* srv_health.c: GET /health?generate=1, a one-token generation under a
 * timeout (the access handler's return value); srv_health_on_msg takes
 * the outbox messages of its jobs (1: taken, 0: not one of them);
 * srv_health_sweep answers 503 for checks past their timeout. */
enum MHD_Result srv_health_deep(srv_req_t *r);
int srv_health_on_msg(srv_t *s, const msg_t *m);
void srv_health_sweep(srv_t *s, uint64_t now);

#endif /* SERVER_SRV_ENDPOINTS_H */
