/* shardrec bench store: lookup rows/s of the RocksDB shard store beside raw
 * RocksDB MultiGet on the same keys and a plain memcpy gather of the same
 * rows, all measured in this run (median of --runs).
 *
 * One table of --rows rows (dim --dim, adagrad state: value + state floats
 * per row, random contents) is written to a RocksDB database in a temporary
 * folder, flushed to SST files and compacted (no compaction runs during the
 * measurements). Then, batches of --batch unique ids:
 *   raw MultiGet     RocksDB's batched MultiGet (kv_reader_get_cf) of the
 *                    batch + decoding each row into the output
 *   miss             the shard store, cache --cache-rows, the same batches
 *                    as raw MultiGet (more ids than the cache holds, so each
 *                    comes back evicted: all misses; hit rate printed)
 *   memcpy gather    dim floats per id from a random-filled [cache_rows][dim],
 *                    each id at its own random row of the whole array
 *   hit              the shard store with the same cache, the same ids: drawn
 *                    at random from the rows it already holds (all hits)
 *   zipf             ids Zipf(--zipf) over the table (rank -> id scrambled),
 *                    with the hit rate the cache reached
 *   misses ahead     the miss batches again, each prefetched
 *                    (emb_store_prefetch) one batch before its lookup, as a
 *                    trainer at --prefetch-depth 1 does but with no step
 *                    between: the store threads read batch k+1 while batch
 *                    k's lookup waits for its own; the time split into the
 *                    prefetch calls and the lookups, and the share of the
 *                    run the caller spent waiting for the threads
 *   write-back       the miss batches pushed in turn: each push reads the
 *                    rows the cache lost and evicts dirty ones, which the
 *                    store threads write back as ingested SST files
 *   checkpoint       every cached row pushed (dirty), then a checkpoint:
 *                    the write-back of the dirty rows plus the RocksDB
 *                    checkpoint, the stall a trainer sees, per GB of dirty
 *                    rows
 * Beside the rates, CPU time per row (thread CPU, emb_shard_counters): of
 * RocksDB for a row read and a row written back, and of the shard store's
 * own work (decoding, the caller's map and eviction work) beside it, and
 * the heap RocksDB's table readers hold a row. RocksDB block
 * cache (lz4 tables only: uncompressed ones are read in place and have
 * none): --block-cache-mb (default: room for the whole table). The shard
 * store's write-back buffers: --write-buffer-kb (default the store's, 16
 * MiB; a write set goes to RocksDB once 12/16 of it is full). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/fs.h"
#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/shard.h"
#include "storage/kv.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "common/sys.h"

#define CMD "bench store"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  emb_store *s;
  uint64_t *ids;
  size_t count;
  int64_t step; /* of the next lookup */
  const uint64_t *idp[1];
  size_t counts[1];
  float *out;
  float *op[1];
  emb_idset set;
} lk;

static void lk_set(lk *l, const uint64_t *ids, size_t n) {
  l->idp[0] = ids;
  l->counts[0] = n;
  l->op[0] = l->out;
  l->set.n_tables = 1;
  l->set.ids = l->idp;
  l->set.counts = l->counts;
}

static int lookup(lk *l, const uint64_t *ids, size_t n) {
  lk_set(l, ids, n);
  if (emb_store_lookup_begin(l->s, l->step, &l->set, l->op) || emb_store_lookup_wait(l->s)) {
    fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(l->s));
    return -1;
  }
  return 0;
}

