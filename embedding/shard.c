/* The shard store: a bounded row cache over RocksDB (see shard.h); its ops.
 *
 * Here: the ops table and what is none of the other files' job: create and
 * destroy, lookup (hits copied in a software-pipelined pass over the map,
 * the rest made resident chunk by chunk by shard_cache.c), push (applied
 * whole or not at all, its rows added to the change set; a push of more
 * than a chunk that fails after applying part of itself leaves the store
 * refusing every call until a restore),
 * flush, checkpoint, stats, iterate, the clean-stop marks and the
 * counters. The internals, their
 * invariants and the other files' jobs: shard_impl.h. */
#include "embedding/shard_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/status.h"
#include "common/sys.h"
#include "embedding/optim.h"
#include "storage/ckpt_dir.h"
#include "storage/kv.h"

#define SH_PASS 256 /* ids per lookup pass */
#define SH_AHEAD 16 /* ids between the stages of a lookup pass */

/* The ids of an op (what) against the plan: a list per table, each id in
 * its table's range. */
int shard__check_ids(shstore *s, const emb_idset *ids, const char *what) {
  if (!ids || ids->n_tables != s->n_tables || (s->n_tables && (!ids->ids || !ids->counts))) {
    sr_fmt(s->err, sizeof s->err, "%s: id set has %d tables, the plan has %d", what,
           ids ? ids->n_tables : -1, s->n_tables);
    return SR_EINVAL;
  }
  for (int t = 0; t < s->n_tables; t++)
    if (emb_plan_check_range(s->base.plan, t, ids->ids[t], ids->counts[t], what, s->err,
                             sizeof s->err))
      return SR_ERANGE;
  return 0;
}

/* A failed write-back into s->err (its rows are lost): its code, or 0. */
int shard__wb_failed(shstore *s) {
  if (s->wb_rc) memcpy(s->err, s->wb_err, sizeof s->err);
  return s->wb_rc;
}

/* Common start of a lookup or push of step: finished work reaped, a failed
 * write-back reported, earlier steps' prefetch pins dropped. A write set
 * that fails during the call fails the call too (shard__wb_failed at its
 * end): its rows left the pending index, and a read of one after that saw
 * RocksDB's older value. */
int shard__call_begin(shstore *s, int64_t step) {
  shard__reap(s);
  shard__prefetch_release(s, step, 0);
  return shard__wb_failed(s);
}

typedef struct {
  float *const *out;
} lookup_ctx;

static void lookup_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  lookup_ctx *c = vctx;
  for (size_t i = 0; i < n; i++) {
    uint32_t t = s->it_t[i];
    size_t dim = (size_t)s->dim[t];
    slot_get(s, s->it_slot[i], t, c->out[t] + it_r[i] * dim, 0);
  }
}

typedef struct {
  int64_t step;
  float lr;
  const emb_grad *const *grads;
  int bad_t;           /* one pass: -1, or the table of the row whose outcome was not finite */
  uint64_t bad_id;
  size_t applied;      /* two passes: rows the second has updated */
} push_ctx;

/* Bytes of table t's row in a slot: 2 a 16-bit weight, 4 a float (no call
 * a row: the push's loop runs it for every row). */
static inline size_t slot_row_bytes(const shstore *s, uint32_t t) {
  return (sh_wprec(s, t) == KV_W_FP32 ? 4 : 2) * (size_t)s->dim[t] + 4 * (size_t)s->slen[t];
}

/* Item i's row updated where it lives (a 16-bit row as floats, then
 * stored): emb_optim_apply_at's verdict, 1 when the outcome is finite. */
static int row_update(shstore *s, size_t i, const size_t *it_r, const push_ctx *c) {
  uint32_t t = s->it_t[i];
  int dim = s->dim[t];
  float buf[2 * EMB_MAX_DIM + 1];
  const int in_place = sh_wprec(s, t) == KV_W_FP32; /* 16 bits: updated as floats, stored */
  float *row = in_place ? slot_row(s, s->it_slot[i]) : buf;
  if (!in_place) slot_get(s, s->it_slot[i], t, buf, 1);
  int ok = emb_optim_apply_at(s->base.plan, (int)t, s->it_id[i], c->step, c->lr,
                              c->grads[t] + it_r[i] * (size_t)dim, row, s->slen[t] ? row + dim : NULL);
  if (!in_place) slot_put(s, s->it_slot[i], t, buf);
  return ok;
}

/* The chunk's updated rows: dirty, and in the change set. */
static void rows_changed(shstore *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    slot_meta(s, s->it_slot[i])->flags |= F_DIRTY;
    shard__chg_add(s, s->it_t[i], s->it_id[i]);
  }
}

/* A push's second pass, every row checked by the first (check_act). */
static void push_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  push_ctx *c = vctx;
  for (size_t i = 0; i < n; i++) {
    if (s->sends) shard__slot_unshare(s, i);
    row_update(s, i, it_r, c);
  }
  rows_changed(s, n);
  c->applied += n;
}

