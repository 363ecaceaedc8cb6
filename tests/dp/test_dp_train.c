/* Data-parallel training with colocated shards: one `mpirun -np N shardrec
 * train --colocate-shards` starts the whole job, the plan's 3 shards hosted
 * in the ranks' own processes (shard k on rank k % N). The one-rank
 * reference runs without mpirun, its shards in process (the embedded
 * default), with the same plan and global batch.
 *   - equal: -np 2 and -np 4 (rank 3 hosts no shard) give per-step losses
 *     within 1e-5 relative of one rank over the first 100 steps, not the
 *     same bits (the ranks' sums are grouped differently); two -np 2 runs
 *     are bit-identical;
 *   - epoch: a full epoch of 300k rows (batch 1024): test AUC at -np 2 and
 *     -np 4 within 1e-3 of one rank; async mode (--max-staleness 2) at -np 2
 *     within 0.005 of sync -np 2;
 *   - resume: a -np 2 run checkpointed at step 30 (each colocated shard
 *     writes its part, shards/shard-K) and resumed with -np 2 gives the
 *     uninterrupted run's losses after step 30 and its test AUC bit for
 *     bit, with rows in memory and with rows in RocksDB (--data-dir);
 *   - death: a rank killed mid-job stops the whole job, naming it;
 *   - bench: `shardrec bench dp` on a small set prints its table. */
#include <check.h>
#include <math.h>
#include <sys/stat.h>

#include "tests/check_main.h"
#include "tests/rpc/server.h"

static char *dir;

#define ARCH "--arch-mlp-bot 13-64-16 --arch-mlp-top 64-1"
#define HYPER "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1"
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe"

/* 20000 rows: 18000 train, 2000 test; a 3-shard plan p.json. Made once in
 * main, before the cases fork: every case reads it and writes files of its
 * own names beside it. 0, or -1 with the reason printed. */
static int data_make(void) {
  /* Outside a test: no ck_assert here (run_cmd, bin_path use it). */
  const char *bin = getenv("SHARDREC_BIN");
  if (!bin) {
    fprintf(stderr, "SHARDREC_BIN is not set (run through ctest)\n");
    return -1;
  }
  dir = strdup("/tmp/shardrec-test-XXXXXX");
  if (!dir || !mkdtemp(dir)) {
    perror("mkdtemp");
    return -1;
  }
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd %s && (%s datagen --rows 20000 --seed 3 --out d.tsv && "
           "%s convert --test-fraction 0.1 d.tsv d.bin && rm d.tsv && "
           "%s train --processed-data-file d.bin --num-batches 1 --num-shards 3 " ARCH
           " --plan-out p.json) > prep.log 2>&1 || (cat prep.log >&2; exit 1)",
           dir, bin, bin, bin);
  if (system(cmd) != 0) {
    fprintf(stderr, "data preparation in %s failed (above)\n", dir);
    return -1;
  }
  return 0;
}

