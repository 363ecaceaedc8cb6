/* The training job's bounded tables (train/keep.h): the entries, each
 * step's decisions applied to the store, and their place in checkpoints. */
#include <stdio.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
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
  if (j->size > 1) {
    job__errf(j, "the plan bounds tables (\"keep\"): a data-parallel job (%d ranks) does not "
              "remove rows yet; train with one rank\n", j->size);
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

int job__keep_step(train_job *j, int64_t step, char *why, size_t whylen) {
  emb_idset gone;
  if (!j->keep) return 0;
  int rc = keep_decide(j->keep, step, &gone);
  if (rc) {
    sr_fmt(why, whylen, "step %lld: bounded tables: out of memory", (long long)step);
    return rc;
  }
  size_t n = 0;
  for (int f = 0; f < gone.n_tables; f++) n += gone.counts[f];
  if (n && (rc = emb_store_remove(j->store, step, &gone)))
    sr_fmt(why, whylen, "step %lld: removing %zu rows: %s", (long long)step, n,
           emb_store_errmsg(j->store));
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
