/* The data transform a model was trained with (see transform.h). Assumes a
 * little-endian host, as binfmt.c does. */
#include "datasets/transform.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/fs.h"
#include "common/outfile.h"
#include "common/rng.h"
#include "common/status.h"

/* Header field offsets. */
enum {
  X_MAGIC = 0, X_VERSION = 8, X_MODE = 12, X_RANGE = 16, X_THR = 24, X_UNSEEN = 28,
  X_DENSE = 32, X_COLS = 36, X_COUNTS = 40
};
_Static_assert(X_COUNTS + 8 * DS_NUM_SPARSE == DS_XFORM_HEADER_BYTES, "transform header size");


const char *ds_id_mode_name(ds_id_mode mode) {
  switch (mode) {
    case DS_IDS_DICT: return "dictionary";
    case DS_IDS_MODULO: return "modulo";
    case DS_IDS_HASH: return "hash";
    default: return "raw";
  }
}

ds_transform *ds_transform_create(ds_id_mode mode, uint64_t max_ind_range,
                                  uint32_t frequency_threshold, ds_criteo_dict *dict) {
  int ok = (mode == DS_IDS_DICT && dict) || (mode == DS_IDS_MODULO && max_ind_range && !dict) ||
           (mode == DS_IDS_HASH && !dict);
  ds_transform *t = ok ? calloc(1, sizeof *t) : NULL;
  if (!t) {
    ds_criteo_dict_destroy(dict);
    return NULL;
  }
  t->id_mode = mode;
  t->max_ind_range = mode == DS_IDS_HASH ? 0 : max_ind_range;
  t->frequency_threshold = mode == DS_IDS_DICT ? (frequency_threshold ? frequency_threshold : 1) : 0;
  t->dict = dict;
  return t;
}

ds_transform *ds_transform_clone(const ds_transform *t) {
  ds_criteo_dict *d = NULL;
  if (t->dict) {
    const uint32_t *v[DS_NUM_SPARSE];
    uint64_t n[DS_NUM_SPARSE];
    for (int c = 0; c < DS_NUM_SPARSE; c++) v[c] = ds_criteo_dict_values(t->dict, c, &n[c]);
    if (!(d = ds_criteo_dict_from_values(v, n, NULL, 0))) return NULL;
  }
  return ds_transform_create(t->id_mode, t->max_ind_range, t->frequency_threshold, d);
}

void ds_transform_free(ds_transform *t) {
  if (!t) return;
  ds_criteo_dict_destroy(t->dict);
  free(t);
}

uint64_t ds_transform_map(const ds_transform *t, int col, uint32_t v) {
  switch (t->id_mode) {
    case DS_IDS_DICT:
      if (t->max_ind_range) v = (uint32_t)(v % t->max_ind_range);
      return ds_criteo_dict_lookup(t->dict, col, v);
    case DS_IDS_MODULO:
      return v % t->max_ind_range;
    default:
      return ds_criteo_hash_id(col, v);
  }
}

void ds_transform_table_sizes(const ds_transform *t, uint64_t *sizes) {
  for (int c = 0; c < DS_NUM_SPARSE; c++)
    sizes[c] = t->id_mode == DS_IDS_DICT     ? ds_criteo_dict_size(t->dict, c)
               : t->id_mode == DS_IDS_MODULO ? t->max_ind_range
                                             : 0;
}

/* The canonical header of t. */
static void header(const ds_transform *t, unsigned char h[DS_XFORM_HEADER_BYTES]) {
  memset(h, 0, DS_XFORM_HEADER_BYTES);
  memcpy(h + X_MAGIC, DS_XFORM_MAGIC, 8);
  sr_put32(h + X_VERSION, DS_XFORM_VERSION);
  sr_put32(h + X_MODE, (uint32_t)t->id_mode);
  sr_put64(h + X_RANGE, t->max_ind_range);
  sr_put32(h + X_THR, t->frequency_threshold);
  sr_put32(h + X_UNSEEN, DS_XFORM_UNSEEN_ID);
  sr_put32(h + X_DENSE, DS_XFORM_DENSE_LOG1P);
  sr_put32(h + X_COLS, DS_NUM_SPARSE);
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    uint64_t n = 0;
    if (t->dict) ds_criteo_dict_values(t->dict, c, &n);
    sr_put64(h + X_COUNTS + 8 * c, n);
  }
}

