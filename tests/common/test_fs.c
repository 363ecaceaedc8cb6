/* Tests for common/fs: paths that refuse to truncate, making, listing,
 * copying (hard-linked *.sst), removing and fsyncing real folder trees under
 * a fresh temporary folder. */
#include <check.h>

#include "tests/check_main.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "tests/support/files.h"

static char *root;

static void setup(void) {
  root = tmpdir_make("fs");
}

static void teardown(void) {
  sr_rmtree(root);
  free(root);
}

static void put(const char *rel, const char *text) {
  char p[512];
  ck_assert_int_eq(sr_path(p, sizeof p, "%s/%s", root, rel), 0);
  file_put(p, text);
}

START_TEST(test_path) {
  char b[8];
  ck_assert_int_eq(sr_path(b, sizeof b, "%s/%d", "ab", 1234), 0);
  ck_assert_str_eq(b, "ab/1234");
  /* 8 characters and the NUL do not fit in 8 bytes: refused, empty */
  ck_assert_int_eq(sr_path(b, sizeof b, "%s/%d", "ab", 12345), SR_ERANGE);
  ck_assert_str_eq(b, "");
  ck_assert_int_eq(sr_path(b, 0, "x"), SR_EINVAL);
  char big[5000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  char p[4096];
  ck_assert_int_eq(sr_path(p, sizeof p, "/tmp/%s", big), SR_ERANGE);
  ck_assert_str_eq(p, "");
}
END_TEST

/* sr_path_err: the same refusal, and a message naming the path's start. */
START_TEST(test_path_err) {
  char b[8], err[256] = "untouched";
  ck_assert_int_eq(sr_path_err(b, sizeof b, err, sizeof err, "%s/%d", "ab", 1234), 0);
  ck_assert_str_eq(b, "ab/1234");
  ck_assert_str_eq(err, "untouched");
  ck_assert_int_eq(sr_path_err(b, sizeof b, err, sizeof err, "%s/%d", "ab", 12345), SR_ERANGE);
  ck_assert_str_eq(b, "");
  ck_assert_str_eq(err, "ab/1234: path too long (over 7 characters)");
  /* A long one: its first 64 characters, then "...". */
  char big[5000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  char p[SR_PATH_MAX];
  ck_assert_int_eq(sr_path_err(p, sizeof p, err, sizeof err, "/tmp/%s/x", big), SR_ERANGE);
  ck_assert_str_eq(p, "");
  char want[128];
  snprintf(want, sizeof want, "/tmp/%.59s...: path too long (over 4095 characters)", big);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(sr_path_too_long(err, sizeof err, "short", 4), SR_ERANGE);
  ck_assert_str_eq(err, "short: path too long (over 3 characters)");
  ck_assert_int_eq(sr_path_err(b, 0, err, sizeof err, "x"), SR_EINVAL);
  ck_assert_int_eq(sr_path_err(b, sizeof b, NULL, 0, "%s", "123456789"), SR_ERANGE);
}
END_TEST

START_TEST(test_mkdirs_and_kinds) {
  char p[512], f[512];
  sr_path(p, sizeof p, "%s/a/b//c/d", root);
  ck_assert_int_eq(sr_is_dir(p), 0);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  ck_assert_int_eq(sr_is_dir(p), 1);
  ck_assert_int_eq(sr_is_file(p), 0);
  ck_assert_int_eq(sr_mkdirs(p), 0); /* existing is fine */
  put("a/b/file", "x");
  sr_path(f, sizeof f, "%s/a/b/file", root);
  ck_assert_int_eq(sr_is_file(f), 1);
  ck_assert_int_eq(sr_is_dir(f), 0);
  /* a component that is a file: cannot be made */
  sr_path(p, sizeof p, "%s/a/b/file/sub", root);
  ck_assert_int_eq(sr_mkdirs(p), SR_EIO);
  ck_assert_int_eq(sr_mkdirs(f), SR_EIO);
  ck_assert_int_eq(sr_is_file("/nonexistent/x"), 0);
  char big[5000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  ck_assert_int_eq(sr_mkdirs(big), SR_ERANGE);
  ck_assert_int_eq(sr_mkdirs(""), SR_EINVAL);
}
END_TEST

START_TEST(test_list_files) {
  put("z.txt", "z");
  char p[512];
  sr_path(p, sizeof p, "%s/d/e", root);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  sr_path(p, sizeof p, "%s/empty", root);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  put("d/b.sst", "b");
  put("d/e/a", "a");
  put("a", "a");
  char **files;
  int n;
  ck_assert_int_eq(sr_list_files(root, &files, &n), 0);
  ck_assert_int_eq(n, 4);
  ck_assert_str_eq(files[0], "a");
  ck_assert_str_eq(files[1], "d/b.sst");
  ck_assert_str_eq(files[2], "d/e/a");
  ck_assert_str_eq(files[3], "z.txt");
  sr_paths_free(files, n);
  ck_assert_int_eq(sr_list_dir(root, &files, &n), 0);
  ck_assert_int_eq(n, 4);
  ck_assert_str_eq(files[0], "a");
  ck_assert_str_eq(files[1], "d");
  ck_assert_str_eq(files[2], "empty");
  ck_assert_str_eq(files[3], "z.txt");
  sr_paths_free(files, n);
  sr_path(p, sizeof p, "%s/missing", root);
  files = (char **)1;
  ck_assert_int_eq(sr_list_files(p, &files, &n), SR_EIO);
  ck_assert_ptr_null(files);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(sr_list_dir(p, &files, &n), SR_ENOTFOUND);
  ck_assert_ptr_null(files);
  sr_paths_free(NULL, 0);
}
END_TEST

START_TEST(test_copytree) {
  char src[512], dst[512], p[512], q[512];
  sr_path(src, sizeof src, "%s/src", root);
  sr_path(p, sizeof p, "%s/src/sub", root);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  put("src/000007.sst", "table");
  put("src/MANIFEST-1", "manifest");
  put("src/sub/x", "nested");
  sr_path(dst, sizeof dst, "%s/dst", root);
  char err[512] = "";
  ck_assert_msg(sr_copytree(src, dst, err, sizeof err) == 0, "%s", err);
  sr_path(p, sizeof p, "%s/000007.sst", src);
  sr_path(q, sizeof q, "%s/000007.sst", dst);
  struct stat a, b;
  ck_assert_int_eq(stat(p, &a), 0);
  ck_assert_int_eq(stat(q, &b), 0);
  ck_assert_uint_eq(a.st_ino, b.st_ino); /* hard link */
  ck_assert_uint_eq(b.st_nlink, 2);
  sr_path(p, sizeof p, "%s/MANIFEST-1", src);
  sr_path(q, sizeof q, "%s/MANIFEST-1", dst);
  ck_assert_int_eq(stat(p, &a), 0);
  ck_assert_int_eq(stat(q, &b), 0);
  ck_assert_uint_ne(a.st_ino, b.st_ino); /* a copy */
  file_text_is(q, "manifest");
  sr_path(q, sizeof q, "%s/sub/x", dst);
  file_text_is(q, "nested");
  /* dst must not exist */
  ck_assert_int_eq(sr_copytree(src, dst, err, sizeof err), SR_EIO);
  ck_assert_ptr_nonnull(strstr(err, dst));
  sr_path(p, sizeof p, "%s/nosuch", root);
  sr_path(q, sizeof q, "%s/dst2", root);
  ck_assert_int_eq(sr_copytree(p, q, err, sizeof err), SR_EIO);
  ck_assert_ptr_nonnull(strstr(err, p));
}
END_TEST

START_TEST(test_copy_file) {
  char p[512], q[512], err[512] = "";
  put("one", "hello");
  sr_path(p, sizeof p, "%s/one", root);
  sr_path(q, sizeof q, "%s/two", root);
  ck_assert_msg(sr_copy_file(p, q, err, sizeof err) == 0, "%s", err);
  file_text_is(q, "hello");
  ck_assert_int_eq(sr_copy_file(p, q, err, sizeof err), SR_EIO); /* exists */
  ck_assert_ptr_nonnull(strstr(err, q));
  sr_path(p, sizeof p, "%s/none", root);
  ck_assert_int_eq(sr_copy_file(p, q, err, sizeof err), SR_EIO);
  ck_assert_ptr_nonnull(strstr(err, p));
}
END_TEST

START_TEST(test_rmtree_and_fsync) {
  char p[512];
  sr_path(p, sizeof p, "%s/t/u/v", root);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  put("t/u/v/f", "f");
  put("t/g", "g");
  sr_path(p, sizeof p, "%s/t", root);
  ck_assert_int_eq(sr_fsync_dir(p), 0);
  /* a symlink inside is removed, not followed */
  char keep[512], link_at[512];
  put("keep", "k");
  sr_path(keep, sizeof keep, "%s/keep", root);
  sr_path(link_at, sizeof link_at, "%s/t/link", root);
  ck_assert_int_eq(symlink(keep, link_at), 0);
  ck_assert_int_eq(sr_rmtree(p), 0);
  ck_assert_int_eq(access(p, F_OK), -1);
  ck_assert_int_eq(sr_is_file(keep), 1);
  ck_assert_int_eq(sr_rmtree(p), 0); /* missing is fine */
  ck_assert_int_eq(sr_rmtree(keep), 0); /* a file */
  ck_assert_int_eq(sr_is_file(keep), 0);
  ck_assert_int_eq(sr_fsync_dir(p), SR_EIO);
}
END_TEST

/* sr_path_confine: the resolved path, or the refusal, for paths inside,
 * outside, through "..", through symlinks in and out of the root, missing
 * parts, dangling links. */
START_TEST(test_path_confine) {
  char r[SR_PATH_MAX], p[SR_PATH_MAX], out[SR_PATH_MAX], want[SR_PATH_MAX], err[1024];
  ck_assert_ptr_nonnull(realpath(root, r));
  ck_assert_int_eq(sr_path(p, sizeof p, "%s/in/sub", r), 0);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  ck_assert_int_eq(sr_path(p, sizeof p, "%s/out", r), 0);
  ck_assert_int_eq(sr_mkdirs(p), 0);
  char link_at[SR_PATH_MAX], rin[SR_PATH_MAX];
  sr_path(rin, sizeof rin, "%s/in", r);
  sr_path(link_at, sizeof link_at, "%s/in/esc", r);
  ck_assert_int_eq(symlink(p, link_at), 0); /* in/esc -> out */
  sr_path(p, sizeof p, "%s/in/sub", r);
  sr_path(link_at, sizeof link_at, "%s/in/s", r);
  ck_assert_int_eq(symlink(p, link_at), 0); /* in/s -> in/sub */
  sr_path(link_at, sizeof link_at, "%s/in/dangling", r);
  ck_assert_int_eq(symlink("/nonexistent-shardrec", link_at), 0);
  struct {
    const char *rel; /* under r */
    int rc;
    const char *want; /* under r, when 0 */
  } cases[] = {
      {"in", 0, "in"},
      {"in/", 0, "in"},
      {"in/sub/new", 0, "in/sub/new"},
      {"in/sub/a/b//c/", 0, "in/sub/a/b/c"},
      {"in/s/new", 0, "in/sub/new"},
      {"in/sub/../new", 0, "in/new"},
      {"in/../out/x", SR_EINVAL, NULL},
      {"in/esc/x", SR_EINVAL, NULL},
      {"in/esc", SR_EINVAL, NULL},
      {"out", SR_EINVAL, NULL},
      {"in/../in2", SR_EINVAL, NULL}, /* a sibling with the root's name as prefix */
      {"in/nothere/../x", SR_EFORMAT, NULL},
      {"in/nothere/./x", SR_EFORMAT, NULL},
      {"in/dangling", SR_EFORMAT, NULL},
      {"in/dangling/x", SR_EFORMAT, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    sr_path(p, sizeof p, "%s/%s", r, cases[i].rel);
    err[0] = 0;
    int rc = sr_path_confine(rin, p, out, sizeof out, err, sizeof err);
    ck_assert_msg(rc == cases[i].rc, "%s: %d (%s), expected %d", cases[i].rel, rc, err, cases[i].rc);
    if (!rc) {
      sr_path(want, sizeof want, "%s/%s", r, cases[i].want);
      ck_assert_str_eq(out, want);
    } else {
      ck_assert_msg(strstr(err, p) || strstr(err, cases[i].rel), "%s: %s", cases[i].rel, err);
    }
  }
  /* Outside: the message names the path, what it is and the root. */
  sr_path(p, sizeof p, "%s/in/esc/x", r);
  ck_assert_int_eq(sr_path_confine(rin, p, out, sizeof out, err, sizeof err), SR_EINVAL);
  sr_path(want, sizeof want, "%s/out/x", r);
  ck_assert_msg(strstr(err, want) && strstr(err, "outside") && strstr(err, rin), "%s", err);
  /* "/" holds everything; an empty path is refused; too long too. */
  ck_assert_int_eq(sr_path_confine("/", p, out, sizeof out, err, sizeof err), 0);
  ck_assert_str_eq(out, want);
  ck_assert_int_eq(sr_path_confine(rin, "", out, sizeof out, err, sizeof err), SR_EFORMAT);
  ck_assert_int_eq(sr_path_confine(rin, rin, out, 8, err, sizeof err), SR_ERANGE);
  /* A relative path is from the current folder. */
  char cwd[SR_PATH_MAX];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(rin), 0);
  int rc = sr_path_confine(rin, "s/../new2", out, sizeof out, err, sizeof err);
  ck_assert_int_eq(chdir(cwd), 0);
  ck_assert_msg(rc == 0, "%s", err);
  sr_path(want, sizeof want, "%s/new2", rin);
  ck_assert_str_eq(out, want);
}
END_TEST

/* This process's tag, with its fields read back from /proc as a check. */
START_TEST(test_tmp_tag) {
  char tag[SR_TMP_TAG_MAX], host[256] = "";
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  long pid;
  unsigned long long start;
  char boot[16];
  int used = 0;
  ck_assert_int_eq(sscanf(tag, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used), 3);
  ck_assert_int_eq(pid, (long)getpid());
  ck_assert(start > 0);
  ck_assert_int_eq((int)strlen(boot), 12);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  char bid[64] = "";
  ck_assert_ptr_nonnull(fgets(bid, sizeof bid, f));
  fclose(f);
  ck_assert_int_eq(strncmp(bid, boot, 8), 0); /* 8 hex digits, then the boot id's first '-' */
  gethostname(host, sizeof host);
  ck_assert_msg(strncmp(tag + used, host, 8) == 0 || strchr(host, ' '), "%s vs %s", tag, host);
  ck_assert_int_eq(sr_tmp_owner_gone(tag), 0);
  char small[8];
  ck_assert_int_eq(sr_tmp_tag(small, sizeof small), SR_ERANGE);
  ck_assert_str_eq(small, "");
}
END_TEST

/* A name whose owner is gone: a dead PID, this PID started at another
 * time, another boot of this host. Not gone: this process, another host,
 * no tag. */
START_TEST(test_tmp_owner_gone) {
  char tag[SR_TMP_TAG_MAX], t[SR_TMP_TAG_MAX + 32];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  long pid;
  unsigned long long start;
  char boot[16];
  int used = 0;
  sscanf(tag, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used);
  const char *host = tag + used;
  snprintf(t, sizeof t, "tmp-%d-%llu-%s-%s", 2147483646, start, boot, host);
  ck_assert_int_eq(sr_tmp_owner_gone(t), 1);
  snprintf(t, sizeof t, "tmp-%ld-%llu-%s-%s", pid, start + 1, boot, host);
  ck_assert_int_eq(sr_tmp_owner_gone(t), 1);
  snprintf(t, sizeof t, "tmp-%ld-%llu-%s-%s", pid, start, strcmp(boot, "000000000000") ? "000000000000" : "111111111111", host);
  ck_assert_int_eq(sr_tmp_owner_gone(t), 1);
  snprintf(t, sizeof t, "tmp-%d-%llu-%s-%s.elsewhere", 2147483646, start, boot, host);
  ck_assert_int_eq(sr_tmp_owner_gone(t), 0);
  ck_assert_int_eq(sr_tmp_owner_gone("tmp-4242"), 0);
  ck_assert_int_eq(sr_tmp_owner_gone("step-3"), 0);
}
END_TEST

/* The sweep removes a folder with a dead owner's name and keeps one with a
 * live owner's (this process: its PID and start time), other names, and
 * what is not under the prefix; it says what it removed. */
START_TEST(test_tmp_sweep) {
  char tag[SR_TMP_TAG_MAX], dead[SR_TMP_TAG_MAX + 32], p[512];
  ck_assert_int_eq(sr_tmp_tag(tag, sizeof tag), 0);
  long pid;
  unsigned long long start;
  char boot[16];
  int used = 0;
  sscanf(tag, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used);
  snprintf(dead, sizeof dead, "tmp-%ld-%llu-%s-%s", pid, start + 7, boot, tag + used);
  const char *names[] = {".step-3.", ".step-4.", "other.", ".step-5.tmp-4242"};
  const char *tags[] = {dead, tag, dead, ""};
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(sr_path(p, sizeof p, "%s/%s%s/sub", root, names[i], tags[i]), 0);
    ck_assert_int_eq(sr_mkdirs(p), 0);
  }
  char said[2048] = "";
  FILE *say = fmemopen(said, sizeof said, "w");
  ck_assert_int_eq(sr_tmp_sweep(root, ".step-", say), 1);
  fclose(say);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(sr_path(p, sizeof p, "%s/%s%s", root, names[i], tags[i]), 0);
    ck_assert_int_eq(sr_is_dir(p), i != 0);
  }
  ck_assert_int_eq(sr_path(p, sizeof p, "%s/.step-3.%s: removed", root, dead), 0);
  ck_assert_msg(strstr(said, p) && strstr(said, "is gone"), "%s", said);
  ck_assert_int_eq(sr_path(p, sizeof p, "%s/missing", root), 0);
  ck_assert_int_eq(sr_tmp_sweep(p, ".step-", NULL), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("common_fs");
  TCase *tc = tcase_create("fs");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_path);
  tcase_add_test(tc, test_path_err);
  tcase_add_test(tc, test_mkdirs_and_kinds);
  tcase_add_test(tc, test_list_files);
  tcase_add_test(tc, test_copytree);
  tcase_add_test(tc, test_copy_file);
  tcase_add_test(tc, test_rmtree_and_fsync);
  tcase_add_test(tc, test_path_confine);
  tcase_add_test(tc, test_tmp_tag);
  tcase_add_test(tc, test_tmp_owner_gone);
  tcase_add_test(tc, test_tmp_sweep);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
