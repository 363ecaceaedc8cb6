/* The progress line of the long commands (common/progress.h), with the real
 * binary: on a terminal (script(1) gives the command one) convert's passes,
 * datagen, predict and inspect draw "... ETA N s" lines redrawn with \r;
 * with stderr not a terminal none of it appears. */
#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/support/proc.h"

static char *g_dir;

static void setup(void) { g_dir = tmpdir_make("test"); }
static void teardown(void) {
  sr_rmtree(g_dir);
  free(g_dir);
}

/* Runs "shardrec ARGS" in g_dir on a terminal (tty) or with its output in a
 * pipe; the output (caller frees). */
static char *run_in(int tty, const char *args) {
  char *out;
  int rc = tty ? run_cmd(&out, "cd %s && script -qec \"%s %s\" /dev/null", g_dir, bin_path(), args)
               : run_cmd(&out, "cd %s && %s %s", g_dir, bin_path(), args);
  ck_assert_msg(rc == 0, "%s: %s", args, out);
  return out;
}

START_TEST(test_progress_on_a_terminal_only) {
  static const char *const steps[][3] = {
      /* args, the line on a terminal */
      {"datagen --rows 30000 --seed 3 --out d.tsv", "datagen: 30.0k/30.0k lines (100%)", NULL},
      {"convert --test-fraction 0.1 d.tsv d.bin", "convert: counting lines: ", "convert: writing: 30.0k/30.0k samples (100%)"},
      {"train --processed-data-file d.bin --num-batches 30 --data-dir dd --cache-rows 10000 --save-model model", NULL, NULL},
      {"predict --checkpoint model --processed-data-file d.bin --out p.txt", "predict: 30.0k/30.0k samples (100%)", NULL},
      {"inspect dd", "inspect shard-0: ", NULL},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    char *a = run_in(0, steps[i][0]);
    ck_assert_msg(!strstr(a, "ETA") || !strncmp(steps[i][0], "train", 5), "%s off a terminal: %s", steps[i][0], a);
    ck_assert_msg(!strchr(a, '\r') || !strncmp(steps[i][0], "train", 5), "%s: a \\r off a terminal", steps[i][0]);
    free(a);
    if (!steps[i][1]) continue;
    a = run_in(1, steps[i][0]);
    for (int k = 1; k < 3; k++)
      ck_assert_msg(!steps[i][k] || strstr(a, steps[i][k]), "%s on a terminal: no '%s' in:\n%s", steps[i][0], steps[i][k], a);
    ck_assert_msg(strstr(a, "\r") && strstr(a, "/s") && (strstr(a, ", ETA ") || !strncmp(steps[i][0], "inspect", 7)),
                  "%s: no rate and ETA: %s", steps[i][0], a);
    free(a);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("progress");
  TCase *tc = tcase_create("progress");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_progress_on_a_terminal_only);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
