/* The shard server over real gRPC on loopback: every bad request gets its
 * status and changes nothing, a retried Push is applied once, read-only
 * refuses Push, health answers SERVING, unknown methods get UNIMPLEMENTED,
 * SIGTERM exits 0, a Python grpcio client reads exactly the bytes the C
 * client reads, and the exchange stream answers as calls do, refuses what
 * it does not take, ends at once when the server stops, and reports a
 * Push it answered before a failed update at the next call. */
#include <check.h>

#include "tests/check_main.h"
#include <math.h>

#include "embedding/plan.h"
#include "rpc/health.pb-c.h"
#include "rpc/client.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/metrics/http_get.h"
#include "tests/rpc/calls.h"
#include "tests/rpc/raw_call.h"
#include "tests/support/files.h"
#include "tests/support/servers.h"

#define DIM 4

static char *dir;
static char plan_path[512], log_path[512];
static emb_plan *plan;
static char fp[EMB_FP_HEX];
static test_server srv;
/* Ids of each table on shard 0 (served) and one of table 0 on shard 1. */
static uint64_t ids0[8], ids1[5], foreign0;

static void setup(void) {
  uint64_t rows[2] = {100, 50};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = DIM, .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1},
                        .seed = 7, .n_shards = 2, .row_wise = 1};
  calls_plan_setup(&pp, &dir, plan_path, log_path, sizeof plan_path, &plan, fp);
  int n0 = 0, n1 = 0, nf = 0;
  for (uint64_t r = 0; r < 100 && n0 < 8; r++)
    if (emb_plan_shard_of(plan, 0, r) == 0) ids0[n0++] = r;
    else if (!nf) foreign0 = r, nf = 1;
  for (uint64_t r = 0; r < 50 && n1 < 5; r++)
    if (emb_plan_shard_of(plan, 1, r) == 0) ids1[n1++] = r;
  ck_assert(n0 == 8 && n1 == 5 && nf);
  char args[1200];
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --max-ids 64 --data-dir '%s/data' --checkpoint-root '%s'", plan_path, dir, dir);
  server_start(&srv, args, log_path);
}

static void teardown(void) {
  /* A clean exit: no sanitizer report, no crash while refusing requests. */
  calls_teardown(&srv, log_path, plan, dir);
}

/* ---- requests ---- */

/* A request of t[nt] as job "test" step 0 (a Lookup) or job, step (a
 * Push), rank 0 of 1, under plan fingerprint f. */
static uint8_t *enc_lookup(const char *f, const call_table *t, int nt, size_t *len) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, f, "test", 0, 0, 1, 0);
  return calls_pack_lookup(&h, t, nt, len);
}

static uint8_t *enc_push(const char *f, const char *job, int64_t step, float lr,
                         const call_table *t, int nt, size_t *len) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, f, job, step, 0, 1, 0);
  return calls_pack_push(&h, lr, t, nt, DIM, len);
}

/* Call and return the status; the answer (if OK) in *resp. */
static int call(rpc_method m, const uint8_t *req, size_t len, uint8_t **resp, size_t *rlen,
                char *msg) {
  uint8_t *r = NULL;
  size_t rl = 0;
  int st = rpc_call_once(srv.addr, NULL, m, req, len, 10, &r, &rl, msg, 512);
  if (resp) {
    *resp = r;
    *rlen = rl;
  } else {
    free(r);
  }
  return st;
}

/* Rows of ids0 and ids1 as the server has them: out[13*DIM] bytes. */
static void snapshot(float *out) {
  call_table t[2] = {{0, ids0, 8, NULL, 0}, {1, ids1, 5, NULL, 0}};
  size_t len;
  uint8_t *q = enc_lookup(fp, t, 2, &len);
  char msg[512];
  int st = calls_lookup(srv.addr, q, len, 10, t, 2, DIM, out, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "lookup: %d %s", st, msg);
}

static float g0[8 * DIM], g1[5 * DIM];

static void fill_grads(float scale) {
  for (int i = 0; i < 8 * DIM; i++) g0[i] = scale * (float)(i % 7 - 3) / 8;
  for (int i = 0; i < 5 * DIM; i++) g1[i] = scale * (float)(i % 5 - 2) / 4;
}

static int push_ok(const char *job, int64_t step, int *applied) {
  call_table t[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 0}};
  size_t len;
  uint8_t *q = enc_push(fp, job, step, 0.5f, t, 2, &len);
  char msg[512];
  return calls_push(srv.addr, q, len, applied, msg, sizeof msg);
}

/* Send req, expect status want with a message, and rows unchanged. */
/* lenp is read after req is made (argument order is unspecified). */
static void expect_refused(const char *what, rpc_method m, uint8_t *req, const size_t *lenp,
                           int want, const char *needle) {
  const size_t len = *lenp;
  float before[13 * DIM], after[13 * DIM];
  snapshot(before);
  char msg[512];
  int st = call(m, req, len, NULL, NULL, msg);
  free(req);
  ck_assert_msg(st == want, "%s: status %d (want %d): %s", what, st, want, msg);
  ck_assert_msg(msg[0], "%s: no message", what);
  if (needle) ck_assert_msg(strstr(msg, needle), "%s: message '%s' lacks '%s'", what, msg, needle);
  snapshot(after);
  ck_assert_msg(memcmp(before, after, sizeof before) == 0, "%s changed rows", what);
}

