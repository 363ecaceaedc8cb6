/* A step's pooling and its gradients' scatter, table by table, over the
 * dense pool (dense/pool.h): one task per table, each table's bags formed
 * by the same single-threaded code (embedding/bag.h) whichever thread takes
 * it, so the thread count changes speed, never bits. */
#ifndef SHARDREC_TRAIN_TRAINER_BAGS_H
#define SHARDREC_TRAIN_TRAINER_BAGS_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "embedding/plan.h"

/* emb[n][T][dim]: table f's bags of the batch's first n samples from
 * rows[f], as emb_bag_forward with out = emb + f * dim. Everything is
 * borrowed for the call. */
void trainer_bags_forward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                          uint32_t *const *inverse, float *const *rows, float *emb);

/* grads[f][counts[f]][dim] from d_emb[n][T][dim], as emb_bag_backward for
 * each table f. Everything is borrowed for the call. */
void trainer_bags_backward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                           uint32_t *const *inverse, const float *d_emb, const size_t *counts,
                           float *const *grads);

#endif
