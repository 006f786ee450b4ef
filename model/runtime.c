/* runtime.c - the model runtime: binds a loaded model to a backend,
 * validates every batch and KV operation, and dispatches.
 *
 * DESIGN. The runtime is the trust boundary between the scheduler and the
 * kernels: a bad token id, slot, block id or size in a batch becomes
 * ST_EINVAL here instead of an out-of-bounds write in a kernel. The checks
 * cost O(n_tokens + blocks referenced) per step, nothing next to the
 * forward itself. The backend then assumes a valid batch.
 */
#define LOG_MODULE "runtime"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "model/backend.h"
#include "model/model_int.h"
#include "kvserve_config.h"

struct mdl_runtime {
    const mdl_backend_t *be;
    void *state;
    const mdl_model_t *m;
    mdl_runtime_config_t cfg; /* defaults filled in */
};

static const mdl_backend_t *const rt_backends[] = {
    &mdl_backend_cpu,
#if KVSERVE_HAVE_CUDA
    &mdl_backend_cuda,
#endif
};
static const mdl_backend_t *rt_test_backend; /* mdl_backend_register_test */

void
mdl_backend_register_test(const mdl_backend_t *be)
{
    rt_test_backend = be;
}

int
mdl_runtime_create(const mdl_model_t *m, const mdl_runtime_config_t *cfg, mdl_runtime_t **out,
                   char *err, size_t errlen)
{
    mdl_runtime_config_t c = *cfg;
    const mdl_config_t *mc = &m->cfg;
    const mdl_backend_t *be = NULL;
    mdl_runtime_t *rt;
    int rc;

    if (c.device == NULL || c.device[0] == '\0') {
        c.device = "cpu";
    }
    for (size_t i = 0; i < sizeof(rt_backends) / sizeof(rt_backends[0]); i++) {
        if (strcmp(rt_backends[i]->name, c.device) == 0) {
            be = rt_backends[i];
        }
    }
    if (be == NULL && rt_test_backend != NULL && strcmp(rt_test_backend->name, c.device) == 0) {
        be = rt_test_backend;
    }
    if (be == NULL) {
        snprintf(err, errlen, "device '%s' is not available in this build", c.device);
        return strcmp(c.device, "cuda") == 0 ? ST_ENODEV : ST_EINVAL;
    }
    if (c.tp_size <= 0) {
        c.tp_size = 1;
    }
    if (c.block_size <= 0) {
        c.block_size = 16;
    }
    if (c.max_num_batched_tokens <= 0) {
        c.max_num_batched_tokens = 512;
    }
    if (c.max_num_seqs <= 0) {
        c.max_num_seqs = 16;
    }
    if (c.max_blocks_per_seq <= 0) {
        c.max_blocks_per_seq = (mc->max_pos + c.block_size - 1) / c.block_size;
    }
    if (c.kv_dtype == MDL_KV_AUTO) {
        c.kv_dtype = strcmp(be->name, "cuda") == 0 ? MDL_KV_BF16 : MDL_KV_F32;
    }
    if (c.gpu_memory_utilization <= 0.0f) {
        c.gpu_memory_utilization = 0.9f;
    }
    if (c.num_blocks < 2 || c.swap_blocks < 0 || c.max_blocks_per_seq <= 0 || c.block_size > 4096) {
        snprintf(err, errlen, "bad KV pool shape: %d blocks of %d tokens, %d swap blocks",
                 c.num_blocks, c.block_size, c.swap_blocks);
        return ST_EINVAL;
    }
    if (mc->head_dim <= 0 || mc->head_dim % 2 != 0 || mc->n_kv_heads <= 0 ||
        mc->n_heads % mc->n_kv_heads != 0) {
        snprintf(err, errlen, "unsupported head shape: %d heads, %d KV heads, head_dim %d",
                 mc->n_heads, mc->n_kv_heads, mc->head_dim);
        return ST_EFORMAT;
    }

    if (c.kv_mass && be->kv_mass == NULL) {
        snprintf(err, errlen, "attention-score eviction (h2o, snapkv) needs the cpu or cuda "
                 "backend");
        return ST_EUNSUPPORTED;
    }

    rt = xcalloc(1, sizeof(*rt));
    rt->be = be;
    rt->m = m;
    rt->cfg = c;
    rc = be->create(m, &rt->cfg, &rt->state, err, errlen);
    if (rc != ST_OK) {
        free(rt);
        return rc;
    }
    LOG_DEBUG("runtime on %s: %d blocks x %d tokens, %d swap blocks, %d tokens/step", be->name,
              c.num_blocks, c.block_size, c.swap_blocks, c.max_num_batched_tokens);
    *out = rt;
    return ST_OK;
}