/* The canonical bytes, piece by piece, through emit (0 or its error). */
static int emit_all(const ds_transform *t, int (*emit)(void *, const void *, size_t), void *arg) {
  unsigned char h[DS_XFORM_HEADER_BYTES];
  header(t, h);
  int rc = emit(arg, h, sizeof h);
  for (int c = 0; !rc && t->dict && c < DS_NUM_SPARSE; c++) {
    uint64_t n;
    const uint32_t *v = ds_criteo_dict_values(t->dict, c, &n);
    if (n) rc = emit(arg, v, n * sizeof *v);
  }
  return rc;
}

static int emit_hash(void *arg, const void *p, size_t n) {
  return sr_sha256_update(arg, p, n);
}

int ds_transform_fingerprint(const ds_transform *t, char hex[SR_SHA256_HEX]) {
  sr_sha256_ctx h;
  unsigned char d[SR_SHA256_LEN];
  int rc = sr_sha256_init(&h);
  if (rc) return rc;
  if ((rc = emit_all(t, emit_hash, &h))) {
    sr_sha256_abort(&h);
    return rc;
  }
  if ((rc = sr_sha256_final(&h, d))) return rc;
  sr_sha256_to_hex(d, hex);
  return 0;
}

static int emit_file(void *arg, const void *p, size_t n) { return sr_out_write(arg, p, n); }

int ds_transform_save(const ds_transform *t, const char *path, char fp[SR_SHA256_HEX],
                      char *err, size_t errlen) {
  sr_outfile *o;
  int rc = sr_out_open(path, &o, err, errlen);
  if (rc) return rc;
  emit_all(t, emit_file, o); /* a write error is kept for the commit */
  if ((rc = sr_out_commit(o, err, errlen))) return rc;
  if (fp && (rc = ds_transform_fingerprint(t, fp))) sr_fmt(err, errlen, "%s: cannot hash", path);
  return rc;
}

int ds_transform_parse(const void *buf, size_t len, const char *src, ds_transform **out,
                       char *err, size_t errlen) {
  const unsigned char *p = buf;
  *out = NULL;
  if (len < DS_XFORM_HEADER_BYTES || memcmp(p, DS_XFORM_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec data transform (no " DS_XFORM_MAGIC " header)", src);
    return SR_EFORMAT;
  }
  if (sr_get32(p + X_VERSION) != DS_XFORM_VERSION) {
    sr_fmt(err, errlen, "%s: transform version %u, this shardrec reads %u", src,
           sr_get32(p + X_VERSION), DS_XFORM_VERSION);
    return SR_EVERSION;
  }
  uint32_t mode = sr_get32(p + X_MODE);
  uint64_t range = sr_get64(p + X_RANGE), n[DS_NUM_SPARSE], total = 0;
  uint32_t thr = sr_get32(p + X_THR);
  /* Only what ds_transform_create makes: the bytes are canonical, so that a
   * transform read back has the fingerprint of the bytes it was read from. */
  if (mode > DS_IDS_HASH || sr_get32(p + X_UNSEEN) != DS_XFORM_UNSEEN_ID ||
      sr_get32(p + X_DENSE) != DS_XFORM_DENSE_LOG1P || sr_get32(p + X_COLS) != DS_NUM_SPARSE ||
      (mode == DS_IDS_MODULO && !range) || (mode == DS_IDS_HASH && range) ||
      (mode == DS_IDS_DICT) != (thr != 0)) {
    sr_fmt(err, errlen, "%s: header: id mode %u, range %llu, frequency threshold %u, unseen id "
           "%u, dense transform %u, %u columns is not a transform this shardrec knows", src, mode,
           (unsigned long long)range, thr, sr_get32(p + X_UNSEEN), sr_get32(p + X_DENSE),
           sr_get32(p + X_COLS));
    return SR_EFORMAT;
  }
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    n[c] = sr_get64(p + X_COUNTS + 8 * c);
    if ((mode != DS_IDS_DICT && n[c]) || n[c] >= (1ULL << 32) ||
        total + n[c] > (len - DS_XFORM_HEADER_BYTES) / 4) {
      sr_fmt(err, errlen, "%s: header: C%d's %llu values do not fit the %zu bytes", src, c + 1,
             (unsigned long long)n[c], len);
      return SR_EFORMAT;
    }
    total += n[c];
  }
  if (DS_XFORM_HEADER_BYTES + 4 * total != len) {
    sr_fmt(err, errlen, "%s: %zu bytes, its header says %llu", src, len,
           (unsigned long long)(DS_XFORM_HEADER_BYTES + 4 * total));
    return SR_EFORMAT;
  }
  ds_criteo_dict *d = NULL;
  if (mode == DS_IDS_DICT) {
    uint32_t *copy = malloc(total ? total * 4 : 4); /* alignment-safe copy */
    const uint32_t *vals[DS_NUM_SPARSE];
    char why[256] = "out of memory";
    if (copy) {
      memcpy(copy, p + DS_XFORM_HEADER_BYTES, total * 4);
      for (uint64_t c = 0, off = 0; c < DS_NUM_SPARSE; off += n[c], c++) vals[c] = copy + off;
      d = ds_criteo_dict_from_values(vals, n, why, sizeof why);
      free(copy);
    }
    if (!d) {
      sr_fmt(err, errlen, "%s: dictionary %s", src, why);
      return copy ? SR_EFORMAT : SR_ENOMEM;
    }
  }
  *out = ds_transform_create((ds_id_mode)mode, range, thr, d);
  if (!*out) {
    sr_fmt(err, errlen, "%s: out of memory", src);
    return SR_ENOMEM;
  }
  return 0;
}

