/* shardrec train and eval end to end on generated data: determinism, the
 * plan it writes and reads, saved models (checkpoints) scored by eval and
 * predict alike, flag aliases, old saved-model folders refused, raw TSV
 * input. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>

#include "tests/support/proc.h"

static char *dir;

static void setup_data(void) {
  dir = tmpdir_make("test");
  char *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 20000 --seed 3 --out d.tsv && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin", dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  free(out);
}

static void teardown_data(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Train 60 steps printing every step; returns the metrics file's text. */
static char *train_metrics(const char *name, const char *extra) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 60 "
                         "--print-freq 1 --mini-batch-size 64 --plan-out %s.plan.json "
                         "--metrics-out %s.jsonl %s",
                   dir, bin_path(), name, name, extra);
  ck_assert_msg(rc == 0, "train failed: %s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
  char *m = slurp(path);
  ck_assert_ptr_nonnull(m);
  return m;
}

START_TEST(test_same_seed_same_bits) {
  char *a = train_metrics("a", "--seed 5");
  char *b = train_metrics("b", "--seed 5");
  char *c = train_metrics("c", "--seed 6");
  /* Losses are printed with 9 significant digits (exact for floats); drop the
   * samples/s field, which is timing. */
  char *pa = a, *pb = b;
  int lines = 0;
  while (*pa && *pb) {
    char *ea = strchr(pa, '\n'), *eb = strchr(pb, '\n');
    ck_assert(ea && eb);
    char *sa = strstr(pa, "\"samples_per_s\""), *sb = strstr(pb, "\"samples_per_s\"");
    size_t la = (sa && sa < ea) ? (size_t)(sa - pa) : (size_t)(ea - pa);
    size_t lb = (sb && sb < eb) ? (size_t)(sb - pb) : (size_t)(eb - pb);
    ck_assert_msg(la == lb && memcmp(pa, pb, la) == 0, "line %d differs:\n%.*s\n%.*s", lines,
                  (int)la, pa, (int)lb, pb);
    if (strstr(pa, "\"kind\":\"train\"") && strstr(pa, "\"kind\":\"train\"") < ea) lines++;
    pa = ea + 1;
    pb = eb + 1;
  }
  ck_assert_int_eq(lines, 60);
  ck_assert(*pa == 0 && *pb == 0);
  /* Another seed gives other losses: the comparison above can fail. */
  ck_assert_str_ne(strstr(a, "\"step\":1,"), strstr(c, "\"step\":1,"));
  /* The loss falls: mean of the last 10 steps below the first 10. */
  double first = 0, last = 0;
  const char *p = a;
  for (int step = 1; step <= 60; step++) {
    p = strstr(p, "\"last_loss\":");
    ck_assert_ptr_nonnull(p);
    double l = strtod(p + 12, NULL);
    if (step <= 10) first += l;
    if (step > 50) last += l;
    p++;
  }
  ck_assert_msg(last < first, "loss did not fall: first %g last %g", first / 10, last / 10);
  free(a);
  free(b);
  free(c);
}
END_TEST

START_TEST(test_plan_written_then_reused) {
  char *a = train_metrics("p1", "--seed 9");
  /* Training from the plan written by the first run gives the same bits. */
  char extra[600];
  snprintf(extra, sizeof extra, "--plan %s/p1.plan.json", dir);
  char *b = train_metrics("p2", extra);
  const char *la = strstr(a, "\"step\":60,"), *lb = strstr(b, "\"step\":60,");
  ck_assert_ptr_nonnull(la);
  ck_assert_ptr_nonnull(lb);
  ck_assert_int_eq(strncmp(la, lb, (size_t)(strstr(la, "\"samples_per_s\"") - la)), 0);
  /* `shardrec plan` sizes the tables from the data as train does: the same
   * model fingerprint, the same losses. */
  char *out0;
  int rc0 = run_cmd(&out0, "cd %s && %s plan --out q.json --processed-data-file d.bin --seed 9",
                    dir, bin_path());
  ck_assert_msg(rc0 == 0, "%s", out0);
  free(out0);
  snprintf(extra, sizeof extra, "--plan %s/q.json", dir);
  char *q = train_metrics("p3", extra);
  const char *lq = strstr(q, "\"step\":60,");
  ck_assert_ptr_nonnull(lq);
  ck_assert_int_eq(strncmp(la, lq, (size_t)(strstr(la, "\"samples_per_s\"") - la)), 0);
  free(q);
  /* A plan of another embedding dim is refused with the table named. */
  char *out;
  int rc = run_cmd(&out, "cd %s && sed 's/\"dim\": *16/\"dim\": 8/' p1.plan.json > p8.json && "
                         "%s train --processed-data-file d.bin --plan p8.json --num-batches 2",
                   dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "dim 8") && strstr(out, "expects 16"), "%s", out);
  free(out);
  free(a);
  free(b);
}
END_TEST

