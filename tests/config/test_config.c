/* test_config.c - cfg_parse: every flag and key, bad values, overrides,
 * error messages with file:line: key, tenants and key lookup, the example
 * config/kvserve.conf.
 *
 * KVSERVE_SOURCE_DIR (set by meson) locates config/kvserve.conf.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "config/config.h"

static char tmp_path[64];
static char err[1024];

#define ARGV(...) ((char *[]){"serve", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"serve", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(c, ...) cfg_parse(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), (c), err, sizeof(err))

/* Writes text to a fresh temporary file; returns its path (static). */
static const char *
write_tmp(const char *text)
{
    int fd;
    FILE *f;

    strcpy(tmp_path, "/tmp/kvs-cfg-XXXXXX");
    fd = mkstemp(tmp_path);
    ck_assert_int_ge(fd, 0);
    f = fdopen(fd, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return tmp_path;
}

static void
teardown(void)
{
    if (tmp_path[0] != '\0') {
        unlink(tmp_path);
        tmp_path[0] = '\0';
    }
}

/* Loads text as a config file on top of defaults; returns the status. */
static int
load_text(cfg_t *c, const char *text)
{
    cfg_defaults(c);
    err[0] = '\0';
    return cfg_load_file(c, write_tmp(text), err, sizeof(err));
}

static void
assert_err_is(const char *expect)
{
    ck_assert_msg(strstr(err, expect) != NULL, "error '%s' lacks '%s'", err, expect);
}

/* Asserts the file error names tmp_path:line: key. */
static void
assert_file_err(int line, const char *key)
{
    char want[160];

    snprintf(want, sizeof(want), "%s:%d: %s: ", tmp_path, line, key);
    ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "error '%s' does not start with '%s'",
                  err, want);
}

static char *
ini_of(const cfg_t *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    cfg_write_ini(c, f);
    fclose(f);
    return buf;
}

START_TEST(test_defaults)
{
    cfg_t c;

    ck_assert_int_eq(cfg_parse(1, ARGV(NULL), &c, err, sizeof(err)), ST_OK);
    ck_assert_str_eq(c.model, "models/austen-2.7m");
    ck_assert_str_eq(c.host, "127.0.0.1");
    ck_assert_int_eq(c.port, 8000);
    ck_assert_int_eq(c.block_size, 16);
    ck_assert_int_eq(c.max_num_seqs, 128);
    ck_assert_int_eq(c.max_num_batched_tokens, 2048);
    ck_assert_str_eq(c.device, "cpu");
    ck_assert_str_eq(c.kv_cache_dtype, "auto");
    ck_assert_str_eq(c.kv_policy, "full");
    ck_assert_int_eq(c.enable_prefix_caching, 1);
    ck_assert_int_eq(c.public_metrics, 1);
    ck_assert_int_eq(c.public_health, 1);
    ck_assert_int_eq(c.log_level, LOG_LEVEL_INFO);
    ck_assert_int_eq(c.has_api_key, 0);
    ck_assert_int_eq(c.auth_required, 0);
    ck_assert_int_eq(c.n_tenants, 1);
    ck_assert_str_eq(c.tenants[0].name, "default");
    ck_assert_double_eq(c.tenants[0].weight, 1.0);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "anything"), -1);
}
END_TEST

