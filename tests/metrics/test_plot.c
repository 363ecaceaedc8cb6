/* shardrec plot, end to end with the real binary and gnuplot: a valid PNG
 * of the size asked (signature, IHDR width and height), the same input
 * drawn twice gives the same bytes and two different metrics files give
 * different pictures, a run with bounded tables ("keep") gets their panels
 * (its rows per table and its evicted ids each change the picture), a real
 * train --metrics-out file is drawn (its rates
 * right after test passes too), and bad
 * input is refused naming what and where, leaving nothing at --out. */
#include <check.h>

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/check_main.h"
#include "tests/support/proc.h"

static char *g_dir;

static void setup(void) { g_dir = tmpdir_make("test"); }
static void teardown(void) {
  sr_rmtree(g_dir);
  free(g_dir);
}

/* A metrics file of steps 10..200 whose loss falls as a / step^0.3 and
 * test passes every 50 steps. */
static void write_run(const char *name, double a) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  for (int s = 10; s <= 200; s += 10) {
    fprintf(f, "{\"kind\":\"train\",\"step\":%d,\"epoch\":0,\"loss\":%.6f,\"samples_per_s\":%.1f,"
               "\"step_ms\":{\"dedup\":0.1,\"lookup\":%.3f,\"forward\":3,\"backward\":5,\"push\":1}}\n",
            s, a / (1 + 0.01 * s), 4000 + 10.0 * s * a, 2 * a);
    if (s % 50 == 0)
      fprintf(f, "{\"kind\":\"test\",\"step\":%d,\"epoch\":0,\"auc\":%.4f,\"logloss\":%.4f}\n", s,
              0.6 + 0.0005 * s * a, 0.6 - 0.0003 * s);
  }
  fclose(f);
}

/* write_run's file with a bounded tables' "keep" on each train line: two
 * tables whose rows grow as rows x step, and evicted ids as evict x step. */
static void write_keep_run(const char *name, double rows, double evict) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  for (int s = 10; s <= 200; s += 10) {
    fprintf(f, "{\"kind\":\"train\",\"step\":%d,\"epoch\":0,\"loss\":%.6f,\"samples_per_s\":4000"
               ",\"keep\":{", s, 1 / (1 + 0.01 * s));
    for (int t = 0; t < 2; t++)
      fprintf(f, "%s\"t%d\":{\"rows\":%.0f,\"admitted\":%d,\"refused\":%d,\"expired\":%d,"
                 "\"evicted\":%.0f}", t ? "," : "", t, rows * s * (t + 1), 3 * s, 5 * s, s,
              evict * s);
    fprintf(f, "}}\n");
  }
  fclose(f);
}

/* The PNG's bytes (caller frees) after checking its signature and IHDR. */
static unsigned char *png_check(const char *name, int w, int h, size_t *len) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  size_t n;
  unsigned char *b = (unsigned char *)slurp_file(p, &n, 1); /* fails the test if not written */
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  ck_assert_int_gt(n, 33);
  ck_assert_int_eq(memcmp(b, sig, 8), 0);
  ck_assert_int_eq(memcmp(b + 12, "IHDR", 4), 0);
  uint32_t pw = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
  uint32_t ph = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
  ck_assert_uint_eq(pw, (uint32_t)w);
  ck_assert_uint_eq(ph, (uint32_t)h);
  *len = n;
  return b;
}

START_TEST(test_png_size_and_content) {
  write_run("a.jsonl", 1.0);
  write_run("b.jsonl", 1.6);
  char *out;
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot a.jsonl --out a.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_ptr_nonnull(strstr(out, "wrote a.png (640x480, 1 run(s))"));
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot a.jsonl --out a2.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot b.jsonl --out b.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot a.jsonl b.jsonl --out ab.png --size 1000x700", g_dir, bin_path()), 0);
  size_t la, la2, lb, lab;
  unsigned char *a = png_check("a.png", 640, 480, &la), *a2 = png_check("a2.png", 640, 480, &la2);
  unsigned char *b = png_check("b.png", 640, 480, &lb), *ab = png_check("ab.png", 1000, 700, &lab);
  ck_assert(la == la2 && !memcmp(a, a2, la)); /* the same input: the same picture */
  ck_assert(la != lb || memcmp(a, b, la));    /* other figures: another picture */
  free(a), free(a2), free(b), free(ab);
  /* The default size. */
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot a.jsonl --out d.png", g_dir, bin_path()), 0);
  free(png_check("d.png", 1200, 900, &la));
}
END_TEST

/* Bounded tables: a run with "keep" gets the two panels (said on stdout);
 * its rows and its evicted ids each change the picture. */
