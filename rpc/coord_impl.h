/* The step coordinator of the shard service's multi-rank jobs (internal to
 * rpc/): the rules of rpc/shardrec.proto, "Multi-rank jobs" and "Rank death",
 * with no protobuf or gRPC in it. It knows jobs, ranks and steps, holds the
 * pushes of incomplete sync steps (its own copy of their ids and
 * gradients) and the parked Lookups and Watches (an opaque token and a copy
 * of the request's bytes), decides when a step is applied (summed in rank
 * order, through the apply callback), when a call waits and when a job's
 * pending state is dropped, and says so with an rpc_coord_outcome. The
 * caller (rpc/service.c) decodes and validates a request first, maps the
 * outcome to a gRPC status and encodes the answer.
 *
 * Not thread-safe: the caller serialises every call (the service's lock),
 * except rpc_coord_idle. Time is the caller's: every call that needs it
 * takes now, seconds on a monotonic clock (the service passes sr_now(); a
 * test drives the clock itself). */
#ifndef SHARDREC_RPC_COORD_IMPL_H
#define SHARDREC_RPC_COORD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/store.h"
#include "rpc/service.h" /* rpc_coord_stats */

#define RPC_COORD_JOB_MAX 128  /* bytes of a job id, its NUL included */
/* Multi-rank jobs remembered (the least recently used one holding no
 * pending state forgotten for a new one), and single-rank (job, rank)
 * pairs (the least recently used forgotten). */
#define RPC_COORD_MAX_JOBS 256
#define RPC_COORD_AHEAD 4      /* steps of pushes a sync job may collect at once */
#define RPC_COORD_MSG 512      /* bytes of an outcome's message */
#define RPC_COORD_MAX_PARTS 4096 /* parts one push may be split into */
/* Pushes whose parts are being collected at once: one per rank of the
 * largest job the service takes (1024 ranks) for each of the RPC_COORD_AHEAD
 * steps a sync job collects. */
#define RPC_COORD_PARTIALS 4096

/* What became of a call. The service answers each with one gRPC status
 * (in brackets). */
typedef enum rpc_coord_outcome {
  RPC_COORD_GO = 0,  /* Lookup: serve it now (a woken one too); Push: taken (applied, or
                        held for its step); Watch: answer it now [OK] */
  RPC_COORD_RETRY,   /* Push: a retry of a push already taken; nothing changed [OK,
                        applied = false] */
  RPC_COORD_PARKED,  /* held: rpc_coord_take_woken hands it back later [RPC_PARKED] */
  RPC_COORD_WAIT,    /* would wait but cannot park (no token, stopping, out of memory)
                        [UNAVAILABLE] */
  RPC_COORD_REFUSED, /* world size or mode other than the job's, or a push too many steps
                        ahead [FAILED_PRECONDITION] */
  RPC_COORD_ABORTED, /* the job's pending state was dropped (the message says why) [ABORTED] */
  RPC_COORD_NOMEM,   /* [RESOURCE_EXHAUSTED] */
  RPC_COORD_FAILED,  /* the apply callback failed [INTERNAL] */
  RPC_COORD_INVALID, /* the apply callback refused the update (SR_ERANGE: a learning rate out
                        of range or a row that would turn non-finite), nothing applied
                        [INVALID_ARGUMENT] */
  RPC_COORD_BUSY,    /* nothing changed, to be sent again later: a Push's part of a push not
                        yet begun while the parts of RPC_COORD_PARTIALS others are being
                        collected; a call of a multi-rank job not yet known while
                        RPC_COORD_MAX_JOBS are, each holding pending state [UNAVAILABLE] */
  /* Outcomes of a parked call only (take_woken): */
  RPC_COORD_RELEASED,  /* Watch: its rank detached [OK] */
  RPC_COORD_TIMED_OUT, /* its timeout passed; nothing changed [DEADLINE_EXCEEDED] */
  RPC_COORD_STOPPING,  /* the service stopped parking [UNAVAILABLE] */
} rpc_coord_outcome;