START_TEST(test_every_flag)
{
    cfg_t c;
    int rc = PARSE(&c, "--model", "/m/x.gguf", "--served-model-name", "x", "--chat-template",
                   "t.jinja", "--host", "0.0.0.0", "--port", "9001", "--api-key", "k1",
                   "--no-public-metrics", "--public-health=false", "--max-num-seqs", "7",
                   "--max-num-batched-tokens", "333", "--block-size", "32", "--num-kv-blocks",
                   "100", "--swap-space", "2.5", "--max-model-len", "512", "--device", "cuda",
                   "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5",
                   "--kv-cache-dtype", "int8", "--kv-policy", "sink=32,window=256",
                   "--no-enable-prefix-caching", "--threads", "3", "--log-level", "debug",
                   "--drain-timeout", "1500ms", "--max-body-bytes", "64K",
                   "--max-header-bytes", "2K", "--max-connections", "50",
                   "--max-connections-per-ip", "5", "--idle-timeout", "2m",
                   "--request-timeout", "1h", "--max-n", "4", "--max-tokens-cap", "100",
                   "--max-waiting-requests", "9", "--max-sse-buffer-bytes", "1M",
                   "--speculative-config",
                   "{\"method\": \"ngram\", \"num_speculative_tokens\": 4}");

    ck_assert_msg(rc == ST_OK, "%s", err);
    ck_assert_str_eq(c.model, "/m/x.gguf");
    ck_assert_str_eq(c.served_model_name, "x");
    ck_assert_str_eq(c.chat_template, "t.jinja");
    ck_assert_str_eq(c.host, "0.0.0.0");
    ck_assert_int_eq(c.port, 9001);
    ck_assert_int_eq(c.has_api_key, 1);
    ck_assert_int_eq(c.auth_required, 1);
    ck_assert_int_eq(c.public_metrics, 0);
    ck_assert_int_eq(c.public_health, 0);
    ck_assert_int_eq(c.max_num_seqs, 7);
    ck_assert_int_eq(c.max_num_batched_tokens, 333);
    ck_assert_int_eq(c.block_size, 32);
    ck_assert_int_eq(c.num_kv_blocks, 100);
    ck_assert_double_eq(c.swap_space_gib, 2.5);
    ck_assert_int_eq(c.max_model_len, 512);
    ck_assert_str_eq(c.device, "cuda");
    ck_assert_int_eq(c.tensor_parallel_size, 2);
    ck_assert_double_eq(c.gpu_memory_utilization, 0.5);
    ck_assert_str_eq(c.kv_cache_dtype, "int8");
    ck_assert_str_eq(c.kv_policy, "sink=32,window=256");
    ck_assert_int_eq(c.kv_policy_sink, 32);
    ck_assert_int_eq(c.kv_policy_window, 256);
    ck_assert_int_eq(c.enable_prefix_caching, 0);
    ck_assert_int_eq(c.threads, 3);
    ck_assert_str_eq(c.speculative_config,
                     "{\"method\": \"ngram\", \"num_speculative_tokens\": 4}");
    ck_assert_int_eq(c.log_level, LOG_LEVEL_DEBUG);
    ck_assert_double_eq_tol(c.drain_timeout_s, 1.5, 1e-12);
    ck_assert_int_eq(c.max_body_bytes, 64 * 1024);
    ck_assert_int_eq(c.max_header_bytes, 2048);
    ck_assert_int_eq(c.max_connections, 50);
    ck_assert_int_eq(c.max_connections_per_ip, 5);
    ck_assert_double_eq(c.idle_timeout_s, 120.0);
    ck_assert_double_eq(c.request_timeout_s, 3600.0);
    ck_assert_int_eq(c.max_n, 4);
    ck_assert_int_eq(c.max_tokens_cap, 100);
    ck_assert_int_eq(c.max_waiting_requests, 9);
    ck_assert_int_eq(c.max_sse_buffer_bytes, 1 << 20);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "k1"), 0);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "k2"), -1);
    /* The key is only kept as its digest. */
    ck_assert_ptr_null(memmem(&c, sizeof(c), "k1", 3));
}
END_TEST

START_TEST(test_equals_form_positional_and_bytes)
{
    cfg_t c;

    ck_assert_int_eq(PARSE(&c, "models/other", "--port=0", "--kv-cache-memory=1.5G",
                           "--enable-prefix-caching=no", "--public-metrics"),
                     ST_OK);
    ck_assert_str_eq(c.model, "models/other");
    ck_assert_int_eq(c.port, 0);
    ck_assert_int_eq(c.kv_cache_memory, 1536LL << 20);
    ck_assert_int_eq(c.enable_prefix_caching, 0);
    ck_assert_int_eq(c.public_metrics, 1);
    /* Underscores work in flags as in file keys. */
    ck_assert_int_eq(PARSE(&c, "--max_num_seqs", "3"), ST_OK);
    ck_assert_int_eq(c.max_num_seqs, 3);
}
END_TEST

START_TEST(test_help)
{
    cfg_t c;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;
    static const char *flags[] = {
        "--model", "--host", "--port", "--api-key", "--served-model-name", "--max-num-seqs",
        "--max-num-batched-tokens", "--block-size", "--num-kv-blocks", "--kv-cache-memory",
        "--swap-space", "--max-model-len", "--device", "--tensor-parallel-size",
        "--gpu-memory-utilization", "--dtype", "--kv-cache-dtype", "--kv-policy",
        "--[no-]enable-prefix-caching", "--chat-template", "--config", "--log-level",
        "--drain-timeout", "--max-body-bytes", "--max-connections", "--max-connections-per-ip",
        "--idle-timeout", "--request-timeout", "--max-n", "--max-tokens-cap",
        "--max-waiting-requests", "--max-sse-buffer-bytes", "--[no-]public-metrics",
        "--[no-]public-health", "--threads", "weight", "max_kv_share", "tokens_per_minute",
        "--kv-watermark", "--vtc-input-weight", "--vtc-cached-weight", "--vtc-output-weight",
    };

    ck_assert_int_eq(PARSE(&c, "--port", "1", "--help"), CFG_HELP);
    ck_assert_int_eq(PARSE(&c, "-h"), CFG_HELP);
    f = open_memstream(&buf, &len);
    cfg_usage(f);
    fclose(f);
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        ck_assert_msg(strstr(buf, flags[i]) != NULL, "usage lacks %s", flags[i]);
    }
    ck_assert_ptr_nonnull(strstr(buf, "[8000]"));
    free(buf);
}
END_TEST

