/* Tests for the in-process embedding store (embedding/store.h). */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/store.h"
#include "embedding/store_local_impl.h"
#include "tests/embedding/nonfinite.h"
#include "tests/common/fail_alloc.h"
#include "tests/embedding/shard_fixture.h"
#include "tests/support/files.h"

/* Three tables: bounded dim 4, bounded dim 8, unbounded dim 5. */
static emb_plan *make_plan(emb_optim_kind k, int n_shards, int row_wise, uint64_t seed) {
  static const uint64_t rows[FX_NT] = {1000, 50, 0};
  emb_plan *p = fx_plan(rows, 4, seed, k, n_shards, row_wise);
  p->tables[1].dim = 8;
  p->tables[2].dim = 5;
  return p;
}

static emb_store *make_store(const emb_plan *p) {
  char err[256];
  emb_store *s = emb_store_create_local(p, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

/* One step's ids and gradients for 3 tables. */
typedef struct {
  uint64_t ids[3][64];
  size_t counts[3];
  const uint64_t *idp[3];
  float grads[3][64 * 8];
  const float *gp[3];
  float out[3][64 * 8];
  float *op[3];
  emb_idset set;
} step_data;

/* d's pointers and id set, into its own arrays. */
static void step_link(step_data *d) {
  for (int t = 0; t < 3; t++) d->idp[t] = d->ids[t], d->gp[t] = d->grads[t], d->op[t] = d->out[t];
  d->set = (emb_idset){3, d->idp, d->counts};
}

static void make_step(step_data *d, sr_rng *r) {
  static const uint64_t bound[3] = {1000, 50, 0};
  static const int dims[3] = {4, 8, 5};
  for (int t = 0; t < 3; t++) {
    d->counts[t] = 1 + sr_rng_below(r, t == 1 ? 40 : 64); /* table 1 has 50 rows */
    size_t m = 0;
    while (m < d->counts[t]) { /* unique ids */
      uint64_t id = bound[t] ? sr_rng_below(r, bound[t]) : sr_rng_u64(r);
      int dup = 0;
      for (size_t k = 0; k < m; k++) dup |= d->ids[t][k] == id;
      if (!dup) d->ids[t][m++] = id;
    }
    for (size_t k = 0; k < d->counts[t] * (size_t)dims[t]; k++) d->grads[t][k] = (float)sr_rng_normal(r);
  }
  step_link(d);
}

/* Non-finite outcomes and learning rates out of range: refused whole. */
START_TEST(test_push_nonfinite_refused) {
  const emb_optim_kind kinds[] = {EMB_OPT_SGD, EMB_OPT_ADAGRAD, EMB_OPT_ROWWISE_ADAGRAD};
  for (int i = 0; i < 3; i++) {
    emb_plan *p = make_plan(kinds[i], 1, 0, 7);
    emb_store *s = make_store(p), *twin = make_store(p);
    nonfinite_check(s, twin, p);
    emb_store_destroy(s);
    emb_store_destroy(twin);
    emb_plan_free(p);
  }
}
END_TEST

START_TEST(test_untouched_is_init) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 2, 0, 42);
  emb_store *s = make_store(p);
  sr_rng r;
  sr_rng_init(&r, 1, 0);
  step_data d;
  make_step(&d, &r);
  ck_assert_int_eq(emb_store_lookup_begin(s, 0, &d.set, d.op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  for (int t = 0; t < 3; t++)
    for (size_t k = 0; k < d.counts[t]; k++) {
      float want[8];
      emb_row_init(p, t, d.ids[t][k], want);
      ck_assert_mem_eq(d.out[t] + k * p->tables[t].dim, want, (size_t)p->tables[t].dim * 4);
    }
  emb_store_stats st;
  ck_assert_int_eq(emb_store_stats_get(s, &st), 0);
  ck_assert_uint_eq(st.rows, 0); /* nothing stored for a read */
  ck_assert_uint_eq(st.lookups, d.counts[0] + d.counts[1] + d.counts[2]);
  ck_assert_uint_eq(st.hits, 0);
  emb_store_destroy(s);
  emb_store_destroy(NULL);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_push_then_lookup) {
  for (int k = 0; k < 3; k++) {
    emb_plan *p = make_plan((emb_optim_kind)k, 1, 0, 7);
    emb_store *s = make_store(p);
    sr_rng r;
    sr_rng_init(&r, 2, (uint64_t)k);
    step_data d;
    make_step(&d, &r);
    /* Expected: init, then the optimizer applied twice with lr 0.1 and 0.05. */
    float want[3][64 * 8], state[3][64 * 8];
    for (int t = 0; t < 3; t++) {
      int dim = p->tables[t].dim, sl = emb_optim_state_len(&p->tables[t].optim, dim);
      for (size_t i = 0; i < d.counts[t]; i++) {
        emb_row_init(p, t, d.ids[t][i], want[t] + i * dim);
        emb_optim_state_init(&p->tables[t].optim, dim, state[t] + i * dim);
        for (int rep = 0; rep < 2; rep++)
          emb_optim_apply(&p->tables[t].optim, dim, rep ? 0.05f : 0.1f, d.grads[t] + i * dim,
                          want[t] + i * dim, sl ? state[t] + i * dim : NULL);
      }
    }
    ck_assert_int_eq(emb_store_push(s, 0, 0.1f, &d.set, d.gp), 0);
    ck_assert_int_eq(emb_store_push(s, 1, 0.05f, &d.set, d.gp), 0);
    ck_assert_int_eq(emb_store_lookup_begin(s, 2, &d.set, d.op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    for (int t = 0; t < 3; t++) {
      ck_assert_mem_eq(d.out[t], want[t], d.counts[t] * (size_t)p->tables[t].dim * 4);
      /* And the update moved the row away from init. */
      float init[8];
      emb_row_init(p, t, d.ids[t][0], init);
      ck_assert(memcmp(init, d.out[t], (size_t)p->tables[t].dim * 4) != 0);
    }
    emb_store_stats st;
    emb_store_stats_get(s, &st);
    uint64_t n = d.counts[0] + d.counts[1] + d.counts[2];
    ck_assert_uint_eq(st.rows, n);
    ck_assert_uint_eq(st.pushes, 2 * n);
    ck_assert_uint_eq(st.hits, n);
    uint64_t bytes = 0;
    for (int t = 0; t < 3; t++)
      bytes += d.counts[t] * 4 * (uint64_t)(p->tables[t].dim + emb_optim_state_len(&p->tables[t].optim, p->tables[t].dim));
    ck_assert_uint_eq(st.bytes, bytes);
    emb_store_destroy(s);
    emb_plan_free(p);
  }
}
END_TEST

/* store.h's lookup contract for an in-process store: lookup_wait with none
 * outstanding answers the last status (0 before any); lookup_begin again
 * before lookup_wait drops the first one's status, and the second one's
 * rows and status are what lookup_wait gives. */
START_TEST(test_lookup_begin_twice) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0, 7);
  emb_store *s = make_store(p);
  ck_assert_int_eq(emb_store_kind_of(s), EMB_STORE_LOCAL);
  ck_assert_int_eq(emb_store_checkpoint_layout(s), EMB_CKPT_TABLE_FILES);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  sr_rng r;
  sr_rng_init(&r, 4, 0);
  static step_data good, bad;
  make_step(&good, &r);
  make_step(&bad, &r);
  ck_assert_int_eq(emb_store_push(s, 0, 0.1f, &good.set, good.gp), 0);
  bad.ids[1][0] = 50; /* table 1 has 50 rows */
  /* Bad, then good: the good one's rows and status. */
  ck_assert_int_eq(emb_store_lookup_begin(s, 1, &bad.set, bad.op), SR_ERANGE);
  memset(good.out, 0, sizeof good.out);
  ck_assert_int_eq(emb_store_lookup_begin(s, 1, &good.set, good.op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
  float want[8];
  for (int t = 0; t < 3; t++) {
    int dim = p->tables[t].dim;
    float init[8];
    emb_row_init(p, t, good.ids[t][0], init);
    ck_assert(memcmp(init, good.out[t], (size_t)dim * 4) != 0); /* pushed: not init */
  }
  memcpy(want, good.out[0], sizeof(float) * 4);
  /* Good, then bad: the good one's rows are in already; the status is the bad one's. */
  memset(good.out, 0, sizeof good.out);
  ck_assert_int_eq(emb_store_lookup_begin(s, 2, &good.set, good.op), 0);
  ck_assert_int_eq(emb_store_lookup_begin(s, 2, &bad.set, bad.op), SR_ERANGE);
  ck_assert_int_eq(emb_store_lookup_wait(s), SR_ERANGE);
  ck_assert_int_eq(emb_store_lookup_wait(s), SR_ERANGE); /* none outstanding: the last status */
  ck_assert_mem_eq(good.out[0], want, sizeof(float) * 4);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

START_TEST(test_out_of_range) {
  emb_plan *p = make_plan(EMB_OPT_SGD, 1, 0, 7);
  emb_store *s = make_store(p);
  sr_rng r;
  sr_rng_init(&r, 3, 0);
  step_data d;
  make_step(&d, &r);
  d.ids[1][d.counts[1] - 1] = 50; /* table 1 has 50 rows */
  ck_assert_int_eq(emb_store_push(s, 0, 0.1f, &d.set, d.gp), SR_ERANGE);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s), "push: table 1 (t1): row id 50 is out of range 0..49"));
  emb_store_stats st;
  emb_store_stats_get(s, &st);
  ck_assert_uint_eq(st.rows, 0); /* nothing applied */
  ck_assert_int_eq(emb_store_lookup_begin(s, 0, &d.set, d.op), SR_ERANGE);
  ck_assert_int_eq(emb_store_lookup_wait(s), SR_ERANGE);
  d.set.n_tables = 2;
  ck_assert_int_eq(emb_store_push(s, 0, 0.1f, &d.set, d.gp), SR_EINVAL);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

typedef struct {
  float *buf;
  size_t len, cap;
  uint64_t prev;
  int count, stop_after;
} collect;

static int collect_fn(void *ctx, int table, uint64_t row_id, const float *value, int dim,
                      const float *state, int state_len) {
  (void)table;
  collect *c = ctx;
  if (c->count > 0) ck_assert_uint_gt(row_id, c->prev);
  c->prev = row_id;
  c->count++;
  size_t need = c->len + 2 + (size_t)dim + (size_t)state_len;
  if (need > c->cap) {
    c->cap = need * 2;
    c->buf = realloc(c->buf, c->cap * 4);
  }
  memcpy(c->buf + c->len, &row_id, 8);
  c->len += 2;
  memcpy(c->buf + c->len, value, (size_t)dim * 4);
  c->len += (size_t)dim;
  if (state_len) memcpy(c->buf + c->len, state, (size_t)state_len * 4);
  c->len += (size_t)state_len;
  return c->stop_after && c->count >= c->stop_after;
}

static collect dump(emb_store *s, int table) {
  collect c = {0};
  ck_assert_int_eq(emb_store_iterate(s, table, collect_fn, &c), 0);
  return c;
}

/* Train 30 random steps; returns the store. */
static emb_store *train(const emb_plan *p, uint64_t seed, int steps) {
  emb_store *s = make_store(p);
  sr_rng r;
  sr_rng_init(&r, seed, 0);
  step_data *d = malloc(sizeof *d);
  for (int i = 0; i < steps; i++) {
    make_step(d, &r);
    ck_assert_int_eq(emb_store_lookup_begin(s, i, &d->set, d->op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    ck_assert_int_eq(emb_store_push(s, i, 0.05f, &d->set, d->gp), 0);
  }
  free(d);
  return s;
}

START_TEST(test_placement_independent) {
  for (int k = 0; k < 3; k++) {
    emb_plan *p1 = make_plan((emb_optim_kind)k, 1, 0, 9);
    emb_plan *p3 = make_plan((emb_optim_kind)k, 3, 0, 9);
    emb_plan *p4 = make_plan((emb_optim_kind)k, 4, 1, 9);
    emb_store *s1 = train(p1, 11, 30), *s3 = train(p3, 11, 30), *s4 = train(p4, 11, 30);
    for (int t = 0; t < 3; t++) {
      collect a = dump(s1, t), b = dump(s3, t), c = dump(s4, t);
      ck_assert_uint_gt(a.count, 10);
      ck_assert_uint_eq(a.len, b.len);
      ck_assert_uint_eq(a.len, c.len);
      ck_assert_mem_eq(a.buf, b.buf, a.len * 4);
      ck_assert_mem_eq(a.buf, c.buf, a.len * 4);
      free(a.buf);
      free(b.buf);
      free(c.buf);
    }
    emb_store_destroy(s1);
    emb_store_destroy(s3);
    emb_store_destroy(s4);
    emb_plan_free(p1);
    emb_plan_free(p3);
    emb_plan_free(p4);
  }
}
END_TEST

START_TEST(test_iterate_order) {
  emb_plan *p = make_plan(EMB_OPT_ROWWISE_ADAGRAD, 1, 0, 9);
  emb_store *s = train(p, 12, 20);
  for (int t = 0; t < 3; t++) {
    collect c = dump(s, t); /* collect_fn asserts ascending ids */
    ck_assert_int_gt(c.count, 10);
    free(c.buf);
  }
  collect c = {0};
  c.stop_after = 3;
  ck_assert_int_eq(emb_store_iterate(s, 0, collect_fn, &c), 0);
  ck_assert_int_eq(c.count, 3);
  free(c.buf);
  ck_assert_int_eq(emb_store_iterate(s, 3, collect_fn, &c), SR_EINVAL);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

static void rmdir_all(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static int same_tables(emb_store *a, emb_store *b) {
  int same = 1;
  for (int t = 0; t < 3; t++) {
    collect x = dump(a, t), y = dump(b, t);
    same &= x.len == y.len && (x.len == 0 || memcmp(x.buf, y.buf, x.len * 4) == 0);
    free(x.buf);
    free(y.buf);
  }
  return same;
}

START_TEST(test_checkpoint_restore) {
  for (int k = 0; k < 3; k++) {
    emb_plan *p = make_plan((emb_optim_kind)k, 2, 0, 5);
    emb_store *s = train(p, 13, 25);
    char *tmp = tmpdir_make("store"), dir[256];
    snprintf(dir, sizeof dir, "%s/ck", tmp); /* made by the checkpoint */
    ck_assert_msg(emb_store_checkpoint(s, dir) == 0, "%s", emb_store_errmsg(s));
    /* Restore into a fresh store under another placement (same model). */
    emb_plan *q = make_plan((emb_optim_kind)k, 4, 1, 5);
    emb_store *s2 = make_store(q);
    ck_assert_msg(emb_store_restore(s2, dir) == 0, "%s", emb_store_errmsg(s2));
    ck_assert(same_tables(s, s2));
    emb_store_stats a, b;
    emb_store_stats_get(s, &a);
    emb_store_stats_get(s2, &b);
    ck_assert_uint_eq(a.rows, b.rows);
    ck_assert_uint_eq(a.bytes, b.bytes);
    /* Training on from both gives the same rows. */
    sr_rng r;
    sr_rng_init(&r, 99, 0);
    step_data d;
    make_step(&d, &r);
    ck_assert_int_eq(emb_store_push(s, 30, 0.1f, &d.set, d.gp), 0);
    ck_assert_int_eq(emb_store_push(s2, 30, 0.1f, &d.set, d.gp), 0);
    ck_assert(same_tables(s, s2));
    /* Another model (seed) is refused. */
    emb_plan *other = make_plan((emb_optim_kind)k, 2, 0, 6);
    emb_store *s3 = make_store(other);
    ck_assert_int_eq(emb_store_restore(s3, dir), SR_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s3), "model fingerprint"));
    emb_store_destroy(s3);
    emb_plan_free(other);
    emb_store_destroy(s);
    emb_store_destroy(s2);
    emb_plan_free(q);
    emb_plan_free(p);
    rmdir_all(tmp);
    free(tmp);
  }
}
END_TEST

/* A checkpoint of a smaller plan restores into a store of a plan that grows
 * it (emb_store_restore_grown): every stored row as it was, a row past the
 * old tables a never-written row of the grown plan (the old init range). */
START_TEST(test_restore_grown) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 2, 0, 5);
  emb_store *s = train(p, 14, 20);
  char *tmp = tmpdir_make("store"), dir[256], err[256], why[256];
  snprintf(dir, sizeof dir, "%s/ck", tmp);
  ck_assert_msg(emb_store_checkpoint(s, dir) == 0, "%s", emb_store_errmsg(s));
  const uint64_t more[FX_NT] = {1500, 80, 0};
  emb_plan *g = NULL;
  ck_assert_msg(emb_plan_grow(p, more, &g, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_grows(p, g, why, sizeof why), "%s", why);
  char pm[EMB_FP_HEX], gm[EMB_FP_HEX];
  emb_plan_model_fingerprint(p, pm);
  emb_plan_model_fingerprint(g, gm);
  ck_assert_str_ne(pm, gm);
  emb_store *s2 = make_store(g);
  /* Taken as its own model's: refused, the file's fingerprint is not this plan's. */
  ck_assert_int_eq(emb_store_restore(s2, dir), SR_EMISMATCH);
  ck_assert_msg(emb_store_restore_grown(s2, dir, pm) == 0, "%s", emb_store_errmsg(s2));
  ck_assert(same_tables(s, s2));
  /* Rows past the old bound: the grown plan's never-written rows. */
  uint64_t ids0[2] = {1000, 1499}, ids1[1] = {79}, ids2[1] = {7};
  const uint64_t *idp[3] = {ids0, ids1, ids2};
  size_t counts[3] = {2, 1, 1};
  float o0[2 * 4], o1[8], o2[5], *op[3] = {o0, o1, o2};
  emb_idset set = {.n_tables = 3, .ids = idp, .counts = counts};
  ck_assert_int_eq(emb_store_lookup_begin(s2, 21, &set, op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s2), 0);
  float want[8];
  emb_row_init(g, 0, 1499, want);
  ck_assert_mem_eq(o0 + 4, want, 4 * sizeof(float));
  ck_assert(g->tables[0].init_range == p->tables[0].init_range);
  emb_row_init(g, 1, 79, want);
  ck_assert_mem_eq(o1, want, 8 * sizeof(float));
  /* A model other than the one the files record is still refused. */
  emb_plan *other = make_plan(EMB_OPT_ADAGRAD, 2, 0, 6);
  char om[EMB_FP_HEX];
  emb_plan_model_fingerprint(other, om);
  emb_store *s3 = make_store(g);
  ck_assert_int_eq(emb_store_restore_grown(s3, dir, om), SR_EMISMATCH);
  emb_store_destroy(s3);
  emb_plan_free(other);
  emb_store_destroy(s);
  emb_store_destroy(s2);
  emb_plan_free(g);
  emb_plan_free(p);
  rmdir_all(tmp);
  free(tmp);
}
END_TEST

START_TEST(test_restore_refuses_damage) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0, 5);
  emb_store *s = train(p, 14, 10);
  char *tmp = tmpdir_make("store"), dir[256], file[300], good[300];
  snprintf(dir, sizeof dir, "%s/dmg", tmp); /* made by the checkpoint */
  ck_assert_int_eq(emb_store_checkpoint(s, dir), 0);
  snprintf(file, sizeof file, "%s/table-1.bin", dir);
  snprintf(good, sizeof good, "%s/good.bak", dir);
  struct stat st;
  ck_assert_int_eq(stat(file, &st), 0);
  char cmd[800];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", file, good);
  ck_assert_int_eq(system(cmd), 0);
  /* A store with other contents, which a refused restore must keep. */
  emb_store *s2 = train(p, 15, 5);
  emb_store *s2ref = train(p, 15, 5);
  /* Torn: truncated by 10 bytes. */
  ck_assert_int_eq(truncate(file, st.st_size - 10), 0);
  ck_assert_int_eq(emb_store_restore(s2, dir), SR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s2), "torn or truncated"));
  ck_assert(same_tables(s2, s2ref));
  /* Truncated inside the header. */
  ck_assert_int_eq(truncate(file, 100), 0);
  ck_assert_int_eq(emb_store_restore(s2, dir), SR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s2), "too short"));
  /* A flipped byte in a row value: checksum. */
  for (long pos = 300; pos < st.st_size; pos += st.st_size / 3) {
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", good, file);
    ck_assert_int_eq(system(cmd), 0);
    FILE *f = fopen(file, "r+b");
    fseek(f, pos, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
    ck_assert_int_eq(emb_store_restore(s2, dir), SR_ECHECKSUM);
    ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s2), "checksum mismatch"));
    ck_assert(same_tables(s2, s2ref));
  }
  /* Foreign file. */
  {
    FILE *f = fopen(file, "wb");
    for (int i = 0; i < 400; i++) fputc('x', f);
    fclose(f);
    ck_assert_int_eq(emb_store_restore(s2, dir), SR_EFORMAT);
    ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s2), "not a shardrec embedding table file"));
  }
  /* Missing file. */
  unlink(file);
  ck_assert_int_eq(emb_store_restore(s2, dir), SR_ENOTFOUND);
  ck_assert(same_tables(s2, s2ref));
  /* The good file restores. */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", good, file);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(emb_store_restore(s2, dir), 0);
  ck_assert(same_tables(s, s2));
  emb_store_destroy(s);
  emb_store_destroy(s2);
  emb_store_destroy(s2ref);
  emb_plan_free(p);
  rmdir_all(tmp);
  free(tmp);
}
END_TEST

