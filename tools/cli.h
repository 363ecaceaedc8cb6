/* Small helpers shared by the subcommands' flag parsing. Every parser checks
 * the whole string and prints "shardrec CMD: --flag: what was wrong" on
 * failure, returning -1; callers then exit with status 2. A number is a
 * plain decimal one (common/num.h: no space, '+', hexadecimal, inf or nan);
 * one too large for any type is out of the flag's range, not "not an
 * integer". */
#ifndef SHARDREC_TOOLS_CLI_H
#define SHARDREC_TOOLS_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dense/model.h"
#include "embedding/plan.h"

/* A flag's one range, the same in every command that takes it: [lo, hi]
 * in unit (the table is in cli.c). */
typedef struct {
  const char *flag;
  double lo, hi;
  const char *unit;
} cli_range;

/* The range of flag ("--cache-rows"), NULL when it has none in the table. */
const cli_range *cli_range_of(const char *flag);
/* Parse s as flag's integer (cli_flag) or number (cli_flag_double) within
 * its range; 0, or -1 with "shardrec CMD: FLAG: V is out of range [LO, HI]
 * UNIT" (or what else was wrong) printed. A flag without a range is -1. */
int cli_flag(const char *cmd, const char *flag, const char *s, long long *out);
int cli_flag_double(const char *cmd, const char *flag, const char *s, double *out);
/* cli_flag into a uint64_t (ranges from 0). */
int cli_flag_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);

/* The table bounds of a plan made by the command (embedding/plan.h, "keep"):
 * flag is one of CLI_KEEP_HELP's, s its value, into k. 0 or -1 (printed). */
int cli_keep_flag(const char *cmd, const char *flag, const char *s, emb_keep_cfg *k);
#define CLI_KEEP_HELP                                                                           \
  "Bounded tables (every table of a plan made here, the plan's \"keep\"; decided at step\n"       \
  "boundaries from the batches alone; ids without a row read zeros in training and scoring):\n"  \
  "  --admit-after F            a row for an id once F samples held it (0; until then it reads\n" \
  "                             zeros and its gradient is dropped)\n"                             \
  "  --admit-window W           forget a count under F after W steps without the id (1000)\n"     \
  "  --expire-after T           remove a row not looked up for T steps (0: never)\n"              \
  "  --capacity C               at most C rows per table at each step boundary (0: no bound)\n"   \
  "  --evict lru|lfu            above capacity remove the least recently / frequently seen (lru)\n" \
  "  --lfu-half-life H          lfu: an id's samples count half for every H steps since (0: no\n" \
  "                             decay; deterministic: halved at multiples of H steps)\n"

int cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
            long long *out);
int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
               double *out);
/* Entry k (from 1) of flag's list: the n bytes at s (borrowed) as an
 * integer in [lo, hi] into *out; unit (NULL: none) follows the range in
 * the message. 0, or -1 with "shardrec CMD: FLAG: entry K: 'TOK' is not an
 * integer" or "entry K: TOK is out of range [LO, HI] UNIT" printed. */
int cli_entry_u64(const char *cmd, const char *flag, int k, const char *s, size_t n, uint64_t lo,
                  uint64_t hi, const char *unit, uint64_t *out);
/* flag's list s: entries joined by any byte of seps, each as
 * cli_entry_u64 reads it, into out[max], their count into *n. 0, or -1
 * (printed: an entry, an empty list, more than max entries). */
int cli_u64_list(const char *cmd, const char *flag, const char *s, const char *seps, uint64_t lo,
                 uint64_t hi, const char *unit, uint64_t *out, int max, int *n);
/* Parse "13-512-256-64-16" into up to max ints (each >= 1). */
int cli_int_list(const char *cmd, const char *flag, const char *s, char sep, int *out,
                 int max, int *n);
