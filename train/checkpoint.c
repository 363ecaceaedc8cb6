/* Training checkpoints and the trainer's store (see checkpoint.h). */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "datasets/source.h"
#include "embedding/ckpt_plan.h"
#include "train/keep.h"
#include "dense/state_file.h"
#include "storage/ckpt_dir.h"

/* ---- the dense architecture (the manifest's "dense") ---- */

static const char *interaction_name(int interaction) {
  return interaction == DENSE_INTERACT_CAT ? "cat" : interaction == DENSE_INTERACT_DCN ? "dcn" : "dot";
}

/* The manifest's dcn_layers and dcn_rank into cfg (dcn only); 1 if bad. */
static int arch_parse_dcn(const cJSON *j, dense_config *cfg) {
  if (cfg->interaction != DENSE_INTERACT_DCN) return 0;
  const cJSON *l = cJSON_GetObjectItem(j, "dcn_layers"), *r = cJSON_GetObjectItem(j, "dcn_rank");
  if (!cJSON_IsNumber(l) || !cJSON_IsNumber(r)) return 1;
  cfg->dcn_layers = l->valueint, cfg->dcn_rank = r->valueint;
  return 0;
}

static cJSON *arch_json(const dense_config *cfg) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddNumberToObject(j, "format", 1);
  cJSON_AddNumberToObject(j, "n_dense", cfg->n_dense);
  cJSON_AddItemToObject(j, "bot", cJSON_CreateIntArray(cfg->bot, cfg->n_bot));
  cJSON_AddItemToObject(j, "top", cJSON_CreateIntArray(cfg->top, cfg->n_top));
  cJSON_AddNumberToObject(j, "n_sparse", cfg->n_sparse);
  cJSON_AddNumberToObject(j, "emb_dim", cfg->emb_dim);
  cJSON_AddStringToObject(j, "interaction", interaction_name(cfg->interaction));
  cJSON_AddBoolToObject(j, "interaction_itself", cfg->interaction_itself);
  if (cfg->interaction == DENSE_INTERACT_DCN) {
    cJSON_AddNumberToObject(j, "dcn_layers", cfg->dcn_layers);
    cJSON_AddNumberToObject(j, "dcn_rank", cfg->dcn_rank);
  }
  return j;
}

static int json_int_array(const cJSON *a, int *out, int max, int *n) {
  if (!cJSON_IsArray(a)) return -1;
  *n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (!cJSON_IsNumber(e) || *n >= max || e->valuedouble < 1) return -1;
    out[(*n)++] = e->valueint;
  }
  return *n > 0 ? 0 : -1;
}

/* arch_json's object back into cfg (max_batch left as the caller set it),
 * validated; src names the text in messages. 0 or SR_EFORMAT/SR_EINVAL. */
static int arch_parse(const cJSON *j, const char *src, dense_config *cfg, char *err,
                      size_t errlen) {
  int max_batch = cfg->max_batch;
  memset(cfg, 0, sizeof *cfg);
  cfg->max_batch = max_batch;
  const cJSON *x;
  int bad = !j;
  if (!bad) {
    bad |= !cJSON_IsNumber(x = cJSON_GetObjectItem(j, "n_dense"));
    if (!bad) cfg->n_dense = x->valueint;
    bad |= json_int_array(cJSON_GetObjectItem(j, "bot"), cfg->bot, DENSE_MAX_LAYERS, &cfg->n_bot);
    bad |= json_int_array(cJSON_GetObjectItem(j, "top"), cfg->top, DENSE_MAX_LAYERS, &cfg->n_top);
    bad |= !cJSON_IsNumber(x = cJSON_GetObjectItem(j, "n_sparse"));
    if (!bad) cfg->n_sparse = x->valueint;
    bad |= !cJSON_IsNumber(x = cJSON_GetObjectItem(j, "emb_dim"));
    if (!bad) cfg->emb_dim = x->valueint;
    x = cJSON_GetObjectItem(j, "interaction");
    bad |= !cJSON_IsString(x);
    if (!bad) cfg->interaction = !strcmp(x->valuestring, "cat")   ? DENSE_INTERACT_CAT
                                 : !strcmp(x->valuestring, "dcn") ? DENSE_INTERACT_DCN
                                                                  : DENSE_INTERACT_DOT;
    cfg->interaction_itself = cJSON_IsTrue(cJSON_GetObjectItem(j, "interaction_itself"));
    if (!bad) bad |= arch_parse_dcn(j, cfg);
  }
  if (bad) {
    sr_fmt(err, errlen, "%s: not a valid model description", src);
    return SR_EFORMAT;
  }
  return dense_config_validate(cfg, err, errlen);
}

