/* The NCCL collective: device buffers, one GPU per rank, a separate stream
 * ordered after the compute stream by events. See collective.h. */
#include "dense/collective.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHARDREC_HAVE_MPI
#include <mpi.h>
#endif

#include "common/status.h"
#include "dense/backend_cuda.h"

typedef struct {
  dense_coll base; /* first: the interface */
  ncclComm_t comm;
  cudaStream_t stream;         /* the collectives' stream (owned) */
  cudaStream_t compute;        /* borrowed; NULL: legacy default stream */
  cudaEvent_t ready, done;     /* compute -> collective -> compute */
  int device;
} nccl_coll;

/* Every CUDA/NCCL call: on failure "file:line: call: message" in errmsg,
 * SR_EBACKEND returned. */
static int fail_at(char *msg, size_t len, const char *file, int line,
                   const char *call, const char *what) {
  snprintf(msg, len, "%s:%d: %s: %s", file, line, call, what);
  return SR_EBACKEND;
}
#define NCCL_CHECK(c, call)                                                   \
  ({                                                                          \
    ncclResult_t r_ = (call);                                                 \
    r_ == ncclSuccess ? 0                                                     \
                      : fail_at((c)->errmsg, sizeof (c)->errmsg, __FILE__,    \
                                __LINE__, #call, ncclGetErrorString(r_));     \
  })
#define CUDA_CHECK_C(c, call)                                                 \
  ({                                                                          \
    cudaError_t e_ = (call);                                                  \
    e_ == cudaSuccess ? 0                                                     \
                      : fail_at((c)->errmsg, sizeof (c)->errmsg, __FILE__,    \
                                __LINE__, #call, cudaGetErrorString(e_));     \
  })

/* Queue op on the collective stream between the two events. */
static int before(nccl_coll *n) {
  dense_coll *c = &n->base;
  if (CUDA_CHECK_C(c, cudaSetDevice(n->device)) ||
      CUDA_CHECK_C(c, cudaEventRecord(n->ready, n->compute)) ||
      CUDA_CHECK_C(c, cudaStreamWaitEvent(n->stream, n->ready, 0)))
    return SR_EBACKEND;
  return SR_OK;
}
static int after(nccl_coll *n) {
  dense_coll *c = &n->base;
  if (CUDA_CHECK_C(c, cudaEventRecord(n->done, n->stream)) ||
      CUDA_CHECK_C(c, cudaStreamWaitEvent(n->compute, n->done, 0)))
    return SR_EBACKEND;
  return SR_OK;
}

static int nccl_all_reduce(dense_coll *c, float *buf, size_t count) {
  nccl_coll *n = (nccl_coll *)c;
  if (before(n)) return SR_EBACKEND;
  if (NCCL_CHECK(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum,
                                  n->comm, n->stream)))
    return SR_EBACKEND;
  return after(n);
}

static int nccl_broadcast(dense_coll *c, float *buf, size_t count, int root) {
  nccl_coll *n = (nccl_coll *)c;
  if (before(n)) return SR_EBACKEND;
  if (NCCL_CHECK(c, ncclBroadcast(buf, buf, count, ncclFloat, root, n->comm,
                                  n->stream)))
    return SR_EBACKEND;
  return after(n);
}

/* Wait for this rank's queued collectives, then (several ranks, MPI) for
 * every rank. */
static int nccl_barrier(dense_coll *c) {
  nccl_coll *n = (nccl_coll *)c;
  if (CUDA_CHECK_C(c, cudaSetDevice(n->device)) ||
      CUDA_CHECK_C(c, cudaStreamSynchronize(n->stream)))
    return SR_EBACKEND;
#ifdef SHARDREC_HAVE_MPI
  if (c->size > 1 && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) {
    snprintf(c->errmsg, sizeof c->errmsg, "%s:%d: MPI_Barrier failed",
             __FILE__, __LINE__);
    return SR_EBACKEND;
  }
#endif
  return SR_OK;
}

/* Gatherv over point-to-point calls (NCCL has no gather): in one group,
 * every other rank sends its n floats to root, which receives counts[r]
 * into its place in recv and copies its own part on the stream. */
static int nccl_gather(dense_coll *c, const float *send, size_t count,
                       float *recv, const size_t *counts, int root) {
  nccl_coll *n = (nccl_coll *)c;
  if (before(n)) return SR_EBACKEND;
  if (NCCL_CHECK(c, ncclGroupStart())) return SR_EBACKEND;
  int rc = 0;
  if (c->rank == root) {
    size_t at = 0;
    for (int r = 0; r < c->size && !rc; r++) {
      if (r == root) {
        if (counts[r])
          rc = CUDA_CHECK_C(c, cudaMemcpyAsync(recv + at, send,
                                               counts[r] * sizeof *recv,
                                               cudaMemcpyDeviceToDevice,
                                               n->stream));
      } else if (counts[r]) {
        rc = NCCL_CHECK(c, ncclRecv(recv + at, counts[r], ncclFloat, r,
                                    n->comm, n->stream));
      }
      at += counts[r];
    }
  } else if (count) {
    rc = NCCL_CHECK(c, ncclSend(send, count, ncclFloat, root, n->comm,
                                n->stream));
  }
  if (NCCL_CHECK(c, ncclGroupEnd()) || rc) return SR_EBACKEND;
  return after(n);
}

/* Bytes on device buffers: ncclBroadcast / ncclAllGather on ncclUint8
 * (size_t counts; in place when send is this rank's block of recv, as NCCL
 * allows). */
static int nccl_broadcast_bytes(dense_coll *c, void *buf, size_t count,
                                int root) {
  nccl_coll *n = (nccl_coll *)c;
  if (before(n)) return SR_EBACKEND;
  if (NCCL_CHECK(c, ncclBroadcast(buf, buf, count, ncclUint8, root, n->comm,
                                  n->stream)))
    return SR_EBACKEND;
  return after(n);
}

static int nccl_allgather_bytes(dense_coll *c, const void *send, size_t count,
                                void *recv) {
  nccl_coll *n = (nccl_coll *)c;
  if (before(n)) return SR_EBACKEND;
  if (NCCL_CHECK(c, ncclAllGather(send, recv, count, ncclUint8, n->comm,
                                  n->stream)))
    return SR_EBACKEND;
  return after(n);
}

static void nccl_destroy(dense_coll *c) {
  nccl_coll *n = (nccl_coll *)c;
  if (n->stream) cudaStreamSynchronize(n->stream);
  if (n->comm) ncclCommDestroy(n->comm);
  if (n->ready) cudaEventDestroy(n->ready);
  if (n->done) cudaEventDestroy(n->done);
  if (n->stream) cudaStreamDestroy(n->stream);
  free(n);
}

static const dense_coll_ops nccl_ops = {.name = "nccl",
                                        .all_reduce_sum = nccl_all_reduce,
                                        .broadcast = nccl_broadcast,
                                        .barrier = nccl_barrier,
                                        .gather = nccl_gather,
                                        .broadcast_bytes = nccl_broadcast_bytes,
                                        .allgather_bytes = nccl_allgather_bytes,
                                        .destroy = nccl_destroy};

dense_coll *dense_coll_nccl_create(int rank, int size, int local_rank,
                                   void *compute_stream, char *err,
                                   size_t errlen) {
  if (size < 1 || rank < 0 || rank >= size || local_rank < 0) {
    sr_fmt(err, errlen, "NCCL: rank %d of %d (local rank %d) is not valid",
           rank, size, local_rank);
    return NULL;
  }
#ifndef SHARDREC_HAVE_MPI
  if (size > 1) {
    sr_fmt(err, errlen, "NCCL with %d ranks needs MPI to share the unique id, "
           "and this build has no MPI", size);
    return NULL;
  }
#endif
  nccl_coll *n = calloc(1, sizeof *n);
  if (!n) {
    sr_fmt(err, errlen, "NCCL: out of memory");
    return NULL;
  }
  dense_coll *c = &n->base;
  c->ops = &nccl_ops;
  c->rank = rank;
  c->size = size;
  n->compute = (cudaStream_t)compute_stream;
  char why[256];
  int ndev = dense_cuda_device_count(why, sizeof why);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (ndev < 1) {
    sr_fmt(err, errlen, "NCCL: no CUDA device (%s)", why);
    free(n);
    return NULL;
  }
  n->device = local_rank % ndev;
  if (CUDA_CHECK_C(c, cudaSetDevice(n->device)) ||
      CUDA_CHECK_C(c, cudaStreamCreateWithFlags(&n->stream,
                                                cudaStreamNonBlocking)) ||
      CUDA_CHECK_C(c, cudaEventCreateWithFlags(&n->ready,
                                               cudaEventDisableTiming)) ||
      CUDA_CHECK_C(c, cudaEventCreateWithFlags(&n->done,
                                               cudaEventDisableTiming)))
    goto fail;
  if (rank == 0 && NCCL_CHECK(c, ncclGetUniqueId(&id))) goto fail;
#ifdef SHARDREC_HAVE_MPI
  if (size > 1 && MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0,
                            MPI_COMM_WORLD) != MPI_SUCCESS) {
    snprintf(c->errmsg, sizeof c->errmsg, "%s:%d: MPI_Bcast of the NCCL id "
             "failed", __FILE__, __LINE__);
    goto fail;
  }
#endif
  if (NCCL_CHECK(c, ncclCommInitRank(&n->comm, size, id, rank))) goto fail;
  return c;
fail:
  sr_fmt(err, errlen, "NCCL rank %d of %d: %s", rank, size, c->errmsg);
  nccl_destroy(c);
  return NULL;
}
