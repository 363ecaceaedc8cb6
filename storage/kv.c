/* The RocksDB cold tier (see kv.h).
 *
 * Compression, measured with `shardrec bench store --compression lz4|none`
 * on random float rows (dim 16 + adagrad state): lz4 saves ~0% of the bytes
 * (random mantissas do not compress) and costs read time, so the default is
 * none. */
#include "storage/kv.h"

#include <dirent.h>
#include <fcntl.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/half.h"
#include "common/status.h"
#include "storage/rocks_impl.h"

/* One MultiGet's scratch and pinned values (kv_reader_get_cf). */
struct kv_reader {
  size_t cap;
  char *mkeys;       /* [cap][8] */
  const char **mkp;  /* [cap] */
  size_t *mkl;       /* [cap] */
  char **merr;       /* [cap] */
  rocksdb_pinnableslice_t **pins; /* [cap] values of the last batched MultiGet */
  size_t n_pins;
};

struct kv_writes {
  rocksdb_writebatch_t *wb;
};

struct kv_db {
  rocksdb_t *db;
  rocksdb_options_t *opts;
  rocksdb_block_based_table_options_t *bbo;
  rocksdb_cache_t *cache;
  rocksdb_readoptions_t *ro;
  rocksdb_writeoptions_t *wo_nowal; /* kv_writes: no write-ahead log */
  int n;                                /* families asked for */
  int n_all;                            /* families opened (default + asked + others) */
  uint32_t *ids;                        /* [n] */
  rocksdb_column_family_handle_t **cf;  /* [n] the asked-for ones */
  rocksdb_column_family_handle_t **all; /* [n_all] */
  atomic_uint ingests;                  /* kv_ingest files begun: their names */
  char path[SR_PATH_MAX];
};


static int parse_cf_name(const char *name, uint32_t *id) {
  if (name[0] != 't' || !name[1]) return -1;
  char *end;
  unsigned long long v = strtoull(name + 1, &end, 10);
  if (*end || v > 0xffffffffULL) return -1;
  *id = (uint32_t)v;
  return 0;
}

int kv_list_tables(const char *path, uint32_t **ids, int *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  rocksdb_options_t *o = rocksdb_options_create();
  char *e = NULL;
  size_t cnt = 0;
  char **names = rocksdb_list_column_families(o, path, &cnt, &e);
  rocksdb_options_destroy(o);
  if (e) {
    sr_fmt(err, errlen, "%s: not a RocksDB database: %s", path, e);
    rocksdb_free(e);
    if (names) rocksdb_list_column_families_destroy(names, cnt);
    return SR_EIO;
  }
  uint32_t *out = malloc((cnt ? cnt : 1) * sizeof *out);
  int m = 0;
  for (size_t i = 0; out && i < cnt; i++) {
    uint32_t id;
    if (!parse_cf_name(names[i], &id)) out[m++] = id;
  }
  rocksdb_list_column_families_destroy(names, cnt);
  if (!out) return SR_ENOMEM;
  *ids = out;
  *n = m;
  return 0;
}

