/* cmd_bench.c - `kvserve bench`: the offline throughput benchmark.
 *
 * Runs the engine thread without HTTP, as vLLM's offline throughput
 * benchmark does: N requests of random prompt token ids (input length I)
 * are all submitted at once, each generating exactly O tokens (EOS
 * ignored), greedy (or --temperature / --top-p, seeded per request, no
 * logprobs, as a server request). The main thread reads the outbox and timestamps every
 * token. Prints requests/s, output and total tokens/s, time to first token
 * and per-token latency percentiles, peak KV usage and preemptions.
 * --json-schema FILE constrains every request to the schema (structured
 * output, grammar/): the same figures with the grammar mask in every step.
 */
#define LOG_MODULE "bench"

#include <getopt.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "grammar/grammar.h"
#include "model/kv_policy.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "scheduler/spec.h"
#include "text/tokenizer.h"
#include "cli/cmds.h"

#define BENCH_DEFAULT_MODEL "models/austen-2.7m"

typedef struct bench_req {
    uint64_t t_first; /* ns */
    uint64_t t_last;  /* ns */
    int32_t n_out;
    int finished;
    int error;
} bench_req_t;

static void
bench_usage(FILE *f)
{
    fprintf(f, "usage: kvserve bench [--model PATH] [--num-prompts N] [--input-len I]\n"
               "                     [--output-len O] [--max-num-seqs S] [--num-kv-blocks B]\n"
               "                     [OPTIONS]\n"
               "\n"
               "  --model PATH                Hugging Face directory or .gguf file\n"
               "                              (default " BENCH_DEFAULT_MODEL ")\n"
               "  --num-prompts N             requests, all submitted at once (default 200)\n"
               "  --input-len I               prompt tokens per request (default 32)\n"
               "  --output-len O              generated tokens per request (default 64)\n"
               "  --max-num-seqs S            sequences per step (default 64)\n"
               "  --max-num-batched-tokens T  tokens per step (default 2048)\n"
               "  --num-kv-blocks B           device KV blocks incl. the null block\n"
               "                              (default: room for every running sequence)\n"
               "  --block-size K              tokens per KV block (default 16)\n"
               "  --swap-blocks C             CPU swap tier blocks (default 0: recompute)\n"
               "  --prefix-caching            enable the prefix cache (default off)\n"
               "  --threads T                 CPU threads for the forward (default: one per physical core)\n"
               "  --device D                  cpu (default) or cuda (the first GPU; bf16 KV by\n"
               "                              default, as serve)\n"
               "  --enforce-eager             cuda: every step eagerly, no step graphs\n"
               "  --no-enforce-eager          cuda: decode and verification steps as CUDA graphs\n"
               "                              (default)\n"
               "  --seed X                    prompt RNG seed (default 1; request r samples\n"
               "                              with seed X + r)\n"
               "  --temperature T             sampling temperature (default 0: greedy)\n"
               "  --top-p P                   nucleus sampling (default 1: off)\n"
               "  --kv-cache-dtype D          auto f32 f16 bf16 fp8_e4m3 int8 int4 tq3 tq4\n"
               "                              (default auto)\n"
               "  --json-schema FILE          constrain every output to this JSON schema\n"
               "  --speculative-config JSON   speculative decoding, as kvserve serve\n"
               "  --kv-policy P               full (default), h2o=B,recent=W or\n"
               "                              snapkv=B,window=W,pool=K (f32 KV cache)\n"
               "  --prompt-file FILE          text to take prompts from (with --prompt-kind)\n"
               "  --prompt-kind K             random (token ids), text (a passage of the\n"
               "                              file), grounded (a passage, then its first\n"
               "                              third again: the answer copies it)\n"
               "  --help                      this text\n");
}

static int
bench_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    v = strtol(s, &end, 10);
    if (*end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *out = v;
    return 0;
}

/* The token ids of a text file, by the model's tokenizer. 0 or -1. */
static int
bench_text(const mdl_model_t *model, const char *path, int32_t **ids, size_t *n)
{
    FILE *f = path != NULL ? fopen(path, "rb") : NULL;
    char *buf;
    long len;
    int rc;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) <= 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    buf = xmalloc((size_t)len);
    rc = fread(buf, 1, (size_t)len, f) == (size_t)len ? 0 : -1;
    fclose(f);
    if (rc == 0 && tok_encode(mdl_model_tokenizer(model), buf, (size_t)len, 0, ids, n) != ST_OK) {
        rc = -1;
    }
    free(buf);
    return rc;
}

