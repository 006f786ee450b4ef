#!/usr/bin/env python3
"""tq_codebook.py - the Lloyd-Max codebooks of the tq3 / tq4 KV cache dtypes.

After a random orthogonal rotation, each coordinate of a unit vector in
dimension d has the density of one coordinate of a uniformly random point
on the sphere S^(d-1):

    f_d(x) ~ (1 - x^2)^((d - 3) / 2)   on [-1, 1]

kvserve stores sqrt(d) * x, whose density tends to N(0, 1) as d grows. For
each head_dim d in 16 .. 256 (powers of two, the shapes the randomized
Hadamard transform takes) and each width b in 1 .. 4 bits this script runs
Lloyd's algorithm on the density of sqrt(d) * x (numerical integration on
a fine grid) to the optimal scalar quantizer: 2^b reconstruction levels,
each the centroid of its cell, cell edges halfway between levels. It also
prints the mean squared error per coordinate (the distortion D(b) of the
unit-variance density), which the tests check encode/decode against.

Output: the C header kernels/kn_tq_table.h (committed; rerun and diff to
check it). Pure Python 3 (no numpy), a few seconds.

Usage: python3 tools/tq_codebook.py > kernels/kn_tq_table.h
"""
import math

DIMS = [16, 32, 64, 128, 256]
BITS = [1, 2, 3, 4]
GRID = 200001  # points of the integration grid


def density(d):
    """Grid xs, weights ws (density times step, summing to 1) of sqrt(d) * x."""
    r = math.sqrt(d)
    xs, ws = [], []
    step = 2.0 * r / (GRID - 1)
    for i in range(GRID):
        y = -r + i * step
        u = y / r
        w = (1.0 - u * u) ** ((d - 3) / 2.0) if abs(u) < 1.0 else 0.0
        xs.append(y)
        ws.append(w)
    tot = sum(ws)
    return xs, [w / tot for w in ws]


def lloyd_max(xs, ws, b, iters=1000):
    n = 1 << b
    # Start from Gaussian-ish quantiles.
    levels = [(-1.0 + (2.0 * i + 1.0) / n) * 2.0 for i in range(n)]
    for _ in range(iters):
        edges = [(levels[i] + levels[i + 1]) / 2.0 for i in range(n - 1)]
        m0 = [0.0] * n
        m1 = [0.0] * n
        j = 0
        for x, w in zip(xs, ws):
            while j < n - 1 and x > edges[j]:
                j += 1
            m0[j] += w
            m1[j] += w * x
        new = [m1[i] / m0[i] if m0[i] > 0 else levels[i] for i in range(n)]
        if max(abs(a - c) for a, c in zip(new, levels)) < 1e-12:
            levels = new
            break
        levels = new
    edges = [(levels[i] + levels[i + 1]) / 2.0 for i in range(n - 1)]
    mse = 0.0
    j = 0
    for x, w in zip(xs, ws):
        while j < n - 1 and x > edges[j]:
            j += 1
        mse += w * (x - levels[j]) ** 2
    return levels, mse


def main():
    out = []
    out.append("/* kn_tq_table.h - Lloyd-Max codebooks of the tq3 / tq4 KV dtypes, made by")
    out.append(" * tools/tq_codebook.py (do not edit; rerun it). For head_dim d = 16 << i")
    out.append(" * and b bits: KN_TQ_CB[i][b - 1][0 .. 2^b - 1], the optimal levels for")
    out.append(" * sqrt(d) times one coordinate of a random unit vector (ascending), and")
    out.append(" * KN_TQ_MSE[i][b - 1], their mean squared error per coordinate (the")
    out.append(" * variance of that coordinate is 1).")
    out.append(" *")
    out.append(" * Thread: constants.")
    out.append(" */")
    out.append("#ifndef KERNELS_KN_TQ_TABLE_H")
    out.append("#define KERNELS_KN_TQ_TABLE_H")
    out.append("")
    out.append("#ifndef KN_TQ_TABLE_QUAL /* kernels/kn_tq.h sets it (device constants under nvcc) */")
    out.append("#define KN_TQ_TABLE_QUAL static const")
    out.append("#endif")
    out.append("")
    out.append("#define KN_TQ_N_DIMS %d" % len(DIMS))
    out.append("")
    cbs, mses = [], []
    for d in DIMS:
        xs, ws = density(d)
        row_cb, row_mse = [], []
        for b in BITS:
            lv, mse = lloyd_max(xs, ws, b)
            # The density is even: average out the grid's tie-breaking.
            n = len(lv)
            lv = [(lv[i] - lv[n - 1 - i]) / 2.0 for i in range(n)]
            row_cb.append(lv + [0.0] * (16 - len(lv)))
            row_mse.append(mse)
        cbs.append(row_cb)
        mses.append(row_mse)
    out.append("KN_TQ_TABLE_QUAL float KN_TQ_CB[KN_TQ_N_DIMS][4][16] = {")
    for d, row in zip(DIMS, cbs):
        out.append("    { /* d = %d */" % d)
        for b, lv in zip(BITS, row):
            vals = ["%.9ef" % v for v in lv[: 1 << b]]
            out.append("        {")
            for i in range(0, len(vals), 4):
                out.append("            %s," % ", ".join(vals[i : i + 4]))
            out.append("        },")
        out.append("    },")
    out.append("};")
    out.append("")
    out.append("KN_TQ_TABLE_QUAL float KN_TQ_MSE[KN_TQ_N_DIMS][4] = {")
    for d, row in zip(DIMS, mses):
        out.append("    /* d = %d */" % d)
        out.append("    {%s}," % ", ".join("%.9ef" % m for m in row))
    out.append("};")
    out.append("")
    out.append("/* QJL estimate factor per head_dim: 1 / (d * c_d), c_d = E|s . u| for a unit")
    out.append(" * u and a sketch row s uniform on the sphere of radius sqrt(d) (the rows of")
    out.append(" * sqrt(d) Q, Q Haar orthogonal): c_d = sqrt(d) G(d/2) / (sqrt(pi) G((d+1)/2)). */")
    out.append("KN_TQ_TABLE_QUAL float KN_TQ_QJL[KN_TQ_N_DIMS] = {")
    vals = []
    for d in DIMS:
        c = math.sqrt(d) * math.exp(math.lgamma(d / 2.0) - math.lgamma((d + 1) / 2.0)) / math.sqrt(math.pi)
        vals.append("%.9ef" % (1.0 / (d * c)))
    out.append("    %s," % ", ".join(vals[:3]))
    out.append("    %s," % ", ".join(vals[3:]))
    out.append("};")
    out.append("")
    out.append("#endif /* KERNELS_KN_TQ_TABLE_H */")
    print("\n".join(out))


if __name__ == "__main__":
    main()
