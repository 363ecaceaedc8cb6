/* shardrec predict: score Criteo-format data with a trainer checkpoint's
 * dense model and embedding shards (in process, read from the checkpoint,
 * or on shard servers, e.g. 'shardrec serve --checkpoint CKPT --read-only').
 *
 * One probability per input line, "%.9g" (a float round-trips), in input
 * order; a malformed raw line the reader skips is written as "nan" so the
 * output stays aligned with the input. Samples go through the model in
 * batches of --mini-batch-size valid samples, as the trainer's evaluation
 * does: at the trainer's test batch size the probabilities are the
 * trainer's own, bit for bit. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/status.h"
#include "common/sys.h"
#include "datasets/source.h"
#include "dense/metrics.h"
#include "rpc/client.h"
#include "tools/train/checkpoint.h"
#include "embedding/ckpt_store.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/train/trainer.h"

#define CMD "predict"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec predict --checkpoint CKPT (--processed-data-file F | --raw-data-file F)\n"
"                        --out PRED.tsv [options]\n"
"\n"
"Scores every sample of the file (or of --data-split) with the checkpoint's dense model\n"
"and embedding rows; writes one probability per line (\"%%.9g\") in input order, \"nan\" for\n"
"a malformed raw line (skipped, reported as train reports them). Labelled input also\n"
"prints AUC and log loss.\n"
"\n"
"  --checkpoint CKPT         a step-N folder written by 'train --save-checkpoint', or a\n"
"                            folder of them (the newest complete one); verified, only read\n"
"  --shard-servers H:P,...   score against shard servers, one per shard of the checkpoint's\n"
"                            plan in shard order (e.g. 'serve --checkpoint CKPT --shard K\n"
"                            --read-only; they must serve THIS checkpoint: servers of\n"
"                            another one under the same plan are not detected); default:\n"
"                            the rows in this process, read from\n"
"                            the checkpoint (RocksDB shards copied, SST files linked, into a\n"
"                            temporary folder removed at exit)\n"
"  --rpc-deadline S          seconds per shard-server call (30)\n"
"  --tls-ca F [--tls-cert F --tls-key F]   TLS (and mTLS) to the shard servers\n"
"  --cache-mb N              in process, RocksDB shards: the row cache (256)\n"
"  --processed-data-file F   binary records made by 'shardrec convert' (holds its split\n"
"                            and the ids as training saw them)\n"
"  --raw-data-file F         Criteo TSV (or .gz). Ids are mapped as train maps them: the\n"
"                            dictionary is built from the train part of THIS file under\n"
"                            --data-set/--test-fraction, --max-ind-range and\n"
"                            --frequency-threshold, so give the file and flags training\n"
"                            used (or score the processed file)\n"
"  --data-split all|train|test|val   which part to score (all); 'test' is what train's\n"
"                            evaluation scores\n"
"  --data-set kaggle         raw data: split as the reference DLRM (kaggle; terabyte's\n"
"                            day files are not read here)\n"
"  --test-fraction F         raw data: the last F of the lines are the test part instead\n"
"  --max-ind-range N, --frequency-threshold N   raw data: as at training\n"
"  --no-label                raw data without the label column (no metrics)\n"
"  --strict                  raw data: the first malformed line is fatal\n"
"  --mini-batch-size N       samples per forward pass (the checkpoint's training batch,\n"
"                            which is train's test batch unless --test-mini-batch-size\n"
"                            was given: the same batch gives the trainer's bits)\n"
"  --out PRED.tsv            where the probabilities go (written whole, then renamed)\n"
"  --metrics-out FILE.json   labelled input: the metrics as one JSON object\n");
}

enum {
  O_CKPT = 1000, O_SERVERS, O_RPCDL, O_TLSCA, O_TLSCERT, O_TLSKEY, O_CMB, O_PROC, O_RAW,
  O_SPLIT, O_DATASET, O_TESTFRAC, O_MAXIND, O_FREQ, O_NOLABEL, O_STRICT, O_BATCH, O_OUT,
  O_METRICS, O_HELP
};

static const struct option long_opts[] = {
    {"checkpoint", required_argument, 0, O_CKPT},
    {"shard-servers", required_argument, 0, O_SERVERS},
    {"rpc-deadline", required_argument, 0, O_RPCDL},
    {"tls-ca", required_argument, 0, O_TLSCA},
    {"tls-cert", required_argument, 0, O_TLSCERT},
    {"tls-key", required_argument, 0, O_TLSKEY},
    {"cache-mb", required_argument, 0, O_CMB},
    {"processed-data-file", required_argument, 0, O_PROC},
    {"raw-data-file", required_argument, 0, O_RAW},
    {"data-split", required_argument, 0, O_SPLIT},
    {"data-set", required_argument, 0, O_DATASET},
    {"test-fraction", required_argument, 0, O_TESTFRAC},
    {"max-ind-range", required_argument, 0, O_MAXIND},
    {"frequency-threshold", required_argument, 0, O_FREQ},
    {"no-label", no_argument, 0, O_NOLABEL},
    {"strict", no_argument, 0, O_STRICT},
    {"mini-batch-size", required_argument, 0, O_BATCH},
    {"out", required_argument, 0, O_OUT},
    {"metrics-out", required_argument, 0, O_METRICS},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0}};

/* The malformed lines of a raw file's split, as split-relative line numbers
 * in ascending order (*bad, malloc'd), found by the reader's own line parser
 * over the same lines: the source skips them without a trace, and the
 * output must still have one line per input line. 0 or -1 (err). */
