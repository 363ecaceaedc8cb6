/* shardrec bench rpc: embedding Lookups and Pushes over gRPC.
 *
 * Rows/s and MB/s of Lookup and Push through the remote store (4096 unique
 * random ids per step, split by shard, one call per shard in flight at
 * once) for dim 16 and 128 against 1 and 4 shard servers, beside, on the
 * same keys in the same run: the in-process local store, and plain TCP
 * round trips of the same bytes (Lookup: ids out, rows back; Push: ids and
 * rows out, a short answer back) with no gRPC at all; the CPU time of the
 * whole process per step, and for 1 server the server's own handling time
 * per call (its observe hook: decode, checks, store, encode). Servers run
 * as threads of this process (each its own gRPC server, store and
 * completion queues), so client and servers share this machine's cores, as
 * they would on one host. Medians of 5 rounds, each timing gRPC, the
 * in-process store and plain TCP in turn, so that a burst of the machine's
 * other work falls on all three alike. Then the p50 and p99 of a
 * 128-id Lookup, one at a time, beside TCP round trips of its bytes.
 *
 * Then, as root, the same over a link between two network namespaces
 * (tests/cluster/netns.sh): `serve --insecure` and a TCP peer (`--part
 * tcp-peer`) in one, the client (`--part client`, which first checks its
 * rows bit for bit against an in-process store) in the other; skipped with
 * a message otherwise.
 *
 * Then training: samples/s of `shardrec train` for the Kaggle configuration
 * (dim 16, 13-512-256-64-16 / 512-256-1, dot, SGD) at --train-batch and the
 * MLPerf-like one (dim 128, 13-512-256-128 / 1024-1024-512-256-1) at batch
 * 2048, on generated data, in process and against 2 `shardrec serve` child
 * processes on loopback (a 2-shard row-wise plan), in turn (the order
 * alternated) in each of --train-rounds rounds, with the median of the
 * rounds' ratios and the trainer's per-phase times of the last round
 * (where the time goes).
 *
 * --part pinned: Lookups from two shard-store servers of the same cached
 * rows, timed in turn, one answering from the store's memory (pinned rows,
 * rpc_server_opts.pin_min_row_bytes 1) and one gathering (never pinned),
 * the ratio that RPC_PIN_MIN_ROW_BYTES was chosen from. */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/num.h"
#include "common/rng.h"
#include "common/sys.h"
#include "embedding/plan.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/bench/run_capture.h"

#define CMD "bench rpc"

/* The remote store's connections and chunk size (--rpc-connections,
 * --rpc-chunk-kb; 0: the store's defaults). */
static rpc_client_opts bench_ro;

typedef struct {
  const emb_plan *plan;
  emb_store *store;
  rpc_service *svc;
  int shard;
  /* Handling time of this server's Lookups and Pushes (rpc_service_opts
   * observe: decode, checks, the store, encode; not gRPC's part). */
  _Atomic uint64_t calls[2], ns[2];
  volatile int stop;
  volatile int port;
  size_t pin_min;  /* rpc_server_opts.pin_min_row_bytes (0: the default) */
  pthread_t th;
} bserver;

/* Worker threads of each in-process server (--server-threads). */
static int server_threads = 1;

static void on_port(int port, void *ctx) { ((bserver *)ctx)->port = port; }

static void on_call(void *ctx, rpc_method m, int status, const char *msg, double seconds,
                    size_t in, size_t out) {
  bserver *b = ctx;
  (void)status, (void)msg, (void)in, (void)out;
  if (m != RPC_LOOKUP && m != RPC_PUSH) return;
  b->calls[m == RPC_PUSH]++;
  b->ns[m == RPC_PUSH] += (uint64_t)(seconds * 1e9);
}

static void *server_main(void *arg) {
  bserver *b = arg;
  char err[512];
  rpc_server_opts o = {.listen = "127.0.0.1:0", .threads = server_threads,
                       .max_message_bytes = 256 << 20,
                       .stop = &b->stop, .shutdown_grace_s = 1,
                       .pin_min_row_bytes = b->pin_min};
  if (rpc_server_run(b->svc, &o, on_port, b, err, sizeof err)) {
    fprintf(stderr, "shardrec bench rpc: server %d: %s\n", b->shard, err);
    b->port = -1;
  }
  return NULL;
}

/* A one-table plan of rows rows of dim over ns row-wise shards (SGD), and
 * ns in-process servers of it on 127.0.0.1, one shard each, in sv[ns]
 * (their handling timed through on_call), their addresses in abuf/addrs.
 * 0, or 1 with a message on stderr (nothing left running). */
static int servers_start(int dim, int ns, long long rows, emb_plan **plan, bserver *sv,
                         char abuf[][64], const char **addrs) {
  char err[512];
  uint64_t r1[1] = {(uint64_t)rows};
  emb_plan_params pp = {.n_tables = 1, .rows = r1, .dim = dim, .optim = {.kind = EMB_OPT_SGD},
                        .seed = 1, .n_shards = ns, .row_wise = 1};
  if (emb_plan_create(&pp, plan, err, sizeof err)) {
    fprintf(stderr, "shardrec bench rpc: %s\n", err);
    return 1;
  }
  memset(sv, 0, (size_t)ns * sizeof *sv);
  for (int k = 0; k < ns; k++) {
    sv[k].plan = *plan;
    sv[k].shard = k;
    sv[k].store = emb_store_create_local(*plan, err, sizeof err);
    rpc_service_opts so = {.shards = &sv[k].shard, .n_shards = 1, .observe = on_call,
                           .observe_ctx = &sv[k]};
    sv[k].svc = rpc_service_create(*plan, sv[k].store, &so, err, sizeof err);
    pthread_create(&sv[k].th, NULL, server_main, &sv[k]);
    while (!sv[k].port) usleep(1000);
    snprintf(abuf[k], 64, "127.0.0.1:%d", sv[k].port);
    addrs[k] = abuf[k];
  }
  return 0;
}

/* Stop and free what servers_start made. */
static void servers_stop(emb_plan *plan, bserver *sv, int ns) {
  for (int k = 0; k < ns; k++) {
    sv[k].stop = 1;
    pthread_join(sv[k].th, NULL);
    rpc_service_destroy(sv[k].svc);
    emb_store_destroy(sv[k].store);
  }
  emb_plan_free(plan);
}

/* The step number of the next store call: every Push a step of its own (a
 * server takes one Push per (job, step, rank) and answers a repeat as a
 * retry, changing nothing). */
static int64_t next_step = 1;

/* Step k's ids: n distinct ids from a random permutation window. */
static void step_ids(uint64_t *perm, uint64_t rows, int k, size_t n, uint64_t *out) {
  size_t at = ((size_t)k * n) % (size_t)(rows - n);
  memcpy(out, perm + at, n * sizeof *out);
}

/* CPU seconds this process (every thread: client and in-process servers)
 * has used so far. */
