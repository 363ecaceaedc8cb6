/* The remote embedding store: embedding/store.h over shard servers.
 *
 * A step's unique ids are grouped by shard (emb_plan_shard_of), one call
 * per shard (or several: cut to the server's limits and to chunk_bytes),
 * all in flight at once on one completion queue, round the server's
 * connections (rpc/remote_call.c): lookup_begin starts them and returns,
 * lookup_wait collects them and scatters the rows into the caller's
 * buffers. Steps handed ahead (prefetch) have a lane each (pf_slot,
 * rpc/remote_ahead.c). Lookups have a queue (lane) of their own, so a
 * Lookup of step t+1 may stay in flight while push() of step t runs
 * (prefetch; the servers may hold that Lookup until the push is in). Every
 * header carries rank, world size and max_staleness (rpc/shardrec.proto). Push
 * is idempotent on (job id, step, rank) at the server, so retrying it is
 * safe. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "rpc/client.h"
#include "rpc/codec_impl.h"
#include "rpc/coord_impl.h"
#include "rpc/grpc_impl.h"
#include "rpc/remote_impl.h"
#include "rpc/shardrec.pb-c.h"

/* rpc__call_error of p, a call of s, into s->err and s->lost. */
static int call_error(rstore *s, const pcall *p, const char *what) {
  return rpc__call_error(&s->c[p->shard], &s->o, p, what, s->err, sizeof s->err, &s->lost);
}

/* The incarnation in shard k's answer: the first one seen is kept; another
 * means the server restarted and lost (or rolled back) this run's rows. */
static int check_inc(rstore *s, int k, uint64_t inc, const char *what) {
  conn *c = &s->c[k];
  if (!inc || c->inc == inc) return 0;
  if (!c->inc) {
    c->inc = inc;
    return 0;
  }
  s->lost = 1;
  sr_fmt(s->err, sizeof s->err,
         "%s: shard %d server %s restarted (incarnation %016llx, was %016llx): the rows it "
         "serves are no longer this run's",
         what, k, c->addr, (unsigned long long)inc, (unsigned long long)c->inc);
  return SR_EUNAVAILABLE;
}

static void header_fill(rstore *s, Shardrec__V1__RequestHeader *h, int64_t step) {
  shardrec__v1__request_header__init(h);
  h->plan_fingerprint = s->fp;
  h->job_id = s->job;
  h->step = step;
  h->rank = s->o.rank;
  h->world_size = s->o.world_size;
  h->max_staleness = s->o.max_staleness;
}

int rpc__check_inc(rstore *s, int k, uint64_t inc, const char *what) {
  return check_inc(s, k, inc, what);
}

void rpc__header_fill(rstore *s, Shardrec__V1__RequestHeader *h, int64_t step) {
  header_fill(s, h, step);
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n ? n : 1);
  if (b) *len = protobuf_c_message_pack(m, b);
  return b;
}

/* Group ids by shard: fills L->gids, L->perm, L->off. */
static int group(rstore *s, lane *L, const emb_idset *ids) {
  const emb_plan *plan = s->base.plan;
  const int ns = s->n;
  for (int t = 0; t < plan->n_tables; t++) {
    size_t cnt = ids->counts[t];
    if (cnt > L->cap[t]) {
      uint64_t *g = realloc(L->gids[t], cnt * sizeof *g);
      if (g) L->gids[t] = g;
      size_t *pp = realloc(L->perm[t], cnt * sizeof *pp);
      if (pp) L->perm[t] = pp;
      if (!g || !pp) return SR_ENOMEM;
      L->cap[t] = cnt;
    }
    size_t *off = &L->off[(size_t)t * (size_t)(ns + 1)];
    memset(off, 0, (size_t)(ns + 1) * sizeof *off);
    const uint64_t *id = ids->ids[t];
    const emb_table *tb = &plan->tables[t];
    if (emb_plan_check_range(plan, t, id, cnt, NULL, s->err, sizeof s->err)) return SR_ERANGE;
    if (tb->place.n == 1) { /* every id on one shard, in the caller's order */
      for (int k = tb->place.shards[0]; k < ns; k++) off[k + 1] = cnt;
      if (cnt) memcpy(L->gids[t], id, cnt * sizeof *id);
      for (size_t r = 0; r < cnt; r++) L->perm[t][r] = r;
      continue;
    }
    if (cnt > L->shard_cap) {
      uint16_t *sh = realloc(L->shard_of, cnt * sizeof *sh);
      if (!sh) return SR_ENOMEM;
      L->shard_of = sh;
      L->shard_cap = cnt;
    }
    /* Each id's shard found once (a hash and a division), then a stable
     * counting sort: each shard's ids keep the caller's order. */
    uint16_t *sh = L->shard_of;
    for (size_t r = 0; r < cnt; r++) {
      sh[r] = (uint16_t)emb_plan_shard_of(plan, t, id[r]);
      off[sh[r] + 1]++;
    }
    for (int k = 0; k < ns; k++) off[k + 1] += off[k];
    size_t *fill = L->fill;
    memcpy(fill, off, (size_t)ns * sizeof *fill);
    for (size_t r = 0; r < cnt; r++) {
      size_t at = fill[sh[r]]++;
      L->gids[t][at] = id[r];
      L->perm[t][at] = r;
    }
  }
  return 0;
}

void rpc__calls_free(lane *L) {
  for (int i = 0; i < L->n_calls; i++) rpc__pcall_free(&L->calls[i]);
  L->n_calls = 0;
}

