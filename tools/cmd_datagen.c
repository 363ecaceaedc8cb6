/* shardrec datagen: write a synthetic Criteo-format data set with a known
 * optimum (datasets/datagen.h). Only flag parsing and reporting live here. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "datasets/datagen.h"
#include "tools/cli.h"
#include "tools/cmds.h"

static void datagen_usage(FILE *f) {
  fprintf(f,
          "usage: shardrec datagen --rows N --out FILE.tsv [options]\n\n"
          "Writes N Criteo Kaggle-format lines (label, I1..I13, C1..C26) labelled by a\n"
          "hidden teacher model, FILE.tsv.probs (each line's true click probability)\n"
          "and FILE.tsv.summary.json (positive rate, oracle AUC and log loss).\n\n"
          "options:\n"
          "  --rows N              lines to write (required, >= 1)\n"
          "  --out FILE            output TSV path (required)\n"
          "  --seed S              random seed (default 1); same seed, same bytes\n"
          "  --row-seed R          draw the lines with R: other lines of the same teacher,\n"
          "                        values and hex names as --seed S (new data for a model\n"
          "                        trained on S's; the Zipf tail brings values S's lines\n"
          "                        never had)\n"
          "  --test-fraction F     last fraction of lines reported as \"test\" (default 0.1)\n"
          "  --scale X             scale of the Kaggle cardinalities, (0, 1] (default 0.01;\n"
          "                        each column keeps at least min(real, 16) values)\n"
          "  --zipf S              Zipf exponent of categorical values, (1, 3] (default 1.1)\n"
          "  --uniform             uniform categorical values instead of Zipf\n"
          "  --multi-hot K         each categorical holds 1..K ids joined by ',' (K <= 128)\n"
          "  --multi-hot-sizes L   26 bag sizes joined by ',' (each 1..128), or 'mlperf'\n"
          "                        (" DG_MLPERF_BAG_SIZES "):\n"
          "                        column j holds exactly L[j] ids, none missing\n"
          "  --cross-terms S       teacher cross terms: three-way products of 8 column\n"
          "                        triples' vectors, std S of the logit, [0, 8] (default 0)\n"
          "  --strip-trailing F    fraction of lines whose trailing empty fields are cut\n"
          "                        (default 0)\n"
          "  --drift D             ids that drift: each column's values slide by D times\n"
          "                        its cardinality from the first line to the last (new ids\n"
          "                        come in, old ones stop appearing; the teacher follows\n"
          "                        each id), [0, 64] (default 0)\n"
          "  --gzip                gzip the TSV (zlib level 1); .probs and the summary\n"
          "                        stay plain\n"
          "  -h, --help            this text\n");
}

/* One of datagen's flags (c, its value arg) into cfg. 0, or 2 with the
 * message printed. */
static int datagen_flag(dg_config *cfg, int c, const char *arg, int *have_rows) {
  const char *cmd = "datagen";
  long long v;
  char err[512];
  switch (c) {
  case 'n':
    if (cli_u64(cmd, "--rows", arg, &cfg->rows)) return 2;
    if (cfg->rows < 1) {
      fprintf(stderr, "shardrec datagen: --rows: must be at least 1\n");
      return 2;
    }
    *have_rows = 1;
    break;
  case 's':
    if (cli_u64(cmd, "--seed", arg, &cfg->seed)) return 2;
    break;
  case 'R':
    if (cli_u64(cmd, "--row-seed", arg, &cfg->row_seed)) return 2;
    cfg->row_seed_set = 1;
    break;
  case 't':
    if (cli_flag_double(cmd, "--test-fraction", arg, &cfg->test_fraction)) return 2;
    break;
  case 'x':
    if (cli_double(cmd, "--scale", arg, 1e-9, 1, &cfg->scale)) return 2;
    break;
  case 'z':
    if (cli_double(cmd, "--zipf", arg, 1.000001, 3, &cfg->zipf_s)) return 2;
    break;
  case 'u': cfg->uniform = 1; break;
  case 'g': cfg->gzip = 1; break;
  case 'm':
    if (cli_int(cmd, "--multi-hot", arg, 1, DG_MAX_HOT, &v)) return 2;
    cfg->multi_hot = (int)v;
    break;
  case 'b':
    if (dg_bag_sizes_parse(arg, cfg->bag_sizes, err, sizeof err)) {
      fprintf(stderr, "shardrec datagen: --multi-hot-sizes: %s\n", err);
      return 2;
    }
    break;
  case 'c':
    if (cli_double(cmd, "--cross-terms", arg, 0, DG_CROSS_MAX, &cfg->cross_terms)) return 2;
    break;
  case 'r':
    if (cli_double(cmd, "--strip-trailing", arg, 0, 1, &cfg->strip_trailing)) return 2;
    break;
  case 'd':
    if (cli_double(cmd, "--drift", arg, 0, DG_DRIFT_MAX, &cfg->drift)) return 2;
    break;
  }
  return 0;
}

