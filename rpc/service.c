/* The shard service (rpc/service.h): its life, its request handlers and
 * the step coordinator's glue, without gRPC: bytes in, status and bytes
 * out. Every field of a request is checked before anything runs, so a
 * refused request changes nothing (a Push's gradients that are not finite
 * are refused whole by the store where it is applied at once:
 * rpc/service_push.c). A Lookup or Push takes its share of the in-flight
 * budget and a scratch (rpc/admission.c), is decoded in place
 * (rpc/codec.c), validated against the plan and the shards served (here;
 * a Push in rpc/service_push.c), and run on the store or handed to the
 * step coordinator (rpc/coord.c:
 * which call waits, which push is held, when a job is dropped) under the
 * service's lock; its answer is written around the store's rows
 * (rpc/codec.c) or sent from the store's memory (rpc/pinned.c). */
#include <errno.h>
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
#include "embedding/ckpt_plan.h"
#include "embedding/served.h"
#include "rpc/coord_impl.h"
#include "rpc/health.pb-c.h"
#include "rpc/service_impl.h"
#include "rpc/shardrec.pb-c.h"

#define SVC_MAX_WORLD 1024 /* trainer ranks of one job */

static const char *const method_paths[RPC_N_METHODS] = {
    "/shardrec.v1.EmbeddingShard/Lookup",     "/shardrec.v1.EmbeddingShard/Push",
    "/shardrec.v1.EmbeddingShard/Checkpoint", "/shardrec.v1.EmbeddingShard/Restore",
    "/shardrec.v1.EmbeddingShard/Stats",      "/grpc.health.v1.Health/Check",
    "/shardrec.v1.EmbeddingShard/Watch",      "/shardrec.v1.EmbeddingShard/GetTransform",
    "/shardrec.v1.EmbeddingShard/SwapAt",     "/shardrec.v1.EmbeddingShard/Remove",
    "/shardrec.v1.EmbeddingShard/PushLookup",
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

/* The gRPC status the service answers a coordinator outcome with. */
int rpc__coord_status(rpc_coord_outcome o) {
  switch (o) {
    case RPC_COORD_GO:
    case RPC_COORD_RETRY:
    case RPC_COORD_RELEASED: return RPC_OK;
    case RPC_COORD_PARKED: return RPC_PARKED;
    case RPC_COORD_WAIT:
    case RPC_COORD_BUSY:
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
rpc_coord_call rpc__coord_call(const Shardrec__V1__RequestHeader *h) {
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
  s->from_ckpt = o->from_checkpoint;
  s->ckpt_step = o->step;
  s->versions = o->from_checkpoint ? o->versions : NULL;
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
  if (svc_roots(s, o, err, errlen) || rpc__transform_init(s, o, err, errlen)) {
    rpc_service_destroy(s);
    return NULL;
  }
  if (emb_plan_fingerprint(plan, s->fp)) goto nomem;
  {
    int *dims = malloc((size_t)(plan->n_tables ? plan->n_tables : 1) * sizeof *dims);
    if (!dims) goto nomem;
    for (int t = 0; t < plan->n_tables; t++) dims[t] = plan->tables[t].dim;
    rpc_coord_opts co = {.n_tables = plan->n_tables, .dims = dims,
                         .pending_timeout_s = o->pending_timeout_s, .apply = rpc__apply,
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
  pthread_cond_init(&s->applied, NULL);
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

void rpc__service_unref(rpc_service *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1) return;
  pthread_cond_destroy(&s->room);
  pthread_cond_destroy(&s->applied);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

void rpc_service_destroy(rpc_service *s) {
  if (!s) return;
  rpc_coord_destroy(s->coord);
  s->coord = NULL;
  pthread_mutex_destroy(&s->pool_mu);
  rpc__scratch_pool_free(s);
  for (int i = 0; i < s->n_roots; i++) free(s->roots[i]);
  free(s->roots);
  free(s->served);
  free(s->shards);
  rpc__service_unref(s);
}

size_t rpc_service_max_ids_for(const emb_plan *plan, size_t max_message_bytes) {
  int dim = 1;
  for (int t = 0; t < plan->n_tables; t++)
    if (plan->tables[t].dim > dim) dim = plan->tables[t].dim;
  size_t room = max_message_bytes > 4096 ? max_message_bytes - 4096 : 0;
  size_t n = room / (4 * (size_t)dim + 10);
  return n < 1 ? 1 : n > ((size_t)1 << 22) ? (size_t)1 << 22 : n;
}

int rpc_service_flush(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  int rc = emb_store_flush(s->store);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

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
  /* The common case in two cheap passes: every id in range, and every
   * shard the table's rows live on served here, so that no id's shard need
   * be computed. Otherwise each id in turn, for the first one refused. */
  int all = 1;
  for (int j = 0; j < tb->place.n; j++) all &= s->served[tb->place.shards[j]] != 0;
  if (all && emb_plan_first_out_of_range(s->plan, t, ids, n) == n) return RPC_OK;
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

/* Rows left by a crash, or missing a Push answered before its update
 * failed, are not served until a Restore. */
static int check_clean(rpc_service *s, rpc_reply *r) {
  pthread_mutex_lock(&s->mu);
  const char *why = s->unclean ? RPC_MSG_UNCLEAN : s->missed[0] ? s->missed : NULL;
  if (why) snprintf(r->msg, sizeof r->msg, "%s", why);
  pthread_mutex_unlock(&s->mu);
  if (!why) return RPC_OK;
  r->status = RPC_FAILED_PRECONDITION;
  return r->status;
}

/* The checks above, for the handlers of other files (rpc/service_impl.h). */
int rpc__check_header(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r) {
  return check_header(s, h, r) || check_clean(s, r) ? r->status : RPC_OK;
}

int rpc__check_ids(rpc_service *s, const char *what, size_t i, uint32_t table_id,
                   const uint64_t *ids, size_t n, int *idx, uint8_t *seen, size_t *total,
                   rpc_reply *r) {
  return check_ids(s, what, i, table_id, ids, n, idx, seen, total, r);
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
  rpc__pack_reply(r, &resp.base);
}

static void do_lookup(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                      int defer, double timeout_s, int pin) {
  const int nt = s->plan->n_tables;
  if (rpc__budget_take(s, 2 * len, defer, r)) return; /* the request's copy, decoded form */
  rpc_scratch *x = rpc__scratch_take(s); /* the decoded form and the arrays below */
  const Shardrec__V1__LookupRequest *q = NULL;
  float *f16 = NULL; /* owned: the rows of 16-bit tables as floats, before they are encoded */
  if (!x) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  if (rpc__lookup_decode(x, s->plan->n_tables, s->max_ids, in, len, r)) goto out;
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
    rpc_coord_call k = rpc__coord_call(q->header);
    pthread_mutex_lock(&s->mu);
    rpc_coord_outcome o = rpc_coord_lookup(s->coord, &k, token, in, len, timeout_s, sr_now(),
                                           r->msg, sizeof r->msg);
    /* Held for an earlier step: the store reads its rows meanwhile. */
    if (o == RPC_COORD_PARKED) svc_prefetch(s, q->header->step, &set);
    pthread_mutex_unlock(&s->mu);
    if (o != RPC_COORD_GO) { /* parked (RPC_PARKED), or refused: r->msg says why */
      r->status = rpc__coord_status(o);
      goto out;
    }
  }
  if (rpc__check_answer(s, q->tables, q->n_tables, idx, defer, r)) goto out;
  if (pin && !s->versions && rpc__answer_pinned(s, q, idx, &set, r)) goto out;
  if (rpc__answer_layout(s->plan, s->incarnation, q, idx, rows_at, &r->out_len) ||
      !(r->out = malloc(r->out_len + RPC_STEP_BYTES)))
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory for the answer");
  static float dummy;
  for (int t = 0; t < nt; t++) outp[t] = &dummy;
  /* 16-bit rows straight from the store into the answer where it hands
   * them (not while served versions patch the rows as floats). */
  const int direct = !s->versions && emb_store_has_rows16(s->store);
  if (!(f16 = rpc__answer_rows16(s->plan, q, idx, r->out, rows_at, outp, direct)))
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory for the answer");
  rpc__answer_write(s->plan, s->incarnation, q, idx, rows_at, r->out, r->out_len);
  int64_t step = s->ckpt_step; /* the checkpoint step answered from */
  const rpc_service_versions *v = s->versions;
  pthread_mutex_lock(&s->mu);
  const int named = s->from_ckpt; /* the rows read now are its checkpoint's */
  const int vs = v                ? v->pick(v->ctx, q->at_step, q->step_asked, &step, r->msg,
                                            sizeof r->msg)
                 : q->step_asked ? rpc__check_one_step(s, q->at_step, r)
                                 : RPC_OK;
  if (q->header->step > s->hi_step) s->hi_step = q->header->step;
  int rc = vs       ? 0
           : direct ? emb_store_lookup_begin_rows16(s->store, q->header->step, &set, (void *const *)outp)
                    : emb_store_lookup_begin(s->store, q->header->step, &set, outp);
  if (!vs && !rc) rc = emb_store_lookup_wait(s->store);
  if (rc) snprintf(r->msg, sizeof r->msg, "lookup: %s", emb_store_errmsg(s->store));
  else if (!vs && v) v->patch(v->ctx, step, &set, outp);
  pthread_mutex_unlock(&s->mu);
  if (vs) r->status = vs; /* rpc_service_handle_call frees the answer */
  else if (rc) r->status = RPC_INTERNAL;
  else {
    if (!direct) rpc__answer_encode16(s->plan, q, idx, r->out, rows_at, outp);
    r->out_len = (size_t)(rpc__answer_step(r->out + r->out_len, named, step) - r->out);
  }
out:
  if (f16 != &rpc__no_rows16) free(f16);
  rpc__scratch_give(s, x);
}

/* r->msg behind "what: " (the part of a PushLookup that was refused). */
static void msg_prefix(rpc_reply *r, const char *what) {
  char m[sizeof r->msg];
  memcpy(m, r->msg, sizeof m);
  snprintf(r->msg, sizeof r->msg, "%s: %.440s", what, m); /* what is short */
}

/* PushLookup, of a whole push of a job of one rank only (refused before
 * anything is done otherwise): the push taken as a Push; once it is in,
 * its answer and budget let go, and the Lookup answered as a Lookup (one
 * rank's never parks). Either deferred for budget, the whole call is
 * handled again later (the push, already taken, is then a retry). */
static void do_push_lookup(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r,
                           void *token, int defer, double timeout_s, int pin) {
  const uint8_t *push, *look;
  size_t plen, llen;
  if (rpc__push_lookup_split(in, len, &push, &plen, &look, &llen, r)) return;
  int32_t wp, wl, parts, unused;
  rpc__request_peek(push, plen, &wp, &parts);
  rpc__request_peek(look, llen, &wl, &unused);
  if (wp > 1 || wl > 1 || parts > 1) {
    r->status = RPC_FAILED_PRECONDITION;
    if (parts > 1)
      snprintf(r->msg, sizeof r->msg, "PushLookup takes a whole push (parts %d): send its parts "
               "as Pushes, then a Lookup", parts);
    else
      snprintf(r->msg, sizeof r->msg, "PushLookup is for jobs of one rank (world_size %d): send "
               "a Push and a Lookup", wp > 1 ? wp : wl);
    return;
  }
  rpc__push(s, push, plen, defer, 0, r);
  if (r->status != RPC_OK) {
    if (r->status != RPC_DEFERRED) msg_prefix(r, "push");
    return;
  }
  free(r->out);
  rpc_service_release(s, r->held);
  memset(r, 0, sizeof *r);
  do_lookup(s, look, llen, r, token, defer, timeout_s, pin);
  if (r->status != RPC_OK && r->status != RPC_DEFERRED) msg_prefix(r, RPC_MSG_AFTER_PUSH);
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

/* The status of a failed Checkpoint or Restore whose store said rc (what:
 * "checkpoint" or "restore"), its message in r. */
static int admin_failed(rpc_service *s, int rc, const char *what, const char *dir, rpc_reply *r) {
  if (rc == SR_EUNSUPPORTED)
    snprintf(r->msg, sizeof r->msg, "%s %.300s: this server's store keeps no change set: it "
             "writes and reads full checkpoints only", what, dir);
  else
    snprintf(r->msg, sizeof r->msg, "%s %.300s: %.150s", what, dir, emb_store_errmsg(s->store));
  return rc == SR_ENOTFOUND ? RPC_NOT_FOUND : rc == SR_EIO ? RPC_INTERNAL : RPC_FAILED_PRECONDITION;
}

/* Checkpoint into real (confined): real made when missing (servers of
 * other shards share it), every folder this server writes refused when it
 * exists; then the store writes dir, whole or (delta) its change set.
 * s->mu held. 0, or the failure in r. */
static int checkpoint_to(rpc_service *s, const char *real, const char *dir, int delta,
                         rpc_reply *r) {
  char step[SR_PATH_MAX];
  if (emb_served_in_checkpoint(real, step, sizeof step)) {
    snprintf(r->msg, sizeof r->msg, "checkpoint: %.200s lies in the complete checkpoint %.200s: "
             "a checkpoint is only read, never written into", real, step);
    return RPC_FAILED_PRECONDITION;
  }
  int e = mkdir(real, 0777) ? errno : 0;
  if (e && (e != EEXIST || !sr_is_dir(real))) {
    snprintf(r->msg, sizeof r->msg, "checkpoint: cannot create %.400s: %s", real,
             e == EEXIST ? "not a folder" : strerror(e));
    return e == ENOENT ? RPC_NOT_FOUND : e == EEXIST ? RPC_ALREADY_EXISTS : RPC_INTERNAL;
  }
  char t[SR_PATH_MAX];
  struct stat st;
  /* A delta writes dir alone; a full checkpoint the store's folders. */
  for (int i = 0; delta ? !i && !sr_path(t, sizeof t, "%s", dir)
                        : !emb_served_checkpoint_target(s->store, s->shards, s->n_shards, real, i,
                                                        t, sizeof t);
       i++)
    if (!lstat(t, &st)) {
      snprintf(r->msg, sizeof r->msg, "checkpoint: %.400s exists: Checkpoint writes only new folders", t);
      return RPC_ALREADY_EXISTS;
    }
  int rc = emb_store_flush(s->store);
  if (!rc) rc = delta ? emb_store_checkpoint_delta(s->store, dir) : emb_store_checkpoint(s->store, dir);
  return rc ? admin_failed(s, rc, "checkpoint", dir, r) : 0;
}

/* Whether the manifest of real's step folder (a confined Restore path's)
 * lies inside a root: only then is it read. */
static int manifest_inside(const rpc_service *s, const char *real) {
  char man[SR_PATH_MAX], out[SR_PATH_MAX], err[256];
  if (sr_path(man, sizeof man, "%s/../manifest.json", real)) return 0;
  for (int i = 0; i < s->n_roots; i++)
    if (!sr_path_confine(s->roots[i], man, out, sizeof out, err, sizeof err)) return 1;
  return 0;
}

/* Whether real (a confined Restore path) holds rows of a smaller plan this
 * server's grows (emb_ckpt_grown_from, model_fp its model fingerprint). */
static int grown_from(const rpc_service *s, const char *real, char model_fp[EMB_FP_HEX]) {
  model_fp[0] = 0;
  return manifest_inside(s, real) && emb_ckpt_grown_from(real, s->plan, model_fp);
}

/* Restore from real (confined): every folder to read that exists must
 * resolve inside the roots too (no symlink out of them). overlay: dir is
 * an incremental checkpoint laid over the rows held. s->mu held. */
static int restore_from(rpc_service *s, const char *real, const char *dir, int overlay,
                        rpc_reply *r) {
  char t[SR_PATH_MAX], tr[SR_PATH_MAX];
  struct stat st;
  if (!sr_is_dir(real)) {
    snprintf(r->msg, sizeof r->msg, "restore: %.400s: no such folder", real);
    return RPC_NOT_FOUND;
  }
  if (overlay) {
    if (!lstat(dir, &st) && confine(s, "restore", dir, tr, r)) return r->status;
    int rc = emb_store_restore_delta(s->store, dir);
    if (rc) return admin_failed(s, rc, "restore", dir, r);
    rpc_coord_restore(s->coord); /* steps start over from the checkpoint's */
    s->hi_step = -1;             /* and the store dropped what it prefetched */
    return 0;
  }
  for (int i = 0; !emb_served_checkpoint_target(s->store, s->shards, s->n_shards, real, i, t,
                                                sizeof t); i++)
    if (!lstat(t, &st) && confine(s, "restore", t, tr, r)) return r->status;
  /* An increment's rows are not every row: never taken as a whole. */
  if (manifest_inside(s, real) && emb_served_increment_at(real)) {
    snprintf(r->msg, sizeof r->msg, "restore: %.300s holds an incremental checkpoint's rows: "
             "Restore its chain's full checkpoint, then each increment with overlay", real);
    return RPC_FAILED_PRECONDITION;
  }
  /* A checkpoint of a smaller plan this server's plan grows (a model trained
   * on with more ids): its rows restore as they are, the new rows start as
   * never-written rows. */
  char grown_fp[EMB_FP_HEX];
  int rc = grown_from(s, real, grown_fp)
               ? emb_store_restore_grown(s->store, dir, grown_fp)
               : emb_store_restore(s->store, dir);
  if (!rc) {
    rpc_coord_restore(s->coord); /* steps start over from the checkpoint's */
    s->hi_step = -1;             /* and the store dropped what it prefetched */
    s->unclean = 0;
    s->missed[0] = 0;
    return 0;
  }
  return admin_failed(s, rc, "restore", dir, r);
}

static void do_checkpoint(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r,
                          int restore) {
  Shardrec__V1__CheckpointRequest *cq = NULL;
  Shardrec__V1__RestoreRequest *rq = NULL;
  const char *fp, *path, *what = restore ? "Restore" : "Checkpoint";
  int delta; /* Checkpoint's incremental, Restore's overlay */
  if (rpc__texts_ok(restore ? &shardrec__v1__restore_request__descriptor
                            : &shardrec__v1__checkpoint_request__descriptor, in, len, r))
    return;
  if (restore) {
    rq = shardrec__v1__restore_request__unpack(NULL, len, in);
    if (!rq) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.RestoreRequest (%zu bytes)", len);
    fp = rq->plan_fingerprint;
    path = rq->path;
    delta = rq->overlay;
  } else {
    cq = shardrec__v1__checkpoint_request__unpack(NULL, len, in);
    if (!cq) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.CheckpointRequest (%zu bytes)", len);
    fp = cq->plan_fingerprint;
    path = cq->path;
    delta = cq->incremental;
  }
  /* A following server's rows, step and undo sets are the followed
   * folder's: rows restored under them would be answered as its step. */
  if (restore && s->versions)
    FAIL(r, RPC_FAILED_PRECONDITION, "Restore refused: this server follows its checkpoint "
         "folder (serve --follow): its answers name the followed step, whose rows it holds; "
         "serve the other checkpoint from a server of its own");
  if (!s->n_roots)
    FAIL(r, RPC_FAILED_PRECONDITION, "%s refused: this server was started without "
         "--checkpoint-root (the folder Checkpoint and Restore paths must lie in)", what);
  if (!fp || strcmp(fp, s->fp))
    FAIL(r, RPC_FAILED_PRECONDITION, "plan_fingerprint: request made under plan %.16s..., this server serves plan %.16s...",
         fp && *fp ? fp : "(none)", s->fp);
  if (!path || !*path) FAIL(r, RPC_INVALID_ARGUMENT, "%s: path: empty", what);
  if ((!restore || delta) && check_clean(s, r)) goto out; /* an overlay needs whole rows */
  char real[SR_PATH_MAX], dir[SR_PATH_MAX];
  if (confine(s, what, path, real, r)) goto out;
  if (delta ? emb_served_delta_dir(s->shards, s->n_shards, real, dir, sizeof dir)
            : emb_served_checkpoint_dir(s->store, s->shards, s->n_shards, real, dir, sizeof dir))
    FAIL(r, RPC_INVALID_ARGUMENT, "%s: path %.400s: too long", what, real);
  pthread_mutex_lock(&s->mu);
  r->status = restore ? restore_from(s, real, dir, delta, r) : checkpoint_to(s, real, dir, delta, r);
  if (restore && !r->status) s->from_ckpt = 0; /* other rows than its checkpoint's */
  pthread_mutex_unlock(&s->mu);
  if (r->status) goto out;
  if (restore) {
    Shardrec__V1__RestoreResponse resp = SHARDREC__V1__RESTORE_RESPONSE__INIT;
    resp.path = dir;
    resp.incarnation = s->incarnation;
    rpc__pack_reply(r, &resp.base);
  } else {
    Shardrec__V1__CheckpointResponse resp = SHARDREC__V1__CHECKPOINT_RESPONSE__INIT;
    resp.path = dir;
    resp.incarnation = s->incarnation;
    rpc__pack_reply(r, &resp.base);
  }
out:
  if (cq) shardrec__v1__checkpoint_request__free_unpacked(cq, NULL);
  if (rq) shardrec__v1__restore_request__free_unpacked(rq, NULL);
}

/* Watch: park until the rank detaches (rpc/shardrec.proto, "Rank death");
 * detach: release the rank's parked Watch and answer at once. */
static void do_watch(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                     double timeout_s) {
  if (rpc__texts_ok(&shardrec__v1__watch_request__descriptor, in, len, r)) return;
  Shardrec__V1__WatchRequest *q = shardrec__v1__watch_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.WatchRequest (%zu bytes)", len);
  if (check_header(s, q->header, r)) goto out;
  rpc_coord_call k = rpc__coord_call(q->header);
  pthread_mutex_lock(&s->mu);
  rpc_coord_outcome o = rpc_coord_watch(s->coord, &k, q->detach, token, in, len, timeout_s,
                                        sr_now(), r->msg, sizeof r->msg);
  pthread_mutex_unlock(&s->mu);
  if (o != RPC_COORD_GO) { /* parked (RPC_PARKED), or refused: r->msg says why */
    r->status = rpc__coord_status(o);
    goto out;
  }
  Shardrec__V1__WatchResponse resp = SHARDREC__V1__WATCH_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  rpc__pack_reply(r, &resp.base);
out:
  if (q) shardrec__v1__watch_request__free_unpacked(q, NULL);
}

/* The store's stats as clients made them: the served versions' own reads
 * left out. s->mu held. */
static int store_stats(const rpc_service *s, emb_store_stats *st) {
  int rc = emb_store_stats_get(s->store, st);
  uint64_t rows = 0, hits = 0;
  if (!rc && s->versions && s->versions->own_reads) s->versions->own_reads(s->versions->ctx, &rows, &hits);
  st->lookups -= rows <= st->lookups ? rows : st->lookups;
  st->hits -= hits <= st->hits ? hits : st->hits;
  return rc;
}

static void do_stats(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  Shardrec__V1__StatsRequest *q = shardrec__v1__stats_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.StatsRequest (%zu bytes)", len);
  Shardrec__V1__StatsResponse resp = SHARDREC__V1__STATS_RESPONSE__INIT;
  emb_store_stats st = {0};
  pthread_mutex_lock(&s->mu);
  int rc = store_stats(s, &st);
  const lat_stat lk = s->lat[RPC_LOOKUP], ps = s->lat[RPC_PUSH], pl = s->lat[RPC_PUSH_LOOKUP];
  resp.failed_calls = s->failed;
  resp.unclean = s->unclean;
  resp.inflight_bytes = s->inflight;
  resp.pinned_rows = atomic_load(&s->pin_rows);
  resp.pinned_bytes = atomic_load(&s->pin_bytes);
  resp.inflight_refused = s->budget_refused;
  resp.prefetched = s->prefetched;
  resp.looks_ahead = s->store->ops->prefetch != NULL;
  resp.push_lookup = 1;
  resp.exchange = 1;
  resp.exchange_streams = atomic_load(&s->streams);
  resp.inflight_waiting = atomic_load(&s->waiting);
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
  resp.push_lookup_calls = pl.calls;
  resp.push_lookup_mean_us = pl.calls ? pl.sum_us / (double)pl.calls : 0;
  resp.n_shards = (size_t)s->n_shards;
  resp.shards = s->shards;
  resp.plan_fingerprint = s->fp;
  resp.transform_fingerprint = s->xf_fp;
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
  rpc__pack_reply(r, &resp.base);
out:
  if (q) shardrec__v1__stats_request__free_unpacked(q, NULL);
}

static void do_health(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  (void)s;
  if (rpc__texts_ok(&grpc__health__v1__health_check_request__descriptor, in, len, r)) return;
  Grpc__Health__V1__HealthCheckRequest *q = grpc__health__v1__health_check_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid grpc.health.v1.HealthCheckRequest (%zu bytes)", len);
  if (q->service && *q->service && strcmp(q->service, "shardrec.v1.EmbeddingShard"))
    FAIL(r, RPC_NOT_FOUND, "unknown service '%s'", q->service);
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  rpc__pack_reply(r, &resp.base);
out:
  if (q) grpc__health__v1__health_check_request__free_unpacked(q, NULL);
}

/* rpc_service_handle_call; token: a Lookup or Watch may park with it;
 * defer: a call that finds no room in the budget is answered RPC_DEFERRED;
 * pin: Lookups may be answered pinned; later: a single-rank job's whole
 * Push may be answered before its update (r->after). Every call first
 * waits for the updates of the Pushes answered before it. */
static void handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len, void *token,
                        int defer, double timeout_s, int pin, int later, rpc_reply *r) {
  memset(r, 0, sizeof *r);
  static const uint8_t none[1];
  if (!in) in = none, len = 0;
  double t0 = sr_now();
  if (atomic_load(&s->applying)) { /* raised before the push's answer went out */
    pthread_mutex_lock(&s->mu);
    while (atomic_load(&s->applying)) pthread_cond_wait(&s->applied, &s->mu);
    pthread_mutex_unlock(&s->mu);
  }
  switch (m) {
    case RPC_LOOKUP: do_lookup(s, in, len, r, token, defer, timeout_s, pin); break;
    case RPC_PUSH: rpc__push(s, in, len, defer, later, r); break;
    case RPC_CHECKPOINT: do_checkpoint(s, in, len, r, 0); break;
    case RPC_RESTORE: do_checkpoint(s, in, len, r, 1); break;
    case RPC_STATS: do_stats(s, in, len, r); break;
    case RPC_HEALTH_CHECK: do_health(s, in, len, r); break;
    case RPC_WATCH: do_watch(s, in, len, r, token, timeout_s); break;
    case RPC_GET_TRANSFORM: rpc__get_transform(s, in, len, defer, r); break;
    case RPC_SWAP_AT: rpc__swap_at(s, in, len, r); break;
    case RPC_REMOVE: rpc__remove(s, in, len, defer, r); break;
    case RPC_PUSH_LOOKUP: do_push_lookup(s, in, len, r, token, defer, timeout_s, pin); break;
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
  if (r->after) { /* noted once updated (rpc_service_after) */
    r->after->in_len = len;
    r->after->out_len = r->out_len;
    r->after->secs = sr_now() - t0;
    return;
  }
  rpc_service_note(s, m, r->status, r->msg, sr_now() - t0, len, r->out_len);
}

void rpc_service_note(rpc_service *s, rpc_method m, int status, const char *msg, double secs,
                      size_t in_len, size_t out_len) {
  const double us = 1e6 * secs;
  pthread_mutex_lock(&s->mu);
  if (m >= 0 && m < RPC_N_METHODS) { /* not RPC_METHOD_UNKNOWN */
    lat_stat *l = &s->lat[m];
    l->calls++;
    l->sum_us += us;
    if (us > l->max_us) l->max_us = us;
  }
  if (status != RPC_OK) s->failed++;
  pthread_mutex_unlock(&s->mu);
  if (s->observe) s->observe(s->observe_ctx, m, status, msg, secs, in_len, out_len);
}

void rpc_service_handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                             void *token, double timeout_s, rpc_reply *r) {
  handle_call(s, m, in, len, token, token != NULL, timeout_s, 1, 0, r);
}

int rpc_service_takes_pushes(const rpc_service *s) { return !s->read_only; }

void rpc_service_streams(rpc_service *s, int delta) {
  atomic_fetch_add(&s->streams, (uint64_t)(int64_t)delta); /* -1 wraps: unsigned */
}

void rpc_service_waiting(rpc_service *s, uint64_t n) { atomic_store(&s->waiting, n); }

void rpc_service_handle_exchange(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                                 rpc_reply *r) {
  handle_call(s, m, in, len, NULL, 1, 0, 1, 1, r);
}

void rpc_service_inspect(rpc_service *s, void (*fn)(void *ctx, const rpc_service_view *v),
                         void *ctx) {
  rpc_coord_stats cs;
  pthread_mutex_lock(&s->mu);
  rpc_coord_stats_get(s->coord, &cs);
  rpc_service_view v = {.store = s->store, .coord = cs, .failed = s->failed,
                        .incarnation = s->incarnation, .plan_fp = s->fp,
                        .pinned_rows = atomic_load(&s->pin_rows),
                        .pinned_bytes = atomic_load(&s->pin_bytes), .unclean = s->unclean,
                        .streams = atomic_load(&s->streams),
                        .waiting = atomic_load(&s->waiting)};
  v.st_rc = store_stats(s, &v.st);
  fn(ctx, &v);
  pthread_mutex_unlock(&s->mu);
}

void rpc_service_handle(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                        rpc_reply *r) {
  handle_call(s, m, in, len, NULL, 0, 0, 0, 0, r);
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
    rpc__pack_reply(r, &resp.base);
    return;
  }
  r->status = rpc__coord_status(w->what);
  snprintf(r->msg, sizeof r->msg, "%s", w->msg);
  rpc_service_note(s, w->watch ? RPC_WATCH : RPC_LOOKUP, r->status, r->msg, 0, w->len, 0);
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
  size_t in_len = 0;
  pthread_mutex_lock(&s->mu);
  const int found = rpc_coord_cancel(s->coord, token, sr_now(), &in_len);
  pthread_mutex_unlock(&s->mu);
  if (found) /* a call like any other, answered by nobody */
    rpc_service_note(s, found == 2 ? RPC_WATCH : RPC_LOOKUP, RPC_CANCELLED,
                     "cancelled by its client while held", 0, in_len, 0);
  return found != 0;
}

void rpc_service_stop_parking(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  rpc_coord_stop_parking(s->coord);
  pthread_mutex_unlock(&s->mu);
}

