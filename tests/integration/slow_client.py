#!/usr/bin/python3
"""slow_client.py - a client that sends one streaming request on a socket with
a tiny receive buffer, then does not read for HOLD seconds, then reads
everything. Prints one JSON line: did the stream end with an error event,
with [DONE], and how many bytes came.

usage: slow_client.py PORT HOLD_SECONDS JSON_BODY
"""
import json
import socket
import sys
import time

port, hold, body = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].encode()
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
s.connect(("127.0.0.1", port))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
print(json.dumps({"sent": True}), flush=True)
time.sleep(hold)
data = b""
s.settimeout(60)
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(json.dumps({"error": b'data: {"error"' in data, "done": b"data: [DONE]" in data,
                  "bytes": len(data), "status": data[:12].decode("latin1")}), flush=True)
