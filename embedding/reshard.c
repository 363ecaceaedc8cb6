/* The resharding engine (see reshard.h). */
#include "embedding/reshard.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/kv.h"
#include "storage/sst.h"

#define RESHARD_SST_MAX_BYTES (256ull << 20) /* an SST file rolls over past this */

uint64_t reshard_row_hash(uint32_t table_id, uint64_t row_id, const void *val, size_t len) {
  const unsigned char *v = val;
  uint64_t h = sr_mix64(((uint64_t)table_id << 32) ^ (uint64_t)len) ^ sr_mix64(row_id ^ 0x5bd1e995ULL);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, v + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
  }
  if (i < len) {
    uint64_t w = 0;
    memcpy(&w, v + i, len - i);
    h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
  }
  return sr_mix64(h);
}

/* A table's keep as the canonical form has it: all zero when it bounds nothing. */
static emb_keep_cfg keep_of(const emb_table *t) {
  emb_keep_cfg k;
  memset(&k, 0, sizeof k);
  return emb_keep_on(t) ? t->keep : k;
}

/* The first keep field that differs between x and y, into buf; 0 when none. */
static int keep_diff(const emb_table *x, const emb_table *y, const char *who, char *buf, size_t len) {
  emb_keep_cfg a = keep_of(x), b = keep_of(y);
  static const char *const names[] = {"admit_after", "admit_window", "expire_after", "capacity",
                                      "half_life"};
  const uint64_t va[] = {a.admit_after, a.admit_window, a.expire_after, a.capacity, a.half_life};
  const uint64_t vb[] = {b.admit_after, b.admit_window, b.expire_after, b.capacity, b.half_life};
  for (int i = 0; i < 5; i++)
    if (va[i] != vb[i]) {
      sr_fmt(buf, len, "%s: keep.%s %llu vs %llu", who, names[i], (unsigned long long)va[i],
             (unsigned long long)vb[i]);
      return 1;
    }
  if (a.evict != b.evict) {
    sr_fmt(buf, len, "%s: keep.evict %s vs %s", who, emb_evict_name(a.evict), emb_evict_name(b.evict));
    return 1;
  }
  return 0;
}

/* The first listed field of the table that differs, into buf; 0 when none. */
static int table_diff(const emb_table *x, const emb_table *y, const char *who, char *buf, size_t len) {
  if (x->table_id != y->table_id) {
    sr_fmt(buf, len, "%s: table_id %u vs %u", who, x->table_id, y->table_id);
  } else if (strcmp(x->name, y->name)) {
    sr_fmt(buf, len, "%s: name '%s' vs '%s'", who, x->name, y->name);
  } else if (x->rows != y->rows) {
    sr_fmt(buf, len, "%s: rows %llu vs %llu", who, (unsigned long long)x->rows,
           (unsigned long long)y->rows);
  } else if (x->dim != y->dim) {
    sr_fmt(buf, len, "%s: dim %d vs %d", who, x->dim, y->dim);
  } else if (x->pooling != y->pooling) {
    sr_fmt(buf, len, "%s: pooling %s vs %s", who, emb_pooling_name(x->pooling),
           emb_pooling_name(y->pooling));
  } else if (x->init_range != y->init_range) {
    sr_fmt(buf, len, "%s: init_range %.17g vs %.17g", who, x->init_range, y->init_range);
  } else if (x->optim.kind != y->optim.kind) {
    sr_fmt(buf, len, "%s: optimizer %s vs %s", who, emb_optim_name(x->optim.kind),
           emb_optim_name(y->optim.kind));
  } else if (x->optim.eps != y->optim.eps) {
    sr_fmt(buf, len, "%s: optimizer eps %.17g vs %.17g", who, x->optim.eps, y->optim.eps);
  } else if (x->optim.init_acc != y->optim.init_acc) {
    sr_fmt(buf, len, "%s: optimizer initial_accumulator_value %.17g vs %.17g", who,
           x->optim.init_acc, y->optim.init_acc);
  } else if (x->precision != y->precision) {
    sr_fmt(buf, len, "%s: precision %s vs %s (reshard --precision converts)", who,
           emb_precision_name(x->precision), emb_precision_name(y->precision));
  } else {
    return keep_diff(x, y, who, buf, len);
  }
  return 1;
}

