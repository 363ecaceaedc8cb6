/* Tests for common/outfile: single-file outputs written under a temporary
 * name beside the final one and renamed into place only when whole, a
 * folder at the path refused and kept, a write error (recorded, or a full
 * device) leaving the final path as it was and no temporary, the checked
 * line writes of a growing file. Real files under a fresh temporary
 * folder. */
#include <check.h>

#include "tests/check_main.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/outfile.h"
#include "common/status.h"
#include "tests/support/files.h"

static char *root;

static void setup(void) {
  root = tmpdir_make("outfile");
}

static void teardown(void) {
  sr_rmtree(root);
  free(root);
}

/* root/rel into p[512]. */
static const char *at(char *p, const char *rel) {
  ck_assert_int_eq(sr_path(p, 512, "%s/%s", root, rel), 0);
  return p;
}

static void put(const char *rel, const char *text) {
  char p[512];
  file_put(at(p, rel), text);
}

/* root/rel holds exactly want. */
static void text_is(const char *rel, const char *want) {
  char p[512];
  file_text_is(at(p, rel), want);
}

/* Whether root/rel exists. */
static int exists(const char *rel) {
  char p[512];
  return access(at(p, rel), F_OK) == 0;
}

/* The number of entries of root. */
static int entries(void) {
  char **names;
  int n;
  ck_assert_int_eq(sr_list_dir(root, &names, &n), 0);
  sr_paths_free(names, n);
  return n;
}

START_TEST(test_commit_replaces_whole) {
  char p[512], err[1024];
  put("x.txt", "old\n");
  chmod(at(p, "x.txt"), 0600);
  sr_outfile *o;
  ck_assert_int_eq(sr_out_open(at(p, "x.txt"), &o, err, sizeof err), 0);
  ck_assert_int_eq(sr_out_write(o, "new ", 4), 0);
  ck_assert_int_eq(sr_out_printf(o, "%d\n", 42), 0);
  /* Until the commit the final name holds the old file; the new one is the
   * temporary beside it, named after it and its owner. */
  const char *tmp = sr_out_tmp(o);
  ck_assert_msg(!strncmp(tmp, p, strlen(p)) && strstr(tmp, "x.txt.tmp-"), "%s", tmp);
  text_is("x.txt", "old\n");
  ck_assert_int_eq(entries(), 2);
  ck_assert_int_eq(sr_out_commit(o, err, sizeof err), 0);
  text_is("x.txt", "new 42\n");
  ck_assert_int_eq(entries(), 1);
  struct stat st;
  ck_assert_int_eq(stat(p, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600); /* the file replaced kept its mode */
}
END_TEST

START_TEST(test_abort_and_error_keep_old) {
  char p[512], err[1024] = "";
  put("x.txt", "old\n");
  sr_outfile *o;
  ck_assert_int_eq(sr_out_open(at(p, "x.txt"), &o, err, sizeof err), 0);
  sr_out_write(o, "half", 4);
  sr_out_abort(o);
  text_is("x.txt", "old\n");
  ck_assert_int_eq(entries(), 1);
  /* A write error is kept: later writes write nothing, the commit refuses. */
  ck_assert_int_eq(sr_out_open(p, &o, err, sizeof err), 0);
  ck_assert_int_eq(sr_out_fail(o, "cannot write", ENOSPC), SR_EIO);
  ck_assert_int_eq(sr_out_write(o, "more", 4), SR_EIO);
  ck_assert_int_eq(sr_out_commit(o, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, p) && strstr(err, "No space left on device"), "%s", err);
  text_is("x.txt", "old\n");
  ck_assert_int_eq(entries(), 1);
}
END_TEST

START_TEST(test_folder_refused_and_kept) {
  char p[512], q[512], err[1024] = "";
  ck_assert_int_eq(sr_mkdirs(at(p, "dir")), 0);
  put("dir/inside", "kept\n");
  sr_outfile *o = (sr_outfile *)1;
  ck_assert_int_eq(sr_out_open(p, &o, err, sizeof err), SR_EEXISTS);
  ck_assert_ptr_null(o);
  ck_assert_msg(strstr(err, p) && strstr(err, "is a folder"), "%s", err);
  text_is("dir/inside", "kept\n");
  ck_assert_int_eq(entries(), 1); /* no temporary beside it */
  ck_assert_int_eq(sr_out_check(p, err, sizeof err), SR_EEXISTS);
  ck_assert_int_eq(sr_out_check("/dev/null", err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "/dev/null") && strstr(err, "not a regular file"), "%s", err);
  ck_assert_int_eq(sr_out_check(at(q, "absent"), err, sizeof err), 0);
}
END_TEST

START_TEST(test_commit_all_or_none) {
  char p[512], err[1024];
  put("a", "old a\n");
  const char *names[3] = {"a", "b", "c"};
  sr_outfile *o[3];
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(sr_out_open(at(p, names[k]), &o[k], err, sizeof err), 0);
    ck_assert_int_eq(sr_out_printf(o[k], "new %s\n", names[k]), 0);
  }
  sr_out_fail(o[2], "cannot write", ENOSPC); /* the last one fails: none is renamed */
  ck_assert_int_eq(sr_out_commit_all(o, 3, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, at(p, "c")) != NULL, "%s", err);
  ck_assert_ptr_null(o[0]);
  text_is("a", "old a\n");
  ck_assert_int_eq(entries(), 1);
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(sr_out_open(at(p, names[k]), &o[k], err, sizeof err), 0);
    ck_assert_int_eq(sr_out_printf(o[k], "new %s\n", names[k]), 0);
  }
  ck_assert_int_eq(sr_out_commit_all(o, 3, err, sizeof err), 0);
  text_is("a", "new a\n");
  text_is("c", "new c\n");
  ck_assert_int_eq(entries(), 3);
}
END_TEST

