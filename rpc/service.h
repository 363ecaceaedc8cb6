/* The shard service's request handlers (rpc/shardrec.proto): rpc_service
 * decodes a request's bytes, validates every field against the plan and the
 * shards served, runs it on an embedding store and encodes the answer. No
 * gRPC in it: the fuzz target and the server (rpc/server.h) call the same
 * function. The methods and the gRPC status codes it answers with are here
 * too; the client (rpc/client.h) speaks them. All gRPC calls of shardrec
 * live in rpc/.
 *
 * What a call does, as any client sees it (multi-rank jobs, rank death,
 * admin calls, look-ahead, the limits), is rpc/shardrec.proto's, in the
 * comments of its messages and of service EmbeddingShard; this header says
 * what a C caller of the service does beyond that (parked calls, the
 * in-flight budget's bytes, pinned answers). */
#ifndef SHARDREC_RPC_SERVICE_H
#define SHARDREC_RPC_SERVICE_H

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
  RPC_GET_TRANSFORM, /* "/shardrec.v1.EmbeddingShard/GetTransform": the data transform */
  RPC_SWAP_AT,       /* "/shardrec.v1.EmbeddingShard/SwapAt": a following server's admin call */
  RPC_REMOVE,        /* "/shardrec.v1.EmbeddingShard/Remove": a bounded table's removed rows */
  RPC_PUSH_LOOKUP,   /* "/shardrec.v1.EmbeddingShard/PushLookup": one rank's push, then a Lookup */
  RPC_N_METHODS
} rpc_method;

/* A call to a method the service does not have (rpc_service_note). */
#define RPC_METHOD_UNKNOWN ((rpc_method)-1)

const char *rpc_method_path(rpc_method m);

/* GetTransform's chunk: max_bytes 0 asks for RPC_TRANSFORM_CHUNK bytes;
 * no answer carries more than RPC_TRANSFORM_CHUNK_MAX (nor more than the
 * server's message limit less 4 KiB). */
#define RPC_TRANSFORM_CHUNK ((size_t)1 << 20)
#define RPC_TRANSFORM_CHUNK_MAX ((size_t)2 << 20)

/* gRPC status codes used here (values of grpc_status_code). */
enum {
  RPC_OK = 0,
  RPC_CANCELLED = 1,
  RPC_INVALID_ARGUMENT = 3,
  RPC_DEADLINE_EXCEEDED = 4,
  RPC_NOT_FOUND = 5,
  RPC_ALREADY_EXISTS = 6,
  RPC_PERMISSION_DENIED = 7,
  RPC_RESOURCE_EXHAUSTED = 8,
  RPC_FAILED_PRECONDITION = 9,
  RPC_ABORTED = 10,
  RPC_OUT_OF_RANGE = 11,
  RPC_UNIMPLEMENTED = 12,
  RPC_INTERNAL = 13,
  RPC_UNAVAILABLE = 14,
};

/* The name of gRPC status code c ("FAILED_PRECONDITION"); "UNKNOWN" for
 * codes outside 0..16. */
const char *rpc_status_name(int c);

typedef struct rpc_service rpc_service;

/* The detail of the FAILED_PRECONDITION a server started on rows left by a
 * crash answers Lookup, Push and Checkpoint with until a Restore
 * (rpc_service_opts.refuse_unclean). The remote store (rpc/client.h) knows
 * it and treats the server as lost (restarted), not as a plan mismatch. */
#define RPC_MSG_UNCLEAN "rows not consistent after a crash: Restore a checkpoint"

/* The start of the message of a PushLookup refused after its push was
 * taken (the push is applied; its Lookup was refused): the remote store
 * then counts the push done and reads the step's rows afresh. */
#define RPC_MSG_AFTER_PUSH "lookup, after the push was taken"

/* Checkpoint versions of a server that follows its checkpoint folder
 * (serve --follow, tools/serve_follow.c): which step a Lookup is answered
 * from, and the rows of a step held beside the served one. Both are
 * called with the service's lock held, the store's lookup between them,
 * so that a swap (rpc_service_exclusive) never falls inside one answer. */
