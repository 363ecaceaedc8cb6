#include "dense/optim.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "dense/pool.h"

struct dense_opt {
  dense_opt_config cfg;
  size_t bad_at; /* the last step's first non-finite parameter, or n */
  size_t n;
  int64_t steps;
  float *state; /* owned: 0, n or 2n floats */
  size_t n_state;
};

dense_opt_config dense_opt_defaults(dense_opt_kind kind) {
  dense_opt_config c = {kind, 0.0f, 0.9, 0.999, 0.0f};
  if (kind == DENSE_OPT_ADAGRAD) c.eps = 1e-10f;
  if (kind == DENSE_OPT_ADAM) c.eps = 1e-8f;
  return c;
}

dense_opt *dense_opt_create(const dense_opt_config *cfg, size_t n_params,
                            char *err, size_t errlen) {
  if (!cfg || cfg->kind < DENSE_OPT_SGD || cfg->kind > DENSE_OPT_ADAM) {
    sr_fmt(err, errlen, "unknown dense optimizer kind");
    return NULL;
  }
  if (cfg->kind == DENSE_OPT_ADAM &&
      !(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0 && cfg->beta2 >= 0.0 &&
        cfg->beta2 < 1.0)) {
    sr_fmt(err, errlen, "adam betas must be in [0, 1) (got %g, %g)",
           cfg->beta1, cfg->beta2);
    return NULL;
  }
  if (cfg->kind != DENSE_OPT_SGD && !(cfg->eps >= 0.0f)) {
    sr_fmt(err, errlen, "eps must be >= 0 (got %g)", cfg->eps);
    return NULL;
  }
  dense_opt *o = calloc(1, sizeof *o);
  if (!o) goto oom;
  o->cfg = *cfg;
  o->n = n_params;
  o->bad_at = n_params;
  o->n_state = cfg->kind == DENSE_OPT_ADAGRAD ? n_params
               : cfg->kind == DENSE_OPT_ADAM  ? 2 * n_params
                                              : 0;
  if (o->n_state) {
    o->state = malloc(o->n_state * sizeof(float));
    if (!o->state) goto oom;
    float v0 = cfg->kind == DENSE_OPT_ADAGRAD ? cfg->initial_accumulator : 0;
    for (size_t i = 0; i < o->n_state; i++) o->state[i] = v0;
  }
  return o;
oom:
  sr_fmt(err, errlen, "out of memory creating the dense optimizer");
  dense_opt_destroy(o);
  return NULL;
}

void dense_opt_destroy(dense_opt *o) {
  if (!o) return;
  free(o->state);
  free(o);
}

/* One step's element-wise update, in fixed chunks over the dense pool
 * (dense/pool.h): every element is updated by the same instructions
 * whatever the split, so the thread count changes no bits. */
#define OPT_CHUNK 16384
typedef struct {
  const dense_opt *o;
  float *p;
  const float *g;
  float lr, c1, c2, fb1, fb2, step_size, bc2_sqrt;
  size_t blk;
  _Atomic size_t bad; /* the first parameter left inf or nan, or n */
} opt_job;

/* The first of p[i0, i1) that is inf or nan, or i1. One pass over the
 * exponent bits as integers (all ones: inf or nan), which vectorises; the
 * element is then found by a second, scalar pass only when there is one. */
static size_t chunk_nonfinite(const float *p, size_t i0, size_t i1) {
  uint32_t any = 0;
  for (size_t i = i0; i < i1; i++) {
    uint32_t u;
    memcpy(&u, &p[i], sizeof u);
    any |= (u & 0x7f800000u) + 0x00800000u; /* carries into bit 31 only when all ones */
  }
  if (!(any & 0x80000000u)) return i1;
  for (size_t i = i0; i < i1; i++)
    if (!isfinite(p[i])) return i;
  return i1;
}

