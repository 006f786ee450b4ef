/* config.c - `kvserve serve` flags and the INI config file into one cfg_t.
 *
 * DESIGN. One table (opts[]) lists every global setting once: its flag name,
 * type, place in cfg_t, bounds and help. The same table drives the flag
 * parser, the INI handler, the usage text and cfg_write_ini(), so a key can
 * not exist in one and be missing from another. Tenant keys have their own
 * small table. libinih does the INI syntax; a line-counting reader gives
 * the handler the current line, so every error names file:line: key.
 */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"

typedef enum opt_type {
    OT_STR,     /* char[size] */
    OT_I32,     /* int32_t in [min, max] */
    OT_BYTES,   /* int64_t byte size with K/M/G/T suffix */
    OT_DBL,     /* double in [min, max] */
    OT_DUR,     /* double seconds, with ms/s/m/h unit */
    OT_BOOL,    /* int 0/1 */
    OT_ENUM,    /* char[size], one of choices ("a|b|c") */
    OT_HEX64,   /* char[65] SHA-256 digest, 64 hex chars */
    OT_APIKEY,  /* flag: a clear key, stored hashed in api_key_sha256 */
    OT_POLICY,  /* kv_policy string plus parsed sink/window */
    OT_LOGLVL,  /* int log level from a name */
    OT_CONFIG,  /* --config FILE: flag only */
    OT_HELP,    /* --help: flag only */
} opt_type_t;

typedef struct opt {
    const char *name;     /* flag name without dashes; file key with '-' or '_' */
    opt_type_t type;
    size_t off;           /* offset in cfg_t (or cfg_tenant_t) */
    size_t size;          /* for strings */
    double min, max;      /* numeric bounds */
    const char *choices;  /* OT_ENUM */
    const char *arg;      /* metavariable in the usage text */
    const char *help;
} opt_t;

#define F(field) offsetof(cfg_t, field), sizeof(((cfg_t *)0)->field)
#define T(field) offsetof(cfg_tenant_t, field), sizeof(((cfg_tenant_t *)0)->field)

