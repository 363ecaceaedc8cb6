/* The remote store against real servers: the same lookups and pushes give
 * the same rows as the in-process store (ids spread over two servers
 * row-wise, in any order; a push whole or in halves, and the client's
 * destroy awaits a push in flight), checkpoint/restore round-trip through the
 * servers, and a lookup started while a server is down reaches it once it
 * is back on the same port (retries with backoff, the channel reconnects). */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>

#include "common/status.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "tests/rpc/calls.h"
#include "tests/rpc/remote_fixture.h"
#include "tests/support/servers.h"

#define DIM 8
#define NT 2

static char *dir;
static char plan_path[512];
static emb_plan *plan;
static test_server srv[2];

static void start(int k, const char *listen) {
  char args[1200], log[600];
  snprintf(args, sizeof args, "--plan '%s' --shard %d --checkpoint-root '%s'%s%s", plan_path, k, dir, listen ? " --listen " : "",
           listen ? listen : "");
  snprintf(log, sizeof log, "%s/srv%d.log", dir, k);
  server_start(&srv[k], args, log);
}

static void setup(void) {
  dir = tmpdir_make("test");
  snprintf(plan_path, sizeof plan_path, "%s/plan.json", dir);
  uint64_t rows[NT] = {1000, EMB_ROWS_UNBOUNDED};
  emb_plan_params pp = {.n_tables = NT, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_ROWWISE_ADAGRAD, .eps = -1}, .seed = 5,
                        .n_shards = 2, .row_wise = 1};
  char err[512];
  emb_plan *p;
  ck_assert_msg(emb_plan_create(&pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_save(p, plan_path, err, sizeof err) == 0, "%s", err);
  emb_plan_free(p);
  ck_assert_msg(emb_plan_load(plan_path, &plan, err, sizeof err) == 0, "%s", err);
  start(0, NULL);
  start(1, NULL);
}

static void teardown(void) { fx_stop(srv, plan, dir); }

static emb_store *remote(void) { return fx_remote(plan, srv); }

/* Step st's ids: n unique ids per table, a permutation that changes per step. */
static void make_ids(int st, size_t n, uint64_t ids[NT][64]) {
  for (size_t i = 0; i < n; i++) {
    ids[0][i] = (uint64_t)((i * 37 + (size_t)st * 11) % 1000);
    ids[1][i] = 0x9e3779b97f4a7c15ULL * (i + 1) + (uint64_t)(st % 3);
  }
}

static void lookup(emb_store *s, int64_t step, uint64_t ids[NT][64], size_t n, float out[NT][64 * DIM]) {
  const uint64_t *ip[NT] = {ids[0], ids[1]};
  size_t counts[NT] = {n, n};
  emb_idset set = {NT, ip, counts};
  float *op[NT] = {out[0], out[1]};
  int rc = emb_store_lookup_begin(s, step, &set, op);
  if (!rc) rc = emb_store_lookup_wait(s);
  ck_assert_msg(rc == 0, "lookup: %s", emb_store_errmsg(s));
}

