/* srv_metrics.c - Prometheus text exposition of the server's metrics.
 *
 * Names follow vLLM's (vllm:num_requests_running, ...) with a kvserve:
 * prefix. Latency histograms (TTFT, inter-token, end-to-end) and token
 * counters carry a tenant label; engine gauges come from a STATS reply.
 * Label values (the model name, tenant names) are escaped as the text
 * format asks: backslash, double quote and line feed as \\, \" and \n.
 * Loop thread (pure formatting).
 */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "server/srv_int.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01,  0.015, 0.02, 0.025,
                                    0.03,  0.04,   0.05,  0.075, 0.1,   0.15, 0.2,
                                    0.3,   0.4,    0.5,   0.75,  1.0,   2.5};
static const double e2e_bounds[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,
                                    5.0,  10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0};

#define NB(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

/* Speculative decoding counters under vLLM's names (the _total suffix is
 * what its Prometheus client writes) and the same under kvserve:. */
static void
srv_metrics_spec(srv_buf_t *out, const eng_stats_t *st)
{
    static const char *const prefix[] = {"vllm", "kvserve"};

    for (int p = 0; p < 2; p++) {
        srv_buf_printf(out,
                       "# HELP %s:spec_decode_num_drafts_total Speculative verifications run.\n"
                       "# TYPE %s:spec_decode_num_drafts_total counter\n"
                       "%s:spec_decode_num_drafts_total %llu\n"
                       "# HELP %s:spec_decode_num_draft_tokens_total Draft tokens proposed.\n"
                       "# TYPE %s:spec_decode_num_draft_tokens_total counter\n"
                       "%s:spec_decode_num_draft_tokens_total %llu\n"
                       "# HELP %s:spec_decode_num_accepted_tokens_total Draft tokens accepted.\n"
                       "# TYPE %s:spec_decode_num_accepted_tokens_total counter\n"
                       "%s:spec_decode_num_accepted_tokens_total %llu\n"
                       "# HELP %s:spec_decode_num_accepted_tokens_per_pos_total Draft tokens "
                       "accepted per position.\n"
                       "# TYPE %s:spec_decode_num_accepted_tokens_per_pos_total counter\n",
                       prefix[p], prefix[p], prefix[p], (unsigned long long)st->spec.drafts,
                       prefix[p], prefix[p], prefix[p], (unsigned long long)st->spec.draft_tokens,
                       prefix[p], prefix[p], prefix[p],
                       (unsigned long long)st->spec.accepted_tokens, prefix[p], prefix[p]);
        for (int32_t j = 0; j < st->spec_k && j < SPEC_MAX_K; j++) {
            srv_buf_printf(out, "%s:spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} "
                                "%llu\n",
                           prefix[p], j, (unsigned long long)st->spec.accepted_per_pos[j]);
        }
    }
}

void
srv_hist_init(srv_hist_t *h, const double *bounds, int32_t n_buckets)
{
    CHECK(n_buckets < SRV_HIST_MAX_BUCKETS);
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_buckets = n_buckets;
}

void
srv_hist_observe(srv_hist_t *h, double v)
{
    int32_t i = 0;

    while (i < h->n_buckets && v > h->bounds[i]) {
        i++;
    }
    h->counts[i]++; /* i == n_buckets is the +Inf bucket */
    h->count++;
    h->sum += v;
}

void
srv_hist_format(const srv_hist_t *h, const char *name, const char *labels, srv_buf_t *out)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";

    for (int32_t i = 0; i < h->n_buckets; i++) {
        cum += h->counts[i];
        srv_buf_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->bounds[i],
                       (unsigned long long)cum);
    }
    cum += h->counts[h->n_buckets];
    srv_buf_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                   (unsigned long long)cum);
    if (labels[0]) {
        srv_buf_printf(out, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, h->sum, name,
                       labels, (unsigned long long)h->count);
    } else {
        srv_buf_printf(out, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                       (unsigned long long)h->count);
    }
}

