#include "dense/metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* Order-preserving map of a float to uint32 (ascending); -0 maps as +0. */
static inline uint32_t fkey(float f) {
  uint32_t u;
  if (f == 0.0f) f = 0.0f;
  memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* LSD radix sort of (key<<1 | label) entries by key, 4 passes of 8 bits over
 * the key bits (bits 1..32 of the 64-bit word). Stable. */
static void radix_sort(uint64_t *a, uint64_t *tmp, size_t n) {
  for (int pass = 0; pass < 4; pass++) {
    int shift = 1 + 8 * pass;
    size_t cnt[257] = {0};
    for (size_t i = 0; i < n; i++) cnt[((a[i] >> shift) & 255) + 1]++;
    for (int k = 0; k < 256; k++) cnt[k + 1] += cnt[k];
    for (size_t i = 0; i < n; i++) tmp[cnt[(a[i] >> shift) & 255]++] = a[i];
    uint64_t *t = a;
    a = tmp;
    tmp = t;
  }
  /* 4 passes: the sorted data ends where it started */
}

/* Sorted ascending keys with labels -> AUC by walking from the highest score
 * down; each group of equal keys is one ROC step, area = trapezoid. Exact
 * integer sum of 2*area, one division at the end. */
static double auc_sorted(const uint64_t *a, size_t n) {
  uint64_t tp = 0, fp = 0, area2 = 0;
  size_t i = n;
  while (i > 0) {
    uint64_t key = a[i - 1] >> 1, tp0 = tp, fp0 = fp;
    while (i > 0 && (a[i - 1] >> 1) == key) {
      if (a[i - 1] & 1) tp++; else fp++;
      i--;
    }
    area2 += (fp - fp0) * (tp + tp0);
  }
  if (tp == 0 || fp == 0) return NAN;
  return (double)((long double)area2 / (2.0L * (long double)tp * fp));
}

static int sort_pairs(const float *s, const float *y, size_t n,
                      uint64_t **out, uint64_t **scratch) {
  uint64_t *a = malloc(n * sizeof *a), *t = malloc(n * sizeof *t);
  if (!a || !t) {
    free(a);
    free(t);
    return SR_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    if (isnan(s[i])) {
      free(a);
      free(t);
      return SR_EINVAL;
    }
    a[i] = ((uint64_t)fkey(s[i]) << 1) | (y[i] > 0.5f ? 1u : 0u);
  }
  radix_sort(a, t, n);
  *out = a;
  *scratch = t;
  return SR_OK;
}

double dense_roc_auc(const float *scores, const float *labels, size_t n) {
  uint64_t *a, *t;
  if (!scores || !labels || n == 0) return NAN;
  if (sort_pairs(scores, labels, n, &a, &t) != SR_OK) return NAN;
  double auc = auc_sorted(a, n);
  free(a);
  free(t);
  return auc;
}

int dense_metrics_compute(const float *pred, const float *labels, size_t n,
                          dense_metrics *out) {
  if (!pred || !labels || !out || n == 0) return SR_EINVAL;
  uint64_t *a, *t;
  int rc = sort_pairs(pred, labels, n, &a, &t);
  if (rc != SR_OK) return rc;
  out->auc = auc_sorted(a, n);
  free(a);
  free(t);
  const double eps = 0x1p-23; /* float32 machine epsilon, see metrics.h */
  double ll = 0.0, sp = 0.0, sy = 0.0;
  size_t correct = 0, pos = 0;
  for (size_t i = 0; i < n; i++) {
    double p = pred[i], y = labels[i] > 0.5f ? 1.0 : 0.0;
    double pc = p < eps ? eps : (p > 1.0 - eps ? 1.0 - eps : p);
    ll -= y * log(pc) + (1.0 - y) * log(1.0 - pc);
    sp += p;
    sy += y;
    pos += y > 0.5;
    correct += (p > 0.5) == (y > 0.5);
  }
  out->n = n;
  out->positives = pos;
  out->log_loss = ll / (double)n;
  out->accuracy = (double)correct / (double)n;
  out->mean_pred = sp / (double)n;
  out->ctr = sy / (double)n;
  return SR_OK;
}
