#!/usr/bin/python3
"""check_dockerfile.py - the Dockerfile has the stages and instructions it must.

usage: check_dockerfile.py SOURCE_ROOT KVSERVE_BINARY

No Docker engine runs here, so the Dockerfile is parsed: a CUDA devel build
stage with -Dcuda=enabled, the matching CUDA runtime stage as the default
target, a CPU-only target built on debian:12; runtime stages copy only the
binary, its libraries and the default model from the build stages, run as a
non-root user, EXPOSE 8000 and have a HEALTHCHECK on /health. The
HEALTHCHECK command is run against a local HTTP server answering 200 and 503,
and the ldd pipeline that collects runtime libraries is run on the built
binary.
"""
import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading

src, binary = sys.argv[1], sys.argv[2]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def parse(path):
    """Returns [(instruction, args, lineno)], continuation lines joined."""
    out, buf, start = [], "", 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not buf and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if buf and s.lstrip().startswith("#"):
                continue
            if not buf:
                start = n
            if s.endswith("\\"):
                buf += s[:-1] + " "
                continue
            buf += s
            instr, _, args = buf.strip().partition(" ")
            out.append((instr.upper(), args.strip(), start))
            buf = ""
    return out


instrs = parse(os.path.join(src, "Dockerfile"))
args_before = {}
stages = []  # dicts: name, base, instrs
for instr, args, n in instrs:
    if instr == "FROM":
        m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", args, re.I)
        check(m is not None, f"line {n}: bad FROM {args}")
        stages.append({"base": m.group(1), "name": m.group(2), "instrs": [], "line": n})
    elif not stages:
        check(instr == "ARG", f"line {n}: only ARG may precede the first FROM")
        k, _, v = args.partition("=")
        args_before[k] = v
    else:
        stages[-1]["instrs"].append((instr, args, n))

byname = {s["name"]: s for s in stages if s["name"]}


def expand(s):
    return re.sub(r"\$\{(\w+)\}", lambda m: args_before.get(m.group(1), "?"), s)


def get(stage, instr):
    return [a for i, a, _ in stage["instrs"] if i == instr]


for need in ("build-cuda", "cuda", "build-cpu", "cpu"):
    check(need in byname, f"no stage named {need}")
if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)

bc, rc, bp, rp = (byname[n] for n in ("build-cuda", "cuda", "build-cpu", "cpu"))
check(stages[-1] is rc, "the default (last) target must be the CUDA runtime stage")
check(re.match(r"nvidia/cuda:.*-devel-", expand(bc["base"])), "build-cuda must use a CUDA devel image")
check(re.match(r"nvidia/cuda:.*-runtime-", expand(rc["base"])), "cuda must use a CUDA runtime image")
check(expand(bc["base"]).replace("-devel-", "-runtime-") == expand(rc["base"]),
      f"runtime image {expand(rc['base'])} does not match devel {expand(bc['base'])}")
check(expand(bp["base"]) == "debian:12", "build-cpu must build on debian:12")
check(expand(rp["base"]).startswith("debian:12"), "cpu must run on debian:12")
check(any("-Dcuda=enabled" in a for a in get(bc, "RUN")), "build-cuda lacks -Dcuda=enabled")
check(any("-Dcuda=disabled" in a for a in get(bp, "RUN")), "build-cpu lacks -Dcuda=disabled")

# The build stages install every library package tools/install-deps lists.
with open(os.path.join(src, "tools", "install-deps")) as f:
    deps = re.search(r'PKGS="([^"]*)"', f.read().replace("\\\n", " ")).group(1).split()
libdev = [p for p in deps if p.startswith("lib") and p.endswith("-dev")]
check(len(libdev) >= 8, f"could not read the -dev packages of tools/install-deps: {libdev}")
for st in (bc, bp):
    run = " ".join(get(st, "RUN"))
    for p in libdev + ["meson", "ninja-build", "pkg-config"]:
        check(re.search(r"(^|\s)" + re.escape(p) + r"(\s|$)", run),
              f"{st['name']} does not install {p}")

