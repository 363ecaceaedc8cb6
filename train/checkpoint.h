/* Training checkpoints (shardrec train --save-checkpoint, --save-model / --resume).
 *
 * A checkpoint is DIR/step-N/ holding
 *   manifest.json  format, plan (canonical JSON) and both fingerprints, step,
 *                  data position (epoch and the sample index after the last
 *                  batch the trainer consumed, within the train split), the
 *                  learning-rate schedule position (= step), the progress
 *                  line's running loss figures, RNG state (none:
 *                  the trainer draws no random numbers after init), the
 *                  optimizer settings, the store kind, and every other file
 *                  with its size and SHA-256;
 *   keep.bin       the bounded tables' counts, last steps and admitted ids
 *                  (train/keep.h; only when the plan bounds a table);
 *   dense.bin      dense parameters and dense optimizer state, SRCKDENS v1
 *                  (dense/state_file.h: 256-byte header, the floats, SHA-256
 *                  trailer);
 *   transform.bin  the data transform the model was trained with
 *                  (datasets/transform.h: id mode, dictionaries, dense
 *                  transform); the manifest's "transform" holds its
 *                  fingerprint (the file's SHA-256) and a summary. Absent
 *                  when the ids were not mapped from raw values by shardrec
 *                  (the reference's int32 files), and in checkpoints
 *                  written before models carried their mapping;
 *   shards/        the store's checkpoint: shards/shard-K/ (a RocksDB
 *                  checkpoint per hosted shard) for the shard store, the
 *                  local store's table-<id>.bin files for the in-memory one;
 *   DONE           written last; holds the manifest's SHA-256.
 * The manifest's "kind" says whether shards/ holds every row ("full") or
 * the rows changed since its parent ("incremental", with "parent": its
 * step and DONE; storage/ckpt_dir.h's chains): an incremental checkpoint's
 * rows are its chain's, the full checkpoint restored and each increment
 * laid over it (train_ckpt_restore_chain); dense.bin is always whole.
 * The folder protocol (the temporary .step-N.tmp-PID folder and its
 * rename, DONE last, the file list, finding the newest complete step-N,
 * verification, keeping the newest K) is storage/ckpt_dir.h's; the plan
 * fields are embedding/ckpt_plan.h's. A folder without DONE is never taken
 * by --resume DIR and is refused when named directly. */
#ifndef SHARDREC_TRAIN_CHECKPOINT_H
#define SHARDREC_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "datasets/transform.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "storage/ckpt_dir.h"

typedef struct train_ckpt_state {
  int64_t step;          /* steps done */
  int epoch;             /* epoch of the last consumed batch */
  uint64_t sample_index; /* next sample of the train split to read in that epoch */
  /* The progress line's running figures after this step (so that a resumed
   * job's --metrics-out lines are the uninterrupted job's): the sum and
   * count of the step losses since the line before, and this step's loss.
   * A checkpoint written before they were recorded reads as 0, 0, 0. */
  double loss_sum;
  int64_t loss_n;
  float last_loss;
  /* Bounded tables' entries (train/keep.h), borrowed: train_ckpt_save
   * writes them to KEEP_FILE beside dense.bin; NULL: none. Never set by a
   * load (the job reads KEEP_FILE itself: keep_load). */
  const struct keep *keep;
} train_ckpt_state;

/* Settings recorded in the manifest (and checked where a mismatch would make
 * the resumed run differ: batch size, dense optimizer). */
typedef struct train_ckpt_settings {
  const char *dense_optimizer, *sparse_optimizer;
  double lr, sparse_lr;
  int64_t warmup, decay_start, decay_steps, batch;
  /* What can still change the dense bits (recorded, never refused: a
   * resume elsewhere warns, train_ckpt_kernels_differ): the dense kernel set
   * (dense_backend_kernels), OpenBLAS's version and its core (kernel
   * family). NULL: not recorded. */
  const char *dense_kernels, *blas_version, *blas_core;
  /* What identifies the training data (ds_source_identity): a resume on
   * other data reads it from its beginning (train_ckpt_data_differs). NULL:
   * not recorded. */
  const char *data_identity;
} train_ckpt_settings;

/* The longest name a checkpoint holds under its step folder
 * ("shards/shard-K/OPTIONS-000012.dbtmp", "shards/table-<id>.bin"), with
 * room to spare. */
#define TRAIN_CKPT_NAME_ROOM 64

/* The characters train_ckpt_save needs after its root: "/.step-N.TAG/" with
 * the widest N and tag (SR_TMP_TAG_MAX), and TRAIN_CKPT_NAME_ROOM. */
size_t train_ckpt_root_room(void);

/* Whether root leaves room for every path train_ckpt_save makes under it
 * (train_ckpt_root_room within SR_PATH_MAX): 0, or SR_ERANGE with "<root's
 * start>...: path too long" in err. */
int train_ckpt_root_check(const char *root, char *err, size_t errlen);