/* The options of d (tuned, see kv.h). */
static void set_options(kv_db *d, const kv_opts *o) {
  size_t wbuf = o && o->write_buffer_bytes ? o->write_buffer_bytes : (16u << 20);
  int lz4 = o && o->compression == KV_COMPRESSION_LZ4;
  d->opts = rocksdb_options_create();
  d->bbo = rocksdb_block_based_options_create();
  /* Index and filter blocks stay with their table reader (RocksDB's default,
   * cache_index_and_filter_blocks off): a read probes them with no cache
   * lookup. Uncompressed blocks are read in place, so a block cache would
   * hold nothing and cost a lookup a read: only lz4 tables, whose data
   * blocks are decompressed into it, have one. */
  if (lz4) {
    d->cache = rocksdb_cache_create_lru(o->block_cache_bytes ? o->block_cache_bytes : (32u << 20));
    rocksdb_block_based_options_set_block_cache(d->bbo, d->cache);
  } else {
    rocksdb_block_based_options_set_no_block_cache(d->bbo, 1);
  }
  rocksdb_block_based_options_set_filter_policy(d->bbo, rocksdb_filterpolicy_create_bloom_full(10));
  rocksdb_block_based_options_set_block_size(d->bbo, 4096);
  /* a hash index in each data block beside the binary search: a point
   * lookup finds its key in the block without comparing its way to it */
  rocksdb_block_based_options_set_data_block_index_type(
      d->bbo, rocksdb_block_based_table_data_block_index_type_binary_search_and_hash);
  rocksdb_block_based_options_set_data_block_hash_ratio(d->bbo, 0.75);
  rocksdb_block_based_options_set_checksum(d->bbo, 4); /* XXH3 (new files; any type reads) */
  rocksdb_options_set_block_based_table_factory(d->opts, d->bbo);
  rocksdb_options_set_create_if_missing(d->opts, !(o && o->read_only));
  rocksdb_options_set_create_missing_column_families(d->opts, !(o && o->read_only));
  rocksdb_options_set_db_write_buffer_size(d->opts, wbuf); /* the write buffer manager */
  rocksdb_options_set_write_buffer_size(d->opts, wbuf / 4 > (1u << 20) ? wbuf / 4 : (1u << 20));
  rocksdb_options_set_max_write_buffer_number(d->opts, 2);
  rocksdb_options_set_compression(d->opts, lz4 ? rocksdb_lz4_compression : rocksdb_no_compression);
  rocksdb_options_set_max_open_files(d->opts, -1); /* every table reader open: no table cache */
  rocksdb_options_set_allow_mmap_reads(d->opts, 1); /* blocks read in place, no pread and copy */
  /* a whole-key bloom filter per memtable: a lookup of a row the memtables
   * do not hold (most) skips their skip lists */
  rocksdb_options_set_memtable_whole_key_filtering(d->opts, 1);
  rocksdb_options_set_memtable_prefix_bloom_size_ratio(d->opts, 0.1);
  /* Compact a column family's L0 files into L1 at 8 of them, not 4: the
   * shard store overwrites rows all over the key range, so each L0 file
   * overlaps the whole of L1 and each L0->L1 compaction rewrites it; fewer
   * of them wrote 35% fewer bytes in training (README.md), for about 4 more
   * L0 filters a read probes. */
  rocksdb_options_set_level0_file_num_compaction_trigger(d->opts, 8);
  rocksdb_options_set_max_background_jobs(d->opts, 2);
  rocksdb_options_set_info_log_level(d->opts, 3); /* errors only */
  rocksdb_options_set_keep_log_file_num(d->opts, 2);
}

/* The column families to open: "default", every asked table, and any others
 * the database already has (have[n_have]). *names gets the names (pointers
 * into one block, *block: free both), *m their count. 0 or SR_ENOMEM. */
#define KV_CF_NAME 16 /* "t" and a u32 in decimal */
static int cf_names(int n, const uint32_t *table_ids, const uint32_t *have, int n_have,
                    char ***names, char **block, int *m) {
  int cap = 1 + n + n_have;
  *names = calloc((size_t)cap, sizeof **names);
  *block = calloc((size_t)cap, KV_CF_NAME);
  if (!*names || !*block) return SR_ENOMEM;
  int k = 0;
  for (int i = 0; i < cap; i++) (*names)[i] = *block + (size_t)i * KV_CF_NAME;
  snprintf((*names)[k++], KV_CF_NAME, "default");
  for (int i = 0; i < n; i++) snprintf((*names)[k++], KV_CF_NAME, "t%u", table_ids[i]);
  for (int i = 0; i < n_have; i++) {
    int dup = 0;
    for (int j = 0; j < n; j++) dup |= table_ids[j] == have[i];
    if (!dup) snprintf((*names)[k++], KV_CF_NAME, "t%u", have[i]);
  }
  *m = k;
  return 0;
}

/* The files of ingestions a crash cut short (kv_ingest: ingest-N.sst in
 * the database's folder; RocksDB's own files are named otherwise). */
static void ingest_leftovers_remove(const char *path) {
  DIR *dir = opendir(path);
  if (!dir) return;
  struct dirent *de;
  while ((de = readdir(dir))) {
    size_t l = strlen(de->d_name);
    if (strncmp(de->d_name, "ingest-", 7) || l < 11 || strcmp(de->d_name + l - 4, ".sst")) continue;
    char f[SR_PATH_MAX];
    if (snprintf(f, sizeof f, "%s/%s", path, de->d_name) < (int)sizeof f) unlink(f);
  }
  closedir(dir);
}

