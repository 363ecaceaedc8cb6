/* The remote store's look-ahead (emb_store_ops.prefetch): up to
 * RPC_PF_STEPS later steps, each in a slot with a lane of its own (pf_slot,
 * rpc/remote_impl.h, says what a slot sends when), how the slots move as
 * steps are looked up and pushed, and one rank's push joined with the next
 * step's Lookups (PushLookup). */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/sys.h"
#include "rpc/codec_impl.h"
#include "rpc/remote_impl.h"

/* The slot's copy of its step's ids, as an id set. */
emb_idset rpc__slot_ids(const rstore *s, const pf_slot *f) {
  emb_idset v = {s->base.plan->n_tables, (const uint64_t *const *)f->ids, f->counts};
  return v;
}

/* Let slot f go: its calls are waited for, never cancelled (to a server, a
 * held Lookup cancelled means its rank went away), their answers dropped. */
void rpc__slot_release(rstore *s, pf_slot *f) {
  if (!f->used) return;
  rpc__run_calls(s->c, f->L.cq, f->L.calls, f->L.n_calls, &s->o);
  rpc__calls_free(&f->L);
  f->used = f->sent = 0;
}

/* Release the slots of steps before step (never looked up), but the one
 * the outstanding lookup reads. */
void rpc__slots_drop_before(rstore *s, int64_t step) {
  for (int i = 0; i < RPC_PF_STEPS; i++)
    if (s->pf[i].used && s->pf[i].step < step && &s->pf[i] != s->cur_pf)
      rpc__slot_release(s, &s->pf[i]);
}

/* Whether a Lookup of step sent now gets the rows its own lookup would.
 * Multi-rank: the servers hold it until the job's rules allow (sync: step
 * - 1 applied by every rank; async: step - S), once this rank has pushed
 * (so every server knows the job's first step). One rank: a server answers
 * at once, so this rank's own push of step - 1 (async: step - S) must be
 * answered (applied) first. */
static int pf_may_send(const rstore *s, int64_t step) {
  if (s->pushed < 0) return 0;
  if (s->keeps && s->removed < step - 1) return 0; /* the boundary before it not passed yet */
  if (s->o.world_size > 1) return 1;
  const int64_t lag = s->o.max_staleness > 0 ? s->o.max_staleness : 1;
  return s->pushed >= step - lag;
}

/* Send slot f's Lookups: its hints, started at prefetch, are collected
 * first (the servers answer them at once). 0, or a code (the slot is then
 * released: the step's lookup reads afresh and reports any failure). */
int rpc__slot_send(rstore *s, pf_slot *f) {
  rpc__run_calls(s->c, f->L.cq, f->L.calls, f->L.n_calls, &s->o);
  rpc__calls_free(&f->L);
  emb_idset v = rpc__slot_ids(s, f);
  f->t_sent = sr_now();
  int rc = rpc__lookup_start(s, &f->L, f->step, &v);
  if (rc) rpc__slot_release(s, f);
  else f->sent = 1;
  return rc;
}

/* Copy ids into slot f (grown as needed). 0 or SR_ENOMEM. */
static int slot_copy(rstore *s, pf_slot *f, const emb_idset *ids) {
  const int nt = s->base.plan->n_tables;
  if (!f->ids) f->ids = calloc((size_t)nt, sizeof *f->ids);
  if (!f->counts) f->counts = calloc((size_t)nt, sizeof *f->counts);
  if (!f->cap) f->cap = calloc((size_t)nt, sizeof *f->cap);
  if (!f->ids || !f->counts || !f->cap) return SR_ENOMEM;
  if (!f->L.cq && rpc__lane_init(&f->L, nt, s->n)) {
    rpc__lane_free(&f->L, nt);
    memset(&f->L, 0, sizeof f->L);
    return SR_ENOMEM;
  }
  for (int t = 0; t < nt; t++) {
    size_t n = ids->counts[t];
    if (n > f->cap[t]) {
      uint64_t *g = realloc(f->ids[t], n * sizeof *g);
      if (!g) return SR_ENOMEM;
      f->ids[t] = g;
      f->cap[t] = n;
    }
    if (n) memcpy(f->ids[t], ids->ids[t], n * sizeof *f->ids[t]);
    f->counts[t] = n;
  }
  return 0;
}

