/* The plan in a checkpoint's manifest (see ckpt_plan.h). */
#include "embedding/ckpt_plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "storage/ckpt_dir.h"

static const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

int emb_ckpt_set_plan(cJSON *man, const emb_plan *plan, char *err, size_t errlen) {
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  char *canon = emb_plan_canonical(plan, 1);
  cJSON *pj = canon ? cJSON_Parse(canon) : NULL;
  if (!pj || emb_plan_model_fingerprint(plan, mfp) || emb_plan_fingerprint(plan, pfp)) {
    cJSON_Delete(pj);
    free(canon);
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(man, "model_fingerprint");
  cJSON_DeleteItemFromObjectCaseSensitive(man, "plan_fingerprint");
  cJSON_DeleteItemFromObjectCaseSensitive(man, "plan");
  cJSON_DeleteItemFromObjectCaseSensitive(man, "plan_canonical");
  cJSON_AddStringToObject(man, "model_fingerprint", mfp);
  cJSON_AddStringToObject(man, "plan_fingerprint", pfp);
  cJSON_AddItemToObject(man, "plan", pj);
  int ok = cJSON_AddStringToObject(man, "plan_canonical", canon) != NULL;
  free(canon);
  if (!ok) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  return 0;
}

int emb_ckpt_get_plan(const cJSON *man, const char *src, emb_plan **plan, char *err,
                      size_t errlen) {
  const char *ptext = jstr(man, "plan_canonical"), *want_m = jstr(man, "model_fingerprint"),
             *want_p = jstr(man, "plan_fingerprint");
  char where[4300], mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  *plan = NULL;
  if (!want_m || !want_p) {
    sr_fmt(err, errlen, "%s: not a checkpoint manifest (missing fields)", src);
    return SR_EFORMAT;
  }
  if (!ptext) {
    sr_fmt(err, errlen, "%s: no plan_canonical (written by an older shardrec)", src);
    return SR_EFORMAT;
  }
  snprintf(where, sizeof where, "%s: plan_canonical", src);
  int rc = emb_plan_parse(ptext, where, plan, err, errlen);
  if (rc) return rc;
  emb_plan_model_fingerprint(*plan, mfp);
  emb_plan_fingerprint(*plan, pfp);
  if (strcmp(mfp, want_m) || strcmp(pfp, want_p)) {
    sr_fmt(err, errlen, "%s: the plan does not match the manifest's fingerprints", src);
    emb_plan_free(*plan);
    *plan = NULL;
    return SR_ECHECKSUM;
  }
  return 0;
}

void emb_ckpt_close(emb_ckpt *ck) {
  if (!ck) return;
  emb_plan_free(ck->plan);
  cJSON_Delete(ck->manifest);
  ckpt_dir_chain_free(&ck->chain);
  memset(ck, 0, sizeof *ck);
}

int emb_ckpt_open(const char *path, emb_ckpt *ck, char *err, size_t errlen) {
  memset(ck, 0, sizeof *ck);
  char src[SR_PATH_MAX];
  int rc = ckpt_dir_resolve(path, ck->dir, sizeof ck->dir, err, errlen);
  if (!rc) rc = sr_path_err(src, sizeof src, err, errlen, "%s/manifest.json", ck->dir);
  if (!rc) rc = ckpt_dir_read(ck->dir, &ck->manifest, err, errlen);
  if (rc) {
    emb_ckpt_close(ck);
    return rc;
  }
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(ck->manifest, "step");
  if (!cJSON_IsNumber(step)) {
    sr_fmt(err, errlen, "%s: not a checkpoint manifest (missing fields)", src);
    rc = SR_EFORMAT;
  }
  if (!rc) rc = emb_ckpt_get_plan(ck->manifest, src, &ck->plan, err, errlen);
  const char *xf_fp; /* the data transform (the training job's field): checked, carried */
  if (!rc) rc = ckpt_dir_fingerprint(ck->manifest, "transform", src, &xf_fp, err, errlen);
  if (!rc) rc = ckpt_dir_chain_open(ck->dir, ck->manifest, 1, &ck->chain, err, errlen);
  if (rc) {
    emb_ckpt_close(ck);
    return rc;
  }
  ck->step = (int64_t)step->valuedouble;
  if (xf_fp) memcpy(ck->transform_fp, xf_fp, SR_SHA256_HEX);
  return 0;
}

int emb_ckpt_write_as(const cJSON *src_manifest, const emb_plan *src_plan, const emb_plan *plan,
                      const char *tmp, const char *final, char *err, size_t errlen) {
  char mfp[EMB_FP_HEX], ofp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_model_fingerprint(src_plan, ofp);
  if (strcmp(mfp, ofp)) {
    sr_fmt(err, errlen, "the new plan's model fingerprint %.12s... differs from the checkpoint's "
           "%.12s...", mfp, ofp);
    return SR_EMISMATCH;
  }
  cJSON *man = cJSON_Duplicate(src_manifest, 1);
  if (!man) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  ckpt_dir_txn t;
  /* final's folder (t.root) is shorter than final. */
  int rc = sr_path_err(t.tmp, sizeof t.tmp, err, errlen, "%s", tmp);
  if (!rc) rc = sr_path_err(t.final, sizeof t.final, err, errlen, "%s", final);
  if (!rc && strlen(final) >= sizeof t.root) rc = sr_path_too_long(err, errlen, final, sizeof t.root);
  if (rc) {
    cJSON_Delete(man);
    return rc;
  }
  rc = ckpt_dir_parent(final, t.root, sizeof t.root)
           ? sr_path_too_long(err, errlen, final, sizeof t.root)
           : emb_ckpt_set_plan(man, plan, err, errlen);
  if (!rc) rc = ckpt_dir_commit(&t, man, err, errlen);
  cJSON_Delete(man);
  return rc;
}

int emb_ckpt_grown_from(const char *shards, const emb_plan *plan, char model_fp[EMB_FP_HEX]) {
  cJSON *man = NULL;
  emb_plan *old = NULL;
  char err[512], why[256], mine[EMB_FP_HEX], dir[SR_PATH_MAX];
  model_fp[0] = 0;
  if (ckpt_dir_parent(shards, dir, sizeof dir) || /* the step folder */
      ckpt_dir_read(dir, &man, err, sizeof err) ||
      emb_ckpt_get_plan(man, dir, &old, err, sizeof err) ||
      emb_plan_model_fingerprint(old, model_fp) || emb_plan_model_fingerprint(plan, mine)) {
    model_fp[0] = 0;
  } else if (!strcmp(model_fp, mine) || !emb_plan_grows(old, plan, why, sizeof why)) {
    model_fp[0] = 0;
  }
  emb_plan_free(old);
  cJSON_Delete(man);
  return model_fp[0] != 0;
}
