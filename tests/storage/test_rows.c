/* Tests for storage/kv.h: the row encoding and its checks, the database
 * wrapper (column families, MultiGet, write batches, checkpoints, the
 * figures for monitoring). */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/sha256.h"
#include "common/status.h"
#include "storage/kv.h"
#include "tests/support/files.h"

START_TEST(test_row_roundtrip) {
  float v[6] = {1.5f, -2.25f, 3e-8f, -0.0f, 7, 8}, back[6];
  unsigned char buf[64];
  kv_row_encode(4, 2, v, buf);
  ck_assert_uint_eq(kv_row_size(4, 2), 8 + 24);
  ck_assert_int_eq(buf[2], KV_ROW_VERSION);
  char err[256];
  ck_assert_int_eq(kv_row_decode(buf, kv_row_size(4, 2), 4, 2, back, err, sizeof err), 0);
  ck_assert(!memcmp(v, back, sizeof v));
}
END_TEST

START_TEST(test_row_refusals) {
  float v[6] = {1, 2, 3, 4, 5, 6}, back[6] = {0};
  unsigned char buf[64];
  char err[256];
  size_t n = kv_row_size(4, 2);
  kv_row_encode(4, 2, v, buf);
  buf[2] = KV_ROW_VERSION + 1;
  ck_assert_int_eq(kv_row_decode(buf, n, 4, 2, back, err, sizeof err), SR_EVERSION);
  ck_assert_ptr_nonnull(strstr(err, "version"));
  kv_row_encode(4, 2, v, buf);
  buf[0] = 'X';
  ck_assert_int_eq(kv_row_decode(buf, n, 4, 2, back, err, sizeof err), SR_EFORMAT);
  kv_row_encode(4, 2, v, buf);
  ck_assert_int_eq(kv_row_decode(buf, n, 4, 1, back, err, sizeof err), SR_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(err, "dim 4 state 2"));
  ck_assert_int_eq(kv_row_decode(buf, n - 3, 4, 2, back, err, sizeof err), SR_EFORMAT);
  ck_assert_int_eq(kv_row_decode(buf, 3, 4, 2, back, err, sizeof err), SR_EFORMAT);
  for (int i = 0; i < 6; i++) ck_assert(back[i] == 0); /* nothing written on refusal */
}
END_TEST

/* 16-bit rows: version 2 with the weights byte, 2 bytes a weight, state
 * floats; either version read by a table of either precision. */
START_TEST(test_row_16bit) {
  /* Weights of both formats (exact in fp16 and bf16), then the state. */
  float v[7] = {1.5f, -2.25f, 0.0078125f, -0.0f, 96.0f, 3.25e-3f, 1e-9f}, back[7];
  unsigned char buf[64];
  char err[256];
  int w;
  for (int fmt = KV_W_FP16; fmt <= KV_W_BF16; fmt++) {
    size_t n = kv_row_size_w(5, 2, fmt);
    ck_assert_uint_eq(n, 8 + 5 * 2 + 2 * 4);
    memset(buf, 0xee, sizeof buf);
    kv_row_encode_w(5, 2, fmt, v, buf);
    ck_assert_int_eq(buf[2], KV_ROW_VERSION_16);
    ck_assert_int_eq(buf[3], fmt);
    ck_assert_int_eq(buf[n], 0xee); /* nothing past the row */
    ck_assert_int_eq(kv_row_check(buf, n, 5, 2, &w), 1);
    ck_assert_int_eq(w, fmt);
    ck_assert_int_eq(kv_row_check(buf, n - 1, 5, 2, &w), 0);
    ck_assert_int_eq(kv_row_check(buf, n, 5, 1, &w), 0);
    ck_assert_int_eq(kv_row_decode_w(buf, n, 5, 2, fmt, back, err, sizeof err), 0);
    ck_assert_mem_eq(v, back, sizeof v);
    /* Read by an fp32 table: the same floats. */
    ck_assert_int_eq(kv_row_decode_w(buf, n, 5, 2, KV_W_FP32, back, err, sizeof err), 0);
    ck_assert_mem_eq(v, back, sizeof v);
    /* Refused, nothing written: torn, another layout, a weights byte unknown. */
    memset(back, 0, sizeof back);
    ck_assert_int_eq(kv_row_decode_w(buf, n - 2, 5, 2, fmt, back, err, sizeof err), SR_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "torn"));
    ck_assert_int_eq(kv_row_decode_w(buf, n, 4, 2, fmt, back, err, sizeof err), SR_EMISMATCH);
    buf[3] = 7;
    ck_assert_int_eq(kv_row_decode_w(buf, n, 5, 2, fmt, back, err, sizeof err), SR_EVERSION);
    ck_assert_int_eq(kv_row_check(buf, n, 5, 2, &w), 0);
    for (int i = 0; i < 7; i++) ck_assert(back[i] == 0);
  }
  /* An fp32 row (version 1, as ever) read by a 16-bit table: rounded to
   * nearest of its format, the state as it was. */
  float x[3] = {1.0f + 0x1p-12f, 1.0f + 0x1.8p-11f, 0.1f}, y[3];
  kv_row_encode_w(2, 1, KV_W_FP32, x, buf);
  ck_assert_int_eq(buf[2], KV_ROW_VERSION);
  ck_assert_int_eq(kv_row_check(buf, kv_row_size(2, 1), 2, 1, &w), 1);
  ck_assert_int_eq(w, KV_W_FP32);
  ck_assert_int_eq(kv_row_decode_w(buf, kv_row_size(2, 1), 2, 1, KV_W_FP16, y, err, sizeof err), 0);
  ck_assert(y[0] == 1.0f && y[1] == 1.0f + 0x1p-10f && y[2] == 0.1f);
  ck_assert_int_eq(kv_row_decode_w(buf, kv_row_size(2, 1), 2, 1, KV_W_BF16, y, err, sizeof err), 0);
  ck_assert(y[0] == 1.0f && y[1] == 1.0f && y[2] == 0.1f);
}
END_TEST

