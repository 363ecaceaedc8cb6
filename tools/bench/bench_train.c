/* shardrec bench train: training samples/s for the Kaggle configuration
 * (and with --arch mlperf-dcnv2 MLPerf's DLRM-DCNv2 beside it),
 * beside this machine's cblas_sgemm rate on the step's own shapes measured in
 * the same run, so the fraction of the FLOP bound is visible.
 *
 * The step timed is the whole step: reading the batch from a binary record
 * file (mmap), dedup, lookup, pooling, dense forward/backward, scatter, push
 * with the sparse optimizer, and the dense optimizer. The bound is the time
 * of the step's sgemm calls alone, each timed on random matrices of its own
 * shape. */
#include <cblas.h>
#include <getopt.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/sys.h"
#include "common/status.h"
#include "datasets/source.h"
#include "dense/cuda_device.h"
#include "dense/device.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "dense/pool.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "train/keep.h"
#include "train/trainer.h"
#include "dense/cuda_plugin.h"

extern char **environ;

/* Run this executable with args (a NULL-terminated list); 0 on exit 0. */
static int run_self(char *const *args) {
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Seconds per step of the step's sgemm calls at batch B (median of reps),
 * with OpenBLAS's OWN threading over every core (set just for the bound,
 * then back to one thread as the dense kernels run it), so that the share
 * of the bound cannot rise by slowing the bound. */
static double sgemm_step_time(const dense_config *cfg, int B, double *flops_out) {
  openblas_set_num_threads((int)sysconf(_SC_NPROCESSORS_ONLN));
  dense_gemm_shape sh[64];
  int ns = dense_model_gemm_shapes(cfg, B, sh, 64);
  double total = 0, flops = 0;
  sr_rng r;
  sr_rng_init(&r, 99, 0);
  for (int i = 0; i < ns; i++) {
    int M = sh[i].M, N = sh[i].N, K = sh[i].K;
    float *A = malloc((size_t)M * K * sizeof *A), *Bm = malloc((size_t)K * N * sizeof *Bm),
          *C = malloc((size_t)M * N * sizeof *C);
    for (size_t j = 0; j < (size_t)M * K; j++) A[j] = (float)sr_rng_uniform(&r) - 0.5f;
    for (size_t j = 0; j < (size_t)K * N; j++) Bm[j] = (float)sr_rng_uniform(&r) - 0.5f;
    memset(C, 0, (size_t)M * N * sizeof *C);
    int lda = sh[i].trans_a ? M : K, ldb = sh[i].trans_b ? K : N;
    double t[9];
    int reps = 9;
    for (int k = -2; k < reps; k++) {
      double t0 = sr_now();
      cblas_sgemm(CblasRowMajor, sh[i].trans_a ? CblasTrans : CblasNoTrans,
                  sh[i].trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f,
                  C, N);
      if (k >= 0) t[k] = sr_now() - t0;
    }
    total += sr_median(t, reps);
    flops += 2.0 * M * N * K;
    free(A);
    free(Bm);
    free(C);
  }
  *flops_out = flops;
  openblas_set_num_threads(1);
  return total;
}

/* The same bound on the GPU: each of the step's shapes through cublasSgemm
 * (the CUDA backend's gemm), timed with CUDA events. */
static double cublas_step_time(const dense_config *cfg, int B, double *flops_out) {
  char err[640];
  const dense_cuda_plugin *cu = dense_cuda_plugin_load(err, sizeof err);
  if (!cu) return -1;
  dense_gemm_shape sh[64];
  int ns = dense_model_gemm_shapes(cfg, B, sh, 64);
  double total = 0, flops = 0;
  for (int i = 0; i < ns; i++) {
    double s = cu->gemm_seconds(sh[i].trans_a, sh[i].trans_b, sh[i].M, sh[i].N, sh[i].K, 9);
    if (s < 0) return -1;
    total += s;
    flops += 2.0 * sh[i].M * sh[i].N * sh[i].K;
  }
  *flops_out = flops;
  return total;
}

