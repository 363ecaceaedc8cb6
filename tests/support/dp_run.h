/* Helpers shared by the suites that run data-parallel `shardrec train`
 * jobs under a real mpirun and compare their per-step losses
 * (tests/mpi/test_mpi_train.c: against shard servers; tests/train/
 * test_dp_train.c: with colocated shards).
 *
 * The contract: one temporary folder per suite (dp_dir), made with its
 * data by dp_data_make in main before the cases fork and removed by
 * dp_data_remove after them; every run writes its metrics to
 * dp_dir/NAME.jsonl (--metrics-out, --print-freq 1), which dp_load reads
 * back; a suite's main is dp_suite_run. A suite passes its own model
 * shape (the ARCH flags) and the flags of its deployment (--shard-servers
 * or --colocate-shards) to these helpers; nothing here knows which one it
 * is. */
#ifndef SHARDREC_TESTS_SUPPORT_DP_RUN_H
#define SHARDREC_TESTS_SUPPORT_DP_RUN_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check_main.h"
#include "tests/support/servers.h"

#define DP_MPIRUN "mpirun --allow-run-as-root --oversubscribe"
/* The equivalence runs use Adagrad at these rates: with SGD lr 0.1 the
 * small ReLU models here are chaotic at the 1e-7 level (a unit crossing
 * its kink), so N ranks' different rounding could leave 1e-5 for reasons
 * of the data, not of the ranks' code (test_mpi_train.c says more). */
#define DP_HYPER "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1"

/* The suite's temporary folder (set by dp_data_make). */
static char *dp_dir;

/* Make dp_dir and in it d.bin (rows rows of `shardrec datagen --seed 3`,
 * a tenth of them test rows) and p.json (a plan of `shards` shards for the
 * model `arch`). Outside a test (in main, before the cases fork), so plain
 * C: Check's asserts (and run_cmd, bin_path) only work inside one. 0, or
 * -1 with the reason printed to stderr under the name `who`. */
static inline int dp_data_make(const char *who, int rows, int shards, const char *arch) {
  const char *bin = getenv("SHARDREC_BIN");
  if (!bin) {
    fprintf(stderr, "%s: SHARDREC_BIN is not set (run through ctest)\n", who);
    return -1;
  }
  dp_dir = tmpdir_new("test");
  if (!dp_dir) {
    fprintf(stderr, "%s: no temporary folder\n", who);
    return -1;
  }
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd %s && (%s datagen --rows %d --seed 3 --out d.tsv && "
           "%s convert --test-fraction 0.1 d.tsv d.bin && rm d.tsv && "
           "%s train --processed-data-file d.bin --num-batches 1 --num-shards %d %s"
           " --plan-out p.json) > prep.log 2>&1 || (cat prep.log >&2; exit 1)",
           dp_dir, bin, rows, bin, bin, shards, arch);
  if (system(cmd) != 0) {
    fprintf(stderr, "%s: data preparation in %s failed (above)\n", who, dp_dir);
    return -1;
  }
  return 0;
}

/* Remove dp_dir and all in it (nothing if it was never made). */
static inline void dp_data_remove(void) {
  if (!dp_dir) return;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dp_dir);
  free(dp_dir);
  dp_dir = NULL;
}

/* Inside a test: big.bin in dp_dir, 300000 rows of `datagen --seed 5`
 * (270000 train rows, 30000 test rows), and a plan of `shards` shards for
 * `arch` in plan_out. Fails the test if any step fails. */
static inline void dp_make_big(int shards, const char *arch, const char *plan_out) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 300000 --seed 5 --out big.tsv && "
                         "%s convert --test-fraction 0.1 big.tsv big.bin && rm big.tsv && "
                         "%s train --processed-data-file big.bin --num-batches 1 --num-shards %d "
                         "%s --plan-out %s",
                   dp_dir, bin_path(), bin_path(), bin_path(), shards, arch, plan_out);
  ck_assert_msg(rc == 0, "300k-row data: exit %d:\n%s", rc, out);
  free(out);
}

/* Run `shardrec train` in dp_dir on data with plan, under mpirun -np np
 * (np 0: one rank, no mpirun), --print-freq 1 and metrics in name.jsonl,
 * then args (the model, the deployment and the case's flags). Prints
 * "<who>: <name> (<N> rank(s)<what>): <secs> s". The exit status; the
 * output in *out (NULL: dropped). */
