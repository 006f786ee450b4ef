/* main.c - runs the server unit suites (parsing, validation, stop strings,
 * SSE framing, error bodies, metrics formatting, allocation failure). */
#include <check.h>
#include <stdlib.h>

Suite *server_params_suite(void);
Suite *server_stop_sse_suite(void);
Suite *server_metrics_suite(void);
Suite *server_oom_suite(void);
Suite *server_toolparse_suite(void);
Suite *server_tools_suite(void);
Suite *server_admin_suite(void);
Suite *server_outq_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(server_params_suite());
    int failed;

    srunner_add_suite(sr, server_stop_sse_suite());
    srunner_add_suite(sr, server_metrics_suite());
    srunner_add_suite(sr, server_oom_suite());
    srunner_add_suite(sr, server_toolparse_suite());
    srunner_add_suite(sr, server_tools_suite());
    srunner_add_suite(sr, server_admin_suite());
    srunner_add_suite(sr, server_outq_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