/* The models bench train times: the Kaggle dot model, and (--arch
 * mlperf-dcnv2) MLPerf's DLRM-DCNv2 beside it. */
enum { ARCH_KAGGLE = 0, ARCH_MLPERF = 1 };
static const struct {
  const char *name, *bot, *top, *op;
  int dim, dcn_layers, dcn_rank;
} archs[2] = {
    {"kaggle-dot", "13-512-256-64-16", "512-256-1", "dot", 16, 0, 0},
    {"mlperf-dcnv2", "13-512-256-128", "1024-1024-512-256-1", "dcn", 128, 3, 512},
};

static const char *arch_name(int arch) { return archs[arch].name; }

/* arch's dense configuration at batch B. 0 or -1 (printed). */
static int arch_config(int arch, int B, dense_config *cfg) {
  return cli_model_arch_dcn("bench train", archs[arch].bot, archs[arch].top, archs[arch].op, 0,
                            archs[arch].dcn_layers, archs[arch].dcn_rank, archs[arch].dim,
                            DS_NUM_SPARSE, B, cfg);
}

/* "--arch NAME" into *arch. 0 or -1 (printed). */
static int arch_parse(const char *name, int *arch) {
  if (!strcmp(name, "kaggle") || !strcmp(name, "mlperf-dcnv2")) {
    *arch = !strcmp(name, "mlperf-dcnv2") ? ARCH_MLPERF : ARCH_KAGGLE;
    return 0;
  }
  fprintf(stderr, "bench train: --arch: '%s' is not kaggle or mlperf-dcnv2\n", name);
  return -1;
}

/* The flags. */
typedef struct bt_flags {
  long long rows, steps, runs;
  int arch; /* ARCH_KAGGLE, or ARCH_MLPERF: that model and the Kaggle one */
  const char *device;
  const dense_backend *be;
  int gpu;
  int bl[8], nb;       /* the batch sizes */
  emb_keep_cfg keep;   /* --keep F,T,C: every batch also timed with these bounds */
  int have_keep;
  int th[8], nth;      /* the dense thread counts (--dense-threads) */
} bt_flags;

