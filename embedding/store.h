/* The embedding-store interface: one API for every place rows live.
 *
 * The train loop sees embeddings only through this header, so the same code
 * trains against in-process shards (emb_store_create_local), shards with a
 * RocksDB cold tier (embedding/shard.h) and remote shard servers
 * (rpc/client.h). A store is a struct of function pointers chosen at
 * start-up, as ggml's backends are; the struct also says which
 * implementation it is (kind) and how its checkpoint lays out its files
 * (ckpt_layout), so no caller carries a flag about either.
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
#include <string.h>

#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/plan.h"

typedef struct emb_store emb_store;
typedef struct emb_pins emb_pins; /* rows pinned by lookup_pinned (the store's) */

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

/* Figures of a store's row cache and cold tier (emb_store_figures_get), for
 * a shard server's metrics; only a store that has both keeps them. */
typedef struct emb_store_figures {
  uint64_t evictions, writebacks;   /* rows evicted from the cache; dirty rows written back */
  uint64_t cache_rows, cache_used;  /* rows the cache may hold; rows in it now */
  uint64_t sst_bytes, pending_compaction_bytes;  /* the cold tier's files; what compaction
                                                    has to rewrite */
} emb_store_figures;

/* Called once per stored row by iterate; return nonzero to stop early.
 * value has dim floats, state has state_len floats (optimizer state). */
typedef int (*emb_row_fn)(void *ctx, int table, uint64_t row_id, const float *value,
                          int dim, const float *state, int state_len);

/* Which implementation a store is. */
typedef enum emb_store_kind {
  EMB_STORE_LOCAL = 1, /* emb_store_create_local: every row in memory (store_local.c) */
  EMB_STORE_SHARD,     /* emb_store_create_shard: a row cache over RocksDB (shard.h) */
  EMB_STORE_REMOTE,    /* emb_store_create_remote: shard servers (rpc/client.h) */
  EMB_STORE_ROUTED,    /* a checkpoint's rows from several in-memory servers' folders,
                          one in-memory store per folder (ckpt_store.h) */
} emb_store_kind;

/* What checkpoint(path) writes under path (and restore(path) reads). The
 * names are storage/ckpt_dir.h's.
 *   EMB_CKPT_TABLE_FILES   path/table-<id>.bin, one table file
 *                          (embedding/table_file.h) per table of the plan,
 *                          holding every row the store holds, whatever its
 *                          shard: the local store. A caller that must keep
 *                          several such stores apart gives each a folder of
 *                          its own (a shard server: path/shard-K[-K2...],
 *                          emb_served_checkpoint_dir).
 *   EMB_CKPT_SHARD_FOLDERS path/shard-K for each shard the store holds and
 *                          nothing else, so stores of other shards may write
 *                          beside it under the same path: the shard store (a
 *                          RocksDB checkpoint per hosted shard) and the
 *                          remote store (each server writes its shards'
 *                          folders under path on its own file system).
 *   EMB_CKPT_NONE          nothing: checkpoint and restore are refused
 *                          (SR_EUNSUPPORTED): the routed store. */
typedef enum emb_ckpt_layout {
  EMB_CKPT_NONE = 0,
  EMB_CKPT_TABLE_FILES,
  EMB_CKPT_SHARD_FOLDERS,
} emb_ckpt_layout;

/* The operations. Every one returns 0 or a negative SR_E* status with the
 * reason in errmsg (a refused call changes no row), unless it says
 * otherwise.
 *
 * Threads: no store is thread-safe. One thread at a time may call a store
 * (rpc_service holds its lock around every call); different stores are
 * independent and may be used from different threads at once (colocated
 * shards run one store per server thread).
 *
 * Lookups: at most one is outstanding. lookup_begin starts one and
 * lookup_wait finishes it, returning its status. The in-process stores
 * (local, shard, routed) do the whole lookup in lookup_begin: the rows are
 * in out when it returns and lookup_wait returns the status lookup_begin
 * returned. The remote store sends the calls and returns; lookup_wait
 * collects the answers into out. lookup_begin called again before
 * lookup_wait is allowed: the outstanding lookup is finished first and its
 * status dropped (remote store: its answers are awaited and discarded, so
 * its out is left partly or wholly unwritten; in-process stores: its rows
 * were written already), then the new one starts; the next lookup_wait is
 * the new one's. lookup_wait with none outstanding returns the last
 * lookup's status (0 before any). push, flush, stats, checkpoint and
 * restore may be called while a lookup is outstanding (the remote store
 * keeps it in flight on a queue of its own: the prefetch of the next
 * step's rows while this step's push runs). */
