/* serve_mem.c - start-up checks of `kvserve serve` (cli/serve_mem.h).
 *
 * Thread: the main thread at start-up.
 */
#define LOG_MODULE "serve"

#include <stdio.h>

#include "cli/serve_mem.h"
#include "common/log.h"
#include "common/status.h"

int
serve_fit_context(int64_t num_blocks, int32_t block_size, int user_set, int32_t *ctx,
                  char *err, size_t errlen)
{
    int64_t cap = (num_blocks - 1) * (int64_t)block_size;

    if (cap < 2) {
        snprintf(err, errlen, "the KV pool of %lld blocks of %d tokens holds no sequence",
                 (long long)num_blocks, block_size);
        return ST_EINVAL;
    }
    if (*ctx <= cap) {
        return ST_OK;
    }
    if (user_set) {
        snprintf(err, errlen,
                 "--max-model-len %d does not fit the KV pool: %lld blocks of %d tokens hold "
                 "%lld tokens of one sequence; give a larger --num-kv-blocks or "
                 "--kv-cache-memory, or --max-model-len %lld",
                 *ctx, (long long)num_blocks, block_size, (long long)cap, (long long)cap);
        return ST_EINVAL;
    }
    LOG_WARN("the KV pool (%lld blocks of %d tokens) holds %lld tokens of one sequence, less "
             "than the model's context of %d: max_model_len lowered to %lld",
             (long long)num_blocks, block_size, (long long)cap, *ctx, (long long)cap);
    *ctx = (int32_t)cap;
    return ST_OK;
}

int
serve_check_memory(int64_t avail, int64_t pool_bytes, int64_t swap_bytes, int64_t other_bytes,
                   char *err, size_t errlen)
{
    int64_t need = pool_bytes + swap_bytes + other_bytes;

    if (avail < 0 || need <= avail) {
        return ST_OK;
    }
    snprintf(err, errlen,
             "not enough memory: KV pool %.1f MiB + swap tier %.1f MiB + scratch %.1f MiB = "
             "%.1f MiB, but MemAvailable is %.1f MiB; lower --kv-cache-memory / "
             "--num-kv-blocks, --swap-space or --max-num-seqs",
             (double)pool_bytes / 1048576.0, (double)swap_bytes / 1048576.0,
             (double)other_bytes / 1048576.0, (double)need / 1048576.0,
             (double)avail / 1048576.0);
    return ST_ENOMEM;
}