static inline int dp_train(const char *who, const char *what, const char *name, int np,
                           const char *data, const char *plan, const char *args, char **out) {
  char launch[128] = "";
  if (np > 0) snprintf(launch, sizeof launch, DP_MPIRUN " -np %d", np);
  double t0 = test_now();
  char *o;
  int rc = run_cmd(&o, "cd %s && %s %s train --processed-data-file %s --plan %s"
                       " --print-freq 1 --metrics-out %s.jsonl %s",
                   dp_dir, launch, bin_path(), data, plan, name, args);
  printf("%s: %s (%d rank(s)%s): %.1f s\n", who, name, np ? np : 1, what, test_now() - t0);
  fflush(stdout);
  if (out) *out = o;
  else free(o);
  return rc;
}

/* A run's metrics: per-step last_loss (value, and text for bit-for-bit
 * comparisons) and the last test AUC (value and text). */
typedef struct {
  int n;
  int64_t step[4096];
  double loss[4096];
  char text[4096][32];
  double auc;
  char auc_text[40];
} dp_metrics;

/* Read dp_dir/name.jsonl into *m (the first 4096 train lines); fails the
 * test if the file is missing. auc is NAN if no test line was written. */
static inline void dp_load(const char *name, dp_metrics *m) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s.jsonl", dp_dir, name);
  char *s = slurp(path);
  ck_assert_msg(s != NULL, "no %s", path);
  memset(m, 0, sizeof *m);
  m->auc = NAN;
  for (char *l = strtok(s, "\n"); l; l = strtok(NULL, "\n")) {
    if (strstr(l, "\"kind\":\"train\"") && m->n < 4096) {
      m->step[m->n] = (int64_t)find_num(l, "\"step\":");
      m->loss[m->n] = find_num(l, "\"last_loss\":");
      const char *p = strstr(l, "\"last_loss\":") + 12;
      snprintf(m->text[m->n], sizeof m->text[0], "%.*s", (int)strcspn(p, ","), p);
      m->n++;
    } else if (strstr(l, "\"kind\":\"test\"")) {
      m->auc = find_num(l, "\"auc\":");
      const char *p = strstr(l, "\"auc\":") + 6;
      snprintf(m->auc_text, sizeof m->auc_text, "%.*s", (int)strcspn(p, ","), p);
    }
  }
  free(s);
}

/* Largest relative difference of the losses of a and b; fails the test
 * unless both have the same steps. */
static inline double dp_max_rel(const dp_metrics *a, const dp_metrics *b) {
  ck_assert_int_eq(a->n, b->n);
  double mx = 0;
  for (int i = 0; i < a->n; i++) {
    ck_assert_int_eq(a->step[i], b->step[i]);
    double d = fabs(a->loss[i] - b->loss[i]) / fabs(a->loss[i]);
    if (d > mx) mx = d;
  }
  return mx;
}

/* Two runs with the same bits: every step and loss text, and the AUC text. */
static inline void dp_assert_same_bits(const char *what, const dp_metrics *a, const dp_metrics *b) {
  ck_assert_int_eq(a->n, b->n);
  for (int i = 0; i < a->n; i++) {
    ck_assert_int_eq(a->step[i], b->step[i]);
    ck_assert_msg(!strcmp(a->text[i], b->text[i]), "%s: differ at step %lld: %s vs %s", what,
                  (long long)a->step[i], a->text[i], b->text[i]);
  }
  ck_assert_str_eq(a->auc_text, b->auc_text);
}

/* A run resumed at step `at` (res) against the uninterrupted one (full)
 * of `total` steps: full has total steps, res the last total - at, and
 * res's steps, losses and test AUC are full's after step `at`, bit for bit. */
static inline void dp_assert_resumed(const char *what, const dp_metrics *full,
                                     const dp_metrics *res, int at, int total) {
  ck_assert_int_eq(full->n, total);
  ck_assert_int_eq(res->n, total - at);
  for (int i = 0; i < res->n; i++) {
    ck_assert_int_eq(res->step[i], full->step[at + i]);
    ck_assert_msg(!strcmp(res->text[i], full->text[at + i]),
                  "%s: step %lld: resumed %s, uninterrupted %s", what, (long long)res->step[i],
                  res->text[i], full->text[at + i]);
  }
  ck_assert_str_eq(res->auc_text, full->auc_text);
}

