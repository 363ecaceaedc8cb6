/* Dense optimizers against hand-computed values, and the reference DLRM's
 * learning-rate schedule at chosen steps. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "dense/optim.h"

static dense_opt *mk(dense_opt_kind k, size_t n) {
  dense_opt_config c = dense_opt_defaults(k);
  char err[128];
  dense_opt *o = dense_opt_create(&c, n, err, sizeof err);
  ck_assert_msg(o != NULL, "%s", err);
  return o;
}

#define CLOSE(a, b, rel)                                                       \
  ck_assert_msg(fabs((double)(a) - (double)(b)) <= (rel) * fabs((double)(b)) + 1e-12, \
                "%s = %.9g, want %.9g", #a, (double)(a), (double)(b))

START_TEST(test_sgd) {
  dense_opt *o = mk(DENSE_OPT_SGD, 2);
  float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f};
  size_t ns;
  dense_opt_state(o, &ns);
  ck_assert_uint_eq(ns, 0);
  for (int t = 0; t < 3; t++) ck_assert_int_eq(dense_opt_step(o, p, g, 0.1f), 0);
  CLOSE(p[0], 0.85, 1e-6);  /* 1 - 3*0.05 */
  CLOSE(p[1], -1.925, 1e-6); /* -2 + 3*0.025 */
  ck_assert_int_eq(dense_opt_steps(o), 3);
  dense_opt_destroy(o);
}
END_TEST

/* An update that leaves parameters inf or nan is still applied whole, and
 * refused SR_ERANGE naming the first such parameter, also when it lies in a
 * later chunk than another (the optimizer's chunks run on the dense pool). */
START_TEST(test_nonfinite_named) {
  size_t n = 40000;
  dense_opt *o = mk(DENSE_OPT_SGD, n);
  float *p = calloc(n, sizeof *p), *g = calloc(n, sizeof *g);
  ck_assert_int_eq(dense_opt_nonfinite_at(o), n);
  g[7] = 1.0f;
  ck_assert_int_eq(dense_opt_step(o, p, g, 1.0f), 0);
  ck_assert_int_eq(dense_opt_nonfinite_at(o), n);
  g[7] = 0;
  g[33000] = -INFINITY; /* third chunk */
  g[20000] = NAN;       /* second chunk: the first one */
  ck_assert_int_eq(dense_opt_step(o, p, g, 1.0f), SR_ERANGE);
  ck_assert_int_eq(dense_opt_nonfinite_at(o), 20000);
  ck_assert(isnan(p[20000]) && isinf(p[33000]) && p[7] == -1.0f);
  g[20000] = g[33000] = 0;
  p[20000] = p[33000] = 0;
  ck_assert_int_eq(dense_opt_step(o, p, g, 1.0f), 0);
  ck_assert_int_eq(dense_opt_nonfinite_at(o), n);
  free(p);
  free(g);
  dense_opt_destroy(o);
}
END_TEST

START_TEST(test_adagrad) {
  /* constant g: s_t = t g^2, p_t = p_0 - lr sign(g) sum_k 1/sqrt(k) */
  dense_opt *o = mk(DENSE_OPT_ADAGRAD, 2);
  float p[2] = {1.0f, 0.5f}, g[2] = {0.3f, -2.0f};
  double h = 0;
  for (int t = 1; t <= 4; t++) {
    dense_opt_step(o, p, g, 0.01f);
    h += 1 / sqrt((double)t);
  }
  CLOSE(p[0], 1.0 - 0.01 * h, 1e-6);
  CLOSE(p[1], 0.5 + 0.01 * h, 1e-6);
  size_t ns;
  float *s = dense_opt_state(o, &ns);
  ck_assert_uint_eq(ns, 2);
  CLOSE(s[0], 4 * 0.09, 1e-6);
  CLOSE(s[1], 16.0, 1e-6);
  dense_opt_destroy(o);
  /* varying gradients, two steps by hand: g = 1 then 2, lr 1
   * s1 = 1: p = 0 - 1/(1+eps) ; s2 = 5: p -= 2/sqrt(5) */
  o = mk(DENSE_OPT_ADAGRAD, 1);
  float q = 0, g1 = 1, g2 = 2;
  dense_opt_step(o, &q, &g1, 1.0f);
  dense_opt_step(o, &q, &g2, 1.0f);
  CLOSE(q, -1.0 - 2.0 / sqrt(5.0), 1e-6);
  dense_opt_destroy(o);
}
END_TEST

