/* CPU reference backend: OpenBLAS cblas_sgemm for the matrix products, plain
 * loops the compiler vectorises for the rest. */
#include "dense/backend.h"
#include "dense/layers.h"

#include <cblas.h>
#include <math.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define DENSE_X86 1
#else
#define DENSE_X86 0
#endif

/* The build targets the baseline ISA (SSE2 on x86-64). The element-wise
 * kernels are also compiled for AVX2/FMA, and the dot interaction, which is
 * most of a step's non-sgemm time, has AVX2/FMA versions for d == 16. They
 * make two backend objects: the baseline one and the AVX2 one, which
 * dense_backend_cpu() hands out where the CPU has AVX2 and FMA. A given
 * machine always runs the same code, so its results are the same bits run to
 * run; the two kernel sets differ in rounding only (FMA, summation order in
 * the interaction). dense_backend_cpu_isa(DENSE_ISA_BASELINE) gives the
 * baseline object on any machine, so tests cover both on one. */
#if DENSE_X86
static int cpu_has_avx2_fma(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

static void cpu_gemm(int trans_a, int trans_b, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

/* Element-wise kernels: one body, compiled twice, as name_base (baseline)
 * and name_avx2. -std=c11 keeps -ffp-contract=off, so both versions round
 * exactly alike: the AVX2 copy only moves more floats per instruction. */
#if DENSE_X86
#define DENSE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define DENSE_MULTIVERSION(name, params, args)                \
  static void name##_base params { name##_body args; }        \
  static DENSE_TARGET_AVX2 void name##_avx2 params { name##_body args; }
#else
#define DENSE_MULTIVERSION(name, params, args) \
  static void name##_base params { name##_body args; }
#endif
#define DENSE_BODY static inline __attribute__((always_inline)) void

/* y[B][N] = act(y + bias[N]) */
DENSE_BODY cpu_bias_act_forward_body(int B, int N, const float *restrict bias,
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
DENSE_MULTIVERSION(cpu_bias_act_forward,
                   (int B, int N, const float *bias, int relu, float *y),
                   (B, N, bias, relu, y))

/* dy[B][N] *= (y[B][N] > 0) unless y is NULL; db[N] = sum_r dy[r][N], rows
 * summed in order (deterministic). Row stride ld. */
DENSE_BODY cpu_relu_bias_grad_body(int B, int N, int ld,
                                   const float *restrict y,
                                   float *restrict dy, float *restrict db) {
  for (int c = 0; c < N; c++) db[c] = 0.0f;
  for (int r = 0; r < B; r++) {
    float *restrict row = dy + (size_t)r * ld;
    if (y) {
      const float *restrict yr = y + (size_t)r * ld;
      for (int c = 0; c < N; c++) {
        float v = yr[c] > 0.0f ? row[c] : 0.0f;
        row[c] = v;
        db[c] += v;
      }
    } else {
      for (int c = 0; c < N; c++) db[c] += row[c];
    }
  }
}
DENSE_MULTIVERSION(cpu_relu_bias_grad,
                   (int B, int N, int ld, const float *y, float *dy,
                    float *db),
                   (B, N, ld, y, dy, db))

static inline float dotf(const float *restrict a, const float *restrict b,
                         int d) {
  float s = 0.0f;
  for (int k = 0; k < d; k++) s += a[k] * b[k];
  return s;
}

#if DENSE_X86
/* Eight dot products of 16-float rows: p[q] = a . rows[q] for q in 0..7,
 * returned in one vector (lane q). a = (alo, ahi). */
__attribute__((target("avx2,fma"))) static inline __m256
dot16x8(__m256 alo, __m256 ahi, const float *const rows[8]) {
  __m256 p[8];
  for (int q = 0; q < 8; q++)
    p[q] = _mm256_fmadd_ps(ahi, _mm256_loadu_ps(rows[q] + 8),
                           _mm256_mul_ps(alo, _mm256_loadu_ps(rows[q])));
  __m256 s01 = _mm256_hadd_ps(p[0], p[1]), s23 = _mm256_hadd_ps(p[2], p[3]);
  __m256 s45 = _mm256_hadd_ps(p[4], p[5]), s67 = _mm256_hadd_ps(p[6], p[7]);
  __m256 u0 = _mm256_hadd_ps(s01, s23), u1 = _mm256_hadd_ps(s45, s67);
  /* u0 = [p0..p3 over lanes 0-3 | p0..p3 over lanes 4-7], u1 likewise */
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                       _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* d == 16 forward: per row i, the dots with rows j < i + off, eight at a
 * time (lanes past the row's end recompute row i and are not stored). */
__attribute__((target("avx2,fma"))) static void
interact_fwd_d16_avx2(int B, int ni, int itself, const float *T, float *R,
                      int r_stride) {
  static const int lane_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                    0,  0,  0,  0,  0,  0,  0,  0};
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * 16;
    float *r = R + (size_t)b * r_stride;
    _mm256_storeu_ps(r, _mm256_loadu_ps(t));
    _mm256_storeu_ps(r + 8, _mm256_loadu_ps(t + 8));
    float *z = r + 16;
    for (int i = 0; i < ni; i++) {
      const float *ti = t + i * 16;
      __m256 alo = _mm256_loadu_ps(ti), ahi = _mm256_loadu_ps(ti + 8);
      int cnt = i + off;
      for (int j0 = 0; j0 < cnt; j0 += 8) {
        const float *rows[8];
        for (int q = 0; q < 8; q++)
          rows[q] = j0 + q < cnt ? t + (j0 + q) * 16 : ti;
        __m256 v = dot16x8(alo, ahi, rows);
        int n = cnt - j0;
        if (n >= 8)
          _mm256_storeu_ps(z + j0, v);
        else
          _mm256_maskstore_ps(
              z + j0, _mm256_loadu_si256((const __m256i *)(lane_mask + 8 - n)),
              v);
      }
      z += cnt;
    }
  }
}

/* d == 16 backward: dT[i] = sum_{j<i} dZ[i][j] T[j] + sum_{k>i} dZ[k][i] T[k]
 * (+ 2 dZ[i][i] T[i] when itself), accumulated in registers, two chains per
 * sum so the FMA latency is hidden; each row of dT is stored once. */
__attribute__((target("avx2,fma"))) static void
interact_bwd_d16_avx2(int B, int ni, int itself, const float *T,
                      const float *dR, int r_stride, float *dT) {
  int off = itself ? 1 : 0;
  for (int b = 0; b < B; b++) {
    const float *t = T + (size_t)b * ni * 16;
    const float *dr = dR + (size_t)b * r_stride;
    const float *dz = dr + 16;
    float *g = dT + (size_t)b * ni * 16;
    for (int i = 0; i < ni; i++) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
      const float *dzi = dz + (size_t)i * (i - 1) / 2 + (size_t)off * i;
      int j = 0;
      for (; j + 1 < i; j += 2) { /* row i of dZ, contiguous */
        __m256 w0 = _mm256_broadcast_ss(dzi + j);
        __m256 w1 = _mm256_broadcast_ss(dzi + j + 1);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16 + 8), a1);
        c0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + j * 16 + 16), c0);
        c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + j * 16 + 24), c1);
      }
      if (j < i) {
        __m256 w0 = _mm256_broadcast_ss(dzi + j);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + j * 16 + 8), a1);
      }
      if (off) {
        __m256 w2 = _mm256_set1_ps(2.0f * dzi[i]);
        c0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t + i * 16), c0);
        c1 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t + i * 16 + 8), c1);
      }
      /* column i of dZ below the diagonal: dZ[k][i] for k > i */
      __m256 e0 = _mm256_setzero_ps(), e1 = e0, f0 = e0, f1 = e0;
      size_t p = (size_t)(i + 1) * i / 2 + (size_t)off * (i + 1) + i;
      int k = i + 1;
      for (; k + 1 < ni; k += 2) {
        __m256 w0 = _mm256_broadcast_ss(dz + p);
        p += (size_t)k + off;
        __m256 w1 = _mm256_broadcast_ss(dz + p);
        p += (size_t)k + 1 + off;
        e0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16), e0);
        e1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16 + 8), e1);
        f0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + k * 16 + 16), f0);
        f1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t + k * 16 + 24), f1);
      }
      if (k < ni) {
        __m256 w0 = _mm256_broadcast_ss(dz + p);
        e0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16), e0);
        e1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t + k * 16 + 8), e1);
      }
      __m256 s0 = _mm256_add_ps(_mm256_add_ps(a0, c0), _mm256_add_ps(e0, f0));
      __m256 s1 = _mm256_add_ps(_mm256_add_ps(a1, c1), _mm256_add_ps(e1, f1));
      if (i == 0) { /* the dense pass-through R[b][0:16] */
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(dr));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(dr + 8));
      }
      _mm256_storeu_ps(g + i * 16, s0);
      _mm256_storeu_ps(g + i * 16 + 8, s1);
    }
  }
}
#endif

