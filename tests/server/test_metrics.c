/* test_metrics.c - histogram buckets and the Prometheus text format. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_int.h"

START_TEST(test_hist_cumulative)
{
    static const double bounds[] = {0.1, 1.0};
    srv_hist_t h;
    srv_buf_t b = {0};

    srv_hist_init(&h, bounds, 2);
    srv_hist_observe(&h, 0.05);
    srv_hist_observe(&h, 0.1); /* le is inclusive */
    srv_hist_observe(&h, 0.5);
    srv_hist_observe(&h, 3.0);
    srv_hist_format(&h, "x_seconds", "tenant=\"a\"", &b);
    ck_assert_str_eq(b.data, "x_seconds_bucket{tenant=\"a\",le=\"0.1\"} 2\n"
                             "x_seconds_bucket{tenant=\"a\",le=\"1\"} 3\n"
                             "x_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 4\n"
                             "x_seconds_sum{tenant=\"a\"} 3.65\n"
                             "x_seconds_count{tenant=\"a\"} 4\n");
    srv_buf_free(&b);
    srv_hist_format(&h, "y", "", &b);
    ck_assert(strstr(b.data, "y_bucket{le=\"+Inf\"} 4\n") != NULL);
    ck_assert(strstr(b.data, "y_count 4\n") != NULL);
    srv_buf_free(&b);
}
END_TEST

/* Every non-comment line is "name{labels} value" or "name value". */
static void
check_exposition(const char *text)
{
    const char *line = text;

    while (*line) {
        const char *end = strchr(line, '\n');
        ck_assert_msg(end != NULL, "unterminated line");
        if (line[0] != '#') {
            const char *sp = memchr(line, ' ', (size_t)(end - line));
            ck_assert_msg(sp != NULL, "no value: %.*s", (int)(end - line), line);
            ck_assert_msg(strncmp(line, "kvserve:", 8) == 0 || strncmp(line, "vllm:", 5) == 0,
                          "prefix: %.*s", (int)(end - line), line);
            char *vend;
            strtod(sp + 1, &vend);
            ck_assert_msg(vend == end, "value: %.*s", (int)(end - line), line);
        } else {
            ck_assert(strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0);
        }
        line = end + 1;
    }
}

