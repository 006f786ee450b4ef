/* test_tp.c - tensor parallelism on the CPU backend (model/forward_cpu.c at T > 1):
 * the same steps run at T = 1 and at T = 2 (and 4) must give the same
 * logits within 1e-5 relative (max |diff| / max |logit| per step), through
 * chunked prefill, batched decodes, and KV copies and swaps (the KV block
 * ids are shared by every rank, each rank holding its heads' slice).
 *
 * Models: the default model (6 heads, 2 KV heads: one KV head per rank at
 * T = 2) from KVSERVE_TEST_MODEL, also quantized to q4_K (its repacked
 * ffn_down shards), and small synthetic in-memory models
 * with 1 KV head (replicated on every rank), with 4 KV heads, and with
 * QKV biases (Qwen2), built here from model_int.h.
 *
 * Compressed KV (int8, int4, fp8_e4m3) under T ranks: per-rank pools hold
 * bit for bit the single pool's codes, scales and residual rows of their
 * KV heads through writes, copies, swaps, drops and shifts, and attend
 * bit for bit alike; the runtime's logits at T = 2 / 4 follow T = 1 with
 * the same dtype within tol_for(); a text streamed through sink + rolling
 * window (scheduler/kv_stream.h: blockmgr's evictions, KV_OP_SHIFT on every
 * rank) too; int4 with head_dim % 8 != 0 is
 * refused at any T.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "kernels/cpu/kv_quant.h"
#include "model/host_kv.h"
#include "model/kv_policy.h"
#include "model/model.h"
#include "model/model_int.h"
#include "model/tp.h"
#include "scheduler/kv_stream.h"
#include "tests/cuda/batch_build.h"
#include "tests/cuda/synth_model.h"

#define BS 8
#define NBLK 64
#define SWAPB 16
#define MAXB 16
#define NSEQ 3


/* ---- a synthetic model ------------------------------------------------------ */

static void
synth_init(synth_t *s, int32_t n_heads, int32_t n_kv, int bias)
{
    synth_init_shape(s, n_heads, n_kv, bias, 8, 40, 64, 0x1234567890abcdefULL + (uint64_t)n_kv);
}

/* ---- the scripted steps ------------------------------------------------------ */

typedef struct tseq {
    int32_t ids[MAXB * BS];
    int32_t n_ids, done;
    int32_t table[MAXB];
} tseq_t;

typedef struct pair {
    mdl_runtime_t *one, *many;
    int32_t vocab;
    double tol; /* max |diff| / max |logit| allowed per step */
    double worst;
} pair_t;

/* One step for both runtimes; n_new[s] tokens of each sequence. */
static void
step(pair_t *p, tseq_t *seqs, const int32_t *n_new)
{
    tb_batch_t t;
    const float *l1, *lt;

    tb_begin(&t, BS, MAXB);
    for (int32_t s = 0; s < NSEQ; s++) {
        if (n_new[s] > 0) {
            tb_add(&t, seqs[s].ids, &seqs[s].done, n_new[s], seqs[s].table, 1);
        }
    }
    const mdl_batch_t *b = tb_end(&t);
    const int32_t ns = b->n_seqs;

    ck_assert_int_eq(mdl_forward(p->one, b, &l1), ST_OK);
    ck_assert_int_eq(mdl_forward(p->many, b, &lt), ST_OK);
    double mx = 0.0, md = 0.0;

    for (size_t i = 0; i < (size_t)ns * p->vocab; i++) {
        mx = fmax(mx, fabs(l1[i]));
        md = fmax(md, fabs((double)l1[i] - lt[i]));
    }
    ck_assert(mx > 0.0);
    if (md / mx > p->worst) {
        p->worst = md / mx;
    }
    ck_assert_msg(md / mx <= p->tol, "logits differ by %g relative", md / mx);
}

static void
kv_ops(pair_t *p, const kv_op_t *ops, int32_t n)
{
    ck_assert_int_eq(mdl_runtime_kv_ops(p->one, ops, n), ST_OK);
    ck_assert_int_eq(mdl_runtime_kv_ops(p->many, ops, n), ST_OK);
}

/* Chunked prefill of three sequences, batched decodes, a copy-on-write
 * style copy of a whole sequence (its last block partly filled: under a
 * scaled dtype that one lives in a residual slot, the others as codes and
 * scales), and a swap out and back in to other blocks, comparing T = 1 and
 * T = tp with the same KV dtype at every step. */
