/* shardrec bench train --store shard: the same training steps with every
 * row in memory and through the RocksDB shard store, in one run, and the
 * ratio of their samples/s.
 *
 * The data is generated and converted here (datagen --rows N
 * --scale 1 --seed 3 --test-fraction 0.01; convert --test-fraction 0.01
 * --max-ind-range R), or given (--data FILE.bin). The steps are train's:
 * batch --batch of the train split read from the binary file, dedup,
 * lookup, pool, dense forward/backward, scatter, push with Adagrad, dense
 * Adagrad, learning rate 0.01. The shard store lives in a temporary RocksDB
 * folder this run makes and removes, with a cache of --cache-fraction F of
 * the rows the steps touch (counted before the runs). Each --prefetch-depth
 * D (a list: 0,1,2) runs through a fresh shard store reading D batches
 * ahead as train does (train/job_batches.c: a ring of D + 1 batches, each
 * handed to the trainer with trainer_ahead as it enters). Per run: samples/s,
 * the ratio to the in-memory run, the step's time split into lookup wait,
 * prefetch (handing the ids ahead) and push (where dirty evicted rows are
 * written back today), RocksDB reads, evictions and write-backs per step
 * (emb_shard_counters), and whether the per-step losses are the in-memory
 * run's bit for bit; under it the process's CPU a step, and for a shard
 * store what it adds against the in-memory run and where that goes:
 * RocksDB reading misses and writing rows back (thread CPU inside its
 * calls), RocksDB's own flush and compaction threads, and the store's own
 * work: in its I/O jobs (on whichever thread ran them) and on the trainer's
 * thread; then what the dense pool's workers (the trainer's kernels:
 * dense layers, pooling, scatter, dedup; never the store's) took more than
 * in memory, and the rest: mostly the trainer's thread, whose own work runs
 * slower beside the store's and which waits on the pool's tasks while the
 * cores are busy (also the store's I/O threads outside their timed jobs).
 *
 * --arch-embedding-precision P[,P...] repeats all of it (the in-memory
 * reference and a shard store per depth) for each weight precision, and
 * --cache-mb N sizes every shard store's cache in MiB instead (the same
 * bytes whatever the precision, so a 16-bit run caches twice the rows); a
 * last table gives each precision's shard store samples/s against the
 * first one's (fp32 where it leads the list) at each depth.
 *
 * --rounds N runs the in-memory run and the shard store runs in turn N
 * times: each depth's ratio is taken against its own round's in-memory
 * run, and the rounds' ratios and their median are printed (the last
 * table then compares the median samples/s of the rounds). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "datasets/source.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "dense/pool.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "train/job.h"
#include "train/trainer.h"

#define CMD "bench train"
#define MAX_DEPTHS 9
#define MAX_PRECS 3
#define MAX_ROUNDS 9

typedef struct bts_flags {
  double fraction;          /* --cache-fraction */
  long long cache_mb;       /* --cache-mb (0: the fraction sizes the cache) */
  int depth[MAX_DEPTHS], nd; /* --prefetch-depth list */
  emb_precision prec[MAX_PRECS];
  int np;                   /* --arch-embedding-precision list */
  emb_optim_kind sopt;      /* --sparse-optimizer (adagrad) */
  long long rows, steps, batch, dim, threads, rounds;
  uint64_t max_ind_range;
  const char *bot, *top, *data;
} bts_flags;

