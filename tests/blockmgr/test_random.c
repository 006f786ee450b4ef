/* test_random.c - randomized model-based test of the block manager.
 *
 * Each seed runs 100,000 random operations (admit = create + prefix
 * lookup + prompt reserve, decode reserve, free, fork, truncate, swap out,
 * swap in, cache reset) against a reference model that keeps, per
 * sequence, its token ids, tenant and swapped state, with bm_pool_check()
 * after every operation.
 *
 * Block contents are simulated: a shadow store holds, per physical slot of
 * each tier, the token id and the tenant's salt group that wrote it.
 * Operations are grouped into steps like the engine's: the step's queued
 * ops are applied to the shadow store in queue order, then the tokens of
 * every reserve of the step are written through their slots (the forward).
 * After each step every sequence must read back exactly its own tokens,
 * written by its own salt group, through its block table, whatever was
 * shared, copied, swapped, demoted or promoted.
 *
 * The generator follows the step contract of blockmgr.h: a sequence that
 * reserved this step (or was forked) is not reserved again, freed,
 * truncated or swapped out in the same step; one that may hold blocks
 * written this step (reserve, lookup, fork, swap-in) is not truncated,
 * swapped out or forked.
 *
 * Seeds with drop ops and policies also turn on bm_config_t.drop_ops (a
 * DROP poisons the block's shadow slots: whoever reads them after without
 * rewriting fails), sliding-window release_front, nohash sequences (no
 * prefix hits) and attention-sink evictions (the model closes the gap in
 * its tokens; EINVAL only for a sequence that may share a later block).
 *
 * Pools are small (tens of blocks) so that exhaustion, eviction, demotion
 * and EAGAIN paths are hit constantly; every EAGAIN is checked to change
 * nothing and to be justified by the *_needed() figures. Every 5th
 * reserve first fails its first host allocation, if it makes one: that
 * must be ST_ENOMEM changing nothing, and the reserve is then redone.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"

/* Assertions for the hot loop. Check's ck_assert_* report every passing
 * check through a pipe in fork mode, which costs a syscall each; these
 * only call into Check on failure. */
#define REQ(c)                                                                                     \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            ck_abort_msg("%s:%d: %s", __FILE__, __LINE__, #c);                                     \
        }                                                                                          \
    } while (0)
#define REQ_CMP(a, op, b)                                                                          \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ op b_)) {                                                                         \
            ck_abort_msg("%s:%d: %s %s %s (%lld vs %lld)", __FILE__, __LINE__, #a, #op, #b, a_,    \
                         b_);                                                                      \
        }                                                                                          \
    } while (0)

#define N_OPS 100000
#define MAXS 24
#define MAXLEN 160
#define N_TENANTS 3

typedef struct mseq {
    int live;
    uint64_t id;
    uint32_t tenant;
    int swapped;
    int wrote;   /* reserved (or forked) this step: pending writes */
    int nohash;  /* bm_seq_set_nohash: never hashed, evictable */
    int forked;  /* was a fork's parent or child: may share blocks */
    int compacted; /* compacted after a prefix hit: may keep shared blocks */
    uint32_t released; /* leading blocks given back (release_front) */
    int tainted; /* may hold blocks with pending writes */
    uint32_t len;
    int32_t toks[MAXLEN];
} mseq_t;

typedef struct wr {
    int32_t slot;
    int32_t tok;
    int8_t grp;
} wr_t;

typedef struct rt {
    bm_pool_t *pool;
    bm_config_t cfg;
    uint64_t rng;
    uint64_t next_id;
    mseq_t s[MAXS];
    int32_t *dev_tok, *cpu_tok;
    int8_t *dev_grp, *cpu_grp;
    wr_t *wr;
    uint32_t n_wr;
    int32_t tmpl[4][64];
    /* what happened, to make sure the run exercised every path */
    uint64_t n_ok[16], n_eagain[16];
    uint64_t n_enomem; /* reserves failed on purpose for memory (every 5th) */
    int policy;        /* run release_front, nohash and evict ops */
    uint64_t n_drops;  /* DROP / DROP_SWAP ops applied */
    uint64_t n_private; /* compactions that took private copies */
    uint64_t n_slot_copies; /* KV_OP_COPY_SLOT ops applied */
} rt_t;

