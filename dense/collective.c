/* The collective interface's wrappers and the one-rank CPU collective. */
#include "dense/collective.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

static int single_all_reduce(dense_coll *c, float *buf, size_t n) {
  (void)c, (void)buf, (void)n;
  return SR_OK; /* the sum over one rank is the buffer itself */
}
static int single_broadcast(dense_coll *c, float *buf, size_t n, int root) {
  (void)c, (void)buf, (void)n, (void)root;
  return SR_OK;
}
static int single_barrier(dense_coll *c) {
  (void)c;
  return SR_OK;
}
static int single_gather(dense_coll *c, const float *send, size_t n, float *recv,
                         const size_t *counts, int root) {
  (void)c, (void)counts, (void)root;
  if (recv != send) memmove(recv, send, n * sizeof *recv);
  return SR_OK;
}
static int single_broadcast_bytes(dense_coll *c, void *buf, size_t n,
                                  int root) {
  (void)c, (void)buf, (void)n, (void)root;
  return SR_OK;
}
static int single_allgather_bytes(dense_coll *c, const void *send, size_t n,
                                  void *recv) {
  (void)c;
  if (recv != send) memmove(recv, send, n);
  return SR_OK;
}
static void single_destroy(dense_coll *c) { free(c); }

static const dense_coll_ops single_ops = {.name = "single",
                                          .all_reduce_sum = single_all_reduce,
                                          .broadcast = single_broadcast,
                                          .barrier = single_barrier,
                                          .gather = single_gather,
                                          .broadcast_bytes = single_broadcast_bytes,
                                          .allgather_bytes = single_allgather_bytes,
                                          .destroy = single_destroy};

dense_coll *dense_coll_single_create(void) {
  dense_coll *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ops = &single_ops;
  c->rank = 0;
  c->size = 1;
  return c;
}

int dense_coll_all_reduce_sum(dense_coll *c, float *buf, size_t n) {
  if (!c || (n && !buf)) return SR_EINVAL;
  return n ? c->ops->all_reduce_sum(c, buf, n) : SR_OK;
}

int dense_coll_broadcast(dense_coll *c, float *buf, size_t n, int root) {
  if (!c || (n && !buf)) return SR_EINVAL;
  if (root < 0 || root >= c->size) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "broadcast root %d outside [0, %d)",
           root, c->size);
    return SR_EINVAL;
  }
  return n ? c->ops->broadcast(c, buf, n, root) : SR_OK;
}

int dense_coll_barrier(dense_coll *c) {
  if (!c) return SR_EINVAL;
  return c->ops->barrier(c);
}

int dense_coll_gather(dense_coll *c, const float *send, size_t n, float *recv,
                      const size_t *counts, int root) {
  if (!c || (n && !send)) return SR_EINVAL;
  if (root < 0 || root >= c->size) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "gather root %d outside [0, %d)", root, c->size);
    return SR_EINVAL;
  }
  if (c->rank == root) {
    if (!counts) {
      sr_fmt(c->errmsg, sizeof c->errmsg, "gather: the root needs every rank's count");
      return SR_EINVAL;
    }
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if (counts[root] != n || (total && !recv)) {
      sr_fmt(c->errmsg, sizeof c->errmsg,
             "gather: root sends %zu floats but counts[%d] = %zu, or no receive buffer", n, root,
             counts[root]);
      return SR_EINVAL;
    }
  }
  return c->ops->gather(c, send, n, recv, counts, root);
}

int dense_coll_broadcast_bytes(dense_coll *c, void *buf, size_t n, int root) {
  if (!c) return SR_EINVAL;
  if (n && !buf) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "broadcast of %zu bytes: NULL buffer", n);
    return SR_EINVAL;
  }
  if (root < 0 || root >= c->size) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "broadcast root %d outside [0, %d)", root, c->size);
    return SR_EINVAL;
  }
  return n ? c->ops->broadcast_bytes(c, buf, n, root) : SR_OK;
}

int dense_coll_allgather_bytes(dense_coll *c, const void *send, size_t n, void *recv) {
  if (!c) return SR_EINVAL;
  if (n && (!send || !recv)) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "all-gather of %zu bytes: NULL %s buffer", n,
           send ? "receive" : "send");
    return SR_EINVAL;
  }
  if (n > SIZE_MAX / (size_t)c->size) {
    sr_fmt(c->errmsg, sizeof c->errmsg, "all-gather of %zu bytes from %d ranks: the receive "
           "size overflows", n, c->size);
    return SR_EINVAL;
  }
  return n ? c->ops->allgather_bytes(c, send, n, recv) : SR_OK;
}

void dense_coll_destroy(dense_coll *c) {
  if (c) c->ops->destroy(c);
}

const char *dense_coll_errmsg(const dense_coll *c) {
  return c ? c->errmsg : "no collective";
}