static double
bench_cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double
pct(const double *v, size_t n, double p)
{
    size_t k;

    if (n == 0) {
        return 0.0;
    }
    k = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (k == 0) {
        k = 1;
    }
    if (k > n) {
        k = n;
    }
    return v[k - 1];
}

static double
mean(const double *v, size_t n)
{
    double s = 0;

    for (size_t i = 0; i < n; i++) {
        s += v[i];
    }
    return n > 0 ? s / (double)n : 0.0;
}

static void
print_dist(const char *name, double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
    printf("%-22s mean %8.2f  p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f\n", name, mean(v, n),
           pct(v, n, 50), pct(v, n, 90), pct(v, n, 99), n > 0 ? v[n - 1] : 0.0);
}

/* The file's text (malloc'd), or NULL. */
static char *
bench_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = xmalloc((size_t)n + 1);
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

/* The grammar vocabulary of the model's tokenizer, as the server builds
 * it (server/srv_grammar.c): special tokens have no bytes, EOS ids are
 * allowed in accepting states. */
static gr_vocab_t *
bench_vocab(const mdl_model_t *model)
{
    const tok_tokenizer_t *tok = mdl_model_tokenizer(model);
    const mdl_config_t *mc = mdl_model_config(model);
    int32_t n = tok_vocab_size(tok);
    const char **bytes = xcalloc((size_t)n, sizeof(char *));
    uint32_t *lens = xcalloc((size_t)n, sizeof(uint32_t));
    gr_vocab_t *v = NULL;

    tok_output_bytes(tok, bytes, lens);
    if (gr_vocab_create(n, bytes, lens, mc->eos_ids, mc->n_eos, &v) != ST_OK) {
        v = NULL;
    }
    free(bytes);
    free(lens);
    return v;
}

