/* Multi-rank step order at the shard server (rpc/shardrec.proto, "Multi-rank jobs"):
 * two fake ranks, each on its own thread and channel, against a real
 * `shardrec serve`. Pushes of step t from rank 1 then rank 0 give exactly
 * the rows one rank gets pushing their rank-order sum (checked against the
 * in-process store); a retried push changes nothing; a Lookup of step t+1
 * sent before the last push of t waits and then sees the updated rows; a
 * rank that never pushes makes the Lookup end DEADLINE_EXCEEDED and changes
 * nothing. The remote store as two ranks pushes to every shard every step,
 * each rank's Pushes on an exchange stream of its own and its Lookups as
 * calls (a Lookup may wait for the other rank, a stream message never).
 * "Waits" is an event the test sees: the server's Stats shows the Lookup
 * parked, and only then is it checked not to have been answered. */
#include <check.h>

#include "tests/check_main.h"
#include <pthread.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/rpc/calls.h"
#include "tests/rpc/raw_call.h"
#include "tests/support/servers.h"

#define DIM 4

static char *dir;
static char plan_path[512], log_path[512];
static emb_plan *plan;
static char fp[EMB_FP_HEX];
static test_server srv;
static emb_store *ref; /* the in-process reference */

static void setup(void) {
  uint64_t rows[2] = {100, 50};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 7, .n_shards = 1};
  calls_plan_setup(&pp, &dir, plan_path, log_path, sizeof plan_path, &plan, fp);
  char err[512];
  ref = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(ref, "%s", err);
  char args[1200];
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --threads 2 --checkpoint-root '%s'", plan_path, dir);
  server_start(&srv, args, log_path);
}

static void teardown(void) {
  emb_store_destroy(ref); /* in process: apart from the server */
  calls_teardown(&srv, log_path, plan, dir);
}

/* One table's part of a request. */
typedef struct {
  uint32_t table; /* plan index = table_id here */
  const uint64_t *ids;
  size_t n;
  const float *grads; /* n*DIM */
} part;

/* Push parts[n] as (job, step, rank of world); returns the status; *applied. */
static int push(const char *job, int64_t step, int rank, int world, const part *p, int n,
                int *applied) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, job, step, rank, world, 0);
  call_table t[2];
  for (int i = 0; i < n; i++)
    t[i] = (call_table){plan->tables[p[i].table].table_id, p[i].ids, p[i].n, p[i].grads, 0};
  size_t len;
  uint8_t *b = calls_pack_push(&h, 0.1f, t, n, DIM, &len);
  char msg[512];
  int st = calls_push(srv.addr, b, len, applied, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "push %s step %lld rank %d: %d %s", job, (long long)step, rank, st,
                msg);
  return st;
}

/* Lookup ids of table 0 into rows[n*DIM]; returns the status. */
static int lookup(const char *job, int64_t step, int rank, int world, const uint64_t *ids,
                  size_t n, double deadline, float *rows, char *msg, size_t msglen) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, job, step, rank, world, 0);
  call_table t = {plan->tables[0].table_id, ids, n, NULL, 0};
  size_t len;
  uint8_t *b = calls_pack_lookup(&h, &t, 1, &len);
  return calls_lookup(srv.addr, b, len, deadline, &t, 1, DIM, rows, msg, msglen);
}

/* The reference: push (ids, grads) of table 0 (and optionally table 1) in
 * process, then look ids up. */
static void ref_push(int64_t step, const uint64_t *ids, size_t n, const float *g) {
  const uint64_t *ip[2] = {ids, NULL};
  size_t counts[2] = {n, 0};
  const float *gp[2] = {g, NULL};
  emb_idset set = {2, ip, counts};
  ck_assert_int_eq(emb_store_push(ref, step, 0.1f, &set, gp), 0);
}
static void ref_lookup(int64_t step, const uint64_t *ids, size_t n, float *rows) {
  const uint64_t *ip[2] = {ids, NULL};
  size_t counts[2] = {n, 0};
  float *op[2] = {rows, NULL};
  emb_idset set = {2, ip, counts};
  ck_assert_int_eq(emb_store_lookup_begin(ref, step, &set, op), 0);
  ck_assert_int_eq(emb_store_lookup_wait(ref), 0);
}

