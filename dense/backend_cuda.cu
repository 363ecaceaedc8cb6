/* CUDA backend: cuBLAS sgemm (row-major through the transpose trick) and
 * deterministic kernels for bias/ReLU, the dot interaction, the loss and the
 * dense optimizers. See backend_cuda.h. */
#include "dense/backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dense/cuda_impl.h"

#define SR_OK_ 0
#define SR_EINVAL_ (-1)
#define SR_EBACKEND_ (-14)

/* ---- errors ------------------------------------------------------------- */

static char g_err[512];

extern "C" void dense_cuda__fail(const char *file, int line, const char *call,
                                 const char *what) {
  if (g_err[0]) return; /* keep the first */
  snprintf(g_err, sizeof g_err, "%s:%d: %s: %s", file, line, call, what);
}
extern "C" const char *dense_cuda_error(void) { return g_err; }
extern "C" const char *dense_cuda_last_error(void) { return g_err; }
extern "C" void dense_cuda_error_clear(void) { g_err[0] = 0; }

static int cublas_check(cublasStatus_t s, const char *call, const char *file,
                        int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  dense_cuda__fail(file, line, call, cublasGetStatusString(s));
  return SR_EBACKEND_;
}
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)
/* After a kernel launch: a bad configuration shows here. */
#define LAUNCH_CHECK(name) CUDA_CHECK(cudaGetLastError())

/* ---- the process's device context ----------------------------------------- */

static struct {
  int ready, device;
  cudaStream_t stream;
  cublasHandle_t blas;
  float *scratch; /* [scratch_n] device: partial sums of relu_bias_grad */
  size_t scratch_n;
  double *dsum;   /* [dsum_n] device: per-sample losses, then the total */
  size_t dsum_n;
  double *loss_h; /* pinned: the total */
} g;

cudaStream_t dense_cuda__stream(void) { return g.stream; }
extern "C" void *dense_cuda_stream(void) { return (void *)g.stream; }

/* Scratch of at least n floats / doubles (grown outside any capture). */
static float *scratch_f(size_t n) {
  if (n <= g.scratch_n) return g.scratch;
  if (g.scratch && CUDA_CHECK(cudaStreamSynchronize(g.stream))) return NULL;
  cudaFree(g.scratch);
  g.scratch = NULL, g.scratch_n = 0;
  if (CUDA_CHECK(cudaMalloc((void **)&g.scratch, n * sizeof(float)))) return NULL;
  g.scratch_n = n;
  return g.scratch;
}
static double *scratch_d(size_t n) {
  if (n <= g.dsum_n) return g.dsum;
  if (g.dsum && CUDA_CHECK(cudaStreamSynchronize(g.stream))) return NULL;
  cudaFree(g.dsum);
  g.dsum = NULL, g.dsum_n = 0;
  if (CUDA_CHECK(cudaMalloc((void **)&g.dsum, n * sizeof(double)))) return NULL;
  g.dsum_n = n;
  return g.dsum;
}

static unsigned blocks_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 65535u * 16 ? (b ? b : 1) : 65535u * 16);
}

/* ---- gemm ----------------------------------------------------------------- */

/* Row-major C[M][N] = alpha op(A)[M][K] op(B)[K][N] + beta C is, read as
 * column-major, C^T[N][M] = op(B)^T op(A)^T: one cublasSgemm with the
 * operands swapped. FP32 compute (CUBLAS_DEFAULT_MATH: no TF32). */
static void cu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc) {
  CUBLAS_CHECK(cublasSgemm(g.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                           &alpha, B, ldb, A, lda, &beta, C, ldc));
}

/* ---- bias + ReLU ---------------------------------------------------------- */

