/* test_tp.c - tensor parallelism on the CPU backend (model/forward_tp.c):
 * the same steps run at T = 1 and at T = 2 (and 4) must give the same
 * logits within 1e-5 relative (max |diff| / max |logit| per step), through
 * chunked prefill, batched decodes, and KV copies and swaps (the KV block
 * ids are shared by every rank, each rank holding its heads' slice).
 *
 * Models: the default model (6 heads, 2 KV heads: one KV head per rank at
 * T = 2) from KVSERVE_TEST_MODEL, and small synthetic in-memory models
 * with 1 KV head (replicated on every rank), with 4 KV heads, and with
 * QKV biases (Qwen2), built here from model_int.h.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"
#include "model/model.h"
#include "model/model_int.h"
#include "model/tp.h"

#define BS 8
#define NBLK 64
#define SWAPB 16
#define MAXB 16
#define NSEQ 3

static uint64_t rs;

static uint32_t
rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

/* ---- a synthetic model ------------------------------------------------------ */

typedef struct synth {
    mdl_model_t m;
    float *buf;
} synth_t;

static float *
synth_take(float **p, size_t n, float scale)
{
    float *r = *p;

    for (size_t i = 0; i < n; i++) {
        r[i] = ((float)(rnd() & 0xffff) / 65536.0f * 2.0f - 1.0f) * scale;
    }
    *p += n;
    return r;
}

static void
synth_init(synth_t *s, int32_t n_heads, int32_t n_kv, int bias)
{
    mdl_config_t *c = &s->m.cfg;
    size_t total;
    float *p;

    memset(s, 0, sizeof(*s));
    rs = 0x1234567890abcdefULL + (uint64_t)n_kv;
    snprintf(c->arch, sizeof(c->arch), "llama");
    c->vocab_size = 97;
    c->head_dim = 8;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv;
    c->dim = 40;
    c->n_layers = 2;
    c->ffn_dim = 64;
    c->max_pos = 128;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->qkv_bias = bias;
    c->bos_id = 1;
    int32_t qd = n_heads * c->head_dim, kvd = n_kv * c->head_dim;

    total = (size_t)c->vocab_size * c->dim * 2 + c->dim +
            (size_t)c->n_layers *
                ((size_t)qd * c->dim + 2 * (size_t)kvd * c->dim + qd + 2 * kvd +
                 (size_t)c->dim * qd + 2 * (size_t)c->dim + 3 * (size_t)c->ffn_dim * c->dim);
    s->buf = xmalloc(sizeof(float) * total);
    p = s->buf;
    s->m.tok_embd = synth_take(&p, (size_t)c->vocab_size * c->dim, 1.0f);
    s->m.lm_head = synth_take(&p, (size_t)c->vocab_size * c->dim, 0.3f);
    s->m.out_norm = synth_take(&p, (size_t)c->dim, 1.0f);
    s->m.layers = xcalloc((size_t)c->n_layers, sizeof(mdl_layer_t));
    for (int32_t l = 0; l < c->n_layers; l++) {
        mdl_layer_t *L = &s->m.layers[l];

        L->attn_norm = synth_take(&p, (size_t)c->dim, 1.0f);
        L->ffn_norm = synth_take(&p, (size_t)c->dim, 1.0f);
        L->wq = synth_take(&p, (size_t)qd * c->dim, 0.3f);
        L->wk = synth_take(&p, (size_t)kvd * c->dim, 0.3f);
        L->wv = synth_take(&p, (size_t)kvd * c->dim, 0.3f);
        L->bq = synth_take(&p, (size_t)qd, 0.2f);
        L->bk = synth_take(&p, (size_t)kvd, 0.2f);
        L->bv = synth_take(&p, (size_t)kvd, 0.2f);
        if (!bias) {
            L->bq = L->bk = L->bv = NULL;
        }
        L->wo = synth_take(&p, (size_t)c->dim * qd, 0.2f);
        L->w_gate = synth_take(&p, (size_t)c->ffn_dim * c->dim, 0.2f);
        L->w_up = synth_take(&p, (size_t)c->ffn_dim * c->dim, 0.2f);
        L->w_down = synth_take(&p, (size_t)c->dim * c->ffn_dim, 0.2f);
    }
}

