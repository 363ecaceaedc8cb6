/* The resharding engine (see reshard.h). */
#include "tools/reshard.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/kv.h"
#include "storage/sst.h"

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
    } else {
      continue;
    }
    return;
  }
}

void reshard_stats_free(reshard_stats *st) {
  if (!st) return;
  free(st->tables);
  memset(st, 0, sizeof *st);
}

/* ---- progress ---- */

typedef struct {
  int on;
  double t0, last;
  uint64_t total, rows, bytes;
} progress;

static void fmt_count(char *b, size_t n, double v) {
  if (v >= 1e6) snprintf(b, n, "%.2fM", v / 1e6);
  else if (v >= 1e4) snprintf(b, n, "%.1fk", v / 1e3);
  else snprintf(b, n, "%.0f", v);
}

static void progress_show(progress *p, int final) {
  if (!p->on) return;
  double now = sr_now();
  if (!final && now - p->last < 0.25) return;
  p->last = now;
  double el = now - p->t0, rate = el > 0 ? (double)p->rows / el : 0;
  char r[32], t[32], rs[32], eta[32];
  fmt_count(r, sizeof r, (double)p->rows);
  fmt_count(t, sizeof t, (double)(p->total > p->rows ? p->total : p->rows));
  fmt_count(rs, sizeof rs, rate);
  double left = rate > 0 && p->total > p->rows ? (double)(p->total - p->rows) / rate : 0;
  snprintf(eta, sizeof eta, "%.0f s", left);
  int pct = p->total ? (int)(100.0 * (double)p->rows / (double)p->total) : 0;
  if (pct > 100) pct = 100;
  fprintf(stderr, "\rreshard: %s/%s rows (%3d%%), %.1f MB, %s rows/s, ETA %s   ", r, t, pct,
          (double)p->bytes / 1e6, rs, final ? "0 s" : eta);
  if (final) fprintf(stderr, "\n");
  fflush(stderr);
}

/* ---- the run ---- */

typedef struct {
  const reshard_opts *o;
  int n_src, n_dst;
  sst_db **src;  /* [n_src] */
  sst_db **dst;  /* [n_dst] */
  sst_writer **w;   /* [n_dst] the current table's writer per target (NULL: none open) */
  uint64_t *w_bytes; /* [n_dst] bytes in the open file */
  char ***files;    /* [n_dst] the current table's finished files */
  int *n_files, *cap_files;
  uint64_t seq;     /* file name counter */
  const uint32_t *ids; /* [dst n_tables] table ids in the new plan's order */
  progress pg;
  int corrupt_left;
} run;

static int add_file(run *r, int k, const char *path) {
  if (r->n_files[k] == r->cap_files[k]) {
    int cap = r->cap_files[k] ? 2 * r->cap_files[k] : 4;
    char **np = realloc(r->files[k], (size_t)cap * sizeof *np);
    if (!np) return SR_ENOMEM;
    r->files[k] = np;
    r->cap_files[k] = cap;
  }
  if (!(r->files[k][r->n_files[k]] = strdup(path))) return SR_ENOMEM;
  r->n_files[k]++;
  return 0;
}

static int close_writer(run *r, int k, char *err, size_t errlen) {
  if (!r->w[k]) return 0;
  int rc = sst_writer_finish(r->w[k], NULL, err, errlen);
  sst_writer_destroy(r->w[k]);
  r->w[k] = NULL;
  r->w_bytes[k] = 0;
  return rc;
}

static void file_name(run *r, uint32_t tid, int k, char *buf, size_t len) {
  snprintf(buf, len, "%s/t%u-s%d-%06llu.sst", r->o->work_dir, tid, k, (unsigned long long)r->seq++);
}

/* Append one row to target k's file for table tid (opened on first use,
 * rolled over past sst_max_bytes). */