/* Parse argv into *f and choose the dense backend. Returns -1 to go on, or
 * the exit status (0 for --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, bt_flags *f) {
  static const struct option opts[] = {{"rows", required_argument, 0, 'r'},
                                       {"steps", required_argument, 0, 's'},
                                       {"runs", required_argument, 0, 'n'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"device", required_argument, 0, 'd'},
                                       {"dense-threads", required_argument, 0, 't'},
                                       {"dense-isa", required_argument, 0, 'i'},
                                       {"arch", required_argument, 0, 'a'},
                                       {"keep", required_argument, 0, 'k'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *batches = NULL, *threads = NULL, *isa = NULL;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'r': if (cli_int("bench train", "--rows", optarg, 10000, 1LL << 32, &f->rows)) return 2; break;
      case 's': if (cli_int("bench train", "--steps", optarg, 1, 1 << 20, &f->steps)) return 2; break;
      case 'n': if (cli_int("bench train", "--runs", optarg, 1, 99, &f->runs)) return 2; break;
      case 'b': batches = optarg; break;
      case 'd': f->device = optarg; break;
      case 't': threads = optarg; break;
      case 'i': isa = optarg; break;
      case 'a': if (arch_parse(optarg, &f->arch)) return 2; break;
      case 'k': {
        int v[3], n = 0;
        if (cli_int_list("bench train", "--keep", optarg, ',', v, 3, &n) || n != 3 || v[0] < 0 ||
            v[1] < 0 || v[2] < 0) {
          fprintf(stderr, "bench train: --keep: F,T,C (admit after F samples, expire after T "
                  "steps, capacity C rows a table)\n");
          return 2;
        }
        f->keep = (emb_keep_cfg){.admit_after = (uint64_t)v[0], .expire_after = (uint64_t)v[1],
                                 .capacity = (uint64_t)v[2]};
        f->have_keep = 1;
        break;
      }
      case 'h':
        printf("usage: shardrec bench train [--rows N (300000)] [--batch 128,2048] [--steps N] [--runs 3]\n"
               "Kaggle configuration (dim 16, 13-512-256-64-16 / 512-256-1, dot), SGD, in-process shards,\n"
               "data from a generated set converted to binary records. --steps: timed steps per run\n"
               "(default: about 3 s of work per run).\n"
               "--device cuda[:N]: the dense step on the GPU (default batches 2048,16384); the bound is\n"
               "cublasSgemm on the step's shapes, and the step splits into lookup, H2D, compute, D2H, push.\n"
               "--dense-threads 1,2: the dense pool's thread counts, each timed at every batch (with\n"
               "--device cuda: every core, once); the bound is OpenBLAS's own threading over every core.\n"
               "--dense-isa baseline|avx2: our kernels (default: the best this CPU runs).\n"
               "--arch mlperf-dcnv2: MLPerf's DLRM-DCNv2 (dim 128, 13-512-256-128, 3 cross layers of\n"
               "rank 512, 1024-1024-512-256-1; default batch 2048; one-hot data), each batch and thread\n"
               "count beside the Kaggle model, and both models' shares of their own bounds.\n"
               "--store shard [--cache-fraction F] [--prefetch-depth D,...]: in memory vs the\n"
               "RocksDB shard store (bench train --store shard --help).\n"
               "--keep F,T,C: each batch timed without bounds, then with every table bounded\n"
               "(admission after F samples, expiry after T steps, capacity C rows, lru), and the\n"
               "ratio of their step times.\n");
        return 0;
      default: cli_bad_option("bench train", c, argv[optind - 1]); return 2;
    }
  }
  char derr[512];
  if (dense_backend_for_device(f->device, &f->be, &f->gpu, derr, sizeof derr)) {
    fprintf(stderr, "bench train: %s\n", derr);
    return 2;
  }
  if (isa && f->gpu) {
    fprintf(stderr, "bench train: --dense-isa picks CPU kernels; it does not apply to --device %s\n",
            f->device);
    return 2;
  }
  if (isa && cli_dense_isa("bench train", isa, &f->be)) return 2;
  dense_backend_set_default(f->be);
  if (f->arch == ARCH_MLPERF && f->gpu) {
    fprintf(stderr, "bench train: --arch mlperf-dcnv2 runs on the CPU only (no CUDA cross network)\n");
    return 2;
  }
  if (!batches) batches = f->gpu ? "2048,16384" : f->arch == ARCH_MLPERF ? "2048" : "128,2048";
  if (cli_int_list("bench train", "--batch", batches, ',', f->bl, 8, &f->nb)) return 2;
  /* The GPU runs the step: one pool (every core) for the host's parts. */
  char all[16];
  snprintf(all, sizeof all, "%d", dense_pool_threads_for(1));
  if (!threads) threads = f->gpu ? all : "1,2";
  if (cli_int_list("bench train", "--dense-threads", threads, ',', f->th, 8, &f->nth)) return 2;
  for (int i = 0; i < f->nth; i++)
    if (f->th[i] > DENSE_POOL_MAX_THREADS) {
      fprintf(stderr, "bench train: --dense-threads: %d is over %d\n", f->th[i],
              DENSE_POOL_MAX_THREADS);
      return 2;
    }
  return -1;
}

/* Generate rows lines into dir/d.tsv and convert them to bin. 0 or -1
 * (printed). */
