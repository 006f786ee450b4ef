/* srv_metrics_vllm.c - the vLLM-compatible series of /metrics.
 *
 * DESIGN
 *   Routers and dashboards built for vLLM read vLLM's metric names: the
 *   Gateway API Inference Extension's endpoint picker scrapes
 *   vllm:num_requests_waiting, vllm:num_requests_running,
 *   vllm:kv_cache_usage_perc, vllm:cache_config_info and
 *   vllm:lora_requests_info; vLLM's Grafana dashboard reads the token,
 *   prefix-cache, preemption and latency series. They are served always,
 *   next to the kvserve: series (no flag): they cost a few hundred lines of
 *   text per scrape, a router should not need kvserve-specific settings,
 *   and no name clashes with a kvserve: one.
 *
 *   Same names, types, labels and meaning as vLLM's v1 engine: gauges and
 *   counters carry model_name and engine="0" (one engine per process);
 *   counters are named with their _total suffix in TYPE and samples, as
 *   prometheus_client's text format 0.0.4 writes them (its parser, and
 *   Prometheus, then know the family as the name without _total); histograms are the sums
 *   over tenants of the kvserve: ones (same buckets, which dashboards read
 *   through histogram_quantile). kv_cache_usage_perc is the device tier's
 *   used fraction (0..1). vllm:time_per_output_token_seconds and
 *   vllm:inter_token_latency_seconds both observe the gap between two
 *   output tokens, as vLLM v1 does. kvserve serves no LoRA adapters:
 *   lora_requests_info says max_lora="0" with empty adapter lists.
 *
 * Thread: loop thread (pure formatting).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server/srv_int.h"

static void
header(srv_buf_t *out, const char *name, const char *type, const char *help)
{
    srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Sums the per-tenant histograms picked by off (offsetof into the tenant
 * record) into one and prints it under name. */
static void
hist_sum(const srv_metrics_t *m, size_t off, const char *name, const char *labels,
         srv_buf_t *out)
{
    srv_hist_t sum;

    const srv_hist_t *first = (const srv_hist_t *)((const char *)&m->tenant[0] + off);
    srv_hist_init(&sum, first->bounds, first->n_buckets);
    for (int32_t t = 0; t < m->n_tenants; t++) {
        const srv_hist_t *h = (const srv_hist_t *)((const char *)&m->tenant[t] + off);
        for (int32_t i = 0; i <= h->n_buckets; i++) {
            sum.counts[i] += h->counts[i];
        }
        sum.count += h->count;
        sum.sum += h->sum;
    }
    srv_hist_format(&sum, name, labels, out);
}

