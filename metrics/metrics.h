/* Live figures for Prometheus: a registry of counters, gauges and histograms
 * with labels, written in the Prometheus text exposition format (version
 * 0.0.4), and an HTTP listener (libmicrohttpd) that serves it on GET
 * /metrics and GET /healthz, nothing else.
 *
 * A family (one metric name, its help, type and label names) holds series,
 * one per set of label values. Series are made once, at set-up or the first
 * time a label set is seen (under the registry's lock), and updated with
 * atomic operations only: an update is a few nanoseconds and never waits for
 * a scrape. A scrape runs the registry's collectors (callbacks that copy
 * figures kept elsewhere, such as a store's counters, into series with
 * metrics_*_set) and then writes every family. Names follow Prometheus'
 * conventions (base units, `_total` for counters, `_seconds`, `_bytes`); the
 * registry checks names and label names, not meanings. */
#ifndef SHARDREC_METRICS_METRICS_H
#define SHARDREC_METRICS_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct metrics_registry metrics_registry;
typedef struct metrics_family metrics_family;
typedef struct metrics_series metrics_series;

typedef enum { METRICS_COUNTER = 0, METRICS_GAUGE, METRICS_HISTOGRAM } metrics_type;

#define METRICS_MAX_LABELS 4
#define METRICS_MAX_BUCKETS 32

/* A registry (caller destroys). NULL when out of memory. */
metrics_registry *metrics_registry_create(void);
/* Frees the registry, its families and series (pointers into it die). NULL-safe. */
void metrics_registry_destroy(metrics_registry *r);

/* A label written on every series of r (e.g. rank="1"); name and value are
 * copied. 0, SR_EINVAL (bad name, more than METRICS_MAX_LABELS, or a family
 * already added) or SR_ENOMEM. */
int metrics_registry_label(metrics_registry *r, const char *name, const char *value);

/* A family of r: name (letters, digits, '_' and ':', not starting with a
 * digit), help text, type, n_labels label names (copied), and for a
 * histogram the upper bounds of its buckets, n_buckets strictly increasing
 * finite values (the +Inf bucket is added). The family belongs to r. NULL
 * with the reason in err on a bad name, a name given twice, bad buckets or
 * out of memory. */
metrics_family *metrics_family_add(metrics_registry *r, const char *name, const char *help,
                                   metrics_type type, int n_labels, const char *const *labels,
                                   const double *buckets, int n_buckets, char *err, size_t errlen);

/* The series of f with these label values (f's n_labels of them, copied;
 * any bytes, escaped when written), made on first use. Belongs to f's
 * registry. NULL when out of memory. Thread-safe (takes the registry's lock:
 * keep the pointer rather than asking again per update). */
metrics_series *metrics_series_get(metrics_family *f, const char *const *values);

/* Updates: lock-free, thread-safe, NULL-safe (a NULL series is ignored). */
void metrics_counter_add(metrics_series *s, double v); /* v >= 0 */
void metrics_counter_inc(metrics_series *s);
void metrics_gauge_set(metrics_series *s, double v);
void metrics_gauge_add(metrics_series *s, double v);
/* A counter kept elsewhere (copied in by a collector); counters only grow,
 * so the source must too. */
void metrics_counter_set(metrics_series *s, double v);
void metrics_histogram_observe(metrics_series *s, double v);

/* The value of a counter or gauge, or a histogram's count (for tests and
 * benches). */
double metrics_series_value(const metrics_series *s);

/* A function run at the start of every scrape, before anything is written
 * (it may set series of r; it must not add families). ctx is borrowed, or
 * owned by r when free_ctx is given (called on it by
 * metrics_registry_destroy). At most 8. 0 or SR_EINVAL. */
typedef void (*metrics_collect_fn)(void *ctx);
int metrics_registry_collector(metrics_registry *r, metrics_collect_fn fn, void *ctx,
                               void (*free_ctx)(void *));

/* A scrape: runs the collectors and writes every family in the text
 * exposition format into *out (malloc'd, NUL-terminated, caller frees),
 * its length in *len. Families in the order added, series in the order
 * made; histogram buckets cumulative, the +Inf bucket equal to _count.
 * 0 or SR_ENOMEM (nothing in *out). Scrapes are serialised among
 * themselves; updates go on meanwhile. */
int metrics_registry_write(metrics_registry *r, char **out, size_t *len);

/* The process collector: process_resident_memory_bytes (from
 * /proc/self/statm) and process_cpu_seconds_total into r. 0, SR_EINVAL
 * (names taken) or SR_ENOMEM, with the reason in err. */
int metrics_process_add(metrics_registry *r, char *err, size_t errlen);

/* Buckets for a latency histogram in seconds: 14 bounds from 50 us to 10 s. */
extern const double metrics_latency_buckets[14];

/* The HTTP listener. */
typedef struct metrics_http metrics_http;

typedef struct metrics_http_opts {
  int connection_limit; /* most connections at once (0: 128); more are refused */
  int timeout_s;        /* a connection idle this long is closed (0: 10) */
} metrics_http_opts;

/* Serves r (borrowed: destroy the listener first) on addr "HOST:PORT"
 * (HOST an IPv4 address or "localhost"; PORT 0 picks a free port) from a
 * thread of its own (epoll): GET or HEAD /metrics (text format 0.0.4) and
 * /healthz ("ok"); any other path 404, any other method 405. Slow clients
 * only hold their own connection, up to timeout_s idle and within the
 * connection limit. NULL with the reason in err (bad address, port taken). */
metrics_http *metrics_http_start(metrics_registry *r, const char *addr,
                                 const metrics_http_opts *o, char *err, size_t errlen);
/* The port bound (useful with port 0). */
int metrics_http_port(const metrics_http *h);
/* Stops the listener (open connections are closed). NULL-safe. */
void metrics_http_stop(metrics_http *h);

/* "HOST:PORT" into host[hostlen] and *port (0..65535); HOST an IPv4
 * address, "localhost" or empty (both 127.0.0.1). 0 or SR_EINVAL with the
 * reason in err. */
int metrics_addr_parse(const char *addr, char *host, size_t hostlen, int *port, char *err,
                       size_t errlen);

#endif
