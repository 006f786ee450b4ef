/* test_spec.c - speculative decoding (scheduler/spec.h): the config
 * parser, the n-gram proposer, and the engine with the real default model
 * (models/austen-2.7m): greedy outputs identical with and without
 * speculation on passages of tests/fixtures/austen-persuasion-ch24.txt
 * (input-grounded: the prompt repeats a passage) and on random prompts,
 * under every KV cache dtype; a randomized schedule with preemption (swap
 * and recompute), n = 2, stop ids, min_tokens, max_tokens and
 * cancellation; the token distribution at temperature 0.8 (chi-square
 * against the non-speculative one). After every run the KV pool is
 * clean and every hashed block's hash is the hash of accepted tokens. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/blockmgr_int.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "grammar/grammar.h"
#include "kvserve_config.h"
#include "scheduler/engine.h"
#include "scheduler/engine_int.h"
#include "scheduler/spec.h"
#include "scheduler/spec_draft.h"
#include "text/tokenizer.h"

#define MAX_ID 96
#define MAX_CH 2
#define MAX_OUT 256
#define MAX_PROMPT 200

typedef struct res {
    int32_t tok[MAX_OUT];
    int32_t n;
    int finished;
    eng_finish_t reason;
    int32_t stop_token;
} res_t;

typedef struct job {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_tokens, min_tokens, n;
    float temperature;
    uint64_t seed;
    int32_t stop_id; /* -1: none */
    int32_t cancel_after; /* cancel once this many tokens came (0: never) */
    int no_spec;
    int constrained; /* under text_grammar() */
} job_t;

static mdl_model_t *model;
static int32_t *chapter;
static size_t n_chapter;
static chan_t outbox;
static engine_t *eng;
static res_t res[MAX_ID][MAX_CH];
/* The default model's vocabulary for the grammar engine, as the server
 * builds it (server/srv_grammar.c, over tok_output_bytes). */
static gr_vocab_t *gvocab;
static int errors[MAX_ID];
/* Draft-model speculation: cfg_make(k > 0) speculates with this model
 * when set (method draft_model), by n-gram lookup when NULL. */
static const char *draft_path;
/* The default model quantized by the test (made once, removed at exit). */
static char q_paths[2][64];

static void
load_model(void)
{
    const char *dir = getenv("KVSERVE_MODEL_DIR");
    char err[256] = "", path[1024];
    FILE *f;
    char *text;
    long len;

    if (model != NULL) {
        return;
    }
    if (dir == NULL) {
        dir = KVSERVE_SOURCE_ROOT "/models/austen-2.7m";
    }
    ck_assert_msg(mdl_model_load(dir, &model, err, sizeof(err)) == ST_OK, "load %s: %s", dir, err);
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
    ck_assert_int_eq(tok_encode(mdl_model_tokenizer(model), text, (size_t)len, 0, &chapter,
                                &n_chapter),
                     ST_OK);
    free(text);
    ck_assert_uint_gt(n_chapter, 1000);
}

static void
teardown(void)
{
    gr_vocab_destroy(gvocab);
    gvocab = NULL;
    mdl_model_destroy(model);
    model = NULL;
    free(chapter);
    chapter = NULL;
}

/* Lines of 1 to 12 letters, spaces or punctuation: what a row may take
 * depends on how many bytes the drafts before it added, so a draft row
 * masked from the wrong matcher state gives another output. The
 * chapter's text fits it between the forced line ends, so n-gram drafts
 * are both accepted and refused. */
static gr_grammar_t *
text_grammar(void)
{
    static const char lines[] = "root ::= ( [a-zA-Z ,.;']{1,12} \"\\n\" )+";
    gr_grammar_t *g = NULL;
    char err[200] = "";

    if (gvocab == NULL) {
        const tok_tokenizer_t *tok = mdl_model_tokenizer(model);
        const mdl_config_t *mc = mdl_model_config(model);
        int32_t n = tok_vocab_size(tok);
        const char **bytes = xcalloc((size_t)n, sizeof(char *));
        uint32_t *lens = xcalloc((size_t)n, sizeof(uint32_t));

        tok_output_bytes(tok, bytes, lens);
        ck_assert_int_eq(gr_vocab_create(n, bytes, lens, mc->eos_ids, mc->n_eos, &gvocab), ST_OK);
        free(bytes);
        free(lens);
    }
    ck_assert_msg(gr_compile(GR_KIND_GBNF, lines, gvocab, &g, err, sizeof(err)) == ST_OK, "%s",
                  err);
    return g;
}

static eng_config_t
cfg_make(int spec_k, mdl_kv_dtype_t dt, int32_t num_blocks, int32_t swap_blocks)
{
    eng_config_t c;

    memset(&c, 0, sizeof(c));
    c.rt.device = "cpu";
    c.rt.kv_dtype = dt;
    c.rt.n_threads = 1;
    c.rt.block_size = 16;
    c.rt.num_blocks = num_blocks;
    c.rt.swap_blocks = swap_blocks;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 512;
    c.max_model_len = 256;
    c.prefix_caching = 1;
    c.n_tenants = 1;
    c.tenants[0].weight = 1.0;
    snprintf(c.tenants[0].name, sizeof(c.tenants[0].name), "default");
    if (spec_k > 0) {
        char err[200];
        char js[1400];
        if (draft_path != NULL) {
            snprintf(js, sizeof(js),
                     "{\"method\": \"draft_model\", \"model\": \"%s\", "
                     "\"num_speculative_tokens\": %d, \"max_batch\": 64}",
                     draft_path, spec_k);
        } else {
            snprintf(js, sizeof(js),
                     "{\"method\": \"ngram\", \"num_speculative_tokens\": %d, "
                     "\"prompt_lookup_min\": 1, \"prompt_lookup_max\": 4, \"max_batch\": 64}",
                     spec_k);
        }
        ck_assert_int_eq(spec_config_parse(js, &c.spec, err, sizeof(err)), ST_OK);
    }
    return c;
}

static void
start(const eng_config_t *c)
{
    char err[256] = "";

    load_model();
    chan_init(&outbox, NULL, NULL);
    ck_assert_msg(engine_create(c, model, &outbox, &eng, err, sizeof(err)) == ST_OK, "%s", err);
    memset(res, 0, sizeof(res));
    memset(errors, 0, sizeof(errors));
}

