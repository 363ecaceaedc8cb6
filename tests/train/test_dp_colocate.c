/* train/colocate.c through colo_prog (tests/train/colo_prog.c) under a real
 * `mpirun -np 3` and alone without MPI:
 *   - 5 shards over 3 ranks: every rank gets the same 5 addresses, all
 *     different; each answers Stats with exactly its shard; shard k's
 *     server is rank k % 3's (it goes down exactly when that rank stops);
 *   - 2 shards over 3 ranks: rank 2 hosts nothing and still gets both;
 *   - RocksDB stores under a data dir: each shard's folder is made;
 *   - a rank that cannot host its shards: every rank gets NULL with a
 *     message naming it (and none hangs in the gather); with two, every
 *     rank names the lower one;
 *   - size 1 without mpirun: 5 servers in one process. */
#include <check.h>
#include <sys/stat.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

#define MPIRUN "mpirun --allow-run-as-root --oversubscribe"

/* Lines of out that start with prefix. */
static int count_lines(const char *out, const char *prefix) {
  int n = 0;
  size_t pl = strlen(prefix);
  for (const char *l = out; l && *l;) {
    if (!strncmp(l, prefix, pl)) n++;
    l = strchr(l, '\n');
    if (l) l++;
  }
  return n;
}

/* The address list that rank r printed ("rank R addrs A0 A1 ..."), into
 * list; 0 if missing. */
static int addrs_of(const char *out, int r, char *list, size_t len) {
  char key[32];
  snprintf(key, sizeof key, "rank %d addrs ", r);
  const char *p = strstr(out, key);
  if (!p) return 0;
  p += strlen(key);
  snprintf(list, len, "%.*s", (int)strcspn(p, "\n"), p);
  return 1;
}

/* Run colo_prog with np ranks (0: alone, no mpirun); its output in *out. */
static int run_prog(int np, const char *args, char **out) {
  char launch[128] = "";
  if (np) snprintf(launch, sizeof launch, MPIRUN " -np %d", np);
  return run_cmd(out, "%s '%s' %s", launch, COLO_PROG, args);
}

/* Checks common to the successful runs: no ERROR, same addresses on every
 * rank, all distinct, every Stats and every ownership probe right. */
static void check_ok(const char *out, int rc, int np, int n_shards) {
  int ranks = np ? np : 1;
  ck_assert_msg(rc == 0 && !strstr(out, "ERROR"), "colo_prog failed (%d):\n%s", rc, out);
  char first[1024], other[1024];
  ck_assert_msg(addrs_of(out, 0, first, sizeof first), "no addresses from rank 0:\n%s", out);
  for (int r = 1; r < ranks; r++) {
    ck_assert_msg(addrs_of(out, r, other, sizeof other), "no addresses from rank %d", r);
    ck_assert_msg(!strcmp(first, other), "rank 0 got [%s], rank %d [%s]", first, r, other);
  }
  /* n_shards distinct host:port words. */
  char *words[64];
  int n = 0;
  char *save;
  for (char *w = strtok_r(first, " ", &save); w && n < 64; w = strtok_r(NULL, " ", &save))
    words[n++] = w;
  ck_assert_int_eq(n, n_shards);
  for (int i = 0; i < n; i++) {
    ck_assert_msg(!strncmp(words[i], "127.0.0.1:", 10) && atoi(words[i] + 10) > 0, "address %s",
                  words[i]);
    for (int j = 0; j < i; j++) ck_assert_str_ne(words[i], words[j]);
  }
  /* Every rank asked every shard, and probed every shard after each stop. */
  int serves = 0, down = 0, up = 0;
  char key[64];
  for (int r = 0; r < ranks; r++)
    for (int k = 0; k < n_shards; k++) {
      snprintf(key, sizeof key, "rank %d: shard %d at ", r, k);
      serves += count_lines(out, key);
    }
  ck_assert_int_eq(serves, ranks * n_shards);
  for (int r = 0; r < ranks; r++)
    for (int p = 0; p < ranks; p++)
      for (int k = 0; k < n_shards; k++) {
        snprintf(key, sizeof key, "rank %d: after rank %d stopped, shard %d down", r, p, k);
        int d = count_lines(out, key);
        snprintf(key, sizeof key, "rank %d: after rank %d stopped, shard %d up", r, p, k);
        int u = count_lines(out, key);
        ck_assert_msg(d + u == 1, "rank %d, stop %d, shard %d: %d lines", r, p, k, d + u);
        ck_assert_msg(d == (k % ranks <= p), "rank %d: after rank %d stopped, shard %d is %s", r,
                      p, k, d ? "down" : "up");
        down += d;
        up += u;
      }
  ck_assert_int_gt(down, 0);
  printf("colocate: %d rank(s), %d shard(s): the same %d distinct addresses on every rank; "
         "ownership probes %d down, %d up\n", ranks, n_shards, n_shards, down, up);
}