int kv_open(const char *path, int n, const uint32_t *table_ids, const kv_opts *o,
               kv_db **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = 0, m = 0;
  char *e = NULL, *block = NULL;
  char **names = NULL;
  uint32_t *have = NULL;
  const rocksdb_options_t **cfo = NULL;
  kv_db *d = calloc(1, sizeof *d);
  if (!d) goto oom;
  d->n = n;
  d->ids = malloc((size_t)(n ? n : 1) * sizeof *d->ids);
  d->cf = calloc((size_t)(n ? n : 1), sizeof *d->cf);
  if (!d->ids || !d->cf) goto oom;
  memcpy(d->ids, table_ids, (size_t)n * sizeof *d->ids);
  if ((rc = sr_path_err(d->path, sizeof d->path, err, errlen, "%s", path))) goto out;
  set_options(d, o);
  int n_have = 0;
  struct stat st;
  if (stat(path, &st) == 0) {
    char lerr[256];
    if ((rc = kv_list_tables(path, &have, &n_have, lerr, sizeof lerr)) == SR_ENOMEM) goto oom;
    if (rc) n_have = 0;
    rc = 0;
  } else if (o && o->read_only) {
    sr_fmt(err, errlen, "%s: no such database", path);
    rc = SR_ENOTFOUND;
    goto out;
  }
  if (cf_names(n, table_ids, have, n_have, &names, &block, &m)) goto oom;
  cfo = calloc((size_t)m, sizeof *cfo);
  d->all = calloc((size_t)m, sizeof *d->all);
  if (!cfo || !d->all) goto oom;
  for (int i = 0; i < m; i++) cfo[i] = d->opts;
  d->n_all = m;
  if (o && o->read_only)
    d->db = rocksdb_open_for_read_only_column_families(d->opts, path, m, (const char *const *)names,
                                                       cfo, d->all, 0, &e);
  else
    d->db = rocksdb_open_column_families(d->opts, path, m, (const char *const *)names, cfo,
                                         d->all, &e);
  if (e && o && o->read_only) {
    sr_fmt(err, errlen, "%s: cannot open: %s", path, e);
    rocksdb_free(e);
    rc = SR_EIO;
    goto out;
  }
  RCHECK(e, path);
  if (!(o && o->read_only)) ingest_leftovers_remove(path);
  for (int i = 0; i < n; i++) d->cf[i] = d->all[1 + i];
  d->ro = rocksdb_readoptions_create();
  rocksdb_readoptions_set_verify_checksums(d->ro, 1);
  d->wo_nowal = rocksdb_writeoptions_create();
  rocksdb_writeoptions_disable_WAL(d->wo_nowal, 1);
  goto out;
oom:
  sr_fmt(err, errlen, "%s: out of memory opening the database", path);
  rc = SR_ENOMEM;
out:
  free(have);
  free(block);
  free(names);
  free(cfo);
  if (rc) {
    kv_close(d);
    return rc;
  }
  *out = d;
  return 0;
}

void kv_close(kv_db *d) {
  if (!d) return;
  if (d->all)
    for (int i = 0; i < d->n_all; i++)
      if (d->all[i]) rocksdb_column_family_handle_destroy(d->all[i]);
  if (d->db) rocksdb_close(d->db);
  if (d->ro) rocksdb_readoptions_destroy(d->ro);
  if (d->wo_nowal) rocksdb_writeoptions_destroy(d->wo_nowal);
  if (d->opts) rocksdb_options_destroy(d->opts);
  if (d->bbo) rocksdb_block_based_options_destroy(d->bbo);
  if (d->cache) rocksdb_cache_destroy(d->cache);
  free(d->all);
  free(d->cf);
  free(d->ids);
  free(d);
}

int kv_cf_index(const kv_db *d, uint32_t table_id) {
  for (int i = 0; i < d->n; i++)
    if (d->ids[i] == table_id) return i;
  return -1;
}

kv_reader *kv_reader_create(void) { return calloc(1, sizeof(kv_reader)); }

void kv_reader_release(kv_reader *r) {
  for (size_t k = 0; k < r->n_pins; k++)
    if (r->pins[k]) {
      rocksdb_pinnableslice_destroy(r->pins[k]);
      r->pins[k] = NULL;
    }
  r->n_pins = 0;
}

void kv_reader_destroy(kv_reader *r) {
  if (!r) return;
  kv_reader_release(r);
  free(r->mkeys);
  free(r->mkp);
  free(r->mkl);
  free(r->merr);
  free(r->pins);
  free(r);
}

