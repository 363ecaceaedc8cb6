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
 *     bit, with rows in memory and with rows in RocksDB (--data-dir); a
 *     run not resuming refuses a --data-dir holding an earlier run's rows;
 *   - death: a rank killed mid-job (from outside) stops the whole job,
 *     naming it;
 *   - bench: `shardrec bench dp` on a small set prints its table.
 * The same against shard servers (--shard-servers: equivalence over a
 * whole epoch, the 300k epoch, resume, the refusals) is tests/mpi/
 * test_mpi_train.c; the helpers both use are tests/support/dp_run.h. */
#include <check.h>
#include <math.h>
#include <sys/stat.h>

#include "tests/check_main.h"
#include "tests/support/dp_run.h"

#define ARCH "--arch-mlp-bot 13-64-16 --arch-mlp-top 64-1"
#define HYPER DP_HYPER
#define MPIRUN DP_MPIRUN

/* Train with np ranks and colocated shards (np 0: one rank, no mpirun,
 * shards in process); metrics in name.jsonl; the exit status, the output
 * in *out (may be NULL). A run of N ranks that succeeds must say that it
 * colocated the plan's 3 shards with its N ranks. */
static int train(const char *name, int np, const char *data, const char *plan, const char *extra,
                 char **out) {
  char args[1200];
  snprintf(args, sizeof args, ARCH " " HYPER " %s %s", np > 0 ? "--colocate-shards" : "", extra);
  char *o;
  int rc = dp_train("dp_train", np ? ", colocated shards" : ", shards in process", name, np, data,
                    plan, args, &o);
  if (rc == 0 && np > 0) {
    char want[64];
    snprintf(want, sizeof want, "shards 3 shard(s) colocated with %d rank(s): 127.0.0.1:", np);
    ck_assert_msg(strstr(o, want), "no '%s' in:\n%s", want, o);
  }
  if (out) *out = o;
  else free(o);
  return rc;
}

static dp_metrics ma, mb, mc, md;

START_TEST(test_colocated_equal_one_rank) {
  char *o1, *o2;
  double d2, d4;
  dp_equal_runs(train, "dp_train", ", colocated", "--mini-batch-size 128 --num-batches 100", 100,
                &ma, &mb, &mc, &md, &d2, &d4, &o1, &o2);
  ck_assert_msg(strstr(o1, "3 shard(s) in process"), "%s", o1);
  free(o1);
  free(o2);
  /* Not one rank's bits: the ranks' parts were really summed. */
  ck_assert_msg(d2 > 0 && d4 > 0, "N ranks gave one rank's bits exactly (np2 %g, np4 %g)", d2, d4);
}
END_TEST

START_TEST(test_colocated_epoch_300k_and_async) {
  char *out;
  /* 270000 train rows: 263 full batches of 1024 and one of 688. */
  dp_make_big(3, ARCH, "pbig.json");
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
  dp_load("e1", &ma);
  dp_load("e2", &mb);
  dp_load("e4", &md);
  dp_load("a2", &mc);
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
  if (rocks) snprintf(dd, sizeof dd, "--data-dir %s/%s.rows1 --cache-rows 4096", dp_dir, tag);
  snprintf(full, sizeof full, "--mini-batch-size 128 --num-batches 60 --save-checkpoint %s/%s.ck "
           "--checkpoint-every 30 %s", dp_dir, tag, dd);
  ck_assert_msg(train(name_full, 2, "d.bin", "p.json", full, &out) == 0, "%s", out);
  free(out);
  /* Every colocated shard wrote its part of the step-30 checkpoint. */
  for (int k = 0; k < 3; k++) {
    char p[900];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s.ck/step-30/shards/shard-%d", dp_dir, tag, k);
    ck_assert_msg(stat(p, &st) == 0, "no %s", p);
  }
  if (rocks) { /* a job starting afresh on the rows that run left: refused on every rank */
    char again[900];
    snprintf(again, sizeof again, "--mini-batch-size 128 --num-batches 2 %s", dd);
    ck_assert_int_eq(train("rocks_again", 2, "d.bin", "p.json", again, &out), 1);
    ck_assert_msg(strstr(out, "rank 1: --colocate-shards: ") &&
                      strstr(out, ".rows1: holds shard databases of an earlier run"), "%s", out);
    free(out);
  }
  if (rocks) snprintf(dd, sizeof dd, "--data-dir %s/%s.rows2 --cache-rows 4096", dp_dir, tag);
  snprintf(res, sizeof res, "--mini-batch-size 128 --num-batches 60 --resume %s/%s.ck/step-30 %s",
           dp_dir, tag, dd);
  ck_assert_msg(train(name_res, 2, "d.bin", "p.json", res, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "resume ") && strstr(out, "step 30"), "%s", out);
  free(out);
  dp_load(name_full, &ma);
  dp_load(name_res, &mb);
  dp_assert_resumed(tag, &ma, &mb, 30, 60);
  printf("dp_train: resume (%s): steps 31-60 and test auc %s bit-identical to the uninterrupted "
         "run\n", rocks ? "RocksDB" : "memory", ma.auc_text);
}

