/* Tests for the shard store's look-ahead (emb_store_prefetch on
 * embedding/shard.h): a trainer's sequence of steps at depth D (prefetch
 * t+1..t+D, lookup t, push t with gradients made from the rows looked up,
 * so any wrong bit propagates), checked bit for bit at every step against
 * the local store running the same sequence without prefetch. Real RocksDB
 * folders, the store's real threads. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "storage/kv.h"
#include "tests/embedding/shard_fixture.h"

#define NT 3
static const uint64_t ROWS[NT] = {20000, 600, 0}; /* bounded, small bounded, unbounded */
#define MAXB 400
#define DIM 8

static emb_plan *make_plan(emb_optim_kind k, int n_shards, int row_wise) {
  return fx_plan(ROWS, DIM, 7, k, n_shards, row_wise);
}

static char *tmpdir(void) { return tmpdir_make("prefetch"); }

static emb_store *make_shard(const emb_plan *p, const char *dir, uint64_t cache_rows, int threads) {
  return fx_shard(p, dir, cache_rows, threads);
}

/* One step's unique ids. */
typedef struct {
  uint64_t ids[NT][MAXB];
  size_t counts[NT];
  const uint64_t *idp[NT];
  emb_idset set;
} idstep;

/* The ids of step (a function of seed and step only): n per table (n / 4
 * for the small table), Zipf-like (u^3 of the range), so steps share rows. */
static void gen_step(idstep *d, uint64_t seed, int64_t step, size_t n) {
  sr_rng r;
  sr_rng_init(&r, seed, (uint64_t)step);
  for (int t = 0; t < NT; t++) {
    size_t want = t == 1 ? n / 4 : n, c = 0;
    uint64_t bound = ROWS[t] ? ROWS[t] : 20000;
    while (c < want) {
      double u = sr_rng_uniform(&r);
      uint64_t id = (uint64_t)((double)bound * u * u * u);
      if (id >= bound) id = bound - 1;
      if (!ROWS[t]) id = id * 0x9E3779B97F4A7C15ULL; /* 64-bit hashed ids */
      int dup = 0;
      for (size_t k = 0; k < c && !dup; k++) dup = d->ids[t][k] == id;
      if (!dup) d->ids[t][c++] = id;
    }
    d->counts[t] = c;
    d->idp[t] = d->ids[t];
  }
  d->set.n_tables = NT;
  d->set.ids = d->idp;
  d->set.counts = d->counts;
}

typedef struct {
  emb_optim_kind kind;
  int shards, row_wise, depth, threads;
  uint64_t cache;
  int steps;
  size_t batch;
  int test_pass_at, flush_at, ckpt_at, restore_at; /* -1: none */
} scenario;

/* What a run saw (the shard store's counters at the end and in the windows
 * between a step's prefetch and its lookup). */
typedef struct {
  emb_shard_counters end;
  uint64_t window_evictions, window_writebacks; /* while prefetched steps were waiting */
} outcome;

typedef struct {
  float out_l[NT][MAXB * DIM], out_s[NT][MAXB * DIM], grads[NT][MAXB * DIM];
  float *ol[NT], *os[NT];
  const float *gp[NT];
} bufs;

static emb_shard_counters counters(emb_store *s) {
  emb_shard_counters c;
  ck_assert_int_eq(emb_shard_counters_get(s, &c), 0);
  return c;
}

/* Lookup of step on both stores; every row compared bit for bit. */
static void lookup_both(emb_store *l, emb_store *sh, const emb_plan *p, int64_t step,
                        const idstep *d, bufs *b) {
  ck_assert_int_eq(emb_store_lookup_begin(l, step, &d->set, b->ol), 0);
  ck_assert_int_eq(emb_store_lookup_wait(l), 0);
  int rc = emb_store_lookup_begin(sh, step, &d->set, b->os);
  ck_assert_msg(rc == 0, "step %lld: %s", (long long)step, emb_store_errmsg(sh));
  ck_assert_int_eq(emb_store_lookup_wait(sh), 0);
  for (int t = 0; t < NT; t++)
    ck_assert_msg(!memcmp(b->out_l[t], b->out_s[t], d->counts[t] * (size_t)p->tables[t].dim * 4),
                  "step %lld table %d: rows differ from the local store", (long long)step, t);
}

/* Gradients from the rows looked up (a wrong row gives a wrong update). */
static void make_grads(const emb_plan *p, int64_t step, const idstep *d, bufs *b) {
  for (int t = 0; t < NT; t++)
    for (size_t k = 0; k < d->counts[t] * (size_t)p->tables[t].dim; k++)
      b->grads[t][k] = 0.5f * sinf(7.0f * b->out_l[t][k] + 0.1f * (float)step + (float)k);
}

