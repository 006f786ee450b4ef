/* cmd_bench_forward.c - `kvserve bench-forward`: forward-pass throughput
 * on the CPU runtime. A benchmark, not a test: it prints figures.
 *
 * For each batch size of --batch (default 1, 8 and 32) it times
 *   prefill: every sequence's P-token prompt in one step (B * P tokens),
 *   decode:  D steps of one new token per sequence,
 * each the best of BF_REPS runs (a shared host disturbs some of them),
 * and relates decode to the memory roofline: a decode step must read every
 * weight once plus each sequence's K and V so far, so its time is at least
 * bytes / bandwidth, with bandwidth measured here as the read rate of a
 * 256 MiB buffer summed by every kernel thread (decode only reads
 * weights). Batched decode is bound by compute instead, so it is also
 * given as multiply-add operations per second (every matrix, lm_head
 * included, plus attention over the context) against the peak rate of the
 * instruction the model's bulk type runs on (kernels/cpu/kn_peak.h:
 * f32 FMA, bf16 dp or int8 dp), measured here on every kernel thread at
 * once. Decode is also given per CPU-second of the process, a figure
 * a busy host disturbs less than wall-clock time. The weights stay in
 * their file's type (--dtype converts at load, as serve does); the peak
 * RSS of the process is printed at the end.
 *
 * --matmul-precision high,medium (either, or both: then each batch size
 * runs high and medium back to back, interleaved A/B on a shared host,
 * and prints medium's decode rate over high's) picks how BF16 weights
 * multiply their activations (model/model.h mdl_matmul_prec_t).
 *
 * --kv-cache-dtype picks the KV format (the compressed ones read fewer KV
 * bytes per decode step; the roofline counts the format's bytes per token,
 * scales included). Decode rounds after the first rewrite positions
 * P .. P + D - 1, so with a compressed format they re-take residual slots
 * for blocks the previous round quantized, as a flushed slot would.
 */
#define LOG_MODULE "bench"

#include <getopt.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "blockmgr/blockmgr.h"
#include "common/util.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_peak.h"
#include "kvserve_config.h"
#include "model/model.h"
#include "cli/cmds.h"

#define BF_BLOCK 16
#define BF_REPS 3
#define BF_DEFAULT_MODEL "models/austen-2.7m"

static void
bf_usage(FILE *f)
{
    fprintf(f, "usage: kvserve bench-forward [--model PATH] [--prompt-len P] [--decode D]\n"
               "                             [--batch B[,B...]] [--threads N] [--kv-cache-dtype X]\n"
               "                             [--dtype T] [--matmul-precision P[,P]]\n"
               "\n"
               "  --model PATH     Hugging Face directory or .gguf (default " BF_DEFAULT_MODEL ")\n"
               "  --prompt-len P   prompt tokens per sequence (default 128)\n"
               "  --decode D       decode steps (default 64)\n"
               "  --batch B[,B...] batch sizes (default 1,8,32)\n"
               "  --threads N      CPU threads (default: one per physical core)\n"
               "  --kv-cache-dtype X  f32 f16 bf16 fp8_e4m3 int8 int4 tq3 tq4 (default f32)\n"
               "  --dtype T        weights: auto (the file's type), f32, bf16, f16 (default auto)\n"
               "  --matmul-precision P[,P]  BF16 weights: high (default) or medium (activations\n"
               "                   rounded to one bf16 term); high,medium runs both per batch\n"
               "                   size, interleaved, with their ratio; other types ignore it\n"
               "  --help           this text\n");
}

/* Read bandwidth in bytes/s: best of a few sums of a 1 GiB buffer (past
 * any last-level cache) split over the kernel threads. */
static double
bf_read_bandwidth_here(void)
{
    size_t len = (size_t)1 << 30, n = len / sizeof(uint64_t);
    uint64_t *a = malloc(len);
    double best = 0.0;
    int nt = kn_cpu_threads();
    volatile uint64_t sink = 0;

    if (a == NULL) {
        return 0.0;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = i;
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        uint64_t total = 0;

#pragma omp parallel num_threads(nt) reduction(+ : total)
        {
            int id = omp_get_thread_num(), k = omp_get_num_threads();
            size_t per = n / (size_t)k;
            const uint64_t *p = a + (size_t)id * per;
            uint64_t acc[8] = {0};

            for (size_t i = 0; i + 8 <= per; i += 8) {
                for (int j = 0; j < 8; j++) {
                    acc[j] += p[i + j];
                }
            }
            for (int j = 0; j < 8; j++) {
                total += acc[j];
            }
        }
        double dt = now_s() - t0;

        sink += total;
        if ((double)len / dt > best) {
            best = (double)len / dt;
        }
    }
    (void)sink;
    free(a);
    return best;
}

