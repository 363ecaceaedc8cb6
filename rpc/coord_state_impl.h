/* The step coordinator's state (internal to rpc/coord.c and
 * rpc/coord_parts.c, the collection of pushes sent in parts): its jobs,
 * held pushes, parked calls and parts, and the functions the two files
 * share. */
#ifndef SHARDREC_RPC_COORD_STATE_IMPL_H
#define SHARDREC_RPC_COORD_STATE_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/coord_impl.h"

#define WHY_LEN 480

/* A single-rank job's (job, rank) entry, for Push idempotency and its mode. */
typedef struct {
  char job[RPC_COORD_JOB_MAX];
  int rank;
  int64_t last_step; /* highest step applied for (job, rank); -1: none yet */
  int stale;         /* max_staleness of its first call */
  uint64_t used;     /* recency, for replacement */
} solo_job;

/* A rank's push of a sync step, held until every rank's is in: one block
 * holding this struct, then counts, ids and grads per table, then the ids
 * and the gradients themselves. */
typedef struct {
  float lr;
  size_t *counts;  /* [n_tables] */
  uint64_t **ids;  /* [n_tables] -> [counts[t]] */
  float **grads;   /* [n_tables] -> [counts[t] * dims[t]] */
} held_push;

/* A multi-rank job (world > 1), known from its first call, which fixes its
 * world size and mode. Sync (stale 0): step t's pushes are collected from
 * every rank and applied together, summed in rank order; Lookups for step
 * t+1 wait (parked) until step t is applied. Async (stale S >= 1): pushes
 * are applied on arrival; a Lookup of step t waits until every rank's push
 * of step t-S is in. */
typedef struct {
  char job[RPC_COORD_JOB_MAX];
  int world;
  int stale;        /* 0: sync; S >= 1: async with bound S */
  int64_t applied;  /* sync: last step applied */
  held_push **have; /* sync: [a * world + rank]: rank's push of step applied+1+a (NULL: not in) */
  int64_t *done;    /* async: [world] last step each rank pushed (first step - 1: none yet) */
  uint8_t *gone;    /* [world] 1: the rank detached (finished); its Watch ending means nothing */
  int started;      /* a Lookup or Push came: the first step (applied, done) is fixed */
  uint64_t used;
  double progress;  /* now of the last push taken (or of the first call) */
  int aborted;      /* its pending state was dropped: every further call is refused */
  char why[WHY_LEN];
} multi_job;

/* A Lookup waiting for its job's previous step (sync) or for the slowest
 * rank (async), or a rank's Watch. */
typedef struct {
  void *token;
  uint8_t *in;
  size_t len;
  char job[RPC_COORD_JOB_MAX];
  int64_t step;
  int rank, world, stale; /* as the call said */
  double deadline;
  int abort;    /* answer ABORTED with why: its job's pending state was dropped */
  int watch;    /* a Watch (not a Lookup): answered OK once released */
  int released; /* Watch: its rank detached */
  char why[WHY_LEN];
} parked_call;

/* A push split into parts, being collected (rpc_coord_push). */
typedef struct {
  char job[RPC_COORD_JOB_MAX];
  int rank;
  int64_t step;
  int parts, got;
  held_push **piece; /* [parts] */
  double at;         /* now of its last part taken */
} partial_push;

struct rpc_coord {
  int n_tables;
  int *dims; /* [n_tables] */
  rpc_coord_apply_fn apply;
  void *apply_ctx;
  double pending_timeout; /* seconds */
  solo_job solo[RPC_COORD_MAX_JOBS];
  int n_solo;
  uint64_t clock;
  multi_job *jobs; /* [n_jobs] */
  int n_jobs, cap_jobs;
  parked_call *parked; /* [n_parked] */
  int n_parked, cap_parked;
  int stopping;               /* no more parking; parked calls are handed back STOPPING */
  atomic_int parked_hint;     /* n_parked, readable without the caller's lock */
  atomic_int jobs_hint;       /* n_jobs, readable without the caller's lock */
  atomic_llong next_sweep_us; /* now (in microseconds) of the next timeout sweep */
  partial_push *partial; /* [n_partial], room for cap_partial (at most RPC_COORD_PARTIALS) */
  int n_partial, cap_partial;
  uint64_t dropped_steps;     /* steps whose held pushes were dropped */
  uint64_t dropped_jobs;      /* jobs aborted (rank death, timeout) */
};

/* A copy of p in one block (held_push); NULL when out of memory. */
held_push *rpc__coord_held_copy(const rpc_coord *c, const rpc_coord_grads *p);
/* Whether (job, step, rank) of k was taken already (a retry). */
int rpc__coord_push_taken(rpc_coord *c, const rpc_coord_call *k);
/* A whole push (k->parts 0 or 1): rpc_coord_push. */
rpc_coord_outcome rpc__coord_push_whole(rpc_coord *c, const rpc_coord_call *k,
                                        const rpc_coord_grads *p, double now, char *msg,
                                        size_t msglen);
/* Part k->part of a split push: held until all are in, then the push. */
rpc_coord_outcome rpc__coord_push_part(rpc_coord *c, const rpc_coord_call *k,
                                       const rpc_coord_grads *p, double now, char *msg,
                                       size_t msglen);
/* Drop the parts held for job (NULL: every job). */
void rpc__coord_parts_drop(rpc_coord *c, const char *job);

#endif
