/* Incremental checkpoints through shard servers (rpc/shardrec.proto,
 * CheckpointRequest.incremental and RestoreRequest.overlay; the remote
 * store's checkpoint_delta and restore_delta): two real `shardrec serve`
 * processes with RocksDB rows (the chain also with rows in memory). Each server writes the rows pushed since the
 * last checkpoint into its own folder path/shard-K, exactly those rows with
 * the values the in-process store holds for them; a full checkpoint and
 * two increments restored give those rows back, also on a server killed
 * and restarted in between (an overlay alone is refused there); the change
 * set is empty after a restore; a damaged increment is refused naming the
 * file with no row changed, an increment's folder is never overwritten.
 * The service's rules hold for both fields (confined to the checkpoint
 * root, symlinks out of it refused, an existing folder never written). */
#include <check.h>

#include "tests/check_main.h"
#include <stdio.h>

#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "embedding/table_file.h"
#include "embedding/shard.h"
#include "rpc/client.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"
#include "tests/rpc/remote_fixture.h"
#include "tests/support/servers.h"
#include "tests/support/store_rows.h"

#define DIM 8
#define NT 2
#define MAXN 64

static char *dir;
static emb_plan *plan;
static test_server srv[2];
static servers_opts so;

/* The plan, and two servers keeping rows in RocksDB (data) or in memory. */
static void setup_servers(int data) {
  dir = tmpdir_make("test");
  char plan_path[600], err[512];
  snprintf(plan_path, sizeof plan_path, "%s/plan.json", dir);
  uint64_t rows[NT] = {1000, EMB_ROWS_UNBOUNDED};
  emb_plan_params pp = {.n_tables = NT, .rows = rows, .dim = DIM,
                        .optim = {.kind = EMB_OPT_ROWWISE_ADAGRAD, .eps = -1}, .seed = 5,
                        .n_shards = 2, .row_wise = 1};
  emb_plan *p;
  ck_assert_msg(emb_plan_create(&pp, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(emb_plan_save(p, plan_path, err, sizeof err) == 0, "%s", err);
  emb_plan_free(p);
  ck_assert_msg(emb_plan_load(plan_path, &plan, err, sizeof err) == 0, "%s", err);
  so = (servers_opts){.dir = dir, .plan = "plan.json", .data = data ? "data" : NULL};
  servers_start(srv, 2, &so);
}
static void setup(void) { setup_servers(1); }
static void setup_mem(void) { setup_servers(0); }

static void teardown(void) { fx_stop(srv, plan, dir); }

static emb_store *remote(void) { return fx_remote(plan, srv); }

/* Step st's ids: n unique ids a table, changing with st. */
static void make_ids(int st, size_t n, uint64_t ids[NT][MAXN]) {
  for (size_t i = 0; i < n; i++) {
    ids[0][i] = (uint64_t)((i * 37 + (size_t)st * 11) % 1000);
    ids[1][i] = 0x9e3779b97f4a7c15ULL * (i + 1 + (size_t)st * 5);
  }
}

static void lookup(emb_store *s, int64_t step, uint64_t ids[NT][MAXN], size_t n,
                   float out[NT][MAXN * DIM]) {
  const uint64_t *ip[NT] = {ids[0], ids[1]};
  size_t counts[NT] = {n, n};
  emb_idset set = {NT, ip, counts};
  float *op[NT] = {out[0], out[1]};
  int rc = emb_store_lookup_begin(s, step, &set, op);
  if (!rc) rc = emb_store_lookup_wait(s);
  ck_assert_msg(rc == 0, "lookup: %s", emb_store_errmsg(s));
}

/* Step st (n ids a table) pushed into each store of s[k] (NULL skipped). */
static void push_step(emb_store **s, int k, int st, size_t n, float lr) {
  uint64_t ids[NT][MAXN];
  static float g[NT][MAXN * DIM];
  make_ids(st, n, ids);
  for (int t = 0; t < NT; t++)
    for (size_t i = 0; i < n * DIM; i++) g[t][i] = (float)((i * 7 + (size_t)st) % 11) * 0.01f - 0.05f;
  const uint64_t *ip[NT] = {ids[0], ids[1]};
  size_t counts[NT] = {n, n};
  emb_idset set = {NT, ip, counts};
  const float *gp[NT] = {g[0], g[1]};
  for (int i = 0; i < k; i++)
    if (s[i]) ck_assert_msg(emb_store_push(s[i], st, lr, &set, gp) == 0, "%s", emb_store_errmsg(s[i]));
}

/* The rows of steps 0..last (n ids each) looked up in a and b: equal or not. */
static int same_rows(emb_store *a, emb_store *b, int last, size_t n, int64_t step) {
  uint64_t ids[NT][MAXN];
  static float x[NT][MAXN * DIM], y[NT][MAXN * DIM];
  int same = 1;
  for (int st = 0; st <= last; st++) {
    make_ids(st, n, ids);
    lookup(a, step, ids, n, x);
    lookup(b, step, ids, n, y);
    same &= !memcmp(x, y, sizeof x);
  }
  return same;
}

/* A delta file's records: each checked against the local store's row. */
typedef struct {
  emb_store *ref;
  int t;
  uint64_t n, *ids;
} rec_ctx;

static int rec_fn(void *vctx, uint64_t id, const float *vals) {
  rec_ctx *c = vctx;
  int w = DIM + emb_optim_state_len(&plan->tables[c->t].optim, DIM);
  assert_row_held(c->ref, c->t, id, vals, w);
  c->ids[c->n++] = id;
  return 0;
}

/* Folder delta's server folders shard-0 and shard-1 hold, per table,
 * exactly the rows of steps first..last (n ids each), each in its shard's
 * folder, with ref's values. */
static void check_delta(const char *delta, emb_store *ref, int first, int last, size_t n) {
  char fp[EMB_FP_HEX], path[800], err[1024];
  ck_assert_int_eq(emb_plan_model_fingerprint(plan, fp), 0);
  for (int t = 0; t < NT; t++) {
    static uint64_t got[4 * MAXN * 8];
    rec_ctx c = {ref, t, 0, got};
    for (int k = 0; k < 2; k++) {
      uint64_t before = c.n;
      snprintf(path, sizeof path, "%s/shard-%d/table-%u.bin", delta, k, plan->tables[t].table_id);
      int rc = emb_tabfile_read(path, &plan->tables[t], fp, rec_fn, &c, err, sizeof err);
      ck_assert_msg(rc == 0, "%s", err);
      for (uint64_t i = before; i < c.n; i++)
        ck_assert_int_eq(emb_plan_shard_of(plan, t, got[i]), k);
    }
    /* The ids of those steps, each once. */
    uint64_t ids[NT][MAXN], want = 0;
    for (int st = first; st <= last; st++) {
      make_ids(st, n, ids);
      for (size_t i = 0; i < n; i++) {
        int seen = 0;
        for (int s2 = first; s2 < st && !seen; s2++) {
          uint64_t o[NT][MAXN];
          make_ids(s2, n, o);
          for (size_t j = 0; j < n && !seen; j++) seen = o[t][j] == ids[t][i];
        }
        if (seen) continue;
        want++;
        int in = 0;
        for (uint64_t j = 0; j < c.n && !in; j++) in = got[j] == ids[t][i];
        ck_assert_msg(in, "table %d row %llu of step %d missing", t, (unsigned long long)ids[t][i], st);
      }
    }
    ck_assert_uint_eq(c.n, want);
  }
}

START_TEST(test_remote_chain) {
  char err[512], full[600], d1[600], d2[600], d3[600];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err), *rem = remote();
  emb_store *both[2] = {loc, rem};
  snprintf(full, sizeof full, "%s/full", dir);
  snprintf(d1, sizeof d1, "%s/d1", dir);
  snprintf(d2, sizeof d2, "%s/d2", dir);
  snprintf(d3, sizeof d3, "%s/d3", dir);
  for (int st = 0; st < 4; st++) push_step(both, 2, st, MAXN, 0.1f);
  ck_assert_msg(emb_store_checkpoint(rem, full) == 0, "%s", emb_store_errmsg(rem));
  for (int st = 4; st < 6; st++) push_step(both, 2, st, 20, 0.1f);
  ck_assert_msg(emb_store_checkpoint_delta(rem, d1) == 0, "%s", emb_store_errmsg(rem));
  check_delta(d1, loc, 4, 5, 20);
  push_step(both, 2, 6, 10, 0.1f);
  ck_assert_msg(emb_store_checkpoint_delta(rem, d2) == 0, "%s", emb_store_errmsg(rem));
  check_delta(d2, loc, 6, 6, 10);
  /* An increment's folder is never written twice. */
  ck_assert_int_ne(emb_store_checkpoint_delta(rem, d2), 0);
  ck_assert_msg(strstr(emb_store_errmsg(rem), "exists"), "%s", emb_store_errmsg(rem));
  /* Rows the restore must undo. */
  push_step(both + 1, 1, 7, MAXN, 1.0f);
  ck_assert(!same_rows(loc, rem, 7, MAXN, 8));
  int rc = emb_store_restore(rem, full);
  if (!rc) rc = emb_store_restore_delta(rem, d1);
  if (!rc) rc = emb_store_restore_delta(rem, d2);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(rem));
  ck_assert(same_rows(loc, rem, 7, MAXN, 0));
  /* The change set went with the restore: the next increment is empty. */
  ck_assert_msg(emb_store_checkpoint_delta(rem, d3) == 0, "%s", emb_store_errmsg(rem));
  check_delta(d3, loc, 1, 0, MAXN);
  /* Training goes on alike. */
  push_step(both, 2, 8, MAXN, 0.1f);
  ck_assert(same_rows(loc, rem, 8, MAXN, 9));
  emb_store_destroy(rem);
  emb_store_destroy(loc);
}
END_TEST

