/* test_devemu.c - the CUDA backend's forward pass (model/dev_fwd.c) on
 * emulated device operations, against the CPU backend.
 *
 * The operations: "device" memory is host memory, kernels are the bodies
 * of kernels/cuda/kn_cuda_body.h under the thread-block emulator, the GEMM
 * is a reference loop over the 16-bit operands with f32 output (what
 * cublasGemmEx computes), the all-reduce is kernels/comm.h's. Everything
 * else -- weight sharding and upload (file-type blocks staged in chunks,
 * dequantized by the emulated wdequant kernel), strides, the batch staging,
 * the layer loop, KV regions, the copy/swap plan, tensor parallelism --
 * is the code the CUDA backend runs.
 *
 * Checks, through chunked prefill, batched decodes and KV copies/swaps
 * (the side checked reads its block tables as persistent rows,
 * mdl_batch_t.table_rows, the reference a batch laid out per step):
 *   T = 1 (f16 and bf16) against the CPU backend (f32): logits NMSE under
 *   2e-6 (f16) / 5e-4 (bf16) per step, and the same argmax wherever the
 *   CPU's top-2 margin is above 0.1;
 *   T = 2 and 4 against emulated T = 1: NMSE under 1e-5 (f16);
 *   Q8_0 / Q4_K weights: the native upload's device matrices equal the
 *   host path's bit for bit, the staging stays within its cap, and the
 *   logits stay within bounds against the CPU backend (see
 *   test_devemu_native_weights).
 *   fp8 / int8 / int4 and tq3 / tq4 KV: against the CPU backend with the
 *   same dtype (test_devemu_kv_quant, test_devemu_kv_tq, and the sink /
 *   rolling-window stream of test_devemu_kv_policy).
 * Models: the default model and synthetic ones (1 KV head replicated, QKV
 * biases), as in test_tp.c.
 */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "model/dev_fwd.h"
#include "model/model.h"
#include "model/kv_policy.h"
#include "model/model_int.h"
#include "tests/cuda/batch_build.h"
#include "tests/cuda/dev_emu.h"
#include "tests/cuda/kn_emu.h"
#include "tests/cuda/synth_model.h"

/* ---- the script (as test_tp.c) ------------------------------------------------------ */

#define BS 8
#define NBLK 48
#define SWAPB 8
#define MAXB 12
#define NSEQ 3


typedef struct tseq {
    int32_t ids[MAXB * BS];
    int32_t done;
    int32_t table[MAXB];
} tseq_t;

static void
step(emu_side_t *ref, emu_side_t *got, emu_cmp_t *c, tseq_t *seqs, const int32_t *n_new)
{
    tb_batch_t t;

    tb_begin(&t, BS, MAXB);
    for (int32_t s = 0; s < NSEQ; s++) {
        if (n_new[s] > 0) {
            tb_add(&t, seqs[s].ids, &seqs[s].done, n_new[s], seqs[s].table, 1);
        }
    }
    const mdl_batch_t *b = tb_end(&t);
    const int32_t ns = b->n_seqs;
    /* The side checked gets the same tables as persistent rows
     * (mdl_batch_t.table_rows, what the scheduler sends): sequence s in
     * row NSEQ - 1 - s, the other rows' entries -1, one dirty run per row. */
    int32_t pbt[NSEQ * MAXB], prow[NSEQ];
    mdl_table_run_t runs[NSEQ];
    mdl_batch_t pb = *b;

    for (int32_t i = 0; i < NSEQ * MAXB; i++) {
        pbt[i] = -1;
    }
    for (int32_t s = 0; s < ns; s++) {
        prow[s] = NSEQ - 1 - s;
        memcpy(pbt + prow[s] * MAXB, t.bt + s * MAXB, sizeof(int32_t) * MAXB);
        runs[s] = (mdl_table_run_t){prow[s], 0, (t.ctx[s] + BS - 1) / BS};
    }
    pb.block_tables = pbt;
    pb.table_rows = prow;
    pb.table_dirty = runs;
    pb.n_table_dirty = ns;

    float *lr = xmalloc(sizeof(float) * (size_t)ns * c->vocab);

    memcpy(lr, emu_side_forward(ref, b), sizeof(float) * (size_t)ns * c->vocab);
    emu_compare(c, lr, emu_side_forward(got, &pb), ns);
    free(lr);
}

static void
both_kv(emu_side_t *a, emu_side_t *b, const kv_op_t *ops, int32_t n)
{
    emu_side_kv(a, ops, n);
    emu_side_kv(b, ops, n);
}

static void
run_script(emu_side_t *ref, emu_side_t *got, emu_cmp_t *c)
{
    tseq_t seqs[NSEQ];
    int32_t next_blk;
    kv_op_t ops[2 * MAXB];
    int32_t n_ops = 0;

    synth_rs = 0xabcdefULL;
    for (int32_t s = 0; s < NSEQ; s++) {
        memset(&seqs[s], 0, sizeof(seqs[s]));
        for (int32_t i = 0; i < MAXB * BS; i++) {
            seqs[s].ids[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(c->vocab - 3));
        }
        for (int32_t b = 0; b < 6; b++) {
            seqs[s].table[b] = 1 + b * NSEQ + s;
        }
    }
    next_blk = 1 + 6 * NSEQ;

    int32_t s1[NSEQ] = {13, 5, 0}, s2[NSEQ] = {9, 1, 20}, d[NSEQ] = {1, 1, 1};
    step(ref, got, c, seqs, s1);
    step(ref, got, c, seqs, s2);
    step(ref, got, c, seqs, d);

    for (int32_t b = 0; b * BS < seqs[0].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[0].table[b], next_blk};
        seqs[0].table[b] = next_blk++;
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_OUT, seqs[1].table[b], 1 + b};
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[2].table[0], seqs[1].table[b]};
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_IN, 1 + b, next_blk};
        seqs[1].table[b] = next_blk++;
    }
    both_kv(ref, got, ops, n_ops);
    step(ref, got, c, seqs, d);
    step(ref, got, c, seqs, d);
}

static mdl_runtime_config_t
script_config(int32_t tp)
{
    mdl_runtime_config_t rc = {.num_blocks = NBLK,
                               .swap_blocks = SWAPB,
                               .block_size = BS,
                               .max_num_batched_tokens = 64,
                               .max_num_seqs = NSEQ,
                               .max_blocks_per_seq = MAXB,
                               .n_threads = 1,
                               .tp_size = tp};
    return rc;
}

/* Emulated device at T = 1 against the CPU backend. */
static double
vs_cpu(const mdl_model_t *m, kn_dt_t dt)
{
    char err[256];
    mdl_runtime_config_t rc = script_config(1);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = dt == KN_DT_F16 ? 2e-6 : 5e-4, .vocab = m->cfg.vocab_size};

    ck_assert_msg(mdl_runtime_create(m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(m, &rc, dt);
    run_script(&ref, &got, &c);
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    return c.worst;
}

/* ---- quantized KV ------------------------------------------------------------------ */

/* Block blk of (layer, kind) in tier (0 device, 1 swap) of a quantized rank. */
static const uint8_t *
kq_block(const mdl_dev_rank_t *rk, int tier, int32_t layer, int kind, int32_t blk)
{
    int32_t nb = rk->kqt[tier].n_blocks;
    const uint8_t *base = tier == 0 ? rk->kv : rk->swap;

    return base + (size_t)layer * nb * (rk->kq.k_stride + rk->kq.v_stride) +
           (size_t)kind * nb * rk->kq.k_stride +
           (size_t)blk * (kind == 0 ? rk->kq.k_stride : rk->kq.v_stride);
}

/* Whether block a of tier ta and block b of tier tb hold the same bytes
 * (every layer, K and V, codes and scales) and, with a residual slot, the
 * same slot rows. */
static int
kq_same(const mdl_dev_rank_t *rk, int ta, int32_t a, int tb, int32_t b)
{
    const mdl_dev_kq_tier_t *A = &rk->kqt[ta], *B = &rk->kqt[tb];
    size_t slot_bytes = 2 * (size_t)rk->m->cfg.n_layers * (size_t)rk->sh.n_kv *
                        (size_t)rk->rc.block_size * (size_t)rk->m->cfg.head_dim * sizeof(float);

    for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
        if (memcmp(kq_block(rk, ta, l, 0, a), kq_block(rk, tb, l, 0, b), rk->kq.k_stride) != 0 ||
            memcmp(kq_block(rk, ta, l, 1, a), kq_block(rk, tb, l, 1, b), rk->kq.v_stride) != 0) {
            return 0;
        }
    }
    if ((A->sl.slot_of[a] < 0) != (B->sl.slot_of[b] < 0) || A->qv[a] != B->qv[b]) {
        return 0;
    }
    if (A->sl.slot_of[a] < 0) {
        return 1;
    }
    return A->sl.slot_fill[A->sl.slot_of[a]] == B->sl.slot_fill[B->sl.slot_of[b]] &&
           memcmp((const uint8_t *)A->res + (size_t)A->sl.slot_of[a] * slot_bytes,
                  (const uint8_t *)B->res + (size_t)B->sl.slot_of[b] * slot_bytes, slot_bytes) == 0;
}