/* A suite's train: run `name` with np ranks (0: one rank, no mpirun) on
 * data and plan with the case's flags extra, in the suite's deployment;
 * the exit status, the output in *out (NULL: dropped). */
typedef int (*dp_train_fn)(const char *name, int np, const char *data, const char *plan,
                           const char *extra, char **out);

/* The equivalence runs on d.bin and p.json with extra: one rank (r1),
 * -np 2 twice (r2, r2b), -np 4 (r4), each must exit 0, and r2 must say
 * that it ran 2 ranks under mpirun and its per-step rates over them. Their
 * metrics go to *r1, *r2, *r2b, *r4. Asserts that r1 ran `steps` steps,
 * that -np 2 and -np 4 are within 1e-5 relative of one rank at every step
 * (the largest differences in *d2, *d4) with test AUC within 1e-3, and
 * that r2 and r2b have the same bits (every loss, the AUC). Prints
 * "<who>: <steps> steps<what>: ..." with the figures. The outputs of r1
 * and r2 in *out_r1 and *out_r2, for the suite's own checks (it frees
 * them). */
static inline void dp_equal_runs(dp_train_fn train, const char *who, const char *what,
                                 const char *extra, int steps, dp_metrics *r1, dp_metrics *r2,
                                 dp_metrics *r2b, dp_metrics *r4, double *d2, double *d4,
                                 char **out_r1, char **out_r2) {
  char *out;
  ck_assert_msg(train("r1", 0, "d.bin", "p.json", extra, out_r1) == 0, "%s", *out_r1);
  ck_assert_msg(train("r2", 2, "d.bin", "p.json", extra, out_r2) == 0, "%s", *out_r2);
  ck_assert_msg(strstr(*out_r2, "ranks  2 rank(s) (mpirun)") &&
                    strstr(*out_r2, "samples/s over 2 rank(s); per step: dense compute "),
                "%s", *out_r2);
  ck_assert_msg(train("r2b", 2, "d.bin", "p.json", extra, &out) == 0, "%s", out);
  free(out);
  ck_assert_msg(train("r4", 4, "d.bin", "p.json", extra, &out) == 0, "%s", out);
  free(out);
  dp_load("r1", r1);
  dp_load("r2", r2);
  dp_load("r2b", r2b);
  dp_load("r4", r4);
  ck_assert_int_eq(r1->n, steps);
  *d2 = dp_max_rel(r1, r2);
  *d4 = dp_max_rel(r1, r4);
  printf("%s: %d steps%s: max relative loss difference np2 %.3g, np4 %.3g; test auc 1 rank "
         "%.6f, np2 %.6f, np4 %.6f\n", who, steps, what, *d2, *d4, r1->auc, r2->auc, r4->auc);
  ck_assert_msg(*d2 < 1e-5, "np2: relative loss difference %g", *d2);
  ck_assert_msg(*d4 < 1e-5, "np4: relative loss difference %g", *d4);
  ck_assert_msg(fabs(r1->auc - r2->auc) < 1e-3 && fabs(r1->auc - r4->auc) < 1e-3,
                "auc 1 rank %g, np2 %g, np4 %g", r1->auc, r2->auc, r4->auc);
  /* The same N twice: the same bits. */
  dp_assert_same_bits("np2 reruns", r2, r2b);
}

/* A case of a suite: its name (CK_RUN_CASE=name runs it alone) and test. */
typedef struct {
  const char *name;
  const TTest *test;
} dp_case;

/* All of main: a suite `suite` of the n cases, one case a test with a
 * timeout of 300 s; make the data (dp_data_make with who, rows, shards,
 * arch), run the suite, remove the data. The process's exit status (1 if
 * the data could not be made: the suite is then not run, exit frees it). */
static inline int dp_suite_run(const char *suite, const dp_case *cases, int n, const char *who,
                               int rows, int shards, const char *arch) {
  Suite *s = suite_create(suite);
  for (int i = 0; i < n; i++) {
    TCase *tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, cases[i].test);
    suite_add_tcase(s, tc);
  }
  if (dp_data_make(who, rows, shards, arch)) {
    dp_data_remove();
    return 1;
  }
  int rc = sr_check_run(s);
  dp_data_remove();
  return rc;
}

#endif