START_TEST(test_metrics_text)
{
    const char *names[] = {"default", "team-b"};
    srv_metrics_t m;
    eng_stats_t st;
    srv_buf_t b = {0};

    srv_metrics_init(&m, 2, names);
    memset(&st, 0, sizeof(st));
    st.running = 3;
    st.waiting = 1;
    st.kv_total = 100;
    st.kv_used = 25;
    st.n_tenants = 2;
    st.tenant[1].running = 2;
    snprintf(st.kv_dtype, sizeof(st.kv_dtype), "int8");
    st.kv_block_tokens = 16;
    st.kv_block_bytes = 912 * 16;
    st.kv_block_bytes_f32 = 3072 * 16;
    srv_hist_observe(&m.tenant[1].ttft, 0.02);
    m.tenant[1].generation_tokens = 7;
    m.http_requests[SRV_EP_COMPLETIONS][2] = 5;
    srv_metrics_format(&m, &st, "austen", &b);
    check_exposition(b.data);
    ck_assert(strstr(b.data, "kvserve:num_requests_running{model_name=\"austen\"} 3\n"));
    ck_assert(strstr(b.data, "kvserve:num_requests_waiting{model_name=\"austen\"} 1\n"));
    ck_assert(strstr(b.data,
                     "kvserve:kv_cache_usage_perc{model_name=\"austen\",tier=\"device\"} 0.25\n"));
    ck_assert(strstr(b.data, "kvserve:kv_blocks{tier=\"device\",state=\"used\"} 25\n"));
    ck_assert(strstr(b.data, "kvserve:kv_cache_capacity_tokens{model_name=\"austen\","
                             "dtype=\"int8\"} 1600\n"));
    ck_assert(strstr(b.data, "kvserve:kv_cache_bytes_per_token{model_name=\"austen\","
                             "dtype=\"int8\"} 912\n"));
    ck_assert(strstr(b.data, "kvserve:kv_cache_compression_ratio{model_name=\"austen\","
                             "dtype=\"int8\"} 3.36842\n"));
    ck_assert(strstr(b.data, "kvserve:tenant_requests{tenant=\"team-b\",queue=\"running\"} 2\n"));
    ck_assert(strstr(b.data, "kvserve:generation_tokens_total{tenant=\"team-b\"} 7\n"));
    ck_assert(strstr(b.data, "kvserve:time_to_first_token_seconds_count{tenant=\"team-b\"} 1\n"));
    ck_assert(strstr(b.data, "# TYPE kvserve:inter_token_latency_seconds histogram\n"));
    ck_assert(
        strstr(b.data, "kvserve:http_requests_total{route=\"/v1/completions\",code=\"2xx\"} 5\n"));
    /* vLLM's names, summed over tenants (srv_metrics_vllm.c). */
    ck_assert(strstr(b.data, "vllm:num_requests_running{model_name=\"austen\",engine=\"0\"} 3\n"));
    ck_assert(
        strstr(b.data, "vllm:kv_cache_usage_perc{model_name=\"austen\",engine=\"0\"} 0.25\n"));
    ck_assert(strstr(b.data, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"int8\","
                             "engine=\"0\",num_cpu_blocks=\"0\",num_gpu_blocks=\"100\"} 1\n"));
    ck_assert(strstr(b.data, "# TYPE vllm:generation_tokens_total counter\n"));
    ck_assert(strstr(b.data,
                     "vllm:generation_tokens_total{model_name=\"austen\",engine=\"0\"} 7\n"));
    ck_assert(strstr(b.data, "vllm:time_to_first_token_seconds_count{model_name=\"austen\","
                             "engine=\"0\"} 1\n"));
    srv_buf_free(&b);

    /* Without engine stats only the loop's own metrics appear. */
    srv_metrics_format(&m, NULL, "austen", &b);
    check_exposition(b.data);
    ck_assert(strstr(b.data, "num_requests_running") == NULL);
    ck_assert(strstr(b.data, "kvserve:e2e_request_latency_seconds_bucket") != NULL);
    srv_buf_free(&b);
}
END_TEST

/* Parses one sample line as the Prometheus text format defines it:
 * name, optional {label="value",...} where a value may hold only the
 * escapes \\, \" and \n, a space, a number. Returns the unescaped
 * model_name label value in mn (or "" without one). */
static int
parse_sample(const char *line, const char *end, char *mn, size_t cap)
{
    const char *p = line;

    mn[0] = '\0';
    while (p < end && *p != '{' && *p != ' ') {
        p++;
    }
    if (p < end && *p == '{') {
        p++;
        while (p < end && *p != '}') {
            const char *k = p;
            while (p < end && *p != '=') {
                p++;
            }
            if (p + 1 >= end || p[1] != '"') {
                return 0;
            }
            int is_mn = (size_t)(p - k) == 10 && strncmp(k, "model_name", 10) == 0;
            size_t n = 0;
            p += 2;
            while (p < end && *p != '"') {
                char c = *p++;
                if (c == '\\') {
                    if (p >= end || (*p != '\\' && *p != '"' && *p != 'n')) {
                        return 0;
                    }
                    c = *p == 'n' ? '\n' : *p;
                    p++;
                }
                if (is_mn && n + 1 < cap) {
                    mn[n++] = c;
                    mn[n] = '\0';
                }
            }
            if (p >= end) {
                return 0;
            }
            p++; /* closing quote */
            if (p < end && *p == ',') {
                p++;
            }
        }
        if (p >= end) {
            return 0;
        }
        p++;
    }
    if (p >= end || *p != ' ') {
        return 0;
    }
    char *vend;
    strtod(p + 1, &vend);
    return vend == end;
}