/* T[B][ni][d] -> R[B][r_stride]: R[b][0:d] = T[b][0], then Z[i][j] for
 * i in [0,ni), j in [0, i + itself). Only the lower triangle is computed. */
static void cpu_interact_dot_forward_base(int B, int ni, int d, int itself,
                                          const float *T, float *R,
                                          int r_stride) {
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
static void cpu_interact_dot_backward_base(int B, int ni, int d, int itself,
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

#if DENSE_X86
/* The AVX2 set: the d == 16 interaction in intrinsics, other widths on the
 * baseline loops. */
static void cpu_interact_dot_forward_avx2(int B, int ni, int d, int itself,
                                          const float *T, float *R,
                                          int r_stride) {
  if (d == 16)
    interact_fwd_d16_avx2(B, ni, itself, T, R, r_stride);
  else
    cpu_interact_dot_forward_base(B, ni, d, itself, T, R, r_stride);
}
static void cpu_interact_dot_backward_avx2(int B, int ni, int d, int itself,
                                           const float *T, const float *dR,
                                           int r_stride, float *dT) {
  if (d == 16)
    interact_bwd_d16_avx2(B, ni, itself, T, dR, r_stride, dT);
  else
    cpu_interact_dot_backward_base(B, ni, d, itself, T, dR, r_stride, dT);
}
#endif

/* The two kernel sets (sgemm, loss and SGD shared). */
#define CPU_BACKEND(label, isa)                                \
  {.name = label,                                              \
   .gemm = cpu_gemm,                                           \
   .bias_act_forward = cpu_bias_act_forward_##isa,             \
   .relu_bias_grad = cpu_relu_bias_grad_##isa,                 \
   .interact_dot_forward = cpu_interact_dot_forward_##isa,     \
   .interact_dot_backward = cpu_interact_dot_backward_##isa,   \
   .bce_logits = cpu_bce_logits,                               \
   .sgd = cpu_sgd}
static const dense_backend cpu_backend_base = CPU_BACKEND("cpu-openblas", base);
#if DENSE_X86
static const dense_backend cpu_backend_avx2 =
    CPU_BACKEND("cpu-openblas-avx2", avx2);
#endif

const dense_backend *dense_backend_cpu_isa(dense_isa isa) {
  switch (isa) {
  case DENSE_ISA_BASELINE:
    return &cpu_backend_base;
  case DENSE_ISA_BEST:
#if DENSE_X86
    if (cpu_has_avx2_fma()) return &cpu_backend_avx2;
#endif
    return &cpu_backend_base;
  }
  return NULL;
}

const dense_backend *dense_backend_cpu(void) {
  return dense_backend_cpu_isa(DENSE_ISA_BEST);
}

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
  be->relu_bias_grad(B, N, N, relu ? out : NULL, dout, db);
  /* dW[N][K] = dz[B][N]^T * in[B][K] */
  be->gemm(1, 0, N, K, B, 1.0f, dout, N, in, K, 0.0f, dW, K);
  /* din[B][K] = dz[B][N] * W[N][K] */
  if (din) be->gemm(0, 0, B, K, N, 1.0f, dout, N, W, K, 0.0f, din, K);
}
