/* main.c - runs the block manager suites: unit tests of every operation
 * and error path, the randomized model-based test, and out of memory at
 * every allocation site. */
#include <check.h>
#include <stdlib.h>

Suite *blockmgr_pool_suite(void);
Suite *blockmgr_swap_suite(void);
Suite *blockmgr_random_suite(void);
Suite *blockmgr_oom_suite(void);
Suite *blockmgr_step_suite(void);
Suite *blockmgr_events_suite(void);
Suite *blockmgr_map_suite(void);
Suite *blockmgr_unreserve_suite(void);
Suite *blockmgr_memo_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(blockmgr_pool_suite());
    int failed;

    srunner_add_suite(sr, blockmgr_swap_suite());
    srunner_add_suite(sr, blockmgr_random_suite());
    srunner_add_suite(sr, blockmgr_oom_suite());
    srunner_add_suite(sr, blockmgr_step_suite());
    srunner_add_suite(sr, blockmgr_events_suite());
    srunner_add_suite(sr, blockmgr_map_suite());
    srunner_add_suite(sr, blockmgr_unreserve_suite());
    srunner_add_suite(sr, blockmgr_memo_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
