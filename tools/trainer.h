/* The train step: one batch through embeddings and the dense model.
 *
 * The trainer sees embeddings only through embedding/store.h, so the same
 * step runs against in-process shards and (later) remote shard servers.
 * Per step (DESIGN.md, "A training step"):
 *   1. per table, deduplicate the batch's ids (unique ids + inverse index);
 *   2. one lookup of every table's unique ids (in flight while nothing else
 *      needs them);
 *   3. pool rows into emb[n][T][dim] (sum or mean bags);
 *   4. dense forward and backward: loss, parameter gradients, d_emb;
 *   5. scatter d_emb onto the unique rows, summed in sample order, and push
 *      them with the step's learning rate (the store applies the sparse
 *      optimizer where each row lives);
 *   6. dense optimizer step.
 * Every buffer is allocated at create time for max_batch samples; a step
 * allocates only when a multi-hot batch holds more ids than seen before. */
#ifndef SHARDREC_TOOLS_TRAINER_H
#define SHARDREC_TOOLS_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "embedding/plan.h"
#include "embedding/store.h"

typedef struct trainer trainer;

/* Seconds spent in each phase since create (or trainer_times_reset). */
typedef struct trainer_times {
  double dedup, lookup, pool, forward, backward, scatter, push, dense_opt;
  int64_t steps;
} trainer_times;

/* Create a trainer over plan (borrowed) and store (borrowed), with a fresh
 * dense model of cfg (cfg->n_sparse must equal plan->n_tables and every
 * table's dim cfg->emb_dim) initialised from seed, and a dense optimizer.
 * Returns NULL with the reason in err. */
trainer *trainer_create(const emb_plan *plan, emb_store *store, const dense_config *cfg,
                        const dense_opt_config *opt, uint64_t seed, char *err, size_t errlen);
void trainer_destroy(trainer *t); /* NULL-safe */

/* One training step on b: the dense optimizer at learning rate lr, the
 * sparse optimizer (in the store) at sparse_lr. *loss gets the batch's mean
 * BCE. Returns 0 or an SR_E* code (text in trainer_errmsg). */
int trainer_step(trainer *t, const ds_batch *b, int64_t step, float lr, float sparse_lr,
                 float *loss);

/* Predicted click probabilities of b's samples into prob[b->n]; changes
 * nothing. step is passed to the store's lookup. */
int trainer_predict(trainer *t, const ds_batch *b, int64_t step, float *prob);

dense_model *trainer_model(trainer *t);
dense_opt *trainer_dense_opt(trainer *t);
const trainer_times *trainer_times_get(const trainer *t);
void trainer_times_reset(trainer *t);
const char *trainer_errmsg(const trainer *t);

#endif