/* 1 when dir is a saved-model folder of the format before --save-model
 * wrote checkpoints: model.json beside no manifest.json, and nothing but
 * model.json, plan.json, dense.bin and rows/. eval and predict refuse one
 * (save it again); train --save-model replaces one as of its own kind. */
int train_ckpt_is_old_model(const char *dir);

/* Write DIR/step-<st->step>/ (see above; xf NULL: no transform.bin), a full
 * checkpoint, then keep only the newest keep complete checkpoints with
 * their chains (keep <= 0: all; ckpt_dir_keep). A complete step-N already
 * there is kept as is. 0 or SR_E* with the reason in err; SR_ERANGE
 * (train_ckpt_root_check) before anything is made when DIR is too long for
 * its files' paths. */
int train_ckpt_save(const char *root, int keep, const emb_plan *plan, emb_store *store,
                    const char *store_kind, dense_model *model, dense_opt *opt,
                    const ds_transform *xf, const train_ckpt_state *st,
                    const train_ckpt_settings *set, char *err, size_t errlen);

/* train_ckpt_save, incremental on DIR/step-<*parent> when *parent >= 0: its
 * shards/ the rows the store's change set holds (emb_store_checkpoint_delta:
 * the rows pushed since the store's last checkpoint, which must be that
 * parent), the manifest's "kind" "incremental" and "parent" its step and
 * DONE (ckpt_dir_set_kind); dense.bin and transform.bin whole. A full one
 * instead when the parent is not complete under DIR (*parent set to -1) or
 * the store has no incremental ops (SR_EUNSUPPORTED: *parent set to -2).
 * A complete step-N already there is kept as is, nothing written (*parent
 * set to -3). */
int train_ckpt_save_link(const char *root, int keep, long long *parent, const emb_plan *plan,
                         emb_store *store, const char *store_kind, dense_model *model,
                         dense_opt *opt, const ds_transform *xf, const train_ckpt_state *st,
                         const train_ckpt_settings *set, char *err, size_t errlen);


/* The checkpoint folder --resume path names: path itself when it is a step
 * folder (has manifest.json or is named step-N), else the newest complete
 * step-N under it (ckpt_dir_resolve). 0 or SR_ENOTFOUND with the reason in
 * err; SR_ERANGE when path or the folder found does not fit (out is then
 * ""). */
int train_ckpt_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen);

/* Check the checkpoint dir (DONE, manifest, fingerprints against plan or a
 * plan that grows the checkpoint's (emb_plan_grows: its rows restored as
 * they are, the new rows never written: emb_store_restore_grown), store
 * kind, settings, every file's size and SHA-256 of its whole chain:
 * train_ckpt_open), then load the dense model and optimizer and restore
 * store from it (its chain: train_ckpt_restore_chain) (store NULL: the dense part only,
 * as ranks other than 0 of a data-parallel job do; store_kind NULL: any
 * kind). A manifest that records the dense architecture must match model's.
 * Nothing is changed when a check fails. 0 or SR_E* with a message naming the file and the problem
 * (SR_ERANGE: dir is too long for its files' paths). */
int train_ckpt_load(const char *dir, const emb_plan *plan, emb_store *store,
                    const char *store_kind, dense_model *model, dense_opt *opt,
                    const train_ckpt_settings *set, train_ckpt_state *st, char *err, size_t errlen);

/* Whether the checkpoint dir was written with other dense kernels, another
 * OpenBLAS version or another OpenBLAS core than set records: 1 with
 * "<dir> was written with ...; this run has ..." (both values) in msg, 0
 * when they are the same or the checkpoint does not record them (or cannot
 * be read: train_ckpt_load has said why). */
int train_ckpt_kernels_differ(const char *dir, const train_ckpt_settings *set, char *msg,
                              size_t len);

/* Whether the checkpoint dir was trained on other data than set's
 * data_identity: 1 with "<dir> was trained on other data (...; this run's
 * ...)" in msg, 0 when the same or not recorded on either side. */
int train_ckpt_data_differs(const char *dir, const train_ckpt_settings *set, char *msg,
                            size_t len);

/* A verified training checkpoint, read without a model or store (predict;
 * reshard and serve --checkpoint need only its plan and rows:
 * embedding/ckpt_plan.h's emb_ckpt_open). */
typedef struct train_ckpt_info {
  char dir[4096];
  emb_plan *plan;      /* the plan it was written under (owned) */
  train_ckpt_state st;       /* step and data position */
  char store_kind[16]; /* "local", "shard" or "remote" */
  int has_dense;       /* the manifest records the dense architecture */
  dense_config dense;  /* then: it (max_batch 1: set yours before dense_model_create) */
  int64_t batch;       /* --mini-batch-size it was trained with */
  char transform_fp[SR_SHA256_HEX]; /* its data transform's fingerprint; "": none */
  void *manifest;      /* the parsed manifest (cJSON *), owned */
  long long parent;    /* the step of its parent (-1: a full checkpoint) */
  ckpt_dir_chain chain; /* its verified chain: chain.dirs[0] the full checkpoint, the last dir */
} train_ckpt_info;

