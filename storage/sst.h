/* Bulk paths into and out of the RocksDB cold tier, for offline tools
 * (shardrec reshard, bench reshard): SST files written with RocksDB's
 * SstFileWriter and ingested with IngestExternalFile, and full scans of a
 * database opened read-only.
 *
 * The layout is kv.h's: a column family "t<table_id>" per table, keys are
 * row ids (8 bytes, big-endian: byte order is row-id order), values are
 * kv_row_encode rows (this module does not look inside them). These
 * handles are separate from kv.h's kv_db: they own their rocksdb_t and
 * tune it for one pass (no block cache fill, readahead, no WAL).
 *
 * Every RocksDB error comes back as SR_EIO with the library's text, the path
 * and file:line in err. */
#ifndef SHARDREC_STORAGE_SST_H
#define SHARDREC_STORAGE_SST_H

#include <stddef.h>
#include <stdint.h>

/* ---- SST files ---- */
typedef struct sst_writer sst_writer;

/* Start an SST file at path (overwritten if there). 0 and *out, or SR_EIO /
 * SR_ENOMEM / SR_ERANGE (path too long: nothing made). */
int sst_writer_open(const char *path, sst_writer **out, char *err, size_t errlen);
/* Append one row: keys must be strictly ascending within a file (SR_EINVAL
 * names both keys otherwise). 0 or SR_EIO / SR_EINVAL. */
int sst_writer_put(sst_writer *w, uint64_t key, const void *val, size_t len, char *err,
                   size_t errlen);
/* Rows put so far. */
uint64_t sst_writer_rows(const sst_writer *w);
/* Finish the file (footer, index, fsync'd by RocksDB); *bytes its size
 * (NULL: not wanted). A writer with no row cannot finish (RocksDB refuses
 * empty files): SR_ESTATE. 0 or SR_E*. */
int sst_writer_finish(sst_writer *w, uint64_t *bytes, char *err, size_t errlen);
void sst_writer_destroy(sst_writer *w); /* NULL-safe; an unfinished file is left as is */

/* ---- databases ---- */
typedef struct sst_db sst_db;

/* Create a new, empty database at path (created; must not exist) with one
 * column family per table_ids[n], to be filled by sst_db_ingest. RocksDB's
 * info log goes to log_dir (NULL: into path). 0 or SR_EEXISTS / SR_EIO /
 * SR_ENOMEM / SR_ERANGE (path too long: nothing made). */
int sst_db_create(const char *path, int n, const uint32_t *table_ids, const char *log_dir,
                  sst_db **out, char *err, size_t errlen);
/* Open an existing database read-only (nothing under path is written or
 * created when log_dir names another folder for RocksDB's info log; NULL:
 * RocksDB writes its LOG into path) with every
 * "t<id>" column family it holds. 0 or SR_ENOTFOUND / SR_EIO / SR_ENOMEM /
 * SR_ERANGE (path too long). */
int sst_db_open_read(const char *path, const char *log_dir, sst_db **out, char *err,
                     size_t errlen);
void sst_db_close(sst_db *db); /* NULL-safe */

/* Tables (column families) of db: count, and table id of family i. */
int sst_db_n_tables(const sst_db *db);
uint32_t sst_db_table_id(const sst_db *db, int i);
/* Family index of table_id, or -1. */
int sst_db_find(const sst_db *db, uint32_t table_id);
/* RocksDB's estimate of the rows in family i (rocksdb.estimate-num-keys). */
uint64_t sst_db_estimate_rows(sst_db *db, int i);

/* Ingest files[n] (SST files made by sst_writer) into family i of a database
 * made by sst_db_create. The files are moved (hard-linked, then removed
 * from their place) when on the same file system, else copied. Files may
 * overlap each other in key range; a key in two files keeps the later
 * file's value. 0 or SR_EIO. */
int sst_db_ingest(sst_db *db, int i, const char *const *files, int n, char *err, size_t errlen);

/* ---- full scans ---- */
typedef struct sst_iter sst_iter;

/* Iterate family i in ascending key order (readahead, blocks not cached;
 * RocksDB's block checksums verified when verify is 1, as RocksDB does by
 * default: 0 is for files whose bytes the caller has just checked some
 * other way). NULL when out of memory. */
sst_iter *sst_iter_create(sst_db *db, int i, int verify);
/* 1 while positioned on a row. A key that is not 8 bytes stops the scan
 * (valid 0) and is reported by sst_iter_status. */
int sst_iter_valid(sst_iter *it);
uint64_t sst_iter_key(const sst_iter *it);
const char *sst_iter_value(const sst_iter *it, size_t *len);
void sst_iter_next(sst_iter *it);
/* After the scan: 0, or SR_EIO (a read error, a damaged block) / SR_EFORMAT
 * (a key that is not a row id) with the reason in err. */
int sst_iter_status(sst_iter *it, char *err, size_t errlen);
void sst_iter_destroy(sst_iter *it); /* NULL-safe */

#endif
