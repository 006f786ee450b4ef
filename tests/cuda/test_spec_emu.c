/* test_spec_emu.c - speculative decoding (scheduler/spec.h, spec_draft.h)
 * on the CUDA backend's forward pass over emulated device operations
 * (tests/cuda/dev_emu.h), in the CPU build.
 *
 * A verification step is an ordinary varlen batch in which a speculating
 * sequence has 1 + k query tokens and 1 + k logits rows, so the CUDA
 * backend verifies by computing more logits rows: the engine sizes the
 * runtime's logits rows (mdl_runtime_config_t.max_num_seqs) for
 * max_num_seqs * (1 + k), which is what dev_fwd.c sizes its gathered
 * rows and logits buffers by. Checks:
 *
 *   runtime: one batch with a speculating sequence (pending token + k
 *   drafts, k + 1 logits rows), a plain decode and a prefill chunk, on
 *   the emulated device (f16 and bf16 weights and KV) against the CPU
 *   backend (NMSE and argmax bounds of test_devemu.c); the k + 1 rows
 *   against k + 1 single-token decode steps of a second emulated device
 *   that never saw the batch (same bounds); then rollback: one draft
 *   accepted, the correction token written over the second draft's slot
 *   and one more decode, against a fresh CPU runtime that prefilled the
 *   accepted tokens only (the rejected drafts' KV, left beyond the
 *   context, is never read);
 *
 *   graphs: verification steps (rows of 1 .. 1 + k tokens beside
 *   decodes, rollbacks between steps) in changing layouts, with graphs on
 *   (model/dev_graph.c: each token-count bucket recorded once, then
 *   replayed) against graphs off: the same logits bits and KV pool bytes
 *   after every step, and within the CPU backend's bounds;
 *
 *   engine: greedy requests on input-grounded prompts of
 *   tests/fixtures/austen-persuasion-ch24.txt, arriving one per step
 *   into a small token budget (prefill chunks share verification steps
 *   with speculating decodes), on "cuda-emu" with an f16 KV cache: the
 *   token streams with n-gram speculation and with a draft model (the
 *   default model itself, and its q4_0 copy from mdl_quantize) equal the
 *   streams without speculation on the emulated device, which equal the
 *   CPU backend's; with an int8 KV cache, n-gram speculation equals no
 *   speculation on the emulated device (rejected drafts roll back inside
 *   a quantized cache's residual slots); with graphs on (as serve runs),
 *   n-gram and self-draft streams equal the eager plain ones and
 *   verification steps were replayed. Drafts are both accepted and
 *   rejected, and after every run the KV pool is clean.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "model/backend.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "scheduler/engine_int.h"
#include "scheduler/spec.h"
#include "tests/cuda/batch_build.h"
#include "tests/cuda/dev_emu.h"
#include "tests/cuda/eng_run.h"
#include "text/tokenizer.h"


/* ---- runtime: one verification batch ------------------------------------------------ */

#define K 4
#define BS 8
#define MAXB 12

typedef struct vseq {
    int32_t ids[MAXB * BS];
    int32_t done; /* tokens whose KV is written */
    int32_t table[MAXB];
} vseq_t;

/* A batch of rows; row r takes n[r] tokens of seq[r] from its done
 * count (then done += n[r]) and gives n_rows[r] logits rows, its last
 * ones. */
typedef struct vrow {
    vseq_t *seq;
    int32_t n, n_rows;
} vrow_t;

static const float *
vstep(emu_side_t *side, const vrow_t *rows, int32_t n_rows)
{
    tb_batch_t t;

    ck_assert_int_le(n_rows, 3);
    tb_begin(&t, BS, MAXB);
    for (int32_t r = 0; r < n_rows; r++) {
        tb_add(&t, rows[r].seq->ids, &rows[r].seq->done, rows[r].n, rows[r].seq->table,
               rows[r].n_rows);
    }
    return emu_side_forward(side, tb_end(&t));
}

/* Returns the worst NMSE against the CPU backend; *solo_worst gets the
 * worst of the verification rows against the single-token decodes. */