static const opt_t opts[] = {
    {"model", OT_STR, F(model), 0, 0, NULL, "PATH",
     "model directory (Hugging Face layout) or .gguf file"},
    {"served-model-name", OT_STR, F(served_model_name), 0, 0, NULL, "NAME",
     "model id in the API (default: basename of --model)"},
    {"chat-template", OT_STR, F(chat_template), 0, 0, NULL, "FILE",
     "Jinja chat template (default: the model's own)"},
    {"tool-call-parser", OT_ENUM, F(tool_call_parser), 0, 0,
     "auto|hermes|llama3_json|mistral|generic", "NAME",
     "tool-call format: hermes, llama3_json, mistral, generic (auto: the template's)"},
    {"reasoning-parser", OT_ENUM, F(reasoning_parser), 0, 0, "none|deepseek_r1|qwen3", "NAME",
     "deepseek_r1 or qwen3: <think>...</think> into reasoning_content"},
    {"host", OT_STR, F(host), 0, 0, NULL, "ADDR", "address to listen on"},
    {"port", OT_I32, F(port), 0, 65535, NULL, "N", "TCP port (0: ephemeral)"},
    {"api-key", OT_APIKEY, F(api_key_sha256), 0, 0, NULL, "KEY",
     "require this bearer key (default tenant); env KVSERVE_API_KEY"},
    {"api-key-sha256", OT_HEX64, F(api_key_sha256), 0, 0, NULL, "HEX",
     "like --api-key, given as its digest (kvserve hash-key)"},
    {"admin-api-key", OT_APIKEY, F(admin_api_key_sha256), 0, 0, NULL, "KEY",
     "turn on the /admin/ routes (web console) for this bearer key; env KVSERVE_ADMIN_API_KEY"},
    {"admin-api-key-sha256", OT_HEX64, F(admin_api_key_sha256), 0, 0, NULL, "HEX",
     "like --admin-api-key, given as its digest (kvserve hash-key)"},
    {"public-metrics", OT_BOOL, F(public_metrics), 0, 0, NULL, NULL,
     "serve /metrics without a key"},
    {"public-health", OT_BOOL, F(public_health), 0, 0, NULL, NULL,
     "serve /health without a key"},
    {"allowed-origins", OT_STR, F(allowed_origins), 0, 0, NULL, "LIST",
     "CORS: origins browsers may call from, comma list or * (default: none)"},
    {"max-num-seqs", OT_I32, F(max_num_seqs), 1, 65536, NULL, "N",
     "sequences per step (running batch size)"},
    {"max-num-batched-tokens", OT_I32, F(max_num_batched_tokens), 1, 1 << 20, NULL, "N",
     "tokens per step (prefill chunks + decodes)"},
    {"block-size", OT_I32, F(block_size), 1, 1024, NULL, "N", "tokens per KV block"},
    {"num-kv-blocks", OT_I32, F(num_kv_blocks), 0, 1 << 28, NULL, "N",
     "device KV blocks (0: from --kv-cache-memory)"},
    {"kv-cache-memory", OT_BYTES, F(kv_cache_memory), 0, 0, NULL, "BYTES",
     "device KV cache size, suffix K/M/G (0: default)"},
    {"swap-space", OT_DBL, F(swap_space_gib), -1, 1024, NULL, "GIB",
     "CPU swap tier for preempted KV blocks, GiB (0: off; -1: 1 on cuda, 0 on cpu, where "
     "the KV pool is host RAM already and swapping would only copy it)"},
    {"mlock", OT_BOOL, F(mlock), 0, 0, NULL, NULL,
     "pin weights, KV pool and swap tier in RAM (needs RLIMIT_MEMLOCK)"},
    {"max-model-len", OT_I32, F(max_model_len), 0, 1 << 24, NULL, "N",
     "context length cap (0: the model's)"},
    {"device", OT_ENUM, F(device), 0, 0, "cpu|cuda", "DEV", "backend"},
    {"tensor-parallel-size", OT_I32, F(tensor_parallel_size), 1, 64, NULL, "N",
     "tensor-parallel ranks (GPUs, or CPU thread groups)"},
    {"gpu-memory-utilization", OT_DBL, F(gpu_memory_utilization), 0.01, 1, NULL, "F",
     "fraction of GPU memory kvserve may use"},
    {"enforce-eager", OT_BOOL, F(enforce_eager), 0, 0, NULL, NULL,
     "cuda: run every step eagerly (no CUDA graphs for decode steps; default off)"},
    {"dtype", OT_ENUM, F(dtype), 0, 0, "auto|f32|float32|bf16|bfloat16|f16|float16|half", "T",
     "weight type (auto: the file's; others convert at load)"},
    {"matmul-precision", OT_ENUM, F(matmul_precision), 0, 0, "high|medium", "P",
     "BF16 weights on the cpu backend: high (f32 accuracy) or medium (activations rounded to one "
     "bf16 term, as llama.cpp: faster, up to 2^-9 relative); other weight types ignore it"},
    {"kv-cache-dtype", OT_ENUM, F(kv_cache_dtype), 0, 0,
     "auto|f32|f16|bf16|fp8_e4m3|int8|int4|tq3|tq4", "T",
     "KV cache element type (tq3 / tq4: rotated 3 / 4-bit codes with a QJL key sketch, CPU)"},
    {"kv-policy", OT_POLICY, F(kv_policy), 0, 0, NULL, "P",
     "\"full\", \"sink=S,window=W\" (StreamingLLM), \"h2o=B,recent=W\" (heavy hitters) or "
     "\"snapkv=B,window=W,pool=K\" (tokens)"},
    {"enable-prefix-caching", OT_BOOL, F(enable_prefix_caching), 0, 0, NULL, NULL,
     "reuse KV blocks of shared prompt prefixes"},
    {"kv-watermark", OT_DBL, F(kv_watermark), 0, 0.5, NULL, "F",
     "share of KV blocks admission keeps free so running sequences grow without preemption"},
    {"vtc-input-weight", OT_DBL, F(vtc_input_weight), 0, 1e6, NULL, "W",
     "fair share: charge per computed prompt token"},
    {"vtc-cached-weight", OT_DBL, F(vtc_cached_weight), 0, 1e6, NULL, "W",
     "fair share: charge per prompt token served by the prefix cache"},
    {"vtc-output-weight", OT_DBL, F(vtc_output_weight), 0, 1e6, NULL, "W",
     "fair share: charge per generated token (a decode step each)"},
    {"pooling", OT_ENUM, F(pooling), 0, 0, "last|mean", "P",
     "/v1/embeddings pooling of the final hidden states: last token or mean"},
    {"threads", OT_I32, F(threads), 0, 4096, NULL, "N", "CPU threads (0: one per physical core it may run on)"},
    {"speculative-config", OT_STR, F(speculative_config), 0, 0, NULL, "JSON",
     "speculative decoding, vLLM's JSON ({\"method\": \"ngram\", ...})"},
    {"log-level", OT_LOGLVL, F(log_level), 0, 0, NULL, "L", "error|warn|info|debug|trace"},
    {"drain-timeout", OT_DUR, F(drain_timeout_s), 0, 86400, NULL, "T",
     "on SIGTERM, wait this long for in-flight requests"},
    {"max-body-bytes", OT_BYTES, F(max_body_bytes), 0, 0, NULL, "BYTES",
     "largest request body (413 beyond)"},
    {"max-header-bytes", OT_BYTES, F(max_header_bytes), 0, 0, NULL, "BYTES",
     "largest request head"},
    {"max-connections", OT_I32, F(max_connections), 1, 1 << 20, NULL, "N",
     "open connections in total"},
    {"max-connections-per-ip", OT_I32, F(max_connections_per_ip), 1, 1 << 20, NULL, "N",
     "open connections per client address"},
    {"idle-timeout", OT_DUR, F(idle_timeout_s), 0.001, 86400, NULL, "T",
     "close a connection idle this long"},
    {"request-timeout", OT_DUR, F(request_timeout_s), 0.001, 604800, NULL, "T",
     "total time one request may take, streaming included"},
    {"max-n", OT_I32, F(max_n), 1, 1024, NULL, "N", "largest \"n\" per request"},
    {"max-tokens-cap", OT_I32, F(max_tokens_cap), 0, 1 << 24, NULL, "N",
     "largest max_tokens (0: --max-model-len)"},
    {"max-waiting-requests", OT_I32, F(max_waiting_requests), 1, 1 << 24, NULL, "N",
     "queued requests over all tenants (429 beyond)"},
    {"max-sse-buffer-bytes", OT_BYTES, F(max_sse_buffer_bytes), 0, 0, NULL, "BYTES",
     "unsent stream bytes per client before it is dropped"},
    {"kv-events-config", OT_STR, F(kv_events_config), 0, 0, NULL, "JSON",
     "KV-cache events over ZMQ, vLLM's JSON (README \"Scaling out\")"},
    {"config", OT_CONFIG, 0, 0, 0, 0, NULL, "FILE", "INI file; flags override it"},
    {"help", OT_HELP, 0, 0, 0, 0, NULL, NULL, "print this help"},
};

#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

