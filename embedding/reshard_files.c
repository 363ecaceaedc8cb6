/* Resharding the in-memory store's table files (see reshard.h,
 * reshard_run_files). The files are embedding/table_file.h's; their names
 * and folders storage/ckpt_dir.h's. Rows are hashed as the RocksDB path
 * hashes them (the row encoded in its table's precision, kv_row_encode_w:
 * a 16-bit table's weights as their 16-bit values), so a table's checksum
 * is the same whichever layout holds it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "embedding/precision.h"
#include "embedding/reshard.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

/* A source file being merged: its reader and its current record. */
typedef struct {
  emb_tabfile_reader *r;
  uint64_t id;       /* the current record's row id */
  const float *vals; /* its floats (the reader's), NULL once the file is done */
} tf_source;

/* Source folders: the local layout's shards/ itself, or the in-memory
 * servers' folders, one per server (every shard of the source plan must
 * have one). */
static int list_sources(const reshard_opts *o, char ***out, int *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  int S = o->src->n_shards, rc = 0;
  if (o->layout == CKPT_SHARDS_TABLES) {
    char **paths = malloc(sizeof *paths);
    if (!paths || !(paths[0] = strdup(o->src_dir))) {
      free(paths);
      return SR_ENOMEM;
    }
    *out = paths;
    *n = 1;
    return 0;
  }
  char (*folder)[256] = calloc((size_t)S, sizeof *folder);
  char **paths = calloc((size_t)S, sizeof *paths);
  if (!folder || !paths) rc = SR_ENOMEM;
  if (!rc) rc = ckpt_dir_server_folders(o->src_dir, S, folder, err, errlen);
  for (int k = 0; k < S && !rc; k++) {
    if (!folder[k][0]) {
      sr_fmt(err, errlen, "%s: no server folder holds shard %d (the plan has %d shards)",
             o->src_dir, k, S);
      rc = SR_ENOTFOUND;
      break;
    }
    int seen = 0;
    for (int j = 0; j < k && !seen; j++) seen = !strcmp(folder[j], folder[k]);
    if (seen) continue;
    char p[SR_PATH_MAX];
    if ((rc = sr_path_err(p, sizeof p, err, errlen, "%s/%s", o->src_dir, folder[k]))) break;
    if (!(paths[*n] = strdup(p))) rc = SR_ENOMEM;
    else (*n)++;
  }
  free(folder);
  if (rc == SR_ENOMEM) sr_fmt(err, errlen, "out of memory");
  *out = paths;
  return rc;
}

/* Target k's file of table tid: out_dir/table-<tid>.bin in the local layout,
 * out_dir/shard-K/table-<tid>.bin for servers. */
static int out_path(char *p, size_t n, const reshard_opts *o, int local, int k, uint32_t tid) {
  char dir[4400];
  if (!local && ckpt_dir_shard_path(o->out_dir, k, dir, sizeof dir)) return SR_ERANGE;
  return ckpt_dir_table_file(local ? o->out_dir : dir, tid, p, n);
}

/* One run over the table files. */
typedef struct {
  const reshard_opts *o;
  int local, n_dst, n_src;
  char mfp[EMB_FP_HEX], src_mfp[EMB_FP_HEX]; /* the new plan's model, the source's */
  char **src;              /* [n_src] source folders */
  tf_source *rd;           /* [n_src] */
  emb_tabfile_writer **wr; /* [n_dst] */
  reshard_stats *st;
} frun;

/* Move src to its next record (vals NULL at the end, once the file's
 * trailer is checked). */
static int advance(tf_source *src, char *err, size_t errlen) {
  int rc = emb_tabfile_next(src->r, &src->id, &src->vals, err, errlen);
  if (rc == 0) src->vals = NULL;
  return rc < 0 ? rc : 0;
}

/* Write one record (row id id, floats vals[n]) to w, through the row hook. */
static int put_record(const frun *f, emb_tabfile_writer *w, uint32_t tid, uint64_t id,
                      const float *vals, size_t n, char *err, size_t errlen) {
  float tmp[EMB_MAX_DIM * 2 + 1];
  if (f->o->row_hook) {
    memcpy(tmp, vals, n * sizeof *tmp);
    if (f->o->row_hook(f->o->row_hook_ctx, tid, id, (unsigned char *)tmp, n * sizeof *tmp))
      return 0; /* dropped */
    vals = tmp;
  }
  return emb_tabfile_put(w, id, vals, err, errlen);
}

/* The source holding the smallest current row id, -1 when every source is
 * done; a row id held by two sources is refused. */
