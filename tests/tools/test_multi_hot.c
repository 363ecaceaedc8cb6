/* Multi-hot end to end at MLPerf DLRM-DCNv2's bag sizes (214 ids a sample,
 * up to 100 in one table): datagen --multi-hot-sizes mlperf --cross-terms,
 * convert, train in process and against a real shard server (one whose
 * --max-ids cuts every Lookup and Push into parts, and one at its default
 * limits taking 2048-sample steps), the per-step losses and test AUC bit for
 * bit the same; predict and eval of the saved model give train's test
 * figures. Bad multi-hot input through the command: a bag of 129 ids and an
 * empty id inside a bag, named by file, line and field. */
#include <check.h>

#include "tests/check_main.h"

#include "tests/metrics/http_get.h"
#include "tests/support/servers.h"

static char *dir;

static void setup(void) {
  dir = tmpdir_make("test");
  char *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 5000 --seed 3 --multi-hot-sizes mlperf --cross-terms 2 "
                         "--out d.tsv && %s convert --test-fraction 0.1 d.tsv d.bin && "
                         "%s train --processed-data-file d.bin --num-batches 1 --seed 11 --plan-out p1.json",
                   dir, bin_path(), bin_path(), bin_path());
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  ck_assert_msg(strstr(out, "layout multi-hot"), "%s", out);
  free(out);
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Train steps of batch samples, in process (servers NULL) or against
 * servers, with extra flags; returns each metrics line's kind, step, loss
 * and test figures (no timings). */
static char *train(const char *name, int steps, int batch, const char *servers, const char *extra) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches %d --print-freq 1 "
                         "--mini-batch-size %d --optimizer adagrad --learning-rate 0.01 "
                         "--sparse-learning-rate 0.1 --plan p1.json --metrics-out %s.jsonl %s%s %s",
                   dir, bin_path(), steps, batch, name, servers ? "--shard-servers " : "",
                   servers ? servers : "", extra ? extra : "");
  ck_assert_msg(rc == 0, "train %s failed: %s", name, out);
  free(out);
  rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                     "import json\n"
                     "for l in open('%s.jsonl'):\n"
                     "    j = json.loads(l)\n"
                     "    print(j['kind'], j['step'], j.get('loss'), j.get('auc'), j.get('logloss'))\"",
               dir, name);
  ck_assert_msg(rc == 0, "%s", out);
  return out;
}

/* The value of the series line that starts with `series ` in a /metrics page. */
static double series_value(const char *page, const char *series) {
  char pat[200];
  snprintf(pat, sizeof pat, "\n%s ", series);
  const char *p = page ? strstr(page, pat) : NULL;
  ck_assert_msg(p != NULL, "no %s in /metrics", series);
  return atof(p + strlen(pat));
}

static void start_server(test_server *s, const char *name, const char *flags) {
  char args[1200], log[600];
  snprintf(args, sizeof args, "--plan '%s/p1.json' --shard 0 --cache-rows 4096 --data-dir '%s/%s' %s", dir,
           dir, name, flags);
  snprintf(log, sizeof log, "%s/%s.log", dir, name);
  server_start(s, args, log);
}

