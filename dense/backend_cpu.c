/* CPU reference backend: OpenBLAS cblas_sgemm for the matrix products, plain
 * loops the compiler vectorises for the rest. */
#include "dense/backend.h"
#include "dense/layers.h"
#include "dense/pool.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/sys.h"
#include "dense/cpu_impl.h"

/* The build targets the baseline ISA (SSE2 on x86-64). The element-wise
 * kernels are also compiled for AVX2/FMA, and the dot interaction
 * (interact_cpu.c), which is most of a step's non-sgemm time, has AVX2/FMA
 * versions for d == 16 and 8-float vector ones at other widths. They
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

/* ---- the fixed partitions ---------------------------------------------
 * Every kernel below cuts its work into blocks whose sizes depend on the
 * shapes alone and hands them to the default pool (dense/pool.h) as tasks;
 * each block is computed by the same single-threaded code whatever the
 * thread count, so threads change speed, never bits. */

/* OpenBLAS runs single-threaded in every call, whatever
 * OPENBLAS_NUM_THREADS (or an openblas_set_num_threads of someone else)
 * says: its threaded sgemm uses other kernels than its single-thread one
 * (other bits). Checked before each product, on the caller's thread. */
static void blas_single(void) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* C[M][N] = alpha * op(A)[M][K] * op(B)[K][N] + beta * C, cut into blocks
 * of C: DENSE_GEMM_ROW_BLOCK rows when M has two or more of them, else
 * DENSE_GEMM_COL_BLOCK columns; never K (each element's sum is the one
 * single-thread sgemm forms). Products under DENSE_GEMM_SPLIT_MIN
 * multiply-adds are one block, which dense_gemm_cut may run as two tasks
 * of rows. */
typedef struct {
  int ta, tb, M, N, K, lda, ldb, ldc, by_rows, blk, cut;
  float alpha, beta;
  const float *A, *B;
  float *C;
  /* Optional: after its block of C, a task adds bias (and applies the
   * ReLU when relu) to that block with bias_act, the kernel set's
   * element-wise kernel (rows of ldc floats, one row per call). */
  const float *bias;
  int relu;
  void (*bias_act)(int, int, const float *, int, float *);
  /* Optional: after its block of C, a task applies the ReLU backward of mask
   * (laid out as C) to that block with relu_mask: C = mask > 0 ? C : 0. */
  const float *mask;
  void (*relu_mask)(int, int, int, const float *, float *);
} gemm_job;

int dense_gemm_tasks(int M, int N, int K, int *by_rows, int *blk) {
  *by_rows = 1, *blk = M;
  if ((double)M * N * K < DENSE_GEMM_SPLIT_MIN) return 1;
  if (M >= 2 * DENSE_GEMM_ROW_BLOCK) {
    *blk = DENSE_GEMM_ROW_BLOCK;
    return (M + *blk - 1) / *blk;
  }
  if (N >= 2 * DENSE_GEMM_COL_BLOCK) {
    *by_rows = 0, *blk = DENSE_GEMM_COL_BLOCK;
    return (N + *blk - 1) / *blk;
  }
  return 1;
}

int dense_gemm_cut(int M, int N, int K) {
  int by_rows, blk;
  if (dense_gemm_tasks(M, N, K, &by_rows, &blk) > 1 || M < 2 * DENSE_GEMM_ROW_ALIGN) return 0;
  if ((double)M * N * K < DENSE_GEMM_HALVE_MIN && (double)M * N < DENSE_GEMM_HALVE_OUT) return 0;
  int a = DENSE_GEMM_ROW_ALIGN;
  return (M / 2 + a / 2) / a * a; /* the multiple of a nearest M / 2: in [a, M - a] */
}

/* job g's task count, its blocks (and cut) set in g. */
static int gemm_plan(gemm_job *g) {
  int n = dense_gemm_tasks(g->M, g->N, g->K, &g->by_rows, &g->blk);
  g->cut = dense_gemm_cut(g->M, g->N, g->K);
  if (g->cut) g->blk = g->cut, n = 2; /* rows [0, cut) and [cut, M) */
  return n;
}

