/* srv_cors.c - CORS (--allowed-origins): which browser origins may call
 * the API, the preflight answer, and the headers of actual responses.
 *
 * DESIGN
 *   Nothing is allowed unless configured: with --allowed-origins empty (the
 *   default) no response carries an Access-Control-* header, and a
 *   preflight is refused with 403, so a browser page of another origin
 *   cannot read the API even where the API key would let it.
 *   The list is "*" (any origin) or origins compared exactly, scheme, host
 *   and port (https://app.example.com, http://localhost:3000), as the
 *   browser sends them in Origin.
 *
 *   A preflight (OPTIONS with Origin and Access-Control-Request-Method) is
 *   answered before admission, without the API key (browsers never send
 *   credentials on a preflight): 204 with Allow-Origin, Allow-Methods (the
 *   route's method), Allow-Headers (what the page asked for, or
 *   Authorization and Content-Type) and Max-Age; 403 for an origin not on
 *   the list or a method the route does not serve. An OPTIONS that is not
 *   a preflight goes through admission like any other method (405).
 *   Every response to an allowed Origin, errors and SSE streams included,
 *   carries Access-Control-Allow-Origin (and Vary: Origin unless it is
 *   "*"), and exposes X-Request-Id.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "http"

#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "server/srv_cors.h"

int
srv_cors_allowed(const char *list, const char *origin)
{
    size_t on;

    if (list == NULL || origin == NULL || list[0] == '\0' || origin[0] == '\0') {
        return 0;
    }
    on = strlen(origin);
    for (const char *p = list; *p != '\0';) {
        while (*p == ' ' || *p == '\t' || *p == ',') {
            p++;
        }
        const char *e = p;
        while (*e != '\0' && *e != ',') {
            e++;
        }
        size_t n = (size_t)(e - p);
        while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t')) {
            n--;
        }
        if (n == 1 && p[0] == '*') {
            return 1;
        }
        /* A trailing slash in the configuration is not part of an origin. */
        if (n > 0 && p[n - 1] == '/') {
            n--;
        }
        if (n > 0 && n == on && strncasecmp(p, origin, n) == 0) {
            return 1;
        }
        p = e;
    }
    return 0;
}

/* Whether the list is the wildcard alone (then Allow-Origin is "*"). */
static int
list_is_any(const char *list)
{
    while (*list == ' ') {
        list++;
    }
    return list[0] == '*' && list[1 + strspn(list + 1, " ")] == '\0';
}

void
srv_cors_add_headers(const srv_t *s, struct MHD_Connection *mc, int ep,
                     struct MHD_Response *resp)
{
    const char *list = s->cfg->allowed_origins;
    const char *origin, *acrm, *acrh;

    if (list[0] == '\0') {
        return;
    }
    origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
    if (!srv_cors_allowed(list, origin)) {
        return;
    }
    if (list_is_any(list)) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    } else {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id");
    acrm = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Method");
    if (acrm == NULL) {
        return;
    }
    /* A preflight: what the route allows. */
    for (const srv_route_t *rt = srv_routes; rt->path != NULL; rt++) {
        if (rt->ep == ep) {
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", rt->method);
            break;
        }
    }
    acrh = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            acrh != NULL && acrh[0] != '\0' && strlen(acrh) <= 1024
                                ? acrh
                                : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
}

int
srv_cors_preflight(srv_t *s, struct MHD_Connection *mc, uint64_t id, const char *url,
                   const char *method, int *ep, enum MHD_Result *ret)
{
    const char *origin, *acrm;
    srv_error_t err;

    if (strcmp(method, "OPTIONS") != 0) {
        return 0;
    }
    origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
    acrm = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Method");
    if (origin == NULL || acrm == NULL) {
        return 0; /* not a preflight */
    }
    (void)srv_route_find(url, NULL, ep);
    if (*ep == SRV_EP_OTHER) {
        return 0; /* admission answers 404 */
    }
    if (!srv_cors_allowed(s->cfg->allowed_origins, origin)) {
        srv_err_set(&err, 403, NULL, "CORS: the origin '%.200s' is not allowed%s", origin,
                    s->cfg->allowed_origins[0] == '\0' ? " (no --allowed-origins configured)"
                                                       : "");
        err.code = "cors_origin_not_allowed";
        return srv_http_queue(s, mc, id, *ep, 403, srv_err_json(&err), "application/json", 0,
                              ret);
    }
    if (srv_route_find(url, acrm, ep) == NULL) {
        srv_err_set(&err, 403, NULL, "CORS: method '%.40s' is not allowed on this route", acrm);
        err.code = "cors_method_not_allowed";
        return srv_http_queue(s, mc, id, *ep, 403, srv_err_json(&err), "application/json", 0,
                              ret);
    }
    return srv_http_queue(s, mc, id, *ep, 204, xstrdup_try(""), "text/plain", 0, ret);
}
