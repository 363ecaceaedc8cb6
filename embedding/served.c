/* The plan and the store a shard server serves (see served.h). */
#include "embedding/served.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/ckpt_plan.h"
#include "embedding/shard.h"
#include "storage/ckpt_dir.h"

/* The checkpoint's plan (o->plan_path, when given, must be it) and store. */
static int open_checkpoint(const emb_served_opts *o, emb_served *s, char *err, size_t errlen) {
  emb_ckpt ck;
  emb_plan *given = NULL;
  s->failed = EMB_SERVED_IN_PLAN;
  int rc = o->plan_path ? emb_plan_load(o->plan_path, &given, err, errlen) : 0;
  if (rc) return rc;
  s->failed = EMB_SERVED_IN_CHECKPOINT;
  if ((rc = emb_ckpt_open(o->checkpoint, &ck, err, errlen))) goto out;
  if ((rc = sr_path_err(s->ckpt_dir, sizeof s->ckpt_dir, err, errlen, "%s", ck.dir))) goto out;
  s->step = ck.step;
  memcpy(s->transform_fp, ck.transform_fp, sizeof s->transform_fp);
  emb_plan_fingerprint(ck.plan, s->plan_fp);
  if (given) {
    char have[EMB_FP_HEX];
    emb_plan_fingerprint(given, have);
    if (strcmp(s->plan_fp, have)) {
      s->failed = EMB_SERVED_IN_PLAN;
      sr_fmt(err, errlen, "%s has plan fingerprint %.12s..., the checkpoint %s was written under "
             "%.12s... (serve it without this plan, or reshard it to this plan first)",
             o->plan_path, have, ck.dir, s->plan_fp);
      rc = SR_EMISMATCH;
      goto out;
    }
  }
  s->plan = ck.plan;
  ck.plan = NULL;
  for (int i = 0; i < o->n_shards; i++)
    if (o->shards[i] < 0 || o->shards[i] >= s->plan->n_shards) {
      s->failed = EMB_SERVED_IN_SHARD;
      sr_fmt(err, errlen, "%d: the checkpoint's plan has shards 0..%d", o->shards[i],
             s->plan->n_shards - 1);
      rc = SR_EINVAL;
      goto out;
    }
  emb_ckpt_store_opts co = {.shards = o->shards, .n_shards = o->n_shards, .data_dir = o->data_dir,
                        .cache_rows = o->cache_rows, .cache_mb = o->cache_mb};
  if ((rc = emb_ckpt_store_open(s->ckpt_dir, s->plan, &co, &s->cs, err, errlen))) goto out;
  s->store = s->cs.store;
  s->temporary = s->cs.tmp_dir != NULL;
  snprintf(s->layout, sizeof s->layout, "%s", s->cs.layout);
out:
  emb_ckpt_close(&ck);
  emb_plan_free(given);
  return rc;
}

int emb_served_in_checkpoint(const char *path, char *step, size_t len) {
  return ckpt_dir_step_holding(path, step, len);
}

int emb_served_increment_at(const char *path) {
  char step[SR_PATH_MAX], err[256];
  struct cJSON *man = NULL;
  if (ckpt_dir_parent(path, step, sizeof step) || ckpt_dir_read(step, &man, err, sizeof err)) return 0;
  int inc = ckpt_dir_parent_step(man) >= 0;
  cJSON_Delete(man);
  return inc;
}

/* o->restore, the rows of an incremental checkpoint: its chain (the step
 * folder above o->restore, verified whole by emb_ckpt_open) restored into
 * s->store, the full checkpoint's rows then each increment's laid over. */
static int restore_chain(const emb_served_opts *o, emb_served *s, char *err, size_t errlen) {
  char step[SR_PATH_MAX];
  emb_ckpt ck;
  s->failed = EMB_SERVED_IN_RESTORE;
  if (ckpt_dir_parent(o->restore, step, sizeof step)) {
    sr_fmt(err, errlen, "%s: path too long", o->restore);
    return SR_ERANGE;
  }
  int rc = emb_ckpt_open(step, &ck, err, errlen);
  for (int i = 0; !rc && i < ck.chain.n; i++) {
    char shards[SR_PATH_MAX], dir[SR_PATH_MAX];
    if (ckpt_dir_shards_path(ck.chain.dirs[i], shards, sizeof shards) ||
        (i ? emb_served_delta_dir(o->shards, o->n_shards, shards, dir, sizeof dir)
           : emb_served_checkpoint_dir(s->store, o->shards, o->n_shards, shards, dir, sizeof dir))) {
      sr_fmt(err, errlen, "%s: path too long", ck.chain.dirs[i]);
      rc = SR_ERANGE;
    } else if ((rc = i ? emb_store_restore_delta(s->store, dir) : emb_store_restore(s->store, dir))) {
      sr_fmt(err, errlen, "%s: %s", dir,
             rc == SR_EUNSUPPORTED ? "this store cannot lay an incremental checkpoint over its rows"
                                   : emb_store_errmsg(s->store));
    }
  }
  if (!rc) s->failed = EMB_SERVED_IN_NONE;
  emb_ckpt_close(&ck);
  return rc;
}