static void bts_usage(void) {
  printf("usage: shardrec bench train --store shard [--cache-fraction F (0.1) | --cache-mb N]\n"
         "       [--prefetch-depth D[,D...] (0,%d)] [--rows N (1200000)] [--max-ind-range R (4000000)]\n"
         "       [--arch-embedding-precision P[,P...] (fp32; each of fp32, fp16, bf16)]\n"
         "       [--sparse-optimizer sgd|adagrad|rowwise_adagrad (adagrad)]\n"
         "       [--data FILE.bin] [--batch B (2048)] [--steps N (250)]\n"
         "       [--arch-sparse-feature-size N (16)] [--arch-mlp-bot 13-512-256-64-16]\n"
         "       [--arch-mlp-top 512-256-1] [--dense-threads N (every core)] [--rounds N (1)]\n"
         "The same steps in memory and through the RocksDB shard store (a temporary folder, cache =\n"
         "F x the rows the steps touch), one shard store run per depth; samples/s, the ratio, the\n"
         "step split (lookup wait, prefetch, push), RocksDB reads, evictions and write-backs per\n"
         "step, and whether the losses are the in-memory run's bit for bit; under each run the\n"
         "process's CPU a step (a shard store's: what it adds, split into RocksDB's reads,\n"
         "write-backs, flushes and compactions, and the store's own work, then the dense pool's\n"
         "workers against memory and the rest, mostly the trainer's thread); each precision repeats\n"
         "the runs, and --cache-mb gives every one the same cache bytes. --rounds N repeats the\n"
         "in-memory run and the shard store runs in turn N times (at most %d) and gives each\n"
         "depth's median ratio to its round's in-memory run. Two shapes:\n"
         "dim 16 as is; dim 128 with --arch-sparse-feature-size 128 --arch-mlp-bot 13-512-256-128\n"
         "--arch-mlp-top 1024-1024-512-256-1.\n",
         TRAIN_PREFETCH_DEPTH_DEFAULT, MAX_ROUNDS);
}

/* flag's comma list s, split in buf: its items into item[] (at most max).
 * Their count, or -1 (printed) when there are none or more than max. */
static int bts_list(const char *flag, const char *s, char *buf, size_t buflen, char **item,
                    int max) {
  snprintf(buf, buflen, "%s", s);
  int n = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) {
      fprintf(stderr, "shardrec %s: %s: at most %d items\n", CMD, flag, max);
      return -1;
    }
    item[n++] = tok;
  }
  if (n == 0) fprintf(stderr, "shardrec %s: %s: '%s' names nothing\n", CMD, flag, s);
  return n ? n : -1;
}

/* --prefetch-depth D,D,...: each in the flag's range (tools/cli.c). */
static int bts_depths(const char *s, bts_flags *f) {
  char buf[256], *item[MAX_DEPTHS];
  const int n = bts_list("--prefetch-depth", s, buf, sizeof buf, item, MAX_DEPTHS);
  for (int i = 0; i < n; i++) {
    long long v;
    if (cli_flag(CMD, "--prefetch-depth", item[i], &v)) return -1;
    f->depth[i] = (int)v;
  }
  f->nd = n;
  return n > 0 ? 0 : -1;
}

/* --arch-embedding-precision P,P,...: distinct precisions. */
static int bts_precs(const char *s, bts_flags *f) {
  char buf[64], *item[MAX_PRECS];
  const int n = bts_list("--arch-embedding-precision", s, buf, sizeof buf, item, MAX_PRECS);
  for (int i = 0; i < n; i++) {
    if (emb_precision_parse(item[i], &f->prec[i])) {
      fprintf(stderr, "shardrec %s: --arch-embedding-precision: '%s' is not fp32, fp16 or bf16\n",
              CMD, item[i]);
      return -1;
    }
    for (int k = 0; k < i; k++)
      if (f->prec[k] == f->prec[i]) {
        fprintf(stderr, "shardrec %s: --arch-embedding-precision: '%s' named twice\n", CMD,
                item[i]);
        return -1;
      }
  }
  f->np = n;
  return n > 0 ? 0 : -1;
}

