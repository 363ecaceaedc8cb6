/* Tests for the shard store's lookup_pinned op (embedding/store.h): rows
 * answered as pointers into the slots, send-pinned until pins_release.
 * Against a second shard store doing the same calls with lookup_begin (the
 * gather) and the local store: the same bits and counters; the pinned bytes
 * unchanged by pushes (copy on write, optimizer state with the row),
 * evictions, a restore and the store's destroy; rows removed while one is
 * sent stay removed, flushed and reopened; a lookup that would pin
 * too much of the cache refused SR_ESTATE with nothing pinned. Real
 * RocksDB folders, the store's real threads. */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "tests/embedding/shard_fixture.h"

static const uint64_t ROWS[FX_NT] = {20000, 600, 0};
#define DIM 8
#define CACHE 1024 /* pins may take cache - chunk - 1 = 511 rows */
#define N 200      /* ids a table: 400 rows, within the 511 */

static emb_plan *plan;
static char *dir_a, *dir_b;
static emb_store *a, *b; /* a: pinned; b: gathered */

static void setup(void) {
  plan = fx_plan(ROWS, DIM, 11, EMB_OPT_ADAGRAD, 1, 0);
  dir_a = tmpdir_make("pinned-a");
  dir_b = tmpdir_make("pinned-b");
  a = fx_shard(plan, dir_a, CACHE, 0);
  b = fx_shard(plan, dir_b, CACHE, 0);
  ck_assert_ptr_nonnull(a->ops->lookup_pinned);
}

static void teardown(void) {
  emb_store_destroy(a);
  emb_store_destroy(b);
  sr_rmtree(dir_a);
  sr_rmtree(dir_b);
  free(dir_a);
  free(dir_b);
  emb_plan_free(plan);
}

/* Ids: n per table of tables 0 and 2 from first (table 1: none). */
typedef struct {
  uint64_t ids[FX_NT][N];
  size_t counts[FX_NT];
  const uint64_t *idp[FX_NT];
  emb_idset set;
} ids_t;

static void ids_make(ids_t *d, uint64_t first, size_t n) {
  memset(d, 0, sizeof *d);
  for (int t = 0; t < FX_NT; t++) {
    d->counts[t] = t == 1 ? 0 : n;
    for (size_t r = 0; r < d->counts[t]; r++) d->ids[t][r] = first + r * 3;
    d->idp[t] = d->ids[t];
  }
  d->set = (emb_idset){FX_NT, d->idp, d->counts};
}

/* rows[t][r] pointers of a lookup_pinned (the caller's arrays). */
typedef struct {
  const float *p[FX_NT][N];
  const float **rows[FX_NT];
} ptrs_t;

static emb_pins *pinned(emb_store *s, int64_t step, const ids_t *d, ptrs_t *pt) {
  for (int t = 0; t < FX_NT; t++) pt->rows[t] = pt->p[t];
  emb_pins *pins = NULL;
  int rc = s->ops->lookup_pinned(s, step, &d->set, (const float **const *)pt->rows, &pins);
  ck_assert_msg(rc == 0, "lookup_pinned: %s", emb_store_errmsg(s));
  ck_assert_ptr_nonnull(pins);
  return pins;
}

/* The gathered rows of d: out[t] gets counts[t] x DIM floats. */
static void gathered(emb_store *s, int64_t step, const ids_t *d, float out[FX_NT][N * DIM]) {
  float *o[FX_NT] = {out[0], out[1], out[2]};
  ck_assert_int_eq(emb_store_lookup_begin(s, step, &d->set, o), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
}

/* Pinned rows pt of d as one array per table, like gathered's. */
static void flatten(const ids_t *d, const ptrs_t *pt, float out[FX_NT][N * DIM]) {
  for (int t = 0; t < FX_NT; t++)
    for (size_t r = 0; r < d->counts[t]; r++)
      memcpy(out[t] + r * DIM, pt->p[t][r], (size_t)plan->tables[t].dim * sizeof(float));
}

static void push(emb_store *s, int64_t step, const ids_t *d, float g) {
  static float gr[FX_NT][N * DIM];
  for (int t = 0; t < FX_NT; t++)
    for (size_t i = 0; i < N * DIM; i++) gr[t][i] = g + (float)(i % 5) * 0.125f;
  const float *gp[FX_NT] = {gr[0], gr[1], gr[2]};
  ck_assert_msg(emb_store_push(s, step, 0.25f, &d->set, gp) == 0, "push: %s", emb_store_errmsg(s));
}

static uint64_t send_held(emb_store *s) {
  emb_shard_counters c;
  ck_assert_int_eq(emb_shard_counters_get(s, &c), 0);
  return c.send_held;
}

static float want[FX_NT][N * DIM], got[FX_NT][N * DIM], kept[FX_NT][N * DIM];

/* The same bits and counters as the gather, misses and hits alike. */
START_TEST(test_pinned_equals_gather) {
  ids_t d;
  ids_make(&d, 5, N);
  push(a, 0, &d, 0.5f), push(b, 0, &d, 0.5f);
  ids_t e; /* half cached, half not */
  ids_make(&e, 5 + 3 * N / 2, N);
  ptrs_t pt;
  emb_pins *p = pinned(a, 1, &e, &pt);
  gathered(b, 1, &e, want);
  flatten(&e, &pt, got);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], want[t], sizeof got[t]) == 0);
  emb_store_stats sa, sb;
  ck_assert_int_eq(emb_store_stats_get(a, &sa), 0);
  ck_assert_int_eq(emb_store_stats_get(b, &sb), 0);
  ck_assert_uint_eq(sa.lookups, sb.lookups);
  ck_assert_uint_eq(sa.hits, sb.hits);
  ck_assert_uint_gt(sa.hits, 0);
  ck_assert_uint_lt(sa.hits, sa.lookups);
  ck_assert_uint_eq(send_held(a), 2 * N);
  a->ops->pins_release(p);
  ck_assert_uint_eq(send_held(a), 0);
}
END_TEST

