/* A short training run on generated data with --device cuda reaches the
 * --device cpu run's test AUC within 0.002 (the two differ only in float
 * rounding: sgemm and reduction orders), and a second --device cuda run on
 * 3 shards and 2 host threads gives the first one's bits: every metrics
 * line (loss, AUC, %.9g) the same. Runs the real shardrec binary.
 * Skipped (exit 77, "skipped: no GPU") where there is no GPU. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"
#include "tests/train/e2e_data.h"
#include "gpu_skip.h"

#define FLAGS                                                               \
  "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1 "   \
  "--mini-batch-size 1024 --print-freq 20"

/* Train as name (metrics in name.jsonl) with --device device and more
 * flags; the test AUC. */
static double run_auc(const char *dir, const char *name, const char *device,
                      const char *more) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin "
                         "--plan-out plan-%s.json --metrics-out %s.jsonl "
                         "--device %s " FLAGS " %s",
                   dir, bin_path(), name, name, device, more);
  ck_assert_msg(rc == 0, "%s: %s", name, out);
  const char *t = strstr(out, "\ntest   step");
  ck_assert_msg(t != NULL, "%s", out);
  double auc = find_num(t, "auc ");
  fprintf(stderr, "%s (--device %s %s): test auc %.5f\n", name, device, more,
          auc);
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
  double cpu = run_auc(dir, "cpu", "cpu", "");
  double gpu = run_auc(dir, "gpu", "cuda:0", "");
  ck_assert_msg(!isnan(cpu) && !isnan(gpu), "no AUC in the output");
  ck_assert_msg(fabs(cpu - gpu) <= 0.002, "AUC cuda %.5f vs cpu %.5f", gpu,
                cpu);
  double again = run_auc(dir, "gpu-again", "cuda:0",
                         "--num-shards 3 --dense-threads 2");
  ck_assert_msg(again == gpu, "AUC %.6f on 3 shards and 2 threads, %.6f before",
                again, gpu);
  char path[1024];
  snprintf(path, sizeof path, "%s/gpu.jsonl", dir);
  char *a = e2e_bits_of(path);
  snprintf(path, sizeof path, "%s/gpu-again.jsonl", dir);
  char *b = e2e_bits_of(path);
  ck_assert_uint_gt(strlen(a), 1000);
  ck_assert_msg(!strcmp(a, b), "two --device cuda runs differ:\n%.400s\n---\n%.400s", a, b);
  free(a);
  free(b);
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
