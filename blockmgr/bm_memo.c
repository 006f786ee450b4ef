/* bm_memo.c - a token prefix's block hashes computed once (bm_memo.h).
 *
 * Thread: engine thread only.
 */
#include "blockmgr/bm_memo.h"

#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/status.h"
#include "common/xmalloc.h"

int
bm_memo_create(uint32_t n_tokens, uint32_t block_size, bm_hash_memo_t **out)
{
    bm_hash_memo_t *m;

    *out = NULL;
    if (block_size == 0 || n_tokens < block_size) {
        return ST_OK;
    }
    m = xmalloc_try(sizeof(*m) + (size_t)(n_tokens / block_size) * sizeof(m->hash[0]));
    if (m == NULL) {
        return ST_ENOMEM;
    }
    memset(m, 0, sizeof(*m));
    m->cap = n_tokens / block_size;
    *out = m;
    return ST_OK;
}

void
bm_memo_destroy(bm_hash_memo_t *m)
{
    free(m);
}

int
bm_seq_set_memo(bm_pool_t *pool, uint64_t seq, bm_hash_memo_t *memo)
{
    bm_seq_t *s = bm__seq_find(pool, seq);

    if (s == NULL) {
        return ST_EINVAL;
    }
    s->memo = memo;
    return ST_OK;
}

uint64_t
bm_pool_hash_calls(const bm_pool_t *pool)
{
    return *pool->n_hashed;
}

/* memo keyed to (salt, extra): kept when it already is, else started over. */
static void
memo_key(bm_hash_memo_t *m, const bm_tenant_t *t, const uint8_t *extra, uint32_t extra_len)
{
    if (m->keyed && m->salt_len == t->salt_len && m->extra_len == extra_len &&
        memcmp(m->salt, t->salt, t->salt_len) == 0 &&
        (extra_len == 0 || memcmp(m->extra, extra, extra_len) == 0)) {
        return;
    }
    m->keyed = 1;
    m->n = 0;
    m->salt_len = t->salt_len;
    memcpy(m->salt, t->salt, t->salt_len);
    m->extra_len = extra_len;
    if (extra_len > 0) {
        memcpy(m->extra, extra, extra_len);
    }
}

void
bm__memo_hash(const bm_pool_t *pool, bm_hash_memo_t *memo, uint32_t idx, const uint8_t *parent,
              const bm_tenant_t *tenant, const uint8_t *extra, uint32_t extra_len,
              const int32_t *toks, uint8_t out[BM_HASH_LEN])
{
    if (memo == NULL || idx >= memo->cap) {
        bm__hash_block(pool, parent, tenant, extra, extra_len, toks, out);
        return;
    }
    memo_key(memo, tenant, extra, extra_len);
    if (idx < memo->n) {
        memcpy(out, memo->hash[idx], BM_HASH_LEN);
        return;
    }
    bm__hash_block(pool, parent, tenant, extra, extra_len, toks, out);
    if (idx == memo->n) {
        memcpy(memo->hash[idx], out, BM_HASH_LEN);
        memo->n++;
    }
}
