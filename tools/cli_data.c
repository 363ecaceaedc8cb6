/* The data flags of every command that opens a data file (train, eval,
 * predict, plan, convert): one table of options with their help text, one
 * parser into cli_data. Numbers go through cli.c's ranges, so a flag reads
 * alike in every command. */
#include "tools/cli.h"

#include <string.h>

#include "score/score.h"

/* getopt_long's values of the data flags, above every command's own. */
enum {
  O_PROCESSED = 0x4000, O_RAW, O_SPLIT, O_SET, O_TEST_FRACTION, O_MAX_IND, O_FREQ, O_NO_LABEL,
  O_STRICT
};

/* One data flag: the command bit that takes it, its getopt_long entry, the
 * argument its help line shows (NULL: none) and the help text (lines
 * joined by '\n'). An alias follows its flag with the same bit and value. */
typedef struct {
  unsigned bit;
  struct option opt;
  const char *arg;
  const char *help;
} data_flag;

static const data_flag data_flags[] = {
    {CLI_DATA_PROCESSED, {"processed-data-file", required_argument, 0, O_PROCESSED}, "F",
     "binary records made by 'shardrec convert' (they hold\n"
     "their split and the ids as training saw them)"},
    {CLI_DATA_RAW, {"raw-data-file", required_argument, 0, O_RAW}, "F",
     "Criteo TSV (or .gz; Terabyte: the day_ prefix with\n"
     "--data-set terabyte); ids are mapped by dictionaries built\n"
     "from its train part under the flags below"},
    {CLI_DATA_SPLIT, {"data-split", required_argument, 0, O_SPLIT}, "test|val|train|all",
     "'test' is what train's evaluation scores"},
    {CLI_DATA_SPLIT, {"split", required_argument, 0, O_SPLIT}, "test|val|train|all",
     "alias of --data-split"},
    {CLI_DATA_SET, {"data-set", required_argument, 0, O_SET}, "kaggle|terabyte",
     "raw data: split as the reference DLRM (kaggle)"},
    {CLI_DATA_TEST_FRACTION, {"test-fraction", required_argument, 0, O_TEST_FRACTION}, "F",
     "raw data: the last F of the lines are the test set instead"},
    {CLI_DATA_MAX_IND, {"max-ind-range", required_argument, 0, O_MAX_IND}, "N",
     "raw data: categorical value % N before the dictionary\n"
     "(0: off)"},
    {CLI_DATA_FREQ, {"frequency-threshold", required_argument, 0, O_FREQ}, "N",
     "raw data: values seen fewer than N times in the train part\n"
     "share one id with unseen values"},
    {CLI_DATA_NO_LABEL, {"no-label", no_argument, 0, O_NO_LABEL}, NULL,
     "raw data without the label column (39 fields a line)"},
    {CLI_DATA_STRICT, {"strict", no_argument, 0, O_STRICT}, NULL,
     "raw data: the first malformed line is fatal"},
};
#define N_DATA_FLAGS (sizeof data_flags / sizeof data_flags[0])

/* --raw-data-file's help in a command that scores a model
 * (CLI_DATA_MODEL_XFORM). */
static const char raw_model_help[] =
    "Criteo TSV (or .gz); its ids are mapped with the model's\n"
    "own data transform (the dictionaries it was trained with,\n"
    "recorded in the checkpoint): a value it never kept is the\n"
    "unseen id 0; a checkpoint that records none is refused";

/* The data flags getopt_long takes for d: the ones it names, and with
 * CLI_DATA_MODEL_XFORM the mapping flags it refuses with the reason. */
static unsigned parsed_bits(const cli_data *d) {
  return d->takes | (d->takes & CLI_DATA_MODEL_XFORM ? CLI_DATA_MAX_IND | CLI_DATA_FREQ : 0u);
}

/* A mapping flag given to a command that maps raw rows with the model's
 * transform: refused (exit status 2), saying why. */
static int model_decides(const cli_data *d, const char *flag) {
  fprintf(stderr, "shardrec %s: %s: raw rows are mapped with the model's own data transform "
          "(recorded in the checkpoint), which decides the id range and the frequency "
          "threshold; the flag is train's, convert's and plan's\n", d->cmd, flag);
  return 2;
}

void cli_data_init(cli_data *d, const char *cmd, unsigned takes, const char *split_default) {
  memset(d, 0, sizeof *d);
  d->cmd = cmd;
  d->takes = takes;
  d->split_name = split_default;
  d->split_default = split_default;
}

int cli_data_options(const cli_data *d, const struct option *own, struct option *out, size_t cap) {
  size_t n = 0;
  for (; own[n].name; n++) {
    if (n + 1 >= cap) goto full;
    out[n] = own[n];
  }
  for (size_t k = 0; k < N_DATA_FLAGS; k++) {
    if (!(parsed_bits(d) & data_flags[k].bit)) continue;
    if (n + 1 >= cap) goto full;
    out[n++] = data_flags[k].opt;
  }
  memset(&out[n], 0, sizeof out[n]);
  return 0;
full:
  fprintf(stderr, "shardrec %s: more than %zu options (CLI_OPTIONS_MAX, tools/cli.h)\n", d->cmd,
          cap - 1);
  return -1;
}

