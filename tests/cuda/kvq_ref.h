/* kvq_ref.h - the CPU quantized-KV block codec (kernels/cpu/kv_quant.h)
 * for the emulator tests, by format number (KN_KVQ_* = KN_KQ_* values).
 * Thread: any. */
#ifndef TESTS_CUDA_KVQ_REF_H
#define TESTS_CUDA_KVQ_REF_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* TESTS_CUDA_KVQ_REF_H */