static double cpu_s(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/* One run of ~secs of one op through s: push (grad [n][dim], SGD at a
 * small rate) when push, else lookup (into out [n][dim]); ids: room for n.
 * Seconds a step, the process's CPU seconds a step into *cpu; -1 on
 * failure (printed). */
static double store_run(emb_store *s, int push, uint64_t *perm, uint64_t rows, size_t n,
                        float *out, const float *grad, double secs, uint64_t *ids, double *cpu) {
  int k = 0;
  double t0 = sr_now(), c0 = cpu_s(), t;
  do {
    step_ids(perm, rows, k++, n, ids);
    const uint64_t *ip[1] = {ids};
    size_t counts[1] = {n};
    emb_idset set = {1, ip, counts};
    float *op[1] = {out};
    const float *gp[1] = {grad};
    const int64_t step = next_step++;
    int rc = push ? emb_store_push(s, step, 1e-3f, &set, gp)
                  : emb_store_lookup_begin(s, step, &set, op) || emb_store_lookup_wait(s);
    if (rc) {
      fprintf(stderr, "shardrec bench rpc: %s: %s\n", push ? "push" : "lookup",
              emb_store_errmsg(s));
      return -1;
    }
    t = sr_now();
  } while (t - t0 < secs);
  *cpu = (cpu_s() - c0) / k;
  return (t - t0) / k;
}

/* Seconds per step of one op through store (store_run), median of 5 runs;
 * the median CPU a step into *cpu. -1 on failure (printed). */
static double time_store(emb_store *s, int push, uint64_t *perm, uint64_t rows, size_t n,
                         float *out, const float *grad, double secs, double *cpu) {
  double runs[5], cpus[5];
  uint64_t *ids = malloc(n * sizeof *ids);
  for (int r = 0; r < 5; r++)
    if (!ids || (runs[r] = store_run(s, push, perm, rows, n, out, grad, secs, ids, &cpus[r])) < 0) {
      free(ids);
      return -1;
    }
  free(ids);
  *cpu = sr_median(cpus, 5);
  return sr_median(runs, 5);
}

/* Plain TCP: a peer reads a header (the request's and the answer's sizes,
 * two uint64), then, in turn, req bytes and answers resp bytes, until the
 * connection ends. A thread of this process on loopback, or `bench rpc
 * --part tcp-peer` elsewhere (another network namespace). */
static int full_io(int fd, void *buf, size_t n, int wr) {
  char *p = buf;
  while (n) {
    ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static void *tcp_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  uint64_t hdr[2];
  if (full_io(fd, hdr, sizeof hdr, 0) || hdr[0] > (1u << 30) || hdr[1] > (1u << 30)) {
    close(fd);
    return NULL;
  }
  char *in = malloc(hdr[0] ? hdr[0] : 1), *out = calloc(1, hdr[1] ? hdr[1] : 1);
  for (size_t i = 0; out && i < hdr[1]; i++) out[i] = (char)(i * 131);
  while (in && out && !full_io(fd, in, hdr[0], 0) && !full_io(fd, out, hdr[1], 1)) {
  }
  free(in);
  free(out);
  close(fd);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (0..1, nearest rank) of v[n]; sorts v. */
static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int k = (int)(q * n + 0.5) - 1;
  return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* "IP:PORT" (IPv4) into a. 0 or -1. */
static int parse_addr(const char *s, struct sockaddr_in *a) {
  char host[64];
  const char *colon = strrchr(s, ':');
  if (!colon || colon - s >= (long)sizeof host) return -1;
  snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
  long long port;
  if (sr_num_int(colon + 1, strlen(colon + 1), &port) || port < 0 || port > 65535) return -1;
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

/* A connection to peer ("IP:PORT"), or with peer NULL to a peer thread of
 * this process on loopback (*th, *ls set; joined by tcp_close). -1 on
 * failure. */
static int tcp_open(const char *peer, size_t req, size_t resp, pthread_t *th, int *ls) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  *ls = -1;
  if (peer && parse_addr(peer, &a)) return -1;
  if (!peer && ((*ls = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
                bind(*ls, (struct sockaddr *)&a, sizeof a) || listen(*ls, 1) ||
                getsockname(*ls, (struct sockaddr *)&a, &al)))
    return -1;
  int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) return -1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!peer) {
    int fd = accept(*ls, NULL, NULL);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_create(th, NULL, tcp_main, (void *)(intptr_t)fd);
  }
  uint64_t hdr[2] = {req, resp};
  if (full_io(c, hdr, sizeof hdr, 1)) return -1;
  return c;
}

static void tcp_close(int c, pthread_t th, int ls) {
  shutdown(c, SHUT_RDWR);
  close(c);
  if (ls >= 0) {
    pthread_join(th, NULL);
    close(ls);
  }
}

/* Seconds per round trip of req bytes out and resp bytes back over plain
 * TCP (to peer, or a peer thread on loopback when NULL), median of 5 runs
 * of ~secs; with lat (not NULL), instead lat[0..1] = p50 and p99 of n_lat
 * single round trips. -1 on failure. */
/* One run of ~secs of round trips on c (req bytes out of q, resp back into
 * r): seconds a round trip, or -1 when the connection failed. */
static double tcp_run(int c, char *q, char *r, size_t req, size_t resp, double secs) {
  int n = 0;
  double t0 = sr_now(), t;
  do {
    if (full_io(c, q, req, 1) || full_io(c, r, resp, 0)) return -1;
    n++;
    t = sr_now();
  } while (t - t0 < secs);
  return (t - t0) / n;
}

static double time_tcp(const char *peer, size_t req, size_t resp, double secs, double *lat,
                       int n_lat) {
  pthread_t th;
  int ls, c = tcp_open(peer, req, resp, &th, &ls);
  if (c < 0) return -1;
  char *q = calloc(1, req ? req : 1), *r = malloc(resp ? resp : 1);
  double runs[5], res = -1, *one = lat ? malloc((size_t)n_lat * sizeof *one) : NULL;
  int bad = 0;
  for (int k = 0; k < (lat ? n_lat : 5) && !bad; k++) {
    double v = tcp_run(c, q, r, req, resp, lat ? 0 : secs);
    bad = v < 0;
    if (lat) one[k] = v;
    else runs[k] = v;
  }
  if (!bad && lat) {
    lat[0] = quantile(one, n_lat, 0.5);
    lat[1] = quantile(one, n_lat, 0.99);
    res = lat[0];
  } else if (!bad) {
    res = sr_median(runs, 5);
  }
  tcp_close(c, th, ls);
  free(one);
  free(q);
  free(r);
  return res;
}

/* cpu: CPU seconds a step (< 0: not measured). */
static void print_row(const char *what, double per_step, double cpu, size_t n, int dim) {
  double rows = (double)n / per_step, mb = rows * dim * 4 / 1e6;
  printf("  %-30s %10.0f rows/s  %8.1f MB/s  %8.1f us/step", what, rows, mb, per_step * 1e6);
  if (cpu >= 0) printf("  (CPU %7.1f us)", cpu * 1e6);
  printf("\n");
}

extern char **environ;

/* Run `this-executable args` (a shell word list) in dir; its output into
 * *out (malloc'd). 0 on exit 0. */
static int run_out(const char *dir, const char *args, char **out) {
  char cmd[8192];
  *out = NULL;
  int n = snprintf(cmd, sizeof cmd, "cd '%s' && /proc/%d/exe %s", dir, (int)getpid(), args);
  if (n < 0 || n >= (int)sizeof cmd) return -1; /* never run a command cut short */
  return run_capture(cmd, out) == 0 && *out ? 0 : -1;
}

/* A child running argv (argv[0] a path) whose stdout says "listening on
 * ADDR" (serve, bench rpc --part tcp-peer); ADDR into addr, its stderr
 * into log. The pid, or -1 (killed) when it did not say so in 20 s. */
static pid_t spawn_listener(char *const argv[], const char *log, char *addr, size_t alen) {
  int fd[2];
  if (pipe(fd)) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
  posix_spawn_file_actions_addclose(&fa, fd[0]);
  posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd[1]);
  if (rc) {
    close(fd[0]);
    return -1;
  }
  read_listen_addr(fd[0], 20, addr, alen);
  close(fd[0]);
  if (!addr[0]) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

/* A `shardrec serve` child of dir/plan.json's shard on 127.0.0.1:0; its
 * address into addr. */
static pid_t spawn_server(const char *dir, int shard, char *addr, size_t alen) {
  char exe[64], sh[16], plan[SR_PATH_MAX], log[SR_PATH_MAX], err[256];
  snprintf(exe, sizeof exe, "/proc/%d/exe", (int)getpid());
  snprintf(sh, sizeof sh, "%d", shard);
  if (sr_path_err(plan, sizeof plan, err, sizeof err, "%s/plan.json", dir) ||
      sr_path_err(log, sizeof log, err, sizeof err, "%s/srv%d.log", dir, shard)) {
    fprintf(stderr, "shardrec bench rpc: %s\n", err);
    return -1;
  }
  char *argv[] = {exe, "serve", "--plan", plan, "--shard", sh, "--listen", "127.0.0.1:0", NULL};
  return spawn_listener(argv, log, addr, alen);
}

/* From train's "done   N steps in S s; per step: ..." line: samples/s and
 * the per-step phase list. */
static int parse_done(const char *out, long long batch, double *sps, char *phases, size_t plen) {
  const char *d = strstr(out, "done   ");
  long long steps;
  double secs;
  if (!d || sscanf(d, "done   %lld steps in %lf s", &steps, &secs) != 2 || secs <= 0) return -1;
  *sps = (double)steps * (double)batch / secs;
  const char *p = strstr(d, "per step: ");
  snprintf(phases, plen, "%.*s", p ? (int)strcspn(p + 10, "\n") : 0, p ? p + 10 : "");
  return 0;
}

/* The training comparison's rounds (--train-rounds): 9 by default, as on
 * a 2-core guest one round's ratio moved by 0.1 either way (at times by
 * 0.3), and a median of 3 followed it by 0.05 from run to run, one of 5
 * by 0.05 (0.87-0.98 in nine runs). One of 9 still moves with the day's
 * noise (docs/DESIGN.md, "What the look-ahead hides"). */
#define TRAIN_ROUNDS_DEFAULT 9
#define TRAIN_ROUNDS_MAX 15

/* A model of the training comparison: its name and train's model flags. */
typedef struct {
  const char *name;
  const char *flags; /* train's --arch-* flags ("": the Kaggle defaults) */
} train_model;

static const train_model kaggle = {"Kaggle configuration (dim 16, 13-512-256-64-16 / 512-256-1, dot, SGD)", ""};
static const train_model mlperf = {
    "MLPerf-like configuration (dim 128, 13-512-256-128 / 1024-1024-512-256-1, dot, SGD)",
    "--arch-sparse-feature-size 128 --arch-mlp-bot 13-512-256-128 --arch-mlp-top 1024-1024-512-256-1"};

/* Training samples/s of model m in process and against 2 server processes,
 * in rounds: each round trains in process and against the servers, one
 * after the other (in process first in even rounds, the servers first in
 * odd ones, so that neither always runs on the heels of the other), and
 * takes the ratio of the two, so that the machine's drift falls on both
 * alike; the medians of the rounds, and the last round's phases. The
 * servers start once: from the second round on they already hold the rows
 * the rounds before pushed (the same ids), where the in-process store
 * starts empty each round. */
static int bench_train_rpc(const train_model *m, long long rows, long long steps, long long batch,
                           int rounds) {
  char dir[] = "/tmp/shardrec-bench-rpc-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("shardrec bench rpc: mkdtemp");
    return 1;
  }
  printf("\ntraining: %s, batch %lld, %lld steps on %lld generated rows; a 2-shard row-wise plan, "
         "in process and against 2 'shardrec serve' processes on 127.0.0.1 (this machine's cores "
         "shared), in turn (the order alternated) in each of %d rounds\n",
         m->name, batch, steps, rows, rounds);
  fflush(stdout);
  char args[2048], *out = NULL;
  int status = 1;
  pid_t srv[2] = {-1, -1};
  snprintf(args, sizeof args,
           "datagen --rows %lld --seed 1 --out d.tsv >/dev/null && /proc/%d/exe convert "
           "--test-fraction 0.01 d.tsv d.bin >/dev/null && /proc/%d/exe train "
           "--processed-data-file d.bin --num-batches 1 --num-shards 2 %s --plan-out p.json "
           ">/dev/null && /usr/bin/env python3 -c \"import json; p = json.load(open('p.json')); "
           "[t.__setitem__('placement', {'kind': 'row', 'shards': [0, 1]}) for t in p['tables']]; "
           "json.dump(p, open('plan.json', 'w'))\"",
           rows, (int)getpid(), (int)getpid(), m->flags);
  if (run_out(dir, args, &out)) {
    fprintf(stderr, "shardrec bench rpc: data preparation failed: %s\n", out ? out : "");
    goto done;
  }
  free(out);
  out = NULL;
  char addr[2][64];
  for (int k = 0; k < 2; k++)
    if ((srv[k] = spawn_server(dir, k, addr[k], sizeof addr[k])) < 0) {
      fprintf(stderr, "shardrec bench rpc: shard server %d did not start (log %s/srv%d.log)\n", k,
              dir, k);
      goto done;
    }
  char common[1024];
  snprintf(common, sizeof common,
           "train --processed-data-file d.bin --plan plan.json --optimizer sgd --print-freq 100000 "
           "--test-freq 0 %s --num-batches %lld --mini-batch-size %lld",
           m->flags, steps, batch);
  double sps[2][TRAIN_ROUNDS_MAX], ratio[TRAIN_ROUNDS_MAX];
  char ph[2][512];
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < 2; j++) {
      const int k = r % 2 ? 1 - j : j; /* 0: in process; 1: against the servers */
      if (k) snprintf(args, sizeof args, "%s --shard-servers %s,%s", common, addr[0], addr[1]);
      else snprintf(args, sizeof args, "%s", common);
      if (run_out(dir, args, &out) || parse_done(out, batch, &sps[k][r], ph[k], sizeof ph[k])) {
        fprintf(stderr, "shardrec bench rpc: training %s failed: %s\n",
                k ? "against servers" : "in process", out ? out : "");
        goto done;
      }
      free(out);
      out = NULL;
    }
  for (int r = 0; r < rounds; r++) ratio[r] = sps[1][r] / sps[0][r];
  char each[TRAIN_ROUNDS_MAX * 8 + 1] = "";
  for (int r = 0; r < rounds; r++)
    snprintf(each + strlen(each), sizeof each - strlen(each), "%s%.2f", r ? " " : "", ratio[r]);
  printf("  %-34s %10.0f samples/s   per step (last round): %s\n", "in process (2 shards)",
         sr_median(sps[0], rounds), ph[0]);
  printf("  %-34s %10.0f samples/s   per step (last round): %s\n",
         "2 shard servers (gRPC, processes)", sr_median(sps[1], rounds), ph[1]);
  printf("    (against servers: %.2fx the in-process rate, the median of the rounds' ratios %s; "
         "the lookup and push phases hold the network time)\n",
         sr_median(ratio, rounds), each);
  status = 0;
done:
  free(out);
  for (int k = 0; k < 2; k++)
    if (srv[k] > 0) {
      kill(srv[k], SIGTERM);
      waitpid(srv[k], NULL, 0);
    }
  if (sr_rmtree(dir) != 0) fprintf(stderr, "shardrec bench rpc: could not remove %s\n", dir);
  return status;
}

