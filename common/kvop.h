/* kvop.h - KV block copy and swap operations.
 *
 * blockmgr queues these and never touches bytes; the engine hands them to
 * the backend, which moves the bytes of every layer's K and V (and any
 * per-block scales) before the step's forward pass. Shared here so model/
 * and blockmgr/ need not depend on each other.
 *
 * Thread: engine.
 */
#ifndef COMMON_KVOP_H
#define COMMON_KVOP_H

#include <stdint.h>

typedef enum kv_op_kind {
    KV_OP_COPY = 0,     /* device block src -> device block dst */
    KV_OP_SWAP_OUT = 1, /* device block src -> CPU-tier block dst */
    KV_OP_SWAP_IN = 2,  /* CPU-tier block src -> device block dst */
    /* The block src was freed while partly filled: its bytes are dead, so
     * a backend may drop what it keeps beside them (the full-precision
     * residual of a quantized cache). dst == src. Emitted only when
     * bm_config_t.drop_ops is set; backends without such state ignore it. */
    KV_OP_DROP = 3,      /* device tier */
    KV_OP_DROP_SWAP = 4, /* CPU tier */
    /* Attention sinks / rolling window (StreamingLLM): every key row of
     * device block src moves dst positions earlier, i.e. is re-rotated by
     * RoPE(-dst) (rotations compose), so the kept tokens sit at contiguous
     * positions after the blocks before them were evicted. dst >= 0. The
     * block must not be shared. */
    KV_OP_SHIFT = 5,
    /* Heavy-hitter / SnapKV compaction (model/kv_policy.h): one token of
     * every layer's K and V (and its accumulated attention mass) moves
     * from device slot src to device slot dst (slot = block * block_size
     * + offset), keys unrotated: a kept key keeps its original position. */
    KV_OP_COPY_SLOT = 6,
} kv_op_kind_t;

typedef struct kv_op {
    kv_op_kind_t kind;
    int32_t src;
    int32_t dst;
} kv_op_t;

#endif /* COMMON_KVOP_H */
