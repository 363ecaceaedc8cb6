/* ROC AUC, the one implementation: the model's test AUC (dense/metrics) and
 * the generator's oracle AUC (datasets/datagen) are scored by the same code.
 * Exact, as sklearn.metrics.roc_auc_score: scores sorted, each group of tied
 * scores is one ROC step (a trapezoid: a tie counts half), the area summed in
 * integers with one division at the end. O(n) radix sort of 64-bit keys. */
#ifndef SHARDREC_COMMON_AUC_H
#define SHARDREC_COMMON_AUC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The sort key of one (score, label) pair: an order-preserving map of the
 * float above bit 0 (-0 ties +0), the 0/1 label in bit 0. NaN scores must be
 * refused by the caller. */
static inline uint64_t sr_auc_key(float score, int label) {
  uint32_t u;
  if (score == 0.0f) score = 0.0f;
  memcpy(&u, &score, 4);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((uint64_t)u << 1) | (label ? 1u : 0u);
}

/* AUC of keys[n] (from sr_auc_key; sorted in place, borrowed) into *auc: NAN
 * when one class is absent or n == 0. 0 or SR_ENOMEM (the sort's scratch). */
int sr_auc_keys(uint64_t *keys, size_t n, double *auc);

/* AUC of score[n] against label[n] (nonzero: positive), both borrowed and
 * left unchanged. 0 and *auc (NAN for one class), SR_EINVAL (a NaN score;
 * *auc NAN) or SR_ENOMEM. */
int sr_auc(const float *score, const uint8_t *label, size_t n, double *auc);

#endif
