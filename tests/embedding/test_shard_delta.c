/* The shard store's incremental checkpoints (embedding/shard.h, store.h's
 * checkpoint_delta and restore_delta): a delta holds exactly the rows
 * pushed since the last checkpoint, delta or restore, with the values and
 * optimizer state the local store holds for them, in the local store's
 * bytes; a full checkpoint and its deltas restored give the store's rows
 * back; the change set is cleared by each op; a damaged or missing file,
 * or a row of a shard not hosted, is refused with nothing changed. The
 * cache is small, so rows go through eviction and RocksDB in between. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"
#include "tests/embedding/shard_fixture.h"
#include "tests/support/proc.h"
#include "tests/support/store_rows.h"

#define NT FX_NT
#define DIM 8
#define MAXB 600
static const uint64_t ROWS[NT] = {5000, 300, 0}; /* bounded, small bounded, unbounded */

typedef struct {
  uint64_t ids[NT][MAXB];
  size_t counts[NT];
  const uint64_t *idp[NT];
  float grads[NT][MAXB * DIM];
  const float *gp[NT];
  emb_idset set;
} step_data;

/* n unique ids a table (a quarter of them in table 1), skewed; grads. */
static void make_step(step_data *d, sr_rng *r, size_t n, const emb_plan *p) {
  for (int t = 0; t < NT; t++) {
    size_t c = fx_step_ids(r, ROWS[t], t == 1 ? n / 4 : n, d->ids[t]);
    d->counts[t] = c;
    d->idp[t] = d->ids[t];
    for (size_t k = 0; k < c * (size_t)p->tables[t].dim; k++)
      d->grads[t][k] = (float)(sr_rng_uniform(r) - 0.5);
    d->gp[t] = d->grads[t];
  }
  d->set = (emb_idset){NT, d->idp, d->counts};
}

/* The same step pushed into every store of s[n] (NULL entries skipped). */
static void push_all(emb_store **s, int n, step_data *d, float lr) {
  for (int k = 0; k < n; k++)
    if (s[k]) ck_assert_msg(emb_store_push(s[k], 0, lr, &d->set, d->gp) == 0, "%s", emb_store_errmsg(s[k]));
}

/* The ids of table t pushed since the set was last emptied (a sorted list). */
typedef struct {
  uint64_t *ids[NT];
  size_t n[NT], cap[NT];
} idlist;

