/* serve_spec.h - `kvserve serve` start-up sizing for speculative decoding:
 * a draft model's KV shares the target's block ids (scheduler/spec_draft.h),
 * so every KV block costs the bytes of both models' KV, and on cuda the
 * draft's weights and activations come out of the same device budget.
 *
 * Thread: the main (loader) thread at start-up.
 */
#ifndef CLI_SERVE_SPEC_H
#define CLI_SERVE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "scheduler/spec.h"

typedef struct serve_draft {
    size_t block_bytes;    /* one KV block of the draft, all layers, K and V */
    size_t residual_bytes; /* its residual slots on cpu (scaled dtypes), else 0 */
    size_t dev_bytes;      /* cuda: its weights + activations, else 0 */
} serve_draft_t;

/* Measures the draft model of sc (method draft_model; any other method
 * gives zeros) for runtime rc (rc->max_num_seqs counting 1 + k logits
 * rows per sequence). device_bytes > 0: the cuda device's total memory,
 * for dev_bytes. Loads the model's header and weights map, then frees
 * them (the engine loads it again). Errors: the load error or ST_EINVAL
 * when the dtype cannot hold its heads, with one line in err. */
int serve_draft_measure(const spec_config_t *sc, const mdl_runtime_config_t *rc,
                        size_t device_bytes, serve_draft_t *out, char *err, size_t errlen);

#endif /* CLI_SERVE_SPEC_H */
