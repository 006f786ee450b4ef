/* bm_draft.c - late token ids for reserved slots (blockmgr/blockmgr.h,
 * bm_seq_set_token): a draft model's speculative tokens are known only
 * after their slots were reserved, before the forward that writes them.
 *
 * Thread: engine thread.
 */
#include "blockmgr/blockmgr.h"
#include "blockmgr/blockmgr_int.h"
#include "common/status.h"

int
bm_seq_set_token(bm_pool_t *pool, uint64_t seq, uint32_t pos, int32_t token)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    /* Only a slot of the partly filled tail: a full block is hashed. */
    if (s == NULL || s->swapped || pos >= s->len || (pos / pool->bs + 1) * pool->bs <= s->len) {
        return ST_EINVAL;
    }
    if (s->memo != NULL && pos < s->memo->cap * pool->bs) {
        s->memo = NULL; /* no longer the memo's prefix (bm_memo.h) */
    }
    s->toks[pos] = token;
    return ST_OK;
}