static void fill(float *g, size_t n, float base) {
  for (size_t i = 0; i < n * DIM; i++) g[i] = base + 0.37f * (float)i - 0.011f * (float)(i * i);
}

START_TEST(test_rank_order_sum) {
  /* Rank 0 pushes rows 7, 9; rank 1 pushes 5, 7: row 7 gets g0 + g1. */
  uint64_t id0[2] = {7, 9}, id1[2] = {5, 7};
  float g0[2 * DIM], g1[2 * DIM];
  fill(g0, 2, 0.3f);
  fill(g1, 2, -0.2f);
  part p0 = {0, id0, 2, g0}, p1 = {0, id1, 2, g1};
  int applied;
  push("m1", 0, 1, 2, &p1, 1, &applied);
  ck_assert_int_eq(applied, 1);
  push("m1", 0, 1, 2, &p1, 1, &applied); /* a retry: taken once */
  ck_assert_int_eq(applied, 0);
  push("m1", 0, 0, 2, &p0, 1, &applied);
  ck_assert_int_eq(applied, 1);
  push("m1", 0, 0, 2, &p0, 1, &applied); /* a retry of an applied step */
  ck_assert_int_eq(applied, 0);
  uint64_t ids[3] = {5, 7, 9};
  float got[3 * DIM], want[3 * DIM], sum[3 * DIM];
  memcpy(sum, g1, DIM * sizeof(float));                   /* row 5: rank 1 only */
  for (int d = 0; d < DIM; d++) sum[DIM + d] = g0[d] + g1[DIM + d]; /* row 7: rank order */
  memcpy(sum + 2 * DIM, g0 + DIM, DIM * sizeof(float));   /* row 9: rank 0 only */
  ref_push(0, ids, 3, sum);
  ref_lookup(1, ids, 3, want);
  char msg[512];
  ck_assert_msg(lookup("m1", 1, 0, 2, ids, 3, 10, got, msg, sizeof msg) == RPC_OK, "%s", msg);
  ck_assert(memcmp(got, want, sizeof got) == 0);
  /* Empty pushes move the step on; the rows stay. */
  push("m1", 1, 0, 2, NULL, 0, &applied);
  push("m1", 1, 1, 2, NULL, 0, &applied);
  ck_assert_msg(lookup("m1", 2, 1, 2, ids, 3, 10, got, msg, sizeof msg) == RPC_OK, "%s", msg);
  ck_assert(memcmp(got, want, sizeof got) == 0);
}
END_TEST

typedef struct {
  const char *job;
  const uint64_t *ids;
  size_t n;
  float rows[8 * DIM];
  int status;
  char msg[512];
  _Atomic int done;
} lookup_job;

/* Rank 0's Lookup of step 1 of j's job (world 2). */
static void *lookup_thread(void *arg) {
  lookup_job *j = arg;
  j->status = lookup(j->job, 1, 0, 2, j->ids, j->n, 60, j->rows, j->msg, sizeof j->msg);
  j->done = 1;
  return NULL;
}

/* Rank 0's push of step 0 of lj's job (the row id0, gradient g0), then
 * lj's Lookup begun on *th, and held by the server for rank 1's push (its
 * Stats says so). */
static void lookup_parked(const uint64_t *id0, const float *g0, lookup_job *lj, pthread_t *th) {
  part p0 = {0, id0, 1, g0};
  int applied;
  push(lj->job, 0, 0, 2, &p0, 1, &applied);
  ck_assert_int_eq(pthread_create(th, NULL, lookup_thread, lj), 0);
  calls_wait_parked(srv.addr, 1, 0, 60);
}

START_TEST(test_lookup_waits_for_step) {
  uint64_t id0[1] = {11}, id1[2] = {11, 13};
  float g0[DIM], g1[2 * DIM];
  fill(g0, 1, 1.0f);
  fill(g1, 2, 0.5f);
  uint64_t ids[2] = {11, 13};
  lookup_job lj = {.job = "m2", .ids = ids, .n = 2};
  pthread_t th;
  lookup_parked(id0, g0, &lj, &th);
  ck_assert_msg(!lj.done, "the lookup of step 1 did not wait for rank 1's push of step 0: %d %s",
                lj.status, lj.msg);
  part p1 = {0, id1, 2, g1};
  int applied;
  push("m2", 0, 1, 2, &p1, 1, &applied);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(lj.status == RPC_OK, "%d %s", lj.status, lj.msg);
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  ck_assert_uint_eq(a->parked_lookups, 0);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  float sum[2 * DIM], want[2 * DIM];
  for (int d = 0; d < DIM; d++) sum[d] = g0[d] + g1[d];
  memcpy(sum + DIM, g1 + DIM, DIM * sizeof(float));
  ref_push(0, ids, 2, sum);
  ref_lookup(1, ids, 2, want);
  ck_assert(memcmp(lj.rows, want, sizeof want) == 0);
}
END_TEST

