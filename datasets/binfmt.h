/* shardrec's binary record file for Criteo-format samples, and the reference
 * DLRM's int32 record layout.
 *
 * Layout (all integers little-endian):
 *   [0, 4096)  header: magic "SRCRITEO", version, layout flags, counts (samples,
 *              train/test/val, total ids), id mode, max_ind_range, frequency
 *              threshold, table sizes[26], dictionary sizes[26], section
 *              offsets, CRC32 of the dictionary and of the data, with the
 *              DS_BIN_DENSE_RANGE flag the range of the dense values (f32 low,
 *              f32 high at bytes 528 and 532), reserved bytes (zero), and the
 *              CRC32 of bytes [0, 4092) in the last 4.
 *   dictionary section: per column, its kept values (uint32) in id order
 *              (value i has id i+1; id 0 = rare/unseen), so raw data can later
 *              be mapped the same way.
 *   data section, one-hot (every bag holds one id): n records of
 *              f32 label, f32 dense[13], id[26] (uint32, or uint64 when the
 *              DS_BIN_ID64 flag is set: hashed ids).
 *   data section, multi-hot (DS_BIN_MULTI): n records of f32 label + f32 dense[13];
 *              then uint64 offsets[n*26 + 1] (sample-major: bag (i, f) is
 *              ids[off[i*26+f] .. off[i*26+f+1]), at most DS_MAX_BAG = 128
 *              ids: the writer refuses a bigger bag, the reader a file with
 *              one); then the ids.
 * Samples are stored train, then test, then val (counts in the header).
 *
 * The int32 layout (reference DLRM, MLPerf): no header; per record 40 int32:
 * label, 13 integer features (raw), 26 categorical ids (already mapped). */
#ifndef SHARDREC_DATASETS_BINFMT_H
#define SHARDREC_DATASETS_BINFMT_H

#include <stdint.h>

#include "datasets/batch.h"
#include "datasets/criteo.h"

#define DS_BIN_MAGIC "SRCRITEO"
#define DS_BIN_VERSION 1u
#define DS_BIN_HEADER_SIZE 4096u
#define DS_BIN_MULTI 1u /* flags: multi-hot layout */
#define DS_BIN_ID64 2u  /* flags: 64-bit ids */
/* flags: the header declares the dense values' range [dense_lo, dense_hi]
 * (either bound may be infinite: no bound on that side; the values must
 * still be finite). Without it the range is convert's, [0,
 * ds_bin_dense_max()]. */
#define DS_BIN_DENSE_RANGE 4u
/* flags: converted from rows without a label column (--no-label): every
 * record's label is 0 and means nothing. Scored, never trained or
 * evaluated on. */
#define DS_BIN_NO_LABEL 8u
#define DS_INT32_RECORD_BYTES 160u

typedef struct {
  uint32_t version, flags, id_mode, freq_threshold;
  uint64_t n_samples, n_train, n_test, n_val;
  uint64_t total_ids;   /* multi-hot: ids in the file */
  uint64_t max_ind_range;
  uint64_t table_sizes[DS_NUM_SPARSE];
  uint64_t dict_n[DS_NUM_SPARSE];
  uint64_t dict_off, dict_bytes, data_off, data_bytes;
  uint32_t dict_crc, data_crc;
  float dense_lo, dense_hi; /* the dense values' range (reader: convert's without
                               DS_BIN_DENSE_RANGE; writer: written with it) */
} ds_bin_info;

/* The largest dense value convert writes: log1p of INT64_MAX, the largest
 * integer the TSV parser takes (datasets/criteo.c), rounded to float as it
 * rounds it (43.66827...). Values below 0 are written as 0. */
float ds_bin_dense_max(void);

/* ---- writer ---- */
typedef struct ds_bin_writer ds_bin_writer;

/* Start writing path (an sr_outfile, common/outfile.h: a temporary beside
 * it, renamed into place by finish; a folder at path is refused). The
 * file's whole size is reserved (posix_fallocate) before it is mapped, so a
 * full disk is an error here ("PATH: cannot reserve N bytes: No space left
 * on device"), never a SIGBUS later. info gives the layout and counts (n_*,
 * total_ids, flags, id mode, table_sizes); dict (may be NULL) is stored.
 * With shuffle, the train part is written in a deterministic permutation of
 * seed (one-hot only; no extra memory). NULL with a message in err on
 * failure, nothing left behind. */
ds_bin_writer *ds_bin_writer_create(const char *path, const ds_bin_info *info,
                                    const ds_criteo_dict *dict, int shuffle, uint64_t seed,
                                    char *err, size_t errlen);
/* Append the batch's samples. 0, or SR_ERANGE (more samples than announced). */
int ds_bin_writer_add(ds_bin_writer *w, const ds_batch *b);
/* Check the count, checksum, write the header, msync, fsync and rename into
 * place. 0 or SR_E* (a write error: SR_EIO naming the file; the temporary
 * removed, whatever was at path left as it was). */
int ds_bin_writer_finish(ds_bin_writer *w);
/* Text of the last error (owned by w). */
const char *ds_bin_writer_errmsg(const ds_bin_writer *w);
/* Free; an unfinished file is removed. NULL-safe. */
void ds_bin_writer_destroy(ds_bin_writer *w);

/* Position of train sample i in a file shuffled with seed (a bijection on
 * [0, n), Feistel network with cycle walking). */
uint64_t ds_bin_shuffle_pos(uint64_t i, uint64_t n, uint64_t seed);

/* ---- reader (bin and int32) ---- */
typedef struct ds_bin_reader ds_bin_reader;

/* mmap path. int32: the layout above (size must be a multiple of 160;
 * verify: every label 0/1 and every id >= 0). bin: checks magic, version,
 * header CRC, the header's fields (a known id mode and flags, no table of 0
 * rows for dictionary or modulo ids, dictionaries within their tables),
 * size, and (verify) the data and dictionary CRC32. NULL with "PATH:
 * problem" in err. */
ds_bin_reader *ds_bin_reader_open(const char *path, int int32_layout, int verify, char *err,
                                  size_t errlen);
/* The file's header fields (owned by r). */
const ds_bin_info *ds_bin_reader_info(const ds_bin_reader *r);
/* Samples [index, index + n) into b (n <= b->cap); int32 ids are % mod when
 * mod > 0. 0, or SR_EFORMAT with "record R: what (S split)"
 * (ds_bin_reader_errmsg; R the record's index in the file, S train, test
 * or val) for a record no writer writes: a label other than 0/1, a dense
 * value not finite or outside the file's range (info's dense_lo, dense_hi),
 * an id outside its table (bin: a table of size 0 is unbounded; int32: a
 * negative id), SR_ERANGE for a range past the end. */
int ds_bin_reader_read(ds_bin_reader *r, uint64_t index, int n, uint64_t mod, ds_batch *b);
/* The stored dictionaries; caller owns. NULL with the reason in
 * ds_bin_reader_errmsg when there are none, on out of memory, or when a
 * column lists a value twice ("dictionary C5: value 0x1a is entries 2 and
 * 7 ..."). */
ds_criteo_dict *ds_bin_reader_dict(ds_bin_reader *r);
/* int32: largest categorical id + 1 per column (found by the verify pass,
 * else by a pass now); 0s for bin files. */
void ds_bin_reader_id_range(ds_bin_reader *r, uint64_t *sizes);
/* Text of the last read error (owned by r). */
const char *ds_bin_reader_errmsg(const ds_bin_reader *r);
/* Unmap and free. NULL-safe. */
void ds_bin_reader_destroy(ds_bin_reader *r);

#endif
