/* kvq_ref.h - the CPU quantized-KV block codec (kernels/cpu/kv_quant.h)
 * for the emulator tests, by format number (KN_KVQ_* = KN_KQ_* values).
 * Thread: any. */
#ifndef TESTS_CUDA_KVQ_REF_H
#define TESTS_CUDA_KVQ_REF_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"

/* Whether kn_kvq_fmt_t numbers fp8 / int8 / int4 as 3 / 4 / 5. */
int kvq_ref_fmt_values_match(void);
/* kn_kvq_layout_init(): 0 (ST_OK) and the byte sizes, or its error. */
int kvq_ref_layout(int fmt, int32_t n_kv, int32_t bs, int32_t hd, size_t *data, size_t *k_stride,
                   size_t *v_stride);
/* kn_kvq_quantize_block() of src [n_kv][bs][hd] into dst (one stride). */
void kvq_ref_quantize(int fmt, int32_t n_kv, int32_t bs, int32_t hd, int kind, const float *src,
                      int32_t n_rows, uint8_t *dst);
/* kn_kvq_dequant_rows() of all bs rows of head h into out (bs, hd). */
void kvq_ref_dequant(int fmt, int32_t n_kv, int32_t bs, int32_t hd, int kind, const uint8_t *blk,
                     int32_t h, float *out);

/* kn_kvq_rotate_rows(): n rows of hd rotated by -delta positions. */
void kvq_ref_rotate_rows(float *rows, int32_t n, int32_t hd, const float *inv_freq, int32_t delta);

/* One sequence of ctx tokens in blocks table[] of a one-layer store. */
typedef struct kvq_ref_shift {
    int fmt;
    int32_t n_kv, bs, hd, n_heads, num_blocks;
    const int32_t *table; /* (ctx + bs - 1) / bs block ids */
    int32_t ctx;
    const float *k, *v;        /* (ctx, n_kv * hd) */
    const float *inv_freq;     /* (hd / 2) */
    const float *q;            /* (n_q, n_heads * hd): the last n_q tokens' queries */
    int32_t n_q;
    float scale;
} kvq_ref_shift_t;

/* The CPU store (kernels/cpu/kv_quant.h) writes the sequence in one step,
 * runs ops (SHIFTs), then attends the last n_q tokens into out (n_q,
 * n_heads * hd). Copies out the device tier's blocks (num_blocks x
 * k_stride / v_stride) and, when the tail block still has its residual
 * rows, those ([n_kv][bs][hd] each) into res_k / res_v. Returns whether
 * the tail block is residual, or -1 when the store cannot be made. */
int kvq_ref_shift_attention(const kvq_ref_shift_t *c, const kv_op_t *ops, int32_t n_ops,
                            float *out, uint8_t *k_blocks, uint8_t *v_blocks, float *res_k,
                            float *res_v);

#endif /* TESTS_CUDA_KVQ_REF_H */
