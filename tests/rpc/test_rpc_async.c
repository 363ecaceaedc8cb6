/* Async mode and rank death at the shard server (rpc/shardrec.proto, "Multi-rank jobs",
 * "Rank death"), against a real `shardrec serve` on loopback and, for the
 * timeout and Restore paths, the service in process.
 *
 * The plan is one SGD table on one shard, so the test knows every row's
 * value: emb_row_init, then w -= lr * g for each push applied (sync mode:
 * once with the ranks' gradients summed in rank order). Rows are read back
 * through a single-rank job, whose Lookups never wait.
 *   staleness bound: 3 ranks, S = 2; rank 2 stops after step k: the others'
 *     Lookups up to step k+S are answered at once, their Lookup of step
 *     k+S+1 is held until rank 2 pushes step k+1 and then sees that push;
 *     every push is applied on arrival (rows checked after each).
 *   async single rank; mode mismatch refused (and changes nothing).
 *   rank death: rank 0 pushes step t, rank 1 does not; rank 0's held Lookup
 *     of t+1 is made by a child process that is then killed: Stats shows the
 *     step dropped (polled), rank 1's held Lookup is answered ABORTED at
 *     once, rows are those after step t-1, later calls of the job are
 *     refused, and a new job on the same server runs.
 *   pending timeout and Restore (service in process).
 *   remote store prefetch: Lookup of t+1 in flight while push of t runs, in
 *     sync and async mode, rows of each step checked.
 * A held call is an event the test sees before it checks that the call was
 * not answered: the server's Stats shows it parked (parked_lookups,
 * parked_watches), or the service in process answers RPC_PARKED. No time
 * bound: a Lookup that wrongly waits ends DEADLINE_EXCEEDED, one that is
 * wrongly served shows the wrong rows or status. */
#include <check.h>

#include "tests/check_main.h"
#include <pthread.h>
#include <math.h>
#include <signal.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/rpc/calls.h"
#include "tests/support/servers.h"

#define DIM 4
#define ROWS 100
#define LR 0.1f

static char *dir;
static char plan_path[512], log_path[512];
static emb_plan *plan;
static char fp[EMB_FP_HEX];
static test_server srv;
static float want[ROWS][DIM]; /* the rows as the test expects them on the server */

static void setup(void) {
  uint64_t rows[1] = {ROWS};
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_SGD}, .seed = 11, .n_shards = 1};
  calls_plan_setup(&pp, &dir, plan_path, log_path, sizeof plan_path, &plan, fp);
  for (uint64_t r = 0; r < ROWS; r++) emb_row_init(plan, 0, r, want[r]);
  char args[1200];
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --threads 2 --checkpoint-root '%s'", plan_path, dir);
  server_start(&srv, args, log_path);
}

static void teardown(void) {
  calls_teardown(&srv, log_path, plan, dir);
}

/* Setup without a server (service in process). */
static void setup_plain(void) {
  dir = tmpdir_make("test");
  uint64_t rows[1] = {ROWS};
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_SGD}, .seed = 11, .n_shards = 1};
  char err[512];
  ck_assert_msg(emb_plan_create(&pp, &plan, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  for (uint64_t r = 0; r < ROWS; r++) emb_row_init(plan, 0, r, want[r]);
}
static void teardown_plain(void) {
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* A gradient that differs per (rank, step, row). */
static void grad(float *g, int rank, int64_t step, uint64_t row) {
  for (int d = 0; d < DIM; d++)
    g[d] = 0.25f * (float)(rank + 1) - 0.125f * (float)step + 0.01f * (float)row + 0.3f * (float)d;
}

static void sgd(uint64_t row, const float *g) {
  for (int d = 0; d < DIM; d++) want[row][d] -= LR * g[d];
}

/* The packed requests of this plan's one table (header with max_staleness
 * stale); a push without ids carries no table. */
static uint8_t *pack_push(const char *job, int64_t step, int rank, int world, int stale,
                          const uint64_t *ids, size_t n, const float *g, size_t *len) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, job, step, rank, world, stale);
  call_table t = {plan->tables[0].table_id, ids, n, g, 0};
  return calls_pack_push(&h, LR, &t, n ? 1 : 0, DIM, len);
}

