/* config.c - model configuration from a Hugging Face directory
 * (config.json + generation_config.json) or from GGUF metadata, into
 * mdl_config_t, with the range checks both share.
 *
 * Architectures: llama, mistral, qwen2 (Qwen2 always has q/k/v biases).
 * RoPE scaling: none/default, linear, llama3; anything else (dynamic,
 * yarn, longrope) is refused with ST_EUNSUPPORTED rather than run wrong.
 * EOS ids: the union of config.json and generation_config.json, each of
 * which may hold an int or a list.
 */
#define LOG_MODULE "config"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "formats/fmt_util.h"
#include "formats/gguf.h"
#include "model/loader_int.h"

/* Largest config JSON we read: real ones are a few KB. */
#define CONFIG_MAX_BYTES (4u << 20)

static const char *const known_archs[] = {"llama", "mistral", "qwen2"};

static int
arch_known(const char *a)
{
    for (size_t i = 0; i < sizeof(known_archs) / sizeof(known_archs[0]); i++) {
        if (strcmp(a, known_archs[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* An integer field: absent or null leaves *out and returns 0; a value
 * that is not an integer in int32 range is an error (-1). */
static int
get_i32(const cJSON *obj, const char *key, int32_t *out, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    double d;

    if (j == NULL || cJSON_IsNull(j)) {
        return 0;
    }
    if (!cJSON_IsNumber(j)) {
        fmt_seterr(err, errlen, "config.json: '%s' is not a number", key);
        return -1;
    }
    d = j->valuedouble;
    if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0) {
        fmt_seterr(err, errlen, "config.json: '%s' is not a 32-bit integer", key);
        return -1;
    }
    *out = (int32_t)d;
    return 1;
}

static int
get_f32(const cJSON *obj, const char *key, float *out, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);

    if (j == NULL || cJSON_IsNull(j)) {
        return 0;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        fmt_seterr(err, errlen, "config.json: '%s' is not a number", key);
        return -1;
    }
    *out = (float)j->valuedouble;
    return 1;
}

static int
get_bool(const cJSON *obj, const char *key, int *out, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);

    if (j == NULL || cJSON_IsNull(j)) {
        return 0;
    }
    if (!cJSON_IsBool(j)) {
        fmt_seterr(err, errlen, "config.json: '%s' is not a boolean", key);
        return -1;
    }
    *out = cJSON_IsTrue(j) ? 1 : 0;
    return 1;
}

static void
add_eos(mdl_config_t *cfg, int32_t id)
{
    if (id < 0) {
        return;
    }
    for (int32_t i = 0; i < cfg->n_eos; i++) {
        if (cfg->eos_ids[i] == id) {
            return;
        }
    }
    if (cfg->n_eos < MDL_MAX_EOS) {
        cfg->eos_ids[cfg->n_eos++] = id;
    } else {
        LOG_WARN("more than %d eos ids; ignoring %d", MDL_MAX_EOS, id);
    }
}

/* eos_token_id: an int or a list of ints (or null). */
static int
parse_eos(const cJSON *obj, const char *file, mdl_config_t *cfg, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, "eos_token_id"), *e;

    if (j == NULL || cJSON_IsNull(j)) {
        return ST_OK;
    }
    if (cJSON_IsNumber(j)) {
        if (j->valuedouble != floor(j->valuedouble) || j->valuedouble > 2147483647.0) {
            fmt_seterr(err, errlen, "%s: bad eos_token_id", file);
            return ST_EFORMAT;
        }
        add_eos(cfg, (int32_t)j->valuedouble);
        return ST_OK;
    }
    if (!cJSON_IsArray(j)) {
        fmt_seterr(err, errlen, "%s: eos_token_id must be an integer or a list", file);
        return ST_EFORMAT;
    }
    cJSON_ArrayForEach(e, j)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble > 2147483647.0) {
            fmt_seterr(err, errlen, "%s: bad entry in eos_token_id", file);
            return ST_EFORMAT;
        }
        add_eos(cfg, (int32_t)e->valuedouble);
    }
    return ST_OK;
}

