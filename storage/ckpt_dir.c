/* The checkpoint folder protocol (see ckpt_dir.h). */
#include "storage/ckpt_dir.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/sha256.h"
#include "common/status.h"
#include "storage/kv.h"

static int write_file(const char *path, const void *data, size_t n, char *err, size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || sr_write_all(fd, data, n) || fsync(fd) || close(fd)) {
    sr_fmt(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return SR_EIO;
  }
  return 0;
}

static const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

long long ckpt_dir_step_of(const char *name) {
  if (strncmp(name, "step-", 5) || !name[5]) return -1;
  char *end;
  long long n = strtoll(name + 5, &end, 10);
  return *end || n < 0 ? -1 : n;
}

int ckpt_dir_parent(const char *path, char *out, size_t outlen) {
  if (sr_path(out, outlen, "%s", path)) return SR_ERANGE;
  for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0; /* "a/b/" is "a/b" */
  char *slash = strrchr(out, '/');
  if (slash && slash != out) *slash = 0;
  else sr_path(out, outlen, "%s", slash ? "/" : ".");
  return 0;
}

int ckpt_dir_step_holding(const char *path, char *step, size_t len) {
  char a[SR_PATH_MAX], f[SR_PATH_MAX];
  if (sr_path(a, sizeof a, "%s", path)) return 0;
  for (;;) {
    if (!sr_path(f, sizeof f, "%s/DONE", a) && sr_is_file(f) &&
        !sr_path(f, sizeof f, "%s/manifest.json", a) && sr_is_file(f))
      return !sr_path(step, len, "%s", a);
    char *slash = strrchr(a, '/');
    if (!slash || slash == a) return 0;
    *slash = '\0';
  }
}

/* ---- checkpoint roots as outputs ---- */

/* 1 when name is ".step-N.tmp-..." (a checkpoint being written). */
static int is_step_tmp_name(const char *name) {
  if (strncmp(name, ".step-", 6) || name[6] < '0' || name[6] > '9') return 0;
  const char *p = name + 6;
  while (*p >= '0' && *p <= '9') p++;
  return !strncmp(p, ".tmp-", 5);
}

/* Whether name is a reader's working copy, CKPT_DIR_READER_TMP K.TAG. */
static int is_reader_tmp_name(const char *name) {
  const size_t n = strlen(CKPT_DIR_READER_TMP);
  if (strncmp(name, CKPT_DIR_READER_TMP, n) || name[n] < '0' || name[n] > '9') return 0;
  const char *p = name + n;
  while (*p >= '0' && *p <= '9') p++;
  return *p == '.' && p[1];
}

/* 1 when rel is one of the files man lists ("files": [{"path": ...}]). */
static int manifest_lists(const cJSON *man, const char *rel) {
  const cJSON *f, *files = cJSON_GetObjectItemCaseSensitive(man, "files");
  cJSON_ArrayForEach(f, files) {
    const char *p = jstr(f, "path");
    if (p && !strcmp(p, rel)) return 1;
  }
  return 0;
}

/* The files of the folder root/name (a step-N): manifest.json, DONE,
 * DONE.tmp and what the manifest lists. 0, or SR_EEXISTS naming the first
 * other file in err. */
static int check_step_files(const char *root, const char *name, char *err, size_t errlen) {
  char dir[SR_PATH_MAX], path[SR_PATH_MAX];
  char **files = NULL;
  int nf = 0, rc;
  if ((rc = sr_path_err(dir, sizeof dir, err, errlen, "%s/%s", root, name)) ||
      (rc = sr_path_err(path, sizeof path, err, errlen, "%s/manifest.json", dir)))
    return rc;
  char *text = sr_read_file(path, NULL);
  cJSON *man = text ? cJSON_Parse(text) : NULL;
  free(text);
  if (sr_is_file(path) && !cJSON_IsObject(man)) {
    sr_fmt(err, errlen, "%s: holds %s/manifest.json, which is not a checkpoint manifest", root,
           name);
    rc = SR_EEXISTS;
  } else if (sr_list_files(dir, &files, &nf)) {
    sr_fmt(err, errlen, "%s: cannot list its files", dir);
    rc = SR_EIO;
  }
  for (int i = 0; i < nf && !rc; i++) {
    const char *f = files[i];
    if (strcmp(f, "manifest.json") && strcmp(f, "DONE") && strcmp(f, "DONE.tmp") &&
        !manifest_lists(man, f)) {
      sr_fmt(err, errlen, "%s: holds %s/%s, which its checkpoint's manifest does not list", root,
             name, f);
      rc = SR_EEXISTS;
    }
  }
  sr_paths_free(files, nf);
  cJSON_Delete(man);
  return rc;
}

/* Is the entry name of root one a checkpoint root holds (ckpt_dir.h)? 0,
 * or SR_EEXISTS / SR_EIO / SR_ERANGE with the reason in err. */
