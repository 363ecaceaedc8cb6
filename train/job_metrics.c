/* train --metrics-listen HOST:PORT: a Prometheus /metrics listener per
 * rank (metrics/metrics.h), on PORT + the rank's local rank (its place among
 * the ranks of its node), every series labelled rank="R". Every rank
 * exports its step, epoch, the time of its last step and of each phase in
 * it, the cumulated phase seconds, the bytes of rows it looked up and
 * pushed, and its process's memory; rank 0 adds the job's figures (the
 * progress line's loss and samples/s, the last test AUC and log loss,
 * recoveries). The updates are atomic stores made by the loop once per step
 * (job__metrics_step), never blocked by a scrape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sys.h"
#include "common/num.h"
#include "metrics/metrics.h"
#include "train/job_impl.h"

enum { PH_DEDUP, PH_LOOKUP, PH_PREFETCH, PH_POOL, PH_FORWARD, PH_BACKWARD, PH_SCATTER, PH_PUSH, PH_ALLREDUCE,
       PH_DENSE_OPT, PH_N };
static const char *const phase_name[PH_N] = {"dedup", "lookup", "prefetch", "pool", "forward", "backward",
                                             "scatter", "push", "allreduce", "dense_opt"};

enum { G_STEP, G_EPOCH, G_TOTAL, G_STEP_SECONDS, G_SAMPLES, G_LOOKUP_BYTES, G_PUSH_BYTES,
       G_LOSS, G_RATE, G_AUC, G_LOGLOSS, G_RECOVERIES, G_N };

typedef struct {
  const char *name, *help;
  metrics_type type;
  int rank0; /* the job's figure: rank 0 only */
} gdef;

static const gdef gdefs[G_N] = {
    [G_STEP] = {"shardrec_train_step", "Steps done.", METRICS_GAUGE, 0},
    [G_EPOCH] = {"shardrec_train_epoch", "The epoch the job is in (from 0).", METRICS_GAUGE, 0},
    [G_TOTAL] = {"shardrec_train_steps", "Steps the job will take in all.", METRICS_GAUGE, 0},
    [G_STEP_SECONDS] = {"shardrec_train_step_seconds", "Wall time of the last step (end to end).", METRICS_GAUGE, 0},
    [G_SAMPLES] = {"shardrec_train_samples_total", "Samples of the global batches trained on.", METRICS_COUNTER, 0},
    [G_LOOKUP_BYTES] = {"shardrec_train_lookup_bytes_total", "Bytes of embedding rows looked up (unique rows x dim x 4).", METRICS_COUNTER, 0},
    [G_PUSH_BYTES] = {"shardrec_train_push_bytes_total", "Bytes of row gradients pushed (unique rows x dim x 4).", METRICS_COUNTER, 0},
    [G_LOSS] = {"shardrec_train_loss", "Mean training loss since the progress line before (--print-freq).", METRICS_GAUGE, 1},
    [G_RATE] = {"shardrec_train_samples_per_second", "Samples per second since the progress line before.", METRICS_GAUGE, 1},
    [G_AUC] = {"shardrec_train_test_auc", "ROC AUC of the last test pass.", METRICS_GAUGE, 1},
    [G_LOGLOSS] = {"shardrec_train_test_logloss", "Log loss of the last test pass.", METRICS_GAUGE, 1},
    [G_RECOVERIES] = {"shardrec_train_recoveries_total", "Recoveries from a lost shard server.", METRICS_COUNTER, 1},
};

struct train_metrics {
  metrics_registry *reg; /* owned */
  metrics_http *http;    /* owned */
  /* The bounded tables' series (made at the first step: job__metrics_keep),
   * per plan index; NULL for a table without bounds. */
  metrics_series **krows; /* [n_tables] */
  metrics_series **kids;  /* [n_tables][KEEP_EVENTS] */
  metrics_series *g[G_N], *phase[PH_N], *phase_total[PH_N];
  double last_phase[PH_N], t_last;
  uint64_t last_rows;
};

/* This rank's place among the ranks of its node: Open MPI's, else PMI's
 * (hydra), else (neither set, or not a number 0 ... 65535) the rank
 * itself. */
static int local_rank(int rank) {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!v) v = getenv("MPI_LOCALRANKID");
  long long x;
  return v && !sr_num_int(v, strlen(v), &x) && x >= 0 && x <= 65535 ? (int)x : rank;
}

