/* Per-step helpers of the train loop: deduplicate a feature's ids, pool rows
 * into per-sample bags, and scatter the bags' gradients back onto the unique
 * rows in a fixed order.
 *
 * Shapes follow datasets/batch.h: for one feature, offsets[n+1] are CSR
 * offsets into the batch's ids array (absolute: feature f's ids start at
 * ids[offsets[0]]); sample i's bag is ids[offsets[i] .. offsets[i+1]). The
 * feature's ids form ids[offsets[0] .. offsets[n]), n_ids entries, and
 * inverse[k] is the index in unique[] of ids[offsets[0] + k]. */
#ifndef SHARDREC_EMBEDDING_BAG_H
#define SHARDREC_EMBEDDING_BAG_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

typedef struct emb_dedup emb_dedup;

/* A deduplicator sized for max_ids ids per run (it grows if a run has more;
 * runs up to max_ids allocate nothing). Returns NULL when out of memory. */
emb_dedup *emb_dedup_create(size_t max_ids);

/* unique[*n_unique] = the distinct values of ids[n] in order of first
 * appearance; inverse[k] = index in unique of ids[k]. unique and inverse are
 * the caller's, with room for n entries. Deterministic. Returns 0, or
 * SR_ENOMEM (growing past max_ids failed) or SR_ERANGE (n >= 2^32). */
int emb_dedup_run(emb_dedup *d, const uint64_t *ids, size_t n, uint64_t *unique,
                  uint32_t *inverse, size_t *n_unique);

/* NULL-safe. */
void emb_dedup_destroy(emb_dedup *d);

/* Pooling forward for one feature:
 *   out[i*out_stride + j] = sum_{k in bag i} rows[inverse[k - offsets[0]]*dim + j]
 * (divided by the bag's length for mean), i < n, j < dim; an empty bag gives
 * zeros. rows[n_unique][dim]; out_stride >= dim floats, so feature f of a
 * [n][F][dim] buffer is out = buf + f*dim, out_stride = F*dim. Sums run in
 * bag order. */
void emb_bag_forward(emb_pooling pool, int dim, int n, const uint32_t *offsets,
                     const uint32_t *inverse, const float *rows, float *out, size_t out_stride);

/* Pooling backward: grad_unique[n_unique][dim] is zeroed, then for samples
 * i = 0..n-1 in order and positions k in bag order,
 *   grad_unique[inverse[k']][j] += d_out[i*d_stride + j]  (/ bag length for mean)
 * A fixed order, so the summed gradients are the same bits every run. */
void emb_bag_backward(emb_pooling pool, int dim, int n, const uint32_t *offsets,
                      const uint32_t *inverse, const float *d_out, size_t d_stride,
                      size_t n_unique, float *grad_unique);

#endif
