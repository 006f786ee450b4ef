/* tq_ref.c - the CPU tq store for the emulator test (tq_ref.h). */
#include <stdlib.h>

#include "common/status.h"
#include "kernels/cpu/kv_quant.h"
#include "tests/cuda/tq_ref.h"

struct tq_ref {
    kn_kvq_store_t *st;
};

tq_ref_t *
tq_ref_create(int bits, int32_t n_layers, int32_t n_kv, int32_t bs, int32_t hd, int32_t nb,
              size_t *k_stride, size_t *v_stride)
{
    kn_kvq_layout_t L;
    tq_ref_t *r;
    char err[256];

    if (kn_kvq_layout_init(&L, bits == 3 ? KN_KVQ_TQ3 : KN_KVQ_TQ4, n_kv, bs, hd, err,
                           sizeof(err)) != ST_OK) {
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL || kn_kvq_store_create(&L, n_layers, nb, 0, 0, &r->st, err, sizeof(err)) != ST_OK) {
        free(r);
        return NULL;
    }
    *k_stride = L.k_stride;
    *v_stride = L.v_stride;
    return r;
}

void
tq_ref_destroy(tq_ref_t *r)
{
    if (r != NULL) {
        kn_kvq_store_destroy(r->st);
        free(r);
    }
}

void
tq_ref_write(tq_ref_t *r, int32_t layer, const float *k, const float *v, const int32_t *slot,
             int32_t n_tok)
{
    kn_kvq_write(r->st, layer, k, v, slot, n_tok);
}

void
tq_ref_attention(tq_ref_t *r, int32_t layer, const kn_attn_args_t *a)
{
    kn_kvq_attention(r->st, layer, a);
}

int
tq_ref_shift(tq_ref_t *r, const float *inv_freq, int32_t block, int32_t delta)
{
    kv_op_t op = {KV_OP_SHIFT, block, delta};

    kn_kvq_store_set_rope(r->st, inv_freq);
    return kn_kvq_ops(r->st, &op, 1);
}

const uint8_t *
tq_ref_block(const tq_ref_t *r, int32_t layer, int kind, int32_t block)
{
    return kn_kvq_block_ptr(r->st, 0, layer, kind, block);
}
