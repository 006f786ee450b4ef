/* fuzz_chat.c - fuzz target: the chat template interpreter (text/chat.h),
 * on fuzzed template source and on the checked-in real templates with
 * fuzzed messages.
 *
 * Input: fields separated by NUL bytes. The first byte selects the mode:
 * odd - field 0 is the template source, the rest are role/content pairs;
 * even - byte 1 picks one of the templates in tests/fixtures/chat-templates
 * and the fields after it are role/content pairs.
 * Properties: compile and render fail only with ST_EFORMAT / ST_ETOOLONG /
 * ST_EINVAL and a message; a render never exceeds max_output; when the
 * template and the messages are valid UTF-8 the output is valid UTF-8 (the
 * interpreter slices by code point); rendering twice gives the same text
 * (every replayed input; under libFuzzer the inputs whose first byte has
 * bits 2-3 clear, a quarter, since the second render doubles the cost).
 * Compiling and rendering are linear in the template and message sizes.
 */
#include <dirent.h>
#include <string.h>

#include "common/status.h"
#include "text/chat.h"
#include "tests/fuzz/fuzz_common.h"

#define MAX_TEMPLATES 128
#define MAX_MSGS 16
#define MAX_OUT ((size_t)64 << 10)

static chat_template_t *g_tpl[MAX_TEMPLATES];
static int g_n_tpl;

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char dir[1024], path[2048], err[256];
    char *names[MAX_TEMPLATES];
    int n = 0;
    DIR *d;
    struct dirent *e;

    (void)argc;
    (void)argv;
    snprintf(dir, sizeof(dir), "%s/tests/fixtures/chat-templates", fuzz_source_root());
    d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "fuzz_chat: no %s\n", dir);
        exit(1);
    }
    while ((e = readdir(d)) != NULL && n < MAX_TEMPLATES) {
        size_t l = strlen(e->d_name);
        if (l > 6 && strcmp(e->d_name + l - 6, ".jinja") == 0) {
            names[n++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(*names), cmp_str);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            fseek(f, 0, SEEK_END);
            long len = ftell(f);
            fseek(f, 0, SEEK_SET);
            char *src = malloc((size_t)len + 1);
            size_t got = fread(src, 1, (size_t)len, f);
            src[got] = '\0';
            fclose(f);
            if (chat_template_compile(src, &g_tpl[g_n_tpl], err, sizeof(err)) == ST_OK) {
                g_n_tpl++;
            }
            free(src);
        }
        free(names[i]);
    }
    return 0;
}

static void
render_check(const chat_template_t *t, const chat_message_t *msgs, size_t n, int valid_in,
             int gen, int twice)
{
    chat_render_opts_t o = {
        .bos_token = "<s>",
        .eos_token = "</s>",
        .add_generation_prompt = gen,
        .now = 1700000000,
        .max_output = MAX_OUT,
    };
    char *out = NULL, *out2 = NULL, err[256] = "";
    int rc = chat_template_render(t, msgs, n, &o, &out, err, sizeof(err));

    if (rc != ST_OK) {
        FUZZ_CHECK(rc == ST_EFORMAT || rc == ST_ETOOLONG || rc == ST_EINVAL, "render rc %d", rc);
        FUZZ_CHECK(out == NULL, "output on error");
        return;
    }
    size_t len = strlen(out);
    FUZZ_CHECK(len <= MAX_OUT, "output %zu bytes over the cap", len);
    if (valid_in) {
        FUZZ_CHECK(fuzz_utf8_valid(out, len), "output not UTF-8");
    }
    if (twice) {
        FUZZ_CHECK(chat_template_render(t, msgs, n, &o, &out2, err, sizeof(err)) == ST_OK,
                   "second render failed: %s", err);
        FUZZ_CHECK(strcmp(out, out2) == 0, "renders differ");
        free(out2);
    }
    free(out);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf, *fields[2 + 2 * MAX_MSGS];
    int nf = 0;
    chat_message_t msgs[MAX_MSGS];
    size_t nm = 0;

    if (size < 2) {
        return 0;
    }
    int mode_src = data[0] & 1;
    int gen = (data[0] >> 1) & 1;
    int twice = fuzz_replay || (data[0] & 0x0c) == 0;
    buf = malloc(size - 1 + 1);
    memcpy(buf, data + 2, size - 2);
    buf[size - 2] = '\0';
    /* Split on NUL: the last field ends at the terminator. */
    size_t body = size - 2;
    fields[nf++] = buf;
    for (size_t i = 0; i < body && nf < (int)(sizeof(fields) / sizeof(fields[0])); i++) {
        if (buf[i] == '\0') {
            fields[nf++] = buf + i + 1;
        }
    }
    int valid_in = fuzz_utf8_valid((const char *)data + 2, body);
    int first = mode_src ? 1 : 0;
    for (int i = first; i + 1 < nf && nm < MAX_MSGS; i += 2) {
        msgs[nm].role = fields[i];
        msgs[nm].content = fields[i + 1][0] == '\x01' ? NULL : fields[i + 1];
        nm++;
    }
    if (mode_src) {
        chat_template_t *t = NULL;
        char err[256] = "";
        int rc = chat_template_compile(fields[0], &t, err, sizeof(err));
        if (rc != ST_OK) {
            FUZZ_CHECK(rc == ST_EFORMAT || rc == ST_ETOOLONG, "compile rc %d", rc);
            FUZZ_CHECK(t == NULL && err[0] != '\0', "compile error without a message");
        } else {
            render_check(t, msgs, nm, valid_in, gen, twice);
            chat_template_destroy(t);
        }
    } else if (g_n_tpl > 0) {
        render_check(g_tpl[data[1] % g_n_tpl], msgs, nm, valid_in, gen, twice);
    }
    free(buf);
    return 0;
}

