/* The dense pool and the CPU backend's fixed partitions: every task of a run
 * runs exactly once; the step's products, its other kernels and a whole
 * model step give the same bits with 1, 2 and 3 threads, also when OpenBLAS
 * has been told to use several threads of its own (it must be held at one:
 * its threaded sgemm rounds differently). Runs on both kernel sets
 * (tests/dense/dense_test_isa.h). */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "common/sys.h"
#include "dense/backend.h"
#include "dense/layers.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "dense/pool.h"
#include "tests/check_main.h"
#include "tests/dense/dense_test_isa.h"

static void fill(sr_rng *r, float *a, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = (float)sr_rng_uniform(r) - 0.5f;
}

/* ---- the pool itself ------------------------------------------------------ */

typedef struct {
  _Atomic int hits[2000];
} count_ctx;

static void count_task(void *arg, int t) {
  count_ctx *c = arg;
  atomic_fetch_add(&c->hits[t], 1);
}

START_TEST(test_pool_runs_each_task_once) {
  char err[256];
  for (int th = 1; th <= 3; th++) {
    dense_pool *p = dense_pool_create(th, err, sizeof err);
    ck_assert_msg(p != NULL, "%s", err);
    ck_assert_int_eq(dense_pool_threads(p), th);
    static count_ctx c;
    for (int run = 0; run < 300; run++) {
      int n = 1 + (run * 37) % 2000;
      memset(&c, 0, sizeof c);
      dense_pool_run(p, n, count_task, &c);
      for (int t = 0; t < 2000; t++)
        ck_assert_msg(c.hits[t] == (t < n), "threads %d run %d: task %d ran %d times (n %d)",
                      th, run, t, (int)c.hits[t], n);
    }
    dense_pool_destroy(p);
  }
  ck_assert_ptr_null(dense_pool_create(0, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "out of range"));
  ck_assert_int_eq(dense_pool_threads(NULL), 1);
  dense_pool_destroy(NULL);
}
END_TEST

/* The pool's workers are named "sr:dense": with 2 threads, two tasks that
 * each wait for the other to start run on both threads at once, and the
 * worker's then burns 20 ms of its own CPU, which the name finds. */
typedef struct {
  _Atomic int started;
} meet_ctx;

static void meet_task(void *arg, int t) {
  meet_ctx *m = arg;
  (void)t;
  atomic_fetch_add(&m->started, 1);
  while (atomic_load(&m->started) < 2) {
  }
  const uint64_t t0 = sr_thread_cpu_ns();
  volatile uint64_t x = 1;
  while (sr_thread_cpu_ns() - t0 < 20000000u) x = x * 6364136223846793005ull + 1;
}

START_TEST(test_pool_workers_named) {
  char err[256];
  dense_pool *p = dense_pool_create(2, err, sizeof err);
  ck_assert_msg(p != NULL, "%s", err);
  const uint64_t before = sr_named_threads_cpu_ns("sr:dense");
  meet_ctx m = {0};
  dense_pool_run(p, 2, meet_task, &m);
  const uint64_t named = sr_named_threads_cpu_ns("sr:dense") - before;
  dense_pool_destroy(p);
  ck_assert_msg(named >= 20000000u, "the worker named sr:dense took %llu ns",
                (unsigned long long)named);
}
END_TEST

/* Two tasks that each wait for the other to start: they finish only when a
 * worker runs one of them beside the caller. */
static void pair_task(void *arg, int t) {
  meet_ctx *m = arg;
  (void)t;
  atomic_fetch_add(&m->started, 1);
  while (atomic_load(&m->started) < 2) {
  }
}

/* dense_pool_rest sends the spinning workers to sleep; the next run still
 * has them: rested right after a run (the worker still spinning), after the
 * worker fell asleep by itself, and twice in a row. A run that lost its
 * worker would never end. */
