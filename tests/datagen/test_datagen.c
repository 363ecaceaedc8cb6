/* Tests for datasets/datagen: determinism, the marginal statistics of the
 * lines, the teacher's figures (positive rate, oracle AUC, categorical share of
 * the logit variance, dense-only logistic regression well below the oracle),
 * and the datagen command's files (.probs, .summary.json) and flags. */
#include <check.h>

#include "common/auc.h"
#include "tests/check_main.h"
#include "tests/support/files.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common/sha256.h"
#include "common/status.h"
#include "datasets/criteo.h"
#include "datasets/datagen.h"

#define STAT_ROWS 200000

/* Assertions that cost nothing when they pass: Check's ck_assert_* record a
 * mark point through a pipe on every call (a syscall each in fork mode), far
 * too slow inside loops over 200k rows. */
#define REQUIRE(c)                                                             \
  do {                                                                         \
    if (!(c)) ck_abort_msg("%s:%d: failed: %s", __FILE__, __LINE__, #c);      \
  } while (0)
#define REQUIRE_MSG(c, ...)                                                    \
  do {                                                                         \
    if (!(c)) ck_abort_msg(__VA_ARGS__);                                       \
  } while (0)

static dg_generator *make_gen(uint64_t rows, uint64_t seed, int uniform, int hot,
                              double strip) {
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = rows;
  cfg.seed = seed;
  cfg.uniform = uniform;
  cfg.multi_hot = hot;
  cfg.strip_trailing = strip;
  dg_generator *g = NULL;
  char err[256];
  int rc = dg_generator_create(&cfg, &g, err, sizeof err);
  REQUIRE_MSG(rc == 0, "create: %s", err);
  return g;
}

static void tmpdir_remove(const char *d) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  REQUIRE((system(cmd)) == (0));
}

/* Split a line (no newline) into up to 40 fields in place. */
static int split_tabs(char *line, char **f) {
  int n = 0;
  f[n++] = line;
  for (char *p = line; *p; p++)
    if (*p == '\t') {
      *p = 0;
      REQUIRE((n) < (40));
      f[n++] = p + 1;
    }
  return n;
}

