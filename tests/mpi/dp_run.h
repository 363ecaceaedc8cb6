/* Helpers shared by the suites that run data-parallel `shardrec train`
 * jobs under a real mpirun and compare their per-step losses
 * (tests/mpi/test_mpi_train.c: against shard servers; tests/dp/
 * test_dp_train.c: with colocated shards).
 *
 * The contract: one temporary folder per suite (dp_dir), made with its
 * data by dp_data_make in main before the cases fork and removed by
 * dp_data_remove after them; every run writes its metrics to
 * dp_dir/NAME.jsonl (--metrics-out, --print-freq 1), which dp_load reads
 * back. A suite passes its own model shape (the ARCH flags) and the flags
 * of its deployment (--shard-servers or --colocate-shards) to these
 * helpers; nothing here knows which one it is. */
#ifndef SHARDREC_TESTS_MPI_DP_RUN_H
#define SHARDREC_TESTS_MPI_DP_RUN_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/rpc/server.h"

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
  dp_dir = strdup("/tmp/shardrec-test-XXXXXX");
  if (!dp_dir || !mkdtemp(dp_dir)) {
    fprintf(stderr, "%s: no temporary folder\n", who);
    free(dp_dir);
    dp_dir = NULL;
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

#endif
