/* test_forward.c - the forward pass on the default model: every way of
 * feeding the same tokens (paged vs contiguous blocks, all at once vs
 * prefill then decode vs chunked prefill, batched with other sequences vs
 * alone, after KV copies and swaps) must give the same logits; and the
 * runtime rejects bad configurations and batches.
 *
 * The model directory comes from KVSERVE_TEST_MODEL (set by meson).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/model.h"

#define BS 16
#define NBLK 160
#define MAXB 16 /* blocks per sequence: 256 tokens, the model's context */
#define MAXT 256
#define SWAPB 32

static mdl_model_t *model;
static mdl_runtime_t *rt;
static int32_t vocab;

/* A test sequence: its tokens, how many are in the KV cache, its blocks. */
typedef struct tseq {
    int32_t ids[MAXT];
    int32_t n_ids;
    int32_t done;
    int32_t table[MAXB];
    int32_t n_blocks;
} tseq_t;

/* Block ids handed out in order from a list: shuffled (paged) or 1, 2, ... */
static int32_t blk_list[NBLK];
static int32_t blk_next;

static uint64_t rs = 88172645463325252ULL;

static uint32_t
rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

static void
blocks_reset(int shuffled)
{
    for (int32_t i = 0; i < NBLK - 1; i++) {
        blk_list[i] = i + 1; /* block 0 is the null block: never used */
    }
    if (shuffled) {
        for (int32_t i = NBLK - 2; i > 0; i--) {
            int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = blk_list[i];

            blk_list[i] = blk_list[j];
            blk_list[j] = t;
        }
    }
    blk_next = 0;
}

static void
seq_init(tseq_t *s, uint32_t seed, int32_t n)
{
    memset(s, 0, sizeof(*s));
    rs = 0x2545F4914F6CDD1DULL * (seed + 1);
    s->ids[0] = 1; /* BOS */
    for (int32_t i = 1; i < n; i++) {
        s->ids[i] = 3 + (int32_t)(rnd() % (uint32_t)(vocab - 3));
    }
    s->n_ids = n;
}

static void
setup(void)
{
    const char *dir = getenv("KVSERVE_TEST_MODEL");
    char err[256] = "";
    mdl_runtime_config_t rc = {
        .block_size = BS,
        .num_blocks = NBLK,
        .swap_blocks = SWAPB,
        .max_num_batched_tokens = MAXT * 4,
        .max_num_seqs = MAXT * 4,
        .max_blocks_per_seq = MAXB,
    };

    ck_assert_msg(dir != NULL, "KVSERVE_TEST_MODEL is not set");
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "%s", err);
    vocab = mdl_model_config(model)->vocab_size;
    ck_assert_msg(mdl_runtime_create(model, &rc, &rt, err, sizeof(err)) == ST_OK, "%s", err);
}

static void
teardown(void)
{
    mdl_runtime_destroy(rt);
    mdl_model_destroy(model);
}

/* When set, the next step() asks for logits of these rows only. */
static const int32_t *step_rows;
static int32_t step_n_rows;
/* When set, the next step() also asks for the hidden state of these rows
 * and copies it to step_hidden_out[n][dim]. */
static const int32_t *step_hidden;
static int32_t step_n_hidden;
static float *step_hidden_out;

/* One step: seqs[i] feeds its next n_new[i] tokens. Every token row gets
 * logits (or step_rows, when set); they are copied to out[row][vocab]
 * when out is not NULL. */
static void
step(tseq_t **seqs, const int32_t *n_new, int32_t n, float *out)
{
    static int32_t tok[MAXT * 4], pos[MAXT * 4], slot[MAXT * 4], rows[MAXT * 4];
    static int32_t qs[MAXT * 4 + 1], ctx[MAXT * 4], bt[MAXT * 4 * MAXB];
    int32_t T = 0;
    const float *lg;

    qs[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        tseq_t *s = seqs[i];

        for (int32_t j = 0; j < n_new[i]; j++) {
            int32_t p = s->done + j;

            while (p / BS >= s->n_blocks) {
                ck_assert_int_lt(blk_next, NBLK - 1);
                s->table[s->n_blocks++] = blk_list[blk_next++];
            }
            tok[T] = s->ids[p];
            pos[T] = p;
            slot[T] = s->table[p / BS] * BS + p % BS;
            rows[T] = T;
            T++;
        }
        s->done += n_new[i];
        qs[i + 1] = T;
        ctx[i] = s->done;
        memcpy(bt + (size_t)i * MAXB, s->table, sizeof(s->table));
    }
    mdl_batch_t b = {
        .n_tokens = T,
        .tokens = tok,
        .positions = pos,
        .slot_mapping = slot,
        .n_seqs = n,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = MAXB,
        .logits_rows = rows,
        .n_logits = T,
    };
    if (step_rows != NULL) {
        b.logits_rows = step_rows;
        b.n_logits = step_n_rows;
    }
    b.hidden_rows = step_hidden;
    b.n_hidden = step_n_hidden;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_OK);
    if (step_n_hidden > 0) {
        const float *h = mdl_runtime_hidden(rt);
        ck_assert(h != NULL);
        memcpy(step_hidden_out, h,
               sizeof(float) * (size_t)step_n_hidden * (size_t)mdl_model_config(model)->dim);
    }
    if (out != NULL) {
        memcpy(out, lg, sizeof(float) * (size_t)b.n_logits * vocab);
    }
}

