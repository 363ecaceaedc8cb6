/* The store of a trainer checkpoint's rows (see ckpt_store.h). */
#define _XOPEN_SOURCE 700
#include "embedding/ckpt_store.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/ckpt_fold.h"
#include "embedding/shard.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

/* ---- the routing store: rows of each shard in the in-memory store restored
 * from that shard's server folder ---- */

typedef struct rstore {
  emb_store base;
  int n_sub;
  emb_store **sub; /* [n_sub] owned */
  int *sub_of;     /* [plan->n_shards] index into sub, -1: not held */
  int rc;          /* the last lookup's status */
  char err[1024];
} rstore;

/* Split ids by sub-store, run fn on each part, scatter/gather rows. For a
 * lookup rows = out (written); for a push rows = grads (read). */
static int r_route(rstore *s, int64_t step, float lr, const emb_idset *ids, float *const *out,
                   const emb_grad *const *grads) {
  const emb_plan *plan = s->base.plan;
  int T = plan->n_tables, rc = 0;
  if (ids->n_tables != T) {
    snprintf(s->err, sizeof s->err, "id set has %d tables, the plan has %d", ids->n_tables, T);
    return SR_EINVAL;
  }
  uint64_t **sid = calloc((size_t)T, sizeof *sid);
  size_t **pos = calloc((size_t)T, sizeof *pos), *cnt = calloc((size_t)T, sizeof *cnt);
  float **buf = calloc((size_t)T, sizeof *buf);
  if (!sid || !pos || !cnt || !buf) goto oom;
  for (int t = 0; t < T; t++) {
    size_t n = ids->counts[t] ? ids->counts[t] : 1;
    sid[t] = malloc(n * sizeof **sid);
    pos[t] = malloc(n * sizeof **pos);
    buf[t] = malloc(n * (size_t)plan->tables[t].dim * sizeof **buf);
    if (!sid[t] || !pos[t] || !buf[t]) goto oom;
  }
  for (int j = 0; j < s->n_sub && !rc; j++) {
    for (int t = 0; t < T; t++) {
      int dim = plan->tables[t].dim;
      cnt[t] = 0;
      for (size_t i = 0; i < ids->counts[t]; i++) {
        uint64_t id = ids->ids[t][i];
        int k = emb_plan_shard_of(plan, t, id);
        int sj = k >= 0 && k < plan->n_shards ? s->sub_of[k] : -1;
        if (sj < 0) {
          snprintf(s->err, sizeof s->err, "table %d row %llu: its shard %d is not held here", t,
                   (unsigned long long)id, k);
          rc = SR_EINVAL;
          break;
        }
        if (sj != j) continue;
        if (grads) memcpy(buf[t] + cnt[t] * (size_t)dim, grads[t] + i * (size_t)dim, (size_t)dim * 4);
        pos[t][cnt[t]] = i;
        sid[t][cnt[t]++] = id;
      }
      if (rc) break;
    }
    if (rc) break;
    emb_idset part = {.n_tables = T, .ids = (const uint64_t *const *)sid, .counts = cnt};
    if (grads) {
      rc = emb_store_push(s->sub[j], step, lr, &part, (const float *const *)buf);
    } else {
      rc = emb_store_lookup_begin(s->sub[j], step, &part, buf);
      if (!rc) rc = emb_store_lookup_wait(s->sub[j]);
      for (int t = 0; t < T && !rc; t++) {
        size_t dim = (size_t)plan->tables[t].dim;
        for (size_t r = 0; r < cnt[t]; r++)
          memcpy(out[t] + pos[t][r] * dim, buf[t] + r * dim, dim * 4);
      }
    }
    if (rc) snprintf(s->err, sizeof s->err, "%s", emb_store_errmsg(s->sub[j]));
  }
  goto out;
oom:
  snprintf(s->err, sizeof s->err, "out of memory routing rows");
  rc = SR_ENOMEM;
out:
  for (int t = 0; t < T; t++) {
    if (sid) free(sid[t]);
    if (pos) free(pos[t]);
    if (buf) free(buf[t]);
  }
  free(sid);
  free(pos);
  free(cnt);
  free(buf);
  return rc;
}