typedef struct emb_store_ops {
  emb_store_kind kind;
  emb_ckpt_layout ckpt_layout;
  /* Start fetching every row of ids; row r of table t lands in
   * out[t][r*dim .. (r+1)*dim). out is the caller's, alive until
   * lookup_wait. Ids out of a bounded table's range or an id set of
   * another table count are refused (SR_ERANGE, SR_EINVAL). */
  int (*lookup_begin)(emb_store *s, int64_t step, const emb_idset *ids, float *const *out);
  /* Finish the outstanding lookup (see above); its status. */
  int (*lookup_wait)(emb_store *s);
  /* Look-ahead (NULL: the store ignores it, as the local and routed stores
   * do). Hands the store the unique ids of a later step, so that it can
   * bring their rows near (the shard store reads its misses from RocksDB
   * and pins them; the remote store sends the step's Lookups early) while
   * the steps before it run. Steps are handed in increasing order, each
   * above every step looked up or pushed so far; several may be ahead at
   * once (the trainer's --prefetch-depth). The store copies what it needs:
   * ids need not outlive the call.
   * Exact: a prefetch changes no value. The lookup of step returns the bits
   * it would have returned without the prefetch, whatever pushes of
   * earlier steps, evictions, flushes and checkpoints come in between; a
   * restore drops everything prefetched. That lookup may ask for ids that
   * were not prefetched (they are read then); rows prefetched for a step
   * are released by that step's push, or by the lookup or push of any
   * later step (a step that is never pushed, a test pass, leaks nothing).
   * Returns 0, or SR_EINVAL / SR_ERANGE for ids the lookup would refuse
   * (nothing prefetched); a failure to read is reported by that step's
   * lookup.
   * Rewind: after a restore the order starts afresh (a job rewound to a
   * checkpoint hands and looks up steps from the checkpoint's on, below
   * steps handed before it); the restore is the only "drop" there is. */
  int (*prefetch)(emb_store *s, int64_t step, const emb_idset *ids);
  /* Lookup without a copy (NULL: not offered; only the shard store offers
   * it, the local, remote and routed stores keep lookup_begin's gather).
   * Every row of ids is made resident as lookup_begin does (the same
   * misses, init values and counters: the bits are lookup_begin's) and
   * rows[t][r] (the caller's arrays, counts[t] entries each) gets a pointer
   * to row r of table t (dim floats) in the store's memory, pinned for the
   * answer: until the pins are released, nothing the store does (a push,
   * an eviction, a flush, a checkpoint, a restore) changes those bytes. A
   * push to a pinned row writes a copy of it (the lookups after see the
   * push; the pinned bytes stay as they were); eviction skips pinned rows
   * and never waits for them. *pins gets the handle to give to
   * pins_release, once, from any thread, without the store's caller's lock
   * (it may even come after destroy, which leaves the pinned memory to the
   * last release). SR_ESTATE with nothing pinned when pinning the rows
   * would leave the cache too few free slots (the caller gathers them with
   * lookup_begin instead); other failures as lookup_begin's. */
  int (*lookup_pinned)(emb_store *s, int64_t step, const emb_idset *ids,
                       const float **const *rows, struct emb_pins **pins);
  void (*pins_release)(struct emb_pins *pins); /* NULL-safe; any thread */
  /* Seconds the last lookup (as of its lookup_wait) was in flight: from when
   * the store began its requests (for a step handed ahead, when they went
   * out: at its prefetch, or once the push they must follow was answered)
   * to when its rows were in hand. Beside the time the caller waited in
   * lookup_begin and lookup_wait, it says how much of the lookup was hidden
   * behind other work. NULL where a lookup is done inside those calls
   * (nothing of it is in flight between them). */
  double (*lookup_flight)(emb_store *s);
  /* Apply step's summed row gradients: grads[t][r*dim..] is the gradient of
   * row ids->ids[t][r], at any address (a server hands a request's bytes,
   * hence emb_grad, embedding/optim.h). lr is the step's
   * learning rate. Where each row lives, its optimizer runs once (a row
   * never pushed starts from its init value). The remote store sends every
   * server its part and returns once each has answered (with several ranks
   * a server may hold the push until every rank's is in). */
  int (*push)(emb_store *s, int64_t step, float lr, const emb_idset *ids,
              const emb_grad *const *grads);
  /* push in two halves (NULL: the store has none, and push_begin is push):
   * push_begin checks and sends the push, the caller's ids and grads no
   * longer needed when it returns, and push_wait awaits the answers and
   * returns the push's status (what push would have returned). Between
   * them the caller computes (the dense backward's bottom MLP and update)
   * while the servers apply the rows; it calls nothing else on the store.
   * A push_begin that fails sends nothing: no push_wait follows it. The
   * remote store has them. */
  int (*push_begin)(emb_store *s, int64_t step, float lr, const emb_idset *ids,
                    const emb_grad *const *grads);
  int (*push_wait)(emb_store *s);
  /* Hand every update to the store's durable tier, where it has one: the
   * shard store writes its dirty rows and its write buffers to RocksDB as
   * ingested SST files, durable when flush returns (storage/kv.h
   * kv_ingest); the others return 0. */
  int (*flush)(emb_store *s);
  /* Write every row held under the folder path (created if missing; the
   * layout is ckpt_layout's, above); a failure may leave part of it
   * written. The shard store writes its dirty rows back first. */
  int (*checkpoint)(emb_store *s, const char *path);
  /* Replace every row held with the ones checkpoint wrote under path
   * (same layout; another plan of the same model, i.e. another placement,
   * restores: the rows are matched by table_id and row id). Every file is
   * checked before any row is replaced: on failure the rows are as they
   * were (shard store: the databases are copied beside the live ones and
   * swapped in by renames, so a failed copy or open leaves them; only if
   * the old ones cannot be opened again does every later call return
   * SR_EIO until a restore succeeds). from_model_fp (NULL: this plan's model): the model fingerprint
   * of a smaller plan this one grows, under which the rows were written
   * (emb_store_restore_grown). */
  int (*restore)(emb_store *s, const char *path, const char *from_model_fp);
  /* Counters (see emb_store_stats); the remote store asks every server. */
  int (*stats)(emb_store *s, emb_store_stats *out);
  /* The row cache's and cold tier's figures (see emb_store_figures; NULL:
   * the store has neither, as the local, remote and routed stores). */
  int (*figures)(emb_store *s, emb_store_figures *out);
  /* 1 when the store was opened on rows that were not stopped cleanly (a
   * crash: they may hold a push applied in part) and has neither restored
   * a checkpoint nor been told to take them as they are since, else 0 (the
   * shard store: emb_shard_unclean, emb_shard_accept_unclean; NULL: never,
   * as the stores whose rows start from nothing or a checkpoint). */
  int (*unclean)(const emb_store *s);
  /* Incremental checkpoints (NULL: the store has none; the wrappers say
   * SR_EUNSUPPORTED). The store knows, without a scan, which rows a push
   * changed since its last checkpoint, checkpoint_delta or restore of any
   * kind (its change set, cleared by each of them when it succeeds).
   * checkpoint_delta writes only those rows, with their optimizer state,
   * under the folder path, as table files (table-<id>.bin, embedding/
   * table_file.h: each holding the table's changed rows in ascending row
   * id; servers: under their per-server folder, as in-memory servers write
   * a full checkpoint); its cost is in proportion to the changed rows.
   * restore_delta lays such a folder over the rows held: each row it holds
   * replaces the held one, every other row stays; every file is checked
   * before any row is replaced. A store with remove also records the rows
   * removed since (those not pushed again), per table, as
   * removed-<table_id>.bin beside the table file (embedding/removed_file.h);
   * restore_delta deletes them before it lays the rows. */
  int (*checkpoint_delta)(emb_store *s, const char *path);
  int (*restore_delta)(emb_store *s, const char *path);
  /* Remove rows (NULL: the store has none; the wrapper says
   * SR_EUNSUPPORTED): every row of ids the store holds goes, value and
   * optimizer state, as if it had never been pushed (a later lookup reads
   * its init value, a later push starts from it); ids it does not hold are
   * skipped. step is the step after whose push the rows go (the trainer's
   * step-boundary decisions, train/keep.h); a lookup of a later step handed
   * ahead before the removal still reads the row as removed. Ids are
   * checked as lookup's (nothing removed on a refusal). A store with a
   * change set lists the rows it removes for the next checkpoint_delta.
   * A removal that fails part way (the shard store: a database's delete
   * failed after others' went through) leaves each row either removed
   * (everywhere: storage, cache, change set) or as it was, and says which
   * in errmsg (the shard store: by shard); the same removal again
   * completes it. */
  int (*remove)(emb_store *s, int64_t step, const emb_idset *ids);
  /* Visit every stored row of table (plan index), in ascending row id
   * (local and shard stores; the remote and routed stores refuse with
   * SR_EUNSUPPORTED). A row never pushed is not stored. */
  int (*iterate)(emb_store *s, int table, emb_row_fn fn, void *ctx);
  /* The last failure's message (the store's own buffer, valid until the
   * next call on the store; "" when none yet). */
  const char *(*errmsg)(emb_store *s);
  /* Free everything (the shard store does not flush: flush first). */
  void (*destroy)(emb_store *s);
  /* lookup_begin, but an fp16 or bf16 table's row r lands in its own
   * bits: dim 16-bit values of its format at (uint16_t *)out[t] + r*dim
   * (an fp32 table's as floats, as lookup_begin); then lookup_wait. For
   * pooling that reads 16-bit rows (embedding/bag16.h). NULL: the store
   * converts (the in-process and remote stores have it). */
  int (*lookup_begin_rows16)(emb_store *s, int64_t step, const emb_idset *ids, void *const *out);
} emb_store_ops;