START_TEST(test_three_ranks_five_shards) {
  char *out;
  int rc = run_prog(3, "5", &out);
  check_ok(out, rc, 3, 5);
  free(out);
}
END_TEST

START_TEST(test_rank_without_shards) {
  char *out;
  int rc = run_prog(3, "2", &out);
  check_ok(out, rc, 3, 2);
  free(out);
}
END_TEST

START_TEST(test_data_dir) {
  char *dir = tmpdir_make("test"), *out, args[600];
  snprintf(args, sizeof args, "5 --data-dir '%s/rows'", dir);
  int rc = run_prog(3, args, &out);
  check_ok(out, rc, 3, 5);
  free(out);
  for (int k = 0; k < 5; k++) {
    char p[700];
    struct stat st;
    snprintf(p, sizeof p, "%s/rows/shard-%d", dir, k);
    ck_assert_msg(stat(p, &st) == 0 && S_ISDIR(st.st_mode), "no %s", p);
  }
  run_cmd(NULL, "rm -rf '%s'", dir);
  free(dir);
}
END_TEST

START_TEST(test_failing_rank_named_everywhere) {
  char *out;
  int rc = run_prog(3, "5 --fail-rank 1", &out);
  ck_assert_msg(rc == 0 && !strstr(out, "ERROR"), "colo_prog failed (%d):\n%s", rc, out);
  for (int r = 0; r < 3; r++) {
    char key[64];
    snprintf(key, sizeof key, "rank %d: start failed as expected: rank 1 of 3", r);
    ck_assert_msg(strstr(out, key), "no '%s' in:\n%s", key, out);
  }
  /* The reason travels: rank 1's store could not be made under its dir. */
  ck_assert_msg(strstr(out, "colo_prog_cannot_create_this"), "%s", out);
  free(out);
  /* Two failing ranks: every rank names the first, rank 1, the same way
   * (rank 2 too, not itself) and counts the other. */
  rc = run_prog(3, "5 --fail-rank 2,1", &out);
  ck_assert_msg(rc == 0 && !strstr(out, "ERROR"), "colo_prog failed (%d):\n%s", rc, out);
  for (int r = 0; r < 3; r++) {
    char key[64];
    snprintf(key, sizeof key, "rank %d: start failed as expected: rank 1 of 3", r);
    ck_assert_msg(strstr(out, key), "no '%s' in:\n%s", key, out);
  }
  free(out);
}
END_TEST

START_TEST(test_one_rank_without_mpi) {
  char *out;
  int rc = run_cmd(&out, "env -u OMPI_COMM_WORLD_SIZE '%s' 5", COLO_PROG);
  check_ok(out, rc, 0, 5);
  free(out);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dp_colocate");
  TCase *tc = tcase_create("colocate");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_three_ranks_five_shards);
  tcase_add_test(tc, test_rank_without_shards);
  tcase_add_test(tc, test_data_dir);
  tcase_add_test(tc, test_failing_rank_named_everywhere);
  tcase_add_test(tc, test_one_rank_without_mpi);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sr_check_run(suite()); }