START_TEST(test_keep_panels) {
  write_run("a.jsonl", 1.0);
  write_keep_run("k.jsonl", 1, 2);
  write_keep_run("krows.jsonl", 1.5, 2);
  write_keep_run("kevict.jsonl", 1, 3);
  char *out;
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot a.jsonl --out a.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_ptr_null(strstr(out, "bounded tables"));
  free(out);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot k.jsonl a.jsonl --out k.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_msg(strstr(out, "the bounded tables of 1 run(s)") != NULL, "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot krows.jsonl a.jsonl --out kr.png --size 640x480", g_dir, bin_path()), 0);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot kevict.jsonl a.jsonl --out ke.png --size 640x480", g_dir, bin_path()), 0);
  size_t lk, lr, le;
  unsigned char *k = png_check("k.png", 640, 480, &lk), *kr = png_check("kr.png", 640, 480, &lr);
  unsigned char *ke = png_check("ke.png", 640, 480, &le);
  ck_assert_msg(lk != lr || memcmp(k, kr, lk), "other rows per table drew the same picture");
  ck_assert_msg(lk != le || memcmp(k, ke, lk), "other evicted counts drew the same picture");
  free(k), free(kr), free(ke);
}
END_TEST

START_TEST(test_real_train_file) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 3000 --out d.tsv > /dev/null && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin > /dev/null && "
                         "%s train --processed-data-file d.bin --num-batches 20 --print-freq 5 "
                         "--test-freq 10 --mini-batch-size 64 --metrics-out m.jsonl > /dev/null && "
                         "%s plot m.jsonl --out m.png --size 800x600",
                   g_dir, bin_path(), bin_path(), bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  char p[512];
  snprintf(p, sizeof p, "%s/m.jsonl", g_dir);
  ck_assert_int_ge(file_count(p, "\"step_ms\":{\"dedup\":"), 4); /* the phase split is in the file */
  size_t n;
  free(png_check("m.png", 800, 600, &n));
}
END_TEST

/* The samples/s the plot draws: with a test pass just before most progress
 * lines (--test-freq 9, --print-freq 10), each line's rate still agrees
 * with its own step_ms (batch over the phases' time per step, within 2x:
 * the phases are most of a step). The test pass's time is left out of the
 * rate, and the steps before the pass stay in it (their samples were
 * counted over the time since the pass alone: 10 steps' samples over 1). */
START_TEST(test_rate_after_test_pass) {
  char *out;
  int rc = run_cmd(&out, "cd %s && %s datagen --rows 20000 --out d.tsv > /dev/null && "
                         "%s convert --test-fraction 0.1 d.tsv d.bin > /dev/null && "
                         "%s train --processed-data-file d.bin --num-batches 40 --print-freq 10 "
                         "--test-freq 9 --mini-batch-size 128 --metrics-out m.jsonl > /dev/null",
                   g_dir, bin_path(), bin_path(), bin_path());
  ck_assert_msg(rc == 0, "%s", out);
  free(out);
  char p[512];
  snprintf(p, sizeof p, "%s/m.jsonl", g_dir);
  FILE *f = fopen(p, "r");
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    cJSON *o = cJSON_Parse(line);
    const cJSON *ms = cJSON_GetObjectItem(o, "step_ms");
    if (ms) {
      double sum = 0;
      for (const cJSON *c = ms->child; c; c = c->next) sum += c->valuedouble;
      double rate = cJSON_GetObjectItem(o, "samples_per_s")->valuedouble;
      double ratio = rate * sum / (1000.0 * 128);
      ck_assert_msg(ratio > 0.5 && ratio < 2, "step %d: %.0f samples/s but %.2f ms a step",
                    cJSON_GetObjectItem(o, "step")->valueint, rate, sum);
      n++;
    }
    cJSON_Delete(o);
  }
  fclose(f);
  ck_assert_int_eq(n, 4);
}
END_TEST

START_TEST(test_bad_input) {
  write_run("a.jsonl", 1.0);
  char *out, p[512];
  snprintf(p, sizeof p, "%s/bad.jsonl", g_dir);
  FILE *f = fopen(p, "w");
  fprintf(f, "{\"kind\":\"train\",\"step\":1,\"loss\":0.5}\nnot json\n");
  fclose(f);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot a.jsonl bad.jsonl --out x.png", g_dir, bin_path()), 1);
  ck_assert_msg(strstr(out, "bad.jsonl:2: not a metrics line") != NULL, "%s", out);
  free(out);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot missing.jsonl --out x.png", g_dir, bin_path()), 1);
  ck_assert_ptr_nonnull(strstr(out, "missing.jsonl: cannot open"));
  free(out);
  snprintf(p, sizeof p, "%s/x.png", g_dir);
  ck_assert(!sr_is_file(p));
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot a.jsonl --out x.png --size 10x10", g_dir, bin_path()), 2);
  ck_assert_ptr_nonnull(strstr(out, "--size (width)"));
  free(out);
  ck_assert_int_eq(run_cmd(&out, "cd %s && %s plot a.jsonl --out x.png --size big", g_dir, bin_path()), 2);
  ck_assert_ptr_nonnull(strstr(out, "'big' is not WxH"));
  free(out);
  ck_assert_int_eq(run_cmd(NULL, "cd %s && %s plot a.jsonl", g_dir, bin_path()), 2);
  ck_assert(!sr_is_file(p));
}
END_TEST

int main(void) {
  Suite *s = suite_create("plot");
  TCase *tc = tcase_create("plot");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_png_size_and_content);
  tcase_add_test(tc, test_keep_panels);
  tcase_add_test(tc, test_real_train_file);
  tcase_add_test(tc, test_rate_after_test_pass);
  tcase_add_test(tc, test_bad_input);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
