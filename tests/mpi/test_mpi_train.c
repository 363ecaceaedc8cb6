/* Data-parallel training under a real mpirun against 2 real `shardrec
 * serve` processes: the job with N ranks computes what one rank does with
 * the same global batch.
 *   - 1 rank vs -np 2 and -np 4: per-step losses within 1e-5 relative over a
 *     whole epoch (141 steps; the last global batch holds 2 samples, so at
 *     -np 4 two ranks train on none), test AUC within 1e-3; a second -np 2
 *     run gives the same bits (every loss and the AUC);
 *   - a full epoch of 300k rows at -np 2 and -np 4: test AUC within 1e-3 of
 *     one rank;
 *   - a global batch that does not divide by N is refused (exit 2), and so
 *     are several ranks without shard servers;
 *   - checkpoint at step 30 of a -np 2 run and resume with -np 2: the losses
 *     after step 30 and the test AUC are bit-identical to the uninterrupted
 *     run; the same from a chain of incremental checkpoints
 *     (--full-checkpoint-every 4: step-0 whole, step-10, -20 and -30 the
 *     rows changed, each server's in its own folder).
 * The same with the shards colocated in the ranks (--colocate-shards):
 * equivalence and reruns, the 300k epoch, async vs sync and resume, is
 * tests/train/test_dp_train.c; the helpers both use are
 * tests/support/dp_run.h. */
#include <check.h>
#include <math.h>

#include "tests/check_main.h"
#include "tests/support/dp_run.h"

#define ARCH "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1"
/* Training this small ReLU model is chaotic at the 1e-7 level: a one-rank
 * run with --learning-rate 0.0999999 instead of 0.1 (SGD, this data) drifts
 * to 7e-4 relative by step 141 once some unit crosses its kink, while
 * 0.1000001 stays within 2e-7. N ranks round differently from one rank by
 * about 1e-7, so whether a step lands on such a kink is a property of the
 * data and hyper-parameters, not of the ranks' code: with SGD lr 0.1 -np 4
 * left 1e-5 at step 43 here, and with Adagrad on a 20000-row draw at step
 * 29, while -np 2 stayed within 1.2e-7 in all four. These equivalence runs
 * use the hyper-parameters that stay on the smooth side (Adagrad, DP_HYPER):
 * the test checks the ranks' arithmetic, which must then agree to 1e-7. */
#define HYPER DP_HYPER
#define MPIRUN DP_MPIRUN

/* Train against 2 fresh servers for plan with np ranks (0: no mpirun);
 * metrics in name.jsonl; returns the exit status, the output in *out (may
 * be NULL). */
static int train(const char *name, int np, const char *data, const char *plan, const char *extra,
                 char **out) {
  test_server s[2] = {{0}, {0}};
  char addrs[200], args[1200];
  /* fresh servers: rows in RocksDB under NAME.srvK */
  servers_start(s, 2, &(servers_opts){.dir = dp_dir, .plan = plan, .data = name, .log = name});
  servers_addrs(s, 2, addrs, sizeof addrs);
  snprintf(args, sizeof args, ARCH " --shard-servers %s %s", addrs, extra);
  int rc = dp_train("mpi_train", ", shard servers", name, np, data, plan, args, out);
  server_stop(&s[0]);
  server_stop(&s[1]);
  return rc;
}

static dp_metrics ma, mb, mc, md;

/* The whole epoch: 141 steps, the last one of 2 samples. */
START_TEST(test_ranks_equal_one_rank) {
  char *o1, *o2;
  double d2, d4;
  dp_equal_runs(train, "mpi_train", "", "--mini-batch-size 128 " HYPER, 141, &ma, &mb, &mc, &md,
                &d2, &d4, &o1, &o2);
  /* Only rank 0 prints: one plan line, one test line. */
  const char *first = strstr(o2, "test   step");
  ck_assert_msg(first && !strstr(first + 1, "test   step"), "test line not once:\n%s", o2);
  free(o1);
  free(o2);
  /* Grouped differently, so not the same bits as one rank (else the test
   * would not show that the ranks' parts were summed at all). */
  ck_assert_msg(d2 > 0 || d4 > 0, "N ranks gave one rank's bits exactly");
  ck_assert_msg(ma.auc > 0.6, "the model did not learn (auc %g)", ma.auc);
}
END_TEST

