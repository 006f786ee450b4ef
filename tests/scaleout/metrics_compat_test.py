#!/usr/bin/env python3
"""metrics_compat_test.py - the vllm: series of /metrics (issue 17), read
with prometheus_client's own parser (Debian's python3-prometheus-client):
the names, types and label sets the Inference Extension's endpoint picker
and vLLM's Grafana dashboard read, with the same meaning as the kvserve:
series they mirror, checked before and after real requests.
"""
import sys

import kvs

try:
    import prometheus_client.parser  # noqa: F401
except ImportError as e:
    kvs.skip(f"python3-prometheus-client missing ({e})")

MODEL = "austen-2.7m"


def main():
    srv = kvs.Server(["--num-kv-blocks", "64", "--block-size", "16", "--enable-prefix-caching"])
    try:
        fams, s = kvs.metrics(srv.url)
        want = {
            "vllm:num_requests_running": "gauge",
            "vllm:num_requests_waiting": "gauge",
            "vllm:kv_cache_usage_perc": "gauge",
            "vllm:cache_config_info": "gauge",
            "vllm:lora_requests_info": "gauge",
            "vllm:prefix_cache_queries": "counter",
            "vllm:prefix_cache_hits": "counter",
            "vllm:num_preemptions": "counter",
            "vllm:prompt_tokens": "counter",
            "vllm:generation_tokens": "counter",
            "vllm:request_success": "counter",
            "vllm:time_to_first_token_seconds": "histogram",
            "vllm:time_per_output_token_seconds": "histogram",
            "vllm:inter_token_latency_seconds": "histogram",
            "vllm:e2e_request_latency_seconds": "histogram",
        }
        for name, typ in want.items():
            assert name in fams, f"{name} missing"
            assert fams[name].type == typ, (name, fams[name].type, typ)
        # The endpoint picker's label reads: block_size / num_gpu_blocks.
        (cc,) = fams["vllm:cache_config_info"].samples
        assert cc.labels["block_size"] == "16", cc.labels
        assert int(cc.labels["num_gpu_blocks"]) == kvs.sample(
            s, "kvserve:kv_blocks", tier="device", state="total")
        (lora,) = fams["vllm:lora_requests_info"].samples
        assert set(lora.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
        assert kvs.sample(s, "vllm:num_requests_running", model_name=MODEL) == 0
        assert kvs.sample(s, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0

        prompt = "It was a truth universally acknowledged, said Anne to Lady Russell. " * 4
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                "ignore_eos": True}
        for _ in range(3):
            st, reply = kvs.http("POST", srv.url + "/v1/completions", body)
            assert st == 200, reply
        fams, s = kvs.metrics(srv.url)
        # Same meaning as the kvserve: series they mirror.
        pairs = [("vllm:prefix_cache_queries_total", "kvserve:prefix_cache_queries_total"),
                 ("vllm:prefix_cache_hits_total", "kvserve:prefix_cache_hits_total")]
        for v, k in pairs:
            assert kvs.sample(s, v, model_name=MODEL) == kvs.sample(s, k), v
        assert kvs.sample(s, "vllm:prefix_cache_hits_total", model_name=MODEL) > 0
        assert kvs.sample(s, "vllm:generation_tokens_total", model_name=MODEL) == 15
        assert kvs.sample(s, "vllm:prompt_tokens_total", model_name=MODEL) == \
            kvs.sample(s, "kvserve:prompt_tokens_total", tenant="default")
        assert kvs.sample(s, "vllm:request_success_total", model_name=MODEL,
                          finished_reason="length") == 3
        assert kvs.sample(s, "vllm:e2e_request_latency_seconds_count", model_name=MODEL) == 3
        assert kvs.sample(s, "vllm:time_to_first_token_seconds_count", model_name=MODEL) == 3
        assert kvs.sample(s, "vllm:inter_token_latency_seconds_count", model_name=MODEL) == 12
        used = kvs.sample(s, "kvserve:kv_blocks", tier="device", state="used")
        total = kvs.sample(s, "kvserve:kv_blocks", tier="device", state="total")
        assert kvs.sample(s, "vllm:kv_cache_usage_perc", model_name=MODEL) == used / total
        print("ok: vllm: series parse with prometheus_client and match the kvserve: ones")
    finally:
        rc = srv.stop()
    assert rc == 0, rc


if __name__ == "__main__":
    sys.exit(main())
