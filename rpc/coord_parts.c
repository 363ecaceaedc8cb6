/* A push split into parts (rpc_coord_push, k->parts > 1): its parts held
 * until every one is in, then taken as the one push (rpc/coord_impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/coord_impl.h"
#include "rpc/coord_state_impl.h"

static void partial_drop(rpc_coord *c, int i) {
  partial_push *q = &c->partial[i];
  for (int k = 0; k < q->parts; k++) free(q->piece[k]);
  free(q->piece);
  c->partial[i] = c->partial[--c->n_partial];
}

/* Drop the parts held for job (NULL: every job). */
void rpc__coord_parts_drop(rpc_coord *c, const char *job) {
  for (int i = c->n_partial - 1; i >= 0; i--)
    if (!job || !strcmp(c->partial[i].job, job)) partial_drop(c, i);
}

/* The collecting entry of k's push, made at its first part. When
 * RPC_COORD_PARTIALS pushes are being collected already, one holding no
 * part, else the one with no part for the pending timeout the longest (its
 * sender went away), is dropped to make room; with none such, NULL and
 * *busy set: every held part was answered taken, so none may be dropped.
 * NULL with *busy clear when out of memory. */
static partial_push *partial_get(rpc_coord *c, const rpc_coord_call *k, double now, int *busy) {
  *busy = 0;
  for (int i = 0; i < c->n_partial; i++) {
    partial_push *q = &c->partial[i];
    if (q->rank == k->rank && q->step == k->step && !strcmp(q->job, k->job)) return q;
  }
  if (c->n_partial == RPC_COORD_PARTIALS) {
    int old = 0;
    for (int i = 1; i < c->n_partial; i++)
      if (c->partial[i].at < c->partial[old].at) old = i;
    for (int i = 0; i < c->n_partial; i++)
      if (!c->partial[i].got) old = i; /* none taken (out of memory at its first): free */
    if (c->partial[old].got && now - c->partial[old].at < c->pending_timeout) {
      *busy = 1;
      return NULL;
    }
    partial_drop(c, old);
  }
  if (c->n_partial == c->cap_partial) {
    int cap = c->cap_partial ? 2 * c->cap_partial : 64;
    if (cap > RPC_COORD_PARTIALS) cap = RPC_COORD_PARTIALS;
    partial_push *a = realloc(c->partial, (size_t)cap * sizeof *a);
    if (!a) return NULL;
    c->partial = a;
    c->cap_partial = cap;
  }
  held_push **piece = calloc((size_t)k->parts, sizeof *piece);
  if (!piece) return NULL;
  partial_push *q = &c->partial[c->n_partial++];
  memset(q, 0, sizeof *q);
  snprintf(q->job, sizeof q->job, "%s", k->job);
  q->rank = k->rank;
  q->step = k->step;
  q->parts = k->parts;
  q->piece = piece;
  q->at = now;
  return q;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* q's parts as one push into *h (one block, as held_copy makes): 0, -1 out
 * of memory, or 1 with msg naming a row given in two parts. */
static int partial_merge(const rpc_coord *c, const partial_push *q, held_push **h, char *msg,
                         size_t msglen) {
  const int nt = c->n_tables;
  size_t *counts = calloc((size_t)nt + 1, sizeof *counts);
  const uint64_t **ids = calloc((size_t)nt + 1, sizeof *ids);
  const float **grads = calloc((size_t)nt + 1, sizeof *grads);
  uint64_t *idbuf = NULL;
  float *gbuf = NULL;
  int rc = -1;
  *h = NULL;
  if (!counts || !ids || !grads) goto done;
  size_t n_ids = 0, n_f = 0;
  for (int t = 0; t < nt; t++)
    for (int k = 0; k < q->parts; k++) {
      counts[t] += q->piece[k]->counts[t];
      n_ids += q->piece[k]->counts[t];
      n_f += q->piece[k]->counts[t] * (size_t)c->dims[t];
    }
  idbuf = malloc((n_ids ? n_ids : 1) * sizeof *idbuf);
  gbuf = malloc((n_f ? n_f : 1) * sizeof *gbuf);
  if (!idbuf || !gbuf) goto done;
  uint64_t *ip = idbuf;
  float *gp = gbuf;
  for (int t = 0; t < nt; t++) {
    ids[t] = ip;
    grads[t] = gp;
    for (int k = 0; k < q->parts; k++) {
      size_t n = q->piece[k]->counts[t], f = n * (size_t)c->dims[t];
      if (n) memcpy(ip, q->piece[k]->ids[t], n * sizeof *ip);
      if (f) memcpy(gp, q->piece[k]->grads[t], f * sizeof *gp);
      ip += n;
      gp += f;
    }
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  rpc_coord_grads whole = {.lr = q->piece[0]->lr, .set = &set, .grads = grads};
  *h = rpc__coord_held_copy(c, &whole);
  if (!*h) goto done;
  rc = 0;
  for (int t = 0; t < nt && !rc; t++) { /* unique within each part, so check across */
    uint64_t *sorted = idbuf; /* reused: the copy in *h is what is applied */
    size_t n = counts[t];
    memcpy(sorted, (*h)->ids[t], n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_u64);
    for (size_t x = 1; x < n && !rc; x++)
      if (sorted[x] == sorted[x - 1]) {
        snprintf(msg, msglen, "push of step %lld of job %s: row %llu of table index %d is in two "
                 "of its %d parts; nothing applied", (long long)q->step, q->job,
                 (unsigned long long)sorted[x], t, q->parts);
        rc = 1;
      }
  }
  if (rc) {
    free(*h);
    *h = NULL;
  }
done:
  free(counts);
  free(ids);
  free(grads);
  free(idbuf);
  free(gbuf);
  return rc;
}

/* Part k->part of a split push: held until all are in, then the push. */
rpc_coord_outcome rpc__coord_push_part(rpc_coord *c, const rpc_coord_call *k,
                                       const rpc_coord_grads *p, double now, char *msg,
                                       size_t msglen) {
  if (rpc__coord_push_taken(c, k)) return RPC_COORD_RETRY;
  int busy;
  partial_push *q = partial_get(c, k, now, &busy);
  if (busy) {
    snprintf(msg, msglen, "push of step %lld of job %s: part %d of %d not taken: the server "
             "holds the parts of at most %d pushes at once (RPC_COORD_PARTIALS) and that many are "
             "being collected; send it again later", (long long)k->step, k->job, k->part,
             k->parts, RPC_COORD_PARTIALS);
    return RPC_COORD_BUSY;
  }
  if (!q) goto nomem;
  if (q->parts != k->parts) {
    snprintf(msg, msglen, "push of step %lld of job %s: part %d of %d, but its first part said %d "
             "parts", (long long)k->step, k->job, k->part, k->parts, q->parts);
    return RPC_COORD_REFUSED;
  }
  if (q->piece[k->part]) return RPC_COORD_RETRY;
  if (!(q->piece[k->part] = rpc__coord_held_copy(c, p))) goto nomem;
  q->at = now;
  if (++q->got < q->parts) return RPC_COORD_GO; /* taken: held until the rest come */
  held_push *h;
  int m = partial_merge(c, q, &h, msg, msglen);
  partial_drop(c, (int)(q - c->partial));
  if (m > 0) return RPC_COORD_INVALID;
  if (m < 0) goto nomem;
  emb_idset set = {.n_tables = c->n_tables, .ids = (const uint64_t *const *)h->ids,
                   .counts = h->counts};
  rpc_coord_grads whole = {.lr = h->lr, .set = &set, .grads = (const float *const *)h->grads};
  rpc_coord_call k1 = *k;
  k1.part = 0;
  k1.parts = 1;
  rpc_coord_outcome o = rpc__coord_push_whole(c, &k1, &whole, now, msg, msglen);
  free(h);
  return o;
nomem:
  snprintf(msg, msglen, "out of memory holding part %d of %d of the push of step %lld of job %s",
           k->part, k->parts, (long long)k->step, k->job);
  return RPC_COORD_NOMEM;
}

