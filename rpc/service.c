/* The request handlers of the shard service, without gRPC: bytes in, status
 * and bytes out. Every field of a request is checked before anything runs,
 * so a refused request changes nothing. The multi-rank step order (which
 * call waits, which push is held, when a job is dropped) is the
 * coordinator's (rpc/coord.c); this file decodes, validates, calls it under
 * the service's lock and encodes its outcome. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "embedding/served.h"
#include "rpc/coord.h"
#include "rpc/health.pb-c.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows travel as little-endian float32: a big-endian host needs byte swaps here"
#endif

#define SVC_MAX_WORLD 1024 /* trainer ranks of one job */

static const char *const method_paths[RPC_N_METHODS] = {
    "/shardrec.v1.EmbeddingShard/Lookup",     "/shardrec.v1.EmbeddingShard/Push",
    "/shardrec.v1.EmbeddingShard/Checkpoint", "/shardrec.v1.EmbeddingShard/Restore",
    "/shardrec.v1.EmbeddingShard/Stats",      "/grpc.health.v1.Health/Check",
    "/shardrec.v1.EmbeddingShard/Watch",
};

const char *rpc_status_name(int c) {
  static const char *const n[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                  "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                  "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                  "UNAUTHENTICATED"};
  return c >= 0 && c <= 16 ? n[c] : "UNKNOWN";
}

const char *rpc_method_path(rpc_method m) {
  return (m >= 0 && m < RPC_N_METHODS) ? method_paths[m] : NULL;
}

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
  size_t max_msg;       /* the message limit an answer must fit */
  size_t budget, inflight; /* the in-flight budget and what calls hold of it now */
  double budget_wait_s;
  uint64_t budget_refused, budget_gen; /* refusals; releases so far */
  pthread_cond_t room;  /* signalled when calls give budget back (with mu) */
  pthread_mutex_t mu;   /* serialises the store, the coordinator and the counters below */
  rpc_coord *coord;     /* owned: the multi-rank jobs */
  int64_t hi_step;      /* the highest step handed to the store (looked up, pushed or
                           prefetched) since it was opened or restored; -1: none */
  uint64_t prefetched;  /* look-aheads handed to the store (hints, parked Lookups) */
  lat_stat lat[RPC_N_METHODS];
  uint64_t failed;
  uint64_t incarnation; /* random, fixed for this service's life */
  char **roots;         /* [n_roots] checkpoint roots, resolved (Admin calls) */
  int n_roots;
  void (*observe)(void *, rpc_method, int, const char *, double, size_t, size_t);
  void *observe_ctx;
  size_t pin_min;       /* rows of at least this many bytes answered pinned; 0: never */
  atomic_uint_least64_t pin_rows, pin_bytes; /* held by pinned answers not yet released */
  atomic_size_t refs;   /* rpc_service_destroy's and one per pinned answer not released:
                           the last frees the lock, the budget's condition and s */
  pthread_mutex_t pool_mu;    /* the scratch pool and the id counts below */
  struct svc_scratch *pool;   /* owned: the decoders' scratch, one per call in flight */
  uint64_t ids_in_place, ids_copied; /* request ids read in place; decoded or copied */
};

/* The coordinator's apply callback: a step's rows into the store (s->mu held). */
static int svc_apply(void *ctx, int64_t step, float lr, const emb_idset *set,
                     const float *const *grads, char *err, size_t errlen) {
  rpc_service *s = ctx;
  if (step > s->hi_step) s->hi_step = step;
  int rc = emb_store_push(s->store, step, lr, set, grads);
  if (rc) snprintf(err, errlen, "%s", emb_store_errmsg(s->store));
  return rc;
}

/* The gRPC status the service answers a coordinator outcome with. */
static int coord_status(rpc_coord_outcome o) {
  switch (o) {
    case RPC_COORD_GO:
    case RPC_COORD_RETRY:
    case RPC_COORD_RELEASED: return RPC_OK;
    case RPC_COORD_PARKED: return RPC_PARKED;
    case RPC_COORD_WAIT:
    case RPC_COORD_STOPPING: return RPC_UNAVAILABLE;
    case RPC_COORD_REFUSED: return RPC_FAILED_PRECONDITION;
    case RPC_COORD_ABORTED: return RPC_ABORTED;
    case RPC_COORD_NOMEM: return RPC_RESOURCE_EXHAUSTED;
    case RPC_COORD_FAILED: return RPC_INTERNAL;
    case RPC_COORD_INVALID: return RPC_INVALID_ARGUMENT;
    case RPC_COORD_TIMED_OUT: return RPC_DEADLINE_EXCEEDED;
  }
  return RPC_INTERNAL;
}

/* The coordinator's view of a checked header (borrows h's job id). */
static rpc_coord_call coord_call(const Shardrec__V1__RequestHeader *h) {
  return (rpc_coord_call){.job = h->job_id, .step = h->step, .rank = h->rank,
                          .world = h->world_size, .stale = h->max_staleness,
                          .part = h->part, .parts = h->parts};
}

/* The checkpoint roots of o, resolved into s (sr_path_confine from "/": a
 * root that does not exist yet is the path it will have). 0, or SR_E*
 * with the reason in err. */
static int svc_roots(rpc_service *s, const rpc_service_opts *o, char *err, size_t errlen) {
  if (o->n_roots < 1) return 0;
  s->roots = calloc((size_t)o->n_roots, sizeof *s->roots);
  if (!s->roots) {
    sr_fmt(err, errlen, "service: out of memory");
    return SR_ENOMEM;
  }
  for (int i = 0; i < o->n_roots; i++) {
    char real[SR_PATH_MAX], why[600] = "";
    const char *root = o->checkpoint_roots[i] ? o->checkpoint_roots[i] : "";
    int rc = sr_path_confine("/", root, real, sizeof real, why, sizeof why);
    if (rc || sr_is_file(real)) {
      sr_fmt(err, errlen, "checkpoint root %s: %s", root, rc ? why : "a file, not a folder");
      return rc ? rc : SR_EINVAL;
    }
    if (!(s->roots[i] = strdup(real))) {
      sr_fmt(err, errlen, "service: out of memory");
      return SR_ENOMEM;
    }
    s->n_roots = i + 1;
  }
  return 0;
}

rpc_service *rpc_service_create(const emb_plan *plan, emb_store *store,
                                const rpc_service_opts *o, char *err, size_t errlen) {
  if (!plan || !store || !o || o->n_shards < 1) {
    sr_fmt(err, errlen, "service: missing plan, store or shards");
    return NULL;
  }
  rpc_service *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  atomic_init(&s->refs, 1);
  s->plan = plan;
  s->store = store;
  s->read_only = o->read_only;
  s->unclean = o->refuse_unclean && emb_store_unclean(store);
  s->max_msg = o->max_message_bytes ? o->max_message_bytes : (size_t)64 << 20;
  s->max_ids = o->max_ids ? o->max_ids : rpc_service_max_ids_for(plan, s->max_msg);
  s->budget = o->inflight_bytes ? o->inflight_bytes : 4 * s->max_msg;
  s->budget_wait_s = o->inflight_wait_s > 0 ? o->inflight_wait_s : 1;
  s->observe = o->observe;
  s->observe_ctx = o->observe_ctx;
  s->served = calloc((size_t)plan->n_shards, 1);
  s->shards = malloc((size_t)o->n_shards * sizeof *s->shards);
  if (!s->served || !s->shards) goto nomem;
  for (int i = 0; i < o->n_shards; i++) {
    int k = o->shards[i];
    if (k < 0 || k >= plan->n_shards) {
      sr_fmt(err, errlen, "service: shard %d is not in the plan (0..%d)", k, plan->n_shards - 1);
      rpc_service_destroy(s);
      return NULL;
    }
    if (s->served[k]) {
      sr_fmt(err, errlen, "service: shard %d given twice", k);
      rpc_service_destroy(s);
      return NULL;
    }
    s->served[k] = 1;
    s->shards[i] = k;
  }
  s->n_shards = o->n_shards;
  if (svc_roots(s, o, err, errlen)) {
    rpc_service_destroy(s);
    return NULL;
  }
  if (emb_plan_fingerprint(plan, s->fp)) goto nomem;
  {
    int *dims = malloc((size_t)(plan->n_tables ? plan->n_tables : 1) * sizeof *dims);
    if (!dims) goto nomem;
    for (int t = 0; t < plan->n_tables; t++) dims[t] = plan->tables[t].dim;
    rpc_coord_opts co = {.n_tables = plan->n_tables, .dims = dims,
                         .pending_timeout_s = o->pending_timeout_s, .apply = svc_apply,
                         .apply_ctx = s};
    s->coord = rpc_coord_create(&co);
    free(dims);
    if (!s->coord) goto nomem;
  }
  {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)s;
    FILE *ur = fopen("/dev/urandom", "rb");
    uint64_t y = 0;
    if (ur) {
      if (fread(&y, sizeof y, 1, ur) != 1) y = 0;
      fclose(ur);
    }
    x ^= y;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;
    s->incarnation = x ? x : 1;
  }
  s->hi_step = -1;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->pool_mu, NULL);
  pthread_cond_init(&s->room, NULL);
  return s;
nomem:
  sr_fmt(err, errlen, "service: out of memory");
  if (s) {
    rpc_coord_destroy(s->coord);
    for (int i = 0; i < s->n_roots; i++) free(s->roots[i]);
    free(s->roots);
    free(s->served);
    free(s->shards);
    free(s);
  }
  return NULL;
}

static void scratch_pool_free(rpc_service *s);

/* One reference to s dropped; the last frees what a pinned answer's
 * release touches (rpc_pinned_release may come after rpc_service_destroy:
 * gRPC lets the last slices of a cancelled call go when it likes). */
static void svc_unref(rpc_service *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1) return;
  pthread_cond_destroy(&s->room);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

void rpc_service_destroy(rpc_service *s) {
  if (!s) return;
  rpc_coord_destroy(s->coord);
  s->coord = NULL;
  pthread_mutex_destroy(&s->pool_mu);
  scratch_pool_free(s);
  for (int i = 0; i < s->n_roots; i++) free(s->roots[i]);
  free(s->roots);
  free(s->served);
  free(s->shards);
  svc_unref(s);
}

