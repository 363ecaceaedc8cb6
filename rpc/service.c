/* The request handlers of the shard service, without gRPC: bytes in, status
 * and bytes out. Every field of a request is checked before anything runs,
 * so a refused request changes nothing. */
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

#include "common/status.h"
#include "rpc/health.pb-c.h"
#include "rpc/service.h"
#include "rpc/shardrec.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows travel as little-endian float32: a big-endian host needs byte swaps here"
#endif

#define SVC_MAX_JOBS 256 /* (job, rank) pairs remembered for Push idempotency */
#define SVC_MAX_WORLD 1024 /* trainer ranks of one job */
#define SVC_AHEAD 4        /* steps of pushes a multi-rank job may collect at once */

/* A multi-rank job (world_size > 1), known from its first call, which
 * fixes its world size and mode. Sync (stale 0): step t's pushes are
 * collected from every rank and applied together, summed in rank order;
 * Lookups for step t+1 wait (parked) until step t is applied. Async (stale
 * S >= 1): pushes are applied on arrival; a Lookup of step t waits until
 * every rank's push of step t-S is in. */
typedef struct {
  char job[128];
  int world;
  int stale;       /* 0: sync; S >= 1: async with bound S */
  int64_t applied; /* sync: last step applied */
  /* sync: have[a * world + rank]: rank's push of step applied+1+a (NULL: not in) */
  Shardrec__V1__PushRequest **have;
  int64_t *done;   /* async: [world] last step each rank pushed (first step - 1: none yet) */
  uint8_t *gone;   /* [world] 1: the rank detached (finished); its Watch ending means nothing */
  int started;     /* a Lookup or Push came: the first step (applied, done) is fixed */
  uint64_t used;
  double progress; /* now_us() of the last push taken (or of the first call) */
  int aborted;     /* its pending state was dropped: every further call is refused */
  char why[480];
} sync_job;

/* A Lookup waiting for its job's previous step (sync) or for the slowest
 * rank (async). */
typedef struct {
  void *token;
  uint8_t *in;
  size_t len;
  char job[128];
  int64_t step;
  int rank;
  double deadline; /* now_us() clock, microseconds */
  int abort;       /* answer ABORTED with why: its job's pending state was dropped */
  int watch;       /* a Watch (not a Lookup): answered OK once released */
  int released;    /* Watch: its rank detached */
  char why[480];
} parked_call;

static const char *const method_paths[RPC_N_METHODS] = {
    "/shardrec.v1.EmbeddingShard/Lookup",     "/shardrec.v1.EmbeddingShard/Push",
    "/shardrec.v1.EmbeddingShard/Checkpoint", "/shardrec.v1.EmbeddingShard/Restore",
    "/shardrec.v1.EmbeddingShard/Stats",      "/grpc.health.v1.Health/Check",
    "/shardrec.v1.EmbeddingShard/Watch",
};

const char *rpc_method_path(rpc_method m) {
  return (m >= 0 && m < RPC_N_METHODS) ? method_paths[m] : NULL;
}

typedef struct {
  char job[128];
  int rank;
  int64_t last_step; /* highest step applied for (job, rank); -1: none yet */
  int stale;         /* max_staleness of its first call */
  uint64_t used;     /* recency, for replacement */
} job_entry;

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
  int store_shard_dirs;
  size_t max_ids;
  pthread_mutex_t mu;
  job_entry jobs[SVC_MAX_JOBS];
  int n_jobs;
  uint64_t clock;
  lat_stat lat[RPC_N_METHODS];
  uint64_t failed;
  uint64_t incarnation; /* random, fixed for this service's life */
  sync_job *sync;       /* [n_sync] multi-rank jobs */
  int n_sync, cap_sync;
  parked_call *parked;  /* [n_parked] */
  int n_parked, cap_parked;
  int stopping;         /* no more parking; parked calls are answered UNAVAILABLE */
  atomic_int parked_hint; /* n_parked, readable without the lock */
  atomic_int sync_hint;   /* n_sync, readable without the lock */
  double pending_timeout_us; /* a job's pending state with no progress this long is dropped */
  atomic_llong next_sweep_us; /* now_us() of the next timeout sweep */
  uint64_t dropped_steps; /* steps whose held pushes were dropped */
  uint64_t dropped_jobs;  /* jobs aborted (rank death, timeout) */
};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* Sweep for stalled jobs a few times per timeout, at least every second. */
static double sweep_every(const rpc_service *s) {
  double t = s->pending_timeout_us / 4;
  return t < 1e6 ? t : 1e6;
}

rpc_service *rpc_service_create(const emb_plan *plan, emb_store *store,
                                const rpc_service_opts *o, char *err, size_t errlen) {
  if (!plan || !store || !o || o->n_shards < 1) {
    sr_fmt(err, errlen, "service: missing plan, store or shards");
    return NULL;
  }
  rpc_service *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->plan = plan;
  s->store = store;
  s->read_only = o->read_only;
  s->store_shard_dirs = o->store_shard_dirs;
  s->max_ids = o->max_ids ? o->max_ids : (size_t)1 << 22;
  s->pending_timeout_us = 1e6 * (o->pending_timeout_s > 0 ? o->pending_timeout_s : 300);
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
  if (emb_plan_fingerprint(plan, s->fp)) goto nomem;
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
  pthread_mutex_init(&s->mu, NULL);
  return s;
nomem:
  sr_fmt(err, errlen, "service: out of memory");
  if (s) {
    free(s->served);
    free(s->shards);
    free(s);
  }
  return NULL;
}

/* Free j's held pushes; the number of steps that had any. */
static int sync_drop_held(sync_job *j) {
  int steps = 0;
  if (j->have)
    for (int a = 0; a < SVC_AHEAD; a++) {
      int any = 0;
      for (int k = 0; k < j->world; k++) {
        Shardrec__V1__PushRequest **q = &j->have[a * j->world + k];
        if (*q) {
          shardrec__v1__push_request__free_unpacked(*q, NULL);
          *q = NULL;
          any = 1;
        }
      }
      steps += any;
    }
  return steps;
}

