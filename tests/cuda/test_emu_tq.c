/* test_emu_tq.c - the tq3 / tq4 CUDA bodies (kn_tq_write_body,
 * kn_tq_attn_body of kernels/cuda/kn_cuda_body.h) under the thread-block
 * emulator against the CPU store (kernels/cpu/kv_quant.h with a tq
 * layout, through tq_ref.h): the emulated write produces the CPU's block bytes bit for bit
 * (signs and sketch from an independent kn_tq_create(), so the seeding is
 * checked too), and the emulated attention over those bytes equals
 * kn_kvq_attention() up to f32 summation order (NMSE < 1e-10), for two
 * head sizes, GQA, a prefill chunk reading its own block, a decode row,
 * scattered block tables and a sliding window; the SHIFT body
 * (kn_tq_shift_body) re-encodes a block's rotated keys into the CPU
 * store's bytes.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kv_tq.h"
#include "tests/cuda/kn_emu.h"
#include "tests/cuda/tq_ref.h"

static uint64_t tq_rng = 0x5851f42d4c957f2dull;

static float
tq_frand(void)
{
    tq_rng ^= tq_rng << 13;
    tq_rng ^= tq_rng >> 7;
    tq_rng ^= tq_rng << 17;
    return (float)((tq_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void
run_tq_write(const kn_thr_t *t, float *smem, const void *a)
{
    kn_tq_write_body(t, smem, a);
}

static void
run_tq_shift(const kn_thr_t *t, float *smem, const void *a)
{
    kn_tq_shift_body(t, smem, a);
}

static void
run_tq_attn(const kn_thr_t *t, float *smem, const void *a)
{
    kn_tq_attn_body(t, smem, a);
}

START_TEST(test_tq_bodies)
{
    enum { NKV = 2, GROUP = 3, BS = 16, NB = 12, NL = 2, LAYER = 1, CTX0 = 45, CTX1 = 20 };
    const int32_t hd = _i % 2 == 0 ? 32 : 64, window = _i >= 2 ? 24 : 0;
    const int bits = _i % 2 == 0 ? 3 : 4;
    const int32_t n_ctx = CTX0 + CTX1, nh = NKV * GROUP;
    struct {
        size_t k_stride, v_stride;
    } L;
    tq_ref_t *st;
    kn_tq_t *tq;
    float *K = xmalloc(sizeof(float) * (size_t)n_ctx * NKV * hd);
    float *V = xmalloc(sizeof(float) * (size_t)n_ctx * NKV * hd);
    int32_t slot[CTX0 + CTX1], bt[2][4] = {{7, 2, 9, 4}, {0, 11, 5, 3}};

    st = tq_ref_create(bits, NL, NKV, BS, hd, NB, &L.k_stride, &L.v_stride);
    ck_assert_ptr_nonnull(st);
    tq = kn_tq_create(bits, NL, NKV, hd);
    for (size_t i = 0; i < (size_t)n_ctx * NKV * hd; i++) {
        K[i] = tq_frand() * (i % 5 == 1 ? 4.0f : 1.0f);
        V[i] = tq_frand();
    }
    for (int32_t j = 0; j < n_ctx; j++) {
        int32_t s = j < CTX0 ? 0 : 1, p = s == 0 ? j : j - CTX0;

        slot[j] = bt[s][p / BS] * BS + p % BS;
    }
    slot[3] = -1; /* a skipped row stays zero in both */
    for (int32_t l = 0; l < NL; l++) {
        tq_ref_write(st, l, K, V, slot, n_ctx);
    }
    /* The emulated write of layer LAYER into zeroed regions. */
    uint8_t *kc = xcalloc((size_t)NB, L.k_stride), *vc = xcalloc((size_t)NB, L.v_stride);
    kn_tq_write_args_t wa = {
        .k = K, .v = V, .slot = slot, .kc = kc, .vc = vc,
        .sg = kn_tq_layer_signs(tq, LAYER), .S = kn_tq_layer_sketch(tq, LAYER),
        .k_stride = L.k_stride, .v_stride = L.v_stride,
        .n_kv = NKV, .hd = hd, .bs = BS, .bits = bits,
    };

    ck_assert_int_eq(kn_emu_launch(run_tq_write, &wa, n_ctx, NKV, 32, 0), 0);
    for (int32_t b = 0; b < NB; b++) {
        ck_assert_msg(memcmp(kc + (size_t)b * L.k_stride, tq_ref_block(st, LAYER, 0, b),
                             L.k_stride) == 0,
                      "tq%d hd %d: K block %d differs", bits, hd, b);
        ck_assert_msg(memcmp(vc + (size_t)b * L.v_stride, tq_ref_block(st, LAYER, 1, b),
                             L.v_stride) == 0,
                      "tq%d hd %d: V block %d differs", bits, hd, b);
    }
    /* Attention: 4 prefill rows of sequence 0 (its last block is its own)
     * and one decode row of sequence 1. */
    int32_t qs[3] = {0, 4, 5}, cl[2] = {CTX0, CTX1}, n_tok = 5;
    float *q = xmalloc(sizeof(float) * (size_t)n_tok * nh * hd);
    float *o_cpu = xmalloc(sizeof(float) * (size_t)n_tok * nh * hd);
    float *o_emu = xmalloc(sizeof(float) * (size_t)n_tok * nh * hd);

    for (size_t i = 0; i < (size_t)n_tok * nh * hd; i++) {
        q[i] = tq_frand();
    }
    kn_attn_args_t a = {
        .out = o_cpu, .q = q, .query_start = qs, .context_len = cl,
        .block_tables = &bt[0][0], .max_blocks = 4, .n_seqs = 2, .n_tok = n_tok,
        .n_heads = nh, .n_kv_heads = NKV, .head_dim = hd, .block_size = BS,
        .sliding_window = window, .scale = 1.0f / sqrtf((float)hd),
    };
    kn_tq_attn_args_t ea = {
        .out = o_emu, .q = q, .kc = kc, .vc = vc,
        .sg = wa.sg, .S = wa.S, .query_start = qs, .context_len = cl,
        .block_tables = &bt[0][0], .k_stride = L.k_stride, .v_stride = L.v_stride,
        .max_blocks = 4, .n_seqs = 2, .n_heads = nh, .n_kv = NKV, .hd = hd, .bs = BS,
        .bits = bits, .sliding_window = window, .scale = a.scale,
    };
    double num = 0.0, den = 0.0;

    tq_ref_attention(st, LAYER, &a);
    ck_assert_int_eq(kn_emu_launch(run_tq_attn, &ea, n_tok, NKV, 32, 0), 0);
    for (size_t i = 0; i < (size_t)n_tok * nh * hd; i++) {
        num += ((double)o_emu[i] - o_cpu[i]) * ((double)o_emu[i] - o_cpu[i]);
        den += (double)o_cpu[i] * o_cpu[i];
    }
    ck_assert_double_gt(den, 0.0);
    ck_assert_msg(num / den < 1e-10, "tq%d hd %d window %d: NMSE %g", bits, hd, window,
                  num / den);
    /* SHIFT of block 9 (sequence 0's third) by 37 positions: the emulated
     * decode-rotate-encode of every layer's keys equals the CPU store's. */
    {
        float inv_freq[KN_TQ_MAX_DIM / 2];
        size_t ls = (size_t)NB * (L.k_stride + L.v_stride);
        uint8_t *all = xcalloc((size_t)NL, ls);
        kn_tq_shift_args_t sa = {
            .kc = all, .layer_stride = ls, .k_stride = L.k_stride,
            .sg = kn_tq_layer_signs(tq, 0), .S = bits == 4 ? kn_tq_layer_sketch(tq, 0) : NULL,
            .inv_freq = inv_freq, .blk = 9, .n_kv = NKV, .hd = hd, .bs = BS, .bits = bits,
            .delta = 37,
        };

        for (int32_t i = 0; i < hd / 2; i++) {
            inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
        }
        for (int32_t l = 0; l < NL; l++) {
            memcpy(all + (size_t)l * ls + 9 * L.k_stride, tq_ref_block(st, l, 0, 9), L.k_stride);
        }
        ck_assert_int_eq(tq_ref_shift(st, inv_freq, 9, 37), 0);
        ck_assert_int_eq(kn_emu_launch(run_tq_shift, &sa, NKV, NL, 32, 0), 0);
        for (int32_t l = 0; l < NL; l++) {
            ck_assert_msg(memcmp(all + (size_t)l * ls + 9 * L.k_stride, tq_ref_block(st, l, 0, 9),
                                 L.k_stride) == 0,
                          "tq%d hd %d: shifted K block of layer %d differs", bits, hd, l);
        }
        free(all);
    }
    free(q);
    free(o_cpu);
    free(o_emu);
    free(kc);
    free(vc);
    free(K);
    free(V);
    kn_tq_destroy(tq);
    tq_ref_destroy(st);
}
END_TEST

Suite *cuda_emu_tq_suite(void);

Suite *
cuda_emu_tq_suite(void)
{
    Suite *s = suite_create("cuda_emu_tq");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_tq_bodies, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