/* Every row of a and b (stores of one plan, one table of rows rows) set
 * to the same random values: pushes of grad for perm's ids, n at a time,
 * each a step of its own. 0, or -1 (printed). */
static int fill_stores(emb_store *a, emb_store *b, const uint64_t *perm, long long rows,
                       long long n, const float *grad) {
  for (long long at = 0; at < rows; at += n) {
    const uint64_t *ip[1] = {perm + at};
    size_t counts[1] = {(size_t)(rows - at < n ? rows - at : n)};
    emb_idset set = {1, ip, counts};
    const float *gp[1] = {grad};
    const int64_t step = next_step++;
    if (emb_store_push(a, step, 1.0f, &set, gp) || emb_store_push(b, step, 1.0f, &set, gp)) {
      fprintf(stderr, "shardrec bench rpc: fill: %s / %s\n", emb_store_errmsg(a),
              emb_store_errmsg(b));
      return -1;
    }
  }
  return 0;
}

/* p50 and p99 (lat[2], seconds) of 1000 Lookups of 128 ids through s, one
 * at a time. -1 on failure (printed). */
static int lookup_latency(emb_store *s, const uint64_t *perm, long long rows, int dim,
                          double lat[2]) {
  enum { N_LAT = 1000, IDS = 128 };
  double *one = malloc(N_LAT * sizeof *one);
  float *out = malloc((size_t)IDS * (size_t)dim * sizeof *out);
  int rc = one && out ? 0 : -1;
  for (int k = 0; k < N_LAT && !rc; k++) {
    const uint64_t *ip[1] = {perm + ((size_t)k * IDS) % (size_t)(rows - IDS)};
    size_t counts[1] = {IDS};
    emb_idset set = {1, ip, counts};
    float *op[1] = {out};
    double t0 = sr_now();
    rc = emb_store_lookup_begin(s, next_step++, &set, op) || emb_store_lookup_wait(s);
    one[k] = sr_now() - t0;
  }
  if (rc) fprintf(stderr, "shardrec bench rpc: latency: %s\n", emb_store_errmsg(s));
  else lat[0] = quantile(one, N_LAT, 0.5), lat[1] = quantile(one, N_LAT, 0.99);
  free(one);
  free(out);
  return rc ? -1 : 0;
}

/* The 128-id Lookup's p50/p99 through rem beside plain TCP round trips of
 * its bytes (to tcp_peer, or on loopback when NULL). 0, or -1. */
static int print_latency(emb_store *rem, const char *tcp_peer, const uint64_t *perm,
                         long long rows, int dim) {
  double g[2], t[2];
  if (lookup_latency(rem, perm, rows, dim, g)) return -1;
  int tcp_ok = time_tcp(tcp_peer, 128 * 8, (size_t)128 * (size_t)dim * 4, 0, t, 1000) > 0;
  printf("  Lookup of 128 ids, one at a time: gRPC p50 %.1f us, p99 %.1f us", g[0] * 1e6,
         g[1] * 1e6);
  if (tcp_ok)
    printf("; plain TCP, same bytes: p50 %.1f us, p99 %.1f us (gRPC p50 %.1fx TCP's)\n",
           t[0] * 1e6, t[1] * 1e6, g[0] / t[0]);
  else
    printf("; TCP baseline failed\n");
  return 0;
}

/* The rows of rem and loc (same plan, filled alike) for 3 windows of n of
 * perm's ids, compared bit for bit. The rows compared, or -1 (printed). */
