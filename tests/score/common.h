/* Shared by the scoring suites (test_predict.c, test_predict_serve.c): one
 * data folder per suite, trainings that leave a checkpoint and the
 * trainer's own test predictions (train --test-pred-out), and small file
 * helpers. */
#ifndef SHARDREC_TESTS_SCORE_COMMON_H
#define SHARDREC_TESTS_SCORE_COMMON_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

/* A small model so that a training run takes a second or two. */
#define MODEL "--arch-mlp-bot 13-32-16 --arch-mlp-top 32-1 --print-freq 1000 "

static char *dir; /* the suite's temporary folder */

/* datagen 10000 lines (d.tsv) and convert with the last 10% as the test
 * split (d.bin). */
__attribute__((unused)) static void make_data(void) { dir = make_data_dir(10000, 11, NULL); }

static void remove_data(void) {
  run_cmd(NULL, "rm -rf %s", dir);
  free(dir);
}

/* Run a command in dir (printf-style) and return its output; asserts the
 * exit status. */
__attribute__((format(printf, 2, 3))) static char *in_dir(int want_rc, const char *fmt, ...) {
  char cmd[6000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char *out;
  int rc = run_cmd(&out, "cd %s && %s", dir, cmd);
  ck_assert_msg(rc == want_rc, "exit %d, wanted %d: %s\n%s", rc, want_rc, cmd, out);
  return out;
}

/* The text of dir/name (asserts it exists). */
static char *file_text(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *s = slurp(path);
  ck_assert_msg(s != NULL, "no %s", path);
  return s;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* Two prediction files are equal line for line (string-equal), and hold
 * want_lines lines. */
static void assert_same_preds(const char *a, const char *b, int want_lines) {
  char *x = file_text(a), *y = file_text(b);
  ck_assert_int_eq(count_lines(x), want_lines);
  ck_assert_msg(!strcmp(x, y), "%s and %s differ", a, b);
  free(x);
  free(y);
}

/* The "auc" and "logloss" fields (as written, %.17g) of the last line of
 * metrics file name holding kind (e.g. "\"kind\":\"test\""), joined. */
__attribute__((unused)) static char *metric_fields(const char *name, const char *kind) {
  char *m = file_text(name);
  const char *last = NULL, *p = m;
  while ((p = strstr(p, kind))) last = p++;
  ck_assert_msg(last != NULL, "%s: no %s line", name, kind);
  const char *a = strstr(last, "\"auc\":"), *l = strstr(last, "\"logloss\":");
  ck_assert(a && l);
  char *res = malloc(256);
  snprintf(res, 256, "%.*s %.*s", (int)strcspn(a, ",}"), a, (int)strcspn(l, ",}"), l);
  free(m);
  return res;
}

#endif
