/* kvq_ref.c - the CPU quantized-KV reference (kernels/cpu/kv_quant.h) behind
 * plain functions for test_emu.c, which cannot include kv_quant.h next to
 * kernels/cuda/kn_cuda_body.h (both define the 16-bit codecs by the same
 * names: one as extern functions, one as static inline bodies). */
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
