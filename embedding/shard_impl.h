/* The shard store's internals, shared by its files (not public: the store's
 * contract is embedding/shard.h).
 *
 * The files, one job each:
 *   shard.c           the store's ops (emb_store_ops): create and destroy,
 *                     lookup (the hit path), push, flush, checkpoint,
 *                     stats, iterate; the clean-stop marks; the
 *                     counters
 *   shard_cache.c     the cache: slots, the map, GCLOCK eviction, rows made
 *                     resident and pinned chunk by chunk
 *   shard_io.c        the store threads and the caller's side of them: read
 *                     jobs, write buffers, the pending index of rows written
 *                     back
 *   shard_prefetch.c  the look-ahead op: a prefetched step's pins
 *   shard_pins.c      answers sent from the slots: send pins, lookup_pinned,
 *                     the copy a push makes of a row being sent
 *   shard_remove.c    the remove op: rows deleted from RocksDB and reset in
 *                     the cache
 *   shard_restore.c   the restore op: the checkpoint's databases copied
 *                     beside the live ones and exchanged with them
 *   shard_delta.c     the change set (rows a push changed since the last
 *                     checkpoint, delta or restore) and the incremental
 *                     ops, checkpoint_delta and restore_delta
 *
 * Cache layout: one slab of cap slots; a slot is a 16-byte header (row id,
 * table, flags, pin count) followed by the row's value and optimizer state
 * (the widest table's dim + state_len floats), so a hit touches the map entry
 * and one contiguous slot. The map: open addressing, linear probing,
 * power-of-two size >= 2 x cap, 8-byte entries {slot + 1, tag}: the tag is
 * the low 32 bits of the (table, row id) hash, the home position is the tag
 * masked, and the key itself is checked in the slot (a hit reads the slot
 * anyway); deletion by backward shift (no tombstones). GCLOCK: a reference
 * bit per slot, set on every access, and a count of uses (F_USES, below)
 * that lookups and prefetches of the cached row add to; the hand clears
 * the bit, then takes one use a pass, and evicts a slot with neither; it
 * skips pinned slots (pin count > 0) and slots being loaded.
 *
 * Pins. A slot's pin count is the number of holders: the chunk in progress
 * (one pin per item, dropped when the chunk is done) and each prefetched
 * step that asked for the row (a list of slots per step, dropped by that
 * step's push or by the lookup or push of a later step). Prefetch pins at
 * most cap - chunk - 1 slots (counted with repeats), so a chunk always finds
 * a slot to evict: a prefetch that reaches the limit stops, and the rest of
 * its step is read by its lookup.
 *
 * Store threads (EMB_SHARD_DEFAULT_THREADS, made at create, joined at
 * destroy) run two kinds of work from one queue under one lock:
 *   - read jobs: the misses of one (database, table), at most SH_JOB_ROWS
 *     rows, each already given a slot that is in the map, pinned and marked
 *     LOADING; the job reads them with one batched MultiGet straight into
 *     the slots (or the init value and optimizer init state when absent).
 *   - write sets: the write buffers handed over (full, or any at a drain),
 *     taken together once EMB_SHARD_WB_SET are queued (shard.h); dirty
 *     rows evicted (or flushed), encoded; sorted, a row's newest record
 *     kept, one SST file per (database, table), ingested (kv_ingest).
 *     Written one set at a time, in the order they were handed over.
 * The caller thread alone touches the map, the slots' headers, the pin
 * lists and the pending index; a store thread touches only the rows of the
 * slots its job loads, or (one at a time: writing) the buffers of its
 * write set, word and ing. A finished job or buffer goes on a
 * done list that the caller reaps (clears LOADING, frees the buffer). The
 * caller, when it must wait (a LOADING slot it needs, no free write
 * buffer), runs queued work itself rather than sleep.
 *
 * Exactness (a row's bits never depend on prefetch, threads or timing):
 *   1. A row in the map is the single truth while it is there: every
 *      lookup and push of it uses the slot, and a LOADING slot is waited for
 *      before it is used. A slot is LOADING only while it holds no value
 *      yet (a new slot, or one whose read failed), so no update can be lost
 *      under a load.
 *   2. A row leaves the map only by eviction: clean, it is dropped (its
 *      latest value is where it was read from); dirty, it is encoded into a
 *      write buffer and entered in the pending index (table, row id) ->
 *      record, newest record first, before the slot is reused.
 *   3. A row brought into the map (lookup, push or prefetch) is taken from
 *      the pending index when it is there, else read from RocksDB. An
 *      index entry goes only when the caller reaps its buffer, after the
 *      write is in RocksDB, so a row missing from both the map and the
 *      index has its latest value in RocksDB; and while the read runs the
 *      row is in the map (LOADING, not evictable), so no newer write-back
 *      of it can exist. Sets are written in order, each ingested after
 *      every earlier write, and a set writes only a row's newest record,
 *      so the newest value is the one RocksDB keeps.
 *   4. Optimizer state is in the slot and the record beside the value, so
 *      it travels with the row.
 * flush, checkpoint, iterate, mark_clean and restore first wait for every
 * read and write (drain); a write that failed is reported (SR_EIO, the
 * RocksDB message) by every later call until a restore: rows were lost.
 * So is a push that failed after applying part of itself (shard.c,
 * push_failed_in_part; its code and message in wb_rc and wb_err).
 *
 * Send pins (lookup_pinned: answers sent from the slots, rpc/service.c).
 * Besides its pin count a slot has a send count, sends->cnt[slot], one per
 * answer being sent from it: raised by the caller (under its lock),
 * dropped by shard__pins_release from any thread (gRPC's, with no lock), so
 * it is atomic and the caller only ever reads it. A slot with a send count
 * is never written: eviction skips it (and never waits for it), and a push
 * to its row first moves the row (value and state) to a fresh slot that
 * the map points to from then on; the old slot is left DETACHED, out of
 * the map, and taken by the eviction hand once its counts are 0 (a restore
 * leaves every slot DETACHED the same way while any is sent from). The
 * slots sent from, sends->held, count with the prefetch pins against
 * pf_limit (prefetch_one, shard__lookup_pinned), so a chunk still always
 * finds a slot. The counts and the slab outlive the store while answers
 * are out (shard__sends_unref). */