/* y[B][N] = act(y + bias[N]) */
__global__ void k_bias_act(size_t total, int N, const float *bias, int relu,
                           float *y) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = y[i] + bias[i % N];
    y[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
  }
}
static void cu_bias_act_forward(int B, int N, const float *bias, int relu,
                                float *y) {
  size_t total = (size_t)B * N;
  k_bias_act<<<blocks_for(total, 256), 256, 0, g.stream>>>(total, N, bias,
                                                            relu, y);
  LAUNCH_CHECK(k_bias_act);
}

/* ReLU backward and bias gradient, deterministic in two passes:
 * part[ch][N] = sum of dy over rows [64 ch, 64 ch + 64) in order (masking dy
 * by y > 0 on the way), then db[N] = sum over ch in order. A batch of <= 64
 * rows is one chunk: the CPU's exact order. Rows are ld floats apart. */
#define RBG_CHUNK 64
__global__ void k_relu_bias_part(int B, int N, int ld, const float *y,
                                 float *dy, float *part) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
  if (c >= N) return;
  int r0 = ch * RBG_CHUNK, r1 = min(B, r0 + RBG_CHUNK);
  float s = 0.0f;
  for (int r = r0; r < r1; r++) {
    size_t i = (size_t)r * ld + c;
    float v = dy[i];
    if (y) {
      v = y[i] > 0.0f ? v : 0.0f;
      dy[i] = v;
    }
    s += v;
  }
  part[(size_t)ch * N + c] = s;
}
__global__ void k_sum_parts(int nch, int N, const float *part, float *db) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float s = part[c];
  for (int ch = 1; ch < nch; ch++) s += part[(size_t)ch * N + c];
  db[c] = s;
}
static void cu_relu_bias_grad(int B, int N, int ld, const float *y, float *dy,
                              float *db) {
  int nch = (B + RBG_CHUNK - 1) / RBG_CHUNK;
  if (nch < 1) nch = 1;
  float *part = scratch_f((size_t)nch * N);
  if (!part) return;
  dim3 grid((N + 127) / 128, nch);
  k_relu_bias_part<<<grid, 128, 0, g.stream>>>(B, N, ld, y, dy, part);
  LAUNCH_CHECK(k_relu_bias_part);
  k_sum_parts<<<(N + 127) / 128, 128, 0, g.stream>>>(nch, N, part, db);
  LAUNCH_CHECK(k_sum_parts);
}

/* ---- dot interaction ------------------------------------------------------ */

/* Start of row i's pairs in Zflat: i(i-1)/2 (+ i when itself). */
__device__ __forceinline__ int pair_row_start(int i, int off) {
  return i * (i - 1) / 2 + off * i;
}
/* Pair p -> (i, j), j < i + off. */
__device__ __forceinline__ void pair_of(int p, int off, int *i, int *j) {
  float s = sqrtf(8.0f * (float)p + 1.0f);
  int r = off ? (int)((s - 1.0f) * 0.5f) : (int)((s + 1.0f) * 0.5f);
  if (r < 0) r = 0;
  while (r > 0 && pair_row_start(r, off) > p) r--;
  while (pair_row_start(r + 1, off) <= p) r++;
  *i = r;
  *j = p - pair_row_start(r, off);
}

/* T[B][ni][d] -> R[B][r_stride]: R[b][0:d] = T[b][0], then Z[i][j]
 * = T[b][i] . T[b][j] (k in order) for the lower triangle. One thread per
 * output value. */
