/* The inspect report (see kv_inspect.h). */
#include "storage/kv_inspect.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/half.h"
#include "common/progress.h"
#include "common/status.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"


/* The first failure of a report that goes on. */
typedef struct {
  FILE *out;
  const kv_inspect_opts *o;
  int rc;
  char *err;
  size_t errlen;
  uint64_t rows, bytes;
  sr_progress pg;     /* the rows of the database being read (estimated total) */
  uint64_t pg_base;   /* its rows in the tables read before this one */
  int dbs, table_dbs; /* databases read; of them, those holding o->table */
  char what[300];
} report;

static void fail(report *r, int rc, const char *msg) {
  if (r->rc) return;
  r->rc = rc;
  sr_fmt(r->err, r->errlen, "%s", msg);
}

static void print_row(FILE *out, const char *v, size_t len) {
  const unsigned char *p = (const unsigned char *)v;
  if (len < KV_ROW_HEADER || p[0] != 'S' || p[1] != 'R') {
    fprintf(out, " (not a shardrec row: %zu bytes)\n", len);
    return;
  }
  int dim = p[4] | (p[5] << 8), sl = p[6] | (p[7] << 8), w;
  if (!kv_row_check(v, len, dim, sl, &w)) {
    fprintf(out, " (row layout version %u, %zu bytes: not readable by this build)\n", p[2], len);
    return;
  }
  /* The values read one at a time: dim and sl come from the file (up to
   * 65535 each), so no fixed buffer holds them. */
  const char *f = v + KV_ROW_HEADER;
  const size_t wb = w == KV_W_FP32 ? 4 : 2;
  fprintf(out, " value [");
  for (int j = 0; j < dim + sl; j++) {
    float x;
    uint16_t h;
    if (j < dim && wb == 2) {
      memcpy(&h, f + 2 * (size_t)j, 2);
      x = w == KV_W_FP16 ? sr_f16_to_f32(h) : sr_bf16_to_f32(h);
    } else {
      memcpy(&x, f + (j < dim ? 4 * (size_t)j : wb * (size_t)dim + 4 * (size_t)(j - dim)), 4);
    }
    if (j == dim) fprintf(out, "] state [");
    fprintf(out, "%s%.9g", j && j != dim ? " " : "", (double)x);
  }
  fprintf(out, "]");
  fprintf(out, "\n");
}

/* Family k of db: rows, bytes, layout; then the asked rows. */
static void inspect_table(report *r, kv_db *db, int k, uint32_t id, const char *name) {
  uint64_t cnt = 0, bytes = 0;
  int dim = -1, sl = -1, ver = -1, wt = 0;
  sr_progress_set(&r->pg, r->pg_base, 0); /* drawn at each table's start */
  kv_iter *it = kv_iter_create(db, k);
  for (; it && kv_iter_valid(it); kv_iter_next(it)) {
    size_t len;
    const char *v = kv_iter_value(it, &len);
    if (!cnt && len >= KV_ROW_HEADER) {
      const unsigned char *p = (const unsigned char *)v;
      ver = p[2];
      wt = p[3];
      dim = p[4] | (p[5] << 8);
      sl = p[6] | (p[7] << 8);
    }
    cnt++;
    bytes += 8 + len;
    if (!(cnt & 0xfff)) sr_progress_set(&r->pg, r->pg_base + cnt, 0);
  }
  kv_iter_destroy(it);
  sr_progress_clear(&r->pg);
  r->pg_base += cnt;
  fprintf(r->out, "%-8s table_id %-5u %10llu rows %12llu bytes", name, id,
          (unsigned long long)cnt, (unsigned long long)bytes);
  if (cnt)
    fprintf(r->out, "  (row layout v%d: dim %d%s, optimizer state %d)", ver, dim,
            ver == KV_ROW_VERSION_16 ? (wt == KV_W_FP16 ? " fp16" : wt == KV_W_BF16 ? " bf16" : " ?") : "",
            sl);
  fprintf(r->out, "\n");
  r->rows += cnt;
  r->bytes += bytes;
  kv_reader *rd = r->o->n_rows ? kv_reader_create() : NULL;
  if (r->o->n_rows && !rd) fail(r, SR_ENOMEM, "out of memory");
  for (int i = 0; rd && i < r->o->n_rows; i++) {
    const char *val = NULL;
    char e[1024];
    size_t len = 0;
    if (kv_reader_get_cf(rd, db, k, 1, &r->o->rows[i], &val, &len, e, sizeof e)) {
      fail(r, SR_EIO, e);
      continue;
    }
    if (!val) continue; /* on another shard, or never written */
    fprintf(r->out, "  row %llu (table_id %u, %s):", (unsigned long long)r->o->rows[i], id, name);
    print_row(r->out, val, len);
  }
  kv_reader_destroy(rd);
}

