/* kn_mass_body.h - the device side of H2O / SnapKV (model/kv_policy.h):
 * accumulated attention mass per cached token, layer and KV head over a
 * 16-bit paged pool, and the single-token moves of their compaction.
 * Kernel bodies in the style of kn_cuda_body.h (compiled by nvcc in
 * kn_cuda.cu and by the host compiler for the emulator, tests/cuda).
 *
 * DESIGN. The accumulator of one layer is [slot][n_kv_heads] f32 (slot =
 * block * block_size + offset), the layout of the CPU backend's
 * (kernels/cpu/kn_mass.h, model/host_kv_mass.c); a rank keeps its own KV
 * heads. The mass kernel runs right after a layer's attention, whichever
 * attention kernel ran (one pass, split-K, prefill tiles; eager or in a
 * decode graph), and recomputes q . k for the rows that accumulate: it
 * never touches the attention kernels, and costs nothing to a step without
 * such rows (model/dev_fwd.c launches it only then, and records a separate
 * decode graph for such steps). One thread block per (KV head, sequence)
 * walks that sequence's rows in order, so every key's cell has one writer
 * (no atomics) and the sums are deterministic; per row and query head it
 * takes the softmax max and normalizer over the key range (pass 1, block
 * reductions) and then adds p_j (pass 2), as kn_cpu_attn_mass() does:
 *
 *   acc[slot(j)][kh] += exp(s_j - M) / L,  s_j = scale * (q . k_j),
 *   M = max s_j,  L = sum exp(s_j - M),  j over the row's causal range
 *
 * A thread block per sequence means a long prompt's observation window
 * (SnapKV, W rows) runs W passes over the prompt on n_kv_heads blocks: at
 * prefill, once per prompt.
 *
 * Thread: launches are ordered on the rank's stream.
 */
#ifndef KERNELS_CUDA_KN_MASS_BODY_H
#define KERNELS_CUDA_KN_MASS_BODY_H

#include "kernels/cuda/kn_cuda_body.h"

/* ---- mass of the rows that accumulate ----------------------------------------
 *   a:    the layer's attention arguments (q, k_cache, query_start,
 *         context_len, block_tables, max_blocks, n_seqs, heads, head_dim,
 *         block_size, sliding_window, q_stride, scale, dt; out, v_cache,
 *         part and n_splits unused)
 *   rows: (n_tok) int32, nonzero: the row's probabilities add to acc
 *   acc:  this layer's (num_blocks * block_size, n_kv_heads) f32
 * Launch: grid (n_kv_heads, n_seqs), block a multiple of 32 (at most
 * 1024), shared kn_mass_smem_floats(head_dim) floats. */
typedef struct kn_attn_mass_args {
    kn_attn_cuda_args_t a;
    const int32_t *rows;
    float *acc;
} kn_attn_mass_args_t;

static inline size_t
kn_mass_smem_floats(int32_t head_dim)
{
    return (size_t)head_dim + 2 * (size_t)KN_WARP;
}

/* Max of v over the block, result in every thread (red: nthr / 32 floats
 * of shared scratch, reusable on return). */
KN_DEV float
kn_mass_block_max(const kn_thr_t *t, float *red, float v)
{
    int n_warps = t->nthr / KN_WARP;
    float m = -INFINITY;

    v = kn_warp_max(t, v);
    if (t->tid % KN_WARP == 0) {
        red[t->tid / KN_WARP] = v;
    }
    KN_SYNC(t);
    for (int w = 0; w < n_warps; w++) {
        m = fmaxf(m, red[w]);
    }
    KN_SYNC(t);
    return m;
}

/* scale * (q . key j) of KV head kvh through table bt; *slot its slot. */
KN_DEV float
kn_mass_score(const kn_attn_cuda_args_t *a, const int32_t *bt, int32_t kvh, const float *q_s,
              int32_t j, int32_t *slot)
{
    const int32_t hd = a->head_dim, bs = a->block_size;
    int32_t blk = bt[j / bs], off = j % bs;
    const uint16_t *k = a->k_cache + (((size_t)blk * a->n_kv_heads + kvh) * bs + off) * hd;
    float d = 0.0f;

    for (int32_t i = 0; i < hd; i++) {
        d += q_s[i] * kn_ld16(k, (size_t)i, a->dt);
    }
    *slot = blk * bs + off;
    return a->scale * d;
}