/* A push to sent rows moves them: the sent bytes stay, the next lookup
 * sees the push; evictions around the pins leave them too. */
START_TEST(test_push_copies_sent_rows) {
  ids_t d;
  ids_make(&d, 100, N);
  ptrs_t pt;
  emb_pins *p = pinned(a, 0, &d, &pt);
  gathered(b, 0, &d, kept);
  push(a, 0, &d, 1.0f), push(b, 0, &d, 1.0f);
  flatten(&d, &pt, got);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], kept[t], sizeof got[t]) == 0);
  emb_shard_counters c;
  ck_assert_int_eq(emb_shard_counters_get(a, &c), 0);
  ck_assert_uint_eq(c.send_copies, 2 * N);
  gathered(a, 1, &d, got);
  gathered(b, 1, &d, want);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], want[t], sizeof got[t]) == 0);
  for (int k = 0; k < 8; k++) { /* 8 x 400 other rows through 1024 slots, 400 held */
    ids_t o;
    ids_make(&o, 2000 + (uint64_t)k * 3 * N, N);
    gathered(a, 2 + k, &o, got);
    push(a, 2 + k, &o, 0.25f);
  }
  ck_assert_int_eq(emb_shard_counters_get(a, &c), 0);
  ck_assert_uint_gt(c.evictions, 0);
  flatten(&d, &pt, got);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], kept[t], sizeof got[t]) == 0);
  a->ops->pins_release(p);
  push(a, 20, &d, 1.0f), push(b, 20, &d, 1.0f); /* nothing sent now: no copy */
  ck_assert_int_eq(emb_shard_counters_get(a, &c), 0);
  ck_assert_uint_eq(c.send_copies, 2 * N);
  gathered(a, 21, &d, got);
  gathered(b, 21, &d, want);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], want[t], sizeof got[t]) == 0);
}
END_TEST

/* A restore and the store's destroy with pins out leave the sent bytes;
 * the last release frees them (AddressSanitizer sees either mistake). */
START_TEST(test_restore_and_destroy_keep_sent_rows) {
  ids_t d;
  ids_make(&d, 7, N);
  push(a, 0, &d, 0.5f);
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ckpt", dir_a);
  ck_assert_int_eq(emb_store_checkpoint(a, ck), 0);
  push(a, 1, &d, 0.5f);
  ptrs_t pt;
  emb_pins *p = pinned(a, 2, &d, &pt);
  flatten(&d, &pt, kept);
  ck_assert_msg(emb_store_restore(a, ck) == 0, "restore: %s", emb_store_errmsg(a));
  ids_t o;
  ids_make(&o, 10000, N);
  push(a, 0, &o, 0.5f); /* fills slots after the restore */
  flatten(&d, &pt, got);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], kept[t], sizeof got[t]) == 0);
  emb_store_destroy(a);
  a = NULL;
  flatten(&d, &pt, got);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], kept[t], sizeof got[t]) == 0);
  b->ops->pins_release(p); /* the op of any shard store: the ops are shared */
}
END_TEST

/* Table 0's rows first .. first + n - 1 alone. */
typedef struct {
  uint64_t ids[CACHE];
  size_t counts[FX_NT];
  const uint64_t *idp[FX_NT];
  emb_idset set;
} rows0_t;

static void rows0_make(rows0_t *d, uint64_t first, size_t n) {
  memset(d, 0, sizeof *d);
  for (size_t r = 0; r < n; r++) d->ids[r] = first + r;
  d->counts[0] = n;
  for (int t = 0; t < FX_NT; t++) d->idp[t] = d->ids;
  d->set = (emb_idset){FX_NT, d->idp, d->counts};
}

static void push0(emb_store *s, int64_t step, const rows0_t *d, float g) {
  static float gr[CACHE * DIM];
  for (size_t i = 0; i < CACHE * DIM; i++) gr[i] = g + (float)(i % 7) * 0.0625f;
  const float *gp[FX_NT] = {gr, gr, gr};
  ck_assert_msg(emb_store_push(s, step, 0.25f, &d->set, gp) == 0, "push: %s", emb_store_errmsg(s));
}

