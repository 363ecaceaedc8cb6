#include "embedding/precision.h"

#include <string.h>

#include "common/half.h"
#include "common/rng.h"

void emb_row_round(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float *w) {
  const emb_table *t = &plan->tables[table];
  if (t->precision == EMB_PREC_FP32) return;
  const uint64_t key = sr_mix64(plan->seed ^ sr_mix64((uint64_t)step ^ EMB_ROUND_TAG));
  const uint64_t hi = (uint64_t)t->table_id << 32;
  const int bf16 = t->precision == EMB_PREC_BF16;
  const size_t dim = (size_t)t->dim;
  uint32_t bits[EMB_MAX_DIM + 4]; /* element j's: block j / 4, word j % 4 */
  uint16_t h[EMB_MAX_DIM];
  sr_philox_n(key, row_id, hi, (dim + 3) / 4, bits);
  if (bf16) {
    sr_bf16_round_stochastic_n(w, bits, h, dim);
    sr_bf16_decode(h, w, dim);
  } else {
    sr_f16_round_stochastic_n(w, bits, h, dim);
    sr_f16_decode(h, w, dim, SR_HALF_AUTO);
  }
}

void emb_values_round_nearest(emb_precision p, const float *in, float *out, size_t n) {
  if (p == EMB_PREC_FP32) {
    if (out != in) memmove(out, in, n * sizeof *out);
    return;
  }
  uint16_t h[EMB_MAX_DIM]; /* the bulk conversions, a chunk at a time */
  for (size_t i = 0; i < n; i += EMB_MAX_DIM) {
    const size_t m = n - i < EMB_MAX_DIM ? n - i : EMB_MAX_DIM;
    if (p == EMB_PREC_FP16) {
      sr_f16_encode(in + i, h, m, SR_HALF_AUTO);
      sr_f16_decode(h, out + i, m, SR_HALF_AUTO);
    } else {
      sr_bf16_encode(in + i, h, m);
      sr_bf16_decode(h, out + i, m);
    }
  }
}