static double
run_script(const mdl_model_t *m, int32_t tp, mdl_kv_dtype_t dtype, double tol)
{
    char err[256];
    mdl_runtime_config_t rc = {.num_blocks = NBLK,
                               .swap_blocks = SWAPB,
                               .block_size = BS,
                               .max_num_batched_tokens = 64,
                               .max_num_seqs = NSEQ,
                               .max_blocks_per_seq = MAXB,
                               .n_threads = 1,
                               .kv_dtype = dtype};
    pair_t p = {.vocab = m->cfg.vocab_size, .tol = tol};
    tseq_t seqs[NSEQ];
    int32_t next_blk = 1;

    ck_assert_int_eq(mdl_runtime_create(m, &rc, &p.one, err, sizeof(err)), ST_OK);
    rc.tp_size = tp;
    ck_assert_msg(mdl_runtime_create(m, &rc, &p.many, err, sizeof(err)) == ST_OK, "%s", err);

    synth_rs = 0xfeedULL + (uint64_t)tp;
    for (int32_t s = 0; s < NSEQ; s++) {
        memset(&seqs[s], 0, sizeof(seqs[s]));
        seqs[s].n_ids = 60;
        for (int32_t i = 0; i < seqs[s].n_ids; i++) {
            seqs[s].ids[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(p.vocab - 3));
        }
        for (int32_t b = 0; b < 8; b++) {
            /* interleaved ids: tables are not contiguous */
            seqs[s].table[b] = 1 + b * NSEQ + s;
        }
    }
    next_blk = 1 + 8 * NSEQ;

    int32_t s1[NSEQ] = {13, 5, 0}, s2[NSEQ] = {9, 1, 20}, s3[NSEQ] = {1, 1, 17};
    step(&p, seqs, s1);
    step(&p, seqs, s2);
    step(&p, seqs, s3);
    for (int i = 0; i < 4; i++) {
        int32_t d[NSEQ] = {1, 1, 1};
        step(&p, seqs, d);
    }

    /* Copy seq 0's blocks to fresh ids and continue from the copies. */
    kv_op_t ops[2 * MAXB];
    int32_t n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[0].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[0].table[b], next_blk};
        seqs[0].table[b] = next_blk++;
    }
    kv_ops(&p, ops, n_ops);
    /* Scribble over the originals: only the copies hold seq 0 now. */
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[0].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[2].table[1], 1 + b * NSEQ};
    }
    kv_ops(&p, ops, n_ops);
    /* Swap seq 1 out, then in to other blocks (the old ones are scribbled
     * over by a copy from seq 2 to show the data really moved). */
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_OUT, seqs[1].table[b], 2 + b};
    }
    kv_ops(&p, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_COPY, seqs[2].table[0], seqs[1].table[b]};
    }
    kv_ops(&p, ops, n_ops);
    n_ops = 0;
    for (int32_t b = 0; b * BS < seqs[1].done; b++) {
        ops[n_ops++] = (kv_op_t){KV_OP_SWAP_IN, 2 + b, next_blk};
        seqs[1].table[b] = next_blk++;
    }
    kv_ops(&p, ops, n_ops);
    for (int i = 0; i < 3; i++) {
        int32_t d[NSEQ] = {1, 1, 1};
        step(&p, seqs, d);
    }
    int32_t last[NSEQ] = {20, 2, 0};
    step(&p, seqs, last);

    mdl_runtime_destroy(p.one);
    mdl_runtime_destroy(p.many);
    return p.worst;
}

START_TEST(test_tp_default_model)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    mdl_model_t *m;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_int_eq(mdl_model_config(m)->n_kv_heads, 2);
    double worst = run_script(m, 2, MDL_KV_F32, 1e-5);

    printf("default model T=2: max relative logit difference %.3g\n", worst);
    mdl_model_destroy(m);
}
END_TEST

START_TEST(test_tp_synthetic)
{
    /* (n_heads, n_kv, bias, T): replication, sharded KV, biases */
    static const int32_t cases[][4] = {
        {4, 1, 0, 2}, {4, 1, 1, 4}, {4, 4, 0, 2}, {4, 4, 1, 4}, {8, 2, 1, 4},
    };
    synth_t s;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        synth_init(&s, cases[i][0], cases[i][1], cases[i][2]);
        double worst = run_script(&s.m, cases[i][3], MDL_KV_F32, 1e-5);

        printf("synthetic %d heads / %d KV heads%s, T=%d: max relative difference %.3g\n",
               cases[i][0], cases[i][1], cases[i][2] ? " + bias" : "", cases[i][3], worst);
        synth_fini(&s);
    }
}
END_TEST

/* The default model in q4_K (kvserve quantize): its ffn_down (512 columns)
 * is the one q4_K matrix, which the CPU backend repacks 8 rows at a time
 * (model/cpu_repack.c) from the file's pages at T = 1 and from each rank's
 * column copy (256 of the 512 columns) at T = 2. The ranks' sums reach the 8-bit activation
 * quantizers in another order than T = 1's (last-bit differences that can
 * flip a code, as with the compressed KV below): 2e-2, where a wrong
 * shard or group would move the logits by O(1). */
/* The default model quantized to q (ffn_down of type t, repacked), T = 2
 * against T = 1 within 2e-2 (see above). */