START_TEST(test_bad_requests_change_nothing) {
  fill_grads(1);
  int applied = 0;
  ck_assert_int_eq(push_ok("job-a", 0, &applied), RPC_OK);
  ck_assert_int_eq(applied, 1);
  const char *other = "0000000000000000000000000000000000000000000000000000000000000000";
  size_t len;
  call_table good[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 0}};
  /* Another plan. */
  expect_refused("lookup, other plan", RPC_LOOKUP, enc_lookup(other, good, 2, &len), &len,
                 RPC_FAILED_PRECONDITION, "plan");
  expect_refused("push, other plan", RPC_PUSH, enc_push(other, "job-a", 1, 0.5f, good, 2, &len), &len, RPC_FAILED_PRECONDITION, "plan");
  /* Unknown table. */
  call_table unk[2] = {{0, ids0, 8, g0, 0}, {99, ids1, 5, g1, 0}};
  expect_refused("push, unknown table", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, unk, 2, &len), &len, RPC_INVALID_ARGUMENT, "table_id 99");
  expect_refused("lookup, unknown table", RPC_LOOKUP, enc_lookup(fp, unk, 2, &len), &len,
                 RPC_INVALID_ARGUMENT, "table_id 99");
  /* Row id out of range (table 1 has 50 rows), in the second table. */
  uint64_t oor[5] = {ids1[0], ids1[1], 50, ids1[3], ids1[4]};
  call_table range[2] = {{0, ids0, 8, g0, 0}, {1, oor, 5, g1, 0}};
  expect_refused("push, row out of range", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, range, 2, &len), &len, RPC_INVALID_ARGUMENT, "out of range");
  expect_refused("lookup, row out of range", RPC_LOOKUP, enc_lookup(fp, range, 2, &len), &len,
                 RPC_INVALID_ARGUMENT, "out of range");
  /* Gradient of the wrong length. */
  call_table shortg[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 5 * DIM * 4 - 4}};
  expect_refused("push, short gradient", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, shortg, 2, &len), &len, RPC_INVALID_ARGUMENT, "grads");
  /* NaN and Inf in the second table's gradient. */
  float bad[5 * DIM];
  memcpy(bad, g1, sizeof bad);
  bad[7] = NAN;
  call_table nan[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, bad, 0}};
  expect_refused("push, NaN", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, nan, 2, &len), &len,
                 RPC_INVALID_ARGUMENT, "nan");
  bad[7] = -INFINITY;
  expect_refused("push, -Inf", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, nan, 2, &len), &len,
                 RPC_INVALID_ARGUMENT, "inf");
  /* At learning rate 0 too (0 x inf is NaN: the store refuses it whole). */
  bad[7] = INFINITY;
  expect_refused("push, Inf, lr 0", RPC_PUSH, enc_push(fp, "job-a", 1, 0.0f, nan, 2, &len), &len,
                 RPC_INVALID_ARGUMENT, "element 3 is inf");
  /* The same from rank 0 of two: a sync job's push, refused before it is
   * held, and an async job's, refused whole by the store and then named. */
  Shardrec__V1__RequestHeader h2;
  calls_header(&h2, fp, "job-sync", 0, 0, 2, 0);
  expect_refused("push, -Inf, sync", RPC_PUSH, calls_pack_push(&h2, 0.5f, nan, 2, DIM, &len),
                 &len, RPC_INVALID_ARGUMENT, "tables[1].grads: row");
  calls_header(&h2, fp, "job-async", 0, 0, 2, 1);
  expect_refused("push, -Inf, async", RPC_PUSH, calls_pack_push(&h2, 0.5f, nan, 2, DIM, &len),
                 &len, RPC_INVALID_ARGUMENT, "tables[1].grads: row");
  /* Too many ids (the server allows 64). */
  uint64_t many[65];
  for (int i = 0; i < 65; i++) many[i] = ids0[i % 8];
  call_table toomany[1] = {{0, many, 65, NULL, 0}};
  expect_refused("lookup, too many ids", RPC_LOOKUP, enc_lookup(fp, toomany, 1, &len), &len,
                 RPC_INVALID_ARGUMENT, "more than 64");
  /* A row that lives on the other shard. */
  uint64_t fid[1] = {foreign0};
  float fg[DIM] = {1, 1, 1, 1};
  call_table fspec[2] = {{1, ids1, 5, g1, 0}, {0, fid, 1, fg, 0}};
  expect_refused("push, row of another shard", RPC_PUSH,
                 enc_push(fp, "job-a", 1, 0.5f, fspec, 2, &len), &len, RPC_FAILED_PRECONDITION,
                 "shard 1");
  /* A row given twice in one push. */
  uint64_t dup[8];
  memcpy(dup, ids0, sizeof dup);
  dup[5] = dup[2];
  call_table dspec[1] = {{0, dup, 8, g0, 0}};
  expect_refused("push, repeated row", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, dspec, 1, &len), &len, RPC_INVALID_ARGUMENT, "twice");
  /* A negative learning rate. */
  expect_refused("push, negative lr", RPC_PUSH, enc_push(fp, "job-a", 1, -1.0f, good, 2, &len), &len, RPC_INVALID_ARGUMENT, "learning_rate");
  /* Learning rates past 1e4 (finite, but they overflow rows). */
  expect_refused("push, lr 3e38", RPC_PUSH, enc_push(fp, "job-a", 1, 3e38f, good, 2, &len), &len, RPC_INVALID_ARGUMENT, "within [0, 10000]");
  expect_refused("push, lr 1e5", RPC_PUSH, enc_push(fp, "job-a", 1, 1e5f, good, 2, &len), &len, RPC_INVALID_ARGUMENT, "learning_rate");
  /* A finite gradient whose square overflows the Adagrad accumulator of
   * table 1's row ids1[3]: refused whole, table and row named. */
  float big[5 * DIM];
  memcpy(big, g1, sizeof big);
  big[3 * DIM + 2] = 3e38f;
  call_table over[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, big, 0}};
  char want[160];
  snprintf(want, sizeof want, "table %u (%s) row %llu:", plan->tables[1].table_id,
           plan->tables[1].name, (unsigned long long)ids1[3]);
  expect_refused("push, overflowing gradient", RPC_PUSH, enc_push(fp, "job-a", 1, 0.5f, over, 2, &len), &len, RPC_INVALID_ARGUMENT, want);
  /* Truncated and garbage protobufs. */
  uint8_t *full = enc_push(fp, "job-a", 1, 0.5f, good, 2, &len);
  size_t cut = len / 2;
  expect_refused("push, truncated", RPC_PUSH, full, &cut, RPC_INVALID_ARGUMENT, "PushRequest");
  uint8_t *junk = malloc(64);
  for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0xff - i * 7);
  size_t n64 = 64;
  expect_refused("push, garbage", RPC_PUSH, junk, &n64, RPC_INVALID_ARGUMENT, "PushRequest");
  junk = malloc(64);
  for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0xff - i * 7);
  expect_refused("lookup, garbage", RPC_LOOKUP, junk, &n64, RPC_INVALID_ARGUMENT, "LookupRequest");
  /* An unknown method: refused, and counted among the failed calls. */
  char msg[512];
  uint8_t *r = NULL;
  size_t rl = 0;
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  const uint64_t failed = a->failed_calls;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  int st = rpc_call_path(srv.addr, NULL, "/shardrec.v1.EmbeddingShard/Nope", (const uint8_t *)"",
                         0, 10, &r, &rl, msg, sizeof msg);
  free(r);
  ck_assert_msg(st == RPC_UNIMPLEMENTED, "unknown method: %d %s", st, msg);
  a = calls_stats(srv.addr);
  ck_assert_uint_eq(a->failed_calls, failed + 1);
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  /* Still serving, and a good push still applies. */
  float before[13 * DIM], after[13 * DIM];
  snapshot(before);
  ck_assert_int_eq(push_ok("job-a", 1, &applied), RPC_OK);
  ck_assert_int_eq(applied, 1);
  snapshot(after);
  ck_assert(memcmp(before, after, sizeof before) != 0);
}
END_TEST

