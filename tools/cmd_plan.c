/* shardrec plan: write a sharding plan (JSON) from table sizes and model flags.
 *
 * The table sizes come from --table-sizes (or the reference DLRM's
 * --arch-embedding-size), or from the data: a converted file's stored counts
 * (--processed-data-file) or the dictionaries built over a raw file's
 * training part (--raw-data-file), as `shardrec train` sizes them.
 * --grow-from CKPT writes the plan a --resume of CKPT on a converted file
 * whose dictionaries extend the checkpoint's runs under (the checkpoint's
 * plan, its bounded tables grown to the file's sizes), for the shard
 * servers to be started with before that resume. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "datasets/source.h"
#include "train/checkpoint.h"
#include "embedding/plan.h"
#include "tools/cli.h"
#include "tools/cmds.h"

#define CMD "plan"

/* The data flags plan takes (a data file to size the tables from). */
#define PLAN_DATA (CLI_DATA_FILES | CLI_DATA_MAPPING)

static void plan_usage(FILE *f) {
  cli_data d;
  cli_data_init(&d, CMD, PLAN_DATA, NULL);
  fprintf(f,
          "usage: shardrec plan --out PLAN.json (--table-sizes N1,N2,... | --processed-data-file F\n"
          "                     | --raw-data-file F) [options]\n"
          "       shardrec plan --out PLAN.json --grow-from CKPT --processed-data-file F\n"
          "\n"
          "Write a sharding plan: the embedding tables of the model and where they live.\n"
          "\n"
          "  --out PATH                       plan file to write (required)\n"
          "  --table-sizes N1,N2,...          rows of each table (',' or '-' separated;\n"
          "                                   0 or 'unbounded' for hashed 64-bit ids)\n"
          "  --arch-embedding-size N1-N2-...  same, the reference DLRM's flag\n"
          "  sizes from a data file, as train sizes the tables: a converted file's stored\n"
          "  counts, or the dictionaries of a Criteo TSV's training part:\n");
  cli_data_help(f, &d, 33);
  fprintf(f, CLI_KEEP_HELP);
  fprintf(f,
          "  --arch-sparse-feature-size D     embedding dim (default 16)\n"
          "  --seed S                         model seed, uint64 (default 123, as train)\n"
          "  --num-shards K                   number of shards (default 1; --shards is an alias)\n"
          "  --sparse-optimizer NAME          sgd | adagrad | rowwise_adagrad (default sgd)\n"
          "  --eps X                          optimizer eps (default 1e-10 adagrad, 1e-8 rowwise)\n"
          "  --initial-accumulator-value X    adagrad accumulators start here (default 0)\n"
          "  --init-range A                   init uniform in [-A, A) (default sqrt(1/rows))\n"
          "  --pooling sum|mean               bag pooling (default sum)\n"
          "  --arch-embedding-precision P     fp32 | fp16 | bf16: the bits every table's weights\n"
          "                                   are kept in (default fp32)\n"
          "  --row-wise                       spread every table's rows over all shards\n"
          "                                   (default: whole tables, balanced by bytes)\n"
          "  --grow-from CKPT                 the plan of train --resume CKPT --processed-data-file F\n"
          "                                   where F was converted with --mapping-from CKPT\n"
          "                                   --extend-dictionaries: CKPT's plan (seed, dim,\n"
          "                                   optimizer, init ranges, placement kept) with each\n"
          "                                   table's rows raised to F's; start the shard servers\n"
          "                                   with it (no model flags: they are CKPT's)\n"
          "  -h, --help                       this text\n");
}

/* Parse "1460,583,..." or "1460-583-..." (an entry "unbounded" or 0 ...
 * 2^53) into a malloc'd array. 0, or -1 (printed). */
static int parse_sizes(const char *flag, const char *s, uint64_t **out, int *n) {
  int cap = 1;
  for (const char *p = s; *p; p++) cap += (*p == ',' || *p == '-');
  if (cap > EMB_MAX_TABLES) {
    fprintf(stderr, "shardrec %s: %s: more than %d tables\n", CMD, flag, EMB_MAX_TABLES);
    return -1;
  }
  uint64_t *v = malloc((size_t)cap * sizeof *v);
  if (!v) return -1;
  int k = 0;
  for (const char *p = s;; p++) {
    const size_t len = strcspn(p, ",-");
    if (len == 9 && !strncmp(p, "unbounded", 9)) {
      v[k++] = EMB_ROWS_UNBOUNDED;
    } else if (cli_entry_u64(CMD, flag, k + 1, p, len, 0, EMB_ROWS_MAX, "rows", &v[k])) {
      free(v);
      return -1;
    } else {
      k++;
    }
    p += len;
    if (!*p) break;
  }
  *out = v;
  *n = k;
  return 0;
}