static long long check_rows(emb_store *rem, emb_store *loc, const uint64_t *perm, long long rows,
                            long long n, int dim) {
  float *a = malloc((size_t)n * (size_t)dim * sizeof *a);
  float *b = malloc((size_t)n * (size_t)dim * sizeof *b);
  long long done = 0;
  for (int w = 0; w < 3 && a && b && done >= 0; w++) {
    const uint64_t *ip[1] = {perm + ((size_t)w * (size_t)n) % (size_t)(rows - n)};
    size_t counts[1] = {(size_t)n};
    emb_idset set = {1, ip, counts};
    float *pa[1] = {a}, *pb[1] = {b};
    const int64_t step = next_step++;
    if (emb_store_lookup_begin(rem, step, &set, pa) || emb_store_lookup_wait(rem) ||
        emb_store_lookup_begin(loc, step, &set, pb) || emb_store_lookup_wait(loc)) {
      fprintf(stderr, "shardrec bench rpc: check: %s\n", emb_store_errmsg(rem));
      done = -1;
      break;
    }
    for (long long i = 0; i < n; i++)
      if (memcmp(a + i * dim, b + i * dim, (size_t)dim * sizeof *a)) {
        fprintf(stderr, "shardrec bench rpc: row %llu of table 0 differs from the in-process store's\n",
                (unsigned long long)ip[0][i]);
        done = -1;
        break;
      }
    if (done >= 0) done += n;
  }
  free(a);
  free(b);
  return a && b ? done : -1;
}

/* Both training comparisons: the Kaggle model at batch (dim 16) and the
 * MLPerf-like one at batch 2048 (dim 128, steps / 10, at least 10). */
static int bench_train_all(long long rows, long long steps, long long batch, int rounds) {
  int st = bench_train_rpc(&kaggle, rows, steps, batch, rounds);
  if (!st) st = bench_train_rpc(&mlperf, rows, steps / 10 > 10 ? steps / 10 : 10, 2048, rounds);
  return st;
}

/* One row group of the lookup table: ns shard servers (threads of this
 * process) over a dim-wide table of rows rows, filled by pushes, Lookup
 * then Push, each timed in 5 rounds of three runs in turn: the servers,
 * the in-process store, and plain TCP round trips of the same bytes (a
 * Lookup's: ids out, rows back; a Push's: ids and rows out, a short
 * answer back); the medians of each (for the first server count si 0
 * also the local and plain-TCP rows) and their ratios. first: the
 * Lookup's and the Push's seconds a step with the first server count
 * (written when si is 0, compared with after). perm: [rows] the ids in
 * push and lookup order; grad, out: [n][dim]. The exit status (1: failed,
 * printed). */
static int bench_servers(int dim, int ns, int si, long long rows, long long n,
                         uint64_t *perm, const float *grad, float *out, double secs,
                         double first[2]) {
  int status = 0;
  char err[512];
  emb_plan *plan;
  bserver sv[4];
  const char *addrs[4];
  char abuf[4][64];
  if (servers_start(dim, ns, rows, &plan, sv, abuf, addrs)) return 1;
  emb_store *rem = emb_store_create_remote(plan, addrs, ns, &bench_ro, err, sizeof err);
  emb_store *loc = emb_store_create_local(plan, err, sizeof err);
  if (rem && loc && fill_stores(rem, loc, perm, rows, n, grad)) status = 1;
  if (!rem || !loc) {
    fprintf(stderr, "shardrec bench rpc: %s\n", err);
    status = 1;
  }
  uint64_t *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) status = 1;
  for (int push = 0; push < 2 && !status; push++) {
    const size_t rb = (size_t)n * (size_t)dim * 4, req = (size_t)n * 8 + (push ? rb : 0),
                 resp = push ? 16 : rb;
    pthread_t th;
    int ls, c = tcp_open(NULL, req, resp, &th, &ls);
    char *q = calloc(1, req), *a = malloc(resp);
    double tr[5], cr[5], tl[5], cl[5], tt[5], hr[5]; /* hr: the server's handling a call */
    int tcp_ok = c >= 0 && q && a;
    for (int k = 0; k < 5 && !status; k++) { /* the three in turn: a burst hits all alike */
      const uint64_t calls0 = sv[0].calls[push], ns0 = sv[0].ns[push];
      tr[k] = store_run(rem, push, perm, (uint64_t)rows, (size_t)n, out, grad, secs, ids, &cr[k]);
      const uint64_t nc = sv[0].calls[push] - calls0;
      hr[k] = nc ? 1e-9 * (double)(sv[0].ns[push] - ns0) / (double)nc : 0;
      tl[k] = store_run(loc, push, perm, (uint64_t)rows, (size_t)n, out, grad, secs, ids, &cl[k]);
      if (tcp_ok && (tt[k] = tcp_run(c, q, a, req, resp, secs)) < 0) tcp_ok = 0;
      if (tr[k] < 0 || tl[k] < 0) status = 1;
    }
    if (c >= 0) tcp_close(c, th, ls);
    else if (ls >= 0) close(ls);
    free(q);
    free(a);
    if (!status) {
      const double t_rem = sr_median(tr, 5), t_loc = sr_median(tl, 5),
                   t_tcp = tcp_ok ? sr_median(tt, 5) : -1, c_rem = sr_median(cr, 5),
                   c_loc = sr_median(cl, 5);
      char what[64];
      const char *op = push ? "Push" : "Lookup";
      snprintf(what, sizeof what, "%s gRPC, %d server%s", op, ns, ns > 1 ? "s" : "");
      print_row(what, t_rem, c_rem, (size_t)n, dim);
      if (ns == 1 && hr[0] > 0) { /* the rounds' means a call, and their own ratios */
        double rh[5];
        for (int k = 0; k < 5; k++) rh[k] = hr[k] / tl[k];
        printf("    (of which the server's handling, gRPC's part left out: %.1f us a call, %.2fx "
               "the in-process store's time; rounds", 1e6 * sr_median(hr, 5), sr_median(rh, 5));
        for (int k = 0; k < 5; k++) printf(" %.2f", rh[k]);
        printf(")\n");
      }
      if (si == 0) {
        snprintf(what, sizeof what, "%s in-process store", op);
        print_row(what, t_loc, c_loc, (size_t)n, dim);
        snprintf(what, sizeof what, "%s plain TCP, same bytes", op);
        if (t_tcp > 0) print_row(what, t_tcp, -1, (size_t)n, dim);
      }
      /* The ratios are the medians of each round's own (its runs follow
       * one another), not ratios of the medians above: a slow spell of the
       * machine then moves both sides of a ratio alike. */
      double rt[5], rl[5];
      for (int k = 0; k < 5; k++) rt[k] = tcp_ok ? tt[k] / tr[k] : 0, rl[k] = tr[k] / tl[k];
      const double r_loc = sr_median(rl, 5);
      if (t_tcp > 0) {
        const double r_tcp = sr_median(rt, 5);
        double lo = rt[0], hi = rt[0];
        for (int k = 1; k < 5; k++) lo = rt[k] < lo ? rt[k] : lo, hi = rt[k] > hi ? rt[k] : hi;
        printf("    (%s gRPC %d: %.1f%% of plain TCP's rate (rounds %.1f-%.1f%%), %.1fx the "
               "in-process time)\n", op, ns, 100 * r_tcp, 100 * lo, 100 * hi, r_loc);
        if (ns == 1) { /* what the store's own work leaves, round by round */
          double rb[5];
          for (int k = 0; k < 5; k++) rb[k] = tt[k] / (tt[k] + tl[k]);
          printf("    (a %s that cost plain TCP's round trip, then the in-process store's time, "
                 "would run at %.1f%% of plain TCP's rate; rounds", op, 100 * sr_median(rb, 5));
          for (int k = 0; k < 5; k++) printf(" %.1f", 100 * rb[k]);
          printf(")\n");
        }
      } else {
        printf("    (%s gRPC %d: %.1fx the in-process time; TCP baseline failed)\n", op, ns, r_loc);
      }
      if (si == 0) first[push] = t_rem;
      else printf("    (%s gRPC %d: %.2fx the time a step of the first server count)\n", op, ns,
                  t_rem / first[push]);
    }
  }
  free(ids);
  if (!status && si == 0 && print_latency(rem, NULL, perm, rows, dim)) status = 1;
  emb_store_destroy(rem);
  emb_store_destroy(loc);
  servers_stop(plan, sv, ns);
  return status;
}

/* --part connections: the remote store's connections per server and chunk
 * size, interleaved. Each round times a few lookup steps (and, apart, push
 * steps) of every setting in turn against the same servers, so a burst of
 * the machine's other work falls on all of them alike; a setting's figure
 * is the median over the rounds of its speed-up against the first setting
 * (1 connection, no chunks) in the same round. Each run begins with a step
 * it does not time, and the round's order turns by one setting each
 * round: the first run after a change from lookups to pushes or back is
 * slower (a setting repeated as the second of the seven measured x1.26
 * against itself when every round began with the first). */
#define SWEEP_N 7
static const int sweep_conns[SWEEP_N] = {1, 1, 1, 2, 2, 2, 4};
static const int sweep_kb[SWEEP_N] = {0, 64, 512, 0, 128, 512, 512};