/* -1 to go on, else the exit status (0 --help, 2 bad usage, printed). */
static int bts_parse(int argc, char **argv, bts_flags *f) {
  enum { O_STORE = 1, O_FRAC, O_DEPTH, O_ROWS, O_STEPS, O_BATCH, O_DIM, O_BOT, O_TOP, O_DATA,
         O_MAXIND, O_THREADS, O_PREC, O_CMB, O_SOPT, O_ROUNDS, O_HELP };
  static const struct option opts[] = {
      {"store", required_argument, 0, O_STORE}, {"cache-fraction", required_argument, 0, O_FRAC},
      {"prefetch-depth", required_argument, 0, O_DEPTH}, {"rows", required_argument, 0, O_ROWS},
      {"steps", required_argument, 0, O_STEPS}, {"batch", required_argument, 0, O_BATCH},
      {"arch-sparse-feature-size", required_argument, 0, O_DIM},
      {"arch-mlp-bot", required_argument, 0, O_BOT}, {"arch-mlp-top", required_argument, 0, O_TOP},
      {"data", required_argument, 0, O_DATA}, {"max-ind-range", required_argument, 0, O_MAXIND},
      {"dense-threads", required_argument, 0, O_THREADS},
      {"arch-embedding-precision", required_argument, 0, O_PREC},
      {"cache-mb", required_argument, 0, O_CMB},
      {"sparse-optimizer", required_argument, 0, O_SOPT}, {"rounds", required_argument, 0, O_ROUNDS},
      {"help", no_argument, 0, O_HELP},
      {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c, rc = 0;
  while (!rc && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case O_STORE:
        if (strcmp(optarg, "shard")) {
          fprintf(stderr, "shardrec %s: --store: '%s' is not shard\n", CMD, optarg);
          rc = -1;
        }
        break;
      case O_FRAC: rc = cli_double(CMD, "--cache-fraction", optarg, 1e-6, 1, &f->fraction); break;
      case O_DEPTH: rc = bts_depths(optarg, f); break;
      case O_ROWS: rc = cli_int(CMD, "--rows", optarg, 10000, 1LL << 32, &f->rows); break;
      case O_STEPS: rc = cli_int(CMD, "--steps", optarg, 1, 1 << 20, &f->steps); break;
      case O_BATCH: rc = cli_int(CMD, "--batch", optarg, 1, 1 << 20, &f->batch); break;
      case O_DIM: rc = cli_flag(CMD, "--arch-sparse-feature-size", optarg, &f->dim); break;
      case O_BOT: f->bot = optarg; break;
      case O_TOP: f->top = optarg; break;
      case O_DATA: f->data = optarg; break;
      case O_MAXIND: rc = cli_flag_u64(CMD, "--max-ind-range", optarg, &f->max_ind_range); break;
      case O_THREADS: rc = cli_flag(CMD, "--dense-threads", optarg, &f->threads); break;
      case O_PREC: rc = bts_precs(optarg, f); break;
      case O_CMB: rc = cli_int(CMD, "--cache-mb", optarg, 1, 1 << 20, &f->cache_mb); break;
      case O_ROUNDS: rc = cli_int(CMD, "--rounds", optarg, 1, MAX_ROUNDS, &f->rounds); break;
      case O_SOPT:
        if (emb_optim_parse(optarg, &f->sopt)) {
          fprintf(stderr, "shardrec %s: --sparse-optimizer: '%s' is not sgd, adagrad or "
                  "rowwise_adagrad\n", CMD, optarg);
          rc = -1;
        }
        break;
      case 'h':
      case O_HELP: bts_usage(); return 0;
      default: cli_bad_option(CMD, c, argv[optind - 1]); return 2;
    }
  }
  if (rc) return 2;
  if (optind < argc) {
    fprintf(stderr, "shardrec %s: unexpected argument '%s'\n", CMD, argv[optind]);
    return 2;
  }
  return -1;
}

/* The data: generated and converted into dir/d.bin (bin). 0 or -1. */
static int bts_prepare(const char *dir, const bts_flags *f, char *bin, size_t binlen) {
  char tsv[SR_PATH_MAX], err[256], cmd[8 * SR_PATH_MAX], self[SR_PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    fprintf(stderr, "shardrec %s: cannot find this executable\n", CMD);
    return -1;
  }
  self[n] = 0;
  if (sr_path_err(tsv, sizeof tsv, err, sizeof err, "%s/d.tsv", dir) ||
      sr_path_err(bin, binlen, err, sizeof err, "%s/d.bin", dir)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, err);
    return -1;
  }
  printf("bench train: generating %lld rows in %s\n", f->rows, dir);
  fflush(stdout);
  snprintf(cmd, sizeof cmd,
           "('%s' datagen --rows %lld --scale 1 --seed 3 --test-fraction 0.01 --out '%s' && "
           "'%s' convert --test-fraction 0.01 --max-ind-range %llu '%s' '%s') >'%s.log' 2>&1 || "
           "(cat '%s.log' >&2; exit 1)",
           self, f->rows, tsv, self, (unsigned long long)f->max_ind_range, tsv, bin, tsv, tsv);
  if (system(cmd) != 0) {
    fprintf(stderr, "shardrec %s: data preparation failed\n", CMD);
    return -1;
  }
  unlink(tsv);
  return 0;
}