START_TEST(test_db_roundtrip) {
  char *dir = tmpdir_make("kv");
  char path[256], ck[256], err[512];
  snprintf(path, sizeof path, "%s/db", dir);
  snprintf(ck, sizeof ck, "%s/ck", dir);
  uint32_t ids[2] = {7, 3};
  kv_db *db;
  kv_opts o = {.write_buffer_bytes = 1 << 20};
  ck_assert_int_eq(kv_open(path, 2, ids, &o, &db, err, sizeof err), 0);
  ck_assert_int_eq(kv_cf_index(db, 3), 1);
  ck_assert_int_eq(kv_cf_index(db, 9), -1);
  /* Keys big-endian: iteration is by ascending row id. */
  uint64_t keys[5] = {1ULL << 40, 5, 256, 1, 0xffffffffffffffffULL};
  kv_writes *w = kv_writes_create();
  ck_assert_ptr_nonnull(w);
  for (int i = 0; i < 5; i++) {
    float f = (float)i;
    kv_writes_put(w, db, 0, keys[i], &f, 4);
  }
  ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
  kv_writes_destroy(w);
  kv_iter *it = kv_iter_create(db, 0);
  uint64_t prev = 0;
  int n = 0;
  for (; kv_iter_valid(it); kv_iter_next(it), n++) {
    if (n) ck_assert(kv_iter_key(it) > prev);
    prev = kv_iter_key(it);
  }
  kv_iter_destroy(it);
  ck_assert_int_eq(n, 5);
  uint64_t q[2] = {256, 77};
  const char *vals[2];
  size_t lens[2];
  kv_reader *rd = kv_reader_create();
  ck_assert_ptr_nonnull(rd);
  ck_assert_int_eq(kv_reader_get_cf(rd, db, 1, 1, q, vals, lens, err, sizeof err), 0);
  ck_assert_ptr_null(vals[0]); /* other family */
  ck_assert_int_eq(kv_reader_get_cf(rd, db, 0, 2, q, vals, lens, err, sizeof err), 0);
  ck_assert_ptr_nonnull(vals[0]);
  ck_assert_ptr_null(vals[1]);
  ck_assert_uint_eq(lens[0], 4);
  float f;
  memcpy(&f, vals[0], 4);
  ck_assert(f == 2.0f);
  kv_reader_destroy(rd);
  ck_assert_int_eq(kv_checkpoint(db, ck, err, sizeof err), 0);
  kv_close(db);
  uint32_t *have;
  int nh;
  ck_assert_int_eq(kv_list_tables(ck, &have, &nh, err, sizeof err), 0);
  ck_assert_int_eq(nh, 2);
  free(have);
  ck_assert_int_ne(kv_list_tables("/nonexistent/db", &have, &nh, err, sizeof err), 0);
  kv_opts ro = {.read_only = 1};
  ck_assert_int_eq(kv_open(ck, 2, ids, &ro, &db, err, sizeof err), 0);
  it = kv_iter_create(db, 0);
  n = 0;
  for (; kv_iter_valid(it); kv_iter_next(it)) n++;
  kv_iter_destroy(it);
  ck_assert_int_eq(n, 5);
  kv_close(db);
  char **files;
  int nf;
  ck_assert_int_eq(sr_list_files(ck, &files, &nf), 0);
  ck_assert_int_gt(nf, 2);
  char hex[65];
  uint64_t size;
  char fp[512];
  snprintf(fp, sizeof fp, "%s/%s", ck, files[0]);
  ck_assert_int_eq(sr_sha256_file(fp, hex, &size), 0);
  ck_assert_uint_eq(strlen(hex), 64);
  sr_paths_free(files, nf);
  ck_assert_int_eq(sr_rmtree(dir), 0);
  ck_assert_int_ne(access(dir, F_OK), 0);
  free(dir);
}
END_TEST