int
mdl_device_memory(const char *device, int32_t n_devices, size_t *total_bytes,
                  size_t *in_use_bytes, char *err, size_t errlen)
{
    *total_bytes = 0;
    if (in_use_bytes != NULL) {
        *in_use_bytes = 0;
    }
    if (device == NULL || strcmp(device, "cuda") != 0) {
        snprintf(err, errlen, "device '%s' has no device memory to size",
                 device != NULL ? device : "(null)");
        return ST_EINVAL;
    }
#if KVSERVE_HAVE_CUDA
    return mdl_cuda_device_memory(n_devices > 0 ? n_devices : 1, total_bytes, in_use_bytes, err,
                                  errlen);
#else
    (void)n_devices;
    snprintf(err, errlen, "device 'cuda' is not available in this build");
    return ST_ENODEV;
#endif
}

void
mdl_runtime_destroy(mdl_runtime_t *rt)
{
    if (rt == NULL) {
        return;
    }
    rt->be->destroy(rt->state);
    free(rt);
}

int
mdl_runtime_kv_ops(mdl_runtime_t *rt, const kv_op_t *ops, int32_t n_ops)
{
    int32_t nb = rt->cfg.num_blocks, ns = rt->cfg.swap_blocks;

    if (n_ops < 0 || (n_ops > 0 && ops == NULL)) {
        return ST_EINVAL;
    }
    for (int32_t i = 0; i < n_ops; i++) {
        int32_t src_max = ops[i].kind == KV_OP_SWAP_IN ? ns : nb;
        int32_t dst_max = ops[i].kind == KV_OP_SWAP_OUT ? ns : nb;

        if (ops[i].kind == KV_OP_SHIFT) {
            if (!rt->be->kv_shift_ops) {
                LOG_ERROR("the %s backend cannot re-rotate KV blocks", rt->be->name);
                return ST_EUNSUPPORTED;
            }
            if (ops[i].src <= 0 || ops[i].src >= nb || ops[i].dst < 0) {
                LOG_ERROR("kv op %d: shift of block %d by %d out of range", i, ops[i].src,
                          ops[i].dst);
                return ST_EINVAL;
            }
            continue;
        }
        if (ops[i].kind == KV_OP_COPY_SLOT) {
            int64_t n_slots = (int64_t)nb * rt->cfg.block_size;

            if (rt->be->kv_mass == NULL) {
                LOG_ERROR("the %s backend cannot move single KV slots", rt->be->name);
                return ST_EUNSUPPORTED;
            }
            if (ops[i].src < rt->cfg.block_size || ops[i].src >= n_slots ||
                ops[i].dst < rt->cfg.block_size || ops[i].dst >= n_slots) {
                LOG_ERROR("kv op %d: slot copy %d -> %d out of range", i, ops[i].src, ops[i].dst);
                return ST_EINVAL;
            }
            continue;
        }
        if (ops[i].kind == KV_OP_DROP || ops[i].kind == KV_OP_DROP_SWAP) {
            src_max = ops[i].kind == KV_OP_DROP ? nb : ns;
            dst_max = src_max;
        } else if (ops[i].kind != KV_OP_COPY && ops[i].kind != KV_OP_SWAP_OUT &&
                   ops[i].kind != KV_OP_SWAP_IN) {
            return ST_EINVAL;
        }
        if (ops[i].src < 0 || ops[i].src >= src_max || ops[i].dst < 0 || ops[i].dst >= dst_max) {
            LOG_ERROR("kv op %d (kind %d): block %d -> %d out of range", i, ops[i].kind, ops[i].src,
                      ops[i].dst);
            return ST_EINVAL;
        }
    }
    if (n_ops == 0) {
        return ST_OK;
    }
    if (rt->be->kv_drop_ops) {
        return rt->be->kv_ops(rt->state, ops, n_ops);
    }
    /* A backend that keeps nothing beside its blocks gets the runs of
     * copy / swap ops between the drops. */
    for (int32_t i = 0; i < n_ops;) {
        int32_t j = i;

        while (j < n_ops && ops[j].kind != KV_OP_DROP && ops[j].kind != KV_OP_DROP_SWAP) {
            j++;
        }
        if (j > i) {
            int rc = rt->be->kv_ops(rt->state, ops + i, j - i);

            if (rc != ST_OK) {
                return rc;
            }
        }
        i = j + 1;
    }
    return ST_OK;
}

