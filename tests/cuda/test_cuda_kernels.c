/* Every CUDA kernel against the CPU backend (the reference), on random data.
 * Tolerance: 1e-5 relative (assert_close) for everything; the element-wise
 * kernels and the optimizers are expected to give the CPU's bits (no FMA
 * contraction on either side) and are checked for that too. */
#include <check.h>

#include "tests/check_main.h"
#include <stdlib.h>
#include <string.h>

#include "dense/backend.h"
#include "dense/optim.h"
#include "gpu_skip.h"

#define RTOL 1e-5

static void check_gemm(int ta, int tb, int M, int N, int K) {
  const dense_backend *cpu = dense_backend_cpu(), *gpu = cuda_be();
  int lda = ta ? M + 3 : K + 3, ldb = tb ? K + 1 : N + 1, ldc = N + 2;
  size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
         nc = (size_t)M * ldc;
  float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4),
        *Cg = malloc(nc * 4);
  fill_uniform(A, na, 1, -1, 1);
  fill_uniform(B, nb, 2, -1, 1);
  fill_uniform(C, nc, 3, -1, 1);
  float *dA = to_dev(A, na), *dB = to_dev(B, nb), *dC = to_dev(C, nc);
  cpu->gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, ldc);
  gpu->gemm(ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, ldc);
  from_dev(Cg, dC, nc);
  char what[64];
  snprintf(what, sizeof what, "gemm(%d,%d,%d,%d,%d)", ta, tb, M, N, K);
  assert_close(what, Cg, C, nc, RTOL);
  dense_cuda_free(dA), dense_cuda_free(dB), dense_cuda_free(dC);
  free(A), free(B), free(C), free(Cg);
}

START_TEST(test_gemm) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      check_gemm(ta, tb, 37, 29, 61);
      check_gemm(ta, tb, 1024, 256, 512); /* a DLRM layer's shape */
      check_gemm(ta, tb, 1, 1, 367);
    }
}
END_TEST

START_TEST(test_bias_act) {
  const dense_backend *cpu = dense_backend_cpu(), *gpu = cuda_be();
  int B = 333, N = 77;
  size_t n = (size_t)B * N;
  float *y = malloc(n * 4), *yg = malloc(n * 4), bias[77];
  fill_uniform(bias, N, 4, -1, 1);
  float *db = to_dev(bias, N);
  for (int relu = 0; relu < 2; relu++) {
    fill_uniform(y, n, 5 + relu, -2, 2);
    float *dy = to_dev(y, n);
    cpu->bias_act_forward(B, N, bias, relu, y);
    gpu->bias_act_forward(B, N, db, relu, dy);
    from_dev(yg, dy, n);
    ck_assert_msg(memcmp(y, yg, n * 4) == 0, "bias_act relu=%d not bitwise",
                  relu);
    dense_cuda_free(dy);
  }
  dense_cuda_free(db);
  free(y), free(yg);
}
END_TEST

START_TEST(test_relu_bias_grad) {
  const dense_backend *cpu = dense_backend_cpu(), *gpu = cuda_be();
  int Bs[3] = {50, 1000, 4099};
  for (int bi = 0; bi < 3; bi++)
    for (int relu = 0; relu < 2; relu++) {
      int B = Bs[bi], N = 129, ld = 140;
      size_t n = (size_t)B * ld;
      float *y = malloc(n * 4), *dy = malloc(n * 4), *dyg = malloc(n * 4);
      float db[129], dbg[129];
      fill_uniform(y, n, 7, -1, 1);
      fill_uniform(dy, n, 8, -1, 1);
      float *d_y = to_dev(y, n), *d_dy = to_dev(dy, n), *d_db = to_dev(db, N);
      cpu->relu_bias_grad(B, N, ld, relu ? y : NULL, dy, db);
      gpu->relu_bias_grad(B, N, ld, relu ? d_y : NULL, d_dy, d_db);
      from_dev(dyg, d_dy, n);
      from_dev(dbg, d_db, N);
      ck_assert_msg(memcmp(dy, dyg, n * 4) == 0, "ReLU backward not bitwise");
      assert_close("db", dbg, db, N, RTOL);
      if (B <= 64) /* one chunk: the CPU's order */
        ck_assert_msg(memcmp(db, dbg, sizeof db) == 0, "db not bitwise");
      dense_cuda_free(d_y), dense_cuda_free(d_dy), dense_cuda_free(d_db);
      free(y), free(dy), free(dyg);
    }
}
END_TEST

