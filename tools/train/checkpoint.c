/* Training checkpoints and the trainer's store (see checkpoint.h). */
#include "tools/train/checkpoint.h"
#include "tools/train/model_dir.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/status.h"
#include "embedding/ckpt_plan.h"
#include "embedding/shard.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

#define DN_MAGIC "SRCKDENS"
#define DN_VERSION 1u
#define DN_HEADER 256u

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  fclose(f);
  if (s) {
    s[n] = 0;
    if (len) *len = (size_t)n;
  }
  return s;
}

/* ---- dense.bin ---- */

static int dense_write(const char *path, dense_model *m, dense_opt *o, char *err, size_t errlen) {
  size_t np = 0, ns = 0;
  const float *p = dense_model_params(m, &np);
  const float *s = dense_opt_state(o, &ns);
  unsigned char hdr[DN_HEADER];
  memset(hdr, 0, sizeof hdr);
  memcpy(hdr, DN_MAGIC, 8);
  uint32_t v = DN_VERSION, hb = DN_HEADER, kind = (uint32_t)dense_opt_kind_of(o);
  uint64_t n1 = np, n2 = ns;
  int64_t steps = dense_opt_steps(o);
  memcpy(hdr + 8, &v, 4);
  memcpy(hdr + 12, &hb, 4);
  memcpy(hdr + 16, &n1, 8);
  memcpy(hdr + 24, &n2, 8);
  memcpy(hdr + 32, &steps, 8);
  memcpy(hdr + 40, &kind, 4);
  unsigned char dig[32];
  sr_sha256_ctx h;
  int hrc = sr_sha256_init(&h);
  if (!hrc) { /* a failed update is reported by final */
    sr_sha256_update(&h, hdr, sizeof hdr);
    sr_sha256_update(&h, p, np * 4);
    if (ns) sr_sha256_update(&h, s, ns * 4);
    hrc = sr_sha256_final(&h, dig);
  }
  if (hrc) {
    sr_fmt(err, errlen, "%s: SHA-256 failed: %s", path, sr_strerror(hrc));
    return hrc;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write_all(fd, hdr, sizeof hdr) || write_all(fd, p, np * 4) ||
      (ns && write_all(fd, s, ns * 4)) || write_all(fd, dig, 32) || fsync(fd) || close(fd)) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return SR_EIO;
  }
  return 0;
}

/* Check dense.bin against m and o; load it only when load is set. */
static int dense_read(const char *path, dense_model *m, dense_opt *o, int load, char *err,
                      size_t errlen) {
  size_t len = 0;
  char *buf = read_text(path, &len);
  if (!buf) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return SR_EIO;
  }
  int rc = 0;
  size_t np = 0, ns = 0;
  float *p = dense_model_params(m, &np);
  float *s = dense_opt_state(o, &ns);
  uint32_t v, hb, kind;
  uint64_t n1, n2;
  int64_t steps;
  if (len < DN_HEADER + 32 || memcmp(buf, DN_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec dense checkpoint file (bad magic or too short)", path);
    rc = SR_EFORMAT;
    goto out;
  }
  memcpy(&v, buf + 8, 4);
  memcpy(&hb, buf + 12, 4);
  memcpy(&n1, buf + 16, 8);
  memcpy(&n2, buf + 24, 8);
  memcpy(&steps, buf + 32, 8);
  memcpy(&kind, buf + 40, 4);
  if (v != DN_VERSION || hb != DN_HEADER) {
    sr_fmt(err, errlen, "%s: format version %u is not supported (this build reads %u)", path, v,
           DN_VERSION);
    rc = SR_EVERSION;
    goto out;
  }
  if (n1 != np || n2 != ns || kind != (uint32_t)dense_opt_kind_of(o)) {
    sr_fmt(err, errlen,
           "%s: holds %llu parameters and %llu optimizer floats (optimizer kind %u); this model "
           "has %zu and %zu (kind %d)",
           path, (unsigned long long)n1, (unsigned long long)n2, kind, np, ns,
           (int)dense_opt_kind_of(o));
    rc = SR_EMISMATCH;
    goto out;
  }
  if (len != DN_HEADER + 4 * (np + ns) + 32) {
    sr_fmt(err, errlen, "%s: size %zu, expected %zu (torn or truncated)", path, len,
           DN_HEADER + 4 * (np + ns) + 32);
    rc = SR_EFORMAT;
    goto out;
  }
  unsigned char dig[32];
  if ((rc = sr_sha256(buf, len - 32, dig))) {
    sr_fmt(err, errlen, "%s: SHA-256 failed: %s", path, sr_strerror(rc));
    goto out;
  }
  if (memcmp(dig, buf + len - 32, 32)) {
    sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", path);
    rc = SR_ECHECKSUM;
    goto out;
  }
  if (load) {
    memcpy(p, buf + DN_HEADER, np * 4);
    if (ns) memcpy(s, buf + DN_HEADER + np * 4, ns * 4);
    dense_opt_set_steps(o, steps);
  }
out:
  free(buf);
  return rc;
}

