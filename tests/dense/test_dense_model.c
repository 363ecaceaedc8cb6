/* Whole dense model: gradient check against central finite differences of a
 * double-precision re-implementation of the forward written here (reading
 * the parameters through dense_model_tensors), determinism, initialisation
 * statistics, configuration errors, FLOP count (saving and loading:
 * test_dense_state_file.c).
 *
 * Finite differences: h = 1e-6 in double on each parameter and each pooled
 * embedding element. Tolerance per element (float32 analytic gradient):
 *   |analytic - fd| <= 1e-3 * |fd| + 1e-5 * max_k |fd_k|  (per tensor). */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"
#include "dense/model.h"
#include "tests/dense/dense_test_isa.h"

#define H 1e-6

static dense_config small_cfg(int interaction, int itself) {
  dense_config c = {0};
  c.n_dense = 4;
  c.n_bot = 3;
  c.bot[0] = 4, c.bot[1] = 6, c.bot[2] = 3;
  c.n_top = 3;
  c.top[0] = 5, c.top[1] = 4, c.top[2] = 1;
  c.n_sparse = 3;
  c.emb_dim = 3;
  c.interaction = interaction;
  c.interaction_itself = itself;
  c.max_batch = 8;
  return c;
}

/* small_cfg with a cross network of layers layers of rank rank. */
static dense_config small_dcn_cfg(int layers, int rank) {
  dense_config c = small_cfg(DENSE_INTERACT_DCN, 0);
  c.dcn_layers = layers, c.dcn_rank = rank;
  return c;
}

static dense_config kaggle_cfg(int max_batch) {
  dense_config c = {0};
  int bot[] = {13, 512, 256, 64, 16}, top[] = {512, 256, 1};
  c.n_dense = 13;
  c.n_bot = 5;
  memcpy(c.bot, bot, sizeof bot);
  c.n_top = 3;
  memcpy(c.top, top, sizeof top);
  c.n_sparse = 26;
  c.emb_dim = 16;
  c.interaction = DENSE_INTERACT_DOT;
  c.max_batch = max_batch;
  return c;
}

static void fill(sr_rng *r, float *a, size_t n, double s) {
  for (size_t i = 0; i < n; i++) a[i] = (float)(s * sr_rng_normal(r));
}

/* ---- double-precision forward ------------------------------------------- */

typedef struct {
  const dense_config *c;
  dense_tensor_info ti[2 * 2 * DENSE_MAX_LAYERS];
  int nt;
} dref;

/* The cross layers on x[W] in place (x holds x_0 on entry, x_L at return):
 * x_{l+1} = x_0 * (U (V x_l) + b) + x_l, tensors after the bottom ones. */
static void dcross(const dref *R, const double *P, double *x, int W) {
  const dense_config *c = R->c;
  double x0[1024], v[1024];
  memcpy(x0, x, sizeof(double) * W);
  for (int l = 0; l < c->dcn_layers; l++) {
    const dense_tensor_info *t = &R->ti[2 * (c->n_bot - 1) + 3 * l];
    for (int r = 0; r < t[0].rows; r++) {
      v[r] = 0;
      for (int k = 0; k < W; k++) v[r] += P[t[0].offset + (size_t)r * W + k] * x[k];
    }
    for (int w = 0; w < W; w++) {
      double q = P[t[2].offset + w];
      for (int r = 0; r < t[0].rows; r++) q += P[t[1].offset + (size_t)w * t[1].cols + r] * v[r];
      x[w] = x0[w] * q + x[w];
    }
  }
}

/* out[N] = act(W in + b) */
static void dlin(const double *P, const dense_tensor_info *W,
                 const dense_tensor_info *b, const double *in, int relu,
                 double *out) {
  for (int n = 0; n < W->rows; n++) {
    double z = P[b->offset + n];
    for (int k = 0; k < W->cols; k++) z += P[W->offset + (size_t)n * W->cols + k] * in[k];
    out[n] = relu && z < 0 ? 0 : z;
  }
}

