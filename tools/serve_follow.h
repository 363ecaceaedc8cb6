/* serve --checkpoint DIR --follow: the thread that looks at DIR and swaps
 * the served rows to each new checkpoint (embedding/served_follow.h), what
 * it says (a text line or a JSON event per swap and per refused
 * checkpoint) and its /metrics figures. Kept apart from cmd_serve.c so
 * that its flag lines stay the only change there. */
#ifndef SHARDREC_TOOLS_SERVE_FOLLOW_H
#define SHARDREC_TOOLS_SERVE_FOLLOW_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "embedding/served.h"
#include "embedding/served_follow.h"
#include "metrics/metrics.h"
#include "rpc/service.h"
#include "tools/serve_watch.h"

typedef struct serve_follow {
  int on;              /* --follow */
  double every_s;      /* --follow-every: seconds between looks at the folder */
  double grace_s;      /* --follow-grace: the step before a swap stays answerable this long */
  int64_t swap_at;     /* --swap-at-step, or -1 */
  emb_follow *f;       /* owned */
  rpc_service_versions versions;
  rpc_service *svc;    /* borrowed */
  const serve_watch *w; /* borrowed */
  metrics_series *m_step, *m_age, *m_swaps, *m_swap_s, *m_changed;
  metrics_series *m_refused[EMB_FOLLOW_N_REASONS];
  atomic_int stop;
  int started;
  pthread_t thread;
  pthread_mutex_t wake_mu; /* the thread sleeps between looks on wake, */
  pthread_cond_t wake;     /* which serve_follow_stop signals */
} serve_follow;

/* With sf->on: follow root (the --checkpoint folder) from sv (borrowed,
 * outliving sf), the figures into w's registry (when it has one), and the
 * versions into o. 0, or -1 with the reason in err. */
int serve_follow_prepare(serve_follow *sf, emb_served *sv, const char *root,
                         const serve_watch *w, rpc_service_opts *o, char *err, size_t errlen);
/* Starts the thread over svc (borrowed). 0, or -1 with the reason in err. */
int serve_follow_start(serve_follow *sf, rpc_service *svc, char *err, size_t errlen);
/* Stops the thread (no swap is left half done); the state stays for the
 * figures until serve_follow_free. */
void serve_follow_stop(serve_follow *sf);
void serve_follow_free(serve_follow *sf);

#endif