size_t rpc_service_max_ids_for(const emb_plan *plan, size_t max_message_bytes) {
  int dim = 1;
  for (int t = 0; t < plan->n_tables; t++)
    if (plan->tables[t].dim > dim) dim = plan->tables[t].dim;
  size_t room = max_message_bytes > 4096 ? max_message_bytes - 4096 : 0;
  size_t n = room / (4 * (size_t)dim + 10);
  return n < 1 ? 1 : n > ((size_t)1 << 22) ? (size_t)1 << 22 : n;
}

static void budget_refuse(rpc_service *s, size_t need, size_t held, rpc_reply *r) {
  s->budget_refused++;
  r->status = RPC_RESOURCE_EXHAUSTED;
  snprintf(r->msg, sizeof r->msg,
           "in-flight memory budget: %s%zu of the %zu bytes are held by calls in flight, "
           "waited %g s (serve --inflight-mb); try again",
           need ? "this call needs more room than is free: " : "", held, s->budget,
           s->budget_wait_s);
  (void)need;
}

/* Take need bytes of the in-flight budget for the call answering into r
 * (r->held grows); a call holding all that is in flight is always let
 * through. No room: with defer, RPC_DEFERRED at once (the server calls
 * again later); else wait up to budget_wait_s for room, then
 * RESOURCE_EXHAUSTED with the numbers in r. Not with s->mu held. */
static int budget_take(rpc_service *s, size_t need, int defer, rpc_reply *r) {
  pthread_mutex_lock(&s->mu);
  if (s->inflight > r->held && s->inflight + need > s->budget && defer) {
    pthread_mutex_unlock(&s->mu);
    r->status = RPC_DEFERRED;
    return r->status;
  }
  pthread_mutex_unlock(&s->mu);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  double w = s->budget_wait_s;
  until.tv_sec += (time_t)w;
  until.tv_nsec += (long)((w - (double)(time_t)w) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&s->mu);
  int timed_out = 0;
  while (s->inflight > r->held && s->inflight + need > s->budget && !timed_out)
    timed_out = pthread_cond_timedwait(&s->room, &s->mu, &until) == ETIMEDOUT;
  if (s->inflight > r->held && s->inflight + need > s->budget) {
    budget_refuse(s, need, s->inflight - r->held, r);
    pthread_mutex_unlock(&s->mu);
    return r->status;
  }
  s->inflight += need;
  r->held += need;
  pthread_mutex_unlock(&s->mu);
  return RPC_OK;
}

void rpc_service_release(rpc_service *s, size_t bytes) {
  if (!bytes) return;
  pthread_mutex_lock(&s->mu);
  s->inflight -= bytes < s->inflight ? bytes : s->inflight;
  s->budget_gen++;
  pthread_cond_broadcast(&s->room);
  pthread_mutex_unlock(&s->mu);
}

uint64_t rpc_service_budget_gen(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t g = s->budget_gen;
  pthread_mutex_unlock(&s->mu);
  return g;
}

double rpc_service_budget_wait_s(const rpc_service *s) { return s->budget_wait_s; }

void rpc_service_refuse_busy(rpc_service *s, rpc_reply *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_lock(&s->mu);
  budget_refuse(s, 0, s->inflight, r);
  s->failed++;
  pthread_mutex_unlock(&s->mu);
}

int rpc_service_flush(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  int rc = emb_store_flush(s->store);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

#define FAIL(r, code, ...)                               \
  do {                                                   \
    (r)->status = (code);                                \
    snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__);    \
    goto out;                                            \
  } while (0)

static void served_list(const rpc_service *s, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < s->n_shards && at + 12 < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? "," : "", s->shards[i]);
}

/* Checks shared by Lookup and Push: header, then per table its id, ids in
 * range and on a served shard. Fills idx[i] = plan index of tables[i].
 * Returns RPC_OK or a status with the message in r. */
static int check_header(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r) {
  if (!h) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header: missing");
    return r->status;
  }
  if (!h->plan_fingerprint || strcmp(h->plan_fingerprint, s->fp)) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg,
             "header.plan_fingerprint: request made under plan %.16s..., this server serves plan "
             "%.16s...",
             h->plan_fingerprint && *h->plan_fingerprint ? h->plan_fingerprint : "(none)", s->fp);
    return r->status;
  }
  if (h->world_size < 1 || h->rank < 0 || h->rank >= h->world_size) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header: rank %d of world size %d", h->rank, h->world_size);
    return r->status;
  }
  if (h->world_size > SVC_MAX_WORLD) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header.world_size %d: at most %d trainer ranks",
             h->world_size, SVC_MAX_WORLD);
    return r->status;
  }
  if (h->step < 0) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header.step %lld: negative", (long long)h->step);
    return r->status;
  }
  if (h->max_staleness < 0) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg,
             "header.max_staleness %d: must be >= 0 (0: sync mode, S >= 1: async with bound S)",
             h->max_staleness);
    return r->status;
  }
  if (h->parts < 0 || h->parts > RPC_COORD_MAX_PARTS ||
      (h->parts > 1 && (h->part < 0 || h->part >= h->parts))) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header: part %d of %d parts (at most %d parts)", h->part,
             h->parts, RPC_COORD_MAX_PARTS);
    return r->status;
  }
  if (!h->job_id || strlen(h->job_id) >= RPC_COORD_JOB_MAX) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header.job_id: at most %zu bytes",
             (size_t)RPC_COORD_JOB_MAX - 1);
    return r->status;
  }
  return RPC_OK;
}

static int check_ids(rpc_service *s, const char *what, size_t i, uint32_t table_id,
                     const uint64_t *ids, size_t n, int *idx, uint8_t *seen, size_t *total,
                     rpc_reply *r) {
  int t = emb_plan_table_index(s->plan, table_id);
  if (t < 0) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "%s[%zu].table_id %u: no such table in the plan", what, i,
             table_id);
    return r->status;
  }
  if (seen[t]) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "%s[%zu].table_id %u: table given twice", what, i, table_id);
    return r->status;
  }
  seen[t] = 1;
  *idx = t;
  *total += n;
  if (*total > s->max_ids) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "%s: more than %zu ids in one request", what, s->max_ids);
    return r->status;
  }
  const emb_table *tb = &s->plan->tables[t];
  for (size_t k = 0; k < n; k++) {
    if (tb->rows != EMB_ROWS_UNBOUNDED && ids[k] >= tb->rows) {
      r->status = RPC_INVALID_ARGUMENT;
      snprintf(r->msg, sizeof r->msg, "%s[%zu].ids[%zu]: row id %llu of table %u (%s) is out of range 0..%llu",
               what, i, k, (unsigned long long)ids[k], table_id, tb->name,
               (unsigned long long)(tb->rows - 1));
      return r->status;
    }
    int sh = emb_plan_shard_of(s->plan, t, ids[k]);
    if (!s->served[sh]) {
      char list[256];
      served_list(s, list, sizeof list);
      r->status = RPC_FAILED_PRECONDITION;
      snprintf(r->msg, sizeof r->msg,
               "%s[%zu].ids[%zu]: row %llu of table %u (%s) lives on shard %d; this server serves shard(s) %s",
               what, i, k, (unsigned long long)ids[k], table_id, tb->name, sh, list);
      return r->status;
    }
  }
  return RPC_OK;
}

/* Rows left by a crash are not served until a Restore. */
static int check_clean(rpc_service *s, rpc_reply *r) {
  pthread_mutex_lock(&s->mu);
  int unclean = s->unclean;
  pthread_mutex_unlock(&s->mu);
  if (!unclean) return RPC_OK;
  r->status = RPC_FAILED_PRECONDITION;
  snprintf(r->msg, sizeof r->msg, "%s", RPC_MSG_UNCLEAN);
  return r->status;
}

/* Lookup and Push requests decoded in place (lookup_decode, push_decode):
 * one walk of the wire format fills protobuf-c's structs as views, owning
 * nothing (no *_free_unpacked). A table's ids_fixed (8-byte little-endian
 * ids; this host is little-endian, checked above) and a Push's grads point
 * into the request bytes when they lie aligned there (8 and 4 bytes), else
 * into a copy in the call's scratch; varint ids are decoded into the
 * scratch, and the header's two strings copied into it NUL-terminated.
 * The scratch comes from the service's pool (one per call in flight, kept
 * between calls), so a call allocates nothing once its thread's scratch
 * has grown to the size of its requests. */
/* What the first walk of a request's table found. */
typedef struct {
  const uint8_t *p;     /* the TableIds (TableGrads) bytes */
  size_t n;
  uint32_t table_id;
  size_t n_var, n_fix;  /* ids given as varints; as fixed64 */
  int fix_fields;       /* ids_fixed fields seen */
  const uint8_t *fix;   /* the first one's ids */
  const uint8_t *grads; /* Push: the (last) grads field */
  size_t grads_len;
} table_scan;

typedef struct svc_scratch {
  struct svc_scratch *next; /* the pool's free list */
  Shardrec__V1__RequestHeader h;
  char fp[EMB_FP_HEX + 1], job[RPC_COORD_JOB_MAX + 1];
  Shardrec__V1__LookupRequest lq;
  Shardrec__V1__PushRequest pq;
  /* per request table, [cap_req] */
  Shardrec__V1__TableIds *ti, **tip;
  Shardrec__V1__TableGrads *tg, **tgp;
  table_scan *scan;
  size_t *rows_at;
  int *idx;
  size_t cap_req;
  /* per plan table, [n_tables + 1] */
  uint8_t *seen;
  const uint64_t **ids;
  size_t *counts;
  float **outp;
  const float **grads;
  /* the ids (and grads) that are not read in place, and the Push's set */
  uint64_t *idbuf, *hash;
  float *gbuf;
  size_t cap_id, cap_hash, cap_g;
  uint64_t in_place, copied; /* ids of this call, for Stats */
} svc_scratch;

#define SCRATCH_KEEP ((size_t)8 << 20) /* bytes of buffers a pooled scratch keeps */

static void scratch_free(svc_scratch *x) {
  if (!x) return;
  free(x->ti), free(x->tip), free(x->tg), free(x->tgp), free(x->scan);
  free(x->rows_at), free(x->idx), free(x->seen), free(x->ids), free(x->counts);
  free(x->outp), free(x->grads), free(x->idbuf), free(x->hash), free(x->gbuf);
  free(x);
}

