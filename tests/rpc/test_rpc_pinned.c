/* Lookup answers sent from the shard store's memory (pinned rows), from
 * outside: a real `shardrec serve --data-dir` process, gRPC core
 * clients that send a Lookup and do not read its answer (their stream
 * window kept at 64 KiB, no BDP probing, so most of a 4 MB answer stays in
 * the server, waiting), the in-process local store as the oracle of every
 * row's bits.
 *   - The bytes being sent never change: a Push to the rows of an unread
 *     answer, and Lookups of other rows that evict around them, leave the
 *     answer as it was when it was looked up (the local store's rows
 *     before the push, bit for bit), while a Lookup after the push sees
 *     the pushed rows. Stats shows the rows pinned while unread (so the
 *     pinned path was taken: a gather would copy and show 0) and 0 once
 *     read.
 *   - A client that never reads: other clients' Lookups (evicting) and
 *     Pushes go on; the pinned rows and bytes show in Stats and count
 *     against --inflight-mb (a further large Lookup is refused
 *     RESOURCE_EXHAUSTED "in-flight memory budget"); once the calls'
 *     deadline passes the pins are released (Stats 0) and the budget is
 *     there again.
 *   - A server stopped with an answer unread exits cleanly.
 *   - Python grpcio decodes a pinned answer (a slice per row, no padding
 *     field) to the rows the C client gets. */
#include <check.h>

#include "tests/check_main.h"

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/grpc_impl.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/rpc/calls.h"
#include "tests/rpc/raw_call.h"
#include "tests/support/servers.h"

#define DIM 1024 /* 4 KiB rows: answered pinned (RPC_PIN_MIN_ROW_BYTES) */
#define BIG 1000 /* ids of an unread Lookup: 4 MB of rows */
#define SMALL 250
#define ROW_BYTES (DIM * 4)

static char *dir;
static char plan_path[512], log_path[512];
static emb_plan *plan;
static char fp[EMB_FP_HEX];
static test_server srv;
static emb_store *oracle; /* the local store: the rows' bits */

static void setup(void) {
  uint64_t rows[1] = {0}; /* unbounded: any id, its init value computed */
  emb_plan_params pp = {.n_tables = 1, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_SGD, .eps = -1}, .seed = 7, .n_shards = 1};
  calls_plan_setup(&pp, &dir, plan_path, log_path, sizeof plan_path, &plan, fp);
  char err[512];
  oracle = emb_store_create_local(plan, err, sizeof err);
  ck_assert_msg(oracle, "%s", err);
  rpc_global_init();
}

static void teardown(void) {
  rpc_global_shutdown();
  emb_store_destroy(oracle);
  calls_teardown(&srv, log_path, plan, dir);
}

/* serve --data-dir with a cache of cache_rows rows, and extra flags. */
static void start(long cache_rows, const char *extra) {
  char args[1600];
  snprintf(args, sizeof args,
           "--plan '%s' --shard 0 --data-dir '%s/data' --cache-rows %ld --max-message-mb 8 %s",
           plan_path, dir, cache_rows, extra);
  server_start(&srv, args, log_path);
}

/* ids first, first + 1, ... (n) in a malloc'd array. */
static uint64_t *id_range(uint64_t first, size_t n) {
  uint64_t *ids = malloc(n * sizeof *ids);
  for (size_t i = 0; i < n; i++) ids[i] = first + i;
  return ids;
}

static uint8_t *lookup_req(int64_t step, const uint64_t *ids, size_t n, size_t *len) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, "pinned", step, 0, 1, 0);
  call_table t = {plan->tables[0].table_id, ids, n, NULL, 0};
  return calls_pack_lookup(&h, &t, 1, len);
}

/* A Lookup of ids[n] at step, read whole: OK, its rows into rows. */
static void lookup_read(int64_t step, const uint64_t *ids, size_t n, float *rows) {
  size_t len;
  uint8_t *q = lookup_req(step, ids, n, &len);
  call_table t = {plan->tables[0].table_id, ids, n, NULL, 0};
  char msg[512];
  int st = calls_lookup(srv.addr, q, len, 60, &t, 1, DIM, rows, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "lookup of %zu ids: %d %s", n, st, msg);
}

