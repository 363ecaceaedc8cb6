/* File-tree helpers every module uses (checkpoints, shard databases, table
 * files, scratch folders): paths that never truncate silently, making,
 * listing, copying, removing and fsyncing folders. Every call returns 0 or a
 * negative SR_E* code (common/status.h); none prints. */
#ifndef SHARDREC_COMMON_FS_H
#define SHARDREC_COMMON_FS_H

#include <stddef.h>
#include <stdio.h>

/* The longest path the kernel takes (Linux PATH_MAX, the NUL included): a
 * path buffer of this size holds any path a call can use. */
#ifndef SR_PATH_MAX
#define SR_PATH_MAX 4096
#endif

/* Format a path into buf[len] in the manner of snprintf. Returns 0, or
 * SR_ERANGE when the result (and its NUL) does not fit in len bytes: buf is
 * then the empty string, never a truncated path. SR_EINVAL for len == 0. */
int sr_path(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* sr_path, and when the path does not fit, the message sr_path_too_long
 * writes, into err (errlen 0: none). 0, SR_ERANGE or SR_EINVAL as
 * sr_path. */
int sr_path_err(char *buf, size_t len, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The message for a path that does not fit in limit bytes (its NUL
 * included), naming its start (path: the whole path, or as much of it as
 * was formatted) into err: "<the first 64 characters>...: path too long
 * (over <limit - 1> characters)". Returns SR_ERANGE, for
 * `return sr_path_too_long(...)`. */
int sr_path_too_long(char *err, size_t errlen, const char *path, size_t limit);

/* Write all of p[n] to fd (short writes and EINTR retried). 0, or -1 with
 * errno set (a write that makes no progress is EIO). */
int sr_write_all(int fd, const void *p, size_t n);

/* The whole file at path, NUL-terminated (malloc'd, the caller frees);
 * *len (may be NULL) gets its size. NULL with errno set on failure. */
char *sr_read_file(const char *path, size_t *len);

/* 1 when path is a regular file / a folder (symlinks followed), else 0. */
int sr_is_file(const char *path);
int sr_is_dir(const char *path);

/* Make the folder path and any missing parents (mode 0777 before umask); an
 * existing folder is fine. 0, SR_ERANGE (path too long) or SR_EIO (a
 * component cannot be made, or exists and is not a folder). */
int sr_mkdirs(const char *path);

/* Remove a folder tree, or a file (a symlink is removed, not followed).
 * Missing is fine. 0 or SR_EIO (what could be removed is removed). */
int sr_rmtree(const char *path);

/* Copy the file src to dst (created; must not exist), fsynced. 0 or SR_EIO
 * with the reason, naming both paths, in err. */
int sr_copy_file(const char *src, const char *dst, char *err, size_t errlen);

/* Copy the tree src to dst (created; must not exist), hard-linking *.sst
 * files (immutable: RocksDB never rewrites one) and copying the rest. 0 or
 * SR_EIO / SR_ERANGE with the reason in err; a failed copy leaves what it
 * made at dst for the caller to remove. */
int sr_copytree(const char *src, const char *dst, char *err, size_t errlen);

/* fsync a folder (after creating or renaming entries in it). 0 or SR_EIO. */
int sr_fsync_dir(const char *path);

/* Relative paths ("a/b.sst") of the regular files under root, recursively,
 * sorted by strcmp; *paths a malloc'd array of malloc'd strings, caller
 * frees with sr_paths_free. 0 or SR_EIO / SR_ENOMEM / SR_ERANGE (*paths
 * NULL, *n 0 then). */
int sr_list_files(const char *root, char ***paths, int *n);

/* Names of the entries of the folder path (files and folders, not "." and
 * ".."), sorted by strcmp; ownership as sr_list_files. 0 or SR_ENOTFOUND
 * (cannot open path) / SR_ENOMEM. */
int sr_list_dir(const char *path, char ***names, int *n);

/* Free what sr_list_files / sr_list_dir returned; NULL-safe. */
void sr_paths_free(char **paths, int n);

/* Confine path to the folder root (as realpath gives it: absolute, no
 * symlinks, no trailing '/'). path (absolute, or from the current folder) is
 * resolved as the kernel would reach it: the realpath of its longest
 * existing part (symlinks and ".." followed), then the components that do
 * not exist yet, each a plain name (not "." or "..", not a symlink that
 * leads nowhere). The result goes into out[len]. 0 when it is root or lies
 * under it; SR_EINVAL when it lies outside ("PATH resolves to R, outside
 * ROOT"); SR_EFORMAT (empty path, "." or ".." after a missing folder, a
 * dangling symlink), SR_ERANGE (too long) or SR_EIO (a part cannot be
 * resolved: permission, a symlink loop, not a folder); on failure the
 * reason is in err and out is empty or untouched. A check, not a lock: a
 * symlink made inside root after it is not seen. */
int sr_path_confine(const char *root, const char *path, char *out, size_t len, char *err,
                    size_t errlen);

/* ---- temporary folders and their owners ----
 * A temporary name holds a tag naming its owner, "tmp-PID-START-BOOT-HOST":
 * the process id, its start time (/proc/PID/stat field 22, clock ticks
 * since boot), the first 12 hex digits of the boot id
 * (/proc/sys/kernel/random/boot_id) and the host name (characters other
 * than letters, digits, '.', '-' and '_' as '_', at most 64), so that a
 * PID reused after a reboot or in another container of the host is never
 * taken for the owner. */

/* The widest tag sr_tmp_tag writes, its NUL included: room to keep under
 * a folder whose names carry one. */
#define SR_TMP_TAG_MAX 120

/* This process's tag into buf[len]. 0, or SR_ERANGE (len too small: buf
 * empty). */
int sr_tmp_tag(char *buf, size_t len);

/* 1 when the tag at the start of s (as sr_tmp_tag writes it) names a
 * process of this host that is gone (another boot, no such PID, or a PID
 * started at another time), 0 when its owner lives, is on another host,
 * or s holds no tag. */
int sr_tmp_owner_gone(const char *s);

/* Remove the entries of dir (folders or files) named PREFIX...tmp-TAG (the
 * first "tmp-" after prefix) whose owner is gone (sr_tmp_owner_gone), each
 * with a line on say (NULL: none) naming it, "a temporary folder" or "a
 * temporary file", and its owner: what a killed writer left. A
 * missing dir is fine. The number removed, or SR_ENOMEM. */
int sr_tmp_sweep(const char *dir, const char *prefix, FILE *say);

#endif
