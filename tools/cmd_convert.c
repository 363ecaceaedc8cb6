/* shardrec convert: Criteo TSV (plain or gzip) -> shardrec binary records.
 * Two passes over the input: the first counts lines, checks every line and
 * builds the dictionaries; the second maps and writes. Memory is bounded by
 * the dictionaries and a batch; the output is written through a mapping of
 * the file, its space reserved first (a full disk is an error naming it,
 * before any record is written), then checksummed and renamed into place. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "datasets/convert.h"
#include "datasets/source.h"
#include "train/checkpoint.h"
#include "tools/cli.h"
#include "tools/cmds.h"

/* The data flags convert takes (its input is the operand IN). */
#define CONVERT_DATA (CLI_DATA_TEST_FRACTION | CLI_DATA_MAX_IND | CLI_DATA_FREQ | \
                      CLI_DATA_NO_LABEL | CLI_DATA_STRICT)

static void convert_usage(FILE *f) {
  cli_data d;
  cli_data_init(&d, "convert", CONVERT_DATA, NULL);
  fprintf(f,
          "usage: shardrec convert [options] IN.tsv[.gz] OUT.bin\n\n"
          "Convert Criteo TSV (Kaggle train.txt, Terabyte day_N; gzip detected by its\n"
          "magic bytes) to shardrec's binary record file, with the split, dictionaries\n"
          "and a checksum stored in it.\n\n"
          "options:\n"
          "  --split none|kaggle|terabyte|fraction  split scheme (default none: all train).\n"
          "                          terabyte: IN is a prefix, reading IN_0 .. IN_23;\n"
          "                          fraction: --test-fraction F (which implies it)\n");
  cli_data_help(f, &d, 24);
  fprintf(f,
          "  --mapping-from PATH     map the ids as PATH did: a checkpoint (a step-N folder or\n"
          "                          a folder of them; the model's data transform) or a file\n"
          "                          convert wrote (its dictionaries): the next day's data\n"
          "                          for a model that goes on training. A value PATH did not\n"
          "                          keep gets the id of values not kept (0)\n"
          "  --extend-dictionaries   with --mapping-from: values new in IN's train part (seen\n"
          "                          --frequency-threshold times, as PATH counted) get new ids\n"
          "                          after PATH's; PATH's values keep theirs. Training resumed\n"
          "                          from the checkpoint on OUT grows the tables to match\n"
          "  --hash                  64-bit hashed ids, no dictionary (unbounded tables)\n"
          "  --modulo                ids = value %% --max-ind-range, no dictionary\n"
          "  --shuffle               shuffle the train part (deterministic; one-hot only)\n"
          "  --seed S                shuffle seed (default 1)\n"
          "  --help                  this text\n");
}

/* The data transform of path: a checkpoint's (a step-N folder or a folder
 * of them), or the dictionaries and id mode of a file convert wrote. 0, or
 * SR_E* with "PATH: why" in err. */
static int transform_from(const char *path, ds_transform **out, char fp[SR_SHA256_HEX], char *err,
                          size_t errlen) {
  char why[1024], dir[SR_PATH_MAX];
  *out = NULL;
  if (sr_is_dir(path)) {
    train_ckpt_info ci;
    int rc = train_ckpt_resolve(path, dir, sizeof dir, why, sizeof why);
    if (!rc) rc = train_ckpt_open(dir, &ci, why, sizeof why);
    if (!rc) {
      rc = train_ckpt_transform(&ci, out, why, sizeof why);
      if (!rc) memcpy(fp, ci.transform_fp, SR_SHA256_HEX);
      train_ckpt_info_free(&ci);
    }
    if (rc) sr_fmt(err, errlen, "%s", why);
    return rc;
  }
  ds_source_opts so = {.path = path, .format = DS_FORMAT_PROCESSED};
  ds_source *s = ds_source_open(&so, why, sizeof why);
  if (!s) {
    sr_fmt(err, errlen, "%s", why);
    return SR_EFORMAT;
  }
  const ds_transform *xf = ds_source_transform(s);
  int rc = SR_EINVAL;
  sr_fmt(err, errlen, "%s: holds ids mapped outside shardrec (no mapping to take)", path);
  if (xf) {
    /* The file's transform, as its own copy (the source goes). */
    rc = (*out = ds_transform_clone(xf)) ? ds_transform_fingerprint(*out, fp) : SR_ENOMEM;
    if (rc) sr_fmt(err, errlen, "%s: out of memory", path);
  }
  ds_source_destroy(s);
  return rc;
}

