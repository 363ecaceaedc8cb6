/* Synthetic Criteo-format data with a known optimum.
 *
 * A generator writes Kaggle-format lines `label \t I1..I13 \t C1..C26` whose
 * marginal statistics follow the real set (column cardinalities scaled by
 * `scale`, Zipf-skewed categorical values, per-column missing rates, heavy
 * tailed integer counts, occasional negative I2) and whose labels come from a
 * hidden "teacher" model, so every line's true click probability is known:
 *
 *   logit = bias + dense + cat (+ cross)
 *   dense = sum_i w_i * (log1p(max(0, I_i)) - m_i)   (or a per-column missing bias)
 *   cat   = sum_j b_j(v_j)  +  sum_{j<k} <e_j(v_j), e_k(v_k)>   (FM, rank 4)
 *   label ~ Bernoulli(sigmoid(logit))
 *
 * A multi-hot field (a bag) enters the teacher through the mean of its
 * values' b and e. With cross terms (cross_terms S > 0) the logit gains
 *
 *   cross = c * sum_{(a,b,c) in DG_CROSS_TRIPLES} sum_d e_a[d] * e_b[d] * e_c[d]
 *
 * three-way element-wise products of the FM vectors of 8 fixed column
 * triples, c calibrated by the pilot so that the part's standard deviation
 * is S: a degree-3 interaction, which a DCN-v2 cross network of two or more
 * layers (x_{l+1} = x_0 * (W x_l + b) + x_l) can represent and a dot
 * interaction (pairwise inner products only) cannot.
 *
 * b_j(v) and e_j(v) are functions of Philox(seed, column, value) scaled by a
 * shrink factor 1/sqrt(1 + rank/32): most of the signal sits on the Zipf head,
 * where a model can learn it in one epoch. Nothing per value is stored except a
 * bounded cache of the first ranks. `bias` is calibrated at create time by a
 * pilot pass so that the positive rate is about 0.25.
 *
 * Everything is a pure function of (seed, row index): rows can be generated in
 * any order, and the same seed gives the same bytes. */
#ifndef SHARDREC_DATASETS_DATAGEN_H
#define SHARDREC_DATASETS_DATAGEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datasets/batch.h"

#define DG_NUM_DENSE 13
#define DG_NUM_CAT 26
#define DG_MAX_HOT DS_MAX_BAG  /* largest bag: --multi-hot K, --multi-hot-sizes */
#define DG_LINE_MAX 32768      /* a formatted line never exceeds this (26 bags of 128
                                  ids of 9 bytes, 13 integers of 21) */
#define DG_MISSING_RANK UINT32_MAX
#define DG_CROSS_MAX 8.0       /* largest cross_terms */
#define DG_DRIFT_MAX 64.0      /* largest drift */
/* MLPerf DLRM-DCNv2's multi-hot Criteo bag sizes, C1..C26. */
#define DG_MLPERF_BAG_SIZES \
  "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"

typedef struct dg_config {
  uint64_t rows;          /* lines to write (dg_generator_write); >= 1 */
  uint64_t seed;          /* the teacher, the values and their hex names, and the lines */
  int row_seed_set;       /* 1: the lines (rows and labels) are drawn with row_seed
                             instead: other lines of the same teacher and values
                             (another day of the same click model) */
  uint64_t row_seed;
  double scale;           /* cardinality scale; 0 = default 0.01 */
  double test_fraction;   /* last fraction of lines reported as "test"; default 0.1 */
  double zipf_s;          /* Zipf exponent; 0 = default 1.1 */
  int uniform;            /* 1: ids uniform over each column instead of Zipf */
  int multi_hot;          /* each categorical holds 1..multi_hot ids; 0 or 1 = one-hot */
  int bag_sizes[DG_NUM_CAT]; /* all 0: off (multi_hot decides). Else column j's
                             bag holds exactly bag_sizes[j] ids (1..DG_MAX_HOT)
                             and no field is missing, as MLPerf's synthetic
                             multi-hot set; not with multi_hot > 1 */
  double cross_terms;     /* S: std of the teacher's three-way cross part of the
                             logit; 0 = none (the bytes of before) */
  double drift;           /* D: each column's values slide over the rows, by D times
                             its cardinality from the first row to the last: the
                             value at Zipf rank r of row i is the id r + floor(card
                             * D * i / rows), so new ids come in at every rank and
                             old ones stop appearing; the teacher's parameters
                             follow the id (drawn from it, shrunk by its rank), the
                             oracle's figures are the teacher's as ever. 0 = none
                             (the bytes of before) */
  double strip_trailing;  /* fraction of lines whose trailing empty fields are cut */
  int gzip;               /* 1: the TSV is gzip-compressed (level 1); .probs and
                             the summary stay plain */
  uint64_t auc_exact_max; /* rows kept for the exact AUC; beyond it a 2^20-bin
                             histogram (approximate). 0 = default 2^25 */
  int progress;           /* 1: a progress line on stderr while writing (give it only
                             when stderr is a terminal; common/progress.h) */
} dg_config;

/* Defaults for every field (rows 1000, seed 1, test_fraction 0.1, ...). */
void dg_config_default(dg_config *cfg);