START_TEST(test_bad_flags)
{
    static const struct {
        const char *flag, *value, *msg;
    } bad[] = {
        {"--port", "70000", "--port: expected an integer in 0..65535, got '70000'"},
        {"--port", "80x", "--port: expected an integer"},
        {"--port", "", "--port: expected an integer"},
        {"--max-num-seqs", "0", "--max-num-seqs: expected an integer in 1..65536"},
        {"--block-size", "-16", "--block-size: expected"},
        {"--kv-cache-memory", "12Q", "--kv-cache-memory: expected a non-negative size"},
        {"--kv-cache-memory", "-1G", "--kv-cache-memory: expected"},
        {"--swap-space", "nan", "--swap-space: expected a number"},
        {"--device", "tpu", "--device: expected one of cpu|cuda, got 'tpu'"},
        {"--kv-cache-dtype", "fp4", "--kv-cache-dtype: expected one of auto|"},
        {"--kv-policy", "sink=4", "--kv-policy: expected full, sink=S,window=W"},
        {"--kv-policy", "window=x", "--kv-policy: expected"},
        {"--log-level", "loud", "--log-level: expected one of error|warn"},
        {"--gpu-memory-utilization", "1.5", "--gpu-memory-utilization: expected a number"},
        {"--drain-timeout", "5 s", "--drain-timeout: expected a duration"},
        {"--idle-timeout", "0", "--idle-timeout: expected a duration"},
        {"--public-metrics=maybe", NULL, "--public-metrics: expected true or false"},
        {"--no-public-metrics=true", NULL, "--no-public-metrics: takes no value"},
        {"--frobnicate", "1", "--frobnicate: unknown flag"},
        {"--no-port", NULL, "--no-port: unknown flag"},
        {"-p", "1", "-p: unknown flag"},
        {"--max-num-seqs", NULL, "--max-num-seqs: missing value"},
        {"--config", NULL, "--config: missing value"},
        {"--api-key", "", "--api-key: expected"},
        {"--api-key-sha256", "abc", "--api-key-sha256: expected 64 hex digits"},
    };
    cfg_t c;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *argv[] = {"serve", (char *)bad[i].flag, (char *)bad[i].value, NULL};
        int argc = bad[i].value != NULL ? 3 : 2;
        int rc = cfg_parse(argc, argv, &c, err, sizeof(err));
        ck_assert_msg(rc == ST_EINVAL, "%s %s: rc %d", bad[i].flag, bad[i].value, rc);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "%s: '%s' lacks '%s'", bad[i].flag,
                      err, bad[i].msg);
    }
    ck_assert_int_eq(PARSE(&c, "a", "b"), ST_EINVAL);
    assert_err_is("unexpected argument 'b'");
}
END_TEST

START_TEST(test_cross_field_checks)
{
    cfg_t c;

    ck_assert_int_eq(PARSE(&c, "--num-kv-blocks", "10", "--kv-cache-memory", "1M"), ST_EINVAL);
    assert_err_is("--num-kv-blocks and --kv-cache-memory are exclusive");
    ck_assert_int_eq(PARSE(&c, "--kv-policy", "sink=4,window=64"), ST_EINVAL);
    assert_err_is("multiples of --block-size (16)");
    ck_assert_int_eq(PARSE(&c, "--kv-policy", "sink=4,window=64", "--block-size", "4"), ST_OK);
    ck_assert_int_eq(PARSE(&c, "--max-body-bytes", "10"), ST_EINVAL);
    assert_err_is("--max-body-bytes");
    ck_assert_int_eq(PARSE(&c, "--model", ""), ST_EINVAL);
    assert_err_is("--model");
    ck_assert_int_eq(PARSE(&c, "--max-connections", "4"), ST_OK);
    ck_assert_int_eq(c.max_connections_per_ip, 4);
}
END_TEST

/* Issue 15: decodes starve when a step has fewer tokens than sequences;
 * the swap tier defaults by device; --mlock parses. */
START_TEST(test_budget_and_swap_defaults)
{
    cfg_t c;

    ck_assert_int_eq(PARSE(&c, "--max-num-seqs", "64", "--max-num-batched-tokens", "63"),
                     ST_EINVAL);
    assert_err_is("--max-num-batched-tokens 63 is below --max-num-seqs 64");
    ck_assert_int_eq(PARSE(&c, "--max-num-seqs", "64", "--max-num-batched-tokens", "64"), ST_OK);
    ck_assert_int_eq(PARSE(&c, "--max-num-seqs", "4096"), ST_EINVAL); /* default 2048 tokens */
    ck_assert_int_eq(PARSE(&c, "--model", "m"), ST_OK);
    ck_assert_double_eq(c.swap_space_gib, 0.0); /* cpu: the pool is RAM already */
    ck_assert_int_eq(c.mlock, 0);
    ck_assert_int_eq(PARSE(&c, "--device", "cuda"), ST_OK);
    ck_assert_double_eq(c.swap_space_gib, 1.0);
    ck_assert_int_eq(PARSE(&c, "--device", "cuda", "--swap-space", "0", "--mlock"), ST_OK);
    ck_assert_double_eq(c.swap_space_gib, 0.0);
    ck_assert_int_eq(c.mlock, 1);
    ck_assert_int_eq(PARSE(&c, "--swap-space", "-2"), ST_EINVAL);
}
END_TEST

