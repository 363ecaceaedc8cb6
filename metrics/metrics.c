/* The registry of live figures and its text exposition writer. A value is
 * a double kept as its bits in an atomic 64-bit word (counters and gauges
 * change by compare-and-swap); a histogram keeps one atomic count per bucket
 * (not cumulative: the writer sums them), a count and a sum. The registry's
 * lock guards the lists of families and series only; the scrape lock keeps
 * two scrapes from running the collectors at once. */
#include "metrics/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

const double metrics_latency_buckets[14] = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
                                            10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0, 10.0};

struct metrics_series {
  metrics_series *next;
  metrics_family *fam;
  char *values[METRICS_MAX_LABELS]; /* owned */
  _Atomic uint64_t v;               /* counter, gauge: the double's bits; histogram: the sum's */
  _Atomic uint64_t count;           /* histogram */
  _Atomic uint64_t *buckets;        /* histogram: [n_buckets + 1], the last +Inf (owned) */
};

struct metrics_family {
  metrics_family *next;
  metrics_registry *reg;
  char *name, *help; /* owned */
  metrics_type type;
  int n_labels;
  char *labels[METRICS_MAX_LABELS]; /* owned */
  int n_buckets;
  double bounds[METRICS_MAX_BUCKETS];
  metrics_series *first, **tail;
};

typedef struct {
  metrics_collect_fn fn;
  void *ctx;
  void (*free_ctx)(void *);
} collector;

struct metrics_registry {
  pthread_mutex_t mu, scrape_mu;
  metrics_family *first, **tail;
  int n_const;
  char *const_names[METRICS_MAX_LABELS], *const_values[METRICS_MAX_LABELS]; /* owned */
  collector coll[8];
  int n_coll;
};

static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static double bitsd(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

static void atomic_add_double(_Atomic uint64_t *w, double v) {
  uint64_t old = atomic_load_explicit(w, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(w, &old, dbits(bitsd(old) + v),
                                                memory_order_relaxed, memory_order_relaxed)) {
  }
}

metrics_registry *metrics_registry_create(void) {
  metrics_registry *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  pthread_mutex_init(&r->mu, NULL);
  pthread_mutex_init(&r->scrape_mu, NULL);
  r->tail = &r->first;
  return r;
}

static void series_free(metrics_series *s) {
  for (int i = 0; i < METRICS_MAX_LABELS; i++) free(s->values[i]);
  free(s->buckets);
  free(s);
}

static void family_free(metrics_family *f) {
  for (metrics_series *s = f->first, *n; s; s = n) {
    n = s->next;
    series_free(s);
  }
  for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
  free(f->name);
  free(f->help);
  free(f);
}

void metrics_registry_destroy(metrics_registry *r) {
  if (!r) return;
  for (metrics_family *f = r->first, *n; f; f = n) {
    n = f->next;
    family_free(f);
  }
  for (int i = 0; i < r->n_const; i++) free(r->const_names[i]), free(r->const_values[i]);
  for (int i = 0; i < r->n_coll; i++)
    if (r->coll[i].free_ctx) r->coll[i].free_ctx(r->coll[i].ctx);
  pthread_mutex_destroy(&r->mu);
  pthread_mutex_destroy(&r->scrape_mu);
  free(r);
}

/* A metric or label name: [a-zA-Z_:][a-zA-Z0-9_:]* (labels: no ':'). */
static int name_ok(const char *s, int colon) {
  if (!s || !*s || (*s >= '0' && *s <= '9')) return 0;
  for (; *s; s++) {
    char c = *s;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || (colon && c == ':');
    if (!ok) return 0;
  }
  return 1;
}

int metrics_registry_label(metrics_registry *r, const char *name, const char *value) {
  if (!r || !name_ok(name, 0) || !value || r->n_const == METRICS_MAX_LABELS || r->first)
    return SR_EINVAL;
  char *n = strdup(name), *v = strdup(value);
  if (!n || !v) {
    free(n);
    free(v);
    return SR_ENOMEM;
  }
  r->const_names[r->n_const] = n;
  r->const_values[r->n_const++] = v;
  return 0;
}

/* Checks a family's arguments; 0 or -1 with the reason in err. */
static int family_check(metrics_registry *r, const char *name, int n_labels,
                        const char *const *labels, metrics_type type, const double *b, int nb,
                        char *err, size_t errlen) {
  if (!name_ok(name, 1)) return sr_fmt(err, errlen, "metrics: bad metric name '%s'", name ? name : ""), -1;
  if (n_labels < 0 || n_labels + r->n_const > METRICS_MAX_LABELS)
    return sr_fmt(err, errlen, "metrics: %s: too many labels", name), -1;
  for (int i = 0; i < n_labels; i++)
    if (!name_ok(labels[i], 0) || !strcmp(labels[i], "le"))
      return sr_fmt(err, errlen, "metrics: %s: bad label name '%s'", name, labels[i] ? labels[i] : ""), -1;
  if (type == METRICS_HISTOGRAM) {
    if (nb < 1 || nb > METRICS_MAX_BUCKETS)
      return sr_fmt(err, errlen, "metrics: %s: 1 to %d buckets", name, METRICS_MAX_BUCKETS), -1;
    for (int i = 0; i < nb; i++)
      if (!isfinite(b[i]) || (i && b[i] <= b[i - 1]))
        return sr_fmt(err, errlen, "metrics: %s: bucket bounds must be finite and increasing", name), -1;
  }
  for (metrics_family *f = r->first; f; f = f->next)
    if (!strcmp(f->name, name)) return sr_fmt(err, errlen, "metrics: %s given twice", name), -1;
  return 0;
}

metrics_family *metrics_family_add(metrics_registry *r, const char *name, const char *help,
                                   metrics_type type, int n_labels, const char *const *labels,
                                   const double *buckets, int n_buckets, char *err, size_t errlen) {
  pthread_mutex_lock(&r->mu);
  metrics_family *f = NULL;
  if (family_check(r, name, n_labels, labels, type, buckets, n_buckets, err, errlen)) goto out;
  f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(name)) || !(f->help = strdup(help ? help : ""))) goto nomem;
  for (int i = 0; i < n_labels; i++) {
    if (!(f->labels[i] = strdup(labels[i]))) goto nomem;
    f->n_labels = i + 1;
  }
  f->reg = r;
  f->type = type;
  if (type == METRICS_HISTOGRAM) {
    f->n_buckets = n_buckets;
    memcpy(f->bounds, buckets, (size_t)n_buckets * sizeof *buckets);
  }
  f->tail = &f->first;
  *r->tail = f;
  r->tail = &f->next;
  goto out;
