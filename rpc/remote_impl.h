/* The remote store's state and the calls between the files that make it
 * up, private to rpc/ (the public side is rpc/client.h):
 *   remote_call.c     the transport: channels and connections to each
 *                     server, calls in flight on a completion queue, their
 *                     deadlines, retries and backoff, which failures are
 *                     final, and the message of a failed call; the one-off
 *                     calls of rpc_call_once and rpc_call_path;
 *   remote_store.c    the store's operations (embedding/store.h): ids
 *                     grouped per server and cut into calls, Lookups and
 *                     Pushes built and their answers read, the broadcasts
 *                     (Checkpoint, Restore, Stats), the Watches, create and
 *                     destroy, the look-ahead slots. */
#ifndef SHARDREC_RPC_REMOTE_IMPL_H
#define SHARDREC_RPC_REMOTE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/grpc_util.h"

/* ---- remote_call.c: the transport ---- */

/* One gRPC channel to a server: with a subchannel pool of its own
 * (GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL), its own TCP connection. */
typedef struct {
  grpc_channel *ch;
  void *reg[RPC_N_METHODS];
} chan;

/* One server: its address, its channels and what its answers told. */
typedef struct {
  char *addr;
  chan *chs; /* [n_ch] */
  int n_ch;
  unsigned rr; /* the channel of the next call, round the n_ch */
  uint64_t inc; /* the server's incarnation as first seen (0: not yet) */
  /* The server's limits, from its Stats (0: not said: none but ours). */
  uint64_t max_ids, max_bytes, budget;
  int looks_ahead; /* its store reads ahead: prefetch_only hints are worth sending */
  int notes;       /* calls answered after a retry since rpc_remote_note last looked */
  char note[400];  /* the last of them */
} conn;

/* One table's ids in a call: L->gids[t][lo .. lo + n). */
typedef struct {
  int t;
  size_t lo, n;
} call_part;

/* One call to one shard, maybe tried several times. */
typedef struct {
  int shard;
  int chan;         /* the channel of its next attempt (of the shard's n_ch) */
  int hint;         /* a Lookup with prefetch_only: its answer is not used */
  rpc_method m;
  const char *path; /* not NULL: call this method path, unregistered */
  uint8_t *req; /* owned */
  size_t req_len;
  int tries;
  double retry_at;  /* monotonic seconds; 0: not waiting */
  double backoff;
  int trouble;      /* attempts that failed UNAVAILABLE or past their deadline */
  int refusals;     /* the last attempts in a row that were TLS refusals (tls_refusal) */
  double t_trouble; /* monotonic seconds of the first of them */
  grpc_status_code why_retry; /* the status of the last of them */
  int active;       /* a call is in flight */
  int no_deadline;  /* a Watch: held by the server for the job's life */
  int cancelled;    /* given up by this client: never tried again */
  int done;         /* finished: status below is final */
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array im, tm;
  grpc_status_code status;
  grpc_slice details;
  uint8_t *resp;    /* owned, when status OK */
  size_t resp_len;
  call_part *parts; /* owned: Lookup and Push, the tables' ids it carries, in order */
  int n_parts;
} pcall;

/* c's o->connections channels to addr (the first in gRPC's shared pool,
 * the others each in a pool of its own: a TCP connection each), their
 * methods registered. 0, or -1 with a message in err (c->n_ch says how
 * many were made, for the caller's clean-up). */
int rpc__conn_open(conn *c, const char *addr, const rpc_client_opts *o, char *err,
                   size_t errlen);
/* Shut cq down, drain it and destroy it. */
void rpc__cq_close(grpc_completion_queue *cq);
/* The defaults of o's fields left 0 (rpc/client.h). */
void rpc__opts_defaults(rpc_client_opts *o);
/* p set up for a call of method m to shard shard, with req[len] (owned by
 * p from now on); rpc__pcall_free lets it go. */
void rpc__pcall_init(pcall *p, int shard, rpc_method m, uint8_t *req, size_t len);
void rpc__pcall_free(pcall *p);
/* Start one attempt of p on conn c. 0, or -1 (p->done set with a status). */
int rpc__pcall_start(conn *c, grpc_completion_queue *cq, pcall *p, double deadline_s);
/* Drive calls[n] (already started or waiting to retry; each on
 * conns[shard]) to their end: retried after a backoff as o says, each
 * with a final status. */
void rpc__run_calls(conn *conns, grpc_completion_queue *cq, pcall *calls, int n,
                    const rpc_client_opts *o);
/* The message of p's failure (p a call to c; what: "lookup of step 7")
 * into err; returns an SR_E* code, and sets *lost when the failure means
 * the server's rows may no longer be the run's (rpc_remote_lost). */
int rpc__call_error(const conn *c, const rpc_client_opts *o, const pcall *p, const char *what,
                    char *err, size_t errlen, int *lost);

#endif