/* ---- save ---- */

static cJSON *settings_json(const train_ckpt_settings *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "dense_optimizer", s->dense_optimizer);
  cJSON_AddStringToObject(o, "sparse_optimizer", s->sparse_optimizer);
  cJSON_AddNumberToObject(o, "learning_rate", s->lr);
  cJSON_AddNumberToObject(o, "sparse_learning_rate", s->sparse_lr);
  cJSON_AddNumberToObject(o, "lr_num_warmup_steps", (double)s->warmup);
  cJSON_AddNumberToObject(o, "lr_decay_start_step", (double)s->decay_start);
  cJSON_AddNumberToObject(o, "lr_num_decay_steps", (double)s->decay_steps);
  cJSON_AddNumberToObject(o, "mini_batch_size", (double)s->batch);
  if (s->dense_kernels) cJSON_AddStringToObject(o, "dense_kernels", s->dense_kernels);
  if (s->blas_version) cJSON_AddStringToObject(o, "openblas_version", s->blas_version);
  if (s->blas_core) cJSON_AddStringToObject(o, "openblas_core", s->blas_core);
  if (s->data_identity) cJSON_AddStringToObject(o, "data_identity", s->data_identity);
  return o;
}

/* The training job's manifest: format (ckpt_dir), step, data position,
 * schedule, RNG, plan, store kind, settings, dense architecture; the file
 * list is added by ckpt_dir_commit. NULL with the reason in err. */
/* The manifest's "transform": the fingerprint fp of xf and a summary. */
static cJSON *transform_json(const ds_transform *xf, const char *fp) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  uint64_t kept[DS_NUM_SPARSE] = {0};
  for (int c = 0; xf->dict && c < DS_NUM_SPARSE; c++) ds_criteo_dict_values(xf->dict, c, &kept[c]);
  double k[DS_NUM_SPARSE];
  for (int c = 0; c < DS_NUM_SPARSE; c++) k[c] = (double)kept[c];
  cJSON_AddStringToObject(o, "fingerprint", fp);
  cJSON_AddStringToObject(o, "file", DS_XFORM_FILE);
  cJSON_AddStringToObject(o, "id_mode", ds_id_mode_name(xf->id_mode));
  cJSON_AddNumberToObject(o, "max_ind_range", (double)xf->max_ind_range);
  cJSON_AddNumberToObject(o, "frequency_threshold", xf->frequency_threshold);
  cJSON_AddNumberToObject(o, "unseen_id", DS_XFORM_UNSEEN_ID);
  cJSON_AddStringToObject(o, "dense", "log1p");
  cJSON_AddItemToObject(o, "kept_values", cJSON_CreateDoubleArray(k, DS_NUM_SPARSE));
  return o;
}

static cJSON *job_manifest(const emb_plan *plan, const char *store_kind, dense_model *model,
                           const ds_transform *xf, const char *xf_fp,
                           const train_ckpt_state *st, const train_ckpt_settings *set, char *err,
                           size_t errlen) {
  cJSON *man = ckpt_dir_manifest_new();
  if (!man) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return NULL;
  }
  cJSON_AddNumberToObject(man, "step", (double)st->step);
  cJSON_AddNumberToObject(man, "epoch", st->epoch);
  cJSON_AddNumberToObject(man, "sample_index", (double)st->sample_index);
  cJSON_AddNumberToObject(man, "lr_schedule_step", (double)st->step);
  cJSON_AddNullToObject(man, "rng");
  cJSON *pr = cJSON_AddObjectToObject(man, "progress");
  if (pr) {
    cJSON_AddNumberToObject(pr, "loss_sum", st->loss_sum);
    cJSON_AddNumberToObject(pr, "loss_n", (double)st->loss_n);
    cJSON_AddNumberToObject(pr, "last_loss", (double)st->last_loss);
  }
  if (emb_ckpt_set_plan(man, plan, err, errlen)) {
    cJSON_Delete(man);
    return NULL;
  }
  cJSON_AddStringToObject(man, "store", store_kind);
  cJSON_AddItemToObject(man, "settings", settings_json(set));
  cJSON *arch = arch_json(dense_model_config(model));
  if (arch) cJSON_AddItemToObject(man, "dense", arch);
  if (xf) cJSON_AddItemToObject(man, "transform", transform_json(xf, xf_fp));
  return man;
}