/* One database: per table rows, bytes, layout; then the asked rows. */
static void inspect_db(report *r, const char *path, const char *name) {
  char e[1024];
  uint32_t *ids;
  int n;
  if (kv_list_tables(path, &ids, &n, e, sizeof e)) {
    fail(r, SR_EIO, e);
    return;
  }
  kv_opts so = {.read_only = 1};
  kv_db *db;
  if (kv_open(path, n, ids, &so, &db, e, sizeof e)) {
    fail(r, SR_EIO, e);
    free(ids);
    return;
  }
  uint64_t est = 0;
  for (int k = 0; k < n; k++)
    if (r->o->table < 0 || ids[k] == (uint32_t)r->o->table) est += kv_estimate_rows(db, k);
  snprintf(r->what, sizeof r->what, "inspect %s", name);
  sr_progress_begin(&r->pg, r->o->progress, r->what, "rows", est);
  r->pg_base = 0;
  int held = 0;
  for (int k = 0; k < n; k++)
    if (r->o->table < 0 || ids[k] == (uint32_t)r->o->table) {
      held = 1;
      inspect_table(r, db, k, ids[k], name);
    }
  r->dbs++;
  r->table_dbs += held;
  sr_progress_clear(&r->pg);
  kv_close(db);
  free(ids);
}

static int print_manifest(FILE *out, const char *dir) {
  char p[SR_PATH_MAX];
  if (sr_path(p, sizeof p, "%s/manifest.json", dir)) return -1;
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *t = n >= 0 ? malloc((size_t)n + 1) : NULL;
  size_t got = t ? fread(t, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!t) return -1;
  t[got] = 0;
  cJSON *m = cJSON_Parse(t);
  free(t);
  if (!m) {
    fprintf(out, "checkpoint %s: manifest.json is not JSON\n", dir);
    return -1;
  }
#define NUM(k) (cJSON_IsNumber(cJSON_GetObjectItem(m, k)) ? cJSON_GetObjectItem(m, k)->valuedouble : -1)
#define STR(k) (cJSON_IsString(cJSON_GetObjectItem(m, k)) ? cJSON_GetObjectItem(m, k)->valuestring : "?")
  const cJSON *files = cJSON_GetObjectItem(m, "files"), *e;
  double bytes = 0;
  int nf = 0;
  cJSON_ArrayForEach(e, files) {
    nf++;
    const cJSON *sz = cJSON_GetObjectItem(e, "size");
    if (cJSON_IsNumber(sz)) bytes += sz->valuedouble;
  }
  sr_path(p, sizeof p, "%s/DONE", dir); /* shorter than manifest.json's: fits */
  fprintf(out, "checkpoint %s (%s)\n", dir, sr_is_file(p) ? "complete" : "INCOMPLETE: no DONE marker");
  fprintf(out, "  step %.0f, epoch %.0f, next sample %.0f; %s store\n", NUM("step"), NUM("epoch"),
          NUM("sample_index"), STR("store"));
  fprintf(out, "  model %.12s plan %.12s; %d files, %.0f bytes\n", STR("model_fingerprint"),
          STR("plan_fingerprint"), nf, bytes);
  long long parent = ckpt_dir_parent_step(m);
  if (parent >= 0)
    fprintf(out, "  kind incremental: the rows changed since its parent step-%lld; a chain of %d "
            "links back to its full checkpoint (shardrec fold writes it whole)\n", parent,
            ckpt_dir_chain_links(dir));
  else
    fprintf(out, "  kind %s\n", parent == -1 ? "full" : "unknown (a malformed kind or parent)");
#undef NUM
#undef STR
  cJSON_Delete(m);
  return 0;
}

/* The table files directly in folder. */
static int count_tables(const char *folder) {
  char **names;
  int nn, n = 0;
  if (sr_list_dir(folder, &names, &nn)) return 0;
  for (int i = 0; i < nn; i++) n += ckpt_dir_table_of(names[i]) >= 0;
  sr_paths_free(names, nn);
  return n;
}

/* A --table no database read holds: refused, naming it (1). */
static int table_missing(report *r) {
  if (r->o->table < 0 || !r->dbs || r->table_dbs) return 0;
  char e[128];
  sr_fmt(e, sizeof e, "no shard database holds table_id %lld", r->o->table);
  fail(r, SR_ENOTFOUND, e);
  return 1;
}