/* The flags: the plan's parameters and where the table sizes come from. */
typedef struct plan_flags {
  const char *out, *sizes, *sizes_flag;
  const char *grow_from; /* --grow-from CKPT */
  const char *model_flag; /* the name of the last model flag given (refused with --grow-from) */
  emb_plan_params pp;
  cli_data data;     /* sizes from this data file */
  int have_eps, have_acc;
} plan_flags;

enum { O_OUT = 256, O_SIZES, O_ARCH_SIZES, O_DIM, O_SEED, O_SHARDS, O_OPT, O_EPS, O_ACC,
       O_INIT, O_POOL, O_PREC, O_ROWWISE, O_GROW, O_ADMIT, O_AWIN, O_EXPIRE, O_CAP, O_EVICT, O_HALF };

static const struct option plan_opts[] = {
    {"out", required_argument, NULL, O_OUT},
    {"table-sizes", required_argument, NULL, O_SIZES},
    {"arch-embedding-size", required_argument, NULL, O_ARCH_SIZES},
    {"arch-sparse-feature-size", required_argument, NULL, O_DIM},
    {"seed", required_argument, NULL, O_SEED},
    {"num-shards", required_argument, NULL, O_SHARDS},
    {"shards", required_argument, NULL, O_SHARDS}, /* alias */
    {"sparse-optimizer", required_argument, NULL, O_OPT},
    {"eps", required_argument, NULL, O_EPS},
    {"initial-accumulator-value", required_argument, NULL, O_ACC},
    {"init-range", required_argument, NULL, O_INIT},
    {"pooling", required_argument, NULL, O_POOL},
    {"arch-embedding-precision", required_argument, NULL, O_PREC},
    {"row-wise", no_argument, NULL, O_ROWWISE},
    {"grow-from", required_argument, NULL, O_GROW},
    {"admit-after", required_argument, NULL, O_ADMIT},
    {"admit-window", required_argument, NULL, O_AWIN},
    {"expire-after", required_argument, NULL, O_EXPIRE},
    {"capacity", required_argument, NULL, O_CAP},
    {"evict", required_argument, NULL, O_EVICT},
    {"lfu-half-life", required_argument, NULL, O_HALF},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}, /* and the data flags of PLAN_DATA (tools/cli_data.c) */
};

/* Parse argv into *f (defaults as train's). Returns -1 to go on, or the
 * exit status (0 for --help, 2 for bad usage, the message printed). */