static void sync_free(sync_job *j) {
  sync_drop_held(j);
  free(j->have);
  j->have = NULL;
  free(j->done);
  j->done = NULL;
  free(j->gone);
  j->gone = NULL;
}

void rpc_service_destroy(rpc_service *s) {
  if (!s) return;
  for (int i = 0; i < s->n_sync; i++) sync_free(&s->sync[i]);
  free(s->sync);
  for (int i = 0; i < s->n_parked; i++) free(s->parked[i].in);
  free(s->parked);
  pthread_mutex_destroy(&s->mu);
  free(s->served);
  free(s->shards);
  free(s);
}

uint64_t rpc_service_incarnation(const rpc_service *s) { return s->incarnation; }

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
  if (!h->job_id || strlen(h->job_id) >= sizeof(((job_entry *)0)->job)) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "header.job_id: at most %zu bytes",
             sizeof(((job_entry *)0)->job) - 1);
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

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
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

static sync_job *sync_find(rpc_service *s, const char *job) {
  for (int i = 0; i < s->n_sync; i++)
    if (!strcmp(s->sync[i].job, job)) return &s->sync[i];
  return NULL;
}

static sync_job *job_enter(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r);
static sync_job *job_enter_as(rpc_service *s, const Shardrec__V1__RequestHeader *h, int start,
                              rpc_reply *r);
static int solo_enter(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r);

/* Async: every rank's push of this step (and all before) is in. */
static int64_t job_min_done(const sync_job *j) {
  int64_t m = j->done[0];
  for (int k = 1; k < j->world; k++)
    if (j->done[k] < m) m = j->done[k];
  return m;
}

/* The step a Lookup of step needs complete before it is served. */
static int64_t job_needs(const sync_job *j, int64_t step) {
  return j->stale ? step - j->stale : step - 1;
}

/* The last step complete: sync, applied; async, pushed by every rank. */
static int64_t job_complete(const sync_job *j) {
  return j->stale ? job_min_done(j) : j->applied;
}

static int job_ready(const sync_job *j, int64_t step) {
  return job_complete(j) >= job_needs(j, step);
}

/* Keep a copy of a Lookup until its job's previous step is applied (s->mu
 * held). 0, or -1 when out of memory. */
static int park(rpc_service *s, void *token, const uint8_t *in, size_t len,
                const Shardrec__V1__RequestHeader *h, double timeout_s, int watch) {
  if (s->n_parked == s->cap_parked) {
    int cap = s->cap_parked ? 2 * s->cap_parked : 16;
    parked_call *p = realloc(s->parked, (size_t)cap * sizeof *p);
    if (!p) return -1;
    s->parked = p;
    s->cap_parked = cap;
  }
  parked_call *p = &s->parked[s->n_parked];
  p->in = malloc(len ? len : 1);
  if (!p->in) return -1;
  if (len) memcpy(p->in, in, len);
  p->len = len;
  p->token = token;
  snprintf(p->job, sizeof p->job, "%s", h->job_id);
  p->step = h->step;
  p->rank = h->rank;
  p->abort = 0;
  p->watch = watch;
  p->released = 0;
  p->why[0] = 0;
  p->deadline = now_us() + 1e6 * (timeout_s > 0 ? timeout_s : 0);
  s->n_parked++;
  atomic_store(&s->parked_hint, s->n_parked);
  return 0;
}

static void do_lookup(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                      double timeout_s) {
  const int nt = s->plan->n_tables;
  Shardrec__V1__LookupRequest *q = shardrec__v1__lookup_request__unpack(NULL, len, in);
  int *idx = NULL;
  uint8_t *seen = NULL;
  const uint64_t **ids = NULL;
  size_t *counts = NULL;
  float **outp = NULL;
  Shardrec__V1__TableRows *rows = NULL, **rowp = NULL;
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.LookupRequest (%zu bytes)", len);
  if (check_header(s, q->header, r)) goto out;
  idx = calloc(q->n_tables + 1, sizeof *idx);
  seen = calloc((size_t)nt, 1);
  ids = calloc((size_t)nt, sizeof *ids);
  counts = calloc((size_t)nt, sizeof *counts);
  outp = calloc((size_t)nt, sizeof *outp);
  rows = calloc(q->n_tables + 1, sizeof *rows);
  rowp = calloc(q->n_tables + 1, sizeof *rowp);
  if (!idx || !seen || !ids || !counts || !outp || !rows || !rowp)
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  size_t total = 0;
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableIds *ti = q->tables[i];
    if (check_ids(s, "tables", i, ti->table_id, ti->ids, ti->n_ids, &idx[i], seen, &total, r))
      goto out;
  }
  if (q->header->world_size > 1) {
    /* Sync: step t+1 is read only once every rank's push of step t is
     * applied. Async: step t once every rank's push of step t-S is. */
    const Shardrec__V1__RequestHeader *h = q->header;
    pthread_mutex_lock(&s->mu);
    const sync_job *j = job_enter(s, h, r);
    if (!j) {
      pthread_mutex_unlock(&s->mu);
      goto out;
    }
    int wait = !job_ready(j, h->step), parked = 0, stopping = s->stopping;
    int64_t need = job_needs(j, h->step), have = job_complete(j);
    if (wait && token && !stopping) parked = park(s, token, in, len, h, timeout_s, 0) == 0;
    pthread_mutex_unlock(&s->mu);
    if (parked) {
      r->status = RPC_PARKED;
      goto out;
    }
    if (wait)
      FAIL(r, RPC_UNAVAILABLE,
           "lookup of step %lld of job %s waits for every rank's push of step %lld (complete: "
           "%lld)%s",
           (long long)h->step, h->job_id, (long long)need, (long long)have,
           stopping ? "; the server is shutting down" : token ? "; out of memory to wait" : "");
  } else {
    pthread_mutex_lock(&s->mu);
    int j = solo_enter(s, q->header, r);
    pthread_mutex_unlock(&s->mu);
    if (j < 0) goto out;
  }
  static float dummy;
  for (int t = 0; t < nt; t++) outp[t] = &dummy;
  for (size_t i = 0; i < q->n_tables; i++) {
    const int t = idx[i], dim = s->plan->tables[t].dim;
    shardrec__v1__table_rows__init(&rows[i]);
    rows[i].table_id = q->tables[i]->table_id;
    rows[i].dim = dim;
    rows[i].rows.len = q->tables[i]->n_ids * (size_t)dim * sizeof(float);
    rows[i].rows.data = malloc(rows[i].rows.len ? rows[i].rows.len : 1);
    if (!rows[i].rows.data) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
    rowp[i] = &rows[i];
    ids[t] = q->tables[i]->ids;
    counts[t] = q->tables[i]->n_ids;
    outp[t] = (float *)rows[i].rows.data;
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  pthread_mutex_lock(&s->mu);
  int rc = emb_store_lookup_begin(s->store, q->header->step, &set, outp);
  if (!rc) rc = emb_store_lookup_wait(s->store);
  if (rc) snprintf(r->msg, sizeof r->msg, "lookup: %s", emb_store_errmsg(s->store));
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    r->status = RPC_INTERNAL;
    goto out;
  }
  Shardrec__V1__LookupResponse resp = SHARDREC__V1__LOOKUP_RESPONSE__INIT;
  resp.n_tables = q->n_tables;
  resp.tables = rowp;
  resp.incarnation = s->incarnation;
  pack_reply(r, &resp.base);