__global__ void k_interact_fwd(int B, int ni, int d, int off, int width,
                               const float *T, float *R, int r_stride) {
  size_t total = (size_t)B * width;
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total;
       x += (size_t)gridDim.x * blockDim.x) {
    int b = (int)(x / width), p = (int)(x % width);
    const float *t = T + (size_t)b * ni * d;
    float v;
    if (p < d) {
      v = t[p];
    } else {
      int i, j;
      pair_of(p - d, off, &i, &j);
      const float *ti = t + (size_t)i * d, *tj = t + (size_t)j * d;
      v = 0.0f;
      for (int k = 0; k < d; k++) v += ti[k] * tj[k];
    }
    R[(size_t)b * r_stride + p] = v;
  }
}
static int n_pairs(int ni, int itself) {
  return ni * (ni - 1) / 2 + (itself ? ni : 0);
}
static void cu_interact_dot_forward(int B, int ni, int d, int itself,
                                    const float *T, float *R, int r_stride) {
  int width = d + n_pairs(ni, itself);
  size_t total = (size_t)B * width;
  k_interact_fwd<<<blocks_for(total, 256), 256, 0, g.stream>>>(
      B, ni, d, itself ? 1 : 0, width, T, R, r_stride);
  LAUNCH_CHECK(k_interact_fwd);
}

/* dT[b][i][k] = [i == 0] dR[b][k] + sum_{j<i} dZ[i][j] T[j][k]
 *             + 2 dZ[i][i] T[i][k] (itself) + sum_{m>i} dZ[m][i] T[m][k].
 * One thread per output value, terms in that fixed order (no atomics). */
__global__ void k_interact_bwd(int B, int ni, int d, int off, const float *T,
                               const float *dR, int r_stride, float *dT) {
  size_t total = (size_t)B * ni * d;
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total;
       x += (size_t)gridDim.x * blockDim.x) {
    int k = (int)(x % d);
    int i = (int)((x / d) % ni);
    size_t b = x / ((size_t)ni * d);
    const float *t = T + b * ni * d;
    const float *dr = dR + b * r_stride, *dz = dr + d;
    float s = i == 0 ? dr[k] : 0.0f;
    int base = pair_row_start(i, off);
    for (int j = 0; j < i; j++) s += dz[base + j] * t[(size_t)j * d + k];
    if (off) s += 2.0f * dz[base + i] * t[(size_t)i * d + k];
    for (int m = i + 1; m < ni; m++)
      s += dz[pair_row_start(m, off) + i] * t[(size_t)m * d + k];
    dT[x] = s;
  }
}
static void cu_interact_dot_backward(int B, int ni, int d, int itself,
                                     const float *T, const float *dR,
                                     int r_stride, float *dT) {
  size_t total = (size_t)B * ni * d;
  k_interact_bwd<<<blocks_for(total, 256), 256, 0, g.stream>>>(
      B, ni, d, itself ? 1 : 0, T, dR, r_stride, dT);
  LAUNCH_CHECK(k_interact_bwd);
}

/* ---- loss ----------------------------------------------------------------- */

/* l[i] = max(z,0) - z y + log1p(exp(-|z|)) in double; dz = (sigmoid(z)-y)/B */
__global__ void k_bce(int B, const float *z, const float *y, float *dz,
                      double *l) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  double zi = z[i], yi = y[i];
  l[i] = (zi > 0.0 ? zi : 0.0) - zi * yi + log1p(exp(-fabs(zi)));
  if (dz) {
    double p = zi >= 0.0 ? 1.0 / (1.0 + exp(-zi)) : exp(zi) / (1.0 + exp(zi));
    dz[i] = (float)((p - yi) / B);
  }
}
/* out = sum l[0..B): thread t adds t, t+256, ... in order, then a fixed tree. */
__global__ void k_sum_d(int B, const double *l, double *out) {
  __shared__ double s[256];
  double a = 0.0;
  for (int i = threadIdx.x; i < B; i += 256) a += l[i];
  s[threadIdx.x] = a;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = s[0];
}
static double cu_bce_logits(int B, const float *z, const float *y, float *dz) {
  if (B <= 0) return 0.0;
  double *l = scratch_d((size_t)B + 1);
  if (!l) return NAN;
  k_bce<<<(B + 255) / 256, 256, 0, g.stream>>>(B, z, y, dz, l);
  LAUNCH_CHECK(k_bce);
  k_sum_d<<<1, 256, 0, g.stream>>>(B, l, l + B);
  LAUNCH_CHECK(k_sum_d);
  if (CUDA_CHECK(cudaMemcpyAsync(g.loss_h, l + B, sizeof(double),
                                 cudaMemcpyDeviceToHost, g.stream)) ||
      CUDA_CHECK(cudaStreamSynchronize(g.stream)))
    return NAN;
  return *g.loss_h / B;
}