/* Copy-on-write and a swap round trip move a full (codes only) and a
 * partial (residual slot) block bit for bit; DROP gives the slots back. */
static void
kq_check_moves(emu_dev_t *e)
{
    mdl_dev_rank_t *rk = &e->fw[0];
    mdl_dev_kq_tier_t *dev = &rk->kqt[0], *swp = &rk->kqt[1];
    int32_t full = -1, part = -1, free_dev = dev->sl.n_free, free_swp = swp->sl.n_free;

    for (int32_t b = 1; b < 40; b++) {
        if (full < 0 && dev->qv[b] && dev->sl.slot_of[b] < 0) {
            full = b;
        }
        if (part < 0 && dev->sl.slot_of[b] >= 0) {
            part = b;
        }
    }
    ck_assert_msg(full > 0 && part > 0, "the script leaves a full and a partial block");
    kv_op_t ops[] = {
        {KV_OP_COPY, full, NBLK - 1},    {KV_OP_COPY, part, NBLK - 2},
        {KV_OP_SWAP_OUT, NBLK - 1, 6},   {KV_OP_SWAP_OUT, NBLK - 2, 7},
        {KV_OP_SWAP_IN, 6, NBLK - 3},    {KV_OP_SWAP_IN, 7, NBLK - 4},
    };

    emu_side_kv(&(emu_side_t){.dev = e}, ops, 6);
    ck_assert(kq_same(rk, 0, full, 0, NBLK - 1));
    ck_assert(kq_same(rk, 0, part, 0, NBLK - 2));
    ck_assert(kq_same(rk, 0, full, 1, 6));
    ck_assert(kq_same(rk, 0, part, 1, 7));
    ck_assert(kq_same(rk, 0, full, 0, NBLK - 3));
    ck_assert(kq_same(rk, 0, part, 0, NBLK - 4));
    ck_assert_int_eq(dev->sl.n_free, free_dev - 2);
    ck_assert_int_eq(swp->sl.n_free, free_swp - 1);
    kv_op_t drops[] = {{KV_OP_DROP, NBLK - 2, 0},
                       {KV_OP_DROP, NBLK - 4, 0},
                       {KV_OP_DROP_SWAP, 7, 0},
                       {KV_OP_DROP_SWAP, 6, 0}};

    emu_side_kv(&(emu_side_t){.dev = e}, drops, 4);
    ck_assert_int_eq(dev->sl.n_free, free_dev);
    ck_assert_int_eq(swp->sl.n_free, free_swp);
}

/* Block blk of (layer, kind) in tier (0 device, 1 swap) of a tq rank. */
static const uint8_t *
tq_block(const mdl_dev_rank_t *rk, int tier, int32_t layer, int kind, int32_t blk)
{
    size_t nb = (size_t)(tier == 0 ? rk->rc.num_blocks : rk->rc.swap_blocks);
    const uint8_t *base = tier == 0 ? rk->kv : rk->swap;

    return base + (size_t)layer * nb * (rk->tq_kstride + rk->tq_vstride) +
           (size_t)kind * nb * rk->tq_kstride +
           (size_t)blk * (kind == 0 ? rk->tq_kstride : rk->tq_vstride);
}

static int
tq_same(const mdl_dev_rank_t *rk, int ta, int32_t a, int tb, int32_t b)
{
    for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
        if (memcmp(tq_block(rk, ta, l, 0, a), tq_block(rk, tb, l, 0, b), rk->tq_kstride) != 0 ||
            memcmp(tq_block(rk, ta, l, 1, a), tq_block(rk, tb, l, 1, b), rk->tq_vstride) != 0) {
            return 0;
        }
    }
    return 1;
}

/* tq: copy-on-write and a swap round trip move a block's rows bit for bit
 * (no slots: a partial block is just rows). Block 1 holds the script's
 * first rows. */
static void
tq_check_moves(emu_dev_t *e)
{
    mdl_dev_rank_t *rk = &e->fw[0];
    const uint8_t *b1 = tq_block(rk, 0, 0, 0, 1);
    size_t nz = 0;

    for (size_t i = 0; i < rk->tq_kstride; i++) {
        nz += b1[i] != 0;
    }
    ck_assert_uint_gt(nz, rk->tq_kstride / 4);
    kv_op_t ops[] = {{KV_OP_COPY, 1, NBLK - 1},
                     {KV_OP_SWAP_OUT, NBLK - 1, 6},
                     {KV_OP_SWAP_IN, 6, NBLK - 3},
                     {KV_OP_DROP, NBLK - 1, 0}};

    emu_side_kv(&(emu_side_t){.dev = e}, ops, 4);
    ck_assert(tq_same(rk, 0, 1, 0, NBLK - 1));
    ck_assert(tq_same(rk, 0, 1, 1, 6));
    ck_assert(tq_same(rk, 0, 1, 0, NBLK - 3));
}

/* Emulated device (f16 weights) at T = tp against the CPU backend, both
 * with KV dtype kv; the moves check at the end (T = 1). */
static double
vs_cpu_kq_margin(const mdl_model_t *m, mdl_kv_dtype_t kv, int32_t tp, double bound, float margin)
{
    char err[256];
    mdl_runtime_config_t rc = script_config(1), rct = script_config(tp);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = bound, .vocab = m->cfg.vocab_size, .margin = margin};

    rc.kv_dtype = kv;
    rct.kv_dtype = kv;
    ck_assert_msg(mdl_runtime_create(m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(m, &rct, KN_DT_F16);
    run_script(&ref, &got, &c);
    if (tp == 1 && got.dev->fw[0].tq_bits != 0) {
        tq_check_moves(got.dev);
    } else if (tp == 1) {
        kq_check_moves(got.dev);
    }
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    return c.worst;
}

static double
vs_cpu_kq(const mdl_model_t *m, mdl_kv_dtype_t kv, int32_t tp, double bound)
{
    return vs_cpu_kq_margin(m, kv, tp, bound, 0.0f);
}

/* Emulated device at T = tp against T = 1. */
static double
vs_tp1(const mdl_model_t *m, int32_t tp)
{
    mdl_runtime_config_t rc1 = script_config(1), rct = script_config(tp);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = 1e-5, .vocab = m->cfg.vocab_size};

    ref.dev = emu_dev_create(m, &rc1, KN_DT_F16);
    got.dev = emu_dev_create(m, &rct, KN_DT_F16);
    run_script(&ref, &got, &c);
    emu_dev_destroy(ref.dev);
    emu_dev_destroy(got.dev);
    return c.worst;
}

START_TEST(test_devemu_default_model)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    mdl_model_t *m;
    char err[256];

    const char *scale = getenv("KVSERVE_TEST_SCALE");

    if (scale != NULL && atof(scale) < 1.0) {
        /* Under the sanitizers (tools/test): the synthetic models cover the
         * same code at a fraction of the emulated context switches. */
        printf("default model skipped at KVSERVE_TEST_SCALE=%s\n", scale);
        return;
    }
    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    printf("default model, emulated device vs cpu: f16 NMSE %.3g, bf16 NMSE %.3g\n",
           vs_cpu(m, KN_DT_F16), vs_cpu(m, KN_DT_BF16));
    printf("default model, emulated device T=2 vs T=1: NMSE %.3g\n", vs_tp1(m, 2));
    mdl_model_destroy(m);
}
END_TEST

/* The synthetic models' seed, per KV head count. */
#define SYNTH_SEED(n_kv) (0x5eed0000ULL + (uint64_t)(n_kv))

static void
synth_init(synth_t *s, int32_t n_heads, int32_t n_kv, int bias)
{
    synth_init_shape(s, n_heads, n_kv, bias, 8, 40, 64, SYNTH_SEED(n_kv));
}

START_TEST(test_devemu_synthetic)
{
    /* (n_heads, n_kv, bias, T) */
    static const int32_t cases[][4] = {{4, 1, 1, 2}, {4, 1, 0, 4}, {8, 2, 1, 4}};
    synth_t s;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        synth_init(&s, cases[i][0], cases[i][1], cases[i][2]);
        double e_cpu = vs_cpu(&s.m, KN_DT_F16);
        double e_tp = vs_tp1(&s.m, cases[i][3]);

        printf("synthetic %d/%d heads%s: emulated vs cpu NMSE %.3g, T=%d vs T=1 NMSE %.3g\n",
               cases[i][0], cases[i][1], cases[i][2] ? " + bias" : "", e_cpu, cases[i][3], e_tp);
        synth_fini(&s);
    }
}
END_TEST

/* More partly filled blocks than residual slots (14 with these limits):
 * both sides flush the least recently written slot into codes, and a
 * later write into a flushed block continues from its dequantized codes.
 * 18 one-sequence prefills of 3 tokens into blocks 1, 3, .., 35, then
 * decodes into the flushed blocks, then two sequences filling a block
 * (quantized on fill) and one token into the next. */