/* A fresh store of o->plan_path's rows, restored from o->restore if given. */
static int open_plan(const emb_served_opts *o, emb_served *s, char *err, size_t errlen) {
  s->failed = EMB_SERVED_IN_PLAN;
  int rc = emb_plan_load(o->plan_path, &s->plan, err, errlen);
  if (rc) return rc;
  emb_plan_fingerprint(s->plan, s->plan_fp);
  s->failed = EMB_SERVED_IN_NONE;
  if (o->data_dir) {
    emb_shard_config sc = {.cache_rows = o->cache_rows, .cache_mb = o->cache_mb,
                           .n_hosted = o->n_shards, .hosted = o->shards};
    s->store = emb_store_create_shard(s->plan, o->data_dir, &sc, err, errlen);
  } else {
    s->store = emb_store_create_local(s->plan, err, errlen);
  }
  if (!s->store) return SR_EIO;
  if (!o->restore) return 0;
  if (emb_served_increment_at(o->restore)) return restore_chain(o, s, err, errlen);
  char dir[4096];
  if (emb_served_checkpoint_dir(s->store, o->shards, o->n_shards, o->restore, dir, sizeof dir)) {
    s->failed = EMB_SERVED_IN_RESTORE;
    sr_fmt(err, errlen, "%s: path too long", o->restore);
    return SR_ERANGE;
  }
  char grown_fp[EMB_FP_HEX]; /* a checkpoint of a smaller plan this one grows */
  rc = emb_ckpt_grown_from(o->restore, s->plan, grown_fp)
           ? emb_store_restore_grown(s->store, dir, grown_fp)
           : emb_store_restore(s->store, dir);
  if (rc) {
    s->failed = EMB_SERVED_IN_RESTORE;
    sr_fmt(err, errlen, "%s: %s", dir, emb_store_errmsg(s->store));
  }
  return rc;
}

int emb_served_open(const emb_served_opts *o, emb_served *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (o->checkpoint && o->restore) {
    sr_fmt(err, errlen, "a checkpoint is served as it is: no restore");
    return SR_EINVAL;
  }
  if (!o->checkpoint && !o->plan_path) {
    sr_fmt(err, errlen, "neither a plan nor a checkpoint to serve");
    return SR_EINVAL;
  }
  int rc = o->checkpoint ? open_checkpoint(o, out, err, errlen) : open_plan(o, out, err, errlen);
  if (rc) {
    emb_served_input failed = out->failed;
    emb_served_close(out);
    out->failed = failed;
  }
  return rc;
}

int emb_served_checkpoint_dir(const emb_store *store, const int *shards, int n, const char *path,
                              char *buf, size_t len) {
  if (emb_store_checkpoint_layout(store) == EMB_CKPT_SHARD_FOLDERS)
    return snprintf(buf, len, "%s", path) < (int)len ? 0 : SR_ERANGE;
  return ckpt_dir_server_path(path, shards, n, buf, len);
}

int emb_served_delta_dir(const int *shards, int n, const char *path, char *buf, size_t len) {
  return ckpt_dir_server_path(path, shards, n, buf, len);
}

void emb_served_close(emb_served *s) {
  if (!s) return;
  if (s->cs.store) emb_ckpt_store_close(&s->cs); /* also removes its temporary folder */
  else emb_store_destroy(s->store);
  emb_plan_free(s->plan);
  memset(s, 0, sizeof *s);
}

int emb_served_checkpoint_target(const emb_store *store, const int *shards, int n,
                                 const char *path, int i, char *buf, size_t len) {
  if (i < 0 || i >= n || (emb_store_checkpoint_layout(store) != EMB_CKPT_SHARD_FOLDERS && i > 0))
    return SR_ENOTFOUND;
  if (emb_store_checkpoint_layout(store) == EMB_CKPT_SHARD_FOLDERS)
    return ckpt_dir_shard_path(path, shards[i], buf, len);
  return ckpt_dir_server_path(path, shards, n, buf, len);
}
