/* Sparse optimizers, applied to one row at a time where the row lives.
 *
 * The trainer sums a row's gradients in a fixed order before pushing, so the
 * update of a row depends only on that row's value, state and summed
 * gradient, never on the shard it lives on.
 *
 *   sgd:             w -= lr * g                                 state: none
 *   adagrad:         acc += g*g;  w += (-lr * g) / (sqrt(acc) + eps)
 *                    (torch.optim.Adagrad, lr_decay = weight_decay = 0:
 *                    addcmul_ then addcdiv_, same operation order)
 *                                                                 state: dim floats
 *   rowwise_adagrad: acc += sum(g*g) / dim;  w -= (lr / (sqrt(acc) + eps)) * g
 *                    (FBGEMM / TorchRec EXACT_ROWWISE_ADAGRAD)       state: 1 float
 *
 * Accumulators start at the optimizer's initial_accumulator_value. */
#ifndef SHARDREC_EMBEDDING_OPTIM_H
#define SHARDREC_EMBEDDING_OPTIM_H

#include "embedding/plan.h"

/* Floats of optimizer state per row: 0, dim or 1. */
int emb_optim_state_len(const emb_optim_cfg *o, int dim);

/* Fill the state of a never-updated row (state_len floats). */
void emb_optim_state_init(const emb_optim_cfg *o, int dim, float *state);

/* Apply one summed gradient g[dim] with learning rate lr to the row w[dim]
 * and its state (emb_optim_state_len floats; NULL for sgd). In place. */
void emb_optim_apply(const emb_optim_cfg *o, int dim, float lr, const float *g, float *w,
                     float *state);

#endif
