/* Binary record files (see binfmt.h). Written through a mapping of the
 * pre-sized output (sections sit at known offsets, so multi-hot sections and
 * shuffled positions need no buffering); read through mmap. Assumes a
 * little-endian host, as every platform shardrec targets is. */
#include "datasets/binfmt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/bytes.h"
#include "common/outfile.h"
#include "common/rng.h"
#include "common/status.h"

#define REC_HEAD 56u /* f32 label + f32 dense[13] */

/* Header field offsets. */
enum {
  H_MAGIC = 0, H_VERSION = 8, H_FLAGS = 12, H_IDMODE = 16, H_THR = 20, H_N = 24, H_TRAIN = 32,
  H_TEST = 40, H_VAL = 48, H_IDS = 56, H_MIR = 64, H_DICT_OFF = 72, H_DICT_BYTES = 80,
  H_DATA_OFF = 88, H_DATA_BYTES = 96, H_DICT_CRC = 104, H_DATA_CRC = 108, H_TABLES = 112,
  H_DICTN = H_TABLES + 8 * DS_NUM_SPARSE, H_DENSE_LO = H_DICTN + 8 * DS_NUM_SPARSE,
  H_DENSE_HI = H_DENSE_LO + 4, H_CRC = DS_BIN_HEADER_SIZE - 4
};

float ds_bin_dense_max(void) { return (float)log1p((double)INT64_MAX); }

static void putf(unsigned char *p, float v) { memcpy(p, &v, 4); }
static float getf(const unsigned char *p) { float v; memcpy(&v, p, 4); return v; }


static uint32_t crc_of(const unsigned char *p, uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n) {
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

static uint64_t idw_of(uint32_t flags) { return (flags & DS_BIN_ID64) ? 8 : 4; }

/* Fill the derived fields (offsets, sizes) of info. */
static void layout(ds_bin_info *in) {
  uint64_t db = 0;
  for (int c = 0; c < DS_NUM_SPARSE; c++) db += 4 * in->dict_n[c];
  in->dict_off = DS_BIN_HEADER_SIZE;
  in->dict_bytes = db;
  in->data_off = (DS_BIN_HEADER_SIZE + db + 63) & ~(uint64_t)63;
  uint64_t w = idw_of(in->flags);
  if (in->flags & DS_BIN_MULTI)
    in->data_bytes = in->n_samples * REC_HEAD + (in->n_samples * DS_NUM_SPARSE + 1) * 8 +
                     in->total_ids * w;
  else
    in->data_bytes = in->n_samples * (REC_HEAD + DS_NUM_SPARSE * w);
}

uint64_t ds_bin_shuffle_pos(uint64_t i, uint64_t n, uint64_t seed) {
  if (n <= 1) return i;
  int h = 1;
  while ((1ULL << (2 * h)) < n) h++;
  uint64_t mask = (1ULL << h) - 1;
  uint64_t x = i;
  do {
    uint64_t l = x >> h, r = x & mask;
    for (int k = 0; k < 4; k++) {
      uint64_t t = l ^ (sr_mix64(seed ^ ((uint64_t)k << 56) ^ r) & mask);
      l = r;
      r = t;
    }
    x = (l << h) | r;
  } while (x >= n);
  return x;
}

struct ds_bin_writer {
  char *path;
  sr_outfile *out; /* owned: the file under its temporary name, until finished */
  unsigned char *map;
  uint64_t size;
  ds_bin_info info;
  int shuffle;
  uint64_t seed;
  uint64_t next;     /* samples written */
  uint64_t next_id;  /* multi-hot: ids written */
  char err[512];
};

ds_bin_writer *ds_bin_writer_create(const char *path, const ds_bin_info *info,
                                    const ds_criteo_dict *dict, int shuffle, uint64_t seed,
                                    char *err, size_t errlen) {
  ds_bin_writer *w = calloc(1, sizeof *w);
  if (!w) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return NULL;
  }
  w->info = *info;
  w->info.version = DS_BIN_VERSION;
  w->shuffle = shuffle;
  w->seed = seed;
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    w->info.dict_n[c] = 0;
    if (dict) ds_criteo_dict_values(dict, c, &w->info.dict_n[c]);
  }
  layout(&w->info);
  if (shuffle && (w->info.flags & DS_BIN_MULTI)) {
    sr_fmt(err, errlen, "%s: shuffling is supported for one-hot data only", path);
    free(w);
    return NULL;
  }
  if (!(w->path = strdup(path))) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    ds_bin_writer_destroy(w);
    return NULL;
  }
  w->size = w->info.data_off + w->info.data_bytes;
  if (sr_out_open(path, &w->out, err, errlen)) {
    ds_bin_writer_destroy(w);
    return NULL;
  }
  /* The blocks are allocated before the mapping is written: a full disk is
   * this error, never a SIGBUS at a store into the mapping. */
  if (sr_out_reserve(w->out, w->size)) {
    sr_fmt(err, errlen, "%s", sr_out_errmsg(w->out));
    ds_bin_writer_destroy(w);
    return NULL;
  }
  w->map = mmap(NULL, w->size, PROT_READ | PROT_WRITE, MAP_SHARED, sr_out_fd(w->out), 0);
  if (w->map == MAP_FAILED) {
    w->map = NULL;
    sr_fmt(err, errlen, "%s: mmap: %s", path, strerror(errno));
    ds_bin_writer_destroy(w);
    return NULL;
  }
  unsigned char *p = w->map + w->info.dict_off;
  for (int c = 0; c < DS_NUM_SPARSE && dict; c++) {
    uint64_t n;
    const uint32_t *v = ds_criteo_dict_values(dict, c, &n);
    if (n) memcpy(p, v, n * 4);
    p += n * 4;
  }
  return w;
}

