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
 *                     destroy;
 *   remote_ahead.c    the look-ahead slots (emb_store_ops.prefetch), and
 *                     one rank's push joined with the next step's Lookups
 *                     (PushLookup);
 *   remote_remove.c   a bounded table's removed rows (emb_store_ops.remove);
 *   remote_recover.c  what a job asks of the store beyond embedding/store.h:
 *                     recovery from a lost server (rpc_remote_quiesce,
 *                     _rejoin, _incarnations, _lost), retries' notes, the
 *                     check of checkpoint folders against the servers' roots. */
#ifndef SHARDREC_RPC_REMOTE_IMPL_H
#define SHARDREC_RPC_REMOTE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/client.h"
#include "rpc/grpc_impl.h"

/* ---- remote_call.c: the transport ---- */

/* An exchange stream (rpc/shardrec.proto, "Exchange stream") of a
 * channel, on one completion queue (a lane's): one message in flight at a
 * time. */
typedef struct {
  grpc_completion_queue *cq;
  grpc_call *call; /* NULL: the slot is free */
  int busy;        /* a message is in flight */
  int cancelled;   /* cancelled by this client: dropped once its message is done */
} xs_slot;
#define RPC_XS_SLOTS 8 /* streams a channel keeps; a lane's further calls go as calls */

/* One gRPC channel to a server: with a subchannel pool of its own
 * (GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL), its own TCP connection. */
