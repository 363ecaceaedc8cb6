/* The dense state file, SRCKDENS v1: see state_file.h. */
#include "dense/state_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/sha256.h"
#include "common/status.h"

#define TRAILER 32u

/* The header fields (offsets in state_file.h). */
typedef struct hdr {
  uint32_t version, header_bytes, kind;
  uint64_t params, state;
  int64_t steps;
} hdr;

static void hdr_put(unsigned char *b, const hdr *h) {
  memset(b, 0, DENSE_STATE_HEADER);
  memcpy(b, DENSE_STATE_MAGIC, 8);
  memcpy(b + 8, &h->version, 4);
  memcpy(b + 12, &h->header_bytes, 4);
  memcpy(b + 16, &h->params, 8);
  memcpy(b + 24, &h->state, 8);
  memcpy(b + 32, &h->steps, 8);
  memcpy(b + 40, &h->kind, 4);
}

static void hdr_get(const unsigned char *b, hdr *h) {
  memcpy(&h->version, b + 8, 4);
  memcpy(&h->header_bytes, b + 12, 4);
  memcpy(&h->params, b + 16, 8);
  memcpy(&h->state, b + 24, 8);
  memcpy(&h->steps, b + 32, 8);
  memcpy(&h->kind, b + 40, 4);
}

/* SHA-256 of up to three byte ranges (a NULL or empty one is skipped). */
static int sha256_parts(const void *a, size_t na, const void *b, size_t nb, const void *c,
                        size_t nc, unsigned char out[32]) {
  sr_sha256_ctx h;
  int rc = sr_sha256_init(&h);
  if (rc) return rc;
  if (na) sr_sha256_update(&h, a, na);
  if (nb) sr_sha256_update(&h, b, nb);
  if (nc) sr_sha256_update(&h, c, nc); /* a failed update is reported by final */
  return sr_sha256_final(&h, out);
}

static int read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

int dense_state_save(const char *path, const dense_model *m, const dense_opt *o, char *err,
                     size_t errlen) {
  /* Only read: the accessors hand out the buffers they own. */
  size_t np = 0, ns = 0;
  const float *p = dense_model_params((dense_model *)m, &np);
  const float *s = o ? dense_opt_state((dense_opt *)o, &ns) : NULL;
  hdr h = {.version = DENSE_STATE_VERSION, .header_bytes = DENSE_STATE_HEADER,
           .kind = o ? (uint32_t)dense_opt_kind_of(o) : (uint32_t)DENSE_OPT_SGD,
           .params = np, .state = ns, .steps = o ? dense_opt_steps(o) : 0};
  unsigned char b[DENSE_STATE_HEADER], dig[32];
  hdr_put(b, &h);
  if (sha256_parts(b, sizeof b, p, np * 4, s, ns * 4, dig)) {
    sr_fmt(err, errlen, "%s: SHA-256 failed", path);
    return SR_EBACKEND;
  }
  char tmp[SR_PATH_MAX];
  int rc = sr_path_err(tmp, sizeof tmp, err, errlen, "%s.tmp", path);
  if (rc) return rc; /* nothing written */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    sr_fmt(err, errlen, "%s: cannot write: %s", tmp, strerror(errno));
    return SR_EIO;
  }
  int bad = sr_write_all(fd, b, sizeof b) || sr_write_all(fd, p, np * 4) ||
            (ns && sr_write_all(fd, s, ns * 4)) || sr_write_all(fd, dig, sizeof dig) || fsync(fd);
  int saved = errno;
  bad |= close(fd) != 0;
  if (!bad && rename(tmp, path) != 0) {
    saved = errno;
    bad = 1;
  }
  if (bad) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(saved));
    unlink(tmp);
    return SR_EIO;
  }
  return 0;
}

/* path's bytes into *buf (malloc'd, caller frees) and *len. 0 or SR_EIO,
 * SR_ENOMEM (err). */
static int read_whole(const char *path, unsigned char **buf, size_t *len, char *err,
                      size_t errlen) {
  *buf = NULL;
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return SR_EIO;
  }
  *len = (size_t)st.st_size;
  unsigned char *b = malloc(*len ? *len : 1);
  int rc = 0;
  if (!b) {
    sr_fmt(err, errlen, "%s: out of memory for %zu bytes", path, *len);
    rc = SR_ENOMEM;
  } else if ((errno = 0, read_all(fd, b, *len))) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, errno ? strerror(errno) : "short read");
    rc = SR_EIO;
  }
  close(fd);
  if (rc) free(b);
  else *buf = b;
  return rc;
}