/* One run: the flags, the buffers (owned) and the figures of each pass. */
typedef struct bs {
  long long rows, dim, batch, cache_rows, runs, nbatches, bc_mb;
  double zipf;
  int lz4;
  char dir[64];        /* the temporary folder (removed at the end) */
  char path[SR_PATH_MAX]; /* its database, dir/shard-0 */
  emb_plan *plan;
  uint32_t tid;
  int slen, w;         /* state floats per row; value + state */
  size_t rsz, block_cache;
  long long wb_kb;     /* the shard store's write-back buffers (0: its default) */
  kv_opts so;
  uint64_t *ids;       /* [rows] a permutation of all ids */
  uint64_t *bids;
  float *out;          /* [batch][dim] */
  float *rowbuf;       /* [w] */
  float *gather;       /* [cache_rows][dim] */
  unsigned char *enc;  /* [rsz] */
  int *cfs;
  char **vals;         /* [batch] */
  size_t *lens;        /* [batch] */
  double *cdf;         /* [rows] */
  emb_store *s;
  kv_db *db;
  sr_rng rng;
  long long nb;        /* batches per pass */
  lk l;
  double raw[99], miss[99], hit[99], memc[99], zz[99], zhit[99], pf[99], pf_call[99], pf_wait[99];
  /* CPU per row, microseconds: raw MultiGet's (whole loop, one thread); the
   * shard store's misses: inside RocksDB, its read jobs beside it, its
   * caller; write-backs: inside RocksDB, the caller per row pushed, the
   * whole process per row pushed (RocksDB's flushes and compactions too) */
  double raw_cpu[99], rd_cpu[99], rd_own[99], rd_caller[99];
  double wb[99], wr_cpu[99], wb_caller[99], wb_proc[99], wb_rows[99];
  double ck_s, ck_mb;
  double miss_hr, hit_hr, z_hr;
  char err[1024];
} bs;

/* Parse argv into *b. Returns -1 to go on, or the exit status (0 for
 * --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, bs *b) {
  static const struct option opts[] = {{"rows", required_argument, 0, 'r'},
                                       {"dim", required_argument, 0, 'd'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"cache-rows", required_argument, 0, 'c'},
                                       {"batches", required_argument, 0, 'n'},
                                       {"runs", required_argument, 0, 'R'},
                                       {"zipf", required_argument, 0, 'z'},
                                       {"block-cache-mb", required_argument, 0, 'B'},
                                       {"compression", required_argument, 0, 'C'},
                                       {"write-buffer-kb", required_argument, 0, 'W'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'r': if (cli_int(CMD, "--rows", optarg, 10000, 1LL << 31, &b->rows)) return 2; break;
      case 'd': if (cli_int(CMD, "--dim", optarg, 1, 1024, &b->dim)) return 2; break;
      case 'b': if (cli_int(CMD, "--batch", optarg, 1, 1 << 20, &b->batch)) return 2; break;
      case 'c': if (cli_flag(CMD, "--cache-rows", optarg, &b->cache_rows)) return 2; break;
      case 'n': if (cli_int(CMD, "--batches", optarg, 1, 1 << 20, &b->nbatches)) return 2; break;
      case 'R': if (cli_int(CMD, "--runs", optarg, 1, 99, &b->runs)) return 2; break;
      case 'z': if (cli_double(CMD, "--zipf", optarg, 1.0001, 3, &b->zipf)) return 2; break;
      case 'B': if (cli_int(CMD, "--block-cache-mb", optarg, 1, 1 << 20, &b->bc_mb)) return 2; break;
      case 'W': if (cli_int(CMD, "--write-buffer-kb", optarg, 64, 1 << 20, &b->wb_kb)) return 2; break;
      case 'C':
        if (strcmp(optarg, "none") && strcmp(optarg, "lz4")) {
          fprintf(stderr, "shardrec bench store: --compression: none or lz4\n");
          return 2;
        }
        b->lz4 = !strcmp(optarg, "lz4");
        break;
      case 'h':
        printf("usage: shardrec bench store [--rows N] [--dim D] [--batch B] [--cache-rows C] "
               "[--batches N] [--runs R] [--zipf S] [--block-cache-mb M] [--compression none|lz4] "
               "[--write-buffer-kb K]\n");
        return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (!b->cache_rows) b->cache_rows = b->rows / 10 > 2 * b->batch ? b->rows / 10 : 2 * b->batch;
  if (b->cache_rows < 2 * b->batch) {
    fprintf(stderr, "shardrec bench store: --cache-rows must be at least twice --batch\n");
    return 2;
  }
  return -1;
}

/* The plan (one table, adagrad) and the buffers. 0 or -1 (printed). */
static int setup(bs *b) {
  uint64_t r64 = (uint64_t)b->rows;
  emb_plan_params pp = {.n_tables = 1, .rows = &r64, .dim = (int)b->dim,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 1, .n_shards = 1};
  if (emb_plan_create(&pp, &b->plan, b->err, sizeof b->err)) {
    fprintf(stderr, "shardrec bench store: %s\n", b->err);
    return -1;
  }
  long long rows = b->rows, dim = b->dim, batch = b->batch;
  b->slen = emb_optim_state_len(&b->plan->tables[0].optim, (int)dim);
  b->w = (int)dim + b->slen;
  b->rsz = kv_row_size((int)dim, b->slen);
  b->block_cache = b->bc_mb ? (size_t)b->bc_mb << 20
                            : (size_t)rows * (b->rsz + 24) * 5 / 4 + (16u << 20);
  b->ids = malloc((size_t)rows * sizeof *b->ids);
  b->bids = malloc((size_t)batch * sizeof *b->bids);
  b->out = malloc((size_t)batch * (size_t)dim * sizeof *b->out);
  b->rowbuf = malloc((size_t)b->w * 4);
  b->gather = malloc((size_t)b->cache_rows * (size_t)dim * 4);
  b->enc = malloc(b->rsz);
  b->cfs = calloc((size_t)batch, sizeof *b->cfs);
  b->vals = malloc((size_t)batch * sizeof *b->vals);
  b->lens = malloc((size_t)batch * sizeof *b->lens);
  b->cdf = malloc((size_t)rows * sizeof *b->cdf);
  if (!b->ids || !b->bids || !b->out || !b->rowbuf || !b->gather || !b->enc || !b->cfs ||
      !b->vals || !b->lens || !b->cdf) {
    fprintf(stderr, "shardrec bench store: out of memory\n");
    return -1;
  }
  sr_rng_init(&b->rng, 42, 0);
  return 0;
}