void
srv_metrics_init(srv_metrics_t *m, int32_t n_tenants, const char *const *names)
{
    memset(m, 0, sizeof(*m));
    CHECK(n_tenants >= 1 && n_tenants <= ENG_MAX_TENANTS);
    m->n_tenants = n_tenants;
    for (int32_t t = 0; t < n_tenants; t++) {
        m->tenant_names[t] = names[t];
        srv_hist_init(&m->tenant[t].ttft, ttft_bounds, NB(ttft_bounds));
        srv_hist_init(&m->tenant[t].itl, itl_bounds, NB(itl_bounds));
        srv_hist_init(&m->tenant[t].e2e, e2e_bounds, NB(e2e_bounds));
    }
}

static void
header(srv_buf_t *out, const char *name, const char *type, const char *help)
{
    srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void
srv_prom_label_escape(srv_buf_t *out, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\') {
            srv_buf_adds(out, "\\\\");
        } else if (*s == '"') {
            srv_buf_adds(out, "\\\"");
        } else if (*s == '\n') {
            srv_buf_adds(out, "\\n");
        } else {
            srv_buf_add(out, s, 1);
        }
    }
    srv_buf_add(out, "", 0);
}

void
srv_metrics_format(const srv_metrics_t *m, const eng_stats_t *st, const char *model_name_raw,
                   srv_buf_t *out)
{
    char lab[160];
    /* Every label value below is printed escaped. */
    srv_buf_t mn = {0}, tnb[ENG_MAX_TENANTS] = {{0}};
    const char *tenant_names[ENG_MAX_TENANTS];
    const char *model_name;

    srv_prom_label_escape(&mn, model_name_raw);
    model_name = mn.data != NULL ? mn.data : "";
    for (int32_t t = 0; t < m->n_tenants && t < ENG_MAX_TENANTS; t++) {
        srv_prom_label_escape(&tnb[t], m->tenant_names[t]);
        tenant_names[t] = tnb[t].data != NULL ? tnb[t].data : "";
        out->oom |= tnb[t].oom;
    }
    out->oom |= mn.oom;

    if (st != NULL) {
        header(out, "kvserve:num_requests_running", "gauge", "Requests running on the engine.");
        srv_buf_printf(out, "kvserve:num_requests_running{model_name=\"%s\"} %u\n", model_name,
                       st->running);
        header(out, "kvserve:num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
        srv_buf_printf(out, "kvserve:num_requests_waiting{model_name=\"%s\"} %u\n", model_name,
                       st->waiting);
        header(out, "kvserve:num_requests_swapped", "gauge", "Requests swapped out to CPU.");
        srv_buf_printf(out, "kvserve:num_requests_swapped{model_name=\"%s\"} %u\n", model_name,
                       st->swapped);
        header(out, "kvserve:kv_cache_usage_perc", "gauge",
               "Fraction of KV blocks in use, per tier (1 = 100%).");
        srv_buf_printf(out, "kvserve:kv_cache_usage_perc{model_name=\"%s\",tier=\"device\"} %.6g\n",
                       model_name, st->kv_total ? (double)st->kv_used / st->kv_total : 0.0);
        srv_buf_printf(out, "kvserve:kv_cache_usage_perc{model_name=\"%s\",tier=\"cpu\"} %.6g\n",
                       model_name, st->swap_total ? (double)st->swap_used / st->swap_total : 0.0);
        header(out, "kvserve:kv_blocks", "gauge", "KV blocks per tier and state.");
        srv_buf_printf(out,
                       "kvserve:kv_blocks{tier=\"device\",state=\"total\"} %u\n"
                       "kvserve:kv_blocks{tier=\"device\",state=\"used\"} %u\n"
                       "kvserve:kv_blocks{tier=\"device\",state=\"cached\"} %u\n"
                       "kvserve:kv_blocks{tier=\"cpu\",state=\"total\"} %u\n"
                       "kvserve:kv_blocks{tier=\"cpu\",state=\"used\"} %u\n"
                       "kvserve:kv_blocks{tier=\"cpu\",state=\"cached\"} %u\n",
                       st->kv_total, st->kv_used, st->kv_cached, st->swap_total, st->swap_used,
                       st->swap_cached);
        if (st->kv_block_bytes > 0 && st->kv_block_tokens > 0) {
            header(out, "kvserve:kv_cache_capacity_tokens", "gauge",
                   "Tokens the device KV blocks hold, in the KV cache dtype.");
            srv_buf_printf(out,
                           "kvserve:kv_cache_capacity_tokens{model_name=\"%s\","
                           "dtype=\"%s\"} %llu\n",
                           model_name, st->kv_dtype,
                           (unsigned long long)st->kv_total * st->kv_block_tokens);
            header(out, "kvserve:kv_cache_bytes_per_token", "gauge",
                   "KV bytes per token over all layers, scales included.");
            srv_buf_printf(out,
                           "kvserve:kv_cache_bytes_per_token{model_name=\"%s\","
                           "dtype=\"%s\"} %.6g\n",
                           model_name, st->kv_dtype,
                           (double)st->kv_block_bytes / st->kv_block_tokens);
            header(out, "kvserve:kv_cache_compression_ratio", "gauge",
                   "Blocks per byte against an f32 KV cache (capacity gain).");
            srv_buf_printf(out,
                           "kvserve:kv_cache_compression_ratio{model_name=\"%s\","
                           "dtype=\"%s\"} %.6g\n",
                           model_name, st->kv_dtype,
                           (double)st->kv_block_bytes_f32 / (double)st->kv_block_bytes);
        }
        header(out, "kvserve:prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.");
        srv_buf_printf(out, "kvserve:prefix_cache_queries_total %llu\n",
                       (unsigned long long)st->prefix_queries);
        header(out, "kvserve:prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache.");
        srv_buf_printf(out, "kvserve:prefix_cache_hits_total %llu\n",
                       (unsigned long long)st->prefix_hits);
        header(out, "kvserve:num_preemptions_total", "counter", "Preemptions by kind.");
        srv_buf_printf(out,
                       "kvserve:num_preemptions_total{kind=\"swap\"} %llu\n"
                       "kvserve:num_preemptions_total{kind=\"recompute\"} %llu\n",
                       (unsigned long long)st->preempt_swap,
                       (unsigned long long)st->preempt_recompute);
        header(out, "kvserve:engine_steps_total", "counter", "Engine iterations run.");
        srv_buf_printf(out, "kvserve:engine_steps_total %llu\n", (unsigned long long)st->steps);
        if (st->spec_k > 0) {
            srv_metrics_spec(out, st);
        }
        header(out, "kvserve:tenant_requests", "gauge", "Engine requests per tenant and queue.");
        for (uint32_t t = 0; t < st->n_tenants && t < (uint32_t)m->n_tenants; t++) {
            const eng_tenant_stats_t *ts = &st->tenant[t];
            const char *tn = tenant_names[t];
            srv_buf_printf(out,
                           "kvserve:tenant_requests{tenant=\"%s\",queue=\"running\"} %u\n"
                           "kvserve:tenant_requests{tenant=\"%s\",queue=\"waiting\"} %u\n"
                           "kvserve:tenant_requests{tenant=\"%s\",queue=\"swapped\"} %u\n",
                           tn, ts->running, tn, ts->waiting, tn, ts->swapped);
        }
        header(out, "kvserve:tenant_kv_blocks", "gauge", "Device KV blocks held per tenant.");
        for (uint32_t t = 0; t < st->n_tenants && t < (uint32_t)m->n_tenants; t++) {
            srv_buf_printf(out, "kvserve:tenant_kv_blocks{tenant=\"%s\"} %u\n", tenant_names[t],
                           st->tenant[t].kv_blocks);
        }
    }

    header(out, "kvserve:prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        srv_buf_printf(out, "kvserve:prompt_tokens_total{tenant=\"%s\"} %llu\n", tenant_names[t],
                       (unsigned long long)m->tenant[t].prompt_tokens);
    }
    header(out, "kvserve:generation_tokens_total", "counter", "Generated tokens.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        srv_buf_printf(out, "kvserve:generation_tokens_total{tenant=\"%s\"} %llu\n",
                       tenant_names[t], (unsigned long long)m->tenant[t].generation_tokens);
    }
    header(out, "kvserve:request_success_total", "counter", "Finished requests by finish reason.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        const srv_tenant_metrics_t *tm = &m->tenant[t];
        const char *tn = tenant_names[t];
        srv_buf_printf(
            out,
            "kvserve:request_success_total{tenant=\"%s\",finished_reason=\"stop\"} %llu\n"
            "kvserve:request_success_total{tenant=\"%s\",finished_reason=\"length\"} "
            "%llu\n"
            "kvserve:request_success_total{tenant=\"%s\",finished_reason=\"abort\"} "
            "%llu\n"
            "kvserve:request_success_total{tenant=\"%s\",finished_reason=\"error\"} "
            "%llu\n",
            tn, (unsigned long long)tm->finished_stop, tn, (unsigned long long)tm->finished_length,
            tn, (unsigned long long)tm->finished_abort, tn, (unsigned long long)tm->finished_error);
    }
    header(out, "kvserve:requests_rejected_total", "counter",
           "Requests refused with 429 because a queue was full.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        srv_buf_printf(out, "kvserve:requests_rejected_total{tenant=\"%s\"} %llu\n",
                       tenant_names[t], (unsigned long long)m->tenant[t].rejected);
    }
    header(out, "kvserve:time_to_first_token_seconds", "histogram", "Time to first token.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        snprintf(lab, sizeof(lab), "tenant=\"%s\"", tenant_names[t]);
        srv_hist_format(&m->tenant[t].ttft, "kvserve:time_to_first_token_seconds", lab, out);
    }
    header(out, "kvserve:inter_token_latency_seconds", "histogram",
           "Time between consecutive output tokens.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        snprintf(lab, sizeof(lab), "tenant=\"%s\"", tenant_names[t]);
        srv_hist_format(&m->tenant[t].itl, "kvserve:inter_token_latency_seconds", lab, out);
    }
    header(out, "kvserve:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
    for (int32_t t = 0; t < m->n_tenants; t++) {
        snprintf(lab, sizeof(lab), "tenant=\"%s\"", tenant_names[t]);
        srv_hist_format(&m->tenant[t].e2e, "kvserve:e2e_request_latency_seconds", lab, out);
    }
    header(out, "kvserve:http_requests_total", "counter",
           "HTTP requests by route and status class.");
    for (int ep = 0; ep < SRV_EP_COUNT; ep++) {
        for (int c = 1; c <= 5; c++) {
            if (m->http_requests[ep][c] > 0) {
                srv_buf_printf(out,
                               "kvserve:http_requests_total{route=\"%s\",code=\"%dxx\"} %llu\n",
                               srv_route_label(ep), c, (unsigned long long)m->http_requests[ep][c]);
            }
        }
    }
    header(out, "kvserve:client_disconnects_total", "counter",
           "Streams cancelled because the client went away.");
    srv_buf_printf(out, "kvserve:client_disconnects_total %llu\n",
                   (unsigned long long)m->disconnects);
    header(out, "kvserve:open_connections", "gauge", "Open HTTP connections.");
    srv_buf_printf(out, "kvserve:open_connections %u\n", m->open_connections);
    header(out, "kvserve:requests_in_flight", "gauge", "Generation requests in flight.");
    srv_buf_printf(out, "kvserve:requests_in_flight %u\n", m->in_flight);
    srv_metrics_format_vllm(m, st, model_name, out);
    srv_buf_free(&mn);
    for (int32_t t = 0; t < m->n_tenants && t < ENG_MAX_TENANTS; t++) {
        srv_buf_free(&tnb[t]);
    }
}