START_TEST(test_env_api_key)
{
    cfg_t c;

    setenv("KVSERVE_API_KEY", "from-env", 1);
    ck_assert_int_eq(PARSE(&c, "--port", "1"), ST_OK);
    ck_assert_int_eq(c.auth_required, 1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "from-env"), 0);
    /* The flag wins over the environment. */
    ck_assert_int_eq(PARSE(&c, "--api-key", "flag"), ST_OK);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "from-env"), -1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "flag"), 0);
    unsetenv("KVSERVE_API_KEY");
}
END_TEST

/* --admin-api-key (issue 19): stored as its digest, never a tenant's key,
 * never turning auth on; the env variable, the digest flag, the file key
 * (digest only) and the round trip through cfg_write_ini. */
START_TEST(test_admin_api_key)
{
    cfg_t c, d;
    char want[65];
    char *ini;

    ck_assert_int_eq(PARSE(&c, "--port", "1"), ST_OK);
    ck_assert_str_eq(c.admin_api_key_sha256, "");
    sha256_hex("adm", 3, want);
    ck_assert_int_eq(PARSE(&c, "--admin-api-key", "adm"), ST_OK);
    ck_assert_str_eq(c.admin_api_key_sha256, want);
    ck_assert_int_eq(c.has_api_key, 0);
    ck_assert_int_eq(c.auth_required, 0);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "adm"), -1);

    setenv("KVSERVE_ADMIN_API_KEY", "adm", 1);
    ck_assert_int_eq(PARSE(&c, "--port", "1"), ST_OK);
    ck_assert_str_eq(c.admin_api_key_sha256, want);
    ck_assert_int_eq(c.auth_required, 0);
    ck_assert_int_eq(PARSE(&c, "--admin-api-key", "other"), ST_OK); /* the flag wins */
    ck_assert_str_ne(c.admin_api_key_sha256, want);
    unsetenv("KVSERVE_ADMIN_API_KEY");

    ck_assert_int_eq(PARSE(&c, "--admin-api-key-sha256", want), ST_OK);
    ck_assert_str_eq(c.admin_api_key_sha256, want);
    ck_assert_int_eq(PARSE(&c, "--admin-api-key-sha256", "abc"), ST_EINVAL);
    ck_assert_int_eq(PARSE(&c, "--admin-api-key", ""), ST_EINVAL);
    /* A tenant's key is never the admin key. */
    ck_assert_int_eq(PARSE(&c, "--api-key", "adm", "--admin-api-key", "adm"), ST_EINVAL);
    ck_assert_msg(strstr(err, "admin API key is also tenant default's") != NULL, "%s", err);

    /* The file takes the digest only. */
    ck_assert_int_eq(load_text(&c, "admin_api_key = adm\n"), ST_EFORMAT);
    ck_assert_msg(strstr(err, "admin_api_key_sha256") != NULL, "%s", err);
    ck_assert_int_eq(PARSE(&c, "--admin-api-key", "adm", "--api-key", "k"), ST_OK);
    ini = ini_of(&c);
    ck_assert_msg(strstr(ini, "admin_api_key_sha256 = ") != NULL, "%s", ini);
    ck_assert_ptr_null(strstr(ini, "= adm\n"));
    ck_assert_int_eq(load_text(&d, ini), ST_OK);
    ck_assert_str_eq(d.admin_api_key_sha256, want);
    free(ini);
}
END_TEST

static const char full_file[] =
    "# every key\n"
    "model = /srv/m\n"
    "served-model-name = m1\n"
    "chat_template = /srv/t.jinja\n"
    "host = ::\n"
    "port = 8123\n"
    "api_key_sha256 = 72EE9D4355CCB9D3A4C9DBF37382E38E75C1B1A225B5BD1F729EE91BBDA30C20\n"
    "public_metrics = off\n"
    "public_health = no\n"
    "max_num_seqs = 11\n"
    "max_num_batched_tokens = 512\n"
    "block_size = 8\n"
    "num_kv_blocks = 0\n"
    "kv_cache_memory = 256M\n"
    "swap_space = 0\n"
    "max_model_len = 1024\n"
    "device = cpu\n"
    "tensor_parallel_size = 2\n"
    "gpu_memory_utilization = 0.8\n"
    "kv_cache_dtype = fp8_e4m3\n"
    "kv_policy = window=64,sink=8\n"
    "enable_prefix_caching = false\n"
    "threads = 2\n"
    "log_level = warn\n"
    "drain_timeout = 5\n"
    "max_body_bytes = 1M\n"
    "max_header_bytes = 8K\n"
    "max_connections = 10\n"
    "max_connections_per_ip = 2\n"
    "idle_timeout = 30s\n"
    "request_timeout = 10m\n"
    "max_n = 2\n"
    "max_tokens_cap = 64\n"
    "max_waiting_requests = 100\n"
    "max_sse_buffer_bytes = 64K  ; inline comment\n"
    "\n"
    "[tenant default]\n"
    "weight = 0.5\n"
    "\n"
    "[tenant bob]\n"
    "api_key_sha256 = 9b94dc1a51a38769f135edf04033ad7f2f487b6c25929be7a861cfc1ab10cf98\n"
    "weight = 3\n"
    "max_running = 4\n"
    "max_waiting = 8\n"
    "max_kv_share = 0.25\n"
    "prefix_cache_salt = shared\n"
    "tokens_per_minute = 60000\n"
    "[tenant carol]\n"
    "api-key-sha256 = 0000000000000000000000000000000000000000000000000000000000000001\n";

