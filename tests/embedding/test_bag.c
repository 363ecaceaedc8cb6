/* Tests for embedding/bag.h (dedup, pooling forward/backward) and
 * embedding/optim.h (sparse optimizers against hand-computed values). */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"
#include "embedding/bag.h"
#include "embedding/optim.h"

START_TEST(test_dedup_small) {
  emb_dedup *d = emb_dedup_create(4);
  ck_assert_ptr_nonnull(d);
  const uint64_t ids[] = {7, 3, 7, 0xffffffffffffffffULL, 3, 0, 7};
  uint64_t u[7];
  uint32_t inv[7];
  size_t nu = 0;
  for (int rep = 0; rep < 3; rep++) { /* reuse; grows past max_ids = 4 */
    ck_assert_int_eq(emb_dedup_run(d, ids, 7, u, inv, &nu), 0);
    ck_assert_uint_eq(nu, 4);
    const uint64_t wu[] = {7, 3, 0xffffffffffffffffULL, 0};
    const uint32_t wi[] = {0, 1, 0, 2, 1, 3, 0};
    ck_assert_mem_eq(u, wu, sizeof wu);
    ck_assert_mem_eq(inv, wi, sizeof wi);
  }
  ck_assert_int_eq(emb_dedup_run(d, ids, 0, u, inv, &nu), 0);
  ck_assert_uint_eq(nu, 0);
  emb_dedup_destroy(d);
  emb_dedup_destroy(NULL);
}
END_TEST

START_TEST(test_dedup_random) {
  emb_dedup *d = emb_dedup_create(4096);
  sr_rng r;
  sr_rng_init(&r, 5, 0);
  const size_t n = 4096;
  uint64_t *ids = malloc(n * 8), *u = malloc(n * 8), *u2 = malloc(n * 8);
  uint32_t *inv = malloc(n * 4), *inv2 = malloc(n * 4);
  char *seen = calloc(1000, 1);
  for (int rep = 0; rep < 20; rep++) {
    for (size_t k = 0; k < n; k++) ids[k] = sr_rng_below(&r, 1000);
    size_t nu, nu2;
    ck_assert_int_eq(emb_dedup_run(d, ids, n, u, inv, &nu), 0);
    memset(seen, 0, 1000);
    size_t distinct = 0;
    for (size_t k = 0; k < n; k++) {
      ck_assert_uint_eq(u[inv[k]], ids[k]);
      distinct += !seen[ids[k]];
      seen[ids[k]] = 1;
    }
    ck_assert_uint_eq(nu, distinct);
    /* First-appearance order: unique[i] first appears before unique[i+1]. */
    size_t next = 0;
    for (size_t k = 0; k < n; k++)
      if (inv[k] == next) next++;
      else ck_assert_uint_lt(inv[k], next);
    ck_assert_uint_eq(next, nu);
    /* A fresh deduplicator gives the same answer. */
    emb_dedup *d2 = emb_dedup_create(16);
    ck_assert_int_eq(emb_dedup_run(d2, ids, n, u2, inv2, &nu2), 0);
    ck_assert_uint_eq(nu, nu2);
    ck_assert_mem_eq(u, u2, nu * 8);
    ck_assert_mem_eq(inv, inv2, n * 4);
    emb_dedup_destroy(d2);
  }
  free(ids);
  free(u);
  free(u2);
  free(inv);
  free(inv2);
  free(seen);
  emb_dedup_destroy(d);
}
END_TEST

/* A feature of n samples with multi-hot and empty bags, offsets starting at
 * base (as a later feature of a batch does). */
typedef struct {
  int n, dim;
  size_t n_unique;
  uint32_t *offsets; /* [n+1], absolute */
  uint32_t *inverse;
  float *rows; /* [n_unique][dim] */
} feat;