int cmd_datagen(int argc, char **argv) {
  static const struct option opts[] = {
      {"rows", required_argument, NULL, 'n'},
      {"out", required_argument, NULL, 'o'},
      {"seed", required_argument, NULL, 's'},
      {"row-seed", required_argument, NULL, 'R'},
      {"test-fraction", required_argument, NULL, 't'},
      {"scale", required_argument, NULL, 'x'},
      {"zipf", required_argument, NULL, 'z'},
      {"uniform", no_argument, NULL, 'u'},
      {"multi-hot", required_argument, NULL, 'm'},
      {"multi-hot-sizes", required_argument, NULL, 'b'},
      {"cross-terms", required_argument, NULL, 'c'},
      {"strip-trailing", required_argument, NULL, 'r'},
      {"drift", required_argument, NULL, 'd'},
      {"gzip", no_argument, NULL, 'g'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *cmd = "datagen";
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.progress = cli_isatty_err();
  const char *out = NULL;
  int have_rows = 0;
  char err[512];
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
    case 'n': case 'o': case 's': case 't': case 'x': case 'z': case 'u': case 'g': case 'm':
    case 'b': case 'c': case 'r': case 'R': case 'd':
      if (c == 'o') out = optarg;
      else if (datagen_flag(&cfg, c, optarg, &have_rows)) return 2;
      break;
    case 'h': datagen_usage(stdout); return 0;
    case ':':
      fprintf(stderr, "shardrec datagen: option %s needs a value (see --help)\n",
              argv[optind - 1]);
      return 2;
    default:
      fprintf(stderr, "shardrec datagen: unknown option %s (see --help)\n", argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec datagen: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (cfg.bag_sizes[0] && cfg.multi_hot > 1) {
    fprintf(stderr, "shardrec datagen: --multi-hot and --multi-hot-sizes exclude each other\n");
    return 2;
  }
  if (!have_rows || !out || !*out) {
    fprintf(stderr, "shardrec datagen: %s is required (see --help)\n",
            !have_rows ? "--rows" : "--out");
    return 2;
  }
  /* The TSV and the two files beside it replace files, never a folder. */
  char side[2][SR_PATH_MAX];
  if (sr_path_err(side[0], sizeof side[0], err, sizeof err, "%s%s", out, DG_PROBS_SUFFIX) ||
      sr_path_err(side[1], sizeof side[1], err, sizeof err, "%s%s", out, DG_SUMMARY_SUFFIX)) {
    fprintf(stderr, "shardrec datagen: --out: %s\n", err);
    return 2;
  }
  if (cli_out_file(cmd, "--out", out) || cli_out_file(cmd, "--out", side[0]) ||
      cli_out_file(cmd, "--out", side[1]))
    return 2;

  dg_generator *g = NULL;
  int rc = dg_generator_create(&cfg, &g, err, sizeof err);
  if (rc) {
    fprintf(stderr, "shardrec datagen: %s\n", err[0] ? err : sr_strerror(rc));
    return rc == SR_EINVAL ? 2 : 1;
  }
  dg_summary sm;
  rc = dg_generator_write(g, out, &sm, err, sizeof err);
  dg_generator_destroy(g);
  if (rc) {
    fprintf(stderr, "shardrec datagen: %s\n", err[0] ? err : sr_strerror(rc));
    return 1;
  }
  double secs = sm.seconds > 0 ? sm.seconds : 1e-9;
  fprintf(stderr,
          "datagen: %llu lines, %.1f MB in %.2f s: %.0f lines/s, %.1f MB/s\n"
          "datagen: positive rate %.4f; oracle AUC all %.4f, test %.4f; "
          "oracle log loss all %.4f, test %.4f\n",
          (unsigned long long)sm.all.rows, sm.bytes / 1e6, secs, sm.all.rows / secs,
          sm.bytes / 1e6 / secs, sm.all.rows ? (double)sm.all.positives / sm.all.rows : 0.0,
          sm.all.auc, sm.test.auc, sm.all.logloss, sm.test.logloss);
  return 0;
}
