/* replay.c - main() of the replay build of a fuzz target (no libFuzzer).
 *
 *   replay [--linear] PATH...
 *
 * Runs LLVMFuzzerTestOneInput() once on every file named, and on every file
 * of every directory named (the seed corpus and the regression inputs), so
 * an input that once crashed stays fixed. With --linear it also runs the
 * target's linearity cases (fuzz_common.h). Exits 0 when everything passed;
 * a failed property aborts.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int n_inputs;

static void
run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long len;

    if (f == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    /* An exact-size copy, so ASan sees reads past the end of the input. */
    buf = malloc(len > 0 ? (size_t)len : 1);
    if (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    n_inputs++;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void
run_path(const char *path)
{
    struct stat st;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such path %s\n", path);
        exit(1);
    }
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof(*names));
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0) {
        qsort(names, n, sizeof(*names), cmp_str);
    }
    for (size_t i = 0; i < n; i++) {
        run_path(names[i]);
        free(names[i]);
    }
    free(names);
}

static double
cpu_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best-of-reps CPU seconds per input byte for scale k. */
static double
time_per_byte(const fuzz_linear_case_t *c, size_t k, size_t *len_out)
{
    size_t len;
    uint8_t *in = c->gen(k, &len);
    double best = 1e30;

    for (int rep = 0; rep < 5; rep++) {
        double t0 = cpu_seconds();
        c->run(in, len);
        double dt = cpu_seconds() - t0;
        best = dt < best ? dt : best;
    }
    free(in);
    *len_out = len;
    return best / (double)len;
}

static int
run_linear(void)
{
    int failed = 0;

    for (const fuzz_linear_case_t *c = fuzz_linear_cases; c->name != NULL; c++) {
        size_t k = c->k, len_small, len_big;
        double small = time_per_byte(c, k, &len_small);
        /* Grow the small scale (up to 16x) until one run takes a
         * measurable time. */
        while (small * (double)len_small < 2e-3 && k < c->k * 16) {
            k *= 2;
            small = time_per_byte(c, k, &len_small);
        }
        double big = time_per_byte(c, 8 * k, &len_big);
        double ratio = big / small;
        printf("linear %-28s %9zu B: %7.1f ns/B  %9zu B: %7.1f ns/B  ratio %.2f\n", c->name,
               len_small, small * 1e9, len_big, big * 1e9, ratio);
        if (ratio > FUZZ_LINEAR_MAX_RATIO) {
            printf("  FAIL: %s is superlinear in its input size\n", c->name);
            failed = 1;
        }
    }
    return failed;
}

int
main(int argc, char **argv)
{
    int linear = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    fuzz_replay = 1;
    if (LLVMFuzzerInitialize != NULL) {
        LLVMFuzzerInitialize(&argc, &argv);
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--linear") == 0) {
            linear = 1;
        } else {
            run_path(argv[i]);
        }
    }
    printf("replayed %d inputs\n", n_inputs);
    return linear ? run_linear() : 0;
}