static int check_root_entry(const char *root, const char *name, char *err, size_t errlen) {
  char p[SR_PATH_MAX];
  struct stat st;
  int rc = sr_path_err(p, sizeof p, err, errlen, "%s/%s", root, name);
  if (rc) return rc;
  if (lstat(p, &st) != 0) return 0; /* gone since the listing */
  if (S_ISDIR(st.st_mode) && (is_step_tmp_name(name) || is_reader_tmp_name(name))) return 0;
  if (S_ISDIR(st.st_mode) && ckpt_dir_step_of(name) >= 0)
    return check_step_files(root, name, err, errlen);
  size_t pl = strlen(CKPT_DIR_PLAN);
  if (S_ISREG(st.st_mode) &&
      (!strcmp(name, CKPT_DIR_PLAN) || (!strncmp(name, CKPT_DIR_PLAN, pl) &&
                                        !strncmp(name + pl, ".tmp", 4))))
    return 0;
  sr_fmt(err, errlen, "%s: holds %s, which is not part of a checkpoint folder (step-N folders "
         "of checkpoint files, their temporaries, %s, readers' working copies)", root, name,
         CKPT_DIR_PLAN);
  return SR_EEXISTS;
}

int ckpt_dir_check_root(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return SR_EIO;
  }
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    sr_fmt(err, errlen, "%s: is %s, not a checkpoint folder", path,
           S_ISREG(st.st_mode) ? "a file" : "not a folder");
    return SR_EEXISTS;
  }
  char **names;
  int n, rc = sr_list_dir(path, &names, &n);
  if (rc) {
    sr_fmt(err, errlen, "%s: cannot list: %s", path, sr_strerror(rc));
    return rc == SR_ENOMEM ? rc : SR_EIO;
  }
  for (int i = 0; i < n && !rc; i++) rc = check_root_entry(path, names[i], err, errlen);
  sr_paths_free(names, n);
  return rc;
}

/* dir without its trailing '/'s: its length. */
static int trimmed_len(const char *dir) {
  int len = (int)strlen(dir);
  while (len > 1 && dir[len - 1] == '/') len--;
  return len;
}

int ckpt_dir_tmp_beside(const char *dir, char *tmp, size_t len, char *err, size_t errlen) {
  char tag[SR_TMP_TAG_MAX];
  if (sr_tmp_tag(tag, sizeof tag)) {
    if (len) tmp[0] = 0;
    sr_fmt(err, errlen, "%s: cannot name a temporary folder", dir);
    return SR_ERANGE;
  }
  return sr_path_err(tmp, len, err, errlen, "%.*s.%s", trimmed_len(dir), dir, tag);
}

void ckpt_dir_sweep_beside(const char *dir) {
  char parent[SR_PATH_MAX], prefix[SR_PATH_MAX], d[SR_PATH_MAX];
  if (sr_path(d, sizeof d, "%.*s", trimmed_len(dir), dir) ||
      ckpt_dir_parent(d, parent, sizeof parent))
    return;
  const char *slash = strrchr(d, '/');
  if (!sr_path(prefix, sizeof prefix, "%s.", slash ? slash + 1 : d))
    sr_tmp_sweep(parent, prefix, stderr);
}

/* Where the file system cannot exchange two names: move the old dir aside
 * to dir.old-PID, rename tmp to dir (moving the old one back on failure),
 * then remove the old one. */
static int replace_aside(const char *tmp, const char *dir, const char *parent, char *err,
                         size_t errlen) {
  char old[SR_PATH_MAX];
  int rc = sr_path_err(old, sizeof old, err, errlen, "%s.old-%ld", dir, (long)getpid());
  if (rc) return rc;
  sr_rmtree(old); /* a leftover of an earlier run of this pid */
  if (rename(dir, old) != 0) {
    sr_fmt(err, errlen, "%s: cannot move the old one aside: %s", dir, strerror(errno));
    return SR_EIO;
  }
  if (rename(tmp, dir) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    rename(old, dir);
    return SR_EIO;
  }
  sr_fsync_dir(parent);
  sr_rmtree(old);
  return 0;
}

int ckpt_dir_replace(const char *tmp, const char *dir, int (*also)(const char *dir), char *err,
                     size_t errlen) {
  char parent[SR_PATH_MAX];
  struct stat st;
  if (ckpt_dir_parent(dir, parent, sizeof parent))
    return sr_path_too_long(err, errlen, dir, sizeof parent);
  int rc = ckpt_dir_check_root(dir, err, errlen);
  if (rc && !(rc == SR_EEXISTS && also && also(dir))) return rc; /* foreign: left as it is */
  sr_fsync_dir(tmp);
  if (lstat(dir, &st) != 0) {
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE) == 0 ||
        ((errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) && rename(tmp, dir) == 0)) {
      sr_fsync_dir(parent);
      return 0;
    }
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    return SR_EIO;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0) {
    if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)
      return replace_aside(tmp, dir, parent, err, errlen);
    sr_fmt(err, errlen, "%s: cannot exchange with %s: %s", tmp, dir, strerror(errno));
    return SR_EIO;
  }
  sr_fsync_dir(parent);
  sr_rmtree(tmp); /* the old one; a kill here leaves it to ckpt_dir_sweep_beside */
  return 0;
}

static int cmp_step(const void *a, const void *b) {
  long long x = ((const ckpt_dir_entry *)a)->step, y = ((const ckpt_dir_entry *)b)->step;
  return x < y ? -1 : x > y;
}

