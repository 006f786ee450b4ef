/* tp.c - the tensor-parallel split of a Llama model (model/tp.h). */
#include <stdio.h>

#include "common/status.h"
#include "model/tp.h"

int
mdl_tp_shard(const mdl_config_t *c, int32_t tp, int32_t rank, mdl_tp_shard_t *out, char *err,
             size_t errlen)
{
    int32_t group;

    if (tp < 1 || rank < 0 || rank >= tp) {
        snprintf(err, errlen, "bad tensor-parallel rank %d of %d", rank, tp);
        return ST_EINVAL;
    }
    if (c->n_heads % tp != 0 || c->ffn_dim % tp != 0 ||
        (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0)) {
        snprintf(err, errlen,
                 "tensor parallel size %d does not divide the model (%d heads, %d KV heads, "
                 "FFN %d)",
                 tp, c->n_heads, c->n_kv_heads, c->ffn_dim);
        return ST_EUNSUPPORTED;
    }
    group = c->n_heads / c->n_kv_heads;
    out->n_q = c->n_heads / tp;
    out->q0 = rank * out->n_q;
    if (c->n_kv_heads >= tp) {
        out->n_kv = c->n_kv_heads / tp;
        out->kv0 = rank * out->n_kv;
    } else {
        out->n_kv = 1; /* replicated: the KV head of this rank's query heads */
        out->kv0 = out->q0 / group;
    }
    out->n_f = c->ffn_dim / tp;
    out->f0 = rank * out->n_f;
    return ST_OK;
}