START_TEST(test_pool_rest_keeps_workers) {
  char err[256];
  dense_pool *p = dense_pool_create(2, err, sizeof err);
  ck_assert_msg(p != NULL, "%s", err);
  dense_pool_rest(NULL);
  for (int k = 0; k < 300; k++) {
    meet_ctx m = {0};
    dense_pool_run(p, 2, pair_task, &m);
    ck_assert_int_eq(atomic_load(&m.started), 2);
    if (k % 3 == 1) nanosleep(&(struct timespec){0, 1000000}, NULL); /* past the workers' spin */
    dense_pool_rest(p);
    if (k % 3 == 2) dense_pool_rest(p);
  }
  dense_pool_destroy(p);
}
END_TEST

/* A task that runs a pool itself: the inner run goes on its caller. */
static dense_pool *nest_pool;
static void nest_task(void *arg, int t) {
  count_ctx *c = arg;
  dense_pool_run(nest_pool, 10, count_task, &c[t + 1]);
}

START_TEST(test_pool_nested_run) {
  char err[256];
  nest_pool = dense_pool_create(3, err, sizeof err);
  ck_assert_ptr_nonnull(nest_pool);
  count_ctx *c = calloc(5, sizeof *c);
  dense_pool_run(nest_pool, 4, nest_task, c);
  for (int k = 1; k <= 4; k++)
    for (int t = 0; t < 10; t++) ck_assert_int_eq(c[k].hits[t], 1);
  free(c);
  dense_pool_destroy(nest_pool);
}
END_TEST

/* ---- the partitions ----------------------------------------------------- */

static const dense_config *kaggle(int B) {
  static dense_config c;
  memset(&c, 0, sizeof c);
  int bot[] = {13, 512, 256, 64, 16}, top[] = {512, 256, 1};
  memcpy(c.bot, bot, sizeof bot);
  memcpy(c.top, top, sizeof top);
  c.n_bot = 5, c.n_top = 3, c.n_dense = 13, c.n_sparse = 26, c.emb_dim = 16;
  c.interaction = DENSE_INTERACT_DOT, c.max_batch = B;
  return &c;
}

/* Run with a pool of th threads as the default and OpenBLAS told to use
 * blas threads of its own. */
static dense_pool *use_threads(int th, int blas) {
  char err[256];
  dense_pool *p = dense_pool_create(th, err, sizeof err);
  ck_assert_msg(p != NULL, "%s", err);
  dense_pool_set_default(p);
  openblas_set_num_threads(blas);
  return p;
}
static void done_threads(dense_pool *p) {
  dense_pool_set_default(NULL);
  dense_pool_destroy(p);
}

/* Every sgemm of a Kaggle step at batches 128 and 512: C bit-identical with
 * 1, 2 and 3 threads; some shapes are split (by rows and by columns), so the
 * threads do share the work. */
START_TEST(test_gemm_same_bits_any_threads) {
  const dense_backend *be = dense_test_be;
  int split_rows = 0, split_cols = 0;
  for (int Bi = 0; Bi < 2; Bi++) {
    int B = Bi ? 512 : 128;
    dense_gemm_shape sh[64];
    int ns = dense_model_gemm_shapes(kaggle(B), B, sh, 64);
    ck_assert_int_gt(ns, 10);
    for (int i = 0; i < ns; i++) {
      int M = sh[i].M, N = sh[i].N, K = sh[i].K, by_rows, blk;
      int tasks = dense_gemm_tasks(M, N, K, &by_rows, &blk);
      if (tasks > 1) split_rows += by_rows, split_cols += !by_rows;
      sr_rng r;
      sr_rng_init(&r, 7, (uint64_t)i);
      float *A = malloc(sizeof(float) * M * K), *Bm = malloc(sizeof(float) * K * N);
      float *C[3];
      fill(&r, A, (size_t)M * K);
      fill(&r, Bm, (size_t)K * N);
      int lda = sh[i].trans_a ? M : K, ldb = sh[i].trans_b ? K : N;
      for (int th = 1; th <= 3; th++) {
        C[th - 1] = malloc(sizeof(float) * M * N);
        dense_pool *p = use_threads(th, th);
        be->gemm(sh[i].trans_a, sh[i].trans_b, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f,
                 C[th - 1], N);
        done_threads(p);
      }
      for (int th = 2; th <= 3; th++)
        ck_assert_msg(!memcmp(C[0], C[th - 1], sizeof(float) * M * N),
                      "B %d gemm %d (%dx%dx%d, %d tasks): %d threads differ from 1", B, i, M,
                      N, K, tasks, th);
      for (int k = 0; k < 3; k++) free(C[k]);
      free(A);
      free(Bm);
    }
  }
  ck_assert_int_gt(split_rows, 0);
  ck_assert_int_gt(split_cols, 0);
}
END_TEST

