/* Training checkpoints and the trainer's store (see checkpoint.h). */
#include "tools/train/checkpoint.h"
#include "tools/train/model_dir.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"
#include "embedding/shard.h"
#include "storage/kv.h"

#define CK_FORMAT 1
#define DN_MAGIC "SRCKDENS"
#define DN_VERSION 1u
#define DN_HEADER 256u

/* SHARDREC_TEST_CRASH_IN_CHECKPOINT=W or W:S (test hook, see checkpoint.h). */
static void crash_hook(int where, int64_t step) {
  const char *v = getenv("SHARDREC_TEST_CRASH_IN_CHECKPOINT");
  if (!v || atoi(v) != where) return;
  const char *c = strchr(v, ':');
  if (!c || atoll(c + 1) == step) _exit(86);
}

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

static int write_file(const char *path, const void *data, size_t n, char *err, size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write_all(fd, data, n) || fsync(fd) || close(fd)) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return SR_EIO;
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
  unsigned int dl;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, hdr, sizeof hdr);
  EVP_DigestUpdate(md, p, np * 4);
  if (ns) EVP_DigestUpdate(md, s, ns * 4);
  EVP_DigestFinal_ex(md, dig, &dl);
  EVP_MD_CTX_free(md);
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
  unsigned int dl;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  EVP_DigestUpdate(md, buf, len - 32);
  EVP_DigestFinal_ex(md, dig, &dl);
  EVP_MD_CTX_free(md);
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

/* ---- folders ---- */

static int mkdir_p(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *q = tmp + 1; *q; q++)
    if (*q == '/') {
      *q = 0;
      if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
      *q = '/';
    }
  return mkdir(tmp, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static int is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* step-N name -> N, or -1. */
static long long step_of(const char *name) {
  if (strncmp(name, "step-", 5) || !name[5]) return -1;
  char *end;
  long long n = strtoll(name + 5, &end, 10);
  return *end || n < 0 ? -1 : n;
}

typedef struct {
  long long step;
  char name[256];
} step_dir;

static int cmp_step(const void *a, const void *b) {
  long long x = ((const step_dir *)a)->step, y = ((const step_dir *)b)->step;
  return x < y ? -1 : x > y;
}

/* Complete (DONE) step folders under root, ascending. */
static int list_complete(const char *root, step_dir **out, int *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return SR_ENOTFOUND;
  struct dirent *de;
  int cap = 0;
  while ((de = readdir(d))) {
    long long s = step_of(de->d_name);
    if (s < 0) continue;
    char done[4096];
    snprintf(done, sizeof done, "%s/%s/DONE", root, de->d_name);
    if (!is_file(done)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      step_dir *np = realloc(*out, (size_t)cap * sizeof *np);
      if (!np) break;
      *out = np;
    }
    (*out)[*n].step = s;
    snprintf((*out)[*n].name, sizeof(*out)[*n].name, "%s", de->d_name);
    (*n)++;
  }
  closedir(d);
  if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_step);
  return 0;
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

/* The plan (canonical JSON) and both fingerprints into the manifest. */
static int manifest_set_plan(cJSON *man, const emb_plan *plan, char *err, size_t errlen) {
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
  /* "plan" is for people (cJSON prints doubles to 15 digits when they are
   * close enough, so it is not exact); "plan_canonical" is the exact text
   * the fingerprints hash, and what ckpt_open reads. */
  cJSON_AddItemToObject(man, "plan", pj);
  int ok = cJSON_AddStringToObject(man, "plan_canonical", canon) != NULL;
  free(canon);
  if (!ok) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  return 0;
}

/* Complete a checkpoint whose files are all under tmp: list them with size
 * and SHA-256 into man's "files", write manifest.json, rename tmp to final,
 * then write DONE (the manifest's SHA-256). Returns 0; a negative SR_E*
 * when nothing was renamed (tmp is the caller's to remove); or the positive
 * code when final is in place without DONE (never taken by --resume). */
static int finish(const char *tmp, const char *final, const char *root, cJSON *man,
                  int64_t step, char *err, size_t errlen) {
  char path[4200];
  char **files = NULL;
  int nf = 0, rc;
  char *text = NULL;
  cJSON_DeleteItemFromObjectCaseSensitive(man, "files");
  cJSON *fl = cJSON_AddArrayToObject(man, "files");
  if ((rc = store_list_files(tmp, &files, &nf))) {
    sr_fmt(err, errlen, "%s: cannot list files", tmp);
    goto out;
  }
  for (int i = 0; i < nf; i++) {
    char fp[8300], hex[65];
    uint64_t size;
    snprintf(fp, sizeof fp, "%s/%s", tmp, files[i]);
    if ((rc = store_file_sha256(fp, hex, &size))) {
      sr_fmt(err, errlen, "%s: cannot read", fp);
      goto out;
    }
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "path", files[i]);
    cJSON_AddNumberToObject(f, "size", (double)size);
    cJSON_AddStringToObject(f, "sha256", hex);
    cJSON_AddItemToArray(fl, f);
  }
  text = cJSON_Print(man);
  snprintf(path, sizeof path, "%s/manifest.json", tmp);
  if (!text) {
    rc = SR_ENOMEM;
    sr_fmt(err, errlen, "manifest: out of memory");
    goto out;
  }
  if ((rc = write_file(path, text, strlen(text), err, errlen))) goto out;
  store_fsync_dir(tmp);
  if (rename(tmp, final) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    rc = SR_EIO;
    goto out;
  }
  store_fsync_dir(root);
  crash_hook(2, step);
  char hex[65];
  emb_sha256_hex(text, strlen(text), hex);
  char done[80];
  snprintf(done, sizeof done, "%s\n", hex);
  snprintf(path, sizeof path, "%s/DONE", final);
  if ((rc = write_file(path, done, strlen(done), err, errlen))) {
    rc = -rc;
    goto out;
  }
  store_fsync_dir(final);
out:
  store_paths_free(files, nf);
  free(text);
  return rc;
}