/* The lines of dir/name (2000 expected: the test split). */
static char *pred_file(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *pred = slurp(path);
  ck_assert_ptr_nonnull(pred);
  int lines = 0;
  for (char *p = pred; *p; p++) lines += *p == '\n';
  ck_assert_int_eq(lines, 2000);
  return pred;
}

START_TEST(test_save_model_eval_matches) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --mini-batch-size 128 "
                         "--optimizer adagrad --learning-rate 0.02 --test-mini-batch-size 1000 "
                         "--plan-out s.plan.json --save-model model",
                   dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  double auc = find_num(out, "test   step"), ll;
  const char *t = strstr(out, "test   step");
  ck_assert_ptr_nonnull(t);
  auc = find_num(t, "auc ");
  ll = find_num(t, "logloss ");
  ck_assert_msg(auc > 0.6 && auc < 1.0, "auc %g", auc);
  /* The saved model is a checkpoint: model/step-N with --save-checkpoint's
   * files, N the steps trained (18000 samples in batches of 128). */
  ck_assert_msg(strstr(out, "saved  model/step-141\n"), "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && LC_ALL=C ls -A model && LC_ALL=C ls model/step-141", dir);
  ck_assert_msg(rc == 0 && !strcmp(out, "step-141\nDONE\ndense.bin\nmanifest.json\nshards\ntransform.bin\n"),
                "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s eval --checkpoint model --processed-data-file d.bin "
                     "--mini-batch-size 1000 --out pred.txt", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  /* Same predictions, same metrics, to the printed digit. */
  ck_assert_double_eq(find_num(out, "auc "), auc);
  ck_assert_double_eq(find_num(out, "logloss "), ll);
  ck_assert_msg(strstr(out, "eval   d.bin (test, 2000 samples): "), "%s", out);
  free(out);
  char *pred = pred_file("pred.txt");
  /* The aliases: --model for --checkpoint, --split for --data-split. */
  rc = run_cmd(&out, "cd %s && %s eval --model model/ --split test --processed-data-file d.bin "
                     "--mini-batch-size 1000 --out pred2.txt", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_double_eq(find_num(out, "auc "), auc);
  free(out);
  char *pred2 = pred_file("pred2.txt");
  ck_assert_str_eq(pred, pred2);
  free(pred2);
  /* predict reads the same folder with the same reader: the same bits. */
  rc = run_cmd(&out, "cd %s && %s predict --checkpoint model --data-split test "
                     "--processed-data-file d.bin --mini-batch-size 1000 --out pred3.txt && "
                     "%s predict --model model --split test --processed-data-file d.bin "
                     "--mini-batch-size 1000 --out pred4.txt", dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_double_eq(find_num(out, "auc "), auc);
  free(out);
  pred2 = pred_file("pred3.txt");
  ck_assert_str_eq(pred, pred2);
  free(pred2);
  pred2 = pred_file("pred4.txt");
  ck_assert_str_eq(pred, pred2);
  free(pred2);
  free(pred);
  /* A torn dense file is refused, naming it. */
  rc = run_cmd(&out, "cd %s && cp -r model torn && truncate -s 1000 torn/step-141/dense.bin && "
                     "%s eval --checkpoint torn --processed-data-file d.bin", dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "torn/step-141/dense.bin") && strstr(out, "torn or truncated"),
                "%s", out);
  free(out);
  /* A second --save-model into the folder replaces it whole. */
  rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --mini-batch-size 128 "
                     "--optimizer adagrad --learning-rate 0.02 --num-batches 5 "
                     "--plan-out s.plan.json --save-model model && LC_ALL=C ls -A model",
               dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "saved  model/step-5\nstep-5\n"), "%s", out);
  free(out);
}
END_TEST

