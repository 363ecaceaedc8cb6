#include "embedding/precision.h"

#include "common/half.h"
#include "common/rng.h"

void emb_row_round(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float *w) {
  const emb_table *t = &plan->tables[table];
  if (t->precision == EMB_PREC_FP32) return;
  const uint64_t key = sr_mix64(plan->seed ^ sr_mix64((uint64_t)step ^ EMB_ROUND_TAG));
  const uint64_t hi = (uint64_t)t->table_id << 32;
  const int bf16 = t->precision == EMB_PREC_BF16;
  for (int j = 0; j < t->dim; j += 4) {
    sr_philox_out o = sr_philox(key, row_id, hi | (uint64_t)(j >> 2));
    int m = t->dim - j < 4 ? t->dim - j : 4;
    for (int k = 0; k < m; k++)
      w[j + k] = bf16 ? sr_bf16_to_f32(sr_bf16_round_stochastic(w[j + k], o.v[k]))
                      : sr_f16_to_f32(sr_f16_round_stochastic(w[j + k], o.v[k]));
  }
}

void emb_values_round_nearest(emb_precision p, const float *in, float *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p == EMB_PREC_FP16) out[i] = sr_f16_to_f32(sr_f32_to_f16(in[i]));
    else if (p == EMB_PREC_BF16) out[i] = sr_bf16_to_f32(sr_f32_to_bf16(in[i]));
    else out[i] = in[i];
  }
}
