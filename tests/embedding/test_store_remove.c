/* The stores' remove op (embedding/store.h) and what scoring reads for rows
 * not held (emb_store_absent_zero).
 *
 * Asserts: on the in-process store and on the shard store (a cache smaller
 * than the rows, so removed rows are in the cache, in RocksDB, or both),
 * after pushes and a removal of every other row, iterate visits exactly
 * the rows kept, each with the values a store that never held the removed
 * rows has; a removed row reads its init value again, and a push to it
 * starts from there (the bits of a fresh store's first push); ids of
 * another table count are refused, nothing removed. The shard store's
 * RocksDB files shrink when the clean stop compacts the removed rows away
 * (under half the bytes they took with every row). A store marked
 * absent_zero reads zeros for a row not held of a bounded table
 * ("keep"), and the init value for one of a table without bounds. The
 * same holds of fp16 and bf16 tables (2-byte weights in the slots). On both
 * stores, a removal between a checkpoint and a checkpoint_delta keeps the
 * change set: the delta lists, per table, exactly the rows removed and not
 * pushed again (removed-<id>.bin), and a fresh store restored from the
 * checkpoint then the delta holds exactly the saving store's rows, value
 * for value (the removed rows gone, those pushed again as pushed). A shard
 * store marked clean, then given a removal, that dies without closing
 * opens unclean. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/shard.h"
#include "embedding/removed_file.h"
#include "embedding/store.h"
#include "storage/ckpt_dir.h"
#include "tests/embedding/shard_fixture.h"

#define NT FX_NT
#define DIM 8
#define N 4000 /* rows pushed per table */
static const uint64_t ROWS[NT] = {50000, 5000, 0};
static const int D[NT] = {DIM, 4, DIM}; /* fx_plan: table 1 at dim 4 */