enum {
    OP_ADMIT,
    OP_DECODE,
    OP_FREE,
    OP_FORK,
    OP_TRUNC,
    OP_SWOUT,
    OP_SWIN,
    OP_RESET,
    OP_RELEASE,
    OP_EVICT,
    OP_COMPACT,
    OP_COUNT
};

#define POISON_TOK (-7)
#define POISON_GRP 99

static uint32_t
rnd(rt_t *r, uint32_t n)
{
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return (uint32_t)((r->rng * 0x2545F4914F6CDD1DULL) >> 33) % n;
}

/* Tenants 0 and 1 share a salt; tenant 2 keeps its own. */
static int8_t
group_of(uint32_t tenant)
{
    return tenant == 2 ? 1 : 0;
}

static mseq_t *
pick(rt_t *r, int want_live)
{
    uint32_t start = rnd(r, MAXS);

    for (uint32_t k = 0; k < MAXS; k++) {
        mseq_t *m = &r->s[(start + k) % MAXS];
        if (m->live == want_live) {
            return m;
        }
    }
    return NULL;
}

static int32_t
rand_tok(rt_t *r)
{
    return (int32_t)rnd(r, 6); /* tiny alphabet: frequent equal blocks */
}

typedef struct snap {
    bm_stats_t st;
    uint32_t n_ops;
    uint32_t len, nb;
    int32_t table[MAXLEN + 1];
    int swapped;
} snap_t;

static void
take_snap(rt_t *r, const mseq_t *m, snap_t *sn)
{
    const int32_t *t = bm_seq_table(r->pool, m->id, &sn->nb);

    memset(sn, 0, sizeof(*sn));
    bm_pool_stats(r->pool, &sn->st);
    bm_pool_ops(r->pool, &sn->n_ops);
    t = bm_seq_table(r->pool, m->id, &sn->nb);
    if (sn->nb > 0) {
        memcpy(sn->table, t, sn->nb * sizeof(*t));
    }
    sn->len = bm_seq_len(r->pool, m->id);
    sn->swapped = bm_seq_is_swapped(r->pool, m->id);
}

static void
expect_unchanged(rt_t *r, const mseq_t *m, const snap_t *a)
{
    snap_t b;

    take_snap(r, m, &b);
    REQ(memcmp(&a->st, &b.st, sizeof(a->st)) == 0);
    REQ_CMP(a->n_ops, ==, b.n_ops);
    REQ_CMP(a->len, ==, b.len);
    REQ_CMP(a->nb, ==, b.nb);
    REQ(memcmp(a->table, b.table, a->nb * sizeof(int32_t)) == 0);
    REQ_CMP(a->swapped, ==, b.swapped);
}

static unsigned long n_reserves;

/* Reserve toks for m; on success record the forward's writes. */
static int
do_reserve(rt_t *r, mseq_t *m, const int32_t *toks, uint32_t n)
{
    int32_t slots[MAXLEN];
    uint32_t need = bm_seq_blocks_needed(r->pool, m->id, n);
    uint32_t avail = bm_pool_free_blocks(r->pool);
    snap_t sn;
    int rc;

    take_snap(r, m, &sn);
    /* Every 5th reserve runs out of host memory at its first fallible
     * allocation (if it makes one): ST_ENOMEM, nothing changed, and the
     * same reserve then goes on as without the failure. */
    if (++n_reserves % 5 == 0) {
        xmalloc_fail_after(1);
        rc = bm_seq_reserve(r->pool, m->id, toks, n, slots);
        if (xmalloc_fail_pending() == 0) {
            REQ_CMP(rc, ==, ST_ENOMEM);
            expect_unchanged(r, m, &sn);
            bm_pool_check(r->pool);
            r->n_enomem++;
            rc = bm_seq_reserve(r->pool, m->id, toks, n, slots);
        }
        xmalloc_fail_after(0);
    } else {
        rc = bm_seq_reserve(r->pool, m->id, toks, n, slots);
    }
    if (rc == ST_EAGAIN) {
        REQ_CMP(need, >, avail);
        expect_unchanged(r, m, &sn);
        r->n_eagain[OP_DECODE]++;
        return rc;
    }
    REQ_CMP(rc, ==, ST_OK);
    REQ_CMP(need, <=, avail);
    {
        uint32_t nb;
        const int32_t *t = bm_seq_table(r->pool, m->id, &nb);
        uint32_t bs = r->cfg.block_size;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t pos = m->len + i;
            REQ_CMP(slots[i], ==, t[pos / bs] * (int32_t)bs + (int32_t)(pos % bs));
            REQ_CMP(t[pos / bs], >, 0);
            r->wr[r->n_wr].slot = slots[i];
            r->wr[r->n_wr].tok = toks[i];
            r->wr[r->n_wr].grp = group_of(m->tenant);
            r->n_wr++;
            m->toks[pos] = toks[i];
        }
    }
    m->len += n;
    m->wrote = m->tainted = 1;
    r->n_ok[OP_DECODE]++;
    return rc;
}

