/* The shard store's incremental checkpoints (see shard.h, store.h's
 * checkpoint_delta and restore_delta): the change set, one hash set of row
 * ids per table filled by push (no scan of RocksDB: its size is the rows
 * changed; kept from the first checkpoint or restore of any kind on:
 * before it every row held has changed, and a store never saved keeps
 * none), and the two ops.
 *
 * checkpoint_delta(path) writes the dirty rows back as a full checkpoint
 * does, then per table of the plan path/table-<id>.bin (embedding/
 * table_file.h): the table's changed rows in ascending row id, each read
 * from its database (batched MultiGets of SD_BATCH ids, every database in
 * turn), value and optimizer state; the same rows make the same bytes as
 * the in-process store writes (before the set is kept: every row held, by
 * iterate). restore_delta(path) reads every table's file
 * whole first (size, order, checksum, each row hosted here), then writes
 * the dirty rows back, drops the cache as a restore does and writes each
 * row of the files into its database, replacing it. Both clear the change
 * set when they succeed.
 *
 * Removals (remove, shard_remove.c): while the set is kept, a removed id
 * leaves the change set and joins the table's removed set (the same kind
 * of hash set); checkpoint_delta writes the removed ids not in the change
 * set (not pushed again since) as path/removed-<id>.bin (embedding/
 * removed_file.h), and restore_delta reads those files with the table
 * files, checked, then deletes their rows from the databases before it
 * writes the table files' rows. */
#include "embedding/shard_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "common/rng.h"
#include "common/status.h"
#include "embedding/removed_file.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

#define SD_BATCH 1024   /* ids per read batch of checkpoint_delta */
#define SD_WRITES 4096  /* rows per database write of restore_delta */

/* ---- the change set ---- */

/* id into keys[cap] (room there, id not SH_CHG_EMPTY): 1 when it was new. */
static int chg_put(uint64_t *keys, size_t cap, uint64_t id) {
  for (size_t h = (size_t)sr_mix64(id) & (cap - 1);; h = (h + 1) & (cap - 1)) {
    if (keys[h] == id) return 0;
    if (keys[h] == SH_CHG_EMPTY) {
      keys[h] = id;
      return 1;
    }
  }
}

/* Room for extra more ids in c (load <= 1/2). */
static int chg_grow(sh_chg *c, size_t extra) {
  size_t need = 2 * (c->n + extra), cap = c->cap ? c->cap : 64;
  if (c->keys && need <= c->cap) return 0;
  while (cap < need) cap <<= 1;
  uint64_t *k = malloc(cap * sizeof *k);
  if (!k) return SR_ENOMEM;
  memset(k, 0xff, cap * sizeof *k); /* SH_CHG_EMPTY */
  for (size_t i = 0; i < c->cap; i++)
    if (c->keys[i] != SH_CHG_EMPTY) chg_put(k, cap, c->keys[i]);
  free(c->keys);
  c->keys = k;
  c->cap = cap;
  return 0;
}

int shard__chg_reserve(shstore *s, const emb_idset *ids) {
  if (!s->chg_track) return 0;
  for (int t = 0; t < s->n_tables; t++)
    if (ids->counts[t] && chg_grow(&s->chg[t], ids->counts[t])) {
      sr_fmt(s->err, sizeof s->err, "push: out of memory for the change set of table %d", t);
      return SR_ENOMEM;
    }
  return 0;
}

void shard__chg_add(shstore *s, uint32_t t, uint64_t id) {
  if (!s->chg_track) return;
  sh_chg *c = &s->chg[t];
  if (id == SH_CHG_EMPTY) c->has_max = 1;
  else c->n += (size_t)chg_put(c->keys, c->cap, id);
}

/* id out of c, when there (backward shift: the entries after it that may
 * not stay past the gap move back). */
static void chg_del(sh_chg *c, uint64_t id) {
  if (id == SH_CHG_EMPTY) {
    c->has_max = 0;
    return;
  }
  if (!c->keys) return;
  const size_t mask = c->cap - 1;
  size_t h = (size_t)sr_mix64(id) & mask;
  while (c->keys[h] != id) {
    if (c->keys[h] == SH_CHG_EMPTY) return;
    h = (h + 1) & mask;
  }
  size_t gap = h, j = h;
  for (;;) {
    j = (j + 1) & mask;
    if (c->keys[j] == SH_CHG_EMPTY) break;
    size_t home = (size_t)sr_mix64(c->keys[j]) & mask;
    if (((j - home) & mask) >= ((j - gap) & mask)) {
      c->keys[gap] = c->keys[j];
      gap = j;
    }
  }
  c->keys[gap] = SH_CHG_EMPTY;
  c->n--;
}