START_TEST(test_file_every_key)
{
    cfg_t c;
    char *argv[] = {"serve", "--config", NULL, NULL};

    write_tmp(full_file);
    argv[2] = tmp_path;
    ck_assert_msg(cfg_parse(3, argv, &c, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_str_eq(c.config_path, tmp_path);
    ck_assert_str_eq(c.model, "/srv/m");
    ck_assert_str_eq(c.served_model_name, "m1");
    ck_assert_str_eq(c.chat_template, "/srv/t.jinja");
    ck_assert_str_eq(c.host, "::");
    ck_assert_int_eq(c.port, 8123);
    ck_assert_str_eq(c.api_key_sha256,
                     "72ee9d4355ccb9d3a4c9dbf37382e38e75c1b1a225b5bd1f729ee91bbda30c20");
    ck_assert_int_eq(c.public_metrics, 0);
    ck_assert_int_eq(c.public_health, 0);
    ck_assert_int_eq(c.max_num_seqs, 11);
    ck_assert_int_eq(c.max_num_batched_tokens, 512);
    ck_assert_int_eq(c.block_size, 8);
    ck_assert_int_eq(c.kv_cache_memory, 256 << 20);
    ck_assert_double_eq(c.swap_space_gib, 0);
    ck_assert_int_eq(c.max_model_len, 1024);
    ck_assert_int_eq(c.tensor_parallel_size, 2);
    ck_assert_double_eq(c.gpu_memory_utilization, 0.8);
    ck_assert_str_eq(c.kv_cache_dtype, "fp8_e4m3");
    ck_assert_int_eq(c.kv_policy_sink, 8);
    ck_assert_int_eq(c.kv_policy_window, 64);
    ck_assert_int_eq(c.enable_prefix_caching, 0);
    ck_assert_int_eq(c.threads, 2);
    ck_assert_int_eq(c.log_level, LOG_LEVEL_WARN);
    ck_assert_double_eq(c.drain_timeout_s, 5);
    ck_assert_int_eq(c.max_body_bytes, 1 << 20);
    ck_assert_int_eq(c.max_header_bytes, 8192);
    ck_assert_int_eq(c.max_connections, 10);
    ck_assert_int_eq(c.max_connections_per_ip, 2);
    ck_assert_double_eq(c.idle_timeout_s, 30);
    ck_assert_double_eq(c.request_timeout_s, 600);
    ck_assert_int_eq(c.max_n, 2);
    ck_assert_int_eq(c.max_tokens_cap, 64);
    ck_assert_int_eq(c.max_waiting_requests, 100);
    ck_assert_int_eq(c.max_sse_buffer_bytes, 64 << 10);

    ck_assert_int_eq(c.n_tenants, 3);
    ck_assert_str_eq(c.tenants[0].name, "default");
    ck_assert_double_eq(c.tenants[0].weight, 0.5);
    ck_assert_str_eq(c.tenants[1].name, "bob");
    ck_assert_double_eq(c.tenants[1].weight, 3);
    ck_assert_int_eq(c.tenants[1].max_running, 4);
    ck_assert_int_eq(c.tenants[1].max_waiting, 8);
    ck_assert_double_eq(c.tenants[1].max_kv_share, 0.25);
    ck_assert_str_eq(c.tenants[1].prefix_cache_salt, "shared");
    ck_assert_int_eq(c.tenants[1].tokens_per_minute, 60000);
    ck_assert_str_eq(c.tenants[2].name, "carol");
    ck_assert_double_eq(c.tenants[2].weight, 1);
    ck_assert_double_eq(c.tenants[2].max_kv_share, 1);
    ck_assert_int_eq(c.auth_required, 1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "alice-key"), 0);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "bob-key"), 1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "carol-key"), -1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, ""), -1);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, NULL), -1);
}
END_TEST

START_TEST(test_flags_override_file)
{
    cfg_t c;
    char *argv[] = {"serve", "--port", "9002", "--config", NULL, "--no-public-health",
                    "--api-key", "k", NULL};

    write_tmp("[serve]\nport = 9000\nmax_n = 3\npublic_health = true\n"
              "api_key_sha256 = 0000000000000000000000000000000000000000000000000000000000000002\n");
    argv[4] = tmp_path;
    ck_assert_msg(cfg_parse(8, argv, &c, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_int_eq(c.port, 9002); /* the flag wins though it comes before --config */
    ck_assert_int_eq(c.max_n, 3);   /* the file wins over the default */
    ck_assert_int_eq(c.public_health, 0);
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "k"), 0);

    argv[3] = "--config=x";
    argv[4] = "--port=1";
    snprintf(err, sizeof(err), "stale");
    ck_assert_int_eq(cfg_parse(5, argv, &c, err, sizeof(err)), -ENOENT);
    assert_err_is("x: ");
}
END_TEST

