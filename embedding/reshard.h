/* The resharding engine behind `shardrec reshard` and `shardrec bench
 * reshard`: rewrite the RocksDB shard databases of a checkpoint made under
 * one plan into the shard databases of another plan with the same model.
 *
 * Sources: SRC/shard-K (K = 0..src plan's n_shards-1), each a RocksDB
 * database (kv.h layout: family t<table_id>, key = row id big-endian,
 * value = kv_row_encode(value + optimizer state)), opened read-only.
 *
 * Streaming, per table (tables side by side on opts.threads workers, each
 * with its own writers): one iterator per source over the table's family
 * (each ascending in row id), merged by row id (the sources hold disjoint
 * rows, so the merge is globally ascending; a row id met twice is refused),
 * each row routed by the new plan (emb_plan_shard_of) and appended to the
 * SST file of its target shard for this table. Because the merged stream
 * ascends, one SST writer per target shard suffices and every file is
 * sorted; a file rolls over at 256 MiB (files of one table then
 * never overlap). When the table is done its files are ingested (moved)
 * into OUT/shard-K's family. Memory: per worker, n_targets SST writers'
 * blocks and one iterator (2 MiB readahead) per source, and RocksDB's own
 * buffers; nothing grows with a table's size.
 *
 * Every target database gets a family for every table of the new plan,
 * whether rows land on it or not: the shard store refuses to restore a
 * database that lacks one (embedding/shard.c).
 *
 * Verification: per table, the row count and two order-independent sums
 * (the wrapping sum and the xor) of a 64-bit hash of (table_id, row id,
 * value bytes) over the rows read from the sources; the written databases
 * are closed, reopened read-only and scanned again (also checking that each
 * row sits on the shard the new plan routes it to), and every table's
 * count and sums must be equal, else SR_ECHECKSUM naming the table. */
#ifndef SHARDREC_EMBEDDING_RESHARD_H
#define SHARDREC_EMBEDDING_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "storage/ckpt_dir.h"

typedef struct reshard_table {
  uint32_t table_id;
  char name[EMB_NAME_MAX];
  uint64_t rows_in, sum_in, xor_in;    /* over the sources */
  uint64_t rows_out, sum_out, xor_out; /* over the written databases */
  int ok;                              /* verified equal */
} reshard_table;

typedef struct reshard_stats {
  uint64_t rows, bytes;  /* rows moved; their key + value bytes */
  double seconds;        /* the whole run, verification included */
  double verify_seconds; /* of which re-reading the targets */
  int n_tables;
  reshard_table *tables; /* [n_tables] in the new plan's order; reshard_stats_free */
} reshard_stats;


/* A hook on the rows being written (tests: show that verification catches
 * a changed or a lost row). Called with a private copy of each row about to
 * be written, as the layout stores its value (RocksDB: the encoded row,
 * header and floats; table files: the floats after the row id); it may
 * change the bytes; nonzero drops the row. */
typedef int (*reshard_row_hook)(void *ctx, uint32_t table_id, uint64_t row_id, unsigned char *val,
                                size_t len);

typedef struct reshard_opts {
  ckpt_shards_layout layout; /* of the source (storage/ckpt_dir.h); the output keeps it
                                (see reshard_run_files) */
  const char *src_dir;    /* the source's shards/ folder */
  const emb_plan *src;    /* the plan the sources were written under */
  const emb_plan *dst;    /* the new plan (same model) */
  const char *out_dir;    /* folder to create the target databases shard-K in (exists) */
  const char *work_dir;   /* scratch (exists): SST files before ingestion, RocksDB info logs */
  int progress;           /* a live line on stderr (rows, MB, rows/s, ETA) */
  int threads;            /* tables moved side by side (<= 1: one at a time) */
  int verify;             /* re-read and compare the targets (1 unless benchmarking) */
  int src_checked;        /* the source files' bytes were just verified (train_ckpt_open's
                             SHA-256): skip RocksDB's block checksums on the source scan */
  reshard_row_hook row_hook; /* NULL: rows written as read (see reshard_row_hook) */
  void *row_hook_ctx;
} reshard_opts;

/* Reshard (see above). st gets the figures and per-table verification
 * (also on SR_ECHECKSUM). 0, or SR_E* with the reason in err: a source
 * that is not a database or holds a table the plan lacks (SR_EFORMAT /
 * SR_ENOTFOUND), a damaged row (SR_EFORMAT), RocksDB errors (SR_EIO), a
 * verification mismatch (SR_ECHECKSUM), a folder too long for the paths
 * made under it (SR_ERANGE, before anything is written). On failure out_dir
 * may hold partial databases: the caller removes them. */
int reshard_run(const reshard_opts *o, reshard_stats *st, char *err, size_t errlen);
void reshard_stats_free(reshard_stats *st); /* NULL-safe; leaves *st zeroed */

/* The same for the in-memory stores' table files (embedding/reshard_files.c,
 * the files embedding/table_file.h's), whose consumers restore only table
 * files: CKPT_SHARDS_TABLES writes out_dir/table-<id>.bin (the in-memory
 * trainer holds every shard: the rows do not move, the files are rewritten
 * and verified); CKPT_SHARDS_SERVER_TABLES merges the servers' files of
 * each table by row id (every shard of the source plan must have a server
 * folder) and writes out_dir/shard-K/table-<id>.bin for every shard K of
 * the new plan (one in-memory server per shard restores its folder). Every
 * (target, table) gets a file, empty or not: the in-memory store restores
 * every table of the plan. The sources' SHA-256 trailers are checked as
 * they are read. Verification as above, plus each written file's trailer.
 * Tables go one at a time (these checkpoints fit in memory by
 * construction). */
int reshard_run_files(const reshard_opts *o, reshard_stats *st, char *err, size_t errlen);

/* Fill each table's ok from its counts and sums; SR_ECHECKSUM naming the
 * first table that differs. */
int reshard__compare(reshard_stats *st, char *err, size_t errlen);

/* The first difference between the models of plans a and b (what changes
 * the model fingerprint), as "tables[3] (table_id 3, t3): dim 16 vs 32" or
 * "...: keep.capacity 60 vs 80" into buf: the seed, the table count, then
 * per table every field the fingerprint covers (precision and keep
 * included); a table whose canonical form differs in no field listed is
 * named with both forms. "" when the models are the same. */
void reshard_model_diff(const emb_plan *a, const emb_plan *b, char *buf, size_t len);

/* The order-independent row hash used by verification. */
uint64_t reshard_row_hash(uint32_t table_id, uint64_t row_id, const void *val, size_t len);

#endif
