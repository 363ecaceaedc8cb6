/* Incremental checkpoints end to end with the stores that keep rows out of
 * the trainer's memory: `shardrec train --full-checkpoint-every 4
 * --checkpoint-every 5` writes step-0 whole and step-5, -10 and -15 as
 * increments (a chain of 4 links), and a job resumed from step-15 (its rows
 * restored from step-0, then each increment laid over them, on a fresh
 * store) gives the uninterrupted job's losses after step 15 and its test
 * AUC, bit for bit:
 *   - the RocksDB shard store in the trainer (--data-dir, a small cache):
 *     the increments are table files under shards/;
 *   - two shard servers keeping rows in RocksDB, and two keeping them in
 *     memory: each server writes its folder shards/shard-K of table files;
 *     servers started with `serve --restore HEAD/shards` serve the chain's
 *     rows (predict against them scores as predict in process does).
 * And a job killed with SIGKILL while it writes an increment (every step a
 * checkpoint, every one after step-0 an increment), on the shard store and
 * on RocksDB servers: --auto-resume takes the last complete link and gives
 * the uninterrupted job's bits.
 * Under mpirun -np 2: tests/mpi/test_mpi_train.c (its "chain" case). */
#include <check.h>
#include <dirent.h>
#include <sys/stat.h>

#include "tests/check_main.h"
#include "tests/support/dp_run.h"

#define ARCH "--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1"
#define STEPS "--mini-batch-size 64 --num-batches 40 " DP_HYPER
#define CHAIN "--checkpoint-every 5 --full-checkpoint-every 4"

static dp_metrics ma, mb;

/* Shard store in this process, rows under DIR/NAME.live. */
static int train_shard(const char *name, const char *extra, char **out) {
  char args[1200];
  snprintf(args, sizeof args, ARCH " --cache-rows 1024 --data-dir %s/%s.live %s", dp_dir, name,
           extra);
  return dp_train("chain_stores", ", shard store", name, 0, "d.bin", "p.json", args, out);
}

/* Two fresh servers (rows in RocksDB under DIR/NAME.srvK when data, else in
 * memory) for the run. */
static int train_servers(const char *name, const char *extra, int data, char **out) {
  test_server s[2] = {{0}, {0}};
  char addrs[200], args[1200];
  servers_start(s, 2, &(servers_opts){.dir = dp_dir, .plan = "p.json", .data = data ? name : NULL,
                                      .log = name});
  servers_addrs(s, 2, addrs, sizeof addrs);
  snprintf(args, sizeof args, ARCH " --shard-servers %s %s", addrs, extra);
  int rc = dp_train("chain_stores", data ? ", RocksDB servers" : ", in-memory servers", name, 0,
                    "d.bin", "p.json", args, out);
  server_stop(&s[0]);
  server_stop(&s[1]);
  return rc;
}

/* What inspect says of ck/step-15: an increment on step-10, 4 links. */
static void check_chain(const char *ck) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s inspect %s/step-15", dp_dir, bin_path(), ck);
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_msg(strstr(out, "kind incremental") && strstr(out, "parent step-10") &&
                    strstr(out, "a chain of 4 links"),
                "%.1500s", out);
  free(out);
}

/* The chain run (name_c) and the resumed one (name_r, from step-15) against
 * the uninterrupted one (name_u), with train(name, extra, &out). */
static void chain_case(int (*train)(const char *, const char *, char **), const char *tag) {
  char u[32], c[32], r[32], ck[64], extra[600], *out;
  snprintf(u, sizeof u, "%s_u", tag);
  snprintf(c, sizeof c, "%s_c", tag);
  snprintf(r, sizeof r, "%s_r", tag);
  snprintf(ck, sizeof ck, "%s_ck", tag);
  ck_assert_msg(train(u, STEPS, &out) == 0, "%s", out);
  free(out);
  snprintf(extra, sizeof extra, STEPS " --save-checkpoint %s/%s " CHAIN, dp_dir, ck);
  ck_assert_msg(train(c, extra, &out) == 0, "%s", out);
  free(out);
  check_chain(ck);
  snprintf(extra, sizeof extra, STEPS " --resume %s/%s/step-15", dp_dir, ck);
  ck_assert_msg(train(r, extra, &out) == 0, "%s", out);
  ck_assert_msg(strstr(out, "resume ") && strstr(out, "step 15"), "%s", out);
  free(out);
  dp_load(u, &ma);
  dp_load(c, &mb);
  dp_assert_same_bits("the chain run against the uninterrupted one", &ma, &mb);
  dp_load(r, &mb);
  dp_assert_resumed(tag, &ma, &mb, 15, 40);
}

