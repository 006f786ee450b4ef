#!/usr/bin/env python3
"""spec_metrics_test.py - speculative decoding with a draft model through
`kvserve serve` (issue 16): the vllm:spec_decode_* counters of /metrics
(read with prometheus_client's parser) start at 0 and move after a
speculative request, consistently (accepted <= proposed, per-position
counts non-increasing and summing to the accepted total), and the greedy
text equals a server without speculation. A draft model that does not
exist is refused at start-up with one line naming it.
"""
import json
import os
import subprocess
import sys

import kvs

try:
    import prometheus_client.parser  # noqa: F401
except ImportError as e:
    kvs.skip(f"python3-prometheus-client missing ({e})")

MODEL = "austen-2.7m"
K = 4
PROMPT = ("Anne Elliot had been forced into prudence in her youth, she learned romance "
          "as she grew older. Anne Elliot had been forced into prudence")


def complete(url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0,
            "ignore_eos": True}
    st, reply = kvs.http("POST", url + "/v1/completions", body)
    assert st == 200, reply
    return reply["choices"][0]["text"]


def spec_counters(url):
    _, s = kvs.metrics(url)
    c = {n: kvs.sample(s, "vllm:spec_decode_num_" + n + "_total")
         for n in ("drafts", "draft_tokens", "accepted_tokens")}
    c["per_pos"] = [kvs.sample(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                               position=j) for j in range(K)]
    return c


def main():
    common = ["--num-kv-blocks", "64", "--block-size", "16", "--threads", "1"]
    srv = kvs.Server(common)
    try:
        plain = complete(srv.url)
    finally:
        rc = srv.stop()
    assert rc == 0, rc

    spec = json.dumps({"method": "draft_model", "model": os.environ["KVSERVE_MODEL"],
                       "num_speculative_tokens": K})
    srv = kvs.Server(common + ["--speculative-config", spec])
    try:
        before = spec_counters(srv.url)
        assert before["drafts"] == 0 and before["draft_tokens"] == 0, before
        assert before["accepted_tokens"] == 0 and before["per_pos"] == [0] * K, before
        text = complete(srv.url)
        assert text == plain, (text, plain)
        after = spec_counters(srv.url)
        assert after["drafts"] > 0, after
        assert after["draft_tokens"] >= after["drafts"], after
        assert 0 < after["accepted_tokens"] <= after["draft_tokens"], after
        pp = after["per_pos"]
        assert all(pp[j] >= pp[j + 1] for j in range(K - 1)), pp
        assert sum(pp) == after["accepted_tokens"], (pp, after)
        print(f"ok: {after['drafts']:.0f} drafts, {after['accepted_tokens']:.0f} of "
              f"{after['draft_tokens']:.0f} draft tokens accepted, text as without speculation")
    finally:
        rc = srv.stop()
    assert rc == 0, rc

    # A missing draft model: start-up fails with one line that names it.
    bad = json.dumps({"method": "draft_model", "model": "/nonexistent/draft",
                      "num_speculative_tokens": K})
    p = subprocess.run([os.environ["KVSERVE_BIN"], "serve", "--model", os.environ["KVSERVE_MODEL"],
                        "--host", "127.0.0.1", "--port", "0", "--speculative-config", bad],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, p.returncode
    assert "/nonexistent/draft" in p.stderr and "draft model" in p.stderr, p.stderr
    print("ok: a missing draft model is refused at start-up")


if __name__ == "__main__":
    sys.exit(main())