static double
kq_flush_script(const mdl_model_t *m, mdl_kv_dtype_t kv, double bound)
{
    char err[256];
    mdl_runtime_config_t rc = {.num_blocks = NBLK,
                               .swap_blocks = SWAPB,
                               .block_size = BS,
                               .max_num_batched_tokens = 8,
                               .max_num_seqs = 2,
                               .max_blocks_per_seq = 4,
                               .n_threads = 1,
                               .tp_size = 1,
                               .kv_dtype = kv};
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = bound, .vocab = m->cfg.vocab_size};
    int32_t ids[18][16], done[18] = {0};

    ck_assert_msg(mdl_runtime_create(m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(m, &rc, KN_DT_F16);
    ck_assert_int_eq(got.dev->fw[0].kqt[0].sl.n_slots, 14);
    synth_rs = 0x51075ULL;
    for (int32_t q = 0; q < 18; q++) {
        for (int32_t i = 0; i < 16; i++) {
            ids[q][i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(c.vocab - 3));
        }
    }
    /* (sequence, new tokens) per step; a step holds one or two sequences. */
    static const int32_t plan[][4] = {
        {0, 3, -1, 0},  {1, 3, -1, 0},  {2, 3, -1, 0},  {3, 3, -1, 0}, {4, 3, -1, 0},
        {5, 3, -1, 0},  {6, 3, -1, 0},  {7, 3, -1, 0},  {8, 3, -1, 0}, {9, 3, -1, 0},
        {10, 3, -1, 0}, {11, 3, -1, 0}, {12, 3, -1, 0}, {13, 3, -1, 0}, {14, 3, -1, 0},
        {15, 3, -1, 0}, {16, 3, -1, 0}, {17, 3, -1, 0}, {0, 1, -1, 0},  {1, 1, -1, 0},
        {2, 2, 3, 2},   {0, 4, 1, 4},   {0, 1, 1, 1},   {4, 1, -1, 0},
    };
    for (size_t p = 0; p < sizeof(plan) / sizeof(plan[0]); p++) {
        int32_t tok[8], pos[8], slot[8], qs[3] = {0}, ctx[2], bt[2 * 4], rows[2], n = 0, ns = 0;

        for (int k = 0; k < 2; k++) {
            int32_t q = plan[p][2 * k], nn = plan[p][2 * k + 1];

            if (q < 0) {
                continue;
            }
            for (int32_t b = 0; b < 4; b++) {
                bt[ns * 4 + b] = b < 2 ? 1 + 2 * q + b : 0;
            }
            for (int32_t i = 0; i < nn; i++) {
                int32_t ix = done[q] + i;

                tok[n] = ids[q][ix];
                pos[n] = ix;
                slot[n] = bt[ns * 4 + ix / BS] * BS + ix % BS;
                n++;
            }
            done[q] += nn;
            ctx[ns] = done[q];
            rows[ns] = n - 1;
            qs[++ns] = n;
        }
        mdl_batch_t b = {.n_tokens = n,
                         .tokens = tok,
                         .positions = pos,
                         .slot_mapping = slot,
                         .n_seqs = ns,
                         .query_start = qs,
                         .context_len = ctx,
                         .block_tables = bt,
                         .max_blocks = 4,
                         .logits_rows = rows,
                         .n_logits = ns};
        float *lr = xmalloc(sizeof(float) * (size_t)ns * c.vocab);

        memcpy(lr, emu_side_forward(&ref, &b), sizeof(float) * (size_t)ns * c.vocab);
        emu_compare(&c, lr, emu_side_forward(&got, &b), ns);
        free(lr);
        if (p == 17) { /* 18 partial blocks, 14 slots: the 4 oldest were flushed */
            for (int32_t q = 0; q < 18; q++) {
                const mdl_dev_kq_tier_t *t = &got.dev->fw[0].kqt[0];

                ck_assert_int_eq(t->sl.slot_of[1 + 2 * q] < 0, q < 4);
                ck_assert_int_eq(t->qv[1 + 2 * q], q < 4);
            }
        }
    }
    /* Sequence 0's first block filled (quantized), 1's too; 17 still partial. */
    ck_assert(got.dev->fw[0].kqt[0].qv[1] && got.dev->fw[0].kqt[0].sl.slot_of[1] < 0);
    ck_assert(got.dev->fw[0].kqt[0].sl.slot_of[35] >= 0);
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    return c.worst;
}

/* mdl_kv_blocks_for_budget() with compressed KV: a block costs its codes
 * and scales on each rank (at T = 1 exactly the CPU backend's block, as
 * mdl_kv_block_bytes() reports it) and the residual slots come out of the
 * activations' share. */
START_TEST(test_devemu_kv_quant_budget)
{
    synth_t s;
    mdl_kv_budget_t b16, bq;
    char err[400];
    const size_t GiB = (size_t)1 << 30;

    synth_init(&s, 8, 2, 0);
    for (mdl_kv_dtype_t kv = MDL_KV_FP8_E4M3; kv <= MDL_KV_INT4; kv++) {
        mdl_runtime_config_t rc = script_config(1);

        rc.block_size = 16;
        rc.max_num_batched_tokens = 512;
        rc.max_num_seqs = 16;
        rc.gpu_memory_utilization = 0.5f;
        rc.num_blocks = 0;
        rc.kv_dtype = MDL_KV_BF16;
        ck_assert_int_eq(mdl_kv_blocks_for_budget(&s.m.cfg, &rc, 4 * GiB, &b16, err, sizeof(err)),
                         ST_OK);
        rc.kv_dtype = kv;
        ck_assert_int_eq(mdl_kv_blocks_for_budget(&s.m.cfg, &rc, 4 * GiB, &bq, err, sizeof(err)),
                         ST_OK);
        ck_assert_uint_eq(bq.block_bytes, mdl_kv_block_bytes(&s.m.cfg, 16, kv));
        ck_assert_uint_lt(bq.block_bytes, b16.block_bytes);
        /* 73 slots of 2 layers x K,V x 2 heads x 16 x 8 f32: one more page. */
        ck_assert_uint_eq(bq.act_bytes, b16.act_bytes + MDL_DEV_ALLOC_GRAIN);
        ck_assert_uint_eq(bq.weight_bytes, b16.weight_bytes);
        ck_assert_int_eq(bq.num_blocks, (int32_t)((bq.budget_bytes - bq.weight_bytes -
                                                   bq.act_bytes - bq.reserve_bytes) /
                                                  bq.block_bytes));
        /* T = 2: one KV head per rank, half the block. */
        rc.tp_size = 2;
        ck_assert_int_eq(mdl_kv_blocks_for_budget(&s.m.cfg, &rc, 4 * GiB, &bq, err, sizeof(err)),
                         ST_OK);
        ck_assert_uint_eq(bq.block_bytes, mdl_kv_block_bytes(&s.m.cfg, 16, kv) / 2);
    }
    synth_fini(&s);
}
END_TEST

/* fp8 / int8 / int4 KV: the emulated rank against the CPU backend with
 * the same dtype. Both quantize the same blocks with the same rules, but
 * from K/V that differ by the f16 weights' rounding, so an element may
 * land one code apart: the bounds are those of f16 scaled by the
 * format's step (measured on these models, kept with a margin of ~10x). */
START_TEST(test_devemu_kv_quant)
{
    static const struct {
        mdl_kv_dtype_t kv;
        const char *name;
        double bound;
    } kvs[] = {{MDL_KV_FP8_E4M3, "fp8_e4m3", 1e-4}, {MDL_KV_INT8, "int8", 2e-5},
               {MDL_KV_INT4, "int4", 2e-4}};
    static const int32_t cases[][4] = {{4, 1, 1, 1}, {8, 2, 1, 2}};
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    const char *scale = getenv("KVSERVE_TEST_SCALE");
    synth_t s;

    for (size_t k = 0; k < sizeof(kvs) / sizeof(kvs[0]); k++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            synth_init(&s, cases[i][0], cases[i][1], cases[i][2]);
            printf("synthetic %d/%d heads, %s KV, T=%d: emulated vs cpu NMSE %.3g\n",
                   cases[i][0], cases[i][1], kvs[k].name, cases[i][3],
                   vs_cpu_kq(&s.m, kvs[k].kv, cases[i][3], kvs[k].bound));
            synth_fini(&s);
        }
    }
    for (size_t k = 0; k < sizeof(kvs) / sizeof(kvs[0]); k++) {
        synth_init(&s, 8, 2, 0);
        printf("synthetic 8/2 heads, %s KV, residual slots flushed: emulated vs cpu NMSE %.3g\n",
               kvs[k].name, kq_flush_script(&s.m, kvs[k].kv, kvs[k].bound));
        synth_fini(&s);
    }
    if (scale != NULL && atof(scale) < 1.0) {
        printf("default model skipped at KVSERVE_TEST_SCALE=%s\n", scale);
        return;
    }
    mdl_model_t *m;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    for (size_t k = 0; k < sizeof(kvs) / sizeof(kvs[0]); k++) {
        printf("default model, %s KV: emulated vs cpu NMSE %.3g\n", kvs[k].name,
               vs_cpu_kq(m, kvs[k].kv, 1, kvs[k].bound));
    }
    mdl_model_destroy(m);
}
END_TEST

/* ---- tq3 / tq4 KV ---------------------------------------------------------------------- */

