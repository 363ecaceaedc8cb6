/* Criteo TSV lines: the single-line parser, the categorical id mappings
 * (dictionary, modulo, hash) and the split schemes of the reference DLRM.
 *
 * A line is `label \t I1..I13 \t C1..C26` (40 fields), or without the label
 * (39 fields) when the caller says so (no_label: Kaggle test.txt). Trailing
 * empty fields may be stripped: a line with fewer fields has the missing ones
 * empty. A categorical field may hold several 1..8-digit hex values joined by
 * ',' (multi-hot), at most DS_MAX_BAG (128) of them, none empty. The streaming reader built on this parser is
 * datasets/source.h. */
#ifndef SHARDREC_DATASETS_CRITEO_H
#define SHARDREC_DATASETS_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"

/* Most categorical values one line may hold, all columns together. */
#define DS_CRITEO_MAX_VALUES 4096

/* Why a line was refused. DS_BAD_NONE for a good line. */
#define DS_BAD_MAP(X)                                          \
  X(LABEL, 1, "bad label")                                     \
  X(INT, 2, "non-numeric integer feature")                     \
  X(OVERFLOW, 3, "integer feature overflows 64 bits")          \
  X(CAT, 4, "bad categorical value")                           \
  X(FIELDS, 5, "too many fields")                              \
  X(VALUES, 6, "too many categorical values")                  \
  X(LONG, 7, "line too long")

typedef enum {
  DS_BAD_NONE = 0,
#define DS__BAD_ENUM(name, code, msg) DS_BAD_##name = code,
  DS_BAD_MAP(DS__BAD_ENUM)
#undef DS__BAD_ENUM
  DS_BAD_COUNT = 8
} ds_bad_kind;

/* Short description of a ds_bad_kind (static string). */
const char *ds_bad_kind_name(int kind);

typedef struct {
  int no_label; /* 1: the line has no label column (39 fields) */
} ds_criteo_parse_opts;

/* One parsed line, before id mapping. */
typedef struct {
  int label;                      /* 0 or 1; 0 with no_label */
  float dense[DS_NUM_DENSE];      /* (float)log1p((double)max(0, x)), missing = 0 */
  uint32_t off[DS_NUM_SPARSE + 1]; /* column c's raw values: vals[off[c]..off[c+1]) */
  uint32_t vals[DS_CRITEO_MAX_VALUES]; /* raw hex values; a missing field is one 0 */
  int bad;                        /* ds_bad_kind after a refused line */
} ds_criteo_sample;

/* Parse one line (len bytes, no need for a NUL; a trailing "\n" or "\r\n" is
 * ignored). The dense transform is computed in double: (float)log1p((double)x)
 * of the 64-bit integer x clipped at 0 — the reference computes log(x+1) in
 * float32; the two agree to 1 ulp for the values Criteo holds.
 * Returns 0, or SR_EFORMAT with out->bad set and a one-line reason ("field 3
 * (I2): 'x1' is not an integer") in err (errlen bytes, may be NULL). Never
 * reads outside [line, line+len). */
int ds_criteo_parse_line(const char *line, size_t len, const ds_criteo_parse_opts *o,
                         ds_criteo_sample *out, char *err, size_t errlen);

/* ---- id mapping ---------------------------------------------------------- */

typedef enum {
  DS_IDS_DICT = 0, /* per-column dictionary (reference DLRM); id 0 = rare/unseen */
  DS_IDS_MODULO,   /* value % max_ind_range (max_ind_range > 0) */
  DS_IDS_HASH,     /* ds_criteo_hash_id(column, value): unbounded tables */
  DS_IDS_RAW       /* value as it is (int32 reference files hold mapped ids) */
} ds_id_mode;

/* 64-bit id of (column, value) for unbounded tables. Pure function. */
uint64_t ds_criteo_hash_id(int col, uint32_t value);

/* The 26 per-column dictionaries. Built by counting values (add) then
 * finalize: id 0 is shared by every value seen fewer than freq_threshold
 * times and by every value never seen; the other values get ids 1, 2, ... in
 * order of first appearance. Table size of column c = 1 + kept values. */
typedef struct ds_criteo_dict ds_criteo_dict;

/* New empty dictionaries (threshold <= 1 keeps every seen value). NULL on
 * out of memory. The caller owns the result (ds_criteo_dict_destroy). */
ds_criteo_dict *ds_criteo_dict_create(uint32_t freq_threshold);
/* New dictionaries that extend base (finalized): base's kept values keep
 * their ids whatever their count here; values then added and kept (seen
 * freq_threshold times) get the ids after them, in order of first
 * appearance. NULL on out of memory. */
ds_criteo_dict *ds_criteo_dict_extend(const ds_criteo_dict *base, uint32_t freq_threshold);
/* Free. NULL-safe. */
void ds_criteo_dict_destroy(ds_criteo_dict *d);
/* Count one value of column col (0..25). 0, SR_ENOMEM or SR_ESTATE (final). */
int ds_criteo_dict_add(ds_criteo_dict *d, int col, uint32_t value);
/* Assign the ids; after it only lookups. 0 or SR_ENOMEM. */
int ds_criteo_dict_finalize(ds_criteo_dict *d);
/* Id of value in column col (0 for rare or unseen). Only after finalize. */
uint32_t ds_criteo_dict_lookup(const ds_criteo_dict *d, int col, uint32_t value);
/* Rows of column col's table (1 + kept values). */
uint64_t ds_criteo_dict_size(const ds_criteo_dict *d, int col);
/* Kept values of col in id order (values[i] has id i+1); *n = count. The
 * array belongs to d. Only after finalize. */
const uint32_t *ds_criteo_dict_values(const ds_criteo_dict *d, int col, uint64_t *n);
/* A finalized dictionary from stored values (as ds_criteo_dict_values gave):
 * values[c] has n[c] entries. NULL with the reason in err: out of memory, or
 * a value listed twice in a column ("C5: value 0x1a is entries 2 and 7":
 * ds_criteo_dict_values never gives one, and it would leave an id no raw
 * value maps to). */
ds_criteo_dict *ds_criteo_dict_from_values(const uint32_t *const *values, const uint64_t *n,
                                           char *err, size_t errlen);

/* ---- splits --------------------------------------------------------------- */

typedef enum { DS_SPLIT_ALL = 0, DS_SPLIT_TRAIN, DS_SPLIT_TEST, DS_SPLIT_VAL } ds_split;

typedef enum {
  DS_SCHEME_NONE = 0, /* everything is train; test and val empty */
  DS_SCHEME_KAGGLE,   /* 7 equal "days" (first total%7 one longer): 0-5 train,
                         day 6: first half (rounded up) test, rest val */
  DS_SCHEME_TERABYTE, /* files day_0..day_23: 0-22 train, day_23 halved as above */
  DS_SCHEME_FRACTION  /* last floor(F * lines) lines test, the rest train */
} ds_split_scheme;

/* Line ranges [begin[s], end[s]) of each ds_split (index ALL..VAL). */
typedef struct {
  uint64_t begin[4], end[4];
} ds_split_ranges;

/* Compute the ranges for total lines; last_file_lines is the line count of
 * the last file (terabyte's day_23), fraction F in [0,1] for FRACTION.
 * 0 or SR_EINVAL. */
int ds_split_ranges_compute(ds_split_scheme scheme, uint64_t total, uint64_t last_file_lines,
                            double fraction, ds_split_ranges *r);

#endif