static double dloss(const dref *R, const double *P, int n, const float *x,
                    const double *emb, const float *y) {
  const dense_config *c = R->c;
  double L = 0, a[1024], bvec[1024];
  int nb = c->n_bot - 1, d = c->bot[c->n_bot - 1], ni = c->n_sparse + 1;
  int nx = c->interaction == DENSE_INTERACT_DCN ? c->dcn_layers : 0, tt = 3 * nx;
  for (int s = 0; s < n; s++) {
    for (int k = 0; k < c->n_dense; k++) a[k] = x[s * c->n_dense + k];
    for (int l = 0; l < nb; l++) {
      dlin(P, &R->ti[2 * l], &R->ti[2 * l + 1], a, 1, bvec);
      memcpy(a, bvec, sizeof(double) * R->ti[2 * l].rows);
    }
    /* a = x_bot[d]; build R */
    const double *e = emb + (size_t)s * c->n_sparse * c->emb_dim;
    double Rv[1024];
    int p = 0;
    for (int k = 0; k < d; k++) Rv[p++] = a[k];
    if (c->interaction == DENSE_INTERACT_DOT) {
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < i + (c->interaction_itself ? 1 : 0); j++) {
          const double *ti = i ? e + (i - 1) * d : a, *tj = j ? e + (j - 1) * d : a;
          double z = 0;
          for (int k = 0; k < d; k++) z += ti[k] * tj[k];
          Rv[p++] = z;
        }
    } else {
      for (int k = 0; k < c->n_sparse * c->emb_dim; k++) Rv[p++] = e[k];
      if (nx) dcross(R, P, Rv, p);
    }
    memcpy(a, Rv, sizeof(double) * p);
    for (int l = nb; l < nb + c->n_top; l++) {
      dlin(P, &R->ti[2 * l + tt], &R->ti[2 * l + 1 + tt], a, l + 1 < nb + c->n_top, bvec);
      memcpy(a, bvec, sizeof(double) * R->ti[2 * l + tt].rows);
    }
    double z = a[0], yy = y[s];
    L += (z > 0 ? z : 0) - z * yy + log1p(exp(-fabs(z)));
  }
  return L / n;
}

static void check_tensor(const char *what, const float *an, const double *fd,
                         size_t n) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(fd[i]));
  ck_assert_msg(scale > 0, "%s: zero gradient, vacuous", what);
  for (size_t i = 0; i < n; i++) {
    double tol = 1e-3 * fabs(fd[i]) + 1e-5 * scale;
    ck_assert_msg(fabs(an[i] - fd[i]) <= tol,
                  "%s[%zu]: analytic %.9g vs finite difference %.9g (tol %.3g)",
                  what, i, an[i], fd[i], tol);
  }
}