static const opt_t tenant_opts[] = {
    {"api-key-sha256", OT_HEX64, T(api_key_sha256), 0, 0, NULL, "HEX",
     "SHA-256 of the tenant's key (kvserve hash-key)"},
    {"weight", OT_DBL, T(weight), 1e-6, 1e6, NULL, "W", "fair-share weight"},
    {"max-running", OT_I32, T(max_running), 0, 1 << 24, NULL, "N",
     "concurrent requests (0: unlimited)"},
    {"max-waiting", OT_I32, T(max_waiting), 0, 1 << 24, NULL, "N",
     "queued requests before 429 (0: unlimited)"},
    {"max-kv-share", OT_DBL, T(max_kv_share), 1e-6, 1, NULL, "F",
     "share of device KV blocks, (0, 1]"},
    {"prefix-cache-salt", OT_STR, T(prefix_cache_salt), 0, 0, NULL, "S",
     "tenants with equal salts share prefix cache (default: own name)"},
    {"tokens-per-minute", OT_BYTES, T(tokens_per_minute), 0, 0, NULL, "N",
     "prompt + generated tokens per minute (0: unlimited)"},
};

#define N_TENANT_OPTS (sizeof(tenant_opts) / sizeof(tenant_opts[0]))

/* ------------------------------------------------------------------ */
/* Small parsers.                                                      */

static void
set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Compares a flag/key name with '-' and '_' treated as equal. */
static int
name_eq(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char x = *a == '_' ? '-' : *a;
        char y = *b == '_' ? '-' : *b;
        if (x != y) {
            return 0;
        }
    }
    return *a == '\0' && *b == '\0';
}

static int
parse_i64(const char *s, long long *out)
{
    char *end;

    if (*s == '\0' || isspace((unsigned char)*s)) {
        return ST_EINVAL;
    }
    errno = 0;
    *out = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return ST_EINVAL;
    }
    return ST_OK;
}

static int
parse_dbl(const char *s, double *out)
{
    char *end;

    if (*s == '\0' || isspace((unsigned char)*s)) {
        return ST_EINVAL;
    }
    errno = 0;
    *out = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(*out)) {
        return ST_EINVAL;
    }
    return ST_OK;
}

int
cfg_parse_bytes(const char *s, int64_t *out)
{
    char *end;
    double v;
    double mul = 1;

    if (s == NULL || *s == '\0' || isspace((unsigned char)*s) || *s == '-') {
        return ST_EINVAL;
    }
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        return ST_EINVAL;
    }
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        mul = 1024.0;
        break;
    case 'M':
        mul = 1024.0 * 1024;
        break;
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        break;
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        break;
    case 'B':
        break;
    default:
        return ST_EINVAL;
    }
    if (*end != '\0' && toupper((unsigned char)*end) != 'B') {
        end++;
        if (*end == 'i') {
            end++;
        }
    }
    if (*end == 'B' || *end == 'b') {
        end++;
    }
    if (*end != '\0') {
        return ST_EINVAL;
    }
    v *= mul;
    if (v > 9.0e18 || v != floor(v)) {
        return ST_EINVAL;
    }
    *out = (int64_t)v;
    return ST_OK;
}

int
cfg_parse_duration(const char *s, double *out_s)
{
    char *end;
    double v;

    if (s == NULL || *s == '\0' || isspace((unsigned char)*s) || *s == '-') {
        return ST_EINVAL;
    }
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        return ST_EINVAL;
    }
    if (strcmp(end, "ms") == 0) {
        v /= 1000.0;
    } else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) {
        v *= 60.0;
    } else if (strcmp(end, "h") == 0) {
        v *= 3600.0;
    } else if (*end != '\0' && strcmp(end, "s") != 0) {
        return ST_EINVAL;
    }
    *out_s = v;
    return ST_OK;
}

static int
parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};

    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return ST_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return ST_OK;
        }
    }
    return ST_EINVAL;
}

static int
enum_has(const char *choices, const char *s)
{
    size_t n = strlen(s);

    for (const char *p = choices; *p != '\0';) {
        const char *bar = strchr(p, '|');
        size_t len = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0) {
            return 1;
        }
        p += len + (bar != NULL ? 1 : 0);
    }
    return 0;
}

static int
hex64_ok(const char *s)
{
    if (strlen(s) != 64) {
        return 0;
    }
    for (size_t i = 0; i < 64; i++) {
        if (!isxdigit((unsigned char)s[i])) {
            return 0;
        }
    }
    return 1;
}

/* "full" -> 0/0; "sink=S,window=W" (either order, sink optional). */
static int
parse_policy(const char *s, int32_t *sink, int32_t *window)
{
    char buf[64];
    char *save = NULL;
    long long v;
    int have_window = 0;

    if (strcmp(s, "full") == 0) {
        *sink = 0;
        *window = 0;
        return ST_OK;
    }
    if (strncmp(s, "h2o=", 4) == 0 || strncmp(s, "snapkv=", 7) == 0) {
        /* H2O / SnapKV (model/kv_policy.h): the shape here; kvserve serve
         * checks the numbers against the context and the backend. */
        int b, w, k, used = 0, n = s[0] == 'h' ? sscanf(s, "h2o=%d,recent=%d%n", &b, &w, &used)
                                            : sscanf(s, "snapkv=%d,window=%d%n,pool=%d%n", &b,
                                                     &w, &used, &k, &used);
        *sink = 0;
        *window = 0;
        return n >= 2 && s[used] == '\0' && w >= 1 && b > w ? ST_OK : ST_EINVAL;
    }
    if (strlen(s) >= sizeof(buf)) {
        return ST_EINVAL;
    }
    strcpy(buf, s);
    *sink = 0;
    *window = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL) {
            return ST_EINVAL;
        }
        *eq = '\0';
        if (parse_i64(eq + 1, &v) != ST_OK || v < 0 || v > (1 << 24)) {
            return ST_EINVAL;
        }
        if (strcmp(tok, "sink") == 0) {
            *sink = (int32_t)v;
        } else if (strcmp(tok, "window") == 0) {
            *window = (int32_t)v;
            have_window = 1;
        } else {
            return ST_EINVAL;
        }
    }
    return have_window && *window > 0 ? ST_OK : ST_EINVAL;
}

