/* The C dense pass against an independent numpy implementation
 * (tests/reference/dlrm_ref.py, run by /usr/bin/python3 or $SHARDREC_PYTHON).
 *
 * A tiny model's parameters (the documented buffer layout), a fixed batch of
 * dense features, pooled embeddings and labels are written to a temporary
 * folder; the script computes, in float64, the loss, every parameter gradient
 * and d_emb, and the loss after 20 plain SGD (or Adagrad) steps on that
 * batch; the dot, cat and dcn (cross network: its biases set off zero
 * first, so that a missing bias shows) interactions. Agreement
 * per element:
 *   |c - ref| <= 1e-5 * max(|c|, |ref|) + 1e-6 * max_k |ref_k|  (per tensor)
 * the floor (1e-6 of the tensor's largest element: float32 rounding carried
 * through a few layers) covers elements that come out tiny by cancellation. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "tests/support/files.h"

enum { B = 6, STEPS = 20 };
#define LR 0.1f

static const char *python(void) {
  const char *p = getenv("SHARDREC_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

static void write_f32(const char *dir, const char *name, const float *a,
                      size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  ck_assert(f);
  ck_assert_uint_eq(fwrite(a, sizeof(float), n, f), n);
  fclose(f);
}

static void check_block(const char *what, const float *c, const double *r,
                        size_t n, double *worst) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(r[i]));
  ck_assert_msg(scale > 0, "%s: zero reference gradient, vacuous", what);
  for (size_t i = 0; i < n; i++) {
    double tol = 1e-5 * fmax(fabs(c[i]), fabs(r[i])) + 1e-6 * scale;
    double e = fabs(c[i] - r[i]);
    if (e / tol > *worst) *worst = e / tol;
    ck_assert_msg(e <= tol, "%s[%zu]: C %.9g vs numpy %.12g (tol %.3g)", what,
                  i, c[i], r[i], tol);
  }
}

/* One case: the interaction, dcn's layers and rank (0 otherwise), the
 * optimizer of the 20 steps. */
typedef struct {
  int interaction, itself, dcn_layers, dcn_rank;
  dense_opt_kind opt;
  float lr;
} ref_case;

static const char *case_name(const ref_case *k) {
  static char n[64];
  snprintf(n, sizeof n, "%s%s%s", k->interaction == DENSE_INTERACT_DOT ? "dot" :
           k->interaction == DENSE_INTERACT_CAT ? "cat" : "dcn", k->itself ? "+itself" : "",
           k->opt == DENSE_OPT_ADAGRAD ? " adagrad" : "");
  return n;
}

static void run_case(const ref_case *k);

static void run(int interaction, int itself) {
  ref_case k = {interaction, itself, 0, 0, DENSE_OPT_SGD, LR};
  run_case(&k);
}