int ds_bin_writer_add(ds_bin_writer *w, const ds_batch *b) {
  const ds_bin_info *in = &w->info;
  if (w->next + (uint64_t)b->n > in->n_samples) {
    sr_fmt(w->err, sizeof w->err, "%s: more samples than the %llu announced", w->path,
           (unsigned long long)in->n_samples);
    return SR_ERANGE;
  }
  const uint64_t idw = idw_of(in->flags);
  unsigned char *data = w->map + in->data_off;
  if (in->flags & DS_BIN_MULTI) {
    unsigned char *offs = data + in->n_samples * REC_HEAD;
    unsigned char *ids = offs + (in->n_samples * DS_NUM_SPARSE + 1) * 8;
    for (int i = 0; i < b->n; i++) {
      uint64_t s = w->next++;
      unsigned char *rec = data + s * REC_HEAD;
      memcpy(rec, &b->labels[i], 4);
      memcpy(rec + 4, &b->dense[(size_t)i * DS_NUM_DENSE], 4 * DS_NUM_DENSE);
      for (int f = 0; f < DS_NUM_SPARSE; f++) {
        const uint32_t *o = ds_batch_offsets(b, f);
        sr_put64(offs + (s * DS_NUM_SPARSE + f) * 8, w->next_id);
        if (o[i + 1] - o[i] > DS_MAX_BAG) {
          sr_fmt(w->err, sizeof w->err, "%s: sample %llu C%d has %u ids, more than the %d a bag may hold",
                 w->path, (unsigned long long)s, f + 1, o[i + 1] - o[i], DS_MAX_BAG);
          return SR_EINVAL;
        }
        if (w->next_id + (o[i + 1] - o[i]) > in->total_ids) {
          sr_fmt(w->err, sizeof w->err, "%s: more ids than the %llu announced", w->path,
                 (unsigned long long)in->total_ids);
          return SR_ERANGE;
        }
        for (uint32_t k = o[i]; k < o[i + 1]; k++, w->next_id++) {
          if (idw == 8)
            sr_put64(ids + w->next_id * 8, b->ids[k]);
          else
            sr_put32(ids + w->next_id * 4, (uint32_t)b->ids[k]);
        }
      }
    }
    sr_put64(offs + in->n_samples * DS_NUM_SPARSE * 8, w->next_id);
    return 0;
  }
  const uint64_t rs = REC_HEAD + DS_NUM_SPARSE * idw;
  for (int i = 0; i < b->n; i++) {
    uint64_t s = w->next++;
    uint64_t pos = (w->shuffle && s < in->n_train) ? ds_bin_shuffle_pos(s, in->n_train, w->seed) : s;
    unsigned char *rec = data + pos * rs;
    memcpy(rec, &b->labels[i], 4);
    memcpy(rec + 4, &b->dense[(size_t)i * DS_NUM_DENSE], 4 * DS_NUM_DENSE);
    for (int f = 0; f < DS_NUM_SPARSE; f++) {
      const uint32_t *o = ds_batch_offsets(b, f);
      if (o[i + 1] - o[i] != 1) {
        sr_fmt(w->err, sizeof w->err, "%s: sample %llu feature %d has %u ids in a one-hot file",
               w->path, (unsigned long long)s, f, o[i + 1] - o[i]);
        return SR_EINVAL;
      }
      if (idw == 8)
        sr_put64(rec + REC_HEAD + 8 * f, b->ids[o[i]]);
      else
        sr_put32(rec + REC_HEAD + 4 * f, (uint32_t)b->ids[o[i]]);
    }
  }
  return 0;
}

