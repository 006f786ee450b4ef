#!/usr/bin/env python3
"""bench_stall.py - (issue 15) not a test: prints figures. The Python port of
bench_stall.mjs for machines without Node.js (standard library only): starts
kvserve, runs 32 streaming completions back to back for PHASE_S seconds
alone, then for PHASE_S seconds while another process sends 8 MiB prompts
back to back, and prints the 32 streams' inter-token gaps (p50, p99, max) in
each phase, the loop thread's CPU time and the p99 rise.

Usage:
  KVSERVE_BIN=build/cli/kvserve python3 tests/integration/bench_stall.py [PHASE_S]
  (KVSERVE_MODEL picks the model [models/austen-2.7m]; KVSERVE_STALL_FLAGS
  adds serve flags, e.g. '--threads 8' to leave cores to the loop and the
  clients)
"""
import asyncio
import http.client
import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STREAMS = 32
BIG = 8 * 1024 * 1024 - 4096  # under the default 8 MiB body limit


def start_server():
    model = os.environ.get("KVSERVE_MODEL", os.path.join(ROOT, "models", "austen-2.7m"))
    argv = [os.environ["KVSERVE_BIN"], "serve", "--model", model, "--host", "127.0.0.1",
            "--port", "0"] + shlex.split(os.environ.get("KVSERVE_STALL_FLAGS", ""))
    env = dict(os.environ, KVSERVE_API_KEY="")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 120
    log = []
    while time.time() < deadline:
        line = proc.stderr.readline().decode(errors="replace")
        if not line:
            sys.exit("kvserve exited before listening:\n" + "".join(log[-20:]))
        log.append(line)
        m = re.search(r"listening on http://[^ ]*:(\d+)", line)
        if m:
            break
    else:
        sys.exit("no listening line")
    port = int(m.group(1))
    name = json.loads(get(port, "/v1/models"))["data"][0]["id"]
    while True:  # /health turns 200 after the warm-up step
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    # keep draining stderr so the daemon never blocks on a full pipe
    import threading
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port, name


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    return c.getresponse().read()


async def stream(port, name, gaps, deadline):
    body = json.dumps({"model": name, "prompt": "Emma Woodhouse, handsome,", "max_tokens": 200,
                       "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    while time.monotonic() < deadline:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(head.encode() + body)
        await w.drain()
        hdr = await r.readuntil(b"\r\n\r\n")
        chunked = b"chunked" in hdr.lower()
        last, buf = None, b""
        while True:
            if chunked:
                size = int((await r.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    break
                data = await r.readexactly(size + 2)
                data = data[:-2]
            else:
                data = await r.read(65536)
                if not data:
                    break
            now = time.monotonic()
            buf += data
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: {"):
                    if last is not None:
                        gaps.append((now - last) * 1000.0)
                    last = now
        w.close()


def big_prompts(port, name, seconds, q):
    text = "It is a truth universally acknowledged, that a single man. "
    prompt = (text * (BIG // len(text) + 1))[:BIG]
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": 1}).encode()
    stats = {"n": 0, "status": {}, "ms": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            st = c.getresponse()
            st.read()
            stats["status"][st.status] = stats["status"].get(st.status, 0) + 1
        except OSError as e:
            stats["status"][type(e).__name__] = stats["status"].get(type(e).__name__, 0) + 1
        stats["n"] += 1
        stats["ms"].append((time.monotonic() - t0) * 1000.0)
    q.put(stats)


def loop_cpu_ms(pid):
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        v = f.read()
    v = v[v.rindex(")") + 2:].split()
    return (int(v[11]) + int(v[12])) * 1000 // os.sysconf("SC_CLK_TCK")


def pct(a, p):
    s = sorted(a)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


def phase(proc, port, name, seconds, with_big):
    gaps, stats = [], None
    cpu0 = loop_cpu_ms(proc.pid)
    q = multiprocessing.Queue()
    big = None
    if with_big:
        big = multiprocessing.Process(target=big_prompts, args=(port, name, seconds, q))
        big.start()

    async def all_streams():
        deadline = time.monotonic() + seconds
        await asyncio.gather(*[stream(port, name, gaps, deadline) for _ in range(STREAMS)])

    asyncio.run(all_streams())
    if big is not None:
        stats = q.get()
        big.join()
    return gaps, stats, loop_cpu_ms(proc.pid) - cpu0


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    proc, port, name = start_server()
    try:
        a = phase(proc, port, name, seconds, False)
        b = phase(proc, port, name, seconds, True)
    finally:
        proc.terminate()
        proc.wait()
    flags = os.environ.get("KVSERVE_STALL_FLAGS", "") or "default flags"
    print(f"stall bench: {STREAMS} streams, {seconds:g} s per phase, {flags}, "
          f"{os.cpu_count()} CPUs")
    for label, (g, _, ms) in (("alone          ", a), ("with 8 MiB ones", b)):
        print(f"{label}: {len(g)} gaps, p50 {pct(g, 50):.2f} ms, p99 {pct(g, 99):.2f} ms, "
              f"max {max(g, default=0):.2f} ms; loop thread CPU {ms} ms")
    st = b[1]
    print(f"8 MiB prompts sent: {st['n']}, statuses {json.dumps(st['status'])}, "
          f"median round trip {pct(st['ms'], 50):.1f} ms")
    print(f"p99 inter-token gap rise: {(pct(b[0], 99) / pct(a[0], 99) - 1) * 100:.1f}%")


if __name__ == "__main__":
    main()