/* Fill RocksDB with random rows, flushed and compacted; then a permutation
 * of all ids (for the miss walk and the raw baseline). 0 or -1 (printed). */
static int load_db(bs *b) {
  long long rows = b->rows;
  char err[256];
  if (sr_path_err(b->path, sizeof b->path, err, sizeof err, "%s/shard-0", b->dir)) {
    fprintf(stderr, "shardrec bench store: %s\n", err);
    return -1;
  }
  b->tid = b->plan->tables[0].table_id;
  b->so = (kv_opts){.block_cache_bytes = b->block_cache, .write_buffer_bytes = 64u << 20,
                       .compression = b->lz4 ? KV_COMPRESSION_LZ4 : KV_COMPRESSION_NONE};
  double t0 = sr_now();
  if (kv_open(b->path, 1, &b->tid, &b->so, &b->db, b->err, sizeof b->err)) {
    fprintf(stderr, "shardrec bench store: %s\n", b->err);
    return -1;
  }
  kv_writes *wr = kv_writes_create();
  if (!wr) {
    fprintf(stderr, "shardrec bench store: out of memory\n");
    return -1;
  }
  for (long long i = 0; i < rows; i++) {
    for (int j = 0; j < b->w; j++) /* the state (an accumulator) positive, so a push is valid */
      b->rowbuf[j] = (float)(sr_rng_uniform(&b->rng) - (j < b->dim ? 0.5 : -0.01));
    kv_row_encode((int)b->dim, b->slen, b->rowbuf, b->enc);
    kv_writes_put(wr, b->db, 0, (uint64_t)i, b->enc, b->rsz);
    if ((i + 1) % 65536 == 0 || i + 1 == rows)
      if (kv_writes_commit(wr, b->db, b->err, sizeof b->err)) {
        fprintf(stderr, "shardrec bench store: %s\n", b->err);
        kv_writes_destroy(wr);
        return -1;
      }
  }
  kv_writes_destroy(wr); /* durable at the flush below */
  if (kv_flush(b->db, b->err, sizeof b->err) || kv_compact(b->db, b->err, sizeof b->err)) {
    fprintf(stderr, "shardrec bench store: %s\n", b->err);
    return -1;
  }
  char cache[64] = "no block cache";
  if (b->lz4) snprintf(cache, sizeof cache, "block cache %.0f MB", (double)b->block_cache / 1048576.0);
  printf("store  %lld rows x (dim %lld + state %d) floats = %.1f MB of values, %s compression, "
         "%s; loaded in %.1f s\n",
         rows, b->dim, b->slen, (double)rows * (double)b->rsz / 1e6, b->lz4 ? "lz4" : "no", cache,
         sr_now() - t0);
  kv_figures fig;
  kv_figures_get(b->db, &fig);
  printf("store  SST files %.1f MB; RocksDB's table readers hold %.2f MB of heap, %.2f bytes a row\n",
         (double)fig.sst_bytes / 1e6, (double)fig.table_readers_bytes / 1e6,
         (double)fig.table_readers_bytes / (double)rows);
  for (long long i = 0; i < rows; i++) b->ids[i] = (uint64_t)i;
  for (long long i = rows - 1; i > 0; i--) {
    uint64_t j = sr_rng_below(&b->rng, (uint64_t)i + 1), t = b->ids[i];
    b->ids[i] = b->ids[j];
    b->ids[j] = t;
  }
  b->nb = b->nbatches;
  if (b->nb * b->batch > rows) b->nb = rows / b->batch;
  kv_close(b->db);
  b->db = NULL;
  return 0;
}