static int r_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  rstore *s = (rstore *)b;
  s->rc = r_route(s, step, 0, ids, out, NULL);
  return s->rc;
}
static int r_lookup_wait(emb_store *b) { return ((rstore *)b)->rc; }
static int r_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                  const emb_grad *const *grads) {
  return r_route((rstore *)b, step, lr, ids, NULL, grads);
}
static int r_flush(emb_store *b) {
  rstore *s = (rstore *)b;
  for (int j = 0; j < s->n_sub; j++) {
    int rc = emb_store_flush(s->sub[j]);
    if (rc) {
      snprintf(s->err, sizeof s->err, "%s", emb_store_errmsg(s->sub[j]));
      return rc;
    }
  }
  return 0;
}
static int r_unsupported(emb_store *b, const char *what) {
  rstore *s = (rstore *)b;
  snprintf(s->err, sizeof s->err,
           "%s: not supported by a store assembled from several servers' checkpoint folders "
           "(serve each server's shards as they were)", what);
  return SR_EUNSUPPORTED;
}
static int r_checkpoint(emb_store *b, const char *path) {
  (void)path;
  return r_unsupported(b, "checkpoint");
}
static int r_restore(emb_store *b, const char *path, const char *from_model_fp) {
  (void)from_model_fp;
  (void)path;
  return r_unsupported(b, "restore");
}
static int r_iterate(emb_store *b, int table, emb_row_fn fn, void *ctx) {
  (void)table, (void)fn, (void)ctx;
  return r_unsupported(b, "iterate");
}
static int r_stats(emb_store *b, emb_store_stats *out) {
  rstore *s = (rstore *)b;
  memset(out, 0, sizeof *out);
  for (int j = 0; j < s->n_sub; j++) {
    emb_store_stats x;
    if (emb_store_stats_get(s->sub[j], &x)) continue;
    out->rows += x.rows;
    out->bytes += x.bytes;
    out->lookups += x.lookups;
    out->hits += x.hits;
    out->pushes += x.pushes;
  }
  return 0;
}
static const char *r_errmsg(emb_store *b) { return ((rstore *)b)->err; }
static void r_destroy(emb_store *b) {
  rstore *s = (rstore *)b;
  for (int j = 0; j < s->n_sub; j++) emb_store_destroy(s->sub[j]);
  free(s->sub);
  free(s->sub_of);
  free(s);
}
static const emb_store_ops route_ops = {
    .kind = EMB_STORE_ROUTED,
    .ckpt_layout = EMB_CKPT_NONE,
    .lookup_begin = r_lookup_begin,
    .lookup_wait = r_lookup_wait,
    .push = r_push,
    .flush = r_flush,
    .checkpoint = r_checkpoint,
    .restore = r_restore,
    .stats = r_stats,
    .iterate = r_iterate,
    .errmsg = r_errmsg,
    .destroy = r_destroy,
};

/* ---- layout ---- */

/* base/NAME-K.TAG (sr_tmp_tag; K counts this process's folders) made into
 * tpl, after removing the NAME-*.TAG folders there whose owner is gone (a
 * killed server's or predict's copies), saying so on stderr. 0 or SR_E*. */
static int make_tagged(const char *base, const char *name, char *tpl, char *err,
                       size_t errlen) {
  static int made;
  char tag[SR_TMP_TAG_MAX];
  if (sr_tmp_tag(tag, sizeof tag) ||
      sr_path_err(tpl, SR_PATH_MAX, err, errlen, "%s/%s%d.%s", base, name,
                  __atomic_fetch_add(&made, 1, __ATOMIC_RELAXED), tag))
    return SR_ERANGE;
  sr_tmp_sweep(base, name, stderr);
  if (mkdir(tpl, 0700) != 0) {
    snprintf(err, errlen, "%s: cannot make a temporary folder: %s", tpl, strerror(errno));
    return SR_EIO;
  }
  return 0;
}

/* A temporary data folder for the RocksDB layout: $TMPDIR, else /tmp when
 * it is on the checkpoint's file system (the SST files are then
 * hard-linked, not copied), else a hidden folder beside the checkpoint's
 * step-N folders (/tmp when that cannot be made). Into out->tmp_dir. */
