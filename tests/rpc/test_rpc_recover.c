/* Automatic recovery, end to end on loopback: real `shardrec serve`
 * processes, real RocksDB folders, real `mpirun -np 2` ranks, faults
 * injected from outside at a step the test sees printed.
 *   - step 0: a server SIGKILLed (and restarted on its port and folder)
 *     before the first periodic checkpoint rewinds a one-rank run to the
 *     step-0 checkpoint written before training;
 *   - a chain: a server SIGKILLed after the third increment of a chain
 *     (--full-checkpoint-every 4) is recovered from by restoring every
 *     server from the chain, the full checkpoint then each increment;
 *   - bounded tables: a server SIGKILLed mid-run is recovered from with the
 *     tables' admission and expiry state of the checkpoint, and the run
 *     ends with the uninterrupted run's keep.bin too;
 *   - two ranks: a server SIGKILLed mid-run (restarted on its port) is
 *     recovered from by both ranks of `mpirun -np 2`, which restore every
 *     server from the newest checkpoint and go on;
 *   - evaluation: a server SIGKILLed during a --test-freq pass (one rank,
 *     and two) is recovered from the same way, and the pass runs again;
 *   - --auto-resume: the trainer SIGKILLed after a checkpoint is complete
 *     and the same command run again resumes from it; a fresh folder starts
 *     fresh;
 *   - partitions (a server stopped): shorter than the retries' budget, a
 *     log line and nothing else; longer, a lost server, recovered from.
 * Every time the run ends by itself with status 0, and its final losses
 * (the last occurrence of each step in the metrics file) and test AUC equal
 * an uninterrupted run's, bit for bit. */
#include <check.h>
#include <sys/stat.h>

#include "tests/check_main.h"

#include "tests/support/servers.h"

#define ARCH "--arch-mlp-bot 13-16-16 --arch-mlp-top 32-1"
#define HYPER "--optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1"
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe"
#define COMMON "--plan p.json " ARCH " " HYPER " --mini-batch-size 64 --print-freq 1"
#define D "--processed-data-file d.bin "

static char *dir;

/* d.bin (6000 rows, a tenth for test), e.bin (the same rows, half for
 * test: a long evaluation), p.json (2 shards). */
static void setup(void) {
  dir = make_data_dir(6000, 5,
                      "%s convert --test-fraction 0.5 d.tsv e.bin && "
                      "%s train --processed-data-file d.bin --num-batches 1 --num-shards 2 " ARCH
                      " --plan-out p.json",
                      bin_path(), bin_path());
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* dir/name, in a static buffer (one at a time). */
static const char *at(const char *name) {
  static char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return path;
}

/* The servers of p.json: rows in RocksDB under dir/tag.srvK when disk,
 * else in memory; logs dir/tag.srvK.log. */
static servers_opts srv_opts(const char *tag, int disk) {
  return (servers_opts){.dir = dir, .plan = "p.json", .data = disk ? tag : NULL, .log = tag,
                        .flags = "--threads 2"};
}

/* Two servers as srv_opts says; their addresses joined by ',' into addrs. */
static void start_two(test_server *s, const char *tag, int disk, char *addrs, size_t len) {
  servers_opts o = srv_opts(tag, disk);
  servers_start(s, 2, &o);
  servers_addrs(s, 2, addrs, len);
}

/* SIGKILL server s (shard k) and start it again on its port (and folder). */
static void restart(test_server *s, int k, const char *tag, int disk) {
  servers_opts o = srv_opts(tag, disk);
  server_restart(s, k, &o);
}

/* The last occurrence of each step's train line and test line of the
 * metrics files (names, space-separated, read in order): kind, step, loss,
 * last_loss, auc, logloss per line, in step order. */
static char *final_lines(const char *names) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json, sys\n"
                         "last = {}\n"
                         "for f in sys.argv[1:]:\n"
                         "    for l in open(f):\n"
                         "        j = json.loads(l)\n"
                         "        last[(j['step'], j['kind'] == 'test')] = j\n"
                         "for k in sorted(last):\n"
                         "    j = last[k]\n"
                         "    print(j['kind'], j['step'], j.get('loss'), j.get('last_loss'), j.get('auc'), j.get('logloss'))\" %s",
                   dir, names);
  ck_assert_msg(rc == 0, "%s", out);
  return out;
}

