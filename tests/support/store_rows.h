/* A store's row by id, found by iterate (row_find), and the check that a
 * store holds a row with given floats (assert_row_held). One copy for the
 * suites that compare checkpoint files with a store's rows. */
#ifndef SHARDREC_TESTS_SUPPORT_STORE_ROWS_H
#define SHARDREC_TESTS_SUPPORT_STORE_ROWS_H

#include <check.h>
#include <stdint.h>
#include <string.h>
#include "embedding/store.h"

/* The most floats of one row (value then optimizer state) row_find keeps. */
#define ROW_FIND_MAX 1024

/* Finds row id of a table by iterate: found, and its value then state. */
typedef struct {
  uint64_t id;
  int found;
  float row[ROW_FIND_MAX];
} row_find;

static inline int row_find_fn(void *ctx, int table, uint64_t id, const float *v, int dim,
                              const float *st, int sl) {
  (void)table;
  row_find *f = ctx;
  if (id != f->id) return 0;
  ck_assert_int_le(dim + sl, ROW_FIND_MAX);
  memcpy(f->row, v, 4 * (size_t)dim);
  if (sl) memcpy(f->row + dim, st, 4 * (size_t)sl);
  f->found = 1;
  return 1;
}

/* Table t of ref holds row id, its first w floats (value then state) vals. */
static inline void assert_row_held(emb_store *ref, int t, uint64_t id, const float *vals, int w) {
  row_find f = {.id = id};
  ck_assert_int_eq(emb_store_iterate(ref, t, row_find_fn, &f), 0);
  ck_assert_msg(f.found, "table %d row %llu: not a row the store holds", t, (unsigned long long)id);
  ck_assert_msg(!memcmp(f.row, vals, 4 * (size_t)w), "table %d row %llu differs", t,
                (unsigned long long)id);
}

#endif