static int rocks_servers_fn(const char *name, const char *extra, char **out) {
  return train_servers(name, extra, 1, out);
}
static int mem_servers_fn(const char *name, const char *extra, char **out) {
  return train_servers(name, extra, 0, out);
}

START_TEST(test_chain_shard_store) {
  chain_case(train_shard, "sh");
  /* The increments are table files of the changed rows, beside no database. */
  char *out;
  ck_assert_int_eq(run_cmd(&out, "ls %s/sh_ck/step-10/shards", dp_dir), 0);
  ck_assert_msg(strstr(out, "table-0.bin") && !strstr(out, "shard-"), "%s", out);
  free(out);
}
END_TEST

/* Servers started with --restore HEAD/shards (the head ck/step-15, an
 * increment; rows in RocksDB under DIR/TAG_sr.srvK when data) serve the
 * chain's rows: predict against them scores as predict does in process
 * (the chain folded), every probability alike. */
static void serve_restore_case(const char *ck, int data, const char *tag) {
  test_server s[2] = {{0}, {0}};
  char addrs[200], flags[700], name[64], *out;
  snprintf(flags, sizeof flags, "--restore %s/%s/step-15/shards", dp_dir, ck);
  snprintf(name, sizeof name, "%s_sr", tag);
  servers_start(s, 2, &(servers_opts){.dir = dp_dir, .plan = "p.json", .data = data ? name : NULL,
                                      .log = name, .flags = flags});
  servers_addrs(s, 2, addrs, sizeof addrs);
  int rc = run_cmd(&out, "cd %s && %s predict --checkpoint %s/step-15 --processed-data-file d.bin "
                         "--out %s_a.tsv --shard-servers %s && %s predict --checkpoint %s/step-15 "
                         "--processed-data-file d.bin --out %s_b.tsv && cmp %s_a.tsv %s_b.tsv",
                   dp_dir, bin_path(), ck, tag, addrs, bin_path(), ck, tag, tag, tag);
  ck_assert_msg(rc == 0, "%.2000s", out);
  free(out);
  server_stop(&s[0]);
  server_stop(&s[1]);
}

START_TEST(test_chain_rocksdb_servers) {
  chain_case(rocks_servers_fn, "rs");
  serve_restore_case("rs_ck", 1, "rs");
  char *out;
  ck_assert_int_eq(run_cmd(&out, "ls %s/rs_ck/step-10/shards/shard-0 %s/rs_ck/step-10/shards/shard-1",
                           dp_dir, dp_dir), 0);
  ck_assert_msg(strstr(out, "table-0.bin"), "%s", out);
  free(out);
}
END_TEST

START_TEST(test_chain_memory_servers) {
  chain_case(mem_servers_fn, "ms");
  serve_restore_case("ms_ck", 0, "ms");
}
END_TEST

/* SIGKILL the job pid as soon as root holds a folder .step-N.* with a
 * shards/ in it, N >= from: a checkpoint being written (an event polled
 * without pause: the folder lives milliseconds). N, or -1 when the job
 * ended first. */
static int kill_mid_write(pid_t pid, const char *root, int from) {
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return -1;
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      int n;
      char p[1100];
      struct stat sb;
      if (sscanf(e->d_name, ".step-%d.", &n) != 1 || n < from) continue;
      snprintf(p, sizeof p, "%s/%s/shards", root, e->d_name);
      if (stat(p, &sb)) continue;
      closedir(d);
      proc_kill9(pid);
      return n;
    }
    if (d) closedir(d);
  }
}

/* The job (store: its flags) killed while it writes an increment at step
 * 20 or later, then --auto-resume: from the link before, and the bits of
 * the uninterrupted job (on a store of its own: ref). */