static void
op_admit(rt_t *r)
{
    mseq_t *m = pick(r, 0);
    int32_t prompt[MAXLEN];
    uint32_t n, nc, probe, k;

    if (m == NULL) {
        return;
    }
    n = 1 + rnd(r, 48);
    k = rnd(r, 3) != 0 ? rnd(r, n + 1) : 0; /* shared template prefix */
    {
        const int32_t *tp = r->tmpl[rnd(r, 4)];
        for (uint32_t i = 0; i < n; i++) {
            prompt[i] = i < k ? tp[i] : rand_tok(r);
        }
    }
    memset(m, 0, sizeof(*m));
    m->id = r->next_id++;
    m->tenant = rnd(r, N_TENANTS);
    m->live = 1;
    REQ_CMP(bm_seq_create(r->pool, m->id, m->tenant), ==, ST_OK);
    if (r->policy && rnd(r, 3) == 0) {
        REQ_CMP(bm_seq_set_nohash(r->pool, m->id), ==, ST_OK);
        m->nohash = 1;
    }
    probe = bm_prefix_probe(r->pool, m->tenant, prompt, n);
    REQ_CMP(bm_seq_lookup_prefix(r->pool, m->id, prompt, n, &nc), ==, ST_OK);
    REQ_CMP(nc, <=, probe);
    REQ_CMP(nc % r->cfg.block_size, ==, 0);
    REQ_CMP(nc, <, n);
    if (!r->cfg.prefix_caching || m->nohash) {
        REQ_CMP(nc, ==, 0);
    }
    memcpy(m->toks, prompt, nc * sizeof(*prompt));
    m->len = nc;
    m->tainted = 1;
    bm_pool_check(r->pool);
    r->n_ok[OP_ADMIT]++;
    if (rnd(r, 5) != 0) {
        if (do_reserve(r, m, prompt + nc, n - nc) != ST_OK && rnd(r, 2) == 0) {
            /* Admission failed: give back what the lookup attached. */
            bm_seq_free(r->pool, m->id);
            m->live = 0;
        }
    }
}

static void
op_decode(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    int32_t toks[MAXLEN];
    uint32_t n;

    if (m == NULL || m->swapped || m->wrote) {
        return;
    }
    n = rnd(r, 4) == 0 ? 1 + rnd(r, 2 * r->cfg.block_size + 1) : 1;
    if (m->len + n > MAXLEN) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        toks[i] = rand_tok(r);
    }
    do_reserve(r, m, toks, n);
}

static void
op_free(rt_t *r)
{
    mseq_t *m = pick(r, 1);

    if (m == NULL || m->wrote) {
        return;
    }
    bm_seq_free(r->pool, m->id);
    REQ(!bm_seq_exists(r->pool, m->id));
    m->live = 0;
    r->n_ok[OP_FREE]++;
}

static void
op_fork(rt_t *r)
{
    mseq_t *p = pick(r, 1);
    mseq_t *c = pick(r, 0);

    if (p == NULL || c == NULL) {
        return;
    }
    c->id = r->next_id++;
    if (p->swapped) {
        REQ_CMP(bm_seq_fork(r->pool, p->id, c->id), ==, ST_EINVAL);
        return;
    }
    if (p->tainted && !p->wrote) {
        return;
    }
    REQ_CMP(bm_seq_fork(r->pool, p->id, c->id), ==, ST_OK);
    c->live = 1;
    c->tenant = p->tenant;
    c->swapped = 0;
    c->nohash = p->nohash;
    c->compacted = p->compacted;
    c->released = p->released;
    c->forked = p->forked = 1;
    c->len = p->len;
    memcpy(c->toks, p->toks, p->len * sizeof(*p->toks));
    c->wrote = c->tainted = p->wrote = p->tainted = 1;
    r->n_ok[OP_FORK]++;
}