/* ---- optimizers (dense/optim.c's formulas, no FMA contraction) ------------ */

__global__ void k_sgd(size_t n, float lr, const float *gr, float *p) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] -= lr * gr[i];
}
__global__ void k_adagrad(size_t n, float lr, float eps, const float *gr,
                          float *s, float *p) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = gr[i], si = s[i] + gi * gi;
    s[i] = si;
    p[i] -= lr * (gi / (sqrtf(si) + eps));
  }
}
__global__ void k_adam(size_t n, float fb1, float fb2, float c1, float c2,
                       float step_size, float bc2_sqrt, float eps,
                       const float *gr, float *m, float *v, float *p) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = gr[i];
    float mi = fb1 * m[i] + c1 * gi;
    float vi = fb2 * v[i] + c2 * (gi * gi);
    m[i] = mi, v[i] = vi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] -= step_size * (mi / denom);
  }
}
static void cu_sgd(size_t n, float lr, const float *gr, float *p) {
  if (!n) return;
  k_sgd<<<blocks_for(n, 256), 256, 0, g.stream>>>(n, lr, gr, p);
  LAUNCH_CHECK(k_sgd);
}

extern "C" int dense_cuda_opt_step(const dense_opt_config *cfg, size_t n,
                                   float *p, const float *gr, float *state,
                                   int64_t t, float lr) {
  if (!cfg || (n && (!p || !gr))) return SR_EINVAL_;
  if (!n) return SR_OK_;
  unsigned nb = blocks_for(n, 256);
  switch (cfg->kind) {
  case DENSE_OPT_SGD:
    k_sgd<<<nb, 256, 0, g.stream>>>(n, lr, gr, p);
    break;
  case DENSE_OPT_ADAGRAD:
    if (!state) return SR_EINVAL_;
    k_adagrad<<<nb, 256, 0, g.stream>>>(n, lr, cfg->eps, gr, state, p);
    break;
  case DENSE_OPT_ADAM: {
    if (!state || t < 1) return SR_EINVAL_;
    double b1 = cfg->beta1, b2 = cfg->beta2, tt = (double)t;
    float step_size = (float)(lr / (1.0 - pow(b1, tt)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, tt));
    k_adam<<<nb, 256, 0, g.stream>>>(n, (float)b1, (float)b2,
                                     (float)(1.0 - b1), (float)(1.0 - b2),
                                     step_size, bc2_sqrt, cfg->eps, gr, state,
                                     state + n, p);
    break;
  }
  default:
    return SR_EINVAL_;
  }
  return LAUNCH_CHECK(k_opt);
}

/* ---- the backend object --------------------------------------------------- */

static const dense_backend cuda_backend = {
    "cuda-cublas",           cu_gemm,
    cu_bias_act_forward,     cu_relu_bias_grad,
    cu_interact_dot_forward, cu_interact_dot_backward,
    cu_bce_logits,           cu_sgd,
};

extern "C" int dense_cuda_device_count(char *why, size_t whylen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no device" error */
    n = 0;
  }
  if (n == 0 && why && whylen)
    snprintf(why, whylen, "cudaGetDeviceCount: %s",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  return n;
}

static void fmt(char *err, size_t errlen, const char *f, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, f);
  vsnprintf(err, errlen, f, ap);
  va_end(ap);
}

