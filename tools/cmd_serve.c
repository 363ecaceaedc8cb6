/* shardrec serve: one embedding shard server (gRPC, rpc/shardrec.proto).
 *
 * Hosts the rows of the given shards of a plan in memory (or in RocksDB with
 * --data-dir) and serves Lookup, Push, Checkpoint, Restore, Stats and
 * grpc.health.v1 Check. With --checkpoint the plan and the rows come from a
 * trainer's checkpoint (tools/ckpt_store.h), which is only read: several
 * servers of one checkpoint run side by side.
 * Prints "listening on HOST:PORT" once bound (port 0 picks one). SIGTERM or
 * SIGINT: stop accepting, let in-flight calls finish, flush, exit 0. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "tools/cli.h"
#include "tools/train/checkpoint.h"
#include "embedding/ckpt_store.h"
#include "tools/cmds.h"

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
"  --tls-client-ca F       require client certificates signed by this CA (mTLS)\n");
}

enum { O_PLAN = 1000, O_SHARD, O_LISTEN, O_DATA, O_RESTORE, O_CKPT, O_RO, O_THREADS, O_MAXMSG,
       O_MAXIDS, O_CERT, O_KEY, O_CA, O_CROWS, O_CMB, O_HELP, O_PENDING };

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
    {"help", no_argument, 0, O_HELP},              {0, 0, 0, 0}};

static volatile int g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

typedef struct {
  const char *listen;
} listen_ctx;

static void on_listening(int port, void *ctx) {
  const char *addr = ((listen_ctx *)ctx)->listen;
  const char *colon = strrchr(addr, ':');
  int hostlen = colon ? (int)(colon - addr) : (int)strlen(addr);
  printf("listening on %.*s:%d\n", hostlen, addr, port);
  fflush(stdout);
}

int cmd_serve(int argc, char **argv) {
  const char *plan_path = NULL, *shards_s = NULL, *listen = "127.0.0.1:0", *data_dir = NULL,
             *restore = NULL, *checkpoint = NULL;
  rpc_tls tls = {0};
  int read_only = 0;
  double pending_timeout = 300;
  long long threads = 2, maxmsg = 64, maxids = 1 << 22, cache_rows = 0, cache_mb = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_PLAN: plan_path = optarg; break;
      case O_SHARD: shards_s = optarg; break;
      case O_LISTEN: listen = optarg; break;
      case O_DATA: data_dir = optarg; break;
      case O_RESTORE: restore = optarg; break;
      case O_CKPT: checkpoint = optarg; break;
      case O_RO: read_only = 1; break;
      case O_PENDING: if (cli_double(CMD, "--pending-timeout", optarg, 0.001, 1e9, &pending_timeout)) return 2; break;
      case O_THREADS: if (cli_int(CMD, "--threads", optarg, 1, 256, &threads)) return 2; break;
      case O_MAXMSG: if (cli_int(CMD, "--max-message-mb", optarg, 1, 2047, &maxmsg)) return 2; break;
      case O_MAXIDS: if (cli_int(CMD, "--max-ids", optarg, 1, 1LL << 30, &maxids)) return 2; break;
      case O_CERT: tls.cert = optarg; break;
      case O_KEY: tls.key = optarg; break;
      case O_CA: tls.ca = optarg; break;
      case O_CROWS: if (cli_int(CMD, "--cache-rows", optarg, EMB_SHARD_MIN_CACHE_ROWS, 1LL << 40, &cache_rows)) return 2; break;
      case O_CMB: if (cli_int(CMD, "--cache-mb", optarg, 1, 1LL << 30, &cache_mb)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec serve: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!shards_s || (!plan_path && !checkpoint)) {
    fprintf(stderr, "shardrec serve: --shard and one of --plan, --checkpoint are required\n");
    return 2;
  }
  if (checkpoint && restore) {
    fprintf(stderr, "shardrec serve: give --checkpoint or --restore, not both\n");
    return 2;
  }
  if ((tls.cert || tls.key || tls.ca) && !(tls.cert && tls.key)) {
    fprintf(stderr, "shardrec serve: TLS needs both --tls-cert and --tls-key\n");
    return 2;
  }
  int shards[256], n_shards = 0;
  {
    n_shards = 0;
    const char *p = shards_s;
    while (*p) {
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p || v < 0 || (*end && *end != ',') || n_shards == 256) {
        fprintf(stderr, "shardrec serve: --shard: '%s' is not a list of shard numbers like 0,2\n",
                shards_s);
        return 2;
      }
      shards[n_shards++] = (int)v;
      p = *end ? end + 1 : end;
    }
    if (n_shards == 0) {
      fprintf(stderr, "shardrec serve: --shard: empty list\n");
      return 2;
    }
  }
  char err[1024];
  emb_plan *plan = NULL;
  int status = 1;
  rpc_service *svc = NULL;
  emb_store *store = NULL;
  ckpt_store cs = {0};
  ckpt_info ci = {0};
  if (plan_path && emb_plan_load(plan_path, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    return 1;
  }
  if (checkpoint) {
    /* The checkpoint names its own plan; a --plan given too must be it. */
    char step_dir[4096];
    if (ckpt_resolve(checkpoint, step_dir, sizeof step_dir, err, sizeof err) ||
        ckpt_open(step_dir, &ci, err, sizeof err)) {
      fprintf(stderr, "shardrec serve: --checkpoint: %s\n", err);
      goto done;
    }
    if (plan) {
      char want[EMB_FP_HEX], have[EMB_FP_HEX];
      emb_plan_fingerprint(ci.plan, want);
      emb_plan_fingerprint(plan, have);
      if (strcmp(want, have)) {
        fprintf(stderr, "shardrec serve: --plan %s has plan fingerprint %.12s..., the checkpoint "
                "%s was written under %.12s... (serve it without --plan, or reshard it to this "
                "plan first)\n", plan_path, have, step_dir, want);
        goto done;
      }
      emb_plan_free(plan);
    }
    plan = ci.plan;
    ci.plan = NULL;
    for (int i = 0; i < n_shards; i++)
      if (shards[i] >= plan->n_shards) {
        fprintf(stderr, "shardrec serve: --shard %d: the checkpoint's plan has shards 0..%d\n",
                shards[i], plan->n_shards - 1);
        goto done;
      }
    ckpt_store_opts co = {.shards = shards, .n_shards = n_shards, .data_dir = data_dir,
                          .cache_rows = (uint64_t)cache_rows, .cache_mb = (uint64_t)cache_mb};
    if (ckpt_store_open(step_dir, plan, &co, &cs, err, sizeof err)) {
      fprintf(stderr, "shardrec serve: --checkpoint: %s\n", err);
      goto done;
    }
    store = cs.store;
    char fp[EMB_FP_HEX];
    emb_plan_fingerprint(plan, fp);
    printf("checkpoint %s: step %lld, plan %.12s, %d shard(s); serving shard(s) %s%s; rows %s\n",
           step_dir, (long long)ci.st.step, fp, plan->n_shards, shards_s,
           read_only ? " read-only" : "", cs.layout);
    if (!read_only && cs.tmp_dir)
      printf("note: without --read-only, pushes change a temporary copy of the rows that is "
             "removed at exit (give --data-dir to keep them)\n");
    fflush(stdout);
  } else if (data_dir) {
    emb_shard_config sc = {.cache_rows = (uint64_t)cache_rows,
                           .cache_mb = cache_rows ? 0 : (uint64_t)(cache_mb ? cache_mb : 256),
                           .n_hosted = n_shards, .hosted = shards};
    store = emb_store_create_shard(plan, data_dir, &sc, err, sizeof err);
  } else {
    store = emb_store_create_local(plan, err, sizeof err);
  }
  if (!store) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  rpc_service_opts so = {.shards = shards, .n_shards = n_shards, .read_only = read_only,
                         .max_ids = (size_t)maxids, .pending_timeout_s = pending_timeout,
                         .store_shard_dirs = checkpoint ? cs.rocks : data_dir != NULL};
  svc = rpc_service_create(plan, store, &so, err, sizeof err);
  if (!svc) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  if (restore) {
    char dir[4096];
    int at = snprintf(dir, sizeof dir, "%s", restore);
    if (!data_dir) {
      at += snprintf(dir + at, sizeof dir - (size_t)at, "/shard");
      for (int i = 0; i < n_shards; i++) at += snprintf(dir + at, sizeof dir - (size_t)at, "-%d", shards[i]);
    }
    if (emb_store_restore(store, dir)) {
      fprintf(stderr, "shardrec serve: --restore %s: %s\n", dir, emb_store_errmsg(store));
      goto done;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  listen_ctx lc = {listen};
  rpc_server_opts o = {.listen = listen, .threads = (int)threads,
                       .max_message_bytes = (int)(maxmsg << 20),
                       .tls = tls.cert ? &tls : NULL, .stop = &g_stop, .shutdown_grace_s = 5};
  if (rpc_server_run(svc, &o, on_listening, &lc, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  printf("stopped\n");
  status = 0;
done:
  rpc_service_destroy(svc);
  if (cs.store) ckpt_store_close(&cs); /* also removes its temporary folder */
  else emb_store_destroy(store);
  ckpt_info_free(&ci);
  emb_plan_free(plan);
  return status;
}
