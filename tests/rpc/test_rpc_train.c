/* Training against shard servers gives the same bits as in process: one
 * run (seed, data, model) in process, against 1 server, against 3 servers
 * table-wise and 3 row-wise; per-step losses and test AUC compared
 * exactly. A server that stays down is named in the error; servers
 * SIGKILLed mid-training are recovered from automatically. */
#include <check.h>

#include "tests/check_main.h"

#include "tests/support/servers.h"

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

/* Train 40 steps on plan, in process (servers NULL) or against servers,
 * with more flags extra; returns the metrics file without the timing
 * fields, and train's output in *log (NULL: not kept; caller frees). */
static char *train_with(const char *name, const char *plan, const char *servers,
                        const char *extra, char **log) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --num-batches 40 "
                         "--print-freq 1 --mini-batch-size 64 --optimizer adagrad "
                         "--learning-rate 0.01 --sparse-learning-rate 0.1 --plan %s --metrics-out %s.jsonl %s%s %s",
                   dir, bin_path(), plan, name, servers ? "--shard-servers " : "",
                   servers ? servers : "", extra);
  ck_assert_msg(rc == 0, "train %s failed: %s", name, out);
  if (log) *log = out;
  else free(out);
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

static char *train(const char *name, const char *plan, const char *servers) {
  return train_with(name, plan, servers, "", NULL);
}

/* Servers keep rows in RocksDB (--data-dir) with a cache, so this also
 * checks the shard store behind the service. Each configuration starts
 * from empty RocksDB folders (a server keeps its rows across restarts),
 * named after its plan: DIR/PLAN.srvK, DIR/PLAN.TAG.srvK. */

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
    servers_start(s, nsrv[c], &(servers_opts){.dir = dir, .plan = plans[c], .data = plans[c]});
    char list[256], name[32];
    servers_addrs(s, nsrv[c], list, sizeof list);
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

/* Two TCP connections per server (--rpc-connections 2: a server's calls go
 * round them) give the bits of one in sync mode: 3 servers row-wise (every
 * step calls each), per-step losses and the test figures compared exactly
 * between the two runs, each on fresh RocksDB folders. */