START_TEST(test_retried_push_applied_once) {
  fill_grads(1);
  float s0[13 * DIM], s1[13 * DIM], s2[13 * DIM];
  snapshot(s0);
  int applied = -1;
  ck_assert_int_eq(push_ok("job-r", 0, &applied), RPC_OK);
  ck_assert_int_eq(applied, 1);
  snapshot(s1);
  ck_assert(memcmp(s0, s1, sizeof s0) != 0);
  /* The same (job, step, rank) again: OK, not applied, rows unchanged. */
  ck_assert_int_eq(push_ok("job-r", 0, &applied), RPC_OK);
  ck_assert_int_eq(applied, 0);
  snapshot(s2);
  ck_assert(memcmp(s1, s2, sizeof s1) == 0);
  /* The next step applies. */
  ck_assert_int_eq(push_ok("job-r", 1, &applied), RPC_OK);
  ck_assert_int_eq(applied, 1);
  snapshot(s2);
  ck_assert(memcmp(s1, s2, sizeof s1) != 0);
}
END_TEST

START_TEST(test_health_unknown_method_sigterm) {
  Grpc__Health__V1__HealthCheckRequest hq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  uint8_t buf[64], *r = NULL;
  size_t len = grpc__health__v1__health_check_request__pack(&hq, buf), rl = 0;
  char msg[512];
  ck_assert_int_eq(call(RPC_HEALTH_CHECK, buf, len, &r, &rl, msg), RPC_OK);
  Grpc__Health__V1__HealthCheckResponse *a = grpc__health__v1__health_check_response__unpack(NULL, rl, r);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  grpc__health__v1__health_check_response__free_unpacked(a, NULL);
  free(r);
  /* Stats answers with this server's shards and plan. */
  Shardrec__V1__StatsRequest sq = SHARDREC__V1__STATS_REQUEST__INIT;
  len = shardrec__v1__stats_request__pack(&sq, buf);
  ck_assert_int_eq(call(RPC_STATS, buf, len, &r, &rl, msg), RPC_OK);
  Shardrec__V1__StatsResponse *sa = shardrec__v1__stats_response__unpack(NULL, rl, r);
  ck_assert_ptr_nonnull(sa);
  ck_assert_int_eq(sa->n_shards, 1);
  ck_assert_int_eq(sa->shards[0], 0);
  ck_assert_str_eq(sa->plan_fingerprint, fp);
  shardrec__v1__stats_response__free_unpacked(sa, NULL);
  free(r);
  /* SO_REUSEPORT is off: a second server on the same port is refused
   * instead of silently sharing it. */
  char *out;
  int rc = run_cmd(&out, "timeout 20 %s serve --plan '%s' --shard 0 --listen %s", bin_path(),
                   plan_path, srv.addr);
  ck_assert_msg(rc == 1 && strstr(out, "cannot listen"), "rc %d: %s", rc, out);
  free(out);
  /* SIGTERM: a clean exit 0. */
  ck_assert_int_eq(server_stop(&srv), 0);
}
END_TEST