/* The rows of step st (n ids a table) of shard k equal in a and b. */
static int same_shard_rows(emb_store *a, emb_store *b, int st, size_t n, int k) {
  uint64_t ids[NT][MAXN];
  static float x[NT][MAXN * DIM], y[NT][MAXN * DIM];
  make_ids(st, n, ids);
  lookup(a, 0, ids, n, x);
  lookup(b, 0, ids, n, y);
  int same = 1, seen = 0;
  for (int t = 0; t < NT; t++)
    for (size_t i = 0; i < n; i++)
      if (emb_plan_shard_of(plan, t, ids[t][i]) == k) {
        seen++;
        same &= !memcmp(x[t] + i * DIM, y[t] + i * DIM, DIM * sizeof(float));
      }
  ck_assert_int_gt(seen, 0);
  return same;
}

/* A damaged increment is refused by its server naming the file, that
 * server's rows as they were; a folder that is not there is refused; a
 * server killed and restarted takes no overlay alone (its rows are not the
 * run's), and the whole chain restores it. */
START_TEST(test_remote_refusals_and_restart) {
  char err[512], full[600], d1[600];
  emb_store *loc = emb_store_create_local(plan, err, sizeof err), *rem = remote();
  emb_store *both[2] = {loc, rem};
  snprintf(full, sizeof full, "%s/full", dir);
  snprintf(d1, sizeof d1, "%s/d1", dir);
  for (int st = 0; st < 3; st++) push_step(both, 2, st, MAXN, 0.1f);
  ck_assert_msg(emb_store_checkpoint(rem, full) == 0, "%s", emb_store_errmsg(rem));
  push_step(both, 2, 3, 30, 0.1f);
  ck_assert_msg(emb_store_checkpoint_delta(rem, d1) == 0, "%s", emb_store_errmsg(rem));
  emb_store *at_d1 = emb_store_create_local(plan, err, sizeof err); /* the rows as of d1 */
  for (int st = 0; st < 4; st++) push_step(&at_d1, 1, st, st < 3 ? MAXN : 30, 0.1f);
  push_step(both, 2, 4, MAXN, 0.1f); /* rows an overlay of d1 changes back */
  ck_assert_int_eq(run_cmd(NULL, "cp -r %s %s.keep && cd %s/shard-1 && printf '\\377' | "
                                 "dd of=table-0.bin bs=1 seek=270 conv=notrunc 2>/dev/null",
                           d1, d1, d1), 0);
  ck_assert_int_ne(emb_store_restore_delta(rem, d1), 0);
  ck_assert_msg(strstr(emb_store_errmsg(rem), "shard-1/table-0.bin") &&
                    strstr(emb_store_errmsg(rem), "damaged"),
                "%s", emb_store_errmsg(rem));
  for (int st = 3; st < 5; st++)
    ck_assert_msg(same_shard_rows(loc, rem, st, MAXN, 1), "the refusing server changed rows");
  /* The other server laid its part over (d1's rows, step 3's ids). */
  ck_assert(!same_shard_rows(loc, rem, 3, 30, 0));
  ck_assert(same_shard_rows(at_d1, rem, 3, 30, 0));
  /* A folder that is not there. */
  char none[600];
  snprintf(none, sizeof none, "%s/none", dir);
  ck_assert_int_ne(emb_store_restore_delta(rem, none), 0);
  ck_assert_msg(strstr(emb_store_errmsg(rem), "none"), "%s", emb_store_errmsg(rem));
  /* Server 1 killed and restarted on its folder: an overlay alone is
   * refused; the full checkpoint then the increment restore every row. */
  ck_assert_int_eq(run_cmd(NULL, "rm -rf %s && mv %s.keep %s", d1, d1, d1), 0);
  server_restart(&srv[1], 1, &so);
  ck_assert_int_ne(emb_store_restore_delta(rem, d1), 0);
  int rc = emb_store_restore(rem, full);
  if (!rc) rc = emb_store_restore_delta(rem, d1);
  ck_assert_msg(rc == 0, "%s", emb_store_errmsg(rem));
  ck_assert(same_rows(at_d1, rem, 4, MAXN, 0));
  emb_store_destroy(at_d1);
  emb_store_destroy(rem);
  emb_store_destroy(loc);
}
END_TEST