/* The metrics file got holds the lines of the file ref, kind and step, in
 * its order: a recovery cut its file back to the checkpoint's step before
 * the steps ran again (no step's line twice). */
static void same_line_steps(const char *ref, const char *got) {
  char *out;
  int rc = run_cmd(&out, "cd %s && /usr/bin/python3 -c \"\n"
                         "import json, sys\n"
                         "k = lambda f: [(j['kind'], j['step']) for j in map(json.loads, open(f))]\n"
                         "a, b = k(sys.argv[1]), k(sys.argv[2])\n"
                         "assert a == b, (len(a), len(b), [x for x in b if b.count(x) > 1][:6])\" %s %s",
                   dir, ref, got);
  ck_assert_msg(rc == 0, "%s and %s: %s", ref, got, out);
  free(out);
}

/* A run of bounded tables that recovered, against the uninterrupted run:
 * its log out says it recovered from from, the keep.bin of the last step
 * (step) of its checkpoint folder got_ck is ref_ck's byte for byte, and
 * its metrics file got_m ends as ref_m (shown from the first line that
 * differs) with ref_m's lines in order. */
static void recovered_as_uninterrupted(const char *out, const char *from, const char *ref_ck,
                                       const char *got_ck, int step, const char *ref_m,
                                       const char *got_m) {
  char *log = slurp(at(out)), want[128];
  snprintf(want, sizeof want, "recovered from %s after: ", from);
  ck_assert_msg(strstr(log, want), "no recovery from %s:\n%s", from, log);
  free(log);
  char *cmp;
  int rc = run_cmd(&cmp, "cd %s && cmp %s/step-%d/keep.bin %s/step-%d/keep.bin", dir, ref_ck, step,
                   got_ck, step);
  ck_assert_msg(rc == 0, "the bounded tables' state after the recovery differs: %s", cmp);
  free(cmp);
  char *ref = final_lines(ref_m), *got = final_lines(got_m);
  size_t first = 0; /* the first line that differs, and a few after it */
  for (size_t i = 0; ref[i] && ref[i] == got[i]; i++)
    if (ref[i] == '\n') first = i + 1;
  ck_assert_msg(strcmp(ref, got) == 0, "recovered run, from its first difference:\n%.1500s\n"
                "uninterrupted:\n%.1500s", got + first, ref + first);
  same_line_steps(ref_m, got_m);
  free(got);
  free(ref);
}

/* Lines of text starting with "test " (the test passes). */
static int test_lines(const char *text) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, "test ")); p++)
    n += p == text || p[-1] == '\n';
  return n;
}

/* A run that ends by itself with status 0 (its output in the file out). */
static void assert_ok(pid_t pid, const char *out) {
  int st = wait_exit(pid, 300);
  char *log = slurp(at(out));
  ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "train failed:\n%s",
                log ? log : "(no output)");
  free(log);
}

/* The uninterrupted run (in process: placement and servers change no
 * bits; or np ranks against fresh in-memory servers) of flags. */
static char *reference(const char *name, int np, const char *flags) {
  char *out, addrs[200] = "";
  test_server s[2];
  if (np > 1) start_two(s, name, 0, addrs, sizeof addrs);
  int rc = run_cmd(&out, "cd %s && %s%s %s train " COMMON " %s --metrics-out %s.jsonl%s%s", dir,
                   np > 1 ? MPIRUN " -np " : "", np > 1 ? "2" : "", bin_path(), flags, name,
                   np > 1 ? " --shard-servers " : "", addrs);
  if (np > 1)
    for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  ck_assert_msg(rc == 0, "%s: %s", name, out);
  free(out);
  char file[64];
  snprintf(file, sizeof file, "%s.jsonl", name);
  return final_lines(file);
}

/* Before the first periodic checkpoint (every 20 steps), once step 5 is
 * printed: the trainer stopped (SIGSTOP), server 1 SIGKILLed and restarted
 * on its port and RocksDB folder (which it refuses to serve until a
 * Restore), the trainer continued. It restores every server from the
 * step-0 checkpoint and runs again from the start. */