static void
op_trunc(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    uint32_t n;

    if (m == NULL || m->tainted || m->released > 0) {
        return;
    }
    if (m->swapped) {
        REQ_CMP(bm_seq_truncate(r->pool, m->id, 0), ==, ST_EINVAL);
        return;
    }
    n = rnd(r, m->len + 1);
    if (rnd(r, 2)) {
        n = n > r->cfg.block_size ? r->cfg.block_size : n; /* mostly short rollbacks */
    }
    REQ_CMP(bm_seq_truncate(r->pool, m->id, n), ==, ST_OK);
    m->len -= n;
    r->n_ok[OP_TRUNC]++;
}

static void
op_swap_out(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    snap_t sn;
    int rc;

    if (m == NULL || m->tainted || m->swapped) {
        return;
    }
    take_snap(r, m, &sn);
    rc = bm_seq_swap_out(r->pool, m->id);
    if (rc == ST_EAGAIN) {
        expect_unchanged(r, m, &sn);
        r->n_eagain[OP_SWOUT]++;
        return;
    }
    REQ_CMP(rc, ==, ST_OK);
    REQ(bm_seq_is_swapped(r->pool, m->id));
    m->swapped = 1;
    r->n_ok[OP_SWOUT]++;
}

static void
op_swap_in(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    uint32_t need, avail;
    snap_t sn;
    int rc;

    if (m == NULL || !m->swapped) {
        return;
    }
    need = bm_seq_swap_in_needed(r->pool, m->id);
    avail = bm_pool_free_blocks(r->pool);
    take_snap(r, m, &sn);
    rc = bm_seq_swap_in(r->pool, m->id);
    if (rc == ST_EAGAIN) {
        REQ_CMP(need, >, avail);
        expect_unchanged(r, m, &sn);
        r->n_eagain[OP_SWIN]++;
        return;
    }
    REQ_CMP(rc, ==, ST_OK);
    REQ_CMP(need, <=, avail);
    REQ(!bm_seq_is_swapped(r->pool, m->id));
    m->swapped = 0;
    m->tainted = 1;
    r->n_ok[OP_SWIN]++;
}

/* Sliding window: give back 0..2 more leading blocks. */
static void
op_release_front(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    uint32_t bs = r->cfg.block_size, nb, n;
    int rc;

    if (m == NULL || m->tainted) {
        return;
    }
    nb = (m->len + bs - 1) / bs;
    n = m->released + rnd(r, 3);
    rc = bm_seq_release_front(r->pool, m->id, n);
    if (m->swapped) {
        REQ_CMP(rc, ==, ST_EINVAL);
        return;
    }
    if (nb < n + 2) {
        REQ_CMP(rc, ==, ST_EINVAL); /* fewer than two live blocks would remain */
        r->n_eagain[OP_RELEASE]++;
        return;
    }
    REQ_CMP(rc, ==, ST_OK);
    REQ_CMP(bm_seq_released(r->pool, m->id), ==, n > m->released ? n : m->released);
    m->released = n > m->released ? n : m->released;
    r->n_ok[OP_RELEASE]++;
}

/* Attention sinks: evict a run of whole blocks before the last one of a
 * nohash sequence; the model drops those tokens. */
static void
op_evict(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    uint32_t bs = r->cfg.block_size, nb, first, n;
    int rc;

    if (m == NULL || m->tainted || !m->nohash) {
        return;
    }
    nb = (m->len + bs - 1) / bs;
    if (nb < m->released + 2) {
        return;
    }
    first = m->released + rnd(r, nb - 1 - m->released);
    n = 1 + rnd(r, nb - 1 - first);
    rc = bm_seq_evict(r->pool, m->id, first, n);
    if (m->swapped) {
        REQ_CMP(rc, ==, ST_EINVAL);
        return;
    }
    if (rc == ST_EINVAL) {
        /* A later block may be shared with a fork, or be a prefix block
         * a compaction left in place. */
        REQ(m->forked || m->compacted);
        r->n_eagain[OP_EVICT]++;
        return;
    }
    REQ_CMP(rc, ==, ST_OK);
    memmove(m->toks + first * bs, m->toks + (first + n) * bs,
            (m->len - (first + n) * bs) * sizeof(*m->toks));
    m->len -= n * bs;
    REQ_CMP(bm_seq_len(r->pool, m->id), ==, m->len);
    r->n_ok[OP_EVICT]++;
}