static double
verify_rows(const mdl_model_t *m, mdl_kv_dtype_t kv, double *solo_worst)
{
    const int32_t vocab = mdl_model_config(m)->vocab_size;
    mdl_runtime_config_t rc = {.num_blocks = 32,
                               .block_size = BS,
                               .max_num_batched_tokens = 64,
                               .max_num_seqs = 3 * (1 + K), /* logits rows, as the engine sizes */
                               .max_blocks_per_seq = MAXB,
                               .n_threads = 1,
                               .tp_size = 1,
                               .kv_dtype = kv};
    mdl_runtime_config_t rcpu = rc;
    kn_dt_t dt = kv == MDL_KV_F16 ? KN_DT_F16 : KN_DT_BF16;
    emu_cmp_t c = {.nmse_bound = kv == MDL_KV_F16 ? 2e-6 : 5e-4, .vocab = vocab}, cs = c;
    emu_side_t cpu = {0}, dev = {0}, solo = {0}, fresh = {0};
    vseq_t a, b, cc, a_solo, a_fresh;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    char err[256];
    float *ver;

    rcpu.kv_dtype = MDL_KV_F32;
    ck_assert_msg(mdl_runtime_create(m, &rcpu, &cpu.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    ck_assert_msg(mdl_runtime_create(m, &rcpu, &fresh.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    dev.dev = emu_dev_create(m, &rc, dt);
    solo.dev = emu_dev_create(m, &rc, dt);

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&cc, 0, sizeof(cc));
    for (int32_t i = 0; i < MAXB * BS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        a.ids[i] = 3 + (int32_t)((x >> 20) % (uint64_t)(vocab - 3));
        b.ids[i] = 3 + (int32_t)((x >> 40) % (uint64_t)(vocab - 3));
        cc.ids[i] = 3 + (int32_t)((x >> 8) % (uint64_t)(vocab - 3));
    }
    for (int32_t i = 0; i < MAXB; i++) {
        a.table[i] = 1 + i;
        b.table[i] = 1 + MAXB + i;
        cc.table[i] = i < 6 ? 1 + 2 * MAXB + i : 0;
    }

    /* Prefill: A's 17 prompt tokens, B's 13. */
    {
        vrow_t r[2] = {{&a, 17, 1}, {&b, 13, 1}};
        vseq_t a0 = a, b0 = b;
        float *l = xmalloc(sizeof(float) * 2 * (size_t)vocab);

        memcpy(l, vstep(&cpu, r, 2), sizeof(float) * 2 * (size_t)vocab);
        a = a0;
        b = b0;
        emu_compare(&c, l, vstep(&dev, r, 2), 2);
        a_solo = a0;
        r[0].seq = &a_solo;
        vstep(&solo, r, 1);
        free(l);
    }

    /* The verification step: A's pending token (position 17) and K drafts
     * (18 .. 21, inside block 2, its last slot 23 untouched), 1 + K rows;
     * B's decode; C's first prefill chunk of 16 tokens. */
    {
        vrow_t r[3] = {{&a, 1 + K, 1 + K}, {&b, 1, 1}, {&cc, 16, 1}};
        vseq_t a0 = a, b0 = b, c0 = cc;
        int32_t nl = 1 + K + 2;
        float *l = xmalloc(sizeof(float) * (size_t)nl * (size_t)vocab);
        const float *g;

        memcpy(l, vstep(&cpu, r, 3), sizeof(float) * (size_t)nl * (size_t)vocab);
        a = a0;
        b = b0;
        cc = c0;
        g = vstep(&dev, r, 3);
        emu_compare(&c, l, g, nl);
        ver = xmalloc(sizeof(float) * (size_t)nl * (size_t)vocab);
        memcpy(ver, g, sizeof(float) * (size_t)nl * (size_t)vocab);
        free(l);
    }

    /* The 1 + K rows against 1 + K single-token decodes of A alone. */
    for (int32_t j = 0; j <= K; j++) {
        vrow_t r = {&a_solo, 1, 1};

        emu_compare(&cs, ver + (size_t)j * (size_t)vocab, vstep(&solo, &r, 1), 1);
    }
    ck_assert_int_eq(a_solo.done, a.done);

    /* Rollback: draft 1 accepted, draft 2 rejected. A's KV now stands at
     * 19 tokens; the correction token goes to position 19 (draft 2's slot),
     * then one more decode. The reference prefilled only accepted tokens. */
    a.done = 17 + 2;
    a.ids[19] = a.ids[19] == 3 ? 4 : 3;
    a.ids[20] = 5 + a.ids[20] % 7;
    a_fresh = a;
    a_fresh.done = 0;
    for (int32_t i = 0; i < 2; i++) {
        vrow_t rd = {&a, 1, 1};
        vrow_t rf = {&a_fresh, i == 0 ? 20 : 1, 1};
        float *l = xmalloc(sizeof(float) * (size_t)vocab);

        memcpy(l, vstep(&fresh, &rf, 1), sizeof(float) * (size_t)vocab);
        emu_compare(&c, l, vstep(&dev, &rd, 1), 1);
        free(l);
    }
    ck_assert_int_eq(a.done, a_fresh.done);

    free(ver);
    emu_dev_destroy(dev.dev);
    emu_dev_destroy(solo.dev);
    mdl_runtime_destroy(cpu.cpu);
    mdl_runtime_destroy(fresh.cpu);
    *solo_worst = cs.worst;
    return c.worst;
}

START_TEST(test_spec_emu_verify_rows)
{
    mdl_model_t *m = emu_load_model();
    double s16, sb16, f16 = verify_rows(m, MDL_KV_F16, &s16),
                      bf16 = verify_rows(m, MDL_KV_BF16, &sb16);

    fprintf(stderr,
            "verification batch on the emulated device: worst NMSE against the CPU f16 %.3g, "
            "bf16 %.3g; rows against single-token decodes f16 %.3g, bf16 %.3g\n",
            f16, bf16, s16, sb16);
    mdl_model_destroy(m);
}
END_TEST

/* ---- verification steps as graphs (model/dev_graph.c) ------------------------------- */

#define GSEQ 3 /* sequences; the runtime's max_num_seqs GSEQ * (1 + K): buckets 1, 2, 4, 8, 15 */

/* Whether the KV pools of two emulated T = 1 ranks hold the same bytes. */
static int
same_kv(const emu_dev_t *a, const emu_dev_t *b)
{
    const mdl_dev_rank_t *x = &a->fw[0], *y = &b->fw[0];
    size_t bytes =
        2 * (size_t)mdl_model_config(x->m)->n_layers * (size_t)x->rc.num_blocks * x->blk_bytes;

    return memcmp(x->kv, y->kv, bytes) == 0;
}

/* One step on every side: rows (seq, n) with all n tokens as logits rows
 * when n <= 1 + K (a verification row or a decode), else its last one (a
 * prefill chunk). Eager (graphs off) against graphs on: the same bits and
 * the same KV pool; against the CPU backend: the NMSE and argmax bounds.
 * The rows' sequences then roll back rej[r] tokens (rejected drafts),
 * whose positions get other tokens for the next step to write. */
static void
gv_step(emu_side_t *cpu, emu_side_t *eager, emu_side_t *graph, emu_cmp_t *bits, emu_cmp_t *num,
        const vrow_t *rows, int32_t n_rows, const int32_t *rej, int32_t vocab)
{
    tb_batch_t t;

    tb_begin(&t, BS, MAXB);
    for (int32_t r = 0; r < n_rows; r++) {
        vseq_t *q = rows[r].seq;

        tb_add(&t, q->ids, &q->done, rows[r].n, q->table, rows[r].n <= 1 + K ? rows[r].n : 1);
    }
    const mdl_batch_t *b = tb_end(&t);
    const int32_t n = b->n_tokens, nl = b->n_logits;
    float *lc = xmalloc(sizeof(float) * (size_t)nl * (size_t)vocab);
    float *le = xmalloc(sizeof(float) * (size_t)nl * (size_t)vocab);
    const float *lg;

    memcpy(lc, emu_side_forward(cpu, b), sizeof(float) * (size_t)nl * (size_t)vocab);
    memcpy(le, emu_side_forward(eager, b), sizeof(float) * (size_t)nl * (size_t)vocab);
    lg = emu_side_forward(graph, b);
    emu_compare(bits, le, lg, nl);
    emu_compare(num, lc, lg, nl);
    ck_assert_msg(same_kv(eager->dev, graph->dev), "KV pools differ after a step of %d tokens",
                  n);
    free(lc);
    free(le);
    for (int32_t r = 0; r < n_rows; r++) {
        vseq_t *q = rows[r].seq;

        q->done -= rej[r];
        for (int32_t i = 0; i < rej[r]; i++) {
            q->ids[q->done + i] = 3 + (q->ids[q->done + i] * 7 + 11) % (vocab - 3);
        }
    }
}

/* Verification steps (1 + k query tokens per speculating row, plain
 * decodes beside them) in changing layouts, run as graphs (each bucket
 * recorded after its first step, then replayed) and eagerly. */
START_TEST(test_spec_emu_verify_graphs)
{
    mdl_model_t *m = emu_load_model();
    const int32_t vocab = mdl_model_config(m)->vocab_size;
    mdl_runtime_config_t rc = {.num_blocks = 1 + GSEQ * MAXB,
                               .block_size = BS,
                               .max_num_batched_tokens = 64,
                               .max_num_seqs = GSEQ * (1 + K),
                               .max_blocks_per_seq = MAXB,
                               .n_threads = 1,
                               .tp_size = 1,
                               .kv_dtype = MDL_KV_F16,
                               .spec_k = K};
    mdl_runtime_config_t rcpu = rc, rg = rc;
    emu_side_t cpu = {0}, eager = {0}, graph = {0};
    emu_cmp_t bits = {.nmse_bound = 1e-30, .vocab = vocab};
    /* f16 weights and KV against f32: test_devemu.c's bound of T > 1 steps. */
    emu_cmp_t num = {.nmse_bound = 1e-5, .vocab = vocab};
    vseq_t q[GSEQ];
    uint64_t x = 0x243f6a8885a308d3ULL;
    char err[256];
    /* Rows (sequence, tokens) then rejected tokens per row; buckets in
     * use: 8, 8, 8, 1, 15, 15, 2, 2, 8, 15, 4. */
    static const struct {
        int32_t n_rows;
        int32_t seq[GSEQ], n[GSEQ], rej[GSEQ];
    } steps[] = {
        {1, {0}, {1 + K}, {2}},
        {3, {0, 1, 2}, {1, 1 + K, 2}, {0, 4, 1}},
        {2, {2, 0}, {1 + K, 3}, {0, 1}},
        {1, {1}, {1}, {0}},
        {3, {0, 1, 2}, {1 + K, 1 + K, 1 + K}, {4, 0, 2}},
        {3, {2, 1, 0}, {1, 1 + K, 4}, {0, 3, 0}},
        {1, {1}, {2}, {1}},
        {2, {0, 2}, {1, 1}, {0, 0}},
        {2, {0, 1}, {4, 1}, {3, 0}},
        {3, {2, 0, 1}, {3, 2, 1 + K}, {2, 0, 4}},
        {2, {1, 2}, {2, 1}, {1, 0}},
    };
    int32_t n_steps = (int32_t)(sizeof(steps) / sizeof(steps[0]));

    rcpu.kv_dtype = MDL_KV_F32;
    rc.cuda_graphs = 0;
    rg.cuda_graphs = 1;
    ck_assert_msg(mdl_runtime_create(m, &rcpu, &cpu.cpu, err, sizeof(err)) == ST_OK, "%s", err);
    eager.dev = emu_dev_create(m, &rc, KN_DT_F16);
    graph.dev = emu_dev_create(m, &rg, KN_DT_F16);
    ck_assert(eager.dev->fw[0].graphs_off);
    ck_assert(!graph.dev->fw[0].graphs_off);
    ck_assert_int_eq(graph.dev->fw[0].graph_rows[graph.dev->fw[0].n_buckets - 1], GSEQ * (1 + K));

    memset(q, 0, sizeof(q));
    for (int32_t i = 0; i < MAXB * BS; i++) {
        for (int32_t s = 0; s < GSEQ; s++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            q[s].ids[i] = 3 + (int32_t)((x >> 24) % (uint64_t)(vocab - 3));
        }
    }
    for (int32_t s = 0; s < GSEQ; s++) {
        for (int32_t i = 0; i < MAXB; i++) {
            q[s].table[i] = 1 + s * MAXB + (i * 5 + s) % MAXB; /* scattered blocks */
        }
    }
    { /* prefill chunks (longer than 1 + K): eager on both */
        vrow_t r[GSEQ] = {{&q[0], 17, 1}, {&q[1], 9, 1}, {&q[2], 14, 1}};
        int32_t none[GSEQ] = {0, 0, 0};

        gv_step(&cpu, &eager, &graph, &bits, &num, r, GSEQ, none, vocab);
    }
    for (int32_t i = 0; i < n_steps; i++) {
        vrow_t r[GSEQ];

        for (int32_t j = 0; j < steps[i].n_rows; j++) {
            r[j] = (vrow_t){&q[steps[i].seq[j]], steps[i].n[j], steps[i].n[j]};
        }
        gv_step(&cpu, &eager, &graph, &bits, &num, r, steps[i].n_rows, steps[i].rej, vocab);
    }
    { /* a mixed step: a prefill chunk beside a verification row, eager on both */
        vrow_t r[2] = {{&q[0], 1 + K, 1 + K}, {&q[2], 2 + K, 1}};
        int32_t rej[2] = {2, 0};

        gv_step(&cpu, &eager, &graph, &bits, &num, r, 2, rej, vocab);
    }
    ck_assert(bits.worst == 0.0);
    {
        const mdl_dev_rank_t *rk = &graph.dev->fw[0];

        ck_assert_int_eq(graph.dev->ctx[0].n_unsafe, 0);
        ck_assert_int_eq(rk->n_graph_captures, 5); /* buckets 1, 2, 4, 8, 15 */
        ck_assert_int_eq(rk->n_graph_steps, n_steps - 5);
        ck_assert_int_eq(graph.dev->ctx[0].cnt.graph_launches, n_steps - 5);
        ck_assert_int_eq(rk->n_eager_steps, 2 + 5);
        ck_assert_int_eq(eager.dev->fw[0].n_graph_steps, 0);
    }
    fprintf(stderr,
            "verification steps as graphs: %d steps, %lld replayed, identical to eager; worst "
            "NMSE against the CPU %.3g\n",
            n_steps, (long long)graph.dev->fw[0].n_graph_steps, num.worst);
    emu_dev_destroy(eager.dev);
    emu_dev_destroy(graph.dev);
    mdl_runtime_destroy(cpu.cpu);
    mdl_model_destroy(m);
}
END_TEST

/* ---- engine: greedy streams --------------------------------------------------------- */

#define N_JOBS 4 /* at most (n_jobs) */
#define N_GEN 40 /* at most; KVSERVE_TEST_SCALE < 1: 16 */
#define MAX_PROMPT 96

typedef struct job {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
} job_t;

/* Input-grounded prompts: a passage of the chapter, then its first two
 * thirds again (the model continues by copying, so n-gram drafts are
 * often accepted, and sometimes not). */
static void
make_jobs(const mdl_model_t *m, job_t *jobs)
{
    static const int32_t lens[N_JOBS] = {40, 84, 58, 72};
    char path[1024];
    int32_t *ids = NULL;
    size_t n_ids = 0;
    FILE *f;
    char *text;
    long len;

    snprintf(path, sizeof(path), "%s/tests/fixtures/austen-persuasion-ch24.txt",
             KVSERVE_SOURCE_ROOT);
    f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s", path);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = xmalloc((size_t)len);
    ck_assert_int_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    ck_assert_int_eq(tok_encode(mdl_model_tokenizer(m), text, (size_t)len, 0, &ids, &n_ids), ST_OK);
    free(text);
    ck_assert_uint_gt(n_ids, 2000);
    for (int i = 0; i < N_JOBS; i++) {
        job_t *j = &jobs[i];
        int32_t half = (lens[i] - 1) * 3 / 5, from = 173 + 389 * i;

        j->n_prompt = 0;
        j->prompt[j->n_prompt++] =
            mdl_model_config(m)->bos_id >= 0 ? mdl_model_config(m)->bos_id : ids[from - 1];
        memcpy(j->prompt + j->n_prompt, ids + from, sizeof(int32_t) * (size_t)half);
        j->n_prompt += half;
        memcpy(j->prompt + j->n_prompt, ids + from, sizeof(int32_t) * (size_t)(lens[i] - 1 - half));
        j->n_prompt += lens[i] - 1 - half;
    }
    free(ids);
}

/* KVSERVE_TEST_SCALE < 1: tools/test sets 0.25 under the sanitizers,
 * where emulation is slow. */
static int
reduced(void)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");

    return e != NULL && atof(e) < 1.0;
}

/* Tokens per request: N_GEN, or 16 when reduced. */
static int32_t
n_gen(void)
{
    return reduced() ? 16 : N_GEN;
}

/* Requests per run: N_JOBS; the int8 test, when reduced, 2 (a 40-token
 * prompt, then an 84-token one prefilled beside its decodes). */
static int n_jobs = N_JOBS;

/* One engine run of the jobs (submitted one per step) on device with KV
 * dtype kv; spec: a --speculative-config JSON or NULL. */
static int run_graphs; /* runs with cuda_graphs set (as serve without --enforce-eager) */

static void
run(const mdl_model_t *m, const job_t *jobs, const char *device, mdl_kv_dtype_t kv,
    const char *spec, er_out_t *res, eng_stats_t *st)
{
    eng_config_t c;
    eng_msg_submit_t *reqs[N_JOBS];
    char err[256] = "";

    /* long prompts prefill in chunks beside decodes */
    er_config(&c, device, 16, 48, N_JOBS, 40);
    c.rt.kv_dtype = kv;
    c.rt.cuda_graphs = run_graphs;
    if (spec != NULL) {
        ck_assert_msg(spec_config_parse(spec, &c.spec, err, sizeof(err)) == ST_OK, "%s", err);
    }
    for (int i = 0; i < n_jobs; i++) {
        reqs[i] = er_request((uint64_t)i + 1, jobs[i].prompt, jobs[i].n_prompt, n_gen());
    }
    er_run(&c, m, reqs, n_jobs, 1, 0, res, st);
    for (int i = 0; i < n_jobs; i++) {
        ck_assert_msg(res[i].finished && res[i].n == n_gen(), "request %d: %d tokens", i + 1,
                      res[i].n);
    }
}

static void
same(const er_out_t *a, const er_out_t *b, const char *what)
{
    for (int i = 0; i < n_jobs; i++) {
        int32_t at = 0;

        while (at < n_gen() && a[i].tok[at] == b[i].tok[at]) {
            at++;
        }
        ck_assert_msg(at == n_gen(), "%s: request %d differs at token %d", what, i + 1, at);
    }
}

static void
report(const char *what, const eng_stats_t *st)
{
    fprintf(stderr, "%s: %llu verifications, %llu of %llu draft tokens accepted\n", what,
            (unsigned long long)st->spec.drafts, (unsigned long long)st->spec.accepted_tokens,
            (unsigned long long)st->spec.draft_tokens);
}

START_TEST(test_spec_emu_engine_f16)
{
    mdl_model_t *m = emu_load_model();
    static job_t jobs[N_JOBS];
    static er_out_t cpu[N_JOBS], plain[N_JOBS], spec[N_JOBS];
    char js[1400], q4[96], err[256] = "";
    eng_stats_t st;

    make_jobs(m, jobs);
    mdl_backend_register_test(&emu_backend);
    run(m, jobs, "cpu", MDL_KV_F32, NULL, cpu, &st);
    run(m, jobs, "cuda-emu", MDL_KV_F16, NULL, plain, &st);
    same(cpu, plain, "cuda-emu against cpu");

    run(m, jobs, "cuda-emu", MDL_KV_F16,
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3}", spec,
        &st);
    report("cuda-emu f16, ngram k=4", &st);
    same(plain, spec, "cuda-emu, ngram");
    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens); /* rollbacks ran */

    snprintf(js, sizeof(js),
             "{\"method\": \"draft_model\", \"model\": \"%s\", \"num_speculative_tokens\": 3}",
             emu_model_dir());
    run(m, jobs, "cuda-emu", MDL_KV_F16, js, spec, &st);
    report("cuda-emu f16, draft = the model itself, k=3", &st);
    same(plain, spec, "cuda-emu, draft self");
    /* The same model on the same device: drafts are the target's argmax
     * up to the rounding of a batched row. */
    ck_assert_uint_gt(st.spec.drafts, 0);
    ck_assert_uint_ge(st.spec.accepted_tokens * 100, st.spec.draft_tokens * 95);

    snprintf(q4, sizeof(q4), "/tmp/kvs-spec-emu-%d-q4_0.gguf", (int)getpid());
    ck_assert_msg(mdl_quantize(emu_model_dir(), q4, MDL_QUANT_Q4_0, err, sizeof(err)) == ST_OK, "%s",
                  err);
    snprintf(js, sizeof(js),
             "{\"method\": \"draft_model\", \"model\": \"%s\", \"num_speculative_tokens\": 3}", q4);
    run(m, jobs, "cuda-emu", MDL_KV_F16, js, spec, &st);
    unlink(q4);
    report("cuda-emu f16, draft = q4_0 copy, k=3", &st);
    same(plain, spec, "cuda-emu, draft q4_0");
    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens); /* rollbacks ran */

    mdl_backend_register_test(NULL);
    mdl_model_destroy(m);
}
END_TEST