extern "C" const dense_backend *dense_backend_cuda(int device, char *err,
                                                   size_t errlen) {
  if (g.ready) {
    if (device != g.device) {
      fmt(err, errlen, "the CUDA backend already runs on device %d (one "
          "device per process), not %d", g.device, device);
      return NULL;
    }
    return &cuda_backend;
  }
  char why[256];
  int n = dense_cuda_device_count(why, sizeof why);
  if (n == 0) {
    fmt(err, errlen, "no CUDA device (%s)", why);
    return NULL;
  }
  if (device < 0 || device >= n) {
    fmt(err, errlen, "CUDA device %d out of range (this machine has %d)",
        device, n);
    return NULL;
  }
  dense_cuda_error_clear();
  if (CUDA_CHECK(cudaSetDevice(device)) ||
      CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking)) ||
      CUBLAS_CHECK(cublasCreate(&g.blas)) ||
      CUBLAS_CHECK(cublasSetStream(g.blas, g.stream)) ||
      CUBLAS_CHECK(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH)) ||
      CUDA_CHECK(cudaMallocHost((void **)&g.loss_h, sizeof(double)))) {
    fmt(err, errlen, "CUDA backend on device %d: %s", device, g_err);
    return NULL;
  }
  g.device = device;
  g.ready = 1;
  dense_cuda__model_register(&cuda_backend);
  return &cuda_backend;
}

extern "C" int dense_cuda_malloc(void **p, size_t bytes) {
  *p = NULL;
  return CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 4));
}
extern "C" void dense_cuda_free(void *p) {
  if (p) cudaFree(p);
}
extern "C" int dense_cuda_upload(void *dst, const void *src, size_t bytes) {
  if (CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                 g.stream)))
    return SR_EBACKEND_;
  return dense_cuda_sync();
}
extern "C" int dense_cuda_download(void *dst, const void *src, size_t bytes) {
  if (CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                                 g.stream)))
    return SR_EBACKEND_;
  return dense_cuda_sync();
}
extern "C" int dense_cuda_sync(void) {
  if (CUDA_CHECK(cudaStreamSynchronize(g.stream))) return SR_EBACKEND_;
  return g_err[0] ? SR_EBACKEND_ : SR_OK_;
}

/* ---- sgemm timing (bench train) ------------------------------------------- */

__global__ void k_fill(size_t n, uint32_t seed, float *x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = (float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

extern "C" double dense_cuda_gemm_seconds(int ta, int tb, int M, int N, int K,
                                          int reps) {
  if (!g.ready || M < 1 || N < 1 || K < 1 || reps < 1 || reps > 99)
    return -1.0;
  size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
  float *A = NULL, *B = NULL, *C = NULL, ms[99];
  cudaEvent_t e0 = NULL, e1 = NULL;
  double out = -1.0;
  if (CUDA_CHECK(cudaMalloc((void **)&A, na * 4)) ||
      CUDA_CHECK(cudaMalloc((void **)&B, nb * 4)) ||
      CUDA_CHECK(cudaMalloc((void **)&C, nc * 4)) ||
      CUDA_CHECK(cudaEventCreate(&e0)) || CUDA_CHECK(cudaEventCreate(&e1)))
    goto done;
  k_fill<<<blocks_for(na, 256), 256, 0, g.stream>>>(na, 1, A);
  k_fill<<<blocks_for(nb, 256), 256, 0, g.stream>>>(nb, 2, B);
  k_fill<<<blocks_for(nc, 256), 256, 0, g.stream>>>(nc, 3, C);
  for (int r = -2; r < reps; r++) {
    if (CUDA_CHECK(cudaEventRecord(e0, g.stream))) goto done;
    cu_gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
    if (CUDA_CHECK(cudaEventRecord(e1, g.stream)) ||
        CUDA_CHECK(cudaEventSynchronize(e1)))
      goto done;
    if (r >= 0 && CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1))) goto done;
  }
  if (g_err[0]) goto done;
  qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
  out = 1e-3 * (reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]));
done:
  cudaFree(A), cudaFree(B), cudaFree(C);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return out;
}