int ds_bin_writer_finish(ds_bin_writer *w) {
  ds_bin_info *in = &w->info;
  if (w->next != in->n_samples) {
    sr_fmt(w->err, sizeof w->err, "%s: %llu samples written, %llu announced", w->path,
           (unsigned long long)w->next, (unsigned long long)in->n_samples);
    return SR_ESTATE;
  }
  if ((in->flags & DS_BIN_MULTI) && w->next_id != in->total_ids) {
    sr_fmt(w->err, sizeof w->err, "%s: %llu ids written, %llu announced", w->path,
           (unsigned long long)w->next_id, (unsigned long long)in->total_ids);
    return SR_ESTATE;
  }
  in->dict_crc = crc_of(w->map + in->dict_off, in->dict_bytes);
  in->data_crc = crc_of(w->map + in->data_off, in->data_bytes);
  unsigned char *h = w->map;
  memset(h, 0, DS_BIN_HEADER_SIZE);
  memcpy(h + H_MAGIC, DS_BIN_MAGIC, 8);
  sr_put32(h + H_VERSION, in->version);
  sr_put32(h + H_FLAGS, in->flags);
  sr_put32(h + H_IDMODE, in->id_mode);
  sr_put32(h + H_THR, in->freq_threshold);
  sr_put64(h + H_N, in->n_samples);
  sr_put64(h + H_TRAIN, in->n_train);
  sr_put64(h + H_TEST, in->n_test);
  sr_put64(h + H_VAL, in->n_val);
  sr_put64(h + H_IDS, in->total_ids);
  sr_put64(h + H_MIR, in->max_ind_range);
  sr_put64(h + H_DICT_OFF, in->dict_off);
  sr_put64(h + H_DICT_BYTES, in->dict_bytes);
  sr_put64(h + H_DATA_OFF, in->data_off);
  sr_put64(h + H_DATA_BYTES, in->data_bytes);
  sr_put32(h + H_DICT_CRC, in->dict_crc);
  sr_put32(h + H_DATA_CRC, in->data_crc);
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    sr_put64(h + H_TABLES + 8 * c, in->table_sizes[c]);
    sr_put64(h + H_DICTN + 8 * c, in->dict_n[c]);
  }
  if (in->flags & DS_BIN_DENSE_RANGE) {
    putf(h + H_DENSE_LO, in->dense_lo);
    putf(h + H_DENSE_HI, in->dense_hi);
  }
  sr_put32(h + H_CRC, crc_of(h, H_CRC));
  if (msync(w->map, w->size, MS_SYNC) != 0) sr_out_fail(w->out, "cannot write", errno);
  munmap(w->map, w->size);
  w->map = NULL;
  sr_outfile *out = w->out;
  w->out = NULL;
  return sr_out_commit(out, w->err, sizeof w->err) ? SR_EIO : 0;
}

const char *ds_bin_writer_errmsg(const ds_bin_writer *w) { return w->err; }

void ds_bin_writer_destroy(ds_bin_writer *w) {
  if (!w) return;
  if (w->map) munmap(w->map, w->size);
  sr_out_abort(w->out); /* unfinished: its temporary goes */
  free(w->path);
  free(w);
}

/* ---- reader ---- */

struct ds_bin_reader {
  const unsigned char *map;
  uint64_t size;
  int int32;
  int have_range;
  uint64_t id_range[DS_NUM_SPARSE]; /* int32: largest id + 1 per column */
  ds_bin_info info;
  char err[512];
};

/* int32 files: check every record (label 0/1, ids >= 0) and find the id
 * ranges. 0, or SR_EFORMAT with "record i: what" in err. */
static int int32_scan(ds_bin_reader *r, char *err, size_t errlen) {
  for (int c = 0; c < DS_NUM_SPARSE; c++) r->id_range[c] = 0;
  for (uint64_t i = 0; i < r->info.n_samples; i++) {
    int32_t v[40];
    memcpy(v, r->map + i * DS_INT32_RECORD_BYTES, sizeof v);
    if (v[0] != 0 && v[0] != 1) {
      sr_fmt(err, errlen, "record %llu: label %d is not 0 or 1", (unsigned long long)i, v[0]);
      return SR_EFORMAT;
    }
    for (int c = 0; c < DS_NUM_SPARSE; c++) {
      if (v[14 + c] < 0) {
        sr_fmt(err, errlen, "record %llu: categorical C%d id %d is negative", (unsigned long long)i,
               c + 1, v[14 + c]);
        return SR_EFORMAT;
      }
      if ((uint64_t)v[14 + c] + 1 > r->id_range[c]) r->id_range[c] = (uint64_t)v[14 + c] + 1;
    }
  }
  r->have_range = 1;
  return 0;
}