/* Describes what a value of this option must look like, for messages. */
static void
expect_text(const opt_t *o, char *buf, size_t len)
{
    switch (o->type) {
    case OT_I32:
        snprintf(buf, len, "an integer in %.0f..%.0f", o->min, o->max);
        break;
    case OT_DBL:
        snprintf(buf, len, "a number in %g..%g", o->min, o->max);
        break;
    case OT_DUR:
        snprintf(buf, len, "a duration (e.g. 30, 250ms, 2m) in %gs..%gs", o->min, o->max);
        break;
    case OT_BYTES:
        snprintf(buf, len, "a non-negative size (e.g. 4096, 512K, 2G)");
        break;
    case OT_BOOL:
        snprintf(buf, len, "true or false");
        break;
    case OT_ENUM:
        snprintf(buf, len, "one of %s", o->choices);
        break;
    case OT_HEX64:
        snprintf(buf, len, "64 hex digits (kvserve hash-key prints them)");
        break;
    case OT_POLICY:
        snprintf(buf, len, "full, sink=S,window=W with W > 0, h2o=B,recent=W or "
                           "snapkv=B,window=W,pool=K with 1 <= W < B");
        break;
    case OT_LOGLVL:
        snprintf(buf, len, "one of error|warn|info|debug|trace");
        break;
    case OT_STR:
    case OT_APIKEY:
    case OT_CONFIG:
    case OT_HELP:
        snprintf(buf, len, "a non-empty UTF-8 string shorter than %zu bytes", o->size);
        break;
    }
}

/* Stores value into the field of base described by o. ST_OK or ST_EINVAL. */
static int
opt_set(const opt_t *o, void *base, const char *value, int *has_api_key)
{
    char *p = (char *)base + o->off;
    long long iv;
    double dv;
    int64_t bv;
    int bo;

    if (strncmp(o->name, "admin-", 6) == 0) {
        has_api_key = NULL; /* the admin key is no tenant's: it never turns auth on */
    }

    switch (o->type) {
    case OT_STR:
        /* Names end up in JSON replies and metric labels: UTF-8 only, no
         * control characters, and nothing cfg_write_ini() could not write
         * back (a leading ';' or '#' would read back as a comment). */
        if (strlen(value) >= o->size || !utf8_valid(value, strlen(value)) || value[0] == ';' ||
            value[0] == '#') {
            return ST_EINVAL;
        }
        for (const char *c = value; *c != '\0'; c++) {
            if ((unsigned char)*c < 0x20 || *c == 0x7f) {
                return ST_EINVAL;
            }
        }
        strcpy(p, value);
        return ST_OK;
    case OT_I32:
        if (parse_i64(value, &iv) != ST_OK || iv < o->min || iv > o->max) {
            return ST_EINVAL;
        }
        *(int32_t *)p = (int32_t)iv;
        return ST_OK;
    case OT_BYTES:
        if (cfg_parse_bytes(value, &bv) != ST_OK) {
            return ST_EINVAL;
        }
        *(int64_t *)p = bv;
        return ST_OK;
    case OT_DBL:
        if (parse_dbl(value, &dv) != ST_OK || dv < o->min || dv > o->max) {
            return ST_EINVAL;
        }
        *(double *)p = dv;
        return ST_OK;
    case OT_DUR:
        if (cfg_parse_duration(value, &dv) != ST_OK || dv < o->min || dv > o->max) {
            return ST_EINVAL;
        }
        *(double *)p = dv;
        return ST_OK;
    case OT_BOOL:
        if (parse_bool(value, &bo) != ST_OK) {
            return ST_EINVAL;
        }
        *(int *)p = bo;
        return ST_OK;
    case OT_ENUM:
        if (!enum_has(o->choices, value) || strlen(value) >= o->size) {
            return ST_EINVAL;
        }
        strcpy(p, value);
        return ST_OK;
    case OT_HEX64:
        if (*value == '\0') {
            p[0] = '\0'; /* unset */
            if (has_api_key != NULL) {
                *has_api_key = 0;
            }
            return ST_OK;
        }
        if (!hex64_ok(value)) {
            return ST_EINVAL;
        }
        for (size_t i = 0; i < 64; i++) {
            p[i] = (char)tolower((unsigned char)value[i]);
        }
        p[64] = '\0';
        if (has_api_key != NULL) {
            *has_api_key = 1;
        }
        return ST_OK;
    case OT_APIKEY:
        if (*value == '\0') {
            return ST_EINVAL;
        }
        sha256_hex(value, strlen(value), p);
        if (has_api_key != NULL) {
            *has_api_key = 1;
        }
        return ST_OK;
    case OT_POLICY: {
        cfg_t *c = base;
        int32_t sink, window;
        if (strlen(value) >= o->size || parse_policy(value, &sink, &window) != ST_OK) {
            return ST_EINVAL;
        }
        strcpy(p, value);
        c->kv_policy_sink = sink;
        c->kv_policy_window = window;
        return ST_OK;
    }
    case OT_LOGLVL:
        iv = log_level_parse(value);
        if (iv < 0) {
            return ST_EINVAL;
        }
        *(int *)p = (int)iv;
        return ST_OK;
    case OT_CONFIG:
    case OT_HELP:
        break;
    }
    return ST_EINVAL;
}

