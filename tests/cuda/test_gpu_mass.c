/* test_gpu_mass.c - H2O / SnapKV on a real device (part of test_gpu.c's
 * executable, suite cuda; model/dev_mass.c, kernels/cuda/kn_mass_body.h):
 *
 *   kernel:  kn_cuda_attn_mass over 16-bit keys (three sequences, GQA 4,
 *            head_dim 64, some rows on, with and without a sliding window)
 *            against kn_cpu_attn_mass_ref in double on the same keys:
 *            |diff| / (1 + |ref|) < 1e-4;
 *   mass:    the default model on cuda (f16 weights and KV, decode graphs
 *            on) and on cpu (f32) through the same prefill and decode steps
 *            with mass rows: the mass of every slot within 1e-2 of the
 *            CPU's relative to 1 + |cpu| (f16 keys and cuBLAS against f32),
 *            and summing to the rows' probabilities;
 *   greedy:  kvserve perplexity's stream driver (scheduler/kv_stream.h) on
 *            cuda: budgets above the sequence give the tokens of no policy;
 *            h2o=64 and snapkv=48 give the CPU backend's tokens, or differ
 *            first where the CPU's top-2 margin is a near tie (< 0.1);
 *            prints the decode ms per token with and without the policy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_mass.h"
#include "kernels/cuda/kn_cuda.h"
#include "kvserve_config.h"
#include "model/kv_policy.h"
#include "model/model.h"
#include "scheduler/kv_stream.h"
#include "text/tokenizer.h"

void test_gpu_mass(const mdl_model_t *m, int *n_fail);

#define GM_EXPECT(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            (*n_fail)++;                                                                           \
        }                                                                                          \
    } while (0)

#define GM_CU(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorName(e_));                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *
gm_dev(const void *h, size_t bytes)
{
    void *d;

    GM_CU(cudaMalloc(&d, bytes));
    GM_CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static double
gm_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the kernel ------------------------------------------------------------------- */

