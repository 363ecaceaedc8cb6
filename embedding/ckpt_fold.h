/* Folding a chain of checkpoints (storage/ckpt_dir.h's chains: a full
 * checkpoint and the increments after it) into the rows of one full
 * checkpoint: shardrec fold, and every reader of a chain's head (reshard,
 * serve --checkpoint, predict, eval: embedding/ckpt_store.h).
 *
 * The rows are folded through the stores that wrote them: a store restored
 * from the full checkpoint's shards/ (emb_store_restore), each increment's
 * shards/ laid over it in order (emb_store_restore_delta), then written
 * with its full checkpoint op. By layout of the full checkpoint's shards/:
 *   table files (the in-process store): one in-memory store; the table
 *     files it writes are, byte for byte, those a full checkpoint of the
 *     same rows has;
 *   in-memory servers' folders (shard-K[-K2...]): the same per folder, each
 *     increment's rows in its folder of the same name;
 *   RocksDB databases (the shard store, servers with --data-dir): the shard
 *     store over a work folder, restore_delta reading each increment's
 *     shards/ as that store lays one; the databases it writes hold the same
 *     rows as a full checkpoint's, not the same files. */
#ifndef SHARDREC_EMBEDDING_CKPT_FOLD_H
#define SHARDREC_EMBEDDING_CKPT_FOLD_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/ckpt_plan.h"
#include "embedding/plan.h"
#include "storage/ckpt_dir.h"

/* The rows of chain (verified; dirs[0] the full checkpoint) written under
 * plan (the chain's) into the folder out_shards (made here, must not exist),
 * in the full checkpoint's layout; work: a scratch folder for the RocksDB
 * layout (made and removed here). 0 or SR_E* naming the link and file. */
int emb_ckpt_fold_rows(const ckpt_dir_chain *chain, const emb_plan *plan, const char *out_shards,
                       const char *work, char *err, size_t errlen);

/* Fold the checkpoint ck (emb_ckpt_open's) into the complete full
 * checkpoint root/step-N (ckpt_dir_begin: root made if missing): the
 * head's dense.bin, transform.bin and keep.bin, its chain's rows folded, the head's
 * manifest made full (ckpt_dir_make_full: "kind" "full", no "parent").
 * ck may be full already (its rows are then written again the same way).
 * 0 or SR_E*; on failure root's .step-N.TAG is removed. */
int emb_ckpt_fold(const emb_ckpt *ck, const char *root, char *err, size_t errlen);

/* shardrec fold: the checkpoint from (a step-N folder or a folder of them:
 * the newest complete one) folded into the checkpoint root to, written
 * under to.TAG beside it and put in its place (ckpt_dir_replace): to must
 * not exist, or be a checkpoint root when force is set, and must not hold
 * from. *step gets the step. 0 or SR_E* (SR_EEXISTS: to exists and force
 * is not set; SR_EINVAL: to is something else or holds from). */
int emb_ckpt_fold_to(const char *from, const char *to, int force, int64_t *step, char *err,
                     size_t errlen);

#endif