/* All rows of a sequence, fed in chunks of `chunk` tokens. */
static float *
run_chunked(tseq_t *s, int32_t chunk)
{
    float *out = malloc(sizeof(float) * (size_t)s->n_ids * vocab);

    while (s->done < s->n_ids) {
        int32_t n = s->n_ids - s->done < chunk ? s->n_ids - s->done : chunk;
        int32_t at = s->done;

        step(&s, &n, 1, out + (size_t)at * vocab);
    }
    return out;
}

static double
max_rel(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 1e-9;

    for (size_t i = 0; i < n; i++) {
        ck_assert(isfinite(a[i]) && isfinite(b[i]));
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / den;
}

START_TEST(test_paged_vs_contiguous)
{
    tseq_t s;
    float *a, *b;

    blocks_reset(0);
    seq_init(&s, 1, 150);
    a = run_chunked(&s, 150);
    blocks_reset(1);
    seq_init(&s, 1, 150);
    b = run_chunked(&s, 150);
    ck_assert(s.table[0] != 1 || s.table[1] != 2); /* really non-contiguous */
    ck_assert_double_lt(max_rel(b, a, (size_t)150 * vocab), 1e-5);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_prefill_then_decode)
{
    tseq_t s;
    float *all, *dec;

    blocks_reset(1);
    seq_init(&s, 2, 90);
    all = run_chunked(&s, 90);
    /* Prefill 40, then decode one token per step. */
    blocks_reset(1);
    seq_init(&s, 2, 90);
    dec = malloc(sizeof(float) * (size_t)90 * vocab);
    {
        int32_t n = 40;
        tseq_t *sp = &s;

        step(&sp, &n, 1, dec);
        while (s.done < s.n_ids) {
            int32_t one = 1, at = s.done;

            step(&sp, &one, 1, dec + (size_t)at * vocab);
        }
    }
    ck_assert_double_lt(max_rel(dec, all, (size_t)90 * vocab), 1e-5);
    free(all);
    free(dec);
}
END_TEST

START_TEST(test_chunked_prefill)
{
    int32_t chunks[] = {1, 5, 16, 37};
    tseq_t s;
    float *all;

    blocks_reset(1);
    seq_init(&s, 3, 120);
    all = run_chunked(&s, 120);
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        float *c;

        blocks_reset(1);
        seq_init(&s, 3, 120);
        c = run_chunked(&s, chunks[i]);
        ck_assert_msg(max_rel(c, all, (size_t)120 * vocab) < 1e-5, "chunk %d", chunks[i]);
        free(c);
    }
    free(all);
}
END_TEST