START_TEST(test_full_epoch_300k) {
  char *out;
  /* 270000 train rows (263 full batches of 1024 and one of 688), 30000
   * test rows in batches of 777 (the last of 474, split unevenly). */
  dp_make_big(2, ARCH, "pbig.json");
  const char *ex = "--mini-batch-size 1024 --test-mini-batch-size 777 --print-freq 64 " HYPER;
  ck_assert_msg(train("e1", 0, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  free(out);
  ck_assert_msg(train("e2", 2, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  free(out);
  ck_assert_msg(train("e4", 4, "big.bin", "pbig.json", ex, &out) == 0, "%s", out);
  free(out);
  dp_load("e1", &ma);
  dp_load("e2", &mb);
  dp_load("e4", &md);
  printf("mpi_train: 300k rows, one epoch: test auc 1 rank %.6f, np2 %.6f (%+.2g), np4 %.6f "
         "(%+.2g)\n", ma.auc, mb.auc, mb.auc - ma.auc, md.auc, md.auc - ma.auc);
  ck_assert_msg(ma.auc > 0.7, "one rank did not learn (auc %g)", ma.auc);
  ck_assert_msg(fabs(mb.auc - ma.auc) < 1e-3, "np2 auc %g vs %g", mb.auc, ma.auc);
  ck_assert_msg(fabs(md.auc - ma.auc) < 1e-3, "np4 auc %g vs %g", md.auc, ma.auc);
}
END_TEST

START_TEST(test_batch_must_divide) {
  char *out;
  int rc = run_cmd(&out, "cd %s && " MPIRUN " -np 3 %s train --processed-data-file d.bin "
                         "--plan p.json " ARCH " --mini-batch-size 128 --shard-servers "
                         "127.0.0.1:1,127.0.0.1:2",
                   dp_dir, bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "--mini-batch-size 128 is the global batch and must "
                                       "divide by the 3 ranks"),
                "exit %d: %s", rc, out);
  free(out);
  /* Several ranks without shards they all reach. */
  rc = run_cmd(&out, "cd %s && " MPIRUN " -np 2 %s train --processed-data-file d.bin "
                     "--plan p.json " ARCH " --mini-batch-size 128",
               dp_dir, bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "2 ranks need the embeddings on shards"), "exit %d: %s",
                rc, out);
  free(out);
}
END_TEST

/* Against fresh servers for each run (the resumed run's servers restore
 * their shards from the checkpoint). The colocated variant is
 * tests/train/test_dp_train.c (resume: rows in memory and in RocksDB). */
START_TEST(test_checkpoint_resume_np2) {
  char *out;
  const char *ex = "--mini-batch-size 128 --num-batches 60 " HYPER;
  char full[600];
  snprintf(full, sizeof full, "%s --save-checkpoint %s/ck --checkpoint-every 30", ex, dp_dir);
  ck_assert_msg(train("c_full", 2, "d.bin", "p.json", full, &out) == 0, "%s", out);
  free(out);
  char res[600];
  snprintf(res, sizeof res, "%s --resume %s/ck/step-30", ex, dp_dir);
  ck_assert_msg(train("c_res", 2, "d.bin", "p.json", res, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "resume ") && strstr(out, "step 30"), "%s", out);
  free(out);
  dp_load("c_full", &ma);
  dp_load("c_res", &mb);
  dp_assert_resumed("shard servers", &ma, &mb, 30, 60);
}
END_TEST

/* A -np 2 run writing a chain (step-0 full, step-10, -20, -30 increments)
 * and a -np 2 run resumed from step-30 on fresh servers, which restore
 * step-0's rows and lay each increment over them: the losses after step 30
 * and the test AUC bit-identical to the chain run's, itself bit-identical
 * to a run without checkpoints. */
START_TEST(test_chain_resume_np2) {
  char *out;
  const char *ex = "--mini-batch-size 128 --num-batches 60 " HYPER;
  char args[600];
  snprintf(args, sizeof args, "%s --save-checkpoint %s/chain --checkpoint-every 10 "
           "--full-checkpoint-every 4", ex, dp_dir);
  ck_assert_msg(train("ch_full", 2, "d.bin", "p.json", args, &out) == 0, "%s", out);
  free(out);
  int rc = run_cmd(&out, "%s inspect %s/chain/step-30", bin_path(), dp_dir);
  ck_assert_msg(rc == 0 && strstr(out, "kind incremental") && strstr(out, "a chain of 4 links"),
                "%.1500s", out);
  free(out);
  snprintf(args, sizeof args, "%s --resume %s/chain/step-30", ex, dp_dir);
  ck_assert_msg(train("ch_res", 2, "d.bin", "p.json", args, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "resume ") && strstr(out, "step 30"), "%s", out);
  free(out);
  ck_assert_msg(train("ch_none", 2, "d.bin", "p.json", ex, &out) == 0, "%s", out);
  free(out);
  dp_load("ch_full", &ma);
  dp_load("ch_none", &mb);
  dp_assert_same_bits("chain run against a run without checkpoints", &ma, &mb);
  dp_load("ch_res", &mb);
  dp_assert_resumed("chain of increments", &ma, &mb, 30, 60);
}
END_TEST

/* Two ranks crowded on this host (1 dense thread each, OPENBLAS_NUM_THREADS=1)
 * and the same job with each rank given every core (2 dense threads each,
 * OPENBLAS_NUM_THREADS=2): the same bits, every loss and the test AUC. The
 * Kaggle MLPs at 128 samples per rank, so the products are split between
 * the threads. */
START_TEST(test_crowded_equals_spread) {
  const char *ex = "--mini-batch-size 256 --num-batches 60 --test-freq 60 "
                   "--arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1 " HYPER;
  char *out, args[600];
  const char *names[2] = {"crowded", "spread"};
  for (int k = 0; k < 2; k++) {
    setenv("OPENBLAS_NUM_THREADS", k ? "2" : "1", 1); /* this forked case only */
    snprintf(args, sizeof args, "%s --dense-threads %d", ex, k + 1);
    ck_assert_msg(train(names[k], 2, "d.bin", "p.json", args, &out) == 0, "%s", out);
    char want[96];
    snprintf(want, sizeof want, "ranks  2 rank(s) (mpirun), 2 on this node; %d dense thread(s)",
             k + 1);
    ck_assert_msg(strstr(out, want), "no '%s' in:\n%s", want, out);
    free(out);
  }
  dp_load("crowded", &ma);
  dp_load("spread", &mb);
  ck_assert_int_eq(ma.n, 60);
  ck_assert_msg(!isnan(ma.auc), "no test AUC");
  dp_assert_same_bits("crowded vs spread", &ma, &mb);
}
END_TEST

int main(void) {
  const dp_case cases[] = {
      {"threads", test_crowded_equals_spread},
      {"refuse", test_batch_must_divide},
      {"equal", test_ranks_equal_one_rank},
      {"resume", test_checkpoint_resume_np2},
      {"chain", test_chain_resume_np2},
      {"epoch", test_full_epoch_300k},
  };
  /* 19913 rows: 17922 train = 140 x 128 + 2, 1991 test; a 2-shard plan. */
  return dp_suite_run("mpi_train", cases, (int)(sizeof cases / sizeof cases[0]), "test_mpi_train",
                      19913, 2, ARCH);
}
