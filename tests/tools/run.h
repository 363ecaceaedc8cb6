/* Helpers for tests that run the shardrec binary (SHARDREC_BIN) in a shell. */
#ifndef SHARDREC_TESTS_TOOLS_RUN_H
#define SHARDREC_TESTS_TOOLS_RUN_H

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static inline const char *bin_path(void) {
  const char *b = getenv("SHARDREC_BIN");
  ck_assert_msg(b != NULL, "SHARDREC_BIN is not set (run through ctest)");
  return b;
}

/* Run a shell command (printf-style); capture stdout+stderr into a malloc'd
 * string (*out, may be NULL to discard). Returns the exit status. */
static inline int run_cmd(char **out, const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[8300];
  snprintf(full, sizeof full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_msg(p != NULL, "popen failed: %s", cmd);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 4096) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  int st = pclose(p);
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static inline char *make_tmpdir(void) {
  char *d = strdup("/tmp/shardrec-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d));
  return d;
}

/* A new temporary folder (returned, malloc'd) holding rows generated lines
 * (datagen --seed seed, d.tsv) converted with the last 10% as the test
 * split (d.bin); then the shell command then_fmt (printf-style; NULL:
 * none) run there. Asserts that all of it succeeded. */
__attribute__((format(printf, 3, 4))) static inline char *make_data_dir(int rows, int seed,
                                                                        const char *then_fmt, ...) {
  char then[6000] = "";
  if (then_fmt) {
    va_list ap;
    va_start(ap, then_fmt);
    vsnprintf(then, sizeof then, then_fmt, ap);
    va_end(ap);
  }
  char *d = make_tmpdir(), *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows %d --seed %d --out d.tsv && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin%s%s",
                   d, bin_path(), rows, seed, bin_path(), *then ? " && " : "", then);
  ck_assert_msg(rc == 0, "data preparation failed: %s", out);
  free(out);
  return d;
}

/* Read a whole file into a malloc'd string; NULL if it cannot be read. */
static inline char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

/* Value after `key` in text (e.g. "auc "), as a double; NAN if absent. */
static inline double find_num(const char *text, const char *key) {
  const char *p = strstr(text, key);
  return p ? strtod(p + strlen(key), NULL) : __builtin_nan("");
}

#endif
