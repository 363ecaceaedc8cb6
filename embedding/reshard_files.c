/* Resharding the in-memory store's table files (see reshard.h,
 * reshard_run_files).
 *
 * The file format is embedding/store_local.c's checkpoint format:
 *   256-byte header: "SREMBTAB", u32 version 1, u32 header bytes 256,
 *   u32 table_id, u32 dim, u32 state floats, u32 optimizer kind, u64 rows,
 *   u64 record bytes (8 + 4 (dim + state)), the model fingerprint (64 hex
 *   characters), zeros; then rows records (u64 row id, ascending, then the
 *   floats), then the SHA-256 of everything before it.
 * Rows are hashed as the RocksDB path hashes them (kv_row_encode of the
 * floats), so a table's checksum is the same whichever layout holds it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/kv.h"
#include "embedding/reshard.h"

#define TF_MAGIC "SREMBTAB"
#define TF_VERSION 1u
#define TF_HEADER 256u
#define TF_CHUNK 1024

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* A table file read in chunks. */
typedef struct {
  FILE *f;
  char path[4600];
  uint64_t n, next;   /* records in the file, records consumed */
  size_t rec;
  unsigned char *buf; /* [TF_CHUNK][rec] */
  size_t have, at;    /* records in buf, position in buf */
} tf_reader;

static int tf_open(tf_reader *r, const char *path, const emb_table *tb, int slen, const char *mfp,
                   char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  snprintf(r->path, sizeof r->path, "%s", path);
  unsigned char hdr[TF_HEADER];
  struct stat st;
  if (!(r->f = fopen(path, "rb"))) {
    sr_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return errno == ENOENT ? SR_ENOTFOUND : SR_EIO;
  }
  if (fstat(fileno(r->f), &st) != 0 || (size_t)st.st_size < TF_HEADER + 32 ||
      fread(hdr, 1, TF_HEADER, r->f) != TF_HEADER || memcmp(hdr, TF_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec embedding table file", path);
    return SR_EFORMAT;
  }
  r->n = get64(hdr + 32);
  r->rec = (size_t)get64(hdr + 40);
  if (get32(hdr + 8) != TF_VERSION || get32(hdr + 16) != tb->table_id ||
      get32(hdr + 20) != (uint32_t)tb->dim || get32(hdr + 24) != (uint32_t)slen ||
      r->rec != 8 + 4 * (size_t)(tb->dim + slen) || memcmp(hdr + 48, mfp, 64) ||
      (uint64_t)st.st_size != TF_HEADER + r->n * r->rec + 32) {
    sr_fmt(err, errlen, "%s: not table_id %u (%s) of this model (dim %d, %d state floats) in format "
           "%u, or torn", path, tb->table_id, tb->name, tb->dim, slen, TF_VERSION);
    return SR_EFORMAT;
  }
  if (!(r->buf = malloc(TF_CHUNK * r->rec))) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  return 0;
}

/* The current record (NULL at the end); *key its row id. */
static const unsigned char *tf_peek(tf_reader *r, uint64_t *key, int *io_err) {
  if (r->at == r->have) {
    if (r->next == r->n) return NULL;
    size_t m = r->n - r->next < TF_CHUNK ? (size_t)(r->n - r->next) : TF_CHUNK;
    if (fread(r->buf, r->rec, m, r->f) != m) {
      *io_err = 1;
      return NULL;
    }
    r->have = m;
    r->at = 0;
    r->next += m;
  }
  const unsigned char *p = r->buf + r->at * r->rec;
  *key = get64(p);
  return p;
}

static void tf_close(tf_reader *r) {
  if (r->f) fclose(r->f);
  free(r->buf);
  memset(r, 0, sizeof *r);
}

/* A table file being written: header rewritten with the count at the end,
 * then the SHA-256 of header and records appended. */
typedef struct {
  FILE *f;
  char path[4600];
  unsigned char hdr[TF_HEADER];
  uint64_t n, last;
} tf_writer;

static int tf_create(tf_writer *w, const char *path, const emb_table *tb, int slen, const char *mfp,
                     char *err, size_t errlen) {
  memset(w, 0, sizeof *w);
  snprintf(w->path, sizeof w->path, "%s", path);
  memcpy(w->hdr, TF_MAGIC, 8);
  put32(w->hdr + 8, TF_VERSION);
  put32(w->hdr + 12, TF_HEADER);
  put32(w->hdr + 16, tb->table_id);
  put32(w->hdr + 20, (uint32_t)tb->dim);
  put32(w->hdr + 24, (uint32_t)slen);
  put32(w->hdr + 28, (uint32_t)tb->optim.kind);
  put64(w->hdr + 40, 8 + 4 * (uint64_t)(tb->dim + slen));
  memcpy(w->hdr + 48, mfp, 64);
  if (!(w->f = fopen(path, "w+b")) || fwrite(w->hdr, 1, TF_HEADER, w->f) != TF_HEADER) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return SR_EIO;
  }
  return 0;
}

