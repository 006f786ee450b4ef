#!/usr/bin/python3
"""check_kv_bounds.py - sliding-window KV memory stays bounded, end to end.

    check_kv_bounds.py KVSERVE MAKE_RANDOM_MODEL

A Mistral-style random model (tools/make_random_model.py, context 512)
with sliding_window 32 generates 300 tokens for 2 sequences through the
engine (`kvserve bench`, blocks of 16): the engine gives back every block
wholly out of the window, so the peak KV usage stays near 2 x (32 / 16 + 3)
blocks whatever the length, in f32 and in int8 / int4 KV. The same model
without a sliding window (control) holds all 20 blocks per sequence.
Exit 0 pass, 1 fail, 77 skip (numpy missing).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)


def peak_blocks(exe, model, dtype):
    r = subprocess.run([exe, "bench", "--model", model, "--num-prompts", "2", "--max-num-seqs",
                        "2", "--input-len", "16", "--output-len", "300", "--block-size", "16",
                        "--threads", "1", "--kv-cache-dtype", dtype],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    out = r.stdout.decode()
    m = re.search(r"peak KV usage\s+(\d+) of (\d+) blocks", out)
    if r.returncode != 0 or m is None:
        print("FAIL bench %s: exit %d\n%s" % (dtype, r.returncode, out))
        return None
    return int(m.group(1))


def main(argv):
    exe, maker = argv[1], argv[2]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for window in (32, None):
            out = os.path.join(tmp, "sw%s" % window)
            r = subprocess.run([sys.executable, maker, "--seed", "3", "--arch", "mistral",
                                "--ctx", "512", "--hf-dir", out],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                print("FAIL make_random_model: %s" % r.stdout.decode())
                return 1
            path = os.path.join(out, "config.json")
            with open(path) as f:
                cfg = json.load(f)
            cfg["sliding_window"] = window
            with open(path, "w") as f:
                json.dump(cfg, f)
            for dtype in ("f32", "int8", "int4") if window else ("f32",):
                peak = peak_blocks(exe, out, dtype)
                if peak is None:
                    failed += 1
                    continue
                bound = 2 * (32 // 16 + 3) if window else 2 * 20
                ok = peak <= bound if window else peak >= bound
                print("%s window %s %s: peak %d blocks (%s %d)" %
                      ("ok  " if ok else "FAIL", window, dtype, peak,
                       "<=" if window else ">=", bound))
                failed += 0 if ok else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
