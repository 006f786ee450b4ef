/* kn_kvcopy.c - KV copy/swap operations to byte ranges (see kn_kvcopy.h). */
#include "kernels/cuda/kn_kvcopy.h"

static int32_t
kvcopy_tier_blocks(kv_op_kind_t kind, int is_src, int32_t dev_blocks, int32_t host_blocks)
{
    if (is_src) {
        return kind == KV_OP_SWAP_IN ? host_blocks : dev_blocks;
    }
    return kind == KV_OP_SWAP_OUT ? host_blocks : dev_blocks;
}

int32_t
kn_kvcopy_plan(const kv_op_t *ops, int32_t n_ops, int32_t n_layers, int32_t dev_blocks,
               int32_t host_blocks, size_t blk_bytes, kn_kvcopy_t *out)
{
    return kn_kvcopy_plan_kv(ops, n_ops, n_layers, dev_blocks, host_blocks, blk_bytes, blk_bytes,
                             out);
}

/* Bytes from the start of a tier of n blocks to block blk of region
 * (layer, kind). */
static size_t
kvcopy_off(int32_t region, int32_t n, int32_t blk, size_t k_bytes, size_t v_bytes)
{
    size_t layer = (size_t)(region / 2), kind = (size_t)(region % 2);

    return layer * (size_t)n * (k_bytes + v_bytes) + kind * (size_t)n * k_bytes +
           (size_t)blk * (kind ? v_bytes : k_bytes);
}

int32_t
kn_kvcopy_plan_kv(const kv_op_t *ops, int32_t n_ops, int32_t n_layers, int32_t dev_blocks,
                  int32_t host_blocks, size_t k_bytes, size_t v_bytes, kn_kvcopy_t *out)
{
    int32_t n_out = 0;

    for (int32_t i = 0; i < n_ops;) {
        int32_t run = 1;

        /* Extend the run while kind matches, blocks are consecutive and
         * (for device copies) the source and destination stay disjoint. */
        while (i + run < n_ops && ops[i + run].kind == ops[i].kind &&
               ops[i + run].src == ops[i].src + run && ops[i + run].dst == ops[i].dst + run) {
            if (ops[i].kind == KV_OP_COPY && ops[i].src < ops[i].dst + run + 1 &&
                ops[i].dst < ops[i].src + run + 1) {
                break;
            }
            run++;
        }

        int32_t src_n = kvcopy_tier_blocks(ops[i].kind, 1, dev_blocks, host_blocks);
        int32_t dst_n = kvcopy_tier_blocks(ops[i].kind, 0, dev_blocks, host_blocks);

        for (int32_t region = 0; region < 2 * n_layers; region++) {
            kn_kvcopy_t *c = &out[n_out++];

            c->kind = ops[i].kind;
            c->src_off = kvcopy_off(region, src_n, ops[i].src, k_bytes, v_bytes);
            c->dst_off = kvcopy_off(region, dst_n, ops[i].dst, k_bytes, v_bytes);
            c->bytes = (size_t)run * (region % 2 ? v_bytes : k_bytes);
        }
        i += run;
    }
    return n_out;
}