size_t train_ckpt_root_room(void) {
  /* The temporary step folder with the widest step and pid, and a name. */
  char widest[64];
  return (size_t)snprintf(widest, sizeof widest, "/.step-%lld./", LLONG_MAX) +
         (SR_TMP_TAG_MAX - 1) + TRAIN_CKPT_NAME_ROOM;
}

int train_ckpt_root_check(const char *root, char *err, size_t errlen) {
  size_t room = train_ckpt_root_room();
  return strlen(root) + room < SR_PATH_MAX ? 0
                                           : sr_path_too_long(err, errlen, root, SR_PATH_MAX - room);
}

int train_ckpt_is_old_model(const char *dir) {
  static const char *const names[] = {"dense.bin", "model.json", "plan.json", "rows"};
  char **have;
  int n, ok = 0;
  if (sr_list_dir(dir, &have, &n)) return 0;
  for (int i = 0; i < n; i++) {
    int known = 0;
    for (int k = 0; k < 4; k++) known |= !strcmp(have[i], names[k]);
    if (!known) {
      ok = -1;
      break;
    }
    ok |= !strcmp(have[i], "model.json");
  }
  sr_paths_free(have, n);
  return ok == 1;
}

/* The store's rows under t's shards/: the rows changed since the
 * checkpoint root/step-<*parent> (its DONE into parent_sha) when *parent >=
 * 0 and the store has the incremental ops, else every row (*parent set to
 * -1). */
static int save_rows(const char *root, const ckpt_dir_txn *t, emb_store *store, long long *parent,
                     char *parent_sha, char *err, size_t errlen) {
  char path[SR_PATH_MAX], pdir[SR_PATH_MAX], e2[SR_PATH_MAX + 64];
  int rc = sr_path_err(path, sizeof path, err, errlen, "%s/shards", t->tmp);
  if (rc) return rc;
  if (*parent >= 0 && (sr_path(pdir, sizeof pdir, "%s/step-%lld", root, *parent) ||
                       ckpt_dir_done(pdir, parent_sha, e2, sizeof e2)))
    *parent = -1; /* the parent is gone: a full one */
  if (*parent >= 0) {
    rc = emb_store_checkpoint_delta(store, path);
    if (rc != SR_EUNSUPPORTED) {
      if (rc) sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
      return rc;
    }
    *parent = -2; /* the store has no incremental ops */
  }
  if ((rc = emb_store_checkpoint(store, path))) sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
  return rc;
}

int train_ckpt_save(const char *root, int keep, const emb_plan *plan, emb_store *store,
                    const char *store_kind, dense_model *model, dense_opt *opt,
                    const ds_transform *xf, const train_ckpt_state *st,
                    const train_ckpt_settings *set, char *err, size_t errlen) {
  long long parent = -1;
  return train_ckpt_save_link(root, keep, &parent, plan, store, store_kind, model, opt, xf, st,
                              set, err, errlen);
}

int train_ckpt_save_link(const char *root, int keep, long long *parent, const emb_plan *plan,
                         emb_store *store, const char *store_kind, dense_model *model,
                         dense_opt *opt, const ds_transform *xf, const train_ckpt_state *st,
                         const train_ckpt_settings *set, char *err, size_t errlen) {
  ckpt_dir_txn t;
  char xf_fp[SR_SHA256_HEX] = "", parent_sha[65] = "";
  char path[SR_PATH_MAX];
  /* Every path below fits before anything is made. */
  int exists = 0, rc = train_ckpt_root_check(root, err, errlen);
  if (!rc) rc = ckpt_dir_begin(root, st->step, &t, &exists, err, errlen);
  if (rc) return rc;
  if (exists) {
    *parent = -3; /* this step is saved already: kept as it is */
    return 0;
  }
  cJSON *man = NULL;
  if ((rc = sr_path_err(path, sizeof path, err, errlen, "%s/dense.bin", t.tmp)) ||
      (rc = dense_state_save(path, model, opt, err, errlen)))
    goto fail;
  if (xf && ((rc = sr_path_err(path, sizeof path, err, errlen, "%s/" DS_XFORM_FILE, t.tmp)) ||
             (rc = ds_transform_save(xf, path, xf_fp, err, errlen))))
    goto fail;
  if (st->keep && ((rc = sr_path_err(path, sizeof path, err, errlen, "%s/" KEEP_FILE, t.tmp)) ||
                   (rc = keep_save(st->keep, path, err, errlen))))
    goto fail;
  if ((rc = save_rows(root, &t, store, parent, parent_sha, err, errlen))) goto fail;
  if (!(man = job_manifest(plan, store_kind, model, xf, xf_fp, st, set, err, errlen)) ||
      ckpt_dir_set_kind(man, *parent, parent_sha)) {
    sr_fmt(err, errlen, "%s: manifest: out of memory", t.tmp);
    rc = SR_ENOMEM;
    goto fail;
  }
  if ((rc = ckpt_dir_commit(&t, man, err, errlen))) goto fail;
  /* Keep the newest keep complete ones. */
  ckpt_dir_keep(root, keep);
  cJSON_Delete(man);
  return 0;
fail:
  ckpt_dir_abort(&t); /* nothing there once renamed: a step-N without DONE stays, never taken */
  cJSON_Delete(man);
  return rc;
}