#ifndef SHARDREC_EMBEDDING_SHARD_IMPL_H
#define SHARDREC_EMBEDDING_SHARD_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "common/rng.h"
#include "common/sys.h"
#include "embedding/shard.h"
#include "storage/kv.h"

#define SH_JOB_ROWS 1024 /* rows per read job at most: a big batch still splits over threads */
#define SH_REC_HEAD 16   /* a write record: u64 row id, u32 table, u32 database, then the row */
#define F_REF 1u
#define F_DIRTY 2u
#define F_LOADING 4u /* a read job is filling the slot */
#define F_FAILED 8u  /* the slot's read failed: read again when used */
#define F_DETACHED 16u /* out of the map, left to answers being sent (see the top) */
/* A row's uses beyond F_REF's one, 0..7 (bits 8-10): each is one more pass
 * of the eviction hand the row survives (GCLOCK). A step's first use of a
 * cached row adds one: its prefetch's, else its lookup's (gathered or
 * pinned; sh_use, sh_lookup_use); a row read in, and a push, set F_REF
 * only, so a row used once goes as under CLOCK and a row used in many
 * steps outlasts a run of rows used once. */
#define F_USES_ONE (1u << 8)
#define F_USES (7u * F_USES_ONE)
#define NONE32 UINT32_MAX

typedef struct {
  uint32_t slot1; /* 0: empty */
  uint32_t tag;   /* low 32 bits of the key's hash; home = tag & mask */
} sh_entry;

typedef struct {
  uint64_t key;
  uint16_t table;
  uint16_t flags;
  uint32_t pins;
} sh_meta; /* 16 bytes, first in each slot */