/* A two-pass push whose second pass failed (rc, the reason in s->err)
 * after it had updated rows: those rows may be written back already, so
 * they cannot be put back, and a retry would apply them twice; the store
 * refuses every later call with this reason until a restore (s->wb_rc, as
 * a failed write-back). rc. */
static int push_failed_in_part(shstore *s, int64_t step, size_t applied, size_t total, int rc) {
  char why[sizeof s->err];
  memcpy(why, s->err, sizeof why);
  s->wb_rc = rc;
  sr_fmt(s->wb_err, sizeof s->wb_err,
         "push of step %lld failed after %zu of its %zu rows were updated (%s): the store "
         "refuses every call until a restore",
         (long long)step, applied, total, why);
  return shard__wb_failed(s);
}

/* A push of one chunk in one pass: each row's slot bytes kept in s->undo,
 * then the row updated; a row whose outcome is not finite puts back the
 * bytes of every row updated (itself included, the last first), so nothing
 * changed, as when check_act refuses it (the same verdict). */
static void push_undo_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  push_ctx *c = vctx;
  unsigned char *u = s->undo; /* each row's slot bytes before its update, in item order */
  for (size_t i = 0; i < n; i++) {
    if (s->sends) shard__slot_unshare(s, i); /* a row in an answer being sent: updated in a copy */
    const size_t rb = slot_row_bytes(s, s->it_t[i]);
    memcpy(u, slot_row(s, s->it_slot[i]), rb);
    u += rb;
    if (row_update(s, i, it_r, c)) continue;
    c->bad_t = (int)s->it_t[i];
    c->bad_id = s->it_id[i];
    for (size_t j = i + 1; j-- > 0;) { /* last updated first back */
      const size_t b = slot_row_bytes(s, s->it_t[j]);
      u -= b;
      memcpy(slot_row(s, s->it_slot[j]), u, b);
    }
    return;
  }
  rows_changed(s, n);
}

typedef struct {
  int64_t step;
  float lr;
  const emb_grad *const *grads;
  float *scratch;      /* [stride] */
  int bad_t;           /* -1, or the table of the first row that would turn non-finite */
  uint64_t bad_id;
} check_ctx;

/* A push's first pass: emb_optim_check_at on each row (resident and pinned),
 * nothing changed; the first row whose outcome is not finite is kept. */
static void check_act(shstore *s, size_t n, const size_t *it_r, void *vctx) {
  check_ctx *c = vctx;
  const emb_plan *plan = s->base.plan;
  for (size_t i = 0; i < n && c->bad_t < 0; i++) {
    uint32_t t = s->it_t[i];
    int dim = s->dim[t];
    float buf[2 * EMB_MAX_DIM + 1];
    const float *row = buf;
    if (sh_wprec(s, t) == KV_W_FP32) row = slot_row(s, s->it_slot[i]);
    else slot_get(s, s->it_slot[i], t, buf, 1);
    if (!emb_optim_check_at(plan, (int)t, s->it_id[i], c->step, c->lr,
                            c->grads[t] + it_r[i] * (size_t)dim, row, row + dim, c->scratch)) {
      c->bad_t = (int)t;
      c->bad_id = s->it_id[i];
    }
  }
}

/* Misses gathered by a lookup: resolved (read, insert) and copied out. */
static int lookup_flush_misses(shstore *s, size_t *nm, float *const *out) {
  if (!*nm) return 0;
  size_t *it_r = s->mitem + s->chunk;
  memcpy(s->it_t, s->ms_t, *nm * sizeof *s->it_t);
  memcpy(s->it_id, s->ms_id, *nm * sizeof *s->it_id);
  memcpy(it_r, s->ms_r, *nm * sizeof *it_r);
  uint64_t dummy = 0;
  lookup_ctx c = {out};
  int rc = shard__chunk_run(s, *nm, it_r, lookup_act, &c, &dummy);
  *nm = 0;
  return rc;
}

/* One pass of n <= SH_PASS ids of table t (out rows o): hits copied, the
 * rest (misses, rows being loaded or whose read failed) gathered for
 * lookup_flush_misses, in id order. Software-pipelined, SH_AHEAD ids
 * between the stages, so that memory is asked for well before it is used
 * and the lines in flight are the ones used next: id i + 2A's map entry is
 * prefetched, id i + A's first tag match found and its slot (header and
 * row) prefetched, id i's key checked and its row copied. The map and slab
 * are read through locals (stores to s's scratch would make the compiler
 * reload them from s). */
