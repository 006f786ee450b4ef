/* bench_grammar.c - benchmark, not a test: the cost of the grammar mask
 * per generated token, for real vocabularies (tokenizer.json files given
 * on the command line: the default model's 1024 tokens, Llama 3's 128K),
 * on three JSON schemas and json_object.
 *
 *   bench_grammar TOKENIZER_JSON [TOKENIZER_JSON...]
 *
 * For each vocabulary and schema, 20 documents are generated as a decoder
 * would: a fresh grammar per document (a request compiles its own, so its
 * mask cache starts cold), then per step fill the mask, apply it to a row
 * of logits, pick an allowed token at random (a seeded stream; EOS once
 * allowed, with probability 1/4) and advance the matcher. Prints the
 * microseconds per token (mean, p50, p99, max over steps), tokens per
 * document, how many masks came from the cache, and the compile time.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

static const char *const k_schemas[][2] = {
    {"person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"role\":{\"enum\":[\"lady\","
     "\"gentleman\",\"servant\"]},\"married\":{\"type\":\"boolean\"}},\"required\":[\"name\","
     "\"age\",\"role\",\"married\"],\"additionalProperties\":false}"},
    {"letter",
     "{\"type\":\"object\",\"properties\":{\"to\":{\"type\":\"string\",\"maxLength\":40},"
     "\"date\":{\"type\":\"string\",\"format\":\"date\"},\"lines\":{\"type\":\"array\","
     "\"items\":{\"type\":\"string\",\"maxLength\":60},\"minItems\":1,\"maxItems\":4},"
     "\"postscript\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":30},{\"type\":\"null\"}]}},"
     "\"required\":[\"to\",\"date\",\"lines\",\"postscript\"],\"additionalProperties\":false}"},
    {"tree",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\","
     "\"maxLength\":16},\"weight\":{\"type\":\"number\"},\"kids\":{\"type\":\"array\",\"items\":"
     "{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"label\",\"kids\"],"
     "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}"},
    {"json_object", NULL},
};

static double
now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint64_t
rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static gr_vocab_t *
load_vocab(const char *path, int32_t *n_out, int32_t *eos_out)
{
    tok_tokenizer_t *tok = NULL;
    char err[256];
    if (tok_load_hf(path, NULL, &tok, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        return NULL;
    }
    int32_t n = tok_vocab_size(tok);
    const char **bytes = calloc((size_t)n, sizeof(char *));
    uint32_t *lens = calloc((size_t)n, sizeof(uint32_t));
    tok_output_bytes(tok, bytes, lens);
    int32_t eos = tok_eos_id(tok);
    gr_vocab_t *v = NULL;
    if (gr_vocab_create(n, bytes, lens, &eos, eos >= 0 ? 1 : 0, &v) != ST_OK) {
        v = NULL;
    }
    free(bytes);
    free(lens);
    tok_destroy(tok);
    *n_out = n;
    *eos_out = eos;
    return v;
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON...\n", argv[0]);
        return 2;
    }
    for (int a = 1; a < argc; a++) {
        int32_t n, eos;
        double t0 = now_us();
        gr_vocab_t *v = load_vocab(argv[a], &n, &eos);
        if (v == NULL) {
            return 1;
        }
        printf("vocabulary %s: %d tokens (trie built in %.1f ms with the tokenizer load)\n",
               argv[a], n, (now_us() - t0) / 1000);
        int32_t words = gr_vocab_mask_words(v);
        uint32_t *mask = malloc((size_t)words * 4);
        float *logits = malloc((size_t)n * sizeof(float));
        int32_t *allowed = malloc((size_t)n * sizeof(int32_t));
        for (size_t s = 0; s < sizeof(k_schemas) / sizeof(k_schemas[0]); s++) {
            enum { DOCS = 20, MAX_STEPS = 400 };
            double *step_us = malloc(sizeof(double) * DOCS * MAX_STEPS);
            int n_steps = 0;
            uint64_t walks = 0, hits = 0, seed = 0x9E3779B97F4A7C15ull + s;
            double compile_us = 0;
            for (int d = 0; d < DOCS; d++) {
                char err[256];
                gr_grammar_t *g = NULL;
                double c0 = now_us();
                if (gr_compile(k_schemas[s][1] ? GR_KIND_JSON_SCHEMA : GR_KIND_JSON_OBJECT,
                               k_schemas[s][1], v, &g, err, sizeof(err)) != ST_OK) {
                    fprintf(stderr, "%s: %s\n", k_schemas[s][0], err);
                    return 1;
                }
                gr_matcher_t *m = gr_matcher_create(g);
                compile_us += now_us() - c0;
                for (int step = 0; step < MAX_STEPS && !gr_matcher_done(m); step++) {
                    for (int32_t i = 0; i < n; i++) {
                        logits[i] = 0.0f;
                    }
                    double t1 = now_us();
                    gr_matcher_fill_mask(m, mask);
                    gr_mask_apply(mask, logits, n);
                    double t2 = now_us();
                    int32_t k = 0;
                    for (int32_t i = 0; i < n; i++) {
                        if (logits[i] == 0.0f && i != eos) {
                            allowed[k++] = i;
                        }
                    }
                    int eos_ok = eos >= 0 && logits[eos] == 0.0f;
                    int32_t tok;
                    if (eos_ok && (k == 0 || rnd(&seed) % 4 == 0)) {
                        tok = eos;
                    } else if (k == 0) {
                        break;
                    } else {
                        tok = allowed[rnd(&seed) % (uint64_t)k];
                    }
                    double t3 = now_us();
                    if (gr_matcher_accept_token(m, tok) != ST_OK) {
                        fprintf(stderr, "token %d allowed by the mask but refused\n", tok);
                        return 1;
                    }
                    step_us[n_steps++] = (t2 - t1) + (now_us() - t3);
                    if (tok == eos) {
                        break;
                    }
                }
                uint64_t w, h;
                gr_grammar_stats(g, &w, &h);
                walks += w;
                hits += h;
                gr_matcher_destroy(m);
                gr_grammar_destroy(g);
            }
            double sum = 0;
            for (int i = 0; i < n_steps; i++) {
                sum += step_us[i];
            }
            qsort(step_us, (size_t)n_steps, sizeof(double), cmp_d);
            printf("  %-12s mask+advance per token: mean %8.1f us  p50 %8.1f  p99 %9.1f  max "
                   "%9.1f | %5.1f tokens/doc, cache hits %4.1f%%, compile %.0f us\n",
                   k_schemas[s][0], sum / n_steps, step_us[n_steps / 2],
                   step_us[(int)(n_steps * 0.99)], step_us[n_steps - 1], (double)n_steps / DOCS,
                   100.0 * (double)hits / (double)(hits + walks), compile_us / DOCS);
            free(step_us);
        }
        free(mask);
        free(logits);
        free(allowed);
        gr_vocab_destroy(v);
    }
    return 0;
}
