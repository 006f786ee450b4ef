/* main.c - runs the tokenizer suites (STYLE.md 2.9). */
#include <check.h>
#include <stdlib.h>

#include "tests/tokenizer/tok_test.h"

int
main(void)
{
    SRunner *sr = srunner_create(tokenizer_vocab_suite());
    int failed;

    srunner_add_suite(sr, tokenizer_hf_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