/* The shard store over the database, and beside it a read-only handle for
 * raw MultiGet (the same kv options); passes alternate raw and shard so
 * both see the same machine. Misses: the raw baseline's batches, in the
 * same order; with more ids than the cache holds, each comes back evicted
 * (the hit rate shows it). Pass -1 warms the page cache (and, with lz4,
 * both block caches). 0 or -1. */
static int measure_miss(bs *b) {
  long long nb = b->nb, batch = b->batch, dim = b->dim;
  emb_shard_config cfg = {.cache_rows = (uint64_t)b->cache_rows, .block_cache_bytes = b->block_cache,
                          .write_buffer_bytes = (size_t)b->wb_kb << 10, .lz4 = b->lz4};
  b->s = emb_store_create_shard(b->plan, b->dir, &cfg, b->err, sizeof b->err);
  kv_opts rso = b->so;
  rso.read_only = 1;
  if (!b->s || kv_open(b->path, 1, &b->tid, &rso, &b->db, b->err, sizeof b->err)) {
    fprintf(stderr, "shardrec bench store: %s\n", b->err);
    return -1;
  }
  b->l = (lk){.s = b->s, .out = b->out};
  kv_reader *rd = kv_reader_create();
  if (!rd) {
    fprintf(stderr, "shardrec bench store: out of memory\n");
    return -1;
  }
  emb_store_stats st0, st1;
  emb_shard_counters c0, c1;
  for (int pass = -1; pass < b->runs; pass++) {
    double t = sr_now();
    uint64_t cpu = sr_thread_cpu_ns();
    for (long long k = 0; k < nb; k++) {
      if (kv_reader_get_cf(rd, b->db, 0, (size_t)batch, b->ids + k * batch,
                           (const char **)b->vals, b->lens, b->err, sizeof b->err)) {
        fprintf(stderr, "shardrec bench store: %s\n", b->err);
        kv_reader_destroy(rd);
        return -1;
      }
      for (long long q = 0; q < batch; q++)
        if (b->vals[q] && !kv_row_decode(b->vals[q], b->lens[q], (int)dim, b->slen, b->rowbuf,
                                            b->err, sizeof b->err))
          memcpy(b->out + q * dim, b->rowbuf, (size_t)dim * 4);
    }
    if (pass >= 0) {
      b->raw[pass] = (double)(nb * batch) / (sr_now() - t);
      b->raw_cpu[pass] = (double)(sr_thread_cpu_ns() - cpu) * 1e-3 / (double)(nb * batch);
    }
    emb_store_stats_get(b->s, &st0);
    emb_shard_counters_get(b->s, &c0);
    t = sr_now();
    for (long long k = 0; k < nb; k++)
      if (lookup(&b->l, b->ids + k * batch, (size_t)batch)) {
        kv_reader_destroy(rd);
        return -1;
      }
    emb_store_stats_get(b->s, &st1);
    emb_shard_counters_get(b->s, &c1);
    if (pass >= 0) {
      double n = (double)(c1.rocks_reads - c0.rocks_reads);
      b->miss[pass] = (double)(nb * batch) / (sr_now() - t);
      b->rd_cpu[pass] = (double)(c1.rocks_read_ns - c0.rocks_read_ns) * 1e-3 / n;
      b->rd_own[pass] = (double)(c1.io_own_ns - c0.io_own_ns) * 1e-3 / n;
      b->rd_caller[pass] = (double)(c1.caller_ns - c0.caller_ns) * 1e-3 / (double)(nb * batch);
    }
  }
  kv_reader_destroy(rd);
  kv_close(b->db);
  b->db = NULL;
  b->miss_hr = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
  return 0;
}

