/* fuzz_common.h - shared helpers of the fuzz targets in tests/fuzz/.
 *
 * Every target defines LLVMFuzzerTestOneInput() and may define
 * LLVMFuzzerInitialize(). The same sources build two ways:
 *   - with clang -fsanitize=fuzzer (meson -Dfuzz=true): libFuzzer drives
 *     them (tests/fuzz/run.sh);
 *   - with the normal compiler, linked with replay.c: a main() that runs
 *     every file of the seed corpus and the regression inputs, and the
 *     target's linearity cases (fuzz_linear_cases), so `meson test` replays
 *     them on every build.
 *
 * Properties failing call FUZZ_CHECK, which prints the reason and aborts
 * (libFuzzer then saves the input as a crash).
 *
 * Thread: single-threaded.
 */
#ifndef TESTS_FUZZ_FUZZ_COMMON_H
#define TESTS_FUZZ_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with a message when cond is false. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int fuzz_utf8_valid(const char *s, size_t n);

/* A linearity case: gen(k, &len) returns a malloc'd input of "scale" k
 * (its size grows linearly with k); run(input, len) processes it once.
 * The replay build times run() at scale k and 8k (thread CPU time, best of
 * several runs) and fails when the time per byte grows more than
 * FUZZ_LINEAR_MAX_RATIO: a parser that is quadratic in its input shows a
 * ratio near 8, a linear one near 1. */
typedef struct fuzz_linear_case {
    const char *name;
    uint8_t *(*gen)(size_t k, size_t *len);
    void (*run)(const uint8_t *data, size_t len);
    size_t k; /* the small scale (grown up to 16k for timing); the large one is 8x */
} fuzz_linear_case_t;

#define FUZZ_LINEAR_MAX_RATIO 4.0

/* Terminated by a case with name NULL. Every target defines it (possibly
 * empty). */
extern const fuzz_linear_case_t fuzz_linear_cases[];

/* 1 in the replay build (replay.c sets it before the first input), 0 under
 * libFuzzer. Properties that cost a second full pass over the input (a
 * second render, a second decode) run on every replayed input but only on
 * a sample of the fuzzed ones, which keeps the executions per second up;
 * the fuzzer still reaches them through the bits that select the sample. */
extern int fuzz_replay;

/* Path of the source root (KVSERVE_SOURCE_ROOT env var, else the
 * compiled-in one), for targets that load fixtures at start. */
const char *fuzz_source_root(void);

#endif /* TESTS_FUZZ_FUZZ_COMMON_H */
