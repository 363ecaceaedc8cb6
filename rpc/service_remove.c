/* Remove (rpc/shardrec.proto): the rows a bounded table's trainer removed
 * at a step boundary (train/keep.h) go from the served shards' store. The
 * request is decoded by protobuf-c (one call a step, not a hot path),
 * checked whole as a Lookup's ids are, then handed to the store's remove
 * op (embedding/store.h) under the service's lock. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "rpc/service_impl.h"
#include "rpc/shardrec.pb-c.h"

/* Per table of the plan: its ids in q (borrowed from q) or none; the plan
 * index of each of q's tables checked on the way. RPC_OK or a status in r. */
static int remove_ids(rpc_service *s, const Shardrec__V1__RemoveRequest *q,
                      const uint64_t **ids, size_t *counts, uint8_t *seen, size_t *total,
                      rpc_reply *r) {
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableIds *ti = q->tables[i];
    if (ti->n_ids && ti->n_ids_fixed) {
      r->status = RPC_INVALID_ARGUMENT;
      snprintf(r->msg, sizeof r->msg, "tables[%zu] (table_id %u): ids and ids_fixed both given",
               i, ti->table_id);
      return r->status;
    }
    const uint64_t *v = ti->n_ids_fixed ? ti->ids_fixed : ti->ids;
    const size_t n = ti->n_ids_fixed ? ti->n_ids_fixed : ti->n_ids;
    int t;
    if (rpc__check_ids(s, "tables", i, ti->table_id, v, n, &t, seen, total, r)) return r->status;
    ids[t] = v;
    counts[t] = n;
  }
  return RPC_OK;
}

void rpc__remove(rpc_service *s, const uint8_t *in, size_t len, int defer, rpc_reply *r) {
  /* The request's copy and its decoded form: at most 8 bytes an id for a
   * byte of varint, and protobuf-c's own. */
  if (rpc__budget_take(s, 10 * len, defer, r)) return;
  if (rpc__texts_ok(&shardrec__v1__remove_request__descriptor, in, len, r)) return;
  Shardrec__V1__RemoveRequest *q = shardrec__v1__remove_request__unpack(NULL, len, in);
  const int nt = s->plan->n_tables;
  const uint64_t **ids = calloc((size_t)nt, sizeof *ids); /* borrowed from q */
  size_t *counts = calloc((size_t)nt, sizeof *counts), total = 0;
  uint8_t *seen = calloc((size_t)nt, 1);
  if (!q) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "not a valid shardrec.v1.RemoveRequest (%zu bytes)", len);
  } else if (!ids || !counts || !seen) {
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "Remove: out of memory");
  } else if (s->read_only) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg, "this server is read-only: Remove refused");
  } else if (rpc__check_header(s, q->header, r)) {
    /* r says why */
  } else if (q->header->rank != 0) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg, "header.rank %d: a multi-rank job's rows are removed by "
             "rank 0 (of world size %d)", q->header->rank, q->header->world_size);
  } else if (!remove_ids(s, q, ids, counts, seen, &total, r)) {
    emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
    pthread_mutex_lock(&s->mu);
    int rc = total ? emb_store_remove(s->store, q->header->step, &set) : 0;
    if (total) s->from_ckpt = 0; /* its rows are no longer the checkpoint's */
    if (rc) {
      r->status = rc == SR_EUNSUPPORTED ? RPC_FAILED_PRECONDITION : RPC_INTERNAL;
      snprintf(r->msg, sizeof r->msg, "Remove of step %lld: %s", (long long)q->header->step,
               rc == SR_EUNSUPPORTED ? "this server's store removes no rows"
                                     : emb_store_errmsg(s->store));
    }
    pthread_mutex_unlock(&s->mu);
  }
  if (!r->status) {
    Shardrec__V1__RemoveResponse resp = SHARDREC__V1__REMOVE_RESPONSE__INIT;
    resp.rows = total;
    resp.incarnation = s->incarnation;
    rpc__pack_reply(r, &resp.base);
  }
  free(ids);
  free(counts);
  free(seen);
  if (q) shardrec__v1__remove_request__free_unpacked(q, NULL);
}
