/* serve's metrics listener and JSON event log (tools/serve_watch.h). */
#include "tools/serve_watch.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"

int serve_watch_addr(serve_watch *w, const char *addr) {
  char host[256], err[512];
  int port;
  if (metrics_addr_parse(addr, host, sizeof host, &port, err, sizeof err)) {
    fprintf(stderr, "shardrec serve: --metrics-listen %s\n", err);
    return 2;
  }
  w->metrics_addr = addr;
  return 0;
}

int serve_watch_log_format(serve_watch *w, const char *s) {
  if (!strcmp(s, "text")) w->json = 0;
  else if (!strcmp(s, "json")) w->json = 1;
  else {
    fprintf(stderr, "shardrec serve: --log-format: '%s' is not text or json\n", s);
    return 2;
  }
  return 0;
}

/* One event: {"time": seconds since the epoch, "event": what, ...fields}
 * on one line of stdout; takes o. Calls come from several threads: one
 * fputs of the whole line each, under stdout's lock. */
static void emit(cJSON *o, const char *event) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  cJSON *line = cJSON_CreateObject();
  cJSON_AddNumberToObject(line, "time", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  cJSON_AddStringToObject(line, "event", event);
  for (cJSON *c = o ? o->child : NULL; c;) {
    cJSON *next = c->next;
    cJSON_AddItemToObject(line, c->string, cJSON_DetachItemViaPointer(o, c));
    c = next;
  }
  cJSON_Delete(o);
  char *text = cJSON_PrintUnformatted(line);
  cJSON_Delete(line);
  if (!text) return;
  flockfile(stdout);
  fputs(text, stdout);
  fputc('\n', stdout);
  fflush(stdout);
  funlockfile(stdout);
  free(text);
}

void serve_watch_event(const serve_watch *w, const char *event, cJSON *o) {
  (void)w;
  emit(o, event);
}

static void observe(void *ctx, rpc_method m, int status, const char *msg, double seconds,
                    size_t in_bytes, size_t out_bytes) {
  serve_watch *w = ctx;
  if (w->sm) rpc_service_metrics_observe(w->sm, m, status, msg, seconds, in_bytes, out_bytes);
  if (!w->json || (status == RPC_OK && m != RPC_RESTORE)) return;
  cJSON *o = cJSON_CreateObject();
  const char *path = rpc_method_path(m), *slash = path ? strrchr(path, '/') : NULL;
  cJSON_AddStringToObject(o, "method", slash ? slash + 1 : "unknown");
  if (status != RPC_OK) {
    cJSON_AddStringToObject(o, "status", rpc_status_name(status));
    cJSON_AddNumberToObject(o, "code", status);
    cJSON_AddStringToObject(o, "message", msg ? msg : "");
  }
  emit(o, status == RPC_OK ? "restore" : "refused");
}

int serve_watch_prepare(serve_watch *w, rpc_service_opts *o, char *err, size_t errlen) {
  if (w->metrics_addr) {
    char host[256];
    int port;
    if (metrics_addr_parse(w->metrics_addr, host, sizeof host, &port, err, errlen)) return -1;
    if (!(w->reg = metrics_registry_create())) return sr_fmt(err, errlen, "out of memory"), -1;
    if (metrics_process_add(w->reg, err, errlen) ||
        !(w->sm = rpc_service_metrics_add(w->reg, err, errlen)))
      return -1;
  }
  if (w->sm || w->json) {
    o->observe = observe;
    o->observe_ctx = w;
  }
  return 0;
}

typedef struct {
  uint64_t dropped_jobs, dropped_steps;
} drops;

static void read_drops(void *ctx, const rpc_service_view *v) {
  drops *d = ctx;
  d->dropped_jobs = v->coord.dropped_jobs;
  d->dropped_steps = v->coord.dropped_steps;
}

/* Says each time the service's dropped jobs go up (JSON log only). */
static void *drop_watch(void *p) {
  serve_watch *w = p;
  drops last = {0, 0};
  while (!w->stop) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    drops d;
    rpc_service_inspect(w->svc, read_drops, &d);
    if (d.dropped_jobs == last.dropped_jobs) continue;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "jobs", (double)(d.dropped_jobs - last.dropped_jobs));
    cJSON_AddNumberToObject(o, "dropped_jobs", (double)d.dropped_jobs);
    cJSON_AddNumberToObject(o, "dropped_steps", (double)d.dropped_steps);
    emit(o, "dropped_job");
    last = d;
  }
  return NULL;
}

int serve_watch_start(serve_watch *w, rpc_service *svc, char *err, size_t errlen) {
  w->svc = svc;
  if (w->sm) {
    if (rpc_service_metrics_attach(w->sm, svc)) return sr_fmt(err, errlen, "out of memory"), -1;
    char e[512];
    if (!(w->http = metrics_http_start(w->reg, w->metrics_addr, NULL, e, sizeof e)))
      return sr_fmt(err, errlen, "--metrics-listen %s", e), -1;
    char host[256];
    int port;
    metrics_addr_parse(w->metrics_addr, host, sizeof host, &port, e, sizeof e);
    if (w->json) {
      cJSON *o = cJSON_CreateObject();
      snprintf(e, sizeof e, "%s:%d", host, metrics_http_port(w->http));
      cJSON_AddStringToObject(o, "listen", e);
      emit(o, "metrics");
    } else {
      printf("metrics on %s:%d\n", host, metrics_http_port(w->http));
      fflush(stdout);
    }
  }
  if (w->json) {
    if (pthread_create(&w->thread, NULL, drop_watch, w))
      return sr_fmt(err, errlen, "cannot start a thread"), -1;
    w->thread_started = 1;
  }
  return 0;
}

static void read_identity(void *ctx, const rpc_service_view *v) {
  cJSON *o = ctx;
  char inc[24];
  snprintf(inc, sizeof inc, "%llu", (unsigned long long)v->incarnation);
  cJSON_AddStringToObject(o, "plan_fingerprint", v->plan_fp);
  cJSON_AddStringToObject(o, "incarnation", inc);
}

void serve_watch_tls_refused(void *ctx, const char *reason, const char *detail) {
  (void)ctx;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "reason", reason);
  cJSON_AddStringToObject(o, "detail", detail);
  emit(o, "tls_refused");
}

void serve_watch_access(const serve_watch *w, const char *text) {
  if (!w->json) {
    printf("access: %s\n", text);
    fflush(stdout);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "access", text);
  emit(o, "access");
}

void serve_watch_listening(const serve_watch *w, const char *host, int hostlen, int port) {
  if (!w->json) {
    printf("listening on %.*s:%d\n", hostlen, host, port);
    fflush(stdout);
    return;
  }
  char addr[300];
  snprintf(addr, sizeof addr, "%.*s:%d", hostlen, host, port);
  cJSON *o = cJSON_CreateObject();
  if (w->restore) {
    cJSON_AddStringToObject(o, "path", w->restore);
    emit(o, "restore");
    o = cJSON_CreateObject();
  }
  cJSON_AddStringToObject(o, "listen", addr);
  if (w->svc) rpc_service_inspect(w->svc, read_identity, o);
  emit(o, "start");
}

void serve_watch_close(serve_watch *w, int stopped) {
  if (w->thread_started) {
    w->stop = 1;
    pthread_join(w->thread, NULL);
  }
  metrics_http_stop(w->http);
  metrics_registry_destroy(w->reg);
  if (stopped && w->json) emit(NULL, "stop");
  else if (stopped) {
    printf("stopped\n");
    fflush(stdout);
  }
}
