/* Dense math backend: the few kernels a DLRM dense step needs, behind a small
 * struct of function pointers (ggml-backend style). The CPU implementation
 * (OpenBLAS sgemm + plain vectorisable loops) is the reference that every
 * other backend (CUDA, later) is tested against.
 *
 * All matrices are row-major. B = batch rows, N = output width, K = input
 * width. Kernels never allocate and never fail: shapes are checked by the
 * caller (dense_model). */
#ifndef SHARDREC_DENSE_BACKEND_H
#define SHARDREC_DENSE_BACKEND_H

#include <stddef.h>

typedef struct dense_backend {
  const char *name;

  /* C[M][N] = alpha * op(A)[M][K] * op(B)[K][N] + beta * C, row-major;
   * trans_a / trans_b nonzero means op(X) = X^T (so A is stored [K][M]). */
  void (*gemm)(int trans_a, int trans_b, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc);

  /* y[B][N] += bias[N]; then y = max(y, 0) when relu. In place. */
  void (*bias_act_forward)(int B, int N, const float *bias, int relu, float *y);

  /* Unless y is NULL, dy[B][N] *= (y[B][N] > 0): ReLU backward from the
   * ReLU's output (the gradient at 0 is 0, as torch's threshold_backward),
   * in place. Then db[N] = sum over rows of dy (the bias gradient), rows
   * added in order; db is overwritten. One pass over dy. Rows of y and dy
   * are ld >= N floats apart (so a caller can hand out column ranges). */
  void (*relu_bias_grad)(int B, int N, int ld, const float *y, float *dy,
                         float *db);

  /* Dot interaction, per sample b (see dense/layers.h for the exact order):
   * T[B][ni][d] -> R[B][r_stride], R[b] = [T[b][0], Zflat] with
   * Zflat = T T^T lower triangle, strict unless itself. */
  void (*interact_dot_forward)(int B, int ni, int d, int itself,
                               const float *T, float *R, int r_stride);
  /* dR[B][r_stride] -> dT[B][ni][d] (overwritten). */
  void (*interact_dot_backward)(int B, int ni, int d, int itself,
                                const float *T, const float *dR, int r_stride,
                                float *dT);

  /* Mean BCE-with-logits over B samples; dz[B] = d(mean loss)/dz (may be NULL).
   * Returns the mean loss (accumulated in double). */
  double (*bce_logits)(int B, const float *z, const float *y, float *dz);

  /* p[i] -= lr * g[i] (plain SGD), n elements. */
  void (*sgd)(size_t n, float lr, const float *g, float *p);

  /* The element-wise parts of a DCN-v2 cross layer (dense/layers.h), all
   * [B][W] row-major. Forward: q += bias[W] (q = U V x_l on entry), then
   * x_out = x0 * q + x_l (x_out may be neither x0, x_l nor q). Backward
   * from g = d x_{l+1}: dq = g * x0, and
   * acc = (init ? 0 : acc) + g * q, plus g when add_g (the identity path
   * of the first layer). NULL in a backend without the cross network. */
  void (*cross_forward)(int B, int W, const float *bias, const float *x0,
                        const float *xl, float *q, float *x_out);
  void (*cross_backward)(int B, int W, const float *g, const float *x0,
                         const float *q, float *dq, float *acc, int init,
                         int add_g);
} dense_backend;

/* Kernel sets of the CPU backend. */
typedef enum {
  DENSE_ISA_BEST = 0,     /* the widest this CPU runs: AVX2/FMA where it has them */
  DENSE_ISA_BASELINE = 1, /* the build's baseline ISA only (SSE2 on x86-64) */
  DENSE_ISA_AVX2 = 2,     /* AVX2/FMA (only where the CPU has them) */
} dense_isa;

/* "baseline" or "avx2" (--dense-isa) into *out; 0, or SR_EINVAL for another
 * name, or SR_EUNSUPPORTED for avx2 on a CPU (or build) without AVX2 and
 * FMA, with the reason in err. */
int dense_isa_parse(const char *name, dense_isa *out, char *err, size_t errlen);

/* The kernel set of a CPU backend object: "baseline" or "avx2"; for any
 * other backend its name. */