static void gemm_task(void *arg, int t) {
  const gemm_job *g = arg;
  int M = g->M, N = g->N, c0 = 0;
  const float *A = g->A, *B = g->B;
  float *C = g->C;
  if (g->by_rows) {
    int r0 = t * g->blk;
    M = M - r0 < g->blk || (g->cut && t) ? M - r0 : g->blk; /* a cut's second task: the rest */
    A += g->ta ? (size_t)r0 : (size_t)r0 * g->lda; /* op(A) rows r0.. */
    C += (size_t)r0 * g->ldc;
  } else {
    c0 = t * g->blk;
    N = N - c0 < g->blk ? N - c0 : g->blk;
    B += g->tb ? (size_t)c0 * g->ldb : (size_t)c0; /* op(B) columns c0.. */
    C += c0;
  }
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
              g->tb ? CblasTrans : CblasNoTrans, M, N, g->K, g->alpha, A,
              g->lda, B, g->ldb, g->beta, C, g->ldc);
  if (g->bias) /* element-wise: the same bits in any block */
    for (int r = 0; r < M; r++) g->bias_act(1, N, g->bias + c0, g->relu, C + (size_t)r * g->ldc);
  if (g->mask) g->relu_mask(M, N, g->ldc, g->mask + (C - g->C), C);
}

/* Several independent products in one run of the pool: job j's tasks
 * follow job j - 1's, each product cut as alone (gemm_plan). */
#define GEMM_MAX_JOBS 2
typedef struct {
  int n, first[GEMM_MAX_JOBS + 1];
  gemm_job *job;
} gemm_multi;

static void gemm_multi_task(void *arg, int t) {
  const gemm_multi *m = arg;
  int j = 0;
  while (t >= m->first[j + 1]) j++;
  gemm_task(&m->job[j], t - m->first[j]);
}

static void gemm_run(gemm_job *jobs, int n) {
  blas_single();
  gemm_multi m = {.n = n, .job = jobs};
  for (int j = 0; j < n; j++) m.first[j + 1] = m.first[j] + gemm_plan(&jobs[j]);
  dense_pool_run(dense_pool_default(), m.first[n], gemm_multi_task, &m);
}

static gemm_job gemm_of(int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc) {
  return (gemm_job){.ta = trans_a, .tb = trans_b, .M = M, .N = N, .K = K, .lda = lda,
                    .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B,
                    .C = C};
}

