/* dev_graph.c - decode and verification steps of a rank (model/dev_fwd.c)
 * as replayed device graphs, one per token-count bucket (CUDA graphs on
 * the cuda backend, a recorder in the emulated tests).
 *
 * DESIGN. A short-row step -- every sequence 1 .. 1 + rc.spec_k new
 * tokens (plain decodes, and speculative verification rows: the pending
 * token and up to k drafts), 16-bit KV, no hidden rows -- of T tokens
 * runs as the step of B tokens, B the smallest bucket >= T (1, 2, 4,
 * ..., and min(max_num_seqs, max_num_batched_tokens) itself; the engine
 * sizes max_num_seqs for (1 + k) rows per sequence). Its inputs are
 * staged in a fixed layout that depends on B and max_blocks_per_seq only,
 * with B sequence slots, B logits rows, uploaded with one copy, and the
 * forward mdl__dev_fwd_run() enqueues for that shape (the per-token
 * attention kernel, which finds each token's sequence through
 * query_start) reads them from stage_dev, so the graph recorded once for
 * B serves every later step of B whatever its mix of decodes and
 * verification rows, tokens, positions, slots, lengths and tables:
 *
 *   stage = tokens[B] | positions[B] | slots[B] | query_start[B + 1] |
 *           context_len[B] | logits_rows[B] | block_tables[B][max_blocks_per_seq]
 *           [| mass_rows[B]]
 *
 * A step of S sequences and T tokens: sequences 0 .. S-1 as given; the
 * padding tokens T .. B-1 are one-token sequences S .. S + B-T-1: token
 * 0 at position 0, slot -1 (kv_write skips it: a padded token writes no
 * KV anywhere), context length 1 over table [0] (the null block, which
 * blockmgr never hands out: attention reads one row of it); the
 * sequence slots left (S + B-T .. B-1) are empty (query_start B), which
 * no token maps to. Logits rows past n_logits are the rows themselves.
 * Tokens are independent through every kernel and GEMM but attention,
 * which reads only its own sequence's KV, so padding changes no real
 * row; only the first n_logits logits rows go back to the host. With
 * T == S this is the decode layout (one token per sequence).
 *
 * A bucket's first step runs eagerly (it also loads modules and lets
 * cuBLAS choose its kernels outside a capture) and is then recorded,
 * which runs nothing; later steps of the bucket launch the graph. A
 * failed recording turns replays off for the rank (logged once); its
 * short-row steps keep the padded shape, so tensor-parallel ranks still
 * pair their all-reduces. Pointers in a graph are the rank's fixed
 * buffers and weights and the KV pool: copies, swaps and shifts change
 * block contents, never addresses, so graphs live as long as the rank.
 *
 * A step with rows that accumulate attention mass (H2O / SnapKV,
 * model/dev_mass.c) stages its mass rows (padding: 0) and runs the
 * bucket's second graph, recorded with the mass kernels (graph_mass), so
 * steps without such rows launch none of them.
 *
 * Per step with a graph: one host staging copy, one upload, one graph
 * launch, one logits copy of n_logits rows, one sync.
 */
#define LOG_MODULE "devgraph"

#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "model/dev_fwd.h"
#include "model/model_int.h"

void
mdl__dev_graph_init(mdl_dev_rank_t *rk)
{
    int32_t cap = rk->rc.max_num_seqs < rk->rc.max_num_batched_tokens
                      ? rk->rc.max_num_seqs
                      : rk->rc.max_num_batched_tokens;

    rk->n_buckets = 0;
    for (int32_t r = 1; r < cap && rk->n_buckets < MDL_DEV_MAX_BUCKETS - 1; r *= 2) {
        rk->graph_rows[rk->n_buckets++] = r;
    }
    if (cap >= 1) {
        rk->graph_rows[rk->n_buckets++] = cap;
    }
    rk->graphs_off = !rk->rc.cuda_graphs || rk->ops->graph_begin == NULL ||
                     rk->ops->graph_end == NULL || rk->ops->graph_launch == NULL ||
                     rk->kq.fmt != 0 || rk->tq_bits != 0 || rk->n_buckets == 0;
}

int
mdl__dev_step_short(const mdl_dev_rank_t *rk, const mdl_batch_t *b)
{
    const int32_t q_max = 1 + (rk->rc.spec_k > 0 ? rk->rc.spec_k : 0);

    if (b->n_tokens == b->n_seqs) {
        return 1;
    }
    if (b->n_tokens > b->n_seqs * q_max) {
        return 0;
    }
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (b->query_start[s + 1] - b->query_start[s] > q_max) {
            return 0;
        }
    }
    return 1;
}

int
mdl__dev_graph_takes(const mdl_dev_rank_t *rk, const mdl_batch_t *b)
{
    return !rk->graphs_off && b->n_logits <= b->n_tokens && b->n_hidden == 0 &&
           b->n_tokens <= rk->graph_rows[rk->n_buckets - 1] && mdl__dev_step_short(rk, b);
}

/* Stages b padded to B tokens in the bucket layout (see the file
 * comment); returns the int32 entries written. */
