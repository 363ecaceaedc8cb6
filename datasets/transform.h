/* The data transform: how a raw Criteo row becomes a model's input. It
 * travels with the model (a checkpoint's transform.bin), so that new raw
 * rows are scored, served and trained on as the training rows were mapped.
 *
 * A transform is
 *   - the id mode: dictionary (per-column kept values; a value not kept maps
 *     to the unseen id, 0), modulo (value % max_ind_range) or hash
 *     (ds_criteo_hash_id, unbounded tables);
 *   - max_ind_range: dictionary: each value is taken % max_ind_range (when
 *     > 0) before the lookup; modulo: the range;
 *   - the frequency threshold the dictionaries were built with (values seen
 *     fewer times in the train part were not kept);
 *   - the dictionaries: per column its kept values in id order (values[i]
 *     has id i + 1);
 *   - the dense features' transform: (float)log1p((double)max(0, x)) of the
 *     64-bit integer x, an empty field 0 (datasets/criteo.h).
 *
 * Its file, and the canonical bytes its fingerprint is the SHA-256 of (all
 * integers little-endian):
 *   [0, 8)    magic "SRXFORM1"
 *   u32 version (1), u32 id mode (0 dictionary, 1 modulo, 2 hash)
 *   u64 max_ind_range, u32 frequency threshold, u32 unseen id (0),
 *   u32 dense transform (1: log1p as above), u32 columns (26)
 *   u64 kept values per column [26]
 *   then each column's kept values (u32) in id order.
 * The header is DS_XFORM_HEADER_BYTES (248) bytes. Modulo and hash
 * transforms hold no values (their counts are 0).
 *
 * Mapping a raw row: parse it as datasets/criteo.h does (an empty
 * categorical field is the value 0; a multi-hot field is its values in
 * order); each value v of column c becomes ds_transform_map(t, c, v). */
#ifndef SHARDREC_DATASETS_TRANSFORM_H
#define SHARDREC_DATASETS_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "datasets/criteo.h"

#define DS_XFORM_MAGIC "SRXFORM1"
#define DS_XFORM_VERSION 1u
#define DS_XFORM_HEADER_BYTES 248u
#define DS_XFORM_DENSE_LOG1P 1u
/* The id every value a dictionary did not keep maps to. */
#define DS_XFORM_UNSEEN_ID 0u
/* The file name of a checkpoint's transform, in its step folder. */
#define DS_XFORM_FILE "transform.bin"

typedef struct ds_transform {
  ds_id_mode id_mode;            /* DS_IDS_DICT, DS_IDS_MODULO or DS_IDS_HASH */
  uint64_t max_ind_range;
  uint32_t frequency_threshold;
  ds_criteo_dict *dict;          /* DICT: the finalized dictionaries (owned); else NULL */
} ds_transform;

/* A new transform of mode (DICT, MODULO or HASH), owning dict (DICT: a
 * finalized dictionary, taken even on failure; else NULL). NULL on out of
 * memory or a mode without its parts. */
ds_transform *ds_transform_create(ds_id_mode mode, uint64_t max_ind_range,
                                  uint32_t frequency_threshold, ds_criteo_dict *dict);

/* A copy of t (its own dictionaries); NULL on out of memory. */
ds_transform *ds_transform_clone(const ds_transform *t);

/* Free. NULL-safe. */
void ds_transform_free(ds_transform *t);

/* Id of value v of column col (0..25): dictionary (unseen: 0), modulo or
 * hash, as the training reader mapped it. */
uint64_t ds_transform_map(const ds_transform *t, int col, uint32_t v);

/* Rows of each column's table (sizes[26]): 1 + kept values, max_ind_range,
 * or 0 (unbounded) for hashed ids. */
void ds_transform_table_sizes(const ds_transform *t, uint64_t *sizes);

/* The fingerprint: SHA-256 hex of the canonical bytes. 0 or SR_EBACKEND. */
int ds_transform_fingerprint(const ds_transform *t, char hex[SR_SHA256_HEX]);

/* Write t to path (common/outfile.h: a temporary renamed into place); fp
 * (may be NULL) gets the fingerprint of what was written. 0 or SR_E* with
 * "PATH: why" in err. */
int ds_transform_save(const ds_transform *t, const char *path, char fp[SR_SHA256_HEX],
                      char *err, size_t errlen);

/* Parse the canonical bytes (len bytes at p); src names them in messages.
 * Checks magic, version, mode, counts against len, that every column's
 * values are distinct. 0 and a new transform in *out, or SR_EFORMAT /
 * SR_EVERSION / SR_ENOMEM with "SRC: why" in err. */
int ds_transform_parse(const void *p, size_t len, const char *src, ds_transform **out,
                       char *err, size_t errlen);

/* Read and parse path; fp (may be NULL) gets the file's fingerprint. */
int ds_transform_load(const char *path, ds_transform **out, char fp[SR_SHA256_HEX], char *err,
                      size_t errlen);

/* How b relates to a: */
typedef enum {
  DS_XFORM_SAME = 0,    /* the same mapping */
  DS_XFORM_EXTENDS = 1, /* b is a with values added at the end of some dictionaries:
                           every value of a keeps its id in b */
  DS_XFORM_DIFFERS = 2  /* anything else */
} ds_xform_relation;

/* How b relates to a; for EXTENDS and DIFFERS why (may be NULL) gets the
 * first difference ("C3: id 17 is value 0x1a in one, 0x2b in the other",
 * "id mode dictionary in one, hash in the other", "C5: 12 values added"). */
ds_xform_relation ds_transform_compare(const ds_transform *a, const ds_transform *b, char *why,
                                       size_t len);

/* One line about t: "dictionary (frequency threshold 1, 1234 kept values in
 * 26 columns, not kept -> id 0), dense log1p" / "hash (64-bit ids), dense
 * log1p" / "modulo 1000, dense log1p". */
void ds_transform_describe(const ds_transform *t, char *buf, size_t len);

/* Name of an id mode: "dictionary", "modulo", "hash", "raw". */
const char *ds_id_mode_name(ds_id_mode mode);

#endif