int ckpt_save(const char *root, int keep, const emb_plan *plan, emb_store *store,
              const char *store_kind, dense_model *model, dense_opt *opt, const ckpt_state *st,
              const ckpt_settings *set, char *err, size_t errlen) {
  char final[4096], tmp[4096], path[4200];
  snprintf(final, sizeof final, "%s/step-%lld", root, (long long)st->step);
  snprintf(tmp, sizeof tmp, "%s/.step-%lld.tmp-%ld", root, (long long)st->step, (long)getpid());
  snprintf(path, sizeof path, "%s/DONE", final);
  if (is_file(path)) return 0; /* this step is saved already */
  if (mkdir_p(root) != 0) {
    sr_fmt(err, errlen, "%s: cannot create folder: %s", root, strerror(errno));
    return SR_EIO;
  }
  store_rmtree(tmp);
  store_rmtree(final); /* a torn one from an earlier crash */
  if (mkdir(tmp, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create folder: %s", tmp, strerror(errno));
    return SR_EIO;
  }
  int rc;
  cJSON *man = NULL;
  snprintf(path, sizeof path, "%s/dense.bin", tmp);
  if ((rc = dense_write(path, model, opt, err, errlen))) goto fail;
  crash_hook(1, st->step);
  snprintf(path, sizeof path, "%s/shards", tmp);
  if ((rc = emb_store_checkpoint(store, path))) {
    sr_fmt(err, errlen, "%s", emb_store_errmsg(store));
    goto fail;
  }
  /* The manifest. */
  man = cJSON_CreateObject();
  cJSON_AddNumberToObject(man, "format", CK_FORMAT);
  cJSON_AddNumberToObject(man, "step", (double)st->step);
  cJSON_AddNumberToObject(man, "epoch", st->epoch);
  cJSON_AddNumberToObject(man, "sample_index", (double)st->sample_index);
  cJSON_AddNumberToObject(man, "lr_schedule_step", (double)st->step);
  cJSON_AddNullToObject(man, "rng");
  if ((rc = manifest_set_plan(man, plan, err, errlen))) goto fail;
  cJSON_AddStringToObject(man, "store", store_kind);
  cJSON_AddItemToObject(man, "settings", settings_json(set));
  cJSON *arch = model_arch_json(dense_model_config(model));
  if (arch) cJSON_AddItemToObject(man, "dense", arch);
  if ((rc = finish(tmp, final, root, man, st->step, err, errlen))) {
    if (rc > 0) { /* renamed into place: only DONE is missing */
      rc = -rc;
      goto out;
    }
    goto fail;
  }
  /* Keep the newest keep complete ones; drop torn leftovers of crashed runs. */
  if (keep > 0) {
    step_dir *sd;
    int n;
    if (!list_complete(root, &sd, &n)) {
      for (int i = 0; i + keep < n; i++) {
        snprintf(path, sizeof path, "%s/%s", root, sd[i].name);
        store_rmtree(path);
      }
      free(sd);
    }
  }
  goto out;
fail:
  store_rmtree(tmp);
out:
  cJSON_Delete(man);
  return rc;
}

/* ---- resume ---- */

int ckpt_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
  char p[4200];
  snprintf(p, sizeof p, "%s/manifest.json", path);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (is_file(p) || step_of(base) >= 0) {
    snprintf(out, outlen, "%s", path);
    return 0;
  }
  step_dir *sd;
  int n;
  if (list_complete(path, &sd, &n)) {
    sr_fmt(err, errlen, "%s: no such checkpoint folder", path);
    return SR_ENOTFOUND;
  }
  if (!n) {
    sr_fmt(err, errlen, "%s: no complete checkpoint (no step-N folder with a DONE marker)",
           path);
    return SR_ENOTFOUND;
  }
  snprintf(out, outlen, "%s/%s", path, sd[n - 1].name);
  free(sd);
  return 0;
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

int ckpt_open(const char *dir, ckpt_info *ci, char *err, size_t errlen) {
  char path[4200];
  int rc = 0;
  cJSON *man = NULL;
  char *text = NULL, *done = NULL;
  struct stat sst;
  memset(ci, 0, sizeof *ci);
  if (stat(dir, &sst) != 0 || !S_ISDIR(sst.st_mode)) {
    sr_fmt(err, errlen, "%s: no such checkpoint folder", dir);
    return SR_ENOTFOUND;
  }
  snprintf(path, sizeof path, "%s/DONE", dir);
  if (!(done = read_text(path, NULL))) {
    sr_fmt(err, errlen, "%s: missing: the checkpoint is incomplete (its writer stopped before the end)",
           path);
    return SR_EFORMAT;
  }
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  size_t tl = 0;
  if (!(text = read_text(path, &tl))) {
    sr_fmt(err, errlen, "%s: missing or unreadable", path);
    rc = SR_EFORMAT;
    goto out;
  }
  char hex[65];
  emb_sha256_hex(text, tl, hex);
  if (strncmp(done, hex, 64)) {
    sr_fmt(err, errlen, "%s: checksum does not match the one in DONE (file damaged)", path);
    rc = SR_ECHECKSUM;
    goto out;
  }
  man = cJSON_Parse(text);
  double fmt, step, epoch, sample;
  const char *kind = man ? jstr(man, "store") : NULL;
  if (!man || jnum(man, "format", &fmt) || jnum(man, "step", &step) || jnum(man, "epoch", &epoch) ||
      jnum(man, "sample_index", &sample) || !jstr(man, "model_fingerprint") ||
      !jstr(man, "plan_fingerprint") || !kind || strlen(kind) >= sizeof ci->store_kind) {
    sr_fmt(err, errlen, "%s: not a checkpoint manifest (missing fields)", path);
    rc = SR_EFORMAT;
    goto out;
  }
  if (fmt != CK_FORMAT) {
    sr_fmt(err, errlen, "%s: format %g is not supported (this build reads %d)", path, fmt, CK_FORMAT);
    rc = SR_EVERSION;
    goto out;
  }
  /* The plan it was written under, checked against its own fingerprints. */
  {
    const char *ptext = jstr(man, "plan_canonical");
    char src[4300], mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
    snprintf(src, sizeof src, "%s: plan_canonical", path);
    if (!ptext) {
      sr_fmt(err, errlen, "%s: no plan_canonical (written by an older shardrec)", path);
      rc = SR_EFORMAT;
      goto out;
    }
    if ((rc = emb_plan_parse(ptext, src, &ci->plan, err, errlen))) goto out;
    emb_plan_model_fingerprint(ci->plan, mfp);
    emb_plan_fingerprint(ci->plan, pfp);
    if (strcmp(mfp, jstr(man, "model_fingerprint")) || strcmp(pfp, jstr(man, "plan_fingerprint"))) {
      sr_fmt(err, errlen, "%s: the plan does not match the manifest's fingerprints", path);
      rc = SR_ECHECKSUM;
      goto out;
    }
  }
  const cJSON *sj = cJSON_GetObjectItemCaseSensitive(man, "settings");
  double batch;
  if (!sj || jnum(sj, "mini_batch_size", &batch) || !jstr(sj, "dense_optimizer")) {
    sr_fmt(err, errlen, "%s: no settings", path);
    rc = SR_EFORMAT;
    goto out;
  }
  /* Every file: present, its size, its checksum. */
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files"), *f;
  if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) == 0) {
    sr_fmt(err, errlen, "%s: no file list", path);
    rc = SR_EFORMAT;
    goto out;
  }
  cJSON_ArrayForEach(f, files) {
    const char *rel = jstr(f, "path"), *want = jstr(f, "sha256");
    double size;
    if (!rel || !want || jnum(f, "size", &size) || strstr(rel, "..")) {
      sr_fmt(err, errlen, "%s: a malformed entry in files", path);
      rc = SR_EFORMAT;
      goto out;
    }
    char fp[8300], got[65];
    uint64_t gs;
    snprintf(fp, sizeof fp, "%s/%s", dir, rel);
    if (store_file_sha256(fp, got, &gs)) {
      sr_fmt(err, errlen, "%s: missing or unreadable (listed in the manifest)", fp);
      rc = SR_ENOTFOUND;
      goto out;
    }
    if ((double)gs != size) {
      sr_fmt(err, errlen, "%s: %llu bytes, the manifest says %.0f (torn or truncated)", fp,
             (unsigned long long)gs, size);
      rc = SR_EFORMAT;
      goto out;
    }
    if (strcmp(got, want)) {
      sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", fp);
      rc = SR_ECHECKSUM;
      goto out;
    }
  }
  const cJSON *dj = cJSON_GetObjectItemCaseSensitive(man, "dense");
  if (dj) {
    ci->dense.max_batch = 1; /* validated with the smallest batch; the user sets theirs */
    if ((rc = model_arch_parse(dj, path, &ci->dense, err, errlen))) goto out;
    ci->has_dense = 1;
  }
  snprintf(ci->dir, sizeof ci->dir, "%s", dir);
  snprintf(ci->store_kind, sizeof ci->store_kind, "%s", kind);
  ci->st.step = (int64_t)step;
  ci->st.epoch = (int)epoch;
  ci->st.sample_index = (uint64_t)sample;
  ci->batch = (int64_t)batch;
  ci->manifest = man;
  man = NULL;
