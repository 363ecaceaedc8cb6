/* Dense optimizers (SGD, Adagrad, Adam as torch.optim defines them) and the
 * reference DLRM's learning-rate schedule (LRPolicyScheduler).
 *
 * An optimizer works on one flat parameter buffer (dense_model_params) with
 * the gradient buffer of the same shape; its state is one buffer too, so a
 * checkpoint saves it with one write. dense_opt_step never allocates. */
#ifndef SHARDREC_DENSE_OPTIM_H
#define SHARDREC_DENSE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  DENSE_OPT_SGD = 0,
  DENSE_OPT_ADAGRAD = 1,
  DENSE_OPT_ADAM = 2
} dense_opt_kind;

typedef struct {
  dense_opt_kind kind;
  float eps;                 /* adagrad 1e-10, adam 1e-8 (torch defaults) */
  double beta1, beta2;       /* adam: 0.9, 0.999 (double, as torch's python
                              * floats: 1 - beta is formed in double) */
  float initial_accumulator; /* adagrad: 0 (torch default) */
} dense_opt_config;

typedef struct dense_opt dense_opt;

/* torch's defaults for kind. */
dense_opt_config dense_opt_defaults(dense_opt_kind kind);

/* Optimizer for n_params parameters; NULL with the reason in err on a bad
 * config or out of memory. State starts as torch's (Adagrad sums at
 * initial_accumulator, Adam moments 0, step count 0). Caller owns it. */
dense_opt *dense_opt_create(const dense_opt_config *cfg, size_t n_params,
                            char *err, size_t errlen);
void dense_opt_destroy(dense_opt *o); /* NULL-safe */

/* One step at learning rate lr over params[n_params] with grads[n_params]
 * (borrowed). As torch (weight decay 0, no momentum):
 *   SGD:     p -= lr g
 *   Adagrad: s += g^2; p -= lr g / (sqrt(s) + eps)
 *   Adam:    t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *            p -= (lr / (1-b1^t)) m / (sqrt(v) / sqrt(1-b2^t) + eps)
 * The update is applied whole; then, when it left any parameter inf or
 * nan, SR_ERANGE (dense_opt_nonfinite_at names the first). Returns 0,
 * SR_ERANGE, or SR_EINVAL (NULL buffer). */
int dense_opt_step(dense_opt *o, float *params, const float *grads, float lr);

/* The index of the first parameter the last dense_opt_step left inf or
 * nan (the smallest, whatever the thread count), or the parameter count. */
size_t dense_opt_nonfinite_at(const dense_opt *o);

/* State for checkpoints: one buffer (owned by the optimizer) of *count
 * floats: none for SGD, s[n] for Adagrad, m[n] then v[n] for Adam. */
float *dense_opt_state(dense_opt *o, size_t *count);
/* Steps taken (Adam's t); set it when restoring a checkpoint. */
int64_t dense_opt_steps(const dense_opt *o);
void dense_opt_set_steps(dense_opt *o, int64_t steps);
dense_opt_kind dense_opt_kind_of(const dense_opt *o);

/* The reference's LRPolicyScheduler (--lr-num-warmup-steps,
 * --lr-decay-start-step, --lr-num-decay-steps). The reference steps its
 * scheduler after each optimizer step and torch's scheduler constructor
 * already counts one, so optimizer step number k (0-based, the `step`
 * argument below) runs at the lr computed for c = k + 1:
 *   c < W:                  lr = base * (1 - (W - c) / W)          (warmup)
 *   S <= c < S + D:         lr = max(1e-7, base * ((D - (c - S)) / D)^2)
 *   otherwise, D > 0:       the last lr of the two cases above ("freeze at
 *                           last"): after the decay, max(1e-7, base/D^2);
 *                           between warmup and decay, base * (1 - 1/W)
 *                           (the last warmup value, not base: a quirk of the
 *                           reference we keep); if no warmup value was ever
 *                           computed (W <= 1; the reference raises there)
 *                           we use base;
 *   otherwise (D == 0):     base.
 * W = num_warmup_steps, S = decay_start_step, D = num_decay_steps; the
 * reference requires S >= W. All arithmetic in double. */
typedef struct {
  double base_lr;
  int64_t num_warmup_steps;
  int64_t decay_start_step;
  int64_t num_decay_steps;
} dense_lr_sched;

/* 0, or SR_EINVAL with the reason (negative counts, S < W). */
int dense_lr_sched_validate(const dense_lr_sched *s, char *err, size_t errlen);
/* Learning rate for optimizer step `step` (0-based). Pure function. */
float dense_lr_at(const dense_lr_sched *s, int64_t step);
double dense_lr_at_double(const dense_lr_sched *s, int64_t step);

#endif