static void data_remove(void) {
  if (dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  free(dir);
}

/* Train with np ranks and colocated shards (np 0: one rank, no mpirun,
 * shards in process); metrics in name.jsonl; the exit status, the output
 * in *out (may be NULL). */
static int train(const char *name, int np, const char *data, const char *plan, const char *extra,
                 char **out) {
  char launch[128] = "";
  if (np > 0) snprintf(launch, sizeof launch, MPIRUN " -np %d", np);
  double t0 = test_now();
  char *o;
  int rc = run_cmd(&o, "cd %s && %s %s train --processed-data-file %s --plan %s " ARCH " " HYPER
                       " --print-freq 1 --metrics-out %s.jsonl %s %s",
                   dir, launch, bin_path(), data, plan, name, np > 0 ? "--colocate-shards" : "",
                   extra);
  printf("dp_train: %s (%d rank(s)%s): %.1f s\n", name, np ? np : 1,
         np ? ", colocated shards" : ", shards in process", test_now() - t0);
  fflush(stdout);
  if (rc == 0 && np > 0) {
    char want[64];
    snprintf(want, sizeof want, "shards 3 shard(s) colocated with %d rank(s): 127.0.0.1:", np);
    ck_assert_msg(strstr(o, want), "no '%s' in:\n%s", want, o);
  }
  if (out) *out = o;
  else free(o);
  return rc;
}

/* A run's metrics: per-step last_loss (value and text) and the last test AUC. */
typedef struct {
  int n;
  int64_t step[4096];
  double loss[4096];
  char text[4096][32];
  double auc;
  char auc_text[40];
} metrics;

static void load(const char *name, metrics *m) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
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

/* Largest relative difference of the losses of a and b (same steps). */
static double max_rel(const metrics *a, const metrics *b) {
  ck_assert_int_eq(a->n, b->n);
  double mx = 0;
  for (int i = 0; i < a->n; i++) {
    ck_assert_int_eq(a->step[i], b->step[i]);
    double d = fabs(a->loss[i] - b->loss[i]) / fabs(a->loss[i]);
    if (d > mx) mx = d;
  }
  return mx;
}

static metrics ma, mb, mc, md;

START_TEST(test_colocated_equal_one_rank) {
  char *out;
  const char *ex = "--mini-batch-size 128 --num-batches 100";
  ck_assert_msg(train("r1", 0, "d.bin", "p.json", ex, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "3 shard(s) in process"), "%s", out);
  free(out);
  ck_assert_msg(train("r2", 2, "d.bin", "p.json", ex, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "ranks  2 rank(s) (mpirun)") &&
                    strstr(out, "samples/s over 2 rank(s); per step: dense compute "),
                "%s", out);
  free(out);
  ck_assert_msg(train("r2b", 2, "d.bin", "p.json", ex, &out) == 0, "%s", out);
  free(out);
  ck_assert_msg(train("r4", 4, "d.bin", "p.json", ex, &out) == 0, "%s", out);
  free(out);
  load("r1", &ma);
  load("r2", &mb);
  load("r2b", &mc);
  load("r4", &md);
  ck_assert_int_eq(ma.n, 100);
  double d2 = max_rel(&ma, &mb), d4 = max_rel(&ma, &md);
  printf("dp_train: 100 steps, colocated: max relative loss difference np2 %.3g, np4 %.3g; "
         "test auc 1 rank %.6f, np2 %.6f, np4 %.6f\n", d2, d4, ma.auc, mb.auc, md.auc);
  ck_assert_msg(d2 < 1e-5, "np2: relative loss difference %g", d2);
  ck_assert_msg(d4 < 1e-5, "np4: relative loss difference %g", d4);
  /* Not one rank's bits: the ranks' parts were really summed. */
  ck_assert_msg(d2 > 0 && d4 > 0, "N ranks gave one rank's bits exactly (np2 %g, np4 %g)", d2, d4);
  ck_assert_msg(fabs(ma.auc - mb.auc) < 1e-3 && fabs(ma.auc - md.auc) < 1e-3,
                "auc 1 rank %g, np2 %g, np4 %g", ma.auc, mb.auc, md.auc);
  /* The same N twice: the same bits. */
  ck_assert_int_eq(mb.n, mc.n);
  for (int i = 0; i < mb.n; i++)
    ck_assert_msg(!strcmp(mb.text[i], mc.text[i]), "np2 reruns differ at step %lld: %s vs %s",
                  (long long)mb.step[i], mb.text[i], mc.text[i]);
  ck_assert_str_eq(mb.auc_text, mc.auc_text);
}
END_TEST

START_TEST(test_colocated_epoch_300k_and_async) {
  char *out;
  /* 270000 train rows: 263 full batches of 1024 and one of 688. */
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 300000 --seed 5 --out big.tsv && "
                         "%s convert --test-fraction 0.1 big.tsv big.bin && rm big.tsv && "
                         "%s train --processed-data-file big.bin --num-batches 1 --num-shards 3 "
                         ARCH " --plan-out pbig.json",
                   dir, bin_path(), bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  const char *ex = "--mini-batch-size 1024 --test-mini-batch-size 1000";
  ck_assert_msg(train("e1", 0, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  free(out);
  ck_assert_msg(train("e2", 2, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "mode   sync"), "%s", out);
  free(out);
  ck_assert_msg(train("e4", 4, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  free(out);
  char aex[300];
  snprintf(aex, sizeof aex, "%s --sparse-mode async --max-staleness 2", ex);
  ck_assert_msg(train("a2", 2, "big.bin", "pbig.json", aex, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "mode   async") && strstr(out, "max staleness 2 step(s)"), "%s", out);
  free(out);
  load("e1", &ma);
  load("e2", &mb);
  load("e4", &md);
  load("a2", &mc);
  ck_assert_int_eq(ma.n, 264);
  ck_assert_int_eq(mb.n, 264);
  ck_assert_int_eq(mc.n, 264);
  printf("dp_train: 300k rows, one epoch, colocated: test auc 1 rank %.6f, np2 %.6f (%+.2g), "
         "np4 %.6f (%+.2g); async np2 %.6f vs sync np2 %.6f (%+.2g)\n",
         ma.auc, mb.auc, mb.auc - ma.auc, md.auc, md.auc - ma.auc, mc.auc, mb.auc,
         mc.auc - mb.auc);
  ck_assert_msg(ma.auc > 0.7, "one rank did not learn (auc %g)", ma.auc);
  ck_assert_msg(fabs(mb.auc - ma.auc) < 1e-3, "np2 auc %g vs one rank %g", mb.auc, ma.auc);
  ck_assert_msg(fabs(md.auc - ma.auc) < 1e-3, "np4 auc %g vs one rank %g", md.auc, ma.auc);
  ck_assert_msg(fabs(mc.auc - mb.auc) < 0.005, "async np2 auc %g vs sync np2 %g", mc.auc, mb.auc);
}
END_TEST

/* Checkpoint at step 30 of a 60-step -np 2 run, resume from it with -np 2
 * (fresh colocated shards restored from the checkpoint); rows in memory or
 * (rocks) in RocksDB under a data dir, a fresh one for the resumed run. */
static void resume_case(const char *tag, int rocks) {
  char *out, full[900], res[900], name_full[64], name_res[64], dd[600] = "";
  snprintf(name_full, sizeof name_full, "%s_full", tag);
  snprintf(name_res, sizeof name_res, "%s_res", tag);
  if (rocks) snprintf(dd, sizeof dd, "--data-dir %s/%s.rows1 --cache-rows 4096", dir, tag);
  snprintf(full, sizeof full, "--mini-batch-size 128 --num-batches 60 --save-checkpoint %s/%s.ck "
           "--checkpoint-every 30 %s", dir, tag, dd);
  ck_assert_msg(train(name_full, 2, "d.bin", "p.json", full, &out) == 0, "%s", out);
  free(out);
  /* Every colocated shard wrote its part of the step-30 checkpoint. */
  for (int k = 0; k < 3; k++) {
    char p[900];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s.ck/step-30/shards/shard-%d", dir, tag, k);
    ck_assert_msg(stat(p, &st) == 0, "no %s", p);
  }
  if (rocks) snprintf(dd, sizeof dd, "--data-dir %s/%s.rows2 --cache-rows 4096", dir, tag);
  snprintf(res, sizeof res, "--mini-batch-size 128 --num-batches 60 --resume %s/%s.ck/step-30 %s",
           dir, tag, dd);
  ck_assert_msg(train(name_res, 2, "d.bin", "p.json", res, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "resume ") && strstr(out, "step 30"), "%s", out);
  free(out);
  load(name_full, &ma);
  load(name_res, &mb);
  ck_assert_int_eq(ma.n, 60);
  ck_assert_int_eq(mb.n, 30);
  for (int i = 0; i < 30; i++) {
    ck_assert_int_eq(mb.step[i], ma.step[30 + i]);
    ck_assert_msg(!strcmp(mb.text[i], ma.text[30 + i]), "%s: step %lld: resumed %s, uninterrupted %s",
                  tag, (long long)mb.step[i], mb.text[i], ma.text[30 + i]);
  }
  ck_assert_str_eq(mb.auc_text, ma.auc_text);
  printf("dp_train: resume (%s): steps 31-60 and test auc %s bit-identical to the uninterrupted "
         "run\n", rocks ? "RocksDB" : "memory", ma.auc_text);
}

START_TEST(test_colocated_checkpoint_resume_np2) {
  resume_case("mem", 0);
  resume_case("rocks", 1);
}
END_TEST

/* A rank that dies (SHARDREC_TEST_DIE kills rank 1 at step 20) takes its
 * colocated shards with it: the whole job stops, soon, non-zero, and the
 * output names the dead rank; nothing hangs on the dead rank's shards. */
START_TEST(test_colocated_rank_death) {
  char *out;
  double t0 = test_now();
  int rc = run_cmd(&out, "cd %s && SHARDREC_TEST_DIE=1:20 " MPIRUN " -x SHARDREC_TEST_DIE -np 2 "
                         "%s train --processed-data-file d.bin --plan p.json " ARCH " " HYPER
                         " --mini-batch-size 128 --num-batches 100 --print-freq 10 "
                         "--colocate-shards",
                   dir, bin_path());
  double secs = test_now() - t0;
  printf("dp_train: rank 1 killed at step 20: exit %d after %.1f s\n", rc, secs);
  ck_assert_msg(rc != 0, "the job went on without rank 1:\n%s", out);
  ck_assert_msg(secs < 60, "the job took %.0f s to stop", secs);
  ck_assert_msg(strstr(out, "rank 1"), "the output does not name rank 1:\n%s", out);
  ck_assert_msg(strstr(out, "step 10/100") && !strstr(out, "step 30/100"),
                "not stopped at step 20:\n%s", out);
  free(out);
}
END_TEST

/* bench dp end to end on a small set: its table has a row per rank count with figures read from the runs (one rank's ratio 1.00, positive
 * rates, no all-reduce time at one rank); a batch the ranks do not divide
 * is refused. */
START_TEST(test_bench_dp_small) {
  char *out;
  int rc = run_cmd(&out, "%s bench dp --rows 6000 --batch 256 --steps 4 --runs 1 --ranks 1,2 "
                         "--modes async --shards 3 --arch-mlp-bot 13-16 --arch-mlp-top 16-1",
                   bin_path());
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "core(s) on this machine") && strstr(out, "not scaling"), "%s", out);
  /* One mode (async, the one with prefetch) to keep the suite short. */
  const char *want[2] = {"\nasync      1 ", "\nasync      2 "};
  for (int i = 0; i < 2; i++) {
    const char *l = strstr(out, want[i]);
    ck_assert_msg(l, "no row '%s' in:\n%s", want[i] + 1, out);
    double rate, ratio, dense, ar;
    int ranks;
    char mode[8];
    ck_assert_int_eq(sscanf(l + 1, "%7s %d %lf %lf %lf %lf", mode, &ranks, &rate, &ratio, &dense,
                            &ar), 6);
    ck_assert_msg(rate > 0 && dense > 0, "%s", l + 1);
    if (ranks == 1) ck_assert_msg(ratio == 1.0 && ar == 0.0, "%s", l + 1);
    else ck_assert_msg(ar > 0, "two ranks without all-reduce time: %s", l + 1);
  }
  printf("dp_train: bench dp (small):\n%s\n", strstr(out, "mode   ranks"));
  free(out);
  rc = run_cmd(&out, "%s bench dp --batch 255 --ranks 1,2", bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "--batch 255 does not divide by 2 ranks"), "exit %d: %s", rc,
                out);
  free(out);
}
END_TEST

/* One case per test, so that CK_RUN_CASE=epoch (etc.) runs one alone. */
static void add(Suite *s, const char *name, const TTest *test) {
  TCase *tc = tcase_create(name);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test);
  suite_add_tcase(s, tc);
}

int main(void) {
  Suite *s = suite_create("dp_train");
  add(s, "equal", test_colocated_equal_one_rank);
  add(s, "resume", test_colocated_checkpoint_resume_np2);
  add(s, "epoch", test_colocated_epoch_300k_and_async);
  add(s, "death", test_colocated_rank_death);
  add(s, "bench", test_bench_dp_small);
  if (data_make()) {
    data_remove();
    return 1; /* s is not run: exit frees it */
  }
  int rc = sr_check_run(s);
  data_remove();
  return rc;
}
