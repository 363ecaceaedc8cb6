/* shardrec inspect: what a shard data folder or a checkpoint holds.
 *
 *   shardrec inspect PATH [--table TABLE_ID] [--rows ID,ID,...]
 *
 * PATH is a shard data folder (shard-K/ RocksDB databases, as --data-dir
 * writes), a checkpoint step folder (step-N/ with manifest.json), a folder of
 * checkpoints (the newest complete one is taken), or one shard database.
 * Prints, per shard and table: distinct rows stored, bytes (keys + values),
 * the row layout; for a checkpoint also the manifest's step, data position
 * and fingerprints, an increment's removed rows (ids and tables), and its
 * data transform in short (fingerprint and mode, or none recorded). --rows prints those rows (value and optimizer state) of
 * --table (default: every table) that are stored (a row never written has
 * its deterministic initial value), from databases or table files alike;
 * a --table the checkpoint's plan does not have is refused. Databases are
 * opened read-only. The report is storage/kv_inspect.h's (kv_inspect):
 * this file parses the flags, reads the checkpoint's plan, and reads the
 * asked rows of table files for it (kv_inspect_opts.table_rows). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "datasets/transform.h"
#include "embedding/ckpt_plan.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "embedding/removed_file.h"
#include "embedding/table_file.h"
#include "storage/ckpt_dir.h"
#include "storage/kv_inspect.h"
#include "train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "inspect"

/* The manifest of the checkpoint path names, parsed (read, not verified,
 * as the rest of the report: a torn checkpoint's still reads), its folder
 * in dir and its path in file. NULL when path is no checkpoint or its
 * manifest is no JSON (kv_inspect says so). */
static cJSON *ckpt_manifest(const char *path, char dir[SR_PATH_MAX], char file[SR_PATH_MAX]) {
  char why[1024];
  if (train_ckpt_resolve(path, dir, SR_PATH_MAX, why, sizeof why) ||
      sr_path(file, SR_PATH_MAX, "%s/manifest.json", dir))
    return NULL;
  char *text = sr_read_file(file, NULL);
  cJSON *m = text ? cJSON_Parse(text) : NULL;
  free(text);
  return m;
}

/* A checkpoint's data transform in one line, read as predict reads it
 * (train_ckpt_transform: transform.bin against the fingerprint the
 * manifest records), or "none recorded" when the manifest records none.
 * path that is no checkpoint prints nothing. 0, or 1 with the reason
 * printed (a transform.bin missing, unreadable or not the one recorded). */
static int print_transform(const char *path) {
  char dir[SR_PATH_MAX], file[SR_PATH_MAX], why[1024], what[512];
  cJSON *m = ckpt_manifest(path, dir, file);
  if (!m) return 0;
  const char *fp = NULL;
  int rc = ckpt_dir_fingerprint(m, "transform", file, &fp, why, sizeof why);
  train_ckpt_info ci;
  memset(&ci, 0, sizeof ci);
  if (!rc && fp) {
    snprintf(ci.dir, sizeof ci.dir, "%s", dir);
    memcpy(ci.transform_fp, fp, SR_SHA256_HEX);
  }
  cJSON_Delete(m);
  if (rc) {
    fprintf(stderr, "shardrec inspect: data transform: %s\n", why);
    return 1;
  }
  if (!ci.transform_fp[0]) {
    printf("data transform: none recorded (raw rows are not scored with this model)\n");
    return 0;
  }
  ds_transform *xf;
  if (train_ckpt_transform(&ci, &xf, why, sizeof why)) {
    fprintf(stderr, "shardrec inspect: data transform: %s\n", why);
    return 1;
  }
  ds_transform_describe(xf, what, sizeof what);
  printf("data transform: %s: %s (%s/" DS_XFORM_FILE ")\n", ci.transform_fp, what, dir);
  ds_transform_free(xf);
  return 0;
}

/* The plan of the checkpoint path names, from its manifest (read, not
 * verified, as the rest of the report: a torn checkpoint's plan still
 * reads). NULL when path is no checkpoint or its manifest gives no plan. */
