/* Training against shard servers gives the same bits as in process: one
 * run (seed, data, model) in process, against 1 server, against 3 servers
 * table-wise and 3 row-wise; per-step losses and test AUC compared
 * exactly. Then a server restart in the middle of nothing: the trainer's
 * channel reconnects; a server that stays down is named in the error. */
#include <check.h>

#include "tests/rpc/server.h"

static char *dir;

static void setup(void) {
  dir = make_tmpdir();
  char *out;
  int rc = run_cmd(&out,
                   "cd %s && %s datagen --rows 12000 --seed 3 --out d.tsv && "
                   "%s convert --test-fraction 0.1 d.tsv d.bin && "
                   "%s train --processed-data-file d.bin --num-batches 1 --seed 11 --plan-out p1.json && "
                   "/usr/bin/python3 -c \"\n"
                   "import json\n"
                   "p = json.load(open('p1.json'))\n"
                   "p['n_shards'] = 3\n"
                   "for i, t in enumerate(p['tables']): t['placement'] = {'kind': 'table', 'shards': [i %% 3]}\n"
                   "json.dump(p, open('p3t.json', 'w'), indent=1)\n"
                   "for t in p['tables']: t['placement'] = {'kind': 'row', 'shards': [0, 1, 2]}\n"
                   "json.dump(p, open('p3r.json', 'w'), indent=1)\n\"",
                   dir, bin_path(), bin_path(), bin_path());
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  free(out);
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Train 40 steps on plan, in process (servers NULL) or against servers;
 * returns the metrics file without the timing fields. */
static char *train(const char *name, const char *plan, const char *servers) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 40 "
                         "--print-freq 1 --mini-batch-size 64 --optimizer adagrad "
                         "--learning-rate 0.01 --sparse-learning-rate 0.1 --plan %s --metrics-out %s.jsonl %s%s",
                   dir, bin_path(), plan, name, servers ? "--shard-servers " : "",
                   servers ? servers : "");
  ck_assert_msg(rc == 0, "train %s failed: %s", name, out);
  free(out);
  /* Keep only the kind, step, loss and the test metrics of each line. */
  rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                     "import json\n"
                     "for l in open('%s.jsonl'):\n"
                     "    j = json.loads(l)\n"
                     "    print(j['kind'], j['step'], j.get('loss'), j.get('last_loss'), j.get('auc'), j.get('logloss'))\"",
               dir, name);
  ck_assert_msg(rc == 0, "%s", out);
  return out;
}

/* Servers keep rows in RocksDB (--data-dir) with a cache, so this also
 * checks the shard store behind the service. */
static void start_servers(test_server *s, int n, const char *plan) {
  for (int k = 0; k < n; k++) {
    char args[1200], log[600];
    /* Each configuration starts from empty RocksDB folders: a server keeps
     * its rows across restarts. */
    snprintf(args, sizeof args, "--plan '%s/%s' --shard %d --cache-rows 4096 --data-dir '%s/%s.srv%d'", dir, plan, k,
             dir, plan, k);
    snprintf(log, sizeof log, "%s/srv%d.log", dir, k);
    server_start(&s[k], args, log);
  }
}

static void addr_list(test_server *s, int n, char *buf, size_t len) {
  size_t at = 0;
  for (int k = 0; k < n; k++) at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? "," : "", s[k].addr);
}

