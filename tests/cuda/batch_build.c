/* batch_build.c - scripted steps for the forward-pass tests
 * (tests/cuda/batch_build.h).
 *
 * Thread: tests only, one thread.
 */
#include <string.h>

#include <check.h>

#include "tests/cuda/batch_build.h"

void
tb_begin(tb_batch_t *t, int32_t block_size, int32_t max_blocks)
{
    ck_assert_int_le(max_blocks, TB_MAX_BLOCKS);
    t->block_size = block_size;
    t->max_blocks = max_blocks;
    t->qs[0] = 0;
    t->b = (mdl_batch_t){
        .tokens = t->tok,
        .positions = t->pos,
        .slot_mapping = t->slot,
        .query_start = t->qs,
        .context_len = t->ctx,
        .block_tables = t->bt,
        .max_blocks = max_blocks,
        .logits_rows = t->lrows,
    };
}

int32_t
tb_add(tb_batch_t *t, const int32_t *ids, int32_t *done, int32_t n, const int32_t *table,
       int32_t n_rows)
{
    mdl_batch_t *b = &t->b;
    int32_t first = b->n_tokens, s = b->n_seqs;

    ck_assert_int_lt(s, TB_MAX_SEQ);
    ck_assert_int_le(first + n, TB_MAX_TOK);
    ck_assert(n_rows >= 0 && n_rows <= n);
    for (int32_t i = 0; i < n; i++) {
        int32_t ix = *done + i;

        t->tok[first + i] = ids[ix];
        t->pos[first + i] = ix;
        t->slot[first + i] = table[ix / t->block_size] * t->block_size + ix % t->block_size;
        if (i >= n - n_rows) {
            t->lrows[b->n_logits++] = first + i;
        }
    }
    *done += n;
    t->ctx[s] = *done;
    memcpy(t->bt + (size_t)s * t->max_blocks, table, sizeof(int32_t) * (size_t)t->max_blocks);
    b->n_tokens = first + n;
    t->qs[++b->n_seqs] = b->n_tokens;
    return first;
}

mdl_batch_t *
tb_end(tb_batch_t *t)
{
    return &t->b;
}