/* A Push of step to ids[n], gradient g[n * DIM], lr 0.5, on the server and
 * the oracle. */
static void push_both(int64_t step, const uint64_t *ids, size_t n, const float *g) {
  Shardrec__V1__RequestHeader h;
  calls_header(&h, fp, "pinned", step, 0, 1, 0);
  call_table t = {plan->tables[0].table_id, ids, n, g, 0};
  size_t len;
  uint8_t *q = calls_pack_push(&h, 0.5f, &t, 1, DIM, &len);
  char msg[512];
  int st = calls_push(srv.addr, q, len, NULL, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "push: %d %s", st, msg);
  const uint64_t *tid[1] = {ids};
  size_t cnt[1] = {n};
  emb_idset set = {.n_tables = 1, .ids = tid, .counts = cnt};
  const float *gr[1] = {g};
  ck_assert_int_eq(emb_store_push(oracle, step, 0.5f, &set, gr), 0);
}

/* The oracle's rows of ids[n] now. */
static void oracle_rows(const uint64_t *ids, size_t n, float *rows) {
  const uint64_t *tid[1] = {ids};
  size_t cnt[1] = {n};
  emb_idset set = {.n_tables = 1, .ids = tid, .counts = cnt};
  float *out[1] = {rows};
  ck_assert_int_eq(emb_store_lookup_begin(oracle, 0, &set, out), 0);
  ck_assert_int_eq(emb_store_lookup_wait(oracle), 0);
}

/* Send request req[len] on a new call with a deadline of deadline_s and
 * wait until it is sent; nothing is read yet. */
static void raw_send(grpc_channel *ch, grpc_completion_queue *cq, raw_call *c, const uint8_t *req,
                     size_t len, double deadline_s) {
  raw_start(ch, cq, c, req, len, deadline_s, 0);
  raw_wait(cq, 1, 1);
}

/* Wait (polling Stats, 120 s at most) until the server holds exactly rows
 * pinned rows, rows x ROW_BYTES bytes; then its in-flight bytes. */
static uint64_t wait_pinned(uint64_t rows) {
  double t0 = test_now();
  for (;;) {
    Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
    uint64_t r = a->pinned_rows, b = a->pinned_bytes, in = a->inflight_bytes;
    shardrec__v1__stats_response__free_unpacked(a, NULL);
    if (r == rows) {
      ck_assert_uint_eq(b, rows * ROW_BYTES);
      return in;
    }
    ck_assert_msg(test_now() - t0 < 120, "Stats: %llu rows pinned after 120 s; want %llu",
                  (unsigned long long)r, (unsigned long long)rows);
    usleep(10 * 1000);
  }
}

/* The rows of answer c (status OK, one table of n rows) into rows. */
static void answer_rows(const raw_call *c, size_t n, float *rows) {
  char *d = grpc_slice_to_c_string(c->details);
  ck_assert_msg(c->status == GRPC_STATUS_OK, "status %d: %s", c->status, d);
  gpr_free(d);
  uint8_t *b;
  size_t bl;
  ck_assert_int_eq(rpc__bb_read(c->recv, &b, &bl), 0);
  Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, bl, b);
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_eq(a->n_tables, 1);
  ck_assert_int_eq(a->tables[0]->dim, DIM);
  ck_assert_uint_eq(a->tables[0]->rows.len, n * ROW_BYTES);
  memcpy(rows, a->tables[0]->rows.data, n * ROW_BYTES);
  shardrec__v1__lookup_response__free_unpacked(a, NULL);
  free(b);
}

static float *grads(size_t n, float v) {
  float *g = malloc(n * ROW_BYTES);
  for (size_t i = 0; i < n * DIM; i++) g[i] = v + (float)(i % 7) * 0.25f;
  return g;
}

/* A Lookup of ids[BIG] sent on a new slow channel (*ch, *cq) as *c and
 * left unread, once the server has handled it and sent it from the store
 * (Stats: its rows pinned). */
static void send_unread(const uint64_t *ids, grpc_channel **ch, grpc_completion_queue **cq,
                        raw_call *c) {
  *ch = raw_channel(srv.addr, 1);
  *cq = grpc_completion_queue_create_for_next(NULL);
  size_t len;
  uint8_t *q = lookup_req(0, ids, BIG, &len);
  raw_send(*ch, *cq, c, q, len, 300);
  free(q);
  wait_pinned(BIG);
}