/* kv_figures_get and kv_estimate_rows: nothing in SST files while the rows
 * are in the memtable; after a flush the SST bytes are the files' and the
 * estimate counts the rows. Table readers keep their index and filter
 * blocks (kv.h), and an uncompressed table's are read in place from the
 * mapped file: the readers' heap stays below the bytes of the 10-bit bloom
 * filters alone. Rows read back, twice, with no block cache (uncompressed)
 * and through the lz4 table's block cache. */
START_TEST(test_db_figures) {
  for (int lz4 = 0; lz4 < 2; lz4++) {
    char *dir = tmpdir_make("kv");
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/db", dir);
    uint32_t ids[2] = {7, 3};
    kv_db *db;
    kv_opts o = {.block_cache_bytes = 1 << 20, .write_buffer_bytes = 1 << 20,
                 .compression = lz4 ? KV_COMPRESSION_LZ4 : KV_COMPRESSION_NONE};
    ck_assert_int_eq(kv_open(path, 2, ids, &o, &db, err, sizeof err), 0);
    float v[16] = {0};
    kv_figures f[3];
    static const uint64_t from[2] = {0, 1000}, to[2] = {1000, 11000};
    for (int pass = 0; pass < 2; pass++) {
      kv_writes *w = kv_writes_create();
      ck_assert_ptr_nonnull(w);
      for (uint64_t k = from[pass]; k < to[pass]; k++) {
        v[0] = (float)k;
        kv_writes_put(w, db, 1, k, v, sizeof v);
      }
      ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
      kv_writes_destroy(w);
      if (!pass) {
        ck_assert_int_eq(kv_figures_get(db, &f[0]), 0);
        ck_assert_uint_eq(f[0].sst_bytes, 0);
        ck_assert_uint_eq(f[0].table_readers_bytes, 0);
      }
      ck_assert_int_eq(kv_flush(db, err, sizeof err), 0);
      ck_assert_int_eq(kv_figures_get(db, &f[1 + pass]), 0);
    }
    ck_assert_uint_gt(f[2].sst_bytes, f[1].sst_bytes);
    ck_assert_uint_gt(f[1].sst_bytes, lz4 ? 1000 * 8 : 1000 * sizeof v / 2);
    ck_assert_uint_eq(kv_estimate_rows(db, 1), 11000);
    ck_assert_uint_eq(kv_estimate_rows(db, 0), 0);
    ck_assert_uint_gt(f[1].table_readers_bytes, 0);
    if (!lz4)
      ck_assert_msg(f[2].table_readers_bytes < 11000 * 10 / 8,
                    "table readers' heap %llu bytes: index and filter blocks not read in place",
                    (unsigned long long)f[2].table_readers_bytes);
    uint64_t q[3] = {10, 500, 10999};
    const char *vals[3];
    size_t lens[3];
    kv_reader *rd = kv_reader_create();
    ck_assert_ptr_nonnull(rd);
    for (int again = 0; again < 2; again++) {
      ck_assert_int_eq(kv_reader_get_cf(rd, db, 1, 3, q, vals, lens, err, sizeof err), 0);
      for (int i = 0; i < 3; i++) {
        ck_assert_ptr_nonnull(vals[i]);
        ck_assert_uint_eq(lens[i], sizeof v);
        float got;
        memcpy(&got, vals[i], sizeof got);
        ck_assert_float_eq(got, (float)q[i]);
      }
    }
    kv_reader_destroy(rd);
    kv_close(db);
    ck_assert_int_eq(sr_rmtree(dir), 0);
    free(dir);
  }
}
END_TEST

/* kv_reader_get_sorted_cf: ascending keys read the same values (and the
 * same absences) as kv_reader_get_cf; keys that do not ascend are refused,
 * naming the first one out of order. */
