/* Unit tests of embedding/reshard_ckpt.h (reshard_checkpoint) on real
 * checkpoints written by the library in a temporary folder: a 2-shard
 * table-wise plan's rows (RocksDB shard databases, or the in-memory store's
 * table files) resharded to 3 shards row-wise read back equal row for row;
 * a row changed or dropped on its way (the row hook) fails verification
 * with SR_ECHECKSUM naming the table, and leaves nothing at OUT or beside
 * it; refusals name the input at fault. */
#include <check.h>

#include "tests/check_main.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/ckpt_plan.h"
#include "embedding/ckpt_store.h"
#include "embedding/plan.h"
#include "embedding/reshard_ckpt.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"
#include "tests/embedding/shard_fixture.h"
#include "tests/support/files.h"

#define T 3
static const uint64_t ROWS[T] = {200, 50, 300};
static const size_t TOUCHED[T] = {60, 25, 90}; /* rows 0, 2, 4, ... pushed */
#define DIM 4

static char *dir;

_Static_assert(T == FX_NT, "fx_plan makes FX_NT tables");

/* Every table at DIM (fx_plan's table 1 is at 4, DIM too). */
static emb_plan *make_plan(int n_shards, int row_wise) {
  return fx_plan(ROWS, DIM, 11, EMB_OPT_ADAGRAD, n_shards, row_wise);
}

/* Ids 0, 2, 4, ... of each table and a buffer for their rows. */
typedef struct {
  uint64_t ids[T][128];
  const uint64_t *idp[T];
  size_t counts[T];
  float rows[T][128 * DIM];
  float *rp[T];
  const float *cp[T];
  emb_idset set;
} batch;

static void make_batch(batch *b) {
  for (int t = 0; t < T; t++) {
    b->counts[t] = TOUCHED[t];
    for (size_t i = 0; i < TOUCHED[t]; i++) b->ids[t][i] = 2 * i;
    for (size_t i = 0; i < TOUCHED[t] * DIM; i++) b->rows[t][i] = (float)(i % 7) - 3.0f + 0.25f * (float)t;
    b->idp[t] = b->ids[t];
    b->rp[t] = b->rows[t];
    b->cp[t] = b->rows[t];
  }
  b->set.n_tables = T;
  b->set.ids = b->idp;
  b->set.counts = b->counts;
}

/* DIR/NAME/step-7 of plan p2 (2 shards, table-wise): three pushes into the
 * shard store (rocks) or the in-memory one, a dense.bin of known bytes. */
static void make_ckpt(const char *name, int rocks, const emb_plan *p2) {
  char root[512], data[512], path[4400], err[1024];
  snprintf(root, sizeof root, "%s/%s", dir, name);
  snprintf(data, sizeof data, "%s/%s.data", dir, name);
  emb_store *s;
  if (rocks) {
    emb_shard_config c = {.cache_rows = 1024};
    s = emb_store_create_shard(p2, data, &c, err, sizeof err);
  } else {
    s = emb_store_create_local(p2, err, sizeof err);
  }
  ck_assert_msg(s != NULL, "%s", err);
  batch b;
  make_batch(&b);
  for (int step = 0; step < 3; step++)
    ck_assert_msg(emb_store_push(s, step, 0.1f, &b.set, b.cp) == 0, "%s", emb_store_errmsg(s));
  ckpt_dir_txn t;
  int exists;
  ck_assert_msg(ckpt_dir_begin(root, 7, &t, &exists, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(exists, 0);
  snprintf(path, sizeof path, "%s/dense.bin", t.tmp);
  file_put(path, "dense bytes\n");
  snprintf(path, sizeof path, "%s/shards", t.tmp);
  ck_assert_msg(emb_store_checkpoint(s, path) == 0, "%s", emb_store_errmsg(s));
  emb_store_destroy(s);
  cJSON *man = ckpt_dir_manifest_new();
  cJSON_AddNumberToObject(man, "step", 7);
  cJSON_AddStringToObject(man, "kept", "as is");
  ck_assert_msg(emb_ckpt_set_plan(man, p2, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(ckpt_dir_commit(&t, man, err, sizeof err) == 0, "%s", err);
  cJSON_Delete(man);
}

static void setup(void) {
  dir = tmpdir_make("reshard-ckpt");
  emb_plan *p2 = make_plan(2, 0), *p3 = make_plan(3, 1);
  char path[512];
  char *canon = emb_plan_canonical(p3, 1);
  snprintf(path, sizeof path, "%s/p3.json", dir);
  file_put(path, canon);
  free(canon);
  /* Another model: another seed. */
  emb_plan *other = make_plan(3, 1);
  other->seed = 12;
  canon = emb_plan_canonical(other, 1);
  snprintf(path, sizeof path, "%s/other.json", dir);
  file_put(path, canon);
  free(canon);
  make_ckpt("rocks", 1, p2);
  make_ckpt("mem", 0, p2);
  emb_plan_free(p2);
  emb_plan_free(p3);
  emb_plan_free(other);
}

static void teardown(void) {
  sr_rmtree(dir);
  free(dir);
}

static int path_exists(const char *rel) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  struct stat st;
  return lstat(p, &st) == 0;
}

/* Entries of DIR whose name holds ".tmp-" or ".old-". */
static int leftovers(void) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d))) n += strstr(de->d_name, ".tmp-") || strstr(de->d_name, ".old-");
  closedir(d);
  return n;
}