/* An incremental Checkpoint (restore 0) or an overlay Restore of path
 * through the service (delta 0: a full one); the status, the message in
 * msg. */
static int admin_call(rpc_service *svc, int restore, int delta, const char *path, char *msg,
                      size_t n) {
  char fp[EMB_FP_HEX];
  ck_assert_int_eq(emb_plan_fingerprint(plan, fp), 0);
  uint8_t b[8192];
  size_t len;
  if (!restore) {
    Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    q.incremental = delta;
    len = shardrec__v1__checkpoint_request__pack(&q, b);
  } else {
    Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
    q.plan_fingerprint = fp;
    q.path = (char *)path;
    q.overlay = delta;
    len = shardrec__v1__restore_request__pack(&q, b);
  }
  rpc_reply r;
  rpc_service_handle(svc, restore ? RPC_RESTORE : RPC_CHECKPOINT, b, len, &r);
  snprintf(msg, n, "%s", r.msg);
  free(r.out);
  return r.status;
}
static int admin(rpc_service *svc, int restore, const char *path, char *msg, size_t n) {
  return admin_call(svc, restore, 1, path, msg, n);
}

/* The service over a shard store of shard 0, root dir/root: an increment
 * goes to path/shard-0 as table files, inside the root only; an existing
 * folder is refused; an overlay reads it back, and one through a symlink
 * out of the root is refused. */
