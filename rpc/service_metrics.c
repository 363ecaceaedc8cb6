/* A shard server's Prometheus series (rpc/service_metrics.h). The per-call
 * series are updated by the observe hook with atomics; everything Stats
 * already counts is copied in at scrape time (collect), under the service's
 * lock, rather than counted a second time. */
#include "rpc/service_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "embedding/store.h"

/* The figures copied in at scrape time, by index into m->fig. */
enum {
  F_ROWS_LOOKUP, F_ROWS_PUSH, F_FAILED, F_HELD_ROWS, F_HELD_BYTES, F_HITS, F_MISSES,
  F_PENDING, F_DROPPED_STEPS, F_JOBS, F_DROPPED_JOBS, F_PARKED_LOOKUPS, F_PARKED_WATCHES,
  F_EVICTIONS, F_WRITEBACKS, F_CACHE_CAP, F_CACHE_USED, F_SST,
  F_PENDING_COMPACTION, F_PINNED_ROWS, F_PINNED_BYTES, F_UNCLEAN, F_STREAMS, F_WAITING, F_N
};

typedef struct {
  const char *name, *help;
  metrics_type type;
  const char *method; /* the method label's value, or NULL for no label */
  int shard_only;     /* only for the shard store (RocksDB under a cache) */
} fig_def;

static const fig_def figs[F_N] = {
    [F_ROWS_LOOKUP] = {"shardrec_server_rows_total", "Rows carried by calls, by method.", METRICS_COUNTER, "lookup", 0},
    [F_ROWS_PUSH] = {"shardrec_server_rows_total", NULL, METRICS_COUNTER, "push", 0},
    [F_FAILED] = {"shardrec_server_failed_calls_total", "Calls answered with an error status (Stats failed_calls).", METRICS_COUNTER, NULL, 0},
    [F_HELD_ROWS] = {"shardrec_store_rows", "Rows held by the served shards (a shard store's: RocksDB's key estimate plus its dirty cached rows).", METRICS_GAUGE, NULL, 0},
    [F_HELD_BYTES] = {"shardrec_store_bytes", "Bytes held for those rows (values and optimizer state).", METRICS_GAUGE, NULL, 0},
    [F_HITS] = {"shardrec_cache_hits_total", "Rows looked up and served from memory.", METRICS_COUNTER, NULL, 0},
    [F_MISSES] = {"shardrec_cache_misses_total", "Rows looked up and read from RocksDB or initialised.", METRICS_COUNTER, NULL, 0},
    [F_PENDING] = {"shardrec_server_held_pushes", "Pushes of multi-rank jobs held now (sync steps not complete).", METRICS_GAUGE, NULL, 0},
    [F_DROPPED_STEPS] = {"shardrec_server_dropped_steps_total", "Steps whose held pushes were dropped.", METRICS_COUNTER, NULL, 0},
    [F_JOBS] = {"shardrec_server_jobs", "Multi-rank jobs known (aborted ones included).", METRICS_GAUGE, NULL, 0},
    [F_DROPPED_JOBS] = {"shardrec_server_dropped_jobs_total", "Multi-rank jobs whose pending state was dropped.", METRICS_COUNTER, NULL, 0},
    [F_PARKED_LOOKUPS] = {"shardrec_server_parked_lookups", "Lookups held now, waiting for their step.", METRICS_GAUGE, NULL, 0},
    [F_PARKED_WATCHES] = {"shardrec_server_parked_watches", "Watches held now.", METRICS_GAUGE, NULL, 0},
    [F_EVICTIONS] = {"shardrec_cache_evictions_total", "Rows evicted from the cache.", METRICS_COUNTER, NULL, 1},
    [F_WRITEBACKS] = {"shardrec_cache_writebacks_total", "Dirty rows written back to RocksDB.", METRICS_COUNTER, NULL, 1},
    [F_CACHE_CAP] = {"shardrec_cache_capacity_rows", "Rows the cache may hold.", METRICS_GAUGE, NULL, 1},
    [F_CACHE_USED] = {"shardrec_cache_used_rows", "Rows in the cache now.", METRICS_GAUGE, NULL, 1},
    [F_SST] = {"shardrec_rocksdb_sst_bytes", "Bytes of SST files in the shards' databases.", METRICS_GAUGE, NULL, 1},
    [F_PENDING_COMPACTION] = {"shardrec_rocksdb_pending_compaction_bytes", "Bytes RocksDB estimates compaction still has to rewrite.", METRICS_GAUGE, NULL, 1},
    [F_PINNED_ROWS] = {"shardrec_server_pinned_rows", "Rows of Lookup answers sent from the store's memory that gRPC still holds (Stats pinned_rows).", METRICS_GAUGE, NULL, 1},
    [F_PINNED_BYTES] = {"shardrec_server_pinned_bytes", "Their bytes, counted in the in-flight budget until released (Stats pinned_bytes).", METRICS_GAUGE, NULL, 1},
    [F_STREAMS] = {"shardrec_server_exchange_streams", "Exchange streams open now: clients sending Lookups, Pushes and PushLookups as messages of a stream each (Stats exchange_streams).", METRICS_GAUGE, NULL, 0},
    [F_WAITING] = {"shardrec_server_inflight_waiting", "Calls and exchange stream messages waiting now for room in the in-flight budget (Stats inflight_waiting).", METRICS_GAUGE, NULL, 0},
    [F_UNCLEAN] = {"shardrec_server_unclean", "1 while the served rows are the ones a crash left: Lookup, Push and Checkpoint refused until a Restore (Stats unclean).", METRICS_GAUGE, NULL, 0},
};