int rpc__slot_same_ids(const rstore *s, const pf_slot *f, const emb_idset *ids) {
  for (int t = 0; t < s->base.plan->n_tables; t++)
    if (f->counts[t] != ids->counts[t] ||
        (f->counts[t] && memcmp(f->ids[t], ids->ids[t], f->counts[t] * sizeof *f->ids[t])))
      return 0;
  return 1;
}

int rpc__remote_prefetch(emb_store *b, int64_t step, const emb_idset *ids) {
  rstore *s = (rstore *)b;
  if (!ids || ids->n_tables != b->plan->n_tables) {
    sr_fmt(s->err, sizeof s->err, "prefetch: id set has %d tables, the plan has %d",
           ids ? ids->n_tables : -1, b->plan->n_tables);
    return SR_EINVAL;
  }
  if (step <= s->seen) {
    sr_fmt(s->err, sizeof s->err, "prefetch of step %lld: not after step %lld (already looked "
           "up, pushed or prefetched)", (long long)step, (long long)s->seen);
    return SR_EINVAL;
  }
  pf_slot *f = NULL;
  for (int i = 0; i < RPC_PF_STEPS && !f; i++)
    if (!s->pf[i].used) f = &s->pf[i];
  if (!f) return 0; /* as far ahead as this store looks: the lookup reads then */
  /* Out of memory (or, below, a server not answering its Stats): nothing
   * prefetched, and the step's lookup reads and reports. */
  if (slot_copy(s, f, ids)) return 0;
  emb_idset v = rpc__slot_ids(s, f);
  if (rpc__fetch_limits(s)) return 0;
  /* The Lookups themselves when they may go now: a Lookup reads its rows
   * itself, and a hint beside it would only widen the race between it and
   * the Push sent after it (one rank of async mode: the servers' threads
   * may take the Push first once the Lookup waits). Else prefetch_only
   * hints, answered at once; the Lookups follow when they may go
   * (rpc__slot_send). */
  const int now = pf_may_send(s, step);
  f->L.hint = !now;
  f->t_sent = sr_now();
  int rc = rpc__build_calls(s, &f->L, RPC_LOOKUP, step, 0, &v, NULL);
  f->L.hint = 0;
  if (rc) /* SR_ERANGE for an id out of range, as the lookup would say */
    return rc == SR_ERANGE || rc == SR_EINVAL ? rc : 0;
  f->used = 1;
  f->sent = now;
  f->step = step;
  s->seen = step;
  for (int i = 0; i < f->L.n_calls; i++)
    rpc__pcall_start(&s->c[f->L.calls[i].shard], f->L.cq, &f->L.calls[i], s->o.deadline_s);
  return 0;
}

/* After a push answered: send the slots whose Lookups may go now. */
void rpc__slots_send_ready(rstore *s) {
  for (int i = 0; i < RPC_PF_STEPS; i++) {
    pf_slot *f = &s->pf[i];
    if (f->used && !f->sent && f != s->cur_pf && pf_may_send(s, f->step)) rpc__slot_send(s, f);
  }
}

/* The slot whose Lookups may join the push of step (rpc__slot_join), or
 * NULL. */
static pf_slot *join_slot(rstore *s, int64_t step) {
  if (s->o.world_size > 1 || s->keeps) return NULL;
  for (int k = 0; k < s->n; k++)
    if (!s->c[k].push_lookup) return NULL; /* a server of an older build */
  for (int i = 0; i < RPC_PF_STEPS; i++) {
    pf_slot *f = &s->pf[i];
    if (f->used && !f->sent && f->step == step + 1 && f != s->cur_pf) return f;
  }
  return NULL;
}

/* Whether no server has more than one call in L (a push or Lookup cut in
 * parts keeps its own calls: a part of a push must not answer rows before
 * the others are in). */
static int one_call_each(const lane *L) {
  for (int i = 1; i < L->n_calls; i++)
    if (L->calls[i].shard == L->calls[i - 1].shard) return 0; /* a shard's calls are adjacent */
  return 1;
}

/* The Lookup call of slot f's lane to push call q's server, or NULL. */
static pcall *lookup_of(pf_slot *f, const pcall *q) {
  for (int j = 0; j < f->L.n_calls; j++)
    if (f->L.calls[j].shard == q->shard) return &f->L.calls[j];
  return NULL;
}

/* A push call's partner in join: the Lookup call to its server (NULL:
 * none) and the request that joins them. */
typedef struct {
  pcall *p;
  uint8_t *req;
  size_t len;
} joined;

