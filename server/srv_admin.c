/* srv_admin.c - the web console's admin API (srv_admin.h): the admin key,
 * the ADMIN message round trip to the engine, and the JSON of
 * /admin/kv/blocks/{tier}/{id}, /admin/stats and /reset_prefix_cache (the
 * map's and the latency windows are in srv_admin_json.c).
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "admin"

#include "server/srv_admin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "scheduler/kv_map.h"
#include "server/srv_req.h"
#include "server/srv_state.h"

#define LAT_WINDOW_NS (60ull * 1000000000ull)

static const char *const tier_names[2] = {"device", "cpu"};

/* ---- auth -------------------------------------------------------------------- */

int
srv_admin_authorized(const srv_t *s, struct MHD_Connection *mc, srv_error_t *err)
{
    const char *want = s->cfg->admin_api_key_sha256;
    const char *h;
    char digest[65];

    if (want[0] == '\0') {
        srv_err_set(err, 401, NULL, "the admin API is off: start kvserve with --admin-api-key");
    } else {
        h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
        if (h != NULL && strncasecmp(h, "Bearer ", 7) == 0) {
            h += 7;
            while (*h == ' ') {
                h++;
            }
            sha256_hex(h, strlen(h), digest);
            if (ct_equal(digest, want, 64)) {
                return 1;
            }
        }
        srv_err_set(err, 401, NULL, "a valid admin key is required");
    }
    err->type = "authentication_error";
    err->code = "admin_key_required";
    return 0;
}

/* The tenant whose token text this request may see: the default tenant
 * without auth, else the tenant of X-Kvserve-Tenant-Key, or -1. */
static int32_t
viewer_of(const srv_req_t *r)
{
    const srv_t *s = srv_req_server(r);
    const char *key = srv_req_header(r, "X-Kvserve-Tenant-Key");

    if (!s->cfg->auth_required) {
        return 0;
    }
    return key != NULL ? cfg_tenant_find_by_key(s->cfg, key) : -1;
}

/* ---- the round trip ---------------------------------------------------------- */

