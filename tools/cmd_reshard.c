/* shardrec reshard: rewrite a checkpoint's embedding shards for another plan
 * of the same model (N shards to M, table-wise to row-wise and back, tables
 * moved between shards).
 *
 *   shardrec reshard --from CKPT --to OUT --plan NEW.json [--force]
 *
 * CKPT is a step-N folder or a folder of them (the newest complete one),
 * with RocksDB shards or the in-memory stores' table files (the output
 * keeps the layout: its consumers restore only that one).
 * OUT becomes a checkpoint folder holding one complete OUT/step-N (same N):
 * `train --resume OUT` and `serve --checkpoint OUT` take it directly. The
 * rows move by tools/reshard.h (RocksDB scans, SST files, ingestion,
 * verification); dense.bin is copied; the manifest is the source's (step,
 * data position, settings, dense architecture, store kind) with the new plan
 * and its fingerprints (ckpt_write_as).
 *
 * Everything is written under OUT.tmp-PID and renamed to OUT at the end, so
 * a failure (verification included) leaves nothing at OUT; with --force an
 * existing OUT is replaced only after the new one is complete.
 *
 * Test hook: SHARDREC_TEST_RESHARD_CORRUPT=1 flips a byte of the first row
 * written, =2 drops that row (verification must catch both). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"
#include "common/sys.h"
#include "storage/kv.h"
#include "tools/train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "embedding/reshard.h"

#define CMD "reshard"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec reshard --from CKPT --to OUT --plan NEW.json [--force]\n"
"\n"
"Rewrite a checkpoint's embedding shards for another plan of the same model:\n"
"N shards to M, table-wise to row-wise and back, tables moved between shards.\n"
"Dense parameters, optimizer state, step and data position carry over; the\n"
"manifest gets the new plan.\n"
"\n"
"  --from CKPT      a checkpoint step-N folder, or a folder of them (the newest\n"
"                   complete one is taken); any store: RocksDB shard databases\n"
"                   (train --data-dir/--cache-mb, servers with --data-dir) or the\n"
"                   in-memory store's table files (train without them, in-memory\n"
"                   servers); the new checkpoint keeps the source's layout\n"
"  --to OUT         the new checkpoint folder: OUT/step-N is written, so\n"
"                   'train --resume OUT' and 'serve --checkpoint OUT' take it\n"
"  --plan NEW.json  the new plan; only n_shards and placements may differ\n"
"                   (same model fingerprint: tables, rows, dim, pooling, init,\n"
"                   optimizer, seed)\n"
"  --force          replace OUT if it exists (after the new one is complete)\n"
"  --threads N      tables moved side by side (default: the cores, at most 8)\n"
"  -h, --help       this text\n"
"\n"
"Rows stream from read-only RocksDB scans of every source shard, are routed by\n"
"the new plan, written to sorted SST files and ingested into fresh shard\n"
"databases; memory stays bounded whatever the table size (table files are\n"
"merged and rewritten per shard of the new plan likewise). Each table's row\n"
"count and an order-independent checksum of (table_id, row id, value and\n"
"optimizer-state bytes) are computed while reading and again by re-reading\n"
"what was written; any difference fails the command and nothing is left at\n"
"OUT. A progress line (rows, MB, rows/s, ETA) is shown on a terminal. The\n"
"summary gives rows, MB, seconds, rows/s, MB/s and each table's check.\n"
"Exit status: 0 done, 1 refused or failed, 2 bad usage.\n");
}

enum { O_FROM = 1000, O_TO, O_PLAN, O_FORCE, O_THREADS, O_HELP };

static const struct option long_opts[] = {
    {"from", required_argument, 0, O_FROM}, {"to", required_argument, 0, O_TO},
    {"plan", required_argument, 0, O_PLAN}, {"force", no_argument, 0, O_FORCE},
    {"threads", required_argument, 0, O_THREADS},
    {"help", no_argument, 0, O_HELP},       {0, 0, 0, 0}};

static int exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int copy_file(const char *src, const char *dst, char *err, size_t errlen) {
  int in = open(src, O_RDONLY), out = -1, rc = 0;
  if (in < 0) {
    sr_fmt(err, errlen, "%s: cannot open: %s", src, strerror(errno));
    return SR_EIO;
  }
  out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (out < 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", dst, strerror(errno));
    close(in);
    return SR_EIO;
  }
  static char buf[1 << 16];
  ssize_t got;
  while ((got = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)got) != got) {
      rc = SR_EIO;
      break;
    }
  if (got < 0 || fsync(out) != 0) rc = SR_EIO;
  if (close(out) != 0) rc = SR_EIO;
  close(in);
  if (rc) sr_fmt(err, errlen, "%s: cannot copy to %s: %s", src, dst, strerror(errno));
  return rc;
}

/* Which layout the source's shards/ has; -1 with the reason in err. */
static int find_layout(const char *step_dir, const ckpt_info *ci, char *err, size_t errlen) {
  char p[4300];
  int n = ci->plan->n_shards;
  uint32_t tid = ci->plan->tables[0].table_id;
  snprintf(p, sizeof p, "%s/shards/table-%u.bin", step_dir, tid);
  if (is_file(p)) return RESHARD_TABLE_FILES_LOCAL;
  snprintf(p, sizeof p, "%s/shards/shard-0/table-%u.bin", step_dir, tid);
  if (is_file(p)) return RESHARD_TABLE_FILES_SERVERS;
  for (int k = 0; k < n; k++) {
    snprintf(p, sizeof p, "%s/shards/shard-%d/CURRENT", step_dir, k);
    if (is_file(p)) continue;
    /* Servers hosting several shards each: shard-0-1/... */
    char d[4300];
    snprintf(d, sizeof d, "%s/shards", step_dir);
    char **files;
    int nf;
    int servers = 0;
    if (!store_list_files(d, &files, &nf)) {
      char want[64];
      snprintf(want, sizeof want, "/table-%u.bin", tid);
      for (int i = 0; i < nf && !servers; i++) {
        size_t l = strlen(files[i]), wl = strlen(want);
        servers = !strncmp(files[i], "shard-", 6) && l > wl && !strcmp(files[i] + l - wl, want);
      }
      store_paths_free(files, nf);
    }
    if (servers) return RESHARD_TABLE_FILES_SERVERS;
    sr_fmt(err, errlen, "%s/shards/shard-%d: missing (the plan has %d shards)", step_dir, k, n);
    return -1;
  }
  return RESHARD_ROCKSDB;
}