out:
  if (rc) ckpt_info_free(ci);
  cJSON_Delete(man);
  free(text);
  free(done);
  return rc;
}

int ckpt_load(const char *dir, const emb_plan *plan, emb_store *store, const char *store_kind,
              dense_model *model, dense_opt *opt, const ckpt_settings *set, ckpt_state *st,
              char *err, size_t errlen) {
  char path[4200];
  ckpt_info ci;
  int rc = ckpt_open(dir, &ci, err, errlen);
  if (rc) return rc;
  const cJSON *man = ci.manifest;
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  if (strcmp(jstr(man, "model_fingerprint"), mfp)) {
    sr_fmt(err, errlen, "%s: written for model fingerprint %.12s..., this run's model is %.12s... "
           "(other tables, seed or optimizer)", path, jstr(man, "model_fingerprint"), mfp);
    rc = SR_EMISMATCH;
    goto out;
  }
  if (strcmp(jstr(man, "plan_fingerprint"), pfp)) {
    sr_fmt(err, errlen, "%s: written under plan fingerprint %.12s..., this run's plan is %.12s... "
           "(other placement; reshard it first)", path, jstr(man, "plan_fingerprint"), pfp);
    rc = SR_EMISMATCH;
    goto out;
  }
  if (store_kind && strcmp(ci.store_kind, store_kind)) {
    sr_fmt(err, errlen, "%s: holds rows of the %s store; this run uses the %s store "
           "(%s --data-dir/--cache-rows/--cache-mb)", path, ci.store_kind, store_kind,
           !strcmp(store_kind, "local") ? "add" : "drop");
    rc = SR_EMISMATCH;
    goto out;
  }
  const char *dopt = jstr(cJSON_GetObjectItemCaseSensitive(man, "settings"), "dense_optimizer");
  if (ci.batch != set->batch || strcmp(dopt, set->dense_optimizer)) {
    sr_fmt(err, errlen, "%s: trained with --mini-batch-size %lld --optimizer %s; this run has %lld and %s",
           path, (long long)ci.batch, dopt, (long long)set->batch, set->dense_optimizer);
    rc = SR_EMISMATCH;
    goto out;
  }
  if (ci.has_dense) {
    const dense_config *mc = dense_model_config(model);
    int same = mc->n_dense == ci.dense.n_dense && mc->n_bot == ci.dense.n_bot &&
               mc->n_top == ci.dense.n_top && mc->n_sparse == ci.dense.n_sparse &&
               mc->emb_dim == ci.dense.emb_dim && mc->interaction == ci.dense.interaction &&
               mc->interaction_itself == ci.dense.interaction_itself &&
               !memcmp(mc->bot, ci.dense.bot, (size_t)mc->n_bot * sizeof *mc->bot) &&
               !memcmp(mc->top, ci.dense.top, (size_t)mc->n_top * sizeof *mc->top);
    if (!same) {
      sr_fmt(err, errlen, "%s: written for another dense architecture (--arch-mlp-bot/--arch-mlp-top/"
             "--arch-interaction-op differ)", path);
      rc = SR_EMISMATCH;
      goto out;
    }
  }
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
  char mfp[EMB_FP_HEX], ofp[EMB_FP_HEX];
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_model_fingerprint(src->plan, ofp);
  if (strcmp(mfp, ofp)) {
    sr_fmt(err, errlen, "the new plan's model fingerprint %.12s... differs from the checkpoint's "
           "%.12s...", mfp, ofp);
    return SR_EMISMATCH;
  }
  cJSON *man = cJSON_Duplicate((const cJSON *)src->manifest, 1);
  if (!man) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  char root[4096];
  snprintf(root, sizeof root, "%s", final);
  char *slash = strrchr(root, '/');
  if (slash && slash != root) *slash = 0;
  else snprintf(root, sizeof root, "%s", slash ? "/" : ".");
  int rc = manifest_set_plan(man, plan, err, errlen);
  if (!rc) rc = finish(tmp, final, root, man, src->st.step, err, errlen);
  if (rc > 0) rc = -rc;
  cJSON_Delete(man);
  return rc;
}