static void run_grad(dense_config c) {
  char err[256];
  dense_model *m = dense_model_create(&c, 42, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  float *lent_e = NULL, *lent_d = NULL; /* the CPU model lends no batch buffers */
  ck_assert_int_eq(dense_model_batch_buffers(m, &lent_e, &lent_d), -1);
  ck_assert(lent_e == NULL && lent_d == NULL);
  enum { N = 6 };
  size_t es = (size_t)c.n_sparse * c.emb_dim;
  float x[N * 4], emb[N * 9], y[N], d_emb[N * 9], logits[N], loss;
  sr_rng r;
  sr_rng_init(&r, 7, 1);
  fill(&r, x, N * 4, 1.0);
  fill(&r, emb, N * es, 0.7);
  for (int i = 0; i < N; i++) y[i] = (float)(i % 2);
  dense_tensor_info ti[2 * 2 * DENSE_MAX_LAYERS];
  int nt = dense_model_tensors(m, ti, 2 * 2 * DENSE_MAX_LAYERS);
  for (int t = 0; t < nt; t++) /* cross biases start at 0: a missing bias would not show */
    if (!strncmp(ti[t].name, "cross.", 6) && ti[t].cols == 1)
      fill(&r, dense_model_params(m, NULL) + ti[t].offset, (size_t)ti[t].rows, 0.5);
  ck_assert_int_eq(dense_model_forward(m, N, x, emb, logits), 0);
  ck_assert_int_eq(dense_model_backward(m, N, y, &loss, d_emb), 0);

  size_t np, ng;
  float *pf = dense_model_params(m, &np), *gf = dense_model_grads(m, &ng);
  ck_assert_uint_eq(np, ng);
  ck_assert_uint_eq(np, dense_config_param_count(&c));
  dref R = {.c = &c};
  R.nt = dense_model_tensors(m, R.ti, 2 * 2 * DENSE_MAX_LAYERS);
  ck_assert_int_eq(R.nt, 2 * (c.n_bot - 1 + c.n_top) + 3 * c.dcn_layers);
  double *P = malloc(np * sizeof *P), *E = malloc(N * es * sizeof *E);
  double *fd = malloc((np > N * es ? np : N * es) * sizeof *fd);
  for (size_t i = 0; i < np; i++) P[i] = pf[i];
  for (size_t i = 0; i < N * es; i++) E[i] = emb[i];

  double L = dloss(&R, P, N, x, E, y);
  ck_assert_msg(fabs(loss - L) <= 1e-6 * fabs(L), "loss %.9g vs %.12g", loss, L);

  for (int t = 0; t < R.nt; t++) {
    size_t off = R.ti[t].offset, cnt = (size_t)R.ti[t].rows * R.ti[t].cols;
    for (size_t i = 0; i < cnt; i++) {
      double keep = P[off + i];
      P[off + i] = keep + H;
      double lp = dloss(&R, P, N, x, E, y);
      P[off + i] = keep - H;
      double lm = dloss(&R, P, N, x, E, y);
      P[off + i] = keep;
      fd[i] = (lp - lm) / (2 * H);
    }
    check_tensor(R.ti[t].name, gf + off, fd, cnt);
  }
  for (size_t i = 0; i < N * es; i++) {
    double keep = E[i];
    E[i] = keep + H;
    double lp = dloss(&R, P, N, x, E, y);
    E[i] = keep - H;
    double lm = dloss(&R, P, N, x, E, y);
    E[i] = keep;
    fd[i] = (lp - lm) / (2 * H);
  }
  check_tensor("d_emb", d_emb, fd, N * es);
  free(P);
  free(E);
  free(fd);
  dense_model_destroy(m);
}

static void run_model_grad(int interaction, int itself) {
  run_grad(small_cfg(interaction, itself));
}

START_TEST(test_grad_dot) { run_model_grad(DENSE_INTERACT_DOT, 0); }
END_TEST
START_TEST(test_grad_dot_itself) { run_model_grad(DENSE_INTERACT_DOT, 1); }
END_TEST
START_TEST(test_grad_cat) { run_model_grad(DENSE_INTERACT_CAT, 0); }
END_TEST
/* The cross network: one layer (the top layer is also x_0's), three of a
 * rank below the width (12), two of a rank above it. Every V, U, b, the
 * MLPs' tensors and d_emb against finite differences (the biases, zero at
 * creation, are set off zero first: run_grad). */
START_TEST(test_grad_dcn) {
  run_grad(small_dcn_cfg(1, 3));
  run_grad(small_dcn_cfg(3, 2));
  run_grad(small_dcn_cfg(2, 16));
}
END_TEST

/* ---- determinism ---------------------------------------------------------- */

START_TEST(test_determinism) {
  dense_config c = kaggle_cfg(256);
  char err[256];
  dense_model *a = dense_model_create(&c, 1234, err, sizeof err);
  dense_model *b = dense_model_create(&c, 1234, err, sizeof err);
  dense_model *o = dense_model_create(&c, 1235, err, sizeof err);
  ck_assert(a && b && o);
  size_t n;
  float *pa = dense_model_params(a, &n), *pb = dense_model_params(b, NULL);
  ck_assert(memcmp(pa, pb, n * sizeof(float)) == 0);
  ck_assert(memcmp(pa, dense_model_params(o, NULL), n * sizeof(float)) != 0);

  enum { B = 256 };
  float *x = malloc(B * 13 * 4), *e = malloc(B * 416 * 4), y[B];
  float *de1 = malloc(B * 416 * 4), *de2 = malloc(B * 416 * 4);
  float z1[B], z2[B], l1, l2;
  float *g1 = malloc(n * 4);
  sr_rng r;
  sr_rng_init(&r, 5, 5);
  fill(&r, x, B * 13, 1.0);
  fill(&r, e, B * 416, 0.1);
  for (int i = 0; i < B; i++) y[i] = (float)(sr_rng_u32(&r) & 1);
  ck_assert_int_eq(dense_model_forward(a, B, x, e, z1), 0);
  ck_assert_int_eq(dense_model_backward(a, B, y, &l1, de1), 0);
  memcpy(g1, dense_model_grads(a, NULL), n * 4);
  ck_assert_int_eq(dense_model_forward(a, B, x, e, z2), 0);
  ck_assert_int_eq(dense_model_backward(a, B, y, &l2, de2), 0);
  ck_assert(memcmp(z1, z2, sizeof z1) == 0);
  ck_assert(memcmp(&l1, &l2, 4) == 0);
  ck_assert(memcmp(de1, de2, B * 416 * 4) == 0);
  ck_assert(memcmp(g1, dense_model_grads(a, NULL), n * 4) == 0);
  /* the other model of the same seed gives the same bits too */
  ck_assert_int_eq(dense_model_forward(b, B, x, e, z2), 0);
  ck_assert(memcmp(z1, z2, sizeof z1) == 0);
  /* backward without a matching forward is refused */
  ck_assert_int_eq(dense_model_backward(o, B, y, &l2, de2), SR_ESTATE);
  ck_assert_int_eq(dense_model_forward(o, B + 1, x, e, z2), SR_EINVAL);
  free(x), free(e), free(de1), free(de2), free(g1);
  dense_model_destroy(a);
  dense_model_destroy(b);
  dense_model_destroy(o);
  dense_model_destroy(NULL);
}
END_TEST

/* ---- the backward's ready hook ---------------------------------------- */

/* What the hook saw: its calls, the loss and d_emb it was handed, and
 * whether the bottom MLP's first weight gradient was still unwritten (the
 * buffer's poison) while the top MLP's last was already written. */
typedef struct {
  int calls, rc;
  float loss;
  const float *d_emb;
  float *seen;
  size_t n_emb;
  const float *grads;
  size_t bot_off, bot_n, top_off, top_n;
  int bot_unwritten, top_written;
} ready_seen;

static int all_poison(const float *a, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &a[i], 4);
    if (u != 0xffffffffu) return 0;
  }
  return 1;
}