static void gathered0(emb_store *s, int64_t step, const rows0_t *d, float *out) {
  float none[1];
  float *o[FX_NT] = {out, none, none};
  ck_assert_msg(emb_store_lookup_begin(s, step, &d->set, o) == 0, "lookup: %s", emb_store_errmsg(s));
  ck_assert_msg(emb_store_lookup_wait(s) == 0, "lookup: %s", emb_store_errmsg(s));
}

/* A removal of rows of a cache full of dirty rows while one of them is
 * sent: the sent row moves to a fresh slot, whose eviction must not write
 * the other removed row back. Every removed row reads its init value after
 * the removal and after a flush and a reopen (b: the same calls without
 * the send, its rows the truth); the kept rows their pushed values. */
START_TEST(test_remove_while_sent_stays_removed) {
  static float pushed[4 * DIM], want4[4 * DIM], got4[4 * DIM];
  rows0_t all, first4, sent_row, gone;
  rows0_make(&all, 0, CACHE);
  rows0_make(&first4, 0, 4);
  rows0_make(&sent_row, 0, 1);
  rows0_make(&gone, 0, 2);
  push0(a, 0, &all, 0.5f), push0(b, 0, &all, 0.5f); /* every slot of a dirty */
  gathered0(b, 1, &first4, pushed);
  const float *p0[1];
  const float **rows[FX_NT] = {p0, p0, p0};
  emb_pins *p = NULL;
  ck_assert_int_eq(a->ops->lookup_pinned(a, 1, &sent_row.set, (const float **const *)rows, &p), 0);
  ck_assert(memcmp(p0[0], pushed, DIM * sizeof(float)) == 0);
  ck_assert_msg(emb_store_remove(a, 1, &gone.set) == 0, "remove: %s", emb_store_errmsg(a));
  ck_assert_msg(emb_store_remove(b, 1, &gone.set) == 0, "remove: %s", emb_store_errmsg(b));
  ck_assert(memcmp(p0[0], pushed, DIM * sizeof(float)) == 0); /* the sent bytes stay */
  a->ops->pins_release(p);
  gathered0(b, 2, &first4, want4);
  ck_assert(memcmp(want4, pushed, DIM * sizeof(float)) != 0); /* rows 0, 1: init again */
  ck_assert(memcmp(want4 + DIM, pushed + DIM, DIM * sizeof(float)) != 0);
  ck_assert(memcmp(want4 + 2 * DIM, pushed + 2 * DIM, 2 * DIM * sizeof(float)) == 0);
  gathered0(a, 2, &first4, got4);
  ck_assert(memcmp(got4, want4, sizeof got4) == 0);
  ck_assert_msg(emb_store_flush(a) == 0, "flush: %s", emb_store_errmsg(a));
  emb_store_destroy(a);
  a = fx_shard(plan, dir_a, CACHE, 0);
  gathered0(a, 3, &first4, got4);
  ck_assert(memcmp(got4, want4, sizeof got4) == 0);
}
END_TEST

/* Pins may take cache - chunk - 1 slots with the look-ahead's: past that
 * SR_ESTATE, nothing pinned, and the gather still works. */
START_TEST(test_too_many_refused) {
  ids_t d;
  ids_make(&d, 1, 200); /* 400 rows */
  ptrs_t pt;
  emb_pins *p = pinned(a, 0, &d, &pt);
  ids_t e;
  ids_make(&e, 9000, 100); /* 200 more: 600 > 511 */
  ptrs_t pe;
  for (int t = 0; t < FX_NT; t++) pe.rows[t] = pe.p[t];
  emb_pins *q = NULL;
  int rc = a->ops->lookup_pinned(a, 1, &e.set, (const float **const *)pe.rows, &q);
  ck_assert_int_eq(rc, SR_ESTATE);
  ck_assert_ptr_null(q);
  ck_assert_msg(strstr(emb_store_errmsg(a), "cannot be pinned"), "%s", emb_store_errmsg(a));
  ck_assert_uint_eq(send_held(a), 400);
  gathered(a, 1, &e, got);
  gathered(b, 1, &e, want);
  for (int t = 0; t < FX_NT; t++) ck_assert(memcmp(got[t], want[t], sizeof got[t]) == 0);
  a->ops->pins_release(p);
  ck_assert_uint_eq(send_held(a), 0);
  q = pinned(a, 2, &e, &pe); /* room again */
  a->ops->pins_release(q);
}
END_TEST

int main(void) {
  Suite *s = suite_create("emb_shard_pinned");
  TCase *tc = tcase_create("pinned");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_pinned_equals_gather);
  tcase_add_test(tc, test_push_copies_sent_rows);
  tcase_add_test(tc, test_restore_and_destroy_keep_sent_rows);
  tcase_add_test(tc, test_too_many_refused);
  tcase_add_test(tc, test_remove_while_sent_stays_removed);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
