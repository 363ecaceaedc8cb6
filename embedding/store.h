/* The embedding-store interface: one API for every place rows live.
 *
 * The train loop sees embeddings only through this header, so the same code
 * trains against in-process shards (emb_store_create_local, this issue),
 * shards with a RocksDB cold tier (storage issue) and remote shard servers
 * (rpc/, service issue). A store is a struct of function pointers chosen at
 * start-up, as ggml's backends are.
 *
 * Tables are named by their index in the plan (0..n_tables-1); the plan maps
 * that index to the stable table_id. Rows are (table_id, row_id).
 *
 * The sparse optimizer runs inside the store, where the row lives. The trainer
 * deduplicates ids per table and sums each row's gradients in a fixed order
 * before pushing, so a row's update never depends on where it lives. */
#ifndef SHARDREC_EMBEDDING_STORE_H
#define SHARDREC_EMBEDDING_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/plan.h"

typedef struct emb_store emb_store;

/* The unique ids of one step, per table. Borrowed: the caller keeps them
 * alive and unchanged until the matching lookup_wait (or push) returns. */
typedef struct emb_idset {
  int n_tables;              /* = plan's n_tables */
  const uint64_t *const *ids; /* [n_tables] -> [counts[t]] unique row ids */
  const size_t *counts;      /* [n_tables] */
} emb_idset;

typedef struct emb_store_stats {
  uint64_t rows;          /* rows held (in memory plus cold tier) */
  uint64_t bytes;         /* bytes held for them (values + optimizer state) */
  uint64_t lookups;       /* rows looked up */
  uint64_t hits;          /* of which served from memory */
  uint64_t pushes;        /* rows updated */
} emb_store_stats;

/* Called once per stored row by iterate; return nonzero to stop early.
 * value has dim floats, state has state_len floats (optimizer state). */
typedef int (*emb_row_fn)(void *ctx, int table, uint64_t row_id, const float *value,
                          int dim, const float *state, int state_len);

typedef struct emb_store_ops {
  /* Start fetching every row of ids; row r of table t lands in
   * out[t][r*dim .. (r+1)*dim). out is the caller's, alive until lookup_wait.
   * May return before the rows are there. */
  int (*lookup_begin)(emb_store *s, int64_t step, const emb_idset *ids, float *const *out);
  /* Wait for the last lookup_begin. */
  int (*lookup_wait)(emb_store *s);
  /* Apply step's summed row gradients: grads[t][r*dim..] is the gradient of
   * row ids->ids[t][r]. lr is the step's learning rate. */
  int (*push)(emb_store *s, int64_t step, float lr, const emb_idset *ids,
              const float *const *grads);
  /* Make every update durable where the store has a durable tier. */
  int (*flush)(emb_store *s);
  /* Write every row to the folder path (created); restore replaces every row
   * held with the ones in path. */
  int (*checkpoint)(emb_store *s, const char *path);
  int (*restore)(emb_store *s, const char *path);
  int (*stats)(emb_store *s, emb_store_stats *out);
  /* Visit every stored row of table (plan index), in ascending row id. */
  int (*iterate)(emb_store *s, int table, emb_row_fn fn, void *ctx);
  const char *(*errmsg)(emb_store *s);
  void (*destroy)(emb_store *s);
} emb_store_ops;

/* Every implementation begins with this header. */
struct emb_store {
  const emb_store_ops *ops;
  const emb_plan *plan; /* borrowed: outlives the store */
};

static inline int emb_store_lookup_begin(emb_store *s, int64_t step, const emb_idset *ids,
                                         float *const *out) {
  return s->ops->lookup_begin(s, step, ids, out);
}
static inline int emb_store_lookup_wait(emb_store *s) { return s->ops->lookup_wait(s); }
static inline int emb_store_push(emb_store *s, int64_t step, float lr, const emb_idset *ids,
                                 const float *const *grads) {
  return s->ops->push(s, step, lr, ids, grads);
}
static inline int emb_store_flush(emb_store *s) { return s->ops->flush(s); }
static inline int emb_store_checkpoint(emb_store *s, const char *path) {
  return s->ops->checkpoint(s, path);
}
static inline int emb_store_restore(emb_store *s, const char *path) {
  return s->ops->restore(s, path);
}
static inline int emb_store_stats_get(emb_store *s, emb_store_stats *out) {
  return s->ops->stats(s, out);
}
static inline int emb_store_iterate(emb_store *s, int table, emb_row_fn fn, void *ctx) {
  return s->ops->iterate(s, table, fn, ctx);
}
static inline const char *emb_store_errmsg(emb_store *s) { return s->ops->errmsg(s); }
/* NULL-safe. */
static inline void emb_store_destroy(emb_store *s) {
  if (s) s->ops->destroy(s);
}

/* The in-process store: every row in memory, all shards of the plan hosted
 * here. plan is borrowed and must outlive the store. Returns NULL and writes
 * a message to err on failure. */
emb_store *emb_store_create_local(const emb_plan *plan, char *err, size_t errlen);

#endif