/* Heavy hitters / SnapKV: keep a random subset of a sequence's tokens
 * (always its last one, as the policies keep the recent window); the
 * model keeps the same subset. Shared or cached blocks past the first
 * moved token must become private copies; EAGAIN only when those find no
 * room, changing nothing. */
static void
op_compact(rt_t *r)
{
    mseq_t *m = pick(r, 1);
    uint32_t keep[MAXLEN], n = 0, need, avail;
    snap_t sn;
    int rc;

    if (m == NULL || m->tainted || m->len < 2) {
        return;
    }
    for (uint32_t i = 0; i + 1 < m->len; i++) {
        if (rnd(r, 3) != 0) {
            keep[n++] = i;
        }
    }
    keep[n++] = m->len - 1;
    rc = bm_seq_compact(r->pool, m->id, keep, n);
    if (m->swapped || m->released > 0) {
        REQ_CMP(rc, ==, ST_EINVAL);
        return;
    }
    need = bm_seq_compact_needed(r->pool, m->id, keep, n);
    avail = bm_pool_free_blocks(r->pool);
    if (rc == ST_EAGAIN) {
        take_snap(r, m, &sn);
        REQ_CMP(need, >, avail);
        REQ_CMP(bm_seq_compact(r->pool, m->id, keep, n), ==, ST_EAGAIN);
        expect_unchanged(r, m, &sn);
        r->n_eagain[OP_COMPACT]++;
        return;
    }
    REQ_CMP(rc, ==, ST_OK);
    /* A shuffled duplicate index is refused. */
    if (n >= 2) {
        uint32_t bad[2] = {keep[1], keep[0]};
        REQ_CMP(bm_seq_compact(r->pool, m->id, bad, 2), ==, ST_EINVAL);
    }
    for (uint32_t i = 0; i < n; i++) {
        m->toks[i] = m->toks[keep[i]];
    }
    r->n_private += bm_seq_len(r->pool, m->id) == n && n < m->len && m->forked;
    m->len = n;
    m->nohash = m->compacted = 1;
    REQ_CMP(bm_seq_len(r->pool, m->id), ==, n);
    r->n_ok[OP_COMPACT]++;
}

/* End of step: ops in queue order, then the forward's writes; then every
 * sequence reads back its own tokens. */
static void
end_step(rt_t *r)
{
    uint32_t n, bs = r->cfg.block_size;
    const kv_op_t *ops = bm_pool_ops(r->pool, &n);

    for (uint32_t i = 0; i < n; i++) {
        if (ops[i].kind == KV_OP_SHIFT) {
            continue; /* re-rotates keys; the tokens stay */
        }
        if (ops[i].kind == KV_OP_COPY_SLOT) {
            REQ(r->dev_tok[ops[i].src] != POISON_TOK); /* never reads dead bytes */
            r->dev_tok[ops[i].dst] = r->dev_tok[ops[i].src];
            r->dev_grp[ops[i].dst] = r->dev_grp[ops[i].src];
            r->n_slot_copies++;
            continue;
        }
        if (ops[i].kind == KV_OP_DROP || ops[i].kind == KV_OP_DROP_SWAP) {
            /* Its bytes are dead: nobody may read them before a write. */
            int32_t *pt = ops[i].kind == KV_OP_DROP ? r->dev_tok : r->cpu_tok;
            int8_t *pg = ops[i].kind == KV_OP_DROP ? r->dev_grp : r->cpu_grp;

            REQ(r->cfg.drop_ops);
            REQ_CMP(ops[i].src, ==, ops[i].dst);
            for (uint32_t j = 0; j < bs; j++) {
                pt[(size_t)ops[i].src * bs + j] = POISON_TOK;
                pg[(size_t)ops[i].src * bs + j] = POISON_GRP;
            }
            r->n_drops++;
            continue;
        }
        int32_t *st = ops[i].kind == KV_OP_SWAP_IN ? r->cpu_tok : r->dev_tok;
        int8_t *sg = ops[i].kind == KV_OP_SWAP_IN ? r->cpu_grp : r->dev_grp;
        int32_t *dt = ops[i].kind == KV_OP_SWAP_OUT ? r->cpu_tok : r->dev_tok;
        int8_t *dg = ops[i].kind == KV_OP_SWAP_OUT ? r->cpu_grp : r->dev_grp;
        memmove(dt + (size_t)ops[i].dst * bs, st + (size_t)ops[i].src * bs, bs * sizeof(*dt));
        memmove(dg + (size_t)ops[i].dst * bs, sg + (size_t)ops[i].src * bs, bs * sizeof(*dg));
    }
    bm_pool_ops_clear(r->pool);
    for (uint32_t i = 0; i < r->n_wr; i++) {
        r->dev_tok[r->wr[i].slot] = r->wr[i].tok;
        r->dev_grp[r->wr[i].slot] = r->wr[i].grp;
    }
    r->n_wr = 0;

    for (uint32_t k = 0; k < MAXS; k++) {
        mseq_t *m = &r->s[k];
        const int32_t *t;
        const int32_t *tok;
        const int8_t *grp;
        uint32_t nb;

        if (!m->live) {
            continue;
        }
        m->wrote = m->tainted = 0;
        REQ(bm_seq_exists(r->pool, m->id));
        REQ_CMP(bm_seq_len(r->pool, m->id), ==, m->len);
        REQ_CMP(bm_seq_is_swapped(r->pool, m->id), ==, m->swapped);
        t = bm_seq_table(r->pool, m->id, &nb);
        REQ_CMP(nb, ==, (m->len + bs - 1) / bs);
        tok = m->swapped ? r->cpu_tok : r->dev_tok;
        grp = m->swapped ? r->cpu_grp : r->dev_grp;
        for (uint32_t i = 0; i < m->len; i++) {
            if (i / bs < m->released) {
                REQ_CMP(t[i / bs], ==, 0); /* released: the null block, kept in place */
                continue;
            }
            size_t slot = (size_t)t[i / bs] * bs + i % bs;
            if (tok[slot] != m->toks[i] || grp[slot] != group_of(m->tenant)) {
                ck_abort_msg("seq %llu pos %u reads %d/%d, wrote %d/%d (block %d, %s)",
                             (unsigned long long)m->id, i, tok[slot], grp[slot], m->toks[i],
                             group_of(m->tenant), t[i / bs], m->swapped ? "cpu" : "dev");
            }
        }
    }
}

