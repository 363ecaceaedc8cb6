/* Bounded tables: admission, expiry and capacity (the plan's "keep",
 * embedding/plan.h), decided at step boundaries from the steps' batches.
 *
 * The trainer keeps, per table with a bound, an entry per id it counts:
 * the samples that held it (count), the last step whose batch held it
 * (last) and whether it has a row (admitted). Everything is a function of
 * the sequence of global batches alone: every rank of a data-parallel job
 * reads the same global batch, and neither shards, placement, threads,
 * look-ahead nor hosts enter, so the same ids are admitted, expired and
 * evicted whatever runs the job.
 *
 * Step s, before its lookup (keep_observe, the global batch of s): each id
 * of the batch adds the samples holding it to its count, last = s; an id
 * without a row whose count reaches admit_after is admitted and gets its
 * row in this step (its lookup reads the init value, its push stores it),
 * so every admitted id has a stored row from the end of its first step on.
 * An id not admitted reads zeros and its gradient is dropped (the trainer
 * looks it up with the rest and zeroes it; its row is never pushed).
 * After the step's push (keep_decide): a count still under admit_after
 * whose id was not seen for admit_window steps is forgotten; an admitted id
 * whose last <= s - expire_after is expired; then, while more than capacity
 * ids are admitted, the lowest-scored one is evicted: lru, the oldest last;
 * lfu, the smallest count, then the oldest last; ties by row id (each
 * table decides alone, so (table id, row id) orders every tie). A removed
 * id's entry goes with its row: seen again, it counts from zero.
 *
 * The entries are part of a checkpoint (keep_save / keep_load, the file
 * KEEP_FILE beside dense.bin). Memory: about 48 bytes an entry, admitted
 * ids bounded by capacity (or by expiry), counting ids by admit_window. */
#ifndef SHARDREC_TRAIN_KEEP_H
#define SHARDREC_TRAIN_KEEP_H

#include <stddef.h>
#include <stdint.h>

#include "datasets/batch.h"
#include "embedding/plan.h"
#include "embedding/store.h"

/* The file of a checkpoint that holds the entries. */
#define KEEP_FILE "keep.bin"

typedef struct keep keep;

/* A table's figures since the job began (kept in a checkpoint). */
typedef struct keep_table_stats {
  uint64_t admitted; /* ids given a row */
  uint64_t refused;  /* lookups (one a step an id) answered zeros: no row yet */
  uint64_t expired;  /* rows removed for not being looked up for expire_after steps */
  uint64_t evicted;  /* rows removed above capacity */
  uint64_t rows;     /* ids holding a row now */
  uint64_t counting; /* ids counted without a row now */
} keep_table_stats;

/* 1 when a table of plan has a bound (emb_keep_on). */
int keep_plan_on(const emb_plan *plan);

/* The entries of plan's bounded tables, empty (plan borrowed, outlives it).
 * NULL with the reason in err. */
keep *keep_create(const emb_plan *plan, char *err, size_t errlen);
void keep_destroy(keep *k); /* NULL-safe */

/* Step step's global batch b (see above). 0 or SR_ENOMEM (nothing counted). */
int keep_observe(keep *k, const ds_batch *b, int64_t step);

/* 1 when id of table (plan index) has a row: a table without a bound, or
 * an admitted id. */
int keep_has_row(const keep *k, int table, uint64_t id);

/* The decisions after step's push (see above): the ids whose rows go, per
 * table in ascending row id, into *out (owned by k, valid until the next
 * call). 0 or SR_ENOMEM (nothing decided). */
int keep_decide(keep *k, int64_t step, emb_idset *out);

/* Table's figures (plan index). */
keep_table_stats keep_stats(const keep *k, int table);

/* Write every entry and figure to path (common/outfile.h: a temporary file
 * renamed into place), with a magic, a version and a SHA-256 trailer. 0 or
 * SR_E* naming path. */
int keep_save(const keep *k, const char *path, char *err, size_t errlen);

/* Replace the entries with those keep_save wrote to path (checked whole
 * first: size, checksum, tables of this plan by table_id; a failure
 * changes nothing). 0 or SR_E* naming path and what was wrong. */
int keep_load(keep *k, const char *path, char *err, size_t errlen);

#endif
