/* Metrics against scikit-learn (tests/reference/metrics_ref.py run by
 * /usr/bin/python3, or $SHARDREC_PYTHON): AUC with many tied scores, log loss,
 * accuracy, means; equal within 1e-9. Plus small cases known by hand. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/status.h"
#include "dense/metrics.h"

static const char *python(void) {
  const char *p = getenv("SHARDREC_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

static void run_sklearn(const float *p, const float *y, size_t n, double *out) {
  const char *src = getenv("SHARDREC_SRC");
  ck_assert_msg(src != NULL, "SHARDREC_SRC not set (run through ctest)");
  char path[] = "/tmp/sr_metrics_XXXXXX", cmd[1024];
  int fd = mkstemp(path);
  ck_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  for (size_t i = 0; i < n; i++) fprintf(f, "%.17g %g\n", (double)p[i], y[i]);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s %s/tests/reference/metrics_ref.py %s", python(),
           src, path);
  FILE *pp = popen(cmd, "r");
  ck_assert(pp);
  for (int k = 0; k < 5; k++)
    ck_assert_msg(fscanf(pp, "%lf", &out[k]) == 1, "no output from %s", cmd);
  ck_assert_int_eq(pclose(pp), 0);
  unlink(path);
}

static void compare(const float *p, const float *y, size_t n) {
  dense_metrics m;
  double ref[5];
  ck_assert_int_eq(dense_metrics_compute(p, y, n, &m), 0);
  run_sklearn(p, y, n, ref);
  double got[5] = {m.auc, m.log_loss, m.accuracy, m.mean_pred, m.ctr};
  const char *names[5] = {"auc", "log_loss", "accuracy", "mean_pred", "ctr"};
  for (int k = 0; k < 5; k++)
    ck_assert_msg(fabs(got[k] - ref[k]) <= 1e-9, "%s: %.17g vs sklearn %.17g",
                  names[k], got[k], ref[k]);
  ck_assert(fabs(dense_roc_auc(p, y, n) - m.auc) == 0);
}

START_TEST(test_vs_sklearn_ties) {
  enum { N = 200000 };
  float *p = malloc(N * sizeof *p), *y = malloc(N * sizeof *y);
  sr_rng r;
  sr_rng_init(&r, 2024, 1);
  for (int i = 0; i < N; i++) {
    double u = sr_rng_uniform(&r);
    y[i] = sr_rng_uniform(&r) < 0.25 + 0.5 * u ? 1.0f : 0.0f;
    /* rounded to 2 decimals: ~100 distinct values, heavy ties, includes
     * exact 0, 0.5 and 1 (clipping and round-half-even paths) */
    p[i] = (float)(round(u * 100.0) / 100.0);
  }
  compare(p, y, N);
  free(p);
  free(y);
}
END_TEST

START_TEST(test_vs_sklearn_continuous) {
  enum { N = 50000 };
  float *p = malloc(N * sizeof *p), *y = malloc(N * sizeof *y);
  sr_rng r;
  sr_rng_init(&r, 2024, 2);
  for (int i = 0; i < N; i++) {
    double z = 2.0 * sr_rng_normal(&r);
    p[i] = (float)(1.0 / (1.0 + exp(-z)));
    y[i] = sr_rng_uniform(&r) < 1.0 / (1.0 + exp(-0.7 * z)) ? 1.0f : 0.0f;
  }
  compare(p, y, N);
  free(p);
  free(y);
}
END_TEST

START_TEST(test_by_hand) {
  float s1[4] = {0.1f, 0.4f, 0.35f, 0.8f}, y1[4] = {0, 0, 1, 1};
  ck_assert(fabs(dense_roc_auc(s1, y1, 4) - 0.75) < 1e-15);
  float s2[4] = {0.5f, 0.5f, 0.5f, 0.5f}, y2[4] = {0, 1, 0, 1};
  ck_assert(fabs(dense_roc_auc(s2, y2, 4) - 0.5) < 1e-15);
  float s3[4] = {0.9f, 0.8f, 0.2f, 0.1f}, y3[4] = {1, 1, 0, 0};
  ck_assert(dense_roc_auc(s3, y3, 4) == 1.0);
  ck_assert(dense_roc_auc(s3, y2, 4) == 0.25);
  float y4[4] = {0, 0, 1, 1};
  ck_assert(dense_roc_auc(s3, y4, 4) == 0.0);
  /* -0 and +0 are one tie group; negative scores sort below */
  float s5[4] = {-0.0f, 0.0f, -1.0f, 2.0f}, y5[4] = {1, 0, 0, 1};
  ck_assert(fabs(dense_roc_auc(s5, y5, 4) - 0.875) < 1e-15);
  /* one class only: undefined */
  float y6[4] = {1, 1, 1, 1};
  ck_assert(isnan(dense_roc_auc(s1, y6, 4)));
  dense_metrics m;
  float nanp[2] = {NAN, 0.5f}, yy[2] = {0, 1};
  ck_assert_int_eq(dense_metrics_compute(nanp, yy, 2, &m), SR_EINVAL);
  ck_assert_int_eq(dense_metrics_compute(s1, y1, 0, &m), SR_EINVAL);
  ck_assert_int_eq(dense_metrics_compute(s1, y1, 4, &m), 0);
  ck_assert(m.accuracy == 0.75 && m.ctr == 0.5 && m.positives == 2);
}
END_TEST

/* millions of scores in O(n log n): must finish well inside the timeout */
START_TEST(test_large) {
  enum { N = 4000000 };
  float *p = malloc(N * sizeof *p), *y = malloc(N * sizeof *y);
  sr_rng r;
  sr_rng_init(&r, 7, 3);
  for (int i = 0; i < N; i++) {
    p[i] = (float)sr_rng_uniform(&r);
    y[i] = (float)(sr_rng_u32(&r) & 1);
  }
  dense_metrics m;
  ck_assert_int_eq(dense_metrics_compute(p, y, N, &m), 0);
  ck_assert(fabs(m.auc - 0.5) < 0.002); /* labels independent of scores */
  free(p);
  free(y);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_metrics");
  TCase *t = tcase_create("metrics");
  tcase_set_timeout(t, 60);
  tcase_add_test(t, test_vs_sklearn_ties);
  tcase_add_test(t, test_vs_sklearn_continuous);
  tcase_add_test(t, test_by_hand);
  tcase_add_test(t, test_large);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return sr_check_run(suite());
}
