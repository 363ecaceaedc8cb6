/* The look-ahead (--prefetch-depth D) changes no bit: `shardrec train`
 * with rows in the RocksDB shard store (--data-dir, --cache-rows 1024, less
 * than one step's unique rows at batch 256: about 1480 here, so that rows
 * handed ahead compete with the step's own and some are evicted between
 * their prefetch and their use) gives the in-memory store's per-step losses
 * and test AUC, compared as the metrics lines' text (%.9g), at depth 0, 1
 * and 2, with SGD, Adagrad and row-wise Adagrad, 1 and 3 shards, in process
 * and through colocated shard servers (sync); in async mode depth 1 and 2
 * give depth 0's bits (one rank of async is deterministic, but not the sync
 * bits: its lookups run one step ahead of the pushes). Each run is 60 steps
 * over two epochs of 43 (a test pass every 25 steps and at the epoch's
 * end, so the look-ahead stops at the split's end and at the run's last
 * step). With MPI: two ranks (colocated shards, rows in RocksDB) at depth 2
 * give the bits of two ranks in memory at depth 0. Every rank prefetches its
 * own slice. On its own branch the stores ignore the op; the check is the
 * merge with the stores that use it (DESIGN.md, "A training step").
 * The data set is made once in main (12000 rows of datagen --seed 3). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"
#include "tests/train/e2e_data.h"

static char *dir; /* made in main */

#define FLAGS                                                                            \
  "--processed-data-file d.bin --mini-batch-size 256 --nepochs 2 --num-batches 60 "      \
  "--test-freq 25 --print-freq 1 --arch-mlp-bot 13-64-16 --arch-mlp-top 64-1 "           \
  "--optimizer adagrad --learning-rate 0.05"

/* The bits of name.jsonl (e2e_bits_of). */
static char *bits_of(const char *name) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
  return e2e_bits_of(path);
}

/* Train as name (metrics in name.jsonl) with launch (mpirun or "") and
 * flags; asserts exit 0 and 60 steps. */
static void train(const char *name, const char *launch, const char *flags) {
  char *out;
  int rc = run_cmd(&out, "cd %s && rm -rf %s.rows && %s %s train " FLAGS " --metrics-out %s.jsonl %s",
                   dir, name, launch, bin_path(), name, flags);
  ck_assert_msg(rc == 0, "%s: exit %d:\n%s", name, rc, out);
  ck_assert_msg(strstr(out, "done   60 steps"), "%s: not 60 steps:\n%s", name, out);
  free(out);
}

/* Train name with flags and compare its bits with ref's. */
static void same_as(const char *ref, const char *name, const char *launch, const char *flags) {
  train(name, launch, flags);
  char *a = bits_of(ref), *b = bits_of(name);
  ck_assert_uint_gt(strlen(a), 60 * 40);
  ck_assert_ptr_nonnull(strstr(a, "\"kind\":\"test\""));
  /* On a difference, the first line that differs (the whole files overflow
   * Check's message). */
  size_t at = 0, line = 1;
  for (; a[at] && a[at] == b[at]; at++) line += a[at] == '\n';
  while (at > 0 && a[at - 1] != '\n') at--;
  ck_assert_msg(!strcmp(a, b), "%s differs from %s at metrics line %zu:\n%.300s\n---\n%.300s",
                name, ref, line, b + at, a + at);
  free(a);
  free(b);
}

/* The shard store at every depth, 1 and 3 shards, in process and colocated
 * (sync), against the in-memory store at depth 0; async depths against
 * async depth 0. sopt: --sparse-optimizer. */
static void all_placements(const char *sopt) {
  char ref[64], name[64], f[512];
  snprintf(ref, sizeof ref, "%s-mem", sopt);
  snprintf(f, sizeof f, "--sparse-optimizer %s --prefetch-depth 0", sopt);
  train(ref, "", f);
  for (int d = 0; d <= 2; d++)
    for (int shards = 1; shards <= 3; shards += 2) {
      snprintf(name, sizeof name, "%s-d%d-s%d", sopt, d, shards);
      snprintf(f, sizeof f, "--sparse-optimizer %s --prefetch-depth %d --num-shards %d "
               "--data-dir %s.rows --cache-rows 1024", sopt, d, shards, name);
      same_as(ref, name, "", f);
    }
  snprintf(name, sizeof name, "%s-colo", sopt);
  snprintf(f, sizeof f, "--sparse-optimizer %s --prefetch-depth 2 --num-shards 3 "
           "--colocate-shards --data-dir %s.rows --cache-rows 1024", sopt, name);
  same_as(ref, name, "", f);
  snprintf(ref, sizeof ref, "%s-async0", sopt);
  snprintf(f, sizeof f, "--sparse-optimizer %s --prefetch-depth 0 --num-shards 3 "
           "--colocate-shards --sparse-mode async --data-dir %s.rows --cache-rows 1024", sopt, ref);
  train(ref, "", f);
  for (int d = 1; d <= 2; d++) {
    snprintf(name, sizeof name, "%s-async%d", sopt, d);
    snprintf(f, sizeof f, "--sparse-optimizer %s --prefetch-depth %d --num-shards 3 "
             "--colocate-shards --sparse-mode async --data-dir %s.rows --cache-rows 1024", sopt,
             d, name);
    same_as(ref, name, "", f);
  }
}