/* A prefetch's use of a cached row (F_USES); a row whose count is full
 * and F_REF set is not written (a hot row's line stays clean). */
static inline void sh_use(sh_meta *m) {
  uint16_t f = m->flags;
  if ((f & F_USES) != F_USES) f = (uint16_t)(f + F_USES_ONE);
  f |= F_REF;
  if (f != m->flags) m->flags = f;
}

/* A lookup's use of a cached row: counted (sh_use) unless a prefetch has
 * the row pinned, which counted the step's use when it found the row
 * cached, or read it in (a row used once then has no use, at any depth). */
static inline void sh_lookup_use(sh_meta *m) {
  if (!m->pins) sh_use(m);
  else if (!(m->flags & F_REF)) m->flags |= F_REF;
}

/* A read job (see the top). key/slot/vals/lens: [cap]. */
typedef struct sh_job {
  struct sh_job *next, *all;
  int db, table;
  size_t n, cap;
  uint64_t *key;
  uint32_t *slot;
  const char **vals;
  size_t *lens;
  uint64_t found;
  uint64_t rocks_ns, own_ns; /* thread CPU in RocksDB and beside it */
  int rc;
  char err[1024];
} sh_job;

/* A record of a write set in the order it is written: by database, table,
 * row id, then hand-over order (a row evicted twice keeps its newer record
 * last). */
typedef struct {
  uint64_t dt;  /* database << 32 | table */
  uint64_t key; /* row id */
  uint32_t r;   /* hand-over order: buffer's place in the set x rows_per_buf + record index */
  uint32_t loc; /* the record (rec_at) */
} sh_wsort;

/* A write buffer: n records of rec_bytes. */
typedef struct sh_wbuf {
  struct sh_wbuf *next;
  uint32_t idx;
  size_t n;
  unsigned char *rec;
  uint64_t rocks_ns, own_ns; /* thread CPU writing its set (the set's first): in RocksDB, sorting */
  size_t written; /* rows its set wrote (the set's first): a row's newest record only */
  int rc;
  char err[1024];
} sh_wbuf;

/* The send counts (see the top): one per slot; refs: the store's and one
 * per pin set out; slab: the store's slots, freed here once the store is
 * gone and the last pin set released. */
typedef struct sh_sends {
  atomic_size_t refs;
  atomic_uint held;      /* slots whose count is not 0 */
  unsigned char *slab;   /* owned once the store is destroyed */
  atomic_uint cnt[];     /* [cap] */
} sh_sends;

/* The change set of one table (shard_delta.c): the row ids a push changed
 * since the last checkpoint, checkpoint_delta or restore of any kind, kept
 * from the first of them on (chg_track: before it every row held has
 * changed, and a store never saved keeps no set). Open
 * addressing, linear probing, power-of-two cap >= 2 x n, empty entries
 * SH_CHG_EMPTY (the id UINT64_MAX itself is has_max); keys NULL while
 * nothing changed. Memory in proportion to the changed rows: the arrays
 * are freed when the set is cleared. */
#define SH_CHG_EMPTY UINT64_MAX
typedef struct {
  uint64_t *keys; /* [cap] */
  size_t cap, n;  /* n: entries in keys (has_max not counted) */
  int has_max;
} sh_chg;

/* The slots one prefetched step pinned. */
typedef struct {
  int64_t step;
  uint32_t *slot;
  size_t n, cap;
} sh_pinset;

typedef struct shstore shstore;
typedef struct {
  shstore *s;
  pthread_t th;
  kv_reader *rd;
} sh_worker;

