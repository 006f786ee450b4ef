/* srv_admin.h - the web console's admin API (issue 19): the admin key
 * check, GET /admin/kv (the KV block map), GET /admin/kv/blocks/{tier}/{id}
 * (one block), GET /admin/stats (live charts) and POST /reset_prefix_cache.
 *
 * DESIGN
 *   Every route asks the engine with one ADMIN message (scheduler/kv_map.h)
 *   and waits for its reply, which the engine makes at a step boundary;
 *   the JSON is written here, on the loop thread. The map's big arrays
 *   (a state string and two integer arrays per tier, up to hundreds of
 *   thousands of entries) are written by hand into one buffer instead of
 *   through cJSON, which would allocate a node per number.
 *
 *   The admin key (--admin-api-key, stored as its SHA-256) is compared in
 *   constant time. It never reveals token text: a block's token ids and
 *   text go only to the tenant whose key comes in X-Kvserve-Tenant-Key
 *   (kv_map.h says which tenant may see which block).
 *
 *   TTFT and inter-token latency percentiles are over a recent window: the
 *   last SRV_LAT_WINDOW samples of the last 60 s (srv_gen.c feeds it where
 *   it feeds the /metrics histograms).
 *
 * Thread: loop thread.
 */
#ifndef SERVER_SRV_ADMIN_H
#define SERVER_SRV_ADMIN_H

#include <microhttpd.h>
#include <stdint.h>

#include "scheduler/kv_map.h"
#include "server/srv_int.h"

#define SRV_LAT_WINDOW 2048

/* A ring of recent latency samples. */
typedef struct srv_lat {
    float ms[SRV_LAT_WINDOW];
    uint64_t t_ns[SRV_LAT_WINDOW];
    uint32_t next; /* where the next sample goes */
    uint32_t n;    /* samples held, <= SRV_LAT_WINDOW */
} srv_lat_t;

typedef struct srv_admin_lat {
    srv_lat_t ttft;
    srv_lat_t itl;
} srv_admin_lat_t;

/* Adds a sample of seconds s taken at now (now_ns()). */
void srv_lat_add(srv_lat_t *l, uint64_t now, double s);
/* The q-quantile (0..1, nearest rank) in ms of the samples taken within
 * window_ns before now; -1 when there is none. */
double srv_lat_quantile(const srv_lat_t *l, uint64_t now, uint64_t window_ns, double q);

struct cfg;

/* The JSON of a MAP reply (GET /admin/kv): tenants' names from cfg;
 * sorts m's sequences by id. A malloc'd string, or NULL when out of
 * memory. */
char *srv_admin_map_json(const struct cfg *cfg, int32_t block_size, eng_msg_admin_t *m);

struct MHD_Connection;
typedef struct srv srv_t;
typedef struct srv_req srv_req_t;

/* Whether the request may call an admin route: 1, or 0 with err filled
 * (401, authentication_error, code admin_key_required; the message says
 * whether the admin API is off or the key is missing or wrong). */
int srv_admin_authorized(const srv_t *s, struct MHD_Connection *mc, srv_error_t *err);

/* The endpoints (srv_endpoints.c binds them to the route table). */
enum MHD_Result srv_admin_kv(srv_req_t *r);
enum MHD_Result srv_admin_block(srv_req_t *r);
enum MHD_Result srv_admin_stats(srv_req_t *r);
enum MHD_Result srv_admin_reset(srv_req_t *r);

/* An ADMIN_REPLY from the engine: answers the waiting request. */
void srv_admin_on_reply(srv_t *s, const msg_t *m);

#endif /* SERVER_SRV_ADMIN_H */