static int on_ready(void *ctx, float loss) {
  ready_seen *r = ctx;
  r->calls++;
  r->loss = loss;
  memcpy(r->seen, r->d_emb, r->n_emb * sizeof(float));
  r->bot_unwritten = all_poison(r->grads + r->bot_off, r->bot_n);
  r->top_written = !all_poison(r->grads + r->top_off, r->top_n);
  return r->rc;
}

/* dense_model_backward_ready gives dense_model_backward's bits, and calls
 * its hook once, with the loss and the whole d_emb, after the top MLP's
 * backward and before the bottom MLP's; the hook's error stops it. dot,
 * cat and dcn. */
START_TEST(test_backward_ready) {
  enum { B = 8 };
  dense_config cs[3] = {small_cfg(DENSE_INTERACT_DOT, 0), small_cfg(DENSE_INTERACT_CAT, 0),
                        small_dcn_cfg(2, 2)};
  for (int k = 0; k < 3; k++) {
    char err[256];
    dense_model *m = dense_model_create(&cs[k], 77, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    size_t np, ne = (size_t)B * cs[k].n_sparse * cs[k].emb_dim;
    float *grads = dense_model_grads(m, &np);
    dense_tensor_info ti[4 * DENSE_MAX_LAYERS];
    int nt = dense_model_tensors(m, ti, 4 * DENSE_MAX_LAYERS);
    ready_seen r = {.n_emb = ne, .grads = grads};
    for (int i = 0; i < nt; i++) {
      size_t sz = (size_t)ti[i].rows * ti[i].cols;
      if (!strcmp(ti[i].name, "bot.0.W")) r.bot_off = ti[i].offset, r.bot_n = sz;
      if (ti[i].name[0] == 't' && strstr(ti[i].name, ".W")) r.top_off = ti[i].offset, r.top_n = sz;
    }
    ck_assert(r.bot_n > 0 && r.top_n > 0);
    float x[B * 4], *e = malloc(ne * 4), y[B], *de0 = malloc(ne * 4), *de1 = malloc(ne * 4);
    float *g0 = malloc(np * 4), z[B], l0, l1;
    r.seen = malloc(ne * 4);
    sr_rng g;
    sr_rng_init(&g, 9, (uint64_t)k);
    fill(&g, x, B * 4, 1.0);
    fill(&g, e, ne, 0.3);
    for (int i = 0; i < B; i++) y[i] = (float)(i & 1);
    ck_assert_int_eq(dense_model_forward(m, B, x, e, z), 0);
    ck_assert_int_eq(dense_model_backward(m, B, y, &l0, de0), 0);
    memcpy(g0, grads, np * 4);
    memset(grads, 0xff, np * 4);
    r.d_emb = de1;
    ck_assert_int_eq(dense_model_backward_ready(m, B, y, &l1, de1, on_ready, &r), 0);
    ck_assert_int_eq(r.calls, 1);
    ck_assert(r.bot_unwritten && r.top_written);
    ck_assert(memcmp(&r.loss, &l0, 4) == 0 && memcmp(&l1, &l0, 4) == 0);
    ck_assert(memcmp(r.seen, de0, ne * 4) == 0);
    ck_assert(memcmp(de1, de0, ne * 4) == 0);
    ck_assert(memcmp(grads, g0, np * 4) == 0);
    /* The hook's error is the backward's; the bottom MLP is not run. */
    memset(grads, 0xff, np * 4);
    r.rc = SR_ERANGE;
    ck_assert_int_eq(dense_model_backward_ready(m, B, y, NULL, de1, on_ready, &r), SR_ERANGE);
    ck_assert_int_eq(r.calls, 2);
    ck_assert(all_poison(grads + r.bot_off, r.bot_n));
    free(e), free(de0), free(de1), free(g0), free(r.seen);
    dense_model_destroy(m);
  }
}
END_TEST

/* A backend that is a copy of a CPU kernel set runs the layers op by op
 * (the products alone, then their bias, ReLU and gathers: dense/layers.h's
 * fallbacks) and gives the bits of the kernel set itself, which runs them
 * inside the products' and the interaction's tasks: dot, cat and dcn. */
START_TEST(test_op_by_op_same_bits) {
  enum { B = 256 };
  const int kinds[3] = {DENSE_INTERACT_DOT, DENSE_INTERACT_CAT, DENSE_INTERACT_DCN};
  dense_backend copy = *dense_test_be;
  float *x = malloc(B * 13 * 4), *e = malloc(B * 416 * 4), y[B];
  sr_rng r;
  sr_rng_init(&r, 9, 9);
  fill(&r, x, B * 13, 1.0);
  fill(&r, e, B * 416, 0.1);
  for (int i = 0; i < B; i++) y[i] = (float)(sr_rng_u32(&r) & 1);
  for (int k = 0; k < 3; k++) {
    dense_config c = kaggle_cfg(B);
    c.interaction = kinds[k];
    if (kinds[k] == DENSE_INTERACT_DCN) c.dcn_layers = 2, c.dcn_rank = 64;
    char err[256];
    dense_model *m[2] = {dense_model_create_on(&c, 77, dense_test_be, err, sizeof err),
                         dense_model_create_on(&c, 77, &copy, err, sizeof err)};
    ck_assert_msg(m[0] && m[1], "%s", err);
    float z[2][B], loss[2], *de[2];
    for (int i = 0; i < 2; i++) {
      de[i] = malloc(B * 416 * 4);
      ck_assert_int_eq(dense_model_forward(m[i], B, x, e, z[i]), 0);
      ck_assert_int_eq(dense_model_backward(m[i], B, y, &loss[i], de[i]), 0);
    }
    size_t n;
    const float *g0 = dense_model_grads(m[0], &n);
    ck_assert_msg(!memcmp(z[0], z[1], sizeof z[0]), "interaction %d: logits differ", kinds[k]);
    ck_assert(!memcmp(&loss[0], &loss[1], sizeof loss[0]));
    ck_assert_msg(!memcmp(de[0], de[1], B * 416 * 4), "interaction %d: d_emb differs", kinds[k]);
    ck_assert_msg(!memcmp(g0, dense_model_grads(m[1], NULL), n * 4),
                  "interaction %d: gradients differ", kinds[k]);
    for (int i = 0; i < 2; i++) free(de[i]), dense_model_destroy(m[i]);
  }
  free(x), free(e);
}
END_TEST

/* ---- initialisation as the reference --------------------------------------- */

START_TEST(test_init_stats) {
  dense_config c = kaggle_cfg(1);
  char err[256];
  dense_model *m = dense_model_create(&c, 99, err, sizeof err);
  ck_assert(m);
  dense_tensor_info ti[16];
  int nt = dense_model_tensors(m, ti, 16);
  ck_assert_int_eq(nt, 14);
  ck_assert_str_eq(ti[0].name, "bot.0.W");
  ck_assert_int_eq(ti[0].rows, 512);
  ck_assert_int_eq(ti[0].cols, 13);
  ck_assert_str_eq(ti[8].name, "top.0.W");
  ck_assert_int_eq(ti[8].cols, 367); /* 16 + 27*26/2 */
  ck_assert_uint_eq(ti[0].offset, 0);
  ck_assert_uint_eq(ti[1].offset, 512 * 13);
  float *p = dense_model_params(m, NULL);
  for (int t = 0; t < nt; t++) {
    size_t cnt = (size_t)ti[t].rows * ti[t].cols;
    if (cnt < 200) continue; /* too few for a statistic */
    int is_b = ti[t].cols == 1;
    int fan_out = ti[t].rows, fan_in = is_b ? 0 : ti[t].cols;
    double want = is_b ? sqrt(1.0 / fan_out) : sqrt(2.0 / (fan_in + fan_out));
    double s = 0, s2 = 0;
    for (size_t i = 0; i < cnt; i++) s += p[ti[t].offset + i], s2 += (double)p[ti[t].offset + i] * p[ti[t].offset + i];
    double mean = s / cnt, sd = sqrt(s2 / cnt - mean * mean);
    double se = want / sqrt((double)cnt);
    ck_assert_msg(fabs(mean) < 5 * se, "%s mean %g", ti[t].name, mean);
    ck_assert_msg(fabs(sd / want - 1) < 5 / sqrt(2.0 * cnt) + 1e-3,
                  "%s sd %g want %g", ti[t].name, sd, want);
  }
  /* documented derivation: layer l draws W from stream 2l, b from 2l+1 */
  sr_rng r;
  sr_rng_init(&r, sr_mix64(99 ^ DENSE_INIT_SALT), 2 * 4 + 1); /* top.0.b: layer 4 */
  ck_assert_str_eq(ti[9].name, "top.0.b");
  for (int i = 0; i < 512; i++)
    ck_assert(p[ti[9].offset + i] == (float)(sqrt(1.0 / 512) * sr_rng_normal(&r)));
  dense_model_destroy(m);
}
END_TEST

/* ---- configuration -------------------------------------------------------- */

START_TEST(test_config_errors) {
  char err[256];
  dense_config c = kaggle_cfg(4);
  c.bot[4] = 32; /* last bottom width != emb_dim for dot */
  c.bot[3] = 64;
  ck_assert(dense_model_create(&c, 1, err, sizeof err) == NULL);
  ck_assert_msg(strstr(err, "embedding dimension") != NULL, "%s", err);
  c.interaction = DENSE_INTERACT_CAT; /* fine for cat: 32 + 26*16 */
  ck_assert_int_eq(dense_config_top_input(&c), 32 + 416);
  dense_model *m = dense_model_create(&c, 1, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  dense_model_destroy(m);
  c = kaggle_cfg(4);
  c.top[2] = 2;
  ck_assert(dense_model_create(&c, 1, err, sizeof err) == NULL);
  ck_assert_msg(strstr(err, "width 1") != NULL, "%s", err);
  c = kaggle_cfg(4);
  c.bot[0] = 12;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "dense features") != NULL, "%s", err);
  c = kaggle_cfg(0);
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  c = kaggle_cfg(4);
  c.interaction_itself = 1;
  ck_assert_int_eq(dense_config_top_input(&c), 16 + 27 * 26 / 2 + 27);
}
END_TEST

