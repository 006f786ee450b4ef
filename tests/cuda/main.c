/* main.c - the emulated CUDA kernel suite (runs on CPU, suite cuda-emu). */
#include <check.h>
#include <stdlib.h>

Suite *cuda_emu_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(cuda_emu_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