/* The series of m (rank's). 0 or -1 (err). */
static int add_series(train_metrics *m, int rank, char *err, size_t errlen) {
  for (int i = 0; i < G_N; i++) {
    if (gdefs[i].rank0 && rank != 0) continue;
    metrics_family *f = metrics_family_add(m->reg, gdefs[i].name, gdefs[i].help, gdefs[i].type,
                                           0, NULL, NULL, 0, err, errlen);
    if (!f || !(m->g[i] = metrics_series_get(f, NULL))) return -1;
  }
  const char *pl[] = {"phase"};
  metrics_family *ph = metrics_family_add(m->reg, "shardrec_train_step_phase_seconds", "Time of the last step in each phase.", METRICS_GAUGE, 1, pl, NULL, 0, err, errlen);
  metrics_family *pt = metrics_family_add(m->reg, "shardrec_train_phase_seconds_total", "Time in each phase of the step, all steps.", METRICS_COUNTER, 1, pl, NULL, 0, err, errlen);
  if (!ph || !pt) return -1;
  for (int p = 0; p < PH_N; p++) {
    const char *v[] = {phase_name[p]};
    if (!(m->phase[p] = metrics_series_get(ph, v)) || !(m->phase_total[p] = metrics_series_get(pt, v)))
      return -1;
  }
  return 0;
}

train_metrics *train_metrics_open(int rank, char *err, size_t errlen) {
  train_metrics *m = calloc(1, sizeof *m);
  char r[16];
  snprintf(r, sizeof r, "%d", rank);
  if (!m || !(m->reg = metrics_registry_create()) || metrics_registry_label(m->reg, "rank", r)) {
    snprintf(err, errlen, "out of memory");
    train_metrics_close(m);
    return NULL;
  }
  if (metrics_process_add(m->reg, err, errlen) || add_series(m, rank, err, errlen)) {
    train_metrics_close(m);
    return NULL;
  }
  metrics_gauge_set(m->g[G_AUC], 0.0 / 0.0); /* NaN until the first test pass */
  metrics_gauge_set(m->g[G_LOGLOSS], 0.0 / 0.0);
  m->t_last = sr_now();
  return m;
}

metrics_registry *train_metrics_registry(train_metrics *m) { return m->reg; }

void train_metrics_close(train_metrics *m) {
  if (!m) return;
  metrics_http_stop(m->http);
  metrics_registry_destroy(m->reg);
  free(m->krows);
  free(m->kids);
  free(m);
}

int job__metrics_check(const char *addr, char *err, size_t errlen) {
  char host[256], e[300];
  int port;
  if (!metrics_addr_parse(addr, host, sizeof host, &port, e, sizeof e)) return 0;
  snprintf(err, errlen, "--metrics-listen %s", e);
  return -1;
}

int job__metrics_start(train_job *j) {
  const train_config *c = j->cfg;
  char err[512], host[256], addr[300];
  int port;
  if (metrics_addr_parse(c->metrics_listen, host, sizeof host, &port, err, sizeof err))
    goto fail;
  int lr = local_rank(j->rank);
  if (port && port + lr > 65535) {
    snprintf(err, sizeof err, "port %d + local rank %d is over 65535", port, lr);
    goto fail;
  }
  snprintf(addr, sizeof addr, "%s:%d", host, port ? port + lr : 0);
  if (!(j->mx = train_metrics_open(j->rank, err, sizeof err))) goto fail;
  if (!(j->mx->http = metrics_http_start(j->mx->reg, addr, NULL, err, sizeof err))) goto fail;
  printf("metrics on %s:%d (rank %d)\n", host, metrics_http_port(j->mx->http), j->rank);
  fflush(stdout);
  return 0;
fail:
  job__errf(j, "--metrics-listen %s: %s\n", c->metrics_listen, err);
  return -1;
}

void job__metrics_stop(train_job *j) {
  train_metrics_close(j->mx);
  j->mx = NULL;
}

void train_metrics_note(train_metrics *m, const trainer_times *tt, int dim, int64_t step,
                        int epoch, int64_t total, int got) {
  const double now[PH_N] = {tt->dedup, tt->lookup, tt->prefetch, tt->pool, tt->forward, tt->backward,
                            tt->scatter, tt->push, tt->allreduce, tt->dense_opt};
  for (int p = 0; p < PH_N; p++) {
    metrics_gauge_set(m->phase[p], now[p] - m->last_phase[p]);
    metrics_counter_set(m->phase_total[p], now[p]);
    m->last_phase[p] = now[p];
  }
  double t = sr_now(), bytes = (double)(tt->rows - m->last_rows) * dim * 4.0;
  m->last_rows = tt->rows;
  metrics_gauge_set(m->g[G_STEP_SECONDS], t - m->t_last);
  m->t_last = t;
  metrics_counter_add(m->g[G_LOOKUP_BYTES], bytes);
  metrics_counter_add(m->g[G_PUSH_BYTES], bytes);
  metrics_counter_add(m->g[G_SAMPLES], got);
  metrics_gauge_set(m->g[G_TOTAL], (double)total);
  metrics_gauge_set(m->g[G_EPOCH], epoch);
  metrics_gauge_set(m->g[G_STEP], (double)step);
}

