/* The RocksDB cold tier: one database per shard, a column family per table.
 *
 * storage/ knows nothing of plans or optimizers: a database is a set of
 * column families named by table_id ("t<table_id>"), keys are row ids
 * (8 bytes, big-endian, so iteration is in ascending row id) and values are
 * rows encoded by kv_row_encode. Every RocksDB call goes through one check
 * that keeps the library's message with file and line.
 *
 * Options (tuned for point lookups of float rows, not defaulted; why and
 * the figures: README.md, "The cold tier's RocksDB options"):
 *   - SST files read in place (mmap): a block is used where the file is
 *     mapped (the OS page cache holds it), so a read makes no pread and no
 *     copy; its checksum is still verified on every read;
 *   - every table reader stays open (no table cache to look through) and
 *     keeps its file's index and filter blocks itself, not in a cache: a
 *     read probes them with no cache lookup. Read in place too, they cost
 *     the heap a few KB a file (kv_figures.table_readers_bytes);
 *   - no block cache for uncompressed tables (every block is read in
 *     place: a cache would hold nothing and cost a lookup a read); a
 *     database opened with KV_COMPRESSION_LZ4 has an LRU block cache of
 *     block_cache_bytes for its tables' decompressed data blocks, and their
 *     index blocks, compressed too, decompressed onto the heap (under 1
 *     byte a row);
 *   - whole-key bloom filters, 10 bits/key (point lookups of absent rows are
 *     the common miss: a never-written row), and one per memtable too, so a
 *     read skips the memtables that do not hold its row;
 *   - 4 KiB blocks, each with a hash index beside its binary search;
 *     XXH3 checksums in new files;
 *   - memtables capped by db_write_buffer_size (RocksDB's write buffer
 *     manager) across every column family;
 *   - a column family's L0 files compacted into L1 at 8 of them (not
 *     RocksDB's 4): rows are overwritten all over the key range, so each
 *     L0->L1 compaction rewrites the whole of L1;
 *   - compression none by default: float rows barely compress with lz4 and
 *     lz4 costs read time (measured: see kv.c); KV_COMPRESSION_LZ4 opt-in;
 *   - kv_writes skip the write-ahead log: rows are durable at a flush
 *     (kv_flush, which a checkpoint makes);
 *   - large sorted runs (the shard store's write-backs) skip the memtable:
 *     kv_ingest writes them as an SST file with these options and ingests
 *     it, durable at once. */
#ifndef SHARDREC_STORAGE_KV_H
#define SHARDREC_STORAGE_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_db kv_db;

typedef enum { KV_COMPRESSION_NONE = 0, KV_COMPRESSION_LZ4 = 1 } kv_compression;

typedef struct kv_opts {
  size_t block_cache_bytes;  /* lz4 tables' block cache; 0: 32 MiB */
  size_t write_buffer_bytes; /* all memtables together; 0: 16 MiB */
  kv_compression compression;
  int read_only;             /* open an existing database read-only */
} kv_opts;

/* Open (create when missing, unless read_only) the database at path with one
 * column family per entry of table_ids (missing ones created). Column
 * families the database holds beyond those are opened too (kept, unused).
 * Returns 0 and a handle in *out (kv_close), or SR_EIO / SR_ENOTFOUND /
 * SR_ENOMEM with the reason, naming path, in err. */
int kv_open(const char *path, int n, const uint32_t *table_ids, const kv_opts *o,
               kv_db **out, char *err, size_t errlen);
void kv_close(kv_db *db); /* NULL-safe */

/* Column family index (0..n-1 as given to kv_open) of table_id, or -1. */
int kv_cf_index(const kv_db *db, uint32_t table_id);

/* Table ids of the column families of the database at path (without opening
 * it); *ids malloc'd. The "default" family is left out. 0 or SR_EIO. */
int kv_list_tables(const char *path, uint32_t **ids, int *n, char *err, size_t errlen);

