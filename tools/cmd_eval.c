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

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec eval --checkpoint DIR (--processed-data-file F | --raw-data-file F) [options]\n"
"  --checkpoint DIR          a model saved by 'shardrec train --save-model DIR', or any\n"
"                            checkpoint folder ('--save-checkpoint': a step-N folder, or a\n"
"                            folder of them: the newest complete one); verified, only read\n"
"  --model DIR               alias of --checkpoint\n"
"  --processed-data-file F   binary records ('shardrec convert')\n"
"  --raw-data-file F         Criteo TSV (or .gz); ids mapped as train maps them, so give\n"
"                            the flags training used\n"
"  --data-split test|val|train|all   which part to score (test)\n"
"  --split test|val|train|all        alias of --data-split\n"
"  --data-set kaggle|terabyte   raw data split as the reference DLRM (kaggle)\n"
"  --test-fraction F         raw data: the last F of the lines are the test set\n"
"  --max-ind-range N, --frequency-threshold N   raw data: as at training\n"
"  --mini-batch-size N       samples per forward pass (the checkpoint's training batch)\n"
"  --out FILE                write one predicted probability per input line ('nan' for a\n"
"                            malformed raw line), as 'shardrec predict --out'\n"
"  --dense-threads N         threads of the dense forward (every core); never changes results\n"
"  --dense-isa baseline|avx2 our dense kernels (the best this CPU runs; the checkpoint's\n"
"                            train header and manifest say which it was trained with)\n");
}

enum {
  O_CKPT = 1000, O_PROC, O_RAW, O_SPLIT, O_DATASET, O_TESTFRAC, O_MAXIND, O_FREQ, O_BATCH,
  O_OUT, O_HELP, O_DTHREADS, O_DISA
};

static const struct option long_opts[] = {
    {"checkpoint", required_argument, 0, O_CKPT},
    {"model", required_argument, 0, O_CKPT}, /* alias */
    {"processed-data-file", required_argument, 0, O_PROC},
    {"raw-data-file", required_argument, 0, O_RAW},
    {"data-split", required_argument, 0, O_SPLIT},
    {"split", required_argument, 0, O_SPLIT}, /* alias */
    {"data-set", required_argument, 0, O_DATASET},
    {"test-fraction", required_argument, 0, O_TESTFRAC},
    {"max-ind-range", required_argument, 0, O_MAXIND},
    {"frequency-threshold", required_argument, 0, O_FREQ},
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
  const char *proc = NULL, *raw = NULL, *dataset = "kaggle";
  long long freq = 0, batch = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case O_CKPT: o->checkpoint = optarg; break;
      case O_PROC: proc = optarg; break;
      case O_RAW: raw = optarg; break;
      case O_SPLIT: o->split_name = optarg; break;
      case O_DATASET: dataset = optarg; break;
      case O_TESTFRAC:
        if (cli_flag_double(CMD, "--test-fraction", optarg, &o->test_fraction)) return 2;
        o->have_test_fraction = 1;
        break;
      case O_MAXIND: if (cli_flag_u64(CMD, "--max-ind-range", optarg, &o->max_ind_range)) return 2; break;
      case O_FREQ: if (cli_flag(CMD, "--frequency-threshold", optarg, &freq)) return 2; break;
      case O_BATCH: if (cli_flag(CMD, "--mini-batch-size", optarg, &batch)) return 2; break;
      case O_OUT: o->out = optarg; break;
      case O_DTHREADS: if (cli_dense_threads(CMD, optarg, &dense_threads)) return 2; break;
      case O_DISA: if (cli_dense_isa(CMD, optarg, &dense_be)) return 2; break;
      case 'h':
      case O_HELP: usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (!o->checkpoint || !!proc == !!raw || optind < argc) {
    fprintf(stderr, "shardrec eval: need --checkpoint (or --model) and exactly one of "
                    "--processed-data-file, --raw-data-file (see --help)\n");
    return 2;
  }
  if (score_split_parse(o->split_name, &o->split)) {
    fprintf(stderr, "shardrec eval: --data-split: '%s' is not test, val, train or all\n",
            o->split_name);
    return 2;
  }
  if (strcmp(dataset, "kaggle") && strcmp(dataset, "terabyte")) {
    fprintf(stderr, "shardrec eval: --data-set: '%s' is not kaggle or terabyte\n", dataset);
    return 2;
  }
  if (cli_out_file(CMD, "--out", o->out)) return 2;
  o->terabyte = !strcmp(dataset, "terabyte") && !o->have_test_fraction;
  o->frequency_threshold = (uint32_t)freq;
  o->batch = (int)batch;
  o->raw = raw != NULL;
  o->data_path = proc ? proc : raw;
  return -1;
}

int cmd_eval(int argc, char **argv) {
  score_opts o = {.split_name = "test", .report = stderr, .who = "shardrec eval"};
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
