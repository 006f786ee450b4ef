/* kv_policy.c - attention sinks with a rolling window: eviction planning
 * and a single-sequence streaming driver (model/kv_policy.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "model/kv_policy.h"

int
mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                    size_t errlen)
{
    int sink = -1, window = -1, used = 0;

    if (s == NULL || strcmp(s, "full") == 0 || s[0] == '\0') {
        out->sink = out->window = 0;
        return ST_OK;
    }
    if (sscanf(s, "sink=%d,window=%d%n", &sink, &window, &used) != 2 || s[used] != '\0' ||
        sink < 0 || window <= 0) {
        snprintf(err, errlen, "kv policy '%s': expected full or sink=S,window=W (S >= 0, W > 0)",
                 s);
        return ST_EINVAL;
    }
    if (block_size <= 0 || sink % block_size != 0 || window % block_size != 0) {
        snprintf(err, errlen, "kv policy '%s': sink and window must be whole blocks of %d tokens",
                 s, block_size);
        return ST_EINVAL;
    }
    out->sink = sink;
    out->window = window;
    return ST_OK;
}

int32_t
mdl_kv_policy_evict(const mdl_kv_policy_t *p, int32_t block_size, int32_t *table,
                    int32_t *n_blocks, int32_t *kv_len, int32_t *evicted, kv_op_t *ops,
                    int32_t *n_ops)
{
    int32_t first = p->sink / block_size, e;

    if (p->window <= 0 || *kv_len <= p->sink + p->window) {
        return 0;
    }
    /* The fewest whole blocks that keep at least window recent tokens. */
    e = (*kv_len - p->sink - p->window) / block_size;
    if (e <= 0) {
        return 0;
    }
    for (int32_t i = 0; i < e; i++) {
        evicted[i] = table[first + i];
    }
    for (int32_t i = first + e; i < *n_blocks; i++) {
        ops[(*n_ops)++] = (kv_op_t){.kind = KV_OP_SHIFT, .src = table[i], .dst = e * block_size};
        table[i - e] = table[i];
    }
    *n_blocks -= e;
    *kv_len -= e * block_size;
    return e;
}

struct mdl_kvstream {
    mdl_runtime_t *rt;
    mdl_kv_policy_t p;
    int32_t bs, max_ctx, chunk, vocab, max_blocks;
    int32_t *table;   /* [max_blocks] the sequence's blocks */
    int32_t n_blocks;
    int32_t *free_ids; /* stack of unused block ids */
    int32_t n_free;
    int32_t kv_len, kv_peak;
    int64_t n_fed, n_evicted;
    int32_t *pos, *slots, *rows, *evicted;
    kv_op_t *ops;
};

void
mdl_kvstream_destroy(mdl_kvstream_t *s)
{
    if (s == NULL) {
        return;
    }
    free(s->table);
    free(s->free_ids);
    free(s->pos);
    free(s->slots);
    free(s->rows);
    free(s->evicted);
    free(s->ops);
    free(s);
}

int
mdl_kvstream_create(mdl_runtime_t *rt, const mdl_kv_policy_t *p, int32_t block_size,
                    int32_t max_ctx, int32_t chunk, int32_t vocab, mdl_kvstream_t **out)
{
    mdl_kvstream_t *s;

    if (rt == NULL || block_size <= 0 || max_ctx <= 0 || chunk <= 0 || vocab <= 0) {
        return ST_EINVAL;
    }
    s = xcalloc(1, sizeof(*s));
    s->rt = rt;
    s->p = *p;
    s->bs = block_size;
    s->max_ctx = max_ctx;
    s->chunk = chunk;
    s->vocab = vocab;
    s->max_blocks = (max_ctx + block_size - 1) / block_size + 1;
    s->table = xcalloc((size_t)s->max_blocks, sizeof(int32_t));
    s->free_ids = xcalloc((size_t)s->max_blocks, sizeof(int32_t));
    for (int32_t i = 0; i < s->max_blocks; i++) {
        s->free_ids[i] = s->max_blocks - i; /* ids 1 .. max_blocks */
    }
    s->n_free = s->max_blocks;
    s->pos = xcalloc((size_t)chunk, sizeof(int32_t));
    s->slots = xcalloc((size_t)chunk, sizeof(int32_t));
    s->rows = xcalloc((size_t)chunk, sizeof(int32_t));
    s->evicted = xcalloc((size_t)s->max_blocks, sizeof(int32_t));
    s->ops = xcalloc((size_t)s->max_blocks * 2, sizeof(kv_op_t));
    *out = s;
    return ST_OK;
}

