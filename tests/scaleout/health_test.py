#!/usr/bin/env python3
"""health_test.py - readiness and health as orchestrators use them (issue 17).

* GET /health is 200 {"status":"ok"} while the engine runs.
* GET /health?generate=1 runs a one-token generation through the engine
  and reports it; with a forward pass that fails (the test hook
  KVSERVE_TEST_FAIL_FORWARD_AT=2, the first forward after the start-up's
  warm-up step fails) the deep check
  answers 503 where the plain check had said 200 just before.
* SIGTERM: /health answers 503 at once on a kept-alive connection while a
  long in-flight request drains and completes.
"""
import http.client
import json
import os
import signal
import sys
import threading
import time

import kvs

MODEL = "austen-2.7m"


def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"null")


def main():
    srv = kvs.Server(["--public-health", "--drain-timeout", "30s"])
    try:
        st, body = kvs.http("GET", srv.url + "/health")
        assert st == 200 and body == {"status": "ok"}, (st, body)
        st, body = kvs.http("GET", srv.url + "/health?generate=1")
        assert st == 200 and body["status"] == "ok" and body["generate"]["tokens"] == 1, body
        print(f"deep check: {body}")
        st, body = kvs.http("GET", srv.url + "/health?generate=1&timeout_ms=0")
        assert st == 400, (st, body)

        # SIGTERM while a long request runs: /health turns 503 at once on a
        # kept-alive connection; the request still completes.
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        assert get(conn, "/health")[0] == 200
        result = {}

        def long_request():
            # 16 choices x 240 tokens with top logprobs: long enough that
            # it still runs when SIGTERM comes, on a loaded CI machine too.
            result["r"] = kvs.http("POST", srv.url + "/v1/completions",
                                   {"model": MODEL, "prompt": "Anne", "max_tokens": 240,
                                    "n": 16, "logprobs": 5, "ignore_eos": True,
                                    "temperature": 0})

        t = threading.Thread(target=long_request)
        t.start()
        kvs.wait_for(lambda: kvs.sample(kvs.metrics(srv.url)[1],
                                        "kvserve:requests_in_flight") == 1, timeout=10, step=0.005)
        t_sig = time.time()
        os.kill(srv.pid, signal.SIGTERM)
        time.sleep(0.05)
        st, body = get(conn, "/health")
        assert st == 503, (st, body)
        print(f"/health {st} {time.time() - t_sig:.3f} s after SIGTERM")
        t.join(30)
        st, body = result["r"]
        assert st == 200 and body["usage"]["completion_tokens"] == 16 * 240, (st, body)
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()

    # A failing forward: the process and the plain check look fine, the
    # deep check does not.
    srv = kvs.Server(["--public-health"], env={"KVSERVE_TEST_FAIL_FORWARD_AT": "2"})
    try:
        st, _ = kvs.http("GET", srv.url + "/health")
        assert st == 200, st
        st, body = kvs.http("GET", srv.url + "/health?generate=1")
        assert st == 503, (st, body)
        print(f"failing forward: deep check {st} {body}")
    finally:
        srv.stop()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
