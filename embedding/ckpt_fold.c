/* Folding a chain of checkpoints into one full checkpoint (see ckpt_fold.h). */
#include "embedding/ckpt_fold.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/shard.h"
#include "embedding/store.h"

/* The increment at path laid over store: path itself (table files), or,
 * where RocksDB shard servers wrote it (each its folder shard-K[-K2...] of
 * table files beside a full checkpoint of databases), each server's folder
 * in turn: their rows are apart. */
static int lay_increment(emb_store *store, const char *path) {
  ckpt_shards_layout l;
  char e2[256];
  if (ckpt_dir_shards_layout(path, &l, e2, sizeof e2) || l != CKPT_SHARDS_SERVER_TABLES)
    return emb_store_restore_delta(store, path); /* which says what is wrong */
  char **names;
  int n, rc = 0, max = store->plan->n_shards;
  int *ks = malloc((size_t)max * sizeof *ks);
  if (!ks || sr_list_dir(path, &names, &n)) {
    free(ks);
    return emb_store_restore_delta(store, path);
  }
  for (int i = 0; i < n && !rc; i++) {
    char sub[SR_PATH_MAX];
    if (!ckpt_dir_server_shards(names[i], ks, max)) continue; /* not a server's */
    rc = sr_path(sub, sizeof sub, "%s/%s", path, names[i]) ? SR_ERANGE
                                                           : emb_store_restore_delta(store, sub);
  }
  sr_paths_free(names, n);
  free(ks);
  return rc;
}

/* store restored from every link's sub (a folder under each link's
 * shards/: "" for shards/ itself; the full one's with restore, the
 * increments' with restore_delta), then checkpointed into out. */
static int fold_store(emb_store *store, const ckpt_dir_chain *chain, const char *sub,
                      const char *out, char *err, size_t errlen) {
  for (int i = 0; i < chain->n; i++) {
    char path[SR_PATH_MAX];
    int rc = sr_path_err(path, sizeof path, err, errlen, "%s/shards%s%s", chain->dirs[i],
                         sub[0] ? "/" : "", sub);
    if (!rc) rc = i ? (sub[0] ? emb_store_restore_delta(store, path) : lay_increment(store, path))
                    : emb_store_restore(store, path);
    if (rc == SR_EUNSUPPORTED) {
      sr_fmt(err, errlen, "%s: an incremental checkpoint of rows a %s store holds, which this "
             "build cannot lay over a full one", path,
             emb_store_kind_of(store) == EMB_STORE_SHARD ? "RocksDB shard" : "");
      return rc;
    }
    if (rc) {
      sr_fmt(err, errlen, "%s (link %d of %d of the chain of %s)", emb_store_errmsg(store),
             chain->n - i, chain->n, chain->dirs[chain->n - 1]);
      return rc;
    }
  }
  int rc = emb_store_checkpoint(store, out);
  if (rc) sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
  return rc;
}

/* Each server folder of the full checkpoint's shards/ folded on its own. */
static int fold_servers(const ckpt_dir_chain *chain, const emb_plan *plan, const char *full,
                        const char *out_shards, char *err, size_t errlen) {
  char **names;
  int n, rc;
  if (sr_list_dir(full, &names, &n)) {
    sr_fmt(err, errlen, "%s: cannot list", full);
    return SR_EIO;
  }
  rc = mkdir(out_shards, 0777) ? SR_EIO : 0;
  if (rc) sr_fmt(err, errlen, "%s: cannot create: %s", out_shards, strerror(errno));
  int *ks = malloc((size_t)plan->n_shards * sizeof *ks);
  if (!rc && !ks) {
    sr_fmt(err, errlen, "out of memory");
    rc = SR_ENOMEM;
  }
  for (int i = 0; i < n && !rc; i++) {
    char out[SR_PATH_MAX];
    if (!ckpt_dir_server_shards(names[i], ks, plan->n_shards)) continue; /* not a server's */
    if ((rc = sr_path_err(out, sizeof out, err, errlen, "%s/%s", out_shards, names[i]))) break;
    emb_store *s = emb_store_create_local(plan, err, errlen);
    rc = s ? fold_store(s, chain, names[i], out, err, errlen) : SR_ENOMEM;
    emb_store_destroy(s);
  }
  free(ks);
  sr_paths_free(names, n);
  return rc;
}

int emb_ckpt_fold_rows(const ckpt_dir_chain *chain, const emb_plan *plan, const char *out_shards,
                       const char *work, char *err, size_t errlen) {
  char full[SR_PATH_MAX];
  ckpt_shards_layout layout;
  int rc = sr_path_err(full, sizeof full, err, errlen, "%s/shards", chain->dirs[0]);
  if (!rc) rc = ckpt_dir_shards_layout(full, &layout, err, errlen);
  if (rc) return rc;
  if (layout == CKPT_SHARDS_SERVER_TABLES)
    return fold_servers(chain, plan, full, out_shards, err, errlen);
  emb_store *s;
  if (layout == CKPT_SHARDS_TABLES) {
    s = emb_store_create_local(plan, err, errlen);
  } else {
    emb_shard_config sc = {0};
    s = emb_store_create_shard(plan, work, &sc, err, errlen);
  }
  rc = s ? fold_store(s, chain, "", out_shards, err, errlen) : SR_EIO;
  emb_store_destroy(s);
  if (layout == CKPT_SHARDS_DBS) sr_rmtree(work);
  return rc;
}

