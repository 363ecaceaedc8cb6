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
#ifndef SHARDREC_TRAIN_TRAINER_H
#define SHARDREC_TRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "dense/collective.h"
#include "dense/model.h"
#include "dense/optim.h"
#include "embedding/plan.h"
#include "embedding/store.h"
#include "train/keep.h"

typedef struct trainer trainer;

/* Seconds spent in each phase since create (or trainer_times_reset). */
typedef struct trainer_times {
  double dedup, lookup, pool, forward, backward, scatter, push, dense_opt;
  double allreduce; /* the dense gradients' all-reduce (data-parallel steps) */
  double prefetch;  /* handing later steps' ids to the store (trainer_ahead); lookup is
                       the wait for this step's own rows */
  double lookup_flight; /* the lookups' time in flight, as the store measured it
                           (emb_store_lookup_flight; 0 where it does not): lookup is
                           the part of it the trainer waited for */
  int64_t steps;
  uint64_t rows;    /* unique rows looked up (each is pushed back once) */
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
 * BCE. Returns 0 or an SR_E* code (text in trainer_errmsg). SR_ERANGE when
 * the step's loss is not finite (checked before the push: nothing of the
 * step is applied) or the dense update left a parameter non-finite (the
 * run must stop: the model in memory is lost, the last checkpoint is not);
 * a store refuses a push that would leave a row non-finite the same way. */
int trainer_step(trainer *t, const ds_batch *b, int64_t step, float lr, float sparse_lr,
                 float *loss);

/* Data parallelism (mpirun -np N shardrec train): every rank reads the same
 * global batch of n_global samples and trains on its slice (see
 * trainer_batch_slice). c (borrowed, NULL: one rank) is the ranks'
 * collective. */
void trainer_set_coll(trainer *t, dense_coll *c);

/* Bounded tables (train/keep.h; k borrowed, NULL: none): from the next
 * step on, an id of a bounded table without a row (keep_has_row) reads
 * zeros in every lookup (training and test passes) and its gradient is
 * not pushed. The caller feeds k each global batch (keep_observe) before
 * the step and applies its decisions after (keep_decide,
 * emb_store_remove). */
void trainer_set_keep(trainer *t, const keep *k);

/* One step of this rank's part of a global batch of n_global samples
 * (part->n may be 0: the rank still takes part in the collectives and the
 * store's step). The gradients are those of the MEAN loss over the global
 * batch: this rank's loss gradient is scaled by 1/n_global (as
 * part->n/n_global times the model's 1/part->n), the row gradients pushed to
 * the store likewise (the shards sum the ranks' pushes), and the dense
 * gradients with this rank's loss sum appended are all-reduced in one call
 * before the dense optimizer step. *loss gets the global batch's mean BCE on
 * every rank. With one rank (no collective, or size 1, and part->n ==
 * n_global) this is trainer_step, bit for bit.
 *
 * Several ranks: a rank whose lookup or push fails still takes part in the
 * all-reduce (its gradients zero), which carries the count of ranks whose
 * step failed beside the loss sum (the pushes come before it), so every rank
 * learns in the same step that it failed and none applies its dense update:
 * the failing rank returns its own code (trainer_errmsg: why), the others
 * SR_ESTATE with trainer_peer_failed set. */
int trainer_step_part(trainer *t, const ds_batch *part, int n_global, int64_t step, float lr,
                      float sparse_lr, float *loss);

/* 1 when the last trainer_step_part failed because another rank's lookup
 * or push did (this rank's own calls succeeded), else 0. */
int trainer_peer_failed(const trainer *t);

/* Rank rank of size's slice of the global batch b into out (initialised
 * with ds_batch_init for at least b->n / size + 1 samples): samples
 * [lo, lo + n) where a batch of B = q*size + e samples gives every rank q
 * and ranks 0..e-1 one more, in rank order (B % size == 0: [r*B/size,
 * (r+1)*B/size)). out->first_index is b's plus lo. 0 or SR_ENOMEM /
 * SR_EINVAL (out too small). */
int trainer_batch_slice(const ds_batch *b, int rank, int size, ds_batch *out);

/* Samples of rank's slice of a global batch of n samples (as above). */
int trainer_slice_count(int n, int rank, int size);

/* Early lookup (async mode with shard servers): during the next
 * trainer_step_part call, right after that step's own rows are in (and its
 * look-ahead handed to the store) and before its compute and push, dedup
 * next (this rank's part of the next global batch; already done when it
 * entered through trainer_ahead) into a set of its own and begin its lookup
 * for next_step into a second rows buffer; the step of next_step then waits
 * for those rows instead of looking up. next is borrowed and must stay unchanged until the step of
 * next_step has run (the caller double-buffers its batches). The store must
 * take a lookup in flight while a push is made (the remote store does).
 * A trainer_predict in between drops the rows looked up early (the step looks up
 * again, without deduplicating). 0 or SR_ENOMEM. */
int trainer_lookup_early(trainer *t, const ds_batch *next, int64_t next_step);

/* Look-ahead (--prefetch-depth, the store's prefetch): part (this rank's part of the batch of
 * step, a step after the one about to run) enters the window. During the
 * next trainer_step_part call, right after that step's own rows are in and
 * before its compute, it is deduplicated, once, into a set of its own kept
 * until step runs (then swapped in: step deduplicates nothing), and its
 * unique ids are handed to the store (emb_store_prefetch), batches
 * registered together in increasing step order. part is borrowed and must
 * stay unchanged until step has run (the job keeps a ring of batches). A
 * step whose batch is not the one registered (another first_index or n)
 * forgets the set and deduplicates its own; sets of steps before the one
 * that runs are freed. 0, SR_ENOMEM (the set's buffers) or SR_EINVAL (step's
 * lookup is already in flight). */
int trainer_ahead(trainer *t, const ds_batch *part, int64_t step);

/* Forget every batch ahead and any early lookup in flight (its status
 * ignored): the data position was rewound (a recovery, a resume), and the
 * store's restore dropped what it had prefetched. */
void trainer_ahead_drop(trainer *t);

/* Predicted click probabilities of b's samples into prob[b->n]; changes
 * nothing. step is passed to the store's lookup. b->n == 0: nothing to do. */
int trainer_predict(trainer *t, const ds_batch *b, int64_t step, float *prob);

dense_model *trainer_model(trainer *t);
dense_opt *trainer_dense_opt(trainer *t);
const trainer_times *trainer_times_get(const trainer *t);
void trainer_times_reset(trainer *t);
const char *trainer_errmsg(const trainer *t);

#endif