out:
  if (rows && q)
    for (size_t i = 0; i < q->n_tables; i++) free(rows[i].rows.data);
  free(rows);
  free(rowp);
  free(idx);
  free(seen);
  free(ids);
  free(counts);
  free(outp);
  if (q) shardrec__v1__lookup_request__free_unpacked(q, NULL);
}

/* Index of (job, rank) in the idempotency table, or -1. */
static int job_find(rpc_service *s, const char *job, int rank) {
  for (int i = 0; i < s->n_jobs; i++)
    if (s->jobs[i].rank == rank && !strcmp(s->jobs[i].job, job)) return i;
  return -1;
}

/* Add (job, rank) to the idempotency table (replacing the least recently
 * used entry when full); its index. */
static int job_record(rpc_service *s, const char *job, int rank, int64_t step, int stale) {
  int i = job_find(s, job, rank);
  if (i < 0) {
    if (s->n_jobs < SVC_MAX_JOBS) {
      i = s->n_jobs++;
    } else {
      i = 0;
      for (int k = 1; k < SVC_MAX_JOBS; k++)
        if (s->jobs[k].used < s->jobs[i].used) i = k;
    }
    snprintf(s->jobs[i].job, sizeof s->jobs[i].job, "%s", job);
    s->jobs[i].rank = rank;
    s->jobs[i].stale = stale;
  }
  s->jobs[i].last_step = step;
  s->jobs[i].used = ++s->clock;
  return i;
}

static int plan_index(const rpc_service *s, uint32_t table_id) {
  for (int t = 0; t < s->plan->n_tables; t++)
    if (s->plan->tables[t].table_id == table_id) return t;
  return -1;
}

typedef struct {
  uint64_t id;
  int rank;
  const uint8_t *g; /* dim floats, maybe unaligned */
} merge_ent;