static int
parse_rope_scaling(const cJSON *root, mdl_config_t *cfg, char *err, size_t errlen)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *type;

    if (rs == NULL || cJSON_IsNull(rs)) {
        return ST_OK;
    }
    if (!cJSON_IsObject(rs)) {
        fmt_seterr(err, errlen, "config.json: rope_scaling must be an object or null");
        return ST_EFORMAT;
    }
    type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (type == NULL) {
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    }
    if (!cJSON_IsString(type)) {
        fmt_seterr(err, errlen, "config.json: rope_scaling has no type");
        return ST_EFORMAT;
    }
    if (strcmp(type->valuestring, "default") == 0) {
        return ST_OK;
    }
    if (strcmp(type->valuestring, "linear") == 0) {
        cfg->rope_scaling = MDL_ROPE_LINEAR;
    } else if (strcmp(type->valuestring, "llama3") == 0) {
        cfg->rope_scaling = MDL_ROPE_LLAMA3;
    } else {
        fmt_seterr(err, errlen, "config.json: unsupported rope_scaling type '%.32s'",
                   type->valuestring);
        return ST_EUNSUPPORTED;
    }
    if (get_f32(rs, "factor", &cfg->rope_factor, err, errlen) != 1 || !(cfg->rope_factor > 0)) {
        fmt_seterr(err, errlen, "config.json: rope_scaling needs a positive factor");
        return ST_EFORMAT;
    }
    if (cfg->rope_scaling == MDL_ROPE_LLAMA3) {
        if (get_f32(rs, "low_freq_factor", &cfg->rope_low_freq_factor, err, errlen) != 1 ||
            get_f32(rs, "high_freq_factor", &cfg->rope_high_freq_factor, err, errlen) != 1 ||
            get_i32(rs, "original_max_position_embeddings", &cfg->rope_orig_max_pos, err, errlen) !=
                1) {
            fmt_seterr(err, errlen,
                       "config.json: llama3 rope_scaling needs factor, "
                       "low_freq_factor, high_freq_factor and "
                       "original_max_position_embeddings");
            return ST_EFORMAT;
        }
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            cfg->rope_orig_max_pos <= 0) {
            fmt_seterr(err, errlen,
                       "config.json: llama3 rope_scaling needs high_freq_factor "
                       "> low_freq_factor and a positive original length");
            return ST_EFORMAT;
        }
    }
    return ST_OK;
}

static void
config_defaults(mdl_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_pos = 2048;
    cfg->norm_eps = 1e-6f;
    cfg->rope_theta = 10000.0f;
    cfg->rope_factor = 1.0f;
    cfg->bos_id = -1;
}

int
mdl__config_check(const mdl_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->vocab_size <= 0 || cfg->vocab_size > (1 << 24)) {
        fmt_seterr(err, errlen, "bad vocab_size %d", cfg->vocab_size);
        return ST_EFORMAT;
    }
    if (cfg->dim <= 0 || cfg->dim > (1 << 16)) {
        fmt_seterr(err, errlen, "bad hidden_size %d", cfg->dim);
        return ST_EFORMAT;
    }
    if (cfg->n_layers <= 0 || cfg->n_layers > 1024) {
        fmt_seterr(err, errlen, "bad num_hidden_layers %d", cfg->n_layers);
        return ST_EFORMAT;
    }
    if (cfg->n_heads <= 0 || cfg->n_heads > 1024) {
        fmt_seterr(err, errlen, "bad num_attention_heads %d", cfg->n_heads);
        return ST_EFORMAT;
    }
    if (cfg->n_kv_heads <= 0 || cfg->n_kv_heads > cfg->n_heads ||
        cfg->n_heads % cfg->n_kv_heads != 0) {
        fmt_seterr(err, errlen, "num_key_value_heads %d must divide num_attention_heads %d",
                   cfg->n_kv_heads, cfg->n_heads);
        return ST_EFORMAT;
    }
    if (cfg->head_dim <= 0 || cfg->head_dim > 1024 || cfg->head_dim % 2 != 0) {
        fmt_seterr(err, errlen, "bad head_dim %d (must be even)", cfg->head_dim);
        return ST_EFORMAT;
    }
    if (cfg->ffn_dim <= 0 || cfg->ffn_dim > (1 << 18)) {
        fmt_seterr(err, errlen, "bad intermediate_size %d", cfg->ffn_dim);
        return ST_EFORMAT;
    }
    if (cfg->max_pos <= 0) {
        fmt_seterr(err, errlen, "bad max_position_embeddings %d", cfg->max_pos);
        return ST_EFORMAT;
    }
    if (!(cfg->norm_eps > 0.0f) || !(cfg->norm_eps < 1.0f)) {
        fmt_seterr(err, errlen, "bad rms_norm_eps %g", (double)cfg->norm_eps);
        return ST_EFORMAT;
    }
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta)) {
        fmt_seterr(err, errlen, "bad rope_theta %g", (double)cfg->rope_theta);
        return ST_EFORMAT;
    }
    if (cfg->sliding_window < 0) {
        fmt_seterr(err, errlen, "bad sliding_window %d", cfg->sliding_window);
        return ST_EFORMAT;
    }
    for (int32_t i = 0; i < cfg->n_eos; i++) {
        if (cfg->eos_ids[i] >= cfg->vocab_size) {
            fmt_seterr(err, errlen, "eos id %d outside the vocabulary (%d)", cfg->eos_ids[i],
                       cfg->vocab_size);
            return ST_EFORMAT;
        }
    }
    if (cfg->bos_id >= cfg->vocab_size) {
        fmt_seterr(err, errlen, "bos id %d outside the vocabulary (%d)", cfg->bos_id,
                   cfg->vocab_size);
        return ST_EFORMAT;
    }
    return ST_OK;
}

