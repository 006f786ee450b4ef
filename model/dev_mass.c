/* dev_mass.c - H2O / SnapKV on a rank of the GPU forward pass
 * (model/dev_fwd.h): the accumulated attention mass beside a 16-bit KV
 * pool, read back for the policy, and the single-token moves of its
 * compaction (KV_OP_COPY_SLOT).
 *
 * DESIGN. The CPU backend's contract (model/host_kv_mass.c) on the
 * device, with the layout of kernels/cuda/kn_mass_body.h:
 *
 *   mass   [layer][slot][n_kv] f32, this rank's KV heads; 4 bytes per
 *          token, layer and KV head beside 4 * head_dim of f16 K and V
 *          (1/head_dim more KV memory), counted with the pool
 *   write  kv_write zeroes the written slot's cells (a new token has no mass)
 *   step   after each layer's attention, the mass kernel adds the
 *          probabilities of the rows that accumulate (mdl_batch_t.mass_rows
 *          staged as int32 after the step's inputs); steps without such
 *          rows launch nothing, and decode graphs are recorded separately
 *          for steps with them (rk->graph_mass)
 *   ops    COPY copies a block's cells, SWAP_IN zeroes them (the swap tier
 *          keeps none, as the CPU's), COPY_SLOT moves K, V and the cell:
 *          runs of moves upload their pairs (one synchronous upload per
 *          mass_cap pairs) and launch one kernel over every layer and head
 *   read   mdl_dev_rank_kv_mass: the slots go up, one gather kernel, one
 *          copy back, one sync -- per call, not per layer
 *
 * Quantized caches are refused: their codes share scales over a block
 * (fp8 / int8 / int4 keys per channel) or are read only through their own
 * kernels (tq3 / tq4), so moving one token or scoring it would need a
 * re-quantization or a tq mass kernel; the CPU backend keeps mass only for
 * f32 for the same reason.
 *
 * Thread: the rank's thread, like dev_fwd.c.
 */
#define LOG_MODULE "devmass"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "model/dev_fwd.h"
#include "model/kv_cache.h"
#include "model/model_int.h"

int
mdl__dev_mass_init(mdl_dev_rank_t *rk)
{
    const mdl_runtime_config_t *rc = &rk->rc;
    const mdl_dev_ops_t *o = rk->ops;

    if (!rc->kv_mass) {
        return ST_OK;
    }
    if (rk->kq.fmt != 0 || rk->tq_bits != 0) {
        LOG_ERROR("attention-score eviction (h2o, snapkv) on the device needs an f16 or bf16 KV "
                  "cache, not %s",
                  mdl_kv_dtype_name(rc->kv_dtype));
        return ST_EUNSUPPORTED;
    }
    if (o->attn_mass == NULL || o->mass_gather == NULL || o->kv_move == NULL) {
        LOG_ERROR("this device has no attention-mass kernels (h2o, snapkv)");
        return ST_EUNSUPPORTED;
    }
    rk->mass_cap = rc->max_blocks_per_seq * rc->block_size;
    rk->mass_cells = (size_t)rc->num_blocks * (size_t)rc->block_size * (size_t)rk->sh.n_kv;
    rk->stage_len += (size_t)rc->max_num_batched_tokens; /* the mass rows */
    return ST_OK;
}

size_t
mdl__dev_mass_bytes(const mdl_config_t *c, const mdl_runtime_config_t *rc, int32_t n_kv,
                    int32_t n_blocks)
{
    if (!rc->kv_mass) {
        return 0;
    }
    return sizeof(float) * (size_t)c->n_layers * (size_t)n_blocks * (size_t)rc->block_size *
           (size_t)n_kv;
}

int
mdl__dev_mass_alloc(mdl_dev_rank_t *rk)
{
    const mdl_dev_ops_t *o = rk->ops;
    const size_t cap = (size_t)rk->mass_cap, row = (size_t)rk->m->cfg.n_layers * rk->sh.n_kv;
    int st;

    if (!rk->rc.kv_mass) {
        return ST_OK;
    }
    if ((st = o->alloc(rk->ctx, (void **)&rk->mass,
                       sizeof(float) * rk->mass_cells * (size_t)rk->m->cfg.n_layers)) != ST_OK ||
        (st = o->alloc(rk->ctx, (void **)&rk->mass_slots_dev, sizeof(int32_t) * cap)) != ST_OK ||
        (st = o->alloc_host(rk->ctx, (void **)&rk->mass_slots_pin, sizeof(int32_t) * cap)) !=
            ST_OK ||
        (st = o->alloc(rk->ctx, (void **)&rk->mass_out_dev, sizeof(float) * cap * row)) != ST_OK ||
        (st = o->alloc_host(rk->ctx, (void **)&rk->mass_out_pin, sizeof(float) * cap * row)) !=
            ST_OK ||
        (st = o->alloc(rk->ctx, (void **)&rk->mass_moves_dev, sizeof(int32_t) * 2 * cap)) !=
            ST_OK ||
        (st = o->alloc(rk->ctx, (void **)&rk->mass_zero,
                       sizeof(float) * (size_t)rk->rc.block_size * rk->sh.n_kv)) != ST_OK) {
        return st;
    }
    rk->mass_moves = xmalloc(sizeof(int32_t) * 2 * cap);
    LOG_DEBUG("rank %d: attention mass for h2o / snapkv, %zu MiB", rk->rank,
              (sizeof(float) * rk->mass_cells * (size_t)rk->m->cfg.n_layers) >> 20);
    return ST_OK;
}