/* *p grown to at least n elements of size bytes (contents dropped). */
static int grow(void **p, size_t *cap, size_t n, size_t size) {
  if (n <= *cap) return 0;
  size_t c = *cap * 2 > n ? *cap * 2 : n;
  void *q = malloc(c * size);
  if (!q) return -1;
  free(*p);
  *p = q;
  *cap = c;
  return 0;
}

static void scratch_pool_free(rpc_service *s) {
  while (s->pool) {
    svc_scratch *x = s->pool;
    s->pool = x->next;
    scratch_free(x);
  }
}

/* Room for n tables of a request in x. */
static int scratch_tables(svc_scratch *x, size_t n) {
  if (n <= x->cap_req) return 0;
  size_t c = x->cap_req * 2 > n ? x->cap_req * 2 : n + 4;
  void *a = realloc(x->ti, c * sizeof *x->ti);
  if (!a) return -1;
  x->ti = a;
  if (!(a = realloc(x->tg, c * sizeof *x->tg))) return -1;
  x->tg = a;
  if (!(a = realloc(x->scan, c * sizeof *x->scan))) return -1;
  x->scan = a;
  free(x->tip), free(x->tgp), free(x->rows_at), free(x->idx);
  x->tip = malloc(c * sizeof *x->tip);
  x->tgp = malloc(c * sizeof *x->tgp);
  x->rows_at = malloc(c * sizeof *x->rows_at);
  x->idx = malloc(c * sizeof *x->idx);
  if (!x->tip || !x->tgp || !x->rows_at || !x->idx) {
    x->cap_req = 0;
    return -1;
  }
  x->cap_req = c;
  return 0;
}

/* A scratch for one call (the pool's, else a new one); NULL out of memory. */
static svc_scratch *scratch_take(rpc_service *s) {
  pthread_mutex_lock(&s->pool_mu);
  svc_scratch *x = s->pool;
  if (x) s->pool = x->next;
  pthread_mutex_unlock(&s->pool_mu);
  if (x) return x;
  const size_t nt = (size_t)s->plan->n_tables + 1;
  if (!(x = calloc(1, sizeof *x))) return NULL;
  x->seen = malloc(nt);
  x->ids = malloc(nt * sizeof *x->ids);
  x->counts = malloc(nt * sizeof *x->counts);
  x->outp = malloc(nt * sizeof *x->outp);
  x->grads = malloc(nt * sizeof *x->grads);
  if (!x->seen || !x->ids || !x->counts || !x->outp || !x->grads || scratch_tables(x, 4)) {
    scratch_free(x);
    return NULL;
  }
  return x;
}

/* x back into the pool (its buffers dropped past SCRATCH_KEEP), its call's
 * id counts into the service's. */
static void scratch_give(rpc_service *s, svc_scratch *x) {
  if (!x) return;
  if (x->cap_id * 8 + x->cap_hash * 8 + x->cap_g * 4 > SCRATCH_KEEP) {
    free(x->idbuf), free(x->hash), free(x->gbuf);
    x->idbuf = x->hash = NULL;
    x->gbuf = NULL;
    x->cap_id = x->cap_hash = x->cap_g = 0;
  }
  pthread_mutex_lock(&s->pool_mu);
  s->ids_in_place += x->in_place;
  s->ids_copied += x->copied;
  x->in_place = x->copied = 0;
  x->next = s->pool;
  s->pool = x;
  pthread_mutex_unlock(&s->pool_mu);
}

/* The decoder's place in a request: the message's name and first byte,
 * for refusals that say what and where. */
typedef struct {
  const char *msg; /* "shardrec.v1.LookupRequest" */
  const uint8_t *base;
  size_t len;
  rpc_reply *r;
} wire_rd;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* Refuse the request: INVALID_ARGUMENT, "not a valid MSG (N bytes): FIELD
 * at offset K: WHY". */
static int wire_bad(const wire_rd *d, const uint8_t *at, const char *field, const char *why) {
  d->r->status = RPC_INVALID_ARGUMENT;
  snprintf(d->r->msg, sizeof d->r->msg, "not a valid %s (%zu bytes): %s at offset %zu: %s",
           d->msg, d->len, field, (size_t)(at - d->base), why);
  return -1;
}

/* A varint at *p (before end) into *v, *p past it: 0, -1 cut off by end,
 * -2 longer than 10 bytes. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  const uint8_t *q = *p;
  uint64_t x = 0;
  for (unsigned sh = 0; sh < 70; sh += 7) {
    if (q == end) return -1;
    const uint8_t b = *q++;
    x |= (uint64_t)(b & 0x7f) << sh;
    if (!(b & 0x80)) {
      *p = q;
      *v = x;
      return 0;
    }
  }
  return -2;
}

/* The name of field num of the message in ("tables[2]"; "" the request),
 * whose fields are names[n_names] (NULL: unknown), into buf[64]. */
typedef struct {
  const char *in;
  const char *const *names;
  uint32_t n_names;
} wire_msg;

static const char *field_name(char *buf, const wire_msg *m, uint32_t num) {
  const char *dot = *m->in ? "." : "";
  if (num < m->n_names && m->names[num]) snprintf(buf, 64, "%s%s%s", m->in, dot, m->names[num]);
  else snprintf(buf, 64, "%s%sfield %u", m->in, *m->in ? " " : "", num);
  return buf;
}

/* One field as wire_field read it: where it starts, its number and wire
 * type, and its value: a varint or the bits of a fixed-size one in v; a
 * length-delimited one's bytes at val[n], inside the request (v: n). */
typedef struct {
  const uint8_t *at;
  uint32_t num;
  int wt;
  uint64_t v;
  const uint8_t *val;
  size_t n;
} wire_f;

/* The next field of message m at [*p, end) into *w, *p past it. 0, or -1
 * with the refusal in d. */
static int wire_field(const wire_rd *d, const uint8_t **p, const uint8_t *end, const wire_msg *m,
                      wire_f *w) {
  const uint8_t *at = *p;
  char f[64];
  uint64_t tag;
  *w = (wire_f){.at = at};
  int e = wire_varint(p, end, &tag);
  if (e || tag > 0xffffffffu || (tag >> 3) == 0)
    return wire_bad(d, at, *m->in ? m->in : "the request",
                    e == -1 ? "field tag cut off" : "field tag out of range");
  w->num = (uint32_t)(tag >> 3);
  w->wt = (int)(tag & 7);
  const uint8_t *vat = *p;
  switch (w->wt) {
    case WT_VARINT:
      if ((e = wire_varint(p, end, &w->v)))
        return wire_bad(d, vat, field_name(f, m, w->num),
                        e == -1 ? "varint cut off" : "varint longer than 10 bytes");
      return 0;
    case WT_I64:
    case WT_I32: {
      const size_t n = w->wt == WT_I64 ? 8 : 4;
      if ((size_t)(end - *p) < n)
        return wire_bad(d, vat, field_name(f, m, w->num), "fixed-size value cut off");
      memcpy(&w->v, *p, n); /* little-endian host */
      *p += n;
      return 0;
    }
    case WT_LEN:
      if ((e = wire_varint(p, end, &w->v)))
        return wire_bad(d, vat, field_name(f, m, w->num),
                        e == -1 ? "length cut off" : "length longer than 10 bytes");
      if (w->v > (uint64_t)(end - *p))
        return wire_bad(d, vat, field_name(f, m, w->num), "length past the end");
      w->val = *p;
      w->n = (size_t)w->v;
      *p += w->n;
      return 0;
  }
  return wire_bad(d, at, field_name(f, m, w->num), "wire type 3, 4, 6 or 7 (groups or none)");
}

/* A known field of number num seen with wire type wt where want was
 * expected: refused naming it. */
static int wire_type_bad(const wire_rd *d, const uint8_t *at, const char *field, int wt) {
  char why[64];
  snprintf(why, sizeof why, "wire type %d is not this field's", wt);
  return wire_bad(d, at, field, why);
}

/* s[n] into dst[cap] NUL-terminated, at most cap - 1 bytes (a longer one
 * stays longer than any value it is checked against). */
static void wire_str(char *dst, size_t cap, const uint8_t *s, size_t n) {
  if (n > cap - 1) n = cap - 1;
  memcpy(dst, s, n);
  dst[n] = 0;
}

/* The string field's bytes s[n] hold no control character (below 0x20, or
 * 0x7f): a NUL would cut the C string made of them short, and a newline
 * would forge a line of the server's log. 0, or -1 with the refusal in d
 * naming the field and the byte's offset. */
static int wire_text(const wire_rd *d, const char *field, const uint8_t *s, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (s[k] < 0x20 || s[k] == 0x7f) {
      char why[96];
      snprintf(why, sizeof why, "byte 0x%02x in a string (a control character)", s[k]);
      return wire_bad(d, s + k, field, why);
    }
  return 0;
}

/* Every string field of the message desc at [p, end) (in: its field name
 * in the request, "" the request), those of the messages in it too,
 * through wire_text: the check protobuf-c's unpack leaves out, for the
 * requests it decodes. 0, or -1 with the refusal in d (a malformed field
 * too). */
static int wire_texts(const wire_rd *d, const ProtobufCMessageDescriptor *desc, const char *in,
                      const uint8_t *p, const uint8_t *end) {
  const wire_msg m = {in, NULL, 0};
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(desc, w.num);
    if (!fd || w.wt != WT_LEN) continue; /* unknown, or a wrong type unpack refuses */
    char f[64];
    snprintf(f, sizeof f, "%s%s%s", in, *in ? "." : "", fd->name);
    if (fd->type == PROTOBUF_C_TYPE_STRING && wire_text(d, f, w.val, w.n)) return -1;
    if (fd->type == PROTOBUF_C_TYPE_MESSAGE &&
        wire_texts(d, fd->descriptor, f, w.val, w.val + w.n))
      return -1;
  }
  return 0;
}

/* The request in[len], a desc, passes wire_texts: 0, or -1 with the
 * refusal (INVALID_ARGUMENT) in r. */
static int texts_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *in, size_t len,
                    rpc_reply *r) {
  const wire_rd d = {desc->name, in, len, r};
  return wire_texts(&d, desc, "", in, in + len);
}