/* One sequence: a 16-token prompt prefilled in one step, then n_gen greedy
 * decode steps. free_run: each side feeds back its own argmax and the
 * token streams must be equal; else both are fed the CPU's (teacher
 * forcing) and *agree counts the steps whose argmax agrees. Returns the
 * worst logits NMSE (bound checked per step). */
static double
greedy_tq(const mdl_model_t *m, mdl_kv_dtype_t kv, int32_t n_gen, double bound, int free_run,
          int32_t *agree)
{
    char err[256];
    mdl_runtime_config_t rc = script_config(1);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = bound, .vocab = m->cfg.vocab_size, .margin = 1e9f};
    int32_t ids_ref[MAXB * BS], ids_got[MAXB * BS], bt[MAXB], n = 16;

    *agree = 0;

    ck_assert_int_le(n + n_gen, MAXB * BS);
    rc.kv_dtype = kv;
    ck_assert_msg(mdl_runtime_create(m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(m, &rc, KN_DT_F16);
    synth_rs = 0x6a09e667ULL;
    for (int32_t i = 0; i < n; i++) {
        ids_ref[i] = ids_got[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(c.vocab - 3));
    }
    for (int32_t b = 0; b < MAXB; b++) {
        bt[b] = 1 + b;
    }
    for (int32_t done = 0, step_n = n; done + step_n <= n + n_gen; ) {
        int32_t pos[MAXB * BS], slot[MAXB * BS], qs[2] = {0, step_n}, ctx = done + step_n;
        int32_t row = step_n - 1, best[2] = {0, 0};
        const float *lr;
        float *keep = xmalloc(sizeof(float) * (size_t)c.vocab);

        for (int32_t i = 0; i < step_n; i++) {
            pos[i] = done + i;
            slot[i] = bt[(done + i) / BS] * BS + (done + i) % BS;
        }
        mdl_batch_t b = {.n_tokens = step_n, .tokens = ids_ref + done, .positions = pos,
                         .slot_mapping = slot, .n_seqs = 1, .query_start = qs,
                         .context_len = &ctx, .block_tables = bt, .max_blocks = MAXB,
                         .logits_rows = &row, .n_logits = 1};
        mdl_batch_t bg = b;

        bg.tokens = ids_got + done;
        lr = emu_side_forward(&ref, &b);
        memcpy(keep, lr, sizeof(float) * (size_t)c.vocab);
        lr = emu_side_forward(&got, &bg);
        emu_compare(&c, keep, lr, 1);
        for (int32_t i = 1; i < c.vocab; i++) {
            best[0] = keep[i] > keep[best[0]] ? i : best[0];
            best[1] = lr[i] > lr[best[1]] ? i : best[1];
        }
        free(keep);
        done += step_n;
        if (done >= n + n_gen) {
            break;
        }
        ids_ref[done] = best[0];
        ids_got[done] = free_run ? best[1] : best[0];
        *agree += best[0] == best[1];
        ck_assert_msg(!free_run || best[0] == best[1], "%s greedy step %d: emulated %d, cpu %d",
                      mdl_kv_dtype_name(kv), done - n, best[1], best[0]);
        step_n = 1;
    }
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    return c.worst;
}

/* tq3 / tq4 KV: the emulated rank (rows written by kn_tq_write_body, read
 * by kn_tq_attn_body) against the CPU backend with the same dtype, through
 * the script's prefill, decodes, copy-on-write and swaps (T = 1 and 2:
 * the rotations follow the global KV head), the moves bit for bit; on the
 * default model also 64 greedy tokens. Both encode rows with the same
 * code, from K / V that differ by the f16 weights' rounding, so a
 * coordinate may land one code apart, a step of 0.3 to 1 of its spread at
 * 2 to 4 bits (int4's step is 1/15 of the row's range), and tq4's key
 * sketch flips signs with it: one flipped code moved a logit by up to
 * ~0.5 in these runs (measured NMSE: 2e-4 to 3.5e-3), so the bound is
 * 3e-2 and argmax agreement is required above a top-2 margin of 1. tq3
 * generates the same 64 greedy tokens on both sides; tq4 diverged at the
 * 18th (a sign flip at a 0.45 margin), so it is fed the CPU's tokens and
 * must agree on at least 60 of 64. */
#define TQ_MARGIN 1.0f

START_TEST(test_devemu_kv_tq)
{
    static const struct {
        mdl_kv_dtype_t kv;
        const char *name;
        double bound;
    } kvs[] = {{MDL_KV_TQ3, "tq3", 3e-2}, {MDL_KV_TQ4, "tq4", 3e-2}};
    static const int32_t cases[][4] = {{4, 1, 1, 1}, {8, 2, 1, 2}};
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    const char *scale = getenv("KVSERVE_TEST_SCALE");
    synth_t s;

    for (size_t k = 0; k < sizeof(kvs) / sizeof(kvs[0]); k++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            synth_init_shape(&s, cases[i][0], cases[i][1], cases[i][2], 16, 40, 64,
                             SYNTH_SEED(cases[i][1]));
            printf("synthetic %d/%d heads x 16, %s KV, T=%d: emulated vs cpu NMSE %.3g\n",
                   cases[i][0], cases[i][1], kvs[k].name, cases[i][3],
                   vs_cpu_kq_margin(&s.m, kvs[k].kv, cases[i][3], kvs[k].bound, TQ_MARGIN));
            synth_fini(&s);
        }
    }
    if (scale != NULL && atof(scale) < 1.0) {
        printf("default model skipped at KVSERVE_TEST_SCALE=%s\n", scale);
        return;
    }
    mdl_model_t *m;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    for (size_t k = 0; k < sizeof(kvs) / sizeof(kvs[0]); k++) {
        int free_run = kvs[k].kv == MDL_KV_TQ3;
        int32_t agree = 0;
        double g = greedy_tq(m, kvs[k].kv, 64, kvs[k].bound, free_run, &agree);

        printf("default model, %s KV: emulated vs cpu NMSE %.3g; 64 greedy tokens (%s): %d "
               "agree, NMSE %.3g\n",
               kvs[k].name, vs_cpu_kq_margin(m, kvs[k].kv, 1, kvs[k].bound, TQ_MARGIN),
               free_run ? "free-running" : "fed the cpu's", agree, g);
        ck_assert_int_ge(agree, free_run ? 64 : 60);
    }
    mdl_model_destroy(m);
}
END_TEST

/* ---- attention sinks + rolling window (KV_OP_SHIFT) ------------------------------- */

/* One-token prefills of 16 other sequences (blocks from the pool, given
 * back with DROP): with 14 residual slots the stream's partial tail,
 * written least recently, is flushed into codes. */
static void
stream_fillers(emu_side_t *ref, emu_side_t *got, emu_cmp_t *c, int32_t *free_blk, int32_t *n_free)
{
    kv_op_t drops[16];

    for (int32_t f = 0; f < 16; f++) {
        int32_t blk = free_blk[--*n_free], tok = 3 + f, pos = 0, slot = blk * BS;
        int32_t qs[2] = {0, 1}, ctx = 1, row = 0, bt[MAXB] = {blk};
        mdl_batch_t b = {.n_tokens = 1,
                         .tokens = &tok,
                         .positions = &pos,
                         .slot_mapping = &slot,
                         .n_seqs = 1,
                         .query_start = qs,
                         .context_len = &ctx,
                         .block_tables = bt,
                         .max_blocks = MAXB,
                         .logits_rows = &row,
                         .n_logits = 1};
        float *lr = xmalloc(sizeof(float) * (size_t)c->vocab);

        memcpy(lr, emu_side_forward(ref, &b), sizeof(float) * (size_t)c->vocab);
        emu_compare(c, lr, emu_side_forward(got, &b), 1);
        free(lr);
        drops[f] = (kv_op_t){KV_OP_DROP, blk, blk};
    }
    both_kv(ref, got, drops, 16);
    for (int32_t f = 15; f >= 0; f--) {
        free_blk[(*n_free)++] = drops[f].src;
    }
}

/* The whole sequence swapped out and back in to other blocks, then block
 * 1 copied (copy-on-write) to a fresh one: pending shifts and the tail's
 * slot move with the blocks. Old blocks are dropped and go back. */
static void
stream_move(emu_side_t *ref, emu_side_t *got, int32_t *table, int32_t n_blocks, int32_t *free_blk,
            int32_t *n_free)
{
    kv_op_t ops[4 * MAXB + 2];
    int32_t n = 0, old[MAXB];

    for (int32_t i = 0; i < n_blocks; i++) {
        old[i] = table[i];
        ops[n++] = (kv_op_t){KV_OP_SWAP_OUT, table[i], i};
        ops[n++] = (kv_op_t){KV_OP_DROP, table[i], table[i]};
    }
    for (int32_t i = 0; i < n_blocks; i++) {
        table[i] = free_blk[--*n_free];
        ops[n++] = (kv_op_t){KV_OP_SWAP_IN, i, table[i]};
        ops[n++] = (kv_op_t){KV_OP_DROP_SWAP, i, i};
    }
    for (int32_t i = 0; i < n_blocks; i++) {
        free_blk[(*n_free)++] = old[i];
    }
    old[0] = table[1];
    table[1] = free_blk[--*n_free];
    ops[n++] = (kv_op_t){KV_OP_COPY, old[0], table[1]};
    ops[n++] = (kv_op_t){KV_OP_DROP, old[0], old[0]};
    free_blk[(*n_free)++] = old[0];
    both_kv(ref, got, ops, n);
}

