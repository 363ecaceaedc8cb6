/* The plan in a checkpoint's manifest (storage/ckpt_dir.h), and a checkpoint
 * opened for its plan and rows (reshard, serve --checkpoint, predict).
 *
 * The manifest fields this level owns:
 *   model_fingerprint, plan_fingerprint   emb_plan_model_fingerprint and
 *                          emb_plan_fingerprint of the plan;
 *   plan                   its canonical JSON as an object, for people (cJSON
 *                          prints doubles to 15 digits: not exact);
 *   plan_canonical         the exact canonical text the fingerprints hash:
 *                          what is read back;
 *   step                   read (written by the training job).
 * Every other field (the training job's, the dense architecture) is carried
 * as it is. */
#ifndef SHARDREC_EMBEDDING_CKPT_PLAN_H
#define SHARDREC_EMBEDDING_CKPT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "embedding/plan.h"
#include "storage/ckpt_dir.h"

struct cJSON;

/* Set man's plan fields (above) to plan's, replacing any. 0 or SR_ENOMEM. */
int emb_ckpt_set_plan(struct cJSON *man, const emb_plan *plan, char *err, size_t errlen);

/* Parse man's plan_canonical into *plan (caller frees) and check it against
 * the manifest's two fingerprints. src names the manifest in messages.
 * SR_EFORMAT (no plan_canonical or fingerprints, or a plan that does not
 * parse), SR_ECHECKSUM (the plan does not match the fingerprints). */
int emb_ckpt_get_plan(const struct cJSON *man, const char *src, emb_plan **plan, char *err,
                      size_t errlen);

/* A checkpoint opened for its plan and rows. */
typedef struct emb_ckpt {
  char dir[4096];          /* the verified step-N folder */
  emb_plan *plan;          /* the plan it was written under (owned) */
  int64_t step;            /* its step */
  struct cJSON *manifest;  /* the parsed manifest (owned) */
  /* The fingerprint of the data transform the manifest records (the
   * training job's "transform" field), "" when none: checked to be the
   * SHA-256 the file list gives its file (ckpt_dir_fingerprint), which the
   * verification then proves. */
  char transform_fp[SR_SHA256_HEX];
  ckpt_dir_chain chain;    /* its verified chain (chain.n 1: a full checkpoint) */
} emb_ckpt;

/* Resolve path (a step-N folder, or a folder of them: the newest complete
 * one, ckpt_dir_resolve), read and check its manifest (ckpt_dir_read), its
 * step and plan (emb_ckpt_get_plan), then every file's size and SHA-256
 * of every link of its chain (ckpt_dir_chain_open: an incremental head's
 * rows are those of its chain folded, embedding/ckpt_fold.h). 0 or SR_E* with a message naming the file in err;
 * *ck zeroed then. */
int emb_ckpt_open(const char *path, emb_ckpt *ck, char *err, size_t errlen);
void emb_ckpt_close(emb_ckpt *ck); /* NULL-safe; leaves *ck zeroed */

/* 1 when the rows a store checkpointed to shards (a step folder's shards/,
 * the path of a Restore) were written under a smaller plan that plan grows
 * (emb_plan_grows; another model fingerprint), with that plan's model
 * fingerprint in model_fp, for emb_store_restore_grown; else 0 and model_fp
 * "" (the same model, another one, or no manifest that can be read in the
 * step folder: the restore itself then says what is wrong). Reads the step
 * folder's manifest only (ckpt_dir_read). */
int emb_ckpt_grown_from(const char *shards, const emb_plan *plan, char model_fp[EMB_FP_HEX]);

/* Complete a new checkpoint at final (root/step-N, must not exist) from
 * files already written under tmp (same layout as the source's): its
 * manifest is src_manifest's (borrowed; every field carried) with plan's
 * plan fields and tmp's file list; tmp is renamed to final, then DONE
 * written (ckpt_dir_commit). plan must have src_plan's model fingerprint
 * (SR_EMISMATCH). On failure tmp is left for the caller to remove. 0 or
 * SR_E*. */
int emb_ckpt_write_as(const struct cJSON *src_manifest, const emb_plan *src_plan,
                      const emb_plan *plan, const char *tmp, const char *final, char *err,
                      size_t errlen);

#endif
