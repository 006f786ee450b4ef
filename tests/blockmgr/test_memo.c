/* test_memo.c - a prompt's block hashes computed once (blockmgr/bm_memo.h):
 *
 *   - a recomputed sequence (freed, then admitted again with its prompt
 *     and what it generated) hashes none of its prompt blocks again;
 *   - a random schedule of admissions (probe, lookup, chunked reserves),
 *     decodes, recompute frees, forks and evictions under pressure, run on
 *     two identical pools, one with memos and one without, gives the same
 *     probes, hits, tables and counters at every operation, with fewer
 *     hash calls;
 *   - a memo used under another salt starts over; a truncate into the
 *     memo's prefix detaches it, so new content is hashed as itself.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_memo.h"
#include "common/status.h"

#define BS 4

static bm_pool_t *
mk_pool(uint32_t num_blocks)
{
    bm_config_t cfg = {.block_size = BS, .num_blocks = num_blocks, .prefix_caching = 1};
    bm_pool_t *p = NULL;

    ck_assert_int_eq(bm_pool_create(&cfg, &p), ST_OK);
    return p;
}

/* Admits seq as the scheduler does: probe, create, memo, lookup, then
 * reserves the rest of toks[0..n). Returns the tokens found cached. */
static uint32_t
admit(bm_pool_t *p, uint64_t seq, uint32_t tenant, const int32_t *toks, uint32_t n,
      bm_hash_memo_t *memo)
{
    int32_t slots[512];
    uint32_t probed = bm_prefix_probe_memo(p, tenant, toks, n, memo), got = 0;

    ck_assert_int_eq(bm_seq_create(p, seq, tenant), ST_OK);
    if (memo != NULL) {
        ck_assert_int_eq(bm_seq_set_memo(p, seq, memo), ST_OK);
    }
    ck_assert_int_eq(bm_seq_lookup_prefix(p, seq, toks, n, &got), ST_OK);
    ck_assert_uint_eq(got, probed);
    ck_assert_int_eq(bm_seq_reserve(p, seq, toks + got, n - got, slots), ST_OK);
    return got;
}

START_TEST(test_recompute_does_not_rehash_prompt)
{
    bm_pool_t *p = mk_pool(64);
    bm_hash_memo_t *memo;
    int32_t toks[64], slots[16];
    const uint32_t n_prompt = 40; /* 10 full blocks */

    for (int i = 0; i < 64; i++) {
        toks[i] = 1000 + i * 7;
    }
    ck_assert_int_eq(bm_memo_create(n_prompt, BS, &memo), ST_OK);
    ck_assert_uint_eq(memo->cap, 10);

    uint64_t h0 = bm_pool_hash_calls(p);
    /* First admission: the probe hashes block 0 and misses (nothing is
     * cached), the lookup takes it from the memo, the reserve seals all
     * ten prompt blocks: nine computed, one from the memo. */
    ck_assert_uint_eq(admit(p, 1, 0, toks, n_prompt, memo), 0);
    ck_assert_uint_eq(bm_pool_hash_calls(p) - h0, 10);
    ck_assert_uint_eq(memo->n, 10);
    /* Two generated blocks: hashed as they fill (past the memo). */
    ck_assert_int_eq(bm_seq_reserve(p, 1, toks + n_prompt, 8, slots), ST_OK);
    ck_assert_uint_eq(bm_pool_hash_calls(p) - h0, 12);
    bm_seq_free(p, 1); /* a recompute preemption */

    /* Admitted again with its 48 tokens: all 11 blocks the lookup may
     * cover are cached; only block 10 (generated) is hashed, by the probe
     * and by the lookup, then block 11 as its reserve fills it. Without
     * the memo: 11 + 11 + 1. */
    uint64_t h1 = bm_pool_hash_calls(p);
    ck_assert_uint_eq(admit(p, 1, 0, toks, 48, memo), 44);
    ck_assert_uint_eq(bm_pool_hash_calls(p) - h1, 3);
    bm_seq_free(p, 1);

    /* The same without a memo, for contrast. */
    uint64_t h2 = bm_pool_hash_calls(p);
    ck_assert_uint_eq(admit(p, 2, 0, toks, 48, NULL), 44);
    ck_assert_uint_eq(bm_pool_hash_calls(p) - h2, 23);
    bm_seq_free(p, 2);

    /* Another tenant (another salt): the memo starts over and finds
     * nothing of tenant 0's. */
    ck_assert_uint_eq(bm_prefix_probe_memo(p, 7, toks, 48, memo), 0);
    ck_assert_uint_eq(bm_prefix_probe(p, 7, toks, 48), 0);
    ck_assert_uint_le(memo->n, 1);
    /* And back: correct hits again (recomputed once). */
    ck_assert_uint_eq(bm_prefix_probe_memo(p, 0, toks, 48, memo), 44);
    bm_pool_check(p);
    bm_memo_destroy(memo);
    bm_pool_destroy(p);
}
END_TEST