int ckpt_dir_list(const char *root, ckpt_dir_entry **out, int *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return SR_ENOTFOUND;
  struct dirent *de;
  int cap = 0;
  while ((de = readdir(d))) {
    long long s = ckpt_dir_step_of(de->d_name);
    if (s < 0) continue;
    char done[SR_PATH_MAX];
    if (sr_path(done, sizeof done, "%s/%s/DONE", root, de->d_name) || !sr_is_file(done))
      continue; /* one too long to name is no checkpoint we can read */
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      ckpt_dir_entry *np = realloc(*out, (size_t)cap * sizeof *np);
      if (!np) break;
      *out = np;
    }
    (*out)[*n].step = s;
    snprintf((*out)[*n].name, sizeof(*out)[*n].name, "%s", de->d_name);
    (*n)++;
  }
  closedir(d);
  if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_step);
  return 0;
}

int ckpt_dir_resolve(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
  char p[SR_PATH_MAX];
  if (outlen) out[0] = 0; /* never a cut or stale name on failure */
  if (sr_path_err(p, sizeof p, err, errlen, "%s/manifest.json", path)) return SR_ERANGE;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (sr_is_file(p) || ckpt_dir_step_of(base) >= 0)
    return sr_path_err(out, outlen, err, errlen, "%s", path);
  ckpt_dir_entry *sd;
  int n;
  if (ckpt_dir_list(path, &sd, &n)) {
    sr_fmt(err, errlen, "%s: no such checkpoint folder", path);
    return SR_ENOTFOUND;
  }
  if (!n) {
    sr_fmt(err, errlen, "%s: no complete checkpoint (no step-N folder with a DONE marker)", path);
    return SR_ENOTFOUND;
  }
  int rc = sr_path_err(out, outlen, err, errlen, "%s/%s", path, sd[n - 1].name);
  free(sd);
  return rc;
}

/* ---- writing ---- */

int ckpt_dir_begin(const char *root, long long step, ckpt_dir_txn *t, int *exists, char *err,
                   size_t errlen) {
  char done[SR_PATH_MAX], tag[SR_TMP_TAG_MAX];
  *exists = 0;
  if (sr_tmp_tag(tag, sizeof tag)) {
    sr_fmt(err, errlen, "%s: cannot name a temporary folder", root);
    return SR_ERANGE;
  }
  /* A name that does not fit is refused before anything is made or removed:
   * a cut-short tmp or final handed to the removes below could name another
   * folder. */
  if (sr_path_err(t->root, sizeof t->root, err, errlen, "%s", root) ||
      sr_path_err(t->final, sizeof t->final, err, errlen, "%s/step-%lld", root, step) ||
      sr_path_err(t->tmp, sizeof t->tmp, err, errlen, "%s/.step-%lld.%s", root, step, tag) ||
      sr_path_err(done, sizeof done, err, errlen, "%s/DONE", t->final))
    return SR_ERANGE;
  if (sr_is_file(done)) {
    *exists = 1;
    return 0;
  }
  if (sr_mkdirs(root) != 0) {
    sr_fmt(err, errlen, "%s: cannot create folder: %s", root, strerror(errno));
    return SR_EIO;
  }
  sr_tmp_sweep(root, ".step-", stderr); /* what writers killed before us left */
  sr_rmtree(t->tmp);
  sr_rmtree(t->final); /* a torn one from an earlier crash */
  if (mkdir(t->tmp, 0777) != 0) {
    sr_fmt(err, errlen, "%s: cannot create folder: %s", t->tmp, strerror(errno));
    return SR_EIO;
  }
  return 0;
}

cJSON *ckpt_dir_manifest_new(void) {
  cJSON *man = cJSON_CreateObject();
  if (man && !cJSON_AddNumberToObject(man, "format", CKPT_DIR_FORMAT)) {
    cJSON_Delete(man);
    man = NULL;
  }
  return man;
}

/* Every folder under path synced, each after the folders in it, path
 * last: a file's name is durable once the folder holding it is synced
 * (the files themselves are synced by their writers), on file systems
 * that do not order a folder's entries with its parent's. 0, or SR_EIO
 * naming the folder (a file system that cannot sync a folder at all,
 * EINVAL, counts as synced). */
static int sync_tree(const char *path, char *err, size_t errlen) {
  DIR *d = opendir(path);
  if (!d) {
    sr_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return SR_EIO;
  }
  int rc = 0, fd = dirfd(d);
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    struct stat st;
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
        fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
      continue;
    char sub[SR_PATH_MAX];
    rc = sr_path_err(sub, sizeof sub, err, errlen, "%s/%s", path, e->d_name);
    if (!rc) rc = sync_tree(sub, err, errlen);
  }
  if (!rc && fsync(fd) != 0 && errno != EINVAL) {
    sr_fmt(err, errlen, "%s: cannot sync the folder: %s", path, strerror(errno));
    rc = SR_EIO;
  }
  closedir(d);
  return rc;
}