static int tf_finish(tf_writer *w, char *err, size_t errlen) {
  put64(w->hdr + 32, w->n);
  int bad = fflush(w->f) != 0 || fseek(w->f, 0, SEEK_SET) != 0 ||
            fwrite(w->hdr, 1, TF_HEADER, w->f) != TF_HEADER || fflush(w->f) != 0 ||
            fseek(w->f, 0, SEEK_SET) != 0;
  sr_sha256_ctx md = {0};
  unsigned char *buf = malloc(1 << 20), dig[32];
  if (!bad && buf && !sr_sha256_init(&md)) {
    size_t got;
    while ((got = fread(buf, 1, 1 << 20, w->f)) > 0) sr_sha256_update(&md, buf, got);
    bad |= ferror(w->f) != 0;
    bad |= sr_sha256_final(&md, dig) != 0;
    bad |= fseek(w->f, 0, SEEK_END) != 0 || fwrite(dig, 1, 32, w->f) != 32 || fflush(w->f) != 0 ||
           fsync(fileno(w->f)) != 0;
  } else {
    bad = 1;
  }
  sr_sha256_abort(&md);
  free(buf);
  bad |= fclose(w->f) != 0;
  w->f = NULL;
  if (bad) {
    sr_fmt(err, errlen, "%s: cannot write: %s", w->path, strerror(errno));
    return SR_EIO;
  }
  return 0;
}

/* Source folders: the local layout's shards/ itself, or every shard-K...
 * folder of in-memory servers, in name order. */
static int list_sources(const reshard_opts *o, char ***out, int *n) {
  *out = NULL;
  *n = 0;
  char **paths = NULL;
  int np = 0;
  if (o->layout == RESHARD_TABLE_FILES_LOCAL) {
    paths = malloc(sizeof *paths);
    if (!paths || !(paths[0] = strdup(o->src_dir))) {
      free(paths);
      return SR_ENOMEM;
    }
    *out = paths;
    *n = 1;
    return 0;
  }
  char **files;
  int rc = sr_list_files(o->src_dir, &files, &np);
  if (rc) return rc;
  /* Folders holding table-<first id>.bin. */
  char want[64];
  snprintf(want, sizeof want, "table-%u.bin", o->src->tables[0].table_id);
  paths = calloc((size_t)np + 1, sizeof *paths);
  for (int i = 0; paths && i < np; i++) {
    char *slash = strrchr(files[i], '/');
    if (!slash || strcmp(slash + 1, want) || strncmp(files[i], "shard-", 6)) continue;
    char p[4400];
    snprintf(p, sizeof p, "%s/%.*s", o->src_dir, (int)(slash - files[i]), files[i]);
    if (!(paths[*n] = strdup(p))) break;
    (*n)++;
  }
  sr_paths_free(files, np);
  if (!paths) return SR_ENOMEM;
  *out = paths;
  return 0;
}

/* Target k's file of table tid: out_dir/table-<tid>.bin in the local layout,
 * out_dir/shard-K/table-<tid>.bin for servers. */
static void out_path(char *p, size_t n, const reshard_opts *o, int local, int k, uint32_t tid) {
  if (local) snprintf(p, n, "%s/table-%u.bin", o->out_dir, tid);
  else snprintf(p, n, "%s/shard-%d/table-%u.bin", o->out_dir, k, tid);
}

/* One run over the table files. */
typedef struct {
  const reshard_opts *o;
  int local, n_dst, n_src;
  char mfp[EMB_FP_HEX];
  char **src;     /* [n_src] source folders */
  tf_reader *rd;  /* [n_src] */
  tf_writer *wr;  /* [n_dst] */
  reshard_stats *st;
} frun;