/* The same streams with graphs on (serve's default): decode and
 * verification steps replayed from their buckets' graphs, the outputs
 * those of eager steps without speculation. */
START_TEST(test_spec_emu_engine_graphs)
{
    mdl_model_t *m = emu_load_model();
    static job_t jobs[N_JOBS];
    static er_out_t plain[N_JOBS], graphs[N_JOBS], spec[N_JOBS];
    char js[1400];
    eng_stats_t st;

    make_jobs(m, jobs);
    mdl_backend_register_test(&emu_backend);
    run(m, jobs, "cuda-emu", MDL_KV_F16, NULL, plain, &st);
    run_graphs = 1;
    run(m, jobs, "cuda-emu", MDL_KV_F16, NULL, graphs, &st);
    same(plain, graphs, "cuda-emu, graphs");

    emu_backend_verify_replays = 0;
    run(m, jobs, "cuda-emu", MDL_KV_F16,
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3}", spec,
        &st);
    report("cuda-emu f16 graphs, ngram k=4", &st);
    same(plain, spec, "cuda-emu graphs, ngram");
    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens);
    fprintf(stderr, "  %lld verification steps replayed\n", (long long)emu_backend_verify_replays);
    ck_assert_int_gt(emu_backend_verify_replays, 0);

    snprintf(js, sizeof(js),
             "{\"method\": \"draft_model\", \"model\": \"%s\", \"num_speculative_tokens\": 3}",
             emu_model_dir());
    emu_backend_verify_replays = 0;
    run(m, jobs, "cuda-emu", MDL_KV_F16, js, spec, &st);
    report("cuda-emu f16 graphs, draft = the model itself, k=3", &st);
    same(plain, spec, "cuda-emu graphs, draft self");
    ck_assert_uint_gt(st.spec.drafts, 0);
    ck_assert_uint_ge(st.spec.accepted_tokens * 100, st.spec.draft_tokens * 95);
    ck_assert_int_gt(emu_backend_verify_replays, 0);
    run_graphs = 0;
    mdl_backend_register_test(NULL);
    mdl_model_destroy(m);
}
END_TEST