for st in (rc, rp):
    name = st["name"]
    copies = get(st, "COPY")
    check(copies and all(c.startswith("--from=build-") for c in copies),
          f"{name}: COPY only from a build stage (no source tree in the runtime image)")
    srcs = " ".join(c.split()[1] for c in copies)
    check("/out/bin/kvserve" in srcs, f"{name}: does not copy the binary")
    check("/out/lib/" in srcs, f"{name}: does not copy the runtime libraries")
    check("/out/share/kvserve/" in srcs, f"{name}: does not copy the default model")
    users = get(st, "USER")
    check(users and users[-1] not in ("root", "0"), f"{name}: must run as a non-root USER")
    check("8000" in get(st, "EXPOSE"), f"{name}: lacks EXPOSE 8000")
    hc = get(st, "HEALTHCHECK")
    check(len(hc) == 1 and "/health" in hc[0], f"{name}: needs one HEALTHCHECK on /health")
    for instr in ("ENTRYPOINT", "CMD"):
        v = get(st, instr)
        check(len(v) == 1, f"{name}: one {instr}")
        try:
            json.loads(v[0])
        except (ValueError, IndexError):
            check(False, f"{name}: {instr} must be in exec (JSON) form")
    cmd = json.loads(get(st, "CMD")[0])
    check(cmd[0] == "serve" and "--host" in cmd and cmd[cmd.index("--host") + 1] == "0.0.0.0",
          f"{name}: CMD must serve on 0.0.0.0")
    check(any("apt-get" in r for r in get(st, "RUN")) is False,
          f"{name}: the runtime stage installs no packages")

# The model the images ship exists.
for st in (bc, bp):
    m = re.search(r"cp -r (models/\S+)", " ".join(get(st, "RUN")))
    check(m and os.path.isdir(os.path.join(src, m.group(1))), f"{st['name']}: default model path")

with open(os.path.join(src, ".dockerignore")) as f:
    ign = f.read().split()
for p in (".git", "build*", "node_modules"):
    check(p in ign, f".dockerignore lacks {p}")


# HEALTHCHECK command against a local server (200 -> exit 0, 503 -> fail).
class H(http.server.BaseHTTPRequestHandler):
    code = 200

    def do_GET(self):
        self.send_response(H.code if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


srv = http.server.HTTPServer(("127.0.0.1", 0), H)
port = srv.server_address[1]
threading.Thread(target=srv.serve_forever, daemon=True).start()
hc = get(rp, "HEALTHCHECK")[0]
argv = json.loads(hc[hc.index("CMD") + 3:].strip())
argv = [a.replace("/8000", f"/{port}") for a in argv]
H.code = 200
check(subprocess.run(argv, timeout=20).returncode == 0, "HEALTHCHECK fails against 200")
H.code = 503
check(subprocess.run(argv, timeout=20).returncode != 0, "HEALTHCHECK passes against 503")
srv.shutdown()

# The library-collecting pipeline on the binary built here.
run = " ".join(get(bp, "RUN"))
m = re.search(r"(ldd /build/cli/kvserve .*?/out/lib/)", run)
check(m is not None, "no ldd pipeline in build-cpu")
if m:
    with tempfile.TemporaryDirectory() as d:
        pipe = m.group(1).replace("/build/cli/kvserve", shlex.quote(binary))
        pipe = pipe.replace("/out/lib/", d + "/")
        r = subprocess.run(["sh", "-c", pipe], timeout=60)
        got = sorted(os.listdir(d))
        check(r.returncode == 0 and any(g.startswith("libcrypto") for g in got),
              f"ldd pipeline copied {got}")
        check(not any(re.match(r"lib(c|m|pthread)\.so", g) or g.startswith("ld-linux")
                      for g in got), f"ldd pipeline copied libc parts: {got}")
        print("runtime libraries collected:", " ".join(got))

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print(f"Dockerfile: {len(stages)} stages ({', '.join(s['name'] for s in stages)}) OK")