/* 1 when id is in c. */
static int chg_has(const sh_chg *c, uint64_t id) {
  if (id == SH_CHG_EMPTY) return c->has_max;
  if (!c->keys) return 0;
  for (size_t h = (size_t)sr_mix64(id) & (c->cap - 1);; h = (h + 1) & (c->cap - 1)) {
    if (c->keys[h] == id) return 1;
    if (c->keys[h] == SH_CHG_EMPTY) return 0;
  }
}

int shard__chg_remove_reserve(shstore *s, const emb_idset *ids) {
  if (!s->chg_track) return 0;
  if (!s->rmv && !(s->rmv = calloc((size_t)s->n_tables, sizeof *s->rmv))) goto nomem;
  for (int t = 0; t < s->n_tables; t++)
    if (ids->counts[t] && chg_grow(&s->rmv[t], ids->counts[t])) goto nomem;
  return 0;
nomem:
  sr_fmt(s->err, sizeof s->err, "remove: out of memory for the removed rows' ids");
  return SR_ENOMEM;
}

void shard__chg_removed(shstore *s, const emb_idset *ids, int below_db) {
  if (!s->chg_track) return;
  for (int t = 0; t < s->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++) {
      uint64_t id = ids->ids[t][r];
      if (db_of(s, t, id) >= below_db) continue;
      chg_del(&s->chg[t], id);
      if (id == SH_CHG_EMPTY) s->rmv[t].has_max = 1;
      else s->rmv[t].n += (size_t)chg_put(s->rmv[t].keys, s->rmv[t].cap, id);
    }
}

void shard__chg_clear(shstore *s) {
  for (int t = 0; t < s->n_tables; t++) {
    free(s->chg[t].keys);
    memset(&s->chg[t], 0, sizeof s->chg[t]);
    if (s->rmv) free(s->rmv[t].keys);
  }
  free(s->rmv);
  s->rmv = NULL;
  s->chg_track = 1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The changed ids of table t, ascending, into *out (malloc'd; NULL when
 * none) and *n. */
static int chg_sorted(const sh_chg *c, uint64_t **out, size_t *n) {
  *out = NULL;
  *n = c->n + (size_t)c->has_max;
  if (!*n) return 0;
  uint64_t *k = malloc(*n * sizeof *k);
  if (!k) return SR_ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < c->cap; i++)
    if (c->keys[i] != SH_CHG_EMPTY) k[m++] = c->keys[i];
  qsort(k, m, sizeof *k, cmp_u64);
  if (c->has_max) k[m++] = UINT64_MAX;
  *out = k;
  return 0;
}

/* ---- checkpoint_delta ---- */

/* Rows ids[n] (ascending, n <= SD_BATCH) of table t read from their
 * databases into rows[n][dim + state]. */
static int read_batch(shstore *s, int t, const uint64_t *ids, size_t n, float *rows,
                      uint64_t *kbuf, size_t *pos, const char **vals, size_t *lens) {
  const int dim = s->dim[t], sl = s->slen[t];
  for (int k = 0; k < s->n_db; k++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (db_of(s, t, ids[i]) == k) {
        kbuf[m] = ids[i];
        pos[m++] = i;
      }
    if (!m) continue;
    char e2[512], dp[4200];
    int rc = kv_reader_get_cf(s->crd, s->db[k], t, m, kbuf, vals, lens, e2, sizeof e2);
    for (size_t q = 0; q < m && !rc; q++) {
      if (!vals[q]) {
        sr_fmt(e2, sizeof e2, "row %llu changed but not in its database",
               (unsigned long long)kbuf[q]);
        rc = SR_EIO;
      } else {
        rc = kv_row_decode_w(vals[q], lens[q], dim, sl, sh_wprec(s, (uint32_t)t),
                             rows + pos[q] * (size_t)(dim + sl), e2, sizeof e2);
      }
    }
    kv_reader_release(s->crd);
    if (rc) {
      ckpt_dir_shard_path(s->dir, s->db_shard[k], dp, sizeof dp);
      sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s: table %u: %s", dp,
             s->base.plan->tables[t].table_id, e2);
      return rc;
    }
  }
  return 0;
}

