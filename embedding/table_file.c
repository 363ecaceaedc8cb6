/* The embedding table file (see table_file.h). */
#include "embedding/table_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/fs.h"
#include "common/half.h"
#include "common/sha256.h"
#include "common/status.h"
#include "embedding/optim.h"

#define TF_MAGIC "SREMBTAB"
#define TF_CHUNK 1024 /* records per read, per write and per digest update */


/* What a file of tb holds, as its header says it. */
typedef struct {
  uint32_t table_id, dim, slen, kind;
  size_t rec;    /* bytes per record */
  uint32_t prec; /* emb_precision: 0 (version 1, float weights) or 16-bit (version 2) */
} tf_shape;

static tf_shape shape_of(const emb_table *tb) {
  int slen = emb_optim_state_len(&tb->optim, tb->dim);
  size_t wb = (size_t)emb_precision_bytes(tb->precision);
  return (tf_shape){tb->table_id, (uint32_t)tb->dim, (uint32_t)slen, (uint32_t)tb->optim.kind,
                    8 + wb * (size_t)tb->dim + 4 * (size_t)slen, (uint32_t)tb->precision};
}

/* Weights vals[n] into the record's 16-bit values at p (unaligned), and back. */
static void w16_put(uint32_t prec, const float *vals, uint32_t n, unsigned char *p) {
  uint16_t h[64];
  for (uint32_t j = 0; j < n; j += 64) {
    size_t m = n - j < 64 ? n - j : 64;
    if (prec == EMB_PREC_FP16) sr_f16_encode(vals + j, h, m, SR_HALF_AUTO);
    else sr_bf16_encode(vals + j, h, m);
    memcpy(p + 2 * (size_t)j, h, 2 * m);
  }
}

static void w16_get(uint32_t prec, const unsigned char *p, uint32_t n, float *vals) {
  uint16_t h[64];
  for (uint32_t j = 0; j < n; j += 64) {
    size_t m = n - j < 64 ? n - j : 64;
    memcpy(h, p + 2 * (size_t)j, 2 * m);
    if (prec == EMB_PREC_FP16) sr_f16_decode(h, vals + j, m, SR_HALF_AUTO);
    else sr_bf16_decode(h, vals + j, m);
  }
}

/* ---- writing ---- */

struct emb_tabfile_writer {
  FILE *f;
  char path[4096], tmp[4200];
  unsigned char hdr[EMB_TABFILE_HEADER];
  tf_shape sh;
  uint64_t want, n, last; /* rows declared (or COUNT_LATER), put, last row id */
  sr_sha256_ctx h;        /* streaming digest (rows declared) */
  int hashing;            /* h is live */
  unsigned char *buf;     /* [TF_CHUNK][rec] */
  size_t fill;
};

static int w_flush(emb_tabfile_writer *w) {
  if (!w->fill) return 0;
  size_t bytes = w->fill * w->sh.rec;
  if (w->hashing) sr_sha256_update(&w->h, w->buf, bytes);
  w->fill = 0;
  return fwrite(w->buf, 1, bytes, w->f) == bytes ? 0 : SR_EIO;
}