/* Hits: bring cache_rows / 2 rows in, then look up batches of unique ids
 * drawn at random from all of them; beside it the memcpy gather of the same
 * ids' rows from a plain [cache_rows][dim] array, each hot id at a row of
 * its own drawn at random over the whole array (as the cache's slots are
 * spread over its slab). A batch drawn as a window of consecutive hot ids
 * would gather from a few hundred KB that stay in L2 while the cache's map
 * and slots are read at random. 0 or -1. */
static int measure_hit(bs *b) {
  long long nb = b->nb, batch = b->batch, dim = b->dim, hot = b->cache_rows / 2;
  for (long long k = 0; k + batch <= hot; k += batch)
    if (lookup(&b->l, b->ids + k, (size_t)batch)) return -1;
  for (long long i = 0; i < b->cache_rows * dim; i++)
    b->gather[i] = (float)(sr_rng_uniform(&b->rng) - 0.5);
  uint64_t *hidx = malloc((size_t)(nb * batch) * sizeof *hidx);
  uint64_t *hk = NULL, *perm = malloc((size_t)b->cache_rows * sizeof *perm);
  int rc = -1;
  if (!hidx || !perm) goto out;
  for (long long i = 0; i < b->cache_rows; i++) perm[i] = (uint64_t)i;
  for (long long k = 0; k < nb; k++) /* unique per batch: a partial shuffle of the hot ids */
    for (long long q = 0; q < batch; q++) {
      uint64_t j = (uint64_t)q + sr_rng_below(&b->rng, (uint64_t)(hot - q)), t2 = perm[q];
      perm[q] = perm[j];
      perm[j] = t2;
      hidx[k * batch + q] = perm[q];
    }
  hk = malloc((size_t)(nb * batch) * sizeof *hk);
  if (!hk) goto out;
  for (long long i = 0; i < nb * batch; i++) hk[i] = b->ids[hidx[i]];
  for (long long i = b->cache_rows - 1; i > 0; i--) { /* hot id k's gather row: perm[k] */
    uint64_t j = sr_rng_below(&b->rng, (uint64_t)i + 1), t2 = perm[i];
    perm[i] = perm[j];
    perm[j] = t2;
  }
  for (long long i = 0; i < nb * batch; i++) hidx[i] = perm[hidx[i]];
  emb_store_stats st0, st1;
  for (int pass = -1; pass < b->runs; pass++) {
    emb_store_stats_get(b->s, &st0);
    double t = sr_now();
    for (long long k = 0; k < nb; k++)
      if (lookup(&b->l, hk + k * batch, (size_t)batch)) goto out;
    emb_store_stats_get(b->s, &st1);
    if (pass >= 0) b->hit[pass] = (double)(nb * batch) / (sr_now() - t);
    b->hit_hr = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
    t = sr_now();
    for (long long k = 0; k < nb; k++)
      for (long long q = 0; q < batch; q++)
        memcpy(b->out + q * dim, b->gather + (size_t)hidx[k * batch + q] * (size_t)dim,
               (size_t)dim * 4);
    if (pass >= 0) b->memc[pass] = (double)(nb * batch) / (sr_now() - t);
  }
  rc = 0;
out:
  free(hidx);
  free(hk);
  free(perm);
  return rc;
}

