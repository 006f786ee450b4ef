/* main.c - runs the scheduler suites: policy with the fake model, and the
 * engine with the real default model. */
#include <check.h>
#include <stdlib.h>

Suite *scheduler_sched_suite(void);
Suite *scheduler_engine_suite(void);
Suite *scheduler_req_index_suite(void);
Suite *scheduler_grammar_suite(void);
Suite *scheduler_policy_suite(void);
Suite *scheduler_cost_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(scheduler_sched_suite());
    int failed;

    srunner_add_suite(sr, scheduler_engine_suite());
    srunner_add_suite(sr, scheduler_req_index_suite());
    srunner_add_suite(sr, scheduler_grammar_suite());
    srunner_add_suite(sr, scheduler_policy_suite());
    srunner_add_suite(sr, scheduler_cost_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
