#!/usr/bin/python3
"""check_bad_quant.py - quantized GGUF files that must not load.

    check_bad_quant.py KVSERVE MAKE_RANDOM_MODEL [CORPUS_DIR]

Writes a tiny random model in Q4_K (tools/make_random_model.py), then three
broken copies of it:
  rowblock   a Q4_K matrix whose row length (dims[0]) is 128, so its 256-wide
             blocks do not divide the row (the element count is kept);
  truncated  the file cut inside the last tensor's data;
  badtype    a matrix whose ggml type id is 99 (no such type);
and runs `kvserve generate --model FILE` on each: it must exit non-zero
without a signal, and stderr must hold exactly one line, naming the file,
that says what is wrong. The intact model must generate. With CORPUS_DIR,
the three files are also written there (tests/fuzz/regress/gguf holds them:
the GGUF fuzz target replays them in every test run; they exceed its
-max_len, so they are regression inputs rather than seeds).
Exit 0 pass, 1 fail.
"""
import os
import struct
import subprocess
import sys
import tempfile


def tensor_infos(buf):
    """(name, offset of its dims field, n_dims, type offset) for every tensor."""
    off = 4 + 4
    n_t, n_kv = struct.unpack_from("<QQ", buf, off)
    off += 16

    def skip_str(o):
        (n,) = struct.unpack_from("<Q", buf, o)
        return o + 8 + n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_val(o, t):
        if t == 8:
            return skip_str(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            for _ in range(n):
                o = skip_val(o, et)
            return o
        return o + sizes[t]

    for _ in range(n_kv):
        off = skip_str(off)
        (t,) = struct.unpack_from("<I", buf, off)
        off = skip_val(off + 4, t)
    out = []
    for _ in range(n_t):
        (n,) = struct.unpack_from("<Q", buf, off)
        name = buf[off + 8:off + 8 + n].decode()
        off += 8 + n
        (nd,) = struct.unpack_from("<I", buf, off)
        dims_off = off + 4
        type_off = dims_off + 8 * nd
        out.append((name, dims_off, nd, type_off))
        off = type_off + 4 + 8
    return out


def run(kvserve, path):
    return subprocess.run([kvserve, "generate", "--model", path, "--prompt", "a",
                           "--max-tokens", "2"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, check=False)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    kvserve, maker = argv[1], argv[2]
    corpus = argv[3] if len(argv) > 3 else None
    tmp = tempfile.mkdtemp(prefix="kvs-badq-")
    good = os.path.join(tmp, "tiny-q4_k.gguf")
    subprocess.run(["/usr/bin/python3", maker, "--layers", "1", "--dim", "256", "--heads", "2",
                    "--kv-heads", "1", "--ffn", "256", "--vocab", "300", "--tie",
                    "--gguf", good, "--gguf-type", "q4_k"], check=True,
                   stdout=subprocess.DEVNULL)
    buf = bytearray(open(good, "rb").read())
    infos = {name: (d, nd, t) for name, d, nd, t in tensor_infos(buf)}
    failed = 0

    res = run(kvserve, good)
    if res.returncode != 0:
        print("FAIL intact model: exit %d: %s" % (res.returncode, res.stderr.strip()))
        failed += 1

    cases = []
    d, nd, t = infos["blk.0.ffn_up.weight"]
    assert struct.unpack_from("<I", buf, t)[0] == 12, "expected a Q4_K ffn_up"
    rb = bytearray(buf)
    c0, c1 = struct.unpack_from("<QQ", rb, d)
    struct.pack_into("<QQ", rb, d, 128, c0 * c1 // 128)
    cases.append(("rowblock", rb, ["blk.0.ffn_up.weight"]))
    cases.append(("truncated", buf[:len(buf) - 1000], []))
    bt = bytearray(buf)
    d, nd, t = infos["blk.0.attn_q.weight"]
    struct.pack_into("<I", bt, t, 99)
    cases.append(("badtype", bt, []))

    for label, data, words in cases:
        path = os.path.join(tmp, label + ".gguf")
        open(path, "wb").write(data)
        if corpus:
            open(os.path.join(corpus, "quant_" + label), "wb").write(data)
        res = run(kvserve, path)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        ok = (res.returncode > 0 and len(lines) == 1 and path in lines[0]
              and all(w in lines[0] for w in words))
        print("%s %s: exit %d, stderr %r" % ("ok" if ok else "FAIL", label, res.returncode,
                                            lines))
        failed += 0 if ok else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
