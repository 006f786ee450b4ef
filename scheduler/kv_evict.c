/* kv_evict.c - which tokens H2O and SnapKV keep, and the compaction
 * (scheduler/kv_evict.h).
 */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "scheduler/kv_evict.h"

typedef struct cand {
    int32_t idx;
    int32_t votes;
    float score;
} cand_t;

/* Per-head ranking: higher score first, older index on ties (qsort_r,
 * glibc: the scores are the context). */
static int
by_score(const void *a, const void *b, void *ctx)
{
    const float *score = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float sx = score[x], sy = score[y];

    if (sx != sy) {
        return sx > sy ? -1 : 1;
    }
    return x < y ? -1 : (x > y);
}

static int
by_vote(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;

    if (x->votes != y->votes) {
        return x->votes > y->votes ? -1 : 1;
    }
    if (x->score != y->score) {
        return x->score > y->score ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static int
by_index(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : (x > y);
}

int32_t
sched_kv_select(const float *mass, int32_t n, int32_t n_heads, int32_t n_keep, int32_t recent,
                int32_t pool, uint32_t *keep)
{
    int32_t n_rec, n_cand, n_heavy, out = 0;
    float *pooled;
    int32_t *order;
    cand_t *cand;

    if (n_keep >= n) {
        for (int32_t i = 0; i < n; i++) {
            keep[i] = (uint32_t)i;
        }
        return n;
    }
    n_keep = n_keep > 0 ? n_keep : 0;
    n_rec = recent < n_keep ? recent : n_keep;
    n_cand = n - n_rec;
    n_heavy = n_keep - n_rec;
    if (n_heavy > 0) {
        int32_t half = pool > 1 ? pool / 2 : 0;

        pooled = xmalloc_try(sizeof(float) * (size_t)n_cand);
        order = xmalloc_try(sizeof(int32_t) * (size_t)n_cand);
        cand = xcalloc_try((size_t)n_cand, sizeof(cand_t));
        if (pooled == NULL || order == NULL || cand == NULL) {
            free(pooled);
            free(order);
            free(cand);
            return -1;
        }
        for (int32_t i = 0; i < n_cand; i++) {
            cand[i].idx = i;
        }
        for (int32_t h = 0; h < n_heads; h++) {
            double total = 0.0;

            for (int32_t i = 0; i < n_cand; i++) {
                int32_t lo = i - half > 0 ? i - half : 0;
                int32_t hi = i + half < n_cand - 1 ? i + half : n_cand - 1;
                float mx = mass[(size_t)lo * n_heads + h];

                for (int32_t j = lo + 1; j <= hi; j++) {
                    float v = mass[(size_t)j * n_heads + h];
                    mx = v > mx ? v : mx;
                }
                pooled[i] = mx;
                total += mx;
                order[i] = i;
            }
            qsort_r(order, (size_t)n_cand, sizeof(int32_t), by_score, pooled);
            for (int32_t r = 0; r < n_heavy; r++) {
                cand[order[r]].votes++;
            }
            for (int32_t i = 0; i < n_cand && total > 0.0; i++) {
                cand[i].score += (float)(pooled[i] / total);
            }
        }
        qsort(cand, (size_t)n_cand, sizeof(cand_t), by_vote);
        for (int32_t r = 0; r < n_heavy; r++) {
            keep[out++] = (uint32_t)cand[r].idx;
        }
        free(pooled);
        free(order);
        free(cand);
        qsort(keep, (size_t)out, sizeof(uint32_t), by_index);
    }
    for (int32_t i = n_cand; i < n; i++) {
        keep[out++] = (uint32_t)i;
    }
    return out;
}

int32_t
sched_kv_h2o_target(const mdl_kv_policy_t *p, int32_t n_kv, int32_t block_size)
{
    if (p->kind != MDL_KVP_H2O || n_kv < p->budget) {
        return 0;
    }
    return p->budget - mdl_kv_policy_slack(block_size);
}

void
sched_kv_slots(const bm_pool_t *pool, uint64_t seq, int32_t n, int32_t *slots)
{
    uint32_t nb = 0;
    const int32_t *t = bm_seq_table(pool, seq, &nb);
    int32_t bs = (int32_t)bm_pool_block_size(pool);

    for (int32_t i = 0; i < n; i++) {
        slots[i] = t[i / bs] * bs + i % bs;
    }
}

int32_t
sched_kv_compact(bm_pool_t *pool, uint64_t seq, const mdl_kv_policy_t *p, const float *mass,
                 int32_t n_kv, int32_t n_heads, int32_t n_keep, uint32_t *keep)
{
    int32_t pool_k = p->kind == MDL_KVP_SNAPKV ? p->pool : 1;
    int32_t got;

    if (n_keep >= n_kv) {
        return 0;
    }
    got = sched_kv_select(mass, n_kv, n_heads, n_keep, p->recent, pool_k, keep);
    if (got != n_keep || bm_seq_compact(pool, seq, keep, (uint32_t)got) != ST_OK) {
        return 0;
    }
    return n_kv - got;
}
