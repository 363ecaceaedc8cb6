/* What `serve` shows beyond its gRPC answers: --metrics-listen (a
 * Prometheus /metrics listener, rpc/service_metrics.h) and --log-format json
 * (one JSON object per line on stdout per event: start, stop, refused call
 * with its method, status and message, restore, dropped jobs, a refused TLS
 * handshake). Kept apart
 * from cmd_serve.c so that its flag lines stay the only change there. */
#ifndef SHARDREC_TOOLS_SERVE_WATCH_H
#define SHARDREC_TOOLS_SERVE_WATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "metrics/metrics.h"
#include "rpc/service.h"
#include "rpc/service_metrics.h"

struct cJSON;

typedef struct serve_watch {
  const char *metrics_addr; /* --metrics-listen, or NULL */
  int json;                 /* --log-format json */
  const char *restore;      /* --restore PATH, or NULL (said in the JSON log) */
  metrics_registry *reg;    /* owned */
  rpc_service_metrics *sm;  /* reg's */
  metrics_http *http;       /* owned */
  rpc_service *svc;         /* borrowed */
  int thread_started;
  atomic_int stop;
  pthread_t thread;
} serve_watch;

/* --metrics-listen HOST:PORT into w (checked); 0, or 2 with the message printed. */
int serve_watch_addr(serve_watch *w, const char *addr);

/* "text" or "json" into w->json; 0, or 2 with the message printed. */
int serve_watch_log_format(serve_watch *w, const char *s);

/* The registry (when metrics_addr is set) and the hook into o. 0 or -1 with
 * the reason in err. */
int serve_watch_prepare(serve_watch *w, rpc_service_opts *o, char *err, size_t errlen);

/* Attaches svc (borrowed), starts the listener (prints "metrics on
 * HOST:PORT", or a JSON event) and the dropped-job watch. 0 or -1 (err). */
int serve_watch_start(serve_watch *w, rpc_service *svc, char *err, size_t errlen);

/* Prints what is open to whom (text): "access: TEXT", or an "access" event
 * with it as "access". */
void serve_watch_access(const serve_watch *w, const char *text);

/* A client's TLS handshake the server refused (rpc_server_opts.on_tls_refused,
 * with --log-format json; ctx is the serve_watch): a "tls_refused" event with
 * its "reason" and OpenSSL's "detail". */
void serve_watch_tls_refused(void *ctx, const char *reason, const char *detail);

/* One JSON event line (with --log-format json): {"time", "event": event,
 * then the fields of o}; takes o. */
void serve_watch_event(const serve_watch *w, const char *event, struct cJSON *o);
/* Prints the start event: listening on HOST:PORT, as text or JSON. */
void serve_watch_listening(const serve_watch *w, const char *host, int hostlen, int port);

/* Prints the stop event, stops the listener and frees everything. NULL-safe fields. */
void serve_watch_close(serve_watch *w, int stopped);

#endif