/* d's data flags into o, and the flags checked together (2 with the
 * message printed, or 0). */
static int check_flags(const cli_data *d, ds_source_opts *o, int have_split,
                       const char *mapping_from) {
  o->test_fraction = d->test_fraction;
  o->max_ind_range = d->max_ind_range;
  o->frequency_threshold = d->frequency_threshold;
  o->no_label = d->no_label;
  o->strict = d->strict;
  if (d->have_test_fraction) {
    if (have_split && o->scheme != DS_SCHEME_FRACTION) {
      fprintf(stderr, "shardrec convert: --test-fraction goes with --split fraction only\n");
      return 2;
    }
    o->scheme = DS_SCHEME_FRACTION;
  } else if (o->scheme == DS_SCHEME_FRACTION) {
    fprintf(stderr, "shardrec convert: --split fraction needs --test-fraction F\n");
    return 2;
  }
  if (o->id_mode == DS_IDS_MODULO && !o->max_ind_range) {
    fprintf(stderr, "shardrec convert: --modulo needs --max-ind-range N (N > 0)\n");
    return 2;
  }
  if (o->id_mode == DS_IDS_MODULO && o->frequency_threshold) {
    fprintf(stderr, "shardrec convert: --modulo takes no --frequency-threshold (it keeps no "
            "dictionary to count values in)\n");
    return 2;
  }
  if (o->id_mode == DS_IDS_HASH && (o->max_ind_range || o->frequency_threshold)) {
    fprintf(stderr, "shardrec convert: --hash takes neither --max-ind-range nor --frequency-threshold\n");
    return 2;
  }
  if (mapping_from && (o->id_mode || d->max_ind_range || d->frequency_threshold)) {
    fprintf(stderr, "shardrec convert: --mapping-from takes the id mode, --max-ind-range and "
            "--frequency-threshold from %s: give none of them\n", mapping_from);
    return 2;
  }
  if (o->extend && !mapping_from) {
    fprintf(stderr, "shardrec convert: --extend-dictionaries extends the dictionaries of "
            "--mapping-from PATH\n");
    return 2;
  }
  return 0;
}

/* --mapping-from PATH's transform into *given (owned by the caller) and
 * o->transform, said on stdout. 0, or the exit status with the message
 * printed. */
static int load_mapping(const char *from, ds_source_opts *o, ds_transform **given) {
  char err[1024], fp[SR_SHA256_HEX], what[256];
  if (transform_from(from, given, fp, err, sizeof err)) {
    fprintf(stderr, "shardrec convert: --mapping-from %s\n", err);
    return 1;
  }
  if (o->extend && (*given)->id_mode != DS_IDS_DICT) {
    fprintf(stderr, "shardrec convert: --extend-dictionaries: %s maps ids by %s, not by "
            "dictionaries\n", from, ds_id_mode_name((*given)->id_mode));
    ds_transform_free(*given);
    *given = NULL;
    return 2;
  }
  ds_transform_describe(*given, what, sizeof what);
  printf("mapping from %s: %.12s, %s%s\n", from, fp, what,
         o->extend ? "; extended with IN's new values" : "");
  o->transform = *given;
  return 0;
}