typedef struct rpc_service_versions {
  /* The step a Lookup is answered from into *step: the served one, or
   * asked (when step_asked) if held. RPC_OK, or a status with the reason
   * (naming the steps served and asked) in msg[len]. */
  int (*pick)(void *ctx, int64_t asked, int step_asked, int64_t *step, char *msg, size_t len);
  /* After the store wrote the served step's rows of set into out (row r of
   * table t at out[t][r * dim]): lay the rows that differ at step (a step
   * pick gave) over them. */
  void (*patch)(void *ctx, int64_t step, const emb_idset *set, float *const *out);
  /* SwapAt (rpc/shardrec.proto), without the service's lock: hold at the
   * served step (into *served) until step is complete, then swap to it.
   * RPC_OK, or a status with the reason in msg[len]. */
  int (*swap_at)(void *ctx, int64_t step, int64_t *served, char *msg, size_t len);
  /* Rows the versions' own work looked up in the store, and of them hits
   * (under the service's lock): left out of what Stats and the metrics
   * report as clients' lookups. NULL: none. */
  void (*own_reads)(void *ctx, uint64_t *rows, uint64_t *hits);
  void *ctx;
} rpc_service_versions;

typedef struct rpc_service_opts {
  const int *shards;   /* [n_shards] shards of the plan served here */
  int n_shards;
  int read_only;       /* refuse Push with FAILED_PRECONDITION */
  size_t max_ids;      /* most ids one Lookup or Push may carry (0: what fits the message
                          limit at the plan's widest row, rpc_service_max_ids_for) */
  size_t max_message_bytes; /* the server's message limit (0: 64 MiB): a Lookup whose
                          answer would not fit is refused RESOURCE_EXHAUSTED before
                          anything is allocated for it */
  size_t inflight_bytes;    /* the memory budget of all calls in flight (0: 4 x
                          max_message_bytes); see rpc_reply.held */
  double inflight_wait_s;   /* how long a call or stream message waits for room in it (0: 1 s) */
  int refuse_unclean;  /* when the store says its rows were not stopped cleanly
                          (emb_store_unclean: a shard store after a crash), refuse
                          Lookup, Push and Checkpoint with FAILED_PRECONDITION
                          RPC_MSG_UNCLEAN until a Restore */
  double pending_timeout_s; /* a multi-rank job whose pending state (held pushes,
                               parked Lookups, ranks at different steps) makes no
                               progress this long is dropped as if a rank went
                               away (0: 300 s); rpc/shardrec.proto, "Rank death" */
  const char *const *checkpoint_roots; /* [n_roots] folders that Checkpoint and Restore
                               paths must lie in (one that does not exist yet is
                               taken as the path it will have); 0 roots: both are
                               refused FAILED_PRECONDITION (see "Admin calls") */
  int n_roots;
  /* The data transform of the served model (rpc/shardrec.proto, "The data
   * transform"): opaque bytes (the checkpoint's transform.bin; the service
   * does not parse them), borrowed, outliving the service, and their
   * fingerprint, which rpc_service_create checks is their SHA-256 hex.
   * transform_fp NULL or "": none (Stats says "", GetTransform NOT_FOUND). */
  const uint8_t *transform;
  size_t transform_len;
  const char *transform_fp;
  /* Called after every handled call (not while it is parked), outside the
   * service's lock, from the thread that handled it: its method, status,
   * error text (when status is not RPC_OK), handling time and request and
   * answer sizes (rpc/service_metrics.h).
   * NULL: nothing. */
  void (*observe)(void *ctx, rpc_method m, int status, const char *msg, double seconds,
                  size_t in_bytes, size_t out_bytes);
  void *observe_ctx;
  /* The rows are a checkpoint's (serve --checkpoint): every Lookup answer
   * names its step (LookupResponse.step, from_checkpoint), step here or,
   * with versions, the one versions->pick gives. */
  int from_checkpoint;
  int64_t step;
  const rpc_service_versions *versions; /* borrowed, outliving the service; NULL: one step */
} rpc_service_opts;

