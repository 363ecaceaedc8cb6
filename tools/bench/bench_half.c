/* shardrec bench half: what 16-bit embedding weights save and cost, fp32,
 * fp16 and bf16 side by side in one run, on one table of --rows rows of
 * --dim (row-wise Adagrad: one float of state a row):
 *   - bytes a row and rows per GiB: the in-process store's slots (its
 *     stats), a RocksDB row, a table file record;
 *   - the in-process store: pushes and lookups of --batch random ids, rows/s;
 *   - Lookups from one gRPC server on loopback (an in-process store behind
 *     it), rows/s, and the answer's bytes a row (a server a precision, all
 *     running at once);
 *   - the RocksDB shard store under a cache of --cache-mb MiB (smaller than
 *     the table: lookups read misses), rows/s, and its SST bytes.
 * Each figure is printed beside fp32's, measured in the same run; the
 * lookup figures are medians of --rounds rounds, each timing the three
 * precisions in turn. Lookups hand 16-bit rows as they are where the store
 * can (in-process, gRPC), as the trainer takes them. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/sys.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "storage/kv.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "bench half"

typedef struct {
  long long rows, dim, batch, iters, cache_mb, rounds;
} hopts;

#define MAX_ROUNDS 99

typedef struct {
  double mem_row, kv_row, file_row;     /* bytes a row */
  double push, lookup, rpc, shard;      /* rows/s */
  double wire_row, sst;                 /* answer bytes a row; SST bytes */
} hfig;

typedef struct {
  rpc_service *svc;
  volatile int stop, port;
  pthread_t th;
} hserver;

static void on_port(int port, void *ctx) { ((hserver *)ctx)->port = port; }

static void *server_main(void *arg) {
  hserver *h = arg;
  char err[512];
  rpc_server_opts o = {.listen = "127.0.0.1:0", .threads = 1, .max_message_bytes = 256 << 20,
                       .stop = &h->stop, .shutdown_grace_s = 1};
  if (rpc_server_run(h->svc, &o, on_port, h, err, sizeof err)) {
    fprintf(stderr, "shardrec %s: server: %s\n", CMD, err);
    h->port = -1;
  }
  return NULL;
}

/* Every row of table 0 pushed once, in batches (step from 1), into st. */
static int push_all(emb_store *st, const hopts *o, int64_t *step, double *secs) {
  uint64_t *ids = malloc((size_t)o->batch * sizeof *ids);
  float *g = malloc((size_t)(o->batch * o->dim) * sizeof *g);
  int rc = ids && g ? 0 : SR_ENOMEM;
  for (long long i = 0; !rc && i < o->batch * o->dim; i++) g[i] = (float)(i % 97) / 97.0f - 0.5f;
  double t0 = sr_now();
  for (long long at = 0; !rc && at < o->rows; at += o->batch) {
    size_t n = (size_t)(o->rows - at < o->batch ? o->rows - at : o->batch);
    for (size_t i = 0; i < n; i++) ids[i] = (uint64_t)at + i;
    const uint64_t *ip[1] = {ids};
    const float *gp[1] = {g};
    emb_idset set = {1, ip, &n};
    rc = emb_store_push(st, (*step)++, 0.1f, &set, gp);
  }
  *secs = sr_now() - t0;
  free(ids);
  free(g);
  return rc;
}

/* o->iters lookups of o->batch random ids: rows/s (0 on failure). A
 * 16-bit table's rows come as they are where the store can hand them so
 * (emb_store_lookup_begin_rows16), as the trainer takes them for pooling. */
static double lookups(emb_store *st, const hopts *o, emb_precision prec, int64_t step) {
  const int rows16 = prec != EMB_PREC_FP32 && emb_store_has_rows16(st);
  uint64_t *ids = malloc((size_t)o->batch * sizeof *ids);
  float *out = malloc((size_t)(o->batch * o->dim) * sizeof *out);
  sr_rng r;
  sr_rng_init(&r, 5, 1);
  int rc = ids && out ? 0 : SR_ENOMEM;
  double t0 = sr_now();
  for (long long k = 0; !rc && k < o->iters; k++) {
    /* Distinct ids, as a trainer sends: a random start, a prime stride
     * (1000003, which divides no --rows this bench takes but its
     * multiples), so no two of the batch are one row. */
    size_t u = (size_t)o->batch;
    const uint64_t start = sr_rng_below(&r, (uint64_t)o->rows);
    for (size_t i = 0; i < u; i++) ids[i] = (start + i * 1000003ULL) % (uint64_t)o->rows;
    const uint64_t *ip[1] = {ids};
    float *op[1] = {out};
    emb_idset set = {1, ip, &u};
    rc = rows16 ? emb_store_lookup_begin_rows16(st, step + k, &set, (void *const *)op)
                : emb_store_lookup_begin(st, step + k, &set, op);
    if (!rc) rc = emb_store_lookup_wait(st);
  }
  double dt = sr_now() - t0;
  if (rc) fprintf(stderr, "shardrec %s: lookup: %s\n", CMD, emb_store_errmsg(st));
  free(ids);
  free(out);
  return rc ? 0 : (double)(o->iters * o->batch) / dt;
}