static void check_interact(int B, int ni, int d, int itself) {
  const dense_backend *cpu = dense_backend_cpu(), *gpu = cuda_be();
  int width = d + ni * (ni - 1) / 2 + (itself ? ni : 0), rs = width + 3;
  size_t nt = (size_t)B * ni * d, nr = (size_t)B * rs;
  float *T = malloc(nt * 4), *R = calloc(nr, 4), *Rg = malloc(nr * 4);
  float *dR = malloc(nr * 4), *dT = malloc(nt * 4), *dTg = malloc(nt * 4);
  fill_uniform(T, nt, 9, -1, 1);
  fill_uniform(dR, nr, 10, -1, 1);
  float *d_T = to_dev(T, nt), *d_R = to_dev(R, nr), *d_dR = to_dev(dR, nr),
        *d_dT = to_dev(dT, nt);
  cpu->interact_dot_forward(B, ni, d, itself, T, R, rs);
  gpu->interact_dot_forward(B, ni, d, itself, d_T, d_R, rs);
  from_dev(Rg, d_R, nr);
  for (int b = 0; b < B; b++) /* only the first width of each row is written */
    assert_close("interact R", Rg + (size_t)b * rs, R + (size_t)b * rs, width,
                 RTOL);
  cpu->interact_dot_backward(B, ni, d, itself, T, dR, rs, dT);
  gpu->interact_dot_backward(B, ni, d, itself, d_T, d_dR, rs, d_dT);
  from_dev(dTg, d_dT, nt);
  assert_close("interact dT", dTg, dT, nt, RTOL);
  dense_cuda_free(d_T), dense_cuda_free(d_R), dense_cuda_free(d_dR),
      dense_cuda_free(d_dT);
  free(T), free(R), free(Rg), free(dR), free(dT), free(dTg);
}

START_TEST(test_interact) {
  for (int itself = 0; itself < 2; itself++) {
    check_interact(300, 27, 16, itself); /* Criteo: 26 tables + dense */
    check_interact(17, 5, 7, itself);
    check_interact(3, 1, 4, itself);
  }
}
END_TEST

START_TEST(test_bce) {
  const dense_backend *cpu = dense_backend_cpu(), *gpu = cuda_be();
  int B = 5000;
  float *z = malloc(B * 4), *y = malloc(B * 4), *dz = malloc(B * 4),
        *dzg = malloc(B * 4);
  fill_uniform(z, B, 11, -30, 30);
  fill_uniform(y, B, 12, 0, 1);
  for (int i = 0; i < B; i++) y[i] = y[i] < 0.3f ? 1.0f : 0.0f;
  float *d_z = to_dev(z, B), *d_y = to_dev(y, B), *d_dz = to_dev(dz, B);
  double lc = cpu->bce_logits(B, z, y, dz);
  double lg = gpu->bce_logits(B, d_z, d_y, d_dz);
  from_dev(dzg, d_dz, B);
  ck_assert_msg(fabs(lc - lg) <= 1e-12 * fabs(lc), "loss cuda %.17g cpu %.17g",
                lg, lc);
  assert_close("dz", dzg, dz, B, RTOL);
  dense_cuda_free(d_z), dense_cuda_free(d_y), dense_cuda_free(d_dz);
  free(z), free(y), free(dz), free(dzg);
}
END_TEST

START_TEST(test_optimizers) {
  cuda_be();
  size_t n = 100003;
  for (int k = DENSE_OPT_SGD; k <= DENSE_OPT_ADAM; k++) {
    dense_opt_config cfg = dense_opt_defaults((dense_opt_kind)k);
    char err[128];
    dense_opt *o = dense_opt_create(&cfg, n, err, sizeof err);
    ck_assert_msg(o != NULL, "%s", err);
    size_t ns = 0;
    float *st = dense_opt_state(o, &ns);
    float *p = malloc(n * 4), *g = malloc(n * 4), *pg = malloc(n * 4),
          *sg = malloc((ns + 1) * 4);
    fill_uniform(p, n, 13, -1, 1);
    float *d_p = to_dev(p, n), *d_g = to_dev(p, n), *d_s = to_dev(st, ns);
    for (int step = 1; step <= 3; step++) {
      fill_uniform(g, n, 20 + step, -0.1f, 0.1f);
      ck_assert_int_eq(dense_cuda_upload(d_g, g, n * 4), 0);
      ck_assert_int_eq(dense_opt_step(o, p, g, 0.05f), 0);
      ck_assert_int_eq(dense_cuda_opt_step(&cfg, n, d_p, d_g, d_s, step, 0.05f), 0);
    }
    from_dev(pg, d_p, n);
    assert_close("params", pg, p, n, RTOL);
    ck_assert_msg(memcmp(p, pg, n * 4) == 0, "optimizer %d not bitwise", k);
    if (ns) {
      from_dev(sg, d_s, ns);
      ck_assert_msg(memcmp(st, sg, ns * 4) == 0, "optimizer %d state", k);
    }
    /* the backend's own sgd pointer */
    if (k == DENSE_OPT_SGD) {
      cuda_be()->sgd(n, 0.5f, d_g, d_p);
      for (size_t i = 0; i < n; i++) p[i] -= 0.5f * g[i];
      from_dev(pg, d_p, n);
      ck_assert_msg(memcmp(p, pg, n * 4) == 0, "backend sgd not bitwise");
    }
    dense_cuda_free(d_p), dense_cuda_free(d_g), dense_cuda_free(d_s);
    free(p), free(g), free(pg), free(sg);
    dense_opt_destroy(o);
  }
}
END_TEST

int main(void) {
  SR_SKIP_NO_GPU("test_cuda_kernels");
  Suite *s = suite_create("cuda_kernels");
  TCase *tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_gemm);
  tcase_add_test(tc, test_bias_act);
  tcase_add_test(tc, test_relu_bias_grad);
  tcase_add_test(tc, test_interact);
  tcase_add_test(tc, test_bce);
  tcase_add_test(tc, test_optimizers);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