/* This test hands out its own block ids (like test_forward.c), so it plans
 * the evictions of blockmgr's bm_seq_evict() on its own table: before
 * n_incoming tokens, a sequence of *kv_len > sink + window tokens loses the
 * fewest whole blocks after the sinks that bring it to <= sink + window
 * (their ids to evicted[], the count is the result); every later block
 * gets a KV_OP_SHIFT into ops[] (*n_ops += count) and the table closes
 * the gap. */
static int32_t
plan_evict(const mdl_kv_policy_t *p, int32_t block_size, int32_t *table, int32_t *n_blocks,
           int32_t *kv_len, int32_t *evicted, kv_op_t *ops, int32_t *n_ops)
{
    int32_t first = p->sink / block_size, e;

    if (p->window <= 0 || *kv_len <= p->sink + p->window) {
        return 0;
    }
    e = (*kv_len - p->sink - p->window) / block_size;
    if (e <= 0) {
        return 0;
    }
    for (int32_t i = 0; i < e; i++) {
        evicted[i] = table[first + i];
    }
    for (int32_t i = first + e; i < *n_blocks; i++) {
        ops[(*n_ops)++] = (kv_op_t){.kind = KV_OP_SHIFT, .src = table[i], .dst = e * block_size};
        table[i - e] = table[i];
    }
    *n_blocks -= e;
    *kv_len -= e * block_size;
    return e;
}

/* One sequence streamed 5x past sink + window (sink 1 block, window 4
 * blocks) in steps of 1 to 7 tokens, with the evictions and SHIFT ops of
 * plan_evict() run on both sides: kept blocks (full ones, and
 * the partial tail with its residual slot) are re-rotated again and again,
 * quantized blocks through their pending shift (attention rotates the
 * query), 16-bit ones in place. Midway the tail is flushed into codes by
 * other sequences' writes, shifted while it has no slot and written again
 * (its dequantized rows take the shift); later the sequence is swapped out
 * and in and a block copied (shifts carried). The emulated rank at T = tp
 * against the CPU backend with the same KV dtype; every step's last row
 * compared. */
