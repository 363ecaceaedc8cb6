/* What the end-to-end train suites (test_train_prefetch.c,
 * test_train_threads.c) share: their data, `datagen --rows ROWS --seed
 * SEED` converted with a 10% test split into DIR/d.bin, and the bits of a
 * metrics file. */
#ifndef SHARDREC_TESTS_TRAIN_E2E_DATA_H
#define SHARDREC_TESTS_TRAIN_E2E_DATA_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

/* A new folder /tmp/shardrec-TAG-XXXXXX (returned, malloc'd) and in it
 * d.bin, made with the binary $SHARDREC_BIN. NULL with what failed on
 * stderr under suite's name. Plain C: for a suite's main. */
static inline char *e2e_data_make(const char *suite, const char *tag, long rows, int seed) {
  const char *bin = getenv("SHARDREC_BIN");
  char *dir = bin ? tmpdir_new(tag) : NULL;
  if (!dir) {
    fprintf(stderr, "%s: SHARDREC_BIN unset (run through ctest) or no temporary folder\n", suite);
    return NULL;
  }
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd %s && (%s datagen --rows %ld --seed %d --out d.tsv && %s convert "
           "--test-fraction 0.1 d.tsv d.bin && rm d.tsv) > prep.log 2>&1 || (cat prep.log >&2; exit 1)",
           dir, bin, rows, seed, bin);
  if (system(cmd) == 0) return dir;
  free(dir);
  return NULL;
}

/* The metrics file at path with the rates cut out (all that threads or
 * the look-ahead may change): each line up to "samples_per_s", test lines
 * whole. Caller frees. */
static inline char *e2e_bits_of(const char *path) {
  char *s = slurp(path);
  ck_assert_msg(s != NULL, "no %s", path);
  char *out = malloc(strlen(s) + 1), *o = out;
  for (char *l = strtok(s, "\n"); l; l = strtok(NULL, "\n")) {
    char *r = strstr(l, ",\"samples_per_s\"");
    size_t n = r ? (size_t)(r - l) : strlen(l);
    memcpy(o, l, n);
    o += n;
    *o++ = '\n';
  }
  *o = 0;
  free(s);
  return out;
}

/* Remove what e2e_data_make made (nothing if dir is NULL) and free dir. */
static inline void e2e_data_remove(char *dir) {
  if (!dir) return;
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  free(dir);
}

#endif
