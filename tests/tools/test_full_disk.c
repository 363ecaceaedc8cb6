/* Outputs on a full disk, through the real binary: each case mounts a small
 * tmpfs of its own (root only: the suite exits 77, skipped, otherwise) and
 * writes there a file that does not fit. The command stops with a message
 * naming the file and errno's text, and leaves no partial file under a
 * final name and no temporary; what was there before is kept. */
#include <check.h>

#include "tests/check_main.h"

#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "tests/support/proc.h"

static char *base; /* the mount points' folder, made by main */

/* A tmpfs of size bytes at base/name (returned, static). */
static const char *mount_small(const char *name, const char *size) {
  static char dir[128], opts[32];
  snprintf(dir, sizeof dir, "%s/%s", base, name);
  snprintf(opts, sizeof opts, "size=%s", size);
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  ck_assert_msg(mount("tmpfs", dir, "tmpfs", 0, opts) == 0, "mount %s: %s", dir, strerror(errno));
  return dir;
}

/* The names in dir, one a line (ls -A), malloc'd. */
static char *listing(const char *dir) {
  char *out;
  ck_assert_int_eq(run_cmd(&out, "ls -A %s", dir), 0);
  return out;
}

static void unmount(const char *dir) { ck_assert_int_eq(umount(dir), 0); }

/* convert's output (about 500 KB) on a 64 KiB tmpfs: refused before it is
 * mapped, never a SIGBUS; nothing left there. */
START_TEST(test_convert_full) {
  char *d = make_data_dir(3000, 6, NULL), *out;
  const char *m = mount_small("convert", "64k");
  int rc = run_cmd(&out, "cd %s && %s convert --test-fraction 0.1 d.tsv %s/d.bin", d, bin_path(), m);
  ck_assert_msg(rc == 1 && strstr(out, "/d.bin: cannot reserve") &&
                strstr(out, "No space left on device"), "exit %d:\n%s", rc, out);
  free(out);
  char *ls = listing(m);
  ck_assert_msg(!*ls, "left on the tmpfs:\n%s", ls);
  free(ls);
  unmount(m);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* datagen's TSV (about 700 KB) on a 64 KiB tmpfs holding an older d.tsv:
 * the old file is kept as it was, no .probs or summary appears, no
 * temporary is left. */
START_TEST(test_datagen_full) {
  char *out;
  const char *m = mount_small("datagen", "64k");
  ck_assert_int_eq(run_cmd(NULL, "echo old > %s/d.tsv", m), 0);
  int rc = run_cmd(&out, "%s datagen --rows 3000 --seed 6 --out %s/d.tsv", bin_path(), m);
  ck_assert_msg(rc == 1 && strstr(out, "/d.tsv: cannot write: No space left on device"),
                "exit %d:\n%s", rc, out);
  free(out);
  char *ls = listing(m);
  ck_assert_str_eq(ls, "d.tsv\n");
  free(ls);
  ck_assert_int_eq(run_cmd(&out, "cat %s/d.tsv", m), 0);
  ck_assert_str_eq(out, "old\n");
  free(out);
  unmount(m);
}
END_TEST

/* train --metrics-out on a 4 KiB tmpfs, a line per step: the job stops
 * with a message naming the file, which holds whole lines only. */
START_TEST(test_train_metrics_full) {
  char *d = make_data_dir(3000, 6, NULL), *out;
  const char *m = mount_small("metrics", "4k");
  int rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --arch-mlp-bot 13-16 "
                         "--arch-mlp-top 16-1 --mini-batch-size 64 --print-freq 1 "
                         "--metrics-out %s/m.jsonl", d, bin_path(), m);
  char want[256];
  snprintf(want, sizeof want, "--metrics-out %s/m.jsonl: cannot write: No space left on device", m);
  ck_assert_msg(rc == 1 && strstr(out, want), "exit %d:\n%s", rc, out);
  free(out);
  char path[256];
  snprintf(path, sizeof path, "%s/m.jsonl", m);
  char *s = slurp(path);
  ck_assert_ptr_nonnull(s);
  size_t n = strlen(s);
  ck_assert_msg(n > 0 && s[n - 1] == '\n', "the file ends in a cut line:\n%s", s);
  for (char *line = s; *line; line = strchr(line, '\n') + 1)
    ck_assert_msg(!strncmp(line, "{\"kind\":\"train\"", 15) && strstr(line, "}\n"),
                  "not a whole line: %.200s", line);
  free(s);
  unmount(m);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* predict's output (3000 lines) on a 4 KiB tmpfs: nothing under its name,
 * no temporary. */
START_TEST(test_predict_full) {
  char *d = make_data_dir(3000, 6, "%s train --processed-data-file d.bin --arch-mlp-bot 13-16 "
                          "--arch-mlp-top 16-1 --num-batches 2 --save-model model >/dev/null",
                          bin_path()),
       *out;
  const char *m = mount_small("predict", "4k");
  int rc = run_cmd(&out, "cd %s && %s predict --checkpoint model --processed-data-file d.bin "
                         "--out %s/p.tsv", d, bin_path(), m);
  ck_assert_msg(rc == 1 && strstr(out, "/p.tsv: cannot write: No space left on device"),
                "exit %d:\n%s", rc, out);
  free(out);
  char *ls = listing(m);
  ck_assert_msg(!*ls, "left on the tmpfs:\n%s", ls);
  free(ls);
  unmount(m);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* plot's picture on an 8 KiB tmpfs: gnuplot cuts it short without a word;
 * the picture is not whole, so nothing goes under its name. */
START_TEST(test_plot_full) {
  char *d = make_data_dir(3000, 6, "%s train --processed-data-file d.bin --arch-mlp-bot 13-16 "
                          "--arch-mlp-top 16-1 --print-freq 5 --metrics-out m.jsonl >/dev/null",
                          bin_path()),
       *out;
  const char *m = mount_small("plot", "8k");
  int rc = run_cmd(&out, "cd %s && %s plot m.jsonl --out %s/c.png", d, bin_path(), m);
  ck_assert_msg(rc == 1 && strstr(out, "/c.png: gnuplot wrote no whole picture"), "exit %d:\n%s",
                rc, out);
  free(out);
  char *ls = listing(m);
  ck_assert_msg(!*ls, "left on the tmpfs:\n%s", ls);
  free(ls);
  unmount(m);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

int main(void) {
  if (geteuid() != 0) {
    printf("skipped: the full-disk cases mount a tmpfs (root only)\n");
    return 77;
  }
  if (!(base = tmpdir_new("full"))) return EXIT_FAILURE;
  Suite *s = suite_create("full_disk");
  TCase *tc = tcase_create("full_disk");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_convert_full);
  tcase_add_test(tc, test_datagen_full);
  tcase_add_test(tc, test_train_metrics_full);
  tcase_add_test(tc, test_predict_full);
  tcase_add_test(tc, test_plot_full);
  suite_add_tcase(s, tc);
  int rc = sr_check_run(s);
  /* A case that failed may have left its tmpfs mounted: unmount them all. */
  const char *names[] = {"convert", "datagen", "metrics", "predict", "plot"};
  for (int i = 0; i < 5; i++) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", base, names[i]);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
  }
  rmdir(base);
  free(base);
  return rc;
}