/* An unread answer's bytes survive a Push to its rows and evictions
 * around them; the rows after the push are the pushed ones. */
START_TEST(test_sent_bytes_never_change) {
  start(2500, "");
  uint64_t *ids = id_range(1000, BIG);
  float *before = malloc(BIG * ROW_BYTES), *got = malloc(BIG * ROW_BYTES);
  oracle_rows(ids, BIG, before);
  grpc_channel *ch;
  grpc_completion_queue *cq;
  raw_call c;
  send_unread(ids, &ch, &cq, &c);
  float *g = grads(BIG, 0.125f);
  push_both(0, ids, BIG, g);
  float *after = malloc(BIG * ROW_BYTES);
  oracle_rows(ids, BIG, after);
  ck_assert(memcmp(before, after, BIG * ROW_BYTES) != 0); /* the push changed them */
  /* Rows pushed: a Lookup now sees them. (Beside the 1000 held, 1000 more
   * do not fit the room pins may take in a cache of 2500: this one and
   * those below are gathered, the fallback.) */
  lookup_read(1, ids, BIG, got);
  ck_assert(memcmp(got, after, BIG * ROW_BYTES) == 0);
  /* 4 x 1000 other rows through a cache of 2500 (1000 held, 1000 the
   * pushed copies): evictions, the pinned slots skipped, never waited for. */
  for (int k = 0; k < 4; k++) {
    uint64_t *o = id_range(100000 + (uint64_t)k * BIG, BIG);
    lookup_read(2 + k, o, BIG, got);
    float *want = malloc(BIG * ROW_BYTES);
    oracle_rows(o, BIG, want);
    ck_assert(memcmp(got, want, BIG * ROW_BYTES) == 0);
    free(want);
    free(o);
  }
  wait_pinned(BIG); /* the unread answer is still held */
  raw_read(cq, &c);
  answer_rows(&c, BIG, got);
  ck_assert_msg(memcmp(got, before, BIG * ROW_BYTES) == 0,
                "the unread answer's bytes changed while it waited");
  raw_free(&c);
  wait_pinned(0); /* read: released */
  /* And the rows are still the pushed ones (moved, not lost). */
  lookup_read(6, ids, BIG, got);
  ck_assert(memcmp(got, after, BIG * ROW_BYTES) == 0);
  raw_cq_drain(cq);
  grpc_channel_destroy(ch);
  free(g), free(after), free(before), free(got), free(ids);
}
END_TEST

/* Lookups whose answers are never read: others go on, the pins count
 * against the budget, the deadline releases them. */