START_TEST(test_batch_vs_alone)
{
    enum { N = 5 };
    int32_t len[N] = {60, 33, 100, 7, 48};
    tseq_t seqs[N], *sp[N];
    float *alone[N];

    for (int i = 0; i < N; i++) {
        blocks_reset(1);
        seq_init(&seqs[i], 10 + (uint32_t)i, len[i]);
        alone[i] = run_chunked(&seqs[i], len[i]);
    }
    /* Batched: staggered prefill chunks mixed with decodes, every step. */
    blocks_reset(1);
    for (int i = 0; i < N; i++) {
        seq_init(&seqs[i], 10 + (uint32_t)i, len[i]);
    }
    float *buf = malloc(sizeof(float) * (size_t)MAXT * 4 * vocab);
    for (int round = 0;; round++) {
        int32_t n_new[N], n = 0, row = 0;
        int idx[N];

        for (int i = 0; i < N; i++) {
            int32_t left = seqs[i].n_ids - seqs[i].done;
            int32_t want = seqs[i].done == 0 ? 13 + 7 * i : 1; /* chunk, then decode */

            if (left > 0 && round >= i / 2) {
                idx[n] = i;
                n_new[n] = want < left ? want : left;
                sp[n++] = &seqs[i];
            }
        }
        if (n == 0) {
            if (round > N) {
                break;
            }
            continue;
        }
        int32_t at[N];
        for (int k = 0; k < n; k++) {
            at[k] = sp[k]->done;
        }
        step(sp, n_new, n, buf);
        for (int k = 0; k < n; k++) {
            double e = max_rel(buf + (size_t)row * vocab, alone[idx[k]] + (size_t)at[k] * vocab,
                               (size_t)n_new[k] * vocab);

            ck_assert_msg(e < 1e-5, "seq %d at %d: %g", idx[k], at[k], e);
            row += n_new[k];
        }
    }
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(seqs[i].done, len[i]);
        free(alone[i]);
    }
    free(buf);
}
END_TEST

/* Logits for a few rows (unsorted, not only last tokens) equal those rows
 * of an all-rows run: the last layer's row-subset path. */
START_TEST(test_logits_subset)
{
    int32_t len[3] = {30, 9, 17}, n_new[3] = {30, 9, 17};
    int32_t rows[4] = {55, 29, 33, 0}; /* seq 2 last, seq 0 last, seq 1 middle, first */
    tseq_t seqs[3], *sp[3] = {&seqs[0], &seqs[1], &seqs[2]};
    float *all = malloc(sizeof(float) * 56 * (size_t)vocab);
    float *few = malloc(sizeof(float) * 4 * (size_t)vocab);

    for (int variant = 0; variant < 2; variant++) {
        blocks_reset(1);
        for (int i = 0; i < 3; i++) {
            seq_init(&seqs[i], 20 + (uint32_t)i, len[i]);
        }
        step_rows = variant ? rows : NULL;
        step_n_rows = variant ? 4 : 0;
        step(sp, n_new, 3, variant ? few : all);
        step_rows = NULL;
    }
    for (int i = 0; i < 4; i++) {
        double e = max_rel(few + (size_t)i * vocab, all + (size_t)rows[i] * vocab, (size_t)vocab);

        ck_assert_msg(e < 1e-5, "row %d: %g", rows[i], e);
    }
    free(all);
    free(few);
}
END_TEST

/* Embeddings: the final hidden states of a prompt's rows are the same in
 * one step and in prefill chunks, and asking for them leaves the logits
 * as they were (the last layer then runs on every row). */
START_TEST(test_hidden_rows)
{
    const int32_t n = 40, dim = mdl_model_config(model)->dim;
    int32_t rows[40], last = n - 1;
    tseq_t s;
    float *one = malloc(sizeof(float) * (size_t)n * (size_t)dim);
    float *chunked = malloc(sizeof(float) * (size_t)n * (size_t)dim);
    float *lg_plain = malloc(sizeof(float) * (size_t)vocab);
    float *lg_hidden = malloc(sizeof(float) * (size_t)vocab);

    for (int32_t i = 0; i < n; i++) {
        rows[i] = i;
    }
    ck_assert(mdl_runtime_has_hidden(rt));
    /* Logits of the last row only (the sub-batch path), without hidden. */
    blocks_reset(1);
    seq_init(&s, 7, n);
    step_rows = &last;
    step_n_rows = 1;
    {
        tseq_t *sp = &s;
        int32_t nn = n;
        step(&sp, &nn, 1, lg_plain);
        /* The same with every row's hidden state. */
        blocks_reset(1);
        seq_init(&s, 7, n);
        step_hidden = rows;
        step_n_hidden = n;
        step_hidden_out = one;
        step(&sp, &nn, 1, lg_hidden);
    }
    ck_assert_msg(max_rel(lg_hidden, lg_plain, (size_t)vocab) < 1e-5, "logits moved");
    /* Chunks of 7: each step asks for its own rows. */
    blocks_reset(1);
    seq_init(&s, 7, n);
    step_rows = NULL;
    while (s.done < n) {
        int32_t k = n - s.done < 7 ? n - s.done : 7;
        int32_t at = s.done;
        tseq_t *sp = &s;
        step_n_hidden = k;
        step_hidden_out = chunked + (size_t)at * (size_t)dim;
        step(&sp, &k, 1, NULL);
    }
    step_hidden = NULL;
    step_n_hidden = 0;
    double e = max_rel(chunked, one, (size_t)n * (size_t)dim);
    ck_assert_msg(e < 1e-5, "chunked hidden rows differ: %g", e);
    /* After the final RMSNorm no row is zero. */
    double norm = 0.0;
    for (int32_t j = 0; j < dim; j++) {
        norm += (double)one[(size_t)last * dim + j] * one[(size_t)last * dim + j];
    }
    ck_assert(norm > 0.0 && isfinite(norm));
    /* A hidden row out of range is refused. */
    {
        int32_t bad = n;
        const float *lg;
        int32_t tok = 1, pos = 0, slot = BS, qs[2] = {0, 1}, ctx = 1, bt[MAXB] = {1};
        mdl_batch_t b = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .slot_mapping = &slot,
                         .n_seqs = 1, .query_start = qs, .context_len = &ctx, .block_tables = bt,
                         .max_blocks = MAXB, .hidden_rows = &bad, .n_hidden = 1};
        ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    }
    free(one);
    free(chunked);
    free(lg_plain);
    free(lg_hidden);
}
END_TEST