/* The products that are one block and large enough (the 13-wide input
 * layer and its weight gradient, the 64-wide layer at batch 128) run as two
 * tasks cut at a multiple of DENSE_GEMM_ROW_ALIGN rows, and every product
 * of a Kaggle step at batches 48, 128 and 200 that is cut gives the bits of
 * one single-thread sgemm of the whole product, with 1, 2 and 3 threads. */
START_TEST(test_gemm_cut_keeps_one_block_bits) {
  const dense_backend *be = dense_test_be;
  ck_assert_int_eq(dense_gemm_cut(128, 512, 13), 72);  /* bottom 13 -> 512 */
  ck_assert_int_eq(dense_gemm_cut(512, 13, 128), 264); /* its weight gradient */
  ck_assert_int_eq(dense_gemm_cut(128, 64, 256), 72);  /* bottom 256 -> 64 */
  ck_assert_int_eq(dense_gemm_cut(128, 512, 367), 0);  /* split in columns already */
  ck_assert_int_eq(dense_gemm_cut(128, 16, 64), 0);    /* too small to share */
  int cut = 0;
  const int batches[] = {48, 128, 200};
  for (int Bi = 0; Bi < 3; Bi++) {
    int B = batches[Bi];
    dense_gemm_shape sh[64];
    int ns = dense_model_gemm_shapes(kaggle(B), B, sh, 64);
    for (int i = 0; i < ns; i++) {
      int M = sh[i].M, N = sh[i].N, K = sh[i].K;
      if (!dense_gemm_cut(M, N, K)) continue;
      cut++;
      sr_rng r;
      sr_rng_init(&r, 11, (uint64_t)i);
      float *A = malloc(sizeof(float) * M * K), *Bm = malloc(sizeof(float) * K * N);
      float *want = malloc(sizeof(float) * M * N), *got = malloc(sizeof(float) * M * N);
      fill(&r, A, (size_t)M * K);
      fill(&r, Bm, (size_t)K * N);
      int lda = sh[i].trans_a ? M : K, ldb = sh[i].trans_b ? K : N;
      openblas_set_num_threads(1);
      cblas_sgemm(CblasRowMajor, sh[i].trans_a ? CblasTrans : CblasNoTrans,
                  sh[i].trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, Bm, ldb,
                  0.0f, want, N);
      for (int th = 1; th <= 3; th++) {
        memset(got, 0xff, sizeof(float) * M * N);
        dense_pool *p = use_threads(th, th);
        be->gemm(sh[i].trans_a, sh[i].trans_b, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f, got, N);
        done_threads(p);
        ck_assert_msg(!memcmp(want, got, sizeof(float) * M * N),
                      "B %d gemm %d (%dx%dx%d, cut at row %d): %d threads differ from one sgemm",
                      B, i, M, N, K, dense_gemm_cut(M, N, K), th);
      }
      free(A);
      free(Bm);
      free(want);
      free(got);
    }
  }
  ck_assert_int_ge(cut, 6);
}
END_TEST