int emb_tabfile_create(const char *path, const emb_table *tb, const char *model_fp,
                       uint64_t n_rows, emb_tabfile_writer **out, char *err, size_t errlen) {
  *out = NULL;
  emb_tabfile_writer *w = calloc(1, sizeof *w);
  if (!w) goto nomem;
  w->sh = shape_of(tb);
  w->want = n_rows;
  if (sr_path_err(w->path, sizeof w->path, err, errlen, "%s", path) ||
      sr_path_err(w->tmp, sizeof w->tmp, err, errlen, "%s.tmp.%ld", path, (long)getpid())) {
    free(w);
    return SR_ERANGE;
  }
  memcpy(w->hdr, TF_MAGIC, 8);
  sr_put32(w->hdr + 8, w->sh.prec ? EMB_TABFILE_VERSION_16 : EMB_TABFILE_VERSION);
  sr_put32(w->hdr + 112, w->sh.prec);
  sr_put32(w->hdr + 12, EMB_TABFILE_HEADER);
  sr_put32(w->hdr + 16, w->sh.table_id);
  sr_put32(w->hdr + 20, w->sh.dim);
  sr_put32(w->hdr + 24, w->sh.slen);
  sr_put32(w->hdr + 28, w->sh.kind);
  sr_put64(w->hdr + 32, n_rows == EMB_TABFILE_COUNT_LATER ? 0 : n_rows);
  sr_put64(w->hdr + 40, (uint64_t)w->sh.rec);
  memcpy(w->hdr + 48, model_fp, 64);
  if (!(w->buf = malloc(TF_CHUNK * w->sh.rec))) goto nomem;
  if (n_rows != EMB_TABFILE_COUNT_LATER) {
    if (sr_sha256_init(&w->h)) goto nomem;
    w->hashing = 1;
  }
  if (!(w->f = fopen(w->tmp, n_rows == EMB_TABFILE_COUNT_LATER ? "w+b" : "wb")) ||
      fwrite(w->hdr, 1, sizeof w->hdr, w->f) != sizeof w->hdr) {
    sr_fmt(err, errlen, "%s: cannot write: %s", w->tmp, strerror(errno));
    emb_tabfile_abort(w);
    return SR_EIO;
  }
  if (w->hashing) sr_sha256_update(&w->h, w->hdr, sizeof w->hdr);
  *out = w;
  return 0;
nomem:
  sr_fmt(err, errlen, "%s: out of memory", path);
  emb_tabfile_abort(w);
  return SR_ENOMEM;
}

int emb_tabfile_put(emb_tabfile_writer *w, uint64_t row_id, const float *vals, char *err,
                    size_t errlen) {
  if (w->n && row_id <= w->last) {
    sr_fmt(err, errlen, "%s: row id %llu after %llu: records must ascend", w->path,
           (unsigned long long)row_id, (unsigned long long)w->last);
    return SR_EINVAL;
  }
  if (w->want != EMB_TABFILE_COUNT_LATER && w->n == w->want) {
    sr_fmt(err, errlen, "%s: more than the %llu records declared", w->path,
           (unsigned long long)w->want);
    return SR_EINVAL;
  }
  unsigned char *p = w->buf + w->fill * w->sh.rec;
  sr_put64(p, row_id);
  if (w->sh.prec) {
    w16_put(w->sh.prec, vals, w->sh.dim, p + 8);
    memcpy(p + 8 + 2 * (size_t)w->sh.dim, vals + w->sh.dim, 4 * (size_t)w->sh.slen);
  } else {
    memcpy(p + 8, vals, w->sh.rec - 8);
  }
  w->n++;
  w->last = row_id;
  if (++w->fill == TF_CHUNK && w_flush(w)) {
    sr_fmt(err, errlen, "%s: cannot write: %s", w->tmp, strerror(errno));
    return SR_EIO;
  }
  return 0;
}

uint64_t emb_tabfile_written(const emb_tabfile_writer *w) { return w->n; }

/* COUNT_LATER: the real count into the header, then the digest of the whole
 * file read back. */
static int w_digest_back(emb_tabfile_writer *w, unsigned char dig[32]) {
  sr_put64(w->hdr + 32, w->n);
  if (fflush(w->f) || fseek(w->f, 0, SEEK_SET) || fwrite(w->hdr, 1, sizeof w->hdr, w->f) != sizeof w->hdr ||
      fflush(w->f) || fseek(w->f, 0, SEEK_SET))
    return SR_EIO;
  sr_sha256_ctx h;
  unsigned char *buf = malloc(1 << 20);
  if (!buf) return SR_ENOMEM;
  int rc = sr_sha256_init(&h);
  if (!rc) {
    size_t got;
    while ((got = fread(buf, 1, 1 << 20, w->f)) > 0) sr_sha256_update(&h, buf, got);
    rc = sr_sha256_final(&h, dig); /* a failed update is reported here */
    if (!rc && (ferror(w->f) || fseek(w->f, 0, SEEK_END))) rc = SR_EIO;
  }
  free(buf);
  return rc;
}