static feat make_feat(int n, int dim, uint64_t seed) {
  sr_rng r;
  sr_rng_init(&r, seed, 1);
  feat f;
  f.n = n;
  f.dim = dim;
  f.n_unique = 1 + sr_rng_below(&r, 30);
  f.offsets = malloc((size_t)(n + 1) * 4);
  const uint32_t base = 1000;
  f.offsets[0] = base;
  for (int i = 0; i < n; i++) {
    uint32_t len = (uint32_t)sr_rng_below(&r, 5); /* 0..4: empty, one-hot, multi-hot */
    if (i == 0) len = 0;
    if (i == 1) len = 1;
    f.offsets[i + 1] = f.offsets[i] + len;
  }
  size_t n_ids = f.offsets[n] - base;
  f.inverse = malloc((n_ids + 1) * 4);
  for (size_t k = 0; k < n_ids; k++) f.inverse[k] = (uint32_t)sr_rng_below(&r, f.n_unique);
  f.rows = malloc(f.n_unique * (size_t)dim * 4);
  for (size_t k = 0; k < f.n_unique * (size_t)dim; k++) f.rows[k] = (float)(sr_rng_uniform(&r) * 2 - 1);
  return f;
}

static void free_feat(feat *f) {
  free(f->offsets);
  free(f->inverse);
  free(f->rows);
}

START_TEST(test_pool_forward_backward) {
  for (int pool = 0; pool < 2; pool++)
    for (int trial = 0; trial < 10; trial++) {
      const int n = 37, dim = 5 + trial % 3, F = 3, fpos = 1;
      feat f = make_feat(n, dim, 100 + (uint64_t)trial);
      const size_t stride = (size_t)F * dim;
      float *out = malloc((size_t)n * stride * 4);
      for (size_t k = 0; k < (size_t)n * stride; k++) out[k] = 99.0f;
      emb_bag_forward((emb_pooling)pool, dim, n, f.offsets, f.inverse, f.rows, out + fpos * dim, stride);
      /* Naive reference in double. */
      for (int i = 0; i < n; i++) {
        uint32_t b = f.offsets[i] - f.offsets[0], e = f.offsets[i + 1] - f.offsets[0];
        for (int j = 0; j < dim; j++) {
          double s = 0;
          for (uint32_t k = b; k < e; k++) s += f.rows[(size_t)f.inverse[k] * dim + j];
          if (pool == EMB_POOL_MEAN && e > b) s /= (double)(e - b);
          ck_assert_double_eq_tol(out[i * stride + fpos * dim + j], s, 1e-5);
          if (e == b) ck_assert(out[i * stride + fpos * dim + j] == 0.0f);
          ck_assert(out[i * stride + j] == 99.0f); /* other features untouched */
          ck_assert(out[i * stride + 2 * dim + j] == 99.0f);
        }
      }
      /* Backward vs naive, and bit-identical across runs. */
      float *dout = malloc((size_t)n * stride * 4);
      sr_rng r;
      sr_rng_init(&r, 9, (uint64_t)trial);
      for (size_t k = 0; k < (size_t)n * stride; k++) dout[k] = (float)sr_rng_normal(&r);
      float *g = malloc(f.n_unique * dim * 4), *g2 = malloc(f.n_unique * dim * 4);
      for (size_t k = 0; k < f.n_unique * dim; k++) g[k] = 123.0f; /* must be zeroed */
      emb_bag_backward((emb_pooling)pool, dim, n, f.offsets, f.inverse, dout + fpos * dim, stride, f.n_unique, g);
      emb_bag_backward((emb_pooling)pool, dim, n, f.offsets, f.inverse, dout + fpos * dim, stride, f.n_unique, g2);
      ck_assert_mem_eq(g, g2, f.n_unique * dim * 4);
      double *ref = calloc(f.n_unique * dim, sizeof(double));
      for (int i = 0; i < n; i++) {
        uint32_t b = f.offsets[i] - f.offsets[0], e = f.offsets[i + 1] - f.offsets[0];
        for (uint32_t k = b; k < e; k++)
          for (int j = 0; j < dim; j++)
            ref[(size_t)f.inverse[k] * dim + j] +=
                dout[i * stride + fpos * dim + j] / (pool == EMB_POOL_MEAN ? (double)(e - b) : 1.0);
      }
      for (size_t k = 0; k < f.n_unique * dim; k++) ck_assert_double_eq_tol(g[k], ref[k], 1e-4);
      free(ref);
      free(g);
      free(g2);
      free(dout);
      free(out);
      free_feat(&f);
    }
}
END_TEST