START_TEST(test_remote_matches_local) {
  char err[512];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err), *rem = remote();
  ck_assert_ptr_nonnull(loc);
  uint64_t ids[NT][64];
  static float a[NT][64 * DIM], b[NT][64 * DIM], g[NT][64 * DIM];
  for (int step = 0; step < 6; step++) {
    size_t n = 20 + (size_t)step * 7;
    make_ids(step, n, ids);
    lookup(loc, step, ids, n, a);
    lookup(rem, step, ids, n, b);
    ck_assert_msg(memcmp(a, b, sizeof a) == 0, "step %d: rows differ", step);
    for (int t = 0; t < NT; t++)
      for (size_t i = 0; i < n * DIM; i++) g[t][i] = a[t][i] * 0.5f + (float)((i + (size_t)step) % 5) * 0.01f;
    const uint64_t *ip[NT] = {ids[0], ids[1]};
    size_t counts[NT] = {n, n};
    emb_idset set = {NT, ip, counts};
    const float *gp[NT] = {g[0], g[1]};
    if (step % 2 == 0) {
      ck_assert_int_eq(emb_store_push(loc, step, 0.1f, &set, gp), 0);
      ck_assert_msg(emb_store_push(rem, step, 0.1f, &set, gp) == 0, "%s", emb_store_errmsg(rem));
      continue;
    }
    /* In halves: the gradients are the caller's again once push_begin
     * returns (the local store pushes whole in it). */
    ck_assert_int_eq(emb_store_push_begin(loc, step, 0.1f, &set, gp), 0);
    ck_assert_int_eq(emb_store_push_wait(loc), 0);
    ck_assert_msg(emb_store_push_begin(rem, step, 0.1f, &set, gp) == 0, "%s", emb_store_errmsg(rem));
    for (int t = 0; t < NT; t++)
      for (size_t i = 0; i < n * DIM; i++) g[t][i] = 0.25f;
    ck_assert_msg(emb_store_push_wait(rem) == 0, "%s", emb_store_errmsg(rem));
  }
  make_ids(2, 60, ids);
  lookup(loc, 6, ids, 60, a);
  lookup(rem, 6, ids, 60, b);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  /* Every id the client sent (each to one server) was read by a server
   * from its ids_fixed, in place or copied (Stats). */
  uint64_t sent = 2 * 60, got = 0;
  for (int step = 0; step < 6; step++) sent += 2 * 2 * (20 + (uint64_t)step * 7);
  for (int k = 0; k < 2; k++) {
    Shardrec__V1__StatsResponse *st = calls_stats(srv[k].addr);
    got += st->request_ids_in_place + st->request_ids_copied;
    shardrec__v1__stats_response__free_unpacked(st, NULL);
  }
  ck_assert_uint_eq(got, sent);
  /* Stats: both servers together hold the rows the local store holds. */
  emb_store_stats sl, sr;
  ck_assert_int_eq(emb_store_stats_get(loc, &sl), 0);
  ck_assert_msg(emb_store_stats_get(rem, &sr) == 0, "%s", emb_store_errmsg(rem));
  ck_assert_uint_eq(sl.rows, sr.rows);
  ck_assert_uint_eq(sl.bytes, sr.bytes);
  /* Checkpoint through the servers, change the rows, restore: as before. */
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ckpt", dir);
  ck_assert_msg(emb_store_checkpoint(rem, ck) == 0, "%s", emb_store_errmsg(rem));
  const uint64_t *ip[NT] = {ids[0], ids[1]};
  size_t counts[NT] = {60, 60};
  emb_idset set = {NT, ip, counts};
  const float *gp[NT] = {g[0], g[1]};
  ck_assert_int_eq(emb_store_push(rem, 7, 1.0f, &set, gp), 0);
  lookup(rem, 8, ids, 60, b);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  ck_assert_msg(emb_store_restore(rem, ck) == 0, "%s", emb_store_errmsg(rem));
  lookup(rem, 8, ids, 60, b);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  char *out;
  ck_assert_int_eq(run_cmd(&out, "ls %s/ckpt", dir), 0);
  ck_assert_msg(strstr(out, "shard-0") && strstr(out, "shard-1"), "%s", out);
  free(out);
  /* One push at a time; destroy awaits the one in flight: a new client
   * reads it applied. */
  ck_assert_int_eq(emb_store_push_begin(rem, 9, 1.0f, &set, gp), 0);
  ck_assert_int_eq(emb_store_push_begin(rem, 10, 1.0f, &set, gp), SR_ESTATE);
  ck_assert_msg(strstr(emb_store_errmsg(rem), "push of step 9 unawaited"), "%s", emb_store_errmsg(rem));
  emb_store_destroy(rem);
  ck_assert_int_eq(emb_store_push(loc, 9, 1.0f, &set, gp), 0);
  rem = remote();
  lookup(loc, 11, ids, 60, a);
  lookup(rem, 11, ids, 60, b);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  emb_store_destroy(rem);
  emb_store_destroy(loc);
}
END_TEST

START_TEST(test_reconnects_after_restart) {
  emb_store *rem = remote();
  uint64_t ids[NT][64];
  static float a[NT][64 * DIM], b[NT][64 * DIM];
  make_ids(0, 30, ids);
  lookup(rem, 0, ids, 30, a);
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ckpt-r", dir);
  ck_assert_msg(emb_store_checkpoint(rem, ck) == 0, "%s", emb_store_errmsg(rem));
  /* Shard 1 goes down; a lookup begins while it is down; it comes back on
   * the same port: the channel reconnects and the call reaches the new
   * process, whose new incarnation is reported (its rows are no longer the
   * ones this client left there: the trainer recovers from a checkpoint). */
  char addr1[64];
  snprintf(addr1, sizeof addr1, "%s", srv[1].addr);
  ck_assert_int_eq(server_stop(&srv[1]), 0);
  const uint64_t *ip[NT] = {ids[0], ids[1]};
  size_t counts[NT] = {30, 30};
  emb_idset set = {NT, ip, counts};
  float *op[NT] = {b[0], b[1]};
  ck_assert_int_eq(emb_store_lookup_begin(rem, 1, &set, op), 0);
  ck_assert_int_eq(rpc_remote_lost(rem), 0);
  start(1, addr1);
  ck_assert_str_eq(srv[1].addr, addr1);
  ck_assert_int_eq(emb_store_lookup_wait(rem), SR_EUNAVAILABLE);
  ck_assert_msg(strstr(emb_store_errmsg(rem), "restarted (incarnation") &&
                    strstr(emb_store_errmsg(rem), addr1),
                "%s", emb_store_errmsg(rem));
  ck_assert_int_eq(rpc_remote_lost(rem), 1);
  /* A Restore of every server accepts the new incarnation. */
  ck_assert_msg(emb_store_restore(rem, ck) == 0, "%s", emb_store_errmsg(rem));
  ck_assert_int_eq(rpc_remote_lost(rem), 0);
  lookup(rem, 2, ids, 30, b);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  emb_store_destroy(rem);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_remote");
  TCase *tc = tcase_create("remote");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_remote_matches_local);
  tcase_add_test(tc, test_reconnects_after_restart);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