/* Write one record (row id bk, bytes bp[rec]) to w, through the row hook. */
static int put_record(const frun *f, tf_writer *w, uint32_t tid, uint64_t bk,
                      const unsigned char *bp, size_t rec, char *err, size_t errlen) {
  const unsigned char *wp = bp;
  unsigned char tmp[8 + 4 * (EMB_MAX_DIM * 2 + 1)];
  if (f->o->row_hook) {
    memcpy(tmp, bp, rec);
    if (f->o->row_hook(f->o->row_hook_ctx, tid, bk, tmp + 8, rec - 8)) return 0; /* dropped */
    wp = tmp;
  }
  if (fwrite(wp, 1, rec, w->f) != rec) {
    sr_fmt(err, errlen, "%s: cannot write: %s", w->path, strerror(errno));
    return SR_EIO;
  }
  w->n++;
  w->last = bk;
  return 0;
}

/* The source holding the smallest next row id: its index into *best (-1:
 * every source is done), the record into *bp, its id into *bk. */
static int next_source(frun *f, const emb_table *tb, int *best, uint64_t *bk,
                       const unsigned char **bp, char *err, size_t errlen) {
  int io = 0;
  uint64_t key;
  *best = -1;
  for (int s = 0; s < f->n_src; s++) {
    const unsigned char *p = tf_peek(&f->rd[s], &key, &io);
    if (!p) continue;
    if (*best < 0 || key < *bk) {
      *best = s;
      *bk = key;
      *bp = p;
    } else if (key == *bk) {
      sr_fmt(err, errlen, "table_id %u (%s): row %llu is in both %s and %s", tb->table_id,
             tb->name, (unsigned long long)key, f->rd[*best].path, f->rd[s].path);
      return SR_EFORMAT;
    }
  }
  if (io) {
    sr_fmt(err, errlen, "table_id %u: a source table file: read error", tb->table_id);
    return SR_EIO;
  }
  return 0;
}

