/* cmd_generate.c - `kvserve generate`: one prompt through the model on the
 * CPU runtime, sampled token by token, printed as it is generated (or as
 * one JSON object with --json).
 *
 * The run goes through the same paged path as the server: one sequence
 * whose blocks the block manager hands out (scheduler/kv_stream.h), its
 * block table and slot mapping, chunked prefill of at most
 * GEN_PREFILL_CHUNK tokens per step, then one decode token per step.
 */
#define LOG_MODULE "generate"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "scheduler/kv_stream.h"
#include "text/tokenizer.h"
#include "cli/cmds.h"

#define GEN_BLOCK 16
#define GEN_PREFILL_CHUNK 256
#define GEN_TOP_N 5
#define GEN_DEFAULT_MODEL "models/austen-2.7m"

static void
gen_usage(FILE *f)
{
    fprintf(f, "usage: kvserve generate [--model PATH] --prompt TEXT [--max-tokens N]\n"
               "                        [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
               "                        [--json] [--device cpu|cuda] [--[no-]enforce-eager]\n"
               "\n"
               "  --model PATH       Hugging Face directory or .gguf file\n"
               "                     (default " GEN_DEFAULT_MODEL ")\n"
               "  --prompt TEXT      the prompt (a BOS token is added as the tokenizer says)\n"
               "  --max-tokens N     tokens to generate at most (default 128; capped by the\n"
               "                     model's context)\n"
               "  --temperature T    0 = greedy (default 1.0)\n"
               "  --top-p P          nucleus sampling, 0 < P <= 1 (default 1)\n"
               "  --top-k K          keep the K most likely tokens, 0 = off (default 0)\n"
               "  --seed S           RNG seed (default: from the clock)\n"
               "  --json             print one JSON object: prompt_token_ids, token_ids, text,\n"
               "                     finish_reason and per-step top_logprobs (5 ids)\n"
               "  --device D         cpu (default) or cuda (the first GPU, bf16 KV)\n"
               "  --enforce-eager    cuda: every step eagerly; --no-enforce-eager (the\n"
               "                     default): decode steps as a CUDA graph\n"
               "  --help             this text\n");
}

/* The default model: under the source tree kvserve was built from, else
 * relative to the working directory. */
static const char *
gen_default_model(char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", KVSERVE_SOURCE_ROOT, GEN_DEFAULT_MODEL);
    if (access(buf, R_OK) == 0) {
        return buf;
    }
    return GEN_DEFAULT_MODEL;
}

static int
gen_parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    v = strtod(s, &end);
    if (*end != '\0' || !(v >= lo && v <= hi)) {
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    int32_t max_tokens;
    float temperature;
    float top_p;
    int32_t top_k;
    uint64_t seed;
    int json;
    const char *device; /* "cpu" or "cuda" */
    int cuda_graphs;    /* --no-enforce-eager */
} gen_opts_t;

