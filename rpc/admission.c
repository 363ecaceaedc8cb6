/* Admission of a shard service's calls (rpc/service_impl.h): the in-flight
 * memory budget every Lookup and Push takes its share of before it
 * allocates (rpc/service.h, rpc_service_release), the message limit a
 * Lookup's answer must fit, and the pool of the calls' scratch (one per
 * call in flight, kept between calls). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sys.h"
#include "rpc/service_impl.h"

/* ---- the in-flight budget ---- */

static void budget_refuse(rpc_service *s, size_t need, size_t held, rpc_reply *r) {
  s->budget_refused++;
  r->status = RPC_RESOURCE_EXHAUSTED;
  snprintf(r->msg, sizeof r->msg,
           "in-flight memory budget: %s%zu of the %zu bytes are held by calls in flight, "
           "waited %g s (serve --inflight-mb); try again",
           need ? "this call needs more room than is free: " : "", held, s->budget,
           s->budget_wait_s);
  (void)need;
}

int rpc__budget_take(rpc_service *s, size_t need, int defer, rpc_reply *r) {
  pthread_mutex_lock(&s->mu);
  if (s->inflight > r->held && s->inflight + need > s->budget && defer) {
    pthread_mutex_unlock(&s->mu);
    r->status = RPC_DEFERRED;
    return r->status;
  }
  pthread_mutex_unlock(&s->mu);
  const struct timespec until = sr_deadline(CLOCK_REALTIME, s->budget_wait_s);
  pthread_mutex_lock(&s->mu);
  int timed_out = 0;
  while (s->inflight > r->held && s->inflight + need > s->budget && !timed_out)
    timed_out = pthread_cond_timedwait(&s->room, &s->mu, &until) == ETIMEDOUT;
  if (s->inflight > r->held && s->inflight + need > s->budget) {
    budget_refuse(s, need, s->inflight - r->held, r);
    pthread_mutex_unlock(&s->mu);
    return r->status;
  }
  s->inflight += need;
  r->held += need;
  pthread_mutex_unlock(&s->mu);
  return RPC_OK;
}

void rpc_service_release(rpc_service *s, size_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&s->mu);
  s->inflight -= bytes < s->inflight ? bytes : s->inflight;
  s->budget_gen++;
  pthread_cond_broadcast(&s->room);
  pthread_mutex_unlock(&s->mu);
}

uint64_t rpc_service_budget_gen(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t g = s->budget_gen;
  pthread_mutex_unlock(&s->mu);
  return g;
}

double rpc_service_budget_wait_s(const rpc_service *s) { return s->budget_wait_s; }

void rpc_service_refuse_busy(rpc_service *s, rpc_reply *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_lock(&s->mu);
  budget_refuse(s, 0, s->inflight, r);
  s->failed++;
  pthread_mutex_unlock(&s->mu);
}

size_t rpc__answer_bound(const rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                         const int *idx) {
  size_t answer = 32;
  for (size_t i = 0; i < n; i++)
    answer += tables[i]->n_ids * (size_t)s->plan->tables[idx[i]].dim * sizeof(float) + 16;
  return answer;
}

int rpc__check_answer(rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                      const int *idx, int defer, rpc_reply *r) {
  size_t ids = 0, rows = 0, answer = rpc__answer_bound(s, tables, n, idx);
  int dlo = 0, dhi = 0;
  for (size_t i = 0; i < n; i++) {
    const int dim = s->plan->tables[idx[i]].dim;
    ids += tables[i]->n_ids;
    rows += tables[i]->n_ids * (size_t)dim * sizeof(float);
    if (!i || dim < dlo) dlo = dim;
    if (!i || dim > dhi) dhi = dim;
  }
  if (answer > s->max_msg) {
    char dims[32];
    if (dlo == dhi) snprintf(dims, sizeof dims, "dim %d", dlo);
    else snprintf(dims, sizeof dims, "dims %d..%d", dlo, dhi);
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg,
             "the answer of %zu ids x %s x 4 bytes = %zu bytes of rows does not fit the message "
             "limit of %zu bytes: split the Lookup (Stats gives max_ids and max_message_bytes)",
             ids, dims, rows, s->max_msg);
    return r->status;
  }
  return rpc__budget_take(s, 3 * answer, defer, r);
}

/* ---- the scratch pool ---- */

#define SCRATCH_KEEP ((size_t)8 << 20) /* bytes of buffers a pooled scratch keeps */

static void scratch_free(rpc_scratch *x) {
  if (!x) return;
  free(x->ti), free(x->tip), free(x->tg), free(x->tgp), free(x->scan);
  free(x->rows_at), free(x->idx), free(x->seen), free(x->ids), free(x->counts);
  free(x->outp), free(x->grads), free(x->idbuf), free(x->hash);
  free(x);
}

void rpc__scratch_pool_free(rpc_service *s) {
  while (s->pool) {
    rpc_scratch *x = s->pool;
    s->pool = x->next;
    scratch_free(x);
  }
}

rpc_scratch *rpc__scratch_take(rpc_service *s) {
  pthread_mutex_lock(&s->pool_mu);
  rpc_scratch *x = s->pool;
  if (x) s->pool = x->next;
  pthread_mutex_unlock(&s->pool_mu);
  if (x) return x;
  const size_t nt = (size_t)s->plan->n_tables + 1;
  if (!(x = calloc(1, sizeof *x))) return NULL;
  x->seen = malloc(nt);
  x->ids = malloc(nt * sizeof *x->ids);
  x->counts = malloc(nt * sizeof *x->counts);
  x->outp = malloc(nt * sizeof *x->outp);
  x->grads = malloc(nt * sizeof *x->grads);
  if (!x->seen || !x->ids || !x->counts || !x->outp || !x->grads || rpc__scratch_tables(x, 4)) {
    scratch_free(x);
    return NULL;
  }
  return x;
}

/* Past SCRATCH_KEEP, x's id buffer and set slots are dropped. */
void rpc__scratch_give(rpc_service *s, rpc_scratch *x) {
  if (!x) return;
  if (x->cap_id * 8 + x->cap_hash * 4 > SCRATCH_KEEP) {
    free(x->idbuf), free(x->hash);
    x->idbuf = NULL;
    x->hash = NULL;
    x->cap_id = x->cap_hash = 0;
  }
  pthread_mutex_lock(&s->pool_mu);
  s->ids_in_place += x->in_place;
  s->ids_copied += x->copied;
  x->in_place = x->copied = 0;
  x->next = s->pool;
  s->pool = x;
  pthread_mutex_unlock(&s->pool_mu);
}
