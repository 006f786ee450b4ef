#!/usr/bin/python3
"""llama_ref.py - an independent numpy reference for the Llama forward pass.

Shares no code with kvserve: it parses config.json + safetensors (F32, F16,
BF16, sharded via model.safetensors.index.json) and GGUF v3 (F32, F16,
BF16, Q8_0; llama.cpp's permuted q/k rows undone) by itself, and runs the
textbook forward (no KV cache, full causal mask, float64 arithmetic on the
stored weights) for a list of token ids.

    llama_ref.py logits MODEL IDS...         one line of JSON per position
    llama_ref.py greedy MODEL N IDS...       N greedy ids after the prompt

Used as a library by compare_logits.py and check_generate.py.
"""
import json
import os
import struct
import sys

import numpy as np


# ---------------------------------------------------------------- loading

def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def _read_safetensors(path, want=None):
    out = {}
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base = 8 + hlen
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            f.seek(base + start)
            raw = f.read(end - start)
            dt = info["dtype"]
            if dt == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            elif dt == "F16":
                arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            elif dt == "BF16":
                arr = _bf16_to_f32(raw)
            else:
                raise ValueError("unsupported dtype %s for %s" % (dt, name))
            out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


def _load_hf(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(path, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            tensors.update(_read_safetensors(os.path.join(path, fn)))
    else:
        tensors = _read_safetensors(os.path.join(path, "model.safetensors"))

    dim = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    hp = {
        "dim": dim,
        "n_layers": cfg["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": cfg.get("num_key_value_heads", n_heads),
        "head_dim": cfg.get("head_dim") or dim // n_heads,
        "eps": cfg.get("rms_norm_eps", 1e-6),
        "theta": cfg.get("rope_theta", 10000.0),
        "rope_scaling": cfg.get("rope_scaling"),
        "sliding_window": (cfg.get("sliding_window") or 0)
        if cfg.get("use_sliding_window", True) else 0,
    }
    t = tensors
    w = {
        "embed": t["model.embed_tokens.weight"],
        "norm": t["model.norm.weight"],
        "layers": [],
    }
    w["lm_head"] = t.get("lm_head.weight", w["embed"])
    for i in range(hp["n_layers"]):
        p = "model.layers.%d." % i
        w["layers"].append({
            "attn_norm": t[p + "input_layernorm.weight"],
            "wq": t[p + "self_attn.q_proj.weight"],
            "wk": t[p + "self_attn.k_proj.weight"],
            "wv": t[p + "self_attn.v_proj.weight"],
            "bq": t.get(p + "self_attn.q_proj.bias"),
            "bk": t.get(p + "self_attn.k_proj.bias"),
            "bv": t.get(p + "self_attn.v_proj.bias"),
            "wo": t[p + "self_attn.o_proj.weight"],
            "ffn_norm": t[p + "post_attention_layernorm.weight"],
            "wg": t[p + "mlp.gate_proj.weight"],
            "wu": t[p + "mlp.up_proj.weight"],
            "wd": t[p + "mlp.down_proj.weight"],
        })
    return hp, w


_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}


def _gguf_value(f, vt):
    if vt in _GGUF_SCALAR:
        fmt = _GGUF_SCALAR[vt]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if vt == 8:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", errors="replace")
    if vt == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        return [_gguf_value(f, et) for _ in range(n)]
    raise ValueError("bad gguf value type %d" % vt)


def _gguf_unpermute(w, n_head):
    out, inp = w.shape
    hd = out // n_head
    return w.reshape(n_head, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _load_gguf(path):
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version != 3:
            raise ValueError("not a GGUF v3 file")
        meta = {}
        for _ in range(n_kv):
            (kl,) = struct.unpack("<Q", f.read(8))
            key = f.read(kl).decode()
            (vt,) = struct.unpack("<I", f.read(4))
            meta[key] = _gguf_value(f, vt)
        infos = []
        for _ in range(n_tensors):
            (nl,) = struct.unpack("<Q", f.read(8))
            name = f.read(nl).decode()
            (nd,) = struct.unpack("<I", f.read(4))
            dims = struct.unpack("<%dQ" % nd, f.read(8 * nd))
            ttype, off = struct.unpack("<IQ", f.read(12))
            infos.append((name, dims, ttype, off))
        align = meta.get("general.alignment", 32)
        data = (f.tell() + align - 1) // align * align
        tensors = {}
        for name, dims, ttype, off in infos:
            n = int(np.prod(dims))
            f.seek(data + off)
            if ttype == 0:
                arr = np.frombuffer(f.read(4 * n), dtype="<f4")
            elif ttype == 1:
                arr = np.frombuffer(f.read(2 * n), dtype="<f2").astype(np.float32)
            elif ttype == 30:
                arr = _bf16_to_f32(f.read(2 * n))
            elif ttype == 8:
                blocks = np.frombuffer(f.read(34 * (n // 32)), dtype=np.uint8).reshape(-1, 34)
                d = blocks[:, :2].copy().view("<f2").astype(np.float32)
                q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
                arr = (q * d).reshape(-1)
            else:
                raise ValueError("unsupported ggml type %d for %s" % (ttype, name))
            # ggml lists dims fastest first: [in, out] is numpy (out, in).
            tensors[name] = arr.reshape(tuple(reversed(dims))).astype(np.float64)

    arch = meta["general.architecture"]
    g = lambda k, d=None: meta.get("%s.%s" % (arch, k), d)
    dim = g("embedding_length")
    n_heads = g("attention.head_count")
    n_kv = g("attention.head_count_kv", n_heads)
    hp = {
        "dim": dim,
        "n_layers": g("block_count"),
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "head_dim": g("attention.key_length", dim // n_heads),
        "eps": g("attention.layer_norm_rms_epsilon", 1e-6),
        "theta": g("rope.freq_base", 10000.0),
        "rope_scaling": None,
    }
    st = g("rope.scaling.type")
    if st == "linear":
        hp["rope_scaling"] = {"rope_type": "linear", "factor": g("rope.scaling.factor")}
    t = tensors
    w = {"embed": t["token_embd.weight"], "norm": t["output_norm.weight"], "layers": []}
    w["lm_head"] = t.get("output.weight", w["embed"])
    for i in range(hp["n_layers"]):
        p = "blk.%d." % i
        wq, wk = t[p + "attn_q.weight"], t[p + "attn_k.weight"]
        if arch == "llama":
            wq = _gguf_unpermute(wq, n_heads)
            wk = _gguf_unpermute(wk, n_kv)
        w["layers"].append({
            "attn_norm": t[p + "attn_norm.weight"],
            "wq": wq, "wk": wk, "wv": t[p + "attn_v.weight"],
            "bq": t.get(p + "attn_q.bias"), "bk": t.get(p + "attn_k.bias"),
            "bv": t.get(p + "attn_v.bias"),
            "wo": t[p + "attn_output.weight"],
            "ffn_norm": t[p + "ffn_norm.weight"],
            "wg": t[p + "ffn_gate.weight"],
            "wu": t[p + "ffn_up.weight"],
            "wd": t[p + "ffn_down.weight"],
        })
    return hp, w


def load(path):
    """Returns (hyperparameters, weights) of a HF directory or a .gguf file."""
    if path.endswith(".gguf"):
        return _load_gguf(path)
    return _load_hf(path)


# ---------------------------------------------------------------- forward

def inv_freq(hp):
    hd = hp["head_dim"]
    f = 1.0 / (hp["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = hp.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        f = f / rs["factor"]
    elif kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wl = 2 * np.pi / f
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * f / factor + smooth * f
        f = np.where(wl < old / hi, f, np.where(wl > old / lo, f / factor, mid))
    return f


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, freq):
    # x: (T, H, D); rotate_half pairs dimension i with i + D/2.
    ang = pos[:, None] * freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def forward(hp, w, ids):
    """Logits (len(ids), vocab) in float64 for ids at positions 0..n-1."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    H, KV, D = hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]
    pos = np.arange(T, dtype=np.float64)
    freq = inv_freq(hp)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    sw = hp.get("sliding_window") or 0
    if sw > 0:
        # Each position sees itself and the sw - 1 before it (HF Mistral).
        mask = mask + np.tril(np.full((T, T), -np.inf), -sw)
    x = w["embed"][ids]
    for L in w["layers"]:
        h = _rms(x, L["attn_norm"], hp["eps"])
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if L["bq"] is not None:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = _rope(q.reshape(T, H, D), pos, freq)
        k = _rope(k.reshape(T, KV, D), pos, freq)
        v = v.reshape(T, KV, D)
        rep = H // KV
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        sc = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + mask
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", sc, v).reshape(T, H * D)
        x = x + o @ L["wo"].T
        h = _rms(x, L["ffn_norm"], hp["eps"])
        g, u = h @ L["wg"].T, h @ L["wu"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ L["wd"].T
    return _rms(x, w["norm"], hp["eps"]) @ w["lm_head"].T


def greedy(hp, w, ids, n, eos=()):
    ids = list(ids)
    out = []
    for _ in range(n):
        lg = forward(hp, w, ids)[-1]
        nxt = int(np.argmax(lg))
        top2 = np.sort(lg)[-2:]
        out.append((nxt, float(top2[1] - top2[0])))
        ids.append(nxt)
        if nxt in eos:
            break
    return out


def main(argv):
    if len(argv) < 3 or argv[1] not in ("logits", "greedy"):
        sys.stderr.write(__doc__)
        return 2
    hp, w = load(argv[2])
    if argv[1] == "logits":
        for row in forward(hp, w, [int(a) for a in argv[3:]]):
            print(json.dumps([float(v) for v in row]))
    else:
        res = greedy(hp, w, [int(a) for a in argv[4:]], int(argv[3]))
        print(json.dumps([t for t, _ in res]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