START_TEST(test_adam) {
  /* constant g: m_hat = g, v_hat = g^2, each step moves lr*g/(|g|+eps) */
  dense_opt *o = mk(DENSE_OPT_ADAM, 2);
  float p[2] = {1.0f, 0.0f}, g[2] = {0.2f, -1e-3f};
  for (int t = 0; t < 5; t++) dense_opt_step(o, p, g, 0.01f);
  CLOSE(p[0], 1.0 - 5 * 0.01 * 0.2 / (0.2 + 1e-8), 1e-6);
  CLOSE(p[1], 5 * 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-5);
  dense_opt_destroy(o);
  /* g = 1 then -1, lr 0.1, by hand:
   * t1: m = .1, v = .001, m^ = 1, v^ = 1        -> p = -0.1/(1+1e-8)
   * t2: m = .09 - .1 = -.01, v = .000999 + .001 = .001999
   *     m^ = -.01/.19, v^ = .001999/.001999 = ... */
  o = mk(DENSE_OPT_ADAM, 1);
  float q = 0, a = 1, b = -1;
  dense_opt_step(o, &q, &a, 0.1f);
  CLOSE(q, -0.1 / (1 + 1e-8), 1e-6);
  dense_opt_step(o, &q, &b, 0.1f);
  double m2 = 0.9 * 0.1 - 0.1, v2 = 0.999 * 0.001 + 0.001;
  double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.999 * 0.999);
  CLOSE(q, -0.1 / (1 + 1e-8) - 0.1 * mh / (sqrt(vh) + 1e-8), 1e-5);
  size_t ns;
  float *st = dense_opt_state(o, &ns);
  ck_assert_uint_eq(ns, 2);
  CLOSE(st[0], m2, 1e-5);
  CLOSE(st[1], v2, 1e-5);
  ck_assert_int_eq(dense_opt_steps(o), 2);
  dense_opt_destroy(o);
}
END_TEST

START_TEST(test_opt_errors) {
  char err[128];
  dense_opt_config c = dense_opt_defaults(DENSE_OPT_ADAM);
  c.beta1 = 1.0;
  ck_assert(dense_opt_create(&c, 4, err, sizeof err) == NULL);
  ck_assert(strstr(err, "beta") != NULL);
  dense_opt_destroy(NULL);
  ck_assert_float_eq(dense_opt_defaults(DENSE_OPT_ADAGRAD).eps, 1e-10f);
  ck_assert_float_eq(dense_opt_defaults(DENSE_OPT_ADAGRAD).initial_accumulator, 0.0f);
}
END_TEST

START_TEST(test_lr_schedule) {
  /* W = 4, S = 10, D = 5, base 1; step k runs at c = k + 1 */
  dense_lr_sched s = {1.0, 4, 10, 5};
  ck_assert_int_eq(dense_lr_sched_validate(&s, NULL, 0), 0);
  double want[] = {
      0.25, 0.5, 0.75,             /* c = 1..3: warmup c/W */
      0.75, 0.75, 0.75, 0.75, 0.75, 0.75, /* c = 4..9: frozen at last warmup */
      1.0, 0.64, 0.36, 0.16, 0.04, /* c = 10..14: ((D - (c-S))/D)^2 */
      0.04, 0.04};                 /* after: frozen at the last decay value */
  for (int k = 0; k < (int)(sizeof want / sizeof *want); k++)
    ck_assert_msg(fabs(dense_lr_at_double(&s, k) - want[k]) < 1e-15,
                  "step %d: %.17g want %.17g", k, dense_lr_at_double(&s, k), want[k]);
  ck_assert(fabs(dense_lr_at_double(&s, 1000000) - 0.04) < 1e-15);

  /* no decay: base after warmup */
  dense_lr_sched n = {0.5, 4, 4, 0};
  ck_assert(dense_lr_at(&n, 0) == 0.125f);
  ck_assert(dense_lr_at(&n, 3) == 0.5f);
  ck_assert(dense_lr_at(&n, 99) == 0.5f);
  /* defaults (0, 0, 0): constant */
  dense_lr_sched z = {0.1, 0, 0, 0};
  ck_assert(dense_lr_at(&z, 0) == 0.1f && dense_lr_at(&z, 12345) == 0.1f);
  /* min lr 1e-7 in the decay */
  dense_lr_sched m = {1e-6, 0, 0, 10};
  ck_assert(fabs(dense_lr_at_double(&m, 0) - 1e-6 * 0.81) < 1e-20); /* c=1 */
  ck_assert(dense_lr_at_double(&m, 8) == 1e-7); /* c=9: 1e-8 -> 1e-7 */
  ck_assert(dense_lr_at_double(&m, 50) == 1e-7);
  /* decay must not start before warmup ends */
  dense_lr_sched bad = {1.0, 10, 5, 3};
  char err[160];
  ck_assert_int_eq(dense_lr_sched_validate(&bad, err, sizeof err), SR_EINVAL);
  ck_assert(strstr(err, "warmup must finish") != NULL);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_optim");
  TCase *t = tcase_create("optim");
  tcase_add_test(t, test_sgd);
  tcase_add_test(t, test_nonfinite_named);
  tcase_add_test(t, test_adagrad);
  tcase_add_test(t, test_adam);
  tcase_add_test(t, test_opt_errors);
  tcase_add_test(t, test_lr_schedule);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return sr_check_run(suite());
}