START_TEST(test_prefetch_sgd) { all_placements("sgd"); }
END_TEST
START_TEST(test_prefetch_adagrad) { all_placements("adagrad"); }
END_TEST
START_TEST(test_prefetch_rowwise_adagrad) { all_placements("rowwise_adagrad"); }
END_TEST

/* bench train --store shard on the suite's data, two rounds: each the
 * in-memory line, then one line per depth through a shard store whose
 * cache (0.2 of the rows touched) makes it read from RocksDB every step,
 * each with the in-memory run's losses bit for bit and its CPU a step
 * split under it; then each depth's ratios of the rounds and their
 * median. */
START_TEST(test_bench_store) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s bench train --store shard --data d.bin --steps 12 "
                         "--batch 256 --cache-fraction 0.2 --prefetch-depth 0,2 --rounds 2 "
                         "--arch-mlp-bot 13-64-16 --arch-mlp-top 64-1", dir, bin_path());
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "(reference)"), "no in-memory line:\n%s", out);
  int lines = 0;
  double ratio[2][2]; /* [depth index][round] */
  for (char *l = strstr(out, "\nshard "); l; l = strstr(l + 1, "\nshard ")) {
    char what[16], weights[16], same[32];
    int depth;
    double v[11];
    int n = sscanf(l + 1, "%15s %15s %d %lf %lfx %lf %lf %lf %lf %lf %lf %lf %lf %31s", what,
                   weights, &depth, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8],
                   &v[9], same);
    ck_assert_msg(n == 14, "a line of %d fields:\n%s", n, out);
    ck_assert_msg(!strcmp(weights, "fp32"), "weights %s:\n%s", weights, out);
    ck_assert_msg(lines < 4, "more than 4 shard lines:\n%s", out);
    ck_assert_int_eq(depth, lines % 2 ? 2 : 0);
    ratio[lines % 2][lines / 2] = v[1];
    ck_assert_msg(v[0] > 0 && v[7] > 0, "no samples/s or no RocksDB reads:\n%s", out);
    ck_assert_msg(!strcmp(same, "bit-identical"), "depth %d: %s:\n%s", depth, same, out);
    /* right under it, its CPU a step: RocksDB's reads and the caller took
       some, and the parts are within the whole */
    const char *c = strchr(l + 1, '\n');
    double cpu, more, rd, wb, bg, own, caller, pool, rest;
    const int got = c && !strncmp(c, "\n  CPU a step: ", 15)
                        ? sscanf(c + 15, "%lf ms, %lf against memory: RocksDB reads %lf, "
                                         "write-backs %lf, flushes and compactions %lf; the "
                                         "store's own %lf (I/O jobs) + %lf (caller); the dense "
                                         "pool's workers %lf; the rest %lf",
                                 &cpu, &more, &rd, &wb, &bg, &own, &caller, &pool, &rest)
                        : 0;
    ck_assert_msg(got == 9, "no CPU line under a shard line:\n%s", out);
    ck_assert_msg(rd > 0 && caller > 0 && rd + wb + bg + own + caller < cpu,
                  "CPU a step %g: reads %g, write-backs %g, background %g, own %g + %g:\n%s", cpu,
                  rd, wb, bg, own, caller, out);
    lines++;
  }
  ck_assert_msg(lines == 4, "%d shard lines:\n%s", lines, out);
  for (int i = 0; i < 2; i++) {
    char want[32];
    snprintf(want, sizeof want, "\n  depth %d: ratio ", i ? 2 : 0);
    const char *m = strstr(out, want);
    double a, b, med;
    ck_assert_msg(m && sscanf(m + strlen(want), "%lfx %lfx: median %lfx of 2 rounds", &a, &b,
                              &med) == 3,
                  "no median line for depth %d:\n%s", i ? 2 : 0, out);
    ck_assert_msg(fabs(a - ratio[i][0]) < 0.006 && fabs(b - ratio[i][1]) < 0.006 &&
                      fabs(med - (a + b) / 2) < 0.011,
                  "depth %d: rounds %g %g, median %g:\n%s", i ? 2 : 0, a, b, med, out);
  }
  free(out);
  /* Per precision at the same cache bytes: a bf16 store holds more rows
   * than fp32's (at dim 16 a slot's own bookkeeping weighs beside the
   * weights), trains to its own in-memory run's bits, and its samples/s is
   * given against fp32's. */
  rc = run_cmd(&out, "cd %s && %s bench train --store shard --data d.bin --steps 8 --batch 256 "
                     "--cache-mb 1 --prefetch-depth 0 --arch-embedding-precision fp32,bf16 "
                     "--sparse-optimizer rowwise_adagrad --arch-mlp-bot 13-64-16 --arch-mlp-top 64-1",
               dir, bin_path());
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  unsigned long long r32 = 0, r16 = 0;
  const char *c32 = strstr(out, "fp32 weights: shard store cache 1 MiB: "),
             *c16 = strstr(out, "bf16 weights: shard store cache 1 MiB: ");
  ck_assert_msg(c32 && c16 && sscanf(c32 + 39, "%llu", &r32) == 1 &&
                    sscanf(c16 + 39, "%llu", &r16) == 1,
                "no cache lines:\n%s", out);
  ck_assert_msg(r16 > r32 * 6 / 5, "bf16 cache %llu rows against fp32's %llu:\n%s", r16, r32, out);
  const char *b = strstr(out, "\nshard   bf16        0 ");
  ck_assert_msg(b && strstr(b, "bit-identical") && strstr(out, "  bf16 depth 0: ") &&
                    strstr(out, "against fp32's (same depth, same cache MiB)"),
                "no bf16 line or comparison:\n%s", out);
  free(out);
  rc = run_cmd(&out, "%s bench train --store shard --arch-embedding-precision fp32,fp8", bin_path());
  ck_assert_msg(rc == 2 && strstr(out, "--arch-embedding-precision: 'fp8' is not fp32, fp16 or bf16"),
                "exit %d:\n%s", rc, out);
  free(out);
}
END_TEST