static void run_case(const ref_case *k) {
  int interaction = k->interaction, itself = k->itself;
  dense_config c = {0};
  c.n_dense = 5;
  c.n_bot = 3;
  c.bot[0] = 5, c.bot[1] = 8, c.bot[2] = 4;
  c.n_top = 3;
  c.top[0] = 7, c.top[1] = 5, c.top[2] = 1;
  c.n_sparse = 3;
  c.emb_dim = 4;
  c.interaction = interaction;
  c.interaction_itself = itself;
  c.dcn_layers = k->dcn_layers, c.dcn_rank = k->dcn_rank;
  c.max_batch = B;
  char err[256], *dir = tmpdir_make("dlrmref"), path[600], cmd[1500];
  dense_model *m = dense_model_create(&c, 77, err, sizeof err);
  ck_assert_msg(m, "%s", err);

  size_t np, es = (size_t)c.n_sparse * c.emb_dim;
  float *p = dense_model_params(m, &np);
  float x[B * 5], emb[B * 12], y[B], d_emb[B * 12], loss;
  sr_rng r;
  sr_rng_init(&r, 31, (uint64_t)(2 * interaction + itself));
  dense_tensor_info ti[4 * DENSE_MAX_LAYERS + 3 * DENSE_MAX_CROSS];
  int nt = dense_model_tensors(m, ti, 4 * DENSE_MAX_LAYERS + 3 * DENSE_MAX_CROSS);
  for (int t = 0; t < nt; t++) /* the cross biases start at zero */
    if (!strncmp(ti[t].name, "cross.", 6) && ti[t].cols == 1)
      for (int i = 0; i < ti[t].rows; i++) p[ti[t].offset + i] = (float)(0.3 * sr_rng_normal(&r));
  for (int i = 0; i < B * 5; i++) x[i] = (float)sr_rng_normal(&r);
  for (size_t i = 0; i < B * es; i++) emb[i] = (float)(0.5 * sr_rng_normal(&r));
  for (int i = 0; i < B; i++) y[i] = (float)(i % 3 == 0);

  snprintf(path, sizeof path, "%s/config.txt", dir);
  FILE *f = fopen(path, "w");
  fprintf(f, "n_dense 5\nbot 5 8 4\ntop 7 5 1\nn_sparse 3\nemb_dim 4\n"
             "interaction %s\nitself %d\nbatch %d\nlr %.9g\nsteps %d\n",
          interaction == DENSE_INTERACT_DOT ? "dot" : interaction == DENSE_INTERACT_CAT ? "cat" : "dcn",
          itself, B, (double)k->lr, STEPS);
  if (k->dcn_layers) fprintf(f, "dcn_layers %d\ndcn_rank %d\n", k->dcn_layers, k->dcn_rank);
  dense_opt_config oc = dense_opt_defaults(k->opt);
  if (k->opt == DENSE_OPT_ADAGRAD) fprintf(f, "optimizer adagrad\neps %.9g\n", (double)oc.eps);
  fclose(f);
  write_f32(dir, "params.f32", p, np);
  write_f32(dir, "x.f32", x, B * 5);
  write_f32(dir, "emb.f32", emb, B * es);
  write_f32(dir, "y.f32", y, B);
  const char *script = getenv("SHARDREC_DLRM_REF");
  ck_assert_msg(script, "SHARDREC_DLRM_REF not set (run through ctest)");
  snprintf(cmd, sizeof cmd, "%s %s %s", python(), script, dir);
  ck_assert_msg(system(cmd) == 0, "reference failed: %s", cmd);

  double ref_loss = NAN, ref_after = NAN;
  snprintf(path, sizeof path, "%s/ref.txt", dir);
  f = fopen(path, "r");
  ck_assert(f);
  ck_assert(fscanf(f, "loss %lf\nloss_after_sgd %lf", &ref_loss, &ref_after) == 2);
  fclose(f);
  double *rg = malloc((np + B * es) * sizeof *rg);
  snprintf(path, sizeof path, "%s/grads.f64", dir);
  f = fopen(path, "rb");
  ck_assert(f);
  ck_assert_uint_eq(fread(rg, sizeof(double), np + B * es, f), np + B * es);
  fclose(f);

  ck_assert_int_eq(dense_model_forward(m, B, x, emb, NULL), 0);
  ck_assert_int_eq(dense_model_backward(m, B, y, &loss, d_emb), 0);
  ck_assert_msg(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss),
                "loss C %.9g vs numpy %.12g", loss, ref_loss);
  float loss0 = loss;
  float *g = dense_model_grads(m, NULL);
  double worst = 0;
  for (int t = 0; t < nt; t++)
    check_block(ti[t].name, g + ti[t].offset, rg + ti[t].offset,
                (size_t)ti[t].rows * ti[t].cols, &worst);
  check_block("d_emb", d_emb, rg + np, B * es, &worst);

  /* 20 steps on the same batch through the optimizer API */
  dense_opt *o = dense_opt_create(&oc, np, err, sizeof err);
  ck_assert(o);
  for (int s = 0; s < STEPS; s++) {
    ck_assert_int_eq(dense_model_forward(m, B, x, emb, NULL), 0);
    ck_assert_int_eq(dense_model_backward(m, B, y, NULL, NULL), 0);
    ck_assert_int_eq(dense_opt_step(o, p, g, k->lr), 0);
  }
  ck_assert_int_eq(dense_model_forward(m, B, x, emb, NULL), 0);
  ck_assert_int_eq(dense_model_backward(m, B, y, &loss, NULL), 0);
  ck_assert_msg(fabs(loss - ref_after) <= 1e-5 * fabs(ref_after),
                "loss after %d SGD steps: C %.9g vs numpy %.12g", STEPS, loss,
                ref_after);
  ck_assert_msg(ref_after < ref_loss, "SGD did not reduce the loss (%g -> %g)",
                ref_loss, ref_after);
  fprintf(stderr, "%s: loss %.9g (numpy %.12g), after %d steps %.9g (numpy "
          "%.12g), worst error/tolerance %.3f\n",
          case_name(k), loss0, ref_loss, STEPS, loss, ref_after, worst);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert(system(cmd) == 0);
  free(dir);
  free(rg);
  dense_opt_destroy(o);
  dense_model_destroy(m);
}

START_TEST(test_ref_dot) { run(DENSE_INTERACT_DOT, 0); }
END_TEST
START_TEST(test_ref_dot_itself) { run(DENSE_INTERACT_DOT, 1); }
END_TEST
START_TEST(test_ref_cat) { run(DENSE_INTERACT_CAT, 0); }
END_TEST
/* x_0 is 4 + 3*4 = 16 wide: one layer of rank 3, two of rank 5 under SGD
 * and three of rank 20 (above the width) under Adagrad. */
START_TEST(test_ref_dcn) {
  ref_case one = {DENSE_INTERACT_DCN, 0, 1, 3, DENSE_OPT_SGD, LR};
  ref_case two = {DENSE_INTERACT_DCN, 0, 2, 5, DENSE_OPT_SGD, LR};
  run_case(&one);
  run_case(&two);
}
END_TEST
START_TEST(test_ref_dcn_adagrad) {
  ref_case k = {DENSE_INTERACT_DCN, 0, 3, 20, DENSE_OPT_ADAGRAD, 0.01f};
  run_case(&k);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_reference");
  TCase *t = tcase_create("numpy");
  tcase_set_timeout(t, 60);
  tcase_add_test(t, test_ref_dot);
  tcase_add_test(t, test_ref_dot_itself);
  tcase_add_test(t, test_ref_cat);
  tcase_add_test(t, test_ref_dcn);
  tcase_add_test(t, test_ref_dcn_adagrad);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  return sr_check_run(suite());
}
