/* test_kn_peak.c - the compute-roofline probe (kernels/cpu/kn_peak.h), the
 * yardstick `kvserve bench-forward` prints batched decode against.
 *
 * Its figures are timings, so nothing here bounds them tightly: the test
 * checks the contract instead. Every op runs (no SIGILL) at every level
 * this CPU has, forced as the kernels are; an op is reported (> 0) exactly
 * where the kernels have that instruction (bf16 dp only with AVX512-BF16,
 * int8 products from AVX2 up, f32 FMAs everywhere); a level above the
 * CPU's and an unknown op give 0. The rate must lie between 1e6 and 1e14
 * operations per second, which any real core meets and a runner that
 * miscounts its work (or is optimized away to nothing) does not.
 */
#include <check.h>
#include <stdlib.h>

#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_peak.h"

/* Whether level isa has op's instruction (the header's contract). */
static int
has_op(kn_peak_op_t op, kn_isa_t isa)
{
    switch (op) {
    case KN_PEAK_F32_FMA:
        return 1;
    case KN_PEAK_BF16_DP:
        return isa == KN_ISA_AVX512_VNNI;
    case KN_PEAK_INT8_DP:
        return isa >= KN_ISA_AVX2;
    default:
        return 0;
    }
}

START_TEST(test_peak_levels)
{
    kn_cpu_init(1);
    kn_isa_t best = kn_cpu_isa_best();

    for (int isa = KN_ISA_GENERIC; isa <= KN_ISA_AVX512_VNNI; isa++) {
        for (int op = 0; op < KN_PEAK_NOPS; op++) {
            double r = kn_peak_ops((kn_peak_op_t)op, (kn_isa_t)isa, 0.01);

            if (isa > (int)best || !has_op((kn_peak_op_t)op, (kn_isa_t)isa)) {
                ck_assert_msg(r == 0.0, "%s at %s: %g, want 0", kn_peak_name((kn_peak_op_t)op),
                              kn_isa_name((kn_isa_t)isa), r);
            } else {
                ck_assert_msg(r > 1e6 && r < 1e14, "%s at %s: %g op/s",
                              kn_peak_name((kn_peak_op_t)op), kn_isa_name((kn_isa_t)isa), r);
            }
        }
    }
    ck_assert(kn_peak_ops(KN_PEAK_NOPS, KN_ISA_GENERIC, 0.01) == 0.0);
    ck_assert(kn_peak_ops(KN_PEAK_F32_FMA, (kn_isa_t)99, 0.01) == 0.0);
    ck_assert_str_eq(kn_peak_name(KN_PEAK_BF16_DP), "bf16 dp");
    ck_assert_str_eq(kn_peak_name(KN_PEAK_NOPS), "?");
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("kn_peak");
    TCase *tc = tcase_create("peak");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_peak_levels);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