static void
check_default_model_quant(mdl_quant_t q, kn_wtype_t t, const char *name)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    char path[] = "/tmp/kvs_tp_q4k_XXXXXX", gg[64], err[256];
    mdl_model_t *m;

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert(mkdtemp(path) != NULL);
    snprintf(gg, sizeof(gg), "%s/m.gguf", path);
    ck_assert_msg(mdl_quantize(dir, gg, q, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(mdl_model_load(gg, &m, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_int_eq(m->layers[0].w_down.type, t);
    double worst = run_script(m, 2, MDL_KV_F32, 2e-2);

    printf("default model %s, T=2: max relative logit difference %.3g\n", name, worst);
    mdl_model_destroy(m);
    unlink(gg);
    rmdir(path);
}

START_TEST(test_tp_default_model_q4k)
{
    check_default_model_quant(MDL_QUANT_Q4_K, KN_W_Q4_K, "q4_k");
}
END_TEST

/* The same in q6_K: ffn_down repacked as KN_W_Q6_K_R8 (kernels/cpu/kn_q6r8.c). */
START_TEST(test_tp_default_model_q6k)
{
    check_default_model_quant(MDL_QUANT_Q6_K, KN_W_Q6_K, "q6_k");
}
END_TEST

/* ---- compressed KV and the sink + rolling-window policy -------------------- */

static const mdl_kv_dtype_t quant_dtypes[] = {MDL_KV_INT8, MDL_KV_INT4, MDL_KV_FP8_E4M3};

/* Logits of T = tp against T = 1 with the same KV dtype. The ranks' KV
 * pools are bit for bit the single pool's heads (test_tp_kv_pools_bit_exact),
 * but the residual stream reaching them is not: the all-reduce adds the
 * ranks' partial products in another order than the one GEMM of T = 1, so
 * K and V differ in the last bit (f32: logits within 1e-5). A value on a
 * rounding boundary then takes the neighbouring code, one quantization
 * step (int8: 1/255 of the group's range, int4: 1/15, fp8: 1/16 of the
 * value), and later logits move by that step's effect, which depends on
 * which element flipped: most rows stay within 1e-4, single rows reach
 * 3.4e-3 (int8) and 5.4e-3 (fp8) in the default model's sink + window
 * stream. A broken shard (keys not re-rotated on the ranks) moves them by
 * 0.15 (synthetic models) to 1.5 (default model): 2e-2 sits between. */
static double
tol_for(mdl_kv_dtype_t d)
{
    return d == MDL_KV_F32 ? 1e-5 : 2e-2;
}

START_TEST(test_tp_kv_quant_default_model)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    mdl_model_t *m;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    for (size_t d = 0; d < sizeof(quant_dtypes) / sizeof(quant_dtypes[0]); d++) {
        double worst = run_script(m, 2, quant_dtypes[d], tol_for(quant_dtypes[d]));

        printf("default model %s KV, T=2: max relative logit difference %.3g\n",
               mdl_kv_dtype_name(quant_dtypes[d]), worst);
    }
    mdl_model_destroy(m);
}
END_TEST

START_TEST(test_tp_kv_quant_synthetic)
{
    /* (n_heads, n_kv, bias, T): replicated KV head, sharded, GQA 4:1 */
    static const int32_t cases[][4] = {
        {4, 1, 0, 2}, {4, 1, 1, 4}, {4, 4, 1, 2}, {8, 2, 1, 4}, {8, 2, 0, 2},
    };
    synth_t s;

    for (size_t d = 0; d < sizeof(quant_dtypes) / sizeof(quant_dtypes[0]); d++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            synth_init(&s, cases[i][0], cases[i][1], cases[i][2]);
            double worst =
                run_script(&s.m, cases[i][3], quant_dtypes[d], tol_for(quant_dtypes[d]));

            printf("synthetic %d heads / %d KV heads%s, %s KV, T=%d: max relative difference "
                   "%.3g\n",
                   cases[i][0], cases[i][1], cases[i][2] ? " + bias" : "",
                   mdl_kv_dtype_name(quant_dtypes[d]), cases[i][3], worst);
            synth_fini(&s);
        }
    }
}
END_TEST

typedef struct stream_rows {
    float *logits; /* [n][vocab] */
    int32_t vocab;
} stream_rows_t;

static void
stream_row(void *arg, int64_t i, const float *logits)
{
    stream_rows_t *r = arg;

    memcpy(r->logits + (size_t)i * r->vocab, logits, sizeof(float) * (size_t)r->vocab);
}

/* One text streamed through sink=S,window=W at T = 1 and T = tp with the
 * same KV dtype: evictions drop blocks and re-rotate the kept keys
 * (KV_OP_SHIFT: f32 rows, residual rows, or codes rotated on read) on
 * every rank; every row's logits must agree. */
static double
run_stream(const mdl_model_t *m, int32_t tp, mdl_kv_dtype_t dtype, double tol)
{
    enum { N = 150, CHUNK = 5, SINK = BS, WINDOW = 3 * BS };
    mdl_kv_policy_t pol = {.sink = SINK, .window = WINDOW};
    int32_t max_ctx = SINK + WINDOW + BS + CHUNK, vocab = m->cfg.vocab_size;
    mdl_runtime_config_t rc = {.num_blocks = max_ctx / BS + 3,
                               .block_size = BS,
                               .max_num_batched_tokens = CHUNK,
                               .max_num_seqs = CHUNK, /* a logits row per token */
                               .n_threads = 1,
                               .kv_dtype = dtype};
    mdl_runtime_t *rt[2];
    sched_stream_t *ks[2];
    stream_rows_t rows[2];
    int32_t toks[N];
    char err[256];
    double worst = 0.0;

    synth_rs = 0xabcdULL + (uint64_t)dtype;
    for (int32_t i = 0; i < N; i++) {
        toks[i] = 3 + (int32_t)(synth_rnd() % (uint32_t)(vocab - 3));
    }
    for (int k = 0; k < 2; k++) {
        rc.tp_size = k == 0 ? 1 : tp;
        ck_assert_msg(mdl_runtime_create(m, &rc, &rt[k], err, sizeof(err)) == ST_OK, "%s", err);
        ck_assert_int_eq(sched_stream_create(rt[k], &pol, BS, max_ctx, CHUNK, vocab, &ks[k]),
                         ST_OK);
        rows[k].vocab = vocab;
        rows[k].logits = xmalloc(sizeof(float) * (size_t)N * vocab);
        ck_assert_int_eq(sched_stream_feed(ks[k], toks, N, stream_row, &rows[k]), ST_OK);
    }
    ck_assert_int_gt(sched_stream_evicted(ks[1]), 0);
    ck_assert_int_eq(sched_stream_evicted(ks[1]), sched_stream_evicted(ks[0]));
    ck_assert_int_le(sched_stream_kv_peak(ks[1]), max_ctx);
    for (int32_t i = 0; i < N; i++) {
        const float *a = rows[0].logits + (size_t)i * vocab;
        const float *b = rows[1].logits + (size_t)i * vocab;
        double mx = 0.0, md = 0.0;

        for (int32_t j = 0; j < vocab; j++) {
            mx = fmax(mx, fabs(a[j]));
            md = fmax(md, fabs((double)a[j] - b[j]));
        }
        ck_assert(mx > 0.0);
        worst = fmax(worst, md / mx);
        ck_assert_msg(md / mx <= tol, "%s row %d: logits differ by %g relative",
                      mdl_kv_dtype_name(dtype), i, md / mx);
    }
    for (int k = 0; k < 2; k++) {
        sched_stream_destroy(ks[k]);
        mdl_runtime_destroy(rt[k]);
        free(rows[k].logits);
    }
    return worst;
}

START_TEST(test_tp_kv_policy_stream)
{
    static const mdl_kv_dtype_t dtypes[] = {MDL_KV_F32, MDL_KV_INT8, MDL_KV_INT4,
                                            MDL_KV_FP8_E4M3};
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    mdl_model_t *m;
    synth_t s;
    char err[256];

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &m, err, sizeof(err)) == ST_OK, "%s", err);
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        double tol = tol_for(dtypes[d]);
        double w1 = run_stream(m, 2, dtypes[d], tol);

        synth_init(&s, 8, 2, 1);
        double w2 = run_stream(&s.m, 4, dtypes[d], tol);

        synth_fini(&s);
        synth_init(&s, 4, 1, 0);
        double w3 = run_stream(&s.m, 2, dtypes[d], tol);

        synth_fini(&s);
        printf("sink + window stream, %s KV: default model T=2 %.3g, synthetic 8/2 T=4 %.3g, "
               "4/1 T=2 %.3g\n",
               mdl_kv_dtype_name(dtypes[d]), w1, w2, w3);
    }
    mdl_model_destroy(m);
}
END_TEST