/* The RequestHeader at [p, end) into x->h (fields seen again override:
 * protobuf's merge of a message given twice). */
static int header_decode(const wire_rd *d, svc_scratch *x, const uint8_t *p, const uint8_t *end) {
  static const char *const names[9] = {NULL, "plan_fingerprint", "job_id", "step", "rank",
                                       "world_size", "max_staleness", "part", "parts"};
  const wire_msg m = {"header", names, 9};
  char f[64];
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    if (w.num > 8) continue; /* unknown: skipped */
    if ((w.num <= 2) != (w.wt == WT_LEN) || (w.num > 2 && w.wt != WT_VARINT))
      return wire_type_bad(d, w.at, field_name(f, &m, w.num), w.wt);
    if (w.num <= 2 && wire_text(d, field_name(f, &m, w.num), w.val, w.n)) return -1;
    if (w.num == 1) wire_str(x->fp, sizeof x->fp, w.val, w.n);
    else if (w.num == 2) wire_str(x->job, sizeof x->job, w.val, w.n);
    else if (w.num == 3) x->h.step = (int64_t)w.v;
    else {
      const int32_t i = (int32_t)(uint32_t)w.v;
      if (w.num == 4) x->h.rank = i;
      else if (w.num == 5) x->h.world_size = i;
      else if (w.num == 6) x->h.max_staleness = i;
      else if (w.num == 7) x->h.part = i;
      else x->h.parts = i;
    }
  }
  return 0;
}


static const char *const table_ids_names[4] = {NULL, "table_id", "ids", "ids_fixed"};
static const char *const table_grads_names[5] = {NULL, "table_id", "ids", "grads", "ids_fixed"};

/* First walk of tables[i] (a TableIds, or with push a TableGrads) at
 * [p, end): structure checked, ids counted. */
static int table_walk(const wire_rd *d, size_t i, int push, const uint8_t *p, const uint8_t *end,
                      table_scan *t) {
  const uint32_t fix_num = push ? 4 : 3;
  char in[32], f[64];
  snprintf(in, sizeof in, "tables[%zu]", i);
  const wire_msg m = {in, push ? table_grads_names : table_ids_names, push ? 5 : 4};
  memset(t, 0, sizeof *t);
  t->p = p;
  t->n = (size_t)(end - p);
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    const int want = w.num == 1 ? WT_VARINT : w.num == fix_num ? WT_I64 : w.num <= 3 ? WT_LEN : -1;
    if (want >= 0 && w.wt != want && (w.num == 1 || (push && w.num == 3) || w.wt != WT_LEN) &&
        !(w.num == 2 && w.wt == WT_VARINT))
      return wire_type_bad(d, w.at, field_name(f, &m, w.num), w.wt);
    if (w.num == 1) {
      t->table_id = (uint32_t)w.v;
    } else if (w.num == 2 && w.wt == WT_VARINT) {
      t->n_var++;
    } else if (w.num == 2) { /* packed varints */
      for (size_t k = 0; k < w.n; k++) t->n_var += w.val[k] < 0x80;
      if (w.n && w.val[w.n - 1] >= 0x80)
        return wire_bad(d, w.val + w.n - 1, field_name(f, &m, w.num), "last varint cut off");
    } else if (w.num == fix_num && w.wt == WT_I64) { /* one id, not packed: copied */
      t->n_fix++;
      t->fix_fields += 2;
    } else if (w.num == fix_num) { /* packed fixed64 */
      if (w.n % 8) return wire_bad(d, w.val, field_name(f, &m, w.num), "length not a multiple of 8 bytes");
      if (w.n && !t->fix_fields++) t->fix = w.val;
      t->n_fix += w.n / 8;
    } else if (push && w.num == 3) {
      t->grads = w.val;
      t->grads_len = w.n;
    }
  }
  return 0;
}

/* Second walk of tables[i] (scanned as *t): its ids in order into out
 * (varints decoded, fixed64 copied). */
static int table_copy(const wire_rd *d, size_t i, int push, const table_scan *t, uint64_t *out) {
  const uint32_t fix_num = push ? 4 : 3;
  const uint8_t *p = t->p, *end = t->p + t->n;
  char in[32], f[64];
  snprintf(in, sizeof in, "tables[%zu]", i);
  const wire_msg m = {in, push ? table_grads_names : table_ids_names, push ? 5 : 4};
  while (p < end) {
    wire_f w;
    if (wire_field(d, &p, end, &m, &w)) return -1;
    if (w.num == 2 && w.wt == WT_VARINT) {
      *out++ = w.v;
    } else if (w.num == 2) {
      for (const uint8_t *q = w.val, *qe = w.val + w.n; q < qe;)
        if (wire_varint(&q, qe, out++))
          return wire_bad(d, q, field_name(f, &m, w.num), "varint longer than 10 bytes");
    } else if (w.num == fix_num && w.wt == WT_I64) {
      *out++ = w.v;
    } else if (w.num == fix_num && w.n) {
      memcpy(out, w.val, w.n); /* little-endian host */
      out += w.n / 8;
    }
  }
  return 0;
}

/* Whether a table's ids are read where they lie: one ids_fixed field,
 * 8-byte aligned in memory. */
static int scan_in_place(const table_scan *t) {
  return !t->n_var && t->fix_fields == 1 && t->n_fix && t->fix && !((uintptr_t)t->fix & 7u);
}

static int scratch_nomem(rpc_reply *r) {
  r->status = RPC_RESOURCE_EXHAUSTED;
  snprintf(r->msg, sizeof r->msg, "out of memory");
  return -1;
}

/* tables[i]'s view (scanned as *t, its n ids at ids) in x->ti or, with
 * push, x->tg, its gradients copied to g when not 4-byte aligned; returns
 * where the next copy goes. */
static float *table_view(svc_scratch *x, size_t i, int push, const table_scan *t, uint64_t *ids,
                         size_t n, float *g) {
  if (!push) {
    shardrec__v1__table_ids__init(&x->ti[i]);
    x->ti[i].table_id = t->table_id;
    x->ti[i].n_ids = n;
    x->ti[i].ids = ids;
    x->tip[i] = &x->ti[i];
    return g;
  }
  Shardrec__V1__TableGrads *tg = &x->tg[i];
  shardrec__v1__table_grads__init(tg);
  tg->table_id = t->table_id;
  tg->n_ids = n;
  tg->ids = ids;
  tg->grads.len = t->grads_len;
  tg->grads.data = (uint8_t *)(uintptr_t)t->grads; /* read only */
  if ((uintptr_t)t->grads & 3u) {
    memcpy(g, t->grads, t->grads_len);
    tg->grads.data = (uint8_t *)g;
    g += (t->grads_len + 3) / 4;
  }
  x->tgp[i] = tg;
  return g;
}

/* The views of the request's tables[nt] (scanned into x->scan) in x->ti
 * (Lookup) or x->tg (push): ids and grads in place or copied. */
static int tables_fill(const rpc_service *s, svc_scratch *x, const wire_rd *d, int push,
                       size_t nt) {
  size_t need = 0, gneed = 0;
  for (size_t i = 0; i < nt; i++) {
    const table_scan *t = &x->scan[i];
    if (t->n_var && t->n_fix) {
      d->r->status = RPC_INVALID_ARGUMENT;
      snprintf(d->r->msg, sizeof d->r->msg,
               "tables[%zu].table_id %u: both ids and ids_fixed are given (send one)", i,
               t->table_id);
      return -1;
    }
    if (!scan_in_place(t)) need += t->n_var + t->n_fix;
    if (push && ((uintptr_t)t->grads & 3u)) gneed += (t->grads_len + 3) / 4;
  }
  if (need > s->max_ids) {
    d->r->status = RPC_INVALID_ARGUMENT;
    snprintf(d->r->msg, sizeof d->r->msg, "tables: more than %zu ids in one request", s->max_ids);
    return -1;
  }
  if (grow((void **)&x->idbuf, &x->cap_id, need, sizeof *x->idbuf) ||
      grow((void **)&x->gbuf, &x->cap_g, gneed, sizeof *x->gbuf))
    return scratch_nomem(d->r);
  uint64_t *id = x->idbuf;
  float *g = x->gbuf;
  for (size_t i = 0; i < nt; i++) {
    const table_scan *t = &x->scan[i];
    const size_t n = t->n_var + t->n_fix;
    uint64_t *ids = NULL;
    if (n && scan_in_place(t)) {
      ids = (uint64_t *)(uintptr_t)t->fix; /* read only */
      x->in_place += n;
    } else if (n) {
      if (table_copy(d, i, push, t, id)) return -1;
      ids = id;
      id += n;
      x->copied += n;
    }
    g = table_view(x, i, push, t, ids, n, g);
  }
  return 0;
}

/* A Lookup (push 0) or Push request in[len] decoded in place into x->lq
 * or x->pq: the views protobuf-c's unpack would give (header NULL when
 * absent), pointing into in and x, valid while both are. 0, or -1 with
 * the refusal in r: INVALID_ARGUMENT naming the field and its offset in
 * the request, RESOURCE_EXHAUSTED out of memory. */