/* Each method's label; the last, "unknown", is every call to a method the
 * service does not have (RPC_METHOD_UNKNOWN: the name the client sent is
 * in the log, never in a label). */
#define N_LABELS (RPC_N_METHODS + 1)
static const char *const method_label[N_LABELS] = {
    "lookup", "push", "checkpoint", "restore", "stats", "health_check", "watch",
    "get_transform", "swap_at", "remove", "push_lookup", "unknown"};

struct rpc_service_metrics {
  metrics_registry *reg;  /* borrowed: it owns this */
  rpc_service *svc;       /* borrowed */
  metrics_family *errors, *info, *fam[F_N];
  metrics_series *calls[N_LABELS], *in[N_LABELS], *out[N_LABELS], *lat[N_LABELS], *fig[F_N];
};

void rpc_service_metrics_observe(void *ctx, rpc_method m, int status, const char *msg,
                                 double seconds, size_t in_bytes, size_t out_bytes) {
  (void)msg;
  rpc_service_metrics *x = ctx;
  if (m < 0 || m >= RPC_N_METHODS) m = RPC_N_METHODS; /* RPC_METHOD_UNKNOWN */
  metrics_counter_inc(x->calls[m]);
  metrics_counter_add(x->in[m], (double)in_bytes);
  metrics_counter_add(x->out[m], (double)out_bytes);
  metrics_histogram_observe(x->lat[m], seconds);
  if (status != RPC_OK) { /* rare: the series is found (or made) under the registry's lock */
    const char *v[] = {method_label[m], rpc_status_name(status)};
    metrics_counter_inc(metrics_series_get(x->errors, v));
  }
}

/* The per-method families and their series. 0 or -1 (err says why). */
static int add_call_families(rpc_service_metrics *x, char *err, size_t errlen) {
  const char *ml[] = {"method"}, *mc[] = {"method", "code"};
  metrics_registry *r = x->reg;
  metrics_family *calls = metrics_family_add(r, "shardrec_server_calls_total", "Calls handled, by method.", METRICS_COUNTER, 1, ml, NULL, 0, err, errlen);
  metrics_family *in = metrics_family_add(r, "shardrec_server_request_bytes_total", "Request bytes received, by method.", METRICS_COUNTER, 1, ml, NULL, 0, err, errlen);
  metrics_family *out = metrics_family_add(r, "shardrec_server_response_bytes_total", "Answer bytes sent, by method.", METRICS_COUNTER, 1, ml, NULL, 0, err, errlen);
  metrics_family *lat = metrics_family_add(r, "shardrec_server_call_duration_seconds", "Time to handle a call (server side), by method.", METRICS_HISTOGRAM, 1, ml, metrics_latency_buckets, 14, err, errlen);
  x->errors = metrics_family_add(r, "shardrec_server_errors_total", "Calls answered with an error, by method and gRPC status code.", METRICS_COUNTER, 2, mc, NULL, 0, err, errlen);
  const char *il[] = {"plan_fingerprint", "incarnation"};
  x->info = metrics_family_add(r, "shardrec_server_info", "This server: its plan's fingerprint and its incarnation (new per process, as Stats reports it).", METRICS_GAUGE, 2, il, NULL, 0, err, errlen);
  if (!calls || !in || !out || !lat || !x->errors || !x->info) return -1;
  for (int m = 0; m < N_LABELS; m++) {
    const char *v[] = {method_label[m]};
    x->calls[m] = metrics_series_get(calls, v);
    x->in[m] = metrics_series_get(in, v);
    x->out[m] = metrics_series_get(out, v);
    x->lat[m] = metrics_series_get(lat, v);
    if (!x->calls[m] || !x->in[m] || !x->out[m] || !x->lat[m])
      return sr_fmt(err, errlen, "metrics: out of memory"), -1;
  }
  return 0;
}