/* ---- one pool of every KV head against per-rank pools, bit for bit -------- */

#define PH_KV 2  /* KV heads of the whole pool; each part pool holds one */
#define PH_Q 4   /* query heads: GQA 2:1 */
#define PH_HD 16
#define PH_L 2
#define PH_NB 12
#define PH_NS 4

typedef struct pools {
    host_kv_t whole, part[PH_KV];
    float inv_freq[PH_HD / 2];
} pools_t;

/* The same new K/V rows into the whole pool and, head by head, into the
 * part pools, every layer; then attention of random queries on every
 * layer, whose outputs must agree bit for bit (a query head reads one KV
 * head, and a part pool holds exactly that head's codes and scales). */
static void
pools_step(pools_t *p, int32_t n_seqs, const int32_t *n_new, const int32_t *ctx,
           const int32_t *tables, const int32_t *slots)
{
    enum { MAXT = 32 };
    static float k[MAXT * PH_KV * PH_HD], v[MAXT * PH_KV * PH_HD], kp[MAXT * PH_HD],
        vp[MAXT * PH_HD], q[MAXT * PH_Q * PH_HD], qp[MAXT * PH_Q * PH_HD], out[MAXT * PH_Q * PH_HD],
        outp[MAXT * PH_Q * PH_HD];
    int32_t qs[8], n = 0;
    const int32_t qh = PH_Q / PH_KV; /* query heads per KV head */

    qs[0] = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        n += n_new[i];
        qs[i + 1] = n;
    }
    ck_assert_int_le(n, MAXT);
    for (int32_t l = 0; l < PH_L; l++) {
        for (int32_t i = 0; i < n * PH_KV * PH_HD; i++) {
            k[i] = ((float)(synth_rnd() & 0xffff) / 65536.0f - 0.5f) * (1.0f + (float)(i % PH_HD));
            v[i] = ((float)(synth_rnd() & 0xffff) / 65536.0f - 0.5f) * 2.0f;
        }
        host_kv_write(&p->whole, l, k, v, slots, n);
        for (int32_t h = 0; h < PH_KV; h++) {
            for (int32_t t = 0; t < n; t++) {
                memcpy(kp + (size_t)t * PH_HD, k + ((size_t)t * PH_KV + h) * PH_HD,
                       sizeof(float) * PH_HD);
                memcpy(vp + (size_t)t * PH_HD, v + ((size_t)t * PH_KV + h) * PH_HD,
                       sizeof(float) * PH_HD);
            }
            host_kv_write(&p->part[h], l, kp, vp, slots, n);
        }
    }
    for (int32_t l = 0; l < PH_L; l++) {
        for (int32_t i = 0; i < n * PH_Q * PH_HD; i++) {
            q[i] = (float)(synth_rnd() & 0xffff) / 65536.0f - 0.5f;
        }
        kn_attn_args_t aa = {
            .out = out,
            .q = q,
            .query_start = qs,
            .context_len = ctx,
            .block_tables = tables,
            .max_blocks = MAXB,
            .n_seqs = n_seqs,
            .n_tok = n,
            .n_heads = PH_Q,
            .n_kv_heads = PH_KV,
            .head_dim = PH_HD,
            .block_size = BS,
            .scale = 0.25f,
        };
        host_kv_attend(&p->whole, l, &aa);
        for (int32_t h = 0; h < PH_KV; h++) {
            size_t w = (size_t)qh * PH_HD;

            for (int32_t t = 0; t < n; t++) {
                memcpy(qp + (size_t)t * w, q + (size_t)t * PH_Q * PH_HD + h * w, sizeof(float) * w);
            }
            aa.out = outp;
            aa.q = qp;
            aa.n_heads = qh;
            aa.n_kv_heads = 1;
            host_kv_attend(&p->part[h], l, &aa);
            for (int32_t t = 0; t < n; t++) {
                ck_assert_msg(memcmp(outp + (size_t)t * w, out + (size_t)t * PH_Q * PH_HD + h * w,
                                     sizeof(float) * w) == 0,
                              "layer %d token %d KV head %d: attention differs", l, t, h);
            }
            aa.out = out;
            aa.q = q;
            aa.n_heads = PH_Q;
            aa.n_kv_heads = PH_KV;
        }
    }
    host_kv_end_step(&p->whole);
    for (int32_t h = 0; h < PH_KV; h++) {
        host_kv_end_step(&p->part[h]);
    }
}