static uint64_t lookup_pass(shstore *s, uint32_t t, const uint64_t *id, size_t n, size_t base,
                            float *o, size_t *nm) {
  const size_t dim = (size_t)s->dim[t], row_end = sizeof(sh_meta) + dim * sizeof(float) - 1;
  const size_t mask = s->mask, sb = s->slot_bytes, a = SH_AHEAD;
  const sh_entry *map = s->map;
  unsigned char *slab = s->slab;
  uint32_t tag[SH_PASS], s1[SH_PASS];
  uint64_t hits = 0;
  for (size_t i = 0; i < n + 2 * a; i++) {
    if (i < n) {
      tag[i] = key_tag(t, id[i]);
      __builtin_prefetch(&map[tag[i] & mask], 0, 3);
    }
    if (i >= a && i - a < n) {
      size_t j = i - a, h = tag[j] & mask;
      while (map[h].slot1 && map[h].tag != tag[j]) h = (h + 1) & mask;
      if ((s1[j] = map[h].slot1)) {
        const unsigned char *m = slab + (size_t)(s1[j] - 1) * sb;
        __builtin_prefetch(m, 0, 3);
        __builtin_prefetch(m + row_end, 0, 3);
      }
    }
    if (i < 2 * a) continue;
    size_t j = i - 2 * a;
    sh_meta *m = s1[j] ? (sh_meta *)(slab + (size_t)(s1[j] - 1) * sb) : NULL;
    if (m && (m->key != id[j] || m->table != t)) { /* another key's tag: probe on */
      uint32_t e = map[probe(s, tag[j], t, id[j])].slot1;
      m = e ? slot_meta(s, e - 1) : NULL;
    }
    if (m && !(m->flags & (F_LOADING | F_FAILED))) {
      sh_lookup_use(m);
      if (sh_wprec(s, t) == KV_W_FP32)
        emb_row_copy(o + (base + j) * dim, (const float *)(m + 1), dim);
      else slot_get(s, (uint32_t)(((unsigned char *)m - slab) / sb), t, o + (base + j) * dim, 0);
      hits++;
    } else {
      s->ms_t[*nm] = t;
      s->ms_id[*nm] = id[j];
      s->ms_r[*nm] = base + j;
      (*nm)++;
    }
  }
  return hits;
}

/* Lookups take a lean path for hits (no pinning: a hit is copied out before
 * anything can evict it) and gather the rest for chunk_resolve. */
static int sh_lookup_begin(emb_store *b, int64_t step, const emb_idset *ids, float *const *out) {
  shstore *s = (shstore *)b;
  int rc = shard__check_ids(s, ids, "lookup");
  if (!rc) rc = shard__call_begin(s, step);
  if (rc) return s->last_lookup_rc = rc;
  uint64_t cpu0 = caller_cpu_mark(s);
  uint64_t hits = 0, total = 0;
  size_t nm = 0;
  const size_t pass = s->chunk < SH_PASS ? s->chunk : SH_PASS;
  for (int t = 0; t < s->n_tables && !rc; t++) {
    const size_t cnt = ids->counts[t];
    total += cnt;
    for (size_t base = 0; base < cnt && !rc; base += pass) {
      size_t n = cnt - base < pass ? cnt - base : pass;
      if (nm + n > s->chunk && (rc = lookup_flush_misses(s, &nm, out))) break;
      hits += lookup_pass(s, (uint32_t)t, ids->ids[t] + base, n, base, out[t], &nm);
    }
  }
  if (!rc) rc = lookup_flush_misses(s, &nm, out);
  if (!rc) rc = shard__wb_failed(s);
  s->ctr.caller_ns += caller_cpu_mark(s) - cpu0;
  if (!rc) {
    s->st.lookups += total;
    s->st.hits += hits;
  }
  return s->last_lookup_rc = rc;
}

static int sh_lookup_wait(emb_store *b) { return ((shstore *)b)->last_lookup_rc; }

static int sh_flush(emb_store *b);

/* ---- clean-stop marks: DIR/shard-K.clean, written at a clean stop ---- */

static int mark_path(const shstore *s, int k, char *out, size_t n) {
  char db[SR_PATH_MAX];
  if (ckpt_dir_shard_path(s->dir, s->db_shard[k], db, sizeof db)) return SR_ERANGE;
  return sr_path(out, n, "%s" EMB_SHARD_CLEAN_SUFFIX, db) ? SR_ERANGE : 0;
}