static int cmp_ent(const void *a, const void *b) {
  const merge_ent *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Apply one step of a multi-rank job: qs[world] (all present). Per table,
 * the gradients of a row are summed over the ranks in rank order, then the
 * optimizer runs once. s->mu held. 0 or an SR_E* code (message in r). */
static int sync_apply(rpc_service *s, const sync_job *j, Shardrec__V1__PushRequest *const *qs,
                      rpc_reply *r) {
  const int nt = s->plan->n_tables, W = j->world;
  int rc = 0;
  size_t *cnt = calloc((size_t)nt, sizeof *cnt);
  const uint64_t **ids = calloc((size_t)nt, sizeof *ids);
  const float **grads = calloc((size_t)nt, sizeof *grads);
  size_t *counts = calloc((size_t)nt, sizeof *counts);
  uint64_t **uid = calloc((size_t)nt, sizeof *uid);
  float **sum = calloc((size_t)nt, sizeof *sum);
  merge_ent *e = NULL;
  if (!cnt || !ids || !grads || !counts || !uid || !sum) goto nomem;
  for (int k = 0; k < W; k++)
    for (size_t i = 0; i < qs[k]->n_tables; i++)
      cnt[plan_index(s, qs[k]->tables[i]->table_id)] += qs[k]->tables[i]->n_ids;
  for (int t = 0; t < nt; t++) {
    if (!cnt[t]) continue;
    const size_t dim = (size_t)s->plan->tables[t].dim;
    free(e);
    e = malloc(cnt[t] * sizeof *e);
    uid[t] = malloc(cnt[t] * sizeof **uid);
    sum[t] = malloc(cnt[t] * dim * sizeof **sum);
    if (!e || !uid[t] || !sum[t]) goto nomem;
    size_t n = 0;
    for (int k = 0; k < W; k++)
      for (size_t i = 0; i < qs[k]->n_tables; i++) {
        const Shardrec__V1__TableGrads *tg = qs[k]->tables[i];
        if (plan_index(s, tg->table_id) != t) continue;
        for (size_t x = 0; x < tg->n_ids; x++)
          e[n++] = (merge_ent){tg->ids[x], k, tg->grads.data + x * dim * sizeof(float)};
      }
    qsort(e, n, sizeof *e, cmp_ent);
    size_t u = 0;
    for (size_t x = 0; x < n; x++) {
      if (x == 0 || e[x].id != e[x - 1].id) {
        uid[t][u++] = e[x].id;
        memcpy(sum[t] + (u - 1) * dim, e[x].g, dim * sizeof(float));
      } else {
        float *acc = sum[t] + (u - 1) * dim;
        for (size_t d = 0; d < dim; d++) {
          float g;
          memcpy(&g, e[x].g + d * sizeof(float), sizeof g);
          acc[d] += g;
        }
      }
    }
    ids[t] = uid[t];
    grads[t] = sum[t];
    counts[t] = u;
  }
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  rc = emb_store_push(s->store, j->applied + 1, qs[0]->learning_rate, &set, grads);
  if (rc)
    snprintf(r->msg, sizeof r->msg, "push of step %lld of job %s: %s", (long long)j->applied + 1,
             j->job, emb_store_errmsg(s->store));
  goto done;
nomem:
  rc = SR_ENOMEM;
  snprintf(r->msg, sizeof r->msg, "out of memory merging the ranks' pushes");
done:
  if (uid)
    for (int t = 0; t < nt; t++) free(uid[t]);
  if (sum)
    for (int t = 0; t < nt; t++) free(sum[t]);
  free(uid);
  free(sum);
  free(e);
  free(cnt);
  free(ids);
  free(grads);
  free(counts);
  return rc;
}

static const char *mode_str(int stale, char *buf, size_t n) {
  if (stale) snprintf(buf, n, "async mode with max_staleness %d", stale);
  else snprintf(buf, n, "sync mode");
  return buf;
}

/* The multi-rank job named job, created at its first call, whose step
 * becomes the job's first. s->mu held. NULL when out of memory. */
static sync_job *sync_get(rpc_service *s, const char *job, int world, int64_t step, int stale,
                          int start) {
  sync_job *j = sync_find(s, job);
  if (j) {
    if (start && !j->started && !j->aborted && j->world == world && j->stale == stale) {
      /* made by a Watch: the first Lookup or Push fixes the first step */
      j->started = 1;
      j->applied = step - 1;
      if (j->done)
        for (int k = 0; k < world; k++) j->done[k] = step - 1;
      j->progress = now_us();
    }
    return j;
  }
  if (s->n_sync == s->cap_sync && s->cap_sync < SVC_MAX_JOBS) {
    int cap = s->cap_sync ? 2 * s->cap_sync : 8;
    sync_job *p = realloc(s->sync, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    s->sync = p;
    s->cap_sync = cap;
  }
  if (s->n_sync < s->cap_sync) {
    j = &s->sync[s->n_sync++];
  } else { /* forget the least recently used job */
    j = &s->sync[0];
    for (int i = 1; i < s->n_sync; i++)
      if (s->sync[i].used < j->used) j = &s->sync[i];
    s->dropped_steps += (uint64_t)sync_drop_held(j);
    sync_free(j);
  }
  memset(j, 0, sizeof *j);
  snprintf(j->job, sizeof j->job, "%s", job);
  j->world = world;
  j->stale = stale;
  j->started = start;
  j->applied = step - 1;
  j->progress = now_us();
  j->gone = calloc((size_t)world, 1);
  if (stale) {
    j->done = malloc((size_t)world * sizeof *j->done);
    if (j->done)
      for (int k = 0; k < world; k++) j->done[k] = step - 1;
  } else {
    j->have = calloc((size_t)SVC_AHEAD * (size_t)world, sizeof *j->have);
  }
  if ((!j->have && !j->done) || !j->gone) {
    sync_free(j);
    *j = s->sync[--s->n_sync];
    atomic_store(&s->sync_hint, s->n_sync);
    return NULL;
  }
  atomic_store(&s->sync_hint, s->n_sync);
  return j;
}

/* The multi-rank job of h, created at its first call; refuses a call
 * whose world size or mode differs from the job's, and every call of a job
 * whose pending state was dropped. s->mu held. NULL with r->status and
 * r->msg set when refused. */
static sync_job *job_enter(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r) {
  return job_enter_as(s, h, 1, r);
}

static sync_job *job_enter_as(rpc_service *s, const Shardrec__V1__RequestHeader *h, int start,
                              rpc_reply *r) {
  sync_job *j = sync_get(s, h->job_id, h->world_size, h->step, h->max_staleness, start);
  char a[64], b[64];
  if (!j) {
    r->status = RPC_RESOURCE_EXHAUSTED;
    snprintf(r->msg, sizeof r->msg, "out of memory for job %s", h->job_id);
    return NULL;
  }
  j->used = ++s->clock;
  if (j->aborted) {
    r->status = RPC_ABORTED;
    snprintf(r->msg, sizeof r->msg, "%s", j->why);
    return NULL;
  }
  if (j->world != h->world_size) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg, "job %s runs with world size %d; this call says %d", h->job_id,
             j->world, h->world_size);
    return NULL;
  }
  if (j->stale != h->max_staleness) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg,
             "header.max_staleness: job %s runs in %s (fixed at its first call); this call "
             "(rank %d, step %lld) asks for %s",
             h->job_id, mode_str(j->stale, a, sizeof a), h->rank, (long long)h->step,
             mode_str(h->max_staleness, b, sizeof b));
    return NULL;
  }
  return j;
}

/* A single-rank job: its mode is fixed at its first call too (the
 * idempotency table remembers it). s->mu held. Its index in the table, or
 * -1 with a status in r. */