static void idlist_add(idlist *l, const step_data *d) {
  for (int t = 0; t < NT; t++)
    for (size_t i = 0; i < d->counts[t]; i++) {
      int seen = 0;
      for (size_t k = 0; k < l->n[t] && !seen; k++) seen = l->ids[t][k] == d->ids[t][i];
      if (seen) continue;
      if (l->n[t] == l->cap[t]) {
        l->cap[t] = l->cap[t] ? 2 * l->cap[t] : 1024;
        l->ids[t] = realloc(l->ids[t], l->cap[t] * sizeof *l->ids[t]);
        ck_assert_ptr_nonnull(l->ids[t]);
      }
      l->ids[t][l->n[t]++] = d->ids[t][i];
    }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void idlist_free(idlist *l) {
  for (int t = 0; t < NT; t++) free(l->ids[t]);
  memset(l, 0, sizeof *l);
}

/* A file's records as read back. */
typedef struct {
  uint64_t n, ids[8192];
  float vals[8192][2 * DIM];
  int w;
} records;

static int rec_fn(void *ctx, uint64_t id, const float *vals) {
  records *r = ctx;
  ck_assert(r->n < 8192);
  r->ids[r->n] = id;
  memcpy(r->vals[r->n], vals, 4 * (size_t)r->w);
  r->n++;
  return 0;
}

static int row_w(const emb_plan *p, int t) {
  return p->tables[t].dim + emb_optim_state_len(&p->tables[t].optim, p->tables[t].dim);
}

/* dir/table-<id>.bin of table t read whole into r (0 or the reader's status). */
static int read_delta(const emb_plan *p, const char *dir, int t, records *r, char *err, size_t n) {
  char path[700], fp[EMB_FP_HEX];
  ck_assert_int_eq(ckpt_dir_table_file(dir, p->tables[t].table_id, path, sizeof path), 0);
  ck_assert_int_eq(emb_plan_model_fingerprint(p, fp), 0);
  memset(r, 0, sizeof *r);
  r->w = row_w(p, t);
  return emb_tabfile_read(path, &p->tables[t], fp, rec_fn, r, err, n);
}

/* The delta under dir holds exactly want's ids, ascending, each with the
 * value and state ref holds for it. */
static void check_delta(const emb_plan *p, const char *dir, idlist *want, emb_store *ref) {
  static records r;
  char err[1024];
  for (int t = 0; t < NT; t++) {
    int rc = read_delta(p, dir, t, &r, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    qsort(want->ids[t], want->n[t], sizeof(uint64_t), cmp_u64);
    ck_assert_uint_eq(r.n, want->n[t]);
    for (uint64_t i = 0; i < r.n; i++) {
      ck_assert_uint_eq(r.ids[i], want->ids[t][i]);
      assert_row_held(ref, t, r.ids[i], r.vals[i], r.w);
    }
  }
}

/* SHA-256 over every row of s (table, id, value, state), into hex. */
static int digest_fn(void *ctx, int table, uint64_t id, const float *v, int dim, const float *st,
                     int sl) {
  sr_sha256_ctx *h = ctx;
  sr_sha256_update(h, &table, sizeof table);
  sr_sha256_update(h, &id, sizeof id);
  sr_sha256_update(h, v, 4 * (size_t)dim);
  if (sl) sr_sha256_update(h, st, 4 * (size_t)sl);
  return 0;
}

static void digest(emb_store *s, unsigned char out[32]) {
  sr_sha256_ctx h;
  ck_assert_int_eq(sr_sha256_init(&h), 0);
  for (int t = 0; t < NT; t++)
    ck_assert_msg(emb_store_iterate(s, t, digest_fn, &h) == 0, "%s", emb_store_errmsg(s));
  ck_assert_int_eq(sr_sha256_final(&h, out), 0);
}

static void path_in(char *buf, size_t n, const char *dir, const char *name) {
  snprintf(buf, n, "%s/%s", dir, name);
}

/* The end of each test: its folders (dir2 may be NULL) removed and freed,
 * the plan freed. */
static void drop_dirs(emb_plan *p, char *dir, char *dir2, char *ck) {
  char *all[3] = {dir, dir2, ck};
  for (int i = 0; i < 3; i++) {
    if (!all[i]) continue;
    sr_rmtree(all[i]);
    free(all[i]);
  }
  emb_plan_free(p);
}

/* After pushes, a delta holds exactly the rows pushed since the last full
 * checkpoint (rows evicted and read back in between), with the local
 * store's values and state; a second delta exactly those pushed since the
 * first. */
START_TEST(test_delta_holds_changed_rows) {
  emb_plan *p = fx_plan(ROWS, DIM, 21, EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir_make("shd"), *ck = tmpdir_make("shdck"), err[512], full[600], d1[600], d2[600];
  emb_store *s[2] = {emb_store_create_local(p, err, sizeof err), fx_shard(p, dir, 1024, 0)};
  static step_data d;
  idlist want = {0};
  sr_rng r;
  sr_rng_init(&r, 3, 1);
  for (int step = 0; step < 6; step++) {
    make_step(&d, &r, 500, p);
    push_all(s, 2, &d, 0.05f);
  }
  path_in(full, sizeof full, ck, "full");
  ck_assert_msg(emb_store_checkpoint(s[1], full) == 0, "%s", emb_store_errmsg(s[1]));
  for (int step = 0; step < 4; step++) {
    make_step(&d, &r, step == 0 ? 500 : 40, p);
    push_all(s, 2, &d, 0.05f);
    idlist_add(&want, &d);
  }
  path_in(d1, sizeof d1, ck, "d1");
  ck_assert_msg(emb_store_checkpoint_delta(s[1], d1) == 0, "%s", emb_store_errmsg(s[1]));
  check_delta(p, d1, &want, s[0]);
  ck_assert_uint_lt(want.n[0], 1500); /* fewer rows than the store holds */
  idlist_free(&want);
  make_step(&d, &r, 30, p);
  push_all(s, 2, &d, 0.05f);
  idlist_add(&want, &d);
  path_in(d2, sizeof d2, ck, "d2");
  ck_assert_msg(emb_store_checkpoint_delta(s[1], d2) == 0, "%s", emb_store_errmsg(s[1]));
  check_delta(p, d2, &want, s[0]);
  idlist_free(&want);
  emb_store_destroy(s[1]);
  emb_store_destroy(s[0]);
  drop_dirs(p, dir, NULL, ck);
}
END_TEST

/* The same rows give the same bytes: on fresh stores every row held is a
 * changed row, so the shard store's delta is, file for file, the local
 * store's full checkpoint of the same pushes; after a full checkpoint of
 * each, the two stores' deltas of the same pushes are the same files. */
START_TEST(test_delta_bytes_are_local_store_bytes) {
  emb_plan *p = fx_plan(ROWS, DIM, 22, EMB_OPT_ROWWISE_ADAGRAD, 3, 1);
  char *dir = tmpdir_make("shd"), *ck = tmpdir_make("shdck"), err[512], a[600], b[600];
  emb_store *s[2] = {emb_store_create_local(p, err, sizeof err), fx_shard(p, dir, 1024, 0)};
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 4, 1);
  for (int step = 0; step < 5; step++) {
    make_step(&d, &r, 400, p);
    push_all(s, 2, &d, 0.1f);
  }
  path_in(a, sizeof a, ck, "local");
  path_in(b, sizeof b, ck, "delta");
  ck_assert_int_eq(emb_store_checkpoint(s[0], a), 0);
  ck_assert_msg(emb_store_checkpoint_delta(s[1], b) == 0, "%s", emb_store_errmsg(s[1]));
  char *out;
  int rc = run_cmd(&out, "cd %s && ls local && ls delta && diff -r local delta", ck);
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_ptr_nonnull(strstr(out, "table-2.bin"));
  free(out);
  /* After a full checkpoint of each, more pushes: both stores' deltas, the
   * rows changed since, are the same bytes too. */
  path_in(a, sizeof a, ck, "full-local");
  path_in(b, sizeof b, ck, "full-shard");
  ck_assert_int_eq(emb_store_checkpoint(s[0], a), 0);
  ck_assert_msg(emb_store_checkpoint(s[1], b) == 0, "%s", emb_store_errmsg(s[1]));
  for (int step = 0; step < 3; step++) {
    make_step(&d, &r, 60, p);
    push_all(s, 2, &d, 0.1f);
  }
  path_in(a, sizeof a, ck, "delta-local");
  path_in(b, sizeof b, ck, "delta-shard");
  ck_assert_msg(emb_store_checkpoint_delta(s[0], a) == 0, "%s", emb_store_errmsg(s[0]));
  ck_assert_msg(emb_store_checkpoint_delta(s[1], b) == 0, "%s", emb_store_errmsg(s[1]));
  rc = run_cmd(&out, "cd %s && diff -r delta-local delta-shard && cmp -s local/table-0.bin "
                     "delta-local/table-0.bin; echo same-as-full $?", ck);
  ck_assert_msg(rc == 0 && strstr(out, "same-as-full 1"), "%s", out); /* a delta, not all rows */
  free(out);
  emb_store_destroy(s[1]);
  emb_store_destroy(s[0]);
  drop_dirs(p, dir, NULL, ck);
}
END_TEST

/* Full checkpoint, then two deltas; the rows changed on after them; restore
 * then restore_delta twice gives the rows of the last delta back, in the
 * store that wrote them and in a fresh store over another folder; lookups
 * and further pushes match a local store that never stopped. */
START_TEST(test_full_and_deltas_restore) {
  emb_plan *p = fx_plan(ROWS, DIM, 23, EMB_OPT_ADAGRAD, 2, 0);
  char *dir = tmpdir_make("shd"), *dir2 = tmpdir_make("shd2"), *ck = tmpdir_make("shdck");
  char err[512], full[600], d1[600], d2[600];
  emb_store *s[2] = {emb_store_create_local(p, err, sizeof err), fx_shard(p, dir, 1024, 0)};
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 5, 1);
  path_in(full, sizeof full, ck, "full");
  path_in(d1, sizeof d1, ck, "d1");
  path_in(d2, sizeof d2, ck, "d2");
  for (int step = 0; step < 12; step++) {
    make_step(&d, &r, step < 4 ? 500 : 60, p);
    push_all(s, 2, &d, 0.05f);
    const char *to = step == 3 ? full : step == 7 ? d1 : step == 11 ? d2 : NULL;
    if (!to) continue;
    int rc = step == 3 ? emb_store_checkpoint(s[1], to) : emb_store_checkpoint_delta(s[1], to);
    ck_assert_msg(rc == 0, "%s", emb_store_errmsg(s[1]));
  }
  unsigned char want[32], got[32];
  digest(s[0], want);
  digest(s[1], got);
  ck_assert(!memcmp(want, got, 32));
  for (int step = 0; step < 3; step++) { /* rows the restore must undo */
    make_step(&d, &r, 300, p);
    ck_assert_int_eq(emb_store_push(s[1], 0, 0.5f, &d.set, d.gp), 0);
  }
  digest(s[1], got);
  ck_assert(memcmp(want, got, 32));
  emb_store *fresh = fx_shard(p, dir2, 2048, 0);
  emb_store *both[2] = {s[1], fresh};
  for (int k = 0; k < 2; k++) {
    int rc = emb_store_restore(both[k], full);
    if (!rc) rc = emb_store_restore_delta(both[k], d1);
    if (!rc) rc = emb_store_restore_delta(both[k], d2);
    ck_assert_msg(rc == 0, "%s", emb_store_errmsg(both[k]));
    digest(both[k], got);
    ck_assert_msg(!memcmp(want, got, 32), "store %d: rows differ from the uninterrupted ones", k);
  }
  /* Training goes on from there exactly as in the store never restored. */
  for (int step = 0; step < 3; step++) {
    make_step(&d, &r, 300, p);
    emb_store *all[3] = {s[0], s[1], fresh};
    push_all(all, 3, &d, 0.05f);
  }
  digest(s[0], want);
  digest(s[1], got);
  ck_assert(!memcmp(want, got, 32));
  digest(fresh, got);
  ck_assert(!memcmp(want, got, 32));
  emb_store_destroy(fresh);
  emb_store_destroy(s[1]);
  emb_store_destroy(s[0]);
  drop_dirs(p, dir, dir2, ck);
}
END_TEST

/* Rows in every table file under dir. */
static uint64_t delta_rows(const emb_plan *p, const char *dir) {
  static records r;
  char err[1024];
  uint64_t n = 0;
  for (int t = 0; t < NT; t++) {
    ck_assert_msg(read_delta(p, dir, t, &r, err, sizeof err) == 0, "%s", err);
    n += r.n;
  }
  return n;
}

/* The change set is emptied by a delta, a full checkpoint, a restore and a
 * restore_delta (each delta after them holds no row), and only by them. */
START_TEST(test_change_set_cleared) {
  emb_plan *p = fx_plan(ROWS, DIM, 24, EMB_OPT_SGD, 1, 0);
  char *dir = tmpdir_make("shd"), *ck = tmpdir_make("shdck"), name[64], path[600], full[600], op0[600];
  emb_store *s = fx_shard(p, dir, 1024, 0);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 6, 1);
  int n = 0;
  make_step(&d, &r, 200, p);
  push_all(&s, 1, &d, 0.1f);
  path_in(full, sizeof full, ck, "full");
  path_in(op0, sizeof op0, ck, "op0");
  ck_assert_int_eq(emb_store_checkpoint(s, full), 0);
  for (int op = 0; op < 4; op++) {
    make_step(&d, &r, 50, p);
    push_all(&s, 1, &d, 0.1f);
    snprintf(name, sizeof name, "op%d", op);
    path_in(path, sizeof path, ck, name);
    int rc = op == 0   ? emb_store_checkpoint_delta(s, path)
             : op == 1 ? emb_store_checkpoint(s, path)
             : op == 2 ? emb_store_restore(s, full)
                       : emb_store_restore_delta(s, op0);
    ck_assert_msg(rc == 0, "op %d: %s", op, emb_store_errmsg(s));
    if (op == 0) ck_assert_uint_eq(delta_rows(p, op0), d.counts[0] + d.counts[1] + d.counts[2]);
    snprintf(name, sizeof name, "after%d", n++);
    path_in(path, sizeof path, ck, name);
    ck_assert_msg(emb_store_checkpoint_delta(s, path) == 0, "%s", emb_store_errmsg(s));
    ck_assert_msg(delta_rows(p, path) == 0, "op %d left rows in the change set", op);
  }
  emb_store_destroy(s);
  drop_dirs(p, dir, NULL, ck);
}
END_TEST

