/* Paths too long for what is made under them, end to end: the real binary
 * on real data. shardrec train --save-checkpoint, --save-model and --resume
 * with a path whose files' paths would not fit (SR_PATH_MAX) exit non-zero
 * before training with "<flag> <the path's start>...: path too long", and
 * nothing is made or removed: folders named as the path cut short (what a
 * truncating buffer would have handed to mkdir, rename or a recursive
 * remove) survive with their files, and --data-dir is left as it was.
 * eval --checkpoint with such a path is refused alike. */
#include <check.h>
#include <errno.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/support/proc.h"

static char *dir;

static void setup_data(void) {
  /* plan.json: the plan of this data, for runs that take --plan. */
  dir = make_data_dir(600, 5, "%s train --processed-data-file d.bin --mini-batch-size 64 "
                              "--num-batches 1 --plan-out plan.json > /dev/null",
                      bin_path());
}

static void teardown_data(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

#define FLAGS "--processed-data-file d.bin --print-freq 1 --mini-batch-size 64 --num-batches 2 "

/* A relative path of len characters: folders of 200 'p's, the last one
 * shorter. */
static void long_rel(char *out, size_t len) {
  size_t n = 0;
  while (n < len) {
    if (n) out[n++] = '/';
    size_t seg = len - n < 200 ? len - n : 200;
    memset(out + n, 'p', seg);
    n += seg;
  }
  out[n] = 0;
}

/* Folder name in the current folder, holding a file "keep". */
static void make_sentinel(const char *name) {
  ck_assert_int_eq(mkdir(name, 0777), 0);
  char p[300];
  snprintf(p, sizeof p, "%s/keep", name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs("kept\n", f);
  fclose(f);
}

/* Entries of the current folder. */
static int entries(void) {
  char **names;
  int n;
  ck_assert_int_eq(sr_list_dir(".", &names, &n), 0);
  sr_paths_free(names, n);
  return n;
}

/* P (4090 characters, its folders made under the data folder) holds two
 * sentinels: ".ste" and "step", P/.step-N.tmp-PID and P/step-N cut to
 * 4095 characters. In P: the sentinels and their files, and nothing else. */
static void check_p(const char *p, int want_entries) {
  ck_assert_int_eq(chdir(dir), 0);
  ck_assert_int_eq(chdir(p), 0);
  ck_assert(sr_is_file(".ste/keep") && sr_is_file("step/keep"));
  ck_assert_int_eq(entries(), want_entries);
  ck_assert_int_eq(chdir(dir), 0);
}

/* The end of a run's output, for a failure message (Check drops very long
 * ones). */
static const char *tail(const char *out) {
  size_t n = strlen(out);
  return out + (n > 1500 ? n - 1500 : 0);
}

static void refused(const char *out, int rc, const char *flag, const char *path) {
  char want[128];
  snprintf(want, sizeof want, "%s %.64s...: path too long", flag, path);
  ck_assert_msg(rc != 0, "exit 0:\n...%s", tail(out));
  ck_assert_msg(strstr(out, want) != NULL, "no '%s' in:\n...%s", want, tail(out));
  /* Refused before any step: no progress line, no end of training. */
  ck_assert_msg(!strstr(out, "train  step") && !strstr(out, "done   "), "trained:\n...%s",
                tail(out));
}

START_TEST(test_train_paths_too_long) {
  char p[SR_PATH_MAX], r[SR_PATH_MAX + 16], m[SR_PATH_MAX], *out;
  long_rel(p, 4090);
  ck_assert_int_eq(chdir(dir), 0);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  ck_assert_int_eq(chdir(p), 0);
  make_sentinel(".ste");
  make_sentinel("step");
  check_p(p, 2);

  /* --save-checkpoint P: its plan made here, or given. */
  int rc = run_cmd(&out, "cd %s && %s train " FLAGS "--save-checkpoint %s", dir, bin_path(), p);
  refused(out, rc, "--save-checkpoint", p);
  free(out);
  check_p(p, 2);
  rc = run_cmd(&out, "cd %s && %s train " FLAGS "--plan plan.json --save-checkpoint %s", dir,
               bin_path(), p);
  refused(out, rc, "--save-checkpoint", p);
  free(out);
  check_p(p, 2);

  /* --save-model P/m: P/m.tmp-PID/... would not fit. */
  ck_assert_int_eq(sr_path(m, sizeof m, "%s/m", p), 0);
  rc = run_cmd(&out, "cd %s && %s train " FLAGS "--plan plan.json --save-model %s", dir,
               bin_path(), m);
  refused(out, rc, "--save-model", m);
  free(out);
  check_p(p, 2);

  /* --resume P/step-2 (4097 characters; cut to 4095 it names the sentinel
   * "step"), with a shard store in a --data-dir that holds a file. */
  ck_assert_int_eq(sr_path(r, sizeof r, "%s/step-2", p), 0);
  ck_assert_int_eq(chdir(dir), 0);
  make_sentinel("db");
  rc = run_cmd(&out, "cd %s && %s train " FLAGS "--plan plan.json --data-dir db --resume %s", dir,
               bin_path(), r);
  refused(out, rc, "--resume", r);
  ck_assert_msg(strncmp(out, "resume ", 7) && !strstr(out, "\nresume "), "resumed:\n...%s", tail(out));
  free(out);
  check_p(p, 2);
  ck_assert(sr_is_file("db/keep"));
  ck_assert_int_eq(chdir("db"), 0);
  ck_assert_int_eq(entries(), 1); /* no shard database made */

  /* eval --checkpoint with the same path. */
  rc = run_cmd(&out, "cd %s && %s eval --checkpoint %s --processed-data-file d.bin", dir,
               bin_path(), r);
  ck_assert_msg(rc != 0 && strstr(out, "path too long"), "exit %d:\n...%s", rc, tail(out));
  free(out);
  check_p(p, 2);
}
END_TEST

int main(void) {
  Suite *s = suite_create("paths");
  TCase *tc = tcase_create("paths");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup_data, teardown_data);
  tcase_add_test(tc, test_train_paths_too_long);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
