/* main.c - runs the grammar suites. */
#include <check.h>
#include <stdlib.h>

Suite *grammar_grammar_suite(void);

int
main(void)
{
    SRunner *sr = srunner_create(grammar_grammar_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