/* A layer's backward that masks its input gradient by the ReLU below as
 * each block of the product is formed (din_relu) gives the bits of masking
 * it afterwards with the ReLU/bias gradient, with 1, 2 and 3 threads: on
 * products split by columns (batch 128), by rows (batch 1024) and in one
 * block or cut in two (batch 48). */
START_TEST(test_linear_backward_masks_din_in_place) {
  const dense_backend *be = dense_test_be;
  const int shapes[][3] = {{128, 512, 256}, {128, 256, 64}, {1024, 256, 512}, {48, 64, 16},
                           {48, 256, 64}};
  int zeros = 0;
  for (int s = 0; s < 5; s++) {
    int B = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
    sr_rng r;
    sr_rng_init(&r, 17, (uint64_t)s);
    size_t nin = (size_t)B * K, nout = (size_t)B * N;
    float *in = malloc(sizeof(float) * nin), *W = malloc(sizeof(float) * N * K);
    float *out = malloc(sizeof(float) * nout), *dout0 = malloc(sizeof(float) * nout);
    float *dout = malloc(sizeof(float) * nout), *dW = malloc(sizeof(float) * N * K);
    float *db = malloc(sizeof(float) * N), *dbk = malloc(sizeof(float) * K);
    float *want = malloc(sizeof(float) * nin), *got = malloc(sizeof(float) * nin);
    fill(&r, in, nin);
    for (size_t i = 0; i < nin; i++) in[i] = in[i] > 0 ? in[i] : 0.0f; /* a ReLU's output */
    fill(&r, W, (size_t)N * K);
    fill(&r, out, nout);
    fill(&r, dout0, nout);
    memcpy(dout, dout0, sizeof(float) * nout);
    ck_assert_int_eq(dense_linear_backward(be, B, K, N, in, W, out, 1, dout, dW, db, want, 0), 0);
    be->relu_bias_grad(B, K, K, in, want, dbk);
    for (size_t i = 0; i < nin; i++) zeros += in[i] == 0.0f && want[i] == 0.0f;
    for (int th = 1; th <= 3; th++) {
      dense_pool *p = use_threads(th, th);
      memcpy(dout, dout0, sizeof(float) * nout);
      memset(got, 0xff, sizeof(float) * nin);
      ck_assert_int_eq(dense_linear_backward(be, B, K, N, in, W, out, 1, dout, dW, db, got, 1),
                       1);
      done_threads(p);
      ck_assert_msg(!memcmp(want, got, sizeof(float) * nin),
                    "%dx%dx%d, %d threads: din masked in the product differs from after it",
                    B, K, N, th);
    }
    free(in), free(W), free(out), free(dout0), free(dout), free(dW), free(db), free(dbk);
    free(want), free(got);
  }
  ck_assert_int_gt(zeros, 1000);
}
END_TEST

/* The Kaggle configuration with a cross network of 2 layers of rank 128
 * (x_0 of width 27 * 16) in place of the dot interaction. */
static const dense_config *kaggle_dcn(int B) {
  static dense_config c;
  c = *kaggle(B);
  c.interaction = DENSE_INTERACT_DCN, c.dcn_layers = 2, c.dcn_rank = 128;
  return &c;
}

/* A whole forward + backward + Adagrad step of cfg at batch 512 (cfg's
 * max_batch): logits, loss, d_emb, gradients and parameters bit-identical
 * with 1, 2, 3 threads. */