/* Read path whole into *buf (malloc'd, caller frees) and check it: magic,
 * version, size, SHA-256, then the counts and kind against m and o (o NULL:
 * the parameters only). *h gets the header. 0 or SR_E* (err). */
static int read_checked(const char *path, const dense_model *m, const dense_opt *o,
                        unsigned char **buf, hdr *h, char *err, size_t errlen) {
  unsigned char *b;
  size_t len = 0;
  int rc = read_whole(path, &b, &len, err, errlen);
  *buf = NULL;
  if (rc) return rc;
  if (len < DENSE_STATE_HEADER + TRAILER || memcmp(b, DENSE_STATE_MAGIC, 8)) {
    sr_fmt(err, errlen, "%s: not a shardrec dense checkpoint file (bad magic or too short)", path);
    rc = SR_EFORMAT;
    goto fail;
  }
  hdr_get(b, h);
  if (h->version != DENSE_STATE_VERSION || h->header_bytes != DENSE_STATE_HEADER) {
    sr_fmt(err, errlen, "%s: format version %u is not supported (this build reads %u)", path,
           h->version, DENSE_STATE_VERSION);
    rc = SR_EVERSION;
    goto fail;
  }
  uint64_t room = (len - DENSE_STATE_HEADER - TRAILER) / 4;
  if (h->params > room || h->state > room - h->params ||
      len != DENSE_STATE_HEADER + 4 * (h->params + h->state) + TRAILER) {
    sr_fmt(err, errlen, "%s: size %zu, the header's %llu + %llu floats take %llu (torn or "
           "truncated)", path, len, (unsigned long long)h->params, (unsigned long long)h->state,
           (unsigned long long)(DENSE_STATE_HEADER + TRAILER) + 4 * (h->params + h->state));
    rc = SR_EFORMAT;
    goto fail;
  }
  unsigned char dig[32];
  if (sha256_parts(b, len - TRAILER, NULL, 0, NULL, 0, dig) || memcmp(dig, b + len - TRAILER, 32)) {
    sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", path);
    rc = SR_ECHECKSUM;
    goto fail;
  }
  size_t np = 0, ns = 0;
  dense_model_params((dense_model *)m, &np);
  if (o) dense_opt_state((dense_opt *)o, &ns);
  if (h->params != np || (o && (h->state != ns || h->kind != (uint32_t)dense_opt_kind_of(o)))) {
    if (o)
      sr_fmt(err, errlen, "%s: holds %llu parameters and %llu optimizer floats (optimizer kind "
             "%u); this model has %zu and %zu (kind %d)", path, (unsigned long long)h->params,
             (unsigned long long)h->state, h->kind, np, ns, (int)dense_opt_kind_of(o));
    else
      sr_fmt(err, errlen, "%s: holds %llu parameters; this model has %zu", path,
             (unsigned long long)h->params, np);
    rc = SR_EMISMATCH;
    goto fail;
  }
  *buf = b;
  return 0;
fail:
  free(b);
  return rc;
}

int dense_state_check(const char *path, const dense_model *m, const dense_opt *o, char *err,
                      size_t errlen) {
  unsigned char *b;
  hdr h;
  int rc = read_checked(path, m, o, &b, &h, err, errlen);
  free(b);
  return rc;
}

int dense_state_load(const char *path, dense_model *m, dense_opt *o, char *err, size_t errlen) {
  unsigned char *b;
  hdr h;
  int rc = read_checked(path, m, o, &b, &h, err, errlen);
  if (rc) return rc;
  size_t np = 0, ns = 0;
  float *p = dense_model_params(m, &np);
  memcpy(p, b + DENSE_STATE_HEADER, np * 4);
  if (o) {
    float *s = dense_opt_state(o, &ns);
    if (ns) memcpy(s, b + DENSE_STATE_HEADER + np * 4, ns * 4);
    dense_opt_set_steps(o, h.steps);
  }
  free(b);
  return 0;
}