static void
drain(void)
{
    msg_t *m = chan_take_all(&outbox);

    while (m != NULL) {
        msg_t *next = m->next;
        if (m->type == ENG_MSG_DELTA) {
            eng_msg_delta_t *d = (eng_msg_delta_t *)m;
            res_t *r = &res[d->id][d->choice];
            ck_assert(!r->finished);
            for (int32_t i = 0; i < d->n_tokens; i++) {
                ck_assert_int_lt(r->n, MAX_OUT);
                r->tok[r->n++] = d->tok[i].token;
            }
        } else if (m->type == ENG_MSG_FINISHED) {
            eng_msg_finished_t *f = (eng_msg_finished_t *)m;
            res_t *r = &res[f->id][f->choice];
            ck_assert(!r->finished);
            r->finished = 1;
            r->reason = f->reason;
            r->stop_token = f->stop_token;
            ck_assert_int_eq(f->completion_tokens, r->n);
        } else if (m->type == ENG_MSG_ERROR) {
            errors[((eng_msg_error_t *)m)->id] = ((eng_msg_error_t *)m)->status;
        }
        eng_msg_free(m);
        m = next;
    }
}

/* Every hashed device block holds the hash of a full block of accepted
 * tokens: prompt + output of some finished choice (tenant 0's salt). */
static void
check_hashes(const job_t *jobs, int n_jobs)
{
    bm_pool_t *pool = eng__pool(eng);
    const bm_tenant_t *tn = NULL;
    const uint32_t bs = pool->bs;
    uint8_t(*valid)[BM_HASH_LEN];
    size_t n_valid = 0, cap = 0;
    uint32_t n_hashed = 0;

    for (uint32_t t = 0; t < pool->n_tenants; t++) {
        if (pool->tenants[t].id == 0) {
            tn = &pool->tenants[t];
        }
    }
    ck_assert(tn != NULL);
    for (int i = 0; i < n_jobs; i++) {
        cap += (size_t)MAX_CH * (MAX_PROMPT + MAX_OUT) / bs + 2;
    }
    valid = xmalloc(cap * BM_HASH_LEN);
    for (int i = 0; i < n_jobs; i++) {
        for (int k = 0; k < jobs[i].n; k++) {
            int32_t seq[MAX_PROMPT + MAX_OUT];
            int32_t n = jobs[i].n_prompt;
            const uint8_t *parent = NULL;

            memcpy(seq, jobs[i].prompt, sizeof(int32_t) * (size_t)n);
            memcpy(seq + n, res[i][k].tok, sizeof(int32_t) * (size_t)res[i][k].n);
            n += res[i][k].n;
            for (int32_t b = 0; (b + 1) * (int32_t)bs <= n; b++) {
                ck_assert_uint_lt(n_valid, cap);
                bm__hash_block(pool, parent, tn, NULL, 0, seq + (size_t)b * bs, valid[n_valid]);
                parent = valid[n_valid++];
            }
        }
    }
    for (uint32_t id = 1; id < pool->tier[BM_DEV].n_blocks; id++) {
        const bm_block_t *b = bm__blk(pool, BM_DEV, id);
        size_t v = 0;

        if (!b->hashed) {
            continue;
        }
        n_hashed++;
        while (v < n_valid && memcmp(valid[v], b->hash, BM_HASH_LEN) != 0) {
            v++;
        }
        ck_assert_msg(v < n_valid, "block %u is hashed over tokens no choice accepted", id);
    }
    ck_assert_uint_gt(n_hashed, 0);
    free(valid);
}

/* Checks the pool (clean, hashes of accepted tokens only) and destroys the
 * engine; *st gets its last statistics. */
static void
finish(const job_t *jobs, int n_jobs, eng_stats_t *st)
{
    bm_stats_t bs;

    drain();
    ck_assert(sched_idle(eng__sched(eng)));
    bm_pool_check(eng__pool(eng));
    bm_pool_stats(eng__pool(eng), &bs);
    ck_assert_msg(bs.dev_used == 0 && bs.cpu_used == 0, "blocks in use: %u device, %u cpu",
                  bs.dev_used, bs.cpu_used);
    check_hashes(jobs, n_jobs);
    eng__stats(eng, st);
    engine_stop(eng);
    engine_destroy(eng);
    eng = NULL;
    for (msg_t *m = chan_take_all(&outbox); m != NULL;) {
        msg_t *next = m->next;
        eng_msg_free(m);
        m = next;
    }
    chan_fini(&outbox);
}

static void
submit(uint64_t id, const job_t *j)
{
    eng_msg_submit_t *m = xcalloc(1, sizeof(*m));

    m->hdr.type = ENG_MSG_SUBMIT;
    m->req.id = id;
    m->req.prompt = xmalloc((size_t)j->n_prompt * sizeof(int32_t));
    memcpy(m->req.prompt, j->prompt, (size_t)j->n_prompt * sizeof(int32_t));
    m->req.n_prompt = j->n_prompt;
    m->req.sampling.temperature = j->temperature;
    m->req.sampling.top_p = 1.0f;
    m->req.sampling.repetition_penalty = 1.0f;
    m->req.n = j->n > 0 ? j->n : 1;
    m->req.max_tokens = j->max_tokens;
    m->req.min_tokens = j->min_tokens;
    m->req.ignore_eos = j->min_tokens == 0;
    m->req.seed = j->seed;
    m->req.has_seed = 1;
    if (j->stop_id >= 0) {
        m->req.stop_ids[0] = j->stop_id;
        m->req.n_stop_ids = 1;
    }
    m->req.no_speculative = j->no_spec;
    if (j->constrained) {
        m->req.grammar = text_grammar();
    }
    chan_send(engine_inbox(eng), &m->hdr);
}

static void
cancel(uint64_t id)
{
    eng_msg_cancel_t *m = xcalloc(1, sizeof(*m));

    m->hdr.type = ENG_MSG_CANCEL;
    m->id = id;
    m->choice = -1;
    chan_send(engine_inbox(eng), &m->hdr);
}

/* Runs jobs (all submitted at once unless stagger: one more per step) to
 * the end; cancels those with cancel_after once they have that many
 * tokens when cancels is set. */