/* Header fields a writer never writes: an unknown id mode or flag, a table
 * of 0 rows where the ids are bounded (dictionary, modulo), a dictionary
 * larger than its table. 0, or SR_EFORMAT with "PATH: header: what". */
static int check_header(const ds_bin_info *in, char *err, size_t errlen, const char *path) {
  if (in->id_mode > DS_IDS_RAW) {
    sr_fmt(err, errlen, "%s: header: id mode %u is not one of 0..%d", path, in->id_mode, DS_IDS_RAW);
    return SR_EFORMAT;
  }
  if (in->flags & ~(DS_BIN_MULTI | DS_BIN_ID64 | DS_BIN_DENSE_RANGE | DS_BIN_NO_LABEL)) {
    sr_fmt(err, errlen, "%s: header: unknown layout flags 0x%x", path, in->flags);
    return SR_EFORMAT;
  }
  if (!(in->dense_lo <= in->dense_hi)) { /* NaN bounds too */
    sr_fmt(err, errlen, "%s: header: dense range [%g, %g] is empty", path, (double)in->dense_lo,
           (double)in->dense_hi);
    return SR_EFORMAT;
  }
  if (in->id_mode == DS_IDS_MODULO && in->max_ind_range == 0) {
    sr_fmt(err, errlen, "%s: header: modulo ids with max_ind_range 0", path);
    return SR_EFORMAT;
  }
  const int bounded = in->id_mode == DS_IDS_DICT || in->id_mode == DS_IDS_MODULO;
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    if (bounded && in->table_sizes[c] == 0) {
      sr_fmt(err, errlen, "%s: header: table C%d has 0 rows (%s ids are bounded)", path, c + 1,
             in->id_mode == DS_IDS_DICT ? "dictionary" : "modulo");
      return SR_EFORMAT;
    }
    if (in->dict_n[c] > (1ULL << 32) ||
        (in->id_mode == DS_IDS_DICT && in->dict_n[c] >= in->table_sizes[c])) {
      sr_fmt(err, errlen, "%s: header: C%d's dictionary of %llu values does not fit its %llu rows",
             path, c + 1, (unsigned long long)in->dict_n[c], (unsigned long long)in->table_sizes[c]);
      return SR_EFORMAT;
    }
  }
  return 0;
}