static int req_decode(const rpc_service *s, svc_scratch *x, int push, const uint8_t *in,
                      size_t len, rpc_reply *r) {
  static const char *const lookup_names[4] = {NULL, "header", "tables", "prefetch_only"};
  static const char *const push_names[4] = {NULL, "header", "learning_rate", "tables"};
  const wire_rd d = {push ? "shardrec.v1.PushRequest" : "shardrec.v1.LookupRequest", in, len, r};
  const wire_msg m = {"", push ? push_names : lookup_names, 4};
  shardrec__v1__request_header__init(&x->h);
  x->fp[0] = x->job[0] = 0;
  x->h.plan_fingerprint = x->fp;
  x->h.job_id = x->job;
  int has_header = 0, prefetch = 0;
  float lr = 0;
  size_t nt = 0;
  const uint8_t *p = in, *end = in + len;
  while (p < end) {
    wire_f w;
    if (wire_field(&d, &p, end, &m, &w)) return -1;
    if (w.num == 1) {
      if (w.wt != WT_LEN) return wire_type_bad(&d, w.at, "header", w.wt);
      if (header_decode(&d, x, w.val, w.val + w.n)) return -1;
      has_header = 1;
    } else if (w.num == (push ? 3u : 2u)) {
      char field[32];
      snprintf(field, sizeof field, "tables[%zu]", nt);
      if (w.wt != WT_LEN) return wire_type_bad(&d, w.at, field, w.wt);
      /* More tables than the plan has: one is given twice (or is not the
       * plan's), refused before the scratch grows with the entries. */
      if (nt == (size_t)s->plan->n_tables)
        return wire_bad(&d, w.at, field, "more tables than the plan's (a table appears w.at most once)");
      if (scratch_tables(x, nt + 1)) return scratch_nomem(r);
      if (table_walk(&d, nt, push, w.val, w.val + w.n, &x->scan[nt])) return -1;
      nt++;
    } else if (!push && w.num == 3) {
      if (w.wt != WT_VARINT) return wire_type_bad(&d, w.at, "prefetch_only", w.wt);
      prefetch = w.v != 0;
    } else if (push && w.num == 2) {
      if (w.wt != WT_I32) return wire_type_bad(&d, w.at, "learning_rate", w.wt);
      const uint32_t b = (uint32_t)w.v;
      memcpy(&lr, &b, sizeof lr);
    }
  }
  if (tables_fill(s, x, &d, push, nt)) return -1;
  if (push) {
    shardrec__v1__push_request__init(&x->pq);
    x->pq.header = has_header ? &x->h : NULL;
    x->pq.learning_rate = lr;
    x->pq.n_tables = nt;
    x->pq.tables = x->tgp;
  } else {
    shardrec__v1__lookup_request__init(&x->lq);
    x->lq.header = has_header ? &x->h : NULL;
    x->lq.n_tables = nt;
    x->lq.tables = x->tip;
    x->lq.prefetch_only = prefetch;
  }
  return 0;
}

static int lookup_decode(const rpc_service *s, svc_scratch *x, const uint8_t *in, size_t len,
                         rpc_reply *r) {
  return req_decode(s, x, 0, in, len, r);
}

static int push_decode(const rpc_service *s, svc_scratch *x, const uint8_t *in, size_t len,
                       rpc_reply *r) {
  return req_decode(s, x, 1, in, len, r);
}

/* Whether ids[n] holds a value twice (the first repeat into *twice), in
 * one pass over an open-addressing set in scratch: cap (a power of two,
 * >= 2n) slots then cap / 8 bytes of occupancy bits. (A qsort of the ids
 * was a fifth of a 4096-id Push's handling.) */
static int ids_repeated(const uint64_t *ids, size_t n, uint64_t *scratch, size_t cap,
                        uint64_t *twice) {
  uint8_t *used = (uint8_t *)(scratch + cap);
  memset(used, 0, cap / 8);
  for (size_t k = 0; k < n; k++) {
    uint64_t h = ids[k] * 0x9e3779b97f4a7c15ULL;
    for (size_t at = (size_t)(h >> 32) & (cap - 1);; at = (at + 1) & (cap - 1)) {
      if (!(used[at / 8] & (1u << (at % 8)))) {
        used[at / 8] |= (uint8_t)(1u << (at % 8));
        scratch[at] = ids[k];
        break;
      }
      if (scratch[at] == ids[k]) {
        *twice = ids[k];
        return 1;
      }
    }
  }
  return 0;
}

static void pack_reply(rpc_reply *r, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  r->out = malloc(n ? n : 1);
  if (!r->out) {
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "out of memory for a %zu-byte answer", n);
    return;
  }
  r->out_len = protobuf_c_message_pack(m, r->out);
}
/* The LookupResponse is written by hand, so that the store writes the rows
 * straight into the answer (no TableRows buffers, no pack copy): per table
 * a TableRows of table_id (1), dim (2), a padding field and rows (3), then
 * incarnation (2). The padding is an unknown length-delimited field, 15,
 * of 2 to 5 bytes, there when needed so that each table's rows start
 * 4-byte aligned in the answer (the store writes floats); every protobuf
 * decoder skips it. */
#define PAD_FIELD_TAG 0x7a /* field 15, wire type 2 */

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static uint8_t *varint_put(uint8_t *p, uint64_t v) {
  while (v >= 0x80) *p++ = (uint8_t)(v | 0x80), v >>= 7;
  *p++ = (uint8_t)v;
  return p;
}

/* One table's TableRows from its start at: its content's length (*inner),
 * the padding field's size (*pad: 0, or 2..9 bytes: tag, length, zeros)
 * and where its rows begin, a multiple of 4. Of the sizes 2..9 the header's
 * varint changes length at most once, so four consecutive ones share it
 * and one of them aligns the rows. */
static size_t table_layout(uint32_t table_id, int dim, size_t rows_len, size_t at,
                           size_t *inner, size_t *pad) {
  const size_t fixed = 1 + varint_len(table_id) + 1 + varint_len((uint64_t)dim) + 1 +
                       varint_len(rows_len) + rows_len;
  for (size_t p = 0; p <= 9; p += p ? 1 : 2) {
    const size_t in = fixed + p, from = at + 1 + varint_len(in) + in - rows_len;
    if (from % 4 == 0) {
      *inner = in;
      *pad = p;
      return from;
    }
  }
  assert(!"no padding aligns the rows"); /* unreachable: see above */
  return 0;
}

/* Offsets of each table's rows in the answer (rows_at[n_tables]) and the
 * answer's length. Always 0: check_answer has bounded the answer's size. */
static int answer_layout(const rpc_service *s, const Shardrec__V1__LookupRequest *q,
                         const int *idx, size_t *rows_at, size_t *len) {
  size_t at = 0, inner, pad;
  for (size_t i = 0; i < q->n_tables; i++) {
    const int dim = s->plan->tables[idx[i]].dim;
    const size_t rl = q->tables[i]->n_ids * (size_t)dim * sizeof(float);
    rows_at[i] = table_layout(q->tables[i]->table_id, dim, rl, at, &inner, &pad);
    at = rows_at[i] + rl;
  }
  *len = at + 1 + varint_len(s->incarnation);
  return 0;
}

/* Everything of the answer but the rows (left for the store at rows_at). */
static void answer_write(const rpc_service *s, const Shardrec__V1__LookupRequest *q,
                         const int *idx, const size_t *rows_at, uint8_t *out, size_t len) {
  size_t at = 0, inner, pad;
  for (size_t i = 0; i < q->n_tables; i++) {
    const uint32_t id = q->tables[i]->table_id;
    const int dim = s->plan->tables[idx[i]].dim;
    const size_t rl = q->tables[i]->n_ids * (size_t)dim * sizeof(float);
    table_layout(id, dim, rl, at, &inner, &pad);
    uint8_t *p = out + at;
    *p++ = 0x0a; /* LookupResponse.tables */
    p = varint_put(p, inner);
    *p++ = 0x08; /* TableRows.table_id */
    p = varint_put(p, id);
    *p++ = 0x10; /* TableRows.dim */
    p = varint_put(p, (uint64_t)dim);
    if (pad) {
      *p++ = PAD_FIELD_TAG;
      *p++ = (uint8_t)(pad - 2);
      memset(p, 0, pad - 2);
      p += pad - 2;
    }
    *p++ = 0x1a; /* TableRows.rows */
    p = varint_put(p, rl);
    at = rows_at[i] + rl;
  }
  uint8_t *p = out + at;
  *p++ = 0x10; /* LookupResponse.incarnation */
  p = varint_put(p, s->incarnation);
  assert((size_t)(p - out) == len); /* answer_layout's length */
  (void)len;
}

/* Refuse a Lookup of tables[n] (plan indexes idx) whose answer would not
 * fit the message limit, before anything is allocated for it; else take
 * its share of the in-flight budget (3 x the answer's bound: the rows, the
 * packed answer and gRPC's copy; answer_pinned gives 2 of them back). RPC_OK
 * or a status in r. */
/* The bound on the answer's bytes check_answer takes budget for (3 x). */
static size_t answer_bound(const rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                           const int *idx) {
  size_t answer = 32;
  for (size_t i = 0; i < n; i++)
    answer += tables[i]->n_ids * (size_t)s->plan->tables[idx[i]].dim * sizeof(float) + 16;
  return answer;
}

static int check_answer(rpc_service *s, Shardrec__V1__TableIds *const *tables, size_t n,
                        const int *idx, int defer, rpc_reply *r) {
  size_t ids = 0, rows = 0, answer = answer_bound(s, tables, n, idx);
  int dlo = 0, dhi = 0;
  for (size_t i = 0; i < n; i++) {
    const int dim = s->plan->tables[idx[i]].dim;
    ids += tables[i]->n_ids;
    rows += tables[i]->n_ids * (size_t)dim * sizeof(float);
    if (!i || dim < dlo) dlo = dim;
    if (!i || dim > dhi) dhi = dim;
  }
  if (answer > s->max_msg) {
    char dims[32];
    if (dlo == dhi) snprintf(dims, sizeof dims, "dim %d", dlo);
    else snprintf(dims, sizeof dims, "dims %d..%d", dlo, dhi);
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg,
             "the answer of %zu ids x %s x 4 bytes = %zu bytes of rows does not fit the message "
             "limit of %zu bytes: split the Lookup (Stats gives max_ids and max_message_bytes)",
             ids, dims, rows, s->max_msg);
    return r->status;
  }
  return budget_take(s, 3 * answer, defer, r);
}

/* ---- pinned answers (rpc_service_pin_answers) ---- */

struct rpc_pinned {
  rpc_service *s;                 /* one of s->refs: s outlives this answer */
  void (*unpin)(emb_pins *);      /* the store's pins_release */
  emb_pins *pins;                 /* owned */
  size_t held, rows, bytes;       /* budget share; rows and row bytes pinned */
  uint8_t *head;                  /* [head_len] tags and lengths */
  size_t head_len, n;
  rpc_piece piece[];              /* [n] */
};

const rpc_piece *rpc_pinned_pieces(const rpc_pinned *a, size_t *n, const uint8_t **head,
                                   size_t *head_len) {
  *n = a->n;
  *head = a->head;
  *head_len = a->head_len;
  return a->piece;
}

void rpc_pinned_release(rpc_pinned *a) {
  if (!a) return;
  rpc_service *s = a->s;
  a->unpin(a->pins);
  atomic_fetch_sub(&s->pin_rows, a->rows);
  atomic_fetch_sub(&s->pin_bytes, a->bytes);
  rpc_service_release(s, a->held);
  free(a->head);
  free(a);
  svc_unref(s);
}