/* Remove every hosted shard's mark (the rows are about to change). */
int shard__marks_remove(shstore *s) {
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      return SR_ERANGE;
    }
    if (unlink(p) && errno != ENOENT) {
      sr_fmt(s->err, sizeof s->err, "%s: cannot remove: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  s->marked = 0;
  return sr_fsync_dir(s->dir) ? SR_EIO : 0;
}

/* Whether database k holds a row of any table. */
static int db_has_rows(shstore *s, int k) {
  int any = 0;
  for (int t = 0; t < s->n_tables && !any; t++) {
    kv_iter *it = kv_iter_create(s->db[k], t);
    any = !it || kv_iter_valid(it); /* cannot tell: count it as rows */
    kv_iter_destroy(it);
  }
  return any;
}

/* At open: a hosted shard with no mark whose database was there before
 * this open (existed[k]) or holds rows was not stopped cleanly. Rows alone
 * would miss a crash that lost every write: rows still in the write
 * buffers, and removals not yet flushed (no write-ahead log), go with the
 * process. Then every mark goes, before anything is written. */
static int marks_check(shstore *s, const uint8_t *existed) {
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      return SR_ERANGE;
    }
    if (!sr_is_file(p) && (existed[k] || db_has_rows(s, k))) s->unclean = 1;
  }
  return shard__marks_remove(s);
}

int emb_shard_mark_clean(emb_store *b) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  int rc = sh_flush(b);
  if (rc || s->unclean) return rc; /* a crash's rows stay unmarked until a restore */
  /* Write-backs are on disk once ingested (sh_flush), but removals and
   * delta rows skip the write-ahead log (kv_writes): on disk only once the
   * memtables are flushed, which the mark must follow. */
  for (int k = 0; k < s->n_db; k++)
    if ((rc = kv_flush(s->db[k], s->err, sizeof s->err))) return rc;
  /* Rows removed since the last compaction: their space back now (a
   * delete only adds a tombstone until compaction drops the old values). */
  for (int k = 0; k < s->n_db && s->removed; k++)
    if ((rc = kv_compact(s->db[k], s->err, sizeof s->err))) return rc;
  s->removed = 0;
  for (int k = 0; k < s->n_db; k++) {
    char p[SR_PATH_MAX];
    if (mark_path(s, k, p, sizeof p)) return SR_ERANGE;
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int ok = fd >= 0 && write(fd, "clean\n", 6) == 6 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok) {
      sr_fmt(s->err, sizeof s->err, "%s: cannot write: %s", p, strerror(errno));
      return SR_EIO;
    }
  }
  if (sr_fsync_dir(s->dir)) return SR_EIO;
  s->marked = 1;
  return 0;
}

int emb_shard_unclean(const emb_store *b) {
  return b && emb_store_kind_of(b) == EMB_STORE_SHARD && ((const shstore *)b)->unclean;
}

void emb_shard_accept_unclean(emb_store *b) {
  if (b && emb_store_kind_of(b) == EMB_STORE_SHARD) ((shstore *)b)->unclean = 0;
}

/* A push refused: table t's row id, whose update would not be finite. */
static int refuse_not_finite(shstore *s, int t, uint64_t id, float lr) {
  const emb_table *tb = &s->base.plan->tables[t];
  sr_fmt(s->err, sizeof s->err,
         "push: table %u (%s) row %llu: the update (learning rate %g) would leave the row or "
         "its optimizer state non-finite; nothing applied",
         tb->table_id, tb->name, (unsigned long long)id, (double)lr);
  return SR_ERANGE;
}

/* Applied whole or not at all. A push of at most a chunk of rows whose
 * bytes fit EMB_SHARD_UNDO_BYTES is made resident once and applied in one
 * pass that can put its rows back (push_undo_act). A larger one is checked
 * whole first (check_act; the check brings rows into the cache, which
 * changes no value), since rows of its first chunks may be evicted, and
 * written back, while the next are brought in. Its second pass brings
 * each chunk in again: a read or an allocation that fails there after a
 * chunk was applied cannot be undone, and leaves the store refusing every
 * call until a restore (push_failed_in_part). */
static int push_apply(shstore *s, int64_t step, float lr, const emb_idset *ids,
                      const emb_grad *const *grads) {
  int rc = shard__check_ids(s, ids, "push");
  if (rc) return rc;
  if (s->marked && (rc = shard__marks_remove(s))) return rc;
  if (!emb_optim_lr_ok(lr)) {
    sr_fmt(s->err, sizeof s->err, "push: learning rate %g is outside [0, %g]", (double)lr,
           EMB_OPTIM_MAX_LR);
    return SR_ERANGE;
  }
  uint64_t hits = 0;
  size_t total = 0;
  for (int t = 0; t < s->n_tables; t++) total += ids->counts[t];
  push_ctx c = {step, lr, grads, -1, 0, 0};
  const size_t need = total * (s->slot_bytes - sizeof(sh_meta));
  if (total <= s->chunk && need <= EMB_SHARD_UNDO_BYTES) {
    if (need > s->undo_cap) {
      unsigned char *u = realloc(s->undo, need);
      if (!u) {
        sr_fmt(s->err, sizeof s->err, "push: out of memory for %zu rows", total);
        return SR_ENOMEM;
      }
      s->undo = u;
      s->undo_cap = need;
    }
    if ((rc = shard__chg_reserve(s, ids))) return rc; /* the change set takes every row */
    rc = shard__for_chunks(s, ids, s->mitem + s->chunk, push_undo_act, &c, &hits);
    if (rc) return rc;
    if (c.bad_t >= 0) return refuse_not_finite(s, c.bad_t, c.bad_id, lr);
  } else {
    check_ctx cc = {step, lr, grads, s->tmp, -1, 0};
    rc = shard__for_chunks(s, ids, s->mitem + s->chunk, check_act, &cc, &hits);
    if (rc) return rc;
    if (cc.bad_t >= 0) return refuse_not_finite(s, cc.bad_t, cc.bad_id, lr);
    if ((rc = shard__chg_reserve(s, ids))) return rc; /* the change set takes every row */
    rc = shard__for_chunks(s, ids, s->mitem + s->chunk, push_act, &c, &hits);
    if (rc) return c.applied ? push_failed_in_part(s, step, c.applied, total, rc) : rc;
  }
  s->st.pushes += total;
  return 0;
}

