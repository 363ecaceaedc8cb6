/* SST files, bulk ingestion and full scans (see sst.h). */
#include "storage/sst.h"

#include <errno.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"
#include "common/status.h"
#include "storage/rocks_impl.h"

/* ---- SST files ---- */

struct sst_writer {
  rocksdb_envoptions_t *env;
  rocksdb_options_t *opts; /* its own (NULL: the caller's) */
  rocksdb_sstfilewriter_t *w;
  char path[SR_PATH_MAX];
  uint64_t rows, last;
};

int sst__writer_open_with(const char *path, const rocksdb_options_t *opts, sst_writer **out,
                          char *err, size_t errlen) {
  *out = NULL;
  int rc = 0;
  char *e = NULL;
  sst_writer *w = calloc(1, sizeof *w);
  if (!w) return SR_ENOMEM;
  if ((rc = sr_path_err(w->path, sizeof w->path, err, errlen, "%s", path))) {
    free(w); /* nothing made */
    return rc;
  }
  w->env = rocksdb_envoptions_create();
  if (!opts) {
    opts = w->opts = rocksdb_options_create();
    /* As kv.c's tables: no compression (float rows do not compress). */
    rocksdb_options_set_compression(w->opts, rocksdb_no_compression);
  }
  w->w = rocksdb_sstfilewriter_create(w->env, opts);
  rocksdb_sstfilewriter_open(w->w, path, &e);
  RCHECK(e, path);
out:
  if (rc) {
    sst_writer_destroy(w);
    return rc;
  }
  *out = w;
  return 0;
}

int sst_writer_open(const char *path, sst_writer **out, char *err, size_t errlen) {
  return sst__writer_open_with(path, NULL, out, err, errlen);
}

int sst_writer_put(sst_writer *w, uint64_t key, const void *val, size_t len, char *err,
                   size_t errlen) {
  if (w->rows && key <= w->last) {
    sr_fmt(err, errlen, "%s: row id %llu after %llu: keys of an SST file must ascend", w->path,
           (unsigned long long)key, (unsigned long long)w->last);
    return SR_EINVAL;
  }
  int rc = 0;
  char *e = NULL, k[8];
  put_be64(k, key);
  rocksdb_sstfilewriter_put(w->w, k, 8, val, len, &e);
  RCHECK(e, w->path);
  w->rows++;
  w->last = key;
out:
  return rc;
}

uint64_t sst_writer_rows(const sst_writer *w) { return w->rows; }

int sst_writer_finish(sst_writer *w, uint64_t *bytes, char *err, size_t errlen) {
  if (!w->rows) {
    sr_fmt(err, errlen, "%s: an SST file needs at least one row", w->path);
    return SR_ESTATE;
  }
  int rc = 0;
  char *e = NULL;
  rocksdb_sstfilewriter_finish(w->w, &e);
  RCHECK(e, w->path);
  if (bytes) rocksdb_sstfilewriter_file_size(w->w, bytes);
out:
  return rc;
}

void sst_writer_destroy(sst_writer *w) {
  if (!w) return;
  if (w->w) rocksdb_sstfilewriter_destroy(w->w);
  if (w->opts) rocksdb_options_destroy(w->opts);
  if (w->env) rocksdb_envoptions_destroy(w->env);
  free(w);
}

/* ---- databases ---- */

struct sst_db {
  rocksdb_t *db;
  rocksdb_options_t *opts;
  rocksdb_ingestexternalfileoptions_t *io;
  int n;                               /* t<id> families */
  uint32_t *ids;                       /* [n] */
  rocksdb_column_family_handle_t **cf; /* [n + 1]: default last */
  char path[SR_PATH_MAX];
};

static rocksdb_options_t *base_options(void) {
  rocksdb_options_t *o = rocksdb_options_create();
  rocksdb_options_set_compression(o, rocksdb_no_compression);
  rocksdb_options_set_info_log_level(o, 3); /* errors only */
  rocksdb_options_set_keep_log_file_num(o, 1);
  rocksdb_options_set_max_open_files(o, 256);
  /* A bulk-filled database is compacted by nobody: ingested files land in
   * the bottom level when they do not overlap, and the store that opens it
   * later compacts as it likes. */
  rocksdb_options_set_disable_auto_compactions(o, 1);
  /* RocksDB opens a family's table files with up to 16 threads, started
   * per family at every open: with one family per table that is hundreds of
   * thread starts per database for a handful of files (measured: seconds
   * for a 26-table checkpoint). One pass does not need it. */
  rocksdb_options_set_max_file_opening_threads(o, 1);
  return o;
}

/* A handle for the database at path, not opened: 0 and *out, SR_ENOMEM, or
 * SR_ERANGE (path too long to keep, message in err). */