/* Per-tenant accounting (both tiers) against a brute-force count over
 * the tables. */
static void
check_tenants(rt_t *r)
{
    uint32_t nblk = r->cfg.num_blocks > r->cfg.swap_blocks ? r->cfg.num_blocks : r->cfg.swap_blocks;
    uint8_t *mark = calloc(nblk, 1);

    for (int swapped = 0; swapped <= 1; swapped++) {
        for (uint32_t ten = 0; ten < N_TENANTS; ten++) {
            uint32_t cnt = 0;
            memset(mark, 0, nblk);
            for (uint32_t k = 0; k < MAXS; k++) {
                const mseq_t *m = &r->s[k];
                uint32_t nb;
                const int32_t *t;
                if (!m->live || m->swapped != swapped || m->tenant != ten) {
                    continue;
                }
                t = bm_seq_table(r->pool, m->id, &nb);
                for (uint32_t i = m->released; i < nb; i++) {
                    cnt += !mark[t[i]];
                    mark[t[i]] = 1;
                }
            }
            REQ_CMP(swapped ? bm_tenant_swap_blocks(r->pool, ten) : bm_tenant_blocks(r->pool, ten),
                    ==, cnt);
        }
    }
    free(mark);
}

/* flags: RUN_DROP sets drop_ops, RUN_POLICY adds release_front, nohash
 * and evict ops. */
#define RUN_DROP 1
#define RUN_POLICY 2

