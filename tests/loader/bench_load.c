/* bench_load.c - prints how long mdl_model_load takes (and the weights it
 * yields) for each model path on the command line; without arguments, for
 * the default model as safetensors F32, BF16 and GGUF F32. A benchmark,
 * not a test: it prints figures and asserts nothing about time.
 *
 *   bench_load /tmp/r135m /tmp/r135m-q8_0.gguf     (see make_random_model.py)
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "model/model_int.h"

static int
bench(const char *path)
{
    mdl_model_t *m;
    char err[512];
    double t0, t1, t2, sum = 0;
    int rc;

    t0 = now_s();
    rc = mdl_model_load(path, &m, err, sizeof(err));
    t1 = now_s();
    if (rc != 0) {
        fprintf(stderr, "bench_load: %s\n", err);
        return 1;
    }
    /* Touch one byte per page of every FFN matrix: in-place weights are
     * only mapped at load, this is the first read. */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const kn_weight_t *w[3] = {&m->layers[l].w_gate, &m->layers[l].w_up, &m->layers[l].w_down};

        for (int i = 0; i < 3; i++) {
            size_t n = (size_t)w[i]->rows * w[i]->row_bytes;

            for (size_t k = 0; k < n; k += 4096) {
                sum += ((const unsigned char *)w[i]->data)[k];
            }
        }
    }
    t2 = now_s();
    printf("%-48s load %7.3f s  first FFN read %6.3f s  %8.1f MB weights read per token  "
           "%d owned buffers (check %.3g)\n",
           path, t1 - t0, t2 - t1, (double)mdl_model_weight_bytes(m) / 1e6, m->n_owned, sum);
    mdl_model_destroy(m);
    return 0;
}

int
main(int argc, char **argv)
{
    const char *root = getenv("KVSERVE_SOURCE_DIR");
    char paths[3][4096];
    int failed = 0;

    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            failed |= bench(argv[i]);
        }
        return failed;
    }
    if (root == NULL) {
        fprintf(stderr, "usage: bench_load MODEL... (or set KVSERVE_SOURCE_DIR)\n");
        return 2;
    }
    snprintf(paths[0], sizeof(paths[0]), "%s/models/austen-2.7m", root);
    snprintf(paths[1], sizeof(paths[1]), "%s/models/austen-2.7m/bf16", root);
    snprintf(paths[2], sizeof(paths[2]), "%s/models/austen-2.7m/model-f32.gguf", root);
    for (int i = 0; i < 3; i++) {
        failed |= bench(paths[i]);
    }
    return failed;
}