/* Admin calls: Checkpoint and Restore paths are confined to the checkpoint
 * roots (rpc/shardrec.proto, "Admin calls"). Each root is resolved when the
 * service is created (sr_path_confine from "/", common/fs.h), each path at
 * its call (sr_path_confine from each root); the store then works on the
 * resolved path, in the folder emb_served_checkpoint_dir names for the
 * served shards. A Restore of rows a checkpoint wrote under a smaller plan
 * that this server's plan grows (embedding/plan.h, emb_plan_grows; the
 * manifest of the path's step folder, read when it lies inside a root, says
 * so) keeps them as they are, the rows past them never written
 * (emb_store_restore_grown). An incremental Checkpoint or an overlay
 * Restore works in the folder emb_served_delta_dir names (the server's own
 * path/shard-K1-K2..., whatever the store) through the store's
 * checkpoint_delta and restore_delta; a store without them is refused
 * FAILED_PRECONDITION, and an overlay is refused, as Lookup is, while the
 * rows are a crash's. */

/* A service over plan (borrowed) and store (borrowed; holds the plan's rows,
 * of which only the served shards' are ever touched). Thread-safe: calls are
 * serialised by an internal lock. NULL with a message in err on failure. */
rpc_service *rpc_service_create(const emb_plan *plan, emb_store *store,
                                const rpc_service_opts *o, char *err, size_t errlen);
void rpc_service_destroy(rpc_service *s); /* NULL-safe */

/* A Lookup answer sent from the store's memory (rpc_service_pin_answers):
 * its bytes are pieces, in order, some in a buffer of the answer's own
 * (head: the LookupResponse's tags and lengths), the others the rows,
 * pinned in the store (emb_store_ops.lookup_pinned). */
typedef struct rpc_pinned rpc_pinned;
typedef struct rpc_piece {
  const uint8_t *p;
  size_t n;
  int in_head; /* 1: inside head[head_len]; 0: a row in the store */
} rpc_piece;
/* a's pieces (*n of them) and its head buffer; borrowed from a. */
const rpc_piece *rpc_pinned_pieces(const rpc_pinned *a, size_t *n, const uint8_t **head,
                                   size_t *head_len);
/* Once nothing reads a's bytes any more (gRPC dropped its last reference:
 * the answer was sent, or its call cancelled): the rows' pins and the
 * answer's share of the in-flight budget given back, a freed. Any thread,
 * no lock held; once; also after rpc_service_destroy (what it touches of
 * the service goes with the last release). NULL-safe. */
void rpc_pinned_release(rpc_pinned *a);

/* Let rpc_service_handle_call answer Lookups with pinned rows (r->pinned)
 * when the store offers lookup_pinned and every table asked for has rows
 * of at least min_row_bytes (4 x dim); 0: never (the default; and
 * rpc_service_handle never does). The server turns it on. */
void rpc_service_pin_answers(rpc_service *s, size_t min_row_bytes);

/* 1 when s takes Pushes (it is not read-only), else 0. */
int rpc_service_takes_pushes(const rpc_service *s);

/* The answer to one call. out is malloc'd (caller frees) when status is
 * RPC_OK; msg holds the error text otherwise. */
typedef struct rpc_reply {
  int status;
  char msg[512];
  uint8_t *out;
  size_t out_len;       /* with pinned: the answer's length */
  rpc_pinned *pinned;   /* owned, RPC_OK only: the answer instead of out (which is NULL);
                           it holds the answer's budget (held is 0): the caller sends it
                           and calls rpc_pinned_release once the bytes are sent */
  /* Bytes of the in-flight budget the answer still holds (an OK answer
   * only): the request's copies and the answer's, until it is sent. The
   * caller gives them back with rpc_service_release once the answer is
   * sent (the server: when the call's reply batch completes). */
  size_t held;
  /* rpc_service_handle_exchange only: a Push answered before its update
   * (rpc_service_after); NULL otherwise. */
  struct rpc_after *after;
} rpc_reply;

