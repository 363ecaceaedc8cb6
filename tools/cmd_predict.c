/* shardrec predict: score Criteo-format data with a trainer checkpoint's
 * dense model and embedding shards (in process, read from the checkpoint,
 * or on shard servers, e.g. 'shardrec serve --checkpoint CKPT --read-only').
 *
 * One probability per input line, "%.9g" (a float round-trips), in input
 * order; a malformed raw line the reader skips is written as "nan" so the
 * output stays aligned with the input. Samples go through the model in
 * batches of --mini-batch-size valid samples, as the trainer's evaluation
 * does: at the trainer's test batch size the probabilities are the
 * trainer's own, bit for bit. The scoring is score_run
 * (score/score.h); this file turns the flags into its options. */
#include <getopt.h>
#include <stdio.h>

#include "tools/cli.h"
#include "tools/cmds.h"
#include "score/score.h"

#define CMD "predict"

/* The data flags predict takes, and its split unless --data-split is given. */
#define PREDICT_DATA (CLI_DATA_FILES | CLI_DATA_SPLIT | CLI_DATA_SET | CLI_DATA_TEST_FRACTION | \
                      CLI_DATA_MODEL_XFORM | CLI_DATA_NO_LABEL | CLI_DATA_STRICT)
#define PREDICT_SPLIT "all"

static void usage(FILE *f) {
  cli_data d;
  cli_data_init(&d, CMD, PREDICT_DATA, PREDICT_SPLIT);
  fprintf(f,
"usage: shardrec predict --checkpoint CKPT (--processed-data-file F | --raw-data-file F)\n"
"                        --out PRED.tsv [options]\n"
"\n"
"Scores every sample of the file (or of --data-split) with the checkpoint's dense model\n"
"and embedding rows; writes one probability per line (\"%%.9g\") in input order, \"nan\" for\n"
"a malformed raw line (skipped, reported as train reports them). Labelled input also\n"
"prints AUC and log loss (--no-label: none). Raw rows are mapped with the model's own\n"
"data transform (the dictionaries it was trained with, recorded in the checkpoint): no\n"
"dictionary is built from the file, a value the model never kept is the unseen id 0. A\n"
"processed file must carry the same transform (convert it with --mapping-from CKPT), or\n"
"the checkpoint record none (then it scores no raw rows); anything else is refused\n"
"before a row is scored. --data-set kaggle only (terabyte's day files are not read\n"
"here).\n"
"\n"
"  --checkpoint CKPT         a step-N folder written by 'train --save-checkpoint', or a\n"
"                            folder of them (the newest complete one; 'train --save-model\n"
"                            DIR' writes one too); verified, only read\n"
"  --model CKPT              alias of --checkpoint\n"
"  --shard-servers H:P,...   score against shard servers, one per shard of the checkpoint's\n"
"                            plan in shard order (e.g. 'serve --checkpoint CKPT --shard K\n"
"                            --read-only; they must serve THIS checkpoint: servers of\n"
"                            another one under the same plan are not detected); default:\n"
"                            the rows in this process, read from\n"
"                            the checkpoint (RocksDB shards copied, SST files linked, into a\n"
"                            temporary folder removed at exit)\n"
"  --rpc-deadline S          seconds per shard-server call (30)\n"
"  --tls-ca F [--tls-cert F --tls-key F]   TLS (and mTLS) to the shard servers\n"
"  --cache-mb N              in process, RocksDB shards: the row cache (256)\n");
  cli_data_help(f, &d, 26);
  fprintf(f,
"  --mini-batch-size N       samples per forward pass (the checkpoint's training batch,\n"
"                            which is train's test batch unless --test-mini-batch-size\n"
"                            was given: the same batch gives the trainer's bits)\n"
"  --out PRED.tsv            where the probabilities go (written whole, then renamed)\n"
"  --metrics-out FILE.json   labelled input: the metrics as one JSON object\n"
"  --dense-threads N         threads of the dense forward (every core); never changes results\n"
"  --dense-isa baseline|avx2 our dense kernels (the best this CPU runs; the checkpoint's\n"
"                            train header and manifest say which it was trained with)\n");
}

enum {
  O_CKPT = 1000, O_SERVERS, O_RPCDL, O_TLSCA, O_TLSCERT, O_TLSKEY, O_CMB, O_BATCH, O_OUT,
  O_METRICS, O_HELP, O_DTHREADS, O_DISA
};

static const struct option long_opts[] = {
    {"checkpoint", required_argument, 0, O_CKPT},
    {"model", required_argument, 0, O_CKPT}, /* alias */
    {"shard-servers", required_argument, 0, O_SERVERS},
    {"rpc-deadline", required_argument, 0, O_RPCDL},
    {"tls-ca", required_argument, 0, O_TLSCA},
    {"tls-cert", required_argument, 0, O_TLSCERT},
    {"tls-key", required_argument, 0, O_TLSKEY},
    {"cache-mb", required_argument, 0, O_CMB},
    /* and the data flags of PREDICT_DATA (tools/cli_data.c) */
    {"mini-batch-size", required_argument, 0, O_BATCH},
    {"out", required_argument, 0, O_OUT},
    {"metrics-out", required_argument, 0, O_METRICS},
    {"help", no_argument, 0, O_HELP},
    {"dense-threads", required_argument, 0, O_DTHREADS},
    {"dense-isa", required_argument, 0, O_DISA},
    {0, 0, 0, 0}};