/* Zipf: rank r has weight 1/r^s; id = ids[r] (scrambled). Each batch holds
 * up to batch unique ids of 2 * batch draws. 0 or -1. */
static int measure_zipf(bs *b) {
  long long rows = b->rows, batch = b->batch;
  double acc = 0;
  for (long long r = 0; r < rows; r++) b->cdf[r] = (acc += pow((double)(r + 1), -b->zipf));
  for (long long r = 0; r < rows; r++) b->cdf[r] /= acc;
  uint64_t *zb = malloc((size_t)(2 * batch) * sizeof *zb);
  if (!zb) return -1;
  emb_store_stats st0, st1;
  for (int pass = -2; pass < b->runs; pass++) { /* two passes of warm-up */
    emb_store_stats_get(b->s, &st0);
    double tz = 0, n_rows = 0;
    for (long long k = 0; k < b->nb; k++) {
      for (long long q = 0; q < 2 * batch; q++) {
        double u = sr_rng_uniform(&b->rng);
        long long lo = 0, hi = rows - 1;
        while (lo < hi) {
          long long m = (lo + hi) / 2;
          if (b->cdf[m] < u) lo = m + 1;
          else hi = m;
        }
        zb[q] = b->ids[lo];
      }
      qsort(zb, (size_t)(2 * batch), sizeof *zb, cmp_u64);
      size_t n = 0;
      for (long long q = 0; q < 2 * batch && (long long)n < batch; q++)
        if (!n || zb[q] != zb[n - 1]) zb[n++] = zb[q];
      for (size_t q = n; q > 1; q--) { /* unsorted, as a batch's ids are */
        uint64_t j = sr_rng_below(&b->rng, q), t2 = zb[q - 1];
        zb[q - 1] = zb[j];
        zb[j] = t2;
      }
      double t = sr_now();
      if (lookup(&b->l, zb, n)) {
        free(zb);
        return -1;
      }
      tz += sr_now() - t;
      n_rows += (double)n;
    }
    emb_store_stats_get(b->s, &st1);
    if (pass >= 0) {
      b->zz[pass] = n_rows / tz;
      b->zhit[pass] = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
    }
  }
  free(zb);
  b->z_hr = sr_median(b->zhit, (int)b->runs);
  return 0;
}

/* The miss batches again, batch k+1 prefetched before batch k's lookup. 0 or -1. */
static int measure_prefetch(bs *b) {
  long long nb = b->nb, batch = b->batch;
  b->l.step++; /* above every step looked up so far */
  for (int pass = -1; pass < b->runs; pass++) {
    emb_shard_counters c0, c1;
    emb_shard_counters_get(b->s, &c0);
    double tcall = 0, t = sr_now();
    for (long long k = 0; k < nb; k++, b->l.step++) {
      for (long long a = k ? k + 1 : 0; a <= k + 1 && a < nb; a++) {
        lk_set(&b->l, b->ids + a * batch, (size_t)batch);
        double t1 = sr_now();
        if (emb_store_prefetch(b->s, b->l.step + (a - k), &b->l.set)) {
          fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(b->s));
          return -1;
        }
        tcall += sr_now() - t1;
      }
      if (lookup(&b->l, b->ids + k * batch, (size_t)batch)) return -1;
    }
    double dt = sr_now() - t;
    emb_shard_counters_get(b->s, &c1);
    if (pass >= 0) {
      b->pf[pass] = (double)(nb * batch) / dt;
      b->pf_call[pass] = tcall / dt;
      b->pf_wait[pass] = (double)(c1.wait_ns - c0.wait_ns) * 1e-9 / dt;
    }
  }
  return 0;
}

/* Write-backs as training makes them: the miss batches pushed in turn, so
 * that each push reads rows the cache lost and evicts dirty ones, written
 * back by the store threads. Per pass: rows pushed/s, RocksDB's CPU per row
 * written back, the caller's and the whole process's CPU per row pushed
 * (the process: reads, write-backs, RocksDB's flushes and compactions). 0
 * or -1. */