KN_DEV void
kn_attn_mass_body(const kn_thr_t *t, float *smem, const kn_attn_mass_args_t *ma)
{
    const kn_attn_cuda_args_t *a = &ma->a;
    const int32_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int32_t kvh = t->bx, s = t->by;
    const int32_t q0 = a->query_start[s], q1 = a->query_start[s + 1];
    const int32_t *bt = a->block_tables + (size_t)s * a->max_blocks;
    float *q_s = smem;          /* [hd] one query head */
    float *red = q_s + hd;      /* [32] */
    float *red2 = red + KN_WARP; /* [32] */

    for (int32_t tok = q0; tok < q1; tok++) {
        int32_t hi = a->context_len[s] - (q1 - tok), lo = 0;

        if (!ma->rows[tok]) {
            continue; /* uniform over the block */
        }
        if (a->sliding_window > 0 && hi - a->sliding_window + 1 > 0) {
            lo = hi - a->sliding_window + 1;
        }
        for (int32_t g = 0; g < group; g++) {
            const float *q = a->q + (size_t)tok * a->q_stride + (size_t)(kvh * group + g) * hd;
            float m = -INFINITY, l = 0.0f, mx, sum, inv;
            int32_t slot;

            for (int32_t i = t->tid; i < hd; i += t->nthr) {
                q_s[i] = q[i];
            }
            KN_SYNC(t);
            /* Pass 1: each thread's online max / normalizer, then the block's. */
            for (int32_t j = lo + t->tid; j <= hi; j += t->nthr) {
                float x = kn_mass_score(a, bt, kvh, q_s, j, &slot);

                if (x > m) {
                    l = l * expf(m - x) + 1.0f;
                    m = x;
                } else {
                    l += expf(x - m);
                }
            }
            mx = kn_mass_block_max(t, red, m);
            sum = kn_block_sum(t, red2, m == -INFINITY ? 0.0f : l * expf(m - mx));
            inv = 1.0f / sum;
            /* Pass 2: each key's cell has this one writer. */
            for (int32_t j = lo + t->tid; j <= hi; j += t->nthr) {
                float x = kn_mass_score(a, bt, kvh, q_s, j, &slot);

                ma->acc[(size_t)slot * a->n_kv_heads + kvh] += expf(x - mx) * inv;
            }
            KN_SYNC(t); /* q_s is rewritten next */
        }
    }
}

/* ---- the mass of chosen slots, every layer -------------------------------------
 * out[i][l][h] = acc[l][slots[i]][h] for this rank's n_kv heads.
 *   acc:  (n_layers, layer_cells) f32, layer_cells = num_slots * n_kv
 *   out:  (n, n_layers, n_kv) f32
 * Launch: grid (n), any block size, no shared memory. */
typedef struct kn_mass_gather_args {
    const float *acc;
    const int32_t *slots;
    float *out;
    size_t layer_cells;
    int32_t n_layers;
    int32_t n_kv;
} kn_mass_gather_args_t;

KN_DEV void
kn_mass_gather_body(const kn_thr_t *t, float *smem, const kn_mass_gather_args_t *a)
{
    const int32_t i = t->bx, n = a->n_layers * a->n_kv;
    const size_t slot = (size_t)a->slots[i];

    (void)smem;
    for (int32_t c = t->tid; c < n; c += t->nthr) {
        int32_t l = c / a->n_kv, h = c % a->n_kv;

        a->out[(size_t)i * n + c] = a->acc[(size_t)l * a->layer_cells + slot * a->n_kv + h];
    }
}

/* ---- KV_OP_COPY_SLOT over a 16-bit pool -----------------------------------------
 * For m = 0 .. n_moves-1 in order: the K and V rows and the mass cell of
 * slot moves[2m] are copied to slot moves[2m + 1], every layer and KV head
 * (keys unrotated). Thread i of a block always handles element i of a row,
 * so a move that reads what an earlier one wrote sees it (same thread).
 *   kv:   the pool, (n_layers, 2, num_blocks, n_kv, block_size, head_dim)
 *         16-bit, region_el elements per (layer, K or V)
 *   acc:  (n_layers, layer_cells) f32 or NULL
 * Launch: grid (n_kv, n_layers), any block size, no shared memory. */
typedef struct kn_kv_move_args {
    uint16_t *kv;
    float *acc;
    const int32_t *moves;
    size_t region_el;
    size_t layer_cells;
    int32_t n_moves;
    int32_t n_kv;
    int32_t block_size;
    int32_t head_dim;
} kn_kv_move_args_t;

KN_DEV void
kn_kv_move_body(const kn_thr_t *t, float *smem, const kn_kv_move_args_t *a)
{
    const int32_t h = t->bx, l = t->by, hd = a->head_dim, bs = a->block_size;

    (void)smem;
    for (int32_t m = 0; m < a->n_moves; m++) {
        int32_t src = a->moves[2 * m], dst = a->moves[2 * m + 1];
        size_t so = (((size_t)(src / bs) * a->n_kv + h) * bs + (size_t)(src % bs)) * hd;
        size_t d0 = (((size_t)(dst / bs) * a->n_kv + h) * bs + (size_t)(dst % bs)) * hd;

        for (int32_t i = t->tid; i < 2 * hd; i += t->nthr) {
            uint16_t *r = a->kv + ((size_t)l * 2 + (size_t)(i / hd)) * a->region_el;

            r[d0 + (size_t)(i % hd)] = r[so + (size_t)(i % hd)];
        }
        if (a->acc != NULL && t->tid == 0) {
            float *c = a->acc + (size_t)l * a->layer_cells;

            c[(size_t)dst * a->n_kv + h] = c[(size_t)src * a->n_kv + h];
        }
    }
}

#endif /* KERNELS_CUDA_KN_MASS_BODY_H */
