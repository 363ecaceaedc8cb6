/* Pooling of 16-bit rows: emb_bag_forward (embedding/bag.h) over rows held
 * as an fp16 or bf16 table keeps them (dim 16-bit values a row, as
 * emb_store_lookup_begin_rows16 hands them), each value widened to float
 * as it is added. Widening is exact, and the sums run in emb_bag_forward's
 * order, so the output is the same bits as emb_bag_forward over the rows
 * converted to floats first, whichever kernel runs: plain C (every CPU),
 * or F16C and AVX2 (8 values at a time, where the CPU has them and the
 * kernel is not SR_HALF_C). */
#ifndef SHARDREC_EMBEDDING_BAG16_H
#define SHARDREC_EMBEDDING_BAG16_H

#include <stddef.h>
#include <stdint.h>

#include "common/half.h"
#include "embedding/plan.h"

/* As emb_bag_forward, rows[n_unique][dim] of precision prec (EMB_PREC_FP16
 * or EMB_PREC_BF16); k: SR_HALF_C for the plain C kernel, else the vector
 * one where the CPU runs it. */
void emb_bag_forward16(emb_pooling pool, emb_precision prec, sr_half_kernel k, int dim, int n,
                       const uint32_t *offsets, const uint32_t *inverse, const uint16_t *rows,
                       float *out, size_t out_stride);

#endif