START_TEST(test_flops_and_shapes) {
  dense_config c = kaggle_cfg(2048);
  double f = dense_model_flops_per_sample(&c);
  /* MLP forward 948736, backward 2*948736 - 2*13*512, dot 6*16*351 */
  ck_assert(f == 948736.0 * 3 - 2.0 * 13 * 512 + 6.0 * 16 * 351);
  dense_gemm_shape s[64];
  int n = dense_model_gemm_shapes(&c, 2048, s, 64);
  ck_assert_int_eq(n, 7 + 7 + 6);
  ck_assert(s[0].M == 2048 && s[0].N == 512 && s[0].K == 13 && s[0].trans_b);
  double g = 0;
  for (int i = 0; i < n; i++) g += 2.0 * s[i].M * s[i].N * s[i].K;
  ck_assert(g == (f - 6.0 * 16 * 351) * 2048);
}
END_TEST

/* ---- the cross network: layout, initialisation, checks, FLOPs ------------- */

static dense_config dcn_mid_cfg(int interaction) {
  dense_config c = {0};
  int bot[] = {13, 64, 16}, top[] = {128, 1};
  c.n_dense = 13, c.n_bot = 3, c.n_top = 2;
  memcpy(c.bot, bot, sizeof bot);
  memcpy(c.top, top, sizeof top);
  c.n_sparse = 26, c.emb_dim = 16, c.max_batch = 4;
  c.interaction = interaction;
  if (interaction == DENSE_INTERACT_DCN) c.dcn_layers = 2, c.dcn_rank = 64;
  return c;
}

