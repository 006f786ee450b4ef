/* main.c - the emulated CUDA kernels and the CUDA backend's forward pass on
 * emulated device operations, speculative decoding and H2O / SnapKV on it
 * (run on CPU, suite cuda-emu). */
#include <check.h>
#include <stdlib.h>

Suite *cuda_emu_suite(void);
Suite *cuda_devemu_suite(void);
Suite *cuda_emu_tq_suite(void);
Suite *cuda_spec_emu_suite(void);
Suite *cuda_mass_emu_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(cuda_emu_suite());
    int failed;

    srunner_add_suite(sr, cuda_devemu_suite());
    srunner_add_suite(sr, cuda_emu_tq_suite());
    srunner_add_suite(sr, cuda_spec_emu_suite());
    srunner_add_suite(sr, cuda_mass_emu_suite());

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
