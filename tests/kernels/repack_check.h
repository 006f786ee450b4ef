/* repack_check.h - the checks every interleaved weight type shares
 * (KN_W_Q4_K_R8, KN_W_Q6_K_R8, KN_W_Q8_0_R16; kernels/cpu/kn_quant.h),
 * run by test_q4r8.c, test_q6r8.c and test_q8r16.c on the format each
 * describes in an rc_format_t.
 *
 * DESIGN. The three tests differed only in the file type's maker and view,
 * the repack function, the activation form the product reads (Q8_K or
 * Q8_0) and the block width of its rounding bound, and a few shapes; those
 * are the fields of rc_format_t, and rc_add_tests registers the shared
 * cases (repack_check.c lists them) on a Check TCase. Each test file keeps
 * its format's own cases and wild-block maker.
 *
 * Thread: test code, one thread; the random stream and the registered
 * format are file statics of repack_check.c.
 */
#ifndef TESTS_KERNELS_REPACK_CHECK_H
#define TESTS_KERNELS_REPACK_CHECK_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kn_quant.h"

/* The activation form a repacked type reads: Q8_K (one scale per 256
 * columns, kn_act_quantize_q8k) or Q8_0 (one per 32, kn_act_quantize_q8). */
typedef enum rc_act { RC_ACT_Q8_K, RC_ACT_Q8_0 } rc_act_t;

typedef struct rc_format {
    kn_wtype_t file;   /* the file's type (KN_W_Q4_K) */
    kn_wtype_t packed; /* the repacked type (KN_W_Q4_K_R8) */
    kn_wtype_t other;  /* a file type the repack must refuse */
    const char *name;  /* kn_wtype_name(packed) */
    int32_t group;     /* rows per group (8, 16) */
    int32_t blk_cols;  /* columns per repacked block (256, 32) */
    size_t blk_bytes;  /* bytes per repacked block */
    rc_act_t act;
    /* A rows x cols matrix of the file type (rc_make's contract) and its view. */
    void *(*make)(int32_t rows, int32_t cols, int wild, int outliers);
    kn_weight_t (*view)(const void *p, int32_t rows, int32_t cols);
    size_t (*bytes)(int32_t rows, int32_t cols);
    int (*repack)(const kn_weight_t *w, void *dst, kn_weight_t *out);
    int32_t roundtrip[4][2]; /* rows, cols of the round trips */
    int32_t embed_tok;       /* a token (mod rows) the embedding lookup reads */
    int32_t levels[4][2];    /* rows, cols of test_product_levels */
    int32_t wide_cols;       /* the widest rows (1024 under KVSERVE_TEST_SCALE < 1) */
    int32_t wide_tok;        /* tokens of the 128 x 2048 product */
} rc_format_t;

/* The fields an 8-row repack of a K-quant shares (q4_k_r8, q6_k_r8):
 * 256-column super-blocks read against Q8_K, and the shapes they run. */
#define RC_K_R8_FIELDS                                                                             \
    .group = 8, .blk_cols = 256, .act = RC_ACT_Q8_K,                                               \
    .roundtrip = {{8, 256}, {24, 512}, {16, 1280}, {8, 4096}}, .embed_tok = 5,                     \
    .levels = {{8, 256}, {40, 512}, {16, 1280}, {72, 2048}}, .wide_cols = 4096, .wide_tok = 9

/* The tests' random stream: 31-bit ints, floats in [-1, 1), and fill:
 * uniform [-1, 1), or (outliers) mostly within 0.1 with about 2% of the
 * values 30 to 60 times larger. */
uint32_t rc_urand(void);
float rc_frand(void);
void rc_fill(float *x, size_t n, int outliers);

/* A malloc'd rows x cols matrix of type t: ggml's quantizer over rc_fill
 * data, or (wild) random bytes that wild_fix(row, r, cols) then makes a
 * valid row r of (sane scales, chosen codes). The caller frees it. */
void *rc_make(kn_wtype_t t, int32_t rows, int32_t cols, int wild, int outliers,
              void (*wild_fix)(uint8_t *row, int32_t r, int32_t cols));

/* One product shape of format f, repacked: the reference within the
 * activation form's rounding bound of an f64 product over the
 * dequantized weights, then every ISA level x 1 and 2 threads bit for bit
 * against the reference. mode: 1 adds a bias, 2 accumulates. */
void rc_check_product(const rc_format_t *f, int32_t rows, int32_t cols, int32_t n_tok, int wild,
                      int outliers, int mode);

/* Adds the shared cases on format f (which must outlive the run) to tc. */
void rc_add_tests(TCase *tc, const rc_format_t *f);

#endif /* TESTS_KERNELS_REPACK_CHECK_H */