static uint8_t *pack_lookup(const char *job, int64_t step, int rank, int world, int stale,
                            const uint64_t *ids, size_t n, size_t *len) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, job, step, rank, world, stale);
  call_table t = {plan->tables[0].table_id, ids, n, NULL, 0};
  return calls_pack_lookup(&h, &t, 1, len);
}

/* Push over gRPC; returns the status (message in msg), *applied. */
static int push(const char *job, int64_t step, int rank, int world, int stale, const uint64_t *ids,
                size_t n, const float *g, int *applied, char *msg, size_t msglen) {
  size_t len;
  uint8_t *b = pack_push(job, step, rank, world, stale, ids, n, g, &len);
  return calls_push(srv.addr, b, len, applied, msg, msglen);
}

/* A push that must be taken: one row per (rank, step) plus the shared row 50. */
static void push_ok(const char *job, int64_t step, int rank, int world, int stale) {
  uint64_t ids[2] = {10 + (uint64_t)rank, 50};
  float g[2 * DIM];
  grad(g, rank, step, ids[0]);
  grad(g + DIM, rank, step, ids[1]);
  int applied = -1;
  char msg[512];
  int st = push(job, step, rank, world, stale, ids, 2, g, &applied, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "push %s step %lld rank %d: %d %s", job, (long long)step, rank, st,
                msg);
  ck_assert_msg(applied == 1, "push %s step %lld rank %d was not taken", job, (long long)step,
                rank);
}

static int lookup(const char *job, int64_t step, int rank, int world, int stale,
                  const uint64_t *ids, size_t n, double deadline, float *rows, char *msg,
                  size_t msglen) {
  size_t len;
  uint8_t *b = pack_lookup(job, step, rank, world, stale, ids, n, &len);
  call_table t = {plan->tables[0].table_id, ids, n, NULL, 0};
  return calls_lookup(srv.addr, b, len, deadline, &t, 1, DIM, rows, msg, msglen);
}

static void assert_rows(const float *got, const uint64_t *ids, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    for (int d = 0; d < DIM; d++) {
      float w = want[ids[i]][d], x = got[i * DIM + d];
      ck_assert_msg(fabsf(w - x) <= 1e-6f * (1 + fabsf(w)), "%s: row %llu [%d] is %.9g, want %.9g",
                    what, (unsigned long long)ids[i], d, (double)x, (double)w);
    }
}

/* The server's rows now (a single-rank job's Lookup never waits) vs want. */
static void check_rows(const char *what) {
  uint64_t ids[5] = {10, 11, 12, 50, 60};
  float got[5 * DIM];
  char msg[512];
  int st = lookup("peek", 0, 0, 1, 0, ids, 5, 10, got, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "peek: %d %s", st, msg);
  assert_rows(got, ids, 5, what);
}

static void apply_push(int rank, int64_t step) { /* want after push_ok(rank, step) in async */
  float g[DIM];
  grad(g, rank, step, 10 + (uint64_t)rank);
  sgd(10 + (uint64_t)rank, g);
  grad(g, rank, step, 50);
  sgd(50, g);
}

/* want after push_ok of step t by ranks 0 and 1 of a 2-rank job: in sync
 * mode row 50 takes the rank-order sum once; in async (stale > 0) each push
 * as it came, rank 0's then rank 1's. */
static void apply_step(int64_t t, int stale) {
  float g0[DIM], g1[DIM], sum[DIM];
  grad(g0, 0, t, 10);
  sgd(10, g0);
  grad(g1, 1, t, 11);
  sgd(11, g1);
  grad(g0, 0, t, 50);
  grad(g1, 1, t, 50);
  if (stale) {
    sgd(50, g0);
    sgd(50, g1);
  } else {
    for (int d = 0; d < DIM; d++) sum[d] = g0[d] + g1[d]; /* rank order */
    sgd(50, sum);
  }
}

typedef struct {
  const char *job;
  int64_t step;
  int rank, world, stale;
  double deadline;
  uint64_t ids[3];
  float rows[3 * DIM];
  int status;
  char msg[512];
  _Atomic int done;
} bg_lookup;

static void *bg_main(void *arg) {
  bg_lookup *b = arg;
  b->status = lookup(b->job, b->step, b->rank, b->world, b->stale, b->ids, 3, b->deadline, b->rows,
                     b->msg, sizeof b->msg);
  b->done = 1;
  return NULL;
}