static const opt_t *
opt_find(const opt_t *tab, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (name_eq(tab[i].name, name)) {
            return &tab[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Defaults.                                                           */

static void
tenant_defaults(cfg_tenant_t *t, const char *name)
{
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->weight = 1.0;
    t->max_kv_share = 1.0;
}

void
cfg_defaults(cfg_t *c)
{
    memset(c, 0, sizeof(*c));
    strcpy(c->model, "models/austen-2.7m");
    strcpy(c->host, "127.0.0.1");
    c->port = 8000;
    c->public_metrics = 1;
    c->public_health = 1;
    c->max_num_seqs = 128;
    c->max_num_batched_tokens = 2048;
    c->block_size = 16;
    c->swap_space_gib = -1.0; /* auto: cfg_validate */
    strcpy(c->device, "cpu");
    c->tensor_parallel_size = 1;
    c->gpu_memory_utilization = 0.9;
    c->enforce_eager = 0; /* decode graphs: checked on an H200 against eager steps */
    strcpy(c->kv_cache_dtype, "auto");
    strcpy(c->tool_call_parser, "auto");
    strcpy(c->reasoning_parser, "none");
    strcpy(c->dtype, "auto");
    strcpy(c->matmul_precision, "high");
    strcpy(c->kv_policy, "full");
    c->enable_prefix_caching = 1;
    c->kv_watermark = 0.01;
    c->vtc_input_weight = 1.0;
    c->vtc_cached_weight = 0.25;
    c->vtc_output_weight = 2.0;
    strcpy(c->pooling, "last");
    c->log_level = LOG_LEVEL_INFO;
    c->drain_timeout_s = 30.0;
    c->max_body_bytes = 8 << 20;
    c->max_header_bytes = 16 << 10;
    c->max_connections = 1024;
    c->max_connections_per_ip = 256;
    c->idle_timeout_s = 60.0;
    c->request_timeout_s = 600.0;
    c->max_n = 16;
    c->max_waiting_requests = 1024;
    c->max_sse_buffer_bytes = 1 << 20;
    c->n_tenants = 1;
    tenant_defaults(&c->tenants[0], "default");
}

/* ------------------------------------------------------------------ */
/* The INI file.                                                       */

typedef struct file_ctx {
    cfg_t *cfg;
    const char *path;
    FILE *fp;
    int line;             /* line of the text the handler is looking at */
    int at_line_start;    /* the reader's previous chunk ended a line */
    int section_line;     /* line of the latest [section] header */
    int failed;           /* the handler reported an error */
    char *err;
    size_t errlen;
    char prev_section[128];
    int cur_tenant;       /* -1: global section */
    uint64_t seen;        /* keys already set in the current section */
    int tenant_line[CFG_MAX_TENANTS];
    int default_seen;     /* a [tenant default] section was read */
} file_ctx_t;

/* ini_reader: fgets that also counts lines. */
static char *
file_reader(char *str, int num, void *stream)
{
    file_ctx_t *fc = stream;
    char *r = fgets(str, num, fc->fp);
    size_t n;
    const char *p;

    if (r == NULL) {
        return NULL;
    }
    if (fc->at_line_start) {
        fc->line++;
        for (p = str; *p == ' ' || *p == '\t'; p++) {
        }
        if (*p == '[') {
            fc->section_line = fc->line;
        }
    }
    n = strlen(str);
    fc->at_line_start = n > 0 && str[n - 1] == '\n';
    return r;
}

static int
file_fail(file_ctx_t *fc, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!fc->failed) {
        set_err(fc->err, fc->errlen, "%s:%d: %s: %s", fc->path, fc->line, key, msg);
        fc->failed = 1;
    }
    return 0;
}

static int
tenant_name_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n >= CFG_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') {
            return 0;
        }
    }
    return 1;
}

/* Called when the handler sees a key in a section it has not seen before. */
static int
file_enter_section(file_ctx_t *fc, const char *section)
{
    cfg_t *c = fc->cfg;
    const char *name;

    snprintf(fc->prev_section, sizeof(fc->prev_section), "%s", section);
    fc->seen = 0;
    if (section[0] == '\0' || strcmp(section, "serve") == 0) {
        fc->cur_tenant = -1;
        return 1;
    }
    if (strncmp(section, "tenant", 6) != 0 || !isspace((unsigned char)section[6])) {
        fc->line = fc->section_line;
        return file_fail(fc, section, "unknown section (expected [serve] or [tenant NAME])");
    }
    for (name = section + 6; isspace((unsigned char)*name); name++) {
    }
    if (!tenant_name_ok(name)) {
        fc->line = fc->section_line;
        return file_fail(fc, section,
                         "tenant names are 1..63 characters from A-Z a-z 0-9 . _ -");
    }
    if (strcmp(name, "default") == 0) {
        if (fc->default_seen) {
            fc->line = fc->section_line;
            return file_fail(fc, section, "duplicate tenant section");
        }
        fc->default_seen = 1;
        fc->cur_tenant = 0;
        fc->tenant_line[0] = fc->section_line;
        return 1;
    }
    for (int i = 1; i < c->n_tenants; i++) {
        if (strcmp(c->tenants[i].name, name) == 0) {
            fc->line = fc->section_line;
            return file_fail(fc, section, "duplicate tenant section");
        }
    }
    if (c->n_tenants >= CFG_MAX_TENANTS) {
        fc->line = fc->section_line;
        return file_fail(fc, section, "too many tenants (at most %d with the default)",
                         CFG_MAX_TENANTS);
    }
    fc->cur_tenant = c->n_tenants++;
    tenant_defaults(&c->tenants[fc->cur_tenant], name);
    fc->tenant_line[fc->cur_tenant] = fc->section_line;
    return 1;
}