void
mdl__dev_mass_fini(mdl_dev_rank_t *rk)
{
    const mdl_dev_ops_t *o = rk->ops;

    o->free(rk->ctx, rk->mass);
    o->free(rk->ctx, rk->mass_slots_dev);
    o->free(rk->ctx, rk->mass_out_dev);
    o->free(rk->ctx, rk->mass_moves_dev);
    o->free(rk->ctx, rk->mass_zero);
    o->free_host(rk->ctx, rk->mass_slots_pin);
    o->free_host(rk->ctx, rk->mass_out_pin);
    free(rk->mass_moves);
    rk->mass = rk->mass_out_dev = rk->mass_out_pin = rk->mass_zero = NULL;
    rk->mass_slots_dev = rk->mass_slots_pin = rk->mass_moves_dev = rk->mass_moves = NULL;
}

int
mdl__dev_mass_block_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    const size_t blk = (size_t)rk->rc.block_size * (size_t)rk->sh.n_kv;
    int st;

    for (int32_t i = 0; rk->mass != NULL && i < n_ops; i++) {
        if (ops[i].kind != KV_OP_COPY && ops[i].kind != KV_OP_SWAP_IN) {
            continue;
        }
        for (int32_t l = 0; l < rk->m->cfg.n_layers; l++) {
            float *m = rk->mass + (size_t)l * rk->mass_cells;
            const float *src = ops[i].kind == KV_OP_COPY ? m + (size_t)ops[i].src * blk
                                                         : rk->mass_zero;

            st = rk->ops->copy(rk->ctx, m + (size_t)ops[i].dst * blk, src, sizeof(float) * blk,
                               KV_OP_COPY);
            if (st != ST_OK) {
                return st;
            }
        }
    }
    return ST_OK;
}

int
mdl__dev_mass_moves(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops)
{
    const int32_t cap = rk->mass_cap > 0 ? rk->mass_cap : 1;
    int st;

    if (rk->kq.fmt != 0 || rk->tq_bits != 0 || rk->ops->kv_move == NULL ||
        rk->mass_moves == NULL) {
        return ST_EUNSUPPORTED; /* the runtime takes COPY_SLOT only with kv_mass */
    }
    for (int32_t i0 = 0; i0 < n_ops; i0 += cap) {
        int32_t n = n_ops - i0 < cap ? n_ops - i0 : cap;
        kn_kv_move_args_t a = {
            .kv = (uint16_t *)rk->kv,
            .acc = rk->mass,
            .moves = rk->mass_moves_dev,
            .region_el = (size_t)rk->rc.num_blocks * rk->blk_bytes / sizeof(uint16_t),
            .layer_cells = rk->mass_cells,
            .n_moves = n,
            .n_kv = rk->sh.n_kv,
            .block_size = rk->rc.block_size,
            .head_dim = rk->m->cfg.head_dim,
        };

        for (int32_t k = 0; k < n; k++) {
            rk->mass_moves[2 * k] = ops[i0 + k].src;
            rk->mass_moves[2 * k + 1] = ops[i0 + k].dst;
        }
        /* Synchronous: the previous chunk's kernel has read its pairs. */
        if ((st = rk->ops->upload(rk->ctx, rk->mass_moves_dev, rk->mass_moves,
                                  sizeof(int32_t) * 2 * (size_t)n)) != ST_OK ||
            (st = rk->ops->kv_move(rk->ctx, &a, rk->m->cfg.n_layers)) != ST_OK) {
            return st;
        }
    }
    return ST_OK;
}

int
mdl__dev_mass_layer(mdl_dev_rank_t *rk, const mdl_dev_step_t *p, const kn_attn_cuda_args_t *aa,
                    int32_t l)
{
    kn_attn_mass_args_t ma = {*aa, rk->stage_dev + p->o_mass,
                              rk->mass + (size_t)l * rk->mass_cells};

    return rk->ops->attn_mass(rk->ctx, &ma, p->S);
}

int
mdl_dev_rank_kv_mass(mdl_dev_rank_t *rk, const int32_t *slots, int32_t n, float *out,
                     int32_t n_kv_all)
{
    const int32_t nl = rk->m->cfg.n_layers, nkv = rk->sh.n_kv, kv0 = rk->sh.kv0;
    const mdl_dev_ops_t *o = rk->ops;
    int st;

    if (rk->mass == NULL) {
        return ST_EUNSUPPORTED;
    }
    for (int32_t i0 = 0; i0 < n; i0 += rk->mass_cap) {
        int32_t m = n - i0 < rk->mass_cap ? n - i0 : rk->mass_cap;
        kn_mass_gather_args_t ga = {rk->mass, rk->mass_slots_dev, rk->mass_out_dev,
                                    rk->mass_cells, nl, nkv};

        memcpy(rk->mass_slots_pin, slots + i0, sizeof(int32_t) * (size_t)m);
        if ((st = o->copy(rk->ctx, rk->mass_slots_dev, rk->mass_slots_pin,
                          sizeof(int32_t) * (size_t)m, KV_OP_SWAP_IN)) != ST_OK ||
            (st = o->mass_gather(rk->ctx, &ga, m)) != ST_OK ||
            (st = o->copy(rk->ctx, rk->mass_out_pin, rk->mass_out_dev,
                          sizeof(float) * (size_t)m * nl * nkv, KV_OP_SWAP_OUT)) != ST_OK ||
            (st = o->sync(rk->ctx)) != ST_OK) {
            return st;
        }
        for (int32_t i = 0; i < m; i++) {
            for (int32_t l = 0; l < nl; l++) {
                memcpy(out + ((size_t)(i0 + i) * nl + l) * n_kv_all + kv0,
                       rk->mass_out_pin + ((size_t)i * nl + l) * nkv, sizeof(float) * nkv);
            }
        }
    }
    return ST_OK;
}
