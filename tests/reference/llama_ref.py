#!/usr/bin/python3
"""llama_ref.py - an independent numpy reference for the Llama forward pass.

Shares no code with kvserve: it parses config.json + safetensors (F32, F16,
BF16, sharded via model.safetensors.index.json) and GGUF v3 (F32, F16,
BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; llama.cpp's permuted
q/k rows undone) by itself, and runs the textbook forward (no KV cache,
full causal mask, float64 arithmetic on the stored weights) for a list of
token ids.

The GGUF block types are dequantized by vectorized numpy code written from
ggml's block layouts (ggml-common.h) and its dequantize_row_* rules: every
value is d * q (or d * q + m, d * sc * q - dmin * m) in float32 in ggml's
order of operations, so the weights equal ggml's dequantization bit for bit
(tests/reference/test_llama_ref_quant.py checks them on hand-built
blocks). forward(..., act_round=True) also rounds the input rows of every
product the way a kernel for that weight's type may: 8 bits per block (32
values, 256 for the K-quants) for the block types, f16 / bf16 for F16 /
BF16 weights; compare_types.py measures with it what that rounding alone
costs, and allows kvserve's kernels that much.

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


# ---------------------------------------------------------------- GGUF blocks
#
# Every block type below is decoded from its ggml layout (ggml-common.h),
# all blocks of a tensor at once. Scales are little-endian f16 (F16 below)
# or int8; quants are packed nibbles, with the fifth bit of Q5 in qh and
# the two top bits of Q6_K in qh. Arithmetic is float32 in ggml's order
# (the scale products first), so the values equal dequantize_row_*'s.

def _f16(col):
    """(nb, 2) uint8 -> (nb, 1) float32 from little-endian half floats."""
    return np.ascontiguousarray(col).view("<f2").astype(np.float32)


def _nibbles(qs):
    """16 bytes -> 32 values: byte j holds value j (low) and j + 16 (high)."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _bit_planes(qh, n):
    """A little-endian bit field of n bits per block, (nb, n/8) -> (nb, n)
    of 0/1, bit i of the field first."""
    return np.unpackbits(qh, axis=1, bitorder="little")[:, :n]


def _deq_q4_0(b):       # {d f16, qs[16]}: d * (q - 8)
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int32) - 8
    return q.astype(np.float32) * d


def _deq_q4_1(b):       # {d f16, m f16, qs[16]}: d * q + m
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:20]).astype(np.float32) * d + m


def _deq_q5_0(b):       # {d f16, qh u32, qs[16]}: d * ((q | bit << 4) - 16)
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 6:22]).astype(np.int32) | (_bit_planes(b[:, 2:6], 32) << 4)
    return (q - 16).astype(np.float32) * d


def _deq_q5_1(b):       # {d f16, m f16, qh u32, qs[16]}: d * (q | bit << 4) + m
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]).astype(np.int32) | (_bit_planes(b[:, 4:8], 32) << 4)
    return q.astype(np.float32) * d + m


def _deq_q8_0(b):       # {d f16, qs int8[32]}: d * q
    d = _f16(b[:, 0:2])
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32) * d