int cmd_convert(int argc, char **argv) {
  static const struct option longs[] = {
      {"split", required_argument, 0, 's'},  {"hash", no_argument, 0, 'H'},
      {"modulo", no_argument, 0, 'M'},       {"shuffle", no_argument, 0, 'x'},
      {"seed", required_argument, 0, 'r'},   {"help", no_argument, 0, 'h'},
      {"mapping-from", required_argument, 0, 'f'}, {"extend-dictionaries", no_argument, 0, 'e'},
      {0, 0, 0, 0}}; /* and the data flags of CONVERT_DATA (tools/cli_data.c) */
  cli_data d;
  cli_data_init(&d, "convert", CONVERT_DATA, NULL);
  struct option opts[CLI_OPTIONS_MAX];
  if (cli_data_options(&d, longs, opts, CLI_OPTIONS_MAX)) return 1;
  ds_source_opts o = {0};
  o.report = stderr;
  o.exact_count = 1;
  int shuffle = 0, have_split = 0;
  const char *mapping_from = NULL;
  uint64_t seed = 1;
  opterr = 0;
  optind = 1;
  int c, rc;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 's':
        have_split = 1;
        if (!strcmp(optarg, "none")) o.scheme = DS_SCHEME_NONE;
        else if (!strcmp(optarg, "kaggle")) o.scheme = DS_SCHEME_KAGGLE;
        else if (!strcmp(optarg, "terabyte")) o.scheme = DS_SCHEME_TERABYTE;
        else if (!strcmp(optarg, "fraction")) o.scheme = DS_SCHEME_FRACTION;
        else {
          fprintf(stderr, "shardrec convert: --split: '%s' is not none, kaggle, terabyte or fraction\n", optarg);
          return 2;
        }
        break;
      case 'H': o.id_mode = DS_IDS_HASH; break;
      case 'M': o.id_mode = DS_IDS_MODULO; break;
      case 'x': shuffle = 1; break;
      case 'f': mapping_from = optarg; break;
      case 'e': o.extend = 1; break;
      case 'r':
        if (cli_u64("convert", "--seed", optarg, &seed)) return 2;
        break;
      case 'h':
        convert_usage(stdout);
        return 0;
      default: /* a data flag, or ':' / '?' from getopt_long */
        if ((rc = cli_data_flag(&d, c, optarg)) < 0) cli_bad_option("convert", c, argv[optind - 1]);
        if (rc) return 2;
    }
  }
  if ((rc = check_flags(&d, &o, have_split, mapping_from))) return rc;
  if (argc - optind != 2) {
    fprintf(stderr, "shardrec convert: expected IN and OUT (see 'shardrec convert --help')\n");
    return 2;
  }
  o.path = argv[optind];
  o.format = DS_FORMAT_TSV;
  o.progress = cli_isatty_err() ? "convert" : NULL; /* the passes' progress line */
  const char *out = argv[optind + 1];
  if (cli_out_file("convert", "OUT", out)) return 2;
  char err[1024], fp[SR_SHA256_HEX];
  const cli_file out_file = {"OUT", out}, ins[2] = {{"IN", o.path}, {"--mapping-from", mapping_from}};
  if (cli_outs_clash(&out_file, 1, ins, 2, err, sizeof err)) {
    fprintf(stderr, "shardrec convert: %s\n", err);
    return 2;
  }

  double t0 = sr_now();
  ds_transform *given = NULL;
  if (mapping_from && (rc = load_mapping(mapping_from, &o, &given))) return rc;
  ds_source *s = ds_source_open(&o, err, sizeof err);
  if (!s) {
    fprintf(stderr, "shardrec convert: %s\n", err);
    ds_transform_free(given);
    return 1;
  }
  ds_source_stats st;
  ds_bin_info info;
  if (ds_convert_to_bin(s, &o, out, shuffle, seed, &info, &st, err, sizeof err)) {
    fprintf(stderr, "shardrec convert: %s\n", err);
    ds_source_destroy(s);
    ds_transform_free(given);
    return 1;
  }
  double secs = sr_now() - t0;
  printf("converted %s -> %s in %.2f s\n", o.path, out, secs);
  printf("  lines %llu, samples %llu (train %llu, test %llu, val %llu), malformed skipped %llu\n",
         (unsigned long long)st.scan_lines, (unsigned long long)info.n_samples,
         (unsigned long long)info.n_train, (unsigned long long)info.n_test,
         (unsigned long long)info.n_val, (unsigned long long)st.scan_malformed);
  printf("  layout %s, %s ids%s%s\n", info.flags & DS_BIN_MULTI ? "multi-hot" : "one-hot",
         info.id_mode == DS_IDS_HASH ? "hashed 64-bit" : info.id_mode == DS_IDS_MODULO ? "modulo" : "dictionary",
         shuffle ? ", train part shuffled" : "",
         info.flags & DS_BIN_NO_LABEL ? ", no labels (scored by predict only)" : "");
  printf("  table sizes:");
  for (int k = 0; k < DS_NUM_SPARSE; k++) printf(" %llu", (unsigned long long)info.table_sizes[k]);
  printf("\n");
  if (!ds_transform_fingerprint(ds_source_transform(s), fp))
    printf("  mapping %.12s\n", fp);
  ds_source_destroy(s);
  ds_transform_free(given);
  return 0;
}
