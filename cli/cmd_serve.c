/* cmd_serve.c - `kvserve serve`: open the port, load the model, size the KV
 * cache, and run the OpenAI-compatible HTTP server until SIGTERM / SIGINT
 * has drained it. The port opens before the model loads (serve_load runs
 * on the server's loader thread, server/srv_ready.c).
 *
 * Flags and the config file are parsed by config/ (vLLM flag names). The
 * KV pool is --num-kv-blocks blocks, or --kv-cache-memory bytes divided by
 * the bytes of one block, or by default enough blocks for max_num_seqs full
 * contexts (at most 1 GiB) on cpu; on cuda, what --gpu-memory-utilization of
 * the device leaves after the weights, the largest step's activations and
 * a fixed reserve (mdl_kv_blocks_for_budget). --swap-space GiB sizes the
 * CPU tier (default 0 on cpu, 1 GiB on cuda). Before the engine maps its
 * pools, cli/serve_mem.c fits max_model_len to the pool and checks the
 * host memory they commit against MemAvailable.
 */
#define LOG_MODULE "serve"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/sysmem.h"
#include "common/xmalloc.h"
#include "config/config.h"
#include "model/kv_policy.h"
#include "scheduler/spec.h"
#include "cli/cmds.h"
#include "cli/serve_mem.h"
#include "cli/serve_spec.h"
#include "server/srv.h"

static mdl_kv_dtype_t
kv_dtype_of(const char *s)
{
    static const struct {
        const char *name;
        mdl_kv_dtype_t v;
    } map[] = {
        {"auto", MDL_KV_AUTO}, {"f32", MDL_KV_F32},           {"f16", MDL_KV_F16},
        {"bf16", MDL_KV_BF16}, {"fp8_e4m3", MDL_KV_FP8_E4M3}, {"int8", MDL_KV_INT8},
        {"int4", MDL_KV_INT4}, {"tq3", MDL_KV_TQ3},           {"tq4", MDL_KV_TQ4},
    };

    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcmp(s, map[i].name) == 0) {
            return map[i].v;
        }
    }
    return MDL_KV_AUTO;
}