/* ---- save ---- */

static cJSON *settings_json(const ckpt_settings *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "dense_optimizer", s->dense_optimizer);
  cJSON_AddStringToObject(o, "sparse_optimizer", s->sparse_optimizer);
  cJSON_AddNumberToObject(o, "learning_rate", s->lr);
  cJSON_AddNumberToObject(o, "sparse_learning_rate", s->sparse_lr);
  cJSON_AddNumberToObject(o, "lr_num_warmup_steps", (double)s->warmup);
  cJSON_AddNumberToObject(o, "lr_decay_start_step", (double)s->decay_start);
  cJSON_AddNumberToObject(o, "lr_num_decay_steps", (double)s->decay_steps);
  cJSON_AddNumberToObject(o, "mini_batch_size", (double)s->batch);
  return o;
}

/* The training job's manifest: format (ckpt_dir), step, data position,
 * schedule, RNG, plan, store kind, settings, dense architecture; the file
 * list is added by ckpt_dir_commit. NULL with the reason in err. */
static cJSON *job_manifest(const emb_plan *plan, const char *store_kind, dense_model *model,
                           const ckpt_state *st, const ckpt_settings *set, char *err,
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
  if (emb_ckpt_set_plan(man, plan, err, errlen)) {
    cJSON_Delete(man);
    return NULL;
  }
  cJSON_AddStringToObject(man, "store", store_kind);
  cJSON_AddItemToObject(man, "settings", settings_json(set));
  cJSON *arch = model_arch_json(dense_model_config(model));
  if (arch) cJSON_AddItemToObject(man, "dense", arch);
  return man;
}

