/* cmd_perplexity.c - `kvserve perplexity`: perplexity of a model over a
 * text with a given KV cache dtype and policy, and greedy agreement with
 * an f32 KV cache, to measure what KV compression costs (issue 8).
 *
 * Perplexity uses the strided windows of the Hugging Face recipe: windows
 * of --ctx tokens start every --stride tokens; each scores only the tokens
 * the previous window did not, so every token is scored once with at
 * least ctx - stride tokens of context. Each window starts from an empty
 * cache (its blocks are dropped) and is fed in chunks of --chunk tokens,
 * so the KV cache really holds earlier chunks in the tested dtype:
 * quantized blocks are read by the attention of later chunks exactly as
 * in serving.
 *
 * Greedy agreement (--agree N): N prompts of --prompt-len tokens taken
 * evenly from the text; an f32-KV runtime generates 32 tokens greedily,
 * then the tested runtime is teacher-forced on prompt + continuation and
 * its argmax is compared at each of the 32 positions, and the mean KL
 * divergence of its next-token distributions from the f32 ones reported.
 *
 * With --kv-policy sink=S,window=W the whole text is one stream through
 * attention sinks and a rolling window (model/kv_policy.h): the cache never
 * holds more than S + W + block + chunk tokens, the model never sees a
 * position beyond that, and every token is scored, past the context.
 *
 * Every run is one sequence of scheduler/kv_stream.h: its blocks come from
 * the block manager and its evictions are the scheduler's. --device cuda
 * runs the tested runtime on the CUDA backend (H2O / SnapKV with an f16 or
 * bf16 cache there: model/dev_mass.c); the --agree reference stays on cpu.
 */
#define LOG_MODULE "perplexity"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "model/kv_policy.h"
#include "model/model.h"
#include "scheduler/kv_stream.h"
#include "text/tokenizer.h"
#include "cli/cmds.h"

typedef struct ppl_opts {
    const char *model;
    const char *device; /* the tested runtime's (the --agree reference runs on cpu) */
    const char *file;
    mdl_kv_dtype_t dtype;
    const char *policy;
    mdl_kv_policy_t pol; /* window 0: full attention, strided windows */
    int32_t ctx, stride, chunk, block_size, threads;
    int32_t agree, prompt_len, gen_len;
    int32_t decode_ctx; /* > 0: decode benchmark at this context instead */
    int32_t split;      /* > 0: prompt / decode protocol (perplexity_split) */
    int32_t copy;       /* > 0: the retrieval check over this many passages */
    int64_t budget; /* bytes, for the "blocks at a fixed budget" figure */
} ppl_opts_t;

/* A runtime and one streamed sequence on it (scheduler/kv_stream.h). */
typedef struct ppl_run {
    mdl_runtime_t *rt;
    sched_stream_t *ks;
    int32_t vocab;
} ppl_run_t;

static void
run_destroy(ppl_run_t *r)
{
    sched_stream_destroy(r->ks);
    mdl_runtime_destroy(r->rt);
    memset(r, 0, sizeof(*r));
}

static int
run_create(const mdl_model_t *m, const ppl_opts_t *o, const char *device, mdl_kv_dtype_t dtype,
           const mdl_kv_policy_t *pol, int32_t max_ctx, ppl_run_t *r)
{
    const mdl_config_t *c = mdl_model_config(m);
    int32_t max_blocks = sched_stream_blocks(o->block_size, max_ctx);
    char err[256] = "";
    int rc;

    memset(r, 0, sizeof(*r));
    r->vocab = c->vocab_size;
    mdl_runtime_config_t rc_cfg = {
        .device = device,
        .tp_size = 1,
        .n_threads = o->threads,
        .block_size = o->block_size,
        .num_blocks = max_blocks + 1,
        .swap_blocks = 0,
        .max_num_batched_tokens = o->chunk,
        .max_num_seqs = o->chunk,
        .max_blocks_per_seq = max_blocks,
        .kv_dtype = dtype,
        .kv_mass = pol->kind == MDL_KVP_H2O || pol->kind == MDL_KVP_SNAPKV,
    };
    rc = mdl_runtime_create(m, &rc_cfg, &r->rt, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve perplexity: %s, %s KV cache: %s\n", device,
                mdl_kv_dtype_name(dtype), err);
        return rc;
    }
    rc = sched_stream_create(r->rt, pol, o->block_size, max_ctx, o->chunk, r->vocab, &r->ks);
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve perplexity: stream: %s\n", st_str(rc));
        run_destroy(r);
    }
    return rc;
}