/* ---- resume ---- */

int train_ckpt_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
  return ckpt_dir_resolve(path, out, outlen, err, errlen);
}

static const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
static int jnum(const cJSON *o, const char *k, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(v)) return -1;
  *out = v->valuedouble;
  return 0;
}

int train_ckpt_kernels_differ(const char *dir, const train_ckpt_settings *set, char *msg,
                              size_t len) {
  cJSON *man = NULL;
  char err[256];
  if (ckpt_dir_read(dir, &man, err, sizeof err)) return 0;
  const cJSON *sj = cJSON_GetObjectItemCaseSensitive(man, "settings");
  const char *k = jstr(sj, "dense_kernels"), *v = jstr(sj, "openblas_version"),
             *c = jstr(sj, "openblas_core");
  int differ = k && v && c && set->dense_kernels && set->blas_version && set->blas_core &&
               (strcmp(k, set->dense_kernels) || strcmp(v, set->blas_version) ||
                strcmp(c, set->blas_core));
  if (differ)
    sr_fmt(msg, len, "%s was written with dense kernels %s, OpenBLAS %s, core %s; this run has "
           "dense kernels %s, OpenBLAS %s, core %s: the steps from here will not be the same bits "
           "as the run that wrote it (--dense-isa picks the kernels, OPENBLAS_CORETYPE the core)",
           dir, k, v, c, set->dense_kernels, set->blas_version, set->blas_core);
  cJSON_Delete(man);
  return differ;
}

int train_ckpt_data_differs(const char *dir, const train_ckpt_settings *set, char *msg,
                            size_t len) {
  cJSON *man = NULL;
  char err[256];
  if (ckpt_dir_read(dir, &man, err, sizeof err)) return 0;
  const char *d = jstr(cJSON_GetObjectItemCaseSensitive(man, "settings"), "data_identity");
  int differ = d && set->data_identity && !ds_source_identity_same(d, set->data_identity);
  if (differ)
    sr_fmt(msg, len, "%s was trained on other data (%s; this run's: %s)", dir, d,
           set->data_identity);
  cJSON_Delete(man);
  return differ;
}

void train_ckpt_info_free(train_ckpt_info *ci) {
  if (!ci) return;
  emb_plan_free(ci->plan);
  cJSON_Delete((cJSON *)ci->manifest);
  ckpt_dir_chain_free(&ci->chain);
  memset(ci, 0, sizeof *ci);
}

/* The manifest's "transform" (absent: none) into ci->transform_fp, its
 * fingerprint the SHA-256 the file list gives its file. */
static int transform_field(const cJSON *man, const char *path, train_ckpt_info *ci, char *err,
                           size_t errlen) {
  const char *fp;
  int rc = ckpt_dir_fingerprint(man, "transform", path, &fp, err, errlen);
  if (!rc && fp) memcpy(ci->transform_fp, fp, SR_SHA256_HEX);
  return rc;
}

/* The training job's fields of a manifest ckpt_dir_read accepted, into ci
 * (the plan, checked against its fingerprints, included). */
