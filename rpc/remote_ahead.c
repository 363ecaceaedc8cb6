/* The remote store's look-ahead (emb_store_ops.prefetch): up to
 * RPC_PF_STEPS later steps, each in a slot with a lane of its own (pf_slot,
 * rpc/remote_impl.h, says what a slot sends when), and how the slots move
 * as steps are looked up and pushed. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/sys.h"
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