START_TEST(test_service_rules) {
  char err[512], msg[600], p[700], data[600], root[600];
  snprintf(data, sizeof data, "%s/svc-data", dir);
  snprintf(root, sizeof root, "%s/root", dir);
  ck_assert_int_eq(run_cmd(NULL, "mkdir -p %s/root %s/out && ln -s %s/out %s/root/esc", dir, dir,
                           dir, dir), 0);
  int k = 0;
  emb_shard_config sc = {.cache_rows = EMB_SHARD_MIN_CACHE_ROWS, .n_hosted = 1, .hosted = &k};
  emb_store *store = emb_store_create_shard(plan, data, &sc, err, sizeof err);
  ck_assert_msg(store, "%s", err);
  const char *roots[1] = {root};
  rpc_service_opts o = {.shards = &k, .n_shards = 1, .checkpoint_roots = roots, .n_roots = 1};
  rpc_service *svc = rpc_service_create(plan, store, &o, err, sizeof err);
  ck_assert_msg(svc, "%s", err);
  snprintf(p, sizeof p, "%s/inc", root);
  ck_assert_msg(admin(svc, 0, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  snprintf(p, sizeof p, "%s/inc/shard-0/table-1.bin", root);
  ck_assert_msg(access(p, F_OK) == 0, "%s not written", p);
  snprintf(p, sizeof p, "%s/inc", root);
  ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_ALREADY_EXISTS);
  ck_assert_msg(strstr(msg, "shard-0") && strstr(msg, "exists"), "%s", msg);
  ck_assert_msg(admin(svc, 1, p, msg, sizeof msg) == RPC_OK, "%s", msg);
  snprintf(p, sizeof p, "%s/out/inc", dir);
  ck_assert_int_eq(admin(svc, 0, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, "outside"), "%s", msg);
  ck_assert_int_ne(access(p, F_OK), 0);
  snprintf(p, sizeof p, "%s/esc/inc", root);
  ck_assert_int_eq(admin(svc, 1, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
  /* An overlay whose server folder is a symlink out of the root. */
  ck_assert_int_eq(run_cmd(NULL, "mkdir -p %s/root/lnk && cp -r %s/root/inc/shard-0 %s/out/s0 && "
                           "ln -s %s/out/s0 %s/root/lnk/shard-0", dir, dir, dir, dir, dir), 0);
  snprintf(p, sizeof p, "%s/lnk", root);
  ck_assert_int_eq(admin(svc, 1, p, msg, sizeof msg), RPC_PERMISSION_DENIED);
  ck_assert_msg(strstr(msg, "shard-0"), "%s", msg);
  /* A full Restore of an increment's rows (its step folder's manifest says
   * incremental) is refused: they are not every row. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s/root && mkdir -p ch/step-3/shards && cp -r inc/shard-0 "
                           "ch/step-3/shards/ && cd ch/step-3 && printf '{\"format\": 1, \"kind\": "
                           "\"incremental\", \"parent\": {\"step\": 2, \"manifest_sha256\": "
                           "\"%%064d\"}}' 0 > manifest.json && sha256sum manifest.json | cut -c1-64 "
                           "> DONE", dir), 0);
  snprintf(p, sizeof p, "%s/ch/step-3/shards", root);
  ck_assert_int_eq(admin_call(svc, 1, 0, p, msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ck_assert_msg(strstr(msg, "incremental checkpoint's rows") && strstr(msg, "overlay"), "%s", msg);
  ck_assert_msg(admin(svc, 1, p, msg, sizeof msg) == RPC_OK, "%s", msg); /* as an overlay: taken */
  rpc_service_destroy(svc);
  emb_store_destroy(store);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_delta");
  TCase *tc = tcase_create("delta");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_remote_chain);
  tcase_add_test(tc, test_remote_refusals_and_restart);
  tcase_add_test(tc, test_service_rules);
  suite_add_tcase(s, tc);
  TCase *mem = tcase_create("delta_in_memory"); /* in-memory servers write the same folders */
  tcase_set_timeout(mem, 120);
  tcase_add_checked_fixture(mem, setup_mem, teardown);
  tcase_add_test(mem, test_remote_chain);
  suite_add_tcase(s, mem);
  return sr_check_run(s);
}
