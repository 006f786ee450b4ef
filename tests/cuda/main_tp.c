/* main.c - tensor parallelism on CPU ranks (suite tp). */
#include <check.h>
#include <stdlib.h>

Suite *cuda_tp_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(cuda_tp_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