static int solo_enter(rpc_service *s, const Shardrec__V1__RequestHeader *h, rpc_reply *r) {
  int i = job_find(s, h->job_id, h->rank);
  char a[64], b[64];
  if (i < 0) return job_record(s, h->job_id, h->rank, -1, h->max_staleness);
  if (s->jobs[i].stale != h->max_staleness) {
    r->status = RPC_FAILED_PRECONDITION;
    snprintf(r->msg, sizeof r->msg,
             "header.max_staleness: job %s runs in %s (fixed at its first call); this call "
             "(step %lld) asks for %s",
             h->job_id, mode_str(s->jobs[i].stale, a, sizeof a), (long long)h->step,
             mode_str(h->max_staleness, b, sizeof b));
    return -1;
  }
  return i;
}

/* "step T, which waited for rank(s) a,b": where j stands. s->mu held. */
static void job_where(const sync_job *j, char *buf, size_t n) {
  if (!j->started) {
    snprintf(buf, n, "its start (before any Lookup or Push)");
    return;
  }
  int64_t step = job_complete(j) + 1;
  int at = snprintf(buf, n, "step %lld, which waited for rank(s) ", (long long)step);
  int first = 1;
  for (int k = 0; k < j->world && at > 0 && (size_t)at + 16 < n; k++) {
    int missing = j->stale ? j->done[k] < step : !j->have[k];
    if (!missing) continue;
    at += snprintf(buf + at, n - (size_t)at, "%s%d", first ? "" : ",", k);
    first = 0;
  }
  if (first && at > 0 && (size_t)at < n) snprintf(buf + at, n - (size_t)at, "(none)");
}

static int job_held(const sync_job *j) {
  int n = 0;
  if (j->have)
    for (int i = 0; i < SVC_AHEAD * j->world; i++) n += j->have[i] != NULL;
  return n;
}

/* Drop j's pending state: its held pushes (a step is never half-applied),
 * and answer its parked Lookups ABORTED with a message that starts with
 * what (the cause). Later calls of the job are refused with the same
 * message; its completed steps stay applied. s->mu held. */
static void job_abort(rpc_service *s, sync_job *j, const char *what) {
  char where[160];
  job_where(j, where, sizeof where);
  int steps = sync_drop_held(j); /* > 0 exactly when a push was held */
  s->dropped_steps += (uint64_t)steps;
  s->dropped_jobs++;
  j->aborted = 1;
  snprintf(j->why, sizeof j->why, "job %.64s: %.150s during %.120s; %s", j->job, what, where,
           j->stale ? "its pushes so far stay applied (async mode)"
           : steps ? "the step's held pushes were dropped (nothing of it was applied)"
                  : "no push of it was held");
  for (int i = 0; i < s->n_parked; i++)
    if (!strcmp(s->parked[i].job, j->job)) {
      s->parked[i].abort = 1;
      snprintf(s->parked[i].why, sizeof s->parked[i].why, "%s", j->why);
    }
}

/* Take rank's push *qp of a multi-rank job. Sync: on success *qp becomes
 * NULL (the job owns it) and every step that is complete is applied.
 * Async: applied now from set/grads (q's arrays). s->mu held. Returns
 * RPC_OK or a status with the message in r. *applied: 1 when taken, 0 for
 * a retry of a push already in (or applied). */
static int sync_push(rpc_service *s, Shardrec__V1__PushRequest **qp, const emb_idset *set,
                     const float *const *grads, int *applied, rpc_reply *r) {
  Shardrec__V1__PushRequest *q = *qp;
  const Shardrec__V1__RequestHeader *h = q->header;
  sync_job *j = job_enter(s, h, r);
  if (!j) return r->status;
  *applied = 0;
  if (j->stale) {
    if (h->step <= j->done[h->rank]) return RPC_OK; /* a retry */
    if (emb_store_push(s->store, h->step, q->learning_rate, set, grads)) {
      snprintf(r->msg, sizeof r->msg, "push of step %lld of job %s: %s", (long long)h->step,
               h->job_id, emb_store_errmsg(s->store));
      return RPC_INTERNAL;
    }
    j->done[h->rank] = h->step;
    j->progress = now_us();
    *applied = 1;
    return RPC_OK;
  }
  if (h->step <= j->applied) return RPC_OK;
  int64_t a = h->step - j->applied - 1;
  if (a >= SVC_AHEAD) {
    snprintf(r->msg, sizeof r->msg,
             "push of step %lld of job %s: step %lld still misses ranks' pushes (at most %d steps "
             "are collected at once)",
             (long long)h->step, h->job_id, (long long)j->applied + 1, SVC_AHEAD);
    return RPC_FAILED_PRECONDITION;
  }
  Shardrec__V1__PushRequest **slot = &j->have[a * j->world + h->rank];
  if (*slot) return RPC_OK;
  *slot = q;
  *qp = NULL;
  *applied = 1;
  j->progress = now_us();
  const int W = j->world;
  for (;;) {
    for (int k = 0; k < W; k++)
      if (!j->have[k]) return RPC_OK;
    int rc = sync_apply(s, j, j->have, r);
    for (int k = 0; k < W; k++) shardrec__v1__push_request__free_unpacked(j->have[k], NULL);
    memmove(j->have, j->have + W, (size_t)(SVC_AHEAD - 1) * (size_t)W * sizeof *j->have);
    memset(j->have + (size_t)(SVC_AHEAD - 1) * (size_t)W, 0, (size_t)W * sizeof *j->have);
    j->applied++;
    if (rc) return RPC_INTERNAL;
  }
}

