/* shardrec bench ckpt through the real binary, at a few thousand rows: the
 * lines it prints have their shape, its byte counts are the files' (a full
 * checkpoint of the local store holds every row, an incremental one the
 * rows the pushes changed, each row 8 + 4 (dim + state) bytes of a table
 * file, embedding/table_file.h), an incremental checkpoint is smaller than a
 * full one, the work folder is removed, and bad flags exit 2 naming the
 * flag. */
#include <check.h>
#include <math.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/support/proc.h"

#define ROW_BYTES (8.0 + 4.0 * (16 + 16)) /* dim 16, adagrad: 16 state floats */
#define FILE_BYTES 288.0                  /* a table file's header and trailer */

/* Run the bench with args in a fresh folder given as --dir; *out its
 * output. Returns the exit status; asserts the folder is left empty. */
static int run_bench(char **out, const char *args) {
  char *d = tmpdir_make("bench_ckpt");
  int rc = run_cmd(out, "%s bench ckpt --rows 5000 --steps-between 4 --batch 64 --rounds 3 "
                   "--dir %s %s", bin_path(), d, args);
  char *ls = NULL;
  ck_assert_int_eq(run_cmd(&ls, "ls -A %s", d), 0);
  ck_assert_msg(ls[0] == 0, "the work folder is left: %s", ls);
  free(ls);
  sr_rmtree(d);
  free(d);
  return rc;
}

/* The total rows from the first line. */
static double total_rows(const char *out) {
  const char *p = strstr(out, " tables, ");
  ck_assert_msg(p != NULL, "no plan line in:\n%s", out);
  double rows = 0;
  ck_assert_int_eq(sscanf(p, " tables, %lf rows", &rows), 1);
  return rows;
}

START_TEST(test_local_figures) {
  char *out;
  ck_assert_msg(run_bench(&out, "--store local") == 0, "%s", out);
  double rows = total_rows(out);
  ck_assert_msg(rows >= 5000 && rows < 5600, "%.0f rows in:\n%s", rows, out);
  ck_assert_ptr_nonnull(strstr(out, "cpu: "));
  int seen = 0;
  for (const char *p = out; (p = strstr(p, "round ")) != NULL; p++) {
    int r;
    double chg, pct, fmb, fs, imb, is;
    ck_assert_msg(sscanf(p, "round %d changed %lf rows (%lf%%) full %lf MB %lf s incremental "
                         "%lf MB %lf s", &r, &chg, &pct, &fmb, &fs, &imb, &is) == 7,
                  "a round line of another shape in:\n%s", out);
    ck_assert_int_eq(r, ++seen);
    ck_assert_msg(chg > 0 && chg < rows, "round %d: %.0f rows changed", r, chg);
    /* 3 decimals of MB: within 1000 bytes, plus a header and trailer per table file */
    ck_assert_msg(fabs(fmb * 1e6 - (rows * ROW_BYTES + 26 * FILE_BYTES)) <= 1000,
                  "round %d: full %.3f MB for %.0f rows", r, fmb, rows);
    double inc = imb * 1e6, rowsb = chg * ROW_BYTES;
    ck_assert_msg(inc >= rowsb + FILE_BYTES - 1000 && inc <= rowsb + 26 * FILE_BYTES + 1000,
                  "round %d: incremental %.3f MB for %.0f changed rows", r, imb, chg);
    ck_assert_msg(imb < fmb, "round %d: incremental %.3f MB, full %.3f MB", r, imb, fmb);
    ck_assert(fs > 0 && is > 0);
  }
  ck_assert_msg(seen == 3, "%d round lines in:\n%s", seen, out);
  const char *m = strstr(out, "median ");
  double chg, pct, fmb, fs, imb, is, xb, xt;
  ck_assert_msg(m && sscanf(m, "median changed %lf rows (%lf%%) full %lf MB %lf s incremental "
                            "%lf MB %lf s", &chg, &pct, &fmb, &fs, &imb, &is) == 6,
                "no median line in:\n%s", out);
  const char *x = strstr(out, "full / incremental: ");
  ck_assert_msg(x && sscanf(x, "full / incremental: bytes x%lf, time x%lf", &xb, &xt) == 2,
                "no ratio line in:\n%s", out);
  ck_assert_msg(fabs(xb - fmb / imb) < 0.1 && xb > 1, "ratio x%.1f of %.3f / %.3f MB", xb, fmb,
                imb);
  free(out);
}
END_TEST

/* The shard store: its full checkpoint is RocksDB's (files linked to the
 * live database: the new part printed beside the sum), its incremental one
 * table files of the changed rows as the local store's. */
START_TEST(test_shard_figures) {
  char *out;
  ck_assert_msg(run_bench(&out, "--store shard") == 0, "%s", out);
  ck_assert_ptr_nonnull(strstr(out, "shard store"));
  int seen = 0;
  for (const char *p = out; (p = strstr(p, "round ")) != NULL; p++, seen++) {
    double chg, fmb, newmb, imb;
    const char *f = strstr(p, " full ");
    ck_assert_msg(sscanf(p, "round %*d changed %lf", &chg) == 1 && f &&
                  sscanf(f, " full %lf MB %*f s (%lf MB new, the rest linked) incremental %lf MB",
                         &fmb, &newmb, &imb) == 3,
                  "a round line of another shape in:\n%s", out);
    ck_assert_msg(fmb > 0 && newmb >= 0 && newmb <= fmb, "full %.3f MB, new %.3f MB", fmb, newmb);
    double inc = imb * 1e6, rowsb = chg * ROW_BYTES;
    ck_assert_msg(inc >= rowsb + FILE_BYTES - 1000 && inc <= rowsb + 26 * FILE_BYTES + 1000,
                  "incremental %.3f MB for %.0f changed rows", imb, chg);
    ck_assert_msg(imb < fmb, "incremental %.3f MB, full %.3f MB", imb, fmb);
  }
  ck_assert_msg(seen == 3, "%d round lines in:\n%s", seen, out);
  ck_assert_ptr_nonnull(strstr(out, "full / incremental: bytes x"));
  free(out);
}
END_TEST

START_TEST(test_bad_flags) {
  static const char *cases[][2] = {
      {"--store nowhere", "--store"},      {"--rows 10", "--rows"},
      {"--zipf 0.5", "--zipf"},            {"--rows 900000000", "--rows"},
      {"--sparse-optimizer adam", "--sparse-optimizer"}, {"--rounds 0", "--rounds"},
      {"--dir /nonexistent/folder", "--dir"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out;
    int rc = run_cmd(&out, "%s bench ckpt %s", bin_path(), cases[i][0]);
    ck_assert_msg(rc == 2, "%s: exit %d\n%s", cases[i][0], rc, out);
    ck_assert_msg(strstr(out, cases[i][1]) != NULL, "%s: not named in: %s", cases[i][0], out);
    ck_assert_msg(strstr(out, "fill:") == NULL, "%s: ran: %s", cases[i][0], out);
    free(out);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("bench_ckpt");
  TCase *tc = tcase_create("bench_ckpt");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_local_figures);
  tcase_add_test(tc, test_shard_figures);
  tcase_add_test(tc, test_bad_flags);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