/* man's "files": every file under tmp with its size and SHA-256. */
static int list_files(const char *tmp, cJSON *man, char *err, size_t errlen) {
  char **files = NULL;
  int nf = 0, rc;
  cJSON_DeleteItemFromObjectCaseSensitive(man, "files");
  cJSON *fl = cJSON_AddArrayToObject(man, "files");
  if ((rc = sr_list_files(tmp, &files, &nf))) {
    sr_fmt(err, errlen, "%s: cannot list files", tmp);
    return rc;
  }
  for (int i = 0; i < nf && !rc; i++) {
    char fp[SR_PATH_MAX], hex[65];
    uint64_t size;
    if ((rc = sr_path_err(fp, sizeof fp, err, errlen, "%s/%s", tmp, files[i]))) break;
    if ((rc = sr_sha256_file(fp, hex, &size))) {
      sr_fmt(err, errlen, "%s: cannot read", fp);
      break;
    }
    cJSON *f = cJSON_CreateObject();
    if (!f || !fl) {
      cJSON_Delete(f);
      sr_fmt(err, errlen, "manifest: out of memory");
      rc = SR_ENOMEM;
      break;
    }
    cJSON_AddStringToObject(f, "path", files[i]);
    cJSON_AddNumberToObject(f, "size", (double)size);
    cJSON_AddStringToObject(f, "sha256", hex);
    cJSON_AddItemToArray(fl, f);
  }
  sr_paths_free(files, nf);
  return rc;
}

int ckpt_dir_commit(const ckpt_dir_txn *t, cJSON *man, char *err, size_t errlen) {
  char path[SR_PATH_MAX];
  int rc = list_files(t->tmp, man, err, errlen);
  if (rc) return rc;
  char done_tmp[SR_PATH_MAX];
  if (sr_path_err(path, sizeof path, err, errlen, "%s/manifest.json", t->tmp) ||
      sr_path_err(done_tmp, sizeof done_tmp, err, errlen, "%s/DONE.tmp", t->final))
    return SR_ERANGE; /* checked before anything is renamed (DONE is shorter) */
  char *text = cJSON_Print(man);
  if (!text) {
    sr_fmt(err, errlen, "manifest: out of memory");
    return SR_ENOMEM;
  }
  sr_path(path, sizeof path, "%s/manifest.json", t->tmp); /* fits: checked above */
  if ((rc = write_file(path, text, strlen(text), err, errlen)) ||
      (rc = sync_tree(t->tmp, err, errlen)))
    goto out;
  if (rename(t->tmp, t->final) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", t->tmp, t->final, strerror(errno));
    rc = SR_EIO;
    goto out;
  }
  sr_fsync_dir(t->root);
  char hex[65], done[80];
  if ((rc = sr_sha256_hex(text, strlen(text), hex))) {
    sr_fmt(err, errlen, "%s: SHA-256 of the manifest failed: %s", t->tmp, sr_strerror(rc));
    goto out;
  }
  snprintf(done, sizeof done, "%s\n", hex);
  /* DONE appears whole or not at all: a writer killed while writing it
   * leaves DONE.tmp, and the folder stays incomplete. */
  sr_path(path, sizeof path, "%s/DONE", t->final); /* fits: checked above */
  if ((rc = write_file(done_tmp, done, strlen(done), err, errlen))) goto out;
  if (rename(done_tmp, path) != 0) {
    sr_fmt(err, errlen, "%s: cannot rename to %s: %s", done_tmp, path, strerror(errno));
    rc = SR_EIO;
    goto out;
  }
  sr_fsync_dir(t->final);
out:
  free(text);
  return rc;
}

void ckpt_dir_abort(const ckpt_dir_txn *t) { sr_rmtree(t->tmp); }

void ckpt_dir_keep(const char *root, int keep) {
  if (keep <= 0) return;
  ckpt_dir_entry *sd;
  int n;
  if (ckpt_dir_list(root, &sd, &n)) return;
  char *kept = calloc((size_t)n + 1, 1);
  if (!kept) {
    free(sd);
    return; /* nothing removed rather than a link of a kept chain */
  }
  /* Descending: each kept one keeps its parent (a lower step) before the
   * parent's turn comes. */
  for (int i = n - 1; i >= 0; i--) {
    char path[SR_PATH_MAX], e2[256];
    if (i + keep >= n) kept[i] = 1;
    if (!kept[i] || sr_path(path, sizeof path, "%s/%s", root, sd[i].name)) continue;
    cJSON *man = NULL;
    if (ckpt_dir_read(path, &man, e2, sizeof e2)) continue;
    long long ps = ckpt_dir_parent_step(man);
    cJSON_Delete(man);
    for (int k = i - 1; k >= 0 && ps >= 0; k--)
      if (sd[k].step == ps) kept[k] = 1;
  }
  for (int i = 0; i < n; i++) {
    char path[SR_PATH_MAX];
    if (!kept[i] && !sr_path(path, sizeof path, "%s/%s", root, sd[i].name)) sr_rmtree(path);
  }
  free(kept);
  free(sd);
}

/* ---- chains ---- */