static int job_fields(const cJSON *man, const char *path, train_ckpt_info *ci, char *err,
                      size_t errlen) {
  double step, epoch, sample, batch;
  const char *kind = jstr(man, "store");
  if (jnum(man, "step", &step) || jnum(man, "epoch", &epoch) ||
      jnum(man, "sample_index", &sample) || !jstr(man, "model_fingerprint") ||
      !jstr(man, "plan_fingerprint") || !kind || strlen(kind) >= sizeof ci->store_kind) {
    sr_fmt(err, errlen, "%s: not a checkpoint manifest (missing fields)", path);
    return SR_EFORMAT;
  }
  int rc = emb_ckpt_get_plan(man, path, &ci->plan, err, errlen);
  if (rc) return rc;
  const cJSON *sj = cJSON_GetObjectItemCaseSensitive(man, "settings");
  if (!sj || jnum(sj, "mini_batch_size", &batch) || !jstr(sj, "dense_optimizer")) {
    sr_fmt(err, errlen, "%s: no settings", path);
    return SR_EFORMAT;
  }
  snprintf(ci->store_kind, sizeof ci->store_kind, "%s", kind);
  ci->st.step = (int64_t)step;
  ci->st.epoch = (int)epoch;
  ci->st.sample_index = (uint64_t)sample;
  ci->batch = (int64_t)batch;
  /* The progress figures: absent in a checkpoint written before they were
   * recorded (its resumed job starts the running mean afresh). */
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(man, "progress");
  double sum, n, last;
  if (pr && (jnum(pr, "loss_sum", &sum) || jnum(pr, "loss_n", &n) || jnum(pr, "last_loss", &last) ||
             n < 0 || n > step)) {
    sr_fmt(err, errlen, "%s: progress: loss_sum, loss_n (0..step) and last_loss are not all "
           "numbers", path);
    return SR_EFORMAT;
  }
  if (pr) {
    ci->st.loss_sum = sum;
    ci->st.loss_n = (int64_t)n;
    ci->st.last_loss = (float)last;
  }
  return transform_field(man, path, ci, err, errlen);
}

int train_ckpt_open(const char *dir, train_ckpt_info *ci, char *err, size_t errlen) {
  char path[SR_PATH_MAX];
  cJSON *man = NULL;
  memset(ci, 0, sizeof *ci);
  /* Its name is kept in ci->dir; its files' names fit. */
  int rc = sr_path_err(ci->dir, sizeof ci->dir, err, errlen, "%s", dir);
  if (!rc) rc = sr_path_err(path, sizeof path, err, errlen, "%s/manifest.json", dir);
  if (!rc) rc = ckpt_dir_read(dir, &man, err, errlen);
  if (rc) {
    memset(ci, 0, sizeof *ci);
    return rc;
  }
  if ((rc = job_fields(man, path, ci, err, errlen))) goto out;
  /* Every file of every link of its chain: present, its size, its
   * checksum; each parent the one its child names. */
  if ((rc = ckpt_dir_chain_open(dir, man, 1, &ci->chain, err, errlen))) goto out;
  ci->parent = ckpt_dir_parent_step(man);
  const cJSON *dj = cJSON_GetObjectItemCaseSensitive(man, "dense");
  if (dj) {
    ci->dense.max_batch = 1; /* validated with the smallest batch; the user sets theirs */
    if ((rc = arch_parse(dj, path, &ci->dense, err, errlen))) goto out;
    ci->has_dense = 1;
  }
  ci->manifest = man;
  man = NULL;
out:
  if (rc) train_ckpt_info_free(ci);
  cJSON_Delete(man);
  return rc;
}

/* What a run of store kind run would change in its flags to resume a
 * checkpoint of store kind ck (another one). */
static const char *store_kind_hint(const char *ck, const char *run) {
  if (!strcmp(ck, "remote"))
    return "give --shard-servers or --colocate-shards, as the run that wrote it";
  if (!strcmp(run, "remote"))
    return !strcmp(ck, "shard")
               ? "drop --shard-servers or --colocate-shards, give --data-dir/--cache-rows/--cache-mb"
               : "drop --shard-servers or --colocate-shards";
  return !strcmp(run, "local") ? "add --data-dir/--cache-rows/--cache-mb"
                               : "drop --data-dir/--cache-rows/--cache-mb";
}

/* What train_ckpt_load refuses before touching anything: another model or plan,
 * store kind, batch size, dense optimizer or architecture. */
