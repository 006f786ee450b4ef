#!/usr/bin/python3
"""check_loadtest.py - kvs-loadtest against a server on loopback.

usage: check_loadtest.py mock LOADTEST MOCK_SERVER_PY
       check_loadtest.py kvserve LOADTEST KVSERVE SOURCE_ROOT
       check_loadtest.py compare LOADTEST KVSERVE SOURCE_ROOT MOCK_SERVER_PY

mock: runs kvs-loadtest against tests/loadtest/mock_openai.py (closed and
open loop, streaming and not, completions and chat, a prompts file, 429s
and server-closed keep-alive connections) and checks that its counts equal
what the server says it served.

kvserve: starts `kvserve serve` with the default model on 127.0.0.1, runs a
bounded load (a few hundred requests, streaming and not), and checks the
loadtest's request and token counts against the deltas of the server's
/metrics, and that nothing is left running. Exits 77 (skip) while
`kvserve serve --help` does not work yet.

compare: loadtest/compare end to end on tiny loads, with kvserve and the
mock standing in for llama-server: both columns, every level, JSON, PNG.
"""
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def run_lt(lt, url, *extra):
    cmd = [lt, "--url", url, "--json", "--no-progress", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        print(p.stdout, p.stderr)
        raise
    print(" ".join(extra), "->", rep["requests"], rep["errors"], rep["tokens"],
          "%.1f out tok/s" % rep["throughput"]["output_tokens_per_s"])
    return p.returncode, rep


def get(url, key=None):
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read().decode()


def mock(lt, mock_py):
    tmp = tempfile.mkdtemp()
    pf = os.path.join(tmp, "port")
    srv = subprocess.Popen(["/usr/bin/python3", mock_py, pf, "--fail-every", "7",
                            "--close-every", "5"])
    try:
        for _ in range(200):
            if os.path.exists(pf):
                break
            time.sleep(0.05)
        url = "http://127.0.0.1:" + open(pf).read()
        prev = json.loads(get(url + "/stats")[1])

        def delta():
            nonlocal prev
            cur = json.loads(get(url + "/stats")[1])
            d = {k: cur[k] - prev[k] for k in cur if isinstance(cur[k], int)}
            d["auth"] = cur["auth"]
            prev = cur
            return d

        # Closed loop, streaming completions, token-id prompts.
        rc, rep = run_lt(lt, url, "--concurrency", "6", "--max-requests", "120",
                         "--input-len", "8-40", "--output-len", "normal:20:5", "--api-key", "k1")
        d = delta()
        check(rc == 3, f"exit status {rc} with some 429s (want 3)")
        check(rep["model"] == "mock-model", "model discovered from /v1/models")
        check(rep["requests"]["issued"] == 120 and rep["requests"]["completed"] == 120,
              f"issued/completed {rep['requests']}")
        check(rep["requests"]["ok"] == d["ok"], f"ok {rep['requests']['ok']} != server {d['ok']}")
        check(rep["errors"].get("429") == d["failed"] == 120 // 7, f"429s {rep['errors']} {d}")
        check(rep["requests"]["failed"] == d["failed"], "failed count")
        check(rep["tokens"]["output"] == d["completion_tokens"], "output tokens = server's")
        check(rep["tokens"]["prompt"] == d["prompt_tokens"], "prompt tokens = server's")
        check(d["stream"] == d["ok"], "all requests streamed")
        check(d["auth"] == "Bearer k1", "api key sent")
        check(rep["requests"]["peak_in_flight"] == 6, "closed loop keeps 6 in flight")
        check(rep["ttft_ms"]["n"] == d["ok"] and rep["e2e_ms"]["n"] == d["ok"], "per-request stats")
        check(rep["itl_ms"]["n"] == d["completion_tokens"] - d["ok"], "one ITL per token gap")
        check(rep["ttft_ms"]["p50"] <= rep["ttft_ms"]["p99"] <= rep["ttft_ms"]["max"], "ordered")

        # Open loop (Poisson), non-streaming chat, capped in-flight.
        rc, rep = run_lt(lt, url, "--rate", "200", "--concurrency", "3", "--max-requests", "60",
                         "--no-stream", "--endpoint", "chat", "--model", "mock-model",
                         "--output-len", "5")
        d = delta()
        check(rep["mode"] == "open" and rep["requests"]["completed"] == 60, "open loop ran 60")
        check(rep["requests"]["peak_in_flight"] <= 3, "open loop respects --concurrency")
        check(rep["requests"]["ok"] == d["ok"] and rep["requests"]["failed"] == d["failed"],
              f"open loop counts {rep['requests']} vs {d}")
        check(rep["tokens"]["output"] == d["completion_tokens"] == 5 * d["ok"], "max_tokens sent")
        check(d["stream"] == 0 and rep["ttft_ms"] is None, "non-streaming has no TTFT")

        # A prompts file, with per-line max_tokens, and a duration bound.
        pj = os.path.join(tmp, "p.jsonl")
        with open(pj, "w") as f:
            f.write('{"prompt": "hello there", "max_tokens": 3}\n\n')
            f.write('{"prompt": [5, 6, 7, 8], "max_tokens": 4}\n')
        rc, rep = run_lt(lt, url, "--prompts", pj, "--concurrency", "2", "--max-requests", "10",
                         "--model", "m")
        d = delta()
        check(rep["tokens"]["output"] == d["completion_tokens"] and
              3 * d["ok"] < d["completion_tokens"] < 4 * d["ok"],
              f"prompts file max_tokens: {rep['tokens']} {d}")
        check(rep["tokens"]["prompt"] == d["prompt_tokens"], "prompt tokens from usage")
        rc, rep = run_lt(lt, url, "--duration", "0.5", "--concurrency", "2", "--model", "m",
                         "--output-len", "2")
        d = delta()
        check(rep["requests"]["completed"] == d["requests"] > 0, "duration bound")

        # Open loop faster than one slot can serve, bounded by time: the
        # arrivals still waiting when the time is up are dropped and the run ends.
        rc, rep = run_lt(lt, url, "--rate", "2000", "--concurrency", "1", "--duration", "0.3",
                         "--model", "m", "--output-len", "20", "--input-len", "4")
        d = delta()
        check(rep["requests"]["completed"] == rep["requests"]["issued"] == d["requests"] > 0 and
              rep["requests"]["peak_in_flight"] == 1, f"rate over capacity: {rep['requests']}")

        # Connections the server drops without answering: a request sent on a
        # pooled connection is retried once on a fresh one; on a fresh
        # connection it counts as an error.
        srv2 = subprocess.Popen(["/usr/bin/python3", mock_py, pf + "2", "--drop-every", "4"])
        try:
            for _ in range(200):
                if os.path.exists(pf + "2"):
                    break
                time.sleep(0.05)
            url2 = "http://127.0.0.1:" + open(pf + "2").read()
            rc, rep = run_lt(lt, url2, "--concurrency", "3", "--max-requests", "60",
                             "--model", "m", "--output-len", "3", "--input-len", "4")
            st = json.loads(get(url2 + "/stats")[1])
            rq = rep["requests"]
            check(rq["completed"] == 60 and rq["ok"] == st["ok"], f"drop: {rq} {st}")
            check(rq["retried"] > 0, "dropped pooled connections are retried")
            check(st["requests"] == 60 + rq["retried"], f"each retry reached the server once: {st}")
            check(st["dropped"] == rq["retried"] + rep["errors"].get("closed", 0),
                  f"every drop is a retry or a 'closed' error: {st} {rep['errors']}")
        finally:
            srv2.terminate()
            srv2.wait()

        bad = subprocess.run([lt, "--url", "ftp://x"], capture_output=True, text=True)
        check(bad.returncode == 2 and "--url" in bad.stderr, "bad --url is a usage error")
        bad = subprocess.run([lt, "--input-len", "0"], capture_output=True, text=True)
        check(bad.returncode == 2, "bad --input-len is a usage error")
    finally:
        srv.terminate()
        srv.wait()


def metrics(url):
    """Sums each metric's samples over their labels; request_success_total
    only over finished_reason stop and length."""
    out = {}
    for line in get(url + "/metrics")[1].splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{")[0]
        if name == "kvserve:request_success_total" and not (
                'finished_reason="stop"' in name_labels or 'finished_reason="length"' in name_labels):
            continue
        try:
            out[name] = out.get(name, 0) + float(value)
        except ValueError:
            pass
    return out


def kvserve(lt, kvs, src):
    if subprocess.run([kvs, "serve", "--help"], capture_output=True).returncode != 0:
        print("kvserve serve is not available yet: skip")
        sys.exit(77)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    # When the daemon links the sd_notify wrappers, it must say READY=1 once
    # it serves and STOPPING=1 when it drains: listen as systemd would.
    with open(kvs, "rb") as f:
        notifies = b"READY=1\nMAINPID=" in f.read()
    env = dict(os.environ)
    nsock = None
    if notifies:
        npath = os.path.join(tempfile.mkdtemp(), "notify")
        nsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        nsock.bind(npath)
        env["NOTIFY_SOCKET"] = npath
    srv = subprocess.Popen([kvs, "serve", "--model", os.path.join(src, "models", "austen-2.7m"),
                            "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                            "--served-model-name", "austen"], stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if get(url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if srv.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                print(log.read().decode(errors="replace")[-4000:])
                check(False, "kvserve did not become healthy")
                return
            time.sleep(0.2)
        m0 = metrics(url)
        rc1, r1 = run_lt(lt, url, "--concurrency", "8", "--max-requests", "200", "--input-len",
                         "8-32", "--output-len", "4-16", "--ignore-eos", "--token-range", "3-1000")
        rc2, r2 = run_lt(lt, url, "--rate", "50", "--concurrency", "16", "--max-requests", "100",
                         "--no-stream", "--input-len", "16", "--output-len", "8", "--ignore-eos",
                         "--token-range", "3-1000")
        rc3, r3 = run_lt(lt, url, "--concurrency", "4", "--max-requests", "40",
                         "--endpoint", "chat", "--output-len", "8", "--input-len", "10")
        m1 = metrics(url)
        reps = (r1, r2, r3)
        for rc, r in ((rc1, r1), (rc2, r2), (rc3, r3)):
            check(rc == 0 and r["requests"]["failed"] == 0, f"all requests ok: {r['errors']}")
        check(r1["model"] == "austen", "served model name discovered")
        ok = sum(r["requests"]["ok"] for r in reps)
        out = sum(r["tokens"]["output"] for r in reps)
        prompt = sum(r["tokens"]["prompt"] for r in reps)

        def dm(name):
            return m1.get(name, 0) - m0.get(name, 0)

        check(dm("kvserve:request_success_total") == ok,
              f"request_success_total +{dm('kvserve:request_success_total')} != loadtest {ok}")
        check(dm("kvserve:generation_tokens_total") == out,
              f"generation_tokens_total +{dm('kvserve:generation_tokens_total')} != {out}")
        check(dm("kvserve:prompt_tokens_total") == prompt,
              f"prompt_tokens_total +{dm('kvserve:prompt_tokens_total')} != {prompt}")
        check(r1["tokens"]["output"] >= 4 * 200 and r2["tokens"]["output"] == 8 * 100,
              "ignore_eos gives max_tokens tokens")
        # README's metrics reference lists exactly the served metric families.
        served = set()
        for line in get(url + "/metrics")[1].splitlines():
            if line.startswith("# TYPE "):
                served.add(line.split()[2])
        with open(os.path.join(src, "README.md")) as f:
            readme = f.read().split("## Metrics reference", 1)
        check(len(readme) == 2, "README has a Metrics reference section")
        documented = set()
        # The table after "With `--speculative-config`" lists the families
        # served only with speculation on; this server runs without it.
        for line in readme[-1].split("\nWith `--speculative-config`", 1)[0].splitlines():
            if line.startswith("| `kvserve:") or line.startswith("| `vllm:"):
                documented.add(line.split("`")[1])
        check(served == documented, f"README metrics: undocumented {sorted(served - documented)}, "
              f"not served {sorted(documented - served)}")
        check(m1.get("kvserve:num_requests_running", 0) == 0, "nothing left running")
        check(m1.get("kvserve:num_requests_waiting", 0) == 0, "nothing left waiting")
        srv.send_signal(signal.SIGTERM)
        check(srv.wait(timeout=60) == 0, "kvserve exits 0 on SIGTERM")
        if nsock is not None:
            nsock.setblocking(False)
            msgs = []
            while True:
                try:
                    msgs.append(nsock.recv(4096).decode())
                except BlockingIOError:
                    break
            print("sd_notify:", [m.replace("\n", " ") for m in msgs])
            ready = [i for i, m in enumerate(msgs) if m.startswith("READY=1")]
            stopping = [i for i, m in enumerate(msgs) if m == "STOPPING=1"]
            check(len(ready) == 1 and f"MAINPID={srv.pid}" in msgs[ready[0]],
                  "READY=1 with MAINPID once")
            check(len(stopping) == 1 and stopping[0] > ready[0], "STOPPING=1 after READY=1")
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def compare(lt, kvs, src, mock_py):
    """loadtest/compare end to end on small loads: kvserve on the default
    model's GGUF and, as "llama-server", a wrapper that starts the mock
    server on the port compare chooses."""
    if subprocess.run([kvs, "serve", "--help"], capture_output=True).returncode != 0:
        print("kvserve serve is not available yet: skip")
        sys.exit(77)
    tmp = tempfile.mkdtemp()
    fake = os.path.join(tmp, "llama-server")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\n# a stand-in for llama-server: the mock on the requested port\n"
                "while [ $# -gt 0 ]; do [ \"$1\" = --port ] && port=$2; shift; done\n"
                f"exec /usr/bin/python3 {shlex.quote(mock_py)} {shlex.quote(tmp)}/port "
                "--listen-port \"$port\"\n")
    os.chmod(fake, 0o755)
    out = os.path.join(tmp, "out")
    p = subprocess.run([os.path.join(src, "loadtest", "compare"), "--llama-server", fake,
                        "--gguf", os.path.join(src, "models", "austen-2.7m", "model-f32.gguf"),
                        "--kvserve", kvs, "--loadtest", lt, "--threads", "1",
                        "--concurrency", "1,3", "--input-len", "8", "--output-len", "6",
                        "--requests-per-level", "4", "--out", out],
                       capture_output=True, text=True, timeout=600)
    print(p.stdout[-3000:], p.stderr[-2000:])
    check(p.returncode == 0, f"compare exit status {p.returncode}")
    with open(os.path.join(out, "compare.json")) as f:
        res = json.load(f)
    for name in ("kvserve", "llama-server"):
        check(sorted(res.get(name, {})) == ["1", "3"], f"{name}: levels 1 and 3 measured")
        for c, rep in res.get(name, {}).items():
            check(rep["requests"]["ok"] == max(4, 2 * int(c)) and rep["requests"]["failed"] == 0,
                  f"{name} c={c}: {rep['requests']}")
            check(rep["tokens"]["output"] == 6 * rep["requests"]["ok"], f"{name}: ignore_eos")
            check(rep["peak_rss_mib"] > 0, f"{name}: peak RSS read")
    with open(os.path.join(out, "compare.txt")) as f:
        txt = f.read()
    check("kvserve" in txt and "llama-server" in txt and "TTFT50" in txt, "side-by-side table")
    rows = [l for l in txt.splitlines() if l.strip().startswith(("1 |", "3 |"))]
    check(len(rows) == 2 and all(l.count("|") == 2 for l in rows), f"one row per level: {rows}")
    if shutil.which("gnuplot"):
        with open(os.path.join(out, "compare.png"), "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "compare.png is a PNG")


mode = sys.argv[1]
if mode == "mock":
    mock(sys.argv[2], sys.argv[3])
elif mode == "compare":
    compare(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
else:
    kvserve(sys.argv[2], sys.argv[3], sys.argv[4])
if failures:
    sys.exit(1)
print("OK")
