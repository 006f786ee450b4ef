#!/usr/bin/python3
"""test_llama_ref_quant.py - llama_ref's GGUF block dequantizers against
hand-built blocks.

    test_llama_ref_quant.py

Two kinds of checks, for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K:

  * blocks assembled byte by byte with literal expected values worked out
    by hand from ggml's layouts: the packed 6-bit scales and mins of
    Q4_K/Q5_K (sub-blocks 4-7 split over three bytes), negative f16 scales,
    negative int8 Q6_K scales, the fifth bit of Q5_0/Q5_1/Q5_K and the two
    top bits of Q6_K in every position group, the extreme quants;
  * random blocks (finite f16 scales of either sign) decoded by
    llama_ref.dequantize() and by a slow decoder below that finds each
    value's bits one element at a time; the two must agree bit for bit.

Exit 0 pass, 1 fail, 77 skip (numpy missing).
"""
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

IDS = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
       "q6_k": 14}
F32 = np.float32
failures = []


def h(x):
    """Little-endian f16 bytes of x (exact for the values used here)."""
    return struct.pack("<e", x)


def deq(name, raw):
    _, bn, bb, _ = llama_ref.GGML_TYPES[IDS[name]]
    return llama_ref.dequantize(IDS[name], raw, len(raw) // bb * bn)


def expect(what, got, want):
    got, want = np.asarray(got, dtype=F32), np.asarray(want, dtype=F32)
    if got.shape != want.shape or not np.array_equal(got, want):
        failures.append(what)
        print("FAIL %s:\n  got  %s\n  want %s" % (what, got, want))
    else:
        print("ok   %s" % what)


# ---------------------------------------------------------------- hand-built

def hand_q8_0():
    qs = [-128, -127, -1, 0, 1, 127] + [5] * 26
    raw = h(-0.5) + struct.pack("<32b", *qs)
    expect("q8_0 negative d, int8 extremes", deq("q8_0", raw)[:7],
           [64.0, 63.5, 0.5, -0.0, -0.5, -63.5, -2.5])


def hand_q4_0():
    # byte j: value j in the low nibble, value j + 16 in the high one
    qs = bytes([0x0F | 0x00, 0x08 | 0x70]) + bytes([0x88] * 14)
    y = deq("q4_0", h(0.25) + qs)
    expect("q4_0 nibble order", [y[0], y[16], y[1], y[17], y[2]],
           [(15 - 8) * 0.25, (0 - 8) * 0.25, 0.0, (7 - 8) * 0.25, 0.0])
    y = deq("q4_0", h(-2.0) + qs)
    expect("q4_0 negative d", [y[0], y[16]], [-14.0, 16.0])


def hand_q4_1():
    qs = bytes([0xF0]) + bytes([0x31] * 15)
    y = deq("q4_1", h(0.5) + h(-1.0) + qs)
    expect("q4_1 d q + m", [y[0], y[16], y[1], y[17]], [-1.0, 6.5, -0.5, 0.5])


def hand_q5():
    # qh bit i is the fifth bit of value i: set bits 0, 15, 16, 31
    qh = struct.pack("<I", (1 << 0) | (1 << 15) | (1 << 16) | (1 << 31))
    qs = bytes([0x21] + [0x00] * 14 + [0xFF])     # values 0/16 = 1/2, 15/31 = 15/15
    y = deq("q5_0", h(0.5) + qh + qs)
    # q5_0: d (q - 16), q = nibble | bit << 4
    expect("q5_0 high bits 0, 15, 16, 31",
           [y[0], y[15], y[16], y[31], y[1], y[17]],
           [(17 - 16) * 0.5, (31 - 16) * 0.5, (18 - 16) * 0.5, (31 - 16) * 0.5,
            -16 * 0.5, -16 * 0.5])
    y = deq("q5_0", h(-0.5) + qh + qs)
    expect("q5_0 negative d", [y[0], y[1]], [-0.5, 8.0])
    y = deq("q5_1", h(0.25) + h(-4.0) + qh + qs)
    expect("q5_1 high bits, d q + m",
           [y[0], y[15], y[16], y[31], y[1]],
           [17 * 0.25 - 4, 31 * 0.25 - 4, 18 * 0.25 - 4, 31 * 0.25 - 4, -4.0])


# The 8 six-bit scales and mins used by the Q4_K/Q5_K blocks, packed by hand:
#   bytes 0-3  : sc[j] & 63 | (sc[j+4] >> 4) << 6
#   bytes 4-7  : m[j] & 63  | (m[j+4] >> 4) << 6
#   bytes 8-11 : sc[j+4] & 15 | (m[j+4] & 15) << 4
K_SC = [1, 2, 3, 4, 53, 17, 63, 0]
K_M = [5, 6, 7, 8, 46, 33, 0, 63]
K_SCALES = bytes([0xC1, 0x42, 0xC3, 0x04, 0x85, 0x86, 0x07, 0xC8, 0xE5, 0x11, 0x0F, 0xF0])


def hand_k_scales():
    sc, m = llama_ref._k_scales(np.frombuffer(K_SCALES, dtype=np.uint8).reshape(1, 12))
    expect("k-quant packed 6-bit scales", sc[0], K_SC)
    expect("k-quant packed 6-bit mins", m[0], K_M)


def k_qs():
    """qs[128]: byte 32c + l = nibble (l % 16) low, 15 - (l % 16) high."""
    return bytes([(l % 16) | ((15 - l % 16) << 4) for _ in range(4) for l in range(32)])


def hand_q4_k():
    for d, dmin in ((0.5, 0.25), (-0.5, 0.25), (0.125, -2.0)):
        y = deq("q4_k", h(d) + h(dmin) + K_SCALES + k_qs())
        # value 32 s + l: sub-block s, chunk s // 2, low nibble for even s
        want = []
        for s, l in ((0, 3), (1, 3), (4, 9), (5, 9), (6, 15), (7, 0)):
            q = l % 16 if s % 2 == 0 else 15 - l % 16
            want.append(F32(F32(d) * F32(K_SC[s])) * F32(q) - F32(F32(dmin) * F32(K_M[s])))
        got = [y[32 * s + l] for s, l in ((0, 3), (1, 3), (4, 9), (5, 9), (6, 15), (7, 0))]
        expect("q4_k d %g dmin %g: sub-blocks 0 1 4 5 6 7" % (d, dmin), got, want)
    # literals: sub-block 5 (sc 17, m 33), l = 9, high nibble 6: 0.5*17*6 - 0.25*33;
    # sub-block 4 (sc 53, m 46), low nibble 9: 0.5*53*9 - 0.25*46;
    # sub-block 6 (sc 63, m 0), low nibble 15: 0.5*63*15
    y = deq("q4_k", h(0.5) + h(0.25) + K_SCALES + k_qs())
    expect("q4_k literal values", [y[32 * 5 + 9], y[32 * 4 + 9], y[32 * 6 + 15]],
           [42.75, 227.0, 472.5])


def hand_q5_k():
    # qh[l] bit s is the fifth bit of value l of sub-block s: give value l
    # of sub-block s the bit when (l + s) % 3 == 0
    qh = bytes([sum(1 << s for s in range(8) if (l + s) % 3 == 0) for l in range(32)])
    d, dmin = -0.5, 0.25
    y = deq("q5_k", h(d) + h(dmin) + K_SCALES + qh + k_qs())
    got, want = [], []
    for s in range(8):
        for l in (0, 1, 2, 31):
            q = (l % 16 if s % 2 == 0 else 15 - l % 16) | (16 if (l + s) % 3 == 0 else 0)
            got.append(y[32 * s + l])
            want.append(F32(F32(d) * F32(K_SC[s])) * F32(q) - F32(F32(dmin) * F32(K_M[s])))
    expect("q5_k fifth bits in every sub-block, negative d", got, want)
    # literal: sub-block 4 (sc 53, m 46), l = 2: bit set ((2 + 4) % 3 == 0), q = 18
    expect("q5_k literal", [y[32 * 4 + 2]], [-0.5 * 53 * 18 - 0.25 * 46])


def hand_q6_k():
    # per half h, l: ql[64h + l] = low nibbles of values l / l + 64,
    # ql[64h + 32 + l] of values l + 32 / l + 96; qh[32h + l] top 2 bits
    # at shifts 0, 2, 4, 6 for values l, l + 32, l + 64, l + 96.
    want_q = np.zeros(256, dtype=np.int32)
    ql = bytearray(128)
    qh = bytearray(64)
    for half in range(2):
        for l in range(32):
            qs = [(l + 7 * k + 13 * half) % 64 for k in range(4)]   # 6-bit quants
            if l == 0:
                qs = [0, 63, 32, 31] if half == 0 else [63, 0, 31, 32]
            for k in range(4):
                want_q[128 * half + 32 * k + l] = qs[k] - 32
            ql[64 * half + l] = (qs[0] & 15) | ((qs[2] & 15) << 4)
            ql[64 * half + 32 + l] = (qs[1] & 15) | ((qs[3] & 15) << 4)
            qh[32 * half + l] = (qs[0] >> 4) | ((qs[1] >> 4) << 2) | ((qs[2] >> 4) << 4) | \
                ((qs[3] >> 4) << 6)
    sc = [1, -1, 127, -128, 2, -3, 5, -7, 11, -13, 17, -19, 23, -29, 31, -37]
    d = -0.125
    y = deq("q6_k", bytes(ql) + bytes(qh) + struct.pack("<16b", *sc) + h(d))
    want = [F32(F32(d) * F32(sc[v // 16])) * F32(want_q[v]) for v in range(256)]
    expect("q6_k all 256 values: top bits, negative scales and d", y, want)
    # literal: value 32 (k = 1, l = 0, q = 63 - 32 = 31) in sub-block 2 (scale 127)
    # and value 128 + 96 (half 1, k = 3, l = 0, q = 0) in sub-block 14 (scale 31)
    expect("q6_k literal", [y[32], y[224], y[0]], [-0.125 * 127 * 31, -0.125 * 31 * 0,
                                                   -0.125 * 1 * -32])


# ---------------------------------------------------------------- random blocks

def slow_value(name, blk, e):
    """Value e of one block, its bits looked up one at a time."""
    def f16(o):
        return F32(struct.unpack_from("<e", blk, o)[0])

    def nib(byte, high):
        return (blk[byte] >> 4) if high else (blk[byte] & 15)

    if name == "q8_0":
        return f16(0) * F32(struct.unpack_from("<b", blk, 2 + e)[0])
    if name in ("q4_0", "q4_1", "q5_0", "q5_1"):
        qs_at = {"q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[name]
        q = nib(qs_at + e % 16, e >= 16)
        if name in ("q5_0", "q5_1"):
            qh = struct.unpack_from("<I", blk, 2 if name == "q5_0" else 4)[0]
            q |= ((qh >> e) & 1) << 4
        if name == "q4_0":
            return F32(q - 8) * f16(0)
        if name == "q5_0":
            return F32(q - 16) * f16(0)
        return F32(q) * f16(0) + f16(2)
    if name in ("q4_k", "q5_k"):
        s, l = e // 32, e % 32
        sb = blk[4:16]
        if s < 4:
            sc, m = sb[s] & 63, sb[s + 4] & 63
        else:
            sc = (sb[s + 4] & 15) | ((sb[s - 4] >> 6) << 4)
            m = (sb[s + 4] >> 4) | ((sb[s] >> 6) << 4)
        qs_at = 16 if name == "q4_k" else 48
        q = nib(qs_at + 32 * (s // 2) + l, s % 2 == 1)
        if name == "q5_k":
            q |= ((blk[16 + l] >> s) & 1) << 4
        return F32(f16(0) * F32(sc)) * F32(q) - F32(f16(2) * F32(m))
    if name == "q6_k":
        half, r = e // 128, e % 128
        k, l = r // 32, r % 32
        q = nib(64 * half + 32 * (k % 2) + l, k >= 2)
        q |= ((blk[128 + 32 * half + l] >> (2 * k)) & 3) << 4
        sc = struct.unpack_from("<b", blk, 192 + e // 16)[0]
        return F32(f16(208) * F32(sc)) * F32(q - 32)
    raise ValueError(name)


F16_AT = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
          "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def random_blocks():
    rng = np.random.default_rng(20261125)
    for name in IDS:
        _, bn, bb, _ = llama_ref.GGML_TYPES[IDS[name]]
        nb = 6
        raw = bytearray(rng.integers(0, 256, size=nb * bb, dtype=np.uint8).tobytes())
        for b in range(nb):
            for o in F16_AT[name]:
                v = float(rng.uniform(0.01, 4.0)) * (-1 if rng.random() < 0.5 else 1)
                raw[b * bb + o:b * bb + o + 2] = h(v)
        got = deq(name, bytes(raw))
        want = [slow_value(name, bytes(raw[b * bb:(b + 1) * bb]), e)
                for b in range(nb) for e in range(bn)]
        expect("%s: %d random blocks, value by value" % (name, nb), got, want)


def main():
    for fn in (hand_q8_0, hand_q4_0, hand_q4_1, hand_q5, hand_k_scales, hand_q4_k, hand_q5_k,
               hand_q6_k, random_blocks):
        fn()
    # a short or padded tensor is an error, not a silent misread
    try:
        llama_ref.dequantize(IDS["q4_k"], bytes(143), 256)
        failures.append("truncated tensor accepted")
        print("FAIL truncated q4_k block accepted")
    except ValueError:
        print("ok   truncated q4_k block rejected")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