START_TEST(test_sorted_multiget) {
  char *dir = tmpdir_make("kv");
  char path[256], err[512];
  snprintf(path, sizeof path, "%s/db", dir);
  uint32_t id = 1;
  kv_db *db;
  ck_assert_int_eq(kv_open(path, 1, &id, NULL, &db, err, sizeof err), 0);
  kv_writes *w = kv_writes_create();
  ck_assert_ptr_nonnull(w);
  for (uint64_t k = 0; k < 300; k += 3) {
    float v[2] = {(float)k, -(float)k};
    kv_writes_put(w, db, 0, k << 40, v, sizeof v); /* high bytes differ: big-endian order */
  }
  ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
  kv_writes_destroy(w);
  ck_assert_int_eq(kv_flush(db, err, sizeof err), 0);
  uint64_t q[100];
  for (int i = 0; i < 100; i++) q[i] = ((uint64_t)i * 2) << 40; /* every third present */
  const char *va[100], *vb[100];
  size_t la[100], lb[100];
  kv_reader *ra = kv_reader_create(), *rb = kv_reader_create();
  ck_assert_int_eq(kv_reader_get_cf(ra, db, 0, 100, q, va, la, err, sizeof err), 0);
  ck_assert_int_eq(kv_reader_get_sorted_cf(rb, db, 0, 100, q, vb, lb, err, sizeof err), 0);
  int found = 0;
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(va[i] != NULL, (i * 2) % 3 == 0);
    ck_assert_int_eq(vb[i] != NULL, va[i] != NULL);
    if (!va[i]) continue;
    found++;
    ck_assert_uint_eq(lb[i], la[i]);
    ck_assert(!memcmp(va[i], vb[i], la[i]));
  }
  ck_assert_int_eq(found, 34);
  q[50] = q[49];
  ck_assert_int_eq(kv_reader_get_sorted_cf(rb, db, 0, 100, q, vb, lb, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "key 50") && strstr(err, "does not ascend"), "%s", err);
  kv_reader_destroy(ra);
  kv_reader_destroy(rb);
  kv_close(db);
  ck_assert_int_eq(sr_rmtree(dir), 0);
  free(dir);
}
END_TEST

/* The value {key, tag} of row k of family cf, or tag -1 when absent. */
static float ingest_tag(kv_db *db, int cf, uint64_t k) {
  char err[512];
  const char *v;
  size_t l;
  kv_reader *rd = kv_reader_create();
  ck_assert_int_eq(kv_reader_get_cf(rd, db, cf, 1, &k, &v, &l, err, sizeof err), 0);
  float f[2] = {0, -1};
  if (v) {
    ck_assert_uint_eq(l, sizeof f);
    memcpy(f, v, sizeof f);
    ck_assert(f[0] == (float)k);
  }
  kv_reader_destroy(rd);
  return f[1];
}

/* Rows [lo, hi) of family cf ingested with tag (their value {k, tag}). */
static void ingest_rows(kv_ingest *g, kv_db *db, int cf, uint64_t lo, uint64_t hi, float tag) {
  char err[512];
  ck_assert_int_eq(kv_ingest_begin(g, db, cf, err, sizeof err), 0);
  for (uint64_t k = lo; k < hi; k++) {
    float v[2] = {(float)k, tag};
    ck_assert_int_eq(kv_ingest_put(g, k, v, sizeof v, err, sizeof err), 0);
  }
  ck_assert_msg(kv_ingest_commit(g, err, sizeof err) == 0, "%s", err);
}

/* Files named ingest-*.sst in path. */
static int ingest_files(const char *path) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "ls %s | grep -c '^ingest-' || true", path);
  FILE *f = popen(cmd, "r");
  int n = -1;
  ck_assert_int_eq(fscanf(f, "%d", &n), 1);
  pclose(f);
  return n;
}

/* kv_ingest: ingested rows overwrite older memtable rows and are
 * overwritten by newer writes, whichever the path; keys out of order are
 * refused, naming both, and leave no file. */
