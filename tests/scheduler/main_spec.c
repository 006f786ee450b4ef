/* main_spec.c - runs the speculative decoding suite (test_spec.c). */
#include <check.h>
#include <stdlib.h>

Suite *scheduler_spec_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(scheduler_spec_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