int
mdl__config_parse_hf(const char *config_json, size_t config_len, const char *gen_json,
                     size_t gen_len, mdl_config_t *out, char *err, size_t errlen)
{
    cJSON *root = NULL, *gen = NULL;
    const cJSON *mt;
    mdl_config_t cfg;
    int use_sw = 1, bias = 0, rc = ST_EFORMAT;
    char why[200];

    config_defaults(&cfg);
    root = cJSON_ParseWithLength(config_json, config_len);
    if (root == NULL || !cJSON_IsObject(root)) {
        fmt_seterr(err, errlen, "config.json: not valid JSON");
        goto fail;
    }

    mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt)) {
        snprintf(cfg.arch, sizeof(cfg.arch), "%s", mt->valuestring);
    } else {
        const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
        const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
        const char *name = cJSON_IsString(a0) ? a0->valuestring : "";

        if (strcmp(name, "LlamaForCausalLM") == 0) {
            snprintf(cfg.arch, sizeof(cfg.arch), "llama");
        } else if (strcmp(name, "MistralForCausalLM") == 0) {
            snprintf(cfg.arch, sizeof(cfg.arch), "mistral");
        } else if (strcmp(name, "Qwen2ForCausalLM") == 0) {
            snprintf(cfg.arch, sizeof(cfg.arch), "qwen2");
        } else {
            fmt_seterr(err, errlen,
                       "config.json: no model_type and unknown architectures "
                       "'%.40s'",
                       name);
            rc = ST_EUNSUPPORTED;
            goto fail;
        }
    }
    if (!arch_known(cfg.arch)) {
        fmt_seterr(err, errlen, "config.json: unknown architecture '%s' (llama, mistral, qwen2)",
                   cfg.arch);
        rc = ST_EUNSUPPORTED;
        goto fail;
    }

    if (get_i32(root, "vocab_size", &cfg.vocab_size, err, errlen) != 1 ||
        get_i32(root, "hidden_size", &cfg.dim, err, errlen) != 1 ||
        get_i32(root, "num_hidden_layers", &cfg.n_layers, err, errlen) != 1 ||
        get_i32(root, "num_attention_heads", &cfg.n_heads, err, errlen) != 1 ||
        get_i32(root, "intermediate_size", &cfg.ffn_dim, err, errlen) != 1) {
        fmt_seterr(err, errlen,
                   "config.json: needs integer vocab_size, hidden_size, "
                   "num_hidden_layers, num_attention_heads, intermediate_size");
        goto fail;
    }
    cfg.n_kv_heads = cfg.n_heads;
    if (get_i32(root, "num_key_value_heads", &cfg.n_kv_heads, err, errlen) < 0 ||
        get_i32(root, "max_position_embeddings", &cfg.max_pos, err, errlen) < 0 ||
        get_f32(root, "rms_norm_eps", &cfg.norm_eps, err, errlen) < 0 ||
        get_f32(root, "rope_theta", &cfg.rope_theta, err, errlen) < 0 ||
        get_bool(root, "tie_word_embeddings", &cfg.tie_embeddings, err, errlen) < 0 ||
        get_bool(root, "attention_bias", &bias, err, errlen) < 0 ||
        get_bool(root, "use_sliding_window", &use_sw, err, errlen) < 0 ||
        get_i32(root, "sliding_window", &cfg.sliding_window, err, errlen) < 0 ||
        get_i32(root, "bos_token_id", &cfg.bos_id, err, errlen) < 0) {
        goto fail;
    }
    cfg.head_dim = cfg.n_heads > 0 ? cfg.dim / cfg.n_heads : 0;
    if (get_i32(root, "head_dim", &cfg.head_dim, err, errlen) < 0) {
        goto fail;
    }
    if (strcmp(cfg.arch, "qwen2") == 0) {
        cfg.qkv_bias = 1; /* hard-wired in Qwen2 */
    } else {
        cfg.qkv_bias = bias;
    }
    if (!use_sw) {
        cfg.sliding_window = 0;
    }
    rc = parse_rope_scaling(root, &cfg, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    rc = parse_eos(root, "config.json", &cfg, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }

    if (gen_json != NULL) {
        int32_t bos = -1;

        gen = cJSON_ParseWithLength(gen_json, gen_len);
        if (gen == NULL || !cJSON_IsObject(gen)) {
            fmt_seterr(err, errlen, "generation_config.json: not valid JSON");
            rc = ST_EFORMAT;
            goto fail;
        }
        rc = parse_eos(gen, "generation_config.json", &cfg, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
        if (get_i32(gen, "bos_token_id", &bos, err, errlen) < 0) {
            rc = ST_EFORMAT;
            goto fail;
        }
        if (cfg.bos_id < 0) {
            cfg.bos_id = bos;
        }
    }
    if (cfg.bos_id < 0) {
        cfg.bos_id = -1;
    }

    rc = mdl__config_check(&cfg, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "config.json: %s", why);
        goto fail;
    }
    cJSON_Delete(root);
    cJSON_Delete(gen);
    *out = cfg;
    return ST_OK;

fail:
    cJSON_Delete(root);
    cJSON_Delete(gen);
    return rc;
}