START_TEST(test_two_connections_same_bits) {
  char *got[2];
  for (int c = 0; c < 2; c++) {
    test_server s[3];
    char data[32], list[256], name[32], flags[64];
    snprintf(data, sizeof data, "p3r.json.c%d", c + 1);
    servers_start(s, 3, &(servers_opts){.dir = dir, .plan = "p3r.json", .data = data});
    servers_addrs(s, 3, list, sizeof list);
    snprintf(name, sizeof name, "conn%d", c + 1);
    snprintf(flags, sizeof flags, "--rpc-connections %d", c + 1);
    got[c] = train_with(name, "p3r.json", list, flags, NULL);
    for (int k = 0; k < 3; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  }
  int lines = 0;
  for (char *p = got[0]; *p; p++) lines += *p == '\n';
  ck_assert_int_eq(lines, 41); /* 40 train lines and the test line */
  ck_assert_msg(strcmp(got[0], got[1]) == 0, "2 connections:\n%s\nvs 1:\n%s", got[1], got[0]);
  free(got[0]);
  free(got[1]);
}
END_TEST

/* The done line's lookup figures: the wait per step, the time in flight
 * and the share hidden. */
static void lookup_figures(const char *out, double *wait, double *flight, double *hidden) {
  const char *d = strstr(out, "\ndone   ");
  const char *l = d ? strstr(d, ", lookup ") : NULL;
  ck_assert_msg(l && sscanf(l, ", lookup %lf (of %lf in flight, %lf%% hidden)", wait, flight,
                            hidden) == 3,
                "no lookup figures in the done line:\n%s", out);
}

/* The done line says how much of the lookups' time in flight (measured by
 * the remote store from when a step's Lookups went out to when its rows
 * were in hand) the trainer did not wait for. At --prefetch-depth 0 a step
 * sends its Lookups and waits at once: nothing hidden, in flight what was
 * waited. At depth 2 the next step's Lookups go out once this step's push
 * is answered and are in flight while the dense optimizer and the next
 * batch's input work run: some of it hidden, the figures agreeing with
 * each other (hidden = 1 - wait / in flight, printed to 2 decimals). The
 * metrics file has the time in flight beside the phases. */
START_TEST(test_lookup_hidden_share) {
  double w[2], f[2], h[2];
  const int depth[2] = {0, 2};
  for (int c = 0; c < 2; c++) {
    test_server s[1];
    char data[32], name[32], flags[64], *log;
    snprintf(data, sizeof data, "p1.json.d%d", depth[c]);
    servers_start(s, 1, &(servers_opts){.dir = dir, .plan = "p1.json", .data = data});
    snprintf(name, sizeof name, "depth%d", depth[c]);
    snprintf(flags, sizeof flags, "--prefetch-depth %d", depth[c]);
    free(train_with(name, "p1.json", s[0].addr, flags, &log));
    ck_assert_int_eq(server_stop(&s[0]), 0);
    lookup_figures(log, &w[c], &f[c], &h[c]);
    free(log);
    ck_assert_msg(f[c] > 0 && h[c] >= 0 && h[c] <= 100, "depth %d: %g ms of %g, %g%% hidden",
                  depth[c], w[c], f[c], h[c]);
    char *n;
    ck_assert_int_eq(run_cmd(&n, "grep -c '\"lookup_in_flight_ms\":' %s/%s.jsonl", dir, name), 0);
    ck_assert_int_ge(atoi(n), 40);
    free(n);
  }
  ck_assert_msg(h[0] == 0 && f[0] <= w[0] + 0.01, "depth 0: %g ms waited of %g in flight, %g%% hidden",
                w[0], f[0], h[0]);
  const double want = 100 * (1 - w[1] / f[1]), slack = 1 + 100 * 0.01 / f[1];
  ck_assert_msg(h[1] > 0 && f[1] + 0.01 >= w[1] && h[1] >= want - slack && h[1] <= want + slack,
                "depth 2: %g ms waited of %g in flight, %g%% hidden", w[1], f[1], h[1]);
}
END_TEST

/* A step above the server's limits is never refused: the remote store
 * reads them from Stats and cuts every Lookup and Push to fit (a push in
 * parts the server takes as one). 26 tables x 64 samples = 1664 ids a
 * step: against --max-ids 300 (6 calls each way), and against a 1 MiB
 * budget (a call's share at most an eighth of it), the losses are the
 * in-process run's, bit for bit. */
START_TEST(test_limits_split) {
  char *ref = train("local", "p1.json", NULL);
  const char *flags[2] = {"--max-ids 300", "--max-message-mb 1 --inflight-mb 1"};
  for (int c = 0; c < 2; c++) {
    test_server s;
    char args[1200], log[600], name[32];
    snprintf(args, sizeof args, "--plan '%s/p1.json' --shard 0 --cache-rows 4096 --data-dir '%s/lim%d' %s",
             dir, dir, c, flags[c]);
    snprintf(log, sizeof log, "%s/lim%d.log", dir, c);
    server_start(&s, args, log);
    snprintf(name, sizeof name, "lim%d", c);
    char *got = train(name, "p1.json", s.addr);
    ck_assert_int_eq(server_stop(&s), 0);
    ck_assert_msg(strcmp(ref, got) == 0, "against a server with %s:\n%s\nvs in process:\n%s",
                  flags[c], got, ref);
    free(got);
  }
  free(ref);
}
END_TEST

START_TEST(test_server_down_is_named) {
  test_server s[1];
  servers_start(s, 1, &(servers_opts){.dir = dir, .plan = "p1.json", .data = "p1.json"});
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
  servers_start(s, 1, &(servers_opts){.dir = dir, .plan = "p1.json", .data = "p1.json"});
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


/* dir/name, in a static buffer (one at a time). */
static const char *at(const char *name) {
  static char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return path;
}

/* Whether text is on the line that starts at line. */
static int in_line(const char *line, const char *text) {
  const char *p = strstr(line, text), *end = strchr(line, '\n');
  return p && (!end || p < end);
}

/* Automatic recovery: training against 3 servers with a checkpoint every 10
 * steps, acted on from outside. Once the trainer has printed step 14 it is
 * stopped (SIGSTOP, so it stays where it is), server 1 is SIGKILLed and
 * restarted on the same data dir and port, and the trainer continued: the
 * restarted server refuses to serve the rows the crash left (FAILED_PRECONDITION,
 * "rows not consistent after a crash") and the trainer takes that as a lost
 * server, not as a plan mismatch. Once it has printed step 24, server 2 is
 * SIGKILLed and restarted only when the trainer says it is restoring the
 * servers and waiting for them: its calls to server 2 ended UNAVAILABLE.
 * Both times it restores every server and itself from the newest
 * checkpoint (step 10, then 20: the stop lands within a step or two of the
 * printed step, six steps before the next checkpoint) and carries on; the last
 * occurrence of each step's loss equals the uninterrupted run's, bit for
 * bit. */
START_TEST(test_server_kill_recovers) {
  char *ref = train("local", "p3r.json", NULL);
  test_server s[3];
  const servers_opts p3r = {.dir = dir, .plan = "p3r.json", .data = "p3r.json"}; /* restarts too */
  servers_start(s, 3, &p3r);
  char list[256];
  servers_addrs(s, 3, list, sizeof list);
  pid_t tr = spawn_sh("cd '%s' && exec '%s' train --processed-data-file d.bin --num-batches 40 "
                      "--print-freq 1 --mini-batch-size 64 --optimizer adagrad --learning-rate 0.01 "
                      "--sparse-learning-rate 0.1 --plan p3r.json --metrics-out rec.jsonl "
                      "--shard-servers %s --save-checkpoint ck --checkpoint-every 10 "
                      "--recover-timeout 60 --rpc-deadline 30 > rec.out 2>&1",
                      dir, bin_path(), list);
  char port[3][16], log_path[600];
  for (int k = 0; k < 3; k++) snprintf(port[k], sizeof port[k], "%s", strrchr(s[k].addr, ':') + 1);
  snprintf(log_path, sizeof log_path, "%s", at("rec.out"));
  /* stdout is flushed at every printed step; the metrics file is not. */
  wait_text(log_path, "train  step 14/40 ", 1, tr, 240);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  server_restart(&s[1], 1, &p3r);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  /* Step 24 comes after the first recovery (steps from 11 on run again). */
  wait_text(log_path, "train  step 24/40 ", 1, tr, 240);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  server_kill9(&s[2]);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  wait_text(log_path, "restoring every shard server from ", 2, tr, 240);
  server_start_shard(&s[2], 2, &p3r, port[2]);
  int st = wait_exit(tr, 400);
  for (int k = 0; k < 3; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  char *log = slurp(log_path);
  ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "train failed:\n%s", log);
  /* The first recovery is the restart seen; the second the calls that
   * failed while server 2 was down, naming it. */
  const char *r1 = strstr(log, "recovered from ck/step-10 after: ");
  const char *r2 = r1 ? strstr(r1, "recovered from ck/step-20 after: ") : NULL;
  ck_assert_msg(r1 && r2, "%s", log);
  ck_assert_msg(in_line(r1, "restarted after a crash") &&
                    in_line(r1, "rows not consistent after a crash") && in_line(r1, s[1].addr),
                "the first recovery is not the restart of server 1 (%s):\n%s", s[1].addr, log);
  ck_assert_msg(in_line(r2, "UNAVAILABLE") && in_line(r2, s[2].addr),
                "the second recovery is not server 2 (%s) unavailable:\n%s", s[2].addr, log);
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

/* Without a checkpoint a lost server ends the run with its name: once the
 * trainer has printed step 3 it is stopped, its server SIGKILLed and
 * restarted on the same port, and the trainer continued; it sees the
 * restart and stops. */
START_TEST(test_server_lost_without_checkpoint) {
  test_server s[1];
  const servers_opts p1 = {.dir = dir, .plan = "p1.json", .data = "p1.json"}; /* the restart too */
  servers_start(s, 1, &p1);
  /* 40 steps: far more than can run between the printed step 3 and the stop. */
  pid_t tr = spawn_sh("cd '%s' && exec '%s' train --processed-data-file d.bin --num-batches 40 "
                      "--print-freq 1 --plan p1.json --shard-servers %s > nock.out 2>&1",
                      dir, bin_path(), s[0].addr);
  char log_path[600];
  snprintf(log_path, sizeof log_path, "%s", at("nock.out"));
  wait_text(log_path, "train  step 3/40 ", 1, tr, 240);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  server_restart(&s[0], 0, &p1);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  int st = wait_exit(tr, 400);
  ck_assert_int_eq(server_stop(&s[0]), 0);
  char *log = slurp(log_path);
  ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(log, s[0].addr) &&
                    strstr(log, "restarted") && strstr(log, "no checkpoint to recover from") &&
                    !strstr(log, "train  step 40/40"),
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
  tcase_add_test(tc, test_two_connections_same_bits);
  tcase_add_test(tc, test_lookup_hidden_share);
  tcase_add_test(tc, test_server_down_is_named);
  tcase_add_test(tc, test_limits_split);
  tcase_add_test(tc, test_server_kill_recovers);
  tcase_add_test(tc, test_server_lost_without_checkpoint);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
