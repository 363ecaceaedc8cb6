/* Colocated shards (train/colocate.h): this rank's shards of the plan
 * in gRPC server threads of the trainer's own process, their addresses
 * gathered to every rank with the job's collective (dense/collective.h).
 *
 * One rpc_server (with its own service and store) per hosted shard, each on
 * a port of its own, rather than one server for all of a rank's shards: the
 * remote store holds one connection per shard and sends every shard its own
 * Push of each step, and a service keys Push idempotency and the multi-rank
 * step order on (job, step, rank); two shards behind one service would see
 * the second shard's push of a step as a retry of the first and drop it.
 * With one service per shard every address is a server exactly like
 * `shardrec serve --shard K`: the same step order, the same checkpoint
 * layout (path/shard-K), the same Restore. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/shard.h"
#include "embedding/store.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "storage/ckpt_dir.h"
#include "train/colocate.h"

#define CO_ADDR 64  /* one "host:port" in the gathered buffer, NUL included */
#define CO_ERR 448  /* a failing rank's reason in the gathered buffer */

/* One shard's server thread. state: 0 starting, 1 listening, 2 returned
 * (failed before listening, or stopped); guarded by mu. */
typedef struct {
  int shard;
  emb_store *store;   /* owned */
  rpc_service *svc;   /* owned */
  pthread_t th;
  int have_thread;
  volatile int stop;  /* read by rpc_server_run's loop in the server thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state, port, rc;
  char listen[CO_ADDR];     /* "host:0", then "host:port" once bound */
  int threads;
  char err[512];
} co_server;

struct colocate {
  int n;          /* hosted shards */
  co_server *s;   /* [n], owned */
};