/* Open and map path into r (size, map). 0, or -1 with the reason in err. */
static int map_file(ds_bin_reader *r, const char *path, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    sr_fmt(err, errlen, "%s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  r->size = (uint64_t)st.st_size;
  if (r->size) {
    /* MAP_POPULATE: map every page now, in bulk; faulting them in one by one
     costs more than reading them on our VMs */
    void *m = mmap(NULL, r->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
      sr_fmt(err, errlen, "%s: mmap: %s", path, strerror(errno));
      close(fd);
      return -1;
    }
    madvise(m, r->size, MADV_SEQUENTIAL);
    r->map = m;
  }
  close(fd);
  return 0;
}

/* The reference DLRM's int32 layout: records of DS_INT32_RECORD_BYTES and
 * no header (verify: every record scanned). 0, or -1 with the reason in err. */
static int int32_open(ds_bin_reader *r, int verify, const char *path, char *err, size_t errlen) {
  ds_bin_info *in = &r->info;
  if (r->size % DS_INT32_RECORD_BYTES) {
    sr_fmt(err, errlen, "%s: torn int32 record file: %llu bytes is not a multiple of %u",
           path, (unsigned long long)r->size, DS_INT32_RECORD_BYTES);
    return -1;
  }
  in->n_samples = in->n_train = r->size / DS_INT32_RECORD_BYTES;
  in->id_mode = DS_IDS_RAW;
  in->data_off = 0;
  in->data_bytes = r->size;
  if (verify) {
    char why[256];
    if (int32_scan(r, why, sizeof why)) {
      sr_fmt(err, errlen, "%s: %s", path, why);
      return -1;
    }
  }
  return 0;
}

/* The header of a shardrec binary: magic, version, checksum, counts and the
 * layout they imply, which must match the file's size. 0, or -1 with the
 * reason in err. */
static int header_read(ds_bin_reader *r, const char *path, char *err, size_t errlen) {
  ds_bin_info *in = &r->info;
  const unsigned char *h = r->map;
  if (r->size < DS_BIN_HEADER_SIZE) {
    if (r->size >= 8 && !memcmp(h, DS_BIN_MAGIC, 8))
      sr_fmt(err, errlen, "%s: truncated: %llu bytes, shorter than the %u-byte header", path,
             (unsigned long long)r->size, DS_BIN_HEADER_SIZE);
    else
      sr_fmt(err, errlen, "%s: not a shardrec binary file (%llu bytes, no header)", path,
             (unsigned long long)r->size);
    return -1;
  }
  if (memcmp(h, DS_BIN_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec binary file (bad magic)", path);
    return -1;
  }
  in->version = sr_get32(h + H_VERSION);
  if (in->version != DS_BIN_VERSION) {
    sr_fmt(err, errlen, "%s: format version %u, this build reads version %u", path, in->version,
           DS_BIN_VERSION);
    return -1;
  }
  if (sr_get32(h + H_CRC) != crc_of(h, H_CRC)) {
    sr_fmt(err, errlen, "%s: header checksum mismatch (corrupt header)", path);
    return -1;
  }
  in->flags = sr_get32(h + H_FLAGS);
  in->id_mode = sr_get32(h + H_IDMODE);
  in->freq_threshold = sr_get32(h + H_THR);
  in->n_samples = sr_get64(h + H_N);
  in->n_train = sr_get64(h + H_TRAIN);
  in->n_test = sr_get64(h + H_TEST);
  in->n_val = sr_get64(h + H_VAL);
  in->total_ids = sr_get64(h + H_IDS);
  in->max_ind_range = sr_get64(h + H_MIR);
  in->dict_crc = sr_get32(h + H_DICT_CRC);
  in->data_crc = sr_get32(h + H_DATA_CRC);
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    in->table_sizes[c] = sr_get64(h + H_TABLES + 8 * c);
    in->dict_n[c] = sr_get64(h + H_DICTN + 8 * c);
  }
  in->dense_lo = 0.0f; /* convert's range, unless the header declares one */
  in->dense_hi = ds_bin_dense_max();
  if (in->flags & DS_BIN_DENSE_RANGE) {
    in->dense_lo = getf(h + H_DENSE_LO);
    in->dense_hi = getf(h + H_DENSE_HI);
  }
  if (check_header(in, err, errlen, path)) return -1;
  ds_bin_info want = *in;
  layout(&want);
  if (want.dict_off != sr_get64(h + H_DICT_OFF) || want.data_off != sr_get64(h + H_DATA_OFF) ||
      want.data_bytes != sr_get64(h + H_DATA_BYTES) ||
      in->n_train + in->n_test + in->n_val != in->n_samples || in->n_samples > (1ULL << 48)) {
    sr_fmt(err, errlen, "%s: inconsistent header (sizes or counts disagree)", path);
    return -1;
  }
  *in = want;
  if (r->size != in->data_off + in->data_bytes) {
    sr_fmt(err, errlen, "%s: %s: %llu bytes, the header says %llu", path,
           r->size < in->data_off + in->data_bytes ? "truncated" : "trailing bytes",
           (unsigned long long)r->size, (unsigned long long)(in->data_off + in->data_bytes));
    return -1;
  }
  return 0;
}

/* A multi-hot file's bag offsets: monotone, in range, each bag at most
 * DS_MAX_BAG ids. 0, or -1 with the reason in err. */
static int offsets_check(const ds_bin_reader *r, const char *path, char *err, size_t errlen) {
  const ds_bin_info *in = &r->info;
  const unsigned char *offs = r->map + in->data_off + in->n_samples * REC_HEAD;
  uint64_t prev = 0, m = in->n_samples * DS_NUM_SPARSE + 1;
  for (uint64_t k = 0; k < m; k++) {
    uint64_t v = sr_get64(offs + 8 * k);
    if (v < prev || v > in->total_ids || (k + 1 == m && v != in->total_ids)) {
      sr_fmt(err, errlen, "%s: corrupt multi-hot offsets at %llu", path, (unsigned long long)k);
      return -1;
    }
    if (k > 0 && v - prev > DS_MAX_BAG) { /* bag k - 1 */
      sr_fmt(err, errlen, "%s: corrupt multi-hot offsets at %llu: sample %llu C%d has %llu ids, "
             "more than the %d a bag may hold", path, (unsigned long long)k,
             (unsigned long long)((k - 1) / DS_NUM_SPARSE), (int)((k - 1) % DS_NUM_SPARSE) + 1,
             (unsigned long long)(v - prev), DS_MAX_BAG);
      return -1;
    }
    prev = v;
  }
  return 0;
}

ds_bin_reader *ds_bin_reader_open(const char *path, int int32_layout, int verify, char *err,
                                  size_t errlen) {
  ds_bin_reader *r = calloc(1, sizeof *r);
  if (!r) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return NULL;
  }
  r->int32 = int32_layout;
  if (map_file(r, path, err, errlen)) {
    free(r);
    return NULL;
  }
  if (int32_layout) {
    if (int32_open(r, verify, path, err, errlen)) goto fail;
    return r;
  }
  if (header_read(r, path, err, errlen)) goto fail;
  const ds_bin_info *in = &r->info;
  if (verify && (crc_of(r->map + in->dict_off, in->dict_bytes) != in->dict_crc ||
                 crc_of(r->map + in->data_off, in->data_bytes) != in->data_crc)) {
    sr_fmt(err, errlen, "%s: checksum mismatch: the file is corrupt", path);
    goto fail;
  }
  if ((in->flags & DS_BIN_MULTI) && offsets_check(r, path, err, errlen)) goto fail;
  return r;
fail:
  ds_bin_reader_destroy(r);
  return NULL;
}