static void model_step_same_bits(const dense_config *cfg) {
  enum { B = 512 };
  size_t es = (size_t)B * 26 * 16;
  float *x = malloc(sizeof(float) * B * 13), *emb = malloc(sizeof(float) * es);
  float lab[B], logit[3][B], loss[3];
  float *demb[3], *par[3];
  size_t np = dense_config_param_count(cfg);
  sr_rng r;
  sr_rng_init(&r, 11, 0);
  fill(&r, x, (size_t)B * 13);
  fill(&r, emb, es);
  for (int i = 0; i < B; i++) lab[i] = (float)(i % 3 == 0);
  for (int th = 1; th <= 3; th++) {
    dense_pool *p = use_threads(th, 2);
    char err[256];
    dense_model *m = dense_model_create(cfg, 5, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    dense_opt_config oc = dense_opt_defaults(DENSE_OPT_ADAGRAD);
    dense_opt *o = dense_opt_create(&oc, np, err, sizeof err);
    demb[th - 1] = malloc(sizeof(float) * es);
    ck_assert_int_eq(dense_model_forward(m, B, x, emb, logit[th - 1]), 0);
    ck_assert_int_eq(dense_model_backward(m, B, lab, &loss[th - 1], demb[th - 1]), 0);
    float *params = dense_model_params(m, NULL);
    ck_assert_int_eq(dense_opt_step(o, params, dense_model_grads(m, NULL), 0.01f), 0);
    par[th - 1] = malloc(sizeof(float) * np);
    memcpy(par[th - 1], params, sizeof(float) * np);
    dense_opt_destroy(o);
    dense_model_destroy(m);
    done_threads(p);
  }
  for (int th = 2; th <= 3; th++) {
    ck_assert(!memcmp(logit[0], logit[th - 1], sizeof logit[0]));
    ck_assert_msg(!memcmp(&loss[0], &loss[th - 1], sizeof loss[0]), "loss %.9g vs %.9g",
                  loss[0], loss[th - 1]);
    ck_assert(!memcmp(demb[0], demb[th - 1], sizeof(float) * es));
    ck_assert(!memcmp(par[0], par[th - 1], sizeof(float) * np));
  }
  for (int k = 0; k < 3; k++) free(demb[k]), free(par[k]);
  free(x);
  free(emb);
}

START_TEST(test_model_step_same_bits_any_threads) { model_step_same_bits(kaggle(512)); }
END_TEST

/* The same with the cross network: its products split by rows, its
 * element-wise kernels in blocks of rows. */
START_TEST(test_dcn_step_same_bits_any_threads) { model_step_same_bits(kaggle_dcn(512)); }
END_TEST

/* The loss of 1000 samples is its blocks of 256 summed in block order. */
START_TEST(test_bce_fixed_blocks) {
  enum { B = 1000 };
  float z[B], y[B];
  sr_rng r;
  sr_rng_init(&r, 3, 0);
  for (int i = 0; i < B; i++) z[i] = 4.0f * ((float)sr_rng_uniform(&r) - 0.5f), y[i] = i & 1;
  double want = 0.0;
  for (int b0 = 0; b0 < B; b0 += 256) {
    double s = 0.0;
    for (int i = b0; i < B && i < b0 + 256; i++) {
      double zi = z[i], yi = y[i];
      s += (zi > 0.0 ? zi : 0.0) - zi * yi + log1p(exp(-fabs(zi)));
    }
    want += s;
  }
  want /= B;
  for (int th = 1; th <= 3; th++) {
    dense_pool *p = use_threads(th, th);
    double got = dense_test_be->bce_logits(B, z, y, NULL);
    done_threads(p);
    ck_assert_msg(got == want, "threads %d: %.17g vs %.17g", th, got, want);
  }
}
END_TEST

int main(int argc, char **argv) {
  dense_test_isa_args(argc, argv);
  Suite *s = suite_create("dense_pool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pool_runs_each_task_once);
  tcase_add_test(tc, test_pool_nested_run);
  tcase_add_test(tc, test_pool_workers_named);
  tcase_add_test(tc, test_pool_rest_keeps_workers);
  tcase_add_test(tc, test_gemm_same_bits_any_threads);
  tcase_add_test(tc, test_gemm_cut_keeps_one_block_bits);
  tcase_add_test(tc, test_linear_backward_masks_din_in_place);
  tcase_add_test(tc, test_model_step_same_bits_any_threads);
  tcase_add_test(tc, test_dcn_step_same_bits_any_threads);
  tcase_add_test(tc, test_bce_fixed_blocks);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
