/* srv_cors.h - CORS for browser clients (--allowed-origins): the origin
 * check, the preflight answer and the headers of actual responses
 * (srv_cors.c says what is allowed and why).
 *
 * Thread: loop thread only.
 */
#ifndef SERVER_SRV_CORS_H
#define SERVER_SRV_CORS_H

#include <microhttpd.h>
#include <stdint.h>

#include "server/srv_http.h"

/* Whether origin is allowed by list ("" none, "*" any, else a comma list
 * of exact origins). Pure. */
int srv_cors_allowed(const char *list, const char *origin);

/* Adds the Access-Control-* headers a response to this connection's
 * request carries (none unless its Origin is allowed; for a preflight also
 * Allow-Methods of ep's route, Allow-Headers and Max-Age). */
void srv_cors_add_headers(const srv_t *s, struct MHD_Connection *mc, int ep,
                          struct MHD_Response *resp);

/* Answers a CORS preflight (OPTIONS with Origin and
 * Access-Control-Request-Method on a known route): 204, or 403 for an
 * origin or method not allowed. Returns 1 when it queued a response
 * (*ret: MHD's answer, *ep: the route's endpoint), 0 when the request is
 * not a preflight and goes through admission. */
int srv_cors_preflight(srv_t *s, struct MHD_Connection *mc, uint64_t id, const char *url,
                       const char *method, int *ep, enum MHD_Result *ret);

#endif /* SERVER_SRV_CORS_H */
