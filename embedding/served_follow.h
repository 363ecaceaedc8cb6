/* A served checkpoint that follows its folder (shardrec serve --checkpoint
 * DIR --follow): each new complete checkpoint under DIR, full or
 * incremental, is checked, prepared beside the served rows and swapped in
 * whole, oldest first (every server of one folder passes through the same
 * steps); the steps served before stay answerable for a grace period.
 *
 * Versions without a second copy. The served rows live in one in-memory
 * store (emb_served's, the local store). A swap to step S:
 *   1. outside any lock: S's manifest (its step, plan and data transform
 *      against the served ones), DONE, chain and every file of each link
 *      past the served step are verified (a damaged or half-written
 *      checkpoint is refused, never read into the store); the rows that
 *      change are gathered: the rows of S's increments past the served
 *      step and the rows they removed (removed-<id>.bin), or for a chain
 *      that does not hold the served step (a new full checkpoint) the rows
 *      of its full checkpoint whose values differ from the served ones
 *      (compared in chunks of 4096, each under the caller's exclusive
 *      section) and, of a bounded table, the served rows it does not hold
 *      (removed), with its increments laid over. One increment is laid
 *      from its own folder; anything else from a temporary folder of table
 *      files and removed-rows files holding them all;
 *   2. inside one exclusive section (no Lookup between its pick and its
 *      answer, rpc_service_exclusive): the old values of exactly those
 *      rows are copied into an undo set, the folder is laid over the store
 *      (emb_store_restore_delta: every file checked before any row is
 *      replaced) and S becomes the served step.
 * So memory grows by the changed rows (the rows being laid, and one undo
 * set per step held), never by the tables; a full checkpoint whose rows
 * mostly changed costs as many rows. A Lookup of a held step reads the
 * store and lays the undo sets over its rows, newest first, down to that
 * step (emb_follow_patch).
 *
 * A checkpoint is refused (logged by the caller, counted by reason, never
 * served; the served one stays) when it is incomplete (a step-N with no
 * DONE for a second), damaged (manifest, DONE, a chain link, a file's size
 * or SHA-256, a manifest step other than the folder's), of another plan
 * (table sizes, dims, placement, seed: another plan fingerprint) or data
 * mapping (another transform fingerprint), in a layout other than the
 * trainer's table files, or when it lacks rows the served one holds (of
 * a table without bounds: a bounded table's rows it lacks were removed). A
 * refused checkpoint is not looked at again unless its DONE changes. */
#ifndef SHARDREC_EMBEDDING_SERVED_FOLLOW_H
#define SHARDREC_EMBEDDING_SERVED_FOLLOW_H

#include <stddef.h>
#include <stdint.h>

#include "embedding/served.h"
#include "embedding/store.h"

typedef enum emb_follow_reason {
  EMB_FOLLOW_INCOMPLETE = 0, /* "incomplete": a step-N folder without DONE */
  EMB_FOLLOW_DAMAGED,        /* "damaged": a manifest, DONE, link or file check failed */
  EMB_FOLLOW_PLAN,           /* "plan": another plan fingerprint than the served one */
  EMB_FOLLOW_TRANSFORM,      /* "transform": another data transform than the served one */
  EMB_FOLLOW_LAYOUT,         /* "layout": rows not in the trainer's table files */
  EMB_FOLLOW_ROWS,           /* "rows": rows the served checkpoint holds are missing */
  EMB_FOLLOW_FAILED,         /* "failed": reading or laying the rows failed (I/O, memory) */
  EMB_FOLLOW_N_REASONS
} emb_follow_reason;

/* "incomplete", "damaged", ... (above). */
const char *emb_follow_reason_name(emb_follow_reason r);

typedef struct emb_follow_opts {
  const char *root;    /* the folder of step-N checkpoints followed (borrowed) */
  double grace_s;      /* how long a step stays answerable after it stopped being served */
  int64_t swap_at;     /* >= 0: serve nothing newer until step swap_at is complete, swap
                          to it, then follow on; -1: follow every new checkpoint */
  /* Run fn(arg) exclusively of every Lookup (rpc_service_exclusive). */
  void (*exclusive)(void *ctx, void (*fn)(void *arg), void *arg);
  void *exclusive_ctx;
} emb_follow_opts;

typedef struct emb_follow emb_follow;

/* Follow o->root from the checkpoint sv serves (borrowed, outliving f; its
 * rows must be one in-memory store of table files). NULL with the reason
 * in err. */
emb_follow *emb_follow_create(emb_served *sv, const emb_follow_opts *o, char *err,
                              size_t errlen);
void emb_follow_destroy(emb_follow *f); /* NULL-safe */

/* What one look at the folder did. */
typedef struct emb_follow_event {
  enum { EMB_FOLLOW_NOTHING = 0, EMB_FOLLOW_SWAPPED, EMB_FOLLOW_REFUSED } what;
  int64_t step;             /* the checkpoint's step */
  int64_t from_step;        /* swapped: the step served before */
  char dir[4096];           /* its folder */
  emb_follow_reason reason; /* refused: why, and msg in words */
  char msg[1024];
  int incremental;          /* swapped: the checkpoint is an increment */
  uint64_t rows_changed;    /* swapped: rows whose value changed (laid over the store) */
  uint64_t rows_held;       /* swapped: rows the store holds after it */
  double prepare_s;         /* swapped: verifying and gathering, outside the section */
  double swap_s;            /* swapped: time inside the exclusive section */
} emb_follow_event;

/* Look at the folder once: the oldest complete checkpoint above the served
 * step (or swap_at, above) that was not refused before is checked,
 * prepared and swapped to (EMB_FOLLOW_SWAPPED) or refused; else a step-N
 * without DONE above the served step, not reported before, is reported
 * refused "incomplete" (it is served once complete); else nothing. Held
 * steps are dropped here once their grace has passed. Call again until it
 * says nothing. From one thread. */
void emb_follow_poll(emb_follow *f, emb_follow_event *ev);

/* Hold at the served step (into *served) until step's checkpoint is
 * complete, then swap to it and follow on: swap_at's meaning, from now on.
 * EMB_FOLLOW_SERVED, or EMB_FOLLOW_GONE (step is not above the served one)
 * with the reason in msg. Any thread. */
int emb_follow_swap_at(emb_follow *f, int64_t step, int64_t *served, char *msg, size_t len);

/* The served step, and the time (seconds since the epoch) its checkpoint
 * completed (its DONE file's modification time). Any thread. */
int64_t emb_follow_step(const emb_follow *f);
double emb_follow_completed(const emb_follow *f);

/* The rows the follower itself read through the store's lookups (to
 * compare a full checkpoint, to keep the rows an increment replaces) and
 * how many of them were hits: the store's counts less these are its
 * clients'. Read under the exclusive section. */
void emb_follow_own_reads(const emb_follow *f, uint64_t *rows, uint64_t *hits);

/* What emb_follow_pick says of a step asked for. */
enum {
  EMB_FOLLOW_SERVED = 0, /* answered from *step */
  EMB_FOLLOW_AHEAD,      /* newer than the served step (not swapped to yet) */
  EMB_FOLLOW_GONE,       /* older than every step held */
};

/* The step a Lookup is answered from (rpc_service_versions.pick, less the
 * status: the caller maps the answer above to one), the reason in msg; and
 * the rows of that step laid over the served ones (.patch). ctx is f;
 * under the exclusive section's lock. */
int emb_follow_pick(void *f, int64_t asked, int step_asked, int64_t *step, char *msg,
                    size_t len);
void emb_follow_patch(void *f, int64_t step, const emb_idset *set, float *const *out);

#endif