static int find_bad_lines(const char *path, const ds_source_opts *so, uint64_t **bad,
                          size_t *n_bad, uint64_t *n_lines, char *err, size_t errlen) {
  *bad = NULL;
  *n_bad = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  gzbuffer(f, 1 << 20);
  const size_t max_line = (3u << 20); /* the reader skips longer lines (DS_BAD_LONG) */
  size_t cap = 1 << 16, cap_bad = 0, all_bad = 0;
  char *line = malloc(cap);
  uint64_t *abs = NULL, total = 0;
  int rc = 0;
  ds_criteo_sample *smp = malloc(sizeof *smp);
  const ds_criteo_parse_opts po = {.no_label = so->no_label};
  if (!line || !smp) goto oom;
  for (;;) {
    size_t len = 0;
    int got = 0;
    while (gzgets(f, line + len, (int)(cap - len))) {
      got = 1;
      len += strlen(line + len);
      if (len && line[len - 1] == '\n') break;
      if (cap - len < 2) {
        char *q = realloc(line, cap * 2);
        if (!q) goto oom;
        line = q;
        cap *= 2;
      }
    }
    if (!got) break;
    int is_bad = len > max_line || ds_criteo_parse_line(line, len, &po, smp, NULL, 0) != 0;
    if (is_bad) {
      if (all_bad == cap_bad) {
        cap_bad = cap_bad ? 2 * cap_bad : 64;
        uint64_t *q = realloc(abs, cap_bad * sizeof *abs);
        if (!q) goto oom;
        abs = q;
      }
      abs[all_bad++] = total;
    }
    total++;
  }
  int zerr;
  const char *zmsg = gzerror(f, &zerr);
  if (zerr != Z_OK && zerr != Z_BUF_ERROR) {
    snprintf(err, errlen, "%s: read error: %s", path, zmsg);
    rc = -1;
    goto out;
  }
  ds_split_ranges r;
  if (ds_split_ranges_compute(so->scheme, total, 0, so->test_fraction, &r)) {
    snprintf(err, errlen, "%s: cannot split %llu lines", path, (unsigned long long)total);
    rc = -1;
    goto out;
  }
  uint64_t lo = r.begin[so->split], hi = r.end[so->split];
  for (size_t i = 0; i < all_bad; i++)
    if (abs[i] >= lo && abs[i] < hi) abs[(*n_bad)++] = abs[i] - lo;
  *bad = abs;
  abs = NULL;
  *n_lines = hi - lo;
  goto out;
oom:
  snprintf(err, errlen, "out of memory scanning %s", path);
  rc = -1;
out:
  gzclose(f);
  free(line);
  free(abs);
  free(smp);
  return rc;
}