static int parse_flags(int argc, char **argv, plan_flags *f) {
  emb_plan_params *pp = &f->pp;
  cli_data_init(&f->data, CMD, PLAN_DATA, NULL);
  struct option opts[CLI_OPTIONS_MAX];
  if (cli_data_options(&f->data, plan_opts, opts, CLI_OPTIONS_MAX)) return 1;
  long long v;
  double d;
  optind = 1;
  opterr = 0;
  int c, rc;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    for (int k = 0; c >= O_DIM && c <= O_ROWWISE && plan_opts[k].name; k++)
      if (plan_opts[k].val == c) f->model_flag = plan_opts[k].name;
    switch (c) {
      case 'h': plan_usage(stdout); return 0;
      case O_OUT: f->out = optarg; break;
      case O_GROW: f->grow_from = optarg; break;
      case O_SIZES:
      case O_ARCH_SIZES:
        if (f->sizes) {
          fprintf(stderr, "shardrec %s: give the table sizes once (--table-sizes or --arch-embedding-size)\n", CMD);
          return 2;
        }
        f->sizes = optarg;
        f->sizes_flag = c == O_SIZES ? "--table-sizes" : "--arch-embedding-size";
        break;
      case O_DIM:
        if (cli_flag(CMD, "--arch-sparse-feature-size", optarg, &v)) return 2;
        pp->dim = (int)v;
        break;
      case O_SEED:
        if (cli_u64(CMD, "--seed", optarg, &pp->seed)) return 2;
        break;
      case O_SHARDS:
        if (cli_flag(CMD, "--num-shards", optarg, &v)) return 2;
        pp->n_shards = (int)v;
        break;
      case O_OPT:
        if (emb_optim_parse(optarg, &pp->optim.kind)) {
          fprintf(stderr, "shardrec %s: --sparse-optimizer: '%s' is not sgd, adagrad or rowwise_adagrad\n", CMD, optarg);
          return 2;
        }
        break;
      case O_EPS:
        if (cli_double(CMD, "--eps", optarg, 0, 1, &d)) return 2;
        pp->optim.eps = d;
        f->have_eps = 1;
        break;
      case O_ACC:
        if (cli_double(CMD, "--initial-accumulator-value", optarg, 0, 1e30, &d)) return 2;
        pp->optim.init_acc = d;
        f->have_acc = 1;
        break;
      case O_INIT:
        if (cli_double(CMD, "--init-range", optarg, 1e-30, 1e30, &d)) return 2;
        pp->init_range = d;
        break;
      case O_POOL:
        if (emb_pooling_parse(optarg, &pp->pooling)) {
          fprintf(stderr, "shardrec %s: --pooling: '%s' is not sum or mean\n", CMD, optarg);
          return 2;
        }
        break;
      case O_PREC:
        if (emb_precision_parse(optarg, &pp->precision)) {
          fprintf(stderr, "shardrec %s: --arch-embedding-precision: '%s' is not fp32, fp16 or bf16\n",
                  CMD, optarg);
          return 2;
        }
        break;
      case O_ROWWISE: pp->row_wise = 1; break;
      case O_ADMIT: case O_AWIN: case O_EXPIRE: case O_CAP: case O_EVICT: case O_HALF: {
        static const char *const names[] = {"--admit-after", "--admit-window", "--expire-after",
                                            "--capacity", "--evict", "--lfu-half-life"};
        if (cli_keep_flag(CMD, names[c - O_ADMIT], optarg, &pp->keep)) return 2;
        break;
      }
      default: /* a data flag, or ':' / '?' from getopt_long */
        if ((rc = cli_data_flag(&f->data, c, optarg)) < 0) cli_bad_option(CMD, c, argv[optind - 1]);
        if (rc) return 2;
        if (f->data.n_files > 1) {
          fprintf(stderr, "shardrec %s: give one data file\n", CMD);
          return 2;
        }
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardrec %s: unexpected argument '%s'\n", CMD, argv[optind]);
    return 2;
  }
  return -1;
}

/* The flags that do not go together; 0, or 2 with the message printed. */
static int check_flags(const plan_flags *f) {
  if (!f->out) {
    fprintf(stderr, "shardrec %s: --out is required (see shardrec plan --help)\n", CMD);
    return 2;
  }
  const cli_file out = {"--out", f->out};
  if (cli_out_file(CMD, "--out", f->out) || cli_outs_apart(CMD, &f->data, &out, 1)) return 2;
  if (f->pp.keep.half_life && f->pp.keep.evict != EMB_EVICT_LFU) {
    fprintf(stderr, "shardrec %s: --lfu-half-life applies to --evict lfu\n", CMD);
    return 2;
  }
  if (f->grow_from) {
    if (!f->data.processed) {
      fprintf(stderr, "shardrec %s: --grow-from needs --processed-data-file F (the day's file, "
              "converted with --mapping-from CKPT --extend-dictionaries)\n", CMD);
      return 2;
    }
    if (f->sizes || f->model_flag) {
      fprintf(stderr, "shardrec %s: --grow-from takes no %s%s: the model is the checkpoint's\n",
              CMD, f->model_flag ? "--" : "", f->model_flag ? f->model_flag : f->sizes_flag);
      return 2;
    }
    return 0;
  }
  if (!f->sizes == !f->data.n_files) {
    fprintf(stderr, "shardrec %s: give the table sizes (--table-sizes or --arch-embedding-size) "
                    "or a data file to take them from, not both\n", CMD);
    return 2;
  }
  if (f->pp.optim.kind == EMB_OPT_SGD && (f->have_eps || f->have_acc)) {
    fprintf(stderr, "shardrec %s: --eps and --initial-accumulator-value apply to adagrad and rowwise_adagrad only\n", CMD);
    return 2;
  }
  return 0;
}

/* The rows of each table (*rows malloc'd, *n of them): from the flag, or
 * from the data file as train sizes them. Returns -1 to go on, or the exit
 * status (the message printed). */
