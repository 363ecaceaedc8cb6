/* shardrec serve: one embedding shard server (gRPC, rpc/shardrec.proto).
 *
 * Hosts the rows of the given shards of a plan in memory (or in RocksDB with
 * --data-dir) and serves Lookup, Push, Checkpoint, Restore, Stats, Watch,
 * GetTransform and grpc.health.v1 Check. With --checkpoint the plan and the
 * rows come from a trainer's checkpoint, which is only read: several
 * servers of one checkpoint run side by side; the checkpoint's data
 * transform (transform.bin), when it records one, is served by
 * GetTransform. The plan and the store are
 * embedding/served.h's (emb_served_open); this file parses the flags, opens
 * them, and runs the RPC service over them.
 * Prints what is open to whom ("access: ..."), then "listening on
 * HOST:PORT" once bound (port 0 picks one). Without client certificates it
 * listens only on loopback unless --insecure. SIGTERM or SIGINT: stop
 * accepting, let in-flight calls finish, flush, exit 0. SIGHUP: read the
 * TLS files again for new connections. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "datasets/transform.h"
#include "embedding/served.h"
#include "embedding/shard.h"
#include "storage/ckpt_dir.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/serve_follow.h"
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
"                          (1024..2^31-1 rows / 1..2^20 MiB; default 256 MiB)\n"
"  --checkpoint CKPT       serve a trainer's checkpoint: CKPT is a step-N folder or a\n"
"                          folder of them (the newest complete one is taken). It is\n"
"                          verified (every file's size and SHA-256) and only read: its\n"
"                          plan is served; RocksDB shards are copied (SST files linked)\n"
"                          into --data-dir or a temporary folder removed at exit;\n"
"                          in-memory table files are loaded. Several servers of one\n"
"                          checkpoint (other shards, or the same) may run side by side.\n"
"                          The data transform it records (ids and dense features of a\n"
"                          raw row) is served by GetTransform, its fingerprint in Stats\n"
"  --follow                with --checkpoint: watch the checkpoint's folder and swap to each\n"
"                          new complete checkpoint (full or incremental) once it is verified\n"
"                          and laid beside the served rows; no call is refused by a swap,\n"
"                          each Lookup answer names its step. A damaged or incomplete one,\n"
"                          or one of another plan or data transform, is refused (said in the\n"
"                          log, counted on /metrics) and the last good one served. Needs the\n"
"                          in-process trainer's table files; Push is refused (read-only),\n"
"                          and Restore\n"
"  --follow-every S        seconds between looks at the folder (0.1; 0.001..3600)\n"
"  --follow-grace S        a step stops being served at a swap but Lookups may still ask\n"
"                          for it (at_step) for S seconds after (10; 0..86400)\n"
"  --swap-at-step N        with --follow: serve no newer checkpoint until step N's is\n"
"                          complete, swap to it, then follow on (servers given the same N\n"
"                          swap to the same step); the admin call SwapAt says it later\n"
"  --restore PATH          start from the shard folders written by Checkpoint(PATH); for\n"
"                          an incremental checkpoint's (STEP/shards of a chain's link), the\n"
"                          chain's: its full checkpoint's rows, then each increment's\n"
"  --checkpoint-root DIR   Checkpoint and Restore calls may only name paths inside DIR\n"
"                          (after symlinks and '..'), and Checkpoint writes only new\n"
"                          folders; without it both are refused. A trainer that saves\n"
"                          checkpoints through these servers needs its --save-checkpoint\n"
"                          and --save-model folders inside DIR (shared storage)\n"
"  --read-only             refuse Push (FAILED_PRECONDITION): serving for inference\n"
"  --accept-unclean        with --data-dir: serve rows left by a crash as they are. Without\n"
"                          it, a --data-dir that holds rows but was not stopped cleanly\n"
"                          (SIGTERM/SIGINT) answers Lookup, Push and Checkpoint\n"
"                          FAILED_PRECONDITION until a Restore (a push may be torn);\n"
"                          a stop before that Restore leaves them so for the next start\n"
"  --pending-timeout S     drop a multi-rank job's held step (pushes not yet summed, held\n"
"                          lookups answered ABORTED) when it makes no progress for S\n"
"                          seconds (300); a dead rank is normally heard at once\n"
"  --stop-grace S          at a stop (SIGTERM, SIGINT) calls in flight get S seconds to\n"
"                          finish before they are cancelled (5; 0.01..3600); the store's\n"
"                          flush comes after, and a supervisor's wait before it kills must\n"
"                          cover both\n"
"  --threads N             worker threads, one completion queue each (2)\n"
"  --max-message-mb N      largest request or answer (64); a Lookup whose answer (ids x dim\n"
"                          x 4 bytes) would not fit is refused RESOURCE_EXHAUSTED up front\n"
"  --max-ids N             most ids in one Lookup or Push (default: what fits the message\n"
"                          limit at the plan's widest row, at most 4194304)\n"
"  --inflight-mb N         memory all calls in flight may hold together (4 x\n"
"                          --max-message-mb); past it a call or stream message waits up\n"
"                          to --inflight-wait, then is refused RESOURCE_EXHAUSTED. Clients\n"
"                          read the limits from Stats and split their calls to fit them\n"
"  --inflight-wait S       seconds a call waits for room in that memory (1)\n"
"  --tls-cert F --tls-key F   serve TLS with this certificate and key (PEM); SIGHUP\n"
"                          reads them (and the client CA) again for new connections\n"
"  --tls-client-ca F       require client certificates signed by this CA (mTLS); each\n"
"                          handshake refused is said in one line with its reason\n"
"  --allow-push NAME[,NAME]   with mTLS: only these clients (certificate CN or SAN DNS\n"
"                          name) may Push (and PushLookup, Remove; default: every\n"
"                          verified client)\n"
"  --allow-admin NAME[,NAME]  with mTLS: only these clients may Checkpoint, Restore and\n"
"                          SwapAt\n"
"  --insecure              listen on a non-loopback address without client certificates\n"
"                          (every method open to anyone who can connect)\n"
"  --metrics-listen HOST:PORT   serve Prometheus figures on http://HOST:PORT/metrics\n"
"                          (off unless given; HOST empty: 127.0.0.1)\n"
"  --log-format text|json  json: one JSON object per line per event (start, stop,\n"
"                          refused call, restore, dropped job, refused TLS handshake)\n"
"                          (text)\n");
}

enum { O_PLAN = 1000, O_SHARD, O_LISTEN, O_DATA, O_RESTORE, O_CKPT, O_RO, O_THREADS, O_MAXMSG,
       O_MAXIDS, O_CERT, O_KEY, O_CA, O_CROWS, O_CMB, O_HELP, O_PENDING, O_UNCLEAN,
       O_INFLIGHT, O_METRICS, O_LOGFMT, O_INWAIT, O_SGRACE };
enum { O_FOLLOW = 1200, O_FEVERY, O_FGRACE, O_SWAPAT }; /* serve --follow */
enum { O_CROOT = 1100, O_APUSH, O_AADMIN, O_INSECURE }; /* who may call what */

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
    {"stop-grace", required_argument, 0, O_SGRACE},
    {"checkpoint-root", required_argument, 0, O_CROOT},
    {"allow-push", required_argument, 0, O_APUSH}, {"allow-admin", required_argument, 0, O_AADMIN},
    {"insecure", no_argument, 0, O_INSECURE},
    {"accept-unclean", no_argument, 0, O_UNCLEAN},
    {"inflight-mb", required_argument, 0, O_INFLIGHT},
    {"inflight-wait", required_argument, 0, O_INWAIT},
    {"metrics-listen", required_argument, 0, O_METRICS}, {"log-format", required_argument, 0, O_LOGFMT},
    {"follow", no_argument, 0, O_FOLLOW},          {"follow-every", required_argument, 0, O_FEVERY},
    {"follow-grace", required_argument, 0, O_FGRACE},
    {"swap-at-step", required_argument, 0, O_SWAPAT},
    {"help", no_argument, 0, O_HELP},              {0, 0, 0, 0}};