static int make_tmp_dir(const char *dir, const char *shards, emb_ckpt_store *out, char *err,
                        size_t errlen) {
  const char *tmp = getenv("TMPDIR");
  char beside[SR_PATH_MAX], tpl[SR_PATH_MAX];
  struct stat a, c;
  int rc;
  if (tmp && *tmp) {
    rc = make_tagged(tmp, "shardrec-ckpt-", tpl, err, errlen);
  } else if (stat("/tmp", &a) || stat(shards, &c) || a.st_dev == c.st_dev ||
             sr_path(beside, sizeof beside, "%s/..", dir) ||
             make_tagged(beside, CKPT_DIR_READER_TMP, tpl, err, errlen)) {
    rc = make_tagged("/tmp", "shardrec-ckpt-", tpl, err, errlen);
  } else {
    rc = 0;
  }
  if (rc) return rc;
  out->tmp_dir = strdup(tpl);
  if (!out->tmp_dir) {
    sr_rmtree(tpl);
    snprintf(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  return 0;
}

/* The RocksDB layout: the shard store over data_dir or a temporary folder,
 * restored from shards (databases copied in, SST files hard-linked). */
static int open_rocks(const char *dir, const char *shards, const emb_plan *plan,
                      const emb_ckpt_store_opts *o, const emb_shard_config *sc, emb_ckpt_store *out,
                      char *err, size_t errlen) {
  const char *data = o->data_dir;
  int rc;
  if (!data) {
    if ((rc = make_tmp_dir(dir, shards, out, err, errlen))) return rc;
    data = out->tmp_dir;
  }
  out->store = emb_store_create_shard(plan, data, sc, err, errlen);
  if (!out->store) return SR_EIO;
  emb_store_absent_zero(out->store); /* scoring: what training read for ids without rows */
  if ((rc = emb_store_restore(out->store, shards))) {
    snprintf(err, errlen, "%s: %s", shards, emb_store_errmsg(out->store));
    return rc;
  }
  snprintf(out->layout, sizeof out->layout, "RocksDB shard databases in %s%s", data,
           o->data_dir ? "" : " (temporary)");
  return 0;
}

/* The in-memory store restored from folder path, into *out. */
static int open_local(const emb_plan *plan, const char *path, emb_store **out, char *err,
                      size_t errlen) {
  *out = emb_store_create_local(plan, err, errlen);
  if (!*out) return SR_ENOMEM;
  emb_store_absent_zero(*out); /* scoring: what training read for ids without rows */
  int rc = emb_store_restore(*out, path);
  if (rc) snprintf(err, errlen, "%s", emb_store_errmsg(*out));
  return rc;
}

/* Which server folder (shard-K[-K2...]) under shards holds each shard, into
 * folder[S]; every wanted shard must have one. */
static int map_folders(const char *shards, int S, const int *want, int n_want,
                       char (*folder)[256], char *err, size_t errlen) {
  int rc = ckpt_dir_server_folders(shards, S, folder, err, errlen);
  for (int i = 0; i < n_want && !rc; i++)
    if (!folder[want[i]][0]) {
      snprintf(err, errlen, "%s: holds no rows of shard %d (no server folder lists it)", shards,
               want[i]);
      rc = SR_ENOTFOUND;
    }
  return rc;
}

/* The wanted shards' rows from in-memory servers' folders: one folder's
 * in-memory store, or a routing store over one per folder. */
static int open_servers(const char *shards, const emb_plan *plan, const int *want, int n_want,
                        emb_ckpt_store *out, char *err, size_t errlen) {
  int S = plan->n_shards, rc, n_folders = 0;
  char path[8400];
  char (*folder)[256] = calloc((size_t)S, sizeof *folder);
  if (!folder) {
    snprintf(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  if ((rc = map_folders(shards, S, want, n_want, folder, err, errlen))) goto out;
  for (int i = 0; i < n_want; i++) {
    int first = 1;
    for (int j = 0; j < i; j++) first &= strcmp(folder[want[j]], folder[want[i]]) != 0;
    n_folders += first;
  }
  if (n_folders == 1) {
    if (!(rc = sr_path_err(path, sizeof path, err, errlen, "%s/%s", shards, folder[want[0]])) &&
        !(rc = open_local(plan, path, &out->store, err, errlen)))
      snprintf(out->layout, sizeof out->layout, "in memory (%.60s)", folder[want[0]]);
    goto out;
  }
  rstore *r = calloc(1, sizeof *r);
  if (r) {
    r->base.ops = &route_ops;
    r->base.plan = plan;
    r->sub = calloc((size_t)n_folders, sizeof *r->sub);
    r->sub_of = malloc((size_t)S * sizeof *r->sub_of);
  }
  if (!r || !r->sub || !r->sub_of) {
    if (r) r_destroy(&r->base);
    snprintf(err, errlen, "out of memory");
    rc = SR_ENOMEM;
    goto out;
  }
  out->store = &r->base;
  for (int k = 0; k < S; k++) r->sub_of[k] = -1;
  for (int i = 0; i < n_want && !rc; i++) {
    int same = -1; /* a wanted shard before this one in the same folder */
    for (int m = 0; m < i && same < 0; m++)
      if (!strcmp(folder[want[m]], folder[want[i]])) same = want[m];
    if (same >= 0) {
      r->sub_of[want[i]] = r->sub_of[same];
      continue;
    }
    rc = sr_path_err(path, sizeof path, err, errlen, "%s/%s", shards, folder[want[i]]);
    if (!rc) rc = open_local(plan, path, &r->sub[r->n_sub], err, errlen);
    if (r->sub[r->n_sub]) r->sub_of[want[i]] = r->n_sub++;
  }
  if (!rc) snprintf(out->layout, sizeof out->layout, "in memory (%d server folders)", r->n_sub);
out:
  free(folder);
  return rc;
}

/* Every wanted shard's database in the RocksDB layout. */
static int check_dbs(const char *shards, const int *want, int n_want, char *err, size_t errlen) {
  struct stat st;
  for (int i = 0; i < n_want; i++) {
    char db[SR_PATH_MAX], cur[SR_PATH_MAX];
    if (ckpt_dir_shard_path(shards, want[i], db, sizeof db) ||
        sr_path_err(cur, sizeof cur, err, errlen, "%s/CURRENT", db))
      return sr_path_too_long(err, errlen, shards, sizeof db);
    if (stat(cur, &st) != 0) {
      snprintf(err, errlen, "%s: holds no rows of shard %d (no RocksDB database %s)", shards,
               want[i], db);
      return SR_ENOTFOUND;
    }
  }
  return 0;
}

/* Which layout holds the wanted shards, and the store over it. */
static int open_layout(const char *dir, const emb_plan *plan, const emb_ckpt_store_opts *o,
                       int *want, int n_want, emb_ckpt_store *out, char *err, size_t errlen) {
  char shards[4200];
  ckpt_shards_layout layout;
  if (ckpt_dir_shards_path(dir, shards, sizeof shards)) {
    snprintf(err, errlen, "%s: path too long", dir);
    return SR_ERANGE;
  }
  int rc = ckpt_dir_shards_layout(shards, &layout, err, errlen);
  if (rc) return rc;
  if (layout == CKPT_SHARDS_DBS) {
    if ((rc = check_dbs(shards, want, n_want, err, errlen))) return rc;
    emb_shard_config sc = {.cache_rows = o->cache_rows, .cache_mb = o->cache_mb,
                           .n_hosted = n_want, .hosted = want};
    return open_rocks(dir, shards, plan, o, &sc, out, err, errlen);
  }
  if (o->data_dir) {
    snprintf(err, errlen, "%s: holds in-memory table files, not RocksDB databases: serve it "
             "without --data-dir", shards);
    return SR_EINVAL;
  }
  if (layout == CKPT_SHARDS_TABLES) { /* the trainer's in-memory store: every shard */
    rc = open_local(plan, shards, &out->store, err, errlen);
    if (!rc) snprintf(out->layout, sizeof out->layout, "in memory (the trainer's table files)");
    return rc;
  }
  return open_servers(shards, plan, want, n_want, out, err, errlen);
}

/* An incremental dir: its chain's rows folded into out->fold_dir/shards,
 * and *open the folder to open (dir itself when it is full). */
static int fold_head(const char *dir, const emb_plan *plan, emb_ckpt_store *out,
                     const char **open, char *err, size_t errlen) {
  cJSON *man = NULL;
  ckpt_dir_chain chain = {0};
  char shards[SR_PATH_MAX], work[SR_PATH_MAX];
  *open = dir;
  int rc = ckpt_dir_read(dir, &man, err, errlen);
  if (rc || ckpt_dir_parent_step(man) == -1) goto out;
  /* The caller verified every file of the chain (train_ckpt_open, emb_ckpt_open). */
  if ((rc = ckpt_dir_chain_open(dir, man, 0, &chain, err, errlen))) goto out;
  emb_ckpt_store keep = *out; /* make_tmp_dir fills tmp_dir: moved to fold_dir */
  if ((rc = make_tmp_dir(dir, dir, out, err, errlen))) goto out;
  out->fold_dir = out->tmp_dir;
  out->tmp_dir = keep.tmp_dir;
  rc = sr_path_err(shards, sizeof shards, err, errlen, "%s/shards", out->fold_dir);
  if (!rc) rc = sr_path_err(work, sizeof work, err, errlen, "%s/work", out->fold_dir);
  if (!rc) rc = emb_ckpt_fold_rows(&chain, plan, shards, work, err, errlen);
  if (!rc) *open = out->fold_dir;
out:
  ckpt_dir_chain_free(&chain);
  cJSON_Delete(man);
  return rc;
}

static void drop_fold(emb_ckpt_store *cs) {
  if (cs->fold_dir) sr_rmtree(cs->fold_dir);
  free(cs->fold_dir);
  cs->fold_dir = NULL;
}

/* Whether data_dir (the shard store's folder, which it writes) and the
 * folder holding checkpoint dir (ROOT of ROOT/step-N: its other steps are
 * a chain's links) overlap, either in the other: 1 with the reason in err.
 * A path that cannot be resolved is left to the open to report. */
static int data_dir_overlaps(const char *dir, const char *data_dir, char *err, size_t errlen) {
  char root[SR_PATH_MAX], data[SR_PATH_MAX], any[SR_PATH_MAX], e[512];
  if (sr_path_confine("/", dir, root, sizeof root, e, sizeof e) ||
      sr_path_confine("/", data_dir, data, sizeof data, e, sizeof e))
    return 0;
  char *slash = strrchr(root, '/');
  if (slash && slash != root) *slash = '\0';
  if (sr_path_confine(root, data, any, sizeof any, e, sizeof e) &&
      sr_path_confine(data, root, any, sizeof any, e, sizeof e))
    return 0;
  snprintf(err, errlen, "--data-dir %s (%s) overlaps the checkpoint's folder %s: the shard store "
           "writes its databases there, and a checkpoint is only read; give a folder apart from it",
           data_dir, data, root);
  return 1;
}

int emb_ckpt_store_open(const char *dir, const emb_plan *plan, const emb_ckpt_store_opts *o,
                    emb_ckpt_store *out, char *err, size_t errlen) {
  const char *open = dir;
  memset(out, 0, sizeof *out);
  if (o->data_dir && data_dir_overlaps(dir, o->data_dir, err, errlen)) return SR_EINVAL;
  int S = plan->n_shards, n_want = o->n_shards ? o->n_shards : S, rc = 0;
  int *want = malloc((size_t)n_want * sizeof *want);
  if (!want) {
    snprintf(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  for (int i = 0; i < n_want && !rc; i++) {
    want[i] = o->n_shards ? o->shards[i] : i;
    if (want[i] < 0 || want[i] >= S) {
      snprintf(err, errlen, "shard %d: the checkpoint's plan has shards 0..%d", want[i], S - 1);
      rc = SR_EINVAL;
    }
  }
  if (!rc) rc = fold_head(dir, plan, out, &open, err, errlen);
  if (!rc) rc = open_layout(open, plan, o, want, n_want, out, err, errlen);
  if (!rc && out->fold_dir) {
    char l[sizeof out->layout];
    snprintf(l, sizeof l, "%s", out->layout);
    snprintf(out->layout, sizeof out->layout, "%.60s, an incremental chain folded", l);
  }
  if (rc) {
    drop_fold(out);
    emb_store_destroy(out->store);
    out->store = NULL;
    if (out->tmp_dir) sr_rmtree(out->tmp_dir);
    free(out->tmp_dir);
    out->tmp_dir = NULL;
  }
  free(want);
  return rc;
}

void emb_ckpt_store_close(emb_ckpt_store *cs) {
  if (!cs) return;
  emb_store_destroy(cs->store);
  if (cs->tmp_dir) sr_rmtree(cs->tmp_dir);
  free(cs->tmp_dir);
  drop_fold(cs);
  memset(cs, 0, sizeof *cs);
}