/* Parse a bag size list, 26 integers joined by ',' each in [1, DG_MAX_HOT]
 * ("3,2,1,..."), or "mlperf" for DG_MLPERF_BAG_SIZES, into sizes[26].
 * Returns 0, or SR_EINVAL with what and where in err ("25 sizes, 26 expected
 * (C1..C26)", "size 3 (C3) is 0, must be in [1, 128]"); sizes may be partly
 * written then. */
int dg_bag_sizes_parse(const char *text, int *sizes, char *err, size_t errlen);

/* Cardinality of categorical column j (0..25) for a scale: the reference DLRM's
 * Kaggle count c, scaled to max(min(c, 16), ceil(c * scale)), so tiny columns
 * (3, 4, 10, 15) keep their real size and none falls below 16 otherwise. */
uint32_t dg_cardinality(int col, double scale);

/* The configured (expected) missing rate of dense column i / categorical j. */
double dg_dense_missing_rate(int col);
double dg_cat_missing_rate(int col);

/* One generated sample, before formatting. */
typedef struct dg_row {
  uint64_t index;                          /* row index in the file */
  int label;                               /* 0 or 1 */
  float prob;                              /* true click probability */
  double logit, logit_bias, logit_dense, logit_cat; /* logit = bias + dense + cat */
  double logit_cat_fm;                     /* the FM part of logit_cat */
  double logit_cross;                      /* the cross terms (0 without) */
  int64_t dense[DG_NUM_DENSE];             /* raw integer values */
  uint8_t dense_missing[DG_NUM_DENSE];
  int ncat[DG_NUM_CAT];                    /* ids in the field; 0 = missing */
  uint32_t cat_rank[DG_NUM_CAT][DG_MAX_HOT]; /* Zipf rank (0 = most frequent) */
  uint32_t cat_hex[DG_NUM_CAT][DG_MAX_HOT];  /* the 32-bit id written as 8 hex digits */
  int strip;                               /* 1: trailing empty fields are cut */
} dg_row;

typedef struct dg_generator dg_generator;

/* Oracle figures of one split ("test" or "all"). */
typedef struct dg_split_stats {
  uint64_t rows, positives;
  double auc;      /* ties averaged, as scikit-learn's roc_auc_score; NAN if one class */
  double logloss;  /* mean of -log p(label) with the float probability */
  int auc_exact;   /* 0 when more than auc_exact_max rows forced the histogram */
} dg_split_stats;

typedef struct dg_summary {
  dg_split_stats all, test;
  uint64_t bytes;  /* bytes of the TSV text (before compression) */
  double seconds;  /* wall time of the generation */
} dg_summary;

/* Check cfg and build a generator: cardinalities, Zipf samplers (two-level
 * alias tables, a 1024-rank head plus the tail, for columns up to 2^20 values;
 * rejection-inversion above, so memory stays bounded at any scale: ~15 MB RSS
 * at scale 1), caches of the teacher parameters of each column's first 4096
 * ranks, teacher weights, and the bias calibration pilot (20k rows from a
 * stream of their own). The generator copies cfg. On success *out owns a generator to free
 * with dg_generator_destroy. Returns 0, SR_EINVAL (a bad field; the message
 * is in errbuf when errbuf is not NULL) or SR_ENOMEM. */
int dg_generator_create(const dg_config *cfg, dg_generator **out, char *errbuf,
                        size_t errlen);

/* Free a generator; NULL does nothing. */
void dg_generator_destroy(dg_generator *g);

/* The configuration in use (with defaults filled in). */
const dg_config *dg_generator_config(const dg_generator *g);

/* The calibrated teacher bias. */
double dg_generator_bias(const dg_generator *g);

/* Generate row `index` into *row (caller-owned). Pure function of (seed, index). */
void dg_generator_row(const dg_generator *g, uint64_t index, dg_row *row);

/* Format a row as one TSV line ending in '\n' into buf (at least DG_LINE_MAX
 * bytes). Returns the length written (no NUL). */
size_t dg_row_format(const dg_row *row, char *buf);

/* The names of the files beside the TSV: PATH.probs, PATH.summary.json. */
#define DG_PROBS_SUFFIX ".probs"
#define DG_SUMMARY_SUFFIX ".summary.json"

/* Write cfg->rows lines to `path`, the true probabilities to `path`.probs
 * (one %.9g float per line) and a JSON summary to `path`.summary.json.
 * Streams in 1 MiB chunks: memory is bounded by the AUC buffers (8 bytes a row
 * up to auc_exact_max, then a fixed histogram). The three are written under
 * temporary names beside their final ones and renamed into place together
 * once all are whole (common/outfile.h): a failure leaves none of them and
 * no temporary, and the files that were there as they were; a folder at
 * any of the three paths is refused before a line is made. Fills *summary
 * when not NULL. Returns 0, SR_EIO ("PATH: cannot write: <errno's text>" in
 * errbuf), SR_EEXISTS / SR_EINVAL (a folder or a non-file at a path) or
 * SR_ENOMEM. */
int dg_generator_write(dg_generator *g, const char *path, dg_summary *summary, char *errbuf,
                       size_t errlen);

#endif