static void
synth_fini(synth_t *s)
{
    free(s->m.layers);
    free(s->buf);
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
    double worst;
} pair_t;

/* One step for both runtimes; n_new[s] tokens of each sequence. */
static void
step(pair_t *p, tseq_t *seqs, const int32_t *n_new)
{
    int32_t tok[256], pos[256], slot[256], qs[NSEQ + 1], ctx[NSEQ], bt[NSEQ * MAXB], rows[NSEQ];
    int32_t n = 0, ns = 0;
    const float *l1, *lt;

    qs[0] = 0;
    for (int32_t s = 0; s < NSEQ; s++) {
        if (n_new[s] == 0) {
            continue;
        }
        tseq_t *q = &seqs[s];

        for (int32_t i = 0; i < n_new[s]; i++) {
            int32_t ix = q->done + i;

            tok[n] = q->ids[ix];
            pos[n] = ix;
            slot[n] = q->table[ix / BS] * BS + ix % BS;
            n++;
        }
        q->done += n_new[s];
        ctx[ns] = q->done;
        memcpy(bt + ns * MAXB, q->table, sizeof(q->table));
        rows[ns] = n - 1;
        qs[++ns] = n;
    }
    mdl_batch_t b = {
        .n_tokens = n,
        .tokens = tok,
        .positions = pos,
        .slot_mapping = slot,
        .n_seqs = ns,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = MAXB,
        .logits_rows = rows,
        .n_logits = ns,
    };

    ck_assert_int_eq(mdl_forward(p->one, &b, &l1), ST_OK);
    ck_assert_int_eq(mdl_forward(p->many, &b, &lt), ST_OK);
    double mx = 0.0, md = 0.0;

    for (size_t i = 0; i < (size_t)ns * p->vocab; i++) {
        mx = fmax(mx, fabs(l1[i]));
        md = fmax(md, fabs((double)l1[i] - lt[i]));
    }
    ck_assert(mx > 0.0);
    if (md / mx > p->worst) {
        p->worst = md / mx;
    }
    ck_assert_msg(md / mx <= 1e-5, "logits differ by %g relative", md / mx);
}

static void
kv_ops(pair_t *p, const kv_op_t *ops, int32_t n)
{
    ck_assert_int_eq(mdl_runtime_kv_ops(p->one, ops, n), ST_OK);
    ck_assert_int_eq(mdl_runtime_kv_ops(p->many, ops, n), ST_OK);
}

/* Chunked prefill of three sequences, batched decodes, a copy-on-write
 * style copy of a whole sequence, and a swap out and back in to other
 * blocks, comparing T = 1 and T = tp at every step. */
static double
run_script(const mdl_model_t *m, int32_t tp)
{
    char err[256];
    mdl_runtime_config_t rc = {.num_blocks = NBLK,
                               .swap_blocks = SWAPB,
                               .block_size = BS,
                               .max_num_batched_tokens = 64,
                               .max_num_seqs = NSEQ,
                               .max_blocks_per_seq = MAXB,
                               .n_threads = 1};
    pair_t p = {.vocab = m->cfg.vocab_size};
    tseq_t seqs[NSEQ];
    int32_t next_blk = 1;

    ck_assert_int_eq(mdl_runtime_create(m, &rc, &p.one, err, sizeof(err)), ST_OK);
    rc.tp_size = tp;
    ck_assert_msg(mdl_runtime_create(m, &rc, &p.many, err, sizeof(err)) == ST_OK, "%s", err);

    rs = 0xfeedULL + (uint64_t)tp;
    for (int32_t s = 0; s < NSEQ; s++) {
        memset(&seqs[s], 0, sizeof(seqs[s]));
        seqs[s].n_ids = 60;
        for (int32_t i = 0; i < seqs[s].n_ids; i++) {
            seqs[s].ids[i] = 3 + (int32_t)(rnd() % (uint32_t)(p.vocab - 3));
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
    double worst = run_script(m, 2);

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
        double worst = run_script(&s.m, cases[i][3]);

        printf("synthetic %d heads / %d KV heads%s, T=%d: max relative difference %.3g\n",
               cases[i][0], cases[i][1], cases[i][2] ? " + bias" : "", cases[i][3], worst);
        synth_fini(&s);
    }
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
    suite_add_tcase(s, tc);
    return s;
}