int ckpt_dir_set_kind(cJSON *man, long long parent_step, const char *parent_sha) {
  cJSON_DeleteItemFromObjectCaseSensitive(man, "kind");
  cJSON_DeleteItemFromObjectCaseSensitive(man, "parent");
  if (!cJSON_AddStringToObject(man, "kind", parent_step < 0 ? "full" : "incremental"))
    return SR_ENOMEM;
  if (parent_step < 0) return 0;
  cJSON *p = cJSON_AddObjectToObject(man, "parent");
  if (!p || !cJSON_AddNumberToObject(p, "step", (double)parent_step) ||
      !cJSON_AddStringToObject(p, "manifest_sha256", parent_sha))
    return SR_ENOMEM;
  return 0;
}

int ckpt_dir_make_full(cJSON *man) {
  cJSON *k = cJSON_CreateString("full");
  if (!k) return SR_ENOMEM;
  cJSON_DeleteItemFromObjectCaseSensitive(man, "parent");
  if (cJSON_GetObjectItemCaseSensitive(man, "kind")) {
    cJSON_ReplaceItemInObjectCaseSensitive(man, "kind", k);
    return 0;
  }
  cJSON_AddItemToObject(man, "kind", k);
  return 0;
}

long long ckpt_dir_parent_step(const cJSON *man) {
  const char *kind = jstr(man, "kind");
  if (!kind || !strcmp(kind, "full")) return -1;
  if (strcmp(kind, "incremental")) return SR_EFORMAT;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(man, "parent");
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(p, "step");
  const char *sha = jstr(p, "manifest_sha256");
  if (!cJSON_IsNumber(st) || st->valuedouble < 0 || st->valuedouble > 9e15 ||
      st->valuedouble != (double)(long long)st->valuedouble || !sha || strlen(sha) != 64)
    return SR_EFORMAT;
  return (long long)st->valuedouble;
}

int ckpt_dir_done(const char *dir, char *hex, char *err, size_t errlen) {
  char path[SR_PATH_MAX];
  if (sr_path_err(path, sizeof path, err, errlen, "%s/DONE", dir)) return SR_ERANGE;
  size_t len = 0;
  char *done = sr_read_file(path, &len);
  if (!done || len < 64) {
    sr_fmt(err, errlen, "%s: missing: the checkpoint is incomplete (its writer stopped before "
           "the end)", path);
    free(done);
    return SR_EFORMAT;
  }
  memcpy(hex, done, 64);
  hex[64] = 0;
  free(done);
  return 0;
}

int ckpt_dir_chain_links(const char *dir) {
  char cur[SR_PATH_MAX], root[SR_PATH_MAX], e2[SR_PATH_MAX + 256];
  int n = 0;
  if (sr_path(cur, sizeof cur, "%s", dir) || ckpt_dir_parent(dir, root, sizeof root)) return 1;
  for (;;) {
    cJSON *man = NULL;
    if (ckpt_dir_read(cur, &man, e2, sizeof e2)) return n ? n : 1;
    long long ps = ckpt_dir_parent_step(man);
    cJSON_Delete(man);
    n++;
    if (ps < 0 || n > 1 << 20 || sr_path(cur, sizeof cur, "%s/step-%lld", root, ps)) return n;
  }
}

void ckpt_dir_chain_free(ckpt_dir_chain *c) {
  if (!c) return;
  free(c->dirs);
  memset(c, 0, sizeof *c);
}

/* Put dir in front of c's links (the list is built from the head back). */
static int chain_push_front(ckpt_dir_chain *c, const char *dir) {
  char (*nd)[SR_CKPT_PATH] = realloc(c->dirs, (size_t)(c->n + 1) * sizeof *nd);
  if (!nd) return SR_ENOMEM;
  memmove(nd + 1, nd, (size_t)c->n * sizeof *nd);
  snprintf(nd[0], sizeof nd[0], "%s", dir);
  c->dirs = nd;
  c->n++;
  return 0;
}

/* The link after cur (its manifest man) back towards the full one: its
 * folder into pdir, its manifest (checked against the SHA-256 man names)
 * into *pman. */
static int chain_parent(const char *cur, const cJSON *man, long long ps, char *pdir,
                        cJSON **pman, char *err, size_t errlen) {
  char root[SR_PATH_MAX], hex[65];
  const char *base = strrchr(cur, '/');
  long long cs = ckpt_dir_step_of(base ? base + 1 : cur);
  if (ckpt_dir_parent(cur, root, sizeof root) ||
      sr_path_err(pdir, SR_PATH_MAX, err, errlen, "%s/step-%lld", root, ps))
    return SR_ERANGE;
  if (cs >= 0 && ps >= cs) {
    sr_fmt(err, errlen, "%s/manifest.json: its parent step-%lld is not an earlier step", cur, ps);
    return SR_EFORMAT;
  }
  int rc = ckpt_dir_read(pdir, pman, err, errlen);
  if (!rc) rc = ckpt_dir_done(pdir, hex, err, errlen);
  const char *want = jstr(cJSON_GetObjectItemCaseSensitive(man, "parent"), "manifest_sha256");
  if (!rc && strcmp(hex, want)) {
    sr_fmt(err, errlen, "%s: its manifest's SHA-256 is %.12s..., %s names %.12s... (the parent "
           "was written again or changed since)", pdir, hex, base ? base + 1 : cur, want);
    rc = SR_ECHECKSUM;
  }
  return rc;
}

