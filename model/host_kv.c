/* host_kv.c - the KV pool of the host backends (model/host_kv.h): f32
 * regions or the compressed store, block ops, writes and attention.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "common/status.h"
#include "model/host_kv.h"
#include "model/kv_cache.h"

int
host_kv_create(host_kv_t *kv, const mdl_config_t *c, int32_t kv0, int32_t n_kv,
               const mdl_runtime_config_t *rc, char *err, size_t errlen)
{
    memset(kv, 0, sizeof(*kv));
    kv->n_layers = c->n_layers;
    kv->n_kv = n_kv;
    kv->block_size = rc->block_size;
    kv->head_dim = c->head_dim;
    kv->num_blocks = rc->num_blocks;
    kv->swap_blocks = rc->swap_blocks;
    kv->blk_floats = (size_t)n_kv * (size_t)c->head_dim * (size_t)rc->block_size;

    if (rc->kv_dtype != MDL_KV_F32 && rc->kv_dtype != MDL_KV_AUTO) {
        mdl_config_t part = *c; /* this pool's KV heads only */
        kn_kvq_layout_t lay;
        int st;

        part.n_kv_heads = n_kv;
        st = mdl__kv_layout(&part, rc->block_size, rc->kv_dtype, &lay, err, errlen);
        lay.head0 = kv0;
        if (st == ST_OK) {
            st = kn_kvq_store_create(&lay, c->n_layers, rc->num_blocks, rc->swap_blocks,
                                     mdl__kv_residual_slots(rc), &kv->kvq, err, errlen);
        }
        if (st != ST_OK) {
            kv->kvq = NULL;
        }
        return st == ST_OK ? host_kv_mass_create(kv, rc, err, errlen) : st;
    }
    kv->kv_len = sizeof(float) * 2 * (size_t)c->n_layers * (size_t)rc->num_blocks * kv->blk_floats;
    kv->kv = host_kv_map(kv->kv_len);
    if (kv->kv == NULL) {
        snprintf(err, errlen, "cannot map a %zu MiB KV pool", kv->kv_len >> 20);
        return ST_ENOMEM;
    }
    if (rc->swap_blocks > 0) {
        kv->swap_len =
            sizeof(float) * 2 * (size_t)c->n_layers * (size_t)rc->swap_blocks * kv->blk_floats;
        kv->swap = host_kv_map(kv->swap_len);
        if (kv->swap == NULL) {
            snprintf(err, errlen, "cannot map a %zu MiB swap tier", kv->swap_len >> 20);
            return ST_ENOMEM;
        }
    }
    return host_kv_mass_create(kv, rc, err, errlen);
}

void
host_kv_destroy(host_kv_t *kv)
{
    if (kv->kv != NULL) {
        munmap(kv->kv, kv->kv_len);
    }
    if (kv->swap != NULL) {
        munmap(kv->swap, kv->swap_len);
    }
    if (kv->mass != NULL) {
        munmap(kv->mass, kv->mass_len);
    }
    kn_kvq_store_destroy(kv->kvq);
    memset(kv, 0, sizeof(*kv));
}

void
host_kv_set_rope(host_kv_t *kv, const float *inv_freq)
{
    kv->inv_freq = inv_freq;
    if (kv->kvq != NULL) {
        kn_kvq_store_set_rope(kv->kvq, inv_freq);
    }
}

int
host_kv_ops(host_kv_t *kv, const kv_op_t *ops, int32_t n_ops)
{
    int32_t nb = kv->num_blocks, ns = kv->swap_blocks;
    size_t bytes = kv->blk_floats * sizeof(float);

    for (int32_t i = 0; kv->kvq != NULL && i < n_ops; i++) {
        if (ops[i].kind == KV_OP_COPY_SLOT) {
            return ST_EUNSUPPORTED; /* compaction: f32 pools only */
        }
    }
    if (kv->kvq != NULL) {
        return kn_kvq_ops(kv->kvq, ops, n_ops);
    }
    for (int32_t i = 0; i < n_ops; i++) {
        if (ops[i].kind == KV_OP_COPY_SLOT || kv->mass != NULL) {
            host_kv_mass_op(kv, &ops[i]);
        }
        if (ops[i].kind == KV_OP_COPY_SLOT) {
            continue;
        }
        if (ops[i].kind == KV_OP_DROP || ops[i].kind == KV_OP_DROP_SWAP) {
            continue; /* f32 keeps nothing beside the blocks */
        }
        if (ops[i].kind == KV_OP_SHIFT) {
            if (kv->inv_freq == NULL) {
                return ST_EINVAL;
            }
            /* Re-rotate the block's key rows in place, every layer. */
            for (int32_t l = 0; l < kv->n_layers; l++) {
                float *k = host_kv_region(kv->kv, nb, kv->blk_floats, l, 0) +
                           (size_t)ops[i].src * kv->blk_floats;

                kn_kvq_rotate_rows(k, kv->n_kv * kv->block_size, kv->head_dim, kv->inv_freq,
                                   ops[i].dst);
            }
            continue;
        }
        float *src_base = ops[i].kind == KV_OP_SWAP_IN ? kv->swap : kv->kv;
        float *dst_base = ops[i].kind == KV_OP_SWAP_OUT ? kv->swap : kv->kv;
        int32_t src_n = ops[i].kind == KV_OP_SWAP_IN ? ns : nb;
        int32_t dst_n = ops[i].kind == KV_OP_SWAP_OUT ? ns : nb;

        if (src_base == NULL || dst_base == NULL) {
            return ST_EINVAL; /* swap op without a swap tier */
        }
        for (int32_t l = 0; l < kv->n_layers; l++) {
            for (int kind = 0; kind < 2; kind++) {
                float *src = host_kv_region(src_base, src_n, kv->blk_floats, l, kind);
                float *dst = host_kv_region(dst_base, dst_n, kv->blk_floats, l, kind);

                memmove(dst + (size_t)ops[i].dst * kv->blk_floats,
                        src + (size_t)ops[i].src * kv->blk_floats, bytes);
            }
        }
    }
    return ST_OK;
}

void
host_kv_write(host_kv_t *kv, int32_t layer, const float *k, const float *v,
              const int32_t *slots, int32_t n_tok)
{
    if (kv->kvq != NULL) {
        kn_kvq_write(kv->kvq, layer, k, v, slots, n_tok);
        return;
    }
    kn_cpu_kv_write(host_kv_region(kv->kv, kv->num_blocks, kv->blk_floats, layer, 0),
                    host_kv_region(kv->kv, kv->num_blocks, kv->blk_floats, layer, 1), k, v, slots,
                    n_tok, kv->n_kv, kv->block_size, kv->head_dim);
    if (kv->mass != NULL) {
        host_kv_mass_clear(kv, layer, slots, n_tok);
    }
}

void
host_kv_attend(host_kv_t *kv, int32_t layer, kn_attn_args_t *a)
{
    if (kv->kvq != NULL) {
        a->k_cache = NULL;
        a->v_cache = NULL;
        kn_kvq_attention(kv->kvq, layer, a);
        return;
    }
    a->k_cache = host_kv_region(kv->kv, kv->num_blocks, kv->blk_floats, layer, 0);
    a->v_cache = host_kv_region(kv->kv, kv->num_blocks, kv->blk_floats, layer, 1);
    kn_cpu_attention(a);
}

void
host_kv_end_step(host_kv_t *kv)
{
    if (kv->kvq != NULL) {
        kn_kvq_end_step(kv->kvq);
    }
}