static int db_new(const char *path, sst_db **out, char *err, size_t errlen) {
  sst_db *d = calloc(1, sizeof *d);
  *out = NULL;
  if (!d) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  int rc = sr_path_err(d->path, sizeof d->path, err, errlen, "%s", path);
  if (rc) {
    free(d);
    return rc;
  }
  d->opts = base_options();
  *out = d;
  return 0;
}

static int parse_cf_name(const char *name, uint32_t *id) {
  if (name[0] != 't' || !name[1]) return -1;
  char *end;
  unsigned long long v = strtoull(name + 1, &end, 10);
  if (*end || v > 0xffffffffULL) return -1;
  *id = (uint32_t)v;
  return 0;
}

/* Open d->path with the families "default" + names[0..m-1]. */
static int db_open(sst_db *d, int m, char **names, int read_only, char *err, size_t errlen) {
  int rc = 0;
  char *e = NULL;
  const char **all = calloc((size_t)m + 1, sizeof *all);
  const rocksdb_options_t **cfo = calloc((size_t)m + 1, sizeof *cfo);
  d->cf = calloc((size_t)m + 1, sizeof *d->cf);
  if (!all || !cfo || !d->cf) {
    rc = SR_ENOMEM;
    sr_fmt(err, errlen, "%s: out of memory", d->path);
    goto out;
  }
  for (int i = 0; i < m; i++) all[i] = names[i];
  all[m] = "default";
  for (int i = 0; i <= m; i++) cfo[i] = d->opts;
  if (read_only)
    d->db = rocksdb_open_for_read_only_column_families(d->opts, d->path, m + 1, all, cfo, d->cf, 0,
                                                       &e);
  else
    d->db = rocksdb_open_column_families(d->opts, d->path, m + 1, all, cfo, d->cf, &e);
  RCHECK(e, d->path);
out:
  free(all);
  free(cfo);
  return rc;
}

int sst_db_create(const char *path, int n, const uint32_t *table_ids, const char *log_dir,
                  sst_db **out, char *err, size_t errlen) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) == 0) {
    sr_fmt(err, errlen, "%s: already exists", path);
    return SR_EEXISTS;
  }
  sst_db *d;
  int rc = db_new(path, &d, err, errlen);
  if (rc) return rc;
  char **names = calloc((size_t)n + 1, sizeof *names);
  if (!names || !(d->ids = malloc(((size_t)n + 1) * sizeof *d->ids))) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    rc = SR_ENOMEM;
    goto out;
  }
  d->n = n;
  for (int i = 0; i < n; i++) {
    d->ids[i] = table_ids[i];
    if (!(names[i] = malloc(16))) {
      rc = SR_ENOMEM;
      goto out;
    }
    snprintf(names[i], 16, "t%u", table_ids[i]);
  }
  if (log_dir) rocksdb_options_set_db_log_dir(d->opts, log_dir);
  rocksdb_options_set_create_if_missing(d->opts, 1);
  rocksdb_options_set_create_missing_column_families(d->opts, 1);
  rocksdb_options_set_error_if_exists(d->opts, 1);
  d->io = rocksdb_ingestexternalfileoptions_create();
  rocksdb_ingestexternalfileoptions_set_move_files(d->io, 1);
  rocksdb_ingestexternalfileoptions_set_allow_global_seqno(d->io, 1);
  rocksdb_ingestexternalfileoptions_set_allow_blocking_flush(d->io, 1);
  rc = db_open(d, n, names, 0, err, errlen);
out:
  if (names)
    for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc) {
    sst_db_close(d);
    return rc;
  }
  *out = d;
  return 0;
}

int sst_db_open_read(const char *path, const char *log_dir, sst_db **out, char *err,
                     size_t errlen) {
  *out = NULL;
  struct stat st;
  char cur[SR_PATH_MAX];
  int rc = sr_path_err(cur, sizeof cur, err, errlen, "%s/CURRENT", path);
  if (rc) return rc;
  if (stat(cur, &st) != 0) {
    sr_fmt(err, errlen, "%s: not a RocksDB database (no CURRENT file)", path);
    return SR_ENOTFOUND;
  }
  sst_db *d;
  if ((rc = db_new(path, &d, err, errlen))) return rc;
  if (log_dir) rocksdb_options_set_db_log_dir(d->opts, log_dir);
  char *e = NULL;
  size_t cnt = 0;
  char **names = rocksdb_list_column_families(d->opts, path, &cnt, &e);
  RCHECK(e, path);
  /* The t<id> families first (in the database's order), default dropped. */
  char **mine = calloc(cnt + 1, sizeof *mine);
  d->ids = malloc((cnt + 1) * sizeof *d->ids);
  if (!mine || !d->ids) {
    free(mine);
    rc = SR_ENOMEM;
    sr_fmt(err, errlen, "%s: out of memory", path);
    goto out;
  }
  for (size_t i = 0; i < cnt; i++) {
    uint32_t id;
    if (!parse_cf_name(names[i], &id)) {
      mine[d->n] = names[i];
      d->ids[d->n++] = id;
    } else if (strcmp(names[i], "default")) {
      sr_fmt(err, errlen, "%s: column family '%s' is not a table (t<table_id>)", path, names[i]);
      rc = SR_EFORMAT;
    }
  }
  if (!rc) rc = db_open(d, d->n, mine, 1, err, errlen);
  free(mine);
out:
  if (names) rocksdb_list_column_families_destroy(names, cnt);
  if (rc) {
    sst_db_close(d);
    return rc;
  }
  *out = d;
  return 0;
}

