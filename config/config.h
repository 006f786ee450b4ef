/* config.h - the `kvserve serve` command line and config file, parsed once
 * into one immutable cfg_t, and the tenant table.
 *
 * Sources, later ones win: built-in defaults, the INI file named by
 * --config (parsed with libinih), then the command-line flags. Flag names
 * follow vLLM where one exists (--max-num-seqs, --block-size, ...). In the
 * file a key is the flag name without the leading dashes, with '-' or '_'
 * (max_num_seqs = 64); it goes before any section or in a [serve] section.
 * Tenants are [tenant NAME] sections. Unknown keys, unknown sections and bad
 * values are errors; a file error names "file:line: key", a flag error names
 * the flag.
 *
 * API keys are never stored in clear: --api-key KEY keeps SHA-256(KEY) as
 * 64 lowercase hex chars, and tenants carry api_key_sha256 (made by
 * `kvserve hash-key`). Keys are matched by comparing digests in constant
 * time.
 *
 * Tenant 0 is always the default tenant (name "default"): it owns the
 * --api-key key when one is given and serves every request when no key is
 * configured at all. A [tenant default] section sets its quotas. Configured
 * tenants follow at indices 1..n_tenants-1, in file order.
 *
 * Thread: main thread at start-up (cfg_parse changes libinih's process-wide
 * settings). The filled cfg_t is immutable afterwards and may be read from
 * any thread.
 */
#ifndef CONFIG_CONFIG_H
#define CONFIG_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CFG_MAX_TENANTS 64   /* including the default tenant 0 (= ENG_MAX_TENANTS) */
#define CFG_PATH_MAX 1024
#define CFG_NAME_MAX 64      /* tenant and model names, with the NUL */

/* cfg_parse() result besides ST_OK / errors: --help was given. The caller
 * prints cfg_usage(stdout) and exits 0. */
#define CFG_HELP 1

typedef struct cfg_tenant {
    char name[CFG_NAME_MAX];       /* [A-Za-z0-9._-]+ */
    char api_key_sha256[65];       /* lowercase hex; "" only for the default tenant */
    double weight;                 /* fair-share weight, > 0; default 1 */
    int32_t max_running;           /* concurrent requests; 0 = unlimited */
    int32_t max_waiting;           /* queued requests before 429; 0 = unlimited */
    double max_kv_share;           /* 0 < share <= 1 of device KV blocks; default 1 */
    char prefix_cache_salt[65];    /* "" = the tenant's name; equal salts share cache */
    int64_t tokens_per_minute;     /* prompt + generated tokens; 0 = unlimited */
} cfg_tenant_t;