static void push_both(emb_store *l, emb_store *sh, int64_t step, const idstep *d, bufs *b) {
  ck_assert_int_eq(emb_store_push(l, step, 0.05f, &d->set, b->gp), 0);
  int rc = emb_store_push(sh, step, 0.05f, &d->set, b->gp);
  ck_assert_msg(rc == 0, "step %lld: %s", (long long)step, emb_store_errmsg(sh));
}

static void checkpoint_both(emb_store *l, emb_store *sh, const char *dir, int restore) {
  char pl[512], ps[512];
  snprintf(pl, sizeof pl, "%s/ck-local", dir);
  snprintf(ps, sizeof ps, "%s/ck-shard", dir);
  if (restore) {
    ck_assert_int_eq(emb_store_restore(l, pl), 0);
    ck_assert_msg(emb_store_restore(sh, ps) == 0, "%s", emb_store_errmsg(sh));
  } else {
    ck_assert_int_eq(emb_store_checkpoint(l, pl), 0);
    ck_assert_msg(emb_store_checkpoint(sh, ps) == 0, "%s", emb_store_errmsg(sh));
  }
}

/* Prefetch steps t+1..t+depth not handed over yet (*hi: the highest so far). */
static void prefetch_ahead(emb_store *sh, const scenario *sc, int64_t t, int64_t last,
                           int64_t *hi, idstep *tmp) {
  for (int d = 1; d <= sc->depth; d++) {
    int64_t u = t + d;
    if (u <= *hi || u > last) continue;
    gen_step(tmp, 11, u, sc->batch);
    ck_assert_int_eq(emb_store_prefetch(sh, u, &tmp->set), 0);
    *hi = u;
  }
}

static void run(const scenario *sc, outcome *o) {
  emb_plan *p = make_plan(sc->kind, sc->shards, sc->row_wise);
  char *dir = tmpdir(), err[512];
  emb_store *l = emb_store_create_local(p, err, sizeof err);
  ck_assert_msg(l != NULL, "%s", err);
  emb_store *sh = make_shard(p, dir, sc->cache, sc->threads);
  static bufs b;
  static idstep cur, tmp;
  for (int t = 0; t < NT; t++) {
    b.ol[t] = b.out_l[t];
    b.os[t] = b.out_s[t];
    b.gp[t] = b.grads[t];
  }
  memset(o, 0, sizeof *o);
  int64_t hi = -1;
  for (int64_t t = 0; t < sc->steps; t++) {
    prefetch_ahead(sh, sc, t, sc->steps - 1, &hi, &tmp);
    if (t == sc->test_pass_at) { /* another step's ids, looked up, never pushed */
      gen_step(&tmp, 12, t, sc->batch);
      lookup_both(l, sh, p, t, &tmp, &b);
    }
    emb_shard_counters c0 = counters(sh);
    gen_step(&cur, 11, t, sc->batch);
    lookup_both(l, sh, p, t, &cur, &b);
    make_grads(p, t, &cur, &b);
    push_both(l, sh, t, &cur, &b);
    emb_shard_counters c1 = counters(sh);
    if (hi > t) {
      o->window_evictions += c1.evictions - c0.evictions;
      o->window_writebacks += c1.writebacks - c0.writebacks;
    }
    if (t == sc->flush_at) ck_assert_msg(emb_store_flush(sh) == 0, "%s", emb_store_errmsg(sh));
    if (t == sc->ckpt_at) checkpoint_both(l, sh, dir, 0);
    if (t == sc->restore_at) {
      checkpoint_both(l, sh, dir, 1);
      ck_assert_uint_eq(counters(sh).pinned, 0); /* a restore drops every prefetch */
      hi = t;                                    /* prefetch again from t + 1 */
    }
  }
  o->end = counters(sh);
  ck_assert_uint_eq(o->end.pinned, 0); /* the last push released everything */
  /* What reached RocksDB is the local store's too: a fresh store over it. */
  ck_assert_int_eq(emb_store_flush(sh), 0);
  emb_store_destroy(sh);
  sh = make_shard(p, dir, sc->cache, sc->threads);
  gen_step(&cur, 11, sc->steps / 2, sc->batch);
  lookup_both(l, sh, p, sc->steps, &cur, &b);
  emb_store_destroy(sh);
  emb_store_destroy(l);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}

/* A cache of 1024 rows (pin limit 511) under steps of 675 rows: smaller
 * than two steps, so prefetches stop at the limit and rows are evicted and
 * written back while prefetched steps wait for their lookup. */
#define SMALL EMB_SHARD_MIN_CACHE_ROWS
#define BATCH 300