int ckpt_dir_chain_open(const char *head, const cJSON *man, int files, ckpt_dir_chain *c,
                        char *err, size_t errlen) {
  char cur[SR_PATH_MAX], e2[SR_PATH_MAX + 512];
  const char *hb = strrchr(head, '/');
  hb = hb ? hb + 1 : head;
  memset(c, 0, sizeof *c);
  int incremental = ckpt_dir_parent_step(man) != -1, link = 1, rc;
  const cJSON *m = man;
  cJSON *owned = NULL;
  if ((rc = sr_path_err(cur, sizeof cur, err, errlen, "%s", head))) return rc;
  for (;;) {
    long long ps = ckpt_dir_parent_step(m);
    if (ps < -1) {
      sr_fmt(e2, sizeof e2, "%s/manifest.json: unknown kind or malformed parent", cur);
      rc = SR_EFORMAT;
    }
    if (!rc && files) rc = ckpt_dir_verify(cur, m, e2, sizeof e2);
    if (!rc) rc = chain_push_front(c, cur);
    if (rc || ps < 0) break;
    char pdir[SR_PATH_MAX];
    cJSON *pm = NULL;
    link++;
    rc = chain_parent(cur, m, ps, pdir, &pm, e2, sizeof e2);
    cJSON_Delete(owned);
    owned = pm;
    m = pm;
    if (rc) break;
    snprintf(cur, sizeof cur, "%s", pdir);
  }
  cJSON_Delete(owned);
  if (rc && incremental) sr_fmt(err, errlen, "%s (link %d of the chain of %s)", e2, link, hb);
  else if (rc) sr_fmt(err, errlen, "%s", e2);
  if (rc) ckpt_dir_chain_free(c);
  return rc;
}

/* ---- reading ---- */

int ckpt_dir_read(const char *dir, cJSON **out, char *err, size_t errlen) {
  char path[SR_PATH_MAX];
  int rc = 0;
  char *text = NULL, *done = NULL;
  cJSON *man = NULL;
  *out = NULL;
  if (!sr_is_dir(dir)) {
    sr_fmt(err, errlen, "%s: no such checkpoint folder", dir);
    return SR_ENOTFOUND;
  }
  if (sr_path_err(path, sizeof path, err, errlen, "%s/manifest.json", dir)) return SR_ERANGE;
  sr_path(path, sizeof path, "%s/DONE", dir); /* shorter than manifest.json's: fits */
  if (!(done = sr_read_file(path, NULL))) {
    sr_fmt(err, errlen,
           "%s: missing: the checkpoint is incomplete (its writer stopped before the end)", path);
    return SR_EFORMAT;
  }
  sr_path(path, sizeof path, "%s/manifest.json", dir); /* fits: checked above */
  size_t tl = 0;
  if (!(text = sr_read_file(path, &tl))) {
    sr_fmt(err, errlen, "%s: missing or unreadable", path);
    rc = SR_EFORMAT;
    goto out;
  }
  char hex[65];
  if ((rc = sr_sha256_hex(text, tl, hex))) {
    sr_fmt(err, errlen, "%s: SHA-256 failed: %s", path, sr_strerror(rc));
    goto out;
  }
  if (strncmp(done, hex, 64)) {
    sr_fmt(err, errlen, "%s: checksum does not match the one in DONE (file damaged)", path);
    rc = SR_ECHECKSUM;
    goto out;
  }
  man = cJSON_Parse(text);
  const cJSON *fmt = man ? cJSON_GetObjectItemCaseSensitive(man, "format") : NULL;
  if (!cJSON_IsObject(man) || !cJSON_IsNumber(fmt)) {
    sr_fmt(err, errlen, "%s: not a checkpoint manifest (missing fields)", path);
    rc = SR_EFORMAT;
    goto out;
  }
  if (fmt->valuedouble != CKPT_DIR_FORMAT) {
    sr_fmt(err, errlen, "%s: format %g is not supported (this build reads %d)", path,
           fmt->valuedouble, CKPT_DIR_FORMAT);
    rc = SR_EVERSION;
    goto out;
  }
  *out = man;
  man = NULL;
out:
  cJSON_Delete(man);
  free(text);
  free(done);
  return rc;
}

int ckpt_dir_fingerprint(const cJSON *man, const char *field, const char *src,
                         const char **fp, char *err, size_t errlen) {
  const cJSON *xj = cJSON_GetObjectItemCaseSensitive(man, field);
  *fp = NULL;
  if (!xj) return 0;
  const char *want = jstr(xj, "fingerprint"), *name = jstr(xj, "file"), *listed = NULL;
  const cJSON *f;
  cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(man, "files")) {
    const char *path = jstr(f, "path");
    if (name && path && !strcmp(path, name)) listed = jstr(f, "sha256");
  }
  if (!want || strlen(want) != SR_SHA256_HEX - 1 || !listed || strcmp(want, listed)) {
    sr_fmt(err, errlen, "%s: %s: its fingerprint %.12s is not the SHA-256 of a listed %s (%.12s)",
           src, field, want ? want : "(none)", name ? name : "(no file named)",
           listed ? listed : "not listed");
    return SR_EFORMAT;
  }
  *fp = want;
  return 0;
}