typedef struct {
  uint64_t pending_pushes, dropped_steps, jobs, dropped_jobs;
} svc_stats;

static svc_stats stats(void) {
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  svc_stats s = {a->pending_pushes, a->dropped_steps, a->jobs, a->dropped_jobs};
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return s;
}

/* Poll Stats until dropped_steps >= 1 (the server heard of a rank's death);
 * fails only when it never does within 60 s. */
static svc_stats wait_dropped(void) {
  double t0 = test_now();
  svc_stats s;
  while ((s = stats()).dropped_steps < 1) {
    ck_assert_msg(test_now() - t0 < 60, "no step dropped 60 s after the kill");
    usleep(20 * 1000);
  }
  return s;
}

START_TEST(test_staleness_bound) {
  const int W = 3, S = 2, k = 2; /* rank 2 pushes steps 0..k only */
  uint64_t ids[3] = {10, 11, 50};
  float rows[3 * DIM];
  char msg[512], what[128];
  for (int64_t t = 0; t <= k + S; t++) {
    for (int r = 0; r < W; r++) {
      if (r == 2 && t > k) continue;
      /* Every rank's push of t-S is in (t <= k+S): answered at once (one
       * held instead would end DEADLINE_EXCEEDED: nobody else pushes). */
      int st = lookup("a3", t, r, W, S, ids, 3, 10, rows, msg, sizeof msg);
      ck_assert_msg(st == RPC_OK, "lookup step %lld rank %d: %d %s", (long long)t, r, st, msg);
      assert_rows(rows, ids, 3, "lookup within the bound");
      push_ok("a3", t, r, W, S);
      apply_push(r, t); /* applied on arrival, not at the step's end */
      snprintf(what, sizeof what, "after rank %d's push of step %lld", r, (long long)t);
      check_rows(what);
    }
  }
  /* A retry changes nothing. */
  uint64_t rid[2] = {10, 50};
  float g[2 * DIM];
  grad(g, 0, 1, 10);
  grad(g + DIM, 0, 1, 50);
  int applied = -1;
  ck_assert_int_eq(push("a3", 1, 0, W, S, rid, 2, g, &applied, msg, sizeof msg), RPC_OK);
  ck_assert_int_eq(applied, 0);
  check_rows("after a retried push");
  /* Step k+S+1 needs rank 2's push of step k+1: both fast ranks wait. */
  bg_lookup b[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    memset(&b[r], 0, sizeof b[r]);
    b[r] = (bg_lookup){.job = "a3", .step = k + S + 1, .rank = r, .world = W, .stale = S,
                       .deadline = 60, .ids = {10, 12, 50}};
    ck_assert_int_eq(pthread_create(&th[r], NULL, bg_main, &b[r]), 0);
  }
  calls_wait_parked(srv.addr, 2, 0, 60); /* the server holds both */
  for (int r = 0; r < 2; r++)
    ck_assert_msg(!b[r].done, "rank %d's lookup of step %d did not wait for rank 2: %d %s", r,
                  k + S + 1, b[r].status, b[r].msg);
  push_ok("a3", k + 1, 2, W, S);
  apply_push(2, k + 1);
  for (int r = 0; r < 2; r++) {
    ck_assert_int_eq(pthread_join(th[r], NULL), 0);
    ck_assert_msg(b[r].status == RPC_OK, "rank %d: %d %s", r, b[r].status, b[r].msg);
    assert_rows(b[r].rows, b[r].ids, 3, "the held lookup sees rank 2's push");
  }
  /* The bound moves with the slowest rank: step k+S+2 needs its push of k+2. */
  int st = lookup("a3", k + S + 2, 0, W, S, ids, 3, 0.6, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_DEADLINE_EXCEEDED, "%d %s", st, msg);
  check_rows("after the timed-out lookup");
  svc_stats s = stats();
  ck_assert_uint_eq(s.pending_pushes, 0); /* async holds nothing */
  ck_assert_uint_eq(s.jobs, 1);
}
END_TEST