/* Copy the head's file name into t's folder when the head has one. */
static int copy_head_file(const char *head, const char *tmp, const char *name, char *err,
                          size_t errlen) {
  char a[SR_PATH_MAX], b[SR_PATH_MAX];
  int rc = sr_path_err(a, sizeof a, err, errlen, "%s/%s", head, name);
  if (!rc) rc = sr_path_err(b, sizeof b, err, errlen, "%s/%s", tmp, name);
  if (!rc && sr_is_file(a)) rc = sr_copy_file(a, b, err, errlen);
  return rc;
}

int emb_ckpt_fold(const emb_ckpt *ck, const char *root, char *err, size_t errlen) {
  ckpt_dir_txn t;
  char shards[SR_PATH_MAX], work[SR_PATH_MAX];
  int exists, rc = ckpt_dir_begin(root, ck->step, &t, &exists, err, errlen);
  if (rc) return rc;
  if (exists) {
    sr_fmt(err, errlen, "%s: already holds a complete step-%lld", root, (long long)ck->step);
    return SR_EEXISTS;
  }
  cJSON *man = cJSON_Duplicate(ck->manifest, 1);
  const char *head = ck->chain.dirs[ck->chain.n - 1];
  if (!man || ckpt_dir_make_full(man)) {
    sr_fmt(err, errlen, "manifest: out of memory");
    rc = SR_ENOMEM;
  }
  if (!rc) rc = copy_head_file(head, t.tmp, "dense.bin", err, errlen);
  if (!rc) rc = copy_head_file(head, t.tmp, "transform.bin", err, errlen);
  /* The bounded tables' counts (train/keep.h's keep.bin), whole in every link. */
  if (!rc) rc = copy_head_file(head, t.tmp, "keep.bin", err, errlen);
  if (!rc) rc = sr_path_err(shards, sizeof shards, err, errlen, "%s/shards", t.tmp);
  if (!rc) rc = sr_path_err(work, sizeof work, err, errlen, "%s/.fold-work", root);
  if (!rc) rc = emb_ckpt_fold_rows(&ck->chain, ck->plan, shards, work, err, errlen);
  if (!rc) rc = ckpt_dir_commit(&t, man, err, errlen);
  if (rc) ckpt_dir_abort(&t);
  cJSON_Delete(man);
  return rc;
}

/* 1 when folder inner is to or under it. */
static int is_under(const char *inner, const char *to) {
  char ro[PATH_MAX], rs[PATH_MAX];
  if (!realpath(to, ro) || !realpath(inner, rs)) return 0;
  size_t l = strlen(ro);
  return !strncmp(rs, ro, l) && (rs[l] == '/' || !rs[l]);
}

int emb_ckpt_fold_to(const char *from, const char *to, int force, int64_t *step, char *err,
                     size_t errlen) {
  char out[SR_PATH_MAX], tmp[SR_PATH_MAX];
  struct stat st;
  emb_ckpt ck;
  *step = -1;
  size_t tl = strlen(to);
  while (tl > 1 && to[tl - 1] == '/') tl--;
  int rc = sr_path_err(out, sizeof out, err, errlen, "%.*s", (int)tl, to);
  if (!rc && (rc = ckpt_dir_check_root(out, err, errlen)) == SR_EEXISTS) rc = SR_EINVAL;
  if (!rc && !force && stat(out, &st) == 0) {
    sr_fmt(err, errlen, "%s: already exists (--force replaces a folder of checkpoints)", out);
    rc = SR_EEXISTS;
  }
  if (rc) return rc;
  if ((rc = emb_ckpt_open(from, &ck, err, errlen))) return rc;
  *step = ck.step;
  if (stat(out, &st) == 0 && is_under(ck.dir, out)) {
    sr_fmt(err, errlen, "%s holds the checkpoint %s; write the folded one elsewhere", out, ck.dir);
    rc = SR_EINVAL;
  }
  if (!rc) rc = ckpt_dir_tmp_beside(out, tmp, sizeof tmp, err, errlen);
  if (!rc) {
    ckpt_dir_sweep_beside(out);
    rc = emb_ckpt_fold(&ck, tmp, err, errlen);
    if (!rc) rc = ckpt_dir_replace(tmp, out, NULL, err, errlen);
    if (rc) sr_rmtree(tmp);
  }
  emb_ckpt_close(&ck);
  return rc;
}
