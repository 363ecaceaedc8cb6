/* The plan and the store a shard server serves (shardrec serve), below the
 * RPC layer: the command opens them here and hands them to
 * rpc_service_create.
 *
 * Three sources of rows:
 *   - a checkpoint (a step-N folder or a folder of them, the newest complete
 *     one): verified (every file's size and SHA-256: embedding/ckpt_plan.h),
 *     only read; its plan is served (a plan given too must be it, same plan
 *     fingerprint), and the fingerprint of the data transform it records
 *     (a server hands the file's bytes on); its rows come from
 *     embedding/ckpt_store.h (RocksDB
 *     databases copied, SST files linked, into data_dir or a temporary
 *     folder; in-memory table files loaded);
 *   - a plan with data_dir: the RocksDB shard store over data_dir/shard-K
 *     with a bounded cache;
 *   - a plan alone: every row in memory.
 * With restore (not with a checkpoint), the store then restores what a
 * Checkpoint(PATH) call wrote: emb_served_checkpoint_dir's folder; when
 * PATH is a step folder's shards/ and that step is an incremental
 * checkpoint (emb_served_increment_at), its chain, verified whole: the full
 * checkpoint's folder restored, then each increment's
 * (emb_served_delta_dir) laid over it in order. */
#ifndef SHARDREC_EMBEDDING_SERVED_H
#define SHARDREC_EMBEDDING_SERVED_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "embedding/ckpt_store.h"
#include "embedding/plan.h"
#include "embedding/store.h"

typedef struct emb_served_opts {
  const char *plan_path;  /* the plan (NULL with checkpoint: the checkpoint's) */
  const char *checkpoint; /* serve a checkpoint's rows (NULL: plan_path's, fresh) */
  const int *shards;      /* [n_shards] shards served (borrowed) */
  int n_shards;
  const char *data_dir;   /* RocksDB rows under data_dir (NULL: in memory, or a
                             checkpoint's temporary copy) */
  uint64_t cache_rows, cache_mb; /* the RocksDB store's cache (0, 0: 256 MiB) */
  const char *restore;    /* restore from Checkpoint(restore)'s folders (NULL: none) */
} emb_served_opts;

/* Which input a failure is about (a command names its flag). */
typedef enum {
  EMB_SERVED_IN_NONE = 0,   /* the store itself */
  EMB_SERVED_IN_PLAN,       /* plan_path (err starts with it) */
  EMB_SERVED_IN_CHECKPOINT, /* the checkpoint (err names the file at fault) */
  EMB_SERVED_IN_SHARD,      /* a shard the checkpoint's plan lacks (err starts with it) */
  EMB_SERVED_IN_RESTORE,    /* the restore folder (err starts with it) */
} emb_served_input;

typedef struct emb_served {
  emb_plan *plan;        /* owned */
  emb_store *store;      /* owned */
  char plan_fp[EMB_FP_HEX];
  /* With a checkpoint: */
  char ckpt_dir[4096];   /* the step-N folder served */
  int64_t step;
  char layout[96];       /* where its rows are, in words */
  int temporary;         /* the rows are a temporary copy, removed by emb_served_close */
  char transform_fp[SR_SHA256_HEX]; /* the data transform it records (emb_ckpt's), "": none */
  emb_ckpt_store cs;         /* its store (cs.store is store) */
  emb_served_input failed; /* on failure: the input at fault */
} emb_served;

/* Open the plan and store of o into *out (emb_served_close). 0 or SR_E*
 * with the reason in err and the input at fault in out->failed; nothing is
 * left open or behind on failure. */
int emb_served_open(const emb_served_opts *o, emb_served *out, char *err, size_t errlen);

/* The folder a shard server serving shards[n] (in that order) hands its
 * store's checkpoint and restore for a Checkpoint or Restore of path, into
 * buf: path itself when the store writes one folder per shard under it
 * (EMB_CKPT_SHARD_FOLDERS: the RocksDB shard store writes path/shard-K),
 * else the server's own folder path/shard-K1-K2... (storage/ckpt_dir.h,
 * ckpt_dir_server_path), so in-memory servers writing table files under one
 * path keep apart. 0, or SR_ERANGE when it does not fit in len. */
int emb_served_checkpoint_dir(const emb_store *store, const int *shards, int n, const char *path,
                              char *buf, size_t len);

/* The i-th folder (from 0) that a Checkpoint(path) of that server writes
 * and a Restore(path) reads: path/shard-K for its i-th shard K
 * (EMB_CKPT_SHARD_FOLDERS), or its one folder path/shard-K1-K2... (i 0).
 * 0; SR_ENOTFOUND past the last; SR_ERANGE when it does not fit in len. */
int emb_served_checkpoint_target(const emb_store *store, const int *shards, int n,
                                 const char *path, int i, char *buf, size_t len);

/* The folder a shard server serving shards[n] (in that order) writes an
 * incremental checkpoint of path into and reads one from (its store's
 * checkpoint_delta and restore_delta, which write table files whatever the
 * store): its own folder path/shard-K1-K2..., for every kind of store. 0,
 * or SR_ERANGE when it does not fit in len. */
int emb_served_delta_dir(const int *shards, int n, const char *path, char *buf, size_t len);

/* 1 when path (a Checkpoint path, resolved) is or lies inside a complete
 * checkpoint's step folder, which is only ever read: that folder into
 * step[len] (storage/ckpt_dir.h, ckpt_dir_step_holding); else 0. */
int emb_served_in_checkpoint(const char *path, char *step, size_t len);

/* 1 when path (a Restore path: a step folder's shards/) holds the rows of an
 * incremental checkpoint: the manifest of the folder above it reads and
 * says so (storage/ckpt_dir.h, "chains"); else 0. Reads that manifest only. */
int emb_served_increment_at(const char *path);

/* Destroy the store (removing a checkpoint's temporary copy) and the plan.
 * NULL-safe; zeroes *s. */
void emb_served_close(emb_served *s);

#endif