/* ---- the exchange stream (rpc/shardrec.proto, "Exchange stream") ---- */

static uint64_t failed_calls(void) {
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  ck_assert_ptr_nonnull(a);
  ck_assert(a->exchange); /* the server says it takes streams */
  uint64_t f = a->failed_calls;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return f;
}

/* Push t[2] (13 rows) as job, step on stream x: answered applied. */
static void xs_push_applied(xs_raw *x, const char *job, int64_t step, const call_table *t) {
  size_t len, olen;
  uint8_t *out;
  char msg[512];
  uint8_t *q = enc_push(fp, job, step, 0.5f, t, 2, &len);
  ck_assert_msg(xs_call(x, RPC_PUSH, 0, q, len, msg, &out, &olen) == RPC_OK, "push: %s", msg);
  free(q);
  Shardrec__V1__PushResponse *pa = shardrec__v1__push_response__unpack(NULL, olen, out);
  ck_assert_ptr_nonnull(pa);
  ck_assert(pa->applied);
  ck_assert_uint_eq(pa->rows, 13);
  shardrec__v1__push_response__free_unpacked(pa, NULL);
  free(out);
}

START_TEST(test_exchange_stream) {
  rpc_global_init();
  grpc_channel *ch = raw_channel(srv.addr, 0);
  xs_raw x;
  xs_open(&x, ch);
  char msg[512];
  uint8_t *out, *r;
  size_t olen, rl, len;
  /* A Push on the stream is applied as a call's: the same answer, rows
   * moved as the same push would move them. */
  fill_grads(1);
  float before[13 * DIM], after[13 * DIM];
  snapshot(before);
  call_table tp[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 0}};
  xs_push_applied(&x, "xs", 0, tp);
  snapshot(after);
  ck_assert(memcmp(before, after, sizeof before) != 0);
  /* A Lookup on the stream answers the very bytes a call answers. */
  call_table tl[2] = {{0, ids0, 8, NULL, 0}, {1, ids1, 5, NULL, 0}};
  uint8_t *q = enc_lookup(fp, tl, 2, &len);
  ck_assert_int_eq(xs_call(&x, RPC_LOOKUP, 0, q, len, msg, &out, &olen), RPC_OK);
  ck_assert_int_eq(call(RPC_LOOKUP, q, len, &r, &rl, msg), RPC_OK);
  ck_assert_uint_eq(olen, rl);
  ck_assert(memcmp(out, r, rl) == 0);
  free(out);
  free(r);
  /* Stats counts the open streams: a second one, then closed by its
   * client (the server ends it once it has sent the status: waited for). */
  ck_assert_uint_eq(calls_open_streams(srv.addr), 1);
  xs_raw y;
  xs_open(&y, ch);
  ck_assert_int_eq(xs_call(&y, RPC_LOOKUP, 0, q, len, msg, &out, &olen), RPC_OK);
  free(out);
  ck_assert_uint_eq(calls_open_streams(srv.addr), 2);
  xs_close(&y);
  calls_wait_streams(srv.addr, 1, 60);
  /* Messages the stream does not take are refused in their answers,
   * named, counted, and change nothing; the stream goes on. */
  const uint64_t failed0 = failed_calls();
  snapshot(before);
  const uint8_t three[3] = {1, 0, 0};
  xs_start(&x, three, 3);
  ck_assert_int_eq(xs_finish(&x, msg, NULL, NULL), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "3 bytes: shorter than its 8-byte head"), "%s", msg);
  ck_assert_int_eq(xs_call(&x, RPC_LOOKUP, 7, q, len, msg, NULL, NULL), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "second word is 7"), "%s", msg);
  ck_assert_int_eq(xs_call(&x, 99, 0, q, len, msg, NULL, NULL), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "no method 99"), "%s", msg);
  ck_assert_int_eq(xs_call(&x, RPC_STATS, 0, NULL, 0, msg, NULL, NULL), RPC_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "Stats does not go on an exchange stream"), "%s", msg);
  const uint8_t junk[5] = {0xff, 0xff, 0xff, 0xff, 0xff};
  ck_assert_int_eq(xs_call(&x, RPC_PUSH, 0, junk, 5, msg, NULL, NULL), RPC_INVALID_ARGUMENT);
  ck_assert_msg(msg[0], "no message for an undecodable push");
  snapshot(after);
  ck_assert(memcmp(before, after, sizeof before) == 0);
  ck_assert_uint_eq(failed_calls(), failed0 + 5);
  ck_assert_int_eq(xs_call(&x, RPC_LOOKUP, 0, q, len, msg, &out, &olen), RPC_OK);
  free(out);
  free(q);
  /* A stop with the stream open and idle ends it at once instead of
   * waiting out the grace period for it. */
  ck_assert_int_eq(server_stop(&srv), 0);
  ck_assert_int_eq(xs_call(&x, RPC_LOOKUP, 0, NULL, 0, msg, NULL, NULL), -1);
  char *log = slurp(log_path);
  ck_assert_ptr_nonnull(log);
  ck_assert_msg(!strstr(log, "grace period"), "%s", log);
  free(log);
  xs_free(&x);
  grpc_channel_destroy(ch);
  rpc_global_shutdown();
}
END_TEST