/* The ids of table t: spread (hashed for the unbounded table). */
static uint64_t id_of(int t, size_t r) {
  return t == 2 ? (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ULL : (uint64_t)r * 7 % ROWS[t];
}

typedef struct {
  uint64_t *ids[NT];
  size_t counts[NT];
  float *buf[NT];
  emb_idset set;
} idbuf;

/* Rows r of every table with r % every == rem (every 1: all N). */
static void ids_make(idbuf *b, int every, int rem) {
  for (int t = 0; t < NT; t++) {
    b->ids[t] = malloc(N * sizeof(uint64_t));
    b->buf[t] = calloc((size_t)N * DIM, sizeof(float));
    b->counts[t] = 0;
    for (size_t r = 0; r < N; r++)
      if ((int)(r % (size_t)every) == rem) b->ids[t][b->counts[t]++] = id_of(t, r);
  }
  b->set = (emb_idset){NT, (const uint64_t *const *)b->ids, b->counts};
}

static void ids_free(idbuf *b) {
  for (int t = 0; t < NT; t++) free(b->ids[t]), free(b->buf[t]);
}

/* Two pushes of gradients that depend on the id, then a third on `half`. */
static void push_rows(emb_store *s, idbuf *all, int64_t step) {
  for (int t = 0; t < NT; t++)
    for (size_t r = 0; r < all->counts[t]; r++)
      for (int j = 0; j < D[t]; j++)
        all->buf[t][r * D[t] + j] = (float)((all->ids[t][r] >> (j * 3)) % 17) * 0.01f - 0.08f;
  ck_assert_msg(emb_store_push(s, step, 0.5f, &all->set, (const float *const *)all->buf) == 0,
                "%s", emb_store_errmsg(s));
}

typedef struct {
  size_t n;
  uint64_t last;
  int ordered;
  emb_store *other; /* lookups compared against */
  int table;
  int same;
} visit;

static int on_row(void *ctx, int table, uint64_t id, const float *v, int dim, const float *st,
                  int sl) {
  (void)st, (void)sl;
  visit *w = ctx;
  if (w->n && id <= w->last) w->ordered = 0;
  w->last = id;
  w->n++;
  float got[DIM];
  const uint64_t ids1[1] = {id};
  const uint64_t *idp[NT] = {NULL, NULL, NULL};
  size_t cnt[NT] = {0, 0, 0};
  float junk[DIM], *out[NT] = {junk, junk, junk};
  idp[table] = ids1;
  cnt[table] = 1;
  out[table] = got;
  emb_idset one = {NT, idp, cnt};
  ck_assert_int_eq(emb_store_lookup_begin(w->other, 0, &one, out), 0);
  ck_assert_int_eq(emb_store_lookup_wait(w->other), 0);
  if (memcmp(got, v, (size_t)dim * sizeof(float))) w->same = 0;
  return 0;
}

/* Every table of s holds exactly `kept`'s rows, each as ref holds it. */
static void assert_rows(emb_store *s, const idbuf *kept, emb_store *ref) {
  for (int t = 0; t < NT; t++) {
    visit w = {.ordered = 1, .other = ref, .table = t, .same = 1};
    ck_assert_int_eq(emb_store_iterate(s, t, on_row, &w), 0);
    ck_assert_msg(w.n == kept->counts[t], "table %d holds %zu rows, not %zu", t, w.n,
                  kept->counts[t]);
    ck_assert_msg(w.ordered && w.same, "table %d: rows out of order or not the kept values", t);
  }
}

/* The removed rows read their init values, each table looked up alone,
 * the last pushed first (in a small cache, its removed rows are still
 * cached, reset there); pushed again, they hold what a fresh store's first
 * push makes. */
static void assert_removed_fresh(emb_store *s, emb_store *fresh, idbuf *gone, const emb_plan *p) {
  for (int t = NT - 1; t >= 0; t--) {
    size_t cnt[NT] = {0, 0, 0};
    cnt[t] = gone->counts[t];
    emb_idset one = {NT, gone->set.ids, cnt};
    ck_assert_int_eq(emb_store_lookup_begin(s, 9, &one, gone->buf), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    for (size_t r = 0; r < gone->counts[t]; r++) {
      float init[DIM];
      emb_row_init(p, t, gone->ids[t][r], init);
      ck_assert_msg(!memcmp(init, gone->buf[t] + r * D[t], (size_t)D[t] * sizeof(float)),
                    "table %d row %llu: not its init value after removal", t,
                    (unsigned long long)gone->ids[t][r]);
    }
  }
  push_rows(s, gone, 10);
  push_rows(fresh, gone, 10);
  idbuf a, b;
  ids_make(&a, 2, 1);
  ids_make(&b, 2, 1);
  ck_assert_int_eq(emb_store_lookup_begin(s, 11, &a.set, a.buf), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  ck_assert_int_eq(emb_store_lookup_begin(fresh, 11, &b.set, b.buf), 0);
  ck_assert_int_eq(emb_store_lookup_wait(fresh), 0);
  for (int t = 0; t < NT; t++)
    ck_assert_msg(!memcmp(a.buf[t], b.buf[t], a.counts[t] * (size_t)p->tables[t].dim * 4),
                  "table %d: a removed row pushed again is not a fresh row's push", t);
  ids_free(&a);
  ids_free(&b);
}

/* Push all, remove the odd rows; against a store that got only the even ones. */
static void check_store(emb_store *s, const emb_plan *p) {
  char err[256];
  idbuf all, even, odd;
  ids_make(&all, 1, 0);
  ids_make(&even, 2, 0);
  ids_make(&odd, 2, 1);
  push_rows(s, &all, 1);
  push_rows(s, &all, 2);
  emb_store *ref = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(ref);
  push_rows(ref, &even, 1);
  push_rows(ref, &even, 2);
  emb_idset bad = odd.set;
  bad.n_tables = NT - 1;
  ck_assert_int_eq(emb_store_remove(s, 3, &bad), SR_EINVAL);
  assert_rows(s, &all, s); /* nothing removed */
  ck_assert_msg(emb_store_remove(s, 3, &odd.set) == 0, "%s", emb_store_errmsg(s));
  ck_assert_int_eq(emb_store_remove(s, 3, &odd.set), 0); /* rows not held: skipped */
  assert_rows(s, &even, ref);
  emb_store *fresh = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(fresh);
  assert_removed_fresh(s, fresh, &odd, p);
  emb_store_destroy(fresh);
  emb_store_destroy(ref);
  ids_free(&all);
  ids_free(&even);
  ids_free(&odd);
}

START_TEST(test_local_remove) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 1, 0);
  char err[256];
  emb_store *s = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(s);
  check_store(s, p);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

/* Tables 0 and 2 in fp16, table 1 in bf16. */
static void make_16bit(emb_plan *p) {
  p->tables[0].precision = p->tables[2].precision = EMB_PREC_FP16;
  p->tables[1].precision = EMB_PREC_BF16;
}

START_TEST(test_local_remove_16bit) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ROWWISE_ADAGRAD, 1, 0);
  make_16bit(p);
  char err[256];
  emb_store *s = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(s);
  check_store(s, p);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_shard_remove_16bit) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ROWWISE_ADAGRAD, 3, 1);
  make_16bit(p);
  char *dir = tmpdir_make("remove16");
  emb_store *s = fx_shard(p, dir, 2048, 0);
  check_store(s, p);
  emb_store_destroy(s);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_shard_remove) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 3, 1);
  char *dir = tmpdir_make("remove");
  emb_store *s = fx_shard(p, dir, 2048, 0); /* a cache smaller than the rows */
  check_store(s, p);
  emb_store_destroy(s);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