/* Load the dense parameters of step_dir/dense.bin (format in
 * tools/checkpoint.h) into m, checking its header against m and its own
 * SHA-256 trailer. The optimizer state after them is not needed to score,
 * and ckpt_open has already checked the file against the manifest, so this
 * avoids ckpt_load's second pass over every file of the checkpoint. 0 or -1
 * (err names the file). */
static int load_dense(const char *step_dir, dense_model *m, char *err, size_t errlen) {
  char path[4200];
  snprintf(path, sizeof path, "%s/dense.bin", step_dir);
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  int rc = -1;
  unsigned char *buf = NULL;
  size_t np = 0;
  float *p = dense_model_params(m, &np);
  if (fseek(f, 0, SEEK_END) != 0) goto bad_read;
  long len = ftell(f);
  if (len < 256 + 32 || fseek(f, 0, SEEK_SET) != 0) goto bad_read;
  buf = malloc((size_t)len);
  if (!buf) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    goto out;
  }
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) goto bad_read;
  uint32_t v, hb;
  uint64_t n1, n2;
  memcpy(&v, buf + 8, 4);
  memcpy(&hb, buf + 12, 4);
  memcpy(&n1, buf + 16, 8);
  memcpy(&n2, buf + 24, 8);
  unsigned char dig[32];
  if (memcmp(buf, "SRCKDENS", 8) || v != 1 || hb != 256) {
    sr_fmt(err, errlen, "%s: not a version 1 shardrec dense checkpoint file", path);
    goto out;
  }
  if (n1 != np || n2 > ((uint64_t)len - 256 - 32) / 4 ||
      (uint64_t)len != 256 + 4 * (n1 + n2) + 32) {
    sr_fmt(err, errlen, "%s: holds %llu parameters (%ld bytes); the manifest's architecture "
             "has %zu", path, (unsigned long long)n1, len, np);
    goto out;
  }
  if (emb_sha256(buf, (size_t)len - 32, dig) || memcmp(dig, buf + len - 32, 32)) {
    sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", path);
    goto out;
  }
  memcpy(p, buf + 256, np * sizeof *p);
  rc = 0;
  goto out;
bad_read:
  sr_fmt(err, errlen, "%s: cannot read (torn or truncated?)", path);
out:
  free(buf);
  fclose(f);
  return rc;
}