/* 0 ok, 1 --help printed, 2 usage error (message printed). */
static int
gen_parse(int argc, char **argv, gen_opts_t *o)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"temperature", required_argument, NULL, 't'},
        {"top-p", required_argument, NULL, 'P'},
        {"top-k", required_argument, NULL, 'k'},
        {"seed", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"device", required_argument, NULL, 'D'},
        {"enforce-eager", no_argument, NULL, 'E'},
        {"no-enforce-eager", no_argument, NULL, 'G'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, have_seed = 0;
    double v;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'p':
            o->prompt = optarg;
            break;
        case 'n':
            if (gen_parse_num(optarg, 1, 1 << 24, &v) != 0 || v != (int32_t)v) {
                fprintf(stderr, "kvserve generate: --max-tokens wants a positive integer\n");
                return 2;
            }
            o->max_tokens = (int32_t)v;
            break;
        case 't':
            if (gen_parse_num(optarg, 0, 100, &v) != 0) {
                fprintf(stderr, "kvserve generate: --temperature wants a number in [0, 100]\n");
                return 2;
            }
            o->temperature = (float)v;
            break;
        case 'P':
            if (gen_parse_num(optarg, 0, 1, &v) != 0 || v <= 0) {
                fprintf(stderr, "kvserve generate: --top-p wants a number in (0, 1]\n");
                return 2;
            }
            o->top_p = (float)v;
            break;
        case 'k':
            if (gen_parse_num(optarg, 0, 1 << 30, &v) != 0 || v != (int32_t)v) {
                fprintf(stderr, "kvserve generate: --top-k wants an integer >= 0\n");
                return 2;
            }
            o->top_k = (int32_t)v;
            break;
        case 's': {
            char *end;

            if (optarg[0] == '-' || optarg[0] == '\0') {
                fprintf(stderr, "kvserve generate: --seed wants an unsigned integer\n");
                return 2;
            }
            o->seed = strtoull(optarg, &end, 10);
            if (*end != '\0') {
                fprintf(stderr, "kvserve generate: --seed wants an unsigned integer\n");
                return 2;
            }
            have_seed = 1;
            break;
        }
        case 'j':
            o->json = 1;
            break;
        case 'D':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, "kvserve generate: --device: expected cpu or cuda, not '%s'\n",
                        optarg);
                return 2;
            }
            o->device = optarg;
            break;
        case 'E':
        case 'G':
            o->cuda_graphs = c == 'G';
            break;
        case 'h':
            return 1;
        default:
            if (optopt != 0) {
                fprintf(stderr, "kvserve generate: option '%s' needs a value or is unknown\n",
                        argv[optind - 1]);
            } else {
                fprintf(stderr, "kvserve generate: unknown option '%s'\n", argv[optind - 1]);
            }
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvserve generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->prompt == NULL) {
        fprintf(stderr, "kvserve generate: --prompt is required\n");
        return 2;
    }
    if (!have_seed) {
        o->seed = now_ns() ^ ((uint64_t)getpid() << 32);
    }
    return 0;
}

/* The state of one generation, freed by gen_free(). */
typedef struct gen {
    mdl_model_t *m;
    mdl_runtime_t *rt;
    smp_ctx_t *smp;
    int32_t *hist; /* prompt + generated ids */
    int32_t n_prompt;
    int32_t n_hist;
    sched_stream_t *ks; /* the sequence: its blocks come from blockmgr */
    float *row;         /* a copy of the logits row the sampler may modify */
    cJSON *top;          /* per-step top_logprobs (--json) */
    char *text;          /* the completion so far, NUL-terminated */
    size_t text_len, text_cap;
} gen_t;

static void
gen_text_append(gen_t *g, const char *s, size_t n)
{
    if (g->text_len + n + 1 > g->text_cap) {
        g->text_cap = (g->text_len + n + 1) * 2;
        g->text = xrealloc(g->text, g->text_cap);
    }
    memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = '\0';
}

static void
gen_free(gen_t *g)
{
    free(g->hist);
    free(g->row);
    free(g->text);
    cJSON_Delete(g->top);
    smp_ctx_destroy(g->smp);
    sched_stream_destroy(g->ks);
    mdl_runtime_destroy(g->rt);
    mdl_model_destroy(g->m);
}

/* Row callback: the logits of a forward's last token go to g->row. */
static void
gen_keep_row(void *arg, int64_t i, const float *logits)
{
    gen_t *g = arg;

    (void)i;
    memcpy(g->row, logits, sizeof(float) * (size_t)mdl_model_config(g->m)->vocab_size);
}

/* Runs hist[from, from + n) through the model in forwards of at most the
 * stream's chunk; the last row's logits are copied into g->row. */
static int
gen_step(gen_t *g, int32_t from, int32_t n)
{
    return sched_stream_feed_last(g->ks, g->hist + from, n, gen_keep_row, g);
}

