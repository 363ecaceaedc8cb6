#include "dense/metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/auc.h"
#include "common/status.h"

/* sr_auc over float labels (label: y > 0.5). SR_EINVAL on a NaN score. */
static int auc_of(const float *s, const float *y, size_t n, double *auc) {
  uint64_t *a = malloc(n * sizeof *a);
  if (!a) return SR_ENOMEM;
  int rc = SR_OK;
  for (size_t i = 0; i < n && rc == SR_OK; i++) {
    if (isnan(s[i])) rc = SR_EINVAL;
    a[i] = sr_auc_key(s[i], y[i] > 0.5f);
  }
  if (rc == SR_OK) rc = sr_auc_keys(a, n, auc);
  free(a);
  return rc;
}

double dense_roc_auc(const float *scores, const float *labels, size_t n) {
  double auc = NAN;
  if (!scores || !labels || n == 0) return NAN;
  return auc_of(scores, labels, n, &auc) == SR_OK ? auc : NAN;
}

int dense_metrics_compute(const float *pred, const float *labels, size_t n,
                          dense_metrics *out) {
  if (!pred || !labels || !out || n == 0) return SR_EINVAL;
  int rc = auc_of(pred, labels, n, &out->auc);
  if (rc != SR_OK) return rc;
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