/* The job, step and rank a Lookup, Push or Watch says it belongs to
 * (RequestHeader), already validated: job shorter than RPC_COORD_JOB_MAX,
 * 0 <= rank < world, step >= 0, stale >= 0. */
typedef struct rpc_coord_call {
  const char *job; /* borrowed for the call */
  int64_t step;
  int rank, world;
  int stale;       /* max_staleness: 0 sync, S >= 1 async with bound S */
  int part, parts; /* Push: part of parts (0 <= part < parts <= RPC_COORD_MAX_PARTS) of
                      (job, step, rank); parts 0 or 1: the whole push */
} rpc_coord_call;

/* Apply one step's row gradients (emb_store_push's arguments): 0, or a
 * negative SR_E* code with the reason in err. SR_ERANGE: the update was
 * refused whole (a learning rate out of range, or a row or optimizer state
 * it would leave non-finite) and nothing of it was applied. */
typedef int (*rpc_coord_apply_fn)(void *ctx, int64_t step, float lr, const emb_idset *set,
                                  const emb_grad *const *grads, char *err, size_t errlen);

typedef struct rpc_coord_opts {
  int n_tables;             /* the plan's */
  const int *dims;          /* [n_tables] row widths (copied) */
  double pending_timeout_s; /* a job whose pending state makes no progress this long is
                               dropped (<= 0: 300) */
  rpc_coord_apply_fn apply; /* called with apply_ctx for every push applied */
  void *apply_ctx;
} rpc_coord_opts;

/* A push's rows, per plan table: set->ids[t][counts[t]] unique ids and
 * grads[t] their counts[t] * dims[t] gradients. Borrowed for the call (a
 * held push is copied). */
typedef struct rpc_coord_grads {
  float lr;
  const emb_idset *set;
  const emb_grad *const *grads;
} rpc_coord_grads;

/* A parked call handed back by rpc_coord_take_woken. */
typedef struct rpc_coord_woken {
  void *token;
  rpc_coord_outcome what; /* GO (a Lookup to serve now), RELEASED, TIMED_OUT, STOPPING or
                             ABORTED */
  int watch;              /* a Watch (else a Lookup) */
  uint8_t *in;            /* the request's bytes as parked: malloc'd, the caller frees */
  size_t len;
  char msg[RPC_COORD_MSG]; /* the answer's message for TIMED_OUT, STOPPING and ABORTED */
} rpc_coord_woken;


typedef struct rpc_coord rpc_coord;

/* A coordinator with no job. NULL when out of memory or o is unusable. */
rpc_coord *rpc_coord_create(const rpc_coord_opts *o);
/* Frees every held push and parked request (their tokens are the caller's).
 * NULL-safe. */
void rpc_coord_destroy(rpc_coord *c);

/* A Lookup of call k whose request bytes are in[len]. world 1: GO unless
 * the job's mode differs (REFUSED). world > 1: enters the job (created at
 * its first call; REFUSED, ABORTED or NOMEM, or BUSY when RPC_COORD_MAX_JOBS
 * are known and each holds pending state: forgetting one would drop pushes
 * answered taken or serve a parked Lookup early), then GO when its step may be
 * served, else PARKED (with a non-NULL token and not stopping: a copy of
 * in[len] is kept, handed back by take_woken once served, timed out after
 * timeout_s, dropped or stopping) or WAIT. msg[msglen] says why for every
 * outcome but GO and PARKED. */
rpc_coord_outcome rpc_coord_lookup(rpc_coord *c, const rpc_coord_call *k, void *token,
                                   const uint8_t *in, size_t len, double timeout_s, double now,
                                   char *msg, size_t msglen);