void rpc_service_pin_answers(rpc_service *s, size_t min_row_bytes) { s->pin_min = min_row_bytes; }

/* Whether q's answer goes pinned: the store offers it and every table's
 * rows are at least s->pin_min bytes. */
static int answer_pins(const rpc_service *s, const Shardrec__V1__LookupRequest *q, const int *idx) {
  if (!s->pin_min || !s->store->ops->lookup_pinned) return 0;
  for (size_t i = 0; i < q->n_tables; i++)
    if ((size_t)s->plan->tables[idx[i]].dim * sizeof(float) < s->pin_min) return 0;
  return 1;
}

static void piece_head(rpc_pinned *a, uint8_t *from, uint8_t *to) {
  a->piece[a->n++] = (rpc_piece){from, (size_t)(to - from), 1};
}

/* a's pieces over the pinned rows (rows[t][r]): per table a TableRows of
 * table_id (1), dim (2) and rows (3), then incarnation (2), no padding
 * (the store's floats are where they are); the same message protobuf-c
 * packs. */
static void pinned_layout(rpc_pinned *a, const Shardrec__V1__LookupRequest *q, const int *idx,
                          const float *const *const *rows) {
  uint8_t *p = a->head;
  for (size_t i = 0; i < q->n_tables; i++) {
    const uint32_t id = q->tables[i]->table_id;
    const int dim = a->s->plan->tables[idx[i]].dim;
    const size_t rb = (size_t)dim * sizeof(float), rl = q->tables[i]->n_ids * rb;
    const size_t inner = 1 + varint_len(id) + 1 + varint_len((uint64_t)dim) + 1 + varint_len(rl) + rl;
    uint8_t *from = p;
    *p++ = 0x0a; /* LookupResponse.tables */
    p = varint_put(p, inner);
    *p++ = 0x08; /* TableRows.table_id */
    p = varint_put(p, id);
    *p++ = 0x10; /* TableRows.dim */
    p = varint_put(p, (uint64_t)dim);
    *p++ = 0x1a; /* TableRows.rows */
    p = varint_put(p, rl);
    piece_head(a, from, p);
    for (size_t r = 0; r < q->tables[i]->n_ids; r++)
      a->piece[a->n++] = (rpc_piece){(const uint8_t *)rows[idx[i]][r], rb, 0};
    a->rows += q->tables[i]->n_ids;
    a->bytes += rl;
  }
  uint8_t *from = p;
  *p++ = 0x10; /* LookupResponse.incarnation */
  p = varint_put(p, a->s->incarnation);
  piece_head(a, from, p);
  a->head_len = (size_t)(p - a->head);
}

/* Answer q (plan indexes idx, ids set) from the store's memory: the rows
 * pinned (emb_store_ops.lookup_pinned) and r->pinned their pieces, holding
 * r's budget share less the two copies a pinned answer does not make. 1
 * when r is answered (pinned, or failed); 0 when the gather path is to
 * answer instead (not offered, rows too narrow, or the cache too pinned to
 * pin them: the store said SR_ESTATE). */
static int answer_pinned(rpc_service *s, const Shardrec__V1__LookupRequest *q, const int *idx,
                         const emb_idset *set, rpc_reply *r) {
  if (!answer_pins(s, q, idx)) return 0;
  size_t total = 0;
  for (size_t i = 0; i < q->n_tables; i++) total += q->tables[i]->n_ids;
  const int nt = s->plan->n_tables;
  const float **ptr = malloc((total ? total : 1) * sizeof *ptr);
  const float ***rows = calloc((size_t)nt, sizeof *rows);
  rpc_pinned *a = malloc(sizeof *a + (total + q->n_tables + 1) * sizeof(rpc_piece));
  uint8_t *head = malloc(40 * q->n_tables + 16);
  if (!ptr || !rows || !a || !head) {
    free(ptr), free(rows), free(a), free(head);
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "out of memory for the answer");
    return 1;
  }
  for (size_t i = 0, at = 0; i < q->n_tables; at += q->tables[i]->n_ids, i++) rows[idx[i]] = ptr + at;
  pthread_mutex_lock(&s->mu);
  if (q->header->step > s->hi_step) s->hi_step = q->header->step;
  emb_pins *pins = NULL;
  int rc = s->store->ops->lookup_pinned(s->store, q->header->step, set,
                                        (const float **const *)rows, &pins);
  if (rc && rc != SR_ESTATE) snprintf(r->msg, sizeof r->msg, "lookup: %s", emb_store_errmsg(s->store));
  pthread_mutex_unlock(&s->mu);
  if (!rc) {
    *a = (rpc_pinned){.s = s, .unpin = s->store->ops->pins_release, .pins = pins, .head = head};
    pinned_layout(a, q, idx, (const float *const *const *)rows);
    atomic_fetch_add(&s->refs, 1); /* for rpc_pinned_release */
    atomic_fetch_add(&s->pin_rows, a->rows);
    atomic_fetch_add(&s->pin_bytes, a->bytes);
    const size_t back = 2 * answer_bound(s, q->tables, q->n_tables, idx);
    rpc_service_release(s, back < r->held ? back : 0);
    r->held -= back < r->held ? back : 0;
    a->held = r->held; /* given back by rpc_pinned_release */
    r->held = 0;
    r->pinned = a;
    r->out_len = a->head_len + a->bytes;
  } else {
    free(a);
    free(head);
  }
  free(ptr);
  free(rows);
  if (rc == SR_ESTATE) return 0;
  if (rc) r->status = RPC_INTERNAL;
  return 1;
}

/* Hand set (step's ids) to the store's look-ahead, with s->mu held, when
 * step is past every step the store was handed (the contract of
 * emb_store_prefetch: steps in increasing order); else nothing (the
 * Lookup reads then). A refusal or failure is only a lost head start: the
 * Lookup of the step reads and reports. */
static void svc_prefetch(rpc_service *s, int64_t step, const emb_idset *set) {
  if (step <= s->hi_step || !s->store->ops->prefetch) return;
  s->hi_step = step;
  s->prefetched++;
  (void)emb_store_prefetch(s->store, step, set);
}

/* A prefetch_only Lookup (a look-ahead hint): the ids to the store's
 * prefetch, an answer with no rows. Not seen by the coordinator: it parks
 * nothing and fixes no step. */
static void lookup_hint(rpc_service *s, int64_t step, const emb_idset *set, rpc_reply *r) {
  pthread_mutex_lock(&s->mu);
  svc_prefetch(s, step, set);
  pthread_mutex_unlock(&s->mu);
  Shardrec__V1__LookupResponse resp = SHARDREC__V1__LOOKUP_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  pack_reply(r, &resp.base);
}

static void do_lookup(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                      double timeout_s, int pin) {
  const int nt = s->plan->n_tables;
  if (budget_take(s, 2 * len, token != NULL, r)) return; /* the request's copy, decoded form */
  svc_scratch *x = scratch_take(s); /* the decoded form and the arrays below */
  const Shardrec__V1__LookupRequest *q = NULL;
  if (!x) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  if (lookup_decode(s, x, in, len, r)) goto out;
  q = &x->lq;
  if (check_header(s, q->header, r) || check_clean(s, r)) goto out;
  int *idx = x->idx;
  uint8_t *seen = x->seen;
  const uint64_t **ids = x->ids;
  size_t *counts = x->counts;
  float **outp = x->outp;
  size_t *rows_at = x->rows_at;
  memset(seen, 0, (size_t)nt);
  memset(ids, 0, (size_t)nt * sizeof *ids);
  memset(counts, 0, (size_t)nt * sizeof *counts);
  size_t total = 0;
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableIds *ti = q->tables[i];
    if (check_ids(s, "tables", i, ti->table_id, ti->ids, ti->n_ids, &idx[i], seen, &total, r))
      goto out;
    ids[idx[i]] = ti->ids;
    counts[idx[i]] = ti->n_ids;
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  if (q->prefetch_only) {
    lookup_hint(s, q->header->step, &set, r);
    goto out;
  }
  {
    rpc_coord_call k = coord_call(q->header);
    pthread_mutex_lock(&s->mu);
    rpc_coord_outcome o = rpc_coord_lookup(s->coord, &k, token, in, len, timeout_s, sr_now(),
                                           r->msg, sizeof r->msg);
    /* Held for an earlier step: the store reads its rows meanwhile. */
    if (o == RPC_COORD_PARKED) svc_prefetch(s, q->header->step, &set);
    pthread_mutex_unlock(&s->mu);
    if (o != RPC_COORD_GO) { /* parked (RPC_PARKED), or refused: r->msg says why */
      r->status = coord_status(o);
      goto out;
    }
  }
  if (check_answer(s, q->tables, q->n_tables, idx, token != NULL, r)) goto out;
  if (pin && answer_pinned(s, q, idx, &set, r)) goto out;
  if (answer_layout(s, q, idx, rows_at, &r->out_len) ||
      !(r->out = malloc(r->out_len ? r->out_len : 1)))
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory for the answer");
  static float dummy;
  for (int t = 0; t < nt; t++) outp[t] = &dummy;
  for (size_t i = 0; i < q->n_tables; i++) {
    const int t = idx[i];
    outp[t] = (float *)(r->out + rows_at[i]); /* 4-byte aligned: answer_layout */
  }
  answer_write(s, q, idx, rows_at, r->out, r->out_len);
  pthread_mutex_lock(&s->mu);
  if (q->header->step > s->hi_step) s->hi_step = q->header->step;
  int rc = emb_store_lookup_begin(s->store, q->header->step, &set, outp);
  if (!rc) rc = emb_store_lookup_wait(s->store);
  if (rc) snprintf(r->msg, sizeof r->msg, "lookup: %s", emb_store_errmsg(s->store));
  pthread_mutex_unlock(&s->mu);
  if (rc) r->status = RPC_INTERNAL; /* rpc_service_handle_call frees the answer */
out:
  scratch_give(s, x);
}