/* Seconds per step of steps lookup (push: push) steps through s, k0 on;
 * with warm (1) step k0 - 1 first, not timed. */
static double sweep_time(emb_store *s, int push, uint64_t *perm, uint64_t rows, size_t n,
                         float *out, const float *grad, int steps, int k0, int warm) {
  uint64_t *ids = malloc(n * sizeof *ids);
  double t0 = sr_now();
  for (int k = k0 - warm; k < k0 + steps; k++) {
    if (k == k0) t0 = sr_now();
    step_ids(perm, rows, k, n, ids);
    const uint64_t *ip[1] = {ids};
    size_t counts[1] = {n};
    emb_idset set = {1, ip, counts};
    float *op[1] = {out};
    const float *gp[1] = {grad};
    int rc = push ? emb_store_push(s, k, 0.0f, &set, gp)
                  : emb_store_lookup_begin(s, k, &set, op) || emb_store_lookup_wait(s);
    if (rc) {
      fprintf(stderr, "shardrec bench rpc: %s: %s\n", push ? "push" : "lookup", emb_store_errmsg(s));
      free(ids);
      return -1;
    }
  }
  free(ids);
  return (sr_now() - t0) / steps;
}

static int sweep_one(int dim, int ns, long long rows, long long n, uint64_t *perm, float *grad,
                     float *out, int rounds) {
  char err[512];
  emb_plan *plan;
  bserver sv[4];
  const char *addrs[4];
  char abuf[4][64];
  if (servers_start(dim, ns, rows, &plan, sv, abuf, addrs)) return 1;
  emb_store *st[SWEEP_N];
  int status = 0;
  for (int c = 0; c < SWEEP_N; c++) {
    rpc_client_opts o = {.connections = sweep_conns[c],
                         .chunk_bytes = sweep_kb[c] ? (size_t)sweep_kb[c] << 10 : SIZE_MAX};
    if (!(st[c] = emb_store_create_remote(plan, addrs, ns, &o, err, sizeof err))) status = 1;
  }
  /* Rows exist once pushed (lr 0 keeps them at their initial values). */
  for (long long at = 0; at + n <= rows && !status; at += n)
    if (sweep_time(st[0], 1, perm, (uint64_t)rows, (size_t)n, out, grad, 1, (int)(at / n), 0) < 0)
      status = 1;
  double *ratio = calloc((size_t)(2 * SWEEP_N * rounds), sizeof *ratio);
  double *abs_t = calloc((size_t)(2 * SWEEP_N * rounds), sizeof *abs_t);
  const int steps = dim > 64 ? 4 : 16;
  for (int r = 0; r < rounds && !status; r++)
    for (int push = 0; push < 2 && !status; push++) {
      double t[SWEEP_N];
      for (int i = 0; i < SWEEP_N && !status; i++) {
        const int c = (r + i) % SWEEP_N;
        t[c] = sweep_time(st[c], push, perm, (uint64_t)rows, (size_t)n, out, grad, steps,
                          r * (steps + 1) + 1, 1);
        if (t[c] < 0) status = 1;
      }
      for (int c = 0; c < SWEEP_N && !status; c++) {
        ratio[(push * SWEEP_N + c) * rounds + r] = t[0] / t[c];
        abs_t[(push * SWEEP_N + c) * rounds + r] = t[c];
      }
    }
  if (!status) {
    printf("dim %d, %d server%s (%.2f MB of rows a step), medians of %d rounds:\n", dim, ns,
           ns > 1 ? "s" : "", (double)n * dim * 4 / 1e6, rounds);
    for (int c = 0; c < SWEEP_N; c++) {
      double lr = sr_median(ratio + c * rounds, rounds), pr = sr_median(ratio + (SWEEP_N + c) * rounds, rounds);
      double lt = sr_median(abs_t + c * rounds, rounds), pt = sr_median(abs_t + (SWEEP_N + c) * rounds, rounds);
      char what[48];
      if (sweep_kb[c]) snprintf(what, sizeof what, "%d conn, chunks of %d KiB", sweep_conns[c], sweep_kb[c]);
      else snprintf(what, sizeof what, "%d conn, no chunks", sweep_conns[c]);
      printf("  %-26s lookup %7.1f MB/s x%.2f   push %7.1f MB/s x%.2f\n", what,
             (double)n * dim * 4 / lt / 1e6, lr, (double)n * dim * 4 / pt / 1e6, pr);
    }
  }
  free(ratio);
  free(abs_t);
  for (int c = 0; c < SWEEP_N; c++) emb_store_destroy(st[c]);
  servers_stop(plan, sv, ns);
  return status;
}

/* --part pinned: Lookups from shard-store servers (RocksDB under a
 * temporary folder, a cache that holds every row) answered from the
 * store's memory (pinned rows, no copy) against the same answered by a
 * gather into one buffer: two servers of the same rows, one each way,
 * timed in turn (each first in every other round, each run after a step
 * it does not time, as --part connections), rounds rounds; medians of
 * each one's rate and of their ratio in the same round. */
static int pinned_one(int dim, long long rows, long long n, uint64_t *perm, float *grad,
                      float *out, int rounds) {
  char err[512], tmpl[] = "/tmp/shardrec-bench-pin-XXXXXX";
  const char *dir = mkdtemp(tmpl);
  uint64_t r1[1] = {(uint64_t)rows};
  emb_plan_params pp = {.n_tables = 1, .rows = r1, .dim = dim, .optim = {.kind = EMB_OPT_SGD},
                        .seed = 1, .n_shards = 1};
  emb_plan *plan = NULL;
  if (!dir || emb_plan_create(&pp, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec bench rpc: %s\n", dir ? err : "mkdtemp failed");
    return 1;
  }
  bserver sv[2];
  emb_store *st[2] = {NULL, NULL};
  int status = 0, shard0 = 0;
  memset(sv, 0, sizeof sv);
  for (int k = 0; k < 2 && !status; k++) {
    char sub[512], addr[64];
    snprintf(sub, sizeof sub, "%s/%s", dir, k ? "pinned" : "gather");
    emb_shard_config cfg = {.cache_rows = (uint64_t)rows + 1024};
    sv[k].plan = plan;
    sv[k].pin_min = k ? 1 : SIZE_MAX;
    rpc_service_opts so = {.shards = &shard0, .n_shards = 1, .observe = on_call,
                           .observe_ctx = &sv[k]};
    if (!(sv[k].store = emb_store_create_shard(plan, sub, &cfg, err, sizeof err)) ||
        !(sv[k].svc = rpc_service_create(plan, sv[k].store, &so, err, sizeof err))) {
      fprintf(stderr, "shardrec bench rpc: %s\n", err);
      status = 1;
      break;
    }
    pthread_create(&sv[k].th, NULL, server_main, &sv[k]);
    while (!sv[k].port) usleep(1000);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sv[k].port);
    const char *addrs[1] = {addr};
    if (!(st[k] = emb_store_create_remote(plan, addrs, 1, &bench_ro, err, sizeof err))) {
      fprintf(stderr, "shardrec bench rpc: %s\n", err);
      status = 1;
    }
  }
  if (!status && fill_stores(st[0], st[1], perm, rows, n, grad)) status = 1;
  double *v = calloc((size_t)(3 * rounds), sizeof *v);
  const int steps = dim > 64 ? 4 : 16;
  for (int r = 0; r < rounds && !status; r++) {
    double t[2];
    for (int i = 0; i < 2 && !status; i++) { /* each first in every other round */
      const int k = (r + i) % 2;
      const int64_t k0 = next_step + 1;
      next_step += steps + 1;
      if ((t[k] = sweep_time(st[k], 0, perm, (uint64_t)rows, (size_t)n, out, grad, steps, (int)k0, 1)) < 0)
        status = 1;
    }
    if (!status) {
      v[r] = (double)n * dim * 4 / t[0] / 1e6;
      v[rounds + r] = (double)n * dim * 4 / t[1] / 1e6;
      v[2 * rounds + r] = t[0] / t[1];
    }
  }
  if (!status)
    printf("  dim %4d (%4d bytes a row): gather %7.1f MB/s   pinned %7.1f MB/s   pinned/gather "
           "x%.2f\n", dim, dim * 4, sr_median(v, rounds), sr_median(v + rounds, rounds),
           sr_median(v + 2 * rounds, rounds));
  free(v);
  for (int k = 0; k < 2; k++) {
    emb_store_destroy(st[k]);
    if (sv[k].svc) {
      sv[k].stop = 1;
      pthread_join(sv[k].th, NULL);
    }
    rpc_service_destroy(sv[k].svc);
    emb_store_destroy(sv[k].store);
  }
  emb_plan_free(plan);
  if (dir) sr_rmtree(dir);
  return status;
}