static int prepare_data(const char *dir, long long rows, char *bin, size_t binlen) {
  char tsv[SR_PATH_MAX], rows_s[32], err[256];
  if (sr_path_err(tsv, sizeof tsv, err, sizeof err, "%s/d.tsv", dir) ||
      sr_path_err(bin, binlen, err, sizeof err, "%s/d.bin", dir)) {
    fprintf(stderr, "bench train: %s\n", err);
    return -1;
  }
  snprintf(rows_s, sizeof rows_s, "%lld", rows);
  printf("bench train: generating %lld rows in %s\n", rows, dir);
  fflush(stdout);
  char *gen[] = {"shardrec", "datagen", "--rows", rows_s, "--seed", "1", "--out", tsv, NULL};
  char *conv[] = {"shardrec", "convert", "--test-fraction", "0", tsv, bin, NULL};
  if (run_self(gen) || run_self(conv)) {
    fprintf(stderr, "bench train: data preparation failed\n");
    return -1;
  }
  return 0;
}

/* One batch size's trainer over the data: everything owned. */
typedef struct one {
  int B, arch; /* arch: ARCH_* */
  const emb_keep_cfg *bounds; /* NULL: none; else every table's, decided each step */
  keep *k;
  double share; /* the last measure's share of the bound */
  dense_config cfg;
  ds_source *src;
  emb_plan *plan;
  emb_store *store;
  trainer *t;
  ds_batch b;
  int64_t step;
} one;

static void one_close(one *o) {
  ds_batch_free(&o->b);
  trainer_destroy(o->t);
  keep_destroy(o->k);
  emb_store_destroy(o->store);
  emb_plan_free(o->plan);
  ds_source_destroy(o->src);
}

/* The Kaggle configuration at batch B over bin: SGD, in-process shards.
 * 0 or -1 (printed; what was opened is released by one_close). */
static int one_open(one *o, int B, const char *bin) {
  char err[1024];
  o->B = B;
  if (arch_config(o->arch, B, &o->cfg)) return -1;
  ds_source_opts so = {.path = bin, .split = DS_SPLIT_TRAIN};
  o->src = ds_source_open(&so, err, sizeof err);
  if (!o->src) {
    fprintf(stderr, "bench train: %s\n", err);
    return -1;
  }
  uint64_t sizes[DS_NUM_SPARSE];
  ds_source_table_sizes(o->src, sizes);
  emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = sizes, .dim = o->cfg.emb_dim,
                        .pooling = EMB_POOL_SUM, .optim = {.kind = EMB_OPT_SGD, .eps = -1},
                        .seed = 1, .n_shards = 1};
  if (o->bounds) pp.keep = *o->bounds;
  if (emb_plan_create(&pp, &o->plan, err, sizeof err) ||
      !(o->store = emb_store_create_local(o->plan, err, sizeof err))) {
    fprintf(stderr, "bench train: %s\n", err);
    return -1;
  }
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_SGD);
  o->t = trainer_create(o->plan, o->store, &o->cfg, &oc, 1, err, sizeof err);
  if (!o->t || ds_batch_init(&o->b, B)) {
    fprintf(stderr, "bench train: %s\n", o->t ? "out of memory" : err);
    return -1;
  }
  if (o->bounds && !(o->k = keep_create(o->plan, err, sizeof err))) {
    fprintf(stderr, "bench train: %s\n", err);
    return -1;
  }
  trainer_set_keep(o->t, o->k);
  return 0;
}

/* One training step on the next batch (the data rewound at its end); the
 * samples in *got. 0 or -1 (printed). */
static int one_step(one *o, int *got) {
  *got = ds_source_next(o->src, &o->b, o->B);
  if (*got == 0) ds_source_rewind(o->src), *got = ds_source_next(o->src, &o->b, o->B);
  float loss;
  emb_idset gone;
  if (*got > 0 && o->k && keep_observe(o->k, &o->b, o->step)) {
    fprintf(stderr, "bench train: bounded tables: out of memory\n");
    return -1;
  }
  if (*got < 0 || trainer_step(o->t, &o->b, o->step, 0.01f, 0.01f, &loss)) {
    fprintf(stderr, "bench train: %s\n", *got < 0 ? ds_source_errmsg(o->src) : trainer_errmsg(o->t));
    return -1;
  }
  if (o->k && (keep_decide(o->k, o->step, &gone) || emb_store_remove(o->store, o->step, &gone))) {
    fprintf(stderr, "bench train: bounded tables: %s\n", emb_store_errmsg(o->store));
    return -1;
  }
  o->step++;
  return 0;
}