/* Persistent block-table rows (model.h, issue 15): every row named is one
 * of the max_num_seqs rows, and every entry written since the previous
 * step (the dirty runs) is a block id. The other entries were checked in
 * the step that wrote them: O(rows + changed entries), not O(tables). */
static int
rt_tables_valid(const mdl_runtime_t *rt, const mdl_batch_t *b)
{
    const mdl_runtime_config_t *c = &rt->cfg;

    if (b->n_table_dirty < 0 || (b->n_table_dirty > 0 && b->table_dirty == NULL)) {
        return 0;
    }
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (b->table_rows[s] < 0 || b->table_rows[s] >= c->max_num_seqs) {
            return 0;
        }
    }
    for (int32_t k = 0; k < b->n_table_dirty; k++) {
        const mdl_table_run_t *d = &b->table_dirty[k];
        const int32_t *e;

        if (d->row < 0 || d->row >= c->max_num_seqs || d->first < 0 || d->count < 0 ||
            d->count > b->max_blocks - d->first) {
            return 0;
        }
        e = b->block_tables + (size_t)d->row * (size_t)b->max_blocks + d->first;
        for (int32_t i = 0; i < d->count; i++) {
            if (e[i] < 0 || e[i] >= c->num_blocks) {
                return 0;
            }
        }
    }
    return 1;
}

/* Everything a kernel would index with, checked against the config. */
static int
rt_batch_valid(const mdl_runtime_t *rt, const mdl_batch_t *b)
{
    const mdl_runtime_config_t *c = &rt->cfg;
    int32_t vocab = rt->m->cfg.vocab_size;
    int64_t n_slots = (int64_t)c->num_blocks * c->block_size;

    if (b->n_tokens <= 0 || b->n_tokens > c->max_num_batched_tokens || b->n_seqs <= 0 ||
        b->n_seqs > c->max_num_seqs || b->n_logits < 0 || b->n_logits > c->max_num_seqs ||
        b->max_blocks <= 0 || b->max_blocks > c->max_blocks_per_seq) {
        return 0;
    }
    if (b->tokens == NULL || b->positions == NULL || b->slot_mapping == NULL ||
        b->query_start == NULL || b->context_len == NULL || b->block_tables == NULL ||
        (b->n_logits > 0 && b->logits_rows == NULL)) {
        return 0;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= vocab || b->positions[t] < 0 ||
            b->slot_mapping[t] < 0 || b->slot_mapping[t] >= n_slots) {
            return 0;
        }
    }
    if (b->query_start[0] != 0 || b->query_start[b->n_seqs] != b->n_tokens) {
        return 0;
    }
    if (b->table_rows != NULL && !rt_tables_valid(rt, b)) {
        return 0;
    }
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t n_new = b->query_start[s + 1] - b->query_start[s];
        int32_t ctx = b->context_len[s];

        if (n_new <= 0 || ctx < n_new || ctx > b->max_blocks * c->block_size) {
            return 0;
        }
        /* Persistent rows: their entries were checked as they changed. */
        for (int32_t i = 0; b->table_rows == NULL && i < (ctx + c->block_size - 1) / c->block_size;
             i++) {
            int32_t blk = b->block_tables[(size_t)s * b->max_blocks + i];

            if (blk < 0 || blk >= c->num_blocks) {
                return 0;
            }
        }
    }
    for (int32_t i = 0; i < b->n_logits; i++) {
        if (b->logits_rows[i] < 0 || b->logits_rows[i] >= b->n_tokens) {
            return 0;
        }
    }
    if (b->n_hidden < 0 || b->n_hidden > b->n_tokens || (b->n_hidden > 0 && !b->hidden_rows)) {
        return 0;
    }
    for (int32_t i = 0; i < b->n_hidden; i++) {
        if (b->hidden_rows[i] < 0 || b->hidden_rows[i] >= b->n_tokens) {
            return 0;
        }
    }
    return 1;
}

