/* kv_stream.c - one sequence streamed through a runtime, its blocks from
 * blockmgr and its evictions the scheduler's (scheduler/kv_stream.h).
 */
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "scheduler/kv_evict.h"
#include "scheduler/kv_stream.h"
#include "scheduler/sched.h"

#define STREAM_SEQ 1 /* the pool's only sequence */

struct sched_stream {
    mdl_runtime_t *rt;
    bm_pool_t *pool;
    mdl_kv_policy_t p;
    int32_t bs, max_ctx, chunk, vocab, max_blocks;
    int32_t *table; /* [max_blocks] a copy of blockmgr's, padded with 0 */
    int32_t kv_peak;
    int64_t n_fed, n_evicted;
    int32_t *pos, *slots, *rows; /* [chunk] */
    /* H2O / SnapKV (kv_evict.h) */
    int scored;            /* the policy reads attention mass */
    int32_t n_heads;       /* mass floats per token */
    int64_t next_pos;      /* position of the next token fed */
    int64_t prompt_end;    /* SnapKV: n_fed at the end of the prompt, or -1 */
    int64_t n_compacted;   /* tokens dropped */
    uint8_t *mass_rows;    /* [chunk] */
    float *mass;           /* [max_ctx][n_heads] */
    int32_t *kslots;       /* [max_ctx] */
    uint32_t *keep;        /* [max_ctx] */
};

int32_t
sched_stream_blocks(int32_t block_size, int32_t max_ctx)
{
    return (max_ctx + block_size - 1) / block_size + 1;
}

void
sched_stream_destroy(sched_stream_t *s)
{
    if (s == NULL) {
        return;
    }
    bm_pool_destroy(s->pool);
    free(s->table);
    free(s->pos);
    free(s->slots);
    free(s->rows);
    free(s->mass_rows);
    free(s->mass);
    free(s->kslots);
    free(s->keep);
    free(s);
}

/* Registers the (empty) sequence; a policy makes it nohash, as the
 * scheduler does for a request with a window. */
static int
stream_seq_create(sched_stream_t *s)
{
    int rc = bm_seq_create(s->pool, STREAM_SEQ, 0);

    if (rc == ST_OK && (s->p.window > 0 || s->scored)) {
        rc = bm_seq_set_nohash(s->pool, STREAM_SEQ);
    }
    return rc;
}

/* Runs what the pool queued (drops, shifts) on the runtime, in order. */
static int
stream_run_ops(sched_stream_t *s)
{
    uint32_t n_ops = 0;
    const kv_op_t *ops = bm_pool_ops(s->pool, &n_ops);
    int rc = n_ops > 0 ? mdl_runtime_kv_ops(s->rt, ops, (int32_t)n_ops) : ST_OK;

    bm_pool_ops_clear(s->pool);
    return rc;
}

int
sched_stream_create(mdl_runtime_t *rt, const mdl_kv_policy_t *p, int32_t block_size,
                    int32_t max_ctx, int32_t chunk, int32_t vocab, sched_stream_t **out)
{
    sched_stream_t *s;
    int rc;

    if (rt == NULL || block_size <= 0 || max_ctx <= 0 || chunk <= 0 || vocab <= 0) {
        return ST_EINVAL;
    }
    s = xcalloc(1, sizeof(*s));
    s->rt = rt;
    if (p != NULL) {
        s->p = *p;
    }
    s->bs = block_size;
    s->max_ctx = max_ctx;
    s->chunk = chunk;
    s->vocab = vocab;
    s->max_blocks = sched_stream_blocks(block_size, max_ctx);
    s->scored = s->p.kind == MDL_KVP_H2O || s->p.kind == MDL_KVP_SNAPKV;
    s->n_heads = mdl_runtime_kv_mass_heads(rt);
    if (s->scored && s->n_heads <= 0) {
        free(s);
        return ST_EINVAL; /* the runtime keeps no attention mass */
    }
    bm_config_t bc = {
        .block_size = (uint32_t)block_size,
        .num_blocks = (uint32_t)s->max_blocks + 1, /* with the null block 0 */
        .drop_ops = 1,
    };
    rc = bm_pool_create(&bc, &s->pool);
    if (rc == ST_OK) {
        rc = stream_seq_create(s);
    }
    if (rc != ST_OK) {
        sched_stream_destroy(s);
        return rc;
    }
    s->table = xcalloc((size_t)s->max_blocks, sizeof(int32_t));
    s->pos = xcalloc((size_t)chunk, sizeof(int32_t));
    s->slots = xcalloc((size_t)chunk, sizeof(int32_t));
    s->rows = xcalloc((size_t)chunk, sizeof(int32_t));
    s->prompt_end = -1;
    if (s->scored) {
        s->mass_rows = xcalloc((size_t)chunk, 1);
        s->mass = xcalloc((size_t)max_ctx * (size_t)s->n_heads, sizeof(float));
        s->kslots = xcalloc((size_t)max_ctx, sizeof(int32_t));
        s->keep = xcalloc((size_t)max_ctx, sizeof(uint32_t));
    }
    *out = s;
    return ST_OK;
}

int
sched_stream_reset(sched_stream_t *s)
{
    int rc;

    bm_seq_free(s->pool, STREAM_SEQ); /* every block dropped */
    rc = stream_run_ops(s);
    s->n_fed = 0;
    s->next_pos = 0;
    s->prompt_end = -1;
    if (rc == ST_OK) {
        rc = stream_seq_create(s);
    }
    return rc;
}

/* Evicts per the policy before more tokens arrive; the kept blocks'
 * shifts run on the runtime at once. */
