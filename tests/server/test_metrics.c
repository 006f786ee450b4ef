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

Suite *
server_metrics_suite(void)
{
    Suite *s = suite_create("server_metrics");
    TCase *tc = tcase_create("metrics");

    tcase_add_test(tc, test_hist_cumulative);
    tcase_add_test(tc, test_metrics_text);
    suite_add_tcase(s, tc);
    return s;
}