static int load_checks(const train_ckpt_info *ci, const char *path, const emb_plan *plan,
                       const char *store_kind, dense_model *model, const train_ckpt_settings *set,
                       char *err, size_t errlen) {
  const cJSON *man = ci->manifest;
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX], why[256] = "";
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  int grown = strcmp(jstr(man, "model_fingerprint"), mfp) && emb_plan_grows(ci->plan, plan, why, sizeof why);
  if (!grown && strcmp(jstr(man, "model_fingerprint"), mfp)) {
    sr_fmt(err, errlen, "%s: written for model fingerprint %.12s..., this run's model is %.12s... "
           "(other tables, seed or optimizer: %s)", path, jstr(man, "model_fingerprint"), mfp, why);
    return SR_EMISMATCH;
  }
  if (!grown && strcmp(jstr(man, "plan_fingerprint"), pfp)) {
    sr_fmt(err, errlen, "%s: written under plan fingerprint %.12s..., this run's plan is %.12s... "
           "(other placement; reshard it first)", path, jstr(man, "plan_fingerprint"), pfp);
    return SR_EMISMATCH;
  }
  if (store_kind && strcmp(ci->store_kind, store_kind)) {
    sr_fmt(err, errlen, "%s: holds rows of the %s store; this run uses the %s store (%s)", path,
           ci->store_kind, store_kind, store_kind_hint(ci->store_kind, store_kind));
    return SR_EMISMATCH;
  }
  const char *dopt = jstr(cJSON_GetObjectItemCaseSensitive(man, "settings"), "dense_optimizer");
  if (ci->batch != set->batch || strcmp(dopt, set->dense_optimizer)) {
    sr_fmt(err, errlen, "%s: trained with --mini-batch-size %lld --optimizer %s; this run has %lld and %s",
           path, (long long)ci->batch, dopt, (long long)set->batch, set->dense_optimizer);
    return SR_EMISMATCH;
  }
  if (ci->has_dense) {
    const dense_config *mc = dense_model_config(model);
    int same = mc->n_dense == ci->dense.n_dense && mc->n_bot == ci->dense.n_bot &&
               mc->n_top == ci->dense.n_top && mc->n_sparse == ci->dense.n_sparse &&
               mc->emb_dim == ci->dense.emb_dim && mc->interaction == ci->dense.interaction &&
               mc->interaction_itself == ci->dense.interaction_itself &&
               mc->dcn_layers == ci->dense.dcn_layers && mc->dcn_rank == ci->dense.dcn_rank &&
               !memcmp(mc->bot, ci->dense.bot, (size_t)mc->n_bot * sizeof *mc->bot) &&
               !memcmp(mc->top, ci->dense.top, (size_t)mc->n_top * sizeof *mc->top);
    if (!same && mc->interaction == DENSE_INTERACT_DCN && ci->dense.interaction == DENSE_INTERACT_DCN &&
        (mc->dcn_layers != ci->dense.dcn_layers || mc->dcn_rank != ci->dense.dcn_rank)) {
      sr_fmt(err, errlen, "%s: written for a cross network of %d layers of rank %d; this run has "
             "--dcn-num-layers %d --dcn-low-rank-dim %d", path, ci->dense.dcn_layers,
             ci->dense.dcn_rank, mc->dcn_layers, mc->dcn_rank);
      return SR_EMISMATCH;
    }
    if (!same) {
      sr_fmt(err, errlen, "%s: written for another dense architecture (--arch-mlp-bot/--arch-mlp-top/"
             "--arch-interaction-op differ: %s interaction there, %s here)", path,
             interaction_name(ci->dense.interaction), interaction_name(mc->interaction));
      return SR_EMISMATCH;
    }
  }
  return 0;
}

int train_ckpt_restore_chain(const train_ckpt_info *ci, emb_store *store, char *err,
                             size_t errlen) {
  for (int i = 0; i < ci->chain.n; i++) {
    char shards[SR_PATH_MAX];
    int rc = sr_path_err(shards, sizeof shards, err, errlen, "%s/shards", ci->chain.dirs[i]);
    if (!rc) rc = i ? emb_store_restore_delta(store, shards) : emb_store_restore(store, shards);
    if (rc == SR_EUNSUPPORTED)
      sr_fmt(err, errlen, "%s: an incremental checkpoint, and this store cannot lay one over its "
             "rows (shardrec fold --from %s --to DIR writes a full one)", ci->chain.dirs[i],
             ci->dir);
    else if (rc)
      sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
    if (rc) return rc;
  }
  return 0;
}