static void opt_task(void *arg, int t) {
  opt_job *j = arg;
  size_t n = j->o->n, i0 = (size_t)t * j->blk, i1 = i0 + j->blk < n ? i0 + j->blk : n;
  float *restrict p = j->p;
  const float *restrict g = j->g;
  float lr = j->lr, eps = j->o->cfg.eps;
  switch (j->o->cfg.kind) {
  case DENSE_OPT_SGD:
    for (size_t i = i0; i < i1; i++) p[i] -= lr * g[i];
    break;
  case DENSE_OPT_ADAGRAD: {
    float *restrict s = j->o->state;
    for (size_t i = i0; i < i1; i++) {
      s[i] += g[i] * g[i];
      p[i] -= lr * (g[i] / (sqrtf(s[i]) + eps));
    }
    break;
  }
  case DENSE_OPT_ADAM: {
    float *restrict m = j->o->state, *restrict v = j->o->state + n;
    for (size_t i = i0; i < i1; i++) {
      m[i] = j->fb1 * m[i] + j->c1 * g[i];
      v[i] = j->fb2 * v[i] + j->c2 * (g[i] * g[i]);
      float denom = sqrtf(v[i]) / j->bc2_sqrt + eps;
      p[i] -= j->step_size * (m[i] / denom);
    }
    break;
  }
  }
  size_t bad = chunk_nonfinite(j->p, i0, i1);
  if (bad < i1) { /* keep the smallest index: the same whichever task finds one first */
    size_t cur = atomic_load(&j->bad);
    while (bad < cur && !atomic_compare_exchange_weak(&j->bad, &cur, bad)) {
    }
  }
}

int dense_opt_step(dense_opt *o, float *restrict p, const float *restrict g,
                   float lr) {
  if (!o || !p || !g) return SR_EINVAL;
  o->steps++;
  opt_job j = {.o = o, .p = p, .g = g, .lr = lr, .blk = OPT_CHUNK};
  atomic_init(&j.bad, o->n);
  if (o->cfg.kind == DENSE_OPT_ADAM) {
    double b1 = o->cfg.beta1, b2 = o->cfg.beta2, t = (double)o->steps;
    /* scalars as torch computes them (python floats), then used in float */
    j.fb1 = (float)b1, j.fb2 = (float)b2;
    j.c1 = (float)(1.0 - b1), j.c2 = (float)(1.0 - b2);
    j.step_size = (float)(lr / (1.0 - pow(b1, t)));
    j.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
  }
  size_t tasks = (o->n + OPT_CHUNK - 1) / OPT_CHUNK;
  if (tasks > DENSE_POOL_MAX_TASKS) tasks = 1, j.blk = o->n; /* one pass */
  dense_pool_run(dense_pool_default(), (int)tasks, opt_task, &j);
  o->bad_at = atomic_load(&j.bad);
  return o->bad_at < o->n ? SR_ERANGE : SR_OK;
}

float *dense_opt_state(dense_opt *o, size_t *count) {
  if (count) *count = o->n_state;
  return o->state;
}
int64_t dense_opt_steps(const dense_opt *o) { return o->steps; }
void dense_opt_set_steps(dense_opt *o, int64_t steps) { o->steps = steps; }
dense_opt_kind dense_opt_kind_of(const dense_opt *o) { return o->cfg.kind; }

/* ---- LRPolicyScheduler ---------------------------------------------------- */

int dense_lr_sched_validate(const dense_lr_sched *s, char *err,
                            size_t errlen) {
  if (!s || s->num_warmup_steps < 0 || s->decay_start_step < 0 ||
      s->num_decay_steps < 0) {
    sr_fmt(err, errlen, "learning-rate schedule step counts must be >= 0");
    return SR_EINVAL;
  }
  if (s->decay_start_step < s->num_warmup_steps) {
    sr_fmt(err, errlen,
           "learning rate warmup must finish before the decay starts "
           "(--lr-decay-start-step %lld < --lr-num-warmup-steps %lld)",
           (long long)s->decay_start_step, (long long)s->num_warmup_steps);
    return SR_EINVAL;
  }
  return SR_OK;
}

static double warmup_lr(const dense_lr_sched *s, int64_t c) {
  double W = (double)s->num_warmup_steps;
  return s->base_lr * (1.0 - (W - (double)c) / W);
}
static double decay_lr(const dense_lr_sched *s, int64_t c) {
  double D = (double)s->num_decay_steps;
  double r = (D - (double)(c - s->decay_start_step)) / D;
  double lr = s->base_lr * (r * r);
  return lr > 1e-7 ? lr : 1e-7;
}

double dense_lr_at_double(const dense_lr_sched *s, int64_t step) {
  int64_t c = step + 1; /* torch's _step_count for this optimizer step */
  int64_t W = s->num_warmup_steps, S = s->decay_start_step,
          D = s->num_decay_steps;
  if (c < W) return warmup_lr(s, c);
  if (S <= c && c < S + D) return decay_lr(s, c);
  if (D > 0) {
    if (c >= S + D) return decay_lr(s, S + D - 1);
    if (W >= 2) return warmup_lr(s, W - 1);
    return s->base_lr;
  }
  return s->base_lr;
}

float dense_lr_at(const dense_lr_sched *s, int64_t step) {
  return (float)dense_lr_at_double(s, step);
}

size_t dense_opt_nonfinite_at(const dense_opt *o) { return o->bad_at; }
