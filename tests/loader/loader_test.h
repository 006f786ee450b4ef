/* loader_test.h - helpers shared by the loader suites: paths, temporary
 * directories, whole-file I/O, running tools/make_random_model.py, and
 * weight comparisons with a tolerance per storage format. */
#ifndef TESTS_LOADER_TEST_H
#define TESTS_LOADER_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_int.h"

/* $KVSERVE_SOURCE_DIR/rel (static buffer rotated over 8 calls). */
const char *lt_src(const char *rel);
/* A fresh directory under $TMPDIR (malloc'd path); lt_rmtree removes it. */
char *lt_mkdtemp(const char *tag);
void lt_rmtree(const char *path);
/* Whole file into a malloc'd buffer; aborts the test on failure. */
unsigned char *lt_read(const char *path, size_t *len);
void lt_write(const char *path, const void *data, size_t len);
/* Runs the random model writer with args; returns its exit status. */
int lt_make_model(const char *args);

typedef enum lt_tol {
    LT_EXACT = 0,
    LT_BF16, /* bf16 rounding of the reference */
    LT_F16,  /* f16 rounding */
    LT_Q8_0, /* Q8_0: half a quantization step of each 32-block */
    /* 4-, 5-, 6-bit types: whole-tensor error statistics, because the
     * bound of one element depends on its block's scales. A wrong block
     * layout gives an error as large as the weights themselves. */
    LT_Q4, /* rms error <= 0.12 rms, max error <= 0.15 max |w| */
    LT_Q5, /* 0.06, 0.08 */
    LT_Q6, /* 0.03, 0.03 */
} lt_tol_t;

/* Compares every weight of b against a (the f32 reference) with tol for
 * matrices; vectors (norms, biases) use vec_tol. Fails the test with the
 * tensor name on the first mismatch. */
void lt_compare_models(const mdl_model_t *a, const mdl_model_t *b, lt_tol_t tol, lt_tol_t vec_tol);

/* Loads path and asserts failure: status negative, err mentions each
 * non-NULL needle. Returns the status. */
int lt_expect_load_error(const char *path, const char *needle1, const char *needle2);

Suite *loader_formats_suite(void);
Suite *loader_corrupt_suite(void);
Suite *loader_gguf_suite(void);
Suite *loader_config_suite(void);

#endif /* TESTS_LOADER_TEST_H */