int train_ckpt_load(const char *dir, const emb_plan *plan, emb_store *store,
                    const char *store_kind, dense_model *model, dense_opt *opt,
                    const train_ckpt_settings *set, train_ckpt_state *st, char *err,
                    size_t errlen) {
  char path[SR_PATH_MAX], dense[SR_PATH_MAX], shards[SR_PATH_MAX];
  train_ckpt_info ci;
  /* Every name fits before anything is read or restored. */
  int rc = sr_path_err(path, sizeof path, err, errlen, "%s/manifest.json", dir);
  if (!rc) rc = sr_path_err(dense, sizeof dense, err, errlen, "%s/dense.bin", dir);
  if (!rc) rc = sr_path_err(shards, sizeof shards, err, errlen, "%s/shards", dir);
  if (!rc) rc = train_ckpt_open(dir, &ci, err, errlen);
  if (rc) return rc;
  if ((rc = load_checks(&ci, path, plan, store_kind, model, set, err, errlen))) goto out;
  if ((rc = dense_state_check(dense, model, opt, err, errlen))) goto out;
  /* A plan that grows the checkpoint's (load_checks): its rows as they are,
   * the rows past them never written. */
  char old_mfp[EMB_FP_HEX], mfp[EMB_FP_HEX];
  emb_plan_model_fingerprint(ci.plan, old_mfp);
  emb_plan_model_fingerprint(plan, mfp);
  if (store && strcmp(old_mfp, mfp) && ci.chain.n > 1) {
    sr_fmt(err, errlen, "%s: an incremental checkpoint; a resume that grows the tables takes a "
           "full one (shardrec fold --from %s --to DIR writes it)", dir, dir);
    rc = SR_EINVAL;
    goto out;
  }
  if (store && (rc = strcmp(old_mfp, mfp) ? emb_store_restore_grown(store, shards, old_mfp)
                                          : train_ckpt_restore_chain(&ci, store, err, errlen))) {
    if (strcmp(old_mfp, mfp)) sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
    goto out;
  }
  if ((rc = dense_state_load(dense, model, opt, err, errlen))) goto out;
  *st = ci.st;
out:
  train_ckpt_info_free(&ci);
  return rc;
}

int train_ckpt_transform(const train_ckpt_info *ci, ds_transform **out, char *err, size_t errlen) {
  *out = NULL;
  if (!ci->transform_fp[0]) {
    sr_fmt(err, errlen, "%s records no data transform (written before models carried their "
           "mapping, or trained on ids mapped outside shardrec)", ci->dir);
    return SR_ENOTFOUND;
  }
  char path[SR_PATH_MAX], fp[SR_SHA256_HEX];
  int rc = sr_path_err(path, sizeof path, err, errlen, "%s/" DS_XFORM_FILE, ci->dir);
  if (!rc) rc = ds_transform_load(path, out, fp, err, errlen);
  if (!rc && strcmp(fp, ci->transform_fp)) {
    sr_fmt(err, errlen, "%s: fingerprint %.12s, the manifest says %.12s (file changed)", path, fp,
           ci->transform_fp);
    ds_transform_free(*out);
    *out = NULL;
    rc = SR_ECHECKSUM;
  }
  return rc;
}

int train_ckpt_write_as(const train_ckpt_info *src, const emb_plan *plan, const char *tmp,
                        const char *final, char *err, size_t errlen) {
  return emb_ckpt_write_as((const cJSON *)src->manifest, src->plan, plan, tmp, final, err,
                           errlen);
}

int train_ckpt_mapping_check(const ds_transform *ck_xf, const ds_transform *xf, const char *ckpt,
                             const char *data, int *grow, char *msg, size_t len) {
  *grow = 0;
  msg[0] = 0;
  if (!ck_xf || !xf) return 0; /* nothing to compare: ids taken as they are */
  char why[512], a[SR_SHA256_HEX], b[SR_SHA256_HEX];
  ds_xform_relation rel = ds_transform_compare(ck_xf, xf, why, sizeof why);
  if (rel == DS_XFORM_SAME) return 0;
  if (ds_transform_fingerprint(ck_xf, a) || ds_transform_fingerprint(xf, b)) {
    sr_fmt(msg, len, "%s: cannot fingerprint the data mappings", data);
    return SR_EBACKEND;
  }
  if (rel == DS_XFORM_DIFFERS) {
    sr_fmt(msg, len, "%s: %s maps ids with mapping %.12s, the checkpoint was trained with mapping "
           "%.12s (%s): its ids would mean other values; convert it with --mapping-from %s (and "
           "--extend-dictionaries to learn its new values)", ckpt, data, b, a, why, ckpt);
    return SR_EMISMATCH;
  }
  sr_fmt(msg, len, "mapping %.12s extends the checkpoint's %.12s (%s): its tables grow", b, a, why);
  *grow = 1;
  return 0;
}

