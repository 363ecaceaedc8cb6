/* shardrec bench rpc --part lookup through the real binary, at a small
 * table and few ids: for 1 server each op's server handling is printed
 * against the in-process store's time, the median of the rounds' ratios it
 * prints, and for the second server count each op's time a step beside
 * the first count's (the ratio of the two printed times), and for 1
 * server the share of plain TCP's rate that TCP's round trip plus the
 * in-process store's time would get, the median of its rounds. --part train,
 * short: each model's ratio is the median of the rounds' ratios it
 * prints, one per round. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/check_main.h"
#include "tests/support/proc.h"

/* The us/step of the line that starts with what (after its indent). */
static double per_step(const char *out, const char *what) {
  const char *p = strstr(out, what);
  ck_assert_msg(p != NULL, "no line '%s' in:\n%s", what, out);
  const char *u = strstr(p, " us/step");
  ck_assert_msg(u != NULL, "no us/step on the line '%s'", what);
  while (u > p && u[-1] == ' ') u--;
  while (u > p && u[-1] != ' ') u--;
  double v = 0;
  ck_assert_int_eq(sscanf(u, "%lf", &v), 1);
  ck_assert_msg(v > 0, "'%s': %g us/step", what, v);
  return v;
}

/* x, printed to 2 decimals, is a / b where a and b are printed to one:
 * it lies between the ratios of their rounding bounds. */
static int ratio_ok(double x, double a, double b) {
  const double lo = (a - 0.05) / (b + 0.05), hi = b > 0.05 ? (a + 0.05) / (b - 0.05) : INFINITY;
  return x >= lo - 0.005 && x <= hi + 0.005;
}

/* x, printed to the precision of 2 * half like the rounds r[5], is their
 * median: one of the rounds, at most two each side. */
static int median_of5(double x, const double r[5], double half) {
  int below = 0, above = 0, at = 0;
  for (int k = 0; k < 5; k++)
    below += r[k] < x - half, above += r[k] > x + half, at += fabs(r[k] - x) <= half;
  return at && below <= 2 && above <= 2;
}

START_TEST(test_ratios_printed) {
  char *out;
  int rc = run_cmd(&out, "%s bench rpc --part lookup --rows 65536 --ids 256 --dims 16 "
                         "--servers 1,2 --seconds 0.05", bin_path());
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  const char *ops[2] = {"Lookup", "Push"};
  for (int o = 0; o < 2; o++) {
    char what[96], key[96];
    snprintf(what, sizeof what, "  %s in-process store", ops[o]);
    const double loc = per_step(out, what);
    snprintf(what, sizeof what, "  %s gRPC, 1 server ", ops[o]);
    const double one = per_step(out, what);
    /* The handling line follows the op's 1-server line. */
    const char *h = strstr(strstr(out, what), "(of which the server's handling");
    double us = 0, x = 0;
    double r[5];
    ck_assert_msg(h && sscanf(h, "(of which the server's handling, gRPC's part left out: %lf us "
                              "a call, %lfx the in-process store's time; rounds %lf %lf %lf %lf "
                              "%lf)", &us, &x, &r[0], &r[1], &r[2], &r[3], &r[4]) == 7,
                  "%s: no handling line of that shape in:\n%s", ops[o], out);
    ck_assert_msg(us > 0 && loc > 0, "%s: %.1f us against %.1f us in process", ops[o], us, loc);
    ck_assert_msg(median_of5(x, r, 0.005),
                  "%s: %.2fx printed, not the median of the rounds' %.2f %.2f %.2f %.2f %.2f",
                  ops[o], x, r[0], r[1], r[2], r[3], r[4]);
    /* The share plain TCP's round trip plus the in-process store's time
     * would get: printed for 1 server, the median of its rounds. */
    snprintf(key, sizeof key, "(a %s that cost plain TCP's round trip, then the in-process "
             "store's time, would run at ", ops[o]);
    const char *b = strstr(out, key);
    ck_assert_msg(b && sscanf(b + strlen(key), "%lf%% of plain TCP's rate; rounds %lf %lf %lf %lf "
                              "%lf)", &x, &r[0], &r[1], &r[2], &r[3], &r[4]) == 6,
                  "%s: no line of the in-process store's share in:\n%s", ops[o], out);
    for (int k = 0; k < 5; k++)
      ck_assert_msg(r[k] > 0 && r[k] < 100, "%s: a round's share %.1f%%", ops[o], r[k]);
    ck_assert_msg(median_of5(x, r, 0.05),
                  "%s: %.1f%% printed, not the median of the rounds' %.1f %.1f %.1f %.1f %.1f",
                  ops[o], x, r[0], r[1], r[2], r[3], r[4]);
    snprintf(what, sizeof what, "  %s gRPC, 2 servers ", ops[o]);
    const double two = per_step(out, what);
    snprintf(key, sizeof key, "(%s gRPC 2: ", ops[o]);
    int found = 0; /* of the op's lines for 2 servers, the one comparing them with 1 */
    for (const char *r = strstr(out, key); r && !found; r = strstr(r + 1, key)) {
      char tail[64] = "";
      found = sscanf(r + strlen(key), "%lfx the time a step of the first server %63[^)]", &x,
                     tail) == 2 && !strcmp(tail, "count");
    }
    ck_assert_msg(found, "%s: no line comparing 2 servers with 1 in:\n%s", ops[o], out);
    ck_assert_msg(ratio_ok(x, two, one),
                  "%s: %.1f us with 2 servers, %.1f with 1, printed as %.2fx", ops[o], two, one, x);
  }
  free(out);
}
END_TEST

START_TEST(test_train_rounds_median) {
  char *out;
  int rc = run_cmd(&out, "%s bench rpc --part train --train-rows 10000 --train-steps 30 "
                         "--train-rounds 3", bin_path());
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  int models = 0;
  for (const char *p = strstr(out, "(against servers: "); p;
       p = strstr(p + 1, "(against servers: "), models++) {
    double x, r[3];
    ck_assert_msg(sscanf(p, "(against servers: %lfx the in-process rate, the median of the "
                            "rounds' ratios %lf %lf %lf;", &x, &r[0], &r[1], &r[2]) == 4,
                  "not a line of 3 rounds: %.200s", p);
    /* the middle one of the three */
    double lo = fmin(r[0], fmin(r[1], r[2])), hi = fmax(r[0], fmax(r[1], r[2]));
    double mid = r[0] + r[1] + r[2] - lo - hi;
    ck_assert_msg(x > 0 && fabs(x - mid) < 0.0051, "median %.2f of %.2f %.2f %.2f", x, r[0],
                  r[1], r[2]);
  }
  ck_assert_msg(models == 2, "%d models' ratios in:\n%s", models, out);
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bench_rpc");
  TCase *tc = tcase_create("bench_rpc");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_ratios_printed);
  tcase_add_test(tc, test_train_rounds_median);
  suite_add_tcase(s, tc);
  return sr_check_run(s);
}
