/* The whole dense step on the CUDA backend against the CPU backend: same
 * configuration and seed (so the same initial bits), same inputs, for the
 * dot (with and without itself) and cat interactions, a batch that spans
 * several bias-gradient chunks, and five SGD steps in a row (host optimizer
 * on both sides, as the trainer does).
 *
 * Logits and loss agree within 1e-4 relative (assert_close): the forward
 * pass is continuous in its inputs. Gradients are not: a ReLU's derivative
 * jumps where a pre-activation crosses zero, and a step has about 3 million
 * pre-activations, so the two backends' roundings (different summation
 * orders) put a few on different sides and change those samples' share of
 * the gradients. Two CPU runs on the same machine, one with OpenBLAS's
 * Prescott kernels, differed that way in 1 step of 10 by 3e-3 normwise and
 * 7.5e-3 of the tensor's largest element in bot.0-2, where the other steps
 * agreed within 1e-6. So each gradient tensor and d_emb agree within 1e-2
 * normwise and 3e-2 of the tensor's scale per element (assert_grad_close): a
 * wrong offset, transposition, pitch or lost chunk is far outside both. The
 * last layer's weights and bias have no ReLU after them, so their gradients
 * are continuous and keep the 1e-4 of assert_close (a backward pass in
 * reduced precision fails there). Each step's worst figures go to stderr.
 *
 * Also: the default backend switch, the model's own pinned batch buffers
 * (same bits as the caller's), and save/load of a CUDA model. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dense/device.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "dense/state_file.h"
#include "gpu_skip.h"

#define RTOL 1e-4
#define GTOL_NORM 1e-2
#define GTOL_ELEM 3e-2

/* ||got - want|| / ||want|| (2-norms) */
static double norm_err(const float *got, const float *want, size_t n) {
  double e = 0, w = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - want[i];
    e += d * d;
    w += (double)want[i] * want[i];
  }
  return w > 0 ? sqrt(e / w) : sqrt(e);
}

/* max |got - want| / max |want| */
static double elem_err(const float *got, const float *want, size_t n) {
  double e = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
    if (fabs((double)got[i] - want[i]) > e) e = fabs((double)got[i] - want[i]);
  }
  return scale > 0 ? e / scale : e;
}

/* A gradient tensor within GTOL_NORM normwise and GTOL_ELEM of its scale;
 * *worst_n / *worst_e keep the step's largest figures. */
static void assert_grad_close(const char *what, int step, const float *got,
                              const float *want, size_t n, double *worst_n,
                              double *worst_e) {
  double en = norm_err(got, want, n), ee = elem_err(got, want, n);
  ck_assert_msg(en <= GTOL_NORM && ee <= GTOL_ELEM,
                "step %d %s: cuda vs cpu %.3g normwise (limit %.0e), %.3g of "
                "the largest element (limit %.0e)",
                step, what, en, GTOL_NORM, ee, GTOL_ELEM);
  if (en > *worst_n) *worst_n = en;
  if (ee > *worst_e) *worst_e = ee;
}

static dense_config criteo_cfg(int interaction, int itself, int max_batch) {
  dense_config c = {0};
  c.n_dense = 13;
  int bot[] = {13, 512, 256, 64, 16}, top[] = {512, 256, 1};
  memcpy(c.bot, bot, sizeof bot);
  c.n_bot = 5;
  memcpy(c.top, top, sizeof top);
  c.n_top = 3;
  c.n_sparse = 26;
  c.emb_dim = 16;
  c.interaction = interaction;
  c.interaction_itself = itself;
  c.max_batch = max_batch;
  return c;
}