/* Every implementation begins with this header. */
struct emb_store {
  const emb_store_ops *ops;
  const emb_plan *plan; /* borrowed: outlives the store */
  /* 1: a row not held of a bounded table (emb_keep_on) reads zeros, not its
   * init value (emb_store_absent_zero); 0 (as created): its init value. */
  int absent_zero;
};

/* dim floats from src to dst: a store's copy of one row. The common dims
 * are fixed-size copies, which the compiler inlines instead of a memcpy
 * call per row. */
static inline void emb_row_copy(float *dst, const float *src, size_t dim) {
  switch (dim) {
    case 16: memcpy(dst, src, 16 * sizeof(float)); break;
    case 32: memcpy(dst, src, 32 * sizeof(float)); break;
    case 64: memcpy(dst, src, 64 * sizeof(float)); break;
    case 128: memcpy(dst, src, 128 * sizeof(float)); break;
    default: memcpy(dst, src, dim * sizeof(float));
  }
}

static inline emb_store_kind emb_store_kind_of(const emb_store *s) { return s->ops->kind; }
/* What checkpoint(path) writes under path (emb_ckpt_layout). */
static inline emb_ckpt_layout emb_store_checkpoint_layout(const emb_store *s) {
  return s->ops->ckpt_layout;
}
static inline int emb_store_lookup_begin(emb_store *s, int64_t step, const emb_idset *ids,
                                         float *const *out) {
  return s->ops->lookup_begin(s, step, ids, out);
}
static inline int emb_store_lookup_wait(emb_store *s) { return s->ops->lookup_wait(s); }
/* 1 when s's lookups can hand 16-bit rows as they are (lookup_begin_rows16). */
static inline int emb_store_has_rows16(const emb_store *s) { return s->ops->lookup_begin_rows16 != NULL; }
static inline int emb_store_lookup_begin_rows16(emb_store *s, int64_t step, const emb_idset *ids,
                                                void *const *out) {
  return s->ops->lookup_begin_rows16(s, step, ids, out);
}
/* The look-ahead op (see emb_store_ops.prefetch); 0 where the store has none. */
static inline int emb_store_prefetch(emb_store *s, int64_t step, const emb_idset *ids) {
  return s->ops->prefetch ? s->ops->prefetch(s, step, ids) : 0;
}
/* The last lookup's time in flight (see emb_store_ops.lookup_flight); 0 where
 * the store does not measure one. */