nomem:
  if (f) family_free(f);
  f = NULL;
  sr_fmt(err, errlen, "metrics: %s: out of memory", name);
out:
  pthread_mutex_unlock(&r->mu);
  return f;
}

static int values_equal(const metrics_series *s, int n, const char *const *v) {
  for (int i = 0; i < n; i++)
    if (strcmp(s->values[i], v[i])) return 0;
  return 1;
}

/* A new series of f with values v (f's registry lock held); NULL on no memory. */
static metrics_series *series_new(metrics_family *f, const char *const *v) {
  metrics_series *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->fam = f;
  for (int i = 0; i < f->n_labels; i++)
    if (!(s->values[i] = strdup(v[i] ? v[i] : ""))) goto nomem;
  if (f->type == METRICS_HISTOGRAM &&
      !(s->buckets = calloc((size_t)f->n_buckets + 1, sizeof *s->buckets)))
    goto nomem;
  atomic_init(&s->v, dbits(0.0));
  return s;
nomem:
  series_free(s);
  return NULL;
}

metrics_series *metrics_series_get(metrics_family *f, const char *const *values) {
  if (!f) return NULL;
  metrics_registry *r = f->reg;
  pthread_mutex_lock(&r->mu);
  metrics_series *s = f->first;
  while (s && !values_equal(s, f->n_labels, values)) s = s->next;
  if (!s && (s = series_new(f, values))) {
    *f->tail = s;
    f->tail = &s->next;
  }
  pthread_mutex_unlock(&r->mu);
  return s;
}

void metrics_counter_add(metrics_series *s, double v) {
  if (s && v > 0) atomic_add_double(&s->v, v);
}

void metrics_counter_inc(metrics_series *s) { metrics_counter_add(s, 1.0); }

void metrics_gauge_set(metrics_series *s, double v) {
  if (s) atomic_store_explicit(&s->v, dbits(v), memory_order_relaxed);
}

void metrics_gauge_add(metrics_series *s, double v) {
  if (s) atomic_add_double(&s->v, v);
}

void metrics_counter_set(metrics_series *s, double v) { metrics_gauge_set(s, v); }

void metrics_histogram_observe(metrics_series *s, double v) {
  if (!s || !s->buckets) return;
  const metrics_family *f = s->fam;
  int i = 0;
  while (i < f->n_buckets && v > f->bounds[i]) i++; /* le: v <= bound */
  atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
  atomic_add_double(&s->v, v);
  atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
}

double metrics_series_value(const metrics_series *s) {
  if (!s) return 0;
  if (s->buckets) return (double)atomic_load_explicit(&s->count, memory_order_relaxed);
  return bitsd(atomic_load_explicit(&s->v, memory_order_relaxed));
}