const ds_bin_info *ds_bin_reader_info(const ds_bin_reader *r) { return &r->info; }
const char *ds_bin_reader_errmsg(const ds_bin_reader *r) { return r->err; }

/* Nonzero when a label of b[0, n) is not +-0 or 1 or a dense value is inf
 * or nan (compared as bits) or outside [lo, hi] (loops the compiler
 * vectorises). */
static uint32_t values_bad(const ds_batch *b, int n, float lo, float hi) {
  uint32_t bad = 0;
  for (int i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &b->labels[i], 4);
    bad |= ((u & 0x7fffffffu) != 0) & (u != 0x3f800000u);
  }
  const uint32_t *d = (const uint32_t *)(const void *)b->dense;
  for (size_t k = 0; k < (size_t)n * DS_NUM_DENSE; k++) /* exponent all ones */
    bad |= (int32_t)(d[k] & 0x7fffffffu) > 0x7f7fffff;
  for (size_t k = 0; k < (size_t)n * DS_NUM_DENSE; k++)
    bad |= (uint32_t)(b->dense[k] < lo) | (uint32_t)(b->dense[k] > hi);
  return bad;
}

/* The split record rec of the file is in: "train", "test" or "val". */
static const char *split_of(const ds_bin_info *in, uint64_t rec) {
  return rec < in->n_train ? "train" : rec < in->n_train + in->n_test ? "test" : "val";
}

/* What is wrong with record i of b (one of values_bad's or check_batch's
 * findings) into what; 0 when nothing is. */
static int record_fault(const ds_bin_info *in, const ds_batch *b, int i, char *what, size_t len) {
  float l = b->labels[i];
  if (l != 0.0f && l != 1.0f) {
    sr_fmt(what, len, "label %g is not 0 or 1", (double)l);
    return 1;
  }
  for (int k = 0; k < DS_NUM_DENSE; k++) {
    float v = b->dense[(size_t)i * DS_NUM_DENSE + k];
    if (!isfinite(v)) {
      sr_fmt(what, len, "dense I%d is %g, not a finite number", k + 1, (double)v);
      return 1;
    }
    if (v < in->dense_lo || v > in->dense_hi) {
      sr_fmt(what, len, "dense I%d is %g, outside [%g, %g], the range %s", k + 1, (double)v,
             (double)in->dense_lo, (double)in->dense_hi,
             (in->flags & DS_BIN_DENSE_RANGE) ? "the file's header declares"
                                             : "convert writes (log1p of the integer)");
      return 1;
    }
  }
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    const uint32_t *o = ds_batch_offsets(b, f);
    const uint64_t ts = in->table_sizes[f];
    for (uint32_t k = o[i]; k < o[i + 1]; k++)
      if (ts && b->ids[k] >= ts) {
        sr_fmt(what, len, "C%d id %llu is outside its table of %llu rows", f + 1,
               (unsigned long long)b->ids[k], (unsigned long long)ts);
        return 1;
      }
  }
  return 0;
}

/* Record index + i of b, which check_batch found wrong: "record R: what
 * (S split)" into r->err for the first wrong field in file order. */
static int report_record(ds_bin_reader *r, uint64_t index, const ds_batch *b) {
  char what[256];
  for (int i = 0; i < b->n; i++) {
    uint64_t rec = index + (uint64_t)i;
    if (record_fault(&r->info, b, i, what, sizeof what)) {
      sr_fmt(r->err, sizeof r->err, "record %llu: %s (%s split)", (unsigned long long)rec, what,
             split_of(&r->info, rec));
      break;
    }
  }
  return SR_EFORMAT;
}

/* A bin file's samples in b are what a writer writes: labels 0 or 1,
 * finite dense values within the file's range, ids within their tables (size 0: unbounded). One
 * branch-free pass; the message only when something is wrong. */