static emb_plan *ckpt_plan(const char *path) {
  char dir[SR_PATH_MAX], file[SR_PATH_MAX], why[1024];
  cJSON *m = ckpt_manifest(path, dir, file);
  emb_plan *plan = NULL;
  if (m && emb_ckpt_get_plan(m, file, &plan, why, sizeof why)) plan = NULL;
  cJSON_Delete(m);
  return plan;
}

/* What print_table_rows needs: the checkpoint's plan and the rows asked. */
typedef struct {
  const emb_plan *plan; /* NULL: no checkpoint's plan to read table files with */
  char mfp[EMB_FP_HEX]; /* its model fingerprint, the files' */
  long long table;
  const uint64_t *rows;
  int n_rows;
} tf_rows;

/* One row as kv_inspect prints a database's: value, then state if any. */
static void print_vals(FILE *out, const float *v, int dim, int slen) {
  fprintf(out, " value [");
  for (int j = 0; j < dim + slen; j++) {
    if (j == dim) fprintf(out, "] state [");
    fprintf(out, "%s%.9g", j && j != dim ? " " : "", (double)v[j]);
  }
  fprintf(out, "]\n");
}

/* The asked rows of table tb's file at path, in the order asked (a row the
 * file does not hold is not printed, as a database's). */
static int file_rows(const tf_rows *c, const emb_table *tb, const char *path, const char *name,
                     FILE *out, char *err, size_t errlen) {
  int slen = emb_optim_state_len(&tb->optim, tb->dim), n = tb->dim + slen;
  float *got = malloc((size_t)c->n_rows * (size_t)n * sizeof *got);
  char *have = calloc((size_t)c->n_rows, 1);
  emb_tabfile_reader *rd = NULL;
  int rc = got && have ? emb_tabfile_open(path, tb, c->mfp, &rd, err, errlen) : SR_ENOMEM;
  if (rc == SR_ENOMEM && !rd) sr_fmt(err, errlen, "out of memory");
  uint64_t id;
  const float *vals;
  while (!rc && (rc = emb_tabfile_next(rd, &id, &vals, err, errlen)) == 1) {
    rc = 0;
    for (int i = 0; i < c->n_rows; i++)
      if (c->rows[i] == id) {
        memcpy(got + (size_t)i * (size_t)n, vals, (size_t)n * sizeof *got);
        have[i] = 1;
      }
  }
  for (int i = 0; !rc && i < c->n_rows; i++)
    if (have[i]) {
      fprintf(out, "  row %llu (table_id %u, %s):", (unsigned long long)c->rows[i], tb->table_id,
              name);
      print_vals(out, got + (size_t)i * (size_t)n, tb->dim, slen);
    }
  emb_tabfile_close(rd);
  free(got);
  free(have);
  return rc;
}

/* kv_inspect's table_rows: the asked rows of every table file in folder
 * (of the asked table), read under the checkpoint's plan. */