static inline double emb_store_lookup_flight(emb_store *s) {
  return s->ops->lookup_flight ? s->ops->lookup_flight(s) : 0;
}
static inline int emb_store_push(emb_store *s, int64_t step, float lr, const emb_idset *ids,
                                 const emb_grad *const *grads) {
  return s->ops->push(s, step, lr, ids, grads);
}
/* The push's halves (see emb_store_ops.push_begin): a store without them
 * pushes in emb_store_push_begin and its emb_store_push_wait returns 0. */
static inline int emb_store_push_begin(emb_store *s, int64_t step, float lr,
                                       const emb_idset *ids, const emb_grad *const *grads) {
  return (s->ops->push_begin ? s->ops->push_begin : s->ops->push)(s, step, lr, ids, grads);
}
static inline int emb_store_push_wait(emb_store *s) {
  return s->ops->push_wait ? s->ops->push_wait(s) : 0;
}
static inline int emb_store_flush(emb_store *s) { return s->ops->flush(s); }
static inline int emb_store_checkpoint(emb_store *s, const char *path) {
  return s->ops->checkpoint(s, path);
}
/* The incremental ops (see emb_store_ops.checkpoint_delta); SR_EUNSUPPORTED
 * where the store has none. */
static inline int emb_store_checkpoint_delta(emb_store *s, const char *path) {
  return s->ops->checkpoint_delta ? s->ops->checkpoint_delta(s, path) : SR_EUNSUPPORTED;
}
static inline int emb_store_restore_delta(emb_store *s, const char *path) {
  return s->ops->restore_delta ? s->ops->restore_delta(s, path) : SR_EUNSUPPORTED;
}
/* The remove op (see emb_store_ops.remove); SR_EUNSUPPORTED where the store
 * has none. */