int emb_tabfile_commit(emb_tabfile_writer *w, char *err, size_t errlen) {
  if (w->want != EMB_TABFILE_COUNT_LATER && w->n != w->want) {
    sr_fmt(err, errlen, "%s: %llu records put, %llu declared", w->path, (unsigned long long)w->n,
           (unsigned long long)w->want);
    emb_tabfile_abort(w);
    return SR_EINVAL;
  }
  unsigned char dig[32];
  int rc = w_flush(w);
  if (!rc && w->hashing) {
    w->hashing = 0;
    rc = sr_sha256_final(&w->h, dig);
  } else if (!rc) {
    rc = w_digest_back(w, dig);
  }
  if (!rc && (fwrite(dig, 1, 32, w->f) != 32 || fflush(w->f) || fsync(fileno(w->f)))) rc = SR_EIO;
  if (fclose(w->f) && !rc) rc = SR_EIO;
  w->f = NULL;
  if (!rc && rename(w->tmp, w->path)) rc = SR_EIO;
  if (rc) {
    sr_fmt(err, errlen, "%s: cannot write: %s", w->path,
           rc == SR_ENOMEM ? "out of memory" : strerror(errno));
    emb_tabfile_abort(w);
    return rc;
  }
  free(w->buf);
  free(w);
  return 0;
}

void emb_tabfile_abort(emb_tabfile_writer *w) {
  if (!w) return;
  if (w->f) fclose(w->f);
  if (w->tmp[0]) unlink(w->tmp);
  if (w->hashing) sr_sha256_abort(&w->h);
  free(w->buf);
  free(w);
}

/* ---- reading ---- */

struct emb_tabfile_reader {
  FILE *f;
  char path[4096];
  tf_shape sh;
  uint64_t rows;        /* the table's bound (EMB_ROWS_UNBOUNDED: none) */
  uint64_t n, next;     /* records in the file, records read into buf so far */
  uint64_t prev;        /* the last row id returned */
  unsigned char *buf;   /* [TF_CHUNK][rec] */
  size_t have, at;      /* records in buf, the next one to return */
  float *vals;          /* [dim + slen]: a 16-bit record's values as floats (NULL for fp32) */
  sr_sha256_ctx h;
  int hashing;
};