/* Warm up (touch rows, fault pages, settle threads) and return the steps a
 * run times: steps, or about 3 s of work (at least 5). -1 on failure. */
static int warm_up(one *o, long long steps) {
  double t0 = sr_now();
  int nsteps = (int)steps, got;
  for (int w = 0; w < 10 || (!steps && sr_now() - t0 < 1.0); w++) {
    if (one_step(o, &got)) return -1;
    if (!steps) nsteps = w + 1;
  }
  if (!steps) {
    double per = (sr_now() - t0) / nsteps;
    nsteps = (int)(3.0 / per);
    if (nsteps < 5) nsteps = 5;
  }
  return nsteps;
}

/* The timed runs at one batch size and its line of figures. Each run's
 * rate is set beside the bound timed right after it, so a change of load
 * between them moves both; the ratio reported is the median of the per-run
 * ratios. 0 or -1 (printed). */
static int measure(one *o, const bt_flags *f, int nsteps, int th, double *rate_out) {
  int B = o->B, gpu = f->gpu, runs = (int)f->runs;
  double rate[99], ratio[99], bounds[99], gflops = 0;
  trainer_times_reset(o->t);
  char cerr[640];
  /* --device cuda: the module is loaded already (dense_backend_for_device) */
  const dense_cuda_plugin *cu = gpu ? dense_cuda_plugin_load(cerr, sizeof cerr) : NULL;
  if (cu) cu->times_reset();
  for (int r = 0; r < runs; r++) {
    double s0 = sr_now();
    long long samples = 0;
    for (int k = 0; k < nsteps; k++) {
      int got;
      if (one_step(o, &got)) return -1;
      samples += got;
    }
    rate[r] = (double)samples / (sr_now() - s0);
    double tg = gpu ? cublas_step_time(&o->cfg, B, &gflops) : sgemm_step_time(&o->cfg, B, &gflops);
    if (tg <= 0) {
      fprintf(stderr, "bench train: timing the gemm bound failed\n");
      return -1;
    }
    bounds[r] = B / tg;
    ratio[r] = rate[r] / bounds[r];
  }
  const trainer_times *tt = trainer_times_get(o->t);
  double ms = 1e3 / (double)tt->steps;
  double med = sr_median(rate, runs);
  double bound = sr_median(bounds, runs);
  double frac = sr_median(ratio, runs);
  double tg = B / bound;
  double fps = dense_model_flops_per_sample(&o->cfg);
  *rate_out = med;
  o->share = frac;
  printf("%6d %7d %12.0f %9.2f %10.3f %13.1f %13.0f %8.1f%%  dedup %.2f lookup %.2f pool %.2f "
         "fwd %.2f bwd %.2f scatter %.2f push %.2f opt %.2f\n",
         B, th, med, 1e3 * B / med, fps / 1e6, gflops / tg / 1e9, bound, 100.0 * frac,
         tt->dedup * ms, tt->lookup * ms, tt->pool * ms, tt->forward * ms, tt->backward * ms,
         tt->scatter * ms, tt->push * ms, tt->dense_opt * ms);
  if (cu) {
    dense_cuda_times ct;
    cu->times_get(&ct);
    /* device-stream times of the forward+backward, per step */
    printf("%6s   GPU split (ms/step): lookup %.2f H2D %.2f compute %.2f D2H %.2f push %.2f"
           " | host: dedup %.2f pool %.2f scatter %.2f opt %.2f\n",
           "", tt->lookup * ms, ct.h2d * ms, ct.compute * ms, ct.d2h * ms, tt->push * ms,
           tt->dedup * ms, tt->pool * ms, tt->scatter * ms, tt->dense_opt * ms);
  }
  fflush(stdout);
  return 0;
}