/* Room for n more calls in L. */
static int calls_reserve(lane *L, int n) {
  if (L->n_calls + n <= L->cap_calls) return 0;
  int cap = L->cap_calls ? L->cap_calls : 4;
  while (cap < L->n_calls + n) cap *= 2;
  pcall *c = realloc(L->calls, (size_t)cap * sizeof *c);
  if (!c) return SR_ENOMEM;
  memset(c + L->cap_calls, 0, (size_t)(cap - L->cap_calls) * sizeof *c);
  L->calls = c;
  L->cap_calls = cap;
  return 0;
}

/* What one call to server k may carry: ids, and bytes at 4 x dim + 10 per
 * id (a Lookup's answer row, a Push's gradient, with its id). The server's
 * message limit less 64 KiB for the rest, at most an eighth of its
 * in-flight budget (so that several calls fit it at once), and this
 * client's own message limit; then at most the chunk size (o.chunk_bytes),
 * so that a large call goes as chunks in flight at once, unless chunks
 * (total bytes in all) would make more than RPC_COORD_MAX_PARTS calls. */
static void call_room(const rstore *s, int k, size_t total, size_t *ids, size_t *bytes) {
  const conn *c = &s->c[k];
  size_t b = (size_t)s->o.max_message_bytes;
  if (c->max_bytes && c->max_bytes < b) b = (size_t)c->max_bytes;
  if (c->budget && c->budget / 8 < b) b = (size_t)(c->budget / 8);
  *bytes = b > (128u << 10) ? b - (64u << 10) : b / 2;
  size_t chunk = s->o.chunk_bytes;
  if (chunk < total / RPC_COORD_MAX_PARTS + 1) chunk = total / RPC_COORD_MAX_PARTS + 1;
  if (chunk < *bytes) *bytes = chunk;
  *ids = c->max_ids ? (size_t)c->max_ids : SIZE_MAX;
}

/* Cut shard k's ids (L->off) into the calls that fit call_room: parts[]
 * gets each call's pieces in order, call_of[i] the call of piece i; the
 * number of calls (at least 1). */
static int cut_calls(const rstore *s, const lane *L, int k, call_part *parts, int *call_of,
                     int *n_parts) {
  const emb_plan *plan = s->base.plan;
  const int ns = s->n;
  size_t max_ids, max_bytes, total = 0;
  for (int t = 0; t < plan->n_tables; t++) {
    const size_t *off = &L->off[(size_t)t * (size_t)(ns + 1)];
    total += (off[k + 1] - off[k]) * (L->hint ? 12 : 4 * (size_t)plan->tables[t].dim + 12);
  }
  call_room(s, k, L->hint ? SIZE_MAX : total, &max_ids, &max_bytes);
  size_t ids_left = max_ids, bytes_left = max_bytes;
  int calls = 0, np = 0, open = 0;
  for (int t = 0; t < plan->n_tables; t++) {
    const size_t *off = &L->off[(size_t)t * (size_t)(ns + 1)];
    size_t lo = off[k], left = off[k + 1] - off[k];
    /* A hint carries ids only (its answer no rows). */
    const size_t cost = L->hint ? 12 : 4 * (size_t)plan->tables[t].dim + 10 + 2;
    while (left) {
      size_t take = bytes_left / cost;
      if (take > ids_left) take = ids_left;
      if (take > left) take = left;
      if (!take) { /* this call is full */
        if (!open) take = 1; /* a row wider than the room still goes, alone */
        else {
          open = 0;
          ids_left = max_ids, bytes_left = max_bytes;
          continue;
        }
      }
      if (!open) calls++, open = 1;
      parts[np] = (call_part){t, lo, take};
      call_of[np++] = calls - 1;
      lo += take, left -= take;
      ids_left -= take;
      bytes_left -= take * cost < bytes_left ? take * cost : bytes_left;
    }
  }
  *n_parts = np;
  return calls ? calls : 1;
}

/* One request to shard k of pieces parts[n] (lookup: grads NULL), part
 * part of parts, written by hand (rpc/codec_impl.h: ids_fixed, aligned, the
 * gradients gathered straight into it); the pcall gets a copy of its
 * pieces. */
static int build_one(rstore *s, lane *L, int k, rpc_method m, int64_t step, float lr,
                     const emb_grad *const *grads, const call_part *parts, int n, int part,
                     int n_calls) {
  const emb_plan *plan = s->base.plan;
  rpc_wire_table *wt = calloc((size_t)n + 1, sizeof *wt);
  call_part *mine = malloc(((size_t)n + 1) * sizeof *mine);
  int rc = !wt || !mine ? SR_ENOMEM : 0;
  for (int i = 0; i < n && !rc; i++) {
    const int t = parts[i].t;
    const size_t a = parts[i].lo;
    mine[i] = parts[i];
    wt[i] = (rpc_wire_table){.table_id = plan->tables[t].table_id, .ids = L->gids[t] + a,
                             .n = parts[i].n, .dim = plan->tables[t].dim};
    if (m != RPC_LOOKUP) wt[i].grads = grads[t], wt[i].perm = L->perm[t] + a;
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!rc) {
    Shardrec__V1__RequestHeader h;
    header_fill(s, &h, step);
    if (m == RPC_LOOKUP) {
      buf = rpc__lookup_encode(&h, wt, (size_t)n, L->hint, &len);
    } else {
      h.part = n_calls > 1 ? part : 0;
      h.parts = n_calls > 1 ? n_calls : 0;
      buf = rpc__push_encode(&h, lr, wt, (size_t)n, &len);
    }
    if (!buf) rc = SR_ENOMEM;
  }
  if (!rc) {
    pcall *p = &L->calls[L->n_calls++];
    rpc__pcall_init(p, k, m, buf, len);
    p->chan = (int)(s->c[k].rr++ % (unsigned)s->c[k].n_ch);
    p->hint = m == RPC_LOOKUP && L->hint;
    p->parts = mine;
    p->n_parts = n;
    mine = NULL;
  }
  free(wt);
  free(mine);
  return rc;
}

