/* Quality on the synthetic set: one epoch on generated rows reaches the
 * oracle (the generator's true click probabilities) within a tolerance, on
 * the same test lines. QUALITY_ROWS (default 300000) and QUALITY_TOL
 * (default 0.02) can be set in the environment for the full-size run. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>

#include "tests/tools/run.h"

START_TEST(test_auc_near_oracle) {
  const char *rows = getenv("QUALITY_ROWS") ? getenv("QUALITY_ROWS") : "300000";
  double tol = getenv("QUALITY_TOL") ? atof(getenv("QUALITY_TOL")) : 0.02;
  char *dir = make_tmpdir(), *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows %s --seed 11 --test-fraction 0.1 --out d.tsv && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin && rm d.tsv && "
                         "%s train --processed-data-file d.bin --oracle d.tsv.summary.json "
                         "--plan-out plan.json --print-freq 1000 " SHARDREC_QUALITY_FLAGS,
                   dir, bin_path(), rows, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  /* The trainer's lines ("test   step ..." then "oracle    : auc ..."), not
   * datagen's summary, which also says "oracle". */
  const char *t = strstr(out, "\ntest   step");
  const char *o = t ? strstr(t, "\noracle ") : NULL;
  ck_assert_msg(t && o, "%s", out);
  double auc = find_num(t, "auc "), ll = find_num(t, "logloss ");
  double oauc = find_num(o, "auc "), oll = find_num(o, "logloss ");
  fprintf(stderr, "quality: %s rows: auc %.4f (oracle %.4f), logloss %.4f (oracle %.4f)\n", rows,
          auc, oauc, ll, oll);
  ck_assert_msg(oauc - auc <= tol, "AUC %.4f is more than %.3f below the oracle's %.4f", auc, tol, oauc);
  ck_assert_msg(ll - oll <= tol, "log loss %.4f is more than %.3f above the oracle's %.4f", ll, tol, oll);
  free(out);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_quality");
  TCase *tc = tcase_create("quality");
  tcase_set_timeout(tc, 1400);
  tcase_add_test(tc, test_auc_near_oracle);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