/* A push of step; its prefetch pins (and earlier steps') go, whatever the
 * outcome. */
static int sh_push(emb_store *b, int64_t step, float lr, const emb_idset *ids,
                   const emb_grad *const *grads) {
  shstore *s = (shstore *)b;
  uint64_t cpu0 = caller_cpu_mark(s);
  int rc = shard__call_begin(s, step);
  if (!rc) rc = push_apply(s, step, lr, ids, grads);
  if (!rc) rc = shard__wb_failed(s);
  shard__prefetch_release(s, step, 1);
  s->ctr.caller_ns += caller_cpu_mark(s) - cpu0;
  return rc;
}

/* Every dirty row written back and in RocksDB (and every read done). */
static int sh_flush(emb_store *b) {
  shstore *s = (shstore *)b;
  shard__drain(s);
  for (uint32_t i = 0; i < s->used && !s->wb_rc; i++)
    if (slot_meta(s, i)->flags & F_DIRTY) shard__writeback(s, i);
  shard__drain(s);
  if (s->wb_rc) memcpy(s->err, s->wb_err, sizeof s->err);
  return s->wb_rc;
}

int shard__open_dbs(shstore *s, uint8_t *existed) {
  const emb_plan *plan = s->base.plan;
  uint32_t *ids = malloc((size_t)s->n_tables * sizeof *ids);
  if (!ids) return SR_ENOMEM;
  for (int t = 0; t < s->n_tables; t++) ids[t] = plan->tables[t].table_id;
  int rc = 0;
  for (int k = 0; k < s->n_db && !rc; k++) {
    if (s->db[k]) continue;
    char path[4096], cur[4096 + 16];
    if (ckpt_dir_shard_path(s->dir, s->db_shard[k], path, sizeof path)) {
      sr_fmt(s->err, sizeof s->err, "%s: path too long", s->dir);
      rc = SR_ERANGE;
      break;
    }
    snprintf(cur, sizeof cur, "%s/CURRENT", path);
    if (existed) existed[k] = (uint8_t)sr_is_file(cur);
    rc = kv_open(path, s->n_tables, ids, &s->sopts, &s->db[k], s->err, sizeof s->err);
  }
  free(ids);
  return rc;
}

/* Forget every cached row and prefetch pin (nothing in flight: drained). */
void shard__drop_cache(shstore *s) {
  for (int k = 0; k < s->n_pf; k++) s->pf[k].n = 0;
  s->n_pf = 0;
  s->pf_pinned = 0;
  memset(s->map, 0, (s->mask + 1) * sizeof *s->map);
  s->hand = 0;
  if (sends_held(s)) { /* answers are sent from some: every slot detached, taken when free */
    for (uint32_t i = 0; i < s->used; i++) {
      slot_meta(s, i)->flags = F_DETACHED;
      slot_meta(s, i)->pins = 0;
    }
    return;
  }
  s->used = 0;
}

static int sh_checkpoint(emb_store *b, const char *path) {
  shstore *s = (shstore *)b;
  int rc = sh_flush(b);
  if (rc) return rc;
  if (mkdir(path, 0777) != 0 && errno != EEXIST) {
    sr_fmt(s->err, sizeof s->err, "checkpoint: %s: cannot create folder: %s", path, strerror(errno));
    return SR_EIO;
  }
  for (int k = 0; k < s->n_db; k++) {
    char dir[4096], e2[768];
    if (ckpt_dir_shard_path(path, s->db_shard[k], dir, sizeof dir)) {
      sr_fmt(s->err, sizeof s->err, "checkpoint: %s: path too long", path);
      return SR_ERANGE;
    }
    if ((rc = kv_checkpoint(s->db[k], dir, e2, sizeof e2))) {
      sr_fmt(s->err, sizeof s->err, "checkpoint: %s", e2);
      return rc;
    }
  }
  shard__chg_clear(s); /* the next delta holds the rows changed from here on */
  return 0;
}

