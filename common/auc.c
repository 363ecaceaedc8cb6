#include "common/auc.h"

#include <math.h>
#include <stdlib.h>

#include "common/status.h"

/* LSD radix sort of keys by bits 1..32 (the score), 4 passes of 8 bits;
 * stable, so the labels of a tie keep their order (not that the AUC cares).
 * An even number of passes: the sorted data ends in a, where it started. */
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
}

/* Sorted keys -> AUC, walking from the highest score down; each group of
 * equal scores is one ROC step with area (fp - fp0) * (tp + tp0) / 2. */
static double auc_sorted(const uint64_t *a, size_t n) {
  uint64_t tp = 0, fp = 0, area2 = 0;
  size_t i = n;
  while (i > 0) {
    uint64_t key = a[i - 1] >> 1, tp0 = tp, fp0 = fp;
    for (; i > 0 && (a[i - 1] >> 1) == key; i--) {
      if (a[i - 1] & 1) tp++;
      else fp++;
    }
    area2 += (fp - fp0) * (tp + tp0);
  }
  if (tp == 0 || fp == 0) return NAN;
  return (double)((long double)area2 / (2.0L * (long double)tp * (long double)fp));
}

int sr_auc_keys(uint64_t *keys, size_t n, double *auc) {
  *auc = NAN;
  if (n == 0) return 0;
  uint64_t *tmp = malloc(n * sizeof *tmp);
  if (!tmp) return SR_ENOMEM;
  radix_sort(keys, tmp, n);
  free(tmp);
  *auc = auc_sorted(keys, n);
  return 0;
}

int sr_auc(const float *score, const uint8_t *label, size_t n, double *auc) {
  *auc = NAN;
  uint64_t *k = malloc((n ? n : 1) * sizeof *k);
  if (!k) return SR_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (isnan(score[i])) rc = SR_EINVAL;
    else k[i] = sr_auc_key(score[i], label[i]);
  }
  if (!rc) rc = sr_auc_keys(k, n, auc);
  free(k);
  return rc;
}