START_TEST(test_step0_checkpoint_recovers) {
  char *ref = reference("ref0", 1, D "--num-batches 30");
  test_server s[2];
  char addrs[200];
  start_two(s, "s0", 1, addrs, sizeof addrs);
  pid_t tr = spawn_sh("cd '%s' && exec '%s' train " COMMON " " D "--num-batches 30 --metrics-out r0.jsonl "
                      "--shard-servers %s --save-checkpoint ck0 --checkpoint-every 20 "
                      "--recover-timeout 60 > r0.out 2>&1",
                      dir, bin_path(), addrs);
  wait_text(at("r0.out"), "train  step 5/30 ", 1, tr, 120);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  restart(&s[1], 1, "s0", 1);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  assert_ok(tr, "r0.out");
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  char *log = slurp(at("r0.out"));
  const char *rec = strstr(log, "recovered from ck0/step-0 after: ");
  ck_assert_msg(rec && strstr(rec, "restarted") && strstr(rec, s[1].addr),
                "no recovery from the step-0 checkpoint:\n%s", log);
  free(log);
  char *got = final_lines("r0.jsonl");
  ck_assert_msg(strcmp(ref, got) == 0, "recovered run:\n%s\nuninterrupted:\n%s", got, ref);
  free(got);
  free(ref);
}
END_TEST

/* One rank, 2 RocksDB servers, a checkpoint every 5 steps, every 4th full
 * (step-0 full, step-5, -10 and -15 increments): once step 17 is printed,
 * the trainer stopped, server 0 SIGKILLed and restarted on its port and
 * folder, the trainer continued. It restores every server from the chain
 * of step-15 (step-0's rows, then each increment laid over them) and goes
 * on with the uninterrupted run's bits. */
START_TEST(test_chain_recovers) {
  char *ref = reference("refc", 1, D "--num-batches 30");
  test_server s[2];
  char addrs[200];
  start_two(s, "sc", 1, addrs, sizeof addrs);
  pid_t tr = spawn_sh("cd '%s' && exec '%s' train " COMMON " " D "--num-batches 30 --metrics-out rc.jsonl "
                      "--shard-servers %s --save-checkpoint ckc --checkpoint-every 5 "
                      "--full-checkpoint-every 4 --recover-timeout 60 > rc.out 2>&1",
                      dir, bin_path(), addrs);
  wait_text(at("rc.out"), "train  step 17/30 ", 1, tr, 120);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  restart(&s[0], 0, "sc", 1);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  assert_ok(tr, "rc.out");
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  char *log = slurp(at("rc.out"));
  ck_assert_msg(strstr(log, "recovered from ckc/step-15 after: ") && strstr(log, s[0].addr),
                "no recovery from the step-15 chain naming server 0:\n%s", log);
  free(log);
  char *out;
  int rc = run_cmd(&out, "cd %s && %s inspect ckc/step-15", dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "a chain of 4 links"), "%.1500s", out);
  free(out);
  char *got = final_lines("rc.jsonl");
  ck_assert_msg(strcmp(ref, got) == 0, "recovered run:\n%s\nuninterrupted:\n%s", got, ref);
  free(got);
  free(ref);
}
END_TEST

/* Bounded tables (admission after 3 samples, expiry after 4 steps, 60
 * rows a table) over 2 RocksDB servers, a checkpoint every 10 steps, a
 * progress line every 3: once step 27 is printed, the trainer stopped,
 * server 1 SIGKILLed and restarted on its port and folder, the trainer
 * continued. It restores every server and the tables' admission and
 * expiry state from step-20 (the steps since, counted once already, are
 * counted as they run again) and the progress line's window (steps 19 and
 * 20, which step 21's line averages with it), and ends with the
 * uninterrupted run's lines and the same keep.bin, bit for bit. */
