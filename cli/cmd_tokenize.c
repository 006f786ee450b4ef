/* cmd_tokenize.c - `kvserve tokenize`: prints the token ids of a text.
 *
 * Loads only the tokenizer: a model directory (tokenizer.json, plus
 * tokenizer_config.json when present), a tokenizer.json file (its sibling
 * tokenizer_config.json is used when present), or a .gguf file (its
 * embedded vocabulary). With --text the ids of that text are printed as
 * one JSON array; otherwise every stdin line must be a JSON string and one
 * array per line is printed (flushed line by line, so it can be driven
 * interactively). A stdin string is tokenized whole, an escaped NUL
 * ("\u0000") included: cJSON validates the line, and json_string_bytes()
 * decodes it with its length (cJSON's valuestring ends at the first NUL).
 */
#define LOG_MODULE "tokenize"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"
#include "cli/cmds.h"

static void
tokenize_usage(FILE *f)
{
    fprintf(f, "usage: kvserve tokenize [--model PATH] [--no-special] [--text TEXT]\n"
               "\n"
               "Prints the token ids of TEXT as a JSON array. Without --text, reads one\n"
               "JSON string per line on stdin and prints one JSON array per line.\n"
               "\n"
               "  --model PATH    model directory, tokenizer.json file or .gguf file\n"
               "                  (default models/austen-2.7m)\n"
               "  --no-special    add no BOS/EOS and treat special-token text as plain text\n"
               "  --text TEXT     tokenize TEXT instead of reading stdin\n"
               "  --help          show this help\n");
}

static int
ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);

    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Loads the tokenizer of path; on failure prints why and returns non-zero. */
static int
load_tokenizer(const char *path, tok_tokenizer_t **out)
{
    char err[512] = "";
    char *json = NULL, *cfg = NULL;
    struct stat st;
    int rc;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "kvserve tokenize: %s: %s\n", path, st_str(-errno));
        return 1;
    }
    if (S_ISREG(st.st_mode) && ends_with(path, ".gguf")) {
        gguf_file_t *g = NULL;
        rc = gguf_open(path, &g, err, sizeof(err));
        if (rc == ST_OK) {
            rc = tok_load_gguf(g, out, err, sizeof(err));
            gguf_close(g);
        }
    } else {
        if (S_ISDIR(st.st_mode)) {
            size_t n = strlen(path) + 32;
            json = xmalloc(n);
            cfg = xmalloc(n);
            snprintf(json, n, "%s/tokenizer.json", path);
            snprintf(cfg, n, "%s/tokenizer_config.json", path);
        } else {
            const char *slash = strrchr(path, '/');
            size_t dir = slash ? (size_t)(slash - path + 1) : 0;
            json = xstrdup(path);
            cfg = xmalloc(dir + 32);
            snprintf(cfg, dir + 32, "%.*stokenizer_config.json", (int)dir, path);
        }
        if (access(cfg, R_OK) != 0) {
            free(cfg);
            cfg = NULL;
        }
        rc = tok_load_hf(json, cfg, out, err, sizeof(err));
    }
    free(json);
    free(cfg);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve tokenize: %s\n", err[0] ? err : st_str(rc));
        return 1;
    }
    return 0;
}

static int
hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16u) {
            return 0;
        }
        *v = *v * 16 + d;
    }
    return 1;
}

static size_t
utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The bytes of the JSON string literal that line[0..n) holds (white space
 * around it allowed; the caller has had cJSON validate the line), with
 * their length, so an escaped NUL does not end the text. *out is malloc'd
 * (the decoded text is never longer than the literal). Returns 0 on a
 * malformed literal. A lone surrogate escape becomes U+FFFD. */
static int
json_string_bytes(const char *line, size_t n, char **out, size_t *len)
{
    size_t i = 0, k = 0;
    char *o;

    while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) {
        i++;
    }
    if (i >= n || line[i] != '"') {
        return 0;
    }
    i++;
    o = xmalloc(n + 1);
    while (i < n && line[i] != '"') {
        char c = line[i++];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        if (i >= n) {
            break;
        }
        c = line[i++];
        if (c == 'u') {
            unsigned cp, lo;
            if (i + 4 > n || !hex4(line + i, &cp)) {
                free(o);
                return 0;
            }
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= n && line[i] == '\\' &&
                line[i + 1] == 'u' && hex4(line + i + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            } else if (cp >= 0xD800 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            k += utf8_put(o + k, cp);
            continue;
        }
        static const char esc[] = "b\bf\fn\nr\rt\t";
        const char *e = strchr(esc, c);
        /* '"', '\\' and '/' stand for themselves. */
        o[k++] = e != NULL && (e - esc) % 2 == 0 ? e[1] : c;
    }
    if (i >= n) {
        free(o);
        return 0;
    }
    o[k] = '\0';
    *out = o;
    *len = k;
    return 1;
}

/* Prints the ids of text[0..len) as a JSON array line. */
static int
print_ids(const tok_tokenizer_t *t, const char *text, size_t len, int flags)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_encode(t, text, len, flags, &ids, &n);

    if (rc != ST_OK) {
        fprintf(stderr, "kvserve tokenize: %s\n", st_str(rc));
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) {
        printf(i ? ",%d" : "%d", ids[i]);
    }
    fputs("]\n", stdout);
    free(ids);
    return 0;
}

int
cmd_tokenize(int argc, char **argv)
{
    const char *model = "models/austen-2.7m";
    const char *text = NULL;
    int flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
    tok_tokenizer_t *t = NULL;
    int status = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            tokenize_usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-special") == 0) {
            flags = 0;
        } else if (strcmp(a, "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strncmp(a, "--model=", 8) == 0) {
            model = a + 8;
        } else if (strcmp(a, "--text") == 0 && i + 1 < argc) {
            text = argv[++i];
        } else if (strncmp(a, "--text=", 7) == 0) {
            text = a + 7;
        } else {
            fprintf(stderr, "kvserve tokenize: bad argument '%s'\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }

    if (load_tokenizer(model, &t) != 0) {
        return 1;
    }
    if (text != NULL) {
        status = print_ids(t, text, strlen(text), flags);
        tok_destroy(t);
        return status;
    }

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        cJSON *j;
        lineno++;
        j = cJSON_ParseWithLength(line, (size_t)n);
        if (!cJSON_IsString(j)) {
            fprintf(stderr, "kvserve tokenize: stdin line %ld is not a JSON string\n", lineno);
            cJSON_Delete(j);
            status = 1;
            break;
        }
        char *text_b = NULL;
        size_t text_n = 0;
        if (!json_string_bytes(line, (size_t)n, &text_b, &text_n)) {
            fprintf(stderr, "kvserve tokenize: stdin line %ld is not a JSON string\n", lineno);
            cJSON_Delete(j);
            status = 1;
            break;
        }
        status = print_ids(t, text_b, text_n, flags);
        free(text_b);
        cJSON_Delete(j);
        fflush(stdout);
        if (status != 0) {
            break;
        }
    }
    free(line);
    tok_destroy(t);
    return status;
}