/* The rows of ids 0..2*TOUCHED+10 of every table as the checkpoint at rel
 * holds them, into out[T][...]. */
static void read_rows(const char *rel, float out[T][200 * DIM]) {
  char path[600], err[1024];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  emb_ckpt ck;
  ck_assert_msg(emb_ckpt_open(path, &ck, err, sizeof err) == 0, "%s", err);
  emb_ckpt_store_opts o = {0};
  emb_ckpt_store cs;
  ck_assert_msg(emb_ckpt_store_open(ck.dir, ck.plan, &o, &cs, err, sizeof err) == 0, "%s", err);
  uint64_t ids[T][200];
  const uint64_t *idp[T];
  size_t counts[T];
  float *op[T];
  for (int t = 0; t < T; t++) {
    counts[t] = 0;
    for (uint64_t id = 0; id < 2 * TOUCHED[t] + 10 && id < ROWS[t]; id++) ids[t][counts[t]++] = id;
    idp[t] = ids[t];
    op[t] = out[t];
  }
  emb_idset set = {.n_tables = T, .ids = idp, .counts = counts};
  ck_assert_msg(emb_store_lookup_begin(cs.store, 8, &set, op) == 0, "%s", emb_store_errmsg(cs.store));
  ck_assert_msg(emb_store_lookup_wait(cs.store) == 0, "%s", emb_store_errmsg(cs.store));
  emb_ckpt_store_close(&cs);
  emb_ckpt_close(&ck);
}

static reshard_ckpt_stats run(const char *from, const char *to, const char *plan, int force,
                              reshard_row_hook hook, void *ctx, int want_rc, char *err,
                              size_t errlen) {
  char f[600], o[600], p[600];
  snprintf(f, sizeof f, "%s/%s", dir, from);
  snprintf(o, sizeof o, "%s/%s", dir, to);
  snprintf(p, sizeof p, "%s/%s", dir, plan);
  reshard_ckpt_opts ro = {.from = f, .to = o, .plan_path = p, .force = force, .threads = 2,
                          .row_hook = hook, .row_hook_ctx = ctx};
  reshard_ckpt_stats st;
  err[0] = 0;
  int rc = reshard_checkpoint(&ro, &st, err, errlen);
  ck_assert_msg(rc == want_rc, "%s -> %s: rc %d (%s), wanted %d: %s", from, to, rc, sr_errname(rc),
                want_rc, err);
  return st;
}