/* Reads: RocksDB's batched MultiGet of n keys of one column family (block
 * reads batched, values pinned, no copy), with the reader's own scratch so
 * that several threads read one database at once (RocksDB reads are
 * thread-safe). vals[k] points at the value or is NULL when absent, lens[k]
 * its size; both stay valid until the next kv_reader_get_cf or
 * kv_reader_release on r. One thread uses a reader at a time. 0, SR_ENOMEM
 * or SR_EIO. create: NULL when out of memory; destroy NULL-safe. */
typedef struct kv_reader kv_reader;
kv_reader *kv_reader_create(void);
int kv_reader_get_cf(kv_reader *r, kv_db *db, int cf, size_t n, const uint64_t *keys,
                     const char **vals, size_t *lens, char *err, size_t errlen);
/* kv_reader_get_cf of keys that ascend strictly, handed to RocksDB as
 * sorted (it skips its own sort); SR_EINVAL (nothing read) when they do
 * not. */
int kv_reader_get_sorted_cf(kv_reader *r, kv_db *d, int cf, size_t n, const uint64_t *keys,
                            const char **vals, size_t *lens, char *err, size_t errlen);
void kv_reader_release(kv_reader *r);
void kv_reader_destroy(kv_reader *r);

/* Figures over every column family: SST bytes and the estimated bytes
 * compaction still has to rewrite (for monitoring, rpc/service_metrics.c),
 * and the heap the open table readers hold (with their index and filter
 * blocks when those are not read in place). Always 0. */
typedef struct kv_figures {
  uint64_t sst_bytes, pending_compaction_bytes, table_readers_bytes;
} kv_figures;
int kv_figures_get(kv_db *db, kv_figures *out);
/* RocksDB's estimate of the keys in family cf (0 when it has none). */
uint64_t kv_estimate_rows(kv_db *db, int cf);

/* Compact every column family fully (after a bulk load). 0 or SR_EIO. */
int kv_compact(kv_db *db, char *err, size_t errlen);

/* Writes: a write batch of its own, so that several threads write (RocksDB
 * writes are thread-safe): puts of rows of db gathered, then written in one
 * RocksDB write by kv_writes_commit (the batch is empty after, whether or
 * not the write failed: 0 or SR_EIO). These writes skip RocksDB's write-ahead
 * log: they are durable only once kv_flush (or kv_checkpoint, which
 * flushes) returns, and a crash loses those since the last flush (the
 * shard store's removals and delta rows, whose durability points are its
 * checkpoint and its clean-stop mark, each after a flush). create: NULL
 * when out of memory; destroy NULL-safe. */
typedef struct kv_writes kv_writes;
kv_writes *kv_writes_create(void);
void kv_writes_put(kv_writes *w, kv_db *db, int cf, uint64_t key, const void *val, size_t len);
/* A delete of key from column family cf of db, in the batch (the space comes
 * back when compaction drops the key's older versions: kv_compact). */
void kv_writes_delete(kv_writes *w, kv_db *db, int cf, uint64_t key);
int kv_writes_commit(kv_writes *w, kv_db *db, char *err, size_t errlen);
void kv_writes_destroy(kv_writes *w);

/* Ingestion: sorted rows of one column family written as one SST file (the
 * database's own table options: bloom filters, block format) and moved into
 * the database by IngestExternalFile, no memtable on the way. For large
 * sorted runs (the shard store's write-backs): a memtable insert is a skip
 * list walk a row, and the flush after it writes the same file. Keys must be
 * strictly ascending between begin and commit (SR_EINVAL names both keys
 * otherwise). A commit makes the rows durable (the file and RocksDB's
 * manifest are synced) and visible to every later read; rows of the same
 * keys written before (memtable or file) are overwritten (a memtable
 * holding keys within the file's range is flushed first). The file is
 * written into the database's folder as ingest-N.sst and is gone after a
 * commit or a failure (kv_open removes any a crash left). One writer per
 * handle; several handles may ingest into one database. create: NULL when
 * out of memory; destroy NULL-safe (aborts an open file). 0 or SR_EIO /
 * SR_EINVAL / SR_ERANGE (the folder's path too long) / SR_ESTATE (a put or
 * commit with no file begun, or after one failed: a failure aborts it). */
