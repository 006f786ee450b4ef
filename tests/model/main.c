/* main.c - runs the model forward suites. */
#include <check.h>
#include <stdlib.h>

Suite *model_forward_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(model_forward_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
