/* Resharding a checkpoint (shardrec reshard): rewrite a checkpoint's
 * embedding shards for another plan of the same model (N shards to M,
 * table-wise to row-wise and back, tables moved between shards) into a new
 * checkpoint folder.
 *
 * The source is a step-N folder or a folder of them (the newest complete
 * one), verified first (every file's size and SHA-256: embedding/ckpt_plan.h),
 * with RocksDB shards or the in-memory stores' table files; the output
 * keeps the layout (its consumers restore only that one). OUT becomes a
 * checkpoint folder holding one complete OUT/step-N (same N). The rows move
 * by embedding/reshard.h (RocksDB scans, SST files, ingestion,
 * verification); dense.bin is copied; the manifest is the source's with the
 * new plan and its fingerprints (emb_ckpt_write_as).
 *
 * Everything is written under OUT.TAG (common/fs.h sr_tmp_tag; those beside
 * OUT whose owner is gone are removed first) and renamed to OUT at the end, so
 * a failure (verification included) leaves nothing at OUT and no OUT.TAG;
 * with force an existing OUT is replaced only after the new one is
 * complete, and only when it is a checkpoint root (storage/ckpt_dir.h,
 * ckpt_dir_check_root): anything else at OUT is refused, force or not,
 * before anything is read or written. */
#ifndef SHARDREC_EMBEDDING_RESHARD_CKPT_H
#define SHARDREC_EMBEDDING_RESHARD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"
#include "embedding/reshard.h"

/* Which input a failure is about (a command names its flag). */
typedef enum {
  RESHARD_IN_NONE = 0, /* the resharding itself (err says "nothing written at OUT") */
  RESHARD_IN_FROM,     /* the source checkpoint (err starts with the path at fault) */
  RESHARD_IN_PLAN,     /* the new plan (err starts with its path) */
  RESHARD_IN_TO,       /* the output folder (err starts with it) */
} reshard_input;

typedef struct reshard_ckpt_stats {
  reshard_stats run;      /* rows, bytes, per-table verification (also on SR_ECHECKSUM) */
  char src_dir[4096];     /* the step-N folder read */
  char out_dir[4096];     /* OUT, trailing slashes dropped */
  int64_t step;
  int src_shards, dst_shards;
  ckpt_shards_layout layout; /* of the source (storage/ckpt_dir.h) */
  double seconds;         /* start to finish: verifying the source and writing the
                             manifest are part of the job */
  reshard_input failed;   /* on failure: the input at fault */
} reshard_ckpt_stats;

typedef struct reshard_ckpt_opts {
  const char *from;      /* the source checkpoint: a step-N folder or a folder of them */
  const char *to;        /* OUT */
  const char *plan_path; /* the new plan (only n_shards and placements may differ) */
  int force;             /* replace an existing OUT once the new one is complete */
  int threads;           /* tables moved side by side (0: the cores, at most 8) */
  int progress;          /* a live line on stderr (rows, MB, rows/s, ETA) */
  /* convert 0: weights stay in their plan's precision; 1: every table of
   * the new checkpoint holds its weights in precision, each rounded to
   * nearest (the new plan's precision fields are set to it). */
  int convert;
  emb_precision precision;
  /* Called once the inputs are checked, before any row moves (st has
   * src_dir, out_dir, step, shard counts and layout); NULL: none. */
  void (*on_start)(const reshard_ckpt_stats *st, void *ctx);
  void *ctx;
  reshard_row_hook row_hook; /* tests only (see reshard.h); NULL otherwise */
  void *row_hook_ctx;
} reshard_ckpt_opts;

/* Reshard o->from into o->to (see above). *st gets the figures (free with
 * reshard_stats_free(&st->run)). 0, or SR_E* with the reason in err and the
 * input at fault in st->failed: the source (not found, torn, damaged:
 * SR_ENOTFOUND / SR_EFORMAT / SR_ECHECKSUM), the plan (unreadable, or
 * another model: SR_EMISMATCH naming the first difference), OUT (exists
 * without force: SR_EEXISTS; not a checkpoint root, or holds the source:
 * SR_EINVAL; too long for
 * the paths made under it: SR_ERANGE, "<OUT's start>...: path too long",
 * before anything is read or written), the
 * resharding (SR_ECHECKSUM when verification fails, naming the table;
 * SR_EIO ...). Nothing is left at OUT or beside it on failure. */
int reshard_checkpoint(const reshard_ckpt_opts *o, reshard_ckpt_stats *st, char *err,
                       size_t errlen);

#endif
