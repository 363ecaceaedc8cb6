/* libFuzzer target: the shard service's request handlers (rpc/service.c):
 * the first byte picks Lookup, Push, Stats or Health Check, the rest is the
 * request as it would arrive off the wire, copied to an exact-size heap
 * buffer. The service runs over an in-process store of a small plan (two
 * bounded tables, row-wise over two shards, shard 0 served), as
 * `shardrec serve` does. Checkpoint and Restore are left out: they write
 * and read paths named by the request, and libFuzzer's string-compare
 * tracing can learn the plan fingerprint.
 * Invariants: every answer is OK with bytes that decode, or an error with a
 * message; the store never holds rows of the other shard. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/rpc.h"
#include "rpc/shardrec.pb-c.h"

static emb_plan *plan;
static emb_store *store;
static rpc_service *svc;

static void init_once(void) {
  if (svc) return;
  uint64_t rows[2] = {1000, 64};
  emb_plan_params pp = {.n_tables = 2, .rows = rows, .dim = 4,
                        .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1},
                        .seed = 1, .n_shards = 2, .row_wise = 1};
  char err[256];
  if (emb_plan_create(&pp, &plan, err, sizeof err)) abort();
  store = emb_store_create_local(plan, err, sizeof err);
  if (!store) abort();
  int shard = 0;
  rpc_service_opts o = {.shards = &shard, .n_shards = 1, .max_ids = 4096};
  svc = rpc_service_create(plan, store, &o, err, sizeof err);
  if (!svc) abort();
}

static int check_row(void *ctx, int table, uint64_t row_id, const float *value, int dim,
                     const float *state, int state_len) {
  (void)ctx, (void)value, (void)dim, (void)state, (void)state_len;
  if (emb_plan_shard_of(plan, table, row_id) != 0) abort(); /* a foreign row was written */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  if (size < 1) return 0;
  static const rpc_method pick[4] = {RPC_LOOKUP, RPC_PUSH, RPC_STATS, RPC_HEALTH_CHECK};
  rpc_method m = pick[data[0] % 4];
  size_t n = size - 1;
  uint8_t *req = malloc(n ? n : 1);
  if (!req) return 0;
  if (n) memcpy(req, data + 1, n);
  rpc_reply r;
  rpc_service_handle(svc, m, req, n, &r);
  free(req);
  if (r.status == RPC_OK) {
    if (!r.out) abort();
    if (m == RPC_LOOKUP) {
      Shardrec__V1__LookupResponse *a = shardrec__v1__lookup_response__unpack(NULL, r.out_len, r.out);
      if (!a) abort();
      for (size_t i = 0; i < a->n_tables; i++)
        if (a->tables[i]->rows.len % (4 * sizeof(float))) abort();
      shardrec__v1__lookup_response__free_unpacked(a, NULL);
    }
  } else {
    if (r.out || !r.msg[0]) abort();
  }
  free(r.out);
  if (m == RPC_PUSH && r.status == RPC_OK)
    for (int t = 0; t < 2; t++) emb_store_iterate(store, t, check_row, NULL);
  return 0;
}
