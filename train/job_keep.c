/* The training job's bounded tables (train/keep.h): the entries, each
 * step's decisions applied to the store, and their place in checkpoints. */
#include <stdio.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "rpc/client.h"
#include "train/job_impl.h"
#include "train/keep.h"

int job__keep_open(train_job *j) {
  char err[512];
  if (!keep_plan_on(j->plan)) return 0;
  if (!j->store->ops->remove) {
    job__errf(j, "the plan bounds tables (\"keep\": admission, expiry or capacity), which the "
              "%s store cannot do (it removes no rows): train in process or with --data-dir\n",
              j->store_kind);
    return -1;
  }
  if (j->cfg->async && j->store->ops->kind == EMB_STORE_REMOTE) {
    job__errf(j, "the plan bounds tables (\"keep\"), whose rows go at step boundaries: "
              "--sparse-mode async looks the next step up on the shard servers before the "
              "boundary; use --sparse-mode sync\n");
    return -1;
  }
  if (!(j->keep = keep_create(j->plan, err, sizeof err))) {
    job__errf(j, "%s\n", err);
    return -1;
  }
  trainer_set_keep(j->t, j->keep);
  return 0;
}

int job__keep_load(train_job *j, const char *ckdir, const char *what) {
  char path[SR_PATH_MAX], err[SR_PATH_MAX + 256];
  if (!j->keep) return 0;
  if (sr_path_err(path, sizeof path, err, sizeof err, "%s/" KEEP_FILE, ckdir) ||
      keep_load(j->keep, path, err, sizeof err)) {
    job__errf(j, "%s: %s\n", what, err);
    return -1;
  }
  return 0;
}

/* A barrier of the job's ranks at step's boundary; 0 or the code with the
 * reason in why. */
static int keep_barrier(train_job *j, int64_t step, char *why, size_t whylen) {
  int rc = dense_coll_barrier(j->coll);
  if (rc)
    sr_fmt(why, whylen, "step %lld: bounded tables: barrier: %s", (long long)step,
           dense_coll_errmsg(j->coll));
  return rc;
}

/* Several ranks (a remote store each, over the same servers): every rank
 * decided the same rows, rank 0 removes them once. Its Remove goes once
 * every rank's push of the step is answered (the servers applied the
 * step), and no rank reads the next step (its look-ahead Lookups wait in
 * its store for its own boundary, below) until the Remove is answered. */
int job__keep_step(train_job *j, int64_t step, int *lost, char *why, size_t whylen) {
  emb_idset gone;
  *lost = 0;
  if (!j->keep) return 0;
  int rc = keep_decide(j->keep, step, &gone);
  if (rc) {
    sr_fmt(why, whylen, "step %lld: bounded tables: out of memory", (long long)step);
    return rc;
  }
  size_t n = 0;
  for (int f = 0; f < gone.n_tables; f++) n += gone.counts[f];
  /* The remote store holds the next step's look-ahead Lookups until the
   * boundary is passed: it hears of every boundary, rows to remove or not
   * (on a rank other than 0 it sends nothing). */
  const int told = n || j->store->ops->kind == EMB_STORE_REMOTE;
  if (j->size > 1 && (rc = keep_barrier(j, step, why, whylen))) return rc;
  if (told && j->rank == 0 && (rc = emb_store_remove(j->store, step, &gone))) {
    sr_fmt(why, whylen, "step %lld: removing %zu rows: %s", (long long)step, n,
           emb_store_errmsg(j->store));
    *lost = rpc_remote_lost(j->store);
  }
  if (j->size > 1) {
    /* Rank 0's outcome to every rank (the others wait for it, as at a
     * barrier): a Remove lost to a server is recovered from by all. */
    int32_t out[2] = {rc, *lost};
    int brc = dense_coll_broadcast_bytes(j->coll, out, sizeof out, 0);
    if (brc) {
      sr_fmt(why, whylen, "step %lld: bounded tables: broadcast: %s", (long long)step,
             dense_coll_errmsg(j->coll));
      return brc;
    }
    if (out[0] && j->rank != 0)
      sr_fmt(why, whylen, "step %lld: rank 0's removal of %zu rows failed (%s)", (long long)step, n,
             sr_errname(out[0]));
    rc = out[0];
    *lost = out[1];
  }
  if (rc) return rc;
  if (told && j->rank != 0 && (rc = emb_store_remove(j->store, step, &gone)))
    sr_fmt(why, whylen, "step %lld: %s", (long long)step, emb_store_errmsg(j->store));
  return rc;
}

void job__keep_json(const train_job *j, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (int f = 0; j->keep && f < j->plan->n_tables && len < n; f++) {
    if (!emb_keep_on(&j->plan->tables[f])) continue;
    keep_table_stats st = keep_stats(j->keep, f);
    len += (size_t)snprintf(buf + len, n - len,
                            "%s\"%s\":{\"rows\":%llu,\"admitted\":%llu,\"refused\":%llu,"
                            "\"expired\":%llu,\"evicted\":%llu}",
                            len ? "," : ",\"keep\":{", j->plan->tables[f].name,
                            (unsigned long long)st.rows, (unsigned long long)st.admitted,
                            (unsigned long long)st.refused, (unsigned long long)st.expired,
                            (unsigned long long)st.evicted);
  }
  if (len && len < n) snprintf(buf + len, n - len, "}");
  if (len >= n) buf[0] = 0; /* too many tables for a line: none rather than half */
}
