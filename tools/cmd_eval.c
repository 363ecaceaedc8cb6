/* shardrec eval: the metrics of a trained model (a checkpoint, as
 * 'train --save-model DIR' or '--save-checkpoint DIR' writes) on
 * Criteo-format data. eval is predict without the predictions file (--out
 * optional) and with the test split by default: the scoring is score_run
 * (score/score.h); this file turns the flags into its options. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/cmds.h"
#include "score/score.h"

#define CMD "eval"

/* The data flags eval takes, and its split unless --data-split is given. */
#define EVAL_DATA (CLI_DATA_FILES | CLI_DATA_SPLIT | CLI_DATA_SET | CLI_DATA_TEST_FRACTION | \
                   CLI_DATA_MODEL_XFORM)
#define EVAL_SPLIT "test"

static void usage(FILE *f) {
  cli_data d;
  cli_data_init(&d, CMD, EVAL_DATA, EVAL_SPLIT);
  fprintf(f,
"usage: shardrec eval --checkpoint DIR (--processed-data-file F | --raw-data-file F) [options]\n"
"\n"
"The metrics of the model on the file (or its --data-split). Raw rows are mapped with the\n"
"model's own data transform (recorded in the checkpoint); a processed file must carry the\n"
"same transform (convert it with --mapping-from CKPT), or the checkpoint record none\n"
"(then it scores no raw rows): anything else is refused.\n"
"\n"
"  --checkpoint DIR          a model saved by 'shardrec train --save-model DIR', or any\n"
"                            checkpoint folder ('--save-checkpoint': a step-N folder, or a\n"
"                            folder of them: the newest complete one); verified, only read\n"
"  --model DIR               alias of --checkpoint\n");
  cli_data_help(f, &d, 26);
  fprintf(f,
"  --mini-batch-size N       samples per forward pass (the checkpoint's training batch)\n"
"  --out FILE                write one predicted probability per input line ('nan' for a\n"
"                            malformed raw line), as 'shardrec predict --out'\n"
"  --dense-threads N         threads of the dense forward (every core); never changes results\n"
"  --dense-isa baseline|avx2 our dense kernels (the best this CPU runs; the checkpoint's\n"
"                            train header and manifest say which it was trained with)\n");
}

enum { O_CKPT = 1000, O_BATCH, O_OUT, O_HELP, O_DTHREADS, O_DISA };

static const struct option long_opts[] = {
    {"checkpoint", required_argument, 0, O_CKPT},
    {"model", required_argument, 0, O_CKPT}, /* alias */
    /* and the data flags of EVAL_DATA (tools/cli_data.c) */
    {"mini-batch-size", required_argument, 0, O_BATCH},
    {"out", required_argument, 0, O_OUT},
    {"help", no_argument, 0, O_HELP},
    {"dense-threads", required_argument, 0, O_DTHREADS},
    {"dense-isa", required_argument, 0, O_DISA},
    {0, 0, 0, 0}};

/* --dense-threads and --dense-isa (0 / NULL: every core, the best kernels). */
static int dense_threads;
static const dense_backend *dense_be;

/* Parse argv into *o. Returns -1 to go on, or the exit status (0 for
 * --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, score_opts *o) {
  cli_data d;
  cli_data_init(&d, CMD, EVAL_DATA, EVAL_SPLIT);
  struct option opts[CLI_OPTIONS_MAX];
  if (cli_data_options(&d, long_opts, opts, CLI_OPTIONS_MAX)) return 1;
  long long batch = 0;
  optind = 1;
  opterr = 0;
  int c, rc;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case O_CKPT: o->checkpoint = optarg; break;
      case O_BATCH: if (cli_flag(CMD, "--mini-batch-size", optarg, &batch)) return 2; break;
      case O_OUT: o->out = optarg; break;
      case O_DTHREADS: if (cli_dense_threads(CMD, optarg, &dense_threads)) return 2; break;
      case O_DISA: if (cli_dense_isa(CMD, optarg, &dense_be)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      default: /* a data flag, or ':' / '?' from getopt_long */
        if ((rc = cli_data_flag(&d, c, optarg)) < 0) cli_bad_option(CMD, c, argv[optind - 1]);
        if (rc) return 2;
    }
  }
  if (!o->checkpoint || !!d.processed == !!d.raw || optind < argc) {
    fprintf(stderr, "shardrec eval: need --checkpoint (or --model) and exactly one of "
                    "--processed-data-file, --raw-data-file (see --help)\n");
    return 2;
  }
  if (cli_data_score(&d, o)) return 2;
  const cli_file out = {"--out", o->out};
  if (cli_out_file(CMD, "--out", o->out) || cli_outs_apart(CMD, &d, &out, 1)) return 2;
  o->batch = (int)batch;
  return -1;
}

int cmd_eval(int argc, char **argv) {
  score_opts o = {.report = stderr, .who = "shardrec eval"};
  int st = parse_flags(argc, argv, &o);
  if (st >= 0) return st;
  char err[2048];
  score_result res;
  struct dense_pool *pool = cli_dense_begin(CMD, dense_threads, dense_be);
  if (!pool) return 1;
  int rc = score_run(&o, &res, err, sizeof err);
  cli_dense_end(pool);
  if (rc) {
    fprintf(stderr, "shardrec eval: %s\n", err);
    return res.bad_usage ? 2 : 1;
  }
  const dense_metrics *m = &res.m;
  printf("eval   %s (%s, %zu samples): auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  "
         "ctr %.4f\n", o.data_path, o.split_name, res.n, m->auc, m->log_loss, m->accuracy,
         m->mean_pred, m->ctr);
  return 0;
}
