/* A push that would leave a row or its optimizer state non-finite, or that
 * carries a learning rate out of range, is refused whole (SR_ERANGE, the
 * table and row named) and changes no row: the checks every store passes
 * (test_store.c: local store, test_shard.c: shard store). A twin store of
 * the same kind gets every push the store takes and none it refuses; a
 * last push to both updates each row from its optimizer state, so the two
 * stores' rows are alike only when no refused push left a state changed. */
#ifndef SHARDREC_TESTS_EMBEDDING_NONFINITE_H
#define SHARDREC_TESTS_EMBEDDING_NONFINITE_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "embedding/store.h"

#define NF_IDS 10
#define NF_MAXT 4
#define NF_MAXD 16

typedef struct {
  uint64_t ids[NF_MAXT][NF_IDS];
  const uint64_t *idp[NF_MAXT];
  size_t counts[NF_MAXT];
  float g[NF_MAXT][NF_IDS * NF_MAXD];
  const float *gp[NF_MAXT];
  float out[NF_MAXT][NF_IDS * NF_MAXD];
  float *op[NF_MAXT];
  emb_idset set;
} nf_step;

/* Rows 0..NF_IDS-1 of every table, gradient g0 everywhere. */
static void nf_fill(nf_step *d, const emb_plan *p, float g0) {
  ck_assert_int_le(p->n_tables, NF_MAXT);
  for (int t = 0; t < p->n_tables; t++) {
    ck_assert_int_le(p->tables[t].dim, NF_MAXD);
    d->counts[t] = NF_IDS;
    for (int r = 0; r < NF_IDS; r++) d->ids[t][r] = (uint64_t)r;
    for (int k = 0; k < NF_IDS * p->tables[t].dim; k++) d->g[t][k] = g0 * (float)(1 + k % 3);
    d->idp[t] = d->ids[t];
    d->gp[t] = d->g[t];
    d->op[t] = d->out[t];
  }
  d->set = (emb_idset){.n_tables = p->n_tables, .ids = d->idp, .counts = d->counts};
}

static void nf_lookup(emb_store *s, nf_step *d) {
  ck_assert_int_eq(emb_store_lookup_begin(s, 0, &d->set, d->op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(s), 0);
}

/* dst = src, its pointers into dst's own arrays. */
static void nf_copy(nf_step *dst, const nf_step *src, const emb_plan *p) {
  memcpy(dst, src, sizeof *dst);
  for (int t = 0; t < p->n_tables; t++) dst->op[t] = dst->out[t], dst->idp[t] = dst->ids[t];
  dst->set = (emb_idset){.n_tables = p->n_tables, .ids = dst->idp, .counts = dst->counts};
}

/* s's rows of ref's ids are ref's looked-up rows, bit for bit (else "table
 * T <what>"). */
static void nf_rows_are(emb_store *s, const emb_plan *p, const nf_step *ref, const char *what) {
  static nf_step now;
  nf_copy(&now, ref, p);
  nf_lookup(s, &now);
  for (int t = 0; t < p->n_tables; t++)
    ck_assert_msg(!memcmp(now.out[t], ref->out[t], NF_IDS * (size_t)p->tables[t].dim * 4),
                  "table %d %s", t, what);
}

/* The same push to s and its twin: both take it (1) or both refuse it (0). */
static int nf_push_both(emb_store *s, emb_store *twin, int64_t step, float lr, nf_step *d) {
  int rc = emb_store_push(s, step, lr, &d->set, d->gp);
  ck_assert_msg(rc == 0 || rc == SR_ERANGE, "%s", emb_store_errmsg(s));
  ck_assert_int_eq(emb_store_push(twin, step, lr, &d->set, d->gp), rc);
  return rc == 0;
}

/* p's tables must have at least NF_IDS rows; s and twin hold p (any
 * optimizer), both empty. */
static void nonfinite_check(emb_store *s, emb_store *twin, const emb_plan *p) {
  static nf_step d, before, other;
  nf_fill(&d, p, 0.01f);
  ck_assert_msg(nf_push_both(s, twin, 1, 0.1f, &d), "%s", emb_store_errmsg(s));
  nf_copy(&before, &d, p);
  nf_lookup(s, &before);
  /* Learning rates out of [0, 1e4], or not finite: refused, nothing applied. */
  const float bad_lr[] = {3e38f, 1.5e4f, -0.5f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad_lr / sizeof *bad_lr; i++) {
    ck_assert_int_eq(emb_store_push(s, 2, bad_lr[i], &d.set, d.gp), SR_ERANGE);
    ck_assert_msg(strstr(emb_store_errmsg(s), "learning rate"), "%s", emb_store_errmsg(s));
    nf_rows_are(s, p, &before, "changed by a refused push");
  }
  /* One element of the last table's row 7 overflows: with Adagrad its
   * accumulator (g*g) turns inf, with SGD the row itself (lr 1e4 * 3e38).
   * The rows before it in the push (every other table's, rows 0..6) would
   * have been fine: none of them may change either. */
  const int lt = p->n_tables - 1;
  d.g[lt][7 * p->tables[lt].dim + 1] = 3e38f;
  ck_assert_int_eq(emb_store_push(s, 2, 1e4f, &d.set, d.gp), SR_ERANGE);
  char want[96];
  snprintf(want, sizeof want, "table %u (%s) row 7:", p->tables[lt].table_id, p->tables[lt].name);
  ck_assert_msg(strstr(emb_store_errmsg(s), want), "'%s' does not name '%s'",
                emb_store_errmsg(s), want);
  ck_assert_ptr_nonnull(strstr(emb_store_errmsg(s), "nothing applied"));
  nf_rows_are(s, p, &before, "changed by a refused push");
  /* Finite gradients alone: the same push with a finite gradient each time but a
   * large rate, three steps running, drives an SGD row to -inf. Every step
   * the store takes leaves every row finite. */
  nf_fill(&d, p, 1e34f);
  for (int k = 0; k < 3; k++) {
    nf_push_both(s, twin, 3 + k, 1e4f, &d);
    nf_lookup(s, &d);
    for (int t = 0; t < p->n_tables; t++)
      for (int k2 = 0; k2 < NF_IDS * p->tables[t].dim; k2++)
        ck_assert_msg(isfinite(d.out[t][k2]), "table %d float %d is %g", t, k2, (double)d.out[t][k2]);
  }
  /* A valid push still applies afterwards, and leaves the rows the twin's. */
  nf_fill(&d, p, 0.01f);
  ck_assert_msg(nf_push_both(s, twin, 9, 0.1f, &d), "%s", emb_store_errmsg(s));
  nf_copy(&other, &d, p);
  nf_lookup(twin, &other);
  nf_rows_are(s, p, &other, "is not the rows of a store that never saw the refused pushes");
}

#endif