def _k_scales(s):
    """The 12 bytes of Q4_K/Q5_K scales -> (sc, m), (nb, 8) each: 6-bit
    values, sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7
    (mins); sub-blocks 4-7 with their low 4 bits in the nibbles of bytes
    8-11 and their top 2 bits in the top 2 bits of bytes 0-3 / 4-7."""
    s = s.astype(np.int32)
    lo_sc, lo_m, tail = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (tail & 15) | ((lo_sc >> 6) << 4)], axis=1)
    m = np.concatenate([lo_m & 63, (tail >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, m


def _k_quants(qs):
    """128 bytes of Q4_K/Q5_K nibbles -> (nb, 8, 32): sub-block 2c holds the
    low nibbles of bytes 32c..32c+31, sub-block 2c + 1 their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 8, 32).astype(np.int32)


def _k_affine(d, dmin, sc, m, q):
    """d * sc * q - dmin * m per sub-block of 32, float32 as ggml does it."""
    d1 = (d * sc.astype(np.float32))[:, :, None]
    m1 = (dmin * m.astype(np.float32))[:, :, None]
    return (d1 * q.astype(np.float32) - m1).reshape(-1, 256)


def _deq_q4_k(b):       # {d f16, dmin f16, scales[12], qs[128]}
    sc, m = _k_scales(b[:, 4:16])
    return _k_affine(_f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, m, _k_quants(b[:, 16:144]))


def _deq_q5_k(b):       # {d f16, dmin f16, scales[12], qh[32], qs[128]}
    sc, m = _k_scales(b[:, 4:16])
    # value l of sub-block s takes its fifth bit from bit s of qh[l]
    hi = np.unpackbits(b[:, 16:48, None], axis=2, bitorder="little").astype(np.int32)
    q = _k_quants(b[:, 48:176]) | (hi.transpose(0, 2, 1) << 4)
    return _k_affine(_f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, m, q)


def _deq_q6_k(b):       # {ql[128], qh[64], scales int8[16], d f16}
    # Per 128-value half h: ql[64h + l] holds values l (low nibble) and
    # l + 64 (high) of the half, ql[64h + 32 + l] values l + 32 and l + 96;
    # qh[32h + l] holds their top two bits at shifts 0, 2, 4, 6 for values
    # l, l + 32, l + 64, l + 96. Value v of the block uses scales[v / 16].
    ql = b[:, 0:128].reshape(-1, 2, 2, 32).astype(np.int32)        # half, 32-group, l
    qh = b[:, 128:192].reshape(-1, 2, 1, 32).astype(np.int32)      # half, -, l
    lo = np.concatenate([ql & 15, ql >> 4], axis=2)                # half, k = 0..3, l
    hi = (qh >> (2 * np.arange(4, dtype=np.int32))[None, None, :, None]) & 3
    q = ((lo | (hi << 4)) - 32).reshape(-1, 16, 16)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    return ((d * sc)[:, :, None] * q.astype(np.float32)).reshape(-1, 256)


def _deq_f32(raw):
    return np.frombuffer(raw, dtype="<f4")


def _deq_f16(raw):
    return np.frombuffer(raw, dtype="<f2").astype(np.float32)


# ggml type id: (name, values per block, bytes per block, decoder). The
# float types take the raw bytes, the block types an (nb, bytes) array.
GGML_TYPES = {
    0: ("f32", 1, 4, _deq_f32), 1: ("f16", 1, 2, _deq_f16), 30: ("bf16", 1, 2, _bf16_to_f32),
    2: ("q4_0", 32, 18, _deq_q4_0), 3: ("q4_1", 32, 20, _deq_q4_1),
    6: ("q5_0", 32, 22, _deq_q5_0), 7: ("q5_1", 32, 24, _deq_q5_1),
    8: ("q8_0", 32, 34, _deq_q8_0),
    12: ("q4_k", 256, 144, _deq_q4_k), 13: ("q5_k", 256, 176, _deq_q5_k),
    14: ("q6_k", 256, 210, _deq_q6_k),
}
FLOAT_TYPES = ("f32", "f16", "bf16")


def dequantize(ttype, raw, n):
    """n values of ggml type id ttype stored in raw (bytes) -> float32[n]."""
    _, bn, bb, fn = GGML_TYPES[ttype]
    if len(raw) != n // bn * bb:
        raise ValueError("truncated tensor: %d bytes for %d values" % (len(raw), n))
    if bn == 1:
        return fn(raw)
    return fn(np.frombuffer(raw, dtype=np.uint8).reshape(-1, bb)).reshape(-1)


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
        tensors, types = {}, {}
        for name, dims, ttype, off in infos:
            n = int(np.prod(dims))
            f.seek(data + off)
            if ttype not in GGML_TYPES:
                raise ValueError("unsupported ggml type %d for %s" % (ttype, name))
            tname, bn, bb, _ = GGML_TYPES[ttype]
            if dims[0] % bn:
                raise ValueError("%s: row of %d is not a whole number of %s blocks"
                                 % (name, dims[0], tname))
            arr = dequantize(ttype, f.read(n // bn * bb), n)
            # ggml lists dims fastest first: [in, out] is numpy (out, in).
            tensors[name] = arr.reshape(tuple(reversed(dims))).astype(np.float64)
            types[name] = tname

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
    w["types"] = {"lm_head": types.get("output.weight", types["token_embd.weight"])}
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
            "types": {k: types[p + n + ".weight"] for k, n in (
                ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
                ("wg", "ffn_gate"), ("wu", "ffn_up"), ("wd", "ffn_down"))},
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


def _act_q8(x, block):
    """x with each run of `block` values of a row rounded to 8 bits the way
    ggml's Q8_0 / Q8_K activation blocks are: d = max |x| / 127,
    q = round(x / d), x' = d q."""
    xb = x.reshape(x.shape[0], -1, block)
    d = np.abs(xb).max(axis=2, keepdims=True) / 127.0
    q = np.round(xb / np.where(d > 0, d, 1.0))
    return (q * d).reshape(x.shape)


def _act_bf16(x):
    """x rounded to bfloat16 (nearest, ties to even)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def round_activations(x, qt):
    """x as a kernel for weight type qt may see it: block types take 8-bit
    blocks (32 values; 256 for the K-quants, as ggml's Q8_K), F16 and BF16
    16-bit floats (ggml converts the activations to the weight's type),
    F32 nothing."""
    if qt == "f32":
        return x
    if qt == "f16":
        return x.astype(np.float16).astype(np.float64)
    if qt == "bf16":
        return _act_bf16(x)
    return _act_q8(x, 256 if qt.endswith("_k") else 32)


def weight_types(w):
    """The file types of every matrix of w ("f32" throughout for HF)."""
    out = [w.get("types", {}).get("lm_head", "f32")]
    for L in w["layers"]:
        out += [L.get("types", {}).get(k, "f32") for k in ("wq", "wk", "wv", "wo", "wg", "wu",
                                                            "wd")]
    return out


def _matmul(x, L, key, act_round):
    """x @ L[key].T; with act_round, the rows of x are first rounded the way
    a kernel for that weight's type may round its activations."""
    if act_round:
        x = round_activations(x, L.get("types", {}).get(key, "f32"))
    return x @ L[key].T


def forward(hp, w, ids, act_round=False):
    """Logits (len(ids), vocab) in float64 for ids at positions 0..n-1.
    act_round: round the input of every product with a weight first, as
    round_activations() does for that weight's file type (an emulation of
    int8 / 16-bit kernels, not the reference)."""
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
        q, k, v = (_matmul(h, L, n, act_round) for n in ("wq", "wk", "wv"))
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
        x = x + _matmul(o, L, "wo", act_round)
        h = _rms(x, L["ffn_norm"], hp["eps"])
        g, u = _matmul(h, L, "wg", act_round), _matmul(h, L, "wu", act_round)
        x = x + _matmul(g / (1.0 + np.exp(-g)) * u, L, "wd", act_round)
    return _matmul(_rms(x, w["norm"], hp["eps"]), w, "lm_head", act_round)


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
