#!/usr/bin/python3
"""compare_logits.py - kvserve's logits against the numpy reference.

    compare_logits.py LOGITS_DUMP MODEL [MODEL...]

For every model (a HF directory with F32 or BF16 safetensors, or a GGUF
file) and several prompts (token ids drawn at random, of lengths from 1 to
200), runs tests/model/logits_dump (fed all at once and in chunks of 7
through a scrambled block table) and checks every position's logits row
against llama_ref.forward(): max |kvserve - ref| <= 1e-4 * max |ref| per
row. Exit 0 pass, 1 fail, 77 skip (numpy missing).
"""
import os
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

TOL = 1e-4


def prompts(vocab):
    rng = np.random.RandomState(20261121)
    out = [[1]]
    for n in (12, 57, 200):
        out.append([1] + [int(t) for t in rng.randint(3, vocab, size=n - 1)])
    return out


def check_model(dump, model, label=None, logprob=False):
    """Compares every prompt at chunk sizes 0 and 7; returns the failures.
    logprob: judge by compare_types.LogprobRule (log-prob bound and greedy
    ids, for block-quantized weights) instead of 1e-4 relative."""
    hp, w = llama_ref.load(model)
    vocab = w["lm_head"].shape[0]
    label = label or os.path.basename(model.rstrip("/")) or model
    rule = None
    if logprob:
        import compare_types
        rule = compare_types.LogprobRule(hp, w, prompts(vocab))
    failed = 0
    for ids in prompts(vocab):
        ref = llama_ref.forward(hp, w, ids)
        for chunk in (0, 7):
            res = subprocess.run([dump, model, str(chunk)] + [str(i) for i in ids],
                                 stdout=subprocess.PIPE, check=False)
            if res.returncode != 0:
                print("FAIL %s: logits_dump exited %d" % (label, res.returncode))
                failed += 1
                continue
            got = np.frombuffer(res.stdout, dtype="<f4").astype(np.float64)
            if got.size != ref.size:
                print("FAIL %s: %d logits, expected %d" % (label, got.size, ref.size))
                failed += 1
                continue
            got = got.reshape(ref.shape)
            if rule is not None:
                lp = compare_types.log_softmax
                worst, checked, bad = rule.check(lp(got), lp(ref))
                ok = worst <= rule.bound and not bad
                print("%s %s: %d ids, chunk %d: max |dlogprob| %.2e (bound %.3g), greedy %d/%d "
                      "positions equal" % ("ok" if ok else "FAIL", label, len(ids), chunk, worst,
                                           rule.bound, checked - len(bad), checked))
                failed += not ok
                continue
            err = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
            worst = float(err.max())
            same = int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
            status = "ok" if worst <= TOL else "FAIL"
            print("%s %s: %d ids, chunk %d: max rel err %.2e, argmax agree %d/%d"
                  % (status, label, len(ids), chunk, worst, same, len(ids)))
            if worst > TOL:
                failed += 1
    return failed


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    failed = 0
    for model in argv[2:]:
        failed += check_model(argv[1], model)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