static void do_push(rpc_service *s, const uint8_t *in, size_t len, int defer, rpc_reply *r) {
  const int nt = s->plan->n_tables;
  /* The request's copy, its decoded form and a held copy (sync mode). */
  if (budget_take(s, 3 * len, defer, r)) return;
  svc_scratch *x = scratch_take(s); /* the decoded form and the arrays below */
  const Shardrec__V1__PushRequest *q = NULL;
  if (!x) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  if (push_decode(s, x, in, len, r)) goto out;
  q = &x->pq;
  if (s->read_only) FAIL(r, RPC_FAILED_PRECONDITION, "this server is read-only: Push refused");
  if (check_header(s, q->header, r) || check_clean(s, r)) goto out;
  if (!emb_optim_lr_ok(q->learning_rate))
    FAIL(r, RPC_INVALID_ARGUMENT, "learning_rate %g: must be finite and within [0, %g]",
         (double)q->learning_rate, EMB_OPTIM_MAX_LR);
  int *idx = x->idx;
  uint8_t *seen = x->seen;
  const uint64_t **ids = x->ids;
  size_t *counts = x->counts;
  const float **grads = x->grads;
  memset(seen, 0, (size_t)nt);
  memset(ids, 0, (size_t)nt * sizeof *ids);
  memset(counts, 0, (size_t)nt * sizeof *counts);
  memset(grads, 0, (size_t)nt * sizeof *grads);
  size_t total = 0, most = 0;
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableGrads *tg = q->tables[i];
    if (check_ids(s, "tables", i, tg->table_id, tg->ids, tg->n_ids, &idx[i], seen, &total, r))
      goto out;
    const int dim = s->plan->tables[idx[i]].dim;
    if (tg->grads.len != tg->n_ids * (size_t)dim * sizeof(float))
      FAIL(r, RPC_INVALID_ARGUMENT,
           "tables[%zu].grads: %zu bytes for %zu ids of dim %d; expected %zu", i, tg->grads.len,
           tg->n_ids, dim, tg->n_ids * (size_t)dim * sizeof(float));
    if (tg->n_ids > most) most = tg->n_ids;
  }
  size_t hash_cap = 16;
  while (hash_cap < 2 * most) hash_cap *= 2;
  /* ids_repeated's slots, then hash_cap / 8 bytes of occupancy bits */
  if (grow((void **)&x->hash, &x->cap_hash, hash_cap + hash_cap / 64 + 1, sizeof *x->hash))
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableGrads *tg = q->tables[i];
    const int t = idx[i], dim = s->plan->tables[t].dim;
    uint64_t twice;
    if (ids_repeated(tg->ids, tg->n_ids, x->hash, hash_cap, &twice))
      FAIL(r, RPC_INVALID_ARGUMENT, "tables[%zu].ids: row %llu given twice (sum its gradients)",
           i, (unsigned long long)twice);
    const float *g = (const float *)tg->grads.data; /* 4-byte aligned: push_decode */
    for (size_t k = 0; k < tg->n_ids * (size_t)dim; k++)
      if (!isfinite(g[k]))
        FAIL(r, RPC_INVALID_ARGUMENT, "tables[%zu].grads: row %llu element %zu is %g", i,
             (unsigned long long)tg->ids[k / (size_t)dim], k % (size_t)dim, (double)g[k]);
    ids[t] = tg->ids;
    counts[t] = tg->n_ids;
    grads[t] = g;
  }
  /* Applied now (single rank, async), or held (a copy) until every rank's
   * push of its step is in (sync). */
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  rpc_coord_grads p = {.lr = q->learning_rate, .set = &set, .grads = grads};
  rpc_coord_call k = coord_call(q->header);
  pthread_mutex_lock(&s->mu);
  rpc_coord_outcome o = rpc_coord_push(s->coord, &k, &p, sr_now(), r->msg, sizeof r->msg);
  pthread_mutex_unlock(&s->mu);
  if (o != RPC_COORD_GO && o != RPC_COORD_RETRY) {
    r->status = coord_status(o);
    goto out;
  }
  Shardrec__V1__PushResponse resp = SHARDREC__V1__PUSH_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  resp.applied = o == RPC_COORD_GO; /* RETRY: already taken, nothing changed */
  resp.rows = o == RPC_COORD_GO ? total : 0;
  pack_reply(r, &resp.base);
out:
  scratch_give(s, x);
}

/* The roots, "A, B", for messages. */
static void roots_list(const rpc_service *s, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < s->n_roots && at + 1 < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? ", " : "", s->roots[i]);
}

/* path confined to the roots (rpc/service.h, "Admin calls"): resolved into
 * real[SR_PATH_MAX]. 0, or the refusal in r. */
static int confine(const rpc_service *s, const char *what, const char *path, char *real,
                   rpc_reply *r) {
  char err[400] = "", roots[400];
  int rc = SR_EINVAL;
  for (int i = 0; i < s->n_roots && rc == SR_EINVAL; i++)
    rc = sr_path_confine(s->roots[i], path, real, SR_PATH_MAX, err, sizeof err);
  if (!rc) return 0;
  roots_list(s, roots, sizeof roots);
  r->status = rc == SR_EINVAL ? RPC_PERMISSION_DENIED : RPC_INVALID_ARGUMENT;
  if (rc == SR_EINVAL)
    snprintf(r->msg, sizeof r->msg, "%s: path %.200s is outside the checkpoint root %.250s",
             what, path, roots);
  else
    snprintf(r->msg, sizeof r->msg, "%s: path %.400s", what, err);
  return r->status;
}

/* Checkpoint into real (confined): real made when missing (servers of
 * other shards share it), every folder this server writes refused when it
 * exists; then the store writes dir. s->mu held. 0, or the failure in r. */
static int checkpoint_to(rpc_service *s, const char *real, const char *dir, rpc_reply *r) {
  int e = mkdir(real, 0777) ? errno : 0;
  if (e && (e != EEXIST || !sr_is_dir(real))) {
    snprintf(r->msg, sizeof r->msg, "checkpoint: cannot create %.400s: %s", real,
             e == EEXIST ? "not a folder" : strerror(e));
    return e == ENOENT ? RPC_NOT_FOUND : e == EEXIST ? RPC_ALREADY_EXISTS : RPC_INTERNAL;
  }
  char t[SR_PATH_MAX];
  struct stat st;
  for (int i = 0; !emb_served_checkpoint_target(s->store, s->shards, s->n_shards, real, i, t,
                                                sizeof t); i++)
    if (!lstat(t, &st)) {
      snprintf(r->msg, sizeof r->msg, "checkpoint: %.400s exists: Checkpoint writes only new folders", t);
      return RPC_ALREADY_EXISTS;
    }
  int rc = emb_store_flush(s->store);
  if (!rc) rc = emb_store_checkpoint(s->store, dir);
  if (!rc) return 0;
  snprintf(r->msg, sizeof r->msg, "checkpoint %.300s: %.150s", dir, emb_store_errmsg(s->store));
  return rc == SR_ENOTFOUND ? RPC_NOT_FOUND : rc == SR_EIO ? RPC_INTERNAL : RPC_FAILED_PRECONDITION;
}

/* Restore from real (confined): every folder to read that exists must
 * resolve inside the roots too (no symlink out of them). s->mu held. */
static int restore_from(rpc_service *s, const char *real, const char *dir, rpc_reply *r) {
  char t[SR_PATH_MAX], tr[SR_PATH_MAX];
  struct stat st;
  if (!sr_is_dir(real)) {
    snprintf(r->msg, sizeof r->msg, "restore: %.400s: no such folder", real);
    return RPC_NOT_FOUND;
  }
  for (int i = 0; !emb_served_checkpoint_target(s->store, s->shards, s->n_shards, real, i, t,
                                                sizeof t); i++)
    if (!lstat(t, &st) && confine(s, "restore", t, tr, r)) return r->status;
  int rc = emb_store_restore(s->store, dir);
  if (!rc) {
    rpc_coord_restore(s->coord); /* steps start over from the checkpoint's */
    s->hi_step = -1;             /* and the store dropped what it prefetched */
    s->unclean = 0;
    return 0;
  }
  snprintf(r->msg, sizeof r->msg, "restore %.300s: %.150s", dir, emb_store_errmsg(s->store));
  return rc == SR_ENOTFOUND ? RPC_NOT_FOUND : rc == SR_EIO ? RPC_INTERNAL : RPC_FAILED_PRECONDITION;
}

static void do_checkpoint(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r,
                          int restore) {
  Shardrec__V1__CheckpointRequest *cq = NULL;
  Shardrec__V1__RestoreRequest *rq = NULL;
  const char *fp, *path, *what = restore ? "Restore" : "Checkpoint";
  if (texts_ok(restore ? &shardrec__v1__restore_request__descriptor
                       : &shardrec__v1__checkpoint_request__descriptor, in, len, r))
    return;
  if (restore) {
    rq = shardrec__v1__restore_request__unpack(NULL, len, in);
    if (!rq) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.RestoreRequest (%zu bytes)", len);
    fp = rq->plan_fingerprint;
    path = rq->path;
  } else {
    cq = shardrec__v1__checkpoint_request__unpack(NULL, len, in);
    if (!cq) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.CheckpointRequest (%zu bytes)", len);
    fp = cq->plan_fingerprint;
    path = cq->path;
  }
  if (!s->n_roots)
    FAIL(r, RPC_FAILED_PRECONDITION, "%s refused: this server was started without "
         "--checkpoint-root (the folder Checkpoint and Restore paths must lie in)", what);
  if (!fp || strcmp(fp, s->fp))
    FAIL(r, RPC_FAILED_PRECONDITION, "plan_fingerprint: request made under plan %.16s..., this server serves plan %.16s...",
         fp && *fp ? fp : "(none)", s->fp);
  if (!path || !*path) FAIL(r, RPC_INVALID_ARGUMENT, "%s: path: empty", what);
  if (!restore && check_clean(s, r)) goto out;
  char real[SR_PATH_MAX], dir[SR_PATH_MAX];
  if (confine(s, what, path, real, r)) goto out;
  if (emb_served_checkpoint_dir(s->store, s->shards, s->n_shards, real, dir, sizeof dir))
    FAIL(r, RPC_INVALID_ARGUMENT, "%s: path %.400s: too long", what, real);
  pthread_mutex_lock(&s->mu);
  r->status = restore ? restore_from(s, real, dir, r) : checkpoint_to(s, real, dir, r);
  pthread_mutex_unlock(&s->mu);
  if (r->status) goto out;
  if (restore) {
    Shardrec__V1__RestoreResponse resp = SHARDREC__V1__RESTORE_RESPONSE__INIT;
    resp.path = dir;
    resp.incarnation = s->incarnation;
    pack_reply(r, &resp.base);
  } else {
    Shardrec__V1__CheckpointResponse resp = SHARDREC__V1__CHECKPOINT_RESPONSE__INIT;
    resp.path = dir;
    resp.incarnation = s->incarnation;
    pack_reply(r, &resp.base);
  }
out:
  if (cq) shardrec__v1__checkpoint_request__free_unpacked(cq, NULL);
  if (rq) shardrec__v1__restore_request__free_unpacked(rq, NULL);
}