START_TEST(test_truncate_into_prefix_detaches)
{
    bm_pool_t *p = mk_pool(64);
    bm_hash_memo_t *memo;
    int32_t toks[32], other[32], slots[32];
    uint32_t got = 0;

    for (int i = 0; i < 32; i++) {
        toks[i] = 10 + i;
        other[i] = i < 8 ? toks[i] : 500 + i;
    }
    ck_assert_int_eq(bm_memo_create(16, BS, &memo), ST_OK);
    ck_assert_uint_eq(admit(p, 1, 0, toks, 16, memo), 0);
    ck_assert_uint_eq(memo->n, 4);
    /* Back to 8 tokens, then different ones: blocks 2 and 3 now hold
     * other[8..16), and must be cached as that content. */
    ck_assert_int_eq(bm_seq_truncate(p, 1, 8), ST_OK);
    ck_assert_int_eq(bm_seq_reserve(p, 1, other + 8, 12, slots), ST_OK);
    ck_assert_int_eq(bm_seq_create(p, 2, 0), ST_OK);
    ck_assert_int_eq(bm_seq_lookup_prefix(p, 2, other, 20, &got), ST_OK);
    ck_assert_uint_eq(got, 16);
    ck_assert_int_eq(memcmp(bm_seq_table(p, 1, NULL), bm_seq_table(p, 2, NULL),
                            4 * sizeof(int32_t)),
                     0);
    bm_seq_free(p, 1);
    bm_seq_free(p, 2);
    bm_pool_check(p);
    bm_memo_destroy(memo);
    bm_pool_destroy(p);
}
END_TEST

/* ---- the same random schedule on two pools ------------------------------ */

#define NREQ 24
#define PLEN_MAX 40
#define GEN_MAX 24

typedef struct rreq {
    int32_t toks[PLEN_MAX + GEN_MAX];
    uint32_t n_prompt, n, n_done; /* prompt, tokens now, tokens reserved */
    uint32_t tenant;
    int live;                     /* has a sequence (id = index + 1) */
    bm_hash_memo_t *memo;
} rreq_t;

static uint64_t rng_state;

static uint32_t
rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

static void
same_pools(bm_pool_t *a, bm_pool_t *b, const rreq_t *rq)
{
    bm_stats_t sa, sb;

    bm_pool_stats(a, &sa);
    bm_pool_stats(b, &sb);
    ck_assert_uint_eq(sa.prefix_queries, sb.prefix_queries);
    ck_assert_uint_eq(sa.prefix_hits, sb.prefix_hits);
    ck_assert_uint_eq(sa.n_evicted, sb.n_evicted);
    ck_assert_uint_eq(sa.dev_cached, sb.dev_cached);
    ck_assert_uint_eq(sa.dev_used, sb.dev_used);
    for (int i = 0; i < NREQ; i++) {
        uint32_t na = 0, nb = 0;
        const int32_t *ta = bm_seq_table(a, (uint64_t)i + 1, &na);
        const int32_t *tb = bm_seq_table(b, (uint64_t)i + 1, &nb);

        ck_assert_int_eq(rq[i].live, ta != NULL);
        ck_assert_uint_eq(na, nb);
        if (na > 0) {
            ck_assert_int_eq(memcmp(ta, tb, na * sizeof(int32_t)), 0);
        }
    }
}

