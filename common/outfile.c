#include "common/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"

struct sr_outfile {
  char *path; /* owned: the final path */
  char *tmp;  /* owned: the temporary beside it, while it exists */
  char *dir;  /* owned: the folder of both */
  FILE *f;    /* owned: over fd, until closed */
  int rc;     /* the first error, 0 while none */
  char err[1024];
};

int sr_out_check(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (!path || !*path) {
    sr_fmt(err, errlen, "an empty path is not a file name");
    return SR_EINVAL;
  }
  if (stat(path, &st) != 0) return 0; /* nothing there (or a dangling link): made at commit */
  if (S_ISDIR(st.st_mode)) {
    sr_fmt(err, errlen, "%s: is a folder; a file output never replaces one, it is left as it is",
           path);
    return SR_EEXISTS;
  }
  if (!S_ISREG(st.st_mode)) {
    sr_fmt(err, errlen, "%s: is not a regular file (a device, pipe or socket); a file output "
           "replaces a regular file only", path);
    return SR_EINVAL;
  }
  return 0;
}

/* path's folder, resolved, into dir[PATH_MAX], and its last name. */
static const char *split_resolved(const char *path, char *dir) {
  const char *slash = strrchr(path, '/');
  char d[PATH_MAX];
  if (!slash) snprintf(d, sizeof d, ".");
  else snprintf(d, sizeof d, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  if (!realpath(d, dir)) snprintf(dir, PATH_MAX, "%s", d);
  return slash ? slash + 1 : path;
}

int sr_same_file(const char *a, const char *b) {
  struct stat x, y;
  const int ea = !stat(a, &x), eb = !stat(b, &y);
  if (ea || eb) return ea && eb && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
  char da[PATH_MAX], db[PATH_MAX];
  const char *na = split_resolved(a, da), *nb = split_resolved(b, db);
  return !strcmp(na, nb) && !strcmp(da, db);
}

static void out_free(sr_outfile *o) {
  if (o->f) fclose(o->f);
  if (o->tmp) unlink(o->tmp);
  free(o->path);
  free(o->tmp);
  free(o->dir);
  free(o);
}

/* The final path (a symlink to a regular file: the file it leads to, so the
 * link stays), its folder and its name into o. 0 or an SR_E* code (err). */
static int out_names(sr_outfile *o, const char *path, char *err, size_t errlen) {
  struct stat st;
  char real[PATH_MAX];
  if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && realpath(path, real)) path = real;
  size_t n = strlen(path);
  if (path[n - 1] == '/') {
    sr_fmt(err, errlen, "%s: names a folder, not a file", path);
    return SR_EINVAL;
  }
  const char *slash = strrchr(path, '/');
  o->path = strdup(path);
  o->dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!o->path || !o->dir) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  return 0;
}

int sr_out_open(const char *path, sr_outfile **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = sr_out_check(path, err, errlen);
  if (rc) return rc;
  sr_outfile *o = calloc(1, sizeof *o);
  if (!o) {
    sr_fmt(err, errlen, "%s: out of memory", path);
    return SR_ENOMEM;
  }
  char tag[SR_TMP_TAG_MAX], tmp[SR_PATH_MAX], prefix[NAME_MAX + 1];
  if ((rc = out_names(o, path, err, errlen)) || (rc = sr_tmp_tag(tag, sizeof tag))) {
    if (rc == SR_ERANGE) sr_fmt(err, errlen, "%s: cannot make a temporary name", path);
    out_free(o);
    return rc;
  }
  const char *slash = strrchr(o->path, '/'), *base = slash ? slash + 1 : o->path;
  int keep = (int)(NAME_MAX - 1 - strlen(tag)); /* the name's part in PATH.TAG */
  snprintf(prefix, sizeof prefix, "%.*s.", keep, base);
  if ((rc = sr_path_err(tmp, sizeof tmp, err, errlen, "%.*s%s%s", (int)(base - o->path), o->path,
                        prefix, tag))) {
    out_free(o);
    return rc;
  }
  sr_tmp_sweep(o->dir, prefix, stderr); /* what writers killed before us left */
  struct stat st;
  int had = stat(o->path, &st) == 0;
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    sr_fmt(err, errlen, "%s: cannot create its temporary %s: %s", o->path, tmp, strerror(errno));
    out_free(o);
    return SR_EIO;
  }
  if (!(o->tmp = strdup(tmp)) || !(o->f = fdopen(fd, "w"))) {
    if (o->tmp) unlink(tmp), free(o->tmp), o->tmp = NULL;
    else unlink(tmp);
    close(fd);
    sr_fmt(err, errlen, "%s: out of memory", path);
    out_free(o);
    return SR_ENOMEM;
  }
  if (had) fchmod(fd, st.st_mode & 07777); /* the file replaced keeps its mode */
  *out = o;
  return 0;
}

