/* Weights in 16 bits: the rounding of an updated row to its table's
 * precision (plan.h emb_precision).
 *
 * An fp16 or bf16 table holds only values of its format: a never-written
 * row's init value is rounded to nearest (emb_row_init), and every update is
 * computed in fp32 from the held value and the fp32 optimizer state, then
 * rounded back stochastically (common/half.h): up or down with the
 * probabilities that make the rounding unbiased, so that updates smaller
 * than a step of the format still move the weights on average.
 *
 * The random bits are a pure function of (seed, table_id, row_id, step,
 * element), Philox4x32-10 (common/rng.h) as for row init:
 *   key  = sr_mix64(seed ^ sr_mix64(step ^ EMB_ROUND_TAG))
 *   bits = sr_philox(key, row_id, ((uint64_t)table_id << 32) | (j / 4)).v[j % 4]
 * so the same push rounds to the same bits whichever store, shard, server,
 * thread or host applies it, whenever the row was last evicted or read from
 * disk, and after a resume. */
#ifndef SHARDREC_EMBEDDING_PRECISION_H
#define SHARDREC_EMBEDDING_PRECISION_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

/* Mixed into the step so that the rounding's keys are not the init's. */
#define EMB_ROUND_TAG 0x5eed0f16b16f32ULL

/* Round w[dim] of row row_id of table (plan index), updated by the push of
 * step, to the table's precision, in place (each w[j] becomes the float
 * value of its fp16 / bf16 rounding; infinities and NaNs stay what they
 * are). Nothing for an fp32 table. */
void emb_row_round(const emb_plan *plan, int table, uint64_t row_id, int64_t step, float *w);

/* out[i] = in[i] rounded to the nearest value of precision p (ties to
 * even), i < n: a conversion of stored weights (reshard --precision) or of
 * a row's init draw (emb_row_init), not an update. fp32: a copy. in and out
 * may be the same array. */
void emb_values_round_nearest(emb_precision p, const float *in, float *out, size_t n);

#endif
