/* shardrec serve: one embedding shard server (gRPC, rpc/shardrec.proto).
 *
 * Hosts the rows of the given shards of a plan in memory (or in RocksDB with
 * --data-dir) and serves Lookup, Push, Checkpoint, Restore, Stats and
 * grpc.health.v1 Check. With --checkpoint the plan and the rows come from a
 * trainer's checkpoint, which is only read: several servers of one
 * checkpoint run side by side. The plan and the store are
 * embedding/served.h's (emb_served_open); this file parses the flags, opens
 * them, and runs the RPC service over them.
 * Prints "listening on HOST:PORT" once bound (port 0 picks one). SIGTERM or
 * SIGINT: stop accepting, let in-flight calls finish, flush, exit 0. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/served.h"
#include "embedding/shard.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/serve_watch.h"

#define CMD "serve"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec serve --plan PLAN.json --shard K[,K...] [options]\n"
"       shardrec serve --checkpoint CKPT --shard K[,K...] [--read-only] [options]\n"
"\n"
"  --plan PLAN.json        the sharding plan (the fingerprint every call must carry); with\n"
"                          --checkpoint optional, and then it must be the checkpoint's plan\n"
"  --shard K[,K...]        shards of the plan served here\n"
"  --listen HOST:PORT      address (127.0.0.1:0; port 0 picks a free port)\n"
"  --data-dir DIR          keep rows in RocksDB under DIR/shard-K with a bounded cache\n"
"                          (default: every row in memory)\n"
"  --cache-rows N, --cache-mb N   the cache's size with --data-dir or a RocksDB checkpoint\n"
"                          (default 256 MiB)\n"
"  --checkpoint CKPT       serve a trainer's checkpoint: CKPT is a step-N folder or a\n"
"                          folder of them (the newest complete one is taken). It is\n"
"                          verified (every file's size and SHA-256) and only read: its\n"
"                          plan is served; RocksDB shards are copied (SST files linked)\n"
"                          into --data-dir or a temporary folder removed at exit;\n"
"                          in-memory table files are loaded. Several servers of one\n"
"                          checkpoint (other shards, or the same) may run side by side\n"
"  --restore PATH          start from the shard folders written by Checkpoint(PATH)\n"
"  --read-only             refuse Push (FAILED_PRECONDITION): serving for inference\n"
"  --pending-timeout S     drop a multi-rank job's held step (pushes not yet summed, held\n"
"                          lookups answered ABORTED) when it makes no progress for S\n"
"                          seconds (300); a dead rank is normally heard at once\n"
"  --threads N             worker threads, one completion queue each (2)\n"
"  --max-message-mb N      largest request or answer (64)\n"
"  --max-ids N             most ids in one Lookup or Push (4194304)\n"
"  --tls-cert F --tls-key F   serve TLS with this certificate and key (PEM)\n"
"  --tls-client-ca F       require client certificates signed by this CA (mTLS)\n"
"  --metrics-listen HOST:PORT   serve Prometheus figures on http://HOST:PORT/metrics\n"
"                          (off unless given; HOST empty: 127.0.0.1)\n"
"  --log-format text|json  json: one JSON object per line per event (start, stop,\n"
"                          refused call, restore, dropped job) (text)\n");
}

enum { O_PLAN = 1000, O_SHARD, O_LISTEN, O_DATA, O_RESTORE, O_CKPT, O_RO, O_THREADS, O_MAXMSG,
       O_MAXIDS, O_CERT, O_KEY, O_CA, O_CROWS, O_CMB, O_HELP, O_PENDING, O_METRICS, O_LOGFMT };

static const struct option long_opts[] = {
    {"plan", required_argument, 0, O_PLAN},        {"shard", required_argument, 0, O_SHARD},
    {"listen", required_argument, 0, O_LISTEN},    {"data-dir", required_argument, 0, O_DATA},
    {"restore", required_argument, 0, O_RESTORE},  {"read-only", no_argument, 0, O_RO},
    {"checkpoint", required_argument, 0, O_CKPT},
    {"threads", required_argument, 0, O_THREADS},  {"max-message-mb", required_argument, 0, O_MAXMSG},
    {"max-ids", required_argument, 0, O_MAXIDS},   {"tls-cert", required_argument, 0, O_CERT},
    {"tls-key", required_argument, 0, O_KEY},      {"tls-client-ca", required_argument, 0, O_CA},
    {"cache-rows", required_argument, 0, O_CROWS}, {"cache-mb", required_argument, 0, O_CMB},
    {"pending-timeout", required_argument, 0, O_PENDING},
    {"metrics-listen", required_argument, 0, O_METRICS}, {"log-format", required_argument, 0, O_LOGFMT},
    {"help", no_argument, 0, O_HELP},              {0, 0, 0, 0}};

static volatile int g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

typedef struct {
  const char *listen;
  const serve_watch *watch;
} listen_ctx;

static void on_listening(int port, void *ctx) {
  const char *addr = ((listen_ctx *)ctx)->listen;
  const char *colon = strrchr(addr, ':');
  int hostlen = colon ? (int)(colon - addr) : (int)strlen(addr);
  serve_watch_listening(((listen_ctx *)ctx)->watch, addr, hostlen, port);
}

/* The served shards "K[,K...]" into shards[max]; their count, or -1. */
static int parse_shards(const char *s, int *shards, int max) {
  int n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || (*end && *end != ',') || n == max) return -1;
    shards[n++] = (int)v;
    p = *end ? end + 1 : end;
  }
  return n;
}

