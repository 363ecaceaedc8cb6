/* What a job asks of a remote store beyond embedding/store.h
 * (rpc/client.h, rpc/remote_impl.h): recovery of a multi-rank job from a
 * lost server (quiesce before rank 0's Restore, rejoin after it, the
 * servers' incarnations, the lost mark), the notes of calls the retries
 * outlasted, and the check that checkpoint folders lie inside every
 * server's checkpoint roots. */
#include <stdio.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "rpc/client.h"
#include "rpc/grpc_impl.h"
#include "rpc/remote_impl.h"
#include "rpc/shardrec.pb-c.h"

typedef struct {
  const char *const *paths, *const *names;
  int n;
} roots_ctx;

/* One server's Stats: every path of ctx inside one of its roots. */
static int roots_each(rstore *s, pcall *p, void *ctx) {
  const roots_ctx *q = ctx;
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, p->resp_len, p->resp);
  if (!a) {
    sr_fmt(s->err, sizeof s->err, "stats: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  int rc = 0;
  for (int i = 0; i < q->n && !rc; i++) {
    char real[SR_PATH_MAX], why[600] = "";
    rc = SR_EINVAL;
    for (size_t r = 0; r < a->n_checkpoint_roots && rc == SR_EINVAL; r++)
      rc = sr_path_confine(a->checkpoint_roots[r], q->paths[i], real, sizeof real, why, sizeof why);
    if (rc && !a->n_checkpoint_roots)
      sr_fmt(s->err, sizeof s->err, "%s %s: shard %d server %s has no checkpoint root (start it "
             "with serve --checkpoint-root DIR, DIR holding this folder)", q->names[i], q->paths[i],
             p->shard, s->c[p->shard].addr);
    else if (rc == SR_EINVAL)
      sr_fmt(s->err, sizeof s->err, "%s %s: not inside the checkpoint root %s of shard %d server "
             "%s (serve --checkpoint-root; the servers must see this folder at the same path)",
             q->names[i], q->paths[i], a->checkpoint_roots[0], p->shard, s->c[p->shard].addr);
    else if (rc)
      sr_fmt(s->err, sizeof s->err, "%s %s", q->names[i], why);
  }
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return rc;
}

int rpc_remote_check_roots(emb_store *b, const char *const *paths, const char *const *names, int n,
                           char *err, size_t errlen) {
  if (!b || b->ops != &rpc__remote_ops) return 0;
  rstore *s = (rstore *)b;
  roots_ctx q = {paths, names, n};
  int rc = rpc__broadcast(s, RPC_STATS, rpc__make_stats, &q, "stats", roots_each);
  if (rc) sr_fmt(err, errlen, "%s", s->err);
  return rc;
}

/* End every call of L now: those in flight cancelled (a server reads a
 * held Lookup cancelled as its rank going away: the job it names is
 * dropped there), those waiting to be retried not sent again. */
static void lane_cancel(rstore *s, lane *L) {
  for (int i = 0; i < L->n_calls; i++) {
    pcall *p = &L->calls[i];
    p->cancelled = 1; /* an attempt that ends on its own now is not retried either */
    if (p->active) {
      rpc__pcall_cancel(p);
    } else if (!p->done) {
      p->done = 1;
      p->status = GRPC_STATUS_CANCELLED;
    }
  }
  rpc__run_calls(s->c, L->cq, L->calls, L->n_calls, &s->o);
  rpc__calls_free(L);
}

void rpc_remote_quiesce(emb_store *b) {
  if (!b || b->ops != &rpc__remote_ops) return;
  rstore *s = (rstore *)b;
  if (s->lookup_pending) {
    lane_cancel(s, s->cur);
    s->lookup_pending = 0;
    s->lookup_rc = SR_ESTATE;
    sr_fmt(s->err, sizeof s->err, "lookup of step %lld: dropped for a recovery",
           (long long)s->lookup_step);
  }
  s->cur = &s->lk;
  s->cur_pf = NULL;
  for (int i = 0; i < RPC_PF_STEPS; i++) {
    pf_slot *f = &s->pf[i];
    if (f->used) lane_cancel(s, &f->L);
    f->used = f->sent = 0;
  }
  /* The job goes on from an earlier step on every rank: the boundaries
   * whose removals this rank saw done are forgotten too (rank 0's Restore
   * forgets them as well), or the replayed steps' look-ahead Lookups would
   * go before rank 0's removals at those boundaries. */
  s->pushed = s->seen = s->removed = -1;
  rpc__xs_close(s->c, s->n, NULL); /* the servers may be new processes when the job goes on */
}

int rpc_remote_incarnations(const emb_store *b, uint64_t *inc, int n) {
  if (!b || b->ops != &rpc__remote_ops) return 0;
  const rstore *s = (const rstore *)b;
  int k = 0;
  for (; k < n && k < s->n; k++) inc[k] = s->c[k].inc;
  return k;
}

int rpc_remote_rejoin(emb_store *b, const char *job_id, const uint64_t *inc) {
  if (!b || b->ops != &rpc__remote_ops) return 0;
  rstore *s = (rstore *)b;
  rpc_remote_quiesce(b);
  rpc__watch_stop(s); /* detached under the old id */
  snprintf(s->job, sizeof s->job, "%s", job_id);
  for (int k = 0; k < s->n; k++) s->c[k].inc = inc ? inc[k] : 0;
  s->lost = 0;
  s->limits_known = 0; /* a restarted server may have other limits */
  if (s->o.world_size > 1 && rpc__watch_start(s)) {
    sr_fmt(s->err, sizeof s->err, "remote store: out of memory");
    return SR_ENOMEM;
  }
  return 0;
}

int rpc_remote_note(emb_store *b, char *buf, size_t len) {
  if (!b || b->ops != &rpc__remote_ops) return 0;
  rstore *s = (rstore *)b;
  int n = 0;
  for (int k = 0; k < s->n; k++) {
    if (!s->c[k].notes) continue;
    if (!n) sr_fmt(buf, len, "shard %d: %s", k, s->c[k].note);
    n += s->c[k].notes;
    s->c[k].notes = 0;
  }
  return n;
}

int rpc_remote_lost(const emb_store *b) {
  return b && b->ops == &rpc__remote_ops && ((const rstore *)b)->lost;
}

