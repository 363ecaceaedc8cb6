/* shardrec inspect: what a shard data folder or a checkpoint holds.
 *
 *   shardrec inspect PATH [--table TABLE_ID] [--rows ID,ID,...]
 *
 * PATH is a shard data folder (shard-K/ RocksDB databases, as --data-dir
 * writes), a checkpoint step folder (step-N/ with manifest.json), a folder of
 * checkpoints (the newest complete one is taken), or one shard database.
 * Prints, per shard and table: distinct rows stored, bytes (keys + values),
 * the row layout; for a checkpoint also the manifest's step, data position
 * and fingerprints. --rows prints those rows (value and optimizer state) of
 * --table (default: every table), or says they are not stored (a row never
 * written has its deterministic initial value). Databases are opened
 * read-only. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/status.h"
#include "storage/kv.h"
#include "tools/train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "inspect"

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}
static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static void print_row(const char *v, size_t len) {
  const unsigned char *p = (const unsigned char *)v;
  if (len < STORE_ROW_HEADER || p[0] != 'S' || p[1] != 'R') {
    printf(" (not a shardrec row: %zu bytes)\n", len);
    return;
  }
  int dim = p[4] | (p[5] << 8), sl = p[6] | (p[7] << 8);
  if (p[2] != STORE_ROW_VERSION || len != store_row_size(dim, sl)) {
    printf(" (row layout version %u, %zu bytes: not readable by this build)\n", p[2], len);
    return;
  }
  float f[2048];
  memcpy(f, v + STORE_ROW_HEADER, 4 * (size_t)(dim + sl));
  printf(" value [");
  for (int j = 0; j < dim; j++) printf("%s%.9g", j ? " " : "", f[j]);
  printf("]");
  if (sl) {
    printf(" state [");
    for (int j = 0; j < sl; j++) printf("%s%.9g", j ? " " : "", f[dim + j]);
    printf("]");
  }
  printf("\n");
}

/* One database: per table rows, bytes, layout; then the asked rows. */
static int inspect_db(const char *path, const char *name, long long table, const uint64_t *rows,
                      int n_rows, uint64_t *tot_rows, uint64_t *tot_bytes) {
  char err[1024];
  uint32_t *ids;
  int n;
  if (store_list_tables(path, &ids, &n, err, sizeof err)) {
    fprintf(stderr, "shardrec inspect: %s\n", err);
    return -1;
  }
  store_opts o = {.read_only = 1, .block_cache_bytes = 8 << 20};
  store_db *db;
  if (store_open(path, n, ids, &o, &db, err, sizeof err)) {
    fprintf(stderr, "shardrec inspect: %s\n", err);
    free(ids);
    return -1;
  }
  for (int k = 0; k < n; k++) {
    if (table >= 0 && ids[k] != (uint32_t)table) continue;
    uint64_t cnt = 0, bytes = 0;
    int dim = -1, sl = -1, ver = -1;
    store_iter *it = store_iter_create(db, k);
    for (; it && store_iter_valid(it); store_iter_next(it)) {
      size_t len;
      const char *v = store_iter_value(it, &len);
      if (!cnt && len >= STORE_ROW_HEADER) {
        const unsigned char *p = (const unsigned char *)v;
        ver = p[2];
        dim = p[4] | (p[5] << 8);
        sl = p[6] | (p[7] << 8);
      }
      cnt++;
      bytes += 8 + len;
    }
    store_iter_destroy(it);
    printf("%-8s table_id %-5u %10llu rows %12llu bytes", name, ids[k], (unsigned long long)cnt,
           (unsigned long long)bytes);
    if (cnt) printf("  (row layout v%d: dim %d, optimizer state %d)", ver, dim, sl);
    printf("\n");
    *tot_rows += cnt;
    *tot_bytes += bytes;
    if (n_rows) {
      int cf[1] = {k};
      for (int r = 0; r < n_rows; r++) {
        char *val = NULL;
        size_t len = 0;
        if (store_multi_get(db, 1, cf, &rows[r], &val, &len, err, sizeof err)) {
          fprintf(stderr, "shardrec inspect: %s\n", err);
          continue;
        }
        if (!val) continue; /* on another shard, or never written */
        printf("  row %llu (table_id %u, %s):", (unsigned long long)rows[r], ids[k], name);
        print_row(val, len);
        store_value_free(val);
      }
    }
  }
  store_close(db);
  free(ids);
  return 0;
}

