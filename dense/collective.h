/* Collectives for data-parallel dense training: one small interface, a
 * backend behind a struct of function pointers (CPU single rank in
 * collective.c, MPI in collective_mpi.c, NCCL in collective_nccl.c).
 *
 * Buffers are where the backend works: host memory for the single-rank and
 * MPI backends, device memory for NCCL. Every call is collective:
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
  /* Variable-count gather (as MPI_Gatherv): every rank sends send[n] (its
   * own n, may be 0); on rank root, recv receives the ranks' buffers
   * concatenated in rank order, counts[r] being rank r's n (root knows them:
   * the caller passes them; counts[root] must equal root's n). recv and
   * counts are read only on root (may be NULL elsewhere). */
  int (*gather)(dense_coll *c, const float *send, size_t n, float *recv,
                const size_t *counts, int root);
  /* buf[n] bytes on every rank = buf[n] of rank root (exact copy). */
  int (*broadcast_bytes)(dense_coll *c, void *buf, size_t n, int root);
  /* recv[size * n] bytes on every rank = every rank's send[n] in rank
   * order (rank r's block at recv + r * n). send may be recv's own block
   * (send == recv + rank * n: in place); otherwise the two must not
   * overlap. */
  int (*allgather_bytes)(dense_coll *c, const void *send, size_t n,
                         void *recv);
  void (*destroy)(dense_coll *c);
} dense_coll_ops;

struct dense_coll {
  const dense_coll_ops *ops;
  int rank, size;      /* this rank, number of ranks */
  char errmsg[256];
};

/* The one-rank collective (host buffers): all-reduce and broadcast leave the
 * buffer as it is, gathers copy send into recv, barrier returns at once.
 * NULL only when out of memory. */
dense_coll *dense_coll_single_create(void);

/* Calls through c->ops; the wrappers check the arguments (SR_EINVAL). */
int dense_coll_all_reduce_sum(dense_coll *c, float *buf, size_t n);
int dense_coll_broadcast(dense_coll *c, float *buf, size_t n, int root);
int dense_coll_barrier(dense_coll *c);
int dense_coll_gather(dense_coll *c, const float *send, size_t n, float *recv,
                      const size_t *counts, int root);
/* Bytes rather than floats (addresses, ids, serialised records); the same
 * rules: every rank passes the same n and root. broadcast_bytes: buf[n] of
 * rank root to every rank's buf. allgather_bytes: send[n] of every rank into
 * every rank's recv[size * n] in rank order (the caller owns both buffers;
 * see dense_coll_ops for in place). n = 0 returns 0 at once. SR_EINVAL for a
 * NULL buffer, a root outside [0, size) or a size * n that does not fit a
 * size_t (the reason in dense_coll_errmsg, nothing communicated). */
int dense_coll_broadcast_bytes(dense_coll *c, void *buf, size_t n, int root);
int dense_coll_allgather_bytes(dense_coll *c, const void *send, size_t n,
                               void *recv);
void dense_coll_destroy(dense_coll *c); /* NULL-safe */
const char *dense_coll_errmsg(const dense_coll *c);

/* ---- MPI (collective_mpi.c) ----
 *
 * Declared in every build: without MPI (SHARDREC_HAVE_MPI undefined) the
 * launch helpers report one rank and dense_coll_mpi_create fails with
 * "built without MPI".
 *
 * The process side of an mpirun launch, kept here so that the tools never
 * include mpi.h:
 *   dense_mpi_launched  1 when the environment says this process was started
 *                       by mpirun/mpiexec (OMPI_COMM_WORLD_SIZE or PMI_SIZE),
 *                       with *rank, *size and *local_size (ranks on this node)
 *                       read from it; 0 (and 0, 1, 1) otherwise. Reads the
 *                       environment only: MPI is not initialised.
 *   dense_mpi_init      MPI_Init (once). Before it, sets Open MPI's
 *                       OMPI_MCA_mpi_yield_when_idle=1 when unset, so that
 *                       ranks crowded on few cores block instead of spinning
 *                       while they wait. 0 or SR_E* with the reason in err.
 *   dense_mpi_abort     MPI_Abort(MPI_COMM_WORLD, code): every rank of the
 *                       job stops; when MPI is not initialised, exit(code).
 *   dense_mpi_finalize  MPI_Finalize when initialised (NULL-safe to call). */
int dense_mpi_launched(int *rank, int *size, int *local_size);
int dense_mpi_init(char *err, size_t errlen);
void dense_mpi_abort(int code);
void dense_mpi_finalize(void);

/* The MPI collective over MPI_COMM_WORLD (duplicated, errors returned rather
 * than fatal), host buffers; MPI must be initialised. NULL with the reason in
 * err.
 *
 * All-reduce is deterministic and not MPI_Allreduce: Open MPI picks its
 * algorithm (and so the order of the float sums) from the message size and
 * the number of ranks, and nothing promises every rank the same bits. Here
 * the buffer is cut into size chunks; chunk j of every rank goes to rank j
 * (MPI_Alltoallv), which sums it in rank order (((b0 + b1) + b2) + ...),
 * and the summed chunks are gathered back to every rank (MPI_Allgatherv).
 * So every rank gets the same bits, and the same N and inputs always give
 * the same bits. Broadcast, barrier and gather are MPI_Bcast, MPI_Barrier and
 * MPI_Gatherv (exact copies); the byte operations MPI_Bcast (in pieces of at
 * most 1 GiB, so any n) and MPI_Allgather (n up to INT_MAX bytes per rank:
 * SR_EINVAL above) on MPI_BYTE. */
dense_coll *dense_coll_mpi_create(char *err, size_t errlen);

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
 * the GPU; dense_coll_barrier waits. The byte operations are ncclBroadcast
 * and ncclAllGather on ncclUint8, device buffers as the others. NULL with
 * the reason in err. */
dense_coll *dense_coll_nccl_create(int rank, int size, int local_rank,
                                   void *compute_stream, char *err,
                                   size_t errlen);
#endif

#ifdef __cplusplus
}
#endif

#endif