int
mdl__config_load_hf(const char *dir, mdl_config_t *cfg, char *err, size_t errlen)
{
    char path[4096], why[256];
    char *cj = NULL, *gj = NULL;
    size_t cl = 0, gl = 0;
    int rc;

    snprintf(path, sizeof(path), "%s/config.json", dir);
    rc = fmt_read_file(path, CONFIG_MAX_BYTES, &cj, &cl, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    rc = fmt_read_file(path, CONFIG_MAX_BYTES, &gj, &gl, err, errlen);
    if (rc == ST_ENOENT) {
        gj = NULL;
    } else if (rc != ST_OK) {
        free(cj);
        return rc;
    }
    rc = mdl__config_parse_hf(cj, cl, gj, gl, cfg, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: %s", dir, why);
    }
    free(cj);
    free(gj);
    return rc;
}

/* <arch>.<suffix> as an int32: 1 found, 0 absent, -1 bad. */
static int
gguf_arch_i32(const gguf_file_t *g, const char *arch, const char *suffix, int32_t *out, char *err,
              size_t errlen)
{
    char key[128];
    int64_t v;
    int rc;

    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    rc = gguf_get_i64(g, key, &v);
    if (rc == ST_ENOENT) {
        return 0;
    }
    if (rc != ST_OK || v < -2147483648LL || v > 2147483647LL) {
        fmt_seterr(err, errlen, "GGUF key %s is not a 32-bit integer", key);
        return -1;
    }
    *out = (int32_t)v;
    return 1;
}

static int
gguf_arch_f32(const gguf_file_t *g, const char *arch, const char *suffix, float *out, char *err,
              size_t errlen)
{
    char key[128];
    int rc;

    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    rc = gguf_get_f32(g, key, out);
    if (rc == ST_ENOENT) {
        return 0;
    }
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "GGUF key %s is not a number", key);
        return -1;
    }
    return 1;
}

/* llama.cpp stores llama3 rope scaling as a rope_freqs tensor: per
 * frequency i the divisor f_i = 1 (high frequencies), factor (low), or
 * 1 / ((1 - s) / factor + s) in between, with s = orig / wavelen - low
 * over (high - low). From it we recover parameters that give the same
 * divisors: factor = max f_i, and s_i of two in-between frequencies fix
 * A = orig / (high - low) and B = low / (high - low). Only A and B matter,
 * so we pick the scale that makes orig an integer near 3A (which gives
 * back Llama 3.1's own numbers: 8192, 1, 4). */