START_TEST(test_client_never_reads) {
  /* Budget 16 MiB: a BIG Lookup takes 3 x 4 MB while it is built and
   * keeps 4 MB pinned; two of them leave too little for a third. */
  start(5000, "--inflight-mb 16");
  grpc_channel *ch = raw_channel(srv.addr, 1);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  raw_call c[2];
  uint64_t *ids[2];
  /* Long enough for what runs meanwhile: on 2 cores 1.4 s here, 2 s under
   * ASan, 2.5 s under ASan beside two busy loops. */
  const double deadline = 10;
  double t_sent = test_now();
  for (int k = 0; k < 2; k++) {
    ids[k] = id_range(1000 + (uint64_t)k * BIG, BIG);
    size_t len;
    uint8_t *q = lookup_req(0, ids[k], BIG, &len);
    raw_send(ch, cq, &c[k], q, len, deadline);
    free(q);
    wait_pinned((uint64_t)(k + 1) * BIG);
  }
  uint64_t held = wait_pinned(2 * BIG);
  ck_assert_uint_ge(held, 2 * BIG * ROW_BYTES); /* the pinned bytes count in the budget */
  /* Others go on: small Lookups of 7500 fresh rows (evicting around the
   * 2000 pinned ones in a cache of 5000) and a Push to pinned rows. */
  float *got = malloc(BIG * ROW_BYTES), *want = malloc(BIG * ROW_BYTES);
  for (int k = 0; k < 30; k++) {
    uint64_t *o = id_range(200000 + (uint64_t)k * SMALL, SMALL);
    lookup_read(1, o, SMALL, got);
    oracle_rows(o, SMALL, want);
    ck_assert(memcmp(got, want, SMALL * ROW_BYTES) == 0);
    free(o);
  }
  float *g = grads(SMALL, -0.5f);
  push_both(1, ids[0], SMALL, g);
  lookup_read(2, ids[0], SMALL, got);
  oracle_rows(ids[0], SMALL, want);
  ck_assert(memcmp(got, want, SMALL * ROW_BYTES) == 0);
  /* A third large Lookup finds no room: refused, naming the budget. */
  size_t len;
  uint64_t *more = id_range(500000, BIG);
  uint8_t *q = lookup_req(3, more, BIG, &len);
  call_table t = {plan->tables[0].table_id, more, BIG, NULL, 0};
  char msg[512];
  int st = calls_lookup(srv.addr, q, len, 60, &t, 1, DIM, got, msg, sizeof msg);
  ck_assert_msg(st == RPC_RESOURCE_EXHAUSTED && strstr(msg, "in-flight memory budget"),
                "status %d: %s", st, msg);
  ck_assert_msg(test_now() - t_sent < deadline, "the test ran past the unread calls' deadline "
                "before it checked the budget: make the deadline longer");
  /* The deadline passes: the calls are cancelled and their pins go. */
  wait_pinned(0);
  double t0 = test_now();
  for (;;) { /* and their budget (given back with the pins) */
    Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
    uint64_t in = a->inflight_bytes;
    shardrec__v1__stats_response__free_unpacked(a, NULL);
    if (!in) break;
    ck_assert_msg(test_now() - t0 < 120, "%llu bytes still in flight", (unsigned long long)in);
    usleep(10 * 1000);
  }
  lookup_read(4, more, BIG, got); /* the budget is there again */
  oracle_rows(more, BIG, want);
  ck_assert(memcmp(got, want, BIG * ROW_BYTES) == 0);
  for (int k = 0; k < 2; k++) {
    raw_read(cq, &c[k]); /* the cancelled calls end DEADLINE_EXCEEDED */
    ck_assert_int_eq(c[k].status, GRPC_STATUS_DEADLINE_EXCEEDED);
    raw_free(&c[k]);
    free(ids[k]);
  }
  raw_cq_drain(cq);
  grpc_channel_destroy(ch);
  free(more), free(g), free(got), free(want);
}
END_TEST

/* A server stopped while a pinned answer is unread exits cleanly (its
 * grace period, --stop-grace, passes, the call is cancelled, the pins go
 * after the service and the store may be gone: a sanitizer build sees any
 * touch of freed memory), and the client hears the call end. */
START_TEST(test_stop_with_answer_unread) {
  start(2500, "--stop-grace 0.3");
  uint64_t *ids = id_range(3000, BIG);
  grpc_channel *ch;
  grpc_completion_queue *cq;
  raw_call c;
  send_unread(ids, &ch, &cq, &c);
  int st = server_stop(&srv);
  ck_assert_msg(st == 0, "server exited with %d (log %s)", st, log_path);
  char *log = slurp(log_path);
  ck_assert_msg(strstr(log, "calls still running after the 0.3 s grace period: cancelled"),
                "no cancel after --stop-grace in the log:\n%s", text_end(log));
  free(log);
  raw_read(cq, &c);
  ck_assert_int_ne(c.status, GRPC_STATUS_OK);
  raw_free(&c);
  raw_cq_drain(cq);
  grpc_channel_destroy(ch);
  free(ids);
}
END_TEST

/* A pinned answer (one slice per row, no padding) decoded by Python
 * grpcio with stubs generated from rpc/shardrec.proto: the rows the C
 * client gets, the local store's bits. */
