/* The sharding plan: JSON in and out, validation, fingerprints, placement,
 * row init. See plan.h for the file layout. */
#include "embedding/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/outfile.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/status.h"
#include "embedding/precision.h"

/* ---- names ---- */

double emb_optim_default_eps(emb_optim_kind kind) {
  switch (kind) {
    case EMB_OPT_ADAGRAD: return 1e-10;
    case EMB_OPT_ROWWISE_ADAGRAD: return 1e-8;
    default: return 0.0;
  }
}

const char *emb_optim_name(emb_optim_kind kind) {
  switch (kind) {
    case EMB_OPT_SGD: return "sgd";
    case EMB_OPT_ADAGRAD: return "adagrad";
    case EMB_OPT_ROWWISE_ADAGRAD: return "rowwise_adagrad";
  }
  return "?";
}

int emb_optim_parse(const char *s, emb_optim_kind *out) {
  if (!s) return -1;
  if (!strcmp(s, "sgd")) *out = EMB_OPT_SGD;
  else if (!strcmp(s, "adagrad")) *out = EMB_OPT_ADAGRAD;
  else if (!strcmp(s, "rowwise_adagrad")) *out = EMB_OPT_ROWWISE_ADAGRAD;
  else return -1;
  return 0;
}

const char *emb_precision_name(emb_precision p) {
  return p == EMB_PREC_FP16 ? "fp16" : p == EMB_PREC_BF16 ? "bf16" : "fp32";
}

int emb_precision_parse(const char *s, emb_precision *out) {
  if (!s) return -1;
  if (!strcmp(s, "fp32")) *out = EMB_PREC_FP32;
  else if (!strcmp(s, "fp16")) *out = EMB_PREC_FP16;
  else if (!strcmp(s, "bf16")) *out = EMB_PREC_BF16;
  else return -1;
  return 0;
}

int emb_precision_bytes(emb_precision p) { return p == EMB_PREC_FP32 ? 4 : 2; }

const char *emb_pooling_name(emb_pooling p) { return p == EMB_POOL_MEAN ? "mean" : "sum"; }

int emb_pooling_parse(const char *s, emb_pooling *out) {
  if (!s) return -1;
  if (!strcmp(s, "sum")) *out = EMB_POOL_SUM;
  else if (!strcmp(s, "mean")) *out = EMB_POOL_MEAN;
  else return -1;
  return 0;
}

double emb_default_init_range(uint64_t rows) {
  if (rows == EMB_ROWS_UNBOUNDED) rows = EMB_UNBOUNDED_ROWS_ESTIMATE;
  return sqrt(1.0 / (double)rows);
}

int emb_keep_on(const emb_table *t) {
  const emb_keep_cfg *k = &t->keep;
  return k->admit_after > 1 || k->expire_after > 0 || k->capacity > 0;
}

const char *emb_evict_name(emb_evict_kind k) { return k == EMB_EVICT_LFU ? "lfu" : "lru"; }

int emb_evict_parse(const char *s, emb_evict_kind *out) {
  if (!strcmp(s, "lru")) *out = EMB_EVICT_LRU;
  else if (!strcmp(s, "lfu")) *out = EMB_EVICT_LFU;
  else return -1;
  return 0;
}

/* ---- plan memory ---- */

void emb_plan_free(emb_plan *plan) {
  if (!plan) return;
  if (plan->tables)
    for (int i = 0; i < plan->n_tables; i++) free(plan->tables[i].place.shards);
  free(plan->tables);
  free(plan);
}

static emb_plan *plan_alloc(int n_tables) {
  emb_plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->format = EMB_PLAN_FORMAT;
  p->n_tables = n_tables;
  p->tables = calloc((size_t)(n_tables > 0 ? n_tables : 1), sizeof *p->tables);
  if (!p->tables) {
    free(p);
    return NULL;
  }
  return p;
}

emb_plan *emb_plan_clone(const emb_plan *src) {
  emb_plan *p = plan_alloc(src->n_tables);
  if (!p) return NULL;
  p->format = src->format;
  p->seed = src->seed;
  p->n_shards = src->n_shards;
  for (int i = 0; i < src->n_tables; i++) {
    p->tables[i] = src->tables[i];
    p->tables[i].place.shards = NULL;
    int n = src->tables[i].place.n;
    if (n > 0) {
      p->tables[i].place.shards = malloc((size_t)n * sizeof(int));
      if (!p->tables[i].place.shards) {
        emb_plan_free(p);
        return NULL;
      }
      memcpy(p->tables[i].place.shards, src->tables[i].place.shards, (size_t)n * sizeof(int));
    }
  }
  return p;
}

/* ---- validation ---- */