START_TEST(test_async_single_rank_and_mismatch) {
  uint64_t ids[3] = {10, 50, 60};
  float rows[3 * DIM];
  char msg[512];
  /* One rank, S = 3: lookups never wait, pushes are applied on arrival. */
  for (int64_t t = 0; t < 3; t++) {
    ck_assert_int_eq(lookup("s1", t + 100, 0, 1, 3, ids, 3, 5, rows, msg, sizeof msg), RPC_OK);
    assert_rows(rows, ids, 3, "single-rank async lookup");
    push_ok("s1", t, 0, 1, 3);
    apply_push(0, t);
    check_rows("single-rank async push");
  }
  /* The job's mode is fixed by its first call. */
  uint64_t rid[1] = {60};
  float g[DIM];
  grad(g, 0, 7, 60);
  int st = push("s1", 3, 0, 1, 0, rid, 1, g, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION, "%d %s", st, msg);
  ck_assert_msg(strstr(msg, "async mode with max_staleness 3") && strstr(msg, "sync mode"), "%s",
                msg);
  /* Multi-rank: rank 0's first call (a Lookup) makes "m2" async with S = 2. */
  ck_assert_int_eq(lookup("m2", 0, 0, 2, 2, ids, 3, 5, rows, msg, sizeof msg), RPC_OK);
  st = push("m2", 0, 1, 2, 1, rid, 1, g, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION, "%d %s", st, msg);
  ck_assert_msg(strstr(msg, "max_staleness 2") && strstr(msg, "max_staleness 1"), "%s", msg);
  st = lookup("m2", 0, 1, 2, 0, ids, 3, 5, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION && strstr(msg, "sync mode"), "%d %s", st, msg);
  /* A sync job refuses an async call, and a negative bound is bad input. */
  push_ok("m3", 0, 0, 2, 0);
  st = push("m3", 0, 1, 2, 1, rid, 1, g, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION, "%d %s", st, msg);
  st = lookup("m4", 0, 0, 2, -1, ids, 3, 5, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_INVALID_ARGUMENT && strstr(msg, "header.max_staleness -1"), "%d %s", st,
                msg);
  check_rows("after the refused calls"); /* none of them changed a row */
  svc_stats s = stats();
  ck_assert_uint_eq(s.pending_pushes, 1); /* m3's rank 0 */
  ck_assert_uint_eq(s.jobs, 2);           /* m2, m3 (m4 was refused before it counted) */
}
END_TEST

START_TEST(test_rank_death) {
  const char *job = "d1";
  /* The rank-0 process whose Lookup will be held, forked before this
   * process uses gRPC; it waits for a byte on a pipe. */
  int go[2];
  ck_assert_int_eq(pipe(go), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(go[1]);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(3);
    uint64_t ids[3] = {10, 11, 50};
    float rows[3 * DIM];
    char msg[512];
    lookup(job, 2, 0, 2, 0, ids, 3, 30, rows, msg, sizeof msg);
    _exit(0);
  }
  close(go[0]);
  /* Step 0 complete; step 1 has rank 0's push only. */
  push_ok(job, 0, 0, 2, 0);
  push_ok(job, 0, 1, 2, 0);
  apply_step(0, 0);
  check_rows("after step 0");
  push_ok(job, 1, 0, 2, 0);
  check_rows("rank 0's push of step 1 is held, not applied");
  svc_stats s = stats();
  ck_assert_uint_eq(s.pending_pushes, 1);
  ck_assert_uint_eq(s.dropped_steps, 0);
  /* Rank 1's own Lookup of step 2 waits too (as it would prefetch). */
  bg_lookup b = {.job = job, .step = 2, .rank = 1, .world = 2, .stale = 0, .deadline = 30,
                 .ids = {10, 11, 50}};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, bg_main, &b), 0);
  ck_assert_int_eq(write(go[1], "x", 1), 1);
  close(go[1]);
  calls_wait_parked(srv.addr, 2, 0, 60); /* rank 0's and rank 1's */
  int wst;
  ck_assert_msg(waitpid(child, &wst, WNOHANG) == 0, "rank 0's lookup of step 2 did not wait");
  ck_assert(!b.done);
  /* Rank 0 dies. */
  double t0 = test_now();
  proc_kill9(child);
  s = wait_dropped();
  double waited = test_now() - t0;
  ck_assert_msg(s.dropped_steps == 1, "dropped_steps %llu", (unsigned long long)s.dropped_steps);
  ck_assert_uint_eq(s.pending_pushes, 0);
  ck_assert_uint_eq(s.dropped_jobs, 1);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(b.status == RPC_ABORTED, "rank 1's held lookup: %d %s", b.status, b.msg);
  ck_assert_msg(strstr(b.msg, "rank 0 went away") && strstr(b.msg, "step 1") &&
                    strstr(b.msg, "rank(s) 1") && strstr(b.msg, "held pushes were dropped"),
                "%s", b.msg); /* ABORTED, not its deadline's DEADLINE_EXCEEDED */
  check_rows("after the drop: step 0 only, nothing of step 1");
  /* The job is over: its late push is refused and changes nothing. */
  uint64_t rid[1] = {11};
  float g[DIM];
  grad(g, 1, 1, 11);
  char msg[512];
  int st = push(job, 1, 1, 2, 0, rid, 1, g, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_ABORTED && strstr(msg, "rank 0 went away"), "%d %s", st, msg);
  check_rows("after the aborted job's late push");
  /* A new run (new job id, from step 1) works on the same server. */
  push_ok("d2", 1, 1, 2, 0);
  push_ok("d2", 1, 0, 2, 0);
  apply_step(1, 0);
  uint64_t ids[3] = {10, 11, 50};
  float rows[3 * DIM];
  st = lookup("d2", 2, 0, 2, 0, ids, 3, 5, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "%d %s", st, msg);
  assert_rows(rows, ids, 3, "the new job's step 1");
  s = stats();
  ck_assert_uint_eq(s.dropped_steps, 1);
  ck_assert_uint_eq(s.jobs, 2);
  fprintf(stderr, "rank death: step dropped %.3f s after the kill\n", waited);
}
END_TEST

