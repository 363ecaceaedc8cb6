/* The remote store's chunked calls and look-ahead against real servers.
 *
 * Chunks: Lookups and Pushes cut into small chunks in flight at once over
 * several connections per server give exactly the rows of the in-process
 * store and of a store that sends one call per server, also when a
 * connection is cut in the middle of a chunk (a TCP relay in this process
 * between client and server closes its first connection after a set
 * number of bytes; the chunks on it fail UNAVAILABLE and the store's retry
 * sends them again). The relay counts the TCP connections it was given.
 *
 * Look-ahead (emb_store_prefetch): the step sequence a trainer with
 * --prefetch-depth D runs (steps t+1..t+D handed ahead, then step t's
 * lookup and push), at depth 1 and 2 (one in 8 KiB chunks, the other in
 * one call per server), against 2 in-memory servers, 2
 * shard-store servers (--data-dir, a cache smaller than a step's rows) and
 * as a 2-rank sync job (two client stores as the two ranks): every row
 * looked up is bit for bit the in-process store's, whose pushes are the
 * same (the ranks' gradients summed in rank order, as the servers sum
 * them). Steps' ids overlap, so a row read before the previous step's push
 * was applied would differ. One step's lookup asks for other ids than were
 * prefetched, one prefetched step is never looked up; the servers report
 * the look-aheads handed to their stores (Stats.prefetched), and one rank's
 * pushes that carried the next step's Lookup (Stats.push_lookup_calls). A prefetched
 * Lookup that fails (its deadline passed while the servers held it) is read
 * again by its step's lookup. */
#include <check.h>

#include "tests/check_main.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>

#include "common/status.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/rpc/calls.h"
#include "tests/support/servers.h"

#define NT 2
#define NS 2

static char *dir;
static char plan_path[512];
static emb_plan *plan;
static test_server srv[NS];
static int dim;

