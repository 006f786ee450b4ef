#!/usr/bin/python3
"""mock_openai.py - a small OpenAI-compatible server for testing kvs-loadtest.

usage: mock_openai.py PORT_FILE [--fail-every K] [--close-every K] [--drop-every K]
                      [--delay-ms D]

Listens on 127.0.0.1 on an ephemeral port or --listen-port (written to
PORT_FILE once listening). /v1/completions and /v1/chat/completions generate max_tokens
tokens ("t0 t1 ..."), streamed as SSE over chunked encoding, one token per
event, usage in the last chunk when stream_options.include_usage is set.
Every K-th request fails with 429 (--fail-every); every K-th response
closes its connection (--close-every); every K-th request is dropped: its
connection closes without a response, as when a server times out an idle
keep-alive connection just as the client reuses it (--drop-every).
GET /stats returns what was served.
"""
import argparse
import json
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("port_file")
ap.add_argument("--listen-port", type=int, default=0)
ap.add_argument("--fail-every", type=int, default=0)
ap.add_argument("--close-every", type=int, default=0)
ap.add_argument("--drop-every", type=int, default=0)
ap.add_argument("--delay-ms", type=float, default=0)
args = ap.parse_args()

lock = threading.Lock()
stats = {"requests": 0, "ok": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0,
         "connections": 0, "stream": 0, "dropped": 0, "auth": ""}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        with lock:
            stats["connections"] += 1

    def log_message(self, *a):
        pass

    def send_json(self, code, obj, close=False):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if code == 429:
            self.send_header("Retry-After", "1")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "mock-model", "object": "model"}]})
        elif self.path == "/stats":
            with lock:
                self.send_json(200, dict(stats))
        else:
            self.send_json(404, {"error": {"message": "no route"}})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n))
        with lock:
            stats["requests"] += 1
            k = stats["requests"]
            stats["auth"] = self.headers.get("Authorization", "")
        close = args.close_every > 0 and k % args.close_every == 0
        if args.drop_every > 0 and k % args.drop_every == 0:
            with lock:
                stats["dropped"] += 1
            self.close_connection = True
            return
        if args.fail_every > 0 and k % args.fail_every == 0:
            with lock:
                stats["failed"] += 1
            self.send_json(429, {"error": {"message": "queue full", "type": "rate_limit"}}, close)
            return
        chat = self.path.endswith("/chat/completions")
        prompt = req.get("messages") if chat else req.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            ptok = len(prompt)
        else:
            ptok = len(json.dumps(prompt).split())
        ntok = int(req.get("max_tokens", 16))
        usage = {"prompt_tokens": ptok, "completion_tokens": ntok, "total_tokens": ptok + ntok}
        with lock:
            stats["ok"] += 1
            stats["prompt_tokens"] += ptok
            stats["completion_tokens"] += ntok
            stats["stream"] += 1 if req.get("stream") else 0
        if not req.get("stream"):
            text = " ".join(f"t{i}" for i in range(ntok))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            self.send_json(200, {"id": "x", "object": "text_completion", "model": "mock-model",
                                 "choices": [choice], "usage": usage}, close)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

        def event(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        if chat:
            event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        for i in range(ntok):
            if args.delay_ms:
                time.sleep(args.delay_ms / 1000)
            tok = f" t{i}"
            ch = ({"index": 0, "delta": {"content": tok}} if chat else {"index": 0, "text": tok})
            if i == ntok - 1:
                ch["finish_reason"] = "length"
            event({"id": "x", "choices": [ch]})
        if (req.get("stream_options") or {}).get("include_usage"):
            event({"id": "x", "choices": [], "usage": usage})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", args.listen_port), Handler)
with open(args.port_file + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os  # noqa: E402
os.rename(args.port_file + ".tmp", args.port_file)
srv.serve_forever()