static void collect_view(void *ctx, const rpc_service_view *v) {
  rpc_service_metrics *x = ctx;
  double f[F_N] = {0};
  if (!v->st_rc) {
    const emb_store_stats st = v->st;
    f[F_ROWS_LOOKUP] = (double)st.lookups, f[F_ROWS_PUSH] = (double)st.pushes;
    f[F_HELD_ROWS] = (double)st.rows, f[F_HELD_BYTES] = (double)st.bytes;
    f[F_HITS] = (double)st.hits, f[F_MISSES] = (double)(st.lookups - st.hits);
  }
  f[F_FAILED] = (double)v->failed;
  f[F_PENDING] = (double)v->coord.pending_pushes, f[F_DROPPED_STEPS] = (double)v->coord.dropped_steps;
  f[F_JOBS] = (double)v->coord.jobs, f[F_DROPPED_JOBS] = (double)v->coord.dropped_jobs;
  f[F_PARKED_LOOKUPS] = (double)v->coord.parked_lookups;
  f[F_PARKED_WATCHES] = (double)v->coord.parked_watches;
  f[F_PINNED_ROWS] = (double)v->pinned_rows, f[F_PINNED_BYTES] = (double)v->pinned_bytes;
  f[F_UNCLEAN] = v->unclean;
  f[F_STREAMS] = (double)v->streams;
  f[F_WAITING] = (double)v->waiting;
  emb_store_figures k;
  if (!emb_store_figures_get(v->store, &k)) {
    f[F_EVICTIONS] = (double)k.evictions, f[F_WRITEBACKS] = (double)k.writebacks;
    f[F_CACHE_CAP] = (double)k.cache_rows, f[F_CACHE_USED] = (double)k.cache_used;
    f[F_SST] = (double)k.sst_bytes, f[F_PENDING_COMPACTION] = (double)k.pending_compaction_bytes;
  }
  for (int i = 0; i < F_N; i++) metrics_gauge_set(x->fig[i], f[i]);
}

static void collect(void *ctx) {
  rpc_service_metrics *x = ctx;
  if (x->svc) rpc_service_inspect(x->svc, collect_view, x);
}

rpc_service_metrics *rpc_service_metrics_add(metrics_registry *r, char *err, size_t errlen) {
  rpc_service_metrics *x = calloc(1, sizeof *x);
  if (!x) return sr_fmt(err, errlen, "metrics: out of memory"), NULL;
  x->reg = r;
  if (add_call_families(x, err, errlen) || metrics_registry_collector(r, collect, x, free)) {
    free(x);
    return NULL;
  }
  for (int i = 0; i < F_N; i++) {
    const char *ml[] = {"method"};
    if (figs[i].help) /* a second series of the family before has no help of its own */
      x->fam[i] = metrics_family_add(r, figs[i].name, figs[i].help, figs[i].type,
                                     figs[i].method ? 1 : 0, ml, NULL, 0, err, errlen);
    else x->fam[i] = x->fam[i - 1];
    if (!x->fam[i]) return NULL; /* x is r's now */
  }
  return x;
}

typedef struct {
  rpc_service_metrics *x;
  int rc;
} attach_ctx;

/* The scrape-time series (the shard store's only for it) and the info series. */
static void attach_view(void *ctx, const rpc_service_view *v) {
  attach_ctx *a = ctx;
  rpc_service_metrics *x = a->x;
  int shard = emb_store_kind_of(v->store) == EMB_STORE_SHARD;
  for (int i = 0; i < F_N; i++) {
    if (figs[i].shard_only && !shard) continue;
    const char *val[] = {figs[i].method};
    if (!(x->fig[i] = metrics_series_get(x->fam[i], val))) a->rc = SR_ENOMEM;
  }
  char inc[24];
  snprintf(inc, sizeof inc, "%llu", (unsigned long long)v->incarnation);
  const char *val[] = {v->plan_fp, inc};
  metrics_gauge_set(metrics_series_get(x->info, val), 1);
}

int rpc_service_metrics_attach(rpc_service_metrics *x, rpc_service *svc) {
  attach_ctx a = {x, 0};
  rpc_service_inspect(svc, attach_view, &a);
  if (!a.rc) x->svc = svc;
  return a.rc;
}
