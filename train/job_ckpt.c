/* The training job's checkpoints: the folders it writes checked before
 * anything is read or trained, --resume, a checkpoint of the job
 * (--save-checkpoint every --checkpoint-every steps and at the end) and
 * --save-model. What a checkpoint holds is checkpoint.c's. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "storage/ckpt_dir.h"
#include "train/job_impl.h"

/* 0 when path leaves room characters after it within SR_PATH_MAX; else -1
 * with "FLAG <path's start>...: path too long (over N characters)"
 * printed. */
static int path_room(const train_job *j, const char *flag, const char *path, size_t room) {
  if (!path || strlen(path) + room < SR_PATH_MAX) return 0;
  char err[256];
  sr_path_too_long(err, sizeof err, path, SR_PATH_MAX - room);
  job__errf(j, "%s %s\n", flag, err);
  return -1;
}

/* Whether folders a and b are the same one. */
static int same_folder(const char *a, const char *b) {
  struct stat x, y;
  return a && b && !stat(a, &x) && !stat(b, &y) && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int job__check_paths(const train_job *j) {
  const train_config *c = j->cfg;
  char widest[64];
  size_t tmp_ext = 1 + SR_TMP_TAG_MAX - 1; /* ".TAG" */
  size_t shard_dir = (size_t)snprintf(widest, sizeof widest, "/shard-%d/", INT_MAX);
  return path_room(j, "--save-checkpoint", c->checkpoint_dir, train_ckpt_root_room()) ||
         path_room(j, "--save-model", c->save_model, tmp_ext + train_ckpt_root_room()) ||
         path_room(j, "--resume", c->resume, 1 + TRAIN_CKPT_NAME_ROOM) ||
         path_room(j, "--data-dir", c->data_dir, shard_dir + TRAIN_CKPT_NAME_ROOM)
             ? -1
             : 0;
}

int job__check_outputs(const train_job *j) {
  const train_config *c = j->cfg;
  char err[SR_PATH_MAX + 512];
  if (j->rank != 0) return 0;
  if (c->checkpoint_dir && ckpt_dir_check_root(c->checkpoint_dir, err, sizeof err)) {
    job__errf(j, "--save-checkpoint %s; refused before training, nothing written or removed\n",
              err);
    return -1;
  }
  if (c->save_model && ckpt_dir_check_root(c->save_model, err, sizeof err) &&
      !train_ckpt_is_old_model(c->save_model)) {
    job__errf(j, "--save-model %s; refused before training, nothing written or removed\n", err);
    return -1;
  }
  if (c->save_model) ckpt_dir_sweep_beside(c->save_model);
  return 0;
}

int job__resume_open(train_job *j) {
  char err[1024];
  if (train_ckpt_mapping(j->cfg->resume, &j->ck_plan, &j->ck_xf, err, sizeof err)) {
    job__errf(j, "--resume: %s\n", err);
    return -1;
  }
  return 0;
}

int job__resume_mapping(train_job *j) {
  char msg[1024];
  int rc = train_ckpt_mapping_check(j->ck_xf, ds_source_transform(j->train), j->cfg->resume,
                                    j->data_path, &j->grow, msg, sizeof msg);
  if (rc) {
    job__errf(j, "--resume %s\n", msg);
    return -1;
  }
  if (j->grow) printf("data   %s\n", msg);
  if (j->ck_xf && !ds_source_transform(j->train) && j->rank == 0)
    printf("note   %s records no data mapping (ids mapped outside shardrec): this job's "
           "checkpoints record none either, so raw rows cannot be scored with them (%s's "
           "mapping is not carried over)\n", j->data_path, j->cfg->resume);
  return 0;
}

/* The first table whose rows differ between a and b (-1: none). */
static int rows_differ(const emb_plan *a, const emb_plan *b) {
  for (int i = 0; i < a->n_tables && i < b->n_tables; i++)
    if (a->tables[i].rows != b->tables[i].rows) return i;
  return -1;
}

int job__grown_plan(train_job *j) {
  const train_config *c = j->cfg;
  char err[1024];
  uint64_t sizes[DS_NUM_SPARSE];
  emb_plan *given = NULL, *grown = NULL;
  if (j->ck_plan->n_tables != DS_NUM_SPARSE || ds_source_table_sizes(j->train, sizes)) {
    job__errf(j, "--resume: %s: no table sizes for the checkpoint's %d tables\n", j->data_path,
              j->ck_plan->n_tables);
    return -1;
  }
  if (emb_plan_grow(j->ck_plan, sizes, &grown, err, sizeof err) ||
      (c->plan_path && emb_plan_load(c->plan_path, &given, err, sizeof err))) {
    job__errf(j, "--resume: %s\n", err);
    emb_plan_free(grown);
    return -1;
  }
  char gfp[EMB_FP_HEX], hfp[EMB_FP_HEX];
  emb_plan_fingerprint(grown, gfp);
  if (given && (emb_plan_fingerprint(given, hfp), strcmp(gfp, hfp))) {
    int t = rows_differ(grown, given);
    char why[256] = "";
    if (t < 0) emb_plan_grows(j->ck_plan, given, why, sizeof why);
    if (t >= 0)
      sr_fmt(why, sizeof why, "tables[%d] (%s) has %llu rows in it, %llu grown", t,
             grown->tables[t].name, (unsigned long long)given->tables[t].rows,
             (unsigned long long)grown->tables[t].rows);
    job__errf(j, "--plan %s: plan %.12s is not the checkpoint's plan grown to %s (%.12s): %s "
              "(shardrec plan --grow-from %s --processed-data-file %s writes that one)\n",
              c->plan_path, hfp, j->data_path, gfp, why, c->resume, j->data_path);
    emb_plan_free(grown);
    emb_plan_free(given);
    return -1;
  }
  emb_plan_free(given);
  j->plan = grown;
  return 0;
}

int job__resume(train_job *j) {
  const train_config *c = j->cfg;
  char ckdir[SR_PATH_MAX], err[1024];
  int rc = train_ckpt_resolve(c->resume, ckdir, sizeof ckdir, err, sizeof err);
  if (!rc && j->rank == 0)
    rc = train_ckpt_load(ckdir, j->plan, j->store, j->store_kind, trainer_model(j->t),
                   trainer_dense_opt(j->t), &j->cks, &j->ckst, err, sizeof err);
  if (rc) {
    job__errf(j, "--resume: %s\n", err);
    return -1;
  }
  if (job__keep_load(j, ckdir, "--resume")) return -1;
  if (j->size > 1 && !job__coll_ok(j, dense_coll_barrier(j->coll), "barrier after the restore"))
    return -1;
  if (j->rank != 0 &&
      train_ckpt_load(ckdir, j->plan, NULL, j->store_kind, trainer_model(j->t),
                      trainer_dense_opt(j->t), &j->cks, &j->ckst, err, sizeof err)) {
    job__errf(j, "--resume: %s\n", err);
    return -1;
  }
  char why[512];
  if (train_ckpt_data_differs(ckdir, &j->cks, why, sizeof why)) {
    /* The next day's data: read from its beginning, the step count and the
     * learning-rate schedule going on. */
    j->ckst.epoch = 0;
    j->ckst.sample_index = 0;
    if (j->rank == 0)
      printf("data   %s: read %s from its beginning (epoch 0); steps and the learning-rate "
             "schedule go on\n", why, j->data_path);
  }
  if (ds_source_seek(j->train, j->ckst.sample_index)) {
    job__errf(j, "--resume: cannot seek the data to sample %llu: %s\n",
              (unsigned long long)j->ckst.sample_index, ds_source_errmsg(j->train));
    return -1;
  }
  /* --nepochs counts the epochs of the data read, from the step the job
   * began reading it: the checkpoint's step less the steps taken on it so
   * far (the next day's data: the checkpoint's step). --num-batches stays
   * the job's step count. */
  const uint64_t b = (uint64_t)c->batch;
  const int64_t on_data = (int64_t)j->ckst.epoch * j->steps_per_epoch +
                          (int64_t)((j->ckst.sample_index + b - 1) / b);
  j->total_steps = (j->ckst.step > on_data ? j->ckst.step - on_data : 0) +
                   j->steps_per_epoch * c->epochs;
  if (c->num_batches > 0 && c->num_batches < j->total_steps) j->total_steps = c->num_batches;
  /* Resumed from a checkpoint of the --save-checkpoint folder: the
   * store's change set counts from it (the restore cleared it), so the
   * chain goes on from it; not when the tables grew: its table files are
   * the old plan's, which a restore of the grown plan refuses, so the
   * first checkpoint after is full. */
  char root[SR_PATH_MAX];
  if (!j->grow && !ckpt_dir_parent(ckdir, root, sizeof root) &&
      same_folder(root, c->checkpoint_dir)) {
    j->ck_parent = j->ckst.step;
    j->ck_incs = ckpt_dir_chain_links(ckdir) - 1;
  }
  if (j->rank == 0 && train_ckpt_kernels_differ(ckdir, &j->cks, why, sizeof why))
    job__errf(j, "warning: --resume: %s\n", why);
  job_rewind(&j->cur, &j->q, &j->ckst, j->cfg->batch, !job__print_due(j, j->ckst.step), sr_now());
  trainer_ahead_drop(j->t);
  printf("resume %s: step %lld, epoch %d, sample %llu\n", ckdir, (long long)j->ckst.step,
         j->ckst.epoch, (unsigned long long)j->ckst.sample_index);
  if (j->rank == 0 && c->metrics_out && job__metrics_out_resume(j)) return -1;
  int32_t redo = j->resume_redo; /* rank 0's finding: a pass is every rank's */
  if (j->size > 1 && !job__coll_ok(j, dense_coll_broadcast_bytes(j->coll, &redo, sizeof redo, 0),
                                   "broadcast of the resumed step's lines"))
    return -1;
  j->resume_redo = redo;
  return 0;
}

/* Whether root is the --save-checkpoint folder (the chain's), not
 * --save-model's. */
static int in_chain_root(const train_job *j, const char *root) {
  return j->cfg->checkpoint_dir && !strcmp(root, j->cfg->checkpoint_dir);
}

/* The parent the next checkpoint under --save-checkpoint names (-1: a full
 * one): every --full-checkpoint-every-th is full, and one with no
 * checkpoint before it in the root. */
static long long next_parent(const train_job *j, const char *root) {
  const train_config *c = j->cfg;
  if (!in_chain_root(j, root) || c->full_every <= 1 || j->ck_incs + 1 >= c->full_every)
    return -1;
  return j->ck_parent;
}

/* The chain after train_ckpt_save_link returned rc, parent what it wrote
 * on (-1: full; -2: the store has no incremental ops; -3: the step was
 * there already, nothing written). */
static void chain_after(train_job *j, const char *root, int rc, long long asked, long long parent) {
  if (parent == -3) {
    /* Not the checkpoint this job just wrote or resumed from (another
     * run's, or this job's before a recovery): kept, and never a parent,
     * its rows perhaps not the ones this job's change set counts from. */
    if (j->ck_parent == j->ckst.step) return;
    printf("note   %s/step-%lld was there already: kept as it is; the next checkpoint is "
           "full\n", root, (long long)j->ckst.step);
    j->ck_parent = -1;
    return;
  }
  if (!in_chain_root(j, root)) { /* --save-model's full one cleared the change set */
    j->ck_parent = -1;
    return;
  }
  if (rc) {
    j->ck_parent = -1; /* the store's change set may be cleared: a full one next */
    return;
  }
  if (asked >= 0 && parent == -2 && !j->noted_full) {
    printf("note   --full-checkpoint-every: the %s store writes no incremental checkpoints; "
           "every checkpoint is full\n", j->store_kind);
    j->noted_full = 1;
  }
  j->ck_incs = parent >= 0 ? j->ck_incs + 1 : 0;
  j->ck_parent = j->ckst.step;
}

int job__checkpoint(train_job *j, const char *root, int keep, char *err, size_t errlen) {
  int rc;
  long long asked = next_parent(j, root), parent = asked;
  j->ckst.keep = j->keep;
  if (j->size > 1 && (rc = dense_coll_barrier(j->coll))) {
    sr_fmt(err, errlen, "barrier before the checkpoint: %s", dense_coll_errmsg(j->coll));
    return rc;
  }
  rc = j->rank == 0 ? train_ckpt_save_link(root, keep, &parent, j->plan, j->store, j->store_kind,
                                           trainer_model(j->t), trainer_dense_opt(j->t),
                                           ds_source_transform(j->train), &j->ckst, &j->cks,
                                           err, errlen)
                    : 0;
  if (j->size == 1) {
    chain_after(j, root, rc, asked, parent);
    return rc;
  }
  /* Rank 0's outcome to every rank (the others wait for it as at a
   * barrier): a checkpoint lost to a server is recovered from by all. */
  int32_t out = rc;
  int brc = dense_coll_broadcast_bytes(j->coll, &out, sizeof out, 0);
  if (brc) {
    sr_fmt(err, errlen, "broadcast after the checkpoint: %s", dense_coll_errmsg(j->coll));
    return brc;
  }
  if (out && j->rank != 0)
    sr_fmt(err, errlen, "rank 0's checkpoint under %s failed (%s)", root, sr_errname(out));
  chain_after(j, root, out, asked, parent); /* rank 0's chain is the one that counts */
  return out;
}

int job__model_is_ckpt_root(const train_job *j) {
  return same_folder(j->cfg->save_model, j->cfg->checkpoint_dir);
}

int job__save_model(train_job *j, char *err, size_t errlen) {
  const train_config *c = j->cfg;
  if (job__model_is_ckpt_root(j)) {
    printf("saved  %s/step-%lld\n", c->save_model, (long long)j->ckst.step);
    return 0;
  }
  char tmp[SR_PATH_MAX], dir[SR_PATH_MAX];
  int len = (int)strlen(c->save_model);
  while (len > 1 && c->save_model[len - 1] == '/') len--;
  /* rank 0's names; too long: nothing written or removed */
  int rc = sr_path_err(dir, sizeof dir, err, errlen, "%.*s", len, c->save_model);
  if (!rc) rc = ckpt_dir_tmp_beside(dir, tmp, sizeof tmp, err, errlen);
  if (rc) return rc;
  rc = job__checkpoint(j, tmp, 0, err, errlen);
  if (j->rank != 0) return rc;
  if (!rc) rc = ckpt_dir_replace(tmp, dir, train_ckpt_is_old_model, err, errlen);
  if (rc) {
    sr_rmtree(tmp);
    return rc;
  }
  printf("saved  %s/step-%lld\n", c->save_model, (long long)j->ckst.step);
  return 0;
}
