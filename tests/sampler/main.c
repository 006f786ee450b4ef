/* main.c - runs the sampler suites. */
#include <check.h>
#include <stdlib.h>

Suite *sampler_sampler_suite(void);
Suite *sampler_fast_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(sampler_sampler_suite());
    int failed;

    srunner_add_suite(sr, sampler_fast_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