/* The next batch of src into b, the data rewound at the split's end. The
 * samples, or -1 (printed). */
static int bts_next(ds_source *src, ds_batch *b, int batch) {
  int got = ds_source_next(src, b, batch);
  if (got == 0 && !ds_source_rewind(src)) got = ds_source_next(src, b, batch);
  if (got <= 0) fprintf(stderr, "shardrec %s: %s\n", CMD, got < 0 ? ds_source_errmsg(src) : "no data");
  return got > 0 ? got : -1;
}

/* Distinct rows the steps' batches touch (every table). -1 on failure. */
static long long bts_touched(const char *bin, const bts_flags *f,
                             const uint64_t sizes[DS_NUM_SPARSE]) {
  ds_source_opts so = {.path = bin, .split = DS_SPLIT_TRAIN};
  char err[1024];
  ds_source *src = ds_source_open(&so, err, sizeof err);
  uint64_t base[DS_NUM_SPARSE + 1] = {0};
  for (int t = 0; t < DS_NUM_SPARSE; t++) base[t + 1] = base[t] + sizes[t];
  unsigned char *seen = calloc(base[DS_NUM_SPARSE] / 8 + 1, 1);
  ds_batch b;
  long long n = -1;
  if (!src || !seen || ds_batch_init(&b, (int)f->batch)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, src ? "out of memory" : err);
    goto out;
  }
  n = 0;
  for (long long s = 0; s < f->steps && n >= 0; s++) {
    if (bts_next(src, &b, (int)f->batch) < 0) n = -1;
    for (int t = 0; n >= 0 && t < DS_NUM_SPARSE; t++) {
      const uint32_t *off = ds_batch_offsets(&b, t);
      for (uint32_t k = off[0]; k < off[b.n]; k++) {
        uint64_t r = base[t] + b.ids[k];
        if (!(seen[r / 8] & (1u << (r % 8)))) seen[r / 8] |= (unsigned char)(1u << (r % 8)), n++;
      }
    }
  }
  ds_batch_free(&b);
out:
  free(seen);
  ds_source_destroy(src);
  return n;
}

/* One run's figures. */
typedef struct bts_result {
  double secs;
  long long samples;
  trainer_times tt;
  emb_shard_counters c; /* over the run (shard store) */
  uint64_t cpu_ns;      /* the process's CPU over the steps, every thread */
  uint64_t bg_ns;       /* of it, RocksDB's flush and compaction threads' */
  uint64_t pool_ns;     /* of it, the dense pool's workers' ("sr:dense"; never the store's work) */
  float *loss;          /* [steps] */
} bts_result;

/* The CPU of the threads named prefix since they had then (those alive
 * now: one that exited took its CPU with it, so never below 0). */
static uint64_t named_cpu_since(const char *prefix, uint64_t then) {
  const uint64_t now = sr_named_threads_cpu_ns(prefix);
  return now > then ? now - then : 0;
}

