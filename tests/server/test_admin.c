/* test_admin.c - the pure parts of the web console's admin API
 * (server/srv_admin_json.c): the hand-written JSON of the KV map, parsed
 * back and compared field by field (edge values, empty tiers, the
 * sequence cap), and the latency windows' percentiles. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "config/config.h"
#include "server/srv_admin.h"

static cJSON *
arr_at(const cJSON *o, const char *key)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);

    ck_assert_msg(cJSON_IsArray(a), "%s is not an array", key);
    return a;
}

static double
num(const cJSON *o, const char *key)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

    ck_assert_msg(cJSON_IsNumber(v), "%s is not a number", key);
    return v->valuedouble;
}

START_TEST(test_map_json_round_trip)
{
    static cfg_t cfg;
    eng_msg_admin_t m;
    uint8_t state[5] = {'n', 'f', 'c', 'u', 'u'};
    uint16_t tenant[5] = {ENG_KV_NO_TENANT, ENG_KV_NO_TENANT, 0, 1, 0xfffe};
    uint32_t ref[5] = {0, 0, 0, 2, 4294967295u};
    eng_kv_seq_t seqs[2] = {
        {.id = 9, .tenant = 1, .n_tokens = 20, .n_blocks = 2, .first = 0, .swapped = 0},
        {.id = 3, .tenant = 0, .n_tokens = 0, .n_blocks = 0, .first = 2, .swapped = 1},
    };
    int32_t blocks[2] = {3, 4};
    char *s;
    cJSON *root, *tiers, *dev, *cpu, *a, *q;

    memset(&cfg, 0, sizeof(cfg));
    cfg.n_tenants = 2;
    snprintf(cfg.tenants[0].name, sizeof(cfg.tenants[0].name), "default");
    snprintf(cfg.tenants[1].name, sizeof(cfg.tenants[1].name), "ac\"me");
    memset(&m, 0, sizeof(m));
    m.step = 12345678901ull;
    m.ns = 1500;
    snprintf(m.stats.kv_dtype, sizeof(m.stats.kv_dtype), "int4");
    m.tiers[0] = (eng_kv_tier_t){.n_blocks = 5, .state = state, .tenant = tenant, .ref = ref};
    m.tiers[1] = (eng_kv_tier_t){.n_blocks = 0};
    m.seqs = seqs;
    m.n_seqs = 2;
    m.n_seqs_total = 300;
    m.seq_blocks = blocks;

    s = srv_admin_map_json(&cfg, 16, &m);
    ck_assert_ptr_nonnull(s);
    root = cJSON_Parse(s);
    ck_assert_msg(root != NULL, "not JSON: %s", s);
    ck_assert_double_eq(num(root, "step"), 12345678901.0);
    ck_assert_double_eq(num(root, "block_size"), 16);
    ck_assert_str_eq(cJSON_GetObjectItem(root, "kv_dtype")->valuestring, "int4");
    ck_assert_double_eq(num(root, "snapshot_us"), 1.5);
    a = arr_at(root, "tenants");
    ck_assert_int_eq(cJSON_GetArraySize(a), 2);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 1), "name")->valuestring,
                     "ac\"me");

    tiers = arr_at(root, "tiers");
    ck_assert_int_eq(cJSON_GetArraySize(tiers), 2);
    dev = cJSON_GetArrayItem(tiers, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(dev, "name")->valuestring, "device");
    ck_assert_double_eq(num(dev, "n_blocks"), 5);
    ck_assert_str_eq(cJSON_GetObjectItem(dev, "state")->valuestring, "nfcuu");
    a = arr_at(dev, "tenant");
    ck_assert_int_eq(cJSON_GetArraySize(a), 5);
    ck_assert_double_eq(cJSON_GetArrayItem(a, 0)->valuedouble, -1);
    ck_assert_double_eq(cJSON_GetArrayItem(a, 2)->valuedouble, 0);
    ck_assert_double_eq(cJSON_GetArrayItem(a, 3)->valuedouble, 1);
    ck_assert_double_eq(cJSON_GetArrayItem(a, 4)->valuedouble, 65534);
    a = arr_at(dev, "refcount");
    ck_assert_double_eq(cJSON_GetArrayItem(a, 3)->valuedouble, 2);
    ck_assert_double_eq(cJSON_GetArrayItem(a, 4)->valuedouble, 4294967295.0);
    cpu = cJSON_GetArrayItem(tiers, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cpu, "state")->valuestring, "");
    ck_assert_int_eq(cJSON_GetArraySize(arr_at(cpu, "tenant")), 0);
    ck_assert_int_eq(cJSON_GetArraySize(arr_at(cpu, "refcount")), 0);

    a = arr_at(root, "sequences"); /* sorted by id */
    ck_assert_int_eq(cJSON_GetArraySize(a), 2);
    q = cJSON_GetArrayItem(a, 0);
    ck_assert_double_eq(num(q, "id"), 3);
    ck_assert_str_eq(cJSON_GetObjectItem(q, "tier")->valuestring, "cpu");
    ck_assert_int_eq(cJSON_GetArraySize(arr_at(q, "blocks")), 0);
    q = cJSON_GetArrayItem(a, 1);
    ck_assert_double_eq(num(q, "id"), 9);
    ck_assert_double_eq(num(q, "tenant"), 1);
    ck_assert_double_eq(num(q, "n_tokens"), 20);
    ck_assert_str_eq(cJSON_GetObjectItem(q, "tier")->valuestring, "device");
    ck_assert_double_eq(cJSON_GetArrayItem(arr_at(q, "blocks"), 0)->valuedouble, 3);
    ck_assert_double_eq(cJSON_GetArrayItem(arr_at(q, "blocks"), 1)->valuedouble, 4);
    ck_assert_double_eq(num(root, "sequences_total"), 300);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(root, "sequences_truncated")));
    cJSON_Delete(root);
    free(s);

    /* Nothing listed, nothing truncated. */
    m.n_seqs = 0;
    m.n_seqs_total = 0;
    m.tiers[0].n_blocks = 0;
    s = srv_admin_map_json(&cfg, 16, &m);
    root = cJSON_Parse(s);
    ck_assert_msg(root != NULL, "not JSON: %s", s);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(root, "sequences_truncated")));
    cJSON_Delete(root);
    free(s);
}
END_TEST