int cmd_reshard(int argc, char **argv) {
  const char *from = NULL, *to = NULL, *plan_path = NULL;
  int force = 0;
  long long threads = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_FROM: from = optarg; break;
      case O_TO: to = optarg; break;
      case O_PLAN: plan_path = optarg; break;
      case O_FORCE: force = 1; break;
      case O_THREADS: if (cli_int(CMD, "--threads", optarg, 1, 256, &threads)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec reshard: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!from || !to || !plan_path) {
    fprintf(stderr, "shardrec reshard: --from, --to and --plan are required (see --help)\n");
    return 2;
  }
  size_t tl = strlen(to);
  while (tl > 1 && to[tl - 1] == '/') tl--;
  char out[4096];
  if (tl >= 3000) {
    fprintf(stderr, "shardrec reshard: --to: path too long\n");
    return 2;
  }
  snprintf(out, sizeof out, "%.*s", (int)tl, to);

  double t_start = sr_now();
  char err[2048], step_dir[4096];
  ckpt_info ci;
  memset(&ci, 0, sizeof ci);
  emb_plan *plan = NULL;
  reshard_stats st;
  memset(&st, 0, sizeof st);
  int status = 1, rc;
  char tmp[4200] = "", old[4200] = "";
  if (ckpt_resolve(from, step_dir, sizeof step_dir, err, sizeof err)) {
    fprintf(stderr, "shardrec reshard: --from %s: %s\n", from, err);
    return 1;
  }
  if ((rc = ckpt_open(step_dir, &ci, err, sizeof err))) {
    fprintf(stderr, "shardrec reshard: --from %s: %s\n", from, err);
    return 1;
  }
  if (emb_plan_load(plan_path, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec reshard: --plan: %s\n", err);
    goto done;
  }
  {
    char a[EMB_FP_HEX], b[EMB_FP_HEX], diff[512];
    emb_plan_model_fingerprint(ci.plan, a);
    emb_plan_model_fingerprint(plan, b);
    if (strcmp(a, b)) {
      reshard_model_diff(ci.plan, plan, diff, sizeof diff);
      fprintf(stderr,
              "shardrec reshard: --plan %s describes another model than the checkpoint %s (model "
              "fingerprint %.12s... vs %.12s...)%s%s; a new plan may change only n_shards and "
              "placements\n",
              plan_path, step_dir, b, a, diff[0] ? ": " : "", diff);
      goto done;
    }
  }
  int layout = find_layout(step_dir, &ci, err, sizeof err);
  if (layout < 0) {
    fprintf(stderr, "shardrec reshard: --from: %s\n", err);
    goto done;
  }
  if (exists(out) && !force) {
    fprintf(stderr, "shardrec reshard: --to %s: already exists (give --force to replace it once "
            "the new checkpoint is complete)\n", out);
    goto done;
  }
  if (exists(out)) { /* --force: the source must not live under what is replaced */
    char ro[PATH_MAX], rs[PATH_MAX];
    if (realpath(out, ro) && realpath(step_dir, rs)) {
      size_t l = strlen(ro);
      if (!strncmp(rs, ro, l) && (rs[l] == '/' || !rs[l])) {
        fprintf(stderr, "shardrec reshard: --to %s holds the source checkpoint %s; write the new "
                "one elsewhere\n", out, step_dir);
        goto done;
      }
    }
  }
  /* Everything under OUT.tmp-PID: OUT.tmp-PID/step-N once complete. */
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
  char stage[4400], final[4400], shards[4500], work[4400], p1[4500], p2[4500];
  snprintf(stage, sizeof stage, "%s/.step-%lld.tmp", tmp, (long long)ci.st.step);
  snprintf(final, sizeof final, "%s/step-%lld", tmp, (long long)ci.st.step);
  snprintf(shards, sizeof shards, "%s/shards", stage);
  snprintf(work, sizeof work, "%s/work", tmp);
  if (mkdir(tmp, 0777) != 0) {
    fprintf(stderr, "shardrec reshard: %s: cannot create: %s\n", tmp, strerror(errno));
    tmp[0] = 0;
    goto done;
  }
  if (mkdir(stage, 0777) != 0 || mkdir(shards, 0777) != 0 || mkdir(work, 0777) != 0) {
    fprintf(stderr, "shardrec reshard: %s: cannot create folders: %s\n", tmp, strerror(errno));
    goto done;
  }
  snprintf(p1, sizeof p1, "%s/dense.bin", step_dir);
  snprintf(p2, sizeof p2, "%s/dense.bin", stage);
  if (is_file(p1) && copy_file(p1, p2, err, sizeof err)) {
    fprintf(stderr, "shardrec reshard: %s\n", err);
    goto done;
  }
  {
    char src_shards[4300];
    snprintf(src_shards, sizeof src_shards, "%s/shards", step_dir);
    const char *cor = getenv("SHARDREC_TEST_RESHARD_CORRUPT");
    /* One table per core at a time (scanning, hashing and SST encoding are
     * CPU work; the per-target ingestion threads mostly wait on fsync). */
    long n_cpu = threads ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cpu < 1) n_cpu = 1;
    if (!threads && n_cpu > 8) n_cpu = 8;
    reshard_opts ro = {.layout = (reshard_layout)layout, .src_dir = src_shards, .src = ci.plan, .dst = plan, .out_dir = shards,
                       .work_dir = work, .progress = cli_isatty_err(), .verify = 1,
                       .src_checked = 1,
                       .threads = (int)n_cpu,
                       .corrupt = cor ? atoi(cor) : 0};
    static const char *const lname[] = {"RocksDB shard databases", "the in-memory trainer's table files",
                                        "in-memory servers' table files"};
    printf("reshard %s (%d shard%s) -> %s (%d shard%s), step %lld, %s\n", step_dir,
           ci.plan->n_shards, ci.plan->n_shards == 1 ? "" : "s", out, plan->n_shards,
           plan->n_shards == 1 ? "" : "s", (long long)ci.st.step, lname[layout]);
    fflush(stdout);
    rc = layout == RESHARD_ROCKSDB ? reshard_run(&ro, &st, err, sizeof err)
                                   : reshard_run_files(&ro, &st, err, sizeof err);
    for (int t = 0; t < st.n_tables && (rc == 0 || rc == SR_ECHECKSUM); t++) {
      const reshard_table *x = &st.tables[t];
      printf("verify table_id %u (%s): %llu rows, checksum %016llx%016llx: %s\n", x->table_id,
             x->name, (unsigned long long)x->rows_out, (unsigned long long)x->sum_out,
             (unsigned long long)x->xor_out, x->ok ? "ok" : "MISMATCH");
    }
    if (rc) {
      fprintf(stderr, "shardrec reshard: %s; nothing written at %s\n", err, out);
      goto done;
    }
  }
  store_rmtree(work);
  if ((rc = ckpt_write_as(&ci, plan, stage, final, err, sizeof err))) {
    fprintf(stderr, "shardrec reshard: %s\n", err);
    goto done;
  }
  store_fsync_dir(tmp);
  if (exists(out)) {
    snprintf(old, sizeof old, "%s.old-%ld", out, (long)getpid());
    if (rename(out, old) != 0) {
      fprintf(stderr, "shardrec reshard: %s: cannot move aside: %s\n", out, strerror(errno));
      old[0] = 0;
      goto done;
    }
  }
  if (rename(tmp, out) != 0) {
    fprintf(stderr, "shardrec reshard: %s: cannot rename to %s: %s\n", tmp, out, strerror(errno));
    if (old[0] && rename(old, out) == 0) old[0] = 0;
    goto done;
  }
  tmp[0] = 0;
  {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", out);
    char *sl = strrchr(parent, '/');
    if (sl && sl != parent) *sl = 0;
    else snprintf(parent, sizeof parent, "%s", sl ? "/" : ".");
    store_fsync_dir(parent);
  }
  if (old[0]) {
    store_rmtree(old);
    old[0] = 0;
  }
  {
    double total = sr_now() - t_start, mb = (double)st.bytes / 1e6, s = total > 0 ? total : 1e-9;
    int ok = 0;
    for (int t = 0; t < st.n_tables; t++) ok += st.tables[t].ok;
    /* Seconds from start to finish: checking the source's checksums and
     * writing the new manifest's are part of the job. */
    printf("resharded %llu rows, %.1f MB in %.2f s: %.0f rows/s, %.1f MB/s (moving %.2f s, of which "
           "verification %.2f s); verified %d/%d tables ok\n",
           (unsigned long long)st.rows, mb, total, (double)st.rows / s, mb / s, st.seconds,
           st.verify_seconds, ok, st.n_tables);
    printf("ckpt   %s/step-%lld\n", out, (long long)ci.st.step);
  }
  status = 0;
done:
  if (tmp[0]) store_rmtree(tmp);
  reshard_stats_free(&st);
  emb_plan_free(plan);
  ckpt_info_free(&ci);
  return status;
}