typedef struct {
  emb_served_opts so;
  const char *shards_s, *listen;
  int shards[256], read_only;
  rpc_tls tls;
  double pending_timeout;
  long long threads, maxmsg, maxids;
  serve_watch watch;
} serve_flags;

/* Flags into *f; -1 when done (help), else 0, or 2 on bad usage (said). */
static int parse_flags(int argc, char **argv, serve_flags *f) {
  long long cache_rows = 0, cache_mb = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_PLAN: f->so.plan_path = optarg; break;
      case O_SHARD: f->shards_s = optarg; break;
      case O_LISTEN: f->listen = optarg; break;
      case O_DATA: f->so.data_dir = optarg; break;
      case O_RESTORE: f->so.restore = f->watch.restore = optarg; break;
      case O_CKPT: f->so.checkpoint = optarg; break;
      case O_RO: f->read_only = 1; break;
      case O_PENDING: if (cli_double(CMD, "--pending-timeout", optarg, 0.001, 1e9, &f->pending_timeout)) return 2; break;
      case O_THREADS: if (cli_int(CMD, "--threads", optarg, 1, 256, &f->threads)) return 2; break;
      case O_MAXMSG: if (cli_int(CMD, "--max-message-mb", optarg, 1, 2047, &f->maxmsg)) return 2; break;
      case O_MAXIDS: if (cli_int(CMD, "--max-ids", optarg, 1, 1LL << 30, &f->maxids)) return 2; break;
      case O_CERT: f->tls.cert = optarg; break;
      case O_KEY: f->tls.key = optarg; break;
      case O_CA: f->tls.ca = optarg; break;
      case O_METRICS: if (serve_watch_addr(&f->watch, optarg)) return 2; break;
      case O_LOGFMT: if (serve_watch_log_format(&f->watch, optarg)) return 2; break;
      case O_CROWS: if (cli_int(CMD, "--cache-rows", optarg, EMB_SHARD_MIN_CACHE_ROWS, 1LL << 40, &cache_rows)) return 2; break;
      case O_CMB: if (cli_int(CMD, "--cache-mb", optarg, 1, 1LL << 30, &cache_mb)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return -1;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  f->so.cache_rows = (uint64_t)cache_rows;
  f->so.cache_mb = (uint64_t)cache_mb;
  if (optind < argc) {
    fprintf(stderr, "shardrec serve: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!f->shards_s || (!f->so.plan_path && !f->so.checkpoint)) {
    fprintf(stderr, "shardrec serve: --shard and one of --plan, --checkpoint are required\n");
    return 2;
  }
  if (f->so.checkpoint && f->so.restore) {
    fprintf(stderr, "shardrec serve: give --checkpoint or --restore, not both\n");
    return 2;
  }
  if ((f->tls.cert || f->tls.key || f->tls.ca) && !(f->tls.cert && f->tls.key)) {
    fprintf(stderr, "shardrec serve: TLS needs both --tls-cert and --tls-key\n");
    return 2;
  }
  f->so.n_shards = parse_shards(f->shards_s, f->shards, 256);
  f->so.shards = f->shards;
  if (f->so.n_shards < 0) {
    fprintf(stderr, "shardrec serve: --shard: '%s' is not a list of shard numbers like 0,2\n",
            f->shards_s);
    return 2;
  }
  if (f->so.n_shards == 0) {
    fprintf(stderr, "shardrec serve: --shard: empty list\n");
    return 2;
  }
  return 0;
}

int cmd_serve(int argc, char **argv) {
  serve_flags f = {.listen = "127.0.0.1:0", .pending_timeout = 300, .threads = 2, .maxmsg = 64,
                   .maxids = 1 << 22};
  int rc = parse_flags(argc, argv, &f);
  if (rc) return rc < 0 ? 0 : rc;
  char err[1024];
  emb_served sv;
  if (emb_served_open(&f.so, &sv, err, sizeof err)) {
    static const char *const flag[] = {"", "--plan ", "--checkpoint: ", "--shard ", "--restore "};
    fprintf(stderr, "shardrec serve: %s%s\n", flag[sv.failed], err);
    return 1;
  }
  if (f.so.checkpoint) {
    printf("checkpoint %s: step %lld, plan %.12s, %d shard(s); serving shard(s) %s%s; rows %s\n",
           sv.ckpt_dir, (long long)sv.step, sv.plan_fp, sv.plan->n_shards, f.shards_s,
           f.read_only ? " read-only" : "", sv.layout);
    if (!f.read_only && sv.temporary)
      printf("note: without --read-only, pushes change a temporary copy of the rows that is "
             "removed at exit (give --data-dir to keep them)\n");
    fflush(stdout);
  }
  int status = 1;
  rpc_service_opts so = {.shards = f.shards, .n_shards = f.so.n_shards, .read_only = f.read_only,
                         .max_ids = (size_t)f.maxids, .pending_timeout_s = f.pending_timeout};
  rpc_service *svc = NULL;
  if (serve_watch_prepare(&f.watch, &so, err, sizeof err) ||
      !(svc = rpc_service_create(sv.plan, sv.store, &so, err, sizeof err)) ||
      serve_watch_start(&f.watch, svc, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  listen_ctx lc = {f.listen, &f.watch};
  rpc_server_opts o = {.listen = f.listen, .threads = (int)f.threads,
                       .max_message_bytes = (int)(f.maxmsg << 20),
                       .tls = f.tls.cert ? &f.tls : NULL, .stop = &g_stop, .shutdown_grace_s = 5};
  if (rpc_server_run(svc, &o, on_listening, &lc, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  status = 0;
done:
  serve_watch_close(&f.watch, status == 0);
  rpc_service_destroy(svc);
  emb_served_close(&sv);
  return status;
}