/* The steps through store, reading depth batches ahead (a ring of depth + 1
 * batches; each batch entering the window handed to trainer_ahead, as
 * job_batches.c's job__fill_ahead does). 0 or -1 (printed). */
static int bts_steps(const bts_flags *f, const char *bin, const emb_plan *plan,
                     const dense_config *cfg, emb_store *store, int depth, bts_result *r) {
  char err[1024];
  ds_source_opts so = {.path = bin, .split = DS_SPLIT_TRAIN};
  ds_source *src = ds_source_open(&so, err, sizeof err);
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_ADAGRAD);
  trainer *t = src ? trainer_create(plan, store, cfg, &oc, plan->seed, err, sizeof err) : NULL;
  ds_batch ring[MAX_DEPTHS + 1];
  int slots = depth + 1, head = 0, ahead = 0, rc = t ? 0 : -1, B = (int)f->batch;
  memset(ring, 0, sizeof ring);
  for (int i = 0; !rc && i < slots; i++) rc = ds_batch_init(&ring[i], B) ? -1 : 0;
  if (rc) fprintf(stderr, "shardrec %s: %s\n", CMD, t ? "out of memory" : err);
  emb_shard_counters c0 = {0};
  int shard = !rc && emb_shard_counters_get(store, &c0) == 0;
  const uint64_t cpu0 = sr_process_cpu_ns(), bg0 = sr_named_threads_cpu_ns("rocksdb:");
  const uint64_t pool0 = sr_named_threads_cpu_ns("sr:dense");
  double t0 = sr_now();
  for (long long s = 0; !rc && s < f->steps; s++) {
    int got;
    if (ahead > 0) head = (head + 1) % slots, ahead--, got = ring[head].n;
    else if ((got = bts_next(src, &ring[head], B)) < 0) rc = -1;
    while (!rc && ahead < depth && s + ahead + 1 < f->steps) {
      int k = (head + ahead + 1) % slots;
      if (bts_next(src, &ring[k], B) < 0) {
        rc = -1;
        break;
      }
      ahead++;
      if (trainer_ahead(t, &ring[k], s + ahead)) rc = -2;
    }
    if (!rc && trainer_step(t, &ring[head], s, 0.01f, 0.01f, &r->loss[s])) rc = -2;
    if (rc == -2) fprintf(stderr, "shardrec %s: step %lld: %s\n", CMD, s, trainer_errmsg(t));
    r->samples += got;
  }
  r->secs = sr_now() - t0;
  r->cpu_ns = sr_process_cpu_ns() - cpu0;
  r->bg_ns = named_cpu_since("rocksdb:", bg0);
  r->pool_ns = named_cpu_since("sr:dense", pool0);
  if (t) r->tt = *trainer_times_get(t);
  if (shard && !emb_shard_counters_get(store, &r->c)) {
    r->c.evictions -= c0.evictions;
    r->c.writebacks -= c0.writebacks;
    r->c.rocks_reads -= c0.rocks_reads;
    r->c.rocks_found -= c0.rocks_found;
    r->c.rocks_read_ns -= c0.rocks_read_ns;
    r->c.rocks_write_ns -= c0.rocks_write_ns;
    r->c.io_own_ns -= c0.io_own_ns;
    r->c.caller_ns -= c0.caller_ns;
  }
  for (int i = 0; i < slots; i++) ds_batch_free(&ring[i]);
  trainer_destroy(t);
  ds_source_destroy(src);
  return rc ? -1 : 0;
}

/* A run's line: samples/s, the ratio to mem's, the step's split, the shard
 * store's counters per step, the losses against mem's. */
