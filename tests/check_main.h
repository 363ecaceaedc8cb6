/* The runner every Check suite's main() uses: run suite s (fork mode comes
 * from CK_FORK in ctest's environment), print Check's summary, and return the
 * process status (0 when every test passed). Takes ownership of s. */
#ifndef SHARDREC_TESTS_CHECK_MAIN_H
#define SHARDREC_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

static inline int sr_check_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