static double
stream_script(const mdl_model_t *m, mdl_kv_dtype_t kv, int32_t tp, double bound)
{
    static const int32_t chunks[] = {7, 1, 1, 3, 1, 5, 1, 1, 2, 6, 1, 4};
    const mdl_kv_policy_t pol = {.sink = BS, .window = 4 * BS};
    const int32_t total = 5 * (BS + 4 * BS);
    char err[256];
    mdl_runtime_config_t rc = script_config(1), rct = script_config(tp);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = bound,
               .vocab = m->cfg.vocab_size,
               .margin = kv == MDL_KV_TQ3 || kv == MDL_KV_TQ4 ? TQ_MARGIN : 0.0f};
    int32_t table[MAXB], n_blocks = 0, kv_len = 0, fed = 0, free_blk[NBLK], n_free = 0;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)total);
    int64_t evicted = 0, shifts = 0;

    int32_t flushed = -1, filled = -1, moved = 0;

    rc.kv_dtype = kv;
    rct.kv_dtype = kv;
    rc.max_num_batched_tokens = rct.max_num_batched_tokens = 8; /* 14 residual slots */
    rc.max_num_seqs = rct.max_num_seqs = 2;
    ck_assert_msg(mdl_runtime_create(m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(m, &rct, KN_DT_F16);
    synth_rs = 0x5171ULL + (uint64_t)kv;
    for (int32_t i = 0; i < total; i++) {
        ids[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(c.vocab - 3));
    }
    for (int32_t b = NBLK - 1; b >= 1; b--) {
        free_blk[n_free++] = b;
    }
    for (int32_t k = 0; fed < total; k++) {
        int32_t n = chunks[k % (int32_t)(sizeof(chunks) / sizeof(chunks[0]))];
        int32_t ev[MAXB], n_ops = 0, n_ev;
        kv_op_t ops[MAXB];

        n = n < total - fed ? n : total - fed;
        n_ev = plan_evict(&pol, BS, table, &n_blocks, &kv_len, ev, ops, &n_ops);
        for (int32_t i = 0; i < n_ev; i++) {
            free_blk[n_free++] = ev[i];
        }
        evicted += n_ev;
        shifts += n_ops;
        if (n_ops > 0) {
            both_kv(&ref, &got, ops, n_ops);
        }
        if (flushed >= 0) { /* the flushed tail: codes, and now a pending shift */
            const mdl_dev_kq_tier_t *t = &got.dev->fw[0].kqt[0];

            if (t->n_blocks > 0) {
                ck_assert(t->sl.slot_of[flushed] < 0 && t->qv[flushed]);
                ck_assert_int_gt(t->shift[flushed], 0);
            }
            ck_assert_int_eq(table[n_blocks - 1], flushed);
            flushed = -1;
        }
        while (n_blocks * BS < kv_len + n) {
            ck_assert_int_gt(n_free, 0);
            ck_assert_int_lt(n_blocks, MAXB);
            table[n_blocks++] = free_blk[--n_free];
        }
        int32_t tok[8], pos[8], slot[8], qs[2] = {0, n}, ctx = kv_len + n, bt[MAXB] = {0};
        int32_t row = n - 1;

        memcpy(bt, table, sizeof(int32_t) * (size_t)n_blocks);
        for (int32_t i = 0; i < n; i++) {
            tok[i] = ids[fed + i];
            pos[i] = kv_len + i;
            slot[i] = table[(kv_len + i) / BS] * BS + (kv_len + i) % BS;
        }
        mdl_batch_t b = {.n_tokens = n,
                         .tokens = tok,
                         .positions = pos,
                         .slot_mapping = slot,
                         .n_seqs = 1,
                         .query_start = qs,
                         .context_len = &ctx,
                         .block_tables = bt,
                         .max_blocks = MAXB,
                         .logits_rows = &row,
                         .n_logits = 1};
        float *lr = xmalloc(sizeof(float) * (size_t)c.vocab);

        memcpy(lr, emu_side_forward(&ref, &b), sizeof(float) * (size_t)c.vocab);
        emu_compare(&c, lr, emu_side_forward(&got, &b), 1);
        free(lr);
        kv_len += n;
        fed += n;
        if (filled < 0 && k >= 15 && kv_len - pol.sink - pol.window >= BS && kv_len % BS != 0) {
            /* The next step evicts and shifts the partial tail (checked). */
            stream_fillers(&ref, &got, &c, free_blk, &n_free);
            flushed = filled = table[n_blocks - 1];
        }
        if (k == 30) {
            stream_move(&ref, &got, table, n_blocks, free_blk, &n_free);
            moved = 1;
        }
    }
    ck_assert(moved && filled >= 0);
    ck_assert_int_ge(evicted, 16); /* the script really streams */
    ck_assert_int_ge(shifts, 40);
    if (kv >= MDL_KV_FP8_E4M3 && kv <= MDL_KV_INT4) { /* some shifts stay pending */
        const mdl_dev_kq_tier_t *t = &got.dev->fw[0].kqt[0];
        int32_t pending = 0;

        for (int32_t i = 0; i < n_blocks; i++) {
            pending += t->shift[table[i]] != 0;
        }
        ck_assert_int_gt(pending, 0);
    }
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    free(ids);
    return c.worst;
}

/* One run per loop index (each its own timeout); the sanitizer run
 * (KVSERVE_TEST_SCALE < 1) keeps f16 and int4 at T = 1. */
START_TEST(test_devemu_kv_policy)
{
    static const struct {
        mdl_kv_dtype_t kv;
        const char *name;
        double bound;
        int32_t tp;
    } runs[] = {{MDL_KV_F16, "f16", 2e-6, 1},
                {MDL_KV_INT4, "int4", 2e-4, 1},
                {MDL_KV_INT8, "int8", 2e-5, 1},
                {MDL_KV_INT4, "int4", 2e-4, 2},
                {MDL_KV_F16, "f16", 2e-6, 2},
                {MDL_KV_TQ3, "tq3", 3e-2, 1},
                {MDL_KV_TQ4, "tq4", 3e-2, 2}};
    const char *scale = getenv("KVSERVE_TEST_SCALE");
    synth_t s;

    if (_i >= 2 && scale != NULL && atof(scale) < 1.0) {
        printf("kv policy run %d skipped at KVSERVE_TEST_SCALE=%s\n", _i, scale);
        return;
    }
    if (runs[_i].kv == MDL_KV_TQ3 || runs[_i].kv == MDL_KV_TQ4) {
        /* tq: head_dim a power of two >= 16 */
        synth_init_shape(&s, 8, 2, 1, 16, 40, 64, SYNTH_SEED(2));
    } else {
        synth_init(&s, 8, 2, 1);
    }
    s.m.cfg.rope_scaling = MDL_ROPE_LINEAR; /* the shift uses the scaled frequencies */
    s.m.cfg.rope_factor = 2.0f;
    double worst = stream_script(&s.m, runs[_i].kv, runs[_i].tp, runs[_i].bound);

    printf("synthetic 8/2 heads, %s KV, T=%d, sink 8 + window 32 streamed 200 tokens: "
           "emulated vs cpu NMSE %.3g\n",
           runs[_i].name, runs[_i].tp, worst);
    synth_fini(&s);
}
END_TEST

/* ---- weights in their file type ------------------------------------------------------ */

/* Every matrix of s quantized to t (kn_quant_row, row by row) into *buf:
 * the model a file of that type loads to. */
static void
synth_quantize(synth_t *s, kn_wtype_t t, uint8_t **buf)
{
    const mdl_config_t *c = &s->m.cfg;
    kn_weight_t *ws[2 + 7 * 8];
    size_t n = 0, total = 0, at = 0;

    ws[n++] = &s->m.tok_embd;
    ws[n++] = &s->m.lm_head;
    for (int32_t l = 0; l < c->n_layers; l++) {
        mdl_layer_t *L = &s->m.layers[l];

        ws[n++] = &L->wq;
        ws[n++] = &L->wk;
        ws[n++] = &L->wv;
        ws[n++] = &L->wo;
        ws[n++] = &L->w_gate;
        ws[n++] = &L->w_up;
        ws[n++] = &L->w_down;
    }
    for (size_t i = 0; i < n; i++) {
        total += kn_wtype_row_bytes(t, ws[i]->cols) * (size_t)ws[i]->rows;
    }
    *buf = xmalloc(total);
    for (size_t i = 0; i < n; i++) {
        kn_weight_t *w = ws[i];
        size_t rb = kn_wtype_row_bytes(t, w->cols);

        ck_assert_uint_gt(rb, 0);
        for (int32_t r = 0; r < w->rows; r++) {
            kn_quant_row(t, (const float *)w->data + (size_t)r * w->cols, *buf + at + r * rb,
                         w->cols);
        }
        *w = (kn_weight_t){t, *buf + at, rb, w->rows, w->cols};
        at += rb * (size_t)w->rows;
    }
}

/* The matrices of a quantized s back in f32 (kn_dequant_row) into *buf. */
static void
synth_dequantize(synth_t *s, float **buf)
{
    const mdl_config_t *c = &s->m.cfg;
    kn_weight_t *ws[2 + 7 * 8];
    size_t n = 0, total = 0, at = 0;

    ws[n++] = &s->m.tok_embd;
    ws[n++] = &s->m.lm_head;
    for (int32_t l = 0; l < c->n_layers; l++) {
        mdl_layer_t *L = &s->m.layers[l];
        kn_weight_t *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};

        for (size_t i = 0; i < 7; i++) {
            ws[n++] = lw[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        total += (size_t)ws[i]->rows * (size_t)ws[i]->cols;
    }
    *buf = xmalloc(sizeof(float) * total);
    for (size_t i = 0; i < n; i++) {
        kn_weight_t *w = ws[i];
        float *dst = *buf + at;

        for (int32_t r = 0; r < w->rows; r++) {
            kn_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                           dst + (size_t)r * w->cols, w->cols);
        }
        *w = mdl_weight_f32(dst, w->rows, w->cols);
        at += (size_t)w->rows * (size_t)w->cols;
    }
}

/* The script on the CPU backend with model cm against an emulated rank
 * (T = 1, f16, staging cap) with model dm; returns the worst NMSE. */
static double
cpu_vs_dev(const mdl_model_t *cm, const mdl_model_t *dm, double bound, size_t cap)
{
    char err[256];
    mdl_runtime_config_t rc = script_config(1);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = bound, .vocab = cm->cfg.vocab_size};

    ck_assert_msg(mdl_runtime_create(cm, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create_opt(dm, &rc, KN_DT_F16, cap, 0);
    run_script(&ref, &got, &c);
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    return c.worst;
}

/* Whether two ranks of the same shard hold the same 16-bit weights. */
static int
same_weights(const mdl_dev_rank_t *a, const mdl_dev_rank_t *b)
{
    const mdl_config_t *c = &a->m->cfg;
    size_t dim = (size_t)c->dim, lq = (size_t)a->sh.n_q * c->head_dim;
    size_t lkv = (size_t)a->sh.n_kv * c->head_dim, nf = (size_t)a->sh.n_f;
    size_t V = (size_t)c->vocab_size;

    if (memcmp(a->embd, b->embd, 2 * V * dim) != 0 ||
        memcmp(a->out_norm, b->out_norm, 2 * dim) != 0 ||
        (a->rank == 0 && memcmp(a->lm_head, b->lm_head, 2 * V * dim) != 0)) {
        return 0;
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_dev_layer_t *x = &a->layers[l], *y = &b->layers[l];

        if (memcmp(x->attn_norm, y->attn_norm, 2 * dim) != 0 ||
            memcmp(x->ffn_norm, y->ffn_norm, 2 * dim) != 0 ||
            memcmp(x->wq, y->wq, 2 * lq * dim) != 0 || memcmp(x->wk, y->wk, 2 * lkv * dim) != 0 ||
            memcmp(x->wv, y->wv, 2 * lkv * dim) != 0 || memcmp(x->wo, y->wo, 2 * dim * lq) != 0 ||
            memcmp(x->w_gate, y->w_gate, 2 * nf * dim) != 0 ||
            memcmp(x->w_up, y->w_up, 2 * nf * dim) != 0 ||
            memcmp(x->w_down, y->w_down, 2 * dim * nf) != 0 ||
            (x->bq != NULL && (memcmp(x->bq, y->bq, 2 * lq) != 0 ||
                               memcmp(x->bk, y->bk, 2 * lkv) != 0 ||
                               memcmp(x->bv, y->bv, 2 * lkv) != 0))) {
            return 0;
        }
    }
    return 1;
}

/* A model in Q8_0 and in Q4_K (synthetic, 8/2 heads of 32, dim 256, FFN
 * 512, QKV biases), uploaded natively (raw blocks, dequantized by the
 * emulated kernel) and through the host path:
 *   - the device weights are the same bits, at T = 1 and 2, f16 and bf16
 *     (T = 2 cuts wo at 128 columns: Q4_K's 256-blocks take the host
 *     fallback there, Q8_0's 32-blocks do not);
 *   - the staging buffers stay within wstage_cap (16 KiB here: many
 *     chunks per matrix); by default (64 MiB) they are the largest
 *     matrix's bytes in its file type, never an f32 copy of it;
 *   - the whole script gives the host path's logits exactly (f16);
 *   - against the CPU backend on the same weights dequantized to f32 the
 *     f16 rank stays within the bound of the f32 model before
 *     quantization (2e-5: this wider shape measures ~1e-5 where the
 *     small models measure < 2e-6); against the CPU backend on the Q
 *     weights, which multiplies them by 8-bit activations
 *     (kernels/cpu/kn_quant.h), the difference is the activations'
 *     rounding (measured ~2e-3 here, bound 1e-2). */
START_TEST(test_devemu_native_weights)
{
    static const kn_wtype_t types[] = {KN_W_Q8_0, KN_W_Q4_K};
    const size_t cap = 16 << 10;
    double e_orig = 0.0;

    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        kn_wtype_t t = types[k];
        synth_t s;
        uint8_t *qbuf;

        synth_init_shape(&s, 8, 2, 1, 32, 256, 512, SYNTH_SEED(2));
        if (k == 0) { /* the f32 model (the same for every type) */
            e_orig = cpu_vs_dev(&s.m, &s.m, 2e-5, 0);
        }
        synth_quantize(&s, t, &qbuf);
        size_t big = kn_wtype_row_bytes(t, 256) * 512; /* w_gate / w_up, the largest */
        size_t staged = 0;

        for (int32_t tp = 1; tp <= 2; tp++) {
            for (int d = 0; d < 2; d++) {
                kn_dt_t dt = d == 0 ? KN_DT_F16 : KN_DT_BF16;
                mdl_runtime_config_t rc = script_config(tp);
                emu_dev_t *nat = emu_dev_create_opt(&s.m, &rc, dt, cap, 0);
                emu_dev_t *host = emu_dev_create_opt(&s.m, &rc, dt, cap, 1);
                emu_dev_t *dflt = emu_dev_create_opt(&s.m, &rc, dt, 0, 0);

                for (int32_t r = 0; r < tp; r++) {
                    /* Per layer 2 norms, 7 matrices, 3 biases; embd, out_norm, lm_head. */
                    int32_t n_up = 2 * (2 + 7 + 3) + 2 + (r == 0);

                    ck_assert(same_weights(&nat->fw[r], &host->fw[r]));
                    ck_assert(same_weights(&nat->fw[r], &dflt->fw[r]));
                    ck_assert_uint_le(nat->fw[r].wstage_bytes, cap);
                    ck_assert_uint_gt(nat->fw[r].wstage_bytes, cap / 2);
                    /* Q4_K at T = 2: wo's 16-bit rows (256 x 128) outgrow w_gate's blocks. */
                    ck_assert_uint_eq(dflt->fw[r].wstage_bytes,
                                      tp == 2 && t == KN_W_Q4_K ? 2 * 256 * 128 : big / (size_t)tp);
                    ck_assert_ptr_null(nat->fw[r].wst_host);
                    ck_assert_int_eq(host->fw[r].n_host_uploads, n_up);
                    /* T = 2, Q4_K: wo (128 columns a rank) of both layers. */
                    ck_assert_int_eq(nat->fw[r].n_host_uploads,
                                     tp == 2 && t == KN_W_Q4_K ? 2 : 0);
                }
                emu_dev_destroy(dflt);
                staged = tp == 1 ? nat->fw[0].wstage_bytes : staged;
                if (dt == KN_DT_F16) {
                    emu_side_t ref = {.dev = host}, got = {.dev = nat};
                    emu_cmp_t c = {.nmse_bound = 1e-30, .vocab = s.m.cfg.vocab_size};

                    run_script(&ref, &got, &c);
                    ck_assert(c.worst == 0.0);
                }
                emu_dev_destroy(nat);
                emu_dev_destroy(host);
            }
        }
        /* The CPU backend on the dequantized weights (f32), and on the Q
         * weights themselves. */
        synth_t f = s;
        float *fbuf;
        double e_f32 = 0.0, e_q = 0.0;

        f.m.layers = xmalloc(sizeof(mdl_layer_t) * (size_t)s.m.cfg.n_layers);
        memcpy(f.m.layers, s.m.layers, sizeof(mdl_layer_t) * (size_t)s.m.cfg.n_layers);
        synth_dequantize(&f, &fbuf);
        e_f32 = cpu_vs_dev(&f.m, &s.m, 2e-5, cap);
        e_q = cpu_vs_dev(&s.m, &s.m, 1e-2, cap);
        printf("synthetic 8/2 heads, %s weights: staging %zu B (cap %zu), %zu B by default; "
               "device matrices = host path's; emulated (f16) vs cpu on the dequantized f32 "
               "weights NMSE %.3g (the f32 model before quantization: %.3g), vs cpu on the %s "
               "weights (8-bit activations) NMSE %.3g\n",
               kn_wtype_name(t), staged, cap, big, e_f32, e_orig, kn_wtype_name(t), e_q);
        free(fbuf);
        free(f.m.layers);
        free(qbuf);
        synth_fini(&s);
    }
}
END_TEST

/* ---- decode graphs (model/dev_graph.c) ----------------------------------------------- */

#define GNS 6 /* sequences; max_num_seqs: buckets 1, 2, 4, 6 */

typedef struct gseq {
    int32_t ids[MAXB * BS];
    int32_t done;
    int32_t table[MAXB];
} gseq_t;

/* Whether the KV pools of two emulated T = 1 ranks hold the same bytes. */
static int
same_kv(const emu_dev_t *a, const emu_dev_t *b)
{
    const mdl_dev_rank_t *x = &a->fw[0], *y = &b->fw[0];
    size_t bytes = 2 * (size_t)x->m->cfg.n_layers * (size_t)x->rc.num_blocks * x->blk_bytes;

    return memcmp(x->kv, y->kv, bytes) == 0;
}

/* One step: sequences order[0..n_order) in that order, n_new[k] new tokens
 * for order[k]; logits of ref and got compared; with kv_ref set, got's KV
 * pool must equal kv_ref's after the step (a padded row writes nothing). */
static void
gstep(emu_side_t *ref, emu_side_t *got, emu_cmp_t *c, gseq_t *seqs, const int32_t *order,
      int32_t n_order, const int32_t *n_new, emu_dev_t *kv_ref)
{
    tb_batch_t t;

    tb_begin(&t, BS, MAXB);
    for (int32_t k = 0; k < n_order; k++) {
        gseq_t *q = &seqs[order[k]];

        tb_add(&t, q->ids, &q->done, n_new[k], q->table, 1);
    }
    const mdl_batch_t *b = tb_end(&t);
    float *lr = xmalloc(sizeof(float) * (size_t)n_order * c->vocab);

    memcpy(lr, emu_side_forward(ref, b), sizeof(float) * (size_t)n_order * c->vocab);
    emu_compare(c, lr, emu_side_forward(got, b), n_order);
    free(lr);
    if (kv_ref != NULL) {
        ck_assert_msg(same_kv(kv_ref, got->dev), "KV pools differ after a %d-sequence step",
                      n_order);
    }
}

/* Decode steps of 1 to 6 sequences in changing orders (buckets 1, 2, 4, 6;
 * 3 and 5 sequences padded), each bucket used again with other tokens,
 * positions, lengths and tables, also after copy / swap ops moved two
 * sequences to other blocks and the old blocks were overwritten; a mixed
 * step (prefill chunk + decode) in between runs eagerly. Returns the
 * decode steps run. */
static int32_t
graph_script(emu_side_t *ref, emu_side_t *got, emu_cmp_t *c, emu_dev_t *kv_ref)
{
    gseq_t seqs[GNS];
    static const int32_t pre[GNS] = {5, 3, 9, 1, 7, 2};
    static const int32_t ones[GNS] = {1, 1, 1, 1, 1, 1};
    int32_t all[GNS] = {0, 1, 2, 3, 4, 5}, next_blk = 1 + 6 * GNS, n_dec = 0;
    kv_op_t ops[4 * MAXB];
    int32_t n_ops = 0;

    synth_rs = 0x6a09e667ULL;
    for (int32_t s = 0; s < GNS; s++) {
        memset(&seqs[s], 0, sizeof(seqs[s]));
        for (int32_t i = 0; i < MAXB * BS; i++) {
            seqs[s].ids[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(c->vocab - 3));
        }
        for (int32_t b = 0; b < 6; b++) {
            seqs[s].table[b] = 1 + b * GNS + s;
        }
    }
    gstep(ref, got, c, seqs, all, GNS, pre, kv_ref); /* prefill: eager */

    static const int32_t dec[][GNS + 1] = {
        /* n, then the sequences in batch order */
        {1, 0}, {1, 1}, {2, 0, 2}, {3, 3, 4, 5}, {2, 1, 2}, {5, 0, 1, 2, 3, 4},
        {6, 5, 4, 3, 2, 1, 0}, {3, 5, 0, 3}, {1, 4}, {2, 3, 1},
    };
    for (size_t i = 0; i < sizeof(dec) / sizeof(dec[0]); i++) {
        gstep(ref, got, c, seqs, dec[i] + 1, dec[i][0], ones, kv_ref);
        n_dec++;
    }

    /* Sequence 0 copied to fresh blocks, 1 swapped out, its old blocks
     * overwritten with 2's first block, and swapped back to fresh blocks. */
    for (int32_t b = 0; b * BS < seqs[0].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[0].table[b], next_blk};
        seqs[0].table[b] = next_blk++;
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_OUT, seqs[1].table[b], b};
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[2].table[0], seqs[1].table[b]};
    }
    both_kv(ref, got, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_IN, b, next_blk};
        seqs[1].table[b] = next_blk++;
    }
    both_kv(ref, got, ops, n_ops);
    if (kv_ref != NULL) {
        ck_assert(same_kv(kv_ref, got->dev));
    }

    static const int32_t after[][GNS + 1] = {
        {2, 0, 1}, {4, 1, 0, 2, 3}, {1, 1}, {6, 0, 1, 2, 3, 4, 5}, {3, 4, 1, 0},
    };
    for (size_t i = 0; i < sizeof(after) / sizeof(after[0]); i++) {
        gstep(ref, got, c, seqs, after[i] + 1, after[i][0], ones, kv_ref);
        n_dec++;
        if (i == 1) { /* a mixed step: a chunk of 3 for sequence 2 and a decode for 0 */
            int32_t o[2] = {2, 0}, nn[2] = {3, 1};

            gstep(ref, got, c, seqs, o, 2, nn, kv_ref);
        }
    }
    return n_dec;
}