/* The in-flight budget. Every Lookup and Push takes its share before it
 * allocates: twice the request's bytes (its copy and its decoded form),
 * and for a Lookup three times its answer's (the rows, the packed answer
 * and gRPC's copy; an answer sent pinned gives two of them back once the
 * rows are pinned and keeps the rest until rpc_pinned_release). Past the budget a call waits up to inflight_wait_s for
 * calls in flight to give theirs back, then is refused RESOURCE_EXHAUSTED
 * naming the numbers (Stats: inflight_refused); a call larger than the
 * whole budget runs when nothing else is in flight. So the memory of the
 * calls in flight stays within the budget plus one call. */
void rpc_service_release(rpc_service *s, size_t bytes);

/* With a token (the server's calls), a call that finds no room does not
 * wait in the handler (a worker thread waiting would keep the answers it
 * sent from being completed and released): rpc_service_handle_call answers
 * RPC_DEFERRED, nothing done, and the server calls again with the same
 * request once budget is given back (rpc_service_budget_gen changed), up
 * to rpc_service_budget_wait_s after the first try; then it answers with
 * rpc_service_refuse_busy (RESOURCE_EXHAUSTED, counted in Stats). Without
 * a token (a woken parked Lookup, rpc_service_handle) the call waits for
 * room on a condition, up to the same time. */
#define RPC_DEFERRED (-2)
uint64_t rpc_service_budget_gen(rpc_service *s);
double rpc_service_budget_wait_s(const rpc_service *s);
void rpc_service_refuse_busy(rpc_service *s, rpc_reply *r);

/* The default max_ids: the most ids whose Lookup answer or Push request at
 * the plan's widest row (4 x dim bytes, plus up to 10 bytes of id) fits
 * max_message_bytes with 4 KiB to spare; at most 1 << 22, at least 1. */
size_t rpc_service_max_ids_for(const emb_plan *plan, size_t max_message_bytes);

/* Handle one request of method m from its serialised bytes in[len] (any
 * bytes: garbage is answered with INVALID_ARGUMENT, as is a string field
 * holding a control character: rpc/shardrec.proto). A refused request
 * changes nothing. Without a token nothing parks: a Lookup that would be
 * held (below) is answered UNAVAILABLE. A prefetch_only Lookup and a
 * parked one hand their ids to emb_store_prefetch under the service's lock
 * (rpc/shardrec.proto, "Look-ahead"). */
void rpc_service_handle(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                        rpc_reply *r);

/* A call of method m answered status (msg) without rpc_service_handle_call
 * (refused before it: an allow list, a deadline already passed, no
 * request; or a parked call answered later), counted as a handled call is:
 * Stats' calls and failed_calls, the observe hook (metrics, logs). m may be
 * RPC_METHOD_UNKNOWN (a method the service does not have): then in
 * failed_calls and the hook only, Stats having no calls for it. */
void rpc_service_note(rpc_service *s, rpc_method m, int status, const char *msg, double secs,
                      size_t in_len, size_t out_len);

/* Multi-rank jobs (rpc/shardrec.proto, "Multi-rank jobs" and "Rank
 * death"). A Lookup the step coordinator holds (rpc/coord_impl.h) is parked:
 * rpc_service_handle_call answers r->status RPC_PARKED, keeps a copy of
 * the request and token, and rpc_service_take_woken later hands back
 * (token, answer) once it may be served, the call's timeout passed
 * (DEADLINE_EXCEEDED, nothing changed), its job's pending state was
 * dropped (ABORTED) or the service stops parking (UNAVAILABLE). A Watch
 * parks the same way and is answered OK once its rank detaches. A parked
 * call cancelled by its client is reported with rpc_service_cancel: that
 * is how the service hears of a rank that went away. */
#define RPC_PARKED (-1)
void rpc_service_handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                             void *token, double timeout_s, rpc_reply *r);
/* An exchange stream opened (+1) or ended (-1): Stats' exchange_streams
 * and the metrics' shardrec_server_exchange_streams. Thread-safe. */