static void
run_jobs(const job_t *jobs, int n_jobs, int stagger, int cancels)
{
    int next = 0, guard = 0, sent[MAX_ID] = {0};

    if (!stagger) {
        for (; next < n_jobs; next++) {
            submit((uint64_t)next, &jobs[next]);
        }
    }
    do {
        if (next < n_jobs) {
            submit((uint64_t)next, &jobs[next]);
            next++;
        }
        ck_assert_int_ge(eng__iterate(eng, 0), 0);
        drain();
        for (int i = 0; cancels && i < n_jobs; i++) {
            if (jobs[i].cancel_after > 0 && !sent[i] && !res[i][0].finished &&
                res[i][0].n >= jobs[i].cancel_after) {
                cancel((uint64_t)i);
                sent[i] = 1;
            }
        }
        ck_assert_int_lt(++guard, 100000);
    } while (next < n_jobs || !sched_idle(eng__sched(eng)));
    drain();
    for (int i = 0; i < n_jobs; i++) {
        ck_assert_int_eq(errors[i], 0);
    }
}

static uint32_t rng_x = 12345;

static uint32_t
rnd(uint32_t n)
{
    rng_x = rng_x * 1103515245u + 12345u;
    return (rng_x >> 8) % n;
}

/* Input-grounded: a passage of the chapter, then its first words again
 * (the model continues by copying). Free: random token ids. */
static void
make_prompt(job_t *j, int grounded, int32_t len)
{
    const mdl_config_t *mc = mdl_model_config(model);

    j->n_prompt = 0;
    if (mc->bos_id >= 0) {
        j->prompt[j->n_prompt++] = mc->bos_id;
    }
    if (grounded) {
        int32_t half = (len - 1) * 2 / 3, from = (int32_t)rnd((uint32_t)(n_chapter - (size_t)half));
        memcpy(j->prompt + j->n_prompt, chapter + from, sizeof(int32_t) * (size_t)half);
        j->n_prompt += half;
        memcpy(j->prompt + j->n_prompt, chapter + from, sizeof(int32_t) * (size_t)(len - 1 - half));
        j->n_prompt += len - 1 - half;
    } else {
        for (int32_t i = 1; i < len; i++) {
            j->prompt[j->n_prompt++] = 3 + (int32_t)rnd((uint32_t)mc->vocab_size - 3);
        }
    }
}

static void
same_outputs(const job_t *jobs, int n_jobs, const res_t (*a)[MAX_CH], const res_t (*b)[MAX_CH],
             const char *what)
{
    for (int i = 0; i < n_jobs; i++) {
        for (int k = 0; k < jobs[i].n; k++) {
            const res_t *x = &a[i][k], *y = &b[i][k];
            ck_assert_msg(x->finished && y->finished, "%s %d.%d: not finished", what, i, k);
            ck_assert_msg(x->n == y->n &&
                              memcmp(x->tok, y->tok, sizeof(int32_t) * (size_t)x->n) == 0,
                          "%s %d.%d: tokens differ (%d vs %d)", what, i, k, x->n, y->n);
            ck_assert_msg(x->reason == y->reason && x->stop_token == y->stop_token,
                          "%s %d.%d: finish differs", what, i, k);
        }
    }
}

/* ---- config and proposer --------------------------------------------- */

START_TEST(test_config_parse)
{
    spec_config_t c;
    char err[256];

    ck_assert_int_eq(spec_config_parse(NULL, &c, err, sizeof(err)), ST_OK);
    ck_assert_int_eq(c.method, SPEC_OFF);
    ck_assert_int_eq(spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
                                       "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}",
                                       &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.method, SPEC_NGRAM);
    ck_assert_int_eq(c.k, 5);
    ck_assert_int_eq(c.lookup_min, 2);
    ck_assert_int_eq(c.lookup_max, 4);
    ck_assert_int_gt(c.max_batch, 0);
    ck_assert_int_eq(spec_config_parse("{\"method\": \"draft_model\", \"model\": \"/m\", "
                                       "\"num_speculative_tokens\": 3}",
                                       &c, err, sizeof(err)),
                     ST_OK);
    ck_assert_int_eq(c.method, SPEC_DRAFT_MODEL);
    ck_assert_str_eq(c.model, "/m");

    static const char *const bad[] = {
        "[1]",
        "{\"method\": \"eagle\", \"num_speculative_tokens\": 3}",
        "{\"method\": \"ngram\"}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 0}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 99}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 2.5}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 4, "
        "\"prompt_lookup_max\": 2}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"typo\": 1}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"model\": \"x\"}",
        "{\"method\": \"draft_model\", \"num_speculative_tokens\": 3}",
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"min_acceptance\": 2}",
        "{\"method\": ",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c.k = 77;
        err[0] = '\0';
        ck_assert_msg(spec_config_parse(bad[i], &c, err, sizeof(err)) == ST_EINVAL, "%s", bad[i]);
        ck_assert_msg(err[0] != '\0', "%s: no reason", bad[i]);
        ck_assert_int_eq(c.k, 77); /* untouched */
    }
}
END_TEST

START_TEST(test_ngram_propose)
{
    /* ... 5 6 7 8 9 ... 5 6 7 | the 3-gram "5 6 7" matched: 8 9 10 */
    const int32_t t[] = {1, 5, 6, 7, 8, 9, 10, 2, 6, 7, 11, 5, 6, 7};
    int32_t out[8];

    ck_assert_int_eq(spec_ngram_propose(t, 14, 1, 3, 3, out), 3);
    ck_assert_int_eq(out[0], 8);
    ck_assert_int_eq(out[1], 9);
    ck_assert_int_eq(out[2], 10);
    /* With 2-grams at most, the most recent "6 7" wins: 11 5 6. */
    ck_assert_int_eq(spec_ngram_propose(t, 14, 1, 2, 3, out), 3);
    ck_assert_int_eq(out[0], 11);
    /* k caps the copy; the end of the history caps it too. */
    ck_assert_int_eq(spec_ngram_propose(t, 14, 3, 3, 1, out), 1);
    const int32_t u[] = {4, 4};
    ck_assert_int_eq(spec_ngram_propose(u, 2, 1, 3, 5, out), 1);
    ck_assert_int_eq(out[0], 4);
    /* No earlier occurrence, or lookup_min too long: nothing. */
    const int32_t v[] = {1, 2, 3, 4};
    ck_assert_int_eq(spec_ngram_propose(v, 4, 1, 3, 4, out), 0);
    ck_assert_int_eq(spec_ngram_propose(t, 14, 4, 4, 4, out), 0);
}
END_TEST