static int
file_handler(void *user, const char *section, const char *name, const char *value)
{
    file_ctx_t *fc = user;
    const opt_t *tab = opts;
    size_t ntab = N_OPTS;
    const opt_t *o;
    void *base;
    int *has_key = NULL;
    char expect[128];
    size_t idx;

    if (fc->failed) {
        return 0;
    }
    /* libinih reports no empty sections: a section begins at its first key. */
    if (strcmp(section, fc->prev_section) != 0 && !file_enter_section(fc, section)) {
        return 0;
    }
    if (fc->cur_tenant >= 0) {
        tab = tenant_opts;
        ntab = N_TENANT_OPTS;
        base = &fc->cfg->tenants[fc->cur_tenant];
    } else {
        base = fc->cfg;
        has_key = &fc->cfg->has_api_key;
    }
    o = opt_find(tab, ntab, name);
    if (o == NULL) {
        return file_fail(fc, name, "unknown key%s",
                         fc->cur_tenant >= 0 ? " in a tenant section" : "");
    }
    if (o->type == OT_CONFIG || o->type == OT_HELP) {
        return file_fail(fc, name, "only valid on the command line");
    }
    if (o->type == OT_APIKEY) {
        return file_fail(fc, name, "keys are not stored in clear: use %s_sha256 "
                                   "(kvserve hash-key prints it)",
                         strncmp(o->name, "admin-", 6) == 0 ? "admin_api_key" : "api_key");
    }
    idx = (size_t)(o - tab);
    if (fc->seen & ((uint64_t)1 << idx)) {
        return file_fail(fc, name, "set twice in the same section");
    }
    fc->seen |= (uint64_t)1 << idx;
    if (opt_set(o, base, value, has_key) != ST_OK) {
        expect_text(o, expect, sizeof(expect));
        return file_fail(fc, name, "expected %s, got '%s'", expect, value);
    }
    return 1;
}

/* libinih's settings are process-wide: long lines, no continuation lines,
 * stop at the first error. */
static void
ini_setup(void)
{
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_max_line = 8192;
    ini_allow_multiline = false;
    ini_stop_on_first_error = true;
    ini_allow_no_value = false;
}

int
cfg_load_file(cfg_t *cfg, const char *path, char *err, size_t errlen)
{
    file_ctx_t fc;
    int rc;

    memset(&fc, 0, sizeof(fc));
    fc.cfg = cfg;
    fc.path = path;
    fc.err = err;
    fc.errlen = errlen;
    fc.at_line_start = 1;
    fc.cur_tenant = -1;
    fc.fp = fopen(path, "r");
    if (fc.fp == NULL) {
        rc = -errno;
        set_err(err, errlen, "%s: %s", path, st_str(rc));
        return rc;
    }
    ini_setup();
    rc = ini_parse_stream(file_reader, &fc, file_handler, &fc);
    fclose(fc.fp);
    if (fc.failed) {
        return ST_EFORMAT;
    }
    if (rc < 0) {
        set_err(err, errlen, "%s: out of memory while parsing", path);
        return ST_ENOMEM;
    }
    if (rc > 0) {
        set_err(err, errlen, "%s:%d: syntax error (expected key = value or [section])",
                path, rc);
        return ST_EFORMAT;
    }
    for (int i = 1; i < cfg->n_tenants; i++) {
        if (cfg->tenants[i].api_key_sha256[0] == '\0') {
            set_err(err, errlen, "%s:%d: tenant %s: api_key_sha256 is required", path,
                    fc.tenant_line[i], cfg->tenants[i].name);
            return ST_EFORMAT;
        }
    }
    snprintf(cfg->config_path, sizeof(cfg->config_path), "%s", path);
    return ST_OK;
}

/* ------------------------------------------------------------------ */
/* Command line.                                                       */