START_TEST(test_kv_copy_and_swap)
{
    tseq_t s, fork;
    float *ref, out_a[1024], out_b[1024];

    ck_assert_int_le(vocab, 1024);
    /* Reference: 40 tokens straight through. */
    blocks_reset(1);
    seq_init(&s, 4, 40);
    ref = run_chunked(&s, 40);

    /* 39 tokens in, fork the last (partial) block by COPY, then both the
     * original and the fork decode token 39 and must agree with ref. */
    blocks_reset(1);
    seq_init(&s, 4, 40);
    s.n_ids = 39;
    free(run_chunked(&s, 39));
    s.n_ids = 40;
    fork = s;
    fork.table[2] = blk_list[blk_next++];
    kv_op_t cp = {KV_OP_COPY, s.table[2], fork.table[2]};
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, &cp, 1), ST_OK);
    {
        tseq_t *sp = &fork;
        int32_t one = 1;

        step(&sp, &one, 1, out_a);
    }
    ck_assert_double_lt(max_rel(out_a, ref + (size_t)39 * vocab, (size_t)vocab), 1e-5);

    /* Swap the original's blocks out, scribble over them (another seq
     * reuses them), swap back in to new blocks, decode: same logits. */
    kv_op_t out_ops[3], in_ops[3];
    for (int i = 0; i < 3; i++) {
        out_ops[i] = (kv_op_t){KV_OP_SWAP_OUT, s.table[i], 5 + i};
    }
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, out_ops, 3), ST_OK);
    {
        tseq_t other;
        int32_t n = 40;
        tseq_t *op = &other;

        seq_init(&other, 99, 40);
        memcpy(other.table, s.table, sizeof(int32_t) * 3);
        other.n_blocks = 3;
        step(&op, &n, 1, NULL);
    }
    for (int i = 0; i < 3; i++) {
        s.table[i] = blk_list[blk_next++];
        in_ops[i] = (kv_op_t){KV_OP_SWAP_IN, 5 + i, s.table[i]};
    }
    ck_assert_int_eq(mdl_runtime_kv_ops(rt, in_ops, 3), ST_OK);
    {
        tseq_t *sp = &s;
        int32_t one = 1;

        step(&sp, &one, 1, out_b);
    }
    ck_assert_double_lt(max_rel(out_b, ref + (size_t)39 * vocab, (size_t)vocab), 1e-5);

    /* Out-of-range ops change nothing and fail. */
    kv_op_t bad[] = {{KV_OP_COPY, 0, NBLK},
                     {KV_OP_SWAP_OUT, 1, SWAPB},
                     {KV_OP_SWAP_IN, -1, 2},
                     {(kv_op_kind_t)7, 1, 2}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(mdl_runtime_kv_ops(rt, &bad[i], 1), ST_EINVAL);
    }
    free(ref);
}
END_TEST