/* One batch size: open, then for each dense thread count a pool of that
 * many, warm up, measure; close. A line with each count's rate against the
 * first's. 0 or -1 (printed). */
static int bench_batch(const bt_flags *f, int arch, int B, const char *bin, double *share,
                       const emb_keep_cfg *bounds, double *rates) {
  one o = {.arch = arch, .bounds = bounds};
  char err[256];
  double rate[8];
  int rc = one_open(&o, B, bin), nsteps = 0;
  for (int i = 0; !rc && i < f->nth; i++) {
    dense_pool *p = dense_pool_create(f->th[i], err, sizeof err);
    if (!p) {
      fprintf(stderr, "bench train: %s\n", err);
      rc = -1;
      break;
    }
    dense_pool_set_default(p);
    if ((nsteps = warm_up(&o, f->steps)) < 0) rc = -1;
    if (!rc) rc = measure(&o, f, nsteps, f->th[i], &rate[i]);
    if (!rc && share) share[i] = o.share;
    if (!rc && rates) rates[i] = rate[i];
    dense_pool_set_default(NULL);
    dense_pool_destroy(p);
  }
  if (!rc && f->nth > 1) {
    printf("%6d threads:", B);
    for (int i = 1; i < f->nth; i++)
      printf(" %d: %.2fx of %d", f->th[i], rate[i] / rate[0], f->th[0]);
    printf("\n");
  }
  one_close(&o);
  return rc;
}

/* --arch mlperf-dcnv2 at batch B: the Kaggle model's lines, then
 * MLPerf's, then per thread count each one's share of its own bound. 0 or
 * -1 (printed). */
static int bench_pair(const bt_flags *f, int B, const char *bin) {
  double share[2][8];
  for (int a = 0; a < 2; a++) {
    dense_config c;
    if (arch_config(a, B, &c)) return -1;
    printf("%6d model %s: dim %d, bottom %s, %s", B, arch_name(a), c.emb_dim, archs[a].bot,
           archs[a].op);
    if (c.dcn_layers) printf(" (%d cross layers of rank %d)", c.dcn_layers, c.dcn_rank);
    printf(", top %s; %.1f MFLOP a sample\n", archs[a].top, dense_model_flops_per_sample(&c) / 1e6);
    fflush(stdout);
    if (bench_batch(f, a, B, bin, share[a], NULL, NULL)) return -1;
  }
  for (int i = 0; i < f->nth; i++)
    printf("%6d %7d share of its own sgemm bound: %s %.1f%%, %s %.1f%% (%.2fx the dot model's)\n", B,
           f->th[i], arch_name(ARCH_MLPERF), 100.0 * share[ARCH_MLPERF][i], arch_name(ARCH_KAGGLE),
           100.0 * share[ARCH_KAGGLE][i], share[ARCH_MLPERF][i] / share[ARCH_KAGGLE][i]);
  fflush(stdout);
  return 0;
}

/* Batch B as bench_batch, and with --keep again with every table bounded,
 * then each thread count's step time with the bounds against without. 0 or
 * -1 (printed). */
static int bench_keep(const bt_flags *f, int B, const char *bin, double *share, double *rate) {
  double on[8];
  double *off = rate;
  if (bench_batch(f, ARCH_KAGGLE, B, bin, share, NULL, off)) return -1;
  if (!f->have_keep) return 0;
  printf("%6d with bounds (admit after %llu, expire after %llu steps, capacity %llu rows, lru):\n",
         B, (unsigned long long)f->keep.admit_after, (unsigned long long)f->keep.expire_after,
         (unsigned long long)f->keep.capacity);
  if (bench_batch(f, ARCH_KAGGLE, B, bin, NULL, &f->keep, on)) return -1;
  for (int i = 0; i < f->nth; i++)
    printf("%6d %7d step time with bounds: %.2fx without\n", B, f->th[i], off[i] / on[i]);
  fflush(stdout);
  return 0;
}