static mdl_runtime_config_t
graph_config(int32_t tp, int graphs)
{
    mdl_runtime_config_t rc = script_config(tp);

    rc.max_num_seqs = GNS;
    rc.cuda_graphs = graphs;
    return rc;
}

/* Graphs on (emulated, T = tp) against eager (emulated, T = 1): with tp 1
 * the logits and KV pools are the same bits; each bucket recorded once
 * after its first step, every later decode step replayed (no kernel or
 * GEMM launched from the host: one graph launch, the staging upload, the
 * logits copy, one sync). fail_record: every recording fails, decode
 * steps still padded and correct, none replayed. */
static void
graphs_vs_eager(const mdl_model_t *m, int32_t tp, int fail_record, const char *what)
{
    mdl_runtime_config_t r_eager = graph_config(1, 0), r_graph = graph_config(tp, 1);
    emu_side_t ref = {0}, got = {0};
    emu_cmp_t c = {.nmse_bound = tp == 1 ? 1e-30 : 1e-5, .vocab = m->cfg.vocab_size};
    int32_t n_dec;

    ref.dev = emu_dev_create(m, &r_eager, KN_DT_F16);
    got.dev = emu_dev_create(m, &r_graph, KN_DT_F16);
    for (int32_t r = 0; r < tp; r++) {
        got.dev->ctx[r].fail_record = fail_record;
    }
    ck_assert(ref.dev->fw[0].graphs_off);
    ck_assert(!got.dev->fw[0].graphs_off);
    ck_assert_int_eq(got.dev->fw[0].n_buckets, 4);
    ck_assert_int_eq(got.dev->fw[0].graph_rows[2], 4);
    ck_assert_int_eq(got.dev->fw[0].graph_rows[3], GNS);
    n_dec = graph_script(&ref, &got, &c, tp == 1 ? ref.dev : NULL);
    if (tp == 1) {
        ck_assert(c.worst == 0.0);
    }
    for (int32_t r = 0; r < tp; r++) {
        const mdl_dev_rank_t *rk = &got.dev->fw[r];
        const emu_ctx_t *x = &got.dev->ctx[r];

        ck_assert_int_eq(x->n_unsafe, 0);
        ck_assert_int_eq(rk->graph_failed, fail_record);
        ck_assert_int_eq(rk->n_graph_captures, fail_record ? 0 : 4);
        ck_assert_int_eq(rk->n_graph_steps, fail_record ? 0 : n_dec - 4);
        ck_assert_int_eq(x->cnt.graph_launches, rk->n_graph_steps);
        /* prefill, mixed step, and the decode steps not replayed */
        ck_assert_int_eq(rk->n_eager_steps, 2 + n_dec - rk->n_graph_steps);
    }
    printf("%s, graphs on%s, T=%d vs eager T=1: %d decode steps, %lld replayed, worst NMSE %.3g\n",
           what, fail_record ? " (recording fails)" : "", tp, n_dec,
           (long long)got.dev->fw[0].n_graph_steps, c.worst);
    emu_dev_destroy(ref.dev);
    emu_dev_destroy(got.dev);
}

