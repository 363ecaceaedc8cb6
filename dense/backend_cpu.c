/* CPU reference backend: OpenBLAS cblas_sgemm for the matrix products, plain
 * loops the compiler vectorises for the rest. */
#include "dense/backend.h"
#include "dense/layers.h"

#include <cblas.h>
#include <math.h>

static void cpu_gemm(int trans_a, int trans_b, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

/* y[B][N] = act(y + bias[N]) */
static void cpu_bias_act_forward(int B, int N, const float *restrict bias,
                                 int relu, float *restrict y) {
  for (int r = 0; r < B; r++) {
    float *restrict row = y + (size_t)r * N;
    if (relu) {
      for (int c = 0; c < N; c++) {
        float v = row[c] + bias[c];
        row[c] = v > 0.0f ? v : 0.0f;
      }
    } else {
      for (int c = 0; c < N; c++) row[c] += bias[c];
    }
  }
}

/* dy[B][N] *= (y[B][N] > 0) */
static void cpu_relu_backward(int B, int N, const float *restrict y,
                              float *restrict dy) {
  size_t n = (size_t)B * N;
  for (size_t i = 0; i < n; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* db[N] = sum_r dy[r][N]; rows summed in order (deterministic). */
static void cpu_bias_grad(int B, int N, const float *restrict dy,
                          float *restrict db) {
  for (int c = 0; c < N; c++) db[c] = 0.0f;
  for (int r = 0; r < B; r++) {
    const float *restrict row = dy + (size_t)r * N;
    for (int c = 0; c < N; c++) db[c] += row[c];
  }
}

static inline float dotf(const float *restrict a, const float *restrict b,
                         int d) {
  float s = 0.0f;
  for (int k = 0; k < d; k++) s += a[k] * b[k];
  return s;
}

/* T[B][ni][d] -> R[B][r_stride]: R[b][0:d] = T[b][0], then Z[i][j] for
 * i in [0,ni), j in [0, i + itself). Only the lower triangle is computed. */
static void cpu_interact_dot_forward(int B, int ni, int d, int itself,
                                     const float *T, float *R, int r_stride) {
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * d;
    float *restrict r = R + (size_t)b * r_stride;
    for (int k = 0; k < d; k++) r[k] = t[k];
    float *restrict z = r + d;
    if (d == 16) { /* the common case: a constant trip count vectorises fully */
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < i + off; j++) *z++ = dotf(t + i * 16, t + j * 16, 16);
    } else {
      for (int i = 0; i < ni; i++)
        for (int j = 0; j < i + off; j++)
          *z++ = dotf(t + (size_t)i * d, t + (size_t)j * d, d);
    }
  }
}

/* dT[b][i] = sum_j dZ[i][j] T[j] + sum_j dZ[j][i] T[j] over the pairs taken;
 * a diagonal term Z[i][i] = |T_i|^2 contributes 2 dZ[i][i] T_i. The dense
 * pass-through R[b][0:d] adds to dT[b][0]. */
static void cpu_interact_dot_backward(int B, int ni, int d, int itself,
                                      const float *T, const float *dR,
                                      int r_stride, float *dT) {
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *restrict t = T + (size_t)b * ni * d;
    const float *restrict dr = dR + (size_t)b * r_stride;
    float *restrict g = dT + (size_t)b * ni * d;
    for (int k = 0; k < d; k++) g[k] = dr[k];
    for (size_t k = d; k < (size_t)ni * d; k++) g[k] = 0.0f;
    const float *dz = dr + d;
    for (int i = 0; i < ni; i++) {
      float *restrict gi = g + (size_t)i * d;
      const float *restrict ti = t + (size_t)i * d;
      for (int j = 0; j < i; j++) {
        float w = *dz++;
        const float *restrict tj = t + (size_t)j * d;
        float *restrict gj = g + (size_t)j * d;
        for (int k = 0; k < d; k++) {
          gi[k] += w * tj[k];
          gj[k] += w * ti[k];
        }
      }
      if (off) {
        float w2 = 2.0f * *dz++;
        for (int k = 0; k < d; k++) gi[k] += w2 * ti[k];
      }
    }
  }
}

/* loss = mean(max(z,0) - z*y + log1p(exp(-|z|))); dz = (sigmoid(z) - y)/B */
static double cpu_bce_logits(int B, const float *z, const float *y,
                             float *dz) {
  double sum = 0.0;
  for (int i = 0; i < B; i++) {
    double zi = z[i], yi = y[i];
    sum += (zi > 0.0 ? zi : 0.0) - zi * yi + log1p(exp(-fabs(zi)));
    if (dz) {
      double p = zi >= 0.0 ? 1.0 / (1.0 + exp(-zi))
                           : exp(zi) / (1.0 + exp(zi));
      dz[i] = (float)((p - yi) / B);
    }
  }
  return B > 0 ? sum / B : 0.0;
}

static void cpu_sgd(size_t n, float lr, const float *restrict g,
                    float *restrict p) {
  for (size_t i = 0; i < n; i++) p[i] -= lr * g[i];
}

static const dense_backend cpu_backend = {
    .name = "cpu-openblas",
    .gemm = cpu_gemm,
    .bias_act_forward = cpu_bias_act_forward,
    .relu_backward = cpu_relu_backward,
    .bias_grad = cpu_bias_grad,
    .interact_dot_forward = cpu_interact_dot_forward,
    .interact_dot_backward = cpu_interact_dot_backward,
    .bce_logits = cpu_bce_logits,
    .sgd = cpu_sgd,
};

const dense_backend *dense_backend_cpu(void) { return &cpu_backend; }

/* ---- layers on top of a backend ---------------------------------------- */

void dense_linear_forward(const dense_backend *be, int B, int K, int N,
                          const float *in, const float *W, const float *b,
                          int relu, float *out) {
  /* out[B][N] = in[B][K] * W[N][K]^T */
  be->gemm(0, 1, B, N, K, 1.0f, in, K, W, K, 0.0f, out, N);
  be->bias_act_forward(B, N, b, relu, out);
}

void dense_linear_backward(const dense_backend *be, int B, int K, int N,
                           const float *in, const float *W, const float *out,
                           int relu, float *dout, float *dW, float *db,
                           float *din) {
  if (relu) be->relu_backward(B, N, out, dout);
  be->bias_grad(B, N, dout, db);
  /* dW[N][K] = dz[B][N]^T * in[B][K] */
  be->gemm(1, 0, N, K, B, 1.0f, dout, N, in, K, 0.0f, dW, K);
  /* din[B][K] = dz[B][N] * W[N][K] */
  if (din) be->gemm(0, 0, B, K, N, 1.0f, dout, N, W, K, 0.0f, din, K);
}
