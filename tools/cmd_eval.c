/* shardrec eval: score a saved model (--save-model DIR) on Criteo-format data. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "datasets/source.h"
#include "dense/metrics.h"
#include "tools/cli.h"
#include "tools/cmds.h"
#include "tools/train/model_dir.h"
#include "tools/train/trainer.h"

#define CMD "eval"

static void usage(FILE *f) {
  fprintf(f,
"usage: shardrec eval --model DIR (--processed-data-file F | --raw-data-file F) [options]\n"
"  --model DIR               a model saved by 'shardrec train --save-model DIR'\n"
"  --processed-data-file F   binary records ('shardrec convert')\n"
"  --raw-data-file F         Criteo TSV (or .gz)\n"
"  --split test|val|train|all   which part to score (test)\n"
"  --data-set kaggle|terabyte   raw data split as the reference DLRM (kaggle)\n"
"  --test-fraction F         raw data: the last F of the lines are the test set\n"
"  --max-ind-range N, --frequency-threshold N   raw data: as at training\n"
"  --mini-batch-size N       (2048)\n"
"  --out FILE                write one predicted probability per line\n");
}

int cmd_eval(int argc, char **argv) {
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},
      {"processed-data-file", required_argument, 0, 'p'},
      {"raw-data-file", required_argument, 0, 'r'},
      {"split", required_argument, 0, 's'},
      {"data-set", required_argument, 0, 'd'},
      {"test-fraction", required_argument, 0, 'f'},
      {"max-ind-range", required_argument, 0, 'x'},
      {"frequency-threshold", required_argument, 0, 'q'},
      {"mini-batch-size", required_argument, 0, 'b'},
      {"out", required_argument, 0, 'o'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *model = NULL, *proc = NULL, *raw = NULL, *split = "test", *dataset = "kaggle",
             *outp = NULL;
  double frac = 0;
  int have_frac = 0;
  uint64_t maxind = 0;
  long long freq = 0, batch = 2048;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'm': model = optarg; break;
      case 'p': proc = optarg; break;
      case 'r': raw = optarg; break;
      case 's': split = optarg; break;
      case 'd': dataset = optarg; break;
      case 'f':
        if (cli_double(CMD, "--test-fraction", optarg, 0, 1, &frac)) return 2;
        have_frac = 1;
        break;
      case 'x': if (cli_u64(CMD, "--max-ind-range", optarg, &maxind)) return 2; break;
      case 'q': if (cli_int(CMD, "--frequency-threshold", optarg, 0, 1LL << 31, &freq)) return 2; break;
      case 'b': if (cli_int(CMD, "--mini-batch-size", optarg, 1, 1 << 20, &batch)) return 2; break;
      case 'o': outp = optarg; break;
      case 'h': usage(stdout); return 0;
      case ':': cli_bad_option(CMD, ':', argv[optind - 1]); return 2;
      default: cli_bad_option(CMD, '?', argv[optind - 1]); return 2;
    }
  }
  if (!model || !!proc == !!raw || optind < argc) {
    fprintf(stderr, "shardrec eval: need --model and exactly one of --processed-data-file, "
                    "--raw-data-file (see --help)\n");
    return 2;
  }
  ds_split sp;
  if (!strcmp(split, "test")) sp = DS_SPLIT_TEST;
  else if (!strcmp(split, "val")) sp = DS_SPLIT_VAL;
  else if (!strcmp(split, "train")) sp = DS_SPLIT_TRAIN;
  else if (!strcmp(split, "all")) sp = DS_SPLIT_ALL;
  else {
    fprintf(stderr, "shardrec eval: --split: '%s' is not test, val, train or all\n", split);
    return 2;
  }
  char err[1024];
  dense_config cfg = {.max_batch = (int)batch};
  emb_plan *plan = NULL;
  if (model_dir_read_config(model, &cfg, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec eval: %s\n", err);
    return 1;
  }
  int status = 1;
  emb_store *store = NULL;
  trainer *t = NULL;
  ds_source *src = NULL;
  ds_batch b = {0};
  float *pred = NULL, *labels = NULL;
  FILE *out = NULL;
  store = emb_store_create_local(plan, err, sizeof err);
  dense_opt_config oc = dense_opt_defaults(DENSE_OPT_SGD);
  if (store) t = trainer_create(plan, store, &cfg, &oc, plan->seed, err, sizeof err);
  if (!t || model_dir_load_state(model, trainer_model(t), store, err, sizeof err)) {
    fprintf(stderr, "shardrec eval: %s\n", err);
    goto done;
  }
  ds_source_opts so = {.path = proc ? proc : raw, .split = sp, .max_ind_range = maxind,
                       .frequency_threshold = (uint32_t)freq, .report = stderr};
  if (raw) {
    so.scheme = have_frac ? DS_SCHEME_FRACTION
                          : (!strcmp(dataset, "terabyte") ? DS_SCHEME_TERABYTE : DS_SCHEME_KAGGLE);
    so.test_fraction = frac;
  }
  src = ds_source_open(&so, err, sizeof err);
  if (!src) {
    fprintf(stderr, "shardrec eval: %s\n", err);
    goto done;
  }
  uint64_t n_all = ds_source_count(src);
  pred = malloc((n_all ? n_all : 1) * sizeof *pred);
  labels = malloc((n_all ? n_all : 1) * sizeof *labels);
  if (!pred || !labels || ds_batch_init(&b, (int)batch)) {
    fprintf(stderr, "shardrec eval: out of memory\n");
    goto done;
  }
  if (outp && !(out = fopen(outp, "w"))) {
    fprintf(stderr, "shardrec eval: --out %s: cannot open for writing\n", outp);
    goto done;
  }
  size_t n = 0;
  for (;;) {
    int got = ds_source_next(src, &b, (int)batch);
    if (got < 0) {
      fprintf(stderr, "shardrec eval: %s\n", ds_source_errmsg(src));
      goto done;
    }
    if (got == 0) break;
    if (n + (size_t)got > n_all) {
      fprintf(stderr, "shardrec eval: more samples than counted\n");
      goto done;
    }
    if (trainer_predict(t, &b, 0, pred + n)) {
      fprintf(stderr, "shardrec eval: %s\n", trainer_errmsg(t));
      goto done;
    }
    memcpy(labels + n, b.labels, (size_t)got * sizeof *labels);
    if (out)
      for (int i = 0; i < got; i++) fprintf(out, "%.9g\n", pred[n + (size_t)i]);
    n += (size_t)got;
  }
  dense_metrics m;
  if (n == 0) {
    fprintf(stderr, "shardrec eval: the %s split is empty\n", split);
    goto done;
  }
  if (dense_metrics_compute(pred, labels, n, &m)) {
    fprintf(stderr, "shardrec eval: metrics failed\n");
    goto done;
  }
  printf("eval   %s (%s, %zu samples): auc %.6f  logloss %.6f  accuracy %.4f  mean pred %.4f  ctr %.4f\n",
         so.path, split, n, m.auc, m.log_loss, m.accuracy, m.mean_pred, m.ctr);
  status = 0;
done:
  if (out && fclose(out) != 0) status = 1;
  free(pred);
  free(labels);
  ds_batch_free(&b);
  ds_source_destroy(src);
  trainer_destroy(t);
  emb_store_destroy(store);
  emb_plan_free(plan);
  return status;
}