static volatile int g_stop, g_reload;

static void on_signal(int sig) {
  if (sig == SIGHUP) g_reload = 1;
  else g_stop = 1;
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

/* The served shards "K[,K...]" into shards[max] (each a shard number of
 * some plan, 0 ... EMB_MAX_SHARDS - 1); their count, or -1 (printed). */
static int parse_shards(const char *s, int *shards, int max) {
  uint64_t v[256];
  int n;
  if (max > 256) max = 256;
  if (cli_u64_list(CMD, "--shard", s, ",", 0, EMB_MAX_SHARDS - 1, NULL, v, max, &n)) return -1;
  for (int i = 0; i < n; i++) shards[i] = (int)v[i];
  return n;
}

typedef struct {
  emb_served_opts so;
  const char *shards_s, *listen, *ckpt_root, *allow_push, *allow_admin;
  int shards[256], read_only, insecure, accept_unclean;
  rpc_tls tls;
  double pending_timeout, inflight_wait; /* inflight_wait 0: the service's default (1 s) */
  double stop_grace;                     /* 0: the server's default (5 s) */
  long long threads, maxmsg, maxids, inflight_mb;
  serve_watch watch;
  serve_follow follow;
} serve_flags;

/* 1 when the host of HOST:PORT is a loopback one (127.x, localhost, ::1). */
static int is_loopback(const char *listen) {
  const char *colon = strrchr(listen, ':');
  size_t n = colon ? (size_t)(colon - listen) : strlen(listen);
  if (n >= 2 && listen[0] == '[' && listen[n - 1] == ']') listen++, n -= 2;
  return (n >= 4 && !strncmp(listen, "127.", 4)) || (n == 9 && !strncmp(listen, "localhost", 9)) ||
         (n == 3 && !strncmp(listen, "::1", 3));
}

/* A "NAME[,NAME...]" list: 0 when every name is non-empty. */
static int names_ok(const char *flag, const char *list) {
  size_t n = strlen(list);
  if (n && list[0] != ',' && list[n - 1] != ',' && !strstr(list, ",,")) return 0;
  fprintf(stderr, "shardrec serve: %s '%s': a list of client names like trainer,ops\n", flag, list);
  return 1;
}

/* Who may call what: the allow lists need mTLS; without client
 * certificates only a loopback address, unless --insecure. 0, or 1 (said). */
static int check_access(const serve_flags *f) {
  int mtls = f->tls.cert && f->tls.ca;
  if ((f->allow_push || f->allow_admin) && !mtls) {
    fprintf(stderr, "shardrec serve: --allow-push and --allow-admin name client certificates: they "
            "need mTLS (--tls-cert, --tls-key and --tls-client-ca)\n");
    return 1;
  }
  if ((f->allow_push && names_ok("--allow-push", f->allow_push)) ||
      (f->allow_admin && names_ok("--allow-admin", f->allow_admin)))
    return 1;
  if (!mtls && !f->insecure && !is_loopback(f->listen)) {
    fprintf(stderr, "shardrec serve: --listen %s is not a loopback address, and without client "
            "certificates (--tls-client-ca) every method, Push and Checkpoint included, is open to "
            "anyone who can connect: use mTLS, or give --insecure\n", f->listen);
    return 1;
  }
  return 0;
}

/* The access line at start: what is open to whom. */
static void print_access(const serve_flags *f) {
  char line[1024];
  if (!f->tls.cert || !f->tls.ca) {
    snprintf(line, sizeof line, "no client certificates (%s): every method (Lookup, Push, "
             "Checkpoint, Restore, Stats, Health, Watch, GetTransform, SwapAt, Remove, PushLookup) "
             "is open to anyone who can connect to %s%s",
             f->tls.cert ? "server-only TLS" : "plaintext", f->listen,
             f->insecure && !is_loopback(f->listen) ? " (--insecure)" : "");
  } else if (!f->allow_push && !f->allow_admin) {
    snprintf(line, sizeof line, "mTLS: every method is open to every client with a certificate "
             "of %s (no --allow-push or --allow-admin)", f->tls.ca);
  } else {
    snprintf(line, sizeof line, "mTLS (client CA %s): Lookup, Stats, Health, Watch, "
             "GetTransform: every verified client; Push: %s (PushLookup and Remove too); Checkpoint, "
             "Restore, SwapAt: %s",
             f->tls.ca,
             f->allow_push ? f->allow_push : "every verified client",
             f->allow_admin ? f->allow_admin : "every verified client");
  }
  serve_watch_access(&f->watch, line);
}

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
      case O_CROOT: f->ckpt_root = optarg; break;
      case O_APUSH: f->allow_push = optarg; break;
      case O_AADMIN: f->allow_admin = optarg; break;
      case O_INSECURE: f->insecure = 1; break;
      case O_RO: f->read_only = 1; break;
      case O_UNCLEAN: f->accept_unclean = 1; break;
      case O_PENDING: if (cli_double(CMD, "--pending-timeout", optarg, 0.001, 1e9, &f->pending_timeout)) return 2; break;
      case O_SGRACE: if (cli_double(CMD, "--stop-grace", optarg, 0.01, 3600, &f->stop_grace)) return 2; break;
      case O_INWAIT: if (cli_double(CMD, "--inflight-wait", optarg, 0.001, 3600, &f->inflight_wait)) return 2; break;
      case O_THREADS: if (cli_flag(CMD, "--threads", optarg, &f->threads)) return 2; break;
      case O_MAXMSG: if (cli_int(CMD, "--max-message-mb", optarg, 1, 2047, &f->maxmsg)) return 2; break;
      case O_MAXIDS: if (cli_int(CMD, "--max-ids", optarg, 1, 1LL << 30, &f->maxids)) return 2; break;
      case O_INFLIGHT: if (cli_int(CMD, "--inflight-mb", optarg, 1, 1LL << 30, &f->inflight_mb)) return 2; break;
      case O_CERT: f->tls.cert = optarg; break;
      case O_KEY: f->tls.key = optarg; break;
      case O_CA: f->tls.ca = optarg; break;
      case O_METRICS: if (serve_watch_addr(&f->watch, optarg)) return 2; break;
      case O_LOGFMT: if (serve_watch_log_format(&f->watch, optarg)) return 2; break;
      case O_CROWS: if (cli_flag(CMD, "--cache-rows", optarg, &cache_rows)) return 2; break;
      case O_CMB: if (cli_flag(CMD, "--cache-mb", optarg, &cache_mb)) return 2; break;
      case O_FOLLOW: f->follow.on = 1; break;
      case O_FEVERY: if (cli_double(CMD, "--follow-every", optarg, 0.001, 3600, &f->follow.every_s)) return 2; break;
      case O_FGRACE: if (cli_double(CMD, "--follow-grace", optarg, 0, 86400, &f->follow.grace_s)) return 2; break;
      case O_SWAPAT: {
        long long v;
        if (cli_int(CMD, "--swap-at-step", optarg, 0, 1LL << 62, &v)) return 2;
        f->follow.swap_at = v;
        break;
      }
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
  if (f->follow.on && (!f->so.checkpoint || f->so.data_dir)) {
    fprintf(stderr, "shardrec serve: --follow needs --checkpoint, without --data-dir\n");
    return 2;
  }
  if (f->follow.swap_at >= 0 && !f->follow.on) {
    fprintf(stderr, "shardrec serve: --swap-at-step needs --follow\n");
    return 2;
  }
  /* A swap would overwrite what a Push wrote (the service refuses Restore too). */
  if (f->follow.on) f->read_only = 1;
  if (f->so.checkpoint && f->so.restore) {
    fprintf(stderr, "shardrec serve: give --checkpoint or --restore, not both\n");
    return 2;
  }
  if ((f->tls.cert || f->tls.key || f->tls.ca) && !(f->tls.cert && f->tls.key)) {
    fprintf(stderr, "shardrec serve: TLS needs both --tls-cert and --tls-key\n");
    return 2;
  }
  if (check_access(f)) return 2;
  if (f->ckpt_root && !sr_is_dir(f->ckpt_root)) {
    fprintf(stderr, "shardrec serve: --checkpoint-root %s: not an existing folder\n", f->ckpt_root);
    return 2;
  }
  f->so.n_shards = parse_shards(f->shards_s, f->shards, 256);
  f->so.shards = f->shards;
  return f->so.n_shards < 0 ? 2 : 0;
}