typedef struct cfg {
    /* Model and identity. */
    char model[CFG_PATH_MAX];          /* --model, default "models/austen-2.7m" */
    char served_model_name[CFG_NAME_MAX]; /* --served-model-name; "" = basename of model */
    char kv_events_config[1024]; /* --kv-events-config JSON (vLLM's); "" = off */
    char chat_template[CFG_PATH_MAX];  /* --chat-template FILE; "" = the model's own */
    char config_path[CFG_PATH_MAX];    /* --config FILE that was read; "" if none */
    char tool_call_parser[16];         /* --tool-call-parser; "auto": the template's */
    char reasoning_parser[16];         /* --reasoning-parser: none deepseek_r1 qwen3 */

    /* Network. */
    char host[256];                    /* --host, default "127.0.0.1" */
    int32_t port;                      /* --port, default 8000; 0 = ephemeral */
    int has_api_key;                   /* --api-key given (or KVSERVE_API_KEY set) */
    char api_key_sha256[65];           /* SHA-256 of --api-key, lowercase hex */
    int auth_required;                 /* 1 if any key is configured */
    char admin_api_key_sha256[65];     /* --admin-api-key digest; "" = the admin API is off */
    int public_metrics;                /* /metrics without a key; default 1 */
    int public_health;                 /* /health without a key; default 1 */
    char allowed_origins[1024];        /* --allowed-origins CORS: "" none (default), "*"
                                        * any, else a comma list of origins */

    /* Engine. */
    int32_t max_num_seqs;              /* --max-num-seqs, default 128 */
    int32_t max_num_batched_tokens;    /* --max-num-batched-tokens, default 2048 */
    int32_t block_size;                /* --block-size, default 16 */
    int32_t num_kv_blocks;             /* --num-kv-blocks; 0 = derive from memory */
    int64_t kv_cache_memory;           /* --kv-cache-memory bytes; 0 = default size */
    double swap_space_gib;             /* --swap-space GiB of CPU swap tier; default: 1 on
                                        * cuda, 0 on cpu (-1 until cfg_parse resolves it) */
    int mlock;                         /* --mlock: pin the process's memory at start */
    int32_t max_model_len;             /* --max-model-len; 0 = the model's context */
    char device[8];                    /* --device "cpu" (default) or "cuda" */
    int32_t tensor_parallel_size;      /* --tensor-parallel-size, default 1 */
    double gpu_memory_utilization;     /* --gpu-memory-utilization, default 0.9 */
    int enforce_eager;                 /* --enforce-eager: cuda runs every step eagerly, no
                                        * decode graphs; default 1 until graphs are checked
                                        * on a GPU (--no-enforce-eager turns them on) */
    char dtype[16];                    /* --dtype: weight type, auto f32 bf16 f16 (and aliases) */
    char kv_cache_dtype[16];           /* auto f32 f16 bf16 fp8_e4m3 int8 int4 tq3 tq4 */
    char matmul_precision[8];          /* --matmul-precision high (default) | medium: BF16 weights */
    char kv_policy[64];                /* --kv-policy, "full" or "sink=S,window=W" */
    int32_t kv_policy_sink;            /* parsed S tokens; 0 with "full" */
    int32_t kv_policy_window;          /* parsed W tokens; 0 with "full" */
    int enable_prefix_caching;         /* default 1 */
    double kv_watermark;               /* --kv-watermark: fraction of device KV blocks admission
                                        * keeps free for running growth, default 0.01 */
    double vtc_input_weight;           /* --vtc-input-weight: fair-share charge per computed
                                        * prompt token, default 1 */
    double vtc_cached_weight;          /* --vtc-cached-weight: per prefix-cached prompt token,
                                        * default 0.25 */
    double vtc_output_weight;          /* --vtc-output-weight: per generated token, default 2 */
    int32_t threads;                   /* --threads CPU threads; 0 = all cores */
    char pooling[8];                   /* --pooling for /v1/embeddings: "last" (default)
                                        * or "mean" */
    char speculative_config[1024];     /* --speculative-config JSON (scheduler/spec.h); "" off */

    /* Process. */
    int log_level;                     /* LOG_LEVEL_* from --log-level, default info */
    double drain_timeout_s;            /* --drain-timeout, default 30 s */

    /* Limits (hardening). */
    int64_t max_body_bytes;            /* default 8 MiB */
    int64_t max_header_bytes;          /* default 16 KiB */
    int32_t max_connections;           /* default 1024 */
    int32_t max_connections_per_ip;    /* default 256 */
    double idle_timeout_s;             /* default 60 s */
    double request_timeout_s;          /* whole request incl. streaming, default 600 s */
    int32_t max_n;                     /* cap on "n", default 16 */
    int32_t max_tokens_cap;            /* cap on max_tokens; 0 = max_model_len */
    int32_t max_waiting_requests;      /* queue bound over all tenants, default 1024 */
    int64_t max_sse_buffer_bytes;      /* unsent SSE bytes per stream, default 1 MiB */

    /* Tenants: [0] is the default tenant; n_tenants >= 1. */
    int32_t n_tenants;
    cfg_tenant_t tenants[CFG_MAX_TENANTS];
} cfg_t;

/* Fills *out with the built-in defaults (one default tenant). Never fails. */
void cfg_defaults(cfg_t *out);

/* Parses `kvserve serve` arguments (argv[0] is the subcommand name and is
 * skipped): defaults, then the --config file, then the flags. Accepts
 * "--flag value" and "--flag=value"; booleans take --flag / --no-flag or
 * --flag=true|false; one positional argument is taken as --model.
 * If --api-key is absent, the environment variable KVSERVE_API_KEY is used.
 * Returns ST_OK; CFG_HELP when --help or -h was given (out holds the
 * defaults); ST_EINVAL for a bad flag or value, ST_EFORMAT for a bad file,
 * or -errno when the file cannot be read; on error a one-line message is
 * written to err ("kvserve.conf:12: max_num_seqs: expected an integer in
 * 1..65536, got 'x'" or "--port: ..."), and *out is unspecified. */
int cfg_parse(int argc, char **argv, cfg_t *out, char *err, size_t errlen);

/* Parses one INI file on top of *cfg (used by cfg_parse; exposed for tests
 * and tools). Same errors and messages as cfg_parse. */
int cfg_load_file(cfg_t *cfg, const char *path, char *err, size_t errlen);

/* Prints the option summary of `kvserve serve` with defaults. */
void cfg_usage(FILE *f);

/* Writes the effective configuration as an INI file that cfg_load_file
 * accepts (digests only, never keys). */
void cfg_write_ini(const cfg_t *cfg, FILE *f);

/* Index of the tenant whose api_key_sha256 matches SHA-256(api_key), or -1.
 * The --api-key key maps to tenant 0. Every tenant's digest is compared, in
 * constant time, so timing does not reveal which one matched. Any thread. */
int cfg_tenant_find_by_key(const cfg_t *cfg, const char *api_key);

/* Parses a byte size with an optional suffix K, M, G, T (powers of 1024,
 * optional trailing "B" or "iB"), e.g. "512M", "4GiB". ST_OK or ST_EINVAL. */
int cfg_parse_bytes(const char *s, int64_t *out);

/* Parses a duration in seconds with an optional unit ms, s, m, h ("250ms",
 * "30", "2m"). ST_OK or ST_EINVAL. */
int cfg_parse_duration(const char *s, double *out_s);

#endif /* CONFIG_CONFIG_H */