static void
run_seed_flags(uint64_t seed, uint32_t bs, uint32_t dev, uint32_t cpu, int prefix, int flags)
{
    rt_t *r = calloc(1, sizeof(*r));
    uint32_t op = 0;
    bm_stats_t st;

    r->cfg.block_size = bs;
    r->cfg.num_blocks = dev + 1;
    r->cfg.swap_blocks = cpu;
    r->cfg.prefix_caching = prefix;
    r->cfg.watermark = 0.05f;
    r->cfg.drop_ops = (flags & RUN_DROP) != 0;
    r->policy = (flags & RUN_POLICY) != 0;
    r->rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    r->next_id = seed << 32;
    REQ_CMP(bm_pool_create(&r->cfg, &r->pool), ==, ST_OK);
    REQ_CMP(bm_tenant_set_salt(r->pool, 0, "shared", 6), ==, ST_OK);
    REQ_CMP(bm_tenant_set_salt(r->pool, 1, "shared", 6), ==, ST_OK);
    r->dev_tok = malloc((size_t)(dev + 1) * bs * sizeof(int32_t));
    r->dev_grp = malloc((size_t)(dev + 1) * bs);
    r->cpu_tok = malloc((size_t)(cpu + 1) * bs * sizeof(int32_t));
    r->cpu_grp = malloc((size_t)(cpu + 1) * bs);
    memset(r->dev_tok, 0xff, (size_t)(dev + 1) * bs * sizeof(int32_t));
    memset(r->dev_grp, 0x7f, (size_t)(dev + 1) * bs);
    memset(r->cpu_tok, 0xff, (size_t)(cpu + 1) * bs * sizeof(int32_t));
    memset(r->cpu_grp, 0x7f, (size_t)(cpu + 1) * bs);
    r->wr = malloc((size_t)MAXS * MAXLEN * 4 * sizeof(*r->wr));
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 64; i++) {
            r->tmpl[t][i] = rand_tok(r);
        }
    }

    while (op < N_OPS) {
        uint32_t n_step = 1 + rnd(r, 10);
        for (uint32_t k = 0; k < n_step; k++, op++) {
            uint32_t x = rnd(r, r->policy ? 120 : 100);
            if (x < 16) {
                op_admit(r);
            } else if (x < 52) {
                op_decode(r);
            } else if (x < 64) {
                op_free(r);
            } else if (x < 72) {
                op_fork(r);
            } else if (x < 80) {
                op_trunc(r);
            } else if (x < 89) {
                op_swap_out(r);
            } else if (x < 99) {
                op_swap_in(r);
            } else if (x < 100) {
                if (rnd(r, 10) == 0) {
                    bm_pool_reset_prefix_cache(r->pool);
                    r->n_ok[OP_RESET]++;
                }
            } else if (x < 105) {
                op_release_front(r);
            } else if (x < 110) {
                op_evict(r);
            } else {
                op_compact(r);
            }
            bm_pool_check(r->pool);
        }
        end_step(r);
        if (op % 64 < 10) {
            check_tenants(r);
        }
    }

    /* No leak: after freeing everything, every block is FREE or CACHED. */
    for (uint32_t k = 0; k < MAXS; k++) {
        if (r->s[k].live) {
            bm_seq_free(r->pool, r->s[k].id);
        }
    }
    bm_pool_check(r->pool);
    bm_pool_stats(r->pool, &st);
    REQ_CMP(st.dev_used, ==, 0);
    REQ_CMP(st.cpu_used, ==, 0);
    REQ_CMP(st.dev_free + st.dev_cached, ==, dev);
    REQ_CMP(st.cpu_free + st.cpu_cached, ==, cpu);
    REQ_CMP(bm_pool_free_blocks(r->pool), ==, dev);
    for (uint32_t ten = 0; ten < N_TENANTS; ten++) {
        REQ_CMP(bm_tenant_blocks(r->pool, ten), ==, 0);
    }
    printf("blockmgr random seed %llu (bs %u, %u+%u blocks, prefix %d): admit %llu decode %llu "
           "(eagain %llu) free %llu fork %llu trunc %llu swap-out %llu (eagain %llu) swap-in "
           "%llu (eagain %llu); copies %llu demoted %llu promoted %llu evicted %llu hits "
           "%llu/%llu\n",
           (unsigned long long)seed, bs, dev, cpu, prefix, (unsigned long long)r->n_ok[OP_ADMIT],
           (unsigned long long)r->n_ok[OP_DECODE], (unsigned long long)r->n_eagain[OP_DECODE],
           (unsigned long long)r->n_ok[OP_FREE], (unsigned long long)r->n_ok[OP_FORK],
           (unsigned long long)r->n_ok[OP_TRUNC], (unsigned long long)r->n_ok[OP_SWOUT],
           (unsigned long long)r->n_eagain[OP_SWOUT], (unsigned long long)r->n_ok[OP_SWIN],
           (unsigned long long)r->n_eagain[OP_SWIN], (unsigned long long)st.n_copies,
           (unsigned long long)st.n_demoted, (unsigned long long)st.n_promoted,
           (unsigned long long)st.n_evicted, (unsigned long long)st.prefix_hits,
           (unsigned long long)st.prefix_queries);
    /* The run must have exercised the interesting paths. */
    REQ_CMP(r->n_ok[OP_FORK], >, 100);
    REQ_CMP(r->n_eagain[OP_DECODE], >, 0);
    REQ_CMP(r->n_enomem, >, 0);
    if (bs > 1) {
        REQ_CMP(st.n_copies, >, 0);
    }
    if (cpu > 0) {
        REQ_CMP(r->n_ok[OP_SWOUT], >, 100);
        REQ_CMP(r->n_ok[OP_SWIN], >, 100);
        if (prefix) {
            REQ_CMP(st.n_demoted, >, 0);
            REQ_CMP(st.n_promoted, >, 0);
        }
    }
    if (prefix) {
        REQ_CMP(st.prefix_hits, >, 0);
    }
    if (flags & RUN_DROP) {
        REQ_CMP(r->n_drops, >, 100);
    }
    if (flags & RUN_POLICY) {
        printf("  release_front %llu (einval %llu) evict %llu (einval %llu) drops %llu\n",
               (unsigned long long)r->n_ok[OP_RELEASE], (unsigned long long)r->n_eagain[OP_RELEASE],
               (unsigned long long)r->n_ok[OP_EVICT], (unsigned long long)r->n_eagain[OP_EVICT],
               (unsigned long long)r->n_drops);
        REQ_CMP(r->n_ok[OP_RELEASE], >, 100);
        REQ_CMP(r->n_ok[OP_EVICT], >, 100);
        printf("  compact %llu (eagain %llu, of forked sequences %llu) slot copies %llu\n",
               (unsigned long long)r->n_ok[OP_COMPACT],
               (unsigned long long)r->n_eagain[OP_COMPACT], (unsigned long long)r->n_private,
               (unsigned long long)r->n_slot_copies);
        REQ_CMP(r->n_ok[OP_COMPACT], >, 100);
        REQ_CMP(r->n_private, >, 10);
        REQ_CMP(r->n_slot_copies, >, 1000);
    }

    bm_pool_destroy(r->pool);
    free(r->dev_tok);
    free(r->dev_grp);
    free(r->cpu_tok);
    free(r->cpu_grp);
    free(r->wr);
    free(r);
}

