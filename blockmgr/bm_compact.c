/* bm_compact.c - compaction of a sequence to a kept subset of its tokens,
 * for heavy-hitter (H2O) and SnapKV eviction (blockmgr/blockmgr.h,
 * bm_seq_compact).
 *
 * DESIGN. The kept tokens move down to indices 0 .. n_keep - 1, in
 * increasing order, one KV_OP_COPY_SLOT each. Let f be the first index
 * whose token moves: blocks before f / bs are untouched. Destination
 * block k >= f / bs is the sequence's old block k when the sequence is its
 * only holder and it is not registered in the prefix cache (in place), a
 * fresh private block otherwise. In place is safe in queue order: the copy
 * to new index i reads old index keep[i] >= i and overwrites old index i,
 * whose token was either copied earlier (keep[j] = i with j < i) or
 * evicted. Old blocks not reused are released after the copies (a DROP,
 * if any, comes after the ops that read them), so a block another
 * sequence takes later in the step is written after they ran.
 *
 *   old  | A0 A1 A2 A3 | B0 B1 B2 B3 | C0 C1 |     keep A0 A1 A3 B2 C1
 *   new  | A0 A1 A3 B2 | C1 |                      block B, C released
 *
 * The sequence becomes nohash: the moved tokens no longer sit where their
 * hash chain says, so none of its later blocks is hashed or registered.
 *
 * Thread: the pool's owner (the engine thread).
 */
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/status.h"
#include "common/xmalloc.h"

static uint32_t
blocks_for(uint32_t n, uint32_t bs)
{
    return (n + bs - 1) / bs;
}

/* First moved index (n_keep when the keep list is the identity prefix). */
static uint32_t
first_moved(const uint32_t *keep, uint32_t n_keep)
{
    uint32_t f = 0;

    while (f < n_keep && keep[f] == f) {
        f++;
    }
    return f;
}

/* Whether old block k may be written in place. */
static int
in_place(const bm_pool_t *pool, const bm_seq_t *s, uint32_t k)
{
    const bm_block_t *b;

    if (k >= s->n_blocks) {
        return 0;
    }
    b = bm__blk(pool, BM_DEV, (uint32_t)s->table[k]);
    return b->ref == 1 && !b->cached;
}

static uint32_t
fresh_needed(const bm_pool_t *pool, const bm_seq_t *s, uint32_t f, uint32_t n_keep)
{
    uint32_t need = 0;

    for (uint32_t k = f / pool->bs; k < blocks_for(n_keep, pool->bs); k++) {
        need += !in_place(pool, s, k);
    }
    return need;
}

static int
keep_valid(const bm_seq_t *s, const uint32_t *keep, uint32_t n_keep)
{
    if (n_keep > s->len || (n_keep > 0 && keep == NULL)) {
        return 0;
    }
    for (uint32_t i = 0; i < n_keep; i++) {
        if (keep[i] >= s->len || (i > 0 && keep[i] <= keep[i - 1])) {
            return 0;
        }
    }
    return 1;
}

uint32_t
bm_seq_compact_needed(const bm_pool_t *pool, uint64_t seq, const uint32_t *keep, uint32_t n_keep)
{
    const bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL || s->swapped || !keep_valid(s, keep, n_keep)) {
        return 0;
    }
    return fresh_needed(pool, s, first_moved(keep, n_keep), n_keep);
}

int
bm_seq_compact(bm_pool_t *pool, uint64_t seq, const uint32_t *keep, uint32_t n_keep)
{
    bm_seq_t *s = bm__seq_find(pool, seq);
    const uint32_t bs = pool->bs;
    uint32_t f, fb, nb_old, nb_new, need;
    int32_t *saved;
    uint8_t *reused;
    if (s == NULL || s->swapped || s->n_released > 0 || !keep_valid(s, keep, n_keep)) {
        return ST_EINVAL;
    }
    bm__step_check_move(pool, s, "compact");
    f = first_moved(keep, n_keep);
    if (f == n_keep && n_keep == s->len) {
        return ST_OK; /* nothing evicted */
    }
    fb = f / bs;
    nb_old = s->n_blocks;
    nb_new = blocks_for(n_keep, bs);
    need = fresh_needed(pool, s, f, n_keep);
    if (need > bm__dev_avail(pool)) {
        return ST_EAGAIN;
    }
    /* Ops: the copies, a demotion per fresh block, a drop per old block. */
    saved = xmalloc_try((sizeof(int32_t) + 1) * (nb_old - fb + 1));
    if (saved == NULL ||
        bm__ops_reserve(pool, (uint64_t)(n_keep - fb * bs) + need + nb_old) != ST_OK) {
        free(saved);
        return ST_ENOMEM;
    }
    /* From here on nothing fails. The copies name old blocks by the ids
     * saved here; the table is rebuilt in place. */
    reused = (uint8_t *)(saved + (nb_old - fb + 1));
    memcpy(saved, s->table + fb, sizeof(int32_t) * (nb_old - fb));
    memset(reused, 0, nb_old - fb + 1);

    for (uint32_t k = fb; k < nb_new; k++) {
        if (in_place(pool, s, k)) {
            bm_block_t *b = bm__blk(pool, BM_DEV, (uint32_t)saved[k - fb]);
            if (b->hashed) {
                b->hashed = 0; /* unregistered duplicate: its bytes change */
            }
            bm__twin_break(pool, b);
            reused[k - fb] = 1;
        } else {
            bm_block_t *b = bm__blk_alloc(pool, s->tenant);
            s->table[k] = (int32_t)b->id;
        }
    }
    /* From the start of block fb: a fresh block there also takes the
     * tokens before f. */
    for (uint32_t i = fb * bs; i < n_keep; i++) {
        uint32_t src = (uint32_t)saved[keep[i] / bs - fb] * bs + keep[i] % bs;
        uint32_t dst = (uint32_t)s->table[i / bs] * bs + i % bs;

        if (src != dst) {
            bm__op_push(pool, KV_OP_COPY_SLOT, src, dst);
        }
        s->toks[i] = s->toks[keep[i]];
    }
    /* Old blocks not written in place go back, last to first. */
    for (uint32_t k = nb_old; k-- > fb;) {
        if (!reused[k - fb]) {
            bm__blk_put(pool, BM_DEV, bm__blk(pool, BM_DEV, (uint32_t)saved[k - fb]), s->tenant);
        }
    }
    free(saved);
    bm__tab_changed(s, fb); /* rebuilt from block fb, and shrunk */
    s->n_blocks = nb_new;
    s->len = n_keep;
    s->nohash = 1;
    return ST_OK;
}
