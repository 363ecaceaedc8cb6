/* Tests for embedding/table_file.h, the SREMBTAB table file: the bytes
 * written, parsed here on their own (header fields, records, SHA-256
 * trailer); a count given late writes the same bytes; the writer's and the
 * reader's refusals, each naming the file; a damaged file reads as damaged
 * before it reads as misordered. */
#include <check.h>

#include "tests/check_main.h"
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/half.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/table_file.h"
#include "storage/kv.h"
#include "tests/support/files.h"

static char *dir, path[128];
static emb_plan *plan;
static char fp[EMB_FP_HEX];

/* One table: table_id 7, 100 rows, dim 3, adagrad (3 state floats). */
static void setup(void) {
  dir = tmpdir_make("tabfile");
  snprintf(path, sizeof path, "%s/table-7.bin", dir);
  static const uint64_t rows[] = {100};
  emb_plan_params pp;
  memset(&pp, 0, sizeof pp);
  pp.n_tables = 1;
  pp.rows = rows;
  pp.dim = 3;
  pp.optim.kind = EMB_OPT_ADAGRAD;
  pp.optim.eps = -1;
  pp.optim.init_acc = 0.1;
  pp.seed = 5;
  pp.n_shards = 1;
  char err[256];
  ck_assert_int_eq(emb_plan_create(&pp, &plan, err, sizeof err), 0);
  plan->tables[0].table_id = 7;
  ck_assert_int_eq(emb_plan_model_fingerprint(plan, fp), 0);
}

static void teardown(void) {
  emb_plan_free(plan);
  sr_rmtree(dir);
  free(dir);
}

static const uint64_t IDS[3] = {2, 40, 99};

static void vals_of(int r, float v[6]) {
  for (int i = 0; i < 6; i++) v[i] = (float)(r * 10 + i) + 0.25f;
}

/* IDS' records into p; n_rows given up front or late. */
static void write_file(const char *p, uint64_t n_rows) {
  char err[1024];
  emb_tabfile_writer *w;
  ck_assert_msg(emb_tabfile_create(p, &plan->tables[0], fp, n_rows, &w, err, sizeof err) == 0, "%s", err);
  for (int r = 0; r < 3; r++) {
    float v[6];
    vals_of(r, v);
    ck_assert_msg(emb_tabfile_put(w, IDS[r], v, err, sizeof err) == 0, "%s", err);
  }
  ck_assert_uint_eq(emb_tabfile_written(w), 3);
  ck_assert_msg(emb_tabfile_commit(w, err, sizeof err) == 0, "%s", err);
}

static void spill(const char *p, const unsigned char *b, size_t n) {
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(b, 1, n, f), n);
  fclose(f);
}

static uint32_t u32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* The trailer rewritten to match the bytes before it. */
static void reseal(unsigned char *b, size_t n) {
  unsigned int dl = 0;
  EVP_Digest(b, n - 32, b + n - 32, &dl, EVP_sha256(), NULL);
}