int train_ckpt_mapping(const char *path, emb_plan **plan, ds_transform **xf, char *err,
                       size_t errlen) {
  train_ckpt_info ci;
  cJSON *man = NULL;
  char src[SR_PATH_MAX];
  *plan = NULL;
  *xf = NULL;
  memset(&ci, 0, sizeof ci);
  int rc = train_ckpt_resolve(path, ci.dir, sizeof ci.dir, err, errlen);
  if (!rc) rc = sr_path_err(src, sizeof src, err, errlen, "%s/manifest.json", ci.dir);
  if (!rc) rc = ckpt_dir_read(ci.dir, &man, err, errlen);
  if (!rc) rc = job_fields(man, src, &ci, err, errlen);
  if (!rc && ci.transform_fp[0]) rc = train_ckpt_transform(&ci, xf, err, errlen);
  if (!rc) {
    *plan = ci.plan;
    ci.plan = NULL;
  }
  cJSON_Delete(man);
  train_ckpt_info_free(&ci);
  return rc;
}

int train_ckpt_dense(const char *path, int *has, dense_config *cfg, char *err, size_t errlen) {
  char dir[SR_PATH_MAX], src[SR_PATH_MAX];
  cJSON *man = NULL;
  *has = 0;
  int rc = train_ckpt_resolve(path, dir, sizeof dir, err, errlen);
  if (!rc) rc = sr_path_err(src, sizeof src, err, errlen, "%s/manifest.json", dir);
  if (!rc) rc = ckpt_dir_read(dir, &man, err, errlen);
  const cJSON *dj = rc ? NULL : cJSON_GetObjectItemCaseSensitive(man, "dense");
  if (dj) {
    cfg->max_batch = 1; /* validated with the smallest batch, as train_ckpt_open */
    rc = arch_parse(dj, src, cfg, err, errlen);
    *has = !rc;
  }
  cJSON_Delete(man);
  return rc;
}

int train_ckpt_grown_plan(const char *ckpt, const char *data, emb_plan **out, char *err,
                          size_t errlen) {
  emb_plan *ck_plan;
  ds_transform *ck_xf;
  *out = NULL;
  int rc = train_ckpt_mapping(ckpt, &ck_plan, &ck_xf, err, errlen);
  if (rc) return rc;
  if (!ck_xf) {
    sr_fmt(err, errlen, "%s records no data transform to grow its tables by (written before "
           "models carried their mapping, or trained on ids mapped outside shardrec)", ckpt);
    emb_plan_free(ck_plan);
    return SR_ENOTFOUND;
  }
  ds_source_opts so = {.path = data, .split = DS_SPLIT_TRAIN, .format = DS_FORMAT_PROCESSED,
                       .scheme = DS_SCHEME_NONE};
  char e2[1024];
  uint64_t sizes[DS_NUM_SPARSE];
  int grow = 0;
  ds_source *src = ds_source_open(&so, e2, sizeof e2);
  if (!src) {
    sr_fmt(err, errlen, "%s", e2);
    rc = SR_EIO;
  } else if (!ds_source_transform(src)) {
    sr_fmt(err, errlen, "%s records no data mapping to grow %s's tables by", data, ckpt);
    rc = SR_EINVAL;
  } else if ((rc = train_ckpt_mapping_check(ck_xf, ds_source_transform(src), ckpt, data, &grow,
                                            err, errlen))) {
    /* err says how the mappings differ */
  } else if (ck_plan->n_tables != DS_NUM_SPARSE || ds_source_table_sizes(src, sizes)) {
    sr_fmt(err, errlen, "%s: no table sizes for the checkpoint's %d tables", data,
           ck_plan->n_tables);
    rc = SR_EINVAL;
  } else {
    rc = emb_plan_grow(ck_plan, sizes, out, err, errlen);
  }
  ds_source_destroy(src);
  ds_transform_free(ck_xf);
  emb_plan_free(ck_plan);
  return rc;
}