static int measure_wback(bs *b) {
  long long nb = b->nb, batch = b->batch;
  float *g = calloc((size_t)(batch * b->dim), sizeof *g);
  if (!g) return -1;
  for (long long i = 0; i < batch * b->dim; i++) g[i] = 1e-3f;
  const float *gp[1] = {g};
  int rc = 0;
  for (int pass = -1; pass < b->runs && !rc; pass++) {
    emb_shard_counters c0, c1;
    emb_shard_counters_get(b->s, &c0);
    uint64_t p0 = sr_process_cpu_ns();
    double t = sr_now();
    for (long long k = 0; k < nb && !rc; k++, b->l.step++) {
      lk_set(&b->l, b->ids + k * batch, (size_t)batch);
      if ((rc = emb_store_push(b->s, b->l.step, 0.01f, &b->l.set, gp)))
        fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(b->s));
    }
    double dt = sr_now() - t, n = (double)(nb * batch);
    uint64_t p1 = sr_process_cpu_ns();
    emb_shard_counters_get(b->s, &c1);
    if (pass >= 0 && !rc) {
      /* rows per row pushed from the rows the pushes gave the write
       * buffers (counted as they are given, so exact for the pass); RocksDB's
       * CPU per row from the rows the threads wrote meanwhile, which may
       * include a buffer the previous pass filled */
      double w = (double)(c1.wb_rows - c0.wb_rows);
      b->wb[pass] = n / dt;
      b->wb_rows[pass] = (double)(c1.writebacks - c0.writebacks) / n;
      b->wr_cpu[pass] = w > 0 ? (double)(c1.rocks_write_ns - c0.rocks_write_ns) * 1e-3 / w : 0;
      b->wb_caller[pass] = (double)(c1.caller_ns - c0.caller_ns) * 1e-3 / n;
      b->wb_proc[pass] = (double)(p1 - p0) * 1e-3 / n;
    }
  }
  free(g);
  return rc ? -1 : 0;
}

/* Every cached row pushed (dirty), then one checkpoint timed. 0 or -1. */
static int measure_ckpt(bs *b) {
  long long batch = b->batch, n = b->cache_rows - b->cache_rows % batch;
  float *g = calloc((size_t)(batch * b->dim), sizeof *g);
  if (!g) return -1;
  for (long long i = 0; i < batch * b->dim; i++) g[i] = 1e-3f;
  const float *gp[1] = {g};
  for (long long k = 0; k < n; k += batch, b->l.step++) {
    lk_set(&b->l, b->ids + k, (size_t)batch);
    if (emb_store_push(b->s, b->l.step, 0.01f, &b->l.set, gp)) {
      fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(b->s));
      free(g);
      return -1;
    }
  }
  free(g);
  char path[SR_PATH_MAX];
  if (sr_path_err(path, sizeof path, b->err, sizeof b->err, "%s/ck", b->dir)) {
    fprintf(stderr, "shardrec bench store: %s\n", b->err);
    return -1;
  }
  emb_shard_counters c0, c1;
  emb_shard_counters_get(b->s, &c0);
  double t = sr_now();
  if (emb_store_checkpoint(b->s, path)) {
    fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(b->s));
    return -1;
  }
  b->ck_s = sr_now() - t;
  emb_shard_counters_get(b->s, &c1);
  b->ck_mb = (double)(c1.writebacks - c0.writebacks) * (double)b->rsz / 1e6;
  return 0;
}

