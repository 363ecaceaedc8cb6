/* One data source API for the trainer, whatever the input: Criteo TSV (plain
 * or gzip, detected by magic bytes), shardrec's binary record file
 * (datasets/binfmt.h), or the reference DLRM's int32 record layout.
 *
 * A source yields the samples of one split (all/train/test/val) in file order
 * as ds_batch. Sample indices (batch->first_index, ds_source_seek) count the
 * valid samples of the split from 0; malformed TSV lines are skipped and do not
 * take an index, so a TSV source and the binary file converted from it give
 * the same batches at the same indices.
 *
 * Format detection (DS_FORMAT_AUTO): a file that starts with shardrec's
 * binary magic is DS_FORMAT_BIN; a name ending in ".int32" is DS_FORMAT_INT32;
 * gzip or text is TSV; a file whose first bytes are neither text nor the
 * magic (a control byte, or a damaged magic) is refused as "not a shardrec
 * binary file (magic ...)", never parsed line by line. DS_FORMAT_PROCESSED
 * takes BIN and INT32 alone (a 0- or 7-byte file is refused the same way). The int32 layout has no header to detect, so a
 * reference DLRM "*.bin" file must be opened with format DS_FORMAT_INT32.
 *
 * Terabyte: with scheme DS_SCHEME_TERABYTE, path is a prefix and the files
 * are PATH_0 .. PATH_23 (e.g. path "/data/day" reads /data/day_0 ...), read
 * as one stream of lines. */
#ifndef SHARDREC_DATASETS_SOURCE_H
#define SHARDREC_DATASETS_SOURCE_H

#include <stdint.h>
#include <stdio.h>

#include "datasets/batch.h"
#include "datasets/criteo.h"
#include "datasets/transform.h"

/* PROCESSED: a file given as converted data (--processed-data-file): BIN by
 * its magic, INT32 by its name, anything else refused. RAW: a file given as
 * raw rows (--raw-data-file): TSV, gzip or not; a file with the binary
 * magic or named *.int32 is refused (converted rows hold ids mapped by
 * their own dictionaries, which raw rows' mapping would not check), and
 * one that is not text as under AUTO. */
typedef enum {
  DS_FORMAT_AUTO = 0, DS_FORMAT_TSV, DS_FORMAT_BIN, DS_FORMAT_INT32, DS_FORMAT_PROCESSED,
  DS_FORMAT_RAW
} ds_format;

/* Zero-initialised options are the defaults named below. */
typedef struct {
  const char *path;         /* file, or prefix for terabyte day files */
  ds_format format;         /* AUTO */
  ds_split split;           /* ALL */
  ds_split_scheme scheme;   /* NONE (TSV, int32); a bin file holds its own split */
  double test_fraction;     /* for DS_SCHEME_FRACTION */
  ds_id_mode id_mode;       /* TSV: DICT (built over the train part at open), MODULO,
                               HASH, or RAW (the hex value itself); int32: ids
                               as stored (then % max_ind_range when > 0); bin: as stored */
  uint64_t max_ind_range;   /* > 0: value % max_ind_range before the dictionary (DICT),
                               the whole mapping (MODULO) */
  uint32_t frequency_threshold; /* DICT: values seen fewer times share id 0 */
  const ds_transform *transform; /* TSV: map with this transform (borrowed; it outlives the
                               source) instead of id_mode, max_ind_range and
                               frequency_threshold: no dictionary is built */
  int extend;               /* with a dictionary transform: build dictionaries that
                               extend it over the train part (its values keep their
                               ids; new values kept at its threshold get the next ones) */
  int no_label;             /* TSV without the label column (labels read as 0) */
  int strict;               /* the first malformed line is an error */
  int exact_count;          /* TSV, non-DICT: parse once at open so counts are exact */
  int read_ahead;           /* TSV: chunks (2048 samples) a reader thread parses ahead
                               of the consumer (0: the default, 2 = triple buffering);
                               bin/int32: > 0 (the default) decodes the next batch on
                               a helper thread (datasets/bin_ahead.h);
                               negative: no thread, parse in the caller's thread */
  int no_verify;            /* bin: skip the payload checksum pass at open */
  FILE *report;             /* first malformed lines are printed here (NULL: not) */
  int max_reports;          /* how many are kept/printed (0: 5) */
  const char *progress;     /* non-NULL: the passes at open (and ds_convert_to_bin's)
                               draw a progress line on stderr named so ("convert";
                               common/progress.h): give it only when stderr is a terminal */
} ds_source_opts;

typedef struct ds_source ds_source;

typedef struct {
  uint64_t lines;     /* lines (records) read in the split since open/rewind/seek */
  uint64_t samples;   /* samples delivered or skipped by seek */
  uint64_t malformed; /* lines skipped */
  uint64_t bad[DS_BAD_COUNT]; /* ... by ds_bad_kind */
  /* The counting pass at open (TSV with DICT or exact_count: whole input). */
  uint64_t scan_lines, scan_malformed;
  uint64_t scan_ids;  /* categorical ids in all valid samples */
  uint32_t scan_max_bag; /* largest bag of one feature (1: one-hot input) */
  uint64_t ahead_taken;  /* bin/int32: batches taken from the read-ahead since open */
} ds_source_stats;