static void
pools_ops(pools_t *p, const kv_op_t *ops, int32_t n)
{
    ck_assert_int_eq(host_kv_ops(&p->whole, ops, n), ST_OK);
    for (int32_t h = 0; h < PH_KV; h++) {
        ck_assert_int_eq(host_kv_ops(&p->part[h], ops, n), ST_OK);
    }
}

/* Every block of a tier: head h's slice of the whole pool's block equals
 * the part pool's block, codes and scales (and zero points) bit for bit;
 * f32 pools compare their rows. */
static void
pools_compare(const pools_t *p, int tier)
{
    int32_t nb = tier == 0 ? PH_NB : PH_NS;

    for (int32_t l = 0; l < PH_L; l++) {
        for (int kind = 0; kind < 2; kind++) {
            for (int32_t b = 0; b < nb; b++) {
                for (int32_t h = 0; h < PH_KV; h++) {
                    const host_kv_t *w = &p->whole, *q = &p->part[h];

                    if (w->kvq == NULL) {
                        float *wb = host_kv_region(tier == 0 ? w->kv : w->swap, nb, w->blk_floats,
                                                   l, kind) +
                                    (size_t)b * w->blk_floats + (size_t)h * BS * PH_HD;
                        float *qb = host_kv_region(tier == 0 ? q->kv : q->swap, nb, q->blk_floats,
                                                   l, kind) +
                                    (size_t)b * q->blk_floats;

                        ck_assert(memcmp(wb, qb, sizeof(float) * BS * PH_HD) == 0);
                        continue;
                    }
                    ck_assert_int_eq(kn_kvq_block_is_residual(w->kvq, tier, b),
                                     kn_kvq_block_is_residual(q->kvq, tier, b));
                    if (kn_kvq_block_is_residual(w->kvq, tier, b)) {
                        continue; /* no codes yet: compared through attention */
                    }
                    const kn_kvq_layout_t *lw = kn_kvq_store_layout(w->kvq);
                    const kn_kvq_layout_t *lq = kn_kvq_store_layout(q->kvq);
                    const uint8_t *wb = kn_kvq_block_ptr(w->kvq, tier, l, kind, b);
                    const uint8_t *qb = kn_kvq_block_ptr(q->kvq, tier, l, kind, b);
                    size_t codes = lq->data_bytes, meta = kind == 0 ? lq->k_meta : lq->v_meta;
                    size_t groups = kind == 0 ? PH_HD : BS; /* per head */
                    size_t arrays = meta / (groups * sizeof(uint16_t));

                    ck_assert_uint_eq(lw->data_bytes, PH_KV * codes);
                    ck_assert_msg(memcmp(wb + h * codes, qb, codes) == 0,
                                  "layer %d kind %d block %d head %d: codes differ", l, kind, b, h);
                    for (size_t a = 0; a < arrays; a++) {
                        const uint8_t *wm = wb + lw->data_bytes +
                                            (a * PH_KV + (size_t)h) * groups * sizeof(uint16_t);
                        const uint8_t *qm = qb + lq->data_bytes + a * groups * sizeof(uint16_t);

                        ck_assert_msg(memcmp(wm, qm, groups * sizeof(uint16_t)) == 0,
                                      "layer %d kind %d block %d head %d: scales differ", l, kind,
                                      b, h);
                    }
                }
            }
        }
    }
}