START_TEST(test_bytes) {
  write_file(path, 3);
  size_t n;
  unsigned char *b = (unsigned char *)slurp_file(path, &n, 1);
  const size_t rec = 8 + 4 * 6;
  ck_assert_uint_eq(n, 256 + 3 * rec + 32);
  ck_assert(memcmp(b, "SREMBTAB", 8) == 0);
  ck_assert_uint_eq(u32(b + 8), 1);   /* version */
  ck_assert_uint_eq(u32(b + 12), 256); /* header bytes */
  ck_assert_uint_eq(u32(b + 16), 7);  /* table_id */
  ck_assert_uint_eq(u32(b + 20), 3);  /* dim */
  ck_assert_uint_eq(u32(b + 24), 3);  /* state floats */
  ck_assert_uint_eq(u32(b + 28), EMB_OPT_ADAGRAD);
  ck_assert_uint_eq(u64(b + 32), 3);  /* rows */
  ck_assert_uint_eq(u64(b + 40), rec);
  ck_assert(memcmp(b + 48, fp, 64) == 0);
  for (size_t i = 112; i < 256; i++) ck_assert_uint_eq(b[i], 0);
  for (int r = 0; r < 3; r++) {
    const unsigned char *p = b + 256 + (size_t)r * rec;
    float v[6];
    vals_of(r, v);
    ck_assert_uint_eq(u64(p), IDS[r]);
    ck_assert(memcmp(p + 8, v, sizeof v) == 0);
  }
  unsigned char dig[32];
  unsigned int dl = 0;
  EVP_Digest(b, n - 32, dig, &dl, EVP_sha256(), NULL);
  ck_assert(memcmp(dig, b + n - 32, 32) == 0);
  /* The count given late: the same bytes. */
  char late[160];
  snprintf(late, sizeof late, "%s/late.bin", dir);
  write_file(late, EMB_TABFILE_COUNT_LATER);
  size_t n2;
  unsigned char *b2 = (unsigned char *)slurp_file(late, &n2, 1);
  ck_assert_uint_eq(n2, n);
  ck_assert(memcmp(b, b2, n) == 0);
  /* Nothing but the files is left behind (no temporary name). */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 2", dir);
  ck_assert_int_eq(system(cmd), 0);
  /* Read back: every record, then 0 once the trailer is checked. */
  char err[1024];
  emb_tabfile_reader *r;
  ck_assert_msg(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(emb_tabfile_rows(r), 3);
  uint64_t id;
  const float *v;
  for (int i = 0; i < 3; i++) {
    float want[6];
    vals_of(i, want);
    ck_assert_int_eq(emb_tabfile_next(r, &id, &v, err, sizeof err), 1);
    ck_assert_uint_eq(id, IDS[i]);
    ck_assert(memcmp(v, want, sizeof want) == 0);
  }
  ck_assert_int_eq(emb_tabfile_next(r, &id, &v, err, sizeof err), 0);
  emb_tabfile_close(r);
  free(b);
  free(b2);
}
END_TEST

static int collect(void *ctx, uint64_t id, const float *v) {
  float *out = ctx;
  int r = id == IDS[0] ? 0 : id == IDS[1] ? 1 : 2;
  memcpy(out + 6 * r, v, 6 * sizeof *v);
  return 0;
}

/* Version 2: an fp16 or bf16 table's file, 2 bytes a weight, the state
 * floats; read back to the same floats, and refused for a table of
 * another precision, naming both. */
START_TEST(test_bytes_16bit) {
  for (int prec = EMB_PREC_FP16; prec <= EMB_PREC_BF16; prec++) {
    plan->tables[0].precision = (emb_precision)prec;
    ck_assert_int_eq(emb_plan_model_fingerprint(plan, fp), 0);
    write_file(path, 3);
    size_t n;
    unsigned char *b = (unsigned char *)slurp_file(path, &n, 1);
    const size_t rec = 8 + 2 * 3 + 4 * 3;
    ck_assert_uint_eq(n, 256 + 3 * rec + 32);
    ck_assert_uint_eq(u32(b + 8), 2);
    ck_assert_uint_eq(u32(b + 112), (uint32_t)prec);
    ck_assert_uint_eq(u64(b + 40), rec);
    for (int r = 0; r < 3; r++) {
      const unsigned char *p = b + 256 + r * rec;
      float v[6];
      vals_of(r, v);
      ck_assert_uint_eq(u64(p), IDS[r]);
      for (int j = 0; j < 3; j++) {
        uint16_t h;
        memcpy(&h, p + 8 + 2 * j, 2);
        ck_assert_uint_eq(h, prec == EMB_PREC_FP16 ? sr_f32_to_f16(v[j]) : sr_f32_to_bf16(v[j]));
      }
      ck_assert_mem_eq(p + 14, v + 3, 12);
    }
    free(b);
    float got[18], want[18];
    char err[1024];
    for (int r = 0; r < 3; r++) vals_of(r, want + 6 * r);
    ck_assert_msg(emb_tabfile_read(path, &plan->tables[0], fp, collect, got, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_mem_eq(got, want, sizeof got);
    plan->tables[0].precision = EMB_PREC_FP32;
    emb_tabfile_reader *rd;
    ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &rd, err, sizeof err), SR_EMISMATCH);
    ck_assert_msg(strstr(err, path) && strstr(err, prec == EMB_PREC_FP16 ? "fp16" : "bf16") &&
                  strstr(err, "fp32"), "%s", err);
  }
}
END_TEST

START_TEST(test_writer_refusals) {
  char err[1024];
  float v[6] = {0};
  emb_tabfile_writer *w;
  /* Row ids must ascend. */
  ck_assert_int_eq(emb_tabfile_create(path, &plan->tables[0], fp, EMB_TABFILE_COUNT_LATER, &w,
                                      err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_put(w, 5, v, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_put(w, 5, v, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "table-7.bin: row id 5 after 5"), "%s", err);
  emb_tabfile_abort(w);
  /* More than declared; fewer than declared. */
  ck_assert_int_eq(emb_tabfile_create(path, &plan->tables[0], fp, 1, &w, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_put(w, 1, v, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_put(w, 2, v, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "more than the 1 records declared"), "%s", err);
  emb_tabfile_abort(w);
  ck_assert_int_eq(emb_tabfile_create(path, &plan->tables[0], fp, 2, &w, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_put(w, 1, v, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_commit(w, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "1 records put, 2 declared"), "%s", err);
  /* Nothing at the path nor beside it. */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir);
  ck_assert_int_eq(system(cmd), 0);
  /* A folder that is not there. */
  char p[200];
  snprintf(p, sizeof p, "%s/none/table-7.bin", dir);
  ck_assert_int_eq(emb_tabfile_create(p, &plan->tables[0], fp, 0, &w, err, sizeof err), SR_EIO);
  ck_assert_msg(strstr(err, "none/table-7.bin.tmp.") && strstr(err, "cannot write"), "%s", err);
}
END_TEST

static int count_rec(void *ctx, uint64_t id, const float *v) {
  (void)id, (void)v;
  ++*(int *)ctx;
  return 0;
}

START_TEST(test_reader_refusals) {
  write_file(path, 3);
  size_t n;
  unsigned char *good = (unsigned char *)slurp_file(path, &n, 1), *b = malloc(n);
  char err[1024];
  emb_tabfile_reader *r;
  int seen = 0;
  /* Another table shape (dim) and another model. */
  emb_table other = plan->tables[0];
  other.dim = 4;
  ck_assert_int_eq(emb_tabfile_open(path, &other, fp, &r, err, sizeof err), SR_EMISMATCH);
  ck_assert_msg(strstr(err, "table-7.bin: holds table_id 7 dim 3 state 3, the plan wants table_id 7 dim 4"), "%s", err);
  char fp2[EMB_FP_HEX];
  memcpy(fp2, fp, sizeof fp2);
  fp2[0] = fp2[0] == 'a' ? 'b' : 'a';
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp2, &r, err, sizeof err), SR_EMISMATCH);
  ck_assert_msg(strstr(err, "written under model fingerprint"), "%s", err);
  /* Truncated; too short; another version; not a table file. */
  spill(path, good, n - 1);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "torn or truncated"), "%s", err);
  spill(path, good, 200);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "too short"), "%s", err);
  memcpy(b, good, n);
  b[8] = 2;
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), SR_EVERSION);
  memcpy(b, good, n);
  b[0] = 'X';
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "not a shardrec embedding table file"), "%s", err);
  ck_assert_int_eq(emb_tabfile_open(dir, &plan->tables[0], fp, &r, err, sizeof err) < 0, 1);
  /* A flipped value byte: the last next() says so. */
  memcpy(b, good, n);
  b[256 + 8 + 4 + 1] ^= 0x40;
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), 0);
  uint64_t id;
  const float *v;
  int rc;
  while ((rc = emb_tabfile_next(r, &id, &v, err, sizeof err)) == 1) continue;
  ck_assert_int_eq(rc, SR_ECHECKSUM);
  ck_assert_msg(strstr(err, "table-7.bin: checksum mismatch (file damaged)"), "%s", err);
  emb_tabfile_close(r);
  /* Records 0 and 1 swapped, the trailer resealed: misordered at record 1. */
  const size_t rec = 8 + 4 * 6;
  memcpy(b, good, n);
  memcpy(b + 256, good + 256 + rec, rec);
  memcpy(b + 256 + rec, good + 256, rec);
  reseal(b, n);
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_open(path, &plan->tables[0], fp, &r, err, sizeof err), 0);
  ck_assert_int_eq(emb_tabfile_next(r, &id, &v, err, sizeof err), 1);
  ck_assert_int_eq(emb_tabfile_next(r, &id, &v, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "record 1: row id 2 out of order or range"), "%s", err);
  emb_tabfile_close(r);
  ck_assert_int_eq(emb_tabfile_read(path, &plan->tables[0], fp, count_rec, &seen, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "record 1: row id 2 out of order"), "%s", err);
  ck_assert_int_eq(seen, 3); /* read to the end first */
  /* ... and damaged too: read_all reports the damage. */
  b[n - 1] ^= 1;
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_read(path, &plan->tables[0], fp, count_rec, &seen, err, sizeof err), SR_ECHECKSUM);
  /* A row id past the table's 100 rows. */
  memcpy(b, good, n);
  uint64_t big = 100;
  memcpy(b + 256 + 2 * rec, &big, 8);
  reseal(b, n);
  spill(path, b, n);
  ck_assert_int_eq(emb_tabfile_read(path, &plan->tables[0], fp, count_rec, &seen, err, sizeof err), SR_EFORMAT);
  ck_assert_msg(strstr(err, "record 2: row id 100 out of order or range"), "%s", err);
  /* The good file reads. */
  spill(path, good, n);
  seen = 0;
  ck_assert_int_eq(emb_tabfile_read(path, &plan->tables[0], fp, count_rec, &seen, err, sizeof err), 0);
  ck_assert_int_eq(seen, 3);
  free(good);
  free(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("table_file");
  TCase *tc = tcase_create("table_file");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_bytes);
  tcase_add_test(tc, test_bytes_16bit);
  tcase_add_test(tc, test_writer_refusals);
  tcase_add_test(tc, test_reader_refusals);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