int ckpt_dir_verify(const char *dir, const cJSON *man, char *err, size_t errlen) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files"), *f;
  if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) == 0) {
    sr_fmt(err, errlen, "%s/manifest.json: no file list", dir);
    return SR_EFORMAT;
  }
  cJSON_ArrayForEach(f, files) {
    const char *rel = jstr(f, "path"), *want = jstr(f, "sha256");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(f, "size");
    if (!rel || !want || !cJSON_IsNumber(size) || strstr(rel, "..")) {
      sr_fmt(err, errlen, "%s/manifest.json: a malformed entry in files", dir);
      return SR_EFORMAT;
    }
    char fp[SR_PATH_MAX], got[65];
    uint64_t gs;
    if (sr_path_err(fp, sizeof fp, err, errlen, "%s/%s", dir, rel)) return SR_ERANGE;
    if (sr_sha256_file(fp, got, &gs)) {
      sr_fmt(err, errlen, "%s: missing or unreadable (listed in the manifest)", fp);
      return SR_ENOTFOUND;
    }
    if ((double)gs != size->valuedouble) {
      sr_fmt(err, errlen, "%s: %llu bytes, the manifest says %.0f (torn or truncated)", fp,
             (unsigned long long)gs, size->valuedouble);
      return SR_EFORMAT;
    }
    if (strcmp(got, want)) {
      sr_fmt(err, errlen, "%s: checksum mismatch (file damaged)", fp);
      return SR_ECHECKSUM;
    }
  }
  return 0;
}

/* ---- shards/ ---- */

int ckpt_dir_shards_path(const char *step_dir, char *buf, size_t len) {
  return sr_path(buf, len, "%s/shards", step_dir);
}

int ckpt_dir_shard_path(const char *dir, int k, char *buf, size_t len) {
  return sr_path(buf, len, "%s/shard-%d", dir, k);
}

int ckpt_dir_shard_db_exists(const char *dir, int k, char *db, size_t len) {
  char p[SR_PATH_MAX];
  if (ckpt_dir_shard_path(dir, k, db, len) || sr_path(p, sizeof p, "%s/CURRENT", db)) {
    if (len) db[0] = 0;
    return 0;
  }
  return sr_is_file(p);
}

static int owner_paths(const char *dir, const char *owner, char *file, char *real, char *err,
                       size_t errlen) {
  if (sr_path_confine("/", owner, real, SR_PATH_MAX, err, errlen)) return SR_EINVAL;
  if (sr_path(file, SR_PATH_MAX, "%s/" CKPT_DATA_OWNER, dir)) {
    sr_fmt(err, errlen, "%s: path too long", dir);
    return SR_ERANGE;
  }
  return 0;
}

int ckpt_dir_data_claim(const char *dir, const char *owner, char *err, size_t errlen) {
  char file[SR_PATH_MAX], real[SR_PATH_MAX], tmp[SR_PATH_MAX + 64];
  int rc = owner_paths(dir, owner, file, real, err, errlen);
  if (rc) return rc;
  if (sr_mkdirs(dir)) {
    sr_fmt(err, errlen, "%s: cannot create it: %s", dir, strerror(errno));
    return SR_EIO;
  }
  snprintf(tmp, sizeof tmp, "%s.%ld", file, (long)getpid());
  FILE *f = fopen(tmp, "w");
  int ok = f && fprintf(f, "%s\n", real) > 0;
  ok = f && !fclose(f) && ok && !rename(tmp, file);
  if (!ok) {
    sr_fmt(err, errlen, "%s: cannot write it: %s", file, strerror(errno));
    unlink(tmp);
    return SR_EIO;
  }
  return 0;
}

int ckpt_dir_data_claimed_by(const char *dir, const char *owner) {
  char file[SR_PATH_MAX], real[SR_PATH_MAX], got[SR_PATH_MAX + 2], err[256];
  if (owner_paths(dir, owner, file, real, err, sizeof err)) return 0;
  FILE *f = fopen(file, "r");
  if (!f) return 0;
  int same = fgets(got, sizeof got, f) && (got[strcspn(got, "\n")] = 0, !strcmp(got, real));
  fclose(f);
  return same;
}

int ckpt_dir_fresh_shard(const char *dir, int k, const char *owner, int *removed, char *db,
                         size_t len) {
  *removed = 0;
  if (!ckpt_dir_shard_db_exists(dir, k, db, len)) return 0;
  if (!owner || !ckpt_dir_data_claimed_by(dir, owner)) return SR_EEXISTS;
  if (sr_rmtree(db)) return SR_EIO;
  *removed = 1;
  return 0;
}

int ckpt_dir_server_path(const char *dir, const int *shards, int n, char *buf, size_t len) {
  if (n < 1) return SR_EINVAL;
  int rc = sr_path(buf, len, "%s/shard", dir);
  for (int i = 0; i < n && !rc; i++) {
    size_t at = strlen(buf);
    if ((rc = sr_path(buf + at, len - at, "-%d", shards[i]))) buf[0] = 0;
  }
  return rc; /* a name that does not fit leaves buf empty, as sr_path */
}