START_TEST(test_dcn_layout_init) {
  dense_config c = dcn_mid_cfg(DENSE_INTERACT_DCN), d = dcn_mid_cfg(DENSE_INTERACT_DOT);
  enum { W = 27 * 16 };
  ck_assert_int_eq(dense_config_top_input(&c), W);
  ck_assert_uint_eq(dense_config_param_count(&c),
                    13 * 64 + 64 + 64 * 16 + 16 + 2 * (2 * 64 * W + W) + W * 128 + 128 + 128 + 1);
  char err[256];
  dense_model *m = dense_model_create(&c, 77, err, sizeof err);
  dense_model *o = dense_model_create(&d, 77, err, sizeof err);
  ck_assert_msg(m && o, "%s", err);
  dense_tensor_info ti[16];
  ck_assert_int_eq(dense_model_tensors(m, ti, 16), 4 + 6 + 4);
  const char *names[] = {"bot.0.W", "bot.0.b", "bot.1.W", "bot.1.b", "cross.0.V", "cross.0.U",
                         "cross.0.b", "cross.1.V", "cross.1.U", "cross.1.b", "top.0.W"};
  size_t off = 0;
  for (int t = 0; t < 11; t++) { /* in buffer order, back to back */
    ck_assert_str_eq(ti[t].name, names[t]);
    ck_assert_uint_eq(ti[t].offset, off);
    off += (size_t)ti[t].rows * ti[t].cols;
  }
  ck_assert(ti[4].rows == 64 && ti[4].cols == W && ti[5].rows == W && ti[5].cols == 64);
  ck_assert(ti[6].rows == W && ti[6].cols == 1 && ti[10].cols == W);
  float *p = dense_model_params(m, NULL);
  /* the bottom MLP draws as in the dot model of the same seed */
  ck_assert(!memcmp(p, dense_model_params(o, NULL), (13 * 64 + 64 + 64 * 16 + 16) * sizeof(float)));
  /* cross.1.U: stream 2*1+1 of the cross key, N(0, sqrt(2/(W+rank))); biases zero */
  sr_rng r;
  sr_rng_init(&r, sr_mix64(77 ^ DENSE_CROSS_SALT), 3);
  for (int i = 0; i < W * 64; i++)
    ck_assert(p[ti[8].offset + i] == (float)(sqrt(2.0 / (W + 64)) * sr_rng_normal(&r)));
  for (int i = 0; i < W; i++) ck_assert(p[ti[6].offset + i] == 0 && p[ti[9].offset + i] == 0);
  double s2 = 0;
  for (int i = 0; i < 64 * W; i++) s2 += (double)p[ti[4].offset + i] * p[ti[4].offset + i];
  ck_assert_msg(fabs(sqrt(s2 / (64 * W)) / sqrt(2.0 / (W + 64)) - 1) < 0.02, "cross.0.V sd");
  dense_model_destroy(m);
  dense_model_destroy(o);
}
END_TEST

