/* Out of memory in storage/: every allocation of kv_open (a new database and
 * an existing one with families beyond the ones asked for) and of a
 * MultiGet's buffers failed in turn is SR_ENOMEM with a message naming the
 * database, crashes nothing, and the database opens and reads afterwards.
 * The allocator fails on the Nth call (tests/common/fail_alloc.h). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "storage/kv.h"
#include "tests/check_main.h"
#include "tests/common/fail_alloc.h"
#include "tests/support/files.h"

static char *dir;

static void setup(void) {
  dir = tmpdir_make("kvalloc");
}

static void teardown(void) {
  sr_rmtree(dir);
  free(dir);
}

/* kv_open of path with tables ids[n], its Nth allocation failing for every
 * N it makes; the number of failures seen. */
static int open_failing(const char *path, int n, const uint32_t *ids) {
  int failures = 0;
  for (long k = 1; k < 1000; k++) {
    kv_db *db = NULL;
    char err[512] = "";
    fail_alloc_arm(k);
    int rc = kv_open(path, n, ids, NULL, &db, err, sizeof err);
    long failed = fail_alloc_failed;
    fail_alloc_arm(0);
    if (!failed) {
      ck_assert_msg(rc == 0, "%s", err);
      kv_close(db);
      return failures;
    }
    ck_assert_msg(rc == SR_ENOMEM, "allocation %ld: rc %d (%s)", k, rc, err);
    ck_assert_ptr_null(db);
    ck_assert_msg(strstr(err, path) && strstr(err, "out of memory"), "%s", err);
    failures++;
  }
  ck_abort_msg("kv_open made more than 1000 allocations");
  return failures;
}

START_TEST(test_kv_open_oom) {
  char path[512];
  ck_assert_int_eq(sr_path(path, sizeof path, "%s/db", dir), 0);
  const uint32_t three[3] = {4, 9, 12}, one[1] = {9};
  ck_assert_int_ge(open_failing(path, 3, three), 4); /* creates it */
  /* Existing, with families 4 and 12 beyond the one asked for: the family
   * list of the database is read and merged too. */
  ck_assert_int_ge(open_failing(path, 1, one), 5);
  /* Writes and reads work after all that. */
  kv_db *db;
  char err[512];
  ck_assert_int_eq(kv_open(path, 1, one, NULL, &db, err, sizeof err), 0);
  const float row[2] = {1.5f, -2.0f};
  unsigned char enc[64];
  kv_row_encode(2, 0, row, enc);
  kv_writes *wr = kv_writes_create();
  ck_assert_ptr_nonnull(wr);
  kv_writes_put(wr, db, 0, 77, enc, kv_row_size(2, 0));
  ck_assert_int_eq(kv_writes_commit(wr, db, err, sizeof err), 0);
  kv_writes_destroy(wr);
  kv_reader *rd = kv_reader_create();
  ck_assert_ptr_nonnull(rd);
  const uint64_t key = 77;
  const char *val = NULL;
  size_t len = 0;
  int failures = 0;
  for (long k = 1; k < 100; k++) { /* the MultiGet's buffers */
    kv_reader_release(rd);
    fail_alloc_arm(k);
    int rc = kv_reader_get_cf(rd, db, 0, 1, &key, &val, &len, err, sizeof err);
    long failed = fail_alloc_failed;
    fail_alloc_arm(0);
    if (!failed) {
      ck_assert_int_eq(rc, 0);
      break;
    }
    ck_assert_int_eq(rc, SR_ENOMEM);
    failures++;
  }
  ck_assert_int_ge(failures, 1);
  float back[2];
  ck_assert_ptr_nonnull(val);
  ck_assert_int_eq(kv_row_decode(val, len, 2, 0, back, err, sizeof err), 0);
  ck_assert(back[0] == 1.5f && back[1] == -2.0f);
  kv_reader_destroy(rd);
  kv_close(db);
}
END_TEST

int main(void) {
  Suite *s = suite_create("storage_alloc");
  TCase *tc = tcase_create("oom");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_kv_open_oom);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