static inline int emb_store_remove(emb_store *s, int64_t step, const emb_idset *ids) {
  return s->ops->remove ? s->ops->remove(s, step, ids) : SR_EUNSUPPORTED;
}
static inline int emb_store_restore(emb_store *s, const char *path) {
  return s->ops->restore(s, path, NULL);
}
/* restore of rows a checkpoint wrote under a plan the store's plan grows
 * (emb_plan_grows, checked by the caller), model fingerprint model_fp: its
 * rows keep their ids and values, the rows past its tables are
 * never-written rows. Stores that record no fingerprint with their rows
 * (shard, remote: the servers check their own) restore as usual. */
static inline int emb_store_restore_grown(emb_store *s, const char *path, const char *model_fp) {
  return s->ops->restore(s, path, model_fp);
}
static inline int emb_store_stats_get(emb_store *s, emb_store_stats *out) {
  return s->ops->stats(s, out);
}
/* The figures op (see emb_store_ops.figures); SR_EUNSUPPORTED, *out
 * untouched, where the store has none. */
static inline int emb_store_figures_get(emb_store *s, emb_store_figures *out) {
  return s->ops->figures ? s->ops->figures(s, out) : SR_EUNSUPPORTED;
}
/* The unclean query (see emb_store_ops.unclean); 0 where the store has none. */
static inline int emb_store_unclean(const emb_store *s) {
  return s->ops->unclean ? s->ops->unclean(s) : 0;
}
static inline int emb_store_iterate(emb_store *s, int table, emb_row_fn fn, void *ctx) {
  return s->ops->iterate(s, table, fn, ctx);
}
static inline const char *emb_store_errmsg(emb_store *s) { return s->ops->errmsg(s); }
/* Scoring a model with bounded tables: from now on a lookup of a row the
 * store does not hold, in a table with bounds (emb_keep_on), reads zeros
 * (the in-process and shard stores), as training read an id without a row
 * (train/keep.h): the rows a checkpoint of such a table holds are exactly
 * its admitted ids. The checkpoint store sets it (predict, eval, serve
 * --checkpoint); a training store never does (the trainer zeroes the ids
 * it has not admitted, and an admitted id's first lookup reads its init
 * value). Only a store nothing pushes to is so (the shard store would
 * start a pushed row from what its lookup read). */
static inline void emb_store_absent_zero(emb_store *s) { s->absent_zero = 1; }
/* What a lookup of a row not held reads (see emb_store_absent_zero): its
 * init value, or zeros. */
static inline void emb_store_absent_row(const emb_store *s, int table, uint64_t row_id,
                                        float *out) {
  if (s->absent_zero && emb_keep_on(&s->plan->tables[table]))
    for (int j = 0; j < s->plan->tables[table].dim; j++) out[j] = 0.0f;
  else
    emb_row_init(s->plan, table, row_id, out);
}
/* NULL-safe. */
static inline void emb_store_destroy(emb_store *s) {
  if (s) s->ops->destroy(s);
}

/* The in-process store: every row in memory, all shards of the plan hosted
 * here. plan is borrowed and must outlive the store. Returns NULL and writes
 * a message to err on failure. */
emb_store *emb_store_create_local(const emb_plan *plan, char *err, size_t errlen);

#endif