int emb_plan_validate(const emb_plan *p, const char *src, char *err, size_t errlen) {
  if (!src) src = "plan";
#define BAD(...)                                                                         \
  do {                                                                                   \
    char m_[256];                                                                        \
    snprintf(m_, sizeof m_, __VA_ARGS__);                                                \
    sr_fmt(err, errlen, "%s: %s", src, m_);                                              \
    return SR_EINVAL;                                                                    \
  } while (0)
  if (p->format != EMB_PLAN_FORMAT) BAD("format: %d is not supported (this build reads %d)", p->format, EMB_PLAN_FORMAT);
  if (p->n_shards < 1 || p->n_shards > EMB_MAX_SHARDS) BAD("n_shards: must be 1..%d", EMB_MAX_SHARDS);
  if (p->n_tables < 1 || p->n_tables > EMB_MAX_TABLES) BAD("tables: must hold 1..%d tables", EMB_MAX_TABLES);
  for (int i = 0; i < p->n_tables; i++) {
    const emb_table *t = &p->tables[i];
    for (int j = 0; j < i; j++) {
      if (p->tables[j].table_id == t->table_id)
        BAD("tables[%d].table_id: %u is also the table_id of tables[%d]", i, t->table_id, j);
      if (!strcmp(p->tables[j].name, t->name))
        BAD("tables[%d].name: \"%s\" is also the name of tables[%d]", i, t->name, j);
    }
    if (!t->name[0]) BAD("tables[%d].name: must not be empty", i);
    for (const char *c = t->name; *c; c++)
      if ((unsigned char)*c < 0x20 || *c == '"' || *c == '\\' || (unsigned char)*c >= 0x7f)
        BAD("tables[%d].name: must be printable ASCII without quotes or backslashes", i);
    if (t->rows > EMB_ROWS_MAX) BAD("tables[%d].rows: must be 1..2^53 or \"unbounded\"", i);
    if (t->dim < 1 || t->dim > EMB_MAX_DIM) BAD("tables[%d].dim: must be 1..%d", i, EMB_MAX_DIM);
    if (t->pooling != EMB_POOL_SUM && t->pooling != EMB_POOL_MEAN)
      BAD("tables[%d].pooling: must be \"sum\" or \"mean\"", i);
    if (!(t->init_range > 0.0) || !isfinite(t->init_range) || (float)t->init_range <= 0.0f ||
        !isfinite((float)t->init_range))
      BAD("tables[%d].init_range: must be a positive finite number", i);
    if ((unsigned)t->precision > EMB_PREC_BF16)
      BAD("tables[%d].precision: must be \"fp32\", \"fp16\" or \"bf16\"", i);
    if ((unsigned)t->optim.kind > EMB_OPT_ROWWISE_ADAGRAD)
      BAD("tables[%d].optimizer.name: must be \"sgd\", \"adagrad\" or \"rowwise_adagrad\"", i);
    if (!(t->optim.eps >= 0.0) || !isfinite(t->optim.eps))
      BAD("tables[%d].optimizer.eps: must be a finite number >= 0", i);
    if (!(t->optim.init_acc >= 0.0) || !isfinite(t->optim.init_acc))
      BAD("tables[%d].optimizer.initial_accumulator_value: must be a finite number >= 0", i);
    if (t->keep.admit_after > EMB_KEEP_MAX || t->keep.admit_window > EMB_KEEP_MAX ||
        t->keep.expire_after > EMB_KEEP_MAX)
      BAD("tables[%d].keep: admit_after, admit_window and expire_after must be 0..%llu", i,
          (unsigned long long)EMB_KEEP_MAX);
    if (t->keep.capacity > EMB_ROWS_MAX) BAD("tables[%d].keep.capacity: must be 0..2^53", i);
    if ((unsigned)t->keep.evict > EMB_EVICT_LFU) BAD("tables[%d].keep.evict: must be \"lru\" or \"lfu\"", i);
    if (t->keep.half_life > EMB_KEEP_MAX) BAD("tables[%d].keep.half_life: must be 0..%llu", i, (unsigned long long)EMB_KEEP_MAX);
    if (t->keep.half_life && t->keep.evict != EMB_EVICT_LFU)
      BAD("tables[%d].keep.half_life: decays lfu's counts; evict is \"%s\"", i, emb_evict_name(t->keep.evict));
    if (t->place.kind != EMB_PLACE_TABLE && t->place.kind != EMB_PLACE_ROW)
      BAD("tables[%d].placement.kind: must be \"table\" or \"row\"", i);
    if (t->place.kind == EMB_PLACE_TABLE && t->place.n != 1)
      BAD("tables[%d].placement.shards: a table-wise placement names exactly one shard", i);
    if (t->place.n < 1 || t->place.n > p->n_shards || !t->place.shards)
      BAD("tables[%d].placement.shards: must list 1..n_shards (%d) shards", i, p->n_shards);
    for (int k = 0; k < t->place.n; k++) {
      int s = t->place.shards[k];
      if (s < 0 || s >= p->n_shards)
        BAD("tables[%d].placement.shards[%d]: shard %d is out of range 0..%d", i, k, s, p->n_shards - 1);
      for (int m = 0; m < k; m++)
        if (t->place.shards[m] == s) BAD("tables[%d].placement.shards[%d]: shard %d is listed twice", i, k, s);
    }
  }
#undef BAD
  return 0;
}

/* ---- create ---- */

static uint64_t table_bytes(uint64_t rows, int dim, emb_optim_kind k, emb_precision prec) {
  if (rows == EMB_ROWS_UNBOUNDED) rows = EMB_UNBOUNDED_ROWS_ESTIMATE;
  uint64_t state = k == EMB_OPT_ADAGRAD ? (uint64_t)dim : k == EMB_OPT_ROWWISE_ADAGRAD ? 1 : 0;
  return rows * ((uint64_t)dim * (uint64_t)emb_precision_bytes(prec) + state * 4);
}

