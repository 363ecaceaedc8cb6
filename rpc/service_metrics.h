/* A shard server's figures for Prometheus (metrics/metrics.h): per method
 * the calls, request and answer bytes and a latency histogram, counted by
 * the service's observe hook; errors by method and status code; and at
 * every scrape what Stats reports (rows looked up and pushed, rows and
 * bytes held, cache hits and misses, held pushes, dropped steps and jobs),
 * the shard store's evictions and write-backs and its RocksDB figures
 * (SST bytes, pending compaction bytes), and an info
 * series shardrec_server_info{plan_fingerprint, incarnation} 1. The names
 * are in docs/DESIGN.md ("Watching a job"). */
#ifndef SHARDREC_RPC_SERVICE_METRICS_H
#define SHARDREC_RPC_SERVICE_METRICS_H

#include <stddef.h>

#include "metrics/metrics.h"
#include "rpc/service.h"

typedef struct rpc_service_metrics rpc_service_metrics;

/* The families of a shard server in r; the object is owned by r (freed by
 * metrics_registry_destroy). Give rpc_service_metrics_observe and it to
 * rpc_service_opts.observe / observe_ctx, then attach the service before
 * the first scrape. NULL with the reason in err. */
rpc_service_metrics *rpc_service_metrics_add(metrics_registry *r, char *err, size_t errlen);

/* The observe hook (rpc_service_opts.observe); ctx is the rpc_service_metrics. */
void rpc_service_metrics_observe(void *ctx, rpc_method m, int status, const char *msg,
                                 double seconds, size_t in_bytes, size_t out_bytes);

/* From now on scrapes read svc (borrowed: stop the listener before
 * destroying it). 0, or SR_ENOMEM. */
int rpc_service_metrics_attach(rpc_service_metrics *m, rpc_service *svc);

#endif