START_TEST(test_adaptive_rule)
{
    spec_config_t c;
    spec_seq_t q;
    char err[128];

    ck_assert_int_eq(spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                                       "\"max_batch\": 8, \"min_acceptance\": 0.3, "
                                       "\"backoff_steps\": 5}",
                                       &c, err, sizeof(err)),
                     ST_OK);
    memset(&q, 0, sizeof(q));
    ck_assert_int_eq(spec_seq_want(&c, &q, 8), 4);
    ck_assert_int_eq(spec_seq_want(&c, &q, 9), 0); /* compute-bound batch */
    for (int i = 0; i < 4; i++) {
        spec_seq_record(&c, &q, 4, 0);
    }
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(spec_seq_want(&c, &q, 1), 0); /* paused */
    }
    ck_assert_int_eq(spec_seq_want(&c, &q, 1), 4); /* probes again */
    for (int i = 0; i < 10; i++) {
        spec_seq_record(&c, &q, 4, 3);
    }
    ck_assert_int_eq(spec_seq_want(&c, &q, 1), 4);
    /* Logits rows: one per sequence, k more for at most max_batch. */
    ck_assert_int_eq(spec_logits_rows(&c, 256), 256 + 8 * 4);
    ck_assert_int_eq(spec_logits_rows(&c, 3), 3 + 3 * 4);
    c.max_batch = 0;
    ck_assert_int_eq(spec_logits_rows(&c, 16), 16 * (1 + 4));
    c.method = SPEC_OFF;
    ck_assert_int_eq(spec_logits_rows(&c, 16), 16);
}
END_TEST

/* Rejection sampling against a draft distribution (spec_reject_sample):
 * over 200000 draws of d from q, the results are distributed as p
 * (chi-square at the 99.9th percentile), a token with p = 0 never comes
 * out, and the acceptance rate is sum min(p, q). With q = p every draft
 * is accepted. */
START_TEST(test_reject_sample)
{
    enum { V = 6, N = 200000 };
    static const float p[V] = {0.3f, 0.25f, 0.2f, 0.15f, 0.1f, 0.0f};
    static const float q[V] = {0.05f, 0.1f, 0.4f, 0.05f, 0.2f, 0.2f};
    float res[V];
    int32_t count[V] = {0}, accepted = 0;
    double chi = 0, want_acc = 0;
    smp_rng_t rng;

    smp_rng_seed(&rng, 2024);
    for (int n = 0; n < N; n++) {
        int32_t d = smp_pick_probs(q, V, smp_rng_uniform(&rng));
        int32_t t = spec_reject_sample(p, q, V, d, &rng, res);
        ck_assert(t >= 0 && t < V);
        count[t]++;
        accepted += t == d;
    }
    ck_assert_int_eq(count[V - 1], 0);
    for (int x = 0; x < V - 1; x++) {
        double e = (double)N * p[x];
        chi += ((double)count[x] - e) * ((double)count[x] - e) / e;
        want_acc += p[x] < q[x] ? p[x] : q[x];
    }
    ck_assert_msg(chi < 18.47, "chi-square %.2f (dof 4)", chi); /* 99.9th percentile */
    ck_assert_msg(fabs((double)accepted / N - want_acc) < 0.01, "acceptance %.4f, want %.4f",
                  (double)accepted / N, want_acc);
    for (int n = 0; n < 1000; n++) {
        int32_t d = smp_pick_probs(p, V, smp_rng_uniform(&rng));
        ck_assert_int_eq(spec_reject_sample(p, p, V, d, &rng, res), d);
    }
}
END_TEST

/* ---- engine: lossless -------------------------------------------------- */

#define N_GREEDY 16

static void
greedy_jobs(job_t *jobs)
{
    rng_x = 777;
    for (int i = 0; i < N_GREEDY; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        make_prompt(&jobs[i], i % 4 != 3, 40 + (int32_t)rnd(60));
        jobs[i].max_tokens = 48;
        jobs[i].n = 1;
        jobs[i].stop_id = -1;
        jobs[i].seed = (uint64_t)i + 1;
    }
}

/* The default model's passages and random prompts, greedy, under every KV
 * cache dtype: speculative outputs equal the plain ones, drafts were
 * both accepted and rejected. */
START_TEST(test_greedy_identical_every_dtype)
{
    static const mdl_kv_dtype_t dts[] = {MDL_KV_F32,  MDL_KV_F16,  MDL_KV_BF16, MDL_KV_FP8_E4M3,
                                         MDL_KV_INT8, MDL_KV_INT4, MDL_KV_TQ3,  MDL_KV_TQ4};
    static job_t jobs[N_GREEDY];
    static res_t plain[MAX_ID][MAX_CH];
    eng_stats_t st;

    load_model();
    greedy_jobs(jobs);
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        for (int batch1 = 0; batch1 < 2; batch1++) {
            eng_config_t c = cfg_make(0, dts[d], 512, 0);
            int n = batch1 ? 4 : N_GREEDY;

            if (batch1) {
                c.max_num_seqs = 1; /* one stream: the case speculation is for */
            }
            start(&c);
            run_jobs(jobs, n, 0, 0);
            memcpy(plain, res, sizeof(res));
            finish(jobs, n, &st);
            ck_assert_uint_eq(st.spec.drafts, 0);

            c = cfg_make(4, dts[d], 512, 0);
            if (batch1) {
                c.max_num_seqs = 1;
            }
            start(&c);
            run_jobs(jobs, n, 0, 0);
            same_outputs(jobs, n, plain, res, mdl_kv_dtype_name(dts[d]));
            finish(jobs, n, &st);
            fprintf(stderr, "spec %s batch%s: %llu drafts, %llu of %llu draft tokens accepted\n",
                    mdl_kv_dtype_name(dts[d]), batch1 ? "=1" : ">1",
                    (unsigned long long)st.spec.drafts, (unsigned long long)st.spec.accepted_tokens,
                    (unsigned long long)st.spec.draft_tokens);
            ck_assert_uint_gt(st.spec.drafts, 0);
            ck_assert_uint_gt(st.spec.accepted_tokens, 0);
            ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens);
            ck_assert_uint_le(st.spec.accepted_per_pos[1], st.spec.accepted_per_pos[0]);
        }
    }
}
END_TEST

