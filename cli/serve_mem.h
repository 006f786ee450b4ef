/* serve_mem.h - `kvserve serve` start-up checks of the KV pool against the
 * context length and of the committed memory against what the host has.
 *
 * DESIGN. A daemon that starts with settings it cannot honour fails late:
 * every long chat request gets 400, or the OOM killer ends it under load.
 * These checks run once, after the model is loaded and before the engine
 * maps its pools, and either adjust a default with a warning or refuse
 * with one line that gives the numbers.
 *
 * Thread: the main thread at start-up.
 */
#ifndef CLI_SERVE_MEM_H
#define CLI_SERVE_MEM_H

#include <stddef.h>
#include <stdint.h>

/* Fits the context length *ctx to a pool of num_blocks blocks of
 * block_size tokens (block 0 is the null block, so one sequence can use
 * num_blocks - 1). When *ctx fits nothing changes. When it does not and
 * user_set is 0 (--max-model-len not given), *ctx is lowered to what one
 * sequence can use and a warning is logged, as vLLM does. When user_set is
 * 1 the request is refused: ST_EINVAL with one line in err. A pool that
 * cannot hold 2 tokens is refused either way. */
int serve_fit_context(int64_t num_blocks, int32_t block_size, int user_set, int32_t *ctx,
                      char *err, size_t errlen);

/* Checks that host_bytes (what the process commits in host RAM at start:
 * KV pool on cpu, swap tier, residual slots) fits in MemAvailable. avail
 * is sysmem_available() (or a test's figure; < 0: unknown, always fits).
 * ST_OK, or ST_ENOMEM with one line naming every part in MiB. */
int serve_check_memory(int64_t avail, int64_t pool_bytes, int64_t swap_bytes,
                       int64_t other_bytes, char *err, size_t errlen);

#endif /* CLI_SERVE_MEM_H */