int emb_plan_create(const emb_plan_params *pp, emb_plan **out, char *err, size_t errlen) {
  *out = NULL;
  if (pp->n_tables < 1 || pp->n_tables > EMB_MAX_TABLES || !pp->rows) {
    sr_fmt(err, errlen, "plan: need 1..%d tables", EMB_MAX_TABLES);
    return SR_EINVAL;
  }
  if (pp->n_shards < 1 || pp->n_shards > EMB_MAX_SHARDS) {
    sr_fmt(err, errlen, "plan: shards: must be 1..%d", EMB_MAX_SHARDS);
    return SR_EINVAL;
  }
  emb_plan *p = plan_alloc(pp->n_tables);
  if (!p) goto nomem;
  p->seed = pp->seed;
  p->n_shards = pp->n_shards;
  for (int i = 0; i < pp->n_tables; i++) {
    emb_table *t = &p->tables[i];
    t->table_id = (uint32_t)i;
    if (pp->names && pp->names[i]) snprintf(t->name, sizeof t->name, "%s", pp->names[i]);
    else snprintf(t->name, sizeof t->name, "t%d", i);
    t->rows = pp->rows[i];
    t->dim = pp->dim;
    t->pooling = pp->pooling;
    t->init_range = pp->init_range > 0 ? pp->init_range : emb_default_init_range(t->rows);
    t->optim = pp->optim;
    t->precision = pp->precision;
    t->keep = pp->keep;
    if (t->optim.eps < 0) t->optim.eps = emb_optim_default_eps(t->optim.kind);
    if (t->optim.kind == EMB_OPT_SGD) t->optim.eps = 0, t->optim.init_acc = 0;
    t->place.kind = pp->row_wise ? EMB_PLACE_ROW : EMB_PLACE_TABLE;
    t->place.n = pp->row_wise ? pp->n_shards : 1;
    t->place.shards = calloc((size_t)t->place.n, sizeof(int));
    if (!t->place.shards) goto nomem;
    if (pp->row_wise)
      for (int s = 0; s < pp->n_shards; s++) t->place.shards[s] = s;
  }
  if (!pp->row_wise) {
    /* Greedy: largest table first (ties by index) onto the least-loaded shard
     * (ties to the lowest index). n_tables is small: selection sort is fine. */
    uint64_t *load = calloc((size_t)pp->n_shards, sizeof *load);
    char *done = calloc((size_t)pp->n_tables, 1);
    if (!load || !done) {
      free(load);
      free(done);
      goto nomem;
    }
    for (int step = 0; step < pp->n_tables; step++) {
      int best = -1;
      uint64_t bb = 0;
      for (int i = 0; i < pp->n_tables; i++) {
        if (done[i]) continue;
        uint64_t b = table_bytes(p->tables[i].rows, p->tables[i].dim, p->tables[i].optim.kind,
                                 p->tables[i].precision);
        if (best < 0 || b > bb) best = i, bb = b;
      }
      int s = 0;
      for (int k = 1; k < pp->n_shards; k++)
        if (load[k] < load[s]) s = k;
      load[s] += bb;
      p->tables[best].place.shards[0] = s;
      done[best] = 1;
    }
    free(load);
    free(done);
  }
  int rc = emb_plan_validate(p, "plan", err, errlen);
  if (rc) {
    emb_plan_free(p);
    return rc;
  }
  *out = p;
  return 0;
nomem:
  emb_plan_free(p);
  sr_fmt(err, errlen, "plan: out of memory");
  return SR_ENOMEM;
}

/* ---- parse ---- */

typedef struct {
  const char *src;
  char *err;
  size_t errlen;
} pctx;

static int perr(pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(pctx *c, const char *fmt, ...) {
  char m[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  sr_fmt(c->err, c->errlen, "%s: %s", c->src, m);
  return SR_EINVAL;
}

/* An exact non-negative integer number <= max, or -1. */
static int json_uint(const cJSON *j, double max, uint64_t *out) {
  if (!cJSON_IsNumber(j)) return -1;
  double v = j->valuedouble;
  if (!(v >= 0) || v > max || v != floor(v)) return -1;
  *out = (uint64_t)v;
  return 0;
}

static int parse_u64_string(const char *s, uint64_t *out) {
  if (!s || !*s || *s < '0' || *s > '9') return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno) return -1;
  *out = v;
  return 0;
}

/* Every key of obj one of known[] (NULL-terminated) and given once, else
 * SR_EINVAL naming the key (at most 40 bytes of it, a byte that is not
 * printable ASCII as '?') and where ("tables[0].keep"): a misspelt key
 * would otherwise leave its field at its default unsaid. */
static int only_keys(pctx *c, const cJSON *obj, const char *where, const char *const *known) {
  const cJSON *e;
  cJSON_ArrayForEach(e, obj) {
    const char *key = e->string ? e->string : "";
    int k = 0;
    while (known[k] && strcmp(known[k], key)) k++;
    const cJSON *first = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (known[k] && first == e) continue;
    char shown[41];
    size_t n = 0;
    for (; key[n] && n < sizeof shown - 1; n++)
      shown[n] = key[n] >= 0x20 && key[n] < 0x7f ? key[n] : '?';
    shown[n] = 0;
    if (!known[k]) {
      char list[256] = "";
      for (int m = 0; known[m]; m++)
        sr_fmt(list + strlen(list), sizeof list - strlen(list), "%s%s", m ? ", " : "", known[m]);
      return perr(c, "%s: unknown key \"%s%s\" (known: %s)", where, shown, key[n] ? "..." : "",
                  list);
    }
    return perr(c, "%s: key \"%s\" given twice", where, shown);
  }
  return 0;
}

static const cJSON *need(pctx *c, const cJSON *obj, const char *key, const char *where, int *rc) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!j) *rc = perr(c, "%s%s: missing", where, key);
  return j;
}