START_TEST(test_pinned_python_interop) {
  start(2500, "");
  const char *src = getenv("SHARDREC_SRC");
  ck_assert_ptr_nonnull(src);
  char *out;
  int rc = run_cmd(&out, "mkdir -p %s/py && (/usr/bin/python3 -m grpc_tools.protoc -I%s "
                         "--python_out=%s/py --grpc_python_out=%s/py %s/rpc/shardrec.proto "
                         "2>/dev/null || protoc -I%s --python_out=%s/py --grpc_out=%s/py "
                         "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin %s/rpc/shardrec.proto)",
                   dir, src, dir, dir, src, src, dir, dir, src);
  ck_assert_msg(rc == 0, "python stubs: %s", out);
  free(out);
  enum { N = 300 };
  uint64_t *ids = id_range(77, N);
  float *c_rows = malloc(N * ROW_BYTES), *want = malloc(N * ROW_BYTES), *py = malloc(N * ROW_BYTES + 1);
  lookup_read(0, ids, N, c_rows);
  oracle_rows(ids, N, want);
  ck_assert(memcmp(c_rows, want, N * ROW_BYTES) == 0);
  char script[600], pyb[600];
  snprintf(script, sizeof script, "%s/client.py", dir);
  snprintf(pyb, sizeof pyb, "%s/py.bin", dir);
  FILE *f = fopen(script, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f,
          "import sys, grpc\n"
          "sys.path.insert(0, '%s/py')\n"
          "from rpc import shardrec_pb2 as pb, shardrec_pb2_grpc as pbg\n"
          "ch = grpc.insecure_channel('%s', options=[('grpc.max_receive_message_length', 64 << 20)])\n"
          "q = pb.LookupRequest(header=pb.RequestHeader(plan_fingerprint='%s', job_id='pinned', "
          "step=1, rank=0, world_size=1))\n"
          "q.tables.add(table_id=%u, ids=range(77, 77 + %d))\n"
          "a = pbg.EmbeddingShardStub(ch).Lookup(q, timeout=60)\n"
          "assert len(a.tables) == 1 and a.tables[0].dim == %d and a.incarnation != 0\n"
          "open('%s', 'wb').write(a.tables[0].rows)\n",
          dir, srv.addr, fp, plan->tables[0].table_id, N, DIM, pyb);
  fclose(f);
  rc = run_cmd(&out, "/usr/bin/python3 %s", script);
  ck_assert_msg(rc == 0, "python client: %s", out);
  free(out);
  FILE *pf = fopen(pyb, "rb");
  ck_assert_ptr_nonnull(pf);
  size_t got = fread(py, 1, N * ROW_BYTES + 1, pf);
  fclose(pf);
  ck_assert_uint_eq(got, N * ROW_BYTES);
  ck_assert(memcmp(py, want, N * ROW_BYTES) == 0);
  free(ids), free(c_rows), free(want), free(py);
}
END_TEST

/* Wait (polling Stats, 120 s at most) until n calls and stream messages
 * wait for room in the budget. */
static void wait_waiting(uint64_t n) {
  double t0 = test_now();
  for (;;) {
    Shardrec__V1__StatsResponse *a = calls_stats(srv.addr);
    uint64_t w = a->inflight_waiting;
    shardrec__v1__stats_response__free_unpacked(a, NULL);
    if (w == n) return;
    ck_assert_msg(test_now() - t0 < 120, "Stats: %llu waiting for the budget; want %llu",
                  (unsigned long long)w, (unsigned long long)n);
    usleep(10 * 1000);
  }
}

/* Two BIG Lookups on ch whose answers stay unread: 8 MB pinned of the
 * 16 MiB budget, too little left for a third. */
static void hold_budget(grpc_channel *ch, grpc_completion_queue *cq, raw_call c[2],
                        uint64_t *ids[2], uint64_t first) {
  for (int k = 0; k < 2; k++) {
    ids[k] = id_range(first + (uint64_t)k * BIG, BIG);
    size_t len;
    uint8_t *q = lookup_req(0, ids[k], BIG, &len);
    raw_send(ch, cq, &c[k], q, len, 120);
    free(q);
    wait_pinned((uint64_t)(k + 1) * BIG);
  }
}

/* Read the held answers: the oracle's rows, and their budget given back. */
static void release_budget(grpc_completion_queue *cq, raw_call c[2], uint64_t *ids[2]) {
  float *got = malloc(BIG * ROW_BYTES), *want = malloc(BIG * ROW_BYTES);
  for (int k = 0; k < 2; k++) {
    raw_read(cq, &c[k]);
    answer_rows(&c[k], BIG, got);
    oracle_rows(ids[k], BIG, want);
    ck_assert(memcmp(got, want, BIG * ROW_BYTES) == 0);
    raw_free(&c[k]);
    free(ids[k]);
  }
  free(got), free(want);
}

