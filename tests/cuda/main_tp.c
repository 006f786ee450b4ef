/* main_tp.c - tensor parallelism on CPU ranks, in the runtime and under the
 * engine (suite tp). */
#include <check.h>
#include <stdlib.h>

Suite *cuda_tp_suite(void);
Suite *cuda_tp_engine_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(cuda_tp_suite());
    int failed;

    srunner_add_suite(sr, cuda_tp_engine_suite());

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
