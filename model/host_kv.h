/* host_kv.h - the KV pool of a host (CPU) backend: forward_cpu.c keeps one
 * per tensor-parallel rank for its KV heads (model/tp.h; every KV head at
 * T = 1).
 *
 * A pool holds the device tier (num_blocks) and the swap tier
 * (swap_blocks) for n_kv KV heads, in one of two forms:
 *
 *   f32:        kv, swap: one region per layer and kind (host_kv_region),
 *               each [n_blocks][n_kv][block_size][head_dim]
 *                 | L0 K | L0 V | L1 K | L1 V | ... |
 *   compressed: a kn_kvq_store_t (kernels/cpu/kv_quant.h, KIVI layout:
 *               codes and scales per block, f32 residual slots for blocks
 *               being filled) for n_kv heads
 *
 * Quantization groups are per KV head (keys per channel, values per
 * token), so a pool of a rank's n_kv heads holds exactly the codes and
 * scales the single pool holds for those heads.
 *
 * Thread: a pool belongs to one thread at a time (the engine thread, or a
 * rank thread during a kn_ranks_run() region). host_kv_region() and
 * host_kv_map() are pure.
 */
#ifndef MODEL_HOST_KV_H
#define MODEL_HOST_KV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "common/kvop.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kv_quant.h"
#include "model/model.h"

/* The K (kind 0) or V (kind 1) region of one layer in a pool laid out
 * [layer][K|V][block][...] with blk_floats floats per block. */
static inline float *
host_kv_region(float *base, int32_t n_blocks, size_t blk_floats, int32_t layer, int kind)
{
    return base + ((size_t)layer * 2 + (size_t)kind) * (size_t)n_blocks * blk_floats;
}

/* Zeroed anonymous memory for a pool (pages are touched lazily), or NULL. */
static inline void *
host_kv_map(size_t len)
{
    /* MAP_POPULATE: committed now, before the server reports ready, not
     * page by page under load (the start-up check sized it against
     * MemAvailable). */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);

    return p == MAP_FAILED ? NULL : p;
}

typedef struct host_kv {
    int32_t n_layers, n_kv, block_size, head_dim;
    int32_t num_blocks, swap_blocks;
    size_t blk_floats; /* f32: one block of one layer and kind, n_kv * bs * hd */
    float *kv;         /* f32 device tier, or NULL */
    size_t kv_len;     /* bytes mapped */
    float *swap;       /* f32 swap tier, or NULL (none, or compressed) */
    size_t swap_len;
    kn_kvq_store_t *kvq;   /* any dtype but f32: pool, swap tier, residual slots */
    const float *inv_freq; /* borrowed (head_dim / 2), for KV_OP_SHIFT */
    /* H2O / SnapKV (model/host_kv_mass.c): accumulated attention mass,
     * [layer][slot][n_kv] floats, or NULL without rc->kv_mass. */
    float *mass;
    size_t mass_len;
} host_kv_t;

/* Creates the pool of n_kv KV heads (global heads [kv0, kv0 + n_kv): tq
 * rotations follow the global index) of model c for runtime rc (num_blocks,
 * swap_blocks, block_size, kv_dtype, residual slots from
 * mdl__kv_residual_slots(rc)). On failure returns ST_ENOMEM (mapping),
 * ST_EUNSUPPORTED (the dtype cannot group the head, e.g. int4 with
 * head_dim % 8 != 0) or ST_EINVAL with a reason in err, and leaves *kv
 * empty (host_kv_destroy() is still safe). */
int host_kv_create(host_kv_t *kv, const mdl_config_t *c, int32_t kv0, int32_t n_kv,
                   const mdl_runtime_config_t *rc, char *err, size_t errlen);
/* Unmaps everything; a zeroed or failed pool is a no-op. */
void host_kv_destroy(host_kv_t *kv);
/* RoPE frequencies (head_dim / 2 floats, borrowed for the pool's life)
 * for KV_OP_SHIFT. Call once after create. */
void host_kv_set_rope(host_kv_t *kv, const float *inv_freq);

/* Runs COPY / SWAP_OUT / SWAP_IN / DROP / DROP_SWAP / SHIFT ops in order
 * (ids validated by the caller): whole blocks, every layer, K and V, with
 * their scales and residual slots. ST_EINVAL for a swap op without a swap
 * tier or a SHIFT before host_kv_set_rope(). Allocates nothing. */
int host_kv_ops(host_kv_t *kv, const kv_op_t *ops, int32_t n_ops);

/* Writes one layer's new K and V rows, k, v (n_tok, n_kv * head_dim), at
 * slot = block * block_size + offset (negative skipped). Layers in order
 * 0 .. n_layers - 1 within a step. */
void host_kv_write(host_kv_t *kv, int32_t layer, const float *k, const float *v,
                   const int32_t *slots, int32_t n_tok);

/* Paged attention of one layer over the pool; a's k_cache / v_cache are
 * filled in here, everything else as kn_cpu_attention() (n_kv_heads must
 * be the pool's n_kv). */
void host_kv_attend(host_kv_t *kv, int32_t layer, kn_attn_args_t *a);

/* model/host_kv_mass.c: the accumulated attention mass of H2O / SnapKV
 * (kernels/cpu/kn_mass.h). create: maps the accumulator when rc->kv_mass
 * (f32 pools only: ST_EUNSUPPORTED otherwise, reason in err); called by
 * host_kv_create. clear: zeroes the cells of newly written slots (called
 * by host_kv_write). attend: adds the probabilities of rows with
 * row_on[t] (a as host_kv_attend filled it). read: out[i][l][kv0 + h] +=
 * mass of slots[i], layer l, head h of this pool, for a row of n_kv_all
 * heads per layer (ranks sharing a KV head hold partial sums over their
 * query heads: adding them gives the head's). */
int host_kv_mass_create(host_kv_t *kv, const mdl_runtime_config_t *rc, char *err, size_t errlen);
void host_kv_mass_clear(host_kv_t *kv, int32_t layer, const int32_t *slots, int32_t n_tok);
void host_kv_mass_attend(host_kv_t *kv, int32_t layer, const kn_attn_args_t *a,
                         const uint8_t *row_on);
void host_kv_mass_read(const host_kv_t *kv, const int32_t *slots, int32_t n, int32_t kv0,
                       int32_t n_kv_all, float *out);
/* One op's effect on the accumulator and, for KV_OP_COPY_SLOT, the f32
 * rows: COPY moves a block's cells, SWAP_IN zeroes them (the swap tier
 * keeps no mass), COPY_SLOT moves one token (K, V and mass) of every
 * layer. */
void host_kv_mass_op(host_kv_t *kv, const kv_op_t *op);

/* Ends a forward step (residual slots of blocks filled during it return
 * to their pool). */
void host_kv_end_step(host_kv_t *kv);

#endif /* MODEL_HOST_KV_H */