START_TEST(test_remote_equals_in_process) {
  char *ref = train("local", "p1.json", NULL);
  int lines = 0;
  for (char *p = ref; *p; p++) lines += *p == '\n';
  ck_assert_int_eq(lines, 41); /* 40 train lines and the test line */
  ck_assert_ptr_nonnull(strstr(ref, "test 40 None None 0."));
  /* The comparison can fail: another seed differs. */
  const char *plans[3] = {"p1.json", "p3t.json", "p3r.json"};
  const int nsrv[3] = {1, 3, 3};
  for (int c = 0; c < 3; c++) {
    test_server s[3];
    start_servers(s, nsrv[c], plans[c]);
    char list[256], name[32];
    addr_list(s, nsrv[c], list, sizeof list);
    snprintf(name, sizeof name, "remote%d", c);
    char *got = train(name, plans[c], list);
    for (int k = 0; k < nsrv[c]; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
    ck_assert_msg(strcmp(ref, got) == 0, "%s against %d server(s) differs:\n%s\nvs in process:\n%s",
                  plans[c], nsrv[c], got, ref);
    free(got);
  }
  /* The in-process run under the 3-shard plans also agrees (placement
   * changes no bits). */
  char *t3 = train("local3r", "p3r.json", NULL);
  ck_assert_str_eq(ref, t3);
  free(t3);
  free(ref);
}
END_TEST

START_TEST(test_server_down_is_named) {
  test_server s[1];
  start_servers(s, 1, "p1.json");
  char addr[64];
  snprintf(addr, sizeof addr, "%s", s[0].addr);
  ck_assert_int_eq(server_stop(&s[0]), 0);
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 3 --plan p1.json "
                         "--shard-servers %s --rpc-deadline 2",
                   dir, bin_path(), addr);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, addr) && strstr(out, "UNAVAILABLE") && strstr(out, "shard 0"), "%s", out);
  free(out);
  /* Another plan's fingerprint is refused with a clear message. */
  start_servers(s, 1, "p1.json");
  rc = run_cmd(&out, "cd %s && sed 's/\"seed\": \"11\"/\"seed\": \"12\"/' p1.json > p1b.json && "
                     "grep -q '\"12\"' p1b.json && %s train --processed-data-file d.bin --num-batches 3 "
                     "--plan p1b.json --shard-servers %s",
               dir, bin_path(), s[0].addr);
  ck_assert_int_eq(server_stop(&s[0]), 0);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "FAILED_PRECONDITION") && strstr(out, "plan"), "%s", out);
  free(out);
}
END_TEST

/* Shard servers SIGKILLed after a checkpoint: restarted on empty folders,
 * the trainer resumes from the checkpoint (the servers restore their rows
 * from it) and continues with exactly the losses of an uninterrupted run. */
START_TEST(test_server_kill_resume) {
  test_server s[3];
  start_servers(s, 3, "p3r.json");
  char list[256];
  addr_list(s, 3, list, sizeof list);
  char *full = train("full", "p3r.json", list);
  for (int k = 0; k < 3; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  /* 20 steps and a checkpoint, against fresh servers. */
  run_cmd(NULL, "rm -rf %s/p3r.json.srv*", dir);
  start_servers(s, 3, "p3r.json");
  addr_list(s, 3, list, sizeof list);
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 20 "
                         "--print-freq 1 --mini-batch-size 64 --optimizer adagrad "
                         "--learning-rate 0.01 --sparse-learning-rate 0.1 --plan p3r.json "
                         "--shard-servers %s --save-checkpoint ck",
                   dir, bin_path(), list);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  for (int k = 0; k < 3; k++) {
    kill(s[k].pid, SIGKILL);
    int st;
    waitpid(s[k].pid, &st, 0);
    s[k].pid = 0;
  }
  run_cmd(NULL, "rm -rf %s/p3r.json.srv*", dir);
  start_servers(s, 3, "p3r.json");
  addr_list(s, 3, list, sizeof list);
  char extra[400];
  snprintf(extra, sizeof extra, "%s --resume ck", list);
  char *res = train("resumed", "p3r.json", extra);
  for (int k = 0; k < 3; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  /* The resumed run prints steps 21..40 and the test line: the tail of the
   * full run. */
  const char *tail = strstr(full, "train 21 ");
  ck_assert_ptr_nonnull(tail);
  ck_assert_msg(strcmp(tail, res) == 0, "resumed:\n%s\nuninterrupted:\n%s", res, tail);
  free(full);
  free(res);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_remote_equals_in_process);
  tcase_add_test(tc, test_server_down_is_named);
  tcase_add_test(tc, test_server_kill_resume);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