/* loss = sum_i sum_j c[i][j] * p[i][j] + 0.5 * p[i][j]^2, p = pool(rows);
 * dloss/dp = c + p; backward gives dloss/drows; compare with central
 * differences. */
static double fd_loss(emb_pooling pool, const feat *f, const float *c, float *out) {
  emb_bag_forward(pool, f->dim, f->n, f->offsets, f->inverse, f->rows, out, (size_t)f->dim);
  double l = 0;
  for (int k = 0; k < f->n * f->dim; k++) l += (double)c[k] * out[k] + 0.5 * (double)out[k] * out[k];
  return l;
}

START_TEST(test_pool_finite_difference) {
  for (int pool = 0; pool < 2; pool++) {
    feat f = make_feat(23, 4, 77 + (uint64_t)pool);
    const int nd = f.n * f.dim;
    float *c = malloc((size_t)nd * 4), *out = malloc((size_t)nd * 4), *dout = malloc((size_t)nd * 4);
    sr_rng r;
    sr_rng_init(&r, 3, 3);
    for (int k = 0; k < nd; k++) c[k] = (float)sr_rng_normal(&r);
    fd_loss((emb_pooling)pool, &f, c, out);
    for (int k = 0; k < nd; k++) dout[k] = c[k] + out[k];
    float *g = malloc(f.n_unique * f.dim * 4);
    emb_bag_backward((emb_pooling)pool, f.dim, f.n, f.offsets, f.inverse, dout, (size_t)f.dim, f.n_unique, g);
    const float h = 1e-2f;
    for (size_t k = 0; k < f.n_unique * (size_t)f.dim; k++) {
      float keep = f.rows[k];
      f.rows[k] = keep + h;
      double lp = fd_loss((emb_pooling)pool, &f, c, out);
      f.rows[k] = keep - h;
      double lm = fd_loss((emb_pooling)pool, &f, c, out);
      f.rows[k] = keep;
      double fd = (lp - lm) / (2.0 * (double)h);
      ck_assert_msg(fabs(fd - g[k]) <= 2e-3 * (1 + fabs(fd)), "pool %d elem %zu: fd %g, backward %g", pool, k, fd,
                    (double)g[k]);
    }
    free(c);
    free(out);
    free(dout);
    free(g);
    free_feat(&f);
  }
}
END_TEST

START_TEST(test_optim_hand_values) {
  /* sgd */
  emb_optim_cfg o = {EMB_OPT_SGD, 0, 0};
  ck_assert_int_eq(emb_optim_state_len(&o, 7), 0);
  float w[2] = {1.0f, 2.0f};
  const float g[2] = {0.5f, -1.0f};
  emb_optim_apply(&o, 2, 0.1f, g, w, NULL);
  ck_assert_float_eq_tol(w[0], 0.95f, 1e-7);
  ck_assert_float_eq_tol(w[1], 2.1f, 1e-7);
  /* adagrad (torch): acc0 = 0.1, eps = 1e-10, two steps. */
  o.kind = EMB_OPT_ADAGRAD;
  o.eps = 1e-10;
  o.init_acc = 0.1;
  ck_assert_int_eq(emb_optim_state_len(&o, 7), 7);
  float st[2];
  emb_optim_state_init(&o, 2, st);
  ck_assert(st[0] == 0.1f && st[1] == 0.1f);
  w[0] = 1.0f;
  w[1] = 2.0f;
  emb_optim_apply(&o, 2, 0.1f, g, w, st);
  /* acc = [0.35, 1.1]; w0 = 1 - 0.05/sqrt(0.35); w1 = 2 + 0.1/sqrt(1.1) */
  ck_assert_float_eq_tol(st[0], 0.35f, 1e-7);
  ck_assert_float_eq_tol(st[1], 1.1f, 1e-7);
  ck_assert_double_eq_tol(w[0], 0.91548457, 1e-6);
  ck_assert_double_eq_tol(w[1], 2.09534626, 1e-6);
  emb_optim_apply(&o, 2, 0.1f, g, w, st);
  /* acc = [0.6, 2.1]; w0 -= 0.05/sqrt(0.6); w1 += 0.1/sqrt(2.1) */
  ck_assert_double_eq_tol(w[0], 0.91548457 - 0.06454972, 1e-6);
  ck_assert_double_eq_tol(w[1], 2.09534626 + 0.06900656, 1e-6);
  /* adagrad with a zero accumulator and a zero gradient stays put (eps). */
  o.init_acc = 0;
  emb_optim_state_init(&o, 2, st);
  const float z[2] = {0, 0};
  w[0] = 1.0f;
  emb_optim_apply(&o, 2, 0.1f, z, w, st);
  ck_assert(w[0] == 1.0f);
  /* First adagrad step from zero moves each element by lr * sign(g). */
  emb_optim_apply(&o, 2, 0.1f, g, w, st);
  ck_assert_double_eq_tol(w[0], 0.9, 1e-6);
  /* rowwise adagrad (FBGEMM): acc += mean(g^2) = 0.625 */
  o.kind = EMB_OPT_ROWWISE_ADAGRAD;
  o.eps = 1e-8;
  o.init_acc = 0.1;
  ck_assert_int_eq(emb_optim_state_len(&o, 7), 1);
  emb_optim_state_init(&o, 2, st);
  w[0] = 1.0f;
  w[1] = 2.0f;
  emb_optim_apply(&o, 2, 0.1f, g, w, st);
  ck_assert_float_eq_tol(st[0], 0.725f, 1e-7);
  double m = 0.1 / (sqrt(0.725) + 1e-8);
  ck_assert_double_eq_tol(w[0], 1.0 - m * 0.5, 1e-6);
  ck_assert_double_eq_tol(w[1], 2.0 + m * 1.0, 1e-6);
  emb_optim_apply(&o, 2, 0.1f, g, w, st);
  double m2 = 0.1 / (sqrt(1.35) + 1e-8);
  ck_assert_double_eq_tol(w[0], 1.0 - m * 0.5 - m2 * 0.5, 1e-6);
  ck_assert_double_eq_tol(w[1], 2.0 + m + m2, 1e-6);
}
END_TEST

