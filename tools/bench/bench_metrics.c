/* shardrec bench metrics: what the Prometheus figures cost.
 *
 * Per training step: train_metrics_note, the update train --metrics-listen
 * makes after every step (9 phase gauges and counters, bytes, samples,
 * step, epoch). Per RPC: rpc_service_metrics_observe (calls, bytes, latency
 * histogram). Both beside the baseline measured here: the server-side
 * handling of one Lookup of 26 tables x 64 ids (rpc_service_handle on the
 * shard store, warm cache), the least a step of the trainer waits for. A scrape: the whole
 * /metrics page of a server of a 26-table plan over RocksDB (the collector
 * reads Stats, the cache and the RocksDB figures of 26 column families),
 * written in process (metrics_registry_write) and fetched over HTTP on
 * loopback. Medians of 7 runs. */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/shard.h"
#include "metrics/metrics.h"
#include "rpc/service.h"
#include "rpc/service_metrics.h"
#include "rpc/shardrec.pb-c.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "train/train_metrics.h"

#define CMD "bench metrics"
#define RUNS 7

/* ns per call of train_metrics_note, median of RUNS runs of n calls. */
static double per_step_ns(long long n) {
  char err[256];
  train_metrics *m = train_metrics_open(0, err, sizeof err);
  if (!m) return -1;
  trainer_times tt = {0};
  double r[RUNS];
  for (int k = 0; k < RUNS; k++) {
    double t0 = sr_now();
    for (long long i = 0; i < n; i++) {
      tt.forward += 1e-3, tt.rows += 4096, tt.steps++;
      train_metrics_note(m, &tt, 16, i, 0, n, 128);
    }
    r[k] = 1e9 * (sr_now() - t0) / (double)n;
  }
  train_metrics_close(m);
  return sr_median(r, RUNS);
}

/* A shard server's parts: a 26-table plan over RocksDB in dir. */
typedef struct {
  emb_plan *plan;
  emb_store *store;
  rpc_service *svc;
  metrics_registry *reg;
  rpc_service_metrics *sm;
  uint8_t *lookup; /* a packed LookupRequest of 26 x 64 ids */
  size_t lookup_len;
} server;

static int server_open(server *s, const char *dir, char *err, size_t errlen) {
  uint64_t rows[26];
  for (int t = 0; t < 26; t++) rows[t] = 100000;
  emb_plan_params pp = {.n_tables = 26, .rows = rows, .dim = 16, .seed = 1, .n_shards = 1,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}};
  if (emb_plan_create(&pp, &s->plan, err, errlen)) return -1;
  emb_shard_config cfg = {.cache_rows = 20000};
  if (!(s->store = emb_store_create_shard(s->plan, dir, &cfg, err, errlen))) return -1;
  if (!(s->reg = metrics_registry_create()) || metrics_process_add(s->reg, err, errlen) ||
      !(s->sm = rpc_service_metrics_add(s->reg, err, errlen)))
    return -1;
  int shard = 0;
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .observe = rpc_service_metrics_observe,
                        .observe_ctx = s->sm};
  if (!(s->svc = rpc_service_create(s->plan, s->store, &o, err, errlen))) return -1;
  if (rpc_service_metrics_attach(s->sm, s->svc)) return sr_fmt(err, errlen, "out of memory"), -1;
  char fp[EMB_FP_HEX];
  emb_plan_fingerprint(s->plan, fp);
  static uint64_t ids[64];
  Shardrec__V1__TableIds ti[26], *tp[26];
  for (int i = 0; i < 64; i++) ids[i] = (uint64_t)i * 1543;
  for (int t = 0; t < 26; t++) {
    shardrec__v1__table_ids__init(&ti[t]);
    ti[t].table_id = s->plan->tables[t].table_id;
    ti[t].ids = ids;
    ti[t].n_ids = 64;
    tp[t] = &ti[t];
  }
  Shardrec__V1__RequestHeader h = SHARDREC__V1__REQUEST_HEADER__INIT;
  h.plan_fingerprint = fp;
  h.job_id = "bench";
  h.world_size = 1;
  Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  q.header = &h;
  q.n_tables = 26;
  q.tables = tp;
  s->lookup_len = shardrec__v1__lookup_request__get_packed_size(&q);
  if (!(s->lookup = malloc(s->lookup_len))) return -1;
  shardrec__v1__lookup_request__pack(&q, s->lookup);
  return 0;
}

static void server_close(server *s) {
  rpc_service_destroy(s->svc);
  metrics_registry_destroy(s->reg);
  emb_store_destroy(s->store);
  emb_plan_free(s->plan);
  free(s->lookup);
}