int ds_transform_load(const char *path, ds_transform **out, char fp[SR_SHA256_HEX], char *err,
                      size_t errlen) {
  size_t len;
  char *buf = sr_read_file(path, &len);
  *out = NULL;
  if (!buf) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return SR_EIO;
  }
  int rc = ds_transform_parse(buf, len, path, out, err, errlen);
  if (!rc && fp && sr_sha256_hex(buf, len, fp)) {
    sr_fmt(err, errlen, "%s: cannot hash", path);
    ds_transform_free(*out);
    *out = NULL;
    rc = SR_EBACKEND;
  }
  free(buf);
  return rc;
}

ds_xform_relation ds_transform_compare(const ds_transform *a, const ds_transform *b, char *why,
                                       size_t len) {
  if (a->id_mode != b->id_mode || a->max_ind_range != b->max_ind_range ||
      a->frequency_threshold != b->frequency_threshold) {
    sr_fmt(why, len, "%s (max-ind-range %llu, frequency threshold %u) in one, %s (%llu, %u) in "
           "the other", ds_id_mode_name(a->id_mode), (unsigned long long)a->max_ind_range,
           a->frequency_threshold, ds_id_mode_name(b->id_mode),
           (unsigned long long)b->max_ind_range, b->frequency_threshold);
    return DS_XFORM_DIFFERS;
  }
  if (!a->dict) return DS_XFORM_SAME;
  ds_xform_relation rel = DS_XFORM_SAME;
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    uint64_t na, nb;
    const uint32_t *va = ds_criteo_dict_values(a->dict, c, &na);
    const uint32_t *vb = ds_criteo_dict_values(b->dict, c, &nb);
    for (uint64_t i = 0; i < na && i < nb; i++)
      if (va[i] != vb[i]) {
        sr_fmt(why, len, "C%d: id %llu is value 0x%x in one, 0x%x in the other", c + 1,
               (unsigned long long)(i + 1), va[i], vb[i]);
        return DS_XFORM_DIFFERS;
      }
    if (na > nb) {
      sr_fmt(why, len, "C%d: %llu kept values in one, %llu in the other", c + 1,
             (unsigned long long)na, (unsigned long long)nb);
      return DS_XFORM_DIFFERS;
    }
    if (nb > na && rel == DS_XFORM_SAME) {
      sr_fmt(why, len, "C%d: %llu values added after its %llu", c + 1,
             (unsigned long long)(nb - na), (unsigned long long)na);
      rel = DS_XFORM_EXTENDS;
    }
  }
  return rel;
}

void ds_transform_describe(const ds_transform *t, char *buf, size_t len) {
  switch (t->id_mode) {
    case DS_IDS_DICT: {
      uint64_t kept = 0, n;
      for (int c = 0; c < DS_NUM_SPARSE; c++) kept += (ds_criteo_dict_values(t->dict, c, &n), n);
      char range[64] = "";
      if (t->max_ind_range)
        sr_fmt(range, sizeof range, ", values %% %llu first", (unsigned long long)t->max_ind_range);
      sr_fmt(buf, len, "dictionary (frequency threshold %u%s, %llu kept values in %d columns, "
             "not kept -> id %u), dense log1p", t->frequency_threshold, range,
             (unsigned long long)kept, DS_NUM_SPARSE, DS_XFORM_UNSEEN_ID);
      return;
    }
    case DS_IDS_MODULO:
      sr_fmt(buf, len, "modulo %llu, dense log1p", (unsigned long long)t->max_ind_range);
      return;
    default:
      sr_fmt(buf, len, "hash (64-bit ids), dense log1p");
  }
}