static void roundtrip(const char *src, const char *out, const char *shard2) {
  char err[2048];
  reshard_ckpt_stats st = run(src, out, "p3.json", 0, NULL, NULL, 0, err, sizeof err);
  ck_assert_int_eq(st.step, 7);
  ck_assert_int_eq(st.src_shards, 2);
  ck_assert_int_eq(st.dst_shards, 3);
  ck_assert_int_eq(st.run.n_tables, T);
  for (int t = 0; t < T; t++) {
    ck_assert_int_eq(st.run.tables[t].ok, 1);
    ck_assert_uint_eq(st.run.tables[t].rows_in, TOUCHED[t]);
    ck_assert_uint_eq(st.run.tables[t].rows_out, TOUCHED[t]);
  }
  ck_assert_uint_eq(st.run.rows, TOUCHED[0] + TOUCHED[1] + TOUCHED[2]);
  reshard_stats_free(&st.run);
  char rel[256];
  snprintf(rel, sizeof rel, "%s/step-7/DONE", out);
  ck_assert(path_exists(rel));
  snprintf(rel, sizeof rel, "%s/step-7/%s", out, shard2);
  ck_assert_msg(path_exists(rel), "no %s", rel);
  ck_assert_int_eq(leftovers(), 0);
  /* Every row reads back the same, touched or not (3 shards vs 2). */
  static float a[T][200 * DIM], b[T][200 * DIM];
  snprintf(rel, sizeof rel, "%s/step-7", src);
  read_rows(rel, a);
  snprintf(rel, sizeof rel, "%s/step-7", out);
  read_rows(rel, b);
  ck_assert(!memcmp(a, b, sizeof a));
  /* The pushes changed the touched rows: row 0 is not its initial value
   * (which the untouched row 1 keeps in both). */
  float init0[DIM];
  emb_plan *p2 = make_plan(2, 0);
  emb_row_init(p2, 0, 0, init0);
  ck_assert(memcmp(a[0], init0, sizeof init0) != 0);
  emb_plan_free(p2);
  /* dense.bin and the source's own manifest fields carried over. */
  char path[600];
  snprintf(path, sizeof path, "%s/%s/step-7/dense.bin", dir, out);
  FILE *f = fopen(path, "r");
  char line[64] = "";
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  fclose(f);
  ck_assert_str_eq(line, "dense bytes\n");
  snprintf(path, sizeof path, "%s/%s", dir, out);
  emb_ckpt ck;
  ck_assert_msg(emb_ckpt_open(path, &ck, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(ck.plan->n_shards, 3);
  const cJSON *kept = cJSON_GetObjectItemCaseSensitive(ck.manifest, "kept");
  ck_assert(cJSON_IsString(kept) && !strcmp(kept->valuestring, "as is"));
  emb_ckpt_close(&ck);
}

START_TEST(test_roundtrip_rocks) { roundtrip("rocks", "o3", "shards/shard-2/CURRENT"); }
END_TEST

START_TEST(test_roundtrip_table_files) { roundtrip("mem", "m3", "shards/table-2.bin"); }
END_TEST

/* The hook: on the first row of table_id 0, flip its last byte (mode 1) or
 * drop it (mode 2). */
typedef struct {
  int mode, fired;
} spoil;

static int spoil_row(void *ctx, uint32_t table_id, uint64_t row_id, unsigned char *val, size_t len) {
  (void)row_id;
  spoil *s = ctx;
  if (table_id != 0 || s->fired) return 0;
  s->fired = 1;
  if (s->mode == 2) return 1;
  val[len - 1] ^= 0x01;
  return 0;
}

static void verification_fails(const char *src) {
  for (int mode = 1; mode <= 2; mode++) {
    spoil sp = {.mode = mode};
    char err[2048];
    reshard_ckpt_stats st = run(src, "bad", "p3.json", 0, spoil_row, &sp, SR_ECHECKSUM, err, sizeof err);
    ck_assert_int_eq(sp.fired, 1);
    ck_assert_msg(strstr(err, "verification failed: table_id 0 (t0)") &&
                      strstr(err, mode == 1 ? "checksum" : "rows read from the sources") &&
                      strstr(err, "nothing written at "),
                  "%s mode %d: %s", src, mode, err);
    ck_assert_int_eq(st.failed, RESHARD_IN_NONE);
    /* Only table 0 differs, by the one row. */
    ck_assert_int_eq(st.run.n_tables, T);
    ck_assert_int_eq(st.run.tables[0].ok, 0);
    ck_assert_uint_eq(st.run.tables[0].rows_out, TOUCHED[0] - (mode == 2));
    ck_assert_int_eq(st.run.tables[1].ok, 1);
    ck_assert_int_eq(st.run.tables[2].ok, 1);
    reshard_stats_free(&st.run);
    ck_assert(!path_exists("bad"));
    ck_assert_int_eq(leftovers(), 0);
  }
}

START_TEST(test_verification_rocks) { verification_fails("rocks"); }
END_TEST

START_TEST(test_verification_table_files) { verification_fails("mem"); }
END_TEST

START_TEST(test_refusals) {
  char err[2048];
  /* Another model: the plan at fault, the difference named. */
  reshard_ckpt_stats st = run("rocks", "o", "other.json", 0, NULL, NULL, SR_EMISMATCH, err, sizeof err);
  ck_assert_int_eq(st.failed, RESHARD_IN_PLAN);
  ck_assert_msg(strstr(err, "other.json describes another model") && strstr(err, "seed 11 vs 12"), "%s", err);
  /* A torn source: no DONE. */
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cp -r %s/rocks %s/torn && rm %s/torn/step-7/DONE", dir, dir, dir);
  ck_assert_int_eq(system(cmd), 0);
  st = run("torn/step-7", "o", "p3.json", 0, NULL, NULL, SR_EFORMAT, err, sizeof err);
  ck_assert_int_eq(st.failed, RESHARD_IN_FROM);
  ck_assert_msg(strstr(err, "torn/step-7/DONE: missing") != NULL, "%s", err);
  /* ... and as a folder of checkpoints: none complete. */
  st = run("torn", "o", "p3.json", 0, NULL, NULL, SR_ENOTFOUND, err, sizeof err);
  ck_assert_msg(strstr(err, "no complete checkpoint") != NULL, "%s", err);
  /* OUT holds a file no checkpoint holds: refused, force or not, naming
   * it; the file stays. */
  snprintf(cmd, sizeof cmd, "mkdir -p %s/o && touch %s/o/marker", dir, dir);
  ck_assert_int_eq(system(cmd), 0);
  for (int force = 0; force < 2; force++) {
    st = run("rocks", "o", "p3.json", force, NULL, NULL, SR_EINVAL, err, sizeof err);
    ck_assert_int_eq(st.failed, RESHARD_IN_TO);
    ck_assert_msg(strstr(err, "/o: holds marker, which is not part of a checkpoint folder"), "%s",
                  err);
    ck_assert(path_exists("o/marker") && !path_exists("o/step-7"));
  }
  /* OUT a folder of checkpoints (a plan.json): refused without force; with
   * force replaced. */
  snprintf(cmd, sizeof cmd, "mv %s/o/marker %s/o/plan.json", dir, dir);
  ck_assert_int_eq(system(cmd), 0);
  st = run("rocks", "o", "p3.json", 0, NULL, NULL, SR_EEXISTS, err, sizeof err);
  ck_assert_int_eq(st.failed, RESHARD_IN_TO);
  ck_assert(path_exists("o/plan.json"));
  st = run("rocks", "o", "p3.json", 1, NULL, NULL, 0, err, sizeof err);
  reshard_stats_free(&st.run);
  ck_assert(!path_exists("o/plan.json") && path_exists("o/step-7/DONE"));
  /* force, but OUT holds the source. */
  st = run("o/step-7", "o", "p3.json", 1, NULL, NULL, SR_EINVAL, err, sizeof err);
  ck_assert_int_eq(st.failed, RESHARD_IN_TO);
  ck_assert_msg(strstr(err, "holds the source checkpoint") != NULL, "%s", err);
  ck_assert(path_exists("o/step-7/DONE"));
  ck_assert_int_eq(leftovers(), 0);
}
END_TEST

/* dir/ then folders of 200 'd's, made, until the path is at least len
 * characters; into out (SR_PATH_MAX). */
static void deep_folder(char *out, size_t len) {
  char seg[202];
  memset(seg, 'd', 200);
  seg[200] = 0;
  ck_assert_int_eq(sr_path(out, SR_PATH_MAX, "%s", dir), 0);
  while (strlen(out) < len) {
    size_t n = strlen(out);
    ck_assert_int_eq(sr_path(out + n, SR_PATH_MAX - n, "/%.*s",
                             (int)(len - n < 201 ? len - n - 1 : 200), seg), 0);
    ck_assert_int_eq(mkdir(out, 0777), 0);
  }
}

/* Entries of the folder path. */
static int entries(const char *path) {
  char **names;
  int n;
  ck_assert_int_eq(sr_list_dir(path, &names, &n), 0);
  sr_paths_free(names, n);
  return n;
}

/* OUT too long for the paths under it (OUT.tmp-PID/.step-7.tmp-PID/...):
 * SR_ERANGE naming OUT's start before anything is read or written; a
 * folder named as OUT's truncated name survives and nothing lands beside
 * it. A --from too long: SR_ERANGE too. A long OUT that leaves room is
 * written as any other. */
START_TEST(test_path_too_long) {
  char parent[SR_PATH_MAX], out[SR_PATH_MAX], err[8192];
  deep_folder(parent, 4000);
  /* OUT: parent/ooo...o (4080 characters), a valid path itself. */
  size_t pl = strlen(parent);
  memset(out, 0, sizeof out);
  memcpy(out, parent, pl);
  out[pl] = '/';
  memset(out + pl + 1, 'o', 4080 - pl - 1);
  ck_assert_uint_eq(strlen(out), 4080);
  /* The sentinel: OUT's name cut short, holding a file. */
  char sentinel[SR_PATH_MAX], keep[SR_PATH_MAX];
  ck_assert_int_eq(sr_path(sentinel, sizeof sentinel, "%.*s", 4070, out), 0);
  ck_assert_int_eq(mkdir(sentinel, 0777), 0);
  ck_assert_int_eq(sr_path(keep, sizeof keep, "%s/keep", sentinel), 0);
  file_put(keep, "kept\n");
  char from[600], plan[600];
  snprintf(from, sizeof from, "%s/rocks", dir);
  snprintf(plan, sizeof plan, "%s/p3.json", dir);
  reshard_ckpt_opts ro = {.from = from, .to = out, .plan_path = plan, .threads = 2};
  reshard_ckpt_stats st;
  int rc = reshard_checkpoint(&ro, &st, err, sizeof err);
  ck_assert_msg(rc == SR_ERANGE, "rc %d (%s): %s", rc, sr_errname(rc), err);
  ck_assert_int_eq(st.failed, RESHARD_IN_TO);
  char want[128];
  snprintf(want, sizeof want, "%.64s...: path too long", out);
  ck_assert_msg(strstr(err, want) == err, "%s", err);
  ck_assert_int_eq(entries(parent), 1); /* the sentinel only */
  ck_assert(sr_is_file(keep));
  /* The source named by a path too long. */
  char from_long[SR_PATH_MAX + 100];
  snprintf(from_long, sizeof from_long, "%s/%0*d/../../rocks", parent, 120, 0);
  char never[600];
  snprintf(never, sizeof never, "%s/never", dir);
  ro.from = from_long;
  ro.to = never;
  rc = reshard_checkpoint(&ro, &st, err, sizeof err);
  ck_assert_msg(rc == SR_ERANGE, "rc %d (%s): %s", rc, sr_errname(rc), err);
  ck_assert_int_eq(st.failed, RESHARD_IN_FROM);
  ck_assert_msg(strstr(err, "path too long") != NULL, "%s", err);
  ck_assert(!path_exists("never"));
  /* A long OUT with room enough: resharded (the table files' layout: RocksDB
   * names its info log in the work folder after the database's path, cut
   * to one name of 259 characters, which fails past 251). */
  ck_assert_int_eq(sr_path(out, sizeof out, "%.*s", 3600, parent), 0);
  *strrchr(out, '/') = 0; /* a folder made above, about 3500 characters */
  ck_assert(sr_is_dir(out) && strlen(out) > 3400);
  size_t ol = strlen(out);
  ck_assert_int_eq(sr_path(out + ol, sizeof out - ol, "/o3"), 0);
  snprintf(from, sizeof from, "%s/mem", dir);
  ro.from = from;
  ro.to = out;
  rc = reshard_checkpoint(&ro, &st, err, sizeof err);
  size_t el = strlen(err);
  ck_assert_msg(rc == 0, "rc %d (%s): ...%s", rc, sr_errname(rc), err + (el > 600 ? el - 600 : 0));
  reshard_stats_free(&st.run);
  ck_assert_int_eq(sr_path(keep, sizeof keep, "%s/step-7/DONE", out), 0);
  ck_assert(sr_is_file(keep));
}
END_TEST

int main(void) {
  Suite *s = suite_create("reshard_ckpt");
  TCase *tc = tcase_create("reshard_ckpt");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_roundtrip_rocks);
  tcase_add_test(tc, test_roundtrip_table_files);
  tcase_add_test(tc, test_verification_rocks);
  tcase_add_test(tc, test_verification_table_files);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_path_too_long);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