static void do_push(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  const int nt = s->plan->n_tables;
  Shardrec__V1__PushRequest *q = shardrec__v1__push_request__unpack(NULL, len, in);
  int *idx = NULL;
  uint8_t *seen = NULL;
  const uint64_t **ids = NULL;
  size_t *counts = NULL;
  const float **grads = NULL;
  float **copies = NULL;
  size_t n_copies = 0;
  uint64_t *sorted = NULL;
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.PushRequest (%zu bytes)", len);
  if (s->read_only) FAIL(r, RPC_FAILED_PRECONDITION, "this server is read-only: Push refused");
  if (check_header(s, q->header, r)) goto out;
  if (!isfinite(q->learning_rate) || q->learning_rate < 0)
    FAIL(r, RPC_INVALID_ARGUMENT, "learning_rate %g: must be finite and >= 0",
         (double)q->learning_rate);
  idx = calloc(q->n_tables + 1, sizeof *idx);
  seen = calloc((size_t)nt, 1);
  ids = calloc((size_t)nt, sizeof *ids);
  counts = calloc((size_t)nt, sizeof *counts);
  grads = calloc((size_t)nt, sizeof *grads);
  copies = calloc(q->n_tables + 1, sizeof *copies);
  n_copies = q->n_tables;
  if (!idx || !seen || !ids || !counts || !grads || !copies)
    FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
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
  sorted = malloc((most ? most : 1) * sizeof *sorted);
  if (!sorted) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < q->n_tables; i++) {
    const Shardrec__V1__TableGrads *tg = q->tables[i];
    const int t = idx[i], dim = s->plan->tables[t].dim;
    if (tg->n_ids) memcpy(sorted, tg->ids, tg->n_ids * sizeof *sorted);
    qsort(sorted, tg->n_ids, sizeof *sorted, cmp_u64);
    for (size_t k = 1; k < tg->n_ids; k++)
      if (sorted[k] == sorted[k - 1])
        FAIL(r, RPC_INVALID_ARGUMENT, "tables[%zu].ids: row %llu given twice (sum its gradients)",
             i, (unsigned long long)sorted[k]);
    const float *g = (const float *)tg->grads.data;
    if (((uintptr_t)g & 3u) != 0) {
      copies[i] = malloc(tg->grads.len ? tg->grads.len : 1);
      if (!copies[i]) FAIL(r, RPC_RESOURCE_EXHAUSTED, "out of memory");
      memcpy(copies[i], tg->grads.data, tg->grads.len);
      g = copies[i];
    }
    for (size_t k = 0; k < tg->n_ids * (size_t)dim; k++)
      if (!isfinite(g[k]))
        FAIL(r, RPC_INVALID_ARGUMENT, "tables[%zu].grads: row %llu element %zu is %g", i,
             (unsigned long long)tg->ids[k / (size_t)dim], k % (size_t)dim, (double)g[k]);
    ids[t] = tg->ids;
    counts[t] = tg->n_ids;
    grads[t] = g;
  }
  Shardrec__V1__PushResponse resp = SHARDREC__V1__PUSH_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  emb_idset set = {.n_tables = nt, .ids = ids, .counts = counts};
  const Shardrec__V1__RequestHeader *h = q->header;
  if (h->world_size > 1) {
    int applied = 0;
    /* Sync: a rank's push is kept (with its unaligned-gradient copies freed:
     * the merge reads the bytes with memcpy) until every rank's is in.
     * Async: applied now. */
    pthread_mutex_lock(&s->mu);
    int st = sync_push(s, &q, &set, grads, &applied, r);
    pthread_mutex_unlock(&s->mu);
    if (st) {
      r->status = st;
      goto out;
    }
    resp.applied = applied;
    resp.rows = applied ? total : 0;
    pack_reply(r, &resp.base);
    goto out;
  }
  pthread_mutex_lock(&s->mu);
  int rc = 0, j = solo_enter(s, h, r);
  if (j < 0) {
    pthread_mutex_unlock(&s->mu);
    goto out;
  }
  if (h->step <= s->jobs[j].last_step) {
    resp.applied = 0; /* a retry: already applied */
  } else {
    rc = emb_store_push(s->store, h->step, q->learning_rate, &set, grads);
    if (rc) snprintf(r->msg, sizeof r->msg, "push: %s", emb_store_errmsg(s->store));
    else {
      s->jobs[j].last_step = h->step;
      s->jobs[j].used = ++s->clock;
      resp.applied = 1;
      resp.rows = total;
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    r->status = RPC_INTERNAL;
    goto out;
  }
  pack_reply(r, &resp.base);
out:
  if (copies)
    for (size_t i = 0; i < n_copies; i++) free(copies[i]);
  free(copies);
  free(sorted);
  free(idx);
  free(seen);
  free(ids);
  free(counts);
  free(grads);
  if (q) shardrec__v1__push_request__free_unpacked(q, NULL);
}

/* path/shard-K (several shards: path/shard-K1-K2-...). */
static int shard_dir(const rpc_service *s, const char *path, char *out, size_t n) {
  int at = snprintf(out, n, "%s/shard", path);
  for (int i = 0; i < s->n_shards && at > 0 && (size_t)at < n; i++)
    at += snprintf(out + at, n - (size_t)at, "-%d", s->shards[i]);
  return (at > 0 && (size_t)at < n) ? 0 : -1;
}

static int check_path(const char *path, rpc_reply *r) {
  if (!path || !*path) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "path: empty");
    return r->status;
  }
  if (strlen(path) > 3000) {
    r->status = RPC_INVALID_ARGUMENT;
    snprintf(r->msg, sizeof r->msg, "path: longer than 3000 bytes");
    return r->status;
  }
  return 0;
}

