/* The step coordinator of multi-rank jobs (rpc/coord_impl.h): step order, held
 * pushes, parked Lookups and Watches, rank death, the pending timeout and
 * Push idempotency, without protobuf or gRPC. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "rpc/coord_impl.h"
#include "rpc/coord_state_impl.h"

rpc_coord *rpc_coord_create(const rpc_coord_opts *o) {
  if (!o || o->n_tables < 0 || (o->n_tables && !o->dims) || !o->apply) return NULL;
  rpc_coord *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->dims = malloc((size_t)(o->n_tables ? o->n_tables : 1) * sizeof *c->dims);
  if (!c->dims) {
    free(c);
    return NULL;
  }
  if (o->n_tables) memcpy(c->dims, o->dims, (size_t)o->n_tables * sizeof *c->dims);
  c->n_tables = o->n_tables;
  c->apply = o->apply;
  c->apply_ctx = o->apply_ctx;
  c->pending_timeout = o->pending_timeout_s > 0 ? o->pending_timeout_s : 300;
  return c;
}

/* Free j's held pushes; the number of steps that had any. */
static int job_drop_held(multi_job *j) {
  int steps = 0;
  if (j->have)
    for (int a = 0; a < RPC_COORD_AHEAD; a++) {
      int any = 0;
      for (int k = 0; k < j->world; k++) {
        held_push **q = &j->have[a * j->world + k];
        if (*q) {
          free(*q);
          *q = NULL;
          any = 1;
        }
      }
      steps += any;
    }
  return steps;
}

static void job_free(multi_job *j) {
  job_drop_held(j);
  free(j->have);
  j->have = NULL;
  free(j->done);
  j->done = NULL;
  free(j->gone);
  j->gone = NULL;
}

void rpc_coord_destroy(rpc_coord *c) {
  if (!c) return;
  rpc__coord_parts_drop(c, NULL);
  free(c->partial);
  for (int i = 0; i < c->n_jobs; i++) job_free(&c->jobs[i]);
  free(c->jobs);
  for (int i = 0; i < c->n_parked; i++) free(c->parked[i].in);
  free(c->parked);
  free(c->dims);
  free(c);
}

static int job_held(const multi_job *j) {
  int n = 0;
  if (j->have)
    for (int i = 0; i < RPC_COORD_AHEAD * j->world; i++) n += j->have[i] != NULL;
  return n;
}

static multi_job *job_find(rpc_coord *c, const char *job) {
  for (int i = 0; i < c->n_jobs; i++)
    if (!strcmp(c->jobs[i].job, job)) return &c->jobs[i];
  return NULL;
}

/* Async: every rank's push of this step (and all before) is in. */
static int64_t job_min_done(const multi_job *j) {
  int64_t m = j->done[0];
  for (int k = 1; k < j->world; k++)
    if (j->done[k] < m) m = j->done[k];
  return m;
}

/* The step a Lookup of step needs complete before it is served. */
static int64_t job_needs(const multi_job *j, int64_t step) {
  return j->stale ? step - j->stale : step - 1;
}

/* The last step complete: sync, applied; async, pushed by every rank. */
static int64_t job_complete(const multi_job *j) {
  return j->stale ? job_min_done(j) : j->applied;
}

static int job_ready(const multi_job *j, int64_t step) {
  return job_complete(j) >= job_needs(j, step);
}

static const char *mode_str(int stale, char *buf, size_t n) {
  if (stale) snprintf(buf, n, "async mode with max_staleness %d", stale);
  else snprintf(buf, n, "sync mode");
  return buf;
}

/* Whether j holds no pending state, so that forgetting it changes nothing
 * its ranks rely on: no push held or in parts, no call parked (a Lookup or
 * a live rank's Watch), async ranks all at one step. */
static int job_forgettable(const rpc_coord *c, const multi_job *j) {
  if (job_held(j)) return 0;
  if (j->stale)
    for (int k = 1; k < j->world; k++)
      if (j->done[k] != j->done[0]) return 0;
  for (int i = 0; i < c->n_parked; i++)
    if (!strcmp(c->parked[i].job, j->job)) return 0;
  for (int i = 0; i < c->n_partial; i++)
    if (!strcmp(c->partial[i].job, j->job)) return 0;
  return 1;
}

