/* The in-process store's checkpoints: one table file per table (and the
 * removed rows' file of an increment), written and read back whole
 * before anything held is replaced (the layout: store_local.c). */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "embedding/removed_file.h"
#include "embedding/store_local_impl.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"

/* The ids list[n] in ascending order, once each, those held (held 1) or
 * not held (held 0) only, into *out (malloc'd; NULL when none) and *nout. */
static int lt_sorted_ids(const ltab *t, const uint64_t *list, size_t n, int held, uint64_t **out,
                         size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (!n) return 0;
  uint64_t *k = malloc(n * sizeof *k);
  if (!k) return SR_ENOMEM;
  memcpy(k, list, n * sizeof *k);
  emb_rmfile_sort_unique(k, &n);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if ((lt_slot_at(t, lt_find(t, k[i])) != LT_EMPTY) == held) k[m++] = k[i];
  *out = k;
  *nout = m;
  return 0;
}

/* Table ti's removed rows since the last checkpoint not held again, as
 * dir/removed-<table_id>.bin (none: no file). */
static int write_removed(lstore *s, int ti, const char *dir) {
  const ltab *t = &s->t[ti];
  const emb_table *pt = &s->base.plan->tables[ti];
  char path[4096], e2[1024];
  uint64_t *ids;
  size_t n;
  int rc = lt_sorted_ids(t, t->rm_ids, t->rm_n, 0, &ids, &n);
  if (!rc && n && ckpt_dir_removed_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(e2, sizeof e2, "%s: path too long", dir);
    rc = SR_ERANGE;
  } else if (rc) {
    sr_fmt(e2, sizeof e2, "out of memory");
  } else if (n) {
    rc = emb_rmfile_write(path, pt, s->model_fp, ids, n, e2, sizeof e2);
  }
  if (rc) sr_fmt(s->err, sizeof s->err, "checkpoint_delta: %s", e2);
  free(ids);
  return rc;
}

/* Table ti's file under dir: every row held, or (delta) the changed ones. */
static int write_table(lstore *s, int ti, const char *dir, int delta) {
  const ltab *t = &s->t[ti];
  const emb_table *pt = &s->base.plan->tables[ti];
  const char *what = delta ? "checkpoint_delta" : "checkpoint";
  char path[4096], e2[1024];
  if (ckpt_dir_table_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "%s: %s: path too long", what, dir);
    return SR_ERANGE;
  }
  uint64_t *keys;
  size_t n = t->n;
  int rc = delta ? lt_sorted_ids(t, t->chg_ids, t->chg_n, 1, &keys, &n) : lt_sorted_keys(t, &keys);
  if (rc) {
    sr_fmt(s->err, sizeof s->err, "%s: out of memory", what);
    return rc;
  }
  emb_tabfile_writer *w;
  rc = emb_tabfile_create(path, pt, s->model_fp, n, &w, e2, sizeof e2);
  for (size_t i = 0; i < n && !rc; i++) {
    lt_get(t, lt_slot_at(t, lt_find(t, keys[i])), s->row, 1);
    rc = emb_tabfile_put(w, keys[i], s->row, e2, sizeof e2);
  }
  if (!rc) rc = emb_tabfile_commit(w, e2, sizeof e2);
  else emb_tabfile_abort(w);
  if (rc) sr_fmt(s->err, sizeof s->err, "%s: %s", what, e2);
  free(keys);
  return rc;
}

/* Every table's file under path; the change set cleared once all are written. */
static int write_tables(lstore *s, const char *path, int delta) {
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "%s: %s: cannot create folder: %s",
           delta ? "checkpoint_delta" : "checkpoint", path, strerror(errno));
    return SR_EIO;
  }
  for (int ti = 0; ti < s->n; ti++) { /* not tracked yet: every row changed */
    int rc = write_table(s, ti, path, delta && s->t[ti].track);
    if (!rc && delta && s->t[ti].track) rc = write_removed(s, ti, path);
    if (rc) return rc;
  }
  for (int ti = 0; ti < s->n; ti++) lt_clear_changes(&s->t[ti]);
  return 0;
}

int local__checkpoint(emb_store *b, const char *path) {
  return write_tables((lstore *)b, path, 0);
}

int local__checkpoint_delta(emb_store *b, const char *path) {
  return write_tables((lstore *)b, path, 1);
}

/* Each record of a table file into the fresh ltab of emb_tabfile_read_all's
 * ctx. A row id out of order or range refuses the file once its checksum is
 * checked; until then a repeated one keeps its first record and one past a
 * bounded table is skipped (it has no index entry to write). */
static int read_record(void *ctx, uint64_t row_id, const float *vals) {
  ltab *nt = ctx;
  if (nt->rows != EMB_ROWS_UNBOUNDED && row_id >= nt->rows) return 0;
  size_t h = lt_find(nt, row_id);
  if (lt_slot_at(nt, h) == LT_EMPTY)
    lt_put(nt, lt_insert_at(nt, h, row_id), vals);
  return 0;
}