/* Build the requests of ids for every shard (lookup: grads NULL), each cut
 * to fit its server's limits (cut_calls). A shard with nothing gets no
 * Lookup, and a Push only in a multi-rank job (every rank pushes to every
 * shard every step: the shard applies a step once every rank's is in). */
int rpc__build_calls(rstore *s, lane *L, rpc_method m, int64_t step, float lr,
                       const emb_idset *ids, const emb_grad *const *grads) {
  const emb_plan *plan = s->base.plan;
  int rc = group(s, L, ids);
  if (rc) {
    if (rc == SR_ENOMEM) sr_fmt(s->err, sizeof s->err, "out of memory grouping ids");
    return rc;
  }
  size_t most = 0;
  for (int t = 0; t < plan->n_tables; t++) most += ids->counts[t];
  /* At most one piece per table plus one per call cut. */
  size_t cap = (size_t)plan->n_tables + most + 1;
  call_part *parts = malloc(cap * sizeof *parts);
  int *call_of = malloc(cap * sizeof *call_of);
  if (!parts || !call_of) rc = SR_ENOMEM;
  for (int k = 0; k < s->n && !rc; k++) {
    if (L->hint && !s->c[k].looks_ahead) continue; /* a hint it would only decode */
    int np = 0, nc = cut_calls(s, L, k, parts, call_of, &np);
    if (!np && (m == RPC_LOOKUP || s->o.world_size == 1)) continue;
    if ((rc = calls_reserve(L, nc))) break;
    for (int call = 0, i = 0; call < nc && !rc; call++) {
      int first = i;
      while (i < np && call_of[i] == call) i++;
      rc = build_one(s, L, k, m, step, lr, grads, parts + first, i - first, call, nc);
    }
  }
  free(parts);
  free(call_of);
  if (rc == SR_ENOMEM) sr_fmt(s->err, sizeof s->err, "out of memory building requests");
  if (rc) rpc__calls_free(L);
  return rc;
}

/* Build and start L's Lookups of ids for step (appended to any hints L
 * holds that are not started yet: those start too). 0 or an SR_E* code. */
int rpc__lookup_start(rstore *s, lane *L, int64_t step, const emb_idset *ids) {
  int rc = rpc__fetch_limits(s);
  if (!rc) rc = rpc__build_calls(s, L, RPC_LOOKUP, step, 0, ids, NULL);
  if (rc) return rc;
  for (int i = 0; i < L->n_calls; i++)
    if (!L->calls[i].active && !L->calls[i].done && !L->calls[i].tries)
      rpc__pcall_start(&s->c[L->calls[i].shard], L->cq, &L->calls[i], s->o.deadline_s);
  return 0;
}

/* A Lookup's answer into the outstanding lookup's rows (s->lookup_out): its
 * incarnation checked (check_inc), its rows scattered by L's grouping
 * (rpc__answer_scatter). 0 or an SR_E* code (s->err). */
static int answer_read(rstore *s, lane *L, pcall *p) {
  uint64_t inc;
  int bad = -1, rc;
  if (rpc__answer_incarnation(p->recv, &inc) == 0 &&
      (rc = check_inc(s, p->shard, inc, "lookup")))
    return rc;
  rc = rpc__answer_scatter(p->recv, s->base.plan, p->parts, p->n_parts, L->perm,
                           (void *const *)s->lookup_out, s->lookup_rows16, &bad);
  if (rc == -2) {
    sr_fmt(s->err, sizeof s->err,
           "lookup: shard %d server %s: answer for table %d does not match the request", p->shard,
           s->c[p->shard].addr, bad);
    return SR_EFORMAT;
  }
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "lookup: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  p->scattered = 1;
  return 0;
}

/* lookup_collect's reading of each answer as it comes, while the other
 * servers' are still on the wire: only one from a server whose
 * incarnation is the one known (anything else, and every failure, is left
 * for lookup_collect, which reads the calls in order as before). */
typedef struct {
  rstore *s;
  lane *L;
} early_read;

static void answer_early(void *ctx, pcall *p) {
  early_read *e = ctx;
  uint64_t inc;
  if (p->hint || p->status != GRPC_STATUS_OK || !p->recv) return;
  if (rpc__answer_incarnation(p->recv, &inc) || !inc || inc != e->s->c[p->shard].inc) return;
  int bad;
  if (!rpc__answer_scatter(p->recv, e->s->base.plan, p->parts, p->n_parts, e->L->perm,
                           (void *const *)e->s->lookup_out, e->s->lookup_rows16, &bad))
    p->scattered = 1;
}

/* Drive L's calls to their end and scatter its Lookups' rows (hints
 * skipped) into the outstanding lookup's rows, by L's grouping, each answer
 * as it arrives. 0 or the first failure's code, in call order. */