static double
log_prob(const float *logits, int32_t vocab, int32_t tok)
{
    double mx = -INFINITY, sum = 0.0;

    for (int32_t v = 0; v < vocab; v++) {
        mx = logits[v] > mx ? logits[v] : mx;
    }
    for (int32_t v = 0; v < vocab; v++) {
        sum += exp((double)logits[v] - mx);
    }
    return (double)logits[tok] - mx - log(sum);
}

static int32_t
argmax(const float *logits, int32_t vocab)
{
    int32_t best = 0;

    for (int32_t v = 1; v < vocab; v++) {
        if (logits[v] > logits[best]) {
            best = v;
        }
    }
    return best;
}

/* Scoring state for one window: row i predicts toks[i + 1]. */
typedef struct ppl_score {
    const int32_t *toks; /* the window's tokens */
    int32_t first;       /* rows >= first - 1 are scored */
    int32_t vocab;
    double nll;
    int64_t n;
} ppl_score_t;

static void
score_row(void *arg, int64_t i, const float *logits)
{
    ppl_score_t *s = arg;

    if (i + 1 >= s->first) {
        s->nll -= log_prob(logits, s->vocab, s->toks[i + 1]);
        s->n++;
    }
}

typedef struct ppl_argmax {
    int32_t *out; /* argmax of rows [from, from + n) */
    int32_t from, n, vocab;
    float *keep;      /* non-NULL: rows copied here, [n][vocab] */
    const float *ref; /* non-NULL: reference rows [n][vocab] for the KL */
    double kl;        /* sum over rows of KL(softmax(ref) || softmax(row)) */
} ppl_argmax_t;