/* Rank 1 (a child process with a remote store, so it holds a Watch on the
 * server) takes part in step 0, then is killed while computing: nothing of
 * it is in flight to the server, rank 0's push of step 1 is held. The
 * server hears of the death through the Watch and drops step 1. */
START_TEST(test_rank_death_watch) {
  int go[2], ready[2];
  ck_assert_int_eq(pipe(go), 0);
  ck_assert_int_eq(pipe(ready), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(go[1]);
    close(ready[0]);
    char c, err[512];
    const char *addr[1] = {srv.addr};
    rpc_client_opts o = {.deadline_s = 10, .job_id = "w1", .rank = 1, .world_size = 2};
    emb_store *st = emb_store_create_remote(plan, addr, 1, &o, err, sizeof err);
    if (!st) _exit(3);
    uint64_t id[2] = {11, 50};
    float rows[2 * DIM], g[2 * DIM];
    const uint64_t *ip[1] = {id};
    size_t cnt[1] = {2};
    float *op[1] = {rows};
    const float *gp[1] = {g};
    emb_idset set = {1, ip, cnt};
    grad(g, 1, 0, 11);
    grad(g + DIM, 1, 0, 50);
    if (emb_store_lookup_begin(st, 0, &set, op) || emb_store_lookup_wait(st) ||
        emb_store_push(st, 0, LR, &set, gp))
      _exit(4);
    if (write(ready[1], "r", 1) != 1) _exit(5);
    if (read(go[0], &c, 1) != 1) _exit(6); /* "computing step 1" until killed */
    _exit(0);
  }
  close(go[0]);
  close(ready[1]);
  char c;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  close(ready[0]);
  push_ok("w1", 0, 0, 2, 0); /* completes step 0 */
  apply_step(0, 0);
  push_ok("w1", 1, 0, 2, 0); /* held: rank 1 never pushes step 1 */
  check_rows("step 0 applied, step 1 held");
  svc_stats s = stats();
  ck_assert_uint_eq(s.pending_pushes, 1);
  calls_wait_parked(srv.addr, 0, 1, 60); /* rank 1's Watch is held: its death will be heard */
  double t0 = test_now();
  proc_kill9(child);
  close(go[1]);
  s = wait_dropped();
  double waited = test_now() - t0;
  ck_assert_msg(s.dropped_steps == 1, "dropped_steps %llu", (unsigned long long)s.dropped_steps);
  ck_assert_uint_eq(s.pending_pushes, 0);
  ck_assert_uint_eq(s.dropped_jobs, 1);
  check_rows("after the drop: nothing of step 1");
  uint64_t ids[3] = {10, 11, 50};
  float rows[3 * DIM];
  char msg[512];
  int st = lookup("w1", 2, 0, 2, 0, ids, 3, 10, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_ABORTED && strstr(msg, "rank 1 went away") && strstr(msg, "Watch") &&
                    strstr(msg, "step 1") && strstr(msg, "held pushes were dropped"),
                "%d %s", st, msg);
  fprintf(stderr, "rank death (watch): step dropped %.3f s after the kill\n", waited);
}
END_TEST

