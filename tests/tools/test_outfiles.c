/* Single-file outputs of every command, through the real binary: a folder
 * at an output path is refused before any work (exit status 2, the path
 * named) and left as it is; a command that succeeds leaves its files under
 * their final names and no temporary beside them. (The full-disk cases,
 * which mount a tmpfs, are test_full_disk.) */
#include <check.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

/* Each command with a folder where one of its files goes: the folder's
 * name, the command line (%s: the binary), what must not appear in its
 * output (a sign that work was done), a file that must not appear. */
typedef struct {
  const char *folder, *cmd, *not_said, *not_made;
} folder_case;

static const folder_case cases[] = {
    {"F", "%s datagen --rows 500 --out F", "lines/s", NULL},
    {"o.tsv.probs", "%s datagen --rows 500 --out o.tsv", "lines/s", "o.tsv"},
    {"o.tsv.summary.json", "%s datagen --rows 500 --out o.tsv", "lines/s", "o.tsv"},
    {"F", "%s convert --test-fraction 0.1 d.tsv F", "converted", NULL},
    {"F", "%s plan --processed-data-file d.bin --out F", "wrote", NULL},
    {"F", "%s plot d.tsv --out F", "d.tsv", NULL},
    {"F", "%s predict --checkpoint nowhere --processed-data-file d.bin --out F", "nowhere", NULL},
    {"F", "%s predict --checkpoint nowhere --processed-data-file d.bin --out p.tsv "
          "--metrics-out F", "nowhere", "p.tsv"},
    {"F", "%s eval --checkpoint nowhere --processed-data-file d.bin --out F", "nowhere", NULL},
    {"F", "%s train --processed-data-file d.bin --num-batches 2 --metrics-out F", "train  step",
     NULL},
    {"F", "%s train --processed-data-file d.bin --num-batches 2 --plan-out F", "train  step",
     NULL},
    {"F", "%s train --processed-data-file d.bin --num-batches 2 --test-pred-out F",
     "train  step", NULL},
};

START_TEST(test_folder_refused_and_kept) {
  char *d = make_data_dir(2000, 5, NULL), *out;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const folder_case *c = &cases[i];
    ck_assert_int_eq(run_cmd(NULL, "cd %s && mkdir %s && echo kept > %s/inside", d, c->folder,
                             c->folder), 0);
    char cmd[512], said[256];
    snprintf(cmd, sizeof cmd, c->cmd, bin_path());
    int rc = run_cmd(&out, "cd %s && %s", d, cmd);
    snprintf(said, sizeof said, "%s: is a folder", c->folder);
    ck_assert_msg(rc == 2 && strstr(out, said) && !strstr(out, c->not_said),
                  "%s: exit %d (not 2), or the folder not named, or work done:\n%s", cmd, rc, out);
    free(out);
    /* The folder and what it holds are as they were; nothing else made. */
    ck_assert_int_eq(run_cmd(&out, "cd %s && cat %s/inside && ls %s | wc -l && ls | wc -l", d,
                             c->folder, c->folder), 0);
    ck_assert_msg(!strcmp(out, "kept\n1\n5\n"), "%s: after it (inside, entries in the folder, "
                  "entries beside it):\n%s", cmd, out);
    free(out);
    if (c->not_made) ck_assert_int_eq(run_cmd(NULL, "test -e %s/%s", d, c->not_made), 1);
    ck_assert_int_eq(run_cmd(NULL, "rm -rf %s/%s", d, c->folder), 0);
  }
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* An output named as one of the command's inputs (the same path, another
 * spelling of it, a link to it) or as another of its outputs is refused
 * before any work, naming both flags: the data files stay byte for byte,
 * and nothing is made. */
static const struct {
  const char *cmd, *said;
} clashes[] = {
    {"%s predict --checkpoint nowhere --raw-data-file d.tsv --out d.tsv",
     "--out d.tsv is the file --raw-data-file reads (d.tsv)"},
    {"%s predict --checkpoint nowhere --processed-data-file d.bin --out ./d.bin",
     "--out ./d.bin is the file --processed-data-file reads (d.bin)"},
    {"%s predict --checkpoint nowhere --processed-data-file d.bin --out p.tsv --metrics-out "
     "../D/p.tsv", "--metrics-out ../D/p.tsv is the file --out writes (p.tsv)"},
    {"%s eval --checkpoint nowhere --processed-data-file d.bin --out d.bin",
     "--out d.bin is the file --processed-data-file reads"},
    {"ln -s d.tsv l.tsv && %s convert --test-fraction 0.1 l.tsv d.tsv",
     "OUT d.tsv is the file IN reads (l.tsv)"},
    {"%s plan --processed-data-file d.bin --out d.bin", "--out d.bin is the file"},
    {"%s train --processed-data-file d.bin --num-batches 2 --metrics-out d.bin",
     "--metrics-out d.bin is the file --processed-data-file reads"},
    {"%s train --raw-data-file d.tsv --num-batches 2 --plan-out p.json --test-pred-out p.json",
     "--test-pred-out p.json is the file --plan-out writes"},
    {"%s plot d.tsv --out d.tsv", "--out d.tsv is the file METRICS reads"},
};

START_TEST(test_output_is_input_refused) {
  char *d = make_data_dir(2000, 5, NULL), *out, *before, *after;
  ck_assert_int_eq(run_cmd(NULL, "mv %s %s.x && mkdir %s && mv %s.x %s/D", d, d, d, d, d), 0);
  const char *sums = "cd %s/D && sha256sum d.tsv d.bin && ls";
  ck_assert_int_eq(run_cmd(&before, sums, d), 0);
  for (size_t i = 0; i < sizeof clashes / sizeof clashes[0]; i++) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, clashes[i].cmd, bin_path());
    int rc = run_cmd(&out, "cd %s/D && %s", d, cmd);
    ck_assert_msg(rc == 2 && strstr(out, clashes[i].said), "%s: exit %d (not 2), or not '%s':\n%s",
                  cmd, rc, clashes[i].said, out);
    free(out);
    ck_assert_int_eq(run_cmd(NULL, "rm -f %s/D/l.tsv", d), 0);
    ck_assert_int_eq(run_cmd(&after, sums, d), 0);
    ck_assert_msg(!strcmp(before, after), "%s: the folder changed:\n%s\nagainst\n%s", cmd, after,
                  before);
    free(after);
  }
  free(before);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

/* datagen's three files, plain and gzipped, land under their names with no
 * temporary beside them, the gzipped TSV holding the plain one's bytes. */
START_TEST(test_datagen_no_temporaries) {
  char *d = tmpdir_make("test"), *out;
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s datagen --rows 3000 --seed 4 --out a.tsv && "
                                 "%s datagen --rows 3000 --seed 4 --gzip --out b.tsv.gz && ls",
                           d, bin_path(), bin_path()), 0);
  ck_assert_str_eq(strstr(out, "a.tsv\n"), "a.tsv\na.tsv.probs\na.tsv.summary.json\nb.tsv.gz\n"
                                           "b.tsv.gz.probs\nb.tsv.gz.summary.json\n");
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && zcat b.tsv.gz | cmp - a.tsv && cmp a.tsv.probs "
                                 "b.tsv.gz.probs", d), 0);
  run_cmd(NULL, "rm -rf %s", d);
  free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("outfiles");
  TCase *tc = tcase_create("outfiles");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_folder_refused_and_kept);
  tcase_add_test(tc, test_datagen_no_temporaries);
  tcase_add_test(tc, test_output_is_input_refused);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