int ckpt_save(const char *root, int keep, const emb_plan *plan, emb_store *store,
              const char *store_kind, dense_model *model, dense_opt *opt, const ckpt_state *st,
              const ckpt_settings *set, char *err, size_t errlen) {
  ckpt_dir_txn t;
  char path[4300];
  int exists, rc = ckpt_dir_begin(root, st->step, &t, &exists, err, errlen);
  if (rc || exists) return rc; /* exists: this step is saved already */
  cJSON *man = NULL;
  snprintf(path, sizeof path, "%s/dense.bin", t.tmp);
  if ((rc = dense_write(path, model, opt, err, errlen))) goto fail;
  snprintf(path, sizeof path, "%s/shards", t.tmp);
  if ((rc = emb_store_checkpoint(store, path))) {
    sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
    goto fail;
  }
  if (!(man = job_manifest(plan, store_kind, model, st, set, err, errlen))) {
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

int ckpt_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
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

void ckpt_info_free(ckpt_info *ci) {
  if (!ci) return;
  emb_plan_free(ci->plan);
  cJSON_Delete((cJSON *)ci->manifest);
  memset(ci, 0, sizeof *ci);
}

/* The training job's fields of a manifest ckpt_dir_read accepted, into ci
 * (the plan, checked against its fingerprints, included). */
static int job_fields(const cJSON *man, const char *path, ckpt_info *ci, char *err,
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
  return 0;
}

int ckpt_open(const char *dir, ckpt_info *ci, char *err, size_t errlen) {
  char path[4200];
  cJSON *man = NULL;
  memset(ci, 0, sizeof *ci);
  int rc = ckpt_dir_read(dir, &man, err, errlen);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  if ((rc = job_fields(man, path, ci, err, errlen))) goto out;
  /* Every file: present, its size, its checksum. */
  if ((rc = ckpt_dir_verify(dir, man, err, errlen))) goto out;
  const cJSON *dj = cJSON_GetObjectItemCaseSensitive(man, "dense");
  if (dj) {
    ci->dense.max_batch = 1; /* validated with the smallest batch; the user sets theirs */
    if ((rc = model_arch_parse(dj, path, &ci->dense, err, errlen))) goto out;
    ci->has_dense = 1;
  }
  snprintf(ci->dir, sizeof ci->dir, "%s", dir);
  ci->manifest = man;
  man = NULL;
out:
  if (rc) ckpt_info_free(ci);
  cJSON_Delete(man);
  return rc;
}

/* What ckpt_load refuses before touching anything: another model or plan,
 * store kind, batch size, dense optimizer or architecture. */
static int load_checks(const ckpt_info *ci, const char *path, const emb_plan *plan,
                       const char *store_kind, dense_model *model, const ckpt_settings *set,
                       char *err, size_t errlen) {
  const cJSON *man = ci->manifest;
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  if (strcmp(jstr(man, "model_fingerprint"), mfp)) {
    sr_fmt(err, errlen, "%s: written for model fingerprint %.12s..., this run's model is %.12s... "
           "(other tables, seed or optimizer)", path, jstr(man, "model_fingerprint"), mfp);
    return SR_EMISMATCH;
  }
  if (strcmp(jstr(man, "plan_fingerprint"), pfp)) {
    sr_fmt(err, errlen, "%s: written under plan fingerprint %.12s..., this run's plan is %.12s... "
           "(other placement; reshard it first)", path, jstr(man, "plan_fingerprint"), pfp);
    return SR_EMISMATCH;
  }
  if (store_kind && strcmp(ci->store_kind, store_kind)) {
    sr_fmt(err, errlen, "%s: holds rows of the %s store; this run uses the %s store "
           "(%s --data-dir/--cache-rows/--cache-mb)", path, ci->store_kind, store_kind,
           !strcmp(store_kind, "local") ? "add" : "drop");
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
               !memcmp(mc->bot, ci->dense.bot, (size_t)mc->n_bot * sizeof *mc->bot) &&
               !memcmp(mc->top, ci->dense.top, (size_t)mc->n_top * sizeof *mc->top);
    if (!same) {
      sr_fmt(err, errlen, "%s: written for another dense architecture (--arch-mlp-bot/--arch-mlp-top/"
             "--arch-interaction-op differ)", path);
      return SR_EMISMATCH;
    }
  }
  return 0;
}

int ckpt_load(const char *dir, const emb_plan *plan, emb_store *store, const char *store_kind,
              dense_model *model, dense_opt *opt, const ckpt_settings *set, ckpt_state *st,
              char *err, size_t errlen) {
  char path[4200];
  ckpt_info ci;
  int rc = ckpt_open(dir, &ci, err, errlen);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  if ((rc = load_checks(&ci, path, plan, store_kind, model, set, err, errlen))) goto out;
  snprintf(path, sizeof path, "%s/dense.bin", dir);
  if ((rc = dense_read(path, model, opt, 0, err, errlen))) goto out;
  if (store) {
    snprintf(path, sizeof path, "%s/shards", dir);
    if ((rc = emb_store_restore(store, path))) {
      sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
      goto out;
    }
  }
  snprintf(path, sizeof path, "%s/dense.bin", dir);
  if ((rc = dense_read(path, model, opt, 1, err, errlen))) goto out;
  *st = ci.st;
out:
  ckpt_info_free(&ci);
  return rc;
}

int ckpt_write_as(const ckpt_info *src, const emb_plan *plan, const char *tmp, const char *final,
                  char *err, size_t errlen) {
  return emb_ckpt_write_as((const cJSON *)src->manifest, src->plan, plan, tmp, final, err,
                           errlen);
}