#define KEEP_EVENTS 4
static const char *const keep_event[KEEP_EVENTS] = {"admitted", "refused", "expired", "evicted"};

/* The bounded tables' families and series of m (plan's tables); 0, or -1
 * when out of memory (the series stay absent). */
static int keep_series(train_metrics *m, const emb_plan *plan) {
  char err[256];
  const char *l1[] = {"table"}, *l2[] = {"table", "event"};
  metrics_family *fr = metrics_family_add(
      m->reg, "shardrec_train_table_rows", "Rows a bounded table holds after the last step.",
      METRICS_GAUGE, 1, l1, NULL, 0, err, sizeof err);
  metrics_family *fe = metrics_family_add(
      m->reg, "shardrec_train_table_ids_total",
      "A bounded table's ids admitted (given a row), refused (looked up without one, once a "
      "step), expired and evicted.",
      METRICS_COUNTER, 2, l2, NULL, 0, err, sizeof err);
  m->krows = calloc((size_t)plan->n_tables, sizeof *m->krows);
  m->kids = calloc((size_t)plan->n_tables * KEEP_EVENTS, sizeof *m->kids);
  if (!fr || !fe || !m->krows || !m->kids) return -1;
  for (int f = 0; f < plan->n_tables; f++) {
    if (!emb_keep_on(&plan->tables[f])) continue;
    const char *v1[] = {plan->tables[f].name};
    m->krows[f] = metrics_series_get(fr, v1);
    for (int e = 0; e < KEEP_EVENTS; e++) {
      const char *v2[] = {plan->tables[f].name, keep_event[e]};
      m->kids[f * KEEP_EVENTS + e] = metrics_series_get(fe, v2);
    }
  }
  return 0;
}

/* The bounded tables' figures after the step (keep_stats). */
static void keep_note(train_job *j) {
  train_metrics *m = j->mx;
  if (!m->krows && keep_series(m, j->plan)) return;
  for (int f = 0; f < j->plan->n_tables; f++) {
    if (!m->krows[f]) continue;
    keep_table_stats st = keep_stats(j->keep, f);
    const uint64_t ev[KEEP_EVENTS] = {st.admitted, st.refused, st.expired, st.evicted};
    metrics_gauge_set(m->krows[f], (double)st.rows);
    for (int e = 0; e < KEEP_EVENTS; e++) metrics_counter_set(m->kids[f * KEEP_EVENTS + e], (double)ev[e]);
  }
}

void job__metrics_step(train_job *j, int got) {
  if (!j->mx) return;
  train_metrics_note(j->mx, trainer_times_get(j->t), j->plan->tables[0].dim, j->cur.step,
                     j->cur.epoch, j->total_steps, got);
  if (j->keep) keep_note(j);
}

void job__metrics_progress(train_job *j, double loss, double samples_per_s) {
  if (!j->mx) return;
  metrics_gauge_set(j->mx->g[G_LOSS], loss); /* NULL series (ranks > 0) are ignored */
  metrics_gauge_set(j->mx->g[G_RATE], samples_per_s);
}

void job__metrics_test(const train_job *j, double auc, double logloss) {
  if (!j->mx) return;
  metrics_gauge_set(j->mx->g[G_AUC], auc);
  metrics_gauge_set(j->mx->g[G_LOGLOSS], logloss);
}

void job__metrics_recovered(train_job *j) {
  if (j->mx) metrics_counter_inc(j->mx->g[G_RECOVERIES]);
}

void job__phase_json(train_job *j, char *buf, size_t n) {
  const trainer_times *tt = trainer_times_get(j->t), *m = &j->phase_mark;
  const double now[PH_N] = {tt->dedup, tt->lookup, tt->prefetch, tt->pool, tt->forward, tt->backward,
                            tt->scatter, tt->push, tt->allreduce, tt->dense_opt};
  const double was[PH_N] = {m->dedup, m->lookup, m->prefetch, m->pool, m->forward, m->backward,
                            m->scatter, m->push, m->allreduce, m->dense_opt};
  double steps = (double)(tt->steps - m->steps);
  size_t len = (size_t)snprintf(buf, n, ",\"step_ms\":{");
  for (int p = 0; p < PH_N && len < n; p++)
    len += (size_t)snprintf(buf + len, n - len, "%s\"%s\":%.4f", p ? "," : "", phase_name[p],
                            steps > 0 ? 1e3 * (now[p] - was[p]) / steps : 0.0);
  if (len < n) len += (size_t)snprintf(buf + len, n - len, "}");
  if (len < n && tt->lookup_flight > 0) /* not a phase: the lookups' time in flight, hidden or not */
    snprintf(buf + len, n - len, ",\"lookup_in_flight_ms\":%.4f",
             steps > 0 ? 1e3 * (tt->lookup_flight - m->lookup_flight) / steps : 0.0);
  j->phase_mark = *tt;
}