/* Report an unknown option or missing argument in getopt_long's loop. */
void cli_bad_option(const char *cmd, int optopt_char, const char *arg);
/* 1 when stderr is a terminal (live progress lines), 0 otherwise. */
int cli_isatty_err(void);

/* Parse "13-512-256" style widths and the interaction op (train, bench
 * train); writes cfg fields. 0 or -1 with a message printed for cmd. */
int cli_model_arch(const char *cmd, const char *bot, const char *top, const char *op,
                   int itself, int dim, int n_sparse, int max_batch, dense_config *cfg);

/* The same with the op dcn's --dcn-num-layers and --dcn-low-rank-dim (0:
 * not given: CLI_DCN_LAYERS layers of rank cli_dcn_default_rank of the
 * cross input's width); given with another op they are refused. */
#define CLI_DCN_LAYERS 3
int cli_model_arch_dcn(const char *cmd, const char *bot, const char *top, const char *op,
                       int itself, int dcn_layers, int dcn_rank, int dim, int n_sparse,
                       int max_batch, dense_config *cfg);

/* The default rank of the cross layers over a cross input width wide
 * ((n_sparse + 1) x dim): the power of two nearest width / 8, at most
 * CLI_DCN_RANK_MAX: 16 at dim 4 and 26 tables, 64 from dim 16 on (a higher
 * rank trained worse at dim 64 and blew up on multi-hot bags; MLPerf
 * DLRM-DCNv2's 512 at dim 128 is bench train --arch mlperf-dcnv2's, or
 * --dcn-low-rank-dim 512). */
#define CLI_DCN_RANK_MAX 64
int cli_dcn_default_rank(int width);

/* --dense-isa NAME (train, eval, predict, bench train): the CPU backend with
 * the baseline or avx2 kernels into *out. 0, or -1 with "shardrec CMD:
 * --dense-isa: ..." printed (another name; avx2 on a CPU without it). */
int cli_dense_isa(const char *cmd, const char *name, const dense_backend **out);

/* --dense-threads N: 1 ... DENSE_POOL_MAX_THREADS into *out. 0 or -1 (printed). */
int cli_dense_threads(const char *cmd, const char *s, int *out);

/* For the commands that run the dense model without train's job (eval,
 * predict): make isa's kernels (NULL: the best this CPU runs) the default
 * backend and a pool of threads threads (0: every core) the default pool.
 * The pool (the caller ends it with cli_dense_end), or NULL with the reason
 * printed. */
struct dense_pool *cli_dense_begin(const char *cmd, int threads, const dense_backend *isa);
void cli_dense_end(struct dense_pool *p);

/* A single-file output named by flag (or an operand: "OUT") of cmd, before
 * any work: path (NULL: not given, fine) must not be a folder or another
 * non-file (common/outfile.h, sr_out_check). 0, or 2 (the exit status) with
 * "shardrec CMD: FLAG: PATH: is a folder; ..." printed; nothing touched. */
int cli_out_file(const char *cmd, const char *flag, const char *path);

/* A file a command reads or writes, by the flag (or operand) naming it;
 * path NULL: not given. */
typedef struct {
  const char *flag, *path;
} cli_file;

/* Before any work: no output names an input or another output (an
 * output is renamed over its path when done, so one named as an input
 * would replace it; sr_same_file). 0, or 1 with "--out t.tsv is the file
 * --raw-data-file reads (t.tsv): an output never replaces an input; name
 * another" in err. */
int cli_outs_clash(const cli_file *outs, int n_out, const cli_file *ins, int n_in, char *err,
                   size_t errlen);

/* The data flags: what several commands take to open a data file and map
 * its ids (one table and one parser in tools/cli_data.c, one help text).
 * A command names the ones it takes with CLI_DATA_* bits; getopt_long
 * refuses the others as it refuses any unknown option. */
