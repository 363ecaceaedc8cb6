/* The shard store's restore op (emb_store_ops.restore): every hosted
 * shard's database replaced by the checkpoint's, whole or not at all.
 *
 * Every shard folder of the checkpoint is checked first, then copied
 * beside its database, DIR/shard-K.TAG (ckpt_dir_tmp_beside; *.sst files
 * hard-linked, sr_copytree), while the databases stay open and the cache
 * as it is: a copy that fails removes the copies and the store is as it
 * was. Then every read and write is finished, the clean-stop marks go
 * (a crash from here on opens unclean), the databases are closed and each
 * copy is exchanged with its database in one rename
 * (renameat2(RENAME_EXCHANGE); where the file system cannot, three
 * renames through DIR/shard-K.old.TAG), and the new databases opened. A
 * database that does not open is exchanged back and the old ones opened
 * again, the cache untouched: the store as it was. Only when that fails
 * too is the store left without its databases, and every lookup, push,
 * flush, checkpoint and remove returns SR_EIO (s->wb_rc) until a restore
 * succeeds (the folders at the temporary names are kept then). Once the new databases are open the cache is dropped and the
 * old folders, now at the temporary names, removed.
 *
 * A crash leaves each DIR/shard-K whole, the old database or the new
 * (with no mark: unclean when opened), except in the three renames, where
 * it may be missing for a moment; the open finds a temporary of the
 * shard left beside no database and opens unclean
 * (shard__restore_leftovers), then removes the temporaries of dead owners
 * (ckpt_dir_sweep_beside). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "embedding/shard_impl.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

/* A database's folder and the names restore gives it for a while. */
typedef struct {
  char db[SR_PATH_MAX];    /* DIR/shard-K */
  char copy[SR_PATH_MAX];  /* DIR/shard-K.TAG: the checkpoint's copy, then the old one */
  char aside[SR_PATH_MAX]; /* DIR/shard-K.old.TAG: where three renames move the old one */
} rs_names;

/* Every shard folder of path there with a column family for every table. */
static int check_checkpoint(shstore *s, const char *path) {
  const emb_plan *plan = s->base.plan;
  for (int k = 0; k < s->n_db; k++) {
    char src[SR_PATH_MAX];
    if (ckpt_dir_shard_path(path, s->db_shard[k], src, sizeof src)) {
      sr_fmt(s->err, sizeof s->err, "restore: %s: path too long", path);
      return SR_ERANGE;
    }
    uint32_t *have;
    int n_have;
    char e2[512];
    int rc = kv_list_tables(src, &have, &n_have, e2, sizeof e2);
    if (rc) {
      sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
      return SR_ENOTFOUND;
    }
    for (int t = 0; t < s->n_tables && !rc; t++) {
      int found = 0;
      for (int i = 0; i < n_have; i++) found |= have[i] == plan->tables[t].table_id;
      if (!found) {
        sr_fmt(s->err, sizeof s->err, "restore: %s: has no column family for table_id %u",
               src, plan->tables[t].table_id);
        rc = SR_EMISMATCH;
      }
    }
    free(have);
    if (rc) return rc;
  }
  return 0;
}

/* Every shard folder of path copied beside its database (nm[k].copy). */
static int copy_beside(shstore *s, const char *path, rs_names *nm) {
  char e2[768];
  for (int k = 0; k < s->n_db; k++) {
    char src[SR_PATH_MAX];
    char tag[SR_TMP_TAG_MAX];
    if (ckpt_dir_shard_path(path, s->db_shard[k], src, sizeof src) ||
        ckpt_dir_shard_path(s->dir, s->db_shard[k], nm[k].db, sizeof nm[k].db) ||
        sr_tmp_tag(tag, sizeof tag) ||
        sr_path(nm[k].copy, sizeof nm[k].copy, "%s.%s", nm[k].db, tag) ||
        sr_path(nm[k].aside, sizeof nm[k].aside, "%s.old.%s", nm[k].db, tag)) {
      nm[k].copy[0] = 0;
      sr_fmt(s->err, sizeof s->err, "restore: %s: path too long", s->dir);
      return SR_ERANGE;
    }
    sr_rmtree(nm[k].copy); /* an earlier restore's of this process, cut short */
    sr_rmtree(nm[k].aside);
    int rc = sr_copytree(src, nm[k].copy, e2, sizeof e2);
    if (!rc && sr_fsync_dir(nm[k].copy)) {
      sr_fmt(e2, sizeof e2, "%s: cannot sync", nm[k].copy);
      rc = SR_EIO;
    }
    if (rc) {
      sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
      return rc;
    }
  }
  return 0;
}

/* Exchange the folders n->copy and n->db (both there). 0 or SR_EIO (the
 * reason in err; both names as they were, as far as renames can undo). */