void
srv_metrics_format_vllm(const srv_metrics_t *m, const eng_stats_t *st, const char *model_name,
                        srv_buf_t *out)
{
    char lab[192];
    uint64_t prompt = 0, gen = 0, fin[4] = {0, 0, 0, 0};
    static const char *const reasons[4] = {"stop", "length", "abort", "error"};

    snprintf(lab, sizeof(lab), "model_name=\"%s\",engine=\"0\"", model_name);
    if (st != NULL) {
        header(out, "vllm:num_requests_running", "gauge",
               "Number of requests in model execution batches.");
        srv_buf_printf(out, "vllm:num_requests_running{%s} %u\n", lab, st->running);
        header(out, "vllm:num_requests_waiting", "gauge",
               "Number of requests waiting to be processed.");
        /* Swapped-out requests wait too: the picker reads this as the queue. */
        srv_buf_printf(out, "vllm:num_requests_waiting{%s} %u\n", lab, st->waiting + st->swapped);
        header(out, "vllm:kv_cache_usage_perc", "gauge",
               "KV-cache usage. 1 means 100 percent usage.");
        srv_buf_printf(out, "vllm:kv_cache_usage_perc{%s} %.6g\n", lab,
                       st->kv_total ? (double)st->kv_used / st->kv_total : 0.0);
        header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
        srv_buf_printf(out,
                       "vllm:cache_config_info{block_size=\"%u\",cache_dtype=\"%s\","
                       "engine=\"0\",num_cpu_blocks=\"%u\",num_gpu_blocks=\"%u\"} 1\n",
                       st->kv_block_tokens, st->kv_dtype, st->swap_total, st->kv_total);
        header(out, "vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.");
        srv_buf_printf(out, "vllm:prefix_cache_queries_total{%s} %llu\n", lab,
                       (unsigned long long)st->prefix_queries);
        header(out, "vllm:prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.");
        srv_buf_printf(out, "vllm:prefix_cache_hits_total{%s} %llu\n", lab,
                       (unsigned long long)st->prefix_hits);
        header(out, "vllm:num_preemptions_total", "counter",
               "Cumulative number of preemption from the engine.");
        srv_buf_printf(out, "vllm:num_preemptions_total{%s} %llu\n", lab,
                       (unsigned long long)(st->preempt_swap + st->preempt_recompute));
    }
    if (st != NULL && st->kv_events_on) {
        /* Not vLLM's: the KV-cache event publisher (scheduler/kv_events.h). */
        header(out, "kvserve:kv_events_published_total", "counter",
               "KV-cache events queued for the ZMQ publisher.");
        srv_buf_printf(out, "kvserve:kv_events_published_total %llu\n",
                       (unsigned long long)st->kv_events_published);
        header(out, "kvserve:kv_events_dropped_total", "counter",
               "KV-cache events dropped because the publisher queue was full.");
        srv_buf_printf(out, "kvserve:kv_events_dropped_total %llu\n",
                       (unsigned long long)st->kv_events_dropped);
    }
    header(out, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    srv_buf_printf(out,
                   "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\","
                   "waiting_lora_adapters=\"\"} %lld\n",
                   (long long)time(NULL));
    for (int32_t t = 0; t < m->n_tenants; t++) {
        const srv_tenant_metrics_t *tm = &m->tenant[t];
        prompt += tm->prompt_tokens;
        gen += tm->generation_tokens;
        fin[0] += tm->finished_stop;
        fin[1] += tm->finished_length;
        fin[2] += tm->finished_abort;
        fin[3] += tm->finished_error;
    }
    header(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
    srv_buf_printf(out, "vllm:prompt_tokens_total{%s} %llu\n", lab, (unsigned long long)prompt);
    header(out, "vllm:generation_tokens_total", "counter",
           "Number of generation tokens processed.");
    srv_buf_printf(out, "vllm:generation_tokens_total{%s} %llu\n", lab, (unsigned long long)gen);
    header(out, "vllm:request_success_total", "counter",
           "Count of successfully processed requests.");
    for (int i = 0; i < 4; i++) {
        srv_buf_printf(out, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lab,
                       reasons[i], (unsigned long long)fin[i]);
    }
    header(out, "vllm:time_to_first_token_seconds", "histogram",
           "Histogram of time to first token in seconds.");
    hist_sum(m, offsetof(srv_tenant_metrics_t, ttft), "vllm:time_to_first_token_seconds", lab, out);
    header(out, "vllm:time_per_output_token_seconds", "histogram",
           "Histogram of time per output token in seconds.");
    hist_sum(m, offsetof(srv_tenant_metrics_t, itl), "vllm:time_per_output_token_seconds", lab,
             out);
    header(out, "vllm:inter_token_latency_seconds", "histogram",
           "Histogram of inter-token latency in seconds.");
    hist_sum(m, offsetof(srv_tenant_metrics_t, itl), "vllm:inter_token_latency_seconds", lab, out);
    header(out, "vllm:e2e_request_latency_seconds", "histogram",
           "Histogram of e2e request latency in seconds.");
    hist_sum(m, offsetof(srv_tenant_metrics_t, e2e), "vllm:e2e_request_latency_seconds", lab, out);
}