static char *
read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = xmalloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Fills the engine configuration from cfg and the model. */
static int
engine_config(const cfg_t *cfg, const mdl_model_t *model, srv_setup_t *su)
{
    const mdl_config_t *mc = mdl_model_config(model);
    eng_config_t *e = &su->eng;
    int32_t ctx = mc->max_pos;
    size_t block_bytes, kv_bytes;
    int64_t blocks;
    serve_draft_t dr;
    int64_t avail = sysmem_available();
    char err[512];

    if (cfg->max_model_len > 0) {
        if (cfg->max_model_len > mc->max_pos) {
            LOG_ERROR("--max-model-len %d exceeds the model's context of %d tokens",
                      cfg->max_model_len, mc->max_pos);
            return ST_EINVAL;
        }
        ctx = cfg->max_model_len;
    }
    su->max_model_len = ctx;

    memset(e, 0, sizeof(*e));
    e->rt.device = cfg->device;
    e->rt.tp_size = cfg->tensor_parallel_size;
    e->rt.n_threads = cfg->threads;
    e->rt.block_size = cfg->block_size;
    e->rt.max_num_batched_tokens = cfg->max_num_batched_tokens;
    e->rt.max_num_seqs = cfg->max_num_seqs;
    e->rt.max_blocks_per_seq = (ctx + cfg->block_size - 1) / cfg->block_size;
    e->rt.kv_dtype = kv_dtype_of(cfg->kv_cache_dtype);
    if (e->rt.kv_dtype == MDL_KV_AUTO && strcmp(cfg->device, "cuda") == 0) {
        e->rt.kv_dtype = MDL_KV_BF16; /* what the runtime picks (model/runtime.c) */
    }
    /* As engine_create decides it: the pool sizing counts the mass. */
    e->rt.kv_mass = mdl_kv_mass_fits(cfg->device, e->rt.kv_dtype);
    e->rt.gpu_memory_utilization = (float)cfg->gpu_memory_utilization;
    e->rt.cuda_graphs = !cfg->enforce_eager;
    CHECK(mdl_matmul_prec_parse(cfg->matmul_precision, &e->rt.matmul_precision) == ST_OK);
    {
        char serr[256];

        if (spec_config_parse(cfg->speculative_config, &e->spec, serr, sizeof(serr)) != ST_OK) {
            LOG_ERROR("--speculative-config: %s", serr);
            return ST_EINVAL;
        }
    }
    block_bytes = mdl_kv_block_bytes(mc, cfg->block_size, e->rt.kv_dtype);
    if (block_bytes == 0) {
        LOG_ERROR("--kv-cache-dtype %s cannot hold this model's KV heads (head_dim %d; int4 "
                  "needs a multiple of 8, tq3 / tq4 a power of two in 16 .. 256)",
                  cfg->kv_cache_dtype, mc->head_dim);
        return ST_EINVAL;
    }
    {
        /* A draft model's KV lives in the same blocks (scheduler/spec_draft.h):
         * a block costs both models' bytes. */
        mdl_runtime_config_t rc = e->rt;

        rc.max_num_seqs = spec_logits_rows(&e->spec, cfg->max_num_seqs);
        if (serve_draft_measure(&e->spec, &rc, 0, &dr, err, sizeof(err)) != ST_OK) {
            LOG_ERROR("%s", err);
            return ST_EINVAL;
        }
        kv_bytes = block_bytes + dr.block_bytes;
    }
    if (cfg->num_kv_blocks > 0) {
        blocks = cfg->num_kv_blocks;
    } else if (cfg->kv_cache_memory > 0) {
        blocks = cfg->kv_cache_memory / (int64_t)kv_bytes;
    } else if (strcmp(cfg->device, "cuda") == 0) {
        /* What --gpu-memory-utilization leaves after the weights and the
         * largest step's activations (model/model.h). */
        mdl_kv_budget_t kb;
        size_t total, in_use;
        int st = mdl_device_memory("cuda", e->rt.tp_size > 0 ? e->rt.tp_size : 1, &total, &in_use,
                                   err, sizeof(err));

        if (st == ST_OK) {
            mdl_runtime_config_t rc;

            /* The backend checks the pool against what is in use after its
             * own allocations (model/backend_cuda.c): count the context and
             * other processes' memory as measured, not a guess. */
            e->rt.dev_reserve_bytes = in_use + MDL_DEV_HEADROOM_BYTES;
            rc = e->rt;

            rc.tp_size = rc.tp_size > 0 ? rc.tp_size : 1;
            /* The runtime's logits buffers hold k more rows per
             * speculating sequence (engine_create sizes them so). */
            rc.max_num_seqs = spec_logits_rows(&e->spec, cfg->max_num_seqs);
            st = mdl_kv_blocks_for_budget(mc, &rc, total, &kb, err, sizeof(err));
            if (st == ST_OK && e->spec.method == SPEC_DRAFT_MODEL) {
                /* The draft's weights and activations share the device, its
                 * KV every block. */
                st = serve_draft_measure(&e->spec, &rc, total, &dr, err, sizeof(err));
                if (st == ST_OK) {
                    size_t used = kb.weight_bytes + kb.act_bytes + kb.reserve_bytes + dr.dev_bytes;
                    size_t nb = kb.budget_bytes > used
                                    ? (kb.budget_bytes - used) / (kb.block_bytes + dr.block_bytes)
                                    : 0;
                    kb.num_blocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
                    kb.block_bytes += dr.block_bytes;
                    if (kb.num_blocks < 2) {
                        snprintf(err, sizeof(err),
                                 "--gpu-memory-utilization leaves %d KV blocks with the draft "
                                 "model's %.2f GiB of weights and activations",
                                 kb.num_blocks, (double)dr.dev_bytes / (double)(1u << 30));
                        st = ST_ENOMEM;
                    }
                }
            }
        }
        if (st != ST_OK) {
            LOG_ERROR("%s", err);
            return st;
        }
        blocks = kb.num_blocks;
        LOG_INFO("KV pool: %lld blocks (%.2f GiB) after weights %.2f GiB and activations %.2f GiB "
                 "at utilization %.2f",
                 (long long)blocks, (double)blocks * (double)kb.block_bytes / (double)(1u << 30),
                 (double)kb.weight_bytes / (double)(1u << 30),
                 (double)kb.act_bytes / (double)(1u << 30), cfg->gpu_memory_utilization);
    } else {
        /* Room for max_num_seqs full contexts, at most 1 GiB and at most
         * half of what the host has available now. */
        int64_t cap = 1LL << 30;

        if (avail > 0 && avail / 2 < cap) {
            cap = avail / 2;
        }
        blocks = (int64_t)cfg->max_num_seqs * e->rt.max_blocks_per_seq + 1;
        if (blocks * (int64_t)kv_bytes > cap) {
            blocks = cap / (int64_t)kv_bytes;
        }
    }
    if (blocks < 2 || blocks > INT32_MAX) {
        LOG_ERROR("the KV cache would hold %lld blocks of %zu bytes: too few or too many",
                  (long long)blocks, block_bytes);
        return ST_EINVAL;
    }
    if (serve_fit_context(blocks, cfg->block_size, cfg->max_model_len > 0, &ctx, err,
                          sizeof(err)) != ST_OK) {
        LOG_ERROR("%s", err);
        return ST_EINVAL;
    }
    su->max_model_len = ctx;
    e->rt.max_blocks_per_seq = (ctx + cfg->block_size - 1) / cfg->block_size;
    if (cfg->kv_policy_window > 0 &&
        cfg->kv_policy_sink + cfg->kv_policy_window + 2 * cfg->block_size > ctx) {
        /* The cpu and cuda backends re-rotate kept keys (KV_OP_SHIFT,
         * every tensor-parallel rank its KV heads); the window must leave
         * room in the context. */
        LOG_ERROR("--kv-policy %s needs sink + window + 2 blocks within the context of %d tokens",
                  cfg->kv_policy, ctx);
        return ST_EUNSUPPORTED;
    }
    if (strncmp(cfg->kv_policy, "h2o", 3) == 0 || strncmp(cfg->kv_policy, "snapkv", 6) == 0) {
        char why[256] = "";

        /* H2O / SnapKV (model/kv_policy.h): the cpu backend with an f32
         * KV cache, or cuda with f16 / bf16, keeps the attention mass
         * they score by. */
        if (mdl_kv_policy_parse(cfg->kv_policy, cfg->block_size, &e->kv_score, why,
                                sizeof(why)) != ST_OK) {
            LOG_ERROR("--kv-policy: %s", why);
            return ST_EINVAL;
        }
        if (e->kv_score.budget > ctx || !mdl_kv_mass_fits(cfg->device, e->rt.kv_dtype)) {
            LOG_ERROR("--kv-policy %s needs a budget within the context of %d tokens and the "
                      "cpu device with an f32 KV cache or cuda with f16 / bf16 (--device %s, "
                      "--kv-cache-dtype %s)",
                      cfg->kv_policy, ctx, cfg->device, mdl_kv_dtype_name(e->rt.kv_dtype));
            return ST_EUNSUPPORTED;
        }
    }
    e->rt.num_blocks = (int32_t)blocks;
    e->rt.swap_blocks = (int32_t)(cfg->swap_space_gib * (double)(1LL << 30) / (double)kv_bytes);
    for (int32_t t = 0; t < cfg->n_tenants; t++) {
        /* A tenant's share must hold a block, or its every request waits
         * for ever. */
        if ((int64_t)(cfg->tenants[t].max_kv_share * (double)(blocks - 1)) < 1) {
            LOG_ERROR("tenant %s: max_kv_share %g of %lld KV blocks is less than one block",
                      cfg->tenants[t].name, cfg->tenants[t].max_kv_share, (long long)blocks - 1);
            return ST_EINVAL;
        }
    }
    /* What start-up commits in host RAM (the engine touches it all before
     * the server reports ready) must fit what the host has. */
    int on_cpu = strcmp(cfg->device, "cuda") != 0;
    int64_t pool_host = on_cpu ? blocks * (int64_t)kv_bytes : 0;
    int64_t swap_host = (int64_t)e->rt.swap_blocks * (int64_t)kv_bytes;
    int64_t other_host =
        on_cpu ? (int64_t)(mdl_kv_residual_bytes(mc, cfg->block_size, e->rt.kv_dtype,
                                                 cfg->max_num_seqs, cfg->max_num_batched_tokens) +
                           dr.residual_bytes)
               : 0;
    /* Per-block token records (blockmgr/bm_map.h), host memory whatever the
     * device: kept for the admin API's map and for KV events. */
    if (cfg->admin_api_key_sha256[0] != '\0' || cfg->kv_events_config[0] != '\0') {
        other_host += (blocks + (int64_t)e->rt.swap_blocks) * ((int64_t)cfg->block_size * 4 + 33);
    }

    if (serve_check_memory(avail, pool_host, swap_host, other_host, err, sizeof(err)) != ST_OK) {
        LOG_ERROR("%s", err);
        return ST_ENOMEM;
    }
    e->max_num_seqs = cfg->max_num_seqs;
    e->max_num_batched_tokens = cfg->max_num_batched_tokens;
    e->max_model_len = ctx;
    e->prefix_caching = cfg->enable_prefix_caching;
    e->kv_sink = cfg->kv_policy_window > 0 ? cfg->kv_policy_sink : 0;
    e->kv_window = cfg->kv_policy_window > 0 ? cfg->kv_policy_window : 0;
    e->watermark = (float)cfg->kv_watermark;
    e->vtc = (sp_vtc_weights_t){.input = cfg->vtc_input_weight,
                                .cached = cfg->vtc_cached_weight,
                                .output = cfg->vtc_output_weight};
    e->kv_events_config = cfg->kv_events_config;
    e->kv_map_tokens = cfg->admin_api_key_sha256[0] != '\0'; /* the console's map */
    e->n_tenants = cfg->n_tenants;
    for (int32_t t = 0; t < cfg->n_tenants && t < ENG_MAX_TENANTS; t++) {
        const cfg_tenant_t *ct = &cfg->tenants[t];
        eng_tenant_t *et = &e->tenants[t];
        snprintf(et->name, sizeof(et->name), "%s", ct->name);
        et->weight = ct->weight;
        et->max_running = ct->max_running;
        et->max_waiting = ct->max_waiting;
        et->max_kv_share = ct->max_kv_share;
        snprintf(et->salt, sizeof(et->salt), "%s", ct->prefix_cache_salt);
        et->tokens_per_minute = ct->tokens_per_minute;
    }
    LOG_INFO("KV cache: %d blocks of %d tokens (%.1f MiB), swap %d blocks, context %d",
             e->rt.num_blocks, cfg->block_size,
             (double)blocks * (double)kv_bytes / (1024.0 * 1024.0), e->rt.swap_blocks, ctx);
    if (dr.block_bytes > 0) {
        LOG_INFO("KV cache: each block also holds the draft model's KV (%.1f of %.1f KiB)",
                 (double)dr.block_bytes / 1024.0, (double)kv_bytes / 1024.0);
    }
    size_t f32_bytes = mdl_kv_block_bytes(mc, cfg->block_size, MDL_KV_F32);

    LOG_INFO("KV cache dtype %s: %.1f bytes/token with scales, %.2fx the blocks of f32 in the "
             "same memory; residual of blocks being filled %.1f MiB",
             cfg->kv_cache_dtype, (double)block_bytes / cfg->block_size,
             (double)f32_bytes / (double)block_bytes,
             (double)mdl_kv_residual_bytes(mc, cfg->block_size, e->rt.kv_dtype, cfg->max_num_seqs,
                                           cfg->max_num_batched_tokens) /
                 (1024.0 * 1024.0));
    return ST_OK;
}