/* The optional "keep" object of a table (w: "tables[i]."). */
static int parse_keep(pctx *c, const cJSON *jt, const char *w, emb_keep_cfg *k) {
  const cJSON *jk = cJSON_GetObjectItemCaseSensitive(jt, "keep"), *j;
  memset(k, 0, sizeof *k);
  if (!jk) return 0;
  if (!cJSON_IsObject(jk)) return perr(c, "%skeep: must be an object", w);
  static const char *const keys[] = {"admit_after", "admit_window", "expire_after", "capacity",
                                     "evict", "half_life", NULL};
  char where[64];
  snprintf(where, sizeof where, "%skeep", w);
  int rc = only_keys(c, jk, where, keys);
  if (rc) return rc;
  uint64_t *dst[] = {&k->admit_after, &k->admit_window, &k->expire_after, &k->capacity};
  const char *const *names = keys; /* the first four are dst's */
  for (int f = 0; f < 4; f++) {
    double max = f == 3 ? (double)EMB_ROWS_MAX : (double)EMB_KEEP_MAX;
    if ((j = cJSON_GetObjectItemCaseSensitive(jk, names[f])) && json_uint(j, max, dst[f]))
      return perr(c, "%skeep.%s: must be an integer 0..%.0f", w, names[f], max);
  }
  if ((j = cJSON_GetObjectItemCaseSensitive(jk, "evict")) &&
      (!cJSON_IsString(j) || emb_evict_parse(j->valuestring, &k->evict)))
    return perr(c, "%skeep.evict: must be \"lru\" or \"lfu\"", w);
  if ((j = cJSON_GetObjectItemCaseSensitive(jk, "half_life")) &&
      json_uint(j, (double)EMB_KEEP_MAX, &k->half_life))
    return perr(c, "%skeep.half_life: must be an integer 0..%.0f", w, (double)EMB_KEEP_MAX);
  return 0;
}