START_TEST(test_read_only_refuses_push) {
  test_server ro;
  char args[1200];
  snprintf(args, sizeof args, "--plan '%s' --shard 0 --read-only", plan_path);
  server_start(&ro, args, log_path);
  fill_grads(1);
  call_table t[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 0}};
  size_t len;
  uint8_t *q = enc_push(fp, "job", 0, 0.5f, t, 2, &len);
  char msg[512];
  int st = calls_push(ro.addr, q, len, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION, "status %d: %s", st, msg);
  ck_assert_msg(strstr(msg, "read-only"), "%s", msg);
  ck_assert_int_eq(server_stop(&ro), 0);
}
END_TEST

/* (Re)start the fixture's server on its data dir, extra flags after. */
static void restart(const char *extra) {
  char args[1400];
  snprintf(args, sizeof args,
           "--plan '%s' --shard 0 --max-ids 64 --data-dir '%s/data' --checkpoint-root '%s' %s",
           plan_path, dir, dir, extra);
  server_start(&srv, args, log_path);
}

/* Checkpoint (restore 0) or Restore (1) path on the fixture's server. */
static int ckpt_call(int restore, const char *path, char *msg) {
  uint8_t buf[1024];
  size_t len;
  if (restore) {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__restore_request__pack(&q, buf);
  } else {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    len = shardrec__v1__checkpoint_request__pack(&q, buf);
  }
  return call(restore ? RPC_RESTORE : RPC_CHECKPOINT, buf, len, NULL, NULL, msg);
}

static int stats_unclean(void) {
  Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
  int u = a->unclean;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return u;
}

/* A --data-dir server SIGKILLed after pushes reached RocksDB and restarted
 * on the same folder refuses Lookup, Push and Checkpoint with
 * FAILED_PRECONDITION until a Restore, which brings the checkpoint's rows
 * back; a clean stop (SIGTERM) is restarted serving; --accept-unclean
 * serves rows left by a crash as they are. */
