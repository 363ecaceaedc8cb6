/* The /metrics listener on libmicrohttpd, and the process collector.
 * libmicrohttpd runs one thread of its own polling with epoll; a request
 * is answered from that thread (a scrape is a registry write, well under a
 * millisecond for shardrec's few hundred series), so a client that sends
 * slowly or never finishes only holds its connection, which is closed after
 * timeout_s without traffic, within connection_limit connections. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "common/num.h"
#include "metrics/metrics.h"

struct metrics_http {
  struct MHD_Daemon *d;
  metrics_registry *reg; /* borrowed */
  int port;
};

int metrics_addr_parse(const char *addr, char *host, size_t hostlen, int *port, char *err,
                       size_t errlen) {
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  long long p = -1;
  if (colon) sr_num_int(colon + 1, strlen(colon + 1), &p); /* p stays -1 unless a number */
  if (!colon || p < 0 || p > 65535 || (size_t)(colon - addr) >= hostlen) {
    sr_fmt(err, errlen, "'%s' is not HOST:PORT (PORT 0 to 65535)", addr ? addr : "");
    return SR_EINVAL;
  }
  size_t n = (size_t)(colon - addr);
  memcpy(host, addr, n);
  host[n] = 0;
  if (!n || !strcmp(host, "localhost")) snprintf(host, hostlen, "127.0.0.1");
  struct in_addr ia;
  if (inet_pton(AF_INET, host, &ia) != 1) {
    sr_fmt(err, errlen, "'%s': '%s' is not an IPv4 address", addr, host);
    return SR_EINVAL;
  }
  *port = (int)p;
  return 0;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned code, const char *type,
                              char *body, size_t len, int owned) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    if (owned) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(resp, "Allow", "GET, HEAD");
  enum MHD_Result rc = MHD_queue_response(c, code, resp);
  MHD_destroy_response(resp);
  return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_len, void **state) {
  (void)version;
  (void)upload;
  metrics_http *h = cls;
  static const char text[] = "text/plain; charset=utf-8";
  if (!*state) { /* first call: headers only; answer on the next, once any body is in */
    *state = h;
    return MHD_YES;
  }
  if (*upload_len) { /* a body we do not want: drop it */
    *upload_len = 0;
    return MHD_YES;
  }
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
    return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, "method not allowed\n", 19, 0);
  if (!strcmp(url, "/healthz")) return answer(c, MHD_HTTP_OK, text, "ok\n", 3, 0);
  if (strcmp(url, "/metrics")) return answer(c, MHD_HTTP_NOT_FOUND, text, "not found\n", 10, 0);
  char *body;
  size_t len;
  if (metrics_registry_write(h->reg, &body, &len))
    return answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, "out of memory\n", 14, 0);
  return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len, 1);
}

metrics_http *metrics_http_start(metrics_registry *r, const char *addr,
                                 const metrics_http_opts *o, char *err, size_t errlen) {
  char host[256];
  int port;
  if (metrics_addr_parse(addr, host, sizeof host, &port, err, errlen)) return NULL;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr); /* checked by metrics_addr_parse */
  metrics_http *h = calloc(1, sizeof *h);
  if (!h) {
    sr_fmt(err, errlen, "out of memory");
    return NULL;
  }
  h->reg = r;
  unsigned limit = o && o->connection_limit > 0 ? (unsigned)o->connection_limit : 128;
  unsigned timeout = o && o->timeout_s > 0 ? (unsigned)o->timeout_s : 10;
  h->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD, (uint16_t)port, NULL, NULL, on_request,
                          h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
                          timeout, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768,
                          MHD_OPTION_END);
  if (!h->d) {
    sr_fmt(err, errlen, "cannot listen on %s (address in use or not this host's?)", addr);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? info->port : port;
  return h;
}

int metrics_http_port(const metrics_http *h) { return h ? h->port : -1; }

void metrics_http_stop(metrics_http *h) {
  if (!h) return;
  MHD_stop_daemon(h->d);
  free(h);
}

/* ---- the process collector ---- */

typedef struct {
  metrics_series *rss, *cpu;
} proc_series;

static void proc_collect(void *ctx) {
  proc_series *p = ctx;
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size, res;
  if (f && fscanf(f, "%llu %llu", &size, &res) == 2)
    metrics_gauge_set(p->rss, (double)res * (double)sysconf(_SC_PAGESIZE));
  if (f) fclose(f);
  struct rusage ru;
  if (!getrusage(RUSAGE_SELF, &ru))
    metrics_counter_set(p->cpu, (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                                    (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec);
}

int metrics_process_add(metrics_registry *r, char *err, size_t errlen) {
  metrics_family *rss = metrics_family_add(r, "process_resident_memory_bytes",
                                           "Resident memory size in bytes.", METRICS_GAUGE, 0,
                                           NULL, NULL, 0, err, errlen);
  metrics_family *cpu = metrics_family_add(r, "process_cpu_seconds_total",
                                           "Total user and system CPU time spent in seconds.",
                                           METRICS_COUNTER, 0, NULL, NULL, 0, err, errlen);
  if (!rss || !cpu) return SR_EINVAL;
  proc_series *p = calloc(1, sizeof *p);
  if (!p || !(p->rss = metrics_series_get(rss, NULL)) || !(p->cpu = metrics_series_get(cpu, NULL)) ||
      metrics_registry_collector(r, proc_collect, p, free)) {
    free(p);
    sr_fmt(err, errlen, "metrics: out of memory");
    return SR_ENOMEM;
  }
  return 0;
}