void rpc_service_streams(rpc_service *s, int delta);
/* The calls and stream messages waiting now for room in the budget (the
 * server's deferred list): Stats' inflight_waiting and the metrics'
 * shardrec_server_inflight_waiting. Thread-safe. */
void rpc_service_waiting(rpc_service *s, uint64_t n);
/* One message of an exchange stream (rpc/server.c: a Lookup, Push or
 * PushLookup), handled as rpc_service_handle_call's calls are, with two
 * differences:
 * one that finds no room in the budget is answered RPC_DEFERRED (as with
 * a token), and none parks (a stream answers in order: a Lookup of a job
 * of several ranks whose step is not ready is refused, as without one). */
void rpc_service_handle_exchange(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                                 rpc_reply *r);
/* A whole Push of a single-rank job on an exchange stream is answered
 * once it is checked and taken, and updated after (rpc/shardrec.proto,
 * "Exchange stream"): rpc_service_handle_exchange hands it back in
 * r->after, and the caller, having started the answer, calls this with it
 * at once, in[len] still alive. Every call the service handles from the
 * moment it took the push (another worker's) waits until it is applied,
 * so whatever the answer's client sends next reads it. An update that
 * fails then leaves the rows missing it: Lookup, Push, PushLookup, Remove
 * and Checkpoint are refused FAILED_PRECONDITION, naming the push and why,
 * until a Restore. Counted and observed as the Push's call, its time the
 * handling's and the update's. RPC_OK (also for NULL), or the failed
 * update's status. */
int rpc_service_after(rpc_service *s, struct rpc_after *a);
/* 1 when the rows miss a Push answered before an update that then failed
 * (no Restore since), else 0: a store with durable rows must not be
 * marked clean then (`shardrec serve`). */
int rpc_service_misses_push(rpc_service *s);
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
 * (already handed back or never parked). A call forgotten so is counted as
 * answered CANCELLED (rpc_service_note). Thread-safe. */
int rpc_service_cancel(rpc_service *s, void *token);


/* What Stats reports, for rpc/service_metrics.c: fn(ctx, view) runs under
 * the service's lock, so it may read the store (stats, counters) but must
 * not call the service. The view is valid during the call only. */
/* The step coordinator's figures (multi-rank jobs), as Stats reports them. */
typedef struct rpc_coord_stats {
  uint64_t pending_pushes; /* pushes held now (sync steps not complete) */
  uint64_t dropped_steps;  /* steps whose held pushes were dropped so far */
  uint64_t jobs;           /* multi-rank jobs known (aborted ones included) */
  uint64_t dropped_jobs;   /* jobs whose pending state was dropped (rank death, timeout) */
  uint64_t parked_lookups; /* Lookups parked now */
  uint64_t parked_watches; /* Watches parked now */
} rpc_coord_stats;
typedef struct rpc_service_view {
  emb_store *store; /* borrowed */
  emb_store_stats st; /* the store's stats, the versions' own reads left out (st_rc 0) */
  int st_rc;
  rpc_coord_stats coord;
  uint64_t failed, incarnation;
  const char *plan_fp;
  uint64_t pinned_rows, pinned_bytes; /* Stats' pinned_rows, pinned_bytes */
  int unclean;                        /* Stats' unclean: a crash's rows, refused */
  uint64_t streams;                   /* Stats' exchange_streams */
  uint64_t waiting;                   /* Stats' inflight_waiting */
} rpc_service_view;
void rpc_service_inspect(rpc_service *s, void (*fn)(void *ctx, const rpc_service_view *v),
                         void *ctx);

/* Run fn(ctx) with the service's lock held: no call touches the store
 * meanwhile and no Lookup is between its pick and its answer (a following
 * server's swap). fn must not call the service. */
void rpc_service_exclusive(rpc_service *s, void (*fn)(void *ctx), void *ctx);

/* Hand the store's updates to its durable tier (emb_store_flush;
 * rpc_server_run calls it on shutdown, before the clean-stop mark, which
 * makes them durable). */
int rpc_service_flush(rpc_service *s);

#endif