/* The push that completes a step may come as an exchange stream message
 * (the protocol lets any client send a multi-rank Push so): the parked
 * Lookup of the next step is answered as the message is handled, as after
 * a call's Push. With one
 * worker thread the server handles the Stats call after it, so Stats
 * shows no parked Lookup once the message is answered (the worker's idle
 * pass, 50 ms on, would answer it too, and the test fails without the
 * wake-up). */
START_TEST(test_stream_push_wakes_lookup) {
  char args[1200];
  ck_assert_int_eq(server_stop(&srv), 0);
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --threads 1 --checkpoint-root '%s'", plan_path,
           dir);
  server_start(&srv, args, log_path);
  uint64_t id0[1] = {21}, id1[1] = {22};
  float g0[DIM], g1[DIM];
  fill(g0, 1, 0.25f);
  fill(g1, 1, -0.75f);
  uint64_t ids[2] = {21, 22};
  lookup_job lj = {.job = "m4", .ids = ids, .n = 2};
  pthread_t th;
  lookup_parked(id0, g0, &lj, &th);
  rpc_global_init();
  grpc_channel *ch = raw_channel(srv.addr, 0);
  xs_raw x;
  xs_open(&x, ch);
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, "m4", 0, 1, 2, 0);
  call_table t = {plan->tables[0].table_id, id1, 1, g1, 0};
  size_t len, olen;
  uint8_t *b = calls_pack_push(&h, 0.1f, &t, 1, DIM, &len), *out;
  char msg[512];
  ck_assert_int_eq(xs_call(&x, RPC_PUSH, 0, b, len, msg, &out, &olen), RPC_OK);
  free(b);
  free(out);
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  ck_assert_msg(a->parked_lookups == 0, "the Lookup is still parked after the push that completed "
                "its step was answered on the stream");
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(lj.status == RPC_OK, "%d %s", lj.status, lj.msg);
  float sum[2 * DIM], want[2 * DIM];
  memcpy(sum, g0, sizeof g0);
  memcpy(sum + DIM, g1, sizeof g1);
  ref_push(0, ids, 2, sum);
  ref_lookup(1, ids, 2, want);
  ck_assert(memcmp(lj.rows, want, sizeof want) == 0);
  xs_close(&x);
  grpc_channel_destroy(ch);
  rpc_global_shutdown();
}
END_TEST

START_TEST(test_missing_rank_deadline) {
  uint64_t id0[1] = {21};
  float g0[DIM];
  fill(g0, 1, 2.0f);
  part p0 = {0, id0, 1, g0};
  int applied;
  push("m3", 0, 0, 2, &p0, 1, &applied);
  float got[DIM], want[DIM];
  char msg[512];
  double t0 = test_now();
  int st = lookup("m3", 1, 0, 2, id0, 1, 1.0, got, msg, sizeof msg);
  ck_assert_msg(st == RPC_DEADLINE_EXCEEDED, "%d %s", st, msg);
  ck_assert(test_now() - t0 >= 0.9);
  /* Nothing changed: another (single-rank) job reads the initial row. */
  ref_lookup(0, id0, 1, want);
  ck_assert_msg(lookup("solo", 0, 0, 1, id0, 1, 10, got, msg, sizeof msg) == RPC_OK, "%s", msg);
  ck_assert(memcmp(got, want, sizeof want) == 0);
}
END_TEST

/* The remote store as two ranks of one job: rank 1 has no ids this step
 * and still pushes (an empty push), so the step completes. Each rank's
 * push went on an exchange stream of its own (the server has two open
 * once both are answered, none once both stores are gone); rank 1's
 * Lookup of step 1 is a call, and reads the step's rows. */