/* Constrained choices speculate too: each draft row is masked from the
 * matcher advanced over the drafts before it. Greedy outputs equal the
 * plain constrained run, every output token is one the grammar allows,
 * and drafts were accepted and (by the model or the grammar) rejected. */
START_TEST(test_greedy_identical_constrained)
{
    static job_t jobs[N_GREEDY];
    static res_t plain[MAX_ID][MAX_CH];
    eng_stats_t st;

    load_model();
    greedy_jobs(jobs);
    for (int i = 0; i < N_GREEDY; i++) {
        jobs[i].constrained = 1;
    }
    eng_config_t c = cfg_make(0, MDL_KV_F32, 512, 0);
    start(&c);
    run_jobs(jobs, N_GREEDY, 0, 0);
    memcpy(plain, res, sizeof(res));
    finish(jobs, N_GREEDY, &st);
    c = cfg_make(4, MDL_KV_F32, 512, 0);
    start(&c);
    run_jobs(jobs, N_GREEDY, 0, 0);
    same_outputs(jobs, N_GREEDY, plain, res, "constrained");
    finish(jobs, N_GREEDY, &st);
    fprintf(stderr, "spec constrained: %llu drafts, %llu of %llu draft tokens accepted\n",
            (unsigned long long)st.spec.drafts, (unsigned long long)st.spec.accepted_tokens,
            (unsigned long long)st.spec.draft_tokens);
    ck_assert_uint_gt(st.spec.drafts, 0);
    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens);
    /* Every output follows the grammar: a fresh matcher takes it all. */
    for (int i = 0; i < N_GREEDY; i++) {
        gr_grammar_t *g = text_grammar();
        gr_matcher_t *gm = gr_matcher_create(g);
        ck_assert(gm != NULL);
        ck_assert_int_gt(res[i][0].n, 0);
        for (int32_t t = 0; t < res[i][0].n; t++) {
            ck_assert_msg(gr_matcher_accept_token(gm, res[i][0].tok[t]) == ST_OK, "job %d token %d",
                          i, t);
        }
        gr_matcher_destroy(gm);
        gr_grammar_destroy(g);
    }
}
END_TEST

#define N_RAND 40

/* A randomized schedule: staggered arrivals into a pool small enough to
 * preempt (swap, then recompute), n = 2, stop ids, min_tokens, short
 * max_tokens, "speculative": false on some, cancellation. Every
 * non-cancelled choice equals the plain run; a cancelled one is a prefix
 * of it. */
static void
randomized_schedule(void)
{
    static job_t jobs[N_RAND];
    static res_t plain[MAX_ID][MAX_CH];
    eng_stats_t st;

    load_model();
    for (int swap = 1; swap >= 0; swap--) {
        rng_x = 4242u + (uint32_t)swap;
        for (int i = 0; i < N_RAND; i++) {
            job_t *j = &jobs[i];
            memset(j, 0, sizeof(*j));
            make_prompt(j, rnd(3) != 0, 20 + (int32_t)rnd(100));
            j->max_tokens = 4 + (int32_t)rnd(80);
            j->n = rnd(5) == 0 ? 2 : 1;
            j->stop_id = rnd(3) == 0 ? 3 + (int32_t)rnd(40) : -1;
            j->min_tokens = rnd(4) == 0 ? (int32_t)rnd(10) : 0;
            j->cancel_after = j->n == 1 && rnd(6) == 0 ? 1 + (int32_t)rnd(20) : 0;
            j->no_spec = rnd(8) == 0;
            j->seed = (uint64_t)i;
        }
        eng_config_t c = cfg_make(0, MDL_KV_F32, 28, swap ? 64 : 0);
        c.max_num_seqs = 8;
        start(&c);
        run_jobs(jobs, N_RAND, 1, 0);
        memcpy(plain, res, sizeof(res));
        finish(jobs, N_RAND, &st);

        c = cfg_make(5, MDL_KV_F32, 28, swap ? 64 : 0);
        c.max_num_seqs = 8;
        start(&c);
        run_jobs(jobs, N_RAND, 1, 1);
        eng__stats(eng, &st);
        ck_assert_uint_gt(swap ? st.preempt_swap : st.preempt_recompute, 0);
        ck_assert_uint_gt(st.spec.accepted_tokens, 0);
        for (int i = 0; i < N_RAND; i++) {
            if (jobs[i].cancel_after > 0 && res[i][0].reason == ENG_FINISH_ABORT) {
                ck_assert_int_le(res[i][0].n, plain[i][0].n);
                ck_assert(memcmp(res[i][0].tok, plain[i][0].tok,
                                 sizeof(int32_t) * (size_t)res[i][0].n) == 0);
                res[i][0] = plain[i][0]; /* compared; the rest must match */
            }
        }
        same_outputs(jobs, N_RAND, plain, res, swap ? "swap" : "recompute");
        for (int i = 0; i < N_RAND; i++) {
            if (jobs[i].min_tokens > 0) {
                ck_assert_int_ge(res[i][0].n, jobs[i].min_tokens < jobs[i].max_tokens
                                                  ? jobs[i].min_tokens
                                                  : jobs[i].max_tokens);
            }
        }
        finish(jobs, N_RAND, &st);
    }
}
START_TEST(test_randomized_schedule)
{
    draft_path = NULL;
    randomized_schedule();
}
END_TEST

/* Temperature 0.8: the second and third generated tokens after a fixed
 * input-grounded prefix are distributed the same with and without
 * speculation (two-sample chi-square over 600 seeded runs each, different
 * seeds per arm), and speculation did draft at those positions. */