/* steps more pushes on s (rng seed), the distinct ids pushed per table
 * counted into n[3]. */
static void push_more(emb_store *s, uint64_t seed, int steps, size_t n[3]) {
  sr_rng r;
  sr_rng_init(&r, seed, 0);
  step_data *d = malloc(sizeof *d);
  uint64_t *seen[3];
  for (int t = 0; t < 3; t++) {
    seen[t] = malloc((size_t)steps * 64 * sizeof **seen);
    n[t] = 0;
  }
  for (int i = 0; i < steps; i++) {
    make_step(d, &r);
    ck_assert_int_eq(emb_store_push(s, 100 + i, 0.05f, &d->set, d->gp), 0);
    for (int t = 0; t < 3; t++)
      for (size_t k = 0; k < d->counts[t]; k++) {
        int dup = 0;
        for (size_t m = 0; m < n[t]; m++) dup |= seen[t][m] == d->ids[t][k];
        if (!dup) seen[t][n[t]++] = d->ids[t][k];
      }
  }
  for (int t = 0; t < 3; t++) free(seen[t]);
  free(d);
}

static uint64_t rows_held(emb_store *s, int t) {
  collect c = dump(s, t);
  free(c.buf);
  return (uint64_t)c.count;
}

/* The change set: checkpoint_delta writes every row of a store never saved,
 * then exactly the rows pushed since the last checkpoint (new and old
 * rows), in ascending ids, and clears it;
 * restore_delta over the full checkpoint gives the store's rows; a restore
 * clears it too; a damaged delta is refused with every row kept. */