/* What the child measures: the read bandwidth and the compute peak of
 * each kn_peak op, summed over the kernel threads running at once. */
typedef struct bf_machine {
    double bw;                   /* bytes/s */
    double peak[KN_PEAK_NOPS]; /* operations/s, 0: no such instruction */
} bf_machine_t;

/* bf_read_bandwidth_here() and the compute peaks (kernels/cpu/kn_peak.h)
 * in a child process, so that the buffer does not count in this process's
 * peak RSS and no OpenMP team outlives it. */
static void
bf_measure_machine(int threads, bf_machine_t *mm)
{
    int fd[2];
    pid_t pid;

    memset(mm, 0, sizeof(*mm));
    if (pipe(fd) != 0) {
        return;
    }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        bf_machine_t r = {0};
        int nt;

        kn_cpu_init(threads);
        nt = kn_cpu_threads();
        r.bw = bf_read_bandwidth_here();
        for (int op = 0; op < KN_PEAK_NOPS; op++) {
            double sum = 0.0;

#pragma omp parallel num_threads(nt) reduction(+ : sum)
            sum += kn_peak_ops((kn_peak_op_t)op, kn_cpu_isa(), 0.2);
            r.peak[op] = sum;
        }
        _exit(write(fd[1], &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1);
    }
    close(fd[1]);
    if (pid < 0 || read(fd[0], mm, sizeof(*mm)) != (ssize_t)sizeof(*mm)) {
        memset(mm, 0, sizeof(*mm));
    }
    close(fd[0]);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
    }
}

/* The kn_peak op the kernels use for the type holding most of m's
 * matrix bytes: int8 products for the q formats, vdpbf16ps for bf16
 * where the CPU has it (the default two-term split does two per product,
 * so its ceiling is half that peak), f32 FMAs otherwise. */
static kn_peak_op_t
bf_bulk_op(const mdl_model_t *m, const bf_machine_t *mm)
{
    kn_wtype_t t = mdl_model_bulk_wtype(m);

    if (t == KN_W_F32 || t == KN_W_F16) {
        return KN_PEAK_F32_FMA;
    }
    if (t == KN_W_BF16) {
        return mm->peak[KN_PEAK_BF16_DP] > 0.0 ? KN_PEAK_BF16_DP : KN_PEAK_F32_FMA;
    }
    return KN_PEAK_INT8_DP;
}

/* Multiply-add operations (2 per product) of one decode token at context
 * length ctx: every matrix (lm_head included) once, and attention's
 * q.k and p.v over ctx positions in every layer. */
static double
bf_token_ops(const mdl_config_t *c, double ctx)
{
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double layer = (double)c->dim * (2.0 * qd + 2.0 * kvd) + 3.0 * (double)c->dim * c->ffn_dim;

    return 2.0 * (layer * c->n_layers + (double)c->vocab_size * c->dim) +
           4.0 * qd * ctx * c->n_layers;
}

