/* The gRPC shard service (rpc/shardrec.proto): the request handlers, the
 * C-core server loop and the remote embedding store.
 *
 * Three layers, each usable alone:
 *   rpc_service  decodes a request's bytes, validates every field against the
 *                plan and the shards served, runs it on an embedding store and
 *                encodes the answer. No gRPC in it: the fuzz target and the
 *                server call the same function.
 *   rpc_server   the gRPC C-core loop around an rpc_service: one completion
 *                queue per worker thread, registered methods, a generic
 *                request so unknown methods get UNIMPLEMENTED.
 *   remote store emb_store over shard servers (embedding/store.h).
 * All gRPC calls of shardrec live in rpc/. */
#ifndef SHARDREC_RPC_RPC_H
#define SHARDREC_RPC_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/store.h"

/* Methods, by index; rpc_method_path gives "/shardrec.v1.EmbeddingShard/Lookup". */
typedef enum {
  RPC_LOOKUP = 0,
  RPC_PUSH,
  RPC_CHECKPOINT,
  RPC_RESTORE,
  RPC_STATS,
  RPC_HEALTH_CHECK,
  RPC_WATCH, /* "/shardrec.v1.EmbeddingShard/Watch": a rank's presence (Rank death) */
  RPC_N_METHODS
} rpc_method;

const char *rpc_method_path(rpc_method m);

/* gRPC status codes used here (values of grpc_status_code). */
enum {
  RPC_OK = 0,
  RPC_CANCELLED = 1,
  RPC_INVALID_ARGUMENT = 3,
  RPC_DEADLINE_EXCEEDED = 4,
  RPC_NOT_FOUND = 5,
  RPC_RESOURCE_EXHAUSTED = 8,
  RPC_FAILED_PRECONDITION = 9,
  RPC_ABORTED = 10,
  RPC_UNIMPLEMENTED = 12,
  RPC_INTERNAL = 13,
  RPC_UNAVAILABLE = 14,
};

/* ---- service ---- */

typedef struct rpc_service rpc_service;

typedef struct rpc_service_opts {
  const int *shards;   /* [n_shards] shards of the plan served here */
  int n_shards;
  int read_only;       /* refuse Push with FAILED_PRECONDITION */
  size_t max_ids;      /* most ids one Lookup or Push may carry (0: 1<<22) */
  int store_shard_dirs; /* the store's checkpoint(path) itself writes path/shard-K
                           (the RocksDB shard store); 0: the service passes it
                           path/shard-K (the in-memory local store) */
  double pending_timeout_s; /* a multi-rank job whose pending state (held pushes,
                               parked Lookups, ranks at different steps) makes no
                               progress this long is dropped as if a rank went
                               away (0: 300 s); see "Rank death" below */
} rpc_service_opts;

/* A service over plan (borrowed) and store (borrowed; holds the plan's rows,
 * of which only the served shards' are ever touched). Thread-safe: calls are
 * serialised by an internal lock. NULL with a message in err on failure. */
rpc_service *rpc_service_create(const emb_plan *plan, emb_store *store,
                                const rpc_service_opts *o, char *err, size_t errlen);
void rpc_service_destroy(rpc_service *s); /* NULL-safe */

/* The answer to one call. out is malloc'd (caller frees) when status is
 * RPC_OK; msg holds the error text otherwise. */
typedef struct rpc_reply {
  int status;
  char msg[512];
  uint8_t *out;
  size_t out_len;
} rpc_reply;

/* Handle one request of method m from its serialised bytes in[len] (any
 * bytes: garbage is answered with INVALID_ARGUMENT). A refused request
 * changes nothing. */
void rpc_service_handle(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                        rpc_reply *r);

