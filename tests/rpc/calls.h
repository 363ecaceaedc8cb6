/* Lookup and Push calls as the rpc tests send them to a shard server: build
 * the RequestHeader, pack a LookupRequest or PushRequest, make one
 * rpc_call_once and unpack the answer. Shared by test_rpc_sync.c,
 * test_rpc_async.c and test_rpc_server.c; static, so each test binary gets
 * its own copy and a test that uses only part of it must not warn (hence
 * the unused attribute).
 *
 * It also holds Stats and the wait for parked calls, the fixture halves and
 * the suite shape the three share.
 *
 * Every failed check is a Check assertion (ck_assert_*): use these from a
 * test (or its fixture), not from a forked child that must _exit. */
#ifndef SHARDREC_TESTS_RPC_CALLS_H
#define SHARDREC_TESTS_RPC_CALLS_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "rpc/client.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/support/servers.h"

#define CALLS_UNUSED __attribute__((unused))

/* The most tables one request of these helpers carries. */
#define CALLS_MAX_TABLES 4

/* One table's part of a request. */
typedef struct {
  uint32_t table_id;
  const uint64_t *ids;
  size_t n;
  const float *grads; /* Push only: n*dim floats unless glen overrides */
  size_t glen;        /* Push only: bytes of grads; 0: n*dim*sizeof(float) */
} call_table;

/* Fill *h: plan fingerprint fp (not copied), job (not copied), step, rank
 * of world, max_staleness stale (0: a sync job; > 0: async with that bound;
 * the sync tests always send 0). */
static CALLS_UNUSED void calls_header(Shardrec__V1__RequestHeader *h, const char *fp,
                                      const char *job, int64_t step, int rank, int world,
                                      int stale) {
  shardrec__v1__request_header__init(h);
  h->plan_fingerprint = (char *)fp;
  h->job_id = (char *)job;
  h->step = step;
  h->rank = rank;
  h->world_size = world;
  h->max_staleness = stale;
}

/* A LookupRequest of t[nt] under header h, packed into a malloc'd buffer
 * (the caller frees it); *len its length. */
static CALLS_UNUSED uint8_t *calls_pack_lookup(Shardrec__V1__RequestHeader *h,
                                               const call_table *t, int nt, size_t *len) {
  ck_assert_int_le(nt, CALLS_MAX_TABLES);
  Shardrec__V1__TableIds ti[CALLS_MAX_TABLES], *tp[CALLS_MAX_TABLES];
  for (int i = 0; i < nt; i++) {
    shardrec__v1__table_ids__init(&ti[i]);
    ti[i].table_id = t[i].table_id;
    ti[i].ids = (uint64_t *)t[i].ids;
    ti[i].n_ids = t[i].n;
    tp[i] = &ti[i];
  }
  Shardrec__V1__LookupRequest q = SHARDREC__V1__LOOKUP_REQUEST__INIT;
  q.header = h;
  q.n_tables = (size_t)nt;
  q.tables = tp;
  *len = shardrec__v1__lookup_request__get_packed_size(&q);
  uint8_t *b = malloc(*len + 1);
  shardrec__v1__lookup_request__pack(&q, b);
  return b;
}

/* A PushRequest of t[nt] (dim floats a row) with learning rate lr under
 * header h, packed into a malloc'd buffer (the caller frees it); *len its
 * length. nt may be 0: an empty push, which still moves the rank's step. */
