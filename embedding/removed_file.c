/* The removed-rows file (embedding/removed_file.h). */
#include "embedding/removed_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "common/status.h"

#define RM_MAGIC "SREMBRMV"
#define RM_TRAILER 32u


static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void emb_rmfile_sort_unique(uint64_t *ids, size_t *n) {
  if (*n < 2) return;
  qsort(ids, *n, sizeof *ids, cmp_u64);
  size_t k = 1;
  for (size_t i = 1; i < *n; i++)
    if (ids[i] != ids[k - 1]) ids[k++] = ids[i];
  *n = k;
}

int emb_rmfile_write(const char *path, const emb_table *tb, const char *model_fp,
                     const uint64_t *ids, size_t n, char *err, size_t errlen) {
  for (size_t i = 1; i < n; i++)
    if (ids[i] <= ids[i - 1]) {
      sr_fmt(err, errlen, "%s: removed row ids not ascending at index %zu", path, i);
      return SR_EINVAL;
    }
  char tmp[4200];
  if (sr_path_err(tmp, sizeof tmp, err, errlen, "%s.tmp.%ld", path, (long)getpid()))
    return SR_ERANGE;
  size_t bytes = EMB_RMFILE_HEADER + n * 8 + RM_TRAILER;
  unsigned char *buf = calloc(1, bytes); /* owned here */
  if (!buf) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  memcpy(buf, RM_MAGIC, 8);
  sr_put32(buf + 8, EMB_RMFILE_VERSION);
  sr_put32(buf + 12, tb->table_id);
  sr_put64(buf + 16, (uint64_t)n);
  memcpy(buf + 24, model_fp, 64);
  for (size_t i = 0; i < n; i++) sr_put64(buf + EMB_RMFILE_HEADER + i * 8, ids[i]);
  int rc = sr_sha256(buf, bytes - RM_TRAILER, buf + bytes - RM_TRAILER) ? SR_ENOMEM : 0;
  FILE *f = rc ? NULL : fopen(tmp, "wb");
  if (!rc && (!f || fwrite(buf, 1, bytes, f) != bytes || fflush(f) || fsync(fileno(f))))
    rc = SR_EIO;
  if (f && fclose(f) && !rc) rc = SR_EIO;
  if (!rc && rename(tmp, path)) rc = SR_EIO;
  if (rc) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path,
           rc == SR_ENOMEM ? "out of memory" : strerror(errno));
    unlink(tmp);
  }
  free(buf);
  return rc;
}

/* The header of buf[len] (path's) against table tb and model_fp. */
static int check_header(const char *path, const unsigned char *buf, size_t len,
                        const emb_table *tb, const char *model_fp, char *err, size_t errlen) {
  if (len < EMB_RMFILE_HEADER + RM_TRAILER) {
    sr_fmt(err, errlen, "%s: too short to be a removed-rows file (torn write?)", path);
    return SR_EFORMAT;
  }
  if (memcmp(buf, RM_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec removed-rows file (bad magic)", path);
    return SR_EFORMAT;
  }
  if (sr_get32(buf + 8) != EMB_RMFILE_VERSION) {
    sr_fmt(err, errlen, "%s: format version %u is not supported (this build reads %u)", path,
           sr_get32(buf + 8), EMB_RMFILE_VERSION);
    return SR_EVERSION;
  }
  if (sr_get32(buf + 12) != tb->table_id) {
    sr_fmt(err, errlen, "%s: holds table_id %u, the plan wants table_id %u", path,
           sr_get32(buf + 12), tb->table_id);
    return SR_EMISMATCH;
  }
  if (memcmp(buf + 24, model_fp, 64)) {
    sr_fmt(err, errlen, "%s: written under model fingerprint %.12s..., this plan's is %.12s...",
           path, (const char *)(buf + 24), model_fp);
    return SR_EMISMATCH;
  }
  uint64_t n = sr_get64(buf + 16);
  if (n > (len - EMB_RMFILE_HEADER - RM_TRAILER) / 8 ||
      len != EMB_RMFILE_HEADER + n * 8 + RM_TRAILER) {
    sr_fmt(err, errlen, "%s: size %zu, expected %llu for %llu ids (torn or truncated file)", path,
           len, (unsigned long long)(EMB_RMFILE_HEADER + n * 8 + RM_TRAILER),
           (unsigned long long)n);
    return SR_EFORMAT;
  }
  return 0;
}

int emb_rmfile_read(const char *path, const emb_table *tb, const char *model_fp, uint64_t **ids,
                    size_t *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (!sr_is_file(path)) return 0;
  size_t len;
  unsigned char *buf = (unsigned char *)sr_read_file(path, &len); /* owned here */
  if (!buf) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return SR_EIO;
  }
  int rc = check_header(path, buf, len, tb, model_fp, err, errlen);
  unsigned char dig[SR_SHA256_LEN];
  if (!rc && (rc = sr_sha256(buf, len - RM_TRAILER, dig) ? SR_ENOMEM : 0))
    sr_fmt(err, errlen, "%s: out of memory", path);
  if (!rc && memcmp(dig, buf + len - RM_TRAILER, RM_TRAILER)) {
    sr_fmt(err, errlen, "%s: checksum mismatch (corrupt file)", path);
    rc = SR_EFORMAT;
  }
  size_t cnt = rc ? 0 : (size_t)sr_get64(buf + 16);
  uint64_t *out = !rc && cnt ? malloc(cnt * sizeof *out) : NULL;
  if (!rc && cnt && !out) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    rc = SR_ENOMEM;
  }
  for (size_t i = 0; i < cnt && !rc; i++) {
    out[i] = sr_get64(buf + EMB_RMFILE_HEADER + i * 8);
    if (i && out[i] <= out[i - 1]) {
      sr_fmt(err, errlen, "%s: removed id %zu: row %llu not above the one before", path, i,
             (unsigned long long)out[i]);
      rc = SR_EFORMAT;
    } else if (tb->rows != EMB_ROWS_UNBOUNDED && out[i] >= tb->rows) {
      sr_fmt(err, errlen, "%s: removed id %zu: row %llu outside the table's %llu rows", path, i,
             (unsigned long long)out[i], (unsigned long long)tb->rows);
      rc = SR_EFORMAT;
    }
  }
  free(buf);
  if (rc) {
    free(out);
    return rc;
  }
  *ids = out;
  *n = cnt;
  return 0;
}

int emb_rmfile_count(const char *path, uint64_t *n, char *err, size_t errlen) {
  unsigned char h[EMB_RMFILE_HEADER];
  FILE *f = fopen(path, "rb");
  if (!f) {
    sr_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return SR_EIO;
  }
  size_t got = fread(h, 1, sizeof h, f);
  fclose(f);
  if (got != sizeof h || memcmp(h, RM_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec removed-rows file", path);
    return SR_EFORMAT;
  }
  if (sr_get32(h + 8) != EMB_RMFILE_VERSION) {
    sr_fmt(err, errlen, "%s: format version %u is not supported (this build reads %u)", path,
           sr_get32(h + 8), EMB_RMFILE_VERSION);
    return SR_EVERSION;
  }
  *n = sr_get64(h + 16);
  return 0;
}