static void cpu_gemm(int trans_a, int trans_b, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
  gemm_job g = gemm_of(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_run(&g, 1);
}

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

/* dy[B][N] = y > 0 ? dy : 0: the ReLU backward alone, rows ld apart. The
 * same choice per element as cpu_relu_bias_grad's, so masking first and
 * summing the columns later gives that kernel's bits. */
DENSE_BODY cpu_relu_mask_body(int B, int N, int ld, const float *restrict y,
                              float *restrict dy) {
  for (int r = 0; r < B; r++) {
    float *restrict row = dy + (size_t)r * ld;
    const float *restrict yr = y + (size_t)r * ld;
    for (int c = 0; c < N; c++) row[c] = yr[c] > 0.0f ? row[c] : 0.0f;
  }
}
DENSE_MULTIVERSION(cpu_relu_mask, (int B, int N, int ld, const float *y, float *dy),
                   (B, N, ld, y, dy))

/* DCN-v2 cross layer, forward: q[B][W] += bias[W]; out = x0 * q + xl.
 * Each product is a statement of its own: no compiler may fuse it with the
 * add into an FMA (clang contracts within a statement by default), so both
 * kernel sets give the same bits. */
DENSE_BODY cpu_cross_forward_body(int B, int W, const float *restrict bias,
                                  const float *restrict x0,
                                  const float *restrict xl, float *restrict q,
                                  float *restrict out) {
  for (size_t r = 0; r < (size_t)B; r++) {
    float *restrict qr = q + r * W, *restrict o = out + r * W;
    const float *restrict a = x0 + r * W, *restrict x = xl + r * W;
    for (int c = 0; c < W; c++) {
      float v = qr[c] + bias[c];
      qr[c] = v;
      float p = a[c] * v;
      o[c] = p + x[c];
    }
  }
}
DENSE_MULTIVERSION(cpu_cross_forward,
                   (int B, int W, const float *bias, const float *x0,
                    const float *xl, float *q, float *out),
                   (B, W, bias, x0, xl, q, out))

/* Backward: dq = g * x0; acc = (init ? 0 : acc) + g * q (+ g when add_g). */
DENSE_BODY cpu_cross_backward_body(int B, int W, const float *restrict g,
                                   const float *restrict x0,
                                   const float *restrict q,
                                   float *restrict dq, float *restrict acc,
                                   int init, int add_g) {
  for (size_t i = 0; i < (size_t)B * W; i++) {
    float t = init ? 0.0f : acc[i], gq = g[i] * q[i];
    dq[i] = g[i] * x0[i];
    t += gq;
    acc[i] = add_g ? t + g[i] : t;
  }
}
DENSE_MULTIVERSION(cpu_cross_backward,
                   (int B, int W, const float *g, const float *x0,
                    const float *q, float *dq, float *acc, int init,
                    int add_g),
                   (B, W, g, x0, q, dq, acc, init, add_g))


/* loss = mean(max(z,0) - z*y + log1p(exp(-|z|))); dz = (sigmoid(z) - y)/B.
 * Fixed blocks of BCE_BLOCK samples, each summed in order from 0; the
 * blocks' sums added in block order (with one thread too). */
#define BCE_BLOCK 256
#define BCE_MAX_BLOCKS 4096
typedef struct {
  int B, blk;
  const float *z, *y;
  float *dz;
  double part[BCE_MAX_BLOCKS];
} bce_job;

static void bce_task(void *arg, int t) {
  bce_job *j = arg;
  int i0 = t * j->blk, i1 = i0 + j->blk < j->B ? i0 + j->blk : j->B, B = j->B;
  double sum = 0.0;
  for (int i = i0; i < i1; i++) {
    double zi = j->z[i], yi = j->y[i];
    sum += (zi > 0.0 ? zi : 0.0) - zi * yi + log1p(exp(-fabs(zi)));
    if (j->dz) {
      double p = zi >= 0.0 ? 1.0 / (1.0 + exp(-zi))
                           : exp(zi) / (1.0 + exp(zi));
      j->dz[i] = (float)((p - yi) / B);
    }
  }
  j->part[t] = sum;
}

static double cpu_bce_logits(int B, const float *z, const float *y,
                             float *dz) {
  if (B <= 0) return 0.0;
  static _Thread_local bce_job j; /* part[] is 32 KiB: not on the stack */
  j.B = B, j.z = z, j.y = y, j.dz = dz;
  j.blk = BCE_BLOCK;
  if (B > BCE_BLOCK * BCE_MAX_BLOCKS) j.blk = (B + BCE_MAX_BLOCKS - 1) / BCE_MAX_BLOCKS;
  int n = (B + j.blk - 1) / j.blk;
  dense_pool_run(dense_pool_default(), n, bce_task, &j);
  double sum = 0.0;
  for (int t = 0; t < n; t++) sum += j.part[t];
  return sum / B;
}

/* Element-wise kernels split in fixed chunks (any split gives the same bits). */
#define ELT_CHUNK 16384
typedef struct {
  size_t n, blk;
  float lr;
  const float *g;
  float *p;
} sgd_job;

static void sgd_task(void *arg, int t) {
  const sgd_job *j = arg;
  size_t i0 = (size_t)t * j->blk, i1 = i0 + j->blk < j->n ? i0 + j->blk : j->n;
  const float *restrict g = j->g;
  float *restrict p = j->p;
  for (size_t i = i0; i < i1; i++) p[i] -= j->lr * g[i];
}

static void cpu_sgd(size_t n, float lr, const float *g, float *p) {
  sgd_job j = {n, ELT_CHUNK, lr, g, p};
  size_t tasks = (n + ELT_CHUNK - 1) / ELT_CHUNK;
  if (tasks > DENSE_POOL_MAX_TASKS) tasks = 1, j.blk = n; /* one pass */
  dense_pool_run(dense_pool_default(), (int)tasks, sgd_task, &j);
}

/* The batch kernels of a kernel set over the pool: bias + activation by
 * blocks of ELT_ROWS rows, the ReLU/bias gradient by blocks of ELT_COLS
 * columns (each column still summed over the rows in order), the
 * interaction by blocks of INTERACT_SAMPLES samples. Small batches are one
 * task. */
#define ELT_ROWS 32
#define ELT_COLS 64
#define ELT_SPLIT_MIN 65536 /* floats of a batch below which it is one task */
#define INTERACT_SAMPLES 16
typedef struct {
  int B, N, ld, relu, ni, d, itself, r_stride, blk;
  const float *bias, *y, *T, *dR;
  float *out, *db, *R, *dT;
  /* The interaction's gather into T[b] = [xb[b], emb[b]] (forward; T is
   * then dense_interact_dot_forward's writable buffer) and scatter of dT[b]
   * to dxb[b] and d_emb[b] (backward; d_emb may be NULL), done by each task
   * for its own samples when xb / dxb is set. */
  const float *xb, *emb;
  float *dxb, *d_emb;
  union {
    void (*bias_act)(int, int, const float *, int, float *);
    void (*relu_bias)(int, int, int, const float *, float *, float *);
    void (*fwd)(int, int, int, int, const float *, float *, int);
    void (*bwd)(int, int, int, int, const float *, const float *, int, float *);
  } k;
} batch_job;

static int blocks_of(int n, int blk) { return (n + blk - 1) / blk; }
static int rest(int n, int i0, int blk) { return n - i0 < blk ? n - i0 : blk; }

static void bias_act_task(void *arg, int t) {
  const batch_job *j = arg;
  int r0 = t * j->blk;
  j->k.bias_act(rest(j->B, r0, j->blk), j->N, j->bias, j->relu, j->out + (size_t)r0 * j->N);
}
static void relu_bias_task(void *arg, int t) {
  const batch_job *j = arg;
  int c0 = t * j->blk;
  j->k.relu_bias(j->B, rest(j->N, c0, j->blk), j->ld, j->y ? j->y + c0 : NULL, j->out + c0,
                 j->db + c0);
}
/* Samples [b0, b1): T[b] = [xb[b], emb[b]] (ni vectors of width d). */
static void interact_gather(size_t b0, size_t b1, int ni, int d, const float *xb,
                            const float *emb, float *T) {
  size_t ts = (size_t)ni * d, es = ts - d;
  for (size_t b = b0; b < b1; b++) {
    memcpy(T + b * ts, xb + b * d, sizeof(float) * d);
    memcpy(T + b * ts + d, emb + b * es, sizeof(float) * es);
  }
}
/* Samples [b0, b1): dT[b] to dxb[b] and (unless NULL) d_emb[b]. */
static void interact_scatter(size_t b0, size_t b1, int ni, int d, const float *dT, float *dxb,
                             float *d_emb) {
  size_t ts = (size_t)ni * d, es = ts - d;
  for (size_t b = b0; b < b1; b++) {
    memcpy(dxb + b * d, dT + b * ts, sizeof(float) * d);
    if (d_emb) memcpy(d_emb + b * es, dT + b * ts + d, sizeof(float) * es);
  }
}
static void fwd_task(void *arg, int t) {
  const batch_job *j = arg;
  int b0 = t * j->blk;
  size_t ts = (size_t)j->ni * j->d;
  if (j->xb)
    interact_gather(b0, b0 + rest(j->B, b0, j->blk), j->ni, j->d, j->xb, j->emb, (float *)j->T);
  j->k.fwd(rest(j->B, b0, j->blk), j->ni, j->d, j->itself, j->T + b0 * ts,
           j->R + (size_t)b0 * j->r_stride, j->r_stride);
}
static void bwd_task(void *arg, int t) {
  const batch_job *j = arg;
  int b0 = t * j->blk;
  size_t ts = (size_t)j->ni * j->d;
  j->k.bwd(rest(j->B, b0, j->blk), j->ni, j->d, j->itself, j->T + b0 * ts,
           j->dR + (size_t)b0 * j->r_stride, j->r_stride, j->dT + b0 * ts);
  if (j->dxb)
    interact_scatter(b0, b0 + rest(j->B, b0, j->blk), j->ni, j->d, j->dT, j->dxb, j->d_emb);
}

#define DENSE_BATCH_KERNELS(isa)                                                     \
  static void par_bias_act_##isa(int B, int N, const float *bias, int relu,        \
                                 float *y) {                                       \
    batch_job j = {.B = B, .N = N, .relu = relu, .bias = bias, .out = y,           \
                   .blk = (size_t)B * N < ELT_SPLIT_MIN ? B : ELT_ROWS};           \
    j.k.bias_act = cpu_bias_act_forward_##isa;                                     \
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), bias_act_task, &j);  \
  }                                                                                \
  static void par_relu_bias_##isa(int B, int N, int ld, const float *y,            \
                                  float *dy, float *db) {                          \
    batch_job j = {.B = B, .N = N, .ld = ld, .y = y, .out = dy, .db = db,          \
                   .blk = (size_t)B * N < ELT_SPLIT_MIN ? N : ELT_COLS};           \
    j.k.relu_bias = cpu_relu_bias_grad_##isa;                                      \
    dense_pool_run(dense_pool_default(), blocks_of(N, j.blk), relu_bias_task, &j); \
  }                                                                                \
  static void par_fwd_##isa(int B, int ni, int d, int itself, const float *T,      \
                            float *R, int r_stride) {                              \
    batch_job j = {.B = B, .ni = ni, .d = d, .itself = itself, .T = T, .R = R,     \
                   .r_stride = r_stride, .blk = INTERACT_SAMPLES};                 \
    j.k.fwd = dense__interact_fwd_##isa;                                           \
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), fwd_task, &j);       \
  }                                                                                \
  static void par_bwd_##isa(int B, int ni, int d, int itself, const float *T,      \
                            const float *dR, int r_stride, float *dT) {            \
    batch_job j = {.B = B, .ni = ni, .d = d, .itself = itself, .T = T, .dR = dR,   \
                   .r_stride = r_stride, .dT = dT, .blk = INTERACT_SAMPLES};       \
    j.k.bwd = dense__interact_bwd_##isa;                                           \
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), bwd_task, &j);       \
  }