static CALLS_UNUSED uint8_t *calls_pack_push(Shardrec__V1__RequestHeader *h, float lr,
                                             const call_table *t, int nt, int dim, size_t *len) {
  ck_assert_int_le(nt, CALLS_MAX_TABLES);
  Shardrec__V1__TableGrads tg[CALLS_MAX_TABLES], *tp[CALLS_MAX_TABLES];
  for (int i = 0; i < nt; i++) {
    shardrec__v1__table_grads__init(&tg[i]);
    tg[i].table_id = t[i].table_id;
    tg[i].ids = (uint64_t *)t[i].ids;
    tg[i].n_ids = t[i].n;
    tg[i].grads.data = (uint8_t *)t[i].grads;
    tg[i].grads.len = t[i].glen ? t[i].glen : t[i].n * (size_t)dim * sizeof(float);
    tp[i] = &tg[i];
  }
  Shardrec__V1__PushRequest q = SHARDREC__V1__PUSH_REQUEST__INIT;
  q.header = h;
  q.learning_rate = lr;
  q.n_tables = (size_t)nt;
  q.tables = tp;
  *len = shardrec__v1__push_request__get_packed_size(&q);
  uint8_t *b = malloc(*len + 1);
  shardrec__v1__push_request__pack(&q, b);
  return b;
}

/* Send the packed PushRequest req[len] to addr (deadline 10 s) and free
 * req. Returns the status (message in msg); when OK, *applied (if applied
 * is not NULL) is the answer's applied flag: 0 for a retried push. */
static CALLS_UNUSED int calls_push(const char *addr, uint8_t *req, size_t len, int *applied,
                                   char *msg, size_t msglen) {
  uint8_t *resp = NULL;
  size_t rlen = 0;
  int st = rpc_call_once(addr, NULL, RPC_PUSH, req, len, 10, &resp, &rlen, msg, msglen);
  free(req);
  if (st == RPC_OK) {
    Shardrec__V1__PushResponse *a = shardrec__v1__push_response__unpack(NULL, rlen, resp);
    ck_assert_ptr_nonnull(a);
    if (applied) *applied = a->applied;
    shardrec__v1__push_response__free_unpacked(a, NULL);
  }
  free(resp);
  return st;
}

/* Send the packed LookupRequest req[len] of t[nt] to addr within deadline
 * seconds and free req. Returns the status (message in msg); when OK, the
 * answer has nt tables of dim floats a row, t[i].n rows each, and rows[]
 * gets them one table after the other. */
static CALLS_UNUSED int calls_lookup(const char *addr, uint8_t *req, size_t len, double deadline,
                                     const call_table *t, int nt, int dim, float *rows,
                                     char *msg, size_t msglen) {
  uint8_t *resp = NULL;
  size_t rlen = 0;
  int st = rpc_call_once(addr, NULL, RPC_LOOKUP, req, len, deadline, &resp, &rlen, msg, msglen);
  free(req);
  if (st == RPC_OK) {
    Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, rlen, resp);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->n_tables, (size_t)nt);
    for (int i = 0; i < nt; i++) {
      size_t bytes = t[i].n * (size_t)dim * sizeof(float);
      ck_assert_uint_eq(a->tables[i]->rows.len, bytes);
      ck_assert_int_eq(a->tables[i]->dim, dim);
      memcpy(rows, a->tables[i]->rows.data, bytes);
      rows += t[i].n * (size_t)dim;
    }
    shardrec__v1__lookup_response__free_unpacked(a, NULL);
  }
  free(resp);
  return st;
}

/* addr's Stats (which must answer OK), unpacked: the caller frees it with
 * shardrec__v1__stats_response__free_unpacked. */
static CALLS_UNUSED Shardrec__V1__StatsResponse *calls_stats(const char *addr) {
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  uint8_t b[8], *resp = NULL;
  size_t len = shardrec__v1__stats_request__pack(&q, b), rlen = 0;
  char msg[256];
  int st = rpc_call_once(addr, NULL, RPC_STATS, b, len, 10, &resp, &rlen, msg, sizeof msg);
  ck_assert_msg(st == RPC_OK, "stats: %d %s", st, msg);
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, rlen, resp);
  ck_assert_ptr_nonnull(a);
  free(resp);
  return a;
}

/* Wait until addr's Stats shows at least lookups parked Lookups and
 * watches parked Watches: the server holds those calls. Polls; fails only
 * when they are not all parked within timeout_s (a generous bound: an
 * event the test waits for, not a time it measures). */
