/* Collectives for data-parallel dense training: one small interface, a
 * backend behind a struct of function pointers (CPU single rank here; NCCL
 * in collective_nccl.c; MPI may be added beside them the same way).
 *
 * Buffers are where the backend works: host memory for the single-rank and
 * (later) MPI backends, device memory for NCCL. Every call is collective:
 * all ranks call it in the same order with the same n. Calls return 0 or a
 * negative SR_E* code with the text in dense_coll_errmsg.
 *
 * Adding a backend: fill a dense_coll_ops, allocate a struct whose first
 * member is `dense_coll base` with ops/rank/size set, and return &base. */
#ifndef SHARDREC_DENSE_COLLECTIVE_H
#define SHARDREC_DENSE_COLLECTIVE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dense_coll dense_coll;

typedef struct dense_coll_ops {
  const char *name;
  /* buf[n] = sum over ranks of buf[n], in place (every rank gets the sum). */
  int (*all_reduce_sum)(dense_coll *c, float *buf, size_t n);
  /* buf[n] on every rank = buf[n] of rank root. */
  int (*broadcast)(dense_coll *c, float *buf, size_t n, int root);
  /* Returns when every rank has called it (for device backends: when the
   * collective work queued before it has finished on this rank). */
  int (*barrier)(dense_coll *c);
  void (*destroy)(dense_coll *c);
} dense_coll_ops;

struct dense_coll {
  const dense_coll_ops *ops;
  int rank, size;      /* this rank, number of ranks */
  char errmsg[256];
};

/* The one-rank collective (host buffers): all-reduce and broadcast leave the
 * buffer as it is, barrier returns at once. NULL only when out of memory. */
dense_coll *dense_coll_single_create(void);

/* Calls through c->ops; the wrappers check the arguments (SR_EINVAL). */
int dense_coll_all_reduce_sum(dense_coll *c, float *buf, size_t n);
int dense_coll_broadcast(dense_coll *c, float *buf, size_t n, int root);
int dense_coll_barrier(dense_coll *c);
void dense_coll_destroy(dense_coll *c); /* NULL-safe */
const char *dense_coll_errmsg(const dense_coll *c);

#ifdef SHARDREC_HAVE_NCCL
/* NCCL over device buffers, one GPU per rank: the rank's device is
 * local_rank (modulo the visible devices). The ncclUniqueId comes from
 * rank 0: with size 1 it is made locally (ncclGetUniqueId); with size > 1
 * it is broadcast over MPI_COMM_WORLD (MPI must be initialised; a build
 * without MPI refuses size > 1 with SR_EUNSUPPORTED).
 * compute_stream (a cudaStream_t, may be NULL: the legacy default stream)
 * is the stream that writes the buffers: each collective runs on the
 * communicator's own stream, ordered after the work already queued on
 * compute_stream by an event, and later work on compute_stream is ordered
 * after the collective by a second event. Calls return without waiting for
 * the GPU; dense_coll_barrier waits. NULL with the reason in err. */
dense_coll *dense_coll_nccl_create(int rank, int size, int local_rank,
                                   void *compute_stream, char *err,
                                   size_t errlen);
#endif

#ifdef __cplusplus
}
#endif

#endif