START_TEST(test_checkpoint_delta) {
  for (int k = 0; k < 3; k++) {
    emb_plan *p = make_plan((emb_optim_kind)k, 2, 0, 5);
    emb_store *s = train(p, 13, 20);
    char *tmp = tmpdir_make("store"), full[256], d1[256], d2[256], d3[256], file[300];
    snprintf(full, sizeof full, "%s/full", tmp);
    snprintf(d1, sizeof d1, "%s/d1", tmp);
    snprintf(d2, sizeof d2, "%s/d2", tmp);
    snprintf(d3, sizeof d3, "%s/d3", tmp);
    /* Never saved: every row held has changed. */
    char d0[256];
    snprintf(d0, sizeof d0, "%s/d0", tmp);
    ck_assert_msg(emb_store_checkpoint_delta(s, d0) == 0, "%s", emb_store_errmsg(s));
    emb_store *all = make_store(p);
    ck_assert_msg(emb_store_restore_delta(all, d0) == 0, "%s", emb_store_errmsg(all));
    ck_assert(same_tables(s, all));
    emb_store_destroy(all);
    ck_assert_msg(emb_store_checkpoint(s, full) == 0, "%s", emb_store_errmsg(s));
    size_t n[3];
    push_more(s, 77, 4, n);
    ck_assert_msg(emb_store_checkpoint_delta(s, d1) == 0, "%s", emb_store_errmsg(s));
    ck_assert_msg(emb_store_checkpoint_delta(s, d2) == 0, "%s", emb_store_errmsg(s));
    /* d1 holds the pushed rows and nothing else (collect_fn: ascending). */
    emb_store *only = make_store(p), *none = make_store(p);
    ck_assert_msg(emb_store_restore_delta(only, d1) == 0, "%s", emb_store_errmsg(only));
    ck_assert_msg(emb_store_restore_delta(none, d2) == 0, "%s", emb_store_errmsg(none));
    for (int t = 0; t < 3; t++) {
      ck_assert_uint_eq(rows_held(only, t), n[t]);
      if (t != 1) ck_assert_uint_lt(n[t], rows_held(s, t)); /* table 1 has 50 rows: all held */
      ck_assert_uint_eq(rows_held(none, t), 0); /* cleared by the delta before */
    }
    /* The full checkpoint with the delta laid over it: the store's rows. */
    emb_store *s2 = make_store(p);
    ck_assert_msg(emb_store_restore(s2, full) == 0, "%s", emb_store_errmsg(s2));
    ck_assert(!same_tables(s, s2));
    ck_assert_msg(emb_store_restore_delta(s2, d1) == 0, "%s", emb_store_errmsg(s2));
    ck_assert(same_tables(s, s2));
    /* Restored: nothing changed since. */
    ck_assert_int_eq(emb_store_checkpoint_delta(s2, d3), 0);
    emb_store *none2 = make_store(p);
    ck_assert_int_eq(emb_store_restore_delta(none2, d3), 0);
    for (int t = 0; t < 3; t++) ck_assert_uint_eq(rows_held(none2, t), 0);
    /* A damaged file of a delta: refused, every row kept. */
    snprintf(file, sizeof file, "%s/table-%u.bin", d1, p->tables[2].table_id);
    FILE *f = fopen(file, "r+b");
    fseek(f, 300, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 300, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
    emb_store *s3 = make_store(p);
    ck_assert_int_eq(emb_store_restore(s3, full), 0);
    emb_store *s3ref = make_store(p);
    ck_assert_int_eq(emb_store_restore(s3ref, full), 0);
    ck_assert_int_eq(emb_store_restore_delta(s3, d1), SR_ECHECKSUM);
    ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s3), "checksum mismatch"));
    ck_assert(same_tables(s3, s3ref));
    emb_store_destroy(s);
    emb_store_destroy(s2);
    emb_store_destroy(s3);
    emb_store_destroy(s3ref);
    emb_store_destroy(only);
    emb_store_destroy(none);
    emb_store_destroy(none2);
    emb_plan_free(p);
    rmdir_all(tmp);
    free(tmp);
  }
}
END_TEST