/* The table's line of getopt_long's value opt among the flags d takes, or
 * NULL. */
static const data_flag *flag_of(const cli_data *d, int opt) {
  for (size_t k = 0; k < N_DATA_FLAGS; k++)
    if (data_flags[k].opt.val == opt && (parsed_bits(d) & data_flags[k].bit)) return &data_flags[k];
  return NULL;
}

int cli_data_flag(cli_data *d, int opt, const char *arg) {
  if (!flag_of(d, opt)) return -1;
  long long v;
  switch (opt) {
    case O_PROCESSED: d->processed = arg; d->n_files++; return 0;
    case O_RAW: d->raw = arg; d->n_files++; return 0;
    case O_SPLIT: d->split_name = arg; return 0;
    case O_SET:
      if (strcmp(arg, "kaggle") && strcmp(arg, "terabyte")) {
        fprintf(stderr, "shardrec %s: --data-set: '%s' is not kaggle or terabyte\n", d->cmd, arg);
        return 2;
      }
      d->terabyte = !strcmp(arg, "terabyte");
      return 0;
    case O_TEST_FRACTION:
      if (cli_flag_double(d->cmd, "--test-fraction", arg, &d->test_fraction)) return 2;
      d->have_test_fraction = 1;
      return 0;
    case O_MAX_IND:
      if (cli_flag_u64(d->cmd, "--max-ind-range", arg, &d->max_ind_range)) return 2;
      return d->takes & CLI_DATA_MODEL_XFORM ? model_decides(d, "--max-ind-range") : 0;
    case O_FREQ:
      if (cli_flag(d->cmd, "--frequency-threshold", arg, &v)) return 2;
      d->frequency_threshold = (uint32_t)v;
      return d->takes & CLI_DATA_MODEL_XFORM ? model_decides(d, "--frequency-threshold") : 0;
    case O_NO_LABEL: d->no_label = 1; return 0;
    case O_STRICT: d->strict = 1; return 0;
    default: return -1;
  }
}

void cli_data_help(FILE *f, const cli_data *d, int width) {
  for (size_t k = 0; k < N_DATA_FLAGS; k++) {
    const data_flag *g = &data_flags[k];
    if (!(d->takes & g->bit)) continue;
    char head[96];
    const int n = snprintf(head, sizeof head, "--%s%s%s", g->opt.name, g->arg ? " " : "",
                           g->arg ? g->arg : "");
    fprintf(f, "  %-*s%s", width, head, n < width ? "" : "  ");
    if (g->opt.val == O_SPLIT && !strcmp(g->opt.name, "data-split"))
      fprintf(f, "which part to score (%s);\n  %*s", d->split_default, width, "");
    const char *help = g->help;
    if (g->opt.val == O_RAW && (d->takes & CLI_DATA_MODEL_XFORM)) help = raw_model_help;
    for (const char *p = help; *p;) {
      const size_t len = strcspn(p, "\n");
      fprintf(f, "%.*s", (int)len, p);
      p += len;
      if (*p) fprintf(f, "\n  %*s", width, ""), p++;
    }
    fputc('\n', f);
  }
}

int cli_data_score(const cli_data *d, score_opts *o) {
  o->split_name = d->split_name;
  if (score_split_parse(d->split_name, &o->split)) {
    fprintf(stderr, "shardrec %s: --data-split: '%s' is not test, val, train or all\n", d->cmd,
            d->split_name);
    return 2;
  }
  if (d->processed && (d->have_test_fraction || d->terabyte || d->strict || d->no_label)) {
    fprintf(stderr, "shardrec %s: --test-fraction, --data-set, --strict and --no-label apply to "
            "--raw-data-file (a processed file holds its split, ids and labels)\n", d->cmd);
    return 2;
  }
  o->data_path = d->processed ? d->processed : d->raw;
  o->raw = d->raw != NULL;
  o->terabyte = d->terabyte && !d->have_test_fraction;
  o->have_test_fraction = d->have_test_fraction;
  o->test_fraction = d->test_fraction;
  o->no_label = d->no_label;
  o->strict = d->strict;
  return 0;
}

int cli_outs_apart(const char *cmd, const cli_data *d, const cli_file *outs, int n_out) {
  const cli_file in[2] = {{"--raw-data-file", d->raw}, {"--processed-data-file", d->processed}};
  char err[1024];
  if (!cli_outs_clash(outs, n_out, in, 2, err, sizeof err)) return 0;
  fprintf(stderr, "shardrec %s: %s\n", cmd, err);
  return 2;
}