/* A Push of call k. world 1 and async: applied now through the apply
 * callback (GO; INVALID when it refuses the update with SR_ERANGE, FAILED
 * when it fails otherwise, nothing recorded). Sync (world > 1): held (a
 * copy) until every rank's push of its step is in; then each complete step
 * is applied in order, a row's gradients summed over the ranks in rank
 * order, the optimizer run once with rank 0's lr (FAILED when that fails:
 * the step is gone). When the apply refuses the summed update (SR_ERANGE: a
 * row it would leave non-finite) the step is dropped, nothing of it
 * applied, and the job is aborted as for a dead rank: ABORTED, msg naming
 * the cause (the table and row), and every later call of the job is
 * refused ABORTED with it. RETRY when (job, step, rank) was taken
 * before; REFUSED, ABORTED, NOMEM, BUSY as for a Lookup, REFUSED also for a step
 * RPC_COORD_AHEAD or more past the last applied. msg as for a Lookup.
 *
 * A push split into parts (k->parts > 1, a client fitting the server's
 * message limits): each part is copied and held (GO, taken) until every
 * part of (job, step, rank) is in; then they are taken together as the one
 * push above, whose outcome the last part gets, so a split push is applied
 * whole or not at all too. A part taken before, or of a push taken before,
 * is a RETRY; a row in two parts is INVALID (nothing applied). Parts of at
 * most RPC_COORD_PARTIALS pushes are held at once: a part taken is never
 * dropped for another push's, so a part that would begin one more push is
 * BUSY (nothing changed; the client sends it again after a backoff), unless
 * a push got no part for the pending timeout (its sender went away): that
 * one's parts are dropped to make room. A Restore or the job's abort drops
 * them too. */
rpc_coord_outcome rpc_coord_push(rpc_coord *c, const rpc_coord_call *k, const rpc_coord_grads *p,
                                 double now, char *msg, size_t msglen);

/* A whole Push of a single-rank job (k->world <= 1, k->parts <= 1) taken
 * without its update, which the caller makes at once through its own
 * apply (the service, right after answering): GO (taken: a retry of (job,
 * step, rank) is RETRY from now on), RETRY, or REFUSED as rpc_coord_push. */
rpc_coord_outcome rpc_coord_push_take(rpc_coord *c, const rpc_coord_call *k, char *msg,
                                      size_t msglen);

/* A Watch of call k (k->step is not used). world 1: GO. world > 1: enters
 * the job without fixing its first step; detach: marks the rank finished,
 * releases its parked Watch, GO. Else GO when the rank already detached,
 * PARKED (as for a Lookup: in[len] kept) or WAIT. */
rpc_coord_outcome rpc_coord_watch(rpc_coord *c, const rpc_coord_call *k, int detach, void *token,
                                  const uint8_t *in, size_t len, double timeout_s, double now,
                                  char *msg, size_t msglen);

/* Parked calls that can be answered at now, at most max, into out; their
 * count. First drops the pending state of jobs with no progress for the
 * pending timeout (at most every min(timeout / 4, 1 s)). */
int rpc_coord_take_woken(rpc_coord *c, double now, rpc_coord_woken *out, int max);

/* 1 when take_woken at now would certainly hand back nothing (no call
 * parked, no sweep due); reads atomics only: callable without the caller's
 * lock. */
int rpc_coord_idle(const rpc_coord *c, double now);

/* The call parked with token was cancelled by its client (its rank went
 * away): forgets it and drops its job's pending state (not while stopping,
 * nor for a rank that detached, nor for a Lookup whose rank still holds a
 * Watch parked here: that rank lives, and its process ending cancels the
 * Watch). 0 when token was not parked; else 1 for a Lookup, 2 for a Watch,
 * and its request's bytes in *in_len (NULL: not wanted). */
int rpc_coord_cancel(rpc_coord *c, void *token, double now, size_t *in_len);

/* Restore: drops every job's pending state, marks every parked Lookup to be
 * answered ABORTED and forgets every job (single-rank ones too); parked
 * Watches stay. */
void rpc_coord_restore(rpc_coord *c);

/* From now on nothing parks; parked calls are handed back STOPPING. */
void rpc_coord_stop_parking(rpc_coord *c);

void rpc_coord_stats_get(const rpc_coord *c, rpc_coord_stats *st);

#endif
