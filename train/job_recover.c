/* The training job's recovery from a lost shard server: every server
 * restored from the newest complete checkpoint, the dense part loaded, the
 * data sought to the checkpoint's position (one rank, or every rank of a
 * sync job agreeing first), and the cursor rewound to it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/fs.h"
#include "common/sys.h"
#include "rpc/client.h"
#include "train/job_impl.h"

void job_rewind(job_cursor *c, job_batches *q, const train_ckpt_state *st, int batch,
                int window, double now) {
  q->ahead = 0;
  c->step = st->step;
  c->epoch = st->epoch;
  c->epoch_step = (int64_t)((st->sample_index + (uint64_t)batch - 1) / (uint64_t)batch);
  c->loss_sum = window ? st->loss_sum : 0;
  c->loss_n = window ? st->loss_n : 0;
  c->samples_since = 0;
  c->t_last = now;
}

/* Restore every shard server and the dense part from checkpoint ckdir,
 * retrying while a server is still down, for up to --recover-timeout. */
static int restore_servers(train_job *j, const char *ckdir) {
  const train_config *c = j->cfg;
  char err[1024];
  double t0 = sr_now();
  for (;;) {
    train_ckpt_state got;
    if (!train_ckpt_load(ckdir, j->plan, j->store, "remote", trainer_model(j->t),
                   trainer_dense_opt(j->t), &j->cks, &got, err, sizeof err)) {
      j->ckst = got;
      return 0;
    }
    if (!rpc_remote_lost(j->store) || sr_now() - t0 > c->recover_timeout) {
      job__errf(j, "recovery from %s failed%s: %s\n", ckdir,
                rpc_remote_lost(j->store) ? " (--recover-timeout passed)" : "", err);
      return -1;
    }
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* "no complete checkpoint is under DIR yet" or "there is no checkpoint":
 * what job__recover says when there is nothing to restore. */
static void say_no_checkpoint(const train_job *j, const char *why, const char *err) {
  const train_config *c = j->cfg;
  if (!c->checkpoint_dir)
    job__errf(j, "%s\nshardrec train: a shard server was lost and there is no checkpoint to "
              "recover from (--save-checkpoint DIR --checkpoint-every N recovers "
              "automatically)\n", why);
  else
    job__errf(j, "%s\nshardrec train: a shard server was lost and no complete checkpoint is "
              "under %s yet to recover from (%s)\n", why, c->checkpoint_dir, err);
}

/* After the servers are restored (every rank): the bounded tables' state
 * (what the steps since the checkpoint admitted, expired or evicted is
 * undone with their rows, and they are counted again as they run again),
 * the data position, the recovery line and its metric. 0 or -1. */
static int recovered(train_job *j, const char *ckdir, const char *why) {
  if (job__keep_load(j, ckdir, "recovery")) return -1;
  if (ds_source_seek(j->train, j->ckst.sample_index)) {
    job__errf(j, "recovery: cannot seek the data to sample %llu: %s\n",
              (unsigned long long)j->ckst.sample_index, ds_source_errmsg(j->train));
    return -1;
  }
  printf("recovered from %s after: %s\n", ckdir, why);
  /* Calls the retries outlasted before and during the restore: the
   * recovery's, not the first replayed step's. */
  char note[1024];
  const int notes = rpc_remote_note(j->store, note, sizeof note);
  if (notes) job__errf(j, "recovery: %d call(s) answered only after retries; %s\n", notes, note);
  job__metrics_recovered(j);
  fflush(stdout);
  return 0;
}

/* Whether every rank can recover (each rank whose own call failed lost a
 * server: rpc_remote_lost), and rank 0's newest complete checkpoint
 * (ckdir, the same on every rank): one answer for all, from one
 * all-reduce and one broadcast. 0, or -1 with the reason printed. */
static int recover_agree(train_job *j, const char *why, int own, char *ckdir, size_t len) {
  const train_config *c = j->cfg;
  char err[1024] = "";
  float v[3] = {0, 0, 0}; /* ranks that cannot recover, rank 0 has no checkpoint, async */
  v[0] = own && !(c->servers && rpc_remote_lost(j->store));
  if (j->rank == 0)
    v[1] = !c->checkpoint_dir || train_ckpt_resolve(c->checkpoint_dir, ckdir, len, err, sizeof err);
  v[2] = c->async;
  if (!job__coll_ok(j, dense_coll_all_reduce_sum(j->coll, v, 3), "all-reduce of the recovery"))
    return -1;
  if (v[0] > 0 || v[2] > 0) {
    job__errf(j, "%s\n", why);
    if (v[0] == 0)
      job__errf(j, "a shard server was lost; with %d ranks in async mode the job stops "
                "(automatic recovery runs in sync mode): restart it with --resume from the "
                "newest checkpoint\n", j->size);
    return -1;
  }
  if (v[1] > 0) {
    if (j->rank == 0) say_no_checkpoint(j, why, err);
    else job__errf(j, "%s\n", why);
    return -1;
  }
  if (!job__coll_ok(j, dense_coll_broadcast_bytes(j->coll, ckdir, len, 0),
                    "broadcast of the checkpoint to recover from"))
    return -1;
  return 0;
}

/* Recovery with several ranks (sync mode), every rank in the same step
 * (the trainer's all-reduce told them all): agree (recover_agree); end
 * every call of the old step (rpc_remote_quiesce); a new job id; rank 0
 * restores every server and its dense part (restore_servers, waiting for
 * the servers), then broadcasts whether it did and the servers'
 * incarnations; the other ranks load the dense part; every rank rejoins
 * the servers under the new id, so that the servers count its steps afresh
 * from the checkpoint's. 0 or -1 (message printed). */
static int job_recover_ranks(train_job *j, const char *why, int own) {
  char ckdir[SR_PATH_MAX] = "", err[1024];
  if (recover_agree(j, why, own, ckdir, sizeof ckdir)) return -1;
  if (j->rank == 0)
    job__errf(j, "%s\nshardrec train: restoring every shard server from %s (waiting up to %g "
              "s for them)\n", why, ckdir, j->cfg->recover_timeout);
  else if (own)
    job__errf(j, "%s\n", why);
  rpc_remote_quiesce(j->store);
  trainer_ahead_drop(j->t);
  if (job__share_job_id(j) ||
      !job__coll_ok(j, dense_coll_barrier(j->coll), "barrier before the restore"))
    return -1;
  const int ns = j->plan->n_shards;
  uint64_t *inc = calloc((size_t)ns + 1, sizeof *inc); /* [0]: restored; then the incarnations */
  if (!inc) {
    job__errf(j, "recovery: out of memory\n");
    return -1;
  }
  if (j->rank == 0 && !restore_servers(j, ckdir)) {
    inc[0] = 1;
    rpc_remote_incarnations(j->store, inc + 1, ns);
  }
  size_t inc_bytes = ((size_t)ns + 1) * sizeof *inc;
  int rc = job__coll_ok(j, dense_coll_broadcast_bytes(j->coll, inc, inc_bytes, 0),
                        "broadcast of the restore") ? 0 : -1;
  if (!rc && !inc[0]) {
    if (j->rank != 0) job__errf(j, "recovery: rank 0 could not restore the shard servers\n");
    rc = -1;
  }
  train_ckpt_state got;
  if (!rc && j->rank != 0 &&
      train_ckpt_load(ckdir, j->plan, NULL, j->store_kind, trainer_model(j->t),
                      trainer_dense_opt(j->t), &j->cks, &got, err, sizeof err)) {
    job__errf(j, "recovery from %s: %s\n", ckdir, err);
    rc = -1;
  }
  if (!rc && j->rank != 0) j->ckst = got;
  if (!rc && rpc_remote_rejoin(j->store, j->job_id, inc + 1)) {
    job__errf(j, "recovery: %s\n", emb_store_errmsg(j->store));
    rc = -1;
  }
  free(inc);
  return rc ? -1 : recovered(j, ckdir, why);
}

int job__recover(train_job *j, const char *why, int own) {
  const train_config *c = j->cfg;
  if (j->size > 1) return job_recover_ranks(j, why, own);
  if (!c->servers || !rpc_remote_lost(j->store)) {
    job__errf(j, "%s\n", why); /* not a lost server: nothing to recover from */
    return -1;
  }
  char ckdir[SR_PATH_MAX], err[1024] = "";
  if (!c->checkpoint_dir ||
      train_ckpt_resolve(c->checkpoint_dir, ckdir, sizeof ckdir, err, sizeof err)) {
    say_no_checkpoint(j, why, err);
    return -1;
  }
  job__errf(j, "%s\nshardrec train: restoring every shard server from %s (waiting up to %g s "
            "for them)\n", why, ckdir, c->recover_timeout);
  if (restore_servers(j, ckdir)) return -1;
  return recovered(j, ckdir, why);
}