DENSE_BATCH_KERNELS(base)
#if DENSE_X86
DENSE_BATCH_KERNELS(avx2)
#endif

/* The cross layer's element-wise kernels over the pool, in blocks of
 * ELT_ROWS rows (one task below ELT_SPLIT_MIN floats): every element is
 * computed alone, so any split gives the same bits. */
typedef struct {
  int B, W, blk, init, add_g;
  const float *bias, *x0, *xl, *g, *q;
  float *qo, *out, *dq, *acc;
  void (*fwd)(int, int, const float *, const float *, const float *, float *, float *);
  void (*bwd)(int, int, const float *, const float *, const float *, float *, float *, int,
              int);
} cross_job;

static void cross_fwd_task(void *arg, int t) {
  const cross_job *j = arg;
  size_t o = (size_t)t * j->blk * j->W;
  j->fwd(rest(j->B, t * j->blk, j->blk), j->W, j->bias, j->x0 + o, j->xl + o, j->qo + o,
         j->out + o);
}
static void cross_bwd_task(void *arg, int t) {
  const cross_job *j = arg;
  size_t o = (size_t)t * j->blk * j->W;
  j->bwd(rest(j->B, t * j->blk, j->blk), j->W, j->g + o, j->x0 + o, j->q + o, j->dq + o,
         j->acc + o, j->init, j->add_g);
}

