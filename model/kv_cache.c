/* kv_cache.c - KV cache dtypes: names, block layouts and byte sizes
 * (model/kv_cache.h, model/model.h).
 */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "model/kv_cache.h"

static const struct {
    const char *name;
    mdl_kv_dtype_t v;
    kn_kvq_fmt_t fmt;
} kv_names[] = {
    {"auto", MDL_KV_AUTO, KN_KVQ_F32},     {"f32", MDL_KV_F32, KN_KVQ_F32},
    {"f16", MDL_KV_F16, KN_KVQ_F16},       {"bf16", MDL_KV_BF16, KN_KVQ_BF16},
    {"fp8_e4m3", MDL_KV_FP8_E4M3, KN_KVQ_FP8}, {"int8", MDL_KV_INT8, KN_KVQ_INT8},
    {"int4", MDL_KV_INT4, KN_KVQ_INT4},    {"tq3", MDL_KV_TQ3, KN_KVQ_TQ3},
    {"tq4", MDL_KV_TQ4, KN_KVQ_TQ4},
};

int
mdl_kv_dtype_parse(const char *s, mdl_kv_dtype_t *out)
{
    for (size_t i = 0; i < sizeof(kv_names) / sizeof(kv_names[0]); i++) {
        if (s != NULL && strcmp(s, kv_names[i].name) == 0) {
            *out = kv_names[i].v;
            return ST_OK;
        }
    }
    return ST_EINVAL;
}

const char *
mdl_kv_dtype_name(mdl_kv_dtype_t d)
{
    for (size_t i = 0; i < sizeof(kv_names) / sizeof(kv_names[0]); i++) {
        if (kv_names[i].v == d) {
            return kv_names[i].name;
        }
    }
    return "?";
}

int
mdl__kv_layout(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype,
               kn_kvq_layout_t *out, char *err, size_t errlen)
{
    kn_kvq_fmt_t fmt = KN_KVQ_F32;

    for (size_t i = 0; i < sizeof(kv_names) / sizeof(kv_names[0]); i++) {
        if (kv_names[i].v == dtype) {
            fmt = kv_names[i].fmt;
        }
    }
    return kn_kvq_layout_init(out, fmt, c->n_kv_heads, block_size, c->head_dim, err, errlen);
}

int32_t
mdl__kv_residual_slots(const mdl_runtime_config_t *rc)
{
    int32_t bs = rc->block_size > 0 ? rc->block_size : 16;
    int32_t mnbt = rc->max_num_batched_tokens > 0 ? rc->max_num_batched_tokens : 512;

    /* Blocks one step can fill (each holds its slot until the step ends),
     * plus a partial tail per sequence twice over (forks, swaps). */
    return mnbt / bs + 1 + 2 * (rc->max_num_seqs > 0 ? rc->max_num_seqs : 16) + 8;
}

size_t
mdl_kv_block_bytes(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype)
{
    kn_kvq_layout_t L;
    char err[128];

    if (mdl__kv_layout(c, block_size, dtype, &L, err, sizeof(err)) != ST_OK) {
        return 0;
    }
    return (size_t)c->n_layers * (L.k_stride + L.v_stride);
}

size_t
mdl_kv_residual_bytes(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype,
                      int32_t max_num_seqs, int32_t max_num_batched_tokens)
{
    kn_kvq_layout_t L;
    mdl_runtime_config_t rc;
    char err[128];

    if (mdl__kv_layout(c, block_size, dtype, &L, err, sizeof(err)) != ST_OK ||
        !kn_kvq_scaled(L.fmt)) {
        return 0;
    }
    memset(&rc, 0, sizeof(rc));
    rc.max_num_seqs = max_num_seqs;
    rc.block_size = block_size;
    rc.max_num_batched_tokens = max_num_batched_tokens;
    return (size_t)mdl__kv_residual_slots(&rc) * 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads *
           (size_t)block_size * (size_t)c->head_dim * sizeof(float);
}