/* The asked rows of the table files in folder (named name), through the
 * caller's table_rows. */
static void table_file_rows(report *r, const char *folder, const char *name) {
  if (!r->o->n_rows || !r->o->table_rows) return;
  char e[4600];
  int rc = r->o->table_rows(r->o->table_rows_ctx, folder, name, r->out, e, sizeof e);
  if (rc) fail(r, rc, e);
}

/* The rows of a shards/ folder or a shard store's data folder, in the
 * layout it has (storage/ckpt_dir.h): each shard-K database, or a count of
 * the table files and the rows asked for. */
static void inspect_folder(report *r, const char *folder) {
  ckpt_shards_layout layout;
  char e[4600], p[4400], **names;
  int rc = ckpt_dir_shards_layout(folder, &layout, e, sizeof e), nn = 0, ks[1], shown = 0;
  if (rc) {
    fail(r, rc, e);
    return;
  }
  if (layout == CKPT_SHARDS_TABLES) {
    fprintf(r->out, "in-memory store checkpoint: %d table files (table-<id>.bin) in %s\n",
            count_tables(folder), folder);
    table_file_rows(r, folder, "local");
    return;
  }
  if ((rc = sr_list_dir(folder, &names, &nn))) { /* sorted by name */
    sr_fmt(e, sizeof e, "%s: cannot list: %s", folder, sr_strerror(rc));
    fail(r, rc, e);
    return;
  }
  for (int i = 0; i < nn; i++) {
    if (!ckpt_dir_server_shards(names[i], ks, layout == CKPT_SHARDS_DBS ? 1 : 0x7fffffff))
      continue;
    if (sr_path(p, sizeof p, "%s/%s", folder, names[i])) {
      sr_fmt(e, sizeof e, "%s/%s: path too long", folder, names[i]);
      fail(r, SR_ERANGE, e);
      break;
    }
    shown++;
    if (layout == CKPT_SHARDS_DBS) {
      inspect_db(r, p, names[i]);
    } else {
      fprintf(r->out, "%-8s in-memory server: %d table files (table-<id>.bin)\n", names[i],
              count_tables(p));
      table_file_rows(r, p, names[i]);
    }
  }
  sr_paths_free(names, nn);
  if (layout == CKPT_SHARDS_DBS && !table_missing(r))
    fprintf(r->out, "total    %llu rows, %llu bytes in %d shard(s)\n", (unsigned long long)r->rows,
            (unsigned long long)r->bytes, shown);
}

int kv_inspect(const char *path, const kv_inspect_opts *o, FILE *out, char *err,
                  size_t errlen) {
  report r = {.out = out, .o = o, .err = err, .errlen = errlen};
  char target[SR_PATH_MAX], p[SR_PATH_MAX];
  if (!sr_is_dir(path)) {
    sr_fmt(err, errlen, "%s: no such folder", path);
    return SR_ENOTFOUND;
  }
  if (sr_path_err(p, sizeof p, err, errlen, "%s/CURRENT", path)) return SR_ERANGE;
  if (sr_is_file(p)) { /* one database */
    inspect_db(&r, path, "db");
    if (!table_missing(&r) && !r.rc)
      fprintf(out, "total    %llu rows, %llu bytes\n", (unsigned long long)r.rows,
              (unsigned long long)r.bytes);
    return r.rc;
  }
  if (sr_path_err(target, sizeof target, err, errlen, "%s", path)) return SR_ERANGE;
  ckpt_dir_shard_path(path, 0, p, sizeof p);
  if (!sr_is_dir(p)) { /* a checkpoint or a folder of them */
    char e[1024];
    if (ckpt_dir_resolve(path, target, sizeof target, e, sizeof e)) {
      sr_fmt(err, errlen, "%s: neither a shard data folder nor a checkpoint (%s)", path, e);
      return SR_EFORMAT;
    }
    if (print_manifest(out, target)) {
      sr_fmt(err, errlen, "%s: no readable manifest.json", target);
      return SR_EFORMAT;
    }
    char shards[sizeof target];
    if (ckpt_dir_shards_path(target, shards, sizeof shards)) {
      sr_fmt(err, errlen, "%s: path too long", target);
      return SR_ERANGE;
    }
    memcpy(target, shards, sizeof target);
  }
  inspect_folder(&r, target);
  return r.rc;
}