struct shstore {
  emb_store base;
  int n_tables;
  int *dim, *slen;        /* [n_tables] */
  int stride;             /* floats per slot after the meta */
  size_t slot_bytes;
  unsigned char *slab;    /* [cap][slot_bytes] */
  uint32_t cap, used, hand;
  sh_entry *map;
  size_t mask;
  /* databases */
  char *dir;
  int n_db;
  int *db_shard;          /* [n_db] shard index of db k */
  int *shard_db;          /* [plan->n_shards] db index or -1 */
  kv_db **db;          /* [n_db] */
  kv_opts sopts;
  /* chunk scratch */
  size_t chunk;           /* max items per chunk = cap / 2 */
  uint32_t *it_t;         /* [chunk] table */
  uint64_t *it_id;        /* [chunk] row id */
  size_t *it_pos;         /* [chunk] map position */
  uint32_t *it_slot;      /* [chunk] slot index (NONE32: not resident) */
  size_t *miss;           /* [chunk] item index */
  int *mcf;               /* [chunk] database index of each miss */
  size_t *mitem;          /* [2 * chunk]: second half the chunk's row indices */
  uint32_t *ms_t;         /* [chunk] lookup misses: table, id, row index */
  uint64_t *ms_id;
  size_t *ms_r;
  float *tmp;             /* [stride] */
  unsigned char *undo;    /* [undo_cap] a one-pass push's rows as they were */
  size_t undo_cap;
  /* prefetch pins */
  sh_pinset *pf;          /* [n_pf] steps in increasing order */
  int n_pf, cap_pf;
  size_t pf_pinned, pf_limit; /* sum of the lists' lengths; its bound */
  sh_sends *sends;        /* NULL until the first lookup_pinned */
  /* store threads (see the top) */
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  int pool_ok, stop, writing, n_workers, n_wk; /* threads running; wk[] length */
  int n_wq, wforce;             /* under mu: buffers queued; write them however few */
  sh_worker *wk;
  sh_job *rq, *rq_tail, *rdone; /* under mu */
  sh_wbuf *wq, *wq_tail, *wdone; /* under mu */
  /* the caller's side of the threads */
  kv_reader *crd;
  sh_job *jfree, *jall;
  sh_job **open;          /* [n_db * n_tables] the job being filled */
  int *open_list, n_open;
  size_t reads_out, wbufs_out; /* handed over, not reaped */
  uint64_t inline_ns;     /* thread CPU of queued work the caller ran (shard__wait_some) */
  sh_wbuf *wbufs, *wfree, *wcur; /* [EMB_SHARD_WB_BUFFERS] */
  unsigned char *wrec;    /* the buffers' records, one block: buffer k's from
                             k * rows_per_buf records on */
  sh_wsort *word;         /* [EMB_SHARD_WB_BUFFERS * rows_per_buf] the writing set's order */
  kv_ingest *ing;         /* the writing set's files */
  size_t rec_bytes, rows_per_buf;
  sh_entry *pidx;         /* pending index: {record + 1, tag} */
  size_t pmask;
  int rd_rc, wb_rc;       /* the last failed read; the first failed write or push
                             applied in part (sticky until a restore) */
  char rd_err[1024], wb_err[1024];
  sh_chg *chg;            /* [n_tables] the change set (shard_delta.c) */
  sh_chg *rmv;            /* [n_tables] ids removed since, the same kind of set (shard_delta.c;
                             NULL until the first removal while the change set is kept) */
  int chg_track;          /* the set is kept (a checkpoint or restore of any kind done) */
  emb_store_stats st;
  emb_shard_counters ctr;
  int unclean;            /* opened on rows without the clean-stop marks (a crash) */
  int marked;             /* the clean-stop marks are written (emb_shard_mark_clean) */
  int removed;            /* rows were deleted (remove) since the last compaction */
  int last_lookup_rc;
  char err[1024];
};

static inline sh_meta *slot_meta(const shstore *s, uint32_t i) {
  return (sh_meta *)(s->slab + (size_t)i * s->slot_bytes);
}
/* The weights byte (storage/kv.h KV_W_*) of table t's rows in RocksDB: the
 * plan's precision, whose codes are the same. */
static inline int sh_wprec(const shstore *s, uint32_t t) {
  return (int)s->base.plan->tables[t].precision;
}