static void bts_line(const char *what, emb_precision prec, int depth, const bts_result *r,
                     const bts_result *mem, long long steps) {
  double rate = (double)r->samples / r->secs, ms = 1e3 / (double)steps, per = 1.0 / (double)steps;
  char d[16] = "-";
  if (depth >= 0) snprintf(d, sizeof d, "%d", depth);
  int same = !memcmp(r->loss, mem->loss, (size_t)steps * sizeof *r->loss);
  printf("%-7s %-7s %5s %10.0f %6.2fx %8.1f %10.2f %9.2f %7.2f %7.2f %11.0f %9.0f %10.0f  %s\n", what,
         emb_precision_name(prec), d,
         rate, rate / ((double)mem->samples / mem->secs), r->secs * ms, r->tt.lookup * ms,
         r->tt.prefetch * ms, r->tt.push * ms,
         (r->tt.forward + r->tt.backward + r->tt.dense_opt) * ms, (double)r->c.rocks_reads * per,
         (double)r->c.evictions * per, (double)r->c.writebacks * per,
         r == mem ? "(reference)" : same ? "bit-identical" : "DIFFER");
  const double cms = 1e-6 / (double)steps; /* ns over the run -> ms a step */
  if (r == mem) {
    printf("  CPU a step: %.1f ms (the process, every thread; the dense pool's workers %.1f)\n",
           (double)r->cpu_ns * cms, (double)r->pool_ns * cms);
  } else {
    /* What the store's counters and threads do not hold: mostly the
       trainer's thread, its own work slowed beside the store's, and its
       waits. */
    const double more = (double)r->cpu_ns - (double)mem->cpu_ns,
                 pool = (double)r->pool_ns - (double)mem->pool_ns,
                 store = (double)(r->c.rocks_read_ns + r->c.rocks_write_ns + r->bg_ns +
                                  r->c.io_own_ns + r->c.caller_ns);
    printf("  CPU a step: %.1f ms, %+.1f against memory: RocksDB reads %.1f, write-backs %.1f, "
           "flushes and compactions %.1f; the store's own %.1f (I/O jobs) + %.1f (caller); "
           "the dense pool's workers %+.1f; the rest %+.1f\n",
           (double)r->cpu_ns * cms, more * cms, (double)r->c.rocks_read_ns * cms,
           (double)r->c.rocks_write_ns * cms, (double)r->bg_ns * cms,
           (double)r->c.io_own_ns * cms, (double)r->c.caller_ns * cms, pool * cms,
           (more - store - pool) * cms);
  }
  fflush(stdout);
}

/* One round: the in-memory run, then a shard store per depth (cache sc),
 * each depth's samples/s into rate[depth index] and its ratio to the
 * in-memory run into ratio[depth index]; losses (f->steps) is the
 * in-memory run's. 0 or -1. */
static int bts_round(const bts_flags *f, const char *dir, const char *bin, const emb_plan *plan,
                     const dense_config *cfg, const emb_shard_config *sc, float *losses,
                     double *rate, double *ratio) {
  char err[1024], db[SR_PATH_MAX];
  bts_result mem = {.loss = losses}, r;
  int rc = -1;
  emb_store *s = emb_store_create_local(plan, err, sizeof err);
  if (!s) fprintf(stderr, "shardrec %s: %s\n", CMD, err);
  if (s && !bts_steps(f, bin, plan, cfg, s, 0, &mem)) rc = 0;
  emb_store_destroy(s);
  if (!rc) bts_line("memory", plan->tables[0].precision, -1, &mem, &mem, f->steps);
  for (int i = 0; !rc && i < f->nd; i++) {
    memset(&r, 0, sizeof r);
    rc = -1;
    if (sr_path_err(db, sizeof db, err, sizeof err, "%s/rows-d%d-%d", dir, f->depth[i], i) ||
        !(r.loss = calloc((size_t)f->steps, sizeof *r.loss)) ||
        !(s = emb_store_create_shard(plan, db, sc, err, sizeof err))) {
      fprintf(stderr, "shardrec %s: %s\n", CMD, r.loss ? err : "out of memory");
    } else {
      rc = bts_steps(f, bin, plan, cfg, s, f->depth[i], &r);
      emb_store_destroy(s);
      if (!rc) bts_line("shard", plan->tables[0].precision, f->depth[i], &r, &mem, f->steps);
      rate[i] = (double)r.samples / r.secs;
      ratio[i] = rate[i] / ((double)mem.samples / mem.secs);
    }
    free(r.loss);
    sr_rmtree(db);
  }
  return rc;
}

