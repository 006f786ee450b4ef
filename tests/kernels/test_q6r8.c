/* test_q6r8.c - q6_K weights repacked 8 rows at a time (KN_W_Q6_K_R8,
 * kernels/cpu/kn_quant.h), through the checks every interleaved type
 * shares (repack_check.c): the repack round trip and the embedding lookup
 * through it, the shapes it refuses, and the product at every ISA level x
 * 1 and 2 threads bit for bit against the scalar reference, the reference
 * within the Q8_K rounding bound of an f64 product, on rows 8 .. 128,
 * cols 256 .. 4096, n_tok 1 .. 40, a token alone against the same token
 * in a batch, a row split inside a group of 8 (after a 12-row weight).
 *
 * Its own: the wild blocks (random bytes with a sane f16 d of either
 * sign: every int8 scale and code; row 0's first block has the extremes,
 * scales -128 and codes 63).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"
#include "tests/kernels/repack_check.h"

/* Row r of a wild q6_K matrix: a sane f16 d in every block. */
static void
q6k_wild(uint8_t *row, int32_t r, int32_t cols)
{
    for (int32_t k = 0; k < cols / 256; k++) {
        uint8_t *b = row + 210 * k;
        uint16_t d =
            kn_f32_to_f16((rc_frand() > 0 ? 1 : -1) * (0.0001f + 0.001f * fabsf(rc_frand())));

        b[208] = (uint8_t)d;
        b[209] = (uint8_t)(d >> 8);
        if (k == 0 && r == 0) { /* the extreme scales and codes */
            memset(b + 192, 0x80, 16);
            memset(b, 0xFF, 192);
        }
    }
}

static void *
make_q6k(int32_t rows, int32_t cols, int wild, int outliers)
{
    return rc_make(KN_W_Q6_K, rows, cols, wild, outliers, q6k_wild);
}

static kn_weight_t
q6k_view(const void *p, int32_t rows, int32_t cols)
{
    return (kn_weight_t){KN_W_Q6_K, p, kn_wtype_row_bytes(KN_W_Q6_K, cols), rows, cols};
}

static const rc_format_t q6r8 = {
    RC_K_R8_FIELDS,
    .file = KN_W_Q6_K,
    .packed = KN_W_Q6_K_R8,
    .other = KN_W_Q4_K,
    .name = "q6_k_r8",
    .blk_bytes = 1680,
    .make = make_q6k,
    .view = q6k_view,
    .bytes = kn_q6r8_bytes,
    .repack = kn_q6r8_repack,
};

static Suite *
q6r8_suite(void)
{
    Suite *s = suite_create("kn_q6r8");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 240);
    rc_add_tests(tc, &q6r8);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(q6r8_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