/* Host-side work per decode step of one sequence, eager and replayed:
 * what each path asks of the device, counted by the emulator. */
static void
graph_counts(const mdl_model_t *m)
{
    mdl_runtime_config_t rc = graph_config(1, 1);
    emu_dev_t *e = emu_dev_create(m, &rc, KN_DT_F16);
    emu_side_t s = {.dev = e};
    gseq_t seq;
    const int32_t L = m->cfg.n_layers;
    const int bias = m->layers[0].bq != NULL;
    emu_counts_t d[3];

    memset(&seq, 0, sizeof(seq));
    for (int32_t i = 0; i < MAXB * BS; i++) {
        seq.ids[i] = 3 + i % (m->cfg.vocab_size - 3);
    }
    for (int32_t b = 0; b < MAXB; b++) {
        seq.table[b] = 1 + b;
    }
    for (int k = 0; k < 3; k++) { /* eager (then recorded), replayed, replayed */
        emu_counts_t before = e->ctx[0].cnt;
        int32_t pos = k, slot = 1 * BS + k, qs[2] = {0, 1}, ctx = k + 1, row = 0;
        int32_t tok = seq.ids[k];
        mdl_batch_t b = {.n_tokens = 1,
                         .tokens = &tok,
                         .positions = &pos,
                         .slot_mapping = &slot,
                         .n_seqs = 1,
                         .query_start = qs,
                         .context_len = &ctx,
                         .block_tables = seq.table,
                         .max_blocks = MAXB,
                         .logits_rows = &row,
                         .n_logits = 1};

        emu_side_forward(&s, &b);
        d[k].kernels = e->ctx[0].cnt.kernels - before.kernels;
        d[k].gemms = e->ctx[0].cnt.gemms - before.gemms;
        d[k].copies = e->ctx[0].cnt.copies - before.copies;
        d[k].syncs = e->ctx[0].cnt.syncs - before.syncs;
        d[k].graph_launches = e->ctx[0].cnt.graph_launches - before.graph_launches;
    }
    /* Eager: embed, per layer 6 kernels (2 norms, RoPE, KV write,
     * attention, SiLU x up; + the bias) and 4 GEMMs (qkv, o with the
     * residual, gate|up, down with the residual), gather + final norm, the
     * LM head; the staging upload and the logits copy. */
    ck_assert_int_eq(d[0].kernels, 1 + L * (6 + bias) + 2);
    ck_assert_int_eq(d[0].gemms, 4 * L + 1);
    ck_assert_int_eq(d[0].copies, 2);
    ck_assert_int_eq(d[0].syncs, 1);
    for (int k = 1; k < 3; k++) {
        ck_assert_int_eq(d[k].kernels, 0);
        ck_assert_int_eq(d[k].gemms, 0);
        ck_assert_int_eq(d[k].copies, 2);
        ck_assert_int_eq(d[k].syncs, 1);
        ck_assert_int_eq(d[k].graph_launches, 1);
    }
    printf("decode step of 1 sequence, %d layers%s: eager %lld kernels + %lld GEMMs + %lld "
           "copies + %lld sync; replayed 1 graph launch + %lld copies + %lld sync\n",
           L, bias ? " (QKV bias)" : "", (long long)d[0].kernels, (long long)d[0].gemms,
           (long long)d[0].copies, (long long)d[0].syncs, (long long)d[1].copies,
           (long long)d[1].syncs);
    emu_dev_destroy(e);
}

START_TEST(test_devemu_graphs)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    const char *scale = getenv("KVSERVE_TEST_SCALE");
    synth_t s;

    synth_init(&s, 4, 1, 1);
    graphs_vs_eager(&s.m, 1, 0, "synthetic 4/1 heads + bias");
    graphs_vs_eager(&s.m, 1, 1, "synthetic 4/1 heads + bias");
    graph_counts(&s.m);
    synth_fini(&s);
    synth_init(&s, 8, 2, 0);
    graphs_vs_eager(&s.m, 1, 0, "synthetic 8/2 heads");
    graphs_vs_eager(&s.m, 2, 0, "synthetic 8/2 heads");
    graph_counts(&s.m);
    {
        /* Quantized KV keeps every step eager. */
        mdl_runtime_config_t rc = graph_config(1, 1);
        emu_dev_t *e;

        rc.kv_dtype = MDL_KV_INT8;
        e = emu_dev_create(&s.m, &rc, KN_DT_F16);
        ck_assert(e->fw[0].graphs_off);
        emu_dev_destroy(e);
    }
    synth_fini(&s);
    if (scale != NULL && atof(scale) < 1.0) {
        printf("default model skipped at KVSERVE_TEST_SCALE=%s\n", scale);
        return;
    }
    mdl_model_t *m;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    graphs_vs_eager(m, 1, 0, "default model");
    graph_counts(m);
    mdl_model_destroy(m);
}
END_TEST

/* Graphs on, emulated, against the CPU backend through the same script. */
START_TEST(test_devemu_graphs_vs_cpu)
{
    mdl_runtime_config_t rc = graph_config(1, 1);
    emu_side_t ref = {0}, got = {0};
    char err[256];
    synth_t s;

    synth_init(&s, 8, 2, 1);
    emu_cmp_t c = {.nmse_bound = 2e-6, .vocab = s.m.cfg.vocab_size};

    ck_assert_msg(mdl_runtime_create(&s.m, &rc, &ref.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    got.dev = emu_dev_create(&s.m, &rc, KN_DT_F16);
    int32_t n_dec = graph_script(&ref, &got, &c, NULL);

    ck_assert_int_eq(got.dev->fw[0].n_graph_steps, n_dec - 4);
    /* 2 KV heads and at most GNS decodes: every decode step's attention
     * is split-K (32 splits, mostly empty at these contexts), replayed
     * ones included, n_layers per step. */
    ck_assert_int_ge(got.dev->ctx[0].n_split_attn, (int64_t)n_dec * s.m.cfg.n_layers);
    printf("synthetic 8/2 heads + bias, graphs on vs cpu: worst NMSE %.3g\n", c.worst);
    mdl_runtime_destroy(ref.cpu);
    emu_dev_destroy(got.dev);
    synth_fini(&s);
}
END_TEST

Suite *
cuda_devemu_suite(void)
{
    Suite *s = suite_create("cuda_devemu");
    TCase *tc = tcase_create("forward");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_devemu_synthetic);
    tcase_add_test(tc, test_devemu_default_model);
    tcase_add_test(tc, test_devemu_native_weights);
    suite_add_tcase(s, tc);
    TCase *tq = tcase_create("kv_quant");

    tcase_set_timeout(tq, 240);
    tcase_add_test(tq, test_devemu_kv_quant_budget);
    tcase_add_test(tq, test_devemu_kv_quant);
    suite_add_tcase(s, tq);

    TCase *tt = tcase_create("kv_tq");

    tcase_set_timeout(tt, 240);
    tcase_add_test(tt, test_devemu_kv_tq);
    suite_add_tcase(s, tt);
    TCase *tp = tcase_create("kv_policy");

    tcase_set_timeout(tp, 240);
    tcase_add_loop_test(tp, test_devemu_kv_policy, 0, 7);
    suite_add_tcase(s, tp);
    TCase *tg = tcase_create("graphs");

    tcase_set_timeout(tg, 300);
    tcase_add_test(tg, test_devemu_graphs);
    tcase_add_test(tg, test_devemu_graphs_vs_cpu);
    suite_add_tcase(s, tg);
    return s;
}