/* ---- service in process: timeout and Restore ---- */

/* Handle the request in b[*len] (takes b). */
static void handle(rpc_service *svc, rpc_method m, uint8_t *b, const size_t *len, void *token,
                   rpc_reply *r) {
  rpc_service_handle_call(svc, m, b, *len, token, 30, r);
  free(b);
}

static Shardrec__V1__StatsResponse *svc_stats_get(rpc_service *svc) {
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t b[8];
  size_t len = shardrec__v1__stats_request__pack(&q, b);
  rpc_reply r;
  rpc_service_handle(svc, RPC_STATS, b, len, &r);
  ck_assert_int_eq(r.status, RPC_OK);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, r.out_len, r.out);
  free(r.out);
  ck_assert_ptr_nonnull(a);
  return a;
}

/* Rows ids[n] as the service has them (a single-rank job's Lookup) vs want. */
static void svc_check_rows(rpc_service *svc, const uint64_t *ids, size_t n, const char *what) {
  size_t len;
  rpc_reply r;
  handle(svc, RPC_LOOKUP, pack_lookup("peek", 0, 0, 1, 0, ids, n, &len), &len, NULL, &r);
  ck_assert_int_eq(r.status, RPC_OK);
  Shardrec__V1__LookupResponse *la = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
  ck_assert_ptr_nonnull(la);
  assert_rows((const float *)la->tables[0]->rows.data, ids, n, what);
  shardrec__v1__lookup_response__free_unpacked(la, NULL);
  free(r.out);
}

/* A Checkpoint (step 0) or Restore (m) of this plan at path, which must
 * succeed. */
static void svc_ck_call(rpc_service *svc, rpc_method m, char *path) {
  uint8_t b[1024];
  size_t len;
  if (m == RPC_CHECKPOINT) {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = path;
    len = shardrec__v1__checkpoint_request__pack(&q, b);
  } else {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = path;
    len = shardrec__v1__restore_request__pack(&q, b);
  }
  rpc_reply r;
  rpc_service_handle(svc, m, b, len, &r);
  ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
  free(r.out);
}

