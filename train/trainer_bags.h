/* A step's deduplication, pooling and its gradients' scatter over the
 * dense pool (dense/pool.h): deduplication and scatter one task per table,
 * pooling one task per block of samples (every table's bags of them), each
 * piece done by the same single-threaded code (embedding/bag.h) whichever
 * thread takes it, and each bag summed alone, so the thread count changes
 * speed, never bits. */
#ifndef SHARDREC_TRAIN_TRAINER_BAGS_H
#define SHARDREC_TRAIN_TRAINER_BAGS_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "embedding/bag.h"
#include "embedding/plan.h"

/* unique[f], inverse[f] and counts[f] of each table f of b, as
 * emb_dedup_run with dedup[f] (one task per table; unique and inverse have
 * room for the table's ids). 0, or the code of the first table (in table
 * order) that failed, that table in *bad. Everything is borrowed. */
int trainer_bags_dedup(emb_dedup *const *dedup, int T, const ds_batch *b, uint64_t *const *unique,
                       uint32_t *const *inverse, size_t *counts, int *bad);

/* emb[n][T][dim]: table f's bags of the batch's first n samples from
 * rows[f], as emb_bag_forward with out = emb + f * dim; with rows16, the
 * rows of a 16-bit table are its 2-byte values as the store holds them
 * (emb_bag_forward16, the same bits). Everything is borrowed for the call. */
void trainer_bags_forward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                          uint32_t *const *inverse, float *const *rows, int rows16, float *emb);

/* grads[f][counts[f]][dim] from d_emb[n][T][dim], as emb_bag_backward for
 * each table f. Everything is borrowed for the call. */
void trainer_bags_backward(const emb_plan *plan, int T, int dim, const ds_batch *b, int n,
                           uint32_t *const *inverse, const float *d_emb, const size_t *counts,
                           float *const *grads);

#endif