static int put_row(run *r, int k, uint32_t tid, uint64_t key, const char *val, size_t len,
                   char *err, size_t errlen) {
  uint64_t maxb = r->o->sst_max_bytes ? r->o->sst_max_bytes : (256ull << 20);
  int rc;
  if (r->w[k] && r->w_bytes[k] >= maxb) {
    if ((rc = close_writer(r, k, err, errlen))) return rc;
  }
  if (!r->w[k]) {
    char path[4300];
    file_name(r, tid, k, path, sizeof path);
    if ((rc = sst_writer_open(path, &r->w[k], err, errlen))) return rc;
    if ((rc = add_file(r, k, path))) {
      sr_fmt(err, errlen, "out of memory");
      return rc;
    }
  }
  if (r->corrupt_left) { /* test hook: what reaches the file differs from what was read */
    r->corrupt_left = 0;
    if (r->o->corrupt == 2) return 0;
    char tmp[STORE_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
    memcpy(tmp, val, len);
    tmp[len - 1] ^= 0x01;
    rc = sst_writer_put(r->w[k], key, tmp, len, err, errlen);
  } else {
    rc = sst_writer_put(r->w[k], key, val, len, err, errlen);
  }
  r->w_bytes[k] += 8 + len;
  return rc;
}

/* Check an encoded row's header against the table's dim and state. */
static int row_ok(const char *v, size_t len, int dim, int slen) {
  const unsigned char *p = (const unsigned char *)v;
  return len == store_row_size(dim, slen) && p[0] == 'S' && p[1] == 'R' &&
         p[2] == STORE_ROW_VERSION && (p[4] | (p[5] << 8)) == dim && (p[6] | (p[7] << 8)) == slen;
}

/* Run job(r, k, ...) for k = 0..n-1 on up to 16 threads at a time. Each
 * target's database work is mostly waiting for fsync (RocksDB syncs the
 * MANIFEST, the OPTIONS file and the folder for every family created and
 * every file ingested), so targets proceed side by side. The first failure
 * (lowest k) is reported. */
typedef struct {
  run *r;
  int k, ti, rc;
  char err[1024];
  int (*job)(run *r, int k, int ti, char *err, size_t errlen);
} par_job;

static void *par_main(void *arg) {
  par_job *j = arg;
  j->rc = j->job(j->r, j->k, j->ti, j->err, sizeof j->err);
  return NULL;
}

static int par_targets(run *r, int ti, int (*job)(run *, int, int, char *, size_t), char *err,
                       size_t errlen) {
  enum { PAR = 16 };
  par_job jobs[PAR];
  pthread_t th[PAR];
  int rc = 0;
  for (int base = 0; base < r->n_dst; base += PAR) {
    int m = r->n_dst - base < PAR ? r->n_dst - base : PAR;
    int started[PAR];
    for (int i = 0; i < m; i++) {
      jobs[i] = (par_job){.r = r, .k = base + i, .ti = ti, .job = job};
      jobs[i].err[0] = 0;
      started[i] = pthread_create(&th[i], NULL, par_main, &jobs[i]) == 0;
      if (!started[i]) par_main(&jobs[i]); /* no thread: do it here */
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

/* Finish target k's file of table ti and ingest its files. */
static int ingest_job(run *r, int k, int ti, char *err, size_t errlen) {
  int rc = close_writer(r, k, err, errlen);
  if (!rc && r->n_files[k])
    rc = sst_db_ingest(r->dst[k], ti, (const char *const *)r->files[k], r->n_files[k], err, errlen);
  for (int f = 0; f < r->n_files[k]; f++) {
    unlink(r->files[k][f]); /* moved when ingested; gone either way */
    free(r->files[k][f]);
  }
  r->n_files[k] = 0;
  return rc;
}

static int create_job(run *r, int k, int ti, char *err, size_t errlen) {
  (void)ti;
  const emb_plan *dst = r->o->dst;
  char path[4200];
  snprintf(path, sizeof path, "%s/shard-%d", r->o->out_dir, k);
  return sst_db_create(path, dst->n_tables, r->ids, r->o->work_dir, &r->dst[k], err, errlen);
}

/* Move table ti (new plan index) from every source to its targets. */
static int move_table(run *r, int ti, reshard_table *rt, reshard_stats *st, char *err,
                      size_t errlen) {
  const emb_plan *dst = r->o->dst;
  const emb_table *tb = &dst->tables[ti];
  uint32_t tid = tb->table_id;
  int dim = tb->dim, slen = emb_optim_state_len(&tb->optim, dim);
  int rc = 0;
  sst_iter **it = calloc((size_t)r->n_src, sizeof *it);
  if (!it) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  for (int s = 0; s < r->n_src; s++) {
    int cf = sst_db_find(r->src[s], tid);
    if (cf < 0) {
      sr_fmt(err, errlen, "%s/shard-%d: has no column family for table_id %u (%s)", r->o->src_dir, s,
             tid, tb->name);
      rc = SR_EFORMAT;
      goto out;
    }
    if (!(it[s] = sst_iter_create(r->src[s], cf))) {
      sr_fmt(err, errlen, "out of memory");
      rc = SR_ENOMEM;
      goto out;
    }
  }
  uint64_t n = 0;
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
        sr_fmt(err, errlen, "table_id %u (%s): row %llu is in both %s/shard-%d and shard-%d", tid,
               tb->name, (unsigned long long)k, r->o->src_dir, best, s);
        rc = SR_EFORMAT;
        goto out;
      }
    }
    if (best < 0) break;
    size_t len;
    const char *v = sst_iter_value(it[best], &len);
    if (!row_ok(v, len, dim, slen)) {
      sr_fmt(err, errlen, "%s/shard-%d: table_id %u (%s) row %llu: a value of %zu bytes is not a row "
             "of dim %d with %d state floats (expected %zu bytes)", r->o->src_dir, best, tid, tb->name,
             (unsigned long long)bk, len, dim, slen, store_row_size(dim, slen));
      rc = SR_EFORMAT;
      goto out;
    }
    if (tb->rows != EMB_ROWS_UNBOUNDED && bk >= tb->rows) {
      sr_fmt(err, errlen, "%s/shard-%d: table_id %u (%s): row id %llu is past the table's %llu rows",
             r->o->src_dir, best, tid, tb->name, (unsigned long long)bk,
             (unsigned long long)tb->rows);
      rc = SR_EFORMAT;
      goto out;
    }
    uint64_t h = reshard_row_hash(tid, bk, v, len);
    rt->rows_in++;
    rt->sum_in += h;
    rt->xor_in ^= h;
    int k = emb_plan_shard_of(dst, ti, bk);
    if ((rc = put_row(r, k, tid, bk, v, len, err, errlen))) goto out;
    st->rows++;
    st->bytes += 8 + len;
    r->pg.rows++;
    r->pg.bytes += 8 + len;
    if ((++n & 0xffff) == 0) progress_show(&r->pg, 0);
    sst_iter_next(it[best]);
  }
  for (int s = 0; s < r->n_src; s++) {
    char e2[512];
    if ((rc = sst_iter_status(it[s], e2, sizeof e2))) {
      sr_fmt(err, errlen, "%s/shard-%d: table_id %u (%s): %s", r->o->src_dir, s, tid, tb->name, e2);
      goto out;
    }
  }
  /* Finish and ingest this table's files into each target. */
  rc = par_targets(r, ti, ingest_job, err, errlen);
out:
  for (int s = 0; s < r->n_src; s++) sst_iter_destroy(it[s]);
  free(it);
  return rc;
}

/* Re-read target k: count and hash every table's rows, check their routing. */
static int verify_target(run *r, int k, reshard_stats *st, char *err, size_t errlen) {
  const emb_plan *dst = r->o->dst;
  char path[4200];
  snprintf(path, sizeof path, "%s/shard-%d", r->o->out_dir, k);
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
    reshard_table *rt = &st->tables[ti];
    int cf = sst_db_find(db, rt->table_id);
    if (cf < 0) {
      sr_fmt(err, errlen, "%s: no column family for table_id %u (%s)", path, rt->table_id, rt->name);
      rc = SR_EFORMAT;
      break;
    }
    sst_iter *it = sst_iter_create(db, cf);
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
  char p[4300];
  snprintf(p, sizeof p, "%s/LOCK", path);
  unlink(p);
}

int reshard_run(const reshard_opts *o, reshard_stats *st, char *err, size_t errlen) {
  memset(st, 0, sizeof *st);
  double t0 = sr_now();
  const emb_plan *dst = o->dst;
  run r;
  memset(&r, 0, sizeof r);
  r.o = o;
  r.n_src = o->src->n_shards;
  r.n_dst = dst->n_shards;
  r.corrupt_left = o->corrupt == 1 || o->corrupt == 2;
  int rc = 0;
  uint32_t *ids = malloc((size_t)dst->n_tables * sizeof *ids);
  st->tables = calloc((size_t)dst->n_tables, sizeof *st->tables);
  r.src = calloc((size_t)r.n_src, sizeof *r.src);
  r.dst = calloc((size_t)r.n_dst, sizeof *r.dst);
  r.w = calloc((size_t)r.n_dst, sizeof *r.w);
  r.w_bytes = calloc((size_t)r.n_dst, sizeof *r.w_bytes);
  r.files = calloc((size_t)r.n_dst, sizeof *r.files);
  r.n_files = calloc((size_t)r.n_dst, sizeof *r.n_files);
  r.cap_files = calloc((size_t)r.n_dst, sizeof *r.cap_files);
  if (!ids || !st->tables || !r.src || !r.dst || !r.w || !r.w_bytes || !r.files || !r.n_files ||
      !r.cap_files) {
    sr_fmt(err, errlen, "out of memory");
    rc = SR_ENOMEM;
    goto out;
  }
  st->n_tables = dst->n_tables;
  for (int t = 0; t < dst->n_tables; t++) {
    ids[t] = dst->tables[t].table_id;
    st->tables[t].table_id = ids[t];
    snprintf(st->tables[t].name, sizeof st->tables[t].name, "%s", dst->tables[t].name);
  }
  /* Sources: every table family they hold must be a table of the plan
   * (rows of another table would be lost). */
  for (int s = 0; s < r.n_src; s++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/shard-%d", o->src_dir, s);
    if ((rc = sst_db_open_read(path, o->work_dir, &r.src[s], err, errlen))) goto out;
    for (int i = 0; i < sst_db_n_tables(r.src[s]); i++) {
      uint32_t tid = sst_db_table_id(r.src[s], i);
      if (emb_plan_table_index(dst, tid) < 0) {
        sr_fmt(err, errlen, "%s: holds table_id %u, which the plan does not have", path, tid);
        rc = SR_EFORMAT;
        goto out;
      }
      r.pg.total += sst_db_estimate_rows(r.src[s], i);
    }
  }
  r.ids = ids;
  if ((rc = par_targets(&r, 0, create_job, err, errlen))) goto out;
  r.pg.on = o->progress;
  r.pg.t0 = r.pg.last = sr_now();
  for (int ti = 0; ti < dst->n_tables; ti++)
    if ((rc = move_table(&r, ti, &st->tables[ti], st, err, errlen))) goto out;
  progress_show(&r.pg, 1);
  for (int k = 0; k < r.n_dst; k++) {
    sst_db_close(r.dst[k]);
    r.dst[k] = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/shard-%d", o->out_dir, k);
    tidy_db_dir(path);
  }
  if (o->verify) {
    double tv = sr_now();
    for (int k = 0; k < r.n_dst && !rc; k++) rc = verify_target(&r, k, st, err, errlen);
    st->verify_seconds = sr_now() - tv;
    if (rc) goto out;
    for (int ti = 0; ti < dst->n_tables; ti++) {
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
  }
out:
  if (rc && r.pg.on && r.pg.rows) fprintf(stderr, "\n");
  for (int k = 0; r.w && k < r.n_dst; k++) {
    sst_writer_destroy(r.w[k]);
    for (int f = 0; r.files && f < r.n_files[k]; f++) free(r.files[k][f]);
    if (r.files) free(r.files[k]);
  }
  for (int s = 0; r.src && s < r.n_src; s++) sst_db_close(r.src[s]);
  for (int k = 0; r.dst && k < r.n_dst; k++) sst_db_close(r.dst[k]);
  free(r.src);
  free(r.dst);
  free(r.w);
  free(r.w_bytes);
  free(r.files);
  free(r.n_files);
  free(r.cap_files);
  free(ids);
  st->seconds = sr_now() - t0;
  return rc;
}