static int mg_reserve(kv_reader *r, size_t n) {
  if (n <= r->cap) return 0;
  size_t cap = r->cap ? r->cap : 256;
  while (cap < n) cap *= 2;
  kv_reader_release(r);
  free(r->mkeys);
  free(r->mkp);
  free(r->mkl);
  free(r->merr);
  free(r->pins);
  r->pins = calloc(cap, sizeof *r->pins);
  r->mkeys = malloc(cap * 8);
  r->mkp = malloc(cap * sizeof *r->mkp);
  r->mkl = malloc(cap * sizeof *r->mkl);
  r->merr = malloc(cap * sizeof *r->merr);
  if (!r->mkeys || !r->mkp || !r->mkl || !r->merr || !r->pins) {
    r->cap = 0;
    return SR_ENOMEM;
  }
  r->cap = cap;
  return 0;
}


/* MultiGet of n keys into r (sorted: the keys ascend, RocksDB need not sort them). */
static int reader_get(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                      unsigned char sorted, const char **vals, size_t *lens, char *err,
                      size_t errlen) {
  kv_reader_release(r);
  if (!n) return 0;
  if (mg_reserve(r, n)) {
    sr_fmt(err, errlen, "multiget: out of memory");
    return SR_ENOMEM;
  }
  for (size_t k = 0; k < n; k++) {
    put_be64(r->mkeys + 8 * k, keys[k]);
    r->mkp[k] = r->mkeys + 8 * k;
    r->mkl[k] = 8;
    r->merr[k] = NULL;
  }
  rocksdb_batched_multi_get_cf(d->db, d->ro, d->cf[cf], n, r->mkp, r->mkl, r->pins, r->merr,
                               sorted);
  r->n_pins = n;
  int rc = 0;
  for (size_t k = 0; k < n; k++) {
    if (r->merr[k]) {
      if (!rc) sr_fmt(err, errlen, "multiget: %s (%s:%d)", r->merr[k], __FILE__, __LINE__);
      rocksdb_free(r->merr[k]);
      rc = SR_EIO;
    }
    vals[k] = r->pins[k] ? rocksdb_pinnableslice_value(r->pins[k], &lens[k]) : NULL;
  }
  if (rc) kv_reader_release(r);
  return rc;
}

int kv_reader_get_cf(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                     const char **vals, size_t *lens, char *err, size_t errlen) {
  return reader_get(r, d, cf, n, keys, 0, vals, lens, err, errlen);
}

int kv_reader_get_sorted_cf(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                            const char **vals, size_t *lens, char *err, size_t errlen) {
  for (size_t k = 1; k < n; k++)
    if (keys[k] <= keys[k - 1]) {
      sr_fmt(err, errlen, "multiget: key %zu (%llu) does not ascend", k, (unsigned long long)keys[k]);
      return SR_EINVAL;
    }
  return reader_get(r, d, cf, n, keys, 1, vals, lens, err, errlen);
}


int kv_compact(kv_db *d, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (int i = 0; i < d->n_all; i++) rocksdb_compact_range_cf(d->db, d->all[i], NULL, 0, NULL, 0);
  return 0;
}


/* Write wb into d with options wo and clear it (nothing when empty). */
static int batch_write(kv_db *d, const rocksdb_writeoptions_t *wo, rocksdb_writebatch_t *wb,
                       char *err, size_t errlen) {
  int rc = 0;
  char *e = NULL;
  if (rocksdb_writebatch_count(wb) == 0) return 0;
  rocksdb_write(d->db, wo, wb, &e);
  rocksdb_writebatch_clear(wb);
  RCHECK(e, "write batch");
out:
  return rc;
}


kv_writes *kv_writes_create(void) {
  kv_writes *w = calloc(1, sizeof *w);
  if (w && !(w->wb = rocksdb_writebatch_create())) {
    free(w);
    w = NULL;
  }
  return w;
}

void kv_writes_destroy(kv_writes *w) {
  if (!w) return;
  rocksdb_writebatch_destroy(w->wb);
  free(w);
}

void kv_writes_put(kv_writes *w, kv_db *d, int cf, uint64_t key, const void *val, size_t len) {
  char k[8];
  put_be64(k, key);
  rocksdb_writebatch_put_cf(w->wb, d->cf[cf], k, 8, val, len);
}