START_TEST(test_bad_batches)
{
    int32_t tok[2] = {1, 5}, pos[2] = {0, 1}, slot[2] = {16, 17}, qs[2] = {0, 2}, ctx[1] = {2};
    int32_t bt[MAXB] = {1}, rows[1] = {1};
    mdl_batch_t good = {
        .n_tokens = 2,
        .tokens = tok,
        .positions = pos,
        .slot_mapping = slot,
        .n_seqs = 1,
        .query_start = qs,
        .context_len = ctx,
        .block_tables = bt,
        .max_blocks = MAXB,
        .logits_rows = rows,
        .n_logits = 1,
    };
    mdl_batch_t b;
    const float *lg;

    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_OK);
    tok[1] = vocab;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    tok[1] = 5;
    slot[1] = NBLK * BS;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    slot[1] = 17;
    bt[0] = NBLK;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    bt[0] = 1;
    ctx[0] = 1; /* fewer than the new tokens */
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    ctx[0] = MAXB * BS + 1;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    ctx[0] = 2;
    rows[0] = 2;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    rows[0] = 1;
    b = good;
    b.n_tokens = 0;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    b = good;
    b.n_tokens = MAXT * 4 + 1;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    b = good;
    b.max_blocks = MAXB + 1;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    qs[1] = 1;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_EINVAL);
    qs[1] = 2;
    ck_assert_int_eq(mdl_forward(rt, &good, &lg), ST_OK);

    /* Persistent table rows (issue 15): the same step through row 1 of a
     * two-row array gives the same logits; a row out of range, a dirty run
     * out of its row or naming a block out of range is refused. */
    float *want = malloc(sizeof(float) * (size_t)vocab);
    memcpy(want, lg, sizeof(float) * (size_t)vocab);
    int32_t pbt[2 * MAXB] = {0}, prow[1] = {1};
    mdl_table_run_t run = {.row = 1, .first = 0, .count = 1};
    pbt[MAXB] = 1;
    b = good;
    b.block_tables = pbt;
    b.table_rows = prow;
    b.table_dirty = &run;
    b.n_table_dirty = 1;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_OK);
    ck_assert_int_eq(memcmp(want, lg, sizeof(float) * (size_t)vocab), 0);
    b.n_table_dirty = 0; /* nothing changed since */
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_OK);
    ck_assert_int_eq(memcmp(want, lg, sizeof(float) * (size_t)vocab), 0);
    b.n_table_dirty = 1;
    prow[0] = 1 << 20;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    prow[0] = 1;
    run.count = MAXB + 1;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    run.count = 1;
    pbt[MAXB] = NBLK;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_EINVAL);
    pbt[MAXB] = 1;
    ck_assert_int_eq(mdl_forward(rt, &b, &lg), ST_OK);
    free(want);
}
END_TEST

START_TEST(test_runtime_config_errors)
{
    char err[256];
    mdl_runtime_t *r2 = NULL;
    mdl_runtime_config_t rc = {.num_blocks = 8};

    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_OK);
    mdl_runtime_destroy(r2);
    rc.device = "cuda";
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_ENODEV);
    ck_assert(strstr(err, "cuda") != NULL);
    rc.device = "tpu";
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_EINVAL);
    rc.device = NULL;
    rc.tp_size = 4; /* 6 heads do not split over 4 ranks (tests/cuda/test_tp.c) */
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_EUNSUPPORTED);
    rc.tp_size = 2; /* compressed KV blocks under tensor parallelism (tests/cuda/test_tp.c) */
    rc.kv_dtype = MDL_KV_INT8;
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_OK);
    mdl_runtime_destroy(r2);
    rc.tp_size = 1;
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_OK);
    mdl_runtime_destroy(r2);
    rc.kv_dtype = MDL_KV_AUTO;
    rc.num_blocks = 1;
    ck_assert_int_eq(mdl_runtime_create(model, &rc, &r2, err, sizeof(err)), ST_EINVAL);

    /* 6 layers x 2 KV heads x 32 dims x 16 tokens x K,V x 4 bytes. */
    ck_assert_uint_eq(mdl_kv_block_bytes(mdl_model_config(model), 16, MDL_KV_F32),
                      6 * 2 * 32 * 16 * 2 * 4);
    ck_assert_uint_eq(mdl_kv_block_bytes(mdl_model_config(model), 16, MDL_KV_BF16),
                      6 * 2 * 32 * 16 * 2 * 2);
}
END_TEST

Suite *
model_forward_suite(void)
{
    Suite *s = suite_create("model_forward");
    TCase *tc = tcase_create("forward");

    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_paged_vs_contiguous);
    tcase_add_test(tc, test_prefill_then_decode);
    tcase_add_test(tc, test_chunked_prefill);
    tcase_add_test(tc, test_batch_vs_alone);
    tcase_add_test(tc, test_logits_subset);
    tcase_add_test(tc, test_hidden_rows);
    tcase_add_test(tc, test_kv_copy_and_swap);
    tcase_add_test(tc, test_bad_batches);
    tcase_add_test(tc, test_runtime_config_errors);
    suite_add_tcase(s, tc);
    return s;
}