START_TEST(test_colocated_checkpoint_resume_np2) {
  resume_case("mem", 0);
  resume_case("rocks", 1);
}
END_TEST

/* A rank that dies takes its colocated shards with it: once rank 0 has
 * printed step 20, rank 1 (OMPI_COMM_WORLD_RANK=1 under the test's mpirun)
 * is SIGKILLed from outside; the whole job stops, soon, non-zero, before
 * its last step, and the output names the dead rank; nothing hangs on the
 * dead rank's shards. */
START_TEST(test_colocated_rank_death) {
  char log[700];
  snprintf(log, sizeof log, "%s/death.out", dp_dir);
  pid_t job = spawn_sh("cd %s && exec " MPIRUN " -np 2 %s train --processed-data-file d.bin "
                       "--plan p.json " ARCH " " HYPER " --mini-batch-size 128 --num-batches 100 "
                       "--print-freq 1 --colocate-shards > death.out 2>&1",
                       dp_dir, bin_path());
  pid_t r1 = mpi_rank_pid(job, 1, 120);
  wait_text(log, "train  step 20/100 ", 1, job, 240);
  ck_assert_int_eq(kill(r1, SIGKILL), 0);
  double t0 = test_now();
  int st = wait_exit(job, 120);
  double secs = test_now() - t0;
  char *out = slurp(log);
  int last = 0;
  for (const char *p = out; (p = strstr(p, "train  step ")); p += 12) last = atoi(p + 12);
  printf("dp_train: rank 1 killed after step 20: the job stopped %.1f s later (wait status %d), "
         "last step printed %d\n", secs, st, last);
  ck_assert_msg(st != -1, "the job did not stop within 120 s of rank 1's death:\n%s", out);
  ck_assert_msg(!WIFEXITED(st) || WEXITSTATUS(st) != 0, "the job went on without rank 1:\n%s",
                out);
  ck_assert_msg(secs < 60, "the job took %.0f s to stop", secs);
  ck_assert_msg(strstr(out, "rank 1"), "the output does not name rank 1:\n%s", out);
  ck_assert_msg(last >= 20 && last < 100 && !strstr(out, "\ndone "),
                "not stopped between step 20 and the end:\n%s", out);
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

int main(void) {
  const dp_case cases[] = {
      {"equal", test_colocated_equal_one_rank},
      {"resume", test_colocated_checkpoint_resume_np2},
      {"epoch", test_colocated_epoch_300k_and_async},
      {"death", test_colocated_rank_death},
      {"bench", test_bench_dp_small},
  };
  /* 20000 rows: 18000 train, 2000 test; a 3-shard plan p.json. */
  return dp_suite_run("dp_train", cases, (int)(sizeof cases / sizeof cases[0]), "test_dp_train",
                      20000, 3, ARCH);
}
