/* The shard store's remove op (emb_store_ops.remove): every read and write
 * in flight is finished first (so no write-back of a removed row is still
 * pending and none is read), the rows are deleted from their databases,
 * one WriteBatch per database, and a removed row still in the cache is
 * reset there to its init value, clean: the slot keeps its prefetch pins,
 * so a later step handed ahead reads the row as removed, and whether it is
 * evicted or not, its next read is the init value. A slot an answer is
 * being sent from is left detached and the row gets a fresh slot, as a
 * push does (shard_impl.h); every cached removed row is made clean before
 * the first reset, since taking that fresh slot may evict another removed
 * row not reset yet, which a write-back would bring back. The removed ids
 * leave the change set and are listed for the next checkpoint_delta
 * (shard__chg_removed; the room for them taken before anything is
 * deleted).
 *
 * The databases are written one after the other: a delete that fails in
 * database d leaves the rows of the databases before it removed (deleted,
 * reset in the cache, recorded) and those of d and after untouched, and
 * the message names both sets of shards; the same removal again
 * completes it (a row not held is skipped). */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "embedding/optim.h"
#include "embedding/shard_impl.h"

/* Deletes of ids' rows of database d into w. */
static void delete_rows(shstore *s, const emb_idset *ids, int d, kv_writes *w) {
  for (int t = 0; t < ids->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++)
      if (db_of(s, t, ids->ids[t][r]) == d) kv_writes_delete(w, s->db[d], t, ids->ids[t][r]);
}

/* The cached row of (t, id), if any, made clean: never written back. */
static void forget_dirty(shstore *s, uint32_t t, uint64_t id) {
  size_t h = probe(s, key_tag(t, id), t, id);
  if (s->map[h].slot1) slot_meta(s, s->map[h].slot1 - 1)->flags &= (uint16_t)~F_DIRTY;
}

/* The cached row of (t, id), if any, reset to its init value, clean. */
static void reset_cached(shstore *s, uint32_t t, uint64_t id) {
  const emb_plan *plan = s->base.plan;
  uint32_t tag = key_tag(t, id);
  size_t h = probe(s, tag, t, id);
  if (!s->map[h].slot1) return;
  uint32_t x = s->map[h].slot1 - 1;
  if (slot_sent(s, x)) {
    uint32_t y = shard__slot_alloc(s);
    memcpy(slot_meta(s, y), slot_meta(s, x), sizeof(sh_meta));
    slot_meta(s, y)->pins = 0;
    s->map[probe(s, tag, t, id)].slot1 = y + 1; /* after the eviction's shifts */
    slot_meta(s, x)->flags = F_DETACHED;
    x = y;
  }
  float row[2 * EMB_MAX_DIM + 1];
  emb_row_init(plan, (int)t, id, row);
  emb_optim_state_init(&plan->tables[t].optim, s->dim[t], row + s->dim[t]);
  slot_put(s, x, t, row);
  slot_meta(s, x)->flags &= (uint16_t)~(F_DIRTY | F_FAILED);
}

/* The message of a removal whose delete from database d failed (e2):
 * the shards whose rows went and those whose rows are kept. */
static void partial_err(shstore *s, int d, const char *e2) {
  char done[256] = "none", kept[256] = "";
  size_t a = 0, k = 0;
  for (int x = 0; x < s->n_db; x++) {
    char *out = x < d ? done : kept;
    size_t *at = x < d ? &a : &k;
    if (*at < 200) *at += (size_t)snprintf(out + *at, 256 - *at, "%s%d", *at ? " " : "", s->db_shard[x]);
  }
  sr_fmt(s->err, sizeof s->err,
         "remove: shard %d: %s; the rows of shards %s were removed, those of shards %s kept "
         "(a removal of the same ids again completes it)",
         s->db_shard[d], e2, done, kept);
}

/* The rows of ids in databases below upto (deleted from RocksDB) taken out
 * of the cache and recorded as removed. */
static void removed_rows(shstore *s, const emb_idset *ids, int upto) {
  /* Every cached removed row clean before any is reset: a reset that
   * takes a fresh slot may evict another removed row, which must go
   * without being written back over its delete. */
  for (int t = 0; t < ids->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++)
      if (db_of(s, t, ids->ids[t][r]) < upto) forget_dirty(s, (uint32_t)t, ids->ids[t][r]);
  for (int t = 0; t < ids->n_tables; t++)
    for (size_t r = 0; r < ids->counts[t]; r++)
      if (db_of(s, t, ids->ids[t][r]) < upto) reset_cached(s, (uint32_t)t, ids->ids[t][r]);
  shard__chg_removed(s, ids, upto);
  if (upto > 0) s->removed = 1; /* the clean stop compacts their space away */
}

int shard__remove(emb_store *b, int64_t step, const emb_idset *ids) {
  (void)step;
  shstore *s = (shstore *)b;
  int rc = shard__check_ids(s, ids, "remove");
  if (rc) return rc;
  /* The removals skip the write-ahead log: until the memtables are
   * flushed only the missing marks tell a crash that they were lost. */
  if (s->marked && (rc = shard__marks_remove(s))) return rc;
  if ((rc = shard__chg_remove_reserve(s, ids))) return rc;
  shard__drain(s);
  if (s->wb_rc) {
    sr_fmt(s->err, sizeof s->err, "remove: %s", s->wb_err);
    return s->wb_rc;
  }
  kv_writes *w = kv_writes_create();
  if (!w) {
    sr_fmt(s->err, sizeof s->err, "remove: out of memory");
    return SR_ENOMEM;
  }
  char e2[512];
  int d = 0;
  for (; d < s->n_db && !rc; d++) {
    delete_rows(s, ids, d, w);
    if ((rc = kv_writes_commit(w, s->db[d], e2, sizeof e2))) break;
  }
  kv_writes_destroy(w);
  removed_rows(s, ids, d); /* the databases whose deletes went through */
  if (rc) partial_err(s, d, e2);
  return rc;
}