static void
run_seed(uint64_t seed, uint32_t bs, uint32_t dev, uint32_t cpu, int prefix)
{
    run_seed_flags(seed, bs, dev, cpu, prefix, 0);
}

START_TEST(test_random_bs4_swap_prefix)
{
    run_seed(1, 4, 48, 24, 1);
}
END_TEST

START_TEST(test_random_bs2_swap_prefix)
{
    run_seed(2, 2, 64, 40, 1);
}
END_TEST

START_TEST(test_random_bs1_swap_prefix)
{
    run_seed(3, 1, 96, 32, 1);
}
END_TEST

START_TEST(test_random_bs4_swap_noprefix)
{
    run_seed(4, 4, 40, 24, 0);
}
END_TEST

START_TEST(test_random_bs8_noswap_prefix)
{
    run_seed(5, 8, 32, 0, 1);
}
END_TEST

START_TEST(test_random_bs3_small_cpu)
{
    run_seed(6, 3, 40, 6, 1);
}
END_TEST

START_TEST(test_random_bs4_drop_policy_prefix)
{
    run_seed_flags(7, 4, 48, 24, 1, RUN_DROP | RUN_POLICY);
}
END_TEST

START_TEST(test_random_bs2_drop_policy_noprefix)
{
    run_seed_flags(8, 2, 64, 40, 0, RUN_DROP | RUN_POLICY);
}
END_TEST

START_TEST(test_random_bs4_drop_noswap)
{
    run_seed_flags(9, 4, 40, 0, 1, RUN_DROP);
}
END_TEST

Suite *
blockmgr_random_suite(void)
{
    Suite *s = suite_create("blockmgr_random");
    TCase *tc = tcase_create("random");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_random_bs4_swap_prefix);
    tcase_add_test(tc, test_random_bs2_swap_prefix);
    tcase_add_test(tc, test_random_bs1_swap_prefix);
    tcase_add_test(tc, test_random_bs4_swap_noprefix);
    tcase_add_test(tc, test_random_bs8_noswap_prefix);
    tcase_add_test(tc, test_random_bs3_small_cpu);
    tcase_add_test(tc, test_random_bs4_drop_policy_prefix);
    tcase_add_test(tc, test_random_bs2_drop_policy_noprefix);
    tcase_add_test(tc, test_random_bs4_drop_noswap);
    suite_add_tcase(s, tc);
    return s;
}