START_TEST(test_crash_refused_until_restore) {
  char msg[512], ck[600];
  snprintf(ck, sizeof ck, "%s/ck1", dir);
  fill_grads(1);
  int applied = 0;
  ck_assert_int_eq(push_ok("job-c", 0, &applied), RPC_OK);
  float s1[13 * DIM], s2[13 * DIM], now[13 * DIM];
  snapshot(s1);
  ck_assert_msg(ckpt_call(0, ck, msg) == RPC_OK, "checkpoint: %s", msg); /* rows now in RocksDB */
  ck_assert_int_eq(push_ok("job-c", 1, &applied), RPC_OK);
  ck_assert_int_eq(stats_unclean(), 0);
  server_kill9(&srv);
  restart("");
  ck_assert_int_eq(stats_unclean(), 1);
  call_table t[2] = {{0, ids0, 8, NULL, 0}, {1, ids1, 5, NULL, 0}};
  size_t len;
  uint8_t *q = enc_lookup(fp, t, 2, &len);
  int st = calls_lookup(srv.addr, q, len, 10, t, 2, DIM, now, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION && !strcmp(msg, RPC_MSG_UNCLEAN), "lookup: %d %s", st, msg);
  ck_assert_int_eq(push_ok("job-c", 2, &applied), RPC_FAILED_PRECONDITION);
  char ck2[600];
  snprintf(ck2, sizeof ck2, "%s/ck2", dir);
  ck_assert_int_eq(ckpt_call(0, ck2, msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "not consistent after a crash"), "%s", msg);
  char *log = slurp(log_path);
  ck_assert_msg(log && strstr(log, "was not stopped cleanly"), "%s", log ? log : "(no log)");
  free(log);
  /* Restore: the checkpoint's rows, served again. */
  ck_assert_msg(ckpt_call(1, ck, msg) == RPC_OK, "restore: %s", msg);
  ck_assert_int_eq(stats_unclean(), 0);
  snapshot(now);
  ck_assert(!memcmp(now, s1, sizeof now));
  /* A clean stop: the next start serves the rows it left. */
  ck_assert_int_eq(push_ok("job-d", 0, &applied), RPC_OK);
  snapshot(s2);
  ck_assert(memcmp(s2, s1, sizeof s2) != 0);
  ck_assert_int_eq(server_stop(&srv), 0);
  restart("");
  ck_assert_int_eq(stats_unclean(), 0);
  snapshot(now);
  ck_assert(!memcmp(now, s2, sizeof now));
  /* A crash again, with --accept-unclean: served as they are. */
  ck_assert_int_eq(push_ok("job-d", 1, &applied), RPC_OK);
  ck_assert_msg(ckpt_call(0, ck2, msg) == RPC_OK, "checkpoint: %s", msg);
  snapshot(s2); /* all of it in RocksDB (the checkpoint wrote it back) */
  server_kill9(&srv);
  restart("--accept-unclean");
  ck_assert_int_eq(stats_unclean(), 0);
  snapshot(now);
  ck_assert(!memcmp(now, s2, sizeof now));
  ck_assert_int_eq(push_ok("job-e", 0, &applied), RPC_OK);
  log = slurp(log_path);
  ck_assert_msg(log && strstr(log, "serving its rows as they are (--accept-unclean)"), "%s",
                log ? log : "(no log)");
  free(log);
}
END_TEST

/* The server's shardrec_server_unclean gauge on its /metrics at port. */
static double metric_unclean(int port) {
  char *page = http_get(port, "/metrics");
  ck_assert_ptr_nonnull(page);
  const char *at = strstr(page, "\nshardrec_server_unclean ");
  ck_assert_msg(at, "no shardrec_server_unclean in:\n%s", page);
  double v = atof(at + strlen("\nshardrec_server_unclean "));
  free(page);
  return v;
}

/* The rows a crash left stay refused across clean stops until a Restore:
 * a --data-dir server SIGKILLed after pushes and restarted refuses them;
 * stopped with SIGTERM (exit 0) while refusing, it says it leaves them
 * unmarked, and the next start refuses them again (Stats unclean, metric
 * shardrec_server_unclean 1), after a SIGINT too; a Restore serves the
 * checkpoint's rows (metric 0), and a clean stop after it is restarted
 * serving the rows it left. */
START_TEST(test_clean_stop_keeps_crash) {
  char msg[512], ck[600], extra[200];
  snprintf(ck, sizeof ck, "%s/ck1", dir);
  fill_grads(1);
  int applied = 0;
  ck_assert_int_eq(push_ok("job-k", 0, &applied), RPC_OK);
  float saved[13 * DIM], now[13 * DIM];
  snapshot(saved);
  ck_assert_msg(ckpt_call(0, ck, msg) == RPC_OK, "checkpoint: %s", msg);
  ck_assert_int_eq(push_ok("job-k", 1, &applied), RPC_OK);
  ck_assert_int_eq(push_ok("job-k", 2, &applied), RPC_OK);
  server_kill9(&srv);
  restart("");
  ck_assert_int_eq(stats_unclean(), 1);
  ck_assert_int_eq(push_ok("job-k", 3, &applied), RPC_FAILED_PRECONDITION);
  ck_assert_int_eq(server_stop(&srv), 0);
  int port = free_port();
  snprintf(extra, sizeof extra, "--metrics-listen 127.0.0.1:%d", port);
  restart(extra);
  ck_assert_int_eq(stats_unclean(), 1);
  ck_assert(metric_unclean(port) == 1);
  char *log = slurp(log_path);
  ck_assert_msg(log && strstr(log, "not marked clean, the next start refuses them too"), "%s",
                log ? log : "(no log)");
  free(log);
  call_table t[2] = {{0, ids0, 8, NULL, 0}, {1, ids1, 5, NULL, 0}};
  size_t len;
  uint8_t *q = enc_lookup(fp, t, 2, &len);
  int st = calls_lookup(srv.addr, q, len, 10, t, 2, DIM, now, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION && !strcmp(msg, RPC_MSG_UNCLEAN), "lookup: %d %s",
                st, msg);
  /* SIGINT is a clean stop too: the rows stay refused. */
  kill(srv.pid, SIGINT);
  int ws = wait_exit(srv.pid, 30);
  srv.pid = 0;
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit status %d", ws);
  restart(extra);
  ck_assert_int_eq(stats_unclean(), 1);
  ck_assert_msg(ckpt_call(1, ck, msg) == RPC_OK, "restore: %s", msg);
  ck_assert_int_eq(stats_unclean(), 0);
  ck_assert(metric_unclean(port) == 0);
  snapshot(now);
  ck_assert(!memcmp(now, saved, sizeof now));
  ck_assert_int_eq(push_ok("job-m", 0, &applied), RPC_OK);
  snapshot(saved);
  ck_assert_int_eq(server_stop(&srv), 0);
  restart("");
  ck_assert_int_eq(stats_unclean(), 0);
  snapshot(now);
  ck_assert(!memcmp(now, saved, sizeof now));
}
END_TEST