static int
llama3_from_rope_freqs(const gguf_tensor_t *t, mdl_config_t *cfg, char *err, size_t errlen)
{
    const double pi = 3.14159265358979323846;
    int32_t half = cfg->head_dim / 2, n_mid = 0, i0 = -1, i1 = -1;
    double factor = 1.0, x0 = 0, x1 = 0, s0 = 0, s1 = 0, a, b, k;
    float f;

    if (t->type != GGUF_TENSOR_F32 || t->n_dims != 1 || t->dims[0] != (uint64_t)half) {
        fmt_seterr(err, errlen, "rope_freqs.weight must be F32 [%d]", half);
        return ST_EFORMAT;
    }
    for (int32_t i = 0; i < half; i++) {
        memcpy(&f, (const float *)t->data + i, sizeof(f));
        if (!(f >= 1.0f) || !isfinite(f)) {
            fmt_seterr(err, errlen, "rope_freqs.weight[%d] = %g is not a llama3 factor", i,
                       (double)f);
            return ST_EUNSUPPORTED;
        }
        factor = fmax(factor, (double)f);
    }
    if (factor <= 1.0 + 1e-6) {
        return ST_OK; /* all ones: no scaling */
    }
    for (int32_t i = 0; i < half; i++) {
        double fi, s, inv_wl;

        memcpy(&f, (const float *)t->data + i, sizeof(f));
        fi = (double)f;
        if (fi <= 1.0 + 1e-6 || fi >= factor * (1.0 - 1e-6)) {
            continue;
        }
        s = (1.0 / fi - 1.0 / factor) / (1.0 - 1.0 / factor);
        inv_wl = 1.0 / (2.0 * pi * pow((double)cfg->rope_theta, 2.0 * i / cfg->head_dim));
        if (n_mid++ == 0) {
            i0 = i, x0 = inv_wl, s0 = s;
        } else {
            i1 = i, x1 = inv_wl, s1 = s;
        }
    }
    if (n_mid < 2 || x0 == x1) {
        fmt_seterr(err, errlen,
                   "rope_freqs.weight has %d in-between factors; 2 are needed to "
                   "recover the llama3 rope parameters",
                   n_mid);
        return ST_EUNSUPPORTED;
    }
    /* s = A * inv_wl - B */
    a = (s1 - s0) / (x1 - x0);
    b = a * x0 - s0;
    if (!(a > 0) || !(b > 0) || !isfinite(a) || !isfinite(b) || a * 3.0 > 2147483647.0) {
        fmt_seterr(err, errlen, "rope_freqs.weight is not a llama3 factor curve (%d, %d)", i0, i1);
        return ST_EUNSUPPORTED;
    }
    cfg->rope_orig_max_pos = (int32_t)llround(a * 3.0);
    if (cfg->rope_orig_max_pos <= 0) {
        cfg->rope_orig_max_pos = 1;
    }
    k = cfg->rope_orig_max_pos / a;
    cfg->rope_scaling = MDL_ROPE_LLAMA3;
    cfg->rope_factor = (float)factor;
    cfg->rope_low_freq_factor = (float)(b * k);
    cfg->rope_high_freq_factor = (float)((b + 1.0) * k);
    return ST_OK;
}

