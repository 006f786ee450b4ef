/* bm_delta.c - a block table's changes since its reader last looked
 * (bm_delta.h).
 *
 * Thread: engine thread only.
 */
#include "blockmgr/bm_delta.h"

#include "blockmgr/blockmgr_int.h"

const int32_t *
bm_seq_table_delta(bm_pool_t *pool, uint64_t seq, uint32_t *n_blocks, uint32_t *from)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL) {
        *n_blocks = *from = 0;
        return NULL;
    }
    *n_blocks = s->n_blocks;
    *from = s->tab_clean < s->n_blocks ? s->tab_clean : s->n_blocks;
    s->tab_clean = s->n_blocks;
    return s->table;
}