static int sh_stats(emb_store *b, emb_store_stats *out) {
  shstore *s = (shstore *)b;
  *out = s->st;
  uint64_t rows = 0, bytes = 0;
  for (int k = 0; k < s->n_db; k++)
    for (int t = 0; t < s->n_tables && s->db[k]; t++) { /* none: a restore failed twice */
      uint64_t r = kv_property(s->db[k], t, "rocksdb.estimate-num-keys");
      rows += r;
      bytes += r * 4 * (uint64_t)(s->dim[t] + s->slen[t]);
    }
  for (uint32_t i = 0; i < s->used; i++) {
    const sh_meta *m = slot_meta(s, i);
    if (m->flags & F_DIRTY) { /* an estimate: may already be on disk */
      rows++;
      bytes += 4 * (uint64_t)(s->dim[m->table] + s->slen[m->table]);
    }
  }
  out->rows = rows;
  out->bytes = bytes;
  return 0;
}

static int sh_iterate(emb_store *b, int table, emb_row_fn fn, void *ctx) {
  shstore *s = (shstore *)b;
  if (table < 0 || table >= s->n_tables) {
    sr_fmt(s->err, sizeof s->err, "iterate: table %d is out of range 0..%d", table, s->n_tables - 1);
    return SR_EINVAL;
  }
  int rc = sh_flush(b);
  if (rc) return rc;
  kv_iter **it = calloc((size_t)s->n_db, sizeof *it);
  if (!it) return SR_ENOMEM;
  for (int k = 0; k < s->n_db; k++)
    if (!(it[k] = kv_iter_create(s->db[k], table))) rc = SR_ENOMEM;
  int dim = s->dim[table], sl = s->slen[table];
  while (!rc) {
    int best = -1;
    uint64_t bk = 0;
    for (int k = 0; k < s->n_db; k++)
      if (kv_iter_valid(it[k]) && (best < 0 || kv_iter_key(it[k]) < bk)) {
        best = k;
        bk = kv_iter_key(it[k]);
      }
    if (best < 0) break;
    size_t len;
    const char *v = kv_iter_value(it[best], &len);
    char e2[256];
    if ((rc = kv_row_decode_w(v, len, dim, sl, sh_wprec(s, (uint32_t)table), s->tmp, e2,
                              sizeof e2))) {
      char dp[4200];
      ckpt_dir_shard_path(s->dir, s->db_shard[best], dp, sizeof dp);
      sr_fmt(s->err, sizeof s->err, "iterate: %s: table %d row %llu: %s", dp, table,
             (unsigned long long)bk, e2);
      break;
    }
    if (fn(ctx, table, bk, s->tmp, dim, sl ? s->tmp + dim : NULL, sl)) break;
    kv_iter_next(it[best]);
  }
  for (int k = 0; k < s->n_db; k++) kv_iter_destroy(it[k]);
  free(it);
  return rc;
}

static const char *sh_errmsg(emb_store *b) { return ((shstore *)b)->err; }

static void sh_destroy(emb_store *b) {
  shstore *s = (shstore *)b;
  shard__pool_stop(s); /* queued write-backs are written first */
  if (s->db) {
    for (int k = 0; k < s->n_db; k++) kv_close(s->db[k]);
  }
  free(s->db);
  free(s->db_shard);
  free(s->shard_db);
  if (s->chg) shard__chg_clear(s);
  free(s->chg);
  free(s->dim);
  free(s->slen);
  if (s->sends) { /* answers still out keep the slots until their release */
    s->sends->slab = s->slab;
    shard__sends_unref(s->sends);
  } else {
    free(s->slab);
  }
  free(s->map);
  free(s->it_t);
  free(s->it_id);
  free(s->it_pos);
  free(s->it_slot);
  free(s->miss);
  free(s->mcf);
  free(s->mitem);
  free(s->ms_t);
  free(s->ms_id);
  free(s->ms_r);
  free(s->tmp);
  free(s->undo);
  free(s->dir);
  shard__pool_free(s);
  free(s);
}

/* emb_store_ops.figures: the cache's counters and the databases' figures. */
static int sh_figures(emb_store *b, emb_store_figures *out) {
  emb_shard_counters c;
  kv_figures k;
  int rc = emb_shard_counters_get(b, &c);
  if (!rc) rc = emb_shard_kv_figures_get(b, &k);
  if (rc) return rc;
  *out = (emb_store_figures){.evictions = c.evictions, .writebacks = c.writebacks,
                             .cache_rows = c.cache_rows, .cache_used = c.cache_used,
                             .sst_bytes = k.sst_bytes,
                             .pending_compaction_bytes = k.pending_compaction_bytes};
  return 0;
}