typedef struct {
  grpc_channel *ch;
  void *reg[RPC_N_METHODS];
  void *exchange;              /* the exchange stream's method */
  xs_slot xs[RPC_XS_SLOTS];
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
  int push_lookup; /* it takes PushLookup */
  int xs_push;     /* Pushes go on exchange streams (it takes them: a Push is
                      answered at once, applied or held for its step) */
  int xs_lookup;   /* Lookups and PushLookups too: the job has one rank (a
                      message never waits for other ranks, a Lookup of
                      several ranks may: it goes as a call) */
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
  uint8_t *req; /* owned: by p until the first attempt, then by req_sl */
  size_t req_len;
  grpc_slice req_sl; /* over req, which it frees: every attempt sends it without a copy */
  int req_owned;     /* 1: req is p's (no attempt yet); 0: req_sl's */
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
  uint8_t *resp;    /* owned, when status OK (not a Lookup: its answer is recv) */
  size_t resp_len;
  int scattered;    /* a Lookup: its rows are in the caller's array (lookup_collect) */
  chan *xs_ch;      /* the attempt in flight is a message on xs_ch's stream xs_at (else a call) */
  int xs_at;
  double xs_deadline; /* its deadline (sr_now seconds), kept by cancelling the stream */
  int xs_late;        /* it was cancelled at its deadline */
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
/* Cancel p's attempt in flight (its call, or its exchange stream). */
void rpc__pcall_cancel(pcall *p);
/* Close the exchange streams of conns[n] on cq (every one: NULL): before
 * cq or the channels go, and when the servers may be new processes (a
 * recovery, a Restore), whose connections the old streams are not on. One
 * with a message in flight is closed once that message is done. */
void rpc__xs_close(conn *conns, int n, grpc_completion_queue *cq);
/* Start one attempt of p on conn c. 0, or -1 (p->done set with a status). */
int rpc__pcall_start(conn *c, grpc_completion_queue *cq, pcall *p, double deadline_s);
/* Drive calls[n] (already started or waiting to retry; each on
 * conns[shard]) to their end: retried after a backoff as o says, each
 * with a final status. */
void rpc__run_calls(conn *conns, grpc_completion_queue *cq, pcall *calls, int n,
                    const rpc_client_opts *o);
/* rpc__run_calls, and each(ctx, p) for every call p as soon as it ends
 * (its status final), while the others are still in flight. A Lookup's
 * answer (p->m RPC_LOOKUP, p->path NULL) stays in p->recv, not copied to
 * p->resp: rpc__answer_incarnation and rpc__answer_scatter read it. */
void rpc__run_calls_each(conn *conns, grpc_completion_queue *cq, pcall *calls, int n,
                         const rpc_client_opts *o, void (*each)(void *ctx, pcall *p),
                         void *ctx);
/* The message of p's failure (p a call to c; what: "lookup of step 7")
 * into err; returns an SR_E* code, and sets *lost when the failure means
 * the server's rows may no longer be the run's (rpc_remote_lost). */
int rpc__call_error(const conn *c, const rpc_client_opts *o, const pcall *p, const char *what,
                    char *err, size_t errlen, int *lost);

/* ---- answer.c: answers read in place ---- */

/* The incarnation of the LookupResponse bb (as received: any slices,
 * maybe compressed), read without a copy. 0, or -1 when bb is not one. */
int rpc__answer_incarnation(grpc_byte_buffer *bb, uint64_t *inc);
/* The rows of the LookupResponse bb of a call carrying parts[n_parts]
 * copied from the slices they arrived in into out: the j-th TableRows is
 * parts[j]'s, its row r going to out[t] + perm[t][lo + r] * dim (one copy
 * a row): as floats, or with rows16 an fp16 or bf16 table's rows in their
 * own bits (uint16_t values; emb_store_lookup_begin_rows16). 0; -1 when
 * bb is not a LookupResponse; -2 when a table's answer is missing or not
 * the part's table and length, its plan index in *bad_table. */
int rpc__answer_scatter(grpc_byte_buffer *bb, const emb_plan *plan, const call_part *parts,
                        int n_parts, size_t *const *perm, void *const *out, int rows16,
                        int *bad_table);
/* The head (rpc/shardrec.proto, "Exchange stream") of an exchange
 * stream's answer bb: its status into *st, its message into *msg (a
 * slice of the answer's) and the answer after it as a byte buffer of its
 * own, a Lookup's rows still in gRPC's slices (read in place, above): the
 * first slice is cut when it holds the head and message (it nearly always
 * does), else the whole is joined once. NULL when the answer is too short
 * for its head and message (or compressed, or no memory). */
grpc_byte_buffer *rpc__exchange_answer(grpc_byte_buffer *bb, uint32_t *st, grpc_slice *msg);

/* ---- remote_store.c: the store ---- */

/* One stream of calls: its own completion queue, calls and grouping of
 * ids. The store has two, so that a Lookup of step t+1 (prefetch) stays in
 * flight, with its grouping intact, while the push of step t runs: in sync
 * mode (and async with bound 1) the servers hold that Lookup until this
 * push is in, so the push must not wait for it. */
typedef struct {
  grpc_completion_queue *cq;
  pcall *calls; /* [cap_calls] */
  int n_calls, cap_calls;
  /* Grouping of this lane's last request, per table: ids grouped by shard
   * and their positions in the caller's list; off[t*(n+1)+k] ..
   * off[t*(n+1)+k+1]. */
  uint64_t **gids;
  size_t **perm;
  size_t *off;
  size_t *cap;
  uint16_t *shard_of; /* [shard_cap]: while grouping a table, each id's shard index */
  size_t shard_cap;
  size_t *fill;       /* [n_servers]: while grouping, each shard's next place */
  int hint; /* the Lookups built now are prefetch_only hints */
} lane;

/* Look-ahead (emb_store_ops.prefetch): a later step's ids, copied, and the
 * calls of its own lane: first the prefetch_only hints (sent at once: the
 * servers' stores read those rows ahead), then the step's Lookups, sent as
 * soon as their answers cannot be stale (pf_may_send), whose answers wait
 * in the lane until that step's lookup_begin takes them. */
#define RPC_PF_STEPS 4 /* steps prefetched at once; more are ignored */
typedef struct {
  int used, sent;  /* holds a step; its Lookups are out */
  int64_t step;
  double t_sent;   /* when its Lookups were begun (sr_now) */
  uint64_t **ids;  /* [n_tables][cap[t]]: the step's ids, counts[t] each (owned) */
  size_t *counts, *cap;
  lane L;
} pf_slot;

/* The remote store: an emb_store (base, first) over n shard servers. */
typedef struct {
  emb_store base;
  conn *c;      /* [n] one per shard */
  int n;
  rpc_client_opts o;
  char job[64];
  char fp[EMB_FP_HEX];
  char err[1024];
  int lost; /* a server was unreachable or restarted: its rows may not be this run's */
  int limits_known; /* every conn's limits read from its Stats */
  lane lk;  /* the lookup in flight */
  lane mn;  /* push, checkpoint, restore, stats */
  /* Multi-rank: one Watch per server, held open until destroy detaches
   * (rpc/shardrec.proto, "Rank death"); their completions wait on wcq until then. */
  grpc_completion_queue *wcq;
  pcall *watch; /* [n_watch] */
  int n_watch;
  int lookup_rc;
  int lookup_pending;
  int64_t lookup_step;
  float *const *lookup_out;
  int lookup_rows16;    /* lookup_out takes 16-bit tables' rows as they are */
  double lookup_t0;     /* when the outstanding lookup's requests were begun (sr_now) */
  double lookup_flight; /* the last lookup's seconds in flight (emb_store_lookup_flight) */
  lane *cur;        /* the lane of the lookup outstanding: &lk or a slot's */
  pf_slot *cur_pf;  /* that slot (NULL: lk) */
  pf_slot pf[RPC_PF_STEPS];
  /* The push sent by push_begin, awaited by push_wait: its step, its rows
   * and the look-ahead slot whose Lookups it joined (NULL: none). */
  int push_out;
  int64_t push_step;
  uint64_t push_rows;
  pf_slot *push_f;
  int64_t pushed;   /* the last step pushed (answered OK); -1: none */
  int64_t seen;     /* the highest step looked up, pushed or prefetched; -1: none */
  int keeps;        /* the plan bounds tables: rows go at step boundaries (remove) */
  int64_t removed;  /* the last step whose boundary's removal is done; -1: none */
  emb_store_stats st;
} rstore;

/* The store's emb_store_ops: a store is remote when its ops are these. */
extern const emb_store_ops rpc__remote_ops;

/* L (zeroed) made ready: its completion queue, room for n_servers calls
 * and the grouping of n_tables tables. 0 or SR_ENOMEM (rpc__lane_free
 * frees what was made). */
int rpc__lane_init(lane *L, int n_tables, int n_servers);
/* Everything L owns freed: its calls, its queue (shut down and drained),
 * its grouping. */
void rpc__lane_free(lane *L, int n_tables);
/* Every call of L freed (L keeps its room for more). */
void rpc__calls_free(lane *L);
/* Build the requests of ids for every shard into L (lookup: grads NULL),
 * each cut to fit its server's limits. 0 or an SR_E* code (s->err). */
int rpc__build_calls(rstore *s, lane *L, rpc_method m, int64_t step, float lr,
                     const emb_idset *ids, const emb_grad *const *grads);
/* Build and start L's Lookups of ids for step. 0 or an SR_E* code. */
int rpc__lookup_start(rstore *s, lane *L, int64_t step, const emb_idset *ids);
/* Every server's limits, from its Stats (once, and again after a Restore). */
int rpc__fetch_limits(rstore *s);
/* The same request to every server (make builds server k's; each, when
 * not NULL, reads each answer), waited for. 0 or the first failure's code. */
int rpc__broadcast(rstore *s, rpc_method m, uint8_t *(*make)(rstore *, int, size_t *, void *),
                   void *ctx, const char *what, int (*each)(rstore *, pcall *, void *));
/* A StatsRequest (rpc__broadcast's make). */
uint8_t *rpc__make_stats(rstore *s, int k, size_t *len, void *ctx);
/* Multi-rank: start a Watch on every server; detach and end them. */
int rpc__watch_start(rstore *s);
void rpc__watch_stop(rstore *s);

/* check_inc and header_fill of remote_store.c: shard k's answer's
 * incarnation checked against the first seen (a restart: s->lost, s->err);
 * a request header of this store's job at step. */
int rpc__check_inc(rstore *s, int k, uint64_t inc, const char *what);
struct Shardrec__V1__RequestHeader;
void rpc__header_fill(rstore *s, struct Shardrec__V1__RequestHeader *h, int64_t step);

/* ---- remote_remove.c: removed rows ---- */

/* emb_store_ops.remove: each server's ids in Remove calls (cut to its
 * limits), waited for; then the step's boundary is passed: the look-ahead
 * Lookups of later steps may go (a plan that bounds tables holds them until
 * then, so that none reads a row removed at this boundary). Called at
 * every boundary of such a plan, with no ids where none go. A rank other
 * than 0 of a multi-rank job sends nothing (rank 0 removes the job's rows;
 * the job calls it there once rank 0's removal is answered). */
int rpc__remote_remove(emb_store *b, int64_t step, const emb_idset *ids);

/* ---- remote_ahead.c: the look-ahead ---- */

/* emb_store_ops.prefetch. */
int rpc__remote_prefetch(emb_store *b, int64_t step, const emb_idset *ids);
/* The slot's copy of its step's ids, as an id set. */
emb_idset rpc__slot_ids(const rstore *s, const pf_slot *f);
/* Whether slot f holds exactly ids. */
int rpc__slot_same_ids(const rstore *s, const pf_slot *f, const emb_idset *ids);
/* Let slot f go (its calls waited for, their answers dropped). */
void rpc__slot_release(rstore *s, pf_slot *f);
/* Release the slots of steps before step, but the one the outstanding
 * lookup reads. */
void rpc__slots_drop_before(rstore *s, int64_t step);
/* Send slot f's Lookups. 0, or a code (the slot is then released). */
int rpc__slot_send(rstore *s, pf_slot *f);
/* After a push answered: send the slots whose Lookups may go now. */
void rpc__slots_send_ready(rstore *s);
/* One rank's push of step carries the Lookups of step + 1 when they wait
 * for it in a slot (prefetched, not sent: pf_may_send holds them until
 * this push is answered) and every server takes it (Stats push_lookup):
 * each server then gets one PushLookup, answered with those rows once the
 * push is applied, instead of a Push and, once that is answered, a Lookup.
 * Called with the push's calls built in s->mn, not started: those joined
 * leave s->mn. The slot, its calls started, or NULL (nothing joined). */
pf_slot *rpc__slot_join(rstore *s, int64_t step);
/* Wait for slot f's calls (rpc__slot_join's) and read their pushes'
 * answers: 0, or the first failure's code (what: "push of step 7"; the
 * slot released). A Lookup refused after its push was taken leaves the
 * push done and the slot released: the step's lookup reads afresh. */
int rpc__slot_joined_wait(rstore *s, pf_slot *f, const char *what);

#endif