/* KL(softmax(p) || softmax(q)) in nats, in double. */
static double
kl_div(const float *p, const float *q, int32_t vocab)
{
    double mp = -INFINITY, mq = -INFINITY, zp = 0.0, zq = 0.0, kl = 0.0;

    for (int32_t v = 0; v < vocab; v++) {
        mp = p[v] > mp ? p[v] : mp;
        mq = q[v] > mq ? q[v] : mq;
    }
    for (int32_t v = 0; v < vocab; v++) {
        zp += exp((double)p[v] - mp);
        zq += exp((double)q[v] - mq);
    }
    for (int32_t v = 0; v < vocab; v++) {
        double lp = (double)p[v] - mp - log(zp), lq = (double)q[v] - mq - log(zq);

        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static void
argmax_row(void *arg, int64_t i, const float *logits)
{
    ppl_argmax_t *a = arg;

    if (i >= a->from && i < a->from + a->n) {
        size_t r = (size_t)(i - a->from);

        a->out[r] = argmax(logits, a->vocab);
        if (a->keep != NULL) {
            memcpy(a->keep + r * (size_t)a->vocab, logits, sizeof(float) * (size_t)a->vocab);
        }
        if (a->ref != NULL) {
            a->kl += kl_div(a->ref + r * (size_t)a->vocab, logits, a->vocab);
        }
    }
}

/* Strided-window perplexity over toks[0..n). */
static int
perplexity_windows(ppl_run_t *r, const ppl_opts_t *o, const int32_t *toks, int32_t n, double *nll,
                   int64_t *n_scored)
{
    int32_t prev_end = 0;

    *nll = 0.0;
    *n_scored = 0;
    for (int32_t begin = 0; prev_end < n; begin += o->stride) {
        int32_t end = begin + o->ctx < n ? begin + o->ctx : n;
        /* Targets: indices [max(prev_end, begin + 1), end). Rows stop at the
         * last target's predecessor, so the window feeds end - 1 - begin
         * tokens plus nothing after. */
        int32_t first = prev_end > begin + 1 ? prev_end : begin + 1;
        ppl_score_t sc = {
            .toks = toks + begin, .first = first - begin, .vocab = r->vocab, .nll = 0, .n = 0};
        int rc = sched_stream_reset(r->ks);

        if (rc == ST_OK && end - 1 - begin > 0) {
            rc = sched_stream_feed(r->ks, toks + begin, end - 1 - begin, score_row, &sc);
        }
        if (rc != ST_OK) {
            return rc;
        }
        *nll += sc.nll;
        *n_scored += sc.n;
        prev_end = end;
        if (end == n) {
            break;
        }
    }
    return ST_OK;
}

/* The whole text as one stream under the policy; every token scored. */
static int
perplexity_stream(ppl_run_t *r, const int32_t *toks, int32_t n, double *nll, int64_t *n_scored)
{
    ppl_score_t sc = {.toks = toks, .first = 1, .vocab = r->vocab, .nll = 0, .n = 0};
    int rc = sched_stream_reset(r->ks);

    if (rc == ST_OK) {
        rc = sched_stream_feed(r->ks, toks, n - 1, score_row, &sc);
    }
    *nll = sc.nll;
    *n_scored = sc.n;
    return rc;
}

static double now_s(clockid_t clk);

/* What perplexity_split measured besides the NLL. */
typedef struct ppl_split {
    int32_t kv_max;      /* most tokens any decode step attended to */
    double kv_mean;      /* mean over decode steps */
    double decode_s;     /* wall seconds of the decode steps */
    int64_t n_decode;    /* decode steps */
} ppl_split_t;

/* The prompt / decode protocol of the H2O and SnapKV figures: the text in
 * windows of ctx tokens (no overlap); each window's first `split` tokens
 * are a prompt, prefilled in one call (SnapKV compresses after it), then
 * the rest is teacher-forced one token per step (H2O evicts as it goes),
 * and only the tokens after the prompt are scored: every policy and the
 * baseline score the same tokens from the same cache history. */
static int
perplexity_split(ppl_run_t *r, const ppl_opts_t *o, const int32_t *toks, int32_t n, double *nll,
                 int64_t *n_scored, ppl_split_t *sp)
{
    double kv_sum = 0.0;

    *nll = 0.0;
    *n_scored = 0;
    memset(sp, 0, sizeof(*sp));
    for (int32_t begin = 0; begin + o->ctx <= n; begin += o->ctx) {
        const int32_t *w = toks + begin;
        ppl_score_t sc = {.toks = w, .first = o->split, .vocab = r->vocab, .nll = 0, .n = 0};
        int rc = sched_stream_reset(r->ks);
        double t0;

        if (rc == ST_OK) {
            sched_stream_set_prompt(r->ks, o->split);
            rc = sched_stream_feed_last(r->ks, w, o->split, score_row, &sc);
        }
        t0 = now_s(CLOCK_MONOTONIC);
        for (int32_t i = o->split; rc == ST_OK && i < o->ctx - 1; i++) {
            int32_t kv = sched_stream_kv_len(r->ks) + 1;

            sp->kv_max = kv > sp->kv_max ? kv : sp->kv_max;
            kv_sum += kv;
            sp->n_decode++;
            rc = sched_stream_feed(r->ks, w + i, 1, score_row, &sc);
        }
        sp->decode_s += now_s(CLOCK_MONOTONIC) - t0;
        if (rc != ST_OK) {
            return rc;
        }
        *nll += sc.nll;
        *n_scored += sc.n;
    }
    sp->kv_mean = sp->n_decode > 0 ? kv_sum / (double)sp->n_decode : 0.0;
    return ST_OK;
}

/* The retrieval check: a passage of 48 tokens, 144 tokens of other text,
 * then the passage's first 8 tokens again as the end of the prompt (200
 * tokens); greedy decoding should copy the passage's next 40 tokens.
 * Copy accuracy: generated tokens equal to the passage's, position by
 * position, over o->copy passages taken evenly from the text. */
#define COPY_PASSAGE 48
#define COPY_FILLER 144
#define COPY_CUE 8
static int
copy_check(ppl_run_t *r, const ppl_opts_t *o, const int32_t *toks, int32_t n, int64_t *match,
           int64_t *total)
{
    const int32_t plen = COPY_PASSAGE + COPY_FILLER + COPY_CUE, gen = COPY_PASSAGE - COPY_CUE;
    int32_t prompt[COPY_PASSAGE + COPY_FILLER + COPY_CUE], next = 0;
    int rc = ST_OK;

    *match = *total = 0;
    for (int32_t k = 0; k < o->copy && rc == ST_OK; k++) {
        int32_t a = 1 + (int32_t)((int64_t)k * (n - 2 * (COPY_PASSAGE + COPY_FILLER)) / o->copy);
        int32_t b = (a + COPY_PASSAGE + COPY_FILLER) % (n - COPY_FILLER);
        ppl_argmax_t am = {.out = &next, .from = plen - 1, .n = 1, .vocab = r->vocab};

        prompt[0] = toks[0]; /* BOS */
        memcpy(prompt + 1, toks + a, sizeof(int32_t) * (COPY_PASSAGE - 1));
        memcpy(prompt + COPY_PASSAGE, toks + b, sizeof(int32_t) * COPY_FILLER);
        memcpy(prompt + COPY_PASSAGE + COPY_FILLER, prompt + 1, sizeof(int32_t) * COPY_CUE);
        rc = sched_stream_reset(r->ks);
        if (rc == ST_OK) {
            sched_stream_set_prompt(r->ks, plen);
            rc = sched_stream_feed_last(r->ks, prompt, plen, argmax_row, &am);
        }
        for (int32_t g = 0; rc == ST_OK && g < gen; g++) {
            int32_t tok = next;
            ppl_argmax_t one = {.out = &next, .from = plen + g, .n = 1, .vocab = r->vocab};

            *match += tok == prompt[1 + COPY_CUE + g];
            (*total)++;
            rc = sched_stream_feed(r->ks, &tok, 1, argmax_row, &one);
        }
    }
    return rc;
}

static double
now_s(clockid_t clk)
{
    struct timespec ts;

    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decode speed at a long context: the text (repeated as needed) fills
 * ctx tokens of one sequence, then gen tokens are decoded one per step
 * (greedy); only the decode steps are timed, in wall and process CPU
 * seconds (the host may be shared). */
static int
decode_bench(ppl_run_t *r, const ppl_opts_t *o, const int32_t *toks, int32_t n)
{
    int32_t ctx = o->decode_ctx, *buf = xmalloc(sizeof(int32_t) * (size_t)ctx), next = 0;
    ppl_argmax_t am = {.out = &next, .from = ctx - 1, .n = 1, .vocab = r->vocab};
    double w0, c0, w1, c1;
    int rc;

    for (int32_t i = 0; i < ctx; i++) {
        buf[i] = toks[i % n];
    }
    rc = sched_stream_reset(r->ks);
    if (rc == ST_OK) {
        rc = sched_stream_feed(r->ks, buf, ctx, argmax_row, &am);
    }
    w0 = now_s(CLOCK_MONOTONIC);
    c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int32_t g = 0; rc == ST_OK && g < o->gen_len; g++) {
        ppl_argmax_t one = {.out = &next, .from = ctx + g, .n = 1, .vocab = r->vocab};
        int32_t tok = next;

        rc = sched_stream_feed(r->ks, &tok, 1, argmax_row, &one);
    }
    w1 = now_s(CLOCK_MONOTONIC);
    c1 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    free(buf);
    if (rc == ST_OK) {
        printf("decode at context %d: %d tokens, %.2f tok/s wall (%.2f ms/token), %.2f ms CPU "
               "per token\n",
               ctx, o->gen_len, o->gen_len / (w1 - w0), 1e3 * (w1 - w0) / o->gen_len,
               1e3 * (c1 - c0) / o->gen_len);
    }
    return rc;
}

/* Greedy agreement of run t with reference run f over o->agree prompts. */
static int
greedy_agreement(ppl_run_t *f, ppl_run_t *t, const ppl_opts_t *o, const int32_t *toks, int32_t n,
                 int64_t *match, int64_t *total, double *kl)
{
    int32_t P = o->prompt_len, G = o->gen_len;
    int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(P + G));
    int32_t *pred = xmalloc(sizeof(int32_t) * (size_t)G);
    float *ref = xmalloc(sizeof(float) * (size_t)G * (size_t)f->vocab);
    int rc = ST_OK;

    *match = 0;
    *total = 0;
    *kl = 0.0;
    for (int32_t k = 0; k < o->agree && rc == ST_OK; k++) {
        int32_t start = (int32_t)((int64_t)k * (n - P - 1) / (o->agree > 1 ? o->agree : 1));
        ppl_argmax_t am = {.out = seq + P, .from = P - 1, .n = 1, .vocab = f->vocab, .keep = ref};

        memcpy(seq, toks + start, sizeof(int32_t) * (size_t)P);
        rc = sched_stream_reset(f->ks);
        /* Reference: prompt, then one token at a time (greedy, f32 KV). */
        for (int32_t g = 0; rc == ST_OK && g < G; g++) {
            if (g == 0) {
                rc = sched_stream_feed(f->ks, seq, P, argmax_row, &am);
            } else {
                ppl_argmax_t one = {.out = seq + P + g,
                                    .from = P + g - 1,
                                    .n = 1,
                                    .vocab = f->vocab,
                                    .keep = ref + (size_t)g * f->vocab};

                rc = sched_stream_feed(f->ks, seq + P + g - 1, 1, argmax_row, &one);
            }
        }
        if (rc != ST_OK) {
            break;
        }
        /* Tested cache: teacher-forced on prompt + continuation. */
        ppl_argmax_t tf = {.out = pred, .from = P - 1, .n = G, .vocab = t->vocab, .ref = ref};

        rc = sched_stream_reset(t->ks);
        if (rc == ST_OK) {
            rc = sched_stream_feed(t->ks, seq, P + G - 1, argmax_row, &tf);
        }
        for (int32_t g = 0; rc == ST_OK && g < G; g++) {
            *match += pred[g] == seq[P + g];
            (*total)++;
        }
        *kl += tf.kl;
    }
    free(seq);
    free(pred);
    free(ref);
    return rc;
}

static char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            buf = xrealloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, 4096, f);

        n += got;
        if (got < 4096) {
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: kvserve perplexity --model PATH --file TEXT [OPTIONS]\n\n"
            "  --model PATH          Hugging Face directory or .gguf file\n"
            "                        (default models/austen-2.7m)\n"
            "  --file TEXT           the text to score (UTF-8)\n"
            "  --device D            cpu (default) or cuda: the tested runtime (--agree's\n"
            "                        f32 reference stays on cpu)\n"
            "  --kv-cache-dtype X    auto f32 f16 bf16 fp8_e4m3 int8 int4 tq3 tq4\n"
            "                        (default auto: f32 on cpu, bf16 on cuda; h2o and\n"
            "                        snapkv need f32 on cpu, f16 / bf16 on cuda)\n"
            "  --kv-policy P         full (default) or sink=S,window=W in tokens, whole\n"
            "                        blocks: stream the whole text through attention sinks\n"
            "                        and a rolling window instead of strided windows;\n"
            "                        h2o=B,recent=W or snapkv=B,window=W,pool=K: the\n"
            "                        --split protocol under heavy-hitter eviction / SnapKV\n"
            "  --copy N              instead: the retrieval check over N passages (a\n"
            "                        48-token passage, 144 other tokens, its first 8\n"
            "                        again; greedy copy accuracy of the next 40)\n"
            "  --split P             windows of --ctx tokens without overlap: prefill the\n"
            "                        first P as a prompt, decode the rest one token per\n"
            "                        step and score those (default 3/4 ctx with h2o or\n"
            "                        snapkv, else off)\n"
            "  --ctx N               window length (default: the model's context)\n"
            "  --stride N            window start step (default ctx / 2)\n"
            "  --chunk N             tokens per forward step (default 64)\n"
            "  --block-size N        tokens per KV block (default 16)\n"
            "  --threads N           CPU threads (default: one per physical core)\n"
            "  --agree N             also: greedy agreement with an f32 KV cache over N\n"
            "                        prompts (default 0: off)\n"
            "  --prompt-len N        agreement prompt tokens (default 64)\n"
            "  --gen-len N           agreement continuation tokens (default 32)\n"
            "  --decode-bench CTX    instead: time --gen-len decode steps of one sequence\n"
            "                        after a CTX-token prefill of the text (repeated)\n"
            "  --budget-mib N        KV memory for the blocks-at-budget figure (default 64)\n"
            "  --help                this text\n");
}

