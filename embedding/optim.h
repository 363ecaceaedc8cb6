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

/* A gradient float read where it lies, at any address. A server applies a
 * Push's gradients in the request's own bytes, which land in its read
 * buffer at whatever offset the connection's earlier bytes left (off a
 * 4-byte boundary in about 7 Pushes of 10), so every read of a pushed
 * gradient goes through this type: the compiler emits unaligned loads,
 * the same vector loads the optimizers' loops use for aligned floats. */
typedef float emb_grad __attribute__((aligned(1)));

/* Floats of optimizer state per row: 0, dim or 1. */
int emb_optim_state_len(const emb_optim_cfg *o, int dim);

/* Fill the state of a never-updated row (state_len floats). */
void emb_optim_state_init(const emb_optim_cfg *o, int dim, float *state);

/* Apply one summed gradient g[dim] with learning rate lr to the row w[dim]
 * and its state (emb_optim_state_len floats; NULL for sgd). In place. 1
 * when the updated row and state are all finite, else 0 (each value's
 * exponent bits tested in the update's own loop, as emb_all_finite
 * would). */
int emb_optim_apply(const emb_optim_cfg *o, int dim, float lr, const emb_grad *g, float *w,
                    float *state);

/* emb_optim_apply over the n rows of one table, each held as floats
 * with its state right after its dim weights (w[r][0..dim), state at
 * w[r] + dim), row r's gradient at g + r * dim: the same bits as n calls,
 * the optimizer chosen once. The index of the first row whose outcome is
 * not finite (it and every row before it updated, none after), or n. */
size_t emb_optim_apply_rows(const emb_optim_cfg *o, int dim, float lr, const emb_grad *g,
                            float *const *w, size_t n);

/* The largest sparse learning rate a store accepts; a push with a rate
 * outside [0, EMB_OPTIM_MAX_LR] (or not finite) is refused. */
#define EMB_OPTIM_MAX_LR 1e4

/* Whether x[n] (at any address) are all finite: exponent bits not all
 * ones (integer ops the compiler vectorises; isfinite per float is a
 * branch each). */
int emb_all_finite(const emb_grad *x, size_t n);

/* 1 when lr is finite and within [0, EMB_OPTIM_MAX_LR], else 0. */
int emb_optim_lr_ok(float lr);

/* The update of a stored row where it lives: emb_optim_apply with table's
 * optimizer, then the row rounded to the table's precision
 * (emb_row_round, keyed by row_id and step). For an fp32 table it is
 * emb_optim_apply, the same bits. 1 when the outcome (the rounded row and
 * the state) is all finite, else 0: a store applying a push in place
 * undoes it then. */
int emb_optim_apply_at(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float lr,
                       const emb_grad *g, float *w, float *state);

/* Whether emb_optim_apply_at would leave the row and its state finite (the
 * rounded row: an fp16 weight rounded past 65504 is infinite, so not
 * finite): the same update run on a copy in scratch (room for dim +
 * emb_optim_state_len floats, the caller's); w and state are only read. 1
 * when every float of the outcome is finite, else 0: the verdict
 * emb_optim_apply_at would give. The shard store calls it for every row of
 * a push larger than its chunk before applying any, so that a push is
 * applied whole or not at all. */
int emb_optim_check_at(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float lr,
                       const emb_grad *g, const float *w, const float *state, float *scratch);

#endif