/* Cross-field checks after every source has been applied. */
static int
cfg_validate(cfg_t *c, char *err, size_t errlen)
{
    if (c->num_kv_blocks > 0 && c->kv_cache_memory > 0) {
        set_err(err, errlen, "--num-kv-blocks and --kv-cache-memory are exclusive");
        return ST_EINVAL;
    }
    if (c->max_num_batched_tokens < c->max_num_seqs) {
        /* Every running sequence decodes one token a step: fewer tokens
         * than sequences and some decodes starve every step. */
        set_err(err, errlen,
                "--max-num-batched-tokens %d is below --max-num-seqs %d: every running sequence "
                "needs a token each step",
                c->max_num_batched_tokens, c->max_num_seqs);
        return ST_EINVAL;
    }
    if (c->swap_space_gib < 0) {
        c->swap_space_gib = strcmp(c->device, "cuda") == 0 ? 1.0 : 0.0;
    }
    if (c->vtc_input_weight == 0 && c->vtc_output_weight == 0) {
        set_err(err, errlen, "--vtc-input-weight and --vtc-output-weight are both 0: the fair "
                             "share would never move");
        return ST_EINVAL;
    }
    if (c->model[0] == '\0') {
        set_err(err, errlen, "--model: must not be empty");
        return ST_EINVAL;
    }
    if (c->host[0] == '\0') {
        set_err(err, errlen, "--host: must not be empty");
        return ST_EINVAL;
    }
    if (c->kv_policy_window > 0 &&
        (c->kv_policy_sink % c->block_size != 0 || c->kv_policy_window % c->block_size != 0)) {
        set_err(err, errlen, "--kv-policy: sink and window must be multiples of --block-size "
                             "(%d)", c->block_size);
        return ST_EINVAL;
    }
    if (c->max_body_bytes < 1024) {
        set_err(err, errlen, "--max-body-bytes: at least 1K");
        return ST_EINVAL;
    }
    if (c->max_header_bytes < 1024) {
        set_err(err, errlen, "--max-header-bytes: at least 1K");
        return ST_EINVAL;
    }
    if (c->max_sse_buffer_bytes < 4096) {
        set_err(err, errlen, "--max-sse-buffer-bytes: at least 4K");
        return ST_EINVAL;
    }
    if (c->max_connections_per_ip > c->max_connections) {
        c->max_connections_per_ip = c->max_connections;
    }
    c->tenants[0].api_key_sha256[0] = '\0';
    if (c->has_api_key) {
        memcpy(c->tenants[0].api_key_sha256, c->api_key_sha256, 65);
    }
    c->auth_required = c->has_api_key || c->n_tenants > 1;
    for (int i = 0; i < c->n_tenants && c->admin_api_key_sha256[0] != '\0'; i++) {
        if (strcmp(c->tenants[i].api_key_sha256, c->admin_api_key_sha256) == 0) {
            set_err(err, errlen, "the admin API key is also tenant %s's API key",
                    c->tenants[i].name);
            return ST_EINVAL;
        }
    }
    for (int i = 0; i < c->n_tenants; i++) {
        for (int j = i + 1; j < c->n_tenants; j++) {
            if (c->tenants[i].api_key_sha256[0] != '\0' &&
                strcmp(c->tenants[i].api_key_sha256, c->tenants[j].api_key_sha256) == 0) {
                set_err(err, errlen, "tenants %s and %s have the same API key",
                        c->tenants[i].name, c->tenants[j].name);
                return ST_EINVAL;
            }
        }
    }
    return ST_OK;
}

int
cfg_parse(int argc, char **argv, cfg_t *out, char *err, size_t errlen)
{
    const char *config = NULL;
    int have_positional = 0;
    int rc;

    if (err != NULL && errlen > 0) {
        err[0] = '\0';
    }
    cfg_defaults(out);

    /* Pass 1: --help and --config, so the file is applied before any flag. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return CFG_HELP;
        }
        if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc) {
                set_err(err, errlen, "--config: missing value");
                return ST_EINVAL;
            }
            config = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            config = a + 9;
        } else if (strcmp(a, "--") == 0) {
            break;
        }
    }
    if (config != NULL) {
        if (*config == '\0') {
            set_err(err, errlen, "--config: must not be empty");
            return ST_EINVAL;
        }
        rc = cfg_load_file(out, config, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
    }

    /* Pass 2: the flags, in order; the last one wins. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char name[64];
        const char *value = NULL;
        const char *eq;
        const opt_t *o;
        int negate = 0;
        char expect[128];

        if (a[0] != '-' || a[1] == '\0') {
            if (have_positional) {
                set_err(err, errlen, "unexpected argument '%s' (the model is already given)",
                        a);
                return ST_EINVAL;
            }
            have_positional = 1;
            if (strlen(a) >= sizeof(out->model)) {
                set_err(err, errlen, "model path too long");
                return ST_EINVAL;
            }
            strcpy(out->model, a);
            continue;
        }
        if (a[1] != '-') {
            set_err(err, errlen, "%s: unknown flag (see kvserve serve --help)", a);
            return ST_EINVAL;
        }
        eq = strchr(a + 2, '=');
        if ((eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2)) >= sizeof(name)) {
            set_err(err, errlen, "%.64s...: unknown flag", a);
            return ST_EINVAL;
        }
        if (eq != NULL) {
            memcpy(name, a + 2, (size_t)(eq - a - 2));
            name[eq - a - 2] = '\0';
            value = eq + 1;
        } else {
            strcpy(name, a + 2);
        }
        o = opt_find(opts, N_OPTS, name);
        if (o == NULL && strncmp(name, "no-", 3) == 0) {
            o = opt_find(opts, N_OPTS, name + 3);
            if (o != NULL && o->type != OT_BOOL) {
                o = NULL;
            }
            negate = 1;
        }
        if (o == NULL) {
            set_err(err, errlen, "--%s: unknown flag (see kvserve serve --help)", name);
            return ST_EINVAL;
        }
        if (o->type == OT_CONFIG) {
            i += eq == NULL ? 1 : 0;
            continue;
        }
        if (o->type == OT_BOOL) {
            if (negate && value != NULL) {
                set_err(err, errlen, "--%s: takes no value", name);
                return ST_EINVAL;
            }
            if (value == NULL) {
                value = negate ? "false" : "true";
            }
        } else if (value == NULL) {
            if (i + 1 >= argc) {
                set_err(err, errlen, "--%s: missing value", o->name);
                return ST_EINVAL;
            }
            value = argv[++i];
        }
        if (opt_set(o, out, value, &out->has_api_key) != ST_OK) {
            expect_text(o, expect, sizeof(expect));
            set_err(err, errlen, "--%s: expected %s, got '%s'", o->name, expect,
                    o->type == OT_APIKEY ? "" : value);
            return ST_EINVAL;
        }
    }

    if (!out->has_api_key) {
        const char *env = getenv("KVSERVE_API_KEY");
        if (env != NULL && *env != '\0') {
            sha256_hex(env, strlen(env), out->api_key_sha256);
            out->has_api_key = 1;
        }
    }
    if (out->admin_api_key_sha256[0] == '\0') {
        const char *env = getenv("KVSERVE_ADMIN_API_KEY");
        if (env != NULL && *env != '\0') {
            sha256_hex(env, strlen(env), out->admin_api_key_sha256);
        }
    }
    return cfg_validate(out, err, errlen);
}

/* ------------------------------------------------------------------ */
/* Output.                                                             */

static void
opt_format(const opt_t *o, const void *base, char *buf, size_t len)
{
    const char *p = (const char *)base + o->off;

    switch (o->type) {
    case OT_STR:
    case OT_ENUM:
    case OT_HEX64:
    case OT_APIKEY:
    case OT_POLICY:
        snprintf(buf, len, "%s", p);
        break;
    case OT_I32:
        snprintf(buf, len, "%d", (int)*(const int32_t *)p);
        break;
    case OT_BYTES:
        snprintf(buf, len, "%lld", (long long)*(const int64_t *)p);
        break;
    case OT_DBL:
    case OT_DUR: { /* the shortest form that reads back as the same double: 0.9, not
                    * 0.90000000000000002 */
        const double v = *(const double *)p;

        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, len, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) {
                break;
            }
        }
        break;
    }
    case OT_BOOL:
        snprintf(buf, len, "%s", *(const int *)p ? "true" : "false");
        break;
    case OT_LOGLVL: {
        int l = *(const int *)p;
        snprintf(buf, len, "%s",
                 l <= LOG_LEVEL_ERR    ? "error"
                 : l <= LOG_LEVEL_WARN ? "warn"
                 : l <= LOG_LEVEL_INFO ? "info"
                 : l <= LOG_LEVEL_DEBUG ? "debug"
                                        : "trace");
        break;
    }
    case OT_CONFIG:
    case OT_HELP:
        buf[0] = '\0';
        break;
    }
}