/* Python grpcio, stubs generated from rpc/shardrec.proto in the test:
 * the same ids give exactly the bytes the C client gets; Health SERVING. */
START_TEST(test_python_interop) {
  const char *src = getenv("SHARDREC_SRC");
  ck_assert_ptr_nonnull(src);
  char *out;
  int rc = run_cmd(&out, "/usr/bin/python3 -c 'import grpc, google.protobuf' && mkdir -p %s/py && "
                         "(/usr/bin/python3 -m grpc_tools.protoc -I%s --python_out=%s/py --grpc_python_out=%s/py "
                         "%s/rpc/shardrec.proto %s/rpc/health.proto 2>/dev/null || "
                         "protoc -I%s --python_out=%s/py --grpc_out=%s/py "
                         "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin %s/rpc/shardrec.proto %s/rpc/health.proto)",
                   dir, src, dir, dir, src, src, src, dir, dir, src, src);
  ck_assert_msg(rc == 0, "python stubs: %s", out);
  free(out);
  fill_grads(1);
  int applied;
  ck_assert_int_eq(push_ok("job-py", 0, &applied), RPC_OK);
  float rows[13 * DIM];
  snapshot(rows);
  char script[600];
  snprintf(script, sizeof script, "%s/client.py", dir);
  FILE *f = fopen(script, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f,
          "import sys, grpc\n"
          "sys.path.insert(0, '%s/py')\n"
          "from rpc import shardrec_pb2 as pb, shardrec_pb2_grpc as pbg, health_pb2 as hp, health_pb2_grpc as hpg\n"
          "ch = grpc.insecure_channel('%s')\n"
          "h = hpg.HealthStub(ch).Check(hp.HealthCheckRequest(), timeout=10)\n"
          "print('health', hp.HealthCheckResponse.ServingStatus.Name(h.status))\n"
          "q = pb.LookupRequest(header=pb.RequestHeader(plan_fingerprint='%s', job_id='py', step=0, rank=0, world_size=1))\n",
          dir, srv.addr, fp);
  fprintf(f, "q.tables.add(table_id=0, ids=[");
  for (int i = 0; i < 8; i++) fprintf(f, "%llu,", (unsigned long long)ids0[i]);
  fprintf(f, "])\nq.tables.add(table_id=1, ids=[");
  for (int i = 0; i < 5; i++) fprintf(f, "%llu,", (unsigned long long)ids1[i]);
  fprintf(f, "])\n"
             "a = pbg.EmbeddingShardStub(ch).Lookup(q, timeout=10)\n"
             "open('%s/py.bin', 'wb').write(a.tables[0].rows + a.tables[1].rows)\n"
             "try:\n"
             "    q.header.plan_fingerprint = 'x'\n"
             "    pbg.EmbeddingShardStub(ch).Lookup(q, timeout=10)\n"
             "except grpc.RpcError as e:\n"
             "    print('refused', e.code().name)\n",
          dir);
  fclose(f);
  rc = run_cmd(&out, "/usr/bin/python3 %s", script);
  ck_assert_msg(rc == 0, "python client: %s", out);
  ck_assert_msg(strstr(out, "health SERVING"), "%s", out);
  ck_assert_msg(strstr(out, "refused FAILED_PRECONDITION"), "%s", out);
  free(out);
  char pyb[600];
  snprintf(pyb, sizeof pyb, "%s/py.bin", dir);
  FILE *pf = fopen(pyb, "rb");
  ck_assert_ptr_nonnull(pf);
  float py[13 * DIM + 1];
  size_t got = fread(py, 1, sizeof py, pf);
  fclose(pf);
  ck_assert_int_eq(got, sizeof rows);
  ck_assert(memcmp(py, rows, sizeof rows) == 0);
}
END_TEST