static void run_steps(const dense_config *cfg, int n, int steps) {
  char err[256];
  dense_model *mc = dense_model_create_on(cfg, 42, dense_backend_cpu(), err,
                                          sizeof err);
  ck_assert_msg(mc != NULL, "%s", err);
  dense_model *mg = dense_model_create_on(cfg, 42, cuda_be(), err, sizeof err);
  ck_assert_msg(mg != NULL, "%s", err);
  size_t np = 0, npg = 0;
  float *pc = dense_model_params(mc, &np), *pg = dense_model_params(mg, &npg);
  ck_assert_uint_eq(np, npg);
  ck_assert_msg(memcmp(pc, pg, np * 4) == 0, "initial parameters differ");
  size_t es = (size_t)cfg->n_sparse * cfg->emb_dim;
  float *x = malloc((size_t)n * cfg->n_dense * 4), *emb = malloc(n * es * 4);
  float *y = malloc(n * 4), *zc = malloc(n * 4), *zg = malloc(n * 4);
  float *dec = malloc(n * es * 4), *deg = malloc(n * es * 4);
  for (int s = 0; s < steps; s++) {
    fill_uniform(x, (size_t)n * cfg->n_dense, 100 + s, 0, 3);
    fill_uniform(emb, n * es, 200 + s, -0.2f, 0.2f);
    fill_uniform(y, n, 300 + s, 0, 1);
    for (int i = 0; i < n; i++) y[i] = y[i] < 0.25f ? 1.0f : 0.0f;
    ck_assert_int_eq(dense_model_forward(mc, n, x, emb, zc), 0);
    ck_assert_msg(dense_model_forward(mg, n, x, emb, zg) == 0, "%s",
                  dense_model_errmsg(mg));
    assert_close("logits", zg, zc, n, RTOL);
    double wl = elem_err(zg, zc, n), wn = 0, we = 0;
    float lc, lg;
    ck_assert_int_eq(dense_model_backward(mc, n, y, &lc, dec), 0);
    ck_assert_msg(dense_model_backward(mg, n, y, &lg, deg) == 0, "%s",
                  dense_model_errmsg(mg));
    ck_assert_msg(fabs(lc - lg) <= RTOL * fabs(lc), "loss cuda %.9g cpu %.9g",
                  lg, lc);
    float *gc = dense_model_grads(mc, NULL), *gg = dense_model_grads(mg, NULL);
    dense_tensor_info ti[64];
    int nt = dense_model_tensors(mc, ti, 64);
    for (int t = 0; t < nt; t++) { /* per tensor: each has its own scale */
      const float *g = gg + ti[t].offset, *w = gc + ti[t].offset;
      const size_t k = (size_t)ti[t].rows * ti[t].cols;
      if (t >= nt - 2) /* the last layer's: no ReLU after it, continuous */
        assert_close(ti[t].name, g, w, k, RTOL);
      else
        assert_grad_close(ti[t].name, s, g, w, k, &wn, &we);
    }
    assert_grad_close("d_emb", s, deg, dec, n * es, &wn, &we);
    fprintf(stderr,
            "batch %d step %d: logits %.2g of scale, loss %.2g; gradients "
            "worst %.2g normwise, %.2g of scale\n",
            n, s, wl, fabs(lc - lg) / fabs(lc), wn, we);
    for (size_t i = 0; i < np; i++) { /* SGD on both, from the CPU's grads */
      pc[i] -= 0.1f * gc[i];
      pg[i] -= 0.1f * gc[i];
    }
  }
  free(x), free(emb), free(y), free(zc), free(zg), free(dec), free(deg);
  dense_model_destroy(mc);
  dense_model_destroy(mg);
}

START_TEST(test_step_dot) {
  dense_config c = criteo_cfg(DENSE_INTERACT_DOT, 0, 2048);
  run_steps(&c, 2048, 5);
  run_steps(&c, 37, 2);
}
END_TEST

START_TEST(test_step_dot_itself) {
  dense_config c = criteo_cfg(DENSE_INTERACT_DOT, 1, 512);
  run_steps(&c, 500, 3);
}
END_TEST

START_TEST(test_step_cat) {
  dense_config c = criteo_cfg(DENSE_INTERACT_CAT, 0, 300);
  c.top[0] = 128;
  run_steps(&c, 300, 3);
}
END_TEST

