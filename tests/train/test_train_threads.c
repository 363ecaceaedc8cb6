/* Threads change speed, never bits: `shardrec train` with --dense-threads 1,
 * 2 and 3 (and OPENBLAS_NUM_THREADS set to another count each time, which
 * must not matter either) gives the same per-step losses, test AUC and test
 * predictions, bit for bit, over 64 steps: the Kaggle architecture and a
 * small one, SGD and Adagrad, batch 128 and 512, and a small cross network
 * (--arch-interaction-op dcn). The binary runs on one
 * data set made in main (40000 rows of datagen --seed 4, a tenth test). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"
#include "tests/train/e2e_data.h"

#define STEPS 64
#define KAGGLE "--arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1"
#define SMALL "--arch-mlp-bot 13-64-16 --arch-mlp-top 128-1"
#define DCN SMALL " --arch-interaction-op dcn --dcn-num-layers 2 --dcn-low-rank-dim 64"

static char *dir; /* made in main */

/* Train with th dense threads (OPENBLAS_NUM_THREADS=blas), metrics in
 * NAME.jsonl and the test predictions in NAME.pred. */
static void train(const char *name, int th, int blas, const char *flags) {
  char *out;
  int rc = run_cmd(&out, "cd %s && OPENBLAS_NUM_THREADS=%d %s train --processed-data-file d.bin "
                         "--num-batches %d --print-freq 1 --test-freq %d --metrics-out %s.jsonl "
                         "--test-pred-out %s.pred --dense-threads %d %s",
                   dir, blas, bin_path(), STEPS, STEPS, name, name, th, flags);
  ck_assert_msg(rc == 0, "%s: exit %d:\n%s", name, rc, out);
  char want[64];
  snprintf(want, sizeof want, "; %d dense thread(s) per rank", th);
  ck_assert_msg(strstr(out, want), "%s: no '%s' in:\n%s", name, want, out);
  free(out);
}

/* 1, 2 and 3 threads with flags: the same bits in every train and test
 * line of the metrics and in every prediction. */
static void same_bits(const char *tag, const char *flags) {
  char name[3][64], path[600];
  char *m[3], *p[3];
  for (int th = 1; th <= 3; th++) {
    snprintf(name[th - 1], sizeof name[0], "%s-t%d", tag, th);
    train(name[th - 1], th, 4 - th, flags);
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name[th - 1]);
    m[th - 1] = e2e_bits_of(path);
    snprintf(path, sizeof path, "%s/%s.pred", dir, name[th - 1]);
    p[th - 1] = slurp(path);
    ck_assert_msg(p[th - 1] != NULL, "no %s", path);
  }
  /* the runs did train: every step is there, and the test pass */
  char last[64];
  snprintf(last, sizeof last, "{\"kind\":\"train\",\"step\":%d,", STEPS);
  ck_assert_msg(strstr(m[0], last) && strstr(m[0], "\"kind\":\"test\""), "%s", m[0]);
  ck_assert_int_eq((int)strlen(p[0]) > 4000 * 2, 1);
  for (int k = 1; k < 3; k++) {
    ck_assert_msg(!strcmp(m[0], m[k]), "%s: %d threads' metrics differ from 1 thread's:\n%s\nvs\n%s",
                  tag, k + 1, m[k], m[0]);
    ck_assert_msg(!strcmp(p[0], p[k]), "%s: %d threads' test predictions differ", tag, k + 1);
  }
  for (int k = 0; k < 3; k++) free(m[k]), free(p[k]);
}

START_TEST(test_kaggle_sgd_128) { same_bits("kaggle-sgd-128", KAGGLE " --mini-batch-size 128"); }
END_TEST

START_TEST(test_kaggle_adagrad_512) {
  same_bits("kaggle-adagrad-512",
            KAGGLE " --mini-batch-size 512 --optimizer adagrad --learning-rate 0.01");
}
END_TEST

START_TEST(test_small_adagrad_128) {
  same_bits("small-adagrad-128",
            SMALL " --mini-batch-size 128 --optimizer adagrad --learning-rate 0.01");
}
END_TEST

START_TEST(test_small_sgd_512) { same_bits("small-sgd-512", SMALL " --mini-batch-size 512"); }
END_TEST

/* The cross network (x_0 27 x 16 wide): its products split by rows at batch
 * 512, its element-wise kernels in blocks of rows. */
START_TEST(test_dcn_adagrad_512) {
  same_bits("dcn-adagrad-512", DCN " --mini-batch-size 512 --optimizer adagrad --learning-rate 0.01");
}
END_TEST

/* A checkpoint records the kernels; --resume under the other set warns in
 * one line naming both, under the same set it says nothing. */
START_TEST(test_resume_other_kernels_warns) {
  char *out;
  const char *base = "--processed-data-file d.bin " SMALL " --mini-batch-size 128";
  int rc = run_cmd(&out, "cd %s && %s train %s --num-batches 4 --dense-isa avx2 "
                         "--save-checkpoint ck-kern", dir, bin_path(), base);
  if (rc == 2 && strstr(out, "--dense-isa: avx2: this CPU")) { /* no AVX2 here: nothing to swap */
    free(out);
    return;
  }
  ck_assert_msg(rc == 0 && strstr(out, "dense  kernels avx2; OpenBLAS "), "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s train %s --num-batches 6 --dense-isa baseline --resume ck-kern",
               dir, bin_path(), base);
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_msg(strstr(out, "shardrec train: warning: --resume: ") &&
                    strstr(out, "was written with dense kernels avx2, OpenBLAS ") &&
                    strstr(out, "this run has dense kernels baseline, OpenBLAS "),
                "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s train %s --num-batches 6 --dense-isa avx2 --resume ck-kern",
               dir, bin_path(), base);
  ck_assert_msg(rc == 0 && strstr(out, "resume ") && !strstr(out, "warning: --resume"), "%s",
                out);
  free(out);
}
END_TEST

/* Bad values of the two flags: exit 2, the flag named. */
START_TEST(test_flag_errors) {
  const char *cmds[] = {"train --processed-data-file d.bin",
                        "eval --checkpoint none --processed-data-file d.bin", "bench train"};
  const char *bad[][2] = {{"--dense-isa sse9", "--dense-isa: 'sse9' is not baseline or avx2"},
                          {"--dense-threads 0", "--dense-threads: 0 is out of range"},
                          {"--dense-threads x", "--dense-threads: 'x' is not"}};
  for (int c = 0; c < 3; c++)
    for (int b = 0; b < 3; b++) {
      if (c == 2 && b > 0) continue; /* bench train takes a list: its own messages */
      char *out;
      int rc = run_cmd(&out, "cd %s && %s %s %s", dir, bin_path(), cmds[c], bad[b][0]);
      ck_assert_msg(rc == 2 && strstr(out, bad[b][1]), "%s %s: exit %d:\n%s", cmds[c],
                    bad[b][0], rc, out);
      free(out);
    }
}
END_TEST

int main(void) {
  int rc = 1;
  if ((dir = e2e_data_make("test_train_threads", "threads", 40000, 4))) {
    Suite *s = suite_create("train_threads");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_kaggle_sgd_128);
    tcase_add_test(tc, test_kaggle_adagrad_512);
    tcase_add_test(tc, test_small_adagrad_128);
    tcase_add_test(tc, test_small_sgd_512);
    tcase_add_test(tc, test_dcn_adagrad_512);
    tcase_add_test(tc, test_resume_other_kernels_warns);
    tcase_add_test(tc, test_flag_errors);
    suite_add_tcase(s, tc);
    rc = sr_check_run(s);
  }
  e2e_data_remove(dir);
  return rc;
}