static int
gen_is_eos(const mdl_config_t *c, const tok_tokenizer_t *tok, int32_t id)
{
    for (int32_t i = 0; i < c->n_eos; i++) {
        if (c->eos_ids[i] == id) {
            return 1;
        }
    }
    return c->n_eos == 0 && id == tok_eos_id(tok);
}

static cJSON *
gen_ids_json(const int32_t *ids, int32_t n)
{
    cJSON *a = cJSON_CreateArray();

    for (int32_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    }
    return a;
}

int
cmd_generate(int argc, char **argv)
{
    gen_opts_t o = {
        .max_tokens = 128, .temperature = 1.0f, .top_p = 1.0f, .device = "cpu", .cuda_graphs = 1};
    gen_t g = {0};
    char err[512] = "", defpath[4096];
    const tok_tokenizer_t *tok;
    const mdl_config_t *c;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *finish = "length";
    int rc, status = 1;

    rc = gen_parse(argc, argv, &o);
    if (rc == 1) {
        gen_usage(stdout);
        return 0;
    }
    if (rc == 2) {
        gen_usage(stderr);
        return 2;
    }
    if (o.model == NULL) {
        o.model = gen_default_model(defpath, sizeof(defpath));
    }

    rc = mdl_model_load(o.model, &g.m, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        return 1;
    }
    c = mdl_model_config(g.m);
    tok = mdl_model_tokenizer(g.m);
    rc = tok_encode(tok, o.prompt, strlen(o.prompt), TOK_ADD_SPECIAL, &ids, &n_ids);
    if (rc != ST_OK || n_ids == 0) {
        fprintf(stderr, "kvserve generate: the prompt encodes to no tokens\n");
        goto out;
    }
    if ((int64_t)n_ids >= c->max_pos) {
        fprintf(stderr, "kvserve generate: the prompt is %zu tokens; the context is %d\n", n_ids,
                c->max_pos);
        goto out;
    }
    g.n_prompt = (int32_t)n_ids;
    if (o.max_tokens > c->max_pos - g.n_prompt) {
        o.max_tokens = c->max_pos - g.n_prompt;
    }

    int32_t total = g.n_prompt + o.max_tokens;
    int32_t chunk = g.n_prompt < GEN_PREFILL_CHUNK ? g.n_prompt : GEN_PREFILL_CHUNK;

    int32_t max_blocks = sched_stream_blocks(GEN_BLOCK, total);
    mdl_runtime_config_t rcfg = {
        .device = o.device,
        .block_size = GEN_BLOCK,
        .num_blocks = max_blocks + 1,
        .max_num_batched_tokens = chunk,
        .max_num_seqs = 1,
        .max_blocks_per_seq = max_blocks,
        .cuda_graphs = o.cuda_graphs,
    };
    rc = mdl_runtime_create(g.m, &rcfg, &g.rt, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        goto out;
    }
    rc = sched_stream_create(g.rt, NULL, GEN_BLOCK, total, chunk, c->vocab_size, &g.ks);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve generate: KV blocks: %s\n", st_str(rc));
        goto out;
    }
    rc = smp_ctx_create(c->vocab_size, &g.smp);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve generate: sampler: %s\n", st_str(rc));
        goto out;
    }
    g.hist = calloc((size_t)total, sizeof(int32_t));
    g.row = calloc((size_t)c->vocab_size, sizeof(float));
    if (g.hist == NULL || g.row == NULL) {
        fprintf(stderr, "kvserve generate: out of memory\n");
        goto out;
    }
    memcpy(g.hist, ids, sizeof(int32_t) * n_ids);
    g.n_hist = g.n_prompt;

    double t_start = now_s(), t_first;

    /* Prefill in chunks; the last chunk's logits give the first token. */
    rc = gen_step(&g, 0, g.n_prompt);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve generate: forward: %s\n", st_str(rc));
        goto out;
    }

    smp_params_t sp = {
        .temperature = o.temperature,
        .top_p = o.top_p,
        .top_k = o.top_k,
        .repetition_penalty = 1.0f,
        .n_logprobs = GEN_TOP_N,
    };
    smp_rng_t rng;
    tok_stream_t ts;
    char piece[256];

    t_first = now_s();
    smp_rng_seed(&rng, o.seed);
    /* The prompt goes through the detokenizer first so that the first
     * generated piece keeps its leading space (SentencePiece strips it
     * only at the start of a text). */
    tok_stream_init(&ts, tok, 1);
    for (int32_t i = 0; i < g.n_prompt; i++) {
        tok_stream_push(&ts, g.hist[i], piece, sizeof(piece));
    }
    if (o.json) {
        g.top = cJSON_CreateArray();
    } else {
        fputs(o.prompt, stdout);
        fflush(stdout);
    }
    for (int32_t k = 0; k < o.max_tokens; k++) {
        smp_result_t res;

        rc = smp_sample(g.smp, &sp, &rng, g.row, g.hist, g.n_hist, g.n_prompt, &res);
        if (rc != ST_OK) {
            fprintf(stderr, "kvserve generate: sampler: %s\n", st_str(rc));
            goto out;
        }
        g.hist[g.n_hist++] = res.token;
        if (o.json) {
            cJSON *step = cJSON_CreateArray();

            for (int32_t i = 0; i < res.n_top; i++) {
                cJSON *e = cJSON_CreateObject();

                cJSON_AddNumberToObject(e, "id", res.top_ids[i]);
                cJSON_AddNumberToObject(e, "logprob", res.top_logprobs[i]);
                cJSON_AddItemToArray(step, e);
            }
            cJSON_AddItemToArray(g.top, step);
        }
        if (gen_is_eos(c, tok, res.token)) {
            finish = "stop";
            break;
        }
        int n = tok_stream_push(&ts, res.token, piece, sizeof(piece));

        if (n > 0) {
            gen_text_append(&g, piece, (size_t)n);
            if (!o.json) {
                fwrite(piece, 1, (size_t)n, stdout);
                fflush(stdout);
            }
        }
        if (k + 1 < o.max_tokens) {
            rc = gen_step(&g, g.n_hist - 1, 1);
            if (rc != ST_OK) {
                fprintf(stderr, "kvserve generate: forward: %s\n", st_str(rc));
                goto out;
            }
        }
    }

    int32_t n_gen = g.n_hist - g.n_prompt;
    double t_end = now_s();

    LOG_INFO("prompt %d tokens in %.3f s (%.1f tok/s), %d generated in %.3f s (%.1f tok/s)",
             g.n_prompt, t_first - t_start, g.n_prompt / (t_first - t_start + 1e-9), n_gen,
             t_end - t_first, n_gen / (t_end - t_first + 1e-9));
    int n_tail = tok_stream_flush(&ts, piece, sizeof(piece));

    if (n_tail > 0) {
        gen_text_append(&g, piece, (size_t)n_tail);
        if (!o.json) {
            fwrite(piece, 1, (size_t)n_tail, stdout);
        }
    }
    if (o.json) {
        cJSON *root = cJSON_CreateObject();
        char *js;

        /* text is the completion alone, without a final EOS (as the
         * OpenAI API reports it). */
        cJSON_AddItemToObject(root, "prompt_token_ids", gen_ids_json(g.hist, g.n_prompt));
        cJSON_AddItemToObject(root, "token_ids", gen_ids_json(g.hist + g.n_prompt, n_gen));
        cJSON_AddStringToObject(root, "text", g.text != NULL ? g.text : "");
        cJSON_AddStringToObject(root, "finish_reason", finish);
        cJSON_AddItemToObject(root, "top_logprobs", g.top);
        g.top = NULL;
        js = cJSON_PrintUnformatted(root);
        puts(js);
        free(js);
        cJSON_Delete(root);
    } else {
        fputc('\n', stdout);
    }
    fflush(stdout);
    status = 0;

out:
    free(ids);
    gen_free(&g);
    return status;
}
