/* bench_blockmgr.c - throughput of the block manager at 100,000 blocks.
 *
 * Prints ops/s for reserve (decode: 1 token; prefill: 1024 tokens), free,
 * prefix lookup, fork, swap out + in, and the per-step cost of serving 256
 * running sequences with one reserve each. Figures only, no assertions
 * beyond the calls succeeding: timings are never tested (DESIGN.md 7).
 *
 * Usage: bench_blockmgr [scale]   (scale < 1 shortens every loop)
 */
#include <stdio.h>
#include <stdlib.h>

#include "blockmgr/blockmgr.h"
#include "common/status.h"
#include "common/util.h"

#define N_BLOCKS 100001u
#define BS 16u

static void
must(int rc, const char *what)
{
    if (rc != ST_OK) {
        fprintf(stderr, "bench_blockmgr: %s: %s\n", what, st_str(rc));
        exit(1);
    }
}

static bm_pool_t *
make_pool(int prefix, uint32_t swap)
{
    bm_config_t cfg = {.block_size = BS,
                       .num_blocks = N_BLOCKS,
                       .swap_blocks = swap,
                       .prefix_caching = prefix,
                       .watermark = 0.01f};
    bm_pool_t *pool;

    must(bm_pool_create(&cfg, &pool), "create");
    return pool;
}

static void
report(const char *name, uint64_t n, double sec, const char *unit)
{
    printf("%-44s %10.0f %s/s  (%7.3f us each)\n", name, (double)n / sec, unit,
           sec * 1e6 / (double)n);
}

static void
fill_tokens(int32_t *t, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++) {
        t[i] = (int32_t)((i * 2654435761u + seed * 40503u) % 32000u);
    }
}

int
main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    static int32_t toks[4096], slots[4096];
    double t0;
    uint32_t nc;

    if (scale <= 0) {
        scale = 1.0;
    }
    printf("blockmgr benchmark: %u device blocks of %u tokens\n", N_BLOCKS - 1, BS);

    for (int prefix = 0; prefix <= 1; prefix++) {
        bm_pool_t *pool = make_pool(prefix, 0);
        uint32_t n_seqs = 1000, steps = (uint32_t)(1000 * scale);
        uint64_t n;
        char name[96];

        printf("-- prefix caching %s\n", prefix ? "on (SHA-256 per full block)" : "off");
        /* Decode-style reserves: 1000 sequences, one token each per round. */
        for (uint32_t s = 0; s < n_seqs; s++) {
            must(bm_seq_create(pool, s, 0), "seq");
            fill_tokens(toks, 64, s);
            must(bm_seq_reserve(pool, s, toks, 64, slots), "prefill");
        }
        t0 = now_s();
        n = 0;
        for (uint32_t r = 0; r < steps; r++) {
            for (uint32_t s = 0; s < n_seqs; s++) {
                int32_t tok = (int32_t)(r * 7 + s);
                must(bm_seq_reserve(pool, s, &tok, 1, slots), "reserve1");
                n++;
            }
        }
        snprintf(name, sizeof(name), "reserve 1 token (decode)");
        report(name, n, now_s() - t0, "ops");

        /* Free of sequences holding ~64 + steps/16 blocks each. */
        t0 = now_s();
        for (uint32_t s = 0; s < n_seqs; s++) {
            bm_seq_free(pool, s);
        }
        snprintf(name, sizeof(name), "free (seq of %u blocks)", (64 + steps) / BS);
        report(name, n_seqs, now_s() - t0, "ops");

        /* Prefill-sized reserves, then frees, with distinct prompts. */
        n = (uint64_t)(2000 * scale);
        t0 = now_s();
        for (uint64_t i = 0; i < n; i++) {
            fill_tokens(toks, 1024, (uint32_t)i + 1000000u);
            must(bm_seq_create(pool, 1000000 + i, 0), "seq");
            must(bm_seq_reserve(pool, 1000000 + i, toks, 1024, slots), "reserve1024");
            if (i % 64 == 63) {
                for (uint64_t j = i - 63; j <= i; j++) {
                    bm_seq_free(pool, 1000000 + j);
                }
            }
        }
        report("reserve 1024 tokens + free (64 blocks)", n, now_s() - t0, "ops");
        bm_pool_reset_prefix_cache(pool);

        /* Prefix lookups of a 1025-token prompt whose 64 blocks are cached. */
        fill_tokens(toks, 1025, 7);
        must(bm_seq_create(pool, 1, 0), "seq");
        must(bm_seq_reserve(pool, 1, toks, 1025, slots), "reserve");
        n = (uint64_t)(20000 * scale);
        t0 = now_s();
        for (uint64_t i = 0; i < n; i++) {
            must(bm_seq_create(pool, 2, 0), "seq");
            must(bm_seq_lookup_prefix(pool, 2, toks, 1025, &nc), "lookup");
            bm_seq_free(pool, 2);
        }
        snprintf(name, sizeof(name), "lookup 1025-token prompt (+create/free), %u hit", nc);
        report(name, n, now_s() - t0, "ops");

        /* Fork of a 65-block sequence (+ free of the child). */
        n = (uint64_t)(100000 * scale);
        t0 = now_s();
        for (uint64_t i = 0; i < n; i++) {
            must(bm_seq_fork(pool, 1, 3), "fork");
            bm_seq_free(pool, 3);
        }
        report("fork 65 blocks (+free child)", n, now_s() - t0, "ops");
        bm_seq_free(pool, 1);

        /* The step: 256 running sequences, one reserve each. */
        for (uint32_t s = 0; s < 256; s++) {
            must(bm_seq_create(pool, 5000 + s, 0), "seq");
            fill_tokens(toks, 500, s);
            must(bm_seq_reserve(pool, 5000 + s, toks, 500, slots), "prompt");
        }
        steps = (uint32_t)(4000 * scale);
        t0 = now_s();
        for (uint32_t r = 0; r < steps; r++) {
            uint32_t n_ops;
            for (uint32_t s = 0; s < 256; s++) {
                int32_t tok = (int32_t)(r + s);
                must(bm_seq_reserve(pool, 5000 + s, &tok, 1, slots), "step reserve");
            }
            bm_pool_ops(pool, &n_ops);
            bm_pool_ops_clear(pool);
        }
        {
            double per_step = (now_s() - t0) / steps;
            printf("%-44s %10.2f us/step (%.4f%% of a 10 ms decode step)\n",
                   "step: 256 seqs x reserve(1)", per_step * 1e6, per_step / 0.010 * 100);
        }
        bm_pool_destroy(pool);
    }

    /* Swap out + in of a 64-block sequence, with room on both tiers.
     * With prefix caching the device copies stay cached and the swap-in
     * revives them (no copy); without, every block is copied both ways. */
    for (int prefix = 1; prefix >= 0; prefix--) {
        bm_pool_t *pool = make_pool(prefix, 20000);
        uint64_t n = (uint64_t)(20000 * scale);
        fill_tokens(toks, 1024, 3);
        must(bm_seq_create(pool, 1, 0), "seq");
        must(bm_seq_reserve(pool, 1, toks, 1024, slots), "reserve");
        t0 = now_s();
        for (uint64_t i = 0; i < n; i++) {
            must(bm_seq_swap_out(pool, 1), "swap_out");
            must(bm_seq_swap_in(pool, 1), "swap_in");
            bm_pool_ops_clear(pool);
        }
        report(prefix ? "-- swap out + in, 64 blocks (cached on device)"
                      : "-- swap out + in, 64 blocks (128 copies queued)",
               n, now_s() - t0, "ops");
        bm_pool_destroy(pool);
    }
    return 0;
}