/* A Push on an exchange stream is answered once taken and updated right
 * after: the very next call reads it. One whose update the store then
 * refuses (a finite gradient overflowing table 1's Adagrad accumulator)
 * is answered applied, counted failed, and leaves the rows as they were
 * and the server refusing Lookup, Push and Checkpoint, on streams and
 * calls, naming the push and the row, across a clean stop (its rows not
 * marked clean), until a Restore serves the checkpoint's rows again. */
START_TEST(test_stream_push_refused_after_answer) {
  rpc_global_init();
  grpc_channel *ch = raw_channel(srv.addr, 0);
  xs_raw x;
  xs_open(&x, ch);
  char msg[512], ck[600], ck2[600];
  snprintf(ck, sizeof ck, "%s/ck-xs", dir);
  snprintf(ck2, sizeof ck2, "%s/ck-xs2", dir);
  fill_grads(1);
  int applied = 0;
  ck_assert_int_eq(push_ok("job-x", 0, &applied), RPC_OK);
  ck_assert_msg(ckpt_call(0, ck, msg) == RPC_OK, "checkpoint: %s", msg);
  float s1[13 * DIM], now[13 * DIM], want[13 * DIM];
  snapshot(s1);
  /* A good push on the stream reads back at once as a call's push of the
   * same gradients does (the call pushed, read, and restored away). */
  call_table good[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, g1, 0}};
  ck_assert_int_eq(push_ok("job-y", 0, &applied), RPC_OK);
  snapshot(want);
  ck_assert(memcmp(want, s1, sizeof want) != 0);
  ck_assert_msg(ckpt_call(1, ck, msg) == RPC_OK, "restore: %s", msg);
  xs_push_applied(&x, "job-x", 1, good);
  snapshot(now);
  ck_assert(!memcmp(now, want, sizeof now));
  ck_assert_msg(ckpt_call(1, ck, msg) == RPC_OK, "restore: %s", msg);
  /* The overflowing one: answered applied, then refused. */
  const uint64_t failed0 = failed_calls();
  float big[5 * DIM];
  memcpy(big, g1, sizeof big);
  big[3 * DIM + 2] = 3e38f;
  call_table over[2] = {{0, ids0, 8, g0, 0}, {1, ids1, 5, big, 0}};
  xs_push_applied(&x, "job-x", 1, over);
  ck_assert_uint_eq(failed_calls(), failed0 + 1);
  char row[160];
  snprintf(row, sizeof row, "table %u (%s) row %llu:", plan->tables[1].table_id,
           plan->tables[1].name, (unsigned long long)ids1[3]);
  call_table tl[2] = {{0, ids0, 8, NULL, 0}, {1, ids1, 5, NULL, 0}};
  size_t len;
  uint8_t *q = enc_lookup(fp, tl, 2, &len);
  int st = calls_lookup(srv.addr, q, len, 10, tl, 2, DIM, now, msg, sizeof msg);
  ck_assert_msg(st == RPC_FAILED_PRECONDITION && strstr(msg, "push of step 1 of job job-x") &&
                    strstr(msg, row) && strstr(msg, "Restore a checkpoint"),
                "lookup: %d %s", st, msg);
  q = enc_lookup(fp, tl, 2, &len); /* calls_lookup took the first */
  ck_assert_int_eq(xs_call(&x, RPC_LOOKUP, 0, q, len, msg, NULL, NULL), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, row), "%s", msg);
  free(q);
  ck_assert_int_eq(push_ok("job-x", 2, &applied), RPC_FAILED_PRECONDITION);
  ck_assert_int_eq(ckpt_call(0, ck2, msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "was not applied"), "%s", msg);
  /* A clean stop leaves the rows unmarked: the next start refuses them. */
  xs_free(&x);
  ck_assert_int_eq(server_stop(&srv), 0);
  char *log = slurp(log_path);
  ck_assert_msg(log && strstr(log, "miss a push answered before its update failed"), "%s",
                log ? log : "(no log)");
  free(log);
  restart("");
  ck_assert_int_eq(stats_unclean(), 1);
  grpc_channel_destroy(ch);
  ch = raw_channel(srv.addr, 0);
  xs_open(&x, ch);
  /* Restore: the checkpoint's rows, served again; pushes apply again. */
  ck_assert_msg(ckpt_call(1, ck, msg) == RPC_OK, "restore: %s", msg);
  snapshot(now);
  ck_assert(!memcmp(now, s1, sizeof now));
  xs_push_applied(&x, "job-x", 1, good);
  snapshot(now);
  ck_assert(!memcmp(now, want, sizeof now));
  xs_free(&x);
  grpc_channel_destroy(ch);
  rpc_global_shutdown();
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_server");
  const TTest *tests[] = {test_bad_requests_change_nothing, test_retried_push_applied_once,
                          test_health_unknown_method_sigterm, test_read_only_refuses_push,
                          test_python_interop, test_crash_refused_until_restore,
                          test_clean_stop_keeps_crash, test_exchange_stream,
                          test_stream_push_refused_after_answer, NULL};
  calls_tcase(s, "server", 120, setup, teardown, tests);
  return sr_check_run(s);
}