int metrics_registry_collector(metrics_registry *r, metrics_collect_fn fn, void *ctx,
                               void (*free_ctx)(void *)) {
  if (!r || !fn || r->n_coll == 8) return SR_EINVAL;
  r->coll[r->n_coll++] = (collector){fn, ctx, free_ctx};
  return 0;
}

/* ---- the text writer ---- */

typedef struct {
  char *p;
  size_t len, cap;
  int failed;
} wbuf;

static void put(wbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void puts_(wbuf *b, const char *s) { put(b, s, strlen(s)); }

/* s escaped: '\\' and '\n' always, '"' too in label values. */
static void put_escaped(wbuf *b, const char *s, int quote) {
  for (const char *run = s;; s++) {
    const char *rep = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : (quote && *s == '"') ? "\\\"" : NULL;
    if (!rep && *s) continue;
    put(b, run, (size_t)(s - run));
    if (!*s) return;
    puts_(b, rep);
    run = s + 1;
  }
}

/* A sample value: integers exactly, others with 17 significant digits. */
static void put_value(wbuf *b, double v) {
  char t[40];
  if (isnan(v)) snprintf(t, sizeof t, "NaN");
  else if (isinf(v)) snprintf(t, sizeof t, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(t, sizeof t, "%.0f", v);
  else snprintf(t, sizeof t, "%.17g", v);
  puts_(b, t);
}

static void put_label(wbuf *b, int *first, const char *name, const char *value) {
  puts_(b, *first ? "{" : ",");
  *first = 0;
  puts_(b, name);
  puts_(b, "=\"");
  put_escaped(b, value, 1);
  puts_(b, "\"");
}

/* One sample line: NAME SUFFIX {labels[,le="LE"]} VALUE. */
static void put_sample(wbuf *b, const metrics_series *s, const char *suffix, const char *le,
                       double v) {
  const metrics_family *f = s->fam;
  const metrics_registry *r = f->reg;
  puts_(b, f->name);
  puts_(b, suffix);
  int first = 1;
  for (int i = 0; i < r->n_const; i++) put_label(b, &first, r->const_names[i], r->const_values[i]);
  for (int i = 0; i < f->n_labels; i++) put_label(b, &first, f->labels[i], s->values[i]);
  if (le) put_label(b, &first, "le", le);
  if (!first) puts_(b, "}");
  puts_(b, " ");
  put_value(b, v);
  puts_(b, "\n");
}

static void put_histogram(wbuf *b, const metrics_series *s) {
  const metrics_family *f = s->fam;
  /* The count first: every bucket read after it is at least as new, and the
   * cumulative sums are capped at it so +Inf equals _count exactly. */
  uint64_t count = atomic_load_explicit(&s->count, memory_order_relaxed), cum = 0;
  for (int i = 0; i <= f->n_buckets; i++) {
    cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
    if (cum > count || i == f->n_buckets) cum = count;
    char le[40];
    if (i == f->n_buckets) snprintf(le, sizeof le, "+Inf");
    else snprintf(le, sizeof le, "%.15g", f->bounds[i]);
    put_sample(b, s, "_bucket", le, (double)cum);
  }
  put_sample(b, s, "_sum", NULL, bitsd(atomic_load_explicit(&s->v, memory_order_relaxed)));
  put_sample(b, s, "_count", NULL, (double)count);
}

static void put_family(wbuf *b, const metrics_family *f) {
  static const char *const type[] = {"counter", "gauge", "histogram"};
  if (!f->first) return; /* no series yet: nothing to say */
  puts_(b, "# HELP ");
  puts_(b, f->name);
  puts_(b, " ");
  put_escaped(b, f->help, 0);
  puts_(b, "\n# TYPE ");
  puts_(b, f->name);
  puts_(b, " ");
  puts_(b, type[f->type]);
  puts_(b, "\n");
  for (const metrics_series *s = f->first; s; s = s->next) {
    if (f->type == METRICS_HISTOGRAM) put_histogram(b, s);
    else put_sample(b, s, "", NULL, bitsd(atomic_load_explicit(&s->v, memory_order_relaxed)));
  }
}

int metrics_registry_write(metrics_registry *r, char **out, size_t *len) {
  pthread_mutex_lock(&r->scrape_mu);
  for (int i = 0; i < r->n_coll; i++) r->coll[i].fn(r->coll[i].ctx);
  wbuf b = {0};
  put(&b, "", 0);
  pthread_mutex_lock(&r->mu); /* the lists only; series values are read atomically */
  for (const metrics_family *f = r->first; f; f = f->next) put_family(&b, f);
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&r->scrape_mu);
  if (b.failed) {
    free(b.p);
    return SR_ENOMEM;
  }
  *out = b.p;
  *len = b.len;
  return 0;
}
