/* The shard: a bounded in-memory cache of rows over a RocksDB cold tier.
 *
 * emb_store_create_shard hosts shards of a plan in this process, one RocksDB
 * database per shard in DATA_DIR/shard-K (storage/kv.h: a column family per
 * table, key = row id big-endian, value = versioned header + value floats +
 * optimizer state floats). Rows live in a cache of at most cache_rows rows
 * (all hosted shards and tables together): an open-addressing hash map from
 * (table, row id) to a slot of one slab, GCLOCK eviction (CLOCK whose
 * rows keep a count of their uses: a row used in many steps outlasts rows
 * used once).
 *
 * - A lookup serves hits from the cache and reads a batch's misses on the
 *   store threads, one batched MultiGet per (shard, table, 1024 rows) side
 *   by side; rows absent from RocksDB get emb_row_init and the optimizer's
 *   initial state (clean: never written unless pushed).
 * - A push brings its rows in the same way and applies embedding/optim.h's
 *   emb_optim_apply in place, marking them dirty, whole or not at all,
 *   except that a push of more than a chunk (half the cache) that fails
 *   (a read, memory) after applying part of itself leaves the store
 *   refusing every call, naming the failure, until a restore.
 * - prefetch (store.h's look-ahead) pins a later step's cached rows and
 *   has its misses read by the store threads into pinned slots while the
 *   steps before it run; its lookup waits only for reads not done yet. The
 *   pins go at that step's push (or a later step's lookup or push); at
 *   most cache_rows - chunk - 1 are held, so a cache smaller than two
 *   steps still works: the prefetch stops there and the lookup reads the
 *   rest. A prefetched row is read from where its latest value is (the
 *   cache, a pending write-back, RocksDB): exact, see shard_impl.h's top.
 * - Eviction drops clean rows; dirty ones are encoded into a write buffer,
 *   and a store thread writes a set of full buffers as sorted SST files,
 *   ingested, off the caller's path (the caller waits only when every
 *   buffer is in use). Rows written back and not yet ingested are read
 *   from their buffers. With cache_rows above the rows touched nothing is
 *   written until flush or checkpoint.
 * - Work is done in chunks of at most cache_rows / 2 rows whose slots are
 *   pinned while in use, so a batch larger than the cache still runs.
 * Lookups return exactly the bits the local store returns (same init, same
 * optimizer code), so training is bit-identical whichever store holds rows,
 * with or without prefetch, whatever the threads' timing.
 *
 * Memory: the slab (cache_rows x (dim + state) floats), the map (2x
 * cache_rows 8-byte entries), the write-back buffers, their index and a
 * write set's order (write_buffer_bytes, 16 MiB by default, plus about 4.5
 * MiB; EMB_SHARD_WB_*), prefetch pin lists (4 bytes a pinned row),
 * RocksDB's memtables (removals and delta rows only; and with lz4, a block
 * cache of block_cache_bytes), and per-batch scratch. Nothing proportional to a table's size: uncompressed
 * files, index and filter blocks included, are read in place from the OS
 * page cache (kv.h; lz4 tables' index blocks are decompressed onto the
 * heap, under a byte a row).
 *
 * checkpoint(path) (EMB_CKPT_SHARD_FOLDERS): writes dirty rows back, then a
 * RocksDB checkpoint of each hosted shard into path/shard-K, nothing else
 * (the names are storage/ckpt_dir.h's). destroy does not write dirty rows back:
 * flush (or checkpoint) first to keep them. restore(path): copies each
 * path/shard-K beside its database (DATA_DIR/shard-K.TAG, SST files
 * hard-linked), closes the databases, exchanges each copy with its
 * database in one rename and opens them, then drops the cache and every
 * prefetch. A copy or an open that fails leaves the store as it was (the
 * old databases exchanged back and opened, the cache kept); only if they
 * cannot be opened again is the store left without databases, every call
 * SR_EIO until a restore succeeds. flush, checkpoint, iterate, mark_clean and
 * restore first wait for every read and write-back in flight. A write-back
 * that fails is reported (SR_EIO and RocksDB's message) by every later
 * lookup, push, flush and checkpoint until a restore: its rows are lost.
 * remove deletes the rows one database after the other: a delete that
 * fails leaves the rows of the databases before it removed (deleted,
 * reset in the cache, listed for the next checkpoint_delta) and the
 * others untouched, errmsg naming the shards of each; the same removal
 * again completes it. iterate() visits rows written to RocksDB (after
 * writing dirty ones back), merged across shards in ascending row id.
 *
 * Incremental checkpoints (store.h's checkpoint_delta, restore_delta;
 * shard_delta.c): a push adds its rows' ids to the change set, a hash set
 * of row ids per table (8 bytes a changed row at load 1/2 or more; no scan
 * of RocksDB), emptied and freed by a checkpoint, a delta or a restore of
 * either kind that succeeds, and kept only from the first of them on
 * (before it every row held has changed: a delta then writes them all, by
 * iterate; a store never saved keeps no set). checkpoint_delta(path) writes dirty rows back,
 * then path/table-<id>.bin per table of the plan (embedding/table_file.h):
 * the table's changed rows, ascending, read from RocksDB; the same rows
 * make the local store's bytes. restore_delta(path) reads every file whole
 * first (a row of a shard not hosted here is refused, SR_EMISMATCH), then
 * writes dirty rows back, drops the cache and every prefetch as restore
 * does, and writes each row into its database (SR_EIO when a write fails
 * midway: rows partly replaced). */
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
  size_t block_cache_bytes; /* RocksDB block cache of lz4 tables (0: 32 MiB) */
  size_t write_buffer_bytes;/* the write-back buffers, all of them: rows written back, not
                               yet in RocksDB (0: EMB_SHARD_WB_DEFAULT_BYTES) */
  int lz4;                  /* compress SST blocks with lz4 (default none) */
  int n_hosted;             /* 0: every shard of the plan; else hosted[n_hosted] */
  const int *hosted;        /* shard indices hosted here (borrowed; copied) */
  int threads;              /* store threads: 0: EMB_SHARD_DEFAULT_THREADS; -1: none (the
                               calling thread reads and writes everything itself) */
} emb_shard_config;