START_TEST(test_file_errors)
{
    cfg_t c;

    ck_assert_int_eq(load_text(&c, "port = 1\n\n# c\nmax_nm_seqs = 4\n"), ST_EFORMAT);
    assert_file_err(4, "max_nm_seqs");
    assert_err_is("unknown key");

    ck_assert_int_eq(load_text(&c, "[serve]\nblock_size = 0\n"), ST_EFORMAT);
    assert_file_err(2, "block_size");
    assert_err_is("expected an integer in 1..1024, got '0'");

    ck_assert_int_eq(load_text(&c, "port = 1\nport = 2\n"), ST_EFORMAT);
    assert_file_err(2, "port");
    assert_err_is("set twice");

    ck_assert_int_eq(load_text(&c, "port = 1\n\n[server]\nport = 2\n"), ST_EFORMAT);
    assert_file_err(3, "server");
    assert_err_is("unknown section");

    ck_assert_int_eq(load_text(&c, "port = 1\nthis line is wrong\nport = 3\n"), ST_EFORMAT);
    assert_err_is(":2: syntax error");

    ck_assert_int_eq(load_text(&c, "api_key = secret\n"), ST_EFORMAT);
    assert_file_err(1, "api_key");
    assert_err_is("api_key_sha256");

    ck_assert_int_eq(load_text(&c, "config = other.conf\n"), ST_EFORMAT);
    assert_file_err(1, "config");

    ck_assert_int_eq(load_text(&c, "device = gpu\n"), ST_EFORMAT);
    assert_file_err(1, "device");

    ck_assert_int_eq(load_text(&c, "[tenant a]\nweight = 1\n\n[tenant b]\n"
                                   "api_key_sha256 = "
                                   "0000000000000000000000000000000000000000000000000000000000000003\n"),
                     ST_EFORMAT);
    ck_assert_msg(strstr(err, ":1: tenant a: api_key_sha256 is required") != NULL, "%s", err);

    ck_assert_int_eq(load_text(&c, "[tenant a]\nweight = 0\n"), ST_EFORMAT);
    assert_file_err(2, "weight");

    ck_assert_int_eq(load_text(&c, "[tenant a]\nmax_kv_share = 1.5\n"), ST_EFORMAT);
    assert_file_err(2, "max_kv_share");

    ck_assert_int_eq(load_text(&c, "[tenant a]\nport = 1\n"), ST_EFORMAT);
    assert_file_err(2, "port");
    assert_err_is("unknown key in a tenant section");

    ck_assert_int_eq(load_text(&c, "[tenant a b]\nweight = 1\n"), ST_EFORMAT);
    assert_file_err(1, "tenant a b");

    ck_assert_int_eq(load_text(&c, "[tenant a]\nweight = 1\n[tenant b]\nweight = 1\n"
                                   "[tenant a]\nweight = 2\n"),
                     ST_EFORMAT);
    assert_file_err(5, "tenant a");
    assert_err_is("duplicate tenant");

    /* Two tenants with one key. */
    ck_assert_int_eq(load_text(&c, "[tenant a]\napi_key_sha256 = "
                                   "0000000000000000000000000000000000000000000000000000000000000004\n"
                                   "[tenant b]\napi_key_sha256 = "
                                   "0000000000000000000000000000000000000000000000000000000000000004\n"),
                     ST_OK);
    {
        char *argv[] = {"serve", "--config", tmp_path, NULL};
        ck_assert_int_eq(cfg_parse(3, argv, &c, err, sizeof(err)), ST_EINVAL);
        assert_err_is("tenants a and b have the same API key");
    }
}
END_TEST

START_TEST(test_too_many_tenants)
{
    cfg_t c;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    for (int i = 0; i < CFG_MAX_TENANTS; i++) {
        fprintf(f, "[tenant t%d]\napi_key_sha256 = %064x\n", i, i + 1);
    }
    fclose(f);
    ck_assert_int_eq(load_text(&c, text), ST_EFORMAT);
    /* Tenant t63 would be the 65th with the default: header on line 127. */
    assert_file_err(127, "tenant t63");
    assert_err_is("too many tenants");
    free(text);
}
END_TEST

START_TEST(test_long_line)
{
    cfg_t c;
    char text[1200];

    snprintf(text, sizeof(text), "port = 5\nmodel = /%0900d\nmax_n = 0\n", 7);
    ck_assert_int_eq(load_text(&c, text), ST_EFORMAT);
    assert_file_err(3, "max_n");
    ck_assert_int_eq(strlen(c.model), 901);
}
END_TEST

