/* shardrec bench store through the real binary, at ten thousand rows: the
 * CPU figures per row it prints beside the rates have their shape and are
 * figures of work done (RocksDB's CPU per row read and per row written
 * back, the shard store's own beside them, all above zero; the pushes of
 * rows missing from the cache write about one row back each), and its work
 * folder is removed. */
#include <check.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

/* 64 KiB of write-back buffers: a write set every ~300 rows evicted */
#define ARGS "--rows 10000 --batch 256 --cache-rows 1024 --batches 8 --runs 1 --write-buffer-kb 64"

START_TEST(test_cpu_figures) {
  char *before = NULL, *out = NULL;
  run_cmd(&before, "ls -d /tmp/shardrec-bench-store-* 2>/dev/null | wc -l");
  int rc = run_cmd(&out, "%s bench store " ARGS, bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  const char *p = strstr(out, "read, shard store misses");
  ck_assert_msg(p != NULL, "no read CPU line in:\n%s", out);
  double rocks, own, caller;
  ck_assert_msg(sscanf(p, "read, shard store misses %lf in RocksDB + %lf read jobs' own (decode) + "
                       "%lf caller", &rocks, &own, &caller) == 3,
                "a read CPU line of another shape in:\n%s", out);
  ck_assert_msg(rocks > 0 && own > 0 && caller > 0, "read CPU per row %g %g %g", rocks, own, caller);
  p = strstr(out, "read, raw MultiGet");
  double raw;
  ck_assert_msg(p && sscanf(p, "read, raw MultiGet %lf", &raw) == 1 && raw > 0, "%s", out);
  p = strstr(out, "write-back, pushes of misses");
  ck_assert_msg(p != NULL, "no write-back CPU line in:\n%s", out);
  double wr, rate, per, wcaller, proc;
  ck_assert_msg(sscanf(p, "write-back, pushes of misses %lf in RocksDB per row written back "
                       "(SST files written and ingested); %lf rows/s pushed, %lf written back per "
                       "row; per row pushed: caller %lf, whole process %lf", &wr, &rate, &per,
                       &wcaller, &proc) == 5,
                "a write-back CPU line of another shape in:\n%s", out);
  /* 2048 rows a pass through a cache of 1024: nearly every push evicts a
   * dirty row */
  ck_assert_msg(wr > 0 && rate > 0 && per > 0.5 && per <= 1.0 && wcaller > 0 && proc > wcaller,
                "write-back figures %g %g %g %g %g", wr, rate, per, wcaller, proc);
  char *after = NULL;
  run_cmd(&after, "ls -d /tmp/shardrec-bench-store-* 2>/dev/null | wc -l");
  ck_assert_str_eq(after, before);
  free(before);
  free(after);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bench_store");
  TCase *tc = tcase_create("bench_store");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_cpu_figures);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
