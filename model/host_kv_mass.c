/* host_kv_mass.c - the accumulated attention mass beside a host KV pool,
 * for H2O / SnapKV (model/host_kv.h, kernels/cpu/kn_mass.h), and the
 * token moves of their compaction (KV_OP_COPY_SLOT).
 *
 * DESIGN. One float per slot, layer and KV head of the pool,
 * [layer][slot][n_kv]: 4 * n_layers * n_kv bytes per token beside the
 * 2 * n_layers * n_kv * head_dim * 4 of f32 K and V (1.6% for the default
 * model, head_dim 32). A write zeroes its slot's cells (a new token has no
 * mass yet), the attention of a mass row adds to them, a compaction moves
 * them with the token, a block copy (copy-on-write) copies them. The swap
 * tier keeps none: a swapped-in block starts from zero mass (its tokens
 * then look light until they are attended again). Only f32 pools: moving
 * one token between blocks of a quantized cache would re-quantize both.
 *
 * Thread: as the pool (one thread at a time).
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "common/status.h"
#include "kernels/cpu/kn_mass.h"
#include "model/host_kv.h"

static size_t
mass_layer_cells(const host_kv_t *kv)
{
    return (size_t)kv->num_blocks * (size_t)kv->block_size * (size_t)kv->n_kv;
}

static float *
mass_layer(const host_kv_t *kv, int32_t layer)
{
    return kv->mass + (size_t)layer * mass_layer_cells(kv);
}

int
host_kv_mass_create(host_kv_t *kv, const mdl_runtime_config_t *rc, char *err, size_t errlen)
{
    if (!rc->kv_mass) {
        return ST_OK;
    }
    if (kv->kvq != NULL) {
        snprintf(err, errlen, "attention-score eviction (h2o, snapkv) needs an f32 KV cache");
        return ST_EUNSUPPORTED;
    }
    kv->mass_len = sizeof(float) * (size_t)kv->n_layers * mass_layer_cells(kv);
    kv->mass = host_kv_map(kv->mass_len);
    if (kv->mass == NULL) {
        snprintf(err, errlen, "cannot map a %zu MiB attention-mass accumulator",
                 kv->mass_len >> 20);
        return ST_ENOMEM;
    }
    return ST_OK;
}

void
host_kv_mass_clear(host_kv_t *kv, int32_t layer, const int32_t *slots, int32_t n_tok)
{
    float *m = mass_layer(kv, layer);

    for (int32_t t = 0; t < n_tok; t++) {
        if (slots[t] >= 0) {
            memset(m + (size_t)slots[t] * kv->n_kv, 0, sizeof(float) * (size_t)kv->n_kv);
        }
    }
}

void
host_kv_mass_attend(host_kv_t *kv, int32_t layer, const kn_attn_args_t *a, const uint8_t *row_on)
{
    if (kv->mass == NULL || row_on == NULL || kv->kvq != NULL) {
        return;
    }
    kn_cpu_attn_mass(a, row_on, mass_layer(kv, layer));
}

void
host_kv_mass_read(const host_kv_t *kv, const int32_t *slots, int32_t n, int32_t kv0,
                  int32_t n_kv_all, float *out)
{
    for (int32_t i = 0; i < n; i++) {
        for (int32_t l = 0; l < kv->n_layers; l++) {
            const float *m = mass_layer(kv, l) + (size_t)slots[i] * kv->n_kv;
            float *o = out + ((size_t)i * kv->n_layers + l) * n_kv_all + kv0;

            for (int32_t h = 0; h < kv->n_kv; h++) {
                o[h] += m[h];
            }
        }
    }
}

/* One token of every layer's K and V, slot src -> dst (f32 pool). */
static void
mass_copy_rows(host_kv_t *kv, int32_t src, int32_t dst)
{
    const int32_t bs = kv->block_size, hd = kv->head_dim;
    const size_t row = sizeof(float) * (size_t)hd;

    for (int32_t l = 0; l < kv->n_layers; l++) {
        for (int kind = 0; kind < 2; kind++) {
            float *base = host_kv_region(kv->kv, kv->num_blocks, kv->blk_floats, l, kind);

            for (int32_t h = 0; h < kv->n_kv; h++) {
                float *d = base + (((size_t)(dst / bs) * kv->n_kv + h) * bs + dst % bs) * hd;
                const float *s = base + (((size_t)(src / bs) * kv->n_kv + h) * bs + src % bs) * hd;

                memmove(d, s, row);
            }
        }
    }
}

void
host_kv_mass_op(host_kv_t *kv, const kv_op_t *op)
{
    const size_t cells = (size_t)kv->n_kv, blk = cells * (size_t)kv->block_size;

    if (op->kind == KV_OP_COPY_SLOT) {
        if (kv->kv != NULL) {
            mass_copy_rows(kv, op->src, op->dst);
        }
        for (int32_t l = 0; kv->mass != NULL && l < kv->n_layers; l++) {
            float *m = mass_layer(kv, l);
            memmove(m + (size_t)op->dst * cells, m + (size_t)op->src * cells,
                    sizeof(float) * cells);
        }
        return;
    }
    for (int32_t l = 0; kv->mass != NULL && l < kv->n_layers; l++) {
        float *m = mass_layer(kv, l);

        if (op->kind == KV_OP_COPY) {
            memmove(m + (size_t)op->dst * blk, m + (size_t)op->src * blk, sizeof(float) * blk);
        } else if (op->kind == KV_OP_SWAP_IN) {
            memset(m + (size_t)op->dst * blk, 0, sizeof(float) * blk);
        }
    }
}
