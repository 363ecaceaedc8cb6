/* Training against shard servers gives the same bits as in process: one
 * run (seed, data, model) in process, against 1 server, against 3 servers
 * table-wise and 3 row-wise; per-step losses and test AUC compared
 * exactly. A server that stays down is named in the error; servers
 * SIGKILLed mid-training are recovered from automatically. */
#include <check.h>

#include "tests/check_main.h"

#include "tests/rpc/server.h"

static char *dir;

static void setup(void) {
  dir = make_data_dir(12000, 3,
                      "%s train --processed-data-file d.bin --num-batches 1 --seed 11 --plan-out p1.json && "
                      "/usr/bin/python3 -c \"\n"
                      "import json\n"
                      "p = json.load(open('p1.json'))\n"
                      "p['n_shards'] = 3\n"
                      "for i, t in enumerate(p['tables']): t['placement'] = {'kind': 'table', 'shards': [i %% 3]}\n"
                      "json.dump(p, open('p3t.json', 'w'), indent=1)\n"
                      "for t in p['tables']: t['placement'] = {'kind': 'row', 'shards': [0, 1, 2]}\n"
                      "json.dump(p, open('p3r.json', 'w'), indent=1)\n\"",
                      bin_path());
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

/* (Re)start server k of plan on its own data dir; port NULL: any. */
static void start_one(test_server *s, int k, const char *plan, const char *port) {
  char args[1400], log[600];
  snprintf(args, sizeof args,
           "--plan '%s/%s' --shard %d --cache-rows 4096 --data-dir '%s/%s.srv%d'%s%s", dir, plan,
           k, dir, plan, k, port ? " --listen 127.0.0.1:" : "", port ? port : "");
  snprintf(log, sizeof log, "%s/srv%d.log", dir, k);
  server_start(s, args, log);
}

static void kill9(test_server *s) {
  kill(s->pid, SIGKILL);
  int st;
  waitpid(s->pid, &st, 0);
  s->pid = 0;
}

static void wait_file(const char *name, double secs) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  double t0 = test_now();
  while (access(path, F_OK) != 0) {
    ck_assert_msg(test_now() - t0 < secs, "%s did not appear in %.0f s", path, secs);
    usleep(20000);
  }
}

static void touch(const char *name) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
}

/* Automatic recovery: training against 3 servers with a checkpoint every 10
 * steps. After step 15 (the trainer paused by its test hook) server 1 is
 * SIGKILLed and restarted at once on the same data dir and port: the
 * trainer sees the new incarnation. After step 27 server 2 is SIGKILLed and
 * restarted only 8 s later: the trainer's calls end UNAVAILABLE and it
 * waits for the server. Both times it restores every server and itself from
 * the newest checkpoint (step 10, then 20) and carries on; the last
 * occurrence of each step's loss equals the uninterrupted run's, bit for
 * bit. */
START_TEST(test_server_kill_recovers) {
  char *ref = train("local", "p3r.json", NULL);
  test_server s[3];
  for (int k = 0; k < 3; k++) start_one(&s[k], k, "p3r.json", NULL);
  char list[256];
  addr_list(s, 3, list, sizeof list);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && SHARDREC_TEST_PAUSE='%s/pause:15,27' exec '%s' train --processed-data-file "
           "d.bin --num-batches 40 --print-freq 1 --mini-batch-size 64 --optimizer adagrad "
           "--learning-rate 0.01 --sparse-learning-rate 0.1 --plan p3r.json --metrics-out rec.jsonl "
           "--shard-servers %s --save-checkpoint ck --checkpoint-every 10 --recover-timeout 60 "
           "--rpc-deadline 30 > rec.out 2>&1",
           dir, dir, bin_path(), list);
  pid_t tr = fork();
  ck_assert_int_ge(tr, 0);
  if (tr == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  char port[3][16];
  for (int k = 0; k < 3; k++) snprintf(port[k], sizeof port[k], "%s", strrchr(s[k].addr, ':') + 1);
  wait_file("pause-15.wait", 240);
  kill9(&s[1]);
  start_one(&s[1], 1, "p3r.json", port[1]);
  touch("pause-15.go");
  wait_file("pause-27.wait", 240);
  kill9(&s[2]);
  touch("pause-27.go");
  usleep(8 * 1000 * 1000);
  start_one(&s[2], 2, "p3r.json", port[2]);
  int st = 0;
  double t0 = test_now();
  pid_t got;
  while ((got = waitpid(tr, &st, WNOHANG)) == 0 && test_now() - t0 < 400) usleep(20000);
  if (got == 0) {
    kill(tr, SIGKILL);
    waitpid(tr, &st, 0);
  }
  for (int k = 0; k < 3; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  char path[600];
  snprintf(path, sizeof path, "%s/rec.out", dir);
  char *log = slurp(path);
  ck_assert_msg(got == tr && WIFEXITED(st) && WEXITSTATUS(st) == 0, "train failed:\n%s", log);
  ck_assert_msg(strstr(log, "recovered from ") && strstr(log, "ck/step-10 after: ") &&
                    strstr(log, "ck/step-20 after: ") && strstr(log, "restarted (incarnation"),
                "%s", log);
  free(log);
  /* The final occurrence of each step, in step order. */
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json\n"
                         "last = {}\n"
                         "for l in open('rec.jsonl'):\n"
                         "    j = json.loads(l)\n"
                         "    last[(j['step'], j['kind'] == 'test')] = j\n"
                         "for k in sorted(last):\n"
                         "    j = last[k]\n"
                         "    print(j['kind'], j['step'], j.get('loss'), j.get('last_loss'), j.get('auc'), j.get('logloss'))\"",
                   dir);
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_msg(strcmp(ref, out) == 0, "recovered run:\n%s\nuninterrupted:\n%s", out, ref);
  free(out);
  free(ref);
}
END_TEST

/* Without a checkpoint a lost server ends the run with its name. */
START_TEST(test_server_lost_without_checkpoint) {
  test_server s[1];
  start_one(&s[0], 0, "p1.json", NULL);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && SHARDREC_TEST_PAUSE='%s/pause:3' exec '%s' train --processed-data-file "
           "d.bin --num-batches 6 --plan p1.json --shard-servers %s > nock.out 2>&1",
           dir, dir, bin_path(), s[0].addr);
  pid_t tr = fork();
  ck_assert_int_ge(tr, 0);
  if (tr == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  char port[16];
  snprintf(port, sizeof port, "%s", strrchr(s[0].addr, ':') + 1);
  wait_file("pause-3.wait", 240);
  kill9(&s[0]);
  start_one(&s[0], 0, "p1.json", port);
  touch("pause-3.go");
  int st = 0;
  waitpid(tr, &st, 0);
  ck_assert_int_eq(server_stop(&s[0]), 0);
  char path[600];
  snprintf(path, sizeof path, "%s/nock.out", dir);
  char *log = slurp(path);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(log, s[0].addr) &&
                    strstr(log, "restarted") && strstr(log, "no checkpoint to recover from"),
                "%s", log);
  free(log);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_remote_equals_in_process);
  tcase_add_test(tc, test_server_down_is_named);
  tcase_add_test(tc, test_server_kill_recovers);
  tcase_add_test(tc, test_server_lost_without_checkpoint);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