START_TEST(test_default_backend_and_save) {
  dense_config c = criteo_cfg(DENSE_INTERACT_DOT, 0, 64);
  char err[256], path[] = "/tmp/sr-cuda-model-XXXXXX";
  dense_backend_set_default(cuda_be());
  dense_model *m = dense_model_create(&c, 7, err, sizeof err);
  dense_backend_set_default(NULL);
  ck_assert_msg(m != NULL, "%s", err);
  ck_assert_ptr_eq(dense_backend_default(), dense_backend_cpu());
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_msg(dense_state_save(path, m, NULL, err, sizeof err) == 0, "%s", err);
  dense_model *mc = dense_model_create(&c, 8, err, sizeof err);
  ck_assert_msg(dense_state_load(path, mc, NULL, err, sizeof err) == 0, "%s", err);
  size_t np;
  ck_assert(memcmp(dense_model_params(m, &np), dense_model_params(mc, NULL),
                   np * 4) == 0);
  /* the loaded CPU model and the CUDA model predict alike */
  float x[13 * 4], emb[4 * 26 * 16], zc[4], zg[4];
  fill_uniform(x, 13 * 4, 1, 0, 1);
  fill_uniform(emb, 4 * 26 * 16, 2, -0.1f, 0.1f);
  ck_assert_int_eq(dense_model_forward(m, 4, x, emb, zg), 0);
  ck_assert_int_eq(dense_model_forward(mc, 4, x, emb, zc), 0);
  assert_close("logits", zg, zc, 4, RTOL);
  unlink(path);
  dense_model_destroy(m);
  dense_model_destroy(mc);
}
END_TEST

/* Forward and backward through the model's own pinned batch buffers give
 * the bits that the caller's buffers give: a model that has just run other
 * inputs through its buffers takes a full batch written into the lent emb
 * buffer, against a second model of the same seed fed the same batch from
 * the caller's; the lent d_emb buffer, zeroed, receives the same d_emb. */
START_TEST(test_batch_buffers) {
  dense_config c = criteo_cfg(DENSE_INTERACT_DOT, 0, 256);
  char err[256];
  dense_model *m = dense_model_create_on(&c, 3, cuda_be(), err, sizeof err);
  dense_model *ref = dense_model_create_on(&c, 3, cuda_be(), err, sizeof err);
  ck_assert_msg(m != NULL && ref != NULL, "%s", err);
  float *pe = NULL, *pd = NULL;
  ck_assert_int_eq(dense_model_batch_buffers(m, &pe, &pd), 0);
  ck_assert(pe != NULL && pd != NULL && pe != pd);
  const int n = c.max_batch;
  size_t es = (size_t)c.n_sparse * c.emb_dim;
  float *x = malloc((size_t)n * c.n_dense * 4), *other = malloc(n * es * 4);
  float *emb = malloc(n * es * 4), *y = malloc(n * 4), *z0 = malloc(n * 4);
  float *z1 = malloc(n * 4), *d0 = malloc(n * es * 4), *scratch = malloc(n * es * 4);
  fill_uniform(x, (size_t)n * c.n_dense, 1, 0, 3);
  fill_uniform(other, n * es, 4, -0.2f, 0.2f);
  fill_uniform(emb, n * es, 2, -0.2f, 0.2f);
  fill_uniform(y, n, 3, 0, 1);
  float l0, l1;
  /* m first runs other inputs, so its device and lent buffers hold them */
  ck_assert_int_eq(dense_model_forward(m, n, x, other, z1), 0);
  ck_assert_int_eq(dense_model_backward(m, n, y, &l1, scratch), 0);
  ck_assert_int_eq(dense_model_forward(ref, n, x, emb, z0), 0);
  ck_assert_int_eq(dense_model_backward(ref, n, y, &l0, d0), 0);
  memcpy(pe, emb, n * es * 4);
  memset(pd, 0, n * es * 4);
  ck_assert_int_eq(dense_model_forward(m, n, x, pe, z1), 0);
  ck_assert_int_eq(dense_model_backward(m, n, y, &l1, pd), 0);
  ck_assert(memcmp(z0, z1, n * 4) == 0);
  ck_assert(l0 == l1);
  ck_assert(memcmp(d0, pd, n * es * 4) == 0);
  free(x), free(other), free(emb), free(y), free(z0), free(z1), free(d0), free(scratch);
  dense_model_destroy(m);
  dense_model_destroy(ref);
}
END_TEST

int main(void) {
  SR_SKIP_NO_GPU("test_cuda_model");
  Suite *s = suite_create("cuda_model");
  TCase *tc = tcase_create("step");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_step_dot);
  tcase_add_test(tc, test_step_dot_itself);
  tcase_add_test(tc, test_step_cat);
  tcase_add_test(tc, test_default_backend_and_save);
  tcase_add_test(tc, test_batch_buffers);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