static const emb_store_ops shard_ops = {
    .kind = EMB_STORE_SHARD,
    .ckpt_layout = EMB_CKPT_SHARD_FOLDERS,
    .lookup_begin = sh_lookup_begin,
    .lookup_wait = sh_lookup_wait,
    .prefetch = shard__prefetch,
    .lookup_pinned = shard__lookup_pinned,
    .pins_release = shard__pins_release,
    .push = sh_push,
    .flush = sh_flush,
    .checkpoint = sh_checkpoint,
    .restore = shard__restore,
    .stats = sh_stats,
    .figures = sh_figures,
    .unclean = emb_shard_unclean,
    .checkpoint_delta = shard__checkpoint_delta,
    .restore_delta = shard__restore_delta,
    .iterate = sh_iterate,
    .remove = shard__remove,
    .errmsg = sh_errmsg,
    .destroy = sh_destroy,
};

static int max_stride(const emb_plan *plan) {
  int m = 1;
  for (int t = 0; t < plan->n_tables; t++) {
    int st = plan->tables[t].dim + emb_optim_state_len(&plan->tables[t].optim, plan->tables[t].dim);
    if (st > m) m = st;
  }
  return m;
}

/* Bytes of the widest row in a slot: 4 a float, 2 a 16-bit weight (slot_get). */
static size_t max_row_bytes(const emb_plan *plan) {
  size_t m = 4;
  for (int t = 0; t < plan->n_tables; t++) {
    const emb_table *tb = &plan->tables[t];
    size_t b = (size_t)emb_precision_bytes(tb->precision) * (size_t)tb->dim +
               4 * (size_t)emb_optim_state_len(&tb->optim, tb->dim);
    if (b > m) m = b;
  }
  return m;
}

uint64_t emb_shard_rows_for_mb(const emb_plan *plan, uint64_t mb) {
  uint64_t per = ((sizeof(sh_meta) + (uint64_t)max_row_bytes(plan) + 15) & ~15ULL) + 2 * sizeof(sh_entry) +
                 4 * sizeof(uint64_t); /* slot, map at load 1/2, chunk scratch */
  return (mb << 20) / per;
}

int emb_shard_counters_get(emb_store *b, emb_shard_counters *out) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  *out = s->ctr;
  out->cache_rows = s->cap;
  out->cache_used = s->used;
  out->pinned = s->pf_pinned;
  out->send_held = sends_held(s);
  return 0;
}

int emb_shard_kv_figures_get(emb_store *b, kv_figures *out) {
  if (!b || emb_store_kind_of(b) != EMB_STORE_SHARD) return SR_EINVAL;
  shstore *s = (shstore *)b;
  kv_figures sum = {0};
  for (int k = 0; k < s->n_db; k++) {
    kv_figures f;
    if (!s->db[k] || kv_figures_get(s->db[k], &f)) continue;
    sum.sst_bytes += f.sst_bytes;
    sum.pending_compaction_bytes += f.pending_compaction_bytes;
    sum.table_readers_bytes += f.table_readers_bytes;
  }
  *out = sum;
  return 0;
}