static inline float *slot_row(const shstore *s, uint32_t i) {
  return (float *)(s->slab + (size_t)i * s->slot_bytes + sizeof(sh_meta));
}

/* An fp16 or bf16 table's slot holds its state floats, then the dim 16-bit
 * weights (2 bytes a weight); an fp32 table's the dim weights then the
 * state, floats, in place (slot_row). */
static inline uint16_t *slot_w16(const shstore *s, uint32_t i, uint32_t t) {
  return (uint16_t *)(void *)(slot_row(s, i) + s->slen[t]);
}

/* Slot i of table t as floats into dst: the dim weights, then the state
 * when full. */
static inline void slot_get(const shstore *s, uint32_t i, uint32_t t, float *dst, int full) {
  const int w = sh_wprec(s, t);
  const size_t dim = (size_t)s->dim[t];
  if (w == KV_W_FP32) {
    memcpy(dst, slot_row(s, i), (full ? dim + (size_t)s->slen[t] : dim) * sizeof *dst);
    return;
  }
  if (w == KV_W_FP16) sr_f16_decode(slot_w16(s, i, t), dst, dim, SR_HALF_AUTO);
  else sr_bf16_decode(slot_w16(s, i, t), dst, dim);
  if (full) memcpy(dst + dim, slot_row(s, i), (size_t)s->slen[t] * sizeof *dst);
}

/* src (dim weights of the table's format, then the state) into slot i. */
static inline void slot_put(const shstore *s, uint32_t i, uint32_t t, const float *src) {
  const int w = sh_wprec(s, t);
  const size_t dim = (size_t)s->dim[t];
  if (w == KV_W_FP32) {
    memcpy(slot_row(s, i), src, (dim + (size_t)s->slen[t]) * sizeof *src);
    return;
  }
  if (w == KV_W_FP16) sr_f16_encode(src, slot_w16(s, i, t), dim, SR_HALF_AUTO);
  else sr_bf16_encode(src, slot_w16(s, i, t), dim);
  memcpy(slot_row(s, i), src + dim, (size_t)s->slen[t] * sizeof *src);
}
/* The caller's own CPU so far: its thread CPU less the queued work it ran
 * (an op adds the difference of two marks to ctr.caller_ns). */
static inline uint64_t caller_cpu_mark(const shstore *s) { return sr_thread_cpu_ns() - s->inline_ns; }
/* Answers being sent from slot i now (see the top). */
static inline unsigned slot_sent(const shstore *s, uint32_t i) {
  return s->sends ? atomic_load_explicit(&s->sends->cnt[i], memory_order_acquire) : 0;
}
/* Slots answers are being sent from now. */
static inline size_t sends_held(const shstore *s) {
  return s->sends ? atomic_load_explicit(&s->sends->held, memory_order_acquire) : 0;
}
static inline uint32_t key_tag(uint32_t t, uint64_t key) {
  return (uint32_t)sr_mix64(key ^ ((uint64_t)(t + 1) * 0x9E3779B97F4A7C15ULL));
}
/* The entry of (t, key), or the empty one where it would go. */
static inline size_t probe(const shstore *s, uint32_t tag, uint32_t t, uint64_t key) {
  for (size_t h = tag & s->mask;; h = (h + 1) & s->mask) {
    const sh_entry *e = &s->map[h];
    if (!e->slot1) return h;
    if (e->tag == tag) {
      const sh_meta *m = slot_meta(s, e->slot1 - 1);
      if (m->key == key && m->table == t) return h;
    }
  }
}

/* Backward-shift deletion of entry i of an open-addressing table. */
static inline void entries_delete(sh_entry *map, size_t mask, size_t i) {
  size_t j = i;
  map[i].slot1 = 0;
  for (;;) {
    j = (j + 1) & mask;
    if (!map[j].slot1) break;
    size_t k = map[j].tag & mask;
    int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    map[i] = map[j];
    map[j].slot1 = 0;
    i = j;
  }
}