const char *dense_backend_kernels(const dense_backend *be);

/* OpenBLAS as this process runs it: its version ("0.3.21", from
 * openblas_get_config) and the kernel family it picked for this CPU
 * (openblas_get_corename: "Haswell", "Zen", "SkylakeX", ...; forced by
 * OPENBLAS_CORETYPE). Static strings. */
const char *dense_blas_version(void);
const char *dense_blas_core(void);

/* The kernel family to ask OpenBLAS for when it picked a slower one than
 * the CPU runs, or NULL. core: the family OpenBLAS reports; config: its
 * openblas_get_config() (only a DYNAMIC_ARCH build picks a family at run
 * time, so only there can OPENBLAS_CORETYPE change it); forced: the value
 * of OPENBLAS_CORETYPE or NULL. For a core other than Haswell, Zen,
 * SkylakeX, Cooperlake, SapphireRapids or Excavator (any case) on a CPU with
 * AVX2, unless it is the one forced: "SkylakeX" where the CPU has AVX-512,
 * else "Haswell". An OpenBLAS that does not know the CPU's model reports
 * Prescott (SSE3 kernels); one that refuses a forced name does too. */
const char *dense_blas_core_hint_for(const char *core, const char *config, int avx2, int avx512,
                                     const char *forced);

/* The same asked of this process's OpenBLAS, CPU and environment: where
 * there is a family to ask for, the sentence that says so ("OpenBLAS runs
 * its generic Prescott kernels on this AVX-512 CPU; OPENBLAS_CORETYPE=
 * SkylakeX runs ...") in buf and 1; else 0. For a run's header. */
int dense_blas_core_warning(char *buf, size_t len);

/* The CPU backend's fixed partition of a product C[M][N] (inner size K)
 * into tasks for the dense pool (dense/pool.h): returns the task count; the
 * tasks are blocks of *blk rows of C (*by_rows) or of *blk columns. Depends
 * on the shape only, never on the thread count. */
#define DENSE_GEMM_ROW_BLOCK 128
#define DENSE_GEMM_COL_BLOCK 64
#define DENSE_GEMM_SPLIT_MIN (1 << 20) /* multiply-adds: smaller is one block */
int dense_gemm_tasks(int M, int N, int K, int *by_rows, int *blk);

/* A product that is one block by the rule above runs as two tasks when it
 * has DENSE_GEMM_HALVE_MIN multiply-adds or DENSE_GEMM_HALVE_OUT floats of
 * C or more, and 2 * DENSE_GEMM_ROW_ALIGN rows: C's rows cut at a multiple
 * of DENSE_GEMM_ROW_ALIGN near M / 2. OpenBLAS's Zen/Haswell sgemm kernel
 * tiles C's rows (its N, row-major) by 12 and sums an element alike in
 * every tile of 12, so such a cut gives each element the bits of the whole
 * product (a cut elsewhere, or a cut of columns, changes some). Returns the
 * rows of the first task (*cut), or 0 when the product stays one task. */
#define DENSE_GEMM_ROW_ALIGN 24
#define DENSE_GEMM_HALVE_MIN (1 << 18)
#define DENSE_GEMM_HALVE_OUT (1 << 15)
int dense_gemm_cut(int M, int N, int K);

/* The CPU/OpenBLAS backend with the kernels of isa (static object; never
 * freed); NULL for a value not in dense_isa, or DENSE_ISA_AVX2 on a CPU
 * without it. The sets share sgemm, the loss
 * and SGD; the element-wise kernels give the same bits in both, the d == 16
 * dot interaction differs in rounding (FMA, summation order). One machine
 * and one isa always give the same bits, whatever the dense pool's thread
 * count: every kernel runs on the default pool (dense/pool.h) in blocks
 * fixed by the shapes, and OpenBLAS is set to one thread before the first
 * product. A program picks the set at start-up
 * (dense_backend_set_default, dense_model_create_on); tests run their
 * suites on both. */
const dense_backend *dense_backend_cpu_isa(dense_isa isa);

/* dense_backend_cpu_isa(DENSE_ISA_BEST): the backend every program uses
 * unless it chooses another. */
const dense_backend *dense_backend_cpu(void);

#endif