#define DENSE_CROSS_KERNELS(isa)                                                          \
  static void par_cross_fwd_##isa(int B, int W, const float *bias, const float *x0,     \
                                  const float *xl, float *q, float *out) {              \
    cross_job j = {.B = B, .W = W, .bias = bias, .x0 = x0, .xl = xl, .qo = q, .out = out, \
                   .blk = (size_t)B * W < ELT_SPLIT_MIN ? B : ELT_ROWS,                 \
                   .fwd = cpu_cross_forward_##isa};                                     \
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), cross_fwd_task, &j);      \
  }                                                                                     \
  static void par_cross_bwd_##isa(int B, int W, const float *g, const float *x0,        \
                                  const float *q, float *dq, float *acc, int init,      \
                                  int add_g) {                                          \
    cross_job j = {.B = B, .W = W, .g = g, .x0 = x0, .q = q, .dq = dq, .acc = acc,      \
                   .init = init, .add_g = add_g,                                        \
                   .blk = (size_t)B * W < ELT_SPLIT_MIN ? B : ELT_ROWS,                 \
                   .bwd = cpu_cross_backward_##isa};                                    \
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), cross_bwd_task, &j);      \
  }
DENSE_CROSS_KERNELS(base)
#if DENSE_X86
DENSE_CROSS_KERNELS(avx2)
#endif

