/* A step's deduplication, pooling and scatter over the dense pool (see
 * trainer_bags.h). */
#include "train/trainer_bags.h"

#include "common/status.h"
#include "dense/pool.h"
#include "embedding/bag16.h"

typedef struct {
  const emb_plan *plan;
  int T, dim, n;
  const ds_batch *b;
  uint32_t *const *inverse;
  float *const *rows; /* forward: the looked-up rows; backward: the gradients */
  int rows16;         /* forward: 16-bit tables' rows are 2-byte values */
  float *emb;         /* forward's output */
  const float *d_emb; /* backward's input */
  const size_t *counts;
} bags_job;

/* Samples a pooling task takes: every table's bags of a block of samples,
 * so that a task writes one stretch of emb (a task per table wrote one
 * dim-wide column of every sample's row, a cache line apart each). */
#define BAGS_SAMPLES 32

static void bags_forward_task(void *arg, int task) {
  const bags_job *j = arg;
  const int i0 = task * BAGS_SAMPLES, n = j->n - i0 < BAGS_SAMPLES ? j->n - i0 : BAGS_SAMPLES;
  const size_t stride = (size_t)j->T * (size_t)j->dim;
  for (int f = 0; f < j->T; f++) {
    const emb_table *tb = &j->plan->tables[f];
    const uint32_t *off = ds_batch_offsets(j->b, f) + i0;
    const uint32_t *inv = j->inverse[f] + (off[0] - off[-i0]); /* the block's first id */
    float *out = j->emb + (size_t)i0 * stride + (size_t)f * (size_t)j->dim;
    if (j->rows16 && tb->precision != EMB_PREC_FP32)
      emb_bag_forward16(tb->pooling, tb->precision, SR_HALF_AUTO, j->dim, n, off, inv,
                        (const uint16_t *)(const void *)j->rows[f], out, stride);
    else
      emb_bag_forward(tb->pooling, j->dim, n, off, inv, j->rows[f], out, stride);
  }
}

static void bags_backward_task(void *arg, int f) {
  const bags_job *j = arg;
  size_t stride = (size_t)j->T * (size_t)j->dim;
  emb_bag_backward(j->plan->tables[f].pooling, j->dim, j->n, ds_batch_offsets(j->b, f),
                   j->inverse[f], j->d_emb + (size_t)f * (size_t)j->dim, stride, j->counts[f],
                   j->rows[f]);
}

void trainer_bags_forward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                          uint32_t *const *inverse, float *const *rows, int rows16, float *emb) {
  bags_job j = {.plan = plan, .T = T, .dim = dim, .n = n, .b = b, .inverse = inverse,
                .rows = rows, .rows16 = rows16, .emb = emb};
  dense_pool_run(dense_pool_default(), (n + BAGS_SAMPLES - 1) / BAGS_SAMPLES, bags_forward_task, &j);
}

void trainer_bags_backward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                           uint32_t *const *inverse, const float *d_emb, const size_t *counts,
                           float *const *grads) {
  bags_job j = {.plan = plan, .T = T, .dim = dim, .n = n, .b = b, .inverse = inverse,
                .rows = grads, .d_emb = d_emb, .counts = counts};
  dense_pool_run(dense_pool_default(), T, bags_backward_task, &j);
}

typedef struct {
  emb_dedup *const *dedup;
  const ds_batch *b;
  uint64_t *const *unique;
  uint32_t *const *inverse;
  size_t *counts;
  int rc[EMB_MAX_TABLES];
} dedup_job;

static void dedup_task(void *arg, int f) {
  dedup_job *j = arg;
  const uint32_t *off = ds_batch_offsets(j->b, f);
  int n = j->b->n;
  size_t nids = n > 0 ? (size_t)(off[n] - off[0]) : 0;
  j->counts[f] = 0;
  j->rc[f] = nids ? emb_dedup_run(j->dedup[f], j->b->ids + off[0], nids, j->unique[f],
                                  j->inverse[f], &j->counts[f])
                  : SR_OK;
}

int trainer_bags_dedup(emb_dedup *const *dedup, int T, const ds_batch *b, uint64_t *const *unique,
                       uint32_t *const *inverse, size_t *counts, int *bad) {
  dedup_job j = {.dedup = dedup, .b = b, .unique = unique, .inverse = inverse, .counts = counts};
  dense_pool_run(dense_pool_default(), T, dedup_task, &j);
  for (int f = 0; f < T; f++)
    if (j.rc[f]) {
      *bad = f;
      return j.rc[f];
    }
  return SR_OK;
}