START_TEST(test_remote_store_ranks) {
  char err[512];
  const char *addr[1] = {srv.addr};
  emb_store *r[2];
  for (int k = 0; k < 2; k++) {
    rpc_client_opts o = {.deadline_s = 5, .job_id = "rs", .rank = k, .world_size = 2};
    r[k] = emb_store_create_remote(plan, addr, 1, &o, err, sizeof err);
    ck_assert_msg(r[k], "%s", err);
  }
  uint64_t id[1] = {31};
  float g[DIM], got[DIM], want[DIM];
  fill(g, 1, 0.7f);
  const uint64_t *ip[2] = {id, NULL}, *none[2] = {NULL, NULL};
  size_t c1[2] = {1, 0}, c0[2] = {0, 0};
  const float *gp[2] = {g, NULL}, *gn[2] = {NULL, NULL};
  emb_idset s1 = {2, ip, c1}, s0 = {2, none, c0};
  ck_assert_msg(emb_store_push(r[1], 0, 0.1f, &s0, gn) == 0, "%s", emb_store_errmsg(r[1]));
  ck_assert_msg(emb_store_push(r[0], 0, 0.1f, &s1, gp) == 0, "%s", emb_store_errmsg(r[0]));
  ck_assert_uint_eq(calls_open_streams(srv.addr), 2);
  float *op[2] = {got, NULL};
  ck_assert_int_eq(emb_store_lookup_begin(r[1], 1, &s1, op), 0);
  ck_assert_msg(emb_store_lookup_wait(r[1]) == 0, "%s", emb_store_errmsg(r[1]));
  ref_push(0, id, 1, g);
  ref_lookup(1, id, 1, want);
  ck_assert(memcmp(got, want, sizeof want) == 0);
  ck_assert_uint_eq(calls_open_streams(srv.addr), 2); /* the Lookup opened none */
  for (int k = 0; k < 2; k++) emb_store_destroy(r[k]);
  calls_wait_streams(srv.addr, 0, 60);
}
END_TEST

/* Two ranks' pushes each fine alone whose sum overflows the Adagrad
 * accumulator of row 7 (1.5e19 squared is finite, 3e19 squared is not):
 * the step is dropped whole, nothing of it applied, and the job is aborted
 * as for a dead rank: the push that completed the step and the job's next
 * calls are answered ABORTED naming the table and row. */
START_TEST(test_nonfinite_sum_drops_step) {
  uint64_t ids[2] = {3, 7};
  float g[2 * DIM];
  fill(g, 2, 0.5f);
  g[DIM + 1] = 1.5e19f;
  part p = {0, ids, 2, g};
  int applied = -1;
  push("nf", 0, 1, 2, &p, 1, &applied); /* held */
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, "nf", 0, 0, 2, 0);
  call_table t = {plan->tables[0].table_id, ids, 2, g, 0};
  size_t len;
  uint8_t *b = calls_pack_push(&h, 0.1f, &t, 1, DIM, &len);
  char msg[512], want[96];
  int st = calls_push(srv.addr, b, len, NULL, msg, sizeof msg);
  snprintf(want, sizeof want, "table %u (%s) row 7:", plan->tables[0].table_id, plan->tables[0].name);
  ck_assert_msg(st == RPC_ABORTED && strstr(msg, want) && strstr(msg, "nothing of it was applied"),
                "status %d: %s", st, msg);
  float rows[2 * DIM], init[2 * DIM];
  st = lookup("nf", 1, 0, 2, ids, 2, 10, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_ABORTED && strstr(msg, want), "status %d: %s", st, msg);
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  ck_assert_uint_eq(a->dropped_steps, 1);
  ck_assert_uint_eq(a->dropped_jobs, 1);
  ck_assert_uint_eq(a->pending_pushes, 0);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  /* Nothing applied: another job reads the rows' init values. */
  ck_assert_int_eq(lookup("other", 0, 0, 1, ids, 2, 10, rows, msg, sizeof msg), RPC_OK);
  ref_lookup(0, ids, 2, init);
  ck_assert(!memcmp(rows, init, sizeof rows));
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_sync");
  const TTest *tests[] = {test_rank_order_sum,        test_lookup_waits_for_step,
                          test_stream_push_wakes_lookup, test_missing_rank_deadline,
                          test_remote_store_ranks,     test_nonfinite_sum_drops_step, NULL};
  calls_tcase(s, "sync", 120, setup, teardown, tests);
  return sr_check_run(s);
}
