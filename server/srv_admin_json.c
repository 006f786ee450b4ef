/* srv_admin_json.c - the pure parts of the admin API (srv_admin.h): the
 * latency windows of /admin/stats and the JSON of the KV map, unit-tested
 * in tests/server/test_admin.c.
 *
 * DESIGN
 *   The map's arrays have one entry per block (hundreds of thousands), so
 *   they are written by hand into one buffer reserved for the worst case
 *   (18 bytes per block) rather than through cJSON, which would allocate
 *   a node per number and print through snprintf: the whole reply is then
 *   one reservation and a loop of byte stores.
 *
 * Thread: loop thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "server/srv_admin.h"

static const char *const tier_names[2] = {"device", "cpu"};

void
srv_lat_add(srv_lat_t *l, uint64_t now, double s)
{
    l->ms[l->next] = (float)(s * 1e3);
    l->t_ns[l->next] = now;
    l->next = (l->next + 1) % SRV_LAT_WINDOW;
    if (l->n < SRV_LAT_WINDOW) {
        l->n++;
    }
}

static int
cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;

    return (x > y) - (x < y);
}

double
srv_lat_quantile(const srv_lat_t *l, uint64_t now, uint64_t window_ns, double q)
{
    float v[SRV_LAT_WINDOW];
    uint32_t n = 0;

    for (uint32_t i = 0; i < l->n; i++) {
        if (now - l->t_ns[i] <= window_ns) {
            v[n++] = l->ms[i];
        }
    }
    if (n == 0) {
        return -1;
    }
    qsort(v, n, sizeof(v[0]), cmp_float);
    uint32_t k = (uint32_t)ceil(q * n);
    return v[k > 0 ? k - 1 : 0];
}

/* Appends v in decimal: the map writes up to two numbers per block, and
 * this is several times faster than snprintf. */
static char *
put_u32(char *p, uint32_t v)
{
    char tmp[10];
    int n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) {
        *p++ = tmp[--n];
    }
    return p;
}

static void
map_tier(srv_buf_t *b, const char *name, const eng_kv_tier_t *t)
{
    uint32_t n = t->n_blocks;
    char *p;

    srv_buf_printf(b, "{\"name\":\"%s\",\"n_blocks\":%u,\"state\":\"", name, n);
    /* state: the bytes as they are ('f' 'c' 'u' 'n'); tenant: "-1," or up
     * to 5 digits and a comma; ref: up to 10 digits and a comma. */
    if (!srv_buf_reserve(b, (size_t)n * 18 + 64)) {
        return;
    }
    p = b->data + b->len;
    if (n > 0) { /* an empty tier's arrays may be NULL */
        memcpy(p, t->state, n);
        p += n;
    }
    memcpy(p, "\",\"tenant\":[", 12);
    p += 12;
    for (uint32_t i = 0; i < n; i++) {
        if (t->tenant[i] == ENG_KV_NO_TENANT) {
            memcpy(p, "-1", 2);
            p += 2;
        } else {
            p = put_u32(p, t->tenant[i]);
        }
        *p++ = ',';
    }
    if (n > 0) {
        p--;
    }
    memcpy(p, "],\"refcount\":[", 14);
    p += 14;
    for (uint32_t i = 0; i < n; i++) {
        p = put_u32(p, t->ref[i]);
        *p++ = ',';
    }
    if (n > 0) {
        p--;
    }
    memcpy(p, "]}", 2);
    p += 2;
    b->len = (size_t)(p - b->data);
    b->data[b->len] = '\0';
}

static int
cmp_seq(const void *a, const void *b)
{
    uint64_t x = ((const eng_kv_seq_t *)a)->id, y = ((const eng_kv_seq_t *)b)->id;

    return (x > y) - (x < y);
}

static void
tenants_json(srv_buf_t *b, const struct cfg *cfg)
{
    srv_buf_adds(b, "\"tenants\":[");
    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        srv_buf_printf(b, "%s{\"id\":%d,\"name\":", t > 0 ? "," : "", t);
        srv_json_string(b, cfg->tenants[t].name, strlen(cfg->tenants[t].name));
        srv_buf_adds(b, "}");
    }
    srv_buf_adds(b, "]");
}

char *
srv_admin_map_json(const struct cfg *cfg, int32_t block_size, eng_msg_admin_t *m)
{
    srv_buf_t b = {0};

    srv_buf_printf(&b, "{\"step\":%llu,\"block_size\":%d,\"kv_dtype\":",
                   (unsigned long long)m->step, block_size);
    srv_json_string(&b, m->stats.kv_dtype, strlen(m->stats.kv_dtype));
    srv_buf_printf(&b, ",\"snapshot_us\":%.1f,", (double)m->ns / 1e3);
    tenants_json(&b, cfg);
    srv_buf_adds(&b, ",\"tiers\":[");
    for (int t = 0; t < 2; t++) {
        if (t > 0) {
            srv_buf_adds(&b, ",");
        }
        map_tier(&b, tier_names[t], &m->tiers[t]);
    }
    srv_buf_adds(&b, "],\"sequences\":[");
    qsort(m->seqs, m->n_seqs, sizeof(*m->seqs), cmp_seq);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const eng_kv_seq_t *q = &m->seqs[i];
        srv_buf_printf(&b,
                       "%s{\"id\":%llu,\"tenant\":%u,\"tier\":\"%s\",\"n_tokens\":%u,"
                       "\"blocks\":[",
                       i > 0 ? "," : "", (unsigned long long)q->id, q->tenant,
                       tier_names[q->swapped ? 1 : 0], q->n_tokens);
        if (srv_buf_reserve(&b, (size_t)q->n_blocks * 11 + 4)) {
            char *p = b.data + b.len;
            for (uint32_t k = 0; k < q->n_blocks; k++) {
                if (k > 0) {
                    *p++ = ',';
                }
                p = put_u32(p, (uint32_t)m->seq_blocks[q->first + k]);
            }
            *p++ = ']';
            *p++ = '}';
            b.len = (size_t)(p - b.data);
            b.data[b.len] = '\0';
        }
    }
    srv_buf_printf(&b, "],\"sequences_total\":%u,\"sequences_truncated\":%s}", m->n_seqs_total,
                   m->n_seqs_total > m->n_seqs ? "true" : "false");
    if (b.oom) {
        srv_buf_free(&b);
    }
    return b.data;
}

