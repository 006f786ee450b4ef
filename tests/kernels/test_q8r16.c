/* test_q8r16.c - q8_0 weights repacked 16 rows at a time (KN_W_Q8_0_R16,
 * kernels/cpu/kn_quant.h), through the checks every interleaved type
 * shares (repack_check.c): the repack round trip and the embedding lookup
 * through it, the shapes it refuses (48 columns too), and the product at
 * every ISA level x 1 and 2 threads bit for bit against the scalar
 * reference, the reference within the Q8_0 rounding bound of an f64
 * product, on rows 16 .. 128, cols 32 .. 8192 (odd multiples of 32 too),
 * n_tok 1 .. 40, a token alone against the same token in a batch, a row
 * split inside a group of 16 (after a 24-row weight).
 *
 * Its own: the wild blocks (random codes, -128 included, with sane f16
 * scales), the repacked rows the size of the file's, and every tile
 * width 1 .. 8 after a whole tile.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kn_quant.h"
#include "kernels/cpu/kv_quant.h"
#include "tests/kernels/repack_check.h"

/* Row r of a wild q8_0 matrix: sane f16 scales, a -128 in every fifth block. */
static void
q8_wild(uint8_t *row, int32_t r, int32_t cols)
{
    (void)r;
    for (int32_t b = 0; b < cols / 32; b++) {
        uint8_t *q = row + 34 * b;
        uint16_t d = kn_f32_to_f16(0.001f + 0.01f * fabsf(rc_frand()));

        q[0] = (uint8_t)d;
        q[1] = (uint8_t)(d >> 8);
        if (b % 5 == 0) {
            q[2 + rc_urand() % 32] = 0x80; /* -128: |q| = 128 in the sign path */
        }
    }
}

static void *
make_q8(int32_t rows, int32_t cols, int wild, int outliers)
{
    return rc_make(KN_W_Q8_0, rows, cols, wild, outliers, q8_wild);
}

static kn_weight_t
q8_view(const void *p, int32_t rows, int32_t cols)
{
    return (kn_weight_t){KN_W_Q8_0, p, kn_wtype_row_bytes(KN_W_Q8_0, cols), rows, cols};
}

static const rc_format_t q8r16 = {
    .file = KN_W_Q8_0,
    .packed = KN_W_Q8_0_R16,
    .other = KN_W_Q4_0,
    .name = "q8_0_r16",
    .group = 16,
    .blk_cols = 32,
    .blk_bytes = 544,
    .act = RC_ACT_Q8_0,
    .make = make_q8,
    .view = q8_view,
    .bytes = kn_q8r16_bytes,
    .repack = kn_q8r16_repack,
    .roundtrip = {{16, 32}, {48, 576}, {16, 1312}, {32, 4096}},
    .embed_tok = 17,
    .levels = {{16, 32}, {48, 224}, {16, 576}, {80, 2080}},
    .wide_cols = 8192,
    .wide_tok = 7,
};

/* The repacked form takes the file's bytes, row for row. */
START_TEST(test_repack_size)
{
    for (int s = 0; s < 4; s++) {
        int32_t rows = q8r16.roundtrip[s][0], cols = q8r16.roundtrip[s][1];

        ck_assert_uint_eq(kn_q8r16_bytes(rows, cols), (size_t)rows * cols / 32 * 34);
        ck_assert_uint_eq(kn_wtype_row_bytes(KN_W_Q8_0_R16, cols),
                          kn_wtype_row_bytes(KN_W_Q8_0, cols));
    }
}
END_TEST

/* Every tile width 1 .. 8 after a whole tile of 8 tokens. */
START_TEST(test_product_tiles)
{
    for (int32_t n = 9; n <= 16; n++) {
        rc_check_product(&q8r16, 48, 96, n, (int)n % 2, 1, (int)n % 4);
    }
}
END_TEST

static Suite *
q8r16_suite(void)
{
    Suite *s = suite_create("kn_q8r16");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 240);
    rc_add_tests(tc, &q8r16);
    tcase_add_test(tc, test_repack_size);
    tcase_add_test(tc, test_product_tiles);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    SRunner *sr = srunner_create(q8r16_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