/* Verify dir as train_ckpt_load does (DONE, manifest checksum, format:
 * ckpt_dir_read; the training job's fields and settings, the plan against
 * its fingerprints; every file's size and SHA-256 of every link of its
 * chain, each parent the one its child names: ckpt_dir_chain_open, into
 * ci->chain; the dense architecture) and read it into *ci (train_ckpt_info_free). 0 or SR_E*
 * with a message naming the file. */
int train_ckpt_open(const char *dir, train_ckpt_info *ci, char *err, size_t errlen);
void train_ckpt_info_free(train_ckpt_info *ci); /* NULL-safe; leaves *ci zeroed */

/* Restore store from the chain of ci (train_ckpt_open's, verified):
 * emb_store_restore of its full checkpoint's shards/, then
 * emb_store_restore_delta of each increment's, in order. 0 or SR_E* naming
 * the link (SR_EUNSUPPORTED: a store without the incremental ops and a
 * chain of more than one link). A failure after the first link leaves the
 * rows of the links before it. */
int train_ckpt_restore_chain(const train_ckpt_info *ci, emb_store *store, char *err,
                             size_t errlen);

/* The data transform of the checkpoint ci (train_ckpt_open's), read from
 * its transform.bin and checked against the manifest's fingerprint. 0 and a
 * new transform in *out (ds_transform_free); SR_ENOTFOUND when it records
 * none ("DIR records no data transform ..."); SR_E* naming the file. */
int train_ckpt_transform(const train_ckpt_info *ci, ds_transform **out, char *err, size_t errlen);

/* The plan and data transform of the checkpoint path (a step folder, or a
 * folder of them: the newest complete one), read before a resume opens its
 * data: the manifest (ckpt_dir_read: DONE's checksum) and its plan against
 * its fingerprints, transform.bin against the manifest's fingerprint; the
 * other files are verified by train_ckpt_load. 0 with a new plan in *plan
 * and a new transform in *xf (NULL: the checkpoint records none), or SR_E*
 * naming the file (*plan and *xf NULL). */
int train_ckpt_mapping(const char *path, emb_plan **plan, ds_transform **xf, char *err,
                       size_t errlen);

/* The dense architecture the checkpoint path (a step folder, or a folder of
 * them: the newest complete one) records, read from its manifest alone
 * (ckpt_dir_read: DONE's checksum; the other files are verified by
 * train_ckpt_load), before a resume builds its model. 0 with *has 1 and
 * the architecture in *cfg (max_batch 1), 0 with *has 0 when it records
 * none (written by an older shardrec), or SR_E* naming the file. */
int train_ckpt_dense(const char *path, int *has, dense_config *cfg, char *err, size_t errlen);

/* How the mapping xf of the data a resume reads relates to the checkpoint's
 * ck_xf (ds_transform_compare; ckpt and data name both in messages): the
 * same, or either NULL (nothing to compare): 0, *grow 0; xf extends ck_xf
 * (the data was converted with --mapping-from CKPT --extend-dictionaries):
 * 0, *grow 1 and "mapping <fp> extends the checkpoint's <fp> (why)" in msg;
 * another mapping: SR_EMISMATCH with both fingerprints, the first
 * difference and "convert it with --mapping-from CKPT" in msg. */
int train_ckpt_mapping_check(const ds_transform *ck_xf, const ds_transform *xf, const char *ckpt,
                             const char *data, int *grow, char *msg, size_t len);

/* The plan a --resume of checkpoint ckpt (a step folder or a folder of them)
 * on the converted file data runs under: the checkpoint's plan with each
 * bounded table's rows raised to data's table sizes (emb_plan_grow; the
 * same plan when data's mapping is the checkpoint's). 0 and a new plan in
 * *out; SR_EMISMATCH when data's mapping is not the checkpoint's or one
 * extending it (train_ckpt_mapping_check), SR_ENOTFOUND when the checkpoint
 * records no mapping, SR_E* naming the file. */
int train_ckpt_grown_plan(const char *ckpt, const char *data, emb_plan **out, char *err,
                          size_t errlen);

/* emb_ckpt_write_as (embedding/ckpt_plan.h) with src's manifest and plan:
 * a new checkpoint at final (a step-N folder that must not exist) from
 * files already written under tmp (dense.bin and shards/, same layout as
 * train_ckpt_save's), its manifest src's with plan's plan fields and tmp's file
 * list. plan must have src's model fingerprint (SR_EMISMATCH). On failure
 * tmp is left for the caller to remove. 0 or SR_E*. */
int train_ckpt_write_as(const train_ckpt_info *src, const emb_plan *plan, const char *tmp,
                        const char *final, char *err, size_t errlen);


#endif