START_TEST(test_round_trip)
{
    cfg_t a, b;
    char *ia, *ib;
    char *argv[] = {"serve", "--config", NULL, "--max-n", "5", "--kv-policy",
                    "sink=16,window=32", "--log-level", "trace", "--swap-space", "0.1", NULL};

    write_tmp(full_file);
    argv[2] = tmp_path;
    ck_assert_int_eq(cfg_parse(11, argv, &a, err, sizeof(err)), ST_OK);
    unlink(tmp_path);
    ia = ini_of(&a);
    ck_assert_int_eq(load_text(&b, ia), ST_OK);
    {
        char *argv2[] = {"serve", "--config", tmp_path, NULL};
        ck_assert_msg(cfg_parse(3, argv2, &b, err, sizeof(err)) == ST_OK, "%s", err);
    }
    ib = ini_of(&b);
    ck_assert_str_eq(ia, ib);
    ck_assert_int_eq(b.n_tenants, 3);
    ck_assert_int_eq(b.log_level, LOG_LEVEL_TRACE);
    ck_assert_double_eq(b.swap_space_gib, 0.1);
    free(ia);
    free(ib);
}
END_TEST

static char *
read_example(void)
{
    const char *src = getenv("KVSERVE_SOURCE_DIR");
    char path[1024];
    FILE *f;
    char *buf;
    long n;

    ck_assert_ptr_nonnull(src);
    snprintf(path, sizeof(path), "%s/config/kvserve.conf", src);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc(1, (size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), n);
    fclose(f);
    return buf;
}

/* The example parses as is (all defaults), every key is documented in it,
 * and with its "# key = value" lines uncommented it still parses to the
 * same settings (so the documented defaults are the real ones). */
/* --dtype (the weight type): vLLM's names and aliases; anything else is
 * refused with the choices. */
START_TEST(test_dtype)
{
    cfg_t c;

    cfg_defaults(&c);
    ck_assert_str_eq(c.dtype, "auto");
    ck_assert_int_eq(PARSE(&c, "--dtype", "bf16"), ST_OK);
    ck_assert_str_eq(c.dtype, "bf16");
    ck_assert_int_eq(PARSE(&c, "--dtype=float16"), ST_OK);
    ck_assert_str_eq(c.dtype, "float16");
    ck_assert_int_eq(PARSE(&c, "--dtype", "q4_k"), ST_EINVAL);
    assert_err_is("--dtype: expected one of auto|");
    ck_assert_int_eq(load_text(&c, "dtype = f32\n"), ST_OK);
    ck_assert_str_eq(c.dtype, "f32");
}
END_TEST

/* --matmul-precision: high (the default) or medium; anything else is
 * refused with the choices. */
START_TEST(test_matmul_precision)
{
    cfg_t c;

    cfg_defaults(&c);
    ck_assert_str_eq(c.matmul_precision, "high");
    ck_assert_int_eq(PARSE(&c, "--matmul-precision", "medium"), ST_OK);
    ck_assert_str_eq(c.matmul_precision, "medium");
    ck_assert_int_eq(PARSE(&c, "--matmul-precision", "low"), ST_EINVAL);
    assert_err_is("--matmul-precision: expected one of high|medium");
    ck_assert_int_eq(load_text(&c, "matmul_precision = high\n"), ST_OK);
    ck_assert_str_eq(c.matmul_precision, "high");
}
END_TEST