static int next_source(const frun *f, const emb_table *tb, int *best, char *err, size_t errlen) {
  *best = -1;
  for (int s = 0; s < f->n_src; s++) {
    const tf_source *c = &f->rd[s];
    if (!c->vals) continue;
    if (*best < 0 || c->id < f->rd[*best].id) {
      *best = s;
    } else if (c->id == f->rd[*best].id) {
      sr_fmt(err, errlen, "table_id %u (%s): row %llu is in both %s and %s", tb->table_id,
             tb->name, (unsigned long long)c->id, emb_tabfile_path(f->rd[*best].r),
             emb_tabfile_path(c->r));
      return SR_EFORMAT;
    }
  }
  return 0;
}

/* Table tb (of the new plan) as the source plan has it: the same but,
 * under reshard --precision, its precision. */
static const emb_table *src_table(const frun *f, const emb_table *tb) {
  int i = emb_plan_table_index(f->o->src, tb->table_id);
  return i < 0 ? tb : &f->o->src->tables[i];
}

/* Open table ti's source files and create its target files. */
static int open_table(frun *f, const emb_table *tb, char *err, size_t errlen) {
  int rc = 0;
  for (int s = 0; s < f->n_src && !rc; s++) {
    char p[4500];
    if ((rc = ckpt_dir_table_file(f->src[s], tb->table_id, p, sizeof p))) break;
    rc = emb_tabfile_open(p, src_table(f, tb), f->src_mfp, &f->rd[s].r, err, errlen);
    if (!rc) rc = advance(&f->rd[s], err, errlen);
  }
  for (int k = 0; k < f->n_dst && !rc; k++) {
    char p[4500];
    if ((rc = out_path(p, sizeof p, f->o, f->local, k, tb->table_id))) break;
    rc = emb_tabfile_create(p, tb, f->mfp, EMB_TABFILE_COUNT_LATER, &f->wr[k], err, errlen);
  }
  if (rc == SR_ERANGE) sr_fmt(err, errlen, "%s: path too long", f->o->out_dir);
  return rc;
}

/* Close table ti's sources; commit its targets (abort them on failure). */
static int close_table(frun *f, int rc, char *err, size_t errlen) {
  for (int s = 0; s < f->n_src; s++) {
    emb_tabfile_close(f->rd[s].r);
    memset(&f->rd[s], 0, sizeof f->rd[s]);
  }
  for (int k = 0; k < f->n_dst; k++) {
    if (rc) emb_tabfile_abort(f->wr[k]);
    else if (f->wr[k]) rc = emb_tabfile_commit(f->wr[k], err, errlen);
    f->wr[k] = NULL;
  }
  return rc;
}