static void on_listening(int port, void *ctx) {
  co_server *s = ctx;
  pthread_mutex_lock(&s->mu);
  s->port = port;
  s->state = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void *server_main(void *arg) {
  co_server *s = arg;
  /* Short grace: at stop every trainer of the job is done with this shard
   * (the caller's barrier), so only the detached Watches are left. */
  rpc_server_opts o = {.listen = s->listen, .threads = s->threads, .stop = &s->stop,
                       .shutdown_grace_s = 2};
  char err[512] = "";
  int rc = rpc_server_run(s->svc, &o, on_listening, s, err, sizeof err);
  pthread_mutex_lock(&s->mu);
  s->rc = rc;
  if (rc) snprintf(s->err, sizeof s->err, "%s", err);
  s->state = 2;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

void colocate_addrs_free(char **addrs, int n) {
  if (!addrs) return;
  for (int i = 0; i < n; i++) free(addrs[i]);
  free(addrs);
}

void colocate_stop(colocate *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) {
    co_server *s = &c->s[i];
    if (s->have_thread) {
      s->stop = 1;
      pthread_join(s->th, NULL);
      /* rpc_server_run flushes the store on shutdown; a failure there means
       * rows pushed since the last checkpoint did not reach the disk. The
       * trainer has finished by now, so say so rather than lose it. */
      if (s->rc && s->state == 2 && s->port)
        fprintf(stderr, "shardrec: colocated shard %d: %s\n", s->shard, s->err);
    }
    rpc_service_destroy(s->svc);
    emb_store_destroy(s->store);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
  }
  free(c->s);
  free(c);
}

int colocate_data_fresh(const char *data_dir, int k, const char *owner, char *err, size_t errlen) {
  char db[SR_PATH_MAX];
  int removed, rc = ckpt_dir_fresh_shard(data_dir, k, owner, &removed, db, sizeof db);
  if (rc == SR_EEXISTS)
    sr_fmt(err, errlen, "--data-dir %s: holds shard databases of an earlier run (%s); remove "
           "them, or --resume a checkpoint", data_dir, db);
  else if (rc)
    sr_fmt(err, errlen, "--data-dir %s: cannot remove %s", data_dir, db);
  if (rc) return rc;
  if (removed)
    printf("note   --data-dir %s: %s, left by a start of this job before its first checkpoint "
           "in %s: removed, the job starts afresh\n", data_dir, db, owner);
  return owner ? ckpt_dir_data_claim(data_dir, owner, err, errlen) : 0;
}

/* Start the server of shard k (store, service, thread) and wait until its
 * port is bound. 0, or a status with the reason in err. */
static int server_start(co_server *s, const emb_plan *plan, int k, const colocate_opts *o,
                        int n_hosted, char *err, size_t errlen) {
  s->shard = k;
  s->threads = o->threads > 0 ? o->threads : 2;
  const char *host = o->host && *o->host ? o->host : "127.0.0.1";
  /* An IPv6 literal needs brackets before the port. */
  int v6 = strchr(host, ':') != NULL;
  if (snprintf(s->listen, sizeof s->listen, v6 ? "[%s]:0" : "%s:0", host) >= CO_ADDR - 8) {
    sr_fmt(err, errlen, "host '%.100s' is too long", host);
    return SR_EINVAL;
  }
  int rc;
  if (o->data_dir && o->fresh && (rc = colocate_data_fresh(o->data_dir, k, o->owner, err, errlen)))
    return rc;
  if (o->data_dir) {
    /* The rank's cache budget is shared by its shards, each with a store of
     * its own. */
    uint64_t rows = o->cache_rows, mb = rows ? 0 : (o->cache_mb ? o->cache_mb : EMB_SHARD_DEFAULT_CACHE_MB);
    if (rows) rows = rows / (uint64_t)n_hosted;
    if (rows && rows < EMB_SHARD_MIN_CACHE_ROWS) rows = EMB_SHARD_MIN_CACHE_ROWS;
    if (mb) mb = mb / (uint64_t)n_hosted ? mb / (uint64_t)n_hosted : 1;
    emb_shard_config sc = {.cache_rows = rows, .cache_mb = mb, .n_hosted = 1, .hosted = &k};
    s->store = emb_store_create_shard(plan, o->data_dir, &sc, err, errlen);
  } else {
    s->store = emb_store_create_local(plan, err, errlen);
  }
  if (!s->store) return SR_EIO;
  rpc_service_opts so = {.shards = &k, .n_shards = 1, .checkpoint_roots = o->checkpoint_roots,
                         .n_roots = o->n_roots};
  s->svc = rpc_service_create(plan, s->store, &so, err, errlen);
  if (!s->svc) return SR_EINVAL;
  if (pthread_create(&s->th, NULL, server_main, s)) {
    sr_fmt(err, errlen, "cannot start the server thread of shard %d", k);
    return SR_ENOMEM;
  }
  s->have_thread = 1;
  pthread_mutex_lock(&s->mu);
  while (s->state == 0) pthread_cond_wait(&s->cv, &s->mu);
  int st = s->state;
  pthread_mutex_unlock(&s->mu);
  if (st != 1) {
    sr_fmt(err, errlen, "shard %d: %s", k, s->err[0] ? s->err : "the server stopped at start");
    return s->rc ? s->rc : SR_EIO;
  }
  snprintf(s->listen, sizeof s->listen, v6 ? "[%s]:%d" : "%s:%d", host, s->port);
  return SR_OK;
}

/* This rank's part of the gathered buffer: [0] 1 = ok, then the reason
 * (CO_ERR bytes), then one CO_ADDR slot per shard of the plan (this rank's
 * shards filled, the others empty). */
static size_t part_size(int n_shards) { return 1 + CO_ERR + (size_t)n_shards * CO_ADDR; }

/* Arguments that are the caller's bug: the same on every rank (plan, size)
 * or caught by the collective's rank check, so no gather is needed. 0, or
 * SR_EINVAL with the reason in err. */
static int args_check(const emb_plan *plan, int rank, int size, const dense_coll *coll, char *err,
                      size_t errlen) {
  if (!plan || plan->n_shards < 1 || size < 1 || rank < 0 || rank >= size) {
    sr_fmt(err, errlen, "colocate: rank %d of %d, %d shard(s): invalid", rank, size,
           plan ? plan->n_shards : 0);
    return SR_EINVAL;
  }
  if (coll && (coll->rank != rank || coll->size != size)) {
    sr_fmt(err, errlen, "colocate: called as rank %d of %d, the collective says rank %d of %d",
           rank, size, coll->rank, coll->size);
    return SR_EINVAL;
  }
  if (size > 1 && !coll) {
    sr_fmt(err, errlen, "colocate: rank %d of %d: %d ranks need the job's collective to share "
           "the shard addresses", rank, size, size);
    return SR_EINVAL;
  }
  return 0;
}

/* Every shard's address from the gathered parts (all: size parts of part
 * bytes), malloc'd (colocate_addrs_free); NULL with *failed set and the
 * reason in err when a rank sent none or memory ran out. */
static char **addrs_of(const char *all, size_t part, int rank, int size, int ns, int *failed,
                       char *err, size_t errlen) {
  char **a = calloc((size_t)ns, sizeof *a);
  for (int k = 0; a && k < ns; k++) {
    const char *at = all + (size_t)(k % size) * part + 1 + CO_ERR + (size_t)k * CO_ADDR;
    if (!at[0]) {
      sr_fmt(err, errlen, "rank %d sent no address for shard %d", k % size, k);
      *failed = 1;
      break;
    }
    a[k] = strndup(at, CO_ADDR - 1);
    if (!a[k]) break;
  }
  if (!*failed && (!a || !a[ns - 1])) {
    sr_fmt(err, errlen, "rank %d: out of memory", rank);
    *failed = 1;
  }
  if (*failed) {
    colocate_addrs_free(a, ns);
    return NULL;
  }
  return a;
}

colocate *colocate_start(const emb_plan *plan, int rank, int size, dense_coll *coll,
                         const colocate_opts *o, char ***addrs, char *err, size_t errlen) {
  *addrs = NULL;
  colocate_opts defaults = {.host = "127.0.0.1", .threads = 2};
  if (!o) o = &defaults;
  if (args_check(plan, rank, size, coll, err, errlen)) return NULL;
  const int ns = plan->n_shards;
  int n_hosted = 0;
  for (int k = rank; k < ns; k += size) n_hosted++;

  size_t part = part_size(ns);
  char *mine = calloc(1, part);
  char *all = calloc((size_t)size, part);
  colocate *c = calloc(1, sizeof *c);
  char why[CO_ERR] = "";
  int failed = 0;
  if (!mine || !all || !c || (n_hosted && !(c->s = calloc((size_t)n_hosted, sizeof *c->s)))) {
    snprintf(why, sizeof why, "out of memory");
    failed = 1;
  }
  if (!failed) {
    for (int i = 0; i < n_hosted; i++) {
      pthread_mutex_init(&c->s[i].mu, NULL);
      pthread_cond_init(&c->s[i].cv, NULL);
    }
    c->n = n_hosted;
    for (int i = 0; i < n_hosted && !failed; i++) {
      int k = rank + i * size;
      if (server_start(&c->s[i], plan, k, o, n_hosted, why, sizeof why)) failed = 1;
      else snprintf(mine + 1 + CO_ERR + (size_t)k * CO_ADDR, CO_ADDR, "%s", c->s[i].listen);
    }
  }
  if (mine) {
    mine[0] = failed ? 0 : 1;
    snprintf(mine + 1, CO_ERR, "%s", why);
  }

  /* Every rank takes part in the gather, failed or not, so none is left
   * waiting in it; then every rank sees every other's outcome. */
  int gathered = 0;
  if (size > 1) {
    /* A rank short of memory sends a zeroed part (read as failed) so that
     * the others still learn of it. */
    char *send = mine ? mine : calloc(1, part);
    char *recv = all ? all : calloc((size_t)size, part);
    int rc = send && recv ? dense_coll_allgather_bytes(coll, send, part, recv) : SR_ENOMEM;
    if (send != mine) free(send);
    if (recv != all) free(recv);
    gathered = rc == SR_OK && all;
    if (rc != SR_OK && !failed) {
      snprintf(why, sizeof why, "all-gather of the shard addresses failed: %.380s",
               rc == SR_ENOMEM ? "out of memory" : dense_coll_errmsg(coll));
      failed = 1;
    }
  } else if (mine && all) {
    memcpy(all, mine, part);
    gathered = 1;
  }

  /* The first failing rank (and how many failed), named alike on every
   * rank from the gathered parts; only a rank whose gather itself failed
   * speaks of itself. */
  int bad = -1, n_bad = 0;
  if (gathered)
    for (int r = 0; r < size; r++)
      if (all[(size_t)r * part] != 1) {
        if (bad < 0) bad = r;
        n_bad++;
      }
  if (bad >= 0) {
    const char *w = all + (size_t)bad * part + 1;
    char more[48] = "";
    if (n_bad > 1) snprintf(more, sizeof more, " (and %d more rank(s))", n_bad - 1);
    sr_fmt(err, errlen, "rank %d of %d could not host its shards: %.*s%s", bad, size, CO_ERR - 1,
           w[0] ? w : "(no reason given)", more);
    failed = 1;
  } else if (failed) {
    sr_fmt(err, errlen, "rank %d of %d could not host its shards: %s", rank, size, why);
  }
  char **a = failed ? NULL : addrs_of(all, part, rank, size, ns, &failed, err, errlen);
  free(mine);
  free(all);
  if (failed) { /* a is NULL: addrs_of frees what it made when it fails */
    colocate_stop(c);
    return NULL;
  }
  *addrs = a;
  return c;
}
