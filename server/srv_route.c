/* srv_route.c - the route table: every path the server serves, its method,
 * its endpoint and who may call it, written once.
 *
 * Routing (srv_http.c: 404 for an unknown path, 405 with an Allow header
 * for a known path and another method), the per-route metrics labels
 * (srv_metrics.c) and the openapi integration test (which reads this table
 * and compares it with api/openapi.yaml) all read it. What each endpoint
 * does is bound to it in srv_endpoints.c.
 *
 * Thread: immutable data; the lookups are pure.
 */
#include <stddef.h>
#include <string.h>

#include "server/srv_int.h"

const srv_route_t srv_routes[] = {
    {"/v1/completions", "POST", SRV_EP_COMPLETIONS, SRV_ACCESS_KEY},
    {"/v1/chat/completions", "POST", SRV_EP_CHAT, SRV_ACCESS_KEY},
    {"/v1/models", "GET", SRV_EP_MODELS, SRV_ACCESS_KEY},
    {"/v1/models/{model}", "GET", SRV_EP_MODEL, SRV_ACCESS_KEY},
    {"/v1/embeddings", "POST", SRV_EP_EMBEDDINGS, SRV_ACCESS_KEY},
    {"/health", "GET", SRV_EP_HEALTH, SRV_ACCESS_PUBLIC_HEALTH},
    {"/metrics", "GET", SRV_EP_METRICS, SRV_ACCESS_PUBLIC_METRICS},
    {"/tokenize", "POST", SRV_EP_TOKENIZE, SRV_ACCESS_KEY},
    {"/detokenize", "POST", SRV_EP_DETOKENIZE, SRV_ACCESS_KEY},
    {"/version", "GET", SRV_EP_VERSION, SRV_ACCESS_KEY},
    {"/v1/responses", "POST", SRV_EP_RESPONSES, SRV_ACCESS_KEY},
    {"/admin/kv", "GET", SRV_EP_ADMIN_KV, SRV_ACCESS_ADMIN},
    {"/admin/kv/blocks/{tier}/{id}", "GET", SRV_EP_ADMIN_BLOCK, SRV_ACCESS_ADMIN},
    {"/admin/stats", "GET", SRV_EP_ADMIN_STATS, SRV_ACCESS_ADMIN},
    {"/reset_prefix_cache", "POST", SRV_EP_RESET_PREFIX, SRV_ACCESS_ADMIN},
    {"/apply-template", "POST", SRV_EP_APPLY_TEMPLATE, SRV_ACCESS_KEY},
    {"/", "GET", SRV_EP_CONSOLE_ROOT, SRV_ACCESS_PUBLIC},
    {"/console", "GET", SRV_EP_CONSOLE, SRV_ACCESS_PUBLIC},
    {"/console/{file}", "GET", SRV_EP_CONSOLE, SRV_ACCESS_PUBLIC},
    {NULL, NULL, SRV_EP_OTHER, SRV_ACCESS_KEY},
};

/* Whether path matches the route's pattern: literal bytes, and "{name}"
 * for one non-empty segment (the rest of the path when last, so a model id
 * with a '/' in it matches). */
static int
path_match(const char *pat, const char *path)
{
    while (*pat != '\0') {
        if (*pat == '{') {
            const char *close = strchr(pat, '}');
            size_t n = strcspn(path, close != NULL && close[1] == '\0' ? "" : "/");
            if (close == NULL || n == 0) {
                return 0;
            }
            pat = close + 1;
            path += n;
            continue;
        }
        if (*pat++ != *path++) {
            return 0;
        }
    }
    return *path == '\0';
}

const char *
srv_route_param(const srv_route_t *rt, const char *path)
{
    const char *brace = strchr(rt->path, '{');

    if (brace == NULL || !path_match(rt->path, path)) {
        return NULL;
    }
    return path + (brace - rt->path);
}

const srv_route_t *
srv_route_find(const char *path, const char *method, int *ep)
{
    const srv_route_t *found = NULL;
    int is_head = method != NULL && strcmp(method, "HEAD") == 0;

    *ep = SRV_EP_OTHER;
    for (const srv_route_t *rt = srv_routes; rt->path != NULL; rt++) {
        if (!path_match(rt->path, path)) {
            continue;
        }
        *ep = rt->ep;
        if (method != NULL &&
            (strcmp(method, rt->method) == 0 || (is_head && strcmp(rt->method, "GET") == 0))) {
            found = rt;
        }
    }
    return found;
}

const char *
srv_route_label(int ep)
{
    for (const srv_route_t *rt = srv_routes; rt->path != NULL; rt++) {
        if (rt->ep == ep) {
            return rt->path;
        }
    }
    return "other";
}