static int print_table_rows(void *ctx, const char *folder, const char *name, FILE *out, char *err,
                            size_t errlen) {
  const tf_rows *c = ctx;
  if (!c->plan) {
    sr_fmt(err, errlen, "%s: table files are read under their checkpoint's plan: inspect the "
           "checkpoint (its step-N folder) for their rows", folder);
    return SR_EINVAL;
  }
  for (int t = 0; t < c->plan->n_tables; t++) {
    const emb_table *tb = &c->plan->tables[t];
    char path[SR_PATH_MAX];
    if (c->table >= 0 && tb->table_id != (uint32_t)c->table) continue;
    if (ckpt_dir_table_file(folder, tb->table_id, path, sizeof path)) {
      sr_fmt(err, errlen, "%s: path too long", folder);
      return SR_ERANGE;
    }
    if (!sr_is_file(path)) continue; /* an increment's: a table with no changed row */
    int rc = file_rows(c, tb, path, name, out, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* An increment's removed rows (shards/removed-<id>.bin, beside its table
 * files or in its server folders), in one line when it has any. 0, or 1
 * with the reason printed (an unreadable file). */
static int print_removed(const char *path) {
  char dir[SR_PATH_MAX], shards[SR_PATH_MAX], file[SR_PATH_MAX], why[1024];
  char **names = NULL;
  int n = 0, rc = 0;
  if (train_ckpt_resolve(path, dir, sizeof dir, why, sizeof why) ||
      sr_path(shards, sizeof shards, "%s/shards", dir) || !sr_is_dir(shards) ||
      sr_list_files(shards, &names, &n))
    return 0;
  uint64_t ids = 0;
  long long seen[EMB_MAX_TABLES];
  int tables = 0;
  for (int i = 0; i < n && !rc; i++) {
    const char *base = strrchr(names[i], '/') ? strrchr(names[i], '/') + 1 : names[i];
    long long id = ckpt_dir_removed_of(base);
    uint64_t k;
    if (id < 0) continue;
    if (sr_path_err(file, sizeof file, why, sizeof why, "%s/%s", shards, names[i]) ||
        emb_rmfile_count(file, &k, why, sizeof why)) {
      fprintf(stderr, "shardrec inspect: %s\n", why);
      rc = 1;
      break;
    }
    ids += k;
    int j = 0;
    while (j < tables && seen[j] != id) j++;
    if (j == tables && tables < EMB_MAX_TABLES) seen[tables++] = id;
  }
  sr_paths_free(names, n);
  if (!rc && tables)
    printf("removed rows since its parent: %llu in %d tables (shards/.../removed-<id>.bin)\n",
           (unsigned long long)ids, tables);
  return rc;
}

int cmd_inspect(int argc, char **argv) {
  long long table = -1;
  const char *rows_s = NULL;
  static const struct option opts[] = {{"table", required_argument, 0, 't'},
                                       {"rows", required_argument, 0, 'r'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 't': if (cli_int(CMD, "--table", optarg, 0, 0xffffffffLL, &table)) return 2; break;
      case 'r': rows_s = optarg; break;
      case 'h':
        printf("usage: shardrec inspect PATH [--table TABLE_ID] [--rows ID,ID,...]\n\n"
               "PATH: a shard data folder (--data-dir), a checkpoint (step-N) or a folder of them,\n"
               "or one shard database. Prints tables, distinct rows and bytes per shard, and the\n"
               "rows asked for (value and optimizer state); for a checkpoint also its data transform.\n");
        return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind + 1 != argc) {
    fprintf(stderr, "usage: shardrec inspect PATH [--table TABLE_ID] [--rows ID,ID,...]\n");
    return 2;
  }
  uint64_t rows[256];
  int n_rows = 0;
  if (rows_s && cli_u64_list(CMD, "--rows", rows_s, ",", 0, UINT64_MAX, NULL, rows, 256, &n_rows))
    return 2;
  emb_plan *plan = ckpt_plan(argv[optind]);
  if (plan && table >= 0 && emb_plan_table_index(plan, (uint32_t)table) < 0) {
    fprintf(stderr, "shardrec inspect: --table %lld: the checkpoint's plan has no table_id %lld "
            "(its %d tables)\n", table, table, plan->n_tables);
    emb_plan_free(plan);
    return 1;
  }
  tf_rows tr = {.plan = plan, .table = table, .rows = rows, .n_rows = n_rows};
  if (plan && emb_plan_model_fingerprint(plan, tr.mfp)) tr.plan = NULL;
  kv_inspect_opts io = {.table = table, .rows = rows, .n_rows = n_rows,
                        .progress = cli_isatty_err(), .table_rows = print_table_rows,
                        .table_rows_ctx = &tr};
  char err[4600];
  int krc = kv_inspect(argv[optind], &io, stdout, err, sizeof err);
  emb_plan_free(plan);
  if (krc) {
    fprintf(stderr, "shardrec inspect: %s\n", err);
    return 1;
  }
  int rc = print_removed(argv[optind]);
  return print_transform(argv[optind]) || rc;
}