/* Open a source. TSV: counts lines when a split scheme needs them, and in
 * DICT mode (or with exact_count) parses the input once, building the
 * dictionaries from the train part; read whole without a dictionary it
 * starts at once (lines counted on the first ds_source_count).
 * Returns a handle the caller owns (ds_source_destroy), or NULL with the
 * reason, naming the file, in err (errlen bytes). */
ds_source *ds_source_open(const ds_source_opts *o, char *err, size_t errlen);

/* Fill b with up to max_n (<= b->cap) next samples of the split;
 * b->first_index is the index of the first. Returns n > 0, 0 at the end of
 * the split, or a negative SR_E* code (text in ds_source_errmsg); in strict
 * mode a malformed line is SR_EFORMAT "file:line: what". */
int ds_source_next(ds_source *s, ds_batch *b, int max_n);

/* Continue at sample index (0 <= index <= count) of the split. TSV re-reads
 * from the split's start (cost linear in index); bin/int32 are O(1).
 * 0 or SR_ERANGE / SR_E* on failure. */
int ds_source_seek(ds_source *s, uint64_t sample_index);

/* ds_source_seek(s, 0). */
int ds_source_rewind(ds_source *s);

/* Samples in this split. Exact for bin/int32 and for TSV after a parsing
 * pass (DICT or exact_count); otherwise the line count of the split (an
 * upper bound when lines are malformed), counted by a pass over the input
 * on the first call when open did not count. */
uint64_t ds_source_count(ds_source *s);

/* The lines of s's split that its reader skips as malformed, as
 * split-relative line numbers in ascending order (*bad, malloc'd, NULL
 * when none; *n_bad): found by a pass of the reader's own line splitting
 * and parser over the same files, so that a caller writing one output
 * line per input line (predict) puts each where it belongs. None for a
 * binary file. 0, or SR_E* with the reason in err. */
int ds_source_bad_lines(const ds_source *s, uint64_t **bad, size_t *n_bad, char *err,
                        size_t errlen);

/* Same for any split of the input (bin: stored counts). */
uint64_t ds_source_split_count(ds_source *s, ds_split split);

/* Rows per table (sizes[26]): dictionary counts, max_ind_range, the largest
 * id + 1 (int32 without max_ind_range), or 0 for unbounded hashed ids. */
int ds_source_table_sizes(ds_source *s, uint64_t *sizes);

/* 1 when the samples' labels are the data's: 0 for TSV read with no_label
 * and for a bin file converted from such rows (DS_BIN_NO_LABEL), whose
 * labels read 0. */
int ds_source_labelled(const ds_source *s);

/* The transform the ids were mapped with (datasets/transform.h): TSV the
 * one given or built, bin the file's own; NULL for raw ids (int32 files,
 * a bin file of raw ids). Owned by s (or the caller's o->transform). */
const ds_transform *ds_source_transform(const ds_source *s);

/* The dictionaries in use (DICT mode), owned by s; NULL otherwise. */
const ds_criteo_dict *ds_source_dict(ds_source *s);

/* The id mode of the ids produced, and max_ind_range / frequency threshold used. */
ds_id_mode ds_source_id_mode(ds_source *s);

/* What identifies the data read (not the split): a bin file's data CRC32
 * and counts ("bin data crc32 1a2b3c4d, 4000 samples (train 3600, test
 * 400, val 0)"), an int32 file's records, a TSV's bytes (its files,
 * compressed bytes for gzip), each of those two with a CRC-32 of its
 * files' first and last MiB ("tsv 1031 bytes, ends crc32 0a1b2c3d"), into
 * out. A resumed job tells new data from the data it was trained on by it. */
void ds_source_identity(const ds_source *s, char *out, size_t len);

/* 1 when identity now is the data of identity was: equal, or was written
 * without the ends' CRC (its bytes or records alone) and now's are those. */
int ds_source_identity_same(const char *was, const char *now);

/* Counters; 0 or SR_EINVAL. */
int ds_source_stats_get(ds_source *s, ds_source_stats *st);

/* The i-th kept malformed-line report ("file:line: what"), NULL past the end.
 * Owned by s. */
const char *ds_source_report(ds_source *s, int i);

/* Where sample sample_index of the split is in a bin or int32 file: its
 * record's index in the file (the one a read error names) into *record.
 * 0, or SR_EINVAL for TSV input (a sample is a line that parsed). */
int ds_source_record_of(const ds_source *s, uint64_t sample_index, uint64_t *record);

/* Text of the last error (empty when none). Owned by s. */
const char *ds_source_errmsg(ds_source *s);

/* Stop the reader thread, free everything. NULL-safe. */
void ds_source_destroy(ds_source *s);

#endif