int
cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"num-prompts", required_argument, NULL, 'n'},
        {"input-len", required_argument, NULL, 'i'},
        {"output-len", required_argument, NULL, 'o'},
        {"max-num-seqs", required_argument, NULL, 's'},
        {"max-num-batched-tokens", required_argument, NULL, 't'},
        {"num-kv-blocks", required_argument, NULL, 'b'},
        {"block-size", required_argument, NULL, 'k'},
        {"swap-blocks", required_argument, NULL, 'c'},
        {"prefix-caching", no_argument, NULL, 'p'},
        {"threads", required_argument, NULL, 'j'},
        {"device", required_argument, NULL, 'D'},
        {"enforce-eager", no_argument, NULL, 'E'},
        {"no-enforce-eager", no_argument, NULL, 'G'},
        {"seed", required_argument, NULL, 'x'},
        {"temperature", required_argument, NULL, 'T'},
        {"top-p", required_argument, NULL, 'q'},
        {"kv-cache-dtype", required_argument, NULL, 'd'},
        {"json-schema", required_argument, NULL, 'g'},
        {"speculative-config", required_argument, NULL, 'S'},
        {"kv-policy", required_argument, NULL, 'v'},
        {"prompt-file", required_argument, NULL, 'P'},
        {"prompt-kind", required_argument, NULL, 'K'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char model_buf[1024];
    const char *model_path = NULL;
    const char *schema_path = NULL;
    char *schema = NULL;
    gr_vocab_t *vocab = NULL;
    long n_prompts = 200, in_len = 32, out_len = 64, mns = 64, mnbt = 2048, blocks = 0;
    long bsz = 16, swap = 0, threads = 0, seed = 1;
    double temperature = 0.0, top_p = 1.0;
    int prefix = 0;
    const char *spec_json = NULL, *prompt_file = NULL, *prompt_kind = "random";
    const char *kv_policy = "full";
    const char *device = "cpu";
    int cuda_graphs = 1; /* as serve: decode graphs unless --enforce-eager */
    int32_t *text_ids = NULL;
    size_t n_text = 0;
    mdl_kv_dtype_t kv_dtype = MDL_KV_AUTO;
    int c, rc, status = 1;
    char err[512] = "";
    mdl_model_t *model = NULL;
    engine_t *eng = NULL;
    chan_t outbox;
    bench_req_t *reqs = NULL;
    double *itl = NULL, *ttft = NULL, *tpot = NULL, *e2e = NULL;
    size_t n_itl = 0;
    long n_done = 0, n_err = 0;
    uint64_t t0, t_end;
    eng_stats_t st = {0};
    int got_stats = 0;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        long v;
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'n':
        case 'i':
        case 'o':
        case 's':
        case 't':
        case 'b':
        case 'k':
        case 'c':
        case 'j':
        case 'x':
            if (bench_int(optarg, c == 'c' || c == 'j' || c == 'x' ? 0 : 1, 100000000L, &v) != 0) {
                fprintf(stderr, "kvserve bench: bad value '%s'\n", optarg);
                return 2;
            }
            if (c == 'n') {
                n_prompts = v;
            } else if (c == 'i') {
                in_len = v;
            } else if (c == 'o') {
                out_len = v;
            } else if (c == 's') {
                mns = v;
            } else if (c == 't') {
                mnbt = v;
            } else if (c == 'b') {
                blocks = v;
            } else if (c == 'k') {
                bsz = v;
            } else if (c == 'c') {
                swap = v;
            } else if (c == 'j') {
                threads = v;
            } else {
                seed = v;
            }
            break;
        case 'p':
            prefix = 1;
            break;
        case 'D':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, "kvserve bench: --device: expected cpu or cuda, not '%s'\n",
                        optarg);
                return 2;
            }
            device = optarg;
            break;
        case 'E':
        case 'G':
            cuda_graphs = c == 'G';
            break;
        case 'g':
            schema_path = optarg;
            break;
        case 'S':
            spec_json = optarg;
            break;
        case 'P':
            prompt_file = optarg;
            break;
        case 'T':
        case 'q': {
            char *end;
            double d = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(d >= 0.0) ||
                (c == 'T' ? d > 100.0 : (d <= 0.0 || d > 1.0))) {
                fprintf(stderr, "kvserve bench: bad value '%s'\n", optarg);
                return 2;
            }
            *(c == 'T' ? &temperature : &top_p) = d;
            break;
        }
        case 'K':
            if (strcmp(optarg, "random") != 0 && strcmp(optarg, "text") != 0 &&
                strcmp(optarg, "grounded") != 0) {
                fprintf(stderr, "kvserve bench: bad --prompt-kind '%s'\n", optarg);
                return 2;
            }
            prompt_kind = optarg;
            break;
        case 'v':
            kv_policy = optarg;
            break;
        case 'd':
            if (mdl_kv_dtype_parse(optarg, &kv_dtype) != ST_OK) {
                fprintf(stderr, "kvserve bench: bad --kv-cache-dtype '%s'\n", optarg);
                return 2;
            }
            break;

        case 'h':
            bench_usage(stdout);
            return 0;
        default:
            bench_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvserve bench: unexpected argument '%s'\n", argv[optind]);
        bench_usage(stderr);
        return 2;
    }
    if (model_path == NULL) {
        snprintf(model_buf, sizeof(model_buf), "%s/%s", KVSERVE_SOURCE_ROOT, BENCH_DEFAULT_MODEL);
        model_path = access(model_buf, R_OK) == 0 ? model_buf : BENCH_DEFAULT_MODEL;
    }

    rc = mdl_model_load(model_path, &model, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        return 1;
    }
    const mdl_config_t *mc = mdl_model_config(model);
    if (in_len + out_len > mc->max_pos) {
        fprintf(stderr,
                "kvserve bench: --input-len + --output-len = %ld exceeds the model's "
                "context of %d tokens\n",
                in_len + out_len, mc->max_pos);
        mdl_model_destroy(model);
        return 2;
    }

    if (schema_path != NULL) {
        schema = bench_read_file(schema_path);
        vocab = schema != NULL ? bench_vocab(model) : NULL;
        if (vocab == NULL) {
            fprintf(stderr, "kvserve bench: cannot read %s\n", schema_path);
            mdl_model_destroy(model);
            free(schema);
            return 2;
        }
    }

    eng_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    if (spec_config_parse(spec_json, &cfg.spec, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "kvserve bench: --speculative-config: %s\n", err);
        mdl_model_destroy(model);
        return 2;
    }
    /* H2O / SnapKV (model/kv_policy.h) as every request's default, as
     * kvserve serve --kv-policy; sinks are a serve-side policy only. */
    if (mdl_kv_policy_parse(kv_policy, (int32_t)bsz, &cfg.kv_score, err, sizeof(err)) != ST_OK ||
        (cfg.kv_score.kind == MDL_KVP_FULL && cfg.kv_score.window > 0)) {
        fprintf(stderr, "kvserve bench: --kv-policy: %s\n",
                err[0] != '\0' ? err : "only full, h2o=... or snapkv=... here");
        mdl_model_destroy(model);
        return 2;
    }
    if (cfg.kv_score.kind != MDL_KVP_FULL && !mdl_kv_mass_fits(device, kv_dtype)) {
        fprintf(stderr, "kvserve bench: --kv-policy %s needs an f32 KV cache on cpu, f16 / bf16 "
                "on cuda\n", kv_policy);
        mdl_model_destroy(model);
        return 2;
    }
    if (strcmp(prompt_kind, "random") != 0) {
        if (bench_text(model, prompt_file, &text_ids, &n_text) != 0 ||
            n_text < (size_t)in_len + 1) {
            fprintf(stderr, "kvserve bench: --prompt-file: need a readable text of more than "
                            "--input-len tokens\n");
            free(text_ids);
            mdl_model_destroy(model);
            return 2;
        }
    }
    cfg.rt.device = device;
    cfg.rt.cuda_graphs = cuda_graphs;
    cfg.rt.n_threads = (int32_t)threads;
    cfg.rt.block_size = (int32_t)bsz;
    cfg.rt.swap_blocks = (int32_t)swap;
    cfg.rt.kv_dtype = kv_dtype;
    cfg.max_num_seqs = (int32_t)mns;
    cfg.max_num_batched_tokens = (int32_t)(mnbt > in_len ? mnbt : in_len);
    cfg.max_model_len = (int32_t)(in_len + out_len);
    if (blocks > 0) {
        cfg.rt.num_blocks = (int32_t)blocks;
    } else {
        long per_seq = (in_len + out_len + bsz - 1) / bsz;
        long need = (n_prompts < mns ? n_prompts : mns) * per_seq + 1;
        cfg.rt.num_blocks = (int32_t)need;
    }
    cfg.prefix_caching = prefix;
    cfg.watermark = 0.01f;
    cfg.n_tenants = 1;
    cfg.tenants[0].weight = 1.0;
    snprintf(cfg.tenants[0].name, sizeof(cfg.tenants[0].name), "bench");

    chan_init(&outbox, NULL, NULL);
    rc = engine_create(&cfg, model, &outbox, &eng, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        goto done;
    }
    rc = engine_start(eng);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve bench: engine thread: %s\n", st_str(rc));
        goto done;
    }

    reqs = xcalloc((size_t)n_prompts, sizeof(*reqs));
    itl = xcalloc((size_t)n_prompts * (size_t)out_len + 1, sizeof(double));
    ttft = xcalloc((size_t)n_prompts, sizeof(double));
    tpot = xcalloc((size_t)n_prompts, sizeof(double));
    e2e = xcalloc((size_t)n_prompts, sizeof(double));

    /* Prompts are built before the clock starts. */
    eng_msg_submit_t **subs = xcalloc((size_t)n_prompts, sizeof(*subs));
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (long r = 0; r < n_prompts; r++) {
        eng_msg_submit_t *m = xcalloc(1, sizeof(*m));
        m->hdr.type = ENG_MSG_SUBMIT;
        m->req.id = (uint64_t)r;
        m->req.prompt = xmalloc((size_t)in_len * sizeof(int32_t));
        for (long i = 0; i < in_len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            m->req.prompt[i] = (int32_t)(x % (uint64_t)mc->vocab_size);
        }
        if (text_ids != NULL) {
            /* A passage of the file; grounded: its first third again. */
            long from = (long)(x % (uint64_t)(n_text - (size_t)in_len)), body = in_len - 1;
            if (strcmp(prompt_kind, "grounded") == 0) {
                body = (in_len - 1) * 2 / 3;
            }
            for (long i = 1; i < in_len; i++) {
                m->req.prompt[i] = text_ids[from + (i - 1) % body];
            }
        }
        if (mc->bos_id >= 0) {
            m->req.prompt[0] = mc->bos_id;
        }
        m->req.n_prompt = (int32_t)in_len;
        m->req.sampling.temperature = (float)temperature;
        m->req.sampling.top_p = (float)top_p;
        m->req.sampling.repetition_penalty = 1.0f;
        m->req.sampling.no_logprob = 1; /* as a server request without logprobs */
        m->req.seed = (uint64_t)seed + (uint64_t)r;
        m->req.has_seed = 1;
        m->req.n = 1;
        m->req.max_tokens = (int32_t)out_len;
        m->req.ignore_eos = 1;
        if (schema != NULL && gr_compile(GR_KIND_JSON_SCHEMA, schema, vocab, &m->req.grammar, err,
                                         sizeof(err)) != ST_OK) {
            fprintf(stderr, "kvserve bench: %s: %s\n", schema_path, err);
            return 2;
        }
        subs[r] = m;
    }

    /* One list, queued in one step: the engine must not start on the first
     * requests while the rest are still being sent (a descheduled main
     * thread would otherwise turn "all at once" into a staggered start). */
    double cpu0 = bench_cpu_s();
    t0 = now_ns();
    for (long r = 0; r < n_prompts; r++) {
        subs[r]->req.t_arrival_ns = t0;
        subs[r]->hdr.next = r + 1 < n_prompts ? &subs[r + 1]->hdr : NULL;
    }
    chan_send_list(engine_inbox(eng), &subs[0]->hdr);
    free(subs);

    while (n_done + n_err < n_prompts) {
        msg_t *m = chan_wait_all(&outbox, 60000);
        uint64_t now = now_ns();
        if (m == NULL) {
            fprintf(stderr, "kvserve bench: no progress in 60 s (%ld of %ld done)\n", n_done,
                    n_prompts);
            goto done;
        }
        while (m != NULL) {
            msg_t *next = m->next;
            if (m->type == ENG_MSG_DELTA) {
                eng_msg_delta_t *d = (eng_msg_delta_t *)m;
                bench_req_t *q = &reqs[d->id];
                if (q->n_out == 0) {
                    q->t_first = now;
                } else {
                    itl[n_itl++] = (double)(now - q->t_last) * 1e-6;
                }
                q->t_last = now;
                q->n_out += d->n_tokens;
            } else if (m->type == ENG_MSG_FINISHED) {
                reqs[((eng_msg_finished_t *)m)->id].finished = 1;
                n_done++;
            } else if (m->type == ENG_MSG_ERROR) {
                eng_msg_error_t *e = (eng_msg_error_t *)m;
                fprintf(stderr, "kvserve bench: request %llu: %s\n", (unsigned long long)e->id,
                        e->message);
                reqs[e->id].error = 1;
                n_err++;
            }
            eng_msg_free(m);
            m = next;
        }
    }
    t_end = now_ns();
    double cpu_s = bench_cpu_s() - cpu0;

    {
        eng_msg_stats_t *sm = xcalloc(1, sizeof(*sm));
        sm->hdr.type = ENG_MSG_STATS;
        chan_send(engine_inbox(eng), &sm->hdr);
        while (!got_stats) {
            msg_t *m = chan_wait_all(&outbox, 10000);
            if (m == NULL) {
                break;
            }
            while (m != NULL) {
                msg_t *next = m->next;
                if (m->type == ENG_MSG_STATS_REPLY) {
                    st = ((eng_msg_stats_t *)m)->stats;
                    got_stats = 1;
                }
                eng_msg_free(m);
                m = next;
            }
        }
    }

    double secs = (double)(t_end - t0) * 1e-9;
    long out_tokens = 0;
    size_t n_ok = 0;
    for (long r = 0; r < n_prompts; r++) {
        if (!reqs[r].finished) {
            continue;
        }
        out_tokens += reqs[r].n_out;
        ttft[n_ok] = (double)(reqs[r].t_first - t0) * 1e-6;
        e2e[n_ok] = (double)(reqs[r].t_last - t0) * 1e-6;
        tpot[n_ok] = reqs[r].n_out > 1 ? (double)(reqs[r].t_last - reqs[r].t_first) * 1e-6 /
                                             (double)(reqs[r].n_out - 1)
                                       : 0.0;
        n_ok++;
    }
    size_t kv_bytes = mdl_kv_block_bytes(mc, cfg.rt.block_size, kv_dtype);
    printf("model                  %s\n", model_path);
    printf("requests               %ld (%ld failed), input %ld, output %ld tokens\n", n_prompts,
           n_err, in_len, out_len);
    printf("engine                 max_num_seqs %ld, max_num_batched_tokens %d, "
           "%d KV blocks x %ld tokens (%.1f MiB, %s), swap %ld\n",
           mns, cfg.max_num_batched_tokens, cfg.rt.num_blocks, bsz,
           (double)kv_bytes * cfg.rt.num_blocks / (1024.0 * 1024.0), mdl_kv_dtype_name(kv_dtype),
           swap);
    printf("kv policy              %s\n", kv_policy);
    if (strcmp(device, "cuda") == 0) {
        printf("cuda graphs            %s\n",
               cuda_graphs ? "decode and verification steps (--no-enforce-eager)"
                           : "off (--enforce-eager)");
    }
    if (temperature > 0.0) {
        printf("sampling               temperature %g, top_p %g, seeded\n", temperature, top_p);
    } else {
        printf("sampling               greedy\n");
    }
    printf("elapsed                %.3f s\n", secs);
    printf("throughput             %.2f requests/s, %.1f output tokens/s, %.1f total tokens/s\n",
           (double)n_ok / secs, (double)out_tokens / secs,
           (double)(out_tokens + (long)n_ok * in_len) / secs);
    /* CPU seconds of the whole process over the run: on a shared machine
     * a steadier measure of the work than the elapsed time. */
    printf("cpu time               %.3f s, %.1f output tokens per cpu-second\n", cpu_s,
           cpu_s > 0 ? (double)out_tokens / cpu_s : 0.0);
    print_dist("TTFT (ms)", ttft, n_ok);
    print_dist("TPOT (ms/token)", tpot, n_ok);
    print_dist("ITL (ms)", itl, n_itl);
    print_dist("E2E latency (ms)", e2e, n_ok);
    if (got_stats) {
        printf("peak KV usage          %u of %u blocks (%.1f%%, %.2f MiB)\n", st.kv_used_peak,
               st.kv_total, st.kv_total > 0 ? 100.0 * st.kv_used_peak / st.kv_total : 0.0,
               (double)kv_bytes * st.kv_used_peak / (1024.0 * 1024.0));
        printf("steps                  %llu (%.1f tokens/step)\n", (unsigned long long)st.steps,
               st.steps > 0 ? (double)(st.prompt_tokens + st.generation_tokens) / st.steps : 0.0);
        double busy = (double)(st.ns_plan + st.ns_forward + st.ns_sample + st.ns_commit);
        if (busy > 0) {
            printf("engine time            plan %.1f%%, forward %.1f%%, sample %.1f%%, "
                   "commit %.1f%% of %.3f s\n",
                   100.0 * (double)st.ns_plan / busy, 100.0 * (double)st.ns_forward / busy,
                   100.0 * (double)st.ns_sample / busy, 100.0 * (double)st.ns_commit / busy,
                   busy * 1e-9);
            printf("sample time            %.1f us per generated token\n",
                   st.generation_tokens > 0 ? (double)st.ns_sample * 1e-3 / st.generation_tokens
                                            : 0.0);
            /* The engine's host work around the forward (issue 15's
             * "< 2% of a step"): planning with its batch building, and the
             * commit, per step and as a share of the whole step. */
            if (st.steps > 0) {
                double n = (double)st.steps;
                printf("host per step          plan %.1f us, commit %.1f us, %.3f%% of a "
                       "%.3f ms step\n",
                       (double)st.ns_plan / n * 1e-3, (double)st.ns_commit / n * 1e-3,
                       100.0 * (double)(st.ns_plan + st.ns_commit) / busy, busy / n * 1e-6);
            }
        }
        printf("preemptions            %llu swap, %llu recompute\n",
               (unsigned long long)st.preempt_swap, (unsigned long long)st.preempt_recompute);
        if (st.spec_k > 0) {
            printf("speculative            k %d, %llu drafts, %llu of %llu draft tokens accepted "
                   "(%.1f%%), %.2f tokens per verification\n",
                   st.spec_k, (unsigned long long)st.spec.drafts,
                   (unsigned long long)st.spec.accepted_tokens,
                   (unsigned long long)st.spec.draft_tokens,
                   st.spec.draft_tokens > 0
                       ? 100.0 * (double)st.spec.accepted_tokens / (double)st.spec.draft_tokens
                       : 0.0,
                   st.spec.drafts > 0 ? 1.0 + (double)st.spec.accepted_tokens /
                                                  (double)st.spec.drafts
                                      : 0.0);
        }
    }
    status = n_err == 0 ? 0 : 1;

done:
    if (eng != NULL) {
        engine_stop(eng);
        engine_destroy(eng);
    }
    for (msg_t *m = chan_take_all(&outbox); m != NULL;) {
        msg_t *next = m->next;
        eng_msg_free(m);
        m = next;
    }
    chan_fini(&outbox);
    gr_vocab_destroy(vocab); /* after the engine: its grammars borrow it */
    free(schema);
    free(reqs);
    free(itl);
    free(ttft);
    free(tpot);
    free(e2e);
    free(text_ids);
    mdl_model_destroy(model);
    return status;
}