/* The header and the size against r->sh and model_fp; r->f open. */
static int r_check(emb_tabfile_reader *r, const char *model_fp, char *err, size_t errlen) {
  const char *p = r->path;
  unsigned char h[EMB_TABFILE_HEADER];
  struct stat st;
  if (fstat(fileno(r->f), &st) != 0 || (size_t)st.st_size < EMB_TABFILE_HEADER + EMB_TABFILE_TRAILER ||
      fread(h, 1, sizeof h, r->f) != sizeof h) {
    sr_fmt(err, errlen, "%s: too short to be a table file (torn write?)", p);
    return SR_EFORMAT;
  }
  if (memcmp(h, TF_MAGIC, 8) != 0) {
    sr_fmt(err, errlen, "%s: not a shardrec embedding table file (bad magic)", p);
    return SR_EFORMAT;
  }
  const uint32_t ver = sr_get32(h + 8);
  if ((ver != EMB_TABFILE_VERSION && ver != EMB_TABFILE_VERSION_16) ||
      sr_get32(h + 12) != EMB_TABFILE_HEADER) {
    sr_fmt(err, errlen, "%s: format version %u is not supported (this build reads %u and %u)", p,
           ver, EMB_TABFILE_VERSION, EMB_TABFILE_VERSION_16);
    return SR_EVERSION;
  }
  const tf_shape *w = &r->sh;
  const uint32_t fprec = ver == EMB_TABFILE_VERSION ? 0 : sr_get32(h + 112);
  if (ver == EMB_TABFILE_VERSION_16 && (fprec < EMB_PREC_FP16 || fprec > EMB_PREC_BF16)) {
    sr_fmt(err, errlen, "%s: format version 2 with weights %u is not supported", p, fprec);
    return SR_EVERSION;
  }
  if (fprec != w->prec) {
    sr_fmt(err, errlen, "%s: holds %s weights, the plan's table_id %u is %s", p,
           fprec <= EMB_PREC_BF16 ? emb_precision_name((emb_precision)fprec) : "unknown",
           w->table_id, emb_precision_name((emb_precision)w->prec));
    return SR_EMISMATCH;
  }
  if (sr_get32(h + 16) != w->table_id || sr_get32(h + 20) != w->dim || sr_get32(h + 24) != w->slen ||
      sr_get32(h + 28) != w->kind || sr_get64(h + 40) != (uint64_t)w->rec) {
    sr_fmt(err, errlen,
           "%s: holds table_id %u dim %u state %u, the plan wants table_id %u dim %u state %u",
           p, sr_get32(h + 16), sr_get32(h + 20), sr_get32(h + 24), w->table_id, w->dim, w->slen);
    return SR_EMISMATCH;
  }
  if (memcmp(h + 48, model_fp, 64) != 0) {
    sr_fmt(err, errlen, "%s: written under model fingerprint %.12s..., this plan's is %.12s...", p,
           (const char *)(h + 48), model_fp);
    return SR_EMISMATCH;
  }
  r->n = sr_get64(h + 32);
  uint64_t max = ((uint64_t)st.st_size - EMB_TABFILE_HEADER) / w->rec;
  if (r->n > max || (uint64_t)st.st_size != EMB_TABFILE_HEADER + r->n * w->rec + EMB_TABFILE_TRAILER) {
    sr_fmt(err, errlen, "%s: size %lld, expected %llu for %llu rows (torn or truncated file)", p,
           (long long)st.st_size,
           (unsigned long long)(EMB_TABFILE_HEADER + r->n * w->rec + EMB_TABFILE_TRAILER),
           (unsigned long long)r->n);
    return SR_EFORMAT;
  }
  sr_sha256_update(&r->h, h, sizeof h);
  return 0;
}

int emb_tabfile_open(const char *path, const emb_table *tb, const char *model_fp,
                     emb_tabfile_reader **out, char *err, size_t errlen) {
  *out = NULL;
  emb_tabfile_reader *r = calloc(1, sizeof *r);
  if (!r) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  if (sr_path_err(r->path, sizeof r->path, err, errlen, "%s", path)) {
    free(r);
    return SR_ERANGE;
  }
  r->sh = shape_of(tb);
  r->rows = tb->rows;
  if (!(r->f = fopen(path, "rb"))) {
    int e = errno;
    sr_fmt(err, errlen, "%s: cannot open: %s", path, strerror(e));
    free(r);
    return e == ENOENT ? SR_ENOTFOUND : SR_EIO;
  }
  int rc = 0;
  r->buf = malloc(TF_CHUNK * r->sh.rec);
  if (r->sh.prec) r->vals = malloc((size_t)(r->sh.dim + r->sh.slen) * sizeof *r->vals);
  if (r->buf && (r->vals || !r->sh.prec) && !sr_sha256_init(&r->h)) r->hashing = 1;
  if (!r->hashing) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    rc = SR_ENOMEM;
  }
  if (!rc) rc = r_check(r, model_fp, err, errlen);
  if (rc) {
    emb_tabfile_close(r);
    return rc;
  }
  *out = r;
  return 0;
}

uint64_t emb_tabfile_rows(const emb_tabfile_reader *r) { return r->n; }
const char *emb_tabfile_path(const emb_tabfile_reader *r) { return r->path; }

/* The trailer against the digest of everything read. */
static int r_trailer(emb_tabfile_reader *r, char *err, size_t errlen) {
  unsigned char dig[32], want[32];
  r->hashing = 0;
  int rc = sr_sha256_final(&r->h, dig);
  if (rc) {
    sr_fmt(err, errlen, "%s: SHA-256 failed: %s", r->path, sr_strerror(rc));
    return rc;
  }
  if (fread(want, 1, 32, r->f) != 32 || memcmp(dig, want, 32) != 0) {
    sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", r->path);
    return SR_ECHECKSUM;
  }
  return 0;
}