static void do_checkpoint(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r,
                          int restore) {
  Shardrec__V1__CheckpointRequest *cq = NULL;
  Shardrec__V1__RestoreRequest *rq = NULL;
  const char *fp, *path;
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
  if (!fp || strcmp(fp, s->fp))
    FAIL(r, RPC_FAILED_PRECONDITION, "plan_fingerprint: request made under plan %.16s..., this server serves plan %.16s...",
         fp && *fp ? fp : "(none)", s->fp);
  if (check_path(path, r)) goto out;
  char dir[4096];
  if (s->store_shard_dirs) snprintf(dir, sizeof dir, "%s", path);
  else if (shard_dir(s, path, dir, sizeof dir)) FAIL(r, RPC_INVALID_ARGUMENT, "path: too long");
  pthread_mutex_lock(&s->mu);
  int rc = 0;
  if (restore) {
    rc = emb_store_restore(s->store, dir);
    if (!rc) { /* steps start over from the checkpoint's: every job's pending
                  state is dropped and its parked Lookups answered ABORTED */
      s->n_jobs = 0;
      for (int i = 0; i < s->n_sync; i++) {
        s->dropped_steps += (uint64_t)sync_drop_held(&s->sync[i]);
        sync_free(&s->sync[i]);
      }
      s->n_sync = 0;
      atomic_store(&s->sync_hint, 0);
      for (int i = 0; i < s->n_parked; i++) {
        if (s->parked[i].watch) continue; /* ranks are still there: keep watching */
        s->parked[i].abort = 1;
        snprintf(s->parked[i].why, sizeof s->parked[i].why,
                 "job %.64s: the server was restored from a checkpoint while this Lookup of step "
                 "%lld waited; the job's pending step state was dropped",
                 s->parked[i].job, (long long)s->parked[i].step);
      }
    }
  } else {
    if (mkdir(path, 0777) && errno != EEXIST) rc = SR_EIO;
    else if (!s->store_shard_dirs && mkdir(dir, 0777) && errno != EEXIST) rc = SR_EIO;
    if (rc)
      snprintf(r->msg, sizeof r->msg, "checkpoint: cannot create %.400s: %s", dir, strerror(errno));
    else {
      rc = emb_store_flush(s->store);
      if (!rc) rc = emb_store_checkpoint(s->store, dir);
    }
  }
  if (rc && !r->msg[0])
    snprintf(r->msg, sizeof r->msg, "%s %.300s: %.150s", restore ? "restore" : "checkpoint", dir,
             emb_store_errmsg(s->store));
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    r->status = rc == SR_ENOTFOUND ? RPC_NOT_FOUND : rc == SR_EIO ? RPC_INTERNAL : RPC_FAILED_PRECONDITION;
    goto out;
  }
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

/* Watch: park until the rank detaches (rpc/service.h, "Rank death"); detach:
 * release the rank's parked Watch and answer at once. */
static void do_watch(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r, void *token,
                     double timeout_s) {
  Shardrec__V1__WatchRequest *q = shardrec__v1__watch_request__unpack(NULL, len, in);
  if (!q) FAIL(r, RPC_INVALID_ARGUMENT, "not a valid shardrec.v1.WatchRequest (%zu bytes)", len);
  if (check_header(s, q->header, r)) goto out;
  const Shardrec__V1__RequestHeader *h = q->header;
  Shardrec__V1__WatchResponse resp = SHARDREC__V1__WATCH_RESPONSE__INIT;
  resp.incarnation = s->incarnation;
  if (h->world_size > 1) {
    pthread_mutex_lock(&s->mu);
    sync_job *j = job_enter_as(s, h, 0, r);
    int parked = 0, stopping = s->stopping, ok = j != NULL, gone = j && j->gone[h->rank];
    if (j && q->detach) {
      j->gone[h->rank] = 1;
      for (int i = 0; i < s->n_parked; i++)
        if (s->parked[i].watch && s->parked[i].rank == h->rank &&
            !strcmp(s->parked[i].job, h->job_id))
          s->parked[i].released = 1;
    } else if (j && !j->gone[h->rank] && token && !stopping) {
      parked = park(s, token, in, len, h, timeout_s, 1) == 0;
    }
    pthread_mutex_unlock(&s->mu); /* j may move from here on */
    if (!ok) goto out; /* refused: r has why */
    if (parked) {
      r->status = RPC_PARKED;
      goto out;
    }
    if (!q->detach && !gone)
      FAIL(r, RPC_UNAVAILABLE, "watch of job %s rank %d: %s", h->job_id, h->rank,
           stopping ? "the server is shutting down" : token ? "out of memory to wait" : "nothing to wait on (no call to hold)");
  }
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
  for (int i = 0; i < s->n_sync; i++) resp.pending_pushes += (uint64_t)job_held(&s->sync[i]);
  resp.dropped_steps = s->dropped_steps;
  resp.jobs = (uint64_t)s->n_sync;
  resp.dropped_jobs = s->dropped_jobs;
  pthread_mutex_unlock(&s->mu);
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
  pack_reply(r, &resp.base);
out:
  if (q) shardrec__v1__stats_request__free_unpacked(q, NULL);
}

