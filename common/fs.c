#include "common/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"

int sr_path_too_long(char *err, size_t errlen, const char *path, size_t limit) {
  if (err && errlen) {
    size_t n = strlen(path);
    sr_fmt(err, errlen, "%.64s%s: path too long (over %zu characters)", path, n > 64 ? "..." : "",
           limit ? limit - 1 : 0);
  }
  return SR_ERANGE;
}

/* sr_path and sr_path_err (err NULL: no message). */
static int vpath(char *buf, size_t len, char *err, size_t errlen, const char *fmt, va_list ap) {
  if (!buf || len == 0) return SR_EINVAL;
  int w = vsnprintf(buf, len, fmt, ap);
  if (w >= 0 && (size_t)w < len) return 0;
  if (w >= 0) sr_path_too_long(err, errlen, buf, len); /* buf holds the path's start */
  else if (err && errlen) sr_fmt(err, errlen, "%s: cannot format a path", fmt);
  buf[0] = '\0';
  return SR_ERANGE;
}

int sr_path(char *buf, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vpath(buf, len, NULL, 0, fmt, ap);
  va_end(ap);
  return rc;
}

int sr_path_err(char *buf, size_t len, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vpath(buf, len, err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

int sr_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

char *sr_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *s = NULL;
  long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
  if (n >= 0 && !fseek(f, 0, SEEK_SET) && (s = malloc((size_t)n + 1)) &&
      fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
    errno = EIO;
  }
  int e = errno;
  fclose(f);
  errno = e;
  if (s) {
    s[n] = 0;
    if (len) *len = (size_t)n;
  }
  return s;
}

int sr_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int sr_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int mkdir_one(const char *p) {
  if (mkdir(p, 0777) == 0) return 0;
  return errno == EEXIST && sr_is_dir(p) ? 0 : SR_EIO;
}

int sr_mkdirs(const char *path) {
  char tmp[SR_PATH_MAX];
  int rc = sr_path(tmp, sizeof tmp, "%s", path);
  if (rc) return rc;
  if (!tmp[0]) return SR_EINVAL;
  for (char *q = tmp + 1; *q; q++)
    if (*q == '/' && q[-1] != '/') {
      *q = '\0';
      rc = mkdir_one(tmp);
      *q = '/';
      if (rc) return rc;
    }
  return mkdir_one(tmp);
}

int sr_rmtree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : SR_EIO;
  if (!S_ISDIR(st.st_mode)) return unlink(path) == 0 ? 0 : SR_EIO;
  DIR *dir = opendir(path);
  if (!dir) return SR_EIO;
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(dir))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char p[SR_PATH_MAX];
    if (sr_path(p, sizeof p, "%s/%s", path, de->d_name) || sr_rmtree(p)) rc = SR_EIO;
  }
  closedir(dir);
  if (rmdir(path) != 0) rc = SR_EIO;
  return rc;
}

int sr_copy_file(const char *src, const char *dst, char *err, size_t errlen) {
  int in = open(src, O_RDONLY), out = -1, rc = 0;
  if (in < 0) {
    sr_fmt(err, errlen, "%s: cannot open: %s", src, strerror(errno));
    return SR_EIO;
  }
  out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (out < 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", dst, strerror(errno));
    close(in);
    return SR_EIO;
  }
  enum { CHUNK = 1 << 16 };
  char *buf = malloc(CHUNK);
  ssize_t got = -1;
  int saved = ENOMEM;
  while (buf && (got = read(in, buf, CHUNK)) > 0)
    if (write(out, buf, (size_t)got) != got) {
      saved = errno;
      rc = SR_EIO;
      break;
    }
  if (!rc && got < 0) saved = buf ? errno : ENOMEM, rc = SR_EIO;
  if (!rc && fsync(out) != 0) saved = errno, rc = SR_EIO;
  if (close(out) != 0 && !rc) saved = errno, rc = SR_EIO;
  close(in);
  free(buf);
  if (rc) sr_fmt(err, errlen, "%s: cannot copy to %s: %s", src, dst, strerror(saved));
  return rc;
}

int sr_copytree(const char *src, const char *dst, char *err, size_t errlen) {
  if (mkdir(dst, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create: %s", dst, strerror(errno));
    return SR_EIO;
  }
  DIR *dir = opendir(src);
  if (!dir) {
    sr_fmt(err, errlen, "%s: cannot open: %s", src, strerror(errno));
    return SR_EIO;
  }
  struct dirent *de;
  int rc = 0;
  while (!rc && (de = readdir(dir))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char s[SR_PATH_MAX], t[SR_PATH_MAX];
    if (sr_path(s, sizeof s, "%s/%s", src, de->d_name) ||
        sr_path(t, sizeof t, "%s/%s", dst, de->d_name)) {
      sr_fmt(err, errlen, "%s/%s: path too long", src, de->d_name);
      rc = SR_ERANGE;
      break;
    }
    struct stat st;
    if (stat(s, &st) != 0) {
      sr_fmt(err, errlen, "%s: cannot stat: %s", s, strerror(errno));
      rc = SR_EIO;
    } else if (S_ISDIR(st.st_mode)) {
      rc = sr_copytree(s, t, err, errlen);
    } else {
      size_t l = strlen(de->d_name);
      int sst = l > 4 && !strcmp(de->d_name + l - 4, ".sst");
      if (!(sst && link(s, t) == 0)) rc = sr_copy_file(s, t, err, errlen);
    }
  }
  closedir(dir);
  return rc;
}

int sr_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return SR_EIO;
  int rc = fsync(fd) == 0 ? 0 : SR_EIO;
  close(fd);
  return rc;
}