START_TEST(test_server_equals_in_process) {
  char *ref = train("local", 12, 128, NULL, "--save-model m");
  int lines = 0;
  for (char *p = ref; *p; p++) lines += *p == '\n';
  ck_assert_int_eq(lines, 13); /* 12 train lines and the test line */
  ck_assert_msg(strstr(ref, "train 12 ") && !strstr(ref, "nan") && !strstr(ref, "inf"), "%s", ref);
  /* --max-ids 1000: a step's unique ids (thousands) go in several calls */
  int mport = free_port();
  char flags[200];
  snprintf(flags, sizeof flags, "--max-ids 1000 --metrics-listen 127.0.0.1:%d", mport);
  test_server s;
  start_server(&s, "srv", flags);
  char *got = train("remote", 12, 128, s.addr, NULL);
  char *page = http_get(mport, "/metrics");
  ck_assert_int_eq(server_stop(&s), 0);
  ck_assert_msg(strcmp(ref, got) == 0, "against a server:\n%s\nvs in process:\n%s", got, ref);
  double pushes = series_value(page, "shardrec_server_calls_total{method=\"push\"}");
  double lookups = series_value(page, "shardrec_server_calls_total{method=\"lookup\"}");
  ck_assert_msg(pushes >= 2 * 12 && lookups >= 2 * 12, "%g pushes and %g lookups for 12 steps: not split",
                pushes, lookups);
  free(page);
  free(got);
  /* predict and eval of the saved model: train's test figures */
  char *out;
  int rc = run_cmd(&out, "cd %s && %s predict --checkpoint m --processed-data-file d.bin --data-split test "
                         "--out pred.tsv && %s eval --checkpoint m --processed-data-file d.bin && wc -l < pred.tsv",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  const char *t = strstr(ref, "test 12 None ");
  ck_assert_ptr_nonnull(t);
  double auc = atof(t + strlen("test 12 None "));
  ck_assert_msg(auc > 0 && auc < 1, "%s", ref);
  double pauc = find_num(out, "metrics auc "), eauc = find_num(strstr(out, "eval "), "auc ");
  ck_assert_msg(fabs(pauc - auc) < 5e-7 && fabs(eauc - auc) < 5e-7, "train %.6f, predict %.6f, eval %.6f\n%s",
                auc, pauc, eauc, out);
  ck_assert_msg(strstr(out, "\n500\n"), "pred.tsv lines: %s", out);
  free(out);
  free(ref);
}
END_TEST

/* Steps of 2048 samples (438k ids, the table of 100-id bags alone 205k)
 * against a server at its default limits: served, same bits. */
START_TEST(test_big_batch_default_limits) {
  char *ref = train("local_big", 2, 2048, NULL, NULL);
  test_server s;
  start_server(&s, "srv_big", "");
  char *got = train("remote_big", 2, 2048, s.addr, NULL);
  ck_assert_int_eq(server_stop(&s), 0);
  ck_assert_msg(strcmp(ref, got) == 0, "against a server:\n%s\nvs in process:\n%s", got, ref);
  ck_assert_msg(strstr(ref, "train 2 ") && !strstr(ref, "nan") && !strstr(ref, "inf"), "%s", ref);
  free(got);
  free(ref);
}
END_TEST

/* convert --strict of a file whose line 2 holds a bag of 129 ids, and one
 * whose line 3 holds "a,,b": exit 1 naming file, line and field; without
 * --strict both lines are skipped and counted. */
START_TEST(test_bad_bags_named) {
  char *out;
  int rc = run_cmd(&out, "cd %s && head -1 d.tsv > b129.tsv && /usr/bin/python3 -c \"\n"
                         "f = ['0'] + [''] * 13 + [','.join('%%x' %% (i + 1) for i in range(129))]\n"
                         "print('\\t'.join(f))\" >> b129.tsv && head -3 d.tsv | tail -1 >> b129.tsv && "
                         "head -2 d.tsv > empty.tsv && printf '1\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t1\\ta,,b\\n' "
                         ">> empty.tsv",
                   dir);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s convert --strict b129.tsv b129.bin", dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "b129.tsv:2: too many categorical values: field 15 (C1):") &&
                    strstr(out, "holds more than 128 ids"), "%s", out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s convert --strict empty.tsv empty.bin", dir, bin_path());
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "empty.tsv:3: bad categorical value: field 16 (C2): 'a,,b' has an empty value"), "%s",
                out);
  free(out);
  rc = run_cmd(&out, "cd %s && %s convert b129.tsv b129.bin", dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_msg(strstr(out, "samples 2") && strstr(out, "malformed skipped 1"), "%s", out);
  free(out);
}
END_TEST

static Suite *multi_hot_suite(void) {
  Suite *s = suite_create("multi_hot");
  TCase *tc = tcase_create("e2e");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_server_equals_in_process);
  tcase_add_test(tc, test_big_batch_default_limits);
  tcase_add_test(tc, test_bad_bags_named);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sr_check_run(multi_hot_suite()); }