/* The two kernel sets (sgemm, loss and SGD shared), each over the pool. */
#define CPU_BACKEND(label, isa)                                \
  {.name = label,                                              \
   .gemm = cpu_gemm,                                           \
   .bias_act_forward = par_bias_act_##isa,                     \
   .relu_bias_grad = par_relu_bias_##isa,                      \
   .interact_dot_forward = par_fwd_##isa,                      \
   .interact_dot_backward = par_bwd_##isa,                     \
   .bce_logits = cpu_bce_logits,                               \
   .sgd = cpu_sgd,                                             \
   .cross_forward = par_cross_fwd_##isa,                       \
   .cross_backward = par_cross_bwd_##isa}
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
  case DENSE_ISA_AVX2:
#if DENSE_X86
    if (cpu_has_avx2_fma()) return &cpu_backend_avx2;
#endif
    return NULL;
  }
  return NULL;
}

int dense_isa_parse(const char *name, dense_isa *out, char *err, size_t errlen) {
  if (name && !strcmp(name, "baseline")) {
    *out = DENSE_ISA_BASELINE;
    return SR_OK;
  }
  if (!name || strcmp(name, "avx2")) {
    sr_fmt(err, errlen, "'%s' is not baseline or avx2", name ? name : "");
    return SR_EINVAL;
  }
  if (!dense_backend_cpu_isa(DENSE_ISA_AVX2)) {
    sr_fmt(err, errlen, "avx2: this CPU (or build) has no AVX2 and FMA; use baseline");
    return SR_EUNSUPPORTED;
  }
  *out = DENSE_ISA_AVX2;
  return SR_OK;
}

const char *dense_backend_kernels(const dense_backend *be) {
  if (be == &cpu_backend_base) return "baseline";
#if DENSE_X86
  if (be == &cpu_backend_avx2) return "avx2";
#endif
  return be ? be->name : "none";
}

const dense_backend *dense_backend_cpu(void) {
  return dense_backend_cpu_isa(DENSE_ISA_BEST);
}

/* ---- layers on top of a backend ---------------------------------------- */

/* The kernels a CPU kernel set runs inside its layers' pool tasks (the
 * products' element-wise ends, the interaction beside its gathers), or
 * NULL for another backend (which then runs its ops one by one). */
typedef struct {
  void (*bias_act)(int, int, const float *, int, float *);
  void (*relu_mask)(int, int, int, const float *, float *);
  void (*interact_fwd)(int, int, int, int, const float *, float *, int);
  void (*interact_bwd)(int, int, int, int, const float *, const float *, int, float *);
} cpu_layer_kernels;

static const cpu_layer_kernels *cpu_layer_kernels_of(const dense_backend *be) {
  static const cpu_layer_kernels base = {cpu_bias_act_forward_base, cpu_relu_mask_base,
                                     dense__interact_fwd_base, dense__interact_bwd_base};
  if (be == &cpu_backend_base) return &base;
#if DENSE_X86
  static const cpu_layer_kernels avx2 = {cpu_bias_act_forward_avx2, cpu_relu_mask_avx2,
                                     dense__interact_fwd_avx2, dense__interact_bwd_avx2};
  if (be == &cpu_backend_avx2) return &avx2;
#endif
  return NULL;
}

/* On the CPU a layer's forward is one run of the pool (each block of the
 * product gets its bias and ReLU while in cache) and its backward's two
 * products another, so the threads meet once per product pair rather than
 * once per kernel. The blocks and each element's arithmetic are those of
 * the ops alone. */
void dense_linear_forward(const dense_backend *be, int B, int K, int N,
                          const float *in, const float *W, const float *b,
                          int relu, float *out) {
  /* out[B][N] = in[B][K] * W[N][K]^T */
  gemm_job g = gemm_of(0, 1, B, N, K, 1.0f, in, K, W, K, 0.0f, out, N);
  const cpu_layer_kernels *ep = cpu_layer_kernels_of(be);
  if (ep) {
    g.bias_act = ep->bias_act, g.bias = b, g.relu = relu;
    gemm_run(&g, 1);
    return;
  }
  be->gemm(0, 1, B, N, K, 1.0f, in, K, W, K, 0.0f, out, N);
  be->bias_act_forward(B, N, b, relu, out);
}