static size_t
dev_graph_stage(mdl_dev_rank_t *rk, const mdl_batch_t *b, int32_t B, mdl_dev_step_t *p)
{
    const int32_t n = b->n_seqs, T = b->n_tokens, mb = rk->rc.max_blocks_per_seq;
    int32_t *h = rk->stage_host;

    memset(p, 0, sizeof(*p));
    p->T = p->S = p->n_logits = B;
    p->max_blocks = mb;
    p->o_pos = (size_t)B;
    p->o_slot = 2 * (size_t)B;
    p->o_qs = 3 * (size_t)B;
    p->o_ctx = 4 * (size_t)B + 1;
    p->o_rows = 5 * (size_t)B + 1;
    p->o_bt = 6 * (size_t)B + 1;
    p->o_tiles = p->o_rs = p->o_own = p->o_jobs = p->o_bt + (size_t)B * mb;

    memcpy(h, b->tokens, sizeof(int32_t) * T);
    memcpy(h + p->o_pos, b->positions, sizeof(int32_t) * T);
    memcpy(h + p->o_slot, b->slot_mapping, sizeof(int32_t) * T);
    memcpy(h + p->o_qs, b->query_start, sizeof(int32_t) * (n + 1));
    memcpy(h + p->o_ctx, b->context_len, sizeof(int32_t) * n);
    if (b->n_logits > 0) {
        memcpy(h + p->o_rows, b->logits_rows, sizeof(int32_t) * b->n_logits);
    }
    for (int32_t s = 0; s < n; s++) {
        memcpy(h + p->o_bt + (size_t)s * mb, mdl_batch_table(b, s),
               sizeof(int32_t) * b->max_blocks);
    }
    for (int32_t t = T; t < B; t++) { /* padding tokens: one-token sequences */
        int32_t s = n + (t - T);

        h[t] = 0;
        h[p->o_pos + t] = 0;
        h[p->o_slot + t] = -1;
        h[p->o_qs + s + 1] = t + 1;
        h[p->o_ctx + s] = 1;
        h[p->o_bt + (size_t)s * mb] = 0;
    }
    for (int32_t s = n + (B - T); s < B; s++) { /* empty sequence slots */
        h[p->o_qs + s + 1] = B;
        h[p->o_ctx + s] = 1;
        h[p->o_bt + (size_t)s * mb] = 0;
    }
    for (int32_t r = b->n_logits; r < B; r++) {
        h[p->o_rows + r] = r;
    }
    p->o_mass = p->o_tiles;
    p->mass = rk->mass != NULL && b->mass_rows != NULL;
    if (p->mass) {
        for (int32_t s = 0; s < B; s++) {
            h[p->o_mass + s] = s < n && b->mass_rows[s] != 0;
        }
        rk->n_mass_steps++;
        return p->o_mass + (size_t)B;
    }
    return p->o_tiles;
}

/* Records the bucket's step into rk->graph[bi]; on failure turns replays
 * off for the rank. Runs nothing on the device. */
static void
dev_graph_capture(mdl_dev_rank_t *rk, int32_t bi, const mdl_dev_step_t *p, void **slot)
{
    const mdl_dev_ops_t *o = rk->ops;
    void *g = NULL;
    int st, st_end;

    st = o->graph_begin(rk->ctx);
    if (st == ST_OK) {
        st = mdl__dev_fwd_run(rk, p);
        st_end = o->graph_end(rk->ctx, &g); /* ends the recording whatever st is */
        st = st != ST_OK ? st : st_end;
    }
    if (st != ST_OK) {
        if (o->graph_free != NULL) {
            o->graph_free(rk->ctx, g);
        }
        LOG_WARN("rank %d: recording the step graph of %d tokens failed (%s); decode and "
                 "verification steps run eagerly",
                 rk->rank, rk->graph_rows[bi], st_str(st));
        rk->graph_failed = 1;
        return;
    }
    *slot = g;
    rk->n_graph_captures++;
    LOG_DEBUG("rank %d: step graph of %d tokens recorded", rk->rank, rk->graph_rows[bi]);
}

int
mdl__dev_graph_forward(mdl_dev_rank_t *rk, const mdl_batch_t *b)
{
    const mdl_dev_ops_t *o = rk->ops;
    void *cx = rk->ctx;
    mdl_dev_step_t p;
    int32_t bi = 0, B;
    size_t n_int;
    int st;

    while (rk->graph_rows[bi] < b->n_tokens) {
        bi++;
    }
    B = rk->graph_rows[bi];
    n_int = dev_graph_stage(rk, b, B, &p);
    if ((st = o->copy(cx, rk->stage_dev, rk->stage_host, sizeof(int32_t) * n_int, KV_OP_SWAP_IN)) !=
        ST_OK) {
        return st;
    }
    void **slot = p.mass ? &rk->graph_mass[bi] : &rk->graph[bi];

    if (*slot != NULL) {
        st = o->graph_launch(cx, *slot);
        rk->n_graph_steps++;
    } else {
        /* First step of the bucket (or replays off): eagerly, then record. */
        st = mdl__dev_fwd_run(rk, &p);
        rk->n_eager_steps++;
        if (st == ST_OK && !rk->graph_failed) {
            dev_graph_capture(rk, bi, &p, slot);
        }
    }
    if (st == ST_OK && rk->rank == 0 && b->n_logits > 0) {
        st = o->copy(cx, rk->logits_host, rk->logits_dev,
                     sizeof(float) * (size_t)b->n_logits * rk->m->cfg.vocab_size, KV_OP_SWAP_OUT);
    }
    if (st == ST_OK) {
        st = o->sync(cx);
    }
    return st;
}

void
mdl__dev_graph_fini(mdl_dev_rank_t *rk)
{
    for (int32_t i = 0; i < MDL_DEV_MAX_BUCKETS; i++) {
        if (rk->graph[i] != NULL && rk->ops->graph_free != NULL) {
            rk->ops->graph_free(rk->ctx, rk->graph[i]);
        }
        if (rk->graph_mass[i] != NULL && rk->ops->graph_free != NULL) {
            rk->ops->graph_free(rk->ctx, rk->graph_mass[i]);
        }
        rk->graph[i] = rk->graph_mass[i] = NULL;
    }
}