/* Watch: park until the rank detaches (rpc/service.h, "Rank death");
 * detach: release the rank's parked Watch and answer at once. */
static void do_watch(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                     double timeout_s) {
  if (texts_ok(&shardrec__v1__watch_request__descriptor, in, len, r)) return;
  Shardrec__V1__WatchRequest *q = shardrec__v1__watch_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.WatchRequest (%zu bytes)", len);
  if (check_header(s, q->header, r)) goto out;
  rpc_coord_call k = coord_call(q->header);
  pthread_mutex_lock(&s->mu);
  rpc_coord_outcome o = rpc_coord_watch(s->coord, &k, q->detach, token, in, len, timeout_s,
                                        sr_now(), r->msg, sizeof r->msg);
  pthread_mutex_unlock(&s->mu);
  if (o != RPC_COORD_GO) { /* parked (RPC_PARKED), or refused: r->msg says why */
    r->status = coord_status(o);
    goto out;
  }
  Shardrec__V1__WatchResponse resp = SHARDREC__V1__WATCH_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  pack_reply(r, &resp.base);
out:
  if (q) shardrec__v1__watch_request__free_unpacked(q, NULL);
}

static void do_stats(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  Shardrec__V1__StatsRequest *q = shardrec__v1__stats_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.StatsRequest (%zu bytes)", len);
  Shardrec__V1__StatsResponse resp = SHARDREC__V1__STATS_RESPONSE__INIT;
  emb_store_stats st = {0};
  pthread_mutex_lock(&s->mu);
  int rc = emb_store_stats_get(s->store, &st);
  const lat_stat lk = s->lat[RPC_LOOKUP], ps = s->lat[RPC_PUSH];
  resp.failed_calls = s->failed;
  resp.unclean = s->unclean;
  resp.inflight_bytes = s->inflight;
  resp.pinned_rows = atomic_load(&s->pin_rows);
  resp.pinned_bytes = atomic_load(&s->pin_bytes);
  resp.inflight_refused = s->budget_refused;
  resp.prefetched = s->prefetched;
  resp.looks_ahead = s->store->ops->prefetch != NULL;
  rpc_coord_stats cs;
  rpc_coord_stats_get(s->coord, &cs);
  pthread_mutex_unlock(&s->mu);
  resp.pending_pushes = cs.pending_pushes;
  resp.dropped_steps = cs.dropped_steps;
  resp.jobs = cs.jobs;
  resp.dropped_jobs = cs.dropped_jobs;
  resp.parked_lookups = cs.parked_lookups;
  resp.parked_watches = cs.parked_watches;
  if (rc) FAIL(r, RPC_INTERNAL, "stats: %s", emb_store_errmsg(s->store));
  resp.rows = st.rows;
  resp.bytes = st.bytes;
  resp.rows_looked_up = st.lookups;
  resp.rows_hit = st.hits;
  resp.hit_rate = st.lookups ? (double)st.hits / (double)st.lookups : 0;
  resp.rows_pushed = st.pushes;
  resp.lookup_calls = lk.calls;
  resp.push_calls = ps.calls;
  resp.lookup_mean_us = lk.calls ? lk.sum_us / (double)lk.calls : 0;
  resp.push_mean_us = ps.calls ? ps.sum_us / (double)ps.calls : 0;
  resp.lookup_max_us = lk.max_us;
  resp.push_max_us = ps.max_us;
  resp.n_shards = (size_t)s->n_shards;
  resp.shards = s->shards;
  resp.plan_fingerprint = s->fp;
  resp.incarnation = s->incarnation;
  resp.n_checkpoint_roots = (size_t)s->n_roots;
  resp.checkpoint_roots = s->roots;
  resp.max_ids = s->max_ids;
  resp.max_message_bytes = s->max_msg;
  resp.inflight_budget_bytes = s->budget;
  pthread_mutex_lock(&s->pool_mu);
  resp.request_ids_in_place = s->ids_in_place;
  resp.request_ids_copied = s->ids_copied;
  pthread_mutex_unlock(&s->pool_mu);
  pack_reply(r, &resp.base);
out:
  if (q) shardrec__v1__stats_request__free_unpacked(q, NULL);
}

static void do_health(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  (void)s;
  if (texts_ok(&grpc__health__v1__health_check_request__descriptor, in, len, r)) return;
  Grpc__Health__V1__HealthCheckRequest *q = grpc__health__v1__health_check_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid grpc.health.v1.HealthCheckRequest (%zu bytes)", len);
  if (q->service && *q->service && strcmp(q->service, "shardrec.v1.EmbeddingShard"))
    FAIL(r, RPC_NOT_FOUND, "unknown service '%s'", q->service);
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  pack_reply(r, &resp.base);
out:
  if (q) grpc__health__v1__health_check_request__free_unpacked(q, NULL);
}

/* rpc_service_handle_call; pin: Lookups may be answered pinned. */
static void handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len, void *token,
                        double timeout_s, int pin, rpc_reply *r) {
  memset(r, 0, sizeof *r);
  static const uint8_t none[1];
  if (!in) in = none, len = 0;
  double t0 = sr_now();
  switch (m) {
    case RPC_LOOKUP: do_lookup(s, in, len, r, token, timeout_s, pin); break;
    case RPC_PUSH: do_push(s, in, len, token != NULL, r); break;
    case RPC_CHECKPOINT: do_checkpoint(s, in, len, r, 0); break;
    case RPC_RESTORE: do_checkpoint(s, in, len, r, 1); break;
    case RPC_STATS: do_stats(s, in, len, r); break;
    case RPC_HEALTH_CHECK: do_health(s, in, len, r); break;
    case RPC_WATCH: do_watch(s, in, len, r, token, timeout_s); break;
    default:
      r->status = RPC_UNIMPLEMENTED;
      snprintf(r->msg, sizeof r->msg, "unknown method");
      return;
  }
  if (r->status != RPC_OK) { /* parked or refused: nothing big to send */
    free(r->out);
    r->out = NULL;
    r->out_len = 0;
    rpc_service_release(s, r->held);
    r->held = 0;
  }
  if (r->status == RPC_PARKED || r->status == RPC_DEFERRED) return;
  double us = 1e6 * (sr_now() - t0);
  pthread_mutex_lock(&s->mu);
  lat_stat *l = &s->lat[m];
  l->calls++;
  l->sum_us += us;
  if (us > l->max_us) l->max_us = us;
  if (r->status != RPC_OK) s->failed++;
  pthread_mutex_unlock(&s->mu);
  if (s->observe) s->observe(s->observe_ctx, m, r->status, r->msg, us * 1e-6, len, r->out_len);
}

void rpc_service_handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                             void *token, double timeout_s, rpc_reply *r) {
  handle_call(s, m, in, len, token, timeout_s, 1, r);
}

void rpc_service_inspect(rpc_service *s, void (*fn)(void *ctx, const rpc_service_view *v),
                         void *ctx) {
  rpc_coord_stats cs;
  pthread_mutex_lock(&s->mu);
  rpc_coord_stats_get(s->coord, &cs);
  rpc_service_view v = {s->store, &cs, s->failed, s->incarnation, s->fp,
                        atomic_load(&s->pin_rows), atomic_load(&s->pin_bytes), s->unclean};
  fn(ctx, &v);
  pthread_mutex_unlock(&s->mu);
}

void rpc_service_handle(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                        rpc_reply *r) {
  handle_call(s, m, in, len, NULL, 0, 0, r);
  rpc_service_release(s, r->held); /* the caller holds the answer, not the server */
  r->held = 0;
}

/* The answer to parked call w handed back by the coordinator. */
static void woken_reply(rpc_service *s, const rpc_coord_woken *w, rpc_reply *r) {
  if (w->what == RPC_COORD_GO) { /* a Lookup that may be served now */
    rpc_service_handle_call(s, RPC_LOOKUP, w->in, w->len, NULL, 0, r);
    return;
  }
  memset(r, 0, sizeof *r);
  if (w->what == RPC_COORD_RELEASED) { /* a Watch whose rank detached */
    Shardrec__V1__WatchResponse resp = SHARDREC__V1__WATCH_RESPONSE__INIT;
    resp.incarnation = s->incarnation;
    pack_reply(r, &resp.base);
    return;
  }
  r->status = coord_status(w->what);
  snprintf(r->msg, sizeof r->msg, "%s", w->msg);
  pthread_mutex_lock(&s->mu);
  s->failed++;
  pthread_mutex_unlock(&s->mu);
}

int rpc_service_take_woken(rpc_service *s, rpc_woken *out, int max) {
  if (max < 1) return 0;
  double now = sr_now();
  if (rpc_coord_idle(s->coord, now)) return 0; /* without the lock */
  rpc_coord_woken *taken = malloc((size_t)max * sizeof *taken);
  if (!taken) return 0;
  pthread_mutex_lock(&s->mu);
  int n = rpc_coord_take_woken(s->coord, now, taken, max);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++) {
    out[i].token = taken[i].token;
    woken_reply(s, &taken[i], &out[i].r);
    free(taken[i].in);
  }
  free(taken);
  return n;
}

int rpc_service_cancel(rpc_service *s, void *token) {
  pthread_mutex_lock(&s->mu);
  int found = rpc_coord_cancel(s->coord, token, sr_now());
  if (found) s->failed++;
  pthread_mutex_unlock(&s->mu);
  return found;
}

void rpc_service_stop_parking(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  rpc_coord_stop_parking(s->coord);
  pthread_mutex_unlock(&s->mu);
}