/* Multi-rank jobs (header.world_size > 1). A job (header.job_id) is known
 * from its first call (Watch, Lookup or Push), which fixes its world size
 * and its mode (header.max_staleness); its first Lookup or Push fixes its
 * first step (that call's step: each rank's first call after its Watch is
 * its Lookup or Push of the job's first step, as the trainer's are). A
 * later call that says another world size or mode is refused
 * FAILED_PRECONDITION naming both. Single-rank jobs keep their mode too (a call with another is
 * refused) and otherwise behave the same in both modes: a Push is applied
 * on arrival, a Lookup never waits.
 *
 * Sync mode (max_staleness 0): a shard applies step t's pushes once every
 * rank's is in (Push answers at once; applied = taken), summing a row's
 * gradients over the ranks in rank order before the optimizer runs once,
 * and holds a Lookup of step t+1 until then. At most 4 steps are collected
 * at once.
 *
 * Async mode (max_staleness S >= 1): a Push is applied on arrival, in
 * arrival order (not bit-reproducible across runs); a Lookup of step t is
 * held until every rank's push of step t-S (and so of every step before) is
 * applied; one with t-S before the job's first step never waits. S = 1 holds
 * Lookups as sync mode does. A rank may have a Lookup of step t+1
 * outstanding while it pushes step t (prefetch), in both modes.
 *
 * Both: Push is idempotent on (job, step, rank): a retry answers applied =
 * false and changes nothing. Every rank pushes to every shard every step (an
 * empty push where it has nothing). A held Lookup is parked:
 * rpc_service_handle_call answers r->status RPC_PARKED, keeps a copy of the
 * request and token, and rpc_service_take_woken later hands back (token,
 * answer) once it may be served, the call's timeout passed
 * (DEADLINE_EXCEEDED, nothing changed), its job's pending state was dropped
 * (ABORTED) or the service stops parking (UNAVAILABLE).
 * rpc_service_handle (no token) answers UNAVAILABLE instead of parking.
 *
 * Rank death. A job's pending state (sync: the held pushes of incomplete
 * steps; both: its parked Lookups) is dropped, never half-applied, when
 *   - a parked Watch or Lookup of the job is cancelled by its client before
 *     its deadline (rpc_service_cancel: the rank's process went away; a
 *     rank must not otherwise abandon a parked Lookup). Every rank of a
 *     multi-rank job holds a Watch (shardrec.proto) open on every server
 *     while it runs, so a rank that dies anywhere (computing, or blocked
 *     in a collective with nothing in flight to the servers) is heard at
 *     once; a rank that finishes detaches first (Watch with detach = true),
 *     after which its Watch ending means nothing. Watches are parked like
 *     Lookups (RPC_PARKED, take_woken) and answered OK on detach;
 *   - the job makes no progress (no push taken) for pending_timeout_s while
 *     it has held pushes, parked Lookups or (async) ranks at different steps,
 *   - or the server is restored (Restore drops every job's pending state,
 *     answers every parked Lookup ABORTED and forgets every job: steps start
 *     over from the checkpoint's; parked Watches stay, the ranks are still
 *     there).
 * The job's parked Lookups are answered ABORTED with a message naming the
 * cause and where the job stood ("job J: rank R went away (its Lookup of
 * step L was cancelled) during step T, which waited for rank(s) 1; the
 * step's held pushes were dropped (nothing of it was applied)"), and every
 * later call of that job id is refused ABORTED with the same message (after
 * a Restore the job id is forgotten instead). Steps already applied stay
 * applied; a new job id (a resumed run) starts afresh. Stats reports
 * pending_pushes, dropped_steps, jobs and dropped_jobs. Which of a dying
 * rank's peers' pushes of the step were already held when its death was
 * heard is a race (a peer's push that comes after is refused ABORTED), so
 * dropped_steps may be 0 or 1 for the same death; dropped_jobs is 1. */
#define RPC_PARKED (-1)
void rpc_service_handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                             void *token, double timeout_s, rpc_reply *r);
typedef struct rpc_woken {
  void *token;
  rpc_reply r;
} rpc_woken;
/* Parked calls that can be answered now, up to max; their count. Cheap when
 * none is parked. Thread-safe. */
int rpc_service_take_woken(rpc_service *s, rpc_woken *out, int max);
/* From now on nothing parks; parked calls are woken with UNAVAILABLE. */
void rpc_service_stop_parking(rpc_service *s);
/* The client of the call parked with token cancelled it (in gRPC core,
 * RECV_CLOSE_ON_SERVER reported cancelled before the call's deadline): its
 * rank went away. Forgets the call (it is never handed back by
 * take_woken) and drops its job's pending state as above (not while the
 * service is stopping). Returns 1 when token was parked, 0 when it was not
 * (already handed back or never parked). Thread-safe. */
int rpc_service_cancel(rpc_service *s, void *token);

/* This service's incarnation: random, fixed for its life, carried by every
 * answer to Lookup, Push, Checkpoint, Restore and Stats, so a client sees a
 * restarted server (whose rows are no longer its run's) at once. */
uint64_t rpc_service_incarnation(const rpc_service *s);

/* The remote store of a multi-rank job (rpc_client_opts.world_size > 1)
 * starts a Watch on every server when it is created and detaches when it
 * is destroyed (waiting for the prefetched Lookup, if any, first). */