/* Merge table ti's source files by row id into its target files. */
static int move_table_files(frun *f, int ti, char *err, size_t errlen) {
  const emb_plan *dst = f->o->dst;
  const emb_table *tb = &dst->tables[ti];
  reshard_table *rt = &f->st->tables[ti];
  int slen = emb_optim_state_len(&tb->optim, tb->dim), best;
  const int prec = (int)tb->precision;
  size_t len = kv_row_size_w(tb->dim, slen, prec), nv = (size_t)(tb->dim + slen);
  unsigned char enc[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
  rt->table_id = tb->table_id;
  snprintf(rt->name, sizeof rt->name, "%s", tb->name);
  int rc = open_table(f, tb, err, errlen);
  const int convert = src_table(f, tb)->precision != tb->precision; /* reshard --precision */
  float row[EMB_MAX_DIM * 2 + 1];
  while (!rc && !(rc = next_source(f, tb, &best, err, errlen)) && best >= 0) {
    tf_source *c = &f->rd[best];
    if (convert) { /* the values the new file holds: each weight rounded to nearest */
      emb_values_round_nearest(tb->precision, c->vals, row, (size_t)tb->dim);
      memcpy(row + tb->dim, c->vals + tb->dim, (size_t)slen * sizeof *row);
      c->vals = row;
    }
    kv_row_encode_w(tb->dim, slen, prec, c->vals, enc);
    uint64_t h = reshard_row_hash(tb->table_id, c->id, enc, len);
    rt->rows_in++;
    rt->sum_in += h;
    rt->xor_in ^= h;
    emb_tabfile_writer *w = f->wr[f->local ? 0 : emb_plan_shard_of(dst, ti, c->id)];
    if ((rc = put_record(f, w, tb->table_id, c->id, c->vals, nv, err, errlen))) break;
    f->st->rows++;
    f->st->bytes += 8 + len;
    rc = advance(c, err, errlen);
  }
  return close_table(f, rc, err, errlen);
}

/* What verify_record needs. */
typedef struct {
  const frun *f;
  int ti, k, slen;
  size_t len;
  reshard_table *rt;
  char *err; /* the caller's: a row on the wrong shard */
  size_t errlen;
  int misrouted;
} vctx;

/* One record of a written file: its routing, its count and hashes. */
static int verify_record(void *ctx, uint64_t id, const float *vals) {
  vctx *v = ctx;
  const emb_plan *dst = v->f->o->dst;
  const emb_table *tb = &dst->tables[v->ti];
  unsigned char enc[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
  if (!v->f->local && emb_plan_shard_of(dst, v->ti, id) != v->k) {
    sr_fmt(v->err, v->errlen, "verification: table_id %u (%s): row %llu was written to shard %d, "
           "the plan puts it on shard %d", tb->table_id, tb->name, (unsigned long long)id, v->k,
           emb_plan_shard_of(dst, v->ti, id));
    v->misrouted = 1;
    return SR_ECHECKSUM;
  }
  kv_row_encode_w(tb->dim, v->slen, (int)tb->precision, vals, enc);
  uint64_t h = reshard_row_hash(tb->table_id, id, enc, v->len);
  v->rt->rows_out++;
  v->rt->sum_out += h;
  v->rt->xor_out ^= h;
  return 0;
}

/* Re-read target k's file of table ti: its rows' count and hashes into
 * rt, their routing, and the file's SHA-256 trailer. */
static int verify_file(frun *f, int ti, int k, char *err, size_t errlen) {
  const emb_table *tb = &f->o->dst->tables[ti];
  int slen = emb_optim_state_len(&tb->optim, tb->dim);
  vctx v = {.f = f, .ti = ti, .k = k, .slen = slen,
            .len = kv_row_size_w(tb->dim, slen, (int)tb->precision),
            .rt = &f->st->tables[ti], .err = err, .errlen = errlen};
  char p[4500], e2[1024];
  if (out_path(p, sizeof p, f->o, f->local, k, tb->table_id)) {
    sr_fmt(err, errlen, "%s: path too long", f->o->out_dir);
    return SR_ERANGE;
  }
  int rc = emb_tabfile_read(p, tb, f->mfp, verify_record, &v, e2, sizeof e2);
  if (rc && !v.misrouted) sr_fmt(err, errlen, "verification: %s", e2);
  return rc;
}

/* The sources, the readers and writers, the servers' target folders. */
static int frun_init(frun *f, const reshard_opts *o, reshard_stats *st, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  f->o = o;
  f->st = st;
  f->local = o->layout == CKPT_SHARDS_TABLES;
  f->n_dst = f->local ? 1 : o->dst->n_shards;
  int rc;
  if ((rc = emb_plan_model_fingerprint(o->dst, f->mfp)) ||
      (rc = emb_plan_model_fingerprint(o->src, f->src_mfp))) {
    sr_fmt(err, errlen, "out of memory");
    return rc;
  }
  if ((rc = list_sources(o, &f->src, &f->n_src, err, errlen))) return rc;
  st->tables = calloc((size_t)o->dst->n_tables, sizeof *st->tables);
  f->rd = calloc((size_t)(f->n_src ? f->n_src : 1), sizeof *f->rd);
  f->wr = calloc((size_t)f->n_dst, sizeof *f->wr);
  if (!st->tables || !f->rd || !f->wr) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  if (!f->n_src) {
    sr_fmt(err, errlen, "%s: no table files", o->src_dir);
    return SR_ENOTFOUND;
  }
  st->n_tables = o->dst->n_tables;
  for (int k = 0; k < f->n_dst && !f->local; k++) {
    char p[4400];
    if (ckpt_dir_shard_path(o->out_dir, k, p, sizeof p)) {
      sr_fmt(err, errlen, "%s: path too long", o->out_dir);
      return SR_ERANGE;
    }
    if (mkdir(p, 0777) != 0) {
      sr_fmt(err, errlen, "%s: cannot create: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  return 0;
}

static void frun_free(frun *f) {
  for (int s = 0; f->rd && s < f->n_src; s++) emb_tabfile_close(f->rd[s].r);
  for (int k = 0; f->wr && k < f->n_dst; k++) emb_tabfile_abort(f->wr[k]);
  free(f->rd);
  free(f->wr);
  for (int s = 0; f->src && s < f->n_src; s++) free(f->src[s]);
  free(f->src);
}

int reshard_run_files(const reshard_opts *o, reshard_stats *st, char *err, size_t errlen) {
  memset(st, 0, sizeof *st);
  double t0 = sr_now();
  frun f;
  int rc = frun_init(&f, o, st, err, errlen);
  for (int ti = 0; ti < o->dst->n_tables && !rc; ti++) rc = move_table_files(&f, ti, err, errlen);
  if (!rc && o->verify) {
    /* Re-read what was written: counts, hashes, routing, each file's SHA-256. */
    double tv = sr_now();
    for (int ti = 0; ti < o->dst->n_tables && !rc; ti++)
      for (int k = 0; k < f.n_dst && !rc; k++) rc = verify_file(&f, ti, k, err, errlen);
    st->verify_seconds = sr_now() - tv;
    if (!rc) rc = reshard__compare(st, err, errlen);
  }
  frun_free(&f);
  st->seconds = sr_now() - t0;
  return rc;
}