static int
parse_i32(const char *s, int32_t lo, int32_t *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > INT32_MAX) {
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int
cmd_perplexity(int argc, char **argv)
{
    ppl_opts_t o = {
        .model = "models/austen-2.7m",
        .device = "cpu",
        .dtype = MDL_KV_AUTO,
        .policy = "full",
        .chunk = 64,
        .block_size = 16,
        .prompt_len = 64,
        .gen_len = 32,
        .budget = 64LL << 20,
    };
    mdl_model_t *m = NULL;
    char err[512] = "";
    char *text = NULL;
    int32_t *toks = NULL;
    size_t n_toks = 0, len = 0;
    ppl_run_t run = {0}, ref = {0};
    int status = 1, rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t mib = 0;
        int bad = 0;

        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            fprintf(stderr, "kvserve perplexity: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--model") == 0) {
            o.model = v;
        } else if (strcmp(a, "--file") == 0) {
            o.file = v;
        } else if (strcmp(a, "--device") == 0) {
            o.device = v;
            bad = strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0;
        } else if (strcmp(a, "--kv-cache-dtype") == 0) {
            bad = mdl_kv_dtype_parse(v, &o.dtype) != ST_OK;
        } else if (strcmp(a, "--kv-policy") == 0) {
            o.policy = v;
        } else if (strcmp(a, "--ctx") == 0) {
            bad = parse_i32(v, 2, &o.ctx);
        } else if (strcmp(a, "--stride") == 0) {
            bad = parse_i32(v, 1, &o.stride);
        } else if (strcmp(a, "--chunk") == 0) {
            bad = parse_i32(v, 1, &o.chunk);
        } else if (strcmp(a, "--block-size") == 0) {
            bad = parse_i32(v, 1, &o.block_size);
        } else if (strcmp(a, "--threads") == 0) {
            bad = parse_i32(v, 0, &o.threads);
        } else if (strcmp(a, "--agree") == 0) {
            bad = parse_i32(v, 0, &o.agree);
        } else if (strcmp(a, "--prompt-len") == 0) {
            bad = parse_i32(v, 1, &o.prompt_len);
        } else if (strcmp(a, "--gen-len") == 0) {
            bad = parse_i32(v, 1, &o.gen_len);
        } else if (strcmp(a, "--copy") == 0) {
            bad = parse_i32(v, 1, &o.copy);
        } else if (strcmp(a, "--split") == 0) {
            bad = parse_i32(v, 1, &o.split);
        } else if (strcmp(a, "--decode-bench") == 0) {
            bad = parse_i32(v, 1, &o.decode_ctx);
        } else if (strcmp(a, "--budget-mib") == 0) {
            bad = parse_i32(v, 1, &mib);
            o.budget = (int64_t)mib << 20;
        } else {
            fprintf(stderr, "kvserve perplexity: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvserve perplexity: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (o.file == NULL) {
        fprintf(stderr, "kvserve perplexity: --file is required\n");
        usage(stderr);
        return 2;
    }
    if (mdl_kv_policy_parse(o.policy, o.block_size, &o.pol, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "kvserve perplexity: --kv-policy: %s\n", err);
        return 2;
    }
    rc = mdl_model_load(o.model, &m, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve perplexity: %s\n", err);
        return 1;
    }
    const mdl_config_t *c = mdl_model_config(m);

    if (o.dtype == MDL_KV_AUTO && strcmp(o.device, "cuda") == 0) {
        o.dtype = MDL_KV_BF16; /* what the runtime picks there (model/runtime.c) */
    }
    if (o.ctx <= 0 || o.ctx > c->max_pos) {
        o.ctx = c->max_pos;
    }
    int scored = o.pol.kind == MDL_KVP_H2O || o.pol.kind == MDL_KVP_SNAPKV;
    if (scored && o.split <= 0) {
        o.split = o.ctx * 3 / 4;
    }
    if (o.split > 0 && (o.split >= o.ctx - 1 || o.pol.window > 0 || o.agree > 0)) {
        fprintf(stderr, "kvserve perplexity: --split %d needs %d < --ctx - 1, and no "
                        "sink=S,window=W policy or --agree\n", o.split, o.split);
        goto out;
    }
    if (o.stride <= 0 || o.stride > o.ctx) {
        o.stride = o.ctx / 2 > 0 ? o.ctx / 2 : 1;
    }
    int32_t stream_ctx = o.pol.sink + o.pol.window + o.block_size + o.chunk;

    if (o.pol.window > 0 && stream_ctx > c->max_pos) {
        fprintf(stderr,
                "kvserve perplexity: sink %d + window %d + block %d + chunk %d exceed the "
                "model's context of %d\n",
                o.pol.sink, o.pol.window, o.block_size, o.chunk, c->max_pos);
        goto out;
    }
    if (o.agree > 0 && o.prompt_len + o.gen_len > o.ctx) {
        fprintf(stderr, "kvserve perplexity: --prompt-len + --gen-len exceed --ctx %d\n", o.ctx);
        goto out;
    }
    text = slurp(o.file, &len);
    if (text == NULL) {
        fprintf(stderr, "kvserve perplexity: cannot read %s: %s\n", o.file, strerror(errno));
        goto out;
    }
    rc = tok_encode(mdl_model_tokenizer(m), text, len, TOK_ADD_SPECIAL, &toks, &n_toks);
    if (rc != ST_OK || n_toks < 2 || n_toks > INT32_MAX / 2) {
        fprintf(stderr, "kvserve perplexity: cannot tokenize %s (%zu tokens)\n", o.file, n_toks);
        goto out;
    }
    if (o.agree > 0 && (int32_t)n_toks < o.prompt_len + o.gen_len + 1) {
        fprintf(stderr, "kvserve perplexity: the text is too short for --agree\n");
        goto out;
    }

    size_t blk = mdl_kv_block_bytes(c, o.block_size, o.dtype);
    size_t blk16 = mdl_kv_block_bytes(c, o.block_size, MDL_KV_F16);
    size_t blk32 = mdl_kv_block_bytes(c, o.block_size, MDL_KV_F32);

    if (blk == 0) {
        char why[256] = "";
        mdl_runtime_t *probe = NULL;
        mdl_runtime_config_t pc = {
            .block_size = o.block_size, .num_blocks = 2, .kv_dtype = o.dtype};

        (void)mdl_runtime_create(m, &pc, &probe, why, sizeof(why));
        mdl_runtime_destroy(probe);
        fprintf(stderr, "kvserve perplexity: --kv-cache-dtype %s: %s\n",
                mdl_kv_dtype_name(o.dtype), why);
        goto out;
    }
    if (o.decode_ctx > 0) {
        mdl_kv_policy_t full = {0};

        if (o.decode_ctx + o.gen_len > c->max_pos) {
            fprintf(stderr, "kvserve perplexity: --decode-bench %d + --gen-len %d exceed the "
                            "model's context of %d\n", o.decode_ctx, o.gen_len, c->max_pos);
            goto out;
        }
        if (run_create(m, &o, o.device, o.dtype, &full, o.decode_ctx + o.gen_len, &run) != ST_OK) {
            goto out;
        }
        printf("KV cache %s, block %d: %.1f bytes/token (f32 %.1f)\n", mdl_kv_dtype_name(o.dtype),
               o.block_size, (double)blk / o.block_size, (double)blk32 / o.block_size);
        status = decode_bench(&run, &o, toks, (int32_t)n_toks) == ST_OK ? 0 : 1;
        goto out;
    }
    if (run_create(m, &o, o.device, o.dtype, &o.pol, o.pol.window > 0 ? stream_ctx : o.ctx,
                   &run) != ST_OK) {
        goto out;
    }
    printf("model %s: %d layers, %d KV heads x %d, context %d\n", o.model, c->n_layers,
           c->n_kv_heads, c->head_dim, c->max_pos);
    printf("KV cache %s, block %d: %.1f bytes/token (f32 %.1f, f16 %.1f: %.2fx smaller than f16); "
           "%lld blocks in %lld MiB (f32: %lld); residual slots %.1f KiB\n",
           mdl_kv_dtype_name(o.dtype), o.block_size, (double)blk / o.block_size,
           (double)blk32 / o.block_size, (double)blk16 / o.block_size, (double)blk16 / (double)blk,
           (long long)(o.budget / (int64_t)blk), (long long)(o.budget >> 20),
           (long long)(o.budget / (int64_t)blk32),
           (double)mdl_kv_residual_bytes(c, o.block_size, o.dtype, o.chunk, o.chunk) / 1024.0);

    double nll = 0.0;
    int64_t n_scored = 0;
    int32_t max_kv = 0;
    ppl_split_t sp = {0};

    if (o.copy > 0) {
        int64_t match = 0, total = 0;

        if (o.ctx < COPY_PASSAGE * 2 + COPY_FILLER || (int32_t)n_toks < 4 * (COPY_PASSAGE +
                                                                            COPY_FILLER)) {
            fprintf(stderr, "kvserve perplexity: --copy needs --ctx >= %d and a longer text\n",
                    COPY_PASSAGE * 2 + COPY_FILLER);
            goto out;
        }
        rc = copy_check(&run, &o, toks, (int32_t)n_toks, &match, &total);
        if (rc != ST_OK) {
            fprintf(stderr, "kvserve perplexity: forward failed: %s\n", st_str(rc));
            goto out;
        }
        printf("retrieval, policy %s: copy accuracy %.1f%% (%lld of %lld tokens, %d passages); "
               "%lld tokens evicted\n",
               o.policy, 100.0 * (double)match / (double)total, (long long)match,
               (long long)total, o.copy, (long long)sched_stream_compacted(run.ks));
        status = 0;
        goto out;
    }

    if (o.split > 0) {
        rc = perplexity_split(&run, &o, toks, (int32_t)n_toks, &nll, &n_scored, &sp);
    } else if (o.pol.window > 0) {
        rc = perplexity_stream(&run, toks, (int32_t)n_toks, &nll, &n_scored);
        max_kv = sched_stream_kv_peak(run.ks);
    } else {
        rc = perplexity_windows(&run, &o, toks, (int32_t)n_toks, &nll, &n_scored);
    }
    if (rc != ST_OK || n_scored == 0) {
        fprintf(stderr, "kvserve perplexity: forward failed: %s\n", st_str(rc));
        goto out;
    }
    printf("text %s: %zu tokens, %lld scored, ", o.file, n_toks, (long long)n_scored);
    if (o.split > 0) {
        printf("windows of %d, prompt %d, policy %s: decode attended to at most %d tokens "
               "(%d blocks of %d), %.1f on average; %lld tokens evicted; decode %.1f tok/s "
               "(1 stream, %lld steps)\n",
               o.ctx, o.split, o.policy, sp.kv_max, (sp.kv_max + o.block_size - 1) / o.block_size,
               o.block_size, sp.kv_mean, (long long)sched_stream_compacted(run.ks),
               sp.decode_s > 0 ? (double)sp.n_decode / sp.decode_s : 0.0,
               (long long)sp.n_decode);
    } else if (o.pol.window > 0) {
        printf("policy sink=%d,window=%d: KV held at most %d tokens, %lld blocks evicted\n",
               o.pol.sink, o.pol.window, max_kv, (long long)sched_stream_evicted(run.ks));
    } else {
        printf("ctx %d, stride %d\n", o.ctx, o.stride);
    }
    printf("perplexity %.4f (mean NLL %.5f nats)\n", exp(nll / (double)n_scored),
           nll / (double)n_scored);
    if (o.agree > 0) {
        int64_t match = 0, total = 0;
        double kl = 0.0;

        mdl_kv_policy_t full = {0};

        if (o.pol.window > 0) {
            fprintf(stderr, "kvserve perplexity: --agree runs without a --kv-policy\n");
            goto out;
        }
        if (run_create(m, &o, "cpu", MDL_KV_F32, &full, o.ctx, &ref) != ST_OK) {
            goto out;
        }
        rc = greedy_agreement(&ref, &run, &o, toks, (int32_t)n_toks, &match, &total, &kl);
        if (rc != ST_OK) {
            fprintf(stderr, "kvserve perplexity: forward failed: %s\n", st_str(rc));
            goto out;
        }
        printf("greedy agreement with f32 KV: %.2f%% (%lld of %lld tokens, %d prompts x %d); "
               "mean KL(f32 || %s) %.3g nats/token\n",
               100.0 * (double)match / (double)total, (long long)match, (long long)total, o.agree,
               o.gen_len, mdl_kv_dtype_name(o.dtype), kl / (double)total);
    }
    status = 0;
out:
    run_destroy(&run);
    run_destroy(&ref);
    free(toks);
    free(text);
    mdl_model_destroy(m);
    return status;
}
