#include "embedding/bag.h"

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/status.h"

/* Open addressing with generation stamps: a slot is live in this run only if
 * its stamp equals the run's, so nothing is cleared between runs. */
typedef struct {
  uint64_t key;
  uint32_t stamp;
  uint32_t idx;
} dd_slot;

struct emb_dedup {
  dd_slot *slots;
  size_t mask;
  uint32_t stamp;
};

static int dd_size(emb_dedup *d, size_t max_ids) {
  size_t cap = 16;
  while (cap < 2 * max_ids) cap <<= 1;
  dd_slot *s = calloc(cap, sizeof *s);
  if (!s) return SR_ENOMEM;
  free(d->slots);
  d->slots = s;
  d->mask = cap - 1;
  d->stamp = 0;
  return 0;
}

emb_dedup *emb_dedup_create(size_t max_ids) {
  emb_dedup *d = calloc(1, sizeof *d);
  if (!d || dd_size(d, max_ids)) {
    free(d);
    return NULL;
  }
  return d;
}

void emb_dedup_destroy(emb_dedup *d) {
  if (!d) return;
  free(d->slots);
  free(d);
}

int emb_dedup_run(emb_dedup *d, const uint64_t *ids, size_t n, uint64_t *unique,
                  uint32_t *inverse, size_t *n_unique) {
  if (n >= UINT32_MAX) return SR_ERANGE;
  if (2 * n > d->mask + 1) {
    int rc = dd_size(d, n);
    if (rc) return rc;
  }
  if (++d->stamp == 0) { /* wrapped: clear once every 2^32 runs */
    memset(d->slots, 0, (d->mask + 1) * sizeof *d->slots);
    d->stamp = 1;
  }
  const uint32_t st = d->stamp;
  dd_slot *slots = d->slots;
  const size_t mask = d->mask;
  size_t nu = 0;
  for (size_t k = 0; k < n; k++) {
    uint64_t key = ids[k];
    size_t h = (size_t)sr_mix64(key) & mask;
    for (;;) {
      dd_slot *s = &slots[h];
      if (s->stamp != st) {
        s->stamp = st;
        s->key = key;
        s->idx = (uint32_t)nu;
        unique[nu] = key;
        inverse[k] = (uint32_t)nu++;
        break;
      }
      if (s->key == key) {
        inverse[k] = s->idx;
        break;
      }
      h = (h + 1) & mask;
    }
  }
  *n_unique = nu;
  return 0;
}

void emb_bag_forward(emb_pooling pool, int dim, int n, const uint32_t *offsets,
                     const uint32_t *inverse, const float *rows, float *out, size_t out_stride) {
  const uint32_t base = offsets[0];
  for (int i = 0; i < n; i++) {
    float *o = out + (size_t)i * out_stride;
    for (int j = 0; j < dim; j++) o[j] = 0.0f;
    uint32_t b = offsets[i] - base, e = offsets[i + 1] - base;
    for (uint32_t k = b; k < e; k++) {
      const float *r = rows + (size_t)inverse[k] * (size_t)dim;
      for (int j = 0; j < dim; j++) o[j] += r[j];
    }
    if (pool == EMB_POOL_MEAN && e > b) {
      const float len = (float)(e - b);
      for (int j = 0; j < dim; j++) o[j] /= len;
    }
  }
}

void emb_bag_backward(emb_pooling pool, int dim, int n, const uint32_t *offsets,
                      const uint32_t *inverse, const float *d_out, size_t d_stride,
                      size_t n_unique, float *grad_unique) {
  memset(grad_unique, 0, n_unique * (size_t)dim * sizeof(float));
  const uint32_t base = offsets[0];
  for (int i = 0; i < n; i++) {
    const float *g = d_out + (size_t)i * d_stride;
    uint32_t b = offsets[i] - base, e = offsets[i + 1] - base;
    if (e == b) continue;
    if (pool == EMB_POOL_MEAN) {
      const float len = (float)(e - b);
      for (uint32_t k = b; k < e; k++) {
        float *r = grad_unique + (size_t)inverse[k] * (size_t)dim;
        for (int j = 0; j < dim; j++) r[j] += g[j] / len;
      }
    } else {
      for (uint32_t k = b; k < e; k++) {
        float *r = grad_unique + (size_t)inverse[k] * (size_t)dim;
        for (int j = 0; j < dim; j++) r[j] += g[j];
      }
    }
  }
}