void
cfg_usage(FILE *f)
{
    cfg_t d;
    char def[96];
    char lhs[64];

    cfg_defaults(&d);
    fprintf(f, "usage: kvserve serve [MODEL] [OPTIONS]\n\n"
               "Serves the model over an OpenAI-compatible HTTP API.\n"
               "Flags override the --config file; booleans also take --no-FLAG.\n\n"
               "options:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (o->type == OT_BOOL) {
            snprintf(lhs, sizeof(lhs), "--[no-]%s", o->name);
        } else if (o->arg != NULL) {
            snprintf(lhs, sizeof(lhs), "--%s %s", o->name, o->arg);
        } else {
            snprintf(lhs, sizeof(lhs), "--%s", o->name);
        }
        opt_format(o, &d, def, sizeof(def));
        if (o->type == OT_APIKEY || o->type == OT_HEX64 || o->type == OT_CONFIG ||
            o->type == OT_HELP || def[0] == '\0') {
            fprintf(f, "  %-34s %s\n", lhs, o->help);
        } else {
            fprintf(f, "  %-34s %s [%s]\n", lhs, o->help, def);
        }
    }
    fprintf(f, "\ntenants ([tenant NAME] sections of the config file):\n");
    for (size_t i = 0; i < N_TENANT_OPTS; i++) {
        const opt_t *o = &tenant_opts[i];
        snprintf(lhs, sizeof(lhs), "%s = %s", o->name, o->arg);
        for (char *p = lhs; *p != '\0' && *p != ' '; p++) {
            *p = *p == '-' ? '_' : *p;
        }
        fprintf(f, "  %-34s %s\n", lhs, o->help);
    }
}

static void
key_name(const char *flag, char *out, size_t len)
{
    size_t i;

    for (i = 0; flag[i] != '\0' && i + 1 < len; i++) {
        out[i] = flag[i] == '-' ? '_' : flag[i];
    }
    out[i] = '\0';
}

void
cfg_write_ini(const cfg_t *c, FILE *f)
{
    char key[64];
    char val[CFG_PATH_MAX + 8];

    fprintf(f, "[serve]\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (o->type == OT_CONFIG || o->type == OT_HELP || o->type == OT_APIKEY) {
            continue;
        }
        if (o->type == OT_HEX64 && !c->has_api_key && strncmp(o->name, "admin-", 6) != 0) {
            continue;
        }
        opt_format(o, c, val, sizeof(val));
        if (val[0] == '\0' && (o->type == OT_STR || o->type == OT_HEX64)) {
            continue; /* empty strings are the defaults "" */
        }
        key_name(o->name, key, sizeof(key));
        fprintf(f, "%s = %s\n", key, val);
    }
    for (int t = 0; t < c->n_tenants; t++) {
        const cfg_tenant_t *tn = &c->tenants[t];
        fprintf(f, "\n[tenant %s]\n", tn->name);
        for (size_t i = 0; i < N_TENANT_OPTS; i++) {
            const opt_t *o = &tenant_opts[i];
            opt_format(o, tn, val, sizeof(val));
            if (val[0] == '\0' || (t == 0 && o->type == OT_HEX64)) {
                continue;
            }
            key_name(o->name, key, sizeof(key));
            fprintf(f, "%s = %s\n", key, val);
        }
    }
}

int
cfg_tenant_find_by_key(const cfg_t *c, const char *api_key)
{
    char digest[65];
    int found = -1;

    if (api_key == NULL) {
        return -1;
    }
    sha256_hex(api_key, strlen(api_key), digest);
    /* Visit every tenant whatever matches, so timing reveals nothing. */
    for (int i = 0; i < c->n_tenants; i++) {
        int has = c->tenants[i].api_key_sha256[0] != '\0';
        int eq = ct_equal(digest, c->tenants[i].api_key_sha256, 64);
        if (has & eq & (found < 0)) {
            found = i;
        }
    }
    return found;
}
