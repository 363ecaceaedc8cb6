/* A short training run on generated data with --device cuda reaches the
 * --device cpu run's test AUC within 0.002 (the two differ only in float
 * rounding: sgemm and reduction orders). Runs the real shardrec binary.
 * Skipped (exit 77, "skipped: no GPU") where there is no GPU. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"
#include "gpu_skip.h"

#define FLAGS                                                               \
  "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1 "   \
  "--mini-batch-size 1024 --print-freq 1000"

static double run_auc(const char *dir, const char *device) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin "
                         "--plan-out plan-%s.json --device %s " FLAGS,
                   dir, bin_path(), device, device);
  ck_assert_msg(rc == 0, "--device %s: %s", device, out);
  const char *t = strstr(out, "\ntest   step");
  ck_assert_msg(t != NULL, "%s", out);
  double auc = find_num(t, "auc ");
  fprintf(stderr, "device %s: test auc %.5f\n", device, auc);
  free(out);
  return auc;
}

START_TEST(test_auc_matches_cpu) {
  char *dir = tmpdir_make("test"), *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 200000 --seed 5 "
                         "--test-fraction 0.1 --out d.tsv && %s convert "
                         "--test-fraction 0.1 d.tsv d.bin && rm d.tsv",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  double cpu = run_auc(dir, "cpu"), gpu = run_auc(dir, "cuda:0");
  ck_assert_msg(!isnan(cpu) && !isnan(gpu), "no AUC in the output");
  ck_assert_msg(fabs(cpu - gpu) <= 0.002, "AUC cuda %.5f vs cpu %.5f", gpu,
                cpu);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}
END_TEST

int main(void) {
  SR_SKIP_NO_GPU("test_cuda_train");
  Suite *s = suite_create("cuda_train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, test_auc_matches_cpu);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