/* Table t's changed rows into dir/table-<id>.bin. */
static int delta_table(shstore *s, int t, const char *dir, const char *model_fp) {
  const emb_table *tb = &s->base.plan->tables[t];
  char path[SR_PATH_MAX], e2[1024];
  if (ckpt_dir_table_file(dir, tb->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  uint64_t *ids;
  size_t n;
  const size_t w = (size_t)(s->dim[t] + s->slen[t]);
  float *rows = malloc(SD_BATCH * w * sizeof *rows);
  uint64_t *kbuf = malloc(SD_BATCH * sizeof *kbuf);
  size_t *pos = malloc(SD_BATCH * sizeof *pos), *lens = malloc(SD_BATCH * sizeof *lens);
  const char **vals = malloc(SD_BATCH * sizeof *vals);
  int rc = chg_sorted(&s->chg[t], &ids, &n);
  if (rc || !rows || !kbuf || !pos || !lens || !vals) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: out of memory");
    rc = SR_ENOMEM;
    goto out;
  }
  emb_tabfile_writer *wr;
  if ((rc = emb_tabfile_create(path, tb, model_fp, n, &wr, e2, sizeof e2))) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
    goto out;
  }
  for (size_t at = 0; at < n && !rc; at += SD_BATCH) {
    size_t m = n - at < SD_BATCH ? n - at : SD_BATCH;
    rc = read_batch(s, t, ids + at, m, rows, kbuf, pos, vals, lens);
    for (size_t i = 0; i < m && !rc; i++)
      if ((rc = emb_tabfile_put(wr, ids[at + i], rows + i * w, e2, sizeof e2)))
        sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
  }
  if (rc) {
    emb_tabfile_abort(wr);
  } else if ((rc = emb_tabfile_commit(wr, e2, sizeof e2))) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
  }
out:
  free(ids);
  free(rows);
  free(kbuf);
  free(pos);
  free(lens);
  free(vals);
  return rc;
}

typedef struct {
  emb_tabfile_writer *w;
  float *row; /* [dim + state] */
  char err[1024];
} all_ctx;

static int put_row(void *ctx, int table, uint64_t id, const float *v, int dim, const float *st,
                   int sl) {
  (void)table;
  all_ctx *c = ctx;
  memcpy(c->row, v, (size_t)dim * sizeof *v);
  if (sl) memcpy(c->row + dim, st, (size_t)sl * sizeof *st);
  return emb_tabfile_put(c->w, id, c->row, c->err, sizeof c->err) ? 1 : 0;
}

/* Table t's every row held into dir/table-<id>.bin (the change set is not
 * kept yet: every row held has changed), from RocksDB in ascending row id
 * (iterate; dirty rows written back already). */
static int delta_table_all(shstore *s, int t, const char *dir, const char *model_fp) {
  const emb_table *tb = &s->base.plan->tables[t];
  char path[SR_PATH_MAX];
  all_ctx c = {0};
  if (ckpt_dir_table_file(dir, tb->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  if (!(c.row = malloc((size_t)(s->dim[t] + s->slen[t]) * sizeof *c.row))) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: out of memory");
    return SR_ENOMEM;
  }
  int rc = emb_tabfile_create(path, tb, model_fp, EMB_TABFILE_COUNT_LATER, &c.w, c.err, sizeof c.err);
  if (!rc) {
    c.err[0] = 0;
    rc = emb_store_iterate(&s->base, t, put_row, &c);
    if (!rc && c.err[0]) rc = SR_EIO; /* a put failed: iterate stopped */
    if (rc) {
      emb_tabfile_abort(c.w);
      if (c.err[0]) sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", c.err);
    } else if ((rc = emb_tabfile_commit(c.w, c.err, sizeof c.err))) {
      sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", c.err);
    }
  } else {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", c.err);
  }
  free(c.row);
  return rc;
}

/* Table t's removed ids not pushed again since as dir/removed-<id>.bin
 * (none: no file). */
static int delta_removed(shstore *s, int t, const char *dir, const char *model_fp) {
  const emb_table *tb = &s->base.plan->tables[t];
  char path[SR_PATH_MAX], e2[1024];
  uint64_t *ids;
  size_t n, m = 0;
  int rc = chg_sorted(&s->rmv[t], &ids, &n);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: out of memory");
    return rc;
  }
  for (size_t i = 0; i < n; i++)
    if (!chg_has(&s->chg[t], ids[i])) ids[m++] = ids[i];
  if (m && ckpt_dir_removed_file(dir, tb->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s: path too long", dir);
    rc = SR_ERANGE;
  } else if (m && (rc = emb_rmfile_write(path, tb, model_fp, ids, m, e2, sizeof e2))) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
  }
  free(ids);
  return rc;
}