/* Median us of one server-side Lookup (rpc_service_handle). */
static double lookup_us(server *s, int n) {
  double r[RUNS];
  for (int k = 0; k < RUNS; k++) {
    double t0 = sr_now();
    for (int i = 0; i < n; i++) {
      rpc_reply rep;
      rpc_service_handle(s->svc, RPC_LOOKUP, s->lookup, s->lookup_len, &rep);
      free(rep.out);
    }
    r[k] = 1e6 * (sr_now() - t0) / n;
  }
  return sr_median(r, RUNS);
}

/* Median ns of one rpc_service_metrics_observe. */
static double observe_ns(server *s, long long n) {
  double r[RUNS];
  for (int k = 0; k < RUNS; k++) {
    double t0 = sr_now();
    for (long long i = 0; i < n; i++)
      rpc_service_metrics_observe(s->sm, RPC_LOOKUP, RPC_OK, "", 1e-4 * (double)(i & 63), 2000, 7000);
    r[k] = 1e9 * (sr_now() - t0) / (double)n;
  }
  return sr_median(r, RUNS);
}

/* Median us of a scrape in process; *bytes the page's size. */
static double scrape_us(server *s, int n, size_t *bytes) {
  double r[RUNS];
  for (int k = 0; k < RUNS; k++) {
    double t0 = sr_now();
    for (int i = 0; i < n; i++) {
      char *page;
      if (metrics_registry_write(s->reg, &page, bytes)) return -1;
      free(page);
    }
    r[k] = 1e6 * (sr_now() - t0) / n;
  }
  return sr_median(r, RUNS);
}

/* Median us of GET /metrics over loopback (a new connection each). */
static double http_us(int port, int n) {
  double r[RUNS];
  char buf[1 << 16];
  for (int k = 0; k < RUNS; k++) {
    double t0 = sr_now();
    for (int i = 0; i < n; i++) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
      inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
      static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
      if (connect(fd, (struct sockaddr *)&sa, sizeof sa) ||
          write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return -1;
      }
      while (read(fd, buf, sizeof buf) > 0) {
      }
      close(fd);
    }
    r[k] = 1e6 * (sr_now() - t0) / n;
  }
  return sr_median(r, RUNS);
}

static int run(server *s, long long n) {
  double step = per_step_ns(n), obs = observe_ns(s, n);
  double lk = lookup_us(s, 200); /* rows come in from RocksDB the first time: after this, */
  lk = lookup_us(s, 200);        /* the lookups of a warm cache */
  size_t bytes = 0;
  double sc = scrape_us(s, 200, &bytes);
  char err[256];
  metrics_http *h = metrics_http_start(s->reg, "127.0.0.1:0", NULL, err, sizeof err);
  double hs = h ? http_us(metrics_http_port(h), 200) : -1;
  metrics_http_stop(h);
  if (step < 0 || sc < 0 || hs < 0) return fprintf(stderr, "shardrec bench metrics: %s\n", h ? "scrape failed" : err), 1;
  printf("metrics cost (medians of %d runs)\n", RUNS);
  printf("  per training step   train_metrics_note        %8.1f ns   (%.4f%% of the Lookup below)\n",
         step, 100.0 * step * 1e-3 / lk);
  printf("  per RPC             rpc_service_metrics_observe %6.1f ns   (a Lookup of 26 x 64 ids "
         "handled: %.1f us; %.4f%% of it)\n", obs, lk, 100.0 * obs * 1e-3 / lk);
  printf("  scrape, 26 tables   in process                %8.1f us   (%zu bytes)\n", sc, bytes);
  printf("                      GET /metrics on loopback  %8.1f us\n", hs);
  return 0;
}

int bench_metrics(int argc, char **argv) {
  long long n = 1000000;
  static const struct option opts[] = {{"updates", required_argument, 0, 'n'},
                                       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'n': if (cli_int(CMD, "--updates", optarg, 1000, 1LL << 32, &n)) return 2; break;
      case 'h':
        printf("usage: shardrec bench metrics [--updates N]\n\nThe cost of the Prometheus "
               "figures: per training step, per RPC (N updates each, 1000000), and one\n"
               "scrape of a server of 26 tables over RocksDB, in process and over HTTP.\n");
        return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  char dir[] = "/tmp/shardrec-bench-metrics-XXXXXX", err[1024];
  if (!mkdtemp(dir)) return fprintf(stderr, "shardrec bench metrics: cannot make %s\n", dir), 1;
  server s = {0};
  int rc = 1;
  if (server_open(&s, dir, err, sizeof err)) fprintf(stderr, "shardrec bench metrics: %s\n", err);
  else rc = run(&s, n);
  server_close(&s);
  sr_rmtree(dir);
  return rc;
}