START_TEST(test_random_same_as_without_memo)
{
    static rreq_t rq[NREQ];
    bm_pool_t *a = mk_pool(40), *b = mk_pool(40); /* a: no memos; b: memos */
    int32_t slots[PLEN_MAX + GEN_MAX];
    uint64_t hits = 0;

    rng_state = 0x5eed0000ull + (uint64_t)_i;
    for (int i = 0; i < NREQ; i++) {
        /* Four shared prefixes, so that requests hit each other's blocks. */
        uint32_t family = rnd(4);
        rq[i].n_prompt = 8 + rnd(PLEN_MAX - 7);
        rq[i].tenant = rnd(2);
        for (uint32_t k = 0; k < PLEN_MAX + GEN_MAX; k++) {
            rq[i].toks[k] = k < 20 ? (int32_t)(family * 100 + k) : (int32_t)(1000 + i * 64 + k);
        }
        rq[i].n = rq[i].n_prompt;
        rq[i].n_done = 0;
        rq[i].live = 0;
        ck_assert_int_eq(bm_memo_create(rq[i].n_prompt, BS, &rq[i].memo), ST_OK);
    }
    for (int op = 0; op < 4000; op++) {
        rreq_t *r = &rq[rnd(NREQ)];
        uint64_t id = (uint64_t)(r - rq) + 1;
        uint32_t k = rnd(10);

        bm_pool_step_begin(a);
        bm_pool_step_begin(b);
        if (!r->live) {
            /* Admission (or re-admission after a recompute): a chunk of
             * what is left, or all of it. */
            uint32_t pa = bm_prefix_probe(a, r->tenant, r->toks, r->n);
            uint32_t pb = bm_prefix_probe_memo(b, r->tenant, r->toks, r->n, r->memo);
            uint32_t ga = 0, gb = 0;

            ck_assert_uint_eq(pa, pb);
            ck_assert_int_eq(bm_seq_create(a, id, r->tenant), ST_OK);
            ck_assert_int_eq(bm_seq_create(b, id, r->tenant), ST_OK);
            ck_assert_int_eq(bm_seq_set_memo(b, id, r->memo), ST_OK);
            ck_assert_int_eq(bm_seq_lookup_prefix(a, id, r->toks, r->n, &ga), ST_OK);
            ck_assert_int_eq(bm_seq_lookup_prefix(b, id, r->toks, r->n, &gb), ST_OK);
            ck_assert_uint_eq(ga, gb);
            hits += ga;
            uint32_t chunk = r->n - ga;
            if (chunk > 1 && rnd(2)) {
                chunk = 1 + rnd(chunk);
            }
            int ra = bm_seq_reserve(a, id, r->toks + ga, chunk, slots);
            int rb = bm_seq_reserve(b, id, r->toks + gb, chunk, slots);
            ck_assert_int_eq(ra, rb);
            if (ra == ST_OK) {
                r->live = 1;
                r->n_done = ga + chunk;
            } else {
                bm_seq_free(a, id);
                bm_seq_free(b, id);
            }
        } else if (k >= 8 || (r->n_done == r->n && r->n == PLEN_MAX + GEN_MAX)) {
            /* Preempted by recompute (8), or finished (9, or nothing left
             * to generate): a finished request starts over as a fresh one
             * with the same prompt. Never in the step of its reserve. */
            bm_seq_free(a, id);
            bm_seq_free(b, id);
            r->live = 0;
            r->n_done = 0;
            if (k != 8) {
                r->n = r->n_prompt;
            }
        } else {
            /* The rest of the prefill, or one decode token. */
            if (r->n_done == r->n) {
                r->n++;
            }
            uint32_t chunk = r->n - r->n_done;
            int ra = bm_seq_reserve(a, id, r->toks + r->n_done, chunk, slots);
            int rb = bm_seq_reserve(b, id, r->toks + r->n_done, chunk, slots);
            ck_assert_int_eq(ra, rb);
            if (ra == ST_OK) {
                r->n_done += chunk;
            } else if (r->n_done < r->n && r->n > r->n_prompt && chunk == 1) {
                r->n--; /* the decode waits */
            }
        }
        bm_pool_ops_clear(a);
        bm_pool_ops_clear(b);
        bm_pool_step_end(a);
        bm_pool_step_end(b);
        same_pools(a, b, rq);
    }
    bm_pool_check(a);
    bm_pool_check(b);
    bm_stats_t st;
    bm_pool_stats(b, &st);
    ck_assert_uint_gt(hits, 0);
    ck_assert_uint_gt(st.n_evicted, 0);
    ck_assert_uint_lt(bm_pool_hash_calls(b), bm_pool_hash_calls(a));
    for (int i = 0; i < NREQ; i++) {
        bm_memo_destroy(rq[i].memo);
    }
    bm_pool_destroy(a);
    bm_pool_destroy(b);
}
END_TEST

Suite *
blockmgr_memo_suite(void)
{
    Suite *s = suite_create("blockmgr_memo");
    TCase *tc = tcase_create("memo");

    tcase_add_test(tc, test_recompute_does_not_rehash_prompt);
    tcase_add_test(tc, test_truncate_into_prefix_detaches);
    tcase_add_loop_test(tc, test_random_same_as_without_memo, 0, 8);
    suite_add_tcase(s, tc);
    return s;
}