static void kill_case(const char *ref, const char *store, const char *tag) {
  char job[1000], flags[1200], root[600], *out;
  snprintf(job, sizeof job, "train --processed-data-file d.bin --plan p.json " ARCH " " STEPS
           " --print-freq 1 --test-freq 0 %s", ref);
  snprintf(root, sizeof root, "%s/%s_kk", dp_dir, tag);
  int rc = run_cmd(&out, "cd %s && %s %s --metrics-out %s_ku.jsonl", dp_dir, bin_path(), job, tag);
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  snprintf(job, sizeof job, "train --processed-data-file d.bin --plan p.json " ARCH " " STEPS
           " --print-freq 1 --test-freq 0 %s", store);
  snprintf(flags, sizeof flags, "%s --checkpoint-every 1 --full-checkpoint-every 1000 "
           "--save-checkpoint %s_kk --auto-resume", job, tag);
  pid_t pid = spawn_sh("cd %s && exec %s %s --metrics-out %s_k1.jsonl > %s_k1.log 2>&1", dp_dir,
                       bin_path(), flags, tag, tag);
  int n = kill_mid_write(pid, root, 20);
  if (n < 20) {
    char log[700];
    snprintf(log, sizeof log, "%s/%s_k1.log", dp_dir, tag);
    char *l = slurp(log);
    ck_abort_msg("the job ended before an increment was caught being written:\n%.1500s", l ? l : "");
  }
  char done[700];
  snprintf(done, sizeof done, "%s/step-%d/DONE", root, n);
  ck_assert_msg(access(done, F_OK) != 0, "step-%d was complete when the job was killed", n);
  rc = run_cmd(&out, "cd %s && %s %s --metrics-out %s_k2.jsonl", dp_dir, bin_path(), flags, tag);
  ck_assert_msg(rc == 0, "%s", out);
  char want[96];
  snprintf(want, sizeof want, "resume %s_kk/step-%d: step %d", tag, n - 1, n - 1);
  ck_assert_msg(strstr(out, want), "no '%s' in:\n%.1500s", want, out);
  free(out);
  rc = run_cmd(&out, "%s inspect %s/step-%d", bin_path(), root, n - 1);
  ck_assert_msg(rc == 0 && strstr(out, "kind incremental"), "%.1500s", out);
  free(out);
  char a[64], b[64];
  snprintf(a, sizeof a, "%s_ku", tag);
  snprintf(b, sizeof b, "%s_k2", tag);
  dp_load(a, &ma);
  dp_load(b, &mb);
  dp_assert_resumed("killed mid-increment, resumed", &ma, &mb, n - 1, 40);
  printf("chain_stores: %s: killed while step-%d was being written\n", tag, n);
}

START_TEST(test_kill_shard_store) {
  char ref[700], store[700];
  snprintf(ref, sizeof ref, "--cache-rows 1024 --data-dir %s/kill-ref.live", dp_dir);
  snprintf(store, sizeof store, "--cache-rows 1024 --data-dir %s/kill.live", dp_dir);
  kill_case(ref, store, "shk");
}
END_TEST

START_TEST(test_kill_rocksdb_servers) {
  test_server s[4] = {{0}, {0}, {0}, {0}};
  char addrs[2][200], ref[400], store[400];
  servers_start(s, 2, &(servers_opts){.dir = dp_dir, .plan = "p.json", .data = "kref", .log = "kref"});
  servers_start(s + 2, 2, &(servers_opts){.dir = dp_dir, .plan = "p.json", .data = "kill", .log = "kill"});
  servers_addrs(s, 2, addrs[0], sizeof addrs[0]);
  servers_addrs(s + 2, 2, addrs[1], sizeof addrs[1]);
  snprintf(ref, sizeof ref, "--shard-servers %s", addrs[0]);
  snprintf(store, sizeof store, "--shard-servers %s", addrs[1]);
  kill_case(ref, store, "rsk");
  for (int k = 0; k < 4; k++) server_stop(&s[k]);
}
END_TEST

int main(void) {
  const dp_case cases[] = {
      {"shard", test_chain_shard_store},
      {"rocksdb_servers", test_chain_rocksdb_servers},
      {"memory_servers", test_chain_memory_servers},
      {"kill_shard", test_kill_shard_store},
      {"kill_servers", test_kill_rocksdb_servers},
  };
  /* 3000 rows: 2700 train rows, 42 steps of 64; a 2-shard plan. */
  return dp_suite_run("chain_stores", cases, (int)(sizeof cases / sizeof cases[0]),
                      "test_chain_stores", 3000, 2, ARCH);
}