START_TEST(test_pending_timeout_and_restore) {
  char err[512];
  emb_store *store = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(store, "%s", err);
  int shard = 0;
  const char *root = dir;
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .pending_timeout_s = 0.3,
                        .checkpoint_roots = &root, .n_roots = 1};
  rpc_service *svc = rpc_service_create(plan, store, &o, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  uint64_t ids[2] = {10, 50};
  float g[2 * DIM];
  grad(g, 0, 0, 10);
  grad(g + DIM, 0, 0, 50);
  size_t len;
  rpc_reply r;
  /* Timeout: rank 0 pushes step 0 of a 2-rank sync job, its Lookup of
   * step 1 is parked, rank 1 never comes. t0 is before the push (the job's
   * last progress), so the drop comes 0.3 s after t0 at the earliest. */
  double t0 = test_now();
  handle(svc, RPC_PUSH, pack_push("t1", 0, 0, 2, 0, ids, 2, g, &len), &len, NULL, &r);
  ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
  free(r.out);
  int tok1;
  handle(svc, RPC_LOOKUP, pack_lookup("t1", 1, 0, 2, 0, ids, 2, &len), &len, &tok1, &r);
  ck_assert_int_eq(r.status, RPC_PARKED);
  rpc_woken wk[4];
  int n = 0;
  while (n == 0 && test_now() - t0 < 60) {
    n = rpc_service_take_woken(svc, wk, 4);
    if (!n) usleep(10 * 1000);
  }
  double secs = test_now() - t0;
  ck_assert_int_eq(n, 1);
  ck_assert_ptr_eq(wk[0].token, &tok1);
  ck_assert_msg(wk[0].r.status == RPC_ABORTED && strstr(wk[0].r.msg, "no progress") &&
                    strstr(wk[0].r.msg, "held pushes were dropped"),
                "%d %s", wk[0].r.status, wk[0].r.msg);
  ck_assert_msg(secs >= 0.299, "dropped after %.3f s (timeout 0.3 s)", secs);
  Shardrec__V1__StatsResponse *a = svc_stats_get(svc);
  ck_assert_uint_eq(a->dropped_steps, 1);
  ck_assert_uint_eq(a->pending_pushes, 0);
  ck_assert_uint_eq(a->jobs, 1);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  /* Nothing of step 0 was applied. */
  svc_check_rows(svc, ids, 2, "after the timeout");
  /* Cancel: rank 0's parked Lookup of job t2 is cancelled; rank 1's, also
   * parked, is answered ABORTED. */
  handle(svc, RPC_PUSH, pack_push("t2", 0, 0, 2, 1, ids, 2, g, &len), &len, NULL, &r);
  free(r.out);
  int tok2, tok3;
  handle(svc, RPC_LOOKUP, pack_lookup("t2", 1, 0, 2, 1, ids, 2, &len), &len, &tok2, &r);
  ck_assert_int_eq(r.status, RPC_PARKED);
  handle(svc, RPC_LOOKUP, pack_lookup("t2", 1, 1, 2, 1, ids, 2, &len), &len, &tok3, &r);
  ck_assert_int_eq(r.status, RPC_PARKED);
  a = svc_stats_get(svc);
  const uint64_t lookups = a->lookup_calls, failed = a->failed_calls;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  ck_assert_int_eq(rpc_service_cancel(svc, &tok2), 1);
  ck_assert_int_eq(rpc_service_cancel(svc, &tok2), 0);
  /* The cancelled Lookup is counted once, as a failed Lookup call. */
  a = svc_stats_get(svc);
  ck_assert_uint_eq(a->lookup_calls, lookups + 1);
  ck_assert_uint_eq(a->failed_calls, failed + 1);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  n = rpc_service_take_woken(svc, wk, 4);
  ck_assert_int_eq(n, 1);
  ck_assert_ptr_eq(wk[0].token, &tok3);
  ck_assert_msg(wk[0].r.status == RPC_ABORTED && strstr(wk[0].r.msg, "rank 0 went away") &&
                    strstr(wk[0].r.msg, "async mode"),
                "%d %s", wk[0].r.status, wk[0].r.msg);
  /* Async: rank 0's push of step 0 was applied on arrival and stays. */
  sgd(10, g);
  sgd(50, g + DIM);
  /* Restore: a sync job with a held push and a parked Lookup. */
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  svc_ck_call(svc, RPC_CHECKPOINT, ck);
  handle(svc, RPC_PUSH, pack_push("t3", 5, 1, 2, 0, ids, 2, g, &len), &len, NULL, &r);
  free(r.out);
  int tok4;
  handle(svc, RPC_LOOKUP, pack_lookup("t3", 6, 1, 2, 0, ids, 2, &len), &len, &tok4, &r);
  ck_assert_int_eq(r.status, RPC_PARKED);
  svc_ck_call(svc, RPC_RESTORE, ck);
  n = rpc_service_take_woken(svc, wk, 4);
  ck_assert_int_eq(n, 1);
  ck_assert_ptr_eq(wk[0].token, &tok4);
  ck_assert_msg(wk[0].r.status == RPC_ABORTED && strstr(wk[0].r.msg, "restored"), "%d %s",
                wk[0].r.status, wk[0].r.msg);
  a = svc_stats_get(svc);
  ck_assert_uint_eq(a->dropped_steps, 2);
  ck_assert_uint_eq(a->pending_pushes, 0);
  ck_assert_uint_eq(a->jobs, 0); /* Restore forgets every job */
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  /* The restored rows: the checkpoint's (t2's async push). The job id t3
   * starts afresh after a Restore. */
  svc_check_rows(svc, ids, 2, "after the restore");
  handle(svc, RPC_PUSH, pack_push("t3", 0, 0, 2, 0, ids, 2, g, &len), &len, NULL, &r);
  ck_assert_msg(r.status == RPC_OK, "%s", r.msg);
  free(r.out);
  rpc_service_destroy(svc);
  emb_store_destroy(store);
}
END_TEST

/* ---- remote store: prefetch ---- */