START_TEST(test_reserve_and_symlink) {
  char p[512], l[512], err[1024];
  put("target", "old\n");
  ck_assert_int_eq(symlink(at(p, "target"), at(l, "link")), 0);
  sr_outfile *o;
  ck_assert_int_eq(sr_out_open(l, &o, err, sizeof err), 0);
  ck_assert_int_eq(sr_out_reserve(o, 10000), 0);
  struct stat st;
  ck_assert_int_eq(fstat(sr_out_fd(o), &st), 0);
  ck_assert_int_eq(st.st_size, 10000);
  ck_assert_int_eq(sr_out_commit(o, err, sizeof err), 0);
  /* The link stays a link; the file it leads to is the one replaced. */
  ck_assert_int_eq(lstat(l, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(stat(p, &st), 0);
  ck_assert_int_eq(st.st_size, 10000);
  ck_assert_int_eq(entries(), 2);
}
END_TEST

START_TEST(test_dead_writer_swept) {
  char tag[SR_TMP_TAG_MAX], dead[SR_TMP_TAG_MAX + 32], p[512], err[1024], xname[600], yname[600];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  long pid;
  unsigned long long start;
  char boot[16];
  int used = 0;
  sscanf(tag, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used);
  snprintf(dead, sizeof dead, "tmp-%ld-%llu-%s-%s", pid, start + 7, boot, tag + used);
  snprintf(xname, sizeof xname, "x.txt.%s", dead); /* a writer of x.txt killed before */
  snprintf(yname, sizeof yname, "y.txt.%s", dead); /* another file's: not x.txt's to sweep */
  put(xname, "cut");
  put(yname, "cut");
  sr_outfile *o;
  ck_assert_int_eq(sr_out_open(at(p, "x.txt"), &o, err, sizeof err), 0);
  ck_assert(!exists(xname));
  ck_assert(exists(yname));
  ck_assert_int_eq(entries(), 2); /* y's leftover and x's own temporary */
  sr_out_abort(o);
  ck_assert_int_eq(entries(), 1);
}
END_TEST

START_TEST(test_line_checked) {
  char err[1024] = "", p[512];
  FILE *f = fopen("/dev/full", "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(sr_out_line(f, "/dev/full", "{\"a\":1}\n", 8, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "/dev/full: cannot write: No space left on device"), "%s", err);
  fclose(f);
  f = fopen(at(p, "m.jsonl"), "w");
  ck_assert_int_eq(sr_out_line(f, p, "{\"a\":1}\n", 8, err, sizeof err), 0);
  text_is("m.jsonl", "{\"a\":1}\n"); /* flushed: a reader sees it now */
  fclose(f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("common_outfile");
  TCase *tc = tcase_create("outfile");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_commit_replaces_whole);
  tcase_add_test(tc, test_abort_and_error_keep_old);
  tcase_add_test(tc, test_folder_refused_and_kept);
  tcase_add_test(tc, test_commit_all_or_none);
  tcase_add_test(tc, test_reserve_and_symlink);
  tcase_add_test(tc, test_dead_writer_swept);
  tcase_add_test(tc, test_line_checked);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