static int parse_table(pctx *c, const cJSON *jt, int i, emb_table *t, int n_shards) {
  char w[48];
  snprintf(w, sizeof w, "tables[%d].", i);
  int rc = 0;
  const cJSON *j;
  uint64_t u;
  if (!cJSON_IsObject(jt)) return perr(c, "tables[%d]: must be an object", i);
  static const char *const keys[] = {"table_id", "name",      "rows",      "dim",
                                     "pooling",  "init_range", "optimizer", "precision",
                                     "keep",     "placement",  NULL};
  char where[48];
  snprintf(where, sizeof where, "tables[%d]", i);
  if ((rc = only_keys(c, jt, where, keys))) return rc;
  if (!(j = need(c, jt, "table_id", w, &rc))) return rc;
  if (json_uint(j, 4294967295.0, &u)) return perr(c, "%stable_id: must be an integer 0..4294967295", w);
  t->table_id = (uint32_t)u;
  if (!(j = need(c, jt, "name", w, &rc))) return rc;
  if (!cJSON_IsString(j) || strlen(j->valuestring) >= EMB_NAME_MAX)
    return perr(c, "%sname: must be a string of at most %d bytes", w, EMB_NAME_MAX - 1);
  snprintf(t->name, sizeof t->name, "%s", j->valuestring);
  if (!(j = need(c, jt, "rows", w, &rc))) return rc;
  if (cJSON_IsString(j) && !strcmp(j->valuestring, "unbounded")) t->rows = EMB_ROWS_UNBOUNDED;
  else if (cJSON_IsString(j) && !parse_u64_string(j->valuestring, &u) && u <= EMB_ROWS_MAX) t->rows = u;
  else if (!json_uint(j, (double)EMB_ROWS_MAX, &u)) t->rows = u;
  else return perr(c, "%srows: must be an integer 1..2^53 or \"unbounded\"", w);
  if (!(j = need(c, jt, "dim", w, &rc))) return rc;
  if (json_uint(j, EMB_MAX_DIM, &u) || u < 1) return perr(c, "%sdim: must be 1..%d", w, EMB_MAX_DIM);
  t->dim = (int)u;
  if (!(j = need(c, jt, "pooling", w, &rc))) return rc;
  if (!cJSON_IsString(j) || emb_pooling_parse(j->valuestring, &t->pooling))
    return perr(c, "%spooling: must be \"sum\" or \"mean\"", w);
  j = cJSON_GetObjectItemCaseSensitive(jt, "init_range");
  if (j) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble > 0) || !isfinite(j->valuedouble))
      return perr(c, "%sinit_range: must be a positive number", w);
    t->init_range = j->valuedouble;
  } else {
    t->init_range = emb_default_init_range(t->rows);
  }
  const cJSON *jo = need(c, jt, "optimizer", w, &rc);
  if (!jo) return rc;
  if (!cJSON_IsObject(jo)) return perr(c, "%soptimizer: must be an object", w);
  static const char *const okeys[] = {"name", "eps", "initial_accumulator_value", NULL};
  char wo[64];
  snprintf(wo, sizeof wo, "%soptimizer", w);
  if ((rc = only_keys(c, jo, wo, okeys))) return rc;
  snprintf(wo, sizeof wo, "%soptimizer.", w);
  if (!(j = need(c, jo, "name", wo, &rc))) return rc;
  if (!cJSON_IsString(j) || emb_optim_parse(j->valuestring, &t->optim.kind))
    return perr(c, "%sname: must be \"sgd\", \"adagrad\" or \"rowwise_adagrad\"", wo);
  t->optim.eps = emb_optim_default_eps(t->optim.kind);
  t->optim.init_acc = 0.0;
  if ((j = cJSON_GetObjectItemCaseSensitive(jo, "eps"))) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || !isfinite(j->valuedouble))
      return perr(c, "%seps: must be a number >= 0", wo);
    t->optim.eps = j->valuedouble;
  }
  if ((j = cJSON_GetObjectItemCaseSensitive(jo, "initial_accumulator_value"))) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || !isfinite(j->valuedouble))
      return perr(c, "%sinitial_accumulator_value: must be a number >= 0", wo);
    t->optim.init_acc = j->valuedouble;
  }
  if (t->optim.kind == EMB_OPT_SGD && (t->optim.eps != 0 || t->optim.init_acc != 0))
    return perr(c, "%s: sgd takes no eps or initial_accumulator_value", wo);
  if ((j = cJSON_GetObjectItemCaseSensitive(jt, "precision")) &&
      (!cJSON_IsString(j) || emb_precision_parse(j->valuestring, &t->precision)))
    return perr(c, "%sprecision: must be \"fp32\", \"fp16\" or \"bf16\"", w);
  if ((rc = parse_keep(c, jt, w, &t->keep))) return rc;
  const cJSON *jp = need(c, jt, "placement", w, &rc);
  if (!jp) return rc;
  if (!cJSON_IsObject(jp)) return perr(c, "%splacement: must be an object", w);
  static const char *const pkeys[] = {"kind", "shards", NULL};
  char wp[64];
  snprintf(wp, sizeof wp, "%splacement", w);
  if ((rc = only_keys(c, jp, wp, pkeys))) return rc;
  snprintf(wp, sizeof wp, "%splacement.", w);
  if (!(j = need(c, jp, "kind", wp, &rc))) return rc;
  if (cJSON_IsString(j) && !strcmp(j->valuestring, "table")) t->place.kind = EMB_PLACE_TABLE;
  else if (cJSON_IsString(j) && !strcmp(j->valuestring, "row")) t->place.kind = EMB_PLACE_ROW;
  else return perr(c, "%skind: must be \"table\" or \"row\"", wp);
  if (!(j = need(c, jp, "shards", wp, &rc))) return rc;
  int n = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
  if (n < 1 || n > n_shards) return perr(c, "%sshards: must be an array of 1..n_shards (%d) shard indices", wp, n_shards);
  if (t->place.kind == EMB_PLACE_TABLE && n != 1)
    return perr(c, "%sshards: a table-wise placement names exactly one shard", wp);
  t->place.shards = malloc((size_t)n * sizeof(int));
  if (!t->place.shards) {
    sr_fmt(c->err, c->errlen, "%s: out of memory", c->src);
    return SR_ENOMEM;
  }
  t->place.n = n;
  int k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, j) {
    if (json_uint(e, 1e9, &u) || u >= (uint64_t)n_shards)
      return perr(c, "%sshards[%d]: shard out of range 0..%d", wp, k, n_shards - 1);
    t->place.shards[k++] = (int)u;
  }
  return 0;
}

int emb_plan_parse(const char *json, const char *src, emb_plan **out, char *err, size_t errlen) {
  pctx c = {src ? src : "plan", err, errlen};
  *out = NULL;
  cJSON *root = cJSON_Parse(json);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    long off = at && at >= json ? (long)(at - json) : -1;
    sr_fmt(err, errlen, "%s: not valid JSON (near byte %ld)", c.src, off);
    return SR_EFORMAT;
  }
  emb_plan *p = NULL;
  int rc = 0;
  const cJSON *j;
  uint64_t u;
  if (!cJSON_IsObject(root)) {
    rc = perr(&c, "top level: must be an object");
    goto done;
  }
  static const char *const keys[] = {"format", "seed", "n_shards", "tables", NULL};
  if ((rc = only_keys(&c, root, "top level", keys))) goto done;
  if (!(j = need(&c, root, "format", "", &rc))) goto done;
  if (json_uint(j, 1e9, &u)) {
    rc = perr(&c, "format: must be an integer");
    goto done;
  }
  if (u != EMB_PLAN_FORMAT) {
    sr_fmt(err, errlen, "%s: format: %llu is not supported (this build reads %d)", c.src,
           (unsigned long long)u, EMB_PLAN_FORMAT);
    rc = SR_EVERSION;
    goto done;
  }
  const cJSON *js = need(&c, root, "seed", "", &rc);
  if (!js) goto done;
  uint64_t seed;
  if (!(cJSON_IsString(js) && !parse_u64_string(js->valuestring, &seed)) &&
      json_uint(js, 9007199254740991.0, &seed)) {
    rc = perr(&c, "seed: must be a decimal string of a uint64 (or an integer number below 2^53)");
    goto done;
  }
  if (!(j = need(&c, root, "n_shards", "", &rc))) goto done;
  if (json_uint(j, EMB_MAX_SHARDS, &u) || u < 1) {
    rc = perr(&c, "n_shards: must be 1..%d", EMB_MAX_SHARDS);
    goto done;
  }
  int n_shards = (int)u;
  const cJSON *jt = need(&c, root, "tables", "", &rc);
  if (!jt) goto done;
  int n = cJSON_IsArray(jt) ? cJSON_GetArraySize(jt) : -1;
  if (n < 1 || n > EMB_MAX_TABLES) {
    rc = perr(&c, "tables: must be an array of 1..%d tables", EMB_MAX_TABLES);
    goto done;
  }
  p = plan_alloc(n);
  if (!p) {
    rc = SR_ENOMEM;
    sr_fmt(err, errlen, "%s: out of memory", c.src);
    goto done;
  }
  p->seed = seed;
  p->n_shards = n_shards;
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, jt) {
    if ((rc = parse_table(&c, e, i, &p->tables[i], n_shards))) goto done;
    i++;
  }
  rc = emb_plan_validate(p, c.src, err, errlen);
  /* A table that bounds nothing keeps no keep fields (evict, half_life,
   * admit_window alone mean nothing): as the canonical form, which leaves
   * them out, reads back. */
  for (int t = 0; !rc && t < p->n_tables; t++)
    if (!emb_keep_on(&p->tables[t])) memset(&p->tables[t].keep, 0, sizeof p->tables[t].keep);
