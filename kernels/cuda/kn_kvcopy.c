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
            c->src_off = ((size_t)region * (size_t)src_n + (size_t)ops[i].src) * blk_bytes;
            c->dst_off = ((size_t)region * (size_t)dst_n + (size_t)ops[i].dst) * blk_bytes;
            c->bytes = (size_t)run * blk_bytes;
        }
        i += run;
    }
    return n_out;
}