emb_store *emb_store_create_shard(const emb_plan *plan, const char *data_dir,
                                  const emb_shard_config *cfg, char *err, size_t errlen) {
  if (emb_plan_validate(plan, "plan", err, errlen)) return NULL;
  if (!data_dir || !cfg) {
    sr_fmt(err, errlen, "shard store: missing data folder or configuration");
    return NULL;
  }
  if (plan->n_tables > 65535) {
    sr_fmt(err, errlen, "shard store: at most 65535 tables");
    return NULL;
  }
  uint64_t rows = cfg->cache_rows ? cfg->cache_rows
                                  : emb_shard_rows_for_mb(plan, cfg->cache_mb ? cfg->cache_mb
                                                                             : EMB_SHARD_DEFAULT_CACHE_MB);
  if (rows < EMB_SHARD_MIN_CACHE_ROWS || rows > 0x7fffffffULL) {
    sr_fmt(err, errlen, "shard store: a cache of %llu rows%s: need %d..2^31-1 rows (a %s --cache-mb)",
           (unsigned long long)rows, cfg->cache_rows ? "" : " (--cache-mb over this plan's rows)",
           EMB_SHARD_MIN_CACHE_ROWS, rows < EMB_SHARD_MIN_CACHE_ROWS ? "bigger" : "smaller");
    return NULL;
  }
  const size_t wb = cfg->write_buffer_bytes;
  if (wb && (wb < EMB_SHARD_WB_MIN_BYTES || wb > EMB_SHARD_WB_MAX_BYTES)) {
    sr_fmt(err, errlen, "shard store: write-back buffers of %zu bytes: need %zu..%zu",
           cfg->write_buffer_bytes, EMB_SHARD_WB_MIN_BYTES, EMB_SHARD_WB_MAX_BYTES);
    return NULL;
  }
  if (sr_mkdirs(data_dir) != 0) {
    sr_fmt(err, errlen, "shard store: %s: cannot create folder: %s", data_dir, strerror(errno));
    return NULL;
  }
  shstore *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->base.ops = &shard_ops;
  s->base.plan = plan;
  s->n_tables = plan->n_tables;
  s->dim = calloc((size_t)s->n_tables, sizeof *s->dim);
  s->slen = calloc((size_t)s->n_tables, sizeof *s->slen);
  s->dir = strdup(data_dir);
  s->chg = calloc((size_t)s->n_tables, sizeof *s->chg);
  if (!s->dim || !s->slen || !s->dir || !s->chg) goto nomem;
  for (int t = 0; t < s->n_tables; t++) {
    s->dim[t] = plan->tables[t].dim;
    s->slen[t] = emb_optim_state_len(&plan->tables[t].optim, s->dim[t]);
  }
  s->stride = max_stride(plan);
  s->slot_bytes = (sizeof(sh_meta) + max_row_bytes(plan) + 15) & ~(size_t)15; /* aligned slots */
  s->cap = (uint32_t)rows;
  size_t mcap = 64;
  while (mcap < 2 * (size_t)rows) mcap <<= 1;
  s->mask = mcap - 1;
  s->map = calloc(mcap, sizeof *s->map);
  s->slab = malloc((size_t)s->cap * s->slot_bytes);
  if (s->map) sr_advise_huge(s->map, mcap * sizeof *s->map);
  if (s->slab) sr_advise_huge(s->slab, (size_t)s->cap * s->slot_bytes);
  s->chunk = s->cap / 2;
  if (s->chunk > 65536) s->chunk = 65536;
  size_t c = s->chunk;
  s->it_t = malloc(c * sizeof *s->it_t);
  s->it_id = malloc(c * sizeof *s->it_id);
  s->it_pos = malloc(c * sizeof *s->it_pos);
  s->it_slot = malloc(c * sizeof *s->it_slot);
  s->miss = malloc(c * sizeof *s->miss);
  s->mcf = malloc(c * sizeof *s->mcf);
  s->mitem = malloc(2 * c * sizeof *s->mitem); /* second half: the chunk's row indices */
  s->ms_t = malloc(c * sizeof *s->ms_t);
  s->ms_id = malloc(c * sizeof *s->ms_id);
  s->ms_r = malloc(c * sizeof *s->ms_r);
  s->tmp = malloc(4 * (size_t)s->stride);
  if (!s->map || !s->slab || !s->it_t || !s->it_id || !s->it_pos || !s->it_slot || !s->miss ||
      !s->mcf || !s->mitem || !s->ms_t || !s->ms_id || !s->ms_r || !s->tmp)
    goto nomem;
  /* Hosted shards. */
  s->shard_db = malloc((size_t)plan->n_shards * sizeof *s->shard_db);
  if (!s->shard_db) goto nomem;
  for (int k = 0; k < plan->n_shards; k++) s->shard_db[k] = -1;
  s->n_db = cfg->n_hosted ? cfg->n_hosted : plan->n_shards;
  s->db_shard = malloc((size_t)s->n_db * sizeof *s->db_shard);
  s->db = calloc((size_t)s->n_db, sizeof *s->db);
  if (!s->db_shard || !s->db) goto nomem;
  for (int k = 0; k < s->n_db; k++) {
    int sh = cfg->n_hosted ? cfg->hosted[k] : k;
    if (sh < 0 || sh >= plan->n_shards || s->shard_db[sh] >= 0) {
      sr_fmt(err, errlen, "shard store: hosted shard %d is not a distinct shard 0..%d of the plan", sh,
             plan->n_shards - 1);
      sh_destroy(&s->base);
      return NULL;
    }
    s->db_shard[k] = sh;
    s->shard_db[sh] = k;
  }
  s->sopts.block_cache_bytes = cfg->block_cache_bytes;
  s->sopts.compression = cfg->lz4 ? KV_COMPRESSION_LZ4 : KV_COMPRESSION_NONE;
  s->pf_limit = s->cap - s->chunk - 1;
  if (shard__pool_create(s,
                         cfg->threads ? (cfg->threads < 0 ? 0 : cfg->threads)
                                      : EMB_SHARD_DEFAULT_THREADS,
                         wb ? wb : EMB_SHARD_WB_DEFAULT_BYTES))
    goto nomem;
  uint8_t *existed = calloc((size_t)s->n_db, 1);
  if (!existed) goto nomem;
  shard__restore_leftovers(s); /* before the open: a restore cut short */
  if (shard__open_dbs(s, existed) || marks_check(s, existed)) {
    free(existed);
    sr_fmt(err, errlen, "shard store: %s", s->err);
    sh_destroy(&s->base);
    return NULL;
  }
  free(existed);
  return &s->base;
nomem:
  sr_fmt(err, errlen, "shard store: out of memory");
  if (s) sh_destroy(&s->base);
  return NULL;
}
