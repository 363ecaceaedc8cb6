/* shardrec bench store: lookup rows/s of the RocksDB shard store beside raw
 * RocksDB MultiGet on the same keys and a plain memcpy gather of the same
 * rows, all measured in this run (median of --runs).
 *
 * One table of --rows rows (dim --dim, adagrad state: value + state floats
 * per row, random contents) is written to a RocksDB database in a temporary
 * folder, flushed to SST files and compacted (no compaction runs during the
 * measurements). Then, batches of --batch unique ids:
 *   raw MultiGet     RocksDB's batched MultiGet (store_multi_get_cf) of the
 *                    batch + decoding each row into the output
 *   miss             the shard store, cache --cache-rows, the same batches
 *                    as raw MultiGet (more ids than the cache holds, so each
 *                    comes back evicted: all misses; hit rate printed)
 *   memcpy gather    dim floats per id from a random-filled [cache_rows][dim]
 *   hit              the shard store with the same cache, ids drawn from the
 *                    rows it already holds (all hits)
 *   zipf             ids Zipf(--zipf) over the table (rank -> id scrambled),
 *                    with the hit rate the cache reached
 * RocksDB block cache: --block-cache-mb (default: room for the whole table,
 * as in the machine notes' "everything in block cache" figure). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
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
  const uint64_t *idp[1];
  size_t counts[1];
  float *out;
  float *op[1];
  emb_idset set;
} lk;

static int lookup(lk *l, const uint64_t *ids, size_t n) {
  l->idp[0] = ids;
  l->counts[0] = n;
  l->op[0] = l->out;
  l->set.n_tables = 1;
  l->set.ids = l->idp;
  l->set.counts = l->counts;
  if (emb_store_lookup_begin(l->s, 0, &l->set, l->op) || emb_store_lookup_wait(l->s)) {
    fprintf(stderr, "shardrec bench store: %s\n", emb_store_errmsg(l->s));
    return -1;
  }
  return 0;
}

int bench_store(int argc, char **argv) {
  long long rows = 1000000, dim = 16, batch = 4096, cache_rows = 0, runs = 3, nbatches = 60,
            bc_mb = 0;
  double zipf = 1.1;
  int lz4 = 0;
  static const struct option opts[] = {{"rows", required_argument, 0, 'r'},
                                       {"dim", required_argument, 0, 'd'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"cache-rows", required_argument, 0, 'c'},
                                       {"batches", required_argument, 0, 'n'},
                                       {"runs", required_argument, 0, 'R'},
                                       {"zipf", required_argument, 0, 'z'},
                                       {"block-cache-mb", required_argument, 0, 'B'},
                                       {"compression", required_argument, 0, 'C'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'r': if (cli_int(CMD, "--rows", optarg, 10000, 1LL << 31, &rows)) return 2; break;
      case 'd': if (cli_int(CMD, "--dim", optarg, 1, 1024, &dim)) return 2; break;
      case 'b': if (cli_int(CMD, "--batch", optarg, 1, 1 << 20, &batch)) return 2; break;
      case 'c': if (cli_int(CMD, "--cache-rows", optarg, 2048, 1LL << 30, &cache_rows)) return 2; break;
      case 'n': if (cli_int(CMD, "--batches", optarg, 1, 1 << 20, &nbatches)) return 2; break;
      case 'R': if (cli_int(CMD, "--runs", optarg, 1, 99, &runs)) return 2; break;
      case 'z': if (cli_double(CMD, "--zipf", optarg, 1.0001, 3, &zipf)) return 2; break;
      case 'B': if (cli_int(CMD, "--block-cache-mb", optarg, 1, 1 << 20, &bc_mb)) return 2; break;
      case 'C':
        if (strcmp(optarg, "none") && strcmp(optarg, "lz4")) {
          fprintf(stderr, "shardrec bench store: --compression: none or lz4\n");
          return 2;
        }
        lz4 = !strcmp(optarg, "lz4");
        break;
      case 'h':
        printf("usage: shardrec bench store [--rows N] [--dim D] [--batch B] [--cache-rows C] "
               "[--batches N] [--runs R] [--zipf S] [--block-cache-mb M] [--compression none|lz4]\n");
        return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (!cache_rows) cache_rows = rows / 10 > 2 * batch ? rows / 10 : 2 * batch;
  if (cache_rows < 2 * batch) {
    fprintf(stderr, "shardrec bench store: --cache-rows must be at least twice --batch\n");
    return 2;
  }
  int status = 1;
  char dir[] = "/tmp/shardrec-bench-store-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  /* The plan: one table, adagrad. */
  uint64_t r64 = (uint64_t)rows;
  emb_plan_params pp = {.n_tables = 1, .rows = &r64, .dim = (int)dim,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 1, .n_shards = 1};
  emb_plan *plan = NULL;
  char err[1024];
  if (emb_plan_create(&pp, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec bench store: %s\n", err);
    return 1;
  }
  int slen = emb_optim_state_len(&plan->tables[0].optim, (int)dim), w = (int)dim + slen;
  size_t rsz = store_row_size((int)dim, slen);
  size_t block_cache = bc_mb ? (size_t)bc_mb << 20 : (size_t)rows * (rsz + 24) * 5 / 4 + (16u << 20);
  uint64_t *ids = malloc((size_t)rows * sizeof *ids), *bids = malloc((size_t)batch * sizeof *bids);
  float *out = malloc((size_t)batch * (size_t)dim * sizeof *out);
  float *rowbuf = malloc((size_t)w * 4), *gather = malloc((size_t)cache_rows * (size_t)dim * 4);
  unsigned char *enc = malloc(rsz);
  int *cfs = calloc((size_t)batch, sizeof *cfs);
  char **vals = malloc((size_t)batch * sizeof *vals);
  size_t *lens = malloc((size_t)batch * sizeof *lens);
  double *cdf = malloc((size_t)rows * sizeof *cdf);
  emb_store *s = NULL;
  store_db *db = NULL;
  if (!ids || !bids || !out || !rowbuf || !gather || !enc || !cfs || !vals || !lens || !cdf) {
    fprintf(stderr, "shardrec bench store: out of memory\n");
    goto done;
  }
  sr_rng rng;
  sr_rng_init(&rng, 42, 0);
  /* Fill RocksDB with random rows. */
  char path[512];
  snprintf(path, sizeof path, "%s/shard-0", dir);
  uint32_t tid = plan->tables[0].table_id;
  store_opts so = {.block_cache_bytes = block_cache, .write_buffer_bytes = 64u << 20,
                   .compression = lz4 ? STORE_COMPRESSION_LZ4 : STORE_COMPRESSION_NONE};
  double t0 = sr_now();
  if (store_open(path, 1, &tid, &so, &db, err, sizeof err)) {
    fprintf(stderr, "shardrec bench store: %s\n", err);
    goto done;
  }
  for (long long i = 0; i < rows; i++) {
    for (int j = 0; j < w; j++) rowbuf[j] = (float)(sr_rng_uniform(&rng) - 0.5);
    store_row_encode((int)dim, slen, rowbuf, enc);
    store_batch_put(db, 0, (uint64_t)i, enc, rsz);
    if ((i + 1) % 65536 == 0 || i + 1 == rows)
      if (store_batch_commit(db, err, sizeof err)) {
        fprintf(stderr, "shardrec bench store: %s\n", err);
        goto done;
      }
  }
  if (store_flush(db, err, sizeof err) || store_compact(db, err, sizeof err)) {
    fprintf(stderr, "shardrec bench store: %s\n", err);
    goto done;
  }
  printf("store  %lld rows x (dim %lld + state %d) floats = %.1f MB of values, %s compression, "
         "block cache %.0f MB; loaded in %.1f s\n",
         rows, dim, slen, (double)rows * (double)rsz / 1e6, lz4 ? "lz4" : "no",
         (double)block_cache / 1048576.0, sr_now() - t0);
  char prop[64];
  snprintf(prop, sizeof prop, "rocksdb.total-sst-files-size");
  printf("store  SST files %.1f MB\n", (double)store_property(db, 0, prop) / 1e6);
  /* A permutation of all ids (for the miss walk and the raw baseline). */
  for (long long i = 0; i < rows; i++) ids[i] = (uint64_t)i;
  for (long long i = rows - 1; i > 0; i--) {
    uint64_t j = sr_rng_below(&rng, (uint64_t)i + 1), t = ids[i];
    ids[i] = ids[j];
    ids[j] = t;
  }
  long long nb = nbatches;
  if (nb * batch > rows) nb = rows / batch;
  double raw[99], miss[99], hit[99], memc[99], zz[99], zhit[99];
  store_close(db);
  db = NULL;
  /* The shard store over the database, and beside it a read-only handle
   * for raw MultiGet (same block cache size); passes alternate raw and
   * shard so both see the same machine. */
  emb_shard_config cfg = {.cache_rows = (uint64_t)cache_rows, .block_cache_bytes = block_cache,
                          .write_buffer_bytes = 64u << 20, .lz4 = lz4};
  s = emb_store_create_shard(plan, dir, &cfg, err, sizeof err);
  store_opts rso = so;
  rso.read_only = 1;
  if (!s || store_open(path, 1, &tid, &rso, &db, err, sizeof err)) {
    fprintf(stderr, "shardrec bench store: %s\n", err);
    goto done;
  }
  lk l = {.s = s, .out = out};
  emb_store_stats st0, st1;
  /* Misses: the raw baseline's batches, in the same order; with more ids
   * than the cache holds, each comes back evicted (the hit rate shows it).
   * Pass -1 warms both block caches. */
  for (int pass = -1; pass < runs; pass++) {
    double t = sr_now();
    for (long long k = 0; k < nb; k++) {
      if (store_multi_get_cf(db, 0, (size_t)batch, ids + k * batch, (const char **)vals, lens, err,
                             sizeof err)) {
        fprintf(stderr, "shardrec bench store: %s\n", err);
        goto done;
      }
      for (long long q = 0; q < batch; q++)
        if (vals[q] && !store_row_decode(vals[q], lens[q], (int)dim, slen, rowbuf, err, sizeof err))
          memcpy(out + q * dim, rowbuf, (size_t)dim * 4);
    }
    if (pass >= 0) raw[pass] = (double)(nb * batch) / (sr_now() - t);
    emb_store_stats_get(s, &st0);
    t = sr_now();
    for (long long k = 0; k < nb; k++)
      if (lookup(&l, ids + k * batch, (size_t)batch)) goto done;
    emb_store_stats_get(s, &st1);
    if (pass >= 0) miss[pass] = (double)(nb * batch) / (sr_now() - t);
  }
  store_close(db);
  db = NULL;
  double miss_hr = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
  /* Hits: bring cache_rows / 2 rows in, then look up random subsets of them. */
  long long hot = cache_rows / 2;
  for (long long k = 0; k + batch <= hot; k += batch)
    if (lookup(&l, ids + k, (size_t)batch)) goto done;
  for (long long i = 0; i < cache_rows * dim; i++) gather[i] = (float)(sr_rng_uniform(&rng) - 0.5);
  uint64_t *hidx = malloc((size_t)(nb * batch) * sizeof *hidx);
  if (!hidx) goto done;
  for (long long k = 0; k < nb; k++) { /* unique per batch: a random window of the hot ids */
    long long off = (long long)sr_rng_below(&rng, (uint64_t)(hot - batch + 1));
    for (long long q = 0; q < batch; q++) hidx[k * batch + q] = (uint64_t)(off + q);
    for (long long q = batch - 1; q > 0; q--) { /* shuffle within the batch */
      uint64_t j = sr_rng_below(&rng, (uint64_t)q + 1), t2 = hidx[k * batch + q];
      hidx[k * batch + q] = hidx[k * batch + (long long)j];
      hidx[k * batch + (long long)j] = t2;
    }
  }
  uint64_t *hk = malloc((size_t)(nb * batch) * sizeof *hk);
  if (!hk) {
    free(hidx);
    goto done;
  }
  for (long long i = 0; i < nb * batch; i++) hk[i] = ids[hidx[i]];
  double hit_hr = 0;
  for (int pass = -1; pass < runs; pass++) {
    emb_store_stats_get(s, &st0);
    double t = sr_now();
    for (long long k = 0; k < nb; k++)
      if (lookup(&l, hk + k * batch, (size_t)batch)) goto done;
    emb_store_stats_get(s, &st1);
    if (pass >= 0) hit[pass] = (double)(nb * batch) / (sr_now() - t);
    hit_hr = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
    t = sr_now();
    for (long long k = 0; k < nb; k++)
      for (long long q = 0; q < batch; q++)
        memcpy(out + q * dim, gather + (size_t)hidx[k * batch + q] * (size_t)dim, (size_t)dim * 4);
    if (pass >= 0) memc[pass] = (double)(nb * batch) / (sr_now() - t);
  }
  free(hidx);
  free(hk);
  /* Zipf: rank r has weight 1/r^s; id = ids[r] (scrambled). */
  double acc = 0;
  for (long long r = 0; r < rows; r++) cdf[r] = (acc += pow((double)(r + 1), -zipf));
  for (long long r = 0; r < rows; r++) cdf[r] /= acc;
  uint64_t *zb = malloc((size_t)(2 * batch) * sizeof *zb);
  if (!zb) goto done;
  double z_hr = 0;
  for (int pass = -2; pass < runs; pass++) { /* two passes of warm-up */
    emb_store_stats_get(s, &st0);
    double tz = 0, n_rows = 0;
    for (long long k = 0; k < nb; k++) {
      for (long long q = 0; q < 2 * batch; q++) {
        double u = sr_rng_uniform(&rng);
        long long lo = 0, hi = rows - 1;
        while (lo < hi) {
          long long m = (lo + hi) / 2;
          if (cdf[m] < u) lo = m + 1;
          else hi = m;
        }
        zb[q] = ids[lo];
      }
      qsort(zb, (size_t)(2 * batch), sizeof *zb, cmp_u64);
      size_t n = 0;
      for (long long q = 0; q < 2 * batch && (long long)n < batch; q++)
        if (!n || zb[q] != zb[n - 1]) zb[n++] = zb[q];
      for (size_t q = n; q > 1; q--) { /* unsorted, as a batch's ids are */
        uint64_t j = sr_rng_below(&rng, q), t2 = zb[q - 1];
        zb[q - 1] = zb[j];
        zb[j] = t2;
      }
      double t = sr_now();
      if (lookup(&l, zb, n)) goto done;
      tz += sr_now() - t;
      n_rows += (double)n;
    }
    emb_store_stats_get(s, &st1);
    if (pass >= 0) {
      zz[pass] = n_rows / tz;
      zhit[pass] = (double)(st1.hits - st0.hits) / (double)(st1.lookups - st0.lookups);
    }
  }
  free(zb);
  z_hr = sr_median(zhit, (int)runs);
  double mraw = sr_median(raw, (int)runs), mmiss = sr_median(miss, (int)runs), mhit = sr_median(hit, (int)runs),
         mmem = sr_median(memc, (int)runs), mz = sr_median(zz, (int)runs);
  printf("lookup (batches of %lld unique ids, cache %lld rows, median of %lld)\n", batch, cache_rows, runs);
  printf("  raw RocksDB MultiGet   %10.0f rows/s\n", mraw);
  printf("  shard, all misses      %10.0f rows/s  (hit rate %.3f)  %.0f%% of raw MultiGet (target >= 70%%)\n",
         mmiss, miss_hr, 100 * mmiss / mraw);
  printf("  memcpy gather          %10.0f rows/s\n", mmem);
  printf("  shard, all hits        %10.0f rows/s  (hit rate %.3f)  %.0f%% of memcpy gather (target >= 50%%)\n",
         mhit, hit_hr, 100 * mhit / mmem);
  printf("  shard, zipf %.2f       %10.0f rows/s  (hit rate %.3f)\n", zipf, mz, z_hr);
  status = 0;
done:
  emb_store_destroy(s);
  store_close(db);
  store_rmtree(dir);
  emb_plan_free(plan);
  free(ids);
  free(bids);
  free(out);
  free(rowbuf);
  free(gather);
  free(enc);
  free(cfs);
  free(vals);
  free(lens);
  free(cdf);
  return status;
}