FILE *sr_out_stream(sr_outfile *o) { return o->f; }
int sr_out_fd(const sr_outfile *o) { return o->f ? fileno(o->f) : -1; }
const char *sr_out_path(const sr_outfile *o) { return o->path; }
const char *sr_out_tmp(const sr_outfile *o) { return o->tmp; }
const char *sr_out_errmsg(const sr_outfile *o) { return o->err; }

int sr_out_fail(sr_outfile *o, const char *what, int errnum) {
  if (!o->rc) {
    o->rc = SR_EIO;
    sr_fmt(o->err, sizeof o->err, "%s: %s: %s", o->path, what, strerror(errnum ? errnum : EIO));
  }
  return o->rc;
}

int sr_out_write(sr_outfile *o, const void *p, size_t n) {
  if (o->rc) return o->rc;
  errno = 0;
  if (n && fwrite(p, 1, n, o->f) != n) return sr_out_fail(o, "cannot write", errno);
  return 0;
}

int sr_out_printf(sr_outfile *o, const char *fmt, ...) {
  if (o->rc) return o->rc;
  va_list ap;
  va_start(ap, fmt);
  errno = 0;
  int w = vfprintf(o->f, fmt, ap);
  va_end(ap);
  return w < 0 ? sr_out_fail(o, "cannot write", errno) : 0;
}

int sr_out_reserve(sr_outfile *o, uint64_t size) {
  if (o->rc || size == 0) return o->rc;
  if ((uint64_t)(off_t)size != size || (off_t)size < 0) return sr_out_fail(o, "cannot reserve", EFBIG);
  int e = posix_fallocate(fileno(o->f), 0, (off_t)size);
  if (!e) return 0;
  o->rc = SR_EIO;
  sr_fmt(o->err, sizeof o->err, "%s: cannot reserve %llu bytes: %s", o->path,
         (unsigned long long)size, strerror(e));
  return o->rc;
}

/* Make o's temporary whole on disk and close it: flush, fsync, close, each
 * checked. 0 or the error (recorded in o). */
static int out_close(sr_outfile *o) {
  if (!o->rc) {
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) sr_out_fail(o, "cannot write", errno);
    else if (fsync(fileno(o->f)) != 0) sr_out_fail(o, "cannot write", errno);
  }
  if (o->f) {
    FILE *f = o->f;
    o->f = NULL;
    errno = 0;
    if (fclose(f) != 0 && !o->rc) sr_out_fail(o, "cannot write", errno);
  }
  return o->rc;
}

int sr_out_commit_all(sr_outfile **os, int n, char *err, size_t errlen) {
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    if (os[i] && (rc = out_close(os[i]))) sr_fmt(err, errlen, "%s", os[i]->err);
  for (int i = 0; i < n && !rc; i++) {
    if (!os[i]) continue;
    if (rename(os[i]->tmp, os[i]->path) != 0) {
      sr_fmt(err, errlen, "%s: cannot rename %s into place: %s", os[i]->path, os[i]->tmp,
             strerror(errno));
      rc = SR_EIO;
      break;
    }
    free(os[i]->tmp);
    os[i]->tmp = NULL; /* in place now: out_free leaves it */
  }
  for (int i = 0; i < n; i++) {
    if (!os[i]) continue;
    if (!rc) sr_fsync_dir(os[i]->dir); /* the rename made durable, at best effort */
    out_free(os[i]);
    os[i] = NULL;
  }
  return rc;
}

int sr_out_commit(sr_outfile *o, char *err, size_t errlen) {
  return sr_out_commit_all(&o, 1, err, errlen);
}

void sr_out_abort(sr_outfile *o) {
  if (o) out_free(o);
}

int sr_out_line(FILE *f, const char *path, const char *s, size_t n, char *err, size_t errlen) {
  struct stat st;
  off_t at = fstat(fileno(f), &st) == 0 ? st.st_size : -1; /* lines are flushed: the end */
  errno = 0;
  if (fwrite(s, 1, n, f) == n && fflush(f) == 0) return 0;
  int e = errno ? errno : EIO;
  __fpurge(f); /* what could not be written is dropped, not tried again at fclose */
  if (at >= 0 && ftruncate(fileno(f), at) == 0) fseeko(f, at, SEEK_SET);
  clearerr(f);
  sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(e));
  return SR_EIO;
}