/* A Lookup on an exchange stream that finds no room in the budget waits
 * at the server as a call does (Stats inflight_waiting) and is answered
 * with its rows once the answers holding the budget are read (pass 0);
 * one that waits past --inflight-wait is refused naming the budget, and
 * its stream goes on (pass 1); a stop refuses it at once instead of
 * waiting out --inflight-wait (pass 2: 600 s), and the server exits 0. */
START_TEST(test_stream_waits_for_budget) {
  float *want = malloc(BIG * ROW_BYTES);
  char msg[512];
  uint8_t *out;
  size_t olen, len;
  for (int pass = 0; pass < 3; pass++) {
    start(5000, pass == 1   ? "--inflight-mb 16 --inflight-wait 0.2"
                : pass == 2 ? "--inflight-mb 16 --inflight-wait 600 --stop-grace 0.3"
                            : "--inflight-mb 16 --inflight-wait 600");
    grpc_channel *ch = raw_channel(srv.addr, 1), *xch = raw_channel(srv.addr, 0);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    raw_call c[2];
    uint64_t *ids[2];
    hold_budget(ch, cq, c, ids, 1000);
    xs_raw x;
    xs_open(&x, xch);
    uint64_t *more = id_range(500000, BIG);
    uint8_t *q = lookup_req(1, more, BIG, &len);
    xs_begin(&x, RPC_LOOKUP, 0, q, len);
    free(q);
    if (pass != 1) wait_waiting(1);
    if (pass == 0) {
      release_budget(cq, c, ids);
      int st = xs_finish(&x, msg, &out, &olen);
      ck_assert_msg(st == RPC_OK, "status %d: %s", st, msg);
      Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, olen, out);
      ck_assert_ptr_nonnull(a);
      ck_assert_uint_eq(a->tables[0]->rows.len, BIG * ROW_BYTES);
      oracle_rows(more, BIG, want);
      ck_assert(memcmp(a->tables[0]->rows.data, want, BIG * ROW_BYTES) == 0);
      shardrec__v1__lookup_response__free_unpacked(a, NULL);
      free(out);
      wait_waiting(0);
    } else if (pass == 1) {
      int st = xs_finish(&x, msg, NULL, NULL);
      ck_assert_msg(st == RPC_RESOURCE_EXHAUSTED && strstr(msg, "in-flight memory budget"),
                    "status %d: %s", st, msg);
      wait_waiting(0);
      /* The stream goes on: a small Lookup fits beside the held answers. */
      q = lookup_req(2, more, SMALL, &len);
      st = xs_call(&x, RPC_LOOKUP, 0, q, len, msg, &out, &olen);
      ck_assert_msg(st == RPC_OK, "status %d: %s", st, msg);
      free(q);
      free(out);
      release_budget(cq, c, ids);
    } else {
      /* Refused as the stop begins; waiting on, it would be cancelled (or
       * find room) only when the grace period ends the held answers. */
      ck_assert_int_eq(server_stop(&srv), 0);
      int st = xs_finish(&x, msg, NULL, NULL);
      ck_assert_msg(st == RPC_RESOURCE_EXHAUSTED && strstr(msg, "in-flight memory budget"),
                    "status %d: %s", st, msg);
      for (int k = 0; k < 2; k++) { /* the held answers: ended by the stop */
        raw_read(cq, &c[k]);
        raw_free(&c[k]);
        free(ids[k]);
      }
    }
    if (pass != 2) xs_close(&x);
    else xs_free(&x);
    free(more);
    raw_cq_drain(cq);
    grpc_channel_destroy(ch);
    grpc_channel_destroy(xch);
    ck_assert_int_eq(server_stop(&srv), 0);
  }
  free(want);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_pinned");
  const TTest *tests[] = {test_sent_bytes_never_change, test_client_never_reads,
                          test_stop_with_answer_unread, test_pinned_python_interop,
                          test_stream_waits_for_budget, NULL};
  calls_tcase(s, "pinned", 300, setup, teardown, tests);
  return sr_check_run(s);
}