/* A push of more rows than a pass (LT_PASS) that a row of its last pass
 * would turn non-finite is refused whole: the rows of the passes before,
 * already updated, are as they were, held ones and new ones, for every
 * optimizer, fp32 and fp16. */
START_TEST(test_push_refused_past_a_pass) {
  const emb_optim_kind kinds[] = {EMB_OPT_SGD, EMB_OPT_ADAGRAD, EMB_OPT_ROWWISE_ADAGRAD};
  enum { N = 3 * LT_PASS, D = 4 }; /* table 0: 1000 rows of dim 4 */
  for (int i = 0; i < 6; i++) {
    emb_plan *p = make_plan(kinds[i % 3], 1, 0, 5);
    p->tables[0].precision = i < 3 ? EMB_PREC_FP32 : EMB_PREC_FP16;
    emb_store *s = make_store(p);
    static uint64_t ids[N];
    static float g[N * D], before[N * D], after[N * D];
    for (int r = 0; r < N; r++) ids[r] = (uint64_t)r;
    for (int k = 0; k < N * D; k++) g[k] = 0.01f * (float)(1 + k % 5);
    const uint64_t *idp[3] = {ids, NULL, NULL};
    size_t counts[3] = {N / 2, 0, 0}; /* the first half held, the second new */
    const float *gp[3] = {g, NULL, NULL};
    float *op[3] = {before, NULL, NULL};
    emb_idset set = {3, idp, counts};
    ck_assert_int_eq(emb_store_push(s, 1, 0.1f, &set, gp), 0);
    counts[0] = N;
    ck_assert_int_eq(emb_store_lookup_begin(s, 2, &set, op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    g[(N - 10) * D + 1] = 3e38f; /* row N - 10's update overflows */
    ck_assert_int_eq(emb_store_push(s, 2, 1e4f, &set, gp), SR_ERANGE);
    char want[32];
    snprintf(want, sizeof want, "row %d:", N - 10);
    ck_assert_msg(strstr(emb_store_errmsg(s), want), "%s", emb_store_errmsg(s));
    op[0] = after;
    ck_assert_int_eq(emb_store_lookup_begin(s, 3, &set, op), 0);
    ck_assert_int_eq(emb_store_lookup_wait(s), 0);
    ck_assert_mem_eq(after, before, sizeof before);
    emb_store_stats st;
    emb_store_stats_get(s, &st);
    ck_assert_uint_eq(st.rows, N / 2);
    /* Without the overflowing gradient the same push is taken. */
    g[(N - 10) * D + 1] = 0.01f;
    ck_assert_int_eq(emb_store_push(s, 2, 1e4f, &set, gp), 0);
    emb_store_stats_get(s, &st);
    ck_assert_uint_eq(st.rows, N);
    emb_store_destroy(s);
    emb_plan_free(p);
  }
}
END_TEST

START_TEST(test_growth) {
  /* Many rows: the map and slab grow; values survive rehashing. */
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0, 5);
  emb_store *s = make_store(p);
  enum { N = 20000 };
  uint64_t *ids = malloc(N * 8);
  float *g = malloc(N * 5 * 4), *out = malloc(N * 5 * 4);
  for (int i = 0; i < N; i++) ids[i] = sr_mix64((uint64_t)i);
  for (int i = 0; i < N * 5; i++) g[i] = (float)(i % 7) - 3.0f;
  const uint64_t *idp[3] = {NULL, NULL, ids};
  size_t counts[3] = {0, 0, 0};
  const float *gp[3] = {NULL, NULL, g};
  float *op[3] = {NULL, NULL, out};
  emb_idset set = {3, idp, counts};
  for (int chunk = 0; chunk < 10; chunk++) {
    idp[2] = ids + chunk * (N / 10);
    gp[2] = g + chunk * (N / 10) * 5;
    counts[2] = N / 10;
    ck_assert_int_eq(emb_store_push(s, chunk, 0.1f, &set, gp), 0);
  }
  idp[2] = ids;
  counts[2] = N;
  ck_assert_int_eq(emb_store_lookup_begin(s, 10, &set, op), 0);
  for (int i = 0; i < N; i++) {
    float w[5], st[5];
    emb_row_init(p, 2, ids[i], w);
    emb_optim_state_init(&p->tables[2].optim, 5, st);
    emb_optim_apply(&p->tables[2].optim, 5, 0.1f, g + i * 5, w, st);
    ck_assert_mem_eq(out + i * 5, w, sizeof w);
  }
  emb_store_stats stt;
  emb_store_stats_get(s, &stt);
  ck_assert_uint_eq(stt.rows, N);
  free(ids);
  free(g);
  free(out);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

/* Table ti's allocation: slab capacity and index size (private header). */
static void table_room(emb_store *s, int ti, size_t room[2]) {
  const ltab *t = &((const lstore *)s)->t[ti];
  room[0] = t->slab_cap;
  room[1] = t->direct ? 0 : t->mask + 1;
}

/* A push, or an increment restored, of rows the store already holds
 * grows neither its slab nor its index, however full: room is made for
 * the rows added only (it used to be made for every row named, so the
 * first push into a full slab doubled it). */
START_TEST(test_held_rows_take_no_room) {
  emb_plan *p = make_plan(EMB_OPT_ADAGRAD, 1, 0, 5);
  emb_store *s = make_store(p);
  enum { N = 2048 }; /* the slab doubles from 16 to exactly N; table 1's 50 rows fill 64 */
  uint64_t *ids = malloc(N * 8), ids1[50];
  float *g = malloc(N * 8 * 4);
  for (int i = 0; i < N; i++) ids[i] = sr_mix64((uint64_t)i + 1);
  for (int i = 0; i < 50; i++) ids1[i] = (uint64_t)i;
  for (int i = 0; i < N * 8; i++) g[i] = 0.01f * (float)(i % 11) - 0.05f;
  const uint64_t *idp[3] = {NULL, ids1, ids};
  size_t counts[3] = {0, 50, N};
  const float *gp[3] = {NULL, g, g};
  emb_idset set = {3, idp, counts};
  ck_assert_int_eq(emb_store_push(s, 0, 0.1f, &set, gp), 0);
  size_t r1[2], r2[2], now[2];
  table_room(s, 1, r1);
  table_room(s, 2, r2);
  ck_assert_uint_eq(r1[0], 64);
  ck_assert_uint_eq(r2[0], N);
  char *tmp = tmpdir_make("store"), full[256], d1[256];
  snprintf(full, sizeof full, "%s/full", tmp);
  snprintf(d1, sizeof d1, "%s/d1", tmp);
  ck_assert_msg(emb_store_checkpoint(s, full) == 0, "%s", emb_store_errmsg(s));
  for (int step = 1; step <= 3; step++)
    ck_assert_int_eq(emb_store_push(s, step, 0.1f, &set, gp), 0);
  ck_assert_msg(emb_store_checkpoint_delta(s, d1) == 0, "%s", emb_store_errmsg(s));
  for (int pass = 0; pass < 2; pass++) { /* after the pushes, then after the increment */
    table_room(s, 1, now);
    ck_assert_msg(now[0] == r1[0], "pass %d: table 1's slab grew from %zu to %zu rows", pass,
                  r1[0], now[0]);
    table_room(s, 2, now);
    ck_assert_msg(now[0] == r2[0] && now[1] == r2[1],
                  "pass %d: table 2 grew from %zu slots, %zu entries to %zu, %zu", pass, r2[0],
                  r2[1], now[0], now[1]);
    if (!pass) {
      emb_store *s2 = make_store(p); /* the full checkpoint, then the increment laid over */
      ck_assert_int_eq(emb_store_restore(s2, full), 0);
      ck_assert_msg(emb_store_restore_delta(s, d1) == 0, "%s", emb_store_errmsg(s));
      ck_assert_msg(emb_store_restore_delta(s2, d1) == 0, "%s", emb_store_errmsg(s2));
      ck_assert(same_tables(s, s2));
      emb_store_destroy(s2);
    }
  }
  /* One row more still makes room. */
  uint64_t extra = sr_mix64(0);
  const uint64_t *xp[3] = {NULL, NULL, &extra};
  size_t xc[3] = {0, 0, 1};
  emb_idset xs = {3, xp, xc};
  ck_assert_int_eq(emb_store_push(s, 4, 0.1f, &xs, gp), 0);
  table_room(s, 2, now);
  ck_assert_uint_eq(now[0], 2 * N);
  ck_assert_uint_eq(rows_held(s, 2), N + 1);
  rmdir_all(tmp);
  free(tmp);
  free(ids);
  free(g);
  emb_store_destroy(s);
  emb_plan_free(p);
}
END_TEST

/* Rows from..to-1 of each table (at most 64; table 1's ids hashed) into
 * d, 8 gradients a row (the widest table's dim) from r. */
static void step_rows(step_data *d, const int from[3], const int to[3], sr_rng *r) {
  for (int t = 0; t < 3; t++) {
    d->counts[t] = (size_t)(to[t] - from[t]);
    for (int i = from[t]; i < to[t]; i++)
      d->ids[t][i - from[t]] = t == 1 ? sr_mix64((uint64_t)i + 1) : (uint64_t)i;
    for (size_t k = 0; k < d->counts[t] * 8; k++) d->grads[t][k] = (float)(sr_rng_uniform(r) - 0.5);
  }
  step_link(d);
}

/* Every allocation a push of held and new rows makes, failed in turn:
 * refused with SR_ENOMEM and every row as before (the updates made in place
 * before the new rows' room failed are undone), then the push that goes
 * through gives the bits of a store that never failed; fp32, fp16, bf16. */
START_TEST(test_push_out_of_memory) {
  for (int prec = 0; prec < 3; prec++) {
    static const uint64_t rows[FX_NT] = {200, 0, 40};
    emb_plan *p = fx_plan(rows, 8, 9, EMB_OPT_ADAGRAD, 1, 0);
    for (int t = 0; t < p->n_tables; t++) p->tables[t].precision = (emb_precision)prec;
    emb_store *a = make_store(p), *ref = make_store(p);
    sr_rng r;
    sr_rng_init(&r, 21, 0);
    step_data *d = malloc(sizeof *d);
    /* Slabs filled to their capacity (64, 32, 16 rows), tracked from a checkpoint. */
    const int f0[3] = {0, 0, 0}, f1[3] = {32, 32, 16}, f2[3] = {64, 64, 32};
    step_rows(d, f0, f1, &r);
    ck_assert_int_eq(emb_store_push(a, 0, 0.1f, &d->set, d->gp), 0);
    ck_assert_int_eq(emb_store_push(ref, 0, 0.1f, &d->set, d->gp), 0);
    step_rows(d, f1, f2, &r);
    ck_assert_int_eq(emb_store_push(a, 1, 0.1f, &d->set, d->gp), 0);
    ck_assert_int_eq(emb_store_push(ref, 1, 0.1f, &d->set, d->gp), 0);
    char *tmp = tmpdir_make("store-oom"), ca[256], cr[256];
    snprintf(ca, sizeof ca, "%s/a", tmp);
    snprintf(cr, sizeof cr, "%s/ref", tmp);
    ck_assert_int_eq(emb_store_checkpoint(a, ca), 0);
    ck_assert_int_eq(emb_store_checkpoint(ref, cr), 0);
    /* 40, 40 and 24 rows: the last 8 of each new. */
    const int m0[3] = {32, 32, 16}, m1[3] = {72, 72, 40};
    step_rows(d, m0, m1, &r);
    int k, after_apply = 0;
    for (k = 1; k < 100; k++) {
      fail_alloc_arm(k);
      int rc = emb_store_push(a, 2, 0.1f, &d->set, d->gp);
      long failed = fail_alloc_failed;
      fail_alloc_arm(0);
      if (!failed) {
        ck_assert_msg(rc == 0, "%s", emb_store_errmsg(a));
        break;
      }
      ck_assert_msg(rc == SR_ENOMEM, "precision %d, allocation %d: rc %d (%s)", prec, k, rc,
                    emb_store_errmsg(a));
      after_apply += strstr(emb_store_errmsg(a), "new rows") != NULL;
      ck_assert_msg(same_tables(a, ref), "precision %d: allocation %d failed and rows changed",
                    prec, k);
    }
    ck_assert_int_gt(after_apply, 0); /* the room for new rows failed once the rows were updated */
    ck_assert_int_eq(emb_store_push(ref, 2, 0.1f, &d->set, d->gp), 0);
    ck_assert(same_tables(a, ref));
    rmdir_all(tmp);
    free(tmp);
    free(d);
    emb_store_destroy(a);
    emb_store_destroy(ref);
    emb_plan_free(p);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("embedding_store");
  TCase *tc = tcase_create("local");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_untouched_is_init);
  tcase_add_test(tc, test_push_then_lookup);
  tcase_add_test(tc, test_out_of_range);
  tcase_add_test(tc, test_lookup_begin_twice);
  tcase_add_test(tc, test_placement_independent);
  tcase_add_test(tc, test_iterate_order);
  tcase_add_test(tc, test_checkpoint_restore);
  tcase_add_test(tc, test_restore_refuses_damage);
  tcase_add_test(tc, test_restore_grown);
  tcase_add_test(tc, test_checkpoint_delta);
  tcase_add_test(tc, test_growth);
  tcase_add_test(tc, test_held_rows_take_no_room);
  tcase_add_test(tc, test_push_out_of_memory);
  tcase_add_test(tc, test_push_nonfinite_refused);
  tcase_add_test(tc, test_push_refused_past_a_pass);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
