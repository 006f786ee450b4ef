/* kv_cache.h - KV cache formats as the model runtime sizes them: the
 * compressed block layout of each --kv-cache-dtype for a model, and the
 * residual slots of the scaled formats (kernels/cpu/kv_quant.h).
 *
 * Internal to model/ and its backends; the public entry points are
 * mdl_kv_block_bytes(), mdl_kv_residual_bytes() and mdl_kv_dtype_*() in
 * model/model.h.
 *
 * Thread: pure functions, any thread.
 */
#ifndef MODEL_KV_CACHE_H
#define MODEL_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kv_quant.h"
#include "model/model.h"

/* The block layout of dtype (MDL_KV_AUTO is f32) for the model's KV head
 * shape. ST_EUNSUPPORTED with a reason in err where the format cannot
 * group the head (INT4 with head_dim % 8 != 0). */
int mdl__kv_layout(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype,
                   kn_kvq_layout_t *out, char *err, size_t errlen);

/* Residual slots per tier for a runtime: every block one step can fill
 * (slots are held until the step ends) plus one partly filled block per
 * running sequence twice over (forks, swaps in flight). */
int32_t mdl__kv_residual_slots(const mdl_runtime_config_t *rc);

#endif /* MODEL_KV_CACHE_H */