/* --dense-threads and --dense-isa (0 / NULL: every core, the best kernels). */
static int dense_threads;
static const dense_backend *dense_be;

/* The flags as given: the options, with what the checks need beside them. */
typedef struct flags {
  score_opts o;
  cli_data data;
  long long cache_mb;
} flags;

/* Parse argv into *f. Returns -1 to go on, or the exit status (0 for
 * --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, flags *f) {
  score_opts *o = &f->o;
  cli_data_init(&f->data, CMD, PREDICT_DATA, PREDICT_SPLIT);
  struct option opts[CLI_OPTIONS_MAX];
  if (cli_data_options(&f->data, long_opts, opts, CLI_OPTIONS_MAX)) return 1;
  double deadline = 30;
  long long batch = 0;
  optind = 1;
  opterr = 0;
  int c, rc;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case O_CKPT: o->checkpoint = optarg; break;
      case O_SERVERS: o->shard_servers = optarg; break;
      case O_RPCDL: if (cli_flag_double(CMD, "--rpc-deadline", optarg, &deadline)) return 2; break;
      case O_TLSCA: o->tls_ca = optarg; break;
      case O_TLSCERT: o->tls_cert = optarg; break;
      case O_TLSKEY: o->tls_key = optarg; break;
      case O_CMB: if (cli_flag(CMD, "--cache-mb", optarg, &f->cache_mb)) return 2; break;
      case O_BATCH: if (cli_flag(CMD, "--mini-batch-size", optarg, &batch)) return 2; break;
      case O_OUT: o->out = optarg; break;
      case O_METRICS: o->metrics_out = optarg; break;
      case O_DTHREADS: if (cli_dense_threads(CMD, optarg, &dense_threads)) return 2; break;
      case O_DISA: if (cli_dense_isa(CMD, optarg, &dense_be)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      default: /* a data flag, or ':' / '?' from getopt_long */
        if ((rc = cli_data_flag(&f->data, c, optarg)) < 0)
          cli_bad_option(CMD, c, argv[optind - 1]);
        if (rc) return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec predict: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  o->rpc_deadline = deadline;
  o->batch = (int)batch;
  o->cache_mb = (uint64_t)f->cache_mb;
  return -1;
}

/* The flags that do not go together; 0, or 2 with the message printed. */
static int check_flags(flags *f) {
  score_opts *o = &f->o;
  const cli_data *d = &f->data;
  if (!o->checkpoint || !o->out || !!d->processed == !!d->raw) {
    fprintf(stderr, "shardrec predict: need --checkpoint, --out and exactly one of "
                    "--processed-data-file, --raw-data-file (see --help)\n");
    return 2;
  }
  if (cli_data_score(d, o)) return 2;
  if (d->terabyte) {
    fprintf(stderr, "shardrec predict: --data-set: 'terabyte': only kaggle (one file) is read "
                    "here\n");
    return 2;
  }
  if (o->no_label && o->metrics_out) {
    fprintf(stderr, "shardrec predict: --metrics-out needs labels (drop --no-label)\n");
    return 2;
  }
  const cli_file outs[2] = {{"--out", o->out}, {"--metrics-out", o->metrics_out}};
  if (cli_out_file(CMD, "--out", o->out) || cli_out_file(CMD, "--metrics-out", o->metrics_out) ||
      cli_outs_apart(CMD, d, outs, 2))
    return 2;
  if (!o->shard_servers && (o->tls_ca || o->tls_cert || o->tls_key)) {
    fprintf(stderr, "shardrec predict: --tls-* apply to --shard-servers\n");
    return 2;
  }
  if (o->shard_servers && f->cache_mb) {
    fprintf(stderr, "shardrec predict: --cache-mb: with --shard-servers the rows live on the servers\n");
    return 2;
  }
  return 0;
}

int cmd_predict(int argc, char **argv) {
  flags f = {.o = {.log = stdout, .report = stderr, .who = "shardrec predict",
                   .progress = cli_isatty_err()}};
  int st = parse_flags(argc, argv, &f);
  if (st >= 0) return st;
  if ((st = check_flags(&f))) return st;
  char err[2048];
  score_result res;
  struct dense_pool *pool = cli_dense_begin(CMD, dense_threads, dense_be);
  if (!pool) return 1;
  int rc = score_run(&f.o, &res, err, sizeof err);
  cli_dense_end(pool);
  if (rc) {
    fprintf(stderr, "shardrec predict: %s\n", err);
    return res.bad_usage ? 2 : 1;
  }
  return 0;
}