/* Two ranks, one thread: each rank begins its Lookup of step t+1 before its
 * push of step t (prefetch); the push must not wait for it (the server holds
 * that Lookup until both pushes of t are in). The Lookup asks for other ids
 * than the push carries, so a lookup sharing the push's grouping would
 * scatter wrong rows. */
static void prefetch_run(int stale) {
  char err[512];
  const char *addr[1] = {srv.addr};
  emb_store *rs[2];
  const char *job = stale ? "pa" : "ps";
  for (int k = 0; k < 2; k++) {
    rpc_client_opts o = {.deadline_s = 10, .job_id = job, .rank = k, .world_size = 2,
                         .max_staleness = stale};
    rs[k] = emb_store_create_remote(plan, addr, 1, &o, err, sizeof err);
    ck_assert_msg(rs[k], "%s", err);
  }
  uint64_t lids[2][3] = {{50, 12, 10}, {11, 50, 60}};
  float rows[2][3 * DIM];
  float *op[2][1] = {{rows[0]}, {rows[1]}}; /* alive until each lookup_wait */
  const uint64_t *ip[2][1] = {{lids[0]}, {lids[1]}};
  size_t c[1] = {3};
  emb_idset ls[2] = {{1, ip[0], c}, {1, ip[1], c}};
  /* A rank's first call is its Lookup of the job's first step (it fixes the
   * job's first step); the prefetching starts from there. */
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(emb_store_lookup_begin(rs[k], 0, &ls[k], op[k]), 0);
    ck_assert_msg(emb_store_lookup_wait(rs[k]) == 0, "%s", emb_store_errmsg(rs[k]));
    assert_rows(rows[k], lids[k], 3, "the first lookup");
  }
  for (int64_t t = 0; t < 4; t++) {
    for (int k = 0; k < 2; k++) {
      ck_assert_int_eq(emb_store_lookup_begin(rs[k], t + 1, &ls[k], op[k]), 0);
      uint64_t pid[2] = {10 + (uint64_t)k, 50};
      float g[2 * DIM];
      grad(g, k, t, pid[0]);
      grad(g + DIM, k, t, pid[1]);
      const uint64_t *pp[1] = {pid};
      size_t pc[1] = {2};
      const float *gp[1] = {g};
      emb_idset ps = {1, pp, pc};
      /* A push that waited for its own Lookup would deadlock (the server
       * holds the Lookup for the other rank's push, which this thread
       * sends next) until the Lookup's deadline: lookup_wait below fails. */
      ck_assert_msg(emb_store_push(rs[k], t, LR, &ps, gp) == 0, "%s", emb_store_errmsg(rs[k]));
    }
    /* want after step t: async applies each push as it came (rank 0, then
     * 1); sync applies the rank-order sum once. */
    apply_step(t, stale);
    for (int k = 0; k < 2; k++) {
      ck_assert_msg(emb_store_lookup_wait(rs[k]) == 0, "%s", emb_store_errmsg(rs[k]));
      char what[96];
      snprintf(what, sizeof what, "%s rank %d's early lookup of step %lld",
               stale ? "async" : "sync", k, (long long)t + 1);
      assert_rows(rows[k], lids[k], 3, what);
    }
  }
  for (int k = 0; k < 2; k++) emb_store_destroy(rs[k]);
  /* Destroying the stores detached the ranks: the job was not dropped. */
  svc_stats s = stats();
  ck_assert_uint_eq(s.dropped_steps, 0);
  ck_assert_uint_eq(s.dropped_jobs, 0);
  push_ok(job, 4, 0, 2, stale); /* async: applied at once; sync: held for rank 1 */
  if (stale) apply_push(0, 4);
}

START_TEST(test_remote_prefetch) {
  prefetch_run(0);
  prefetch_run(1); /* starts from the rows the sync job left (want has them) */
  check_rows("after both prefetch runs");
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_async");
  const TTest *server[] = {test_staleness_bound, test_async_single_rank_and_mismatch,
                           test_rank_death, test_rank_death_watch, test_remote_prefetch, NULL};
  calls_tcase(s, "server", 60, setup, teardown, server);
  const TTest *service[] = {test_pending_timeout_and_restore, NULL};
  calls_tcase(s, "service", 60, setup_plain, teardown_plain, service);
  return sr_check_run(s);
}
