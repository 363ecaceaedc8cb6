/* shardrec bench reshard: rows/s and MB/s of `shardrec reshard` on a
 * multi-million-row RocksDB checkpoint, beside a baseline measured in the
 * same run on the same databases.
 *
 * The checkpoint: a plan of 4 tables (--rows rows in all, --dim D, adagrad:
 * D state floats per row, so a row is 8 + 8 D bytes plus its 8-byte key),
 * row-wise over 2 shards; every row present with random contents. Its
 * shard databases are written directly (one SST file per shard and table,
 * ingested), and the manifest by train_ckpt_write_as, so `reshard` reads a real
 * checkpoint (manifest checksums, plan, fingerprints).
 *
 *   ours      the real command, `shardrec reshard --from CKPT --to OUT
 *             --plan P3` (cmd_reshard, in this process: the executable's
 *             start-up is not counted; 3 shards row-wise): checking every
 *             source file's SHA-256 (train_ckpt_open), scanning (RocksDB's block
 *             checksums off: the files were just checked whole), routing,
 *             hashing, SST files, ingestion, re-reading to verify, the new
 *             manifest's SHA-256 of every file; tables on up to 8 workers;
 *   baseline  a raw RocksDB full scan of the same source databases (RocksDB's
 *             default: block checksums verified) plus an SST write of the
 *             same rows (one file per source shard and table), one thread:
 *             no routing, no ingestion, no verification, no file checksums.
 * Runs alternate (baseline, ours) --runs times; medians are printed, and
 * ours / baseline. Nothing is cached across runs but the OS page cache,
 * which both see warm. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "embedding/plan.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"
#include "storage/sst.h"
#include "train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "bench reshard"
#define N_TABLES 4

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec bench reshard [--rows N] [--dim D] [--runs R] [--dir DIR]\n"
"\n"
"  --rows N   rows of the checkpoint, over 4 tables (default 4000000)\n"
"  --dim D    embedding dim; adagrad state doubles a row (default 16)\n"
"  --runs R   timed runs of each (default 3; medians)\n"
"  --dir DIR  work folder (default $TMPDIR or /tmp; a fresh folder under it, removed)\n"
"  --keep     keep that folder (the checkpoint, the plan, the last output)\n"
"  --threads N   reshard's --threads (default: its own, the cores up to 8)\n"
"\n"
"Times 'shardrec reshard' from 2 shards to 3 (row-wise) against a raw RocksDB\n"
"full scan plus SST write of the same rows, in the same run.\n");
}

enum { O_ROWS = 1000, O_DIM, O_RUNS, O_DIR, O_KEEP, O_THREADS, O_HELP };
static const struct option long_opts[] = {
    {"rows", required_argument, 0, O_ROWS}, {"dim", required_argument, 0, O_DIM},
    {"runs", required_argument, 0, O_RUNS}, {"dir", required_argument, 0, O_DIR},
    {"keep", no_argument, 0, O_KEEP},      {"threads", required_argument, 0, O_THREADS},
    {"help", no_argument, 0, O_HELP},       {0, 0, 0, 0}};

static emb_plan *make_plan(uint64_t rows, int dim, int n_shards, char *err, size_t errlen) {
  uint64_t r[N_TABLES];
  for (int t = 0; t < N_TABLES; t++) r[t] = rows / N_TABLES + ((uint64_t)t < rows % N_TABLES);
  emb_plan_params p = {.n_tables = N_TABLES, .rows = r, .dim = dim, .pooling = EMB_POOL_SUM,
                       .optim = {.kind = EMB_OPT_ADAGRAD, .eps = -1}, .seed = 7,
                       .n_shards = n_shards, .row_wise = 1};
  emb_plan *plan = NULL;
  if (emb_plan_create(&p, &plan, err, errlen)) return NULL;
  return plan;
}

/* Source shard databases: DIR/shard-K, every row of every table. */
static int write_sources(const emb_plan *plan, const char *shards, const char *work, char *err,
                         size_t errlen) {
  int rc = 0;
  uint32_t ids[N_TABLES];
  for (int t = 0; t < N_TABLES; t++) ids[t] = plan->tables[t].table_id;
  for (int k = 0; k < plan->n_shards && !rc; k++) {
    char path[SR_PATH_MAX], lock[SR_PATH_MAX];
    if ((rc = ckpt_dir_shard_path(shards, k, path, sizeof path))) {
      sr_path_too_long(err, errlen, shards, sizeof path);
      break;
    }
    sst_db *db = NULL;
    if ((rc = sst_db_create(path, N_TABLES, ids, work, &db, err, errlen))) break;
    for (int t = 0; t < N_TABLES && !rc; t++) {
      const emb_table *tb = &plan->tables[t];
      int slen = emb_optim_state_len(&tb->optim, tb->dim), n = tb->dim + slen;
      float *row = malloc(4 * (size_t)n);
      unsigned char *enc = malloc(kv_row_size(tb->dim, slen));
      char f[SR_PATH_MAX];
      sst_writer *w = NULL;
      rc = sr_path_err(f, sizeof f, err, errlen, "%s/src-%d-%d.sst", work, k, t);
      if (!rc && (!row || !enc)) rc = SR_ENOMEM;
      if (!rc) rc = sst_writer_open(f, &w, err, errlen);
      for (uint64_t id = 0; !rc && id < tb->rows; id++) {
        if (emb_plan_shard_of(plan, t, id) != k) continue;
        uint64_t x = sr_mix64(((uint64_t)t << 40) ^ id);
        for (int j = 0; j < n; j++) {
          x = sr_mix64(x);
          row[j] = (float)((double)(x >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
        }
        if (slen) for (int j = tb->dim; j < n; j++) row[j] = row[j] * row[j]; /* accumulators >= 0 */
        kv_row_encode(tb->dim, slen, row, enc);
        rc = sst_writer_put(w, id, enc, kv_row_size(tb->dim, slen), err, errlen);
      }
      if (!rc) rc = sst_writer_finish(w, NULL, err, errlen);
      sst_writer_destroy(w);
      const char *fl[1] = {f};
      if (!rc) rc = sst_db_ingest(db, t, fl, 1, err, errlen);
      unlink(f);
      free(row);
      free(enc);
    }
    sst_db_close(db);
    if (!sr_path(lock, sizeof lock, "%s/LOCK", path)) unlink(lock);
  }
  return rc;
}

/* A checkpoint manifest around the shards (no dense part). */
static int write_ckpt(const emb_plan *plan, const char *root, const char *stage, char *err,
                      size_t errlen) {
  train_ckpt_info ci;
  memset(&ci, 0, sizeof ci);
  cJSON *man = cJSON_CreateObject(), *set = cJSON_CreateObject();
  cJSON_AddNumberToObject(man, "format", 1);
  cJSON_AddNumberToObject(man, "step", 0);
  cJSON_AddNumberToObject(man, "epoch", 0);
  cJSON_AddNumberToObject(man, "sample_index", 0);
  cJSON_AddNumberToObject(man, "lr_schedule_step", 0);
  cJSON_AddNullToObject(man, "rng");
  cJSON_AddStringToObject(man, "store", "shard");
  cJSON_AddStringToObject(set, "dense_optimizer", "sgd");
  cJSON_AddStringToObject(set, "sparse_optimizer", "adagrad");
  cJSON_AddNumberToObject(set, "mini_batch_size", 128);
  cJSON_AddItemToObject(man, "settings", set);
  ci.manifest = man;
  ci.plan = (emb_plan *)plan;
  snprintf(ci.store_kind, sizeof ci.store_kind, "shard");
  char final[SR_PATH_MAX];
  int rc = sr_path_err(final, sizeof final, err, errlen, "%s/step-0", root);
  if (!rc) rc = train_ckpt_write_as(&ci, plan, stage, final, err, errlen);
  cJSON_Delete(man);
  return rc;
}

/* The baseline: scan every source database, write the rows to SST files. */
static int baseline(const char *shards, int n_src, const char *work, uint64_t *rows,
                    uint64_t *bytes, char *err, size_t errlen) {
  int rc = 0;
  *rows = *bytes = 0;
  for (int k = 0; k < n_src && !rc; k++) {
    char path[SR_PATH_MAX];
    if ((rc = ckpt_dir_shard_path(shards, k, path, sizeof path))) {
      sr_path_too_long(err, errlen, shards, sizeof path);
      break;
    }
    sst_db *db = NULL;
    if ((rc = sst_db_open_read(path, work, &db, err, errlen))) break;
    for (int i = 0; i < sst_db_n_tables(db) && !rc; i++) {
      char f[SR_PATH_MAX];
      if ((rc = sr_path_err(f, sizeof f, err, errlen, "%s/base-%d-%d.sst", work, k, i))) break;
      sst_writer *w = NULL;
      sst_iter *it = sst_iter_create(db, i, 1);
      rc = sst_writer_open(f, &w, err, errlen);
      for (; !rc && sst_iter_valid(it); sst_iter_next(it)) {
        size_t len;
        const char *v = sst_iter_value(it, &len);
        rc = sst_writer_put(w, sst_iter_key(it), v, len, err, errlen);
        (*rows)++;
        *bytes += 8 + len;
      }
      if (!rc) rc = sst_iter_status(it, err, errlen);
      if (!rc && sst_writer_rows(w)) rc = sst_writer_finish(w, NULL, err, errlen);
      sst_writer_destroy(w);
      sst_iter_destroy(it);
      unlink(f);
    }
    sst_db_close(db);
  }
  return rc;
}

/* Run `shardrec reshard` in this process (its start-up, the same for every
 * size, is not what is measured) with its stdout into the file log; its
 * status. */
static int run_ours(const char *ckpt, const char *out, const char *plan, const char *log,
                    const char *threads) {
  char *argv[] = {"reshard", "--from", (char *)ckpt, "--to", (char *)out, "--plan", (char *)plan,
                  threads ? "--threads" : NULL, (char *)threads, NULL};
  fflush(stdout);
  int saved = dup(1), devnull = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (saved >= 0 && devnull >= 0) dup2(devnull, 1);
  int rc = cmd_reshard(threads ? 9 : 7, argv);
  fflush(stdout);
  if (saved >= 0) {
    dup2(saved, 1);
    close(saved);
  }
  if (devnull >= 0) close(devnull);
  return rc;
}

/* The folders and files of one bench reshard run under dir. */
typedef struct rs_paths {
  char ck[SR_PATH_MAX], stage[SR_PATH_MAX], shards[SR_PATH_MAX], work[SR_PATH_MAX],
      p3path[SR_PATH_MAX], out[SR_PATH_MAX], src_shards[SR_PATH_MAX], log[SR_PATH_MAX];
} rs_paths;

static int rs_paths_make(rs_paths *p, const char *dir, char *perr, size_t n) {
  if (sr_path_err(p->ck, sizeof p->ck, perr, n, "%s/ckpt", dir) ||
      sr_path_err(p->stage, sizeof p->stage, perr, n, "%s/.step-0.tmp", p->ck) ||
      (ckpt_dir_shards_path(p->stage, p->shards, sizeof p->shards) &&
       sr_path_too_long(perr, n, p->stage, sizeof p->shards)) ||
      sr_path_err(p->work, sizeof p->work, perr, n, "%s/work", dir) ||
      sr_path_err(p->p3path, sizeof p->p3path, perr, n, "%s/p3.json", dir) ||
      sr_path_err(p->out, sizeof p->out, perr, n, "%s/out", dir) ||
      sr_path_err(p->src_shards, sizeof p->src_shards, perr, n, "%s/step-0/shards", p->ck) ||
      sr_path_err(p->log, sizeof p->log, perr, n, "%s/reshard.out", p->work))
    return -1;
  return 0;
}

/* runs rounds of the baseline then our reshard (2 -> 3 shards) of the
 * checkpoint at p->ck, their times into t_base/t_ours, and the medians
 * printed. 0 or -1 (said). */
static int timed_runs(const rs_paths *p, const char *threads, long long rows, int runs,
                      double *t_base, double *t_ours) {
  char err[1024];
  uint64_t n_rows = 0, n_bytes = 0;
  for (int r = 0; r < runs; r++) {
    double a = sr_now();
    if (baseline(p->src_shards, 2, p->work, &n_rows, &n_bytes, err, sizeof err)) {
      fprintf(stderr, "shardrec bench reshard: baseline: %s\n", err);
      return -1;
    }
    t_base[r] = sr_now() - a;
    sr_rmtree(p->out);
    a = sr_now();
    char line[1024];
    int rc = run_ours(p->ck, p->out, p->p3path, p->log, threads);
    t_ours[r] = sr_now() - a;
    FILE *lf = fopen(p->log, "r");
    while (lf && fgets(line, sizeof line, lf))
      if (!strncmp(line, "resharded ", 10)) printf("  %s", line); /* its own breakdown */
    if (lf) fclose(lf);
    if (rc) {
      fprintf(stderr, "shardrec bench reshard: 'shardrec reshard' exited %d\n", rc);
      return -1;
    }
    printf("run %d: baseline %.2f s, reshard %.2f s\n", r + 1, t_base[r], t_ours[r]);
    fflush(stdout);
  }
  if (n_rows != (uint64_t)rows) {
    fprintf(stderr, "shardrec bench reshard: the baseline read %llu rows, expected %lld\n",
            (unsigned long long)n_rows, rows);
    return -1;
  }
  double mb = (double)n_bytes / 1e6, tb = sr_median(t_base, runs), to = sr_median(t_ours, runs);
  printf("baseline (raw RocksDB scan + SST write): %.0f rows/s, %.1f MB/s (median of %d: %.2f s "
         "for %llu rows, %.1f MB)\n", (double)n_rows / tb, mb / tb, runs, tb,
         (unsigned long long)n_rows, mb);
  printf("reshard 2 -> 3 row-wise (verified):      %.0f rows/s, %.1f MB/s (median of %d: %.2f s; "
         "--threads %s)\n", (double)n_rows / to, mb / to, runs, to, threads ? threads : "default");
  printf("reshard / baseline: %.0f%% (target >= 60%%)\n", 100.0 * tb / to);
  return 0;
}

int bench_reshard(int argc, char **argv) {
  long long rows = 4000000, dim = 16, runs = 3;
  const char *base = NULL;
  int keep = 0;
  const char *threads = NULL;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_ROWS: if (cli_int(CMD, "--rows", optarg, N_TABLES, 1LL << 40, &rows)) return 2; break;
      case O_DIM: if (cli_int(CMD, "--dim", optarg, 1, EMB_MAX_DIM / 2, &dim)) return 2; break;
      case O_RUNS: if (cli_int(CMD, "--runs", optarg, 1, 100, &runs)) return 2; break;
      case O_DIR: base = optarg; break;
      case O_KEEP: keep = 1; break;
      case O_THREADS: {
        long long t;
        if (cli_flag(CMD, "--threads", optarg, &t)) return 2;
        threads = optarg;
        break;
      }
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option("bench reshard", ':', argv[optind - 1]); return 2;
      default: cli_bad_option("bench reshard", '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec bench reshard: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!base) base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char dir[SR_PATH_MAX], err[1024];
  if (sr_path_err(dir, sizeof dir, err, sizeof err, "%s/shardrec-bench-reshard-XXXXXX", base)) {
    fprintf(stderr, "shardrec bench reshard: --dir %s\n", err);
    return 1;
  }
  if (!mkdtemp(dir)) {
    fprintf(stderr, "shardrec bench reshard: %s: cannot create: %s\n", dir, strerror(errno));
    return 1;
  }
  int status = 1;
  emb_plan *p2 = make_plan((uint64_t)rows, (int)dim, 2, err, sizeof err);
  emb_plan *p3 = make_plan((uint64_t)rows, (int)dim, 3, err, sizeof err);
  double *t_ours = calloc((size_t)runs, sizeof(double)), *t_base = calloc((size_t)runs, sizeof(double));
  rs_paths P;
  char perr[512];
  if (rs_paths_make(&P, dir, perr, sizeof perr)) {
    fprintf(stderr, "shardrec bench reshard: --dir %s: %s\n", base, perr);
    goto done;
  }
  if (!p2 || !p3 || !t_ours || !t_base) {
    fprintf(stderr, "shardrec bench reshard: %s\n", p2 && p3 ? "out of memory" : err);
    goto done;
  }
  if (mkdir(P.ck, 0777) || mkdir(P.stage, 0777) || mkdir(P.shards, 0777) || mkdir(P.work, 0777)) {
    fprintf(stderr, "shardrec bench reshard: %s: cannot create folders: %s\n", dir, strerror(errno));
    goto done;
  }
  double t0 = sr_now();
  if (write_sources(p2, P.shards, P.work, err, sizeof err) ||
      write_ckpt(p2, P.ck, P.stage, err, sizeof err) || emb_plan_save(p3, P.p3path, err, sizeof err)) {
    fprintf(stderr, "shardrec bench reshard: building the checkpoint: %s\n", err);
    goto done;
  }
  printf("checkpoint: %llu rows in %d tables, dim %lld + adagrad state, 2 shards row-wise; built in "
         "%.1f s\n", (unsigned long long)rows, N_TABLES, dim, sr_now() - t0);
  fflush(stdout);
  if (timed_runs(&P, threads, rows, (int)runs, t_base, t_ours)) goto done;
  status = 0;
done:
  if (keep) printf("kept %s\n", dir);
  else sr_rmtree(dir);
  free(t_ours);
  free(t_base);
  emb_plan_free(p2);
  emb_plan_free(p3);
  return status;
}