static int check_batch(ds_bin_reader *r, uint64_t index, const ds_batch *b) {
  const int n = b->n;
  uint32_t bad = values_bad(b, n, r->info.dense_lo, r->info.dense_hi);
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    const uint64_t size = r->info.table_sizes[f];
    const uint32_t *o = ds_batch_offsets(b, f);
    if (size)
      for (uint32_t k = o[0]; k < o[n]; k++) bad |= b->ids[k] >= size;
  }
  return bad ? report_record(r, index, b) : 0;
}

static int read_records(ds_bin_reader *r, uint64_t index, int n, uint64_t mod, ds_batch *b);

/* Samples [index, index + n) into b, then (bin files) checked: int32 and
 * one-hot records as they are read (1 from read_records: one is wrong),
 * multi-hot ones after. */
int ds_bin_reader_read(ds_bin_reader *r, uint64_t index, int n, uint64_t mod, ds_batch *b) {
  int rc = read_records(r, index, n, mod, b);
  if (rc == 1) return report_record(r, index, b);
  if (rc || r->int32 || !(r->info.flags & DS_BIN_MULTI)) return rc;
  return check_batch(r, index, b);
}

/* one-hot: feature f's ids are ids[f*n .. f*n+n) */
static void one_hot_offsets(ds_batch *b, int n) {
  for (int f = 0; f < DS_NUM_SPARSE; f++) {
    uint32_t *o = ds_batch_offsets(b, f);
    for (int i = 0; i <= n; i++) o[i] = (uint32_t)(f * n + i);
  }
}

static int read_records(ds_bin_reader *r, uint64_t index, int n, uint64_t mod, ds_batch *b) {
  const ds_bin_info *in = &r->info;
  if (n < 0 || n > b->cap || index + (uint64_t)n > in->n_samples) {
    sr_fmt(r->err, sizeof r->err, "records %llu..%llu: outside the file's %llu or the batch's %d",
           (unsigned long long)index, (unsigned long long)index + (unsigned long long)(n > 0 ? n : 0),
           (unsigned long long)in->n_samples, b->cap);
    return SR_ERANGE;
  }
  const unsigned char *data = r->map + in->data_off;
  b->n = n;
  b->first_index = index;
  if (r->int32) {
    for (int i = 0; i < n; i++) {
      const unsigned char *rec = data + (index + (uint64_t)i) * DS_INT32_RECORD_BYTES;
      int32_t v[40];
      memcpy(v, rec, sizeof v);
      if (v[0] != 0 && v[0] != 1) {
        sr_fmt(r->err, sizeof r->err, "record %llu: label %d is not 0 or 1",
               (unsigned long long)(index + (uint64_t)i), v[0]);
        return SR_EFORMAT;
      }
      b->labels[i] = (float)v[0];
      for (int k = 0; k < DS_NUM_DENSE; k++)
        b->dense[(size_t)i * DS_NUM_DENSE + k] = v[1 + k] > 0 ? (float)log1p((double)v[1 + k]) : 0.0f;
      for (int f = 0; f < DS_NUM_SPARSE; f++) {
        if (v[14 + f] < 0) {
          sr_fmt(r->err, sizeof r->err, "record %llu: categorical C%d id %d is negative",
                 (unsigned long long)(index + (uint64_t)i), f + 1, v[14 + f]);
          return SR_EFORMAT;
        }
        uint64_t id = (uint64_t)v[14 + f];
        b->ids[(size_t)f * n + i] = mod ? id % mod : id;
      }
    }
  } else if (in->flags & DS_BIN_MULTI) {
    const unsigned char *offs = data + in->n_samples * REC_HEAD;
    const unsigned char *ids = offs + (in->n_samples * DS_NUM_SPARSE + 1) * 8;
    const uint64_t idw = idw_of(in->flags);
    for (int i = 0; i < n; i++) {
      const unsigned char *rec = data + (index + (uint64_t)i) * REC_HEAD;
      memcpy(&b->labels[i], rec, 4);
      memcpy(&b->dense[(size_t)i * DS_NUM_DENSE], rec + 4, 4 * DS_NUM_DENSE);
    }
    size_t total = 0;
    for (int f = 0; f < DS_NUM_SPARSE; f++)
      for (int i = 0; i < n; i++) {
        uint64_t k = (index + (uint64_t)i) * DS_NUM_SPARSE + (uint64_t)f;
        total += sr_get64(offs + 8 * (k + 1)) - sr_get64(offs + 8 * k);
      }
    if (ds_batch_reserve_ids(b, total)) {
      sr_fmt(r->err, sizeof r->err, "records %llu..%llu: out of memory for %zu ids",
             (unsigned long long)index, (unsigned long long)index + (unsigned long long)n, total);
      return SR_ENOMEM;
    }
    size_t pos = 0;
    for (int f = 0; f < DS_NUM_SPARSE; f++) {
      uint32_t *o = ds_batch_offsets(b, f);
      for (int i = 0; i < n; i++) {
        uint64_t k = (index + (uint64_t)i) * DS_NUM_SPARSE + (uint64_t)f;
        uint64_t a = sr_get64(offs + 8 * k), e = sr_get64(offs + 8 * (k + 1));
        o[i] = (uint32_t)pos;
        for (uint64_t j = a; j < e; j++)
          b->ids[pos++] = idw == 8 ? sr_get64(ids + 8 * j) : sr_get32(ids + 4 * j);
      }
      o[n] = (uint32_t)pos;
    }
    return 0;
  } else {
    const uint64_t idw = idw_of(in->flags), rs = REC_HEAD + DS_NUM_SPARSE * idw;
    const unsigned char *base = data + index * rs;
    uint32_t bad = 0; /* the checks of check_batch, done while the records are copied */
    for (int i = 0; i < n; i++) {
      const unsigned char *rec = base + (uint64_t)i * rs;
      memcpy(&b->labels[i], rec, 4);
      memcpy(&b->dense[(size_t)i * DS_NUM_DENSE], rec + 4, 4 * DS_NUM_DENSE);
    }
    bad = values_bad(b, n, in->dense_lo, in->dense_hi);
    /* Transpose records to feature-major ids in tiles of 64 samples: writing
     * one id into each of 26 rows per sample would hit 26 addresses a power of
     * two apart (the same cache set) for power-of-two batch sizes. */
    for (int t0 = 0; t0 < n; t0 += 64) {
      int t1 = t0 + 64 < n ? t0 + 64 : n;
      for (int f = 0; f < DS_NUM_SPARSE; f++) {
        uint64_t *dst = b->ids + (size_t)f * n;
        /* ids within their tables (size 0: unbounded): the largest, kept as the
         * ids are copied (a pass over b->ids after would read it back from
         * memory: 26 x 8 bytes a sample) */
        const uint64_t top = in->table_sizes[f] ? in->table_sizes[f] - 1 : UINT64_MAX;
        uint64_t m = 0;
        if (idw == 4)
          for (int i = t0; i < t1; i++) {
            uint64_t x = sr_get32(base + (uint64_t)i * rs + REC_HEAD + 4 * f);
            dst[i] = x;
            m = x > m ? x : m;
          }
        else
          for (int i = t0; i < t1; i++) {
            uint64_t x = sr_get64(base + (uint64_t)i * rs + REC_HEAD + 8 * f);
            dst[i] = x;
            m = x > m ? x : m;
          }
        bad |= m > top;
      }
    }
    one_hot_offsets(b, n);
    return bad ? 1 : 0;
  }
  one_hot_offsets(b, n);
  return 0;
}

