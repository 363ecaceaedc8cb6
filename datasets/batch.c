#include "datasets/batch.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"

int ds_batch_init(ds_batch *b, int cap) {
  memset(b, 0, sizeof *b);
  if (cap <= 0) return SR_EINVAL;
  b->cap = cap;
  b->labels = calloc((size_t)cap, sizeof *b->labels);
  b->dense = calloc((size_t)cap * DS_NUM_DENSE, sizeof *b->dense);
  b->offsets = calloc((size_t)DS_NUM_SPARSE * (size_t)(cap + 1), sizeof *b->offsets);
  b->ids_cap = (size_t)cap * DS_NUM_SPARSE;
  b->ids = calloc(b->ids_cap, sizeof *b->ids);
  if (!b->labels || !b->dense || !b->offsets || !b->ids) {
    ds_batch_free(b);
    return SR_ENOMEM;
  }
  return 0;
}

int ds_batch_reserve_ids(ds_batch *b, size_t n) {
  if (n <= b->ids_cap) return 0;
  size_t cap = b->ids_cap ? b->ids_cap : 64;
  while (cap < n) cap *= 2;
  uint64_t *p = realloc(b->ids, cap * sizeof *p);
  if (!p) return SR_ENOMEM;
  b->ids = p;
  b->ids_cap = cap;
  return 0;
}

void ds_batch_free(ds_batch *b) {
  if (!b) return;
  free(b->labels);
  free(b->dense);
  free(b->offsets);
  free(b->ids);
  memset(b, 0, sizeof *b);
}