/* The database index of row id of table t (-1: its shard is not hosted here). */
static inline int db_of(shstore *s, int t, uint64_t id) {
  int sh = emb_plan_shard_of(s->base.plan, t, id);
  return s->shard_db[sh];
}

/* The pending index (shard_io.c): rows written back, not yet in RocksDB.
 * Record loc of the write buffers. */
static inline unsigned char *rec_at(const shstore *s, uint32_t loc) {
  return s->wrec + (size_t)loc * s->rec_bytes; /* buffer loc / rows_per_buf */
}

/* The pending index's entry of (t, key), or the empty one where it would go. */
static inline size_t pidx_probe(const shstore *s, uint32_t tag, uint32_t t, uint64_t key) {
  for (size_t h = tag & s->pmask;; h = (h + 1) & s->pmask) {
    const sh_entry *e = &s->pidx[h];
    if (!e->slot1) return h;
    if (e->tag == tag) {
      const unsigned char *p = rec_at(s, e->slot1 - 1);
      uint64_t k;
      uint32_t tt;
      memcpy(&k, p, 8);
      memcpy(&tt, p + 8, 4);
      if (k == key && tt == t) return h;
    }
  }
}

/* Walk every (table, r) of ids in chunks; per chunk resolve then act. */
typedef void (*chunk_fn)(shstore *s, size_t n, const size_t *it_r, void *ctx);

/* ---- shard_cache.c: the map, the slots, GCLOCK ---- */

/* A free slot: a never-used one, else GCLOCK's victim (written back if dirty). */
uint32_t shard__slot_alloc(shstore *s);
/* Row id of table t (database d) into the map, pinned once; NONE32 when out
 * of memory. */
uint32_t shard__row_bring(shstore *s, uint32_t t, uint64_t id, int d);
/* A slot whose read failed read again (pinned by the caller): 0 or SR_ENOMEM. */
int shard__slot_reload(shstore *s, uint32_t slot);
/* Wait until slot is loaded (running queued work meanwhile). */
void shard__slot_wait(shstore *s, uint32_t slot);
/* The chunk of n items in s->it_t/it_id (rows it_r[n]) made resident and
 * pinned, fn run on it, the pins dropped; hits counted into *hits. 0 or an
 * SR_E* with the reason in s->err. */
int shard__chunk_run(shstore *s, size_t n, const size_t *it_r, chunk_fn fn, void *ctx,
                     uint64_t *hits);
/* Every (table, r) of ids run through shard__chunk_run, chunk by chunk
 * (it_r: [s->chunk] scratch for the rows). */
int shard__for_chunks(shstore *s, const emb_idset *ids, size_t *it_r, chunk_fn fn, void *ctx,
                      uint64_t *hits);

/* ---- shard_io.c: the store threads, read jobs, write buffers ---- */

/* The write buffers, the pending index, the job table and n store threads
 * (0: the caller does all the work). 0 or SR_ENOMEM (shard__pool_free
 * frees what was made). */
int shard__pool_create(shstore *s, int n, size_t wb_bytes);
/* Join the threads once they have done every piece of work queued. */
void shard__pool_stop(shstore *s);
void shard__pool_free(shstore *s);
/* Take what the threads finished (loaded slots, written buffers). */
void shard__reap(shstore *s);
/* Wait for some handed-over work to finish, running queued work meanwhile
 * (a queued write set too when writes, else reads only: a caller waiting
 * for a row does not write 12 buffers first). */
void shard__wait_some(shstore *s, int writes);
/* Wait until every read and write handed over is done and reaped. */
void shard__drain(shstore *s);
/* Slot (new, LOADING) gets row id of table t from database d by a read job:
 * 0 or SR_ENOMEM. */
int shard__job_add(shstore *s, int d, uint32_t t, uint64_t id, uint32_t slot);
/* Every read job being filled, handed to the threads. */
void shard__jobs_submit(shstore *s);
/* Dirty slot i written back (into a write buffer and the pending index). */
void shard__writeback(shstore *s, uint32_t i);