/* A refused push leaves no row in the change set: one of at most a chunk
 * of rows (applied in one pass, its rows put back) and one of more (checked
 * whole first), each refused on its last row's update. */
START_TEST(test_refused_push_adds_no_rows) {
  emb_plan *p = fx_plan(ROWS, DIM, 25, EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir_make("shd"), *ck = tmpdir_make("shdck"), path[600];
  emb_store *s = fx_shard(p, dir, 1024, 0); /* chunks of 512 rows */
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 8, 1);
  make_step(&d, &r, 200, p);
  push_all(&s, 1, &d, 0.1f);
  path_in(path, sizeof path, ck, "full");
  ck_assert_int_eq(emb_store_checkpoint(s, path), 0); /* the change set is kept from here */
  const size_t sizes[2] = {100, MAXB};
  for (int k = 0; k < 2; k++) {
    make_step(&d, &r, sizes[k], p);
    const size_t total = d.counts[0] + d.counts[1] + d.counts[2];
    ck_assert(k == 0 ? total <= 512 : total > 512);
    d.grads[2][(d.counts[2] - 1) * DIM] = 3e38f; /* the accumulator of the last row: inf */
    ck_assert_int_eq(emb_store_push(s, 1, 1e4f, &d.set, d.gp), SR_ERANGE);
    char name[32];
    snprintf(name, sizeof name, "after%d", k);
    path_in(path, sizeof path, ck, name);
    ck_assert_msg(emb_store_checkpoint_delta(s, path) == 0, "%s", emb_store_errmsg(s));
    ck_assert_msg(delta_rows(p, path) == 0, "a refused push of %zu rows left rows in the change set",
                  total);
  }
  emb_store_destroy(s);
  drop_dirs(p, dir, NULL, ck);
}
END_TEST