void kv_writes_delete(kv_writes *w, kv_db *d, int cf, uint64_t key) {
  char k[8];
  put_be64(k, key);
  rocksdb_writebatch_delete_cf(w->wb, d->cf[cf], k, 8);
}

int kv_writes_commit(kv_writes *w, kv_db *d, char *err, size_t errlen) {
  return batch_write(d, d->wo_nowal, w->wb, err, errlen);
}

struct kv_ingest {
  rocksdb_ingestexternalfileoptions_t *io;
  sst_writer *w; /* between begin and commit */
  kv_db *d;
  int cf;
  char path[SR_PATH_MAX];
};

kv_ingest *kv_ingest_create(void) {
  kv_ingest *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  if (!(g->io = rocksdb_ingestexternalfileoptions_create())) {
    free(g);
    return NULL;
  }
  /* moved (hard-linked) into place; given a sequence number after every
   * write before it; a memtable that overlaps the file is flushed first */
  rocksdb_ingestexternalfileoptions_set_move_files(g->io, 1);
  rocksdb_ingestexternalfileoptions_set_allow_global_seqno(g->io, 1);
  rocksdb_ingestexternalfileoptions_set_allow_blocking_flush(g->io, 1);
  return g;
}

/* The file being written, if any, dropped (writer and file). */
static void ingest_abort(kv_ingest *g) {
  if (!g->w) return;
  sst_writer_destroy(g->w);
  g->w = NULL;
  if (g->path[0]) unlink(g->path);
  g->path[0] = 0;
}

void kv_ingest_destroy(kv_ingest *g) {
  if (!g) return;
  ingest_abort(g);
  rocksdb_ingestexternalfileoptions_destroy(g->io);
  free(g);
}

int kv_ingest_begin(kv_ingest *g, kv_db *d, int cf, char *err, size_t errlen) {
  ingest_abort(g);
  int rc = sr_path_err(g->path, sizeof g->path, err, errlen, "%s/ingest-%u.sst", d->path,
                       atomic_fetch_add(&d->ingests, 1u));
  if (rc) return rc;
  g->d = d;
  g->cf = cf;
  /* the database's options: its table format and bloom filters */
  if ((rc = sst__writer_open_with(g->path, d->opts, &g->w, err, errlen))) unlink(g->path);
  return rc;
}

/* Between begin and commit, or SR_ESTATE. */
static int ingest_open(const kv_ingest *g, char *err, size_t errlen) {
  if (g->w) return 0;
  sr_fmt(err, errlen, "ingest: no file begun (or it failed)");
  return SR_ESTATE;
}

int kv_ingest_put(kv_ingest *g, uint64_t key, const void *val, size_t len, char *err,
                  size_t errlen) {
  if (ingest_open(g, err, errlen)) return SR_ESTATE;
  int rc = sst_writer_put(g->w, key, val, len, err, errlen);
  if (rc) ingest_abort(g);
  return rc;
}

int kv_ingest_commit(kv_ingest *g, char *err, size_t errlen) {
  int rc = 0, fd = -1;
  char *e = NULL;
  if (ingest_open(g, err, errlen)) return SR_ESTATE;
  if (!sst_writer_rows(g->w)) { /* RocksDB refuses an empty file: nothing to ingest */
    ingest_abort(g);
    return 0;
  }
  if ((rc = sst_writer_finish(g->w, NULL, err, errlen))) goto out;
  /* RocksDB's SstFileWriter drops the file from the OS page cache as it
   * writes (its C API cannot say otherwise), where reads of these rows
   * would then go to the disk: asked back in once it is in place (the same
   * file: RocksDB links it under its own name). */
  fd = open(g->path, O_RDONLY);
  const char *files[1] = {g->path};
  rocksdb_ingest_external_file_cf(g->d->db, g->d->cf[g->cf], files, 1, g->io, &e);
  RCHECK(e, g->path);
  if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  g->path[0] = 0; /* RocksDB removed the name it was written under */
out:
  if (fd >= 0) close(fd);
  ingest_abort(g); /* the writer; the file, when the ingest failed */
  return rc;
}

int kv_flush(kv_db *d, char *err, size_t errlen) {
  int rc = 0;
  char *e = NULL;
  rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
  rocksdb_flushoptions_set_wait(fo, 1);
  for (int i = 0; i < d->n_all && !e; i++) rocksdb_flush_cf(d->db, fo, d->all[i], &e);
  rocksdb_flushoptions_destroy(fo);
  RCHECK(e, "flush");
out:
  return rc;
}

