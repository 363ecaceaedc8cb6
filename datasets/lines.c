/* Lines from a list of files, plain or gzip (see lines_impl.h). */
#include "datasets/lines_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"

uint64_t ds__ls_bytes(const linesrc *l) {
  off_t at = l->gz ? gzoffset(l->gz) : lseek(l->fd, 0, SEEK_CUR);
  return l->before + (at > 0 ? (uint64_t)at : 0);
}

uint64_t ds__paths_bytes(char **paths, int n) {
  uint64_t b = 0;
  struct stat st;
  for (int i = 0; i < n; i++)
    if (!stat(paths[i], &st)) b += (uint64_t)st.st_size;
  return b;
}

uint32_t ds__paths_ends_crc(char *const *paths, int n) {
  enum { END = 1 << 20 };
  uLong c = crc32(0L, Z_NULL, 0);
  unsigned char *buf = malloc(END);
  if (!buf) return 0;
  for (int i = 0; i < n; i++) {
    const int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && !fstat(fd, &st)) {
      /* The first MiB, then the last (what the first did not cover). */
      const off_t size = st.st_size, head = size < END ? size : END;
      const off_t tail = size - END > head ? size - END : head;
      const off_t from[2] = {0, tail}, len[2] = {head, size - tail};
      for (int k = 0; k < 2; k++) {
        const ssize_t got = len[k] ? pread(fd, buf, (size_t)len[k], from[k]) : 0;
        if (got > 0) c = crc32(c, buf, (uInt)got);
      }
    }
    if (fd >= 0) close(fd);
  }
  free(buf);
  return (uint32_t)c;
}

static void ls_close_file(linesrc *l) {
  if (l->gz) gzclose(l->gz);
  if (l->fd >= 0) close(l->fd);
  l->gz = NULL;
  l->fd = -1;
}

static int ls_open_file(linesrc *l, int i, char *err, size_t en) {
  ls_close_file(l);
  l->cur = i;
  l->pos = l->len = 0;
  l->eof = 0;
  l->file_line = 1;
  l->before = ds__paths_bytes(l->paths, i);
  int fd = open(l->paths[i], O_RDONLY);
  if (fd < 0) {
    sr_fmt(err, en, "%s: %s", l->paths[i], strerror(errno));
    return SR_EIO;
  }
  unsigned char m[2];
  ssize_t k = pread(fd, m, 2, 0);
  if (k == 2 && m[0] == 0x1f && m[1] == 0x8b) {
    l->gz = gzdopen(fd, "rb");
    if (!l->gz) {
      close(fd);
      sr_fmt(err, en, "%s: cannot open gzip stream", l->paths[i]);
      return SR_EIO;
    }
    gzbuffer(l->gz, 256 * 1024);
  } else {
    l->fd = fd;
  }
  return 0;
}

int ds__ls_init(linesrc *l, char **paths, int npaths, char *err, size_t en) {
  memset(l, 0, sizeof *l);
  l->fd = -1;
  l->paths = paths;
  l->npaths = npaths;
  l->cap = DS_READ_BYTES * 2;
  l->buf = malloc(l->cap);
  if (!l->buf) {
    sr_fmt(err, en, "out of memory");
    return SR_ENOMEM;
  }
  return ls_open_file(l, 0, err, en);
}

void ds__ls_free(linesrc *l) {
  ls_close_file(l);
  free(l->buf);
  l->buf = NULL;
}

/* A gzip stream that ends early (zlib's Z_BUF_ERROR at the end of input) or
 * does not decode: SR_EFORMAT naming the file and the compressed byte
 * offset reached. The partial line held is never handed out. */
static int gz_fail(linesrc *l, const char *zmsg, char *err, size_t en) {
  const char *m = zmsg && *zmsg ? zmsg : "stream error";
  if (!strncmp(m, "<fd:", 4) && strstr(m, ": ")) m = strstr(m, ": ") + 2; /* zlib's own name */
  long long at = (long long)gzoffset(l->gz);
  sr_fmt(err, en, "%s: truncated or corrupt gzip stream at compressed byte %lld: %s",
         l->paths[l->cur], at, m);
  return SR_EFORMAT;
}

int ds__ls_next(linesrc *l, const char **p, size_t *n, char *err, size_t en) {
  for (;;) {
    char *s = l->buf + l->pos;
    char *nl = memchr(s, '\n', l->len - l->pos);
    if (nl || (l->eof && (l->pos < l->len || l->skipping))) {
      *p = s;
      *n = nl ? (size_t)(nl - s) : l->len - l->pos; /* the last line may lack '\n' */
      l->pos = nl ? l->pos + *n + 1 : l->len;
      l->line++;
      l->file_line++;
      if (l->skipping || *n > DS_LINE_MAX) {
        l->skipping = 0;
        *n = 0;
        return 2;
      }
      return 1;
    }
    if (l->eof) {
      if (l->cur + 1 >= l->npaths) return 0;
      int rc = ls_open_file(l, l->cur + 1, err, en);
      if (rc) return rc;
      continue;
    }
    if (l->pos) {
      memmove(l->buf, l->buf + l->pos, l->len - l->pos);
      l->len -= l->pos;
      l->pos = 0;
    }
    if (l->cap - l->len < DS_READ_BYTES) {
      if (l->cap >= DS_LINE_BUF) { /* drop what we hold, find the line's end */
        l->skipping = 1;
        l->len = 0;
      } else {
        char *nb = realloc(l->buf, l->cap * 2);
        if (!nb) {
          sr_fmt(err, en, "out of memory");
          return SR_ENOMEM;
        }
        l->buf = nb;
        l->cap *= 2;
      }
    }
    ssize_t k;
    if (l->gz) {
      k = gzread(l->gz, l->buf + l->len, (unsigned)(l->cap - l->len));
      int e = Z_OK;
      const char *m = gzerror(l->gz, &e);
      if (k < 0 || (k == 0 && e != Z_OK)) return gz_fail(l, m, err, en);
    } else {
      k = read(l->fd, l->buf + l->len, l->cap - l->len);
      if (k < 0) {
        if (errno == EINTR) continue;
        sr_fmt(err, en, "%s: %s", l->paths[l->cur], strerror(errno));
        return SR_EIO;
      }
    }
    if (k == 0) l->eof = 1;
    l->len += (size_t)k;
  }
}