/* restore_delta refuses, changing no row: a damaged file (naming it), a
 * missing one, and (a store hosting shard 0 only) a row of shard 1. */
START_TEST(test_restore_delta_refusals) {
  emb_plan *p = fx_plan(ROWS, DIM, 25, EMB_OPT_ADAGRAD, 2, 1);
  char *dir = tmpdir_make("shd"), *dir2 = tmpdir_make("shd2"), *ck = tmpdir_make("shdck");
  char delta[600], err[1024];
  emb_store *s = fx_shard(p, dir, 1024, 0);
  static step_data d;
  sr_rng r;
  sr_rng_init(&r, 7, 1);
  make_step(&d, &r, 300, p);
  push_all(&s, 1, &d, 0.1f);
  path_in(delta, sizeof delta, ck, "delta");
  ck_assert_int_eq(emb_store_checkpoint_delta(s, delta), 0);
  make_step(&d, &r, 300, p);
  push_all(&s, 1, &d, 0.1f);
  unsigned char before[32], after[32];
  digest(s, before);
  /* Damaged: a byte of table 2's records flipped. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && cp table-2.bin keep && printf '\\377' | dd of=table-2.bin "
                                 "bs=1 seek=300 conv=notrunc 2>/dev/null", delta), 0);
  ck_assert_int_eq(emb_store_restore_delta(s, delta), SR_ECHECKSUM);
  ck_assert_msg(strstr(emb_store_errmsg(s), "table-2.bin") && strstr(emb_store_errmsg(s), "damaged"),
                "%s", emb_store_errmsg(s));
  digest(s, after);
  ck_assert(!memcmp(before, after, 32));
  /* Missing. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && rm table-2.bin", delta), 0);
  ck_assert_int_eq(emb_store_restore_delta(s, delta), SR_ENOTFOUND);
  ck_assert_msg(strstr(emb_store_errmsg(s), "table-2.bin"), "%s", emb_store_errmsg(s));
  digest(s, after);
  ck_assert(!memcmp(before, after, 32));
  ck_assert_int_eq(run_cmd(NULL, "cd %s && mv keep table-2.bin", delta), 0);
  /* Rows of a shard this store does not host (shard 1's, row-wise). */
  emb_shard_config c;
  memset(&c, 0, sizeof c);
  c.cache_rows = 1024;
  int hosted[1] = {0};
  c.n_hosted = 1;
  c.hosted = hosted;
  emb_store *half = emb_store_create_shard(p, dir2, &c, err, sizeof err);
  ck_assert_msg(half != NULL, "%s", err);
  digest(half, before);
  ck_assert_int_eq(emb_store_restore_delta(half, delta), SR_EMISMATCH);
  ck_assert_msg(strstr(emb_store_errmsg(half), "of shard 1, not hosted here"), "%s",
                emb_store_errmsg(half));
  digest(half, after);
  ck_assert(!memcmp(before, after, 32));
  /* The whole file again: taken. */
  ck_assert_msg(emb_store_restore_delta(s, delta) == 0, "%s", emb_store_errmsg(s));
  emb_store_destroy(half);
  emb_store_destroy(s);
  drop_dirs(p, dir, dir2, ck);
}
END_TEST

int main(void) {
  Suite *s = suite_create("emb_shard_delta");
  TCase *tc = tcase_create("delta");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_delta_holds_changed_rows);
  tcase_add_test(tc, test_delta_bytes_are_local_store_bytes);
  tcase_add_test(tc, test_full_and_deltas_restore);
  tcase_add_test(tc, test_change_set_cleared);
  tcase_add_test(tc, test_refused_push_adds_no_rows);
  tcase_add_test(tc, test_restore_delta_refusals);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