typedef struct kv_ingest kv_ingest;
kv_ingest *kv_ingest_create(void);
int kv_ingest_begin(kv_ingest *g, kv_db *db, int cf, char *err, size_t errlen);
int kv_ingest_put(kv_ingest *g, uint64_t key, const void *val, size_t len, char *err,
                  size_t errlen);
int kv_ingest_commit(kv_ingest *g, char *err, size_t errlen);
void kv_ingest_destroy(kv_ingest *g);

/* Flush memtables to SST files. */
int kv_flush(kv_db *db, char *err, size_t errlen);

/* A RocksDB checkpoint of the database into dir (must not exist; created;
 * memtables flushed first). 0 or SR_EIO. */
int kv_checkpoint(kv_db *db, const char *dir, char *err, size_t errlen);

/* Iterate column family cf in ascending key order. */
typedef struct kv_iter kv_iter;
kv_iter *kv_iter_create(kv_db *db, int cf);
int kv_iter_valid(kv_iter *it);
uint64_t kv_iter_key(kv_iter *it);
const char *kv_iter_value(kv_iter *it, size_t *len);
void kv_iter_next(kv_iter *it);
void kv_iter_seek(kv_iter *it, uint64_t key);
void kv_iter_destroy(kv_iter *it); /* NULL-safe */

/* An integer property of a column family ("rocksdb.estimate-num-keys"...). */
uint64_t kv_property(kv_db *db, int cf, const char *name);

/* Row encoding: an 8-byte header then little-endian values.
 *   u8 'S', u8 'R', u8 version, u8 weights, u16 dim, u16 state_len
 *   (little-endian), then value[dim], float state[state_len].
 * Version 1 (KV_ROW_VERSION): weights byte 0, value is dim floats: the rows
 * of fp32 tables, as they have always been written. Version 2
 * (KV_ROW_VERSION_16): weights byte KV_W_FP16 or KV_W_BF16, value is dim
 * 16-bit values of that format (common/half.h, little-endian); the state
 * stays float. */
#define KV_ROW_VERSION 1
#define KV_ROW_VERSION_16 2
#define KV_ROW_HEADER 8
/* The weights byte: the same codes as the plan's emb_precision. */
#define KV_W_FP32 0
#define KV_W_FP16 1
#define KV_W_BF16 2
static inline size_t kv_row_size(int dim, int slen) {
  return KV_ROW_HEADER + 4 * (size_t)(dim + slen);
}
/* The size of a row of weights w (KV_W_*). */
static inline size_t kv_row_size_w(int dim, int slen, int w) {
  return KV_ROW_HEADER + (w == KV_W_FP32 ? 4 : 2) * (size_t)dim + 4 * (size_t)slen;
}
/* Encode row[dim + slen] into out[kv_row_size]. */
void kv_row_encode(int dim, int slen, const float *row, unsigned char *out);
/* Decode into row[dim + slen]. Checks the magic, the version (SR_EVERSION),
 * the size and the layout (SR_EFORMAT / SR_EMISMATCH) before writing row;
 * a message goes to err. */
int kv_row_decode(const void *val, size_t len, int dim, int slen, float *row, char *err,
                     size_t errlen);

/* The same for a table whose weights are w (KV_W_*): encode writes version
 * 1 for fp32 and version 2 for 16-bit weights (kv_row_size_w bytes; the
 * values of row must be of the format: they are rounded to nearest).
 * decode reads either version into floats, whatever the table's weights
 * (a row written under another precision, e.g. before a table was
 * converted, is rounded to nearest of w), with the checks of
 * kv_row_decode. */
void kv_row_encode_w(int dim, int slen, int w, const float *row, unsigned char *out);
int kv_row_decode_w(const void *val, size_t len, int dim, int slen, int w, float *row,
                    char *err, size_t errlen);
/* 1 when val is a row of either version of dim and slen (its header and
 * size), else 0; *w gets its weights byte. */
int kv_row_check(const void *val, size_t len, int dim, int slen, int *w);

#endif