/* --part lookahead: a training step's store calls against 2 server
 * threads, lookup (waited for), work A (forward and backward), push, work
 * B (the dense optimizer and the next batch's input), without and with the
 * next step's ids handed ahead (emb_store_prefetch) before the push; the
 * time the step waits in lookup and in push (which, handed ahead, carries
 * the next step's Lookup: PushLookup), medians of 5 blocks of steps, each
 * way first in every other block and after a step it does not time (the
 * step's ratio: the median of the blocks' own). Work is a spin on the
 * clock of work_us microseconds each. */
static void spin_us(double us) {
  double until = sr_now() + us * 1e-6;
  while (sr_now() < until) {
  }
}

static int lookahead_one(int dim, long long rows, long long n, uint64_t *perm, float *grad,
                         float *out, double work_us) {
  char err[512];
  const int ns = 2;
  emb_plan *plan;
  bserver sv[2];
  const char *addrs[2];
  char abuf[2][64];
  if (servers_start(dim, ns, rows, &plan, sv, abuf, addrs)) return 1;
  int status = 0;
  double wait[2][5], pwait[2][5], step[2][5];
  uint64_t *ids = malloc((size_t)n * sizeof *ids), *nids = malloc((size_t)n * sizeof *nids);
  for (int blk = 0; blk < 5 && !status; blk++)
    for (int i = 0; i < 2 && !status; i++) {
      const int la = (blk + i) % 2; /* each first in every other block */
      emb_store *s = emb_store_create_remote(plan, addrs, ns, &bench_ro, err, sizeof err);
      if (!s) {
        status = 1;
        break;
      }
      const int steps = 20;
      double w = 0, pw = 0, t0 = 0;
      for (int k = 0; k <= steps && !status; k++) {
        if (k == 1) t0 = sr_now(), w = pw = 0; /* step 0 warms the connections */
        step_ids(perm, (uint64_t)rows, k, (size_t)n, ids);
        const uint64_t *ip[1] = {ids}, *np[1] = {nids};
        size_t counts[1] = {(size_t)n};
        emb_idset set = {1, ip, counts}, next = {1, np, counts};
        float *op[1] = {out};
        const float *gp[1] = {grad};
        double a = sr_now();
        if (emb_store_lookup_begin(s, k, &set, op) || emb_store_lookup_wait(s)) status = 1;
        w += sr_now() - a;
        spin_us(work_us);
        step_ids(perm, (uint64_t)rows, k + 1, (size_t)n, nids);
        if (la && emb_store_prefetch(s, k + 1, &next)) status = 1;
        a = sr_now();
        if (emb_store_push(s, k, 0.0f, &set, gp)) status = 1;
        pw += sr_now() - a;
        spin_us(work_us);
      }
      if (status) fprintf(stderr, "shardrec bench rpc: %s\n", emb_store_errmsg(s));
      wait[la][blk] = w / steps;
      pwait[la][blk] = pw / steps;
      step[la][blk] = (sr_now() - t0) / steps;
      emb_store_destroy(s);
    }
  free(ids);
  free(nids);
  if (!status) {
    double w0 = sr_median(wait[0], 5), w1 = sr_median(wait[1], 5);
    double p0 = sr_median(pwait[0], 5), p1 = sr_median(pwait[1], 5);
    double s0 = sr_median(step[0], 5), s1 = sr_median(step[1], 5), rs[5];
    for (int blk = 0; blk < 5; blk++) rs[blk] = step[0][blk] / step[1][blk];
    printf("  dim %3d, work 2 x %4.0f us:  lookup wait %7.1f -> %7.1f us, push %7.1f -> %7.1f us, "
           "step %7.1f -> %7.1f us (x%.2f)\n", dim, work_us, w0 * 1e6, w1 * 1e6, p0 * 1e6,
           p1 * 1e6, s0 * 1e6, s1 * 1e6, sr_median(rs, 5));
  }
  servers_stop(plan, sv, ns);
  return status;
}

/* bench rpc --part tcp-peer: the plain TCP peer (tcp_main) on listen,
 * "listening on ADDR" on stdout, a thread per connection, until killed. */
static int tcp_peer_run(const char *listen_at) {
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (parse_addr(listen_at, &a) || ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) ||
      listen(ls, 8) || getsockname(ls, (struct sockaddr *)&a, &al)) {
    fprintf(stderr, "shardrec bench rpc: tcp-peer: cannot listen on %s\n", listen_at);
    return 1;
  }
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  printf("listening on %s:%d\n", host, ntohs(a.sin_port));
  fflush(stdout);
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t th;
    if (pthread_create(&th, NULL, tcp_main, (void *)(intptr_t)fd) == 0) pthread_detach(th);
    else close(fd);
  }
}

/* bench rpc --part client: Lookups and Pushes against one `shardrec serve`
 * of plan (one table, every row on it) at server: fills every row through
 * it and an in-process store alike, checks 3 windows of rows bit for bit
 * against the in-process store (exit 1 when one differs), then times
 * Lookup and Push of n ids beside plain TCP round trips of the same bytes
 * to tcp_peer (bench rpc --part tcp-peer) when given, and the 128-id
 * Lookup's latency. */