typedef struct {
  char **p;
  int n, cap;
} plist;

static int plist_add(plist *l, const char *s) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    char **np = realloc(l->p, (size_t)cap * sizeof *np);
    if (!np) return SR_ENOMEM;
    l->p = np;
    l->cap = cap;
  }
  if (!(l->p[l->n] = strdup(s))) return SR_ENOMEM;
  l->n++;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Hand l over sorted, or free it on failure. */
static int plist_finish(plist *l, int rc, char ***out, int *n) {
  if (rc) {
    sr_paths_free(l->p, l->n);
    *out = NULL;
    *n = 0;
    return rc;
  }
  if (l->n) qsort(l->p, (size_t)l->n, sizeof *l->p, cmp_str);
  *out = l->p;
  *n = l->n;
  return 0;
}

static int list_rec(const char *root, const char *rel, plist *l) {
  char full[SR_PATH_MAX];
  if (sr_path(full, sizeof full, "%s%s%s", root, *rel ? "/" : "", rel)) return SR_ERANGE;
  DIR *dir = opendir(full);
  if (!dir) return SR_EIO;
  struct dirent *de;
  int rc = 0;
  while (!rc && (de = readdir(dir))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char r[SR_PATH_MAX], f[SR_PATH_MAX];
    if (sr_path(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", de->d_name) ||
        sr_path(f, sizeof f, "%s/%s", root, r)) {
      rc = SR_ERANGE;
      break;
    }
    struct stat st;
    if (stat(f, &st) != 0) rc = SR_EIO;
    else if (S_ISDIR(st.st_mode)) rc = list_rec(root, r, l);
    else if (S_ISREG(st.st_mode)) rc = plist_add(l, r);
  }
  closedir(dir);
  return rc;
}

int sr_list_files(const char *root, char ***paths, int *n) {
  plist l = {0};
  return plist_finish(&l, list_rec(root, "", &l), paths, n);
}

int sr_list_dir(const char *path, char ***names, int *n) {
  plist l = {0};
  DIR *dir = opendir(path);
  if (!dir) return plist_finish(&l, SR_ENOTFOUND, names, n);
  struct dirent *de;
  int rc = 0;
  while (!rc && (de = readdir(dir)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) rc = plist_add(&l, de->d_name);
  closedir(dir);
  return plist_finish(&l, rc, names, n);
}

void sr_paths_free(char **paths, int n) {
  if (!paths) return;
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

/* 1 when the resolved path p is root or lies under it. */
static int path_within(const char *root, const char *p) {
  size_t rl = strlen(root);
  if (rl == 1 && root[0] == '/') return p[0] == '/';
  return !strncmp(p, root, rl) && (p[rl] == '\0' || p[rl] == '/');
}

/* The part of path that exists, resolved (realpath) into real, and the
 * offset in path of the first component that does not exist (strlen(path)
 * when all of it does). Each missing component is checked to be a plain
 * name. 0 or an SR_E* code with the reason in err. */
static int path_split_real(const char *path, char *real, size_t *tail_at, char *err,
                           size_t errlen) {
  char head[SR_PATH_MAX];
  size_t n = strlen(path);
  memcpy(head, path, n + 1);
  *tail_at = n;
  int raced = 0;
  for (;;) {
    while (n > 1 && head[n - 1] == '/') head[--n] = '\0';
    if (realpath(n ? head : ".", real)) return 0;
    if (errno != ENOENT) {
      sr_fmt(err, errlen, "%.300s: cannot resolve %.300s: %s", path, n ? head : ".",
             strerror(errno));
      return SR_EIO;
    }
    char *slash = strrchr(head, '/');
    char *name = slash ? slash + 1 : head;
    struct stat st;
    if (!strcmp(name, ".") || !strcmp(name, "..")) {
      sr_fmt(err, errlen, "%.300s: '%s' after a folder that does not exist", path, name);
      return SR_EFORMAT;
    }
    if (!lstat(head, &st)) {
      /* Made between realpath and lstat (servers of other shards create the
       * same checkpoint folder at once): resolve it again. */
      if ((!S_ISLNK(st.st_mode) || !stat(head, &st)) && ++raced < 16) continue;
      sr_fmt(err, errlen, "%.300s: %.300s is a symlink that leads nowhere", path, head);
      return SR_EFORMAT;
    }
    *tail_at = (size_t)(name - head);
    n = slash == head ? 1 : slash ? (size_t)(slash - head) : 0;
    head[n] = '\0';
  }
}

int sr_path_confine(const char *root, const char *path, char *out, size_t len, char *err,
                    size_t errlen) {
  if (!path || !*path) {
    sr_fmt(err, errlen, "empty path");
    return SR_EFORMAT;
  }
  if (strlen(path) >= SR_PATH_MAX) return sr_path_too_long(err, errlen, path, SR_PATH_MAX);
  char real[SR_PATH_MAX];
  size_t tail_at;
  int rc = path_split_real(path, real, &tail_at, err, errlen);
  if (rc) return rc;
  size_t at = strlen(real);
  if (at >= len) return sr_path_too_long(err, errlen, real, len);
  memcpy(out, real, at + 1);
  for (const char *p = path + tail_at; *p;) { /* the missing names, one '/' between */
    size_t k = strcspn(p, "/");
    if (k) {
      int slash = !(at == 1 && out[0] == '/');
      if (at + (size_t)slash + k >= len) return sr_path_too_long(err, errlen, out, len);
      if (slash) out[at++] = '/';
      memcpy(out + at, p, k);
      out[at += k] = '\0';
    }
    p += k + (p[k] == '/');
  }
  if (path_within(root, out)) return 0;
  sr_fmt(err, errlen, "%.300s resolves to %.300s, outside %.300s", path, out, root);
  out[0] = '\0';
  return SR_EINVAL;
}

/* ---- temporary folders and their owners ---- */

/* Field 22 of /proc/PID/stat (start time in clock ticks), or 0 when there
 * is no such process. */
static unsigned long long proc_start(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0) return 0;
  buf[k] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
  if (!p) return 0;
  p++;
  for (int field = 2; field < 21 && p; field++) p = strchr(p + 1, ' '); /* to field 21's end */
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* This boot's id, 12 hex digits ("0" when unknown). */
static void boot_id(char out[13]) {
  char buf[64] = "";
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY);
  ssize_t k = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0) close(fd);
  int n = 0;
  for (ssize_t i = 0; i < k && n < 12; i++)
    if ((buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f')) out[n++] = buf[i];
  if (!n) out[n++] = '0';
  out[n] = 0;
}

/* The host name as tags spell it (at most 64 characters). */
static void host_name(char out[65]) {
  char h[256] = "";
  if (gethostname(h, sizeof h - 1) != 0 || !h[0]) snprintf(h, sizeof h, "localhost");
  int n = 0;
  for (const char *p = h; *p && n < 64; p++, n++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '-' || c == '_';
    out[n] = ok ? c : '_';
  }
  out[n] = 0;
}

int sr_tmp_tag(char *buf, size_t len) {
  char boot[13], host[65];
  boot_id(boot);
  host_name(host);
  long pid = (long)getpid();
  return sr_path(buf, len, "tmp-%ld-%llu-%s-%s", pid, proc_start(pid), boot, host);
}

int sr_tmp_owner_gone(const char *s) {
  long pid;
  unsigned long long start;
  char boot[16], host[72], my_boot[13], my_host[65];
  int used = 0;
  if (strncmp(s, "tmp-", 4) != 0 ||
      sscanf(s, "tmp-%ld-%llu-%15[0-9a-f]-%n", &pid, &start, boot, &used) != 3 || !used)
    return 0;
  snprintf(host, sizeof host, "%.71s", s + used);
  host_name(my_host);
  if (strcmp(host, my_host) != 0) return 0; /* another host's: its owner is not ours to judge */
  boot_id(my_boot);
  if (strcmp(boot, my_boot) != 0) return 1; /* written before this boot */
  return pid <= 0 || proc_start(pid) != start;
}

int sr_tmp_sweep(const char *dir, const char *prefix, FILE *say) {
  char **names;
  int n, removed = 0;
  int rc = sr_list_dir(dir, &names, &n);
  if (rc == SR_ENOTFOUND) return 0;
  if (rc) return rc;
  size_t pl = strlen(prefix);
  for (int i = 0; i < n; i++) {
    const char *tag = strncmp(names[i], prefix, pl) == 0 ? strstr(names[i] + pl, "tmp-") : NULL;
    char path[SR_PATH_MAX];
    if (!tag || !sr_tmp_owner_gone(tag) ||
        sr_path(path, sizeof path, "%s/%s", dir, names[i]))
      continue;
    struct stat st;
    int folder = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (sr_rmtree(path) == 0) {
      removed++;
      if (say)
        fprintf(say, "%s: removed: a temporary %s whose owner (%s) is gone\n", path,
                folder ? "folder" : "file", tag);
    }
  }
  sr_paths_free(names, n);
  return removed;
}