/* Merge table ti's source files by row id into its target files. */
static int move_table_files(frun *f, int ti, char *err, size_t errlen) {
  const emb_plan *dst = f->o->dst;
  const emb_table *tb = &dst->tables[ti];
  reshard_table *rt = &f->st->tables[ti];
  int slen = emb_optim_state_len(&tb->optim, tb->dim), rc = 0;
  size_t len = kv_row_size(tb->dim, slen);
  unsigned char enc[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
  rt->table_id = tb->table_id;
  snprintf(rt->name, sizeof rt->name, "%s", tb->name);
  for (int s = 0; s < f->n_src && !rc; s++) {
    char p[4500];
    snprintf(p, sizeof p, "%s/table-%u.bin", f->src[s], tb->table_id);
    rc = tf_open(&f->rd[s], p, tb, slen, f->mfp, err, errlen);
  }
  for (int k = 0; k < f->n_dst && !rc; k++) {
    char p[4500];
    out_path(p, sizeof p, f->o, f->local, k, tb->table_id);
    rc = tf_create(&f->wr[k], p, tb, slen, f->mfp, err, errlen);
  }
  while (!rc) {
    int best;
    uint64_t bk = 0;
    const unsigned char *bp = NULL;
    if ((rc = next_source(f, tb, &best, &bk, &bp, err, errlen)) || best < 0) break;
    if (tb->rows != EMB_ROWS_UNBOUNDED && bk >= tb->rows) {
      sr_fmt(err, errlen, "%s: row id %llu is past the table's %llu rows", f->rd[best].path,
             (unsigned long long)bk, (unsigned long long)tb->rows);
      rc = SR_EFORMAT;
      break;
    }
    kv_row_encode(tb->dim, slen, (const float *)(const void *)(bp + 8), enc);
    uint64_t h = reshard_row_hash(tb->table_id, bk, enc, len);
    rt->rows_in++;
    rt->sum_in += h;
    rt->xor_in ^= h;
    tf_writer *w = &f->wr[f->local ? 0 : emb_plan_shard_of(dst, ti, bk)];
    if (w->n && bk <= w->last) {
      sr_fmt(err, errlen, "%s: row id %llu after %llu (a source is out of order)", f->rd[best].path,
             (unsigned long long)bk, (unsigned long long)w->last);
      rc = SR_EFORMAT;
      break;
    }
    if ((rc = put_record(f, w, tb->table_id, bk, bp, f->rd[best].rec, err, errlen))) break;
    f->st->rows++;
    f->st->bytes += 8 + len;
    f->rd[best].at++;
  }
  for (int s = 0; s < f->n_src; s++) tf_close(&f->rd[s]);
  for (int k = 0; k < f->n_dst; k++) {
    if (!f->wr[k].f) continue;
    if (rc) {
      fclose(f->wr[k].f);
      f->wr[k].f = NULL;
    } else {
      rc = tf_finish(&f->wr[k], err, errlen);
    }
  }
  return rc;
}

/* Re-read target k's file of table ti: its rows' count and hashes into
 * rt, their routing, and the file's SHA-256 trailer. */
static int verify_file(frun *f, int ti, int k, char *err, size_t errlen) {
  const emb_plan *dst = f->o->dst;
  const emb_table *tb = &dst->tables[ti];
  reshard_table *rt = &f->st->tables[ti];
  int slen = emb_optim_state_len(&tb->optim, tb->dim), rc = 0;
  size_t len = kv_row_size(tb->dim, slen);
  unsigned char enc[KV_ROW_HEADER + 4 * (EMB_MAX_DIM * 2 + 1)];
  char p[4500];
  out_path(p, sizeof p, f->o, f->local, k, tb->table_id);
  tf_reader r;
  if ((rc = tf_open(&r, p, tb, slen, f->mfp, err, errlen))) {
    tf_close(&r);
    return rc;
  }
  sr_sha256_ctx md = {0};
  unsigned char hdr[TF_HEADER], dig[32], want[32];
  fseek(r.f, 0, SEEK_SET);
  if (fread(hdr, 1, TF_HEADER, r.f) != TF_HEADER) {
    sr_fmt(err, errlen, "%s: cannot read", p);
    rc = SR_EIO;
  } else if ((rc = sr_sha256_init(&md)) || (rc = sr_sha256_update(&md, hdr, TF_HEADER))) {
    sr_fmt(err, errlen, "%s: SHA-256: %s", p, sr_strerror(rc));
  }
  uint64_t key;
  int io = 0;
  const unsigned char *q;
  while (!rc && (q = tf_peek(&r, &key, &io))) {
    if (r.at == 0) sr_sha256_update(&md, r.buf, r.have * r.rec);
    if (!f->local && emb_plan_shard_of(dst, ti, key) != k) {
      sr_fmt(err, errlen, "verification: table_id %u (%s): row %llu was written to shard %d, the "
             "plan puts it on shard %d", tb->table_id, tb->name, (unsigned long long)key, k,
             emb_plan_shard_of(dst, ti, key));
      rc = SR_ECHECKSUM;
      break;
    }
    kv_row_encode(tb->dim, slen, (const float *)(const void *)(q + 8), enc);
    uint64_t h = reshard_row_hash(tb->table_id, key, enc, len);
    rt->rows_out++;
    rt->sum_out += h;
    rt->xor_out ^= h;
    r.at++;
  }
  if (!rc && io) {
    sr_fmt(err, errlen, "%s: read error", p);
    rc = SR_EIO;
  }
  if (!rc) {
    if ((rc = sr_sha256_final(&md, dig))) {
      sr_fmt(err, errlen, "%s: SHA-256: %s", p, sr_strerror(rc));
    } else if (fread(want, 1, 32, r.f) != 32 || memcmp(dig, want, 32)) {
      sr_fmt(err, errlen, "verification: %s: checksum mismatch", p);
      rc = SR_ECHECKSUM;
    }
  }
  sr_sha256_abort(&md);
  tf_close(&r);
  return rc;
}

/* The sources, the readers and writers, the servers' target folders. */
static int frun_init(frun *f, const reshard_opts *o, reshard_stats *st, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  f->o = o;
  f->st = st;
  f->local = o->layout == RESHARD_TABLE_FILES_LOCAL;
  f->n_dst = f->local ? 1 : o->dst->n_shards;
  int rc;
  if ((rc = emb_plan_model_fingerprint(o->dst, f->mfp))) {
    sr_fmt(err, errlen, "out of memory");
    return rc;
  }
  if ((rc = list_sources(o, &f->src, &f->n_src))) {
    sr_fmt(err, errlen, "%s: cannot list", o->src_dir);
    return rc;
  }
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
    snprintf(p, sizeof p, "%s/shard-%d", o->out_dir, k);
    if (mkdir(p, 0777) != 0) {
      sr_fmt(err, errlen, "%s: cannot create: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  return 0;
}

static void frun_free(frun *f) {
  for (int s = 0; f->rd && s < f->n_src; s++) tf_close(&f->rd[s]);
  for (int k = 0; f->wr && k < f->n_dst; k++)
    if (f->wr[k].f) fclose(f->wr[k].f);
  free(f->rd);
  free(f->wr);
  for (int s = 0; s < f->n_src; s++) free(f->src[s]);
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