static int
stream_evict(sched_stream_t *s)
{
    int32_t kv_len = (int32_t)bm_seq_len(s->pool, STREAM_SEQ);
    int32_t e = sched_kv_window_evict(s->pool, STREAM_SEQ, kv_len, s->p.sink, s->p.window);

    if (e == 0) {
        return ST_OK;
    }
    s->n_evicted += e;
    return stream_run_ops(s);
}

/* H2O after every forward, SnapKV after the one that completed the
 * prompt: read the mass of every cached token, keep the chosen ones
 * (their copies run at once, before the next forward). */
static int
stream_compact(sched_stream_t *s)
{
    int32_t kv_len = (int32_t)bm_seq_len(s->pool, STREAM_SEQ), n_keep = 0, dropped;
    int rc;

    if (s->p.kind == MDL_KVP_H2O) {
        n_keep = sched_kv_h2o_target(&s->p, kv_len, s->bs);
    } else if (s->prompt_end == s->n_fed && kv_len > s->p.budget) {
        n_keep = s->p.budget;
    }
    if (n_keep <= 0 || n_keep >= kv_len) {
        return ST_OK;
    }
    sched_kv_slots(s->pool, STREAM_SEQ, kv_len, s->kslots);
    rc = mdl_runtime_kv_mass(s->rt, s->kslots, kv_len, s->mass);
    if (rc != ST_OK) {
        return rc;
    }
    dropped = sched_kv_compact(s->pool, STREAM_SEQ, &s->p, s->mass, kv_len, s->n_heads, n_keep,
                               s->keep);
    s->n_compacted += dropped;
    return dropped > 0 ? stream_run_ops(s) : ST_OK;
}

static int
stream_feed(sched_stream_t *s, const int32_t *toks, int32_t n, int all_rows, sched_stream_cb cb,
            void *arg)
{
    for (int32_t i = 0; i < n;) {
        int32_t c = n - i < s->chunk ? n - i : s->chunk;
        int32_t qs[2] = {0, c}, kv_len, ctx;
        uint32_t nb = 0;
        const int32_t *bt;
        const float *logits;
        int rc = stream_evict(s);

        if (rc != ST_OK) {
            return rc;
        }
        kv_len = (int32_t)bm_seq_len(s->pool, STREAM_SEQ);
        if (kv_len + c > s->max_ctx) {
            return ST_ETOOLONG;
        }
        rc = bm_seq_reserve(s->pool, STREAM_SEQ, toks + i, (uint32_t)c, s->slots);
        if (rc != ST_OK) {
            return rc == ST_EAGAIN ? ST_ETOOLONG : rc;
        }
        rc = stream_run_ops(s);
        if (rc != ST_OK) {
            return rc;
        }
        bt = bm_seq_table(s->pool, STREAM_SEQ, &nb);
        CHECK((int32_t)nb <= s->max_blocks);
        memcpy(s->table, bt, sizeof(int32_t) * nb);
        for (int32_t t = 0; t < c; t++) {
            /* Contiguous positions in the cache (sinks re-rotate), or past
             * every token fed (H2O / SnapKV keep the keys' positions). */
            s->pos[t] = s->scored ? (int32_t)(s->next_pos + t) : kv_len + t;
            s->rows[t] = t;
            if (s->scored) {
                int64_t g = s->n_fed + t;
                s->mass_rows[t] = s->p.kind == MDL_KVP_H2O ||
                                  (g < s->prompt_end && g >= s->prompt_end - s->p.recent);
            }
        }
        if (!all_rows) {
            s->rows[0] = c - 1;
        }
        ctx = kv_len + c;
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
            .n_logits = all_rows ? c : 1,
            .mass_rows = s->scored ? s->mass_rows : NULL,
        };
        rc = mdl_forward(s->rt, &b, &logits);
        if (rc != ST_OK) {
            return rc;
        }
        if (cb != NULL && all_rows) {
            for (int32_t t = 0; t < c; t++) {
                cb(arg, s->n_fed + t, logits + (size_t)t * s->vocab);
            }
        } else if (cb != NULL) {
            cb(arg, s->n_fed + c - 1, logits);
        }
        s->kv_peak = ctx > s->kv_peak ? ctx : s->kv_peak;
        s->n_fed += c;
        s->next_pos += c;
        i += c;
        rc = s->scored ? stream_compact(s) : ST_OK;
        if (rc != ST_OK) {
            return rc;
        }
    }
    return ST_OK;
}

int
sched_stream_feed(sched_stream_t *s, const int32_t *toks, int32_t n, sched_stream_cb cb,
                  void *arg)
{
    /* Without a callback no row is read: the last one is enough. */
    return stream_feed(s, toks, n, cb != NULL, cb, arg);
}

int
sched_stream_feed_last(sched_stream_t *s, const int32_t *toks, int32_t n, sched_stream_cb cb,
                       void *arg)
{
    return stream_feed(s, toks, n, 0, cb, arg);
}

void
sched_stream_set_prompt(sched_stream_t *s, int32_t n_prompt)
{
    s->prompt_end = s->n_fed + n_prompt;
}

int64_t
sched_stream_compacted(const sched_stream_t *s)
{
    return s->n_compacted;
}

int32_t
sched_stream_kv_len(const sched_stream_t *s)
{
    return (int32_t)bm_seq_len(s->pool, STREAM_SEQ);
}

int32_t
sched_stream_kv_peak(const sched_stream_t *s)
{
    return s->kv_peak;
}

int64_t
sched_stream_evicted(const sched_stream_t *s)
{
    return s->n_evicted;
}