static enum MHD_Result
ask_engine(srv_req_t *r, eng_msg_admin_t *m)
{
    const srv_t *s = srv_req_server(r);

    if (s->engine == NULL || !engine_alive(s->engine)) {
        free(m);
        return srv_req_reply_errmsg(r, 503, NULL, "the engine is not running");
    }
    if (!srv_req_reserve(r)) {
        free(m);
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    m->hdr.type = ENG_MSG_ADMIN;
    m->cookie = srv_req_id(r);
    chan_send(engine_inbox(s->engine), &m->hdr);
    srv_req_wait(r);
    return MHD_YES;
}

static eng_msg_admin_t *
new_msg(int op)
{
    eng_msg_admin_t *m = xcalloc_try(1, sizeof(*m));

    if (m != NULL) {
        m->op = op;
        m->viewer = -1;
    }
    return m;
}

enum MHD_Result
srv_admin_kv(srv_req_t *r)
{
    eng_msg_admin_t *m = new_msg(ENG_ADMIN_MAP);

    return m != NULL ? ask_engine(r, m) : srv_req_reply(r, 503, NULL, NULL, 1);
}

enum MHD_Result
srv_admin_stats(srv_req_t *r)
{
    eng_msg_admin_t *m = new_msg(ENG_ADMIN_STATS);

    return m != NULL ? ask_engine(r, m) : srv_req_reply(r, 503, NULL, NULL, 1);
}

enum MHD_Result
srv_admin_reset(srv_req_t *r)
{
    eng_msg_admin_t *m = new_msg(ENG_ADMIN_RESET);

    return m != NULL ? ask_engine(r, m) : srv_req_reply(r, 503, NULL, NULL, 1);
}

/* "{tier}/{id}" of /admin/kv/blocks/{tier}/{id}: 1 with *tier and *id, or 0. */
static int
parse_block_path(const char *p, int32_t *tier, uint32_t *id)
{
    const char *slash;
    char *end;
    unsigned long v;

    if (p == NULL || (slash = strchr(p, '/')) == NULL) {
        return 0;
    }
    if ((size_t)(slash - p) == 6 && strncmp(p, "device", 6) == 0) {
        *tier = 0;
    } else if ((size_t)(slash - p) == 3 && strncmp(p, "cpu", 3) == 0) {
        *tier = 1;
    } else {
        return 0;
    }
    p = slash + 1;
    if (*p < '0' || *p > '9' || strlen(p) > 10) {
        return 0;
    }
    v = strtoul(p, &end, 10);
    if (*end != '\0' || v > UINT32_MAX) {
        return 0;
    }
    *id = (uint32_t)v;
    return 1;
}

enum MHD_Result
srv_admin_block(srv_req_t *r)
{
    const char *param = NULL;
    eng_msg_admin_t *m;
    int32_t tier;
    uint32_t id;

    for (const srv_route_t *rt = srv_routes; rt->path != NULL && param == NULL; rt++) {
        if (rt->ep == SRV_EP_ADMIN_BLOCK) {
            param = srv_route_param(rt, srv_req_url(r));
        }
    }
    if (!parse_block_path(param, &tier, &id)) {
        srv_error_t err;
        srv_err_set(&err, 404, NULL,
                    "no such block: the path is /admin/kv/blocks/{device|cpu}/{id}");
        return srv_req_reply_error(r, &err);
    }
    m = new_msg(ENG_ADMIN_BLOCK);
    if (m == NULL) {
        return srv_req_reply(r, 503, NULL, NULL, 1);
    }
    m->tier = tier;
    m->block = id;
    m->viewer = viewer_of(r);
    return ask_engine(r, m);
}

/* ---- JSON -------------------------------------------------------------------- */

static const char *
hidden_reason(int h)
{
    switch (h) {
    case ENG_KV_OTHER_TENANT:
        return "another tenant's block";
    case ENG_KV_NO_VIEWER:
        return "no tenant key: send a tenant's API key in X-Kvserve-Tenant-Key";
    case ENG_KV_NOT_KEPT:
        return "this block's token ids are not kept";
    default:
        return NULL;
    }
}

static char *
block_json(const srv_t *s, const eng_msg_admin_t *m)
{
    const eng_kv_block_t *o = &m->blk;
    unsigned long mark = srv_json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON *seqs;
    char st[2] = {(char)o->state, '\0'};
    char hex[17];

    cJSON_AddStringToObject(root, "tier", tier_names[m->tier]);
    cJSON_AddNumberToObject(root, "id", m->block);
    cJSON_AddStringToObject(root, "state", st);
    cJSON_AddNumberToObject(root, "refcount", o->ref);
    cJSON_AddNumberToObject(root, "tenant", o->tenant == ENG_KV_NO_TENANT ? -1 : o->tenant);
    seqs = cJSON_AddArrayToObject(root, "sequences");
    for (uint32_t i = 0; i < o->n_holders && i < ENG_KV_MAX_HOLDERS; i++) {
        srv_json_push(seqs, cJSON_CreateNumber((double)o->holders[i]));
    }
    cJSON_AddNumberToObject(root, "sequences_total", o->n_holders);
    if (o->hashed) {
        for (int i = 0; i < 8; i++) {
            snprintf(hex + 2 * i, 3, "%02x", o->hash[i]);
        }
        cJSON_AddStringToObject(root, "hash", hex);
    } else {
        cJSON_AddNullToObject(root, "hash");
    }
    if (o->hidden == ENG_KV_SHOWN) {
        cJSON *toks = cJSON_AddArrayToObject(root, "tokens");
        char *text = NULL;
        size_t len = 0;
        for (int32_t i = 0; i < o->n_tokens; i++) {
            srv_json_push(toks, cJSON_CreateNumber(o->tokens[i]));
        }
        if (tok_decode(s->tok, o->tokens, (size_t)o->n_tokens, 0, &text, &len) == ST_OK) {
            srv_buf_t clean = {0};
            srv_token_text(text, len, &clean);
            cJSON_AddStringToObject(root, "text", clean.data != NULL ? clean.data : "");
            srv_buf_free(&clean);
            free(text);
        } else {
            cJSON_AddNullToObject(root, "text");
        }
        cJSON_AddNullToObject(root, "tokens_hidden");
    } else {
        const char *why = hidden_reason(o->hidden);
        cJSON_AddNullToObject(root, "tokens");
        cJSON_AddNullToObject(root, "text");
        if (why != NULL) {
            cJSON_AddStringToObject(root, "tokens_hidden", why);
        } else {
            cJSON_AddNullToObject(root, "tokens_hidden");
        }
    }
    return srv_json_print(root, mark);
}

/* {"p50":..,"p99":..} of a window, nulls when it is empty. */
static void
add_quantiles(cJSON *root, const char *key, const srv_lat_t *l, uint64_t now)
{
    cJSON *o = cJSON_CreateObject();
    double p50 = srv_lat_quantile(l, now, LAT_WINDOW_NS, 0.50);
    double p99 = srv_lat_quantile(l, now, LAT_WINDOW_NS, 0.99);

    if (p50 < 0) {
        cJSON_AddNullToObject(o, "p50");
        cJSON_AddNullToObject(o, "p99");
    } else {
        cJSON_AddNumberToObject(o, "p50", p50);
        cJSON_AddNumberToObject(o, "p99", p99);
    }
    srv_json_add(root, key, o);
}

static char *
stats_json(const srv_t *s, const eng_stats_t *st)
{
    unsigned long mark = srv_json_mark();
    cJSON *root = cJSON_CreateObject();
    cJSON *o, *arr;
    struct timespec ts;
    uint64_t now = now_ns();

    clock_gettime(CLOCK_REALTIME, &ts);
    cJSON_AddNumberToObject(root, "uptime_s",
                            (double)(ts.tv_sec - s->started) + (double)ts.tv_nsec / 1e9);
    cJSON_AddNumberToObject(root, "step", (double)st->steps);
    cJSON_AddNumberToObject(root, "running", st->running);
    cJSON_AddNumberToObject(root, "waiting", st->waiting);
    cJSON_AddNumberToObject(root, "swapped", st->swapped);
    cJSON_AddNumberToObject(root, "prompt_tokens_total", (double)st->prompt_tokens);
    cJSON_AddNumberToObject(root, "generation_tokens_total", (double)st->generation_tokens);
    add_quantiles(root, "ttft_ms", &s->lat.ttft, now);
    add_quantiles(root, "itl_ms", &s->lat.itl, now);
    o = cJSON_AddObjectToObject(root, "prefix_cache");
    cJSON_AddNumberToObject(o, "queries", (double)st->prefix_queries);
    cJSON_AddNumberToObject(o, "hits", (double)st->prefix_hits);
    cJSON_AddNumberToObject(o, "hit_rate", st->prefix_queries > 0 ? (double)st->prefix_hits /
                                                                        (double)st->prefix_queries
                                                                  : 0.0);
    o = cJSON_AddObjectToObject(root, "preemptions");
    cJSON_AddNumberToObject(o, "recompute", (double)st->preempt_recompute);
    cJSON_AddNumberToObject(o, "swap", (double)st->preempt_swap);
    o = cJSON_AddObjectToObject(root, "kv");
    cJSON_AddNumberToObject(o, "device_blocks", st->kv_total);
    cJSON_AddNumberToObject(o, "device_used", st->kv_used);
    cJSON_AddNumberToObject(o, "device_cached", st->kv_cached);
    cJSON_AddNumberToObject(o, "cpu_blocks", st->swap_total);
    cJSON_AddNumberToObject(o, "cpu_used", st->swap_used);
    cJSON_AddNumberToObject(o, "cpu_cached", st->swap_cached);
    arr = cJSON_AddArrayToObject(root, "tenants");
    for (int32_t t = 0; t < s->cfg->n_tenants && t < ENG_MAX_TENANTS; t++) {
        const cfg_tenant_t *ct = &s->cfg->tenants[t];
        const eng_tenant_stats_t *ts_ = &st->tenant[t];
        double share = ct->max_kv_share > 0 && ct->max_kv_share <= 1 ? ct->max_kv_share : 1.0;
        uint32_t quota = share < 1 ? (uint32_t)floor(share * st->kv_total) : st->kv_total;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", t);
        cJSON_AddStringToObject(e, "name", ct->name);
        cJSON_AddNumberToObject(e, "running", ts_->running);
        cJSON_AddNumberToObject(e, "waiting", ts_->waiting);
        cJSON_AddNumberToObject(e, "swapped", ts_->swapped);
        cJSON_AddNumberToObject(e, "kv_blocks", ts_->kv_blocks);
        cJSON_AddNumberToObject(e, "kv_quota_blocks", quota > 0 ? quota : 1);
        cJSON_AddNumberToObject(e, "max_running", ct->max_running);
        cJSON_AddNumberToObject(e, "prompt_tokens_total", (double)ts_->prompt_tokens);
        cJSON_AddNumberToObject(e, "generation_tokens_total", (double)ts_->generation_tokens);
        srv_json_push(arr, e);
    }
    return srv_json_print(root, mark);
}

void
srv_admin_on_reply(srv_t *s, const msg_t *msg)
{
    eng_msg_admin_t *m = (eng_msg_admin_t *)msg;
    srv_req_t *r = srv_req_find(s, m->cookie);
    char *body = NULL;
    int status = 200;

    if (r == NULL || !srv_req_waiting(r)) {
        return; /* the client went away */
    }
    if (m->status == ST_EINVAL && m->op == ENG_ADMIN_BLOCK) {
        srv_error_t err;
        srv_err_set(&err, 404, NULL, "no block %u on the %s tier", m->block, tier_names[m->tier]);
        srv_req_answer(r, 404, srv_err_json(&err), NULL, 0);
        return;
    }
    if (m->status != ST_OK) {
        srv_req_answer(r, 503, NULL, NULL, 1); /* out of memory: the static 503 */
        return;
    }
    switch (m->op) {
    case ENG_ADMIN_MAP:
        body = srv_admin_map_json(s->cfg, s->block_size, m);
        break;
    case ENG_ADMIN_BLOCK:
        body = block_json(s, m);
        break;
    case ENG_ADMIN_STATS:
        body = stats_json(s, &m->stats);
        break;
    case ENG_ADMIN_RESET: {
        srv_buf_t b = {0};
        srv_buf_printf(&b, "{\"reset\":true,\"blocks_freed\":%u}", m->blocks_freed);
        if (b.oom) {
            srv_buf_free(&b);
        }
        body = b.data;
        LOG_INFO("prefix cache reset: %u cached blocks freed", m->blocks_freed);
        break;
    }
    default:
        status = 500;
        break;
    }
    srv_req_answer(r, body != NULL ? status : 503, body, NULL, body == NULL);
}