START_TEST(test_example_file)
{
    cfg_t d, c;
    char *ex = read_example();
    char *uncommented = calloc(1, strlen(ex) + 1);
    char *o = uncommented;
    char *idef, *iex;
    char *keys = NULL;
    size_t klen = 0;
    FILE *kf;

    cfg_defaults(&d);
    ck_assert_msg(load_text(&c, ex) == ST_OK, "%s", err);
    c.config_path[0] = '\0';
    idef = ini_of(&d);
    iex = ini_of(&c);
    ck_assert_str_eq(idef, iex);
    free(iex);

    /* Every key cfg_write_ini knows appears as "# key =" in the example. */
    strcpy(d.served_model_name, "x");
    strcpy(d.chat_template, "x");
    d.has_api_key = 1;
    strcpy(d.tenants[0].prefix_cache_salt, "x");
    kf = open_memstream(&keys, &klen);
    cfg_write_ini(&d, kf);
    fclose(kf);
    for (char *line = strtok(keys, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char want[80];
        char *eq = strstr(line, " = ");
        if (eq == NULL) {
            continue;
        }
        snprintf(want, sizeof(want), "\n# %.*s =", (int)(eq - line), line);
        ck_assert_msg(strstr(ex, want) != NULL, "kvserve.conf does not document '%s'", want + 1);
    }
    free(keys);

    for (const char *p = ex; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t len = nl != NULL ? (size_t)(nl - p + 1) : strlen(p);
        const char *q = p + 2;
        int is_setting = 0;
        if (strncmp(p, "# [tenant ", 10) == 0) {
            is_setting = 1;
        } else if (strncmp(p, "# ", 2) == 0) {
            while (*q == '_' || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9')) {
                q++;
            }
            is_setting = q > p + 2 && strncmp(q, " =", 2) == 0;
        }
        if (is_setting) {
            memcpy(o, p + 2, len - 2);
            o += len - 2;
        } else {
            memcpy(o, p, len);
            o += len;
        }
        p += len;
    }
    ck_assert_msg(load_text(&c, uncommented) == ST_OK, "%s", err);
    ck_assert_int_eq(c.n_tenants, 2);
    ck_assert_str_eq(c.tenants[1].name, "alice");
    ck_assert_int_eq(cfg_tenant_find_by_key(&c, "alice-key"), 1);
    c.n_tenants = 1;
    c.config_path[0] = '\0';
    iex = ini_of(&c);
    ck_assert_str_eq(idef, iex);
    free(iex);
    free(idef);
    free(uncommented);
    free(ex);
}
END_TEST

/* Issue 15: the admission watermark and the VTC weights, from flags and
 * the file, with their defaults and the one contradiction refused. */
START_TEST(test_watermark_and_vtc_weights)
{
    cfg_t c;

    ck_assert_int_eq(PARSE(&c, "--port", "1"), ST_OK);
    ck_assert_double_eq(c.kv_watermark, 0.01);
    ck_assert_double_eq(c.vtc_input_weight, 1.0);
    ck_assert_double_eq(c.vtc_cached_weight, 0.25);
    ck_assert_double_eq(c.vtc_output_weight, 2.0);
    ck_assert_int_eq(PARSE(&c, "--kv-watermark", "0.05", "--vtc-cached-weight=0",
                           "--vtc-output-weight", "4"),
                     ST_OK);
    ck_assert_double_eq(c.kv_watermark, 0.05);
    ck_assert_double_eq(c.vtc_cached_weight, 0.0);
    ck_assert_double_eq(c.vtc_output_weight, 4.0);
    ck_assert_int_eq(PARSE(&c, "--kv-watermark", "0.6"), ST_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--kv-watermark"));
    ck_assert_int_eq(PARSE(&c, "--vtc-cached-weight", "-1"), ST_EINVAL);
    ck_assert_int_eq(PARSE(&c, "--vtc-input-weight", "0", "--vtc-output-weight", "0"), ST_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "both 0"));
    ck_assert_int_eq(load_text(&c, "kv_watermark = 0\nvtc_input_weight = 2\n"), ST_OK);
    ck_assert_double_eq(c.kv_watermark, 0.0);
    ck_assert_double_eq(c.vtc_input_weight, 2.0);
}
END_TEST

START_TEST(test_parsers)
{
    int64_t b;
    double s;

    ck_assert_int_eq(cfg_parse_bytes("0", &b), ST_OK);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(cfg_parse_bytes("4096", &b), ST_OK);
    ck_assert_int_eq(b, 4096);
    ck_assert_int_eq(cfg_parse_bytes("2k", &b), ST_OK);
    ck_assert_int_eq(b, 2048);
    ck_assert_int_eq(cfg_parse_bytes("3MiB", &b), ST_OK);
    ck_assert_int_eq(b, 3 << 20);
    ck_assert_int_eq(cfg_parse_bytes("1GB", &b), ST_OK);
    ck_assert_int_eq(b, 1 << 30);
    ck_assert_int_eq(cfg_parse_bytes("2T", &b), ST_OK);
    ck_assert_int_eq(b, 2LL << 40);
    ck_assert_int_eq(cfg_parse_bytes("100B", &b), ST_OK);
    ck_assert_int_eq(b, 100);
    ck_assert_int_eq(cfg_parse_bytes("0.5K", &b), ST_OK);
    ck_assert_int_eq(b, 512);
    ck_assert_int_eq(cfg_parse_bytes("1.3", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes("1X", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes("1KK", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes("K", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes("", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes(" 1", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_bytes("99999999T", &b), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_duration("250ms", &s), ST_OK);
    ck_assert_double_eq_tol(s, 0.25, 1e-12);
    ck_assert_int_eq(cfg_parse_duration("3", &s), ST_OK);
    ck_assert_double_eq(s, 3);
    ck_assert_int_eq(cfg_parse_duration("3s", &s), ST_OK);
    ck_assert_int_eq(cfg_parse_duration("2h", &s), ST_OK);
    ck_assert_double_eq(s, 7200);
    ck_assert_int_eq(cfg_parse_duration("2 h", &s), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_duration("2d", &s), ST_EINVAL);
    ck_assert_int_eq(cfg_parse_duration("-1", &s), ST_EINVAL);
}
END_TEST

Suite *
config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_every_flag);
    tcase_add_test(tc, test_equals_form_positional_and_bytes);
    tcase_add_test(tc, test_help);
    tcase_add_test(tc, test_bad_flags);
    tcase_add_test(tc, test_cross_field_checks);
    tcase_add_test(tc, test_budget_and_swap_defaults);
    tcase_add_test(tc, test_env_api_key);
    tcase_add_test(tc, test_admin_api_key);
    tcase_add_test(tc, test_file_every_key);
    tcase_add_test(tc, test_flags_override_file);
    tcase_add_test(tc, test_file_errors);
    tcase_add_test(tc, test_too_many_tenants);
    tcase_add_test(tc, test_long_line);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_dtype);
    tcase_add_test(tc, test_matmul_precision);
    tcase_add_test(tc, test_example_file);
    tcase_add_test(tc, test_parsers);
    tcase_add_test(tc, test_watermark_and_vtc_weights);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(config_suite());
    int failed;

    unsetenv("KVSERVE_API_KEY");
    unsetenv("KVSERVE_ADMIN_API_KEY");
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
