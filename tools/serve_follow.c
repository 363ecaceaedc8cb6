/* serve --follow's thread, log lines and figures (tools/serve_follow.h). */
#include "tools/serve_follow.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "common/sys.h"

/* rpc_service_versions.pick: emb_follow_pick's answer as a gRPC status. */
static int pick(void *ctx, int64_t asked, int step_asked, int64_t *step, char *msg, size_t len) {
  int a = emb_follow_pick(ctx, asked, step_asked, step, msg, len);
  return a == EMB_FOLLOW_SERVED ? RPC_OK
         : a == EMB_FOLLOW_AHEAD ? RPC_UNAVAILABLE
                                 : RPC_FAILED_PRECONDITION;
}

/* rpc_service_versions.own_reads: the follower's. */
static void own_reads(void *ctx, uint64_t *rows, uint64_t *hits) {
  emb_follow_own_reads(ctx, rows, hits);
}

/* rpc_service_versions.swap_at: emb_follow_swap_at's answer as a gRPC status. */
static int swap_at(void *ctx, int64_t step, int64_t *served, char *msg, size_t len) {
  return emb_follow_swap_at(ctx, step, served, msg, len) == EMB_FOLLOW_SERVED
             ? RPC_OK
             : RPC_FAILED_PRECONDITION;
}

static void exclusive(void *ctx, void (*fn)(void *), void *arg) {
  rpc_service_exclusive(((serve_follow *)ctx)->svc, fn, arg);
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* At each scrape: the served checkpoint's age. */
static void collect(void *ctx) {
  serve_follow *sf = ctx;
  double done = emb_follow_completed(sf->f);
  metrics_gauge_set(sf->m_age, done > 0 ? wall_now() - done : 0);
}

static int add_figures(serve_follow *sf, metrics_registry *r, char *err, size_t errlen) {
  static const double secs[] = {0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10};
  static const char *const reason[] = {"reason"};
  metrics_family *step = metrics_family_add(r, "shardrec_serve_checkpoint_step", "The step of the checkpoint served.", METRICS_GAUGE, 0, NULL, NULL, 0, err, errlen);
  metrics_family *age = metrics_family_add(r, "shardrec_serve_checkpoint_age_seconds", "Seconds since the served checkpoint completed (its DONE was written).", METRICS_GAUGE, 0, NULL, NULL, 0, err, errlen);
  metrics_family *swaps = metrics_family_add(r, "shardrec_serve_swaps_total", "Swaps to a newer checkpoint.", METRICS_COUNTER, 0, NULL, NULL, 0, err, errlen);
  metrics_family *dur = metrics_family_add(r, "shardrec_serve_swap_seconds", "Time Lookups were held out by a swap (laying the changed rows).", METRICS_HISTOGRAM, 0, NULL, secs, 11, err, errlen);
  metrics_family *chg = metrics_family_add(r, "shardrec_serve_swap_rows_changed", "Rows the last swap laid over the served ones.", METRICS_GAUGE, 0, NULL, NULL, 0, err, errlen);
  metrics_family *ref = metrics_family_add(r, "shardrec_serve_checkpoints_refused_total", "Checkpoints not served, by reason (incomplete, damaged, plan, transform, layout, rows, failed).", METRICS_COUNTER, 1, reason, NULL, 0, err, errlen);
  if (!step || !age || !swaps || !dur || !chg || !ref) return -1;
  sf->m_step = metrics_series_get(step, NULL);
  sf->m_age = metrics_series_get(age, NULL);
  sf->m_swaps = metrics_series_get(swaps, NULL);
  sf->m_swap_s = metrics_series_get(dur, NULL);
  sf->m_changed = metrics_series_get(chg, NULL);
  for (int i = 0; i < EMB_FOLLOW_N_REASONS; i++) {
    const char *v[] = {emb_follow_reason_name((emb_follow_reason)i)};
    sf->m_refused[i] = metrics_series_get(ref, v);
  }
  if (metrics_registry_collector(r, collect, sf, NULL))
    return sr_fmt(err, errlen, "metrics: too many collectors"), -1;
  return 0;
}

int serve_follow_prepare(serve_follow *sf, emb_served *sv, const char *root,
                         const serve_watch *w, rpc_service_opts *o, char *err, size_t errlen) {
  if (!sf->on) return 0;
  emb_follow_opts fo = {.root = root, .grace_s = sf->grace_s, .swap_at = sf->swap_at,
                        .exclusive = exclusive, .exclusive_ctx = sf};
  if (!(sf->f = emb_follow_create(sv, &fo, err, errlen))) return -1;
  sf->w = w;
  sf->versions = (rpc_service_versions){.pick = pick, .patch = emb_follow_patch,
                                        .swap_at = swap_at, .own_reads = own_reads, .ctx = sf->f};
  o->versions = &sf->versions;
  if (w->reg && add_figures(sf, w->reg, err, errlen)) return -1;
  metrics_gauge_set(sf->m_step, (double)sv->step);
  return 0;
}

/* One line (text) or one event (JSON) for what the look at the folder did. */
static void say(serve_follow *sf, const emb_follow_event *ev) {
  const double fresh = wall_now() - emb_follow_completed(sf->f);
  if (ev->what == EMB_FOLLOW_SWAPPED && !sf->w->json) {
    printf("checkpoint %s: step %lld served (was %lld; %s, %llu rows changed, %llu held; "
           "prepared in %.3f s, swapped in %.6f s; %.3f s after it completed)\n",
           ev->dir, (long long)ev->step, (long long)ev->from_step,
           ev->incremental ? "incremental" : "full", (unsigned long long)ev->rows_changed,
           (unsigned long long)ev->rows_held, ev->prepare_s, ev->swap_s, fresh);
  } else if (!sf->w->json) {
    printf("checkpoint %s refused (%s): %s; still serving step %lld\n", ev->dir,
           emb_follow_reason_name(ev->reason), ev->msg, (long long)emb_follow_step(sf->f));
  } else {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "dir", ev->dir);
    cJSON_AddNumberToObject(o, "step", (double)ev->step);
    if (ev->what == EMB_FOLLOW_SWAPPED) {
      cJSON_AddNumberToObject(o, "from_step", (double)ev->from_step);
      cJSON_AddStringToObject(o, "kind", ev->incremental ? "incremental" : "full");
      cJSON_AddNumberToObject(o, "rows_changed", (double)ev->rows_changed);
      cJSON_AddNumberToObject(o, "rows_held", (double)ev->rows_held);
      cJSON_AddNumberToObject(o, "prepare_s", ev->prepare_s);
      cJSON_AddNumberToObject(o, "swap_s", ev->swap_s);
      cJSON_AddNumberToObject(o, "fresh_s", fresh);
    } else {
      cJSON_AddStringToObject(o, "reason", emb_follow_reason_name(ev->reason));
      cJSON_AddStringToObject(o, "message", ev->msg);
      cJSON_AddNumberToObject(o, "serving", (double)emb_follow_step(sf->f));
    }
    serve_watch_event(sf->w, ev->what == EMB_FOLLOW_SWAPPED ? "swap" : "checkpoint_refused", o);
    return;
  }
  fflush(stdout);
}