/* Started under a soft limit of 64 open files, train raises it to the hard
 * limit: three shard stores in process (a RocksDB database each, a column
 * family per table, every file kept open) need more than 128 files, and
 * with the limit as given opening the second database fails ("Too many
 * open files"). */
START_TEST(test_open_files_limit) {
  struct rlimit r;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_max != RLIM_INFINITY && r.rlim_max < 1024) {
    fprintf(stderr, "test_open_files_limit: SKIPPED: the hard limit of open files is %llu\n",
            (unsigned long long)r.rlim_max);
    return;
  }
  char *out;
  int rc = run_cmd(&out, "cd %s && rm -rf lim.rows && ulimit -S -n 64 && %s train "
                         "--processed-data-file d.bin --mini-batch-size 256 --num-batches 20 "
                         "--test-freq 0 --print-freq 100 --arch-mlp-bot 13-64-16 --arch-mlp-top 64-1 "
                         "--num-shards 3 --data-dir lim.rows --cache-rows 1024 && rm -rf lim.rows",
                   dir, bin_path());
  ck_assert_msg(rc == 0 && strstr(out, "done   20 steps"), "exit %d:\n%s", rc, out);
  free(out);
}
END_TEST

#ifdef SR_MPIRUN
/* Two ranks, each prefetching its own slice, rows in RocksDB at depth 2:
 * the bits of two ranks with rows in memory at depth 0. */
START_TEST(test_prefetch_two_ranks) {
  const char *mpi = "mpirun --allow-run-as-root --oversubscribe -np 2";
  train("mpi-mem", mpi, "--num-shards 3 --colocate-shards --prefetch-depth 0");
  same_as("mpi-mem", "mpi-d2", mpi,
          "--num-shards 3 --colocate-shards --prefetch-depth 2 --data-dir mpi-d2.rows "
          "--cache-rows 1024");
}
END_TEST
#endif

int main(void) {
  int rc = 1;
  if ((dir = e2e_data_make("test_train_prefetch", "prefetch", 12000, 3))) {
    Suite *s = suite_create("train_prefetch");
    TCase *tc = tcase_create("e2e");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_prefetch_sgd);
    tcase_add_test(tc, test_prefetch_adagrad);
    tcase_add_test(tc, test_prefetch_rowwise_adagrad);
    tcase_add_test(tc, test_bench_store);
    tcase_add_test(tc, test_open_files_limit);
#ifdef SR_MPIRUN
    tcase_add_test(tc, test_prefetch_two_ranks);
#endif
    suite_add_tcase(s, tc);
    rc = sr_check_run(s);
  }
  e2e_data_remove(dir);
  return rc;
}