START_TEST(test_spec_emu_engine_int8)
{
    mdl_model_t *m = emu_load_model();
    static job_t jobs[N_JOBS];
    static er_out_t plain[N_JOBS], spec[N_JOBS];
    eng_stats_t st;

    make_jobs(m, jobs);
    n_jobs = reduced() ? 2 : N_JOBS;
    mdl_backend_register_test(&emu_backend);
    run(m, jobs, "cuda-emu", MDL_KV_INT8, NULL, plain, &st);
    run(m, jobs, "cuda-emu", MDL_KV_INT8,
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3}", spec,
        &st);
    report("cuda-emu int8, ngram k=4", &st);
    same(plain, spec, "cuda-emu int8, ngram");
    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens);
    n_jobs = N_JOBS;
    mdl_backend_register_test(NULL);
    mdl_model_destroy(m);
}
END_TEST

Suite *
cuda_spec_emu_suite(void)
{
    Suite *s = suite_create("cuda-spec-emu");
    TCase *tc = tcase_create("spec");

    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_spec_emu_verify_graphs);
    tcase_add_test(tc, test_spec_emu_verify_rows);
    tcase_add_test(tc, test_spec_emu_engine_f16);
    tcase_add_test(tc, test_spec_emu_engine_graphs);
    tcase_add_test(tc, test_spec_emu_engine_int8);
    suite_add_tcase(s, tc);
    return s;
}