ds_criteo_dict *ds_bin_reader_dict(ds_bin_reader *r) {
  const ds_bin_info *in = &r->info;
  sr_fmt(r->err, sizeof r->err, "no dictionaries in the file");
  if (r->int32 || in->id_mode != DS_IDS_DICT) return NULL;
  const uint32_t *vals[DS_NUM_SPARSE];
  uint32_t *copy = malloc(in->dict_bytes ? in->dict_bytes : 4); /* alignment-safe copy */
  sr_fmt(r->err, sizeof r->err, "out of memory loading the dictionaries");
  if (!copy) return NULL;
  memcpy(copy, r->map + in->dict_off, in->dict_bytes);
  uint64_t off = 0;
  for (int c = 0; c < DS_NUM_SPARSE; c++) {
    vals[c] = copy + off;
    off += in->dict_n[c];
  }
  char why[256];
  ds_criteo_dict *d = ds_criteo_dict_from_values(vals, in->dict_n, why, sizeof why);
  if (!d) sr_fmt(r->err, sizeof r->err, "dictionary %s", why);
  free(copy);
  return d;
}

void ds_bin_reader_id_range(ds_bin_reader *r, uint64_t *sizes) {
  for (int c = 0; c < DS_NUM_SPARSE; c++) sizes[c] = 0;
  if (!r->int32) return;
  if (!r->have_range) { /* not verified at open: a pass now, ranges of what is there */
    char why[256];
    int32_scan(r, why, sizeof why);
  }
  memcpy(sizes, r->id_range, sizeof r->id_range);
}

void ds_bin_reader_destroy(ds_bin_reader *r) {
  if (!r) return;
  if (r->map) munmap((void *)r->map, r->size);
  free(r);
}