/* What the loader thread makes, freed by cmd_serve after srv_run. */
typedef struct serve_load {
    cfg_t *cfg;
    mdl_model_t *model;
    char *tmpl;
} serve_load_t;

/* srv_setup_t.load, on the server's loader thread once the port is open:
 * loads the model and sizes the engine. Logs its error line. */
static int
serve_load(void *arg, srv_setup_t *su)
{
    serve_load_t *ld = arg;
    const cfg_t *cfg = ld->cfg;
    mdl_load_opts_t lo = {0};
    char err[512] = "";
    int rc;

    CHECK(mdl_dtype_parse(cfg->dtype, &lo.dtype) == ST_OK); /* config checked the choices */
    rc = mdl_model_load_opts(cfg->model, &lo, &ld->model, err, sizeof(err));
    if (rc != ST_OK) {
        LOG_ERROR("%s", err);
        return rc;
    }
    su->model = ld->model;
    if (cfg->chat_template[0] != '\0') {
        ld->tmpl = read_file(cfg->chat_template);
        if (ld->tmpl == NULL) {
            LOG_ERROR("--chat-template %s: cannot read the file", cfg->chat_template);
            return ST_ENOENT;
        }
        su->chat_template = ld->tmpl;
    } else {
        su->chat_template = mdl_model_chat_template(ld->model);
    }
    rc = engine_config(cfg, ld->model, su);
    if (rc != ST_OK) {
        return rc;
    }
    /* Test hook (tests/soak/faults.test.mjs): the N-th fallible allocation
     * on the request path fails, once. */
    const char *fail_after = getenv("KVSERVE_FAIL_ALLOC_AFTER");
    if (fail_after != NULL && atol(fail_after) > 0) {
        LOG_WARN("KVSERVE_FAIL_ALLOC_AFTER=%ld: allocation failure injection armed",
                 atol(fail_after));
        xmalloc_fail_after(atol(fail_after));
    }
    /* Test hook (tests/integration/lifecycle.test.mjs): the N-th forward
     * pass fails, which ends the engine, so /health must answer 503. The
     * warm-up step is the first forward pass. */
    const char *fail_fwd = getenv("KVSERVE_TEST_FAIL_FORWARD_AT");
    if (fail_fwd != NULL && atol(fail_fwd) > 0) {
        LOG_WARN("KVSERVE_TEST_FAIL_FORWARD_AT=%ld: forward failure injection armed",
                 atol(fail_fwd));
        su->eng.test_fail_forward_at = (int32_t)atol(fail_fwd);
    }
    /* Test hook (tests/console): every step sleeps N ms after its forward
     * pass, so that generations last long enough for the map's polls. */
    const char *step_delay = getenv("KVSERVE_TEST_STEP_DELAY_MS");
    if (step_delay != NULL && atol(step_delay) > 0 && atol(step_delay) <= 1000) {
        LOG_WARN("KVSERVE_TEST_STEP_DELAY_MS=%ld: every step sleeps (tests only)",
                 atol(step_delay));
        su->eng.test_step_delay_ms = (int32_t)atol(step_delay);
    }
    return ST_OK;
}

int
cmd_serve(int argc, char **argv)
{
    cfg_t *cfg = xcalloc(1, sizeof(*cfg));
    serve_load_t ld = {cfg, NULL, NULL};
    srv_setup_t su;
    char err[512] = "";
    int rc, status = 1;

    rc = cfg_parse(argc, argv, cfg, err, sizeof(err));
    if (rc == CFG_HELP) {
        printf("usage: kvserve serve [--model PATH] [OPTIONS]\n\n");
        cfg_usage(stdout);
        free(cfg);
        return 0;
    }
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve serve: %s\n", err);
        free(cfg);
        return 2;
    }
    log_set_level(cfg->log_level);
    /* The port opens first; the model loads on the server's loader thread
     * (server/srv_ready.c), and /health says 503 loading until then. */
    memset(&su, 0, sizeof(su));
    su.cfg = cfg;
    su.load = serve_load;
    su.load_arg = &ld;
    rc = srv_run(&su);
    status = rc == ST_OK ? 0 : 1;
    free(ld.tmpl);
    mdl_model_destroy(ld.model);
    free(cfg);
    return status;
}