/* Table x of plan a as a plan of its own, in canonical model form (malloc'd;
 * NULL when out of memory). */
static char *table_canonical(const emb_plan *a, const emb_table *x) {
  emb_plan one = *a;
  one.n_tables = 1;
  one.tables = (emb_table *)x;
  return emb_plan_canonical(&one, 0);
}

void reshard_model_diff(const emb_plan *a, const emb_plan *b, char *buf, size_t len) {
  buf[0] = 0;
  if (a->seed != b->seed) {
    sr_fmt(buf, len, "seed %llu vs %llu", (unsigned long long)a->seed, (unsigned long long)b->seed);
    return;
  }
  if (a->n_tables != b->n_tables) {
    sr_fmt(buf, len, "%d tables vs %d", a->n_tables, b->n_tables);
    return;
  }
  for (int t = 0; t < a->n_tables; t++) {
    const emb_table *x = &a->tables[t], *y = &b->tables[t];
    char who[128];
    snprintf(who, sizeof who, "tables[%d] (table_id %u, %s)", t, x->table_id, x->name);
    if (table_diff(x, y, who, buf, len)) return;
  }
  /* No listed field differs: the first table whose canonical form does,
   * so a field the fingerprint covers is never left unnamed. */
  for (int t = 0; t < a->n_tables; t++) {
    const emb_table *x = &a->tables[t], *y = &b->tables[t];
    char *sa = table_canonical(a, x), *sb = table_canonical(b, y);
    int differs = sa && sb && strcmp(sa, sb);
    if (differs)
      sr_fmt(buf, len, "tables[%d] (table_id %u, %s): %s vs %s", t, x->table_id, x->name, sa, sb);
    free(sa);
    free(sb);
    if (differs) return;
  }
}

void reshard_stats_free(reshard_stats *st) {
  if (!st) return;
  free(st->tables);
  memset(st, 0, sizeof *st);
}

/* ---- the run ---- */

typedef struct run run;

/* One table at a time per worker: its SST writer per target. */
typedef struct worker {
  run *r;
  int id;
  sst_writer **w;    /* [n_dst] the current table's writer per target (NULL: none open) */
  uint64_t *w_bytes; /* [n_dst] bytes in the open file */
  char ***files;     /* [n_dst] the current table's finished files */
  int *n_files, *cap_files;
  uint64_t seq;      /* file name counter */
  uint64_t rows, bytes;
  int rc;
  char err[1024];
} worker;

struct run {
  const reshard_opts *o;
  int n_src, n_dst;
  sst_db **src;        /* [n_src] */
  sst_db **dst;        /* [n_dst] */
  const uint32_t *ids; /* [dst n_tables] table ids in the new plan's order */
  reshard_table *vt;   /* [n_dst][dst n_tables] what verification read per target */
  reshard_table *tables; /* [dst n_tables] = the stats' */
  pthread_mutex_t mu;  /* next_table, failed, pg */
  int next_table, failed;
  sr_progress pg;      /* "reshard: rows ..." on a terminal (common/progress.h) */
};

static int add_file(worker *w, int k, const char *path) {
  if (w->n_files[k] == w->cap_files[k]) {
    int cap = w->cap_files[k] ? 2 * w->cap_files[k] : 4;
    char **np = realloc(w->files[k], (size_t)cap * sizeof *np);
    if (!np) return SR_ENOMEM;
    w->files[k] = np;
    w->cap_files[k] = cap;
  }
  if (!(w->files[k][w->n_files[k]] = strdup(path))) return SR_ENOMEM;
  w->n_files[k]++;
  return 0;
}

static int close_writer(worker *w, int k, char *err, size_t errlen) {
  if (!w->w[k]) return 0;
  int rc = sst_writer_finish(w->w[k], NULL, err, errlen);
  sst_writer_destroy(w->w[k]);
  w->w[k] = NULL;
  w->w_bytes[k] = 0;
  return rc;
}