done:
  cJSON_Delete(root);
  if (rc) emb_plan_free(p);
  else *out = p;
  return rc;
}

int emb_plan_load(const char *path, emb_plan **out, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return SR_EIO;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (len < cap) break;
    if (cap >= (64u << 20)) {
      free(buf);
      fclose(f);
      sr_fmt(err, errlen, "%s: larger than 64 MiB: not a plan", path);
      return SR_EFORMAT;
    }
    char *nb = realloc(buf, 2 * cap + 1);
    if (!nb) free(buf);
    buf = nb;
    cap *= 2;
  }
  int rd = ferror(f);
  fclose(f);
  if (!buf) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  if (rd) {
    free(buf);
    sr_fmt(err, errlen, "%s: read error", path);
    return SR_EIO;
  }
  buf[len] = '\0';
  int rc = emb_plan_parse(buf, path, out, err, errlen);
  free(buf);
  return rc;
}

/* ---- canonical writer ---- */

typedef struct {
  char *s;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t nc = b->cap * 2 + (size_t)n + 64;
    char *ns = realloc(b->s, nc);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = nc;
  }
}

/* Shortest %.Ng that reads back as the same double. */
static void fmt_double(char out[32], double v) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(out, 32, "%.*g", prec, v);
    if (strtod(out, NULL) == v) return;
  }
}

static void write_plan(sbuf *b, const emb_plan *p, int with_placement, int pretty) {
  const char *nl = pretty ? "\n" : "", *sp = pretty ? " " : "", *in = pretty ? "  " : "",
             *in2 = pretty ? "    " : "";
  char d1[32], d2[32], d3[32];
  sb_put(b, "{%s%s\"format\":%s%d,%s%s\"seed\":%s\"%llu\",", nl, in, sp, p->format, nl, in, sp,
         (unsigned long long)p->seed);
  if (pretty) sb_put(b, "\n");
  if (with_placement) sb_put(b, "%s\"n_shards\":%s%d,%s", in, sp, p->n_shards, nl);
  sb_put(b, "%s\"tables\":%s[%s", in, sp, nl);
  for (int i = 0; i < p->n_tables; i++) {
    const emb_table *t = &p->tables[i];
    fmt_double(d1, t->init_range);
    fmt_double(d2, t->optim.eps);
    fmt_double(d3, t->optim.init_acc);
    sb_put(b, "%s{\"table_id\":%s%u,%s\"name\":%s\"%s\",%s\"rows\":%s", in2, sp, t->table_id, sp, sp,
           t->name, sp, sp);
    if (t->rows == EMB_ROWS_UNBOUNDED) sb_put(b, "\"unbounded\"");
    else sb_put(b, "%llu", (unsigned long long)t->rows);
    sb_put(b, ",%s\"dim\":%s%d,%s\"pooling\":%s\"%s\",%s\"init_range\":%s%s,", sp, sp, t->dim, sp, sp,
           emb_pooling_name(t->pooling), sp, sp, d1);
    if (pretty) sb_put(b, "\n%s ", in2);
    sb_put(b, "\"optimizer\":%s{\"name\":%s\"%s\"", sp, sp, emb_optim_name(t->optim.kind));
    if (t->optim.kind != EMB_OPT_SGD)
      sb_put(b, ",%s\"eps\":%s%s,%s\"initial_accumulator_value\":%s%s", sp, sp, d2, sp, sp, d3);
    sb_put(b, "}");
    if (t->precision != EMB_PREC_FP32)
      sb_put(b, ",%s\"precision\":%s\"%s\"", sp, sp, emb_precision_name(t->precision));
    if (emb_keep_on(t)) {
      const emb_keep_cfg *k = &t->keep;
      sb_put(b, ",%s\"keep\":%s{\"admit_after\":%s%llu,%s\"admit_window\":%s%llu,", sp, sp, sp,
             (unsigned long long)k->admit_after, sp, sp, (unsigned long long)k->admit_window);
      sb_put(b, "%s\"expire_after\":%s%llu,%s\"capacity\":%s%llu,%s\"evict\":%s\"%s\"", sp, sp,
             (unsigned long long)k->expire_after, sp, sp, (unsigned long long)k->capacity, sp, sp,
             emb_evict_name(k->evict));
      if (k->half_life) sb_put(b, ",%s\"half_life\":%s%llu", sp, sp, (unsigned long long)k->half_life);
      sb_put(b, "}");
    }
    if (with_placement) {
      sb_put(b, ",");
      if (pretty) sb_put(b, "\n%s ", in2);
      sb_put(b, "\"placement\":%s{\"kind\":%s\"%s\",%s\"shards\":%s[", sp, sp,
             t->place.kind == EMB_PLACE_ROW ? "row" : "table", sp, sp);
      for (int k = 0; k < t->place.n; k++) sb_put(b, "%s%d", k ? "," : "", t->place.shards[k]);
      sb_put(b, "]}");
    }
    sb_put(b, "}%s%s", i + 1 < p->n_tables ? "," : "", nl);
  }
  sb_put(b, "%s]%s}%s", in, nl, nl);
}