int shard__checkpoint_delta(emb_store *b, const char *path) {
  shstore *s = (shstore *)b;
  char fp[EMB_FP_HEX];
  int rc = emb_store_flush(b); /* every changed row in its database */
  if (rc) return rc;
  if (emb_plan_model_fingerprint(b->plan, fp)) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: out of memory");
    return SR_ENOMEM;
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s: cannot create folder: %s", path,
           strerror(errno));
    return SR_EIO;
  }
  for (int t = 0; t < s->n_tables; t++)
    if ((rc = s->chg_track ? delta_table(s, t, path, fp) : delta_table_all(s, t, path, fp)) ||
        (s->rmv && (rc = delta_removed(s, t, path, fp))))
      return rc;
  shard__chg_clear(s);
  return 0;
}

/* ---- restore_delta ---- */

typedef struct {
  shstore *s;
  int t;
  int apply;            /* 0: check only; 1: write each row */
  kv_writes **w;        /* [n_db] (apply) */
  size_t *pending;      /* [n_db] rows put, not committed */
  unsigned char *enc;   /* [kv_row_size] */
  uint64_t bad_id;      /* check: the first row not hosted here */
  int bad;
  int rc;
  char err[768];
} overlay_ctx;

static int commit_db(overlay_ctx *c, int k) {
  shstore *s = c->s;
  c->pending[k] = 0;
  char e2[512];
  int rc = kv_writes_commit(c->w[k], s->db[k], e2, sizeof e2);
  if (rc) sr_fmt(c->err, sizeof c->err, "%s", e2);
  return rc;
}

static int overlay_record(void *vctx, uint64_t id, const float *vals) {
  overlay_ctx *c = vctx;
  shstore *s = c->s;
  int k = db_of(s, c->t, id);
  if (!c->apply) {
    if (k < 0 && !c->bad) {
      c->bad = 1;
      c->bad_id = id;
    }
    return 0;
  }
  const int w = sh_wprec(s, (uint32_t)c->t);
  kv_row_encode_w(s->dim[c->t], s->slen[c->t], w, vals, c->enc);
  kv_writes_put(c->w[k], s->db[k], c->t, id, c->enc, kv_row_size_w(s->dim[c->t], s->slen[c->t], w));
  if (++c->pending[k] == SD_WRITES && (c->rc = commit_db(c, k))) return 1;
  return 0;
}

/* Table t's file under dir read whole: checked (apply 0) or written. */
static int overlay_table(shstore *s, overlay_ctx *c, const char *dir, const char *fp) {
  const emb_table *tb = &s->base.plan->tables[c->t];
  char path[SR_PATH_MAX], e2[1024];
  if (ckpt_dir_table_file(dir, tb->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  c->bad = 0;
  c->rc = 0;
  int rc = emb_tabfile_read(path, tb, fp, overlay_record, c, e2, sizeof e2);
  if (rc == 1 && c->rc) { /* a database write failed */
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: %s", path, c->err);
    return c->rc;
  }
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s", e2);
    return rc;
  }
  if (c->bad) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: row %llu is of shard %d, not hosted here",
           path, (unsigned long long)c->bad_id, emb_plan_shard_of(s->base.plan, c->t, c->bad_id));
    return SR_EMISMATCH;
  }
  for (int k = 0; c->apply && k < s->n_db; k++)
    if (c->pending[k] && (rc = commit_db(c, k))) {
      sr_fmt(s->err, sizeof s->err, "restore_delta: %s: %s", path, c->err);
      return rc;
    }
  return 0;
}

/* Every table's file under path written into the databases (checked). */
static int overlay_all(shstore *s, overlay_ctx *c, const char *path, const char *fp) {
  c->w = calloc((size_t)s->n_db, sizeof *c->w);
  c->pending = calloc((size_t)s->n_db, sizeof *c->pending);
  int rc = c->w && c->pending ? 0 : SR_ENOMEM;
  for (int k = 0; k < s->n_db && !rc; k++)
    if (!(c->w[k] = kv_writes_create())) rc = SR_ENOMEM;
  if (rc) sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
  c->apply = 1;
  for (int t = 0; t < s->n_tables && !rc; t++) {
    c->t = t;
    rc = overlay_table(s, c, path, fp);
  }
  for (int k = 0; c->w && k < s->n_db; k++) kv_writes_destroy(c->w[k]);
  free(c->w);
  free(c->pending);
  return rc;
}

