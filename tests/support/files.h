/* Files for tests: a new temporary folder (tmpdir_new, tmpdir_make), a
 * path in it (tmp_join), a whole file read back (slurp_file, slurp), what a text file holds
 * (file_count, find_num). One copy of each, for every suite. */
#ifndef SHARDREC_TESTS_SUPPORT_FILES_H
#define SHARDREC_TESTS_SUPPORT_FILES_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new folder shardrec-TAG-XXXXXX (mkdtemp) in $TMPDIR, or in /tmp where
 * TMPDIR is not set. Its name, malloc'd (caller frees); NULL if it could
 * not be made (errno says why). Plain C, no Check assertion: usable in a
 * suite's main before the cases fork. */
static inline char *tmpdir_new(const char *tag) {
  const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  size_t n = strlen(base) + strlen("/shardrec--XXXXXX") + strlen(tag) + 1;
  char *d = malloc(n);
  if (!d) return NULL;
  snprintf(d, n, "%s/shardrec-%s-XXXXXX", base, tag);
  if (!mkdtemp(d)) {
    free(d);
    return NULL;
  }
  return d;
}

/* Inside a test: tmpdir_new, failing the test when no folder is made. */
static inline char *tmpdir_make(const char *tag) {
  char *d = tmpdir_new(tag);
  ck_assert_msg(d != NULL, "no temporary folder shardrec-%s-XXXXXX", tag);
  return d;
}

/* dir/name in one of four rotating static buffers (so that a call may take
 * up to four at once): a file of a suite's temporary folder. */
static inline const char *tmp_join(const char *dir, const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* The whole file at path in a malloc'd buffer with a NUL after its bytes
 * (caller frees); its size in *len (len may be NULL). A file that cannot
 * be opened or read whole gives NULL, or with must (inside a test) fails
 * the test naming the file. */
static inline char *slurp_file(const char *path, size_t *len, int must) {
  FILE *f = fopen(path, "rb");
  char *s = NULL;
  long n = -1;
  if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (s = malloc((size_t)n + 1)) != NULL && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (f) fclose(f);
  if (must) ck_assert_msg(s != NULL, "%s: cannot read it whole", path);
  if (!s) return NULL;
  s[n] = 0;
  if (len) *len = (size_t)n;
  return s;
}

/* The text of the file at path (caller frees); NULL if it cannot be read. */
static inline char *slurp(const char *path) { return slurp_file(path, NULL, 0); }

/* The last 3000 bytes of text s (all of a shorter one): a log's end, to
 * show beside a failure. */
static inline const char *text_end(const char *s) {
  const size_t len = strlen(s);
  return s + (len > 3000 ? len - 3000 : 0);
}

/* Write n bytes of data to path, replacing what was there (fails the test
 * naming the file when it cannot). file_put: a NUL-terminated text. */
static inline void file_put_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: cannot create it", path);
  ck_assert_msg(fwrite(data, 1, n, f) == n && fclose(f) == 0, "%s: cannot write it", path);
}
static inline void file_put(const char *path, const char *text) {
  file_put_bytes(path, text, strlen(text));
}

/* The file at path holds exactly the text want (fails the test naming the
 * file otherwise). */
static inline void file_text_is(const char *path, const char *want) {
  char *got = slurp_file(path, NULL, 1);
  ck_assert_msg(!strcmp(got, want), "%s: holds '%s', not '%s'", path, got, want);
  free(got);
}

/* Value after `key` in text (e.g. "auc "), as a double; NAN if absent. */
static inline double find_num(const char *text, const char *key) {
  const char *p = strstr(text, key);
  return p ? strtod(p + strlen(key), NULL) : __builtin_nan("");
}

/* Occurrences of text in the file at path (0 if it cannot be read). */
static inline int file_count(const char *path, const char *text) {
  char *s = slurp(path);
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, text)); p += strlen(text)) n++;
  free(s);
  return n;
}

#endif