static int lookup_collect(rstore *s, lane *L) {
  early_read e = {s, L};
  rpc__run_calls_each(s->c, L->cq, L->calls, L->n_calls, &s->o, answer_early, &e);
  int rc = 0;
  char what[48];
  snprintf(what, sizeof what, "lookup of step %lld", (long long)s->lookup_step);
  for (int i = 0; i < L->n_calls && !rc; i++) {
    pcall *p = &L->calls[i];
    if (p->hint) continue;
    if (p->status != GRPC_STATUS_OK) {
      rc = call_error(s, p, what);
      break;
    }
    if (!p->scattered) rc = answer_read(s, L, p);
  }
  rpc__calls_free(L);
  return rc;
}

/* Finish the outstanding lookup, dropping its rows. */
static void lookup_drop(rstore *s) {
  rpc__run_calls(s->c, s->cur->cq, s->cur->calls, s->cur->n_calls, &s->o);
  rpc__calls_free(s->cur);
  if (s->cur_pf) s->cur_pf->used = s->cur_pf->sent = 0;
  s->cur = &s->lk;
  s->cur_pf = NULL;
  s->lookup_pending = 0;
}

/* lookup_begin; rows16: 16-bit tables' rows as they come (lookup_begin_rows16). */
static int lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out,
                        int rows16) {
  rstore *s = (rstore *)b;
  const double t_in = sr_now();
  if (s->lookup_pending) lookup_drop(s); /* one never waited for: drop its rows */
  if (!ids || ids->n_tables != b->plan->n_tables) {
    sr_fmt(s->err, sizeof s->err, "lookup: id set has %d tables, the plan has %d",
           ids ? ids->n_tables : -1, b->plan->n_tables);
    return s->lookup_rc = SR_EINVAL;
  }
  rpc__slots_drop_before(s, step);
  pf_slot *f = NULL;
  for (int i = 0; i < RPC_PF_STEPS && !f; i++)
    if (s->pf[i].used && s->pf[i].step == step) f = &s->pf[i];
  if (f && !rpc__slot_same_ids(s, f, ids)) { /* other ids than prefetched: read these */
    rpc__slot_release(s, f);
    f = NULL;
  }
  if (f && !f->sent && rpc__slot_send(s, f)) f = NULL;
  if (!f) {
    int rc = rpc__lookup_start(s, &s->lk, step, ids);
    if (rc) return s->lookup_rc = rc;
  }
  s->cur = f ? &f->L : &s->lk;
  s->cur_pf = f;
  s->lookup_t0 = f && f->t_sent < t_in ? f->t_sent : t_in;
  if (step > s->seen) s->seen = step;
  s->lookup_out = out;
  s->lookup_rows16 = rows16;
  s->lookup_step = step;
  s->lookup_pending = 1;
  s->lookup_rc = 0;
  for (int t = 0; t < ids->n_tables; t++) s->st.lookups += ids->counts[t];
  return 0;
}

static int r_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  return lookup_begin(b, step, ids, out, 0);
}

static int r_lookup_begin_rows16(emb_store *b, int64_t step, const emb_idset *ids,
                                 void *const *out) {
  return lookup_begin(b, step, ids, (float *const *)out, 1);
}

/* A prefetched lookup that failed (a deadline passed while it waited, a
 * server was down) is read again, as a lookup of its own: its error, if
 * any, is that one's. */
static int r_lookup_wait(emb_store *b) {
  rstore *s = (rstore *)b;
  if (!s->lookup_pending) {
    s->lookup_flight = 0; /* nothing was in flight: not counted again */
    return s->lookup_rc;
  }
  s->lookup_pending = 0;
  pf_slot *f = s->cur_pf;
  const int lost = s->lost;
  int rc = lookup_collect(s, s->cur);
  s->cur = &s->lk;
  s->cur_pf = NULL;
  if (f) {
    f->used = f->sent = 0;
    if (rc) {
      s->lost = lost;
      emb_idset v = rpc__slot_ids(s, f);
      rc = rpc__lookup_start(s, &s->lk, s->lookup_step, &v);
      if (!rc) rc = lookup_collect(s, &s->lk);
    }
  }
  s->lookup_flight = sr_now() - s->lookup_t0;
  return s->lookup_rc = rc;
}

static double r_lookup_flight(emb_store *b) { return ((rstore *)b)->lookup_flight; }

static int r_push_begin(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                        const emb_grad *const *grads) {
  rstore *s = (rstore *)b;
  lane *L = &s->mn;
  /* A Lookup in flight (the next step's, prefetched) stays in flight on its
   * own lane: the servers may hold it until this push is in (several
   * ranks), or it is answered first (one rank in async mode, below). */
  if (!ids || ids->n_tables != b->plan->n_tables) {
    sr_fmt(s->err, sizeof s->err, "push: id set has %d tables, the plan has %d",
           ids ? ids->n_tables : -1, b->plan->n_tables);
    return SR_EINVAL;
  }
  if (s->push_out) {
    sr_fmt(s->err, sizeof s->err, "push of step %lld begun with the push of step %lld unawaited",
           (long long)step, (long long)s->push_step);
    return SR_ESTATE;
  }
  rpc__slots_drop_before(s, step + 1); /* prefetched steps up to this one are over */
  /* One rank in async mode begins a later step's Lookup before this push,
   * and its bits need the servers to read those rows first. They answer a
   * single rank's Lookup at once, but nothing orders the two calls at a
   * server (its workers take its lock in any order, and on the connection
   * a Push's message can be whole before an earlier, larger Lookup's): so
   * the push goes once that Lookup is answered, which it usually is by now
   * (it ran beside the dense step). Its answer is read as before. */
  if (s->o.world_size <= 1 && s->o.max_staleness > 0 && s->lookup_pending && s->lookup_step > step)
    rpc__run_calls(s->c, s->cur->cq, s->cur->calls, s->cur->n_calls, &s->o);
  int rc = rpc__fetch_limits(s);
  if (!rc) rc = rpc__build_calls(s, L, RPC_PUSH, step, lr, ids, grads);
  if (rc) return rc;
  s->push_f = rpc__slot_join(s, step); /* started: the Lookups of step + 1 with this push */
  for (int i = 0; i < L->n_calls; i++)
    rpc__pcall_start(&s->c[L->calls[i].shard], L->cq, &L->calls[i], s->o.deadline_s);
  s->push_out = 1;
  s->push_step = step;
  s->push_rows = 0;
  for (int t = 0; t < ids->n_tables; t++) s->push_rows += ids->counts[t];
  return 0;
}