int kv_checkpoint(kv_db *d, const char *dir, char *err, size_t errlen) {
  int rc = kv_flush(d, err, errlen);
  if (rc) return rc;
  char *e = NULL;
  rocksdb_checkpoint_t *c = rocksdb_checkpoint_object_create(d->db, &e);
  RCHECK(e, dir);
  rocksdb_checkpoint_create(c, dir, 0, &e);
  rocksdb_checkpoint_object_destroy(c);
  RCHECK(e, dir);
out:
  return rc;
}

struct kv_iter {
  rocksdb_iterator_t *it;
};

kv_iter *kv_iter_create(kv_db *d, int cf) {
  kv_iter *it = malloc(sizeof *it);
  if (!it) return NULL;
  it->it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[cf]);
  rocksdb_iter_seek_to_first(it->it);
  return it;
}
int kv_iter_valid(kv_iter *it) {
  if (!rocksdb_iter_valid(it->it)) return 0;
  size_t kl;
  rocksdb_iter_key(it->it, &kl);
  return kl == 8;
}
uint64_t kv_iter_key(kv_iter *it) {
  size_t kl;
  return get_be64(rocksdb_iter_key(it->it, &kl));
}
const char *kv_iter_value(kv_iter *it, size_t *len) { return rocksdb_iter_value(it->it, len); }
void kv_iter_next(kv_iter *it) { rocksdb_iter_next(it->it); }
void kv_iter_seek(kv_iter *it, uint64_t key) {
  char k[8];
  put_be64(k, key);
  rocksdb_iter_seek(it->it, k, 8);
}
void kv_iter_destroy(kv_iter *it) {
  if (!it) return;
  rocksdb_iter_destroy(it->it);
  free(it);
}

/* Integer property name of column family cf, 0 when RocksDB has none. */
static uint64_t cf_property(kv_db *d, rocksdb_column_family_handle_t *cf, const char *name) {
  uint64_t v = 0;
  return rocksdb_property_int_cf(d->db, cf, name, &v) ? 0 : v;
}

uint64_t kv_property(kv_db *d, int cf, const char *name) {
  return cf_property(d, d->cf[cf], name);
}

/* ---- rows ---- */

void kv_row_encode(int dim, int slen, const float *row, unsigned char *out) {
  out[0] = 'S';
  out[1] = 'R';
  out[2] = KV_ROW_VERSION;
  out[3] = 0;
  out[4] = (unsigned char)(dim & 0xff);
  out[5] = (unsigned char)(dim >> 8);
  out[6] = (unsigned char)(slen & 0xff);
  out[7] = (unsigned char)(slen >> 8);
  memcpy(out + KV_ROW_HEADER, row, 4 * (size_t)(dim + slen));
}

int kv_row_decode(const void *val, size_t len, int dim, int slen, float *row, char *err,
                     size_t errlen) {
  const unsigned char *p = val;
  if (len < KV_ROW_HEADER || p[0] != 'S' || p[1] != 'R') {
    sr_fmt(err, errlen, "row value of %zu bytes is not a shardrec row (bad header)", len);
    return SR_EFORMAT;
  }
  if (p[2] != KV_ROW_VERSION) {
    sr_fmt(err, errlen, "row layout version %u is not supported (this build reads %u)", p[2],
           KV_ROW_VERSION);
    return SR_EVERSION;
  }
  int d = p[4] | (p[5] << 8), s = p[6] | (p[7] << 8);
  if (d != dim || s != slen) {
    sr_fmt(err, errlen, "row holds dim %d state %d, the plan wants dim %d state %d", d, s, dim, slen);
    return SR_EMISMATCH;
  }
  if (len != kv_row_size(dim, slen)) {
    sr_fmt(err, errlen, "row value is %zu bytes, expected %zu (torn)", len, kv_row_size(dim, slen));
    return SR_EFORMAT;
  }
  memcpy(row, p + KV_ROW_HEADER, 4 * (size_t)(dim + slen));
  return 0;
}