enum {
  CLI_DATA_PROCESSED = 1 << 0, /* --processed-data-file F */
  CLI_DATA_RAW = 1 << 1,       /* --raw-data-file F */
  CLI_DATA_SPLIT = 1 << 2,     /* --data-split NAME, alias --split (eval, predict) */
  CLI_DATA_SET = 1 << 3,       /* --data-set kaggle|terabyte */
  CLI_DATA_TEST_FRACTION = 1 << 4, /* --test-fraction F */
  CLI_DATA_MAX_IND = 1 << 5,   /* --max-ind-range N */
  CLI_DATA_FREQ = 1 << 6,      /* --frequency-threshold N */
  CLI_DATA_NO_LABEL = 1 << 7,  /* --no-label */
  CLI_DATA_STRICT = 1 << 8,    /* --strict */
  CLI_DATA_MODEL_XFORM = 1 << 9, /* eval, predict: raw rows are mapped with the model's
                                    data transform; --max-ind-range and
                                    --frequency-threshold are refused saying so (exit 2),
                                    and --raw-data-file's help says it */
};
/* Both data files, and the flags that map a raw file's ids as train does. */
#define CLI_DATA_FILES (CLI_DATA_PROCESSED | CLI_DATA_RAW)
#define CLI_DATA_MAPPING (CLI_DATA_SET | CLI_DATA_TEST_FRACTION | CLI_DATA_MAX_IND | CLI_DATA_FREQ)

/* The data flags as given. The strings are borrowed from argv. */
typedef struct cli_data {
  const char *cmd;          /* the command, for messages (a static string) */
  unsigned takes;           /* the CLI_DATA_* flags the command accepts */
  const char *processed;    /* --processed-data-file (the last one given) */
  const char *raw;          /* --raw-data-file (the last one given) */
  int n_files;              /* how many of the two were given, repeats counted */
  const char *split_name;   /* --data-split (the command's default until given) */
  const char *split_default; /* the command's default, for its help */
  int terabyte;             /* --data-set terabyte (kaggle: 0) */
  int have_test_fraction;   /* --test-fraction given */
  double test_fraction;
  uint64_t max_ind_range;   /* 0: off */
  uint32_t frequency_threshold;
  int no_label, strict;
} cli_data;

/* cli_outs_clash for a command of cmd reading d's data file and writing
 * outs: 0, or 2 (the exit status) with "shardrec CMD: ..." printed. */
int cli_outs_apart(const char *cmd, const cli_data *d, const cli_file *outs, int n_out);

/* d zeroed, for cmd, taking the flags of takes; split_default (NULL: no
 * --data-split) is --data-split's value until one is given. */
void cli_data_init(cli_data *d, const char *cmd, unsigned takes, const char *split_default);

/* The getopt_long table of a command: own's entries up to its {0} end,
 * then the data flags d takes, then the {0} end, into out[cap]. 0, or -1
 * when cap is too small (printed). */
#define CLI_OPTIONS_MAX 128
int cli_data_options(const cli_data *d, const struct option *own, struct option *out, size_t cap);

/* One option of getopt_long's loop, opt with its argument arg (borrowed),
 * into d: 0, 2 (the exit status) for a bad value with "shardrec CMD:
 * --flag: ..." printed, or -1 when opt is not a data flag d takes. */
int cli_data_flag(cli_data *d, int opt, const char *arg);

/* The help lines of the data flags d takes, in the table's order: two
 * spaces, the flag and its argument padded to width, the text (its further
 * lines indented as far). --data-split's line names d's default. */
void cli_data_help(FILE *f, const cli_data *d, int width);

/* d's data file and flags into scoring's options (eval, predict): the
 * file, its kind and the split by name (a test fraction over --data-set, as
 * train reads it; the ids are the model's transform's). 0, or 2 (the exit status)
 * with "shardrec CMD: --data-split: 'NAME' is not ..." printed; so is a
 * processed file given a raw file's split or parsing flags, which it would
 * not read. */
struct score_opts;
int cli_data_score(const cli_data *d, struct score_opts *o);

#endif