START_TEST(test_ingest) {
  char *dir = tmpdir_make("kv");
  char path[256], err[512];
  snprintf(path, sizeof path, "%s/db", dir);
  uint32_t ids[2] = {1, 2};
  kv_db *db;
  ck_assert_int_eq(kv_open(path, 2, ids, NULL, &db, err, sizeof err), 0);
  kv_writes *w = kv_writes_create();
  for (uint64_t k = 0; k < 100; k++) {
    float v[2] = {(float)k, 1};
    kv_writes_put(w, db, 0, k, v, sizeof v);
  }
  ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
  kv_ingest *g = kv_ingest_create();
  ck_assert_ptr_nonnull(g);
  ingest_rows(g, db, 0, 50, 150, 2); /* over the memtable's rows 50..99 */
  ck_assert(ingest_tag(db, 0, 49) == 1);
  ck_assert(ingest_tag(db, 0, 50) == 2);
  ck_assert(ingest_tag(db, 0, 149) == 2);
  ck_assert(ingest_tag(db, 0, 150) == -1);
  ck_assert(ingest_tag(db, 1, 60) == -1); /* the other family */
  kv_writes_delete(w, db, 0, 60);
  ck_assert_int_eq(kv_writes_commit(w, db, err, sizeof err), 0);
  ck_assert(ingest_tag(db, 0, 60) == -1);
  ingest_rows(g, db, 0, 60, 61, 3);
  ck_assert(ingest_tag(db, 0, 60) == 3);
  /* out of order: refused, named, no file left */
  float v[2] = {7, 4};
  ck_assert_int_eq(kv_ingest_begin(g, db, 1, err, sizeof err), 0);
  ck_assert_int_eq(kv_ingest_put(g, 7, v, sizeof v, err, sizeof err), 0);
  ck_assert_int_eq(kv_ingest_put(g, 7, v, sizeof v, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "row id 7 after 7") && strstr(err, "ascend"), "%s", err);
  ck_assert_int_eq(ingest_files(path), 0);
  ck_assert(ingest_tag(db, 1, 7) == -1);
  /* nothing put: nothing ingested */
  ck_assert_int_eq(kv_ingest_begin(g, db, 1, err, sizeof err), 0);
  ck_assert_int_eq(kv_ingest_commit(g, err, sizeof err), 0);
  ck_assert_int_eq(ingest_files(path), 0);
  kv_writes_destroy(w);
  kv_ingest_destroy(g);
  kv_close(db);
  ck_assert_int_eq(sr_rmtree(dir), 0);
  free(dir);
}
END_TEST

/* Ingested rows are durable without a flush or a close: a child ingests
 * and _exits (forked before this process touches RocksDB: a child forked
 * after would inherit RocksDB's thread pool without its threads); a file a
 * crash left mid-write is removed at the next open. */
START_TEST(test_ingest_durable) {
  char *dir = tmpdir_make("kv");
  char path[256], err[512];
  snprintf(path, sizeof path, "%s/db", dir);
  uint32_t ids[2] = {1, 2};
  pid_t pid = fork();
  if (pid == 0) {
    kv_db *c;
    if (kv_open(path, 2, ids, NULL, &c, err, sizeof err)) _exit(2);
    kv_ingest *cg = kv_ingest_create();
    if (kv_ingest_begin(cg, c, 1, err, sizeof err)) _exit(3);
    for (uint64_t k = 1000; k < 1100; k++) {
      float cv[2] = {(float)k, 5};
      if (kv_ingest_put(cg, k, cv, sizeof cv, err, sizeof err)) _exit(4);
    }
    if (kv_ingest_commit(cg, err, sizeof err)) _exit(5);
    _exit(0);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: %d", st);
  char left[300];
  snprintf(left, sizeof left, "%s/ingest-99.sst", path);
  FILE *f = fopen(left, "w");
  ck_assert_ptr_nonnull(f);
  fputs("torn", f);
  fclose(f);
  ck_assert_int_eq(ingest_files(path), 1);
  kv_db *db;
  ck_assert_int_eq(kv_open(path, 2, ids, NULL, &db, err, sizeof err), 0);
  ck_assert_int_eq(ingest_files(path), 0);
  ck_assert(ingest_tag(db, 1, 999) == -1);
  ck_assert(ingest_tag(db, 1, 1000) == 5);
  ck_assert(ingest_tag(db, 1, 1099) == 5);
  /* a put or commit with no file begun */
  kv_ingest *g = kv_ingest_create();
  float v[2] = {1, 1};
  ck_assert_int_eq(kv_ingest_put(g, 1, v, sizeof v, err, sizeof err), SR_ESTATE);
  ck_assert_int_eq(kv_ingest_commit(g, err, sizeof err), SR_ESTATE);
  kv_ingest_destroy(g);
  kv_close(db);
  ck_assert_int_eq(sr_rmtree(dir), 0);
  free(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("storage");
  TCase *tc = tcase_create("kv");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_row_roundtrip);
  tcase_add_test(tc, test_row_refusals);
  tcase_add_test(tc, test_row_16bit);
  tcase_add_test(tc, test_db_roundtrip);
  tcase_add_test(tc, test_db_figures);
  tcase_add_test(tc, test_sorted_multiget);
  tcase_add_test(tc, test_ingest);
  tcase_add_test(tc, test_ingest_durable);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