/* Store threads, made at create and joined at destroy: they read misses
 * (one job per (database, table), at most 1024 rows each, batched
 * MultiGet straight into the cache slots) and write evicted dirty rows back
 * (write sets of buffers, ingested as SST files, one set at a time, in
 * order). 2 by default: a MultiGet of rows in the OS page cache (read in
 * place) is CPU work, so threads beyond the cores only queue; on the 2-core machines here two
 * threads plus the caller (which runs queued work whenever it waits) keep
 * both cores busy during a lookup, and while the dense step computes the
 * prefetch reads take what the dense pool leaves (DESIGN.md, "Who owns
 * the cores"). */
#define EMB_SHARD_DEFAULT_THREADS 2
/* Write-back memory, the same whatever the cache: EMB_SHARD_WB_BUFFERS
 * buffers of encoded rows sharing write_buffer_bytes (64 KiB to 1 GiB;
 * EMB_SHARD_WB_DEFAULT_BYTES, 16 MiB, by default), their index (16 bytes
 * per row of the buffers: 2 MiB at dim 16 with Adagrad, whose rows take 152
 * bytes, 6898 a 1 MiB buffer) and a write set's order (24 bytes a row). A buffer is handed over when full;
 * once EMB_SHARD_WB_SET are, a store thread writes them all as one write
 * set: a sorted SST file per (database, table), ingested (no memtable:
 * RocksDB's memtables hold only removals and delta rows). The caller waits
 * only when every buffer is handed over and not yet written. */
#define EMB_SHARD_WB_BUFFERS 16
#define EMB_SHARD_WB_SET 12
#define EMB_SHARD_WB_DEFAULT_BYTES ((size_t)16 << 20)
#define EMB_SHARD_WB_MIN_BYTES ((size_t)64 << 10)
#define EMB_SHARD_WB_MAX_BYTES ((size_t)1 << 30)
/* A push is applied in one pass, its rows' bytes kept to put back should
 * one update not be finite, when it fits a chunk of the cache and its rows
 * take at most this many bytes (a buffer kept between pushes); a larger
 * push checks every update first and then applies them. */
#define EMB_SHARD_UNDO_BYTES ((size_t)32 << 20)

#define EMB_SHARD_MIN_CACHE_ROWS 1024

/* Create a shard store over plan (borrowed; outlives the store) keeping its
 * databases under data_dir (created if missing). Returns NULL with the
 * reason in err (a bad config, a database that cannot open or was written
 * under other tables). */
emb_store *emb_store_create_shard(const emb_plan *plan, const char *data_dir,
                                  const emb_shard_config *cfg, char *err, size_t errlen);