/* The next record, order and range unchecked: 1, 0 at the end (trailer not
 * yet checked), SR_EIO. */
static int r_next(emb_tabfile_reader *r, uint64_t *row_id, const float **vals, char *err,
                  size_t errlen) {
  if (r->at == r->have) {
    if (r->next == r->n) return 0;
    size_t m = r->n - r->next < TF_CHUNK ? (size_t)(r->n - r->next) : TF_CHUNK;
    if (fread(r->buf, r->sh.rec, m, r->f) != m) {
      sr_fmt(err, errlen, "%s: read error", r->path);
      return SR_EIO;
    }
    sr_sha256_update(&r->h, r->buf, m * r->sh.rec);
    r->have = m;
    r->at = 0;
    r->next += m;
  }
  const unsigned char *p = r->buf + r->at++ * r->sh.rec;
  *row_id = sr_get64(p);
  if (r->sh.prec) {
    w16_get(r->sh.prec, p + 8, r->sh.dim, r->vals);
    memcpy(r->vals + r->sh.dim, p + 8 + 2 * (size_t)r->sh.dim, 4 * (size_t)r->sh.slen);
    *vals = r->vals;
  } else {
    *vals = (const float *)(const void *)(p + 8); /* rec is a multiple of 4: aligned */
  }
  return 1;
}

/* Record index of the record r_next just returned. */
static uint64_t r_index(const emb_tabfile_reader *r) { return r->next - r->have + r->at - 1; }

/* Is the record r_next just returned out of order or range? SR_EFORMAT. */
static int r_order(emb_tabfile_reader *r, uint64_t id, char *err, size_t errlen) {
  uint64_t i = r_index(r);
  int bad = (i > 0 && id <= r->prev) || (r->rows != EMB_ROWS_UNBOUNDED && id >= r->rows);
  r->prev = id;
  if (!bad) return 0;
  sr_fmt(err, errlen, "%s: record %llu: row id %llu out of order or range", r->path,
         (unsigned long long)i, (unsigned long long)id);
  return SR_EFORMAT;
}

int emb_tabfile_next(emb_tabfile_reader *r, uint64_t *row_id, const float **vals, char *err,
                     size_t errlen) {
  int rc = r_next(r, row_id, vals, err, errlen);
  if (rc == 1) {
    int bad = r_order(r, *row_id, err, errlen);
    return bad ? bad : 1;
  }
  return rc ? rc : r_trailer(r, err, errlen);
}

int emb_tabfile_read_all(emb_tabfile_reader *r, emb_tabfile_fn fn, void *ctx, char *err,
                         size_t errlen) {
  char first[1024] = "";
  int bad = 0, rc;
  uint64_t id;
  const float *v;
  while ((rc = r_next(r, &id, &v, err, errlen)) == 1) {
    if (!bad) bad = r_order(r, id, first, sizeof first);
    int stop = fn(ctx, id, v);
    if (stop) return stop;
  }
  if (!rc) rc = r_trailer(r, err, errlen);
  if (!rc && bad) {
    sr_fmt(err, errlen, "%s", first);
    rc = bad;
  }
  return rc;
}

int emb_tabfile_read(const char *path, const emb_table *tb, const char *model_fp,
                     emb_tabfile_fn fn, void *ctx, char *err, size_t errlen) {
  emb_tabfile_reader *r;
  int rc = emb_tabfile_open(path, tb, model_fp, &r, err, errlen);
  if (rc) return rc;
  rc = emb_tabfile_read_all(r, fn, ctx, err, errlen);
  emb_tabfile_close(r);
  return rc;
}

void emb_tabfile_close(emb_tabfile_reader *r) {
  if (!r) return;
  if (r->f) fclose(r->f);
  if (r->hashing) sr_sha256_abort(&r->h);
  free(r->buf);
  free(r->vals);
  free(r);
}
