"""kvs.py - helpers for the scale-out tests: start kvserve on 127.0.0.1,
speak HTTP to it with urllib, read /metrics with prometheus_client's parser
(Debian's python3-prometheus-client), and stop every process by its pid.

Environment (set by tests/scaleout/meson.build):
  KVSERVE_BIN    the kvserve executable
  KVSERVE_MODEL  the model to serve
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `kvserve serve` child, on an ephemeral port.

    Waits for the "listening on" line, which kvserve logs once the model is
    loaded and warmed up (/health 200), not when the port opens."""

    def __init__(self, extra=(), env=None, port=0):
        bin_ = os.environ["KVSERVE_BIN"]
        model = os.environ["KVSERVE_MODEL"]
        args = [bin_, "serve", "--model", model, "--host", "127.0.0.1",
                "--port", str(port), *extra]
        e = dict(os.environ, KVSERVE_API_KEY="")
        e.update(env or {})
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=e, text=True)
        self.pid = self.proc.pid
        self.logs = []
        self.port = None
        got = threading.Event()

        def reader():
            for line in self.proc.stderr:
                self.logs.append(line.rstrip("\n"))
                if os.environ.get("KVSERVE_TEST_VERBOSE"):
                    sys.stderr.write(line)
                m = re.search(r"listening on http://[^ ]*:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        if not got.wait(60) or self.port is None:
            self.stop()
            raise RuntimeError("kvserve did not listen:\n" + "\n".join(self.logs[-30:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def http(method, url, body=None, timeout=60, headers=None):
    """(status, parsed JSON or text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    h = {"Content-Type": "application/json"} if data else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status, ctype = r.read(), r.status, r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        raw, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
    text = raw.decode()
    return status, json.loads(text) if "json" in ctype and text else text


def metrics(url):
    """{(name, frozenset(labels)): value} and the families, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families
    status, text = http("GET", url + "/metrics")
    assert status == 200, (status, text)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {}
    for f in fams.values():
        for s in f.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return fams, samples


def sample(samples, name, **labels):
    """The value of the one sample of name whose labels include labels."""
    hits = [v for (n, ls), v in samples.items()
            if n == name and all((k, str(v2)) in ls for k, v2 in labels.items())]
    assert len(hits) == 1, (name, labels, len(hits))
    return hits[0]


def wait_for(pred, timeout=10.0, step=0.05):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()