static int client_run(const char *plan_path, const char *server, const char *tcp_peer, long long n,
                      double secs) {
  char err[512];
  emb_plan *plan;
  if (emb_plan_load(plan_path, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec bench rpc: %s\n", err);
    return 1;
  }
  const int dim = plan->tables[0].dim;
  const long long rows = (long long)plan->tables[0].rows;
  const char *addrs[1] = {server};
  emb_store *rem = emb_store_create_remote(plan, addrs, 1, NULL, err, sizeof err);
  emb_store *loc = rem ? emb_store_create_local(plan, err, sizeof err) : NULL;
  uint64_t *perm = malloc((size_t)rows * sizeof *perm);
  float *out = malloc((size_t)n * (size_t)dim * sizeof *out);
  float *grad = malloc((size_t)n * (size_t)dim * sizeof *grad);
  sr_rng rng;
  sr_rng_init(&rng, 7, 0);
  for (long long i = 0; perm && i < rows; i++) perm[i] = (uint64_t)i;
  for (long long i = rows - 1; perm && i > 0; i--) {
    uint64_t j = sr_rng_below(&rng, (uint64_t)i + 1), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (size_t i = 0; grad && i < (size_t)n * (size_t)dim; i++)
    grad[i] = (float)sr_rng_uniform(&rng) - 0.5f;
  int status = 1;
  if (!rem || !loc) fprintf(stderr, "shardrec bench rpc: %s\n", err);
  else if (perm && out && grad && n * 2 <= rows && !fill_stores(rem, loc, perm, rows, n, grad)) {
    long long ok = check_rows(rem, loc, perm, rows, n, dim);
    if (ok > 0) {
      printf("client: %lld rows looked up from %s, identical to the in-process store's\n", ok,
             server);
      status = 0;
    }
  }
  for (int push = 0; push < 2 && !status; push++) {
    double cpu = 0, t = time_store(rem, push, perm, (uint64_t)rows, (size_t)n, out, grad, secs, &cpu);
    const size_t rb = (size_t)n * (size_t)dim * 4;
    double tt = tcp_peer ? time_tcp(tcp_peer, (size_t)n * 8 + (push ? rb : 0), push ? 16 : rb,
                                    secs, NULL, 0)
                         : -1;
    if (t < 0) {
      status = 1;
      break;
    }
    print_row(push ? "Push gRPC, 1 server" : "Lookup gRPC, 1 server", t, cpu, (size_t)n, dim);
    if (tt > 0) {
      print_row(push ? "Push plain TCP, same bytes" : "Lookup plain TCP, same bytes", tt, -1,
                (size_t)n, dim);
      printf("    (%s gRPC: %.1f%% of plain TCP's rate)\n", push ? "Push" : "Lookup", 100 * tt / t);
    }
  }
  if (!status && print_latency(rem, tcp_peer, perm, rows, dim)) status = 1;
  emb_store_destroy(rem);
  emb_store_destroy(loc);
  emb_plan_free(plan);
  free(perm);
  free(out);
  free(grad);
  return status;
}

/* The netns.sh beside this binary's source (build/tools/shardrec ->
 * tests/cluster/netns.sh of the tree it was built from), into path; 0 when
 * it exists. */
static int find_netns(char *path, size_t n) {
  char exe[SR_PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) return -1;
  exe[k] = 0;
  for (int up = 0; up < 4; up++) { /* .../build/tools/shardrec: 2 or 3 levels up */
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = 0;
    if (snprintf(path, n, "%s/tests/cluster/netns.sh", exe) < (int)n && access(path, X_OK) == 0)
      return 0;
  }
  return -1;
}

/* One dim of bench_netns: a one-table plan in dir, serve and the TCP peer
 * in namespace 1, the client in namespace 0, its output printed. */
static int netns_dim(const char *script, const char *tag, const char *dir, int dim,
                     long long rows, long long n, double secs) {
  char err[512], plan_path[SR_PATH_MAX], log[2][SR_PATH_MAX], exe[64], addr[2][64];
  uint64_t r1[1] = {(uint64_t)rows};
  emb_plan_params pp = {.n_tables = 1, .rows = r1, .dim = dim, .optim = {.kind = EMB_OPT_SGD},
                        .seed = 1, .n_shards = 1};
  emb_plan *plan;
  snprintf(exe, sizeof exe, "/proc/%d/exe", (int)getpid());
  if (sr_path_err(plan_path, sizeof plan_path, err, sizeof err, "%s/plan-%d.json", dir, dim) ||
      sr_path_err(log[0], sizeof log[0], err, sizeof err, "%s/serve-%d.log", dir, dim) ||
      sr_path_err(log[1], sizeof log[1], err, sizeof err, "%s/peer-%d.log", dir, dim) ||
      emb_plan_create(&pp, &plan, err, sizeof err) ||
      emb_plan_save(plan, plan_path, err, sizeof err)) {
    fprintf(stderr, "shardrec bench rpc: %s\n", err);
    return 1;
  }
  emb_plan_free(plan);
  char *sv[] = {(char *)script, "exec", "1", "--tag", (char *)tag, exe, "serve", "--plan",
                plan_path, "--shard", "0", "--listen", "198.18.0.2:0", "--insecure", NULL};
  char *tp[] = {(char *)script, "exec", "1", "--tag", (char *)tag, exe, "bench", "rpc", "--part",
                "tcp-peer", "--listen", "198.18.0.2:0", NULL};
  pid_t pid[2] = {spawn_listener(sv, log[0], addr[0], sizeof addr[0]),
                  spawn_listener(tp, log[1], addr[1], sizeof addr[1])};
  int status = 1;
  if (pid[0] < 0 || pid[1] < 0) {
    fprintf(stderr, "shardrec bench rpc: the server or TCP peer in the namespace did not start "
                    "(logs %s, %s)\n", log[0], log[1]);
  } else {
    char cmd[2 * SR_PATH_MAX + 512], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "'%s' exec 0 --tag %s %s bench rpc --part client --plan '%s' --server %s --tcp %s "
             "--ids %lld --seconds %g",
             script, tag, exe, plan_path, addr[0], addr[1], n, secs);
    status = run_capture(cmd, &out) == 0 ? 0 : 1;
    printf("dim %d over the link (server %s):\n%s", dim, addr[0], out ? out : "");
    free(out);
  }
  for (int k = 0; k < 2; k++)
    if (pid[k] > 0) {
      kill(pid[k], SIGTERM);
      waitpid(pid[k], NULL, 0);
    }
  return status;
}

/* bench rpc --part netns: the client above in namespace 0 against a
 * `shardrec serve --insecure` and a TCP peer in namespace 1 of a
 * netns.sh link (rate: tc's, or NULL), for each dim. Root only: skipped
 * with a message otherwise. */
static int bench_netns(const char *script, const char *rate, const int *dims, int n_dims,
                       long long rows, long long n, double secs) {
  char sbuf[SR_PATH_MAX];
  if (!script && find_netns(sbuf, sizeof sbuf) == 0) script = sbuf;
  if (geteuid() != 0 || !script) {
    printf("\nnamespace link: skipped (%s)\n",
           geteuid() ? "not root: network namespaces need root"
                     : "tests/cluster/netns.sh not found: give --netns PATH");
    return 0;
  }
  char tag[16], dir[] = "/tmp/shardrec-bench-netns-XXXXXX", cmd[SR_PATH_MAX + 128], *out = NULL;
  snprintf(tag, sizeof tag, "b%d", (int)(getpid() % 100000));
  snprintf(cmd, sizeof cmd, "'%s' up 2 --tag %s%s%s", script, tag, rate ? " --rate " : "",
           rate ? rate : "");
  if (!mkdtemp(dir) || run_capture(cmd, &out) != 0) {
    printf("\nnamespace link: skipped (netns.sh up failed: %s)\n", out ? out : "");
    free(out);
    return 0;
  }
  free(out);
  printf("\nnamespace link: client in %s-0 (198.18.0.1), server and TCP peer in %s-1 "
         "(198.18.0.2), veth pairs and a bridge%s%s\n",
         tag, tag, rate ? ", each link shaped to " : " (no rate limit)", rate ? rate : "");
  fflush(stdout);
  int status = 0;
  for (int di = 0; di < n_dims && !status; di++)
    status = netns_dim(script, tag, dir, dims[di], rows, n, secs);
  snprintf(cmd, sizeof cmd, "'%s' down --tag %s", script, tag);
  if (run_capture(cmd, &out) != 0) fprintf(stderr, "shardrec bench rpc: netns.sh down: %s\n", out);
  free(out);
  sr_rmtree(dir);
  return status;
}

/* "A,B,..." (at most 4 integers in lo..hi) into v[*n]; 0, or 2 with the
 * flag error printed. */
static int int_list(const char *flag, const char *arg, int lo, int hi, int *v, int *n) {
  uint64_t u[4];
  if (cli_u64_list(CMD, flag, arg, ",", (uint64_t)lo, (uint64_t)hi, NULL, u, 4, n)) return 2;
  for (int i = 0; i < *n; i++) v[i] = (int)u[i];
  return 0;
}

/* bench rpc's flags. */
typedef struct rpc_args {
  long long rows, n, train_rows, train_steps, train_batch, train_rounds;
  const char *part;
  double secs;
  int dims[4], n_dims, nsrv[4], n_srv;
  const char *plan_path, *server, *tcp_peer, *listen_at, *netns, *rate;
} rpc_args;

static void rpc_usage(void) {
  printf("usage: shardrec bench rpc [--part all|lookup|train|netns|connections|lookahead|pinned]\n"
         "       [--rows N (262144)] [--ids N (4096)]\n"
         "       [--dims D,... (16,128)] [--servers K,... (1,4)] [--server-threads N (1)] [--seconds S (1)]\n"
         "       [--train-rows N (100000)] [--train-steps N (400)] [--train-batch N (128)]\n"
         "       [--train-rounds N (%d, at most %d)]\n"
         "       [--rpc-connections N (%d)] [--rpc-chunk-kb N (0: no chunks but the servers' limits)]\n"
         "       [--netns PATH (tests/cluster/netns.sh of the source tree)] [--rate R (tc's: 1gbit)]\n"
         "       shardrec bench rpc --part client --plan FILE --server ADDR [--tcp ADDR] [--ids N]\n"
         "       shardrec bench rpc --part tcp-peer --listen IP:PORT\n",
         TRAIN_ROUNDS_DEFAULT, TRAIN_ROUNDS_MAX, RPC_CONNECTIONS_DEFAULT);
}

static int rpc_part_check(const char *p) {
  static const char *const parts[] = {"all", "lookup", "train", "connections", "lookahead",
                                      "pinned", "netns", "client", "tcp-peer"};
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
    if (!strcmp(p, parts[i])) return 0;
  fprintf(stderr, "shardrec bench rpc: --part: '%s' is not all, lookup, train, netns, "
                  "connections, lookahead, pinned, client or tcp-peer\n", p);
  return 2;
}

/* One flag (c, its optarg) into a (and bench_ro, server_threads). 0 or 2. */
static int rpc_arg(rpc_args *a, int c, const char *arg) {
  long long v;
  switch (c) {
    case 'r': return cli_int(CMD, "--rows", arg, 65536, 1LL << 26, &a->rows) ? 2 : 0;
    case 'n': return cli_int(CMD, "--ids", arg, 1, 1 << 20, &a->n) ? 2 : 0;
    case 's': return cli_double(CMD, "--seconds", arg, 0.05, 60, &a->secs) ? 2 : 0;
    case 'C':
      if (cli_flag(CMD, "--rpc-connections", arg, &v)) return 2;
      bench_ro.connections = (int)v;
      return 0;
    case 'K': /* 0: no chunks (one call per server, as the server's limits allow) */
      if (cli_int(CMD, "--rpc-chunk-kb", arg, 0, 1 << 20, &v)) return 2;
      bench_ro.chunk_bytes = v ? (size_t)v << 10 : SIZE_MAX;
      return 0;
    case 'd': return int_list("--dims", arg, 1, 1024, a->dims, &a->n_dims) ? 2 : 0;
    case 'k': return int_list("--servers", arg, 1, 4, a->nsrv, &a->n_srv) ? 2 : 0;
    case 'P': a->plan_path = arg; return 0;
    case 'A': a->server = arg; return 0;
    case 'T': a->tcp_peer = arg; return 0;
    case 'L': a->listen_at = arg; return 0;
    case 'N': a->netns = arg; return 0;
    case 'Q': a->rate = arg; return 0;
    case 'W':
      if (cli_int(CMD, "--server-threads", arg, 1, 64, &v)) return 2;
      server_threads = (int)v;
      return 0;
    case 'R': return cli_int(CMD, "--train-rows", arg, 10000, 1LL << 32, &a->train_rows) ? 2 : 0;
    case 'S': return cli_int(CMD, "--train-steps", arg, 1, 1 << 24, &a->train_steps) ? 2 : 0;
    case 'B': return cli_int(CMD, "--train-batch", arg, 1, 1 << 20, &a->train_batch) ? 2 : 0;
    case 'U':
      return cli_int(CMD, "--train-rounds", arg, 1, TRAIN_ROUNDS_MAX, &a->train_rounds) ? 2 : 0;
    case 'p':
      a->part = arg;
      return rpc_part_check(arg);
  }
  return 2;
}

/* The flags into a. 0, 1 (--help printed) or 2 (a bad flag, said). */
static int rpc_args_parse(int argc, char **argv, rpc_args *a) {
  *a = (rpc_args){.rows = 262144, .n = 4096, .train_rows = 100000, .train_steps = 400,
                  .train_batch = 128, .train_rounds = TRAIN_ROUNDS_DEFAULT, .part = "all", .secs = 1.0,
                  .dims = {16, 128}, .n_dims = 2, .nsrv = {1, 4}, .n_srv = 2};
  static const struct option lo[] = {{"rows", required_argument, 0, 'r'},
                                     {"train-rows", required_argument, 0, 'R'},
                                     {"train-steps", required_argument, 0, 'S'},
                                     {"train-batch", required_argument, 0, 'B'},
                                     {"train-rounds", required_argument, 0, 'U'},
                                     {"part", required_argument, 0, 'p'},
                                     {"ids", required_argument, 0, 'n'},
                                     {"seconds", required_argument, 0, 's'},
                                     {"rpc-connections", required_argument, 0, 'C'},
                                     {"rpc-chunk-kb", required_argument, 0, 'K'},
                                     {"dims", required_argument, 0, 'd'},
                                     {"plan", required_argument, 0, 'P'},
                                     {"server", required_argument, 0, 'A'},
                                     {"tcp", required_argument, 0, 'T'},
                                     {"listen", required_argument, 0, 'L'},
                                     {"netns", required_argument, 0, 'N'},
                                     {"rate", required_argument, 0, 'Q'},
                                     {"server-threads", required_argument, 0, 'W'},
                                     {"servers", required_argument, 0, 'k'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    if (c == 'h') {
      rpc_usage();
      return 1;
    }
    if (c == ':' || c == '?') {
      cli_bad_option(CMD, c, argv[optind - 1]);
      return 2;
    }
    if (rpc_arg(a, c, optarg)) return 2;
  }
  return 0;
}

/* The ids 0..rows-1 in an order drawn from seed 42 (malloc'd; NULL when out of memory). */
static uint64_t *perm_make(long long rows) {
  uint64_t *perm = malloc((size_t)rows * sizeof *perm);
  if (!perm) return NULL;
  sr_rng rng;
  sr_rng_init(&rng, 42, 0);
  for (long long i = 0; i < rows; i++) perm[i] = (uint64_t)i;
  for (long long i = rows - 1; i > 0; i--) {
    uint64_t j = sr_rng_below(&rng, (uint64_t)i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  return perm;
}

/* --part connections, pinned or lookahead: one run per dim (and per server
 * count or work size), each with its own row buffers. */
static int rpc_sweeps(const rpc_args *a, uint64_t *perm) {
  const long long n = a->n;
  int status = 0;
  if (!strcmp(a->part, "connections"))
    printf("remote store settings interleaved (connections per server, chunk size), %lld ids a "
           "step; speed-ups against 1 connection and no chunks in the same round\n", n);
  else if (!strcmp(a->part, "pinned"))
    printf("Lookups of %lld ids from a shard-store server (every row cached), answered from the "
           "store's memory (pinned) and by a gather, interleaved; medians of 15 rounds\n", n);
  else
    printf("a step's store calls against 2 server threads: lookup, work, push, work; without -> "
           "with the next step's ids handed ahead before the push (medians of 5 blocks of 20 "
           "steps, each way first in every other block, %lld ids a step)\n", n);
  const double work[2] = {500, 2000};
  const int inner = !strcmp(a->part, "connections") ? a->n_srv : !strcmp(a->part, "pinned") ? 1 : 2;
  for (int di = 0; di < a->n_dims && !status; di++)
    for (int k = 0; k < inner && !status; k++) {
      float *out = malloc((size_t)n * (size_t)a->dims[di] * sizeof *out);
      float *grad = calloc((size_t)n * (size_t)a->dims[di], sizeof *grad);
      if (!out || !grad)
        status = 1;
      else if (!strcmp(a->part, "connections"))
        status = sweep_one(a->dims[di], a->nsrv[k], a->rows, n, perm, grad, out, 15);
      else if (!strcmp(a->part, "pinned"))
        status = pinned_one(a->dims[di], a->rows, n, perm, grad, out, 15);
      else
        status = lookahead_one(a->dims[di], a->rows, n, perm, grad, out, work[k]);
      free(out);
      free(grad);
    }
  return status;
}

/* --part lookup (and all's first half): Lookups and Pushes per dim and
 * server count beside plain TCP moving the same bytes. */
static int rpc_lookups(const rpc_args *a, uint64_t *perm) {
  const long long n = a->n;
  sr_rng rng;
  sr_rng_init(&rng, 42, 1);
  int status = 0;
  for (int di = 0; di < a->n_dims && !status; di++) {
    const int dim = a->dims[di];
    float *out = malloc((size_t)n * (size_t)dim * sizeof *out);
    float *grad = malloc((size_t)n * (size_t)dim * sizeof *grad);
    if (!out || !grad) {
      free(out);
      free(grad);
      return 1;
    }
    for (size_t i = 0; i < (size_t)n * (size_t)dim; i++) grad[i] = (float)sr_rng_uniform(&rng) - 0.5f;
    printf("dim %d (%zu bytes a row, %.2f MB of rows a step)\n", dim, (size_t)dim * 4,
           (double)n * dim * 4 / 1e6);
    double first[2] = {0, 0};
    for (int si = 0; si < a->n_srv && !status; si++)
      status = bench_servers(dim, a->nsrv[si], si, a->rows, n, perm, grad, out, a->secs, first);
    free(out);
    free(grad);
  }
  return status;
}

int bench_rpc(int argc, char **argv) {
  rpc_args a;
  int rc = rpc_args_parse(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  if (!strcmp(a.part, "tcp-peer")) {
    if (!a.listen_at) {
      fprintf(stderr, "shardrec bench rpc: --part tcp-peer needs --listen IP:PORT\n");
      return 2;
    }
    return tcp_peer_run(a.listen_at);
  }
  if (!strcmp(a.part, "client")) {
    if (!a.plan_path || !a.server) {
      fprintf(stderr, "shardrec bench rpc: --part client needs --plan FILE and --server ADDR\n");
      return 2;
    }
    return client_run(a.plan_path, a.server, a.tcp_peer, a.n, a.secs);
  }
  if (!strcmp(a.part, "train"))
    return bench_train_all(a.train_rows, a.train_steps, a.train_batch, (int)a.train_rounds);
  if (!strcmp(a.part, "netns")) return bench_netns(a.netns, a.rate, a.dims, a.n_dims, 65536, a.n, a.secs);
  if (a.n * 2 > a.rows) {
    fprintf(stderr, "shardrec bench rpc: --ids must be at most half of --rows\n");
    return 2;
  }
  printf("bench rpc: Lookups and Pushes of %lld unique random ids per step, a table of %lld rows (filled\n"
         "with pushed, random rows); medians of 5 rounds, each a run of %g s of gRPC, the in-process\n"
         "store and plain TCP in turn (a ratio: the median of the rounds' own); servers are threads\n"
         "of this process on 127.0.0.1\n",
         a.n, a.rows, a.secs);
  uint64_t *perm = perm_make(a.rows);
  if (!perm) {
    fprintf(stderr, "shardrec bench rpc: out of memory\n");
    return 1;
  }
  int status;
  if (!strcmp(a.part, "connections") || !strcmp(a.part, "pinned") || !strcmp(a.part, "lookahead"))
    status = rpc_sweeps(&a, perm);
  else
    status = rpc_lookups(&a, perm);
  free(perm);
  if (!status && !strcmp(a.part, "all"))
    status = bench_netns(a.netns, a.rate, a.dims, a.n_dims, a.rows < 65536 ? a.rows : 65536, a.n, a.secs);
  if (!status && !strcmp(a.part, "all"))
    status = bench_train_all(a.train_rows, a.train_steps, a.train_batch, (int)a.train_rounds);
  return status;
}