static void *follow_thread(void *p) {
  serve_follow *sf = p;
  while (!atomic_load(&sf->stop)) {
    emb_follow_event ev;
    for (emb_follow_poll(sf->f, &ev); ev.what != EMB_FOLLOW_NOTHING && !atomic_load(&sf->stop);
         emb_follow_poll(sf->f, &ev)) {
      if (ev.what == EMB_FOLLOW_SWAPPED) {
        metrics_gauge_set(sf->m_step, (double)ev.step);
        metrics_counter_inc(sf->m_swaps);
        metrics_histogram_observe(sf->m_swap_s, ev.swap_s);
        metrics_gauge_set(sf->m_changed, (double)ev.rows_changed);
      } else {
        metrics_counter_inc(sf->m_refused[ev.reason]);
      }
      say(sf, &ev);
    }
    /* Until the next look, or until serve_follow_stop. */
    const struct timespec until = sr_deadline(CLOCK_MONOTONIC, sf->every_s);
    pthread_mutex_lock(&sf->wake_mu);
    while (!atomic_load(&sf->stop) &&
           pthread_cond_timedwait(&sf->wake, &sf->wake_mu, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&sf->wake_mu);
  }
  return NULL;
}

int serve_follow_start(serve_follow *sf, rpc_service *svc, char *err, size_t errlen) {
  if (!sf->on) return 0;
  sf->svc = svc;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&sf->wake, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&sf->wake_mu, NULL);
  if (pthread_create(&sf->thread, NULL, follow_thread, sf)) {
    pthread_cond_destroy(&sf->wake);
    pthread_mutex_destroy(&sf->wake_mu);
    return sr_fmt(err, errlen, "cannot start a thread"), -1;
  }
  sf->started = 1;
  return 0;
}

void serve_follow_stop(serve_follow *sf) {
  if (!sf->started) return;
  pthread_mutex_lock(&sf->wake_mu); /* not between the thread's check and its wait */
  atomic_store(&sf->stop, 1);
  pthread_cond_signal(&sf->wake);
  pthread_mutex_unlock(&sf->wake_mu);
  pthread_join(sf->thread, NULL);
  pthread_cond_destroy(&sf->wake);
  pthread_mutex_destroy(&sf->wake_mu);
  sf->started = 0;
}

void serve_follow_free(serve_follow *sf) {
  serve_follow_stop(sf);
  emb_follow_destroy(sf->f);
  sf->f = NULL;
}