/* f->rounds rounds (bts_round) at the cache the flags give; each depth's
 * median samples/s into rate[depth index]. 0 or -1. */
static int bts_compare(const bts_flags *f, const char *dir, const char *bin, emb_plan *plan,
                       const dense_config *cfg, long long touched, double *rate) {
  emb_shard_config sc = {0};
  if (f->cache_mb) {
    sc.cache_mb = (uint64_t)f->cache_mb;
    printf("%s weights: shard store cache %lld MiB: %llu rows (%.3g of the %lld rows touched)\n",
           emb_precision_name(plan->tables[0].precision), f->cache_mb,
           (unsigned long long)emb_shard_rows_for_mb(plan, sc.cache_mb),
           (double)emb_shard_rows_for_mb(plan, sc.cache_mb) / (double)touched, touched);
  } else {
    sc.cache_rows = (uint64_t)(f->fraction * (double)touched);
    if (sc.cache_rows < EMB_SHARD_MIN_CACHE_ROWS) sc.cache_rows = EMB_SHARD_MIN_CACHE_ROWS;
    printf("%s weights: rows touched by the %lld steps: %lld; shard store cache %llu rows (%.3g of "
           "them)\n", emb_precision_name(plan->tables[0].precision), f->steps, touched,
           (unsigned long long)sc.cache_rows, f->fraction);
  }
  double rates[MAX_ROUNDS][MAX_DEPTHS], ratios[MAX_ROUNDS][MAX_DEPTHS];
  float *losses = calloc((size_t)f->steps, sizeof *losses);
  int rc = losses ? 0 : -1;
  if (rc) fprintf(stderr, "shardrec %s: out of memory\n", CMD);
  for (int k = 0; !rc && k < f->rounds; k++)
    rc = bts_round(f, dir, bin, plan, cfg, &sc, losses, rates[k], ratios[k]);
  free(losses);
  for (int i = 0; !rc && i < f->nd; i++) {
    double rt[MAX_ROUNDS], ra[MAX_ROUNDS];
    for (int k = 0; k < f->rounds; k++) rt[k] = rates[k][i], ra[k] = ratios[k][i];
    if (f->rounds > 1) {
      printf("  depth %d: ratio", f->depth[i]);
      for (int k = 0; k < f->rounds; k++) printf(" %.2fx", ra[k]);
      printf(": median %.2fx of %lld rounds\n", sr_median(ra, (int)f->rounds), f->rounds);
    }
    rate[i] = sr_median(rt, (int)f->rounds);
  }
  return rc;
}