static int table_rows(plan_flags *f, uint64_t **rows, int *n) {
  if (f->sizes) return parse_sizes(f->sizes_flag, f->sizes, rows, n) ? 2 : -1;
  char err[512];
  const cli_data *d = &f->data;
  ds_source_opts so = {.path = d->raw ? d->raw : d->processed, .split = DS_SPLIT_TRAIN,
                       .test_fraction = d->test_fraction, .max_ind_range = d->max_ind_range,
                       .frequency_threshold = d->frequency_threshold, .report = stderr};
  if (d->raw) /* the split as train reads it; a converted file holds its own */
    so.scheme = d->have_test_fraction ? DS_SCHEME_FRACTION
                : d->terabyte         ? DS_SCHEME_TERABYTE
                                      : DS_SCHEME_KAGGLE,
    so.format = DS_FORMAT_RAW;
  else
    so.scheme = DS_SCHEME_NONE, so.format = DS_FORMAT_PROCESSED;
  ds_source *src = ds_source_open(&so, err, sizeof err);
  uint64_t *r = malloc(DS_NUM_SPARSE * sizeof *r);
  if (!src || !r || ds_source_table_sizes(src, r)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, src ? ds_source_errmsg(src) : err);
    ds_source_destroy(src);
    free(r);
    return 1;
  }
  ds_source_destroy(src);
  *rows = r;
  *n = DS_NUM_SPARSE;
  return -1;
}

/* Build the plan (emb_plan_create), write it to f->out and print what it
 * holds. The exit status. */
static int write_plan(const plan_flags *f) {
  const emb_plan_params *pp = &f->pp;
  char err[512];
  emb_plan *plan = NULL;
  if (emb_plan_create(pp, &plan, err, sizeof err)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, err);
    return 2;
  }
  if (emb_plan_save(plan, f->out, err, sizeof err)) {
    fprintf(stderr, "shardrec %s: %s\n", CMD, err);
    emb_plan_free(plan);
    return 1;
  }
  char mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  if (emb_plan_model_fingerprint(plan, mfp) || emb_plan_fingerprint(plan, pfp)) {
    fprintf(stderr, "shardrec %s: cannot compute fingerprints\n", CMD);
    emb_plan_free(plan);
    return 1;
  }
  printf("wrote %s: %d tables, dim %d, %d shards (%s), optimizer %s, pooling %s%s%s\n", f->out,
         plan->n_tables, pp->dim, plan->n_shards, pp->row_wise ? "row-wise" : "table-wise",
         emb_optim_name(pp->optim.kind), emb_pooling_name(pp->pooling),
         pp->precision ? ", precision " : "", pp->precision ? emb_precision_name(pp->precision) : "");
  printf("model fingerprint %s\nplan fingerprint  %s\n", mfp, pfp);
  emb_plan_free(plan);
  return 0;
}

/* --grow-from: the checkpoint's plan grown to the data file's tables
 * (train_ckpt_grown_plan), written to f->out. The exit status. */
static int write_grown(const plan_flags *f) {
  char err[1024], mfp[EMB_FP_HEX], pfp[EMB_FP_HEX];
  emb_plan *plan = NULL;
  int rc = train_ckpt_grown_plan(f->grow_from, f->data.processed, &plan, err, sizeof err);
  if (!rc) rc = emb_plan_save(plan, f->out, err, sizeof err);
  if (rc) {
    fprintf(stderr, "shardrec %s: --grow-from %s\n", CMD, err);
    emb_plan_free(plan);
    return 1;
  }
  uint64_t total = 0;
  for (int i = 0; i < plan->n_tables; i++) total += plan->tables[i].rows;
  emb_plan_model_fingerprint(plan, mfp);
  emb_plan_fingerprint(plan, pfp);
  printf("wrote %s: %s's plan grown to %s: %d tables, %llu rows, %d shards\n", f->out,
         f->grow_from, f->data.processed, plan->n_tables, (unsigned long long)total,
         plan->n_shards);
  printf("model fingerprint %s\nplan fingerprint  %s\n", mfp, pfp);
  emb_plan_free(plan);
  return 0;
}

int cmd_plan(int argc, char **argv) {
  plan_flags f;
  memset(&f, 0, sizeof f);
  f.pp.dim = 16;
  f.pp.n_shards = 1;
  f.pp.seed = 123;
  f.pp.optim.kind = EMB_OPT_SGD;
  f.pp.optim.eps = -1;
  f.pp.pooling = EMB_POOL_SUM;
  int st = parse_flags(argc, argv, &f);
  if (st >= 0) return st;
  if ((st = check_flags(&f))) return st;
  if (f.grow_from) return write_grown(&f);
  uint64_t *rows = NULL;
  int n = 0;
  if ((st = table_rows(&f, &rows, &n)) >= 0) return st;
  f.pp.n_tables = n;
  f.pp.rows = rows;
  st = write_plan(&f);
  free(rows);
  return st;
}