START_TEST(test_latency_window)
{
    static srv_lat_t l;
    uint64_t now = 1000ull * 1000000000ull, win = 60ull * 1000000000ull;

    memset(&l, 0, sizeof(l));
    ck_assert_double_eq(srv_lat_quantile(&l, now, win, 0.5), -1);
    for (int i = 100; i >= 1; i--) {
        srv_lat_add(&l, now, i / 1000.0); /* 1..100 ms */
    }
    ck_assert_double_eq_tol(srv_lat_quantile(&l, now, win, 0.50), 50, 1e-3);
    ck_assert_double_eq_tol(srv_lat_quantile(&l, now, win, 0.99), 99, 1e-3);
    ck_assert_double_eq_tol(srv_lat_quantile(&l, now, win, 1.0), 100, 1e-3);
    /* A minute later they are out of the window; new samples count alone. */
    now += win + 1;
    ck_assert_double_eq(srv_lat_quantile(&l, now, win, 0.5), -1);
    srv_lat_add(&l, now, 0.007);
    ck_assert_double_eq_tol(srv_lat_quantile(&l, now, win, 0.99), 7, 1e-3);
    /* The ring keeps the last SRV_LAT_WINDOW samples. */
    for (int i = 0; i < 2 * SRV_LAT_WINDOW; i++) {
        srv_lat_add(&l, now, i < SRV_LAT_WINDOW ? 1.0 : 0.002);
    }
    ck_assert_double_eq_tol(srv_lat_quantile(&l, now, win, 1.0), 2, 1e-3);
}
END_TEST

Suite *
server_admin_suite(void)
{
    Suite *s = suite_create("server_admin");
    TCase *tc = tcase_create("admin");

    tcase_add_test(tc, test_map_json_round_trip);
    tcase_add_test(tc, test_latency_window);
    suite_add_tcase(s, tc);
    return s;
}