/* ---- shard_prefetch.c: the look-ahead op ---- */

/* Drop the pins of every prefetched step below step (upto: at or below). */
void shard__prefetch_release(shstore *s, int64_t step, int upto);
/* store.h's prefetch op. */
int shard__prefetch(emb_store *b, int64_t step, const emb_idset *ids);

/* ---- shard_pins.c: answers sent from the slots ---- */

/* store.h's lookup_pinned and pins_release ops. */
int shard__lookup_pinned(emb_store *b, int64_t step, const emb_idset *ids,
                         const float **const *rows, emb_pins **pins);
void shard__pins_release(emb_pins *p);
/* Drop a reference to d; the last one frees it (and the slab it owns). */
void shard__sends_unref(sh_sends *d);
/* The chunk's item i moved off a slot an answer is being sent from. */
void shard__slot_unshare(shstore *s, size_t i);

/* ---- shard_delta.c: the change set, the incremental ops ---- */

/* Room in the change set for every id of ids, so that the push that
 * follows adds them without allocating: 0 or SR_ENOMEM (message in
 * s->err; the set as it was). Nothing while the set is not kept. */
int shard__chg_reserve(shstore *s, const emb_idset *ids);
/* Row id of table t changed (room reserved by shard__chg_reserve; nothing
 * while the set is not kept). */
void shard__chg_add(shstore *s, uint32_t t, uint64_t id);
/* Room in the removed set for every id of ids (checked), so that
 * shard__chg_removed adds them without allocating: 0, or SR_ENOMEM
 * (s->err; the sets as they were). Nothing while the set is not kept. */
int shard__chg_remove_reserve(shstore *s, const emb_idset *ids);
/* The removal of the ids of ids whose database index is below below_db
 * (n_db: every id) recorded for the next checkpoint_delta, room reserved
 * by shard__chg_remove_reserve: each leaves the change set and joins the
 * removed set (nothing while the change set is not kept). */
void shard__chg_removed(shstore *s, const emb_idset *ids, int below_db);
/* The change set and the removed set emptied, their memory freed, and kept
 * from now on (after a checkpoint or restore of any kind). */
void shard__chg_clear(shstore *s);
/* store.h's checkpoint_delta and restore_delta ops. */
int shard__checkpoint_delta(emb_store *b, const char *path);
int shard__restore_delta(emb_store *b, const char *path);

/* ---- shard.c: the ops ---- */

/* Remove every hosted shard's clean-stop mark (the rows are about to
 * change): 0, SR_ERANGE or SR_EIO with the reason in s->err. */
int shard__marks_remove(shstore *s);
/* Forget every cached row and prefetch pin (nothing in flight: drained),
 * as a restore does; slots answers are sent from are left detached. */
void shard__drop_cache(shstore *s);
/* Open every hosted shard's database not open yet; existed[k] (when not
 * NULL): 1 when database k was there before (its CURRENT file). 0 or an
 * SR_E* with the reason in s->err. */
int shard__open_dbs(shstore *s, uint8_t *existed);

/* ---- shard_restore.c: the restore op ---- */

/* store.h's restore op. */
int shard__restore(emb_store *b, const char *path, const char *from_model_fp);
/* At create, before the databases are opened: a restore cut between
 * renames makes the store unclean; dead owners' temporaries removed. */
void shard__restore_leftovers(shstore *s);

/* The remove op (shard_remove.c). */
int shard__remove(emb_store *b, int64_t step, const emb_idset *ids);
/* ids checked against the plan (what: the op, for the message). */
int shard__check_ids(shstore *s, const emb_idset *ids, const char *what);
/* Common start of a lookup or push of step. */
int shard__call_begin(shstore *s, int64_t step);
/* A failed write-back into s->err: its code, or 0. */
int shard__wb_failed(shstore *s);

#endif