/* The push calls of s->mn joined with slot f's Lookups, server by server
 * (join_slot): f's hints collected, its Lookups built, and each server's
 * push request put inside its Lookup's call as a PushLookup (its Push call
 * dropped). 1 when joined (f's calls are the PushLookups, and Lookups to
 * servers this push does not touch); 0 when not (f holds its ids alone:
 * its Lookups go once the push is answered). */
static int join(rstore *s, pf_slot *f) {
  lane *P = &s->mn, *K = &f->L;
  if (!one_call_each(P)) return 0;
  rpc__run_calls(s->c, K->cq, K->calls, K->n_calls, &s->o); /* its hints */
  rpc__calls_free(K);
  emb_idset v = rpc__slot_ids(s, f);
  if (rpc__build_calls(s, K, RPC_LOOKUP, f->step, 0, &v, NULL)) {
    rpc__slot_release(s, f); /* the step's lookup reads afresh and reports */
    return 0;
  }
  /* Every joined request made before any call changes (out of memory:
   * none joined). */
  joined *jn = calloc((size_t)P->n_calls + 1, sizeof *jn);
  int ok = jn && one_call_each(K);
  for (int i = 0; ok && i < P->n_calls; i++) {
    const pcall *q = &P->calls[i];
    joined *j = &jn[i];
    if ((j->p = lookup_of(f, q)) &&
        !(j->req = rpc__push_lookup_encode(q->req, q->req_len, j->p->req, j->p->req_len, &j->len)))
      ok = 0;
  }
  int kept = 0;
  for (int i = 0; ok && i < P->n_calls; i++) {
    pcall *q = &P->calls[i], *p = jn[i].p;
    if (!p) { /* no Lookup to this server: the push alone */
      if (kept != i) P->calls[kept] = *q;
      kept++;
      continue;
    }
    free(p->req);
    p->req = jn[i].req;
    p->req_len = jn[i].len;
    p->m = RPC_PUSH_LOOKUP;
    rpc__pcall_free(q);
  }
  if (ok) P->n_calls = kept;
  for (int i = 0; !ok && jn && i < P->n_calls; i++) free(jn[i].req);
  if (!ok) rpc__calls_free(K);
  free(jn);
  return ok;
}

/* Whether p, a PushLookup that failed, was refused only after its push was
 * taken (its server's message says so: RPC_MSG_AFTER_PUSH). */
static int after_push(const pcall *p) {
  const size_t n = strlen(RPC_MSG_AFTER_PUSH);
  return p->status != GRPC_STATUS_OK && GRPC_SLICE_LENGTH(p->details) >= n &&
         !memcmp(GRPC_SLICE_START_PTR(p->details), RPC_MSG_AFTER_PUSH, n);
}

/* The answer of a PushLookup p (its push's part): its incarnation. */
static int joined_read(rstore *s, const pcall *p) {
  uint64_t inc;
  if (rpc__answer_incarnation(p->recv, &inc)) {
    sr_fmt(s->err, sizeof s->err, "push: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  return rpc__check_inc(s, p->shard, inc, "push");
}

pf_slot *rpc__slot_join(rstore *s, int64_t step) {
  pf_slot *f = join_slot(s, step);
  if (!f || !join(s, f)) return NULL;
  f->t_sent = sr_now();
  f->sent = 1;
  for (int i = 0; i < f->L.n_calls; i++)
    rpc__pcall_start(&s->c[f->L.calls[i].shard], f->L.cq, &f->L.calls[i], s->o.deadline_s);
  return f;
}

int rpc__slot_joined_wait(rstore *s, pf_slot *f, const char *what) {
  rpc__run_calls(s->c, f->L.cq, f->L.calls, f->L.n_calls, &s->o);
  int rc = 0, redo = 0; /* redo: a Lookup refused after its push was taken */
  for (int i = 0; i < f->L.n_calls && !rc; i++) {
    const pcall *p = &f->L.calls[i];
    if (p->m != RPC_PUSH_LOOKUP) continue;
    if (after_push(p)) redo = 1;
    else if (p->status != GRPC_STATUS_OK)
      rc = rpc__call_error(&s->c[p->shard], &s->o, p, what, s->err, sizeof s->err, &s->lost);
    else rc = joined_read(s, p);
  }
  if (rc || redo) rpc__slot_release(s, f); /* the step's lookup reads afresh */
  return rc;
}
