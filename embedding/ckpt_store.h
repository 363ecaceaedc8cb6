/* An embedding store holding a trainer checkpoint's rows, for serving and
 * scoring (shardrec serve --checkpoint, shardrec predict).
 *
 * A checkpoint's step-N/shards/ comes in three layouts (storage/ckpt_dir.h,
 * which owns their names and tells which one a folder has): a RocksDB
 * checkpoint per shard (shard-K/), the trainer's in-memory store's table
 * files (table-<id>.bin, every shard's rows), in-memory shard servers' folders
 * (shard-K[-K2...]/table-<id>.bin). emb_ckpt_store_open finds which one the
 * checkpoint has, checks that every wanted shard is in it, and builds:
 *   RocksDB layout: the shard store over data_dir (given), or over a fresh
 *     temporary folder (removed by emb_ckpt_store_close): under $TMPDIR if set,
 *     else /tmp when it is on the checkpoint's file system, else a hidden
 *     .shardrec-ckpt-K.TAG beside the step-N folder (so the SST files can
 *     be hard-linked; TAG names the owner, common/fs.h's sr_tmp_tag, and
 *     the copies of owners that are gone are removed there first); restore copies the checkpoint's databases in,
 *     hard-linking the SST files, so the checkpoint itself is never written;
 *   table files: the in-memory store restored from the one folder holding the
 *     wanted shards, or, when they lie in several server folders, a store
 *     that routes each row (emb_plan_shard_of) to an in-memory store
 *     restored from its shard's folder (checkpoint/restore/iterate refused:
 *     EMB_CKPT_NONE).
 * An incremental checkpoint (storage/ckpt_dir.h's chains) is opened as the
 * full checkpoint its chain folds into (embedding/ckpt_fold.h): the rows
 * are folded first into a temporary folder made as the RocksDB layout's is
 * (fold_dir, removed by emb_ckpt_store_close), which is then opened as
 * above.
 * The store says itself what its checkpoint(path) writes
 * (emb_store_checkpoint_layout): callers ask it, not this module.
 * Every file is read and checked (sizes, checksums, fingerprints) by the
 * stores' restore; the caller verifies the checkpoint first (train_ckpt_open). */
#ifndef SHARDREC_EMBEDDING_CKPT_STORE_H
#define SHARDREC_EMBEDDING_CKPT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/store.h"

typedef struct emb_ckpt_store_opts {
  const int *shards;   /* [n_shards] shards wanted (borrowed); n_shards 0: every shard */
  int n_shards;
  const char *data_dir; /* RocksDB layout: keep the databases here (NULL: a temporary
                           folder); a table-file layout with data_dir is refused */
  uint64_t cache_rows, cache_mb; /* RocksDB layout: the shard store's cache (0, 0: 256 MiB) */
} emb_ckpt_store_opts;

typedef struct emb_ckpt_store {
  emb_store *store;     /* owned */
  char *tmp_dir;        /* owned temporary data folder, or NULL */
  char *fold_dir;       /* owned temporary folder of an incremental checkpoint's rows
                           folded (its shards/), or NULL */
  char layout[96];      /* words for a status line */
} emb_ckpt_store;

/* Open the store of checkpoint dir (a verified step-N folder) over plan
 * (borrowed; outlives the store: the checkpoint's own plan). 0 or SR_E*
 * with a message naming the folder or file in err; nothing is left behind
 * on failure. */
int emb_ckpt_store_open(const char *dir, const emb_plan *plan, const emb_ckpt_store_opts *o,
                    emb_ckpt_store *out, char *err, size_t errlen);

/* Destroy the store and remove its temporary folder. NULL-safe; zeroes *cs. */
void emb_ckpt_store_close(emb_ckpt_store *cs);

#endif
