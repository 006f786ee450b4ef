/* kvq_ref.c - the CPU quantized-KV reference (kernels/cpu/kv_quant.h) behind
 * plain functions for test_emu.c, which cannot include kv_quant.h next to
 * kernels/cuda/kn_cuda_body.h (both define the 16-bit codecs by the same
 * names: one as extern functions, one as static inline bodies). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kv_quant.h"
#include "tests/cuda/kvq_ref.h"

int
kvq_ref_fmt_values_match(void)
{
    return KN_KVQ_FP8 == 3 && KN_KVQ_INT8 == 4 && KN_KVQ_INT4 == 5;
}

static int
ref_layout(int fmt, int32_t n_kv, int32_t bs, int32_t hd, kn_kvq_layout_t *L)
{
    char err[128];

    return kn_kvq_layout_init(L, (kn_kvq_fmt_t)fmt, n_kv, bs, hd, err, sizeof(err));
}

int
kvq_ref_layout(int fmt, int32_t n_kv, int32_t bs, int32_t hd, size_t *data, size_t *k_stride,
               size_t *v_stride)
{
    kn_kvq_layout_t L;
    int st = ref_layout(fmt, n_kv, bs, hd, &L);

    if (st == 0) {
        *data = L.data_bytes;
        *k_stride = L.k_stride;
        *v_stride = L.v_stride;
    }
    return st;
}

void
kvq_ref_quantize(int fmt, int32_t n_kv, int32_t bs, int32_t hd, int kind, const float *src,
                 int32_t n_rows, uint8_t *dst)
{
    kn_kvq_layout_t L;

    if (ref_layout(fmt, n_kv, bs, hd, &L) == 0) {
        kn_kvq_quantize_block(&L, kind, src, n_rows, dst);
    }
}

void
kvq_ref_dequant(int fmt, int32_t n_kv, int32_t bs, int32_t hd, int kind, const uint8_t *blk,
                int32_t h, float *out)
{
    kn_kvq_layout_t L;

    if (ref_layout(fmt, n_kv, bs, hd, &L) == 0) {
        kn_kvq_dequant_rows(&L, kind, blk, h, 0, bs, out);
    }
}

void
kvq_ref_rotate_rows(float *rows, int32_t n, int32_t hd, const float *inv_freq, int32_t delta)
{
    kn_kvq_rotate_rows(rows, n, hd, inv_freq, delta);
}

int
kvq_ref_shift_attention(const kvq_ref_shift_t *c, const kv_op_t *ops, int32_t n_ops, float *out,
                        uint8_t *k_blocks, uint8_t *v_blocks, float *res_k, float *res_v)
{
    kn_kvq_layout_t L;
    kn_kvq_store_t *st = NULL;
    char err[128];
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)c->ctx);
    int32_t tail = c->table[(c->ctx - 1) / c->bs], qs[2] = {0, c->n_q}, residual;

    if (slots == NULL || ref_layout(c->fmt, c->n_kv, c->bs, c->hd, &L) != 0 ||
        kn_kvq_store_create(&L, 1, c->num_blocks, 0, 4, &st, err, sizeof(err)) != 0) {
        free(slots);
        return -1;
    }
    kn_kvq_store_set_rope(st, c->inv_freq);
    for (int32_t j = 0; j < c->ctx; j++) {
        slots[j] = c->table[j / c->bs] * c->bs + j % c->bs;
    }
    kn_kvq_write(st, 0, c->k, c->v, slots, c->ctx);
    kn_kvq_end_step(st);
    if (kn_kvq_ops(st, ops, n_ops) != 0) {
        kn_kvq_store_destroy(st);
        free(slots);
        return -1;
    }
    for (int32_t b = 0; b < c->num_blocks; b++) {
        memcpy(k_blocks + (size_t)b * L.k_stride, kn_kvq_block_ptr(st, 0, 0, 0, b), L.k_stride);
        memcpy(v_blocks + (size_t)b * L.v_stride, kn_kvq_block_ptr(st, 0, 0, 1, b), L.v_stride);
    }
    residual = kn_kvq_block_is_residual(st, 0, tail);
    if (residual) {
        for (int32_t h = 0; h < c->n_kv; h++) {
            size_t o = (size_t)h * c->bs * c->hd;

            kn_kvq_read_rows(st, 0, 0, tail, h, 0, c->bs, res_k + o);
            kn_kvq_read_rows(st, 0, 1, tail, h, 0, c->bs, res_v + o);
        }
    }
    kn_attn_args_t a = {
        .out = out,
        .q = c->q,
        .query_start = qs,
        .context_len = &c->ctx,
        .block_tables = c->table,
        .max_blocks = (c->ctx + c->bs - 1) / c->bs,
        .n_seqs = 1,
        .n_tok = c->n_q,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv,
        .head_dim = c->hd,
        .block_size = c->bs,
        .scale = c->scale,
    };

    kn_kvq_attention(st, 0, &a);
    kn_kvq_store_destroy(st);
    free(slots);
    return residual;
}