static int swap(const rs_names *n, char *err, size_t errlen) {
  if (renameat2(AT_FDCWD, n->copy, AT_FDCWD, n->db, RENAME_EXCHANGE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    sr_fmt(err, errlen, "%s: cannot exchange with %s: %s", n->copy, n->db, strerror(errno));
    return SR_EIO;
  }
  if (rename(n->db, n->aside) != 0) {
    sr_fmt(err, errlen, "%s: cannot move aside: %s", n->db, strerror(errno));
    return SR_EIO;
  }
  if (rename(n->copy, n->db) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", n->copy, n->db, strerror(errno));
    rename(n->aside, n->db);
    return SR_EIO;
  }
  if (rename(n->aside, n->copy) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", n->aside, n->copy, strerror(errno));
    rename(n->db, n->copy);
    rename(n->aside, n->db);
    return SR_EIO;
  }
  return 0;
}

static void close_dbs(shstore *s) {
  for (int k = 0; k < s->n_db; k++) {
    kv_close(s->db[k]);
    s->db[k] = NULL;
  }
}

/* The first n databases' folders exchanged back and every database opened
 * again: 0, or the store is left without them (s->wb_rc, reported by
 * every later call until a restore succeeds). why: the failure that led
 * here. */
static int swap_back(shstore *s, const rs_names *nm, int n, const char *why) {
  char e2[768] = "";
  int rc = 0;
  close_dbs(s);
  for (int k = n - 1; k >= 0 && !rc; k--) rc = swap(&nm[k], e2, sizeof e2);
  sr_fsync_dir(s->dir);
  if (!rc && !(rc = shard__open_dbs(s, NULL))) return 0;
  close_dbs(s);
  s->wb_rc = SR_EIO;
  sr_fmt(s->wb_err, sizeof s->wb_err,
         "%s; the databases as they were cannot be opened again (%s): restore again", why,
         e2[0] ? e2 : s->err);
  return SR_EIO;
}

int shard__restore(emb_store *b, const char *path, const char *from_model_fp) {
  (void)from_model_fp; /* RocksDB rows record no fingerprint: a grown plan's are the same */
  shstore *s = (shstore *)b;
  int rc = check_checkpoint(s, path), swapped = 0;
  char e2[768];
  if (rc) return rc;
  rs_names *nm = calloc(s->n_db > 0 ? (size_t)s->n_db : 1, sizeof *nm);
  if (!nm) {
    sr_fmt(s->err, sizeof s->err, "restore: out of memory");
    return SR_ENOMEM;
  }
  if ((rc = copy_beside(s, path, nm))) goto out;
  shard__drain(s);
  if (s->marked && (rc = shard__marks_remove(s))) goto out;
  close_dbs(s);
  while (swapped < s->n_db && !(rc = swap(&nm[swapped], e2, sizeof e2))) swapped++;
  sr_fsync_dir(s->dir);
  if (rc) sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
  else if ((rc = shard__open_dbs(s, NULL))) {
    memcpy(e2, s->err, sizeof e2);
    e2[sizeof e2 - 1] = 0;
    sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
  }
  if (rc) {
    char why[sizeof s->err];
    memcpy(why, s->err, sizeof why);
    if (swap_back(s, nm, swapped, why)) {
      rc = shard__wb_failed(s);
      swapped = -1; /* the folders at the temporary names kept: which is which is unsure */
    } else sr_fmt(s->err, sizeof s->err, "%s; the rows are as they were", why);
    goto out;
  }
  shard__drop_cache(s); /* the live rows are replaced, not written */
  s->unclean = 0;       /* every row is the checkpoint's now */
  s->wb_rc = 0;         /* and a failed write-back's rows with them */
  shard__chg_clear(s);
out:
  for (int k = 0; k < s->n_db && swapped >= 0; k++)
    if (nm[k].copy[0]) { /* the old databases, or the unused copies */
      sr_rmtree(nm[k].copy);
      sr_rmtree(nm[k].aside);
    }
  free(nm);
  return rc;
}

/* At open, before the databases are opened: a hosted shard whose folder
 * holds no database (no CURRENT) beside a temporary of a restore whose
 * owner is gone was cut between renames: unclean. Then the temporaries of
 * dead owners are removed. */
void shard__restore_leftovers(shstore *s) {
  char **names = NULL;
  int n = 0;
  if (sr_list_dir(s->dir, &names, &n)) return;
  for (int k = 0; k < s->n_db; k++) {
    char db[SR_PATH_MAX], cur[SR_PATH_MAX], prefix[SR_PATH_MAX];
    if (ckpt_dir_shard_path(s->dir, s->db_shard[k], db, sizeof db) ||
        sr_path(cur, sizeof cur, "%s/CURRENT", db))
      continue;
    const char *base = strrchr(db, '/');
    if (sr_path(prefix, sizeof prefix, "%s.", base ? base + 1 : db)) continue;
    for (int i = 0; i < n; i++) {
      const char *tag = strncmp(names[i], prefix, strlen(prefix)) == 0
                            ? strstr(names[i] + strlen(prefix), "tmp-")
                            : NULL;
      if (tag && sr_tmp_owner_gone(tag) && !sr_is_file(cur)) s->unclean = 1;
    }
    ckpt_dir_sweep_beside(db);
  }
  sr_paths_free(names, n);
}
