/* The MPI collective (host buffers over a duplicate of MPI_COMM_WORLD) and
 * the launch helpers of an mpirun job. See collective.h. Without MPI
 * (SHARDREC_HAVE_MPI undefined) the same functions say "one rank" and
 * "built without MPI", so callers need no #ifdef. */
#include "dense/collective.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHARDREC_HAVE_MPI
#include <mpi.h>
#endif

#include "common/status.h"
#include "common/num.h"

/* A positive integer from the environment, or 0 (unset, not a number,
 * or past 2^24). */
static int env_int(const char *name) {
  const char *v = getenv(name);
  long long x;
  if (!v || sr_num_int(v, strlen(v), &x)) return 0;
  return x < 0 || x > 1 << 24 ? 0 : (int)x;
}

int dense_mpi_launched(int *rank, int *size, int *local_size) {
  int n = env_int("OMPI_COMM_WORLD_SIZE"), r = 0, local = 0;
  if (n > 0) {
    r = env_int("OMPI_COMM_WORLD_RANK");
    local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if ((n = env_int("PMI_SIZE")) > 0) {
    r = env_int("PMI_RANK");
    local = env_int("MPI_LOCALNRANKS");
  }
  if (n <= 0 || r >= n) {
    if (rank) *rank = 0;
    if (size) *size = 1;
    if (local_size) *local_size = 1;
    return 0;
  }
  if (rank) *rank = r;
  if (size) *size = n;
  if (local_size) *local_size = local > 0 ? local : n; /* unknown: assume one node */
  return 1;
}

#ifdef SHARDREC_HAVE_MPI

typedef struct {
  dense_coll base; /* first: the interface */
  MPI_Comm comm;   /* owned duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN */
  int *cnt, *displ, *ones, *rdispl; /* [size] chunk counts/offsets for all-reduce */
  float *tmp;      /* [size * max chunk] the chunks this rank sums */
  size_t tmp_cap;  /* floats tmp holds */
} mpi_coll;

/* Every MPI call: on failure "file:line: call: MPI's message" in errmsg and
 * SR_EBACKEND returned. */
static int mpi_fail_at(char *msg, size_t len, const char *file, int line, const char *call,
                       int code) {
  char what[MPI_MAX_ERROR_STRING];
  int wl = 0;
  if (MPI_Error_string(code, what, &wl) != MPI_SUCCESS) snprintf(what, sizeof what, "error %d", code);
  snprintf(msg, len, "%s:%d: %.80s: %.100s", file, line, call, what);
  return SR_EBACKEND;
}
#define MPI_CHECK(c, call)                                                               \
  ({                                                                                     \
    int r_ = (call);                                                                     \
    r_ == MPI_SUCCESS ? 0                                                                \
                      : mpi_fail_at((c)->errmsg, sizeof(c)->errmsg, __FILE__, __LINE__, \
                                    #call, r_);                                          \
  })

int dense_mpi_init(char *err, size_t errlen) {
  int done = 0;
  MPI_Initialized(&done);
  if (done) return SR_OK;
  /* Idle ranks block in the kernel instead of polling: on a machine with
   * fewer cores than ranks a spinning waiter steals the core its peer
   * needs to finish the step everyone waits for. */
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  int rc = MPI_Init(NULL, NULL);
  if (rc != MPI_SUCCESS) {
    char what[MPI_MAX_ERROR_STRING];
    int wl = 0;
    if (MPI_Error_string(rc, what, &wl) != MPI_SUCCESS) snprintf(what, sizeof what, "error %d", rc);
    sr_fmt(err, errlen, "MPI_Init failed: %s", what);
    return SR_EBACKEND;
  }
  return SR_OK;
}

void dense_mpi_abort(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  fflush(stdout);
  fflush(stderr);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

void dense_mpi_finalize(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

/* Sizes fit MPI's int counts: checked by the callers below. */
static int too_big(dense_coll *c, size_t n, const char *what) {
  if (n <= (size_t)0x7fffffff) return 0;
  sr_fmt(c->errmsg, sizeof c->errmsg, "%s of %zu floats: more than MPI's int count", what, n);
  return 1;
}

/* Deterministic all-reduce (collective.h): reduce-scatter by Alltoallv,
 * rank-order sums, Allgatherv back. */
static int mpi_all_reduce(dense_coll *c, float *buf, size_t n) {
  mpi_coll *m = (mpi_coll *)c;
  int P = c->size, me = c->rank;
  if (P == 1) return SR_OK;
  if (too_big(c, n, "all-reduce")) return SR_EINVAL;
  size_t base = n / (size_t)P, extra = n % (size_t)P, at = 0;
  for (int j = 0; j < P; j++) {
    m->cnt[j] = (int)(base + ((size_t)j < extra));
    m->displ[j] = (int)at;
    at += (size_t)m->cnt[j];
  }
  size_t mine = (size_t)m->cnt[me];
  if ((size_t)P * mine > m->tmp_cap) {
    float *t = realloc(m->tmp, (size_t)P * mine * sizeof *t);
    if (!t) {
      sr_fmt(c->errmsg, sizeof c->errmsg, "all-reduce: out of memory for %zu floats",
             (size_t)P * mine);
      return SR_ENOMEM;
    }
    m->tmp = t;
    m->tmp_cap = (size_t)P * mine;
  }
  for (int j = 0; j < P; j++) {
    m->ones[j] = (int)mine;
    m->rdispl[j] = (int)((size_t)j * mine);
  }
  /* tmp[j][mine] = chunk `me` of rank j's buffer */
  if (MPI_CHECK(c, MPI_Alltoallv(buf, m->cnt, m->displ, MPI_FLOAT, m->tmp, m->ones, m->rdispl,
                                 MPI_FLOAT, m->comm)))
    return SR_EBACKEND;
  float *out = buf + m->displ[me];
  if (mine) { /* an empty chunk (n < size) leaves tmp possibly NULL: nothing to sum */
    memcpy(out, m->tmp, mine * sizeof *out);
    for (int j = 1; j < P; j++) {
      const float *x = m->tmp + (size_t)j * mine;
      for (size_t i = 0; i < mine; i++) out[i] += x[i];
    }
  }
  if (MPI_CHECK(c, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, m->cnt, m->displ,
                                  MPI_FLOAT, m->comm)))
    return SR_EBACKEND;
  return SR_OK;
}

static int mpi_broadcast(dense_coll *c, float *buf, size_t n, int root) {
  mpi_coll *m = (mpi_coll *)c;
  if (too_big(c, n, "broadcast")) return SR_EINVAL;
  return MPI_CHECK(c, MPI_Bcast(buf, (int)n, MPI_FLOAT, root, m->comm)) ? SR_EBACKEND : SR_OK;
}

static int mpi_barrier(dense_coll *c) {
  mpi_coll *m = (mpi_coll *)c;
  return MPI_CHECK(c, MPI_Barrier(m->comm)) ? SR_EBACKEND : SR_OK;
}

static int mpi_gather(dense_coll *c, const float *send, size_t n, float *recv,
                      const size_t *counts, int root) {
  mpi_coll *m = (mpi_coll *)c;
  if (too_big(c, n, "gather")) return SR_EINVAL;
  if (c->rank == root) {
    size_t at = 0;
    for (int r = 0; r < c->size; r++) {
      if (too_big(c, at + counts[r], "gather")) return SR_EINVAL;
      m->cnt[r] = (int)counts[r];
      m->displ[r] = (int)at;
      at += counts[r];
    }
  }
  /* MPI wants a non-NULL buffer even for 0 floats on some transports. */
  static float none;
  if (MPI_CHECK(c, MPI_Gatherv(n ? send : &none, (int)n, MPI_FLOAT, recv ? recv : &none, m->cnt,
                               m->displ, MPI_FLOAT, root, m->comm)))
    return SR_EBACKEND;
  return SR_OK;
}

/* Byte broadcast: MPI_Bcast on MPI_BYTE, in pieces of at most 1 GiB so that
 * no count passes INT_MAX. */
static int mpi_broadcast_bytes(dense_coll *c, void *buf, size_t n, int root) {
  mpi_coll *m = (mpi_coll *)c;
  const size_t piece = (size_t)1 << 30;
  for (size_t at = 0; at < n; at += piece) {
    size_t k = n - at < piece ? n - at : piece;
    if (MPI_CHECK(c, MPI_Bcast((char *)buf + at, (int)k, MPI_BYTE, root, m->comm)))
      return SR_EBACKEND;
  }
  return SR_OK;
}

/* Byte all-gather: MPI_Allgather on MPI_BYTE, MPI_IN_PLACE when send is this
 * rank's own block of recv. MPI's per-rank count is an int. */
static int mpi_allgather_bytes(dense_coll *c, const void *send, size_t n, void *recv) {
  mpi_coll *m = (mpi_coll *)c;
  if (n > (size_t)INT_MAX) {
    sr_fmt(c->errmsg, sizeof c->errmsg,
           "all-gather of %zu bytes per rank: more than MPI's int count", n);
    return SR_EINVAL;
  }
  int in_place = send == (const char *)recv + (size_t)c->rank * n;
  if (MPI_CHECK(c, MPI_Allgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : (int)n,
                                 in_place ? MPI_DATATYPE_NULL : MPI_BYTE, recv, (int)n,
                                 MPI_BYTE, m->comm)))
    return SR_EBACKEND;
  return SR_OK;
}

static void mpi_destroy(dense_coll *c) {
  mpi_coll *m = (mpi_coll *)c;
  int fin = 0;
  MPI_Finalized(&fin);
  if (m->comm != MPI_COMM_NULL && !fin) MPI_Comm_free(&m->comm);
  free(m->cnt);
  free(m->displ);
  free(m->ones);
  free(m->rdispl);
  free(m->tmp);
  free(m);
}

static const dense_coll_ops mpi_ops = {.name = "mpi",
                                       .all_reduce_sum = mpi_all_reduce,
                                       .broadcast = mpi_broadcast,
                                       .barrier = mpi_barrier,
                                       .gather = mpi_gather,
                                       .broadcast_bytes = mpi_broadcast_bytes,
                                       .allgather_bytes = mpi_allgather_bytes,
                                       .destroy = mpi_destroy};

dense_coll *dense_coll_mpi_create(char *err, size_t errlen) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    sr_fmt(err, errlen, "MPI collective: MPI is not initialised (dense_mpi_init first)");
    return NULL;
  }
  mpi_coll *m = calloc(1, sizeof *m);
  if (!m) {
    sr_fmt(err, errlen, "MPI collective: out of memory");
    return NULL;
  }
  dense_coll *c = &m->base;
  c->ops = &mpi_ops;
  m->comm = MPI_COMM_NULL;
  if (MPI_CHECK(c, MPI_Comm_dup(MPI_COMM_WORLD, &m->comm)) ||
      MPI_CHECK(c, MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN)) ||
      MPI_CHECK(c, MPI_Comm_rank(m->comm, &c->rank)) ||
      MPI_CHECK(c, MPI_Comm_size(m->comm, &c->size))) {
    sr_fmt(err, errlen, "MPI collective: %s", c->errmsg);
    mpi_destroy(c);
    return NULL;
  }
  size_t P = (size_t)c->size;
  m->cnt = calloc(P, sizeof *m->cnt);
  m->displ = calloc(P, sizeof *m->displ);
  m->ones = calloc(P, sizeof *m->ones);
  m->rdispl = calloc(P, sizeof *m->rdispl);
  if (!m->cnt || !m->displ || !m->ones || !m->rdispl) {
    sr_fmt(err, errlen, "MPI collective: out of memory");
    mpi_destroy(c);
    return NULL;
  }
  return c;
}

#else /* no MPI in this build */

int dense_mpi_init(char *err, size_t errlen) {
  sr_fmt(err, errlen, "this shardrec was built without MPI (no MPI found at configure time)");
  return SR_EUNSUPPORTED;
}

void dense_mpi_abort(int code) {
  fflush(stdout);
  fflush(stderr);
  exit(code);
}

void dense_mpi_finalize(void) {}

dense_coll *dense_coll_mpi_create(char *err, size_t errlen) {
  sr_fmt(err, errlen, "this shardrec was built without MPI (no MPI found at configure time)");
  return NULL;
}

#endif