static void do_health(rpc_service *s, const uint8_t *in, size_t len, rpc_reply *r) {
  (void)s;
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

void rpc_service_handle_call(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                             void *token, double timeout_s, rpc_reply *r) {
  memset(r, 0, sizeof *r);
  static const uint8_t none[1];
  if (!in) in = none, len = 0;
  double t0 = now_us();
  switch (m) {
    case RPC_LOOKUP: do_lookup(s, in, len, r, token, timeout_s); break;
    case RPC_PUSH: do_push(s, in, len, r); break;
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
  if (r->status != RPC_OK) {
    free(r->out);
    r->out = NULL;
    r->out_len = 0;
  }
  if (r->status == RPC_PARKED) return;
  double us = now_us() - t0;
  pthread_mutex_lock(&s->mu);
  lat_stat *l = &s->lat[m];
  l->calls++;
  l->sum_us += us;
  if (us > l->max_us) l->max_us = us;
  if (r->status != RPC_OK) s->failed++;
  pthread_mutex_unlock(&s->mu);
}

void rpc_service_handle(rpc_service *s, rpc_method m, const uint8_t *in, size_t len,
                        rpc_reply *r) {
  rpc_service_handle_call(s, m, in, len, NULL, 0, r);
}

/* Drop the pending state of jobs with no progress for pending_timeout_us
 * (a rank went away without a parked call to tell). s->mu held. */
static void sweep(rpc_service *s, double now) {
  for (int i = 0; i < s->n_sync; i++) {
    sync_job *j = &s->sync[i];
    if (j->aborted || now - j->progress < s->pending_timeout_us) continue;
    /* Pending: held pushes (sync), or ranks at different steps (async). */
    int pending = j->stale ? 0 : job_held(j) > 0;
    if (j->stale)
      for (int k = 1; k < j->world; k++) pending |= j->done[k] != j->done[0];
    int parked = 0;
    for (int p = 0; p < s->n_parked && !parked; p++)
      parked = !s->parked[p].watch && !strcmp(s->parked[p].job, j->job);
    if (!pending && !parked) continue;
    char what[128];
    snprintf(what, sizeof what, "no progress for %.0f s (a rank went away?)",
             s->pending_timeout_us / 1e6);
    job_abort(s, j, what);
  }
}

int rpc_service_take_woken(rpc_service *s, rpc_woken *out, int max) {
  if (max < 1) return 0;
  /* Nothing parked and no sweep due: nothing to do (without the lock). */
  if (atomic_load(&s->parked_hint) == 0 &&
      (atomic_load(&s->sync_hint) == 0 || (long long)now_us() < atomic_load(&s->next_sweep_us)))
    return 0;
  parked_call *taken = malloc((size_t)max * sizeof *taken);
  int *kind = malloc((size_t)max * sizeof *kind);
  if (!taken || !kind) {
    free(taken);
    free(kind);
    return 0;
  }
  double now = now_us();
  int n = 0;
  pthread_mutex_lock(&s->mu);
  if ((long long)now >= atomic_load(&s->next_sweep_us)) {
    sweep(s, now);
    atomic_store(&s->next_sweep_us, (long long)(now + sweep_every(s)));
  }
  for (int i = 0; i < s->n_parked && n < max;) {
    parked_call *p = &s->parked[i];
    const sync_job *j = sync_find(s, p->job);
    int k = s->stopping           ? 2
            : p->abort            ? 4
            : p->watch            ? (p->released ? 5 : now >= p->deadline ? 3 : 0)
            : (!j || job_ready(j, p->step)) ? 1
            : now >= p->deadline  ? 3
                                  : 0;
    if (!k) {
      i++;
      continue;
    }
    taken[n] = *p;
    if (k == 3 && !p->watch) taken[n].step = job_needs(j, p->step); /* for the message */
    kind[n++] = k;
    s->parked[i] = s->parked[--s->n_parked];
  }
  atomic_store(&s->parked_hint, s->n_parked);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++) {
    out[i].token = taken[i].token;
    rpc_reply *r = &out[i].r;
    if (kind[i] == 1) {
      rpc_service_handle_call(s, RPC_LOOKUP, taken[i].in, taken[i].len, NULL, 0, r);
    } else if (kind[i] == 5) {
      memset(r, 0, sizeof *r);
      Shardrec__V1__WatchResponse resp = SHARDREC__V1__WATCH_RESPONSE__INIT;
      resp.incarnation = s->incarnation;
      pack_reply(r, &resp.base);
    } else {
      memset(r, 0, sizeof *r);
      if (kind[i] == 4) {
        r->status = RPC_ABORTED;
        snprintf(r->msg, sizeof r->msg, "%s", taken[i].why);
      } else if (kind[i] == 2) {
        r->status = RPC_UNAVAILABLE;
        snprintf(r->msg, sizeof r->msg, "%s of job %.128s: the server is shutting down",
                 taken[i].watch ? "watch" : "lookup", taken[i].job);
      } else if (taken[i].watch) {
        r->status = RPC_DEADLINE_EXCEEDED;
        snprintf(r->msg, sizeof r->msg, "watch of job %.128s rank %d: deadline passed",
                 taken[i].job, taken[i].rank);
      } else {
        r->status = RPC_DEADLINE_EXCEEDED;
        snprintf(r->msg, sizeof r->msg,
                 "lookup of job %.128s: deadline passed waiting for every rank's push of step "
                 "%lld",
                 taken[i].job, (long long)taken[i].step);
      }
      pthread_mutex_lock(&s->mu);
      s->failed++;
      pthread_mutex_unlock(&s->mu);
    }
    free(taken[i].in);
  }
  free(taken);
  free(kind);
  return n;
}

int rpc_service_cancel(rpc_service *s, void *token) {
  pthread_mutex_lock(&s->mu);
  int i = 0;
  while (i < s->n_parked && s->parked[i].token != token) i++;
  if (i == s->n_parked) {
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  parked_call p = s->parked[i];
  s->parked[i] = s->parked[--s->n_parked];
  atomic_store(&s->parked_hint, s->n_parked);
  sync_job *j = sync_find(s, p.job);
  if (!j && p.watch && !s->stopping) { /* forgotten (Restore, or never started): refuse it now */
    Shardrec__V1__WatchRequest *wq = shardrec__v1__watch_request__unpack(NULL, p.len, p.in);
    if (wq && wq->header)
      j = sync_get(s, p.job, wq->header->world_size, 0, wq->header->max_staleness, 0);
    if (wq) shardrec__v1__watch_request__free_unpacked(wq, NULL);
  }
  if (j && !j->aborted && !s->stopping && !(p.rank < j->world && j->gone[p.rank])) {
    char what[200];
    if (p.watch)
      snprintf(what, sizeof what, "rank %d went away (its Watch was cancelled: its process ended)",
               p.rank);
    else
      snprintf(what, sizeof what, "rank %d went away (its Lookup of step %lld was cancelled)",
               p.rank, (long long)p.step);
    job_abort(s, j, what);
  }
  s->failed++;
  pthread_mutex_unlock(&s->mu);
  free(p.in);
  return 1;
}

void rpc_service_stop_parking(rpc_service *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  atomic_store(&s->parked_hint, s->n_parked);
  pthread_mutex_unlock(&s->mu);
}
