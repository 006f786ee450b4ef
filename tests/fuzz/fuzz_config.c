/* fuzz_config.c - fuzz target: the INI config file parser (libinih
 * underneath) on arbitrary file contents, through cfg_parse() with
 * `--config FILE` so the final cross-field validation runs too.
 *
 * Properties: a failure is ST_EFORMAT (or ST_EINVAL) with a non-empty
 * one-line message; an accepted file gives a cfg_t whose values are
 * in range (tenant count, names, weights, KV shares, sizes) and whose
 * strings are valid UTF-8; writing the result with cfg_write_ini() and
 * loading that again is a fixed point (same INI text). Parsing is linear in
 * the file size.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/status.h"
#include "config/config.h"
#include "tests/fuzz/fuzz_common.h"

static int g_fd = -1;
static char g_path[64];

static void
put_file(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        g_fd = memfd_create("kvserve-fuzz.conf", 0);
        FUZZ_CHECK(g_fd >= 0, "memfd_create");
        snprintf(g_path, sizeof(g_path), "/proc/self/fd/%d", g_fd);
    }
    FUZZ_CHECK(ftruncate(g_fd, 0) == 0, "ftruncate");
    FUZZ_CHECK(pwrite(g_fd, data, size, 0) == (ssize_t)size, "pwrite");
}

static void
check_name(const char *s)
{
    FUZZ_CHECK(s[0] != '\0', "empty tenant name");
    for (const char *p = s; *p != '\0'; p++) {
        FUZZ_CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                       (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-',
                   "tenant name '%s'", s);
    }
}

static void
check_cfg(const cfg_t *c)
{
    FUZZ_CHECK(c->n_tenants >= 1 && c->n_tenants <= CFG_MAX_TENANTS, "n_tenants %d", c->n_tenants);
    FUZZ_CHECK(strcmp(c->tenants[0].name, "default") == 0, "tenant 0 is %s", c->tenants[0].name);
    for (int32_t i = 0; i < c->n_tenants; i++) {
        const cfg_tenant_t *t = &c->tenants[i];
        check_name(t->name);
        for (int32_t k = 0; k < i; k++) {
            FUZZ_CHECK(strcmp(c->tenants[k].name, t->name) != 0, "duplicate tenant %s", t->name);
        }
        FUZZ_CHECK(t->weight > 0 && t->weight < 1e300, "weight %g", t->weight);
        FUZZ_CHECK(t->max_kv_share > 0 && t->max_kv_share <= 1, "kv share %g", t->max_kv_share);
        FUZZ_CHECK(t->max_running >= 0 && t->max_waiting >= 0 && t->tokens_per_minute >= 0,
                   "quota");
        size_t kl = strlen(t->api_key_sha256);
        FUZZ_CHECK(kl == 64 || (kl == 0 && i == 0), "tenant %s key digest length %zu", t->name,
                   kl);
        for (size_t k = 0; k < kl; k++) {
            char ch = t->api_key_sha256[k];
            FUZZ_CHECK((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'), "digest not hex");
        }
        FUZZ_CHECK(fuzz_utf8_valid(t->prefix_cache_salt, strlen(t->prefix_cache_salt)), "salt");
    }
    FUZZ_CHECK(c->port >= 0 && c->port <= 65535, "port %d", c->port);
    FUZZ_CHECK(c->max_num_seqs >= 1, "max_num_seqs %d", c->max_num_seqs);
    FUZZ_CHECK(c->max_num_batched_tokens >= 1, "max_num_batched_tokens");
    FUZZ_CHECK(c->block_size >= 1, "block_size %d", c->block_size);
    FUZZ_CHECK(c->num_kv_blocks >= 0 && c->kv_cache_memory >= 0, "kv size");
    FUZZ_CHECK(c->swap_space_gib >= 0, "swap %g", c->swap_space_gib);
    FUZZ_CHECK(c->max_model_len >= 0 && c->tensor_parallel_size >= 1, "len / tp");
    FUZZ_CHECK(c->gpu_memory_utilization > 0 && c->gpu_memory_utilization <= 1, "gpu util");
    FUZZ_CHECK(c->drain_timeout_s >= 0 && c->idle_timeout_s >= 0 && c->request_timeout_s >= 0,
               "timeouts");
    FUZZ_CHECK(c->max_body_bytes > 0 && c->max_header_bytes > 0, "limits");
    FUZZ_CHECK(c->max_connections >= 1 && c->max_connections_per_ip >= 1, "connections");
    FUZZ_CHECK(c->max_n >= 1 && c->max_tokens_cap >= 0 && c->max_waiting_requests >= 0, "caps");
    FUZZ_CHECK(c->max_sse_buffer_bytes > 0, "sse buffer");
    FUZZ_CHECK(c->kv_policy_sink >= 0 && c->kv_policy_window >= 0, "kv policy");
    FUZZ_CHECK(fuzz_utf8_valid(c->model, strlen(c->model)), "model path not UTF-8");
    FUZZ_CHECK(fuzz_utf8_valid(c->served_model_name, strlen(c->served_model_name)), "name");
    FUZZ_CHECK(fuzz_utf8_valid(c->host, strlen(c->host)), "host not UTF-8");
}

/* cfg_parse() of `serve --config <the memfd>`. */
static int
parse_with_file(cfg_t *c, char *err, size_t errlen)
{
    char *argv[] = {"serve", "--config", g_path, NULL};

    return cfg_parse(3, argv, c, err, errlen);
}