START_TEST(test_dcn_config_errors) {
  char err[256];
  dense_config c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  c.bot[2] = 32;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "dcn interaction needs the last bottom MLP width (32)"), "%s", err);
  c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  c.dcn_layers = 0;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "cross layers (got 0)"), "%s", err);
  c.dcn_layers = DENSE_MAX_CROSS + 1;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  c.dcn_rank = 0;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "rank 1..65536 (got 0)"), "%s", err);
  c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  c.interaction_itself = 1;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  c = dcn_mid_cfg(DENSE_INTERACT_DOT);
  c.dcn_layers = 3;
  ck_assert_int_eq(dense_config_validate(&c, err, sizeof err), SR_EINVAL);
  ck_assert_msg(strstr(err, "apply to the dcn interaction only"), "%s", err);
  /* a backend without the cross kernels (a device backend's, say) is refused */
  dense_backend nocross = *dense_test_be;
  nocross.cross_forward = NULL;
  c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  ck_assert_ptr_null(dense_model_create_on(&c, 1, &nocross, err, sizeof err));
  ck_assert_msg(strstr(err, "runs on the CPU only") && strstr(err, "--device cpu"), "%s", err);
  c = dcn_mid_cfg(DENSE_INTERACT_DOT); /* the other interactions do not need them */
  dense_model *m = dense_model_create_on(&c, 1, &nocross, err, sizeof err);
  ck_assert_msg(m != NULL, "%s", err);
  dense_model_destroy(m);
}
END_TEST

