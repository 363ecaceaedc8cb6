/* The shard service's state (struct rpc_service) and the calls between
 * the files that make it up, private to rpc/:
 *   service.c    create and destroy, the handlers (Lookup, Checkpoint,
 *                Restore, Stats, Health, Watch), the dispatch and the step
 *                coordinator's glue;
 *   service_push.c       Push;
 *   admission.c  the in-flight memory budget and the pool of the calls'
 *                scratch;
 *   pinned.c     Lookup answers sent from the store's memory;
 *   service_transform.c  the served data transform (GetTransform);
 *   service_versions.c   the checkpoint step of Lookup answers, the
 *                swaps' exclusive section (serve --follow);
 *   service_remove.c     Remove: a bounded table's removed rows;
 *   codec.c      the wire format (rpc/codec_impl.h). */
#ifndef SHARDREC_RPC_SERVICE_IMPL_H
#define SHARDREC_RPC_SERVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "rpc/codec_impl.h"
#include "rpc/coord_impl.h"
#include "rpc/service.h"

typedef struct {
  uint64_t calls;
  double sum_us, max_us;
} lat_stat;

struct rpc_service {
  const emb_plan *plan; /* borrowed */
  emb_store *store;     /* borrowed */
  char fp[EMB_FP_HEX];
  uint8_t *served;      /* [plan->n_shards] 1 when served here */
  int *shards;          /* [n_shards] as given */
  int n_shards;
  int read_only;
  size_t max_ids;
  int unclean;          /* rows left by a crash, not restored since (RPC_MSG_UNCLEAN) */
  char missed[512];     /* a Push answered whose update then failed, not restored since
                           (rpc_service_after): the refusal; "": none */
  size_t max_msg;       /* the message limit an answer must fit */
  size_t budget, inflight; /* the in-flight budget and what calls hold of it now */
  double budget_wait_s;
  uint64_t budget_refused, budget_gen; /* refusals; releases so far */
  pthread_cond_t room;  /* signalled when calls give budget back (with mu) */
  pthread_mutex_t mu;   /* serialises the store, the coordinator and the counters below */
  atomic_int applying;  /* Pushes taken and answered, not updated yet (rpc_service_after);
                           changed under mu, read without it first */
  pthread_cond_t applied; /* signalled when applying drops (with mu) */
  rpc_coord *coord;     /* owned: the multi-rank jobs */
  int64_t hi_step;      /* the highest step handed to the store (looked up, pushed or
                           prefetched) since it was opened or restored; -1: none */
  uint64_t prefetched;  /* look-aheads handed to the store (hints, parked Lookups) */
  lat_stat lat[RPC_N_METHODS];
  uint64_t failed;
  uint64_t incarnation; /* random, fixed for this service's life */
  char **roots;         /* [n_roots] checkpoint roots, resolved (Admin calls) */
  int n_roots;
  const uint8_t *xf;    /* [xf_len] the data transform's bytes (borrowed); NULL: none */
  size_t xf_len;
  char xf_fp[SR_SHA256_HEX]; /* their SHA-256 hex; "": none */
  void (*observe)(void *, rpc_method, int, const char *, double, size_t, size_t);
  void *observe_ctx;
  int from_ckpt;        /* Lookup answers name their checkpoint step (under mu): set at
                           start when serving a checkpoint, cleared by the first Restore,
                           Push taken or Remove (other rows since); read with the rows */
  int64_t ckpt_step;    /* that step, without versions */
  const rpc_service_versions *versions; /* borrowed; NULL: one step */
  size_t pin_min;       /* rows of at least this many bytes answered pinned; 0: never */
  atomic_uint_least64_t pin_rows, pin_bytes; /* held by pinned answers not yet released */
  atomic_uint_least64_t streams;              /* exchange streams open (rpc_service_streams) */
  atomic_uint_least64_t waiting;              /* calls and messages waiting for budget (rpc_service_waiting) */
  atomic_size_t refs;   /* rpc_service_destroy's and one per pinned answer not released:
                           the last frees the lock, the budget's condition and s */
  pthread_mutex_t pool_mu;    /* the scratch pool and the id counts below */
  struct rpc_scratch *pool;   /* owned: the decoders' scratch, one per call in flight */
  uint64_t ids_in_place, ids_copied; /* request ids read in place; decoded or copied */
};

/* ---- service.c ---- */

/* One reference to s dropped; the last frees what a pinned answer's
 * release touches (rpc_pinned_release may come after rpc_service_destroy:
 * gRPC lets the last slices of a cancelled call go when it likes). */
void rpc__service_unref(rpc_service *s);

/* LookupResponse.step and from_checkpoint of an answer at step, at p (at
 * most RPC_STEP_BYTES bytes; none unless named: the rows were read while
 * the server's rows were its checkpoint's, from_ckpt under mu); past them. */
#define RPC_STEP_BYTES 13
uint8_t *rpc__answer_step(uint8_t *p, int named, int64_t step);
/* A Lookup asking for step asked (at_step) of a server without versions,
 * under mu with the rows it reads: RPC_OK when it serves that checkpoint
 * step, else the refusal in r (UNAVAILABLE for a newer step,
 * FAILED_PRECONDITION otherwise). */
int rpc__check_one_step(const rpc_service *s, int64_t asked, rpc_reply *r);
/* SwapAt (rpc/shardrec.proto): checked, handed to the versions' swap_at. */
void rpc__swap_at(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r);