/* Read DIR/table-<id>.bin into a fresh ltab nt. */
static int read_table(lstore *s, int ti, const char *dir, const char *from_fp, ltab *nt) {
  const emb_table *pt = &s->base.plan->tables[ti];
  const ltab *cur = &s->t[ti];
  char path[4096], e2[1024];
  memset(nt, 0, sizeof *nt);
  if (ckpt_dir_table_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore: %s: path too long", dir);
    return SR_ERANGE;
  }
  emb_tabfile_reader *r;
  /* Rows of a smaller plan this one grows (emb_store_restore_grown): its
   * model fingerprint; ids past its rows are this plan's never-written rows. */
  const char *fp = from_fp ? from_fp : s->model_fp;
  int rc = emb_tabfile_open(path, pt, fp, &r, e2, sizeof e2);
  uint64_t n = rc ? 0 : emb_tabfile_rows(r);
  if (!rc && n > LT_MAX_ROWS) {
    sr_fmt(e2, sizeof e2, "%s: %llu rows, more than a table of this store holds (%u)", path,
           (unsigned long long)n, LT_MAX_ROWS);
    rc = SR_EFORMAT;
  }
  if (!rc && (rc = lt_init(nt, cur->dim, cur->slen, cur->prec, cur->rows, (size_t)n)))
    sr_fmt(e2, sizeof e2, "out of memory");
  if (!rc && (rc = emb_tabfile_read_all(r, read_record, nt, e2, sizeof e2))) lt_free(nt);
  emb_tabfile_close(r);
  if (rc) sr_fmt(s->err, sizeof s->err, "restore: %s", e2);
  return rc;
}

int local__restore(emb_store *b, const char *path, const char *from_model_fp) {
  lstore *s = (lstore *)b;
  ltab *nt = calloc((size_t)s->n, sizeof *nt);
  if (!nt) {
    sr_fmt(s->err, sizeof s->err, "restore: out of memory");
    return SR_ENOMEM;
  }
  for (int ti = 0; ti < s->n; ti++) {
    int rc = read_table(s, ti, path, from_model_fp, &nt[ti]);
    if (rc) {
      for (int k = 0; k < ti; k++) lt_free(&nt[k]);
      free(nt);
      return rc;
    }
  }
  for (int ti = 0; ti < s->n; ti++) {
    lt_free(&s->t[ti]);
    nt[ti].track = 1; /* restored: nothing changed since */
  }
  free(s->t);
  s->t = nt;
  return 0;
}

/* Table ti's removed rows under dir (removed-<table_id>.bin; absent: none),
 * checked, into *ids[*n]. */
static int read_removed(lstore *s, int ti, const char *dir, uint64_t **ids, size_t *n) {
  const emb_table *pt = &s->base.plan->tables[ti];
  char path[4096], e2[1024];
  *ids = NULL;
  *n = 0;
  if (ckpt_dir_removed_file(dir, pt->table_id, path, sizeof path)) {
    sr_fmt(s->err, sizeof s->err, "restore_delta: %s: path too long", dir);
    return SR_ERANGE;
  }
  int rc = emb_rmfile_read(path, pt, s->model_fp, ids, n, e2, sizeof e2);
  if (rc) sr_fmt(s->err, sizeof s->err, "restore_delta: %s", e2);
  return rc;
}

/* At most how many rows t gains from an increment of the n rows keys[n]:
 * those not held now (a row it removes and holds again takes the slot
 * its removal freed: the removals come first). */
static size_t rows_added(const ltab *t, const uint64_t *keys, size_t n) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) m += !lt_slot_at(t, lt_find(t, keys[i]));
  return m;
}

/* Every table file and removed-rows file under path read and checked
 * (table files into fresh indexes), room made in the held tables, then
 * the removed rows deleted and each row of the files laid over the held
 * one: a refused folder changes no row. */
int local__restore_delta(emb_store *b, const char *path) {
  lstore *s = (lstore *)b;
  ltab *nt = calloc((size_t)s->n, sizeof *nt);
  uint64_t **keys = calloc((size_t)s->n, sizeof *keys), **rm = calloc((size_t)s->n, sizeof *rm);
  size_t *rm_n = calloc((size_t)s->n, sizeof *rm_n);
  int rc = nt && keys && rm && rm_n ? 0 : SR_ENOMEM;
  for (int k = 0; k < s->n && !rc; k++) rc = read_table(s, k, path, NULL, &nt[k]);
  for (int k = 0; k < s->n && !rc; k++) rc = read_removed(s, k, path, &rm[k], &rm_n[k]);
  for (int k = 0; k < s->n && !rc; k++)
    if ((rc = lt_sorted_keys(&nt[k], &keys[k])) ||
        (rc = lt_reserve(&s->t[k], rows_added(&s->t[k], keys[k], nt[k].n))) ||
        (rm_n[k] && (rc = lt_keys(&s->t[k]))))
      sr_fmt(s->err, sizeof s->err, "restore_delta: table %d: %s", k, sr_strerror(rc));
  if (rc == SR_ENOMEM && (!nt || !keys || !rm || !rm_n))
    sr_fmt(s->err, sizeof s->err, "restore_delta: out of memory");
  for (int k = 0; k < s->n && !rc; k++) {
    ltab *t = &s->t[k];
    for (size_t i = 0; i < rm_n[k]; i++) lt_remove(t, rm[k][i]);
    for (size_t i = 0; i < nt[k].n; i++) {
      size_t h = lt_find(t, keys[k][i]);
      uint32_t s1 = lt_slot_at(t, h);
      if (!s1) s1 = lt_insert_at(t, h, keys[k][i]);
      memcpy(lt_at(t, s1), lt_at(&nt[k], lt_slot_at(&nt[k], lt_find(&nt[k], keys[k][i]))), t->rb);
    }
  }
  for (int k = 0; k < s->n && nt && keys && rm; k++) {
    lt_free(&nt[k]);
    free(keys[k]);
    free(rm[k]);
  }
  free(nt);
  free(keys);
  free(rm);
  free(rm_n);
  if (!rc)
    for (int k = 0; k < s->n; k++) lt_clear_changes(&s->t[k]);
  return rc;
}