START_TEST(test_tp_kv_pools_bit_exact)
{
    static const mdl_kv_dtype_t dtypes[] = {MDL_KV_F32, MDL_KV_F16, MDL_KV_INT8, MDL_KV_INT4,
                                            MDL_KV_FP8_E4M3};
    mdl_config_t c = {.n_layers = PH_L, .n_heads = PH_Q, .n_kv_heads = PH_KV, .head_dim = PH_HD};
    char err[256];

    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        mdl_runtime_config_t rc = {.num_blocks = PH_NB,
                                   .swap_blocks = PH_NS,
                                   .block_size = BS,
                                   .max_num_batched_tokens = 32,
                                   .max_num_seqs = 4,
                                   .kv_dtype = dtypes[d]};
        pools_t p;

        synth_rs = 0x5eedULL + d;
        for (int32_t i = 0; i < PH_HD / 2; i++) {
            p.inv_freq[i] = powf(10000.0f, -2.0f * (float)i / PH_HD);
        }
        ck_assert_msg(host_kv_create(&p.whole, &c, 0, PH_KV, &rc, err, sizeof(err)) == ST_OK, "%s",
                      err);
        host_kv_set_rope(&p.whole, p.inv_freq);
        for (int32_t h = 0; h < PH_KV; h++) {
            ck_assert_msg(host_kv_create(&p.part[h], &c, h, 1, &rc, err, sizeof(err)) == ST_OK,
                          "%s", err);
            host_kv_set_rope(&p.part[h], p.inv_freq);
        }
        ck_assert((p.whole.kvq != NULL) == (dtypes[d] != MDL_KV_F32));

        /* Sequence A in blocks 1 2 3, B in 4 5: prefill chunks, decodes. */
        int32_t tables[2 * MAXB] = {1, 2, 3};
        int32_t done[2] = {0, 0};

        tables[MAXB] = 4;
        tables[MAXB + 1] = 5;
        int32_t script[][2] = {{13, 8}, {6, 3}, {1, 1}, {1, 0}};
        for (size_t st = 0; st < sizeof(script) / sizeof(script[0]); st++) {
            int32_t slots[32], n = 0, ctx[2], n_new[2], ns = 0;
            int32_t tb[2 * MAXB];

            for (int32_t sq = 0; sq < 2; sq++) {
                if (script[st][sq] == 0) {
                    continue;
                }
                for (int32_t i = 0; i < script[st][sq]; i++, n++) {
                    int32_t pos = done[sq] + i;

                    slots[n] = tables[sq * MAXB + pos / BS] * BS + pos % BS;
                }
                done[sq] += script[st][sq];
                ctx[ns] = done[sq];
                n_new[ns] = script[st][sq];
                memcpy(tb + ns * MAXB, tables + sq * MAXB, sizeof(int32_t) * MAXB);
                ns++;
            }
            pools_step(&p, ns, n_new, ctx, tb, slots);
        }
        pools_compare(&p, 0); /* A: 21 tokens, blocks 1 2 full; B: 12, block 4 full */

        /* Copy-on-write of A (two full blocks and the partial one), the
         * originals scribbled over; B swapped out, its device blocks
         * dropped, then swapped in to other ids; A's kept blocks shifted
         * as a sink + window eviction of block 1 would. */
        kv_op_t ops[] = {
            {KV_OP_COPY, 1, 6},     {KV_OP_COPY, 2, 7},     {KV_OP_COPY, 3, 8},
            {KV_OP_COPY, 4, 1},     {KV_OP_COPY, 4, 2},     {KV_OP_SWAP_OUT, 4, 0},
            {KV_OP_SWAP_OUT, 5, 1}, {KV_OP_DROP, 4, 4},     {KV_OP_DROP, 5, 5},
            {KV_OP_DROP, 3, 3},     {KV_OP_SWAP_IN, 0, 9},  {KV_OP_SWAP_IN, 1, 10},
            {KV_OP_DROP_SWAP, 0, 0}, {KV_OP_DROP_SWAP, 1, 1}, {KV_OP_SHIFT, 7, BS},
            {KV_OP_SHIFT, 8, BS},
        };
        pools_ops(&p, ops, 10); /* up to the swap-in: the swap tier holds B */
        pools_compare(&p, 1);
        pools_ops(&p, ops + 10, (int32_t)(sizeof(ops) / sizeof(ops[0])) - 10);
        pools_compare(&p, 0);

        /* Both continue from the new ids, A' = 6 7 8 (7 and 8 shifted)
         * and B' = 9 10: attention reads the copies, the swapped-in blocks
         * and the shifted keys (codes rotated on read, residual rows in
         * place). */
        tables[0] = 6;
        tables[1] = 7;
        tables[2] = 8;
        tables[MAXB] = 9;
        tables[MAXB + 1] = 10;
        int32_t more[][2] = {{5, 2}, {1, 1}};
        for (size_t st = 0; st < sizeof(more) / sizeof(more[0]); st++) {
            int32_t slots[32], n = 0, ctx[2], n_new[2] = {more[st][0], more[st][1]};

            for (int32_t sq = 0; sq < 2; sq++) {
                for (int32_t i = 0; i < more[st][sq]; i++, n++) {
                    int32_t pos = done[sq] + i;

                    slots[n] = tables[sq * MAXB + pos / BS] * BS + pos % BS;
                }
                done[sq] += more[st][sq];
                ctx[sq] = done[sq];
            }
            pools_step(&p, 2, n_new, ctx, tables, slots);
        }
        pools_compare(&p, 0);
        printf("KV pools, %s: whole pool and per-KV-head pools agree bit for bit\n",
               mdl_kv_dtype_name(dtypes[d]));
        host_kv_destroy(&p.whole);
        for (int32_t h = 0; h < PH_KV; h++) {
            host_kv_destroy(&p.part[h]);
        }
    }
}
END_TEST