static void print_figures(bs *b) { /* sr_median sorts the figures */
  int runs = (int)b->runs;
  double mraw = sr_median(b->raw, runs), mmiss = sr_median(b->miss, runs),
         mhit = sr_median(b->hit, runs), mmem = sr_median(b->memc, runs),
         mz = sr_median(b->zz, runs);
  printf("lookup (batches of %lld unique ids, cache %lld rows, median of %lld)\n", b->batch,
         b->cache_rows, b->runs);
  printf("  raw RocksDB MultiGet   %10.0f rows/s\n", mraw);
  printf("  shard, all misses      %10.0f rows/s  (hit rate %.3f)  %.0f%% of raw MultiGet (target >= 70%%)\n",
         mmiss, b->miss_hr, 100 * mmiss / mraw);
  printf("  memcpy gather          %10.0f rows/s\n", mmem);
  printf("  shard, all hits        %10.0f rows/s  (hit rate %.3f)  %.0f%% of memcpy gather (target >= 60%%)\n",
         mhit, b->hit_hr, 100 * mhit / mmem);
  printf("  shard, zipf %.2f       %10.0f rows/s  (hit rate %.3f)\n", b->zipf, mz, b->z_hr);
  double mpf = sr_median(b->pf, runs), mcall = sr_median(b->pf_call, runs),
         mwait = sr_median(b->pf_wait, runs);
  printf("  shard, misses 1 ahead  %10.0f rows/s  %.2fx all misses; of the time: prefetch calls "
         "%.0f%%, lookups %.0f%% (waiting for the %d store threads %.0f%%)\n",
         mpf, mpf / mmiss, 100 * mcall, 100 * (1 - mcall), EMB_SHARD_DEFAULT_THREADS, 100 * mwait);
  printf("CPU per row, microseconds (thread CPU time; median of %lld)\n", b->runs);
  printf("  read, raw MultiGet           %6.2f  (the whole loop: RocksDB and decoding)\n",
         sr_median(b->raw_cpu, runs));
  printf("  read, shard store misses     %6.2f in RocksDB + %.2f read jobs' own (decode) + %.2f "
         "caller (map, slots, eviction) per row looked up\n",
         sr_median(b->rd_cpu, runs), sr_median(b->rd_own, runs), sr_median(b->rd_caller, runs));
  printf("  write-back, pushes of misses %6.2f in RocksDB per row written back (SST files written "
         "and ingested); %.0f rows/s pushed, %.2f written back per row; per row pushed: caller "
         "%.2f, whole process %.2f (reads, flushes, compactions too)\n",
         sr_median(b->wr_cpu, runs), sr_median(b->wb, runs), sr_median(b->wb_rows, runs),
         sr_median(b->wb_caller, runs), sr_median(b->wb_proc, runs));
  printf("checkpoint: %.1f MB of dirty rows written back + RocksDB checkpoint in %.3f s = %.1f s "
         "per GB of dirty rows\n",
         b->ck_mb, b->ck_s, b->ck_mb > 0 ? b->ck_s / (b->ck_mb / 1e3) : 0.0);
}

static void bs_free(bs *b) {
  emb_store_destroy(b->s);
  kv_close(b->db);
  if (b->dir[0]) sr_rmtree(b->dir);
  emb_plan_free(b->plan);
  free(b->ids);
  free(b->bids);
  free(b->out);
  free(b->rowbuf);
  free(b->gather);
  free(b->enc);
  free(b->cfs);
  free(b->vals);
  free(b->lens);
  free(b->cdf);
}

int bench_store(int argc, char **argv) {
  bs *b = calloc(1, sizeof *b);
  if (!b) {
    fprintf(stderr, "shardrec bench store: out of memory\n");
    return 1;
  }
  b->rows = 1000000;
  b->dim = 16;
  b->batch = 4096;
  b->runs = 3;
  b->nbatches = 60;
  b->zipf = 1.1;
  int status = parse_flags(argc, argv, b);
  if (status >= 0) {
    free(b);
    return status;
  }
  status = 1;
  sr_path(b->dir, sizeof b->dir, "/tmp/shardrec-bench-store-XXXXXX"); /* a literal that fits */
  if (!mkdtemp(b->dir)) {
    perror("mkdtemp");
    free(b);
    return 1;
  }
  if (!setup(b) && !load_db(b) && !measure_miss(b) && !measure_prefetch(b) && !measure_hit(b) &&
      !measure_zipf(b) && !measure_wback(b) && !measure_ckpt(b)) {
    print_figures(b);
    status = 0;
  }
  bs_free(b);
  free(b);
  return status;
}
