#!/usr/bin/env python3
"""check_quantize_cli.py - `kvserve quantize` from the command line.

    check_quantize_cli.py KVSERVE LOGITS_DUMP MODEL_DIR [MAKE_RANDOM_MODEL]

  * --help exits 0;
  * bad input gives exactly one line on stderr, starting "kvserve
    quantize:", a non-zero exit, and no OUT file: an unknown --type, a
    missing IN, IN neither a model directory nor a GGUF file (a text file,
    a directory without config.json), OUT in a directory that does not
    exist or under a regular file, a truncated GGUF IN;
  * the Hugging Face directory written as f32 GGUF: the same metadata keys
    and values as the shipped model-f32.gguf (but general.name, from the
    directory name, and tokenizer.chat_template, which the directory has
    and the shipped file lacks), the same token ids (`kvserve tokenize`)
    and bit-identical logits (tests/model/logits_dump) as the directory.
  * with MAKE_RANDOM_MODEL (and numpy): random Hugging Face directories with
    a byte-level BPE tokenizer ("gpt2" with merges and tokenizer.ggml.pre),
    (a) qwen2 (q/k/v biases, not permuted), tied embeddings, BF16 weights,
    written as bf16, (b) llama with llama3 RoPE scaling (rope_freqs.weight)
    and head_dim != dim / heads, written as f32: the same token ids and
    bit-identical logits as the directory.

Needs only the standard library (numpy for MAKE_RANDOM_MODEL). Exit 0
pass, 1 fail.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL", what)


def gguf_kv(path):
    """{key: (type, value)} of a GGUF file's metadata."""
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
    with open(path, "rb") as f:
        d = f.read()
    o = [8]

    def rd(c):
        v = struct.unpack_from("<" + c, d, o[0])[0]
        o[0] += struct.calcsize("<" + c)
        return v

    def rs():
        n = rd("Q")
        s = d[o[0]:o[0] + n]
        o[0] += n
        return s

    def rv(t):
        if t == 8:
            return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return (et, tuple(rv(et) for _ in range(n)))
        return rd(fmt[t])

    rd("Q")
    n_kv = rd("Q")
    out = {}
    for _ in range(n_kv):
        k = rs().decode()
        t = rd("I")
        out[k] = (t, rv(t))
    return out


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def check_random(kvserve, dump, make, tmp):
    try:
        import numpy  # noqa: F401  (make_random_model needs it)
    except ImportError:
        print("skip random models: numpy is not installed")
        return
    shape = ["--tokenizer", "bpe", "--dim", "256", "--heads", "4", "--kv-heads", "2",
             "--ffn", "512", "--layers", "2"]
    cases = [("qwen2-tied-bf16", ["--arch", "qwen2", "--tie", "--dtype", "bf16"], "bf16"),
             ("llama3-rope", ["--arch", "llama", "--rope-llama3", "8,1,4,8192",
                              "--head-dim", "32"], "f32")]
    for name, extra, qt in cases:
        d = os.path.join(tmp, name)
        out = d + ".gguf"
        r = run([sys.executable, make, "--hf-dir", d] + shape + extra)
        check(r.returncode == 0, "%s: make_random_model: %s" % (name, r.stderr.decode()[-300:]))
        r = run([kvserve, "quantize", d, out, "--type", qt])
        check(r.returncode == 0, "%s: quantize: %s" % (name, r.stderr.decode()[-300:]))
        if r.returncode != 0:
            continue
        for t in ["Hello world, it's 2024!", "  tabs\tand \u00fcn\u00efc\u00f6d\u00e9 "
                  "<|im_start|>user\nhi<|im_end|>"]:
            ids = [run([kvserve, "tokenize", "--model", m, "--text", t]).stdout for m in (d, out)]
            check(ids[0] == ids[1] and ids[0].startswith(b"["),
                  "%s tokenize %r: %r vs %r" % (name, t, ids[0], ids[1]))
        prompt = [str(i) for i in (3, 500, 17, 923, 260, 5, 1000, 42)]
        la = run([dump, d, "0"] + prompt)
        lb = run([dump, out, "0"] + prompt)
        check(la.returncode == 0 and len(la.stdout) > 0 and la.stdout == lb.stdout,
              "%s: logits of the HF dir and its %s GGUF differ" % (name, qt))
        print("%s -> %s GGUF: tokenize and %d bytes of logits compared" %
              (name, qt, len(la.stdout)))


