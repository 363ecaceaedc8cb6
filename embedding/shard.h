/* The shard: a bounded in-memory cache of rows over a RocksDB cold tier.
 *
 * emb_store_create_shard hosts shards of a plan in this process, one RocksDB
 * database per shard in DATA_DIR/shard-K (storage/kv.h: a column family per
 * table, key = row id big-endian, value = versioned header + value floats +
 * optimizer state floats). Rows live in a cache of at most cache_rows rows
 * (all hosted shards and tables together): an open-addressing hash map from
 * (table, row id) to a slot of one slab, CLOCK eviction.
 *
 * - A lookup serves hits from the cache and reads a batch's misses with one
 *   MultiGet per shard; rows absent from RocksDB get emb_row_init and the
 *   optimizer's initial state (clean: never written unless pushed).
 * - A push brings its rows in the same way and applies embedding/optim.h's
 *   emb_optim_apply in place, marking them dirty.
 * - Eviction drops clean rows and writes dirty ones back in WriteBatches.
 *   With cache_rows above the rows touched nothing is written until flush or
 *   checkpoint.
 * - Work is done in chunks of at most cache_rows / 2 rows whose slots are
 *   pinned while in use, so a batch larger than the cache still runs.
 * Lookups return exactly the bits the local store returns (same init, same
 * optimizer code), so training is bit-identical whichever store holds rows.
 *
 * Memory: the slab (cache_rows x (dim + state) floats), the map (2x
 * cache_rows 16-byte entries), RocksDB's block cache and memtables, and
 * per-batch scratch. Nothing proportional to a table's size.
 *
 * checkpoint(path) (EMB_CKPT_SHARD_FOLDERS): writes dirty rows back, then a
 * RocksDB checkpoint of each hosted shard into path/shard-K, nothing else
 * (the names are storage/ckpt_dir.h's). destroy does not write dirty rows back:
 * flush (or checkpoint) first to keep them. restore(path): closes the databases, drops
 * the cache, replaces DATA_DIR/shard-K with a copy of path/shard-K (SST files
 * hard-linked) and reopens. iterate() visits rows written to RocksDB (after
 * writing dirty ones back), merged across shards in ascending row id. */
#ifndef SHARDREC_EMBEDDING_SHARD_H
#define SHARDREC_EMBEDDING_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/store.h"
#include "storage/kv.h"

#define EMB_SHARD_DEFAULT_CACHE_MB 256

typedef struct emb_shard_config {
  uint64_t cache_rows;      /* rows the cache holds; 0: from cache_mb */
  uint64_t cache_mb;        /* cache size in MiB (slab + map) when cache_rows is 0
                               (both 0: EMB_SHARD_DEFAULT_CACHE_MB) */
  size_t block_cache_bytes; /* RocksDB block cache (0: 32 MiB) */
  size_t write_buffer_bytes;/* RocksDB memtables, all families (0: 16 MiB) */
  int lz4;                  /* compress SST blocks with lz4 (default none) */
  int statistics;           /* RocksDB statistics (kv_opts.statistics), for /metrics */
  int n_hosted;             /* 0: every shard of the plan; else hosted[n_hosted] */
  const int *hosted;        /* shard indices hosted here (borrowed; copied) */
} emb_shard_config;

#define EMB_SHARD_MIN_CACHE_ROWS 1024

/* Create a shard store over plan (borrowed; outlives the store) keeping its
 * databases under data_dir (created if missing). Returns NULL with the
 * reason in err (a bad config, a database that cannot open or was written
 * under other tables). */
emb_store *emb_store_create_shard(const emb_plan *plan, const char *data_dir,
                                  const emb_shard_config *cfg, char *err, size_t errlen);

/* Rows a cache of mb MiB holds for plan (the widest row sets the slot). */
uint64_t emb_shard_rows_for_mb(const emb_plan *plan, uint64_t mb);

/* Counters beyond emb_store_stats (for benches and tests) of the shard
 * store s into *out. 0, or SR_EINVAL (*out untouched) when s is NULL or
 * another kind of store (emb_store_kind_of). */
typedef struct emb_shard_counters {
  uint64_t evictions, writebacks, rocks_reads, rocks_found, cache_rows, cache_used;
} emb_shard_counters;
int emb_shard_counters_get(emb_store *s, emb_shard_counters *out);

/* Crashes. A store opened on databases that hold rows but were not
 * stopped cleanly (no DIR/shard-K.clean, written by emb_shard_mark_clean)
 * may hold a push applied in part: the process died while dirty rows were
 * being written back. The store opens anyway and says so here; the marks
 * are removed at open, before anything is written, so that a crash from
 * now on is seen at the next open. restore() clears it (every row is the
 * checkpoint's). 1 when s is a shard store opened unclean and not restored
 * since, else 0 (other kinds of store too). */
#define EMB_SHARD_CLEAN_SUFFIX ".clean"
int emb_shard_unclean(const emb_store *s);

/* A clean stop: flush, then write every hosted shard's mark (fsynced), so
 * that the next open knows the rows are whole. A push after it removes the
 * marks again. 0, SR_EINVAL (not a shard store), or SR_EIO / SR_ERANGE
 * with the reason in errmsg. */
int emb_shard_mark_clean(emb_store *s);

/* The RocksDB figures (storage/kv.h) of the shard store s, summed over its
 * databases. 0, or SR_EINVAL (*out untouched) as emb_shard_counters_get. */
int emb_shard_kv_figures_get(emb_store *s, kv_figures *out);

#endif