static void
sampled_distribution(spec_stats_t *spec)
{
    enum { RUNS = 600, POS = 2 };
    static job_t jobs[MAX_ID];

    memset(spec, 0, sizeof(*spec));
    static int32_t hist[2][1024];
    eng_stats_t st;
    const int32_t vocab = 1024;

    load_model();
    memset(hist, 0, sizeof(hist));
    rng_x = 99;
    job_t base;
    memset(&base, 0, sizeof(base));
    make_prompt(&base, 1, 60);
    base.max_tokens = 3;
    base.n = 1;
    base.stop_id = -1;
    base.temperature = 0.8f;
    for (int arm = 0; arm < 2; arm++) {
        uint64_t drafts = 0;
        for (int r0 = 0; r0 < RUNS; r0 += MAX_ID) {
            int n = RUNS - r0 < MAX_ID ? RUNS - r0 : MAX_ID;
            for (int i = 0; i < n; i++) {
                jobs[i] = base;
                jobs[i].seed = (uint64_t)(arm * 100000 + r0 + i) * 7919u + 1;
            }
            eng_config_t c = cfg_make(arm ? 3 : 0, MDL_KV_F32, 512, 0);
            c.max_num_seqs = 16;
            start(&c);
            run_jobs(jobs, n, 0, 0);
            for (int i = 0; i < n; i++) {
                ck_assert_int_eq(res[i][0].n, 3);
                for (int p = 1; p <= POS; p++) {
                    int32_t t = res[i][0].tok[p];
                    ck_assert(t >= 0 && t < vocab);
                    hist[arm][t]++;
                }
            }
            finish(jobs, n, &st);
            drafts += st.spec.drafts;
            if (arm == 1) {
                spec->drafts += st.spec.drafts;
                spec->draft_tokens += st.spec.draft_tokens;
                spec->accepted_tokens += st.spec.accepted_tokens;
            }
        }
        if (arm == 1) {
            ck_assert_uint_gt(drafts, RUNS / 5);
        }
    }
    /* Two-sample chi-square over tokens with an expected count >= 5 per
     * arm (the rest pooled into one bin). */
    double chi = 0, pool0 = 0, pool1 = 0;
    int dof = -1;
    for (int t = 0; t < vocab; t++) {
        double a = hist[0][t], b = hist[1][t];
        if ((a + b) / 2 >= 5) {
            chi += (a - b) * (a - b) / (a + b);
            dof++;
        } else {
            pool0 += a;
            pool1 += b;
        }
    }
    if (pool0 + pool1 > 0) {
        chi += (pool0 - pool1) * (pool0 - pool1) / (pool0 + pool1);
        dof++;
    }
    ck_assert_int_ge(dof, 2);
    /* 99.9th percentile of chi-square(dof), Wilson-Hilferty. */
    double z = 3.09, k = dof, crit = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
    ck_assert_msg(chi < crit, "chi-square %.1f >= %.1f (dof %d)", chi, crit, dof);
}
START_TEST(test_sampled_distribution)
{
    spec_stats_t spec;

    draft_path = NULL;
    sampled_distribution(&spec);
}
END_TEST

/* ---- draft model --------------------------------------------------- */

/* The default model quantized by mdl_quantize (`kvserve quantize`): 0
 * q8_0, 1 q4_0. */
static const char *
quantized(int which)
{
    static const mdl_quant_t qs[2] = {MDL_QUANT_Q8_0, MDL_QUANT_Q4_0};
    const char *dir = getenv("KVSERVE_MODEL_DIR");
    char err[256] = "";

    if (q_paths[which][0] == '\0') {
        snprintf(q_paths[which], sizeof(q_paths[which]), "/tmp/kvs-spec-draft-%d-%s.gguf",
                 (int)getpid(), mdl_quant_name(qs[which]));
        ck_assert_msg(mdl_quantize(dir != NULL ? dir : KVSERVE_SOURCE_ROOT "/models/austen-2.7m",
                                   q_paths[which], qs[which], err, sizeof(err)) == ST_OK,
                      "%s", err);
    }
    return q_paths[which];
}

static void
remove_quantized(void)
{
    for (int i = 0; i < 2; i++) {
        if (q_paths[i][0] != '\0') {
            unlink(q_paths[i]);
            q_paths[i][0] = '\0';
        }
    }
}

/* A copy of the default model with every weight scaled by 1 + u, u
 * uniform in [-amp, amp] (a fixed stream): a draft with the target's
 * vocabulary whose distributions differ enough that many drafts are
 * rejected, so the chi-square test sees the rejection path's output.
 * A directory under /tmp: config, tokenizer (links) and the weights. */
static char noisy_dir[64];

static const char *self_path(void);

static const char *
noisy_copy(double amp)
{
    static const char *const links[] = {"config.json", "generation_config.json",
                                        "tokenizer.json", "tokenizer_config.json"};
    char src[1200], dst[1200];
    FILE *f;
    uint8_t *buf;
    uint64_t hlen;
    long len;

    snprintf(noisy_dir, sizeof(noisy_dir), "/tmp/kvs-spec-noisy-XXXXXX");
    ck_assert(mkdtemp(noisy_dir) != NULL);
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        snprintf(src, sizeof(src), "%s/%s", self_path(), links[i]);
        snprintf(dst, sizeof(dst), "%s/%s", noisy_dir, links[i]);
        ck_assert_int_eq(symlink(src, dst), 0);
    }
    snprintf(src, sizeof(src), "%s/model.safetensors", self_path());
    f = fopen(src, "rb");
    ck_assert(f != NULL);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = xmalloc((size_t)len);
    ck_assert_int_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    memcpy(&hlen, buf, sizeof(hlen)); /* little-endian u64, then the JSON header */
    ck_assert(strstr((const char *)buf + 8, "F32") != NULL);
    rng_x = 31337;
    for (size_t o = 8 + (size_t)hlen; o + 4 <= (size_t)len; o += 4) {
        float w;
        memcpy(&w, buf + o, 4);
        w *= (float)(1.0 + amp * ((double)rnd(20001) / 10000.0 - 1.0));
        memcpy(buf + o, &w, 4);
    }
    snprintf(dst, sizeof(dst), "%s/model.safetensors", noisy_dir);
    f = fopen(dst, "wb");
    ck_assert(f != NULL);
    ck_assert_int_eq(fwrite(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    free(buf);
    return noisy_dir;
}

static void
remove_noisy(void)
{
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "model.safetensors"};
    char path[1200];

    if (noisy_dir[0] == '\0') {
        return;
    }
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", noisy_dir, files[i]);
        unlink(path);
    }
    rmdir(noisy_dir);
    noisy_dir[0] = '\0';
}