void kv_row_encode_w(int dim, int slen, int w, const float *row, unsigned char *out) {
  if (w == KV_W_FP32) {
    kv_row_encode(dim, slen, row, out);
    return;
  }
  out[0] = 'S';
  out[1] = 'R';
  out[2] = KV_ROW_VERSION_16;
  out[3] = (unsigned char)w;
  out[4] = (unsigned char)(dim & 0xff);
  out[5] = (unsigned char)(dim >> 8);
  out[6] = (unsigned char)(slen & 0xff);
  out[7] = (unsigned char)(slen >> 8);
  uint16_t h[64];
  for (int j = 0; j < dim; j += 64) { /* out may be unaligned for u16 */
    int m = dim - j < 64 ? dim - j : 64;
    if (w == KV_W_FP16) sr_f16_encode(row + j, h, (size_t)m, SR_HALF_AUTO);
    else sr_bf16_encode(row + j, h, (size_t)m);
    memcpy(out + KV_ROW_HEADER + 2 * (size_t)j, h, 2 * (size_t)m);
  }
  memcpy(out + KV_ROW_HEADER + 2 * (size_t)dim, row + dim, 4 * (size_t)slen);
}

int kv_row_check(const void *val, size_t len, int dim, int slen, int *w) {
  const unsigned char *p = val;
  if (len < KV_ROW_HEADER || p[0] != 'S' || p[1] != 'R') return 0;
  if ((p[4] | (p[5] << 8)) != dim || (p[6] | (p[7] << 8)) != slen) return 0;
  if (p[2] == KV_ROW_VERSION && p[3] == 0) *w = KV_W_FP32;
  else if (p[2] == KV_ROW_VERSION_16 && (p[3] == KV_W_FP16 || p[3] == KV_W_BF16)) *w = p[3];
  else return 0;
  return len == kv_row_size_w(dim, slen, *w);
}

int kv_row_decode_w(const void *val, size_t len, int dim, int slen, int w, float *row,
                    char *err, size_t errlen) {
  const unsigned char *p = val;
  if (len >= KV_ROW_HEADER && p[0] == 'S' && p[1] == 'R' && p[2] == KV_ROW_VERSION_16) {
    int d = p[4] | (p[5] << 8), s = p[6] | (p[7] << 8), rw = p[3];
    if (rw != KV_W_FP16 && rw != KV_W_BF16) {
      sr_fmt(err, errlen, "row layout version 2 with weights %u is not supported", rw);
      return SR_EVERSION;
    }
    if (d != dim || s != slen) {
      sr_fmt(err, errlen, "row holds dim %d state %d, the plan wants dim %d state %d", d, s, dim,
             slen);
      return SR_EMISMATCH;
    }
    if (len != kv_row_size_w(dim, slen, rw)) {
      sr_fmt(err, errlen, "row value is %zu bytes, expected %zu (torn)", len,
             kv_row_size_w(dim, slen, rw));
      return SR_EFORMAT;
    }
    uint16_t h[64];
    for (int j = 0; j < dim; j += 64) { /* the values may be unaligned in val */
      int m = dim - j < 64 ? dim - j : 64;
      memcpy(h, p + KV_ROW_HEADER + 2 * (size_t)j, 2 * (size_t)m);
      if (rw == KV_W_FP16) sr_f16_decode(h, row + j, (size_t)m, SR_HALF_AUTO);
      else sr_bf16_decode(h, row + j, (size_t)m);
    }
    memcpy(row + dim, p + KV_ROW_HEADER + 2 * (size_t)dim, 4 * (size_t)slen);
    if (rw == w || w == KV_W_FP32) return 0;
  } else {
    int rc = kv_row_decode(val, len, dim, slen, row, err, errlen);
    if (rc || w == KV_W_FP32) return rc;
  }
  for (int j = 0; j < dim; j++) /* into the table's format, to nearest */
    row[j] = w == KV_W_FP16 ? sr_f16_to_f32(sr_f32_to_f16(row[j]))
                            : sr_bf16_to_f32(sr_f32_to_bf16(row[j]));
  return 0;
}

int kv_figures_get(kv_db *d, kv_figures *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < d->n_all; i++) {
    out->sst_bytes += cf_property(d, d->all[i], "rocksdb.total-sst-files-size");
    out->pending_compaction_bytes +=
        cf_property(d, d->all[i], "rocksdb.estimate-pending-compaction-bytes");
    out->table_readers_bytes += cf_property(d, d->all[i], "rocksdb.estimate-table-readers-mem");
  }
  return 0;
}

uint64_t kv_estimate_rows(kv_db *d, int cf) {
  return cf < 0 || cf >= d->n ? 0 : kv_property(d, cf, "rocksdb.estimate-num-keys");
}