/* emb_optim_apply's verdict: 1 for a finite outcome, 0 as soon as one
 * value of the row or of its state is inf or NaN (a gradient that is not
 * finite; a gradient whose square overflows the accumulators while SGD's
 * step stays finite; a weight at the float's top pushed past it), each
 * optimizer; the verdict is emb_all_finite's of the outcome. */
START_TEST(test_optim_finite_verdict) {
  const emb_optim_kind kinds[3] = {EMB_OPT_SGD, EMB_OPT_ADAGRAD, EMB_OPT_ROWWISE_ADAGRAD};
  const struct {
    float g1, w1, lr;
    int want[3]; /* sgd, adagrad, rowwise_adagrad */
  } cases[] = {
      {-0.2f, 1.0f, 0.1f, {1, 1, 1}},     {NAN, 1.0f, 0.1f, {0, 0, 0}},
      {INFINITY, 1.0f, 0.1f, {0, 0, 0}},  {-INFINITY, 1.0f, 0.1f, {0, 0, 0}},
      {3e38f, 1.0f, 0.1f, {1, 0, 0}},     {-1e34f, 3e38f, 1e4f, {0, 0, 0}},
  };
  for (int k = 0; k < 3; k++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      emb_optim_cfg o = {kinds[k], 1e-8, 0.1};
      const int sl = emb_optim_state_len(&o, 4);
      float g[4] = {0.1f, cases[c].g1, 0.5f, 0.3f}, w[4 + 4] = {1.0f, cases[c].w1, 2.0f, -1.0f};
      emb_optim_state_init(&o, 4, w + 4);
      const int ok = emb_optim_apply(&o, 4, cases[c].lr, g, w, w + 4);
      ck_assert_msg(ok == cases[c].want[k] && ok == emb_all_finite(w, (size_t)(4 + sl)),
                    "optimizer %d case %zu: verdict %d", k, c, ok);
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("embedding_bag");
  TCase *tc = tcase_create("bag");
  tcase_add_test(tc, test_dedup_small);
  tcase_add_test(tc, test_dedup_random);
  tcase_add_test(tc, test_pool_forward_backward);
  tcase_add_test(tc, test_pool_finite_difference);
  tcase_add_test(tc, test_optim_hand_values);
  tcase_add_test(tc, test_optim_finite_verdict);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