int
mdl_kvstream_reset(mdl_kvstream_t *s)
{
    int32_t n = 0;

    for (int32_t i = 0; i < s->n_blocks; i++) {
        s->ops[n++] = (kv_op_t){.kind = KV_OP_DROP, .src = s->table[i], .dst = s->table[i]};
        s->free_ids[s->n_free++] = s->table[i];
    }
    s->n_blocks = 0;
    s->kv_len = 0;
    s->n_fed = 0;
    return mdl_runtime_kv_ops(s->rt, s->ops, n);
}

/* Evicts per the policy before c more tokens arrive. */
static int
kvstream_evict(mdl_kvstream_t *s)
{
    int32_t n_ops = 0, e;

    e = mdl_kv_policy_evict(&s->p, s->bs, s->table, &s->n_blocks, &s->kv_len, s->evicted, s->ops,
                            &n_ops);
    if (e == 0) {
        return ST_OK;
    }
    /* Evicted blocks are dropped (their residual, if any, freed) first,
     * then the kept ones re-rotated. */
    memmove(s->ops + e, s->ops, sizeof(kv_op_t) * (size_t)n_ops);
    for (int32_t i = 0; i < e; i++) {
        s->ops[i] = (kv_op_t){.kind = KV_OP_DROP, .src = s->evicted[i], .dst = s->evicted[i]};
        s->free_ids[s->n_free++] = s->evicted[i];
    }
    s->n_evicted += e;
    return mdl_runtime_kv_ops(s->rt, s->ops, n_ops + e);
}

int
mdl_kvstream_feed(mdl_kvstream_t *s, const int32_t *toks, int32_t n, mdl_kvstream_cb cb,
                  void *arg)
{
    for (int32_t i = 0; i < n;) {
        int32_t c = n - i < s->chunk ? n - i : s->chunk;
        int32_t qs[2] = {0, c}, ctx;
        const float *logits;
        int rc = kvstream_evict(s);

        if (rc != ST_OK) {
            return rc;
        }
        if (s->kv_len + c > s->max_ctx) {
            return ST_ETOOLONG;
        }
        while (s->n_blocks * s->bs < s->kv_len + c) {
            if (s->n_free == 0) {
                return ST_ETOOLONG;
            }
            s->table[s->n_blocks++] = s->free_ids[--s->n_free];
        }
        for (int32_t t = 0; t < c; t++) {
            int32_t kv = s->kv_len + t;

            s->pos[t] = kv; /* contiguous positions in the cache */
            s->slots[t] = s->table[kv / s->bs] * s->bs + kv % s->bs;
            s->rows[t] = t;
        }
        ctx = s->kv_len + c;
        mdl_batch_t b = {
            .n_tokens = c,
            .tokens = toks + i,
            .positions = s->pos,
            .slot_mapping = s->slots,
            .n_seqs = 1,
            .query_start = qs,
            .context_len = &ctx,
            .block_tables = s->table,
            .max_blocks = s->max_blocks,
            .logits_rows = s->rows,
            .n_logits = cb != NULL ? c : 1,
        };
        if (cb == NULL) {
            s->rows[0] = c - 1;
        }
        rc = mdl_forward(s->rt, &b, &logits);
        if (rc != ST_OK) {
            return rc;
        }
        if (cb != NULL) {
            for (int32_t t = 0; t < c; t++) {
                cb(arg, s->n_fed + t, logits + (size_t)t * s->vocab);
            }
        }
        s->kv_len += c;
        s->kv_peak = s->kv_len > s->kv_peak ? s->kv_len : s->kv_peak;
        s->n_fed += c;
        i += c;
    }
    return ST_OK;
}

int32_t
mdl_kvstream_kv_len(const mdl_kvstream_t *s)
{
    return s->kv_len;
}

int32_t
mdl_kvstream_kv_peak(const mdl_kvstream_t *s)
{
    return s->kv_peak;
}

int64_t
mdl_kvstream_evicted(const mdl_kvstream_t *s)
{
    return s->n_evicted;
}
