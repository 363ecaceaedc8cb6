/* The remote store's remove op (emb_store_ops.remove; rpc/remote_impl.h):
 * a bounded table's rows removed at a step boundary go to the servers of
 * their shards as Remove calls (rpc/shardrec.proto), each server's ids cut
 * into calls of at most its max_ids and a share of its message limit, one
 * round of calls (one a server) at a time on the store's main lane. Once
 * every call is answered, the boundary is passed and the look-ahead
 * Lookups of the next step may go (rpc/remote_ahead.c, pf_may_send). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "rpc/remote_impl.h"
#include "rpc/shardrec.pb-c.h"

/* Ids a Remove call may carry to server k: its max_ids, and its message
 * limit (less 64 KiB) at 12 bytes an id. */
static size_t remove_room(const rstore *s, int k) {
  const conn *c = &s->c[k];
  size_t b = (size_t)s->o.max_message_bytes;
  if (c->max_bytes && c->max_bytes < b) b = (size_t)c->max_bytes;
  size_t n = (b > (128u << 10) ? b - (64u << 10) : b / 2) / 12;
  if (c->max_ids && c->max_ids < n) n = (size_t)c->max_ids;
  return n ? n : 1;
}

/* Where each table's walk over its ids stands, per server. */
typedef struct {
  size_t *at; /* [n servers * n_tables]: the next id of table t to look at for server k */
} remove_walk;

/* Server k's next Remove request of step (ids of its shard from w's
 * place on, at most remove_room of them) into *len; NULL when it has none
 * left (*len 0) or out of memory (*len 1). */
static uint8_t *remove_request(rstore *s, int k, int64_t step, const emb_idset *ids,
                               remove_walk *w, size_t *len) {
  const emb_plan *plan = s->base.plan;
  const int nt = plan->n_tables;
  size_t room = remove_room(s, k), took = 0;
  Shardrec__V1__TableIds *ti = calloc((size_t)nt, sizeof *ti);
  Shardrec__V1__TableIds **tip = calloc((size_t)nt, sizeof *tip);
  uint64_t **v = calloc((size_t)nt, sizeof *v);
  uint8_t *out = NULL;
  size_t n_tables = 0;
  *len = 1;
  if (!ti || !tip || !v) goto done;
  for (int t = 0; t < nt && took < room; t++) {
    size_t *at = &w->at[(size_t)k * (size_t)nt + (size_t)t], n = 0;
    for (size_t r = *at; r < ids->counts[t] && took + n < room; r++, (*at)++)
      if (emb_plan_shard_of(plan, t, ids->ids[t][r]) == k) {
        if (!v[t] && !(v[t] = malloc((room - took) * sizeof *v[t]))) goto done;
        v[t][n++] = ids->ids[t][r];
      }
    if (!n) continue;
    took += n;
    shardrec__v1__table_ids__init(&ti[n_tables]);
    ti[n_tables].table_id = plan->tables[t].table_id;
    ti[n_tables].n_ids_fixed = n;
    ti[n_tables].ids_fixed = v[t];
    tip[n_tables] = &ti[n_tables];
    n_tables++;
  }
  *len = 0;
  if (!took) goto done;
  Shardrec__V1__RequestHeader h;
  rpc__header_fill(s, &h, step);
  Shardrec__V1__RemoveRequest q = SHARDREC__V1__REMOVE_REQUEST__INIT;
  q.header = &h;
  q.n_tables = n_tables;
  q.tables = tip;
  *len = protobuf_c_message_get_packed_size(&q.base);
  if ((out = malloc(*len ? *len : 1))) protobuf_c_message_pack(&q.base, out);
  else *len = 1;
done:
  for (int t = 0; v && t < nt; t++) free(v[t]);
  free(v);
  free(tip);
  free(ti);
  return out;
}

/* The answers of L's calls checked: each OK and from the server's
 * incarnation. 0 or an SR_E* code (s->err). */
static int remove_answers(rstore *s, lane *L, const char *what) {
  for (int i = 0; i < L->n_calls; i++) {
    pcall *p = &L->calls[i];
    if (p->status != GRPC_STATUS_OK)
      return rpc__call_error(&s->c[p->shard], &s->o, p, what, s->err, sizeof s->err, &s->lost);
    Shardrec__V1__RemoveResponse *a =
        shardrec__v1__remove_response__unpack(NULL, p->resp_len, p->resp);
    if (!a) {
      sr_fmt(s->err, sizeof s->err, "%s: shard %d server %s: undecodable answer", what,
             p->shard, s->c[p->shard].addr);
      return SR_EFORMAT;
    }
    int rc = rpc__check_inc(s, p->shard, a->incarnation, what);
    shardrec__v1__remove_response__free_unpacked(a, NULL);
    if (rc) return rc;
  }
  return 0;
}

int rpc__remote_remove(emb_store *b, int64_t step, const emb_idset *ids) {
  rstore *s = (rstore *)b;
  lane *L = &s->mn;
  if (!ids || ids->n_tables != b->plan->n_tables) {
    sr_fmt(s->err, sizeof s->err, "remove: id set has %d tables, the plan has %d",
           ids ? ids->n_tables : -1, b->plan->n_tables);
    return SR_EINVAL;
  }
  if (s->o.rank != 0) { /* rank 0 removes the job's rows, once */
    if (step > s->removed) s->removed = step;
    rpc__slots_send_ready(s);
    return 0;
  }
  for (int t = 0; t < ids->n_tables; t++)
    if (emb_plan_check_range(b->plan, t, ids->ids[t], ids->counts[t], "remove", s->err,
                             sizeof s->err))
      return SR_ERANGE;
  int rc = rpc__fetch_limits(s);
  if (rc) return rc;
  remove_walk w = {calloc((size_t)s->n * (size_t)ids->n_tables + 1, sizeof *w.at)};
  if (!w.at) {
    sr_fmt(s->err, sizeof s->err, "remove: out of memory");
    return SR_ENOMEM;
  }
  char what[48];
  snprintf(what, sizeof what, "remove of step %lld", (long long)step);
  for (;;) { /* a round: each server's next call, all in flight at once */
    for (int k = 0; k < s->n && !rc; k++) {
      size_t len;
      uint8_t *req = remove_request(s, k, step, ids, &w, &len);
      if (req) rpc__pcall_init(&L->calls[L->n_calls++], k, RPC_REMOVE, req, len);
      else if (len) rc = SR_ENOMEM;
    }
    if (rc) sr_fmt(s->err, sizeof s->err, "%s: out of memory", what);
    if (rc || !L->n_calls) break;
    for (int i = 0; i < L->n_calls; i++)
      rpc__pcall_start(&s->c[L->calls[i].shard], L->cq, &L->calls[i], s->o.deadline_s);
    rpc__run_calls(s->c, L->cq, L->calls, L->n_calls, &s->o);
    rc = remove_answers(s, L, what);
    rpc__calls_free(L);
    if (rc) break;
  }
  rpc__calls_free(L);
  free(w.at);
  if (rc) return rc;
  if (step > s->removed) s->removed = step;
  rpc__slots_send_ready(s); /* the boundary is passed */
  return 0;
}