START_TEST(test_tp_kv_quant_refusals)
{
    synth_t s;
    char err[256] = "";
    mdl_runtime_t *rt = NULL;
    mdl_runtime_config_t rc = {.num_blocks = 8, .block_size = BS, .kv_dtype = MDL_KV_INT4};

    /* int4 packs eight channels per word: head_dim 4 cannot, on any rank. */
    synth_init(&s, 4, 2, 0);
    s.m.cfg.head_dim = 4;
    for (int32_t tp = 1; tp <= 2; tp++) {
        rc.tp_size = tp;
        ck_assert_int_eq(mdl_runtime_create(&s.m, &rc, &rt, err, sizeof(err)), ST_EUNSUPPORTED);
        ck_assert_msg(strstr(err, "multiple of 8") != NULL, "%s", err);
        ck_assert(rt == NULL);
    }
    /* int8 groups any even head_dim; T = 2 runs it. */
    rc.kv_dtype = MDL_KV_INT8;
    ck_assert_msg(mdl_runtime_create(&s.m, &rc, &rt, err, sizeof(err)) == ST_OK, "%s", err);
    mdl_runtime_destroy(rt);
    synth_fini(&s);
}
END_TEST

START_TEST(test_tp_shard_plan)
{
    mdl_config_t c = {.n_heads = 6, .n_kv_heads = 2, .ffn_dim = 512, .head_dim = 32};
    mdl_tp_shard_t sh;
    char err[256];

    ck_assert_int_eq(mdl_tp_shard(&c, 2, 1, &sh, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(sh.q0, 3);
    ck_assert_int_eq(sh.n_q, 3);
    ck_assert_int_eq(sh.kv0, 1);
    ck_assert_int_eq(sh.n_kv, 1);
    ck_assert_int_eq(sh.f0, 256);
    ck_assert_int_eq(sh.n_f, 256);
    c.n_kv_heads = 1;
    c.n_heads = 8;
    for (int32_t r = 0; r < 4; r++) {
        ck_assert_int_eq(mdl_tp_shard(&c, 4, r, &sh, err, sizeof(err)), ST_OK);
        ck_assert_int_eq(sh.kv0, 0); /* replicated */
        ck_assert_int_eq(sh.n_kv, 1);
        ck_assert_int_eq(sh.q0, 2 * r);
    }
    c.n_kv_heads = 4;
    ck_assert_int_eq(mdl_tp_shard(&c, 8, 5, &sh, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(sh.kv0, 2); /* query head 5 of group 2 reads KV head 2 */
    c.n_kv_heads = 2;
    c.n_heads = 6;
    ck_assert_int_eq(mdl_tp_shard(&c, 4, 0, &sh, err, sizeof(err)), ST_EUNSUPPORTED);
    ck_assert(strstr(err, "does not divide") != NULL);
    c.n_heads = 6;
    c.n_kv_heads = 2;
    c.ffn_dim = 510;
    ck_assert_int_eq(mdl_tp_shard(&c, 3, 0, &sh, err, sizeof(err)), ST_EUNSUPPORTED);
}
END_TEST

START_TEST(test_tp_runtime_rejects_bad_split)
{
    synth_t s;
    char err[256];
    mdl_runtime_t *rt = NULL;
    mdl_runtime_config_t rc = {.num_blocks = 8, .tp_size = 3};

    synth_init(&s, 4, 2, 0);
    ck_assert_int_eq(mdl_runtime_create(&s.m, &rc, &rt, err, sizeof(err)), ST_EUNSUPPORTED);
    ck_assert(strstr(err, "tensor parallel size 3") != NULL);
    ck_assert(rt == NULL);
    synth_fini(&s);
}
END_TEST

/* ---- the all-reduce itself ------------------------------------------------------ */

typedef struct ar_arg {
    kn_comm_t *comm;
    float *bufs[4];
    size_t n;
} ar_arg_t;

static int
ar_rank(void *p, int r)
{
    ar_arg_t *a = p;

    for (int rep = 0; rep < 50; rep++) {
        for (size_t i = 0; i < a->n; i++) {
            a->bufs[r][i] = (float)(r + 1) * (float)(i % 7) + (float)rep;
        }
        kn_comm_allreduce_sum(a->comm, r, a->bufs[r], a->n);
        for (size_t i = 0; i < a->n; i++) {
            /* (1+2+3+4) * (i % 7) + 4 * rep */
            if (a->bufs[r][i] != 10.0f * (float)(i % 7) + 4.0f * (float)rep) {
                return ST_EINVAL;
            }
        }
    }
    return r == 2 ? ST_ERANGE : ST_OK; /* a failing rank's status comes back */
}

START_TEST(test_comm_allreduce)
{
    kn_ranks_t *ranks;
    ar_arg_t a = {.n = 1003};

    ck_assert_int_eq(kn_comm_create(4, &a.comm), ST_OK);
    ck_assert_int_eq(kn_comm_size(a.comm), 4);
    ck_assert_int_eq(kn_ranks_create(4, &ranks), ST_OK);
    for (int r = 0; r < 4; r++) {
        a.bufs[r] = xmalloc(sizeof(float) * a.n);
    }
    for (int rep = 0; rep < 3; rep++) {
        ck_assert_int_eq(kn_ranks_run(ranks, ar_rank, &a), ST_ERANGE);
    }
    for (int r = 0; r < 4; r++) {
        free(a.bufs[r]);
    }
    kn_ranks_destroy(ranks);
    kn_comm_destroy(a.comm);
}
END_TEST

Suite *
cuda_tp_suite(void)
{
    Suite *s = suite_create("tp_cpu");
    TCase *tc = tcase_create("tp");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_comm_allreduce);
    tcase_add_test(tc, test_tp_shard_plan);
    tcase_add_test(tc, test_tp_runtime_rejects_bad_split);
    tcase_add_test(tc, test_tp_synthetic);
    tcase_add_test(tc, test_tp_default_model);
    tcase_add_test(tc, test_tp_default_model_q4k);
    tcase_add_test(tc, test_tp_default_model_q6k);
    tcase_add_test(tc, test_tp_kv_quant_refusals);
    tcase_add_test(tc, test_tp_kv_pools_bit_exact);
    tcase_add_test(tc, test_tp_kv_quant_synthetic);
    tcase_add_test(tc, test_tp_kv_quant_default_model);
    tcase_add_test(tc, test_tp_kv_policy_stream);
    suite_add_tcase(s, tc);
    return s;
}