/* ---- linearity ------------------------------------------------------------ */

static uint8_t *
gen_long_source(size_t k, size_t *len)
{
    static const char unit[] = "{% if messages %}{{ messages[0].content | trim }}{% endif %} x\n";
    size_t ul = sizeof(unit) - 1;
    uint8_t *b = malloc(2 + k * ul + 16);
    size_t o = 2;

    b[0] = 1;
    b[1] = 0;
    for (size_t i = 0; i < k; i++) {
        memcpy(b + o, unit, ul);
        o += ul;
    }
    memcpy(b + o, "\0user\0hi", 8);
    *len = o + 8;
    return b;
}

static uint8_t *
gen_long_content(size_t k, size_t *len)
{
    static const char src[] =
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}"
        "{% if m.content.startswith('x') %}!{% endif %}{{ m.content | length }}"
        "{{ m.content.replace('c', 'C') | upper }}{{ m.content[1:-1] | trim }}"
        "{{ m.content | tojson }}{% endfor %}";
    size_t sl = sizeof(src) - 1;
    uint8_t *b = malloc(2 + sl + 8 + k * 8);
    size_t o = 2;

    b[0] = 1;
    b[1] = 0;
    memcpy(b + o, src, sl);
    o += sl;
    memcpy(b + o, "\0user\0", 6);
    o += 6;
    for (size_t i = 0; i < k; i++) {
        memcpy(b + o, "ab c\xc3\xa9 d", 8);
        o += 8;
    }
    *len = o;
    return b;
}

static void
run_chat(const uint8_t *data, size_t len)
{
    chat_template_t *t = NULL;
    char err[256];
    const char *src = (const char *)data + 2;
    const char *role = src + strlen(src) + 1;
    size_t clen = len - (size_t)(role + strlen(role) + 1 - (const char *)data);
    char *content = malloc(clen + 1);
    char *out = NULL;
    chat_render_opts_t o = {.now = 1, .max_output = (size_t)1 << 30};

    memcpy(content, role + strlen(role) + 1, clen);
    content[clen] = '\0';
    chat_message_t m = {.role = role, .content = content};
    FUZZ_CHECK(chat_template_compile(src, &t, err, sizeof(err)) == ST_OK, "%s", err);
    FUZZ_CHECK(chat_template_render(t, &m, 1, &o, &out, err, sizeof(err)) == ST_OK, "%s", err);
    free(out);
    free(content);
    chat_template_destroy(t);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"chat long template", gen_long_source, run_chat, 64},
    {"chat long message", gen_long_content, run_chat, 1024},
    {NULL, NULL, NULL, 0},
};