static int is_hex8(const char *s, size_t len) {
  if (len != 8) return 0;
  for (size_t i = 0; i < 8; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

/* ------------------------------------------------------------------ AUC */

START_TEST(test_auc_ties) {
  double auc;
  /* scikit-learn's roc_auc_score docstring example */
  float s1[] = {0.1f, 0.4f, 0.35f, 0.8f};
  uint8_t y1[] = {0, 0, 1, 1};
  REQUIRE((sr_auc(s1, y1, 4, &auc)) == (0));
  REQUIRE(fabs((double)(auc) - (double)(0.75)) <= 1e-12);
  /* ties count one half */
  float s2[] = {0.1f, 0.5f, 0.5f, 0.9f};
  REQUIRE((sr_auc(s2, y1, 4, &auc)) == (0));
  REQUIRE(fabs((double)(auc) - (double)(0.875)) <= 1e-12);
  float s3[] = {-2.0f, -2.0f, -2.0f, 3.0f, -0.0f, 0.0f};
  uint8_t y3[] = {1, 0, 0, 1, 1, 0};
  /* pos {-2, 3, 0}, neg {-2, -2, 0}: pos -2: 2 ties = 1; pos 3: 3; pos 0: 2 + 0.5 */
  REQUIRE((sr_auc(s3, y3, 6, &auc)) == (0));
  REQUIRE(fabs((double)(auc) - (double)(6.5 / 9.0)) <= 1e-12);
  uint8_t y4[] = {1, 1, 1, 1};
  REQUIRE((sr_auc(s1, y4, 4, &auc)) == (0));
  REQUIRE(isnan(auc));
}
END_TEST

/* ----------------------------------------------------------- determinism */

START_TEST(test_determinism) {
  char *d = tmpdir_make("datagen");
  char p1[256], p2[256], p3[256];
  snprintf(p1, sizeof p1, "%s/a.tsv", d);
  snprintf(p2, sizeof p2, "%s/b.tsv", d);
  snprintf(p3, sizeof p3, "%s/c.tsv", d);
  char err[256];
  dg_generator *g = make_gen(20000, 7, 0, 1, 0);
  REQUIRE((dg_generator_write(g, p1, NULL, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  g = make_gen(20000, 7, 0, 1, 0);
  REQUIRE((dg_generator_write(g, p2, NULL, err, sizeof err)) == (0));
  /* rows are a pure function of the index: any order gives the same line */
  dg_row row;
  char line[DG_LINE_MAX];
  dg_generator_row(g, 12345, &row);
  size_t ll = dg_row_format(&row, line);
  dg_generator_destroy(g);
  g = make_gen(20000, 8, 0, 1, 0);
  REQUIRE((dg_generator_write(g, p3, NULL, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  size_t n1, n2, n3;
  char *a = slurp_file(p1, &n1, 1), *b = slurp_file(p2, &n2, 1), *c = slurp_file(p3, &n3, 1);
  REQUIRE((n1) == (n2));
  REQUIRE(memcmp(a, b, n1) == 0);
  REQUIRE(n1 != n3 || memcmp(a, c, n1) != 0);
  /* line 12345 of the file */
  char *p = a;
  for (int i = 0; i < 12345; i++) p = strchr(p, '\n') + 1;
  REQUIRE(memcmp(p, line, ll) == 0);
  /* the probs too */
  char q1[300], q2[300];
  snprintf(q1, sizeof q1, "%s.probs", p1);
  snprintf(q2, sizeof q2, "%s.probs", p2);
  free(a), free(b), free(c);
  a = slurp_file(q1, &n1, 1), b = slurp_file(q2, &n2, 1);
  REQUIRE((n1) == (n2));
  REQUIRE(memcmp(a, b, n1) == 0);
  free(a), free(b);
  tmpdir_remove(d);
  free(d);
}
END_TEST

/* ------------------------------------------------------------ statistics */

/* Expected distinct values among n draws from P(r) ~ 1/(r+1)^s, r < card
 * (uniform when s == 0). */
static double expected_distinct(uint32_t card, double s, double n) {
  double z = 0, e = 0;
  for (uint32_t r = 0; r < card; r++) z += s > 0 ? pow(r + 1.0, -s) : 1.0;
  for (uint32_t r = 0; r < card; r++) {
    double p = (s > 0 ? pow(r + 1.0, -s) : 1.0) / z;
    e += 1 - exp(n * log1p(-p));
  }
  return e;
}

/* Dense-only logistic regression: Newton's method on
 * [1, log1p(max(0, I_i)), missing_i] (27 features), fitted on the first rows,
 * scored on the rest. Returns the held-out AUC. */
#define LR_F 27
static void lr_features(const dg_row *r, double *x) {
  x[0] = 1;
  for (int i = 0; i < DG_NUM_DENSE; i++) {
    x[1 + i] = r->dense_missing[i] ? 0 : log1p(r->dense[i] > 0 ? (double)r->dense[i] : 0);
    x[14 + i] = r->dense_missing[i];
  }
}

static int solve(double a[LR_F][LR_F], double *b) {
  for (int c = 0; c < LR_F; c++) {
    int piv = c;
    for (int r = c + 1; r < LR_F; r++)
      if (fabs(a[r][c]) > fabs(a[piv][c])) piv = r;
    if (fabs(a[piv][c]) < 1e-12) return -1;
    for (int k = 0; k < LR_F; k++) {
      double t = a[c][k];
      a[c][k] = a[piv][k];
      a[piv][k] = t;
    }
    double t = b[c];
    b[c] = b[piv];
    b[piv] = t;
    for (int r = 0; r < LR_F; r++) {
      if (r == c) continue;
      double f = a[r][c] / a[c][c];
      for (int k = c; k < LR_F; k++) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 0; c < LR_F; c++) b[c] /= a[c][c];
  return 0;
}

static double dense_lr_auc(const float *x, const uint8_t *y, size_t ntrain, size_t n) {
  double w[LR_F] = {0};
  for (int it = 0; it < 8; it++) {
    static double h[LR_F][LR_F];
    double gr[LR_F] = {0};
    memset(h, 0, sizeof h);
    for (size_t i = 0; i < ntrain; i++) {
      const float *xi = x + i * LR_F;
      double z = 0;
      for (int k = 0; k < LR_F; k++) z += w[k] * xi[k];
      double p = 1 / (1 + exp(-z)), s = p * (1 - p) + 1e-9;
      for (int k = 0; k < LR_F; k++) {
        gr[k] += (p - y[i]) * xi[k];
        for (int l = 0; l <= k; l++) h[k][l] += s * xi[k] * xi[l];
      }
    }
    for (int k = 0; k < LR_F; k++) {
      h[k][k] += 1e-6 * ntrain; /* a whisper of ridge: constant columns stay solvable */
      for (int l = 0; l < k; l++) h[l][k] = h[k][l];
    }
    REQUIRE((solve(h, gr)) == (0));
    for (int k = 0; k < LR_F; k++) w[k] -= gr[k];
  }
  float *score = malloc(sizeof(float) * (n - ntrain));
  for (size_t i = ntrain; i < n; i++) {
    double z = 0;
    for (int k = 0; k < LR_F; k++) z += w[k] * x[i * LR_F + k];
    score[i - ntrain] = (float)z;
  }
  double auc;
  REQUIRE((sr_auc(score, y + ntrain, n - ntrain, &auc)) == (0));
  free(score);
  return auc;
}

START_TEST(test_statistics) {
  dg_generator *g = make_gen(STAT_ROWS, 1, 0, 1, 0);
  const size_t n = STAT_ROWS;
  dg_row *row = malloc(sizeof *row);
  char line[DG_LINE_MAX];
  uint64_t dmiss[DG_NUM_DENSE] = {0}, cmiss[DG_NUM_CAT] = {0}, neg_i2 = 0, pos = 0;
  uint32_t *counts[DG_NUM_CAT];
  uint32_t card[DG_NUM_CAT];
  for (int j = 0; j < DG_NUM_CAT; j++) {
    card[j] = dg_cardinality(j, 0.01);
    counts[j] = calloc(card[j], sizeof(uint32_t));
  }
  float *prob = malloc(sizeof(float) * n), *lrx = malloc(sizeof(float) * n * LR_F);
  uint8_t *y = malloc(n);
  double sc = 0, scc = 0, st = 0, stt = 0, sf = 0, sff = 0;
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, row);
    prob[i] = row->prob;
    y[i] = (uint8_t)row->label;
    pos += (uint64_t)row->label;
    double lt = row->logit - row->logit_bias;
    REQUIRE(fabs((double)(lt) - (double)(row->logit_dense + row->logit_cat)) <= 1e-9);
    sc += row->logit_cat, scc += row->logit_cat * row->logit_cat;
    sf += row->logit_cat_fm, sff += row->logit_cat_fm * row->logit_cat_fm;
    st += lt, stt += lt * lt;
    double xd[LR_F];
    lr_features(row, xd);
    for (int k = 0; k < LR_F; k++) lrx[i * LR_F + k] = (float)xd[k];
    for (int k = 0; k < DG_NUM_DENSE; k++) dmiss[k] += row->dense_missing[k];
    if (!row->dense_missing[1] && row->dense[1] < 0) neg_i2++;
    for (int j = 0; j < DG_NUM_CAT; j++) {
      if (!row->ncat[j]) cmiss[j]++;
      else counts[j][row->cat_rank[j][0]]++;
    }
    /* the formatted line: 40 fields, values as generated, ids 8 lowercase hex */
    if (i < 20000) {
      size_t len = dg_row_format(row, line);
      REQUIRE((line[len - 1]) == ('\n'));
      line[len - 1] = 0;
      char *f[40];
      REQUIRE((split_tabs(line, f)) == (40));
      REQUIRE((atoi(f[0])) == (row->label));
      for (int k = 0; k < DG_NUM_DENSE; k++) {
        if (row->dense_missing[k]) REQUIRE(strcmp(f[1 + k], "") == 0);
        else REQUIRE((strtoll(f[1 + k], NULL, 10)) == (row->dense[k]));
      }
      for (int j = 0; j < DG_NUM_CAT; j++) {
        if (!row->ncat[j]) REQUIRE(strcmp(f[14 + j], "") == 0);
        else {
          REQUIRE_MSG(is_hex8(f[14 + j], strlen(f[14 + j])), "C%d '%s'", j + 1, f[14 + j]);
          REQUIRE((strtoul(f[14 + j], NULL, 16)) == (row->cat_hex[j][0]));
        }
      }
    }
  }
  /* missing rates per column, and overall */
  double dm_all = 0, cm_all = 0;
  for (int k = 0; k < DG_NUM_DENSE; k++) {
    double r = (double)dmiss[k] / n;
    REQUIRE_MSG(fabs(r - dg_dense_missing_rate(k)) < 0.006, "I%d missing %.4f vs %.4f", k + 1, r, dg_dense_missing_rate(k));
    dm_all += r / DG_NUM_DENSE;
  }
  for (int j = 0; j < DG_NUM_CAT; j++) {
    double r = (double)cmiss[j] / n;
    REQUIRE_MSG(fabs(r - dg_cat_missing_rate(j)) < 0.006, "C%d missing %.4f vs %.4f", j + 1, r, dg_cat_missing_rate(j));
    cm_all += r / DG_NUM_CAT;
  }
  REQUIRE_MSG(dm_all > 0.18 && dm_all < 0.23, "integer missing %.4f", dm_all);
  REQUIRE_MSG(cm_all > 0.09 && cm_all < 0.13, "categorical missing %.4f", cm_all);
  REQUIRE(((double)dmiss[11] / n) > (0.7));  /* I12 */
  REQUIRE(((double)cmiss[21] / n) > (0.7));  /* C22 */
  REQUIRE_MSG(neg_i2 > n / 100, "negative I2: %llu", (unsigned long long)neg_i2);

  /* distinct values near the Zipf expectation; the head far above uniform */
  for (int j = 0; j < DG_NUM_CAT; j++) {
    uint32_t distinct = 0, top = 0;
    for (uint32_t v = 0; v < card[j]; v++) {
      distinct += counts[j][v] > 0;
      if (counts[j][v] > top) top = counts[j][v];
    }
    double seen = (double)(n - cmiss[j]);
    double e = expected_distinct(card[j], 1.1, seen);
    REQUIRE_MSG(fabs(distinct - e) <= 0.03 * e + 3, "C%d distinct %u vs expected %.1f", j + 1, distinct, e);
    REQUIRE((counts[j][0]) == (top)); /* rank 0 is the most frequent */
    if (card[j] >= 100)
      REQUIRE_MSG(top / seen > 20.0 / card[j], "C%d top share %.4f", j + 1, top / seen);
    free(counts[j]);
  }

  /* the teacher */
  double rate = (double)pos / n;
  REQUIRE_MSG(fabs(rate - 0.25) < 0.03, "positive rate %.4f", rate);
  double oracle;
  REQUIRE((sr_auc(prob, y, n, &oracle)) == (0));
  REQUIRE_MSG(oracle >= 0.75 && oracle <= 0.85, "oracle AUC %.4f", oracle);
  double var_cat = scc / n - (sc / n) * (sc / n), var_tot = stt / n - (st / n) * (st / n);
  double var_fm = sff / n - (sf / n) * (sf / n);
  double share = var_cat / var_tot;
  REQUIRE_MSG(share >= 0.5, "categorical variance share %.3f", share);
  size_t ntrain = n * 9 / 10;
  double oracle_test;
  REQUIRE((sr_auc(prob + ntrain, y + ntrain, n - ntrain, &oracle_test)) == (0));
  double lr = dense_lr_auc(lrx, y, ntrain, n);
  REQUIRE_MSG(lr <= oracle_test - 0.03, "dense-only LR AUC %.4f vs oracle %.4f", lr, oracle_test);
  REQUIRE_MSG(lr > 0.55, "dense features carry some signal: LR AUC %.4f", lr);
  fprintf(stderr,
          "datagen stats: positive rate %.4f, oracle AUC %.4f (test %.4f), dense-only LR AUC "
          "%.4f, categorical variance share %.3f (FM %.3f of total), integer missing %.4f, "
          "categorical missing %.4f\n",
          rate, oracle, oracle_test, lr, share, var_fm / var_tot, dm_all, cm_all);
  free(prob), free(lrx), free(y), free(row);
  dg_generator_destroy(g);
}
END_TEST

START_TEST(test_uniform) {
  const size_t n = 100000;
  dg_generator *g = make_gen(n, 3, 1, 1, 0);
  dg_row row;
  uint32_t card[DG_NUM_CAT], *counts[DG_NUM_CAT];
  uint64_t seen[DG_NUM_CAT] = {0};
  for (int j = 0; j < DG_NUM_CAT; j++) {
    card[j] = dg_cardinality(j, 0.01);
    counts[j] = calloc(card[j], sizeof(uint32_t));
  }
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, &row);
    for (int j = 0; j < DG_NUM_CAT; j++)
      if (row.ncat[j]) {
        counts[j][row.cat_rank[j][0]]++;
        seen[j]++;
      }
  }
  for (int j = 0; j < DG_NUM_CAT; j++) {
    uint32_t distinct = 0, top = 0;
    for (uint32_t v = 0; v < card[j]; v++) {
      distinct += counts[j][v] > 0;
      if (counts[j][v] > top) top = counts[j][v];
    }
    double e = expected_distinct(card[j], 0, (double)seen[j]);
    REQUIRE_MSG(fabs(distinct - e) <= 0.02 * e + 3, "C%d distinct %u vs %.1f", j + 1, distinct, e);
    /* no head: the top value is within a few sigma of the uniform share */
    double mean = (double)seen[j] / card[j];
    REQUIRE_MSG(top < mean + 6 * sqrt(mean) + 6, "C%d top %u mean %.1f", j + 1, top, mean);
    free(counts[j]);
  }
  dg_generator_destroy(g);
}
END_TEST

START_TEST(test_multi_hot_and_strip) {
  const size_t n = 20000;
  dg_generator *g = make_gen(n, 5, 0, 4, 0.3);
  dg_row row;
  char line[DG_LINE_MAX];
  uint64_t bags = 0, ids = 0, multi = 0, stripped = 0, maxk = 0;
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, &row);
    size_t len = dg_row_format(&row, line);
    line[len - 1] = 0;
    char *f[40];
    int nf = split_tabs(line, f);
    if (nf < 40) {
      stripped++;
      REQUIRE((f[nf - 1][0]) != (0)); /* the last field kept is not empty */
    }
    for (int j = 0; j < DG_NUM_CAT; j++) {
      const char *s = 14 + j < nf ? f[14 + j] : "";
      if (!row.ncat[j]) {
        REQUIRE(strcmp(s, "") == 0);
        continue;
      }
      bags++;
      int k = 0;
      const char *p = s;
      for (;;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        REQUIRE_MSG(is_hex8(p, l), "C%d '%s'", j + 1, s);
        k++;
        if (!c) break;
        p = c + 1;
      }
      REQUIRE((k) == (row.ncat[j]));
      REQUIRE((k) <= (4));
      if ((uint64_t)k > maxk) maxk = (uint64_t)k;
      ids += (uint64_t)k;
      multi += k > 1;
    }
  }
  REQUIRE((maxk) == (4));
  double mean = (double)ids / bags;
  REQUIRE_MSG(fabs(mean - 2.5) < 0.05, "mean ids per bag %.3f", mean);
  REQUIRE((multi) > (bags / 2));
  /* about 30% of lines are stripped; those with a non-empty C26 cannot be */
  REQUIRE_MSG(stripped > n / 10 && stripped < n * 3 / 10, "stripped %llu", (unsigned long long)stripped);
  dg_generator_destroy(g);
}
END_TEST

START_TEST(test_histogram_fallback) {
  char *d = tmpdir_make("datagen");
  char p[256];
  snprintf(p, sizeof p, "%s/h.tsv", d);
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = 30000;
  cfg.seed = 11;
  dg_generator *g = NULL;
  char err[256];
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  dg_summary exact, approx;
  REQUIRE((dg_generator_write(g, p, &exact, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  cfg.auc_exact_max = 1000;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  REQUIRE((dg_generator_write(g, p, &approx, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  REQUIRE(exact.all.auc_exact && exact.test.auc_exact);
  REQUIRE(!approx.all.auc_exact && !approx.test.auc_exact);
  REQUIRE(fabs((double)(exact.all.auc) - (double)(approx.all.auc)) <= 2e-3);
  REQUIRE(fabs((double)(exact.test.auc) - (double)(approx.test.auc)) <= 2e-3);
  REQUIRE(fabs((double)(exact.all.logloss) - (double)(approx.all.logloss)) <= 1e-12);
  tmpdir_remove(d);
  free(d);
}
END_TEST

/* The project's own TSV parser takes every line as written: one-hot,
 * multi-hot and stripped lines alike. */
START_TEST(test_reader_accepts) {
  for (int mode = 0; mode < 2; mode++) {
    dg_generator *g = make_gen(5000, 21, mode, mode ? 5 : 1, mode ? 0.5 : 0);
    dg_row row;
    char line[DG_LINE_MAX], err[256];
    ds_criteo_sample *smp = malloc(sizeof *smp);
    ds_criteo_parse_opts o = {0};
    for (uint64_t i = 0; i < 5000; i++) {
      dg_generator_row(g, i, &row);
      size_t len = dg_row_format(&row, line);
      int rc = ds_criteo_parse_line(line, len, &o, smp, err, sizeof err);
      REQUIRE_MSG(rc == 0, "line %llu: %s", (unsigned long long)i, err);
      REQUIRE((smp->label) == (row.label));
      for (int k = 0; k < DG_NUM_DENSE; k++) {
        double x = row.dense_missing[k] ? 0 : (double)(row.dense[k] > 0 ? row.dense[k] : 0);
        REQUIRE((smp->dense[k]) == ((float)log1p(x)));
      }
      for (int j = 0; j < DG_NUM_CAT; j++) {
        uint32_t n = smp->off[j + 1] - smp->off[j];
        if (!row.ncat[j]) {
          REQUIRE((n) == (1));
          REQUIRE((smp->vals[smp->off[j]]) == (0));
          continue;
        }
        REQUIRE((n) == ((uint32_t)row.ncat[j]));
        for (int t = 0; t < row.ncat[j]; t++) {
          REQUIRE((row.cat_hex[j][t]) != (0));
          REQUIRE((smp->vals[smp->off[j] + t]) == (row.cat_hex[j][t]));
        }
      }
    }
    free(smp);
    dg_generator_destroy(g);
  }
}
END_TEST

START_TEST(test_gzip) {
  char *d = tmpdir_make("datagen");
  char p1[256], p2[256], err[256];
  snprintf(p1, sizeof p1, "%s/plain.tsv", d);
  snprintf(p2, sizeof p2, "%s/z.tsv.gz", d);
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = 5000;
  dg_generator *g = NULL;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  REQUIRE((dg_generator_write(g, p1, NULL, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  cfg.gzip = 1;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  REQUIRE((dg_generator_write(g, p2, NULL, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  size_t n1, nz;
  char *a = slurp_file(p1, &n1, 1), *z = slurp_file(p2, &nz, 1);
  REQUIRE((nz) < (n1 / 2));
  REQUIRE(nz > 2 && (unsigned char)z[0] == 0x1f && (unsigned char)z[1] == 0x8b);
  char *b = malloc(n1 + 16);
  gzFile gz = gzopen(p2, "rb");
  REQUIRE(gz != NULL);
  int got = gzread(gz, b, (unsigned)n1 + 16);
  gzclose(gz);
  REQUIRE((got) == ((int)n1));
  REQUIRE(memcmp(a, b, n1) == 0);
  free(a), free(b), free(z);
  tmpdir_remove(d);
  free(d);
}
END_TEST

/* Drift: the same rows' ranks and labels' teacher, the ids slid by
 * card * D * i / rows; the head of the last lines is ids the first lines
 * never had; 0 is the generator of before. */
START_TEST(test_drift) {
  const size_t n = 20000;
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = n;
  cfg.seed = 9;
  cfg.drift = 2;
  dg_generator *g = NULL, *g0 = make_gen(n, 9, 0, 1, 0);
  char err[256];
  REQUIRE_MSG(dg_generator_create(&cfg, &g, err, sizeof err) == 0, "create: %s", err);
  dg_row a, b;
  const int j = 4; /* C5: 16 values at the default scale */
  uint32_t card = dg_cardinality(j, 0.01);
  uint32_t first[64], last[64];
  int nf = 0, nl = 0;
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, &a);
    dg_generator_row(g0, i, &b);
    REQUIRE(a.ncat[j] == b.ncat[j]);
    if (!a.ncat[j]) continue;
    REQUIRE_MSG(a.cat_rank[j][0] == b.cat_rank[j][0], "row %zu: another rank under drift", i);
    if (i == 0) REQUIRE(a.cat_hex[j][0] == b.cat_hex[j][0]); /* nothing slid yet */
    uint32_t *set = i < n / 10 ? first : i >= n - n / 10 ? last : NULL;
    int *cnt = i < n / 10 ? &nf : &nl;
    if (!set) continue;
    int dup = 0;
    for (int k = 0; k < *cnt && !dup; k++) dup = set[k] == a.cat_hex[j][0];
    if (!dup && *cnt < 64) set[(*cnt)++] = a.cat_hex[j][0];
  }
  int common = 0;
  for (int x = 0; x < nf; x++)
    for (int y = 0; y < nl; y++) common += first[x] == last[y];
  /* by the last tenth the values slid by 1.8 cardinalities: none shared */
  REQUIRE_MSG(common == 0 && nf >= (int)card / 2 && nl >= (int)card / 2,
              "C5: %d of the first tenth's %d ids in the last tenth's %d", common, nf, nl);
  cfg.drift = 65;
  dg_generator *bad = NULL;
  REQUIRE(dg_generator_create(&cfg, &bad, err, sizeof err) == SR_EINVAL);
  REQUIRE(strstr(err, "drift") != NULL);
  dg_generator_destroy(g);
  dg_generator_destroy(g0);
}
END_TEST

START_TEST(test_config_errors) {
  dg_config cfg;
  dg_generator *g = NULL;
  char err[256];
  dg_config_default(&cfg);
  cfg.multi_hot = 129;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  REQUIRE(g == NULL);
  REQUIRE(strstr(err, "multi_hot") != NULL);
  dg_config_default(&cfg);
  cfg.scale = 2;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  dg_config_default(&cfg);
  cfg.test_fraction = -0.5;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  dg_generator_destroy(NULL);
  /* cardinalities: tiny columns kept, floor 16, Kaggle counts at scale 1 */
  REQUIRE((dg_cardinality(8, 0.01)) == (3));
  REQUIRE((dg_cardinality(19, 0.01)) == (4));
  REQUIRE((dg_cardinality(16, 0.01)) == (10));
  REQUIRE((dg_cardinality(1, 0.01)) == (16));
  REQUIRE((dg_cardinality(2, 0.01)) == (101313));
  REQUIRE((dg_cardinality(2, 1.0)) == (10131227));
  /* a full-scale generator stays small (no per-value tables for 10M columns) */
  dg_config_default(&cfg);
  cfg.scale = 1.0;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  dg_row row;
  int seen_big = 0;
  for (uint64_t i = 0; i < 2000; i++) {
    dg_generator_row(g, i, &row);
    if (row.ncat[2] && row.cat_rank[2][0] >= (1u << 20)) seen_big = 1;
    for (int j = 0; j < DG_NUM_CAT; j++)
      if (row.ncat[j]) REQUIRE((row.cat_rank[j][0]) < (dg_cardinality(j, 1.0)));
  }
  REQUIRE(seen_big);
  dg_generator_destroy(g);
}
END_TEST


/* ------------------------------------------------- bag sizes, cross terms */

static const int mlperf_sizes[DG_NUM_CAT] = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1,
                                             6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};

static dg_generator *make_gen_cfg(const dg_config *cfg) {
  dg_generator *g = NULL;
  char err[256];
  int rc = dg_generator_create(cfg, &g, err, sizeof err);
  REQUIRE_MSG(rc == 0, "create: %s", err);
  return g;
}

/* The bytes of --multi-hot K and of one-hot data for a seed are the ones
 * written before bag sizes and cross terms existed (SHA-256 of files
 * written at b12b305 by `datagen --rows 3000 --seed 5` with these flags). */
START_TEST(test_old_bytes_pinned) {
  const struct {
    int hot, uniform;
    double strip;
    const char *tsv, *probs;
  } c[3] = {
      {1, 0, 0, "27338ae463dd1ca44454dcd9d553f1d2926001d95081020824c87f785b99366f",
       "6e7693f917ac9b953926049bf637e842b3bb924db01c769810940d0e7a7cfd97"},
      {4, 0, 0.3, "83c647717b9bf3748cef4a8686bfb05ba1714d0cf85f8f3d6e03e31a51bd6183",
       "f5a738fdc14e817ed14443ecbceec53c147c53a47118c26c3684e8e322c39a68"},
      {16, 1, 0, "0487ebbe2166b8b3c3e2987a2b7e13bd3a695f74324254cc65c17c70e2b7f0d1",
       "b07178d704a15cba3c7c15849c5bb3662251a7786672bb007caa7eb0547eca38"},
  };
  char *d = tmpdir_make("datagen");
  for (int k = 0; k < 3; k++) {
    char p[256], pp[300], err[256], hex[SR_SHA256_HEX];
    snprintf(p, sizeof p, "%s/o%d.tsv", d, k);
    snprintf(pp, sizeof pp, "%s.probs", p);
    dg_generator *g = make_gen(3000, 5, c[k].uniform, c[k].hot, c[k].strip);
    REQUIRE((dg_generator_write(g, p, NULL, err, sizeof err)) == (0));
    dg_generator_destroy(g);
    REQUIRE((sr_sha256_file(p, hex, NULL)) == (0));
    REQUIRE_MSG(strcmp(hex, c[k].tsv) == 0, "--multi-hot %d: TSV %s", c[k].hot, hex);
    REQUIRE((sr_sha256_file(pp, hex, NULL)) == (0));
    REQUIRE_MSG(strcmp(hex, c[k].probs) == 0, "--multi-hot %d: probs %s", c[k].hot, hex);
  }
  tmpdir_remove(d);
  free(d);
}
END_TEST

/* Each column's bag holds exactly its size, no field is missing, ids are
 * Zipf-skewed within the bags. */
START_TEST(test_bag_sizes_exact) {
  const size_t n = 4000;
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = n;
  cfg.seed = 3;
  memcpy(cfg.bag_sizes, mlperf_sizes, sizeof mlperf_sizes);
  dg_generator *g = make_gen_cfg(&cfg);
  dg_row row;
  char line[DG_LINE_MAX];
  /* C21 (100 ids a bag): the most frequent id's share of all its ids */
  const uint32_t card = dg_cardinality(20, 0.01);
  uint32_t *count = calloc(card, sizeof *count);
  uint64_t dup_bags = 0;
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, &row);
    size_t len = dg_row_format(&row, line);
    REQUIRE(len < DG_LINE_MAX);
    line[len - 1] = 0;
    char *f[40];
    REQUIRE((split_tabs(line, f)) == (40));
    for (int j = 0; j < DG_NUM_CAT; j++) {
      REQUIRE((row.ncat[j]) == (mlperf_sizes[j]));
      int k = 1;
      for (const char *p = f[14 + j]; *p; p++) k += *p == ',';
      REQUIRE_MSG(k == mlperf_sizes[j], "line %zu C%d: %d ids, %d expected", i, j + 1, k, mlperf_sizes[j]);
      REQUIRE((strlen(f[14 + j])) == ((size_t)(9 * k - 1)));
    }
    int dup = 0;
    for (int t = 0; t < 100; t++) {
      REQUIRE((row.cat_rank[20][t]) < (card));
      count[row.cat_rank[20][t]]++;
      for (int u = 0; u < t && !dup; u++) dup = row.cat_rank[20][u] == row.cat_rank[20][t];
    }
    dup_bags += (uint64_t)dup;
  }
  uint32_t top = 0;
  for (uint32_t v = 0; v < card; v++) top = count[v] > top ? count[v] : top;
  double share = (double)top / (100.0 * n);
  /* Zipf 1.1 over 70k values puts about 0.1 of the mass on rank 0; uniform
   * values would give 1/card = 1.4e-5 */
  REQUIRE_MSG(share > 0.05 && share < 0.25, "C21 top share %.4f", share);
  REQUIRE((count[0]) == (top)); /* rank 0 is the head */
  REQUIRE((dup_bags) == (n));    /* 100 draws from a skewed column repeat */
  free(count);
  /* no cross part without cross terms; the parts add up to the logit */
  REQUIRE(fabs(row.logit - (row.logit_bias + row.logit_dense + row.logit_cat + row.logit_cross)) < 1e-12);
  REQUIRE((row.logit_cross) == (0));
  dg_generator_destroy(g);
}
END_TEST

/* Cross terms: off, no part and the same bytes; on, a part whose standard
 * deviation over the file's rows is S (calibrated on the pilot), which the
 * oracle's probability includes: the oracle AUC rises. */
START_TEST(test_cross_terms) {
  char *d = tmpdir_make("datagen");
  char p[256], err[256];
  snprintf(p, sizeof p, "%s/x.tsv", d);
  const size_t n = 20000;
  dg_summary off, on;
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = n;
  cfg.seed = 4;
  dg_generator *g = make_gen_cfg(&cfg);
  REQUIRE((dg_generator_write(g, p, &off, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  cfg.cross_terms = 1.5;
  g = make_gen_cfg(&cfg);
  REQUIRE((dg_generator_write(g, p, &on, err, sizeof err)) == (0));
  double s = 0, ss = 0;
  dg_row row;
  for (size_t i = 0; i < n; i++) {
    dg_generator_row(g, i, &row);
    s += row.logit_cross, ss += row.logit_cross * row.logit_cross;
    REQUIRE(fabs(row.logit - (row.logit_bias + row.logit_dense + row.logit_cat + row.logit_cross)) < 1e-12);
  }
  dg_generator_destroy(g);
  double sd = sqrt(ss / n - (s / n) * (s / n));
  REQUIRE_MSG(sd > 1.5 * 0.9 && sd < 1.5 * 1.1, "cross part std %.4f, 1.5 configured", sd);
  REQUIRE_MSG(on.all.auc > off.all.auc + 0.03, "oracle AUC %.4f with cross terms, %.4f without",
              on.all.auc, off.all.auc);
  /* the positive rate stays calibrated */
  double rate = (double)on.all.positives / (double)on.all.rows;
  REQUIRE_MSG(fabs(rate - 0.25) < 0.02, "positive rate %.4f", rate);
  /* the summary records the option and the part's pilot variance (S^2) */
  char sp[300];
  snprintf(sp, sizeof sp, "%s.summary.json", p);
  size_t sn;
  char *sum = slurp_file(sp, &sn, 1);
  cJSON *root = cJSON_Parse(sum);
  REQUIRE(root != NULL);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "teacher");
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "options");
  const cJSON *pv = cJSON_GetObjectItemCaseSensitive(t, "pilot_var_cross");
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(o, "cross_terms");
  REQUIRE(cJSON_IsNumber(pv) && fabs(pv->valuedouble - 2.25) < 1e-9);
  REQUIRE(cJSON_IsNumber(ct) && ct->valuedouble == 1.5);
  cJSON_Delete(root);
  free(sum);
  tmpdir_remove(d);
  free(d);
}
END_TEST

START_TEST(test_bag_sizes_parse) {
  int sz[DG_NUM_CAT];
  char err[256];
  REQUIRE((dg_bag_sizes_parse("mlperf", sz, err, sizeof err)) == (0));
  REQUIRE(memcmp(sz, mlperf_sizes, sizeof sz) == 0);
  REQUIRE((dg_bag_sizes_parse(DG_MLPERF_BAG_SIZES, sz, err, sizeof err)) == (0));
  REQUIRE(memcmp(sz, mlperf_sizes, sizeof sz) == 0);
  REQUIRE((dg_bag_sizes_parse("128,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,128", sz, err, sizeof err)) == (0));
  REQUIRE((sz[0]) == (128));
  REQUIRE((sz[25]) == (128));
  const struct {
    const char *text, *what;
  } bad[] = {
      {"1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "25 sizes, 26 expected"},
      {"1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "27 sizes, 26 expected"},
      {"1,1,0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "size 3 (C3) is 0, must be in [1, 128]"},
      {"1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,129", "size 26 (C26) is 129, must be in [1, 128]"},
      {"1,1,1,x,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "size 4 (C4) is not an integer"},
      {"1,,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "size 2 (C2) is not an integer"},
      {"", "empty list"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    REQUIRE((dg_bag_sizes_parse(bad[i].text, sz, err, sizeof err)) == (SR_EINVAL));
    REQUIRE_MSG(strstr(err, bad[i].what) != NULL, "'%s': '%s'", bad[i].text, err);
  }
  /* the library refuses sizes out of range and bag sizes with multi_hot */
  dg_config cfg;
  dg_generator *g = NULL;
  dg_config_default(&cfg);
  memcpy(cfg.bag_sizes, mlperf_sizes, sizeof mlperf_sizes);
  cfg.bag_sizes[7] = 129;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  REQUIRE(strstr(err, "bag_sizes") != NULL);
  cfg.bag_sizes[7] = 1;
  cfg.multi_hot = 3;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  cfg.multi_hot = 1;
  cfg.cross_terms = 9;
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (SR_EINVAL));
  REQUIRE(strstr(err, "cross_terms") != NULL);
  REQUIRE(g == NULL);
}
END_TEST

/* ---------------------------------------------------------- the command */

static int run_bin(const char *args) {
  const char *bin = getenv("SHARDREC_BIN");
  REQUIRE_MSG(bin != NULL, "SHARDREC_BIN not set");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' datagen %s >/dev/null 2>&1", bin, args);
  int st = system(cmd);
  REQUIRE(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static double json_num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  REQUIRE_MSG(cJSON_IsNumber(v), "summary: %s missing", k);
  return v->valuedouble;
}

START_TEST(test_command_files) {
  char *d = tmpdir_make("datagen");
  char args[512], path[256], pp[300], sp[300];
  snprintf(path, sizeof path, "%s/s.tsv", d);
  snprintf(pp, sizeof pp, "%s.probs", path);
  snprintf(sp, sizeof sp, "%s.summary.json", path);
  snprintf(args, sizeof args, "--rows 30000 --seed 9 --test-fraction 0.2 --out '%s'", path);
  REQUIRE((run_bin(args)) == (0));
  size_t tn, pn, sn;
  char *tsv = slurp_file(path, &tn, 1), *probs = slurp_file(pp, &pn, 1), *sum = slurp_file(sp, &sn, 1);
  const size_t n = 30000, ntest = 6000;
  float *p = malloc(sizeof(float) * n);
  uint8_t *y = malloc(n);
  size_t lines = 0;
  for (char *l = tsv; *l; lines++) {
    REQUIRE((lines) < (n));
    REQUIRE(l[0] == '0' || l[0] == '1');
    REQUIRE((l[1]) == ('\t'));
    y[lines] = (uint8_t)(l[0] - '0');
    l = strchr(l, '\n') + 1;
  }
  REQUIRE((lines) == (n));
  char *q = probs;
  double ll_all = 0, ll_test = 0;
  uint64_t pos_all = 0, pos_test = 0;
  for (size_t i = 0; i < n; i++) {
    char *end;
    p[i] = strtof(q, &end);
    REQUIRE(end != q && *end == '\n');
    q = end + 1;
    REQUIRE(p[i] > 0 && p[i] < 1);
    double l = y[i] ? -log((double)p[i]) : -log1p(-(double)p[i]);
    ll_all += l;
    pos_all += y[i];
    if (i >= n - ntest) ll_test += l, pos_test += y[i];
  }
  REQUIRE((*q) == (0));
  double auc_all, auc_test;
  REQUIRE((sr_auc(p, y, n, &auc_all)) == (0));
  REQUIRE((sr_auc(p + n - ntest, y + n - ntest, ntest, &auc_test)) == (0));

  cJSON *root = cJSON_Parse(sum);
  REQUIRE(root != NULL);
  REQUIRE((json_num(root, "rows")) == (30000));
  REQUIRE((json_num(root, "seed")) == (9));
  REQUIRE(fabs((double)(json_num(root, "positive_rate")) - (double)((double)pos_all / n)) <= 1e-12);
  const cJSON *all = cJSON_GetObjectItemCaseSensitive(root, "all");
  const cJSON *test = cJSON_GetObjectItemCaseSensitive(root, "test");
  REQUIRE((json_num(all, "rows")) == (n));
  REQUIRE((json_num(test, "rows")) == (ntest));
  REQUIRE((json_num(all, "positives")) == (pos_all));
  REQUIRE((json_num(test, "positives")) == (pos_test));
  REQUIRE(fabs((double)(json_num(all, "oracle_auc")) - (double)(auc_all)) <= 1e-9);
  REQUIRE(fabs((double)(json_num(test, "oracle_auc")) - (double)(auc_test)) <= 1e-9);
  REQUIRE(fabs((double)(json_num(all, "oracle_logloss")) - (double)(ll_all / n)) <= 1e-9);
  REQUIRE(fabs((double)(json_num(test, "oracle_logloss")) - (double)(ll_test / ntest)) <= 1e-9);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "options");
  REQUIRE(fabs((double)(json_num(opt, "test_fraction")) - (double)(0.2)) <= 1e-12);
  REQUIRE(fabs((double)(json_num(opt, "scale")) - (double)(0.01)) <= 1e-12);
  cJSON_Delete(root);

  /* same bytes as the library writes in process */
  char lib[300];
  snprintf(lib, sizeof lib, "%s/lib.tsv", d);
  dg_config cfg;
  dg_config_default(&cfg);
  cfg.rows = n, cfg.seed = 9, cfg.test_fraction = 0.2;
  dg_generator *g = NULL;
  char err[256];
  REQUIRE((dg_generator_create(&cfg, &g, err, sizeof err)) == (0));
  REQUIRE((dg_generator_write(g, lib, NULL, err, sizeof err)) == (0));
  dg_generator_destroy(g);
  size_t ln;
  char *lb = slurp_file(lib, &ln, 1);
  REQUIRE((ln) == (tn));
  REQUIRE(memcmp(lb, tsv, tn) == 0);
  free(lb), free(tsv), free(probs), free(sum), free(p), free(y);
  tmpdir_remove(d);
  free(d);
}
END_TEST

START_TEST(test_command_flags) {
  char args[512];
  REQUIRE((run_bin("--help")) == (0));
  REQUIRE((run_bin("--rows 10")) == (2));                      /* no --out */
  REQUIRE((run_bin("--out /tmp/x.tsv")) == (2));               /* no --rows */
  REQUIRE((run_bin("--rows abc --out /tmp/x.tsv")) == (2));
  REQUIRE((run_bin("--rows 0 --out /tmp/x.tsv")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv --bogus")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv --multi-hot 129")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv --scale 0")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv --test-fraction 1.5")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv --seed")) == (2));
  REQUIRE((run_bin("--rows 10 --out /tmp/x.tsv extra")) == (2));
  /* an unwritable path is a failure, not a usage error */
  REQUIRE((run_bin("--rows 10 --out /nonexistent-dir/x.tsv")) == (1));
  char *d = tmpdir_make("datagen");
  snprintf(args, sizeof args, "--rows 500 --uniform --multi-hot 3 --out '%s/m.tsv'", d);
  REQUIRE((run_bin(args)) == (0));
  tmpdir_remove(d);
  free(d);
}
END_TEST


/* Run datagen with args; its stderr into *err (caller frees). Exit status. */
static int run_bin_err(const char *args, char **err) {
  const char *bin = getenv("SHARDREC_BIN");
  REQUIRE_MSG(bin != NULL, "SHARDREC_BIN not set");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' datagen %s 2>&1 >/dev/null", bin, args);
  FILE *p = popen(cmd, "r");
  REQUIRE(p != NULL);
  size_t cap = 8192, n = 0, got;
  char *b = malloc(cap);
  while ((got = fread(b + n, 1, cap - 1 - n, p)) > 0) n += got;
  b[n] = 0;
  int st = pclose(p);
  *err = b;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* datagen --multi-hot-sizes mlperf --cross-terms: same seed, same bytes;
 * the summary's oracle AUC is the AUC of the .probs against the labels;
 * flag errors exit 2 naming the flag and the entry. */
START_TEST(test_command_bag_sizes) {
  char *d = tmpdir_make("datagen");
  char args[700], pa[256], pb[256], pc[256];
  snprintf(pa, sizeof pa, "%s/a.tsv", d);
  snprintf(pb, sizeof pb, "%s/b.tsv", d);
  snprintf(pc, sizeof pc, "%s/c.tsv", d);
  const char *f = "--rows 6000 --multi-hot-sizes mlperf --cross-terms 2 --test-fraction 0.5";
  snprintf(args, sizeof args, "%s --seed 12 --out '%s'", f, pa);
  REQUIRE((run_bin(args)) == (0));
  snprintf(args, sizeof args, "%s --seed 12 --out '%s'", f, pb);
  REQUIRE((run_bin(args)) == (0));
  snprintf(args, sizeof args, "%s --seed 13 --out '%s'", f, pc);
  REQUIRE((run_bin(args)) == (0));
  size_t na, nb, nc;
  char *a = slurp_file(pa, &na, 1), *b = slurp_file(pb, &nb, 1), *c = slurp_file(pc, &nc, 1);
  REQUIRE(na == nb && memcmp(a, b, na) == 0);
  REQUIRE(na != nc || memcmp(a, c, na) != 0);
  /* labels, probs, oracle AUC */
  const size_t n = 6000;
  float *p = malloc(sizeof(float) * n);
  uint8_t *y = malloc(n);
  size_t lines = 0;
  for (char *l = a; *l; lines++) {
    REQUIRE((lines) < (n));
    y[lines] = (uint8_t)(l[0] - '0');
    l = strchr(l, '\n') + 1;
  }
  REQUIRE((lines) == (n));
  char pp[300], sp[300];
  snprintf(pp, sizeof pp, "%s.probs", pa);
  snprintf(sp, sizeof sp, "%s.summary.json", pa);
  size_t pn, sn;
  char *probs = slurp_file(pp, &pn, 1), *sum = slurp_file(sp, &sn, 1), *q = probs;
  for (size_t i = 0; i < n; i++) {
    char *end;
    p[i] = strtof(q, &end);
    REQUIRE(end != q && *end == '\n');
    q = end + 1;
  }
  double auc_all, auc_test;
  REQUIRE((sr_auc(p, y, n, &auc_all)) == (0));
  REQUIRE((sr_auc(p + n / 2, y + n / 2, n / 2, &auc_test)) == (0));
  cJSON *root = cJSON_Parse(sum);
  REQUIRE(root != NULL);
  const cJSON *all = cJSON_GetObjectItemCaseSensitive(root, "all");
  const cJSON *test = cJSON_GetObjectItemCaseSensitive(root, "test");
  REQUIRE(fabs(json_num(all, "oracle_auc") - auc_all) <= 1e-9);
  REQUIRE(fabs(json_num(test, "oracle_auc") - auc_test) <= 1e-9);
  const cJSON *bs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "options"), "bag_sizes");
  REQUIRE((cJSON_GetArraySize(bs)) == (DG_NUM_CAT));
  for (int j = 0; j < DG_NUM_CAT; j++)
    REQUIRE((cJSON_GetArrayItem(bs, j)->valueint) == (mlperf_sizes[j]));
  cJSON_Delete(root);
  free(a), free(b), free(c), free(probs), free(sum), free(p), free(y);

  const struct {
    const char *flags, *what;
  } bad[] = {
      {"--multi-hot-sizes 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
       "--multi-hot-sizes: 25 sizes, 26 expected"},
      {"--multi-hot-sizes 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
       "--multi-hot-sizes: 27 sizes, 26 expected"},
      {"--multi-hot-sizes 0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
       "--multi-hot-sizes: size 1 (C1) is 0, must be in [1, 128]"},
      {"--multi-hot-sizes 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,129,1",
       "--multi-hot-sizes: size 25 (C25) is 129, must be in [1, 128]"},
      {"--multi-hot-sizes mlperf --multi-hot 3", "--multi-hot and --multi-hot-sizes exclude each other"},
      {"--cross-terms 9", "--cross-terms"},
      {"--cross-terms -1", "--cross-terms"},
      {"--multi-hot 129", "--multi-hot"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *err;
    snprintf(args, sizeof args, "--rows 10 --out '%s/e.tsv' %s", d, bad[i].flags);
    int rc = run_bin_err(args, &err);
    REQUIRE_MSG(rc == 2, "%s: exit %d: %s", bad[i].flags, rc, err);
    REQUIRE_MSG(strstr(err, bad[i].what) != NULL, "%s: '%s'", bad[i].flags, err);
    free(err);
  }
  REQUIRE(access(pa, F_OK) == 0);
  snprintf(pc, sizeof pc, "%s/e.tsv", d);
  REQUIRE(access(pc, F_OK) != 0); /* nothing written on a flag error */
  tmpdir_remove(d);
  free(d);
}
END_TEST

static Suite *datagen_suite(void) {
  Suite *s = suite_create("datagen");
  const struct {
    const char *name;
    const TTest *test;
  } cases[] = {
      {"auc_ties", test_auc_ties},
      {"determinism", test_determinism},
      {"statistics", test_statistics},
      {"uniform", test_uniform},
      {"multi_hot_and_strip", test_multi_hot_and_strip},
      {"histogram_fallback", test_histogram_fallback},
      {"reader_accepts", test_reader_accepts},
      {"gzip", test_gzip},
      {"config_errors", test_config_errors},
      {"drift", test_drift},
      {"command_files", test_command_files},
      {"command_flags", test_command_flags},
      {"old_bytes_pinned", test_old_bytes_pinned},
      {"bag_sizes_exact", test_bag_sizes_exact},
      {"cross_terms", test_cross_terms},
      {"bag_sizes_parse", test_bag_sizes_parse},
      {"command_bag_sizes", test_command_bag_sizes},
  };
  /* one case per test, so CK_RUN_CASE can pick one */
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TCase *tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, cases[i].test);
    suite_add_tcase(s, tc);
  }
  return s;
}

int main(void) {
  return sr_check_run(datagen_suite());
}
