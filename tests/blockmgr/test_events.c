/* test_events.c - the KV-cache event hook (blockmgr/bm_events.h).
 *
 * A follower applies every event to a set of (hash, medium) pairs, as a
 * router's indexer would. After every random operation (admission with a
 * prefix lookup, growth, free, swap out / in, eviction and demotion under
 * pressure, reset) the set must equal the hashes the pool has registered
 * on each tier, and each STORED block's token ids and parent must be the
 * ones its hash was computed from (recomputed here with the documented
 * chain). */
#include <check.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr_int.h"
#include "common/status.h"

#define BS 4
#define MAX_EV 4096

typedef struct {
    uint8_t hash[32];
    int medium;
} fkey_t;

static bm_pool_t *pool;
static fkey_t fset[MAX_EV];
static int n_fset, n_cleared, n_stored_cpu, n_removed;

static int
ffind(const uint8_t *h, int medium)
{
    for (int i = 0; i < n_fset; i++) {
        if (fset[i].medium == medium && memcmp(fset[i].hash, h, 32) == 0) {
            return i;
        }
    }
    return -1;
}

/* The documented hash: SHA-256 over "kvs-bm1" | salt_len | salt (first
 * block) or the parent hash, then the token ids little-endian, then the
 * extra key's length (0 here). */
static void
doc_hash(const uint8_t *parent, const int32_t *toks, uint8_t out[32])
{
    uint8_t buf[64];
    size_t n = 0;

    if (parent != NULL) {
        memcpy(buf, parent, 32);
        n = 32;
    } else {
        memcpy(buf, "kvs-bm1", 7);
        buf[7] = 1; /* salt length */
        buf[8] = 'x';
        n = 9;
    }
    for (int i = 0; i < BS; i++) {
        uint32_t v = (uint32_t)toks[i];
        buf[n++] = (uint8_t)v;
        buf[n++] = (uint8_t)(v >> 8);
        buf[n++] = (uint8_t)(v >> 16);
        buf[n++] = (uint8_t)(v >> 24);
    }
    buf[n++] = 0; /* extra key length */
    SHA256(buf, n, out);
}

static void
on_event(void *arg, const bm_event_t *ev)
{
    (void)arg;
    if (ev->kind == BM_EVENT_CLEARED) {
        ck_assert_int_eq(n_fset, 0); /* sent only when nothing is left */
        n_cleared++;
        return;
    }
    int i = ffind(ev->hash, ev->medium);
    if (ev->kind == BM_EVENT_STORED) {
        uint8_t h[32];
        ck_assert_int_lt(i, 0);
        ck_assert_uint_eq(ev->n_tokens, BS);
        doc_hash(ev->parent, ev->tokens, h);
        ck_assert(memcmp(h, ev->hash, 32) == 0);
        ck_assert_int_lt(n_fset, MAX_EV);
        memcpy(fset[n_fset].hash, ev->hash, 32);
        fset[n_fset++].medium = ev->medium;
        n_stored_cpu += ev->medium == BM_MEDIUM_CPU;
    } else {
        ck_assert_int_eq(ev->kind, BM_EVENT_REMOVED);
        ck_assert_int_ge(i, 0);
        fset[i] = fset[--n_fset];
        n_removed++;
    }
}

/* The follower's set equals the registered hashes of both tiers. */
static void
check_follower(void)
{
    int n_reg = 0;

    for (int t = 0; t < 2; t++) {
        const bm_tier_t *tier = &pool->tier[t];
        for (uint32_t id = 0; id < tier->n_blocks; id++) {
            const bm_block_t *b = &tier->blocks[id];
            if (b->cached) {
                ck_assert_int_ge(ffind(b->hash, t == BM_CPU ? BM_MEDIUM_CPU : BM_MEDIUM_DEVICE),
                                 0);
                n_reg++;
            }
        }
    }
    ck_assert_int_eq(n_reg, n_fset);
}

START_TEST(test_follower_tracks_registrations)
{
    bm_config_t cfg = {.block_size = BS, .num_blocks = 17, .swap_blocks = 12, .prefix_caching = 1};
    uint64_t live[8] = {0};
    int32_t toks[64], slots[64];
    uint64_t next = 1;

    ck_assert_int_eq(bm_pool_create(&cfg, &pool), ST_OK);
    ck_assert_int_eq(bm_tenant_set_salt(pool, 0, "x", 1), ST_OK);
    bm_pool_set_event_hook(pool, on_event, NULL);
    n_fset = n_cleared = n_stored_cpu = n_removed = 0;
    srand(17);
    for (int step = 0; step < 3000; step++) {
        int slot = rand() % 8, op = rand() % 10;
        uint64_t s = live[slot];
        if (s == 0 && op < 7) {
            /* A new sequence over one of three shared prefixes. */
            uint32_t n = 4 + (uint32_t)(rand() % 24), got = 0;
            int p = rand() % 3;
            for (uint32_t i = 0; i < n; i++) {
                toks[i] = i < 12 ? 100 * p + (int32_t)i : rand() % 5;
            }
            s = next++;
            ck_assert_int_eq(bm_seq_create(pool, s, 0), ST_OK);
            ck_assert_int_eq(bm_seq_lookup_prefix(pool, s, toks, n, &got), ST_OK);
            if (bm_seq_reserve(pool, s, toks + got, n - got, slots) == ST_OK) {
                live[slot] = s;
            } else {
                bm_seq_free(pool, s);
            }
        } else if (s != 0 && op < 5 && !bm_seq_is_swapped(pool, s)) {
            int32_t t = rand() % 5;
            if (bm_seq_reserve(pool, s, &t, 1, slots) != ST_OK) {
                bm_seq_swap_out(pool, s);
            }
        } else if (s != 0 && op < 7) {
            if (bm_seq_is_swapped(pool, s)) {
                bm_seq_swap_in(pool, s);
            } else {
                bm_seq_swap_out(pool, s);
            }
        } else if (s != 0) {
            bm_seq_free(pool, s);
            live[slot] = 0;
        }
        if (step % 500 == 499) {
            for (int i = 0; i < 8; i++) {
                if (live[i] != 0) {
                    bm_seq_free(pool, live[i]);
                    live[i] = 0;
                }
            }
            bm_pool_reset_prefix_cache(pool);
        }
        bm_pool_ops_clear(pool);
        check_follower();
    }
    /* Pressure made evictions and demotions; full resets sent CLEARED. */
    ck_assert_int_gt(n_removed, 0);
    ck_assert_int_gt(n_stored_cpu, 0);
    ck_assert_int_gt(n_cleared, 0);
    bm_pool_check(pool);
    bm_pool_destroy(pool);
    pool = NULL;
}
END_TEST

Suite *
blockmgr_events_suite(void)
{
    Suite *s = suite_create("blockmgr_events");
    TCase *tc = tcase_create("events");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_follower_tracks_registrations);
    suite_add_tcase(s, tc);
    return s;
}