static const char *
self_path(void)
{
    const char *dir = getenv("KVSERVE_MODEL_DIR");

    return dir != NULL ? dir : KVSERVE_SOURCE_ROOT "/models/austen-2.7m";
}

/* KVSERVE_TEST_SCALE (tools/test sets 0.25 under the sanitizers): below 1
 * the draft-model greedy test runs the dtypes beyond f32 and int8 at one
 * batch shape only. */
static double
test_scale(void)
{
    const char *e = getenv("KVSERVE_TEST_SCALE");

    return e != NULL ? atof(e) : 1.0;
}

/* Greedy outputs with a draft model equal the plain ones under every KV
 * cache dtype (the draft's KV lives in the same blocks, in the same
 * dtype). With an f32 and an int8 cache: the default model drafting for
 * itself (every draft accepted but for rounding), and its q8_0 and q4_0
 * copies, at batch 1 and 16. With every other dtype: the q4_0 copy (drafts
 * both accepted and rejected), at batch 1 and 16 (batch 16 only at
 * KVSERVE_TEST_SCALE < 1). */
START_TEST(test_draft_greedy_identical)
{
    static const mdl_kv_dtype_t dts[] = {MDL_KV_F32,  MDL_KV_INT8, MDL_KV_F16, MDL_KV_BF16,
                                         MDL_KV_FP8_E4M3, MDL_KV_INT4, MDL_KV_TQ3, MDL_KV_TQ4};
    enum { N_DT = sizeof(dts) / sizeof(dts[0]) };
    static job_t jobs[N_GREEDY];
    static res_t plain[N_DT][2][MAX_ID][MAX_CH];
    const int reduced = test_scale() < 1.0;
    eng_stats_t st;

    load_model();
    greedy_jobs(jobs);
    for (size_t d = 0; d < N_DT; d++) {
        for (int batch1 = 0; batch1 < 2; batch1++) {
            eng_config_t c = cfg_make(0, dts[d], 512, 0);
            int n = batch1 ? 4 : N_GREEDY;

            if (batch1 && reduced && d >= 2) {
                continue;
            }
            c.max_num_seqs = batch1 ? 1 : 16;
            start(&c);
            run_jobs(jobs, n, 0, 0);
            memcpy(plain[d][batch1], res, sizeof(res));
            finish(jobs, n, &st);
        }
    }
    for (int which = 0; which < 3; which++) {
        draft_path = which == 0 ? self_path() : quantized(which - 1);
        for (size_t d = 0; d < N_DT; d++) {
            if (d >= 2 && which != 2) {
                continue; /* f32 and int8 try every draft; the rest the q4_0 one */
            }
            for (int batch1 = 0; batch1 < 2; batch1++) {
                eng_config_t c = cfg_make(4, dts[d], 512, 0);
                int n = batch1 ? 4 : N_GREEDY;
                char what[64];

                if (batch1 && reduced && d >= 2) {
                    continue;
                }
                c.max_num_seqs = batch1 ? 1 : 16;
                start(&c);
                run_jobs(jobs, n, 0, 0);
                snprintf(what, sizeof(what), "draft %d %s", which, mdl_kv_dtype_name(dts[d]));
                same_outputs(jobs, n, plain[d][batch1], res, what);
                finish(jobs, n, &st);
                fprintf(stderr,
                        "draft %s %s batch%s: %llu drafts, %llu of %llu draft tokens accepted\n",
                        which == 0 ? "self" : which == 1 ? "q8_0" : "q4_0",
                        mdl_kv_dtype_name(dts[d]), batch1 ? "=1" : ">1",
                        (unsigned long long)st.spec.drafts,
                        (unsigned long long)st.spec.accepted_tokens,
                        (unsigned long long)st.spec.draft_tokens);
                ck_assert_uint_gt(st.spec.drafts, 0);
                if (which == 0) {
                    /* The same model: a draft is the target's argmax up to
                     * the rounding of a batched row. */
                    ck_assert_uint_ge(st.spec.accepted_tokens * 100, st.spec.draft_tokens * 95);
                } else {
                    ck_assert_uint_gt(st.spec.accepted_tokens, 0);
                }
                if (which == 2) {
                    ck_assert_uint_lt(st.spec.accepted_tokens, st.spec.draft_tokens);
                }
            }
        }
    }
    draft_path = NULL;
    remove_quantized();
}
END_TEST

/* The randomized schedule (preemption by swap and by recompute, n = 2,
 * stop ids, min_tokens, cancellation) with the q4_0 draft: the draft's KV
 * is swapped, copied and dropped with the target's. */
START_TEST(test_draft_randomized_schedule)
{
    draft_path = quantized(1);
    randomized_schedule();
    draft_path = NULL;
    remove_quantized();
}
END_TEST

/* Temperature 0.8: rejection sampling keeps the target's distribution
 * (the chi-square of the n-gram test), with the q4_0 draft (close to the
 * target: few rejections) and with a copy whose weights are each scaled by
 * a factor uniform in [0, 2]
 * (far from it: many rejections, so the tokens drawn from
 * norm(max(0, p - q)) weigh in the histogram); drafts were both accepted
 * and rejected. */
START_TEST(test_draft_sampled_distribution)
{
    spec_stats_t spec;

    for (int which = 0; which < 2; which++) {
        draft_path = which == 0 ? quantized(1) : noisy_copy(1.0);
        sampled_distribution(&spec);
        fprintf(stderr, "draft %s at T 0.8: %llu drafts, %llu of %llu draft tokens accepted\n",
                which == 0 ? "q4_0" : "noisy", (unsigned long long)spec.drafts,
                (unsigned long long)spec.accepted_tokens, (unsigned long long)spec.draft_tokens);
        ck_assert_uint_gt(spec.accepted_tokens, 0);
        ck_assert_uint_lt(spec.accepted_tokens, spec.draft_tokens);
        if (which == 1) {
            /* Far enough that rejections are common. */
            ck_assert_uint_lt(spec.accepted_tokens * 10, spec.draft_tokens * 9);
        }
    }
    draft_path = NULL;
    remove_quantized();
    remove_noisy();
}
END_TEST