static void run_matrix(emb_optim_kind kind) {
  const int shards[2] = {1, 3};
  for (int si = 0; si < 2; si++)
    for (int depth = 1; depth <= 2; depth++) {
      scenario sc = {kind, shards[si], si, depth, 0, SMALL, 24, BATCH, -1, -1, -1, -1};
      outcome o;
      run(&sc, &o);
      ck_assert_uint_gt(o.end.prefetched, 0);
      ck_assert_uint_gt(o.end.prefetch_cached, 0);
      ck_assert_uint_gt(o.end.prefetch_stops, 0);
      ck_assert_uint_gt(o.window_evictions, 0);
      ck_assert_uint_gt(o.window_writebacks, 0);
      ck_assert_uint_gt(o.end.wb_batches, 0);
      sc.cache = 8192; /* room for the look-ahead: nothing stops, hardly anything waits */
      run(&sc, &o);
      ck_assert_uint_gt(o.end.prefetched, 0);
      ck_assert_uint_eq(o.end.prefetch_stops, 0);
    }
}

START_TEST(test_exact_sgd) { run_matrix(EMB_OPT_SGD); }
END_TEST

START_TEST(test_exact_adagrad) { run_matrix(EMB_OPT_ADAGRAD); }
END_TEST

START_TEST(test_exact_rowwise_adagrad) { run_matrix(EMB_OPT_ROWWISE_ADAGRAD); }
END_TEST

/* A test pass (a lookup of other ids at the current step, never pushed), a
 * flush, a checkpoint and a restore in the middle of the sequence. */
START_TEST(test_exact_through_pass_flush_restore) {
  for (int depth = 1; depth <= 2; depth++)
    for (int small = 0; small < 2; small++) {
      scenario sc = {EMB_OPT_ADAGRAD, 3, 1, depth, 0, small ? SMALL : 8192, 24, BATCH,
                     5, 7, 9, 14};
      outcome o;
      run(&sc, &o);
      ck_assert_uint_gt(o.end.prefetched, 0);
    }
}
END_TEST

/* With no store thread the caller does every read and write itself: the
 * same bits. */
START_TEST(test_exact_without_threads) {
  scenario sc = {EMB_OPT_ROWWISE_ADAGRAD, 3, 1, 2, -1, SMALL, 16, BATCH, 3, -1, -1, -1};
  outcome o;
  run(&sc, &o);
  ck_assert_uint_gt(o.end.prefetched, 0);
  ck_assert_uint_gt(o.end.wb_batches, 0);
}
END_TEST

/* Async mode's order, as a shard server sees one rank of it: the lookup of
 * step t+1 (and the prefetch of the steps after it) comes before the push
 * of step t. Each lookup compared with the local store's in the same
 * order; the pushes' gradients come from the rows of their own step. */
static void run_async_order(int depth, uint64_t cache) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 3, 1);
  char *dir = tmpdir(), err[512];
  emb_store *l = emb_store_create_local(p, err, sizeof err);
  ck_assert_msg(l != NULL, "%s", err);
  emb_store *sh = make_shard(p, dir, cache, 0);
  static bufs b[2];
  static idstep st[2], tmp;
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < NT; t++) {
      b[k].ol[t] = b[k].out_l[t];
      b[k].os[t] = b[k].out_s[t];
      b[k].gp[t] = b[k].grads[t];
    }
  const int steps = 24;
  scenario sc = {EMB_OPT_ADAGRAD, 3, 1, depth, 0, cache, steps, BATCH, -1, -1, -1, -1};
  int64_t hi = 0;
  gen_step(&st[0], 11, 0, BATCH);
  lookup_both(l, sh, p, 0, &st[0], &b[0]);
  for (int64_t t = 0; t < steps; t++) {
    int k = (int)(t & 1), n = k ^ 1;
    prefetch_ahead(sh, &sc, t, steps - 1, &hi, &tmp);
    if (t + 1 < steps) {
      gen_step(&st[n], 11, t + 1, BATCH);
      lookup_both(l, sh, p, t + 1, &st[n], &b[n]);
    }
    make_grads(p, t, &st[k], &b[k]);
    push_both(l, sh, t, &st[k], &b[k]);
  }
  ck_assert_uint_eq(counters(sh).pinned, 0);
  ck_assert_uint_gt(counters(sh).prefetched, 0);
  emb_store_destroy(sh);
  emb_store_destroy(l);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}

START_TEST(test_exact_async_order) {
  for (int depth = 1; depth <= 2; depth++) {
    run_async_order(depth, SMALL);
    run_async_order(depth, 8192);
  }
}
END_TEST

/* Steps prefetched and never looked up leak nothing: the lookup of a later
 * step releases their pins, and the whole cache is usable after. */