int dense_linear_backward(const dense_backend *be, int B, int K, int N,
                          const float *in, const float *W, const float *out,
                          int relu, float *dout, float *dW, float *db,
                          float *din, int din_relu) {
  be->relu_bias_grad(B, N, N, relu ? out : NULL, dout, db);
  /* dW[N][K] = dz[B][N]^T * in[B][K]; din[B][K] = dz[B][N] * W[N][K] */
  const cpu_layer_kernels *ep = cpu_layer_kernels_of(be);
  if (ep) {
    gemm_job g[2] = {gemm_of(1, 0, N, K, B, 1.0f, dout, N, in, K, 0.0f, dW, K),
                     gemm_of(0, 0, B, K, N, 1.0f, dout, N, W, K, 0.0f, din, K)};
    if (din && din_relu) g[1].mask = in, g[1].relu_mask = ep->relu_mask;
    gemm_run(g, din ? 2 : 1);
    return din && din_relu;
  }
  be->gemm(1, 0, N, K, B, 1.0f, dout, N, in, K, 0.0f, dW, K);
  if (din) be->gemm(0, 0, B, K, N, 1.0f, dout, N, W, K, 0.0f, din, K);
  return 0;
}

void dense_interact_dot_forward(const dense_backend *be, int B, int ni, int d, int itself,
                                const float *xb, const float *emb, float *T, float *R,
                                int r_stride) {
  const cpu_layer_kernels *ep = cpu_layer_kernels_of(be);
  if (ep) {
    batch_job j = {.B = B, .ni = ni, .d = d, .itself = itself, .T = T, .R = R,
                   .r_stride = r_stride, .blk = INTERACT_SAMPLES, .xb = xb, .emb = emb};
    j.k.fwd = ep->interact_fwd;
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), fwd_task, &j);
    return;
  }
  interact_gather(0, (size_t)B, ni, d, xb, emb, T);
  be->interact_dot_forward(B, ni, d, itself, T, R, r_stride);
}

void dense_interact_dot_backward(const dense_backend *be, int B, int ni, int d, int itself,
                                 const float *T, const float *dR, int r_stride, float *dT,
                                 float *dxb, float *d_emb) {
  const cpu_layer_kernels *ep = cpu_layer_kernels_of(be);
  if (ep) {
    batch_job j = {.B = B, .ni = ni, .d = d, .itself = itself, .T = T, .dR = dR,
                   .r_stride = r_stride, .dT = dT, .blk = INTERACT_SAMPLES, .dxb = dxb,
                   .d_emb = d_emb};
    j.k.bwd = ep->interact_bwd;
    dense_pool_run(dense_pool_default(), blocks_of(B, j.blk), bwd_task, &j);
    return;
  }
  be->interact_dot_backward(B, ni, d, itself, T, dR, r_stride, dT);
  interact_scatter(0, (size_t)B, ni, d, dT, dxb, d_emb);
}

void dense_cross_forward(const dense_backend *be, int B, int W, int R,
                         const float *x0, const float *xl, const float *V,
                         const float *U, const float *b, float *P, float *Q,
                         float *out) {
  /* P[B][R] = xl[B][W] * V[R][W]^T; Q[B][W] = P[B][R] * U[W][R]^T */
  be->gemm(0, 1, B, R, W, 1.0f, xl, W, V, W, 0.0f, P, R);
  be->gemm(0, 1, B, W, R, 1.0f, P, R, U, R, 0.0f, Q, W);
  be->cross_forward(B, W, b, x0, xl, Q, out); /* Q += b; out = x0 * Q + xl */
}

void dense_cross_backward(const dense_backend *be, int B, int W, int R,
                          const float *x0, const float *xl, const float *V,
                          const float *U, const float *P, const float *Q,
                          float *g, float *dq, float *dp, float *acc, int init,
                          int first, float *dV, float *dU, float *db) {
  /* dq = g * x0; acc (+)= g * Q (+ g when first) */
  be->cross_backward(B, W, g, x0, Q, dq, acc, init, first);
  be->relu_bias_grad(B, W, W, NULL, dq, db); /* db[W] = colsum(dq) */
  /* dU[W][R] = dq[B][W]^T * P[B][R]; dp[B][R] = dq[B][W] * U[W][R] */
  be->gemm(1, 0, W, R, B, 1.0f, dq, W, P, R, 0.0f, dU, R);
  be->gemm(0, 0, B, R, W, 1.0f, dq, W, U, R, 0.0f, dp, R);
  /* dV[R][W] = dp[B][R]^T * xl[B][W]; d xl = g + dp[B][R] * V[R][W] */
  be->gemm(1, 0, R, W, B, 1.0f, dp, R, xl, W, 0.0f, dV, W);
  be->gemm(0, 0, B, W, R, 1.0f, dp, R, V, W, 1.0f, first ? acc : g, W);
}
