/* Evaluation metrics over predicted probabilities and 0/1 labels, computed
 * as the reference DLRM reports them (it calls scikit-learn):
 *   auc       exact ROC AUC as sklearn.metrics.roc_auc_score: scores sorted,
 *             tied scores form one ROC step (a trapezoid); NAN when all labels
 *             are one class (sklearn raises there)
 *   log_loss  sklearn.metrics.log_loss: p clipped to [eps, 1 - eps] with
 *             eps = 2^-23, what sklearn >= 1.2 uses (eps="auto", the machine
 *             epsilon of the predictions' dtype) on the float32 predictions
 *             the reference passes it (sklearn < 1.2 used 1e-15); then the
 *             mean of -(y log p + (1-y) log(1-p)) in double
 *   accuracy  as the reference: round(p) == y, numpy rounds half to even so
 *             p = 0.5 counts as 0; positive iff p > 0.5
 *   mean_pred mean of p; ctr mean of y.
 * A label counts as positive when > 0.5. O(n log n) time via a radix sort;
 * allocates O(n) scratch (not for the training step's hot path). */
#ifndef SHARDREC_DENSE_METRICS_H
#define SHARDREC_DENSE_METRICS_H

#include <stddef.h>

typedef struct {
  size_t n, positives;
  double auc, log_loss, accuracy, mean_pred, ctr;
} dense_metrics;

/* pred[n], labels[n] borrowed. Returns 0, SR_EINVAL (n == 0, NULL, or a NaN
 * prediction) or SR_ENOMEM. */
int dense_metrics_compute(const float *pred, const float *labels, size_t n,
                          dense_metrics *out);

/* ROC AUC alone (same rules). Returns NAN on one-class labels, NaN scores or
 * no memory. */
double dense_roc_auc(const float *scores, const float *labels, size_t n);

#endif