/* Make the store's updates durable (rpc_server_run calls it on shutdown). */
int rpc_service_flush(rpc_service *s);

/* ---- server ---- */

typedef struct rpc_tls {
  const char *cert, *key; /* PEM files: this side's certificate and key */
  const char *ca;         /* server: client CA (mTLS, clients must present a cert);
                             client: CA that signed the server */
} rpc_tls;

typedef struct rpc_server_opts {
  const char *listen;       /* "127.0.0.1:0" */
  int threads;              /* worker threads, each with its own completion queue */
  int max_message_bytes;    /* send and receive limit */
  const rpc_tls *tls;       /* NULL: insecure */
  volatile int *stop;       /* set nonzero (e.g. from a signal handler) to stop */
  double shutdown_grace_s;  /* in-flight calls get this long before cancellation */
} rpc_server_opts;

/* Serve svc until *o->stop. on_listening(port, ctx) is called once the port
 * is bound, before serving. Returns 0 after a clean shutdown, or an SR_E*
 * code with the reason in err. */
int rpc_server_run(rpc_service *svc, const rpc_server_opts *o,
                   void (*on_listening)(int port, void *ctx), void *ctx, char *err,
                   size_t errlen);

/* ---- client ---- */

typedef struct rpc_client_opts {
  double deadline_s;        /* per call (default 30) */
  int max_tries;            /* attempts on UNAVAILABLE (default 8) */
  double backoff_s;         /* first wait between tries, doubled each time (0.05) */
  int max_message_bytes;    /* default 64 MiB */
  const rpc_tls *tls;       /* NULL: insecure */
  const char *job_id;       /* NULL: a fresh random one (ranks of one job must share it) */
  int rank, world_size;     /* this trainer's rank of world_size (0: 1 rank); with several,
                               every step pushes to every shard (empty where nothing) */
  int max_staleness;        /* 0: sync mode (the multi-rank step order above); S >= 1:
                               async mode: pushes applied on arrival, and a Lookup of step
                               t waits until every rank's push of step t-S is applied */
} rpc_client_opts;

/* The remote store: servers[k] serves shard k of plan (plan->n_shards
 * addresses). plan is borrowed. NULL with a message in err on failure.
 * Every request carries rank, world_size and max_staleness. A lookup_begin
 * (say of step t+1, prefetched) may stay outstanding while push() of step t
 * runs, in both modes: lookups have their own completion queue and id
 * grouping, so push never waits for it and its rows land in the buffers of
 * its own lookup_begin; a second lookup_begin before lookup_wait finishes
 * the first and drops its rows. checkpoint, restore and stats do not wait
 * for it either; destroy does (see "Rank death" for why it is not
 * cancelled). A lookup refused because its job was dropped fails with
 * SR_ESTATE and the server's message (ABORTED). */
emb_store *emb_store_create_remote(const emb_plan *plan, const char *const *servers,
                                   int n_servers, const rpc_client_opts *o, char *err,
                                   size_t errlen);

/* Nonzero when store is a remote store whose last failure means a server
 * was unreachable after every retry (UNAVAILABLE) or answered from a new
 * incarnation (it restarted): its rows may no longer be the run's, and only
 * a Restore of every server from a checkpoint (emb_store_restore, which
 * clears this) makes the store usable again. 0 for other stores. */
int rpc_remote_lost(const emb_store *store);

/* One unary call on a fresh channel to target, for tools and tests:
 * req[len] in, *resp (malloc'd, caller frees) out. Returns the gRPC status
 * code, with its message in msg. */
int rpc_call_once(const char *target, const rpc_tls *tls, rpc_method m, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen);

/* The same for a method named by its path ("/pkg.Service/Method"), known
 * to the server or not. */
int rpc_call_path(const char *target, const rpc_tls *tls, const char *path, const uint8_t *req,
                  size_t len, double deadline_s, uint8_t **resp, size_t *resp_len, char *msg,
                  size_t msglen);

/* Keep glibc from handing blocks over 128 KiB back to the kernel on free:
 * every call's message and row buffers would otherwise come back as fresh
 * pages (about 11 us per 4 KiB on our VMs), which made a 4096-row dim-16
 * Lookup 5x slower (bench rpc). Process-wide; called by rpc_server_run and
 * emb_store_create_remote; idempotent. */
void rpc_malloc_tune(void);

/* grpc_init / grpc_shutdown, reference counted by gRPC itself. */
void rpc_global_init(void);
void rpc_global_shutdown(void);

#endif