int
mdl_forward(mdl_runtime_t *rt, const mdl_batch_t *b, const float **logits)
{
    if (!rt_batch_valid(rt, b)) {
        LOG_ERROR("invalid batch: %d tokens, %d seqs, %d logits rows", b->n_tokens, b->n_seqs,
                  b->n_logits);
        return ST_EINVAL;
    }
    if (b->n_hidden > 0 && rt->be->hidden == NULL) {
        LOG_ERROR("the %s backend does not give hidden states (embeddings)", rt->be->name);
        return ST_EUNSUPPORTED;
    }
    return rt->be->forward(rt->state, b, logits);
}

int
mdl_runtime_kv_mass(mdl_runtime_t *rt, const int32_t *slots, int32_t n, float *out)
{
    int64_t n_slots = (int64_t)rt->cfg.num_blocks * rt->cfg.block_size;

    if (!rt->cfg.kv_mass || rt->be->kv_mass == NULL) {
        return ST_EUNSUPPORTED;
    }
    if (n < 0 || (n > 0 && (slots == NULL || out == NULL))) {
        return ST_EINVAL;
    }
    for (int32_t i = 0; i < n; i++) {
        if (slots[i] < rt->cfg.block_size || slots[i] >= n_slots) {
            return ST_EINVAL;
        }
    }
    return n > 0 ? rt->be->kv_mass(rt->state, slots, n, out) : ST_OK;
}

int
mdl_kv_mass_fits(const char *device, mdl_kv_dtype_t dt)
{
    if (device == NULL || strcmp(device, "cpu") == 0) {
        return dt == MDL_KV_AUTO || dt == MDL_KV_F32;
    }
    if (strncmp(device, "cuda", 4) == 0) {
        return dt == MDL_KV_AUTO || dt == MDL_KV_BF16 || dt == MDL_KV_F16;
    }
    return 0;
}

int32_t
mdl_runtime_kv_mass_heads(const mdl_runtime_t *rt)
{
    return rt->cfg.kv_mass ? rt->m->cfg.n_layers * rt->m->cfg.n_kv_heads : 0;
}

const float *
mdl_runtime_hidden(const mdl_runtime_t *rt)
{
    return rt->be->hidden != NULL ? rt->be->hidden(rt->state) : NULL;
}

int
mdl_runtime_has_hidden(const mdl_runtime_t *rt)
{
    return rt->be->hidden != NULL;
}

void
mdl_rope_inv_freq(const mdl_config_t *c, float *inv_freq)
{
    kn_rope_params_t rp = {
        .head_dim = c->head_dim,
        .theta = c->rope_theta > 0.0f ? c->rope_theta : 10000.0f,
        .scaling = c->rope_scaling == MDL_ROPE_LINEAR   ? KN_ROPE_LINEAR
                   : c->rope_scaling == MDL_ROPE_LLAMA3 ? KN_ROPE_LLAMA3
                                                        : KN_ROPE_NONE,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .orig_max_pos = c->rope_orig_max_pos,
    };

    kn_cpu_rope_inv_freq(&rp, inv_freq);
}