/* The figures the table holds, one line: for each thread count, its share
 * of the bound at each batch; for each batch, each thread count's rate
 * against the first's. */
static void print_summary(const bt_flags *f, double share[8][8], double rate[8][8]) {
  printf("summary: of the sgemm bound:");
  for (int i = 0; i < f->nth; i++) {
    printf("%s %d thread%s", i ? ";" : "", f->th[i], f->th[i] == 1 ? "" : "s");
    for (int bi = 0; bi < f->nb; bi++)
      printf("%s %.1f%% at batch %d", bi ? "," : "", 100.0 * share[bi][i], f->bl[bi]);
  }
  for (int i = 1; i < f->nth; i++) {
    printf("; %d threads against %d:", f->th[i], f->th[0]);
    for (int bi = 0; bi < f->nb; bi++)
      printf("%s %.2fx at batch %d", bi ? "," : "", rate[bi][i] / rate[bi][0], f->bl[bi]);
  }
  printf("\n");
}

/* --store, --cache-fraction or --prefetch-depth: the in-memory vs shard
 * store comparison (bench_train_store.c). */
static int wants_store(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], "--store", 7) || !strncmp(argv[i], "--cache-fraction", 16) ||
        !strncmp(argv[i], "--prefetch-depth", 16))
      return 1;
  return 0;
}

int bench_train(int argc, char **argv) {
  if (wants_store(argc, argv)) return bench_train_store(argc, argv);
  bt_flags f = {.rows = 300000, .runs = 3, .device = "cpu"};
  int status = parse_flags(argc, argv, &f);
  if (status >= 0) return status;
  char dir[] = "/tmp/shardrec-bench-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("bench train: mkdtemp");
    return 1;
  }
  char bin[256];
  status = 1;
  if (prepare_data(dir, f.rows, bin, sizeof bin)) goto out;
  printf("\nOpenBLAS %s, core %s (OPENBLAS_CORETYPE=%s); dense kernels %s; the step's sgemm "
         "calls single-threaded on the dense pool, the bound on OpenBLAS's own %ld threads\n",
         dense_blas_version(), dense_blas_core(),
         getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset",
         dense_backend_kernels(f.be), sysconf(_SC_NPROCESSORS_ONLN));
  char blas_warning[256];
  if (dense_blas_core_warning(blas_warning, sizeof blas_warning))
    printf("bench train: warning: %s\n", blas_warning);
  if (f.gpu) printf("device %s (%s): dense step on the GPU; bound = cublasSgemm\n", f.device, f.be->name);
  printf("%6s %7s %12s %9s %10s %13s %13s %9s  %s\n", "batch", "threads", "samples/s", "step ms", "MFLOP/smp",
         f.gpu ? "cublas GF/s" : "sgemm GF/s", "bound smp/s", "of bound", "where the step's time goes (ms)");
  double share[8][8], rate[8][8];
  for (int bi = 0; bi < f.nb; bi++)
    if (f.arch == ARCH_MLPERF ? bench_pair(&f, f.bl[bi], bin)
                              : bench_keep(&f, f.bl[bi], bin, share[bi], rate[bi]))
      goto out;
  if (f.arch == ARCH_KAGGLE) print_summary(&f, share, rate);
  status = 0;
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  dense_backend_set_default(NULL);
  printf("samples/s: median of %lld runs; bound: the step's sgemm calls alone on the same shapes, "
         "timed after each run (hot caches: optimistic); of bound: median of per-run ratios; "
         "load average %.2f\n",
         f.runs, load[0]);
out:;
  if (sr_rmtree(dir) != 0) fprintf(stderr, "bench train: could not remove %s\n", dir);
  return status;
}
