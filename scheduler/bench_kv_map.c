/* bench_kv_map.c - engine-thread cost of the web console's KV map snapshot
 * (scheduler/kv_map.h) at 100,000 device blocks.
 *
 * Builds a pool of 100,000 device and 20,000 CPU blocks with prefix
 * caching and token records on (as under --admin-api-key), fills it with
 * 1,000 sequences (some forked, so blocks are shared) and frees half of
 * them (their full blocks stay CACHED), swaps a few out, then times the
 * ENG_ADMIN_MAP query as the engine runs it: the reply buffer allocation
 * and the copy of every block's record and 256 sequences' tables. Also
 * times blockmgr's bm_map_tier() pass alone, one block detail and
 * freeing the reply (which the loop thread does). Figures only
 * (DESIGN.md 7): the target is under 1 ms per snapshot.
 *
 * Usage: bench_kv_map [iterations]   (default 200)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/blockmgr.h"
#include "blockmgr/bm_map.h"
#include "common/status.h"
#include "common/util.h"
#include "scheduler/kv_map.h"

#define N_BLOCKS 100001u
#define N_SWAP 20000u
#define BS 16u

static void
must(int rc, const char *what)
{
    if (rc != ST_OK) {
        fprintf(stderr, "bench_kv_map: %s: %s\n", what, st_str(rc));
        exit(1);
    }
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

static void
report(const char *name, uint64_t *ns, int n)
{
    double sum = 0;

    qsort(ns, (size_t)n, sizeof(*ns), cmp_u64);
    for (int i = 0; i < n; i++) {
        sum += (double)ns[i];
    }
    printf("%-46s min %7.1f us  p50 %7.1f us  mean %7.1f us  max %8.1f us\n", name,
           (double)ns[0] / 1e3, (double)ns[n / 2] / 1e3, sum / n / 1e3, (double)ns[n - 1] / 1e3);
}

int
main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    bm_config_t cfg = {.block_size = BS,
                       .num_blocks = N_BLOCKS,
                       .swap_blocks = N_SWAP,
                       .prefix_caching = 1,
                       .watermark = 0.01f};
    static int32_t toks[2048], slots[2048];
    bm_pool_t *pool;
    uint64_t *ns;
    bm_stats_t st;
    eng_msg_admin_t *m;

    if (iters < 1) {
        iters = 200;
    }
    ns = calloc((size_t)iters, sizeof(*ns));
    must(bm_pool_create(&cfg, &pool), "create");
    bm_pool_keep_tokens(pool);
    /* 1,000 sequences of 1,500 tokens (94 blocks), 4 tenants; every tenth
     * forked (shared blocks, refcount 2). */
    for (uint32_t s = 0; s < 1000; s++) {
        for (uint32_t i = 0; i < 1500; i++) {
            toks[i] = (int32_t)((i * 2654435761u + s * 40503u) % 32000u);
        }
        must(bm_seq_create(pool, s, s % 4), "seq");
        must(bm_seq_reserve(pool, s, toks, 1500, slots), "reserve");
        if (s % 10 == 0) {
            must(bm_seq_fork(pool, s, 100000 + s), "fork");
        }
    }
    /* Half released: their full blocks become CACHED. A few swapped out. */
    for (uint32_t s = 1; s < 1000; s += 2) {
        bm_seq_free(pool, s);
    }
    for (uint32_t s = 2; s < 200; s += 10) {
        if (bm_seq_swap_out(pool, s) != ST_OK) {
            break;
        }
    }
    bm_pool_ops_clear(pool);
    bm_pool_stats(pool, &st);
    printf("kv map snapshot: %u device blocks (%u used, %u cached, %u free), %u cpu blocks "
           "(%u used, %u cached), block size %u\n",
           st.dev_total, st.dev_used, st.dev_cached, st.dev_free, st.cpu_total, st.cpu_used,
           st.cpu_cached, BS);

    m = calloc(1, sizeof(*m));
    m->hdr.type = ENG_MSG_ADMIN;
    uint64_t *free_ns = calloc((size_t)iters, sizeof(*free_ns));
    size_t bytes = 0;
    for (int i = 0; i < iters; i++) {
        m->op = ENG_ADMIN_MAP;
        uint64_t t0 = now_ns();
        eng_kv_admin(m, pool);
        ns[i] = now_ns() - t0;
        must(m->status, "map");
        bytes = (size_t)(m->tiers[0].n_blocks + m->tiers[1].n_blocks) * 7;
        t0 = now_ns();
        free(m->buf);
        m->buf = NULL;
        free_ns[i] = now_ns() - t0;
    }
    report("ENG_ADMIN_MAP (engine thread, alloc + copy)", ns, iters);
    report("free of the reply buffer (loop thread)", free_ns, iters);
    printf("%-46s %zu bytes of block records, %u of %u sequences listed\n", "reply size", bytes,
           m->n_seqs, m->n_seqs_total);

    {
        uint8_t *state = malloc(N_BLOCKS);
        uint16_t *tenant = malloc(N_BLOCKS * sizeof(*tenant));
        uint32_t *ref = malloc(N_BLOCKS * sizeof(*ref));
        for (int i = 0; i < iters; i++) {
            uint64_t t0 = now_ns();
            bm_map_tier(pool, BM_MAP_DEVICE, state, tenant, ref);
            ns[i] = now_ns() - t0;
        }
        report("bm_map_tier, device (warm buffers)", ns, iters);
        free(state);
        free(tenant);
        free(ref);
    }
    for (int i = 0; i < iters; i++) {
        m->op = ENG_ADMIN_BLOCK;
        m->tier = 0;
        m->block = 1 + (uint32_t)i * 97u % (N_BLOCKS - 1);
        m->viewer = 0;
        uint64_t t0 = now_ns();
        eng_kv_admin(m, pool);
        ns[i] = now_ns() - t0;
        free(m->buf);
        m->buf = NULL;
    }
    report("ENG_ADMIN_BLOCK (holders over 1,100 seqs)", ns, iters);

    free(m);
    free(ns);
    free(free_ns);
    bm_pool_destroy(pool);
    return 0;
}
