/* host_kv.h - helpers shared by the host (CPU) backends: forward_cpu.c and
 * forward_tp.c lay out their f32 KV pools the same way.
 *
 * Thread: pure functions; any thread.
 */
#ifndef MODEL_HOST_KV_H
#define MODEL_HOST_KV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

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
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    return p == MAP_FAILED ? NULL : p;
}

#endif /* MODEL_HOST_KV_H */