/* The multi-rank job named job, created at its first call; when start, the
 * first Lookup or Push's step becomes the job's first. With
 * RPC_COORD_MAX_JOBS remembered, the least recently used one holding no
 * pending state is forgotten for it; with none such, NULL and *busy set.
 * NULL with *busy clear when out of memory. */
static multi_job *job_get(rpc_coord *c, const char *job, int world, int64_t step, int stale,
                          int start, double now, int *busy) {
  *busy = 0;
  multi_job *j = job_find(c, job);
  if (j) {
    if (start && !j->started && !j->aborted && j->world == world && j->stale == stale) {
      /* made by a Watch: the first Lookup or Push fixes the first step */
      j->started = 1;
      j->applied = step - 1;
      if (j->done)
        for (int k = 0; k < world; k++) j->done[k] = step - 1;
      j->progress = now;
    }
    return j;
  }
  if (c->n_jobs == c->cap_jobs && c->cap_jobs < RPC_COORD_MAX_JOBS) {
    int cap = c->cap_jobs ? 2 * c->cap_jobs : 8;
    multi_job *p = realloc(c->jobs, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    c->jobs = p;
    c->cap_jobs = cap;
  }
  if (c->n_jobs < c->cap_jobs) {
    j = &c->jobs[c->n_jobs++];
  } else { /* forget the least recently used job that holds nothing pending */
    j = NULL;
    for (int i = 0; i < c->n_jobs; i++)
      if ((!j || c->jobs[i].used < j->used) && job_forgettable(c, &c->jobs[i])) j = &c->jobs[i];
    if (!j) {
      *busy = 1;
      return NULL;
    }
    job_free(j);
  }
  memset(j, 0, sizeof *j);
  snprintf(j->job, sizeof j->job, "%s", job);
  j->world = world;
  j->stale = stale;
  j->started = start;
  j->applied = step - 1;
  j->progress = now;
  j->gone = calloc((size_t)world, 1);
  if (stale) {
    j->done = malloc((size_t)world * sizeof *j->done);
    if (j->done)
      for (int k = 0; k < world; k++) j->done[k] = step - 1;
  } else {
    j->have = calloc((size_t)RPC_COORD_AHEAD * (size_t)world, sizeof *j->have);
  }
  if ((!j->have && !j->done) || !j->gone) {
    job_free(j);
    *j = c->jobs[--c->n_jobs];
    atomic_store(&c->jobs_hint, c->n_jobs);
    return NULL;
  }
  atomic_store(&c->jobs_hint, c->n_jobs);
  return j;
}

/* The multi-rank job of k, created at its first call; refuses a call whose
 * world size or mode differs from the job's, and every call of a job whose
 * pending state was dropped. NULL with *why and msg set when refused. */
static multi_job *job_enter(rpc_coord *c, const rpc_coord_call *k, int start, double now,
                            rpc_coord_outcome *why, char *msg, size_t msglen) {
  int busy;
  multi_job *j = job_get(c, k->job, k->world, k->step, k->stale, start, now, &busy);
  char a[64], b[64];
  if (busy) {
    *why = RPC_COORD_BUSY;
    snprintf(msg, msglen, "job %s not begun: the server remembers at most %d multi-rank jobs "
             "(RPC_COORD_MAX_JOBS) and each holds pending state (held pushes, parked calls); "
             "try again later", k->job, RPC_COORD_MAX_JOBS);
    return NULL;
  }
  if (!j) {
    *why = RPC_COORD_NOMEM;
    snprintf(msg, msglen, "out of memory for job %s", k->job);
    return NULL;
  }
  j->used = ++c->clock;
  if (j->aborted) {
    *why = RPC_COORD_ABORTED;
    snprintf(msg, msglen, "%s", j->why);
    return NULL;
  }
  *why = RPC_COORD_REFUSED;
  if (j->world != k->world) {
    snprintf(msg, msglen, "job %s runs with world size %d; this call says %d", k->job, j->world,
             k->world);
    return NULL;
  }
  if (j->stale != k->stale) {
    snprintf(msg, msglen,
             "header.max_staleness: job %s runs in %s (fixed at its first call); this call "
             "(rank %d, step %lld) asks for %s",
             k->job, mode_str(j->stale, a, sizeof a), k->rank, (long long)k->step,
             mode_str(k->stale, b, sizeof b));
    return NULL;
  }
  return j;
}

/* Index of (job, rank) in the single-rank table, or -1. */
static int solo_find(const rpc_coord *c, const char *job, int rank) {
  for (int i = 0; i < c->n_solo; i++)
    if (c->solo[i].rank == rank && !strcmp(c->solo[i].job, job)) return i;
  return -1;
}

/* A single-rank job: its mode is fixed at its first call too (the table
 * remembers it, replacing the least recently used entry when full). Its
 * index in the table, or -1 (REFUSED) with msg set. */
static int solo_enter(rpc_coord *c, const rpc_coord_call *k, char *msg, size_t msglen) {
  int i = solo_find(c, k->job, k->rank);
  char a[64], b[64];
  if (i < 0) {
    if (c->n_solo < RPC_COORD_MAX_JOBS) {
      i = c->n_solo++;
    } else {
      i = 0;
      for (int x = 1; x < RPC_COORD_MAX_JOBS; x++)
        if (c->solo[x].used < c->solo[i].used) i = x;
    }
    snprintf(c->solo[i].job, sizeof c->solo[i].job, "%s", k->job);
    c->solo[i].rank = k->rank;
    c->solo[i].stale = k->stale;
    c->solo[i].last_step = -1;
    c->solo[i].used = ++c->clock;
    return i;
  }
  if (c->solo[i].stale != k->stale) {
    snprintf(msg, msglen,
             "header.max_staleness: job %s runs in %s (fixed at its first call); this call "
             "(step %lld) asks for %s",
             k->job, mode_str(c->solo[i].stale, a, sizeof a), (long long)k->step,
             mode_str(k->stale, b, sizeof b));
    return -1;
  }
  return i;
}

/* "step T, which waited for rank(s) a,b": where j stands. */
static void job_where(const multi_job *j, char *buf, size_t n) {
  if (!j->started) {
    snprintf(buf, n, "its start (before any Lookup or Push)");
    return;
  }
  int64_t step = job_complete(j) + 1;
  int at = snprintf(buf, n, "step %lld, which waited for rank(s) ", (long long)step);
  int first = 1;
  for (int k = 0; k < j->world && at > 0 && (size_t)at + 16 < n; k++) {
    int missing = j->stale ? j->done[k] < step : !j->have[k];
    if (!missing) continue;
    at += snprintf(buf + at, n - (size_t)at, "%s%d", first ? "" : ",", k);
    first = 0;
  }
  if (first && at > 0 && (size_t)at < n) snprintf(buf + at, n - (size_t)at, "(none)");
}

/* Drop j's pending state: its held pushes (a step is never half-applied),
 * and mark its parked calls to be answered ABORTED with a message that
 * starts with what (the cause). Later calls of the job are refused with
 * the same message; its completed steps stay applied. */
static void job_abort(rpc_coord *c, multi_job *j, const char *what) {
  char where[160];
  job_where(j, where, sizeof where);
  int steps = job_drop_held(j); /* > 0 exactly when a push was held */
  c->dropped_steps += (uint64_t)steps;
  c->dropped_jobs++;
  j->aborted = 1;
  rpc__coord_parts_drop(c, j->job);
  snprintf(j->why, sizeof j->why, "job %.64s: %.150s during %.120s; %s", j->job, what, where,
           j->stale ? "its pushes so far stay applied (async mode)"
           : steps ? "the step's held pushes were dropped (nothing of it was applied)"
                  : "no push of it was held");
  for (int i = 0; i < c->n_parked; i++)
    if (!strcmp(c->parked[i].job, j->job)) {
      c->parked[i].abort = 1;
      snprintf(c->parked[i].why, sizeof c->parked[i].why, "%s", j->why);
    }
}

/* Keep a copy of in[len] and token until the call may be answered. 0, or
 * -1 when out of memory. */
static int park(rpc_coord *c, void *token, const uint8_t *in, size_t len, const rpc_coord_call *k,
                double timeout_s, int watch, double now) {
  if (c->n_parked == c->cap_parked) {
    int cap = c->cap_parked ? 2 * c->cap_parked : 16;
    parked_call *p = realloc(c->parked, (size_t)cap * sizeof *p);
    if (!p) return -1;
    c->parked = p;
    c->cap_parked = cap;
  }
  parked_call *p = &c->parked[c->n_parked];
  memset(p, 0, sizeof *p);
  p->in = malloc(len ? len : 1);
  if (!p->in) return -1;
  if (len) memcpy(p->in, in, len);
  p->len = len;
  p->token = token;
  snprintf(p->job, sizeof p->job, "%s", k->job);
  p->step = k->step;
  p->rank = k->rank;
  p->world = k->world;
  p->stale = k->stale;
  p->watch = watch;
  p->deadline = now + (timeout_s > 0 ? timeout_s : 0);
  c->n_parked++;
  atomic_store(&c->parked_hint, c->n_parked);
  return 0;
}

rpc_coord_outcome rpc_coord_lookup(rpc_coord *c, const rpc_coord_call *k, void *token,
                                   const uint8_t *in, size_t len, double timeout_s, double now,
                                   char *msg, size_t msglen) {
  if (k->world <= 1) return solo_enter(c, k, msg, msglen) < 0 ? RPC_COORD_REFUSED : RPC_COORD_GO;
  /* Sync: step t+1 is read only once every rank's push of step t is
   * applied. Async: step t once every rank's push of step t-S is. */
  rpc_coord_outcome why;
  const multi_job *j = job_enter(c, k, 1, now, &why, msg, msglen);
  if (!j) return why;
  if (job_ready(j, k->step)) return RPC_COORD_GO;
  if (token && !c->stopping && park(c, token, in, len, k, timeout_s, 0, now) == 0)
    return RPC_COORD_PARKED;
  snprintf(msg, msglen,
           "lookup of step %lld of job %s waits for every rank's push of step %lld (complete: "
           "%lld)%s",
           (long long)k->step, k->job, (long long)job_needs(j, k->step),
           (long long)job_complete(j),
           c->stopping ? "; the server is shutting down" : token ? "; out of memory to wait" : "");
  return RPC_COORD_WAIT;
}

rpc_coord_outcome rpc_coord_watch(rpc_coord *c, const rpc_coord_call *k, int detach, void *token,
                                  const uint8_t *in, size_t len, double timeout_s, double now,
                                  char *msg, size_t msglen) {
  if (k->world <= 1) return RPC_COORD_GO;
  rpc_coord_outcome why;
  multi_job *j = job_enter(c, k, 0, now, &why, msg, msglen);
  if (!j) return why;
  if (detach) {
    j->gone[k->rank] = 1;
    for (int i = 0; i < c->n_parked; i++)
      if (c->parked[i].watch && c->parked[i].rank == k->rank && !strcmp(c->parked[i].job, k->job))
        c->parked[i].released = 1;
    return RPC_COORD_GO;
  }
  if (j->gone[k->rank]) return RPC_COORD_GO;
  if (token && !c->stopping && park(c, token, in, len, k, timeout_s, 1, now) == 0)
    return RPC_COORD_PARKED;
  snprintf(msg, msglen, "watch of job %s rank %d: %s", k->job, k->rank,
           c->stopping ? "the server is shutting down"
           : token    ? "out of memory to wait"
                      : "nothing to wait on (no call to hold)");
  return RPC_COORD_WAIT;
}

typedef struct {
  uint64_t id;
  int rank;
  const float *g; /* dim floats */
} merge_ent;

static int cmp_ent(const void *a, const void *b) {
  const merge_ent *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Sum table t's rows over the ranks' pushes qs[W] (all present), a row's
 * gradients in rank order, into uid[u] and sum[u * dim]: u, the unique rows.
 * e has room for every rank's rows of t. */
static size_t merge_table(const rpc_coord *c, int t, held_push *const *qs, int W, merge_ent *e,
                          uint64_t *uid, float *sum) {
  const size_t dim = (size_t)c->dims[t];
  size_t n = 0;
  for (int k = 0; k < W; k++)
    for (size_t x = 0; x < qs[k]->counts[t]; x++)
      e[n++] = (merge_ent){qs[k]->ids[t][x], k, qs[k]->grads[t] + x * dim};
  qsort(e, n, sizeof *e, cmp_ent);
  size_t u = 0;
  for (size_t x = 0; x < n; x++) {
    if (x == 0 || e[x].id != e[x - 1].id) {
      uid[u++] = e[x].id;
      memcpy(sum + (u - 1) * dim, e[x].g, dim * sizeof(float));
    } else {
      float *acc = sum + (u - 1) * dim;
      for (size_t d = 0; d < dim; d++) acc[d] += e[x].g[d];
    }
  }
  return u;
}

/* Apply the next step of sync job j from qs[world] (all present): per
 * table, a row's gradients summed over the ranks in rank order, then the
 * optimizer once, with rank 0's learning rate. 0, or nonzero (the apply
 * callback's code, or -1 when out of memory) with the message in msg. */
static int job_apply(rpc_coord *c, const multi_job *j, held_push *const *qs, char *msg,
                     size_t msglen) {
  const int nt = c->n_tables, W = j->world;
  int rc = -1;
  const uint64_t **ids = calloc((size_t)nt + 1, sizeof *ids);
  const float **grads = calloc((size_t)nt + 1, sizeof *grads);
  size_t *counts = calloc((size_t)nt + 1, sizeof *counts);
  uint64_t **uid = calloc((size_t)nt + 1, sizeof *uid);
  float **sum = calloc((size_t)nt + 1, sizeof *sum);
  merge_ent *e = NULL;
  if (!ids || !grads || !counts || !uid || !sum) goto nomem;
  for (int t = 0; t < nt; t++) {
    size_t cnt = 0;
    for (int k = 0; k < W; k++) cnt += qs[k]->counts[t];
    if (!cnt) continue;
    free(e);
    e = malloc(cnt * sizeof *e);
    uid[t] = malloc(cnt * sizeof **uid);
    sum[t] = malloc(cnt * (size_t)c->dims[t] * sizeof **sum);
    if (!e || !uid[t] || !sum[t]) goto nomem;
    counts[t] = merge_table(c, t, qs, W, e, uid[t], sum[t]);
    ids[t] = uid[t];
    grads[t] = sum[t];
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  char err[RPC_COORD_MSG];
  err[0] = 0;
  rc = c->apply(c->apply_ctx, j->applied + 1, qs[0]->lr, &set, grads, err, sizeof err);
  if (rc)
    snprintf(msg, msglen, "push of step %lld of job %s: %s", (long long)j->applied + 1, j->job,
             err);
  goto done;
nomem:
  snprintf(msg, msglen, "out of memory merging the ranks' pushes");
done:
  if (uid)
    for (int t = 0; t < nt; t++) free(uid[t]);
  if (sum)
    for (int t = 0; t < nt; t++) free(sum[t]);
  free(uid);
  free(sum);
  free(e);
  free(ids);
  free(grads);
  free(counts);
  return rc;
}

/* A copy of p in one block (held_push); NULL when out of memory. */
held_push *rpc__coord_held_copy(const rpc_coord *c, const rpc_coord_grads *p) {
  const int nt = c->n_tables;
  size_t n_ids = 0, n_floats = 0;
  for (int t = 0; t < nt; t++) {
    n_ids += p->set->counts[t];
    n_floats += p->set->counts[t] * (size_t)c->dims[t];
  }
  size_t head = sizeof(held_push) + (size_t)nt * (sizeof(size_t) + 2 * sizeof(void *));
  head = (head + 7) & ~(size_t)7;
  held_push *h = malloc(head + n_ids * sizeof(uint64_t) + n_floats * sizeof(float));
  if (!h) return NULL;
  h->lr = p->lr;
  h->counts = (size_t *)(h + 1);
  h->ids = (uint64_t **)(h->counts + nt);
  h->grads = (float **)(h->ids + nt);
  uint64_t *id = (uint64_t *)((char *)h + head);
  float *g = (float *)(id + n_ids);
  for (int t = 0; t < nt; t++) {
    size_t n = p->set->counts[t], f = n * (size_t)c->dims[t];
    h->counts[t] = n;
    h->ids[t] = id;
    h->grads[t] = g;
    if (n) memcpy(id, p->set->ids[t], n * sizeof *id);
    if (f) memcpy(g, p->grads[t], f * sizeof *g);
    id += n;
    g += f;
  }
  return h;
}

/* A push of a single-rank job: applied on arrival, idempotent on (job,
 * step, rank). */
static rpc_coord_outcome solo_push(rpc_coord *c, const rpc_coord_call *k,
                                   const rpc_coord_grads *p, char *msg, size_t msglen) {
  int i = solo_enter(c, k, msg, msglen);
  if (i < 0) return RPC_COORD_REFUSED;
  if (k->step <= c->solo[i].last_step) return RPC_COORD_RETRY; /* already applied */
  char err[RPC_COORD_MSG];
  err[0] = 0;
  int rc = c->apply(c->apply_ctx, k->step, p->lr, p->set, p->grads, err, sizeof err);
  if (rc) {
    snprintf(msg, msglen, "push: %s", err);
    return rc == SR_ERANGE ? RPC_COORD_INVALID : RPC_COORD_FAILED;
  }
  c->solo[i].last_step = k->step;
  c->solo[i].used = ++c->clock;
  return RPC_COORD_GO;
}

rpc_coord_outcome rpc_coord_push_take(rpc_coord *c, const rpc_coord_call *k, char *msg,
                                      size_t msglen) {
  int i = solo_enter(c, k, msg, msglen);
  if (i < 0) return RPC_COORD_REFUSED;
  if (k->step <= c->solo[i].last_step) return RPC_COORD_RETRY;
  c->solo[i].last_step = k->step;
  c->solo[i].used = ++c->clock;
  return RPC_COORD_GO;
}

/* Whether (job, step, rank) of k was taken already (a retry). */
int rpc__coord_push_taken(rpc_coord *c, const rpc_coord_call *k) {
  if (k->world <= 1) {
    int i = solo_find(c, k->job, k->rank);
    return i >= 0 && k->step <= c->solo[i].last_step;
  }
  const multi_job *j = job_find(c, k->job);
  if (!j || !j->started || k->rank >= j->world) return 0;
  if (j->stale) return k->step <= j->done[k->rank];
  int64_t a = k->step - j->applied - 1;
  return a < 0 || (a < RPC_COORD_AHEAD && j->have[a * j->world + k->rank]);
}

rpc_coord_outcome rpc_coord_push(rpc_coord *c, const rpc_coord_call *k, const rpc_coord_grads *p,
                                 double now, char *msg, size_t msglen) {
  if (k->parts > 1) return rpc__coord_push_part(c, k, p, now, msg, msglen);
  return rpc__coord_push_whole(c, k, p, now, msg, msglen);
}

rpc_coord_outcome rpc__coord_push_whole(rpc_coord *c, const rpc_coord_call *k,
                                        const rpc_coord_grads *p, double now, char *msg,
                                        size_t msglen) {
  if (k->world <= 1) return solo_push(c, k, p, msg, msglen);
  rpc_coord_outcome why;
  multi_job *j = job_enter(c, k, 1, now, &why, msg, msglen);
  if (!j) return why;
  char err[RPC_COORD_MSG];
  err[0] = 0;
  if (j->stale) { /* async: applied on arrival */
    if (k->step <= j->done[k->rank]) return RPC_COORD_RETRY;
    int rc = c->apply(c->apply_ctx, k->step, p->lr, p->set, p->grads, err, sizeof err);
    if (rc) {
      snprintf(msg, msglen, "push of step %lld of job %s: %s", (long long)k->step, k->job, err);
      return rc == SR_ERANGE ? RPC_COORD_INVALID : RPC_COORD_FAILED;
    }
    j->done[k->rank] = k->step;
    j->progress = now;
    return RPC_COORD_GO;
  }
  if (k->step <= j->applied) return RPC_COORD_RETRY;
  int64_t a = k->step - j->applied - 1;
  if (a >= RPC_COORD_AHEAD) {
    snprintf(msg, msglen,
             "push of step %lld of job %s: step %lld still misses ranks' pushes (at most %d steps "
             "are collected at once)",
             (long long)k->step, k->job, (long long)j->applied + 1, RPC_COORD_AHEAD);
    return RPC_COORD_REFUSED;
  }
  held_push **slot = &j->have[a * j->world + k->rank];
  if (*slot) return RPC_COORD_RETRY;
  *slot = rpc__coord_held_copy(c, p);
  if (!*slot) {
    snprintf(msg, msglen, "out of memory holding the push of step %lld of job %s",
             (long long)k->step, k->job);
    return RPC_COORD_NOMEM;
  }
  j->progress = now;
  const int W = j->world;
  for (;;) { /* apply every step now complete */
    for (int r = 0; r < W; r++)
      if (!j->have[r]) return RPC_COORD_GO;
    int rc = job_apply(c, j, j->have, msg, msglen);
    if (rc == SR_ERANGE) { /* refused whole: the step is dropped, the job stops as for a dead rank */
      /* msg is "push of step S of job J: why"; job_abort names the job itself. */
      int skip = snprintf(NULL, 0, "push of step %lld of job %s: ", (long long)j->applied + 1, j->job);
      char what[RPC_COORD_MSG];
      snprintf(what, sizeof what, "step %lld's summed update was refused (%s)",
               (long long)j->applied + 1, skip > 0 && (size_t)skip < strlen(msg) ? msg + skip : msg);
      job_abort(c, j, what);
      snprintf(msg, msglen, "%s", j->why);
      return RPC_COORD_ABORTED;
    }
    for (int r = 0; r < W; r++) free(j->have[r]);
    memmove(j->have, j->have + W, (size_t)(RPC_COORD_AHEAD - 1) * (size_t)W * sizeof *j->have);
    memset(j->have + (size_t)(RPC_COORD_AHEAD - 1) * (size_t)W, 0, (size_t)W * sizeof *j->have);
    j->applied++;
    if (rc) return RPC_COORD_FAILED;
  }
}

/* Drop the pending state of jobs with no progress for the pending timeout
 * (a rank went away without a parked call to tell). */
static void sweep(rpc_coord *c, double now) {
  for (int i = 0; i < c->n_jobs; i++) {
    multi_job *j = &c->jobs[i];
    if (j->aborted || now - j->progress < c->pending_timeout) continue;
    /* Pending: held pushes (sync), or ranks at different steps (async). */
    int pending = j->stale ? 0 : job_held(j) > 0;
    if (j->stale)
      for (int k = 1; k < j->world; k++) pending |= j->done[k] != j->done[0];
    int parked = 0;
    for (int p = 0; p < c->n_parked && !parked; p++)
      parked = !c->parked[p].watch && !strcmp(c->parked[p].job, j->job);
    if (!pending && !parked) continue;
    char what[128];
    snprintf(what, sizeof what, "no progress for %.0f s (a rank went away?)", c->pending_timeout);
    job_abort(c, j, what);
  }
}

/* Sweep for stalled jobs a few times per timeout, at least every second. */
static double sweep_every(const rpc_coord *c) {
  double t = c->pending_timeout / 4;
  return t < 1 ? t : 1;
}

int rpc_coord_idle(const rpc_coord *c, double now) {
  if (atomic_load(&c->parked_hint)) return 0;
  return atomic_load(&c->jobs_hint) == 0 ||
         (long long)(now * 1e6) < atomic_load(&c->next_sweep_us);
}

/* What a parked call has come to at now; GO for a Lookup that may be served,
 * 0 (GO) with *keep for one that still waits. */
static rpc_coord_outcome woken_what(rpc_coord *c, const parked_call *p, double now, int *keep) {
  *keep = 0;
  if (c->stopping) return RPC_COORD_STOPPING;
  if (p->abort) return RPC_COORD_ABORTED;
  if (p->watch) {
    if (p->released) return RPC_COORD_RELEASED;
    if (now >= p->deadline) return RPC_COORD_TIMED_OUT;
  } else {
    const multi_job *j = job_find(c, p->job);
    if (!j || job_ready(j, p->step)) return RPC_COORD_GO;
    if (now >= p->deadline) return RPC_COORD_TIMED_OUT;
  }
  *keep = 1;
  return RPC_COORD_GO;
}

/* The answer's message of parked call p handed back as what. */
static void woken_msg(rpc_coord *c, const parked_call *p, rpc_coord_outcome what, char *msg,
                      size_t n) {
  msg[0] = 0;
  if (what == RPC_COORD_ABORTED) {
    snprintf(msg, n, "%s", p->why);
  } else if (what == RPC_COORD_STOPPING) {
    snprintf(msg, n, "%s of job %.128s: the server is shutting down", p->watch ? "watch" : "lookup",
             p->job);
  } else if (what == RPC_COORD_TIMED_OUT && p->watch) {
    snprintf(msg, n, "watch of job %.128s rank %d: deadline passed", p->job, p->rank);
  } else if (what == RPC_COORD_TIMED_OUT) {
    const multi_job *j = job_find(c, p->job); /* there: a Lookup without its job is served */
    snprintf(msg, n,
             "lookup of job %.128s: deadline passed waiting for every rank's push of step %lld",
             p->job, (long long)job_needs(j, p->step));
  }
}

int rpc_coord_take_woken(rpc_coord *c, double now, rpc_coord_woken *out, int max) {
  if ((long long)(now * 1e6) >= atomic_load(&c->next_sweep_us)) {
    sweep(c, now);
    atomic_store(&c->next_sweep_us, (long long)((now + sweep_every(c)) * 1e6));
  }
  int n = 0;
  for (int i = 0; i < c->n_parked && n < max;) {
    parked_call *p = &c->parked[i];
    int keep;
    rpc_coord_outcome what = woken_what(c, p, now, &keep);
    if (keep) {
      i++;
      continue;
    }
    rpc_coord_woken *w = &out[n++];
    w->token = p->token;
    w->what = what;
    w->watch = p->watch;
    w->in = p->in;
    w->len = p->len;
    woken_msg(c, p, what, w->msg, sizeof w->msg);
    c->parked[i] = c->parked[--c->n_parked];
  }
  atomic_store(&c->parked_hint, c->n_parked);
  return n;
}

/* Whether rank of job holds a Watch parked here (its process is alive). */
static int watch_parked(const rpc_coord *c, const char *job, int rank) {
  for (int i = 0; i < c->n_parked; i++) {
    const parked_call *q = &c->parked[i];
    if (q->watch && !q->released && q->rank == rank && !strcmp(q->job, job)) return 1;
  }
  return 0;
}

int rpc_coord_cancel(rpc_coord *c, void *token, double now, size_t *in_len) {
  int i = 0;
  while (i < c->n_parked && c->parked[i].token != token) i++;
  if (i == c->n_parked) return 0;
  parked_call p = c->parked[i];
  c->parked[i] = c->parked[--c->n_parked];
  atomic_store(&c->parked_hint, c->n_parked);
  if (in_len) *in_len = p.len;
  const int was = p.watch ? 2 : 1;
  /* A Lookup its rank gave up on while that rank's Watch is still open
   * here: the rank lives (its client gave up at its own deadline and tries
   * again, as after a partition, when the attempts given up on arrive
   * late): forgotten, not a death. Its process ending cancels the Watch. */
  if (!p.watch && watch_parked(c, p.job, p.rank)) {
    free(p.in);
    return was;
  }
  multi_job *j = job_find(c, p.job);
  if (!j && p.watch && !c->stopping) /* forgotten (Restore, or replaced): refuse the job now */
    j = job_get(c, p.job, p.world, 0, p.stale, 0, now, &(int){0});
  if (j && !j->aborted && !c->stopping && !(p.rank < j->world && j->gone[p.rank])) {
    char what[200];
    if (p.watch)
      snprintf(what, sizeof what, "rank %d went away (its Watch was cancelled: its process ended)",
               p.rank);
    else
      snprintf(what, sizeof what, "rank %d went away (its Lookup of step %lld was cancelled)",
               p.rank, (long long)p.step);
    job_abort(c, j, what);
  }
  free(p.in);
  return was;
}

void rpc_coord_restore(rpc_coord *c) {
  /* Steps start over from the checkpoint's: every job's pending state is
   * dropped and its parked Lookups answered ABORTED. */
  c->n_solo = 0;
  rpc__coord_parts_drop(c, NULL);
  for (int i = 0; i < c->n_jobs; i++) {
    c->dropped_steps += (uint64_t)job_drop_held(&c->jobs[i]);
    job_free(&c->jobs[i]);
  }
  c->n_jobs = 0;
  atomic_store(&c->jobs_hint, 0);
  for (int i = 0; i < c->n_parked; i++) {
    parked_call *p = &c->parked[i];
    if (p->watch) continue; /* ranks are still there: keep watching */
    p->abort = 1;
    snprintf(p->why, sizeof p->why,
             "job %.64s: the server was restored from a checkpoint while this Lookup of step "
             "%lld waited; the job's pending step state was dropped",
             p->job, (long long)p->step);
  }
}

void rpc_coord_stop_parking(rpc_coord *c) {
  c->stopping = 1;
  atomic_store(&c->parked_hint, c->n_parked);
}

void rpc_coord_stats_get(const rpc_coord *c, rpc_coord_stats *st) {
  memset(st, 0, sizeof *st);
  for (int i = 0; i < c->n_jobs; i++) st->pending_pushes += (uint64_t)job_held(&c->jobs[i]);
  st->dropped_steps = c->dropped_steps;
  st->jobs = (uint64_t)c->n_jobs;
  st->dropped_jobs = c->dropped_jobs;
  for (int i = 0; i < c->n_parked; i++) {
    if (c->parked[i].watch) st->parked_watches++;
    else st->parked_lookups++;
  }
}