/* One precision's stores, alive together so the lookup figures can take
 * turns: the in-process store, a server over it and a remote store reading
 * it, the shard store in a temporary folder. */
typedef struct {
  emb_plan *plan;
  emb_store *loc, *rem, *sh;
  hserver h;
  int serving;
  char dir[40];
  int64_t step; /* the next step after the pushes */
} hset;

static void hset_close(hset *s) {
  emb_store_destroy(s->rem);
  if (s->serving) {
    s->h.stop = 1;
    pthread_join(s->h.th, NULL);
  }
  rpc_service_destroy(s->h.svc);
  emb_store_destroy(s->sh);
  if (s->dir[0]) sr_rmtree(s->dir);
  emb_store_destroy(s->loc);
  emb_plan_free(s->plan);
  memset(s, 0, sizeof *s);
}

/* The stores of prec, every row pushed once into the in-process and the
 * shard store; the byte figures and push rate into f. 0 or 1 (printed). */
static int hset_open(const hopts *o, emb_precision prec, hset *s, hfig *f) {
  char err[1024] = "";
  uint64_t rows1[1] = {(uint64_t)o->rows};
  emb_plan_params pp = {.n_tables = 1, .rows = rows1, .dim = (int)o->dim,
                        .optim = {.kind = EMB_OPT_ROWWISE_ADAGRAD, .eps = -1}, .seed = 1,
                        .n_shards = 1, .precision = prec};
  memset(s, 0, sizeof *s);
  if (emb_plan_create(&pp, &s->plan, err, sizeof err)) goto fail;
  const int wb = emb_precision_bytes(prec);
  f->kv_row = (double)kv_row_size_w((int)o->dim, 1, (int)prec);
  f->file_row = 8.0 + (double)(wb * o->dim) + 4;
  f->wire_row = (double)(wb * o->dim);
  int64_t step = 1;
  double secs;
  emb_store_stats st;
  if (!(s->loc = emb_store_create_local(s->plan, err, sizeof err))) goto fail;
  if (push_all(s->loc, o, &step, &secs) || emb_store_stats_get(s->loc, &st)) goto fail;
  s->step = step;
  f->push = (double)o->rows / secs;
  f->mem_row = (double)st.bytes / (double)st.rows;
  int shard = 0;
  rpc_service_opts so = {.shards = &shard, .n_shards = 1};
  if (!(s->h.svc = rpc_service_create(s->plan, s->loc, &so, err, sizeof err))) goto fail;
  pthread_create(&s->h.th, NULL, server_main, &s->h);
  s->serving = 1;
  while (!s->h.port) usleep(1000);
  if (s->h.port < 0) goto fail;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", s->h.port);
  const char *addrs[1] = {addr};
  if (!(s->rem = emb_store_create_remote(s->plan, addrs, 1, NULL, err, sizeof err))) goto fail;
  snprintf(s->dir, sizeof s->dir, "/tmp/shardrec-bench-half-XXXXXX");
  if (!mkdtemp(s->dir)) {
    s->dir[0] = 0;
    snprintf(err, sizeof err, "cannot make a temporary folder");
    goto fail;
  }
  emb_shard_config cfg = {.cache_mb = (uint64_t)o->cache_mb};
  emb_store_figures fg;
  step = 1;
  if (!(s->sh = emb_store_create_shard(s->plan, s->dir, &cfg, err, sizeof err))) goto fail;
  if (push_all(s->sh, o, &step, &secs) || emb_store_flush(s->sh)) goto fail;
  if (!emb_store_figures_get(s->sh, &fg)) f->sst = (double)fg.sst_bytes;
  return 0;
fail:
  fprintf(stderr, "shardrec %s: %s: %s\n", CMD, emb_precision_name(prec),
          err[0] ? err : s->loc ? emb_store_errmsg(s->loc) : "failed");
  hset_close(s);
  return 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: shardrec bench half [--rows N] [--dim D] [--batch N] [--iters N] [--cache-mb N]\n"
          "                          [--rounds N]\n"
          "\n"
          "fp32, fp16 and bf16 weights side by side (row-wise Adagrad, one table): bytes a row\n"
          "and rows per GiB (memory, RocksDB, table files), in-process pushes and lookups,\n"
          "Lookups from one gRPC server, the RocksDB shard store under a fixed cache.\n"
          "  --rows N       table rows (200000)\n"
          "  --dim D        embedding dim (128)\n"
          "  --batch N      ids a lookup (4096)\n"
          "  --iters N      lookups a figure (50)\n"
          "  --cache-mb N   the shard store's cache (32; smaller than the table reads misses)\n"
          "  --rounds N     lookup rounds (5): each round times every precision in turn; the\n"
          "                 lookup figures are the rounds' medians\n");
}