/* A draft model that cannot be used is refused at start-up with one line
 * that says why: a missing file; a vocabulary that differs (the default
 * model with one token renamed in its tokenizer.json). */
START_TEST(test_draft_model_refused)
{
    static const char *const files[] = {"config.json", "generation_config.json",
                                        "model.safetensors", "tokenizer_config.json"};
    char dir[] = "/tmp/kvs-spec-vocab-XXXXXX", path[1200], src[1200], err[512] = "";
    eng_config_t c;
    FILE *f;
    char *text, *at;
    long len;

    load_model();
    draft_path = "/nonexistent/draft";
    c = cfg_make(3, MDL_KV_F32, 64, 0);
    chan_init(&outbox, NULL, NULL);
    ck_assert_int_ne(engine_create(&c, model, &outbox, &eng, err, sizeof(err)), ST_OK);
    ck_assert_msg(strstr(err, "draft model") != NULL && strstr(err, "/nonexistent/draft") != NULL,
                  "%s", err);

    ck_assert(mkdtemp(dir) != NULL);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(src, sizeof(src), "%s/%s", self_path(), files[i]);
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        ck_assert_int_eq(symlink(src, path), 0);
    }
    snprintf(src, sizeof(src), "%s/tokenizer.json", self_path());
    f = fopen(src, "rb");
    ck_assert(f != NULL);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = xmalloc((size_t)len + 1);
    ck_assert_int_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    text[len] = '\0';
    fclose(f);
    at = strstr(text, "\"\xe2\x96\x81year\"");
    ck_assert(at != NULL);
    at[7] = 'R'; /* "_year" -> "_yeaR" */
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    f = fopen(path, "wb");
    ck_assert(f != NULL);
    ck_assert_int_eq(fwrite(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    free(text);
    draft_path = dir;
    c = cfg_make(3, MDL_KV_F32, 64, 0);
    ck_assert_int_ne(engine_create(&c, model, &outbox, &eng, err, sizeof(err)), ST_OK);
    ck_assert_msg(strstr(err, "token 1023 differs") != NULL && strstr(err, "tokenizer") != NULL,
                  "%s", err);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    draft_path = NULL;
    chan_fini(&outbox);
    eng = NULL;
}
END_TEST

/* The draft model runs only in steps where a row speculates (spec_draft.h,
 * DESIGN): with max_batch 1, three requests decoding side by side do not
 * speculate, nor does the prefill; once two have finished, the one left
 * speculates, and its first step catches the draft's KV up over the
 * whole history (prompt and tokens decoded without the draft). Greedy
 * outputs equal the plain ones, every draft of the model drafting for
 * itself is accepted (the catch-up left the draft's KV right), the
 * draft ran in fewer steps than the engine did, and its catch-ups wrote
 * at least the last request's prompt. */
START_TEST(test_draft_mirror_skipped)
{
    static job_t jobs[3];
    static res_t plain[MAX_ID][MAX_CH];
    eng_config_t c;
    eng_stats_t st;
    int64_t fw = 0, cu = 0;
    char err[200], js[1400];

    load_model();
    rng_x = 4242;
    for (int i = 0; i < 3; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        make_prompt(&jobs[i], 1, 50 + 10 * i);
        jobs[i].max_tokens = 16 * (i + 1);
        jobs[i].n = 1;
        jobs[i].stop_id = -1;
        jobs[i].seed = (uint64_t)i + 1;
    }
    c = cfg_make(0, MDL_KV_F32, 512, 0);
    start(&c);
    run_jobs(jobs, 3, 0, 0);
    memcpy(plain, res, sizeof(res));
    finish(jobs, 3, &st);

    c = cfg_make(0, MDL_KV_F32, 512, 0);
    snprintf(js, sizeof(js),
             "{\"method\": \"draft_model\", \"model\": \"%s\", \"num_speculative_tokens\": 4, "
             "\"max_batch\": 1}",
             self_path());
    ck_assert_int_eq(spec_config_parse(js, &c.spec, err, sizeof(err)), ST_OK);
    start(&c);
    run_jobs(jobs, 3, 0, 0);
    spec_draft_counts(eng__draft(eng), &fw, &cu);
    same_outputs(jobs, 3, plain, res, "draft self, max_batch 1");
    finish(jobs, 3, &st);
    fprintf(stderr,
            "draft mirror skipped: %llu steps, %lld draft forwards, %lld catch-up tokens, %llu "
            "of %llu draft tokens accepted\n",
            (unsigned long long)st.steps, (long long)fw, (long long)cu,
            (unsigned long long)st.spec.accepted_tokens, (unsigned long long)st.spec.draft_tokens);
    ck_assert_uint_gt(st.spec.drafts, 0);
    ck_assert_uint_eq(st.spec.accepted_tokens, st.spec.draft_tokens);
    /* Each speculating step (one row) runs the draft k = 4 times at most
     * (the mirror and 3 one-token forwards); the others not at all. */
    ck_assert_int_le(fw, 4 * (int64_t)st.spec.drafts);
    ck_assert_int_lt(fw, (int64_t)st.steps);
    ck_assert_int_ge(cu, jobs[2].n_prompt + 32 - 1);
}
END_TEST

Suite *
scheduler_spec_suite(void)
{
    Suite *s = suite_create("scheduler_spec");
    TCase *tc = tcase_create("spec");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_config_parse);
    tcase_add_test(tc, test_ngram_propose);
    tcase_add_test(tc, test_adaptive_rule);
    tcase_add_test(tc, test_reject_sample);
    tcase_add_test(tc, test_greedy_identical_every_dtype);
    tcase_add_test(tc, test_greedy_identical_constrained);
    tcase_add_test(tc, test_randomized_schedule);
    tcase_add_test(tc, test_sampled_distribution);
    tcase_add_test(tc, test_draft_model_refused);
    tcase_add_test(tc, test_draft_greedy_identical);
    tcase_add_test(tc, test_draft_mirror_skipped);
    tcase_add_test(tc, test_draft_randomized_schedule);
    tcase_add_test(tc, test_draft_sampled_distribution);
    suite_add_tcase(s, tc);
    return s;
}
