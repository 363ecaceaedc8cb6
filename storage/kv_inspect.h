/* What a shard data folder or a checkpoint holds (shardrec inspect): a
 * report of tables, distinct rows and bytes per shard database, and the
 * rows asked for.
 *
 * PATH is one of
 *   - one shard database (holds CURRENT);
 *   - a shard data folder (shard-K/ RocksDB databases, as --data-dir writes);
 *   - a checkpoint step folder, or a folder of them (the newest complete one,
 *     storage/ckpt_dir.h): first the manifest's step, data position, store
 *     and fingerprints (read, not verified: inspect is for looking at torn
 *     ones too), then its shards/ as a data folder (in-memory table files
 *     are counted; the rows asked for are read from them by the caller's
 *     table_rows, which knows the checkpoint's plan: storage reads no
 *     table file).
 * Databases are opened read-only. A --table that no database of a data
 * folder holds is refused (a checkpoint's plan is the caller's to check). */
#ifndef SHARDREC_STORAGE_KV_INSPECT_H
#define SHARDREC_STORAGE_KV_INSPECT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kv_inspect_opts {
  long long table;     /* only this table_id (< 0: every table) */
  const uint64_t *rows; /* [n_rows] row ids to print (value and optimizer state) */
  int n_rows;
  int progress;        /* 1: a progress line on stderr while a database is read (give it
                          only when stderr is a terminal; common/progress.h) */
  /* Table-file layouts, when rows are asked: called for each folder holding
   * table files (the in-process store's shards/, named "local", or one
   * in-memory server's folder, named by it) to print the asked rows of
   * table (every table when < 0) it holds, in the databases' form
   * ("  row ID (table_id T, NAME): value [...] state [...]"). 0, or SR_E*
   * with the reason in err (the report goes on). NULL: not read. */
  int (*table_rows)(void *ctx, const char *folder, const char *name, FILE *out, char *err,
                    size_t errlen);
  void *table_rows_ctx;
} kv_inspect_opts;

/* Write the report on path to out. 0, or SR_E* with the reason in err: path
 * is no folder (SR_ENOTFOUND), neither a data folder nor a checkpoint, an
 * unreadable manifest (SR_EFORMAT), a database that does not open (SR_EIO:
 * the others are still reported; err holds the first such failure), a
 * table no database holds (SR_ENOTFOUND), table_rows' failure. */
int kv_inspect(const char *path, const kv_inspect_opts *o, FILE *out, char *err,
                  size_t errlen);

#endif