START_TEST(test_unused_prefetch_released) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0);
  char *dir = tmpdir(), err[512];
  emb_store *l = emb_store_create_local(p, err, sizeof err);
  emb_store *sh = make_shard(p, dir, SMALL, 0);
  static bufs b;
  static idstep d;
  for (int t = 0; t < NT; t++) {
    b.ol[t] = b.out_l[t];
    b.os[t] = b.out_s[t];
    b.gp[t] = b.grads[t];
  }
  for (int64_t u = 1; u <= 3; u++) {
    gen_step(&d, 5, u, BATCH);
    ck_assert_int_eq(emb_store_prefetch(sh, u, &d.set), 0);
  }
  emb_shard_counters c = counters(sh);
  ck_assert_uint_gt(c.pinned, 0);
  ck_assert_uint_le(c.pinned, SMALL - SMALL / 2 - 1);
  /* Step 10: pins of 1..3 go at its lookup. Then rows enough to fill the
   * cache several times over, every one of them evictable. */
  for (int64_t t = 10; t < 20; t++) {
    gen_step(&d, 6, t, MAXB);
    lookup_both(l, sh, p, t, &d, &b);
    ck_assert_uint_eq(counters(sh).pinned, 0);
    make_grads(p, t, &d, &b);
    push_both(l, sh, t, &d, &b);
  }
  c = counters(sh);
  ck_assert_uint_eq(c.cache_used, SMALL);
  ck_assert_uint_gt(c.evictions, SMALL);
  emb_store_destroy(sh);
  emb_store_destroy(l);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* A prefetched row that cannot be read (another layout version in
 * RocksDB): the prefetch succeeds, the step's lookup fails naming the
 * folder, the table and the row, and the rest of the store still works. */
START_TEST(test_prefetch_read_failure_reported) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0);
  char *dir = tmpdir();
  emb_store *sh = make_shard(p, dir, 2048, 0);
  emb_store_destroy(sh);
  fx_put_future_row(dir, 42);
  sh = make_shard(p, dir, 2048, 0);
  static idstep d;
  static float out[NT][MAXB * DIM];
  float *op[NT] = {out[0], out[1], out[2]};
  memset(&d, 0, sizeof d);
  d.ids[0][0] = 41;
  d.ids[0][1] = 42;
  d.counts[0] = 2;
  for (int t = 0; t < NT; t++) d.idp[t] = d.ids[t];
  d.set.n_tables = NT;
  d.set.ids = d.idp;
  d.set.counts = d.counts;
  ck_assert_int_eq(emb_store_prefetch(sh, 1, &d.set), 0);
  ck_assert_int_eq(emb_store_lookup_begin(sh, 1, &d.set, op), SR_EVERSION);
  const char *m = emb_store_errmsg(sh);
  ck_assert_msg(strstr(m, "shard-0") && strstr(m, "row 42") && strstr(m, "version 9"), "%s", m);
  d.ids[0][1] = 43; /* without the bad row: fine */
  ck_assert_int_eq(emb_store_lookup_begin(sh, 2, &d.set, op), 0);
  ck_assert_uint_eq(counters(sh).pinned, 0);
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

/* The look-ahead refuses what the lookup would refuse, and pins nothing. */
START_TEST(test_prefetch_refuses_bad_ids) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0);
  char *dir = tmpdir();
  emb_store *sh = make_shard(p, dir, 2048, 0);
  static idstep d;
  gen_step(&d, 1, 1, 10);
  d.ids[1][0] = ROWS[1]; /* one past the small table's end */
  ck_assert_int_eq(emb_store_prefetch(sh, 1, &d.set), SR_ERANGE);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(sh), "prefetch: table 1"));
  d.set.n_tables = 2;
  ck_assert_int_eq(emb_store_prefetch(sh, 1, &d.set), SR_EINVAL);
  emb_shard_counters c = counters(sh);
  ck_assert_uint_eq(c.pinned, 0);
  ck_assert_uint_eq(c.prefetched, 0);
  emb_store_destroy(sh);
  sr_rmtree(dir);
  free(dir);
  emb_plan_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("embedding_shard_prefetch");
  TCase *tc = tcase_create("prefetch");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_exact_sgd);
  tcase_add_test(tc, test_exact_adagrad);
  tcase_add_test(tc, test_exact_rowwise_adagrad);
  tcase_add_test(tc, test_exact_through_pass_flush_restore);
  tcase_add_test(tc, test_exact_without_threads);
  tcase_add_test(tc, test_exact_async_order);
  tcase_add_test(tc, test_unused_prefetch_released);
  tcase_add_test(tc, test_prefetch_read_failure_reported);
  tcase_add_test(tc, test_prefetch_refuses_bad_ids);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