int ckpt_dir_table_file(const char *dir, uint32_t table_id, char *buf, size_t len) {
  return sr_path(buf, len, "%s/table-%u.bin", dir, table_id);
}

int ckpt_dir_removed_file(const char *dir, uint32_t table_id, char *buf, size_t len) {
  return sr_path(buf, len, "%s/removed-%u.bin", dir, table_id);
}

int ckpt_dir_server_shards(const char *name, int *ks, int max) {
  if (strncmp(name, "shard-", 6)) return 0;
  const char *p = name + 6;
  int n = 0;
  while (*p) {
    char *end;
    if (*p < '0' || *p > '9' || n == max) return 0;
    long v = strtol(p, &end, 10);
    if (v > 0x7fffffffL || (*end && (*end != '-' || !end[1]))) return 0;
    ks[n++] = (int)v;
    p = *end ? end + 1 : end;
  }
  return n;
}

/* table_id of a file name "<prefix><id>.bin", or -1 for any other name. */
static long long id_of(const char *name, const char *prefix) {
  size_t l = strlen(prefix);
  if (strncmp(name, prefix, l) || name[l] < '0' || name[l] > '9') return -1;
  char *end;
  unsigned long long v = strtoull(name + l, &end, 10);
  return v <= 0xffffffffULL && !strcmp(end, ".bin") ? (long long)v : -1;
}

long long ckpt_dir_table_of(const char *name) { return id_of(name, "table-"); }

long long ckpt_dir_removed_of(const char *name) { return id_of(name, "removed-"); }

static int is_table_name(const char *name) { return ckpt_dir_table_of(name) >= 0; }

/* Does folder hold a table-<id>.bin file? */
static int holds_table_files(const char *folder) {
  DIR *d = opendir(folder);
  if (!d) return 0;
  struct dirent *de;
  int found = 0;
  while (!found && (de = readdir(d))) found = is_table_name(de->d_name);
  closedir(d);
  return found;
}

int ckpt_dir_shards_layout(const char *shards, ckpt_shards_layout *out, char *err, size_t errlen) {
  DIR *d = opendir(shards);
  if (!d) {
    sr_fmt(err, errlen, "%s: cannot open: %s", shards, strerror(errno));
    return SR_ENOTFOUND;
  }
  int n[3] = {0, 0, 0}, ks[256];
  struct dirent *de;
  char p[4600];
  while ((de = readdir(d))) {
    if (is_table_name(de->d_name)) {
      n[CKPT_SHARDS_TABLES]++;
      continue;
    }
    int nk = ckpt_dir_server_shards(de->d_name, ks, 256);
    if (!nk) continue;
    if (nk == 1 && !sr_path(p, sizeof p, "%s/%s/CURRENT", shards, de->d_name) &&
        sr_is_file(p))
      n[CKPT_SHARDS_DBS]++;
    else if (!sr_path(p, sizeof p, "%s/%s", shards, de->d_name) &&
             holds_table_files(p))
      n[CKPT_SHARDS_SERVER_TABLES]++;
  }
  closedir(d);
  int kinds = !!n[0] + !!n[1] + !!n[2];
  if (kinds > 1) {
    sr_fmt(err, errlen, "%s: holds %s%s%s%s%s: not a checkpoint this build wrote", shards,
           n[0] ? "RocksDB shard databases" : "", n[0] && n[1] ? " and " : "",
           n[1] ? "table files" : "", (n[0] || n[1]) && n[2] ? " and " : "",
           n[2] ? "server folders of table files" : "");
    return SR_EFORMAT;
  }
  if (!kinds) {
    sr_fmt(err, errlen, "%s: holds no embedding rows (no shard-K/ databases, no "
           "table-<id>.bin files)", shards);
    return SR_ENOTFOUND;
  }
  *out = n[0] ? CKPT_SHARDS_DBS : n[1] ? CKPT_SHARDS_TABLES : CKPT_SHARDS_SERVER_TABLES;
  return 0;
}

int ckpt_dir_server_folders(const char *shards, int n_shards, char (*folder)[256], char *err,
                            size_t errlen) {
  for (int k = 0; k < n_shards; k++) folder[k][0] = 0;
  DIR *d = opendir(shards);
  if (!d) {
    sr_fmt(err, errlen, "%s: cannot open: %s", shards, strerror(errno));
    return SR_ENOTFOUND;
  }
  struct dirent *de;
  int ks[256];
  while ((de = readdir(d))) {
    int n = ckpt_dir_server_shards(de->d_name, ks, 256);
    for (int i = 0; i < n; i++)
      if (ks[i] < n_shards && strlen(de->d_name) < sizeof folder[0])
        snprintf(folder[ks[i]], sizeof folder[0], "%s", de->d_name);
  }
  closedir(d);
  return 0;
}

const char *ckpt_dir_shards_layout_name(ckpt_shards_layout l) {
  switch (l) {
    case CKPT_SHARDS_DBS: return "RocksDB shard databases";
    case CKPT_SHARDS_TABLES: return "the in-memory trainer's table files";
    case CKPT_SHARDS_SERVER_TABLES: return "in-memory servers' table files";
  }
  return "?";
}