static double
gm_kernel(kn_dt_t dt, int32_t window, int *n_fail)
{
    enum { NH = 8, NKV = 2, HD = 64, KBS = 16, KNB = 12, KMB = 4, NS = 3, NT = 9 };
    const int32_t qs[NS + 1] = {0, 1, 6, 9}, ctx[NS] = {37, 50, 3};
    const int32_t bt[NS * KMB] = {3, 7, 1, 0, 2, 9, 4, 11, 5, 0, 0, 0};
    const int32_t rows[NT] = {1, 0, 1, 1, 0, 1, 1, 1, 0};
    const uint8_t rows8[NT] = {1, 0, 1, 1, 0, 1, 1, 1, 0};
    const size_t n_cache = (size_t)KNB * NKV * KBS * HD, n_acc = (size_t)KNB * KBS * NKV;
    uint16_t *k16 = xmalloc(sizeof(uint16_t) * n_cache);
    float *k32 = xmalloc(sizeof(float) * n_cache), *q = xmalloc(sizeof(float) * NT * NH * HD);
    float *acc_d = xmalloc(sizeof(float) * n_acc), *acc_r = xmalloc(sizeof(float) * n_acc);
    uint64_t r = 0x2545f4914f6cdd1dull;
    double worst = 0.0;

    for (size_t i = 0; i < n_cache; i++) {
        float x;

        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        x = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        k16[i] = dt == KN_DT_F16 ? kn_f32_to_f16(x) : kn_f32_to_bf16(x);
        k32[i] = kn_ld16(k16, i, dt);
    }
    for (int32_t i = 0; i < NT * NH * HD; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        q[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (size_t i = 0; i < n_acc; i++) {
        acc_r[i] = (float)(i % 7) * 0.25f;
    }
    kn_attn_mass_args_t ma = {
        .a = {.q = gm_dev(q, sizeof(float) * NT * NH * HD),
              .k_cache = gm_dev(k16, sizeof(uint16_t) * n_cache),
              .query_start = gm_dev(qs, sizeof(qs)),
              .context_len = gm_dev(ctx, sizeof(ctx)),
              .block_tables = gm_dev(bt, sizeof(bt)),
              .max_blocks = KMB, .n_seqs = NS, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
              .block_size = KBS, .sliding_window = window, .q_stride = NH * HD,
              .scale = 1.0f / sqrtf((float)HD), .dt = dt},
        .rows = gm_dev(rows, sizeof(rows)),
        .acc = gm_dev(acc_r, sizeof(float) * n_acc),
    };
    kn_attn_args_t ra = {
        .q = q, .k_cache = k32, .query_start = qs, .context_len = ctx, .block_tables = bt,
        .max_blocks = KMB, .n_seqs = NS, .n_tok = NT, .n_heads = NH, .n_kv_heads = NKV,
        .head_dim = HD, .block_size = KBS, .sliding_window = window, .scale = ma.a.scale,
    };

    GM_CU(kn_cuda_attn_mass(NULL, &ma, NS));
    GM_CU(cudaMemcpy(acc_d, ma.acc, sizeof(float) * n_acc, cudaMemcpyDeviceToHost));
    kn_cpu_attn_mass_ref(&ra, rows8, acc_r);
    for (size_t i = 0; i < n_acc; i++) {
        double d = fabs((double)acc_d[i] - acc_r[i]) / (1.0 + fabs((double)acc_r[i]));

        worst = d > worst ? d : worst;
    }
    GM_EXPECT(worst < 1e-4, "mass kernel: |diff| / (1 + |ref|) %.3g", worst);
    cudaFree((void *)ma.a.q);
    cudaFree((void *)ma.a.k_cache);
    cudaFree((void *)ma.a.query_start);
    cudaFree((void *)ma.a.context_len);
    cudaFree((void *)ma.a.block_tables);
    cudaFree((void *)ma.rows);
    cudaFree(ma.acc);
    free(k16);
    free(k32);
    free(q);
    free(acc_d);
    free(acc_r);
    return worst;
}

/* ---- the model's mass, cuda against cpu ---------------------------------------------- */

#define GM_BS 16
#define GM_MAXB 8

static mdl_runtime_t *
gm_runtime(const mdl_model_t *m, const char *device, mdl_kv_dtype_t kv, int32_t blocks,
           int32_t max_blocks, int kv_mass)
{
    mdl_runtime_config_t rc = {.device = device,
                               .block_size = GM_BS,
                               .num_blocks = blocks,
                               .max_blocks_per_seq = max_blocks,
                               .max_num_seqs = 64,
                               .max_num_batched_tokens = 96,
                               .kv_dtype = kv,
                               .kv_mass = kv_mass,
                               .cuda_graphs = 1};
    mdl_runtime_t *rt = NULL;
    char err[256];

    if (mdl_runtime_create(m, &rc, &rt, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "%s runtime: %s\n", device, err);
        exit(1);
    }
    return rt;
}

/* Two sequences: a prefill (40 + 24 tokens, sequence 0's last 8 rows on),
 * 6 decodes through the graphs (rows on for both), 1 without mass rows;
 * the same on both runtimes; then every slot's mass compared. */
static double
gm_model_mass(const mdl_model_t *m, int *n_fail)
{
    const mdl_config_t *mc = mdl_model_config(m);
    const int32_t heads = mc->n_layers * mc->n_kv_heads, group = mc->n_heads / mc->n_kv_heads;
    mdl_runtime_t *rt[2] = {gm_runtime(m, "cpu", MDL_KV_F32, 24, GM_MAXB, 1),
                            gm_runtime(m, "cuda", MDL_KV_F16, 24, GM_MAXB, 1)};
    int32_t ids[2][128], table[2][GM_MAXB] = {{1, 2, 3, 4}, {9, 7, 5}}, done[2] = {0, 0};
    int32_t n_rows[2] = {0, 0};
    double worst = 0.0;

    for (int32_t s = 0; s < 2; s++) {
        for (int32_t i = 0; i < 128; i++) {
            ids[s][i] = 3 + (i * 53 + s * 101) % (mc->vocab_size - 3);
        }
    }
    for (int32_t step = 0; step < 8; step++) {
        int32_t tok[96], pos[96], slot[96], qs[3] = {0}, ctx[2], bt[2 * GM_MAXB], lrow[2], n = 0;
        uint8_t on[96];

        for (int32_t s = 0; s < 2; s++) {
            int32_t n_new = step == 0 ? (s == 0 ? 40 : 24) : 1;

            for (int32_t i = 0; i < n_new; i++) {
                int32_t ix = done[s] + i;

                tok[n] = ids[s][ix];
                pos[n] = ix;
                slot[n] = table[s][ix / GM_BS] * GM_BS + ix % GM_BS;
                on[n] = step == 0 ? s == 0 && i >= n_new - 8 : step < 7;
                n_rows[s] += on[n];
                n++;
            }
            done[s] += n_new;
            ctx[s] = done[s];
            memcpy(bt + s * GM_MAXB, table[s], sizeof(table[s]));
            lrow[s] = n - 1;
            qs[s + 1] = n;
        }
        mdl_batch_t b = {.n_tokens = n, .tokens = tok, .positions = pos, .slot_mapping = slot,
                         .n_seqs = 2, .query_start = qs, .context_len = ctx, .block_tables = bt,
                         .max_blocks = GM_MAXB, .logits_rows = lrow, .n_logits = 2,
                         .mass_rows = step < 7 ? on : NULL};
        const float *out;

        for (int k = 0; k < 2; k++) {
            if (mdl_forward(rt[k], &b, &out) != ST_OK) {
                fprintf(stderr, "mass: forward failed at step %d\n", step);
                exit(1);
            }
        }
    }
    for (int32_t s = 0; s < 2; s++) {
        int32_t slots[128];
        float *mm[2] = {xmalloc(sizeof(float) * (size_t)done[s] * heads),
                        xmalloc(sizeof(float) * (size_t)done[s] * heads)};

        for (int32_t i = 0; i < done[s]; i++) {
            slots[i] = table[s][i / GM_BS] * GM_BS + i % GM_BS;
        }
        for (int k = 0; k < 2; k++) {
            GM_EXPECT(mdl_runtime_kv_mass(rt[k], slots, done[s], mm[k]) == ST_OK, "kv_mass %d", k);
        }
        for (int32_t h = 0; h < heads; h++) {
            double sum = 0.0;

            for (int32_t i = 0; i < done[s]; i++) {
                double c = mm[0][i * heads + h], d = fabs(mm[1][i * heads + h] - c) / (1 + fabs(c));

                worst = d > worst ? d : worst;
                sum += mm[1][i * heads + h];
            }
            GM_EXPECT(fabs(sum - (double)n_rows[s] * group) < 1e-3 * (1 + n_rows[s]),
                      "mass: seq %d head %d sums to %.4f over %d rows", s, h, sum, n_rows[s]);
        }
        free(mm[0]);
        free(mm[1]);
    }
    GM_EXPECT(worst < 1e-2, "mass: cuda f16 vs cpu f32 |diff| / (1 + |cpu|) %.3g", worst);
    mdl_runtime_destroy(rt[0]);
    mdl_runtime_destroy(rt[1]);
    return worst;
}

/* ---- greedy through the stream ----------------------------------------------------- */

#define GM_PROMPT 120
#define GM_GEN 48

typedef struct gm_arg {
    int32_t vocab, best;
    float margin;
} gm_arg_t;

static void
gm_argmax(void *arg, int64_t i, const float *logits)
{
    gm_arg_t *a = arg;
    int32_t second = -1;

    (void)i;
    a->best = 0;
    for (int32_t v = 1; v < a->vocab; v++) {
        if (logits[v] > logits[a->best]) {
            second = a->best;
            a->best = v;
        } else if (second < 0 || logits[v] > logits[second]) {
            second = v;
        }
    }
    a->margin = logits[a->best] - logits[second];
}

/* Greedy tokens to out, the top-2 margins to mg; returns ms per decode token. */
static double
gm_greedy(const mdl_model_t *m, const char *device, mdl_kv_dtype_t kv, const char *policy,
          const int32_t *prompt, int32_t *out, float *mg)
{
    mdl_kv_policy_t p = {0};
    char err[256];
    mdl_runtime_t *rt;
    sched_stream_t *s = NULL;
    gm_arg_t a = {mdl_model_config(m)->vocab_size, 0, 0.0f};
    double t0, t = 0.0;

    if (mdl_kv_policy_parse(policy, GM_BS, &p, err, sizeof(err)) != ST_OK) {
        fprintf(stderr, "policy %s: %s\n", policy, err);
        exit(1);
    }
    rt = gm_runtime(m, device, kv, sched_stream_blocks(GM_BS, 256) + 1,
                    sched_stream_blocks(GM_BS, 256), p.kind != MDL_KVP_FULL);
    if (sched_stream_create(rt, &p, GM_BS, 256, 64, a.vocab, &s) != ST_OK) {
        fprintf(stderr, "stream on %s failed\n", device);
        exit(1);
    }
    sched_stream_set_prompt(s, GM_PROMPT);
    if (sched_stream_feed_last(s, prompt, GM_PROMPT, gm_argmax, &a) != ST_OK) {
        fprintf(stderr, "stream prompt on %s failed\n", device);
        exit(1);
    }
    for (int32_t g = 0; g < GM_GEN; g++) {
        int32_t tok = a.best;

        out[g] = tok;
        mg[g] = a.margin;
        t0 = gm_now();
        if (sched_stream_feed(s, &tok, 1, gm_argmax, &a) != ST_OK) {
            fprintf(stderr, "stream step on %s failed\n", device);
            exit(1);
        }
        t += gm_now() - t0;
    }
    sched_stream_destroy(s);
    mdl_runtime_destroy(rt);
    return t * 1e3 / GM_GEN;
}

static int32_t
gm_diff(const int32_t *a, const int32_t *b)
{
    int32_t i = 0;

    while (i < GM_GEN && a[i] == b[i]) {
        i++;
    }
    return i;
}

static void
gm_greedy_all(const mdl_model_t *m, int *n_fail)
{
    const char *dir = getenv("KVSERVE_TEST_TEXT");
    char path[512], *buf = xcalloc(1, 1 << 16);
    FILE *f;
    size_t len, n = 0;
    int32_t *toks = NULL, ref[GM_GEN], got[GM_GEN], cpu[GM_GEN], at;
    float mg[GM_GEN], cmg[GM_GEN];
    double ms_full, ms;
    static const char *const real[2] = {"h2o=64,recent=16", "snapkv=48,window=8,pool=5"};

    snprintf(path, sizeof(path), "%s",
             dir != NULL ? dir : KVSERVE_SOURCE_ROOT "/tests/fixtures/austen-persuasion-ch24.txt");
    f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "greedy: cannot read %s\n", path);
        (*n_fail)++;
        free(buf);
        return;
    }
    len = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    if (tok_encode(mdl_model_tokenizer(m), buf, len, TOK_ADD_SPECIAL, &toks, &n) != ST_OK ||
        n < GM_PROMPT) {
        fprintf(stderr, "greedy: cannot tokenize %s\n", path);
        (*n_fail)++;
        free(buf);
        free(toks);
        return;
    }
    ms_full = gm_greedy(m, "cuda", MDL_KV_F16, "full", toks, ref, mg);
    ms = gm_greedy(m, "cuda", MDL_KV_F16, "h2o=240,recent=16", toks, got, mg);
    GM_EXPECT(gm_diff(ref, got) == GM_GEN, "h2o above the sequence differs at %d",
              gm_diff(ref, got));
    printf("h2o/snapkv greedy: decode %.3f ms/token without a policy, %.3f with h2o=240 (mass "
           "rows every step, nothing evicted)\n",
           ms_full, ms);
    gm_greedy(m, "cuda", MDL_KV_F16, "snapkv=200,window=16,pool=7", toks, got, mg);
    GM_EXPECT(gm_diff(ref, got) == GM_GEN, "snapkv above the sequence differs at %d",
              gm_diff(ref, got));
    for (int k = 0; k < 2; k++) {
        gm_greedy(m, "cpu", MDL_KV_F32, real[k], toks, cpu, cmg);
        ms = gm_greedy(m, "cuda", MDL_KV_F16, real[k], toks, got, mg);
        at = gm_diff(cpu, got);
        printf("h2o/snapkv greedy: %s on cuda f16 = cpu f32 for %d of %d tokens%s (%.3f "
               "ms/token)\n",
               real[k], at, GM_GEN, at < GM_GEN ? " (then a near tie?)" : "", ms);
        GM_EXPECT(at == GM_GEN || cmg[at] < 0.1f,
                  "%s: cuda differs from cpu at token %d, cpu margin %.3f", real[k], at,
                  at < GM_GEN ? (double)cmg[at] : 0.0);
    }
    free(toks);
    free(buf);
}

void
test_gpu_mass(const mdl_model_t *m, int *n_fail)
{
    double w = 0.0, x;

    x = gm_kernel(KN_DT_F16, 0, n_fail);
    w = x > w ? x : w;
    x = gm_kernel(KN_DT_BF16, 0, n_fail);
    w = x > w ? x : w;
    x = gm_kernel(KN_DT_F16, 20, n_fail);
    w = x > w ? x : w;
    printf("h2o/snapkv mass kernel vs double reference: |diff| / (1 + |ref|) %.3g\n", w);
    x = gm_model_mass(m, n_fail);
    printf("h2o/snapkv model mass, cuda f16 (graphs) vs cpu f32: |diff| / (1 + |cpu|) %.3g\n", x);
    gm_greedy_all(m, n_fail);
}