int bench_half(int argc, char **argv) {
  hopts o = {200000, 128, 4096, 50, 32, 5};
  static const struct option opts[] = {{"rows", required_argument, 0, 'r'},
                                       {"dim", required_argument, 0, 'd'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"iters", required_argument, 0, 'i'},
                                       {"cache-mb", required_argument, 0, 'c'},
                                       {"rounds", required_argument, 0, 'n'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'h': usage(stdout); return 0;
      case 'r': if (cli_int(CMD, "--rows", optarg, 1024, 1LL << 31, &o.rows)) return 2;
        if (o.rows % 1000003 == 0) o.rows++; /* the lookups' stride must not divide it */
        break;
      case 'd': if (cli_int(CMD, "--dim", optarg, 1, EMB_MAX_DIM, &o.dim)) return 2; break;
      case 'b': if (cli_int(CMD, "--batch", optarg, 1, 1 << 20, &o.batch)) return 2; break;
      case 'i': if (cli_int(CMD, "--iters", optarg, 1, 1 << 20, &o.iters)) return 2; break;
      case 'c': if (cli_int(CMD, "--cache-mb", optarg, 1, 1 << 20, &o.cache_mb)) return 2; break;
      case 'n': if (cli_int(CMD, "--rounds", optarg, 1, MAX_ROUNDS, &o.rounds)) return 2; break;
      default: cli_bad_option(CMD, optopt, argv[optind - 1]); return 2;
    }
  }
  if (o.batch > o.rows) o.batch = o.rows;
  rpc_global_init();
  hfig f[3];
  memset(f, 0, sizeof f);
  printf("bench half: %lld rows of dim %lld, row-wise Adagrad; lookups of %lld ids x %lld, "
         "median of %lld rounds; shard store cache %lld MiB\n", o.rows, o.dim, o.batch, o.iters,
         o.rounds, o.cache_mb);
  hset set[3];
  int rc = 0, open = 0; /* set[0 .. open) are open */
  while (open < 3 && !(rc = hset_open(&o, (emb_precision)open, &set[open], &f[open]))) open++;
  /* Round k times fp32, fp16, bf16 in turn, each round starting from the
   * next precision, so drift in the machine's speed falls on all three. */
  double lk[3][3][MAX_ROUNDS]; /* [figure][precision][round] */
  for (int k = 0; k < o.rounds && !rc; k++)
    for (int j = 0; j < 3 && !rc; j++) {
      const int p = (k + j) % 3;
      lk[0][p][k] = lookups(set[p].loc, &o, (emb_precision)p, set[p].step);
      lk[1][p][k] = lookups(set[p].rem, &o, (emb_precision)p, set[p].step);
      lk[2][p][k] = lookups(set[p].sh, &o, (emb_precision)p, set[p].step);
      if (lk[0][p][k] <= 0 || lk[1][p][k] <= 0 || lk[2][p][k] <= 0) rc = 1;
    }
  for (int p = 0; !rc && p < 3; p++) {
    f[p].lookup = sr_median(lk[0][p], (int)o.rounds);
    f[p].rpc = sr_median(lk[1][p], (int)o.rounds);
    f[p].shard = sr_median(lk[2][p], (int)o.rounds);
  }
  for (int p = 0; p < open; p++) hset_close(&set[p]);
  rpc_global_shutdown();
  if (rc) return 1;
  printf("%-34s %14s %14s %14s\n", "", "fp32", "fp16", "bf16");
#define ROW(name, field, fmt)                                                               \
  printf("%-34s " fmt " " fmt " (%.2fx) " fmt " (%.2fx)\n", name, f[0].field, f[1].field, \
         f[0].field > 0 ? f[1].field / f[0].field : 0, f[2].field,                          \
         f[0].field > 0 ? f[2].field / f[0].field : 0)
  ROW("memory bytes a row", mem_row, "%14.1f");
  ROW("RocksDB row bytes", kv_row, "%14.1f");
  ROW("table file record bytes", file_row, "%14.1f");
  ROW("Lookup answer bytes a row", wire_row, "%14.1f");
  for (int p = 0; p < 3; p++) f[p].mem_row = f[p].mem_row > 0 ? (double)(1 << 30) / f[p].mem_row : 0;
  ROW("rows per GiB in memory", mem_row, "%14.0f");
  ROW("in-process push rows/s", push, "%14.0f");
  ROW("in-process lookup rows/s", lookup, "%14.0f");
  ROW("gRPC Lookup rows/s (1 server)", rpc, "%14.0f");
  ROW("shard store lookup rows/s", shard, "%14.0f");
  ROW("shard store SST bytes", sst, "%14.0f");
#undef ROW
  return 0;
}