static int r_push_wait(emb_store *b) {
  rstore *s = (rstore *)b;
  lane *L = &s->mn;
  if (!s->push_out) return 0;
  s->push_out = 0;
  int64_t step = s->push_step;
  rpc__run_calls(s->c, L->cq, L->calls, L->n_calls, &s->o);
  char what[48];
  snprintf(what, sizeof what, "push of step %lld", (long long)step);
  int rc = 0;
  for (int i = 0; i < L->n_calls && !rc; i++) {
    pcall *p = &L->calls[i];
    if (p->status != GRPC_STATUS_OK) {
      rc = call_error(s, p, what);
      break;
    }
    Shardrec__V1__PushResponse *a = shardrec__v1__push_response__unpack(NULL, p->resp_len, p->resp);
    if (!a) {
      sr_fmt(s->err, sizeof s->err, "push: shard %d server %s: undecodable answer", p->shard,
             s->c[p->shard].addr);
      rc = SR_EFORMAT;
      break;
    }
    rc = check_inc(s, p->shard, a->incarnation, "push");
    shardrec__v1__push_response__free_unpacked(a, NULL);
  }
  rpc__calls_free(L);
  if (s->push_f) { /* the pushes inside the slot's calls */
    int rj = rpc__slot_joined_wait(s, s->push_f, what);
    if (!rc) rc = rj;
    s->push_f = NULL;
  }
  if (rc) return rc;
  s->st.pushes += s->push_rows;
  if (step > s->pushed) s->pushed = step;
  if (step > s->seen) s->seen = step;
  rpc__slots_send_ready(s);
  return 0;
}

static int r_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                  const emb_grad *const *grads) {
  int rc = r_push_begin(b, step, lr, ids, grads);
  return rc ? rc : r_push_wait(b);
}

/* The same request to every server. */
int rpc__broadcast(rstore *s, rpc_method m, uint8_t *(*make)(rstore *, int, size_t *, void *),
                     void *ctx, const char *what, int (*each)(rstore *, pcall *, void *)) {
  /* A Lookup in flight stays in flight on its own lane (a Restore, say, must
   * not wait for a Lookup the servers hold for a step that never comes). */
  lane *L = &s->mn;
  int rc = 0;
  for (int k = 0; k < s->n; k++) {
    size_t len = 0;
    uint8_t *req = make(s, k, &len, ctx);
    if (!req) {
      rpc__calls_free(L);
      sr_fmt(s->err, sizeof s->err, "%s: out of memory", what);
      return SR_ENOMEM;
    }
    rpc__pcall_init(&L->calls[L->n_calls++], k, m, req, len);
  }
  for (int i = 0; i < L->n_calls; i++)
    rpc__pcall_start(&s->c[L->calls[i].shard], L->cq, &L->calls[i], s->o.deadline_s);
  rpc__run_calls(s->c, L->cq, L->calls, L->n_calls, &s->o);
  for (int i = 0; i < L->n_calls && !rc; i++) {
    if (L->calls[i].status != GRPC_STATUS_OK) rc = call_error(s, &L->calls[i], what);
    else if (each) rc = each(s, &L->calls[i], ctx);
  }
  rpc__calls_free(L);
  return rc;
}

/* What a Checkpoint or Restore carries: the path, and whether it is
 * incremental (Checkpoint) or an overlay (Restore). */
typedef struct {
  char *path; /* borrowed */
  int delta;
} admin_req;