static void plan_make(int d, uint64_t rows0) {
  dim = d;
  dir = tmpdir_make("test");
  snprintf(plan_path, sizeof plan_path, "%s/plan.json", dir);
  uint64_t rows[NT] = {rows0, EMB_ROWS_UNBOUNDED};
  emb_plan_params pp = {.n_tables = NT, .rows = rows, .dim = d,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 9,
                        .n_shards = NS, .row_wise = 1};
  char err[512];
  emb_plan *p;
  ck_assert_msg(emb_plan_create(&pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_save(p, plan_path, err, sizeof err) == 0, "%s", err);
  emb_plan_free(p);
  ck_assert_msg(emb_plan_load(plan_path, &plan, err, sizeof err) == 0, "%s", err);
}

/* Shard k's server; extra: more serve flags. */
static void start(int k, const char *extra) {
  char args[1600], log[600];
  snprintf(args, sizeof args, "--plan '%s' --shard %d %s", plan_path, k, extra);
  snprintf(log, sizeof log, "%s/srv%d.log", dir, k);
  server_start(&srv[k], args, log);
}

static void stop_all(void) {
  for (int k = 0; k < NS; k++) {
    int st = server_stop(&srv[k]);
    ck_assert_msg(st == 0, "server %d exited with %d (log %s/srv%d.log)", st, k, dir, k);
  }
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

static emb_store *remote(const char *const *addr, int rank, int world, const char *job,
                         int conns, size_t chunk) {
  rpc_client_opts o = {.deadline_s = 60, .max_tries = 12, .rank = rank, .world_size = world,
                       .job_id = job, .connections = conns, .chunk_bytes = chunk};
  char err[512];
  emb_store *s = emb_store_create_remote(plan, addr, NS, &o, err, sizeof err);
  ck_assert_msg(s != NULL, "%s", err);
  return s;
}

/* ---- A TCP relay that cuts its first connection after cut_after bytes
 * from the client (what it has of the cut chunk never reaches the server). */

#define RELAY_MAX 32
typedef struct {
  int ls, up_port;
  size_t cut_after;
  volatile int stop;
  int accepted, cut; /* connections taken, connections cut (read after join) */
  pthread_t th;
} relay;

static int relay_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Move what is readable on fd[from] to fd[1-from]; up to limit bytes
 * (SIZE_MAX: any). The bytes moved, or -1 when the pair is done. */
static ssize_t relay_move(int *fd, int from, size_t limit) {
  char buf[16384];
  size_t want = limit < sizeof buf ? limit : sizeof buf;
  ssize_t n = read(fd[from], buf, want);
  if (n <= 0) return -1;
  for (ssize_t at = 0; at < n;) {
    ssize_t w = send(fd[1 - from], buf + at, (size_t)(n - at), MSG_NOSIGNAL);
    if (w <= 0) return -1;
    at += w;
  }
  return n;
}

static void *relay_main(void *arg) {
  relay *r = arg;
  int fds[RELAY_MAX][2], n = 0;
  size_t sent0 = 0; /* client bytes relayed on the first connection */
  while (!r->stop) {
    struct pollfd p[1 + 2 * RELAY_MAX];
    p[0] = (struct pollfd){r->ls, POLLIN, 0};
    for (int i = 0; i < n; i++) {
      p[1 + 2 * i] = (struct pollfd){fds[i][0], fds[i][0] >= 0 ? POLLIN : 0, 0};
      p[2 + 2 * i] = (struct pollfd){fds[i][1], fds[i][1] >= 0 ? POLLIN : 0, 0};
    }
    int polled = n; /* a connection accepted below has no revents this round */
    if (poll(p, (nfds_t)(1 + 2 * polled), 50) <= 0) continue;
    if ((p[0].revents & POLLIN) && n < RELAY_MAX) {
      int c = accept(r->ls, NULL, NULL), u = c >= 0 ? relay_connect(r->up_port) : -1;
      if (c >= 0 && u >= 0) {
        fds[n][0] = c, fds[n][1] = u;
        n++;
        r->accepted++;
      } else if (c >= 0) {
        close(c);
      }
    }
    for (int i = 0; i < polled; i++)
      for (int side = 0; side < 2; side++) {
        if (fds[i][0] < 0 || !(p[1 + 2 * i + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int cutting = i == 0 && side == 0 && !r->cut;
        ssize_t m = relay_move(fds[i], side, cutting ? r->cut_after - sent0 : SIZE_MAX);
        if (m > 0 && cutting) sent0 += (size_t)m;
        if (m < 0 || (cutting && sent0 >= r->cut_after)) {
          if (m >= 0) r->cut++;
          close(fds[i][0]);
          close(fds[i][1]);
          fds[i][0] = fds[i][1] = -1;
        }
      }
  }
  for (int i = 0; i < n; i++)
    if (fds[i][0] >= 0) close(fds[i][0]), close(fds[i][1]);
  return NULL;
}

/* A relay to 127.0.0.1:up_port; its address into addr. */
static void relay_start(relay *r, const char *up, size_t cut_after, char *addr, size_t alen) {
  memset(r, 0, sizeof *r);
  r->cut_after = cut_after;
  const char *colon = strrchr(up, ':');
  ck_assert_ptr_nonnull(colon);
  r->up_port = atoi(colon + 1);
  r->ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  ck_assert(r->ls >= 0 && !bind(r->ls, (struct sockaddr *)&a, sizeof a) && !listen(r->ls, 64) &&
            !getsockname(r->ls, (struct sockaddr *)&a, &al));
  snprintf(addr, alen, "127.0.0.1:%d", ntohs(a.sin_port));
  ck_assert_int_eq(pthread_create(&r->th, NULL, relay_main, r), 0);
}

static void relay_stop(relay *r) {
  r->stop = 1;
  pthread_join(r->th, NULL);
  close(r->ls);
}

/* ---- Steps. */

#define MAXN 3000

/* Step st's ids of table t: n distinct ids; consecutive steps share most. */
static void step_ids(int st, size_t n, uint64_t ids[NT][MAXN]) {
  for (size_t i = 0; i < n; i++) {
    ids[0][i] = (uint64_t)((i * 7 + (size_t)st * 31) % 4000);
    ids[1][i] = 0x9e3779b97f4a7c15ULL * ((i * 3 + (size_t)st * 13) % 5000 + 1);
  }
}

static emb_idset idset(uint64_t ids[NT][MAXN], size_t n, const uint64_t *ip[NT], size_t c[NT]) {
  for (int t = 0; t < NT; t++) ip[t] = ids[t], c[t] = n;
  emb_idset s = {NT, ip, c};
  return s;
}

static void lookup(emb_store *s, int64_t step, const emb_idset *set, float *out[NT]) {
  int rc = emb_store_lookup_begin(s, step, set, out);
  if (!rc) rc = emb_store_lookup_wait(s);
  ck_assert_msg(rc == 0, "lookup of step %lld: %s", (long long)step, emb_store_errmsg(s));
}

/* Rank r's gradient of row i at step st, from the row's value. */
static void grads_of(const float *rows, size_t n, int st, int r, float *g) {
  for (size_t i = 0; i < n * (size_t)dim; i++)
    g[i] = rows[i] * (0.25f + 0.125f * (float)r) + (float)((i + (size_t)st) % 7) * 0.01f - 0.03f;
}

static float *buf(size_t n) {
  float *b = calloc(n * (size_t)dim, sizeof *b);
  ck_assert_ptr_nonnull(b);
  return b;
}

/* A prefetch_only Lookup straight to a server: answered OK at once with
 * no rows and the server's incarnation; one of a bad table is refused as
 * a Lookup would be. */
START_TEST(test_prefetch_only_lookup) {
  plan_make(16, 4000);
  start(0, "");
  start(1, "");
  char fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  uint64_t ids[3] = {2, 4, 6}; /* shard 0's rows of a row-wise plan */
  for (int bad = 0; bad < 2; bad++) {
    Shardrec__V1__RequestHeader h;
    calls_header(&h, fp, "job-hint", 5, 0, 2, 0); /* a Lookup of it would park */
    Shardrec__V1__TableIds ti = SHARDREC__V1__TABLE_IDS__INIT, *tp[1] = {&ti};
    ti.table_id = bad ? 999 : plan->tables[0].table_id;
    ti.n_ids = 3;
    ti.ids = ids;
    Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
    q.header = &h;
    q.n_tables = 1;
    q.tables = tp;
    q.prefetch_only = 1;
    uint8_t b[256], *resp = NULL;
    size_t len = shardrec__v1__lookup_request__pack(&q, b), rlen = 0;
    char msg[256];
    int st = rpc_call_once(srv[0].addr, NULL, RPC_LOOKUP, b, len, 10, &resp, &rlen, msg, sizeof msg);
    if (bad) {
      ck_assert_msg(st == RPC_INVALID_ARGUMENT, "%d %s", st, msg);
      continue;
    }
    ck_assert_msg(st == RPC_OK, "%d %s", st, msg);
    Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, rlen, resp);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->n_tables, 0);
    ck_assert_uint_ne(a->incarnation, 0);
    shardrec__v1__lookup_response__free_unpacked(a, NULL);
    free(resp);
  }
  /* Nothing was looked up, and the job's steps were not started by it. */
  Shardrec__V1__StatsResponse *s0 = calls_stats(srv[0].addr);
  ck_assert_uint_eq(s0->rows_looked_up, 0);
  ck_assert_uint_eq(s0->jobs, 0);
  shardrec__v1__stats_response__free_unpacked(s0, NULL);
  stop_all();
}
END_TEST

START_TEST(test_chunks_over_connections) {
  plan_make(32, 4000);
  start(0, "");
  start(1, "");
  relay rl;
  char raddr[64];
  /* 160 KiB of client bytes: past the handshakes, inside the first steps'
   * chunks (16 KiB each, 4 connections). */
  relay_start(&rl, srv[0].addr, 160 << 10, raddr, sizeof raddr);
  const char *via[NS] = {raddr, srv[1].addr}, *direct[NS] = {srv[0].addr, srv[1].addr};
  emb_store *ch = remote(via, 0, 1, "job-chunks", 4, 16 << 10);
  emb_store *one = remote(direct, 0, 1, "job-one", 1, SIZE_MAX);
  char err[512];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err);
  ck_assert_ptr_nonnull(loc);
  static uint64_t ids[NT][MAXN];
  const size_t n = MAXN;
  float *a[NT], *b[NT], *c[NT], *g[NT];
  for (int t = 0; t < NT; t++) a[t] = buf(n), b[t] = buf(n), c[t] = buf(n), g[t] = buf(n);
  const uint64_t *ip[NT];
  size_t cnt[NT];
  /* The two remote stores share the servers: each job pushes the same
   * gradients, so each row is updated twice a step; the local store too. */
  for (int st = 0; st < 6; st++) {
    step_ids(st, n, ids);
    emb_idset set = idset(ids, n, ip, cnt);
    lookup(loc, st, &set, a);
    lookup(ch, st, &set, b);
    lookup(one, st, &set, c);
    for (int t = 0; t < NT; t++) {
      ck_assert_msg(!memcmp(a[t], b[t], n * (size_t)dim * sizeof(float)),
                    "step %d table %d: chunked rows differ from the in-process store's", st, t);
      ck_assert_msg(!memcmp(a[t], c[t], n * (size_t)dim * sizeof(float)),
                    "step %d table %d: one-call rows differ from the in-process store's", st, t);
      grads_of(a[t], n, st, 0, g[t]);
    }
    const float *gp[NT] = {g[0], g[1]};
    ck_assert_msg(emb_store_push(ch, st, 0.05f, &set, gp) == 0, "%s", emb_store_errmsg(ch));
    ck_assert_int_eq(emb_store_push(loc, st, 0.05f, &set, gp), 0);
    ck_assert_msg(emb_store_push(one, st, 0.05f, &set, gp) == 0, "%s", emb_store_errmsg(one));
    ck_assert_int_eq(emb_store_push(loc, st, 0.05f, &set, gp), 0);
  }
  ck_assert_int_eq(rpc_remote_lost(ch), 0);
  /* Shard 0 was reached over 4 TCP connections, one of which was cut in a
   * chunk and made again: its chunks were sent again. */
  emb_store_destroy(ch);
  relay_stop(&rl);
  ck_assert_msg(rl.cut == 1, "the relay cut %d connections (not the first's %zu bytes reached?)",
                rl.cut, rl.cut_after);
  ck_assert_msg(rl.accepted >= 5, "%d TCP connections through the relay; want 4 and a new one",
                rl.accepted);
  /* The push of a step went as parts: shard 0 took many more Push calls
   * than the 12 pushes the two stores made. */
  Shardrec__V1__StatsResponse *s0 = calls_stats(srv[0].addr);
  ck_assert_msg(s0->push_calls >= 6 * 10, "%llu Push calls: the pushes were not chunked",
                (unsigned long long)s0->push_calls);
  shardrec__v1__stats_response__free_unpacked(s0, NULL);
  for (int t = 0; t < NT; t++) free(a[t]), free(b[t]), free(c[t]), free(g[t]);
  emb_store_destroy(one);
  emb_store_destroy(loc);
  stop_all();
}
END_TEST

/* The trainer's order at look-ahead depth: at step t the ids of steps up
 * to t + depth are handed ahead (each once), then step t is looked up and
 * pushed by each of the world ranks (the local store takes their summed
 * gradients). Step 7's lookup asks for other ids than prefetched; with
 * skip, step 9 is prefetched but never looked up. */
static void run_lookahead(const char *const *addr, int depth, int world, int skip,
                          const char *job, size_t chunk) {
  char err[512];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err), *rem[2];
  ck_assert_ptr_nonnull(loc);
  for (int r = 0; r < world; r++)
    rem[r] = remote(addr, r, world, job, 2, chunk);
  const size_t n = 3000;
  static uint64_t ids[NT][MAXN], pids[NT][MAXN];
  float *a[NT], *b[NT], *g[2][NT], *sum[NT];
  for (int t = 0; t < NT; t++) {
    a[t] = buf(n), b[t] = buf(n), sum[t] = buf(n);
    g[0][t] = buf(n), g[1][t] = buf(n);
  }
  const int steps = 14;
  int ahead = -1; /* the last step handed ahead */
  for (int st = 0; st < steps; st++) {
    if (skip && st == 9) continue;
    for (int u = ahead + 1; u <= st + depth && u < steps; u++) {
      if (u <= st) continue; /* already looked up or now */
      step_ids(u, n, pids);
      const uint64_t *ip[NT];
      size_t c[NT];
      emb_idset ps = idset(pids, n, ip, c);
      for (int r = 0; r < world; r++)
        ck_assert_msg(emb_store_prefetch(rem[r], u, &ps) == 0, "prefetch of step %d: %s", u,
                      emb_store_errmsg(rem[r]));
      ahead = u;
    }
    step_ids(st, n, ids);
    if (st == 7) { /* not what was prefetched: one id of each table replaced */
      uint64_t v = 0;
      for (int dup = 1; dup; v++) {
        dup = 0;
        for (size_t i = 0; i < n && !dup; i++) dup = ids[0][i] == v;
      }
      ids[0][3] = v - 1, ids[1][5] = 77;
    }
    const uint64_t *ip[NT];
    size_t c[NT];
    emb_idset set = idset(ids, n, ip, c);
    lookup(loc, st, &set, a);
    /* Every rank's lookup begins before any waits, as the ranks' do. */
    for (int r = 0; r < world; r++) {
      ck_assert_msg(emb_store_lookup_begin(rem[r], st, &set, b) == 0, "%s",
                    emb_store_errmsg(rem[r]));
      ck_assert_msg(emb_store_lookup_wait(rem[r]) == 0, "rank %d lookup of step %d: %s", r, st,
                    emb_store_errmsg(rem[r]));
      for (int t = 0; t < NT; t++)
        ck_assert_msg(!memcmp(a[t], b[t], n * (size_t)dim * sizeof(float)),
                      "depth %d, %d rank(s): step %d table %d: rank %d's rows differ from the "
                      "in-process store's", depth, world, st, t, r);
    }
    for (int t = 0; t < NT; t++) {
      for (int r = 0; r < world; r++) grads_of(a[t], n, st, r, g[r][t]);
      memcpy(sum[t], g[0][t], n * (size_t)dim * sizeof(float));
      for (int r = 1; r < world; r++)
        for (size_t i = 0; i < n * (size_t)dim; i++) sum[t][i] += g[r][t][i];
    }
    for (int r = 0; r < world; r++) {
      const float *gp[NT] = {g[r][0], g[r][1]};
      ck_assert_msg(emb_store_push(rem[r], st, 0.05f, &set, gp) == 0, "rank %d push of step %d: %s",
                    r, st, emb_store_errmsg(rem[r]));
    }
    const float *sp[NT] = {sum[0], sum[1]};
    ck_assert_int_eq(emb_store_push(loc, st, 0.05f, &set, sp), 0);
  }
  if (world > 1) {
    /* A job that ends with a step handed ahead whose Lookups the servers
     * hold (step 15 waits for a step 14 that never comes): destroy detaches
     * the rank, then cancels them, which is not a rank's death. */
    step_ids(15, n, pids);
    const uint64_t *ip[NT];
    size_t c[NT];
    emb_idset ps = idset(pids, n, ip, c);
    for (int r = 0; r < world; r++)
      ck_assert_msg(emb_store_prefetch(rem[r], 15, &ps) == 0, "%s", emb_store_errmsg(rem[r]));
    for (int k = 0; k < NS; k++) calls_wait_parked(addr[k], (uint64_t)world, 0, 60);
  }
  for (int r = 0; r < world; r++) emb_store_destroy(rem[r]);
  /* The cancellations reach each server on its own time: once it holds no
   * Lookup, it has heard every one, and dropped no job for them. */
  for (int k = 0; world > 1 && k < NS; k++) {
    const double t0 = test_now();
    for (;;) {
      Shardrec__V1__StatsResponse *a = calls_stats(addr[k]);
      const uint64_t dropped = a->dropped_jobs, parked = a->parked_lookups;
      shardrec__v1__stats_response__free_unpacked(a, NULL);
      ck_assert_msg(dropped == 0, "shard %d: %llu job(s) dropped", k, (unsigned long long)dropped);
      if (!parked) break;
      ck_assert_msg(test_now() - t0 < 60, "shard %d: %llu Lookup(s) still parked after 60 s", k,
                    (unsigned long long)parked);
      usleep(10 * 1000);
    }
  }
  emb_store_destroy(loc);
  for (int t = 0; t < NT; t++) free(a[t]), free(b[t]), free(sum[t]), free(g[0][t]), free(g[1][t]);
}

/* Depth 1 and 2, each against 2 fresh servers started with serve_extra
 * (data: with "--data-dir DIR --cache-rows 1024" of its own under dir). */
static void lookahead_case(const char *serve_extra, int data, int world, int skip) {
  plan_make(16, 4000);
  for (int depth = 1; depth <= 2; depth++) {
    char extra[800];
    if (data)
      snprintf(extra, sizeof extra, "--data-dir '%s/data-d%d' --cache-rows 1024 %s", dir, depth,
               serve_extra);
    else
      snprintf(extra, sizeof extra, "%s", serve_extra);
    start(0, extra);
    start(1, extra);
    const char *addr[NS] = {srv[0].addr, srv[1].addr};
    /* In 8 KiB chunks at one depth, one call per server at the other. */
    const size_t chunk = (depth == 1) != data ? 8 << 10 : 0;
    run_lookahead(addr, depth, world, skip, "job-lookahead", chunk);
    /* The steps were handed ahead to both servers' stores, where they read
     * ahead (a store without the op is handed nothing). */
    for (int k = 0; k < NS; k++) {
      Shardrec__V1__StatsResponse *a = calls_stats(srv[k].addr);
      if (a->looks_ahead)
        ck_assert_msg(a->prefetched >= 10, "depth %d: shard %d's store was handed %llu "
                      "look-aheads for 13 steps", depth, k, (unsigned long long)a->prefetched);
      else
        ck_assert_uint_eq(a->prefetched, 0);
      /* One rank, one call per server: each of the 13 pushes but the last
       * carried the next step's Lookup (PushLookup), whose rows the checks
       * above found the in-process store's. In chunks, or several ranks:
       * never (a part of a push, or another rank's, is not in yet). */
      const int fused = world == 1 && !chunk;
      ck_assert_msg(a->push_lookup_calls == (fused ? (skip ? 12u : 13u) : 0u) && (!fused || a->push_calls == 1),
                    "depth %d, %d rank(s): shard %d: %llu PushLookup and %llu Push calls", depth,
                    world, k, (unsigned long long)a->push_lookup_calls,
                    (unsigned long long)a->push_calls);
      shardrec__v1__stats_response__free_unpacked(a, NULL);
      int st = server_stop(&srv[k]);
      ck_assert_msg(st == 0, "server %d exited with %d (log %s/srv%d.log)", k, st, dir, k);
    }
  }
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

START_TEST(test_lookahead_memory) { lookahead_case("", 0, 1, 1); }
END_TEST

/* A cache of 1024 rows a server: fewer than a step's 1500 rows of each
 * table there, so rows read ahead are evicted, written back and read again
 * in between. */
START_TEST(test_lookahead_shard_store) { lookahead_case("", 1, 1, 1); }
END_TEST

START_TEST(test_lookahead_two_ranks) { lookahead_case("--pending-timeout 120", 0, 2, 0); }
END_TEST

START_TEST(test_lookahead_two_ranks_shard_store) { lookahead_case("--pending-timeout 120", 1, 2, 0); }
END_TEST

/* A prefetched Lookup that fails is read again by its step's lookup: in a
 * 2-rank job rank 0 hands step 2 ahead after step 0, the servers hold its
 * Lookups for step 1, which does not come before their deadline (8 s): they
 * are answered DEADLINE_EXCEEDED. Step 2's lookup then reads afresh and
 * gets the in-process store's rows. */
START_TEST(test_lookahead_failed_is_redone) {
  plan_make(16, 4000);
  start(0, "");
  start(1, "");
  const char *addr[NS] = {srv[0].addr, srv[1].addr};
  char err[512];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err), *rem[2];
  ck_assert_ptr_nonnull(loc);
  for (int r = 0; r < 2; r++) {
    rpc_client_opts o = {.deadline_s = 8, .max_tries = 4, .rank = r, .world_size = 2,
                         .job_id = "job-redo"};
    rem[r] = emb_store_create_remote(plan, addr, NS, &o, err, sizeof err);
    ck_assert_msg(rem[r] != NULL, "%s", err);
  }
  const size_t n = 50;
  static uint64_t ids[NT][MAXN];
  float *a[NT], *b[NT], *g[NT];
  for (int t = 0; t < NT; t++) a[t] = buf(n), b[t] = buf(n), g[t] = buf(n);
  const uint64_t *ip[NT];
  size_t c[NT];
  for (int st = 0; st < 3; st++) {
    step_ids(st, n, ids);
    emb_idset set = idset(ids, n, ip, c);
    lookup(loc, st, &set, a);
    for (int r = 0; r < 2; r++) {
      lookup(rem[r], st, &set, b);
      for (int t = 0; t < NT; t++)
        ck_assert_msg(!memcmp(a[t], b[t], n * (size_t)dim * sizeof(float)),
                      "step %d table %d: rank %d's rows differ from the in-process store's", st,
                      t, r);
    }
    for (int t = 0; t < NT; t++) grads_of(a[t], n, st, 0, g[t]);
    const float *gp[NT] = {g[0], g[1]};
    for (int r = 0; r < 2; r++)
      ck_assert_msg(emb_store_push(rem[r], st, 0.05f, &set, gp) == 0, "%s", emb_store_errmsg(rem[r]));
    for (int t = 0; t < NT; t++)
      for (size_t i = 0; i < n * (size_t)dim; i++) g[t][i] += g[t][i];
    ck_assert_int_eq(emb_store_push(loc, st, 0.05f, &set, gp), 0);
    if (st > 0) continue;
    /* Step 2 ahead: held for step 1, until its deadline passes. */
    step_ids(2, n, ids);
    emb_idset ps = idset(ids, n, ip, c);
    ck_assert_msg(emb_store_prefetch(rem[0], 2, &ps) == 0, "%s", emb_store_errmsg(rem[0]));
    for (int k = 0; k < NS; k++) {
      double t0 = test_now();
      for (;;) { /* until the server answered it DEADLINE_EXCEEDED */
        Shardrec__V1__StatsResponse *x = calls_stats(addr[k]);
        int done = x->parked_lookups == 0 && x->failed_calls >= 1;
        shardrec__v1__stats_response__free_unpacked(x, NULL);
        if (done) break;
        ck_assert_msg(test_now() - t0 < 120, "shard %d still holds the Lookup of step 2", k);
        usleep(50 * 1000);
      }
    }
  }
  for (int r = 0; r < 2; r++) emb_store_destroy(rem[r]);
  emb_store_destroy(loc);
  for (int t = 0; t < NT; t++) free(a[t]), free(b[t]), free(g[t]);
  stop_all();
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_chunks");
  TCase *tc = tcase_create("chunks");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_chunks_over_connections);
  tcase_add_test(tc, test_prefetch_only_lookup);
  tcase_add_test(tc, test_lookahead_memory);
  tcase_add_test(tc, test_lookahead_shard_store);
  tcase_add_test(tc, test_lookahead_two_ranks);
  tcase_add_test(tc, test_lookahead_two_ranks_shard_store);
  tcase_add_test(tc, test_lookahead_failed_is_redone);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