static CALLS_UNUSED void calls_wait_parked(const char *addr, uint64_t lookups, uint64_t watches,
                                           double timeout_s) {
  double t0 = test_now();
  for (;;) {
    Shardrec__V1__StatsResponse *a = calls_stats(addr);
    uint64_t l = a->parked_lookups, w = a->parked_watches;
    shardrec__v1__stats_response__free_unpacked(a, NULL);
    if (l >= lookups && w >= watches) return;
    ck_assert_msg(test_now() - t0 < timeout_s,
                  "%s: %llu Lookup(s) and %llu Watch(es) parked after %.0f s; want %llu and %llu",
                  addr, (unsigned long long)l, (unsigned long long)w, timeout_s,
                  (unsigned long long)lookups, (unsigned long long)watches);
    usleep(10 * 1000);
  }
}

/* addr's Stats' exchange_streams: the exchange streams it has open. */
static CALLS_UNUSED uint64_t calls_open_streams(const char *addr) {
  Shardrec__V1__StatsResponse *a = calls_stats(addr);
  uint64_t n = a->exchange_streams;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return n;
}

/* Wait until addr has n exchange streams open (a stream its client closed
 * leaves the count once the server has ended it). Polls as
 * calls_wait_parked does; fails when the count is not n within timeout_s. */
static CALLS_UNUSED void calls_wait_streams(const char *addr, uint64_t n, double timeout_s) {
  double t0 = test_now();
  for (;;) {
    uint64_t open = calls_open_streams(addr);
    if (open == n) return;
    ck_assert_msg(test_now() - t0 < timeout_s, "%s: %llu exchange stream(s) open after %.0f s; "
                  "want %llu (closed streams stay counted)", addr, (unsigned long long)open,
                  timeout_s, (unsigned long long)n);
    usleep(10 * 1000);
  }
}

/* A fixture's first half: a fresh temp folder (*dir, malloc'd),
 * plan_path = dir/plan.json and log_path = dir/server.log (pathlen bytes
 * each), pp's plan saved at plan_path and loaded back into *plan (as the
 * server loads it), and its fingerprint in fp. */
static CALLS_UNUSED void calls_plan_setup(const emb_plan_params *pp, char **dir, char *plan_path,
                                          char *log_path, size_t pathlen, emb_plan **plan,
                                          char fp[EMB_FP_HEX]) {
  *dir = tmpdir_make("test");
  snprintf(plan_path, pathlen, "%s/plan.json", *dir);
  snprintf(log_path, pathlen, "%s/server.log", *dir);
  char err[512];
  emb_plan *p;
  ck_assert_msg(emb_plan_create(pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_save(p, plan_path, err, sizeof err) == 0, "%s", err);
  emb_plan_free(p);
  ck_assert_msg(emb_plan_load(plan_path, plan, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(emb_plan_fingerprint(*plan, fp), 0);
}

/* A fixture's last half: stop srv, which must exit 0 (a clean exit: no
 * sanitizer report, no crash on what the test sent; log_path names its
 * log), then free plan and remove and free dir. */
static CALLS_UNUSED void calls_teardown(test_server *srv, const char *log_path, emb_plan *plan,
                                        char *dir) {
  int st = server_stop(srv);
  ck_assert_msg(st == 0, "server exited with %d (log %s)", st, log_path);
  emb_plan_free(plan);
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Add to s a TCase called name with the given timeout (seconds), checked
 * fixture setup/teardown, and the tests tests[] up to a NULL, in order:
 * the one shape every rpc suite's main() has. */
static CALLS_UNUSED TCase *calls_tcase(Suite *s, const char *name, double timeout, SFun setup,
                                       SFun teardown, const TTest *const *tests) {
  TCase *tc = tcase_create(name);
  tcase_set_timeout(tc, timeout);
  tcase_add_checked_fixture(tc, setup, teardown);
  for (int i = 0; tests[i]; i++) tcase_add_test(tc, tests[i]);
  suite_add_tcase(s, tc);
  return tc;
}

#endif