START_TEST(test_dcn_flops_and_shapes) {
  dense_config c = dcn_mid_cfg(DENSE_INTERACT_DCN);
  enum { W = 27 * 16, B = 512 };
  double f = dense_model_flops_per_sample(&c);
  double mlp = 13 * 64 + 64 * 16 + W * 128 + 128;
  ck_assert(f == 6.0 * mlp - 2.0 * 13 * 64 + 2 * 12.0 * W * 64);
  dense_gemm_shape s[64];
  int n = dense_model_gemm_shapes(&c, B, s, 64);
  ck_assert_int_eq(n, (2 + 2 * 2 + 2) + (2 * 2 + 2 * 4 + 2 + 1));
  /* forward: bottom, cross 0 (V then U), cross 1, top */
  ck_assert(s[2].M == B && s[2].N == 64 && s[2].K == W && !s[2].trans_a && s[2].trans_b);
  ck_assert(s[3].M == B && s[3].N == W && s[3].K == 64 && s[3].trans_b);
  ck_assert(s[6].N == 128 && s[6].K == W);
  /* backward: top 1 (dW, din), top 0 (dW, din), then cross: dU, dp, dV, dx */
  ck_assert(s[12].trans_a && s[12].M == W && s[12].N == 64 && s[12].K == B);
  ck_assert(s[15].M == B && s[15].N == W && s[15].K == 64);
  double g = 0;
  for (int i = 0; i < n; i++) g += 2.0 * s[i].M * s[i].N * s[i].K;
  ck_assert(g == f * B);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dense_model");
  TCase *t = tcase_create("model");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_grad_dot);
  tcase_add_test(t, test_grad_dot_itself);
  tcase_add_test(t, test_grad_cat);
  tcase_add_test(t, test_grad_dcn);
  tcase_add_test(t, test_determinism);
  tcase_add_test(t, test_backward_ready);
  tcase_add_test(t, test_op_by_op_same_bits);
  tcase_add_test(t, test_init_stats);
  tcase_add_test(t, test_config_errors);
  tcase_add_test(t, test_flops_and_shapes);
  tcase_add_test(t, test_dcn_layout_init);
  tcase_add_test(t, test_dcn_config_errors);
  tcase_add_test(t, test_dcn_flops_and_shapes);
  suite_add_tcase(s, t);
  return s;
}

int main(int argc, char **argv) {
  dense_test_isa_args(argc, argv);
  return sr_check_run(suite());
}