def main(argv):
    kvserve, dump, model = argv[1:4]
    shipped = os.path.join(model, "model-f32.gguf")
    r = run([kvserve, "quantize", "--help"])
    check(r.returncode == 0 and b"q4_k_m" in r.stdout, "quantize --help")

    with tempfile.TemporaryDirectory(prefix="kvserve-qcli-") as tmp:
        text = os.path.join(tmp, "notes.txt")
        with open(text, "w") as f:
            f.write("not a model\n")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        trunc = os.path.join(tmp, "trunc.gguf")
        with open(shipped, "rb") as f:
            data = f.read()
        with open(trunc, "wb") as f:
            f.write(data[:len(data) // 2])
        out = os.path.join(tmp, "out.gguf")
        bad = [
            ("unknown --type", [model, out, "--type", "q3_k"]),
            ("missing IN", [os.path.join(tmp, "nope"), out, "--type", "q8_0"]),
            ("IN a text file", [text, out, "--type", "q8_0"]),
            ("IN a directory without a model", [empty, out, "--type", "q8_0"]),
            ("OUT in a missing directory", [shipped, os.path.join(tmp, "no/dir/o.gguf"),
                                            "--type", "q8_0"]),
            ("OUT under a regular file", [shipped, os.path.join(text, "o.gguf"), "--type",
                                          "q8_0"]),
            ("truncated GGUF IN", [trunc, out, "--type", "q8_0"]),
            ("OUT the same file as IN", [trunc, trunc, "--type", "q8_0"]),
            ("no --type", [model, out]),
        ]
        for what, args in bad:
            r = run([kvserve, "quantize"] + args)
            lines = r.stderr.decode(errors="replace").splitlines()
            ok = (r.returncode != 0 and len(lines) == 1 and
                  lines[0].startswith("kvserve quantize:") and not os.path.exists(out))
            check(ok, "%s: exit %d, stderr %r" % (what, r.returncode, lines))
            print("ok  " if ok else "bad ", what, "->", lines[0] if lines else "")
        check(os.path.getsize(trunc) == len(data) // 2, "the truncated IN is left alone")

        # The HF directory as f32 GGUF against the directory itself.
        hf = os.path.join(tmp, "hf-f32.gguf")
        r = run([kvserve, "quantize", model, hf, "--type", "f32"])
        check(r.returncode == 0, "quantize HF dir to f32: %s" % r.stderr.decode()[-300:])
        a, b = gguf_kv(shipped), gguf_kv(hf)
        check(set(b) - set(a) == {"tokenizer.chat_template"} and set(a) <= set(b),
              "metadata keys: %s" % sorted(set(a) ^ set(b)))
        for k in sorted(set(a) & set(b)):
            if k != "general.name":
                check(a[k] == b[k], "metadata %s differs" % k)
        texts = ["It is a truth universally acknowledged, that a single man",
                 "  two  spaces\tand a tab\nnew line",
                 "caf\u00e9 \u2014 na\u00efve \U0001F600 <s> </s> <unk> 12345",
                 ""]
        for t in texts:
            ids = [run([kvserve, "tokenize", "--model", m, "--text", t]).stdout
                   for m in (model, hf)]
            check(ids[0] == ids[1] and ids[0].startswith(b"["),
                  "tokenize %r: %r vs %r" % (t, ids[0], ids[1]))
        prompt = [str(i) for i in (1, 450, 17, 923, 3, 88, 1000, 260, 5, 2, 700)]
        la = run([dump, model, "0"] + prompt)
        lb = run([dump, hf, "0"] + prompt)
        check(la.returncode == 0 and lb.returncode == 0 and len(la.stdout) > 0 and
              la.stdout == lb.stdout, "logits of the HF dir and its f32 GGUF differ")
        print("HF dir -> f32 GGUF: %d keys, tokenize and %d bytes of logits compared" %
              (len(b), len(la.stdout)))

        if len(argv) > 4:
            check_random(kvserve, dump, argv[4], tmp)

    print("PASS" if not FAILS else "FAIL: %d checks" % len(FAILS))
    return 0 if not FAILS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