/* A model name with a quote, a backslash and a line feed (served-model-name
 * takes any text) used to break the exposition: the label values are
 * escaped, and parse back to the name. */
START_TEST(test_metrics_label_escape)
{
    const char *names[] = {"default"};
    const char *model = "we\"ird\\name\nx";
    srv_metrics_t m;
    eng_stats_t st;
    srv_buf_t b = {0};
    int n_model = 0;

    srv_metrics_init(&m, 1, names);
    memset(&st, 0, sizeof(st));
    st.n_tenants = 1;
    st.kv_block_tokens = 16;
    st.kv_block_bytes = 16;
    st.kv_block_bytes_f32 = 16;
    snprintf(st.kv_dtype, sizeof(st.kv_dtype), "f32");
    srv_metrics_format(&m, &st, model, &b);
    ck_assert(!b.oom);
    for (const char *line = b.data; *line;) {
        const char *end = strchr(line, '\n');
        char mn[64];
        ck_assert(end != NULL);
        if (line[0] != '#') {
            ck_assert_msg(parse_sample(line, end, mn, sizeof(mn)), "bad line: %.*s",
                          (int)(end - line), line);
            if (mn[0] != '\0') {
                ck_assert_str_eq(mn, model);
                n_model++;
            }
        }
        line = end + 1;
    }
    ck_assert_int_ge(n_model, 5);
    srv_buf_free(&b);

    srv_prom_label_escape(&b, "a\"b\\c\nd");
    ck_assert_str_eq(b.data, "a\\\"b\\\\c\\nd");
    srv_buf_free(&b);
}
END_TEST

/* Route patterns: "{model}" is one non-empty segment, the rest of the path
 * when last; every route gets a metrics label of its pattern. */
START_TEST(test_route_patterns)
{
    const srv_route_t *rt;
    int ep;

    rt = srv_route_find("/v1/models/austen-2.7m", "GET", &ep);
    ck_assert_ptr_nonnull(rt);
    ck_assert_int_eq(ep, SRV_EP_MODEL);
    ck_assert_str_eq(srv_route_param(rt, "/v1/models/austen-2.7m"), "austen-2.7m");
    rt = srv_route_find("/v1/models/org/name", "GET", &ep);
    ck_assert_ptr_nonnull(rt);
    ck_assert_str_eq(srv_route_param(rt, "/v1/models/org/name"), "org/name");
    ck_assert_ptr_null(srv_route_find("/v1/models/x", "POST", &ep));
    ck_assert_int_eq(ep, SRV_EP_MODEL); /* 405, counted under the route */
    ck_assert_ptr_null(srv_route_find("/v1/models/", "GET", &ep));
    ck_assert_int_eq(ep, SRV_EP_OTHER);
    ck_assert_ptr_null(srv_route_find("/v1/modelsx", "GET", &ep));
    ck_assert_int_eq(ep, SRV_EP_OTHER);
    rt = srv_route_find("/v1/models", "GET", &ep);
    ck_assert_int_eq(ep, SRV_EP_MODELS);
    ck_assert_ptr_null(srv_route_param(rt, "/v1/models"));
    ck_assert_ptr_nonnull(srv_route_find("/v1/embeddings", "POST", &ep));
    ck_assert_int_eq(ep, SRV_EP_EMBEDDINGS);
    ck_assert_str_eq(srv_route_label(SRV_EP_MODEL), "/v1/models/{model}");
}
END_TEST

Suite *
server_metrics_suite(void)
{
    Suite *s = suite_create("server_metrics");
    TCase *tc = tcase_create("metrics");

    tcase_add_test(tc, test_hist_cumulative);
    tcase_add_test(tc, test_metrics_text);
    tcase_add_test(tc, test_metrics_label_escape);
    tcase_add_test(tc, test_route_patterns);
    suite_add_tcase(s, tc);
    return s;
}