int cmd_predict(int argc, char **argv) {
  const char *ckpt = NULL, *servers = NULL, *proc = NULL, *raw = NULL, *split_s = "all",
             *dataset = "kaggle", *outp = NULL, *metrics_p = NULL, *tls_ca = NULL,
             *tls_cert = NULL, *tls_key = NULL;
  double frac = 0, deadline = 30;
  int have_frac = 0, no_label = 0, strict = 0;
  uint64_t maxind = 0;
  long long freq = 0, batch = 0, cache_mb = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_CKPT: ckpt = optarg; break;
      case O_SERVERS: servers = optarg; break;
      case O_RPCDL: if (cli_double(CMD, "--rpc-deadline", optarg, 0.001, 86400, &deadline)) return 2; break;
      case O_TLSCA: tls_ca = optarg; break;
      case O_TLSCERT: tls_cert = optarg; break;
      case O_TLSKEY: tls_key = optarg; break;
      case O_CMB: if (cli_int(CMD, "--cache-mb", optarg, 1, 1LL << 30, &cache_mb)) return 2; break;
      case O_PROC: proc = optarg; break;
      case O_RAW: raw = optarg; break;
      case O_SPLIT: split_s = optarg; break;
      case O_DATASET: dataset = optarg; break;
      case O_TESTFRAC:
        if (cli_double(CMD, "--test-fraction", optarg, 0, 1, &frac)) return 2;
        have_frac = 1;
        break;
      case O_MAXIND: if (cli_u64(CMD, "--max-ind-range", optarg, &maxind)) return 2; break;
      case O_FREQ: if (cli_int(CMD, "--frequency-threshold", optarg, 0, 1LL << 31, &freq)) return 2; break;
      case O_NOLABEL: no_label = 1; break;
      case O_STRICT: strict = 1; break;
      case O_BATCH: if (cli_int(CMD, "--mini-batch-size", optarg, 1, 1 << 20, &batch)) return 2; break;
      case O_OUT: outp = optarg; break;
      case O_METRICS: metrics_p = optarg; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec predict: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!ckpt || !outp || !!proc == !!raw) {
    fprintf(stderr, "shardrec predict: need --checkpoint, --out and exactly one of "
                    "--processed-data-file, --raw-data-file (see --help)\n");
    return 2;
  }
  ds_split sp;
  if (!strcmp(split_s, "all")) sp = DS_SPLIT_ALL;
  else if (!strcmp(split_s, "train")) sp = DS_SPLIT_TRAIN;
  else if (!strcmp(split_s, "test")) sp = DS_SPLIT_TEST;
  else if (!strcmp(split_s, "val")) sp = DS_SPLIT_VAL;
  else {
    fprintf(stderr, "shardrec predict: --data-split: '%s' is not all, train, test or val\n", split_s);
    return 2;
  }
  if (strcmp(dataset, "kaggle")) {
    fprintf(stderr, "shardrec predict: --data-set: '%s': only kaggle (one file) is read here\n",
            dataset);
    return 2;
  }
  if (proc && (have_frac || maxind || freq || strict || no_label)) {
    fprintf(stderr, "shardrec predict: --test-fraction, --max-ind-range, --frequency-threshold, "
                    "--strict and --no-label apply to --raw-data-file (a processed file holds "
                    "its split, ids and labels)\n");
    return 2;
  }
  if (no_label && metrics_p) {
    fprintf(stderr, "shardrec predict: --metrics-out needs labels (drop --no-label)\n");
    return 2;
  }
  if (!servers && (tls_ca || tls_cert || tls_key)) {
    fprintf(stderr, "shardrec predict: --tls-* apply to --shard-servers\n");
    return 2;
  }
  if (servers && cache_mb) {
    fprintf(stderr, "shardrec predict: --cache-mb: with --shard-servers the rows live on the servers\n");
    return 2;
  }

  char err[1024], step_dir[4096];
  ckpt_info ci = {0};
  ckpt_store cs = {0};
  emb_store *store = NULL;
  trainer *t = NULL;
  ds_source *src = NULL;
  ds_batch b = {0};
  float *pred = NULL, *labels = NULL;
  uint64_t *bad = NULL;
  size_t n_bad = 0;
  FILE *out = NULL;
  char tmp_out[4200] = "";
  int status = 1;
  if (ckpt_resolve(ckpt, step_dir, sizeof step_dir, err, sizeof err) ||
      ckpt_open(step_dir, &ci, err, sizeof err)) {
    fprintf(stderr, "shardrec predict: --checkpoint: %s\n", err);
    return 1;
  }
  const emb_plan *plan = ci.plan;
  if (!ci.has_dense) {
    fprintf(stderr, "shardrec predict: %s/manifest.json records no dense architecture (written "
            "by an older shardrec): score its model with 'shardrec eval' instead\n", step_dir);
    goto done;
  }
  if (!batch) batch = ci.batch;
  char fp[EMB_FP_HEX];
  emb_plan_fingerprint(plan, fp);

  /* The rows: on the servers, or from the checkpoint in this process. */
  if (servers) {
    char *list = strdup(servers);
    const char **addr = malloc((strlen(servers) / 2 + 2) * sizeof *addr);
    int n_addr = 0;
    if (!list || !addr) {
      free(list);
      free(addr);
      fprintf(stderr, "shardrec predict: out of memory\n");
      goto done;
    }
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) addr[n_addr++] = tok;
    if (n_addr != plan->n_shards) {
      fprintf(stderr, "shardrec predict: --shard-servers: %d address(es), the checkpoint's plan "
              "has %d shard(s) (one server per shard, in shard order)\n", n_addr, plan->n_shards);
      free(list);
      free(addr);
      status = 2;
      goto done;
    }
    rpc_tls tls = {.cert = tls_cert, .key = tls_key, .ca = tls_ca};
    rpc_client_opts ro = {.deadline_s = deadline, .tls = tls_ca ? &tls : NULL};
    store = emb_store_create_remote(plan, addr, n_addr, &ro, err, sizeof err);
    free(list);
    free(addr);
    if (!store) {
      fprintf(stderr, "shardrec predict: --shard-servers: %s\n", err);
      goto done;
    }
  } else {
    ckpt_store_opts co = {.cache_mb = (uint64_t)cache_mb};
    if (ckpt_store_open(step_dir, plan, &co, &cs, err, sizeof err)) {
      fprintf(stderr, "shardrec predict: --checkpoint: %s\n", err);
      goto done;
    }
    store = cs.store;
  }
  printf("checkpoint %s: step %lld, plan %.12s, %d shard(s) %s%s\n", step_dir,
         (long long)ci.st.step, fp, plan->n_shards, servers ? "on shard servers: " : "in process, ",
         servers ? servers : cs.layout);

  /* The dense model as trained: its architecture and parameters. */
  dense_config cfg = ci.dense;
  cfg.max_batch = (int)batch;
  /* The optimizer never runs here: SGD keeps no state. */
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_SGD);
  t = trainer_create(plan, store, &cfg, &oc, plan->seed, err, sizeof err);
  if (!t || load_dense(step_dir, trainer_model(t), err, sizeof err)) {
    fprintf(stderr, "shardrec predict: %s\n", err);
    goto done;
  }

  /* The data, opened as train opens it. */
  ds_source_opts so = {.path = proc ? proc : raw, .split = sp, .max_ind_range = maxind,
                       .frequency_threshold = (uint32_t)freq, .no_label = no_label,
                       .strict = strict, .report = stderr};
  if (raw) {
    so.scheme = have_frac ? DS_SCHEME_FRACTION : DS_SCHEME_KAGGLE;
    so.test_fraction = frac;
  }
  double t0 = sr_now();
  src = ds_source_open(&so, err, sizeof err);
  if (!src) {
    fprintf(stderr, "shardrec predict: %s\n", err);
    goto done;
  }
  if (raw) {
    /* Ids past a table's rows mean another dictionary than training's. */
    uint64_t sizes[DS_NUM_SPARSE];
    int warned = 0;
    if (plan->n_tables != DS_NUM_SPARSE) {
      fprintf(stderr, "shardrec predict: the checkpoint's plan has %d tables, Criteo data %d\n",
              plan->n_tables, DS_NUM_SPARSE);
      goto done;
    }
    if (!ds_source_table_sizes(src, sizes)) {
      for (int i = 0; i < DS_NUM_SPARSE; i++) {
        if (sizes[i] > plan->tables[i].rows) {
          fprintf(stderr, "shardrec predict: %s: table %d (%s) gets ids up to %llu, the "
                  "checkpoint's table has %llu rows: the ids are not mapped as at training "
                  "(give the file and --data-set/--test-fraction/--max-ind-range/"
                  "--frequency-threshold training used)\n", raw, i, plan->tables[i].name,
                  (unsigned long long)sizes[i], (unsigned long long)plan->tables[i].rows);
          goto done;
        } else if (sizes[i] != plan->tables[i].rows && !warned) {
          fprintf(stderr, "shardrec predict: warning: %s: table %d (%s) has %llu ids here, %llu "
                  "rows in the checkpoint: unless training set --arch-embedding-size, the ids "
                  "are not mapped as at training (check --test-fraction/--max-ind-range/"
                  "--frequency-threshold and the file)\n", raw, i, plan->tables[i].name,
                  (unsigned long long)sizes[i], (unsigned long long)plan->tables[i].rows);
          warned = 1;
        }
      }
    }
    uint64_t n_lines = 0;
    if (find_bad_lines(raw, &so, &bad, &n_bad, &n_lines, err, sizeof err)) {
      fprintf(stderr, "shardrec predict: %s\n", err);
      goto done;
    }
  }
  uint64_t n_all = ds_source_count(src);
  pred = malloc((n_all ? n_all : 1) * sizeof *pred);
  labels = malloc((n_all ? n_all : 1) * sizeof *labels);
  if (!pred || !labels || ds_batch_init(&b, (int)batch)) {
    fprintf(stderr, "shardrec predict: out of memory for %llu predictions\n",
            (unsigned long long)n_all);
    goto done;
  }
  snprintf(tmp_out, sizeof tmp_out, "%s.tmp-%ld", outp, (long)getpid());
  if (!(out = fopen(tmp_out, "w"))) {
    fprintf(stderr, "shardrec predict: --out %s: cannot open for writing: %s\n", tmp_out,
            strerror(errno));
    tmp_out[0] = 0;
    goto done;
  }
  size_t n = 0, bi = 0;
  uint64_t line = 0; /* split-relative input line of the next output line */
  for (;;) {
    int got = ds_source_next(src, &b, (int)batch);
    if (got < 0) {
      fprintf(stderr, "shardrec predict: %s\n", ds_source_errmsg(src));
      goto done;
    }
    if (got == 0) break;
    if (n + (size_t)got > n_all) {
      fprintf(stderr, "shardrec predict: %s: more samples than counted (%llu)\n", so.path,
              (unsigned long long)n_all);
      goto done;
    }
    if (trainer_predict(t, &b, ci.st.step, pred + n)) {
      fprintf(stderr, "shardrec predict: %s\n", trainer_errmsg(t));
      goto done;
    }
    memcpy(labels + n, b.labels, (size_t)got * sizeof *labels);
    for (int i = 0; i < got; i++, line++) {
      for (; bi < n_bad && bad[bi] == line; bi++, line++) fputs("nan\n", out);
      fprintf(out, "%.9g\n", pred[n + (size_t)i]);
    }
    n += (size_t)got;
  }
  for (; bi < n_bad; bi++, line++) {
    if (bad[bi] != line) break;
    fputs("nan\n", out);
  }
  if (bi != n_bad) {
    /* The reader and the scan disagree on which lines are malformed. */
    fprintf(stderr, "shardrec predict: %s: %zu samples and %zu malformed lines do not add up to "
            "the lines read; output not written\n", so.path, n, n_bad);
    goto done;
  }
  int werr = fflush(out) != 0 || ferror(out);
  werr |= fclose(out) != 0;
  out = NULL;
  if (werr || rename(tmp_out, outp) != 0) {
    fprintf(stderr, "shardrec predict: --out %s: cannot write: %s\n", outp, strerror(errno));
    goto done;
  }
  tmp_out[0] = 0;
  double secs = sr_now() - t0;
  printf("predict %s (%s): %zu samples scored in %.2f s (%.0f samples/s) -> %s\n", so.path,
         split_s, n, secs, secs > 0 ? (double)n / secs : 0.0, outp);
  if (n_bad)
    printf("data   %zu malformed lines skipped (written as nan)\n", n_bad);
  if (!no_label) {
    dense_metrics m;
    if (n == 0) {
      fprintf(stderr, "shardrec predict: %s: the %s split is empty: no metrics\n", so.path, split_s);
      goto done;
    }
    if (dense_metrics_compute(pred, labels, n, &m)) {
      fprintf(stderr, "shardrec predict: metrics failed (NaN predictions?)\n");
      goto done;
    }
    printf("metrics auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  ctr %.4f  (%zu samples)\n",
           m.auc, m.log_loss, m.accuracy, m.mean_pred, m.ctr, n);
    if (metrics_p) {
      FILE *mf = fopen(metrics_p, "w");
      if (!mf) {
        fprintf(stderr, "shardrec predict: --metrics-out %s: cannot open for writing\n", metrics_p);
        goto done;
      }
      fprintf(mf, "{\"kind\":\"predict\",\"n\":%zu,\"auc\":%.17g,\"logloss\":%.17g,"
              "\"accuracy\":%.17g,\"mean_pred\":%.17g,\"ctr\":%.17g}\n",
              n, m.auc, m.log_loss, m.accuracy, m.mean_pred, m.ctr);
      if (fclose(mf) != 0) {
        fprintf(stderr, "shardrec predict: --metrics-out %s: cannot write\n", metrics_p);
        goto done;
      }
    }
  }
  status = 0;
done:
  if (out) fclose(out);
  if (tmp_out[0]) unlink(tmp_out);
  free(pred);
  free(labels);
  free(bad);
  ds_batch_free(&b);
  ds_source_destroy(src);
  trainer_destroy(t);
  if (cs.store) ckpt_store_close(&cs);
  else emb_store_destroy(store);
  ckpt_info_free(&ci);
  return status;
}