static uint8_t *make_ckpt(rstore *s, int k, size_t *len, void *ctx) {
  (void)k;
  const admin_req *a = ctx;
  Shardrec__V1__CheckpointRequest q = SHARDREC__V1__CHECKPOINT_REQUEST__INIT;
  q.plan_fingerprint = s->fp;
  q.path = a->path;
  q.incremental = a->delta;
  return pack(&q.base, len);
}
static uint8_t *make_restore(rstore *s, int k, size_t *len, void *ctx) {
  (void)k;
  const admin_req *a = ctx;
  Shardrec__V1__RestoreRequest q = SHARDREC__V1__RESTORE_REQUEST__INIT;
  q.plan_fingerprint = s->fp;
  q.path = a->path;
  q.overlay = a->delta;
  return pack(&q.base, len);
}
uint8_t *rpc__make_stats(rstore *s, int k, size_t *len, void *ctx) {
  (void)s, (void)k, (void)ctx;
  Shardrec__V1__StatsRequest q = SHARDREC__V1__STATS_REQUEST__INIT;
  return pack(&q.base, len);
}
static int sum_stats(rstore *s, pcall *p, void *ctx) {
  emb_store_stats *out = ctx;
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, p->resp_len, p->resp);
  if (!a) {
    sr_fmt(s->err, sizeof s->err, "stats: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  out->rows += a->rows;
  out->bytes += a->bytes;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return 0;
}

static int read_limits(rstore *s, pcall *p, void *ctx) {
  (void)ctx;
  Shardrec__V1__StatsResponse *a = shardrec__v1__stats_response__unpack(NULL, p->resp_len, p->resp);
  if (!a) {
    sr_fmt(s->err, sizeof s->err, "stats: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  conn *c = &s->c[p->shard];
  c->max_ids = a->max_ids;
  c->max_bytes = a->max_message_bytes;
  c->budget = a->inflight_budget_bytes;
  c->looks_ahead = a->looks_ahead;
  c->push_lookup = a->push_lookup;
  c->xs_push = a->exchange;
  c->xs_lookup = a->exchange && s->o.world_size == 1;
  shardrec__v1__stats_response__free_unpacked(a, NULL);
  return 0;
}

/* Every server's limits, from its Stats (once, and again after a Restore:
 * a restarted server may have others), so that calls are cut to fit them. */
int rpc__fetch_limits(rstore *s) {
  if (s->limits_known) return 0;
  int rc = rpc__broadcast(s, RPC_STATS, rpc__make_stats, NULL, "stats", read_limits);
  if (!rc) s->limits_known = 1;
  return rc;
}

static int ckpt_inc(rstore *s, pcall *p, void *ctx) {
  (void)ctx;
  Shardrec__V1__CheckpointResponse *a =
      shardrec__v1__checkpoint_response__unpack(NULL, p->resp_len, p->resp);
  if (!a) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  /* A server restarted since its rows were last seen would write stale rows. */
  int rc = check_inc(s, p->shard, a->incarnation, "checkpoint");
  shardrec__v1__checkpoint_response__free_unpacked(a, NULL);
  return rc;
}
static int restore_inc(rstore *s, pcall *p, void *ctx) {
  const admin_req *q = ctx;
  Shardrec__V1__RestoreResponse *a =
      shardrec__v1__restore_response__unpack(NULL, p->resp_len, p->resp);
  if (!a) {
    sr_fmt(s->err, sizeof s->err, "restore: shard %d server %s: undecodable answer", p->shard,
           s->c[p->shard].addr);
    return SR_EFORMAT;
  }
  /* Restored: whatever incarnation answers now holds this run's rows. An
   * overlay lies over the rows of the Restore before it: a server restarted
   * since holds other rows. */
  int rc = q->delta ? check_inc(s, p->shard, a->incarnation, "restore") : 0;
  if (!q->delta) s->c[p->shard].inc = a->incarnation;
  shardrec__v1__restore_response__free_unpacked(a, NULL);
  return rc;
}

static int r_flush(emb_store *b) {
  (void)b;
  return 0;
}
/* Servers resolve paths from their own working folder: send absolute ones
 * (the folder must be one the servers see at the same path). 0, SR_EINVAL
 * (no working folder) or SR_ERANGE (too long: never sent cut short). */
static int abs_path(rstore *s, const char *path, char *out, size_t n) {
  if (path[0] == '/') return sr_path_err(out, n, s->err, sizeof s->err, "%s", path);
  char cwd[SR_PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) {
    sr_fmt(s->err, sizeof s->err, "%s: cannot make the path absolute: %s", path, strerror(errno));
    return SR_EINVAL;
  }
  return sr_path_err(out, n, s->err, sizeof s->err, "%s/%s", cwd, path);
}
/* A Checkpoint of path to every server, full or incremental (delta). */
static int checkpoint_all(emb_store *b, const char *path, int delta) {
  char abs[SR_PATH_MAX];
  admin_req a = {abs, delta};
  int rc = abs_path((rstore *)b, path, abs, sizeof abs);
  return rc ? rc
            : rpc__broadcast((rstore *)b, RPC_CHECKPOINT, make_ckpt, &a, "checkpoint", ckpt_inc);
}
static int r_checkpoint(emb_store *b, const char *path) { return checkpoint_all(b, path, 0); }
/* Each server writes its change set into its folder path/shard-K1-K2...
 * (rpc/shardrec.proto, CheckpointRequest.incremental). */
static int r_checkpoint_delta(emb_store *b, const char *path) { return checkpoint_all(b, path, 1); }

/* A Restore of path from every server, whole or laid over (delta). */
static int restore_all(emb_store *b, const char *path, int delta) {
  char abs[SR_PATH_MAX];
  admin_req a = {abs, delta};
  int rc = abs_path((rstore *)b, path, abs, sizeof abs);
  if (!rc) rc = rpc__broadcast((rstore *)b, RPC_RESTORE, make_restore, &a, "restore", restore_inc);
  if (!rc && !delta) ((rstore *)b)->lost = 0;
  ((rstore *)b)->limits_known = 0;
  rpc__xs_close(((rstore *)b)->c, ((rstore *)b)->n, NULL); /* a server may be a new process */
  /* Everything prefetched goes (the servers answered held Lookups ABORTED),
   * and the servers forgot the job: its steps start over. */
  rstore *s = (rstore *)b;
  for (int i = 0; i < RPC_PF_STEPS; i++)
    if (&s->pf[i] != s->cur_pf) rpc__slot_release(s, &s->pf[i]);
  s->pushed = s->seen = s->removed = -1;
  return rc;
}
static int r_restore(emb_store *b, const char *path, const char *from_model_fp) {
  (void)from_model_fp; /* each server checks the rows against its own plan */
  return restore_all(b, path, 0);
}
/* Each server lays its folder path/shard-K1-K2... over its rows
 * (RestoreRequest.overlay). */
static int r_restore_delta(emb_store *b, const char *path) { return restore_all(b, path, 1); }
static int r_stats(emb_store *b, emb_store_stats *out) {
  rstore *s = (rstore *)b;
  emb_store_stats sum = {0};
  int rc = rpc__broadcast(s, RPC_STATS, rpc__make_stats, &sum, "stats", sum_stats);
  if (rc) return rc;
  /* Rows looked up and pushed as this client counted them. */
  sum.lookups = s->st.lookups;
  sum.hits = 0;
  sum.pushes = s->st.pushes;
  *out = sum;
  return 0;
}
static int r_iterate(emb_store *b, int table, emb_row_fn fn, void *ctx) {
  (void)table, (void)fn, (void)ctx;
  rstore *s = (rstore *)b;
  sr_fmt(s->err, sizeof s->err,
         "iterating rows is not offered by shard servers; checkpoint them instead");
  return SR_EUNSUPPORTED;
}
static const char *r_errmsg(emb_store *b) { return ((rstore *)b)->err; }

static uint8_t *make_watch(rstore *s, int k, size_t *len, void *ctx) {
  (void)k;
  Shardrec__V1__RequestHeader h;
  header_fill(s, &h, 0);
  Shardrec__V1__WatchRequest q = SHARDREC__V1__WATCH_REQUEST__INIT;
  q.header = &h;
  q.detach = ctx != NULL;
  return pack(&q.base, len);
}

/* Start a Watch on every server (not waited for: a server that cannot be
 * reached just does not watch this rank). 0 or SR_ENOMEM. */
int rpc__watch_start(rstore *s) {
  s->wcq = grpc_completion_queue_create_for_next(NULL);
  s->watch = calloc((size_t)s->n, sizeof *s->watch);
  if (!s->wcq || !s->watch) return SR_ENOMEM;
  for (int k = 0; k < s->n; k++) {
    size_t len = 0;
    uint8_t *req = make_watch(s, k, &len, NULL);
    if (!req) return SR_ENOMEM;
    rpc__pcall_init(&s->watch[s->n_watch++], k, RPC_WATCH, req, len);
    s->watch[k].no_deadline = 1;
    rpc__pcall_start(&s->c[k], s->wcq, &s->watch[k], 0);
  }
  return 0;
}

/* Detach this rank (its Watches end OK and mean nothing from now on), then
 * collect the Watches: those still held after a few seconds (a server that
 * did not get the detach) are cancelled, which that server reads as this
 * rank going away, as it has. */
void rpc__watch_stop(rstore *s) {
  if (!s->wcq) return;
  if (s->n_watch) {
    int tries = s->o.max_tries;
    s->o.max_tries = 2; /* a server that is gone does not hold this process up */
    rpc__broadcast(s, RPC_WATCH, make_watch, s, "detach", NULL);
    s->o.max_tries = tries;
  }
  int left = 0;
  for (int i = 0; i < s->n_watch; i++) left += s->watch[i].active;
  double until = sr_now() + 5;
  while (left > 0) {
    double now = sr_now();
    grpc_event ev = grpc_completion_queue_next(
        s->wcq, now < until ? rpc__deadline(until - now) : gpr_inf_future(GPR_CLOCK_MONOTONIC),
        NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      for (int i = 0; i < s->n_watch; i++)
        if (s->watch[i].active) grpc_call_cancel(s->watch[i].call, NULL);
      until = 0;
      continue;
    }
    if (ev.type != GRPC_OP_COMPLETE) break;
    ((pcall *)ev.tag)->active = 0;
    left--;
  }
  for (int i = 0; i < s->n_watch; i++) rpc__pcall_free(&s->watch[i]);
  s->n_watch = 0;
  rpc__cq_close(s->wcq);
  s->wcq = NULL;
  free(s->watch);
  s->watch = NULL;
}

void rpc__lane_free(lane *L, int n_tables) {
  rpc__calls_free(L);
  if (L->cq) {
    rpc__cq_close(L->cq);
  }
  if (L->gids)
    for (int t = 0; t < n_tables; t++) free(L->gids[t]);
  if (L->perm)
    for (int t = 0; t < n_tables; t++) free(L->perm[t]);
  free(L->gids);
  free(L->perm);
  free(L->off);
  free(L->cap);
  free(L->shard_of);
  free(L->fill);
  free(L->calls);
}

int rpc__lane_init(lane *L, int n_tables, int n_servers) {
  L->calls = calloc((size_t)n_servers, sizeof *L->calls);
  L->cap_calls = n_servers;
  L->gids = calloc((size_t)n_tables, sizeof *L->gids);
  L->perm = calloc((size_t)n_tables, sizeof *L->perm);
  L->cap = calloc((size_t)n_tables, sizeof *L->cap);
  L->off = calloc((size_t)n_tables * (size_t)(n_servers + 1), sizeof *L->off);
  L->fill = calloc((size_t)n_servers, sizeof *L->fill);
  L->cq = grpc_completion_queue_create_for_next(NULL);
  return L->calls && L->gids && L->perm && L->cap && L->off && L->fill && L->cq ? 0 : SR_ENOMEM;
}

/* A Lookup or push in flight is waited for (not cancelled: to the servers a
 * cancelled held Lookup means this rank went away, rpc/shardrec.proto, "Rank death"). */
static void r_destroy(emb_store *b) {
  rstore *s = (rstore *)b;
  r_push_wait(b);
  if (s->lookup_pending) r_lookup_wait(b);
  rpc__watch_stop(s);
  /* Prefetched steps never looked up (a job that ends with steps handed
   * ahead): detached now, this rank may cancel its held Lookups. */
  for (int i = 0; i < RPC_PF_STEPS; i++) {
    pf_slot *f = &s->pf[i];
    for (int j = 0; j < f->L.n_calls; j++) {
      f->L.calls[j].cancelled = 1;
      if (f->L.calls[j].active) rpc__pcall_cancel(&f->L.calls[j]);
    }
    rpc__slot_release(s, f);
    rpc__xs_close(s->c, s->n, f->L.cq);
    rpc__lane_free(&f->L, b->plan->n_tables);
    for (int t = 0; f->ids && t < b->plan->n_tables; t++) free(f->ids[t]);
    free(f->ids);
    free(f->counts);
    free(f->cap);
  }
  rpc__xs_close(s->c, s->n, NULL);
  rpc__lane_free(&s->lk, b->plan->n_tables);
  rpc__lane_free(&s->mn, b->plan->n_tables);
  for (int k = 0; k < s->n && s->c; k++) {
    for (int i = 0; i < s->c[k].n_ch; i++) grpc_channel_destroy(s->c[k].chs[i].ch);
    free(s->c[k].chs);
    free(s->c[k].addr);
  }
  free(s->c);
  free(s);
  rpc_global_shutdown();
}

const emb_store_ops rpc__remote_ops = {
    .kind = EMB_STORE_REMOTE,
    .ckpt_layout = EMB_CKPT_SHARD_FOLDERS,
    .lookup_begin = r_lookup_begin,
    .lookup_begin_rows16 = r_lookup_begin_rows16,
    .lookup_wait = r_lookup_wait,
    .prefetch = rpc__remote_prefetch,
    .lookup_flight = r_lookup_flight,
    .push = r_push,
    .push_begin = r_push_begin,
    .push_wait = r_push_wait,
    .remove = rpc__remote_remove,
    .flush = r_flush,
    .checkpoint = r_checkpoint,
    .restore = r_restore,
    .checkpoint_delta = r_checkpoint_delta,
    .restore_delta = r_restore_delta,
    .stats = r_stats,
    .iterate = r_iterate,
    .errmsg = r_errmsg,
    .destroy = r_destroy,
};

emb_store *emb_store_create_remote(const emb_plan *plan, const char *const *servers,
                                   int n_servers, const rpc_client_opts *o, char *err,
                                   size_t errlen) {
  if (emb_plan_validate(plan, "plan", err, errlen)) return NULL;
  if (o && (o->world_size > 1 ? o->rank < 0 || o->rank >= o->world_size : o->rank != 0)) {
    sr_fmt(err, errlen, "rank %d of world size %d", o->rank, o->world_size);
    return NULL;
  }
  if (o && o->max_staleness < 0) {
    sr_fmt(err, errlen, "max_staleness %d: must be >= 0 (0: sync mode, S >= 1: async)",
           o->max_staleness);
    return NULL;
  }
  if (o && (o->connections < 0 || o->connections > RPC_CONNECTIONS_MAX)) {
    sr_fmt(err, errlen, "connections %d: must be 1..%d (0: %d)", o->connections,
           RPC_CONNECTIONS_MAX, RPC_CONNECTIONS_DEFAULT);
    return NULL;
  }
  if (n_servers != plan->n_shards) {
    sr_fmt(err, errlen, "the plan has %d shard(s) but %d server(s) were given (one per shard, in shard order)",
           plan->n_shards, n_servers);
    return NULL;
  }
  rpc_malloc_tune();
  rpc_global_init();
  rstore *s = calloc(1, sizeof *s);
  if (!s) {
    rpc_global_shutdown();
    sr_fmt(err, errlen, "remote store: out of memory");
    return NULL;
  }
  s->base.ops = &rpc__remote_ops;
  s->base.plan = plan;
  if (o) s->o = *o;
  rpc__opts_defaults(&s->o);
  s->n = n_servers;
  s->cur = &s->lk;
  s->pushed = s->seen = s->removed = -1;
  for (int t = 0; t < plan->n_tables; t++) s->keeps |= emb_keep_on(&plan->tables[t]);
  s->c = calloc((size_t)n_servers, sizeof *s->c);
  int lk = rpc__lane_init(&s->lk, plan->n_tables, n_servers);
  int mn = rpc__lane_init(&s->mn, plan->n_tables, n_servers);
  if (!s->c || lk || mn) {
    sr_fmt(err, errlen, "remote store: out of memory");
    goto fail;
  }
  if (emb_plan_fingerprint(plan, s->fp)) {
    sr_fmt(err, errlen, "remote store: cannot fingerprint the plan");
    goto fail;
  }
  if (s->o.job_id) {
    snprintf(s->job, sizeof s->job, "%s", s->o.job_id);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = sr_mix64(((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
                          ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)s);
    snprintf(s->job, sizeof s->job, "job-%016llx", (unsigned long long)x);
  }
  s->o.job_id = NULL;
  for (int k = 0; k < n_servers; k++) {
    s->c[k].addr = strdup(servers[k]);
    if (!s->c[k].addr) {
      sr_fmt(err, errlen, "remote store: out of memory");
      goto fail;
    }
    if (rpc__conn_open(&s->c[k], servers[k], &s->o, err, errlen)) goto fail;
  }
  if (s->o.world_size > 1 && rpc__watch_start(s)) {
    sr_fmt(err, errlen, "remote store: out of memory");
    goto fail;
  }
  return &s->base;
fail:
  r_destroy(&s->base);
  return NULL;
}

