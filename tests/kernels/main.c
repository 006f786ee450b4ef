/* main.c - runs the CPU kernel suites (fast paths against the naive
 * references) and the residual-slot bookkeeping's. */
#include <check.h>
#include <stdlib.h>

Suite *kernels_cpu_suite(void);
Suite *kernels_kv_slots_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(kernels_cpu_suite());
    int failed;

    srunner_add_suite(sr, kernels_kv_slots_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