static int print_manifest(const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/manifest.json", dir);
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *t = malloc((size_t)n + 1);
  size_t got = t ? fread(t, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!t) return -1;
  t[got] = 0;
  cJSON *m = cJSON_Parse(t);
  free(t);
  if (!m) {
    printf("checkpoint %s: manifest.json is not JSON\n", dir);
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
  snprintf(p, sizeof p, "%s/DONE", dir);
  printf("checkpoint %s (%s)\n", dir, is_file(p) ? "complete" : "INCOMPLETE: no DONE marker");
  printf("  step %.0f, epoch %.0f, next sample %.0f; %s store\n", NUM("step"), NUM("epoch"),
         NUM("sample_index"), STR("store"));
  printf("  model %.12s plan %.12s; %d files, %.0f bytes\n", STR("model_fingerprint"),
         STR("plan_fingerprint"), nf, bytes);
  cJSON_Delete(m);
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
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
               "rows asked for (value and optimizer state).\n");
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
  if (rows_s) {
    const char *p = rows_s;
    while (*p && n_rows < 256) {
      char *end;
      unsigned long long v = strtoull(p, &end, 10);
      if (end == p || (*end && *end != ',')) {
        fprintf(stderr, "shardrec inspect: --rows: '%s' is not a list of row ids\n", rows_s);
        return 2;
      }
      rows[n_rows++] = v;
      p = *end ? end + 1 : end;
    }
  }
  const char *path = argv[optind];
  if (!is_dir(path)) {
    fprintf(stderr, "shardrec inspect: %s: no such folder\n", path);
    return 1;
  }
  char target[4096], p[4200];
  snprintf(target, sizeof target, "%s", path);
  snprintf(p, sizeof p, "%s/CURRENT", path);
  uint64_t tr = 0, tb = 0;
  if (is_file(p)) { /* one database */
    if (inspect_db(path, "db", table, rows, n_rows, &tr, &tb)) return 1;
    printf("total    %llu rows, %llu bytes\n", (unsigned long long)tr, (unsigned long long)tb);
    return 0;
  }
  snprintf(p, sizeof p, "%s/shard-0", path);
  if (!is_dir(p)) { /* a checkpoint or a folder of them */
    char err[1024];
    if (ckpt_resolve(path, target, sizeof target, err, sizeof err)) {
      fprintf(stderr, "shardrec inspect: %s: neither a shard data folder nor a checkpoint (%s)\n", path, err);
      return 1;
    }
    if (print_manifest(target)) {
      fprintf(stderr, "shardrec inspect: %s: no readable manifest.json\n", target);
      return 1;
    }
    size_t tl = strlen(target);
    snprintf(target + tl, sizeof target - tl, "/shards");
  }
  DIR *d = opendir(target);
  if (!d) {
    fprintf(stderr, "shardrec inspect: %s: cannot open\n", target);
    return 1;
  }
  char *names[4096];
  int nn = 0, n_local = 0;
  struct dirent *de;
  while ((de = readdir(d)) && nn < 4096) {
    if (!strncmp(de->d_name, "shard-", 6)) names[nn++] = strdup(de->d_name);
    else if (!strncmp(de->d_name, "table-", 6)) n_local++;
  }
  closedir(d);
  qsort(names, (size_t)nn, sizeof *names, cmp_name);
  int status = 0;
  for (int i = 0; i < nn; i++) {
    snprintf(p, sizeof p, "%s/%s", target, names[i]);
    if (inspect_db(p, names[i], table, rows, n_rows, &tr, &tb)) status = 1;
    free(names[i]);
  }
  if (!nn && n_local)
    printf("in-memory store checkpoint: %d table files (table-<id>.bin) in %s\n", n_local, target);
  else
    printf("total    %llu rows, %llu bytes in %d shard(s)\n", (unsigned long long)tr,
           (unsigned long long)tb, nn);
  return status;
}
