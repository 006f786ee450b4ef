/* serve_spec.c - KV sizing of a draft model (cli/serve_spec.h). */
#include "cli/serve_spec.h"

#include <stdio.h>
#include <string.h>

#include "common/status.h"

int
serve_draft_measure(const spec_config_t *sc, const mdl_runtime_config_t *rc,
                    size_t device_bytes, serve_draft_t *out, char *err, size_t errlen)
{
    mdl_model_t *m = NULL;
    const mdl_config_t *mc;
    char lerr[400] = "";
    int rc2;

    memset(out, 0, sizeof(*out));
    if (sc->method != SPEC_DRAFT_MODEL) {
        return ST_OK;
    }
    rc2 = mdl_model_load(sc->model, &m, lerr, sizeof(lerr));
    if (rc2 != ST_OK) {
        snprintf(err, errlen, "--speculative-config: draft model: %s", lerr);
        return rc2;
    }
    mc = mdl_model_config(m);
    out->block_bytes = mdl_kv_block_bytes(mc, rc->block_size, rc->kv_dtype);
    if (out->block_bytes == 0) {
        snprintf(err, errlen,
                 "--speculative-config: the KV cache dtype cannot hold the draft model's KV "
                 "heads (head_dim %d)",
                 mc->head_dim);
        mdl_model_destroy(m);
        return ST_EINVAL;
    }
    out->residual_bytes = mdl_kv_residual_bytes(mc, rc->block_size, rc->kv_dtype,
                                                rc->max_num_seqs, rc->max_num_batched_tokens);
    if (device_bytes > 0) {
        mdl_kv_budget_t kb;
        mdl_runtime_config_t drc = *rc;

        drc.tp_size = 1; /* the draft runs on one device (spec_draft_create) */
        memset(&kb, 0, sizeof(kb));
        rc2 = mdl_kv_blocks_for_budget(mc, &drc, device_bytes, &kb, lerr, sizeof(lerr));
        if (rc2 != ST_OK && rc2 != ST_ENOMEM) {
            snprintf(err, errlen, "--speculative-config: draft model: %s", lerr);
            mdl_model_destroy(m);
            return rc2;
        }
        out->dev_bytes = kb.weight_bytes + kb.act_bytes;
    }
    mdl_model_destroy(m);
    return ST_OK;
}