static char *
write_ini(const cfg_t *c, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);

    cfg_write_ini(c, f);
    fclose(f);
    return buf;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cfg_t *c = malloc(sizeof(*c)), *c2 = malloc(sizeof(*c2));
    char err[512] = "";

    put_file(data, size);
    int rc = parse_with_file(c, err, sizeof(err));
    if (rc != ST_OK) {
        FUZZ_CHECK(rc == ST_EFORMAT || rc == ST_EINVAL, "rc %d (%s)", rc, err);
        /* Cross-field errors ("tenants a and b have the same API key")
         * name neither a line nor a flag; the rest must. */
        FUZZ_CHECK(err[0] != '\0', "empty error message");
        FUZZ_CHECK(strchr(err, '\n') == NULL, "message is not one line: %s", err);
        goto out;
    }
    check_cfg(c);
    size_t l1, l2;
    char *ini1 = write_ini(c, &l1);
    put_file((const uint8_t *)ini1, l1);
    rc = parse_with_file(c2, err, sizeof(err));
    FUZZ_CHECK(rc == ST_OK, "the written config does not load: %s\n%s", err, ini1);
    check_cfg(c2);
    char *ini2 = write_ini(c2, &l2);
    FUZZ_CHECK(l1 == l2 && memcmp(ini1, ini2, l1) == 0, "not a fixed point:\n%s\n---\n%s", ini1,
               ini2);
    free(ini1);
    free(ini2);
out:
    free(c);
    free(c2);
    return 0;
}

static uint8_t *
gen_tenants(size_t k, size_t *len)
{
    size_t cap = 64 + k * 160;
    char *b = malloc(cap);
    size_t o = 0;

    o += (size_t)sprintf(b + o, "max_num_seqs = 64\n");
    for (size_t i = 0; i < k; i++) {
        /* Repeated sections: only CFG_MAX_TENANTS distinct names. */
        o += (size_t)sprintf(b + o,
                             "[tenant t%zu]\napi_key_sha256 = %064zu\nweight = 2\n"
                             "max_running = 4 ; comment\n# comment\n\n",
                             i % (CFG_MAX_TENANTS - 1), i % (CFG_MAX_TENANTS - 1));
    }
    *len = o;
    return (uint8_t *)b;
}

static uint8_t *
gen_long_lines(size_t k, size_t *len)
{
    char *b = malloc(64 + k * 8);
    size_t o = (size_t)sprintf(b, "[serve]\nkv_policy = ");

    for (size_t i = 0; i < k; i++) {
        memcpy(b + o, "        ", 8);
        o += 8;
    }
    o += (size_t)sprintf(b + o, "full\n");
    *len = o;
    return (uint8_t *)b;
}

static void
run_cfg(const uint8_t *data, size_t len)
{
    cfg_t *c = malloc(sizeof(*c));
    char err[512];

    put_file(data, len);
    (void)parse_with_file(c, err, sizeof(err));
    free(c);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"config many sections", gen_tenants, run_cfg, 1024},
    {"config long line", gen_long_lines, run_cfg, 8192},
    {NULL, NULL, NULL, 0},
};
