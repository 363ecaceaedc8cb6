#include "tools/train/model_dir.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return SR_EIO;
  size_t n = strlen(text);
  int ok = fwrite(text, 1, n, f) == n;
  ok &= fclose(f) == 0;
  return ok ? 0 : SR_EIO;
}

static char *read_text(const char *path) {
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
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

static int rm_rf(const char *path) {
  char cmd[4200];
  if (strlen(path) > 4000 || strchr(path, '\'')) return SR_EINVAL;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  return system(cmd) == 0 ? 0 : SR_EIO;
}

cJSON *model_arch_json(const dense_config *cfg) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddNumberToObject(j, "format", 1);
  cJSON_AddNumberToObject(j, "n_dense", cfg->n_dense);
  cJSON_AddItemToObject(j, "bot", cJSON_CreateIntArray(cfg->bot, cfg->n_bot));
  cJSON_AddItemToObject(j, "top", cJSON_CreateIntArray(cfg->top, cfg->n_top));
  cJSON_AddNumberToObject(j, "n_sparse", cfg->n_sparse);
  cJSON_AddNumberToObject(j, "emb_dim", cfg->emb_dim);
  cJSON_AddStringToObject(j, "interaction", cfg->interaction == DENSE_INTERACT_CAT ? "cat" : "dot");
  cJSON_AddBoolToObject(j, "interaction_itself", cfg->interaction_itself);
  return j;
}

int model_dir_save(const char *dir, const dense_config *cfg, const emb_plan *plan,
                   dense_model *model, emb_store *store, char *err, size_t errlen) {
  char tmp[4096], path[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", dir);
  rm_rf(tmp);
  if (mkdir(tmp, 0755) != 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    return SR_EIO;
  }
  cJSON *j = model_arch_json(cfg);
  char *text = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  snprintf(path, sizeof path, "%s/model.json", tmp);
  int rc = text ? write_text(path, text) : SR_ENOMEM;
  free(text);
  if (rc) {
    sr_fmt(err, errlen, "%s: cannot write", path);
    return rc;
  }
  snprintf(path, sizeof path, "%s/plan.json", tmp);
  if ((rc = emb_plan_save(plan, path, err, errlen))) return rc;
  snprintf(path, sizeof path, "%s/dense.bin", tmp);
  if ((rc = dense_model_save(model, path, err, errlen))) return rc;
  snprintf(path, sizeof path, "%s/rows", tmp);
  if ((rc = emb_store_checkpoint(store, path))) {
    sr_fmt(err, errlen, "%s: %s", path, emb_store_errmsg(store));
    return rc;
  }
  rm_rf(dir);
  if (rename(tmp, dir) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename into place: %s", dir, strerror(errno));
    return SR_EIO;
  }
  return 0;
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

int model_dir_read_config(const char *dir, dense_config *cfg, emb_plan **plan, char *err,
                          size_t errlen) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model.json", dir);
  char *text = read_text(path);
  if (!text) {
    sr_fmt(err, errlen, "%s: cannot read (is %s a saved model?)", path, dir);
    return SR_EIO;
  }
  cJSON *j = cJSON_Parse(text);
  free(text);
  int rc = model_arch_parse(j, path, cfg, err, errlen);
  cJSON_Delete(j);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/plan.json", dir);
  return emb_plan_load(path, plan, err, errlen);
}

int model_arch_parse(const cJSON *j, const char *src, dense_config *cfg, char *err,
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
    if (!bad) cfg->interaction = !strcmp(x->valuestring, "cat") ? DENSE_INTERACT_CAT : DENSE_INTERACT_DOT;
    cfg->interaction_itself = cJSON_IsTrue(cJSON_GetObjectItem(j, "interaction_itself"));
  }
  if (bad) {
    sr_fmt(err, errlen, "%s: not a valid model description", src);
    return SR_EFORMAT;
  }
  return dense_config_validate(cfg, err, errlen);
}

int model_dir_load_state(const char *dir, dense_model *model, emb_store *store, char *err,
                         size_t errlen) {
  char path[4200];
  snprintf(path, sizeof path, "%s/dense.bin", dir);
  int rc = dense_model_load(model, path, err, errlen);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/rows", dir);
  rc = emb_store_restore(store, path);
  if (rc) sr_fmt(err, errlen, "%s: %s", path, emb_store_errmsg(store));
  return rc;
}