/* The plan and model of the flags over bin, then the runs. 0 or -1. */
static int bts_main(const bts_flags *f, const char *dir, const char *bin) {
  char err[1024];
  ds_source_opts so = {.path = bin, .split = DS_SPLIT_TRAIN};
  ds_source *src = ds_source_open(&so, err, sizeof err);
  uint64_t sizes[DS_NUM_SPARSE];
  if (!src || ds_source_table_sizes(src, sizes)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, src ? ds_source_errmsg(src) : err);
    ds_source_destroy(src);
    return -1;
  }
  ds_source_destroy(src);
  dense_config cfg;
  if (cli_model_arch(CMD, f->bot, f->top, "dot", 0, (int)f->dim, DS_NUM_SPARSE, (int)f->batch,
                     &cfg))
    return -1;
  uint64_t total = 0;
  for (int t = 0; t < DS_NUM_SPARSE; t++) total += sizes[t];
  printf("\n%s: %llu rows in %d tables, dim %lld, bottom %s, top %s, Adagrad "
         "lr 0.01 (sparse: %s), batch %lld, %lld steps; %d dense thread(s)\n",
         bin, (unsigned long long)total, DS_NUM_SPARSE, f->dim, f->bot, f->top,
         emb_optim_name(f->sopt), f->batch, f->steps,
         dense_pool_threads(dense_pool_default()));
  long long touched = bts_touched(bin, f, sizes);
  double rate[MAX_PRECS][MAX_DEPTHS];
  int rc = touched < 0 ? -1 : 0;
  if (!rc)
    printf("%-7s %-7s %5s %10s %7s %8s %10s %9s %7s %7s %11s %9s %10s  %s\n", "store", "weights",
           "depth", "samples/s", "ratio", "step ms", "lookup wait", "prefetch", "push", "dense",
           "reads/step", "evict/st", "wback/st", "losses");
  /* Each precision's plan, then its in-memory run and shard store runs. */
  for (int p = 0; !rc && p < f->np; p++) {
    emb_plan *plan = NULL;
    emb_plan_params pp = {.n_tables = DS_NUM_SPARSE, .rows = sizes, .dim = (int)f->dim,
                          .pooling = EMB_POOL_SUM, .optim = {.kind = f->sopt, .eps = -1},
                          .seed = 3, .n_shards = 1, .precision = f->prec[p]};
    if (emb_plan_create(&pp, &plan, err, sizeof err)) {
      fprintf(stderr, "shardrec %s: %s\n", CMD, err);
      rc = -1;
    } else {
      rc = bts_compare(f, dir, bin, plan, &cfg, touched, rate[p]);
    }
    emb_plan_free(plan);
  }
  if (!rc && f->np > 1) {
    printf("shard store samples/s against %s's (same depth%s):\n", emb_precision_name(f->prec[0]),
           f->cache_mb ? ", same cache MiB" : ", same cache fraction");
    for (int p = 1; p < f->np; p++)
      for (int i = 0; i < f->nd; i++)
        printf("  %s depth %d: %.0f against %.0f: %.2fx\n", emb_precision_name(f->prec[p]),
               f->depth[i], rate[p][i], rate[0][i], rate[p][i] / rate[0][i]);
  }
  return rc;
}

int bench_train_store(int argc, char **argv) {
  bts_flags f = {.fraction = 0.1, .depth = {0, TRAIN_PREFETCH_DEPTH_DEFAULT}, .nd = 2,
                 .prec = {EMB_PREC_FP32}, .np = 1, .sopt = EMB_OPT_ADAGRAD,
                 .rows = 1200000, .steps = 250, .batch = 2048, .dim = 16, .rounds = 1,
                 .max_ind_range = 4000000, .bot = "13-512-256-64-16", .top = "512-256-1"};
  int status = bts_parse(argc, argv, &f);
  if (status >= 0) return status;
  struct dense_pool *pool = cli_dense_begin(CMD, (int)f.threads, NULL);
  if (!pool) return 1;
  char dir[] = "/tmp/shardrec-bench-XXXXXX", bin[SR_PATH_MAX];
  if (!mkdtemp(dir)) {
    perror("bench train: mkdtemp");
    cli_dense_end(pool);
    return 1;
  }
  if (f.data) snprintf(bin, sizeof bin, "%s", f.data);
  status = (f.data || !bts_prepare(dir, &f, bin, sizeof bin)) && !bts_main(&f, dir, bin) ? 0 : 1;
  double load[3] = {0, 0, 0};
  if (!status && getloadavg(load, 3) > 0)
    printf("%s; step ms: wall time a step; lookup wait, prefetch, push, "
           "dense (forward + backward + dense opt): the trainer's phases; reads: rows read from "
           "RocksDB; load average %.2f\n",
           f.rounds > 1 ? "the runs of each round in this order" : "one run each, in this order",
           load[0]);
  if (sr_rmtree(dir) != 0) fprintf(stderr, "bench train: could not remove %s\n", dir);
  cli_dense_end(pool);
  return status;
}