START_TEST(test_old_model_folder_refused) {
  /* A --save-model folder of the format before it wrote checkpoints. */
  char *out;
  int rc = run_cmd(&out, "cd %s && mkdir -p old/rows && %s plan --out old/plan.json "
                         "--processed-data-file d.bin >/dev/null && "
                         "printf '{\"format\": 1, \"n_dense\": 13}' > old/model.json && "
                         "printf 'SRDNSPRM' > old/dense.bin && head -c 600 /dev/zero >> old/dense.bin",
                   dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  const char *cmds[] = {"eval --model old --processed-data-file d.bin",
                        "eval --checkpoint old --raw-data-file d.tsv",
                        "predict --checkpoint old --processed-data-file d.bin --out p.txt"};
  for (int i = 0; i < 3; i++) {
    rc = run_cmd(&out, "cd %s && %s %s", dir, bin_path(), cmds[i]);
    ck_assert_msg(rc == 1, "%s: rc %d: %s", cmds[i], rc, out);
    ck_assert_msg(strstr(out, "old: a model folder written by an older shardrec") &&
                  strstr(out, "save the model again by training with --save-model"),
                  "%s: %s", cmds[i], out);
    free(out);
  }
  rc = run_cmd(&out, "cd %s && test ! -e p.txt && LC_ALL=C ls old", dir);
  ck_assert_msg(rc == 0 && !strcmp(out, "dense.bin\nmodel.json\nplan.json\nrows\n"), "%s", out);
  free(out);
  /* Saved again as the refusal says: --save-model replaces it as a model
   * folder, and eval reads it. */
  rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --mini-batch-size 128 "
                     "--num-batches 2 --save-model old > /dev/null && LC_ALL=C ls -A old && "
                     "%s eval --checkpoint old --processed-data-file d.bin",
               dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0 && !strncmp(out, "step-2\neval   d.bin (test, ", 27), "%s", out);
  free(out);
}
END_TEST

START_TEST(test_raw_tsv_with_bad_lines) {
  char *out;
  /* Two malformed lines in the raw file are skipped, reported with their
   * line numbers, and counted; training goes on. */
  int rc = run_cmd(&out, "cd %s && head -n 3000 d.tsv > r.tsv && "
                         "printf '2\\t1\\n1\\tx\\t3\\n' >> r.tsv && head -n 6000 d.tsv | tail -n 3000 >> r.tsv && "
                         "%s train --raw-data-file r.tsv --test-fraction 0.2 --num-batches 20 "
                         "--plan-out r.plan.json", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_msg(strstr(out, "r.tsv:3001:"), "first bad line not reported: %s", out);
  ck_assert_msg(strstr(out, "r.tsv:3002:"), "second bad line not reported: %s", out);
  /* 6000 good lines (the two bad ones are not samples), a fifth of them
   * the test split: 4800 train, 1200 test. */
  ck_assert_msg(strstr(out, "data   r.tsv: 4800 train, 1200 test samples"), "%s", out);
  ck_assert_msg(strstr(out, "data   2 malformed lines skipped"), "%s", out);
  free(out);
  /* --strict makes the first one fatal. */
  rc = run_cmd(&out, "cd %s && %s train --raw-data-file r.tsv --strict --test-fraction 0.2 "
                     "--num-batches 2 --plan-out r.plan.json", dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "r.tsv:3001"), "%s", out);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup_data, teardown_data);
  tcase_add_test(tc, test_same_seed_same_bits);
  tcase_add_test(tc, test_plan_written_then_reused);
  tcase_add_test(tc, test_save_model_eval_matches);
  tcase_add_test(tc, test_old_model_folder_refused);
  tcase_add_test(tc, test_raw_tsv_with_bad_lines);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
