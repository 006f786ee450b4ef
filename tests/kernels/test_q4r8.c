/* test_q4r8.c - q4_K weights repacked 8 rows at a time (KN_W_Q4_K_R8,
 * kernels/cpu/kn_quant.h), through the checks every interleaved type
 * shares (repack_check.c): the repack round trip and the embedding lookup
 * through it, the shapes it refuses, and the product at every ISA level x
 * 1 and 2 threads bit for bit against the scalar reference, the reference
 * within the Q8_K rounding bound of an f64 product, on rows 8 .. 128,
 * cols 256 .. 4096, n_tok 1 .. 40, a token alone against the same token
 * in a batch, a row split inside a group of 8 (after a 12-row weight).
 *
 * Its own: the wild blocks (random bytes with sane f16 d / dmin: every
 * 6-bit scale and min and code).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"
#include "tests/kernels/repack_check.h"

/* Row r of a wild q4_K matrix: sane f16 d and dmin in every block. */
static void
q4k_wild(uint8_t *row, int32_t r, int32_t cols)
{
    (void)r;
    for (int32_t k = 0; k < cols / 256; k++) {
        uint8_t *b = row + 144 * k;
        uint16_t d = kn_f32_to_f16(0.001f + 0.01f * fabsf(rc_frand()));
        uint16_t m = kn_f32_to_f16(0.001f + 0.01f * fabsf(rc_frand()));

        b[0] = (uint8_t)d;
        b[1] = (uint8_t)(d >> 8);
        b[2] = (uint8_t)m;
        b[3] = (uint8_t)(m >> 8);
    }
}

static void *
make_q4k(int32_t rows, int32_t cols, int wild, int outliers)
{
    return rc_make(KN_W_Q4_K, rows, cols, wild, outliers, q4k_wild);
}

static kn_weight_t
q4k_view(const void *p, int32_t rows, int32_t cols)
{
    return (kn_weight_t){KN_W_Q4_K, p, kn_wtype_row_bytes(KN_W_Q4_K, cols), rows, cols};
}

static const rc_format_t q4r8 = {
    RC_K_R8_FIELDS,
    .file = KN_W_Q4_K,
    .packed = KN_W_Q4_K_R8,
    .other = KN_W_Q6_K,
    .name = "q4_k_r8",
    .blk_bytes = 1152,
    .make = make_q4k,
    .view = q4k_view,
    .bytes = kn_q4r8_bytes,
    .repack = kn_q4r8_repack,
};

static Suite *
q4r8_suite(void)
{
    Suite *s = suite_create("kn_q4r8");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 240);
    rc_add_tests(tc, &q4r8);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(q4r8_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