/* Append one row to target k's file for table tid (opened on first use,
 * rolled over past RESHARD_SST_MAX_BYTES), through the row hook if any. */
static int put_row(worker *w, int k, uint32_t tid, uint64_t key, const char *val, size_t len,
                   char *err, size_t errlen) {
  const reshard_opts *o = w->r->o;
  int rc;
  if (w->w[k] && w->w_bytes[k] >= RESHARD_SST_MAX_BYTES) {
    if ((rc = close_writer(w, k, err, errlen))) return rc;
  }
  if (!w->w[k]) {
    char path[SR_PATH_MAX];
    if ((rc = sr_path_err(path, sizeof path, err, errlen, "%s/t%u-s%d-w%d-%06llu.sst", o->work_dir,
                          tid, k, w->id, (unsigned long long)w->seq++)))
      return rc;
    if ((rc = sst_writer_open(path, &w->w[k], err, errlen))) return rc;
    if ((rc = add_file(w, k, path))) {
      sr_fmt(err, errlen, "out of memory");
      return rc;
    }
  }
  if (o->row_hook) {
    unsigned char tmp[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
    memcpy(tmp, val, len);
    if (o->row_hook(o->row_hook_ctx, tid, key, tmp, len)) return 0; /* dropped */
    rc = sst_writer_put(w->w[k], key, tmp, len, err, errlen);
  } else {
    rc = sst_writer_put(w->w[k], key, val, len, err, errlen);
  }
  w->w_bytes[k] += 8 + len;
  return rc;
}

/* Check an encoded row's header against the table's dim and state. */
static int row_ok(const char *v, size_t len, int dim, int slen) {
  int w;
  return kv_row_check(v, len, dim, slen, &w);
}

/* *v (a checked row) in table tb's precision: as it is when its weights
 * are already of it, else converted into buf (each weight rounded to
 * nearest; 16 bits to fp32 is exact), *v and *len then naming buf. */
static void to_precision(const emb_table *tb, int slen, const char **v, size_t *len,
                         unsigned char *buf) {
  int w;
  float row[EMB_MAX_DIM * 2 + 1];
  char e2[256];
  kv_row_check(*v, *len, tb->dim, slen, &w);
  if (w == (int)tb->precision ||
      kv_row_decode_w(*v, *len, tb->dim, slen, (int)tb->precision, row, e2, sizeof e2))
    return;
  kv_row_encode_w(tb->dim, slen, (int)tb->precision, row, buf);
  *v = (const char *)buf;
  *len = kv_row_size_w(tb->dim, slen, (int)tb->precision);
}

/* Run job(ctx, k, ti) for k = 0..n-1 on up to 16 threads at a time. Each
 * target's database work is mostly waiting for fsync (RocksDB syncs the
 * MANIFEST, the OPTIONS file and the folder for every family created and
 * every file ingested), so targets proceed side by side. The first failure
 * (lowest k) is reported. */
typedef int (*par_fn)(void *ctx, int k, int ti, char *err, size_t errlen);
typedef struct {
  void *ctx;
  int k, ti, rc;
  char err[1024];
  par_fn job;
} par_job;

static void *par_main(void *arg) {
  par_job *j = arg;
  j->rc = j->job(j->ctx, j->k, j->ti, j->err, sizeof j->err);
  return NULL;
}

static int par_each(void *ctx, int n, int ti, par_fn job, char *err, size_t errlen) {
  enum { PAR = 16 };
  par_job jobs[PAR];
  pthread_t th[PAR];
  int rc = 0;
  for (int base = 0; base < n; base += PAR) {
    int m = n - base < PAR ? n - base : PAR;
    int started[PAR];
    for (int i = 0; i < m; i++) {
      jobs[i] = (par_job){.ctx = ctx, .k = base + i, .ti = ti, .job = job};
      jobs[i].err[0] = 0;
      started[i] = m > 1 && pthread_create(&th[i], NULL, par_main, &jobs[i]) == 0;
      if (!started[i]) par_main(&jobs[i]); /* one job, or no thread: do it here */
    }
    for (int i = 0; i < m; i++) {
      if (started[i]) pthread_join(th[i], NULL);
      if (jobs[i].rc && !rc) {
        rc = jobs[i].rc;
        sr_fmt(err, errlen, "%s", jobs[i].err);
      }
    }
    if (rc) break;
  }
  return rc;
}

/* Finish worker w's file of table ti for target k and ingest its files. */
static int ingest_job(void *ctx, int k, int ti, char *err, size_t errlen) {
  worker *w = ctx;
  int rc = close_writer(w, k, err, errlen);
  if (!rc && w->n_files[k])
    rc = sst_db_ingest(w->r->dst[k], ti, (const char *const *)w->files[k], w->n_files[k], err,
                       errlen);
  for (int f = 0; f < w->n_files[k]; f++) {
    unlink(w->files[k][f]); /* moved when ingested; gone either way */
    free(w->files[k][f]);
  }
  w->n_files[k] = 0;
  return rc;
}

static int create_job(void *ctx, int k, int ti, char *err, size_t errlen) {
  (void)ti;
  run *r = ctx;
  const emb_plan *dst = r->o->dst;
  char path[SR_PATH_MAX];
  if (ckpt_dir_shard_path(r->o->out_dir, k, path, sizeof path)) {
    sr_fmt(err, errlen, "%s: path too long", r->o->out_dir);
    return SR_ERANGE;
  }
  return sst_db_create(path, dst->n_tables, r->ids, r->o->work_dir, &r->dst[k], err, errlen);
}

/* Hand the worker's rows since the last call to the progress line. */
static void add_progress(worker *w, uint64_t rows, uint64_t bytes) {
  run *r = w->r;
  pthread_mutex_lock(&r->mu);
  sr_progress_set(&r->pg, r->pg.done + rows, r->pg.bytes + bytes);
  pthread_mutex_unlock(&r->mu);
}

/* Source s's folder (SRC/shard-K), for messages. */
static const char *src_path(const run *r, int s, char buf[4200]) {
  ckpt_dir_shard_path(r->o->src_dir, s, buf, 4200);
  return buf;
}

/* Move table ti (new plan index) from every source to its targets. */
static int move_table(worker *w, int ti, char *err, size_t errlen) {
  run *r = w->r;
  const emb_plan *dst = r->o->dst;
  const emb_table *tb = &dst->tables[ti];
  reshard_table *rt = &r->tables[ti];
  uint32_t tid = tb->table_id;
  int dim = tb->dim, slen = emb_optim_state_len(&tb->optim, dim);
  int rc = 0;
  char sp[4200];
  sst_iter **it = calloc((size_t)r->n_src, sizeof *it);
  if (!it) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  for (int s = 0; s < r->n_src; s++) {
    int cf = sst_db_find(r->src[s], tid);
    if (cf < 0) {
      sr_fmt(err, errlen, "%s: has no column family for table_id %u (%s)", src_path(r, s, sp),
             tid, tb->name);
      rc = SR_EFORMAT;
      goto out;
    }
    /* Block checksums off: train_ckpt_open has just checked every source file's
     * SHA-256 against the manifest, and every row is hashed here anyway. */
    if (!(it[s] = sst_iter_create(r->src[s], cf, r->o->src_checked ? 0 : 1))) {
      sr_fmt(err, errlen, "out of memory");
      rc = SR_ENOMEM;
      goto out;
    }
  }
  uint64_t n = 0, shown = 0, bytes = 0, shown_bytes = 0;
  unsigned char conv[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
  for (;;) {
    /* The smallest row id among the sources (few: a linear pass). */
    int best = -1;
    uint64_t bk = 0;
    for (int s = 0; s < r->n_src; s++) {
      if (!sst_iter_valid(it[s])) continue;
      uint64_t k = sst_iter_key(it[s]);
      if (best < 0 || k < bk) {
        best = s;
        bk = k;
      } else if (k == bk) {
        char sp2[4200];
        sr_fmt(err, errlen, "table_id %u (%s): row %llu is in both %s and %s", tid, tb->name,
               (unsigned long long)k, src_path(r, best, sp), src_path(r, s, sp2));
        rc = SR_EFORMAT;
        goto out;
      }
    }
    if (best < 0) break;
    size_t len;
    const char *v = sst_iter_value(it[best], &len);
    if (!row_ok(v, len, dim, slen)) {
      sr_fmt(err, errlen, "%s: table_id %u (%s) row %llu: a value of %zu bytes is not a row "
             "of dim %d with %d state floats (expected %zu bytes)", src_path(r, best, sp), tid, tb->name,
             (unsigned long long)bk, len, dim, slen, kv_row_size_w(dim, slen, (int)tb->precision));
      rc = SR_EFORMAT;
      goto out;
    }
    if (tb->rows != EMB_ROWS_UNBOUNDED && bk >= tb->rows) {
      sr_fmt(err, errlen, "%s: table_id %u (%s): row id %llu is past the table's %llu rows",
             src_path(r, best, sp), tid, tb->name, (unsigned long long)bk,
             (unsigned long long)tb->rows);
      rc = SR_EFORMAT;
      goto out;
    }
    to_precision(tb, slen, &v, &len, conv); /* reshard --precision */
    uint64_t h = reshard_row_hash(tid, bk, v, len);
    rt->rows_in++;
    rt->sum_in += h;
    rt->xor_in ^= h;
    int k = emb_plan_shard_of(dst, ti, bk);
    if ((rc = put_row(w, k, tid, bk, v, len, err, errlen))) goto out;
    n++;
    bytes += 8 + len;
    if ((n & 0xffff) == 0) {
      add_progress(w, n - shown, bytes - shown_bytes);
      shown = n;
      shown_bytes = bytes;
    }
    sst_iter_next(it[best]);
  }
  add_progress(w, n - shown, bytes - shown_bytes);
  w->rows += n;
  w->bytes += bytes;
  for (int s = 0; s < r->n_src; s++) {
    char e2[512];
    if ((rc = sst_iter_status(it[s], e2, sizeof e2))) {
      sr_fmt(err, errlen, "%s: table_id %u (%s): %s", src_path(r, s, sp), tid, tb->name, e2);
      goto out;
    }
  }
  /* Finish and ingest this table's files into each target. */
  rc = par_each(w, r->n_dst, ti, ingest_job, err, errlen);
out:
  for (int s = 0; s < r->n_src; s++) sst_iter_destroy(it[s]);
  free(it);
  return rc;
}

/* A worker: tables in turn until none is left or one failed. */
static void *worker_main(void *arg) {
  worker *w = arg;
  run *r = w->r;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    int ti = r->failed ? r->o->dst->n_tables : r->next_table++;
    pthread_mutex_unlock(&r->mu);
    if (ti >= r->o->dst->n_tables) break;
    if ((w->rc = move_table(w, ti, w->err, sizeof w->err))) {
      pthread_mutex_lock(&r->mu);
      r->failed = 1;
      pthread_mutex_unlock(&r->mu);
      break;
    }
  }
  return NULL;
}

static void worker_free(worker *w, int n_dst) {
  for (int k = 0; w->w && k < n_dst; k++) {
    sst_writer_destroy(w->w[k]);
    for (int f = 0; w->files && f < w->n_files[k]; f++) {
      unlink(w->files[k][f]);
      free(w->files[k][f]);
    }
    if (w->files) free(w->files[k]);
  }
  free(w->w);
  free(w->w_bytes);
  free(w->files);
  free(w->n_files);
  free(w->cap_files);
}

static int worker_init(worker *w, run *r, int id) {
  memset(w, 0, sizeof *w);
  w->r = r;
  w->id = id;
  w->w = calloc((size_t)r->n_dst, sizeof *w->w);
  w->w_bytes = calloc((size_t)r->n_dst, sizeof *w->w_bytes);
  w->files = calloc((size_t)r->n_dst, sizeof *w->files);
  w->n_files = calloc((size_t)r->n_dst, sizeof *w->n_files);
  w->cap_files = calloc((size_t)r->n_dst, sizeof *w->cap_files);
  return w->w && w->w_bytes && w->files && w->n_files && w->cap_files ? 0 : SR_ENOMEM;
}
/* Re-read target k: count and hash every table's rows into its own
 * r->vt[k * n_tables + ti] (targets run side by side), check their routing. */
static int verify_target(void *ctx, int k, int unused, char *err, size_t errlen) {
  (void)unused;
  run *r = ctx;
  reshard_table *part = &r->vt[(size_t)k * (size_t)r->o->dst->n_tables];
  const emb_plan *dst = r->o->dst;
  char path[SR_PATH_MAX];
  if (ckpt_dir_shard_path(r->o->out_dir, k, path, sizeof path))
    return sr_path_too_long(err, errlen, r->o->out_dir, sizeof path);
  sst_db *db = NULL;
  int rc = sst_db_open_read(path, r->o->work_dir, &db, err, errlen);
  if (rc) return rc;
  if (sst_db_n_tables(db) != dst->n_tables) {
    sr_fmt(err, errlen, "%s: holds %d tables, the plan has %d", path, sst_db_n_tables(db),
           dst->n_tables);
    rc = SR_EFORMAT;
    goto out;
  }
  for (int ti = 0; ti < dst->n_tables && !rc; ti++) {
    reshard_table *rt = &part[ti];
    int cf = sst_db_find(db, rt->table_id);
    if (cf < 0) {
      sr_fmt(err, errlen, "%s: no column family for table_id %u (%s)", path, rt->table_id, rt->name);
      rc = SR_EFORMAT;
      break;
    }
    /* RocksDB's block checksums add nothing here: every row's key and bytes
     * go into the hash compared below, and a block that does not parse
     * fails the scan. */
    sst_iter *it = sst_iter_create(db, cf, 0);
    if (!it) {
      rc = SR_ENOMEM;
      break;
    }
    for (; sst_iter_valid(it); sst_iter_next(it)) {
      uint64_t key = sst_iter_key(it);
      size_t len;
      const char *v = sst_iter_value(it, &len);
      int want = emb_plan_shard_of(dst, ti, key);
      if (want != k) {
        sr_fmt(err, errlen, "verification: table_id %u (%s): row %llu was written to shard %d, the "
               "plan puts it on shard %d", rt->table_id, rt->name, (unsigned long long)key, k, want);
        rc = SR_ECHECKSUM;
        break;
      }
      uint64_t h = reshard_row_hash(rt->table_id, key, v, len);
      rt->rows_out++;
      rt->sum_out += h;
      rt->xor_out ^= h;
    }
    char e2[512];
    if (!rc && (rc = sst_iter_status(it, e2, sizeof e2)))
      sr_fmt(err, errlen, "%s: table_id %u: %s", path, rt->table_id, e2);
    sst_iter_destroy(it);
  }
out:
  sst_db_close(db);
  return rc;
}

/* Remove RocksDB's leftovers that are no part of a database's state (the
 * lock file), so the folder matches what a RocksDB checkpoint holds. */
static void tidy_db_dir(const char *path) {
  char p[SR_PATH_MAX];
  if (!sr_path(p, sizeof p, "%s/LOCK", path)) unlink(p);
}

int reshard__compare(reshard_stats *st, char *err, size_t errlen) {
  int rc = 0;
  for (int ti = 0; ti < st->n_tables; ti++) {
    reshard_table *t = &st->tables[ti];
    t->ok = t->rows_in == t->rows_out && t->sum_in == t->sum_out && t->xor_in == t->xor_out;
    if (!t->ok && !rc) {
      if (t->rows_in != t->rows_out)
        sr_fmt(err, errlen, "verification failed: table_id %u (%s): %llu rows read from the "
               "sources, %llu in the written shards", t->table_id, t->name,
               (unsigned long long)t->rows_in, (unsigned long long)t->rows_out);
      else
        sr_fmt(err, errlen, "verification failed: table_id %u (%s): %llu rows, but their checksum "
               "in the written shards (%016llx/%016llx) differs from the sources' "
               "(%016llx/%016llx)", t->table_id, t->name, (unsigned long long)t->rows_in,
               (unsigned long long)t->sum_out, (unsigned long long)t->xor_out,
               (unsigned long long)t->sum_in, (unsigned long long)t->xor_in);
      rc = SR_ECHECKSUM;
    }
  }
  return rc;
}

/* The names a RocksDB database holds ("OPTIONS-000012.dbtmp",
 * "LOG.old.1700000000000000"), with room to spare. */
#define RESHARD_NAME_ROOM 64

/* Every path reshard_run makes fits (the widest shard, worker and file
 * numbers), checked before anything is written: 0 or SR_ERANGE with the
 * folder's start in err. */
static int paths_fit(const reshard_opts *o, char *err, size_t errlen) {
  char p[SR_PATH_MAX];
  int rc = sr_path_err(p, sizeof p, err, errlen, "%s/shard-%d/%*s", o->src_dir, INT_MAX,
                       RESHARD_NAME_ROOM, "");
  if (!rc) rc = sr_path_err(p, sizeof p, err, errlen, "%s/shard-%d/%*s", o->out_dir, INT_MAX,
                            RESHARD_NAME_ROOM, "");
  if (!rc) rc = sr_path_err(p, sizeof p, err, errlen, "%s/t%u-s%d-w%d-%06llu.sst", o->work_dir,
                            UINT_MAX, INT_MAX, INT_MAX, ULLONG_MAX);
  return rc;
}

/* Open the source shards for reading; every table family they hold must
 * be a table of the plan (rows of another table would be lost). Counts
 * their rows for the progress line. 0 or SR_E* (err). */
static int sources_open(run *r, char *err, size_t errlen) {
  for (int s = 0; s < r->n_src; s++) {
    char path[SR_PATH_MAX];
    if (ckpt_dir_shard_path(r->o->src_dir, s, path, sizeof path)) {
      sr_fmt(err, errlen, "%s: path too long", r->o->src_dir);
      return SR_ERANGE;
    }
    int rc = sst_db_open_read(path, r->o->work_dir, &r->src[s], err, errlen);
    if (rc) return rc;
    for (int i = 0; i < sst_db_n_tables(r->src[s]); i++) {
      uint32_t tid = sst_db_table_id(r->src[s], i);
      if (emb_plan_table_index(r->o->dst, tid) < 0) {
        sr_fmt(err, errlen, "%s: holds table_id %u, which the plan does not have", path, tid);
        return SR_EFORMAT;
      }
      r->pg.total += sst_db_estimate_rows(r->src[s], i);
    }
  }
  return 0;
}

/* Read every target back (--verify): per table its rows, sum and xor
 * against the sources' (reshard__compare). 0 or SR_E* (err). */
static int verify_all(run *r, reshard_stats *st, char *err, size_t errlen) {
  const int nt = r->o->dst->n_tables;
  double tv = sr_now();
  if (!(r->vt = calloc((size_t)r->n_dst * (size_t)nt, sizeof *r->vt))) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  for (int k = 0; k < r->n_dst; k++)
    for (int ti = 0; ti < nt; ti++) r->vt[(size_t)k * nt + ti] = st->tables[ti];
  int rc = par_each(r, r->n_dst, 0, verify_target, err, errlen);
  st->verify_seconds = sr_now() - tv;
  if (rc) return rc;
  for (int k = 0; k < r->n_dst; k++)
    for (int ti = 0; ti < nt; ti++) {
      const reshard_table *x = &r->vt[(size_t)k * nt + ti];
      st->tables[ti].rows_out += x->rows_out;
      st->tables[ti].sum_out += x->sum_out;
      st->tables[ti].xor_out ^= x->xor_out;
    }
  return reshard__compare(st, err, errlen);
}

int reshard_run(const reshard_opts *o, reshard_stats *st, char *err, size_t errlen) {
  memset(st, 0, sizeof *st);
  int rc = paths_fit(o, err, errlen);
  if (rc) return rc;
  double t0 = sr_now();
  const emb_plan *dst = o->dst;
  run r;
  memset(&r, 0, sizeof r);
  r.o = o;
  r.n_src = o->src->n_shards;
  r.n_dst = dst->n_shards;
  pthread_mutex_init(&r.mu, NULL);
  int n_work = o->threads > 0 ? o->threads : 1;
  if (n_work > dst->n_tables) n_work = dst->n_tables;
  int n_init = 0;
  uint32_t *ids = malloc((size_t)dst->n_tables * sizeof *ids);
  st->tables = calloc((size_t)dst->n_tables, sizeof *st->tables);
  r.src = calloc((size_t)r.n_src, sizeof *r.src);
  r.dst = calloc((size_t)r.n_dst, sizeof *r.dst);
  worker *wk = calloc((size_t)n_work, sizeof *wk);
  pthread_t *th = calloc((size_t)n_work, sizeof *th);
  int *started = calloc((size_t)n_work, sizeof *started);
  if (!ids || !st->tables || !r.src || !r.dst || !wk || !th || !started) {
    sr_fmt(err, errlen, "out of memory");
    rc = SR_ENOMEM;
    goto out;
  }
  for (; n_init < n_work; n_init++)
    if (worker_init(&wk[n_init], &r, n_init)) {
      n_init++;
      sr_fmt(err, errlen, "out of memory");
      rc = SR_ENOMEM;
      goto out;
    }
  st->n_tables = dst->n_tables;
  r.tables = st->tables;
  for (int t = 0; t < dst->n_tables; t++) {
    ids[t] = dst->tables[t].table_id;
    st->tables[t].table_id = ids[t];
    snprintf(st->tables[t].name, sizeof st->tables[t].name, "%s", dst->tables[t].name);
  }
  if ((rc = sources_open(&r, err, errlen))) goto out;
  r.ids = ids;
  if ((rc = par_each(&r, r.n_dst, 0, create_job, err, errlen))) goto out;
  sr_progress_begin(&r.pg, o->progress, "reshard", "rows", r.pg.total);
  r.pg.show_bytes = 1;
  /* Tables in parallel, each worker taking the next table not yet taken. */
  for (int i = 0; i < n_work; i++)
    started[i] = n_work > 1 && pthread_create(&th[i], NULL, worker_main, &wk[i]) == 0;
  for (int i = 0; i < n_work; i++)
    if (!started[i]) worker_main(&wk[i]);
  for (int i = 0; i < n_work; i++) {
    if (started[i]) pthread_join(th[i], NULL);
    started[i] = 0;
  }
  for (int i = 0; i < n_work; i++) {
    st->rows += wk[i].rows;
    st->bytes += wk[i].bytes;
    if (wk[i].rc && !rc) {
      rc = wk[i].rc;
      sr_fmt(err, errlen, "%s", wk[i].err);
    }
  }
  if (rc) goto out;
  sr_progress_end(&r.pg);
  for (int k = 0; k < r.n_dst; k++) {
    sst_db_close(r.dst[k]);
    r.dst[k] = NULL;
    char path[SR_PATH_MAX];
    if (!ckpt_dir_shard_path(o->out_dir, k, path, sizeof path)) tidy_db_dir(path);
  }
  if (o->verify) rc = verify_all(&r, st, err, errlen);
out:
  if (rc && r.pg.on && r.pg.done) fprintf(stderr, "\n");
  for (int i = 0; i < n_init; i++) worker_free(&wk[i], r.n_dst);
  for (int s = 0; r.src && s < r.n_src; s++) sst_db_close(r.src[s]);
  for (int k = 0; r.dst && k < r.n_dst; k++) sst_db_close(r.dst[k]);
  pthread_mutex_destroy(&r.mu);
  free(wk);
  free(th);
  free(started);
  free(r.src);
  free(r.dst);
  free(r.vt);
  free(ids);
  st->seconds = sr_now() - t0;
  return rc;
}
