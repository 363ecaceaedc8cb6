#include "embedding/optim.h"

#include <math.h>
#include <string.h>

#include "embedding/precision.h"

int emb_optim_state_len(const emb_optim_cfg *o, int dim) {
  switch (o->kind) {
    case EMB_OPT_ADAGRAD: return dim;
    case EMB_OPT_ROWWISE_ADAGRAD: return 1;
    default: return 0;
  }
}

void emb_optim_state_init(const emb_optim_cfg *o, int dim, float *state) {
  int n = emb_optim_state_len(o, dim);
  for (int i = 0; i < n; i++) state[i] = (float)o->init_acc;
}

/* 1 when x's exponent bits are all ones (inf or NaN), else 0. */
static inline uint32_t not_finite(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) == 0x7f800000u;
}

/* One row's update by each optimizer: 1 when some value of the outcome is
 * not finite. Inlined into the one-row and the many-row loops below. */
static inline uint32_t sgd_row(int dim, float lr, const emb_grad *restrict g, float *restrict w) {
  uint32_t bad = 0;
  for (int j = 0; j < dim; j++) {
    w[j] -= lr * g[j];
    bad |= not_finite(w[j]);
  }
  return bad;
}

static inline uint32_t adagrad_row(int dim, float lr, float eps, const emb_grad *restrict g,
                                   float *restrict w, float *restrict state) {
  uint32_t bad = 0;
  for (int j = 0; j < dim; j++) {
    float acc = state[j] + g[j] * g[j];
    state[j] = acc;
    w[j] += (-lr * g[j]) / (sqrtf(acc) + eps);
    bad |= not_finite(acc) | not_finite(w[j]);
  }
  return bad;
}

static inline uint32_t rowwise_row(int dim, float lr, float eps, const emb_grad *restrict g,
                                   float *restrict w, float *restrict state) {
  float s = 0.0f; /* fixed order: j ascending */
  for (int j = 0; j < dim; j++) s += g[j] * g[j];
  float acc = state[0] + s / (float)dim;
  state[0] = acc;
  float mult = lr / (sqrtf(acc) + eps);
  uint32_t bad = not_finite(acc);
  for (int j = 0; j < dim; j++) {
    w[j] -= mult * g[j];
    bad |= not_finite(w[j]);
  }
  return bad;
}

int emb_optim_apply(const emb_optim_cfg *o, int dim, float lr, const emb_grad *restrict g,
                    float *restrict w, float *restrict state) {
  const float eps = (float)o->eps;
  switch (o->kind) {
    case EMB_OPT_SGD: return !sgd_row(dim, lr, g, w);
    case EMB_OPT_ADAGRAD: return !adagrad_row(dim, lr, eps, g, w, state);
    case EMB_OPT_ROWWISE_ADAGRAD: return !rowwise_row(dim, lr, eps, g, w, state);
  }
  return 1;
}

size_t emb_optim_apply_rows(const emb_optim_cfg *o, int dim, float lr, const emb_grad *g,
                            float *const *w, size_t n) {
  const float eps = (float)o->eps;
  const size_t d = (size_t)dim;
  switch (o->kind) {
    case EMB_OPT_SGD:
      for (size_t r = 0; r < n; r++)
        if (sgd_row(dim, lr, g + r * d, w[r])) return r;
      break;
    case EMB_OPT_ADAGRAD:
      for (size_t r = 0; r < n; r++)
        if (adagrad_row(dim, lr, eps, g + r * d, w[r], w[r] + d)) return r;
      break;
    case EMB_OPT_ROWWISE_ADAGRAD:
      for (size_t r = 0; r < n; r++)
        if (rowwise_row(dim, lr, eps, g + r * d, w[r], w[r] + d)) return r;
      break;
  }
  return n;
}

int emb_all_finite(const emb_grad *x, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; j++) bad |= not_finite(x[j]);
  return !bad;
}

int emb_optim_lr_ok(float lr) { return isfinite(lr) && lr >= 0 && lr <= EMB_OPTIM_MAX_LR; }

/* Whether rounding w[dim] to prec can make a finite weight infinite: some
 * |w| above the format's largest finite value (65504 for fp16, 0x7f7f0000's
 * float for bf16), which stochastic rounding may send up to infinity. */
static int may_round_to_inf(emb_precision prec, const float *w, int dim) {
  const uint32_t top = prec == EMB_PREC_FP16 ? 0x477fe000u : 0x7f7f0000u;
  uint32_t over = 0;
  for (int j = 0; j < dim; j++) {
    uint32_t u;
    memcpy(&u, &w[j], sizeof u);
    over |= (u & 0x7fffffffu) > top;
  }
  return over != 0;
}

/* emb_optim_apply on w and state, then w rounded to the table's precision:
 * always where w is the row kept (verdict_only 0), else only where the
 * rounding can decide the verdict. Finite weights round to finite ones
 * unless one lies past the format's largest value (may_round_to_inf): only
 * then is the rounded row read. 1 when the outcome is all finite. */
static int apply_rounded(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float lr,
                         const emb_grad *g, float *w, float *state, int verdict_only) {
  const emb_table *t = &plan->tables[table];
  const int ok = emb_optim_apply(&t->optim, t->dim, lr, g, w, state);
  const int risky =
      ok && t->precision != EMB_PREC_FP32 && may_round_to_inf(t->precision, w, t->dim);
  if (!verdict_only || risky) emb_row_round(plan, table, row_id, step, w);
  return ok && (!risky || emb_all_finite(w, (size_t)t->dim));
}

int emb_optim_apply_at(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float lr,
                       const emb_grad *g, float *w, float *state) {
  return apply_rounded(plan, table, row_id, step, lr, g, w, state, 0);
}

int emb_optim_check_at(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float lr,
                       const emb_grad *g, const float *w, const float *state, float *scratch) {
  const emb_table *t = &plan->tables[table];
  const int sl = emb_optim_state_len(&t->optim, t->dim);
  memcpy(scratch, w, (size_t)t->dim * sizeof *scratch);
  if (sl) memcpy(scratch + t->dim, state, (size_t)sl * sizeof *scratch);
  return apply_rounded(plan, table, row_id, step, lr, g, scratch, sl ? scratch + t->dim : NULL, 1);
}