/* The bytes of the data transform the served checkpoint records (its
 * transform.bin, verified with the folder; rpc_service_create checks them
 * against the fingerprint again, as they are read now) into *xf (malloc'd)
 * and *len. 0, or 1 (said). */
static int read_transform(const emb_served *sv, uint8_t **xf, size_t *len) {
  char path[SR_PATH_MAX], err[SR_PATH_MAX + 64];
  if (sr_path_err(path, sizeof path, err, sizeof err, "%s/" DS_XFORM_FILE, sv->ckpt_dir)) {
    fprintf(stderr, "shardrec serve: --checkpoint: %s\n", err);
    return 1;
  }
  *xf = (uint8_t *)sr_read_file(path, len);
  if (!*xf) {
    fprintf(stderr, "shardrec serve: --checkpoint: %s: cannot read: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

int cmd_serve(int argc, char **argv) {
  serve_flags f = {.listen = "127.0.0.1:0", .pending_timeout = 300, .threads = 2, .maxmsg = 64,
                   .follow = {.every_s = 0.1, .grace_s = 10, .swap_at = -1}};
  int rc = parse_flags(argc, argv, &f);
  if (rc) return rc < 0 ? 0 : rc;
  if (f.read_only) rpc_keep_grpc_read_slices(); /* small requests: memory */
  char err[1024];
  emb_served sv;
  if (emb_served_open(&f.so, &sv, err, sizeof err)) {
    static const char *const flag[] = {"", "--plan ", "--checkpoint: ", "--shard ", "--restore "};
    fprintf(stderr, "shardrec serve: %s%s\n", flag[sv.failed], err);
    return 1;
  }
  uint8_t *xf = NULL; /* the checkpoint's transform.bin bytes (owned), or NULL */
  size_t xf_len = 0;
  int status = 1;
  if (f.so.checkpoint && sv.transform_fp[0] && read_transform(&sv, &xf, &xf_len)) {
    emb_served_close(&sv);
    return 1;
  }
  if (f.so.checkpoint) {
    printf("checkpoint %s: step %lld, plan %.12s, %d shard(s); serving shard(s) %s%s; rows %s\n",
           sv.ckpt_dir, (long long)sv.step, sv.plan_fp, sv.plan->n_shards, f.shards_s,
           f.read_only ? " read-only" : "", sv.layout);
    if (xf)
      printf("data transform %.12s (%zu bytes) served by GetTransform\n", sv.transform_fp,
             xf_len);
    else
      printf("data transform: none recorded (GetTransform answers NOT_FOUND)\n");
    if (!f.read_only && sv.temporary)
      printf("note: without --read-only, pushes change a temporary copy of the rows that is "
             "removed at exit (give --data-dir to keep them)\n");
    fflush(stdout);
  }
  /* A --data-dir of this server's own (not a checkpoint's copy) left by a crash. */
  const int own_rows = f.so.data_dir && !f.so.checkpoint;
  if (own_rows && emb_shard_unclean(sv.store)) {
    fprintf(stderr, "shardrec serve: warning: %s was not stopped cleanly: %s\n", f.so.data_dir,
            f.accept_unclean ? "serving its rows as they are (--accept-unclean)"
                             : "Lookup, Push and Checkpoint are refused until a Restore "
                               "(--accept-unclean serves them as they are)");
    if (f.accept_unclean) emb_shard_accept_unclean(sv.store); /* marked at a clean stop */
  }
  rpc_service_opts so = {.shards = f.shards, .n_shards = f.so.n_shards, .read_only = f.read_only,
                         .max_ids = (size_t)f.maxids, .pending_timeout_s = f.pending_timeout,
                         .checkpoint_roots = &f.ckpt_root, .n_roots = f.ckpt_root ? 1 : 0,
                         .max_message_bytes = (size_t)f.maxmsg << 20,
                         .inflight_bytes = (size_t)f.inflight_mb << 20,
                         .inflight_wait_s = f.inflight_wait,
                         .refuse_unclean = own_rows && !f.accept_unclean,
                         .transform = xf, .transform_len = xf_len,
                         .transform_fp = xf ? sv.transform_fp : NULL,
                         .from_checkpoint = f.so.checkpoint != NULL, .step = sv.step};
  rpc_service *svc = NULL;
  char root[SR_PATH_MAX]; /* the folder of the served step-N */
  if (f.follow.on && ckpt_dir_parent(sv.ckpt_dir, root, sizeof root)) {
    fprintf(stderr, "shardrec serve: --checkpoint: %s: path too long\n", sv.ckpt_dir);
    goto done;
  }
  if (serve_watch_prepare(&f.watch, &so, err, sizeof err) ||
      serve_follow_prepare(&f.follow, &sv, root, &f.watch, &so, err, sizeof err) ||
      !(svc = rpc_service_create(sv.plan, sv.store, &so, err, sizeof err)) ||
      serve_watch_start(&f.watch, svc, err, sizeof err) ||
      serve_follow_start(&f.follow, svc, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  listen_ctx lc = {f.listen, &f.watch};
  rpc_server_opts o = {.listen = f.listen, .threads = (int)f.threads,
                       .max_message_bytes = (int)(f.maxmsg << 20),
                       .tls = f.tls.cert ? &f.tls : NULL, .stop = &g_stop,
                       .shutdown_grace_s = f.stop_grace,
                       .reload = &g_reload, .allow_push = f.allow_push,
                       .allow_admin = f.allow_admin,
                       .on_tls_refused = f.watch.json ? serve_watch_tls_refused : NULL,
                       .tls_refused_ctx = &f.watch};
  print_access(&f);
  if (rpc_server_run(svc, &o, on_listening, &lc, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: %s\n", err);
    goto done;
  }
  /* Flushed: mark the rows whole, so the next start serves them; rows a
   * crash left and no Restore replaced stay unmarked (emb_shard_mark_clean),
   * as do rows that miss a push answered before its update failed. */
  const int missing = rpc_service_misses_push(svc);
  if (own_rows && emb_store_kind_of(sv.store) == EMB_STORE_SHARD && !missing &&
      emb_shard_mark_clean(sv.store)) {
    fprintf(stderr, "shardrec serve: %s\n", emb_store_errmsg(sv.store));
    goto done;
  }
  if (own_rows && (missing || emb_shard_unclean(sv.store)))
    fprintf(stderr, "shardrec serve: %s still holds %s (no Restore since): not marked clean, the "
            "next start refuses them too\n", f.so.data_dir,
            missing ? "rows that miss a push answered before its update failed"
                    : "the rows a crash left");
  status = 0;
done:
  serve_follow_stop(&f.follow);
  serve_watch_close(&f.watch, status == 0);
  rpc_service_destroy(svc);
  serve_follow_free(&f.follow);
  free(xf);
  emb_served_close(&sv);
  return status;
}
