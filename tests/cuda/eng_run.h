/* eng_run.h - a whole engine run for the tests that compare backends or
 * configurations token for token (test_tp_engine.c, test_spec_emu.c,
 * test_mass_emu.c).
 *
 * DESIGN
 *   The test fills an eng_config_t from er_config() (one "default"
 *   tenant, prefix caching, one kernel thread, a 256-token model length)
 *   and its requests from er_request() (greedy, ignore_eos), then
 *   er_run() submits them -- all at once or one per step -- steps the
 *   engine on the calling thread until it is idle, and gathers each
 *   request's tokens. Afterwards the block pool must be consistent with
 *   every block free (checked), and the engine is destroyed.
 *
 * Thread: tests only, one thread (the engine is stepped, not started).
 */
#ifndef TESTS_CUDA_ENG_RUN_H
#define TESTS_CUDA_ENG_RUN_H

#include <stdint.h>

#include "model/model.h"
#include "scheduler/engine.h"

#define ER_MAX_GEN 320 /* tokens kept per request */

typedef struct er_out {
    int32_t tok[ER_MAX_GEN];
    int32_t n;
    int finished;   /* finished or failed */
    char error[256]; /* the engine's error message, "" when none */
} er_out_t;

/* *c zeroed, then: device, block_size, num_blocks, max_num_seqs,
 * max_num_batched_tokens as given; n_threads 1, max_model_len 256, prefix
 * caching on, one tenant "default" of weight 1. */
void er_config(eng_config_t *c, const char *device, int32_t block_size, int32_t num_blocks,
               int32_t max_num_seqs, int32_t max_num_batched_tokens);
/* A greedy request (temperature 0, top_p 1, no penalty, n 1, ignore_eos)
 * of max_tokens; the prompt is copied. The caller may set more fields. */
eng_msg_submit_t *er_request(uint64_t id, const int32_t *prompt, int32_t n_prompt,
                             int32_t max_tokens);
/* Runs an engine of c on m over reqs[0..n) (ids 1..n, each owned by the
 * engine once sent): all submitted before the first step when per_step is
 * 0, else one per step. res[i] gets request i + 1's tokens. An engine
 * error fails the test unless errors_ok (then it is kept in res[i].error).
 * st, when not NULL, gets the engine's counters. */
void er_run(const eng_config_t *c, const mdl_model_t *m, eng_msg_submit_t *const reqs[], int n,
            int per_step, int errors_ok, er_out_t *res, eng_stats_t *st);

#endif /* TESTS_CUDA_ENG_RUN_H */
