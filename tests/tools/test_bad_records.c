/* Records of a binary file that no convert writes, through the real
 * binary: a dense value outside the file's range (convert's, or the one
 * its header declares) refused naming file, record and split; a bad record
 * of the test split refused before the first step; a non-finite loss named
 * with the records of its batch. Each file is one convert wrote, edited in
 * place with its checksums recomputed. */
#include <check.h>

#include "tests/check_main.h"

#include <math.h>

#include "tests/support/proc.h"
#include "tests/tools/bin_edit.h"

#define REC 160u /* one-hot, 32-bit ids: f32 label, f32 dense[13], u32 ids[26] */
#define H_FLAGS 12u
#define H_TRAIN 32u
#define H_DENSE_LO 528u
#define H_DENSE_HI 532u

static char *dir;
static char path[4200];
static uint64_t doff, n_train;

/* 2000 samples, the last 10% the test split: d.bin. */
static void setup(void) {
  dir = make_data_dir(2000, 11, NULL);
  snprintf(path, sizeof path, "%s/d.bin", dir);
  doff = bin_data_off(path);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, H_TRAIN, SEEK_SET);
  ck_assert_int_eq((int)fread(&n_train, 8, 1, f), 1);
  fclose(f);
  ck_assert(n_train == 1800);
}

static void teardown(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Dense feature k (0-based) of record r set to v. */
static void set_dense(uint64_t r, int k, float v) {
  edit_bin(path, doff + r * REC + 4 + 4u * (unsigned)k, &v);
}

/* The header's flag DS_BIN_DENSE_RANGE and the range [lo, hi]. */
static void declare_range(float lo, float hi) {
  uint32_t flags = DS_BIN_DENSE_RANGE;
  edit_bin(path, H_FLAGS, &flags);
  edit_bin(path, H_DENSE_LO, &lo);
  edit_bin(path, H_DENSE_HI, &hi);
}

/* train on d.bin with flags; its output (caller frees), exit status in *rc. */
static char *train(int *rc, const char *flags) {
  char *out;
  *rc = run_cmd(&out, "cd %s && %s train --processed-data-file d.bin --mini-batch-size 16 "
                      "--print-freq 1 %s", dir, bin_path(), flags);
  return out;
}

/* A finite dense value past the largest convert writes (log1p of
 * INT64_MAX, 43.6683) is refused with file, record, field and split; the
 * header's declared range lets it in, and is enforced in its turn. */
START_TEST(test_dense_range) {
  int rc;
  set_dense(5, 2, 1e5f);
  char *out = train(&rc, "--num-batches 4");
  ck_assert_msg(rc != 0 && strstr(out, "d.bin: record 5: dense I3 is 100000, outside [0, 43.6683], "
                                       "the range convert writes") &&
                    strstr(out, "(train split)") && !strstr(out, "done   "),
                "exit %d: %s", rc, out);
  free(out);
  set_dense(5, 2, 100.0f); /* outside convert's range, mild enough to train on */
  out = train(&rc, "--num-batches 4");
  ck_assert_msg(rc != 0 && strstr(out, "d.bin: record 5: dense I3 is 100, outside [0, 43.6683]"),
                "exit %d: %s", rc, out);
  free(out);
  declare_range(0, 1000);
  out = train(&rc, "--num-batches 4");
  ck_assert_msg(rc == 0 && strstr(out, "done   4 steps"), "exit %d: %s", rc, out);
  free(out);
  declare_range(0, 50);
  out = train(&rc, "--num-batches 4");
  ck_assert_msg(rc != 0 && strstr(out, "d.bin: record 5: dense I3 is 100, outside [0, 50], "
                                       "the range the file's header declares"),
                "exit %d: %s", rc, out);
  free(out);
  declare_range(1, -1);
  out = train(&rc, "--num-batches 4");
  ck_assert_msg(rc != 0 && strstr(out, "d.bin: header: dense range [1, -1] is empty"), "exit %d: %s",
                rc, out);
  free(out);
}
END_TEST

/* A bad record of the test split stops the job before its first step,
 * named with its index in the file and its split: a label, then (the label
 * put back) a dense value. */
START_TEST(test_bad_test_record_first) {
  int rc;
  const uint64_t r = n_train + 7;
  const float two = 2.0f, one = 1.0f, zero = 0.0f;
  float was;
  FILE *f = fopen(path, "rb");
  fseek(f, (long)(doff + r * REC), SEEK_SET);
  ck_assert_int_eq((int)fread(&was, 4, 1, f), 1);
  fclose(f);
  edit_bin(path, doff + r * REC, &two);
  char *out = train(&rc, "--num-batches 20 --test-freq 10");
  char want[200];
  snprintf(want, sizeof want, "d.bin: record %llu: label 2 is not 0 or 1 (test split)",
           (unsigned long long)r);
  ck_assert_msg(rc != 0 && strstr(out, want) && strstr(out, "before the first step") &&
                    !strstr(out, "train  step"),
                "exit %d: %s", rc, out);
  free(out);
  edit_bin(path, doff + r * REC, was == 1.0f ? &one : &zero);
  set_dense(r, 12, 3e4f);
  out = train(&rc, "--num-batches 20 --test-freq 10");
  snprintf(want, sizeof want, "d.bin: record %llu: dense I13 is 30000, outside [0, 43.6683]",
           (unsigned long long)r);
  ck_assert_msg(rc != 0 && strstr(out, want) && strstr(out, "(test split)") &&
                    !strstr(out, "train  step"),
                "exit %d: %s", rc, out);
  free(out);
}
END_TEST

/* Huge dense values a header lets in (no range) make the loss non-finite
 * within a few steps: the message names the step and the records of its
 * batch in the file (16 a step: step S's are 16S..16S+15). */
START_TEST(test_nonfinite_loss_names_batch) {
  int rc;
  declare_range(-INFINITY, INFINITY);
  const float huge = 1e6f;
  for (int k = 0; k < 13; k++) edit_bin_each(path, doff + 4 + 4u * (unsigned)k, REC, n_train, &huge);
  char *out = train(&rc, "--num-batches 40");
  const char *at = strstr(out, "shardrec train: step ");
  ck_assert_msg(rc != 0 && at && strstr(at, ": the loss is ") && !strstr(out, "done   "),
                "exit %d: %s", rc, out);
  long step = strtol(at + strlen("shardrec train: step "), NULL, 10);
  char want[200];
  snprintf(want, sizeof want, "(batch of d.bin records %ld..%ld)", 16 * step, 16 * step + 15);
  ck_assert_msg(strstr(at, want), "wanted %s in: %s", want, out);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bad_records");
  TCase *tc = tcase_create("bin");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_dense_range);
  tcase_add_test(tc, test_bad_test_record_first);
  tcase_add_test(tc, test_nonfinite_loss_names_batch);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