/* A request header's checks, as Lookup's and Push's (fingerprint, rank and
 * world size, step, job id), then rows left by a crash refused. RPC_OK or
 * a status with the message in r. */
int rpc__check_header(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r);
/* Table i of a request (what: its field, "tables"): table_id in the plan
 * and not given before (seen[plan index], set here), ids in range and on a
 * served shard, *total (ids so far) within max_ids. Sets *idx to the plan
 * index. RPC_OK or a status with the message in r. */
int rpc__check_ids(rpc_service *s, const char *what, size_t i, uint32_t table_id,
                   const uint64_t *ids, size_t n, int *idx, uint8_t *seen, size_t *total,
                   rpc_reply *r);

/* The coordinator's view of a checked header (borrows h's job id), and
 * the gRPC status the service answers a coordinator outcome with. */
rpc_coord_call rpc__coord_call(const Shardrec__V1__RequestHeader *h);
int rpc__coord_status(rpc_coord_outcome o);

/* A handler's refusal: status code and the message into reply r, then to
 * the handler's label out (which frees what the handler holds). */
#define FAIL(r, code, ...)                            \
  do {                                                \
    (r)->status = (code);                             \
    snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__); \
    goto out;                                         \
  } while (0)

/* ---- service_push.c ---- */

/* Push (rpc/shardrec.proto): checked whole, then applied or held by the
 * coordinator under the service's lock, or with later (a stream's), a
 * single-rank job's whole push taken and handed back in r->after. The
 * request's copy, its decoded form and a held copy take their share of the
 * in-flight budget (defer: as rpc__budget_take). */
void rpc__push(rpc_service *s, const uint8_t *in, size_t len, int defer, int later,
               rpc_reply *r);
/* Such a push, taken (rpc_coord_push_take, s->applying counted) and
 * answered, its update left to rpc_service_after: the request decoded in
 * x (its header and learning rate, its ids and gradients still in the
 * request's bytes), and what the call is noted with. */
struct rpc_after {
  rpc_scratch *x;
  size_t in_len, out_len;
  double secs; /* the handling before the answer */
};

/* The coordinator's apply callback: a step's rows into the store (s->mu
 * held); 0, or SR_E* with the store's message in err. */
int rpc__apply(void *ctx, int64_t step, float lr, const emb_idset *set,
               const emb_grad *const *grads, char *err, size_t errlen);

/* ---- service_remove.c ---- */

/* Remove (rpc/shardrec.proto): checked whole, then the store's remove op
 * under the service's lock. The decoded request takes its share of the
 * in-flight budget (defer: as rpc__budget_take). */
void rpc__remove(rpc_service *s, const uint8_t *in, size_t len, int defer, rpc_reply *r);

/* ---- admission.c ---- */

/* Take need bytes of the in-flight budget for the call answering into r
 * (r->held grows); a call holding all that is in flight is always let
 * through. No room: with defer, RPC_DEFERRED at once (the server calls
 * again later); else wait up to budget_wait_s for room, then
 * RESOURCE_EXHAUSTED with the numbers in r. Not with s->mu held. */
int rpc__budget_take(rpc_service *s, size_t need, int defer, rpc_reply *r);
/* The bound on the answer's bytes of a Lookup of tables[n] (plan indexes
 * idx) that rpc__check_answer takes budget for (3 x). */
size_t rpc__answer_bound(const rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                         const int *idx);
/* Refuse a Lookup of tables[n] (plan indexes idx) whose answer would not
 * fit the message limit, before anything is allocated for it; else take
 * its share of the in-flight budget (3 x the answer's bound: the rows, the
 * packed answer and gRPC's copy; rpc__answer_pinned gives 2 of them back).
 * RPC_OK or a status in r. */
int rpc__check_answer(rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                      const int *idx, int defer, rpc_reply *r);
/* A scratch for one call (the pool's, else a new one); NULL out of memory. */
rpc_scratch *rpc__scratch_take(rpc_service *s);
/* x back into the pool (its buffers dropped past a size), its call's id
 * counts into the service's. NULL-safe. */
void rpc__scratch_give(rpc_service *s, rpc_scratch *x);
/* Every pooled scratch freed (rpc_service_destroy). */
void rpc__scratch_pool_free(rpc_service *s);

/* ---- service_transform.c ---- */

/* The data transform of o into s (borrowed bytes; their SHA-256 checked
 * against o->transform_fp). 0 (also when o has none), or SR_E* with the
 * reason in err. */
int rpc__transform_init(rpc_service *s, const rpc_service_opts *o, char *err, size_t errlen);
/* GetTransform: a chunk of the transform (rpc/shardrec.proto, "The data
 * transform"); the answer takes its share of the in-flight budget (defer:
 * as rpc__budget_take). */
void rpc__get_transform(rpc_service *s, const uint8_t *in, size_t len, int defer, rpc_reply *r);

/* ---- pinned.c ---- */

/* Answer q (plan indexes idx, ids set) from the store's memory: the rows
 * pinned (emb_store_ops.lookup_pinned) and r->pinned their pieces, holding
 * r's budget share less the two copies a pinned answer does not make. 1
 * when r is answered (pinned, or failed); 0 when the gather path is to
 * answer instead (not offered, rows too narrow, or the cache too pinned to
 * pin them: the store said SR_ESTATE). */
int rpc__answer_pinned(rpc_service *s, const Shardrec__V1__LookupRequest *q, const int *idx,
                       const emb_idset *set, rpc_reply *r);

#endif
