/* A batch of Criteo-format samples, as the readers hand them to the trainer.
 *
 * The contract between datasets/ (which fills it) and the train loop (which
 * reads it). Every buffer is owned by the batch and sized once by
 * ds_batch_init for a maximum number of samples; ids grow only when multi-hot
 * bags need more room, so a training step allocates nothing. */
#ifndef SHARDREC_DATASETS_BATCH_H
#define SHARDREC_DATASETS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define DS_NUM_DENSE 13
#define DS_NUM_SPARSE 26
#define DS_MAX_BAG 128 /* most ids one sample's bag of one feature may hold, in
                          every reader (TSV, binary) and writer */

typedef struct ds_batch {
  int n;          /* samples in the batch, 0 <= n <= cap */
  int cap;        /* maximum samples */
  float *labels;  /* [cap]: 0 or 1 (0 when the input has no labels) */
  float *dense;   /* [cap][DS_NUM_DENSE]: log(1 + max(0, x)), missing = 0 */
  /* Sparse features in CSR form, feature-major. Sample i's bag for feature f
   * is ids[offsets[f*(cap+1) + i] .. offsets[f*(cap+1) + i + 1]). A missing
   * categorical is a bag holding one id, the value the reader gives empty
   * fields (as the reference DLRM maps them), never an empty bag unless the
   * input really had an empty multi-hot list. Ids are final row ids of the
   * feature's table (dictionary-mapped, modulo'd or hashed). */
  uint32_t *offsets; /* [DS_NUM_SPARSE][cap+1] */
  uint64_t *ids;     /* [ids_cap] */
  size_t ids_cap;
  uint64_t first_index; /* position (0-based sample index in the source) of sample 0 */
} ds_batch;

/* Allocate buffers for up to cap samples (one id per feature per sample to
 * start). Returns 0, or SR_ENOMEM leaving b zeroed. */
int ds_batch_init(ds_batch *b, int cap);

/* Make room for at least n ids, keeping the ones held. 0 or SR_ENOMEM. */
int ds_batch_reserve_ids(ds_batch *b, size_t n);

/* Free the buffers; b is zeroed. NULL-safe. */
void ds_batch_free(ds_batch *b);

/* Offsets row of feature f (cap+1 entries). */
static inline uint32_t *ds_batch_offsets(const ds_batch *b, int f) {
  return b->offsets + (size_t)f * (size_t)(b->cap + 1);
}

#endif
