/* Tests for storage/sst.h: SST files written and ingested into a new
 * database, read back by full scans (and by kv.h's reader), and every
 * refusal (keys out of order, an empty file, an existing or missing
 * database, ingesting into a read-only one, a family that is not a table, a
 * key that is not a row id, a damaged block). Real RocksDB folders in a
 * temporary directory. */
#include <check.h>

#include "tests/check_main.h"
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "storage/kv.h"
#include "storage/sst.h"
#include "tests/support/files.h"

static char *dir;

static void setup(void) {
  dir = tmpdir_make("sst");
}

static void teardown(void) {
  sr_rmtree(dir);
  free(dir);
}

/* Row (dim 2, one state float) of key k from file generation g. */
static void row_of(uint64_t k, int g, unsigned char out[KV_ROW_HEADER + 12]) {
  float f[3] = {(float)k + 0.5f, (float)g, -(float)(k % 13)};
  kv_row_encode(2, 1, f, out);
}

/* An SST file at DIR/name with the keys [from, to) step 1 of generation g
 * (or the n keys of list); its size. */
static uint64_t write_file(const char *name, uint64_t from, uint64_t to, const uint64_t *list,
                           int n, int g) {
  char path[256], err[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  sst_writer *w;
  ck_assert_msg(sst_writer_open(path, &w, err, sizeof err) == 0, "%s", err);
  unsigned char v[KV_ROW_HEADER + 12];
  if (list) {
    for (int i = 0; i < n; i++) {
      row_of(list[i], g, v);
      ck_assert_msg(sst_writer_put(w, list[i], v, sizeof v, err, sizeof err) == 0, "%s", err);
    }
  } else {
    for (uint64_t k = from; k < to; k++) {
      row_of(k, g, v);
      ck_assert_msg(sst_writer_put(w, k, v, sizeof v, err, sizeof err) == 0, "%s", err);
    }
  }
  ck_assert_uint_eq(sst_writer_rows(w), list ? (uint64_t)n : to - from);
  uint64_t bytes = 0;
  ck_assert_msg(sst_writer_finish(w, &bytes, err, sizeof err) == 0, "%s", err);
  sst_writer_destroy(w);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq(bytes, (uint64_t)st.st_size);
  return bytes;
}

static const uint64_t BIG[3] = {1000, 1ull << 40, UINT64_MAX - 1};

/* DIR/db: table 3 from a.sst (keys 0..99, generation 1) then b.sst (keys
 * 50..149, generation 2: the later file wins where they overlap); table 7
 * from c.sst (BIG). */
static void make_db(void) {
  char path[256], err[1024];
  write_file("a.sst", 0, 100, NULL, 0, 1);
  write_file("b.sst", 50, 150, NULL, 0, 2);
  write_file("c.sst", 0, 0, BIG, 3, 3);
  snprintf(path, sizeof path, "%s/db", dir);
  const uint32_t ids[2] = {3, 7};
  sst_db *db;
  ck_assert_msg(sst_db_create(path, 2, ids, dir, &db, err, sizeof err) == 0, "%s", err);
  char fa[256], fb[256], fc[256];
  snprintf(fa, sizeof fa, "%s/a.sst", dir);
  snprintf(fb, sizeof fb, "%s/b.sst", dir);
  snprintf(fc, sizeof fc, "%s/c.sst", dir);
  const char *t3[2] = {fa, fb}, *t7[1] = {fc};
  ck_assert_int_eq(sst_db_find(db, 3), 0);
  ck_assert_int_eq(sst_db_find(db, 7), 1);
  ck_assert_msg(sst_db_ingest(db, 0, t3, 2, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(sst_db_ingest(db, 1, t7, 1, err, sizeof err) == 0, "%s", err);
  sst_db_close(db);
  /* Moved into the database, not copied. */
  ck_assert_int_ne(access(fa, F_OK), 0);
  ck_assert_int_ne(access(fc, F_OK), 0);
}

START_TEST(test_ingest_and_scan) {
  make_db();
  char path[256], err[1024];
  snprintf(path, sizeof path, "%s/db", dir);
  sst_db *db;
  ck_assert_msg(sst_db_open_read(path, dir, &db, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(sst_db_n_tables(db), 2);
  int i3 = sst_db_find(db, 3), i7 = sst_db_find(db, 7);
  ck_assert(i3 >= 0 && i7 >= 0 && i3 != i7);
  ck_assert_uint_eq(sst_db_table_id(db, i3), 3);
  ck_assert_int_eq(sst_db_find(db, 4), -1);
  uint64_t est = sst_db_estimate_rows(db, i3);
  ck_assert_msg(est >= 150 && est <= 200, "estimate %llu", (unsigned long long)est);
  for (int verify = 0; verify <= 1; verify++) {
    sst_iter *it = sst_iter_create(db, i3, verify);
    uint64_t want = 0;
    unsigned char v[KV_ROW_HEADER + 12];
    for (; sst_iter_valid(it); sst_iter_next(it), want++) {
      ck_assert_uint_eq(sst_iter_key(it), want);
      size_t len;
      const char *got = sst_iter_value(it, &len);
      row_of(want, want < 50 ? 1 : 2, v);
      ck_assert_uint_eq(len, sizeof v);
      ck_assert_msg(!memcmp(got, v, len), "row %llu", (unsigned long long)want);
    }
    ck_assert_uint_eq(want, 150);
    ck_assert_int_eq(sst_iter_status(it, err, sizeof err), 0);
    sst_iter_destroy(it);
  }
  /* Big-endian keys: byte order is row-id order up to 2^64 - 2. */
  sst_iter *it = sst_iter_create(db, i7, 1);
  int n = 0;
  for (; sst_iter_valid(it); sst_iter_next(it), n++) ck_assert_uint_eq(sst_iter_key(it), BIG[n]);
  ck_assert_int_eq(n, 3);
  ck_assert_int_eq(sst_iter_status(it, err, sizeof err), 0);
  sst_iter_destroy(it);
  /* Ingesting into a database opened for reading is refused. */
  char f[256];
  write_file("d.sst", 500, 510, NULL, 0, 4);
  snprintf(f, sizeof f, "%s/d.sst", dir);
  const char *fl[1] = {f};
  ck_assert_int_eq(sst_db_ingest(db, i3, fl, 1, err, sizeof err), SR_ESTATE);
  ck_assert_msg(strstr(err, "opened for reading") != NULL, "%s", err);
  sst_db_close(db);
  /* kv.h's reader sees the same rows, decodable. */
  const uint32_t ids[2] = {3, 7};
  kv_opts so = {.read_only = 1};
  kv_db *kv;
  ck_assert_msg(kv_open(path, 2, ids, &so, &kv, err, sizeof err) == 0, "%s", err);
  const int cf[3] = {0, 0, 1};
  const uint64_t keys[3] = {49, 50, 1ull << 40};
  kv_reader *rd = kv_reader_create();
  ck_assert_ptr_nonnull(rd);
  for (int k = 0; k < 3; k++) {
    const char *val;
    size_t len;
    float row[3];
    ck_assert_msg(kv_reader_get_cf(rd, kv, cf[k], 1, &keys[k], &val, &len, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_ptr_nonnull(val);
    ck_assert_int_eq(kv_row_decode(val, len, 2, 1, row, err, sizeof err), 0);
    ck_assert(row[0] == (float)keys[k] + 0.5f);
    ck_assert(row[1] == (float)(k == 0 ? 1 : k == 1 ? 2 : 3));
  }
  kv_reader_destroy(rd);
  kv_close(kv);
}
END_TEST

START_TEST(test_writer_refusals) {
  char path[256], err[1024];
  snprintf(path, sizeof path, "%s/w.sst", dir);
  sst_writer *w;
  unsigned char v[KV_ROW_HEADER + 12];
  row_of(5, 1, v);
  ck_assert_int_eq(sst_writer_open(path, &w, err, sizeof err), 0);
  /* An empty file cannot be finished. */
  ck_assert_int_eq(sst_writer_finish(w, NULL, err, sizeof err), SR_ESTATE);
  ck_assert_msg(strstr(err, "at least one row") != NULL, "%s", err);
  ck_assert_int_eq(sst_writer_put(w, 5, v, sizeof v, err, sizeof err), 0);
  /* Keys must ascend strictly: equal and smaller refused, naming both. */
  ck_assert_int_eq(sst_writer_put(w, 5, v, sizeof v, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "row id 5 after 5") != NULL, "%s", err);
  ck_assert_int_eq(sst_writer_put(w, 4, v, sizeof v, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "row id 4 after 5") && strstr(err, "w.sst"), "%s", err);
  ck_assert_uint_eq(sst_writer_rows(w), 1);
  ck_assert_int_eq(sst_writer_put(w, 6, v, sizeof v, err, sizeof err), 0);
  ck_assert_int_eq(sst_writer_finish(w, NULL, err, sizeof err), 0);
  sst_writer_destroy(w);
  sst_writer_destroy(NULL);
  /* A file in a folder that does not exist. */
  snprintf(path, sizeof path, "%s/no/such/w.sst", dir);
  ck_assert_int_ne(sst_writer_open(path, &w, err, sizeof err), 0);
}
END_TEST

START_TEST(test_db_refusals) {
  make_db();
  char path[256], err[1024];
  const uint32_t ids[1] = {3};
  sst_db *db = NULL;
  /* Create over an existing database. */
  snprintf(path, sizeof path, "%s/db", dir);
  ck_assert_int_eq(sst_db_create(path, 1, ids, dir, &db, err, sizeof err), SR_EEXISTS);
  ck_assert_msg(strstr(err, "already exists") != NULL, "%s", err);
  /* Open a folder that holds no database. */
  snprintf(path, sizeof path, "%s/none", dir);
  ck_assert_int_eq(sst_db_open_read(path, dir, &db, err, sizeof err), SR_ENOTFOUND);
  ck_assert_msg(strstr(err, "no CURRENT file") && strstr(err, "/none"), "%s", err);
  ck_assert_ptr_null(db);
  /* Ingest a file that is not there. */
  snprintf(path, sizeof path, "%s/db2", dir);
  ck_assert_int_eq(sst_db_create(path, 1, ids, dir, &db, err, sizeof err), 0);
  char f[256];
  snprintf(f, sizeof f, "%s/missing.sst", dir);
  const char *fl[1] = {f};
  ck_assert_int_eq(sst_db_ingest(db, 0, fl, 1, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "db2") != NULL, "%s", err);
  sst_db_close(db);
  sst_db_close(NULL);
}
END_TEST

/* A database made with RocksDB directly: family name cf holding key. */
static void raw_db(const char *name, const char *cf, const char *key, size_t klen) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  rocksdb_options_t *o = rocksdb_options_create();
  rocksdb_options_set_create_if_missing(o, 1);
  rocksdb_options_set_create_missing_column_families(o, 1);
  const char *names[2] = {"default", cf};
  const rocksdb_options_t *opts[2] = {o, o};
  rocksdb_column_family_handle_t *h[2];
  char *e = NULL;
  rocksdb_t *db = rocksdb_open_column_families(o, path, 2, names, opts, h, &e);
  ck_assert_msg(db && !e, "%s", e ? e : "");
  rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
  rocksdb_put_cf(db, wo, h[1], key, klen, "v", 1, &e);
  ck_assert_msg(!e, "%s", e);
  rocksdb_writeoptions_destroy(wo);
  for (int i = 0; i < 2; i++) rocksdb_column_family_handle_destroy(h[i]);
  rocksdb_close(db);
  rocksdb_options_destroy(o);
}

START_TEST(test_not_tables) {
  char path[256], err[1024];
  sst_db *db = NULL;
  /* A family that is not t<table_id>. */
  raw_db("junk", "junk", "12345678", 8);
  snprintf(path, sizeof path, "%s/junk", dir);
  ck_assert_int_eq(sst_db_open_read(path, dir, &db, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "column family 'junk' is not a table") != NULL, "%s", err);
  /* A key that is not a row id stops the scan, and is reported. */
  raw_db("short", "t9", "abc", 3);
  snprintf(path, sizeof path, "%s/short", dir);
  ck_assert_msg(sst_db_open_read(path, dir, &db, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(sst_db_n_tables(db), 1);
  ck_assert_uint_eq(sst_db_table_id(db, 0), 9);
  sst_iter *it = sst_iter_create(db, 0, 1);
  ck_assert_int_eq(sst_iter_valid(it), 0);
  ck_assert_int_eq(sst_iter_status(it, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "a key of 3 bytes") != NULL, "%s", err);
  sst_iter_destroy(it);
  sst_db_close(db);
}
END_TEST

/* A flipped byte in a data block: the scan with block checksums fails. */
START_TEST(test_damaged_block) {
  char path[256], err[1024], cmd[512];
  write_file("a.sst", 0, 2000, NULL, 0, 1);
  snprintf(path, sizeof path, "%s/db", dir);
  const uint32_t ids[1] = {3};
  sst_db *db;
  ck_assert_int_eq(sst_db_create(path, 1, ids, dir, &db, err, sizeof err), 0);
  char f[256];
  snprintf(f, sizeof f, "%s/a.sst", dir);
  const char *fl[1] = {f};
  ck_assert_msg(sst_db_ingest(db, 0, fl, 1, err, sizeof err) == 0, "%s", err);
  sst_db_close(db);
  snprintf(cmd, sizeof cmd, "f=$(ls %s/*.sst | head -1) && printf 'X' | dd of=$f bs=1 seek=20 "
           "conv=notrunc 2>/dev/null", path);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_msg(sst_db_open_read(path, dir, &db, err, sizeof err) == 0, "%s", err);
  sst_iter *it = sst_iter_create(db, 0, 1);
  uint64_t n = 0;
  for (; sst_iter_valid(it); sst_iter_next(it)) n++;
  ck_assert_int_eq(sst_iter_status(it, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "orrupt") != NULL, "%s", err);
  ck_assert_uint_lt(n, 2000);
  sst_iter_destroy(it);
  sst_db_close(db);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sst");
  TCase *tc = tcase_create("sst");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_ingest_and_scan);
  tcase_add_test(tc, test_writer_refusals);
  tcase_add_test(tc, test_db_refusals);
  tcase_add_test(tc, test_not_tables);
  tcase_add_test(tc, test_damaged_block);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