int
mdl__config_from_gguf(const gguf_file_t *g, mdl_config_t *out, char *err, size_t errlen)
{
    mdl_config_t cfg;
    const char *s;
    size_t n;
    int32_t rope_dims = 0, id;
    int64_t v;
    uint64_t n_tok;
    gguf_type_t et;
    const void *arr;
    const gguf_tensor_t *emb;
    char key[128];

    config_defaults(&cfg);
    if (gguf_get_str(g, "general.architecture", &s, &n) != ST_OK) {
        fmt_seterr(err, errlen, "no general.architecture");
        return ST_EFORMAT;
    }
    if (n >= sizeof(cfg.arch) || memchr(s, '\0', n) != NULL) {
        fmt_seterr(err, errlen, "unknown architecture '%.*s'", (int)(n > 40 ? 40 : n), s);
        return ST_EUNSUPPORTED;
    }
    memcpy(cfg.arch, s, n);
    cfg.arch[n] = '\0';
    if (!arch_known(cfg.arch)) {
        fmt_seterr(err, errlen, "unknown architecture '%s' (llama, mistral, qwen2)", cfg.arch);
        return ST_EUNSUPPORTED;
    }
    if (gguf_arch_i32(g, cfg.arch, "embedding_length", &cfg.dim, err, errlen) != 1 ||
        gguf_arch_i32(g, cfg.arch, "block_count", &cfg.n_layers, err, errlen) != 1 ||
        gguf_arch_i32(g, cfg.arch, "feed_forward_length", &cfg.ffn_dim, err, errlen) != 1 ||
        gguf_arch_i32(g, cfg.arch, "attention.head_count", &cfg.n_heads, err, errlen) != 1) {
        fmt_seterr(err, errlen,
                   "needs %s.embedding_length, block_count, feed_forward_length "
                   "and attention.head_count",
                   cfg.arch);
        return ST_EFORMAT;
    }
    cfg.n_kv_heads = cfg.n_heads;
    cfg.head_dim = cfg.n_heads > 0 ? cfg.dim / cfg.n_heads : 0;
    if (gguf_arch_i32(g, cfg.arch, "attention.head_count_kv", &cfg.n_kv_heads, err, errlen) < 0 ||
        gguf_arch_i32(g, cfg.arch, "context_length", &cfg.max_pos, err, errlen) < 0 ||
        gguf_arch_i32(g, cfg.arch, "attention.key_length", &cfg.head_dim, err, errlen) < 0 ||
        gguf_arch_i32(g, cfg.arch, "rope.dimension_count", &rope_dims, err, errlen) < 0 ||
        gguf_arch_i32(g, cfg.arch, "attention.sliding_window", &cfg.sliding_window, err, errlen) <
            0 ||
        gguf_arch_f32(g, cfg.arch, "attention.layer_norm_rms_epsilon", &cfg.norm_eps, err, errlen) <
            0 ||
        gguf_arch_f32(g, cfg.arch, "rope.freq_base", &cfg.rope_theta, err, errlen) < 0) {
        return ST_EFORMAT;
    }
    if (rope_dims != 0 && rope_dims != cfg.head_dim) {
        fmt_seterr(err, errlen, "partial rotary embedding (%d of %d dims) is not supported",
                   rope_dims, cfg.head_dim);
        return ST_EUNSUPPORTED;
    }
    snprintf(key, sizeof(key), "%s.rope.scaling.type", cfg.arch);
    if (gguf_get_str(g, key, &s, &n) == ST_OK && !(n == 4 && memcmp(s, "none", 4) == 0)) {
        if (n == 6 && memcmp(s, "linear", 6) == 0) {
            cfg.rope_scaling = MDL_ROPE_LINEAR;
            if (gguf_arch_f32(g, cfg.arch, "rope.scaling.factor", &cfg.rope_factor, err, errlen) !=
                    1 ||
                !(cfg.rope_factor > 0)) {
                fmt_seterr(err, errlen, "linear rope scaling needs rope.scaling.factor");
                return ST_EFORMAT;
            }
        } else {
            fmt_seterr(err, errlen, "unsupported rope scaling type '%.*s'", (int)(n > 32 ? 32 : n),
                       s);
            return ST_EUNSUPPORTED;
        }
    }
    if (gguf_find_tensor(g, "rope_freqs.weight") != NULL) {
        int rc =
            llama3_from_rope_freqs(gguf_find_tensor(g, "rope_freqs.weight"), &cfg, err, errlen);

        if (rc != ST_OK) {
            return rc;
        }
    }
    if (gguf_arch_i32(g, cfg.arch, "vocab_size", &cfg.vocab_size, err, errlen) < 0) {
        return ST_EFORMAT;
    }
    if (cfg.vocab_size == 0) {
        emb = gguf_find_tensor(g, "token_embd.weight");
        if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok, &arr) == ST_OK &&
            n_tok <= INT32_MAX) {
            cfg.vocab_size = (int32_t)n_tok;
        } else if (emb != NULL && emb->n_dims == 2 && emb->dims[1] <= INT32_MAX) {
            cfg.vocab_size = (int32_t)emb->dims[1];
        }
    }
    cfg.tie_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    cfg.qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    if (gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v) == ST_OK && v >= 0 && v <= INT32_MAX) {
        cfg.bos_id = (int32_t)v;
    }
    {
        static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                               "tokenizer.ggml.eot_token_id",
                                               "tokenizer.ggml.eom_token_id"};
        for (size_t i = 0; i < sizeof(eos_keys) / sizeof(eos_keys[0]); i++) {
            if (gguf_get_i64(g, eos_keys[i], &v) == ST_OK && v >= 0 && v <= INT32_MAX) {
                id = (int32_t)v;
                add_eos(&cfg, id);
            }
        }
    }
    {
        char why[200];
        int rc = mdl__config_check(&cfg, why, sizeof(why));

        if (rc != ST_OK) {
            fmt_seterr(err, errlen, "%s", why);
            return rc;
        }
    }
    *out = cfg;
    return ST_OK;
}