START_TEST(test_bounded_tables_recover) {
#define KEEP_COMMON "--plan pk.json " ARCH " " HYPER " --mini-batch-size 64 --print-freq 3 " D \
                    "--num-batches 40 --checkpoint-every 10"
  char *out;
  int rc = run_cmd(&out, "cd %s && %s plan --processed-data-file d.bin --num-shards 2 --row-wise "
                         "--admit-after 3 --expire-after 4 --capacity 60 --out pk.json && "
                         "%s train " KEEP_COMMON " --metrics-out refk.jsonl --save-checkpoint refk",
                   dir, bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  test_server s[2];
  char addrs[200];
  servers_opts o = {.dir = dir, .plan = "pk.json", .data = "sk", .log = "sk",
                    .flags = "--threads 2"};
  servers_start(s, 2, &o);
  servers_addrs(s, 2, addrs, sizeof addrs);
  pid_t tr = spawn_sh("cd '%s' && exec '%s' train " KEEP_COMMON " --metrics-out rk.jsonl "
                      "--shard-servers %s --save-checkpoint ckk --recover-timeout 60 > rk.out 2>&1",
                      dir, bin_path(), addrs);
  wait_text(at("rk.out"), "train  step 27/40 ", 1, tr, 120);
  ck_assert_int_eq(kill(tr, SIGSTOP), 0);
  server_restart(&s[1], 1, &o);
  ck_assert_int_eq(kill(tr, SIGCONT), 0);
  assert_ok(tr, "rk.out");
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  recovered_as_uninterrupted("rk.out", "ckk/step-20", "refk", "ckk", 40, "refk.jsonl", "rk.jsonl");
#undef KEEP_COMMON
}
END_TEST

/* The same bounded tables with mpirun -np 2 against 2 servers (rows in
 * memory, a progress line every step, a checkpoint every 40 steps: the
 * recovery replays 35 steps or more): once the metrics file has step 75,
 * both ranks stopped, server 1 SIGKILLed and restarted on its port, the
 * ranks continued. Every rank forgets the step boundaries whose removals
 * it saw done, as rank 0's Restore does: one that kept them sent the
 * replayed steps' look-ahead Lookups before rank 0's removals at their
 * boundaries, and read rows removed there. The run ends with the
 * uninterrupted 2-rank run's lines and keep.bin, bit for bit. */
START_TEST(test_two_ranks_bounded_recover) {
#define KEEP2 "--plan pk.json " ARCH " " HYPER " --mini-batch-size 64 --print-freq 1 " D \
              "--num-batches 80 --checkpoint-every 40"
  char *out;
  int rc = run_cmd(&out, "cd %s && %s plan --processed-data-file d.bin --num-shards 2 --row-wise "
                         "--admit-after 3 --expire-after 4 --capacity 60 --out pk.json",
                   dir, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  test_server s[2];
  char addrs[200];
  servers_opts o = {.dir = dir, .plan = "pk.json", .log = "k2"};
  servers_start(s, 2, &o);
  servers_addrs(s, 2, addrs, sizeof addrs);
  rc = run_cmd(&out, "cd %s && " MPIRUN " -np 2 %s train " KEEP2 " --metrics-out ref2k.jsonl "
               "--shard-servers %s --save-checkpoint ref2k", dir, bin_path(), addrs);
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  servers_start(s, 2, &o);
  servers_addrs(s, 2, addrs, sizeof addrs);
  pid_t job = spawn_sh("cd '%s' && exec " MPIRUN " -np 2 '%s' train " KEEP2 " --metrics-out "
                       "r2k.jsonl --shard-servers %s --save-checkpoint ck2k --recover-timeout 60 "
                       "> r2k.out 2>&1", dir, bin_path(), addrs);
  pid_t r0 = mpi_rank_pid(job, 0, 120), r1 = mpi_rank_pid(job, 1, 120);
  wait_text(at("r2k.jsonl"), "\"step\":75,", 1, job, 120);
  ck_assert_int_eq(kill(r0, SIGSTOP), 0);
  ck_assert_int_eq(kill(r1, SIGSTOP), 0);
  server_restart(&s[1], 1, &o);
  ck_assert_int_eq(kill(r0, SIGCONT), 0);
  ck_assert_int_eq(kill(r1, SIGCONT), 0);
  assert_ok(job, "r2k.out");
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  recovered_as_uninterrupted("r2k.out", "ck2k/step-40", "ref2k", "ck2k", 80, "ref2k.jsonl",
                             "r2k.jsonl");
#undef KEEP2
}
END_TEST

/* mpirun -np 2 against 2 servers (rows in memory), a checkpoint every 10
 * steps: once the metrics file has step 14, both ranks are stopped, server
 * 1 SIGKILLed and restarted on its port (fresh rows, a new incarnation),
 * the ranks continued. Each rank learns of it in the same step (one from
 * its own call, the other from the step's all-reduce); rank 0 restores
 * every server, both reload the dense state and rewind. */
START_TEST(test_two_ranks_recover) {
  const char *flags = D "--num-batches 40";
  char *ref = reference("ref2", 2, flags);
  test_server s[2];
  char addrs[200];
  start_two(s, "s2", 0, addrs, sizeof addrs);
  pid_t job = spawn_sh("cd '%s' && exec " MPIRUN " -np 2 '%s' train " COMMON " %s "
                       "--metrics-out r2.jsonl --shard-servers %s --save-checkpoint ck2 "
                       "--checkpoint-every 10 --recover-timeout 60 > r2.out 2>&1",
                       dir, bin_path(), flags, addrs);
  pid_t r0 = mpi_rank_pid(job, 0, 120), r1 = mpi_rank_pid(job, 1, 120);
  wait_text(at("r2.jsonl"), "\"step\":14,", 1, job, 120);
  ck_assert_int_eq(kill(r0, SIGSTOP), 0);
  ck_assert_int_eq(kill(r1, SIGSTOP), 0);
  restart(&s[1], 1, "s2", 0);
  ck_assert_int_eq(kill(r0, SIGCONT), 0);
  ck_assert_int_eq(kill(r1, SIGCONT), 0);
  assert_ok(job, "r2.out");
  for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
  char *log = slurp(at("r2.out"));
  ck_assert_msg(strstr(log, "recovered from ck2/step-") && strstr(log, s[1].addr),
                "no recovery naming server 1 (%s):\n%s", s[1].addr, log);
  free(log);
  char *got = final_lines("r2.jsonl");
  ck_assert_msg(strcmp(ref, got) == 0, "recovered run:\n%s\nuninterrupted:\n%s", got, ref);
  free(got);
  free(ref);
}
END_TEST

/* A server lost during a test pass, with one rank and with mpirun -np 2
 * (whose ranks agree at each test batch): e.bin's test split is half the
 * data, read 8 samples a batch (375 batches), so the pass after step 20
 * (--test-freq 20) lasts far longer than the test takes to stop the
 * trainer (or both ranks) once step 20 is printed; the stop must land
 * before the pass's line (else the test says so). Server 0 is restarted
 * (RocksDB folder); the job restores the step-20 checkpoint, runs the pass
 * again, and goes on. */
START_TEST(test_eval_lost_recovers) {
  const char *flags = "--processed-data-file e.bin --num-batches 30 --test-freq 20 "
                      "--test-mini-batch-size 8";
  for (int np = 1; np <= 2; np++) {
    char name[16], out[16], jsonl[16], ck[16], tag[8], want[80];
    snprintf(name, sizeof name, "refe%d", np);
    snprintf(out, sizeof out, "re%d.out", np);
    snprintf(jsonl, sizeof jsonl, "re%d.jsonl", np);
    snprintf(ck, sizeof ck, "cke%d", np);
    snprintf(tag, sizeof tag, "se%d", np);
    char *ref = reference(name, np, flags);
    test_server s[2];
    char addrs[200];
    start_two(s, tag, 1, addrs, sizeof addrs);
    pid_t tr = spawn_sh("cd '%s' && exec %s'%s' train " COMMON " %s --metrics-out %s "
                        "--shard-servers %s --save-checkpoint %s --checkpoint-every 10 "
                        "--recover-timeout 60 > %s 2>&1",
                        dir, np > 1 ? MPIRUN " -np 2 " : "", bin_path(), flags, jsonl, addrs, ck,
                        out);
    pid_t rk[2] = {tr, 0}; /* the processes to hold: the trainer, or both ranks */
    for (int r = 0; np > 1 && r < 2; r++) rk[r] = mpi_rank_pid(tr, r, 120);
    wait_text(at(out), "train  step 20/30 ", 1, tr, 120);
    for (int r = 0; r < np; r++) ck_assert_int_eq(kill(rk[r], SIGSTOP), 0);
    char *early = slurp(at(out));
    int passed = test_lines(early);
    free(early);
    restart(&s[0], 0, tag, 1);
    for (int r = 0; r < np; r++) ck_assert_int_eq(kill(rk[r], SIGCONT), 0);
    ck_assert_msg(passed == 0, "the pass at step 20 ended before the trainer was stopped");
    assert_ok(tr, out);
    for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
    char *log = slurp(at(out));
    snprintf(want, sizeof want, "recovered from %s/step-20 after: test pass at step 20: ", ck);
    ck_assert_msg(strstr(log, want), "%d rank(s): no recovery from a lost test pass:\n%s", np, log);
    free(log);
    char *got = final_lines(jsonl);
    ck_assert_msg(strcmp(ref, got) == 0, "%d rank(s): recovered run:\n%s\nuninterrupted:\n%s", np,
                  got, ref);
    free(got);
    free(ref);
  }
}
END_TEST

/* Wait (secs at most) for the file at path to hold size bytes. (A DONE
 * marker is created, then written: the test waits for the whole of it.) */
static void wait_file(const char *path, off_t size, pid_t pid, double secs) {
  double t0 = test_now();
  struct stat st;
  while (stat(path, &st) != 0 || st.st_size != size) {
    int st;
    ck_assert_msg(pid <= 0 || waitpid(pid, &st, WNOHANG) != pid, "%s: the process ended first", path);
    ck_assert_msg(test_now() - t0 < secs, "%s: not there after %.0f s", path, secs);
    usleep(2000);
  }
}

/* --auto-resume: the trainer (rows in process) SIGKILLed once its
 * step-20 checkpoint is complete (DONE written whole) and step 20's
 * metrics line is out (it comes after the checkpoint); the same command run again
 * resumes from the newest complete checkpoint and finishes. The first
 * run's metrics (saved aside: the second cuts the file back to its checkpoint's step) and the
 * second's give the final losses. A fresh folder starts fresh; without
 * --save-checkpoint (or with --resume) the flag is refused. */
START_TEST(test_auto_resume) {
  const char *flags = D "--num-batches 40";
  char *ref = reference("refa", 1, flags);
  char cmd[2000];
  snprintf(cmd, sizeof cmd, "cd '%s' && exec '%s' train " COMMON " %s --metrics-out ra.jsonl "
           "--save-checkpoint cka --checkpoint-every 10 --auto-resume >> ra.out 2>&1",
           dir, bin_path(), flags);
  pid_t tr = spawn_sh("%s", cmd);
  wait_file(at("cka/step-20/DONE"), 65, tr, 120); /* the manifest's SHA-256 in hex, a newline */
  /* and step 20's line, which the job prints after its checkpoint */
  wait_text(at("ra.jsonl"), "\"step\":20,", 1, tr, 120);
  proc_kill9(tr);
  char *out;
  ck_assert_int_eq(run_cmd(&out, "cd %s && cp ra.jsonl ra1.jsonl", dir), 0);
  free(out);
  assert_ok(spawn_sh("%s", cmd), "ra.out");
  char *log = slurp(at("ra.out"));
  ck_assert_msg(strstr(log, "resume cka/step-"), "the second run did not resume:\n%s", log);
  free(log);
  char *got = final_lines("ra1.jsonl ra.jsonl");
  ck_assert_msg(strcmp(ref, got) == 0, "resumed run:\n%s\nuninterrupted:\n%s", got, ref);
  free(got);
  /* A folder with no checkpoint: the same flags start fresh. */
  int rc = run_cmd(&out, "cd %s && mkdir ckb && %s train " COMMON " %s --metrics-out rb.jsonl "
                         "--save-checkpoint ckb --checkpoint-every 10 --auto-resume",
                   dir, bin_path(), flags);
  ck_assert_msg(rc == 0 && !strstr(out, "resume "), "%s", out);
  free(out);
  got = final_lines("rb.jsonl");
  ck_assert_str_eq(ref, got);
  free(got);
  free(ref);
  /* Without --save-checkpoint, or beside --resume: a usage error. */
  const char *bad[2] = {"", "--save-checkpoint ckb --resume ckb"};
  for (int i = 0; i < 2; i++) {
    rc = run_cmd(&out, "cd %s && %s train " COMMON " " D "--auto-resume %s", dir, bin_path(), bad[i]);
    ck_assert_msg(rc == 2 && strstr(out, "--auto-resume needs --save-checkpoint DIR"), "%d: %s", rc,
                  out);
    free(out);
  }
}
END_TEST

/* A partition the retries outlast and one they do not, made by stopping
 * server 1 (SIGSTOP: connections stay up, nothing is answered, as across a
 * cut link) once step 5 is printed (the trainer held meanwhile), with
 * --rpc-deadline 1 (a budget of 10 tries of 1 s). Short: the server is
 * continued once the trainer says a call's deadline passed and it is
 * trying again; the run logs the call answered after retries and nothing
 * else: no recovery. Long: the server stays stopped until the trainer says it is
 * restoring (every try past its deadline: a lost server), then is killed
 * and restarted on its port; the run recovers. Both end as the
 * uninterrupted run. */
START_TEST(test_partitions) {
  char *ref = reference("refp", 1, D "--num-batches 40");
  for (int longer = 0; longer < 2; longer++) {
    test_server s[2];
    char addrs[200], out[32], jsonl[32];
    snprintf(out, sizeof out, "rp%d.out", longer);
    snprintf(jsonl, sizeof jsonl, "rp%d.jsonl", longer);
    start_two(s, longer ? "pl" : "ps", 1, addrs, sizeof addrs);
    pid_t tr = spawn_sh("cd '%s' && exec '%s' train " COMMON " " D "--num-batches 40 --metrics-out %s "
                        "--shard-servers %s --save-checkpoint ckp%d --checkpoint-every 10 "
                        "--rpc-deadline 1 --recover-timeout 60 > %s 2>&1",
                        dir, bin_path(), jsonl, addrs, longer, out);
    wait_text(at(out), "train  step 5/40 ", 1, tr, 120);
    ck_assert_int_eq(kill(tr, SIGSTOP), 0); /* so that the run cannot end first */
    ck_assert_int_eq(kill(s[1].pid, SIGSTOP), 0);
    ck_assert_int_eq(kill(tr, SIGCONT), 0);
    if (!longer) {
      wait_text(at(out), "DEADLINE_EXCEEDED; trying again", 1, tr, 120);
      ck_assert_int_eq(kill(s[1].pid, SIGCONT), 0);
    } else {
      wait_text(at(out), "restoring every shard server from ", 1, tr, 120);
      restart(&s[1], 1, "pl", 1);
    }
    assert_ok(tr, out);
    for (int k = 0; k < 2; k++) ck_assert_int_eq(server_stop(&s[k]), 0);
    char *log = slurp(at(out));
    if (!longer)
      ck_assert_msg(strstr(log, "answered only after retries") && strstr(log, s[1].addr) &&
                        !strstr(log, "recovered from"),
                    "a short partition:\n%s", log);
    else /* calls retried before the restore are the recovery's, not step 0's */
      ck_assert_msg(strstr(log, "recovered from ckp1/step-0") && strstr(log, "DEADLINE_EXCEEDED") &&
                        !strstr(log, "step 0: "),
                    "a long partition:\n%s", log);
    free(log);
    char *got = final_lines(jsonl);
    ck_assert_msg(strcmp(ref, got) == 0, "%s partition:\n%s\nuninterrupted:\n%s",
                  longer ? "long" : "short", got, ref);
    free(got);
  }
  free(ref);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_recover");
  TCase *tc = tcase_create("recover");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_step0_checkpoint_recovers);
  tcase_add_test(tc, test_chain_recovers);
  tcase_add_test(tc, test_bounded_tables_recover);
  tcase_add_test(tc, test_two_ranks_recover);
  tcase_add_test(tc, test_two_ranks_bounded_recover);
  tcase_add_test(tc, test_eval_lost_recovers);
  tcase_add_test(tc, test_auto_resume);
  tcase_add_test(tc, test_partitions);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