/* Peak resident set of the process, bytes. */
static double
bf_peak_rss(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

/* CPU time of the whole process: on a busy host, wall-clock figures
 * include time spent waiting for a core; this one does not. */
static double
bf_cpu_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bf_run {
    double prefill_tps;
    double decode_tps;
    double roofline_frac;
    double decode_cpu_tps; /* tokens per CPU-second of the process (all threads) */
    double decode_ops;     /* multiply-add operations per second of the best decode round */
} bf_run_t;

static int
bf_run(const mdl_model_t *m, int32_t batch, int32_t plen, int32_t dec, int threads,
       mdl_kv_dtype_t kvdt, mdl_matmul_prec_t prec, double bw, bf_run_t *r, char *err,
       size_t errlen)
{
    const mdl_config_t *c = mdl_model_config(m);
    int32_t total = plen + dec, mb = (total + BF_BLOCK - 1) / BF_BLOCK;
    int32_t T = batch * plen;
    mdl_runtime_config_t rc = {
        .n_threads = threads,
        .block_size = BF_BLOCK,
        .num_blocks = batch * mb + 1,
        .max_num_batched_tokens = T,
        .max_num_seqs = batch,
        .max_blocks_per_seq = mb,
        .kv_dtype = kvdt,
        .matmul_precision = prec,
    };
    mdl_runtime_t *rt = NULL;
    int32_t *tok = calloc((size_t)T, sizeof(int32_t)), *pos = calloc((size_t)T, sizeof(int32_t));
    int32_t *slot = calloc((size_t)T, sizeof(int32_t)), *qs = calloc((size_t)batch + 1, 4);
    int32_t *ctx = calloc((size_t)batch, 4), *bt = calloc((size_t)batch * mb, 4);
    int32_t *rows = calloc((size_t)batch, 4);
    int32_t *all_tok = calloc((size_t)batch * total, 4), *all_slot = calloc((size_t)batch * total, 4);
    bm_pool_t *pool = NULL;
    bm_config_t bc = {.block_size = BF_BLOCK, .num_blocks = (uint32_t)(batch * mb + 1)};
    const float *lg;
    double t0, kv_bytes = 0.0, ops = 0.0;
    int st;

    st = mdl_runtime_create(m, &rc, &rt, err, errlen);
    if (st != ST_OK) {
        goto out;
    }
    /* Every sequence's prompt and decode tokens, and their KV slots from the
     * block manager (the one owner of block ids), reserved up front. */
    uint32_t x = 12345;

    for (int32_t s = 0; s < batch; s++) {
        for (int32_t i = 0; i < total; i++) {
            x = x * 1103515245u + 12345u;
            all_tok[s * total + i] =
                i < plen ? (int32_t)((x >> 8) % (uint32_t)c->vocab_size)
                         : (int32_t)((uint32_t)(s * 31 + (i - plen) * 7) % (uint32_t)c->vocab_size);
        }
    }
    st = bm_pool_create(&bc, &pool);
    for (int32_t s = 0; s < batch && st == ST_OK; s++) {
        uint32_t nb = 0;
        const int32_t *tbl;

        st = bm_seq_create(pool, (uint64_t)s, 0);
        if (st == ST_OK) {
            st = bm_seq_reserve(pool, (uint64_t)s, all_tok + s * total, (uint32_t)total,
                                all_slot + s * total);
        }
        if (st == ST_OK) {
            tbl = bm_seq_table(pool, (uint64_t)s, &nb);
            memcpy(bt + (size_t)s * mb, tbl, sizeof(int32_t) * nb);
        }
    }
    if (st != ST_OK) {
        snprintf(err, errlen, "block manager: %s", st_str(st));
        goto out;
    }
    /* Prefill: all prompts in one step. */
    for (int32_t s = 0; s < batch; s++) {
        for (int32_t i = 0; i < plen; i++) {
            int32_t t = s * plen + i;

            tok[t] = all_tok[s * total + i];
            pos[t] = i;
            slot[t] = all_slot[s * total + i];
        }
        qs[s + 1] = (s + 1) * plen;
        ctx[s] = plen;
        rows[s] = (s + 1) * plen - 1;
    }
    mdl_batch_t b = {
        .n_tokens = T,
        .tokens = tok,
        .positions = pos,
        .slot_mapping = slot,
        .n_seqs = batch,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = mb,
        .logits_rows = rows,
        .n_logits = batch,
    };
    st = mdl_forward(rt, &b, &lg); /* warm-up: page in weights and KV */
    if (st != ST_OK) {
        goto out;
    }
    /* Best of BF_REPS: the figure of an undisturbed run on a shared host. */
    for (int rep = 0; rep < BF_REPS && st == ST_OK; rep++) {
        t0 = now_s();
        st = mdl_forward(rt, &b, &lg);
        double tps = (double)T / (now_s() - t0);

        r->prefill_tps = tps > r->prefill_tps ? tps : r->prefill_tps;
    }

    /* Decode: one token per sequence per step. */
    b.n_tokens = batch;
    for (int32_t s = 0; s < batch; s++) {
        qs[s + 1] = s + 1;
        rows[s] = s;
    }
    double kv_per_tok = (double)mdl_kv_block_bytes(c, BF_BLOCK, kvdt) / BF_BLOCK;

    for (int32_t k = 0; k < dec; k++) {
        kv_bytes += (double)batch * (double)(plen + k + 1) * kv_per_tok;
        ops += (double)batch * bf_token_ops(c, (double)(plen + k + 1));
    }
    /* Each round decodes positions plen .. plen + dec - 1 again (the KV
     * written by the previous round is simply overwritten). */
    for (int rep = 0; rep < BF_REPS && st == ST_OK; rep++) {
        t0 = now_s();
        double c0 = bf_cpu_s();

        for (int32_t k = 0; k < dec && st == ST_OK; k++) {
            int32_t p = plen + k;

            for (int32_t s = 0; s < batch; s++) {
                tok[s] = all_tok[s * total + p];
                pos[s] = p;
                slot[s] = all_slot[s * total + p];
                ctx[s] = p + 1;
            }
            st = mdl_forward(rt, &b, &lg);
        }
        double dt = now_s() - t0;
        double tps = (double)batch * dec / dt;
        double ctps = (double)batch * dec / (bf_cpu_s() - c0);

        r->decode_cpu_tps = ctps > r->decode_cpu_tps ? ctps : r->decode_cpu_tps;

        if (tps > r->decode_tps) {
            /* Lower bound on the decode time: weights once per step plus KV. */
            double bytes = (double)mdl_model_weight_bytes(m) * dec + kv_bytes;

            r->decode_tps = tps;
            r->roofline_frac = bw > 0.0 ? (bytes / bw) / dt : 0.0;
            r->decode_ops = ops / dt;
        }
    }

out:
    bm_pool_destroy(pool);
    mdl_runtime_destroy(rt);
    free(all_tok);
    free(all_slot);
    free(tok);
    free(pos);
    free(slot);
    free(qs);
    free(ctx);
    free(bt);
    free(rows);
    return st;
}

int
cmd_bench_forward(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt-len", required_argument, NULL, 'p'},
        {"decode", required_argument, NULL, 'd'},
        {"batch", required_argument, NULL, 'b'},
        {"threads", required_argument, NULL, 't'},
        {"kv-cache-dtype", required_argument, NULL, 'k'},
        {"dtype", required_argument, NULL, 'w'},
        {"matmul-precision", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL;
    int32_t plen = 128, dec = 64, threads = 0;
    int32_t batches[16] = {1, 8, 32};
    int n_batches = 3;
    mdl_kv_dtype_t kvdt = MDL_KV_F32;
    mdl_matmul_prec_t precs[2] = {MDL_MATMUL_HIGH, MDL_MATMUL_HIGH};
    int n_precs = 1;
    mdl_load_opts_t lo = {0};
    char defpath[4096], err[512] = "";
    mdl_model_t *m = NULL;
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end = NULL;
        long v = 0;

        if (c != 'm' && c != 'k' && c != 'w' && c != 'P' && c != 'b' && c != 'h' && c != '?') {
            v = strtol(optarg, &end, 10);
            if (*end != '\0' || v < (c == 't' ? 0 : 1) || v > 1000000) {
                fprintf(stderr, "kvserve bench-forward: bad value '%s'\n", optarg);
                bf_usage(stderr);
                return 2;
            }
        }
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'p':
            plen = (int32_t)v;
            break;
        case 'd':
            dec = (int32_t)v;
            break;
        case 'b':
            n_batches = 0;
            for (char *p = optarg; n_batches < 16; p = end + 1) {
                v = strtol(p, &end, 10);
                if (end == p || (*end != ',' && *end != '\0') || v < 1 || v > 4096) {
                    fprintf(stderr, "kvserve bench-forward: bad --batch '%s'\n", optarg);
                    bf_usage(stderr);
                    return 2;
                }
                batches[n_batches++] = (int32_t)v;
                if (*end == '\0') {
                    break;
                }
            }
            break;
        case 'w':
            if (mdl_dtype_parse(optarg, &lo.dtype) != ST_OK) {
                fprintf(stderr, "kvserve bench-forward: bad --dtype '%s'\n", optarg);
                bf_usage(stderr);
                return 2;
            }
            break;
        case 'P': {
            char one[16];
            const char *comma = strchr(optarg, ',');
            size_t len = comma != NULL ? (size_t)(comma - optarg) : strlen(optarg);

            snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) ? len : 0), optarg);
            n_precs = comma != NULL ? 2 : 1;
            if (mdl_matmul_prec_parse(one, &precs[0]) != ST_OK ||
                (comma != NULL && mdl_matmul_prec_parse(comma + 1, &precs[1]) != ST_OK)) {
                fprintf(stderr,
                        "kvserve bench-forward: bad --matmul-precision '%s' (high, medium, or "
                        "both: high,medium)\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 't':
            threads = (int32_t)v;
            break;
        case 'k':
            if (mdl_kv_dtype_parse(optarg, &kvdt) != ST_OK || kvdt == MDL_KV_AUTO) {
                fprintf(stderr, "kvserve bench-forward: bad --kv-cache-dtype '%s'\n", optarg);
                bf_usage(stderr);
                return 2;
            }
            break;
        case 'h':
            bf_usage(stdout);
            return 0;
        default:
            fprintf(stderr, "kvserve bench-forward: bad option '%s'\n", argv[optind - 1]);
            bf_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvserve bench-forward: unexpected argument '%s'\n", argv[optind]);
        bf_usage(stderr);
        return 2;
    }
    if (model == NULL) {
        snprintf(defpath, sizeof(defpath), "%s/%s", KVSERVE_SOURCE_ROOT, BF_DEFAULT_MODEL);
        model = access(defpath, R_OK) == 0 ? defpath : BF_DEFAULT_MODEL;
    }
    if (mdl_model_load_opts(model, &lo, &m, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "kvserve bench-forward: %s\n", err);
        return 1;
    }
    const mdl_config_t *mc = mdl_model_config(m);

    if (plen + dec > mc->max_pos) {
        fprintf(stderr, "kvserve bench-forward: prompt %d + decode %d exceeds the context %d\n",
                plen, dec, mc->max_pos);
        mdl_model_destroy(m);
        return 2;
    }
    bf_machine_t mm;

    bf_measure_machine(threads, &mm); /* before the kernel threads start: fork-safe */
    double bw = mm.bw;
    kn_peak_op_t op = bf_bulk_op(m, &mm);

    kn_cpu_init(threads);
    char types[256];

    mdl_model_weight_types(m, types, sizeof(types));
    printf("model %s: %d layers, dim %d, %d/%d heads, ffn %d, vocab %d\n", model, mc->n_layers,
           mc->dim, mc->n_heads, mc->n_kv_heads, mc->ffn_dim, mc->vocab_size);
    printf("weights: %s; %.1f MB read per token; RSS after load %.1f MiB\n", types,
           (double)mdl_model_weight_bytes(m) / 1e6, bf_peak_rss() / 1048576.0);
    printf("cpu: %s kernels, %d threads; read bandwidth %.2f GB/s\n", kn_isa_name(kn_cpu_isa()),
           kn_cpu_threads(), bw / 1e9);
    printf("compute peak, %d threads at once:", kn_cpu_threads());
    for (int k = 0; k < KN_PEAK_NOPS; k++) {
        if (mm.peak[k] > 0.0) {
            printf(" %s %.1f G/s%s", kn_peak_name((kn_peak_op_t)k), mm.peak[k] / 1e9,
                   k + 1 < KN_PEAK_NOPS ? "," : "");
        }
    }
    printf("\n");
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);

    if (llc > 0 && (double)mdl_model_weight_bytes(m) < (double)llc) {
        printf("note: the weights fit in the %ld MiB last-level cache, so decode is not bound\n"
               "      by memory bandwidth and the roofline fraction can exceed 100%%\n",
               llc >> 20);
    }
    printf("prompt %d tokens, %d decode steps, KV %s (%.0f bytes/token)\n", plen, dec,
           mdl_kv_dtype_name(kvdt), (double)mdl_kv_block_bytes(mc, BF_BLOCK, kvdt) / BF_BLOCK);
    printf("%6s %7s %14s %14s %16s %18s %14s %15s\n", "batch", "matmul", "prefill tok/s",
           "decode tok/s", "decode/roofline", "decode tok/cpu-s", "decode Gop/s", "of peak");
    for (int i = 0; i < n_batches; i++) {
        bf_run_t r[2] = {{0}};

        for (int k = 0; k < n_precs; k++) {
            int st = bf_run(m, batches[i], plen, dec, threads, kvdt, precs[k], bw, &r[k], err,
                            sizeof(err));

            if (st != ST_OK) {
                fprintf(stderr, "kvserve bench-forward: batch %d: %s %s\n", batches[i],
                        st_str(st), err);
                mdl_model_destroy(m);
                return 1;
            }
            double pk = mm.peak[op];

            printf("%6d %7s %14.1f %14.1f %15.1f%% %18.1f %14.1f %6.1f%% %-7s\n", batches[i],
                   mdl_matmul_prec_name(precs[k]), r[k].prefill_tps, r[k].decode_tps,
                   100.0 * r[k].roofline_frac, r[k].decode_cpu_tps, r[k].decode_ops / 1e9,
                   pk > 0.0 ? 100.0 * r[k].decode_ops / pk : 0.0, kn_peak_name(op));
            fflush(stdout);
        }
        if (n_precs == 2 && r[0].decode_tps > 0 && r[0].decode_cpu_tps > 0) {
            printf("%6d %7s %13.2fx %13.2fx %16s %17.2fx\n", batches[i], "ratio",
                   r[1].prefill_tps / r[0].prefill_tps, r[1].decode_tps / r[0].decode_tps, "",
                   r[1].decode_cpu_tps / r[0].decode_cpu_tps);
        }
    }
    printf("peak RSS %.1f MiB\n", bf_peak_rss() / 1048576.0);
    mdl_model_destroy(m);
    return 0;
}
