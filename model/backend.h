/* backend.h - the interface between the model runtime and a compute
 * backend (CPU today; CUDA plugs in the same way).
 *
 * runtime.c validates configurations and batches, then calls a backend
 * through this table. A backend owns its KV pool (device tier and CPU swap
 * tier, layout per layer [block][kv_head][block_size][head_dim] for K and
 * for V), its scratch buffers and its logits buffer, all allocated in
 * create(): forward() and kv_ops() allocate nothing.
 *
 * Thread: engine thread only, like mdl_runtime_*.
 */
#ifndef MODEL_BACKEND_H
#define MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"
#include "model/model.h"

typedef struct mdl_backend {
    const char *name; /* matches mdl_runtime_config_t.device */
    /* cfg has been validated and its defaults filled in. On failure returns
     * a negative ST_* with a one-line reason in err and leaves *state unset. */
    int (*create)(const mdl_model_t *m, const mdl_runtime_config_t *cfg, void **state, char *err,
                  size_t errlen);
    void (*destroy)(void *state); /* NULL is a no-op */
    /* ops are validated against num_blocks / swap_blocks. */
    int (*kv_ops)(void *state, const kv_op_t *ops, int32_t n_ops);
    /* b is validated (ids, slots, block ids, sizes within the config).
     * On ST_OK *logits is [n_logits][vocab] f32 host memory owned by the
     * backend, valid until the next forward. */
    int (*forward)(void *state, const mdl_batch_t *b, const float **logits);
    /* The hidden rows of the last forward ([n_hidden][dim], after the final
     * norm), or NULL when the backend does not compute them (then batches
     * with n_hidden > 0 are refused). */
    const float *(*hidden)(void *state);
    /* Nonzero: kv_ops() also takes KV_OP_DROP / KV_OP_DROP_SWAP; otherwise
     * the runtime leaves them out. */
    int kv_drop_ops;
    /* Nonzero: kv_ops() takes KV_OP_SHIFT; otherwise the runtime refuses
     * it with ST_EUNSUPPORTED. */
    int kv_shift_ops;
    /* H2O / SnapKV: out[i][layer][kv_head] = accumulated attention mass of
     * slots[i] (mdl_runtime_kv_mass, slots validated). NULL: the backend
     * keeps none, and refuses kv_mass and KV_OP_COPY_SLOT. */
    int (*kv_mass)(void *state, const int32_t *slots, int32_t n, float *out);
} mdl_backend_t;

/* model/forward_cpu.c, at any tp_size (model/tp.h). */
extern const mdl_backend_t mdl_backend_cpu;
/* model/backend_cuda.c, built with -Dcuda=enabled (KVSERVE_HAVE_CUDA). */
extern const mdl_backend_t mdl_backend_cuda;
/* Tests only: one more backend, found by its name after the built-in ones
 * (tests/cuda/dev_emu.c registers the CUDA backend's forward pass on
 * emulated device operations as "cuda-emu", so the engine runs on it).
 * NULL removes it. Call before creating a runtime on it, from one thread. */
void mdl_backend_register_test(const mdl_backend_t *be);
/* model/backend_cuda.c: mdl_device_memory() for "cuda" (cudaMemGetInfo). */
int mdl_cuda_device_memory(int32_t n_devices, size_t *total_bytes, size_t *in_use_bytes,
                           char *err, size_t errlen);

#endif /* MODEL_BACKEND_H */