static uint64_t sst_bytes(emb_store *s) {
  emb_store_figures f;
  ck_assert_int_eq(emb_store_figures_get(s, &f), 0);
  return f.sst_bytes;
}

START_TEST(test_shard_compacts_removed) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir_make("compact");
  emb_store *s = fx_shard(p, dir, 2048, 0);
  idbuf all, most;
  ids_make(&all, 1, 0);
  ids_make(&most, 8, 1); /* then keep only 1 row in 8: remove the other 7 */
  for (int t = 0; t < NT; t++) {
    size_t m = 0;
    for (size_t r = 0; r < N; r++)
      if (r % 8) most.ids[t][m++] = id_of(t, r);
    most.counts[t] = m;
  }
  push_rows(s, &all, 1);
  ck_assert_int_eq(emb_shard_mark_clean(s), 0);
  uint64_t full = sst_bytes(s);
  ck_assert_msg(full > 0, "no SST bytes after a clean stop");
  ck_assert_int_eq(emb_store_remove(s, 2, &most.set), 0);
  ck_assert_int_eq(emb_shard_mark_clean(s), 0);
  uint64_t after = sst_bytes(s);
  ck_assert_msg(after * 2 < full, "RocksDB files %llu bytes after removing 7 rows in 8 (%llu before)",
                (unsigned long long)after, (unsigned long long)full);
  emb_store_destroy(s);
  ids_free(&all);
  ids_free(&most);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* A store marked clean then given a removal, which dies without closing
 * (_exit: the removal, which skips the write-ahead log, still in a
 * memtable), opens unclean: the marks went with the removal, so the lost
 * removal is never taken for a clean stop's rows. The fork comes first,
 * before this process touches RocksDB (see test_shard.c's crash_after). */
START_TEST(test_shard_remove_after_mark_then_crash) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir_make("rmcrash");
  idbuf all, odd;
  ids_make(&all, 1, 0);
  ids_make(&odd, 2, 1);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    emb_store *s = fx_shard(p, dir, 2048, 0);
    push_rows(s, &all, 1);
    if (emb_shard_mark_clean(s) || emb_store_remove(s, 2, &odd.set)) _exit(3);
    _exit(0);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: %d", st);
  emb_store *s = fx_shard(p, dir, 2048, 0);
  ck_assert_msg(emb_shard_unclean(s) == 1, "a removal after the clean stop reopened as clean");
  emb_store_destroy(s);
  ids_free(&all);
  ids_free(&odd);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_absent_zero) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_SGD, 1, 0);
  if (_i) make_16bit(p); /* the loop's second run */
  p->tables[0].keep.expire_after = 5; /* table 0 bounded, 1 and 2 not */
  char err[256], *dir = tmpdir_make("absent");
  emb_store *st[2] = {emb_store_create_local(p, err, sizeof err), fx_shard(p, dir, 2048, 0)};
  for (int k = 0; k < 2; k++) {
    ck_assert_ptr_nonnull(st[k]);
    emb_store_absent_zero(st[k]);
    idbuf b;
    ids_make(&b, 100, 3);
    ck_assert_int_eq(emb_store_lookup_begin(st[k], 0, &b.set, b.buf), 0);
    ck_assert_int_eq(emb_store_lookup_wait(st[k]), 0);
    for (int t = 0; t < NT; t++)
      for (size_t r = 0; r < b.counts[t]; r++) {
        float want[DIM] = {0};
        if (t) emb_row_init(p, t, b.ids[t][r], want);
        ck_assert_msg(!memcmp(want, b.buf[t] + r * D[t], (size_t)D[t] * sizeof(float)),
                      "store %d table %d row %llu: not %s", k, t, (unsigned long long)b.ids[t][r],
                      t ? "its init value" : "zeros");
      }
    ids_free(&b);
    emb_store_destroy(st[k]);
  }
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* dir/removed-<id>.bin of each table lists exactly want's ids (ascending). */
static void assert_removed_file(const char *dir, const emb_plan *p, const idbuf *want) {
  char fp[EMB_FP_HEX], path[4096], err[1024];
  ck_assert_int_eq(emb_plan_model_fingerprint(p, fp), 0);
  for (int t = 0; t < NT; t++) {
    uint64_t *ids, *exp = malloc((want->counts[t] + 1) * sizeof *exp);
    size_t n, m = want->counts[t];
    memcpy(exp, want->ids[t], m * sizeof *exp);
    emb_rmfile_sort_unique(exp, &m);
    ck_assert_int_eq(ckpt_dir_removed_file(dir, p->tables[t].table_id, path, sizeof path), 0);
    ck_assert_msg(emb_rmfile_read(path, &p->tables[t], fp, &ids, &n, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_msg(n == m && (!n || !memcmp(ids, exp, n * sizeof *ids)),
                  "table %d: the delta lists %zu removed rows, not the %zu removed", t, n, m);
    free(ids);
    free(exp);
  }
}

/* s: every row pushed, checkpointed to dir/full, pushed again, the odd rows
 * removed and one in four (r % 4 == 1) pushed again, a delta to dir/d; to
 * (fresh) restores both and holds s's rows. */
static void check_delta(emb_store *s, emb_store *to, const emb_plan *p, const char *dir) {
  char full[4096], d[4096];
  idbuf all, odd, back, gone;
  ids_make(&all, 1, 0);
  ids_make(&odd, 2, 1);
  ids_make(&back, 4, 1);
  ids_make(&gone, 4, 3);
  snprintf(full, sizeof full, "%s/full", dir);
  snprintf(d, sizeof d, "%s/d", dir);
  push_rows(s, &all, 1);
  ck_assert_msg(emb_store_checkpoint(s, full) == 0, "%s", emb_store_errmsg(s));
  push_rows(s, &all, 2);
  ck_assert_msg(emb_store_remove(s, 3, &odd.set) == 0, "%s", emb_store_errmsg(s));
  push_rows(s, &back, 4);
  ck_assert_msg(emb_store_checkpoint_delta(s, d) == 0, "%s", emb_store_errmsg(s));
  assert_removed_file(d, p, &gone);
  ck_assert_msg(emb_store_restore(to, full) == 0, "%s", emb_store_errmsg(to));
  ck_assert_msg(emb_store_restore_delta(to, d) == 0, "%s", emb_store_errmsg(to));
  idbuf kept;
  ids_make(&kept, 1, 0);
  for (int t = 0; t < NT; t++) {
    size_t m = 0;
    for (size_t r = 0; r < N; r++)
      if (r % 4 != 3) kept.ids[t][m++] = id_of(t, r);
    kept.counts[t] = m;
  }
  assert_rows(to, &kept, s);
  ids_free(&kept);
  ids_free(&all);
  ids_free(&odd);
  ids_free(&back);
  ids_free(&gone);
}

START_TEST(test_local_delta_removed) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 1, 0);
  char err[256], *dir = tmpdir_make("ldelta");
  emb_store *s = emb_store_create_local(p, err, sizeof err);
  emb_store *to = emb_store_create_local(p, err, sizeof err);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(to);
  check_delta(s, to, p, dir);
  emb_store_destroy(s);
  emb_store_destroy(to);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_shard_delta_removed) {
  emb_plan *p = fx_plan(ROWS, DIM, 7, EMB_OPT_ADAGRAD, 3, 1);
  char *dir = tmpdir_make("sdelta"), a[4096], b[4096], c[4096];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  snprintf(c, sizeof c, "%s/ck", dir);
  ck_assert_int_eq(sr_mkdirs(c), 0);
  emb_store *s = fx_shard(p, a, 2048, 0); /* a cache smaller than the rows */
  emb_store *to = fx_shard(p, b, 2048, 0);
  check_delta(s, to, p, c);
  emb_store_destroy(s);
  emb_store_destroy(to);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("emb_store_remove");
  TCase *tc = tcase_create("remove");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_local_remove);
  tcase_add_test(tc, test_shard_remove);
  tcase_add_test(tc, test_shard_compacts_removed);
  tcase_add_test(tc, test_shard_remove_after_mark_then_crash);
  tcase_add_loop_test(tc, test_absent_zero, 0, 2);
  tcase_add_test(tc, test_local_remove_16bit);
  tcase_add_test(tc, test_shard_remove_16bit);
  tcase_add_test(tc, test_local_delta_removed);
  tcase_add_test(tc, test_shard_delta_removed);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
