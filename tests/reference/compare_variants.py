#!/usr/bin/python3
"""compare_variants.py - the forward pass on model variants the default
model does not exercise, against the numpy reference.

    compare_variants.py LOGITS_DUMP MAKE_RANDOM_MODEL

Writes small random-weight models with tools/make_random_model.py into a
temporary directory and checks kvserve's logits on each, fed all at once
and chunked (compare_logits.py). F32, F16 and BF16 weights: every position
within 1e-4 relative. Block-quantized GGUF weights (Q8_0 here): the
log-prob rule of compare_types.py, because their kernels round the
activations to 8 bits, which costs more than 1e-4: |dlogprob| within
max(2e-2, twice what that rounding costs the reference itself) and
greedy ids equal where the reference's top-2 margin exceeds max(0.05,
twice the most that rounding changes a margin).

  qwen2-tied     Qwen2: q/k/v biases, tied embeddings
  mqa-headdim    one KV head, head_dim 32 with hidden 64 (q width != hidden)
  rope-linear    linear RoPE scaling, factor 4
  rope-llama3    Llama 3.1 RoPE scaling with all three wavelength bands
  mistral-sw5    sliding window of 5 tokens
  bf16-sharded   BF16 safetensors in 3 shards with an index
  gguf-f16       GGUF F16 (permuted q/k)
  gguf-q8_0      GGUF Q8_0 (the reference dequantizes the same blocks;
                 log-prob rule)

Exit 0 pass, 1 fail, 77 skip (numpy missing).
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_logits  # noqa: E402

VARIANTS = [
    ("qwen2-tied", ["--arch", "qwen2", "--tie"], "hf", None),
    ("mqa-headdim", ["--heads", "4", "--kv-heads", "1", "--head-dim", "32"], "hf", None),
    ("rope-linear", ["--rope-linear", "4"], "hf", None),
    ("rope-llama3", ["--rope-llama3", "8,1,4,64", "--head-dim", "32", "--heads", "2",
                     "--kv-heads", "1"], "hf", None),
    ("mistral-sw5", ["--arch", "mistral"], "hf", {"sliding_window": 5}),
    ("bf16-sharded", ["--dtype", "bf16", "--shards", "3"], "hf", None),
    ("gguf-f16", ["--gguf-type", "f16"], "gguf", None),
    ("gguf-q8_0", ["--gguf-type", "q8_0", "--dim", "128", "--ffn", "256"], "gguf", None),
]


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    dump, maker = argv[1], argv[2]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="kvserve-variants-") as tmp:
        for name, args, kind, cfg_patch in VARIANTS:
            out = os.path.join(tmp, name)
            where = ["--hf-dir", out] if kind == "hf" else ["--gguf", out + ".gguf"]
            r = subprocess.run([sys.executable, maker, "--seed", "7"] + where + args,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                print("FAIL %s: make_random_model: %s" % (name, r.stdout.decode()))
                failed += 1
                continue
            if cfg_patch:
                path = os.path.join(out, "config.json")
                with open(path) as f:
                    cfg = json.load(f)
                cfg.update(cfg_patch)
                with open(path, "w") as f:
                    json.dump(cfg, f)
            gtype = args[args.index("--gguf-type") + 1] if "--gguf-type" in args else "f32"
            failed += compare_logits.check_model(dump, out if kind == "hf" else out + ".gguf",
                                                 name, logprob=gtype not in ("f32", "f16", "bf16"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