/* Rows a cache of mb MiB holds for plan (the widest row sets the slot; an
 * fp16 or bf16 table's row takes 2 bytes a weight). */
uint64_t emb_shard_rows_for_mb(const emb_plan *plan, uint64_t mb);

/* Counters beyond emb_store_stats (for benches and tests) of the shard
 * store s into *out. 0, or SR_EINVAL (*out untouched) when s is NULL or
 * another kind of store (emb_store_kind_of). */
typedef struct emb_shard_counters {
  uint64_t evictions, writebacks, rocks_reads, rocks_found, cache_rows, cache_used;
  /* the pipeline (prefetch, threads, write-back) */
  uint64_t prefetched;      /* rows prefetch found missing and had read (or took pending) */
  uint64_t prefetch_cached; /* rows prefetch found cached (pinned only) */
  uint64_t prefetch_stops;  /* prefetches cut short at the pin limit */
  uint64_t pending_hits;    /* misses served from a write-back not yet in RocksDB */
  uint64_t load_waits;      /* rows a lookup, push or release waited for while loading */
  uint64_t wait_ns;         /* the caller's time waiting for the threads (running work meanwhile) */
  uint64_t wb_batches;      /* write buffers written by the threads */
  uint64_t wb_full_waits;   /* times the caller found every write buffer in use */
  uint64_t wb_wait_ns;      /* of wait_ns, the time waiting for a free write buffer */
  uint64_t pinned;          /* prefetch pins held now (a slot pinned by two steps counts 2) */
  uint64_t send_held;       /* slots answers are being sent from now (lookup_pinned) */
  uint64_t send_copies;     /* rows a push moved to a fresh slot: their old one was being sent */
  /* CPU time (thread CPU, nanoseconds; whichever thread did the work) */
  uint64_t rocks_read_ns;   /* inside RocksDB reading misses (MultiGet, values released) */
  uint64_t rocks_write_ns;  /* inside RocksDB writing rows back (SST files written and ingested) */
  uint64_t io_own_ns;       /* the threads' work outside RocksDB: read jobs sorted, rows
                               decoded or initialised; write buffers sorted */
  uint64_t caller_ns;       /* the caller in lookup, push and prefetch (the map, eviction,
                               encoding rows written back), less the queued work it ran */
  uint64_t wb_rows;         /* rows the write buffers wrote to RocksDB (a row evicted twice
                               in one write set is written once: its newest record) */
} emb_shard_counters;
int emb_shard_counters_get(emb_store *s, emb_shard_counters *out);

/* Crashes. A store opened on databases that hold rows but were not
 * stopped cleanly (no DIR/shard-K.clean, written by emb_shard_mark_clean)
 * may hold a push applied in part: the process died while dirty rows were
 * being written back. The store opens anyway and says so here; the marks
 * are removed at open, before anything is written, so that a crash from
 * now on is seen at the next open. restore() clears it (every row is the
 * checkpoint's), and so does emb_shard_accept_unclean; nothing else does
 * (a clean stop leaves such rows unmarked). 1 when s is a shard store
 * opened unclean and neither restored nor accepted since, else 0 (other
 * kinds of store too). */
#define EMB_SHARD_CLEAN_SUFFIX ".clean"
int emb_shard_unclean(const emb_store *s);

/* The rows left by a crash taken as they are (serve --accept-unclean):
 * emb_shard_unclean is 0 from now on, and a clean stop marks them whole.
 * Nothing for other kinds of store. */
void emb_shard_accept_unclean(emb_store *s);

/* A clean stop: flush (and compact, when rows were removed since the last
 * compaction: their space comes back), then write every hosted shard's mark (fsynced), so
 * that the next open knows the rows are whole. A store that is still
 * unclean (emb_shard_unclean: opened on a crash's rows, neither restored
 * nor accepted since) is only flushed: its rows stay unmarked, so the next
 * open finds them unclean too, however often the process is stopped
 * cleanly in between. A push, remove or restore_delta after the marks
 * removes them again (before it changes a row). 0,
 * SR_EINVAL (not a shard store), or SR_EIO / SR_ERANGE with the reason in
 * errmsg. */
int emb_shard_mark_clean(emb_store *s);

/* The RocksDB figures (storage/kv.h) of the shard store s, summed over its
 * databases. 0, or SR_EINVAL (*out untouched) as emb_shard_counters_get. */
int emb_shard_kv_figures_get(emb_store *s, kv_figures *out);

#endif