void sst_db_close(sst_db *d) {
  if (!d) return;
  if (d->cf)
    for (int i = 0; i <= d->n; i++)
      if (d->cf[i]) rocksdb_column_family_handle_destroy(d->cf[i]);
  if (d->db) rocksdb_close(d->db);
  if (d->io) rocksdb_ingestexternalfileoptions_destroy(d->io);
  if (d->opts) rocksdb_options_destroy(d->opts);
  free(d->cf);
  free(d->ids);
  free(d);
}

int sst_db_n_tables(const sst_db *d) { return d->n; }
uint32_t sst_db_table_id(const sst_db *d, int i) { return d->ids[i]; }
int sst_db_find(const sst_db *d, uint32_t table_id) {
  for (int i = 0; i < d->n; i++)
    if (d->ids[i] == table_id) return i;
  return -1;
}

uint64_t sst_db_estimate_rows(sst_db *d, int i) {
  uint64_t v = 0;
  if (rocksdb_property_int_cf(d->db, d->cf[i], "rocksdb.estimate-num-keys", &v)) return 0;
  return v;
}

int sst_db_ingest(sst_db *d, int i, const char *const *files, int n, char *err, size_t errlen) {
  if (!d->io) {
    sr_fmt(err, errlen, "%s: opened for reading, not for ingestion", d->path);
    return SR_ESTATE;
  }
  if (n <= 0) return 0;
  int rc = 0;
  char *e = NULL;
  rocksdb_ingest_external_file_cf(d->db, d->cf[i], files, (size_t)n, d->io, &e);
  RCHECK(e, d->path);
out:
  return rc;
}

/* ---- full scans ---- */

struct sst_iter {
  rocksdb_iterator_t *it;
  rocksdb_readoptions_t *ro;
  int bad_key; /* a key of another length was met */
  size_t bad_len;
};

sst_iter *sst_iter_create(sst_db *d, int i, int verify) {
  sst_iter *it = calloc(1, sizeof *it);
  if (!it) return NULL;
  it->ro = rocksdb_readoptions_create();
  rocksdb_readoptions_set_verify_checksums(it->ro, (unsigned char)(verify != 0));
  rocksdb_readoptions_set_fill_cache(it->ro, 0); /* one pass: caching blocks is wasted work */
  rocksdb_readoptions_set_readahead_size(it->ro, 2u << 20);
  it->it = rocksdb_create_iterator_cf(d->db, it->ro, d->cf[i]);
  rocksdb_iter_seek_to_first(it->it);
  return it;
}

int sst_iter_valid(sst_iter *it) {
  if (it->bad_key || !rocksdb_iter_valid(it->it)) return 0;
  size_t kl;
  rocksdb_iter_key(it->it, &kl);
  if (kl != 8) {
    it->bad_key = 1;
    it->bad_len = kl;
    return 0;
  }
  return 1;
}

uint64_t sst_iter_key(const sst_iter *it) {
  size_t kl;
  return get_be64(rocksdb_iter_key(it->it, &kl));
}

const char *sst_iter_value(const sst_iter *it, size_t *len) {
  return rocksdb_iter_value(it->it, len);
}

void sst_iter_next(sst_iter *it) { rocksdb_iter_next(it->it); }

int sst_iter_status(sst_iter *it, char *err, size_t errlen) {
  int rc = 0;
  char *e = NULL;
  rocksdb_iter_get_error(it->it, &e);
  RCHECK(e, "scan");
  if (it->bad_key) {
    sr_fmt(err, errlen, "scan: a key of %zu bytes (row ids are 8)", it->bad_len);
    return SR_EFORMAT;
  }
out:
  return rc;
}

void sst_iter_destroy(sst_iter *it) {
  if (!it) return;
  rocksdb_iter_destroy(it->it);
  rocksdb_readoptions_destroy(it->ro);
  free(it);
}