/* The removed ids of each table (malloc'd arrays, the holder's). */
typedef struct {
  uint64_t **ids; /* [n_tables] */
  size_t *n;      /* [n_tables] */
} rm_lists;

/* Table t's removed ids under dir (removed-<id>.bin; absent: none) read
 * and checked (each row hosted here) into rm->ids[t], rm->n[t]. */
static int read_removed(shstore *s, int t, const char *dir, const char *fp, rm_lists *rm) {
  const emb_table *tb = &s->base.plan->tables[t];
  char path[SR_PATH_MAX], e2[1024];
  if (ckpt_dir_removed_file(dir, tb->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  int rc = emb_rmfile_read(path, tb, fp, &rm->ids[t], &rm->n[t], e2, sizeof e2);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s", e2);
    return rc;
  }
  for (size_t i = 0; i < rm->n[t]; i++)
    if (db_of(s, t, rm->ids[t][i]) < 0) {
      sr_fmt(s->err, sizeof s->err, "restore_delta: %s: removed row %llu is of shard %d, not hosted here",
             path, (unsigned long long)rm->ids[t][i],
             emb_plan_shard_of(s->base.plan, t, rm->ids[t][i]));
      return SR_EMISMATCH;
    }
  return 0;
}

/* The rows of rm deleted from their databases, one WriteBatch a database. */
static int delete_removed(shstore *s, const rm_lists *rm) {
  kv_writes *w = kv_writes_create();
  if (!w) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
    return SR_ENOMEM;
  }
  char e2[512];
  int rc = 0;
  for (int d = 0; d < s->n_db && !rc; d++) {
    for (int t = 0; t < s->n_tables; t++)
      for (size_t r = 0; r < rm->n[t]; r++)
        if (db_of(s, t, rm->ids[t][r]) == d) kv_writes_delete(w, s->db[d], t, rm->ids[t][r]);
    if ((rc = kv_writes_commit(w, s->db[d], e2, sizeof e2)))
      sr_fmt(s->err, sizeof s->err, "restore_delta: shard %d: %s", s->db_shard[d], e2);
  }
  kv_writes_destroy(w);
  if (!rc) s->removed = 1; /* the clean stop compacts their space away */
  return rc;
}

/* Every file under path checked whole (table files, removed-rows files into
 * rm) before any row is replaced. */
static int check_delta(shstore *s, overlay_ctx *c, const char *path, const char *fp,
                       rm_lists *rm) {
  int rc = 0;
  for (int t = 0; t < s->n_tables && !rc; t++) {
    c->t = t;
    rc = overlay_table(s, c, path, fp);
  }
  for (int t = 0; t < s->n_tables && !rc; t++) rc = read_removed(s, t, path, fp, rm);
  return rc;
}

int shard__restore_delta(emb_store *b, const char *path) {
  shstore *s = (shstore *)b;
  char fp[EMB_FP_HEX];
  rm_lists rm = {calloc((size_t)s->n_tables, sizeof *rm.ids),
                 calloc((size_t)s->n_tables, sizeof *rm.n)}; /* owned here */
  overlay_ctx c = {.s = s};
  int rc = 0;
  if (!rm.ids || !rm.n || emb_plan_model_fingerprint(b->plan, fp)) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
    rc = SR_ENOMEM;
  }
  if (!rc) rc = check_delta(s, &c, path, fp, &rm);
  /* a row held dirty is replaced, not written later */
  if (!rc) rc = emb_store_flush(b);
  if (!rc && s->marked) rc = shard__marks_remove(s);
  if (!rc) shard__drop_cache(s); /* drained by the flush */
  if (!rc) rc = delete_removed(s, &rm);
  if (!rc && !(c.enc = malloc(kv_row_size(s->stride, 0)))) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
    rc = SR_ENOMEM;
  }
  if (!rc && (rc = overlay_all(s, &c, path, fp)) && rc != SR_ENOMEM) rc = SR_EIO;
  free(c.enc);
  for (int t = 0; rm.ids && t < s->n_tables; t++) free(rm.ids[t]);
  free(rm.ids);
  free(rm.n);
  if (!rc) shard__chg_clear(s);
  return rc;
}
