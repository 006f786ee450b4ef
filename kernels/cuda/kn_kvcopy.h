/* kn_kvcopy.h - turns a list of KV block copy/swap operations into the
 * byte ranges to move, for a backend whose KV pool is one region per
 * layer and kind (DESIGN.md section 4):
 *
 *   tier:  | L0 K | L0 V | L1 K | L1 V | ... |   each [n_blocks][blk_bytes]
 *
 * The CUDA backend enqueues the result as cudaMemcpyAsync calls on one
 * stream (device pool <-> pinned host swap tier) and synchronizes once.
 * Consecutive operations of the same kind on consecutive blocks are
 * merged into one range when their source and destination ranges do not
 * overlap, so a 150-block swap-out is 2 * n_layers copies, not
 * 300 * n_layers. Plain C: the CPU test build tests it (tests/cuda/).
 *
 * Thread: any (pure function).
 */
#ifndef KERNELS_CUDA_KN_KVCOPY_H
#define KERNELS_CUDA_KN_KVCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"

typedef struct kn_kvcopy {
    kv_op_kind_t kind; /* COPY: device->device, SWAP_OUT: device->host, SWAP_IN: host->device */
    size_t src_off;    /* bytes from the start of the source tier */
    size_t dst_off;    /* bytes from the start of the destination tier */
    size_t bytes;
} kn_kvcopy_t;

/* Writes the ranges for ops (already validated against the tiers' block
 * counts) into out, which holds at least n_ops * 2 * n_layers entries, in
 * an order whose sequential execution equals running ops one by one.
 * Returns the number of ranges written.
 *   dev_blocks, host_blocks: blocks per layer and kind in each tier
 *   blk_bytes:               bytes of one block of one layer and kind */
int32_t kn_kvcopy_plan(const kv_op_t *ops, int32_t n_ops, int32_t n_layers, int32_t dev_blocks,
                       int32_t host_blocks, size_t blk_bytes, kn_kvcopy_t *out);

/* The same for a pool whose K and V blocks differ in size (quantized KV:
 * the scales beside the codes), laid out per layer
 *   | K: [n_blocks][k_bytes] | V: [n_blocks][v_bytes] |
 * which kn_kvcopy_plan() is with k_bytes == v_bytes. Operations other
 * than COPY / SWAP_OUT / SWAP_IN must not be passed. */
int32_t kn_kvcopy_plan_kv(const kv_op_t *ops, int32_t n_ops, int32_t n_layers, int32_t dev_blocks,
                          int32_t host_blocks, size_t k_bytes, size_t v_bytes, kn_kvcopy_t *out);

#endif /* KERNELS_CUDA_KN_KVCOPY_H */