char *emb_plan_canonical(const emb_plan *plan, int with_placement) {
  sbuf b = {malloc(1024), 0, 1024, 0};
  if (!b.s) return NULL;
  write_plan(&b, plan, with_placement, 0);
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}

static int fingerprint(const emb_plan *plan, int with_placement, char hex[EMB_FP_HEX]) {
  char *s = emb_plan_canonical(plan, with_placement);
  if (!s) return SR_ENOMEM;
  int rc = sr_sha256_hex(s, strlen(s), hex);
  free(s);
  return rc;
}

int emb_plan_model_fingerprint(const emb_plan *plan, char hex[EMB_FP_HEX]) {
  return fingerprint(plan, 0, hex);
}

int emb_plan_fingerprint(const emb_plan *plan, char hex[EMB_FP_HEX]) {
  return fingerprint(plan, 1, hex);
}

int emb_plan_save(const emb_plan *plan, const char *path, char *err, size_t errlen) {
  int rc = emb_plan_validate(plan, path, err, errlen);
  if (rc) return rc;
  sbuf b = {malloc(4096), 0, 4096, 0};
  if (b.s) write_plan(&b, plan, 1, 1);
  if (!b.s || b.oom) {
    free(b.s);
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  sr_outfile *o;
  rc = sr_out_open(path, &o, err, errlen);
  if (!rc) {
    sr_out_write(o, b.s, b.len);
    rc = sr_out_commit(o, err, errlen); /* a write error is kept until here */
  }
  free(b.s);
  return rc;
}

/* ---- placement and init ---- */

int emb_plan_table_index(const emb_plan *plan, uint32_t table_id) {
  for (int i = 0; i < plan->n_tables; i++)
    if (plan->tables[i].table_id == table_id) return i;
  return -1;
}

int emb_plan_shard_of(const emb_plan *plan, int table, uint64_t row_id) {
  const emb_placement *pl = &plan->tables[table].place;
  if (pl->kind == EMB_PLACE_TABLE || pl->n == 1) return pl->shards[0];
  return pl->shards[sr_mix64(row_id) % (uint64_t)pl->n];
}

size_t emb_plan_first_out_of_range(const emb_plan *plan, int table, const uint64_t *ids,
                                   size_t n) {
  const uint64_t rows = plan->tables[table].rows;
  if (rows == EMB_ROWS_UNBOUNDED) return n;
  /* With rows <= EMB_ROWS_MAX < 2^63, id < rows exactly when neither id nor
   * rows - 1 - id (modulo 2^64) has its top bit set: a subtraction and two
   * ORs an id, which SSE2 does two at a time, where an unsigned 64-bit
   * maximum (no such instruction before AVX-512) stays scalar. */
  uint64_t bad = 0;
  for (size_t k = 0; k < n; k++) bad |= ids[k] | (rows - 1 - ids[k]);
  if (!(bad >> 63)) return n;
  size_t k = 0;
  while (ids[k] < rows) k++;
  return k;
}

int emb_plan_check_range(const emb_plan *plan, int table, const uint64_t *ids, size_t n,
                         const char *what, char *err, size_t errlen) {
  const size_t r = emb_plan_first_out_of_range(plan, table, ids, n);
  if (r == n) return 0;
  const emb_table *t = &plan->tables[table];
  sr_fmt(err, errlen, "%s%stable %d (%s): row id %llu is out of range 0..%llu", what ? what : "",
         what ? ": " : "", table, t->name, (unsigned long long)ids[r],
         (unsigned long long)(t->rows - 1));
  return SR_ERANGE;
}

void emb_row_init(const emb_plan *plan, int table, uint64_t row_id, float *out) {
  const emb_table *t = &plan->tables[table];
  const float a = (float)t->init_range;
  const size_t dim = (size_t)t->dim;
  /* Element j's bits: word j % 4 of the block at counter (row id, table id
   * << 32 | j / 4), drawn side by side. */
  uint32_t bits[EMB_MAX_DIM + 4];
  sr_philox_n(plan->seed, row_id, (uint64_t)t->table_id << 32, (dim + 3) / 4, bits);
  for (size_t j = 0; j < dim; j++) out[j] = a * (2.0f * sr_u01f(bits[j]) - 1.0f);
  if (t->precision != EMB_PREC_FP32) emb_values_round_nearest(t->precision, out, out, dim);
}

/* ---- growth ---- */

int emb_plan_grow(const emb_plan *p, const uint64_t *rows, emb_plan **out, char *err,
                  size_t errlen) {
  *out = NULL;
  for (int i = 0; i < p->n_tables; i++)
    if (p->tables[i].rows != EMB_ROWS_UNBOUNDED &&
        (rows[i] == EMB_ROWS_UNBOUNDED || rows[i] > EMB_ROWS_MAX)) {
      sr_fmt(err, errlen, "tables[%d] (%s): %llu rows is not a bound", i, p->tables[i].name,
             (unsigned long long)rows[i]);
      return SR_EINVAL;
    }
  emb_plan *g = emb_plan_clone(p);
  if (!g) {
    sr_fmt(err, errlen, "out of memory");
    return SR_ENOMEM;
  }
  for (int i = 0; i < g->n_tables; i++)
    if (g->tables[i].rows != EMB_ROWS_UNBOUNDED && rows[i] > g->tables[i].rows)
      g->tables[i].rows = rows[i];
  *out = g;
  return 0;
}

/* The first field other than rows in which table i of b differs from a's,
 * or NULL. */
static const char *table_differs(const emb_table *x, const emb_table *y) {
  if (x->table_id != y->table_id) return "table_id";
  if (strcmp(x->name, y->name)) return "name";
  if ((x->rows == EMB_ROWS_UNBOUNDED) != (y->rows == EMB_ROWS_UNBOUNDED)) return "rows (bounded or not)";
  if (x->dim != y->dim) return "dim";
  if (x->pooling != y->pooling) return "pooling";
  if (x->init_range != y->init_range) return "init_range";
  if (x->optim.kind != y->optim.kind || x->optim.eps != y->optim.eps ||
      x->optim.init_acc != y->optim.init_acc)
    return "optimizer";
  if (x->precision != y->precision) return "precision";
  if (x->keep.admit_after != y->keep.admit_after || x->keep.admit_window != y->keep.admit_window ||
      x->keep.expire_after != y->keep.expire_after || x->keep.capacity != y->keep.capacity ||
      x->keep.evict != y->keep.evict || x->keep.half_life != y->keep.half_life)
    return "keep";
  if (x->place.kind != y->place.kind || x->place.n != y->place.n ||
      memcmp(x->place.shards, y->place.shards, (size_t)x->place.n * sizeof(int)))
    return "placement";
  return NULL;
}

int emb_plan_grows(const emb_plan *a, const emb_plan *b, char *why, size_t len) {
  if (a->seed != b->seed || a->n_shards != b->n_shards || a->n_tables != b->n_tables ||
      a->format != b->format) {
    sr_fmt(why, len, "%s differs", a->seed != b->seed ? "seed" : a->n_shards != b->n_shards ?
           "n_shards" : a->n_tables != b->n_tables ? "the number of tables" : "format");
    return 0;
  }
  for (int i = 0; i < a->n_tables; i++) {
    const emb_table *x = &a->tables[i], *y = &b->tables[i];
    const char *f = table_differs(x, y);
    if (f) {
      sr_fmt(why, len, "tables[%d] (%s): %s differs", i, x->name, f);
      return 0;
    }
    if (y->rows < x->rows) {
      sr_fmt(why, len, "tables[%d] (%s): %llu rows, fewer than %llu", i, x->name,
             (unsigned long long)y->rows, (unsigned long long)x->rows);
      return 0;
    }
  }
  /* The canonical forms but rows, to be sure no other field differs. */
  emb_plan *c = emb_plan_clone(b);
  char *sa = emb_plan_canonical(a, 1), *sb = NULL;
  if (c) {
    for (int i = 0; i < c->n_tables; i++) c->tables[i].rows = a->tables[i].rows;
    sb = emb_plan_canonical(c, 1);
  }
  int same = sa && sb && !strcmp(sa, sb);
  if (!same) sr_fmt(why, len, sa && sb ? "the plans differ beyond their rows" : "out of memory");
  free(sa);
  free(sb);
  emb_plan_free(c);
  return same;
}

int emb_plan_agrees(const emb_plan *made, const emb_plan *ck) {
  if (made->n_tables != ck->n_tables || made->n_shards != ck->n_shards) return 0;
  /* ck's canonical form with made's init ranges and placement (borrowed,
   * put back before the copy is freed) against made's. */
  emb_plan *c = emb_plan_clone(ck);
  char *sa = emb_plan_canonical(made, 1), *sb = NULL;
  if (c) {
    emb_placement *own = malloc((size_t)c->n_tables * sizeof *own);
    if (own) {
      for (int i = 0; i < c->n_tables; i++) {
        own[i] = c->tables[i].place;
        c->tables[i].place = made->tables[i].place;
        c->tables[i].init_range = made->tables[i].init_range;
      }
      sb = emb_plan_canonical(c, 1);
      for (int i = 0; i < c->n_tables; i++) c->tables[i].place = own[i];
      free(own);
    }
  }
  int same = sa && sb && !strcmp(sa, sb);
  free(sa);
  free(sb);
  emb_plan_free(c);
  return same;
}
